//! Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
//! ReduceSumSquare, ReduceLogSumExp, ArgMax, ArgMin (and, through [`global_pool`],
//! GlobalAveragePool and GlobalMaxPool).
//!
//! Sits between the operator contract (`op.rs`) and `reduce.wgsl`. Every output element is an
//! independent fold over the reduced axes, so output rows are cut on the last output axis and a
//! row range is a range of output elements. The input shape is collapsed into alternating groups
//! of kept and reduced dimensions; a single reduced group (the common case: last axes, spatial
//! axes, one axis) takes a fast path with contiguous inner loops.

use crate::shape::{self, grid_1d, normalize_axis};
use crate::{Attrs, DType, Data, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use rayon::prelude::*;
use std::ops::Range;

/// What a reduction folds with. The discriminant is the `op` code of `reduce.wgsl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReduceKind {
    Sum = 0,
    Mean = 1,
    Max = 2,
    Min = 3,
    Prod = 4,
    L1 = 5,
    L2 = 6,
    SumSquare = 7,
    LogSumExp = 8,
}

/// `reduce.wgsl` op codes of ArgMax and ArgMin.
const GPU_ARGMAX: u32 = 9;
const GPU_ARGMIN: u32 = 10;

/// Where the reduced axes come from.
#[derive(Debug, Clone, PartialEq)]
enum AxesSource {
    /// The `axes` attribute (ReduceSum < 13, the others < 18); `None` when absent.
    Attr(Option<Vec<i64>>),
    /// The optional second input (ReduceSum >= 13, the others >= 18).
    Input,
    /// Every axis from this one on (global pooling over the spatial axes).
    From(usize),
}

/// A Reduce* operator (or a global pool expressed as one).
#[derive(Debug)]
struct Reduce {
    name: &'static str,
    kind: ReduceKind,
    axes: AxesSource,
    keepdims: bool,
    noop_with_empty_axes: bool,
}

fn reduce_op(
    attrs: &Attrs,
    name: &'static str,
    kind: ReduceKind,
    input_since: i64,
) -> Result<Box<dyn Op>> {
    let axes = if attrs.opset >= input_since {
        if attrs.has("axes") {
            return Err(OpError::Invalid(format!(
                "{name}: attribute `axes` is an input since opset {input_since}"
            )));
        }
        AxesSource::Input
    } else {
        AxesSource::Attr(attrs.ints_opt("axes")?)
    };
    Ok(Box::new(Reduce {
        name,
        kind,
        axes,
        keepdims: attrs.int("keepdims", 1)? != 0,
        noop_with_empty_axes: attrs.int("noop_with_empty_axes", 0)? != 0,
    }))
}

/// ReduceSum (axes is an input from opset 13).
pub fn reduce_sum(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceSum", ReduceKind::Sum, 13)
}
/// ReduceMean (axes is an input from opset 18).
pub fn reduce_mean(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceMean", ReduceKind::Mean, 18)
}
/// ReduceMax (axes is an input from opset 18).
pub fn reduce_max(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceMax", ReduceKind::Max, 18)
}
/// ReduceMin (axes is an input from opset 18).
pub fn reduce_min(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceMin", ReduceKind::Min, 18)
}
/// ReduceProd (axes is an input from opset 18).
pub fn reduce_prod(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceProd", ReduceKind::Prod, 18)
}
/// ReduceL1 (axes is an input from opset 18).
pub fn reduce_l1(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceL1", ReduceKind::L1, 18)
}
/// ReduceL2 (axes is an input from opset 18).
pub fn reduce_l2(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceL2", ReduceKind::L2, 18)
}
/// ReduceSumSquare (axes is an input from opset 18).
pub fn reduce_sum_square(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceSumSquare", ReduceKind::SumSquare, 18)
}
/// ReduceLogSumExp (axes is an input from opset 18), computed stably (online max shift).
pub fn reduce_log_sum_exp(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceLogSumExp", ReduceKind::LogSumExp, 18)
}

