//! MatMul (numpy semantics: 1-D operands, batched, broadcast batch dimensions) and the GPU
//! kernel description of `matmul.wgsl`, which Gemm reuses.
//!
//! Sits between the operator contract ([`crate::Op`]) and the shared CPU GEMM
//! ([`crate::cpu_gemm`]) / the `matmul` shader. Rows: output axis `rank - 2` when the output has
//! rank >= 2 (with 2-D operands that is `batch * M` rows of N elements); a rank-0/1 output is
//! one row. Internally every range is turned into "logical rows" `b * M + m` of N elements.

use crate::cpu_gemm::{sgemm, MatMut, MatRef, Threads};
use crate::cpu_gemm_packed::{self as packed, KeptPacking};
use crate::shape::{broadcast_shapes, permuted, row_len, rows_by_block};
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use std::ops::Range;

#[path = "matmul_windows.rs"]
mod windows;

/// Below this many multiply-adds a MatMul runs on the calling thread.
const SMALL_MACS: usize = 1 << 15;

/// MatMul: `Y = A @ B` following `numpy.matmul`.
#[derive(Debug, Clone, Default)]
pub struct MatMul {
    /// Per operand (A, B): `Some(perm)` when the operand is given in storage order and the
    /// product reads `Transpose(operand, perm)`. The runtime's fusion pass folds a Transpose
    /// that only feeds a MatMul in this way (attention's `Q`, `K^T` and `V` head splits), and
    /// both kernels read the operand through strides instead of a transposed copy.
    pub perms: [Option<Vec<usize>>; 2],
    /// `Some` when B is a constant of the model ([`MatMul::with_constant_b`], set at load
    /// time): where the CPU has AVX2 or AVX-512, B is packed once for `cpu_gemm_packed` and
    /// kept.
    pub constant_b: Option<KeptPacking>,
    /// A third input, a bias added to every output row after the product (its shape: ones,
    /// then N; of no higher rank than the output): the runtime's fusion pass folds an Add of a
    /// constant bias after a MatMul in this way (`MatMul+Add` in reports), which both kernels
    /// apply as they write a row instead of in a pass of their own.
    pub bias: bool,
}

/// Registry constructor (MatMul has no attributes).
pub fn matmul(_attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(MatMul::default()))
}

impl MatMul {
    /// This MatMul, told that its B is a constant of the model (the runtime's load-time
    /// `layout` pass): the CPU then packs B once and keeps it, where it has the kernel for it.
    pub fn with_constant_b(&self) -> MatMul {
        MatMul {
            constant_b: Some(KeptPacking::default()),
            ..self.clone()
        }
    }

    /// The product's geometry for operand shapes `a` and `b` as stored.
    pub(crate) fn geom(&self, a: &[usize], b: &[usize]) -> Result<MmGeom> {
        MmGeom::strided(
            permuted(a, self.perms[0].as_deref(), "MatMul")?,
            permuted(b, self.perms[1].as_deref(), "MatMul")?,
        )
    }
}

/// Whether `TANDEM_MATMUL_PACKED=0` turned the kept packing of constant B off (read once; A/B
/// timing in one binary).
fn kept_packing_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_MATMUL_PACKED").as_deref() != Ok("0"))
}

/// Shapes of one (batched) product, with the 1-D cases already promoted to matrices.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct MmGeom {
    pub batch: Vec<usize>,
    /// Element strides of A and B per output batch dimension (0 on broadcast dims).
    pub a_bs: Vec<usize>,
    pub b_bs: Vec<usize>,
    /// Element strides of A's and B's rows and columns (row-major operands: `(k, 1)`, `(n, 1)`).
    pub a_mat: (usize, usize),
    pub b_mat: (usize, usize),
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub out_shape: Vec<usize>,
}

