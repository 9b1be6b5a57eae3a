//! ONNX `Where(condition, X, Y)`: elementwise selection with three-way numpy broadcasting.
//!
//! Sits between the registry and the broadcasting machinery of `elementwise_common.rs`. On
//! the GPU (`where.wgsl`) selection copies 4-byte elements, so it serves every dtype.

use crate::binary::zip_run;
use crate::elementwise_common::{
    check_rows, element_range, gpu_broadcast, gpu_range, last_axis, typed, typed_mut, Broadcast,
    Elem, GpuDims,
};
use crate::{shape, Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use half::f16;
use std::ops::Range;

/// `Where`: `out = cond ? x : y`, broadcast.
#[derive(Debug, Clone)]
pub struct Where;

/// GPU parameters of `where.wgsl` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct WhereParams {
    start: u32,
    count: u32,
    _pad: [u32; 2],
    /// The merged dims and strides of `gpu_broadcast`; their count is the override `RANK`.
    dims: GpuDims,
    c_strides: GpuDims,
    x_strides: GpuDims,
    y_strides: GpuDims,
}

/// `out[r] = c ? x : y` with all three broadcast by `bc`. Each run has every operand either
/// advancing (stride 1) or fixed (stride 0); each case is one vector loop with the fixed
/// operands as values (a causal mask `[t, t]` against scores `[1, heads, t, t]` and a scalar
/// -inf: tiny Llama prefill's two Wheres took 60 us each for 65,536 elements, indexing every
/// operand element by element).
fn select_broadcast<T: Elem>(
    bc: &Broadcast<3>,
    c: &[bool],
    x: &[T],
    y: &[T],
    out: &mut [T],
    r: Range<usize>,
) {
    let [sc, sx, sy] = bc.inner_strides();
    bc.par_runs(out, r, |o, [ic, ix, iy]| {
        let n = o.len();
        if n == 0 {
            return;
        }
        let len = |s: usize| if s == 1 { n } else { 1 };
        let (c, x, y) = (
            &c[ic..ic + len(sc)],
            &x[ix..ix + len(sx)],
            &y[iy..iy + len(sy)],
        );
        let (x0, y0) = (x[0], y[0]);
        match (sc, sx, sy) {
            (1, 1, 1) => {
                for (((o, &c), &x), &y) in o.iter_mut().zip(c).zip(x).zip(y) {
                    *o = if c { x } else { y };
                }
            }
            (1, 1, _) => zip_run(o, c, x, &|c, x| if c { x } else { y0 }),
            (1, _, 1) => zip_run(o, c, y, &|c, y| if c { x0 } else { y }),
            (1, _, _) => crate::simd::map(c, o, &|c| if c { x0 } else { y0 }),
            (_, s, _) if c[0] => match s {
                1 => o.copy_from_slice(x),
                _ => o.fill(x0),
            },
            (_, _, 1) => o.copy_from_slice(y),
            _ => o.fill(y0),
        }
    });
}

fn select_typed<T: Elem>(
    bc: &Broadcast<3>,
    ins: &[&Tensor],
    out: &mut Tensor,
    r: Range<usize>,
) -> Result<()> {
    let c = typed::<bool>(&ins[0].data)?;
    let (x, y) = (typed::<T>(&ins[1].data)?, typed::<T>(&ins[2].data)?);
    let o = &mut typed_mut::<T>(&mut out.data)?[r.clone()];
    select_broadcast(bc, c, x, y, o, r);
    Ok(())
}

