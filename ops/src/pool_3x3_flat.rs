//! MaxPool and AveragePool 3x3 of stride 1 that keep a small plane's size (pads of 1 on
//! every side: inception's branch pools on 28x28 to 7x7 planes), a whole plane as one run of
//! vectors: a vector holds consecutive pixels across rows. The across pass folds each pixel
//! with its left and right neighbours, the lanes of the first and last column masked to the
//! fold's identity; the down pass folds each reduced pixel with those a row above and below,
//! the lanes of the first and last row masked alike (an average then divides by its window's
//! positions). The masks repeat for every plane and are made once per call ([`Flat`]).
//! MaxPools of stride 2 on such planes whose windows are all centred inside them (inception's
//! 320 x 28 x 28 and 576 x 14 x 14, squeezenet's 256 x 27 x 27) go row by row instead, in
//! registers: each input row is loaded once as two vectors, folded with its neighbours
//! shifted in by a lane, and each output row folds the three rows around its centre row and
//! keeps the centre columns (every other lane), the row below carried to the next output
//! row. The flat across pass through a scratch plane had taken 1.27-1.38x the time (AMD Zen 5,
//! squeezenet's 256 x 27 x 27 alone, a run short enough for one thread: 28-30 -> 21-22 us; in
//! the model, two threads, 19-20 -> 16 us; inception_v1's 14 x 14 and 28 x 28 ones 0.035-0.036
//! -> 0.027-0.028 ms; docs/bench.md, "halving flat MaxPools in registers").
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
    /// `[inside, left, right, up, down]` per vector (none for a halving pool).
    bits: Vec<[u32; 5]>,
    /// Stride 2: per vector of a row (columns `0..n`, `n..2n`), the lanes inside the row.
    row_bits: [u32; 2],
    divisors: Vec<f32>,
}

impl Flat {
    /// The masks of `g`'s planes for vectors of `n` lanes, and an average's divisors from its
    /// window positions down (per output row) and across (per output column), as
    /// `pool_3x3.rs` counts them.
    pub(super) fn of(g: &Geo, n: usize, average: Option<(&[f32], &[f32])>) -> Flat {
        let (h, w) = (g.ind[1], g.ind[2]);
        let hw = h * w;
        let halving = (g.s[1] == 2).then(|| {
            assert!(g.outd[2] <= n, "pool 3x3 flat: {} outputs a row", g.outd[2]);
            let centre = |a: usize| 1 - g.pb[a];
            (g.outd[1], g.outd[2], centre(1), centre(2))
        });
        // A halving pool reads rows in registers ([`halving`]): no flat vectors, no scratch.
        let vecs = if halving.is_some() { 0 } else { hw.div_ceil(n) };
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
        let row_bits = [0, n].map(|from| crate::lanes::row_lane_bits(from as isize, w, n));
        Flat {
            h,
            w,
            halving,
            bits,
            row_bits,
            divisors,
        }
    }

    /// Floats of a plane's reduced-across scratch: its whole vectors (none for a halving
    /// pool, which keeps its rows in registers).
    pub(super) fn scratch_len(&self, n: usize) -> usize {
        self.bits.len() * n
    }

    /// Output floats of a plane.
    fn out_len(&self) -> usize {
        self.halving
            .map_or(self.h * self.w, |(oh, ow, _, _)| oh * ow)
    }
}

