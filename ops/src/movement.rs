//! Shared machinery of the data movement family (view, transpose, concat/split, slice, expand,
//! tile, gather, pad, resize, generate): the one dtype dispatch of its CPU kernels and the
//! strided index map that Transpose, Slice, Expand, Tile, Concat and Split all reduce to.
//!
//! Sits between those operator files and `tensor.rs` (host data) / `index_map.wgsl` (GPU).

use crate::shape::grid_1d;
use crate::{DType, Data, GpuKernel, OpError, Result, Tensor, TensorMeta};

/// Below this many output bytes a data movement kernel runs on the calling thread: handing
/// work to a rayon worker (a wake-up, then a join) costs microseconds, more than copying this
/// much (a decode step's KV-cache Concat and Transpose outputs are ~64 KiB).
pub const INLINE_BYTES: usize = 96 << 10;

/// Elements per parallel piece of a copy whose outer rows may be few: a batch-1 Concat or
/// Split along channels is one row, so pieces, not rows, are what keep every thread copying.
pub const PIECE: usize = 16_384;

/// Fills `piece`, whose first element is output element `at`, from contiguous source runs:
/// `source(i)` is the input slice that output element `i` starts, to the end of the run it
/// belongs to. How Concat and Split copy a [`PIECE`] that spans several rows and inputs.
pub fn copy_runs<'a, T: Copy + 'a>(
    piece: &mut [T],
    mut at: usize,
    source: impl Fn(usize) -> &'a [T],
) {
    let mut done = 0;
    while done < piece.len() {
        let run = source(at);
        let n = run.len().min(piece.len() - done);
        piece[done..done + n].copy_from_slice(&run[..n]);
        done += n;
        at += n;
    }
}

/// True when `n` elements of `T` are few enough for the calling thread ([`INLINE_BYTES`]).
pub fn run_inline<T>(n: usize) -> bool {
    n.saturating_mul(std::mem::size_of::<T>()) < INLINE_BYTES
}

/// `f(i, piece)` for `out` cut into `chunk`-long pieces (the last may be shorter; `chunk` 0 is
/// taken as 1): on the calling thread when `out` is small ([`run_inline`]), else in parallel on
/// the current rayon pool. The one place the movement kernels choose between the two.
pub fn for_each_chunk<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunk = chunk.max(1);
    if run_inline::<T>(out.len()) {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    } else {
        crate::parallel::for_each_chunk_mut(out, chunk, f);
    }
}

/// Element types the data movement kernels are generic over.
pub trait Elem: Copy + Default + Send + Sync + 'static {}
impl<T: Copy + Default + Send + Sync + 'static> Elem for T {}

/// A CPU kernel written once over its element type. [`with_same_type`] picks `T` from the
/// output tensor and hands the inputs over as slices of the same `T`.
pub trait SameTypeKernel {
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()>;
}

/// Runs `kernel` on `ins` (all of `out`'s dtype, else `Invalid` naming `op`) and `out`:
/// the single place where the data movement family matches on [`Data`] variants.
pub fn with_same_type<K: SameTypeKernel>(
    op: &str,
    kernel: &K,
    ins: &[&Data],
    out: &mut Data,
) -> Result<()> {
    fn pick<'a, T>(
        op: &str,
        ins: &[&'a Data],
        want: DType,
        get: fn(&'a Data) -> Option<&'a [T]>,
    ) -> Result<Vec<&'a [T]>> {
        ins.iter()
            .map(|d| {
                get(d).ok_or_else(|| {
                    OpError::Invalid(format!(
                        "{op}: input dtype {} differs from output dtype {want}",
                        d.dtype()
                    ))
                })
            })
            .collect()
    }
    let want = out.dtype();
    match out {
        Data::F32(o) => kernel.run(
            &pick(op, ins, want, |d| match d {
                Data::F32(v) => Some(v),
                _ => None,
            })?,
            o,
        ),
        Data::F16(o) => kernel.run(
            &pick(op, ins, want, |d| match d {
                Data::F16(v) => Some(v),
                _ => None,
            })?,
            o,
        ),
        Data::F64(o) => kernel.run(
            &pick(op, ins, want, |d| match d {
                Data::F64(v) => Some(v),
                _ => None,
            })?,
            o,
        ),
        Data::I64(o) => kernel.run(
            &pick(op, ins, want, |d| match d {
                Data::I64(v) => Some(v),
                _ => None,
            })?,
            o,
        ),
        Data::I32(o) => kernel.run(
            &pick(op, ins, want, |d| match d {
                Data::I32(v) => Some(v),
                _ => None,
            })?,
            o,
        ),
        Data::I8(o) => kernel.run(
            &pick(op, ins, want, |d| match d {
                Data::I8(v) => Some(v),
                _ => None,
            })?,
            o,
        ),
        Data::U8(o) => kernel.run(
            &pick(op, ins, want, |d| match d {
                Data::U8(v) => Some(v),
                _ => None,
            })?,
            o,
        ),
        Data::Bool(o) => kernel.run(
            &pick(op, ins, want, |d| match d {
                Data::Bool(v) => Some(v),
                _ => None,
            })?,
            o,
        ),
    }
}

