//! Depthwise convs of a 3x3 or 5x5 window, stride 1, padded to keep the plane's size (K / 2
//! on every side), on AVX-512 and AVX2: each output plane straight from its input plane, read
//! in place. With that geometry output `(i, j)` sits where input `(i, j)` does, so a plane is
//! one run of flat positions and tap `(di, dj)` is one constant offset from every output:
//! `(di - K / 2) * w + dj - K / 2`. Vectors of outputs (16 or 8, crossing row ends) go four
//! at a time, their sums independent chains. Where those four, a vector either side and their
//! tap rows lie in the plane, each tap row is loaded once and the taps across are shifts of
//! two neighbouring vectors; elsewhere (a plane's first and last rows, most of a small plane)
//! each tap is one masked load, on AVX-512 with no branch on its mask
//! (`lanes::load_lanes_unbranched`). Either way the lanes whose tap falls outside the plane
//! (above, below, or past either end of its row) are zero, from masks made once per call, and
//! the taps are summed in row-major order as the phase planes do (`bias + w0 * x0`, then `+ wt
//! * xt`, a pad's tap reading 0): the same bits.
//!
//! Stride 2 (pads up to K / 2) reads in place too, row by row (`conv_depthwise_strided.rs`).
//!
//! The phase planes (`conv_planes.rs`, which other depthwise convs and CPUs without AVX2 keep)
//! fill a padded copy of each plane, copy the rows in, sum into scratch and copy the outputs
//! out: on shufflenet's 14x14 and 7x7 planes most of their time.
//!
//! Sits between `conv_cpu::direct_path` (which routes the convs [`applies`] to here) and the
//! CPU's vector units (`lanes.rs`).

use super::{epilogue, Epilogue, Geom2};
#[path = "conv_depthwise_strided.rs"]
mod strided;
use crate::lanes::{load_lanes_unbranched, Avx2, Avx512, Lanes};
use crate::shape::rows_by_block;
use crate::simd::Level;
use std::ops::Range;
use strided::Compiled as _;

/// Whether `TANDEM_CONV_DEPTHWISE=0` turned this path off (read once).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CONV_DEPTHWISE").as_deref() != Ok("0"))
}

/// Whether [`plane_path`] computes `g` (a `cg == 1` conv): a 3x3 or 5x5 window of stride 1,
/// undilated, with K / 2 pads on every side (so the output plane is the input's size), or
/// of stride 2 (`conv_depthwise_strided.rs`), on a CPU whose kernels run AVX-512, or AVX2 at
/// full width (Zen 1 cores run the phase planes faster: 0.55-0.8x of the time on 7 of 8
/// shufflenet- and mobilenet-like shapes, even with plain loads inside the plane), unless
/// `TANDEM_CONV_DEPTHWISE=0`.
pub(super) fn applies(g: &Geom2) -> bool {
    let level = crate::simd::level();
    (level == Level::Avx512 || level == Level::Avx2 && !crate::simd::avx2_half_width())
        && enabled()
        && (same_size(g) || strided::applies(g))
}

/// A 3x3 or 5x5 window of stride 1, undilated, with K / 2 pads on every side.
fn same_size(g: &Geom2) -> bool {
    let k = g.kh;
    (k == 3 || k == 5)
        && g.kw == k
        && (g.sh, g.sw, g.dh, g.dw) == (1, 1, 1, 1)
        && g.pt == (k / 2) as i64
        && g.pl == (k / 2) as i64
        && (g.oh, g.ow) == (g.h, g.w)
        && g.w > 0
}

