//! Random but valid-looking ONNX models, for the fuzz targets and the `fuzz_graphs` test.
//!
//! Sits between a byte stream (libFuzzer's input, or a seed expanded by [`from_seed`]) and the
//! ONNX protobuf messages of [`crate::import::proto`]: the bytes choose graph inputs, a chain of
//! nodes of supported op types (`tandem_ops::registry`) with random shapes, attributes and
//! initializers, and the graph outputs. Each candidate node is built with the registry and its
//! shapes inferred by the op itself; nodes whose inference fails are dropped, so most models
//! are valid and reach the planner and both kernels. One model in 16 is *hostile*: attribute
//! and constant values may be extreme (negative, zero, huge) and failing nodes are kept, so the
//! model must be refused with a typed error. Exhausted bytes read as zeros: every byte string
//! gives a model, deterministically.

mod candidates;
mod proto;

pub use proto::{attribute, tensor_proto, value_info};

use crate::cost::CostModel;
use crate::gpu::Gpu;
use crate::import::proto::*;
use crate::testing::first_mismatch;
use crate::{Placement, Result, Session, SessionOptions};
use prost::Message;
use std::sync::Arc;
use tandem_ops::{registry, AttrValue, Attrs, DType, Tensor, TensorMeta};

/// A generated model with inputs to run it on.
#[derive(Debug, Clone)]
pub struct Generated {
    pub model: ModelProto,
    /// One tensor per graph input, shaped as declared.
    pub inputs: Vec<(String, Tensor)>,
    /// Hostile models may be refused (with a typed error); the others should load and run.
    pub hostile: bool,
    /// Outputs whose CPU and GPU values may differ legitimately: a discontinuous op (Floor,
    /// comparison, ArgMax, Cast to an integer...) read a value rounded differently per device.
    pub unstable_outputs: Vec<String>,
}

/// The model for `seed`: 4 KiB of splitmix64 output fed to [`from_bytes`].
pub fn from_seed(seed: u64) -> Generated {
    let mut s = seed;
    let mut bytes = Vec::with_capacity(4096);
    while bytes.len() < 4096 {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        bytes.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    from_bytes(&bytes)
}

/// The model the bytes describe (any bytes give one).
pub fn from_bytes(data: &[u8]) -> Generated {
    let mut g = Gen {
        src: Source { data, pos: 0 },
        hostile: false,
        opset: 13,
        vals: Vec::new(),
        inits: Vec::new(),
        nodes: Vec::new(),
        inputs: Vec::new(),
        feeds: Vec::new(),
    };
    g.hostile = g.src.below(16) == 0;
    g.opset = [13, 17, 18][g.src.below(3)];
    g.generate()
}

/// Reads choices from bytes; zeros once they run out.
struct Source<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Source<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// A number in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        let v = if n <= 256 {
            self.byte() as usize
        } else {
            u16::from_le_bytes([self.byte(), self.byte()]) as usize
        };
        v % n
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below((hi - lo + 1) as usize) as i64
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Values of hostile shapes (up to the session's memory cap) are not read again: the
/// initializers a candidate adds are shaped after what it reads. A zero dim does not make a
/// value small: `[0, i32::MAX]` has no elements, but a MatMul weight shaped after its last dim
/// would have 2^31 rows.
fn small(m: &TensorMeta) -> bool {
    m.shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d.max(1)))
        .is_some_and(|n| n <= 1 << 16)
}

/// A value the next nodes may read.
struct Val {
    name: String,
    meta: TensorMeta,
    /// Computed with rounding that may differ between devices.
    inexact: bool,
    /// Derived from a discontinuous op applied to an inexact value.
    unstable: bool,
    /// May hold +-f32::MAX: what a max or min over an empty window or axis gives.
    extreme: bool,
}

struct Gen<'a> {
    src: Source<'a>,
    hostile: bool,
    opset: i64,
    vals: Vec<Val>,
    inits: Vec<TensorProto>,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    feeds: Vec<(String, Tensor)>,
}

