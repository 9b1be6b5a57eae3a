//! Operator fusion: a graph rewrite that folds a following BatchNormalization into a Conv's weights
//! and bias, and a following activation (Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid, HardSwish,
//! and the multi-node SiLU and HardSwish patterns) with scalar Mul and Add nodes after it into
//! the Conv as an epilogue ([`Epilogue`]; the patterns are in `fuse/epilogue.rs`), so each runs
//! in the Conv's pass over its output instead of a pass of its own; so does an Add (or
//! two-input Sum) of a residual after the Conv or after its activation, which becomes the
//! Conv's fourth input Z (`fuse_residual`; only where the declared shapes show Z has the
//! output's shape, `crate::layout::declared_metas`), and an activation after that Add.
//! A ConvTranspose folds the chain of BatchNormalization and per-channel Mul and Add nodes
//! after it into its W and B the same way (`fold_affine_transposed`; ppocr_det adds a bias and
//! runs a BatchNormalization after each up-conv). A BatchNormalization that follows no Conv
//! (nor ConvTranspose) takes in the per-channel Mul and Add nodes after
//! it instead (its scale and B change; densenet121 runs BN, Mul, Add on every Concat), where
//! the rank of its input is known before any shape is (`rank_of`), and a Relu after those
//! (applied in the same pass, `BatchNorm::relu`). A Transpose that only feeds a MatMul folds
//! into it: the MatMul reads that operand through the permutation (`fuse/matmul_operands.rs`).
//! An attention block's `MatMul(Q, Kt)`, scale, mask (Add, or Where of a bool mask and a
//! scalar), Softmax and `MatMul(P, V)` become one
//! Attention node (`fuse/attention.rs`), after those folds.
//! The six-node RMSNorm of exported Llama-style models becomes one RMSNormalization
//! (`fuse/rms_norm.rs`), and the five-node exact Gelu of BERT-style exports and the nine-node
//! tanh Gelu of jax2tf exports one Gelu (`fuse/gelu.rs`), and the seven-node rotate-half
//! rotary embedding of Llama-style exports one Rotary (`fuse/rotary.rs`). Last, an Add of a
//! constant one-row bias after a MatMul becomes the MatMul's third input
//! (`fuse/matmul_bias.rs`). Before all that, a
//! node that repeats an earlier node's op, attributes and inputs is dropped and its readers
//! read the earlier one's outputs (`fuse/repeated.rs`).
//!
//! Sits between the importer (`import.rs`, which builds the [`Graph`]) and the planner: a
//! [`crate::Session`] runs it once at load time unless `SessionOptions::fuse(false)`.
//!
//! Rules: a node is absorbed only when the value between it and the Conv is not a graph output
//! and has no other reader, and only in the default ONNX domain. A chain of per-channel affine
//! nodes is folded into W and B: BatchNormalization (`W' = W * s / sqrt(var + eps)` per output
//! channel, `B' = (B - mean) * s / sqrt(var + eps) + beta`), and Mul or Add by a per-channel or
//! scalar constant (the light zoo's inception_v2 and densenet121 follow each BN with one of
//! each), only when W (and B, if any) and every parameter are f32 constants of the right
//! shapes; computed in f64, stored as new f32 constants. "Constant" includes
//! the output of a node whose inputs are all constants (the light zoo models make their weights
//! with `ConstantOfShape`), evaluated here as the planner would fold it. Inputs left without a
//! reader are dropped with the nodes that only made them; others keep them. Anything else is
//! left as it is: the pass never fails a model that loads.
//!
//! BatchNormalization's epsilon comes from the op (`BatchNorm::epsilon`).
//!
//! For A/B timing in one build: `TANDEM_FUSE_HARDSWISH=0` leaves HardSigmoid, HardSwish and
//! the scalar affine after an activation unfused (the pass as it was before them);
//! `TANDEM_FUSE_POST_AFFINE=0` leaves only the scalar affine unfused; `TANDEM_FUSE_RESIDUAL=0`
//! leaves residual Adds; `TANDEM_FUSE_BN_RELU=0` leaves Relus after a lone BatchNormalization;
//! `TANDEM_FUSE_TRANSPOSE=0` leaves Transposes before MatMuls unfused;
//! `TANDEM_FUSE_ATTENTION=0` leaves attention chains; `TANDEM_FUSE_GELU=0` leaves Gelu chains;
//! `TANDEM_FUSE_RMS_NORM=0` leaves RMSNorm chains; `TANDEM_FUSE_ROTARY=0` leaves rotary
//! chains; `TANDEM_FUSE_MATMUL_BIAS=0` leaves bias Adds after MatMuls;
//! `TANDEM_FUSE_REPEATED=0` leaves repeated nodes.

use crate::graph::{Dim, Graph, Node, Value, ValueId};
use std::collections::HashSet;
use std::sync::Arc;
use tandem_ops::conv::{Absorbed, Activation, Conv, Epilogue, Residual};
use tandem_ops::conv_transpose::ConvTranspose;
use tandem_ops::matmul::MatMul;
use tandem_ops::norm_channel::BatchNorm;
use tandem_ops::rotary::Rotary;
use tandem_ops::{DType, Op, Tensor, TensorMeta};

mod attention;
mod epilogue;
mod gelu;
mod matmul_bias;
mod matmul_operands;
pub mod repeated;
mod rms_norm;
mod rotary;
use epilogue::{Part, Patterns};

