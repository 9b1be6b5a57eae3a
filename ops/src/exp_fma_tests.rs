//! The FMA exp and the attention's softmax row at every SIMD level this CPU has, against f64
//! and against the portable `exp_f32` and `softmax::lane`: ramps through the whole range,
//! the limits, rows of every length around the vector widths, masked (-3.4e38) keys, and rows
//! with NaN and infinities.

use super::softmax_rows;
use crate::simd::{cpu_levels, with_level, Level};
use crate::unary::exp_f32;

/// `exp` of the FMA kernels at `level` (AVX2 or AVX-512) on each of `x`.
fn exp_at(level: Level, x: &[f32]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the level is one of `cpu_levels()` (checked by the callers), so its features
    // are present; each load and store covers one whole vector of a padded copy.
    unsafe {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f")]
        unsafe fn on512(v: &mut [f32]) {
            for c in v.chunks_exact_mut(16) {
                let e = super::avx512::exp(_mm512_loadu_ps(c.as_ptr()));
                _mm512_storeu_ps(c.as_mut_ptr(), e);
            }
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn on256(v: &mut [f32]) {
            for c in v.chunks_exact_mut(8) {
                let e = super::avx2::exp(_mm256_loadu_ps(c.as_ptr()));
                _mm256_storeu_ps(c.as_mut_ptr(), e);
            }
        }
        let mut v = x.to_vec();
        v.resize(x.len().div_ceil(16) * 16, 0.0);
        match level {
            Level::Avx512 => on512(&mut v),
            Level::Avx2 => on256(&mut v),
            Level::Baseline => unreachable!("the baseline has no FMA exp"),
        }
        v.truncate(x.len());
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("FMA exp at {level:?} for {} values", x.len())
}

#[test]
fn exp_matches_exp_f32_and_f64_with_its_limits() {
    let mut x: Vec<f32> = (0..2000).map(|i| i as f32 * 0.0891 - 89.0).collect();
    x.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        88.72,
        88.8,
        -86.4,
        -86.6,
        -87.3,
        -87.4,
        -3.4e38,
        1e-30,
    ]);
    for &level in &cpu_levels()[1..] {
        let got = exp_at(level, &x);
        for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
            let want = exp_f32(v);
            let ok = if want.is_nan() {
                g.is_nan()
            } else if want.is_infinite() || want == 0.0 {
                g == want
            } else {
                let rel = ((g as f64 - want as f64) / want as f64).abs();
                // A few ulp of exp_f32, and within the same of the true value.
                rel <= 4e-7 && ((g as f64 - (v as f64).exp()) / (v as f64).exp()).abs() <= 1e-6
                    || v <= -86.5 // exp_f32's clamp: both give e^-86.5 there
                        && g == want
            };
            assert!(
                ok,
                "{level:?} exp({v:e}) (element {i}): {g:e} vs exp_f32 {want:e}"
            );
        }
    }
}

/// Softmax of `x` in f64 (NaN rows as the kernels give them: a NaN, +inf, or only -inf).
fn reference(x: &[f32]) -> Vec<f64> {
    let m = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let e: Vec<f64> = x.iter().map(|&v| (v as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|e| e / s).collect()
}

#[test]
fn softmax_rows_match_f64_and_the_portable_lane_at_every_level() {
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for n in [1, 2, 5, 7, 8, 9, 15, 16, 17, 31, 33, 40, 128, 131] {
        rows.push((0..n).map(|i| ((i * 37) % 23) as f32 * 0.7 - 8.0).collect());
        // A causal row: keys past the first n / 2 + 1 masked with f32's lowest.
        let masked = (0..n).map(|i| if i > n / 2 { -3.4e38 } else { i as f32 * 0.3 });
        rows.push(masked.collect());
    }
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    rows.extend([
        vec![
            0.5, nan, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0,
        ],
        vec![0.5, inf, 1.0],
        vec![-inf; 19],
        vec![-inf, 3.0, -inf, -inf, 2.0],
        vec![80.0, -80.0, 0.0, 88.0, 87.0, -3.4e38, 1.0, 2.0, 3.0],
    ]);
    // Blocks of 1, 2 and 3 rows (a pair and a last row alone on AVX-512): row j of a block is
    // the row rotated left by j.
    for (x, count) in rows.iter().flat_map(|x| [1, 2, 3].map(|c| (x, c))) {
        let n = x.len();
        let block: Vec<f32> = (0..count)
            .flat_map(|j| (0..n).map(move |i| x[(i + j) % n]))
            .collect();
        for &level in &cpu_levels() {
            let mut got = vec![f32::NAN; block.len() + 1];
            with_level(level, || softmax_rows(&block, &mut got, n));
            assert!(got[block.len()].is_nan(), "{level:?}: wrote past the rows");
            for (row, got) in block.chunks(n).zip(got.chunks(n)) {
                let want = reference(row);
                let mut portable = vec![0.0; n];
                crate::softmax::lane(row, &mut portable, false);
                for (i, ((&g, &w), &p)) in got.iter().zip(&want).zip(&portable).enumerate() {
                    let ok = if w.is_nan() {
                        g.is_nan() && p.is_nan()
                    } else {
                        (g as f64 - w).abs() <= 1e-6 * (1.0 + w)
                            && (g - p).abs() <= 1e-6 * (1.0 + p)
                            // Masked keys are exactly 0, as exp_f32 makes them.
                            && (row[i] != -3.4e38 || g == 0.0)
                    };
                    assert!(
                        ok,
                        "{level:?} {count} rows, row {row:?} element {i}: {g:e} vs f64 {w:e}, \
                         lane {p:e}"
                    );
                }
            }
        }
    }
}
