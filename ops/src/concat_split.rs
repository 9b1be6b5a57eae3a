//! Concat (join along an axis) and Split (cut along an axis into several outputs).
//!
//! Sits between the operator contract (`op.rs`) and the shared machinery of `movement.rs`:
//! on the CPU both are block copies of `inner`-long runs; on the GPU each input of Concat (each
//! output of Split) is one `index_map.wgsl` dispatch with a strided output (input) side.

use crate::movement::{
    absent, check_gpu_size, copy_runs, for_each_chunk, plan_value, with_same_type, Elem, IndexMap,
    SameTypeKernel, PIECE,
};
use crate::shape::{normalize_axis, row_len, strides};
use crate::{Attrs, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use std::ops::Range;

#[derive(Debug, Clone, PartialEq)]
pub struct Concat {
    axis: i64,
}

/// Concat: `axis` is required from opset 4 (default 1 before).
pub fn concat(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let axis = match attrs.int_opt("axis")? {
        Some(a) => a,
        None if attrs.opset < 4 => 1,
        None => {
            return Err(OpError::Invalid(
                "Concat: attribute `axis` is required".into(),
            ))
        }
    };
    Ok(Box::new(Concat { axis }))
}

impl Concat {
    /// The axis as given (negative counts from the end).
    pub fn given_axis(&self) -> i64 {
        self.axis
    }

    fn axis(&self, ins: &[&TensorMeta]) -> Result<usize> {
        let r = ins
            .first()
            .ok_or_else(|| OpError::Invalid("Concat: no inputs".into()))?
            .rank();
        if r == 0 {
            return Err(OpError::Invalid(
                "Concat: inputs must have rank >= 1".into(),
            ));
        }
        normalize_axis(self.axis, r)
    }
}

/// Copies each input's `inner`-long runs into its place in the output block `start..end`.
struct ConcatRows {
    /// Elements along and after the axis, per input.
    chunks: Vec<usize>,
    start: usize,
    end: usize,
}

impl SameTypeKernel for ConcatRows {
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
        let total: usize = self.chunks.iter().sum();
        if total == 0 {
            return Ok(());
        }
        // Where each input's part begins inside an outer row of the output (`total` long).
        let begins: Vec<usize> = self
            .chunks
            .iter()
            .scan(0, |at, &len| {
                let begin = *at;
                *at += len;
                Some(begin)
            })
            .collect();
        for_each_chunk(&mut out[self.start..self.end], PIECE, |i, piece| {
            copy_runs(piece, self.start + i * PIECE, |at| {
                let (row, q) = (at / total, at % total);
                // The last input whose part begins at or before q (never an empty one: the
                // input after it begins at the same place).
                let k = begins.partition_point(|&b| b <= q) - 1;
                let part = row * self.chunks[k];
                &ins[k][part + q - begins[k]..part + self.chunks[k]]
            })
        });
        Ok(())
    }
}

impl Op for Concat {
    fn name(&self) -> &'static str {
        "Concat"
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn appends_inputs(&self, ins: &[&TensorMeta]) -> bool {
        // One outer row: each input is one contiguous part of the output.
        self.infer(ins).is_ok()
            && self
                .axis(ins)
                .is_ok_and(|a| ins[0].shape[..a].iter().all(|&d| d == 1))
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let a = self.axis(ins)?;
        let mut shape = ins[0].shape.clone();
        shape[a] = 0;
        for m in ins {
            let same = m.rank() == shape.len()
                && (0..shape.len()).all(|d| d == a || m.shape[d] == shape[d]);
            if !same || m.dtype != ins[0].dtype {
                return Err(OpError::Invalid(format!(
                    "Concat: input {}{:?} does not match {}{:?} off axis {a}",
                    m.dtype, m.shape, ins[0].dtype, ins[0].shape
                )));
            }
            shape[a] += m.shape[a];
        }
        Ok(vec![TensorMeta::new(ins[0].dtype, shape)])
    }

