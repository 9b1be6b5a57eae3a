//! The packed GEMM's micro-kernel for CPUs with AVX2 and FMA but not AVX-512 (AMD Zen 1-3,
//! Intel client cores; any CPU under `TANDEM_SIMD=avx2`): 6 rows of A times a 16-column strip
//! of a panel, two 8-float vectors per k: 12 accumulators, the strip's two vectors and one
//! broadcast, 15 of the 16 registers. Panels packed at this level are one strip wide; a wider
//! one (packed on an AVX-512 thread, read by one a test forced to AVX2) runs strip by strip,
//! each rereading the rows of A.
//!
//! On an AMD Zen 3 (2 threads) this kernel matches the `gemm` crate's own 6 x 16 AVX2 kernel
//! rather than beating it: what the kept packing saves is packing B on every call (minilm
//! and tiny Llama's prefill about 3 % faster). Convs read in place (`conv_implicit.rs`) ran at
//! 0.6-0.95x the speed of im2col + GEMM with it, so there the conv paths stay AVX-512's. On
//! Zen 1, which splits each 256-bit instruction in two, the conv paths take it
//! (`conv_packed::runs_here`: most models 2-18 % faster, alternated).
//!
//! Sits between `cpu_gemm_packed.rs`'s blocks and the CPU's 256-bit vector units.

use super::Lhs;
use crate::lanes::store_first_avx2;
use std::arch::x86_64::*;

/// `R` (at most 6) rows of A times each 16-column strip of the panel that holds one of
/// the first `cols` columns: accumulators from zero, or with `I` from `init`'s row-major sums
/// at stride `nr`, over the panel's K; then masked stores of the first `cols` columns, or
/// (`T`) stores transposed, 8 floats a column where `room` rows from the first may be
/// written (the rows past `R` are the next block's, stored after), else `R`.
///
/// # Safety
/// AVX2 and FMA present; otherwise as `cpu_gemm_packed::block`, with `R` rows.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn kernel<const R: usize, const T: bool, const I: bool, const S: bool>(
    a: Lhs,
    (panel, nr): (&[f32], usize),
    c: *mut f32,
    ldc: usize,
    (cols, room): (usize, usize),
    init: *const f32,
) {
    let k = panel.len() / nr;
    let (v, steps) = (a.view, a.steps);
    let ap = v.data.as_ptr().add(v.offset);
    for s in 0..cols.div_ceil(16) {
        let strip = panel.as_ptr().add(16 * s);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        if I {
            for (i, acc) in acc.iter_mut().enumerate() {
                for (h, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_loadu_ps(init.add(i * nr + 16 * s + 8 * h));
                }
            }
        }
        for kk in 0..k {
            let b0 = _mm256_loadu_ps(strip.add(kk * nr));
            let b1 = _mm256_loadu_ps(strip.add(kk * nr + 8));
            // As the AVX-512 kernel: with taps (`S`), the step's column from the table.
            let col = match S {
                true => ap.add(*steps.get_unchecked(kk)),
                false => ap.add(kk * v.cs),
            };
            for (i, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_ps(*col.add(i * v.rs));
                acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
            }
        }
        for h in 0..2 {
            let first = 16 * s + 8 * h;
            if first >= cols {
                break;
            }
            let n = (cols - first).min(8);
            if T {
                let rows: [__m256; 8] =
                    std::array::from_fn(|i| acc.get(i).map_or(_mm256_setzero_ps(), |r| r[h]));
                store_transposed(&rows, R, c.add(first * ldc), ldc, (n, room));
                continue;
            }
            for (i, acc) in acc.iter().enumerate() {
                let dst = c.add(i * ldc + first);
                match n {
                    8 => _mm256_storeu_ps(dst, acc[h]),
                    _ => store_first_avx2(dst, acc[h], n),
                }
            }
        }
    }
}

/// Rows `rows[..r]` (8 columns each) stored transposed: column `l < cols` (at most 8) to
/// `c[l * ldc..][..r]`. An 8x8 transpose in registers, then 8 floats per column where `room`
/// allows (the rows past `r` are the next block's, stored after), else `r`.
///
/// # Safety
/// AVX2 present; `c` covers `cols` columns of `room.max(r)` floats at stride `ldc`, written
/// by no one else during the call.
#[inline(always)]
unsafe fn store_transposed(
    rows: &[__m256; 8],
    r: usize,
    c: *mut f32,
    ldc: usize,
    (cols, room): (usize, usize),
) {
    // Pairs of rows interleaved, then pairs of pairs: q[k] holds, in its 128-bit half j,
    // column 4j + k of rows 0..4 (k < 4) or rows 4..8 (k >= 4).
    let mut q = [_mm256_setzero_ps(); 8];
    for half in 0..2 {
        let x = &rows[4 * half..];
        let (t0, t1) = (
            _mm256_unpacklo_ps(x[0], x[1]),
            _mm256_unpackhi_ps(x[0], x[1]),
        );
        let (t2, t3) = (
            _mm256_unpacklo_ps(x[2], x[3]),
            _mm256_unpackhi_ps(x[2], x[3]),
        );
        q[4 * half] = _mm256_shuffle_ps::<0x44>(t0, t2);
        q[4 * half + 1] = _mm256_shuffle_ps::<0xee>(t0, t2);
        q[4 * half + 2] = _mm256_shuffle_ps::<0x44>(t1, t3);
        q[4 * half + 3] = _mm256_shuffle_ps::<0xee>(t1, t3);
    }
    let mut tail = [0.0f32; 8];
    for k in 0..4 {
        // The halves of rows 0..4 and 4..8 side by side: columns k and 4 + k.
        let low = _mm256_permute2f128_ps::<0x20>(q[k], q[4 + k]);
        let high = _mm256_permute2f128_ps::<0x31>(q[k], q[4 + k]);
        for (col, v) in [(k, low), (4 + k, high)] {
            if col >= cols {
                continue;
            }
            let dst = c.add(col * ldc);
            if room >= 8 {
                _mm256_storeu_ps(dst, v);
            } else {
                _mm256_storeu_ps(tail.as_mut_ptr(), v);
                std::ptr::copy_nonoverlapping(tail.as_ptr(), dst, r);
            }
        }
    }
}
