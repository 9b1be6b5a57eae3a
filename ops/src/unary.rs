//! Unary elementwise operators: activations (Relu, Sigmoid, Gelu...), math functions (Sqrt,
//! Exp, Erf...), Clip, Not, IsNaN and IsInf. One [`Unary`] struct serves them all, selected by
//! [`UnaryKind`]; the GPU side is `unary.wgsl` with the kind as its override `OP`.
//!
//! Sits between the registry (one constructor per ONNX op type below) and the shared
//! elementwise helpers in `elementwise_common.rs`.

use crate::elementwise_common::{
    check_rows, element_range, gpu_range, last_axis, par_map, typed, typed_mut, Elem,
};
use crate::{shape, Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use half::f16;
use std::ops::Range;

/// Which unary function; the discriminant is the `OP` override of `unary.wgsl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum UnaryKind {
    Relu = 0,
    LeakyRelu = 1,
    Sigmoid = 2,
    Tanh = 3,
    Erf = 4,
    Gelu = 5,
    GeluTanh = 6,
    HardSigmoid = 7,
    HardSwish = 8,
    Clip = 9,
    Sqrt = 10,
    Exp = 11,
    Log = 12,
    Neg = 13,
    Reciprocal = 14,
    Floor = 15,
    Ceil = 16,
    Round = 17,
    Abs = 18,
    Sign = 19,
    Sin = 20,
    Cos = 21,
    Softplus = 22,
    Softsign = 23,
    Elu = 24,
    Selu = 25,
    Not = 26,
    IsNaN = 27,
    IsInf = 28,
}

impl UnaryKind {
    /// Kinds that also accept integer tensors (i64, i32, i8).
    fn takes_ints(self) -> bool {
        use UnaryKind::*;
        matches!(self, Relu | Clip | Neg | Abs | Sign)
    }
}

/// A unary elementwise operator with its parsed attributes.
#[derive(Debug, Clone)]
pub struct Unary {
    name: &'static str,
    kind: UnaryKind,
    /// LeakyRelu/Elu/Selu/HardSigmoid alpha.
    alpha: f32,
    /// HardSigmoid beta.
    beta: f32,
    /// Selu gamma.
    gamma: f32,
    /// Clip bounds given as attributes (opset < 11).
    clip_attrs: Option<(f32, f32)>,
    /// IsInf detect_negative / detect_positive.
    detect: (bool, bool),
}

/// GPU parameters of `unary.wgsl` (32 bytes; the op and the element mode are overrides).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct UnaryParams {
    start: u32,
    count: u32,
    alpha: f32,
    beta: f32,
    gamma: f32,
    /// bit 0: IsInf detect_negative, bit 1: detect_positive, bit 2: wrap integer results to i8.
    flags: u32,
    imin: i32,
    imax: i32,
}

/// `UnaryParams::flags` bit: integer results wrap to i8 (held as i32 on the GPU).
const FLAG_WRAP_I8: u32 = 4;

/// A float element computed through f32 (f16 and f64 round-trip through f32).
trait FloatElem: Elem {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl FloatElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl FloatElem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl FloatElem for f64 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
}

/// An integer element for the integer-capable kinds (wrapping like two's complement C).
trait IntElem: Elem + Ord {
    const ZERO: Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn sign(self) -> Self;
    /// `v` converted with saturation (for Clip bounds).
    fn from_f64_sat(v: f64) -> Self;
}

impl IntElem for i64 {
    const ZERO: Self = 0;
    fn neg(self) -> Self {
        self.wrapping_neg()
    }
    fn abs(self) -> Self {
        self.wrapping_abs()
    }
    fn sign(self) -> Self {
        self.signum()
    }
    fn from_f64_sat(v: f64) -> Self {
        v as i64
    }
}

impl IntElem for i32 {
    const ZERO: Self = 0;
    fn neg(self) -> Self {
        self.wrapping_neg()
    }
    fn abs(self) -> Self {
        self.wrapping_abs()
    }
    fn sign(self) -> Self {
        self.signum()
    }
    fn from_f64_sat(v: f64) -> Self {
        v as i32
    }
}