    fn split_axis(&self, ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        self.axis(ins).ok().map(|a| a.saturating_sub(1))
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let a = self.axis(&refs)?;
        let s = Some(a.saturating_sub(1));
        let len = row_len(&outs[0].shape, s);
        let n = outs[0].numel();
        let (start, end) = ((rows.start * len).min(n), (rows.end * len).min(n));
        if start >= end {
            return Ok(());
        }
        let chunks = ins.iter().map(|t| t.shape[a..].iter().product()).collect();
        let data: Vec<_> = ins.iter().map(|t| &t.data).collect();
        with_same_type(
            "Concat",
            &ConcatRows { chunks, start, end },
            &data,
            &mut outs[0].data,
        )
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        check_gpu_size("Concat", &[&outs[0]])?;
        let a = self.axis(ins)?;
        let out_strides = strides(&outs[0].shape);
        let mut ks = Vec::new();
        let mut off = 0;
        for (k, m) in ins.iter().enumerate() {
            let n = m.shape[a];
            let inner: usize = m.shape[a + 1..].iter().product();
            // Virtual elements of input k covering the requested output rows.
            let (lo, hi) = if a > 0 {
                let len: usize = m.shape[a..].iter().product();
                (rows.start * len, rows.end * len)
            } else {
                let (lo, hi) = (rows.start.max(off), rows.end.min(off + n));
                (
                    lo.saturating_sub(off) * inner,
                    hi.saturating_sub(off) * inner,
                )
            };
            let (lo, hi) = (lo.min(m.numel()), hi.min(m.numel()));
            if lo < hi {
                let mut map = IndexMap::new(&m.shape, strides(&m.shape));
                map.out_stride = out_strides.clone();
                map.out_base = off * out_strides[a];
                ks.push(map.gpu("Concat", lo, hi - lo, k, 0)?);
            }
            off += n;
        }
        Ok(ks)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    axis: i64,
    split_attr: Option<Vec<i64>>,
    num_outputs: Option<usize>,
    opset: i64,
}

/// Split: sizes from the `split` attribute (< 13) or input 1 (>= 13), else `num_outputs`
/// (opset 18; the last chunk may be smaller). Without either, the importer must pass the
/// node's output count as `num_outputs`.
pub fn split(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let num_outputs = match attrs.int_opt("num_outputs")? {
        Some(n) if n < 1 => {
            return Err(OpError::Invalid(format!(
                "Split: num_outputs {n} must be >= 1"
            )))
        }
        n => n.map(|n| n as usize),
    };
    Ok(Box::new(Split {
        axis: attrs.int("axis", 0)?,
        split_attr: if attrs.opset < 13 {
            attrs.ints_opt("split")?
        } else {
            None
        },
        num_outputs,
        opset: attrs.opset,
    }))
}

impl Split {
    /// (axis, sizes along it).
    fn sizes(&self, ins: &[&TensorMeta]) -> Result<(usize, Vec<usize>)> {
        if ins[0].rank() == 0 {
            return Err(OpError::Invalid("Split: input is a scalar".into()));
        }
        let a = normalize_axis(self.axis, ins[0].rank())?;
        let dim = ins[0].shape[a];
        let given = match &self.split_attr {
            Some(s) => Some(s.clone()),
            None if self.opset >= 13 && !absent(ins, 1) => {
                Some(plan_value("Split", "split", ins[1])?.to_i64_vec())
            }
            None => None,
        };
        let sizes = match (given, self.num_outputs) {
            (Some(s), _) => {
                let sum = s.iter().try_fold(0i64, |t, &v| t.checked_add(v));
                if s.iter().any(|&v| v < 0) || sum != Some(dim as i64) {
                    return Err(OpError::Invalid(format!(
                        "Split: sizes {s:?} do not add up to dim {dim} of axis {a}"
                    )));
                }
                s.iter().map(|&v| v as usize).collect()
            }
            (None, Some(n)) => {
                let chunk = if self.opset >= 18 {
                    dim.div_ceil(n)
                } else if dim.is_multiple_of(n) {
                    dim / n
                } else {
                    return Err(OpError::Invalid(format!(
                        "Split: dim {dim} of axis {a} does not split into {n} equal parts"
                    )));
                };
                (0..n)
                    .map(|k| chunk.min(dim.saturating_sub(k * chunk)))
                    .collect()
            }
            (None, None) => return Err(OpError::Unsupported(
                "Split: neither `split` nor `num_outputs` given (importer must set num_outputs)"
                    .into(),
            )),
        };
        Ok((a, sizes))
    }
}

/// Copies output `k`'s runs out of the input.
struct SplitPart {
    outer: usize,
    in_len: usize,
    off: usize,
    len: usize,
}

impl SameTypeKernel for SplitPart {
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let n = (self.outer * self.len).min(out.len());
        for_each_chunk(&mut out[..n], PIECE, |i, piece| {
            // Each outer row's part of the input.
            copy_runs(piece, i * PIECE, |at| {
                let part = (at / self.len) * self.in_len + self.off;
                &ins[0][part + at % self.len..part + self.len]
            })
        });
        Ok(())
    }
}

