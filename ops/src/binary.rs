//! Binary and variadic elementwise operators with numpy broadcasting: arithmetic (Add, Sub,
//! Mul, Div, Pow, Mod, PRelu), comparisons (Equal, Less...), logic (And, Or, Xor) and the
//! variadic Sum, Mean, Max, Min. One [`Binary`] struct serves them all, selected by
//! [`BinaryKind`]; the GPU side is `binary.wgsl` with the kind as its override `OP`.
//!
//! Sits between the registry (one constructor per ONNX op type below) and the shared
//! broadcasting machinery of `elementwise_common.rs`. The typed kernels here
//! (`zip_broadcast`, `map_broadcast`) are reused by `where_op.rs`-style callers.

use crate::elementwise_common::{
    check_rows, element_range, gpu_broadcast, gpu_range, last_axis, typed, typed_mut, Broadcast,
    Elem, GpuDims,
};
use crate::{shape, Attrs, DType, Data, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use half::f16;
use std::ops::Range;

#[path = "elementwise_arith.rs"]
mod arith;
use arith::Arith;

/// Which binary function; the discriminant is the `OP` override of `binary.wgsl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum BinaryKind {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Pow = 4,
    Max = 5,
    Min = 6,
    /// Mod with fmod = 0: the result has the sign of the divisor.
    Mod = 7,
    /// Mod with fmod = 1: the result has the sign of the dividend (C fmod).
    Fmod = 8,
    PRelu = 9,
    Equal = 10,
    Less = 11,
    Greater = 12,
    LessOrEqual = 13,
    GreaterOrEqual = 14,
    And = 15,
    Or = 16,
    Xor = 17,
    /// out = a (a variadic op with a single input); GPU only.
    First = 18,
}

impl BinaryKind {
    fn is_compare(self) -> bool {
        use BinaryKind::*;
        matches!(self, Equal | Less | Greater | LessOrEqual | GreaterOrEqual)
    }

    fn is_logic(self) -> bool {
        matches!(self, BinaryKind::And | BinaryKind::Or | BinaryKind::Xor)
    }
}

/// A binary (two inputs) or variadic (1..N inputs, folded left) elementwise operator.
#[derive(Debug, Clone)]
pub struct Binary {
    name: &'static str,
    kind: BinaryKind,
    /// Sum/Mean/Max/Min: any number of inputs >= 1.
    variadic: bool,
    /// Mean: divide the folded sum by the number of inputs.
    mean: bool,
}

/// GPU parameters of `binary.wgsl` (112 bytes). The op, the element mode, the flags and the
/// rank are its overrides `OP`, `MODE`, `FLAGS`, `RANK`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct BinaryParams {
    start: u32,
    count: u32,
    divisor: f32,
    _pad: u32,
    dims: GpuDims,
    a_strides: GpuDims,
    b_strides: GpuDims,
}

// `FLAGS` bits of `binary.wgsl`.
/// Read `a` from the output itself (variadic fold).
const FLAG_ACCUMULATE: u32 = 1;
/// `b` is of the other numeric kind than `a` (Pow: f32 base with i32 exponent or the reverse).
const FLAG_B_OTHER: u32 = 2;
/// Divide the result by `divisor` (Mean).
const FLAG_DIVIDE: u32 = 4;
/// Integer results wrap to i8 / u8 (those are held as i32 on the GPU).
const FLAG_WRAP_I8: u32 = 16;
const FLAG_WRAP_U8: u32 = 32;

/// `out[r] = f(a, b)` with `a`, `b` broadcast by `bc` to the output; `out` is the output
/// block of range `r`. Inner loops are plain slice loops, specialised per broadcast pattern
/// and run on the widest vectors the CPU has (`crate::simd`).
pub(crate) fn zip_broadcast<A: Elem, B: Elem, U: Elem>(
    bc: &Broadcast<2>,
    a: &[A],
    b: &[B],
    out: &mut [U],
    r: Range<usize>,
    f: impl Fn(A, B) -> U + Sync,
) {
    let [sa, sb] = bc.inner_strides();
    bc.par_runs(out, r, |o, [ia, ib]| {
        let n = o.len();
        match (sa, sb) {
            (1, 1) => zip_run(o, &a[ia..ia + n], &b[ib..ib + n], &f),
            (1, _) => zip_run_scalar_b(o, &a[ia..ia + n], b[ib], &f),
            (_, 1) => zip_run_scalar_a(o, a[ia], &b[ib..ib + n], &f),
            _ => o.fill(f(a[ia], b[ib])),
        }
    });
}

