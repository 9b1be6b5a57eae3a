//! Attention chains folded into one Attention node (`fuse/attention.rs`): a BERT-style block
//! (head splits, `Div` by sqrt(D), a broadcast mask, Softmax, `P @ V`) against a loop over the
//! untransposed inputs written here, fused and unfused, on the CPU and the GPU (lavapipe); the
//! fused op alone over permuted and broadcast operands whole on each device and split across
//! both; and the look-alikes that must stay as they are.

use super::*;
use tandem_ops::attention::{Attention, Masking, Scale};

const H: usize = 3;
const S: usize = 6;
const D: usize = 4;

/// `[1, S, H, D]` inputs q, k, v and a `[1, 1, 1, S]` mask that hides the last key.
fn inputs() -> [(&'static str, Tensor); 4] {
    let mut mask = vec![0.0f32; S];
    mask[S - 1] = -10000.0;
    [
        ("q", Tensor::f32(&[1, S, H, D], fill(S * H * D, 1))),
        ("k", Tensor::f32(&[1, S, H, D], fill(S * H * D, 2))),
        ("v", Tensor::f32(&[1, S, H, D], fill(S * H * D, 3))),
        ("mask", Tensor::f32(&[1, 1, 1, S], mask)),
    ]
}

/// `out[h, i, :] = softmax_j(q[i, h] . k[j, h] / sqrt(D) + mask[j]) @ v[:, h]`, in f64.
fn attention(ins: &[(&str, Tensor); 4]) -> Tensor {
    let [q, k, v, m] = [0, 1, 2, 3].map(|i| ins[i].1.as_f32().unwrap());
    let at = |t: &[f32], s: usize, h: usize, d: usize| t[(s * H + h) * D + d] as f64;
    let mut out = vec![0.0f32; H * S * D];
    for h in 0..H {
        for i in 0..S {
            let s: Vec<f64> = (0..S)
                .map(|j| {
                    let dot: f64 = (0..D).map(|d| at(q, i, h, d) * at(k, j, h, d)).sum();
                    dot / (D as f64).sqrt() + m[j] as f64
                })
                .collect();
            let max = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = e.iter().sum();
            for d in 0..D {
                let o: f64 = (0..S).map(|j| e[j] / total * at(v, j, h, d)).sum();
                out[(h * S + i) * D + d] = o as f32;
            }
        }
    }
    Tensor::f32(&[1, H, S, D], out)
}

/// The block; `softmax_axis` and `extra_outputs` make its look-alikes.
fn block(softmax_axis: i64, extra_outputs: &[&str]) -> Vec<u8> {
    let softmax = AttributeProto {
        name: "axis".into(),
        r#type: attribute_type::INT,
        i: Some(softmax_axis),
        ..Default::default()
    };
    let mut outputs = vec!["o"];
    outputs.extend_from_slice(extra_outputs);
    let mut m = ModelProto::decode(
        &model(
            vec![
                transpose("tq", "q", "qh", &[0, 2, 1, 3]),
                transpose("tk", "k", "kt", &[0, 2, 3, 1]),
                node("MatMul", "qk", &["qh", "kt"], &["s"]),
                node("Div", "scale", &["s", "sqrt_d"], &["ss"]),
                node("Add", "mask_add", &["mask", "ss"], &["sm"]),
                with_attr(node("Softmax", "softmax", &["sm"], &["p"]), softmax),
                transpose("tv", "v", "vh", &[0, 2, 1, 3]),
                node("MatMul", "pv", &["p", "vh"], &["o"]),
            ],
            vec![weight("sqrt_d", &[], &[(D as f32).sqrt()])],
            &["q", "k", "v"],
            &outputs,
        )[..],
    )
    .unwrap();
    // The mask's rank is declared (the pass needs it to know the Softmax's axis).
    let graph = m.graph.as_mut().unwrap();
    graph.input.push(shaped("mask", &[1, 1, 1, S]));
    m.encode_to_vec()
}

#[test]
fn an_attention_block_becomes_one_node_on_cpu_and_gpu() {
    let ins = inputs();
    let want = attention(&ins);
    let bytes = block(-1, &[]);
    for (placement, fuse) in [
        (Placement::Cpu, true),
        (Placement::Gpu, true),
        (Placement::Cpu, false),
    ] {
        let s = session(&bytes, placement, fuse);
        let (outs, report) = s.run_with_report(&ins).unwrap();
        assert_close(&outs[0].1, &want, 1e-5, 1e-5);
        if !fuse {
            assert_eq!(s.graph().nodes.len(), 8);
            continue;
        }
        assert_eq!(s.graph().nodes.len(), 1, "{placement:?}");
        assert_eq!(
            report.fused.get("pv").map(String::as_str),
            Some("Attention")
        );
        assert!(report.fused.get("qk").is_none(), "{:?}", report.fused);
        let ran = &report.nodes.iter().find(|n| *n.name == *"pv").unwrap().ran;
        let device = if placement == Placement::Gpu {
            "gpu"
        } else {
            "cpu"
        };
        assert_eq!(ran.to_string(), device);
    }
}

/// The block as tiny Llama writes it: `Mul` by 1/sqrt(D), then `Where(keep, scores, -1e4)` of a
/// bool input that keeps every key but the last (`keep_first`), or `Where(hide, -1e4, scores)`
/// of its negation, before the Softmax: the same attention as [`inputs`]' added mask.
fn select_block(keep_first: bool) -> Vec<u8> {
    let select = match keep_first {
        true => node("Where", "select", &["m", "ss", "big"], &["sm"]),
        false => node("Where", "select", &["m", "big", "ss"], &["sm"]),
    };
    let mut m = ModelProto::decode(
        &model(
            vec![
                transpose("tq", "q", "qh", &[0, 2, 1, 3]),
                transpose("tk", "k", "kt", &[0, 2, 3, 1]),
                node("MatMul", "qk", &["qh", "kt"], &["s"]),
                node("Mul", "scale", &["inv_sqrt_d", "s"], &["ss"]),
                select,
                node("Softmax", "softmax", &["sm"], &["p"]),
                transpose("tv", "v", "vh", &[0, 2, 1, 3]),
                node("MatMul", "pv", &["p", "vh"], &["o"]),
            ],
            vec![
                weight("inv_sqrt_d", &[], &[1.0 / (D as f32).sqrt()]),
                weight("big", &[1, 1], &[-1e4]),
            ],
            &["q", "k", "v"],
            &["o"],
        )[..],
    )
    .unwrap();
    let graph = m.graph.as_mut().unwrap();
    let mut mask = shaped("m", &[1, 1, S, S]);
    if let Some(t) = mask.r#type.as_mut().and_then(|t| t.tensor_type.as_mut()) {
        t.elem_type = data_type::BOOL;
    }
    graph.input.push(mask);
    m.encode_to_vec()
}

