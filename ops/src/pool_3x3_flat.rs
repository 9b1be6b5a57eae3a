//! MaxPool and AveragePool 3x3 of stride 1 that keep a small plane's size (pads of 1 on
//! every side: inception's branch pools on 28x28 to 7x7 planes), a whole plane as one run of
//! vectors: a vector holds consecutive pixels across rows. The across pass folds each pixel
//! with its left and right neighbours, the lanes of the first and last column masked to the
//! fold's identity; the down pass folds each reduced pixel with those a row above and below,
//! the lanes of the first and last row masked alike (an average then divides by its window's
//! positions). The masks repeat for every plane and are made once per call ([`Flat`]).
//! MaxPools of stride 2 on such planes whose windows are all centred inside them (inception's
//! 320 x 28 x 28 and 576 x 14 x 14, squeezenet's 256 x 27 x 27) take the same across pass,
//! then per output row fold the three reduced rows around its centre row and keep the centre
//! columns (every other lane).
//!
//! Row vectors (`pool_3x3.rs`) fill 7 or 14 of 16 lanes on such planes and pay their steps
//! per row. On an Intel Xeon (AVX-512, 2 threads, best of 200, the two paths alternated in one
//! process, same bits): inception_v2's 576 x 14 x 14 AveragePool 72.6 -> 35.6 us, 1024 x 7 x 7
//! MaxPool 95.9 -> 35.1, 192 x 28 x 28 AveragePool 79.8 -> 47.7 (onnxruntime's NCHW kernels
//! 21-33, 16-20 and 23-32); stride 2: 576 x 14 x 14 MaxPool 57.2 -> 39.7, 320 x 28 x 28 47.6 ->
//! 39.4, 256 x 27 x 27 38.6 -> 31.1. In inception_v2 (ten of its thirteen pools flat) they took
//! 1.39-1.40 ms against 1.91-1.92 (docs/bench.md, "Small pools as flat planes").
//!
//! The folds run in `pool_3x3.rs`'s order (left, centre, right; then above, centre, below),
//! a masked lane holding the fold's identity (-inf for a max, -0.0 for a sum, which leaves
//! every addend as it is), and an average divides by the same divisor (positions down times
//! across): a max is the first maximum in row-major window order, bit for bit.
//!
//! Sits between `pool_3x3.rs`'s planes (which hand it whole planes, [`applies`]) and the CPU's
//! vector units.

use super::Geo;
use crate::lanes::{fetch, Lanes};

/// Widest plane rows taken here: from 32 columns the row vectors of `pool_3x3.rs` fill
/// (nearly) every lane.
const MAX_WIDTH: usize = 28;

/// How far on from a plane (floats) [`fetch_plane_ahead`] fetches the plane there.
const PLANE_AHEAD: usize = 1024;

/// Fetch into L1 the plane of `len` floats about [`PLANE_AHEAD`] floats on from `plane` (the
/// next 28 x 28 plane, the fifth 14 x 14 one, the twentieth 7 x 7 one). A task's planes are
/// one run of memory, taken one after another, but the hardware prefetchers stop at each 4 KB
/// page, and in a model the planes were just written by the nodes before (the other core's
/// cache, or L3). Only fetched, never read: past the input's end it fetches nothing that
/// matters (a prefetch does not fault). inception_v2's ten pools here, two threads, the two
/// alternated process by process, 20 rounds on a noisy host: each 0.80-0.99x of its time,
/// together 0.337 -> 0.305 ms. 4096 floats ahead was no better; fetching the output planes
/// ahead for writing (PREFETCHW) made the pools 1.01-1.20x slower, and fetching ahead in
/// shufflenet's depthwise convs (`conv_depthwise.rs`) 1.00-1.15x (docs/bench.md, "Flat
/// pools fetch their planes ahead").
#[inline(always)]
fn fetch_plane_ahead(plane: *const f32, len: usize) {
    fetch(
        plane.wrapping_add(len * (PLANE_AHEAD / len.max(1)).max(1)),
        len,
    );
}

