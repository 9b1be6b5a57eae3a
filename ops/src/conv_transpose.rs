//! ConvTranspose (1-D and 2-D): groups, strides, dilations, pads, output_padding,
//! output_shape, auto_pad, bias.
//!
//! Sits between the operator contract ([`crate::Op`]) and the shared CPU GEMM
//! ([`crate::cpu_gemm`]) / the `conv_transpose` shader. 1-D runs as 2-D with H = L, W = 1.
//!
//! Rows: output axis 1, one row is one output plane `(n, oc)`: a plane receives scattered
//! contributions from every input line, so cutting inside a plane would repeat the GEMM.
//! CPU: per (image, group, chunk of output channels) one GEMM
//! `col[(oc, kh, kw), p] = W[c, (oc, kh, kw)]^T x X[c, p]`, then col2im adds `col` into the
//! output planes (tasks own disjoint planes). GPU: a gather per output element; on adapters
//! that run shaders on the CPU, 2x2 up-convs of stride 2 as a GEMM over channels
//! (`conv_transpose_2x2.wgsl`).

use crate::conv::{valid_range, AutoPad, ConvAttrs, Geom2};
use crate::cpu_gemm::{sgemm, MatMut, MatRef, Threads};
use crate::matmul::{f32_in, f32_out};
use crate::shape::grid_1d;
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use std::ops::Range;

/// ConvTranspose with its attributes.
#[derive(Debug, Clone)]
pub struct ConvTranspose {
    pub attrs: ConvAttrs,
    pub output_padding: Option<Vec<i64>>,
    pub output_shape: Option<Vec<i64>>,
    /// Op types of the per-channel affine nodes after it that the runtime's fusion pass folded
    /// into W and B (for reports; the computation is that of a plain ConvTranspose).
    pub absorbed: Vec<String>,
}

/// Registry constructor.
pub fn conv_transpose(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(ConvTranspose {
        attrs: ConvAttrs::parse("ConvTranspose", attrs)?,
        output_padding: attrs.ints_opt("output_padding")?,
        output_shape: attrs.ints_opt("output_shape")?,
        absorbed: Vec::new(),
    }))
}

/// Floor division (Python's `//`), for the spec's pad formulas with negative totals.
fn floor_half(v: i64) -> i64 {
    v.div_euclid(2)
}