/// A candidate node before it is checked.
struct Cand {
    op: &'static str,
    inputs: Vec<usize>,
    attrs: Vec<(&'static str, AttrValue)>,
    outputs: usize,
}

#[rustfmt::skip]
const UNARY: &[&str] = &[
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Gelu", "HardSigmoid", "HardSwish", "Clip",
    "Sqrt", "Exp", "Log", "Neg", "Reciprocal", "Floor", "Ceil", "Round", "Abs", "Sign", "Sin",
    "Cos", "Softplus", "Softsign", "Elu", "Selu", "IsNaN", "IsInf", "Identity", "Dropout",
];
#[rustfmt::skip]
const BINARY: &[&str] = &[
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "Sum", "Mean", "Max", "Min",
];
#[rustfmt::skip]
const COMPARE: &[&str] = &[
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
];
#[rustfmt::skip]
const REDUCE: &[&str] = &[
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum",
];
/// Ops whose output jumps (or is ill-conditioned) when the input moves by one rounding step.
/// Normalizations divide by the spread of their input: of a near-constant row, rounding noise.
#[rustfmt::skip]
const DISCONTINUOUS: &[&str] = &[
    "LayerNormalization", "InstanceNormalization", "Floor", "Ceil", "Round", "Sign", "Equal",
    "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "ArgMax", "ArgMin", "Hardmax", "Mod", "IsNaN", "IsInf", "Div", "Reciprocal", "Log", "Pow", "Sqrt",
    "ReduceLogSum",
    // Ill-conditioned for large arguments: at |x| ~ 1e15 one rounding step of x is ~1e8 radians,
    // and WGSL gives no accuracy outside [-pi, pi] (lavapipe's cos(2.7e15) = 1, libm's -0.74).
    "Sin", "Cos",
];
/// Ops computed the same way on both devices (no rounding differences).
#[rustfmt::skip]
const EXACT: &[&str] = &[
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Transpose", "Concat",
    "Split", "Slice", "Gather", "GatherElements", "Expand", "Tile", "Pad", "Shape", "Size",
    "ConstantOfShape", "Trilu", "EyeLike", "Neg", "Abs", "Relu", "Max", "Min", "MaxPool",
    "ReduceMax", "ReduceMin", "GlobalMaxPool", "Where", "Cast", "CastLike", "Floor", "Ceil",
    "Round", "Sign", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "ArgMax",
    "ArgMin", "Hardmax", "IsNaN", "IsInf", "Not", "And", "Or", "Xor", "Clip", "Add", "Sub",
    "Mul",
];

impl Gen<'_> {
    fn generate(mut self) -> Generated {
        for i in 0..1 + self.src.below(2) {
            let rank = 1 + self.src.below(4);
            let shape = self.shape(rank);
            let t = self.float_tensor(&shape);
            let name = format!("in{i}");
            self.inputs.push(value_info(&name, DType::F32, &shape));
            self.feeds.push((name.clone(), t));
            self.vals.push(Val {
                name,
                meta: TensorMeta::new(DType::F32, shape),
                inexact: false,
                unstable: false,
                extreme: false,
            });
        }
        let count = 1 + self.src.below(8);
        for _ in 0..count {
            for _attempt in 0..6 {
                if self.try_node() {
                    break;
                }
            }
        }
        self.finish()
    }

    fn shape(&mut self, rank: usize) -> Vec<usize> {
        (0..rank)
            .map(|_| {
                if self.src.chance(40) {
                    0
                } else {
                    1 + self.src.below(5)
                }
            })
            .collect()
    }

    /// Values k/8 in [-4, 4): exactly representable, with ties and zeros.
    fn float_tensor(&mut self, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let v = (0..n)
            .map(|_| (self.src.below(64) as f32 - 32.0) / 8.0)
            .collect();
        Tensor::f32(shape, v)
    }