/// What the pass did: one entry per Conv or BatchNormalization that absorbed something.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FuseSummary {
    /// (Conv node name, label such as `Conv+BatchNormalization+Relu`).
    pub fused: Vec<(String, String)>,
    /// The nodes dropped for repeating an earlier one ([`repeated::merge`]).
    pub merged: Vec<repeated::Merged>,
}

/// The label of a node for reports: `Conv+BatchNormalization+Relu` for a fused Conv,
/// `BatchNormalization+Mul+Add` for a BatchNormalization that took in what followed it,
/// `Transpose+MatMul` for a MatMul that reads an operand through a permutation (one
/// `Transpose+` per such operand; `+Add` after it when it adds a bias), `Transpose+Rotary`
/// likewise, else its op type.
pub fn label(node: &Node) -> String {
    if let Some(mm) = node.op.as_any().and_then(|a| a.downcast_ref::<MatMul>()) {
        let folded = mm.perms.iter().flatten().count();
        let bias = if mm.bias { "+Add" } else { "" };
        return "Transpose+".repeat(folded) + &node.op_type + bias;
    }
    if let Some(r) = node.op.as_any().and_then(|a| a.downcast_ref::<Rotary>()) {
        return "Transpose+".repeat(usize::from(r.perm.is_some())) + &node.op_type;
    }
    let transposed = node
        .op
        .as_any()
        .and_then(|a| a.downcast_ref::<ConvTranspose>());
    let absorbed: Vec<&str> = match (as_conv(node.op.as_ref()), as_batch_norm(node.op.as_ref())) {
        (Some(c), _) => c.absorbed.iter().map(|a| a.op_type.as_str()).collect(),
        (_, Some(bn)) => bn.absorbed.iter().map(String::as_str).collect(),
        _ => transposed.map_or(Vec::new(), |t| {
            t.absorbed.iter().map(String::as_str).collect()
        }),
    };
    let mut s = node.op_type.clone();
    for a in absorbed {
        s.push('+');
        s.push_str(a);
    }
    s
}

fn as_batch_norm(op: &dyn Op) -> Option<&BatchNorm> {
    op.as_any()?.downcast_ref::<BatchNorm>()
}

fn as_conv(op: &dyn Op) -> Option<&Conv> {
    op.as_any()?.downcast_ref::<Conv>()
}

/// Readers of each value (node index per input slot, so a node reading a value twice counts
/// twice), whether it is a graph output, and its producer.
struct Uses {
    readers: Vec<Vec<usize>>,
    output: Vec<bool>,
    producer: Vec<Option<usize>>,
}

impl Uses {
    fn of(graph: &Graph) -> Uses {
        let mut readers = vec![Vec::new(); graph.values.len()];
        let mut producer = vec![None; graph.values.len()];
        for (i, n) in graph.nodes.iter().enumerate() {
            for v in n.inputs.iter().flatten() {
                readers[*v].push(i);
            }
            for &v in &n.outputs {
                producer[v] = Some(i);
            }
        }
        let mut output = vec![false; graph.values.len()];
        for &v in &graph.outputs {
            output[v] = true;
        }
        Uses {
            readers,
            output,
            producer,
        }
    }

    /// The single reader of `v`, when `v` is not a graph output and that reader reads it once.
    fn sole_reader(&self, v: ValueId) -> Option<usize> {
        match self.readers[v].as_slice() {
            [r] if !self.output[v] => Some(*r),
            _ => None,
        }
    }
}