impl MmGeom {
    /// Operands given as (shape, element stride of each dimension).
    fn strided(
        (a, a_st): (Vec<usize>, Vec<usize>),
        (b, b_st): (Vec<usize>, Vec<usize>),
    ) -> Result<MmGeom> {
        if a.is_empty() || b.is_empty() {
            return Err(OpError::Invalid(format!(
                "MatMul operands must have rank >= 1, got {a:?} and {b:?}"
            )));
        }
        // 1-D operands become a row (A) or a column (B).
        let (a2, a_st2) = match a.len() {
            1 => (vec![1, a[0]], vec![a[0] * a_st[0], a_st[0]]),
            _ => (a.clone(), a_st),
        };
        let (b2, b_st2) = match b.len() {
            1 => (vec![b[0], 1], vec![b_st[0], 1]),
            _ => (b.clone(), b_st),
        };
        let (ra, rb) = (a2.len(), b2.len());
        let (m, k) = (a2[ra - 2], a2[ra - 1]);
        let (kb, n) = (b2[rb - 2], b2[rb - 1]);
        if k != kb {
            return Err(OpError::Invalid(format!(
                "MatMul inner dimensions differ: A {a:?}, B {b:?}"
            )));
        }
        let (ab, bb) = (&a2[..ra - 2], &b2[..rb - 2]);
        let batch = broadcast_shapes(&[ab, bb])?;
        // Per output batch dimension: the operand's stride there, 0 where it is broadcast.
        let batch_strides = |dims: &[usize], st: &[usize]| {
            let off = batch.len() - dims.len();
            (0..batch.len())
                .map(|d| match d.checked_sub(off) {
                    Some(i) if dims[i] != 1 => st[i],
                    _ => 0,
                })
                .collect()
        };
        let a_bs = batch_strides(ab, &a_st2);
        let b_bs = batch_strides(bb, &b_st2);
        let mut out_shape = batch.clone();
        if a.len() > 1 {
            out_shape.push(m);
        }
        if b.len() > 1 {
            out_shape.push(n);
        }
        Ok(MmGeom {
            batch,
            a_bs,
            b_bs,
            a_mat: (a_st2[ra - 2], a_st2[ra - 1]),
            b_mat: (b_st2[rb - 2], b_st2[rb - 1]),
            m,
            n,
            k,
            out_shape,
        })
    }

    pub fn batches(&self) -> usize {
        self.batch.iter().product()
    }

    /// Offsets of batch `bi` (flat over the output batch dims) in A and B.
    pub fn batch_offsets(&self, mut bi: usize) -> (usize, usize) {
        let (mut ao, mut bo) = (0, 0);
        for d in (0..self.batch.len()).rev() {
            let idx = bi % self.batch[d];
            bi /= self.batch[d];
            ao += idx * self.a_bs[d];
            bo += idx * self.b_bs[d];
        }
        (ao, bo)
    }

    /// The split axis of the output (rank - 2), or None for rank 0/1 outputs.
    pub fn split_axis(&self) -> Option<usize> {
        (self.out_shape.len() >= 2).then(|| self.out_shape.len() - 2)
    }

    /// Logical rows (`b * M + m`, N elements each) covered by output rows `rows`.
    pub fn logical_rows(&self, rows: Range<usize>) -> Range<usize> {
        let total = self.batches() * self.m;
        if self.n == 0 || total == 0 {
            return 0..0;
        }
        match self.split_axis() {
            None => 0..total,
            Some(ax) => {
                let rl = row_len(&self.out_shape, Some(ax));
                (rows.start * rl / self.n).min(total)..(rows.end * rl / self.n).min(total)
            }
        }
    }
}

/// Params of `matmul.wgsl` and `matmul_vec4.wgsl` (layout mirrored in `matmul_common.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct MatmulParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub row_start: u32,
    pub row_end: u32,
    pub m_lo: u32,
    pub b0: u32,
    pub nbd: u32,
    pub a_rs: u32,
    pub a_cs: u32,
    pub b_rs: u32,
    pub b_cs: u32,
    pub c_rs: u32,
    pub c_cs: u32,
    pub alpha: f32,
    pub beta: f32,
    pub bshape: [u32; 8],
    pub a_bs: [u32; 8],
    pub b_bs: [u32; 8],
}

