//! Per-channel normalisations of `[N, C, D...]` tensors: BatchNormalization (inference mode)
//! and LRN (local response normalisation across channels).
//!
//! Sits between the operator contract (`op.rs`) and `batchnorm.wgsl` / `lrn.wgsl`. Rows are cut
//! on the channel axis: a row is the spatial plane of one `(n, c)`.

use crate::conv::Activation;
use crate::shape::grid_1d;
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use std::ops::Range;

/// BatchNormalization in inference mode:
/// `Y = (X - mean[c]) / sqrt(var[c] + eps) * scale[c] + B[c]`.
#[derive(Debug, Clone)]
pub struct BatchNorm {
    eps: f32,
    /// Op types of the nodes a graph pass folded into scale and B (for reports).
    pub absorbed: Vec<String>,
    /// A Relu after it, taken in by a graph pass: `Y = max(Y, 0)`, NaN kept (as Relu does).
    pub relu: bool,
}

impl BatchNorm {
    /// The `epsilon` added to the variance (for passes that fold the op into a Conv).
    pub fn epsilon(&self) -> f32 {
        self.eps
    }
}

/// LRN: `y = x / (bias + alpha / size * square_sum)^beta`, with `square_sum` over the channels
/// `c - floor((size - 1) / 2) ..= c + ceil((size - 1) / 2)` that exist.
#[derive(Debug)]
struct Lrn {
    alpha: f32,
    beta: f32,
    bias: f32,
    size: usize,
}

/// BatchNormalization (epsilon default 1e-5; momentum ignored). `training_mode = 1` and the old
/// `spatial = 0` form are Unsupported.
pub fn batch_normalization(a: &Attrs) -> Result<Box<dyn Op>> {
    if a.int("training_mode", 0)? != 0 {
        return Err(OpError::Unsupported(
            "BatchNormalization: training_mode = 1 (inference only)".into(),
        ));
    }
    if a.int("spatial", 1)? == 0 {
        return Err(OpError::Unsupported(
            "BatchNormalization: spatial = 0 (per-activation statistics)".into(),
        ));
    }
    Ok(Box::new(BatchNorm {
        eps: a.float("epsilon", 1e-5)?,
        absorbed: Vec::new(),
        relu: false,
    }))
}

/// LRN (size required and positive; alpha 1e-4, beta 0.75, bias 1.0 by default).
pub fn lrn(a: &Attrs) -> Result<Box<dyn Op>> {
    let size = match a.int_opt("size")? {
        Some(s) if s >= 1 => s as usize,
        Some(s) => return Err(OpError::Invalid(format!("LRN: size must be >= 1, got {s}"))),
        None => return Err(OpError::Invalid("LRN: attribute `size` is required".into())),
    };
    Ok(Box::new(Lrn {
        alpha: a.float("alpha", 1e-4)?,
        beta: a.float("beta", 0.75)?,
        bias: a.float("bias", 1.0)?,
        size,
    }))
}

fn nc_shape(op: &str, x: &[usize]) -> Result<(usize, usize)> {
    if x.len() < 2 {
        return Err(OpError::Invalid(format!(
            "{op}: X must be [N, C, ...], got {x:?}"
        )));
    }
    Ok((x[1], x[2..].iter().product()))
}

fn f32_only(op: &str, ins: &[&TensorMeta]) -> Result<()> {
    match ins.iter().find(|m| m.dtype != DType::F32) {
        Some(m) => Err(OpError::Unsupported(format!(
            "{op}: dtype {} (f32 only)",
            m.dtype
        ))),
        None => Ok(()),
    }
}

/// Whole rows per parallel task, so tiny planes (`[N, C]` inputs) are not one task each.
fn rows_per_task(row_len: usize) -> usize {
    (4096 / row_len.max(1)).max(1)
}

fn data<'a>(op: &str, t: &'a Tensor) -> Result<&'a [f32]> {
    t.as_f32()
        .ok_or_else(|| OpError::Unsupported(format!("{op}: f32 only, got {}", t.dtype())))
}

