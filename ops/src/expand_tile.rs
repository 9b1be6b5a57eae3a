//! Expand (broadcast to a shape) and Tile (repeat along each axis).
//!
//! Sits between the operator contract (`op.rs`) and the shared strided index map
//! (`movement.rs`, `index_map.wgsl`): Expand reads with stride 0 on broadcast axes, Tile reads
//! input index c mod in_dim. The shape / repeats input must be known at plan time.

use crate::movement::{cpu_metas, first_axis, index_map_cpu, index_map_gpu, plan_value, IndexMap};
use crate::shape::{broadcast_shapes, broadcast_strides, strides};
use crate::{Attrs, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use std::ops::Range;

/// Expand or Tile (the two differ only in how the map is built).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpandTile {
    tile: bool,
}

pub fn expand(_attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(ExpandTile { tile: false }))
}

/// Tile from opset 6 (`repeats` input).
pub fn tile(attrs: &Attrs) -> Result<Box<dyn Op>> {
    if attrs.opset < 6 {
        return Err(OpError::Unsupported(
            "Tile before opset 6 (tiles/axis inputs)".into(),
        ));
    }
    Ok(Box::new(ExpandTile { tile: true }))
}

impl ExpandTile {
    fn op(&self) -> &'static str {
        if self.tile {
            "Tile"
        } else {
            "Expand"
        }
    }

    fn map(&self, ins: &[&TensorMeta]) -> Result<IndexMap> {
        let op = self.op();
        let arg = ins
            .get(1)
            .ok_or_else(|| OpError::Invalid(format!("{op}: second input is missing")))?;
        let shape = &ins[0].shape;
        if self.tile {
            let reps = plan_value(op, "repeats", arg)?.to_i64_vec();
            if reps.len() != shape.len() || reps.iter().any(|&r| r < 0) {
                return Err(OpError::Invalid(format!(
                    "Tile: repeats {reps:?} must be {} non-negative values",
                    shape.len()
                )));
            }
            let dims: Vec<usize> = shape
                .iter()
                .zip(&reps)
                .map(|(&d, &r)| d * r as usize)
                .collect();
            let mut map = IndexMap::new(&dims, strides(shape));
            map.modulo = shape.clone();
            Ok(map)
        } else {
            let target = plan_value(op, "shape", arg)?.to_i64_vec();
            if target.iter().any(|&d| d < 0) {
                return Err(OpError::Invalid(format!(
                    "Expand: negative dim in shape {target:?}"
                )));
            }
            let target: Vec<usize> = target.iter().map(|&d| d as usize).collect();
            let dims = broadcast_shapes(&[shape, &target])?;
            Ok(IndexMap::new(&dims, broadcast_strides(shape, &dims)))
        }
    }
}

impl Op for ExpandTile {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        self.op()
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        Ok(vec![TensorMeta::new(ins[0].dtype, self.map(ins)?.dims)])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        first_axis(&outs[0])
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let metas = cpu_metas(ins);
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        index_map_cpu(self.op(), &self.map(&refs)?, ins[0], &mut outs[0], rows)
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        index_map_gpu(self.op(), &self.map(ins)?, ins, &outs[0], rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Data;

    fn run(op: &dyn Op, ins: &[Tensor], rows: Range<usize>) -> Tensor {
        let metas: Vec<TensorMeta> = ins
            .iter()
            .map(|t| TensorMeta::constant(t.clone()))
            .collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let m = op.infer(&refs).unwrap();
        let mut out = vec![Tensor::zeros(m[0].dtype, &m[0].shape)];
        let tins: Vec<&Tensor> = ins.iter().collect();
        op.cpu(&tins, &mut out, rows).unwrap();
        out.remove(0)
    }

    #[test]
    fn expand_broadcasts_both_ways() {
        let x = Tensor::f32(&[3, 1], vec![1.0, 2.0, 3.0]);
        let op = expand(&Attrs::new(13)).unwrap();
        let y = run(&*op, &[x.clone(), Tensor::i64(&[3], vec![2, 1, 2])], 0..2);
        assert_eq!(y.shape, vec![2, 3, 2]);
        let want: Vec<f32> = (0..12).map(|i| ((i / 2) % 3 + 1) as f32).collect();
        assert_eq!(y.data, Data::F32(want));
        let y = run(&*op, &[x, Tensor::i64(&[1], vec![1])], 0..3);
        assert_eq!(y.shape, vec![3, 1]);
    }

    #[test]
    fn tile_repeats_each_axis() {
        let x = Tensor::i64(&[2, 2], vec![1, 2, 3, 4]);
        let op = tile(&Attrs::new(13)).unwrap();
        let y = run(&*op, &[x, Tensor::i64(&[2], vec![2, 3])], 0..4);
        assert_eq!(y.shape, vec![4, 6]);
        let mut want = vec![];
        for r in 0..4 {
            for c in 0..6 {
                want.push([1, 2, 3, 4][(r % 2) * 2 + c % 2]);
            }
        }
        assert_eq!(y.data, Data::I64(want));
    }
}
