//! ONNX `Cast(to)` and `CastLike`: elementwise type conversion between f32, f16, f64, i64,
//! i32, i8, u8 and bool with ONNX semantics (float to integer truncates toward zero, integer
//! narrowing wraps, anything to bool is `!= 0`).
//!
//! Sits between the registry and the shared elementwise helpers (`elementwise_common.rs`).
//! On the GPU (`cast.wgsl`) every element is 4 bytes: floats are f32 (f16 targets are rounded
//! to f16 precision), integers i32 (i8/u8 targets wrap), bools u32.

use crate::elementwise_common::{
    check_rows, element_range, gpu_range, last_axis, par_map, typed, typed_mut, Elem,
};
use crate::{shape, Attrs, DType, Data, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use half::f16;
use std::ops::Range;

/// `Cast` (fixed target type) or `CastLike` (target type of input 1).
#[derive(Debug, Clone)]
pub struct Cast {
    /// `Some(t)` for Cast, `None` for CastLike.
    to: Option<DType>,
}

/// GPU parameters of `cast.wgsl` (16 bytes; the element kinds are its overrides `SRC`, `DST`).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct CastParams {
    start: u32,
    count: u32,
    _pad: [u32; 2],
}

/// The DType of an ONNX `TensorProto.DataType` code, if tandem supports it.
pub fn dtype_from_onnx(code: i64) -> Result<DType> {
    Ok(match code {
        1 => DType::F32,
        2 => DType::U8,
        3 => DType::I8,
        6 => DType::I32,
        7 => DType::I64,
        9 => DType::Bool,
        10 => DType::F16,
        11 => DType::F64,
        other => {
            return Err(OpError::Unsupported(format!(
                "Cast: target type code {other} (only float, float16, double, int64, int32, \
                 int8, uint8, bool)"
            )))
        }
    })
}

/// A source element: integers (and bool) convert through i64, floats through f64.
trait CastSrc: Elem {
    const IS_INT: bool;
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
}

/// A destination element.
trait CastDst: Elem {
    /// From a float: truncation toward zero (saturating) for integers, `!= 0` for bool.
    fn from_f64(v: f64) -> Self;
    /// From an integer: wrapping for narrower integers, `!= 0` for bool.
    fn from_i64(v: i64) -> Self;
}