/// Element `i` of `t` as the 4-byte word the GPU holds for it (f32 bits for floats, i32 for
/// integers, 0/1 for bool): used to pass fill values (Pad, ConstantOfShape) in params.
pub fn gpu_word(t: &Tensor, i: usize) -> u32 {
    match &t.data {
        Data::F32(v) => v[i].to_bits(),
        Data::F16(v) => v[i].to_f32().to_bits(),
        Data::F64(v) => (v[i] as f32).to_bits(),
        Data::I64(v) => v[i] as i32 as u32,
        Data::I32(v) => v[i] as u32,
        Data::I8(v) => v[i] as i32 as u32,
        Data::U8(v) => v[i] as u32,
        Data::Bool(v) => v[i] as u32,
    }
}

/// The contents of input `name` of `op`, which must be known at plan time.
pub fn plan_value<'a>(op: &str, name: &str, meta: &'a TensorMeta) -> Result<&'a Tensor> {
    meta.value.as_deref().ok_or_else(|| {
        OpError::Unsupported(format!(
            "{op}: input `{name}` must be known at plan time (constant or computed from shapes)"
        ))
    })
}

/// Metas for re-running plan-time logic inside `cpu()`: input 0 (the data) without contents,
/// the others (small shape-like inputs) as constants.
pub fn cpu_metas(ins: &[&Tensor]) -> Vec<TensorMeta> {
    ins.iter()
        .enumerate()
        .map(|(i, t)| {
            if i == 0 {
                t.meta()
            } else {
                TensorMeta::constant((*t).clone())
            }
        })
        .collect()
}

/// True when an optional input is absent: not given, or given as the empty placeholder.
pub fn absent(ins: &[&TensorMeta], i: usize) -> bool {
    ins.get(i)
        .is_none_or(|m| m.numel() == 0 && m.rank() == 1 && m.value.is_some())
}

/// Largest element count a GPU kernel indexes with its u32/i32 arithmetic.
pub const GPU_MAX_ELEMS: usize = i32::MAX as usize;

/// Fails with `Unsupported` when a tensor is too large for 32-bit GPU indexing.
pub fn check_gpu_size(op: &str, metas: &[&TensorMeta]) -> Result<()> {
    match metas.iter().find(|m| m.numel() > GPU_MAX_ELEMS) {
        Some(m) => Err(OpError::Unsupported(format!(
            "{op} on GPU: tensor of shape {:?} exceeds 2^31 elements",
            m.shape
        ))),
        None => Ok(()),
    }
}

/// Packs up to 8 values into a uniform array slot (`array<vec4<u32>, 2>` in WGSL).
pub fn pack8<T: Copy + Default>(op: &str, v: &[T]) -> Result<[T; 8]> {
    if v.len() > 8 {
        return Err(OpError::Unsupported(format!(
            "{op} on GPU: rank {} exceeds 8 dimensions",
            v.len()
        )));
    }
    let mut a = [T::default(); 8];
    a[..v.len()].copy_from_slice(v);
    Ok(a)
}