impl ConvTranspose {
    /// Geometry (in/out swapped relative to Conv: `h, w` input, `oh, ow` output, `cg` input
    /// channels per group, `mg` output channels per group) and the output shape.
    pub fn geom(&self, ins: &[&[usize]]) -> Result<(Geom2, Vec<usize>)> {
        let op = "ConvTranspose";
        if ins.len() < 2 || ins.len() > 3 {
            return Err(OpError::Invalid(format!(
                "{op} takes 2 or 3 inputs, got {}",
                ins.len()
            )));
        }
        let (x, w) = (ins[0], ins[1]);
        if x.len() != w.len() || x.len() < 3 {
            return Err(OpError::Invalid(format!(
                "{op}: X {x:?} and W {w:?} ranks differ or < 3"
            )));
        }
        let r = x.len() - 2;
        if r > 2 {
            return Err(OpError::Unsupported(format!(
                "{op} with {r} spatial dims (1-D, 2-D only)"
            )));
        }
        let group = self.attrs.group;
        let (n, c) = (x[0], x[1]);
        if w[0] != c || c % group != 0 {
            return Err(OpError::Invalid(format!(
                "{op}: X {x:?}, W {w:?} and group {group} disagree (need W[0] = C, C % group = 0)"
            )));
        }
        let m = w[1] * group;
        if let Some(b) = ins.get(2) {
            if *b != [m] {
                return Err(OpError::Invalid(format!(
                    "{op}: bias shape {b:?}, expected [{m}]"
                )));
            }
        }
        if w[2..].contains(&0) {
            return Err(OpError::Invalid(format!("{op}: empty kernel {w:?}")));
        }
        let axes = self.attrs.per_axis(op, &w[2..])?;
        let out_pad = self.output_padding.clone().unwrap_or_else(|| vec![0; r]);
        if out_pad.len() != r || out_pad.iter().any(|&v| v < 0) {
            return Err(OpError::Invalid(format!(
                "{op}: output_padding {out_pad:?}"
            )));
        }
        let given = match &self.output_shape {
            None => None,
            Some(s) if s.len() == r => Some(s.clone()),
            Some(s) if s.len() == r + 2 => Some(s[2..].to_vec()),
            Some(s) => return Err(OpError::Invalid(format!("{op}: output_shape {s:?}"))),
        };
        let mut outs = Vec::new();
        for i in 0..r {
            let (k, s, d, pb, pe) = axes[i];
            let full = s as i64 * (x[2 + i] as i64 - 1) + out_pad[i] + ((k - 1) * d + 1) as i64;
            let auto = self.attrs.auto_pad;
            let (out, begin) = if let Some(g) = &given {
                let total = full - g[i];
                let b = if auto == AutoPad::SameUpper {
                    floor_half(total)
                } else {
                    total - floor_half(total)
                };
                (g[i], b)
            } else {
                match auto {
                    AutoPad::NotSet => (full - pb - pe, pb),
                    AutoPad::Valid => (full, 0),
                    AutoPad::SameUpper | AutoPad::SameLower => {
                        let out = (x[2 + i] * s) as i64;
                        let total = full - out;
                        let b = if auto == AutoPad::SameUpper {
                            floor_half(total)
                        } else {
                            total - floor_half(total)
                        };
                        (out, b)
                    }
                }
            };
            if out < 0 {
                return Err(OpError::Invalid(format!(
                    "{op}: negative output size on axis {i}"
                )));
            }
            outs.push((out as usize, begin));
        }
        let mut shape = vec![n, m];
        shape.extend(outs.iter().map(|o| o.0));
        let g = Geom2::of_axes(x, m, (&axes, &outs), (group, c / group, w[1]));
        Ok((g, shape))
    }
}

fn shapes<'a>(ins: &[&'a TensorMeta]) -> Vec<&'a [usize]> {
    ins.iter().map(|t| t.shape.as_slice()).collect()
}

/// Add `col` (rows `(ocl, kh, kw)` of `h * w` input pixels) into output `planes` (one per
/// channel of the chunk, already holding the bias).
fn col2im(g: &Geom2, col: &[f32], planes: &mut [f32]) {
    let (kk, hw, opl) = (g.kh * g.kw, g.h * g.w, g.oh * g.ow);
    crate::parallel::for_each_chunk_mut(planes, opl, |ci, plane| {
        // Kernel as wide as the stride, no column padding or dilation, every input column
        // landing inside (the 2x2/2 upsampling of FPN and U-Net decoders): an output row
        // takes its kernel row's kw columns interleaved, all in one sequential pass.
        let tiled = g.kw == 2 && g.sw == 2 && g.dw == 1 && g.pl == 0 && g.ow >= g.w * 2;
        for ki in 0..g.kh {
            let hr = valid_range(g.h, g.sh, (ki * g.dh) as i64 - g.pt, g.oh);
            if tiled {
                let row = |kj: usize| &col[(ci * kk + ki * g.kw + kj) * hw..][..hw];
                let (s0, s1) = (row(0), row(1));
                for ih in hr.clone() {
                    let oh = ((ih * g.sh + ki * g.dh) as i64 - g.pt) as usize;
                    let orow = &mut plane[oh * g.ow..][..2 * g.w];
                    let (a, b) = (&s0[ih * g.w..][..g.w], &s1[ih * g.w..][..g.w]);
                    for ((o, a), b) in orow.chunks_exact_mut(2).zip(a).zip(b) {
                        o[0] += a;
                        o[1] += b;
                    }
                }
                continue;
            }
            for kj in 0..g.kw {
                let wr = valid_range(g.w, g.sw, (kj * g.dw) as i64 - g.pl, g.ow);
                if wr.is_empty() {
                    continue;
                }
                let src = &col[(ci * kk + ki * g.kw + kj) * hw..][..hw];
                for ih in hr.clone() {
                    let oh = ((ih * g.sh + ki * g.dh) as i64 - g.pt) as usize;
                    let orow = &mut plane[oh * g.ow..][..g.ow];
                    let ow0 = ((wr.start * g.sw + kj * g.dw) as i64 - g.pl) as usize;
                    let srow = &src[ih * g.w..][..g.w];
                    for (t, iw) in wr.clone().enumerate() {
                        orow[ow0 + t * g.sw] += srow[iw];
                    }
                }
            }
        }
    });
}

