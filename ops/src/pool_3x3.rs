//! MaxPool and AveragePool 3x3 of stride 1 or 2 (the vision models' downsampling pools and
//! inception's branch pools) on AVX-512, and of stride 2 on AVX2, as two separable passes per
//! plane: each input row the output rows read is reduced once across, a vector of outputs a
//! step (16 or 8; stride 2 pulls the even, odd and next even columns out of two vector pairs by
//! permutes), then each output row reduces its three reduced rows (and an average divides).
//! Input rows are read in place, pads and row ends masked off in the loads of the vectors that
//! cross them: no copy into phase planes (`phase_planes.rs`) or bands (`pool_plane.rs`), which
//! other pools and every CPU without AVX2 keep. One generic body ([`plane_rows`]) is compiled
//! for each set's vectors ([`lanes::Lanes`]).
//!
//! On an Intel Xeon (AVX-512): squeezenet's three 3x3/2 MaxPools 0.58-0.71 -> 0.34-0.39 ms,
//! inception's 3x3/1 MaxPools on 14x14 and 7x7 planes 60-79 -> 38-41 us. On an AMD EPYC
//! (Zen 3, AVX2) against the phase planes, toggled in one process: squeezenet's three 0.71-0.75
//! -> 0.55-0.57 ms, inception_v2's pools together 0.93-0.95x; its 3x3/1 AveragePools on 14x14
//! planes took 1.3-1.7x the bands' time, so AVX2 takes stride 2 only (docs/bench.md).
//!
//! A max is exact like the other max paths: each maximum keeps the earlier operand on a tie
//! and propagates NaN, so across then down gives the first maximum in row-major window order.
//! A stride-1 average sums each window row, then the rows, like the bands; a strided one adds
//! its 9 taps one by one in row-major order (window rows outside the plane as zeros) straight
//! from the permuted input vectors, as the phase planes do, so every SIMD level gives the same
//! bits. shufflenet's 3x3/2 pad-1 AveragePools, one thread, best of 2000: 24 x 56 x 56 88 ->
//! 21 us, 240 x 28 x 28 112 -> 64, 480 x 14 x 14 110 -> 71 (the phase planes before them).
//!
//! Sits between [`Pool::pool_planes_f32`](super::Pool) (geometry, the choice of path) and the
//! CPU's vector units.

use super::{window_counts, Geo};
#[cfg(target_arch = "x86_64")]
use {crate::shape::rows_by_block, rayon::prelude::*, std::ops::Range};

/// Whether [`pool_f32`] computes this pooling: a 3x3 undilated 2-D window of stride 1 or 2
/// whose every window holds an input element, on a CPU whose kernels run AVX-512, or of
/// stride 2 on one whose kernels run AVX2 (module docs).
pub(super) fn applies(g: &Geo) -> bool {
    let axis_fits = |a: usize| {
        g.k[a] == 3
            && (1..=2).contains(&g.s[a])
            && g.d[a] == 1
            && g.pb[a] <= 2
            && g.outd[a] > 0
            && g.s[a] * (g.outd[a] - 1) < g.ind[a] + g.pb[a]
    };
    let level_fits = match crate::simd::level() {
        crate::simd::Level::Avx512 => true,
        crate::simd::Level::Avx2 => g.s[1] == 2 && g.s[2] == 2,
        crate::simd::Level::Baseline => false,
    };
    level_fits && axis_fits(1) && axis_fits(2)
}

/// Per-task scratch: the reduced rows of a block, and each vector's load masks (none where
/// every lane of its loads is inside the row).
#[cfg(target_arch = "x86_64")]
type Scratch<M> = (Vec<f32>, Vec<Option<[M; 4]>>);

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
    let ow = g.outd[2];
    // An average's divisor: positions down (per output row) times across (per output column,
    // whole vectors of either set; 1 past the row's end).
    let divisors = match fold {
        Fold::Max => (Vec::new(), Vec::new()),
        Fold::Average { count_include_pad } => {
            let mut across: Vec<f32> = window_counts(g, 2, count_include_pad).collect();
            across.resize(ow.next_multiple_of(16), 1.0);
            (window_counts(g, 1, count_include_pad).collect(), across)
        }
    };
    let max = matches!(fold, Fold::Max);
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        crate::simd::Level::Avx512 => planes::<lanes::Avx512>(x, g, max, divisors, y, first_row),
        _ => planes::<lanes::Avx2>(x, g, max, divisors, y, first_row),
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, max, divisors, y, first_row);
}

