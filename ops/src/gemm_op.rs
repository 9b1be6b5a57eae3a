//! Gemm: `Y = alpha * op(A) * op(B) + beta * C`, with `op` an optional transpose and `C`
//! (optional from opset 11) broadcast unidirectionally to `(M, N)`.
//!
//! Sits between the operator contract ([`crate::Op`]) and the shared CPU GEMM
//! ([`crate::cpu_gemm`]) / the `matmul` shader (transposes become strides, C's broadcast
//! becomes zero strides). Rows: axis 0 of Y (one row of A per output row).
//!
//! A constant transposed weight (`B` of shape `[N, K]`, transB=1) may be stored with padded
//! rows ([`Gemm::with_padded_weight`], applied by the runtime at load time): at row strides
//! of an even number of 64-byte cache lines, the rows the `gemm` crate packs together (and
//! the GPU kernel's lanes read) fall into few cache sets. Measured on one thread, M=128:
//! K=N=1024 98 GFLOP/s with K-float rows, 218 with K+16; K=N=512 154 vs 221; M=64, K=2048,
//! N=512 61 vs 193.

use crate::cpu_gemm::{sgemm, MatMut, MatRef, Threads};
use crate::matmul::{f32_in, f32_out, matmul_kernels, MatmulParams, MmGeom};
use crate::shape::broadcast_strides;
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use std::ops::Range;

/// Gemm with its parsed attributes.
#[derive(Debug, Clone)]
pub struct Gemm {
    pub alpha: f32,
    pub beta: f32,
    pub trans_a: bool,
    pub trans_b: bool,
    /// Elements after each row of a transposed B (transB=1): B is `[N, K + b_row_pad]` and
    /// only the first K of each row are read. 0 for every ONNX model; set by
    /// [`Gemm::with_padded_weight`].
    pub b_row_pad: usize,
}

/// A transposed weight's rows are padded from K to K + [`ROW_PAD`] floats when K is a stride
/// that aliases ([`crate::cpu_gemm::stride_aliases`]), unless the product is known to have
/// fewer than [`PAD_MIN_ROWS`] rows: those run as dot products or a matrix-vector product that
/// stream the weight's rows, where the stride does not matter and the copy at load time would
/// only cost.
pub const ROW_PAD: usize = 16;
pub const PAD_MIN_ROWS: usize = 16;

/// Registry constructor: reads `alpha`, `beta` (default 1), `transA`, `transB` (default 0).
pub fn gemm(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let flag = |name: &str| -> Result<bool> {
        match attrs.int(name, 0)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(OpError::Invalid(format!(
                "Gemm attribute `{name}` must be 0 or 1, got {v}"
            ))),
        }
    };
    Ok(Box::new(Gemm {
        alpha: attrs.float("alpha", 1.0)?,
        beta: attrs.float("beta", 1.0)?,
        trans_a: flag("transA")?,
        trans_b: flag("transB")?,
        b_row_pad: 0,
    }))
}

/// M, N, K and C's strides (broadcast to (M, N)) when C is present.
struct Dims {
    m: usize,
    n: usize,
    k: usize,
    c: Option<(usize, usize)>,
}

impl Gemm {
    fn dims(&self, ins: &[&[usize]]) -> Result<Dims> {
        if ins.len() < 2 || ins.len() > 3 {
            return Err(OpError::Invalid(format!(
                "Gemm takes 2 or 3 inputs, got {}",
                ins.len()
            )));
        }
        let (a, b) = (ins[0], ins[1]);
        if a.len() != 2 || b.len() != 2 {
            return Err(OpError::Invalid(format!(
                "Gemm needs 2-D A and B, got {a:?} and {b:?}"
            )));
        }
        let (m, k) = if self.trans_a {
            (a[1], a[0])
        } else {
            (a[0], a[1])
        };
        let (kb, n) = match (self.trans_b, self.b_row_pad) {
            (true, pad) if b[1] >= pad => (b[1] - pad, b[0]),
            (false, 0) => (b[0], b[1]),
            _ => {
                return Err(OpError::Invalid(format!(
                    "Gemm B {b:?} cannot hold rows padded by {} (transB {})",
                    self.b_row_pad, self.trans_b as u8
                )))
            }
        };
        if k != kb {
            return Err(OpError::Invalid(format!(
                "Gemm inner dimensions differ: A {a:?} (transA {}), B {b:?} (transB {})",
                self.trans_a as u8, self.trans_b as u8
            )));
        }
        let c = match ins.get(2) {
            None => None,
            Some(c) if c.len() > 2 => {
                return Err(OpError::Invalid(format!("Gemm C has rank {} > 2", c.len())))
            }
            Some(c) => {
                let off = 2 - c.len();
                for (i, &d) in c.iter().enumerate() {
                    let want = [m, n][off + i];
                    if d != want && d != 1 {
                        return Err(OpError::Invalid(format!(
                            "Gemm C {c:?} cannot be broadcast to ({m}, {n})"
                        )));
                    }
                }
                let s = broadcast_strides(c, &[m, n]);
                Some((s[0], s[1]))
            }
        };
        Ok(Dims { m, n, k, c })
    }

