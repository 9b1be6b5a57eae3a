//! CPU tests of the reductions against naive nested-loop references.

use super::*;
use crate::{AttrValue, Attrs, Op};

/// Naive reduction over the axes flagged in `red`, keepdims, in f64.
fn naive(x: &[f32], shape: &[usize], red: &[bool], f: &dyn Fn(&[f64]) -> f64) -> Vec<f32> {
    let out_shape: Vec<usize> = shape
        .iter()
        .zip(red)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let on: usize = out_shape.iter().product();
    let st = crate::shape::strides(shape);
    let ost = crate::shape::strides(&out_shape);
    let mut groups = vec![Vec::new(); on];
    for (i, &v) in x.iter().enumerate() {
        let mut o = 0;
        for d in 0..shape.len() {
            let idx = i / st[d] % shape[d];
            if !red[d] {
                o += idx * ost[d];
            }
        }
        groups[o].push(v as f64);
    }
    groups.iter().map(|g| f(g) as f32).collect()
}

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 29 % 17) as f32 - 8.0) * 0.25)
        .collect()
}

/// Run on the CPU, in two halves split at `cut` rows when given.
fn run(op: &dyn Op, ins: &[Tensor], cut: Option<usize>) -> Tensor {
    let metas: Vec<TensorMeta> = ins
        .iter()
        .map(|t| TensorMeta::constant(t.clone()))
        .collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let om = op.infer(&refs).unwrap();
    let mut out = vec![Tensor::zeros(om[0].dtype, &om[0].shape)];
    let rows = crate::shape::row_count(&om[0].shape, op.split_axis(&refs, &om));
    let tr: Vec<&Tensor> = ins.iter().collect();
    match cut {
        Some(c) => {
            op.cpu(&tr, &mut out, 0..c).unwrap();
            op.cpu(&tr, &mut out, c..rows).unwrap();
        }
        None => op.cpu(&tr, &mut out, 0..rows).unwrap(),
    }
    out.remove(0)
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x - y).abs() <= 1e-4 + 1e-4 * y.abs() || (x.is_nan() && y.is_nan()) || x == y;
        assert!(ok, "at {i}: {x} vs {y}");
    }
}

type Make = fn(&Attrs) -> Result<Box<dyn Op>>;
type Naive = Box<dyn Fn(&[f64]) -> f64>;

fn kinds() -> Vec<(Make, i64, Naive)> {
    vec![
        (reduce_sum, 13, Box::new(|g| g.iter().sum())),
        (
            reduce_mean,
            18,
            Box::new(|g| g.iter().sum::<f64>() / g.len() as f64),
        ),
        (
            reduce_max,
            18,
            Box::new(|g| g.iter().cloned().fold(f64::NEG_INFINITY, f64::max)),
        ),
        (
            reduce_min,
            18,
            Box::new(|g| g.iter().cloned().fold(f64::INFINITY, f64::min)),
        ),
        (reduce_prod, 18, Box::new(|g| g.iter().product())),
        (reduce_l1, 18, Box::new(|g| g.iter().map(|v| v.abs()).sum())),
        (
            reduce_l2,
            18,
            Box::new(|g| g.iter().map(|v| v * v).sum::<f64>().sqrt()),
        ),
        (
            reduce_sum_square,
            18,
            Box::new(|g| g.iter().map(|v| v * v).sum()),
        ),
        (reduce_log_sum, 18, Box::new(|g| g.iter().sum::<f64>().ln())),
        (
            reduce_log_sum_exp,
            18,
            Box::new(|g| g.iter().map(|v| v.exp()).sum::<f64>().ln()),
        ),
    ]
}

