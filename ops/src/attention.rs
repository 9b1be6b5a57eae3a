//! Scaled dot-product attention as one node: `softmax(Q @ Kt ÷ c + mask) @ V` (or `× c`, or no
//! scale; mask optional, added or selecting: [`Masking`]), what the runtime's fusion pass makes
//! of an attention block's MatMul, Div or Mul, Add or Where, Softmax (last axis), MatMul chain
//! (`fuse/attention.rs` in `tandem`).
//!
//! Sits between that pass and the shared CPU GEMM ([`crate::cpu_gemm`]) / `attention.wgsl`
//! (`attention_rows.wgsl`, or `attention_rows_vec4.wgsl` where Q, Kt and V are aligned, on
//! adapters that run shaders on the CPU).
//! Why: unfused, every head's `[Sq, Sk]` scores are written and read back four times (the
//! MatMul, the scale, the mask, the Softmax), 786 KB per node for minilm's 12 heads at 128
//! tokens, into host buffers last touched a layer earlier. Here the CPU computes a block of a
//! head's query rows at a time: the scores into a scratch of the calling thread (`sgemm`),
//! scaled, masked and normalised there, then `P @ V` straight into the output, so they never
//! leave the core's cache.
//!
//! Semantics are the unfused nodes': Q, Kt and V are read through the permutations of folded
//! Transposes (as [`crate::matmul::MatMul::perms`]), every operand broadcasts as MatMul's batch
//! dimensions and Add do (numpy, right-aligned; the mask may broadcast the scores' rows and
//! columns too, and they its), the scale divides or multiplies as the Div or Mul did, the mask
//! adds or selects as the Add or Where did, and the Softmax is the Softmax kernel's on AVX2 and
//! AVX-512 with an FMA exp, two rows at a time (`exp_fma::softmax_rows`: within 1e-6 of
//! `softmax::lane`, not bit for bit; the lane itself elsewhere). Operands must have rank >= 2
//! (the pass only fuses where their ranks are known to be). Inputs: Q, Kt, V, and the mask
//! when given (f32 to add, bool to select); output `[batch..., Sq, Dv]`, split by rows
//! (`b * Sq + i`).

use crate::cpu_gemm::{sgemm, MatMut, MatRef, Threads};
use crate::matmul::{check_f32, f32_in, f32_out, u32_of};
use crate::shape::{broadcast_shapes, grid_1d, permuted, strides};
use crate::{DType, Data, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use std::ops::Range;

/// How the scores are scaled before the mask: as the Div or Mul node the pass absorbed did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    None,
    Mul(f32),
    Div(f32),
}

/// How the fourth input, when given, masks the scaled scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Masking {
    /// `score + mask`, an f32 mask: the absorbed Add.
    Add,
    /// `mask == keep ? score : fill`, a bool mask: the absorbed `Where(mask, score, fill)`
    /// (`keep` true) or `Where(mask, fill, score)` (`keep` false) of a scalar constant `fill`
    /// (tiny Llama's causal mask and its large negative).
    Select { fill: f32, keep: bool },
}

/// See the module doc.
#[derive(Debug, Clone, PartialEq)]
pub struct Attention {
    /// Permutations Q, Kt and V are read through (folded Transposes), `None` for as stored.
    pub perms: [Option<Vec<usize>>; 3],
    pub scale: Scale,
    /// What the mask input does (read only when there is one).
    pub masking: Masking,
}