    fn shapes<'a>(ins: &[&'a TensorMeta]) -> Vec<&'a [usize]> {
        ins.iter().map(|t| t.shape.as_slice()).collect()
    }

    /// This Gemm reading the weight `b` (its input 1, `[N, K]`, transB=1) from a copy with
    /// padded rows, and that copy; `None` where the rule of [`ROW_PAD`] leaves the weight as
    /// it is, given A's shape where it is known before run time.
    pub fn with_padded_weight(&self, a: Option<&[usize]>, b: &Tensor) -> Option<(Gemm, Tensor)> {
        let rows = match a {
            Some(&[r, c]) => Some(if self.trans_a { c } else { r }),
            _ => None,
        };
        let data = b.as_f32()?;
        let &[n, k] = b.shape.as_slice() else {
            return None;
        };
        let pads = self.trans_b
            && self.b_row_pad == 0
            && crate::cpu_gemm::stride_aliases(k)
            && rows.is_none_or(|m| m >= PAD_MIN_ROWS);
        if !pads {
            return None;
        }
        let ld = k + ROW_PAD;
        let mut padded = vec![0.0f32; n * ld];
        for (dst, src) in padded.chunks_exact_mut(ld).zip(data.chunks_exact(k)) {
            dst[..k].copy_from_slice(src);
        }
        let gemm = Gemm {
            b_row_pad: ROW_PAD,
            ..self.clone()
        };
        Some((gemm, Tensor::f32(&[n, ld], padded)))
    }
}

impl Op for Gemm {
    fn name(&self) -> &'static str {
        "Gemm"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let d = self.dims(&Self::shapes(ins))?;
        for (i, t) in ins.iter().enumerate() {
            if t.dtype != DType::F32 {
                return Err(OpError::Unsupported(format!(
                    "Gemm: input {i} has dtype {}, only f32 is implemented",
                    t.dtype
                )));
            }
        }
        Ok(vec![TensorMeta::new(DType::F32, vec![d.m, d.n])])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        let flops = self
            .dims(&Self::shapes(ins))
            .map(|d| (2 * d.m * d.n * d.k + if d.c.is_some() { 2 * d.m * d.n } else { 0 }) as u64)
            .unwrap_or(0);
        Work {
            flops,
            bytes_read: ins.iter().map(|i| i.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        Some(0)
    }

    /// Output row `m` reads row `m` of A unless A is transposed.
    fn row_local(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Vec<usize> {
        if self.trans_a {
            Vec::new()
        } else {
            vec![0]
        }
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let shapes: Vec<&[usize]> = ins.iter().map(|t| t.shape.as_slice()).collect();
        let d = self.dims(&shapes)?;
        let (a, b) = (f32_in("Gemm", ins[0])?, f32_in("Gemm", ins[1])?);
        let y = f32_out("Gemm", &mut outs[0])?;
        let rows = rows.start.min(d.m)..rows.end.min(d.m);
        if rows.is_empty() || d.n == 0 {
            return Ok(());
        }
        let dst = &mut y[rows.start * d.n..rows.end * d.n];
        let mut beta = 0.0;
        if let (Some((crs, ccs)), true) = (d.c, self.beta != 0.0) {
            let c = f32_in("Gemm", ins[2])?;
            for (ri, row) in dst.chunks_mut(d.n).enumerate() {
                let base = (rows.start + ri) * crs;
                for (j, v) in row.iter_mut().enumerate() {
                    *v = c[base + j * ccs];
                }
            }
            beta = self.beta;
        }
        let av = if self.trans_a {
            MatRef::row_major(a, rows.start, d.m).t()
        } else {
            MatRef::row_major(a, rows.start * d.k, d.k)
        };
        let bv = if self.trans_b {
            MatRef::row_major(b, 0, d.k + self.b_row_pad).t()
        } else {
            MatRef::row_major(b, 0, d.n)
        };
        sgemm(
            rows.len(),
            d.n,
            d.k,
            self.alpha,
            av,
            bv,
            beta,
            MatMut::row_major(dst, 0, d.n),
            Threads::Pool,
        );
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let d = self.dims(&Self::shapes(ins))?;
        let g = MmGeom {
            batch: vec![],
            a_bs: vec![],
            b_bs: vec![],
            m: d.m,
            n: d.n,
            k: d.k,
            out_shape: vec![d.m, d.n],
            ..MmGeom::default()
        };
        let u = |v: usize| {
            u32::try_from(v)
                .map_err(|_| OpError::Unsupported("Gemm on GPU: size exceeds u32".into()))
        };
        let (c_rs, c_cs, beta, inputs) = match d.c {
            Some((rs, cs)) if self.beta != 0.0 => (u(rs)?, u(cs)?, self.beta, vec![0, 1, 2]),
            _ => (0, 0, 0.0, vec![0, 1, 1]),
        };
        let base = MatmulParams {
            a_rs: if self.trans_a { 1 } else { u(d.k)? },
            a_cs: if self.trans_a { u(d.m)? } else { 1 },
            b_rs: if self.trans_b { 1 } else { u(d.n)? },
            b_cs: if self.trans_b {
                u(d.k + self.b_row_pad)?
            } else {
                1
            },
            c_rs,
            c_cs,
            alpha: self.alpha,
            beta,
            ..bytemuck::Zeroable::zeroed()
        };
        let rows = rows.start.min(d.m)..rows.end.min(d.m);
        matmul_kernels(&g, base, inputs, rows)
    }
}

#[cfg(test)]
#[path = "gemm_op_tests.rs"]
mod tests;
