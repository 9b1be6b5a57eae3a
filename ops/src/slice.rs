//! Slice: a strided window of the input (starts, ends, axes, steps; negative steps reverse).
//!
//! Sits between the operator contract (`op.rs`) and the shared strided index map
//! (`movement.rs`, `index_map.wgsl`): output axis d reads input index start_d + c * step_d.
//! Opset 1 takes starts/ends/axes as attributes; opset >= 10 as inputs, known at plan time.

use crate::movement::{absent, first_axis, index_map_cpu, index_map_gpu, plan_value, IndexMap};
use crate::shape::{normalize_axis, strides};
use crate::{Attrs, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use std::ops::Range;

/// The (starts, ends, axes) attributes of opset 1.
type SliceAttrs = (Vec<i64>, Vec<i64>, Option<Vec<i64>>);

#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    attrs: Option<SliceAttrs>,
}

pub fn slice(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let a = if attrs.opset < 10 {
        let req = |n: &str| {
            attrs.ints_opt(n)?.ok_or_else(|| {
                OpError::Invalid(format!("Slice (opset < 10): attribute `{n}` is required"))
            })
        };
        Some((req("starts")?, req("ends")?, attrs.ints_opt("axes")?))
    } else {
        None
    };
    Ok(Box::new(Slice { attrs: a }))
}

/// Per input axis: first index read, step and output length, following the ONNX clamping
/// rules (ends beyond the dim, INT_MAX / INT_MIN sentinels, negative steps).
pub fn slice_axes(
    shape: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Vec<(i64, i64, usize)>> {
    let r = shape.len();
    let mut out: Vec<(i64, i64, usize)> = shape.iter().map(|&d| (0, 1, d)).collect();
    if starts.len() != ends.len() {
        return Err(OpError::Invalid(format!(
            "Slice: {} starts but {} ends",
            starts.len(),
            ends.len()
        )));
    }
    let default_axes: Vec<i64> = (0..starts.len() as i64).collect();
    let axes = axes.unwrap_or(&default_axes);
    if axes.len() != starts.len() || steps.is_some_and(|s| s.len() != starts.len()) {
        return Err(OpError::Invalid(format!(
            "Slice: starts ({}), axes ({}) and steps must have the same length",
            starts.len(),
            axes.len()
        )));
    }
    let mut seen = vec![false; r];
    for (i, &a) in axes.iter().enumerate() {
        let a = normalize_axis(a, r)?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(OpError::Invalid(format!("Slice: axis {a} is listed twice")));
        }
        let dim = shape[a] as i64;
        let step = steps.map_or(1, |s| s[i]);
        if step == 0 {
            return Err(OpError::Invalid("Slice: steps must not be 0".into()));
        }
        let fix = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        let (mut s, mut e) = (fix(starts[i]), fix(ends[i]));
        let count = if step > 0 {
            s = s.clamp(0, dim);
            e = e.clamp(0, dim);
            if e > s {
                (e - s + step - 1) / step
            } else {
                0
            }
        } else {
            s = s.clamp(0, (dim - 1).max(0));
            e = e.clamp(-1, dim - 1);
            if s > e && dim > 0 {
                (s - e + (-step) - 1) / (-step)
            } else {
                0
            }
        };
        out[a] = (s, step, count as usize);
    }
    Ok(out)
}

impl Slice {
    /// The index map for input `shape`; `value(i, name)` gives the contents of input `i`
    /// (`None` for an absent optional input).
    fn map_with(
        &self,
        shape: &[usize],
        value: impl Fn(usize, &str) -> Result<Option<Vec<i64>>>,
    ) -> Result<IndexMap> {
        let axes_steps = match &self.attrs {
            Some((s, e, a)) => slice_axes(shape, s, e, a.as_deref(), None)?,
            None => {
                let starts = value(1, "starts")?.unwrap_or_default();
                let ends = value(2, "ends")?.unwrap_or_default();
                let axes = value(3, "axes")?;
                let steps = value(4, "steps")?;
                slice_axes(shape, &starts, &ends, axes.as_deref(), steps.as_deref())?
            }
        };
        let dims: Vec<usize> = axes_steps.iter().map(|a| a.2).collect();
        let mut map = IndexMap::new(&dims, strides(shape));
        map.offset = axes_steps.iter().map(|a| a.0).collect();
        map.step = axes_steps.iter().map(|a| a.1).collect();
        Ok(map)
    }