/// Output planes `rows` (`n * M + oc`) of a transposed convolution on the CPU (f32).
pub fn conv_transpose_cpu(
    g: &Geom2,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let rows = rows.start.min(g.n * g.m)..rows.end.min(g.n * g.m);
    let opl = g.oh * g.ow;
    if rows.is_empty() || opl == 0 {
        return;
    }
    let (kk, hw) = (g.kh * g.kw, g.h * g.w);
    let dst = &mut out[rows.start * opl..rows.end * opl];
    for (i, plane) in dst.chunks_mut(opl).enumerate() {
        plane.fill(b.map_or(0.0, |b| b[(rows.start + i) % g.m]));
    }
    if hw == 0 {
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    // Tasks: (first plane, plane count) never crossing a group or image boundary.
    let per = ((1usize << 22) / (kk * hw).max(1))
        .max(1)
        .min(rows.len().div_ceil(threads));
    let mut tasks: Vec<(usize, &mut [f32])> = Vec::new();
    let mut rest = dst;
    let mut r = rows.start;
    while r < rows.end {
        let group_end = (r / g.mg + 1) * g.mg;
        let e = (r + per).min(group_end).min(rows.end);
        let (head, tail) = rest.split_at_mut((e - r) * opl);
        tasks.push((r, head));
        rest = tail;
        r = e;
    }
    let run = |(r, planes): (usize, &mut [f32]), th: Threads| {
        let (n, oc) = (r / g.m, r % g.m);
        let (grp, ocl) = (oc / g.mg, oc % g.mg);
        let cnt = planes.len() / opl;
        let mut col = vec![0.0f32; cnt * kk * hw];
        // A[(ocl, kh, kw), c] = W[grp * cg + c, ocl, kh, kw]
        let a = MatRef {
            data: w,
            offset: grp * g.cg * g.mg * kk + ocl * kk,
            rs: 1,
            cs: g.mg * kk,
        };
        let bm = MatRef::row_major(x, (n * g.c + grp * g.cg) * hw, hw);
        sgemm(
            cnt * kk,
            hw,
            g.cg,
            1.0,
            a,
            bm,
            0.0,
            MatMut::row_major(&mut col, 0, hw),
            th,
        );
        col2im(g, &col, planes);
    };
    if tasks.len() >= threads && threads > 1 {
        crate::parallel::for_each_item(tasks, |t| run(t, Threads::Single));
    } else {
        tasks.into_iter().for_each(|t| run(t, Threads::Pool));
    }
}

/// Params of `conv_transpose.wgsl` and `conv_transpose_2x2.wgsl` (layout mirrored in
/// `conv_transpose_common.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ConvTransposeParams {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    m: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: i32,
    pl: i32,
    cg: u32,
    mg: u32,
    has_bias: u32,
    e_start: u32,
    count: u32,
    /// `conv_transpose_2x2.wgsl`'s first channel block and invocations (0 for the other).
    blk0: u32,
    threads: u32,
    _pad: [u32; 2],
}

/// Whether `conv_transpose_2x2.wgsl` computes `g` on an adapter that runs shaders on the CPU: a
/// 2x2 kernel of stride 2 without pads or dilation whose output is twice X's size (each input
/// pixel feeds its own 2 x 2 output pixels), X's rows whole vec4s. ppocr_det's up-conv (24 -> 24
/// channels, 160 x 160 -> 320 x 320) took 289 ms on lavapipe through `conv_transpose.wgsl`.
fn upsample_2x2_fits(g: &Geom2) -> bool {
    let taps = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.dh == 1 && g.dw == 1;
    let exact = g.pt == 0 && g.pl == 0 && g.oh == 2 * g.h && g.ow == 2 * g.w;
    taps && exact && g.w.is_multiple_of(4)
}