impl IntElem for i8 {
    const ZERO: Self = 0;
    fn neg(self) -> Self {
        self.wrapping_neg()
    }
    fn abs(self) -> Self {
        self.wrapping_abs()
    }
    fn sign(self) -> Self {
        self.signum()
    }
    fn from_f64_sat(v: f64) -> Self {
        v as i8
    }
}

/// erf(x) in f32 by a rational approximation (odd numerator of degree 13 over an even
/// denominator of degree 8, inputs clamped to [-4, 4], exactly +-1 beyond 3.9); absolute error below 1e-6. The same
/// formula is in `unary.wgsl`.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906_3e-4;
    p = p * x2 - 2.954_600_2e-3;
    p = p * x2 - 1.609_603_3e-2;
    let mut q = -1.456_607_2e-5_f32;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329_3e-3;
    q = q * x2 - 1.426_474e-2;
    // erf rounds to +-1 in f32 beyond |x| = 3.9; the rational form is 1 ulp short there.
    if x.abs() > 3.9 {
        x.signum()
    } else {
        x * p / q
    }
}

#[inline(always)]
fn relu_f32(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

#[inline(always)]
fn clip_f32(x: f32, lo: f32, hi: f32) -> f32 {
    // NaN stays NaN; lo > hi gives hi (ONNX).
    let y = if x < lo { lo } else { x };
    if y > hi {
        hi
    } else {
        y
    }
}

#[inline(always)]
fn sign_f32(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x * 0.0
    }
}

#[inline(always)]
fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

/// ln(f32::MIN_POSITIVE): [`exp_f32`] gives 0 below it (where e^x is subnormal).
pub(crate) const EXP_UNDERFLOW: f32 = -87.336_55;
/// [`exp_f32`]'s clamp of x: e^x above the upper bound (about ln f32::MAX) is +inf.
pub(crate) const EXP_CLAMP: (f32, f32) = (-86.5, 88.722_8);
/// [`exp_f32`]'s ln 2 in two parts (Cody-Waite): `r = x - n hi - n lo`.
pub(crate) const LN2_PARTS: (f32, f32) = (0.693_359_4, -2.121_944_4e-4);
/// [`exp_f32`]'s polynomial (Cephes expf), highest degree first: `e^r = p(r) r^2 + r + 1`.
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// e^x in f32 without libm calls, so loops over it vectorise (SSE2 has no floor: n is
/// rounded with the 1.5 * 2^23 trick): Cody-Waite reduction to r in [-ln2/2, ln2/2], a
/// degree-6 polynomial (Cephes expf) and 2^n from exponent bits. Within 2 ulp for results
/// above 3e-38; inputs in [-87.34, -86.5] give ~3e-38, below -87.34 (whose e^x is subnormal) 0,
/// above 88.7228 +inf; NaN stays NaN. Never a subnormal: Softmax scales these values by
/// 1 / sum, and a masked attention row's ~3e-38 became subnormals there, which the GEMM after it
/// then read at Intel's microcode-assist speed (tiny Llama prefill: 3 ms per P @ V on a Xeon
/// instead of ~20 us).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    let (lo, hi) = EXP_CLAMP;
    let xc = x.clamp(lo, hi);
    let t = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let ni = t.to_bits() as i32 - MAGIC.to_bits() as i32;
    let r = xc - n * LN2_PARTS.0 - n * LN2_PARTS.1;
    let z = r * r;
    let mut p = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        p = p * r + c;
    }
    let y = p * z + r + 1.0;
    // 2^(n-1) stays a normal number for n in -125..=128; the factor 2 restores 2^n.
    let half_scale = f32::from_bits(((ni + 126) as u32) << 23);
    if x > hi {
        f32::INFINITY
    } else if x < EXP_UNDERFLOW {
        0.0
    } else {
        (y * half_scale) * 2.0
    }
}

