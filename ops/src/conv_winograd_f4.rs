//! Winograd F(4x4, 3x3)'s transforms (the variant of `conv_winograd.rs` for planes of 784
//! output pixels and more): each 4x4 tile of output pixels comes from the 6x6 input patch
//! under it, 36 transform points (Lavin and Gray's matrices, points 0, +-1, +-2, infinity).
//!
//! Sits between the Winograd driver (`conv_winograd.rs`: blocks, GEMMs, epilogue) and the
//! CPU's vector units. The input rows a block reads are split by row mod 4 and column mod 4
//! ("phases"), so that the six rows (columns) a tile reads are four phases at its own index
//! and two at the next: every transform step is one pass over the whole block.

use super::{deinterleave, interleave, rows_mut, Tiles};
use crate::conv::cpu::padded_row;
use std::ops::Range;

/// Output pixels per tile side.
pub(super) const TILE: usize = 4;

/// Transform points per tile (6x6).
pub(super) const POINTS: usize = 36;

/// Temporary floats the transforms of a block of `rows` tile rows need: the input's padded
/// rows, their halves and their 16 phase planes (`rows + 1` rows each), and 24 combinations of
/// the block; the output's 24 sums, 16 output rows, 4 values and 4 halves per slot.
pub(super) fn tmp_len(t: &Tiles, rows: usize) -> usize {
    let input = 48 * (rows + 1) * t.row_slots() + 24 * t.slots(rows);
    input.max(48 * t.slots(rows))
}

crate::simd::kernel! {
    /// One output channel's 36 transformed weight rows (`uk`: `[p][c]`) from its `[c][3][3]`
    /// taps: `U = G g G^T` with `G = [[1/4, 0, 0], [-1/6, -1/6, -1/6], [-1/6, 1/6, -1/6],
    /// [1/24, 1/12, 1/6], [1/24, -1/12, 1/6], [0, 0, 1]]`.
    pub(super) fn weights_of_channel(gk: &[f32], uk: &mut [f32]) {
        let c = gk.len() / 9;
        for (ci, g) in gk.chunks_exact(9).enumerate() {
            // tmp = G g (6 x 3), then U = tmp G^T (6 x 6).
            let cols = [0, 1, 2].map(|j| g_times([g[j], g[3 + j], g[6 + j]]));
            for i in 0..6 {
                let row = g_times([cols[0][i], cols[1][i], cols[2][i]]);
                for (a, val) in row.into_iter().enumerate() {
                    uk[(i * 6 + a) * c + ci] = val;
                }
            }
        }
    }
}

/// `G v` for one column `v` of 3 taps.
#[inline(always)]
fn g_times(v: [f32; 3]) -> [f32; 6] {
    let [a, b, c] = v;
    let (sixth, twelfth, twenty_fourth) = (1.0 / 6.0, 1.0 / 12.0, 1.0 / 24.0);
    [
        0.25 * a,
        -sixth * (a + b + c),
        -sixth * (a - b + c),
        twenty_fourth * a + twelfth * b + sixth * c,
        twenty_fourth * a - twelfth * b + sixth * c,
        c,
    ]
}

/// `B^T y` for six values `y`, `B^T = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0],
/// [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]`.
#[inline(always)]
fn bt_times(y: [f32; 6]) -> [f32; 6] {
    let [y0, y1, y2, y3, y4, y5] = y;
    let (a, b) = (y4 - 4.0 * y2, y3 - 4.0 * y1);
    let (c, d) = (y4 - y2, 2.0 * (y3 - y1));
    [
        4.0 * y0 - 5.0 * y2 + y4,
        a + b,
        a - b,
        c + d,
        c - d,
        4.0 * y1 - 5.0 * y3 + y5,
    ]
}

