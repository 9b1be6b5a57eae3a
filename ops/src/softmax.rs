//! Softmax and LogSoftmax.
//!
//! Sits between the operator contract (`op.rs`) and `softmax.wgsl`. The input is viewed as
//! `[outer, n, inner]`: opset >= 13 normalises over the single axis `axis` (default -1); opset
//! < 13 coerces the input to 2-D `[prod(..axis), prod(axis..)]` (default axis 1) and normalises
//! over the second dimension. Rows are the `outer` blocks (split axis `axis - 1`), each a
//! contiguous block holding whole softmax lanes. Numerically stable: the lane maximum is
//! subtracted before exponentiation.

use crate::shape::{grid_1d, normalize_axis};
use crate::unary::exp_f32;
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use rayon::prelude::*;
use std::ops::Range;

/// Fewest elements a parallel task of the CPU kernel gets.
const PAR_MIN: usize = 8192;

/// What a lane turns into. The discriminant is `mode` in `softmax.wgsl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Softmax = 0,
    Log = 1,
    /// Hardmax: 1 at the first maximum of the lane, 0 elsewhere.
    Hard = 2,
}

/// Softmax, LogSoftmax or Hardmax along one axis.
#[derive(Debug)]
struct Softmax {
    name: &'static str,
    mode: Mode,
    axis: i64,
    /// Opset < 13: the input is coerced to 2-D at `axis`.
    coerce_2d: bool,
}

fn make(a: &Attrs, name: &'static str, mode: Mode) -> Result<Box<dyn Op>> {
    let coerce_2d = a.opset < 13;
    Ok(Box::new(Softmax {
        name,
        mode,
        axis: a.int("axis", if coerce_2d { 1 } else { -1 })?,
        coerce_2d,
    }))
}

/// Softmax: `exp(x - max) / sum(exp(x - max))` along `axis`.
pub fn softmax(a: &Attrs) -> Result<Box<dyn Op>> {
    make(a, "Softmax", Mode::Softmax)
}

/// LogSoftmax: `x - max - ln(sum(exp(x - max)))` along `axis`.
pub fn log_softmax(a: &Attrs) -> Result<Box<dyn Op>> {
    make(a, "LogSoftmax", Mode::Log)
}

/// Whether `op` is a Softmax (not Log- or Hardmax) over the last axis of an input of `rank`
/// (the runtime's attention fusion asks, with the rank the declared shapes give).
pub fn is_softmax_over_last_axis(op: &dyn Op, rank: usize) -> bool {
    let Some(s) = op.as_any().and_then(|a| a.downcast_ref::<Softmax>()) else {
        return false;
    };
    s.mode == Mode::Softmax && rank >= 1 && (s.axis == -1 || s.axis == rank as i64 - 1)
}

/// Hardmax: 1 at the first maximum along `axis`, 0 elsewhere (same axis rules as Softmax).
pub fn hardmax(a: &Attrs) -> Result<Box<dyn Op>> {
    make(a, "Hardmax", Mode::Hard)
}

impl Softmax {
    /// The normalised axis and `(outer, n, inner)`.
    fn geometry(&self, shape: &[usize]) -> Result<(usize, [usize; 3])> {
        let rank = shape.len();
        let a = if self.coerce_2d && (self.axis == rank as i64) {
            rank
        } else {
            normalize_axis(self.axis, rank)
                .map_err(|e| OpError::Invalid(format!("{}: {e}", self.name)))?
        };
        if rank == 0 {
            return Err(OpError::Invalid(format!(
                "{}: input must have rank >= 1",
                self.name
            )));
        }
        let outer = shape[..a].iter().product();
        let geom = if self.coerce_2d {
            [outer, shape[a..].iter().product(), 1]
        } else {
            [outer, shape[a], shape[a + 1..].iter().product()]
        };
        Ok((a, geom))
    }
}

