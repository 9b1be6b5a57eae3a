//! Winograd's output transforms on AVX-512, 16 tiles of a tile row at a time in registers,
//! with the bias and a Relu applied before the store (any other epilogue runs over each
//! channel's rows after it: yolov8n's SiLU convs had taken the portable transform, its 64 ->
//! 64 3x3 on 20x20 with SiLU 0.125 ms against 0.100 now, one thread, AMD Zen 5; the model
//! 0.92-0.95x of its time; docs/bench.md, "Winograd's SiLU convs on the register transform").
//!
//! The portable transforms (`conv_winograd_f4.rs`, `conv_winograd_f2.rs`: `output_channel`)
//! make a pass over the whole block per step (`A^T m` down, then along, rounds of
//! interleaving, a copy into the output, then the epilogue's pass): for F(4x4, 3x3) about 90
//! loads and 70 stores per 16 outputs, a third of squeezenet's 16 -> 64 3x3 on 55x55 (AMD
//! Zen 5). Here the transform points of 16 tiles are loaded once, `A^T m A` runs in registers
//! (the same operations in the same order as the portable code, so the same bits), and the
//! columns of each output row are interleaved by permutes and stored straight into it, full
//! vectors by plain stores: masking every store had left vgg19's 64 -> 64 on 224x224 1.12x
//! slower than the portable transform (2 threads, AMD Zen 5), plain ones 0.95x. One thread,
//! the node alone: squeezenet's 16 -> 64 on 55x55 (F(4x4, 3x3)) 0.198 -> 0.170 ms, 32 -> 128
//! on 27x27 and 64 -> 256 on 13x13 (F(2x2, 3x3)) 0.93x and 0.92x.
//!
//! Sits between the Winograd driver (`conv_winograd.rs`, which calls [`output_channel`] on
//! AVX-512, with the epilogue where [`applies`]) and the CPU's vector units.

use super::{Tiles, Variant};
use crate::conv::{Activation, Epilogue};
use std::arch::x86_64::*;
use std::ops::Range;

/// Whether [`output_channel`] also applies the epilogue `ep` (with no residual passed):
/// AVX-512, and an epilogue of at most a bias and a Relu. Otherwise it adds the bias only.
pub(super) fn applies(ep: Epilogue) -> bool {
    matches!(ep.act, Activation::None | Activation::Relu)
        && ep.post.is_none()
        && crate::simd::avx512()
}

/// One output channel's rows `orow` (`op` holds exactly those rows) from its `mk` (`[p][slot]`,
/// tile rows `tys`) by variant `v`, `bias` added and `relu` applied: the variant's
/// `output_channel` and the epilogue's pass over its rows in one.
///
/// # Safety
/// AVX-512F present; `orow` lies inside the tile rows `tys` (the lengths
/// of `mk` and `op` are checked).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn output_channel(
    v: Variant,
    t: &Tiles,
    mk: &[f32],
    tys: Range<usize>,
    orow: Range<usize>,
    op: &mut [f32],
    epilogue: (Option<f32>, bool),
) {
    let (two, four, eight) = (
        _mm512_set1_ps(2.0),
        _mm512_set1_ps(4.0),
        _mm512_set1_ps(8.0),
    );
    // F(4x4, 3x3)'s `A^T m` as `at_times` computes it, operation for operation.
    let at4 = |m: [__m512; 6]| {
        let (p, q) = (_mm512_add_ps(m[1], m[2]), _mm512_sub_ps(m[1], m[2]));
        let (r, u) = (_mm512_add_ps(m[3], m[4]), _mm512_sub_ps(m[3], m[4]));
        [
            _mm512_add_ps(_mm512_add_ps(m[0], p), r),
            _mm512_add_ps(q, _mm512_mul_ps(two, u)),
            _mm512_add_ps(p, _mm512_mul_ps(four, r)),
            _mm512_add_ps(_mm512_add_ps(q, _mm512_mul_ps(eight, u)), m[5]),
        ]
    };
    // F(2x2, 3x3)'s: `x0 + x1 + x2`, `x1 - x2 - x3`.
    let at2 = |m: [__m512; 4]| {
        [
            _mm512_add_ps(_mm512_add_ps(m[0], m[1]), m[2]),
            _mm512_sub_ps(_mm512_sub_ps(m[1], m[2]), m[3]),
        ]
    };
    match v {
        Variant::F4 => tile_rows::<4, 6, _>(t, mk, tys, orow, op, epilogue, at4),
        Variant::F2 => tile_rows::<2, 4, _>(t, mk, tys, orow, op, epilogue, at2),
    }
}