/// Fuse every Conv of `graph` with what follows it (see the module doc). Node order stays
/// topological; absorbed nodes are removed; values left without a reader stay in the graph.
pub fn fuse(graph: &mut Graph) -> FuseSummary {
    let on = |var: &str| std::env::var(var).map_or(true, |v| v != "0");
    let hard = on("TANDEM_FUSE_HARDSWISH");
    let (transposes, rms_norms) = (on("TANDEM_FUSE_TRANSPOSE"), on("TANDEM_FUSE_RMS_NORM"));
    let (attention, gelus) = (on("TANDEM_FUSE_ATTENTION"), on("TANDEM_FUSE_GELU"));
    let residuals = on("TANDEM_FUSE_RESIDUAL");
    let rotaries = on("TANDEM_FUSE_ROTARY");
    let biases = on("TANDEM_FUSE_MATMUL_BIAS");
    let bn_relu = on("TANDEM_FUSE_BN_RELU");
    let mut summary = FuseSummary::default();
    if on("TANDEM_FUSE_REPEATED") {
        summary.merged = repeated::merge(graph);
    }
    // Declared shapes, for the residual rule; computed on the graph as loaded, on first need.
    let mut metas: Option<Vec<Option<TensorMeta>>> = None;
    let patterns = Patterns {
        hard,
        post: hard && on("TANDEM_FUSE_POST_AFFINE"),
    };
    let uses = Uses::of(graph);
    let mut names: HashSet<String> = graph.values.iter().map(|v| v.name.clone()).collect();
    let mut removed = vec![false; graph.nodes.len()];
    let mut dropped: Vec<ValueId> = Vec::new();
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        if removed[i] || node.op_type != "Conv" || !default_domain(node) {
            continue;
        }
        let Some(conv) = as_conv(node.op.as_ref()) else {
            continue;
        };
        if node.outputs.len() != 1 || conv.epilogue() != Epilogue::default() {
            continue;
        }
        let mut fused = conv.clone();
        if let Some((w, b, chain)) = fold_affine(graph, &uses, i) {
            let base = graph.nodes[i].name.clone();
            let w = add_constant(graph, &mut names, &base, "W", w);
            let b = add_constant(graph, &mut names, &base, "B", b);
            dropped.extend(graph.nodes[i].inputs[1..].iter().flatten());
            let conv_node = &mut graph.nodes[i];
            conv_node.inputs.resize(3, None);
            conv_node.inputs[1] = Some(w);
            conv_node.inputs[2] = Some(b);
            let parts: Vec<Part> = chain.into_iter().map(Part::one).collect();
            absorb(
                graph,
                &uses,
                (&mut fused, i),
                &parts,
                (&mut removed, &mut dropped),
            );
        }
        if let Some((ep, parts)) = epilogue::after(graph, &uses, i, patterns) {
            (fused.activation, fused.post) = (ep.act, ep.post);
            absorb(
                graph,
                &uses,
                (&mut fused, i),
                &parts,
                (&mut removed, &mut dropped),
            );
        }
        if residuals {
            let metas = metas.get_or_insert_with(|| crate::layout::declared_metas(graph));
            fuse_residual(
                graph,
                &uses,
                (&mut fused, i),
                metas,
                patterns,
                &mut names,
                (&mut removed, &mut dropped),
            );
        }
        if !fused.absorbed.is_empty() {
            let node = &mut graph.nodes[i];
            node.op = Box::new(fused);
            summary.fused.push((node.name.clone(), label(node)));
        }
    }
    for i in 0..graph.nodes.len() {
        let Some((mut op, (w, b), chain)) = (!removed[i])
            .then(|| fold_affine_transposed(graph, &uses, i))
            .flatten()
        else {
            continue;
        };
        let base = graph.nodes[i].name.clone();
        let w = add_constant(graph, &mut names, &base, "W", w);
        let b = add_constant(graph, &mut names, &base, "B", b);
        let node = &mut graph.nodes[i];
        dropped.extend(node.inputs[1..].iter().flatten());
        node.inputs.resize(3, None);
        (node.inputs[1], node.inputs[2]) = (Some(w), Some(b));
        op.absorbed = chain
            .iter()
            .map(|&r| graph.nodes[r].op_type.clone())
            .collect();
        take_over(graph, &uses, i, &chain, (&mut removed, &mut dropped));
        let node = &mut graph.nodes[i];
        node.op = Box::new(op);
        summary.fused.push((node.name.clone(), label(node)));
    }
    for i in 0..graph.nodes.len() {
        if removed[i] {
            continue;
        }
        let Some((bn, (scale, beta), chain)) = fold_into_batch_norm(graph, &uses, i, bn_relu)
        else {
            continue;
        };
        let base = graph.nodes[i].name.clone();
        let scale = add_constant(graph, &mut names, &base, "scale", scale);
        let beta = add_constant(graph, &mut names, &base, "B", beta);
        let node = &mut graph.nodes[i];
        dropped.extend(node.inputs[1..3].iter().flatten());
        (node.inputs[1], node.inputs[2]) = (Some(scale), Some(beta));
        take_over(graph, &uses, i, &chain, (&mut removed, &mut dropped));
        let node = &mut graph.nodes[i];
        node.op = Box::new(bn);
        summary.fused.push((node.name.clone(), label(node)));
    }
    for i in (0..graph.nodes.len()).filter(|_| transposes) {
        let Some((matmul, folded)) = matmul_operands::transposes_into(graph, &uses, i) else {
            continue;
        };
        for (slot, t) in folded {
            graph.nodes[i].inputs[slot] = graph.nodes[t].inputs[0];
            removed[t] = true;
        }
        let node = &mut graph.nodes[i];
        node.op = Box::new(matmul);
        summary.fused.push((node.name.clone(), label(node)));
    }
    for i in (0..graph.nodes.len()).filter(|_| attention) {
        let Some(chain) = (!removed[i])
            .then(|| attention::chain_from(graph, &uses, i))
            .flatten()
        else {
            continue;
        };
        let absorbed: Vec<usize> = std::iter::once(i).chain(chain.absorbed).collect();
        if absorbed.iter().chain([&chain.last]).any(|&n| removed[n]) {
            continue;
        }
        let gone: HashSet<String> = absorbed
            .iter()
            .map(|&n| graph.nodes[n].name.clone())
            .collect();
        absorbed.iter().for_each(|&n| removed[n] = true);
        dropped.extend(chain.dropped);
        let node = &mut graph.nodes[chain.last];
        summary
            .fused
            .retain(|(n, _)| !gone.contains(n) && *n != node.name);
        node.inputs = chain.inputs.into_iter().map(Some).collect();
        node.op_type = "Attention".into();
        node.op = Box::new(chain.op);
        summary.fused.push((node.name.clone(), label(node)));
    }
    for i in (0..graph.nodes.len()).filter(|_| rms_norms) {
        if removed[i] {
            continue;
        }
        let Some(chain) = rms_norm::chain_from(graph, &uses, i) else {
            continue;
        };
        let node = &mut graph.nodes[i];
        dropped.extend(node.inputs.iter().flatten());
        node.inputs = vec![Some(chain.x), Some(chain.scale)];
        node.op_type = "RMSNormalization".into();
        node.op = tandem_ops::norm::rms_norm_last_axis(chain.eps);
        take_over(graph, &uses, i, &chain.rest, (&mut removed, &mut dropped));
        let node = &graph.nodes[i];
        summary.fused.push((node.name.clone(), label(node)));
    }
    for i in (0..graph.nodes.len()).filter(|_| gelus) {
        let Some(chain) = (!removed[i])
            .then(|| gelu::chain_from(graph, &uses, i))
            .flatten()
        else {
            continue;
        };
        if chain.rest.iter().any(|&n| removed[n]) {
            continue;
        }
        let node = &mut graph.nodes[i];
        dropped.extend(node.inputs.iter().flatten());
        node.inputs = vec![Some(chain.x)];
        node.op_type = "Gelu".into();
        let mut attrs = tandem_ops::Attrs::new(20);
        if chain.tanh {
            attrs = attrs.with("approximate", tandem_ops::AttrValue::String("tanh".into()));
        }
        node.op = tandem_ops::unary::gelu(&attrs).expect("Gelu's attributes are valid");
        take_over(graph, &uses, i, &chain.rest, (&mut removed, &mut dropped));
        let node = &graph.nodes[i];
        summary.fused.push((node.name.clone(), label(node)));
    }
    for i in (0..graph.nodes.len()).filter(|_| rotaries) {
        let Some(chain) = (!removed[i])
            .then(|| rotary::chain_from(graph, &uses, i))
            .flatten()
        else {
            continue;
        };
        if chain.absorbed.iter().any(|&n| removed[n]) {
            continue;
        }
        chain.absorbed.iter().for_each(|&n| removed[n] = true);
        dropped.extend(chain.dropped);
        let node = &mut graph.nodes[i];
        node.inputs = chain.inputs.map(Some).to_vec();
        node.op_type = "Rotary".into();
        node.op = Box::new(chain.op);
        summary.fused.push((node.name.clone(), label(node)));
    }
    for i in (0..graph.nodes.len()).filter(|_| biases) {
        let Some((matmul, add, bias)) = (!removed[i])
            .then(|| matmul_bias::bias_after(graph, &uses, i))
            .flatten()
        else {
            continue;
        };
        if removed[add] {
            continue;
        }
        take_over(graph, &uses, i, &[add], (&mut removed, &mut dropped));
        let node = &mut graph.nodes[i];
        node.inputs.push(Some(bias));
        node.op = Box::new(matmul);
        summary.fused.retain(|(n, _)| *n != node.name);
        summary.fused.push((node.name.clone(), label(node)));
    }
    drop_unread(graph, &uses, &mut removed, dropped);
    let mut keep = removed.iter().map(|r| !r);
    graph.nodes.retain(|_| keep.next().unwrap_or(true));
    summary
}

