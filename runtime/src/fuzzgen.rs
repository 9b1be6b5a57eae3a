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

use crate::cost::CostModel;
use crate::gpu::Gpu;
use crate::import::proto::*;
use crate::testing::first_mismatch;
use crate::{Placement, Result, Session, SessionOptions};
use prost::Message;
use std::sync::Arc;
use tandem_ops::{registry, AttrValue, Attrs, DType, Data, Tensor, TensorMeta};

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

/// A value the next nodes may read.
struct Val {
    name: String,
    meta: TensorMeta,
    /// Computed with rounding that may differ between devices.
    inexact: bool,
    /// Derived from a discontinuous op applied to an inexact value.
    unstable: bool,
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

const UNARY: &[&str] = &[
    "Relu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Erf",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Clip",
    "Sqrt",
    "Exp",
    "Log",
    "Neg",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Round",
    "Abs",
    "Sign",
    "Sin",
    "Cos",
    "Softplus",
    "Softsign",
    "Elu",
    "Selu",
    "IsNaN",
    "IsInf",
    "Identity",
    "Dropout",
];
const BINARY: &[&str] = &[
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "Sum", "Mean", "Max", "Min",
];
const COMPARE: &[&str] = &["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"];
const REDUCE: &[&str] = &[
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSumExp",
    "ReduceLogSum",
];
/// Ops whose output jumps (or is ill-conditioned) when the input moves by one rounding step.
const DISCONTINUOUS: &[&str] = &[
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "ArgMax",
    "ArgMin",
    "Hardmax",
    "Cast",
    "CastLike",
    "Mod",
    "IsNaN",
    "IsInf",
    "Div",
    "Reciprocal",
    "Log",
    "Pow",
    "Sqrt",
    "ReduceLogSum",
];
/// Ops computed the same way on both devices (no rounding differences).
const EXACT: &[&str] = &[
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Dropout",
    "Transpose",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "GatherElements",
    "Expand",
    "Tile",
    "Pad",
    "Shape",
    "Size",
    "ConstantOfShape",
    "Trilu",
    "EyeLike",
    "Neg",
    "Abs",
    "Relu",
    "Max",
    "Min",
    "MaxPool",
    "ReduceMax",
    "ReduceMin",
    "GlobalMaxPool",
    "Where",
    "Cast",
    "CastLike",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "ArgMax",
    "ArgMin",
    "Hardmax",
    "IsNaN",
    "IsInf",
    "Not",
    "And",
    "Or",
    "Xor",
    "Clip",
    "Add",
    "Sub",
    "Mul",
];

fn onnx_code(d: DType) -> i32 {
    match d {
        DType::F32 => data_type::FLOAT,
        DType::F16 => data_type::FLOAT16,
        DType::F64 => data_type::DOUBLE,
        DType::I64 => data_type::INT64,
        DType::I32 => data_type::INT32,
        DType::I8 => data_type::INT8,
        DType::U8 => data_type::UINT8,
        DType::Bool => data_type::BOOL,
    }
}

/// `t` as an initializer (raw little-endian data).
pub fn tensor_proto(name: &str, t: &Tensor) -> TensorProto {
    let raw: Vec<u8> = match &t.data {
        Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I8(v) => v.iter().map(|&x| x as u8).collect(),
        Data::U8(v) => v.clone(),
        Data::Bool(v) => v.iter().map(|&x| x as u8).collect(),
    };
    TensorProto {
        name: name.into(),
        dims: t.shape.iter().map(|&d| d as i64).collect(),
        data_type: onnx_code(t.dtype()),
        raw_data: Some(raw.into()),
        ..Default::default()
    }
}

/// A tensor value type with a fixed shape.
pub fn value_info(name: &str, dtype: DType, shape: &[usize]) -> ValueInfoProto {
    let dim = shape
        .iter()
        .map(|&d| Dimension {
            dim_value: Some(d as i64),
            dim_param: None,
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: onnx_code(dtype),
                shape: Some(TensorShapeProto { dim }),
            }),
            ..Default::default()
        }),
    }
}