crate::simd::kernel! {
    /// One input channel's transformed tiles `dst` (`[p][slot]`) for tile rows `tys`. The
    /// zero-padded input rows they read are split by row mod 4 and, within a row, by column
    /// mod 4 (`ph[q][k][r][t]`: padded row `4 (tys.start + r) + k`, column `4 t + q`), so tile
    /// row `r` reads row phases 0-3 at `r` and 0-1 at `r + 1`, and tile `t` column phases 0-3
    /// at `t` and 0-1 at `t + 1`. `B^T d` across rows, for the whole block per column phase
    /// (`comb[i][q]`), then `. B` along columns, for the whole block per combination.
    pub(super) fn input_channel(t: &Tiles, xp: &[f32], tys: Range<usize>, dst: &mut [f32], tmp: &mut [f32]) {
        let (s, bt) = (t.row_slots(), tys.len());
        let ts = t.slots(bt);
        let plane = (bt + 1) * s;
        let (rows, rest) = tmp.split_at_mut(16 * plane);
        let (halves, rest) = rest.split_at_mut(16 * plane);
        let (ph, rest) = rest.split_at_mut(16 * plane);
        let comb = &mut rest[..24 * ts];
        // rows[k][r]: padded row 4 (tys.start + r) + k.
        for (kr, row) in rows.chunks_exact_mut(TILE * s).enumerate() {
            let (k, r) = (kr / (bt + 1), kr % (bt + 1));
            padded_row(xp, (t.h, t.w, t.pl), (TILE * (tys.start + r) + k) as i64 - t.pt, row);
        }
        // ph[q][k][r]: columns mod 4 of all rows at once, as two rounds of even/odd (pairs
        // vectorise; quads did not).
        let (e, o) = halves.split_at_mut(8 * plane);
        deinterleave(rows, e, o);
        let [p0, p1, p2, p3] = rows_mut(ph, 4 * plane, 4 * plane);
        deinterleave(e, p0, p2);
        deinterleave(o, p1, p3);
        // comb[i][q][slot] = (B^T d)[i] over the rows of column phase q.
        for q in 0..TILE {
            let d = |k: usize, r: usize| &ph[(q * TILE + k) * plane + r * s..][..ts];
            let (d0, d1, d2, d3, d4, d5) = (d(0, 0), d(1, 0), d(2, 0), d(3, 0), d(0, 1), d(1, 1));
            let [o0, o1, o2, o3, o4, o5] = rows_mut(&mut comb[q * ts..], TILE * ts, ts);
            for i in 0..ts {
                let v = bt_times([d0[i], d1[i], d2[i], d3[i], d4[i], d5[i]]);
                (o0[i], o1[i], o2[i], o3[i], o4[i], o5[i]) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            }
        }
        // dst[6 i + a][slot] = (comb[i] B)[a]: tile t reads column phases 0-3 at t, 0-1 at t + 1.
        let l = ts - 1;
        for i in 0..6 {
            let cq = |q: usize| &comb[(i * TILE + q) * ts..][..ts];
            let (y0, y1, y2, y3) = (cq(0), cq(1), cq(2), cq(3));
            let [o0, o1, o2, o3, o4, o5] = rows_mut(&mut dst[i * 6 * ts..], ts, ts);
            for j in 0..l {
                let v = bt_times([y0[j], y1[j], y2[j], y3[j], y0[j + 1], y1[j + 1]]);
                (o0[j], o1[j], o2[j], o3[j], o4[j], o5[j]) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            }
            for o in [o0, o1, o2, o3, o4, o5] {
                o[l] = 0.0;
            }
        }
    }
}

/// `A^T m` for six values `m`, `A^T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0],
/// [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]`.
#[inline(always)]
fn at_times(m: [f32; 6]) -> [f32; 4] {
    let [m0, m1, m2, m3, m4, m5] = m;
    let (p, q, r, u) = (m1 + m2, m1 - m2, m3 + m4, m3 - m4);
    [m0 + p + r, q + 2.0 * u, p + 4.0 * r, q + 8.0 * u + m5]
}

/// `out[.][i] = A^T (m[.][i])` for every slot `i` (all slices cut to one length first, so the
/// loop has no bounds checks and vectorises).
#[inline(always)]
fn at_rows(m: [&[f32]; 6], out: [&mut [f32]; 4]) {
    let [o0, o1, o2, o3] = out;
    let n = o0.len();
    let (o1, o2, o3) = (&mut o1[..n], &mut o2[..n], &mut o3[..n]);
    let [m0, m1, m2, m3, m4, m5] = m.map(|r| &r[..n]);
    for i in 0..n {
        let v = at_times([m0[i], m1[i], m2[i], m3[i], m4[i], m5[i]]);
        (o0[i], o1[i], o2[i], o3[i]) = (v[0], v[1], v[2], v[3]);
    }
}

crate::simd::kernel! {
    /// One output channel's rows `orow` (`op` holds exactly those rows) from its `mk`
    /// (`[p][slot]`, tile rows `tys`): `A^T m` across the transform's rows (`s[a][j]`), then
    /// `. A` along them, for the whole block at once, the four values of each tile interleaved
    /// into four blocks of output rows (row mod 4) that the rows in `orow` are copied from.
    pub(super) fn output_channel(t: &Tiles, mk: &[f32], tys: Range<usize>, orow: Range<usize>, op: &mut [f32], tmp: &mut [f32]) {
        let ts = t.slots(tys.len());
        let (s, rest) = tmp.split_at_mut(24 * ts);
        let (y, rest) = rest.split_at_mut(16 * ts);
        let (vb, rest) = rest.split_at_mut(4 * ts);
        let halves = &mut rest[..4 * ts];
        let m = |p: usize| &mk[p * ts..][..ts];
        for j in 0..6 {
            let col = [0, 6, 12, 18, 24, 30].map(|i| m(i + j));
            at_rows(col, rows_mut(&mut s[j * ts..], 6 * ts, ts));
        }
        for (a, ya) in y.chunks_exact_mut(4 * ts).enumerate() {
            let row = [0, 1, 2, 3, 4, 5].map(|j| &s[(a * 6 + j) * ts..][..ts]);
            at_rows(row, rows_mut(vb, ts, ts));
            let [b0, b1, b2, b3] = rows_mut(vb, ts, ts);
            // Columns 4 t + b as two rounds of pairs (pairs vectorise; quads did not).
            let (e, o) = halves.split_at_mut(2 * ts);
            interleave(b0, b2, e);
            interleave(b1, b3, o);
            interleave(e, o, ya);
        }
        let yw = TILE * t.row_slots();
        for (li, ty) in tys.enumerate() {
            for (a, ya) in y.chunks_exact(4 * ts).enumerate() {
                let r = TILE * ty + a;
                if orow.contains(&r) {
                    op[(r - orow.start) * t.ow..][..t.ow].copy_from_slice(&ya[li * yw..][..t.ow]);
                }
            }
        }
    }
}