/// One plane `xplane` (`h x w`) pooled into `out` (`h x w`, or the strided output plane):
/// maxima (`MAX`) or averages, through `across` ([`Flat::scratch_len`] floats); a strided
/// max through [`halving`] instead, in registers.
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
    let o = out.as_mut_ptr();
    if let Some((oh, ow, r0, c0)) = f.halving {
        return halving::<V, MAX>(f, x, o, (oh, ow, r0, c0));
    }
    // Masked lanes are never read: the pointers may point before or past the slices.
    for (v, b) in f.bits.iter().enumerate() {
        let at = x.wrapping_add(v * n);
        let left = V::load_masked(fill, V::bits(b[1]), at.wrapping_sub(1));
        let centre = V::load_masked(fill, V::bits(b[0]), at);
        let right = V::load_masked(fill, V::bits(b[2]), at.wrapping_add(1));
        let lc = fold_two::<V, MAX>(left, centre);
        V::store(t.add(v * n), fold_two::<V, MAX>(lc, right));
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

/// A strided max's output plane at `o` (`oh x ow`) from the plane at `x`: per output row, the
/// input rows above, at and below its windows' centre row `r0 + 2i`, each folded across in
/// registers (two vectors of columns, [`across_row`]), folded down in that order; the row
/// below is the next output row's row above and is kept. The every other lane from column
/// `c0` (the windows' centres) is stored, a whole vector where it stays inside the plane:
/// the lanes past the row land on the rows after it, which overwrite them (the masked store
/// of each row had taken 1.1x the time). No closures here: LLVM left them uninlined, their
/// intrinsics as calls (a `[0, 1].map` over the two vectors ran 6x slower).
///
/// # Safety
/// As [`plane`]; `f.halving` is `Some`.
#[inline(always)]
unsafe fn halving<V: Lanes, const MAX: bool>(
    f: &Flat,
    x: *const f32,
    o: *mut f32,
    (oh, ow, r0, c0): (usize, usize, usize, usize),
) {
    let fill = V::splat(f32::NEG_INFINITY);
    let mut above = match r0 {
        0 => None,
        _ => Some(across_row::<V, MAX>(f, x, r0 - 1)),
    };
    for i in 0..oh {
        let r = r0 + 2 * i;
        let centre = across_row::<V, MAX>(f, x, r);
        let below = match r + 1 < f.h {
            true => Some(across_row::<V, MAX>(f, x, r + 1)),
            false => None,
        };
        let mut m = [fill; 2];
        for (v, m) in m.iter_mut().enumerate() {
            if let Some(a) = above {
                *m = fold_two::<V, MAX>(*m, a[v]);
            }
            *m = fold_two::<V, MAX>(*m, centre[v]);
            if let Some(b) = below {
                *m = fold_two::<V, MAX>(*m, b[v]);
            }
        }
        let (evens, odds) = V::evens_odds(m[0], m[1]);
        let centres = if c0 == 0 { evens } else { odds };
        match i * ow + V::N <= oh * ow {
            true => V::store(o.add(i * ow), centres),
            false => V::store_first(o.add(i * ow), centres, ow),
        }
        above = below;
    }
}

/// Row `r` of the plane at `x`, each column folded with its left and right neighbours (in
/// that order: left, centre, right), two vectors across: the row loaded once, lanes outside
/// it -inf, the neighbours shifted in by a lane (a masked load at each of the three offsets
/// took 1.1x the time).
///
/// # Safety
/// As [`halving`]; `r` a row of the plane.
#[inline(always)]
unsafe fn across_row<V: Lanes, const MAX: bool>(f: &Flat, x: *const f32, r: usize) -> [V; 2] {
    let (n, fill) = (V::N, V::splat(f32::NEG_INFINITY));
    let every = V::bits(crate::lanes::lane_bits(0..n));
    let at = x.wrapping_add(r * f.w);
    let c0 = V::load_masked(fill, V::bits(f.row_bits[0]), at);
    let c1 = V::load_masked(fill, V::bits(f.row_bits[1]), at.wrapping_add(n));
    // Each column's left neighbour is lane n - 1 on of the vector pair before it, its right
    // one lane 1 on.
    let left = [
        V::across(fill, c0, n - 1, every),
        V::across(c0, c1, n - 1, every),
    ];
    let right = [V::across(c0, c1, 1, every), V::across(c1, fill, 1, every)];
    [
        fold_two::<V, MAX>(fold_two::<V, MAX>(left[0], c0), right[0]),
        fold_two::<V, MAX>(fold_two::<V, MAX>(left[1], c1), right[1]),
    ]
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
