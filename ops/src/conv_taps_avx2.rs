//! The taps kernel on AVX2 and FMA: `conv_taps.rs`'s [`tile`](super::tile) where the CPU has
//! no AVX-512, from the same blocks of weights into the same `MR x NP` block of outputs.
//!
//! Sixteen 8-lane registers cannot hold the AVX-512 kernel's 8 x 3 accumulators, so the block
//! runs as micro-tiles of [`ROWS`] output channels x [`NV`] vectors of 8 positions: 12
//! accumulators, the 2 broadcast weights of a (channel, tap) step and one vector of input at
//! a time, 15 registers (4 x 3 needed all 16 and kept a sum on the stack; 4 x 2's 8 sums ran
//! slower: docs/bench.md, "The taps kernel on AVX2"). Each micro-tile reads its weights at the
//! block's stride `MR`, so the layout of W stays the one [`pack_weights`](super::pack_weights)
//! makes for both kernels. Loads are plain except the one vector of the last micro-tile that
//! runs past `positions`, which is masked (the pointwise path reads X in place, with nothing
//! past its end; a masked load took about 18 cycles on a Zen 1 core). Stores are plain where a
//! vector's 8 positions land in one output row; the others
//! (row ends, gaps, a block's last columns) go lane by lane from a copy on the stack, as AMD
//! cores take a dozen cycles per masked store.
//!
//! Sits between `conv_taps.rs`'s [`tile`](super::tile) and the CPU's vector units.

use super::{RowGaps, TileOut, MR, NP};
use crate::lanes::store_first_avx2;
use std::arch::x86_64::*;

/// Output channels per micro-tile (a quarter of the block's `MR`).
const ROWS: usize = 2;
/// Vectors of 8 positions per micro-tile.
const NV: usize = 6;
/// Positions per micro-tile.
const PART: usize = 8 * NV;

/// As [`avx512::tile`](super::avx512::tile): `MR x NP` outputs
/// `out[i][j] = sum_{c, t} wb[c][t][i] x[c plane + offs[t] + j]`, the first `to.rows` rows
/// and `to.positions` columns stored at stride `to.ld`, columns in the gaps skipped.
///
/// # Safety
/// AVX2 and FMA present; `x` readable at `c plane + offs[t] + j` for every `c`, `t`,
/// `j < positions.min(NP)`; `wb` holds `c x taps` steps of `MR` weights; `out` writable where
/// [`avx512::tile`](super::avx512::tile) says; a bias readable at `i < rows.min(MR)`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const ONE: bool>(
    x: *const f32,
    plane: usize,
    c: usize,
    offs: &[usize],
    wb: &[f32],
    out: *mut f32,
    to: TileOut,
) {
    // One tap at offset 0 (`ONE`, a 1x1 conv) spares the loop over taps.
    let offs = if ONE { &[0][..] } else { offs };
    let positions = to.positions.min(NP);
    assert!(
        wb.len() >= c * offs.len() * MR,
        "taps (avx2): weight block too short"
    );
    for p0 in (0..positions).step_by(PART) {
        let n = (positions - p0).min(PART);
        for r0 in (0..to.rows.min(MR)).step_by(ROWS) {
            let mut acc = [[_mm256_setzero_ps(); NV]; ROWS];
            if let Some(b) = to.bias {
                for (i, acc) in acc.iter_mut().enumerate() {
                    if r0 + i < to.rows {
                        *acc = [_mm256_set1_ps(*b.add(r0 + i)); NV];
                    }
                }
            }
            let (xs, w) = (x.add(p0), wb.as_ptr().add(r0));
            let acc = match n == PART {
                true => sums::<true>(acc, xs, (plane, c, offs), w, n),
                false => sums::<false>(acc, xs, (plane, c, offs), w, n),
            };
            store(&acc, (r0, p0, n), out, to);
        }
    }
}

/// `acc[i][j]` plus `w[step MR + i] x[c plane + offs[t] + j]` over the steps `(c, t)` (`j` in
/// vectors of 8), reading the first `n` positions: all of them plainly where `FULL`, else
/// masked. By value in and out: through a `&mut`, LLVM stored every sum back to the stack
/// after each FMA.
///
/// # Safety
/// As [`tile`], `w` at the micro-tile's first row.
#[inline(always)]
unsafe fn sums<const FULL: bool>(
    mut acc: [[__m256; NV]; ROWS],
    x: *const f32,
    (plane, c, offs): (usize, usize, &[usize]),
    w: *const f32,
    n: usize,
) -> [[__m256; NV]; ROWS] {
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut masks = [_mm256_setzero_si256(); NV];
    for (v, m) in masks.iter_mut().enumerate() {
        *m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32 - 8 * v as i32), lane);
    }
    let mut wp = w;
    for ci in 0..c {
        let xc = x.add(ci * plane);
        for &o in offs {
            let xs = xc.add(o);
            let mut wv = [_mm256_setzero_ps(); ROWS];
            for (i, wv) in wv.iter_mut().enumerate() {
                *wv = _mm256_broadcast_ss(&*wp.add(i));
            }
            // One vector of X at a time: 12 sums, the row weights and it fill 15 registers.
            for (v, &mask) in masks.iter().enumerate() {
                // Masked only where the vector runs past `n` (module docs).
                let xv = match FULL || 8 * v + 8 <= n {
                    true => _mm256_loadu_ps(xs.add(8 * v)),
                    false => _mm256_maskload_ps(xs.add(8 * v), mask),
                };
                for (acc, &wv) in acc.iter_mut().zip(&wv) {
                    acc[v] = _mm256_fmadd_ps(wv, xv, acc[v]);
                }
            }
            wp = wp.add(MR);
        }
    }
    acc
}