/// [`pool_f32`] on vectors `V`: maxima (`max`) or averages (`divisors`).
#[cfg(target_arch = "x86_64")]
fn planes<V: lanes::Lanes>(
    x: &[f32],
    g: &Geo,
    max: bool,
    (down, across): (Vec<f32>, Vec<f32>),
    y: &mut [f32],
    first_row: usize,
) {
    let (oh, ow, plane) = (g.outd[1], g.outd[2], g.ind[1] * g.ind[2]);
    let rows = first_row..first_row + y.len() / ow;
    rows_by_block(y, rows, oh, ow)
        .into_par_iter()
        .for_each_init(Scratch::<V::Mask>::default, |scratch, (p, lines, dst)| {
            let xplane = &x[p * plane..][..plane];
            let divisors = (&down[..], &across[..]);
            // SAFETY: `applies` checked that the kernels run AVX2 (and `pool_f32` that they
            // run AVX-512 for `V = Avx512`).
            unsafe {
                match max {
                    true => V::plane_rows::<true>(g, xplane, lines, dst, scratch, divisors),
                    false => V::plane_rows::<false>(g, xplane, lines, dst, scratch, divisors),
                }
            }
        });
}

/// Output rows `lines` of one plane into `dst` (`lines.len()` rows of `OW`): maxima (`MAX`),
/// or sums divided by `divisors` (positions down per output row, across per output column in
/// whole vectors), `V::N` outputs a vector.
///
/// # Safety
/// `V`'s instructions present (inlined into its `#[target_feature]` function); `g` passed
/// [`applies`]; `xplane` is one input plane.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn plane_rows<V: lanes::Lanes, const MAX: bool>(
    g: &Geo,
    xplane: &[f32],
    lines: Range<usize>,
    dst: &mut [f32],
    scratch: &mut Scratch<V::Mask>,
    (down, across_counts): (&[f32], &[f32]),
) {
    let n = V::N;
    let (h, w, ow) = (g.ind[1], g.ind[2], g.outd[2]);
    let (pt, pl, sh, sw) = (g.pb[1], g.pb[2], g.s[1], g.s[2]);
    let vecs = ow.div_ceil(n);
    let width = n * vecs;
    // Input rows the lines read: sh * i - pt + {0, 1, 2} inside 0..h.
    let first = (sh * lines.start).saturating_sub(pt);
    let end = (sh * (lines.end - 1) + 3).saturating_sub(pt).min(h);
    let (across, masks) = scratch;
    // Output j reads input columns sw * j - pl + {0, 1, 2}: vector v loads N columns from
    // N * sw * v - pl + each offset, the lanes outside the row masked off (-inf for a max, 0
    // for a sum; never read). Stride 2 loads two vector pairs and pulls the even and odd
    // columns apart.
    let offsets: [isize; 4] = match sw {
        1 => [0, 1, 2, 2],
        _ => [0, n as isize, 2, n as isize + 2],
    };
    let from = |v: usize, o: usize| (n * sw * v) as isize - pl as isize + offsets[o];
    masks.clear();
    masks.extend((0..vecs).map(|v| {
        let lanes = |o: usize| {
            let lo = (-from(v, o)).clamp(0, n as isize) as usize;
            let hi = (w as isize - from(v, o)).clamp(0, n as isize) as usize;
            lo.min(hi)..hi
        };
        let full = (0..4).all(|o| lanes(o) == (0..n));
        (!full).then(|| std::array::from_fn(|o| V::lanes(lanes(o))))
    }));
    let fill = V::splat(if MAX { f32::NEG_INFINITY } else { 0.0 });
    let fold = |earlier, later| match MAX {
        true => V::max_first(earlier, later),
        false => V::add(earlier, later),
    };
    if !MAX && (sh, sw) != (1, 1) {
        // A strided average adds its 9 taps one by one in row-major order, window rows
        // outside the plane as zeros, as the phase planes do: the same bits at every level.
        assert_eq!(dst.len(), lines.len() * ow, "pool 3x3: output block size");
        let (out, room) = (dst.as_mut_ptr(), dst.len());
        for (j, i) in lines.enumerate() {
            for (v, mask) in masks.iter().enumerate() {
                let mut acc: Option<V> = None;
                for r in 0..3 {
                    let ir = (sh * i + r) as isize - pt as isize;
                    let taps: [V; 3] = if (0..h as isize).contains(&ir) {
                        let row = xplane[ir as usize * w..][..w].as_ptr();
                        // SAFETY: only the lanes inside the row are read.
                        let load = |o: usize| {
                            let at = row.wrapping_offset(from(v, o));
                            match mask {
                                None => V::load(at),
                                Some(mask) => V::load_masked(fill, mask[o], at),
                            }
                        };
                        if sw == 1 {
                            [load(0), load(1), load(2)]
                        } else {
                            let (e, o) = V::evens_odds(load(0), load(1));
                            [e, o, V::evens_odds(load(2), load(3)).0]
                        }
                    } else {
                        [fill; 3]
                    };
                    for t in taps {
                        acc = Some(acc.map_or(t, |a| V::add(a, t)));
                    }
                }
                let count = V::load(across_counts.as_ptr().add(n * v));
                let m = V::div(
                    acc.expect("3 window rows"),
                    V::mul(count, V::splat(down[i])),
                );
                let first = j * ow + n * v;
                match first + n <= room {
                    true => V::store(out.add(first), m),
                    false => V::store_first(out.add(first), m, room - first),
                }
            }
        }
        return;
    }
    // Reduced rows hold whole vectors; every value is written before it is read.
    let need = (end - first) * width;
    if across.len() < need {
        across.resize(need, 0.0);
    }
    for (r, reduced) in (first..end).zip(across.chunks_exact_mut(width)) {
        let row = xplane[r * w..][..w].as_ptr();
        for ((v, out), mask) in reduced.chunks_exact_mut(n).enumerate().zip(&*masks) {
            // SAFETY: only the lanes inside the row are read.
            let load = |o: usize| {
                let at = row.wrapping_offset(from(v, o));
                match mask {
                    None => V::load(at),
                    Some(mask) => V::load_masked(fill, mask[o], at),
                }
            };
            let m = if sw == 1 {
                fold(fold(load(0), load(1)), load(2))
            } else {
                let (e, o) = V::evens_odds(load(0), load(1));
                fold(fold(e, o), V::evens_odds(load(2), load(3)).0)
            };
            V::store(out.as_mut_ptr(), m);
        }
    }
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
            let at = |r: usize| V::load(rows.add(r * width + n * v));
            let mut m = at(0);
            for r in 1..bottom - top {
                m = fold(m, at(r));
            }
            if !MAX {
                let count = V::load(across_counts.as_ptr().add(n * v));
                m = V::div(m, V::mul(count, V::splat(down[i])));
            }
            let first = j * ow + n * v;
            match first + n <= room {
                true => V::store(out.add(first), m),
                false => V::store_first(out.add(first), m, room - first),
            }
        }
    }
}

