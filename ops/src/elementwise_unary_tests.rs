//! CPU tests of the unary operators against naive f64 references written from the ONNX spec.

#![allow(clippy::cloned_ref_to_slice_refs, clippy::needless_range_loop)]

use super::*;
use crate::{AttrValue, Data};

fn build(ctor: fn(&Attrs) -> Result<Box<dyn Op>>, attrs: Attrs) -> Box<dyn Op> {
    ctor(&attrs).unwrap()
}

/// Runs `op` on `ins` for `rows` (all rows when None) into a fresh zeroed output.
fn run_rows(op: &dyn Op, ins: &[Tensor], rows: Option<Range<usize>>) -> Tensor {
    let metas: Vec<TensorMeta> = ins
        .iter()
        .map(|t| TensorMeta::constant(t.clone()))
        .collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let out_meta = op.infer(&refs).unwrap();
    let axis = op.split_axis(&refs, &out_meta);
    let n = shape::row_count(&out_meta[0].shape, axis);
    let mut outs: Vec<Tensor> = out_meta
        .iter()
        .map(|m| Tensor::zeros(m.dtype, &m.shape))
        .collect();
    let ins: Vec<&Tensor> = ins.iter().collect();
    op.cpu(&ins, &mut outs, rows.unwrap_or(0..n)).unwrap();
    outs.remove(0)
}

fn run(op: &dyn Op, ins: &[Tensor]) -> Tensor {
    run_rows(op, ins, None)
}

/// Simpson integration of 2/sqrt(pi) exp(-t^2) from 0 to x, in f64.
fn erf_ref(x: f64) -> f64 {
    let n = 2000;
    let h = x / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x);
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
}

fn inputs() -> Vec<f32> {
    let mut v: Vec<f32> = (0..257).map(|i| (i as f32 - 128.0) * 0.047).collect();
    v.extend([1e-6, -3e-5, 0.0, -0.0, 9.5, -9.5, 30.0, -30.0]);
    v
}

fn check_float(
    ctor: fn(&Attrs) -> Result<Box<dyn Op>>,
    attrs: Attrs,
    domain: fn(f64) -> bool,
    reference: impl Fn(f64) -> f64,
    tol: f64,
) {
    let op = build(ctor, attrs);
    let x: Vec<f32> = inputs().into_iter().filter(|&v| domain(v as f64)).collect();
    let n = x.len();
    let t = Tensor::f32(&[n], x.clone());
    // Rows 3..n-2 only: the rest must stay zero.
    let got = run_rows(op.as_ref(), &[t], Some(3..n - 2));
    let got = got.as_f32().unwrap();
    for i in 0..n {
        let want = if (3..n - 2).contains(&i) {
            reference(x[i] as f64)
        } else {
            0.0
        };
        let g = got[i] as f64;
        assert!(
            (g - want).abs() <= tol * (1.0 + want.abs()),
            "{}({}) = {g}, want {want}",
            op.name(),
            x[i]
        );
    }
}

fn any(_: f64) -> bool {
    true
}