fn u32_of(v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| OpError::Unsupported(format!("ConvTranspose on GPU: size {v} exceeds u32")))
}

impl Op for ConvTranspose {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "ConvTranspose"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let (_, shape) = self.geom(&shapes(ins))?;
        for (i, t) in ins.iter().enumerate() {
            if t.dtype != DType::F32 {
                return Err(OpError::Unsupported(format!(
                    "ConvTranspose: input {i} has dtype {}, only f32 is implemented",
                    t.dtype
                )));
            }
        }
        Ok(vec![TensorMeta::new(DType::F32, shape)])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        let flops = self
            .geom(&shapes(ins))
            .map(|(g, _)| {
                2 * (g.n * g.c * g.h * g.w * g.mg * g.kh * g.kw) as u64
                    + if ins.len() > 2 {
                        (g.n * g.m * g.oh * g.ow) as u64
                    } else {
                        0
                    }
            })
            .unwrap_or(0);
        Work {
            flops,
            bytes_read: ins.iter().map(|i| i.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        Some(1)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let sh: Vec<&[usize]> = ins.iter().map(|t| t.shape.as_slice()).collect();
        let (g, _) = self.geom(&sh)?;
        let x = f32_in("ConvTranspose", ins[0])?;
        let w = f32_in("ConvTranspose", ins[1])?;
        let b = ins.get(2).map(|t| f32_in("ConvTranspose", t)).transpose()?;
        let out = f32_out("ConvTranspose", &mut outs[0])?;
        conv_transpose_cpu(&g, x, w, b, out, rows);
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let (g, _) = self.geom(&shapes(ins))?;
        let total = g.n * g.m;
        let rows = rows.start.min(total)..rows.end.min(total);
        let opl = g.oh * g.ow;
        if rows.is_empty() || opl == 0 {
            return Ok(Vec::new());
        }
        u32_of(total * opl)?;
        let count = rows.len() * opl;
        let p = ConvTransposeParams {
            n: u32_of(g.n)?,
            c: u32_of(g.c)?,
            h: u32_of(g.h)?,
            w: u32_of(g.w)?,
            m: u32_of(g.m)?,
            oh: u32_of(g.oh)?,
            ow: u32_of(g.ow)?,
            kh: u32_of(g.kh)?,
            kw: u32_of(g.kw)?,
            sh: u32_of(g.sh)?,
            sw: u32_of(g.sw)?,
            dh: u32_of(g.dh)?,
            dw: u32_of(g.dw)?,
            pt: i32::try_from(g.pt).map_err(|_| OpError::Unsupported("pads exceed i32".into()))?,
            pl: i32::try_from(g.pl).map_err(|_| OpError::Unsupported("pads exceed i32".into()))?,
            cg: u32_of(g.cg)?,
            mg: u32_of(g.mg)?,
            has_bias: (ins.len() > 2) as u32,
            e_start: u32_of(rows.start * opl)?,
            count: u32_of(count)?,
            blk0: 0,
            threads: 0,
            _pad: [0; 2],
        };
        let inputs = if ins.len() > 2 {
            vec![0, 1, 2]
        } else {
            vec![0, 1, 1]
        };
        let gather = GpuKernel::new(
            tandem_shaders::CONV_TRANSPOSE,
            inputs.clone(),
            vec![0],
            &p,
            grid_1d(count as u64, 64),
        )
        .with_override("WG", 64.0);
        if !upsample_2x2_fits(&g) {
            return Ok(vec![gather]);
        }
        // blocks of `ocb` output channels of a group, numbered over (n, group, block)
        let ocb = if g.mg >= 4 { 4 } else { 1 };
        let mgb = g.mg.div_ceil(ocb);
        let block = |plane: usize| {
            let (n, oc) = (plane / g.m, plane % g.m);
            (n * g.group + oc / g.mg) * mgb + (oc % g.mg) / ocb
        };
        let (b0, b1) = (block(rows.start), block(rows.end - 1));
        let threads = (b1 + 1 - b0) * (g.h * g.w / 4);
        let p = ConvTransposeParams {
            blk0: u32_of(b0)?,
            threads: u32_of(threads)?,
            ..p
        };
        let upsample = GpuKernel::new(
            tandem_shaders::CONV_TRANSPOSE_2X2,
            inputs,
            vec![0],
            &p,
            grid_1d(threads as u64, 64),
        )
        .with_override("WG", 64.0)
        .with_override("OCB", ocb as f64);
        Ok(vec![gather.with_cpu_adapter_variant(upsample)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AttrValue;

    fn fill(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as u32 * 7 + seed * 13) % 23) as f32 / 11.0 - 1.0)
            .collect()
    }

    /// ConvTranspose by scattering every input element (2-D), begin pads `p`, output `o`.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        x: &[f32],
        xs: [usize; 4],
        w: &[f32],
        ws: [usize; 4],
        group: usize,
        s: [usize; 2],
        d: [usize; 2],
        p: [i64; 2],
        o: [usize; 2],
    ) -> Vec<f32> {
        let [n, c, h, wd] = xs;
        let [_, mg, kh, kw] = ws;
        let cg = c / group;
        let m = mg * group;
        let mut out = vec![0.0; n * m * o[0] * o[1]];
        for ni in 0..n {
            for ci in 0..c {
                let g = ci / cg;
                for ih in 0..h {
                    for iw in 0..wd {
                        for ocl in 0..mg {
                            for i in 0..kh {
                                for j in 0..kw {
                                    let oh = (ih * s[0] + i * d[0]) as i64 - p[0];
                                    let ow = (iw * s[1] + j * d[1]) as i64 - p[1];
                                    if oh < 0 || ow < 0 || oh >= o[0] as i64 || ow >= o[1] as i64 {
                                        continue;
                                    }
                                    let oc = g * mg + ocl;
                                    out[((ni * m + oc) * o[0] + oh as usize) * o[1]
                                        + ow as usize] += x[((ni * c + ci) * h + ih) * wd + iw]
                                        * w[((ci * mg + ocl) * kh + i) * kw + j];
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_scatter_definition_and_onnx_example() {
        // ONNX test_convtranspose_pads: X 0..9 (3x3), W ones [1, 2, 3, 3], strides [3, 2],
        // pads [1, 2, 1, 2] -> [1, 2, 7, 3]; first output row is [1, 1, 3] for both channels.
        let op = conv_transpose(
            &Attrs::new(11)
                .with("strides", AttrValue::Ints(vec![3, 2]))
                .with("pads", AttrValue::Ints(vec![1, 2, 1, 2])),
        )
        .unwrap();
        let x = Tensor::f32(&[1, 1, 3, 3], (0..9).map(|v| v as f32).collect());
        let w = Tensor::f32(&[1, 2, 3, 3], vec![1.0; 18]);
        let metas = [&x.meta(), &w.meta()];
        let oshape = op.infer(&metas).unwrap()[0].shape.clone();
        assert_eq!(oshape, vec![1, 2, 7, 3]);
        let mut out = vec![Tensor::zeros(DType::F32, &oshape)];
        op.cpu(&[&x, &w], &mut out, 0..2).unwrap();
        let o = out[0].as_f32().unwrap();
        assert_eq!(&o[0..9], &[1.0, 1.0, 3.0, 1.0, 1.0, 3.0, 7.0, 4.0, 9.0]);
        assert_eq!(&o[18..21], &[13.0, 7.0, 15.0]);

        for (xs, mg, k, group, s, d, pads) in [
            ([1, 4, 5, 6], 3, [3, 3], 2, [2, 2], [1, 1], [1, 1, 0, 1]),
            ([2, 3, 4, 4], 2, [2, 2], 1, [2, 2], [1, 1], [0, 0, 0, 0]),
            ([1, 2, 3, 5], 3, [3, 2], 1, [2, 2], [1, 1], [1, 0, 0, 0]),
            ([1, 2, 3, 5], 4, [3, 2], 1, [1, 3], [2, 1], [0, 2, 1, 0]),
        ] {
            let ws = [xs[1], mg, k[0], k[1]];
            let x = Tensor::f32(&xs, fill(xs.iter().product(), 1));
            let w = Tensor::f32(&ws, fill(ws.iter().product(), 2));
            let op = conv_transpose(
                &Attrs::new(11)
                    .with("group", AttrValue::Int(group as i64))
                    .with(
                        "strides",
                        AttrValue::Ints(s.iter().map(|&v| v as i64).collect()),
                    )
                    .with(
                        "dilations",
                        AttrValue::Ints(d.iter().map(|&v| v as i64).collect()),
                    )
                    .with("pads", AttrValue::Ints(pads.to_vec())),
            )
            .unwrap();
            let oshape = op.infer(&[&x.meta(), &w.meta()]).unwrap()[0].shape.clone();
            let o = [oshape[2], oshape[3]];
            for a in 0..2 {
                let full = s[a] * (xs[2 + a] - 1) + (k[a] - 1) * d[a] + 1;
                assert_eq!(o[a] as i64, full as i64 - pads[a] - pads[a + 2]);
            }
            let want = naive(
                x.as_f32().unwrap(),
                xs,
                w.as_f32().unwrap(),
                ws,
                group,
                s,
                d,
                [pads[0], pads[1]],
                o,
            );
            let rows = oshape[0] * oshape[1];
            let mut out = vec![Tensor::zeros(DType::F32, &oshape)];
            op.cpu(&[&x, &w], &mut out, 0..1).unwrap();
            op.cpu(&[&x, &w], &mut out, 1..rows).unwrap();
            for (gv, wv) in out[0].as_f32().unwrap().iter().zip(&want) {
                assert!((gv - wv).abs() < 1e-4, "{xs:?}: {gv} vs {wv}");
            }
        }
    }

    #[test]
    fn onnx_autopad_same_example() {
        // ONNX test_convtranspose_autopad_same: X 0..9 (3x3), W ones [1, 2, 3, 3],
        // SAME_UPPER, strides 2 -> [1, 2, 6, 6], rows 0 and 2 worked out by hand.
        let op = conv_transpose(
            &Attrs::new(11)
                .with("strides", AttrValue::Ints(vec![2, 2]))
                .with("auto_pad", AttrValue::String("SAME_UPPER".into())),
        )
        .unwrap();
        let x = Tensor::f32(&[1, 1, 3, 3], (0..9).map(|v| v as f32).collect());
        let w = Tensor::f32(&[1, 2, 3, 3], vec![1.0; 18]);
        let mut out = vec![Tensor::zeros(DType::F32, &[1, 2, 6, 6])];
        op.cpu(&[&x, &w], &mut out, 0..2).unwrap();
        let o = out[0].as_f32().unwrap();
        assert_eq!(&o[0..6], &[0.0, 0.0, 1.0, 1.0, 3.0, 2.0]);
        assert_eq!(&o[12..18], &[3.0, 3.0, 8.0, 5.0, 12.0, 7.0]);
        assert_eq!(&o[36..42], &[0.0, 0.0, 1.0, 1.0, 3.0, 2.0]);
    }

    #[test]
    fn output_shape_and_auto_pad() {
        let x = TensorMeta::new(DType::F32, vec![1, 1, 3, 3]);
        let w = TensorMeta::new(DType::F32, vec![1, 2, 3, 3]);
        let op = conv_transpose(
            &Attrs::new(11)
                .with("strides", AttrValue::Ints(vec![3, 2]))
                .with("output_shape", AttrValue::Ints(vec![10, 8])),
        )
        .unwrap();
        assert_eq!(op.infer(&[&x, &w]).unwrap()[0].shape, vec![1, 2, 10, 8]);
        let op = conv_transpose(
            &Attrs::new(11)
                .with("strides", AttrValue::Ints(vec![2, 2]))
                .with("auto_pad", AttrValue::String("SAME_UPPER".into())),
        )
        .unwrap();
        assert_eq!(op.infer(&[&x, &w]).unwrap()[0].shape, vec![1, 2, 6, 6]);
        let op = conv_transpose(
            &Attrs::new(11)
                .with("strides", AttrValue::Ints(vec![3, 2]))
                .with("output_padding", AttrValue::Ints(vec![1, 1])),
        )
        .unwrap();
        assert_eq!(op.infer(&[&x, &w]).unwrap()[0].shape, vec![1, 2, 10, 8]);
    }
}