impl Op for BatchNorm {
    fn name(&self) -> &'static str {
        "BatchNormalization"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        if ins.len() != 5 {
            return Err(OpError::Invalid(format!(
                "BatchNormalization takes 5 inputs, got {}",
                ins.len()
            )));
        }
        f32_only("BatchNormalization", ins)?;
        let (c, _) = nc_shape("BatchNormalization", &ins[0].shape)?;
        for (i, what) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
            if ins[i].numel() != c {
                return Err(OpError::Invalid(format!(
                    "BatchNormalization: {what} must hold C = {c} values, got shape {:?}",
                    ins[i].shape
                )));
            }
        }
        Ok(vec![TensorMeta::new(DType::F32, ins[0].shape.clone())])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        Work {
            flops: 2 * ins[0].numel() as u64,
            bytes_read: ins.iter().map(|m| m.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        Some(1)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let op = "BatchNormalization";
        let (c, n) = nc_shape(op, &ins[0].shape)?;
        let [x, scale, b, mean, var] = [0, 1, 2, 3, 4].map(|i| data(op, ins[i]));
        let (x, scale, b, mean, var) = (x?, scale?, b?, mean?, var?);
        let a: Vec<f32> = (0..c)
            .map(|i| scale[i] / (var[i] + self.eps).sqrt())
            .collect();
        let shift: Vec<f32> = (0..c).map(|i| b[i] - mean[i] * a[i]).collect();
        let y = outs[0]
            .as_f32_mut()
            .ok_or_else(|| OpError::Invalid(format!("{op}: output must be f32")))?;
        if n == 0 {
            return Ok(());
        }
        let y = &mut y[rows.start * n..rows.end * n];
        let x = &x[rows.start * n..rows.end * n];
        let per = rows_per_task(n);
        crate::parallel::for_each_chunk_mut(y, per * n, |t, yt| {
            let xt = &x[t * per * n..][..yt.len()];
            for (k, (yr, xr)) in yt.chunks_mut(n).zip(xt.chunks(n)).enumerate() {
                let ch = (rows.start + t * per + k) % c;
                let (m, s) = (a[ch], shift[ch]);
                if self.relu {
                    crate::simd::map(xr, yr, &|v: f32| Activation::Relu.apply(v * m + s));
                } else {
                    crate::simd::map(xr, yr, &|v: f32| v * m + s);
                }
            }
        });
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let (c, n) = nc_shape("BatchNormalization", &ins[0].shape)?;
        let range = rows.start * n..rows.end * n;
        if range.is_empty() {
            return Ok(Vec::new());
        }
        if range.end > u32::MAX as usize {
            return Err(OpError::Unsupported(
                "BatchNormalization on GPU: over 2^32 elements".into(),
            ));
        }
        let p = ChannelParams {
            start: range.start as u32,
            count: range.len() as u32,
            channels: c as u32,
            plane: n as u32,
            eps: self.eps,
            relu: self.relu as u32,
            ..bytemuck::Zeroable::zeroed()
        };
        let wg = grid_1d(range.len() as u64, 64);
        Ok(vec![GpuKernel::new(
            tandem_shaders::BATCHNORM,
            vec![0, 1, 2, 3, 4],
            vec![0],
            &p,
            wg,
        )])
    }
}

/// `batchnorm.wgsl` and `lrn.wgsl` parameters: elements `start..start + count` of a
/// `[N, channels, plane]` tensor.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ChannelParams {
    start: u32,
    count: u32,
    channels: u32,
    plane: u32,
    eps: f32,
    /// LRN: `alpha / size`.
    alpha_over_size: f32,
    beta: f32,
    bias: f32,
    /// LRN window: channels `c - before ..= c + after`.
    before: u32,
    after: u32,
    /// BatchNormalization: 1 applies the Relu it took in.
    relu: u32,
    _pad: u32,
}

impl Lrn {
    fn window(&self) -> (usize, usize) {
        ((self.size - 1) / 2, self.size / 2)
    }
}

