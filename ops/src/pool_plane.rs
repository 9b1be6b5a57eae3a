//! 1-D and 2-D pooling (MaxPool without Indices, AveragePool) a band of output rows at a time:
//! each input row the band reads has its windows along the last axis reduced once into a row
//! of a small buffer (horizontal pass), then each output row reduces the buffer rows of its
//! window (vertical pass) and an average divides. A 3x3 window costs 3 + 3 operations per
//! output instead of 9, and one call per band (not per row or per tap) keeps the small planes
//! of the vision models (7x7 to 28x28) from paying per-row dispatch.
//!
//! Strided pools whose rows do not take that one pass per tap over whole rows (and strided
//! averages) go through the padded phase planes of `phase_planes.rs` instead
//! ([`Pool::phase_window`]); 3x3 windows of stride 1 or 2 on AVX-512 through `pool_3x3.rs`.
//!
//! Sits between [`Pool::cpu`](super::Pool) (geometry, Indices, the 3-D path) and the CPU's
//! vectors ([`crate::simd`], `phase_planes.rs`). Max is exact and takes the first maximum in row-major window
//! order (as [`Pool::element`](super::Pool) does); an average sums each window row, then the
//! rows (same value as the definition up to rounding). Outputs whose window holds no input
//! (possible with dilations and ceil_mode) are computed by the definition.

use super::{
    inside, interior, max_nan, pool3x3, positions, tap_any, taps, taps3_stride2, window_counts,
    Geo, Pool,
};
use crate::phase_planes::{combine, fold_block, Fold, Scratch, Window};
use crate::shape::rows_by_block;
use std::ops::Range;

/// Per-task scratch of the band path.
pub(super) struct PlaneScratch {
    /// Horizontal results, one row of `outd[2]` per input row of the band.
    h: Vec<f32>,
    /// Per output column, the window positions an average divides by (see `Pool::scratch`),
    /// repeated for every row of a band.
    counts: Vec<f32>,
    /// Output columns whose window holds no input column.
    empty: Vec<usize>,
    /// Output rows (of a plane) whose window holds no input row.
    empty_rows: Vec<usize>,
    /// The border columns (outside `interior`) and, for each, the range of `btaps` holding
    /// the input columns of its window.
    bcols: Vec<(usize, Range<usize>)>,
    btaps: Vec<usize>,
    /// Output columns `lo..hi` whose every strided read stays inside the input row.
    interior: (usize, usize),
    /// Output rows per band.
    band: usize,
}

impl Pool {
    /// Whether the band path computes this pooling: at most 2 spatial dims.
    pub(super) fn plane_fits(&self, g: &Geo) -> bool {
        g.ind[0] == 1 && g.k[0] == 1 && g.outd[0] == 1
    }

    /// Output rows `first_row..` (flat over `[N*C, O1]`, `outd[2]` elements each) into `y`,
    /// tasks of whole rows in parallel.
    pub(super) fn pool_planes_f32(&self, x: &[f32], g: &Geo, y: &mut [f32], first_row: usize) {
        let ow = g.outd[2];
        if ow == 0 || y.is_empty() {
            return;
        }
        // Strided averages add a window's taps in row-major order, on the phase planes and in
        // `pool_3x3.rs` alike: every SIMD level gives the same bits.
        if pool3x3::applies(g) {
            let fold = if self.max {
                pool3x3::Fold::Max
            } else {
                pool3x3::Fold::Average {
                    count_include_pad: self.count_include_pad,
                }
            };
            return pool3x3::pool_f32(x, g, fold, y, first_row);
        }
        if let Some(win) = self.phase_window(g) {
            return self.pool_phases_f32(x, g, &win, y, first_row);
        }
        let rows = y.len() / ow;
        // At least ~8K outputs per task (a task costs a few microseconds to hand out).
        let per = rows
            .div_ceil(4 * rayon::current_num_threads())
            .max(8192usize.div_ceil(ow))
            .max(1);
        let go = |ci: usize, chunk: &mut [f32]| {
            let mut sc = self.plane_scratch(g);
            let (oh, in_plane) = (g.outd[1], g.ind[1] * g.ind[2]);
            let mut r = first_row + ci * per;
            let end = r + chunk.len() / ow;
            let mut off = 0;
            while r < end {
                let (nc, o1) = (r / oh, r % oh);
                let o1e = oh.min(o1 + (end - r)).min(o1 + sc.band);
                let out = &mut chunk[off..off + (o1e - o1) * ow];
                let plane = &x[nc * in_plane..][..in_plane];
                band(
                    g,
                    (self.max, self.count_include_pad),
                    plane,
                    o1..o1e,
                    out,
                    &mut sc,
                );
                self.fix_empty(x, g, r, out, &sc);
                off += (o1e - o1) * ow;
                r += o1e - o1;
            }
        };
        if rows <= per {
            go(0, y);
        } else {
            crate::parallel::for_each_chunk_mut(y, per * ow, |ci, chunk| go(ci, chunk));
        }
    }