/// Output columns one `matmul.wgsl` workgroup covers, and its rows unless M is 1.
pub const GPU_TILE: usize = 64;

/// Output rows one `matmul.wgsl` workgroup covers for a product of `m` rows: its tile's 64, or
/// the one row when M is 1 (decode's every product), which 64 rows would compute 64 times.
pub fn gpu_workgroup_rows(m: usize) -> usize {
    if m == 1 {
        1
    } else {
        GPU_TILE
    }
}

pub(crate) fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| OpError::Unsupported(format!("{what} {v} exceeds u32 on GPU")))
}

/// Dispatches of `matmul.wgsl` for logical rows `lr` of `g`. `base` carries the strides,
/// alpha/beta and C strides; `inputs` are the op inputs bound as a, b, c.
pub(crate) fn matmul_kernels(
    g: &MmGeom,
    base: MatmulParams,
    inputs: Vec<usize>,
    lr: Range<usize>,
) -> Result<Vec<GpuKernel>> {
    if lr.is_empty() || g.n == 0 {
        return Ok(Vec::new());
    }
    if g.batch.len() > 8 {
        return Err(OpError::Unsupported(format!(
            "MatMul on GPU: more than 8 batch dims ({:?})",
            g.batch
        )));
    }
    let mut p = base;
    p.m = u32_of(g.m, "M")?;
    p.n = u32_of(g.n, "N")?;
    p.k = u32_of(g.k, "K")?;
    p.row_start = u32_of(lr.start, "row")?;
    p.row_end = u32_of(lr.end, "row")?;
    p.nbd = g.batch.len() as u32;
    for d in 0..g.batch.len() {
        p.bshape[d] = u32_of(g.batch[d], "batch dim")?;
        p.a_bs[d] = u32_of(g.a_bs[d], "batch stride")?;
        p.b_bs[d] = u32_of(g.b_bs[d], "batch stride")?;
    }
    let b_first = lr.start / g.m;
    let b_last = (lr.end - 1) / g.m;
    let (m_lo, m_hi) = if b_first == b_last {
        (lr.start - b_first * g.m, lr.end - b_first * g.m)
    } else {
        (0, g.m)
    };
    p.m_lo = m_lo as u32;
    let wg_rows = gpu_workgroup_rows(g.m);
    let gx = u32_of(g.n.div_ceil(GPU_TILE), "N / 64")?;
    let gy = u32_of((m_hi - m_lo).div_ceil(wg_rows), "M / 64")?;
    if gx > 65535 || gy > 65535 {
        return Err(OpError::Unsupported(format!(
            "MatMul on GPU: {}x{} output too large for one dispatch",
            g.m, g.n
        )));
    }
    // the windows cover lr, so only where every batch is in one dispatch
    let mut windowed = (b_last - b_first < 65535)
        .then(|| windows::window_kernels(g, &p, &inputs, lr.clone()))
        .flatten();
    let mut kernels = Vec::new();
    let mut b0 = b_first;
    while b0 <= b_last {
        let nb = (b_last + 1 - b0).min(65535);
        p.b0 = b0 as u32;
        // T x T outputs an invocation in WS x WS workgroups (one row of T and a row of WS when
        // M is 1): 8 x 8 where shaders run on the CPU and every load is a gather, 4 x 4 on
        // GPUs (`matmul_tiled.wgsl`'s layout too, from 32 rows); a workgroup covers 64 columns
        // either way. `matmul_vec4.wgsl` is the 8 x 8 layout with vec4 reads, where the
        // operands allow them.
        let dispatch =
            |shader| GpuKernel::new(shader, inputs.clone(), vec![0], &p, [gx, gy, nb as u32]);
        let kernel = |shader, t: usize| {
            let (tm, wy) = if wg_rows == 1 {
                (1, 1)
            } else {
                (t, GPU_TILE / t)
            };
            dispatch(shader)
                .with_override("TM", tm as f64)
                .with_override("WY", wy as f64)
        };
        let layout = |t: usize| {
            kernel(tandem_shaders::MATMUL, t)
                .with_override("T", t as f64)
                .with_override("WS", (GPU_TILE / t) as f64)
        };
        let on_cpu = match windowed.take() {
            Some(windowed) => windowed,
            None if vec4_fits(g, &p) => vec![kernel(tandem_shaders::MATMUL_VEC4, 8)],
            None => vec![layout(8)],
        };
        // GPUs stage 64 x 64 tiles in workgroup memory where the rows fill one
        let gpu = match g.m >= GPU_TILE / 2 && crate::gpu_kernel::tiled_enabled() {
            true => dispatch(tandem_shaders::MATMUL_TILED),
            false => layout(4),
        };
        kernels.push(gpu.with_cpu_adapter_variants(on_cpu));
        b0 += nb;
    }
    Ok(kernels)
}