    fn map(&self, ins: &[&TensorMeta]) -> Result<IndexMap> {
        self.map_with(&ins[0].shape, |i, name| {
            if i >= 3 && absent(ins, i) {
                return Ok(None);
            }
            let m = ins
                .get(i)
                .ok_or_else(|| OpError::Invalid(format!("Slice: input `{name}` is missing")))?;
            Ok(Some(plan_value("Slice", name, m)?.to_i64_vec()))
        })
    }
}

impl Op for Slice {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "Slice"
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        Ok(vec![TensorMeta::new(ins[0].dtype, self.map(ins)?.dims)])
    }

    fn work(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> crate::Work {
        crate::Work {
            flops: 0,
            bytes_read: outs[0].bytes(),
            bytes_written: outs[0].bytes(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        first_axis(&outs[0])
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        // The inputs' contents as they are (no metas built per run).
        let map = self.map_with(&ins[0].shape, |i, name| match ins.get(i) {
            Some(t) if i >= 3 && t.numel() == 0 && t.shape.len() == 1 => Ok(None),
            Some(t) => Ok(Some(t.to_i64_vec())),
            None if i >= 3 => Ok(None),
            None => Err(OpError::Invalid(format!(
                "Slice: input `{name}` is missing"
            ))),
        })?;
        index_map_cpu("Slice", &map, ins[0], &mut outs[0], rows)
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let map = self.map(ins)?;
        index_map_gpu("Slice", &map, ins, &outs[0], rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Data;

    fn run(op: &dyn Op, ins: &[Tensor]) -> Tensor {
        let metas: Vec<TensorMeta> = ins
            .iter()
            .map(|t| TensorMeta::constant(t.clone()))
            .collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let m = op.infer(&refs).unwrap();
        let mut out = vec![Tensor::zeros(m[0].dtype, &m[0].shape)];
        let rows = m[0].shape.first().copied().unwrap_or(1);
        let tins: Vec<&Tensor> = ins.iter().collect();
        op.cpu(&tins, &mut out, 0..rows).unwrap();
        out.remove(0)
    }

    #[test]
    fn slice_with_steps_negative_steps_and_clamping() {
        // x[r][c] = 10 r + c, shape [3, 6]
        let x = Tensor::i64(
            &[3, 6],
            (0..3)
                .flat_map(|r| (0..6).map(move |c| 10 * r + c))
                .collect(),
        );
        let op = slice(&Attrs::new(13)).unwrap();
        let ints = |v: &[i64]| Tensor::i64(&[v.len()], v.to_vec());
        // x[0:2, 5:0:-2] -> rows 0,1; cols 5,3,1
        let y = run(
            &*op,
            &[
                x.clone(),
                ints(&[0, 5]),
                ints(&[2, 0]),
                ints(&[0, 1]),
                ints(&[1, -2]),
            ],
        );
        assert_eq!(y.shape, vec![2, 3]);
        assert_eq!(y.data, Data::I64(vec![5, 3, 1, 15, 13, 11]));
        // x[:, 1:INT_MAX] with axes [-1]
        let y = run(
            &*op,
            &[x.clone(), ints(&[1]), ints(&[i64::MAX]), ints(&[-1])],
        );
        assert_eq!(y.shape, vec![3, 5]);
        assert_eq!(y.data.get_i64(5), 11);
        // reversed whole axis: start -1, end INT_MIN, step -1
        let y = run(
            &*op,
            &[
                x.clone(),
                ints(&[-1]),
                ints(&[i64::MIN]),
                ints(&[0]),
                ints(&[-1]),
            ],
        );
        assert_eq!(y.data.get_i64(0), 20);
        assert_eq!(y.data.get_i64(17), 5);
        // empty result
        let y = run(&*op, &[x.clone(), ints(&[4]), ints(&[2]), ints(&[1])]);
        assert_eq!(y.shape, vec![3, 0]);
    }

    #[test]
    fn opset1_attributes() {
        use crate::AttrValue;
        let op = slice(
            &Attrs::new(1)
                .with("starts", AttrValue::Ints(vec![1]))
                .with("ends", AttrValue::Ints(vec![-1]))
                .with("axes", AttrValue::Ints(vec![1])),
        )
        .unwrap();
        let x = Tensor::f32(&[2, 4], (0..8).map(|v| v as f32).collect());
        assert_eq!(run(&*op, &[x]).data, Data::F32(vec![1.0, 2.0, 5.0, 6.0]));
    }
}
