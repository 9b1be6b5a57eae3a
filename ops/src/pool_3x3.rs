//! MaxPool and AveragePool 3x3 of stride 1 or 2 (the vision models' downsampling pools and
//! inception's branch pools) on AVX-512, and of stride 2 on AVX2, as two separable passes per
//! plane: each input row the output rows read is reduced once across, a vector of outputs a
//! step (16 or 8; stride 2 pulls the even, odd and next even columns out of two vector pairs by
//! permutes), then each output row reduces its three reduced rows (and an average divides).
//! Input rows are read in place, pads and row ends masked off in the loads of the vectors that
//! cross them: no copy into phase planes (`phase_planes.rs`) or bands (`pool_plane.rs`), which
//! other pools and every CPU without AVX2 keep. One generic body ([`plane_rows`]) is compiled
//! for each set's vectors ([`Lanes`](crate::lanes::Lanes)). Each row reduced across first
//! fetches the row [`ROWS_AHEAD`] below it into L1: the hardware prefetchers stop at every
//! page, and in a model the input comes from the other core's cache or L3.
//!
//! On an Intel Xeon (AVX-512): squeezenet's three 3x3/2 MaxPools 0.58-0.71 -> 0.34-0.39 ms,
//! inception's 3x3/1 MaxPools on 14x14 and 7x7 planes 60-79 -> 38-41 us. On an AMD EPYC
//! (Zen 3, AVX2) against the phase planes, toggled in one process: squeezenet's three 0.71-0.75
//! -> 0.55-0.57 ms, inception_v2's pools together 0.93-0.95x; its 3x3/1 AveragePools on 14x14
//! planes took 1.3-1.7x the bands' time, so AVX2 takes stride 2 only (docs/bench.md).
//! Stride 2 keeps its columns in [`Lanes::evens_odds_unordered`]'s order through the reductions
//! and puts each output vector in column order once: on AVX2 that saves three of its four
//! permutes per reduced vector (Zen 3, alternated run by run in one process: the pool alone
//! 0.91-0.93x of its time, squeezenet's and resnet50's MaxPools 0.93-0.94x in the models).
//! Those MaxPools have since moved to `pool_3x3_max2.rs`; stride 2 here is the averages and,
//! on AVX-512, max pools strided one way only.
//!
//! A max is exact like the other max paths: each maximum keeps the earlier operand on a tie
//! and propagates NaN, so across then down gives the first maximum in row-major window order.
//! A stride-1 average sums each window row, then the rows, like the bands; a strided one adds
//! its 9 taps one by one in row-major order (window rows outside the plane as zeros) straight
//! from the permuted input vectors, as the phase planes do, so every SIMD level gives the same
//! bits. shufflenet's 3x3/2 pad-1 AveragePools, one thread, best of 2000: 24 x 56 x 56 88 ->
//! 21 us, 240 x 28 x 28 112 -> 64, 480 x 14 x 14 110 -> 71 (the phase planes before them).
//!
//! Whole planes of at most 28 columns that a stride-1 pool with pads of 1 keeps the size of
//! run as one flat run of vectors instead (`pool_3x3_flat.rs`, AVX-512), and MaxPools of
//! stride 2 down and across fold their window rows in registers (`pool_3x3_max2.rs`).
//!
//! Sits between [`Pool::pool_planes_f32`](super::Pool) (geometry, the choice of path) and the
//! CPU's vector units.

use super::{window_counts, Geo};
#[cfg(target_arch = "x86_64")]
use {
    super::pool3x3_flat as flat,
    crate::lanes::{fetch, lane_bits, load_lanes, row_lane_bits, Avx2, Avx512, Lanes},
    crate::shape::rows_by_block,
    std::ops::Range,
};

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

/// Input rows ahead of the one being reduced across whose cache lines are fetched into L1
/// first. A plane's rows are read in order, but the hardware prefetchers stop at each 4 KB page
/// (a 111 x 111 plane spans 12): in the models, where the input was just written by the conv
/// before and sits in the other core's cache or L3, the 64 x 112 x 112 3x3/2 MaxPools of
/// resnet50 (0.81x of their time), inception_v2 (0.84x), densenet121 (0.86x) and squeezenet's
/// 64 x 111 x 111 (0.84x) gained, the smaller pools moved within noise (docs/bench.md, "Pools
/// fetch their rows ahead"). From 4 to 16 rows made no difference.
#[cfg(target_arch = "x86_64")]
const ROWS_AHEAD: usize = 4;

/// Per-task scratch: the reduced rows of a block, and each vector's load masks (none where
/// every lane of its loads is inside the row).
#[cfg(target_arch = "x86_64")]
type Scratch = (Vec<f32>, Vec<Option<[u32; 4]>>, Vec<[u32; 2]>);

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
        crate::simd::Level::Avx512 => planes::<Avx512>(x, g, max, divisors, y, first_row),
        _ => planes::<Avx2>(x, g, max, divisors, y, first_row),
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, max, divisors, y, first_row);
}

