//! CPU tests of the binary and variadic operators against a naive broadcasting reference
//! (full index decomposition per element) and hand-worked ONNX examples.

#![allow(clippy::cloned_ref_to_slice_refs, clippy::needless_range_loop)]

use super::*;
use crate::AttrValue;

type Ctor = fn(&Attrs) -> Result<Box<dyn Op>>;

fn run_rows(op: &dyn Op, ins: &[Tensor], rows: Option<Range<usize>>) -> Tensor {
    let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let om = op.infer(&refs).unwrap();
    let axis = op.split_axis(&refs, &om);
    let n = shape::row_count(&om[0].shape, axis);
    let mut outs = vec![Tensor::zeros(om[0].dtype, &om[0].shape)];
    let ins: Vec<&Tensor> = ins.iter().collect();
    op.cpu(&ins, &mut outs, rows.unwrap_or(0..n)).unwrap();
    outs.remove(0)
}

fn run(ctor: Ctor, ins: &[Tensor]) -> Tensor {
    run_rows(ctor(&Attrs::new(14)).unwrap().as_ref(), ins, None)
}

/// Element of `t` (shape `s`) at output index `idx` under numpy broadcasting.
fn at(s: &[usize], idx: &[usize]) -> usize {
    let off = idx.len() - s.len();
    s.iter().enumerate().fold(0, |flat, (d, &n)| {
        flat * n + if n == 1 { 0 } else { idx[off + d] }
    })
}

/// Naive reference for any number of f32 operands.
fn naive(
    shapes: &[&[usize]],
    vals: &[&[f32]],
    out: &[usize],
    f: impl Fn(&[f32]) -> f32,
) -> Vec<f32> {
    (0..shape::numel(out))
        .map(|mut i| {
            let mut idx = vec![0; out.len()];
            for d in (0..out.len()).rev() {
                idx[d] = i % out[d];
                i /= out[d];
            }
            let xs: Vec<f32> = shapes
                .iter()
                .zip(vals)
                .map(|(s, v)| v[at(s, &idx)])
                .collect();
            f(&xs)
        })
        .collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(40503));
            ((h >> 8) % 2001) as f32 / 250.0 - 4.0
        })
        .collect()
}

const SHAPES: &[(&[usize], &[usize])] = &[
    (&[2, 3, 4], &[2, 3, 4]),
    (&[2, 3, 4], &[4]),
    (&[2, 1, 4], &[3, 1]),
    (&[1, 3, 1, 5], &[2, 1, 7, 1]),
    (&[], &[5]),
    (&[6], &[]),
    (&[3, 1], &[1, 1]),
];

fn check_f32(ctor: Ctor, f: impl Fn(f32, f32) -> f32) {
    check_f32_on(ctor, SHAPES, f)
}

fn check_f32_on(ctor: Ctor, shapes: &[(&[usize], &[usize])], f: impl Fn(f32, f32) -> f32) {
    for &(sa, sb) in shapes {
        let out = shape::broadcast_shapes(&[sa, sb]).unwrap();
        let (a, b) = (values(shape::numel(sa), 1), values(shape::numel(sb), 2));
        let want = naive(&[sa, sb], &[&a, &b], &out, |x| f(x[0], x[1]));
        let op = ctor(&Attrs::new(14)).unwrap();
        let n = want.len();
        let rows = if n > 2 { 1..n - 1 } else { 0..n };
        let got = run_rows(
            op.as_ref(),
            &[Tensor::f32(sa, a), Tensor::f32(sb, b)],
            Some(rows.clone()),
        );
        assert_eq!(got.shape, out);
        for (i, (&g, &w)) in got.as_f32().unwrap().iter().zip(&want).enumerate() {
            let w = if rows.contains(&i) || n == 1 { w } else { 0.0 };
            assert!(
                g == w || (g - w).abs() <= 1e-5 * w.abs() || (g.is_nan() && w.is_nan()),
                "{} {sa:?} {sb:?} at {i}: {g} vs {w}",
                op.name()
            );
        }
    }
}