/// The Add (or two-input Sum) of a residual after Conv `i` and what it absorbed so far
/// ([`epilogue::residual`]), absorbed as the Conv's fourth input Z: after the activation when
/// the Conv has one, else before it, and then the activation after the Add is absorbed too
/// (ResNet's `Relu(Add(Conv, z))`). A Conv without B gets a zero B (Z is input 3), which needs a
/// constant W to size it.
fn fuse_residual(
    graph: &mut Graph,
    uses: &Uses,
    (fused, i): (&mut Conv, usize),
    metas: &[Option<TensorMeta>],
    patterns: Patterns,
    names: &mut HashSet<String>,
    (removed, dropped): (&mut [bool], &mut Vec<ValueId>),
) {
    let Some((add, z)) = epilogue::residual(graph, uses, i, metas) else {
        return;
    };
    if graph.nodes[i].inputs.get(2).copied().flatten().is_none() {
        let w = graph.nodes[i].inputs[1].and_then(|w| const_of(graph, uses, w, 4));
        let Some(m) = w.and_then(|w| w.shape.first().copied()) else {
            return;
        };
        let base = graph.nodes[i].name.clone();
        let b = add_constant(graph, names, &base, "B", Tensor::f32(&[m], vec![0.0; m]));
        graph.nodes[i].inputs.resize(3, None);
        graph.nodes[i].inputs[2] = Some(b);
    }
    let before_act = fused.activation == Activation::None && fused.post.is_none();
    fused.residual = if before_act {
        Residual::BeforeAct
    } else {
        Residual::AfterAct
    };
    absorb(
        graph,
        uses,
        (fused, i),
        &[Part::one(add)],
        (removed, dropped),
    );
    graph.nodes[i].inputs.push(Some(z));
    if before_act {
        if let Some((ep, parts)) = epilogue::after(graph, uses, i, patterns) {
            (fused.activation, fused.post) = (ep.act, ep.post);
            absorb(graph, uses, (fused, i), &parts, (removed, dropped));
        }
    }
}

