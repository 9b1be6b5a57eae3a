//! Shared machinery of the elementwise operator family (unary, binary, Where, Cast): typed
//! slice access to [`Data`], numpy broadcasting as runs of contiguous elements, parallel maps
//! over output row blocks, and the GPU parameter packing for broadcast shapes.
//!
//! Sits between the elementwise operator files (`unary.rs`, `binary.rs`, `where_op.rs`,
//! `cast.rs`) and the tensor/shape helpers of this crate. Every elementwise op splits its
//! output on the last axis, so a row range is simply an element range of output 0.

use crate::{shape, Data, OpError, Result, TensorMeta};
use half::f16;
use std::ops::Range;

/// Largest rank the GPU broadcast kernels index (dims packed as `array<vec4<u32>, 2>`).
pub(crate) const GPU_MAX_RANK: usize = 8;

/// Below this many elements a kernel runs on the calling thread (rayon overhead dominates).
const PAR_MIN: usize = 1 << 15;

/// A host element type with typed access into [`Data`].
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    fn slice(d: &Data) -> Option<&[Self]>;
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]>;
}

fn wrong_dtype(d: &Data, want: &str) -> OpError {
    OpError::Invalid(format!("expected a {want} tensor, got {}", d.dtype()))
}

/// The elements of `d` as `&[T]`, or `Invalid` naming the dtype mismatch.
pub(crate) fn typed<T: Elem>(d: &Data) -> Result<&[T]> {
    T::slice(d).ok_or_else(|| wrong_dtype(d, std::any::type_name::<T>()))
}

/// The elements of `d` as `&mut [T]`, or `Invalid` naming the dtype mismatch.
pub(crate) fn typed_mut<T: Elem>(d: &mut Data) -> Result<&mut [T]> {
    let dt = d.dtype();
    T::slice_mut(d).ok_or_else(|| {
        OpError::Invalid(format!(
            "expected a {} output, got {dt}",
            std::any::type_name::<T>()
        ))
    })
}

impl Elem for f32 {
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]> {
        match d {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Elem for f16 {
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::F16(v) => Some(v),
            _ => None,
        }
    }
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]> {
        match d {
            Data::F16(v) => Some(v),
            _ => None,
        }
    }
}

impl Elem for f64 {
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::F64(v) => Some(v),
            _ => None,
        }
    }
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]> {
        match d {
            Data::F64(v) => Some(v),
            _ => None,
        }
    }
}

impl Elem for i64 {
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::I64(v) => Some(v),
            _ => None,
        }
    }
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]> {
        match d {
            Data::I64(v) => Some(v),
            _ => None,
        }
    }
}

impl Elem for i32 {
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::I32(v) => Some(v),
            _ => None,
        }
    }
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]> {
        match d {
            Data::I32(v) => Some(v),
            _ => None,
        }
    }
}

impl Elem for i8 {
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::I8(v) => Some(v),
            _ => None,
        }
    }
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]> {
        match d {
            Data::I8(v) => Some(v),
            _ => None,
        }
    }
}

impl Elem for u8 {
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::U8(v) => Some(v),
            _ => None,
        }
    }
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]> {
        match d {
            Data::U8(v) => Some(v),
            _ => None,
        }
    }
}

impl Elem for bool {
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::Bool(v) => Some(v),
            _ => None,
        }
    }
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]> {
        match d {
            Data::Bool(v) => Some(v),
            _ => None,
        }
    }
}

/// The split axis every elementwise op uses: the last axis of output 0 (one row per element),
/// `None` for a rank-0 output.
pub(crate) fn last_axis(outs: &[TensorMeta]) -> Option<usize> {
    outs.first().and_then(|o| o.shape.len().checked_sub(1))
}

/// Checks that `rows` lies within an output of `numel` elements split on its last axis.
pub(crate) fn check_rows(rows: &Range<usize>, numel: usize, op: &str) -> Result<()> {
    if rows.start > rows.end || rows.end > numel.max(1) {
        return Err(OpError::Invalid(format!(
            "{op}: row range {rows:?} outside an output of {numel} elements"
        )));
    }
    Ok(())
}