crate::simd::kernel! {
    /// `o[i] = f(a[i], b[i])`; the three slices have equal length.
    pub(crate) fn zip_run<A: Copy, B: Copy, U: Copy, F: Fn(A, B) -> U>(o: &mut [U], a: &[A], b: &[B], f: &F) {
        for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    }
}

crate::simd::kernel! {
    /// `o[i] = f(a[i], y)`; `o` and `a` have equal length.
    fn zip_run_scalar_b<A: Copy, B: Copy, U: Copy, F: Fn(A, B) -> U>(
        o: &mut [U],
        a: &[A],
        y: B,
        f: &F,
    ) {
        for (o, &x) in o.iter_mut().zip(a) {
            *o = f(x, y);
        }
    }
}

crate::simd::kernel! {
    /// `o[i] = f(x, b[i])`; `o` and `b` have equal length.
    fn zip_run_scalar_a<A: Copy, B: Copy, U: Copy, F: Fn(A, B) -> U>(
        o: &mut [U],
        x: A,
        b: &[B],
        f: &F,
    ) {
        for (o, &y) in o.iter_mut().zip(b) {
            *o = f(x, y);
        }
    }
}

/// `out[r] = f(a)` with `a` broadcast by `bc` to the output (`out` is the block of `r`).
pub(crate) fn map_broadcast<A: Elem, U: Elem>(
    bc: &Broadcast<1>,
    a: &[A],
    out: &mut [U],
    r: Range<usize>,
    f: impl Fn(A) -> U + Sync,
) {
    let [sa] = bc.inner_strides();
    bc.par_runs(out, r, |o, [ia]| {
        let n = o.len();
        if sa == 1 {
            crate::simd::map(&a[ia..ia + n], o, &f);
        } else {
            o.fill(f(a[ia]));
        }
    });
}

/// `out[r] = f(out[r], b)` with `b` broadcast by `bc` to the output (the variadic fold).
fn fold_broadcast<B: Elem, U: Elem>(
    bc: &Broadcast<1>,
    b: &[B],
    out: &mut [U],
    r: Range<usize>,
    f: impl Fn(U, B) -> U + Sync,
) {
    let [sb] = bc.inner_strides();
    bc.par_runs(out, r, |o, [ib]| {
        let n = o.len();
        if sb == 1 {
            fold_run(o, &b[ib..ib + n], &f);
        } else {
            let y = b[ib];
            crate::simd::map_in_place(o, &|v| f(v, y));
        }
    });
}

crate::simd::kernel! {
    /// `o[i] = f(o[i], b[i])`; `o` and `b` have equal length.
    fn fold_run<B: Copy, U: Copy, F: Fn(U, B) -> U>(o: &mut [U], b: &[B], f: &F) {
        for (o, &y) in o.iter_mut().zip(b) {
            *o = f(*o, y);
        }
    }
}

impl Binary {
    fn boxed(name: &'static str, kind: BinaryKind, variadic: bool) -> Result<Box<dyn Op>> {
        Ok(Box::new(Binary {
            name,
            kind,
            variadic,
            mean: false,
        }))
    }

    fn arity_error(&self, n: usize) -> OpError {
        let want = if self.variadic { "at least 1" } else { "2" };
        OpError::Invalid(format!("{} takes {want} inputs, got {n}", self.name))
    }

    fn unsupported(&self, what: impl std::fmt::Display) -> OpError {
        OpError::Unsupported(format!("{} on {what}", self.name))
    }

