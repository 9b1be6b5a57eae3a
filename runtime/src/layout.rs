//! Weight layout: load-time rewrites of how constant weights are stored.
//! - Each constant transposed Gemm weight (`B` of shape `[N, K]`, transB=1) gets padded rows,
//!   where `tandem_ops::gemm_op`'s rule says the unpadded row stride makes the `gemm` crate's
//!   packing (and the GPU kernel's reads) fall into few cache sets
//!   (`Gemm::with_padded_weight`; 2.2x on a 128 x 1024 x 1024 product).
//! - Each Conv whose W is a constant is told so (`Conv::with_constant_weight`): where the CPU
//!   computes it by Winograd, it transforms W on the first call and keeps the result, instead
//!   of transforming it on every call.
//! - Each MatMul whose B is a constant is told so (`MatMul::with_constant_b`): where the CPU has
//!   the packed kernel (AVX-512), B is packed on the first call and kept.
//!
//! Sits between the importer and fusion (which build the [`Graph`]) and the planner: a
//! [`crate::Session`] runs [`store_weights`] once at load time. The calibration suite stores
//! its Gemm and Conv benchmarks' weights by the same rules, so the cost model measures the
//! layout models run.
//!
//! Rules: only a weight that is a constant, not a graph input (which a caller may feed), is
//! padded; a Conv or MatMul weight is marked also when nodes make it from constants alone
//! (`ConstantOfShape` in the light zoo models), since it is then the same on every run. A
//! padded Gemm weight is also not a graph output (its value changes) and is read by this one
//! node only; a marked Conv or MatMul weight keeps its value, so neither applies. The
//! product's row count is what the declared input shapes give, where they fix it (a batch-1
//! classifier head stays as it is: its one row streams the weight, and copying it at load
//! would cost cold start for nothing).

use crate::graph::{Dim, Graph};
use std::sync::Arc;
use tandem_ops::conv::Conv;
use tandem_ops::gemm_op::Gemm;
use tandem_ops::matmul::MatMul;
use tandem_ops::TensorMeta;

/// The rewrites ([`pad_gemm_weights`], [`keep_conv_transforms`], [`keep_matmul_packings`]).
pub fn store_weights(graph: &mut Graph) {
    pad_gemm_weights(graph);
    keep_conv_transforms(graph);
    keep_matmul_packings(graph);
}

/// Replaces each `T` node whose input 1 is fixed ([`fixed_values`]) by `marked(op)`. Returns
/// the names of the replaced nodes.
fn mark_constant_weight<T: 'static>(
    graph: &mut Graph,
    marked: impl Fn(&T) -> Box<dyn tandem_ops::Op>,
) -> Vec<String> {
    let fixed = fixed_values(graph);
    let mut names = Vec::new();
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        let Some(op) = node.op.as_any().and_then(|a| a.downcast_ref::<T>()) else {
            continue;
        };
        let Some(Some(w)) = node.inputs.get(1) else {
            continue;
        };
        if !fixed[*w] {
            continue;
        }
        let op = marked(op);
        graph.nodes[i].op = op;
        names.push(graph.nodes[i].name.clone());
    }
    names
}

/// Which values are the same on every run: model constants (never a graph input, which a
/// caller may feed) and the outputs of nodes that read only such values (the light zoo models
/// make their weights with `ConstantOfShape`, folded by the planner; every tandem operator is a
/// function of its inputs, none random).
fn fixed_values(graph: &Graph) -> Vec<bool> {
    let mut fixed: Vec<bool> = graph.values.iter().map(|v| v.constant.is_some()).collect();
    for &v in &graph.inputs {
        fixed[v] = false;
    }
    // Nodes are not assumed sorted: repeat until nothing changes.
    let mut changed = true;
    while changed {
        changed = false;
        for node in &graph.nodes {
            let reads_fixed = node.inputs.iter().flatten().all(|&v| fixed[v]);
            for &o in &node.outputs {
                if reads_fixed && !fixed[o] {
                    fixed[o] = true;
                    changed = true;
                }
            }
        }
    }
    fixed
}

/// Marks each MatMul whose B is a model constant: the op then packs B once for its CPU kernel
/// and keeps the packing. Returns the names of the marked nodes.
pub fn keep_matmul_packings(graph: &mut Graph) -> Vec<String> {
    mark_constant_weight(graph, |mm: &MatMul| Box::new(mm.with_constant_b()))
}

/// Marks each Conv whose W is a model constant (not a graph input): the op then keeps the
/// transforms its CPU kernel makes of W. Returns the names of the marked nodes.
pub fn keep_conv_transforms(graph: &mut Graph) -> Vec<String> {
    mark_constant_weight(graph, |conv: &Conv| Box::new(conv.with_constant_weight()))
}

