//! Row normalisations: LayerNormalization, RMSNormalization and InstanceNormalization
//! (BatchNormalization and LRN live in `norm_channel.rs`).
//!
//! Sits between the operator contract (`op.rs`) and `norm.wgsl` / `norm_stats.wgsl`. Both ops
//! view the input as `[rows, n]` and normalise each row with a two-pass mean and variance:
//! LayerNormalization over the axes from `axis` on (rows cut on axis `axis - 1`), with Scale and
//! B broadcast over the normalised axes; RMSNormalization the same without the mean and B
//! (`x / sqrt(mean(x^2) + eps) * Scale`); InstanceNormalization over the spatial axes of each
//! `(n, c)` (rows cut on the channel axis), with per-channel scale and bias.

use crate::shape::{self, grid_1d, normalize_axis};
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use std::borrow::Cow;
use std::ops::Range;

/// LayerNormalization (opset 17): `Y = (X - mean) / sqrt(var + eps) * Scale + B` over the axes
/// `axis..`; optional outputs Mean and InvStdDev of shape `X.shape[..axis] + [1...]`. With
/// `rms`, RMSNormalization (opset 23): `Y = X / sqrt(mean(X^2) + eps) * Scale`, output Y only.
#[derive(Debug)]
struct LayerNorm {
    axis: i64,
    eps: f32,
    rms: bool,
}

/// InstanceNormalization: per `(n, c)` normalisation over the spatial axes, then
/// `* scale[c] + B[c]`.
#[derive(Debug)]
struct InstanceNorm {
    eps: f32,
}

/// LayerNormalization (axis default -1, epsilon default 1e-5; stash_type 1 is the only mode:
/// statistics are computed in f32).
pub fn layer_normalization(a: &Attrs) -> Result<Box<dyn Op>> {
    row_normalization(a, false)
}

/// RMSNormalization (axis default -1, epsilon default 1e-5; stash_type 1 only, as above).
pub fn rms_normalization(a: &Attrs) -> Result<Box<dyn Op>> {
    row_normalization(a, true)
}

/// RMSNormalization over the last axis (what the runtime's fusion pass makes of the
/// `Pow, ReduceMean, Add, Sqrt, Div, Mul` chain that exported Llama-style models spell it as).
pub fn rms_norm_last_axis(eps: f32) -> Box<dyn Op> {
    Box::new(LayerNorm {
        axis: -1,
        eps,
        rms: true,
    })
}

fn row_normalization(a: &Attrs, rms: bool) -> Result<Box<dyn Op>> {
    let op = LayerNorm {
        axis: a.int("axis", -1)?,
        eps: a.float("epsilon", 1e-5)?,
        rms,
    };
    let stash = a.int("stash_type", 1)?;
    if stash != 1 {
        return Err(OpError::Unsupported(format!(
            "{}: stash_type {stash} (only 1, f32 statistics)",
            op.name()
        )));
    }
    Ok(Box::new(op))
}

/// InstanceNormalization (epsilon default 1e-5).
pub fn instance_normalization(a: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(InstanceNorm {
        eps: a.float("epsilon", 1e-5)?,
    }))
}

/// Sum of a slice with 8 partial sums (vectorisable, and more accurate than one running sum).
#[inline(always)]
pub(crate) fn sum8(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for i in 0..8 {
            acc[i] += f(c[i]);
        }
    }
    acc.iter().sum::<f32>() + rest
}