#[test]
fn float_arithmetic_broadcasts_like_numpy() {
    check_f32(add, |x, y| x + y);
    check_f32(sub, |x, y| x - y);
    check_f32(mul, |x, y| x * y);
    check_f32(div, |x, y| x / y);
    check_f32(pow, |x, y| (x as f64).powf(y as f64) as f32);
    check_f32(max, |x, y| if x > y { x } else { y });
    check_f32(min, |x, y| if x < y { x } else { y });
    // PRelu: the slope broadcasts to X only.
    let prelu_shapes: &[(&[usize], &[usize])] = &[
        (&[2, 3, 4], &[2, 3, 4]),
        (&[2, 3, 4], &[4]),
        (&[2, 3, 4], &[3, 1]),
        (&[5], &[]),
    ];
    check_f32_on(prelu, prelu_shapes, |x, s| if x < 0.0 { x * s } else { x });
    check_f32(fmod_op, |x, y| (x as f64 % y as f64) as f32);
    check_f32(mod_float, |x, y| {
        let r = x as f64 - (x as f64 / y as f64).floor() * y as f64;
        r as f32
    });
}

fn fmod_op(_: &Attrs) -> Result<Box<dyn Op>> {
    modulo(&Attrs::new(13).with("fmod", AttrValue::Int(1)))
}

fn mod_float(_: &Attrs) -> Result<Box<dyn Op>> {
    modulo(&Attrs::new(13))
}

#[test]
fn integer_arithmetic_is_c_like() {
    let a = Tensor::i64(&[6], vec![-7, 7, -7, 7, 5, i64::MAX]);
    let b = Tensor::i64(&[6], vec![2, -2, 3, -3, 0, 1]);
    assert_eq!(
        run(div, &[a.clone(), b.clone()]).data,
        Data::I64(vec![-3, -3, -2, -2, 0, i64::MAX])
    );
    assert_eq!(
        run(mod_float, &[a.clone(), b.clone()]).data,
        Data::I64(vec![1, -1, 2, -2, 0, 0])
    );
    assert_eq!(
        run(fmod_op, &[a.clone(), b.clone()]).data,
        Data::I64(vec![-1, 1, -1, 1, 0, 0])
    );
    assert_eq!(
        run(add, &[a.clone(), b.clone()]).data,
        Data::I64(vec![-5, 5, -4, 4, 5, i64::MIN])
    );
    assert_eq!(
        run(mul, &[a.clone(), Tensor::i64(&[], vec![3])])
            .data
            .get_i64(0),
        -21
    );
    let s = Tensor::i64(&[3], vec![2, -2, 1]);
    assert_eq!(
        run(pow, &[s, Tensor::i64(&[3], vec![10, 3, -4])]).data,
        Data::I64(vec![1024, -8, 1])
    );
    let x = Tensor::new(vec![2, 2], Data::I32(vec![1, -2, 3, -4]));
    let y = Tensor::new(vec![2], Data::I32(vec![10, 20]));
    assert_eq!(
        run(sub, &[x.clone(), y.clone()]).data,
        Data::I32(vec![-9, -22, -7, -24])
    );
    assert_eq!(
        run(max, &[x.clone(), y]).data,
        Data::I32(vec![10, 20, 10, 20])
    );
    let u = Tensor::new(vec![2], Data::U8(vec![250, 3]));
    assert_eq!(run(add, &[u.clone(), u]).data, Data::U8(vec![244, 6]));
}

#[test]
fn pow_with_mixed_types() {
    let x = Tensor::f32(&[3], vec![1.5, -2.0, 4.0]);
    let e = Tensor::i64(&[3], vec![2, 3, -1]);
    assert_eq!(run(pow, &[x, e]).data, Data::F32(vec![2.25, -8.0, 0.25]));
    let xi = Tensor::i64(&[3], vec![1, 2, 3]);
    let ef = Tensor::f32(&[3], vec![4.0, 5.0, 6.0]);
    assert_eq!(run(pow, &[xi, ef]).data, Data::I64(vec![1, 32, 729]));
}