/// Pads the weights the rule selects; returns the names of the Gemm nodes that now read a
/// padded weight.
pub fn pad_gemm_weights(graph: &mut Graph) -> Vec<String> {
    let is_gemm = |n: &crate::graph::Node| n.op.as_any().is_some_and(|a| a.is::<Gemm>());
    if !graph.nodes.iter().any(is_gemm) {
        // No shape inference at load for models without a Gemm.
        return Vec::new();
    }
    let mut readers = vec![0usize; graph.values.len()];
    for v in graph.nodes.iter().flat_map(|n| n.inputs.iter().flatten()) {
        readers[*v] += 1;
    }
    for &v in graph.inputs.iter().chain(&graph.outputs) {
        readers[v] += 2;
    }
    let metas = declared_metas(graph);
    let mut padded = Vec::new();
    for node in &mut graph.nodes {
        let Some(gemm) = node.op.as_any().and_then(|a| a.downcast_ref::<Gemm>()) else {
            continue;
        };
        let (Some(Some(a)), Some(Some(b))) = (node.inputs.first(), node.inputs.get(1)) else {
            continue;
        };
        let Some(weight) = graph.values[*b].constant.as_ref() else {
            continue;
        };
        if readers[*b] != 1 {
            continue;
        }
        let a_shape = metas[*a].as_ref().map(|m| m.shape.as_slice());
        if let Some((op, w)) = gemm.with_padded_weight(a_shape, weight) {
            graph.values[*b].shape = Some(w.shape.iter().map(|&d| Dim::Fixed(d)).collect());
            graph.values[*b].constant = Some(Arc::new(w));
            node.op = Box::new(op);
            padded.push(node.name.clone());
        }
    }
    padded
}

