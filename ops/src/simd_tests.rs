//! Every `simd::kernel!` function reached through its op, run at every level this CPU has
//! (forced with `simd::with_level`): each level must give the baseline's bits (NaN for NaN),
//! and the baseline must match a naive reference written here. Inputs have tails (lengths
//! that are not a multiple of 4, 8 or 16 lanes), NaN, +-Inf, +-0 and denormals, and stay below
//! the parallel thresholds so the forced level applies (kernels run on the test's thread).

#![allow(clippy::cloned_ref_to_slice_refs, clippy::type_complexity)]

use super::{cpu_levels, with_level, Level};
use crate::{registry, AttrValue, Attrs, Tensor, TensorMeta};

/// Lengths around the vector widths.
const LENS: [usize; 7] = [1, 3, 7, 15, 17, 33, 100];

/// `n` values: a ramp through [-12, 12] with specials sprinkled in (tails included).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -3e-39,
        f32::MIN_POSITIVE,
        88.0,
        -100.0,
    ];
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 7;
            if h.is_multiple_of(7) {
                specials[(h as usize / 7) % specials.len()]
            } else {
                (h % 2400) as f32 / 100.0 - 12.0
            }
        })
        .collect()
}

/// Finite values only (for ops whose reference would be NaN-ridden otherwise).
fn finite(n: usize, seed: u32) -> Vec<f32> {
    values(n, seed)
        .into_iter()
        .map(|v| if v.is_finite() { v } else { 0.5 })
        .collect()
}

/// Runs `op_type` on `ins` at `level`, all output rows, first output.
fn run_at(level: Level, op_type: &str, attrs: &Attrs, ins: &[Tensor]) -> Tensor {
    let op = registry::build(op_type, attrs).unwrap();
    let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let out_meta = op.infer(&refs).unwrap();
    let axis = op.split_axis(&refs, &out_meta);
    let rows = crate::shape::row_count(&out_meta[0].shape, axis);
    let mut outs: Vec<Tensor> = out_meta
        .iter()
        .map(|m| Tensor::zeros(m.dtype, &m.shape))
        .collect();
    let ins: Vec<&Tensor> = ins.iter().collect();
    with_level(level, || op.cpu(&ins, &mut outs, 0..rows)).unwrap();
    outs.remove(0)
}

/// Runs at every level, asserts each level equals the baseline bit for bit (any NaN matches
/// any NaN), and returns the baseline output.
fn all_levels(op_type: &str, attrs: &Attrs, ins: &[Tensor]) -> Vec<f32> {
    let base = run_at(Level::Baseline, op_type, attrs, ins);
    let base = base.as_f32().unwrap().to_vec();
    for &l in &cpu_levels()[1..] {
        let got = run_at(l, op_type, attrs, ins);
        for (i, (g, b)) in got.as_f32().unwrap().iter().zip(&base).enumerate() {
            assert!(
                g.to_bits() == b.to_bits() || (g.is_nan() && b.is_nan()),
                "{op_type} at {l:?}, element {i}: {g:e} vs baseline {b:e} (inputs {:?})",
                ins.iter().map(|t| &t.shape).collect::<Vec<_>>()
            );
        }
    }
    base
}

/// `got` equals `want` within `tol` relative (NaN where want is NaN, equal infinities).
fn close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g as f64 == w
        } else {
            ((g as f64) - w).abs() <= tol * (1.0 + w.abs())
        };
        assert!(ok, "{what}: element {i}: {g:e} vs reference {w:e}");
    }
}