/// A global pool over the spatial axes (2..) of an `[N, C, D1...]` input, keeping dims:
/// GlobalAveragePool (`Mean`) or GlobalMaxPool (`Max`).
pub(crate) fn global_pool(name: &'static str, kind: ReduceKind) -> Box<dyn Op> {
    Box::new(Reduce {
        name,
        kind,
        axes: AxesSource::From(2),
        keepdims: true,
        noop_with_empty_axes: false,
    })
}

/// The input shape collapsed into groups of adjacent kept or reduced dimensions (size-1
/// dimensions dropped): `(size, input stride, reduced)`, outermost first.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Groups(Vec<(usize, usize, bool)>);

impl Groups {
    pub(crate) fn new(in_shape: &[usize], reduced: &[bool]) -> Groups {
        let st = shape::strides(in_shape);
        let mut g: Vec<(usize, usize, bool)> = Vec::new();
        for i in 0..in_shape.len() {
            if in_shape[i] == 1 {
                continue;
            }
            match g.last_mut() {
                Some(last) if last.2 == reduced[i] => {
                    last.0 *= in_shape[i];
                    last.1 = st[i];
                }
                _ => g.push((in_shape[i], st[i], reduced[i])),
            }
        }
        Groups(g)
    }

    fn of(&self, red: bool) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.0
            .iter()
            .filter(move |g| g.2 == red)
            .map(|g| (g.0, g.1))
    }

    /// Number of input elements folded into each output element.
    pub(crate) fn reduce_count(&self) -> usize {
        self.of(true).map(|g| g.0).product()
    }

    /// `(outer, n, inner)` when at most one group is reduced: output element `o * inner + j`
    /// folds `x[o * n * inner + k * inner + j]` for `k` in `0..n`.
    fn fast(&self) -> Option<(usize, usize, usize)> {
        let g = &self.0;
        match g.iter().position(|g| g.2) {
            None => Some((g.iter().map(|g| g.0).product(), 1, 1)),
            Some(p) if g.iter().filter(|g| g.2).count() == 1 => {
                let outer = g[..p].iter().map(|g| g.0).product();
                let inner = g[p + 1..].iter().map(|g| g.0).product();
                Some((outer, g[p].0, inner))
            }
            Some(_) => None,
        }
    }

    /// Kept groups innermost first, for [`base`] (general path).
    fn kept_rev(&self) -> Vec<(usize, usize)> {
        let mut k: Vec<_> = self.of(false).collect();
        k.reverse();
        k
    }

    /// Offsets, relative to [`base`], of the elements folded together (general path).
    fn reduced_offsets(&self) -> Vec<usize> {
        let mut offs = vec![0usize];
        for (size, stride) in self.of(true) {
            offs = offs
                .iter()
                .flat_map(|&o| (0..size).map(move |k| o + k * stride))
                .collect();
        }
        offs
    }
}

impl Reduce {
    /// Resolve the reduced axes into per-axis flags.
    fn reduced_flags(&self, rank: usize, axes: Option<Vec<i64>>) -> Result<Vec<bool>> {
        let mut flags = vec![false; rank];
        match (&self.axes, axes) {
            (AxesSource::From(first), _) => {
                if rank < *first {
                    return Err(OpError::Invalid(format!(
                        "{}: input rank {rank} is below {first}",
                        self.name
                    )));
                }
                flags[*first..].iter_mut().for_each(|f| *f = true);
            }
            (_, Some(axes)) if !axes.is_empty() => {
                for a in axes {
                    let a = normalize_axis(a, rank)
                        .map_err(|e| OpError::Invalid(format!("{}: axes: {e}", self.name)))?;
                    if rank == 0 {
                        continue;
                    }
                    if flags[a] {
                        return Err(OpError::Invalid(format!(
                            "{}: axis {a} is listed twice in `axes`",
                            self.name
                        )));
                    }
                    flags[a] = true;
                }
            }
            _ => {
                if !self.noop_with_empty_axes {
                    flags.iter_mut().for_each(|f| *f = true);
                }
            }
        }
        Ok(flags)
    }