/// Whether `matmul_vec4.wgsl` can read A and B of `g` as vec4s: rows contiguous, and every row
/// and batch start on a multiple of 4 elements.
fn vec4_fits(g: &MmGeom, p: &MatmulParams) -> bool {
    let four = |v: usize| v.is_multiple_of(4);
    b_rows_fit(g, p)
        && p.a_cs == 1
        && four(g.k)
        && four(p.a_rs as usize)
        && g.a_bs.iter().chain(&g.b_bs).all(|&s| four(s))
}

/// Whether B's rows can be read as vec4s: B's columns contiguous, N and B's row stride
/// multiples of 4 (`matmul_window.wgsl` needs no more: with K_UNALIGNED it reads A a float at a
/// time).
fn b_rows_fit(g: &MmGeom, p: &MatmulParams) -> bool {
    let four = |v: usize| v.is_multiple_of(4);
    p.b_cs == 1 && four(g.n) && four(p.b_rs as usize)
}

pub(crate) fn check_f32(op: &str, ins: &[&TensorMeta]) -> Result<()> {
    for (i, t) in ins.iter().enumerate() {
        if t.dtype != DType::F32 {
            return Err(OpError::Unsupported(format!(
                "{op}: input {i} has dtype {}, only f32 is implemented",
                t.dtype
            )));
        }
    }
    Ok(())
}

/// f32 slice of an input tensor, or `Unsupported` naming the dtype.
pub(crate) fn f32_in<'a>(op: &str, t: &'a Tensor) -> Result<&'a [f32]> {
    t.as_f32().ok_or_else(|| {
        OpError::Unsupported(format!(
            "{op}: dtype {} (only f32 is implemented)",
            t.dtype()
        ))
    })
}

/// f32 slice of an output tensor.
pub(crate) fn f32_out<'a>(op: &str, t: &'a mut Tensor) -> Result<&'a mut [f32]> {
    let d = t.dtype();
    t.as_f32_mut()
        .ok_or_else(|| OpError::Unsupported(format!("{op}: output dtype {d}")))
}