/// Whether a pooling that `pool_3x3.rs` takes runs its whole planes here: rows of at most
/// [`MAX_WIDTH`] columns, AVX-512, not turned off (`TANDEM_POOL_FLAT=0`), and either stride 1
/// with pads of 1 on every side (the output plane the input's size) or a max of stride 2
/// whose every window is centred inside the plane.
pub(super) fn applies(g: &Geo, max: bool) -> bool {
    let same =
        |a: usize| (g.s[a], g.pb[a], g.pe[a]) == (1, 1, 1) && g.outd[a] == g.ind[a] && g.ind[a] > 1;
    let halving = |a: usize| {
        g.s[a] == 2 && g.pb[a] <= 1 && 2 * (g.outd[a] - 1) + 1 < g.ind[a] + g.pb[a] && g.ind[a] > 1
    };
    let fits = (same(1) && same(2)) || (max && halving(1) && halving(2));
    fits && g.ind[2] <= MAX_WIDTH && crate::simd::avx512() && enabled()
}

/// Whether `TANDEM_POOL_FLAT=0` turned this path off (read once; A/B timing in one binary).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_POOL_FLAT").as_deref() != Ok("0"))
}

/// What every plane of a call shares: per vector of the flat plane, the lanes inside it and
/// those whose left, right, upper and lower neighbours are (as mask bits, lane 0 the
/// lowest), and per pixel an average's divisor (1 past the plane's end).
pub(super) struct Flat {
    h: usize,
    w: usize,
    /// Stride 2: output rows and columns, and the first window's centre row and column.
    halving: Option<(usize, usize, usize, usize)>,
    /// `[inside, left, right, up, down]` per vector.
    bits: Vec<[u32; 5]>,
    divisors: Vec<f32>,
}

impl Flat {
    /// The masks of `g`'s planes for vectors of `n` lanes, and an average's divisors from its
    /// window positions down (per output row) and across (per output column), as
    /// `pool_3x3.rs` counts them.
    pub(super) fn of(g: &Geo, n: usize, average: Option<(&[f32], &[f32])>) -> Flat {
        let (h, w) = (g.ind[1], g.ind[2]);
        let hw = h * w;
        let vecs = hw.div_ceil(n);
        let bits = (0..vecs)
            .map(|v| {
                let lanes = |ok: &dyn Fn(usize) -> bool| {
                    (0..n)
                        .map(|l| v * n + l)
                        .enumerate()
                        .filter(|&(_, p)| p < hw && ok(p))
                        .fold(0u32, |b, (l, _)| b | 1 << l)
                };
                [
                    lanes(&|_| true),
                    lanes(&|p| p % w > 0),
                    lanes(&|p| p % w < w - 1),
                    lanes(&|p| p >= w),
                    lanes(&|p| p < hw - w),
                ]
            })
            .collect();
        let divisors = match average {
            None => Vec::new(),
            Some((down, across)) => {
                let mut d: Vec<f32> = (0..hw).map(|p| across[p % w] * down[p / w]).collect();
                d.resize(vecs * n, 1.0);
                d
            }
        };
        let halving = (g.s[1] == 2).then(|| {
            assert!(g.outd[2] <= n, "pool 3x3 flat: {} outputs a row", g.outd[2]);
            let centre = |a: usize| 1 - g.pb[a];
            (g.outd[1], g.outd[2], centre(1), centre(2))
        });
        Flat {
            h,
            w,
            halving,
            bits,
            divisors,
        }
    }

    /// Floats of a plane's reduced-across scratch: its whole vectors, and two more that a
    /// strided last row's loads may run into.
    pub(super) fn scratch_len(&self, n: usize) -> usize {
        (self.bits.len() + 2) * n
    }

    /// Output floats of a plane.
    fn out_len(&self) -> usize {
        self.halving
            .map_or(self.h * self.w, |(oh, ow, _, _)| oh * ow)
    }
}