/// Output lines `rows` (`(n, oc, oh)` flattened) of a conv that [`applies`] into `out` (the
/// whole output), `ep` applied to each plane's block.
pub(super) fn plane_path(
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&[f32], Option<&[f32]>, Epilogue),
    out: &mut [f32],
    rows: Range<usize>,
) {
    let ow = g.ow;
    let pieces = rows_by_block(&mut out[rows.start * ow..rows.end * ow], rows, g.oh, ow);
    // Read here: a level forced in tests holds on this thread only.
    let level = crate::simd::level();
    let (k, lanes) = (g.kh, level.f32_lanes());
    if !same_size(g) {
        let (pt, pl) = (g.pt as usize, g.pl as usize);
        let masks = strided::column_masks(k, (g.w, ow, pl), lanes);
        let geometry = (pt, pl, ow);
        return crate::parallel::for_each_item(pieces, |(p, lines, dst)| {
            let plane = Plane::of(g, x, (w, b), p);
            // SAFETY: `applies` checked the level's instructions and the geometry.
            unsafe {
                match (level, k) {
                    (Level::Avx512, 3) => Avx512::rows::<3>(&plane, geometry, lines, dst, &masks),
                    (Level::Avx512, _) => Avx512::rows::<5>(&plane, geometry, lines, dst, &masks),
                    (_, 3) => Avx2::rows::<3>(&plane, geometry, lines, dst, &masks),
                    _ => Avx2::rows::<5>(&plane, geometry, lines, dst, &masks),
                }
            }
            epilogue(dst, None, None, ep);
        });
    }
    let whole = tap_masks(k, (g.h, g.w), lanes, 0..g.oh);
    crate::parallel::for_each_item(pieces, |(p, lines, dst)| {
        let plane = Plane::of(g, x, (w, b), p);
        let part;
        let masks = match lines == (0..g.oh) {
            true => &whole,
            false => {
                part = tap_masks(k, (g.h, g.w), lanes, lines.clone());
                &part
            }
        };
        let first = lines.start * g.w;
        // SAFETY: `applies` checked the level's instructions and the geometry.
        unsafe {
            match (level, k) {
                (Level::Avx512, 3) => Avx512::block::<3>(&plane, first, dst, masks),
                (Level::Avx512, _) => Avx512::block::<5>(&plane, first, dst, masks),
                (_, 3) => Avx2::block::<3>(&plane, first, dst, masks),
                _ => Avx2::block::<5>(&plane, first, dst, masks),
            }
        }
        epilogue(dst, None, None, ep);
    });
}

/// One input plane (`h x w`) and its output channel's weights (K x K, row-major) and bias.
struct Plane<'a> {
    x: &'a [f32],
    h: usize,
    w: usize,
    taps: &'a [f32],
    bias: f32,
}

impl<'a> Plane<'a> {
    /// Output plane `p` (`(n, oc)` flattened) of conv `g` from `x`, weights and bias.
    fn of(g: &Geom2, x: &'a [f32], (w, b): (&'a [f32], Option<&[f32]>), p: usize) -> Self {
        let (n, oc, size, taps) = (p / g.m, p % g.m, g.h * g.w, g.kh * g.kw);
        Plane {
            x: &x[(n * g.c + oc / g.mg) * size..][..size],
            h: g.h,
            w: g.w,
            taps: &w[oc * taps..][..taps],
            bias: b.map_or(0.0, |b| b[oc]),
        }
    }

    /// Each weight and the bias as vectors of `V` (weights past K x K zero).
    ///
    /// # Safety
    /// `V`'s instructions present.
    #[inline(always)]
    unsafe fn splat<V: Lanes>(&self) -> ([V; 25], V) {
        let mut weights = [V::splat(0.0); 25];
        for (v, &t) in weights.iter_mut().zip(self.taps) {
            *v = V::splat(t);
        }
        (weights, V::splat(self.bias))
    }
}

/// Per vector of the outputs of rows `lines` of an `h x w` plane (`lanes` each, the last
/// group of [`GROUP`] filled with empty vectors), per tap `(d, a)` (row-major): the lanes
/// (bits) whose output lies in `lines` and whose tap lies in the plane, above or below
/// (`d - K / 2` rows) and along the output's row (`a - K / 2` columns). The same for every
/// plane: once per call, or per block that is not a whole plane.
fn tap_masks(k: usize, (h, w): (usize, usize), lanes: usize, lines: Range<usize>) -> Vec<u32> {
    let half = k / 2;
    let (first, end, size) = (lines.start * w, lines.end * w, h * w);
    let vectors = (end - first).div_ceil(lanes).next_multiple_of(GROUP);
    let mut masks = Vec::with_capacity(vectors * k * k);
    for v in 0..vectors {
        let at = first + v * lanes;
        // Lanes whose tap `a` stays in the lane's row.
        let mut across = [0u32; 5];
        let mut col = at % w;
        for lane in 0..lanes {
            for (a, across) in across.iter_mut().enumerate().take(k) {
                let tap = col + a;
                *across |= ((half..w + half).contains(&tap) as u32) << lane;
            }
            col = if col + 1 == w { 0 } else { col + 1 };
        }
        for d in 0..k {
            // Lanes whose tap row, `shift` positions on, lies in the plane, in the block.
            let shift = (d as isize - half as isize) * w as isize;
            let lo = (-shift - at as isize).clamp(0, lanes as isize);
            let hi =
                ((size as isize - shift).min(end as isize) - at as isize).clamp(lo, lanes as isize);
            let rows = ((1u64 << hi) - (1u64 << lo)) as u32;
            masks.extend(across[..k].iter().map(|&across| rows & across));
        }
    }
    masks
}

/// Vectors summed side by side: each output's taps are a chain of dependent adds.
const GROUP: usize = 4;