/// Mean and `1 / sqrt(var + eps)` of a row, two-pass (the mean sums deviations from the first
/// element, the variance squared deviations from the mean, so large offsets do not cancel).
#[inline(always)]
pub(crate) fn row_stats(x: &[f32], eps: f32) -> (f32, f32) {
    if x.is_empty() {
        return (0.0, 1.0 / eps.sqrt());
    }
    let n = x.len() as f32;
    // Shifted by the first element so a large common offset does not swamp the sum.
    let k = x[0];
    let mean = k + sum8(x, |v| v - k) / n;
    let var = sum8(x, |v| (v - mean) * (v - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `(0, 1 / sqrt(mean(x^2) + eps))`: RMSNormalization's statistics in [`row_stats`]' form.
#[inline(always)]
fn rms_stats(x: &[f32], eps: f32) -> (f32, f32) {
    let ms = sum8(x, |v| v * v) / (x.len().max(1) as f32);
    (0.0, 1.0 / (ms + eps).sqrt())
}

crate::simd::kernel! {
    /// One LayerNormalization row: `y = (x - mean) * inv * scale (+ bias)`; returns
    /// `(mean, inv)`. With `rms` the mean is 0 and `inv` is `1 / sqrt(mean(x^2) + eps)`.
    /// Widest vectors (`crate::simd`).
    fn layer_norm_row(
        xr: &[f32],
        yr: &mut [f32],
        scale: &[f32],
        bias: Option<&[f32]>,
        eps: f32,
        rms: bool,
    ) -> (f32, f32) {
        let (mean, inv) = if rms { rms_stats(xr, eps) } else { row_stats(xr, eps) };
        match bias {
            Some(b) => {
                for (((y, &v), &s), &b) in yr.iter_mut().zip(xr).zip(scale).zip(b) {
                    *y = (v - mean) * inv * s + b;
                }
            }
            None => {
                for ((y, &v), &s) in yr.iter_mut().zip(xr).zip(scale) {
                    *y = (v - mean) * inv * s;
                }
            }
        }
        (mean, inv)
    }
}

crate::simd::kernel! {
    /// One InstanceNormalization plane: `y = (x - mean) * (scale * inv) + bias`.
    fn instance_norm_row(xr: &[f32], yr: &mut [f32], scale: f32, bias: f32, eps: f32) {
        let (mean, inv) = row_stats(xr, eps);
        let s = scale * inv;
        for (y, &v) in yr.iter_mut().zip(xr) {
            *y = (v - mean) * s + bias;
        }
    }
}

fn f32_in<'a>(op: &str, t: &'a Tensor, what: &str) -> Result<&'a [f32]> {
    t.as_f32()
        .ok_or_else(|| OpError::Unsupported(format!("{op}: {what} must be f32, got {}", t.dtype())))
}

fn f32_out<'a>(op: &str, t: &'a mut Tensor) -> Result<&'a mut [f32]> {
    let d = t.dtype();
    t.as_f32_mut()
        .ok_or_else(|| OpError::Invalid(format!("{op}: output must be f32, got {d}")))
}

fn require_f32(op: &str, ins: &[&TensorMeta]) -> Result<()> {
    for (i, m) in ins.iter().enumerate() {
        if m.dtype != DType::F32 && m.numel() > 0 {
            return Err(OpError::Unsupported(format!(
                "{op}: input {i} has dtype {} (f32 only)",
                m.dtype
            )));
        }
    }
    Ok(())
}

/// How a LayerNorm parameter (Scale or B) maps onto the normalised block.
#[derive(Debug, Clone, PartialEq)]
enum Bcast {
    /// One value per normalised element, in order.
    Full,
    /// A single value.
    Scalar,
    /// Anything else broadcastable: element strides over the normalised dims (0 on broadcast).
    Strided(Vec<usize>),
}

impl LayerNorm {
    fn geometry(&self, shape: &[usize]) -> Result<(usize, usize, usize)> {
        let a = normalize_axis(self.axis, shape.len())
            .map_err(|e| OpError::Invalid(format!("{}: {e}", self.name())))?;
        if shape.is_empty() {
            return Err(OpError::Invalid(format!(
                "{}: X must have rank >= 1",
                self.name()
            )));
        }
        Ok((a, shape[..a].iter().product(), shape[a..].iter().product()))
    }

