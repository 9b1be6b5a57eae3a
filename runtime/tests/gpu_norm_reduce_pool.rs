//! GPU-vs-reference tests of the normalisation, reduction and pooling family: Softmax,
//! LogSoftmax, Reduce*, ArgMax/ArgMin, MaxPool, AveragePool, the global pools,
//! LayerNormalization, InstanceNormalization, BatchNormalization and LRN.
//!
//! Each case is computed by a naive f64 reference written here, then by the op on the CPU, on
//! the GPU (lavapipe in CI) and split across both at several rows (odd ones included). Shapes
//! are deliberately not multiples of the workgroup size.

use tandem::testing::{
    assert_close, check_all_placements, hashed, op, run_cpu, run_gpu, try_run_gpu_rows,
    FirstOutputs,
};
use tandem_ops::{AttrValue, Tensor};

fn fill(shape: &[usize], seed: u32) -> Tensor {
    hashed(shape, seed, -4.0, 1.0 / 512.0)
}

fn int(v: i64) -> AttrValue {
    AttrValue::Int(v)
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

fn tensor(shape: &[usize], v: Vec<f64>) -> Tensor {
    Tensor::f32(shape, v.into_iter().map(|x| x as f32).collect())
}

/// `(outer, n, inner)` around axis `a`.
fn around(shape: &[usize], a: usize) -> (usize, usize, usize) {
    (
        shape[..a].iter().product(),
        shape[a],
        shape[a + 1..].iter().product(),
    )
}

// ---------------------------------------------------------------- Softmax

fn naive_softmax(x: &Tensor, a: usize, log: bool) -> Tensor {
    let v = f64s(x);
    let (outer, n, inner) = around(&x.shape, a);
    let mut y = vec![0.0; v.len()];
    for o in 0..outer {
        for j in 0..inner {
            let at = |k: usize| o * n * inner + k * inner + j;
            let m = (0..n).map(|k| v[at(k)]).fold(f64::MIN, f64::max);
            let s: f64 = (0..n).map(|k| (v[at(k)] - m).exp()).sum();
            for k in 0..n {
                y[at(k)] = if log {
                    v[at(k)] - m - s.ln()
                } else {
                    (v[at(k)] - m).exp() / s
                };
            }
        }
    }
    tensor(&x.shape, y)
}

/// Lanes of 3, 37 and 70 elements, and of 2, 17 and 32: `softmax.wgsl` keeps lanes of at most
/// 32 in a local array.
#[test]
fn softmax_and_log_softmax_on_each_axis() {
    for x in [fill(&[3, 37, 70], 1), fill(&[2, 32, 17], 2)] {
        for name in ["Softmax", "LogSoftmax"] {
            for axis in [-1i64, 1, 0] {
                let o = op(name, 13, &[("axis", int(axis))]);
                let want = naive_softmax(&x, axis.rem_euclid(3) as usize, name == "LogSoftmax");
                check_all_placements(&*o, std::slice::from_ref(&x), &[want], 1e-5);
            }
        }
    }
    let x = fill(&[3, 37, 70], 1);
    // Opset 11: coerced to 2-D at axis 1, i.e. a softmax over 37 * 70 elements per batch.
    let o = op("Softmax", 11, &[]);
    let flat = Tensor::f32(&[3, 37 * 70], x.as_f32().unwrap().to_vec());
    let want = naive_softmax(&flat, 1, false);
    check_all_placements(
        &*o,
        std::slice::from_ref(&x),
        &[Tensor::f32(&x.shape, want.as_f32().unwrap().to_vec())],
        1e-6,
    );
}

/// Lanes with a NaN, an infinity or only -inf are NaN throughout on every placement, as
/// onnxruntime has them, lanes of one element among them (`softmax.wgsl`'s cached lanes once
/// made a lone NaN 1 on lavapipe: the fuzz seeds 1451 and 1551); a -inf beside finite values
/// is an element of 0 (Softmax) or -inf (LogSoftmax), also beside elements whose plain sum
/// overflows (a plain sum was the kernel's first NaN test).
#[test]
fn softmax_of_lanes_with_nan_and_infinities() {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    for lane in [
        vec![nan],
        vec![inf],
        vec![1.0, nan, 2.0],
        vec![inf, 1.0, 2.0],
    ] {
        for name in ["Softmax", "LogSoftmax"] {
            let x = Tensor::f32(&[1, lane.len()], lane.clone());
            let got = run_gpu(&*op(name, 13, &[]), std::slice::from_ref(&x));
            let all_nan = got[0].as_f32().unwrap().iter().all(|v| v.is_nan());
            assert!(all_nan, "{name} of {lane:?} on the GPU: {:?}", got[0]);
        }
    }
    for name in ["Softmax", "LogSoftmax"] {
        let big = 3.0e38;
        let x = Tensor::f32(
            &[3, 3],
            vec![-inf, 1.0, 2.0, -inf, -inf, -inf, big, big, -inf],
        );
        let want = naive_softmax(&x, 1, name == "LogSoftmax");
        check_all_placements(&*op(name, 13, &[]), std::slice::from_ref(&x), &[want], 1e-6);
    }
}

#[test]
fn hardmax_with_ties() {
    let x = fill(&[3, 37, 70], 20);
    let x = Tensor::f32(
        &x.shape,
        x.as_f32().unwrap().iter().map(|v| v.round()).collect(),
    );
    let v = x.as_f32().unwrap();
    for axis in [-1i64, 1, 0] {
        let a = axis.rem_euclid(3) as usize;
        let (outer, n, inner) = around(&x.shape, a);
        let mut want = vec![0.0f32; v.len()];
        for o in 0..outer {
            for j in 0..inner {
                let at = |k: usize| o * n * inner + k * inner + j;
                let best = (0..n).map(|k| v[at(k)]).fold(f32::MIN, f32::max);
                let first = (0..n).find(|&k| v[at(k)] == best).unwrap();
                want[at(first)] = 1.0;
            }
        }
        let o = op("Hardmax", 13, &[("axis", int(axis))]);
        check_all_placements(
            &*o,
            std::slice::from_ref(&x),
            &[Tensor::f32(&x.shape, want)],
            0.0,
        );
    }
}

#[test]
fn softmax_of_an_empty_tensor() {
    let x = Tensor::f32(&[0, 5], vec![]);
    let o = op("Softmax", 13, &[]);
    assert_eq!(run_gpu(&*o, std::slice::from_ref(&x))[0].shape, vec![0, 5]);
    assert_eq!(run_cpu(&*o, &[x])[0].shape, vec![0, 5]);
}

// ---------------------------------------------------------------- Reduce*

fn naive_reduce(x: &Tensor, red: &[bool], keep: bool, f: fn(&[f64]) -> f64) -> Tensor {
    let out_keep: Vec<usize> = x
        .shape
        .iter()
        .zip(red)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let st = tandem_ops::shape::strides(&x.shape);
    let ost = tandem_ops::shape::strides(&out_keep);
    let mut groups = vec![Vec::new(); out_keep.iter().product()];
    for (i, v) in f64s(x).into_iter().enumerate() {
        let o: usize = (0..x.shape.len())
            .filter(|&d| !red[d])
            .map(|d| i / st[d] % x.shape[d] * ost[d])
            .sum();
        groups[o].push(v);
    }
    let shape: Vec<usize> = if keep {
        out_keep
    } else {
        x.shape
            .iter()
            .zip(red)
            .filter(|(_, &r)| !r)
            .map(|(&d, _)| d)
            .collect()
    };
    tensor(&shape, groups.iter().map(|g| f(g)).collect())
}

type Fold = fn(&[f64]) -> f64;

fn folds() -> Vec<(&'static str, Fold)> {
    vec![
        ("ReduceSum", |g| g.iter().sum()),
        ("ReduceMean", |g| g.iter().sum::<f64>() / g.len() as f64),
        ("ReduceMax", |g| {
            g.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        }),
        ("ReduceMin", |g| {
            g.iter().cloned().fold(f64::INFINITY, f64::min)
        }),
        ("ReduceProd", |g| g.iter().product()),
        ("ReduceL1", |g| g.iter().map(|v| v.abs()).sum()),
        ("ReduceL2", |g| g.iter().map(|v| v * v).sum::<f64>().sqrt()),
        ("ReduceSumSquare", |g| g.iter().map(|v| v * v).sum()),
        ("ReduceLogSum", |g| g.iter().sum::<f64>().ln()),
        ("ReduceLogSumExp", |g| {
            let m = g.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            m + g.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
        }),
    ]
}

#[test]
fn every_reduction_on_several_axis_sets() {
    let x = fill(&[5, 7, 3, 11], 2);
    // Small values for ReduceProd so the product stays finite and well conditioned.
    let xp = Tensor::f32(
        &x.shape,
        x.as_f32().unwrap().iter().map(|v| 1.0 + v / 16.0).collect(),
    );
    let axis_sets: [&[i64]; 5] = [&[-1], &[1], &[0, 2], &[1, 2], &[]];
    for (name, f) in folds() {
        let x = if matches!(name, "ReduceProd" | "ReduceLogSum") {
            &xp
        } else {
            &x
        };
        for axes in axis_sets {
            for keep in [1, 0] {
                let red: Vec<bool> = if axes.is_empty() {
                    vec![true; 4]
                } else {
                    (0..4)
                        .map(|d| axes.contains(&d) || axes.contains(&(d - 4)))
                        .collect()
                };
                let want = naive_reduce(x, &red, keep == 1, f);
                let o = op(name, 18, &[("keepdims", int(keep))]);
                let ins = [x.clone(), Tensor::i64(&[axes.len()], axes.to_vec())];
                check_all_placements(&*o, &ins, std::slice::from_ref(&want), 1e-4);
            }
        }
    }
}

#[test]
fn reduce_sum_old_opset_attribute_noop_and_empty() {
    let x = fill(&[4, 67], 3);
    let o = op("ReduceSum", 11, &[("axes", ints(&[0]))]);
    let want = naive_reduce(&x, &[true, false], true, |g| g.iter().sum());
    check_all_placements(&*o, std::slice::from_ref(&x), &[want], 1e-5);
    // Empty axes with noop_with_empty_axes: the input unchanged.
    let o = op("ReduceMean", 18, &[("noop_with_empty_axes", int(1))]);
    check_all_placements(
        &*o,
        &[x.clone(), Tensor::i64(&[0], vec![])],
        std::slice::from_ref(&x),
        0.0,
    );
    // A reduction over an empty axis gives the identity.
    let e = Tensor::f32(&[3, 0, 2], vec![]);
    let o = op("ReduceSum", 13, &[]);
    let want = Tensor::f32(&[3, 1, 2], vec![0.0; 6]);
    check_all_placements(&*o, &[e, Tensor::i64(&[1], vec![1])], &[want], 0.0);
}

fn naive_arg(x: &Tensor, a: usize, max: bool, last: bool) -> Vec<i64> {
    let v = f64s(x);
    let (outer, n, inner) = around(&x.shape, a);
    let mut out = Vec::new();
    for o in 0..outer {
        for j in 0..inner {
            let vals: Vec<f64> = (0..n).map(|k| v[o * n * inner + k * inner + j]).collect();
            let best = vals
                .iter()
                .cloned()
                .fold(if max { f64::MIN } else { f64::MAX }, |b, v| {
                    if max {
                        b.max(v)
                    } else {
                        b.min(v)
                    }
                });
            let hits: Vec<usize> = (0..n).filter(|&k| vals[k] == best).collect();
            out.push(if last { hits[hits.len() - 1] } else { hits[0] } as i64);
        }
    }
    out
}

#[test]
fn argmax_argmin_with_ties() {
    // Coarse values so ties happen.
    let x = Tensor::f32(
        &[6, 13, 9],
        fill(&[6, 13, 9], 4)
            .as_f32()
            .unwrap()
            .iter()
            .map(|v| v.round())
            .collect(),
    );
    for name in ["ArgMax", "ArgMin"] {
        for axis in [0i64, 1, -1] {
            for last in [0, 1] {
                let a = axis.rem_euclid(3) as usize;
                let o = op(
                    name,
                    13,
                    &[
                        ("axis", int(axis)),
                        ("select_last_index", int(last)),
                        ("keepdims", int(0)),
                    ],
                );
                let want = naive_arg(&x, a, name == "ArgMax", last == 1);
                let mut shape = x.shape.clone();
                shape.remove(a);
                let want = Tensor::i64(&shape, want);
                check_all_placements(&*o, std::slice::from_ref(&x), &[want], 0.0);
            }
        }
    }
}

// ---------------------------------------------------------------- Pools

/// Naive 2-D pooling over an explicitly padded plane (None marks padding). `mode`: 0 max,
/// 1 average of the real elements, 2 average over the whole kernel.
fn naive_pool(
    x: &Tensor,
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
    pads: [usize; 4],
    mode: u8,
) -> Tensor {
    let (nc, h, w) = (x.shape[0] * x.shape[1], x.shape[2], x.shape[3]);
    let oh = (h + pads[0] + pads[2] - (k[0] - 1) * d[0] - 1) / s[0] + 1;
    let ow = (w + pads[1] + pads[3] - (k[1] - 1) * d[1] - 1) / s[1] + 1;
    let (ph, pw) = (h + pads[0] + pads[2], w + pads[1] + pads[3]);
    let v = f64s(x);
    let mut y = Vec::new();
    for c in 0..nc {
        let mut p = vec![None; ph * pw];
        for i in 0..h {
            for j in 0..w {
                p[(i + pads[0]) * pw + j + pads[1]] = Some(v[(c * h + i) * w + j]);
            }
        }
        for oi in 0..oh {
            for oj in 0..ow {
                let mut win = Vec::new();
                for a in 0..k[0] {
                    for b in 0..k[1] {
                        win.push(p[(oi * s[0] + a * d[0]) * pw + oj * s[1] + b * d[1]]);
                    }
                }
                let real: Vec<f64> = win.iter().flatten().cloned().collect();
                y.push(match mode {
                    0 => real.iter().cloned().fold(f64::MIN, f64::max),
                    1 => real.iter().sum::<f64>() / real.len() as f64,
                    _ => real.iter().sum::<f64>() / win.len() as f64,
                });
            }
        }
    }
    tensor(&[x.shape[0], x.shape[1], oh, ow], y)
}

#[test]
fn max_and_average_pool_2d() {
    let x = fill(&[2, 3, 19, 23], 5);
    type Case = ([usize; 2], [usize; 2], [usize; 2], [usize; 4]);
    let cases: [Case; 4] = [
        ([3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
        ([2, 3], [1, 2], [2, 1], [0, 1, 2, 0]),
        ([5, 5], [3, 3], [1, 1], [2, 2, 2, 2]),
        ([1, 1], [1, 1], [1, 1], [0, 0, 0, 0]),
    ];
    for (k, s, d, pads) in cases {
        let to = |v: &[usize]| ints(&v.iter().map(|&x| x as i64).collect::<Vec<_>>());
        let attrs = |cip: i64| {
            vec![
                ("kernel_shape", to(&k)),
                ("strides", to(&s)),
                ("dilations", to(&d)),
                ("pads", to(&pads)),
                ("count_include_pad", int(cip)),
            ]
        };
        let max = FirstOutputs(op("MaxPool", 12, &attrs(0)), 1);
        check_all_placements(
            &max,
            std::slice::from_ref(&x),
            &[naive_pool(&x, k, s, d, pads, 0)],
            1e-6,
        );
        let avg = op("AveragePool", 19, &attrs(0));
        check_all_placements(
            &*avg,
            std::slice::from_ref(&x),
            &[naive_pool(&x, k, s, d, pads, 1)],
            1e-5,
        );
        let avg = op("AveragePool", 19, &attrs(1));
        check_all_placements(
            &*avg,
            std::slice::from_ref(&x),
            &[naive_pool(&x, k, s, d, pads, 2)],
            1e-5,
        );
    }
}

/// A kernel far wider than the input (2^20, SAME pads): every window is clipped to the input.
/// The shader and the CPU compute each window's taps instead of walking all 2^20.
#[test]
fn pool_kernel_wider_than_the_input() {
    let x = fill(&[1, 2, 3, 9], 8);
    let k = 1usize << 20;
    // SAME_UPPER, stride 4 along the width: 3 outputs, total pad 2 * 4 + k - 9 (extra at end).
    let total = 2 * 4 + k - 9;
    let pads = [0, total / 2, 0, total - total / 2];
    let a = [
        ("kernel_shape", ints(&[1, k as i64])),
        ("strides", ints(&[1, 4])),
        ("auto_pad", AttrValue::String("SAME_UPPER".into())),
    ];
    let want = naive_pool(&x, [1, k], [1, 4], [1, 1], pads, 0);
    check_all_placements(
        &FirstOutputs(op("MaxPool", 12, &a), 1),
        std::slice::from_ref(&x),
        &[want],
        0.0,
    );
    let want = naive_pool(&x, [1, k], [1, 4], [1, 1], pads, 1);
    check_all_placements(
        &*op("AveragePool", 19, &a),
        std::slice::from_ref(&x),
        &[want],
        1e-6,
    );
}

#[test]
fn pools_1d_3d_ceil_and_auto_pad() {
    // 1-D, SAME_UPPER, stride 2: 67 -> 34 outputs.
    let x = fill(&[2, 5, 67], 6);
    let o = op(
        "AveragePool",
        11,
        &[
            ("kernel_shape", ints(&[4])),
            ("strides", ints(&[2])),
            ("auto_pad", AttrValue::String("SAME_UPPER".into())),
        ],
    );
    let gpu = run_gpu(&*o, std::slice::from_ref(&x));
    assert_eq!(gpu[0].shape, vec![2, 5, 34]);
    assert_close(
        &gpu[0],
        &run_cpu(&*o, std::slice::from_ref(&x))[0],
        1e-5,
        1e-5,
    );
    // SAME_UPPER: total pad 33 * 2 + 4 - 67 = 3, split [1, 2] (the extra one at the end).
    let as2d = Tensor::f32(&[2, 5, 1, 67], x.as_f32().unwrap().to_vec());
    let want = naive_pool(&as2d, [1, 4], [1, 2], [1, 1], [0, 1, 0, 2], 1);
    assert_close(
        &gpu[0],
        &Tensor::f32(&[2, 5, 34], want.as_f32().unwrap().to_vec()),
        1e-5,
        1e-5,
    );
    // Ceil mode: 4x4 of 1..16, kernel 3, stride 2 (the ONNX example).
    let x = Tensor::f32(&[1, 1, 4, 4], (1..=16).map(|v| v as f32).collect());
    let a = [
        ("kernel_shape", ints(&[3, 3])),
        ("strides", ints(&[2, 2])),
        ("ceil_mode", int(1)),
    ];
    let want = Tensor::f32(&[1, 1, 2, 2], vec![11., 12., 15., 16.]);
    check_all_placements(
        &FirstOutputs(op("MaxPool", 12, &a), 1),
        std::slice::from_ref(&x),
        &[want],
        0.0,
    );
    let want = Tensor::f32(&[1, 1, 2, 2], vec![6., 7.5, 12., 13.5]);
    check_all_placements(
        &*op("AveragePool", 19, &a),
        std::slice::from_ref(&x),
        &[want],
        1e-6,
    );
    // count_include_pad with a ceil overhang: only positions inside input + pads count.
    let x = Tensor::f32(&[1, 1, 5], (1..=5).map(|v| v as f32).collect());
    let a = [
        ("kernel_shape", ints(&[2])),
        ("strides", ints(&[2])),
        ("ceil_mode", int(1)),
        ("count_include_pad", int(1)),
    ];
    check_all_placements(
        &*op("AveragePool", 19, &a),
        std::slice::from_ref(&x),
        &[Tensor::f32(&[1, 1, 3], vec![1.5, 3.5, 5.0])],
        1e-6,
    );
    // 3-D: kernel 2x2x2 stride 2 over 3x4x5 (floor), against the CPU.
    let x = fill(&[1, 2, 3, 4, 5], 7);
    let o = FirstOutputs(
        op(
            "MaxPool",
            12,
            &[
                ("kernel_shape", ints(&[2, 2, 2])),
                ("strides", ints(&[2, 2, 2])),
            ],
        ),
        1,
    );
    let cpu = run_cpu(&o, std::slice::from_ref(&x));
    assert_eq!(cpu[0].shape, vec![1, 2, 1, 2, 2]);
    let v = x.as_f32().unwrap();
    let at = |c: usize, d: usize, h: usize, w: usize| v[((c * 3 + d) * 4 + h) * 5 + w];
    let mut want = Vec::new();
    for c in 0..2 {
        for oh in 0..2 {
            for ow in 0..2 {
                let mut m = f32::MIN;
                for (d, h, w) in (0..8).map(|i| (i / 4, oh * 2 + i / 2 % 2, ow * 2 + i % 2)) {
                    m = m.max(at(c, d, h, w));
                }
                want.push(m);
            }
        }
    }
    check_all_placements(
        &o,
        std::slice::from_ref(&x),
        &[Tensor::f32(&[1, 2, 1, 2, 2], want)],
        0.0,
    );
}

#[test]
fn max_pool_indices_are_cpu_only() {
    let x = fill(&[1, 2, 5, 5], 8);
    let o = op("MaxPool", 12, &[("kernel_shape", ints(&[2, 2]))]);
    assert!(try_run_gpu_rows(&*o, std::slice::from_ref(&x), None).is_err());
    let cpu = run_cpu(&*o, std::slice::from_ref(&x));
    // Every index points at an input element equal to the output.
    let v = x.as_f32().unwrap();
    for (y, i) in cpu[0].as_f32().unwrap().iter().zip(cpu[1].to_i64_vec()) {
        assert_eq!(*y, v[i as usize]);
    }
}

#[test]
fn global_pools() {
    let x = fill(&[3, 7, 9, 11], 9);
    let red = [false, false, true, true];
    let want = naive_reduce(&x, &red, true, |g| g.iter().sum::<f64>() / g.len() as f64);
    check_all_placements(
        &*op("GlobalAveragePool", 1, &[]),
        std::slice::from_ref(&x),
        &[want],
        1e-5,
    );
    let want = naive_reduce(&x, &red, true, |g| {
        g.iter().cloned().fold(f64::MIN, f64::max)
    });
    check_all_placements(
        &*op("GlobalMaxPool", 1, &[]),
        std::slice::from_ref(&x),
        &[want],
        0.0,
    );
}

/// llvmpipe ends all loops of a shader invocation after 65,535 rounds in all, silently
/// (reduce.wgsl's "loop budget"): GlobalAveragePool on a 160x160 plane summed only its first
/// 21,845 inputs. Folds and scans longer than that budget must be whole on every placement,
/// and a fold past what a workgroup may take runs on the CPU instead (the GPU refuses it).
#[test]
fn reductions_past_llvmpipe_loop_budget() {
    // Small integers: every sum is exact in f32, so any input left out shows.
    let counting = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        tensor(shape, (0..n).map(|i| ((i * 7) % 13) as f64).collect())
    };
    let x = counting(&[1, 2, 160, 160]);
    let red = [false, false, true, true];
    let want = naive_reduce(&x, &red, true, |g| g.iter().sum::<f64>() / g.len() as f64);
    check_all_placements(
        &*op("GlobalAveragePool", 1, &[]),
        std::slice::from_ref(&x),
        &[want],
        1e-6,
    );
    // Five rows: more output elements than take a workgroup each below the budget
    // (`reduce.rs`'s WIDE_MOST_OUTPUTS), so one invocation folds each.
    for n in [70_001usize, 259_999] {
        let mut x = counting(&[5, n]);
        // The largest value last, so that a scan stopping early misses it.
        let v = x.as_f32_mut().unwrap();
        v[n - 1] = 100.0;
        v[2 * n - 1] = 100.0;
        let red = [false, true];
        let sum = naive_reduce(&x, &red, true, |g| g.iter().sum());
        let max = naive_reduce(&x, &red, true, |g| {
            g.iter().cloned().fold(f64::MIN, f64::max)
        });
        for (name, want) in [("ReduceSum", sum), ("ReduceMax", max)] {
            let o = op(name, 11, &[("axes", ints(&[1]))]);
            check_all_placements(&*o, std::slice::from_ref(&x), &[want], 0.0);
        }
    }
    let mut x = counting(&[5, 60_000]);
    x.as_f32_mut().unwrap()[59_999] = 100.0;
    let arg = op("ArgMax", 13, &[("axis", int(1))]);
    let got = run_gpu(&*arg, std::slice::from_ref(&x));
    assert_eq!(got[0].to_i64_vec(), naive_arg(&x, 1, true, false));
    // Past a workgroup's budget (64 invocations): refused on the GPU with the reason, exact
    // on the CPU.
    // Ones and zeros: the sum stays exact in f32.
    let x = tensor(
        &[1, 16_700_000],
        (0..16_700_000)
            .map(|i| (i % 13 == 0) as u8 as f64)
            .collect(),
    );
    let o = op("ReduceSum", 11, &[("axes", ints(&[1]))]);
    let err = try_run_gpu_rows(&*o, std::slice::from_ref(&x), None).unwrap_err();
    assert!(
        err.to_string().contains("16700000 inputs per output"),
        "{err}"
    );
    let want = naive_reduce(&x, &[false, true], true, |g| g.iter().sum());
    assert_close(&run_cpu(&*o, std::slice::from_ref(&x))[0], &want, 0.0, 0.0);
}

/// Long folds and scans of few output elements, and those past what one invocation may take
/// (`reduce_wide.wgsl`: a workgroup per output element), on every placement: each fold
/// against the reference, a whole 64 x 111 x 111 tensor among them; sums of small integers
/// exactly (an input left out or counted twice shows); ArgMax/ArgMin with the extreme, ties
/// and NaNs where a strided scan meets them first or last.
#[test]
fn long_reductions_take_a_workgroup_per_output_element() {
    for shape in [[3, 270_001], [2, 5_003]] {
        let x = fill(&shape, 5);
        let positive = Tensor::f32(
            &x.shape,
            x.as_f32().unwrap().iter().map(|v| 5.0 + v).collect(),
        );
        // Ones, with runs of 64 twos and 64 halves in turn: products of powers of two,
        // exact, and every strided partial product (lanes, invocations) far from overflow.
        let powers = tensor(
            &x.shape,
            (0..x.numel())
                .map(|i| match i % 4000 {
                    0..64 => 2.0,
                    2000..2064 => 0.5,
                    _ => 1.0,
                })
                .collect(),
        );
        for (name, f) in folds() {
            let x = match name {
                "ReduceProd" => &powers,
                "ReduceLogSum" => &positive,
                _ => &x,
            };
            let want = naive_reduce(x, &[false, true], true, f);
            let o = op(name, 11, &[("axes", ints(&[1]))]);
            check_all_placements(&*o, std::slice::from_ref(x), &[want], 1e-4);
        }
    }
    let n = 64 * 111 * 111;
    let x = tensor(
        &[1, 64, 111, 111],
        (0..n).map(|i| ((i * 7) % 13) as f64).collect(),
    );
    let want = naive_reduce(&x, &[true; 4], false, |g| g.iter().sum());
    let o = op("ReduceSum", 11, &[("keepdims", int(0))]);
    check_all_placements(&*o, std::slice::from_ref(&x), &[want], 0.0);
    let n = 100_003;
    for (max, last) in [(true, false), (true, true), (false, false), (false, true)] {
        // Row 0: the extreme at 5 and at n - 2 (a tie); row 1: NaNs at 70,001 and 90,000
        // (another invocation's, met first in the combining) after the extreme at 3; row 2:
        // the extreme only at n - 1.
        let extreme = if max { 50.0 } else { -50.0 };
        let mut v: Vec<f64> = (0..3 * n).map(|i| ((i * 7) % 13) as f64).collect();
        (v[5], v[n - 2]) = (extreme, extreme);
        (v[n + 3], v[n + 70_001], v[n + 90_000]) = (extreme, f64::NAN, f64::NAN);
        v[3 * n - 1] = extreme;
        let x = tensor(&[3, n], v);
        let name = if max { "ArgMax" } else { "ArgMin" };
        let o = op(
            name,
            13,
            &[("axis", int(1)), ("select_last_index", int(last as i64))],
        );
        let mut want = naive_arg(&x, 1, max, last);
        want[1] = 70_001; // the first NaN (numpy), which `naive_arg` does not see
        for got in [
            run_cpu(&*o, std::slice::from_ref(&x)),
            run_gpu(&*o, std::slice::from_ref(&x)),
        ] {
            assert_eq!(got[0].to_i64_vec(), want, "{name} select_last {last}");
        }
    }
}

// ---------------------------------------------------------------- Normalisations

/// Naive normalisation of rows of `n` elements: (y, mean, inv_std), scale/bias by (row, j).
fn naive_rows(
    x: &Tensor,
    n: usize,
    eps: f64,
    sb: &dyn Fn(usize, usize) -> (f64, f64),
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let v = f64s(x);
    let (mut y, mut ms, mut is) = (Vec::new(), Vec::new(), Vec::new());
    for (r, row) in v.chunks(n).enumerate() {
        let m = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for (j, x) in row.iter().enumerate() {
            let (s, b) = sb(r, j);
            y.push((x - m) * inv * s + b);
        }
        ms.push(m);
        is.push(inv);
    }
    (y, ms, is)
}

#[test]
fn layer_norm_with_stats_scalar_bias_and_offset_data() {
    // A large offset checks the two-pass variance.
    let x = Tensor::f32(
        &[3, 5, 77],
        fill(&[3, 5, 77], 10)
            .as_f32()
            .unwrap()
            .iter()
            .map(|v| v + 1000.0)
            .collect(),
    );
    let s = fill(&[77], 11);
    let b = fill(&[77], 12);
    let (sv, bv) = (f64s(&s), f64s(&b));
    let (y, m, inv) = naive_rows(&x, 77, 1e-5, &|_, j| (sv[j], bv[j]));
    let o = op("LayerNormalization", 17, &[]);
    let ins = [x.clone(), s.clone(), b.clone()];
    let want = [
        tensor(&x.shape, y),
        tensor(&[3, 5, 1], m),
        tensor(&[3, 5, 1], inv),
    ];
    check_all_placements(&*o, &ins, &want, 2e-4);
    check_all_placements(
        &FirstOutputs(op("LayerNormalization", 17, &[]), 1),
        &ins,
        &want[..1],
        2e-4,
    );
    // axis 1, scalar scale, no bias.
    let x = fill(&[4, 3, 25], 13);
    let o = FirstOutputs(
        op(
            "LayerNormalization",
            17,
            &[("axis", int(1)), ("epsilon", AttrValue::Float(1e-2))],
        ),
        1,
    );
    let (y, _, _) = naive_rows(&x, 75, 1e-2, &|_, _| (1.5, 0.0));
    check_all_placements(
        &o,
        &[x.clone(), Tensor::f32(&[1], vec![1.5])],
        &[tensor(&x.shape, y)],
        1e-4,
    );
}

#[test]
fn instance_and_batch_norm() {
    let x = fill(&[2, 5, 9, 7], 14);
    let (s, b) = (fill(&[5], 15), fill(&[5], 16));
    let (sv, bv) = (f64s(&s), f64s(&b));
    let (y, _, _) = naive_rows(&x, 63, 1e-5, &|r, _| (sv[r % 5], bv[r % 5]));
    let o = op("InstanceNormalization", 6, &[]);
    check_all_placements(
        &*o,
        &[x.clone(), s.clone(), b.clone()],
        &[tensor(&x.shape, y)],
        1e-4,
    );

    let (m, var) = (fill(&[5], 17), fill(&[5], 18));
    let var = Tensor::f32(
        &[5],
        var.as_f32()
            .unwrap()
            .iter()
            .map(|v| v.abs() + 0.1)
            .collect(),
    );
    let (mv, vv) = (f64s(&m), f64s(&var));
    let xv = f64s(&x);
    let y: Vec<f64> = (0..xv.len())
        .map(|i| {
            let c = i / 63 % 5;
            (xv[i] - mv[c]) / (vv[c] + 1e-3).sqrt() * sv[c] + bv[c]
        })
        .collect();
    let o = op(
        "BatchNormalization",
        15,
        &[("epsilon", AttrValue::Float(1e-3))],
    );
    check_all_placements(
        &*o,
        &[x.clone(), s, b, m, var],
        &[tensor(&x.shape, y)],
        1e-5,
    );
}

#[test]
fn lrn_across_channels() {
    let x = fill(&[2, 7, 5, 3], 19);
    let xv = f64s(&x);
    // A size of 2^40 covers every channel (alpha scaled so alpha / size stays 1e-2): the GPU
    // once wrapped `c + after + 1` in u32 and summed an empty window.
    for size in [3i64, 4, 1 << 40] {
        let alpha = 1e-2f64 * if size > 100 { size as f64 } else { 1.0 };
        let (beta, bias) = (0.75f64, 1.5f64);
        let o = op(
            "LRN",
            13,
            &[
                ("size", int(size)),
                ("alpha", AttrValue::Float(alpha as f32)),
                ("beta", AttrValue::Float(beta as f32)),
                ("bias", AttrValue::Float(bias as f32)),
            ],
        );
        let y: Vec<f64> = (0..xv.len())
            .map(|i| {
                let (c, s, n) = (i / 15 % 7, i % 15, i / 105);
                let lo = (c as i64 - (size - 1) / 2).max(0) as usize;
                let hi = (c + (size as usize) / 2).min(6);
                let sq: f64 = (lo..=hi).map(|cc| xv[(n * 7 + cc) * 15 + s].powi(2)).sum();
                xv[i] / (bias + alpha / size as f64 * sq).powf(beta)
            })
            .collect();
        check_all_placements(&*o, std::slice::from_ref(&x), &[tensor(&x.shape, y)], 1e-5);
    }
}

#[test]
fn gpu_refuses_integer_reductions_with_a_reason() {
    let x = Tensor::i64(&[2, 3], vec![1, 2, 3, 4, 5, 6]);
    let o = op("ReduceSum", 13, &[]);
    let err = try_run_gpu_rows(&*o, &[x.clone(), Tensor::i64(&[1], vec![1])], None).unwrap_err();
    assert!(err.to_string().contains("f32"), "{err}");
    assert_eq!(
        run_cpu(&*o, &[x, Tensor::i64(&[1], vec![1])])[0].to_i64_vec(),
        vec![6, 15]
    );
}