    fn out_shape(&self, in_shape: &[usize], flags: &[bool]) -> Vec<usize> {
        in_shape
            .iter()
            .zip(flags)
            .filter_map(|(&d, &r)| match (r, self.keepdims) {
                (false, _) => Some(d),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect()
    }

    /// The axes at plan time: from the attribute, or from the constant second input.
    fn axes_meta(&self, ins: &[&TensorMeta]) -> Result<Option<Vec<i64>>> {
        match &self.axes {
            AxesSource::Attr(a) => Ok(a.clone()),
            AxesSource::From(_) => Ok(None),
            AxesSource::Input => match ins.get(1) {
                None => Ok(None),
                Some(m) if m.numel() == 0 => Ok(None),
                Some(m) => match &m.value {
                    Some(t) => Ok(Some(t.to_i64_vec())),
                    None => Err(OpError::Unsupported(format!(
                        "{}: `axes` must be a constant (it decides the output shape)",
                        self.name
                    ))),
                },
            },
        }
    }

    fn axes_run(&self, ins: &[&Tensor]) -> Option<Vec<i64>> {
        match &self.axes {
            AxesSource::Attr(a) => a.clone(),
            AxesSource::From(_) => None,
            AxesSource::Input => ins.get(1).filter(|t| t.numel() > 0).map(|t| t.to_i64_vec()),
        }
    }
}

fn check_ins(name: &str, ins: &[&TensorMeta], max: usize) -> Result<()> {
    if ins.is_empty() || ins.len() > max {
        return Err(OpError::Invalid(format!(
            "{name} takes 1 to {max} inputs, got {}",
            ins.len()
        )));
    }
    Ok(())
}

/// The element range of output 0 that `rows` covers, for an output split on its last axis.
fn element_range(out_shape: &[usize], rows: &Range<usize>) -> Range<usize> {
    let axis = out_shape.len().checked_sub(1);
    let rl = shape::row_len(out_shape, axis);
    rows.start * rl..rows.end * rl
}

fn last_axis(outs: &[TensorMeta]) -> Option<usize> {
    outs.first().and_then(|o| o.shape.len().checked_sub(1))
}

impl Op for Reduce {
    fn name(&self) -> &'static str {
        self.name
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        check_ins(self.name, ins, 2)?;
        let x = ins[0];
        let int_ok = matches!(
            self.kind,
            ReduceKind::Sum | ReduceKind::Max | ReduceKind::Min | ReduceKind::Prod
        ) && matches!(x.dtype, DType::I64 | DType::I32);
        if x.dtype != DType::F32 && !int_ok {
            return Err(OpError::Unsupported(format!(
                "{}: input dtype {} (supported: f32; i64/i32 for Sum/Max/Min/Prod)",
                self.name, x.dtype
            )));
        }
        let flags = self.reduced_flags(x.rank(), self.axes_meta(ins)?)?;
        Ok(vec![TensorMeta::new(
            x.dtype,
            self.out_shape(&x.shape, &flags),
        )])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        let per = if self.kind == ReduceKind::LogSumExp {
            4
        } else {
            1
        };
        Work {
            flops: per * ins[0].numel() as u64,
            bytes_read: ins[0].bytes(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        last_axis(outs)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let x = ins[0];
        let flags = self.reduced_flags(x.shape.len(), self.axes_run(ins))?;
        let groups = Groups::new(&x.shape, &flags);
        let range = element_range(&outs[0].shape, &rows);
        let start = range.start;
        match (&x.data, &mut outs[0].data) {
            (Data::F32(x), Data::F32(o)) => {
                let out = &mut o[range];
                match self.kind {
                    ReduceKind::Sum => fold(x, &groups, out, start, &Sum),
                    ReduceKind::Mean => fold(x, &groups, out, start, &Mean),
                    ReduceKind::Max => fold(x, &groups, out, start, &Max),
                    ReduceKind::Min => fold(x, &groups, out, start, &Min),
                    ReduceKind::Prod => fold(x, &groups, out, start, &Prod),
                    ReduceKind::L1 => fold(x, &groups, out, start, &L1),
                    ReduceKind::L2 => fold(x, &groups, out, start, &L2),
                    ReduceKind::SumSquare => fold(x, &groups, out, start, &SumSquare),
                    ReduceKind::LogSumExp => fold(x, &groups, out, start, &LogSumExp),
                }
            }
            (Data::I64(x), Data::I64(o)) => fold_int(self, x, &groups, &mut o[range], start)?,
            (Data::I32(x), Data::I32(o)) => fold_int(self, x, &groups, &mut o[range], start)?,
            (x, o) => {
                return Err(OpError::Unsupported(format!(
                    "{} on CPU: {} input into {} output",
                    self.name,
                    x.dtype(),
                    o.dtype()
                )))
            }
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        if ins[0].dtype != DType::F32 {
            return Err(OpError::Unsupported(format!(
                "{} on GPU: dtype {} (f32 only)",
                self.name, ins[0].dtype
            )));
        }
        let flags = self.reduced_flags(ins[0].rank(), self.axes_meta(ins)?)?;
        let groups = Groups::new(&ins[0].shape, &flags);
        let range = element_range(&outs[0].shape, &rows);
        reduce_kernel(self.name, &groups, self.kind as u32, false, range)
    }
}

/// `reduce.wgsl` parameters: kept and reduced groups (size and input stride, outermost
/// first), the fold, and the output element range.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ReduceParams {
    kdims: [u32; 8],
    kstr: [u32; 8],
    rdims: [u32; 8],
    rstr: [u32; 8],
    nk: u32,
    nr: u32,
    n: u32,
    op: u32,
    start: u32,
    count: u32,
    select_last: u32,
    inf_bits: u32,
}

/// The `reduce.wgsl` dispatch computing output elements `range` (one invocation each).
pub(crate) fn reduce_kernel(
    name: &str,
    groups: &Groups,
    op: u32,
    select_last: bool,
    range: Range<usize>,
) -> Result<Vec<GpuKernel>> {
    if range.is_empty() {
        return Ok(Vec::new());
    }
    let mut p: ReduceParams = bytemuck::Zeroable::zeroed();
    let fits = |v: usize| u32::try_from(v).ok();
    let too_big = || OpError::Unsupported(format!("{name} on GPU: sizes exceed u32 / 8 groups"));
    for (red, dims, strs, count) in [
        (false, &mut p.kdims, &mut p.kstr, &mut p.nk),
        (true, &mut p.rdims, &mut p.rstr, &mut p.nr),
    ] {
        for (i, (size, stride)) in groups.of(red).enumerate() {
            if i >= 8 {
                return Err(too_big());
            }
            dims[i] = fits(size).ok_or_else(too_big)?;
            strs[i] = fits(stride).ok_or_else(too_big)?;
            *count = i as u32 + 1;
        }
    }
    p.n = fits(groups.reduce_count()).ok_or_else(too_big)?;
    p.op = op;
    p.start = fits(range.start).ok_or_else(too_big)?;
    p.count = fits(range.len()).ok_or_else(too_big)?;
    p.select_last = select_last as u32;
    p.inf_bits = f32::INFINITY.to_bits();
    let wg = grid_1d(range.len() as u64, 64);
    Ok(vec![GpuKernel::new(
        tandem_shaders::REDUCE,
        vec![0],
        vec![0],
        &p,
        wg,
    )])
}

/// A fold: accumulator state, one step per input element, and the final value.
trait Fold<T>: Sync {
    type S: Copy + Send + Sync;
    fn init(&self) -> Self::S;
    fn step(&self, s: Self::S, x: T) -> Self::S;
    fn finish(&self, s: Self::S, n: usize) -> T;
}

struct Sum;
struct Mean;
struct Max;
struct Min;
struct Prod;
struct L1;
struct L2;
struct SumSquare;
struct LogSumExp;

impl Fold<f32> for Sum {
    type S = f32;
    fn init(&self) -> f32 {
        0.0
    }
    fn step(&self, s: f32, x: f32) -> f32 {
        s + x
    }
    fn finish(&self, s: f32, _: usize) -> f32 {
        s
    }
}
impl Fold<f32> for Mean {
    type S = f32;
    fn init(&self) -> f32 {
        0.0
    }
    fn step(&self, s: f32, x: f32) -> f32 {
        s + x
    }
    fn finish(&self, s: f32, n: usize) -> f32 {
        s / n as f32
    }
}
impl Fold<f32> for Max {
    type S = f32;
    fn init(&self) -> f32 {
        f32::NEG_INFINITY
    }
    fn step(&self, s: f32, x: f32) -> f32 {
        if x > s || x.is_nan() {
            x
        } else {
            s
        }
    }
    fn finish(&self, s: f32, _: usize) -> f32 {
        s
    }
}
impl Fold<f32> for Min {
    type S = f32;
    fn init(&self) -> f32 {
        f32::INFINITY
    }
    fn step(&self, s: f32, x: f32) -> f32 {
        if x < s || x.is_nan() {
            x
        } else {
            s
        }
    }
    fn finish(&self, s: f32, _: usize) -> f32 {
        s
    }
}
impl Fold<f32> for Prod {
    type S = f32;
    fn init(&self) -> f32 {
        1.0
    }
    fn step(&self, s: f32, x: f32) -> f32 {
        s * x
    }
    fn finish(&self, s: f32, _: usize) -> f32 {
        s
    }
}
impl Fold<f32> for L1 {
    type S = f32;
    fn init(&self) -> f32 {
        0.0
    }
    fn step(&self, s: f32, x: f32) -> f32 {
        s + x.abs()
    }
    fn finish(&self, s: f32, _: usize) -> f32 {
        s
    }
}
impl Fold<f32> for L2 {
    type S = f32;
    fn init(&self) -> f32 {
        0.0
    }
    fn step(&self, s: f32, x: f32) -> f32 {
        s + x * x
    }
    fn finish(&self, s: f32, _: usize) -> f32 {
        s.sqrt()
    }
}
impl Fold<f32> for SumSquare {
    type S = f32;
    fn init(&self) -> f32 {
        0.0
    }
    fn step(&self, s: f32, x: f32) -> f32 {
        s + x * x
    }
    fn finish(&self, s: f32, _: usize) -> f32 {
        s
    }
}
/// Online log-sum-exp: state (running max, sum of exp(x - max)).
impl Fold<f32> for LogSumExp {
    type S = (f32, f32);
    fn init(&self) -> (f32, f32) {
        (f32::NEG_INFINITY, 0.0)
    }
    fn step(&self, (m, s): (f32, f32), x: f32) -> (f32, f32) {
        if x > m {
            (x, s * (m - x).exp() + 1.0)
        } else if x == f32::NEG_INFINITY {
            (m, s)
        } else {
            (m, s + (x - m).exp())
        }
    }
    fn finish(&self, (m, s): (f32, f32), _: usize) -> f32 {
        if m.is_finite() {
            s.ln() + m
        } else {
            m
        }
    }
}

/// Integer folds (Sum and Prod wrap, as ONNX runtimes do).
struct IntFold(ReduceKind);

/// The integer element types reductions support on the CPU.
trait IntElem: Copy + Ord + Send + Sync {
    const MIN: Self;
    const MAX: Self;
    const ZERO: Self;
    const ONE: Self;
    fn wrapping_add(self, o: Self) -> Self;
    fn wrapping_mul(self, o: Self) -> Self;
}

impl IntElem for i64 {
    const MIN: i64 = i64::MIN;
    const MAX: i64 = i64::MAX;
    const ZERO: i64 = 0;
    const ONE: i64 = 1;
    fn wrapping_add(self, o: i64) -> i64 {
        i64::wrapping_add(self, o)
    }
    fn wrapping_mul(self, o: i64) -> i64 {
        i64::wrapping_mul(self, o)
    }
}

impl IntElem for i32 {
    const MIN: i32 = i32::MIN;
    const MAX: i32 = i32::MAX;
    const ZERO: i32 = 0;
    const ONE: i32 = 1;
    fn wrapping_add(self, o: i32) -> i32 {
        i32::wrapping_add(self, o)
    }
    fn wrapping_mul(self, o: i32) -> i32 {
        i32::wrapping_mul(self, o)
    }
}

impl<T: IntElem> Fold<T> for IntFold {
    type S = T;
    fn init(&self) -> T {
        match self.0 {
            ReduceKind::Max => T::MIN,
            ReduceKind::Min => T::MAX,
            ReduceKind::Prod => T::ONE,
            _ => T::ZERO,
        }
    }
    fn step(&self, s: T, x: T) -> T {
        match self.0 {
            ReduceKind::Max => s.max(x),
            ReduceKind::Min => s.min(x),
            ReduceKind::Prod => s.wrapping_mul(x),
            _ => s.wrapping_add(x),
        }
    }
    fn finish(&self, s: T, _: usize) -> T {
        s
    }
}

fn fold_int<T: IntElem>(
    op: &Reduce,
    x: &[T],
    g: &Groups,
    out: &mut [T],
    start: usize,
) -> Result<()> {
    match op.kind {
        ReduceKind::Sum | ReduceKind::Max | ReduceKind::Min | ReduceKind::Prod => {
            fold(x, g, out, start, &IntFold(op.kind));
            Ok(())
        }
        k => Err(OpError::Unsupported(format!(
            "{}: {k:?} of integers",
            op.name
        ))),
    }
}

/// Input offset of the first element folded into output element `e`, given the kept groups
/// innermost first (general path).
fn base(kept_rev: &[(usize, usize)], mut e: usize) -> usize {
    let mut off = 0;
    for &(size, stride) in kept_rev {
        off += (e % size) * stride;
        e /= size;
    }
    off
}

/// Output elements per parallel task.
fn chunk_len(len: usize) -> usize {
    len.div_ceil(4 * rayon::current_num_threads())
        .clamp(1, 4096)
}

/// Fold output elements `start..start + out.len()` of the reduction `g` of `x` into `out`.
fn fold<T: Copy + Send + Sync, F: Fold<T>>(
    x: &[T],
    g: &Groups,
    out: &mut [T],
    start: usize,
    f: &F,
) {
    let ch = chunk_len(out.len());
    match g.fast() {
        Some((_, n, 1)) => out.par_chunks_mut(ch).enumerate().for_each(|(ci, chunk)| {
            for (k, o) in chunk.iter_mut().enumerate() {
                let e = start + ci * ch + k;
                let mut s = f.init();
                for &v in &x[e * n..(e + 1) * n] {
                    s = f.step(s, v);
                }
                *o = f.finish(s, n);
            }
        }),
        Some((_, n, inner)) => out.par_chunks_mut(ch).enumerate().for_each(|(ci, chunk)| {
            let mut states = Vec::with_capacity(chunk.len());
            let mut done = 0;
            while done < chunk.len() {
                let e = start + ci * ch + done;
                let (o, j0) = (e / inner, e % inner);
                let len = (inner - j0).min(chunk.len() - done);
                states.clear();
                states.resize(len, f.init());
                for k in 0..n {
                    let row = &x[o * n * inner + k * inner + j0..][..len];
                    for (s, &v) in states.iter_mut().zip(row) {
                        *s = f.step(*s, v);
                    }
                }
                for (y, s) in chunk[done..done + len].iter_mut().zip(&states) {
                    *y = f.finish(*s, n);
                }
                done += len;
            }
        }),
        None => {
            let offs = g.reduced_offsets();
            let kept = g.kept_rev();
            let n = offs.len();
            out.par_chunks_mut(ch).enumerate().for_each(|(ci, chunk)| {
                for (k, o) in chunk.iter_mut().enumerate() {
                    let base = base(&kept, start + ci * ch + k);
                    let mut s = f.init();
                    for &off in &offs {
                        s = f.step(s, x[base + off]);
                    }
                    *o = f.finish(s, n);
                }
            })
        }
    }
}

/// ArgMax / ArgMin along one axis; output i64.
#[derive(Debug)]
struct ArgReduce {
    name: &'static str,
    max: bool,
    axis: i64,
    keepdims: bool,
    select_last: bool,
}

fn arg_op(a: &Attrs, name: &'static str, max: bool) -> Result<Box<dyn Op>> {
    Ok(Box::new(ArgReduce {
        name,
        max,
        axis: a.int("axis", 0)?,
        keepdims: a.int("keepdims", 1)? != 0,
        select_last: a.int("select_last_index", 0)? != 0,
    }))
}

/// ArgMax (axis default 0, keepdims, select_last_index).
pub fn arg_max(a: &Attrs) -> Result<Box<dyn Op>> {
    arg_op(a, "ArgMax", true)
}
/// ArgMin (axis default 0, keepdims, select_last_index).
pub fn arg_min(a: &Attrs) -> Result<Box<dyn Op>> {
    arg_op(a, "ArgMin", false)
}

impl ArgReduce {
    fn geometry(&self, shape: &[usize]) -> Result<(usize, Vec<usize>)> {
        let a = normalize_axis(self.axis, shape.len())
            .map_err(|e| OpError::Invalid(format!("{}: {e}", self.name)))?;
        if shape.is_empty() {
            return Err(OpError::Invalid(format!(
                "{}: input must have rank >= 1",
                self.name
            )));
        }
        let mut out = shape.to_vec();
        if self.keepdims {
            out[a] = 1;
        } else {
            out.remove(a);
        }
        Ok((a, out))
    }
}

impl Op for ArgReduce {
    fn name(&self) -> &'static str {
        self.name
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        check_ins(self.name, ins, 1)?;
        if !matches!(ins[0].dtype, DType::F32 | DType::I64 | DType::I32) {
            return Err(OpError::Unsupported(format!(
                "{}: input dtype {}",
                self.name, ins[0].dtype
            )));
        }
        let (a, out) = self.geometry(&ins[0].shape)?;
        if ins[0].shape[a] == 0 {
            return Err(OpError::Invalid(format!(
                "{}: the reduced axis {a} is empty",
                self.name
            )));
        }
        Ok(vec![TensorMeta::new(DType::I64, out)])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        Work {
            flops: ins[0].numel() as u64,
            bytes_read: ins[0].bytes(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        last_axis(outs)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let x = ins[0];
        let (a, _) = self.geometry(&x.shape)?;
        let n = x.shape[a];
        let inner: usize = x.shape[a + 1..].iter().product();
        let range = element_range(&outs[0].shape, &rows);
        let start = range.start;
        let Data::I64(out) = &mut outs[0].data else {
            return Err(OpError::Invalid(format!(
                "{}: output must be i64",
                self.name
            )));
        };
        let out = &mut out[range];
        match &x.data {
            Data::F32(v) => arg_fold(v, out, start, n, inner, self.max, self.select_last),
            Data::I64(v) => arg_fold(v, out, start, n, inner, self.max, self.select_last),
            Data::I32(v) => arg_fold(v, out, start, n, inner, self.max, self.select_last),
            d => {
                return Err(OpError::Unsupported(format!(
                    "{} on CPU: dtype {}",
                    self.name,
                    d.dtype()
                )))
            }
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        if ins[0].dtype != DType::F32 {
            return Err(OpError::Unsupported(format!(
                "{} on GPU: dtype {} (f32 only)",
                self.name, ins[0].dtype
            )));
        }
        let (a, _) = self.geometry(&ins[0].shape)?;
        // Keep size-1 reduced axes from vanishing: a single reduced group, even of size 1.
        let s = &ins[0].shape;
        let outer: usize = s[..a].iter().product();
        let inner: usize = s[a + 1..].iter().product();
        let mut g = Vec::new();
        if outer > 1 {
            g.push((outer, s[a] * inner, false));
        }
        g.push((s[a], inner, true));
        if inner > 1 {
            g.push((inner, 1, false));
        }
        let op = if self.max { GPU_ARGMAX } else { GPU_ARGMIN };
        let range = element_range(&outs[0].shape, &rows);
        reduce_kernel(self.name, &Groups(g), op, self.select_last, range)
    }
}

fn arg_fold<T: Copy + PartialOrd + Send + Sync>(
    x: &[T],
    out: &mut [i64],
    start: usize,
    n: usize,
    inner: usize,
    max: bool,
    last: bool,
) {
    let ch = chunk_len(out.len());
    out.par_chunks_mut(ch).enumerate().for_each(|(ci, chunk)| {
        for (k, o) in chunk.iter_mut().enumerate() {
            let e = start + ci * ch + k;
            let base = (e / inner) * n * inner + e % inner;
            let mut best = x[base];
            let mut at = 0;
            for i in 1..n {
                let v = x[base + i * inner];
                let better = if max {
                    v > best || (last && v == best)
                } else {
                    v < best || (last && v == best)
                };
                if better {
                    best = v;
                    at = i;
                }
            }
            *o = at as i64;
        }
    });
}

#[cfg(test)]
#[path = "reduce_tests.rs"]
mod tests;
