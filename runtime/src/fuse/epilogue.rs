//! The epilogue half of Conv fusion: which nodes reading a Conv's output (its BatchNormalization
//! and affine chain already folded into W and B) compute an activation the Conv can apply to
//! each output element ([`Activation`]), and which scalar Mul and Add nodes after that
//! activation it can apply too ([`Epilogue::post`]), and which Add of a residual ([`residual`]).
//!
//! Sits between the pass (`fuse.rs`: which Convs, the graph edit, the report) and the Conv's
//! epilogue (`tandem_ops::conv::Epilogue`). Patterns, each only when every value inside it has
//! no other reader and is no graph output, in the default ONNX domain:
//! - one node: Relu, LeakyRelu, Clip (constant bounds), Sigmoid, HardSigmoid, HardSwish;
//! - `Mul(x, Sigmoid(x))` (SiLU) and `Mul(x, HardSigmoid(x))` (HardSwish);
//! - `Div(Mul(x, Clip(Add(x, c), 0, d)), d)`, or `Mul` by `1/d` instead of the Div, operands of
//!   Add and the Muls in either order: HardSwish(1/d, c/d), as exporters for opsets before 14
//!   write it (paddle2onnx: c = 3, d = 6). `d` may differ from Clip's upper bound by rounding
//!   only (relative 1e-6);
//! - after any of these, Mul and Add nodes by scalar constants: `y * scale + shift`
//!   (PP-OCRv3's learnable affine blocks), composed in f64.
//!
//! A scalar constant is an f32 constant of one element and of rank at most the Conv output's,
//! so that broadcasting it keeps the output's shape. LeakyRelu's alpha and Clip's bounds are
//! read by running the op's own CPU kernel on probe inputs: LeakyRelu(-1) = -alpha, and
//! Clip(-inf), Clip(+inf) are the effective bounds whether they come from attributes (old
//! opsets) or inputs. HardSigmoid's alpha and beta come from the op (`Unary::kind_alpha_beta`).

use super::{const_of, default_domain, eval, is, is_op_of, Uses};
use crate::graph::{Graph, ValueId};
use tandem_ops::conv::{Activation, Epilogue};
use tandem_ops::unary::{Unary, UnaryKind};
use tandem_ops::{Op, Tensor, TensorMeta};

/// Absorbed nodes reported as one entry: `name` is the function a chain of nodes computes
/// (`HardSwish`); `None` for one node, reported by its op type.
pub(super) struct Part {
    pub name: Option<&'static str>,
    pub nodes: Vec<usize>,
}

impl Part {
    /// One node, reported by its op type.
    pub fn one(n: usize) -> Part {
        Part {
            name: None,
            nodes: vec![n],
        }
    }
}

/// Which of the patterns the pass looks for (`fuse.rs` reads them from the environment).
#[derive(Debug, Clone, Copy)]
pub(super) struct Patterns {
    /// HardSigmoid, HardSwish and the chains that compute HardSwish.
    pub hard: bool,
    /// Scalar Mul and Add after the activation.
    pub post: bool,
}

/// The epilogue of Conv `i` and the nodes it replaces, in graph order (the last one's output
/// becomes the Conv's); `None` when no activation reads the Conv's output.
pub(super) fn after(
    graph: &Graph,
    uses: &Uses,
    i: usize,
    patterns: Patterns,
) -> Option<(Epilogue, Vec<Part>)> {
    let out = graph.nodes[i].outputs[0];
    let rank = out_rank(graph, uses, i);
    let (act, mut parts) = activation(graph, uses, out, rank, patterns.hard)?;
    let mut ep = Epilogue::from(act);
    if patterns.post {
        let last = *parts.last()?.nodes.last()?;
        if let Some((post, nodes)) = post_affine(graph, uses, graph.nodes[last].outputs[0], rank) {
            ep.post = Some(post);
            parts.extend(nodes.into_iter().map(Part::one));
        }
    }
    Some((ep, parts))
}

/// The Add, or Sum of two inputs, that is the sole reader of Conv `i`'s output (after what the
/// Conv absorbed so far), and the other operand `z` it adds: when `z` is no constant (those go
/// into B or the affine), is made before node `i` (so the Conv can read it; a graph input is
/// made before every node) and has the same shape as the Conv's output by the declared shapes
/// (`metas`, see `crate::layout::declared_metas`), so that the Add does not broadcast. Models
/// whose shapes are only known once inputs are given keep the Add.
pub(super) fn residual(
    graph: &Graph,
    uses: &Uses,
    i: usize,
    metas: &[Option<TensorMeta>],
) -> Option<(usize, ValueId)> {
    let out = graph.nodes[i].outputs[0];
    let a = uses.sole_reader(out)?;
    if !(is(graph, a, "Add") || is(graph, a, "Sum")) {
        return None;
    }
    let z = match graph.nodes[a].inputs[..] {
        [Some(x), Some(z)] | [Some(z), Some(x)] if x == out && z != out => z,
        _ => return None,
    };
    let known = |v: ValueId| metas.get(v).and_then(Option::as_ref).map(|m| &m.shape);
    let same = known(out).is_some_and(|s| Some(s) == known(z));
    let made_before = uses.producer[z].is_none_or(|p| p < i);
    (same && made_before && const_of(graph, uses, z, 4).is_none()).then_some((a, z))
}