/// The vector instructions [`plane_rows`] runs, for AVX2 (8 lanes) and AVX-512 (16): each a
/// plain intrinsic or two, inlined into the set's `#[target_feature]` copy of [`plane_rows`].
#[cfg(target_arch = "x86_64")]
mod lanes {
    use super::{plane_rows, Geo, Scratch};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// # Safety
    /// Every method needs its set's instructions, present where [`Lanes::plane_rows`] is called.
    pub(super) trait Lanes: Copy {
        /// Lanes a vector.
        const N: usize;
        /// Which lanes a load reads.
        type Mask: Copy + Send;
        /// [`plane_rows`] compiled for this set.
        unsafe fn plane_rows<const MAX: bool>(
            g: &Geo,
            xplane: &[f32],
            lines: Range<usize>,
            dst: &mut [f32],
            scratch: &mut Scratch<Self::Mask>,
            divisors: (&[f32], &[f32]),
        );
        /// A mask of lanes `lanes`.
        unsafe fn lanes(lanes: Range<usize>) -> Self::Mask;
        unsafe fn splat(v: f32) -> Self;
        unsafe fn load(p: *const f32) -> Self;
        /// The lanes of `mask` from `p` (only those are read), `fill` elsewhere.
        unsafe fn load_masked(fill: Self, mask: Self::Mask, p: *const f32) -> Self;
        unsafe fn store(p: *mut f32, v: Self);
        /// The first `n` lanes of `v` only.
        unsafe fn store_first(p: *mut f32, v: Self, n: usize);
        /// The larger of `earlier` and `later`, `earlier` on a tie, NaN if either is NaN.
        /// (AVX-512's VRANGEPS would be one instruction, but it returns the other operand of a
        /// quiet NaN.)
        unsafe fn max_first(earlier: Self, later: Self) -> Self;
        unsafe fn add(a: Self, b: Self) -> Self;
        unsafe fn mul(a: Self, b: Self) -> Self;
        unsafe fn div(a: Self, b: Self) -> Self;
        /// The even and the odd lanes of `a` then `b` (columns 0, 2, .. and 1, 3, .. of the
        /// 2N columns they hold).
        unsafe fn evens_odds(a: Self, b: Self) -> (Self, Self);
    }

    #[derive(Clone, Copy)]
    pub(super) struct Avx2(__m256);

    #[derive(Clone, Copy)]
    pub(super) struct Avx512(__m512);