#[test]
fn every_reduction_matches_naive_for_axis_sets_and_splits() {
    let shape = [3, 4, 5, 2];
    let x = Tensor::f32(&shape, data(120));
    let axis_sets: [&[i64]; 6] = [&[-1], &[1], &[0], &[1, 2], &[0, 2], &[0, 1, 2, 3]];
    for (make, input_since, f) in kinds() {
        for axes in axis_sets {
            let red: Vec<bool> = (0..4)
                .map(|d| axes.iter().any(|&a| a.rem_euclid(4) == d))
                .collect();
            let want = naive(x.as_f32().unwrap(), &shape, &red, &*f);
            // Axes as input (new opset) and as attribute (old opset).
            let op_new = make(&Attrs::new(input_since)).unwrap();
            let axes_t = Tensor::i64(&[axes.len()], axes.to_vec());
            let got = run(&*op_new, &[x.clone(), axes_t.clone()], None);
            close(got.as_f32().unwrap(), &want);
            let op_old =
                make(&Attrs::new(input_since - 2).with("axes", AttrValue::Ints(axes.to_vec())))
                    .unwrap();
            let got = run(&*op_old, std::slice::from_ref(&x), Some(1));
            close(got.as_f32().unwrap(), &want);
            assert_eq!(got.shape.len(), 4);
        }
    }
}

#[test]
fn keepdims_zero_drops_axes_and_empty_axes_reduce_all_or_noop() {
    let x = Tensor::f32(&[2, 3], vec![1., 2., 3., 4., 5., 6.]);
    let op = reduce_sum(&Attrs::new(13).with("keepdims", AttrValue::Int(0))).unwrap();
    let y = run(&*op, &[x.clone(), Tensor::i64(&[1], vec![1])], None);
    assert_eq!(y.shape, vec![2]);
    assert_eq!(y.as_f32().unwrap(), &[6., 15.]);
    // No axes input: reduce everything to a scalar.
    let y = run(&*op, std::slice::from_ref(&x), None);
    assert_eq!(y.shape, Vec::<usize>::new());
    assert_eq!(y.as_f32().unwrap(), &[21.]);
    // Empty axes with noop_with_empty_axes: identity.
    let op = reduce_sum(&Attrs::new(13).with("noop_with_empty_axes", AttrValue::Int(1))).unwrap();
    let y = run(&*op, &[x.clone(), Tensor::i64(&[0], vec![])], None);
    assert_eq!(y.shape, vec![2, 3]);
    assert_eq!(y.as_f32().unwrap(), x.as_f32().unwrap());
}

#[test]
fn empty_reduction_gives_identities() {
    let x = Tensor::f32(&[2, 0, 3], vec![]);
    let axes = Tensor::i64(&[1], vec![1]);
    let y = run(
        &*reduce_sum(&Attrs::new(13)).unwrap(),
        &[x.clone(), axes.clone()],
        None,
    );
    assert_eq!(y.as_f32().unwrap(), &[0.0; 6]);
    let y = run(
        &*reduce_prod(&Attrs::new(18)).unwrap(),
        &[x.clone(), axes.clone()],
        None,
    );
    assert_eq!(y.as_f32().unwrap(), &[1.0; 6]);
    let y = run(
        &*reduce_log_sum_exp(&Attrs::new(18)).unwrap(),
        &[x, axes],
        None,
    );
    assert!(y.as_f32().unwrap().iter().all(|v| *v == f32::NEG_INFINITY));
}

#[test]
fn log_sum_exp_is_stable() {
    let x = Tensor::f32(&[1, 2], vec![1000.0, 1000.0]);
    let y = run(&*reduce_log_sum_exp(&Attrs::new(13)).unwrap(), &[x], None);
    close(y.as_f32().unwrap(), &[1000.0 + 2f32.ln()]);
}

#[test]
fn integer_sum_max_min() {
    let x = Tensor::i64(&[2, 3], vec![1, -7, 3, 4, 5, -6]);
    let axes = Tensor::i64(&[1], vec![1]);
    let y = run(
        &*reduce_sum(&Attrs::new(13)).unwrap(),
        &[x.clone(), axes.clone()],
        None,
    );
    assert_eq!(y.to_i64_vec(), vec![-3, 3]);
    let y = run(
        &*reduce_max(&Attrs::new(18)).unwrap(),
        &[x.clone(), axes.clone()],
        None,
    );
    assert_eq!(y.to_i64_vec(), vec![3, 5]);
    let y = run(&*reduce_min(&Attrs::new(18)).unwrap(), &[x, axes], None);
    assert_eq!(y.to_i64_vec(), vec![-7, -6]);
}