/// The element range of output 0 that `rows` covers (rank-0 outputs have one row, one element).
pub(crate) fn element_range(rows: &Range<usize>, numel: usize) -> Range<usize> {
    rows.start.min(numel)..rows.end.min(numel)
}

/// Elements per parallel chunk for `n` elements: large enough to amortise scheduling, small
/// enough to give every thread several chunks.
fn chunk_len(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (n / (threads * 4)).max(PAR_MIN / 4).max(1)
}

/// `dst[i] = f(src[i])`, in parallel over chunks when large, each chunk on the widest vectors
/// the CPU has ([`crate::simd::map`]). Both slices have equal length.
pub(crate) fn par_map<T: Copy + Sync, U: Copy + Send>(
    src: &[T],
    dst: &mut [U],
    f: impl Fn(T) -> U + Sync,
) {
    debug_assert_eq!(src.len(), dst.len());
    let run = |s: &[T], d: &mut [U]| crate::simd::map(s, d, &f);
    if dst.len() < PAR_MIN {
        run(src, dst);
    } else {
        let c = chunk_len(dst.len());
        crate::parallel::for_each_chunk_mut(dst, c, |i, d| run(&src[i * c..][..d.len()], d));
    }
}

/// Broadcasting of `N` inputs to an output shape, with dimensions collapsed so that the
/// innermost dimension is as long as possible. Within the innermost dimension every input
/// advances by 0 or 1 element per output element, so kernels run plain slice loops.
#[derive(Debug, Clone)]
pub(crate) struct Broadcast<const N: usize> {
    /// Collapsed output dimensions (at least one).
    dims: Vec<usize>,
    /// Per collapsed dimension, the element stride of each input (0 on broadcast dimensions).
    strides: Vec<[usize; N]>,
}

impl<const N: usize> Broadcast<N> {
    /// Broadcast plan for inputs of shapes `ins` to `out` (which must be their broadcast).
    pub(crate) fn new(ins: [&[usize]; N], out: &[usize]) -> Broadcast<N> {
        Broadcast::from_strides(ins.map(|s| shape::broadcast_strides(s, out)), out)
    }

    /// Broadcast plan for inputs that step by `per_input[k][d]` elements per index of output
    /// dim `d` (0 where broadcast; any strides, e.g. an input read through a permutation).
    pub(crate) fn from_strides(per_input: [Vec<usize>; N], out: &[usize]) -> Broadcast<N> {
        let mut dims: Vec<usize> = Vec::new();
        let mut strides: Vec<[usize; N]> = Vec::new();
        for (d, &len) in out.iter().enumerate() {
            if len == 1 {
                continue;
            }
            let st: [usize; N] = std::array::from_fn(|k| per_input[k][d]);
            if let (Some(last_len), Some(last_st)) = (dims.last_mut(), strides.last_mut()) {
                // Merge with the previous kept dimension when every input walks both as one.
                if (0..N).all(|k| last_st[k] == st[k] * len) {
                    *last_len *= len;
                    *last_st = st;
                    continue;
                }
            }
            dims.push(len);
            strides.push(st);
        }
        if dims.is_empty() {
            dims.push(1);
            strides.push([0; N]);
        }
        Broadcast { dims, strides }
    }

    /// The per-input strides of the innermost collapsed dimension (each 0 or 1).
    pub(crate) fn inner_strides(&self) -> [usize; N] {
        self.strides[self.strides.len() - 1]
    }

