//! GPU-vs-reference tests of the elementwise family: every unary op, binary and variadic ops
//! with numpy broadcasting, comparisons and logic, Where and Cast.
//!
//! Each case is computed by a naive f64 reference written here (index decomposition for
//! broadcasting, formulas from the ONNX spec), then by the op on the CPU, on the GPU (lavapipe
//! in CI) and split across both at row 1, an odd row near the middle and the last row. Sizes
//! are deliberately not multiples of the workgroup size; empty and rank-0 tensors are included.
#![allow(clippy::type_complexity)] // tables of test cases

use std::ops::Range;
use tandem::testing::{assert_close, check_all_placements, hashed, op, run_gpu, run_split};
use tandem_ops::{shape, AttrValue, DType, Data, GpuKernel, Op, Tensor, TensorMeta};

fn fill(shape: &[usize], seed: u32) -> Tensor {
    hashed(shape, seed, -4.0, 1.0 / 512.0)
}

fn float(v: f32) -> AttrValue {
    AttrValue::Float(v)
}

/// Elementwise map of a tensor's values through `f` into a tensor of `dtype`.
fn map_to(x: &Tensor, dtype: DType, f: impl Fn(f64) -> f64) -> Tensor {
    let v: Vec<f64> = x.to_f64_vec().into_iter().map(f).collect();
    from_f64(&x.shape, dtype, v)
}

fn from_f64(shape: &[usize], dtype: DType, v: Vec<f64>) -> Tensor {
    let data = match dtype {
        DType::F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
        DType::I64 => Data::I64(v.iter().map(|&x| x as i64).collect()),
        DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
        DType::Bool => Data::Bool(v.iter().map(|&x| x != 0.0).collect()),
        other => panic!("from_f64: {other}"),
    };
    Tensor::new(shape.to_vec(), data)
}

/// Naive numpy broadcasting of any number of operands: for every output index, the element
/// of each operand at that index (size-1 dimensions repeat).
fn broadcast_apply(ins: &[&Tensor], dtype: DType, f: impl Fn(&[f64]) -> f64) -> Tensor {
    let shapes: Vec<&[usize]> = ins.iter().map(|t| t.shape.as_slice()).collect();
    let out = shape::broadcast_shapes(&shapes).unwrap();
    let vals: Vec<Vec<f64>> = ins.iter().map(|t| t.to_f64_vec()).collect();
    let v = (0..shape::numel(&out))
        .map(|mut i| {
            let mut idx = vec![0; out.len()];
            for d in (0..out.len()).rev() {
                idx[d] = i % out[d];
                i /= out[d];
            }
            let xs: Vec<f64> = ins
                .iter()
                .zip(&vals)
                .map(|(t, v)| {
                    let off = out.len() - t.shape.len();
                    let flat = t.shape.iter().enumerate().fold(0, |flat, (d, &n)| {
                        flat * n + if n == 1 { 0 } else { idx[off + d] }
                    });
                    v[flat]
                })
                .collect();
            f(&xs)
        })
        .collect();
    from_f64(&out, dtype, v)
}

