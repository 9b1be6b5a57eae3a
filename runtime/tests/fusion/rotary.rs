//! The rotate-half rotary embedding of Llama-style exports folded into one Rotary node
//! (`fuse/rotary.rs`): against the seven unfused nodes run by the CPU kernels of their own ops,
//! on the CPU, the GPU (lavapipe) and split across both; the model fused and unfused, tables as
//! constants and as inputs (decode gathers them by position); and look-alikes that must stay.

use super::*;
use tandem::testing::run_cpu;
use tandem_ops::rotary::Rotary;

const HEADS: usize = 4;
const SEQ: usize = 6;
const D: usize = 8;

fn i64s(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        dims: vec![v.len() as i64],
        data_type: data_type::INT64,
        name: name.into(),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

/// How a model spells the chain: the Slices' bounds and axis, the Concat's order and axis, and
/// whether the tables are constants.
#[derive(Clone, Copy)]
struct Spelling {
    half: i64,
    end: i64,
    axis: i64,
    concat_axis: i64,
    neg_first: bool,
    tables_constant: bool,
    /// The Neg's output is also a graph output.
    neg_out: bool,
    /// x is `Transpose(xs, [0, 2, 1, 3])` of a graph input `xs` [1, SEQ, HEADS, D] (a head
    /// split), itself a graph output too when `x_out`.
    transposed: bool,
    x_out: bool,
}

const LLAMA: Spelling = Spelling {
    half: D as i64 / 2,
    end: i64::MAX,
    axis: -1,
    concat_axis: -1,
    neg_first: true,
    tables_constant: true,
    neg_out: false,
    transposed: false,
    x_out: false,
};

fn rotary_model(s: Spelling) -> Vec<u8> {
    let slice = |name: &str, start: &str, end: &str, out: &str| {
        node("Slice", name, &["x", start, end, "axis"], &[out])
    };
    let concat_ins: [&str; 2] = if s.neg_first {
        ["neg", "lo"]
    } else {
        ["lo", "neg"]
    };
    let concat = AttributeProto {
        name: "axis".into(),
        r#type: attribute_type::INT,
        i: Some(s.concat_axis),
        ..Default::default()
    };
    let mut weights = vec![
        i64s("zero", &[0]),
        i64s("half", &[s.half]),
        i64s("end", &[s.end]),
        i64s("axis", &[s.axis]),
    ];
    let mut inputs = vec![if s.transposed { "xs" } else { "x" }];
    if s.tables_constant {
        weights.push(weight("cos", &[SEQ, D], &fill(SEQ * D, 21)));
        weights.push(weight("sin", &[SEQ, D], &fill(SEQ * D, 22)));
    } else {
        inputs.extend(["cos", "sin"]);
    }
    let mut outputs = vec!["y"];
    if s.neg_out {
        outputs.push("neg");
    }
    if s.x_out {
        outputs.push("x");
    }
    let mut nodes = Vec::new();
    if s.transposed {
        nodes.push(transpose("split", "xs", "x", &[0, 2, 1, 3]));
    }
    nodes.extend([
        node("Mul", "plain", &["cos", "x"], &["xc"]),
        slice("lo_half", "zero", "half", "lo"),
        slice("hi_half", "half", "end", "hi"),
        node("Neg", "neg", &["hi"], &["neg"]),
        with_attr(node("Concat", "rot", &concat_ins, &["rot"]), concat),
        node("Mul", "rotated", &["rot", "sin"], &["rs"]),
        node("Add", "sum", &["rs", "xc"], &["y"]),
    ]);
    model(nodes, weights, &inputs, &outputs)
}

fn x() -> Tensor {
    Tensor::f32(&[1, HEADS, SEQ, D], fill(HEADS * SEQ * D, 20))
}

/// x before its head split, [1, SEQ, HEADS, D].
fn xs() -> Tensor {
    Tensor::f32(&[1, SEQ, HEADS, D], fill(HEADS * SEQ * D, 23))
}

fn tables() -> [Tensor; 2] {
    [
        Tensor::f32(&[SEQ, D], fill(SEQ * D, 21)),
        Tensor::f32(&[SEQ, D], fill(SEQ * D, 22)),
    ]
}

#[test]
fn the_rotary_chain_becomes_one_node() {
    for tables_constant in [true, false] {
        let bytes = rotary_model(Spelling {
            tables_constant,
            ..LLAMA
        });
        let mut feeds = vec![("x", x())];
        if !tables_constant {
            let [c, s] = tables();
            feeds.extend([("cos", c), ("sin", s)]);
        }
        let unfused = session(&bytes, Placement::Cpu, false);
        assert_eq!(unfused.graph().nodes.len(), 7);
        let want = unfused.run(&feeds).unwrap();
        for placement in [Placement::Cpu, Placement::Gpu] {
            let s = session(&bytes, placement, true);
            let (outs, report) = s.run_with_report(&feeds).unwrap();
            assert_eq!(s.graph().nodes.len(), 1, "{placement:?}");
            assert_eq!(report.fused.get("sum").map(String::as_str), Some("Rotary"));
            let ran = &report.nodes.iter().find(|n| *n.name == *"sum").unwrap().ran;
            let device = if placement == Placement::Gpu {
                "gpu"
            } else {
                "cpu"
            };
            assert_eq!(ran.to_string(), device);
            // the chain's operations in its order: the same bits on the CPU
            let tol = if placement == Placement::Cpu {
                0.0
            } else {
                1e-6
            };
            assert_close(&outs[0].1, &want[0].1, tol, tol);
        }
    }
}

#[test]
fn a_head_split_transpose_before_the_chain_folds_in() {
    for x_out in [false, true] {
        let bytes = rotary_model(Spelling {
            transposed: true,
            x_out,
            ..LLAMA
        });
        let feeds = [("xs", xs())];
        let want = session(&bytes, Placement::Cpu, false).run(&feeds).unwrap();
        for placement in [Placement::Cpu, Placement::Gpu] {
            let s = session(&bytes, placement, true);
            let (outs, report) = s.run_with_report(&feeds).unwrap();
            // the Transpose stays where x is also a graph output
            let (nodes, label) = match x_out {
                false => (1, "Transpose+Rotary"),
                true => (2, "Rotary"),
            };
            assert_eq!(s.graph().nodes.len(), nodes, "{placement:?} x_out {x_out}");
            assert_eq!(report.fused.get("sum").map(String::as_str), Some(label));
            let tol = if placement == Placement::Cpu {
                0.0
            } else {
                1e-6
            };
            for (got, want) in outs.iter().zip(&want) {
                assert_close(&got.1, &want.1, tol, tol);
            }
        }
    }
}

#[test]
fn rotary_look_alikes_stay() {
    let odd = [
        // the Slices on another axis; the Concat on another axis; the halves swapped
        Spelling { axis: 2, ..LLAMA },
        Spelling {
            concat_axis: 2,
            ..LLAMA
        },
        Spelling {
            neg_first: false,
            ..LLAMA
        },
        // an intermediate read outside the chain
        Spelling {
            neg_out: true,
            ..LLAMA
        },
    ];
    for (i, s) in odd.into_iter().enumerate() {
        let bytes = rotary_model(s);
        let fused = session(&bytes, Placement::Cpu, true);
        assert_eq!(fused.graph().nodes.len(), 7, "spelling {i}");
        let plain = session(&bytes, Placement::Cpu, false);
        match (fused.run(&[("x", x())]), plain.run(&[("x", x())])) {
            (Ok(a), Ok(b)) => assert_close(&a[0].1, &b[0].1, 0.0, 0.0),
            (a, b) => assert_eq!(a.is_err(), b.is_err(), "spelling {i}"),
        }
    }
}

/// Shapes of x (as stored), cos and sin, the Slices' split and end, and the perm x is read
/// through.
type Case<'a> = (
    &'a [usize],
    &'a [usize],
    &'a [usize],
    i64,
    i64,
    Option<Vec<usize>>,
);