    /// Calls `f(out_start, len, in_starts)` for each maximal run of consecutive output elements
    /// in `range` that lie in one innermost row; input `k` of the run starts at `in_starts[k]`
    /// and advances by `inner_strides()[k]`.
    pub(crate) fn for_each_run(
        &self,
        range: Range<usize>,
        mut f: impl FnMut(usize, usize, [usize; N]),
    ) {
        if range.is_empty() {
            return;
        }
        let rank = self.dims.len();
        let inner = self.dims[rank - 1];
        let inner_st = self.strides[rank - 1];
        let mut idx = vec![0usize; rank];
        let mut rem = range.start;
        for d in (0..rank).rev() {
            idx[d] = rem % self.dims[d];
            rem /= self.dims[d];
        }
        let mut offs = [0usize; N];
        for (&i, st) in idx.iter().zip(&self.strides) {
            for (o, &s) in offs.iter_mut().zip(st) {
                *o += i * s;
            }
        }
        let mut pos = range.start;
        while pos < range.end {
            let len = (inner - idx[rank - 1]).min(range.end - pos);
            f(pos, len, offs);
            pos += len;
            idx[rank - 1] += len;
            for (o, &s) in offs.iter_mut().zip(&inner_st) {
                *o += len * s;
            }
            // Carry into outer dimensions once the innermost row is finished.
            let mut d = rank - 1;
            while d > 0 && idx[d] == self.dims[d] {
                let (outer, this) = (&self.strides[d - 1], &self.strides[d]);
                for k in 0..N {
                    offs[k] = offs[k] + outer[k] - self.dims[d] * this[k];
                }
                idx[d] = 0;
                idx[d - 1] += 1;
                d -= 1;
            }
        }
    }

    /// Runs `run(out_block, in_starts)` over every run of `out_range`, where `out` is the
    /// output block for `out_range` (`out.len() == out_range.len()`); parallel over chunks.
    pub(crate) fn par_runs<U: Send>(
        &self,
        out: &mut [U],
        out_range: Range<usize>,
        run: impl Fn(&mut [U], [usize; N]) + Sync,
    ) {
        debug_assert_eq!(out.len(), out_range.len());
        let base = out_range.start;
        let serial = |block: &mut [U], start: usize| {
            self.for_each_run(start..start + block.len(), |pos, len, offs| {
                run(&mut block[pos - start..pos - start + len], offs)
            });
        };
        if out.len() < PAR_MIN {
            serial(out, base);
        } else {
            let c = chunk_len(out.len());
            crate::parallel::for_each_chunk_mut(out, c, |i, block| serial(block, base + i * c));
        }
    }
}

/// Broadcast dims/strides packed for a WGSL uniform: `array<vec4<u32>, 2>` per entry.
pub(crate) type GpuDims = [u32; GPU_MAX_RANK];

/// The collapsed output dims and per-input strides (0 where broadcast) of [`Broadcast::new`]
/// for the GPU kernels, and their count (at least 1), padded to [`GPU_MAX_RANK`];
/// `Unsupported` above that rank or 2^32 elements. Same-shape operands collapse to one dim of
/// stride 1, a row vector over a matrix to two: the shaders divide once per dim but the
/// outermost.
pub(crate) fn gpu_broadcast<const N: usize>(
    ins: [&[usize]; N],
    out: &[usize],
    op: &str,
) -> Result<(u32, GpuDims, [GpuDims; N])> {
    if shape::numel(out) > u32::MAX as usize
        || ins.iter().any(|s| shape::numel(s) > u32::MAX as usize)
    {
        return Err(OpError::Unsupported(format!(
            "{op} on GPU: more than 2^32 elements"
        )));
    }
    gpu_dims(&Broadcast::new(ins, out), op)
}

/// [`gpu_broadcast`]'s packing of a plan made otherwise ([`Broadcast::from_strides`]).
pub(crate) fn gpu_dims<const N: usize>(
    bc: &Broadcast<N>,
    op: &str,
) -> Result<(u32, GpuDims, [GpuDims; N])> {
    let rank = bc.dims.len();
    if rank > GPU_MAX_RANK {
        return Err(OpError::Unsupported(format!(
            "{op} on GPU: rank {rank} above {GPU_MAX_RANK} after merging dims"
        )));
    }
    let mut dims = [1u32; GPU_MAX_RANK];
    for (d, &v) in bc.dims.iter().enumerate() {
        dims[d] = v as u32;
    }
    let strides = std::array::from_fn(|k| {
        let mut r = [0u32; GPU_MAX_RANK];
        for (d, st) in bc.strides.iter().enumerate() {
            r[d] = st[k] as u32;
        }
        r
    });
    Ok((rank as u32, dims, strides))
}