impl Op for MatMul {
    fn name(&self) -> &'static str {
        "MatMul"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let want = 2 + usize::from(self.bias);
        if ins.len() != want {
            return Err(OpError::Invalid(format!(
                "MatMul takes {want} inputs, got {}",
                ins.len()
            )));
        }
        if ins[0].dtype != ins[1].dtype {
            return Err(OpError::Invalid(format!(
                "MatMul operands differ in dtype: {} and {}",
                ins[0].dtype, ins[1].dtype
            )));
        }
        check_f32("MatMul", ins)?;
        let g = self.geom(&ins[0].shape, &ins[1].shape)?;
        if let Some(bias) = ins.get(2) {
            let s = &bias.shape;
            let ones = s.iter().rev().skip(1).all(|&d| d == 1);
            if !ones || s.last() != Some(&g.n) || s.len() > g.out_shape.len() {
                return Err(OpError::Invalid(format!(
                    "MatMul: bias of shape {s:?} is not one row of {} for an output of shape {:?}",
                    g.n, g.out_shape
                )));
            }
        }
        Ok(vec![TensorMeta::new(ins[0].dtype, g.out_shape)])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        let flops = (self.geom(&ins[0].shape, &ins[1].shape))
            .map(|g| (g.batches() * g.m * g.n * (2 * g.k + usize::from(self.bias))) as u64)
            .unwrap_or(0);
        Work {
            flops,
            bytes_read: ins.iter().map(|i| i.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        self.geom(&ins[0].shape, &ins[1].shape).ok()?.split_axis()
    }

    /// Output row `m` of a batch reads row `m` of A, when A is not broadcast over batches and
    /// is read in storage order.
    fn row_local(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Vec<usize> {
        if self.perms[0].is_some() {
            return Vec::new();
        }
        let (a, o) = (&ins[0].shape, &outs[0].shape);
        let rows_match = a.len() >= 2 && a.len() == o.len() && a[..a.len() - 1] == o[..o.len() - 1];
        if rows_match && self.split_axis(ins, outs).is_some() {
            vec![0]
        } else {
            Vec::new()
        }
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let g = self.geom(&ins[0].shape, &ins[1].shape)?;
        let (a, b) = (f32_in("MatMul", ins[0])?, f32_in("MatMul", ins[1])?);
        let bias = match ins.get(2) {
            Some(t) => Some(f32_in("MatMul", t)?),
            None => None,
        };
        let out = f32_out("MatMul", &mut outs[0])?;
        let lr = g.logical_rows(rows);
        if lr.is_empty() {
            return Ok(());
        }
        // One piece per batch touched: (batch, m range, its block of the output).
        let pieces = rows_by_block(&mut out[lr.start * g.n..lr.end * g.n], lr.clone(), g.m, g.n);
        let macs = lr.len() * g.n * g.k;
        let b_whole = MatRef {
            data: b,
            offset: 0,
            rs: g.b_mat.0,
            cs: g.b_mat.1,
        };
        // A constant B, the same for every batch: packed once (see `cpu_gemm_packed`). Not for
        // products of fewer rows than the micro-kernel's (a decode step's): `sgemm` has
        // single-row kernels that read B in place.
        let kept = (self.constant_b.as_ref())
            .filter(|_| {
                macs >= SMALL_MACS
                    && g.m >= packed::MIN_ROWS
                    && g.b_bs.iter().all(|&s| s == 0)
                    && packed::available()
                    && kept_packing_enabled()
            })
            .map(|kept| kept.get(b_whole, g.k, g.n));
        let run = |(bi, ms, dst): (usize, Range<usize>, &mut [f32]), threads: Threads| {
            let (ao, bo) = g.batch_offsets(bi);
            let a_rows = MatRef {
                data: a,
                offset: ao + ms.start * g.a_mat.0,
                rs: g.a_mat.0,
                cs: g.a_mat.1,
            };
            match kept {
                Some(pb) => packed::sgemm_packed(ms.len(), a_rows, pb, dst, g.n, threads),
                None => sgemm(
                    ms.len(),
                    g.n,
                    g.k,
                    1.0,
                    a_rows,
                    MatRef {
                        offset: bo,
                        ..b_whole
                    },
                    0.0,
                    MatMut::row_major(dst, 0, g.n),
                    threads,
                ),
            }
            // the fused Add's: after the product, as the Add added it
            if let Some(bias) = bias {
                for row in dst.chunks_mut(g.n) {
                    row.iter_mut().zip(bias).for_each(|(o, &b)| *o += b);
                }
            }
        };
        let threads = rayon::current_num_threads();
        if macs < SMALL_MACS {
            // Waking a worker costs more than the product (a decode step's attention heads).
            pieces.into_iter().for_each(|p| run(p, Threads::Single));
        } else if pieces.len() > 1 && pieces.len() >= threads {
            crate::parallel::for_each_item(pieces, |p| run(p, Threads::Single));
        } else {
            pieces.into_iter().for_each(|p| run(p, Threads::Pool));
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        check_f32("MatMul on GPU", ins)?;
        let g = self.geom(&ins[0].shape, &ins[1].shape)?;
        let stride = |v: usize| u32_of(v, "operand stride");
        let mut base = MatmulParams {
            a_rs: stride(g.a_mat.0)?,
            a_cs: stride(g.a_mat.1)?,
            b_rs: stride(g.b_mat.0)?,
            b_cs: stride(g.b_mat.1)?,
            alpha: 1.0,
            ..bytemuck::Zeroable::zeroed()
        };
        // C is B again (never read: beta 0), or the bias as C with beta 1 on every row
        let mut bound = vec![0, 1, 1];
        if self.bias {
            (base.beta, base.c_rs, base.c_cs, bound[2]) = (1.0, 0, 1, 2);
        }
        let lr = g.logical_rows(rows);
        matmul_kernels(&g, base, bound, lr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::row_count;

    fn fill(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed * 77) >> 20) as f32 / 4096.0
                    - 0.5
            })
            .collect()
    }

    /// numpy.matmul by the book: promote 1-D, broadcast batch with explicit index maths.
    fn naive(a: &Tensor, b: &Tensor) -> Tensor {
        let (sa, sb) = (&a.shape, &b.shape);
        let a2: Vec<usize> = if sa.len() == 1 {
            vec![1, sa[0]]
        } else {
            sa.clone()
        };
        let b2: Vec<usize> = if sb.len() == 1 {
            vec![sb[0], 1]
        } else {
            sb.clone()
        };
        let (m, k, n) = (a2[a2.len() - 2], a2[a2.len() - 1], b2[b2.len() - 1]);
        let rank = (a2.len().max(b2.len())) - 2;
        let pad = |s: &[usize]| {
            let mut v = vec![1; rank - (s.len() - 2)];
            v.extend_from_slice(&s[..s.len() - 2]);
            v
        };
        let (pa, pb) = (pad(&a2), pad(&b2));
        let batch: Vec<usize> = (0..rank).map(|d| pa[d].max(pb[d])).collect();
        let nb: usize = batch.iter().product();
        let (av, bv) = (a.as_f32().unwrap(), b.as_f32().unwrap());
        let mut out = vec![0.0; nb * m * n];
        for bi in 0..nb {
            let mut idx = vec![0; rank];
            let mut r = bi;
            for d in (0..rank).rev() {
                idx[d] = r % batch[d];
                r /= batch[d];
            }
            let (mut ia, mut ib) = (0, 0);
            for d in 0..rank {
                ia = ia * pa[d] + if pa[d] == 1 { 0 } else { idx[d] };
                ib = ib * pb[d] + if pb[d] == 1 { 0 } else { idx[d] };
            }
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0f64;
                    for p in 0..k {
                        s += av[ia * m * k + i * k + p] as f64 * bv[ib * k * n + p * n + j] as f64;
                    }
                    out[(bi * m + i) * n + j] = s as f32;
                }
            }
        }
        let mut shape = batch;
        if sa.len() > 1 {
            shape.push(m);
        }
        if sb.len() > 1 {
            shape.push(n);
        }
        Tensor::f32(&shape, out)
    }

    #[allow(clippy::single_range_in_vec_init)]
    fn check(sa: &[usize], sb: &[usize], want_shape: &[usize]) {
        let a = Tensor::f32(sa, fill(sa.iter().product(), 1));
        let b = Tensor::f32(sb, fill(sb.iter().product(), 2));
        let want = naive(&a, &b);
        assert_eq!(want.shape, want_shape);
        let metas = [&a.meta(), &b.meta()];
        let out_meta = MatMul::default().infer(&metas).unwrap();
        assert_eq!(out_meta[0].shape, want_shape);
        let ax = MatMul::default().split_axis(&metas, &out_meta);
        let rows = row_count(&want.shape, ax);
        // whole, and two pieces cut at an odd row
        let cut = rows / 2 + (rows > 2) as usize;
        // B as given, and (rank >= 2) stored transposed for a MatMul told so.
        let mut cases = vec![(MatMul::default(), b.clone())];
        if sb.len() >= 2 {
            let mut perm: Vec<usize> = (0..sb.len()).collect();
            perm.swap(sb.len() - 2, sb.len() - 1);
            let perms = [None, Some(perm)];
            cases.push((
                MatMul {
                    perms,
                    ..MatMul::default()
                },
                swap_last_two(&b),
            ));
        }
        // Each also told that B is a constant (packed once where the CPU has the kernel).
        let kept: Vec<_> = cases
            .iter()
            .map(|(op, b)| (op.with_constant_b(), b.clone()))
            .collect();
        cases.extend(kept);
        for (op, b) in cases {
            assert_eq!(op.infer(&[&a.meta(), &b.meta()]).unwrap(), out_meta);
            for ranges in [vec![0..rows], vec![0..cut, cut..rows]] {
                let mut out = vec![Tensor::zeros(DType::F32, want_shape)];
                for r in ranges {
                    op.cpu(&[&a, &b], &mut out, r).unwrap();
                }
                for (g, w) in out[0].as_f32().unwrap().iter().zip(want.as_f32().unwrap()) {
                    assert!((g - w).abs() < 1e-4, "{op:?} {sa:?}x{sb:?}: {g} vs {w}");
                }
            }
        }
    }

    /// `t` with its last two axes swapped (a copy), by index arithmetic.
    fn swap_last_two(t: &Tensor) -> Tensor {
        let r = t.shape.len();
        let (rows, cols) = (t.shape[r - 2], t.shape[r - 1]);
        let v = t.as_f32().unwrap();
        let mut out = vec![0.0; v.len()];
        for (bi, block) in out.chunks_mut((rows * cols).max(1)).enumerate() {
            for i in 0..rows {
                for j in 0..cols {
                    block[j * rows + i] = v[bi * rows * cols + i * cols + j];
                }
            }
        }
        let mut shape = t.shape.clone();
        shape.swap(r - 2, r - 1);
        Tensor::f32(&shape, out)
    }

    #[test]
    fn matmul_matches_numpy_semantics() {
        check(&[3, 4], &[4, 5], &[3, 5]);
        check(&[4], &[4, 5], &[5]);
        check(&[3, 4], &[4], &[3]);
        check(&[4], &[4], &[]);
        check(&[2, 1, 7, 9], &[3, 9, 5], &[2, 3, 7, 5]);
        check(&[12, 1, 64], &[12, 64, 33], &[12, 1, 33]);
        check(&[2, 3, 4], &[4], &[2, 3]);
        check(&[4], &[2, 4, 6], &[2, 6]);
        check(&[67, 130], &[130, 71], &[67, 71]);
        check(&[0, 4], &[4, 5], &[0, 5]);
        // Large enough for the packed kernel: batched A over one B, row and column tails.
        check(&[3, 21, 64], &[64, 100], &[3, 21, 100]);
        check(&[2, 1, 9, 40], &[40, 49], &[2, 1, 9, 49]);
    }

    #[test]
    fn a_row_range_writes_only_its_rows() {
        let a = Tensor::f32(&[2, 3, 4], fill(24, 3));
        let b = Tensor::f32(&[4, 2], fill(8, 4));
        let mut out = vec![Tensor::f32(&[2, 3, 2], vec![9.0; 12])];
        MatMul::default().cpu(&[&a, &b], &mut out, 2..5).unwrap();
        let want = naive(&a, &b);
        let (o, w) = (out[0].as_f32().unwrap(), want.as_f32().unwrap());
        for i in 0..12 {
            if (4..10).contains(&i) {
                assert!((o[i] - w[i]).abs() < 1e-5);
            } else {
                assert_eq!(o[i], 9.0);
            }
        }
    }

    #[test]
    fn bad_shapes_are_invalid() {
        let a = TensorMeta::new(DType::F32, vec![3, 4]);
        let b = TensorMeta::new(DType::F32, vec![5, 2]);
        assert!(matches!(
            MatMul::default().infer(&[&a, &b]),
            Err(OpError::Invalid(_))
        ));
        let s = TensorMeta::new(DType::F32, vec![]);
        assert!(MatMul::default().infer(&[&s, &b]).is_err());
    }

    #[test]
    fn cpu_adapters_read_aligned_operands_as_vec4s() {
        let f = |s: &[usize]| TensorMeta::new(DType::F32, s.to_vec());
        let shader = |op: &MatMul, a: &[usize], b: &[usize]| {
            let (a, b) = (f(a), f(b));
            let outs = op.infer(&[&a, &b]).unwrap();
            let rows = crate::shape::row_count(&outs[0].shape, op.split_axis(&[&a, &b], &outs));
            let k = op.gpu(&[&a, &b], &outs, 0..rows).unwrap();
            (k[0].shader.name, k[0].for_adapter(true)[0].shader.name)
        };
        let mm = MatMul::default();
        // A's rows fit uniform windows: matmul_window.wgsl (matmul_windows.rs tests when);
        // GPUs stage tiles in workgroup memory from 32 rows (matmul_tiled.wgsl)
        assert_eq!(
            shader(&mm, &[70, 20], &[20, 68]),
            ("matmul_tiled", super::windows::tests::window_shader())
        );
        assert_eq!(shader(&mm, &[31, 20], &[20, 68]).0, "matmul");
        assert_eq!(shader(&mm, &[32, 20], &[20, 68]).0, "matmul_tiled");
        assert_eq!(
            shader(&mm, &[2, 3, 9, 8], &[3, 8, 12]),
            ("matmul", "matmul_vec4")
        );
        // K not a multiple of 4 with A's rows contiguous: the window kernel, A a float at a
        // time (K_UNALIGNED); N or a batch offset not a multiple of 4, or B read through a
        // transpose: floats.
        assert_eq!(
            shader(&mm, &[70, 21], &[21, 68]),
            ("matmul_tiled", super::windows::tests::window_shader())
        );
        assert_eq!(
            shader(&mm, &[70, 20], &[20, 66]),
            ("matmul_tiled", "matmul")
        );
        assert_eq!(shader(&mm, &[3, 1, 8], &[3, 8, 12]).1, "matmul_vec4");
        assert_eq!(shader(&mm, &[3, 1, 8], &[3, 8, 10]).1, "matmul");
        let bt = MatMul {
            perms: [None, Some(vec![1, 0])],
            ..MatMul::default()
        };
        assert_eq!(shader(&bt, &[70, 20], &[68, 20]).1, "matmul");
        // A read through a transpose: no window either
        let at = MatMul {
            perms: [Some(vec![1, 0]), None],
            ..MatMul::default()
        };
        assert_eq!(shader(&at, &[20, 72], &[20, 68]).1, "matmul");
    }

    #[test]
    fn gpu_kernel_covers_rows_with_tiles() {
        let a = TensorMeta::new(DType::F32, vec![2, 100, 8]);
        let b = TensorMeta::new(DType::F32, vec![8, 70]);
        let out = MatMul::default().infer(&[&a, &b]).unwrap();
        let k = MatMul::default().gpu(&[&a, &b], &out, 150..170).unwrap();
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].workgroups, [2, 1, 1]);
        assert_eq!(k[0].params.len(), std::mem::size_of::<MatmulParams>());
        let k = MatMul::default().gpu(&[&a, &b], &out, 50..170).unwrap();
        assert_eq!(k[0].workgroups, [2, 2, 2]);
    }
}
