//! The candidate nodes of `fuzzgen`, one function per op family: which values they read, the
//! initializers they add (axes, shapes, weights, indices) and their attributes.
//!
//! Sits between the generator's byte source and value pool (`fuzzgen.rs`) and the op types of
//! `tandem_ops::registry`; `Gen::try_node` checks each candidate with the op's own inference.

use super::{Cand, Gen, BINARY, COMPARE, REDUCE, UNARY};
use tandem_ops::{AttrValue, DType, Tensor};

impl Gen<'_> {
    /// Chooses one candidate node, or `None` when the pool has nothing it can read.
    pub(super) fn candidate(&mut self) -> Option<Cand> {
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
        let divisors: Vec<usize> = (1..=c).filter(|&g| c.is_multiple_of(g)).collect();
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
        let m = group * mult;
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
}