#[test]
fn float_kinds_match_their_definitions() {
    let a = || Attrs::new(17);
    check_float(relu, a(), any, |x| x.max(0.0), 1e-6);
    check_float(
        leaky_relu,
        a(),
        any,
        |x| if x < 0.0 { 0.01 * x } else { x },
        1e-6,
    );
    check_float(
        leaky_relu,
        a().with("alpha", AttrValue::Float(0.3)),
        any,
        |x| if x < 0.0 { 0.3 * x } else { x },
        1e-6,
    );
    check_float(sigmoid_op, a(), any, |x| 1.0 / (1.0 + (-x).exp()), 1e-6);
    check_float(tanh, a(), any, f64::tanh, 1e-6);
    check_float(erf, a(), any, erf_ref, 1e-6);
    let gelu_ref = |x: f64| 0.5 * x * (1.0 + erf_ref(x / 2f64.sqrt()));
    check_float(gelu, Attrs::new(20), any, gelu_ref, 1e-6);
    let gelu_tanh_ref = |x: f64| {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
    };
    check_float(
        gelu,
        Attrs::new(20).with("approximate", AttrValue::String("tanh".into())),
        any,
        gelu_tanh_ref,
        1e-6,
    );
    check_float(
        hard_sigmoid,
        a(),
        any,
        |x| (0.2 * x + 0.5).clamp(0.0, 1.0),
        1e-6,
    );
    check_float(
        hard_sigmoid,
        a().with("alpha", AttrValue::Float(0.5))
            .with("beta", AttrValue::Float(0.6)),
        any,
        |x| (0.5 * x + 0.6).clamp(0.0, 1.0),
        1e-6,
    );
    check_float(
        hard_swish,
        a(),
        any,
        |x| x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
        1e-6,
    );
    check_float(sqrt, a(), |x| x >= 0.0, f64::sqrt, 1e-6);
    check_float(exp, a(), |x| x < 20.0, f64::exp, 1e-6);
    check_float(log, a(), |x| x > 0.0, f64::ln, 1e-6);
    check_float(neg, a(), any, |x| -x, 0.0);
    check_float(reciprocal, a(), |x| x.abs() > 1e-3, |x| 1.0 / x, 1e-6);
    check_float(floor, a(), any, f64::floor, 0.0);
    check_float(ceil, a(), any, f64::ceil, 0.0);
    check_float(abs, a(), any, f64::abs, 0.0);
    check_float(
        sign_op,
        a(),
        any,
        |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        },
        0.0,
    );
    check_float(sin, a(), any, f64::sin, 1e-6);
    check_float(cos, a(), any, f64::cos, 1e-6);
    check_float(softplus_op, a(), any, |x| (x.exp() + 1.0).ln(), 1e-6);
    check_float(softsign, a(), any, |x| x / (1.0 + x.abs()), 1e-6);
    check_float(
        elu,
        a(),
        any,
        |x| if x < 0.0 { x.exp() - 1.0 } else { x },
        1e-6,
    );
    let (sa, sg) = (1.673_263_242_354_377_3, 1.050_700_987_355_480_5);
    check_float(
        selu,
        a(),
        any,
        |x| {
            if x <= 0.0 {
                sg * (sa * x.exp() - sa)
            } else {
                sg * x
            }
        },
        1e-6,
    );
    check_float(
        selu,
        a().with("alpha", AttrValue::Float(2.0))
            .with("gamma", AttrValue::Float(3.0)),
        any,
        |x| {
            if x <= 0.0 {
                3.0 * (2.0 * x.exp() - 2.0)
            } else {
                3.0 * x
            }
        },
        1e-6,
    );
}

#[test]
fn erf_approximation_is_accurate_everywhere() {
    let mut worst = 0.0f64;
    for i in -6000..=6000 {
        let x = i as f64 * 1e-3;
        let e = (erf_f32(x as f32) as f64 - erf_ref(x)).abs();
        worst = worst.max(e);
        if x.abs() < 0.1 && x != 0.0 {
            assert!(e / erf_ref(x).abs() < 1e-5, "relative error at {x}");
        }
    }
    assert!(worst < 1e-6, "erf max abs error {worst}");
    assert!(erf_f32(f32::NAN).is_nan());
    assert_eq!(erf_f32(f32::INFINITY), 1.0);
}

#[test]
fn fast_exp_and_tanh_are_accurate() {
    for i in -100_000..=100_000 {
        let x = i as f32 * 9e-4;
        let (e, t) = (exp_f32(x) as f64, tanh_f32(x) as f64);
        let (we, wt) = ((x as f64).exp(), (x as f64).tanh());
        let tiny = (x < -86.0 && e < 4e-38) || (we > f32::MAX as f64 && e.is_infinite());
        assert!(
            (e - we).abs() <= 3e-7 * we || tiny,
            "exp({x}) = {e}, want {we}"
        );
        assert!(
            (t - wt).abs() <= 2e-7 + 1e-6 * wt.abs(),
            "tanh({x}) = {t}, want {wt}"
        );
    }
    for x in [1e-6f32, -3e-5, 1e-3, 0.0] {
        let rel = ((tanh_f32(x) as f64 - (x as f64).tanh()) / (x as f64).tanh()).abs();
        assert!(x == 0.0 || rel < 1e-6, "tanh relative error at {x}");
    }
    assert_eq!(exp_f32(100.0), f32::INFINITY);
    assert_eq!(exp_f32(-100.0), 0.0);
    assert_eq!(exp_f32(-87.4), 0.0);
    assert!(exp_f32(-87.3) >= f32::MIN_POSITIVE);
    assert!(exp_f32(f32::NAN).is_nan() && tanh_f32(f32::NAN).is_nan());
    assert_eq!((tanh_f32(50.0), tanh_f32(-50.0)), (1.0, -1.0));
}

