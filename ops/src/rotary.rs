//! Rotary: tandem's one-node form of the rotate-half rotary position embedding that Llama-style
//! exports spell as seven nodes, `Add(Mul(x, cos), Mul(Concat(Neg(x[.., h:e]), x[.., 0:h]),
//! sin))` with both Slices on the last axis (the runtime's fusion pass, `fuse/rotary.rs`, builds
//! it; it is not an ONNX op type). One pass over the output instead of seven kernels and six
//! intermediates.
//!
//! Semantics are the chain's exactly, Slice's clamping included: with `D` the last dim of `x`,
//! `h' = min(h, D)` and `e >= D` (checked), the rotated row is `rot[j] = -x[j + h']` for
//! `j < D - h'` and `x[j - (D - h')]` after, and `out = x * cos + rot * sin` with numpy
//! broadcasting of `x`, `cos` and `sin` (the Muls' and the Add's), in the chain's operation
//! order, so the result is the chain's to the bit.
//!
//! Sits between the fusion pass and the broadcasting helpers of `elementwise_common.rs`: rows
//! of the output's last axis are broadcast over the leading dims, the last axis is walked here.
//! On the GPU: `rotary.wgsl` (f32).

use crate::elementwise_common::{
    check_rows, element_range, gpu_dims, gpu_range, last_axis, typed, typed_mut, Broadcast, GpuDims,
};
use crate::{shape, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use half::f16;
use std::ops::{Add, Mul, Neg, Range};

/// `out = x * cos + rotate(x, h) * sin` (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Rotary {
    /// Where the chain's second Slice starts (and its first ends), before clamping to `D`.
    pub half: usize,
    /// Where the second Slice ends (clamped to `D`; must reach it).
    pub end: usize,
    /// `Some(perm)` when x is given in storage order and the chain reads `Transpose(x, perm)`
    /// (the fusion pass folds a head split's Transpose this way); the perm keeps the last axis
    /// last, so a row of x stays contiguous.
    pub perm: Option<Vec<usize>>,
}

/// GPU parameters of `rotary.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RotaryParams {
    start: u32,
    count: u32,
    /// The output's last dim, `x`'s (D) and the clamped split `h'`.
    row: u32,
    d: u32,
    half: u32,
    /// 1 where `cos`'s and `sin`'s last dims advance along the output's last axis, else 0.
    cos_step: u32,
    sin_step: u32,
    _pad: u32,
    /// The merged dims of the output's leading axes and each input's row offset per step of
    /// them (in elements); their count is the override `RANK`.
    dims: GpuDims,
    x_strides: GpuDims,
    cos_strides: GpuDims,
    sin_strides: GpuDims,
}

/// Shapes of one application: the output's, per input the element stride of each of the
/// output's leading axes (0 where broadcast) and its last dim (a rank-0 table: 1).
struct Rows {
    out: Vec<usize>,
    strides: [Vec<usize>; 3],
    last: [usize; 3],
}

impl Rotary {
    /// x's shape as the chain reads it and the element stride of each of its dims.
    fn x_read(&self, stored: &[usize]) -> Result<(Vec<usize>, Vec<usize>)> {
        let read = shape::permuted(stored, self.perm.as_deref(), "Rotary")?;
        match &self.perm {
            Some(perm) if perm.last() != Some(&(stored.len() - 1)) => Err(OpError::Unsupported(
                format!("Rotary: x read through {perm:?}, which moves its last axis"),
            )),
            _ => Ok(read),
        }
    }

    fn rows(&self, ins: [&[usize]; 3]) -> Result<Rows> {
        if ins[0].is_empty() {
            return Err(OpError::Invalid(
                "Rotary: x must have rank >= 1 (its Slices are on the last axis)".into(),
            ));
        }
        let (xs, x_st) = self.x_read(ins[0])?;
        let last = |s: &[usize]| s.last().copied().unwrap_or(1);
        let [d, cd, sd] = [&xs[..], ins[1], ins[2]].map(last);
        if self.end < d {
            return Err(OpError::Unsupported(format!(
                "Rotary: the rotated part ends at {} before the last dim {d} of x",
                self.end
            )));
        }
        // (x's last dim is then the output's, or 1 and broadcast along it)
        let out = shape::broadcast_shapes(&[&xs, ins[1], ins[2]])?;
        let lead = &out[..out.len() - 1];
        let x_lead = xs.len() - 1;
        let x_strides = (0..lead.len())
            .map(|a| match (a + x_lead).checked_sub(lead.len()) {
                Some(ax) if xs[ax] != 1 => x_st[ax],
                _ => 0,
            })
            .collect();
        let table = |s: &[usize], len: usize| {
            let s = &s[..s.len().saturating_sub(1)];
            let st = shape::broadcast_strides(s, lead);
            st.into_iter().map(|v| v * len).collect()
        };
        Ok(Rows {
            strides: [x_strides, table(ins[1], cd), table(ins[2], sd)],
            out,
            last: [d, cd, sd],
        })
    }
}

