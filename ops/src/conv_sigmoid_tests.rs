//! The conv epilogue's Sigmoid and SiLU at every SIMD level this CPU has (AVX2 and AVX-512
//! run `conv_sigmoid.rs`, the baseline the compiler's vectorisation) against f64, with and
//! without a bias, both residuals and an affine after, on lines with tails and special values.

use super::super::epilogue;
use crate::conv::{Activation, Epilogue, Residual};
use crate::simd::{cpu_levels, with_level};

/// A ramp through [-30, 30] with the values around each limit, infinities, NaN and zeros.
fn inputs() -> Vec<f32> {
    let mut x: Vec<f32> = (0..97).map(|i| i as f32 * 0.625 - 30.0).collect();
    x.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        86.4,
        -86.4,
        86.6,
        -86.6,
        87.5,
        -87.5,
        88.0,
        -88.0,
        88.8,
        -88.8,
        100.0,
        -100.0,
    ]);
    x
}

/// `ep` of `x` (with `bias` and `z`) in f64 from the same f32 input to the activation.
fn reference(x: f32, bias: f32, z: f32, ep: Epilogue) -> f64 {
    let v = if ep.residual == Residual::BeforeAct {
        x + bias + z
    } else {
        x + bias
    } as f64;
    let s = 1.0 / (1.0 + (-v).exp());
    let mut y = if ep.act == Activation::Silu { v * s } else { s };
    if let Some((s, t)) = ep.post {
        y = y * s as f64 + t as f64;
    }
    if ep.residual == Residual::AfterAct {
        y += z as f64;
    }
    y
}

#[test]
fn sigmoid_and_silu_epilogues_match_f64() {
    let x = inputs();
    let z: Vec<f32> = (0..x.len()).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
    for level in cpu_levels() {
        for act in [Activation::Sigmoid, Activation::Silu] {
            for residual in [Residual::None, Residual::BeforeAct, Residual::AfterAct] {
                for post in [None, Some((0.5, -0.25))] {
                    for bias in [None, Some(0.75)] {
                        let ep = Epilogue {
                            act,
                            post,
                            residual,
                        };
                        for len in [1, 15, 16, 17, 33, x.len()] {
                            let mut got = x[..len].to_vec();
                            with_level(level, || epilogue(&mut got, bias, Some(&z), ep));
                            for (i, &g) in got.iter().enumerate() {
                                let w = reference(x[i], bias.unwrap_or(0.0), z[i], ep);
                                // Relative where the activation's value is the result; the
                                // affine and a residual after it round in f32 around it.
                                let tol = if post.is_none() && residual != Residual::AfterAct {
                                    4e-7 * w.abs() + 1e-35
                                } else {
                                    1e-6 * (1.0 + w.abs())
                                };
                                let ok = if w.is_nan() {
                                    g.is_nan()
                                } else if w.is_infinite() {
                                    g as f64 == w
                                } else {
                                    (g as f64 - w).abs() <= tol
                                };
                                assert!(
                                    ok,
                                    "{level:?} {ep:?} bias {bias:?}, element {i} of {len}: \
                                     {g:e} for {:e}, want {w:e}",
                                    x[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