/// tanh in f32 without libm calls: an odd polynomial below |x| = 0.625 (Cephes tanhf), else
/// 1 - 2 / (e^{2|x|} + 1) with the sign of x. Within 2e-7 absolute, 1e-6 relative.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let ax = x.abs();
    let s = x * x;
    let mut p = -5.704_988_7e-3_f32;
    p = p * s + 2.063_909e-2;
    p = p * s - 5.373_971_6e-2;
    p = p * s + 1.333_144_2e-1;
    p = p * s - 3.333_328e-1;
    let small = p * s * x + x;
    // Saturates beyond 10 (tanh = 1 in f32); NaN passes through the comparison.
    let m = if ax > 10.0 { 10.0 } else { ax };
    let big = (1.0 - 2.0 / (exp_f32(2.0 * m) + 1.0)).copysign(x);
    if ax < 0.625 {
        small
    } else {
        big
    }
}

/// Gelu's tanh approximation `0.5 x (1 + tanh u)`, `u = sqrt(2 / pi) (x + 0.044715 x^3)`, as
/// `x / (1 + e^{-2u})` (the same function: `(1 + tanh u) / 2` is the logistic of `2u`): one
/// exp and one division where tanh takes a polynomial, an exp, a division and a select, and no
/// cancellation in `1 + tanh u` for negative x. e^{-2u} overflowing to +inf gives -0, the limit.
#[inline(always)]
fn gelu_tanh_f32(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    x / (1.0 + exp_f32(-2.0 * u))
}

