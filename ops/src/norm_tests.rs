//! CPU tests of the normalisations (norm.rs and norm_channel.rs) against naive f64 references.

use super::*;
use crate::norm_channel::{batch_normalization, lrn};
use crate::{AttrValue, Attrs, Op};

fn data(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 37 % 31) as f32 - 15.0) * 0.3 + 100.0 * (seed % 2) as f32)
        .collect()
}

/// All outputs on the CPU; rows split in two at `cut` when given.
fn run(op: &dyn Op, ins: &[Tensor], cut: Option<usize>) -> Vec<Tensor> {
    let metas: Vec<TensorMeta> = ins
        .iter()
        .map(|t| TensorMeta::constant(t.clone()))
        .collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let om = op.infer(&refs).unwrap();
    let mut outs: Vec<Tensor> = om
        .iter()
        .map(|m| Tensor::zeros(m.dtype, &m.shape))
        .collect();
    let rows = crate::shape::row_count(&om[0].shape, op.split_axis(&refs, &om));
    let tr: Vec<&Tensor> = ins.iter().collect();
    match cut {
        Some(c) => {
            op.cpu(&tr, &mut outs, 0..c).unwrap();
            op.cpu(&tr, &mut outs, c..rows).unwrap();
        }
        None => op.cpu(&tr, &mut outs, 0..rows).unwrap(),
    }
    outs
}

fn close(a: &[f32], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!(
            ((x as f64) - y).abs() <= tol * (1.0 + y.abs()),
            "at {i}: {x} vs {y}"
        );
    }
}

/// Naive layer norm over the last `len` elements of each row, scale/bias given per element.
fn naive_ln(
    x: &[f32],
    len: usize,
    s: &[f64],
    b: &[f64],
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut means, mut invs) = (vec![], vec![], vec![]);
    for row in x.chunks(len) {
        let m = row.iter().map(|&v| v as f64).sum::<f64>() / len as f64;
        let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / len as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for (j, &v) in row.iter().enumerate() {
            y.push((v as f64 - m) * inv * s[j] + b[j]);
        }
        means.push(m);
        invs.push(inv);
    }
    (y, means, invs)
}

#[test]
fn layer_norm_last_axis_with_stats_and_split() {
    let x = Tensor::f32(&[2, 3, 10], data(60, 1));
    let s = data(10, 2);
    let b = data(10, 4);
    let ins = [
        x.clone(),
        Tensor::f32(&[10], s.clone()),
        Tensor::f32(&[10], b.clone()),
    ];
    let op = layer_normalization(&Attrs::new(17)).unwrap();
    let outs = run(&*op, &ins, Some(4));
    let sd: Vec<f64> = s.iter().map(|&v| v as f64).collect();
    let bd: Vec<f64> = b.iter().map(|&v| v as f64).collect();
    let (y, m, inv) = naive_ln(x.as_f32().unwrap(), 10, &sd, &bd, 1e-5);
    close(outs[0].as_f32().unwrap(), &y, 1e-4);
    assert_eq!(outs[1].shape, vec![2, 3, 1]);
    close(outs[1].as_f32().unwrap(), &m, 1e-5);
    close(outs[2].as_f32().unwrap(), &inv, 1e-4);
}

#[test]
fn layer_norm_axis_1_broadcast_scale_no_bias() {
    // Normalise over [3, 4]; Scale [4] broadcasts over the 3; no B.
    let x = Tensor::f32(&[2, 3, 4], data(24, 3));
    let s = data(4, 6);
    let op = layer_normalization(
        &Attrs::new(17)
            .with("axis", AttrValue::Int(1))
            .with("epsilon", AttrValue::Float(1e-3)),
    )
    .unwrap();
    let outs = run(&*op, &[x.clone(), Tensor::f32(&[4], s.clone())], None);
    let sd: Vec<f64> = (0..12).map(|j| s[j % 4] as f64).collect();
    let (y, _, _) = naive_ln(x.as_f32().unwrap(), 12, &sd, &[0.0; 12], 1e-3);
    close(outs[0].as_f32().unwrap(), &y, 1e-4);
    assert_eq!(outs[1].shape, vec![2, 1, 1]);
    // Only Y requested: the kernel must not need the statistics outputs.
    let mut only_y = vec![Tensor::zeros(DType::F32, &[2, 3, 4])];
    let s_t = Tensor::f32(&[4], s);
    op.cpu(&[&x, &s_t], &mut only_y, 0..2).unwrap();
    close(only_y[0].as_f32().unwrap(), &y, 1e-4);
}

