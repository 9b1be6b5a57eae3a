//! The exact Gelu chain of BERT-style exports and the tanh one of jax2tf exports folded into
//! one Gelu (`fuse/gelu.rs`): fused on the CPU and the GPU (lavapipe) against the unfused
//! nodes' kernels, in both spellings of the exact chain's first node and both operand orders
//! of the Muls; and look-alikes that must stay.

use super::*;

const N: usize = 2 * 3 * 40;

/// `Mul(Mul(x, Add(Erf(first(x)), one)), half)` with `first` a Div by `c` or a Mul by `c`;
/// `swapped` puts the constants and the gate first in the Muls.
fn gelu_model(first: &str, c: f32, one: f32, swapped: bool) -> Vec<u8> {
    let pair = |a: &'static str, b: &'static str| if swapped { [b, a] } else { [a, b] };
    model(
        vec![
            node(first, "scale", &["x", "c"], &["d"]),
            node("Erf", "erf", &["d"], &["e"]),
            node("Add", "plus_one", &["e", "one"], &["g"]),
            node("Mul", "times_x", &pair("x", "g"), &["m"]),
            node("Mul", "half", &pair("m", "h"), &["y"]),
        ],
        vec![
            weight("c", &[], &[c]),
            weight("one", &[], &[one]),
            weight("h", &[], &[0.5]),
        ],
        &["x"],
        &["y"],
    )
}

fn x() -> Tensor {
    Tensor::f32(&[2, 3, 40], fill(N, 5))
}

#[test]
fn the_gelu_chain_becomes_one_node() {
    let sqrt2 = std::f32::consts::SQRT_2;
    for (first, c, swapped) in [("Div", sqrt2, false), ("Mul", 1.0 / sqrt2, true)] {
        let bytes = gelu_model(first, c, 1.0, swapped);
        let plain = session(&bytes, Placement::Cpu, false);
        assert_eq!(plain.graph().nodes.len(), 5);
        let want = plain.run(&[("x", x())]).unwrap().remove(0).1;
        for placement in [Placement::Cpu, Placement::Gpu] {
            let s = session(&bytes, placement, true);
            let (outs, report) = s.run_with_report(&[("x", x())]).unwrap();
            assert_close(&outs[0].1, &want, 1e-6, 1e-6);
            assert_eq!(s.graph().nodes.len(), 1, "{first} {placement:?}");
            assert_eq!(report.fused.get("scale").map(String::as_str), Some("Gelu"));
        }
    }
}

#[test]
fn gelu_look_alikes_stay() {
    // Adding 2 instead of 1, and dividing by 2 instead of sqrt 2: not Gelu.
    for (c, one) in [(std::f32::consts::SQRT_2, 2.0), (2.0, 1.0)] {
        let bytes = gelu_model("Div", c, one, false);
        let s = session(&bytes, Placement::Cpu, true);
        assert_eq!(s.graph().nodes.len(), 5, "c {c} one {one}");
        let got = s.run(&[("x", x())]).unwrap();
        let plain = session(&bytes, Placement::Cpu, false)
            .run(&[("x", x())])
            .unwrap();
        assert_close(&got[0].1, &plain[0].1, 0.0, 0.0);
    }
}

