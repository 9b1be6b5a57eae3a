//! View operators: Reshape, Flatten, Squeeze, Unsqueeze, Identity and Dropout (inference).
//! Output 0 holds input 0's elements in the same order; only the shape changes.
//!
//! Sits between the runtime (which aliases the storage because [`Op::is_view`] is true) and the
//! copy kernels it falls back to when it cannot alias: a row-range copy on the CPU and the
//! shared `copy.wgsl` on the GPU.

use crate::movement::{copy_kernel, plan_value, with_same_type, Elem, SameTypeKernel};
use crate::shape::{normalize_axis, row_len};
use crate::{Attrs, DType, Data, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use std::ops::Range;

/// Which view operator, with its parsed attributes.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// `shape` from input 1 (opset >= 5) or the attribute (opset < 5).
    Reshape {
        allowzero: bool,
        shape_attr: Option<Vec<i64>>,
    },
    Flatten {
        axis: i64,
    },
    /// `axes` from the attribute (opset < 13) or input 1; `None`: every size-1 dimension.
    Squeeze {
        axes_attr: Option<Vec<i64>>,
    },
    Unsqueeze {
        axes_attr: Option<Vec<i64>>,
    },
    Identity,
    /// Inference-mode Dropout: output = input, optional mask output all true.
    Dropout {
        ratio_attr: f32,
    },
}

/// A view operator (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    name: &'static str,
    kind: Kind,
    opset: i64,
}

/// Reshape: `allowzero` (opset 14) makes a 0 in `shape` a real zero instead of "copy the dim".
pub fn reshape(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let shape_attr = if attrs.opset < 5 {
        Some(attrs.ints_opt("shape")?.ok_or_else(|| {
            OpError::Invalid("Reshape (opset < 5): attribute `shape` is required".into())
        })?)
    } else {
        None
    };
    let allowzero = attrs.int("allowzero", 0)? != 0;
    Ok(Box::new(View {
        name: "Reshape",
        kind: Kind::Reshape {
            allowzero,
            shape_attr,
        },
        opset: attrs.opset,
    }))
}

/// Flatten to 2-D at `axis` (default 1, negative from opset 11).
pub fn flatten(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(View {
        name: "Flatten",
        kind: Kind::Flatten {
            axis: attrs.int("axis", 1)?,
        },
        opset: attrs.opset,
    }))
}

/// Squeeze: `axes` attribute before opset 13, optional input 1 from 13.
pub fn squeeze(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let axes_attr = if attrs.opset < 13 {
        attrs.ints_opt("axes")?
    } else {
        None
    };
    Ok(Box::new(View {
        name: "Squeeze",
        kind: Kind::Squeeze { axes_attr },
        opset: attrs.opset,
    }))
}

/// Unsqueeze: `axes` attribute (required) before opset 13, input 1 from 13.
pub fn unsqueeze(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let axes_attr = if attrs.opset < 13 {
        Some(attrs.ints_opt("axes")?.ok_or_else(|| {
            OpError::Invalid("Unsqueeze (opset < 13): attribute `axes` is required".into())
        })?)
    } else {
        None
    };
    Ok(Box::new(View {
        name: "Unsqueeze",
        kind: Kind::Unsqueeze { axes_attr },
        opset: attrs.opset,
    }))
}

pub fn identity(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(View {
        name: "Identity",
        kind: Kind::Identity,
        opset: attrs.opset,
    }))
}

/// Dropout in inference mode; training mode with a non-zero ratio is `Unsupported`.
pub fn dropout(attrs: &Attrs) -> Result<Box<dyn Op>> {
    if attrs.opset < 7 && attrs.int("is_test", 0)? == 0 {
        return Err(OpError::Unsupported(
            "Dropout: training mode (is_test = 0) is not supported".into(),
        ));
    }
    Ok(Box::new(View {
        name: "Dropout",
        kind: Kind::Dropout {
            ratio_attr: attrs.float("ratio", 0.5)?,
        },
        opset: attrs.opset,
    }))
}

impl View {
    fn input_ints(&self, ins: &[&TensorMeta], i: usize, what: &str) -> Result<Option<Vec<i64>>> {
        match ins.get(i) {
            None => Ok(None),
            Some(m) => Ok(Some(plan_value(self.name, what, m)?.to_i64_vec())),
        }
    }