/// Values the folds stopped reading (`dropped`): once no remaining node reads one and it is no
/// graph output, its constant is freed, or the node that made it is removed (when none of its
/// outputs is read), and so on up that node's inputs.
fn drop_unread(graph: &mut Graph, uses: &Uses, removed: &mut [bool], mut dropped: Vec<ValueId>) {
    let mut reads = vec![0usize; graph.values.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        if !removed[i] {
            n.inputs.iter().flatten().for_each(|&v| reads[v] += 1);
        }
    }
    let unread =
        |reads: &[usize], v: ValueId| reads[v] == 0 && !uses.output.get(v).is_some_and(|&o| o);
    while let Some(v) = dropped.pop() {
        if !unread(&reads, v) {
            continue;
        }
        match uses.producer.get(v).copied().flatten() {
            None => graph.values[v].constant = None,
            Some(p) => {
                let node = &graph.nodes[p];
                if removed[p] || !node.outputs.iter().all(|&o| unread(&reads, o)) {
                    continue;
                }
                removed[p] = true;
                for &u in node.inputs.iter().flatten() {
                    reads[u] -= 1;
                    dropped.push(u);
                }
            }
        }
    }
}

fn default_domain(node: &Node) -> bool {
    node.domain.is_empty() || node.domain == "ai.onnx"
}

/// Node `n` is `op` in the default domain with one output.
fn is(graph: &Graph, n: usize, op: &str) -> bool {
    let node = &graph.nodes[n];
    node.op_type == op && default_domain(node) && node.outputs.len() == 1
}

/// Node `n` is `op` ([`is`]) of `x` and `y`, in either order.
fn is_op_of(graph: &Graph, n: usize, op: &str, x: ValueId, y: ValueId) -> bool {
    let ins = &graph.nodes[n].inputs[..];
    is(graph, n, op) && (ins == [Some(x), Some(y)] || ins == [Some(y), Some(x)])
}

/// The nodes of `parts` (reading Conv `i`'s output, directly or through the nodes before them)
/// are absorbed, one report entry per part: the Conv takes over the last node's output, the
/// nodes are removed, and their other inputs (constants) are left to [`drop_unread`].
fn absorb(
    graph: &mut Graph,
    uses: &Uses,
    (fused, i): (&mut Conv, usize),
    parts: &[Part],
    (removed, dropped): (&mut [bool], &mut Vec<ValueId>),
) {
    for part in parts {
        let nodes = part.nodes.iter().map(|&a| &graph.nodes[a]);
        let names: Vec<&str> = nodes.clone().map(|n| n.name.as_str()).collect();
        let first = nodes.clone().next().map_or("", |n| n.op_type.as_str());
        fused.absorbed.push(Absorbed {
            op_type: part.name.unwrap_or(first).to_string(),
            node: names.join(","),
        });
        take_over(graph, uses, i, &part.nodes, (removed, dropped));
    }
}

/// Node `i` takes over the output of the last of `nodes` (which read its output one after the
/// other); the nodes are removed and their other inputs (constants) left to [`drop_unread`].
fn take_over(
    graph: &mut Graph,
    uses: &Uses,
    i: usize,
    nodes: &[usize],
    (removed, dropped): (&mut [bool], &mut Vec<ValueId>),
) {
    for &a in nodes {
        // Node i's own output is no constant: its producer stays.
        let ins = graph.nodes[a].inputs.iter().flatten();
        dropped.extend(ins.filter(|&&v| uses.producer[v] != Some(i)));
        removed[a] = true;
        graph.nodes[i].outputs[0] = graph.nodes[a].outputs[0];
    }
}

/// Per output channel, `y -> y * k + shift` (f64).
type Affine = (Vec<f64>, Vec<f64>);

/// The chain of per-channel affine nodes reading Conv `i`'s output one after the other (each
/// the sole reader of the value before it): BatchNormalization, and Mul or Add by a constant
/// that is one value per channel or a scalar. Returns W' and B' with the chain folded in, and
/// the chain's nodes; `None` when the chain is empty or W, B or a parameter is not constant.
fn fold_affine(graph: &Graph, uses: &Uses, i: usize) -> Option<(Tensor, Tensor, Vec<usize>)> {
    let conv = &graph.nodes[i];
    let w_t = f32_const(graph, uses, *conv.inputs.get(1)?)?;
    let (w_shape, w) = (&w_t.shape, w_t.as_f32()?);
    let m = *w_shape.first()?;
    // `w.len() < m`: a W with no elements can declare any number of channels (a hostile model
    // asked for 2^40): the tables below are sized by m.
    if w_shape.len() < 3 || m == 0 || w.len() < m || w.len() % m != 0 {
        return None;
    }
    let ((k, shift), chain) = affine_chain(graph, uses, conv.outputs[0], m, w_shape.len(), true)?;
    let b_t = match conv.inputs.get(2).copied().flatten() {
        Some(v) => f32_const(graph, uses, Some(v))?,
        None => Arc::new(Tensor::f32(&[m], vec![0.0; m])),
    };
    let b = b_t.as_f32().filter(|b| b.len() == m)?;
    let per = w.len() / m;
    let mut w2 = Vec::with_capacity(w.len());
    let mut b2 = Vec::with_capacity(m);
    for oc in 0..m {
        w2.extend(
            w[oc * per..][..per]
                .iter()
                .map(|&x| (x as f64 * k[oc]) as f32),
        );
        b2.push((b[oc] as f64 * k[oc] + shift[oc]) as f32);
    }
    Some((Tensor::f32(w_shape, w2), Tensor::f32(&[m], b2), chain))
}

