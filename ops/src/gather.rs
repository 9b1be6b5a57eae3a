//! Gather (take slices along an axis at given indices) and GatherElements (take single
//! elements along an axis, indices shaped like the output).
//!
//! Sits between the operator contract (`op.rs`) and its kernels: a generic CPU copy over any
//! element type (`movement::with_same_type`) and `gather.wgsl`. Indices are i64 or i32,
//! negative ones count from the end; an index out of range is `Invalid` on the CPU.

use crate::movement::{
    check_gpu_size, first_axis, for_each_chunk, pack8, row_elems, with_same_type, Elem,
    SameTypeKernel,
};
use crate::shape::{grid_1d, normalize_axis, strides};
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gather {
    axis: i64,
    elements: bool,
}

pub fn gather(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(Gather {
        axis: attrs.int("axis", 0)?,
        elements: false,
    }))
}

pub fn gather_elements(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(Gather {
        axis: attrs.int("axis", 0)?,
        elements: true,
    }))
}

/// Parameters of `gather.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct GatherParams {
    out_dims: [u32; 8],
    data_stride: [u32; 8],
    _pad: u32,
    rank: u32,
    axis: u32,
    axis_dim: u32,
    nidx: u32,
    inner: u32,
    start: u32,
    count: u32,
}

impl Gather {
    fn op(&self) -> &'static str {
        if self.elements {
            "GatherElements"
        } else {
            "Gather"
        }
    }

    fn axis(&self, data: &TensorMeta) -> Result<usize> {
        if data.rank() == 0 {
            return Err(OpError::Invalid(format!(
                "{}: data must have rank >= 1",
                self.op()
            )));
        }
        normalize_axis(self.axis, data.rank())
    }
}

/// Indices normalised to `0..dim`, or `Invalid` naming the first bad one.
fn fixed_indices(op: &str, t: &Tensor, dim: usize) -> Result<Vec<usize>> {
    if !matches!(t.dtype(), DType::I64 | DType::I32) {
        return Err(OpError::Invalid(format!(
            "{op}: indices must be int64 or int32, got {}",
            t.dtype()
        )));
    }
    (0..t.numel())
        .map(|i| {
            let v = t.data.get_i64(i);
            let f = if v < 0 { v + dim as i64 } else { v };
            if f < 0 || f >= dim as i64 {
                Err(OpError::Invalid(format!(
                    "{op}: index {v} is out of range for a dim of {dim}"
                )))
            } else {
                Ok(f as usize)
            }
        })
        .collect()
}

/// Gather over the output viewed as [outer, nidx, inner], elements `start..end`.
struct TakeSlices<'a> {
    idx: &'a [usize],
    axis_dim: usize,
    inner: usize,
    start: usize,
    end: usize,
}

impl SameTypeKernel for TakeSlices<'_> {
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
        let (n, inner) = (self.idx.len(), self.inner);
        let out = &mut out[self.start..self.end];
        let chunk = inner * (4096 / inner).max(1);
        for_each_chunk(out, chunk, |c, block| {
            let mut j = self.start + c * chunk;
            let mut k = 0;
            while k < block.len() {
                let e = j % inner;
                let row = j / inner;
                let (o, i) = (row / n, row % n);
                let len = (inner - e).min(block.len() - k);
                let s = (o * self.axis_dim + self.idx[i]) * inner + e;
                block[k..k + len].copy_from_slice(&ins[0][s..s + len]);
                k += len;
                j += len;
            }
        });
        Ok(())
    }
}

/// GatherElements: out[c] = data[c with c_axis = idx[c]], elements `start..end`.
struct TakeElements<'a> {
    idx: &'a [usize],
    out_dims: &'a [usize],
    data_strides: Vec<usize>,
    axis: usize,
    start: usize,
    end: usize,
}

impl SameTypeKernel for TakeElements<'_> {
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
        const CHUNK: usize = 4096;
        for_each_chunk(&mut out[self.start..self.end], CHUNK, |c, block| {
            for (t, o) in block.iter_mut().enumerate() {
                let v = self.start + c * CHUNK + t;
                let mut rem = v;
                let mut s = 0;
                for d in (0..self.out_dims.len()).rev() {
                    let c = rem % self.out_dims[d];
                    rem /= self.out_dims[d];
                    s += if d == self.axis { self.idx[v] } else { c } * self.data_strides[d];
                }
                *o = ins[0][s];
            }
        });
        Ok(())
    }
}

