//! MaxPool and AveragePool 3x3 of stride 1 or 2 (the vision models' downsampling pools and
//! inception's branch pools) on AVX-512, as two separable passes per plane: each input row the
//! output rows read is reduced once across, 16 outputs a step (stride 2 pulls the even, odd
//! and next even columns out of two vector pairs by permutes), then each output row reduces
//! its three reduced rows (and an average divides). Input rows are read in place, pads and row
//! ends masked off in the loads: no copy into phase planes (`phase_planes.rs`) or bands
//! (`pool_plane.rs`), which other pools and every CPU without AVX-512 keep. squeezenet's three
//! 3x3/2 MaxPools 0.58-0.71 -> 0.34-0.39 ms, inception's 3x3/1 MaxPools on 14x14 and 7x7
//! planes 60-79 -> 38-41 us (docs/bench.md).
//!
//! A max is exact like the other max paths: each maximum keeps the earlier operand on a tie
//! and propagates NaN, so across then down gives the first maximum in row-major window order.
//! An average (stride 1 only: strided ones stay on the phase planes, whose row-major sum every
//! SIMD level must match) sums each window row, then the rows, like the bands.
//!
//! Sits between [`Pool::pool_planes_f32`](super::Pool) (geometry, the choice of path) and the
//! CPU's AVX-512 units.

use super::{window_counts, Geo};
use crate::shape::rows_by_block;
use rayon::prelude::*;

/// Whether [`pool_f32`] computes this pooling: a 3x3 undilated 2-D window of stride 1 or 2
/// whose every window holds an input element, on a CPU whose kernels run AVX-512.
pub(super) fn applies(g: &Geo) -> bool {
    let axis_fits = |a: usize| {
        g.k[a] == 3
            && (1..=2).contains(&g.s[a])
            && g.d[a] == 1
            && g.pb[a] <= 2
            && g.outd[a] > 0
            && g.s[a] * (g.outd[a] - 1) < g.ind[a] + g.pb[a]
    };
    crate::simd::level() == crate::simd::Level::Avx512 && axis_fits(1) && axis_fits(2)
}

/// Per-task scratch: the reduced rows of a block, and each vector's load masks.
type Scratch = (Vec<f32>, Vec<[u16; 4]>);

/// What a window computes: its maximum, or its average: the sum divided by the window's
/// positions down times across (inside the input, or the padded window's where
/// `count_include_pad`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Fold {
    Max,
    Average { count_include_pad: bool },
}