/// `rot(x_row)[j]` for the clamped split `h` of a row of `d` elements.
#[inline(always)]
fn rotated<T: Copy + Neg<Output = T>>(x: &[T], j: usize, h: usize) -> T {
    let d = x.len();
    if j < d - h {
        -x[j + h]
    } else {
        x[j - (d - h)]
    }
}

/// Output elements `r` of `out` (whose slice starts at element `r.start`).
fn apply<T>(rows: &Rows, half: usize, [x, cos, sin]: [&[T]; 3], out: &mut [T], r: Range<usize>)
where
    T: Copy + Send + Sync + Neg<Output = T> + Mul<Output = T> + Add<Output = T>,
{
    let row = rows.out[rows.out.len() - 1];
    let lead = &rows.out[..rows.out.len() - 1];
    let strides = &rows.strides;
    let [d, cd, sd] = rows.last;
    let h = half.min(d);
    let step = |len: usize| usize::from(len != 1);
    let (xs, cs, ss) = (step(d), step(cd), step(sd));
    // elements r of output row q, from r0 on within the row
    let one_row = |q: usize, dst: &mut [T], r0: usize| {
        let mut rem = q;
        let mut offs = [0usize; 3];
        for a in (0..lead.len()).rev() {
            let i = rem % lead[a];
            rem /= lead[a];
            for k in 0..3 {
                offs[k] += i * strides[k][a];
            }
        }
        let xr = &x[offs[0]..offs[0] + d];
        let (co, so) = (offs[1], offs[2]);
        if dst.len() == d && (xs, cs, ss) == (1, 1, 1) {
            // a whole row, every operand advancing: two branch-free loops that vectorize
            let (c, s) = (&cos[co..co + d], &sin[so..so + d]);
            let t = d - h;
            let (lo, hi) = dst.split_at_mut(t);
            let parts = [(lo, 0..t, h..d, true), (hi, t..d, 0..h, false)];
            for (o, own, other, negate) in parts {
                let (x0, c, s, x1) = (&xr[own.clone()], &c[own.clone()], &s[own], &xr[other]);
                for ((((o, &a), &c), &b), &s) in o.iter_mut().zip(x0).zip(c).zip(x1).zip(s) {
                    *o = a * c + if negate { -b } else { b } * s;
                }
            }
            return;
        }
        for (o, j) in dst.iter_mut().zip(r0..) {
            let xj = j * xs;
            *o = xr[xj] * cos[co + j * cs] + rotated(xr, xj, h) * sin[so + j * ss];
        }
    };
    let (q0, q1) = (r.start / row, r.end.div_ceil(row));
    let block = |q: usize, dst: &mut [T]| {
        let lo = (q * row).max(r.start);
        let hi = ((q + 1) * row).min(r.end);
        one_row(q, &mut dst[lo - r.start..hi - r.start], lo - q * row);
    };
    // rows wholly inside the range: first_full .. last_full
    let first_full = r.start.div_ceil(row);
    let last_full = r.end / row;
    if out.len() < 1 << 15 || last_full <= first_full {
        for q in q0..q1 {
            block(q, out);
        }
        return;
    }
    // whole rows in parallel; the range's partial first and last rows on this thread
    let (head, rest) = out.split_at_mut(first_full * row - r.start);
    let (body, _) = rest.split_at_mut((last_full - first_full) * row);
    if !head.is_empty() {
        one_row(q0, head, r.start - q0 * row);
    }
    crate::parallel::for_each_chunk_mut(body, row, |i, dst| one_row(first_full + i, dst, 0));
    if last_full * row < r.end {
        let tail_start = last_full * row - r.start;
        one_row(last_full, &mut out[tail_start..], 0);
    }
}