/// The outputs from flat position `first` of one plane into `dst`, `V::N` at a time, each
/// tap's lanes `masks` keeps ([`tap_masks`] for the block and `V::N` lanes) read, 0 for the
/// rest.
///
/// # Safety
/// `V`'s instructions present (inlined into its `#[target_feature]` function).
#[inline(always)]
unsafe fn block<V: Lanes, const K: usize>(p: &Plane, first: usize, dst: &mut [f32], masks: &[u32]) {
    let (n, w, half) = (V::N, p.w, K / 2);
    assert!(
        p.x.len() == p.h * w && p.taps.len() == K * K,
        "depthwise: plane"
    );
    assert!(masks.len() * n >= dst.len() * K * K, "depthwise: tap masks");
    let (weights, bias) = p.splat::<V>();
    let x = p.x.as_ptr();
    let out = dst.as_mut_ptr();
    // A group reads in place and masks only across where its vectors, one either side and
    // all their taps' rows lie in the plane, and its vectors in the block.
    let (size, reach, end) = (p.h * w, half * w + n, first + dst.len());
    for (i, masks) in masks.chunks_exact(GROUP * K * K).enumerate() {
        let q = first + i * GROUP * n;
        let acc = match q >= reach && q + GROUP * n + reach <= size && q + GROUP * n <= end {
            true => sum_inside::<V, K>(x, (q, w), &weights, bias, masks),
            false => sum_masked::<V, K>(p.x, (q, w), &weights, bias, masks),
        };
        let at = q - first;
        if at + GROUP * n <= dst.len() {
            for (g, &sum) in acc.iter().enumerate() {
                V::store(out.add(at + g * n), sum);
            }
        } else {
            for (g, &sum) in acc.iter().enumerate() {
                let at = at + g * n;
                let room = dst.len().saturating_sub(at).min(n);
                V::store_first(out.wrapping_add(at), sum, room);
            }
        }
    }
}

/// The sums of [`GROUP`] vectors from position `q` of a plane of rows of `w` at `x`, each
/// tap's lanes `masks` keeps read in place, 0 for the rest.
///
/// # Safety
/// `V`'s instructions present; the lanes `masks` keeps lie in the plane.
#[inline(always)]
unsafe fn sum_masked<V: Lanes, const K: usize>(
    x: &[f32],
    (q, w): (usize, usize),
    weights: &[V; 25],
    bias: V,
    masks: &[u32],
) -> [V; GROUP] {
    let half = K / 2;
    let mut acc = [bias; GROUP];
    for t in 0..K * K {
        let (d, a) = (t / K, t % K);
        let offset = (d as isize - half as isize) * w as isize + a as isize - half as isize;
        for (g, acc) in acc.iter_mut().enumerate() {
            let at = (q + g * V::N) as isize + offset;
            // SAFETY: only the lanes in the plane are read.
            let xv = load_lanes_unbranched(V::splat(0.0), masks[g * K * K + t], x, at);
            *acc = V::add(*acc, V::mul(weights[t], xv));
        }
    }
    acc
}

/// [`sum_masked`] for a group whose vectors, one either side and all their taps' rows lie in
/// the plane: per tap row, the vectors are loaded once (with one either side) and each tap
/// across is a shift of two neighbours, its lanes that leave their row 0 (the masks of the
/// group's centre tap row).
///
/// # Safety
/// `V`'s instructions present; those vectors lie in the plane.
#[inline(always)]
unsafe fn sum_inside<V: Lanes, const K: usize>(
    x: *const f32,
    (q, w): (usize, usize),
    weights: &[V; 25],
    bias: V,
    masks: &[u32],
) -> [V; GROUP] {
    let (n, half) = (V::N, K / 2);
    let mut acc = [bias; GROUP];
    for d in 0..K {
        // The vector before the group's first, `d - K / 2` rows on.
        let row = x.add(q + d * w - half * w - n);
        let mut v = [bias; GROUP + 2];
        for (g, v) in v.iter_mut().enumerate() {
            *v = V::load(row.add(g * n));
        }
        for a in 0..K {
            let t = d * K + a;
            for (g, acc) in acc.iter_mut().enumerate() {
                let mask = V::bits(masks[g * K * K + half * K + a]);
                let xv = if a < half {
                    V::across(v[g], v[g + 1], n - (half - a), mask)
                } else if a > half {
                    V::across(v[g + 1], v[g + 2], a - half, mask)
                } else {
                    v[g + 1]
                };
                *acc = V::add(*acc, V::mul(weights[t], xv));
            }
        }
    }
    acc
}

crate::lanes::per_set! {
    /// [`block`] compiled for each set's instructions.
    trait Compiled {
        fn block<const K: usize>(p: &Plane, first: usize, dst: &mut [f32], masks: &[u32]);
    }
}