    /// How a parameter of shape `p` broadcasts onto `x[a..]`.
    fn bcast(&self, p: &[usize], x: &[usize], a: usize, what: &str) -> Result<Bcast> {
        let bad = || {
            OpError::Invalid(format!(
                "{}: {what} of shape {p:?} does not broadcast to the normalised shape {:?} of X \
                 {x:?}",
                self.name(),
                &x[a..]
            ))
        };
        if p.len() > x.len() {
            return Err(bad());
        }
        let norm = &x[a..];
        let off = x.len() - p.len();
        // Dims of p that fall before `axis` must be 1.
        for (i, &d) in p.iter().enumerate() {
            if off + i < a && d != 1 {
                return Err(bad());
            }
            if off + i >= a && d != 1 && d != x[off + i] {
                return Err(bad());
            }
        }
        let pn: usize = p.iter().product();
        let inner: usize = norm.iter().product();
        if pn == inner {
            return Ok(Bcast::Full);
        }
        if pn == 1 {
            return Ok(Bcast::Scalar);
        }
        let pad: Vec<usize> = std::iter::repeat_n(1, x.len() - p.len())
            .chain(p.iter().copied())
            .collect();
        Ok(Bcast::Strided(shape::broadcast_strides(&pad[a..], norm)))
    }

    /// Scale or B expanded to one value per normalised element.
    fn expand<'a>(&self, p: &'a [f32], b: &Bcast, norm: &[usize]) -> Cow<'a, [f32]> {
        match b {
            Bcast::Full => Cow::Borrowed(p),
            Bcast::Scalar => Cow::Owned(vec![p[0]; norm.iter().product()]),
            Bcast::Strided(st) => {
                let inner: usize = norm.iter().product();
                let nst = shape::strides(norm);
                Cow::Owned(
                    (0..inner)
                        .map(|j| {
                            (0..norm.len())
                                .map(|d| j / nst[d] % norm[d] * st[d])
                                .sum::<usize>()
                        })
                        .map(|i| p[i])
                        .collect(),
                )
            }
        }
    }

    fn has_bias(ins: &[&TensorMeta]) -> bool {
        ins.len() > 2 && ins[2].numel() > 0
    }
}

