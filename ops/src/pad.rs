//! Pad: grow (or, with negative pads, crop) each axis, filling with a constant or by reflect,
//! edge or wrap addressing.
//!
//! Sits between the operator contract (`op.rs`) and its kernels: a generic CPU kernel over any
//! element type (`movement::with_same_type`) and `pad.wgsl`. Pads come from the attribute
//! (opset < 11) or input 1 (with optional constant_value input 2 and axes input 3, opset 18),
//! known at plan time.

use crate::movement::{
    absent, check_gpu_size, cpu_metas, first_axis, gpu_word, pack8, plan_value, row_elems,
    with_same_type, Elem, SameTypeKernel,
};
use crate::shape::{grid_1d, normalize_axis, strides};
use crate::{Attrs, DType, Data, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Pad {
    mode: Mode,
    /// `pads` and `value` attributes of opset < 11.
    attr_pads: Option<Vec<i64>>,
    attr_value: f32,
}

pub fn pad(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let mode = match attrs.string("mode", "constant")?.as_str() {
        "constant" => Mode::Constant,
        "reflect" => Mode::Reflect,
        "edge" => Mode::Edge,
        "wrap" => Mode::Wrap,
        m => return Err(OpError::Invalid(format!("Pad: unknown mode `{m}`"))),
    };
    let attr_pads = if attrs.opset < 11 {
        let p = match attrs.ints_opt("pads")? {
            Some(p) => p,
            None => attrs.ints_opt("paddings")?.ok_or_else(|| {
                OpError::Invalid("Pad (opset < 11): attribute `pads` is required".into())
            })?,
        };
        Some(p)
    } else {
        None
    };
    Ok(Box::new(Pad {
        mode,
        attr_pads,
        attr_value: attrs.float("value", 0.0)?,
    }))
}

/// Per-axis (begin, end) pads and the output shape.
struct Layout {
    begin: Vec<i64>,
    out: Vec<usize>,
}

impl Pad {
    fn layout(&self, ins: &[&TensorMeta]) -> Result<Layout> {
        let shape = &ins[0].shape;
        let r = shape.len();
        let pads = match &self.attr_pads {
            Some(p) => p.clone(),
            None => plan_value(
                "Pad",
                "pads",
                ins.get(1)
                    .ok_or_else(|| OpError::Invalid("Pad: input `pads` is missing".into()))?,
            )?
            .to_i64_vec(),
        };
        let axes: Vec<usize> = if self.attr_pads.is_none() && !absent(ins, 3) {
            plan_value("Pad", "axes", ins[3])?
                .to_i64_vec()
                .iter()
                .map(|&a| normalize_axis(a, r))
                .collect::<Result<_>>()?
        } else {
            (0..r).collect()
        };
        let n = axes.len();
        if pads.len() != 2 * n {
            return Err(OpError::Invalid(format!(
                "Pad: {} pads for {n} axes (want 2 per axis)",
                pads.len()
            )));
        }
        let mut begin = vec![0i64; r];
        let mut end = vec![0i64; r];
        for (i, &a) in axes.iter().enumerate() {
            begin[a] = pads[i];
            end[a] = pads[n + i];
        }
        let mut out = Vec::with_capacity(r);
        for d in 0..r {
            let o = shape[d] as i64 + begin[d] + end[d];
            if o < 0 {
                return Err(OpError::Invalid(format!(
                    "Pad: pads ({}, {}) crop axis {d} of size {} below zero",
                    begin[d], end[d], shape[d]
                )));
            }
            if shape[d] == 0 && o > 0 && self.mode != Mode::Constant {
                return Err(OpError::Invalid(format!(
                    "Pad: mode {:?} cannot pad the empty axis {d}",
                    self.mode
                )));
            }
            out.push(o as usize);
        }
        Ok(Layout { begin, out })
    }

    /// The fill value as a one-element tensor of `dtype`.
    fn fill(
        &self,
        ins: &[&TensorMeta],
        value_input: Option<&Tensor>,
        dtype: DType,
    ) -> Result<Tensor> {
        if let Some(t) = value_input.filter(|t| t.numel() > 0 && self.attr_pads.is_none()) {
            if t.dtype() != dtype {
                return Err(OpError::Invalid(format!(
                    "Pad: constant_value is {} but data is {dtype}",
                    t.dtype()
                )));
            }
            return Ok(Tensor::new(vec![1], slice1(&t.data)));
        }
        let _ = ins;
        Ok(Tensor::new(
            vec![1],
            scalar_of(dtype, self.attr_value as f64),
        ))
    }
}

/// The first element of `d` as its own `Data`.
fn slice1(d: &Data) -> Data {
    match d {
        Data::F32(v) => Data::F32(vec![v[0]]),
        Data::F16(v) => Data::F16(vec![v[0]]),
        Data::F64(v) => Data::F64(vec![v[0]]),
        Data::I64(v) => Data::I64(vec![v[0]]),
        Data::I32(v) => Data::I32(vec![v[0]]),
        Data::I8(v) => Data::I8(vec![v[0]]),
        Data::U8(v) => Data::U8(vec![v[0]]),
        Data::Bool(v) => Data::Bool(vec![v[0]]),
    }
}

/// `v` as a one-element `Data` of `dtype`.
pub(crate) fn scalar_of(dtype: DType, v: f64) -> Data {
    match dtype {
        DType::F32 => Data::F32(vec![v as f32]),
        DType::F16 => Data::F16(vec![half::f16::from_f64(v)]),
        DType::F64 => Data::F64(vec![v]),
        DType::I64 => Data::I64(vec![v as i64]),
        DType::I32 => Data::I32(vec![v as i32]),
        DType::I8 => Data::I8(vec![v as i8]),
        DType::U8 => Data::U8(vec![v as u8]),
        DType::Bool => Data::Bool(vec![v != 0.0]),
    }
}

/// Input coordinate for padded coordinate `x` of an axis of `len`, or None for "constant".
#[inline]
fn source(mode: Mode, x: i64, len: i64) -> Option<usize> {
    if (0..len).contains(&x) {
        return Some(x as usize);
    }
    match mode {
        Mode::Constant => None,
        Mode::Edge => Some(x.clamp(0, len - 1) as usize),
        Mode::Wrap => Some(x.rem_euclid(len) as usize),
        Mode::Reflect if len == 1 => Some(0),
        Mode::Reflect => {
            let period = 2 * (len - 1);
            let m = x.rem_euclid(period);
            Some(if m >= len { period - m } else { m } as usize)
        }
    }
}

struct PadKernel<'a> {
    mode: Mode,
    in_dims: &'a [usize],
    out_dims: &'a [usize],
    begin: &'a [i64],
    start: usize,
    end: usize,
}