impl Op for Softmax {
    fn name(&self) -> &'static str {
        self.name
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        if ins.len() != 1 {
            return Err(OpError::Invalid(format!(
                "{} takes 1 input, got {}",
                self.name,
                ins.len()
            )));
        }
        if ins[0].dtype != DType::F32 {
            return Err(OpError::Unsupported(format!(
                "{}: dtype {} (f32 only)",
                self.name, ins[0].dtype
            )));
        }
        self.geometry(&ins[0].shape)?;
        Ok(vec![TensorMeta::new(DType::F32, ins[0].shape.clone())])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        Work {
            flops: 4 * ins[0].numel() as u64,
            bytes_read: ins[0].bytes(),
            bytes_written: outs[0].bytes(),
        }
    }

    fn split_axis(&self, ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        match self.geometry(&ins[0].shape) {
            Ok((a, _)) if a >= 1 => Some(a - 1),
            _ => None,
        }
    }

    /// Each outer row normalises only its own elements.
    fn row_local(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Vec<usize> {
        match self.split_axis(ins, outs) {
            Some(_) => crate::op::same_shape_inputs(&ins[..1], outs),
            None => Vec::new(),
        }
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let (_, [_, n, inner]) = self.geometry(&ins[0].shape)?;
        let x = ins[0]
            .as_f32()
            .ok_or_else(|| OpError::Unsupported(format!("{}: f32 input only", self.name)))?;
        let y = outs[0]
            .as_f32_mut()
            .ok_or_else(|| OpError::Invalid(format!("{}: output must be f32", self.name)))?;
        let block = n * inner;
        if block == 0 {
            return Ok(());
        }
        let x = &x[rows.start * block..rows.end * block];
        let y = &mut y[rows.start * block..rows.end * block];
        let mode = self.mode;
        // At least PAR_MIN elements per task: a small softmax (a decode step's few heads) runs
        // on the calling thread instead of waking another worker for a microsecond of work.
        let (len, log) = match (mode, inner) {
            (Mode::Hard, _) => (block, false),
            (_, 1) => (n, mode == Mode::Log),
            _ => (block, mode == Mode::Log),
        };
        let one = |(y, x): (&mut [f32], &[f32])| match (mode, inner) {
            (Mode::Hard, _) => hard_lanes(x, y, n, inner),
            (_, 1) => lane(x, y, log),
            _ => strided_lanes(x, y, n, inner, log),
        };
        if crate::parallel::serial() {
            y.chunks_mut(len).zip(x.chunks(len)).for_each(one);
        } else {
            y.par_chunks_mut(len)
                .zip(x.par_chunks(len))
                .with_min_len(PAR_MIN.div_ceil(len.max(1)))
                .for_each(one);
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let (_, [_, n, inner]) = self.geometry(&ins[0].shape)?;
        let lanes = rows.len() * inner;
        if lanes == 0 || n == 0 {
            return Ok(Vec::new());
        }
        let fits = |v: usize| {
            u32::try_from(v).map_err(|_| {
                OpError::Unsupported(format!("{} on GPU: size {v} exceeds u32", self.name))
            })
        };
        fits(rows.end * n * inner)?;
        let p = SoftmaxParams {
            n: fits(n)?,
            inner: fits(inner)?,
            first_lane: fits(rows.start * inner)?,
            lanes: fits(lanes)?,
        };
        let wg = grid_1d(lanes as u64, 64);
        Ok(vec![GpuKernel::new(
            tandem_shaders::SOFTMAX,
            vec![0],
            vec![0],
            &p,
            wg,
        )
        // 0 Softmax, 1 LogSoftmax, 2 Hardmax.
        .with_override("MODE", self.mode as u32 as f64)])
    }
}

/// `softmax.wgsl` parameters.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SoftmaxParams {
    n: u32,
    inner: u32,
    first_lane: u32,
    lanes: u32,
}

/// Hardmax of `inner` interleaved lanes of length `n`: 1 at the first maximum of each.
fn hard_lanes(x: &[f32], y: &mut [f32], n: usize, inner: usize) {
    y.iter_mut().for_each(|y| *y = 0.0);
    for j in 0..inner {
        let mut at = 0;
        for k in 1..n {
            if x[k * inner + j] > x[at * inner + j] {
                at = k;
            }
        }
        y[at * inner + j] = 1.0;
    }
}