/// The loop both variants share: for each tile row inside `orow` and each run of 16 of its
/// tiles, the `N x N` transform points of the 16 tiles (lanes past the row's tiles not
/// loaded) give `A^T m A` by `at` (`A^T` of one column of `N`): each column down, then each
/// row along, as the portable transforms order them. Output row `a` of the tile is then the
/// vectors `[b]` whose lane `i` is column `T i + b`; those get the epilogue, are interleaved
/// into 16 consecutive columns per vector and stored (masked past `t.ow`).
#[target_feature(enable = "avx512f")]
unsafe fn tile_rows<const T: usize, const N: usize, A>(
    t: &Tiles,
    mk: &[f32],
    tys: Range<usize>,
    orow: Range<usize>,
    op: &mut [f32],
    (bias, relu): (Option<f32>, bool),
    at: A,
) where
    A: Fn([__m512; N]) -> [__m512; T],
{
    let (s, ts) = (t.row_slots(), t.slots(tys.len()));
    assert!(mk.len() >= N * N * ts && op.len() >= orow.len() * t.ow);
    let zero = _mm512_setzero_ps();
    let finish = |v: __m512| {
        let v = match bias {
            Some(b) => _mm512_add_ps(v, _mm512_set1_ps(b)),
            None => v,
        };
        // Zero first: a NaN stays NaN and -0 stays -0, as `Activation::Relu`.
        if relu {
            _mm512_max_ps(zero, v)
        } else {
            v
        }
    };
    let (base, out) = (mk.as_ptr(), op.as_mut_ptr());
    for (li, ty) in tys.enumerate() {
        if T * ty + T <= orow.start || T * ty >= orow.end {
            continue;
        }
        for v in 0..t.tw.div_ceil(16) {
            let mask = ((1u32 << (t.tw - 16 * v).min(16)) - 1) as __mmask16;
            let points = base.add(li * s + 16 * v);
            // Point `i N + j`: row `i`, column `j` of the patch.
            let m = |p: usize| _mm512_maskz_loadu_ps(mask, points.add(p * ts));
            let cols: [[__m512; T]; N] =
                std::array::from_fn(|j| at(std::array::from_fn(|i| m(i * N + j))));
            let rows: [[__m512; T]; T] =
                std::array::from_fn(|a| at(std::array::from_fn(|j| cols[j][a])));
            for (a, row) in rows.into_iter().enumerate() {
                let r = T * ty + a;
                if !orow.contains(&r) {
                    continue;
                }
                let line = out.add((r - orow.start) * t.ow);
                for (q, vq) in interleaved(row.map(finish)).into_iter().enumerate() {
                    let col = T * 16 * v + 16 * q;
                    if col >= t.ow {
                        break;
                    }
                    match t.ow - col {
                        16.. => _mm512_storeu_ps(line.add(col), vq),
                        n => {
                            _mm512_mask_storeu_ps(line.add(col), ((1u32 << n) - 1) as __mmask16, vq)
                        }
                    }
                }
            }
        }
    }
}

/// `T` vectors `b` (lane `i` of `b[k]`: column `T i + k`) as `T` vectors of 16 consecutive
/// columns: interleaved pairwise (`T` 2), or `b0` with `b2`, `b1` with `b3`, then those two.
#[target_feature(enable = "avx512f")]
unsafe fn interleaved<const T: usize>(b: [__m512; T]) -> [__m512; T] {
    // Lane i of the low (high) index takes lane i / 2 (8 + i / 2) of the first operand when
    // i is even, of the second when odd.
    let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    let pair = |x: __m512, y: __m512| {
        (
            _mm512_permutex2var_ps(x, lo, y),
            _mm512_permutex2var_ps(x, hi, y),
        )
    };
    let mut out = [_mm512_setzero_ps(); T];
    match T {
        2 => (out[0], out[1]) = pair(b[0], b[1]),
        4 => {
            let ((e0, e1), (o0, o1)) = (pair(b[0], b[2]), pair(b[1], b[3]));
            (out[0], out[1]) = pair(e0, o0);
            (out[2], out[3]) = pair(e1, o1);
        }
        _ => unreachable!("Winograd tiles are 2 or 4 wide"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{f2, f4, Tiles};
    use super::*;

    /// Against each variant's portable transform and the epilogue's pass, bit for bit: tile
    /// rows of one partial, one full, two and three vectors of 16 tiles, widths that are not
    /// multiples of the tile, output rows cut mid-tile, with and without a bias and a Relu; M
    /// holds a NaN, a -0 and values of both signs.
    #[test]
    fn gives_the_portable_transforms_and_epilogue_bits() {
        if !crate::simd::avx512() {
            eprintln!("no AVX-512 on this CPU: the transforms compared here do not run");
            return;
        }
        let mut seed = 7u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 * 4.0 - 2.0
        };
        for (v, tile) in [(Variant::F4, 4), (Variant::F2, 2)] {
            for ow in [30usize, 64, 66, 133, 190] {
                let tw = ow.div_ceil(tile);
                let t = Tiles {
                    h: 0,
                    w: 0,
                    pt: 0,
                    pl: 0,
                    ow,
                    tw,
                };
                let tys = 1..4;
                let ts = t.slots(tys.len());
                let mut mk: Vec<f32> = (0..v.points() * ts).map(|_| next()).collect();
                mk[3] = f32::NAN;
                mk[ts + 1] = -0.0;
                let whole = tile..4 * tile;
                for orow in [whole, tile + 1..3 * tile - 1, 2 * tile + 1..2 * tile + 2] {
                    for (bias, relu) in [
                        (Some(0.25), true),
                        (None, true),
                        (Some(-1.5), false),
                        (None, false),
                    ] {
                        let act = if relu {
                            Activation::Relu
                        } else {
                            Activation::None
                        };
                        let mut want = vec![0.0f32; orow.len() * ow];
                        let mut tmp = vec![0.0f32; v.tmp_len(&t, tys.len())];
                        match v {
                            Variant::F4 => f4::output_channel(
                                &t,
                                &mk,
                                tys.clone(),
                                orow.clone(),
                                &mut want,
                                &mut tmp,
                            ),
                            Variant::F2 => f2::output_channel(
                                &t,
                                &mk,
                                tys.clone(),
                                orow.clone(),
                                &mut want,
                                &mut tmp,
                            ),
                        }
                        for line in want.chunks_exact_mut(ow) {
                            crate::conv::cpu::epilogue(line, bias, None, act.into());
                        }
                        let mut got = vec![f32::INFINITY; orow.len() * ow];
                        // SAFETY: AVX-512 checked; `orow` lies inside tile rows `tys`.
                        unsafe {
                            output_channel(
                                v,
                                &t,
                                &mk,
                                tys.clone(),
                                orow.clone(),
                                &mut got,
                                (bias, relu),
                            )
                        };
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "{v:?} ow {ow} rows {orow:?} bias {bias:?} relu {relu}: [{i}] {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}