/// A strided gather over a virtual index space of shape `dims`: virtual element `c` (row-major
/// coordinates `c_d`) reads `src[in_base + sum x_d * in_stride[d]]` with
/// `x_d = (offset[d] + c_d * step[d]) mod modulo[d]` (`modulo` 0: none) and writes
/// `out[out_base + sum c_d * out_stride[d]]`. Transpose, Slice, Expand and Tile use contiguous
/// output strides; Concat (per input) and Split (per output) use a strided side.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexMap {
    pub dims: Vec<usize>,
    pub in_stride: Vec<usize>,
    pub out_stride: Vec<usize>,
    pub offset: Vec<i64>,
    pub step: Vec<i64>,
    pub modulo: Vec<usize>,
    pub in_base: usize,
    pub out_base: usize,
}

/// Parameters of `index_map.wgsl` (layout mirrors its `Params`).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct IndexMapParams {
    pub dims: [u32; 8],
    pub in_stride: [u32; 8],
    pub out_stride: [u32; 8],
    pub offset: [i32; 8],
    pub step: [i32; 8],
    pub modulo: [u32; 8],
    pub start: u32,
    pub count: u32,
    pub in_base: u32,
    pub out_base: u32,
    pub _pad: [u32; 4],
}

/// Parameters of `copy_vec4.wgsl` (in vec4s).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct CopyVec4Params {
    src_first: u32,
    out_first: u32,
    count: u32,
    _pad: u32,
}

/// Parameters of `copy.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CopyParams {
    pub start: u32,
    pub count: u32,
    pub _pad: [u32; 2],
}

/// The `copy.wgsl` dispatch copying elements `start..start + count` of input `input` to the
/// same positions of output `output`.
pub fn copy_kernel(input: usize, output: usize, start: usize, count: usize) -> GpuKernel {
    let p = CopyParams {
        start: start as u32,
        count: count as u32,
        _pad: [0; 2],
    };
    GpuKernel::new(
        tandem_shaders::COPY,
        vec![input],
        vec![output],
        &p,
        grid_1d(count as u64, 64),
    )
    .with_override("WG", 64.0)
}