    /// The window of a pooling that runs faster through phase planes
    /// ([`Pool::pool_phases_f32`]) than by bands (measured, docs/bench.md "Depthwise and
    /// pooling through phase planes"): strided, and an average or input rows not stride times
    /// the output's (where bands take one pass per tap over whole rows, without a copy). Also
    /// no dilation, and every window holds an input element.
    fn phase_window(&self, g: &Geo) -> Option<Window> {
        let strided = g.s[1] > 1 || g.s[2] > 1;
        if !strided || self.max && g.ind[2] == g.s[2] * g.outd[2] {
            return None;
        }
        // A hostile kernel_shape (2^33 taps, padded to fit) would ask the phase planes for a
        // tap table and planes that size: only windows of up to 1024 taps whose phase planes
        // stay within a few times the plane.
        let taps = g.k[1].checked_mul(g.k[2]).filter(|&t| t <= 1024)?;
        let (down, across) = (g.s[1].min(g.k[1]), g.s[2].min(g.k[2]));
        let rows = g.outd[1].checked_add((g.k[1] - 1) / g.s[1])?;
        let cols = g.outd[2].checked_add((g.k[2] - 1) / g.s[2])?;
        let floats = [down, across, rows, cols]
            .into_iter()
            .try_fold(1usize, |a, v| a.checked_mul(v))?;
        let planes = g.ind[1] * g.ind[2] + g.outd[1] * g.outd[2];
        if floats > 4 * planes + 4 * taps + 4096 {
            return None;
        }
        let nonempty = |a: usize| {
            (0..g.outd[a]).all(|o| {
                let s = (o * g.s[a]) as isize - g.pb[a] as isize;
                positions(g, s, a).next().is_some()
            })
        };
        (g.d[1] == 1 && g.d[2] == 1 && nonempty(1) && nonempty(2)).then(|| Window {
            h: g.ind[1],
            w: g.ind[2],
            ow: g.outd[2],
            kh: g.k[1],
            kw: g.k[2],
            sh: g.s[1],
            sw: g.s[2],
            pt: g.pb[1] as i64,
            pl: g.pb[2] as i64,
        })
    }

    /// [`Pool::pool_planes_f32`] through padded phase planes (`phase_planes.rs`): fill -inf
    /// for a max, 0 for an average, which then divides each output by its window's count; one
    /// task per plane.
    fn pool_phases_f32(&self, x: &[f32], g: &Geo, win: &Window, y: &mut [f32], first_row: usize) {
        let (oh, ow, in_plane) = (g.outd[1], g.outd[2], g.ind[1] * g.ind[2]);
        let rows = first_row..first_row + y.len() / ow;
        let table = win.tap_table();
        // An average's divisor per output: its window's positions down times across (the
        // product `band` divides by).
        let counts = |a: usize| window_counts(g, a, self.count_include_pad);
        let divisors: Vec<f32> = if self.max {
            Vec::new()
        } else {
            let across: Vec<f32> = counts(2).collect();
            counts(1)
                .flat_map(|down| across.iter().map(move |&c| down * c))
                .collect()
        };
        let (fill, fold) = if self.max {
            (f32::NEG_INFINITY, Fold::Max)
        } else {
            (0.0, Fold::Sum)
        };
        let pieces = rows_by_block(y, rows, oh, ow);
        let one = |scratch: &mut Scratch,
                   (plane, lines, dst): (usize, Range<usize>, &mut [f32])| {
            let xplane = &x[plane * in_plane..][..in_plane];
            fold_block(win, xplane, lines.clone(), &table, fill, fold, scratch);
            let div = (!self.max).then(|| &divisors[lines.start * ow..lines.end * ow]);
            block_out(&scratch.1, win.cols(), dst, ow, div);
        };
        crate::parallel::for_each_item_init(pieces, 1, Scratch::default, one);
    }