#[test]
fn comparisons_and_logic() {
    let a = Tensor::f32(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, f32::NAN]);
    let b = Tensor::f32(&[3], vec![3.0, 2.0, 1.0]);
    let t = |v: [u8; 6]| Data::Bool(v.iter().map(|&x| x == 1).collect());
    assert_eq!(
        run(equal, &[a.clone(), b.clone()]).data,
        t([0, 1, 0, 0, 0, 0])
    );
    assert_eq!(
        run(less, &[a.clone(), b.clone()]).data,
        t([1, 0, 0, 0, 0, 0])
    );
    assert_eq!(
        run(greater, &[a.clone(), b.clone()]).data,
        t([0, 0, 1, 1, 1, 0])
    );
    assert_eq!(
        run(less_or_equal, &[a.clone(), b.clone()]).data,
        t([1, 1, 0, 0, 0, 0])
    );
    assert_eq!(run(greater_or_equal, &[a, b]).data, t([0, 1, 1, 1, 1, 0]));
    let ai = Tensor::i64(&[3], vec![-1, 0, 5]);
    assert_eq!(
        run(less, &[ai.clone(), Tensor::i64(&[], vec![0])]).data,
        Data::Bool(vec![true, false, false])
    );
    let ai32 = Tensor::new(vec![1], Data::I32(vec![7]));
    assert_eq!(
        run(equal, &[ai32.clone(), ai32]).data,
        Data::Bool(vec![true])
    );
    let p = Tensor::new(vec![4], Data::Bool(vec![true, true, false, false]));
    let q = Tensor::new(vec![4], Data::Bool(vec![true, false, true, false]));
    assert_eq!(
        run(and, &[p.clone(), q.clone()]).data,
        Data::Bool(vec![true, false, false, false])
    );
    assert_eq!(
        run(or, &[p.clone(), q.clone()]).data,
        Data::Bool(vec![true, true, true, false])
    );
    assert_eq!(
        run(xor, &[p.clone(), q.clone()]).data,
        Data::Bool(vec![false, true, true, false])
    );
    assert_eq!(
        run(equal, &[p, q]).data,
        Data::Bool(vec![true, false, false, true])
    );
}

#[test]
fn variadic_sum_mean_max_min() {
    let (sa, sb, sc): (&[usize], &[usize], &[usize]) = (&[2, 1, 3], &[4, 1], &[3]);
    let (a, b, c) = (values(6, 3), values(4, 4), values(3, 5));
    let out = vec![2, 4, 3];
    let ts = || {
        vec![
            Tensor::f32(sa, a.clone()),
            Tensor::f32(sb, b.clone()),
            Tensor::f32(sc, c.clone()),
        ]
    };
    let check = |ctor: Ctor, f: &dyn Fn(&[f32]) -> f32| {
        let want = naive(&[sa, sb, sc], &[&a, &b, &c], &out, f);
        let got = run_rows(ctor(&Attrs::new(13)).unwrap().as_ref(), &ts(), Some(5..24));
        for (i, (&g, &w)) in got.as_f32().unwrap().iter().zip(&want).enumerate() {
            let w = if i >= 5 { w } else { 0.0 };
            assert!((g - w).abs() <= 1e-5, "at {i}: {g} vs {w}");
        }
    };
    check(sum, &|x| x[0] + x[1] + x[2]);
    check(mean, &|x| (x[0] + x[1] + x[2]) / 3.0);
    check(max, &|x| x[0].max(x[1]).max(x[2]));
    check(min, &|x| x[0].min(x[1]).min(x[2]));
    // One input: a copy.
    let one = Tensor::f32(&[2], vec![1.0, -2.0]);
    assert_eq!(run(mean, &[one.clone()]).data, one.data);
    assert_eq!(run(max, &[one.clone()]).data, one.data);
    // NaN propagates through Max/Min.
    let n = Tensor::f32(&[2], vec![f32::NAN, 1.0]);
    let m = run(max, &[one.clone(), n.clone(), one.clone()]);
    assert!(m.as_f32().unwrap()[0].is_nan());
    assert!(run(min, &[n, one]).as_f32().unwrap()[0].is_nan());
    // Integer Max with 4 operands.
    let i = |v: i64| Tensor::i64(&[1], vec![v]);
    assert_eq!(
        run(max, &[i(3), i(-1), i(9), i(2)]).data,
        Data::I64(vec![9])
    );
    assert!(sum(&Attrs::new(13)).unwrap().infer(&[]).is_err());
}

