//! Winograd F(2x2, 3x3)'s transforms (the variant of `conv_winograd.rs` for planes under 784
//! output pixels, where F(4x4, 3x3)'s 2.25x larger weights and thinner GEMMs lose): each 2x2
//! tile of output pixels comes from the 4x4 input patch under it, 16 transform points.
//!
//! Sits between the Winograd driver (`conv_winograd.rs`: blocks, GEMMs, epilogue) and the
//! CPU's vector units. The input rows a block reads are split into even and odd rows and
//! columns, so every transform step is one pass over the whole block. Coefficients are 0, +-1
//! and 1/2.

use super::{deinterleave, interleave, Tiles};
use crate::conv::cpu::padded_row;
use std::ops::Range;

/// Output pixels per tile side.
pub(super) const TILE: usize = 2;

/// Transform points per tile (4x4).
pub(super) const POINTS: usize = 16;

/// Padded input row length the tiles of one tile row read: `2 * tw + 2`.
fn wp(t: &Tiles) -> usize {
    2 * t.tw + 2
}

/// Temporary floats the transforms of a block of `rows` tile rows need.
pub(super) fn tmp_len(t: &Tiles, rows: usize) -> usize {
    16 * t.slots(rows) + 4 * wp(t)
}

crate::simd::kernel! {
    /// One output channel's 16 transformed weight rows (`uk`: `[p][c]`) from its `[c][3][3]`
    /// taps.
    pub(super) fn weights_of_channel(gk: &[f32], uk: &mut [f32]) {
        let c = gk.len() / 9;
        for (ci, g) in gk.chunks_exact(9).enumerate() {
            // tmp = G g (4 x 3), then U = tmp G^T (4 x 4).
            let mut tmp = [[0.0f32; 3]; 4];
            for j in 0..3 {
                let (g0, g1, g2) = (g[j], g[3 + j], g[6 + j]);
                tmp[0][j] = g0;
                tmp[1][j] = 0.5 * (g0 + g1 + g2);
                tmp[2][j] = 0.5 * (g0 - g1 + g2);
                tmp[3][j] = g2;
            }
            for (bi, r) in tmp.iter().enumerate() {
                let row = [r[0], 0.5 * (r[0] + r[1] + r[2]), 0.5 * (r[0] - r[1] + r[2]), r[2]];
                for (a, val) in row.into_iter().enumerate() {
                    uk[(bi * 4 + a) * c + ci] = val;
                }
            }
        }
    }
}

crate::simd::kernel! {
    /// One input channel's transformed tiles `dst` (`[p][slot]`) for tile rows `tys`: the
    /// zero-padded input rows they read, split into even and odd rows (tile row `r` reads
    /// even rows `r`, `r + 1` and odd rows `r`, `r + 1`), combined across rows (`B^T d`) for
    /// the whole block at once, then each combination split into even and odd columns and
    /// combined along the rows (`. B`).
    pub(super) fn input_channel(t: &Tiles, xp: &[f32], tys: Range<usize>, dst: &mut [f32], tmp: &mut [f32]) {
        let (wp, bt) = (wp(t), tys.len());
        let ts = t.slots(bt);
        let (ev, rest) = tmp.split_at_mut((bt + 1) * wp);
        let (od, rest) = rest.split_at_mut((bt + 1) * wp);
        let (comb, rest) = rest.split_at_mut(bt * wp);
        let (e, rest) = rest.split_at_mut(ts);
        let o = &mut rest[..ts];
        for (r, (er, or)) in ev.chunks_exact_mut(wp).zip(od.chunks_exact_mut(wp)).enumerate() {
            for (dy, pr) in [er, or].into_iter().enumerate() {
                padded_row(xp, (t.h, t.w, t.pl), (2 * (tys.start + r) + dy) as i64 - t.pt, pr);
            }
        }
        let n = bt * wp;
        let (e0, e1, o0, o1) = (&ev[..n], &ev[wp..], &od[..n], &od[wp..]);
        for bi in 0..4 {
            match bi {
                0 => zip2(comb, e0, e1, |a, b| a - b),
                1 => zip2(comb, o0, e1, |a, b| a + b),
                2 => zip2(comb, e1, o0, |a, b| a - b),
                _ => zip2(comb, o0, o1, |a, b| a - b),
            }
            deinterleave(comb, e, o);
            let l = ts - 1;
            let at = |a: usize| (bi * 4 + a) * ts;
            zip2(&mut dst[at(0)..at(0) + l], &e[..l], &e[1..], |a, b| a - b);
            zip2(&mut dst[at(1)..at(1) + l], &o[..l], &e[1..], |a, b| a + b);
            zip2(&mut dst[at(2)..at(2) + l], &e[1..], &o[..l], |a, b| a - b);
            zip2(&mut dst[at(3)..at(3) + l], &o[..l], &o[1..], |a, b| a - b);
            for a in 0..4 {
                dst[at(a) + l] = 0.0;
            }
        }
    }
}

/// `dst[i] = f(a[i], b[i])` over the shortest length (inlined into the kernels above).
#[inline(always)]
fn zip2(dst: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(*x, *y);
    }
}

crate::simd::kernel! {
    /// One output channel's rows `orow` (`op` holds exactly those rows) from its `mk`
    /// (`[p][slot]`, tile rows `tys`): `A^T m` across the transform's rows, then `. A` along
    /// them, for the whole block at once, the two values of each tile interleaved into a
    /// block of output rows that the rows in `orow` are copied from.
    pub(super) fn output_channel(t: &Tiles, mk: &[f32], tys: Range<usize>, orow: Range<usize>, op: &mut [f32], tmp: &mut [f32]) {
        let ts = t.slots(tys.len());
        let (s, rest) = tmp.split_at_mut(8 * ts);
        let (y0, rest) = rest.split_at_mut(2 * ts);
        let (y1, rest) = rest.split_at_mut(2 * ts);
        let (e, rest) = rest.split_at_mut(ts);
        let o = &mut rest[..ts];
        let m = |p: usize| &mk[p * ts..][..ts];
        // s[0][a] = m0a + m1a + m2a, s[1][a] = m1a - m2a - m3a.
        for a in 0..4 {
            let (s0, s1) = s[a * ts..].split_at_mut(4 * ts);
            for ((((d0, d1), x0), x1), (x2, x3)) in s0[..ts]
                .iter_mut()
                .zip(&mut s1[..ts])
                .zip(m(a))
                .zip(m(4 + a))
                .zip(m(8 + a).iter().zip(m(12 + a)))
            {
                *d0 = x0 + x1 + x2;
                *d1 = x1 - x2 - x3;
            }
        }
        for (half, y) in [&mut *y0, &mut *y1].into_iter().enumerate() {
            let sa = |a: usize| &s[(half * 4 + a) * ts..][..ts];
            for ((((ev, ov), v0), v1), (v2, v3)) in e
                .iter_mut()
                .zip(o.iter_mut())
                .zip(sa(0))
                .zip(sa(1))
                .zip(sa(2).iter().zip(sa(3)))
            {
                *ev = v0 + v1 + v2;
                *ov = v1 - v2 - v3;
            }
            interleave(e, o, y);
        }
        let yw = 2 * (t.tw + 1);
        for (li, ty) in tys.enumerate() {
            for (dy, y) in [&*y0, &*y1].into_iter().enumerate() {
                let r = 2 * ty + dy;
                if orow.contains(&r) {
                    op[(r - orow.start) * t.ow..][..t.ow].copy_from_slice(&y[li * yw..][..t.ow]);
                }
            }
        }
    }
}