impl Op for Gather {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        self.op()
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let (data, idx) = (
            ins[0],
            ins.get(1).ok_or_else(|| {
                OpError::Invalid(format!("{}: input `indices` is missing", self.op()))
            })?,
        );
        let a = self.axis(data)?;
        let shape = if self.elements {
            if idx.rank() != data.rank() {
                return Err(OpError::Invalid(format!(
                    "GatherElements: indices rank {} differs from data rank {}",
                    idx.rank(),
                    data.rank()
                )));
            }
            // Off the axis, an index tensor larger than the data would read past it.
            if let Some(d) = (0..data.rank()).find(|&d| d != a && idx.shape[d] > data.shape[d]) {
                return Err(OpError::Invalid(format!(
                    "GatherElements: indices dim {d} is {} but data's is only {}",
                    idx.shape[d], data.shape[d]
                )));
            }
            idx.shape.clone()
        } else {
            let mut s = data.shape[..a].to_vec();
            s.extend_from_slice(&idx.shape);
            s.extend_from_slice(&data.shape[a + 1..]);
            s
        };
        Ok(vec![TensorMeta::new(data.dtype, shape)])
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
        let data = ins[0].meta();
        let a = self.axis(&data)?;
        let (start, end) = row_elems(&outs[0].shape, first_axis(&outs[0].meta()), &rows);
        if start >= end {
            return Ok(());
        }
        let idx = fixed_indices(self.op(), ins[1], data.shape[a])?;
        if self.elements {
            let k = TakeElements {
                idx: &idx,
                out_dims: &outs[0].shape.clone(),
                data_strides: strides(&data.shape),
                axis: a,
                start,
                end,
            };
            with_same_type(self.op(), &k, &[&ins[0].data], &mut outs[0].data)
        } else {
            let k = TakeSlices {
                idx: &idx,
                axis_dim: data.shape[a],
                inner: data.shape[a + 1..].iter().product::<usize>().max(1),
                start,
                end,
            };
            with_same_type(self.op(), &k, &[&ins[0].data], &mut outs[0].data)
        }
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let op = self.op();
        check_gpu_size(op, &[ins[0], ins[1], &outs[0]])?;
        let a = self.axis(ins[0])?;
        let (start, end) = row_elems(&outs[0].shape, first_axis(&outs[0]), &rows);
        if start >= end {
            return Ok(vec![]);
        }
        let out_dims: Vec<u32> = outs[0].shape.iter().map(|&d| d as u32).collect();
        let st: Vec<u32> = strides(&ins[0].shape).iter().map(|&d| d as u32).collect();
        let p = GatherParams {
            out_dims: if self.elements {
                pack8(op, &out_dims)?
            } else {
                [0; 8]
            },
            data_stride: if self.elements {
                pack8(op, &st)?
            } else {
                [0; 8]
            },
            _pad: 0,
            rank: outs[0].rank() as u32,
            axis: a as u32,
            axis_dim: ins[0].shape[a] as u32,
            nidx: ins[1].numel() as u32,
            inner: ins[0].shape[a + 1..].iter().product::<usize>().max(1) as u32,
            start: start as u32,
            count: (end - start) as u32,
        };
        Ok(vec![GpuKernel::new(
            tandem_shaders::GATHER,
            vec![0, 1],
            vec![0],
            &p,
            grid_1d((end - start) as u64, 64),
        )
        .with_override("WG", 64.0)
        // 0 Gather, 1 GatherElements.
        .with_override("OP", self.elements as u32 as f64)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttrValue, Data};

    fn run(op: &dyn Op, ins: &[Tensor], rows: Range<usize>) -> Result<Tensor> {
        let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let m = op.infer(&refs)?;
        let mut out = vec![Tensor::zeros(m[0].dtype, &m[0].shape)];
        let t: Vec<&Tensor> = ins.iter().collect();
        op.cpu(&t, &mut out, rows)?;
        Ok(out.remove(0))
    }

    #[test]
    fn gather_axis1_negative_and_scalar_indices() {
        // data[i][j][k] = 100 i + 10 j + k, shape [2, 3, 2]
        let data: Vec<f32> = (0..12)
            .map(|v| (100 * (v / 6) + 10 * ((v / 2) % 3) + v % 2) as f32)
            .collect();
        let x = Tensor::f32(&[2, 3, 2], data);
        let op = gather(&Attrs::new(13).with("axis", AttrValue::Int(1))).unwrap();
        let idx = Tensor::new(vec![2], Data::I32(vec![-1, 0]));
        let y = run(&*op, &[x.clone(), idx], 0..2).unwrap();
        assert_eq!(y.shape, vec![2, 2, 2]);
        assert_eq!(
            y.data,
            Data::F32(vec![20.0, 21.0, 0.0, 1.0, 120.0, 121.0, 100.0, 101.0])
        );
        let y = run(&*op, &[x.clone(), Tensor::i64(&[], vec![2])], 1..2).unwrap();
        assert_eq!(y.shape, vec![2, 2]);
        assert_eq!(y.data, Data::F32(vec![0.0, 0.0, 120.0, 121.0]));
        assert!(run(&*op, &[x, Tensor::i64(&[1], vec![3])], 0..2).is_err());
    }

    #[test]
    fn gather_elements_matches_spec_example() {
        // ONNX spec example: data [[1,2],[3,4]], indices [[0,0],[1,0]], axis 1 -> [[1,1],[4,3]]
        let x = Tensor::i64(&[2, 2], vec![1, 2, 3, 4]);
        let op = gather_elements(&Attrs::new(13).with("axis", AttrValue::Int(1))).unwrap();
        let y = run(
            &*op,
            &[x.clone(), Tensor::i64(&[2, 2], vec![0, 0, 1, 0])],
            0..2,
        )
        .unwrap();
        assert_eq!(y.data, Data::I64(vec![1, 1, 4, 3]));
        // axis 0 with a negative index: [[ -1, 0 ]] -> [[3, 2]]
        let op0 = gather_elements(&Attrs::new(13)).unwrap();
        let y = run(&*op0, &[x, Tensor::i64(&[1, 2], vec![-1, 0])], 0..1).unwrap();
        assert_eq!(y.data, Data::I64(vec![3, 2]));
    }
}