    /// Arithmetic kinds on one element type, two operands.
    fn arith_pair<T: Arith>(
        &self,
        bc: &Broadcast<2>,
        a: &Data,
        b: &Data,
        out: &mut Data,
        r: Range<usize>,
    ) -> Result<()> {
        use BinaryKind::*;
        let (a, b) = (typed::<T>(a)?, typed::<T>(b)?);
        let o = &mut typed_mut::<T>(out)?[r.clone()];
        match self.kind {
            Add => zip_broadcast(bc, a, b, o, r, T::add),
            Sub => zip_broadcast(bc, a, b, o, r, T::sub),
            Mul => zip_broadcast(bc, a, b, o, r, T::mul),
            Div => zip_broadcast(bc, a, b, o, r, T::div),
            Pow => zip_broadcast(bc, a, b, o, r, T::pow),
            Max => zip_broadcast(bc, a, b, o, r, T::max),
            Min => zip_broadcast(bc, a, b, o, r, T::min),
            Mod => zip_broadcast(bc, a, b, o, r, T::rem_floor),
            Fmod => zip_broadcast(bc, a, b, o, r, T::rem_trunc),
            PRelu => zip_broadcast(bc, a, b, o, r, T::prelu),
            _ => unreachable!("not an arithmetic kind"),
        }
        Ok(())
    }

    /// Folds one more variadic operand into the output block.
    fn arith_fold<T: Arith>(
        &self,
        bc: &Broadcast<1>,
        b: &Data,
        out: &mut Data,
        r: Range<usize>,
    ) -> Result<()> {
        let b = typed::<T>(b)?;
        let o = &mut typed_mut::<T>(out)?[r.clone()];
        match self.kind {
            BinaryKind::Add => fold_broadcast(bc, b, o, r, T::add),
            BinaryKind::Max => fold_broadcast(bc, b, o, r, T::max),
            BinaryKind::Min => fold_broadcast(bc, b, o, r, T::min),
            _ => unreachable!("only Sum/Mean/Max/Min are variadic"),
        }
        Ok(())
    }

    /// Copies the single operand of a one-input variadic op, or divides by the count (Mean).
    fn arith_single<T: Arith>(
        &self,
        bc: &Broadcast<1>,
        a: &Data,
        out: &mut Data,
        r: Range<usize>,
    ) -> Result<()> {
        let a = typed::<T>(a)?;
        let o = &mut typed_mut::<T>(out)?[r.clone()];
        map_broadcast(bc, a, o, r, |x| x);
        Ok(())
    }

    fn arith_mean<T: Arith>(
        &self,
        n: usize,
        out: &mut Data,
        r: Range<usize>,
        out_shape: &[usize],
    ) -> Result<()> {
        let o = &mut typed_mut::<T>(out)?[r.clone()];
        let d = T::from_count(n);
        Broadcast::<0>::new([], out_shape).par_runs(o, r, |o, []| {
            crate::simd::map_in_place(o, &|v| T::div(v, d))
        });
        Ok(())
    }

    fn compare_pair<T: Elem + PartialOrd>(
        &self,
        bc: &Broadcast<2>,
        a: &Data,
        b: &Data,
        out: &mut Data,
        r: Range<usize>,
    ) -> Result<()> {
        use BinaryKind::*;
        let (a, b) = (typed::<T>(a)?, typed::<T>(b)?);
        let o = &mut typed_mut::<bool>(out)?[r.clone()];
        match self.kind {
            Equal => zip_broadcast(bc, a, b, o, r, |x, y| x == y),
            Less => zip_broadcast(bc, a, b, o, r, |x, y| x < y),
            Greater => zip_broadcast(bc, a, b, o, r, |x, y| x > y),
            LessOrEqual => zip_broadcast(bc, a, b, o, r, |x, y| x <= y),
            GreaterOrEqual => zip_broadcast(bc, a, b, o, r, |x, y| x >= y),
            _ => unreachable!("not a comparison"),
        }
        Ok(())
    }

    fn logic_pair(
        &self,
        bc: &Broadcast<2>,
        a: &Data,
        b: &Data,
        out: &mut Data,
        r: Range<usize>,
    ) -> Result<()> {
        let (a, b) = (typed::<bool>(a)?, typed::<bool>(b)?);
        let o = &mut typed_mut::<bool>(out)?[r.clone()];
        match self.kind {
            BinaryKind::And => zip_broadcast(bc, a, b, o, r, |x, y| x & y),
            BinaryKind::Or => zip_broadcast(bc, a, b, o, r, |x, y| x | y),
            _ => zip_broadcast(bc, a, b, o, r, |x, y| x ^ y),
        }
        Ok(())
    }

