use super::*;
use crate::{AttrValue, Attrs, Data};
use std::sync::Arc;

/// Output 0 of `op` on `ins` (constants as metas' values, so Slice sees its bounds), over
/// `rows` (default: all of them).
fn run(op: &dyn Op, ins: &[Tensor], rows: Option<Range<usize>>) -> Result<Tensor> {
    let metas: Vec<TensorMeta> = ins
        .iter()
        .map(|t| {
            let mut m = t.meta();
            m.value = Some(Arc::new(t.clone()));
            m
        })
        .collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let om = op.infer(&refs)?;
    let mut outs = vec![Tensor::zeros(om[0].dtype, &om[0].shape)];
    let n = om[0].numel().max(1);
    let ins: Vec<&Tensor> = ins.iter().collect();
    op.cpu(&ins, &mut outs, rows.unwrap_or(0..n))?;
    Ok(outs.remove(0))
}

fn f32s(shape: &[usize], seed: u32) -> Tensor {
    let n = shape::numel(shape);
    let v = (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed * 97) % 2001) as f32 / 1000.0
                - 1.0
        })
        .collect();
    Tensor::new(shape.to_vec(), Data::F32(v))
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::new(vec![v.len()], Data::I64(v.to_vec()))
}

/// The seven-node chain, op by op: `Add(Mul(x, cos), Mul(Concat(Neg(x[h:e]), x[0:h]), sin))`.
fn chain(x: &Tensor, cos: &Tensor, sin: &Tensor, h: i64, e: i64) -> Tensor {
    let a = Attrs::new(17);
    let slice = crate::slice::slice(&a).unwrap();
    let last = i64s(&[-1]);
    let s1 = run(
        slice.as_ref(),
        &[x.clone(), i64s(&[0]), i64s(&[h]), last.clone()],
        None,
    );
    let s2 = run(
        slice.as_ref(),
        &[x.clone(), i64s(&[h]), i64s(&[e]), last],
        None,
    );
    let neg = run(
        crate::unary::neg(&a).unwrap().as_ref(),
        &[s2.unwrap()],
        None,
    )
    .unwrap();
    let concat = crate::concat_split::concat(&a.clone().with("axis", AttrValue::Int(-1))).unwrap();
    let rot = run(concat.as_ref(), &[neg, s1.unwrap()], None).unwrap();
    let mul = crate::binary::mul(&a).unwrap();
    let m1 = run(mul.as_ref(), &[x.clone(), cos.clone()], None).unwrap();
    let m2 = run(mul.as_ref(), &[rot, sin.clone()], None).unwrap();
    run(crate::binary::add(&a).unwrap().as_ref(), &[m1, m2], None).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Shapes of x, cos and sin, and the Slices' split and end.
type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], i64, i64);

#[test]
fn rotary_is_the_chain_to_the_bit() {
    // (x, cos, sin, h, e): Llama's [1, heads, seq, 32] against [seq, 32] tables; half past the
    // middle; cos broadcast over the last axis; x broadcast along it; a table of higher rank
    // than x; e past the end; h past the end
    let cases: &[Case] = &[
        (&[1, 4, 7, 32], &[7, 32], &[7, 32], 16, 32),
        (&[2, 3, 5, 8], &[1, 1, 5, 8], &[5, 8], 3, i64::MAX),
        (&[3, 6], &[3, 1], &[6], 2, 6),
        (&[4, 1], &[4, 5], &[5], 1, 1),
        (&[5, 4], &[2, 1, 4], &[4], 2, 9),
        (&[2, 6], &[6], &[6], 10, 12),
        (&[2, 6], &[6], &[6], 0, 6),
    ];
    for (i, &(xs, cs, ss, h, e)) in cases.iter().enumerate() {
        let (x, cos, sin) = (f32s(xs, 1), f32s(cs, 2), f32s(ss, 3));
        let want = chain(&x, &cos, &sin, h, e);
        let op = Rotary {
            half: h as usize,
            end: e.min(1 << 40) as usize,
            perm: None,
        };
        let ins = [x, cos, sin];
        let got = run(&op, &ins, None).unwrap();
        assert_eq!(got.shape, want.shape, "case {i}");
        assert_eq!(bits(&got), bits(&want), "case {i}");
        // any element range, split mid-row, gives those elements
        let n = got.numel();
        let mut parts = Tensor::zeros(DType::F32, &got.shape);
        let refs: Vec<&Tensor> = ins.iter().collect();
        for r in [0..n / 3 + 1, n / 3 + 1..n - 1, n - 1..n] {
            op.cpu(&refs, std::slice::from_mut(&mut parts), r).unwrap();
        }
        assert_eq!(bits(&parts), bits(&want), "case {i} in parts");
    }
}