    /// A small int, or (hostile models, now and then) an extreme one.
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        if self.hostile && self.src.chance(6) {
            return [
                0,
                -1,
                -7,
                i64::MIN,
                i64::MAX,
                1 << 40,
                i32::MAX as i64,
                1 << 20,
            ][self.src.below(8)];
        }
        self.src.range(lo, hi)
    }

    fn ints(&mut self, n: usize, lo: i64, hi: i64) -> Vec<i64> {
        (0..n).map(|_| self.int(lo, hi)).collect()
    }

    /// An existing value matching `want`, if any.
    fn pick(&mut self, want: impl Fn(&TensorMeta) -> bool) -> Option<usize> {
        let ok: Vec<usize> = (0..self.vals.len())
            .filter(|&i| small(&self.vals[i].meta) && want(&self.vals[i].meta))
            .collect();
        (!ok.is_empty()).then(|| ok[self.src.below(ok.len())])
    }

    fn float(&mut self) -> Option<usize> {
        self.pick(|m| m.dtype == DType::F32)
    }

    fn rank_at_least(&mut self, r: usize) -> Option<usize> {
        self.pick(|m| m.dtype == DType::F32 && m.rank() >= r)
    }

    /// A new initializer, as a value.
    fn constant(&mut self, t: Tensor) -> usize {
        let name = format!("c{}", self.inits.len());
        self.inits.push(tensor_proto(&name, &t));
        self.vals.push(Val {
            name,
            meta: TensorMeta::constant(t),
            inexact: false,
            unstable: false,
            extreme: false,
        });
        self.vals.len() - 1
    }

    fn int_const(&mut self, v: Vec<i64>) -> usize {
        let n = v.len();
        self.constant(Tensor::i64(&[n], v))
    }

    fn scalar_f32(&mut self, v: f32) -> usize {
        self.constant(Tensor::f32(&[], vec![v]))
    }

    /// A float initializer broadcastable against `shape` (a suffix, some dims set to 1).
    fn broadcast_const(&mut self, shape: &[usize]) -> usize {
        let keep = self.src.below(shape.len() + 1);
        let s: Vec<usize> = shape[shape.len() - keep..]
            .iter()
            .map(|&d| if self.src.chance(3) { 1 } else { d })
            .collect();
        let t = self.float_tensor(&s);
        self.constant(t)
    }

    /// Axes in `-rank..rank`, distinct.
    fn axes(&mut self, rank: usize) -> Vec<i64> {
        let mut axes = Vec::new();
        for a in 0..rank as i64 {
            if self.src.chance(2) {
                axes.push(if self.src.chance(2) {
                    a - rank as i64
                } else {
                    a
                });
            }
        }
        if self.hostile && self.src.chance(4) {
            axes.push(self.int(-9, 9));
        }
        axes
    }

    fn axis(&mut self, rank: usize) -> i64 {
        let r = rank.max(1) as i64;
        self.int(-r, r - 1)
    }

    /// Tries one candidate node; keeps it when its shapes infer (or, hostile, sometimes
    /// anyway). Returns whether a node was added.
    fn try_node(&mut self) -> bool {
        let (vals_before, inits_before) = (self.vals.len(), self.inits.len());
        let rollback = |g: &mut Self| {
            g.vals.truncate(vals_before);
            g.inits.truncate(inits_before);
        };
        let Some(cand) = self.candidate() else {
            rollback(self);
            return false;
        };
        let mut attrs = Attrs::new(self.opset);
        for (k, v) in &cand.attrs {
            attrs.values.insert(k.to_string(), v.clone());
        }
        let metas: Vec<&TensorMeta> = cand.inputs.iter().map(|&i| &self.vals[i].meta).collect();
        let inferred = registry::build(cand.op, &attrs).and_then(|op| op.infer(&metas));
        let outs = match inferred {
            Ok(outs) if outs.len() >= cand.outputs => outs,
            _ if self.hostile && self.src.chance(3) => Vec::new(),
            _ => {
                rollback(self);
                return false;
            }
        };
        let reads_inexact = cand.inputs.iter().any(|&i| self.vals[i].inexact);
        // Unstable whatever the inputs:
        // - ONNX leaves a float cast to an integer type undefined out of range (inf, NaN, 1e10):
        //   the CPU and the GPU legitimately differ there (inf to int8: -1 vs -128).
        // - A product that overflows depends on its order, even of exact values (300 values up
        //   to 3.875 and one 0): inf * 0 is NaN, so the CPU, which multiplies in 16 SIMD lanes,
        //   gives 0 where the GPU, which reaches inf before the 0, gives NaN.
        // - A sum over values near f32::MAX (a MaxPool window holding only padding gives
        //   -f32::MAX) overflows at a point that depends on its order: a ConvTranspose over
        //   three such channels gave -inf on the CPU and NaN (inf - inf) on the GPU. Values
        //   pass through exact ops as they are; any other op reading them is unstable.
        let reads_extreme = cand.inputs.iter().any(|&i| self.vals[i].extreme);
        let unstable = cand.inputs.iter().any(|&i| self.vals[i].unstable)
            || (reads_inexact && DISCONTINUOUS.contains(&cand.op))
            || (reads_extreme && !EXACT.contains(&cand.op))
            || matches!(cand.op, "Cast" | "CastLike" | "ReduceProd");
        let extreme = (reads_extreme && EXACT.contains(&cand.op))
            || matches!(
                cand.op,
                "MaxPool" | "GlobalMaxPool" | "ReduceMax" | "ReduceMin"
            );
        let inexact = reads_inexact || !EXACT.contains(&cand.op);
        let id = self.nodes.len();
        let out_names: Vec<String> = (0..cand.outputs).map(|o| format!("n{id}_{o}")).collect();
        self.nodes.push(NodeProto {
            input: cand
                .inputs
                .iter()
                .map(|&i| self.vals[i].name.clone())
                .collect(),
            output: out_names.clone(),
            name: format!("node{id}_{}", cand.op),
            op_type: cand.op.into(),
            attribute: cand.attrs.iter().map(|(k, v)| attribute(k, v)).collect(),
            ..Default::default()
        });
        for (name, meta) in out_names.into_iter().zip(outs) {
            self.vals.push(Val {
                name,
                meta,
                inexact,
                unstable,
                extreme,
            });
        }
        true
    }

    /// Declares the outputs: the last node's, plus some others.
    fn finish(mut self) -> Generated {
        let produced: Vec<usize> = (0..self.vals.len())
            .filter(|&i| self.vals[i].name.starts_with('n'))
            .collect();
        let mut outs: Vec<usize> = produced
            .iter()
            .copied()
            .filter(|_| self.src.chance(4))
            .collect();
        match produced.last() {
            Some(&last) if !outs.contains(&last) => outs.push(last),
            None => outs.push(0),
            _ => {}
        }
        let mut unstable_outputs = Vec::new();
        let mut output = Vec::new();
        for i in outs {
            let v = &self.vals[i];
            if v.unstable {
                unstable_outputs.push(v.name.clone());
            }
            output.push(if self.src.chance(3) {
                ValueInfoProto {
                    name: v.name.clone(),
                    r#type: None,
                }
            } else {
                value_info(&v.name, v.meta.dtype, &v.meta.shape)
            });
        }
        // Hostile models may name a node's output without producing it.
        if self.hostile && self.nodes.is_empty() {
            output.push(value_info("ghost", DType::F32, &[1]));
        }
        let graph = GraphProto {
            node: self.nodes,
            name: "fuzz".into(),
            initializer: self.inits,
            input: self.inputs,
            output,
            ..Default::default()
        };
        Generated {
            model: ModelProto {
                ir_version: 8,
                opset_import: vec![OperatorSetIdProto {
                    domain: String::new(),
                    version: self.opset,
                }],
                producer_name: "tandem-fuzzgen".into(),
                graph: Some(graph),
                functions: vec![],
            },
            inputs: self.feeds,
            hostile: self.hostile,
            unstable_outputs,
        }
    }
}