    /// Pow whose operands have different element types: computed in f64, converted to the
    /// base's type (floats round, integers truncate toward zero).
    fn pow_mixed(
        &self,
        bc: &Broadcast<2>,
        a: &Tensor,
        b: &Tensor,
        out: &mut Data,
        r: Range<usize>,
    ) -> Result<()> {
        let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
        let mut tmp = vec![0f64; r.len()];
        zip_broadcast(bc, &a, &b, &mut tmp, r.clone(), f64::powf);
        let from =
            |f: &mut dyn FnMut(usize, f64)| tmp.iter().enumerate().for_each(|(i, &v)| f(i, v));
        match out {
            Data::F32(o) => from(&mut |i, v| o[r.start + i] = v as f32),
            Data::F64(o) => from(&mut |i, v| o[r.start + i] = v),
            Data::F16(o) => from(&mut |i, v| o[r.start + i] = f16::from_f64(v)),
            Data::I64(o) => from(&mut |i, v| o[r.start + i] = v as i64),
            Data::I32(o) => from(&mut |i, v| o[r.start + i] = v as i32),
            Data::I8(o) => from(&mut |i, v| o[r.start + i] = v as i64 as i8),
            Data::U8(o) => from(&mut |i, v| o[r.start + i] = v as i64 as u8),
            Data::Bool(_) => return Err(self.unsupported("bool tensors")),
        }
        Ok(())
    }

    /// Dispatches the first operand pair on the element type.
    fn pair(&self, a: &Tensor, b: &Tensor, out: &mut Tensor, r: Range<usize>) -> Result<()> {
        let bc = Broadcast::new([&a.shape, &b.shape], &out.shape);
        let (ad, bd, od) = (&a.data, &b.data, &mut out.data);
        let dt = a.dtype();
        if self.kind.is_logic() {
            return self.logic_pair(&bc, ad, bd, od, r);
        }
        if self.kind.is_compare() {
            return match dt {
                DType::F32 => self.compare_pair::<f32>(&bc, ad, bd, od, r),
                DType::F64 => self.compare_pair::<f64>(&bc, ad, bd, od, r),
                DType::F16 => self.compare_pair::<f16>(&bc, ad, bd, od, r),
                DType::I64 => self.compare_pair::<i64>(&bc, ad, bd, od, r),
                DType::I32 => self.compare_pair::<i32>(&bc, ad, bd, od, r),
                DType::I8 => self.compare_pair::<i8>(&bc, ad, bd, od, r),
                DType::U8 => self.compare_pair::<u8>(&bc, ad, bd, od, r),
                DType::Bool => self.compare_pair::<bool>(&bc, ad, bd, od, r),
            };
        }
        if dt != b.dtype() {
            return self.pow_mixed(&bc, a, b, od, r);
        }
        match dt {
            DType::F32 => self.arith_pair::<f32>(&bc, ad, bd, od, r),
            DType::F64 => self.arith_pair::<f64>(&bc, ad, bd, od, r),
            DType::F16 => self.arith_pair::<f16>(&bc, ad, bd, od, r),
            DType::I64 => self.arith_pair::<i64>(&bc, ad, bd, od, r),
            DType::I32 => self.arith_pair::<i32>(&bc, ad, bd, od, r),
            DType::I8 => self.arith_pair::<i8>(&bc, ad, bd, od, r),
            DType::U8 => self.arith_pair::<u8>(&bc, ad, bd, od, r),
            DType::Bool => Err(self.unsupported("bool tensors")),
        }
    }