#[test]
fn a_where_masked_block_becomes_one_node_on_cpu_and_gpu() {
    let ins = inputs();
    let want = attention(&ins);
    for keep_first in [true, false] {
        let bytes = select_block(keep_first);
        // Element (i, j) of the bool mask: whether key j is kept (or, negated, hidden).
        let cond = (0..S * S).map(|e| (e % S == S - 1) != keep_first).collect();
        let given = [
            ins[0].clone(),
            ins[1].clone(),
            ins[2].clone(),
            ("m", Tensor::new(vec![1, 1, S, S], tandem::Data::Bool(cond))),
        ];
        for (placement, fuse) in [
            (Placement::Cpu, true),
            (Placement::Gpu, true),
            (Placement::Cpu, false),
        ] {
            let what = format!("keep_first {keep_first}, {placement:?}, fuse {fuse}");
            let s = session(&bytes, placement, fuse);
            let (outs, report) = s.run_with_report(&given).unwrap();
            assert_close(&outs[0].1, &want, 1e-5, 1e-5);
            let nodes = if fuse { 1 } else { 8 };
            assert_eq!(s.graph().nodes.len(), nodes, "{what}");
            if fuse {
                let pv = report.nodes.iter().find(|n| *n.name == *"pv").unwrap();
                assert_eq!(pv.op_type.as_ref(), "Attention", "{what}");
                let device = if placement == Placement::Gpu {
                    "gpu"
                } else {
                    "cpu"
                };
                assert_eq!(pv.ran.to_string(), device, "{what}");
            }
        }
    }
}

#[test]
fn attention_look_alikes_stay() {
    let ins = inputs();
    let want = attention(&ins);
    // A Softmax over the query axis, and scores that are also a graph output: both keep every
    // node but the folded Transposes, and still compute what the unfused graph does.
    for (axis, extra, nodes) in [(2, &[][..], 5), (-1, &["s"][..], 5)] {
        let bytes = block(axis, extra);
        let s = session(&bytes, Placement::Cpu, true);
        assert_eq!(s.graph().nodes.len(), nodes, "axis {axis} extra {extra:?}");
        assert!(s.graph().nodes.iter().all(|n| n.op_type != "Attention"));
        let got = s.run(&ins).unwrap();
        let plain = session(&bytes, Placement::Cpu, false).run(&ins).unwrap();
        assert_close(&got[0].1, &plain[0].1, 1e-6, 1e-6);
        if axis == -1 {
            assert_close(&got[0].1, &want, 1e-5, 1e-5);
        }
    }
}

