//! Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
//! ReduceSumSquare, ReduceLogSumExp, ReduceLogSum, ArgMax, ArgMin (and, through `global_pool`,
//! GlobalAveragePool and GlobalMaxPool).
//!
//! Sits between the operator contract (`op.rs`) and `reduce.wgsl` (`reduce_wide.wgsl` for folds
//! longer than one invocation may take). Every output element is an
//! independent fold over the reduced axes, so output rows are cut on the last output axis and a
//! row range is a range of output elements. The input shape is collapsed into alternating groups
//! of kept and reduced dimensions; a single reduced group (the common case: last axes, spatial
//! axes, one axis) takes a fast path with contiguous inner loops.

use crate::shape::{self, grid_1d, normalize_axis};
use crate::{Attrs, DType, Data, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use std::ops::Range;

#[path = "reduce_fold.rs"]
mod fold;
use fold::{arg_fold, fold, fold_float, IntElem, IntFold};

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
    LogSum = 11,
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

/// Whether `op` is a ReduceMean that keeps dims and reduces the last axis alone (`axes` is
/// `[-1]`; `axes_input` is the constant value of its `axes` input where it takes them as one).
/// The runtime's RMSNorm fusion asks this before the input's rank is known.
pub fn is_mean_over_last_axis(op: &dyn Op, axes_input: Option<&Tensor>) -> bool {
    let Some(r) = op.as_any().and_then(|a| a.downcast_ref::<Reduce>()) else {
        return false;
    };
    let axes = match &r.axes {
        AxesSource::Attr(a) => a.clone(),
        AxesSource::Input => axes_input.map(Tensor::to_i64_vec),
        AxesSource::From(_) => None,
    };
    r.name == "ReduceMean" && r.keepdims && axes.as_deref() == Some(&[-1])
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

/// ReduceLogSum: `ln(sum(x))` (axes is an input from opset 18).
pub fn reduce_log_sum(a: &Attrs) -> Result<Box<dyn Op>> {
    reduce_op(a, "ReduceLogSum", ReduceKind::LogSum, 18)
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

/// Output elements `start..start + out.len()` of `kind` (Mean or Max: the global pools, and
/// pooling windows that cover the whole plane), element `e` folded from `x[e * n..(e + 1) *
/// n]`.
pub(crate) fn fold_runs_f32(kind: ReduceKind, x: &[f32], n: usize, out: &mut [f32], start: usize) {
    let groups = Groups::new(&[x.len() / n.max(1), n], &[false, true]);
    fold_float(kind, x, &groups, out, start);
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
    pub(crate) fn fast(&self) -> Option<(usize, usize, usize)> {
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
    pub(crate) fn kept_rev(&self) -> Vec<(usize, usize)> {
        let mut k: Vec<_> = self.of(false).collect();
        k.reverse();
        k
    }

    /// Offsets, relative to [`base`], of the elements folded together (general path).
    pub(crate) fn reduced_offsets(&self) -> Vec<usize> {
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
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        check_ins(self.name, ins, 2)?;
        let x = ins[0];
        let int_kind = matches!(
            self.kind,
            ReduceKind::Sum | ReduceKind::Max | ReduceKind::Min | ReduceKind::Prod
        );
        let ok = match x.dtype {
            DType::F32 | DType::F64 => true,
            DType::I64 | DType::I32 => int_kind,
            DType::Bool => matches!(self.kind, ReduceKind::Max | ReduceKind::Min),
            _ => false,
        };
        if !ok {
            return Err(OpError::Unsupported(format!(
                "{}: input dtype {} (supported: f32, f64; i64/i32 for Sum/Max/Min/Prod; bool for \
                 Max/Min)",
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
            (Data::F32(x), Data::F32(o)) => fold_float(self.kind, x, &groups, &mut o[range], start),
            (Data::F64(x), Data::F64(o)) => fold_float(self.kind, x, &groups, &mut o[range], start),
            (Data::I64(x), Data::I64(o)) => fold_int(self, x, &groups, &mut o[range], start)?,
            (Data::I32(x), Data::I32(o)) => fold_int(self, x, &groups, &mut o[range], start)?,
            (Data::Bool(x), Data::Bool(o)) => fold_int(self, x, &groups, &mut o[range], start)?,
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
    n: u32,
    start: u32,
    count: u32,
    select_last: u32,
    inf_bits: u32,
    _pad: [u32; 3],
}

/// Most inputs one `reduce.wgsl` invocation folds (four per loop round) or scans (ArgMax,
/// ArgMin: one per round) within llvmpipe's budget of 65,535 loop rounds per invocation, with
/// room for the offset loop of up to 8 kept groups. Past them a workgroup of
/// [`WIDE`] invocations takes each output element (`reduce_wide.wgsl`), up to `WIDE` times as
/// many; past those the GPU refuses the node (the CPU runs it).
const GPU_MOST_FOLDED: usize = 4 * 65_000;
const GPU_MOST_SCANNED: usize = 65_000;
/// Invocations a `reduce_wide.wgsl` workgroup (its `WIDE`).
const WIDE: usize = 64;

/// Up to this many output elements, each of at least [`WIDE_FROM_INPUTS`] inputs, take a
/// workgroup each even within one invocation's budget: one invocation leaves a workgroup's
/// other lanes idle. ReduceSum on lavapipe (2 threads, median of 30 runs, one invocation ->
/// a workgroup each): 1 x 4096 0.10-0.11 -> 0.08 ms, 1 x 20,000 0.21-0.35 -> 0.06-0.13, 2 x
/// 50,000 0.73-0.86 -> 0.26-0.29, 4 x 16,384 0.35-0.39 -> 0.21-0.31, 4 x 200,000 2.38-2.45 ->
/// 1.08-1.26; 16 x 50,000 even, 128 x 10,000 and up 1.6-3.2x slower (docs/bench.md, "Stride-2
/// MaxPools in registers; long GPU reductions on a workgroup per output; ...").
const WIDE_MOST_OUTPUTS: usize = 4;
const WIDE_FROM_INPUTS: usize = 4096;

/// The `reduce.wgsl` dispatch computing output elements `range` (one invocation each), or
/// `reduce_wide.wgsl`'s (one workgroup each) where one invocation may not fold them or a few
/// long folds would leave a workgroup's lanes idle.
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
    let (mut nk, mut nr) = (0, 0);
    let fits = |v: usize| u32::try_from(v).ok();
    let too_big = || OpError::Unsupported(format!("{name} on GPU: sizes exceed u32 / 8 groups"));
    for (red, dims, strs, count) in [
        (false, &mut p.kdims, &mut p.kstr, &mut nk),
        (true, &mut p.rdims, &mut p.rstr, &mut nr),
    ] {
        for (i, (size, stride)) in groups.of(red).enumerate() {
            if i >= 8 {
                return Err(too_big());
            }
            dims[i] = fits(size).ok_or_else(too_big)?;
            strs[i] = fits(stride).ok_or_else(too_big)?;
            *count = i + 1;
        }
    }
    p.n = fits(groups.reduce_count()).ok_or_else(too_big)?;
    let most = match op {
        GPU_ARGMAX | GPU_ARGMIN => GPU_MOST_SCANNED,
        _ => GPU_MOST_FOLDED,
    };
    let few_long = range.len() <= WIDE_MOST_OUTPUTS && p.n as usize >= WIDE_FROM_INPUTS;
    let wide = p.n as usize > most || few_long;
    if p.n as usize > WIDE * most {
        return Err(OpError::Unsupported(format!(
            "{name} on GPU: {} inputs per output element, past the {} a workgroup of {WIDE} \
             invocations may take (llvmpipe ends an invocation's loops after 65,535 rounds in \
             all; reduce_wide.wgsl)",
            p.n,
            WIDE * most
        )));
    }
    p.start = fits(range.start).ok_or_else(too_big)?;
    p.count = fits(range.len()).ok_or_else(too_big)?;
    p.select_last = select_last as u32;
    p.inf_bits = f32::INFINITY.to_bits();
    let (shader, wg) = match wide {
        true => (tandem_shaders::REDUCE_WIDE, grid_1d(range.len() as u64, 1)),
        false => (tandem_shaders::REDUCE, grid_1d(range.len() as u64, 64)),
    };
    // The op and the group counts are overrides: a pipeline each, their branches folded.
    Ok(vec![GpuKernel::new(shader, vec![0], vec![0], &p, wg)
        .with_override("OP", op as f64)
        .with_override("NK", nk as f64)
        .with_override("NR", nr.max(1) as f64)])
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
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        check_ins(self.name, ins, 1)?;
        if !matches!(
            ins[0].dtype,
            DType::F32 | DType::F64 | DType::I64 | DType::I32
        ) {
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
            Data::F64(v) => arg_fold(v, out, start, n, inner, self.max, self.select_last),
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

/// An integer (or bool) reduction: Sum, Max, Min and Prod only.
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

#[cfg(test)]
#[path = "reduce_tests.rs"]
mod tests;