    /// The variadic steps other than the first pair: a single operand, folds, Mean's division.
    fn variadic_rest(&self, ins: &[&Tensor], out: &mut Tensor, r: Range<usize>) -> Result<()> {
        let dt = out.dtype();
        let shape = out.shape.clone();
        let od = &mut out.data;
        if ins.len() == 1 {
            let bc = Broadcast::new([&ins[0].shape], &shape);
            let ad = &ins[0].data;
            match dt {
                DType::F32 => self.arith_single::<f32>(&bc, ad, od, r.clone()),
                DType::F64 => self.arith_single::<f64>(&bc, ad, od, r.clone()),
                DType::F16 => self.arith_single::<f16>(&bc, ad, od, r.clone()),
                DType::I64 => self.arith_single::<i64>(&bc, ad, od, r.clone()),
                DType::I32 => self.arith_single::<i32>(&bc, ad, od, r.clone()),
                DType::I8 => self.arith_single::<i8>(&bc, ad, od, r.clone()),
                DType::U8 => self.arith_single::<u8>(&bc, ad, od, r.clone()),
                DType::Bool => Err(self.unsupported("bool tensors")),
            }?;
        }
        for b in ins.iter().skip(2) {
            let bc = Broadcast::new([&b.shape], &shape);
            let bd = &b.data;
            match dt {
                DType::F32 => self.arith_fold::<f32>(&bc, bd, od, r.clone()),
                DType::F64 => self.arith_fold::<f64>(&bc, bd, od, r.clone()),
                DType::F16 => self.arith_fold::<f16>(&bc, bd, od, r.clone()),
                DType::I64 => self.arith_fold::<i64>(&bc, bd, od, r.clone()),
                DType::I32 => self.arith_fold::<i32>(&bc, bd, od, r.clone()),
                DType::I8 => self.arith_fold::<i8>(&bc, bd, od, r.clone()),
                DType::U8 => self.arith_fold::<u8>(&bc, bd, od, r.clone()),
                DType::Bool => Err(self.unsupported("bool tensors")),
            }?;
        }
        if self.mean && ins.len() > 1 {
            match dt {
                DType::F32 => self.arith_mean::<f32>(ins.len(), od, r, &shape),
                DType::F64 => self.arith_mean::<f64>(ins.len(), od, r, &shape),
                DType::F16 => self.arith_mean::<f16>(ins.len(), od, r, &shape),
                _ => Err(self.unsupported(format!("{dt} tensors"))),
            }?;
        }
        Ok(())
    }

    /// GPU element mode of an operand type (see [`gpu_mode`]), or `Unsupported`.
    fn gpu_mode(&self, dt: DType) -> Result<(u32, u32)> {
        let bool_ok = self.kind.is_logic() || self.kind == BinaryKind::Equal;
        gpu_mode(dt, bool_ok)
            .ok_or_else(|| OpError::Unsupported(format!("{} on GPU: {dt} elements", self.name)))
    }
}

/// GPU element mode of an operand type and the flags that wrap integer results to it:
/// (0, 0) float, (1, wrap) integer, (2, 0) bool (when `bool_ok`).
fn gpu_mode(dt: DType, bool_ok: bool) -> Option<(u32, u32)> {
    match dt {
        d if d.is_float() => Some((0, 0)),
        DType::I64 | DType::I32 => Some((1, 0)),
        DType::I8 => Some((1, FLAG_WRAP_I8)),
        DType::U8 => Some((1, FLAG_WRAP_U8)),
        DType::Bool if bool_ok => Some((2, 0)),
        _ => None,
    }
}

/// One dispatch of `binary.wgsl` over output elements `start..start + count`.
struct Step {
    op: BinaryKind,
    /// Op input bound as `a` (ignored by the shader when `accumulate`).
    a: usize,
    /// Op input bound as `b`.
    b: usize,
    /// Read `a` from the output (a fold over earlier dispatches).
    accumulate: bool,
}

/// The kernels of `steps` for an output `out`, with the common `mode` and `flags`; the last
/// step divides by `divide_by` when given (Mean).
fn gpu_steps(
    name: &str,
    steps: &[Step],
    ins: &[&TensorMeta],
    out: &TensorMeta,
    rows: &Range<usize>,
    (mode, flags): (u32, u32),
    divide_by: Option<usize>,
) -> Result<Vec<GpuKernel>> {
    let (start, count) = gpu_range(rows, out.numel(), name)?;
    let wg = shape::grid_1d(count as u64, 64);
    let mut kernels = Vec::with_capacity(steps.len());
    for (s, st) in steps.iter().enumerate() {
        let (a_shape, b_shape) = (&ins[st.a].shape, &ins[st.b].shape);
        let (rank, dims, [a_strides, b_strides]) =
            gpu_broadcast([a_shape, b_shape], &out.shape, name)?;
        let mut f = flags;
        if st.accumulate {
            f |= FLAG_ACCUMULATE;
        }
        if divide_by.is_some() && s + 1 == steps.len() {
            f |= FLAG_DIVIDE;
        }
        let p = BinaryParams {
            start,
            count,
            divisor: divide_by.unwrap_or(1) as f32,
            _pad: 0,
            dims,
            a_strides,
            b_strides,
        };
        kernels.push(
            GpuKernel::new(tandem_shaders::BINARY, vec![st.a, st.b], vec![0], &p, wg)
                .with_override("WG", 64.0)
                .with_override("OP", st.op as u32 as f64)
                // 0: f32 operands, 1: i32 operands, 2: bool (u32) operands.
                .with_override("MODE", mode as f64)
                .with_override("FLAGS", f as f64)
                .with_override("RANK", rank as f64),
        );
    }
    Ok(kernels)
}