/// The mask input as the CPU kernel reads it.
#[derive(Debug, Clone, Copy)]
enum MaskData<'a> {
    None,
    Add(&'a [f32]),
    Select(&'a [bool], f32, bool),
}

/// Score elements per CPU task: a block's scores (twice, 128 KiB) stay in L2. Blocks take
/// whole heads up to Sk = 128 (each `sgemm` packs its Kt and V again), else fewer query rows.
const BLOCK: usize = 1 << 14;
/// Below this many multiply-adds the rows run on the calling thread (a decode step).
const SMALL_MACS: usize = 1 << 17;

/// One operand's element strides per output batch dimension (0 where broadcast) and along its
/// two matrix dimensions.
#[derive(Debug, Clone, Default, PartialEq)]
struct Strided {
    bs: Vec<usize>,
    rs: usize,
    cs: usize,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Geom {
    batch: Vec<usize>,
    sq: usize,
    sk: usize,
    d: usize,
    dv: usize,
    q: Strided,
    k: Strided,
    v: Strided,
    mask: Option<Strided>,
}

impl Geom {
    fn batches(&self) -> usize {
        self.batch.iter().product()
    }

    fn out_shape(&self) -> Vec<usize> {
        let mut s = self.batch.clone();
        s.extend([self.sq, self.dv]);
        s
    }

    /// Offsets of batch `bi` (flat over the output batch dims) in Q, Kt, V and the mask.
    fn offsets(&self, mut bi: usize) -> [usize; 4] {
        let mut o = [0; 4];
        for d in (0..self.batch.len()).rev() {
            let idx = bi % self.batch[d];
            bi /= self.batch[d];
            o[0] += idx * self.q.bs[d];
            o[1] += idx * self.k.bs[d];
            o[2] += idx * self.v.bs[d];
            o[3] += idx * self.mask.as_ref().map_or(0, |m| m.bs[d]);
        }
        o
    }
}

/// Strides of an operand of `shape` (element strides `st`) read as `target` (right-aligned,
/// 0 on dimensions it broadcasts), split into batch strides and the last two.
fn aligned(shape: &[usize], st: &[usize], target: &[usize]) -> Strided {
    let off = target.len() - shape.len();
    let mut all: Vec<usize> = (0..target.len())
        .map(|t| match t.checked_sub(off) {
            Some(i) if shape[i] != 1 => st[i],
            _ => 0,
        })
        .collect();
    let cs = all.pop().unwrap_or(0);
    let rs = all.pop().unwrap_or(0);
    Strided { bs: all, rs, cs }
}

impl Attention {
    fn geom(&self, ins: &[&TensorMeta]) -> Result<Geom> {
        let read = |i: usize| {
            let (shape, st) = permuted(&ins[i].shape, self.perms[i].as_deref(), "Attention")?;
            match shape.len() {
                0 | 1 => Err(OpError::Unsupported(format!(
                    "Attention: operand {i} has shape {shape:?}; the fused node needs rank >= 2"
                ))),
                _ => Ok((shape, st)),
            }
        };
        let ((q, q_st), (k, k_st), (v, v_st)) = (read(0)?, read(1)?, read(2)?);
        let last2 = |s: &[usize]| (s[s.len() - 2], s[s.len() - 1]);
        let ((sq0, d), (d2, sk0), (vk, dv)) = (last2(&q), last2(&k), last2(&v));
        if d != d2 {
            return Err(OpError::Invalid(format!(
                "Attention (Q @ Kt): inner dimensions differ: Q {q:?}, Kt {k:?}"
            )));
        }
        let batch_of = |s: &[usize]| s[..s.len() - 2].to_vec();
        let mut scores = broadcast_shapes(&[&batch_of(&q), &batch_of(&k)])?;
        scores.extend([sq0, sk0]);
        let mask = ins.get(3).map(|m| m.shape.clone());
        if let Some(m) = &mask {
            scores = broadcast_shapes(&[&scores, m])?;
        }
        let (sq, sk) = last2(&scores);
        if vk != sk {
            return Err(OpError::Invalid(format!(
                "Attention (P @ V): inner dimensions differ: scores {scores:?}, V {v:?}"
            )));
        }
        let batch = broadcast_shapes(&[&batch_of(&scores), &batch_of(&v)])?;
        let with = |a: usize, b: usize| {
            let mut t = batch.clone();
            t.extend([a, b]);
            t
        };
        Ok(Geom {
            q: aligned(&q, &q_st, &with(sq, d)),
            k: aligned(&k, &k_st, &with(d, sk)),
            v: aligned(&v, &v_st, &with(sk, dv)),
            mask: mask.map(|m| aligned(&m, &strides(&m), &with(sq, sk))),
            batch,
            sq,
            sk,
            d,
            dv,
        })
    }

    /// Output rows `qs` of batch `b` into `dst` (`qs.len() x Dv`); see the module doc.
    fn block(
        &self,
        g: &Geom,
        data: ([&[f32]; 3], MaskData),
        b: usize,
        qs: Range<usize>,
        dst: &mut [f32],
    ) {
        let [qo, ko, vo, mo] = g.offsets(b);
        let (n, sk) = (qs.len(), g.sk);
        // Scratch of this thread, kept between calls (`sgemm` overwrites it: beta 0).
        thread_local!(static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) });
        SCRATCH.with_borrow_mut(|scratch| {
            if scratch.len() < 2 * n * sk {
                scratch.resize(2 * n * sk, 0.0);
            }
            let (s, p) = scratch[..2 * n * sk].split_at_mut(n * sk);
            self.scores_then_values(g, data, [qo, ko, vo, mo], qs, (s, p), dst);
        });
    }

    /// [`Attention::block`] with its scratch: scores into `s`, probabilities into `p`.
    fn scores_then_values(
        &self,
        g: &Geom,
        ([q, k, v], mask): ([&[f32]; 3], MaskData),
        [qo, ko, vo, mo]: [usize; 4],
        qs: Range<usize>,
        (s, p): (&mut [f32], &mut [f32]),
        dst: &mut [f32],
    ) {
        let (n, sk) = (qs.len(), g.sk);
        let view = |data, offset, t: &Strided| MatRef {
            data,
            offset,
            rs: t.rs,
            cs: t.cs,
        };
        let q_rows = view(q, qo + qs.start * g.q.rs, &g.q);
        let scores = MatMut::row_major(s, 0, sk);
        sgemm(
            n,
            sk,
            g.d,
            1.0,
            q_rows,
            view(k, ko, &g.k),
            0.0,
            scores,
            Threads::Single,
        );
        if sk > 0 {
            for (i, row) in s.chunks_mut(sk).enumerate() {
                let m = g
                    .mask
                    .as_ref()
                    .map_or((0, 0), |m| (mo + (qs.start + i) * m.rs, m.cs));
                scale_and_mask(row, self.scale, mask, m);
            }
            crate::exp_fma::softmax_rows(s, p, sk);
        }
        let probs = MatRef::row_major(p, 0, sk);
        let out = MatMut::row_major(dst, 0, g.dv);
        sgemm(
            n,
            g.dv,
            sk,
            1.0,
            probs,
            view(v, vo, &g.v),
            0.0,
            out,
            Threads::Single,
        );
    }
}