/// [`fold_affine`] for ConvTranspose `i` (W is `[C, M / group, kh, kw]`: output channel
/// `g * M / group + j` scales W's `[g * C / group.., j]`): the op to put in its place, W' and B',
/// and the chain's nodes. ppocr_det adds a per-channel constant and runs a BatchNormalization
/// after each of its up-convs.
fn fold_affine_transposed(
    graph: &Graph,
    uses: &Uses,
    i: usize,
) -> Option<(ConvTranspose, (Tensor, Tensor), Vec<usize>)> {
    let node = &graph.nodes[i];
    if node.op_type != "ConvTranspose" || !default_domain(node) || node.outputs.len() != 1 {
        return None;
    }
    let op = node.op.as_any()?.downcast_ref::<ConvTranspose>()?;
    let w_t = f32_const(graph, uses, *node.inputs.get(1)?)?;
    let (w_shape, w) = (&w_t.shape, w_t.as_f32()?);
    let (c, mg, group) = (*w_shape.first()?, *w_shape.get(1)?, op.attrs.group);
    let m = mg * group;
    if w_shape.len() < 3 || m == 0 || group == 0 || c % group != 0 || w.len() < m {
        return None;
    }
    let ((k, shift), chain) = affine_chain(graph, uses, node.outputs[0], m, w_shape.len(), true)?;
    let b_t = match node.inputs.get(2).copied().flatten() {
        Some(v) => f32_const(graph, uses, Some(v))?,
        None => Arc::new(Tensor::f32(&[m], vec![0.0; m])),
    };
    let b = b_t.as_f32().filter(|b| b.len() == m)?;
    // W's rows (input channel ci, output channel j of ci's group) of `per` taps each
    let (cg, per) = (c / group, w.len() / (c * mg));
    let scale = |row: usize| k[(row / mg / cg) * mg + row % mg];
    let w2 = (w.chunks_exact(per).enumerate())
        .flat_map(|(row, taps)| taps.iter().map(move |&x| (x as f64 * scale(row)) as f32))
        .collect();
    let b2 = (0..m).map(|oc| (b[oc] as f64 * k[oc] + shift[oc]) as f32);
    let wb = (Tensor::f32(w_shape, w2), Tensor::f32(&[m], b2.collect()));
    Some((op.clone(), wb, chain))
}

/// The chain of Mul and Add nodes by per-channel or scalar constants that reads
/// BatchNormalization `i`'s output one after the other (each the sole reader of the value
/// before it; the BatchNormalizations after a Conv went into the Conv before this runs), folded
/// into its scale and B (`scale' = scale * k`, `B' = B * k + shift`, in f64; mean and var stay),
/// then a Relu after them (or after the BN) with `bn_relu`: the op with the chain's op types
/// recorded, the new scale and B, and the chain's nodes. `None` when the chain is empty, or the
/// node or a parameter is not what this needs.
fn fold_into_batch_norm(
    graph: &Graph,
    uses: &Uses,
    i: usize,
    bn_relu: bool,
) -> Option<(BatchNorm, (Tensor, Tensor), Vec<usize>)> {
    let node = &graph.nodes[i];
    if node.op_type != "BatchNormalization" || !default_domain(node) || node.outputs.len() != 1 {
        return None;
    }
    let bn = as_batch_norm(node.op.as_ref())?;
    let scale_t = f32_const(graph, uses, *node.inputs.get(1)?)?;
    let beta_t = f32_const(graph, uses, *node.inputs.get(2)?)?;
    let (scale, beta) = (scale_t.as_f32()?, beta_t.as_f32()?);
    let m = scale.len();
    let rank = rank_of(graph, uses, (*node.inputs.first()?)?, 16)?;
    if m == 0 || beta.len() != m || scale_t.shape.len() != 1 || rank < 2 {
        return None;
    }
    let ((k, shift), mut chain) = affine_chain(graph, uses, node.outputs[0], m, rank, false)
        .unwrap_or(((vec![1.0; m], vec![0.0; m]), Vec::new()));
    let last = chain
        .last()
        .map_or(node.outputs[0], |&r| graph.nodes[r].outputs[0]);
    let relu = uses.sole_reader(last).filter(|&r| {
        let n = &graph.nodes[r];
        bn_relu && n.op_type == "Relu" && default_domain(n) && n.outputs.len() == 1
    });
    chain.extend(relu);
    if chain.is_empty() {
        return None;
    }
    let scale2 = (0..m).map(|c| (scale[c] as f64 * k[c]) as f32).collect();
    let beta2 = (0..m)
        .map(|c| (beta[c] as f64 * k[c] + shift[c]) as f32)
        .collect();
    let mut folded = bn.clone();
    folded
        .absorbed
        .extend(chain.iter().map(|&r| graph.nodes[r].op_type.clone()));
    folded.relu = relu.is_some();
    Some((
        folded,
        (Tensor::f32(&[m], scale2), Tensor::f32(&[m], beta2)),
        chain,
    ))
}

