//! The RMSNorm chain of exported Llama-style models folded into one RMSNormalization
//! (`fuse/rms_norm.rs`): `x / sqrt(mean(x^2 over the last axis) + eps) * scale` against a loop
//! written here, fused and unfused, on the CPU and the GPU (lavapipe); and look-alikes that
//! must stay as they are.

use super::*;

const ROWS: usize = 6;
const N: usize = 40;
const EPS: f32 = 1e-5;

/// The chain, squaring by `square` (`Pow` or `Mul`), reducing over `axes` with `keepdims`.
fn rms_model(square: &str, axes: &[i64], keepdims: i64) -> Vec<u8> {
    let sq = match square {
        "Pow" => node("Pow", "pow", &["x", "two"], &["sq"]),
        _ => node("Mul", "sq", &["x", "x"], &["sq"]),
    };
    let mean = with_attr(
        with_attr(
            node("ReduceMean", "mean", &["sq"], &["ms"]),
            ints("axes", axes),
        ),
        AttributeProto {
            name: "keepdims".into(),
            r#type: attribute_type::INT,
            i: Some(keepdims),
            ..Default::default()
        },
    );
    model(
        vec![
            sq,
            mean,
            node("Add", "add", &["eps", "ms"], &["mse"]),
            node("Sqrt", "sqrt", &["mse"], &["rms"]),
            node("Div", "div", &["x", "rms"], &["normed"]),
            node("Mul", "scale", &["normed", "w"], &["y"]),
        ],
        vec![
            weight("two", &[], &[2.0]),
            weight("eps", &[], &[EPS]),
            weight("w", &[N], &fill(N, 9)),
        ],
        &["x"],
        &["y"],
    )
}

/// RMSNorm over the last axis of `[2, ROWS / 2, N]`, in f64.
fn rms_norm(x: &[f32], w: &[f32]) -> Tensor {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(N) {
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / N as f64;
        let inv = 1.0 / (ms + EPS as f64).sqrt();
        y.extend(
            row.iter()
                .zip(w)
                .map(|(&v, &s)| (v as f64 * inv * s as f64) as f32),
        );
    }
    Tensor::f32(&[2, ROWS / 2, N], y)
}

#[test]
fn the_rms_norm_chain_becomes_one_node() {
    let x = Tensor::f32(&[2, ROWS / 2, N], fill(ROWS * N, 8));
    let want = rms_norm(x.as_f32().unwrap(), &fill(N, 9));
    for square in ["Pow", "Mul"] {
        let bytes = rms_model(square, &[-1], 1);
        for (placement, fuse) in [
            (Placement::Cpu, true),
            (Placement::Gpu, true),
            (Placement::Cpu, false),
        ] {
            let s = session(&bytes, placement, fuse);
            let (outs, report) = s.run_with_report(&[("x", x.clone())]).unwrap();
            assert_close(&outs[0].1, &want, 1e-5, 1e-5);
            let nodes = s.graph().nodes.len();
            if !fuse {
                assert_eq!(nodes, 6);
                continue;
            }
            assert_eq!(nodes, 1, "{square} {placement:?}");
            let first = if square == "Pow" { "pow" } else { "sq" };
            assert_eq!(
                report.fused.get(first).map(String::as_str),
                Some("RMSNormalization")
            );
            let ran = &report.nodes.iter().find(|n| *n.name == *first).unwrap().ran;
            let device = if placement == Placement::Gpu {
                "gpu"
            } else {
                "cpu"
            };
            assert_eq!(ran.to_string(), device);
        }
    }
}

#[test]
fn rms_norm_look_alikes_stay() {
    let x = Tensor::f32(&[2, ROWS / 2, N], fill(ROWS * N, 8));
    // Over another axis, and without keepdims (the Div then broadcasts differently).
    for (axes, keepdims) in [(&[1i64][..], 1), (&[-1][..], 0)] {
        let s = session(&rms_model("Pow", axes, keepdims), Placement::Cpu, true);
        assert_eq!(
            s.graph().nodes.len(),
            6,
            "axes {axes:?} keepdims {keepdims}"
        );
        let plain = session(&rms_model("Pow", axes, keepdims), Placement::Cpu, false);
        let got = s.run(&[("x", x.clone())]);
        let unfused = plain.run(&[("x", x.clone())]);
        match (got, unfused) {
            (Ok(a), Ok(b)) => assert_close(&a[0].1, &b[0].1, 0.0, 0.0),
            (a, b) => assert_eq!(a.is_err(), b.is_err()),
        }
    }
}