impl Op for LayerNorm {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        match self.rms {
            true => "RMSNormalization",
            false => "LayerNormalization",
        }
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let takes = if self.rms { 2..=2 } else { 2..=3 };
        if !takes.contains(&ins.len()) {
            return Err(OpError::Invalid(format!(
                "{} takes {} inputs, got {}",
                self.name(),
                if self.rms { "2" } else { "2 or 3" },
                ins.len()
            )));
        }
        require_f32(self.name(), ins)?;
        let x = &ins[0].shape;
        let (a, _, _) = self.geometry(x)?;
        self.bcast(&ins[1].shape, x, a, "Scale")?;
        if Self::has_bias(ins) {
            self.bcast(&ins[2].shape, x, a, "B")?;
        }
        if self.rms {
            return Ok(vec![TensorMeta::new(DType::F32, x.clone())]);
        }
        let stat: Vec<usize> = x
            .iter()
            .enumerate()
            .map(|(i, &d)| if i < a { d } else { 1 })
            .collect();
        Ok(vec![
            TensorMeta::new(DType::F32, x.clone()),
            TensorMeta::new(DType::F32, stat.clone()),
            TensorMeta::new(DType::F32, stat),
        ])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        Work {
            flops: 6 * ins[0].numel() as u64,
            bytes_read: ins.iter().map(|m| m.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        match self.geometry(&ins[0].shape) {
            Ok((a, _, _)) if a > 0 => Some(a - 1),
            _ => None,
        }
    }

    /// Each row before the normalised axes is normalised on its own (X only; scale and bias
    /// are read whole).
    fn row_local(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Vec<usize> {
        match self.split_axis(ins, outs) {
            Some(_) => crate::op::same_shape_inputs(&ins[..1], outs),
            None => Vec::new(),
        }
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let op = self.name();
        let xs = &ins[0].shape;
        let (a, _, n) = self.geometry(xs)?;
        let x = f32_in(op, ins[0], "X")?;
        let scale = self.expand(
            f32_in(op, ins[1], "Scale")?,
            &self.bcast(&ins[1].shape, xs, a, "Scale")?,
            &xs[a..],
        );
        let bias = match ins.get(2).filter(|b| b.numel() > 0) {
            Some(b) => Some(self.expand(
                f32_in(op, b, "B")?,
                &self.bcast(&b.shape, xs, a, "B")?,
                &xs[a..],
            )),
            None => None,
        };
        let (y, stats) = outs.split_at_mut(1);
        let y = &mut f32_out(op, &mut y[0])?[rows.start * n..rows.end * n];
        let x = &x[rows.start * n..rows.end * n];
        if n == 0 {
            return Ok(());
        }
        let (scale, bias, eps, rms) = (&scale[..], bias.as_deref(), self.eps, self.rms);
        let norm = |(xr, yr): (&[f32], &mut [f32])| layer_norm_row(xr, yr, scale, bias, eps, rms);
        if stats.is_empty() {
            crate::parallel::for_each_chunk_mut(y, n, |i, yr| {
                norm((&x[i * n..][..n], yr));
            });
        } else {
            let (mean_t, inv_t) = stats.split_at_mut(1);
            let mean = &mut f32_out(op, &mut mean_t[0])?[rows.clone()];
            let mut inv_none = Vec::new();
            let inv = match inv_t.first_mut() {
                Some(t) => &mut f32_out(op, t)?[rows.clone()],
                None => {
                    inv_none.resize(rows.len(), 0.0);
                    &mut inv_none[..]
                }
            };
            // Each row with its two statistics as one item for the parallel helper (which
            // also runs serial mode), rather than a serial and a parallel copy of the chain.
            let rows: Vec<_> = (x.chunks(n).zip(y.chunks_mut(n)))
                .zip(mean.iter_mut().zip(inv.iter_mut()))
                .collect();
            crate::parallel::for_each_item(rows, |(r, (m, i))| (*m, *i) = norm(r));
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let xs = &ins[0].shape;
        let (a, _, n) = self.geometry(xs)?;
        let step = |i: usize, what: &str| match self.bcast(&ins[i].shape, xs, a, what)? {
            Bcast::Full => Ok(1),
            Bcast::Scalar => Ok(0),
            Bcast::Strided(_) => Err(OpError::Unsupported(format!(
                "{} on GPU: {what} of shape {:?} broadcast over part of the normalised axes",
                self.name(),
                ins[i].shape
            ))),
        };
        if outs.len() == 2 {
            return Err(OpError::Unsupported(
                "LayerNormalization on GPU: Mean requested without InvStdDev".into(),
            ));
        }
        let has_bias = Self::has_bias(ins);
        let p = NormParams {
            s_el: step(1, "Scale")?,
            b_el: if has_bias { step(2, "B")? } else { 0 },
            channels: 1,
            ..NormParams::new(n, &rows, self.eps, self.name())?
        };
        row_kernels(&p, (has_bias, self.rms), outs.len() > 1, rows)
    }
}

/// `norm.wgsl` parameters: row `r` normalises `x[r * n ..][..n]`; scale index
/// `(r % channels) * s_row + j * s_el` (bias alike).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct NormParams {
    n: u32,
    first_row: u32,
    rows: u32,
    channels: u32,
    s_row: u32,
    s_el: u32,
    b_row: u32,
    b_el: u32,
    eps: f32,
    _pad: [u32; 3],
}

impl NormParams {
    fn new(n: usize, rows: &Range<usize>, eps: f32, op: &str) -> Result<NormParams> {
        let big = || OpError::Unsupported(format!("{op} on GPU: sizes exceed u32"));
        if rows
            .end
            .checked_mul(n)
            .is_none_or(|v| v > u32::MAX as usize)
        {
            return Err(big());
        }
        Ok(NormParams {
            n: n as u32,
            first_row: rows.start as u32,
            rows: rows.len() as u32,
            channels: 1,
            s_row: 0,
            s_el: 0,
            b_row: 0,
            b_el: 0,
            eps,
            _pad: [0; 3],
        })
    }
}

/// `norm_stats.wgsl` parameters.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct StatsParams {
    n: u32,
    first_row: u32,
    rows: u32,
    eps: f32,
}

/// The `norm.wgsl` dispatch (inputs X, Scale, B; Scale bound again in place of an absent B;
/// `rms`: RMSNormalization, no mean and `x^2` averaged instead of the variance) and, when
/// `stats`, the `norm_stats.wgsl` dispatch writing outputs 1 and 2.
fn row_kernels(
    p: &NormParams,
    (has_bias, rms): (bool, bool),
    stats: bool,
    rows: Range<usize>,
) -> Result<Vec<GpuKernel>> {
    if rows.is_empty() || p.n == 0 {
        return Ok(Vec::new());
    }
    let wg = grid_1d(rows.len() as u64, 64);
    let bias = if has_bias { 2 } else { 1 };
    let mut ks = vec![
        GpuKernel::new(tandem_shaders::NORM, vec![0, 1, bias], vec![0], p, wg)
            .with_override("HAS_BIAS", has_bias as u32 as f64)
            .with_override("RMS", rms as u32 as f64),
    ];
    if stats {
        let sp = StatsParams {
            n: p.n,
            first_row: p.first_row,
            rows: p.rows,
            eps: p.eps,
        };
        ks.push(GpuKernel::new(
            tandem_shaders::NORM_STATS,
            vec![0],
            vec![1, 2],
            &sp,
            wg,
        ));
    }
    Ok(ks)
}

impl InstanceNorm {
    /// `(channels, rows = N * C, n = spatial size)`.
    fn geometry(&self, ins: &[&TensorMeta]) -> Result<(usize, usize, usize)> {
        let x = &ins[0].shape;
        if x.len() < 2 {
            return Err(OpError::Invalid(format!(
                "InstanceNormalization: X must be [N, C, ...], got {x:?}"
            )));
        }
        let c = x[1];
        for (i, what) in [(1, "scale"), (2, "B")] {
            if ins[i].numel() != c {
                return Err(OpError::Invalid(format!(
                    "InstanceNormalization: {what} must hold C = {c} values, got shape {:?}",
                    ins[i].shape
                )));
            }
        }
        Ok((c, x[0] * c, x[2..].iter().product()))
    }
}

impl Op for InstanceNorm {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "InstanceNormalization"
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        if ins.len() != 3 {
            return Err(OpError::Invalid(format!(
                "InstanceNormalization takes 3 inputs, got {}",
                ins.len()
            )));
        }
        require_f32("InstanceNormalization", ins)?;
        self.geometry(ins)?;
        Ok(vec![TensorMeta::new(DType::F32, ins[0].shape.clone())])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        Work {
            flops: 6 * ins[0].numel() as u64,
            bytes_read: ins.iter().map(|m| m.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        Some(1)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let op = "InstanceNormalization";
        let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
        let (c, _, n) = self.geometry(&metas.iter().collect::<Vec<_>>())?;
        let x = f32_in(op, ins[0], "X")?;
        let scale = f32_in(op, ins[1], "scale")?;
        let bias = f32_in(op, ins[2], "B")?;
        let y = &mut f32_out(op, &mut outs[0])?[rows.start * n..rows.end * n];
        if n == 0 {
            return Ok(());
        }
        let x = &x[rows.start * n..rows.end * n];
        crate::parallel::for_each_chunk_mut(y, n, |i, yr| {
            let xr = &x[i * n..][..n];
            let ch = (rows.start + i) % c;
            instance_norm_row(xr, yr, scale[ch], bias[ch], self.eps);
        });
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let (c, _, n) = self.geometry(ins)?;
        let p = NormParams {
            channels: c as u32,
            s_row: 1,
            b_row: 1,
            ..NormParams::new(n, &rows, self.eps, "InstanceNormalization")?
        };
        row_kernels(&p, (true, false), false, rows)
    }
}

#[cfg(test)]
#[path = "norm_tests.rs"]
mod tests;