impl SameTypeKernel for PadKernel<'_> {
    /// ins: data, fill value (one element).
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
        let (src, value) = (ins[0], ins[1][0]);
        let r = self.out_dims.len();
        let in_st = strides(self.in_dims);
        if r == 0 {
            out[0] = src[0];
            return Ok(());
        }
        let n = self.out_dims[r - 1];
        let chunk = n * (4096 / n.max(1)).max(1);
        crate::parallel::for_each_chunk_mut(&mut out[self.start..self.end], chunk, |c, block| {
            let mut j = self.start + c * chunk;
            let mut k = 0;
            while k < block.len() {
                let ci = j % n;
                let mut rem = j / n;
                let mut base = Some(0usize);
                for d in (0..r - 1).rev() {
                    let cd = rem % self.out_dims[d];
                    rem /= self.out_dims[d];
                    let x = source(self.mode, cd as i64 - self.begin[d], self.in_dims[d] as i64);
                    base = base.zip(x).map(|(b, x)| b + x * in_st[d]);
                }
                let len = (n - ci).min(block.len() - k);
                let seg = &mut block[k..k + len];
                match base {
                    None => seg.iter_mut().for_each(|o| *o = value),
                    Some(b) => {
                        let in_n = self.in_dims[r - 1] as i64;
                        for (t, o) in seg.iter_mut().enumerate() {
                            let x = (ci + t) as i64 - self.begin[r - 1];
                            *o = match source(self.mode, x, in_n) {
                                Some(x) => src[b + x],
                                None => value,
                            };
                        }
                    }
                }
                k += len;
                j += len;
            }
        });
        Ok(())
    }
}

/// Parameters of `pad.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct PadParams {
    out_dims: [u32; 8],
    in_dims: [u32; 8],
    in_stride: [u32; 8],
    pad_begin: [i32; 8],
    value: u32,
    start: u32,
    count: u32,
    _pad: u32,
}