    fn plane_scratch(&self, g: &Geo) -> PlaneScratch {
        let ow = g.outd[2];
        let (k2, s2, d2, pb2, in2) = (g.k[2], g.s[2], g.d[2], g.pb[2], g.ind[2]);
        // Interior outputs whose last tap's strided read (s2 elements) ends inside the row.
        let (lo, hi) = interior(g, ow);
        let reach = ((k2 - 1) * d2).saturating_add(s2);
        let hi = if in2 + pb2 >= reach {
            hi.min((in2 + pb2 - reach) / s2 + 1)
        } else {
            0
        };
        let band = (16_384 / (ow * g.s[1]).max(1)).clamp(1, g.outd[1].max(1));
        let in_rows = ((band - 1) * g.s[1] + (g.k[1] - 1) * g.d[1] + 1).min(g.ind[1]);
        let row: Vec<f32> = if self.max {
            Vec::new()
        } else {
            (0..ow)
                .map(|o2| {
                    let s = (o2 * s2) as isize - pb2 as isize;
                    (if self.count_include_pad {
                        inside(g, s, 2)
                    } else {
                        taps(g, o2).count()
                    }) as f32
                })
                .collect()
        };
        let counts = row.repeat(band);
        let (lo, hi) = (lo.min(hi), hi);
        let (mut bcols, mut btaps) = (Vec::new(), Vec::new());
        for o2 in (0..lo).chain(hi..ow) {
            let at = btaps.len();
            btaps.extend(taps(g, o2));
            bcols.push((o2, at..btaps.len()));
        }
        let empty_rows = (0..g.outd[1])
            .filter(|&o1| {
                let s1 = (o1 * g.s[1]) as isize - g.pb[1] as isize;
                positions(g, s1, 1).next().is_none()
            })
            .collect();
        PlaneScratch {
            h: vec![0.0; in_rows * ow],
            empty_rows,
            bcols,
            btaps,
            counts,
            empty: (0..ow).filter(|&o2| taps(g, o2).next().is_none()).collect(),
            interior: (lo, hi),
            band,
        }
    }

    /// Outputs of rows `row..` (in `out`) whose window holds no input: the definition.
    fn fix_empty(&self, x: &[f32], g: &Geo, row: usize, out: &mut [f32], sc: &PlaneScratch) {
        if sc.empty.is_empty() && sc.empty_rows.is_empty() {
            return;
        }
        let ow = g.outd[2];
        for (i, orow) in out.chunks_exact_mut(ow).enumerate() {
            let r = row + i;
            let cols: Box<dyn Iterator<Item = usize>> = if sc.empty_rows.contains(&(r % g.outd[1]))
            {
                Box::new(0..ow)
            } else {
                Box::new(sc.empty.iter().copied())
            };
            for o2 in cols {
                orow[o2] = self.element(x, g, r * ow + o2).0;
            }
        }
    }
}

crate::simd::kernel! {
    /// Output rows `o1s` of one plane into `out` (see the module doc); `mode` is
    /// (max, count_include_pad). Rows and columns without input are left for `fix_empty`.
    fn band(
        g: &Geo,
        mode: (bool, bool),
        plane: &[f32],
        o1s: Range<usize>,
        out: &mut [f32],
        sc: &mut PlaneScratch,
    ) {
        band_plain(g, mode, plane, o1s, out, sc)
    }
}

