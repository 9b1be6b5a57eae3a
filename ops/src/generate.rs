//! Operators whose outputs are generated rather than moved: Shape, Size, ConstantOfShape,
//! Range, Constant, Trilu and EyeLike.
//!
//! Sits between the operator contract (`op.rs`) and `generate.wgsl` (fill, range, triangle,
//! small tables). Shape-deciding inputs (ConstantOfShape's shape, Range's scalars) are read at
//! plan time; Constant's value is an attribute and is folded by the planner.

use crate::movement::{
    absent, check_gpu_size, first_axis, for_each_chunk, gpu_word, plan_value, row_elems,
    with_same_type, Elem, SameTypeKernel, PIECE,
};
use crate::pad::scalar_of;
use crate::shape::grid_1d;
use crate::{AttrValue, Attrs, DType, Data, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use std::ops::Range;

/// Parameters of `generate.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct GenParams {
    op: u32,
    start: u32,
    count: u32,
    value: u32,
    f_start: f32,
    f_delta: f32,
    i_start: i32,
    i_delta: i32,
    rows: u32,
    cols: u32,
    k: i32,
    upper: u32,
    k_input: u32,
    _pad: [u32; 3],
    table: [u32; 16],
}

const OP_FILL: u32 = 0;
const OP_RANGE_F32: u32 = 1;
const OP_RANGE_I32: u32 = 2;
const OP_TRILU: u32 = 3;
const OP_TABLE: u32 = 4;
const OP_EYE: u32 = 5;

/// Binds op input `input` as `src` and `aux` (read-only twice), or `aux_input` as `aux`.
fn gen_kernel(p: GenParams, input: usize, aux_input: Option<usize>, output: usize) -> GpuKernel {
    GpuKernel::new(
        tandem_shaders::GENERATE,
        vec![input, aux_input.unwrap_or(input)],
        vec![output],
        &p,
        grid_1d(p.count as u64, 64),
    )
    .with_override("WG", 64.0)
}

/// A `generate.wgsl` dispatch writing `word` to elements `start..start + count` of op output
/// `output` (op input `input` is bound but not read). Used by ConstantOfShape and Dropout's mask.
pub fn fill_kernel(
    input: usize,
    output: usize,
    start: usize,
    count: usize,
    word: u32,
) -> GpuKernel {
    let p = GenParams {
        op: OP_FILL,
        start: start as u32,
        count: count as u32,
        value: word,
        ..Default::default()
    };
    gen_kernel(p, input, None, output)
}

/// A dispatch writing at most 16 known words (Shape, Size).
fn table_kernel(words: &[u32], op: &str) -> Result<Vec<GpuKernel>> {
    if words.len() > 16 {
        return Err(OpError::Unsupported(format!(
            "{op} on GPU: more than 16 output elements"
        )));
    }
    if words.is_empty() {
        return Ok(vec![]);
    }
    let mut p = GenParams {
        op: OP_TABLE,
        count: words.len() as u32,
        ..Default::default()
    };
    p.table[..words.len()].copy_from_slice(words);
    Ok(vec![gen_kernel(p, 0, None, 0)])
}

/// Shape (opset 15: `start`/`end` attributes) and Size.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeOf {
    size: bool,
    start: i64,
    end: Option<i64>,
}

pub fn shape(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(ShapeOf {
        size: false,
        start: attrs.int("start", 0)?,
        end: attrs.int_opt("end")?,
    }))
}

pub fn size(_attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(ShapeOf {
        size: true,
        start: 0,
        end: None,
    }))
}

impl ShapeOf {
    fn values(&self, shape: &[usize]) -> Vec<i64> {
        if self.size {
            return vec![shape.iter().product::<usize>() as i64];
        }
        let r = shape.len() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let (s, e) = (clamp(self.start), clamp(self.end.unwrap_or(r)));
        shape[s..e.max(s)].iter().map(|&d| d as i64).collect()
    }
}

impl Op for ShapeOf {
    fn name(&self) -> &'static str {
        if self.size {
            "Size"
        } else {
            "Shape"
        }
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let values = self.values(&ins[0].shape);
        let shape = if self.size {
            vec![]
        } else {
            vec![values.len()]
        };
        // Known from the input's shape alone: the planner folds it into a constant.
        Ok(vec![TensorMeta::constant(Tensor::i64(&shape, values))])
    }

    fn work(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> crate::Work {
        crate::Work {
            flops: 0,
            bytes_read: 0,
            bytes_written: outs[0].bytes(),
        }
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], _rows: Range<usize>) -> Result<()> {
        outs[0].data = Data::I64(self.values(&ins[0].shape));
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        _rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let words: Vec<u32> = self
            .values(&ins[0].shape)
            .iter()
            .map(|&v| v as i32 as u32)
            .collect();
        table_kernel(&words, self.name())
    }
}