impl IndexMap {
    /// The identity walk of `dims` reading with `in_stride` and writing contiguously.
    pub fn new(dims: &[usize], in_stride: Vec<usize>) -> IndexMap {
        let r = dims.len();
        IndexMap {
            dims: dims.to_vec(),
            in_stride,
            out_stride: crate::shape::strides(dims),
            offset: vec![0; r],
            step: vec![1; r],
            modulo: vec![0; r],
            in_base: 0,
            out_base: 0,
        }
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    fn coord(&self, d: usize, c: usize) -> usize {
        let x = self.offset[d] + c as i64 * self.step[d];
        if self.modulo[d] != 0 {
            x.rem_euclid(self.modulo[d] as i64) as usize
        } else {
            x as usize
        }
    }

    /// An equivalent map with size-1 dimensions folded into the bases, no-op moduli dropped
    /// and adjacent dimensions merged where both sides are contiguous across them.
    pub fn coalesced(&self) -> IndexMap {
        let mut m = IndexMap {
            dims: vec![],
            in_stride: vec![],
            out_stride: vec![],
            offset: vec![],
            step: vec![],
            modulo: vec![],
            in_base: self.in_base,
            out_base: self.out_base,
        };
        for d in 0..self.dims.len() {
            if self.dims[d] == 1 {
                m.in_base += self.coord(d, 0) * self.in_stride[d];
                continue;
            }
            let mut modulo = self.modulo[d];
            let last = self.offset[d] + (self.dims[d] as i64 - 1) * self.step[d];
            if modulo != 0
                && self.offset[d] >= 0
                && last >= 0
                && (last.max(self.offset[d]) as usize) < modulo
            {
                modulo = 0;
            }
            m.dims.push(self.dims[d]);
            m.in_stride.push(self.in_stride[d]);
            m.out_stride.push(self.out_stride[d]);
            m.offset.push(self.offset[d]);
            m.step.push(self.step[d]);
            m.modulo.push(modulo);
        }
        let mut d = m.dims.len();
        while d >= 2 {
            let (a, b) = (d - 2, d - 1);
            let mergeable = m.step[b] == 1
                && m.offset[b] == 0
                && m.modulo[b] == 0
                && m.step[a] == 1
                && m.modulo[a] == 0
                && m.in_stride[a] == m.dims[b] * m.in_stride[b]
                && m.out_stride[a] == m.dims[b] * m.out_stride[b];
            if mergeable {
                m.offset[a] *= m.dims[b] as i64;
                m.dims[a] *= m.dims[b];
                m.in_stride[a] = m.in_stride[b];
                m.out_stride[a] = m.out_stride[b];
                for v in [
                    &mut m.dims,
                    &mut m.in_stride,
                    &mut m.out_stride,
                    &mut m.modulo,
                ] {
                    v.remove(b);
                }
                m.offset.remove(b);
                m.step.remove(b);
            }
            d -= 1;
        }
        m
    }

    /// Writes virtual elements `start..start + out.len()` into `out` (the map's output strides
    /// must be contiguous and `out_base` is ignored: `out` is that block), in parallel.
    pub fn cpu<T: Elem>(&self, src: &[T], out: &mut [T], start: usize) {
        let m = self.coalesced();
        if m.is_tiled_transpose() {
            m.transpose_tiles(src, out, start);
            return;
        }
        let inner = m.dims.last().copied().unwrap_or(1).max(1);
        // Chunks hold whole inner runs when they are short; long runs are cut (fill() handles
        // any alignment) so a single contiguous copy still spreads over the pool.
        let chunk = if inner <= 8192 {
            inner * (8192 / inner)
        } else {
            1 << 14
        };
        for_each_chunk(out, chunk, |i, block| m.fill(src, block, start + i * chunk));
    }

    /// True for a (batched) plain transpose whose last output axis is strided in the input
    /// while the one before it is contiguous: reading it element by element misses the cache.
    fn is_tiled_transpose(&self) -> bool {
        let r = self.dims.len();
        r >= 2
            && self.in_stride[r - 2] == 1
            && self.in_stride[r - 1] > 1
            && self.offset.iter().all(|&o| o == 0)
            && self.step.iter().all(|&s| s == 1)
            && self.modulo.iter().all(|&m| m == 0)
    }

    /// The tiled path of [`IndexMap::cpu`]: units of `TILE` output rows of one matrix (in
    /// parallel unless small), each written in 8x8 blocks read as 8 contiguous input lines and
    /// written as 8 contiguous output lines; partial rows and edges element by element.
    fn transpose_tiles<T: Elem>(&self, src: &[T], out: &mut [T], start: usize) {
        const TILE: usize = 32;
        let r = self.dims.len();
        let (p_n, q_n) = (self.dims[r - 2], self.dims[r - 1]);
        let end = start + out.len();
        let per_matrix = p_n * q_n;
        let inline = run_inline::<T>(out.len());
        // Cut `out` into units (matrix, first row) intersected with start..end.
        let mut units = Vec::new();
        let mut rest = out;
        let mut v = start;
        while v < end {
            let (o, p0) = (v / per_matrix, (v % per_matrix) / q_n / TILE * TILE);
            let unit_end = if inline {
                ((o + 1) * per_matrix).min(end)
            } else {
                (o * per_matrix + (p0 + TILE).min(p_n) * q_n).min(end)
            };
            let (head, tail) = rest.split_at_mut(unit_end - v);
            units.push((v, o, head));
            rest = tail;
            v = unit_end;
        }
        let unit = |(v0, o, block): (usize, usize, &mut [T])| {
            let mut rem = o;
            let mut base = self.in_base;
            for d in (0..r - 2).rev() {
                base += (rem % self.dims[d]) * self.in_stride[d];
                rem /= self.dims[d];
            }
            let lo = v0 - o * per_matrix;
            self.transpose_block(&src[base..], block, lo);
        };
        if inline {
            units.into_iter().for_each(unit);
        } else {
            crate::parallel::for_each_item(units, unit);
        }
    }

    /// Output elements `lo..lo + block.len()` of one matrix of a tiled transpose whose input
    /// starts at `src[0]`: output (p, q) = `src[p + q * sq]`.
    // `tile[i][j]` is read column by column into a contiguous output line: index loops.
    #[allow(clippy::needless_range_loop)]
    fn transpose_block<T: Elem>(&self, src: &[T], block: &mut [T], lo: usize) {
        const B: usize = 8;
        let r = self.dims.len();
        let q_n = self.dims[r - 1];
        let sq = self.in_stride[r - 1];
        let hi = lo + block.len();
        let one = |block: &mut [T], p: usize, q0: usize, q1: usize| {
            for q in q0..q1 {
                block[p * q_n + q - lo] = src[p + q * sq];
            }
        };
        // Whole output rows p_a..p_b; the partial rows around them element by element.
        let (p_a, p_b) = (lo.div_ceil(q_n), hi / q_n);
        if p_a > p_b {
            // Inside one row.
            let p = lo / q_n;
            one(block, p, lo - p * q_n, hi - p * q_n);
            return;
        }
        if lo < p_a * q_n {
            one(block, p_a - 1, lo - (p_a - 1) * q_n, q_n);
        }
        if hi > p_b * q_n {
            one(block, p_b, 0, hi - p_b * q_n);
        }
        let (q_full, mut p) = (q_n / B * B, p_a);
        while p + B <= p_b {
            for q0 in (0..q_full).step_by(B) {
                // tile[i][j] = output (p + j, q0 + i): 8 contiguous input lines.
                let mut tile = [[T::default(); B]; B];
                for (i, line) in tile.iter_mut().enumerate() {
                    let s = p + (q0 + i) * sq;
                    line.copy_from_slice(&src[s..s + B]);
                }
                for j in 0..B {
                    let d = (p + j) * q_n + q0 - lo;
                    let dst: &mut [T; B] = (&mut block[d..d + B]).try_into().expect("8 long");
                    for (i, o) in dst.iter_mut().enumerate() {
                        *o = tile[i][j];
                    }
                }
            }
            for j in p..p + B {
                one(block, j, q_full, q_n);
            }
            p += B;
        }
        for j in p..p_b {
            one(block, j, 0, q_n);
        }
    }

    fn fill<T: Elem>(&self, src: &[T], out: &mut [T], start: usize) {
        let r = self.dims.len();
        if r == 0 {
            out.iter_mut().for_each(|o| *o = src[self.in_base]);
            return;
        }
        let n = self.dims[r - 1];
        let (stride, step, modulo) = (self.in_stride[r - 1], self.step[r - 1], self.modulo[r - 1]);
        let mut j = start;
        let mut k = 0;
        while k < out.len() {
            let ci = j % n;
            let mut rem = j / n;
            let mut base = self.in_base;
            for d in (0..r - 1).rev() {
                let c = rem % self.dims[d];
                rem /= self.dims[d];
                base += self.coord(d, c) * self.in_stride[d];
            }
            let len = (n - ci).min(out.len() - k);
            let dst = &mut out[k..k + len];
            if modulo == 0 {
                let first = self.offset[r - 1] + ci as i64 * step;
                if step == 1 && stride == 1 {
                    let s = base + first as usize;
                    dst.copy_from_slice(&src[s..s + len]);
                } else {
                    let mut p = (base + first as usize * stride) as i64;
                    let delta = step * stride as i64;
                    for o in dst.iter_mut() {
                        *o = src[p as usize];
                        p += delta;
                    }
                }
            } else {
                for (t, o) in dst.iter_mut().enumerate() {
                    *o = src[base + self.coord(r - 1, ci + t) * stride];
                }
            }
            k += len;
            j += len;
        }
    }

    /// The `index_map.wgsl` dispatch for virtual elements `start..start + count`, reading op
    /// input `input` and writing op output `output`.
    pub fn gpu(
        &self,
        op: &str,
        start: usize,
        count: usize,
        input: usize,
        output: usize,
    ) -> Result<GpuKernel> {
        let mut m = self.coalesced();
        if m.dims.is_empty() {
            // One element: a dim of 1 (the shader's index loop has at least one).
            (m.dims, m.in_stride, m.out_stride) = (vec![1], vec![0], vec![0]);
            (m.offset, m.step, m.modulo) = (vec![0], vec![0], vec![0]);
        }
        let u32s = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<u32>>();
        let i32s = |v: &[i64]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        let p = IndexMapParams {
            dims: pack8(op, &u32s(&m.dims))?,
            in_stride: pack8(op, &u32s(&m.in_stride))?,
            out_stride: pack8(op, &u32s(&m.out_stride))?,
            offset: pack8(op, &i32s(&m.offset))?,
            step: pack8(op, &i32s(&m.step))?,
            modulo: pack8(op, &u32s(&m.modulo))?,
            start: start as u32,
            count: count as u32,
            in_base: m.in_base as u32,
            out_base: m.out_base as u32,
            _pad: [0; 4],
        };
        let modulo_dims = (m.modulo.iter().enumerate())
            .filter(|(_, &n)| n != 0)
            .fold(0u32, |bits, (d, _)| bits | 1 << d);
        let k = GpuKernel::new(
            tandem_shaders::INDEX_MAP,
            vec![input],
            vec![output],
            &p,
            grid_1d(count as u64, 64),
        )
        .with_override("WG", 64.0)
        .with_override("RANK", m.dims.len() as f64)
        .with_override("MODULO", modulo_dims as f64);
        Ok(match m.contiguous_vec4s(start, count) {
            Some(run) => k.with_cpu_adapter_variant(
                GpuKernel::new(
                    tandem_shaders::COPY_VEC4,
                    vec![input],
                    vec![output],
                    &run,
                    grid_1d(run.count as u64, 64),
                )
                .with_override("WG", 64.0),
            ),
            None => k,
        })
    }

    /// `copy_vec4.wgsl`'s params for virtual elements `start..start + count` of this
    /// (coalesced) map where they are one contiguous run of both buffers that starts and ends
    /// at whole vec4s of each; `None` otherwise. On lavapipe yolov8n's 19 Concats took 19.8
    /// ms through `index_map.wgsl`.
    fn contiguous_vec4s(&self, start: usize, count: usize) -> Option<CopyVec4Params> {
        let one = [1usize];
        let run = self.dims.len() == 1
            && self.in_stride == one
            && self.out_stride == one
            && self.step == [1]
            && self.modulo == [0];
        let src = self.in_base as i64 + self.offset.first().copied()? + start as i64;
        let out = self.out_base + start;
        let whole = src % 4 == 0 && out.is_multiple_of(4) && count.is_multiple_of(4);
        (run && src >= 0 && whole).then_some(CopyVec4Params {
            src_first: (src / 4) as u32,
            out_first: (out / 4) as u32,
            count: (count / 4) as u32,
            _pad: 0,
        })
    }
}

/// Runs `map` on the CPU for the output rows `rows` of `out`, reading
/// `src`: the common body of the index-map ops' `cpu()` (output split on its first axis).
pub fn index_map_cpu(
    op: &str,
    map: &IndexMap,
    src: &Tensor,
    out: &mut Tensor,
    rows: std::ops::Range<usize>,
) -> Result<()> {
    struct K<'a> {
        map: &'a IndexMap,
        start: usize,
        end: usize,
    }
    impl SameTypeKernel for K<'_> {
        fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
            self.map
                .cpu(ins[0], &mut out[self.start..self.end], self.start);
            Ok(())
        }
    }
    let axis = (!out.shape.is_empty()).then_some(0);
    let (start, end) = row_elems(&out.shape, axis, &rows);
    if start >= end {
        return Ok(());
    }
    with_same_type(op, &K { map, start, end }, &[&src.data], &mut out.data)
}