/// Rank of Conv `i`'s output: W's when W is constant, else 3 (the least a Conv has), so that a
/// constant of at most this rank never widens the output by broadcasting.
fn out_rank(graph: &Graph, uses: &Uses, i: usize) -> usize {
    let w = graph.nodes[i].inputs.get(1).copied().flatten();
    w.and_then(|w| const_of(graph, uses, w, 4))
        .map_or(3, |t| t.shape.len().max(3))
}

/// The activation reading `out` (the Conv's output) and the nodes it spans.
fn activation(
    graph: &Graph,
    uses: &Uses,
    out: ValueId,
    rank: usize,
    hard: bool,
) -> Option<(Activation, Vec<Part>)> {
    if uses.output[out] {
        return None;
    }
    match *uses.readers[out].as_slice() {
        [a] => Some((one_node(graph, uses, out, a, hard)?, vec![Part::one(a)])),
        [a, b] if a != b => [(a, b), (b, a)].into_iter().find_map(|(g, m)| {
            gated(graph, uses, out, g, m, hard).or_else(|| {
                hard.then(|| hard_swish_chain(graph, uses, out, (g, m), rank))
                    .flatten()
            })
        }),
        _ => None,
    }
}

/// The one node `a` reading `out` (first input), as an activation.
fn one_node(graph: &Graph, uses: &Uses, out: ValueId, a: usize, hard: bool) -> Option<Activation> {
    let node = &graph.nodes[a];
    if !default_domain(node) || node.outputs.len() != 1 || node.inputs.first() != Some(&Some(out)) {
        return None;
    }
    Some(match (node.op_type.as_str(), node.inputs.len()) {
        ("Relu", 1) => Activation::Relu,
        ("Sigmoid", 1) => Activation::Sigmoid,
        ("LeakyRelu", 1) => Activation::LeakyRelu(-probe(node.op.as_ref(), &[-1.0], &[])?[0]),
        ("Clip", _) => {
            let (lo, hi) = clip_bounds(graph, uses, a)?;
            Activation::Clip(lo, hi)
        }
        ("HardSigmoid", 1) if hard => {
            let (alpha, beta) = hard_sigmoid(node.op.as_ref())?;
            Activation::HardSigmoid(alpha, beta)
        }
        ("HardSwish", 1) if hard => Activation::HardSwish(1.0 / 6.0, 0.5),
        _ => return None,
    })
}

/// `Mul(x, gate(x))` with `g` the gate reading `out` and `m` the Mul: SiLU for a Sigmoid gate,
/// HardSwish for a HardSigmoid one.
fn gated(
    graph: &Graph,
    uses: &Uses,
    out: ValueId,
    g: usize,
    m: usize,
    hard: bool,
) -> Option<(Activation, Vec<Part>)> {
    let gate = &graph.nodes[g];
    if gate.inputs.len() != 1 {
        return None;
    }
    let act = if is(graph, g, "Sigmoid") {
        Activation::Silu
    } else if hard && is(graph, g, "HardSigmoid") {
        let (alpha, beta) = hard_sigmoid(gate.op.as_ref())?;
        Activation::HardSwish(alpha, beta)
    } else {
        return None;
    };
    let g_out = gate.outputs[0];
    if !is_op_of(graph, m, "Mul", out, g_out) || uses.sole_reader(g_out) != Some(m) {
        return None;
    }
    Some((act, vec![Part::one(g), Part::one(m)]))
}