/// Host memory a generated model may use in [`run_everywhere`] (hostile shapes ask for more).
/// Valid models use a few KiB. 8 MiB, not more: a hostile Resize to `[1, 1, 1 << 20, 4]` (16 MiB)
/// within a 1 GiB cap ran 30 s on lavapipe (one invocation per output element), past the fuzz
/// target's 10 s timeout; over this cap it is refused with a typed error, which is what
/// hostile shapes are there to test.
pub const MAX_HOST_MEMORY: u64 = 8 << 20;

/// Named outputs of one run, or its typed error.
pub type RunResult = Result<Vec<(String, Tensor)>>;

/// What one generated model did on each placement.
#[derive(Debug)]
pub struct Outcome {
    /// Each placement tried, with its outputs or its (typed) error from loading or running.
    pub runs: Vec<(Placement, RunResult)>,
    /// Outputs compared between the CPU and another placement.
    pub compared: usize,
    /// Disagreements with the CPU: `placement output: reason`.
    pub mismatches: Vec<String>,
}

/// Loads `g` with placement cpu and, when `gpu` is given, gpu and auto (sharing that GPU and
/// the cost model `costs`), runs each on `g.inputs`, and compares every stable output with the
/// CPU's (rtol and atol 1e-3). Each session may use [`MAX_HOST_MEMORY`]. Errors are returned, never panics (a panic is a bug).
pub fn run_everywhere(
    g: &Generated,
    gpu: Option<Arc<Gpu>>,
    costs: Option<Arc<CostModel>>,
) -> Outcome {
    let bytes = g.model.encode_to_vec();
    let feeds: Vec<(&str, Tensor)> = g
        .inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let mut placements = vec![Placement::Cpu];
    if gpu.is_some() {
        placements.extend([Placement::Gpu, Placement::Auto]);
    }
    let runs: Vec<_> = placements
        .into_iter()
        .map(|p| {
            let mut opts = SessionOptions::default()
                .placement(p)
                .cpu_threads(1)
                .max_host_memory(MAX_HOST_MEMORY);
            if let Some(gpu) = &gpu {
                opts = opts.gpu(gpu.clone());
            }
            if let Some(c) = &costs {
                opts = opts.cost_model(c.clone());
            }
            let r = Session::new(bytes.as_slice(), opts).and_then(|s| s.run(&feeds));
            (p, r)
        })
        .collect();
    let mut out = Outcome {
        runs,
        compared: 0,
        mismatches: Vec::new(),
    };
    let Some((_, Ok(want))) = out.runs.first() else {
        return out;
    };
    for (p, r) in &out.runs[1..] {
        let Ok(got) = r else { continue };
        for ((name, w), (_, t)) in want.iter().zip(got) {
            if g.unstable_outputs.contains(name) {
                continue;
            }
            out.compared += 1;
            let why = if t.dtype() != w.dtype() || t.shape != w.shape {
                Some(format!(
                    "{}{:?} vs cpu {}{:?}",
                    t.dtype(),
                    t.shape,
                    w.dtype(),
                    w.shape
                ))
            } else {
                first_mismatch(t, w, 1e-3, 1e-3)
                    .map(|(i, a, b)| format!("element {i}: {a} vs cpu {b}"))
            };
            if let Some(why) = why {
                out.mismatches.push(format!("{p:?} {name}: {why}"));
            }
        }
    }
    out
}