/// GPU kernels of `Clip(x, min, max)` whose bounds are run-time tensors: `Max` with the lower
/// bound, then `Min` with the upper one folded into the output (empty bounds are skipped).
/// NaN stays NaN and `min > max` gives `max`, as in ONNX.
pub(crate) fn clip_gpu(
    ins: &[&TensorMeta],
    out: &TensorMeta,
    rows: Range<usize>,
) -> Result<Vec<GpuKernel>> {
    let dt = ins[0].dtype;
    let mode = gpu_mode(dt, false)
        .ok_or_else(|| OpError::Unsupported(format!("Clip on GPU: {dt} elements")))?;
    let mut steps = Vec::new();
    for (i, op) in [(1, BinaryKind::Max), (2, BinaryKind::Min)] {
        if ins.len() > i && ins[i].numel() > 0 {
            let accumulate = !steps.is_empty();
            let a = if accumulate { i } else { 0 };
            steps.push(Step {
                op,
                a,
                b: i,
                accumulate,
            });
        }
    }
    if steps.is_empty() {
        steps.push(Step {
            op: BinaryKind::First,
            a: 0,
            b: 0,
            accumulate: false,
        });
    }
    gpu_steps("Clip", &steps, ins, out, &rows, mode, None)
}

impl Op for Binary {
    fn name(&self) -> &'static str {
        self.name
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        if ins.is_empty() || (!self.variadic && ins.len() != 2) {
            return Err(self.arity_error(ins.len()));
        }
        let dt = ins[0].dtype;
        for m in &ins[1..] {
            if m.dtype != dt && self.kind != BinaryKind::Pow {
                return Err(OpError::Invalid(format!(
                    "{}: operand types differ ({dt} and {})",
                    self.name, m.dtype
                )));
            }
        }
        let k = self.kind;
        let ok = if k.is_logic() {
            dt == DType::Bool
        } else if k == BinaryKind::Equal {
            true
        } else if self.mean || (self.variadic && k == BinaryKind::Add) {
            dt.is_float()
        } else {
            dt != DType::Bool
        };
        if !ok || (k == BinaryKind::Pow && ins[1].dtype == DType::Bool) {
            return Err(self.unsupported(format!("{dt} tensors")));
        }
        let shapes: Vec<&[usize]> = ins.iter().map(|m| m.shape.as_slice()).collect();
        let out_shape = shape::broadcast_shapes(&shapes)?;
        if k == BinaryKind::PRelu && out_shape != ins[0].shape {
            return Err(OpError::Invalid(format!(
                "PRelu: slope shape {:?} does not broadcast to X shape {:?}",
                ins[1].shape, ins[0].shape
            )));
        }
        let out_dt = if k.is_compare() { DType::Bool } else { dt };
        Ok(vec![TensorMeta::new(out_dt, out_shape)])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        last_axis(outs)
    }

    fn row_local(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Vec<usize> {
        crate::op::same_shape_inputs(ins, outs)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        if ins.is_empty() || (!self.variadic && ins.len() != 2) {
            return Err(self.arity_error(ins.len()));
        }
        let out = &mut outs[0];
        let numel = out.numel();
        check_rows(&rows, numel, self.name)?;
        let r = element_range(&rows, numel);
        if r.is_empty() {
            return Ok(());
        }
        if ins.len() >= 2 {
            self.pair(ins[0], ins[1], out, r.clone())?;
        }
        if self.variadic {
            self.variadic_rest(ins, out, r)?;
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let a_dt = ins[0].dtype;
        let (mode, mut flags) = self.gpu_mode(a_dt)?;
        if ins.len() > 1 && ins[1].dtype != a_dt {
            // Only Pow mixes types: float base with integer exponent or the reverse.
            let (b_mode, _) = self.gpu_mode(ins[1].dtype)?;
            if b_mode == 2 || mode == 2 || b_mode == mode {
                return Err(OpError::Unsupported(format!(
                    "{} on GPU: {a_dt} base with {} exponent",
                    self.name, ins[1].dtype
                )));
            }
            flags |= FLAG_B_OTHER;
        }
        let n = ins.len();
        let steps: Vec<Step> = if n == 1 {
            vec![Step {
                op: BinaryKind::First,
                a: 0,
                b: 0,
                accumulate: false,
            }]
        } else {
            std::iter::once(Step {
                op: self.kind,
                a: 0,
                b: 1,
                accumulate: false,
            })
            .chain((2..n).map(|k| Step {
                op: self.kind,
                a: k,
                b: k,
                accumulate: true,
            }))
            .collect()
        };
        let divide_by = (self.mean && n > 1).then_some(n);
        gpu_steps(
            self.name,
            &steps,
            ins,
            &outs[0],
            &rows,
            (mode, flags),
            divide_by,
        )
    }
}

/// ONNX `Add`.
pub fn add(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Add", BinaryKind::Add, false)
}
/// ONNX `Sub`.
pub fn sub(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Sub", BinaryKind::Sub, false)
}
/// ONNX `Mul`.
pub fn mul(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Mul", BinaryKind::Mul, false)
}
/// ONNX `Div` (integer division truncates toward zero; division by zero gives 0).
pub fn div(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Div", BinaryKind::Div, false)
}
/// ONNX `Pow` (the exponent may have another numeric type than the base).
pub fn pow(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Pow", BinaryKind::Pow, false)
}
/// ONNX `Mod` (fmod = 0: sign of the divisor; fmod = 1: sign of the dividend).
pub fn modulo(a: &Attrs) -> Result<Box<dyn Op>> {
    match a.int("fmod", 0)? {
        0 => Binary::boxed("Mod", BinaryKind::Mod, false),
        1 => Binary::boxed("Mod", BinaryKind::Fmod, false),
        v => Err(OpError::Invalid(format!(
            "Mod: attribute `fmod` must be 0 or 1, got {v}"
        ))),
    }
}
/// ONNX `PRelu` (slope broadcast to X).
pub fn prelu(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("PRelu", BinaryKind::PRelu, false)
}
/// ONNX `Equal`.
pub fn equal(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Equal", BinaryKind::Equal, false)
}
/// ONNX `Less`.
pub fn less(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Less", BinaryKind::Less, false)
}
/// ONNX `Greater`.
pub fn greater(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Greater", BinaryKind::Greater, false)
}
/// ONNX `LessOrEqual`.
pub fn less_or_equal(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("LessOrEqual", BinaryKind::LessOrEqual, false)
}
/// ONNX `GreaterOrEqual`.
pub fn greater_or_equal(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("GreaterOrEqual", BinaryKind::GreaterOrEqual, false)
}
/// ONNX `And` (bool).
pub fn and(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("And", BinaryKind::And, false)
}
/// ONNX `Or` (bool).
pub fn or(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Or", BinaryKind::Or, false)
}
/// ONNX `Xor` (bool).
pub fn xor(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Xor", BinaryKind::Xor, false)
}
/// ONNX `Sum` (variadic, floats).
pub fn sum(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Sum", BinaryKind::Add, true)
}
/// ONNX `Mean` (variadic, floats).
pub fn mean(_: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(Binary {
        name: "Mean",
        kind: BinaryKind::Add,
        variadic: true,
        mean: true,
    }))
}
/// ONNX `Max` (variadic; NaN propagates).
pub fn max(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Max", BinaryKind::Max, true)
}
/// ONNX `Min` (variadic; NaN propagates).
pub fn min(_: &Attrs) -> Result<Box<dyn Op>> {
    Binary::boxed("Min", BinaryKind::Min, true)
}

#[cfg(test)]
#[path = "elementwise_binary_tests.rs"]
mod tests;