impl Op for Split {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "Split"
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let (a, sizes) = self.sizes(ins)?;
        Ok(sizes
            .iter()
            .map(|&n| {
                let mut s = ins[0].shape.clone();
                s[a] = n;
                TensorMeta::new(ins[0].dtype, s)
            })
            .collect())
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], _rows: Range<usize>) -> Result<()> {
        let metas = crate::movement::cpu_metas(ins);
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let (a, sizes) = self.sizes(&refs)?;
        let shape = &ins[0].shape;
        let outer: usize = shape[..a].iter().product();
        let inner: usize = shape[a + 1..].iter().product();
        let mut off = 0;
        for (out, &n) in outs.iter_mut().zip(&sizes) {
            let k = SplitPart {
                outer,
                in_len: shape[a] * inner,
                off: off * inner,
                len: n * inner,
            };
            with_same_type("Split", &k, &[&ins[0].data], &mut out.data)?;
            off += n;
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        _rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        check_gpu_size("Split", &[ins[0]])?;
        let (a, sizes) = self.sizes(ins)?;
        let in_strides = strides(&ins[0].shape);
        let mut ks = Vec::new();
        let mut off = 0;
        for (k, (m, &n)) in outs.iter().zip(&sizes).enumerate() {
            if m.numel() > 0 {
                let mut map = IndexMap::new(&m.shape, in_strides.clone());
                map.in_base = off * in_strides[a];
                ks.push(map.gpu("Split", 0, m.numel(), 0, k)?);
            }
            off += n;
        }
        Ok(ks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttrValue, Data};

    fn metas(ins: &[Tensor]) -> Vec<TensorMeta> {
        ins.iter()
            .map(|t| TensorMeta::constant(t.clone()))
            .collect()
    }

    #[test]
    fn concat_matches_naive_on_each_axis_and_row_range() {
        let a = Tensor::f32(&[2, 3, 2], (0..12).map(|v| v as f32).collect());
        let b = Tensor::f32(&[2, 1, 2], vec![100.0, 101.0, 102.0, 103.0]);
        let op = concat(&Attrs::new(13).with("axis", AttrValue::Int(1))).unwrap();
        let m = metas(&[a.clone(), b.clone()]);
        let refs: Vec<&TensorMeta> = m.iter().collect();
        let o = op.infer(&refs).unwrap();
        assert_eq!(o[0].shape, vec![2, 4, 2]);
        assert_eq!(op.split_axis(&refs, &o), Some(0));
        let mut out = vec![Tensor::zeros(o[0].dtype, &o[0].shape)];
        op.cpu(&[&a, &b], &mut out, 1..2).unwrap();
        op.cpu(&[&a, &b], &mut out, 0..1).unwrap();
        let mut want = vec![];
        for i in 0..2 {
            for j in 0..4 {
                for k in 0..2 {
                    want.push(if j < 3 {
                        (i * 6 + j * 2 + k) as f32
                    } else {
                        100.0 + (i * 2 + k) as f32
                    });
                }
            }
        }
        assert_eq!(out[0].data, Data::F32(want));
        // axis 0: rows are cut inside inputs
        let op0 = concat(&Attrs::new(13).with("axis", AttrValue::Int(0))).unwrap();
        let x = Tensor::i64(&[2], vec![1, 2]);
        let y = Tensor::i64(&[3], vec![3, 4, 5]);
        let mut out = vec![Tensor::zeros(crate::DType::I64, &[5])];
        op0.cpu(&[&x, &y], &mut out, 1..3).unwrap();
        assert_eq!(out[0].data, Data::I64(vec![0, 2, 3, 0, 0]));
    }

    /// On adapters that run shaders on the CPU, inputs that land as one run of whole vec4s in
    /// the output (a batch-1 Concat on channels of 4-aligned sizes) are copied as vec4s
    /// (`copy_vec4.wgsl`), the others through `index_map.wgsl`; GPUs keep `index_map.wgsl`.
    #[test]
    fn concat_copies_whole_vec4_runs_as_vec4s_on_cpu_adapters() {
        let shaders = |shapes: &[&[usize]], axis: i64| {
            let op = concat(&Attrs::new(13).with("axis", AttrValue::Int(axis))).unwrap();
            let m: Vec<_> = (shapes.iter())
                .map(|s| TensorMeta::new(crate::DType::F32, s.to_vec()))
                .collect();
            let refs: Vec<&TensorMeta> = m.iter().collect();
            let o = op.infer(&refs).unwrap();
            let ks = op.gpu(&refs, &o, 0..o[0].shape[0]).unwrap();
            (ks.iter())
                .map(|k| (k.shader.name, k.for_adapter(true)[0].shader.name))
                .collect::<Vec<_>>()
        };
        let (map, vec4) = (("index_map", "index_map"), ("index_map", "copy_vec4"));
        assert_eq!(shaders(&[&[1, 8, 6], &[1, 4, 6]], 1), [vec4, vec4]);
        // 18 words: the first input ends, the second starts, inside a vec4
        assert_eq!(shaders(&[&[1, 3, 6], &[1, 6, 6]], 1), [map, map]);
        // two images: each input is two runs
        assert_eq!(shaders(&[&[2, 8, 6], &[2, 4, 6]], 1), [map, map]);
    }

    /// Concats larger than one parallel piece: along channels (a batch-1 image is one row,
    /// cut into pieces) and along the last axis of many short rows with an empty input, over
    /// row ranges that start and end inside pieces, against the definition; and Split of the
    /// same output back into the inputs.
    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn concat_and_split_in_pieces_match_definition() {
        let value = |k: usize, i: usize| (k * 1_000_000 + i) as f32;
        type Case = (&'static [&'static [usize]], usize, &'static [Range<usize>]);
        let cases: &[Case] = &[
            (&[&[1, 3, 90, 90], &[1, 5, 90, 90]], 1, &[0..1]),
            (&[&[2, 3, 90, 90], &[2, 5, 90, 90]], 1, &[0..2, 1..2]),
            (
                &[&[3, 7, 3000], &[3, 7, 0], &[3, 7, 2500]],
                2,
                &[0..21, 5..13],
            ),
        ];
        for &(shapes, a, ranges) in cases {
            let ins: Vec<Tensor> = shapes
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let n = s.iter().product();
                    Tensor::f32(s, (0..n).map(|i| value(k, i)).collect())
                })
                .collect();
            let op = concat(&Attrs::new(13).with("axis", AttrValue::Int(a as i64))).unwrap();
            let m = metas(&ins);
            let refs: Vec<&TensorMeta> = m.iter().collect();
            let o = op.infer(&refs).unwrap();
            // Output (outer p, j along the axis, inner q) from the input whose part holds j.
            let outer: usize = o[0].shape[..a].iter().product();
            let inner: usize = o[0].shape[a + 1..].iter().product();
            let mut want = Vec::new();
            for p in 0..outer {
                for (k, s) in shapes.iter().enumerate() {
                    for j in 0..s[a] {
                        for q in 0..inner {
                            want.push(value(k, (p * s[a] + j) * inner + q));
                        }
                    }
                }
            }
            // A row (the split axis is the one before the concat axis) is everything from
            // the concat axis on.
            let row: usize = o[0].shape[a..].iter().product();
            let t: Vec<&Tensor> = ins.iter().collect();
            for r in ranges {
                let mut out = vec![Tensor::zeros(o[0].dtype, &o[0].shape)];
                op.cpu(&t, &mut out, r.clone()).unwrap();
                let got = out[0].as_f32().unwrap();
                assert_eq!(got.len(), want.len());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let inside = (r.start * row..r.end * row).contains(&i);
                    assert_eq!(
                        *g,
                        if inside { *w } else { 0.0 },
                        "{shapes:?} rows {r:?} [{i}]"
                    );
                }
            }
            let sizes: Vec<i64> = shapes.iter().map(|s| s[a] as i64).collect();
            let split_ins = [
                Tensor::f32(&o[0].shape, want.clone()),
                Tensor::i64(&[sizes.len()], sizes),
            ];
            let op = split(&Attrs::new(13).with("axis", AttrValue::Int(a as i64))).unwrap();
            let mut parts: Vec<Tensor> = shapes
                .iter()
                .map(|s| Tensor::zeros(crate::DType::F32, s))
                .collect();
            op.cpu(&[&split_ins[0], &split_ins[1]], &mut parts, 0..1)
                .unwrap();
            for (k, (got, x)) in parts.iter().zip(&ins).enumerate() {
                assert_eq!(got.data, x.data, "split {shapes:?}: output {k}");
            }
        }
    }

    #[test]
    fn split_even_uneven_and_explicit() {
        let x = Tensor::i64(&[2, 5], (0..10).collect());
        let run = |op: &dyn Op, ins: &[Tensor]| {
            let m = metas(ins);
            let refs: Vec<&TensorMeta> = m.iter().collect();
            let o = op.infer(&refs).unwrap();
            let mut outs: Vec<Tensor> =
                o.iter().map(|m| Tensor::zeros(m.dtype, &m.shape)).collect();
            let t: Vec<&Tensor> = ins.iter().collect();
            op.cpu(&t, &mut outs, 0..1).unwrap();
            outs
        };
        let op = split(
            &Attrs::new(18)
                .with("axis", AttrValue::Int(1))
                .with("num_outputs", AttrValue::Int(2)),
        )
        .unwrap();
        let o = run(&*op, std::slice::from_ref(&x));
        assert_eq!(o[0].data, Data::I64(vec![0, 1, 2, 5, 6, 7]));
        assert_eq!(o[1].data, Data::I64(vec![3, 4, 8, 9]));
        let op = split(&Attrs::new(13).with("axis", AttrValue::Int(-1))).unwrap();
        let o = run(&*op, &[x.clone(), Tensor::i64(&[3], vec![1, 0, 4])]);
        assert_eq!(o[1].shape, vec![2, 0]);
        assert_eq!(o[2].data, Data::I64(vec![1, 2, 3, 4, 6, 7, 8, 9]));
        let op = split(&Attrs::new(11).with("num_outputs", AttrValue::Int(2))).unwrap();
        let o = run(&*op, &[x]);
        assert_eq!(o[1].data, Data::I64(vec![5, 6, 7, 8, 9]));
    }
}