/// The rank of `v` where the graph fixes it before any shape is known: a value with a declared
/// shape (inputs, constants), a Conv's output (its W's rank), the output of a node that keeps
/// its input's rank (Concat: any input's; pools, BatchNormalization, Relu, Cast, Transpose,
/// Slice and unary math) or of a broadcasting Add, Sub, Mul, Div or Sum (the largest of its
/// inputs' ranks), a Reshape's to a constant shape (that shape's length), an Unsqueeze's or a
/// Squeeze's of constant axes (its own shape inference on a stand-in input of that rank: the
/// number of axes it inserts or drops does not depend on the dimensions), or a constant the
/// pass can evaluate ([`const_of`]), looked up `depth` producers back at most.
fn rank_of(graph: &Graph, uses: &Uses, v: ValueId, depth: u32) -> Option<usize> {
    if let Some(s) = &graph.values[v].shape {
        return Some(s.len());
    }
    let node = &graph.nodes[uses.producer[v]?];
    // (A Conv that absorbed what follows it no longer lists `v`: its rank is still W's.)
    if depth == 0 || !default_domain(node) {
        return None;
    }
    let ins = node.inputs.iter().flatten();
    let rank = |u: &ValueId| rank_of(graph, uses, *u, depth - 1);
    match node.op_type.as_str() {
        "Conv" | "ConvTranspose" => rank(node.inputs.get(1)?.as_ref()?),
        "MaxPool" | "AveragePool" | "BatchNormalization" | "Relu" | "Cast" | "Transpose"
        | "Slice" | "Neg" | "Sqrt" | "Exp" | "Erf" | "Tanh" | "Sigmoid" | "Cos" | "Sin" => {
            rank(node.inputs.first()?.as_ref()?)
        }
        "Reshape" => Some(const_of(graph, uses, (*node.inputs.get(1)?)?, 4)?.numel()),
        "Concat" => ins.clone().find_map(rank),
        "Add" | "Sub" | "Mul" | "Div" | "Sum" => ins.map(rank).try_fold(0, |a, r| Some(a.max(r?))),
        // A Squeeze only with its axes as an input (opset 13): without them it would squeeze
        // every axis of the stand-in.
        "Unsqueeze" | "Squeeze" => {
            let data = TensorMeta::new(DType::F32, vec![1; rank(node.inputs.first()?.as_ref()?)?]);
            let axes = match node.inputs.get(1).copied().flatten() {
                Some(a) => Some(const_of(graph, uses, a, 4)?),
                None if node.op_type == "Squeeze" => return None,
                None => None,
            };
            let axes = axes.map(|t| TensorMeta {
                value: Some(t.clone()),
                ..t.meta()
            });
            let ins: Vec<&TensorMeta> = std::iter::once(&data).chain(axes.as_ref()).collect();
            Some(node.op.infer(&ins).ok()?.first()?.shape.len())
        }
        _ => const_of(graph, uses, v, 4).map(|t| t.shape.len()),
    }
}

/// The value of `v` when it is an f32 constant with one element (see [`const_of`]): the scale
/// and epsilon constants of the RMSNorm, Gelu and attention folds.
fn scalar(graph: &Graph, uses: &Uses, v: ValueId) -> Option<f32> {
    match const_of(graph, uses, v, 4)?.as_f32()? {
        [s] => Some(*s),
        _ => None,
    }
}

/// `v` as an f32 constant (see [`const_of`]).
fn f32_const(graph: &Graph, uses: &Uses, v: Option<ValueId>) -> Option<Arc<Tensor>> {
    let t = const_of(graph, uses, v?, 4)?;
    t.as_f32()?;
    Some(t)
}

/// The chain of per-channel affine nodes reading `from` (a value of `m` channels and rank `rank`)
/// one after the other, each the sole reader of the value before it: Mul or Add by a constant
/// that is one value per channel or a scalar, and BatchNormalization when `with_bn`. Returns
/// the chain composed as one affine, and its nodes; `None` when the chain is empty.
fn affine_chain(
    graph: &Graph,
    uses: &Uses,
    from: ValueId,
    m: usize,
    rank: usize,
    with_bn: bool,
) -> Option<(Affine, Vec<usize>)> {
    let mut affine: Affine = (vec![1.0; m], vec![0.0; m]);
    let mut chain = Vec::new();
    let mut cur = from;
    while let Some(r) = uses.sole_reader(cur) {
        let node = &graph.nodes[r];
        if !default_domain(node) || node.outputs.len() != 1 {
            break;
        }
        let ok = match node.op_type.as_str() {
            "BatchNormalization" if with_bn => {
                batch_norm_step(graph, uses, node, cur, m, &mut affine)
            }
            "Mul" | "Add" => binary_step(graph, uses, node, cur, rank, &mut affine),
            _ => None,
        };
        if ok.is_none() {
            break;
        }
        chain.push(r);
        cur = node.outputs[0];
    }
    (!chain.is_empty()).then_some((affine, chain))
}

/// Compose BatchNormalization `node` (reading `cur`) into `affine`: `y -> (y - mean) * a +
/// beta`, `a = scale / sqrt(var + eps)`.
fn batch_norm_step(
    graph: &Graph,
    uses: &Uses,
    node: &Node,
    cur: ValueId,
    m: usize,
    (k, shift): &mut Affine,
) -> Option<()> {
    if node.inputs.len() != 5 || node.inputs[0] != Some(cur) {
        return None;
    }
    let mut p = Vec::new();
    for v in &node.inputs[1..] {
        let t = f32_const(graph, uses, *v)?;
        if t.shape.as_slice() != [m] {
            return None;
        }
        p.push(t);
    }
    let eps = batch_norm_eps(node.op.as_ref())?;
    let [scale, beta, mean, var] = [0, 1, 2, 3].map(|j| p[j].as_f32().unwrap_or(&[]));
    for c in 0..m {
        let a = scale[c] as f64 / (var[c] as f64 + eps).sqrt();
        k[c] *= a;
        shift[c] = (shift[c] - mean[c] as f64) * a + beta[c] as f64;
    }
    Some(())
}