crate::simd::kernel! {
    /// One contiguous lane, on the widest vectors the CPU has (`crate::simd`).
    pub(crate) fn lane(x: &[f32], y: &mut [f32], log: bool) {
        // No shift fix-up for an infinite max: a lane with +inf (or only -inf) is all NaN, as in
        // onnxruntime (README.md, "Numerics"); a NaN anywhere makes the sum NaN. The max over 16
        // partial maxima (f32::max ignores NaN, so the order does not matter).
        let mut pm = [f32::NEG_INFINITY; 16];
        let xc = x.chunks_exact(16);
        let mut m = xc.remainder().iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        for c in xc {
            for l in 0..16 {
                pm[l] = pm[l].max(c[l]);
            }
        }
        m = pm.iter().fold(m, |m, &v| m.max(v));
        // e^(x - m) into y first (a loop that vectorises: `exp_f32` has no libm call), then the
        // sum over 16 partial sums.
        for (y, &v) in y.iter_mut().zip(x) {
            *y = exp_f32(v - m);
        }
        let mut part = [0.0f32; 16];
        let chunks = y.chunks_exact(16);
        let tail: f32 = chunks.remainder().iter().sum();
        for c in chunks {
            for l in 0..16 {
                part[l] += c[l];
            }
        }
        let s = part.iter().sum::<f32>() + tail;
        if log {
            // (v - m) - ln(s): `v - (m + ln(s))` lost ln(s) beside a max of 3e38
            let c = s.ln();
            for (y, &v) in y.iter_mut().zip(x) {
                *y = (v - m) - c;
            }
        } else {
            let r = 1.0 / s;
            y.iter_mut().for_each(|y| *y *= r);
        }
    }
}