/// One plane `xplane` (`h x w`) pooled into `out` (`h x w`, or the strided output plane):
/// maxima (`MAX`) or averages, through `across` ([`Flat::scratch_len`] floats). A strided
/// max folds, per output row, the reduced rows above, at and below its windows' centre row,
/// one or two vectors across, and keeps their every other lane (the centre columns).
///
/// # Safety
/// `V`'s instructions present (inlined into its `#[target_feature]` function); `f` made for
/// `V::N` lanes.
#[inline(always)]
unsafe fn plane<V: Lanes, const MAX: bool>(
    f: &Flat,
    xplane: &[f32],
    out: &mut [f32],
    across: &mut [f32],
) {
    let (n, w, hw) = (V::N, f.w, f.h * f.w);
    assert!(
        xplane.len() == hw && out.len() == f.out_len() && across.len() >= f.scratch_len(n),
        "pool 3x3 flat: plane sizes"
    );
    let fill = V::splat(if MAX { f32::NEG_INFINITY } else { -0.0 });
    let (x, t) = (xplane.as_ptr(), across.as_mut_ptr());
    fetch_plane_ahead(x, hw);
    // Masked lanes are never read: the pointers may point before or past the slices.
    for (v, b) in f.bits.iter().enumerate() {
        let at = x.wrapping_add(v * n);
        let left = V::load_masked(fill, V::bits(b[1]), at.wrapping_sub(1));
        let centre = V::load_masked(fill, V::bits(b[0]), at);
        let right = V::load_masked(fill, V::bits(b[2]), at.wrapping_add(1));
        let lc = fold_two::<V, MAX>(left, centre);
        V::store(t.add(v * n), fold_two::<V, MAX>(lc, right));
    }
    let o = out.as_mut_ptr();
    if let Some((oh, ow, r0, c0)) = f.halving {
        for i in 0..oh {
            // The reduced rows above, at and below the centre row inside the plane, two
            // vectors across (lanes past the row are never kept). No closures in this
            // function: LLVM left such closures uninlined, their intrinsics as calls (the
            // strided max ran 4-7x slower than the row vectors).
            let r = r0 + 2 * i;
            let mut m = [fill; 2];
            for rr in [r.wrapping_sub(1), r, r + 1] {
                if rr < f.h {
                    for (v, m) in m.iter_mut().enumerate() {
                        *m = fold_two::<V, MAX>(*m, V::load(t.add(rr * w + v * n)));
                    }
                }
            }
            let (evens, odds) = V::evens_odds(m[0], m[1]);
            let centres = if c0 == 0 { evens } else { odds };
            V::store_first(o.add(i * ow), centres, ow);
        }
        return;
    }
    for (v, b) in f.bits.iter().enumerate() {
        let at = t.wrapping_add(v * n).cast_const();
        let up = V::load_masked(fill, V::bits(b[3]), at.wrapping_sub(w));
        let centre = V::load(at);
        let down = V::load_masked(fill, V::bits(b[4]), at.wrapping_add(w));
        let mut m = fold_two::<V, MAX>(fold_two::<V, MAX>(up, centre), down);
        if !MAX {
            m = V::div(m, V::load(f.divisors.as_ptr().add(v * n)));
        }
        match (v + 1) * n <= hw {
            true => V::store(o.add(v * n), m),
            false => V::store_first(o.add(v * n), m, hw - v * n),
        }
    }
}

/// `earlier` and `later` folded: the first maximum (`MAX`) or the sum.
///
/// # Safety
/// As [`plane`].
#[inline(always)]
unsafe fn fold_two<V: Lanes, const MAX: bool>(earlier: V, later: V) -> V {
    match MAX {
        true => V::max_first(earlier, later),
        false => V::add(earlier, later),
    }
}

crate::lanes::per_set! {
    /// [`plane`] compiled for each set's instructions.
    pub(super) trait Compiled {
        fn plane<const MAX: bool>(f: &Flat, xplane: &[f32], out: &mut [f32], across: &mut [f32]);
    }
}

/// One whole plane on the vectors of the kernels' set ([`plane`]).
///
/// # Safety
/// The CPU runs `V`'s instructions; `f` made for `V::N` lanes.
pub(super) unsafe fn pool_plane<V: Compiled>(
    f: &Flat,
    max: bool,
    xplane: &[f32],
    out: &mut [f32],
    across: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match max {
            true => V::plane::<true>(f, xplane, out, across),
            false => V::plane::<false>(f, xplane, out, across),
        }
    }
}