/// [`pool_f32`] on vectors `V`: maxima (`max`) or averages (`divisors`); whole planes of
/// small pools through `pool_3x3_flat.rs`.
#[cfg(target_arch = "x86_64")]
fn planes<V: Compiled + flat::Compiled>(
    x: &[f32],
    g: &Geo,
    max: bool,
    (down, across): (Vec<f32>, Vec<f32>),
    y: &mut [f32],
    first_row: usize,
) {
    let (oh, ow, plane) = (g.outd[1], g.outd[2], g.ind[1] * g.ind[2]);
    let rows = first_row..first_row + y.len() / ow;
    let divisors = (!max).then_some((&down[..], &across[..]));
    let flat = flat::applies(g, max).then(|| flat::Flat::of(g, V::N, divisors));
    let pieces = rows_by_block(y, rows, oh, ow);
    let per_task = pieces.len().div_ceil(4 * rayon::current_num_threads());
    crate::parallel::for_each_item_init(
        pieces,
        per_task,
        Scratch::default,
        |scratch, (p, lines, dst): (usize, Range<usize>, &mut [f32])| {
            let xplane = &x[p * plane..][..plane];
            if let Some(f) = flat.as_ref().filter(|_| lines.len() == oh) {
                let len = f.scratch_len(V::N).max(scratch.0.len());
                scratch.0.resize(len, 0.0);
                // SAFETY: `applies` checked AVX-512 (the set `pool_f32` picks there), and
                // `f` was made for `V::N` lanes.
                return unsafe { flat::pool_plane::<V>(f, max, xplane, dst, &mut scratch.0) };
            }
            let divisors = (&down[..], &across[..]);
            // SAFETY: `applies` checked that the kernels run AVX2 (and `pool_f32` that they
            // run AVX-512 for `V = Avx512`).
            unsafe {
                match max {
                    true => V::plane_rows::<true>(g, xplane, lines, dst, scratch, divisors),
                    false => V::plane_rows::<false>(g, xplane, lines, dst, scratch, divisors),
                }
            }
        },
    );
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
unsafe fn plane_rows<V: Lanes, const MAX: bool>(
    g: &Geo,
    xplane: &[f32],
    lines: Range<usize>,
    dst: &mut [f32],
    scratch: &mut Scratch,
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
    if MAX && (sh, sw) == (2, 2) {
        return super::pool3x3_max2::plane_rows::<V>(g, xplane, lines, dst, &mut scratch.2);
    }
    let (across, masks, _) = scratch;
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
        let bits: [u32; 4] = std::array::from_fn(|o| row_lane_bits(from(v, o), w, n));
        (bits != [lane_bits(0..n); 4]).then_some(bits)
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
                        let row = ir * w as isize;
                        // SAFETY: only the lanes inside the row are read.
                        let mut l = [fill; 4];
                        for (o, l) in l.iter_mut().enumerate().take(3 + (sw != 1) as usize) {
                            *l = tap(fill, mask.map(|m| m[o]), xplane, row + from(v, o));
                        }
                        if sw == 1 {
                            [l[0], l[1], l[2]]
                        } else {
                            let (e, o) = V::evens_odds_unordered(l[0], l[1]);
                            [e, o, V::evens_odds_unordered(l[2], l[3]).0]
                        }
                    } else {
                        [fill; 3]
                    };
                    for t in taps {
                        acc = Some(acc.map_or(t, |a| V::add(a, t)));
                    }
                }
                let count = V::load(across_counts.as_ptr().add(n * v));
                let acc = acc.expect("3 window rows");
                // Taps added lane by lane in the strided order, put in column order once.
                let acc = match sw {
                    1 => acc,
                    _ => V::in_order(acc),
                };
                let m = V::div(acc, V::mul(count, V::splat(down[i])));
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
        // Only fetched, never read: past the plane's last rows this is the next plane's
        // first ones (the next task's, or nothing), and a prefetch does not fault.
        fetch(row.wrapping_add(ROWS_AHEAD * w), w);
        for ((v, out), mask) in reduced.chunks_exact_mut(n).enumerate().zip(&*masks) {
            // SAFETY: only the lanes inside the row are read.
            let mut l = [fill; 4];
            for (o, l) in l.iter_mut().enumerate().take(3 + (sw != 1) as usize) {
                *l = tap(
                    fill,
                    mask.map(|m| m[o]),
                    xplane,
                    (r * w) as isize + from(v, o),
                );
            }
            let m = if sw == 1 {
                fold(fold(l[0], l[1]), l[2])
            } else {
                // Stored in the strided order ([`Lanes::evens_odds_unordered`]): the rows
                // down are reduced lane by lane, then put in column order once.
                let (e, o) = V::evens_odds_unordered(l[0], l[1]);
                fold(fold(e, o), V::evens_odds_unordered(l[2], l[3]).0)
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
            if sw != 1 {
                m = V::in_order(m);
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

/// The lanes of `bits` (every lane where `None`) from `xplane[at..]`, `fill` elsewhere. Called
/// from a loop, not a closure: LLVM compiled a closure holding [`load_lanes`]'s branches
/// without the set's instructions and left it uninlined (the max pools ran 3-4x slower).
///
/// # Safety
/// `V`'s instructions present; the lanes of `bits` lie in `xplane`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tap<V: Lanes>(fill: V, bits: Option<u32>, xplane: &[f32], at: isize) -> V {
    match bits {
        None => V::load(xplane.as_ptr().offset(at)),
        Some(bits) => load_lanes(fill, bits, xplane, at),
    }
}

#[cfg(target_arch = "x86_64")]
crate::lanes::per_set! {
    /// [`plane_rows`] compiled for each set's instructions.
    trait Compiled {
        fn plane_rows<const MAX: bool>(
            g: &Geo,
            xplane: &[f32],
            lines: Range<usize>,
            dst: &mut [f32],
            scratch: &mut Scratch,
            divisors: (&[f32], &[f32]),
        );
    }
}