/// Output rows `first_row..` (flat over `[N*C, OH]`, `OW` elements each) into `y`, planes in
/// parallel. The caller checked [`applies`].
pub(super) fn pool_f32(x: &[f32], g: &Geo, fold: Fold, y: &mut [f32], first_row: usize) {
    let (oh, ow, plane) = (g.outd[1], g.outd[2], g.ind[1] * g.ind[2]);
    // An average's divisor: positions down (per output row) times across (per output column,
    // whole vectors; 1 past the row's end).
    let (down, across) = match fold {
        Fold::Max => (Vec::new(), Vec::new()),
        Fold::Average { count_include_pad } => {
            let mut across: Vec<f32> = window_counts(g, 2, count_include_pad).collect();
            across.resize(ow.next_multiple_of(16), 1.0);
            (window_counts(g, 1, count_include_pad).collect(), across)
        }
    };
    let rows = first_row..first_row + y.len() / ow;
    rows_by_block(y, rows, oh, ow)
        .into_par_iter()
        .for_each_init(Scratch::default, |scratch, (p, lines, dst)| {
            let xplane = &x[p * plane..][..plane];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `applies` checked that the kernels run AVX-512 (F/BW/DQ/VL detected).
            unsafe {
                match fold {
                    Fold::Max => {
                        avx512::plane_rows::<true>(g, xplane, lines, dst, scratch, (&[], &[]))
                    }
                    Fold::Average { .. } => avx512::plane_rows::<false>(
                        g,
                        xplane,
                        lines,
                        dst,
                        scratch,
                        (&down, &across),
                    ),
                }
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (xplane, lines, dst, scratch, &down, &across);
        });
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Geo, Scratch};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// The larger of `earlier` and `later`, `earlier` on a tie, NaN if either is NaN.
    /// (VRANGEPS would be one instruction, but it returns the other operand of a quiet NaN.)
    #[inline(always)]
    unsafe fn max_first(earlier: __m512, later: __m512) -> __m512 {
        // vmaxps(a, b) is `a > b ? a : b`, and `b` when either is NaN.
        let m = _mm512_max_ps(later, earlier);
        _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(later, later), later)
    }

    /// The maximum (`MAX`) or the sum of two partial folds, `earlier` first.
    #[inline(always)]
    unsafe fn fold<const MAX: bool>(earlier: __m512, later: __m512) -> __m512 {
        if MAX {
            max_first(earlier, later)
        } else {
            _mm512_add_ps(earlier, later)
        }
    }

    /// Output rows `lines` of one plane into `dst` (`lines.len()` rows of `OW`): maxima
    /// (`MAX`), or sums divided by `divisors` (positions down per output row, across per output
    /// column in whole vectors).
    ///
    /// # Safety
    /// AVX-512F present; `g` passed [`super::applies`]; `xplane` is one input plane.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn plane_rows<const MAX: bool>(
        g: &Geo,
        xplane: &[f32],
        lines: Range<usize>,
        dst: &mut [f32],
        scratch: &mut Scratch,
        (down, across_counts): (&[f32], &[f32]),
    ) {
        let (h, w, ow) = (g.ind[1], g.ind[2], g.outd[2]);
        let (pt, pl, sh, sw) = (g.pb[1], g.pb[2], g.s[1], g.s[2]);
        let vecs = ow.div_ceil(16);
        let width = 16 * vecs;
        // Input rows the lines read: sh * i - pt + {0, 1, 2} inside 0..h.
        let first = (sh * lines.start).saturating_sub(pt);
        let end = (sh * (lines.end - 1) + 3).saturating_sub(pt).min(h);
        // Reduced rows hold whole vectors; every value is written before it is read.
        let (across, masks) = scratch;
        let need = (end - first) * width;
        if across.len() < need {
            across.resize(need, 0.0);
        }
        // Output j reads input columns sw * j - pl + {0, 1, 2}: vector v loads 16 columns from
        // 16 * sw * v - pl + each offset, the lanes outside the row masked off (-inf for a
        // max, 0 for a sum; never read). Stride 2 loads two vector pairs and pulls the even and odd columns apart.
        let offsets: &[isize] = if sw == 1 { &[0, 1, 2] } else { &[0, 16, 2, 18] };
        let from = |v: usize, o: usize| (16 * sw * v) as isize - pl as isize + offsets[o];
        masks.clear();
        masks.extend((0..vecs).map(|v| {
            std::array::from_fn(|o| {
                let o = o.min(offsets.len() - 1);
                let lo = (-from(v, o)).clamp(0, 16);
                let hi = (w as isize - from(v, o)).clamp(0, 16);
                ((1u32 << hi) - (1u32 << lo.min(hi))) as __mmask16
            })
        }));
        let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let fill = _mm512_set1_ps(if MAX { f32::NEG_INFINITY } else { 0.0 });
        for (r, reduced) in (first..end).zip(across.chunks_exact_mut(width)) {
            let row = xplane[r * w..][..w].as_ptr();
            for ((v, out), mask) in reduced.chunks_exact_mut(16).enumerate().zip(&*masks) {
                // SAFETY: only the lanes inside the row are read.
                let load =
                    |o: usize| _mm512_mask_loadu_ps(fill, mask[o], row.wrapping_offset(from(v, o)));
                let m = if sw == 1 {
                    fold::<MAX>(fold::<MAX>(load(0), load(1)), load(2))
                } else {
                    let (a0, a1, b0, b1) = (load(0), load(1), load(2), load(3));
                    let e = _mm512_permutex2var_ps(a0, evens, a1);
                    let o = _mm512_permutex2var_ps(a0, odds, a1);
                    let e2 = _mm512_permutex2var_ps(b0, evens, b1);
                    fold::<MAX>(fold::<MAX>(e, o), e2)
                };
                _mm512_storeu_ps(out.as_mut_ptr(), m);
            }
        }
        let tail = match ow % 16 {
            0 => 0xffff,
            r => (1u16 << r) - 1,
        };
        // Output rows are stored a whole vector at a time: a row's last vector runs into the next
        // rows, whose own stores overwrite that later. Only a store that would run past `dst` is
        // masked (masked stores cost a third of an inception 3x3/1 pool's time).
        assert_eq!(dst.len(), lines.len() * ow, "pool 3x3: output block size");
        let (out, room) = (dst.as_mut_ptr(), dst.len());
        for (j, i) in lines.enumerate() {
            // Window rows inside the plane, as rows of `across`.
            let top = (sh * i).saturating_sub(pt) - first;
            let bottom = ((sh * i + 3).saturating_sub(pt).min(h)) - first;
            let rows = across[top * width..bottom * width].as_ptr();
            for v in 0..vecs {
                let at = |r: usize| _mm512_loadu_ps(rows.add(r * width + 16 * v));
                let mut m = at(0);
                for r in 1..bottom - top {
                    m = fold::<MAX>(m, at(r));
                }
                if !MAX {
                    let count = _mm512_loadu_ps(across_counts.as_ptr().add(16 * v));
                    m = _mm512_div_ps(m, _mm512_mul_ps(count, _mm512_set1_ps(down[i])));
                }
                let first = j * ow + 16 * v;
                if first + 16 <= room {
                    _mm512_storeu_ps(out.add(first), m);
                } else {
                    _mm512_mask_storeu_ps(out.add(first), tail, m);
                }
            }
        }
    }
}