/// erf by Simpson integration, in f64.
fn erf(x: f64) -> f64 {
    let n = 2000;
    let h = x / n as f64;
    let g = |t: f64| (-t * t).exp();
    let mut s = g(0.0) + g(x);
    for i in 1..n {
        s += g(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
}

// ---------------------------------------------------------------- unary

#[test]
fn unary_float_ops() {
    let x = fill(&[3, 37], 1);
    let pos = map_to(&x, DType::F32, |v| v.abs() + 0.01);
    let sa = 1.673_263_242_354_377_3;
    let sg = 1.050_700_987_355_480_5;
    type Case = (
        &'static str,
        i64,
        Vec<(&'static str, AttrValue)>,
        Box<dyn Fn(f64) -> f64>,
    );
    let cases: Vec<Case> = vec![
        ("Relu", 14, vec![], Box::new(|v| v.max(0.0))),
        (
            "LeakyRelu",
            16,
            vec![("alpha", float(0.2))],
            Box::new(|v| if v < 0.0 { 0.2 * v } else { v }),
        ),
        (
            "Sigmoid",
            13,
            vec![],
            Box::new(|v| 1.0 / (1.0 + (-v).exp())),
        ),
        ("Tanh", 13, vec![], Box::new(f64::tanh)),
        ("Erf", 13, vec![], Box::new(erf)),
        (
            "Gelu",
            20,
            vec![],
            Box::new(|v| 0.5 * v * (1.0 + erf(v / 2f64.sqrt()))),
        ),
        (
            "Gelu",
            20,
            vec![("approximate", AttrValue::String("tanh".into()))],
            Box::new(|v| {
                0.5 * v
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
            }),
        ),
        (
            "HardSigmoid",
            6,
            vec![("alpha", float(0.3)), ("beta", float(0.4))],
            Box::new(|v| (0.3 * v + 0.4).clamp(0.0, 1.0)),
        ),
        (
            "HardSwish",
            14,
            vec![],
            Box::new(|v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
        ),
        (
            "Clip",
            6,
            vec![("min", float(-1.0)), ("max", float(2.5))],
            Box::new(|v| v.clamp(-1.0, 2.5)),
        ),
        ("Exp", 13, vec![], Box::new(f64::exp)),
        ("Neg", 13, vec![], Box::new(|v| -v)),
        ("Floor", 13, vec![], Box::new(f64::floor)),
        ("Ceil", 13, vec![], Box::new(f64::ceil)),
        ("Round", 11, vec![], Box::new(f64::round_ties_even)),
        ("Abs", 13, vec![], Box::new(f64::abs)),
        (
            "Sign",
            13,
            vec![],
            Box::new(|v| {
                if v > 0.0 {
                    1.0
                } else if v < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }),
        ),
        ("Sin", 7, vec![], Box::new(f64::sin)),
        ("Cos", 7, vec![], Box::new(f64::cos)),
        ("Softplus", 1, vec![], Box::new(|v| (v.exp() + 1.0).ln())),
        ("Softsign", 1, vec![], Box::new(|v| v / (1.0 + v.abs()))),
        (
            "Elu",
            6,
            vec![("alpha", float(0.7))],
            Box::new(|v| if v < 0.0 { 0.7 * (v.exp() - 1.0) } else { v }),
        ),
        (
            "Selu",
            6,
            vec![],
            Box::new(move |v| {
                if v <= 0.0 {
                    sg * (sa * v.exp() - sa)
                } else {
                    sg * v
                }
            }),
        ),
    ];
    for (name, opset, attrs, f) in &cases {
        let o = op(name, *opset, attrs);
        let want = map_to(&x, DType::F32, f);
        check_all_placements(
            o.as_ref(),
            std::slice::from_ref(&x),
            std::slice::from_ref(&want),
            2e-5,
        );
    }
    // Positive-domain functions.
    let positive: Vec<(&str, fn(f64) -> f64)> = vec![
        ("Sqrt", f64::sqrt),
        ("Log", f64::ln),
        ("Reciprocal", |v| 1.0 / v),
    ];
    for (name, f) in positive {
        let want = map_to(&pos, DType::F32, f);
        check_all_placements(
            op(name, 13, &[]).as_ref(),
            std::slice::from_ref(&pos),
            std::slice::from_ref(&want),
            2e-5,
        );
    }
}

#[test]
fn round_ties_to_even_on_gpu() {
    let x = Tensor::f32(&[7], vec![0.5, 1.5, 2.5, -0.5, -2.5, 3.4999, -3.5]);
    let want = Tensor::f32(&[7], vec![0.0, 2.0, 2.0, -0.0, -2.0, 3.0, -4.0]);
    check_all_placements(
        op("Round", 11, &[]).as_ref(),
        &[x],
        std::slice::from_ref(&want),
        0.0,
    );
}

#[test]
fn clip_with_constant_inputs_and_integers() {
    let x = fill(&[5, 13], 2);
    let o = op("Clip", 13, &[]);
    let lo = Tensor::f32(&[], vec![-0.5]);
    let hi = Tensor::f32(&[], vec![1.25]);
    let want = map_to(&x, DType::F32, |v| v.clamp(-0.5, 1.25));
    check_all_placements(
        o.as_ref(),
        &[x.clone(), lo.clone(), hi],
        std::slice::from_ref(&want),
        0.0,
    );
    // Only max: min omitted as an empty constant.
    let empty = Tensor::f32(&[0], vec![]);
    let want = map_to(&x, DType::F32, |v| v.min(0.75));
    check_all_placements(
        o.as_ref(),
        &[x.clone(), empty, Tensor::f32(&[], vec![0.75])],
        std::slice::from_ref(&want),
        0.0,
    );
    // int64 on both devices.
    let xi = map_to(&x, DType::I64, |v| (v * 10.0).round());
    let want = map_to(&xi, DType::I64, |v| v.clamp(-7.0, 12.0));
    let b = |v: i64| Tensor::i64(&[], vec![v]);
    check_all_placements(
        o.as_ref(),
        &[xi.clone(), b(-7), b(12)],
        std::slice::from_ref(&want),
        0.0,
    );
    for (name, f) in [
        ("Neg", (|v: f64| -v) as fn(f64) -> f64),
        ("Abs", f64::abs),
        ("Relu", |v| v.max(0.0)),
        ("Sign", f64::signum),
    ] {
        let want = map_to(&xi, DType::I64, |v| if v == 0.0 { 0.0 } else { f(v) });
        check_all_placements(
            op(name, 14, &[]).as_ref(),
            std::slice::from_ref(&xi),
            std::slice::from_ref(&want),
            0.0,
        );
    }
}

#[test]
fn bool_unary_ops() {
    let v = vec![
        1.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        3.0,
        f32::NAN,
    ];
    let x = Tensor::f32(&[7], v.clone());
    let b = |f: &dyn Fn(f32) -> bool| {
        Tensor::new(vec![7], Data::Bool(v.iter().map(|&x| f(x)).collect()))
    };
    check_all_placements(
        op("IsNaN", 13, &[]).as_ref(),
        std::slice::from_ref(&x),
        std::slice::from_ref(&b(&|x| x.is_nan())),
        0.0,
    );
    check_all_placements(
        op("IsInf", 10, &[]).as_ref(),
        std::slice::from_ref(&x),
        std::slice::from_ref(&b(&|x| x.is_infinite())),
        0.0,
    );
    let neg = op("IsInf", 10, &[("detect_positive", AttrValue::Int(0))]);
    check_all_placements(
        neg.as_ref(),
        std::slice::from_ref(&x),
        std::slice::from_ref(&b(&|x| x == f32::NEG_INFINITY)),
        0.0,
    );
    let p = Tensor::new(
        vec![2, 35],
        Data::Bool((0..70).map(|i| i % 3 == 0).collect()),
    );
    let want = Tensor::new(
        vec![2, 35],
        Data::Bool((0..70).map(|i| i % 3 != 0).collect()),
    );
    check_all_placements(
        op("Not", 1, &[]).as_ref(),
        &[p],
        std::slice::from_ref(&want),
        0.0,
    );
}

#[test]
fn unary_large_dispatch_rank0_and_empty() {
    // More than 65535 workgroups of 64: the y dimension of the grid is used.
    let n = 64 * 65_536 + 17;
    let x = Tensor::f32(&[n], (0..n).map(|i| (i % 201) as f32 - 100.0).collect());
    let want = map_to(&x, DType::F32, |v| v.max(0.0));
    let o = op("Relu", 14, &[]);
    assert_close(
        &run_gpu(o.as_ref(), std::slice::from_ref(&x))[0],
        &want,
        0.0,
        0.0,
    );
    let cut = n / 2 + 1;
    assert_close(&run_split(o.as_ref(), &[x], cut)[0], &want, 0.0, 0.0);
    let s = Tensor::f32(&[], vec![-2.5]);
    check_all_placements(
        op("Abs", 13, &[]).as_ref(),
        &[s],
        std::slice::from_ref(&Tensor::f32(&[], vec![2.5])),
        0.0,
    );
    let e = Tensor::f32(&[0, 3], vec![]);
    check_all_placements(
        op("Exp", 13, &[]).as_ref(),
        std::slice::from_ref(&e),
        std::slice::from_ref(&e),
        0.0,
    );
}

// ---------------------------------------------------------------- binary

const SHAPES: &[(&[usize], &[usize])] = &[
    (&[3, 37], &[3, 37]),
    (&[2, 3, 5, 7], &[5, 1]),
    (&[1], &[67]),
    (&[4, 1, 3], &[1, 5, 1]),
    (&[2, 1, 1, 3, 1, 2, 1, 3], &[1, 2, 3, 1, 2, 1, 2, 1]),
    (&[], &[9]),
];

#[test]
fn binary_float_arithmetic_broadcasts() {
    type F = fn(f64, f64) -> f64;
    let cases: Vec<(&str, Vec<(&str, AttrValue)>, F)> = vec![
        ("Add", vec![], |a, b| a + b),
        ("Sub", vec![], |a, b| a - b),
        ("Mul", vec![], |a, b| a * b),
        ("Div", vec![], |a, b| a / b),
        ("Max", vec![], f64::max),
        ("Min", vec![], f64::min),
        ("Mod", vec![("fmod", AttrValue::Int(1))], |a, b| a % b),
        ("Mod", vec![], |a, b| a - (a / b).floor() * b),
    ];
    for (sa, sb) in SHAPES {
        let (a, b) = (fill(sa, 3), fill(sb, 4));
        // Keep divisors away from zero.
        let b = map_to(&b, DType::F32, |v| if v.abs() < 0.25 { 0.5 } else { v });
        for (name, attrs, f) in &cases {
            let want = broadcast_apply(&[&a, &b], DType::F32, |x| f(x[0], x[1]));
            check_all_placements(
                op(name, 14, attrs).as_ref(),
                &[a.clone(), b.clone()],
                std::slice::from_ref(&want),
                1e-5,
            );
        }
    }
}

#[test]
fn pow_and_prelu() {
    let a = fill(&[4, 19], 5);
    let e = Tensor::f32(&[19], (0..19).map(|i| (i % 5) as f32 - 2.0).collect());
    let want = broadcast_apply(&[&a, &e], DType::F32, |x| x[0].powf(x[1]));
    check_all_placements(
        op("Pow", 15, &[]).as_ref(),
        &[a.clone(), e.clone()],
        std::slice::from_ref(&want),
        1e-4,
    );
    let pos = map_to(&a, DType::F32, |v| v.abs() + 0.1);
    let ef = Tensor::f32(&[], vec![0.37]);
    let want = broadcast_apply(&[&pos, &ef], DType::F32, |x| x[0].powf(x[1]));
    check_all_placements(
        op("Pow", 15, &[]).as_ref(),
        &[pos, ef],
        std::slice::from_ref(&want),
        1e-5,
    );
    // Integer exponent with a float base.
    let ei = Tensor::i64(&[19], (0..19).map(|i| (i % 4) as i64 - 1).collect());
    let want = broadcast_apply(&[&a, &ei], DType::F32, |x| x[0].powf(x[1]));
    check_all_placements(
        op("Pow", 15, &[]).as_ref(),
        &[a.clone(), ei],
        std::slice::from_ref(&want),
        1e-5,
    );
    let slope = Tensor::f32(&[19], (0..19).map(|i| i as f32 * 0.1).collect());
    let want = broadcast_apply(&[&a, &slope], DType::F32, |x| {
        if x[0] < 0.0 {
            x[0] * x[1]
        } else {
            x[0]
        }
    });
    check_all_placements(
        op("PRelu", 16, &[]).as_ref(),
        &[a, slope],
        std::slice::from_ref(&want),
        1e-6,
    );
}

#[test]
fn integer_arithmetic_on_both_devices() {
    let a = Tensor::i64(
        &[2, 7],
        vec![-7, 7, -7, 7, 5, 100, -100, 3, 0, -1, 9, 12, -13, 2],
    );
    let b = Tensor::i64(&[7], vec![2, -2, 3, -3, 0, 7, 9]);
    type F = fn(i64, i64) -> i64;
    let cases: Vec<(&str, Vec<(&str, AttrValue)>, F)> = vec![
        ("Add", vec![], |x, y| x + y),
        ("Sub", vec![], |x, y| x - y),
        ("Mul", vec![], |x, y| x * y),
        ("Div", vec![], |x, y| if y == 0 { 0 } else { x / y }),
        ("Mod", vec![], |x, y| {
            if y == 0 {
                0
            } else {
                x.rem_euclid(y) + if y < 0 && x.rem_euclid(y) != 0 { y } else { 0 }
            }
        }),
        ("Mod", vec![("fmod", AttrValue::Int(1))], |x, y| {
            if y == 0 {
                0
            } else {
                x % y
            }
        }),
        ("Max", vec![], |x, y| x.max(y)),
        ("Min", vec![], |x, y| x.min(y)),
    ];
    for (name, attrs, f) in &cases {
        let want = broadcast_apply(&[&a, &b], DType::I64, |x| {
            f(x[0] as i64, x[1] as i64) as f64
        });
        check_all_placements(
            op(name, 14, attrs).as_ref(),
            &[a.clone(), b.clone()],
            std::slice::from_ref(&want),
            0.0,
        );
    }
    let base = Tensor::i64(&[4], vec![2, -3, 1, 5]);
    let exp = Tensor::i64(&[4], vec![10, 3, -2, 0]);
    check_all_placements(
        op("Pow", 15, &[]).as_ref(),
        &[base, exp],
        std::slice::from_ref(&Tensor::i64(&[4], vec![1024, -27, 1, 1])),
        0.0,
    );
}

#[test]
fn comparisons_and_logic() {
    let a = fill(&[3, 5, 7], 6);
    let b = map_to(&fill(&[5, 1], 7), DType::F32, |v| v.round());
    let a = map_to(&a, DType::F32, |v| v.round());
    type F = fn(f64, f64) -> bool;
    let cases: Vec<(&str, F)> = vec![
        ("Equal", |x, y| x == y),
        ("Less", |x, y| x < y),
        ("Greater", |x, y| x > y),
        ("LessOrEqual", |x, y| x <= y),
        ("GreaterOrEqual", |x, y| x >= y),
    ];
    for (name, f) in &cases {
        let want = broadcast_apply(&[&a, &b], DType::Bool, |x| f(x[0], x[1]) as u8 as f64);
        check_all_placements(
            op(name, 16, &[]).as_ref(),
            &[a.clone(), b.clone()],
            std::slice::from_ref(&want),
            0.0,
        );
        let (ai, bi) = (map_to(&a, DType::I64, |v| v), map_to(&b, DType::I64, |v| v));
        check_all_placements(
            op(name, 16, &[]).as_ref(),
            &[ai, bi],
            std::slice::from_ref(&want),
            0.0,
        );
    }
    let p = Tensor::new(
        vec![4, 17],
        Data::Bool((0..68).map(|i| i % 2 == 0).collect()),
    );
    let q = Tensor::new(vec![17], Data::Bool((0..17).map(|i| i % 3 == 0).collect()));
    let logic: Vec<(&str, F)> = vec![
        ("And", |x, y| x != 0.0 && y != 0.0),
        ("Or", |x, y| x != 0.0 || y != 0.0),
        ("Xor", |x, y| (x != 0.0) != (y != 0.0)),
        ("Equal", |x, y| x == y),
    ];
    for (name, f) in &logic {
        let want = broadcast_apply(&[&p, &q], DType::Bool, |x| f(x[0], x[1]) as u8 as f64);
        check_all_placements(
            op(name, 11, &[]).as_ref(),
            &[p.clone(), q.clone()],
            std::slice::from_ref(&want),
            0.0,
        );
    }
}

#[test]
fn variadic_ops_fold_on_gpu() {
    let ins = [
        fill(&[2, 1, 33], 8),
        fill(&[5, 1], 9),
        fill(&[33], 10),
        fill(&[2, 5, 33], 11),
    ];
    let refs: Vec<&Tensor> = ins.iter().collect();
    type F = fn(&[f64]) -> f64;
    let cases: Vec<(&str, F)> = vec![
        ("Sum", |x| x.iter().sum()),
        ("Mean", |x| x.iter().sum::<f64>() / x.len() as f64),
        ("Max", |x| x.iter().copied().fold(f64::MIN, f64::max)),
        ("Min", |x| x.iter().copied().fold(f64::MAX, f64::min)),
    ];
    for (name, f) in &cases {
        for n in [1, 2, 4] {
            let want = broadcast_apply(&refs[..n], DType::F32, f);
            check_all_placements(
                op(name, 13, &[]).as_ref(),
                &ins[..n],
                std::slice::from_ref(&want),
                1e-5,
            );
        }
    }
    let i = |v: Vec<i64>| Tensor::i64(&[3], v);
    let ints = [i(vec![1, 9, -3]), i(vec![4, -2, 8]), i(vec![0, 5, 5])];
    check_all_placements(
        op("Max", 13, &[]).as_ref(),
        &ints,
        std::slice::from_ref(&i(vec![4, 9, 8])),
        0.0,
    );
    check_all_placements(
        op("Min", 13, &[]).as_ref(),
        &ints,
        std::slice::from_ref(&i(vec![0, -2, -3])),
        0.0,
    );
}

#[test]
fn binary_empty_and_rank0() {
    let e = Tensor::f32(&[0, 3], vec![]);
    let row = Tensor::f32(&[3], vec![1.0, 2.0, 3.0]);
    check_all_placements(
        op("Add", 14, &[]).as_ref(),
        &[e.clone(), row],
        std::slice::from_ref(&e),
        0.0,
    );
    let s = |v: f32| Tensor::f32(&[], vec![v]);
    check_all_placements(
        op("Mul", 14, &[]).as_ref(),
        &[s(3.0), s(-2.0)],
        std::slice::from_ref(&s(-6.0)),
        0.0,
    );
    // f16 operands are f32 on the GPU.
    let h = |v: Vec<f32>| {
        Tensor::new(
            vec![v.len()],
            Data::F16(v.into_iter().map(half::f16::from_f32).collect()),
        )
    };
    let want = Tensor::new(vec![3], Data::Bool(vec![true, false, false]));
    check_all_placements(
        op("Less", 13, &[]).as_ref(),
        &[h(vec![1.0, 2.0, 3.0]), h(vec![1.5, 2.0, -1.0])],
        std::slice::from_ref(&want),
        0.0,
    );
    check_all_placements(
        op("Mul", 14, &[]).as_ref(),
        &[h(vec![1.5, 2.0, 3.0]), h(vec![2.0, -0.5, 0.25])],
        std::slice::from_ref(&h(vec![3.0, -1.0, 0.75])),
        0.0,
    );
}

// ---------------------------------------------------------------- Where and Cast

#[test]
fn where_three_way_broadcast() {
    let c = Tensor::new(
        vec![2, 1, 7],
        Data::Bool((0..14).map(|i| i % 3 != 1).collect()),
    );
    let x = fill(&[5, 7], 12);
    let y = fill(&[3, 1, 1, 1], 13);
    let want = broadcast_apply(&[&c, &x, &y], DType::F32, |v| {
        if v[0] != 0.0 {
            v[1]
        } else {
            v[2]
        }
    });
    check_all_placements(
        op("Where", 16, &[]).as_ref(),
        &[c.clone(), x.clone(), y.clone()],
        std::slice::from_ref(&want),
        0.0,
    );
    let xi = map_to(&x, DType::I64, |v| (v * 100.0).round());
    let yi = map_to(&y, DType::I64, |v| (v * 100.0).round());
    let want = broadcast_apply(&[&c, &xi, &yi], DType::I64, |v| {
        if v[0] != 0.0 {
            v[1]
        } else {
            v[2]
        }
    });
    check_all_placements(
        op("Where", 16, &[]).as_ref(),
        &[c.clone(), xi, yi],
        std::slice::from_ref(&want),
        0.0,
    );
    let same = Tensor::new(
        vec![5, 7],
        Data::Bool((0..35).map(|i| i % 2 == 0).collect()),
    );
    let want = broadcast_apply(&[&same, &x, &x], DType::F32, |v| v[1]);
    check_all_placements(
        op("Where", 16, &[]).as_ref(),
        &[same, x.clone(), x],
        std::slice::from_ref(&want),
        0.0,
    );
}

#[test]
fn cast_between_gpu_types() {
    let to = |code: i64| op("Cast", 19, &[("to", AttrValue::Int(code))]);
    let x = map_to(&fill(&[3, 29], 14), DType::F32, |v| v * 40.0);
    // f32 -> int64 truncates toward zero; -> int32; -> bool is != 0.
    check_all_placements(
        to(7).as_ref(),
        std::slice::from_ref(&x),
        std::slice::from_ref(&map_to(&x, DType::I64, f64::trunc)),
        0.0,
    );
    check_all_placements(
        to(6).as_ref(),
        std::slice::from_ref(&x),
        std::slice::from_ref(&map_to(&x, DType::I32, f64::trunc)),
        0.0,
    );
    let z = Tensor::f32(&[5], vec![0.0, -0.0, 0.1, f32::NAN, -3.0]);
    let want = Tensor::new(vec![5], Data::Bool(vec![false, false, true, true, true]));
    check_all_placements(to(9).as_ref(), &[z], std::slice::from_ref(&want), 0.0);
    // int64 -> f32, -> int8 / uint8 wrap.
    let xi = Tensor::i64(&[6], vec![-129, 300, 7, -1, 0, 1000]);
    check_all_placements(
        to(1).as_ref(),
        std::slice::from_ref(&xi),
        std::slice::from_ref(&Tensor::f32(
            &[6],
            vec![-129.0, 300.0, 7.0, -1.0, 0.0, 1000.0],
        )),
        0.0,
    );
    let i8s = Tensor::new(vec![6], Data::I8(vec![127, 44, 7, -1, 0, -24]));
    check_all_placements(
        to(3).as_ref(),
        std::slice::from_ref(&xi),
        std::slice::from_ref(&i8s),
        0.0,
    );
    let u8s = Tensor::new(vec![6], Data::U8(vec![127, 44, 7, 255, 0, 232]));
    check_all_placements(
        to(2).as_ref(),
        std::slice::from_ref(&xi),
        std::slice::from_ref(&u8s),
        0.0,
    );
    // bool -> f32 and int64.
    let b = Tensor::new(vec![3], Data::Bool(vec![true, false, true]));
    check_all_placements(
        to(1).as_ref(),
        std::slice::from_ref(&b),
        std::slice::from_ref(&Tensor::f32(&[3], vec![1.0, 0.0, 1.0])),
        0.0,
    );
    check_all_placements(
        to(7).as_ref(),
        std::slice::from_ref(&b),
        std::slice::from_ref(&Tensor::i64(&[3], vec![1, 0, 1])),
        0.0,
    );
    // f32 -> f16 rounds to half precision.
    let h = Tensor::f32(&[3], vec![1.0 / 3.0, 1000.7, -2.0e-3]);
    let want = Tensor::new(
        vec![3],
        Data::F16(
            h.as_f32()
                .unwrap()
                .iter()
                .map(|&v| half::f16::from_f32(v))
                .collect(),
        ),
    );
    check_all_placements(to(10).as_ref(), &[h], std::slice::from_ref(&want), 0.0);
    // CastLike takes the type of its second input.
    let like = op("CastLike", 19, &[]);
    let target = Tensor::i64(&[1], vec![0]);
    check_all_placements(
        like.as_ref(),
        &[x.clone(), target],
        std::slice::from_ref(&map_to(&x, DType::I64, f64::trunc)),
        0.0,
    );
}

/// An op whose inputs the GPU side sees as run-time values (no plan-time contents), to test
/// the kernels used when e.g. Clip bounds are graph inputs.
#[derive(Debug)]
struct RuntimeInputs(Box<dyn Op>);

fn strip(ins: &[&TensorMeta]) -> Vec<TensorMeta> {
    ins.iter()
        .map(|m| TensorMeta::new(m.dtype, m.shape.clone()))
        .collect()
}

impl Op for RuntimeInputs {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn infer(&self, ins: &[&TensorMeta]) -> tandem_ops::Result<Vec<TensorMeta>> {
        self.0.infer(ins)
    }
    fn split_axis(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        self.0.split_axis(ins, outs)
    }
    fn cpu(
        &self,
        ins: &[&Tensor],
        outs: &mut [Tensor],
        rows: Range<usize>,
    ) -> tandem_ops::Result<()> {
        self.0.cpu(ins, outs, rows)
    }
    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> tandem_ops::Result<Vec<GpuKernel>> {
        let metas = strip(ins);
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        self.0.gpu(&refs, outs, rows)
    }
}

#[test]
fn clip_with_runtime_bounds() {
    let x = fill(&[4, 33], 15);
    let clip = RuntimeInputs(op("Clip", 13, &[]));
    let s = |v: f32| Tensor::f32(&[], vec![v]);
    let want = map_to(&x, DType::F32, |v| v.clamp(-1.5, 0.5));
    check_all_placements(
        &clip,
        &[x.clone(), s(-1.5), s(0.5)],
        std::slice::from_ref(&want),
        0.0,
    );
    // min > max gives max everywhere.
    let want = map_to(&x, DType::F32, |_| 0.25);
    check_all_placements(
        &clip,
        &[x.clone(), s(1.0), s(0.25)],
        std::slice::from_ref(&want),
        0.0,
    );
    let want = map_to(&x, DType::F32, |v| v.max(-0.75));
    check_all_placements(
        &clip,
        &[x.clone(), s(-0.75)],
        std::slice::from_ref(&want),
        0.0,
    );
    let want = map_to(&x, DType::F32, |v| v.min(0.1));
    check_all_placements(
        &clip,
        &[x.clone(), Tensor::f32(&[0], vec![]), s(0.1)],
        std::slice::from_ref(&want),
        0.0,
    );
    let xi = map_to(&x, DType::I32, |v| (v * 10.0).round());
    let want = map_to(&xi, DType::I32, |v| v.clamp(-9.0, 17.0));
    let b = |v: i32| Tensor::new(vec![], Data::I32(vec![v]));
    check_all_placements(&clip, &[xi, b(-9), b(17)], std::slice::from_ref(&want), 0.0);
}

#[test]
fn small_integer_types_wrap_like_the_host() {
    let i8s = |v: Vec<i8>| Tensor::new(vec![v.len()], Data::I8(v));
    let u8s = |v: Vec<u8>| Tensor::new(vec![v.len()], Data::U8(v));
    let a = i8s(vec![100, -128, 7, -7, 127, 0]);
    let b = i8s(vec![100, -1, 2, 2, 1, 5]);
    check_all_placements(
        op("Add", 14, &[]).as_ref(),
        &[a.clone(), b.clone()],
        std::slice::from_ref(&i8s(vec![-56, 127, 9, -5, -128, 5])),
        0.0,
    );
    check_all_placements(
        op("Mul", 14, &[]).as_ref(),
        &[a.clone(), b.clone()],
        std::slice::from_ref(&i8s(vec![16, -128, 14, -14, 127, 0])),
        0.0,
    );
    check_all_placements(
        op("Div", 14, &[]).as_ref(),
        &[a.clone(), b.clone()],
        std::slice::from_ref(&i8s(vec![1, -128, 3, -3, 127, 0])),
        0.0,
    );
    check_all_placements(
        op("Neg", 13, &[]).as_ref(),
        std::slice::from_ref(&a),
        std::slice::from_ref(&i8s(vec![-100, -128, -7, 7, -127, 0])),
        0.0,
    );
    let lt = Tensor::new(
        vec![6],
        Data::Bool(vec![false, true, false, true, false, true]),
    );
    check_all_placements(
        op("Less", 13, &[]).as_ref(),
        &[a, b],
        std::slice::from_ref(&lt),
        0.0,
    );
    let p = u8s(vec![250, 3, 0, 200]);
    let q = u8s(vec![10, 5, 1, 200]);
    check_all_placements(
        op("Add", 14, &[]).as_ref(),
        &[p.clone(), q.clone()],
        std::slice::from_ref(&u8s(vec![4, 8, 1, 144])),
        0.0,
    );
    check_all_placements(
        op("Sub", 14, &[]).as_ref(),
        &[p.clone(), q.clone()],
        std::slice::from_ref(&u8s(vec![240, 254, 255, 0])),
        0.0,
    );
    let gt = Tensor::new(vec![4], Data::Bool(vec![true, false, false, false]));
    check_all_placements(
        op("Greater", 13, &[]).as_ref(),
        &[p, q],
        std::slice::from_ref(&gt),
        0.0,
    );
}

#[test]
fn pow_integer_base_float_exponent() {
    let x = Tensor::i64(&[5], vec![1, 2, 3, -2, 7]);
    let y = Tensor::f32(&[5], vec![4.0, 5.0, 6.0, 3.0, 0.5]);
    let want = Tensor::i64(&[5], vec![1, 32, 729, -8, 2]);
    check_all_placements(
        op("Pow", 15, &[]).as_ref(),
        &[x, y],
        std::slice::from_ref(&want),
        0.0,
    );
}