#[test]
fn large_outputs_run_in_parallel_rows_with_the_same_result() {
    let (x, cos, sin) = (
        f32s(&[2, 8, 300, 32], 4),
        f32s(&[300, 32], 5),
        f32s(&[300, 32], 6),
    );
    let want = chain(&x, &cos, &sin, 16, 32);
    let op = Rotary {
        half: 16,
        end: 32,
        perm: None,
    };
    let ins = [x, cos, sin];
    assert_eq!(bits(&run(&op, &ins, None).unwrap()), bits(&want));
    // a range that starts and ends mid-row
    let n = want.numel();
    let got = run(&op, &ins, Some(5..n - 7)).unwrap();
    let (g, w) = (bits(&got), bits(&want));
    assert_eq!(g[5..n - 7], w[5..n - 7]);
}

#[test]
fn shapes_the_chain_rejects_are_errors_naming_the_op() {
    let op = Rotary {
        half: 2,
        end: 4,
        perm: None,
    };
    let err = |x: &[usize], c: &[usize]| {
        run(&op, &[f32s(x, 1), f32s(c, 2), f32s(c, 3)], None)
            .unwrap_err()
            .to_string()
    };
    // the second Slice stops before the last dim: the chain's Concat is narrower than x
    assert!(err(&[3, 6], &[6]).contains("Rotary"));
    // tables that do not broadcast against x
    assert!(err(&[3, 4], &[2, 4]).contains("broadcast"));
    // integers
    let i = Tensor::new(vec![4], Data::I32(vec![1, 2, 3, 4]));
    let e = run(&op, &[i.clone(), i.clone(), i], None).unwrap_err();
    assert!(e.to_string().contains("floats only"));
}

#[test]
fn x_read_through_a_permutation_is_the_chain_on_the_transposed_x() {
    // a head split: stored [batch, seq, heads, d], read as [batch, heads, seq, d]
    let stored = f32s(&[2, 5, 3, 8], 7);
    let transpose = crate::registry::build(
        "Transpose",
        &Attrs::new(17).with("perm", AttrValue::Ints(vec![0, 2, 1, 3])),
    )
    .unwrap();
    let x = run(transpose.as_ref(), std::slice::from_ref(&stored), None).unwrap();
    for (cs, ss) in [(&[5, 8][..], &[5, 8][..]), (&[3, 1, 8], &[1])] {
        let (cos, sin) = (f32s(cs, 2), f32s(ss, 3));
        let want = chain(&x, &cos, &sin, 4, 8);
        let op = Rotary {
            half: 4,
            end: 8,
            perm: Some(vec![0, 2, 1, 3]),
        };
        let got = run(&op, &[stored.clone(), cos, sin], None).unwrap();
        assert_eq!(got.shape, want.shape);
        assert_eq!(bits(&got), bits(&want));
    }
    // a perm that moves the last axis, or is none
    let metas = [&[2, 5, 3, 8][..], &[8], &[8]].map(|s| TensorMeta::new(DType::F32, s.to_vec()));
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    for (perm, msg) in [
        (vec![0, 1, 3, 2], "moves its last axis"),
        (vec![0, 0, 1, 3], "not a permutation"),
    ] {
        let op = Rotary {
            half: 4,
            end: 8,
            perm: Some(perm),
        };
        assert!(op.infer(&refs).unwrap_err().to_string().contains(msg));
    }
}

#[test]
fn a_large_range_inside_one_long_row() {
    // 40,000 elements a row: a range of 33,000 of them holds no whole row
    let (x, cos, sin) = (
        f32s(&[2, 40_000], 8),
        f32s(&[40_000], 9),
        f32s(&[40_000], 10),
    );
    let want = chain(&x, &cos, &sin, 20_000, 40_000);
    let op = Rotary {
        half: 20_000,
        end: 40_000,
        perm: None,
    };
    let got = run(&op, &[x, cos, sin], Some(1000..34_000)).unwrap();
    assert_eq!(bits(&got)[1000..34_000], bits(&want)[1000..34_000]);
}