#[test]
fn large_contiguous_and_bias_patterns() {
    let (r, c) = (301, 1029);
    let a = values(r * c, 7);
    let b = values(c, 8);
    let col = values(r, 9);
    let got = run(
        add,
        &[
            Tensor::f32(&[r, c], a.clone()),
            Tensor::f32(&[c], b.clone()),
        ],
    );
    let got2 = run(
        mul,
        &[
            Tensor::f32(&[r, 1], col.clone()),
            Tensor::f32(&[r, c], a.clone()),
        ],
    );
    let got3 = run(
        sub,
        &[
            Tensor::f32(&[r, c], a.clone()),
            Tensor::f32(&[r, c], a.clone()),
        ],
    );
    for i in 0..r {
        for j in 0..c {
            let k = i * c + j;
            assert_eq!(got.as_f32().unwrap()[k], a[k] + b[j]);
            assert_eq!(got2.as_f32().unwrap()[k], col[i] * a[k]);
            assert_eq!(got3.as_f32().unwrap()[k], 0.0);
        }
    }
}

#[test]
fn shape_and_type_errors() {
    let f = |s: &[usize]| TensorMeta::new(DType::F32, s.to_vec());
    let op = add(&Attrs::new(14)).unwrap();
    assert!(op.infer(&[&f(&[2, 3]), &f(&[4, 3])]).is_err());
    assert!(op
        .infer(&[&f(&[2]), &TensorMeta::new(DType::I64, vec![2])])
        .is_err());
    assert!(op.infer(&[&f(&[2])]).is_err());
    let b = TensorMeta::new(DType::Bool, vec![2]);
    assert!(op.infer(&[&b, &b]).is_err());
    assert!(and(&Attrs::new(7))
        .unwrap()
        .infer(&[&f(&[2]), &f(&[2])])
        .is_err());
    assert!(prelu(&Attrs::new(16))
        .unwrap()
        .infer(&[&f(&[3]), &f(&[2, 3])])
        .is_err());
    assert!(modulo(&Attrs::new(13).with("fmod", AttrValue::Int(2))).is_err());
    assert_eq!(op.split_axis(&[&f(&[]), &f(&[])], &[f(&[])]), None);
    assert_eq!(
        op.split_axis(&[&f(&[2, 3]), &f(&[3])], &[f(&[2, 3])]),
        Some(1)
    );
}