/// ConstantOfShape: `value` attribute (one element; default f32 0) broadcast to input 0's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstantOfShape {
    value: Tensor,
}

pub fn constant_of_shape(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let value = attrs
        .tensor_opt("value")?
        .unwrap_or_else(|| Tensor::f32(&[1], vec![0.0]));
    if value.numel() != 1 {
        return Err(OpError::Invalid(format!(
            "ConstantOfShape: `value` must hold one element, got shape {:?}",
            value.shape
        )));
    }
    Ok(Box::new(ConstantOfShape { value }))
}

impl ConstantOfShape {
    fn out_shape(&self, ins: &[&TensorMeta]) -> Result<Vec<usize>> {
        let dims = plan_value("ConstantOfShape", "input", ins[0])?.to_i64_vec();
        if dims.iter().any(|&d| d < 0) {
            return Err(OpError::Invalid(format!(
                "ConstantOfShape: negative dim in {dims:?}"
            )));
        }
        Ok(dims.iter().map(|&d| d as usize).collect())
    }
}

/// Writes ins[0][0] to elements `start..end`.
struct Fill {
    start: usize,
    end: usize,
}

impl SameTypeKernel for Fill {
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
        let v = ins[0][0];
        for_each_chunk(&mut out[self.start..self.end], PIECE, |_, piece| {
            piece.fill(v)
        });
        Ok(())
    }
}

impl Op for ConstantOfShape {
    fn name(&self) -> &'static str {
        "ConstantOfShape"
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        Ok(vec![TensorMeta::new(
            self.value.dtype(),
            self.out_shape(ins)?,
        )])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        first_axis(&outs[0])
    }

    fn cpu(&self, _ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let (start, end) = row_elems(&outs[0].shape, first_axis(&outs[0].meta()), &rows);
        if start >= end {
            return Ok(());
        }
        with_same_type(
            "ConstantOfShape",
            &Fill { start, end },
            &[&self.value.data],
            &mut outs[0].data,
        )
    }

    fn gpu(
        &self,
        _ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        check_gpu_size("ConstantOfShape", &[&outs[0]])?;
        let (start, end) = row_elems(&outs[0].shape, first_axis(&outs[0]), &rows);
        if start >= end {
            return Ok(vec![]);
        }
        Ok(vec![fill_kernel(
            0,
            0,
            start,
            end - start,
            gpu_word(&self.value, 0),
        )])
    }
}

/// Range(start, limit, delta): `max(ceil((limit - start) / delta), 0)` elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RangeOp;

pub fn range(_attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(RangeOp))
}

impl RangeOp {
    /// (start, delta, count) from the three scalars.
    fn args(ins: &[&TensorMeta]) -> Result<(Tensor, Tensor, usize)> {
        if ins.len() != 3 {
            return Err(OpError::Invalid(
                "Range: expects start, limit, delta".into(),
            ));
        }
        let names = ["start", "limit", "delta"];
        let v: Vec<&Tensor> = (0..3)
            .map(|i| plan_value("Range", names[i], ins[i]))
            .collect::<Result<_>>()?;
        if v.iter()
            .any(|t| t.numel() != 1 || t.dtype() != v[0].dtype())
        {
            return Err(OpError::Invalid(
                "Range: start, limit, delta must be scalars of one type".into(),
            ));
        }
        let count = if v[0].dtype().is_float() {
            let (s, l, d) = (
                v[0].data.get_f64(0),
                v[1].data.get_f64(0),
                v[2].data.get_f64(0),
            );
            if d == 0.0 {
                return Err(OpError::Invalid("Range: delta must not be 0".into()));
            }
            ((l - s) / d).ceil().max(0.0) as usize
        } else {
            let (s, l, d) = (
                v[0].data.get_i64(0),
                v[1].data.get_i64(0),
                v[2].data.get_i64(0),
            );
            if d == 0 {
                return Err(OpError::Invalid("Range: delta must not be 0".into()));
            }
            let span = l - s;
            let c = span / d + i64::from(span % d != 0 && (span < 0) == (d < 0));
            c.max(0) as usize
        };
        Ok((v[0].clone(), v[2].clone(), count))
    }
}