/// What the declared shapes say of each value before any input is given: constants, graph
/// inputs whose every dimension is fixed, and the outputs of nodes whose inputs are known (by
/// the ops' own shape inference). `None` where a symbolic dimension, an unknown input or an
/// inference error leaves it open (the planner reports errors with the real inputs).
pub(crate) fn declared_metas(graph: &Graph) -> Vec<Option<TensorMeta>> {
    let mut metas = crate::plan::constant_metas(graph);
    for &v in &graph.inputs {
        let value = &graph.values[v];
        let fixed: Option<Vec<usize>> = value.shape.as_ref().and_then(|dims| {
            dims.iter()
                .map(|d| match d {
                    Dim::Fixed(n) => Some(*n),
                    Dim::Symbolic(_) => None,
                })
                .collect()
        });
        metas[v] = match (value.dtype, fixed) {
            (Some(dtype), Some(shape)) if value.constant.is_none() => {
                Some(TensorMeta::new(dtype, shape))
            }
            _ => None,
        };
    }
    for node in &graph.nodes {
        let given = node
            .inputs
            .iter()
            .rposition(|i| i.is_some())
            .map_or(0, |p| p + 1);
        let ins: Option<Vec<&TensorMeta>> = node.inputs[..given]
            .iter()
            .map(|i| i.and_then(|v| metas[v].as_ref()))
            .collect();
        let Some(ins) = ins else { continue };
        if let Ok(outs) = node.op.infer(&ins) {
            for (&v, m) in node.outputs.iter().zip(outs) {
                metas[v] = Some(m);
            }
        }
    }
    metas
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Node, Value};
    use tandem_ops::{registry, AttrValue, Attrs, DType, Tensor};

    fn value(name: &str, shape: Option<Vec<Dim>>, constant: Option<Tensor>) -> Value {
        Value {
            name: name.into(),
            dtype: Some(DType::F32),
            shape,
            constant: constant.map(Arc::new),
        }
    }

    /// One node `name` of `op_type`: `Y = op(X, W)` with X of dims `x` and a constant W, W also a
    /// graph input when `feedable`.
    fn one_node(
        name: &str,
        op_type: &str,
        attrs: Attrs,
        x: Vec<Dim>,
        w: Tensor,
        feedable: bool,
    ) -> Graph {
        let mut g = Graph {
            values: vec![
                value("X", Some(x), None),
                value("W", None, Some(w)),
                value("Y", None, None),
            ],
            ..Default::default()
        };
        g.nodes.push(Node {
            name: name.into(),
            op_type: op_type.into(),
            domain: String::new(),
            opset: 13,
            inputs: vec![Some(0), Some(1)],
            outputs: vec![2],
            op: registry::build(op_type, &attrs).unwrap(),
            attributes: None,
        });
        g.inputs = if feedable { vec![0, 1] } else { vec![0] };
        g.outputs = vec![2];
        g
    }

    /// `Y = X W^T` with X `[rows, 512]` (rows fixed, or symbolic) and W `[8, 512]`.
    fn linear(rows: Dim, feedable: bool) -> Graph {
        let attrs = Attrs::new(13).with("transB", AttrValue::Int(1));
        let w = Tensor::f32(&[8, 512], (0..8 * 512).map(|i| i as f32).collect());
        one_node(
            "fc",
            "Gemm",
            attrs,
            vec![rows, Dim::Fixed(512)],
            w,
            feedable,
        )
    }

    #[test]
    fn pads_weights_of_many_or_unknown_rows_only() {
        for (rows, feedable, pads) in [
            (Dim::Fixed(64), false, true),
            (Dim::Symbolic("batch".into()), false, true),
            (Dim::Fixed(1), false, false),
            (Dim::Fixed(64), true, false),
        ] {
            let mut g = linear(rows.clone(), feedable);
            let names = pad_gemm_weights(&mut g);
            let w = g.values[1].constant.as_ref().unwrap();
            let case = format!("rows {rows:?} feedable {feedable}");
            assert_eq!(names == ["fc"], pads, "{case}");
            let want = if pads {
                512 + tandem_ops::gemm_op::ROW_PAD
            } else {
                512
            };
            assert_eq!(w.shape, vec![8, want], "{case}");
            // Row 3 keeps its elements in place, padded or not.
            let row3 = &w.as_f32().unwrap()[3 * want..][..512];
            assert!(row3
                .iter()
                .enumerate()
                .all(|(i, &x)| x == (3 * 512 + i) as f32));
        }
    }

    /// `Y = Conv(X, W)` with X `[1, 64, 20, 20]` and W `[64, 64, 3, 3]`.
    fn conv(feedable: bool) -> Graph {
        let attrs = Attrs::new(13).with("pads", AttrValue::Ints(vec![1; 4]));
        let w = Tensor::f32(&[64, 64, 3, 3], vec![0.5; 64 * 64 * 9]);
        let x = vec![1, 64, 20, 20].into_iter().map(Dim::Fixed).collect();
        one_node("conv", "Conv", attrs, x, w, feedable)
    }

    #[test]
    fn convs_keep_transforms_of_constant_weights_only() {
        for feedable in [false, true] {
            let mut g = conv(feedable);
            let names = keep_conv_transforms(&mut g);
            let op = g.nodes[0].op.as_any().unwrap().downcast_ref::<Conv>();
            let keeps = op.unwrap().constant_weight.is_some();
            assert_eq!(names == ["conv"], !feedable, "feedable {feedable}");
            assert_eq!(keeps, !feedable, "feedable {feedable}");
        }
    }

    #[test]
    fn convs_keep_transforms_of_weights_made_from_constants_alone() {
        // W = ConstantOfShape(S) (the light zoo's weights): fixed when S is a constant, not
        // when a caller may feed S; ConstantOfShape's output stands first, as nodes need not
        // be sorted.
        for feedable in [false, true] {
            let mut g = conv(false);
            g.values[1].constant = None;
            let dims = Tensor::i64(&[4], vec![64, 64, 3, 3]);
            g.values.push(value("S", None, Some(dims)));
            let fill =
                Attrs::new(13).with("value", AttrValue::Tensor(Tensor::f32(&[1], vec![0.5])));
            g.nodes.push(Node {
                name: "fill".into(),
                op_type: "ConstantOfShape".into(),
                domain: String::new(),
                opset: 13,
                inputs: vec![Some(3)],
                outputs: vec![1],
                op: registry::build("ConstantOfShape", &fill).unwrap(),
                attributes: None,
            });
            g.nodes.swap(0, 1);
            if feedable {
                g.inputs.push(3);
            }
            let names = keep_conv_transforms(&mut g);
            assert_eq!(names == ["conv"], !feedable, "feedable {feedable}");
            let op = g.nodes[1].op.as_any().unwrap().downcast_ref::<Conv>();
            assert_eq!(op.unwrap().constant_weight.is_some(), !feedable);
        }
    }

    #[test]
    fn matmuls_keep_packings_of_constant_b_only() {
        for feedable in [false, true] {
            let w = Tensor::f32(&[64, 96], vec![0.25; 64 * 96]);
            let x = vec![Dim::Fixed(32), Dim::Fixed(64)];
            let mut g = one_node("mm", "MatMul", Attrs::new(13), x, w, feedable);
            let names = keep_matmul_packings(&mut g);
            let op = g.nodes[0].op.as_any().unwrap().downcast_ref::<MatMul>();
            let keeps = op.unwrap().constant_b.is_some();
            assert_eq!(names == ["mm"], !feedable, "feedable {feedable}");
            assert_eq!(keeps, !feedable, "feedable {feedable}");
        }
    }
}