#[test]
fn round_is_half_to_even() {
    let op = build(round, Attrs::new(11));
    let x = Tensor::f32(&[8], vec![0.5, 1.5, 2.5, -0.5, -1.5, 2.3, -2.7, 3.5]);
    let got = run(op.as_ref(), &[x]);
    assert_eq!(
        got.as_f32().unwrap(),
        &[0.0, 2.0, 2.0, -0.0, -2.0, 2.0, -3.0, 4.0]
    );
}

#[test]
fn clip_attributes_and_inputs() {
    let x = Tensor::f32(&[2, 3], vec![-3.0, -1.0, 0.0, 1.0, 3.0, f32::NAN]);
    let old = Attrs::new(6)
        .with("min", AttrValue::Float(-1.5))
        .with("max", AttrValue::Float(2.0));
    let got = run(build(clip_op, old).as_ref(), &[x.clone()]);
    let g = got.as_f32().unwrap();
    assert_eq!(&g[..5], &[-1.5, -1.0, 0.0, 1.0, 2.0]);
    assert!(g[5].is_nan());

    let op = build(clip_op, Attrs::new(13));
    // No bounds: identity.
    let got = run(op.as_ref(), &[x.clone()]);
    assert_eq!(&got.as_f32().unwrap()[..5], &[-3.0, -1.0, 0.0, 1.0, 3.0]);
    // Only max, min omitted as an empty constant.
    let empty = Tensor::f32(&[0], vec![]);
    let got = run(
        op.as_ref(),
        &[x.clone(), empty, Tensor::f32(&[], vec![0.5])],
    );
    assert_eq!(&got.as_f32().unwrap()[..5], &[-3.0, -1.0, 0.0, 0.5, 0.5]);
    // min > max: everything becomes max.
    let got = run(
        op.as_ref(),
        &[
            x.clone(),
            Tensor::f32(&[], vec![2.0]),
            Tensor::f32(&[], vec![1.0]),
        ],
    );
    assert_eq!(&got.as_f32().unwrap()[..5], &[1.0; 5]);
    // Integers.
    let xi = Tensor::i64(&[5], vec![-7, -2, 0, 4, 9]);
    let got = run(
        op.as_ref(),
        &[xi, Tensor::i64(&[], vec![-2]), Tensor::i64(&[], vec![5])],
    );
    assert_eq!(got.data, Data::I64(vec![-2, -2, 0, 4, 5]));
    let xi = Tensor::new(vec![3], Data::I32(vec![-7, 3, 9]));
    let got = run(op.as_ref(), &[xi, Tensor::new(vec![], Data::I32(vec![0]))]);
    assert_eq!(got.data, Data::I32(vec![0, 3, 9]));
}

#[test]
fn integer_kinds() {
    let x = Tensor::i64(&[5], vec![-5, -1, 0, 2, i64::MIN]);
    let a = Attrs::new(14);
    assert_eq!(
        run(build(neg, a.clone()).as_ref(), &[x.clone()]).data,
        Data::I64(vec![5, 1, 0, -2, i64::MIN])
    );
    assert_eq!(
        run(build(abs, a.clone()).as_ref(), &[x.clone()]).data,
        Data::I64(vec![5, 1, 0, 2, i64::MIN])
    );
    assert_eq!(
        run(build(sign_op, a.clone()).as_ref(), &[x.clone()]).data,
        Data::I64(vec![-1, -1, 0, 1, -1])
    );
    assert_eq!(
        run(build(relu, a.clone()).as_ref(), &[x.clone()]).data,
        Data::I64(vec![0, 0, 0, 2, 0])
    );
    let x8 = Tensor::new(vec![3], Data::I8(vec![-128, -3, 4]));
    assert_eq!(
        run(build(abs, a.clone()).as_ref(), &[x8]).data,
        Data::I8(vec![-128, 3, 4])
    );
    // Float-only kinds refuse integers at inference.
    let m = TensorMeta::new(DType::I64, vec![3]);
    assert!(build(exp, a).infer(&[&m]).is_err());
}