/// Split axis of ops that cut output 0 on its first axis: `Some(0)` unless it is a scalar.
pub fn first_axis(out: &TensorMeta) -> Option<usize> {
    (!out.shape.is_empty()).then_some(0)
}

/// Elements `start..end` of an output of `shape` that rows `rows` cover when split on `axis`.
pub fn row_elems(
    shape: &[usize],
    axis: Option<usize>,
    rows: &std::ops::Range<usize>,
) -> (usize, usize) {
    let len = crate::shape::row_len(shape, axis);
    let n: usize = shape.iter().product();
    ((rows.start * len).min(n), (rows.end * len).min(n))
}

/// The GPU side of the index-map ops: one `index_map.wgsl` dispatch (none when empty) for
/// rows `rows` of output 0 (split on its first axis), reading input 0.
pub fn index_map_gpu(
    op: &str,
    map: &IndexMap,
    ins: &[&TensorMeta],
    out: &TensorMeta,
    rows: std::ops::Range<usize>,
) -> Result<Vec<GpuKernel>> {
    check_gpu_size(op, &[ins[0], out])?;
    let (start, end) = row_elems(&out.shape, first_axis(out), &rows);
    if start >= end {
        return Ok(vec![]);
    }
    Ok(vec![map.gpu(op, start, end - start, 0, 0)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive reference: per element coordinates, no coalescing.
    fn naive(m: &IndexMap, src: &[i32]) -> Vec<i32> {
        let n = m.numel();
        let mut out = vec![0; n];
        for (v, o) in out.iter_mut().enumerate() {
            let mut rem = v;
            let mut idx = m.in_base;
            for d in (0..m.dims.len()).rev() {
                let c = rem % m.dims[d];
                rem /= m.dims[d];
                let mut x = m.offset[d] + c as i64 * m.step[d];
                if m.modulo[d] != 0 {
                    x = x.rem_euclid(m.modulo[d] as i64);
                }
                idx += x as usize * m.in_stride[d];
            }
            *o = src[idx];
        }
        out
    }

    #[test]
    fn index_map_matches_naive_walk_for_transpose_slice_tile() {
        let src: Vec<i32> = (0..2 * 3 * 5).collect();
        // transpose [2,3,5] -> [5,2,3]
        let t = IndexMap::new(&[5, 2, 3], vec![1, 15, 5]);
        // reversed slice along the last axis, tile on axis 1 (modulo)
        let mut s = IndexMap::new(&[2, 6, 3], vec![15, 5, 1]);
        s.offset = vec![0, 0, 4];
        s.step = vec![1, 1, -2];
        s.modulo = vec![0, 3, 0];
        let mut one = IndexMap::new(&[1, 1, 30], vec![30, 30, 1]);
        one.offset = vec![0, 0, 0];
        for m in [t, s, one] {
            let want = naive(&m, &src);
            for start in [0, 1, 7] {
                let mut out = vec![-1; want.len() - start];
                m.cpu(&src, &mut out, start);
                assert_eq!(out, want[start..], "{m:?} from {start}");
            }
        }
    }

    #[test]
    fn long_contiguous_runs_are_cut_into_parallel_chunks() {
        let src: Vec<i32> = (0..3 * 20000).collect();
        // x[:, 7:19007]: inner runs of 19000 elements, longer than one chunk
        let mut m = IndexMap::new(&[3, 19000], vec![20000, 1]);
        m.offset = vec![0, 7];
        let want = naive(&m, &src);
        for start in [0, 5, 19001] {
            let mut out = vec![-1; want.len() - start];
            m.cpu(&src, &mut out, start);
            assert_eq!(out, want[start..]);
        }
    }

    #[test]
    fn tiled_transpose_matches_naive_from_any_start() {
        let src: Vec<i32> = (0..2 * 70 * 45).collect();
        // [2, 70, 45] -> [2, 45, 70]
        let m = IndexMap::new(&[2, 45, 70], vec![3150, 1, 45]);
        assert!(m.coalesced().is_tiled_transpose());
        let want = naive(&m, &src);
        for start in [0, 1, 33, 70 * 32 + 5, 3150 + 7] {
            let mut out = vec![-1; want.len() - start];
            m.cpu(&src, &mut out, start);
            assert_eq!(out, want[start..], "from {start}");
            let mut part = vec![-1; 100.min(want.len() - start)];
            m.cpu(&src, &mut part, start);
            assert_eq!(part, want[start..start + part.len()], "100 from {start}");
        }
        // Above INLINE_BYTES: units of 32 rows in parallel. [3, 90, 100] -> [3, 100, 90]
        let src: Vec<i32> = (0..3 * 90 * 100).collect();
        let m = IndexMap::new(&[3, 100, 90], vec![9000, 1, 100]);
        assert!(!run_inline::<i32>(src.len()));
        let want = naive(&m, &src);
        for start in [0, 7, 9000 * 2 - 3] {
            let mut out = vec![-1; want.len() - start];
            m.cpu(&src, &mut out, start);
            assert_eq!(out, want[start..], "from {start}");
            let mut part = vec![-1; 100.min(want.len() - start)];
            m.cpu(&src, &mut part, start);
            assert_eq!(part, want[start..start + part.len()], "100 from {start}");
        }
    }

    #[test]
    fn coalescing_merges_contiguous_dims_only() {
        let m = IndexMap::new(&[2, 3, 4], vec![12, 4, 1]).coalesced();
        assert_eq!(m.dims, vec![24]);
        let t = IndexMap::new(&[4, 3], vec![1, 4]).coalesced();
        assert_eq!(t.dims, vec![4, 3]);
    }
}