crate::simd::kernel! {
    /// `row = row ÷ c (or × c)`, then masked by element `at + j * step` of the mask
    /// (`mask_at` = `(at, step)`), as the unfused Div or Mul and Add or Where compute it;
    /// widest vectors (`crate::simd`).
    fn scale_and_mask(row: &mut [f32], scale: Scale, mask: MaskData, mask_at: (usize, usize)) {
        match scale {
            Scale::Mul(c) => row.iter_mut().for_each(|x| *x *= c),
            Scale::Div(c) => row.iter_mut().for_each(|x| *x /= c),
            Scale::None => {}
        }
        let (n, (at, step)) = (row.len(), mask_at);
        match mask {
            MaskData::Add(m) if step == 1 => {
                for (x, m) in row.iter_mut().zip(&m[at..at + n]) {
                    *x += m;
                }
            }
            MaskData::Add(m) => {
                for (j, x) in row.iter_mut().enumerate() {
                    *x += m[at + j * step];
                }
            }
            MaskData::Select(c, fill, keep) if step == 1 => {
                for (x, &c) in row.iter_mut().zip(&c[at..at + n]) {
                    *x = if c == keep { *x } else { fill };
                }
            }
            MaskData::Select(c, fill, keep) => {
                for (j, x) in row.iter_mut().enumerate() {
                    if c[at + j * step] != keep {
                        *x = fill;
                    }
                }
            }
            MaskData::None => {}
        }
    }
}

/// `attention.wgsl` parameters (layout mirrored there).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionParams {
    sq: u32,
    sk: u32,
    d: u32,
    dv: u32,
    row_start: u32,
    rows: u32,
    nbd: u32,
    scale: f32,
    q_rs: u32,
    q_cs: u32,
    k_rs: u32,
    k_cs: u32,
    v_rs: u32,
    v_cs: u32,
    m_rs: u32,
    m_cs: u32,
    fill: f32,
    keep: u32,
    _pad: [u32; 2],
    bshape: [u32; 8],
    q_bs: [u32; 8],
    k_bs: [u32; 8],
    v_bs: [u32; 8],
    m_bs: [u32; 8],
}

/// The most value elements (Dv) one GPU invocation accumulates (its private array).
pub const GPU_MAX_DV: usize = 128;

/// Query rows an invocation of `attention_rows.wgsl`, the kernel for adapters that run shaders
/// on the CPU (fewer when Sq is smaller).
const ROWS_PER_INVOCATION: usize = 4;

/// The most vec4s of a Q row (D) and of an output row (Dv) `attention_rows.wgsl` keeps in
/// registers; other sizes, and D or Dv not a multiple of 4, run `attention.wgsl` there too.
const ROWS_MAX_D4: usize = 16;

