//! The fused attention node against the unfused nodes it replaces (MatMul with the same
//! permutations, Div or Mul, Add, Softmax, MatMul), whole and in row ranges that cut its
//! blocks, over permuted, broadcast and masked operands.

use super::*;
use crate::matmul::MatMul;
use crate::Attrs;

fn fill(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7 + seed * 13) % 29) as f32 - 14.0) * 0.11)
        .collect()
}

fn run(op: &dyn Op, ins: &[&Tensor], cut: Option<usize>) -> Tensor {
    let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
    let m: Vec<&TensorMeta> = metas.iter().collect();
    let outs = op.infer(&m).unwrap();
    let mut out = vec![Tensor::f32(&outs[0].shape, vec![f32::NAN; outs[0].numel()])];
    let rows = crate::shape::row_count(&outs[0].shape, op.split_axis(&m, &outs));
    let cut = cut.unwrap_or(rows).min(rows);
    op.cpu(ins, &mut out, 0..cut).unwrap();
    op.cpu(ins, &mut out, cut..rows).unwrap();
    out.remove(0)
}

/// The unfused chain, each node run by its own kernel.
fn unfused(att: &Attention, ins: &[&Tensor]) -> Tensor {
    let op = |name: &str| crate::registry::build(name, &Attrs::new(17)).unwrap();
    let qk = MatMul {
        perms: [att.perms[0].clone(), att.perms[1].clone()],
        ..Default::default()
    };
    let mut s = run(&qk, &ins[..2], None);
    let scalar = |c: f32| Tensor::f32(&[], vec![c]);
    match att.scale {
        Scale::Mul(c) => s = run(op("Mul").as_ref(), &[&s, &scalar(c)], None),
        Scale::Div(c) => s = run(op("Div").as_ref(), &[&s, &scalar(c)], None),
        Scale::None => {}
    }
    match (ins.get(3), att.masking) {
        (Some(mask), Masking::Add) => s = run(op("Add").as_ref(), &[&s, mask], None),
        (Some(mask), Masking::Select { fill, keep: true }) => {
            s = run(op("Where").as_ref(), &[mask, &s, &scalar(fill)], None)
        }
        (Some(mask), Masking::Select { fill, keep: false }) => {
            s = run(op("Where").as_ref(), &[mask, &scalar(fill), &s], None)
        }
        (None, _) => {}
    }
    let p = run(op("Softmax").as_ref(), &[&s], None);
    let pv = MatMul {
        perms: [None, att.perms[2].clone()],
        ..Default::default()
    };
    run(&pv, &[&p, ins[2]], None)
}

fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape, want.shape, "{what}");
    let (g, w) = (got.as_f32().unwrap(), want.as_f32().unwrap());
    for (i, (x, y)) in g.iter().zip(w).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 + 1e-5 * y.abs() || (x.is_nan() && y.is_nan()),
            "{what} at {i}: {x} vs {y}"
        );
    }
}

struct Case {
    what: &'static str,
    shapes: Vec<Vec<usize>>,
    perms: [Option<Vec<usize>>; 3],
    scale: Scale,
    masking: Masking,
}

/// A bool mask of `shape`: element i is kept when `i % period < kept`.
fn bool_mask(shape: &[usize], period: usize, kept: usize) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(
        shape.to_vec(),
        crate::Data::Bool((0..n).map(|i| i % period < kept).collect()),
    )
}

fn cases() -> Vec<Case> {
    let heads = Some(vec![0, 2, 1, 3]);
    vec![
        Case {
            what: "head splits folded, as minilm (600 keys: 27 queries a block, two blocks)",
            shapes: vec![
                vec![1, 40, 3, 4],
                vec![1, 600, 3, 4],
                vec![1, 600, 3, 4],
                vec![1, 1, 1, 600],
            ],
            perms: [heads.clone(), Some(vec![0, 2, 3, 1]), heads],
            scale: Scale::Div(2.0),
            masking: Masking::Add,
        },
        Case {
            what: "rank 3, mask broadcast over the batch",
            shapes: vec![vec![2, 35, 6], vec![2, 6, 7], vec![2, 7, 5], vec![35, 7]],
            perms: [None, None, None],
            scale: Scale::Mul(0.3),
            masking: Masking::Add,
        },
        Case {
            what: "batch dims broadcast between Q, Kt and V, no mask",
            shapes: vec![vec![2, 1, 3, 4], vec![1, 3, 4, 6], vec![3, 6, 5]],
            perms: [None, None, None],
            scale: Scale::None,
            masking: Masking::Add,
        },
        Case {
            what: "one query row broadcast by the mask",
            shapes: vec![vec![2, 1, 4], vec![2, 4, 6], vec![2, 6, 5], vec![2, 3, 6]],
            perms: [None, None, None],
            scale: Scale::Div(3.0),
            masking: Masking::Add,
        },
        Case {
            what: "one key column broadcast by the mask, Kt transposed",
            shapes: vec![vec![3, 4], vec![1, 4], vec![5, 2], vec![3, 5]],
            perms: [None, Some(vec![1, 0]), None],
            scale: Scale::Mul(1.5),
            masking: Masking::Add,
        },
        Case {
            what: "a causal bool mask selecting a large negative, as tiny Llama (heads folded)",
            shapes: vec![
                vec![1, 40, 3, 4],
                vec![1, 3, 4, 40],
                vec![1, 40, 3, 4],
                vec![1, 1, 40, 40],
            ],
            perms: [Some(vec![0, 2, 1, 3]), None, Some(vec![0, 2, 1, 3])],
            scale: Scale::Mul(0.5),
            masking: Masking::Select {
                fill: -3.4e38,
                keep: true,
            },
        },
        Case {
            what: "a bool mask broadcast over the query rows selecting the scores where false",
            shapes: vec![vec![2, 5, 4], vec![2, 4, 7], vec![2, 7, 3], vec![2, 1, 7]],
            perms: [None, None, None],
            scale: Scale::None,
            masking: Masking::Select {
                fill: -1e4,
                keep: false,
            },
        },
        Case {
            what: "a bool mask broadcast over the keys: whole rows of -inf (NaN, as the Softmax)",
            shapes: vec![vec![2, 5, 4], vec![2, 4, 7], vec![2, 7, 3], vec![5, 1]],
            perms: [None, None, None],
            scale: Scale::Div(2.0),
            masking: Masking::Select {
                fill: f32::NEG_INFINITY,
                keep: true,
            },
        },
    ]
}