/// An ONNX attribute holding `v`.
pub fn attribute(name: &str, v: &AttrValue) -> AttributeProto {
    use attribute_type as at;
    let a = AttributeProto {
        name: name.into(),
        ..Default::default()
    };
    match v {
        AttrValue::Int(i) => AttributeProto {
            r#type: at::INT,
            i: Some(*i),
            ..a
        },
        AttrValue::Float(f) => AttributeProto {
            r#type: at::FLOAT,
            f: Some(*f),
            ..a
        },
        AttrValue::Ints(v) => AttributeProto {
            r#type: at::INTS,
            ints: v.clone(),
            ..a
        },
        AttrValue::Floats(v) => AttributeProto {
            r#type: at::FLOATS,
            floats: v.clone(),
            ..a
        },
        AttrValue::String(s) => AttributeProto {
            r#type: at::STRING,
            s: Some(s.as_bytes().to_vec()),
            ..a
        },
        AttrValue::Strings(v) => AttributeProto {
            r#type: at::STRINGS,
            strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
            ..a
        },
        AttrValue::Tensor(t) => AttributeProto {
            r#type: at::TENSOR,
            t: Some(tensor_proto("", t)),
            ..a
        },
    }
}

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
            .filter(|&i| want(&self.vals[i].meta))
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

    /// Chooses one candidate node, or `None` when the pool has nothing it can read.
    fn candidate(&mut self) -> Option<Cand> {
        let c = |op, inputs, attrs| {
            Some(Cand {
                op,
                inputs,
                attrs,
                outputs: 1,
            })
        };
        let s = &mut self.src;
        match s.below(30) {
            0..=5 => {
                let op = UNARY[self.src.below(UNARY.len())];
                let x = self.float()?;
                let mut ins = vec![x];
                let mut attrs = Vec::new();
                match op {
                    "LeakyRelu" | "Elu" => attrs.push(("alpha", AttrValue::Float(0.3))),
                    "HardSigmoid" => attrs.push(("beta", AttrValue::Float(0.4))),
                    "Clip" => {
                        let lo = self.src.below(16) as f32 / 8.0 - 1.0;
                        ins.push(self.scalar_f32(lo));
                        if self.src.chance(2) {
                            ins.push(self.scalar_f32(lo + 1.5));
                        }
                    }
                    _ => {}
                }
                c(op, ins, attrs)
            }
            6..=9 => {
                let op = BINARY[self.src.below(BINARY.len())];
                let x = self.float()?;
                let y = if self.src.chance(2) {
                    let shape = self.vals[x].meta.shape.clone();
                    self.broadcast_const(&shape)
                } else {
                    self.float()?
                };
                let attrs = if op == "Mod" {
                    vec![("fmod", AttrValue::Int(1))]
                } else {
                    vec![]
                };
                c(op, vec![x, y], attrs)
            }
            10 => {
                let op = COMPARE[self.src.below(COMPARE.len())];
                let x = self.float()?;
                let shape = self.vals[x].meta.shape.clone();
                let y = self.broadcast_const(&shape);
                c(op, vec![x, y], vec![])
            }
            11 => {
                let cond = self.pick(|m| m.dtype == DType::Bool)?;
                let x = self.float()?;
                let y = self.float()?;
                let op = ["Where", "Not", "And", "Xor"][self.src.below(4)];
                match op {
                    "Where" => c(op, vec![cond, x, y], vec![]),
                    "Not" => c(op, vec![cond], vec![]),
                    _ => c(op, vec![cond, cond], vec![]),
                }
            }
            12 => {
                let x = self.pick(|_| true)?;
                let to = [1, 6, 7, 9, 2, 3][self.src.below(6)];
                if self.src.chance(3) {
                    let like = self.pick(|_| true)?;
                    c("CastLike", vec![x, like], vec![])
                } else {
                    c("Cast", vec![x], vec![("to", AttrValue::Int(to))])
                }
            }
            13 => {
                let op = ["Softmax", "LogSoftmax", "Hardmax"][self.src.below(3)];
                let x = self.rank_at_least(1)?;
                let axis = self.axis(self.vals[x].meta.rank());
                c(op, vec![x], vec![("axis", AttrValue::Int(axis))])
            }
            14..=15 => self.reduce(),
            16 => self.pool(),
            17 => self.norm(),
            18 => self.matmul(),
            19 => self.conv(),
            20..=21 => self.reshape_like(),
            22 => self.concat_split(),
            23 => self.slice_gather(),
            24 => self.expand_tile_pad(),
            25 => self.resize(),
            _ => self.generate_op(),
        }
    }

    fn reduce(&mut self) -> Option<Cand> {
        let x = self.float()?;
        let rank = self.vals[x].meta.rank();
        if self.src.chance(3) {
            let op = ["ArgMax", "ArgMin"][self.src.below(2)];
            let attrs = vec![
                ("axis", AttrValue::Int(self.axis(rank))),
                ("keepdims", AttrValue::Int(self.src.range(0, 1))),
                ("select_last_index", AttrValue::Int(self.src.range(0, 1))),
            ];
            return Some(Cand {
                op,
                inputs: vec![x],
                attrs,
                outputs: 1,
            });
        }
        let op = REDUCE[self.src.below(REDUCE.len())];
        let axes = self.axes(rank);
        let mut inputs = vec![x];
        let mut attrs = vec![("keepdims", AttrValue::Int(self.src.range(0, 1)))];
        let axes_input = self.opset >= 18 || (op == "ReduceSum" && self.opset >= 13);
        if axes_input {
            if !axes.is_empty() || self.src.chance(2) {
                inputs.push(self.int_const(axes));
            }
            if self.src.chance(4) {
                attrs.push(("noop_with_empty_axes", AttrValue::Int(1)));
            }
        } else if !axes.is_empty() {
            attrs.push(("axes", AttrValue::Ints(axes)));
        }
        Some(Cand {
            op,
            inputs,
            attrs,
            outputs: 1,
        })
    }

    /// Kernel geometry attributes shared by pools and convolutions.
    fn window_attrs(&mut self, spatial: usize, dilations: bool) -> Vec<(&'static str, AttrValue)> {
        let mut a = Vec::new();
        if self.src.chance(2) {
            let v = self.ints(spatial, 1, 3);
            a.push(("strides", AttrValue::Ints(v)));
        }
        if self.src.chance(4) {
            let mode = ["SAME_UPPER", "SAME_LOWER", "VALID"][self.src.below(3)];
            a.push(("auto_pad", AttrValue::String(mode.into())));
        } else if self.src.chance(2) {
            let v = self.ints(2 * spatial, 0, 2);
            a.push(("pads", AttrValue::Ints(v)));
        }
        if dilations && self.src.chance(3) {
            let v = self.ints(spatial, 1, 2);
            a.push(("dilations", AttrValue::Ints(v)));
        }
        a
    }

    fn pool(&mut self) -> Option<Cand> {
        let x = self.rank_at_least(3)?;
        let spatial = self.vals[x].meta.rank() - 2;
        let op = [
            "MaxPool",
            "AveragePool",
            "GlobalAveragePool",
            "GlobalMaxPool",
        ][self.src.below(4)];
        if op.starts_with("Global") {
            return Some(Cand {
                op,
                inputs: vec![x],
                attrs: vec![],
                outputs: 1,
            });
        }
        let mut attrs = self.window_attrs(spatial, op == "MaxPool");
        attrs.push(("kernel_shape", AttrValue::Ints(self.ints(spatial, 1, 3))));
        attrs.push(("ceil_mode", AttrValue::Int(self.src.range(0, 1))));
        if op == "AveragePool" {
            attrs.push(("count_include_pad", AttrValue::Int(self.src.range(0, 1))));
        }
        Some(Cand {
            op,
            inputs: vec![x],
            attrs,
            outputs: 1,
        })
    }

    fn norm(&mut self) -> Option<Cand> {
        let x = self.rank_at_least(2)?;
        let shape = self.vals[x].meta.shape.clone();
        let channel = |g: &mut Self, positive: bool| {
            let mut t = g.float_tensor(&[shape[1]]);
            if positive {
                t = Tensor::f32(
                    &[shape[1]],
                    t.to_f64_vec()
                        .iter()
                        .map(|v| v.abs() as f32 + 0.5)
                        .collect(),
                );
            }
            g.constant(t)
        };
        let (op, inputs, attrs) = match self.src.below(4) {
            0 => {
                let axis = self.axis(shape.len());
                let a = axis.rem_euclid(shape.len() as i64) as usize;
                let t = self.float_tensor(&shape[a.min(shape.len())..]);
                let scale = self.constant(t);
                (
                    "LayerNormalization",
                    vec![x, scale],
                    vec![("axis", AttrValue::Int(axis))],
                )
            }
            1 => {
                let (s, b) = (channel(self, false), channel(self, false));
                ("InstanceNormalization", vec![x, s, b], vec![])
            }
            2 => {
                let ins = vec![
                    x,
                    channel(self, false),
                    channel(self, false),
                    channel(self, false),
                    channel(self, true),
                ];
                ("BatchNormalization", ins, vec![])
            }
            _ => {
                let size = self.int(1, 5);
                ("LRN", vec![x], vec![("size", AttrValue::Int(size))])
            }
        };
        Some(Cand {
            op,
            inputs,
            attrs,
            outputs: 1,
        })
    }

    fn matmul(&mut self) -> Option<Cand> {
        let x = self.rank_at_least(1)?;
        let shape = self.vals[x].meta.shape.clone();
        let k = *shape.last()?;
        let n = 1 + self.src.below(6);
        if self.src.chance(2) && shape.len() == 2 {
            let trans_b = self.src.range(0, 1);
            let b_shape = if trans_b == 1 { [n, k] } else { [k, n] };
            let t = self.float_tensor(&b_shape);
            let b = self.constant(t);
            let mut inputs = vec![x, b];
            if self.src.chance(2) {
                inputs.push(self.broadcast_const(&[shape[0], n]));
            }
            let attrs = vec![
                ("transB", AttrValue::Int(trans_b)),
                ("alpha", AttrValue::Float(0.5)),
            ];
            return Some(Cand {
                op: "Gemm",
                inputs,
                attrs,
                outputs: 1,
            });
        }
        let mut w_shape = vec![k, n];
        if self.src.chance(3) && shape.len() >= 3 {
            w_shape.insert(0, shape[shape.len() - 3]);
        }
        let t = self.float_tensor(&w_shape);
        let w = self.constant(t);
        Some(Cand {
            op: "MatMul",
            inputs: vec![x, w],
            attrs: vec![],
            outputs: 1,
        })
    }

    fn conv(&mut self) -> Option<Cand> {
        let x = self.pick(|m| m.dtype == DType::F32 && (m.rank() == 3 || m.rank() == 4))?;
        let shape = self.vals[x].meta.shape.clone();
        let spatial = shape.len() - 2;
        let c = shape[1].max(1);
        let divisors: Vec<usize> = (1..=c).filter(|g| c % g == 0).collect();
        let group = divisors[self.src.below(divisors.len())];
        let transpose = self.src.chance(3);
        let mult = 1 + self.src.below(3);
        let kernel: Vec<usize> = (0..spatial).map(|_| 1 + self.src.below(3)).collect();
        let mut w_shape = if transpose {
            vec![shape[1], mult]
        } else {
            vec![group * mult, c / group]
        };
        w_shape.extend(&kernel);
        let t = self.float_tensor(&w_shape);
        let w = self.constant(t);
        let mut inputs = vec![x, w];
        let m = if transpose {
            mult * group
        } else {
            group * mult
        };
        if self.src.chance(2) {
            let t = self.float_tensor(&[m]);
            inputs.push(self.constant(t));
        }
        let mut attrs = self.window_attrs(spatial, true);
        attrs.push((
            "group",
            AttrValue::Int(self.int(group as i64, group as i64)),
        ));
        if self.src.chance(2) {
            let k = kernel.iter().map(|&k| k as i64).collect();
            attrs.push(("kernel_shape", AttrValue::Ints(k)));
        }
        if transpose && self.src.chance(3) {
            attrs.push(("output_padding", AttrValue::Ints(self.ints(spatial, 0, 1))));
        }
        let op = if transpose { "ConvTranspose" } else { "Conv" };
        Some(Cand {
            op,
            inputs,
            attrs,
            outputs: 1,
        })
    }

    fn reshape_like(&mut self) -> Option<Cand> {
        let x = self.pick(|_| true)?;
        let shape = self.vals[x].meta.shape.clone();
        let rank = shape.len();
        let one = |op| Cand {
            op,
            inputs: vec![x],
            attrs: vec![],
            outputs: 1,
        };
        Some(match self.src.below(5) {
            0 => {
                // Regroup the dims: shuffle them, merge neighbours, maybe one -1 or 0.
                let mut dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                for i in (1..dims.len()).rev() {
                    let j = self.src.below(i + 1);
                    dims.swap(i, j);
                }
                if dims.len() >= 2 && self.src.chance(2) {
                    let last = dims.pop().unwrap_or(1);
                    *dims.last_mut().expect("two dims") *= last;
                }
                if !dims.is_empty() && self.src.chance(3) {
                    let i = self.src.below(dims.len());
                    dims[i] = if self.src.chance(2) { -1 } else { 0 };
                }
                if self.hostile && self.src.chance(3) {
                    dims.push(self.int(-2, 3));
                }
                let s = self.int_const(dims);
                Cand {
                    inputs: vec![x, s],
                    ..one("Reshape")
                }
            }
            1 => Cand {
                attrs: vec![(
                    "axis",
                    AttrValue::Int(self.int(-(rank as i64), rank as i64)),
                )],
                ..one("Flatten")
            },
            2 => {
                let axes: Vec<i64> = (0..rank as i64)
                    .filter(|&a| shape[a as usize] == 1 && self.src.chance(2))
                    .collect();
                let s = self.int_const(axes);
                Cand {
                    inputs: vec![x, s],
                    ..one("Squeeze")
                }
            }
            3 => {
                let n = 1 + self.src.below(2);
                let axes = self.ints(n, -(rank as i64) - 1, rank as i64);
                let s = self.int_const(axes);
                Cand {
                    inputs: vec![x, s],
                    ..one("Unsqueeze")
                }
            }
            _ => {
                let mut perm: Vec<i64> = (0..rank as i64).collect();
                for i in (1..perm.len()).rev() {
                    let j = self.src.below(i + 1);
                    perm.swap(i, j);
                }
                if self.hostile && self.src.chance(3) && !perm.is_empty() {
                    perm[0] = self.int(-3, 5);
                }
                Cand {
                    attrs: vec![("perm", AttrValue::Ints(perm))],
                    ..one("Transpose")
                }
            }
        })
    }

    fn concat_split(&mut self) -> Option<Cand> {
        let x = self.rank_at_least(1)?;
        let shape = self.vals[x].meta.shape.clone();
        let axis = self.axis(shape.len());
        if self.src.chance(2) {
            let mut inputs = vec![x];
            for _ in 0..1 + self.src.below(2) {
                inputs.push(if self.src.chance(2) { x } else { self.float()? });
            }
            return Some(Cand {
                op: "Concat",
                inputs,
                attrs: vec![("axis", AttrValue::Int(axis))],
                outputs: 1,
            });
        }
        let d = shape[axis.rem_euclid(shape.len() as i64) as usize];
        let outputs = 1 + self.src.below(3);
        let mut inputs = vec![x];
        let mut attrs = vec![("axis", AttrValue::Int(axis))];
        if self.src.chance(2) {
            // Sizes summing to d (or, hostile, to anything).
            let mut sizes = vec![0i64; outputs];
            for _ in 0..d {
                sizes[self.src.below(outputs)] += 1;
            }
            if self.hostile {
                sizes[0] = self.int(-1, 3);
            }
            inputs.push(self.int_const(sizes));
        } else if self.opset >= 18 {
            attrs.push(("num_outputs", AttrValue::Int(outputs as i64)));
        }
        Some(Cand {
            op: "Split",
            inputs,
            attrs,
            outputs,
        })
    }

    fn slice_gather(&mut self) -> Option<Cand> {
        let x = self.pick(|m| m.rank() >= 1)?;
        let shape = self.vals[x].meta.shape.clone();
        let rank = shape.len() as i64;
        match self.src.below(3) {
            0 => {
                let n = 1 + self.src.below(shape.len());
                let axes: Vec<i64> = {
                    let mut a: Vec<i64> = (0..rank).collect();
                    for i in (1..a.len()).rev() {
                        let j = self.src.below(i + 1);
                        a.swap(i, j);
                    }
                    a.truncate(n);
                    a
                };
                let mut starts = Vec::new();
                let mut ends = Vec::new();
                let mut steps = Vec::new();
                for &a in &axes {
                    let d = shape[a as usize] as i64;
                    starts.push(self.int(-d - 1, d + 1));
                    ends.push(self.int(-d - 1, d + 1));
                    let st = self.int(-2, 2);
                    steps.push(if st == 0 && !self.hostile { 1 } else { st });
                }
                let inputs = vec![
                    x,
                    self.int_const(starts),
                    self.int_const(ends),
                    self.int_const(axes),
                    self.int_const(steps),
                ];
                Some(Cand {
                    op: "Slice",
                    inputs,
                    attrs: vec![],
                    outputs: 1,
                })
            }
            1 => {
                let axis = self.axis(shape.len());
                let d = shape[axis.rem_euclid(rank) as usize] as i64;
                // No index is valid in an empty axis (hostile models still try).
                let n = if d == 0 && !self.hostile {
                    0
                } else {
                    self.src.below(4)
                };
                let idx = self.ints(n, -d, d - 1);
                let ishape: Vec<usize> = if n == 1 && self.src.chance(2) {
                    vec![]
                } else {
                    vec![n]
                };
                let i = self.constant(Tensor::i64(&ishape, idx));
                Some(Cand {
                    op: "Gather",
                    inputs: vec![x, i],
                    attrs: vec![("axis", AttrValue::Int(axis))],
                    outputs: 1,
                })
            }
            _ => {
                let axis = self.axis(shape.len());
                let d = shape[axis.rem_euclid(rank) as usize] as i64;
                let mut ishape = shape.clone();
                let a = axis.rem_euclid(rank) as usize;
                ishape[a] = if d == 0 && !self.hostile {
                    0
                } else {
                    self.src.below(3)
                };
                let n = ishape.iter().product();
                let idx = self.ints(n, -d, d - 1);
                let i = self.constant(Tensor::i64(&ishape, idx));
                Some(Cand {
                    op: "GatherElements",
                    inputs: vec![x, i],
                    attrs: vec![("axis", AttrValue::Int(axis))],
                    outputs: 1,
                })
            }
        }
    }

    fn expand_tile_pad(&mut self) -> Option<Cand> {
        let x = self.pick(|m| m.rank() >= 1)?;
        let shape = self.vals[x].meta.shape.clone();
        let rank = shape.len();
        let (op, inputs, attrs) = match self.src.below(3) {
            0 => {
                let mut target: Vec<i64> = shape
                    .iter()
                    .map(|&d| if d == 1 { self.int(1, 3) } else { d as i64 })
                    .collect();
                if self.src.chance(3) {
                    target.insert(0, self.int(1, 2));
                }
                ("Expand", vec![x, self.int_const(target)], vec![])
            }
            1 => {
                let reps = self.ints(rank, 1, 3);
                ("Tile", vec![x, self.int_const(reps)], vec![])
            }
            _ => {
                let mode = ["constant", "reflect", "edge", "wrap"][self.src.below(4)];
                let pads = self.ints(2 * rank, -1, 2);
                let mut inputs = vec![x, self.int_const(pads)];
                if mode == "constant" && self.vals[x].meta.dtype == DType::F32 && self.src.chance(2)
                {
                    inputs.push(self.scalar_f32(1.5));
                }
                (
                    "Pad",
                    inputs,
                    vec![("mode", AttrValue::String(mode.into()))],
                )
            }
        };
        Some(Cand {
            op,
            inputs,
            attrs,
            outputs: 1,
        })
    }

    fn resize(&mut self) -> Option<Cand> {
        let x = self.rank_at_least(3)?;
        let shape = self.vals[x].meta.shape.clone();
        let mode = ["nearest", "linear", "cubic"][self.src.below(3)];
        let coord = [
            "half_pixel",
            "asymmetric",
            "align_corners",
            "pytorch_half_pixel",
        ][self.src.below(4)];
        let empty = self.constant(Tensor::f32(&[0], vec![]));
        let mut inputs = vec![x, empty];
        if self.src.chance(2) {
            let mut s = vec![1.0f32; shape.len()];
            for v in s.iter_mut().skip(2) {
                *v = [0.5, 1.0, 1.5, 2.0, 3.0][self.src.below(5)];
            }
            let n = s.len();
            inputs.push(self.constant(Tensor::f32(&[n], s)));
        } else {
            let scales = self.constant(Tensor::f32(&[0], vec![]));
            inputs.push(scales);
            let sizes: Vec<i64> = shape
                .iter()
                .enumerate()
                .map(|(i, &d)| if i < 2 { d as i64 } else { self.int(1, 7) })
                .collect();
            inputs.push(self.int_const(sizes));
        }
        let attrs = vec![
            ("mode", AttrValue::String(mode.into())),
            (
                "coordinate_transformation_mode",
                AttrValue::String(coord.into()),
            ),
        ];
        Some(Cand {
            op: "Resize",
            inputs,
            attrs,
            outputs: 1,
        })
    }

    fn generate_op(&mut self) -> Option<Cand> {
        let x = self.pick(|_| true)?;
        let rank = self.vals[x].meta.rank();
        let (op, inputs, attrs) = match self.src.below(6) {
            0 => ("Shape", vec![x], vec![]),
            1 => ("Size", vec![x], vec![]),
            2 => {
                let n = 1 + self.src.below(3);
                let dims = self.ints(n, 0, 4);
                let value = Tensor::f32(&[1], vec![2.5]);
                let s = self.int_const(dims);
                (
                    "ConstantOfShape",
                    vec![s],
                    vec![("value", AttrValue::Tensor(value))],
                )
            }
            3 => {
                let (lo, hi) = (self.src.below(8) as f32 - 4.0, self.src.below(8) as f32);
                let mut delta = [0.5f32, 1.0, -1.0, 2.0][self.src.below(4)];
                if self.hostile && self.src.chance(3) {
                    delta = 0.0;
                }
                let (start, limit) = (self.scalar_f32(lo), self.scalar_f32(hi));
                let delta = self.scalar_f32(delta);
                ("Range", vec![start, limit, delta], vec![])
            }
            4 if rank >= 2 => {
                let k = self.int(-2, 2);
                let k = self.constant(Tensor::i64(&[], vec![k]));
                let upper = self.src.range(0, 1);
                ("Trilu", vec![x, k], vec![("upper", AttrValue::Int(upper))])
            }
            _ if rank == 2 => (
                "EyeLike",
                vec![x],
                vec![("k", AttrValue::Int(self.int(-2, 2)))],
            ),
            _ => ("Identity", vec![x], vec![]),
        };
        Some(Cand {
            op,
            inputs,
            attrs,
            outputs: 1,
        })
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
        let unstable = cand.inputs.iter().any(|&i| self.vals[i].unstable)
            || (reads_inexact && DISCONTINUOUS.contains(&cand.op));
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
pub const MAX_HOST_MEMORY: u64 = 1 << 30;

/// What one generated model did on each placement.
#[derive(Debug)]
pub struct Outcome {
    /// Each placement tried, with its outputs or its (typed) error from loading or running.
    pub runs: Vec<(Placement, Result<Vec<(String, Tensor)>>)>,
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