#[test]
fn unary_kernels_match_baseline_and_reference() {
    let a = Attrs::new(20);
    type Refs = [(&'static str, fn(f64) -> f64, f64)];
    let refs: &Refs = &[
        ("Relu", |x| if x < 0.0 { 0.0 } else { x }, 0.0),
        ("Sigmoid", |x| 1.0 / (1.0 + (-x).exp()), 2e-6),
        ("Tanh", f64::tanh, 2e-6),
        ("Exp", f64::exp, 4e-6),
        ("Sqrt", f64::sqrt, 1e-7),
        ("Reciprocal", |x| 1.0 / x, 1e-7),
        ("Abs", f64::abs, 0.0),
        ("Neg", |x| -x, 0.0),
        ("Floor", f64::floor, 0.0),
        ("Softsign", |x| x / (1.0 + x.abs()), 1e-6),
    ];
    for &n in &LENS {
        let x = values(n, 1);
        let t = Tensor::f32(&[n], x.clone());
        for &(op, r, tol) in refs {
            let got = all_levels(op, &a, &[t.clone()]);
            // The f64 reference rounded to f32 (overflow to inf as the op does).
            let want: Vec<f64> = x.iter().map(|&v| r(v as f64) as f32 as f64).collect();
            close(&format!("{op} n={n}"), &got, &want, tol);
        }
        for op in [
            "Erf",
            "Gelu",
            "HardSwish",
            "Elu",
            "Selu",
            "LeakyRelu",
            "Softplus",
        ] {
            all_levels(op, &a, &[t.clone()]);
        }
    }
}

#[test]
fn binary_broadcasts_match_baseline_and_reference() {
    let a = Attrs::new(17);
    let ops: [(&str, fn(f64, f64) -> f64); 6] = [
        ("Add", |x, y| x + y),
        ("Sub", |x, y| x - y),
        ("Mul", |x, y| x * y),
        ("Div", |x, y| x / y),
        ("Max", |x, y| {
            if x.is_nan() || y.is_nan() {
                f64::NAN
            } else {
                x.max(y)
            }
        }),
        ("Min", |x, y| {
            if x.is_nan() || y.is_nan() {
                f64::NAN
            } else {
                x.min(y)
            }
        }),
    ];
    for &c in &LENS {
        let r = 3;
        // (a shape, b shape): same shape, row broadcast, column broadcast, scalar each side.
        let cases: [(Vec<usize>, Vec<usize>); 5] = [
            (vec![r, c], vec![r, c]),
            (vec![r, c], vec![c]),
            (vec![r, c], vec![r, 1]),
            (vec![r, c], vec![]),
            (vec![], vec![r, c]),
        ];
        for (sa, sb) in cases {
            let na: usize = sa.iter().product();
            let nb: usize = sb.iter().product();
            let (xa, xb) = (values(na, 2), values(nb, 3));
            let ins = [Tensor::f32(&sa, xa.clone()), Tensor::f32(&sb, xb.clone())];
            for (op, f) in ops {
                let got = all_levels(op, &a, &ins);
                // The output is [r, c]; index each operand by its broadcast strides.
                let want: Vec<f64> = (0..r * c)
                    .map(|i| {
                        let pick = |x: &[f32], s: &[usize]| match s.len() {
                            0 => x[0],
                            1 => x[i % c],
                            _ if s[1] == 1 => x[i / c],
                            _ => x[i],
                        };
                        // Exact: one f64 op on f32 inputs, rounded to f32, is the f32 op.
                        f(pick(&xa, &sa) as f64, pick(&xb, &sb) as f64) as f32 as f64
                    })
                    .collect();
                close(&format!("{op} {sa:?} {sb:?}"), &got, &want, 0.0);
            }
        }
    }
}

#[test]
fn pools_match_baseline_and_a_naive_window_loop() {
    for (k, s, p) in [
        (3, 1, 1),
        (3, 2, 0),
        (3, 2, 1),
        (2, 2, 0),
        (5, 1, 2),
        (3, 3, 1),
    ] {
        for &w in &[5usize, 17, 33] {
            let (c, h) = (2, 6);
            let x = values(c * h * w, 4);
            let t = Tensor::f32(&[1, c, h, w], x.clone());
            for (op, max) in [("MaxPool", true), ("AveragePool", false)] {
                let a = Attrs::new(17)
                    .with("kernel_shape", AttrValue::Ints(vec![k, k]))
                    .with("strides", AttrValue::Ints(vec![s, s]))
                    .with("pads", AttrValue::Ints(vec![p, p, p, p]));
                let got = all_levels(op, &a, &[t.clone()]);
                let (k, s, p) = (k as usize, s as usize, p as usize);
                let (oh, ow) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
                let mut want = Vec::new();
                for ch in 0..c {
                    for i in 0..oh {
                        for j in 0..ow {
                            let mut vals = Vec::new();
                            for di in 0..k {
                                for dj in 0..k {
                                    let (y, xx) = (
                                        (i * s + di) as isize - p as isize,
                                        (j * s + dj) as isize - p as isize,
                                    );
                                    if y >= 0 && xx >= 0 && (y as usize) < h && (xx as usize) < w {
                                        vals.push(
                                            x[(ch * h + y as usize) * w + xx as usize] as f64,
                                        );
                                    }
                                }
                            }
                            want.push(if max {
                                if vals.iter().any(|v| v.is_nan()) {
                                    f64::NAN
                                } else {
                                    vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
                                }
                            } else {
                                vals.iter().sum::<f64>() / vals.len() as f64
                            });
                        }
                    }
                }
                close(&format!("{op} k{k} s{s} p{p} w{w}"), &got, &want, 1e-5);
            }
        }
    }
}

/// Depthwise convs of a 3x3 or 5x5 window, stride 1 (same size) and 2 (AVX2 and AVX-512 read
/// the planes in place, `conv_depthwise.rs`; the baseline sums phase planes): every level
/// gives the baseline's bits, NaN, infinities, zeros of both signs and denormals included, on
/// planes wider and narrower than a vector (and than the window; the widest has groups of
/// vectors read in place and shifted at both window sizes, and strided rows of several
/// vectors), two outputs per input channel; the baseline matches the definition in f64.
#[test]
fn depthwise_convs_match_baseline_and_definition() {
    for (k, s) in [(3usize, 1usize), (5, 1), (3, 2), (5, 2)] {
        for (h, w) in [
            (1, 1),
            (2, 3),
            (3, 3),
            (7, 7),
            (5, 17),
            (6, 33),
            (9, 4),
            (12, 40),
        ] {
            let (c, m, p) = (3, 6, k / 2);
            let (oh, ow) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
            let x = values(c * h * w, 21);
            let wt = finite(m * k * k, 22);
            let b = finite(m, 23);
            let ins = [
                Tensor::f32(&[1, c, h, w], x.clone()),
                Tensor::f32(&[m, 1, k, k], wt.clone()),
                Tensor::f32(&[m], b.clone()),
            ];
            let a = Attrs::new(17)
                .with("kernel_shape", AttrValue::Ints(vec![k as i64; 2]))
                .with("pads", AttrValue::Ints(vec![p as i64; 4]))
                .with("strides", AttrValue::Ints(vec![s as i64; 2]))
                .with("group", AttrValue::Int(c as i64));
            let got = all_levels("Conv", &a, &ins);
            // The definition and the sum of its terms' magnitudes (what f32 rounding scales with).
            let mut want = Vec::new();
            for oc in 0..m {
                let ch = oc / (m / c);
                for i in 0..oh {
                    for j in 0..ow {
                        let (mut sum, mut size) = (b[oc] as f64, (b[oc] as f64).abs());
                        for di in 0..k {
                            for dj in 0..k {
                                let (y, xx) = (
                                    (i * s + di) as isize - p as isize,
                                    (j * s + dj) as isize - p as isize,
                                );
                                if (0..h as isize).contains(&y) && (0..w as isize).contains(&xx) {
                                    let v = x[(ch * h + y as usize) * w + xx as usize] as f64;
                                    let term = wt[(oc * k + di) * k + dj] as f64 * v;
                                    sum += term;
                                    size += term.abs();
                                }
                            }
                        }
                        want.push((sum, size));
                    }
                }
            }
            for (i, (&g, &(want, size))) in got.iter().zip(&want).enumerate() {
                let ok = match want.is_finite() {
                    true => (g as f64 - want).abs() <= 1e-6 * (1.0 + size),
                    false => g.is_nan() == want.is_nan() && (want.is_nan() || g as f64 == want),
                };
                assert!(
                    ok,
                    "depthwise k{k} s{s} {h}x{w}: element {i}: {g:e} vs definition {want:e}"
                );
            }
        }
    }
}

/// Naive softmax of `n`-long lanes `inner` apart, in f64.
fn softmax_ref(x: &[f32], n: usize, inner: usize, log: bool) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for o in 0..x.len() / (n * inner) {
        for j in 0..inner {
            let at = |k: usize| o * n * inner + k * inner + j;
            let m = (0..n)
                .map(|k| x[at(k)] as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..n).map(|k| (x[at(k)] as f64 - m).exp()).sum();
            for k in 0..n {
                let v = x[at(k)] as f64 - m;
                y[at(k)] = if log { v - s.ln() } else { v.exp() / s };
            }
        }
    }
    y
}

#[test]
fn row_kernels_match_baseline_and_reference() {
    for &n in &LENS {
        // Softmax / LogSoftmax on the last axis (contiguous lanes) and axis 0 (strided lanes),
        // with specials (NaN spreads over its lane; the baseline comparison covers them).
        for (axis, shape, inner) in [(-1i64, vec![3, n], 1), (0, vec![n, 3], 3)] {
            let x = finite(3 * n, 5);
            let t = Tensor::f32(&shape, x.clone());
            for (op, log) in [("Softmax", false), ("LogSoftmax", true)] {
                let a = Attrs::new(13).with("axis", AttrValue::Int(axis));
                let got = all_levels(op, &a, &[t.clone()]);
                close(
                    &format!("{op} {shape:?}"),
                    &got,
                    &softmax_ref(&x, n, inner, log),
                    1e-5,
                );
                all_levels(op, &a, &[Tensor::f32(&shape, values(3 * n, 6))]);
            }
        }
        // LayerNormalization over rows of n, with scale and bias.
        let x = finite(3 * n, 7);
        let (sc, b) = (finite(n, 8), finite(n, 9));
        let ins = [
            Tensor::f32(&[3, n], x.clone()),
            Tensor::f32(&[n], sc.clone()),
            Tensor::f32(&[n], b.clone()),
        ];
        let a = Attrs::new(17).with("epsilon", AttrValue::Float(1e-5));
        let got = all_levels("LayerNormalization", &a, &ins);
        let mut want = Vec::new();
        for row in x.chunks(n) {
            let m = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n as f64;
            for (i, &v) in row.iter().enumerate() {
                want.push((v as f64 - m) / (var + 1e-5).sqrt() * sc[i] as f64 + b[i] as f64);
            }
        }
        close(&format!("LayerNormalization n={n}"), &got, &want, 2e-4);
        all_levels(
            "LayerNormalization",
            &a,
            &[
                Tensor::f32(&[3, n], values(3 * n, 10)),
                ins[1].clone(),
                ins[2].clone(),
            ],
        );
        // LRN across 7 channels of n pixels (beta 0.75: the sqrt path; 0.6: powf).
        for beta in [0.75f32, 0.6] {
            let x = finite(7 * n, 11);
            let a = Attrs::new(13)
                .with("size", AttrValue::Int(3))
                .with("alpha", AttrValue::Float(0.5))
                .with("beta", AttrValue::Float(beta))
                .with("bias", AttrValue::Float(1.0));
            let got = all_levels("LRN", &a, &[Tensor::f32(&[1, 7, n], x.clone())]);
            let want: Vec<f64> = (0..7 * n)
                .map(|i| {
                    let (ch, p) = (i / n, i % n);
                    let sq: f64 = (ch.saturating_sub(1)..(ch + 2).min(7))
                        .map(|cc| (x[cc * n + p] as f64).powi(2))
                        .sum();
                    x[i] as f64 / (1.0 + 0.5 / 3.0 * sq).powf(beta as f64)
                })
                .collect();
            close(&format!("LRN beta {beta} n={n}"), &got, &want, 2e-6);
            all_levels("LRN", &a, &[Tensor::f32(&[1, 7, n], values(7 * n, 12))]);
        }
    }
}

#[test]
fn reductions_match_baseline_and_reference() {
    let refs: [(&str, fn(&[f64]) -> f64); 4] = [
        ("ReduceSum", |v| v.iter().sum()),
        ("ReduceMean", |v| v.iter().sum::<f64>() / v.len() as f64),
        ("ReduceMax", |v| {
            v.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        }),
        ("ReduceL2", |v| v.iter().map(|x| x * x).sum::<f64>().sqrt()),
    ];
    for &n in &[1usize, 17, 31, 32, 33, 100] {
        // Axis 1 of [3, n] (contiguous rows: the 16-lane path from 32 on) and axis 0 of
        // [n, 3] (interleaved lanes).
        for (shape, axis) in [(vec![3, n], 1i64), (vec![n, 3], 0)] {
            let x = finite(3 * n, 13);
            let t = Tensor::f32(&shape, x.clone());
            for (op, f) in refs {
                let a = Attrs::new(11)
                    .with("axes", AttrValue::Ints(vec![axis]))
                    .with("keepdims", AttrValue::Int(0));
                let got = all_levels(op, &a, &[t.clone()]);
                let want: Vec<f64> = (0..3)
                    .map(|o| {
                        let v: Vec<f64> = (0..n)
                            .map(|k| x[if axis == 1 { o * n + k } else { k * 3 + o }] as f64)
                            .collect();
                        f(&v)
                    })
                    .collect();
                close(&format!("{op} {shape:?} axis {axis}"), &got, &want, 1e-5);
                all_levels(op, &a, &[Tensor::f32(&shape, values(3 * n, 14))]);
            }
        }
    }
}