#[inline(always)]
fn softplus_f32(x: f32) -> f32 {
    // log(exp(x) + 1) without overflow.
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// sqrt(2 / pi), for Gelu's tanh approximation.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

impl Unary {
    /// Which function, with its `alpha` and `beta` attributes (for passes that fold the op
    /// into a Conv: HardSigmoid's slope and offset).
    pub fn kind_alpha_beta(&self) -> (UnaryKind, f32, f32) {
        (self.kind, self.alpha, self.beta)
    }

    fn boxed(attrs: &Attrs, name: &'static str, kind: UnaryKind) -> Result<Box<dyn Op>> {
        let mut op = Unary {
            name,
            kind,
            alpha: 0.0,
            beta: 0.0,
            gamma: 0.0,
            clip_attrs: None,
            detect: (true, true),
        };
        match kind {
            UnaryKind::LeakyRelu => op.alpha = attrs.float("alpha", 0.01)?,
            UnaryKind::Elu => op.alpha = attrs.float("alpha", 1.0)?,
            UnaryKind::Selu => {
                op.alpha = attrs.float("alpha", 1.673_263_2)?;
                op.gamma = attrs.float("gamma", 1.050_701)?;
            }
            UnaryKind::HardSigmoid => {
                op.alpha = attrs.float("alpha", 0.2)?;
                op.beta = attrs.float("beta", 0.5)?;
            }
            UnaryKind::Gelu => match attrs.string("approximate", "none")?.as_str() {
                "none" => {}
                "tanh" => op.kind = UnaryKind::GeluTanh,
                other => {
                    return Err(OpError::Invalid(format!(
                        "Gelu: attribute `approximate` must be \"none\" or \"tanh\", got {other:?}"
                    )))
                }
            },
            UnaryKind::Clip if attrs.opset < 11 => {
                op.clip_attrs =
                    Some((attrs.float("min", f32::MIN)?, attrs.float("max", f32::MAX)?));
            }
            UnaryKind::IsInf => {
                op.detect = (
                    attrs.int("detect_negative", 1)? != 0,
                    attrs.int("detect_positive", 1)? != 0,
                );
            }
            _ => {}
        }
        Ok(Box::new(op))
    }

    /// Clip bounds as f64 from attributes or from the optional inputs `min`, `max` (absent or
    /// empty means unbounded); `None` when an input bound is not available (`bound` returns
    /// `None` for it).
    fn clip_bounds(
        &self,
        n_ins: usize,
        bound: impl Fn(usize) -> Option<Option<f64>>,
    ) -> Option<(f64, f64)> {
        if let Some((lo, hi)) = self.clip_attrs {
            return Some((lo as f64, hi as f64));
        }
        let lo = if n_ins > 1 { bound(1)? } else { None };
        let hi = if n_ins > 2 { bound(2)? } else { None };
        Some((lo.unwrap_or(f64::NEG_INFINITY), hi.unwrap_or(f64::INFINITY)))
    }

    fn float_cpu<T: FloatElem>(&self, x: &[T], o: &mut [T], bounds: (f64, f64)) {
        use UnaryKind::*;
        // One dyn call per element: this path only serves f16/f64 (f32 has float_cpu_f32).
        let mut map =
            |f: &(dyn Fn(f32) -> f32 + Sync)| par_map(x, &mut *o, |v| T::from_f32(f(v.to_f32())));
        let (a, b, g) = (self.alpha, self.beta, self.gamma);
        let (lo, hi) = (bounds.0 as f32, bounds.1 as f32);
        match self.kind {
            Relu => map(&relu_f32),
            LeakyRelu => map(&|v| if v < 0.0 { a * v } else { v }),
            Sigmoid => map(&sigmoid_f32),
            Tanh => map(&f32::tanh),
            Erf => map(&erf_f32),
            Gelu => map(&|v| 0.5 * v * (1.0 + erf_f32(v * FRAC_1_SQRT_2))),
            GeluTanh => {
                map(&|v| 0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)).tanh()))
            }
            HardSigmoid => map(&|v| (a * v + b).clamp(0.0, 1.0)),
            HardSwish => map(&|v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
            Clip => map(&|v| clip_f32(v, lo, hi)),
            Sqrt => map(&f32::sqrt),
            Exp => map(&f32::exp),
            Log => map(&f32::ln),
            Neg => map(&|v| -v),
            Reciprocal => map(&|v| 1.0 / v),
            Floor => map(&f32::floor),
            Ceil => map(&f32::ceil),
            Round => map(&f32::round_ties_even),
            Abs => map(&f32::abs),
            Sign => map(&sign_f32),
            Sin => map(&f32::sin),
            Cos => map(&f32::cos),
            Softplus => map(&softplus_f32),
            Softsign => map(&|v| v / (1.0 + v.abs())),
            Elu => map(&|v| if v < 0.0 { a * (v.exp() - 1.0) } else { v }),
            Selu => map(&|v| {
                if v <= 0.0 {
                    g * (a * v.exp() - a)
                } else {
                    g * v
                }
            }),
            Not | IsNaN | IsInf => unreachable!("checked by dtype dispatch"),
        }
    }

    /// The f32 path with one monomorphised loop per kind (vectorisable for the simple kinds).
    fn float_cpu_f32(&self, x: &[f32], o: &mut [f32], bounds: (f64, f64)) {
        use UnaryKind::*;
        let (a, b, g) = (self.alpha, self.beta, self.gamma);
        let (lo, hi) = (bounds.0 as f32, bounds.1 as f32);
        match self.kind {
            Relu => par_map(x, o, relu_f32),
            LeakyRelu => par_map(x, o, |v| if v < 0.0 { a * v } else { v }),
            Sigmoid => par_map(x, o, sigmoid_f32),
            Tanh => par_map(x, o, tanh_f32),
            Erf => par_map(x, o, erf_f32),
            Gelu => par_map(x, o, |v| 0.5 * v * (1.0 + erf_f32(v * FRAC_1_SQRT_2))),
            GeluTanh => par_map(x, o, gelu_tanh_f32),
            HardSigmoid => par_map(x, o, |v| (a * v + b).clamp(0.0, 1.0)),
            HardSwish => par_map(x, o, |v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
            Clip => par_map(x, o, |v| clip_f32(v, lo, hi)),
            Sqrt => par_map(x, o, f32::sqrt),
            Exp => par_map(x, o, exp_f32),
            Log => par_map(x, o, f32::ln),
            Neg => par_map(x, o, |v| -v),
            Reciprocal => par_map(x, o, |v| 1.0 / v),
            Floor => par_map(x, o, f32::floor),
            Ceil => par_map(x, o, f32::ceil),
            Round => par_map(x, o, f32::round_ties_even),
            Abs => par_map(x, o, f32::abs),
            Sign => par_map(x, o, sign_f32),
            Sin => par_map(x, o, f32::sin),
            Cos => par_map(x, o, f32::cos),
            Softplus => par_map(x, o, softplus_f32),
            Softsign => par_map(x, o, |v| v / (1.0 + v.abs())),
            Elu => par_map(x, o, |v| if v < 0.0 { a * (exp_f32(v) - 1.0) } else { v }),
            Selu => par_map(x, o, |v| {
                if v <= 0.0 {
                    g * (a * exp_f32(v) - a)
                } else {
                    g * v
                }
            }),
            Not | IsNaN | IsInf => unreachable!("checked by dtype dispatch"),
        }
    }

    fn int_cpu<T: IntElem>(&self, x: &[T], o: &mut [T], bounds: (f64, f64)) {
        let (lo, hi) = (T::from_f64_sat(bounds.0), T::from_f64_sat(bounds.1));
        match self.kind {
            UnaryKind::Relu => par_map(x, o, |v| v.max(T::ZERO)),
            UnaryKind::Neg => par_map(x, o, T::neg),
            UnaryKind::Abs => par_map(x, o, T::abs),
            UnaryKind::Sign => par_map(x, o, T::sign),
            UnaryKind::Clip => par_map(x, o, |v| v.max(lo).min(hi)),
            _ => unreachable!("checked by takes_ints"),
        }
    }

    fn float_test_cpu<T: FloatElem>(&self, x: &[T], o: &mut [bool]) {
        let (neg, pos) = self.detect;
        if self.kind == UnaryKind::IsNaN {
            par_map(x, o, |v| v.to_f32().is_nan());
        } else {
            par_map(x, o, |v| {
                let v = v.to_f32();
                v.is_infinite() && (if v > 0.0 { pos } else { neg })
            });
        }
    }

    fn unsupported_dtype(&self, dt: DType) -> OpError {
        OpError::Unsupported(format!("{} on {dt} tensors", self.name))
    }
}