impl Op for RangeOp {
    fn name(&self) -> &'static str {
        "Range"
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let (s, _, n) = Self::args(ins)?;
        Ok(vec![TensorMeta::new(s.dtype(), vec![n])])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        Some(0)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let metas: Vec<TensorMeta> = ins
            .iter()
            .map(|t| TensorMeta::constant((*t).clone()))
            .collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let (s, d, n) = Self::args(&refs)?;
        let rows = rows.start.min(n)..rows.end.min(n);
        let (sf, df) = (s.data.get_f64(0), d.data.get_f64(0));
        let (si, di) = (s.data.get_i64(0), d.data.get_i64(0));
        let out = &mut outs[0].data;
        // The per-dtype arms only convert; the arithmetic is f64 for floats, i64 for integers.
        match out {
            Data::F32(o) => rows.for_each(|i| o[i] = (sf + i as f64 * df) as f32),
            Data::F64(o) => rows.for_each(|i| o[i] = sf + i as f64 * df),
            Data::F16(o) => rows.for_each(|i| o[i] = half::f16::from_f64(sf + i as f64 * df)),
            Data::I64(o) => rows.for_each(|i| o[i] = si + i as i64 * di),
            Data::I32(o) => rows.for_each(|i| o[i] = (si + i as i64 * di) as i32),
            Data::I8(o) => rows.for_each(|i| o[i] = (si + i as i64 * di) as i8),
            Data::U8(o) => rows.for_each(|i| o[i] = (si + i as i64 * di) as u8),
            Data::Bool(_) => {
                return Err(OpError::Invalid("Range: bool is not a numeric type".into()))
            }
        }
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let (s, d, n) = Self::args(ins)?;
        let (start, end) = (rows.start.min(n), rows.end.min(n));
        if start >= end {
            return Ok(vec![]);
        }
        let float = s.dtype().is_float();
        let p = GenParams {
            op: if float { OP_RANGE_F32 } else { OP_RANGE_I32 },
            start: start as u32,
            count: (end - start) as u32,
            f_start: s.data.get_f64(0) as f32,
            f_delta: d.data.get_f64(0) as f32,
            i_start: s.data.get_i64(0) as i32,
            i_delta: d.data.get_i64(0) as i32,
            ..Default::default()
        };
        Ok(vec![gen_kernel(p, 0, None, 0)])
    }
}

/// Constant: the value attribute (`value`, `value_float(s)`, `value_int(s)`).
#[derive(Debug, Clone, PartialEq)]
pub struct Constant {
    value: Tensor,
}

pub fn constant(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let mut found = None;
    for (name, v) in &attrs.values {
        let t = match (name.as_str(), v) {
            ("value", AttrValue::Tensor(t)) => t.clone(),
            ("value_float", AttrValue::Float(f)) => Tensor::f32(&[], vec![*f]),
            ("value_floats", AttrValue::Floats(f)) => Tensor::f32(&[f.len()], f.clone()),
            ("value_int", AttrValue::Int(i)) => Tensor::i64(&[], vec![*i]),
            ("value_ints", AttrValue::Ints(i)) => Tensor::i64(&[i.len()], i.clone()),
            (n, _) if n.starts_with("value") || n == "sparse_value" => {
                return Err(OpError::Unsupported(format!("Constant: attribute `{n}`")))
            }
            _ => continue,
        };
        if found.replace(t).is_some() {
            return Err(OpError::Invalid(
                "Constant: more than one value attribute".into(),
            ));
        }
    }
    let value = found.ok_or_else(|| OpError::Invalid("Constant: no value attribute".into()))?;
    Ok(Box::new(Constant { value }))
}

impl Op for Constant {
    fn name(&self) -> &'static str {
        "Constant"
    }

    fn infer(&self, _ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        Ok(vec![self.value.meta()])
    }

    fn cpu(&self, _ins: &[&Tensor], outs: &mut [Tensor], _rows: Range<usize>) -> Result<()> {
        outs[0] = self.value.clone();
        Ok(())
    }

    fn gpu(
        &self,
        _ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        _rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        Err(OpError::Unsupported(
            "Constant on GPU: constants are folded and uploaded by the runtime".into(),
        ))
    }
}