/// `rows` as (start, count) for a GPU kernel over an output of `numel` elements, checked to
/// fit in u32.
pub(crate) fn gpu_range(rows: &Range<usize>, numel: usize, op: &str) -> Result<(u32, u32)> {
    check_rows(rows, numel, op)?;
    let r = element_range(rows, numel);
    if r.end > u32::MAX as usize {
        return Err(OpError::Unsupported(format!(
            "{op} on GPU: more than 2^32 elements"
        )));
    }
    Ok((r.start as u32, r.len() as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive reference: offsets of every output element, by full index decomposition.
    fn naive_offsets<const N: usize>(ins: [&[usize]; N], out: &[usize]) -> Vec<[usize; N]> {
        let st: Vec<Vec<usize>> = ins
            .iter()
            .map(|s| shape::broadcast_strides(s, out))
            .collect();
        (0..shape::numel(out))
            .map(|mut i| {
                let mut o = [0; N];
                for d in (0..out.len()).rev() {
                    let x = i % out[d];
                    i /= out[d];
                    for k in 0..N {
                        o[k] += x * st[k][d];
                    }
                }
                o
            })
            .collect()
    }

    fn check<const N: usize>(ins: [&[usize]; N], out: &[usize]) {
        let want = naive_offsets(ins, out);
        let b = Broadcast::new(ins, out);
        let n = want.len();
        for range in [
            0..n,
            n / 3..n,
            1.min(n)..n.saturating_sub(1).max(1.min(n)),
            n..n,
        ] {
            let mut got = Vec::new();
            b.for_each_run(range.clone(), |pos, len, offs| {
                assert_eq!(pos, range.start + got.len());
                for j in 0..len {
                    got.push(std::array::from_fn(|k| offs[k] + j * b.inner_strides()[k]));
                }
            });
            assert_eq!(
                got,
                want[range.clone()],
                "{ins:?} -> {out:?} range {range:?}"
            );
        }
    }

    #[test]
    fn gpu_broadcast_merges_the_dims_every_operand_walks_as_one() {
        let (rank, dims, [a, b]) =
            gpu_broadcast([&[1, 4, 2, 3], &[3]], &[1, 4, 2, 3], "Add").unwrap();
        assert_eq!(
            (rank, &dims[..2], &a[..2], &b[..2]),
            (2, &[8, 3][..], &[3, 1][..], &[0, 1][..])
        );
        let (rank, dims, [a, b]) = gpu_broadcast([&[2, 5], &[2, 5]], &[2, 5], "Add").unwrap();
        assert_eq!((rank, dims[0], a[0], b[0]), (1, 10, 1, 1));
        let (rank, dims, _) = gpu_broadcast([&[], &[1]], &[1], "Add").unwrap();
        assert_eq!((rank, dims[0]), (1, 1));
        let nine = [2; 9];
        let mut other = nine;
        other[0] = 1;
        assert!(gpu_broadcast([&nine[..], &other[..]], &nine, "Add").is_ok());
    }

    #[test]
    fn runs_match_naive_index_decomposition() {
        check([&[2, 3, 4], &[2, 3, 4]], &[2, 3, 4]);
        check([&[2, 3, 4], &[4]], &[2, 3, 4]);
        check([&[2, 1, 4], &[3, 1]], &[2, 3, 4]);
        check([&[1, 3, 1, 5], &[2, 1, 7, 1]], &[2, 3, 7, 5]);
        check([&[], &[5]], &[5]);
        check([&[], &[]], &[]);
        check([&[3, 1], &[1, 1]], &[3, 1]);
        check([&[2, 3, 1], &[1, 4], &[2, 1, 1]], &[2, 3, 4]);
        check([&[0, 3], &[3]], &[0, 3]);
    }

    #[test]
    fn par_runs_cover_large_outputs_in_order() {
        let out_shape = [3, 70001];
        let b = Broadcast::new([&[3, 1], &[70001]], &out_shape);
        let n = shape::numel(&out_shape);
        let mut out = vec![(usize::MAX, usize::MAX); n - 5];
        b.par_runs(&mut out, 5..n, |o, [a, c]| {
            for (j, v) in o.iter_mut().enumerate() {
                *v = (a, c + j);
            }
        });
        for (i, v) in out.iter().enumerate() {
            let g = i + 5;
            assert_eq!(*v, (g / 70001, g % 70001));
        }
    }
}