impl Op for Pad {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "Pad"
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        Ok(vec![TensorMeta::new(ins[0].dtype, self.layout(ins)?.out)])
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        first_axis(&outs[0])
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let metas = cpu_metas(ins);
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let l = self.layout(&refs)?;
        let (start, end) = row_elems(&l.out, first_axis(&outs[0].meta()), &rows);
        if start >= end {
            return Ok(());
        }
        let fill = self.fill(&refs, ins.get(2).copied(), ins[0].dtype())?;
        let k = PadKernel {
            mode: self.mode,
            in_dims: &ins[0].shape,
            out_dims: &l.out,
            begin: &l.begin,
            start,
            end,
        };
        with_same_type("Pad", &k, &[&ins[0].data, &fill.data], &mut outs[0].data)
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        check_gpu_size("Pad", &[ins[0], &outs[0]])?;
        let l = self.layout(ins)?;
        let (start, end) = row_elems(&l.out, first_axis(&outs[0]), &rows);
        if start >= end {
            return Ok(vec![]);
        }
        if ins[0].numel() == 0 && self.mode != Mode::Constant {
            return Err(OpError::Unsupported("Pad on GPU: empty input".into()));
        }
        let value_input = match ins.get(2) {
            Some(m) if m.numel() > 0 => Some(plan_value("Pad", "constant_value", m)?),
            _ => None,
        };
        let fill = self.fill(ins, value_input, ins[0].dtype)?;
        let u = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<_>>();
        let p = PadParams {
            out_dims: pack8("Pad", &u(&l.out))?,
            in_dims: pack8("Pad", &u(&ins[0].shape))?,
            in_stride: pack8("Pad", &u(&strides(&ins[0].shape)))?,
            pad_begin: pack8(
                "Pad",
                &l.begin.iter().map(|&b| b as i32).collect::<Vec<_>>(),
            )?,
            value: gpu_word(&fill, 0),
            start: start as u32,
            count: (end - start) as u32,
            _pad: 0,
        };
        Ok(vec![GpuKernel::new(
            tandem_shaders::PAD,
            vec![0],
            vec![0],
            &p,
            grid_1d((end - start) as u64, 64),
        )
        .with_override("WG", 64.0)
        .with_override("RANK", l.out.len() as f64)
        // 0 constant, 1 reflect, 2 edge, 3 wrap.
        .with_override("MODE", self.mode as u32 as f64)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AttrValue;

    /// Naive numpy-style reference for one 1-D axis.
    fn naive_1d(x: &[f32], b: i64, e: i64, mode: &str, v: f32) -> Vec<f32> {
        let n = x.len() as i64;
        (-b..n + e)
            .map(|i| {
                if (0..n).contains(&i) {
                    return x[i as usize];
                }
                match mode {
                    "constant" => v,
                    "edge" => x[i.clamp(0, n - 1) as usize],
                    "wrap" => x[i.rem_euclid(n) as usize],
                    _ => {
                        // reflect by walking back and forth
                        let mut p = 0i64;
                        let mut dir = 1i64;
                        let steps = if i < 0 { -i } else { i };
                        let sgn = if i < 0 { -1 } else { 1 };
                        for _ in 0..steps {
                            if p + dir * sgn < 0 || p + dir * sgn >= n {
                                dir = -dir;
                            }
                            p += dir * sgn;
                        }
                        x[p as usize]
                    }
                }
            })
            .collect()
    }

    fn run(op: &dyn Op, ins: &[Tensor], rows: Range<usize>) -> Tensor {
        let metas: Vec<TensorMeta> = ins
            .iter()
            .map(|t| TensorMeta::constant(t.clone()))
            .collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let m = op.infer(&refs).unwrap();
        let mut out = vec![Tensor::zeros(m[0].dtype, &m[0].shape)];
        let t: Vec<&Tensor> = ins.iter().collect();
        op.cpu(&t, &mut out, rows).unwrap();
        out.remove(0)
    }

    #[test]
    fn each_mode_matches_naive_on_last_axis() {
        let x: Vec<f32> = vec![1.0, 2.0, 3.0];
        for mode in ["constant", "reflect", "edge", "wrap"] {
            let op = pad(&Attrs::new(19).with("mode", AttrValue::String(mode.into()))).unwrap();
            let t = Tensor::f32(&[2, 3], [x.clone(), x.clone()].concat());
            let pads = Tensor::i64(&[4], vec![0, 5, 0, -1]);
            let y = run(&*op, &[t, pads, Tensor::f32(&[], vec![9.0])], 0..2);
            let row = naive_1d(&x, 5, -1, mode, 9.0);
            assert_eq!(
                y.as_f32().unwrap(),
                &[row.clone(), row].concat()[..],
                "{mode}"
            );
        }
    }

    #[test]
    fn outer_axis_padding_with_axes_input_and_opset2_attribute() {
        let op = pad(&Attrs::new(18)).unwrap();
        let t = Tensor::i64(&[2, 2], vec![1, 2, 3, 4]);
        let y = run(
            &*op,
            &[
                t.clone(),
                Tensor::i64(&[2], vec![1, 0]),
                Tensor::i64(&[], vec![7]),
                Tensor::i64(&[1], vec![0]),
            ],
            0..3,
        );
        assert_eq!(y.shape, vec![3, 2]);
        assert_eq!(y.data, Data::I64(vec![7, 7, 1, 2, 3, 4]));
        let op2 = pad(&Attrs::new(2)
            .with("pads", AttrValue::Ints(vec![0, 1, 0, 0]))
            .with("mode", AttrValue::String("edge".into())))
        .unwrap();
        let y = run(&*op2, &[Tensor::f32(&[1, 2], vec![5.0, 6.0])], 0..1);
        assert_eq!(y.data, Data::F32(vec![5.0, 5.0, 6.0]));
    }
}