#[test]
fn bool_outputs_and_not() {
    let x = Tensor::f32(
        &[5],
        vec![1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0],
    );
    let a = Attrs::new(20);
    assert_eq!(
        run(build(is_nan, a.clone()).as_ref(), &[x.clone()]).data,
        Data::Bool(vec![false, true, false, false, false])
    );
    assert_eq!(
        run(build(is_inf, a.clone()).as_ref(), &[x.clone()]).data,
        Data::Bool(vec![false, false, true, true, false])
    );
    let neg_only = a.clone().with("detect_positive", AttrValue::Int(0));
    assert_eq!(
        run(build(is_inf, neg_only).as_ref(), &[x.clone()]).data,
        Data::Bool(vec![false, false, false, true, false])
    );
    let pos_only = a.clone().with("detect_negative", AttrValue::Int(0));
    assert_eq!(
        run(build(is_inf, pos_only).as_ref(), &[x]).data,
        Data::Bool(vec![false, false, true, false, false])
    );
    let b = Tensor::new(vec![2, 2], Data::Bool(vec![true, false, false, true]));
    assert_eq!(
        run(build(not, a.clone()).as_ref(), &[b]).data,
        Data::Bool(vec![false, true, true, false])
    );
    assert!(build(not, a)
        .infer(&[&TensorMeta::new(DType::F32, vec![2])])
        .is_err());
}

#[test]
fn half_and_double_inputs() {
    let a = Attrs::new(13);
    let x = Tensor::new(vec![3], Data::F64(vec![-1.0, 0.25, 4.0]));
    assert_eq!(
        run(build(sqrt, a.clone()).as_ref(), &[x.clone()])
            .data
            .get_f64(2),
        2.0
    );
    assert_eq!(
        run(build(relu, a.clone()).as_ref(), &[x]).data,
        Data::F64(vec![0.0, 0.25, 4.0])
    );
    let h = Tensor::new(
        vec![2],
        Data::F16(vec![f16::from_f32(-2.0), f16::from_f32(3.0)]),
    );
    let got = run(build(neg, a).as_ref(), &[h]);
    assert_eq!(
        got.data,
        Data::F16(vec![f16::from_f32(2.0), f16::from_f32(-3.0)])
    );
}

#[test]
fn large_tensor_parallel_path_and_scalar() {
    let (rows, cols) = (3, 100_001);
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i % 1000) as f32 - 500.0) * 0.01)
        .collect();
    let op = build(sigmoid_op, Attrs::new(13));
    let got = run(op.as_ref(), &[Tensor::f32(&[rows, cols], x.clone())]);
    for (i, g) in got.as_f32().unwrap().iter().enumerate() {
        let want = 1.0 / (1.0 + (-(x[i] as f64)).exp());
        assert!((*g as f64 - want).abs() < 1e-6);
    }
    // Rank 0: not splittable, one row.
    let s = Tensor::f32(&[], vec![-2.0]);
    let op = build(abs, Attrs::new(13));
    let m = [TensorMeta::new(DType::F32, vec![])];
    assert_eq!(op.split_axis(&[&m[0]], &m), None);
    assert_eq!(run(op.as_ref(), &[s]).as_f32().unwrap(), &[2.0]);
    // Empty tensor.
    let e = Tensor::f32(&[0, 3], vec![]);
    assert_eq!(run(op.as_ref(), &[e]).numel(), 0);
}