/// The fused op alone, whole on the CPU and the GPU and split across both, against the CPU
/// kernel's own result where the unit tests (`attention_tests.rs`) check it against the
/// unfused nodes: permuted, broadcast and masked operands, and a mask that broadcasts the
/// query rows. 37 query rows: blocks of 4 (`attention_rows.wgsl`, the variant for adapters that
/// run shaders on the CPU, where Q and V rows are 4 or 8 wide) end part-way, and splits cut
/// them. There the first case reads Q, Kt and V as vec4s (`attention_rows_vec4.wgsl`: each
/// contiguous along D), the last through strides; the others' Dv of 5 keeps `attention.wgsl`.
#[test]
fn the_attention_op_matches_on_every_placement() {
    let heads = Some(vec![0, 2, 1, 3]);
    let cases: Vec<(Attention, Vec<Vec<usize>>)> = vec![
        (
            Attention {
                perms: [heads.clone(), Some(vec![0, 2, 3, 1]), heads.clone()],
                scale: Scale::Div(2.0),
                masking: Masking::Add,
            },
            vec![
                vec![1, 37, 3, 4],
                vec![1, 9, 3, 4],
                vec![1, 9, 3, 8],
                vec![1, 1, 1, 9],
            ],
        ),
        (
            Attention {
                perms: [None, None, None],
                scale: Scale::Mul(0.5),
                masking: Masking::Add,
            },
            vec![vec![2, 1, 3, 4], vec![1, 3, 4, 6], vec![3, 6, 5]],
        ),
        (
            Attention {
                perms: [None, None, None],
                scale: Scale::None,
                masking: Masking::Add,
            },
            vec![vec![2, 1, 4], vec![2, 4, 6], vec![2, 6, 5], vec![2, 3, 6]],
        ),
        (
            Attention {
                perms: [heads.clone(), None, heads],
                scale: Scale::Mul(0.25),
                masking: Masking::Select {
                    fill: -1e9,
                    keep: true,
                },
            },
            vec![
                vec![1, 37, 3, 8],
                vec![1, 3, 8, 9],
                vec![1, 9, 3, 4],
                vec![1, 1, 37, 9],
            ],
        ),
        // -inf where the mask says so, the first keys masked in most rows: the one-pass
        // softmax of attention_rows_vec4.wgsl starts those rows at a max of -inf
        (
            Attention {
                perms: [None, None, None],
                scale: Scale::None,
                masking: Masking::Select {
                    fill: f32::NEG_INFINITY,
                    keep: false,
                },
            },
            vec![vec![1, 37, 8], vec![1, 8, 9], vec![1, 9, 8], vec![1, 37, 9]],
        ),
    ];
    // Kt and V from textures unless TANDEM_GPU_TEXTURES=0 (scripts/test.sh runs both)
    let on_cpu_adapter = [
        match std::env::var("TANDEM_GPU_TEXTURES").as_deref() {
            Ok("0") => "attention_rows_vec4",
            _ => "attention_rows_texture",
        },
        "attention",
        "attention",
        "attention_rows",
        "attention_rows",
    ];
    for ((op, shapes), shader) in cases.into_iter().zip(on_cpu_adapter) {
        let ins: Vec<Tensor> = (shapes.iter().enumerate())
            .map(|(i, s)| match (i, op.masking) {
                // A selecting mask: query row r keeps keys j <= r % 9 (a causal mask's pattern);
                // with -inf, fills keys j < r % 9 instead (every row keeps some)
                (3, Masking::Select { fill, .. }) => {
                    let keep = (0..s.iter().product())
                        .map(|e: usize| match fill.is_infinite() {
                            false => e % 9 <= (e / 9) % 9,
                            true => e % 9 < (e / 9) % 9,
                        })
                        .collect();
                    Tensor::new(s.clone(), tandem::Data::Bool(keep))
                }
                _ => Tensor::f32(s, fill(s.iter().product(), i as u32 + 4)),
            })
            .collect();
        let metas = tandem::testing::const_metas(&ins);
        let refs: Vec<&tandem::TensorMeta> = metas.iter().collect();
        let outs = op.infer(&refs).unwrap();
        let rows = tandem::testing::row_count_of(&op, &ins);
        let kernels = op.gpu(&refs, &outs, 0..rows).unwrap();
        assert_eq!(kernels[0].for_adapter(true)[0].shader.name, shader);
        let want = tandem::testing::run_cpu(&op, &ins);
        check_all_placements(&op, &ins, &want, 1e-5);
    }
}