/// The op alone on every placement, against the chain run by the CPU kernels of its ops:
/// broadcast tables of another rank, a split past the middle, a Slice end past the row, x read
/// through a head split's permutation.
#[test]
fn rotary_op_matches_its_chain_on_cpu_gpu_and_split() {
    let t = |shape: &[usize], seed: u32| Tensor::f32(shape, fill(shape.iter().product(), seed));
    let i = |v: i64| Tensor::new(vec![1], tandem_ops::Data::I64(vec![v]));
    let op = |name: &str, attrs: Attrs| tandem_ops::registry::build(name, &attrs).unwrap();
    let a = Attrs::new(17);
    let cases: [Case; 4] = [
        (&[1, HEADS, SEQ, 32], &[SEQ, 32], &[SEQ, 32], 16, 32, None),
        (&[2, 3, 5, 8], &[1, 1, 5, 8], &[5, 1], 3, i64::MAX, None),
        (&[3, 70], &[70], &[3, 1], 30, 70, None),
        (
            &[2, SEQ, HEADS, 32],
            &[SEQ, 32],
            &[SEQ, 32],
            16,
            32,
            Some(vec![0, 2, 1, 3]),
        ),
    ];
    for (xs, cs, ss, h, e, perm) in cases {
        let (stored, cos, sin) = (t(xs, 1), t(cs, 2), t(ss, 3));
        let x = match &perm {
            Some(p) => {
                let perm = AttrValue::Ints(p.iter().map(|&a| a as i64).collect());
                let transpose = op("Transpose", a.clone().with("perm", perm));
                run_cpu(transpose.as_ref(), std::slice::from_ref(&stored)).remove(0)
            }
            None => stored.clone(),
        };
        let slice = op("Slice", a.clone());
        let lo = run_cpu(slice.as_ref(), &[x.clone(), i(0), i(h), i(-1)]).remove(0);
        let hi = run_cpu(slice.as_ref(), &[x.clone(), i(h), i(e), i(-1)]).remove(0);
        let neg = run_cpu(op("Neg", a.clone()).as_ref(), &[hi]).remove(0);
        let concat = op("Concat", a.clone().with("axis", AttrValue::Int(-1)));
        let rot = run_cpu(concat.as_ref(), &[neg, lo]).remove(0);
        let mul = op("Mul", a.clone());
        let xc = run_cpu(mul.as_ref(), &[x.clone(), cos.clone()]).remove(0);
        let rs = run_cpu(mul.as_ref(), &[rot, sin.clone()]).remove(0);
        let want = run_cpu(op("Add", a.clone()).as_ref(), &[xc, rs]);
        let rotary = Rotary {
            half: h as usize,
            end: e as usize,
            perm,
        };
        check_all_placements(&rotary, &[stored, cos, sin], &want, 1e-6);
    }
}