impl CastSrc for f32 {
    const IS_INT: bool = false;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl CastSrc for f16 {
    const IS_INT: bool = false;
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn to_i64(self) -> i64 {
        f16::to_f64(self) as i64
    }
}
impl CastSrc for f64 {
    const IS_INT: bool = false;
    fn to_f64(self) -> f64 {
        self
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl CastSrc for i64 {
    const IS_INT: bool = true;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn to_i64(self) -> i64 {
        self
    }
}
impl CastSrc for i32 {
    const IS_INT: bool = true;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl CastSrc for i8 {
    const IS_INT: bool = true;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl CastSrc for u8 {
    const IS_INT: bool = true;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl CastSrc for bool {
    const IS_INT: bool = true;
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}

impl CastDst for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn from_i64(v: i64) -> Self {
        v as f32
    }
}
impl CastDst for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn from_i64(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
}
impl CastDst for f64 {
    fn from_f64(v: f64) -> Self {
        v
    }
    fn from_i64(v: i64) -> Self {
        v as f64
    }
}
impl CastDst for i64 {
    fn from_f64(v: f64) -> Self {
        v as i64
    }
    fn from_i64(v: i64) -> Self {
        v
    }
}
impl CastDst for i32 {
    fn from_f64(v: f64) -> Self {
        v as i32
    }
    fn from_i64(v: i64) -> Self {
        v as i32
    }
}
impl CastDst for i8 {
    /// Truncates toward zero, then wraps (as numpy and the GPU kernel do), never saturates.
    fn from_f64(v: f64) -> Self {
        v as i32 as i8
    }
    fn from_i64(v: i64) -> Self {
        v as i8
    }
}
impl CastDst for u8 {
    /// Truncates toward zero, then wraps (as numpy and the GPU kernel do), never saturates.
    fn from_f64(v: f64) -> Self {
        v as i32 as u8
    }
    fn from_i64(v: i64) -> Self {
        v as u8
    }
}
impl CastDst for bool {
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn from_i64(v: i64) -> Self {
        v != 0
    }
}

fn convert<S: CastSrc, D: CastDst>(src: &[S], dst: &mut [D]) {
    if S::IS_INT {
        par_map(src, dst, |v| D::from_i64(v.to_i64()));
    } else {
        par_map(src, dst, |v| D::from_f64(v.to_f64()));
    }
}

/// Converts `src[r]` into `out[r]` for any destination type.
fn convert_from<S: CastSrc>(src: &Data, out: &mut Data, r: Range<usize>) -> Result<()> {
    let s = &typed::<S>(src)?[r.clone()];
    match out.dtype() {
        DType::F32 => convert(s, &mut typed_mut::<f32>(out)?[r]),
        DType::F16 => convert(s, &mut typed_mut::<f16>(out)?[r]),
        DType::F64 => convert(s, &mut typed_mut::<f64>(out)?[r]),
        DType::I64 => convert(s, &mut typed_mut::<i64>(out)?[r]),
        DType::I32 => convert(s, &mut typed_mut::<i32>(out)?[r]),
        DType::I8 => convert(s, &mut typed_mut::<i8>(out)?[r]),
        DType::U8 => convert(s, &mut typed_mut::<u8>(out)?[r]),
        DType::Bool => convert(s, &mut typed_mut::<bool>(out)?[r]),
    }
    Ok(())
}

impl Cast {
    fn arity(&self) -> usize {
        if self.to.is_some() {
            1
        } else {
            2
        }
    }
}

impl Op for Cast {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        if self.to.is_some() {
            "Cast"
        } else {
            "CastLike"
        }
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        if ins.len() != self.arity() {
            return Err(OpError::Invalid(format!(
                "{} takes {} inputs, got {}",
                self.name(),
                self.arity(),
                ins.len()
            )));
        }
        let to = self.to.unwrap_or_else(|| ins[1].dtype);
        Ok(vec![TensorMeta::new(to, ins[0].shape.clone())])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        last_axis(outs)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let out = &mut outs[0];
        let numel = out.numel();
        check_rows(&rows, numel, self.name())?;
        let r = element_range(&rows, numel);
        let src = &ins[0].data;
        if src.len() != numel {
            return Err(OpError::Invalid(format!(
                "{}: input has {} elements, output {numel}",
                self.name(),
                src.len()
            )));
        }
        let od = &mut out.data;
        match src.dtype() {
            DType::F32 => convert_from::<f32>(src, od, r),
            DType::F16 => convert_from::<f16>(src, od, r),
            DType::F64 => convert_from::<f64>(src, od, r),
            DType::I64 => convert_from::<i64>(src, od, r),
            DType::I32 => convert_from::<i32>(src, od, r),
            DType::I8 => convert_from::<i8>(src, od, r),
            DType::U8 => convert_from::<u8>(src, od, r),
            DType::Bool => convert_from::<bool>(src, od, r),
        }
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let src = match ins[0].dtype {
            d if d.is_float() => 0,
            DType::Bool => 2,
            _ => 1,
        };
        let dst = match outs[0].dtype {
            DType::F32 | DType::F64 => 0,
            DType::F16 => 1,
            DType::I64 | DType::I32 => 2,
            DType::I8 => 3,
            DType::U8 => 4,
            DType::Bool => 5,
        };
        let (start, count) = gpu_range(&rows, outs[0].numel(), self.name())?;
        let p = CastParams {
            start,
            count,
            _pad: [0; 2],
        };
        let k = GpuKernel::new(
            tandem_shaders::CAST,
            vec![0],
            vec![0],
            &p,
            shape::grid_1d(count as u64, 64),
        )
        .with_override("WG", 64.0)
        // 0: f32, 1: i32, 2: bool.
        .with_override("SRC", src as f64)
        // 0: f32, 1: f32 rounded to f16, 2: i32, 3: i8, 4: u8, 5: bool.
        .with_override("DST", dst as f64);
        Ok(vec![k])
    }
}

/// ONNX `Cast` (attribute `to`, a TensorProto data type code; `saturate` only affects float8
/// types, which are not supported).
pub fn cast(a: &Attrs) -> Result<Box<dyn Op>> {
    let code = a
        .int_opt("to")?
        .ok_or_else(|| OpError::Invalid("Cast: attribute `to` is required".into()))?;
    Ok(Box::new(Cast {
        to: Some(dtype_from_onnx(code)?),
    }))
}

/// ONNX `CastLike` (target type of input 1).
pub fn cast_like(_: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(Cast { to: None }))
}

#[cfg(test)]
#[allow(clippy::cloned_ref_to_slice_refs)]
mod tests {
    use super::*;
    use crate::AttrValue;

    fn run(op: &dyn Op, ins: &[Tensor], rows: Option<Range<usize>>) -> Tensor {
        let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let om = op.infer(&refs).unwrap();
        let mut outs = vec![Tensor::zeros(om[0].dtype, &om[0].shape)];
        let n = om[0].numel().max(1);
        let ins: Vec<&Tensor> = ins.iter().collect();
        op.cpu(&ins, &mut outs, rows.unwrap_or(0..n)).unwrap();
        outs.remove(0)
    }

    fn cast_to(code: i64) -> Box<dyn Op> {
        cast(&Attrs::new(19).with("to", AttrValue::Int(code))).unwrap()
    }

    #[test]
    fn float_to_int_truncates_and_to_bool_is_nonzero() {
        let x = Tensor::f32(&[7], vec![-2.7, -0.5, 0.0, 0.9, 3.99, 1e10, f32::NAN]);
        assert_eq!(
            run(cast_to(7).as_ref(), &[x.clone()], None).data,
            Data::I64(vec![-2, 0, 0, 0, 3, 10_000_000_000, 0])
        );
        assert_eq!(
            run(cast_to(6).as_ref(), &[x.clone()], None).data.get_i64(4),
            3
        );
        assert_eq!(
            run(cast_to(9).as_ref(), &[x.clone()], None).data,
            Data::Bool(vec![true, true, false, true, true, true, true])
        );
        let h = run(cast_to(10).as_ref(), &[x.clone()], None);
        assert_eq!(h.data.get_f64(0), f16::from_f32(-2.7).to_f64());
        let d = run(cast_to(11).as_ref(), &[x], None);
        assert_eq!(d.data.get_f64(1), -0.5);
    }

    #[test]
    fn integer_narrowing_wraps_and_bool_sources() {
        let x = Tensor::i64(&[4], vec![300, -1, 127, -129]);
        assert_eq!(
            run(cast_to(3).as_ref(), &[x.clone()], None).data,
            Data::I8(vec![44, -1, 127, 127])
        );
        assert_eq!(
            run(cast_to(2).as_ref(), &[x.clone()], None).data,
            Data::U8(vec![44, 255, 127, 127])
        );
        assert_eq!(
            run(cast_to(1).as_ref(), &[x], None).data,
            Data::F32(vec![300.0, -1.0, 127.0, -129.0])
        );
        let b = Tensor::new(vec![2], Data::Bool(vec![true, false]));
        assert_eq!(
            run(cast_to(1).as_ref(), &[b.clone()], None).data,
            Data::F32(vec![1.0, 0.0])
        );
        assert_eq!(
            run(cast_to(7).as_ref(), &[b], None).data,
            Data::I64(vec![1, 0])
        );
        let u = Tensor::new(vec![2], Data::U8(vec![200, 0]));
        assert_eq!(
            run(cast_to(6).as_ref(), &[u], None).data,
            Data::I32(vec![200, 0])
        );
    }

    #[test]
    fn row_range_cast_like_and_errors() {
        let x = Tensor::f32(&[2, 2], vec![1.5, 2.5, 3.5, 4.5]);
        let got = run(cast_to(7).as_ref(), &[x.clone()], Some(1..3));
        assert_eq!(got.data, Data::I64(vec![0, 2, 3, 0]));
        let like = cast_like(&Attrs::new(19)).unwrap();
        let target = Tensor::new(vec![0], Data::I32(vec![]));
        assert_eq!(
            run(like.as_ref(), &[x.clone(), target], None).data,
            Data::I32(vec![1, 2, 3, 4])
        );
        assert!(cast(&Attrs::new(19)).is_err());
        assert!(matches!(
            cast(&Attrs::new(19).with("to", AttrValue::Int(8))),
            Err(OpError::Unsupported(_))
        ));
        // Scalars and empties.
        let s = Tensor::f32(&[], vec![-3.0]);
        assert_eq!(
            run(cast_to(7).as_ref(), &[s], None).data,
            Data::I64(vec![-3])
        );
        let e = Tensor::f32(&[0, 2], vec![]);
        assert_eq!(run(cast_to(9).as_ref(), &[e], None).numel(), 0);
    }

    #[test]
    fn large_cast_and_gpu_codes() {
        let n = 200_001;
        let x = Tensor::i64(&[n], (0..n as i64).map(|i| i - 100_000).collect());
        let got = run(cast_to(1).as_ref(), &[x], None);
        for (i, v) in got.as_f32().unwrap().iter().enumerate() {
            assert_eq!(*v, i as f32 - 100_000.0);
        }
        let m = TensorMeta::new(DType::F32, vec![3]);
        let o = TensorMeta::new(DType::U8, vec![3]);
        let k = cast_to(2).gpu(&[&m], &[o], 1..3).unwrap();
        let p: &CastParams = bytemuck::from_bytes(&k[0].params);
        let (src, dst) = (k[0].override_value("SRC"), k[0].override_value("DST"));
        assert_eq!((p.start, p.count, src, dst), (1, 2, Some(0.0), Some(4.0)));
    }
}