/// Stores rows `r0..` (those below `to.rows`) of a micro-tile's sums at tile positions
/// `p0..p0 + n`, Relu'd where `to.relu`: a vector whose 8 positions land in one output row
/// plainly, the others lane by lane.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn store(
    acc: &[[__m256; NV]; ROWS],
    (r0, p0, n): (usize, usize, usize),
    out: *mut f32,
    to: TileOut,
) {
    let zero = _mm256_setzero_ps();
    for (i, acc) in acc.iter().enumerate() {
        if r0 + i >= to.rows {
            break;
        }
        let row = out.add((r0 + i) * to.ld);
        for (v, &a) in acc.iter().enumerate() {
            let q = p0 + 8 * v;
            let lanes = (p0 + n).saturating_sub(q).min(8);
            if lanes == 0 {
                break;
            }
            // Zero's the first operand: a NaN sum stays NaN, as `Activation::Relu`.
            let a = if to.relu { _mm256_max_ps(zero, a) } else { a };
            match to.gaps {
                None if lanes == 8 => _mm256_storeu_ps(row.add(q), a),
                None => store_first_avx2(row.add(q), a, lanes),
                Some(RowGaps { wp, ow, at }) => {
                    // Line position `r wp + col` goes to `r ow + col` where `col < ow`.
                    let lo = at + q;
                    let (mut r, mut col) = (lo / wp, lo % wp);
                    if lanes == 8 && col + 8 <= ow {
                        _mm256_storeu_ps(row.add(r * ow + col), a);
                        continue;
                    }
                    let mut copy = [0.0f32; 8];
                    _mm256_storeu_ps(copy.as_mut_ptr(), a);
                    for &y in &copy[..lanes] {
                        if col < ow {
                            *row.add(r * ow + col) = y;
                        }
                        col += 1;
                        if col == wp {
                            (r, col) = (r + 1, 0);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{RowGaps, TileOut, MR, NP};
    use super::tile;

    /// A fixed pseudo-random sequence in [-1, 1).
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The kernel against the definition on every CPU with AVX2 (AVX-512 ones too, whose conv
    /// paths take the AVX-512 kernel): part-filled blocks of rows and of positions (vectors
    /// cut mid-way, the masked loads), one tap and several, with and without a bias and Relu,
    /// stores with row gaps from several line positions (vectors across one, two and three
    /// rows) and without. Outputs it must not write keep their sentinel.
    #[test]
    fn avx2_tile_matches_definition() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        let (c, plane) = (3, 4 * NP + 64);
        let x = values(c * plane, 1);
        let bias = values(MR, 2);
        let sentinel = -7.5f32;
        let tap_sets: [&[usize]; 2] = [&[0], &[0, 1, 2, 9, 10, 11, 18, 19, 20]];
        let gap_sets = [
            None,
            Some(RowGaps {
                wp: 11,
                ow: 9,
                at: 0,
            }),
            Some(RowGaps {
                wp: 11,
                ow: 9,
                at: 7,
            }),
            Some(RowGaps {
                wp: 57,
                ow: 55,
                at: 110,
            }),
            Some(RowGaps {
                wp: 8,
                ow: 6,
                at: 13,
            }),
        ];
        let mut checked = 0;
        for (k, offs) in tap_sets.into_iter().enumerate() {
            let wb = values(c * offs.len() * MR, 3 + k as u64);
            for gaps in gap_sets {
                for (rows, positions) in [(8, NP), (5, NP), (8, 37), (3, 8), (1, 1), (4, 24)] {
                    for (with_bias, relu) in [(true, true), (false, false), (true, false)] {
                        let ld = 4 * NP;
                        let mut out = vec![sentinel; MR * ld];
                        let to = TileOut {
                            ld,
                            rows,
                            positions,
                            bias: with_bias.then_some(bias.as_ptr()),
                            relu,
                            gaps,
                            fetch: false,
                        };
                        // SAFETY: AVX2 and FMA checked above; `x` holds `c` planes of
                        // `plane` floats, more than the largest offset plus `NP`; `out` holds
                        // `MR` rows of `ld`, more than any gap's stored column; the bias `MR`.
                        unsafe {
                            let o = out.as_mut_ptr();
                            match offs {
                                [0] => tile::<true>(x.as_ptr(), plane, c, offs, &wb, o, to),
                                _ => tile::<false>(x.as_ptr(), plane, c, offs, &wb, o, to),
                            }
                        }
                        let mut want = vec![sentinel; MR * ld];
                        for i in 0..rows {
                            for j in 0..positions {
                                let mut v = if with_bias { bias[i] as f64 } else { 0.0 };
                                for ci in 0..c {
                                    for (t, &o) in offs.iter().enumerate() {
                                        let w = wb[(ci * offs.len() + t) * MR + i] as f64;
                                        v += w * x[ci * plane + o + j] as f64;
                                    }
                                }
                                let v = if relu { v.max(0.0) } else { v } as f32;
                                let at = match gaps {
                                    None => Some(j),
                                    Some(RowGaps { wp, ow, at }) => {
                                        let (r, col) = ((at + j) / wp, (at + j) % wp);
                                        (col < ow).then_some(r * ow + col)
                                    }
                                };
                                if let Some(at) = at {
                                    want[i * ld + at] = v;
                                }
                            }
                        }
                        for (n, (&got, &want)) in out.iter().zip(&want).enumerate() {
                            let close = (got - want).abs() <= 1e-5 * (1.0 + want.abs());
                            assert!(
                                close || got == want,
                                "taps {} gaps {:?} rows {rows} positions {positions} bias \
                                 {with_bias} relu {relu}: out[{n}] {got} want {want}",
                                offs.len(),
                                gaps.map(|g| (g.wp, g.ow, g.at)),
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 5 * 6 * 3);
    }
}