#[test]
fn matches_the_unfused_nodes_whole_and_in_row_ranges() {
    for case in cases() {
        let ins: Vec<Tensor> = (case.shapes.iter().enumerate())
            .map(|(i, s)| match (i, case.masking) {
                // A causal mask: row r keeps its first r + 1 keys (rows of 40 keys).
                (3, Masking::Select { keep: true, .. }) => {
                    let n = s.iter().product();
                    let keep = (0..n).map(|e| e % 40 <= (e / 40) % 40).collect();
                    Tensor::new(s.clone(), crate::Data::Bool(keep))
                }
                (3, Masking::Select { .. }) => bool_mask(s, 3, 2),
                _ => Tensor::f32(s, fill(s.iter().product(), i)),
            })
            .collect();
        let refs: Vec<&Tensor> = ins.iter().collect();
        let att = Attention {
            perms: case.perms.clone(),
            scale: case.scale,
            masking: case.masking,
        };
        let want = unfused(&att, &refs);
        for cut in [
            None,
            Some(1),
            Some(33),
            Some(want.shape[..want.shape.len() - 1].iter().product::<usize>() - 1),
        ] {
            close(
                &run(&att, &refs, cut),
                &want,
                &format!("{} cut {cut:?}", case.what),
            );
        }
    }
}

#[test]
fn masked_keys_and_infinite_rows_behave_as_the_softmax_does() {
    let q = Tensor::f32(&[3, 4], fill(12, 1));
    let kt = Tensor::f32(&[4, 5], fill(20, 2));
    let v = Tensor::f32(&[5, 2], fill(10, 3));
    let (ni, inf) = (f32::NEG_INFINITY, f32::INFINITY);
    // Row 0: two keys masked out; row 1: every key masked (NaN); row 2: +inf (NaN).
    let mask = Tensor::f32(
        &[3, 5],
        vec![
            0.0, ni, 0.0, ni, 1.0, ni, ni, ni, ni, ni, 0.0, inf, 0.0, 0.0, 0.0,
        ],
    );
    let att = Attention {
        perms: [None, None, None],
        scale: Scale::Div(2.0),
        masking: Masking::Add,
    };
    let ins = [&q, &kt, &v, &mask];
    let got = run(&att, &ins, None);
    close(&got, &unfused(&att, &ins), "masked");
    let g = got.as_f32().unwrap();
    assert!(g[..2].iter().all(|x| x.is_finite()), "{g:?}");
    assert!(g[2..].iter().all(|x| x.is_nan()), "{g:?}");
}

#[test]
fn bad_shapes_are_errors_naming_the_product() {
    let att = Attention {
        perms: [None, None, None],
        scale: Scale::None,
        masking: Masking::Add,
    };
    let m = |s: &[usize]| TensorMeta::new(DType::F32, s.to_vec());
    let err = |shapes: &[&[usize]]| {
        let metas: Vec<TensorMeta> = shapes.iter().map(|s| m(s)).collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        att.infer(&refs).unwrap_err().to_string()
    };
    assert!(err(&[&[3, 4], &[5, 6], &[6, 2]]).contains("Q @ Kt"));
    assert!(err(&[&[3, 4], &[4, 6], &[5, 2]]).contains("P @ V"));
    assert!(err(&[&[4], &[4, 6], &[6, 2]]).contains("rank >= 2"));
    assert!(err(&[&[3, 4], &[4, 6], &[6, 2], &[2, 6]]).contains("broadcast"));
    // A mask of the wrong dtype for the masking names both.
    let select = Attention {
        masking: Masking::Select {
            fill: -1e9,
            keep: true,
        },
        ..att
    };
    let metas = [m(&[3, 4]), m(&[4, 6]), m(&[6, 2]), m(&[3, 6])];
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let e = select.infer(&refs).unwrap_err().to_string();
    assert!(
        e.contains("mask has dtype f32") && e.contains("bool"),
        "{e}"
    );
}