    fn out_shape(&self, ins: &[&TensorMeta]) -> Result<Vec<usize>> {
        let x = ins
            .first()
            .ok_or_else(|| OpError::Invalid(format!("{}: missing input", self.name)))?;
        let dims = &x.shape;
        let r = dims.len();
        match &self.kind {
            Kind::Identity | Kind::Dropout { .. } => Ok(dims.clone()),
            Kind::Flatten { axis } => {
                let a = if *axis < 0 { axis + r as i64 } else { *axis };
                if a < 0 || a > r as i64 {
                    return Err(OpError::Invalid(format!(
                        "Flatten: axis {axis} is out of range for rank {r}"
                    )));
                }
                let a = a as usize;
                Ok(vec![dims[..a].iter().product(), dims[a..].iter().product()])
            }
            Kind::Reshape {
                allowzero,
                shape_attr,
            } => {
                let shape = match shape_attr {
                    Some(s) => s.clone(),
                    None => self.input_ints(ins, 1, "shape")?.ok_or_else(|| {
                        OpError::Invalid("Reshape: input `shape` is missing".into())
                    })?,
                };
                reshape_dims(dims, &shape, *allowzero)
            }
            Kind::Squeeze { axes_attr } => {
                let axes = match axes_attr {
                    Some(a) => Some(a.clone()),
                    None if self.opset >= 13 => self.input_ints(ins, 1, "axes")?,
                    None => None,
                }
                .filter(|a| !a.is_empty());
                match axes {
                    None => Ok(dims.iter().copied().filter(|&d| d != 1).collect()),
                    Some(axes) => {
                        let mut drop = vec![false; r];
                        for &a in &axes {
                            let a = normalize_axis(a, r)?;
                            if dims.get(a) != Some(&1) {
                                return Err(OpError::Invalid(format!(
                                    "Squeeze: axis {a} of shape {dims:?} is not 1"
                                )));
                            }
                            drop[a] = true;
                        }
                        Ok((0..r).filter(|&i| !drop[i]).map(|i| dims[i]).collect())
                    }
                }
            }
            Kind::Unsqueeze { axes_attr } => {
                let axes = match axes_attr {
                    Some(a) => a.clone(),
                    None => self.input_ints(ins, 1, "axes")?.ok_or_else(|| {
                        OpError::Invalid("Unsqueeze: input `axes` is missing".into())
                    })?,
                };
                let rank = r + axes.len();
                let mut new = vec![false; rank];
                for &a in &axes {
                    let a = normalize_axis(a, rank)?;
                    if new[a] {
                        return Err(OpError::Invalid(format!(
                            "Unsqueeze: axis {a} is listed twice in {axes:?}"
                        )));
                    }
                    new[a] = true;
                }
                let mut it = dims.iter();
                Ok(new
                    .iter()
                    .map(|&n| if n { 1 } else { *it.next().unwrap_or(&1) })
                    .collect())
            }
        }
    }