/// Trilu (`upper`, optional k input) and EyeLike (`k`, `dtype` attributes).
#[derive(Debug, Clone, PartialEq)]
pub struct Triangle {
    eye: bool,
    upper: bool,
    k_attr: i64,
    dtype: Option<DType>,
}

pub fn trilu(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(Triangle {
        eye: false,
        upper: attrs.int("upper", 1)? != 0,
        k_attr: 0,
        dtype: None,
    }))
}

pub fn eye_like(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let dtype = match attrs.int_opt("dtype")? {
        None => None,
        Some(1) => Some(DType::F32),
        Some(2) => Some(DType::U8),
        Some(3) => Some(DType::I8),
        Some(6) => Some(DType::I32),
        Some(7) => Some(DType::I64),
        Some(9) => Some(DType::Bool),
        Some(10) => Some(DType::F16),
        Some(11) => Some(DType::F64),
        Some(t) => return Err(OpError::Unsupported(format!("EyeLike: dtype {t}"))),
    };
    Ok(Box::new(Triangle {
        eye: true,
        upper: false,
        k_attr: attrs.int("k", 0)?,
        dtype,
    }))
}

impl Triangle {
    fn op(&self) -> &'static str {
        if self.eye {
            "EyeLike"
        } else {
            "Trilu"
        }
    }

    fn k(&self, k_input: Option<&Tensor>) -> i64 {
        match k_input {
            Some(t) if !self.eye && t.numel() > 0 => t.data.get_i64(0),
            _ => self.k_attr,
        }
    }

    fn matrix(&self, shape: &[usize]) -> Result<(usize, usize)> {
        let r = shape.len();
        if r < 2 || (self.eye && r != 2) {
            return Err(OpError::Invalid(format!(
                "{}: input rank {r} is not supported",
                self.op()
            )));
        }
        Ok((shape[r - 2], shape[r - 1]))
    }
}

/// Trilu (ins: data) or EyeLike (ins: the one value) over elements `start..end`.
struct TriKernel {
    eye: bool,
    upper: bool,
    k: i64,
    rows: usize,
    cols: usize,
    start: usize,
    end: usize,
}

impl SameTypeKernel for TriKernel {
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
        for_each_chunk(&mut out[self.start..self.end], PIECE, |c, piece| {
            for (k, o) in piece.iter_mut().enumerate() {
                let v = self.start + c * PIECE + k;
                let diag = (v % self.cols) as i64 - ((v / self.cols) % self.rows) as i64;
                *o = if self.eye {
                    if diag == self.k {
                        ins[0][0]
                    } else {
                        T::default()
                    }
                } else {
                    let keep = if self.upper {
                        diag >= self.k
                    } else {
                        diag <= self.k
                    };
                    if keep {
                        ins[0][v]
                    } else {
                        T::default()
                    }
                };
            }
        });
        Ok(())
    }
}