impl Op for Unary {
    fn name(&self) -> &'static str {
        self.name
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let max_ins = if self.kind == UnaryKind::Clip && self.clip_attrs.is_none() {
            3
        } else {
            1
        };
        let x = match ins.first() {
            Some(x) if ins.len() <= max_ins => x,
            _ => {
                return Err(OpError::Invalid(format!(
                    "{} takes 1..={max_ins} inputs, got {}",
                    self.name,
                    ins.len()
                )))
            }
        };
        let dt = x.dtype;
        let ok = match self.kind {
            UnaryKind::Not => dt == DType::Bool,
            k if k.takes_ints() => {
                dt.is_float() || matches!(dt, DType::I64 | DType::I32 | DType::I8)
            }
            _ => dt.is_float(),
        };
        if !ok {
            return Err(self.unsupported_dtype(dt));
        }
        for b in ins.iter().skip(1) {
            if b.numel() > 1 {
                return Err(OpError::Invalid(format!(
                    "Clip: min/max must be scalars, got shape {:?}",
                    b.shape
                )));
            }
        }
        let out_dt = match self.kind {
            UnaryKind::IsNaN | UnaryKind::IsInf => DType::Bool,
            _ => dt,
        };
        Ok(vec![TensorMeta::new(out_dt, x.shape.clone())])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        last_axis(outs)
    }

    fn row_local(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Vec<usize> {
        crate::op::same_shape_inputs(ins, outs)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let x = ins[0];
        let out = &mut outs[0];
        let numel = out.numel();
        check_rows(&rows, numel, self.name)?;
        let r = element_range(&rows, numel);
        let bounds = self
            .clip_bounds(ins.len(), |i| {
                Some((ins[i].numel() > 0).then(|| ins[i].data.get_f64(0)))
            })
            .unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
        let dt = x.dtype();
        let od = &mut out.data;
        match (self.kind, dt) {
            (UnaryKind::Not, DType::Bool) => par_map(
                &typed::<bool>(&x.data)?[r.clone()],
                &mut typed_mut::<bool>(od)?[r],
                |v| !v,
            ),
            (UnaryKind::IsNaN | UnaryKind::IsInf, DType::F32) => {
                self.float_test_cpu(&typed::<f32>(&x.data)?[r.clone()], &mut typed_mut(od)?[r])
            }
            (UnaryKind::IsNaN | UnaryKind::IsInf, DType::F16) => {
                self.float_test_cpu(&typed::<f16>(&x.data)?[r.clone()], &mut typed_mut(od)?[r])
            }
            (UnaryKind::IsNaN | UnaryKind::IsInf, DType::F64) => {
                self.float_test_cpu(&typed::<f64>(&x.data)?[r.clone()], &mut typed_mut(od)?[r])
            }
            (UnaryKind::Not | UnaryKind::IsNaN | UnaryKind::IsInf, _) => {
                return Err(self.unsupported_dtype(dt))
            }
            (_, DType::F32) => self.float_cpu_f32(
                &typed::<f32>(&x.data)?[r.clone()],
                &mut typed_mut(od)?[r],
                bounds,
            ),
            (_, DType::F16) => self.float_cpu(
                &typed::<f16>(&x.data)?[r.clone()],
                &mut typed_mut(od)?[r],
                bounds,
            ),
            (_, DType::F64) => self.float_cpu(
                &typed::<f64>(&x.data)?[r.clone()],
                &mut typed_mut(od)?[r],
                bounds,
            ),
            (k, DType::I64) if k.takes_ints() => self.int_cpu(
                &typed::<i64>(&x.data)?[r.clone()],
                &mut typed_mut(od)?[r],
                bounds,
            ),
            (k, DType::I32) if k.takes_ints() => self.int_cpu(
                &typed::<i32>(&x.data)?[r.clone()],
                &mut typed_mut(od)?[r],
                bounds,
            ),
            (k, DType::I8) if k.takes_ints() => self.int_cpu(
                &typed::<i8>(&x.data)?[r.clone()],
                &mut typed_mut(od)?[r],
                bounds,
            ),
            _ => return Err(self.unsupported_dtype(dt)),
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let dt = ins[0].dtype;
        let (mode, wrap) = match (self.kind, dt) {
            (UnaryKind::Not, DType::Bool) => (2, 0),
            (UnaryKind::Not, _) => return Err(self.unsupported_dtype(dt)),
            (_, d) if d.is_float() => (0, 0),
            (k, DType::I64 | DType::I32) if k.takes_ints() => (1, 0),
            (k, DType::I8) if k.takes_ints() => (1, FLAG_WRAP_I8),
            _ => {
                return Err(OpError::Unsupported(format!(
                    "{} on GPU: {dt} elements",
                    self.name
                )))
            }
        };
        let bounds = self.clip_bounds(ins.len(), |i| {
            ins[i]
                .value
                .as_ref()
                .map(|t| (t.numel() > 0).then(|| t.data.get_f64(0)))
        });
        let Some((lo, hi)) = bounds else {
            // Run-time bounds: Max then Min dispatches of binary.wgsl.
            return crate::binary::clip_gpu(ins, &outs[0], rows);
        };
        let numel = outs[0].numel();
        let (start, count) = gpu_range(&rows, numel, self.name)?;
        let sat = |v: f64| v.clamp(i32::MIN as f64, i32::MAX as f64) as i32;
        let p = UnaryParams {
            start,
            count,
            alpha: if self.kind == UnaryKind::Clip {
                lo as f32
            } else {
                self.alpha
            },
            beta: if self.kind == UnaryKind::Clip {
                hi as f32
            } else {
                self.beta
            },
            gamma: self.gamma,
            flags: self.detect.0 as u32 | (self.detect.1 as u32) << 1 | wrap,
            imin: sat(lo),
            imax: sat(hi),
        };
        let k = GpuKernel::new(
            tandem_shaders::UNARY,
            vec![0],
            vec![0],
            &p,
            shape::grid_1d(count as u64, 64),
        )
        .with_override("WG", 64.0)
        .with_override("OP", self.kind as u32 as f64)
        // 0: f32 elements, 1: i32 elements, 2: bool (u32) elements.
        .with_override("MODE", mode as f64);
        Ok(vec![k])
    }
}

/// ONNX `Relu`.
pub fn relu(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Relu", UnaryKind::Relu)
}
/// ONNX `LeakyRelu` (alpha, default 0.01).
pub fn leaky_relu(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "LeakyRelu", UnaryKind::LeakyRelu)
}
/// ONNX `Sigmoid`.
pub fn sigmoid_op(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Sigmoid", UnaryKind::Sigmoid)
}
/// ONNX `Tanh`.
pub fn tanh(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Tanh", UnaryKind::Tanh)
}
/// ONNX `Erf`.
pub fn erf(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Erf", UnaryKind::Erf)
}
/// ONNX `Gelu` (opset 20; approximate = none | tanh).
pub fn gelu(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Gelu", UnaryKind::Gelu)
}
/// ONNX `HardSigmoid` (alpha 0.2, beta 0.5).
pub fn hard_sigmoid(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "HardSigmoid", UnaryKind::HardSigmoid)
}
/// ONNX `HardSwish`.
pub fn hard_swish(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "HardSwish", UnaryKind::HardSwish)
}
/// ONNX `Clip`: min/max attributes before opset 11, optional scalar inputs from 11.
pub fn clip_op(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Clip", UnaryKind::Clip)
}
/// ONNX `Sqrt`.
pub fn sqrt(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Sqrt", UnaryKind::Sqrt)
}
/// ONNX `Exp`.
pub fn exp(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Exp", UnaryKind::Exp)
}
/// ONNX `Log` (natural logarithm).
pub fn log(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Log", UnaryKind::Log)
}
/// ONNX `Neg` (floats and signed integers).
pub fn neg(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Neg", UnaryKind::Neg)
}
/// ONNX `Reciprocal`.
pub fn reciprocal(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Reciprocal", UnaryKind::Reciprocal)
}
/// ONNX `Floor`.
pub fn floor(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Floor", UnaryKind::Floor)
}
/// ONNX `Ceil`.
pub fn ceil(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Ceil", UnaryKind::Ceil)
}
/// ONNX `Round` (half to even).
pub fn round(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Round", UnaryKind::Round)
}
/// ONNX `Abs` (floats and signed integers).
pub fn abs(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Abs", UnaryKind::Abs)
}
/// ONNX `Sign`.
pub fn sign_op(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Sign", UnaryKind::Sign)
}
/// ONNX `Sin`.
pub fn sin(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Sin", UnaryKind::Sin)
}
/// ONNX `Cos`.
pub fn cos(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Cos", UnaryKind::Cos)
}
/// ONNX `Softplus`.
pub fn softplus_op(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Softplus", UnaryKind::Softplus)
}
/// ONNX `Softsign`.
pub fn softsign(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Softsign", UnaryKind::Softsign)
}
/// ONNX `Elu` (alpha 1.0).
pub fn elu(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Elu", UnaryKind::Elu)
}
/// ONNX `Selu` (alpha 1.67326, gamma 1.0507).
pub fn selu(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Selu", UnaryKind::Selu)
}
/// ONNX `Not` (bool).
pub fn not(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "Not", UnaryKind::Not)
}
/// ONNX `IsNaN`.
pub fn is_nan(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "IsNaN", UnaryKind::IsNaN)
}
/// ONNX `IsInf` (detect_negative, detect_positive).
pub fn is_inf(a: &Attrs) -> Result<Box<dyn Op>> {
    Unary::boxed(a, "IsInf", UnaryKind::IsInf)
}

#[cfg(test)]
#[path = "elementwise_unary_tests.rs"]
mod tests;
