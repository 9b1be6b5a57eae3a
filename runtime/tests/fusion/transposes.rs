//! Transposes folded into the MatMuls they feed (`fuse/matmul_operands.rs`): an attention
//! block's head splits (`Q` and `V` by `[0, 2, 1, 3]`, `K^T` by `[0, 2, 3, 1]`) against loops
//! over the untransposed inputs written here, fused and unfused, on the CPU and the GPU
//! (lavapipe), and the fused MatMul alone split across both; and the Transposes that must stay.

use super::*;

/// Heads, sequence length, head size of the test block.
const H: usize = 3;
const S: usize = 5;
const D: usize = 4;

/// `[1, S, H, D]` inputs q, k, v.
fn qkv() -> [Tensor; 3] {
    [1, 2, 3].map(|seed| Tensor::f32(&[1, S, H, D], fill(S * H * D, seed)))
}

/// `scores[h, i, j] = sum_d q[i, h, d] * k[j, h, d]` and `out[h, i, d] = sum_j scores[h, i, j]
/// * v[j, h, d]`, in f64.
fn attention([q, k, v]: &[Tensor; 3]) -> (Tensor, Tensor) {
    let (q, k, v) = (
        q.as_f32().unwrap(),
        k.as_f32().unwrap(),
        v.as_f32().unwrap(),
    );
    let at = |t: &[f32], s: usize, h: usize, d: usize| t[(s * H + h) * D + d] as f64;
    let mut scores = vec![0.0f64; H * S * S];
    let mut out = vec![0.0f32; H * S * D];
    for h in 0..H {
        for i in 0..S {
            for j in 0..S {
                scores[(h * S + i) * S + j] = (0..D).map(|d| at(q, i, h, d) * at(k, j, h, d)).sum();
            }
            for d in 0..D {
                let o: f64 = (0..S)
                    .map(|j| scores[(h * S + i) * S + j] * at(v, j, h, d))
                    .sum();
                out[(h * S + i) * D + d] = o as f32;
            }
        }
    }
    let scores = scores.iter().map(|&s| s as f32).collect();
    (
        Tensor::f32(&[1, H, S, S], scores),
        Tensor::f32(&[1, H, S, D], out),
    )
}

fn attention_model(extra_outputs: &[&str]) -> Vec<u8> {
    let mut outputs = vec!["o"];
    outputs.extend_from_slice(extra_outputs);
    model(
        vec![
            transpose("tq", "q", "qh", &[0, 2, 1, 3]),
            transpose("tk", "k", "kt", &[0, 2, 3, 1]),
            node("MatMul", "qk", &["qh", "kt"], &["s"]),
            transpose("tv", "v", "vh", &[0, 2, 1, 3]),
            node("MatMul", "sv", &["s", "vh"], &["o"]),
        ],
        vec![],
        &["q", "k", "v"],
        &outputs,
    )
}

fn named(t: &[Tensor; 3]) -> [(&'static str, Tensor); 3] {
    [
        ("q", t[0].clone()),
        ("k", t[1].clone()),
        ("v", t[2].clone()),
    ]
}

#[test]
fn head_split_transposes_fold_into_the_attention_matmuls() {
    let ins = qkv();
    let (scores, want) = attention(&ins);
    let bytes = attention_model(&[]);
    for (placement, fuse) in [
        (Placement::Cpu, true),
        (Placement::Gpu, true),
        (Placement::Cpu, false),
    ] {
        let s = session(&bytes, placement, fuse);
        let (outs, report) = s.run_with_report(&named(&ins)).unwrap();
        assert_close(&outs[0].1, &want, 1e-4, 1e-4);
        if !fuse {
            assert_eq!(s.graph().nodes.len(), 5);
            continue;
        }
        let label = |n: &str| report.fused.get(n).map(String::as_str);
        assert_eq!(label("qk"), Some("Transpose+Transpose+MatMul"));
        assert_eq!(label("sv"), Some("Transpose+MatMul"));
        let graph = s.graph();
        assert_eq!(graph.nodes.len(), 2, "{placement:?}");
        // The fused Q @ K^T reads q and k as given: whole on each device and split by rows.
        let qk = &graph.nodes[0];
        let ins = [ins[0].clone(), ins[1].clone()];
        check_all_placements(qk.op.as_ref(), &ins, std::slice::from_ref(&scores), 1e-4);
    }
}

#[test]
fn transposes_read_elsewhere_or_without_perm_stay() {
    let ins = qkv();
    let (_, want) = attention(&ins);
    // K^T is also a graph output: that Transpose stays, the other two fold.
    let s = session(&attention_model(&["kt"]), Placement::Cpu, true);
    let (outs, report) = s.run_with_report(&named(&ins)).unwrap();
    assert_close(&outs[0].1, &want, 1e-4, 1e-4);
    assert_eq!(outs[1].1.shape, vec![1, H, D, S]);
    assert_eq!(
        report.fused.get("qk").map(String::as_str),
        Some("Transpose+MatMul")
    );
    assert_eq!(s.graph().nodes.len(), 3);

    // A Transpose without perm (all axes reversed) stays: its rank is unknown at load time.
    let bytes = model(
        vec![
            node("Transpose", "t", &["a"], &["at"]),
            node("MatMul", "mm", &["at", "b"], &["y"]),
        ],
        vec![],
        &["a", "b"],
        &["y"],
    );
    let s = session(&bytes, Placement::Cpu, true);
    assert_eq!(s.graph().nodes.len(), 2);
    let a = Tensor::f32(&[3, 2], fill(6, 4));
    let b = Tensor::f32(&[3, 4], fill(12, 5));
    let y = s.run(&[("a", a.clone()), ("b", b.clone())]).unwrap();
    let (av, bv) = (a.as_f32().unwrap(), b.as_f32().unwrap());
    let mut want = vec![0.0f32; 8];
    for i in 0..2 {
        for j in 0..4 {
            want[i * 4 + j] = (0..3).map(|p| av[p * 2 + i] * bv[p * 4 + j]).sum();
        }
    }
    assert_close(&y[0].1, &Tensor::f32(&[2, 4], want), 1e-5, 1e-5);
}

#[test]
fn a_perm_that_does_not_fit_the_rank_fails_as_the_transpose_would() {
    // perm [1, 0] on a rank-3 q: the unfused Transpose rejects it, and so must the fused MatMul.
    let bytes = model(
        vec![
            transpose("t", "a", "at", &[1, 0]),
            node("MatMul", "mm", &["at", "b"], &["y"]),
        ],
        vec![],
        &["a", "b"],
        &["y"],
    );
    let a = Tensor::f32(&[2, 3, 3], fill(18, 6));
    let b = Tensor::f32(&[3, 3], fill(9, 7));
    for fuse in [false, true] {
        let s = session(&bytes, Placement::Cpu, fuse);
        assert_eq!(s.graph().nodes.len(), if fuse { 1 } else { 2 });
        let err = s.run(&[("a", a.clone()), ("b", b.clone())]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("perm"), "fuse {fuse}: {text}");
    }
}