impl Op for Where {
    fn name(&self) -> &'static str {
        "Where"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let [c, x, y] = ins else {
            return Err(OpError::Invalid(format!(
                "Where takes 3 inputs, got {}",
                ins.len()
            )));
        };
        if c.dtype != DType::Bool {
            return Err(OpError::Invalid(format!(
                "Where: condition must be bool, got {}",
                c.dtype
            )));
        }
        if x.dtype != y.dtype {
            return Err(OpError::Invalid(format!(
                "Where: X and Y types differ ({} and {})",
                x.dtype, y.dtype
            )));
        }
        let out = shape::broadcast_shapes(&[&c.shape, &x.shape, &y.shape])?;
        Ok(vec![TensorMeta::new(x.dtype, out)])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        last_axis(outs)
    }

    fn row_local(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Vec<usize> {
        crate::op::same_shape_inputs(ins, outs)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        if ins.len() != 3 {
            return Err(OpError::Invalid(format!(
                "Where takes 3 inputs, got {}",
                ins.len()
            )));
        }
        let out = &mut outs[0];
        let numel = out.numel();
        check_rows(&rows, numel, "Where")?;
        let r = element_range(&rows, numel);
        if r.is_empty() {
            return Ok(());
        }
        let bc = Broadcast::new([&ins[0].shape, &ins[1].shape, &ins[2].shape], &out.shape);
        match out.dtype() {
            DType::F32 => select_typed::<f32>(&bc, ins, out, r),
            DType::F16 => select_typed::<f16>(&bc, ins, out, r),
            DType::F64 => select_typed::<f64>(&bc, ins, out, r),
            DType::I64 => select_typed::<i64>(&bc, ins, out, r),
            DType::I32 => select_typed::<i32>(&bc, ins, out, r),
            DType::I8 => select_typed::<i8>(&bc, ins, out, r),
            DType::U8 => select_typed::<u8>(&bc, ins, out, r),
            DType::Bool => select_typed::<bool>(&bc, ins, out, r),
        }
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let out = &outs[0];
        let (start, count) = gpu_range(&rows, out.numel(), "Where")?;
        let (rank, dims, [c_st, x_st, y_st]) = gpu_broadcast(
            [&ins[0].shape, &ins[1].shape, &ins[2].shape],
            &out.shape,
            "Where",
        )?;
        let p = WhereParams {
            start,
            count,
            _pad: [0; 2],
            dims,
            c_strides: c_st,
            x_strides: x_st,
            y_strides: y_st,
        };
        let k = GpuKernel::new(
            tandem_shaders::WHERE,
            vec![0, 1, 2],
            vec![0],
            &p,
            shape::grid_1d(count as u64, 64),
        )
        .with_override("WG", 64.0)
        .with_override("RANK", rank as f64);
        Ok(vec![k])
    }
}

/// ONNX `Where`.
pub fn where_op(_: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(Where))
}

#[cfg(test)]
#[allow(clippy::cloned_ref_to_slice_refs)]
mod tests {
    use super::*;
    use crate::Data;

    fn run(ins: &[Tensor], rows: Option<Range<usize>>) -> Tensor {
        let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let om = Where.infer(&refs).unwrap();
        let mut outs = vec![Tensor::zeros(om[0].dtype, &om[0].shape)];
        let n = om[0].numel();
        let ins: Vec<&Tensor> = ins.iter().collect();
        Where
            .cpu(&ins, &mut outs, rows.unwrap_or(0..n.max(1)))
            .unwrap();
        outs.remove(0)
    }

    /// Naive reference: full index decomposition for each output element.
    fn naive(
        c: &Tensor,
        x: &[f32],
        xs: &[usize],
        y: &[f32],
        ys: &[usize],
        out: &[usize],
    ) -> Vec<f32> {
        let at = |shape: &[usize], idx: &[usize]| -> usize {
            let off = idx.len() - shape.len();
            let mut flat = 0;
            for (d, &n) in shape.iter().enumerate() {
                flat = flat * n + if n == 1 { 0 } else { idx[off + d] };
            }
            flat
        };
        let Data::Bool(cv) = &c.data else { panic!() };
        (0..shape::numel(out))
            .map(|mut i| {
                let mut idx = vec![0; out.len()];
                for d in (0..out.len()).rev() {
                    idx[d] = i % out[d];
                    i /= out[d];
                }
                if cv[at(&c.shape, &idx)] {
                    x[at(xs, &idx)]
                } else {
                    y[at(ys, &idx)]
                }
            })
            .collect()
    }

    #[test]
    fn three_way_broadcast_matches_naive() {
        let c = Tensor::new(
            vec![2, 1, 5],
            Data::Bool((0..10).map(|i| i % 3 != 0).collect()),
        );
        let x: Vec<f32> = (0..4 * 5).map(|i| i as f32).collect();
        let y: Vec<f32> = (0..3).map(|i| -(i as f32) - 1.0).collect();
        let got = run(
            &[
                c.clone(),
                Tensor::f32(&[4, 5], x.clone()),
                Tensor::f32(&[3, 1, 1, 1], y.clone()),
            ],
            None,
        );
        let want = naive(&c, &x, &[4, 5], &y, &[3, 1, 1, 1], &[3, 2, 4, 5]);
        assert_eq!(got.shape, vec![3, 2, 4, 5]);
        assert_eq!(got.as_f32().unwrap(), &want[..]);
    }