/// `Div(Mul(x, Clip(Add(x, c), 0, d)), d)` (or the last step a Mul by `1/d`) with `a` the Add
/// and `m` the Mul reading `out`: HardSwish(1/d, c/d).
fn hard_swish_chain(
    graph: &Graph,
    uses: &Uses,
    out: ValueId,
    (a, m): (usize, usize),
    rank: usize,
) -> Option<(Activation, Vec<Part>)> {
    if !is(graph, a, "Add") {
        return None;
    }
    let c = scalar_operand(graph, uses, a, out, rank)?;
    let a_out = graph.nodes[a].outputs[0];
    let clip = uses.sole_reader(a_out)?;
    if !is(graph, clip, "Clip") || graph.nodes[clip].inputs.first() != Some(&Some(a_out)) {
        return None;
    }
    let (lo, hi) = clip_bounds(graph, uses, clip)?;
    let clip_out = graph.nodes[clip].outputs[0];
    if uses.sole_reader(clip_out) != Some(m) || !is_op_of(graph, m, "Mul", out, clip_out) {
        return None;
    }
    let m_out = graph.nodes[m].outputs[0];
    let d = uses.sole_reader(m_out)?;
    let ins = &graph.nodes[d].inputs;
    // The factor the product is scaled by: 1 / divisor, or the Mul's constant.
    let scale = if is(graph, d, "Div") && ins.len() == 2 && ins[0] == Some(m_out) {
        1.0 / scalar_operand(graph, uses, d, m_out, rank)?
    } else if is(graph, d, "Mul") {
        scalar_operand(graph, uses, d, m_out, rank)?
    } else {
        return None;
    };
    let upper_is_one = (hi as f64 * scale - 1.0).abs() <= 1e-6;
    if lo != 0.0 || !upper_is_one {
        return None;
    }
    let part = Part {
        name: Some("HardSwish"),
        nodes: vec![a, clip, m, d],
    };
    Some((
        Activation::HardSwish(scale as f32, (c * scale) as f32),
        vec![part],
    ))
}

/// Scalar Mul and Add nodes reading `y` one after the other (each the sole reader of the
/// value before it), composed into `v -> v * scale + shift`; `None` when there are none.
fn post_affine(
    graph: &Graph,
    uses: &Uses,
    y: ValueId,
    rank: usize,
) -> Option<((f32, f32), Vec<usize>)> {
    let (mut scale, mut shift) = (1.0f64, 0.0f64);
    let mut nodes = Vec::new();
    let mut cur = y;
    while let Some(r) = uses.sole_reader(cur) {
        let mul = is(graph, r, "Mul");
        if !mul && !is(graph, r, "Add") {
            break;
        }
        let Some(k) = scalar_operand(graph, uses, r, cur, rank) else {
            break;
        };
        if mul {
            scale *= k;
            shift *= k;
        } else {
            shift += k;
        }
        nodes.push(r);
        cur = graph.nodes[r].outputs[0];
    }
    (!nodes.is_empty()).then_some(((scale as f32, shift as f32), nodes))
}

/// The other operand of two-input node `n` that reads `cur` once, when it is a finite scalar
/// f32 constant of rank at most `rank`.
fn scalar_operand(graph: &Graph, uses: &Uses, n: usize, cur: ValueId, rank: usize) -> Option<f64> {
    let other = match graph.nodes[n].inputs.as_slice() {
        [Some(a), Some(b)] if *a == cur && *b != cur => *b,
        [Some(a), Some(b)] if *b == cur && *a != cur => *a,
        _ => return None,
    };
    let t = const_of(graph, uses, other, 4)?;
    match t.as_f32()? {
        [v] if t.shape.len() <= rank && v.is_finite() => Some(*v as f64),
        _ => None,
    }
}

/// Clip node `n`'s effective bounds; its bound inputs must be constants.
fn clip_bounds(graph: &Graph, uses: &Uses, n: usize) -> Option<(f32, f32)> {
    let node = &graph.nodes[n];
    let mut bounds = Vec::new();
    for v in &node.inputs[1..] {
        bounds.push(match v {
            Some(v) => const_of(graph, uses, *v, 4)?.as_ref().clone(),
            None => Tensor::f32(&[0], Vec::new()),
        });
    }
    let y = probe(
        node.op.as_ref(),
        &[f32::NEG_INFINITY, f32::INFINITY],
        &bounds,
    )?;
    Some((y[0], y[1]))
}

/// HardSigmoid's (alpha, beta); `None` for an op that is not tandem's HardSigmoid.
fn hard_sigmoid(op: &dyn Op) -> Option<(f32, f32)> {
    match op.as_any()?.downcast_ref::<Unary>()?.kind_alpha_beta() {
        (UnaryKind::HardSigmoid, alpha, beta) => Some((alpha, beta)),
        _ => None,
    }
}

/// `op` run on the CPU with input 0 = `x` (a 1-D f32 tensor) and `rest` after it; its first
/// output as f32, or `None` if the op refuses (the pass then leaves the node alone).
fn probe(op: &dyn Op, x: &[f32], rest: &[Tensor]) -> Option<Vec<f32>> {
    let x = Tensor::f32(&[x.len()], x.to_vec());
    let mut ins = vec![&x];
    ins.extend(rest.iter());
    Some(eval(op, &ins, 1)?.first()?.as_f32()?.to_vec())
}