#[inline(always)]
fn band_plain(
    g: &Geo,
    (max, cip): (bool, bool),
    plane: &[f32],
    o1s: Range<usize>,
    out: &mut [f32],
    sc: &mut PlaneScratch,
) {
    let (ow, in1, in2) = (g.outd[2], g.ind[1], g.ind[2]);
    let (k1, s1, d1, pb1) = (g.k[1], g.s[1], g.d[1], g.pb[1]);
    let span1 = (k1 - 1) * d1;
    let lo_in = (o1s.start * s1).saturating_sub(pb1);
    let hi_in = in1.min(((o1s.end - 1) * s1 + span1 + 1).saturating_sub(pb1));
    // An empty last axis (in2 = 0, windows of padding only) leaves every column to fix_empty.
    if lo_in < hi_in && in2 > 0 {
        let h = &mut sc.h[..(hi_in - lo_in) * ow];
        let x = &plane[lo_in * in2..hi_in * in2];
        let s2 = g.s[2];
        if in2 == s2 * ow {
            // Rows s2 times as long as the output's: output j (flat over the band) reads input
            // s2 * j - pb2 + k * d2 for every row, so each tap is one pass over the whole band;
            // then the border columns, which that pass read from the neighbouring rows, are
            // redone from their own row.
            let (span2, pb2) = ((g.k[2] - 1) * g.d[2], g.pb[2]);
            let (j0, j1) = (
                pb2.div_ceil(s2),
                (x.len() + pb2).saturating_sub(span2 + s2) / s2 + 1,
            );
            if j0 < j1 && x.len() + pb2 >= span2 + s2 {
                window_row(g, &mut h[j0..j1], &x[j0 * s2 - pb2..], max);
            }
            for (hrow, xrow) in h.chunks_exact_mut(ow).zip(x.chunks_exact(in2)) {
                borders(max, xrow, hrow, (&sc.bcols, &sc.btaps));
            }
        } else {
            for (hrow, xrow) in h.chunks_exact_mut(ow).zip(x.chunks_exact(in2)) {
                horizontal(g, max, xrow, hrow, sc.interior, (&sc.bcols, &sc.btaps));
            }
        }
    }
    // Output rows whose every tap lies inside the input, one pass per tap when s1 is 1.
    let first_in = pb1.div_ceil(s1);
    let last_in = if in1 + pb1 > span1 {
        (in1 + pb1 - span1 - 1) / s1 + 1
    } else {
        0
    };
    let (a, b) = (
        first_in.clamp(o1s.start, o1s.end),
        last_in.clamp(o1s.start, o1s.end),
    );
    let inner = if s1 == 1 && a < b { a..b } else { a..a };
    if !inner.is_empty() {
        let dst = &mut out[(inner.start - o1s.start) * ow..(inner.end - o1s.start) * ow];
        for k in 0..k1 {
            let from = (inner.start + k * d1 - pb1 - lo_in) * ow;
            combine(dst, &sc.h[from..from + dst.len()], k == 0, max);
        }
        if !max {
            let outer = k1 as f32;
            for (v, &c) in dst.iter_mut().zip(&sc.counts) {
                *v /= outer * c;
            }
        }
    }
    for o1 in (o1s.start..inner.start).chain(inner.end..o1s.end) {
        let orow = &mut out[(o1 - o1s.start) * ow..][..ow];
        let s = (o1 * s1) as isize - pb1 as isize;
        let mut n = 0;
        for i in positions(g, s, 1) {
            let hrow = &sc.h[(i - lo_in) * ow..][..ow];
            combine(orow, hrow, n == 0, max);
            n += 1;
        }
        if n > 0 && !max {
            let outer = if cip { inside(g, s, 1) } else { n } as f32;
            for (v, &c) in orow.iter_mut().zip(&sc.counts) {
                *v /= outer * c;
            }
        }
    }
}

/// The border columns of one input row's horizontal pass (`bcols`: see [`PlaneScratch`]),
/// each over its clipped window (NaN where the window holds no input column: `fix_empty`
/// redoes those).
#[inline(always)]
fn borders(
    max: bool,
    x: &[f32],
    hrow: &mut [f32],
    (bcols, btaps): (&[(usize, Range<usize>)], &[usize]),
) {
    for (o2, at) in bcols {
        let mut it = btaps[at.clone()].iter().map(|&i| x[i]);
        hrow[*o2] = match it.next() {
            None => f32::NAN,
            Some(first) if max => it.fold(first, max_nan),
            Some(first) => it.fold(first, |a, v| a + v),
        };
    }
}

/// The windows of one input row along the last axis: border outputs clip their window, the
/// interior `lo..hi` takes one strided pass per tap.
#[inline(always)]
fn horizontal(
    g: &Geo,
    max: bool,
    x: &[f32],
    hrow: &mut [f32],
    (lo, hi): (usize, usize),
    border: (&[(usize, Range<usize>)], &[usize]),
) {
    borders(max, x, hrow, border);
    if lo < hi {
        window_row(g, &mut hrow[lo..hi], &x[lo * g.s[2] - g.pb[2]..], max);
    }
}

/// The windows along the last axis of the outputs `acc`, `x` starting at the first output's
/// first tap: one pass for three adjacent columns at stride 2 ([`taps3_stride2`]), else one
/// strided pass per tap.
#[inline(always)]
fn window_row(g: &Geo, acc: &mut [f32], x: &[f32], max: bool) {
    let (k2, s2, d2) = (g.k[2], g.s[2], g.d[2]);
    if (k2, s2, d2) == (3, 2, 1) {
        return taps3_stride2(acc, x, max);
    }
    let n = acc.len();
    for k in 0..k2 {
        tap_any(acc, &x[k * d2..][..n * s2], s2, k == 0, max);
    }
}

crate::simd::kernel! {
    /// The output rows `dst` (rows of `ow`) of a block from its folds `acc` (rows of `cols`,
    /// see `phase_planes::fold_block`), each divided by its `div` for an average.
    fn block_out(acc: &[f32], cols: usize, dst: &mut [f32], ow: usize, div: Option<&[f32]>) {
        let rows = dst.chunks_exact_mut(ow).zip(acc.chunks_exact(cols));
        match div {
            None => rows.for_each(|(line, a)| line.copy_from_slice(&a[..ow])),
            Some(div) => {
                for ((line, a), d) in rows.zip(div.chunks_exact(ow)) {
                    for ((v, &s), &d) in line.iter_mut().zip(a).zip(d) {
                        *v = s / d;
                    }
                }
            }
        }
    }
}