#[test]
fn argmax_argmin_follow_ties_and_axes() {
    // [2, 3]: ties in the first row.
    let x = Tensor::f32(&[2, 3], vec![5., 1., 5., 0., 2., 0.]);
    let op = arg_max(&Attrs::new(13).with("axis", AttrValue::Int(1))).unwrap();
    let y = run(&*op, std::slice::from_ref(&x), None);
    assert_eq!(y.shape, vec![2, 1]);
    assert_eq!(y.to_i64_vec(), vec![0, 1]);
    let op = arg_max(
        &Attrs::new(13)
            .with("axis", AttrValue::Int(1))
            .with("select_last_index", AttrValue::Int(1)),
    )
    .unwrap();
    assert_eq!(
        run(&*op, std::slice::from_ref(&x), None).to_i64_vec(),
        vec![2, 1]
    );
    let op = arg_min(&Attrs::new(13).with("keepdims", AttrValue::Int(0))).unwrap();
    let y = run(&*op, std::slice::from_ref(&x), Some(2));
    assert_eq!(y.shape, vec![3]);
    assert_eq!(y.to_i64_vec(), vec![1, 0, 1]);
    let op = arg_min(&Attrs::new(13).with("select_last_index", AttrValue::Int(1))).unwrap();
    assert_eq!(run(&*op, &[x], None).to_i64_vec(), vec![1, 0, 1]);
}

#[test]
fn non_constant_axes_input_is_unsupported_at_plan_time() {
    let op = reduce_mean(&Attrs::new(18)).unwrap();
    let x = TensorMeta::new(DType::F32, vec![2, 3]);
    let axes = TensorMeta::new(DType::I64, vec![1]);
    assert!(matches!(
        op.infer(&[&x, &axes]),
        Err(OpError::Unsupported(_))
    ));
    let op = reduce_mean(&Attrs::new(13).with("axes", AttrValue::Ints(vec![2]))).unwrap();
    assert!(matches!(op.infer(&[&x]), Err(OpError::Invalid(_))));
}

#[test]
fn f64_and_bool_reductions() {
    let x = Tensor::new(vec![2, 2], Data::F64(vec![1.0, 2.0, 3.0, 4.0]));
    let axes = Tensor::i64(&[1], vec![1]);
    let y = run(
        &*reduce_log_sum_exp(&Attrs::new(18)).unwrap(),
        &[x, axes.clone()],
        None,
    );
    let want = [
        (1f64.exp() + 2f64.exp()).ln(),
        (3f64.exp() + 4f64.exp()).ln(),
    ];
    let got = y.to_f64_vec();
    assert_eq!(y.dtype(), DType::F64);
    assert!((got[0] - want[0]).abs() < 1e-12 && (got[1] - want[1]).abs() < 1e-12);
    let b = Tensor::new(vec![2, 2], Data::Bool(vec![true, false, false, false]));
    let y = run(
        &*reduce_max(&Attrs::new(20)).unwrap(),
        &[b, axes.clone()],
        None,
    );
    assert_eq!(y.data, Data::Bool(vec![true, false]));
    let b = Tensor::new(vec![2, 2], Data::Bool(vec![true, true, true, false]));
    let y = run(
        &*reduce_min(&Attrs::new(20)).unwrap(),
        &[b.clone(), axes.clone()],
        None,
    );
    assert_eq!(y.data, Data::Bool(vec![true, false]));
    let m = TensorMeta::constant(b);
    let a = TensorMeta::constant(axes);
    assert!(reduce_sum(&Attrs::new(13))
        .unwrap()
        .infer(&[&m, &a])
        .is_err());
}

#[test]
fn interleaved_strips_cross_outer_blocks_on_any_pool() {
    // Axis 1 of [3, 37, 700]: 2100 outputs in strips of 2112, 1088 and 704 elements on 1, 2
    // and 3 threads (whole 64-element runs), so strips end mid-block and cross blocks.
    let shape = [3, 37, 700];
    let x = Tensor::f32(&shape, data(3 * 37 * 700));
    let red = [false, true, false];
    for (make, input_since, f) in kinds().into_iter().take(3) {
        let want = naive(x.as_f32().unwrap(), &shape, &red, &*f);
        let op = make(&Attrs::new(input_since)).unwrap();
        let ins = [x.clone(), Tensor::i64(&[1], vec![1])];
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for cut in [None, Some(333)] {
                let got = pool.install(|| run(&*op, &ins, cut));
                close(got.as_f32().unwrap(), &want);
            }
        }
    }
}