#[test]
fn layer_norm_rejects_bad_scale() {
    let op = layer_normalization(&Attrs::new(17)).unwrap();
    let x = TensorMeta::new(DType::F32, vec![2, 3]);
    let s = TensorMeta::new(DType::F32, vec![2]);
    assert!(op.infer(&[&x, &s]).is_err());
}

#[test]
fn instance_norm_matches_naive() {
    let (n, c, hw) = (2, 3, 5);
    let x = Tensor::f32(&[n, c, hw], data(n * c * hw, 5));
    let s = data(c, 2);
    let b = data(c, 7);
    let op = instance_normalization(&Attrs::new(6)).unwrap();
    let ins = [
        x.clone(),
        Tensor::f32(&[c], s.clone()),
        Tensor::f32(&[c], b.clone()),
    ];
    let outs = run(&*op, &ins, Some(1));
    let mut want = Vec::new();
    for (r, row) in x.as_f32().unwrap().chunks(hw).enumerate() {
        let ch = r % c;
        let sd = vec![s[ch] as f64; hw];
        let bd = vec![b[ch] as f64; hw];
        want.extend(naive_ln(row, hw, &sd, &bd, 1e-5).0);
    }
    close(outs[0].as_f32().unwrap(), &want, 1e-4);
}

#[test]
fn batch_norm_matches_formula_and_rejects_training() {
    let (n, c, hw) = (2, 3, 4);
    let x = Tensor::f32(&[n, c, 2, 2], data(n * c * hw, 3));
    let p = |seed| data(c, seed);
    let (s, b, m) = (p(2), p(4), p(6));
    let v: Vec<f32> = p(8).iter().map(|v| v.abs() + 0.5).collect();
    let op = batch_normalization(&Attrs::new(15)).unwrap();
    let ins = [
        x.clone(),
        Tensor::f32(&[c], s.clone()),
        Tensor::f32(&[c], b.clone()),
        Tensor::f32(&[c], m.clone()),
        Tensor::f32(&[c], v.clone()),
    ];
    let outs = run(&*op, &ins, Some(3));
    let want: Vec<f64> = x
        .as_f32()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, &xv)| {
            let ch = i / hw % c;
            (xv as f64 - m[ch] as f64) / (v[ch] as f64 + 1e-5).sqrt() * s[ch] as f64 + b[ch] as f64
        })
        .collect();
    close(outs[0].as_f32().unwrap(), &want, 1e-5);
    let training = Attrs::new(15).with("training_mode", AttrValue::Int(1));
    assert!(matches!(
        batch_normalization(&training),
        Err(OpError::Unsupported(_))
    ));
}

#[test]
fn lrn_matches_onnx_formula() {
    let (n, c, hw) = (2, 5, 3);
    let x = Tensor::f32(
        &[n, c, 3, 1],
        data(n * c * hw, 1).iter().map(|v| v * 0.01).collect(),
    );
    for size in [1i64, 2, 3, 4] {
        let (alpha, beta, bias) = (0.002f64, 0.75f64, 2.0f64);
        let op = lrn(&Attrs::new(13)
            .with("size", AttrValue::Int(size))
            .with("alpha", AttrValue::Float(alpha as f32))
            .with("beta", AttrValue::Float(beta as f32))
            .with("bias", AttrValue::Float(bias as f32)))
        .unwrap();
        let outs = run(&*op, std::slice::from_ref(&x), Some(7));
        let xv = x.as_f32().unwrap();
        let mut want = vec![0.0; xv.len()];
        let sz = size as f64;
        for b in 0..n {
            for ch in 0..c {
                let lo = (ch as i64 - ((sz - 1.0) / 2.0).floor() as i64).max(0) as usize;
                let hi = (ch as i64 + ((sz - 1.0) / 2.0).ceil() as i64).min(c as i64 - 1) as usize;
                for s in 0..hw {
                    let sq: f64 = (lo..=hi)
                        .map(|cc| (xv[(b * c + cc) * hw + s] as f64).powi(2))
                        .sum();
                    let i = (b * c + ch) * hw + s;
                    want[i] = xv[i] as f64 / (bias + alpha / sz * sq).powf(beta);
                }
            }
        }
        close(outs[0].as_f32().unwrap(), &want, 1e-5);
    }
    assert!(lrn(&Attrs::new(13)).is_err());
}