#[test]
fn gpu_descriptions() {
    let f = |s: &[usize]| TensorMeta::new(DType::F32, s.to_vec());
    let (a, b, c) = (f(&[2, 3]), f(&[3]), f(&[2, 1]));
    let out = [f(&[2, 3])];
    let k = mean(&Attrs::new(13))
        .unwrap()
        .gpu(&[&a, &b, &c], &out, 1..5)
        .unwrap();
    assert_eq!(k.len(), 2);
    assert_eq!(
        (k[0].inputs.clone(), k[1].inputs.clone()),
        (vec![0, 1], vec![2, 2])
    );
    // The op, element mode, flags and rank are overrides (a pipeline each).
    let ov = |k: &GpuKernel, name| k.override_value(name).unwrap() as u32;
    let p0: &BinaryParams = bytemuck::from_bytes(&k[0].params);
    let p1: &BinaryParams = bytemuck::from_bytes(&k[1].params);
    assert_eq!((p0.start, p0.count, ov(&k[0], "FLAGS")), (1, 4, 0));
    assert_eq!(ov(&k[1], "FLAGS"), FLAG_ACCUMULATE | FLAG_DIVIDE);
    assert_eq!(
        (ov(&k[0], "OP"), ov(&k[0], "RANK")),
        (BinaryKind::Add as u32, 2)
    );
    assert_eq!(p1.divisor, 3.0);
    assert_eq!(&p0.dims[..2], &[2, 3]);
    assert_eq!(&p0.b_strides[..2], &[0, 1]);
    assert_eq!(&p1.b_strides[..2], &[1, 0]);
    let k = add(&Attrs::new(14))
        .unwrap()
        .gpu(&[&a, &a], &out, 0..6)
        .unwrap();
    // Same-shape operands: one merged dim of stride 1.
    let p: &BinaryParams = bytemuck::from_bytes(&k[0].params);
    assert_eq!((ov(&k[0], "FLAGS"), ov(&k[0], "RANK")), (0, 1));
    assert_eq!((p.dims[0], p.a_strides[0], p.b_strides[0]), (6, 1, 1));
    let i = TensorMeta::new(DType::I64, vec![3]);
    let k = pow(&Attrs::new(15))
        .unwrap()
        .gpu(&[&b, &i], &[b.clone()], 0..3)
        .unwrap();
    let mode_flags = (ov(&k[0], "MODE"), ov(&k[0], "FLAGS") & FLAG_B_OTHER);
    assert_eq!(mode_flags, (0, FLAG_B_OTHER));
    let k = pow(&Attrs::new(15))
        .unwrap()
        .gpu(&[&i, &b], &[i.clone()], 0..3)
        .unwrap();
    let mode_flags = (ov(&k[0], "MODE"), ov(&k[0], "FLAGS") & FLAG_B_OTHER);
    assert_eq!(mode_flags, (1, FLAG_B_OTHER));
    let bo = TensorMeta::new(DType::Bool, vec![3]);
    assert!(pow(&Attrs::new(15))
        .unwrap()
        .gpu(&[&b, &bo], &[b.clone()], 0..3)
        .is_err());
    let u = TensorMeta::new(DType::U8, vec![3]);
    let k = add(&Attrs::new(14))
        .unwrap()
        .gpu(&[&u, &u], &[u.clone()], 0..3)
        .unwrap();
    let mode_flags = (ov(&k[0], "MODE"), ov(&k[0], "FLAGS") & FLAG_WRAP_U8);
    assert_eq!(mode_flags, (1, FLAG_WRAP_U8));
    let i8m = TensorMeta::new(DType::I8, vec![3]);
    let k = less(&Attrs::new(13))
        .unwrap()
        .gpu(&[&i8m, &i8m], &[bo.clone()], 0..3)
        .unwrap();
    let mode_flags = (ov(&k[0], "MODE"), ov(&k[0], "FLAGS") & FLAG_WRAP_I8);
    assert_eq!(mode_flags, (1, FLAG_WRAP_I8));
}

/// Throughput probe (run with `--ignored --nocapture`): prints GB/s of the f32 fast paths.
#[test]
#[ignore]
fn throughput_probe() {
    let n = 1 << 24;
    let a = Tensor::f32(&[n / 1024, 1024], values(n, 1));
    let b = Tensor::f32(&[n / 1024, 1024], values(n, 2));
    let bias = Tensor::f32(&[1024], values(1024, 3));
    for (name, ins) in [
        ("Add same", vec![a.clone(), b.clone()]),
        ("Add bias", vec![a.clone(), bias]),
    ] {
        let op = add(&Attrs::new(14)).unwrap();
        let _ = run_rows(op.as_ref(), &ins, None);
        let t = std::time::Instant::now();
        for _ in 0..10 {
            let _ = run_rows(op.as_ref(), &ins, None);
        }
        let s = t.elapsed().as_secs_f64() / 10.0;
        let bytes = (ins.iter().map(|t| t.numel()).sum::<usize>() + n) * 4;
        println!(
            "{name}: {:.2} ms, {:.1} GB/s (incl. output alloc)",
            s * 1e3,
            bytes as f64 / s / 1e9
        );
    }
}