impl Op for Triangle {
    fn name(&self) -> &'static str {
        self.op()
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        self.matrix(&ins[0].shape)?;
        Ok(vec![TensorMeta::new(
            self.dtype.unwrap_or(ins[0].dtype),
            ins[0].shape.clone(),
        )])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        first_axis(&outs[0])
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let (r, c) = self.matrix(&ins[0].shape)?;
        let (start, end) = row_elems(&outs[0].shape, first_axis(&outs[0].meta()), &rows);
        if start >= end {
            return Ok(());
        }
        let k = TriKernel {
            eye: self.eye,
            upper: self.upper,
            k: self.k(ins.get(1).copied()),
            rows: r,
            cols: c,
            start,
            end,
        };
        let one = Tensor::new(vec![1], scalar_of(outs[0].dtype(), 1.0));
        let src = if self.eye { &one.data } else { &ins[0].data };
        with_same_type(self.op(), &k, &[src], &mut outs[0].data)
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        check_gpu_size(self.op(), &[&outs[0]])?;
        let (r, c) = self.matrix(&ins[0].shape)?;
        let (start, end) = row_elems(&outs[0].shape, first_axis(&outs[0]), &rows);
        if start >= end {
            return Ok(vec![]);
        }
        // k: a plan-time constant goes into params; otherwise the shader reads the bound input.
        let k_meta = (!self.eye && !absent(ins, 1)).then(|| ins[1]);
        let k_const = k_meta.and_then(|m| m.value.as_deref());
        let k_runtime = k_meta.is_some() && k_const.is_none();
        let one = Tensor::new(vec![1], scalar_of(outs[0].dtype, 1.0));
        let p = GenParams {
            op: if self.eye { OP_EYE } else { OP_TRILU },
            start: start as u32,
            count: (end - start) as u32,
            value: gpu_word(&one, 0),
            rows: r as u32,
            cols: c as u32,
            k: self.k(k_const).clamp(i32::MIN as i64, i32::MAX as i64) as i32,
            upper: self.upper as u32,
            k_input: k_runtime as u32,
            ..Default::default()
        };
        Ok(vec![gen_kernel(p, 0, k_runtime.then_some(1), 0)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(op: &dyn Op, ins: &[Tensor]) -> Tensor {
        let metas: Vec<TensorMeta> = ins
            .iter()
            .map(|t| TensorMeta::constant(t.clone()))
            .collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let m = op.infer(&refs).unwrap();
        let mut out = vec![Tensor::zeros(m[0].dtype, &m[0].shape)];
        let rows = crate::shape::row_count(&m[0].shape, op.split_axis(&refs, &m));
        let t: Vec<&Tensor> = ins.iter().collect();
        op.cpu(&t, &mut out, 0..rows).unwrap();
        out.remove(0)
    }

    #[test]
    fn shape_size_and_constant_of_shape() {
        let x = Tensor::zeros(DType::F32, &[2, 3, 4]);
        let s = shape(&Attrs::new(15).with("start", AttrValue::Int(-2))).unwrap();
        assert_eq!(
            run(&*s, std::slice::from_ref(&x)).data,
            Data::I64(vec![3, 4])
        );
        assert_eq!(
            run(&*size(&Attrs::new(13)).unwrap(), &[x]).data,
            Data::I64(vec![24])
        );
        let c = constant_of_shape(
            &Attrs::new(9).with("value", AttrValue::Tensor(Tensor::i64(&[1], vec![7]))),
        )
        .unwrap();
        let y = run(&*c, &[Tensor::i64(&[2], vec![2, 2])]);
        assert_eq!(y.data, Data::I64(vec![7; 4]));
        let z = run(
            &*constant_of_shape(&Attrs::new(9)).unwrap(),
            &[Tensor::i64(&[0], vec![])],
        );
        assert_eq!((z.shape.clone(), z.data), (vec![], Data::F32(vec![0.0])));
    }

    #[test]
    fn range_counts_like_the_spec() {
        let r = range(&Attrs::new(11)).unwrap();
        let y = run(
            &*r,
            &[
                Tensor::i64(&[], vec![10]),
                Tensor::i64(&[], vec![4]),
                Tensor::i64(&[], vec![-3]),
            ],
        );
        assert_eq!(y.data, Data::I64(vec![10, 7]));
        let f = |v: f32| Tensor::f32(&[], vec![v]);
        let y = run(&*r, &[f(1.0), f(2.0), f(0.25)]);
        assert_eq!(y.data, Data::F32(vec![1.0, 1.25, 1.5, 1.75]));
        let y = run(&*r, &[f(3.0), f(1.0), f(1.0)]);
        assert_eq!(y.shape, vec![0]);
    }

    #[test]
    fn trilu_and_eye_like() {
        let x = Tensor::i64(&[3, 3], (1..=9).collect());
        let up = trilu(&Attrs::new(14)).unwrap();
        assert_eq!(
            run(&*up, &[x.clone(), Tensor::i64(&[], vec![1])]).data,
            Data::I64(vec![0, 2, 3, 0, 0, 6, 0, 0, 0])
        );
        let lo = trilu(&Attrs::new(14).with("upper", AttrValue::Int(0))).unwrap();
        assert_eq!(
            run(&*lo, std::slice::from_ref(&x)).data,
            Data::I64(vec![1, 0, 0, 4, 5, 0, 7, 8, 9])
        );
        let eye = eye_like(
            &Attrs::new(9)
                .with("k", AttrValue::Int(-1))
                .with("dtype", AttrValue::Int(1)),
        )
        .unwrap();
        assert_eq!(
            run(&*eye, &[x]).data,
            Data::F32(vec![0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
        );
    }

    #[test]
    fn constant_attributes() {
        let c = constant(&Attrs::new(13).with("value_ints", AttrValue::Ints(vec![1, 2]))).unwrap();
        assert_eq!(run(&*c, &[]).data, Data::I64(vec![1, 2]));
        assert!(constant(&Attrs::new(13)).is_err());
    }
}