#[test]
fn gpu_descriptions() {
    let m = TensorMeta::new(DType::F32, vec![5, 7]);
    let out = [m.clone()];
    let op = build(gelu, Attrs::new(20));
    let k = op.gpu(&[&m], &out, 3..30).unwrap();
    assert_eq!(k.len(), 1);
    assert_eq!(k[0].shader.name, "unary");
    let p: &UnaryParams = bytemuck::from_bytes(&k[0].params);
    assert_eq!((p.start, p.count), (3, 27));
    let (op, mode) = (k[0].override_value("OP"), k[0].override_value("MODE"));
    assert_eq!((op, mode), (Some(UnaryKind::Gelu as u32 as f64), Some(0.0)));
    // Run-time Clip bounds become Max/Min dispatches of binary.wgsl.
    let clip = build(clip_op, Attrs::new(13));
    let lo = TensorMeta::new(DType::F32, vec![]);
    let k = clip.gpu(&[&m, &lo, &lo], &out, 0..35).unwrap();
    assert_eq!(k.len(), 2);
    assert_eq!(
        (k[0].shader.name, k[0].inputs.clone()),
        ("binary", vec![0, 1])
    );
    assert_eq!(k[1].inputs, vec![2, 2]);
    let empty = TensorMeta::constant(Tensor::f32(&[0], vec![]));
    assert_eq!(clip.gpu(&[&m, &empty, &lo], &out, 0..35).unwrap().len(), 1);
    let lo = TensorMeta::constant(Tensor::f32(&[], vec![-1.0]));
    let k = clip.gpu(&[&m, &lo], &out, 0..35).unwrap();
    let p: &UnaryParams = bytemuck::from_bytes(&k[0].params);
    assert_eq!((p.alpha, p.beta, p.imin), (-1.0, f32::INFINITY, -1));
    // Float-only kinds refuse integers on the GPU too.
    let mi = TensorMeta::new(DType::I64, vec![4]);
    assert!(build(exp, Attrs::new(13))
        .gpu(&[&mi], &[mi.clone()], 0..4)
        .is_err());
    assert!(build(neg, Attrs::new(13))
        .gpu(&[&mi], &[mi.clone()], 0..4)
        .is_ok());
}

/// Throughput probe (run with `--ignored --nocapture`): ms per 16M-element f32 unary op.
#[test]
#[ignore]
fn unary_throughput_probe() {
    let n = 1 << 24;
    let x = Tensor::f32(
        &[n],
        (0..n)
            .map(|i| ((i % 2000) as f32 - 1000.0) * 0.004)
            .collect(),
    );
    type Ctor = fn(&Attrs) -> Result<Box<dyn Op>>;
    let ctors: [(&str, Ctor); 6] = [
        ("Relu", relu),
        ("Sigmoid", sigmoid_op),
        ("Tanh", tanh),
        ("Erf", erf),
        ("Gelu", gelu),
        ("Exp", exp),
    ];
    let op_meta = TensorMeta::new(DType::F32, vec![n]);
    let src = x.as_f32().unwrap()[..1 << 20].to_vec();
    let mut dst = vec![0f32; src.len()];
    for round in 0..3 {
        let t = std::time::Instant::now();
        par_map(&src[..], &mut dst[..], f32::exp);
        let libm = t.elapsed();
        let t = std::time::Instant::now();
        par_map(&src[..], &mut dst[..], exp_f32);
        let fast = t.elapsed();
        let t = std::time::Instant::now();
        par_map(&src[..], &mut dst[..], f32::tanh);
        let libm_t = t.elapsed();
        let t = std::time::Instant::now();
        par_map(&src[..], &mut dst[..], tanh_f32);
        let fast_t = t.elapsed();
        println!(
            "round {round}: exp libm {libm:?} fast {fast:?}; tanh libm {libm_t:?} fast {fast_t:?}"
        );
    }
    for (name, ctor) in ctors {
        let op = build(ctor, Attrs::new(20));
        let mut outs = vec![Tensor::zeros(DType::F32, &[n])];
        op.cpu(&[&x], &mut outs, 0..n).unwrap();
        let t = std::time::Instant::now();
        for _ in 0..5 {
            op.cpu(&[&x], &mut outs, 0..n).unwrap();
        }
        let s = t.elapsed().as_secs_f64() / 5.0;
        let _ = &op_meta;
        println!(
            "{name}: {:.2} ms, {:.1} GB/s",
            s * 1e3,
            (8 * n) as f64 / s / 1e9
        );
    }
}