fn apply_typed<T>(
    rows: &Rows,
    half: usize,
    ins: &[&Tensor],
    out: &mut Tensor,
    r: Range<usize>,
) -> Result<()>
where
    T: crate::elementwise_common::Elem
        + Send
        + Sync
        + Neg<Output = T>
        + Mul<Output = T>
        + Add<Output = T>,
{
    let x = typed::<T>(&ins[0].data)?;
    let cos = typed::<T>(&ins[1].data)?;
    let sin = typed::<T>(&ins[2].data)?;
    let o = &mut typed_mut::<T>(&mut out.data)?[r.clone()];
    apply(rows, half, [x, cos, sin], o, r);
    Ok(())
}

/// x, cos and sin (metas or tensors).
fn three<'a, T>(ins: &[&'a T]) -> Result<[&'a T; 3]> {
    match ins {
        [x, c, s] => Ok([*x, *c, *s]),
        _ => Err(OpError::Invalid(format!(
            "Rotary takes 3 inputs (x, cos, sin), got {}",
            ins.len()
        ))),
    }
}

impl Op for Rotary {
    fn name(&self) -> &'static str {
        "Rotary"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let rows = self.rows(three(ins)?.map(|m| &m.shape[..]))?;
        let dt = ins[0].dtype;
        if ins.iter().any(|m| m.dtype != dt) {
            return Err(OpError::Invalid(format!(
                "Rotary: x, cos and sin differ in dtype ({}, {}, {})",
                ins[0].dtype, ins[1].dtype, ins[2].dtype
            )));
        }
        if !matches!(dt, DType::F32 | DType::F16 | DType::F64) {
            return Err(OpError::Unsupported(format!(
                "Rotary: dtype {dt} (floats only)"
            )));
        }
        Ok(vec![TensorMeta::new(dt, rows.out)])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        last_axis(outs)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let shape_rows = self.rows(three(ins)?.map(|t| &t.shape[..]))?;
        let out = &mut outs[0];
        let numel = out.numel();
        check_rows(&rows, numel, "Rotary")?;
        let r = element_range(&rows, numel);
        if r.is_empty() {
            return Ok(());
        }
        match out.dtype() {
            DType::F32 => apply_typed::<f32>(&shape_rows, self.half, ins, out, r),
            DType::F64 => apply_typed::<f64>(&shape_rows, self.half, ins, out, r),
            DType::F16 => apply_typed::<f16>(&shape_rows, self.half, ins, out, r),
            dt => Err(OpError::Unsupported(format!(
                "Rotary: dtype {dt} (floats only)"
            ))),
        }
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        if ins.iter().any(|m| m.dtype != DType::F32) {
            return Err(OpError::Unsupported(format!(
                "Rotary on GPU: dtype {} (f32 only)",
                ins[0].dtype
            )));
        }
        let sr = self.rows(three(ins)?.map(|m| &m.shape[..]))?;
        let out = &outs[0];
        let (start, count) = gpu_range(&rows, out.numel(), "Rotary")?;
        if ins.iter().any(|m| m.numel() > u32::MAX as usize) {
            return Err(OpError::Unsupported(
                "Rotary on GPU: more than 2^32 elements".into(),
            ));
        }
        let lead = &sr.out[..sr.out.len() - 1];
        let bc = Broadcast::from_strides(sr.strides.clone(), lead);
        let (rank, dims, strides) = gpu_dims(&bc, "Rotary")?;
        let [d, cd, sd] = sr.last;
        let [x_strides, cos_strides, sin_strides] = strides;
        let p = RotaryParams {
            start,
            count,
            row: sr.out[sr.out.len() - 1] as u32,
            d: d as u32,
            half: self.half.min(d) as u32,
            cos_step: u32::from(cd != 1),
            sin_step: u32::from(sd != 1),
            _pad: 0,
            dims,
            x_strides,
            cos_strides,
            sin_strides,
        };
        let k = GpuKernel::new(
            tandem_shaders::ROTARY,
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

#[cfg(test)]
#[path = "rotary_tests.rs"]
mod tests;