    impl Lanes for Avx2 {
        const N: usize = 8;
        type Mask = __m256i;
        #[target_feature(enable = "avx2,fma")]
        unsafe fn plane_rows<const MAX: bool>(
            g: &Geo,
            xplane: &[f32],
            lines: Range<usize>,
            dst: &mut [f32],
            scratch: &mut Scratch<__m256i>,
            divisors: (&[f32], &[f32]),
        ) {
            // SAFETY: forwarded; AVX2 enabled here.
            unsafe { plane_rows::<Self, MAX>(g, xplane, lines, dst, scratch, divisors) }
        }
        #[inline(always)]
        unsafe fn lanes(lanes: Range<usize>) -> __m256i {
            // Built in scalar code: its callers are closures, which are compiled without AVX2.
            let bits: [i32; 8] = std::array::from_fn(|i| -(lanes.contains(&i) as i32));
            // SAFETY: 32 bytes of plain integers either way.
            unsafe { std::mem::transmute::<[i32; 8], __m256i>(bits) }
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            Self(_mm256_set1_ps(v))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Self(_mm256_loadu_ps(p))
        }
        #[inline(always)]
        unsafe fn load_masked(fill: Self, mask: __m256i, p: *const f32) -> Self {
            let loaded = _mm256_maskload_ps(p, mask);
            Self(_mm256_blendv_ps(fill.0, loaded, _mm256_castsi256_ps(mask)))
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self) {
            _mm256_storeu_ps(p, v.0)
        }
        #[inline(always)]
        unsafe fn store_first(p: *mut f32, v: Self, n: usize) {
            _mm256_maskstore_ps(p, Self::lanes(0..n), v.0)
        }
        #[inline(always)]
        unsafe fn max_first(earlier: Self, later: Self) -> Self {
            // vmaxps(a, b) is `a > b ? a : b`, and `b` when either is NaN.
            let m = _mm256_max_ps(later.0, earlier.0);
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(later.0, later.0);
            Self(_mm256_blendv_ps(m, later.0, nan))
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            Self(_mm256_add_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Self(_mm256_mul_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn div(a: Self, b: Self) -> Self {
            Self(_mm256_div_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn evens_odds(a: Self, b: Self) -> (Self, Self) {
            // Per 128-bit half: a's evens (odds), then b's; then the 64-bit quarters reordered
            // to a's low, a's high, b's low, b's high.
            let e = _mm256_shuffle_ps::<0b10_00_10_00>(a.0, b.0);
            let o = _mm256_shuffle_ps::<0b11_01_11_01>(a.0, b.0);
            let order = |v: __m256| {
                _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)))
            };
            (Self(order(e)), Self(order(o)))
        }
    }

    impl Lanes for Avx512 {
        const N: usize = 16;
        type Mask = __mmask16;
        #[target_feature(enable = "avx512f")]
        unsafe fn plane_rows<const MAX: bool>(
            g: &Geo,
            xplane: &[f32],
            lines: Range<usize>,
            dst: &mut [f32],
            scratch: &mut Scratch<__mmask16>,
            divisors: (&[f32], &[f32]),
        ) {
            // SAFETY: forwarded; AVX-512F enabled here.
            unsafe { plane_rows::<Self, MAX>(g, xplane, lines, dst, scratch, divisors) }
        }
        #[inline(always)]
        unsafe fn lanes(lanes: Range<usize>) -> __mmask16 {
            ((1u32 << lanes.end) - (1u32 << lanes.start)) as __mmask16
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            Self(_mm512_set1_ps(v))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Self(_mm512_loadu_ps(p))
        }
        #[inline(always)]
        unsafe fn load_masked(fill: Self, mask: __mmask16, p: *const f32) -> Self {
            Self(_mm512_mask_loadu_ps(fill.0, mask, p))
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self) {
            _mm512_storeu_ps(p, v.0)
        }
        #[inline(always)]
        unsafe fn store_first(p: *mut f32, v: Self, n: usize) {
            _mm512_mask_storeu_ps(p, Self::lanes(0..n), v.0)
        }
        #[inline(always)]
        unsafe fn max_first(earlier: Self, later: Self) -> Self {
            // vmaxps(a, b) is `a > b ? a : b`, and `b` when either is NaN.
            let m = _mm512_max_ps(later.0, earlier.0);
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(later.0, later.0);
            Self(_mm512_mask_mov_ps(m, nan, later.0))
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            Self(_mm512_add_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Self(_mm512_mul_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn div(a: Self, b: Self) -> Self {
            Self(_mm512_div_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn evens_odds(a: Self, b: Self) -> (Self, Self) {
            let evens =
                _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            let odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
            (
                Self(_mm512_permutex2var_ps(a.0, evens, b.0)),
                Self(_mm512_permutex2var_ps(a.0, odds, b.0)),
            )
        }
    }
}