    /// Every mix of operands that advance along the output row and operands fixed along it
    /// (shape `[2, 5]` or `[2, 1]` each), against the definition; the fixed condition is true
    /// in one row and false in the other.
    #[test]
    fn each_operand_advancing_or_fixed_along_a_row() {
        for bits in 0..8 {
            let dims = |bit: usize| -> Vec<usize> { vec![2, if bits & bit != 0 { 5 } else { 1 }] };
            let (cs, xs, ys) = (dims(1), dims(2), dims(4));
            let c = Tensor::new(
                cs.clone(),
                Data::Bool((0..shape::numel(&cs)).map(|i| i % 3 != 1).collect()),
            );
            let x: Vec<f32> = (0..shape::numel(&xs)).map(|i| i as f32).collect();
            let y: Vec<f32> = (0..shape::numel(&ys)).map(|i| -(i as f32) - 1.0).collect();
            let out = if bits == 0 { vec![2, 1] } else { vec![2, 5] };
            let got = run(
                &[
                    c.clone(),
                    Tensor::f32(&xs, x.clone()),
                    Tensor::f32(&ys, y.clone()),
                ],
                None,
            );
            let want = naive(&c, &x, &xs, &y, &ys, &out);
            assert_eq!(
                got.as_f32().unwrap(),
                &want[..],
                "c {cs:?} x {xs:?} y {ys:?}"
            );
        }
    }

    #[test]
    fn row_range_and_other_types() {
        let c = Tensor::new(vec![4], Data::Bool(vec![true, false, true, false]));
        let x = Tensor::i64(&[4], vec![1, 2, 3, 4]);
        let y = Tensor::i64(&[1], vec![-9]);
        let got = run(&[c.clone(), x, y], Some(1..3));
        assert_eq!(got.data, Data::I64(vec![0, -9, 3, 0]));
        let xb = Tensor::new(vec![], Data::Bool(vec![true]));
        let yb = Tensor::new(vec![4], Data::Bool(vec![false; 4]));
        assert_eq!(
            run(&[c.clone(), xb, yb], None).data,
            Data::Bool(vec![true, false, true, false])
        );
        // Large, contiguous: the parallel fast path.
        let n = 100_003;
        let c = Tensor::new(vec![n], Data::Bool((0..n).map(|i| i % 7 < 3).collect()));
        let x = Tensor::f32(&[n], (0..n).map(|i| i as f32).collect());
        let y = Tensor::f32(&[n], vec![-1.0; n]);
        let got = run(&[c, x, y], None);
        for (i, v) in got.as_f32().unwrap().iter().enumerate() {
            assert_eq!(*v, if i % 7 < 3 { i as f32 } else { -1.0 });
        }
        // Empty output.
        let c = Tensor::new(vec![0], Data::Bool(vec![]));
        let got = run(
            &[
                c,
                Tensor::f32(&[1], vec![1.0]),
                Tensor::f32(&[1], vec![2.0]),
            ],
            None,
        );
        assert_eq!(got.shape, vec![0]);
    }

    #[test]
    fn rejects_bad_inputs() {
        let f = TensorMeta::new(DType::F32, vec![2]);
        let b = TensorMeta::new(DType::Bool, vec![2]);
        let i = TensorMeta::new(DType::I64, vec![2]);
        assert!(Where.infer(&[&f, &f, &f]).is_err());
        assert!(Where.infer(&[&b, &f, &i]).is_err());
        assert!(Where.infer(&[&b, &f]).is_err());
        let bad = TensorMeta::new(DType::F32, vec![3]);
        assert!(Where.infer(&[&b, &f, &bad]).is_err());
        let k = Where.gpu(&[&b, &f, &f], &[f.clone()], 0..2).unwrap();
        assert_eq!(k[0].inputs, vec![0, 1, 2]);
    }
}