impl Op for Attention {
    fn name(&self) -> &'static str {
        "Attention"
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        if !(3..=4).contains(&ins.len()) {
            return Err(OpError::Invalid(format!(
                "Attention takes 3 or 4 inputs (Q, Kt, V, mask), got {}",
                ins.len()
            )));
        }
        check_f32("Attention", &ins[..3])?;
        if let Some(m) = ins.get(3) {
            let want = match self.masking {
                Masking::Add => DType::F32,
                Masking::Select { .. } => DType::Bool,
            };
            if m.dtype != want {
                return Err(OpError::Unsupported(format!(
                    "Attention: the mask has dtype {}, {:?} masking needs {want}",
                    m.dtype, self.masking
                )));
            }
        }
        Ok(vec![TensorMeta::new(
            DType::F32,
            self.geom(ins)?.out_shape(),
        )])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        let flops = self.geom(ins).map_or(0, |g| {
            let rows = (g.batches() * g.sq * g.sk) as u64;
            rows * (2 * (g.d + g.dv) as u64 + 6)
        });
        Work {
            flops,
            bytes_read: ins.iter().map(|i| i.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        Some(self.geom(ins).ok()?.batch.len())
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
        let g = self.geom(&metas.iter().collect::<Vec<_>>())?;
        let qkv = [
            f32_in("Attention", ins[0])?,
            f32_in("Attention", ins[1])?,
            f32_in("Attention", ins[2])?,
        ];
        let mask = match (ins.get(3), self.masking) {
            (None, _) => MaskData::None,
            (Some(m), Masking::Add) => MaskData::Add(f32_in("Attention", m)?),
            (Some(m), Masking::Select { fill, keep }) => match &m.data {
                Data::Bool(c) => MaskData::Select(c, fill, keep),
                _ => {
                    return Err(OpError::Unsupported(format!(
                        "Attention: a selecting mask must be bool, not {}",
                        m.dtype()
                    )))
                }
            },
        };
        let data = (qkv, mask);
        let out = f32_out("Attention", &mut outs[0])?;
        let total = g.batches() * g.sq;
        let rows = rows.start.min(total)..rows.end.min(total);
        if rows.is_empty() || g.dv == 0 {
            return Ok(());
        }
        // Tasks of at most ROWS query rows within one batch, each with its block of the output.
        let mut tasks = Vec::new();
        let mut rest = &mut out[rows.start * g.dv..rows.end * g.dv];
        let mut r = rows.start;
        while r < rows.end {
            let (b, i) = (r / g.sq, r % g.sq);
            let n = (BLOCK / g.sk.max(1)).max(8).min(g.sq - i).min(rows.end - r);
            let (dst, tail) = rest.split_at_mut(n * g.dv);
            tasks.push((b, i..i + n, dst));
            rest = tail;
            r += n;
        }
        let run =
            |(b, qs, dst): (usize, Range<usize>, &mut [f32])| self.block(&g, data, b, qs, dst);
        if rows.len() * g.sk * (g.d + g.dv) < SMALL_MACS || tasks.len() == 1 {
            tasks.into_iter().for_each(run);
        } else {
            crate::parallel::for_each_item(tasks, run);
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let g = self.geom(ins)?;
        let total = g.batches() * g.sq;
        let rows = rows.start.min(total)..rows.end.min(total);
        if rows.is_empty() || g.dv == 0 {
            return Ok(Vec::new());
        }
        let unsupported =
            |why: String| Err(OpError::Unsupported(format!("Attention on GPU: {why}")));
        if g.dv > GPU_MAX_DV {
            return unsupported(format!(
                "{} value elements per row, at most {GPU_MAX_DV}",
                g.dv
            ));
        }
        if g.batch.len() > 8 {
            return unsupported(format!("more than 8 batch dims ({:?})", g.batch));
        }
        let u = |v: usize| u32_of(v, "Attention size");
        let (scale_mode, scale) = match self.scale {
            Scale::None => (0, 1.0),
            Scale::Mul(c) => (1, c),
            Scale::Div(c) => (2, c),
        };
        let m = g.mask.clone().unwrap_or_default();
        let (masked, fill, keep) = match (g.mask.is_some(), self.masking) {
            (false, _) => (0, 0.0, 0),
            (true, Masking::Add) => (1, 0.0, 0),
            (true, Masking::Select { fill, keep }) => (2, fill, keep as u32),
        };
        let mut p = AttentionParams {
            sq: u(g.sq)?,
            sk: u(g.sk)?,
            d: u(g.d)?,
            dv: u(g.dv)?,
            row_start: u(rows.start)?,
            rows: u(rows.len())?,
            nbd: g.batch.len() as u32,
            scale,
            q_rs: u(g.q.rs)?,
            q_cs: u(g.q.cs)?,
            k_rs: u(g.k.rs)?,
            k_cs: u(g.k.cs)?,
            v_rs: u(g.v.rs)?,
            v_cs: u(g.v.cs)?,
            m_rs: u(m.rs)?,
            m_cs: u(m.cs)?,
            fill,
            keep,
            _pad: [0; 2],
            bshape: [0; 8],
            q_bs: [0; 8],
            k_bs: [0; 8],
            v_bs: [0; 8],
            m_bs: [0; 8],
        };
        for d in 0..g.batch.len() {
            p.bshape[d] = u(g.batch[d])?;
            p.q_bs[d] = u(g.q.bs[d])?;
            p.k_bs[d] = u(g.k.bs[d])?;
            p.v_bs[d] = u(g.v.bs[d])?;
            p.m_bs[d] = u(m.bs.get(d).copied().unwrap_or(0))?;
        }
        // The mask binds only when given; the shader then reads Q in its place, never used.
        let inputs = if g.mask.is_some() {
            vec![0, 1, 2, 3]
        } else {
            vec![0, 1, 2, 0]
        };
        // 0 none, 1 multiply, 2 divide; 0 no mask, 1 added, 2 selecting (`fill`, `keep`).
        let modes = |k: GpuKernel| {
            k.with_override("SCALE_MODE", scale_mode as f64)
                .with_override("MASKED", masked as f64)
        };
        let wg = grid_1d(rows.len() as u64, 64);
        let kernel = modes(GpuKernel::new(
            tandem_shaders::ATTENTION,
            inputs.clone(),
            vec![0],
            &p,
            wg,
        ));
        // R query rows an invocation, their Q and output rows in registers, where shaders run
        // on the CPU and every load is a gather: each Kt and V element loaded serves R rows
        // (minilm's attention nodes on lavapipe in 0.35-0.45x the time), read as vec4s where
        // aligned (0.35-0.6x again).
        let fits = |n: usize| n.is_multiple_of(4) && (4..=4 * ROWS_MAX_D4).contains(&n);
        if g.sk == 0 || !fits(g.d) || !fits(g.dv) {
            return Ok(vec![kernel]);
        }
        let r = ROWS_PER_INVOCATION.min(g.sq);
        let block = |row: usize| (row / g.sq) * g.sq.div_ceil(r) + (row % g.sq) / r;
        let blocks = block(rows.end - 1) + 1 - block(rows.start);
        // Kt and V from textures where they fit one (0.4-0.5x the vec4 loads' time on lavapipe,
        // docs/bench.md), else as vec4s where aligned.
        let textures =
            vec4_fits(&g) && (ins[1..3].iter()).all(|t| crate::gpu_kernel::texture_fits(t.numel()));
        let shader = match (textures, vec4_fits(&g)) {
            (true, _) => tandem_shaders::ATTENTION_ROWS_TEXTURE,
            (false, true) => tandem_shaders::ATTENTION_ROWS_VEC4,
            (false, false) => tandem_shaders::ATTENTION_ROWS,
        };
        let on_cpu = modes(GpuKernel::new(
            shader,
            inputs,
            vec![0],
            &p,
            grid_1d(blocks as u64, 64),
        ))
        .with_override("R", r as f64)
        .with_override("D4", (g.d / 4) as f64)
        .with_override("DV4", (g.dv / 4) as f64);
        let on_cpu = match textures {
            true => on_cpu.with_texture_inputs(&[1, 2]),
            false => on_cpu,
        };
        Ok(vec![kernel.with_cpu_adapter_variant(on_cpu)])
    }
}

/// Whether `attention_rows_vec4.wgsl` can read Q, Kt and V of `g` as vec4s: contiguous along
/// D and Dv, every other stride a multiple of 4.
fn vec4_fits(g: &Geom) -> bool {
    let four = |v: &usize| v.is_multiple_of(4);
    let (q, k, v) = (&g.q, &g.k, &g.v);
    q.cs == 1
        && k.rs == 1
        && v.cs == 1
        && [q.rs, k.cs, v.rs].iter().all(four)
        && q.bs.iter().chain(&k.bs).chain(&v.bs).all(four)
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