crate::simd::kernel! {
    /// `inner` interleaved lanes of length `n` (element `k` of lane `j` at `k * inner + j`),
    /// processed row by row so every pass reads contiguously; widest vectors (`crate::simd`).
    fn strided_lanes(x: &[f32], y: &mut [f32], n: usize, inner: usize, log: bool) {
        let mut m = vec![f32::NEG_INFINITY; inner];
        for row in x.chunks_exact(inner) {
            for (m, &v) in m.iter_mut().zip(row) {
                *m = m.max(v);
            }
        }
        let mut s = vec![0.0f32; inner];
        for (yr, xr) in y.chunks_exact_mut(inner).zip(x.chunks_exact(inner)) {
            for (((y, &v), &m), s) in yr.iter_mut().zip(xr).zip(&m).zip(s.iter_mut()) {
                let e = exp_f32(v - m);
                *y = e;
                *s += e;
            }
        }
        if log {
            let c: Vec<f32> = s.iter().map(|s| s.ln()).collect();
            for (yr, xr) in y.chunks_exact_mut(inner).zip(x.chunks_exact(inner)) {
                for (((y, &v), &m), &c) in yr.iter_mut().zip(xr).zip(&m).zip(&c) {
                    *y = (v - m) - c;
                }
            }
        } else {
            s.iter_mut().for_each(|s| *s = 1.0 / *s);
            for yr in y.chunks_exact_mut(inner) {
                for (y, r) in yr.iter_mut().zip(&s) {
                    *y *= r;
                }
            }
        }
        debug_assert_eq!(x.len(), n * inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttrValue, Op};

    /// Naive softmax over axis `a` of a row-major tensor, in f64.
    fn naive(x: &[f32], shape: &[usize], a: usize, log: bool) -> Vec<f32> {
        let outer: usize = shape[..a].iter().product();
        let n = shape[a];
        let inner: usize = shape[a + 1..].iter().product();
        let mut y = vec![0.0; x.len()];
        for o in 0..outer {
            for j in 0..inner {
                let at = |k: usize| o * n * inner + k * inner + j;
                let m = (0..n).map(|k| x[at(k)] as f64).fold(f64::MIN, f64::max);
                let s: f64 = (0..n).map(|k| (x[at(k)] as f64 - m).exp()).sum();
                for k in 0..n {
                    let v = x[at(k)] as f64;
                    y[at(k)] = if log {
                        v - m - s.ln()
                    } else {
                        (v - m).exp() / s
                    } as f32;
                }
            }
        }
        y
    }

    fn data(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.7)
            .collect()
    }

    fn run(op: &dyn Op, x: &Tensor, rows: Option<Range<usize>>) -> Tensor {
        let m = x.meta();
        let outs_m = op.infer(&[&m]).unwrap();
        let mut out = vec![Tensor::zeros(outs_m[0].dtype, &outs_m[0].shape)];
        let axis = op.split_axis(&[&m], &outs_m);
        let all = 0..crate::shape::row_count(&outs_m[0].shape, axis);
        match rows {
            Some(r) => {
                op.cpu(&[x], &mut out, all.start..r.start).unwrap();
                op.cpu(&[x], &mut out, r.start..all.end).unwrap();
            }
            None => op.cpu(&[x], &mut out, all).unwrap(),
        }
        out.remove(0)
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs(), "at {i}: {x} vs {y}");
        }
    }

    #[test]
    fn softmax_matches_naive_on_every_axis_and_split() {
        let shape = [3, 5, 7];
        let x = Tensor::f32(&shape, data(105));
        for log in [false, true] {
            for axis in [-1i64, 1, 0] {
                let a = Attrs::new(13).with("axis", AttrValue::Int(axis));
                let op = if log { log_softmax(&a) } else { softmax(&a) }.unwrap();
                let want = naive(
                    x.as_f32().unwrap(),
                    &shape,
                    axis.rem_euclid(3) as usize,
                    log,
                );
                close(run(&*op, &x, None).as_f32().unwrap(), &want);
                if axis != 0 {
                    close(run(&*op, &x, Some(1..2)).as_f32().unwrap(), &want);
                }
            }
        }
    }

    #[test]
    fn hardmax_marks_the_first_maximum() {
        let x = Tensor::f32(&[2, 3], vec![1., 3., 3., 0., -1., -2.]);
        let op = hardmax(&Attrs::new(13)).unwrap();
        assert_eq!(
            run(&*op, &x, Some(1..2)).as_f32().unwrap(),
            &[0., 1., 0., 1., 0., 0.]
        );
        let op = hardmax(&Attrs::new(13).with("axis", AttrValue::Int(0))).unwrap();
        assert_eq!(
            run(&*op, &x, None).as_f32().unwrap(),
            &[1., 1., 1., 0., 0., 0.]
        );
        // Opset 11, axis 0: one lane over all six elements.
        let op = hardmax(&Attrs::new(11).with("axis", AttrValue::Int(0))).unwrap();
        assert_eq!(
            run(&*op, &x, None).as_f32().unwrap(),
            &[0., 1., 0., 0., 0., 0.]
        );
    }

    #[test]
    fn legacy_opset_coerces_to_2d() {
        let shape = [2, 3, 4];
        let x = Tensor::f32(&shape, data(24));
        let op = softmax(&Attrs::new(11)).unwrap();
        // axis 1 -> [2, 12]: softmax over the last 12 elements of each batch.
        let want = naive(x.as_f32().unwrap(), &[2, 12], 1, false);
        close(run(&*op, &x, None).as_f32().unwrap(), &want);
    }

    #[test]
    fn large_values_stay_finite_and_rows_sum_to_one() {
        let x = Tensor::f32(&[1, 3], vec![1000.0, 1001.0, 1002.0]);
        let op = softmax(&Attrs::new(13)).unwrap();
        let y = run(&*op, &x, None);
        let y = y.as_f32().unwrap();
        // exp(-2), exp(-1), 1 normalised.
        let s = (-2f32).exp() + (-1f32).exp() + 1.0;
        close(y, &[(-2f32).exp() / s, (-1f32).exp() / s, 1.0 / s]);
    }

    /// A masked attention row (scores -1e9 where masked, the tiny Llama's fill) gives exact
    /// zeros there, never subnormals: the P @ V product after it reads them, and subnormal
    /// operands run at microcode-assist speed on Intel cores. Rows along the last axis and
    /// along axis 0 (the strided-lanes kernel).
    #[test]
    fn masked_entries_are_exact_zeros_not_subnormals() {
        let unmasked = [40, 3];
        let rows: Vec<Vec<f32>> = unmasked
            .iter()
            .map(|&u| {
                (0..64)
                    .map(|i| if i < u { (i % 7) as f32 * 0.3 } else { -1e9 })
                    .collect()
            })
            .collect();
        let by_rows = Tensor::f32(&[2, 64], rows.concat());
        let by_columns = Tensor::f32(&[64, 2], (0..128).map(|i| rows[i % 2][i / 2]).collect());
        for (x, axis) in [(by_rows, 1), (by_columns, 0)] {
            let op = softmax(&Attrs::new(13).with("axis", AttrValue::Int(axis))).unwrap();
            let y = run(&*op, &x, None);
            let y = y.as_f32().unwrap();
            assert!(
                y.iter().all(|v| *v == 0.0 || v.is_normal()),
                "axis {axis}: subnormal in {y:?}"
            );
            let zeros = y.iter().filter(|v| **v == 0.0).count();
            assert_eq!(zeros, 128 - 43, "axis {axis}");
        }
    }
}