    fn check_dropout_mode(&self, ins: &[&TensorMeta]) -> Result<()> {
        if let Kind::Dropout { ratio_attr } = self.kind {
            let ratio = match ins.get(1).and_then(|m| m.value.as_deref()) {
                Some(t) if t.numel() == 1 && self.opset >= 12 => t.data.get_f64(0),
                _ => ratio_attr as f64,
            };
            if self.opset >= 12 && ins.len() > 2 {
                let mode = plan_value("Dropout", "training_mode", ins[2])?;
                if mode.numel() == 1 && mode.data.get_i64(0) != 0 && ratio != 0.0 {
                    return Err(OpError::Unsupported(
                        "Dropout: training_mode = true (random masking) is not supported".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The output dims of Reshape of `dims` to `shape` (ONNX rules for 0 and -1).
fn reshape_dims(dims: &[usize], shape: &[i64], allowzero: bool) -> Result<Vec<usize>> {
    let total: usize = dims.iter().product();
    let mut out = Vec::with_capacity(shape.len());
    let mut infer_at = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 if infer_at.is_some() => {
                return Err(OpError::Invalid(format!(
                    "Reshape: more than one -1 in shape {shape:?}"
                )))
            }
            -1 => {
                infer_at = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(*dims.get(i).ok_or_else(|| {
                OpError::Invalid(format!(
                    "Reshape: shape {shape:?} copies dim {i} (0) but the input {dims:?} has rank {}",
                    dims.len()
                ))
            })?),
            s if s < 0 => {
                return Err(OpError::Invalid(format!(
                    "Reshape: negative dim {s} in shape {shape:?}"
                )))
            }
            s => out.push(s as usize),
        }
    }
    if let Some(i) = infer_at {
        let known: usize = out.iter().product();
        if known == 0 || !total.is_multiple_of(known) {
            return Err(OpError::Invalid(format!(
                "Reshape: cannot infer -1 of {shape:?} for {total} elements"
            )));
        }
        out[i] = total / known;
    }
    if out.iter().product::<usize>() != total {
        return Err(OpError::Invalid(format!(
            "Reshape: shape {shape:?} ({out:?}) does not hold the {total} elements of {dims:?}"
        )));
    }
    Ok(out)
}

/// Copies elements `start..end` of the input to the same positions of the output.
struct CopyRange {
    start: usize,
    end: usize,
}

impl SameTypeKernel for CopyRange {
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
        let (dst, src) = (
            &mut out[self.start..self.end],
            &ins[0][self.start..self.end],
        );
        crate::movement::for_each_chunk(dst, 1 << 16, |i, d| {
            d.copy_from_slice(&src[i << 16..(i << 16) + d.len()])
        });
        Ok(())
    }
}

impl Op for View {
    fn name(&self) -> &'static str {
        self.name
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        self.check_dropout_mode(ins)?;
        let shape = self.out_shape(ins)?;
        let mut outs = vec![TensorMeta::new(ins[0].dtype, shape.clone())];
        if let Kind::Dropout { .. } = self.kind {
            let mask = if self.opset >= 10 {
                DType::Bool
            } else {
                ins[0].dtype
            };
            outs.push(TensorMeta::new(mask, shape));
        }
        Ok(outs)
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        (!outs[0].shape.is_empty()).then_some(0)
    }

    fn is_view(&self) -> bool {
        true
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let (start, end) = row_block(&outs[0].shape, rows);
        if start < end {
            with_same_type(
                self.name,
                &CopyRange { start, end },
                &[&ins[0].data],
                &mut outs[0].data,
            )?;
        }
        if let Some(mask) = outs.get_mut(1) {
            match &mut mask.data {
                Data::Bool(v) => v[start..end].iter_mut().for_each(|b| *b = true),
                other => {
                    // Dropout-7 gives the mask the input's type: ones.
                    let ones = Tensor::new(vec![1], one_of(other.dtype()));
                    set_from(other, start..end, &ones.data)?;
                }
            }
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        crate::movement::check_gpu_size(self.name, &[ins[0]])?;
        let (start, end) = row_block(&outs[0].shape, rows);
        let mut ks = Vec::new();
        if start < end {
            ks.push(copy_kernel(0, 0, start, end - start));
            if outs.len() > 1 {
                let one = if outs[1].dtype.is_float() {
                    1f32.to_bits()
                } else {
                    1
                };
                ks.push(crate::generate::fill_kernel(0, 1, start, end - start, one));
            }
        }
        Ok(ks)
    }
}

/// Elements `start..end` of output rows `rows` (views split on axis 0).
fn row_block(shape: &[usize], rows: Range<usize>) -> (usize, usize) {
    let axis = (!shape.is_empty()).then_some(0);
    let len = row_len(shape, axis);
    let n: usize = shape.iter().product();
    ((rows.start * len).min(n), (rows.end * len).min(n))
}

fn one_of(dtype: DType) -> Data {
    match dtype {
        DType::F32 => Data::F32(vec![1.0]),
        DType::F16 => Data::F16(vec![half::f16::ONE]),
        DType::F64 => Data::F64(vec![1.0]),
        DType::I64 => Data::I64(vec![1]),
        DType::I32 => Data::I32(vec![1]),
        DType::I8 => Data::I8(vec![1]),
        DType::U8 => Data::U8(vec![1]),
        DType::Bool => Data::Bool(vec![true]),
    }
}

/// out[range] = one[0] (same dtype), via the shared dtype dispatch (one call per range).
fn set_from(out: &mut Data, range: Range<usize>, one: &Data) -> Result<()> {
    struct Set(Range<usize>);
    impl SameTypeKernel for Set {
        fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
            out[self.0.clone()].fill(ins[0][0]);
            Ok(())
        }
    }
    with_same_type("Dropout", &Set(range), &[one], out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AttrValue;

    fn shape_of(op: &dyn Op, ins: &[TensorMeta]) -> Result<Vec<usize>> {
        let refs: Vec<&TensorMeta> = ins.iter().collect();
        Ok(op.infer(&refs)?[0].shape.clone())
    }

    fn x(shape: &[usize]) -> TensorMeta {
        TensorMeta::new(DType::F32, shape.to_vec())
    }

    fn ints(v: &[i64]) -> TensorMeta {
        TensorMeta::constant(Tensor::i64(&[v.len()], v.to_vec()))
    }

    #[test]
    fn reshape_follows_zero_and_minus_one_rules() {
        let op = reshape(&Attrs::new(14)).unwrap();
        assert_eq!(
            shape_of(&*op, &[x(&[2, 3, 4]), ints(&[0, -1])]).unwrap(),
            vec![2, 12]
        );
        assert_eq!(
            shape_of(&*op, &[x(&[2, 3, 4]), ints(&[4, 0, 2])]).unwrap(),
            vec![4, 3, 2]
        );
        assert!(shape_of(&*op, &[x(&[2, 3, 4]), ints(&[5, -1])]).is_err());
        assert!(shape_of(&*op, &[x(&[2, 3, 4]), ints(&[-1, -1])]).is_err());
        let z = reshape(&Attrs::new(14).with("allowzero", AttrValue::Int(1))).unwrap();
        assert_eq!(
            shape_of(&*z, &[x(&[0, 3]), ints(&[3, 0])]).unwrap(),
            vec![3, 0]
        );
        let not_const = [x(&[2, 3]), TensorMeta::new(DType::I64, vec![2])];
        assert!(matches!(
            shape_of(&*op, &not_const),
            Err(OpError::Unsupported(_))
        ));
    }

    #[test]
    fn squeeze_unsqueeze_flatten_shapes() {
        let sq = squeeze(&Attrs::new(13)).unwrap();
        assert_eq!(shape_of(&*sq, &[x(&[1, 3, 1, 2])]).unwrap(), vec![3, 2]);
        assert_eq!(
            shape_of(&*sq, &[x(&[1, 3, 1, 2]), ints(&[-2])]).unwrap(),
            vec![1, 3, 2]
        );
        assert!(shape_of(&*sq, &[x(&[1, 3]), ints(&[1])]).is_err());
        let sq11 = squeeze(&Attrs::new(11).with("axes", AttrValue::Ints(vec![0]))).unwrap();
        assert_eq!(shape_of(&*sq11, &[x(&[1, 3, 1])]).unwrap(), vec![3, 1]);
        let un = unsqueeze(&Attrs::new(13)).unwrap();
        assert_eq!(
            shape_of(&*un, &[x(&[3, 4]), ints(&[0, -1])]).unwrap(),
            vec![1, 3, 4, 1]
        );
        assert_eq!(
            shape_of(&*un, &[x(&[3, 4]), ints(&[1, 3])]).unwrap(),
            vec![3, 1, 4, 1]
        );
        let un1 = unsqueeze(&Attrs::new(1).with("axes", AttrValue::Ints(vec![0]))).unwrap();
        assert_eq!(shape_of(&*un1, &[x(&[])]).unwrap(), vec![1]);
        let fl = flatten(&Attrs::new(13).with("axis", AttrValue::Int(-1))).unwrap();
        assert_eq!(shape_of(&*fl, &[x(&[2, 3, 4])]).unwrap(), vec![6, 4]);
        let fl0 = flatten(&Attrs::new(13).with("axis", AttrValue::Int(0))).unwrap();
        assert_eq!(shape_of(&*fl0, &[x(&[2, 3, 4])]).unwrap(), vec![1, 24]);
    }

    #[test]
    fn cpu_copies_only_the_requested_rows_and_dropout_sets_the_mask() {
        let op = dropout(&Attrs::new(13)).unwrap();
        let input = Tensor::i64(&[3, 2], vec![1, 2, 3, 4, 5, 6]);
        let metas = [input.meta()];
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let m = op.infer(&refs).unwrap();
        let mut outs: Vec<Tensor> = m.iter().map(|m| Tensor::zeros(m.dtype, &m.shape)).collect();
        op.cpu(&[&input], &mut outs, 1..2).unwrap();
        assert_eq!(outs[0].data, Data::I64(vec![0, 0, 3, 4, 0, 0]));
        assert_eq!(
            outs[1].data,
            Data::Bool(vec![false, false, true, true, false, false])
        );
    }
}
