//! Repeated nodes merged at load (`fuse/repeated.rs`): a model whose branches repeat a
//! `ConstantOfShape` weight, a Conv and a Relu (the light zoo's pattern) runs with one of each,
//! gives what the unmerged graph gives on the CPU and the GPU (lavapipe), and says so in its
//! report; look-alikes (another attribute, another constant, a large constant of equal
//! contents, a graph output) stay.

use super::*;

fn shape_init(name: &str, dims: &[i64]) -> TensorProto {
    TensorProto {
        dims: vec![dims.len() as i64],
        data_type: data_type::INT64,
        name: name.into(),
        raw_data: Some(dims.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    }
}

fn fill_with(n: NodeProto, v: f32) -> NodeProto {
    with_attr(
        n,
        AttributeProto {
            name: "value".into(),
            r#type: attribute_type::TENSOR,
            t: Some(weight("", &[1], &[v])),
            ..Default::default()
        },
    )
}

fn conv(name: &str, w: &str, out: &str, stride: i64) -> NodeProto {
    let c = node("Conv", name, &["x", w], &[out]);
    with_attr(
        with_attr(c, ints("pads", &[1, 1, 1, 1])),
        ints("strides", &[stride, stride]),
    )
}

/// Branches on `x` (`[1, 3, 8, 8]`): `a`, `b` repeat each other (weights from equal shape
/// initializers); `c` differs in the fill value, `d` in the stride, `e`/`f` read equal weights of
/// more than `SMALL_CONSTANT` elements; `p`, `q` are equal Relus that are graph outputs.
fn branches_model() -> Vec<u8> {
    let big = fill(4 * 3 * 3 * 3, 4);
    let nodes = vec![
        fill_with(node("ConstantOfShape", "wa", &["sa"], &["Wa"]), 0.25),
        fill_with(node("ConstantOfShape", "wb", &["sb"], &["Wb"]), 0.25),
        fill_with(node("ConstantOfShape", "wc", &["sb"], &["Wc"]), 0.5),
        conv("conv_a", "Wa", "ca", 1),
        conv("conv_b", "Wb", "cb", 1),
        conv("conv_c", "Wc", "c", 1),
        conv("conv_d", "Wa", "d", 2),
        conv("conv_e", "Be", "e", 1),
        conv("conv_f", "Bf", "f", 1),
        node("Relu", "relu_a", &["ca"], &["ra"]),
        node("Relu", "relu_b", &["cb"], &["rb"]),
        node("Add", "sum", &["ra", "rb"], &["y"]),
        node("Relu", "relu_p", &["x"], &["p"]),
        node("Relu", "relu_q", &["x"], &["q"]),
    ];
    let weights = vec![
        shape_init("sa", &[4, 3, 3, 3]),
        shape_init("sb", &[4, 3, 3, 3]),
        weight("Be", &[4, 3, 3, 3], &big),
        weight("Bf", &[4, 3, 3, 3], &big),
    ];
    model(nodes, weights, &["x"], &["y", "c", "d", "e", "f", "p", "q"])
}

#[test]
fn repeated_branches_run_once_and_match_the_unmerged_graph() {
    let bytes = branches_model();
    let x = Tensor::f32(&[1, 3, 8, 8], fill(3 * 64, 1));
    let feeds = [("x", x)];
    let plain = session(&bytes, Placement::Cpu, false);
    let (want, _) = plain.run_with_report(&feeds).unwrap();
    for placement in [Placement::Cpu, Placement::Gpu] {
        let s = session(&bytes, placement, true);
        let names: Vec<&str> = s.graph().nodes.iter().map(|n| n.name.as_str()).collect();
        for gone in ["wb", "conv_b", "relu_b"] {
            assert!(!names.contains(&gone), "{gone} still in {names:?}");
        }
        for kept in [
            "wc", "conv_c", "conv_d", "conv_e", "conv_f", "relu_p", "relu_q",
        ] {
            assert!(names.contains(&kept), "{kept} merged away: {names:?}");
        }
        let (outs, report) = s.run_with_report(&feeds).unwrap();
        assert_eq!(outs.len(), want.len());
        for ((name, got), (_, w)) in outs.iter().zip(&want) {
            assert_close(got, w, 1e-5, 1e-5);
            assert_eq!(got.shape, w.shape, "{name}");
        }
        let dropped: Vec<(&str, &str)> = report
            .merged
            .iter()
            .map(|m| (m.dropped.as_str(), m.kept.as_str()))
            .collect();
        assert_eq!(
            dropped,
            [("wb", "wa"), ("conv_b", "conv_a"), ("relu_b", "relu_a")]
        );
        let line = report.to_string();
        assert!(
            line.contains("merged at load: 3 node(s)")
                && line.contains("1 ConstantOfShape, 1 Conv, 1 Relu"),
            "{line}"
        );
    }
    // `y` is twice one branch: the merged Add reads one Relu's output twice.
    let (outs, _) = session(&bytes, Placement::Cpu, true)
        .run_with_report(&feeds)
        .unwrap();
    let half: Vec<f32> = outs[0]
        .1
        .as_f32()
        .unwrap()
        .iter()
        .map(|v| v / 2.0)
        .collect();
    let window_sum = |oy: usize, ox: usize| -> f32 {
        let xs = feeds[0].1.as_f32().unwrap();
        let mut s = 0.0;
        for c in 0..3 {
            for i in 0..3 {
                for j in 0..3 {
                    let (y, x) = (oy as i64 + i - 1, ox as i64 + j - 1);
                    if (0..8).contains(&y) && (0..8).contains(&x) {
                        s += xs[c * 64 + y as usize * 8 + x as usize];
                    }
                }
            }
        }
        (0.25 * s).max(0.0)
    };
    for (i, &h) in half[..64].iter().enumerate() {
        let want = window_sum(i / 8, i % 8);
        assert!(
            (h - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "{i}: {h} vs {want}"
        );
    }
}

#[test]
fn merging_is_off_with_fusion() {
    let s = session(&branches_model(), Placement::Cpu, false);
    assert_eq!(s.graph().nodes.len(), 14);
    let x = Tensor::f32(&[1, 3, 8, 8], fill(3 * 64, 1));
    let (_, report) = s.run_with_report(&[("x", x)]).unwrap();
    assert!(report.merged.is_empty());
    assert!(!report.to_string().contains("merged at load"));
}
