//! The exact Gelu chain of BERT-style exports folded into one Gelu (`fuse/gelu.rs`): fused on
//! the CPU and the GPU (lavapipe) against the unfused nodes' kernels, in both spellings of its
//! first node and both operand orders of its Muls; and look-alikes that must stay.

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