/// The tanh Gelu as jax2tf writes it (magika): `Mul(x, Mul(0.5, Add(1, Tanh(Mul(c, Add(x,
/// Mul(x, Mul(x, Mul(k, x)))))))))`; `swapped` puts every Mul's and Add's operands the other
/// way round; `one` is the constant added to the tanh, of shape `one_shape`.
fn tanh_gelu_model(k: f32, c: f32, one: f32, one_shape: &[usize], swapped: bool) -> Vec<u8> {
    let pair = |a: &'static str, b: &'static str| if swapped { [b, a] } else { [a, b] };
    model(
        vec![
            node("Mul", "cubic", &pair("k", "x"), &["a"]),
            node("Mul", "square", &pair("x", "a"), &["b"]),
            node("Mul", "cube", &pair("x", "b"), &["d"]),
            node("Add", "inner", &pair("x", "d"), &["e"]),
            node("Mul", "scaled", &pair("c", "e"), &["f"]),
            node("Tanh", "tanh", &["f"], &["t"]),
            node("Add", "plus_one", &pair("one", "t"), &["g"]),
            node("Mul", "half", &pair("h", "g"), &["m"]),
            node("Mul", "times_x", &pair("x", "m"), &["y"]),
        ],
        vec![
            weight("k", &[], &[k]),
            weight("c", &[], &[c]),
            weight("one", one_shape, &[one]),
            weight("h", &[], &[0.5]),
        ],
        &["x"],
        &["y"],
    )
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `bytes` with x declared of shape `[2, 3, 40]` (the fusion tests' inputs declare none), so
/// that the pass knows its rank, and, where `squeeze`, an Unsqueeze and a Squeeze of axis 3 in
/// front of the chain (as magika's conv output reaches its chain: x's rank through them).
fn shaped(bytes: Vec<u8>, squeeze: bool) -> Vec<u8> {
    let mut m = ModelProto::decode(bytes.as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    let dims = [2, 3, 40].map(|d| Dimension {
        dim_value: Some(d),
        dim_param: None,
    });
    let ty = g.input[0].r#type.as_mut().unwrap();
    ty.tensor_type.as_mut().unwrap().shape = Some(TensorShapeProto { dim: dims.to_vec() });
    if !squeeze {
        return m.encode_to_vec();
    }
    for n in &mut g.node {
        for i in &mut n.input {
            if i == "x" {
                *i = "xs".into();
            }
        }
    }
    g.node
        .insert(0, node("Unsqueeze", "unsq", &["x", "axis"], &["xu"]));
    g.node
        .insert(1, node("Squeeze", "sq", &["xu", "axis"], &["xs"]));
    g.initializer.push(TensorProto {
        dims: vec![1],
        data_type: data_type::INT64,
        name: "axis".into(),
        int64_data: vec![3],
        ..Default::default()
    });
    m.encode_to_vec()
}

#[test]
fn the_tanh_gelu_chain_becomes_one_node() {
    for (swapped, one_shape) in [(false, &[][..]), (true, &[1, 1, 1][..])] {
        let bytes = tanh_gelu_model(0.044715, SQRT_2_OVER_PI, 1.0, one_shape, swapped);
        let bytes = shaped(bytes, !one_shape.is_empty());
        let nodes = if one_shape.is_empty() { 9 } else { 11 };
        let plain = session(&bytes, Placement::Cpu, false);
        assert_eq!(plain.graph().nodes.len(), nodes);
        let want = plain.run(&[("x", x())]).unwrap().remove(0).1;
        for placement in [Placement::Cpu, Placement::Gpu] {
            let s = session(&bytes, placement, true);
            let (outs, report) = s.run_with_report(&[("x", x())]).unwrap();
            assert_close(&outs[0].1, &want, 1e-6, 1e-6);
            let after = s.graph().nodes.len();
            assert_eq!(after, nodes - 8, "{placement:?} swapped {swapped}");
            assert_eq!(report.fused.get("cubic").map(String::as_str), Some("Gelu"));
        }
    }
}

#[test]
fn tanh_gelu_look_alikes_stay() {
    // 0.05 for 0.044715, 2 added to the tanh, and a constant of rank 4 on x of rank 3 (the
    // result is of rank 4).
    for (k, one, one_shape) in [
        (0.05, 1.0, &[][..]),
        (0.044715, 2.0, &[][..]),
        (0.044715, 1.0, &[1, 1, 1, 1][..]),
    ] {
        let bytes = shaped(
            tanh_gelu_model(k, SQRT_2_OVER_PI, one, one_shape, false),
            false,
        );
        let s = session(&bytes, Placement::Cpu, true);
        eprintln!(
            "NODES {:?}",
            s.graph()
                .nodes
                .iter()
                .map(|n| n.op_type.clone())
                .collect::<Vec<_>>()
        );
        assert_eq!(s.graph().nodes.len(), 9, "k {k} one {one} {one_shape:?}");
        let got = s.run(&[("x", x())]).unwrap();
        let plain = session(&bytes, Placement::Cpu, false)
            .run(&[("x", x())])
            .unwrap();
        assert_eq!(got[0].1.shape, plain[0].1.shape);
        assert_close(&got[0].1, &plain[0].1, 0.0, 0.0);
    }
}