crate::simd::kernel! {
    /// `acc[i] += x[i] * x[i]`; equal lengths. Widest vectors (`crate::simd`).
    fn add_squares(acc: &mut [f32], x: &[f32]) {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += v * v;
        }
    }
}

crate::simd::kernel! {
    /// `y[i] = x[i] / (bias + k * y[i])^beta` (`y` holds the square sums on entry). The usual
    /// beta 0.75 is `sqrt(b) * sqrt(sqrt(b))` and 0.5 / 1 are exact too, so those loops
    /// vectorise (IEEE sqrt, within 2 ulp of powf); other betas call powf.
    fn lrn_scale(y: &mut [f32], x: &[f32], bias: f32, k: f32, beta: f32) {
        let it = y.iter_mut().zip(x);
        if beta == 0.75 {
            it.for_each(|(o, &v)| {
                let r = (bias + k * *o).sqrt();
                *o = v / (r * r.sqrt());
            });
        } else if beta == 0.5 {
            it.for_each(|(o, &v)| *o = v / (bias + k * *o).sqrt());
        } else if beta == 1.0 {
            it.for_each(|(o, &v)| *o = v / (bias + k * *o));
        } else {
            it.for_each(|(o, &v)| *o = v / (bias + k * *o).powf(beta));
        }
    }
}

impl Op for Lrn {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "LRN"
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        if ins.len() != 1 {
            return Err(OpError::Invalid(format!(
                "LRN takes 1 input, got {}",
                ins.len()
            )));
        }
        f32_only("LRN", ins)?;
        nc_shape("LRN", &ins[0].shape)?;
        Ok(vec![TensorMeta::new(DType::F32, ins[0].shape.clone())])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        Work {
            // A window reads at most every channel.
            flops: (ins[0].numel() * (2 * self.size.min(ins[0].shape.get(1).map_or(1, |&c| c)) + 4))
                as u64,
            bytes_read: ins[0].bytes(),
            bytes_written: outs[0].bytes(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        Some(1)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let (c, n) = nc_shape("LRN", &ins[0].shape)?;
        let x = data("LRN", ins[0])?;
        let y = outs[0]
            .as_f32_mut()
            .ok_or_else(|| OpError::Invalid("LRN: output must be f32".into()))?;
        if n == 0 {
            return Ok(());
        }
        let y = &mut y[rows.start * n..rows.end * n];
        let (before, after) = self.window();
        let k = self.alpha / self.size as f32;
        crate::parallel::for_each_chunk_mut(y, n, |i, yr| {
            let row = rows.start + i;
            let (batch, ch) = (row / c, row % c);
            // Accumulate the square sum in y, then turn it into the output.
            yr.iter_mut().for_each(|v| *v = 0.0);
            for cc in ch.saturating_sub(before)..(ch + after + 1).min(c) {
                add_squares(yr, &x[(batch * c + cc) * n..][..n]);
            }
            lrn_scale(yr, &x[row * n..][..n], self.bias, k, self.beta);
        });
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let (c, n) = nc_shape("LRN", &ins[0].shape)?;
        let range = rows.start * n..rows.end * n;
        if range.is_empty() {
            return Ok(Vec::new());
        }
        if ins[0].numel() > u32::MAX as usize {
            return Err(OpError::Unsupported(
                "LRN on GPU: over 2^32 elements".into(),
            ));
        }
        let (before, after) = self.window();
        let p = ChannelParams {
            start: range.start as u32,
            count: range.len() as u32,
            channels: c as u32,
            plane: n as u32,
            alpha_over_size: self.alpha / self.size as f32,
            beta: self.beta,
            bias: self.bias,
            // Clamped to the channels (a window past them adds nothing): the shader's
            // `c + after + 1` must not wrap (a size of 2^40 once made the window empty).
            before: before.min(c) as u32,
            after: after.min(c) as u32,
            ..bytemuck::Zeroable::zeroed()
        };
        let wg = grid_1d(range.len() as u64, 64);
        Ok(vec![GpuKernel::new(
            tandem_shaders::LRN,
            vec![0],
            vec![0],
            &p,
            wg,
        )])
    }
}
