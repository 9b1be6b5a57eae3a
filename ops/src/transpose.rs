//! Transpose: permutes the axes of its input (`perm`, default reversed).
//!
//! Sits between the operator contract (`op.rs`) and the shared strided index map
//! (`movement.rs`, `index_map.wgsl`): output axis d walks input axis `perm[d]`.

use crate::movement::{first_axis, index_map_cpu, index_map_gpu, IndexMap};
use crate::shape::{distinct_axes, strides};
use crate::{Attrs, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use std::ops::Range;

/// Transpose with an optional explicit permutation.
#[derive(Debug, Clone, PartialEq)]
pub struct Transpose {
    perm: Option<Vec<i64>>,
}

/// Parses `perm` (validated against the rank at inference).
pub fn transpose(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(Transpose {
        perm: attrs.ints_opt("perm")?,
    }))
}

impl Transpose {
    /// The `perm` attribute when it is given and has no negative entry (whether it fits the
    /// input's rank is checked where it is applied).
    pub fn explicit_perm(&self) -> Option<Vec<usize>> {
        let p = self.perm.as_ref()?;
        p.iter().map(|&a| usize::try_from(a).ok()).collect()
    }

    fn perm(&self, rank: usize) -> Result<Vec<usize>> {
        let perm: Vec<usize> = match &self.perm {
            None => (0..rank).rev().collect(),
            Some(p) => match self.explicit_perm() {
                Some(perm) if distinct_axes(&perm, rank) => perm,
                _ => {
                    return Err(OpError::Invalid(format!(
                        "Transpose: perm {p:?} is not a permutation of 0..{rank}"
                    )))
                }
            },
        };
        if perm.len() != rank {
            return Err(OpError::Invalid(format!(
                "Transpose: perm {perm:?} has {} entries for rank {rank}",
                perm.len()
            )));
        }
        Ok(perm)
    }

    fn map(&self, in_shape: &[usize]) -> Result<(Vec<usize>, IndexMap)> {
        let perm = self.perm(in_shape.len())?;
        let st = strides(in_shape);
        let dims: Vec<usize> = perm.iter().map(|&p| in_shape[p]).collect();
        let map = IndexMap::new(&dims, perm.iter().map(|&p| st[p]).collect());
        Ok((dims, map))
    }
}

impl Op for Transpose {
    fn name(&self) -> &'static str {
        "Transpose"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let (dims, _) = self.map(&ins[0].shape)?;
        Ok(vec![TensorMeta::new(ins[0].dtype, dims)])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> crate::Work {
        crate::Work {
            flops: 0,
            bytes_read: ins[0].bytes(),
            bytes_written: outs[0].bytes(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        first_axis(&outs[0])
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let (_, map) = self.map(&ins[0].shape)?;
        index_map_cpu("Transpose", &map, ins[0], &mut outs[0], rows)
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let (_, map) = self.map(&ins[0].shape)?;
        index_map_gpu("Transpose", &map, ins, &outs[0], rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttrValue, Data};

    #[test]
    fn transpose_matches_nested_loops_on_any_row_range() {
        let (a, b, c) = (3, 4, 5);
        let x: Vec<f32> = (0..a * b * c).map(|v| v as f32).collect();
        let input = Tensor::f32(&[a, b, c], x.clone());
        let op = transpose(&Attrs::new(13).with("perm", AttrValue::Ints(vec![2, 0, 1]))).unwrap();
        let mut want = vec![0.0; a * b * c];
        for i in 0..a {
            for j in 0..b {
                for k in 0..c {
                    want[(k * a + i) * b + j] = x[(i * b + j) * c + k];
                }
            }
        }
        let m = op.infer(&[&input.meta()]).unwrap();
        assert_eq!(m[0].shape, vec![c, a, b]);
        let mut out = vec![Tensor::zeros(m[0].dtype, &m[0].shape)];
        op.cpu(&[&input], &mut out, 0..2).unwrap();
        op.cpu(&[&input], &mut out, 2..5).unwrap();
        assert_eq!(out[0].data, Data::F32(want));
        let rev = transpose(&Attrs::new(13)).unwrap();
        assert_eq!(rev.infer(&[&input.meta()]).unwrap()[0].shape, vec![c, b, a]);
        let bad = transpose(&Attrs::new(13).with("perm", AttrValue::Ints(vec![0, 0, 1]))).unwrap();
        assert!(bad.infer(&[&input.meta()]).is_err());
    }
}
