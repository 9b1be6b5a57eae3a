//! The Add of a constant one-row bias after a MatMul folded into the MatMul
//! (`fuse/matmul_bias.rs`, `MatMul+Add` in reports): fused against unfused on the CPU (the same
//! bits: the bias is added after the product, as the Add did) and on the GPU (lavapipe: the
//! window kernel's C read once an invocation), and look-alikes that must stay.

use super::*;

const M: usize = 48;
const K: usize = 64;
const N: usize = 32;

/// `x [2, M, K] @ w [K, N]`, then Add of `bias` (shape `bias_shape`, a constant unless
/// `bias_input`), with the bias first when `bias_first`; `also_out` makes the product a graph
/// output too.
fn bias_model(bias_shape: &[usize], bias_first: bool, bias_input: bool, also_out: bool) -> Vec<u8> {
    let add_ins = if bias_first {
        ["bias", "mm"]
    } else {
        ["mm", "bias"]
    };
    let mut weights = vec![weight("w", &[K, N], &fill(K * N, 31))];
    let mut inputs = vec!["x"];
    if bias_input {
        inputs.push("bias");
    } else {
        let n = bias_shape.iter().product();
        weights.push(weight("bias", bias_shape, &fill(n, 32)));
    }
    let mut outputs = vec!["y"];
    if also_out {
        outputs.push("mm");
    }
    model(
        vec![
            node("MatMul", "linear", &["x", "w"], &["mm"]),
            node("Add", "bias_add", &add_ins, &["y"]),
        ],
        weights,
        &inputs,
        &outputs,
    )
}

fn x() -> Tensor {
    Tensor::f32(&[2, M, K], fill(2 * M * K, 30))
}

#[test]
fn a_bias_add_folds_into_its_matmul() {
    for (shape, bias_first) in [(&[N][..], false), (&[1, N][..], true)] {
        let bytes = bias_model(shape, bias_first, false, false);
        let unfused = session(&bytes, Placement::Cpu, false);
        assert_eq!(unfused.graph().nodes.len(), 2);
        let want = unfused.run(&[("x", x())]).unwrap();
        for placement in [Placement::Cpu, Placement::Gpu] {
            let s = session(&bytes, placement, true);
            let (outs, report) = s.run_with_report(&[("x", x())]).unwrap();
            assert_eq!(s.graph().nodes.len(), 1, "{shape:?} {placement:?}");
            assert_eq!(
                report.fused.get("linear").map(String::as_str),
                Some("MatMul+Add")
            );
            let tol = if placement == Placement::Cpu {
                0.0
            } else {
                1e-5
            };
            assert_close(&outs[0].1, &want[0].1, tol, tol);
        }
    }
}

#[test]
fn bias_look_alikes_stay() {
    // a bias of two rows; one of higher rank than B, with A's rank unknown (it could broadcast
    // the product); a bias given at run time; the product also a graph output
    let cases: [(&[usize], bool, bool); 4] = [
        (&[2, 1, N], false, false),
        (&[1, 1, N], false, false),
        (&[N], true, false),
        (&[N], false, true),
    ];
    for (i, (shape, bias_input, also_out)) in cases.into_iter().enumerate() {
        let bytes = bias_model(shape, false, bias_input, also_out);
        let fused = session(&bytes, Placement::Cpu, true);
        assert_eq!(fused.graph().nodes.len(), 2, "case {i}");
        let mut feeds = vec![("x", x())];
        if bias_input {
            feeds.push(("bias", Tensor::f32(&[N], fill(N, 32))));
        }
        let plain = session(&bytes, Placement::Cpu, false);
        let (a, b) = (fused.run(&feeds).unwrap(), plain.run(&feeds).unwrap());
        assert_close(&a[0].1, &b[0].1, 0.0, 0.0);
    }
}