/// Compose Mul or Add `node` of `cur` and a constant into `affine`, when the constant is a
/// scalar or one value per channel of an output of rank `rank` (shape `[M, 1, ..]` or `[1, M,
/// 1, ..]`), so the result keeps the Conv output's shape.
fn binary_step(
    graph: &Graph,
    uses: &Uses,
    node: &Node,
    cur: ValueId,
    rank: usize,
    (k, shift): &mut Affine,
) -> Option<()> {
    let other = match node.inputs.as_slice() {
        [Some(a), Some(b)] if *a == cur && *b != cur => *b,
        [Some(a), Some(b)] if *b == cur && *a != cur => *a,
        _ => return None,
    };
    let t = f32_const(graph, uses, Some(other))?;
    let v = t.as_f32()?;
    let m = k.len();
    let per_channel = t.shape.len() <= rank && {
        let mut dims = vec![1; rank - t.shape.len()];
        dims.extend(&t.shape);
        dims[0] == 1 && dims[1] == m && dims[2..].iter().all(|&d| d == 1)
    };
    let at = |c: usize| v[if per_channel { c } else { 0 }] as f64;
    if !per_channel && (v.len() != 1 || t.shape.len() > rank) {
        return None;
    }
    for c in 0..m {
        if node.op_type == "Mul" {
            k[c] *= at(c);
            shift[c] *= at(c);
        } else {
            shift[c] += at(c);
        }
    }
    Some(())
}

/// Largest tensor (elements) the pass evaluates from constant inputs (64 MiB of f32).
const MAX_EVAL_ELEMENTS: usize = 16 << 20;

/// The contents of `v`: a constant, or the output of a node whose inputs are all constants (up
/// to `depth` producers back), evaluated on the CPU as the planner would fold it.
fn const_of(graph: &Graph, uses: &Uses, v: ValueId, depth: u32) -> Option<Arc<Tensor>> {
    if let Some(c) = &graph.values[v].constant {
        return Some(c.clone());
    }
    let node = &graph.nodes[uses.producer[v]?];
    if depth == 0 {
        return None;
    }
    let last = node
        .inputs
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |i| i + 1);
    let mut ins = Vec::new();
    for u in &node.inputs[..last] {
        ins.push(match u {
            Some(u) => const_of(graph, uses, *u, depth - 1)?,
            None => Arc::new(Tensor::f32(&[0], Vec::new())),
        });
    }
    let k = node.outputs.iter().position(|&o| o == v)?;
    let refs: Vec<&Tensor> = ins.iter().map(|t| t.as_ref()).collect();
    eval(node.op.as_ref(), &refs, node.outputs.len())?
        .into_iter()
        .nth(k)
        .map(Arc::new)
}

/// The first `n` outputs of `op` on `ins`, on the CPU; `None` if the op refuses or an output
/// is over [`MAX_EVAL_ELEMENTS`] (the pass then leaves the node alone).
fn eval(op: &dyn Op, ins: &[&Tensor], n: usize) -> Option<Vec<Tensor>> {
    let metas: Vec<TensorMeta> = ins
        .iter()
        .map(|t| TensorMeta::constant((*t).clone()))
        .collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let mut outs = op.infer(&refs).ok()?;
    outs.truncate(n);
    if op.is_view() {
        // Output 0 is input 0's elements (views have no kernel of their own to call).
        return match (outs.as_slice(), ins.first()) {
            ([o], Some(x)) => Some(vec![Tensor::new(o.shape.clone(), x.data.clone())]),
            _ => None,
        };
    }
    if outs.iter().all(|o| o.value.is_some()) {
        return Some(
            outs.into_iter()
                .filter_map(|o| o.value)
                .map(|t| (*t).clone())
                .collect(),
        );
    }
    let fits = |o: &TensorMeta| {
        (o.shape.iter())
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .is_some_and(|e| e <= MAX_EVAL_ELEMENTS)
    };
    if outs.is_empty() || !outs.iter().all(fits) {
        return None;
    }
    let rows = tandem_ops::shape::row_count(&outs[0].shape, op.split_axis(&refs, &outs));
    let mut out: Vec<Tensor> = outs
        .iter()
        .map(|m| Tensor::zeros(m.dtype, &m.shape))
        .collect();
    op.cpu(ins, &mut out, 0..rows).ok()?;
    Some(out)
}

/// BatchNormalization's epsilon; `None` for an op that is not tandem's BatchNormalization.
fn batch_norm_eps(op: &dyn Op) -> Option<f64> {
    let bn = op
        .as_any()?
        .downcast_ref::<tandem_ops::norm_channel::BatchNorm>()?;
    Some(bn.epsilon() as f64)
}

/// A new f32 constant named `<conv>:fused_<what>` (made unique).
fn add_constant(
    graph: &mut Graph,
    names: &mut HashSet<String>,
    conv: &str,
    what: &str,
    t: Tensor,
) -> ValueId {
    let mut name = format!("{conv}:fused_{what}");
    while names.contains(&name) {
        name.push('_');
    }
    names.insert(name.clone());
    graph.values.push(Value {
        name,
        dtype: Some(DType::F32),
        shape: Some(t.shape.iter().map(|&d| Dim::Fixed(d)).collect()),
        constant: Some(Arc::new(t)),
    });
    graph.values.len() - 1
}
