//! Conv (1-D and 2-D): groups (depthwise included), strides, dilations, pads, auto_pad, bias,
//! kernel shape from W. Also the attribute parsing and output-size arithmetic shared with
//! ConvTranspose.
//!
//! Sits between the operator contract ([`crate::Op`]) and the shared CPU GEMM
//! ([`crate::cpu_gemm`]) / the `conv` shader. 1-D convolutions run as 2-D ones with H = L and
//! W = 1, so everything below speaks of (H, W).
//!
//! Rows: output axis 2 (the first spatial axis), i.e. one row is one output line `(n, oc, oh)`
//! of OW elements; rows = N * M * OH. That is finer than cutting on channels (a 640x640 conv
//! with 8 output channels still splits at any line), and a row range is still contiguous.
//!
//! CPU paths: `cg == 1` (depthwise and single-input-channel convs) is a direct loop over output
//! lines (GEMM with K = kh*kw is wasteful); everything else is a GEMM per (image, group) on
//! pixel chunks: `out[oc, p] = W[oc, (c,kh,kw)] x col[(c,kh,kw), p]`, with `col` built by
//! im2col for the chunk (bounded scratch, parallel over chunks), or read straight from X for
//! 1x1 stride-1 unpadded convs. A row range becomes at most three rectangles (oc range x pixel
//! range) per group: a partial head channel, whole channels, a partial tail channel.

use crate::cpu_gemm::{sgemm_raw, MatRef, Threads};
use crate::matmul::{f32_in, f32_out};
use crate::shape::grid_1d;
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use rayon::prelude::*;
use std::ops::Range;

/// ONNX `auto_pad`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Attributes shared by Conv and ConvTranspose, as given (lengths checked against the spatial
/// rank once W is known).
#[derive(Debug, Clone, PartialEq)]
pub struct ConvAttrs {
    pub auto_pad: AutoPad,
    pub group: usize,
    pub kernel_shape: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    pub pads: Option<Vec<i64>>,
}

fn positive(op: &str, name: &str, v: Option<Vec<i64>>) -> Result<Option<Vec<usize>>> {
    match v {
        None => Ok(None),
        Some(v) if v.iter().all(|&x| x >= 1) => Ok(Some(v.iter().map(|&x| x as usize).collect())),
        Some(v) => Err(OpError::Invalid(format!(
            "{op}: `{name}` must be >= 1, got {v:?}"
        ))),
    }
}

impl ConvAttrs {
    /// Read and validate the shared attributes of `op` ("Conv" or "ConvTranspose").
    pub fn parse(op: &str, attrs: &Attrs) -> Result<ConvAttrs> {
        let auto_pad = match attrs.string("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "" => AutoPad::NotSet,
            "SAME_UPPER" => AutoPad::SameUpper,
            "SAME_LOWER" => AutoPad::SameLower,
            "VALID" => AutoPad::Valid,
            other => {
                return Err(OpError::Invalid(format!(
                    "{op}: unknown auto_pad `{other}`"
                )))
            }
        };
        let group = attrs.int("group", 1)?;
        if group < 1 {
            return Err(OpError::Invalid(format!(
                "{op}: group must be >= 1, got {group}"
            )));
        }
        let pads = attrs.ints_opt("pads")?;
        if op == "Conv" && pads.as_ref().is_some_and(|p| p.iter().any(|&x| x < 0)) {
            return Err(OpError::Invalid(format!("Conv: negative pads {pads:?}")));
        }
        Ok(ConvAttrs {
            auto_pad,
            group: group as usize,
            kernel_shape: positive(op, "kernel_shape", attrs.ints_opt("kernel_shape")?)?,
            strides: positive(op, "strides", attrs.ints_opt("strides")?)?,
            dilations: positive(op, "dilations", attrs.ints_opt("dilations")?)?,
            pads,
        })
    }

    /// Per spatial axis: (kernel, stride, dilation, pad begin, pad end), checking lengths and
    /// that `kernel_shape` (if given) agrees with W's spatial dims `wk`.
    pub fn per_axis(&self, op: &str, wk: &[usize]) -> Result<Vec<AxisParams>> {
        let r = wk.len();
        let len_ok = |name: &str, l: Option<usize>, want: usize| match l {
            Some(l) if l != want => Err(OpError::Invalid(format!(
                "{op}: `{name}` has {l} values, expected {want} for {r} spatial dims"
            ))),
            _ => Ok(()),
        };
        len_ok(
            "kernel_shape",
            self.kernel_shape.as_ref().map(|v| v.len()),
            r,
        )?;
        len_ok("strides", self.strides.as_ref().map(|v| v.len()), r)?;
        len_ok("dilations", self.dilations.as_ref().map(|v| v.len()), r)?;
        len_ok("pads", self.pads.as_ref().map(|v| v.len()), 2 * r)?;
        if let Some(ks) = &self.kernel_shape {
            if ks.as_slice() != wk {
                return Err(OpError::Invalid(format!(
                    "{op}: kernel_shape {ks:?} differs from W's spatial dims {wk:?}"
                )));
            }
        }
        Ok((0..r)
            .map(|i| {
                (
                    wk[i],
                    self.strides.as_ref().map_or(1, |v| v[i]),
                    self.dilations.as_ref().map_or(1, |v| v[i]),
                    self.pads.as_ref().map_or(0, |v| v[i]),
                    self.pads.as_ref().map_or(0, |v| v[i + r]),
                )
            })
            .collect())
    }
}

/// One spatial axis: (kernel, stride, dilation, pad begin, pad end).
pub type AxisParams = (usize, usize, usize, i64, i64);

/// Output size and begin pad of one spatial axis of a convolution.
pub fn conv_out_len(
    input: usize,
    (k, s, d, pb, pe): AxisParams,
    auto_pad: AutoPad,
) -> Result<(usize, i64)> {
    let dk = ((k - 1) * d + 1) as i64;
    let inp = input as i64;
    let (s_, out, pb) = match auto_pad {
        AutoPad::NotSet => (s as i64, None, pb),
        AutoPad::Valid => (s as i64, None, 0),
        AutoPad::SameUpper | AutoPad::SameLower => {
            let out = (inp + s as i64 - 1) / s as i64;
            let total = ((out - 1) * s as i64 + dk - inp).max(0);
            let b = if auto_pad == AutoPad::SameUpper {
                total / 2
            } else {
                total - total / 2
            };
            (s as i64, Some(out), b)
        }
    };
    if let Some(out) = out {
        return Ok((out as usize, pb));
    }
    let pe = if auto_pad == AutoPad::Valid { 0 } else { pe };
    let span = inp + pb + pe - dk;
    if span < 0 {
        return Err(OpError::Invalid(format!(
            "Conv: dilated kernel {dk} is larger than the padded input {}",
            inp + pb + pe
        )));
    }
    Ok(((span / s_ + 1) as usize, pb))
}

/// A convolution normalised to 2-D (1-D: H = L, W = 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geom2 {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub m: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    pub pt: i64,
    pub pl: i64,
    pub oh: usize,
    pub ow: usize,
    pub group: usize,
    /// Input channels per group.
    pub cg: usize,
    /// Output channels per group.
    pub mg: usize,
}

impl Geom2 {
    /// Elements per kernel window of one output channel: `cg * kh * kw`.
    pub fn ckk(&self) -> usize {
        self.cg * self.kh * self.kw
    }
}

/// Conv with its attributes.
#[derive(Debug, Clone)]
pub struct Conv {
    pub attrs: ConvAttrs,
}

/// Registry constructor.
pub fn conv(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(Conv {
        attrs: ConvAttrs::parse("Conv", attrs)?,
    }))
}

impl Conv {
    /// Geometry and output shape from X, W (and B) shapes.
    pub fn geom(&self, ins: &[&[usize]]) -> Result<(Geom2, Vec<usize>)> {
        if ins.len() < 2 || ins.len() > 3 {
            return Err(OpError::Invalid(format!(
                "Conv takes 2 or 3 inputs, got {}",
                ins.len()
            )));
        }
        let (x, w) = (ins[0], ins[1]);
        if x.len() != w.len() || x.len() < 3 {
            return Err(OpError::Invalid(format!(
                "Conv: X {x:?} and W {w:?} ranks differ or < 3"
            )));
        }
        let r = x.len() - 2;
        if r > 2 {
            return Err(OpError::Unsupported(format!(
                "Conv with {r} spatial dims (1-D, 2-D only)"
            )));
        }
        let group = self.attrs.group;
        let (n, c, m) = (x[0], x[1], w[0]);
        if c != w[1] * group || m % group != 0 {
            return Err(OpError::Invalid(format!(
                "Conv: X {x:?}, W {w:?} and group {group} disagree (need C = W[1] * group, M % group = 0)"
            )));
        }
        if let Some(b) = ins.get(2) {
            if *b != [m] {
                return Err(OpError::Invalid(format!(
                    "Conv: bias shape {b:?}, expected [{m}]"
                )));
            }
        }
        if w[2..].contains(&0) {
            return Err(OpError::Invalid(format!("Conv: empty kernel {w:?}")));
        }
        let axes = self.attrs.per_axis("Conv", &w[2..])?;
        let mut outs = Vec::new();
        for i in 0..r {
            outs.push(conv_out_len(x[2 + i], axes[i], self.attrs.auto_pad)?);
        }
        let mut shape = vec![n, m];
        shape.extend(outs.iter().map(|o| o.0));
        let one = (1, 1, 1, 0, 0);
        let (ax_w, (ow, pl), wdim) = if r == 2 {
            (axes[1], outs[1], x[3])
        } else {
            (one, (1, 0), 1)
        };
        let g = Geom2 {
            n,
            c,
            h: x[2],
            w: wdim,
            m,
            kh: axes[0].0,
            kw: ax_w.0,
            sh: axes[0].1,
            sw: ax_w.1,
            dh: axes[0].2,
            dw: ax_w.2,
            pt: outs[0].1,
            pl,
            oh: outs[0].0,
            ow,
            group,
            cg: w[1],
            mg: m / group,
        };
        Ok((g, shape))
    }
}

fn shapes<'a>(ins: &[&'a TensorMeta]) -> Vec<&'a [usize]> {
    ins.iter().map(|t| t.shape.as_slice()).collect()
}

/// Output positions `o < out_len` whose input index `o * stride + offset` lies in `0..in_len`.
pub fn valid_range(out_len: usize, stride: usize, offset: i64, in_len: usize) -> Range<usize> {
    let s = stride as i64;
    let lo = if offset >= 0 {
        0
    } else {
        (-offset + s - 1) / s
    };
    let last = in_len as i64 - 1 - offset;
    let hi = if last < 0 { 0 } else { last / s + 1 };
    let lo = (lo as usize).min(out_len);
    lo..(hi as usize).clamp(lo, out_len)
}

/// Raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32, usize);
// SAFETY: only used to hand disjoint output blocks to rayon tasks (see `gemm_path`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// Direct loop for `cg == 1`: output lines `(n, oc, oh)` in `rows`, each from its one input
/// channel, several lines per task (a depthwise line is often only 7 to 56 elements).
fn direct_path(
    g: &Geom2,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let ow = g.ow.max(1);
    let dst = &mut out[rows.start * ow..rows.end * ow];
    let threads = rayon::current_num_threads().max(1);
    // About 16K multiply-adds per task, and at least 4 tasks per thread where there are lines
    // enough.
    let per = (16_384 / (ow * g.kh * g.kw))
        .min(rows.len().div_ceil(4 * threads))
        .max(1);
    // Per kernel column: the output columns whose tap lies inside the input row, and the input
    // column of the first (the same for every line).
    let taps: Vec<(Range<usize>, usize)> = (0..g.kw)
        .map(|kj| {
            let off = (kj * g.dw) as i64 - g.pl;
            let vr = valid_range(g.ow, g.sw, off, g.w);
            let first = if vr.is_empty() {
                0
            } else {
                ((vr.start * g.sw) as i64 + off) as usize
            };
            (vr, first)
        })
        .collect();
    dst.par_chunks_mut(per * ow)
        .enumerate()
        .for_each(|(ci, chunk)| {
            for (i, line) in chunk.chunks_mut(ow).enumerate() {
                direct_line(g, (x, w, b), &taps, rows.start + ci * per + i, line);
            }
        });
}

/// Output line `r` = `(n, oc, oh)` of a `cg == 1` convolution: the bias, then each tap's
/// weight times the input row segment it reads (`taps`: see [`direct_path`]).
fn direct_line(
    g: &Geom2,
    (x, w, b): (&[f32], &[f32], Option<&[f32]>),
    taps: &[(Range<usize>, usize)],
    r: usize,
    line: &mut [f32],
) {
    let (oh, oc, n) = (r % g.oh, (r / g.oh) % g.m, r / (g.oh * g.m));
    line.fill(b.map_or(0.0, |b| b[oc]));
    let xplane = &x[(n * g.c + oc / g.mg) * g.h * g.w..][..g.h * g.w];
    for ki in 0..g.kh {
        let ih = (oh * g.sh + ki * g.dh) as i64 - g.pt;
        if ih < 0 || ih >= g.h as i64 {
            continue;
        }
        let xrow = &xplane[ih as usize * g.w..][..g.w];
        for (kj, (vr, first)) in taps.iter().enumerate() {
            if vr.is_empty() {
                continue;
            }
            let wv = w[(oc * g.kh + ki) * g.kw + kj];
            let src = &xrow[*first..];
            let dst = &mut line[vr.clone()];
            if g.sw == 1 {
                crate::cpu_gemm::axpy(dst, wv, src);
            } else {
                for (o, xv) in dst.iter_mut().zip(src.iter().step_by(g.sw)) {
                    *o += wv * xv;
                }
            }
        }
    }
}

/// im2col of pixels `p0..p1` of one image and group (`xg`: its cg input planes) into `col`
/// (`ckk` rows of `p1 - p0`).
fn im2col(g: &Geom2, xg: &[f32], p0: usize, p1: usize, col: &mut [f32]) {
    let per_c = g.kh * g.kw * (p1 - p0);
    for (c, part) in col[..g.cg * per_c].chunks_mut(per_c).enumerate() {
        im2col_channel(g, &xg[c * g.h * g.w..][..g.h * g.w], p0, p1, part);
    }
}

/// [`im2col`] split over input channels on the pool (one block of columns that every task
/// then reads).
fn im2col_par(g: &Geom2, xg: &[f32], p0: usize, p1: usize, col: &mut [f32]) {
    let per_c = g.kh * g.kw * (p1 - p0);
    col[..g.cg * per_c]
        .par_chunks_mut(per_c)
        .enumerate()
        .for_each(|(c, part)| im2col_channel(g, &xg[c * g.h * g.w..][..g.h * g.w], p0, p1, part));
}

/// The `kh * kw` im2col rows of one input plane for pixels `p0..p1`.
fn im2col_channel(g: &Geom2, xplane: &[f32], p0: usize, p1: usize, rows: &mut [f32]) {
    let np = p1 - p0;
    for ki in 0..g.kh {
        for kj in 0..g.kw {
            let row = &mut rows[(ki * g.kw + kj) * np..][..np];
            let off = (kj * g.dw) as i64 - g.pl;
            if g.ow == 1 {
                im2col_column(g, xplane, ki, off, p0, row);
                continue;
            }
            let vr = valid_range(g.ow, g.sw, off, g.w);
            let mut p = p0;
            while p < p1 {
                let (oh, ow0) = (p / g.ow, p % g.ow);
                let ow1 = g.ow.min(ow0 + (p1 - p));
                let seg = &mut row[p - p0..p - p0 + (ow1 - ow0)];
                p += ow1 - ow0;
                let ih = (oh * g.sh + ki * g.dh) as i64 - g.pt;
                if ih < 0 || ih >= g.h as i64 {
                    seg.fill(0.0);
                    continue;
                }
                let xrow = &xplane[ih as usize * g.w..][..g.w];
                // Zeros left and right of the valid columns, a (strided) copy between.
                let (a, b) = (vr.start.clamp(ow0, ow1), vr.end.clamp(ow0, ow1));
                seg[..a - ow0].fill(0.0);
                seg[b - ow0..].fill(0.0);
                let dst = &mut seg[a - ow0..b - ow0];
                if dst.is_empty() {
                    continue;
                }
                let src = &xrow[((a * g.sw) as i64 + off) as usize..];
                if g.sw == 1 {
                    dst.copy_from_slice(&src[..dst.len()]);
                } else {
                    for (v, xv) in dst.iter_mut().zip(src.iter().step_by(g.sw)) {
                        *v = *xv;
                    }
                }
            }
        }
    }
}

/// One im2col row when every output line is one pixel (`ow == 1`, 1-D convolutions): pixel `p`
/// is output line `p`, so the row is a strided copy down input column `off`, zero where the
/// tap falls in the padding.
fn im2col_column(g: &Geom2, xplane: &[f32], ki: usize, off: i64, p0: usize, row: &mut [f32]) {
    if off < 0 || off >= g.w as i64 {
        row.fill(0.0);
        return;
    }
    let p1 = p0 + row.len();
    let shift = (ki * g.dh) as i64 - g.pt;
    let vr = valid_range(g.oh, g.sh, shift, g.h);
    let (a, b) = (vr.start.clamp(p0, p1), vr.end.clamp(p0, p1));
    row[..a - p0].fill(0.0);
    row[b - p0..].fill(0.0);
    if a < b {
        let first = ((a * g.sh) as i64 + shift) as usize * g.w + off as usize;
        let src = xplane[first..].iter().step_by(g.sh * g.w);
        for (v, xv) in row[a - p0..b - p0].iter_mut().zip(src) {
            *v = *xv;
        }
    }
}

thread_local! {
    /// This thread's im2col buffer, reused across calls (see [`with_scratch`]).
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Largest im2col buffer a thread keeps between calls (16 MiB); larger ones are freed.
const SCRATCH_KEEP: usize = 4 << 20;

/// Run `f` on `len` floats of this thread's im2col buffer: grown when needed, never cleared
/// (im2col writes every element it hands on). The buffer is taken out of the thread-local for
/// the call, so a nested call on the same thread (rayon work-stealing inside a GEMM) gets a
/// buffer of its own instead of sharing this one.
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut v = SCRATCH.with(|s| s.take());
    if v.len() < len {
        v.resize(len, 0.0);
    }
    let r = f(&mut v[..len]);
    if v.len() <= SCRATCH_KEEP {
        SCRATCH.with(|s| s.set(v));
    }
    r
}

/// One rectangle of a row range inside a group: output channels `oc` (absolute) x pixels.
#[derive(Debug, Clone)]
struct Rect {
    oc: Range<usize>,
    pix: Range<usize>,
}

/// Split group-local rows `q` (`ocl * OH + oh`) into at most 3 rectangles.
fn rects(g: &Geom2, oc0: usize, q: Range<usize>) -> Vec<Rect> {
    let (oh, ow) = (g.oh, g.ow);
    let mut v = Vec::new();
    let (c0, h0) = (q.start / oh, q.start % oh);
    let (c1, h1) = (q.end / oh, q.end % oh);
    if c0 == c1 {
        v.push(Rect {
            oc: oc0 + c0..oc0 + c0 + 1,
            pix: h0 * ow..h1 * ow,
        });
        return v;
    }
    let mut full = c0..c1;
    if h0 != 0 {
        v.push(Rect {
            oc: oc0 + c0..oc0 + c0 + 1,
            pix: h0 * ow..oh * ow,
        });
        full.start += 1;
    }
    if !full.is_empty() {
        v.push(Rect {
            oc: oc0 + full.start..oc0 + full.end,
            pix: 0..oh * ow,
        });
    }
    if h1 != 0 {
        v.push(Rect {
            oc: oc0 + c1..oc0 + c1 + 1,
            pix: 0..h1 * ow,
        });
    }
    v
}

/// One GEMM-path task: image, group, its rectangles, a pixel chunk.
type Task = (usize, usize, std::sync::Arc<Vec<Rect>>, Range<usize>);

/// GEMM path: per (image, group), rectangles of the row range; then either pixel chunks in
/// parallel (each with its own im2col block), or, when the rectangles have at least as many
/// output channels as pixels (deep layers, 1-D convolutions), one im2col block shared by
/// tasks that split the output channels: pixel chunks would each repack all the weights.
fn gemm_path(
    g: &Geom2,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let ckk = g.ckk();
    let direct_b = g.kh == 1
        && g.kw == 1
        && g.sh == 1
        && g.sw == 1
        && g.pt == 0
        && g.pl == 0
        && g.oh == g.h
        && g.ow == g.w;
    let threads = rayon::current_num_threads().max(1);
    let optr = OutPtr(out.as_mut_ptr(), out.len());
    let mut tasks: Vec<Task> = Vec::new();
    let img_rows = g.m * g.oh;
    for n in rows.start / img_rows..rows.end.div_ceil(img_rows) {
        for grp in 0..g.group {
            let lo = n * img_rows + grp * g.mg * g.oh;
            let q = rows.start.max(lo)..rows.end.min(lo + g.mg * g.oh);
            if q.is_empty() {
                continue;
            }
            let rs = rects(g, grp * g.mg, q.start - lo..q.end - lo);
            let union = rs.iter().map(|r| r.pix.start).min().unwrap()
                ..rs.iter().map(|r| r.pix.end).max().unwrap();
            let chans = rs.iter().map(|r| r.oc.len()).max().unwrap();
            if chans >= union.len() {
                channel_split(g, (x, w, b), optr, (n, grp), &rs, union, direct_b);
                continue;
            }
            let target = if direct_b {
                union.len()
            } else {
                (262_144 / ckk).max(64)
            };
            // A multiple of the thread count, so no thread idles through a last round.
            let mut count = union.len().div_ceil(target);
            if union.len() >= 64 * threads {
                count = count.next_multiple_of(threads);
            }
            let chunk = union.len().div_ceil(count);
            let rs = std::sync::Arc::new(rs);
            let mut p = union.start;
            while p < union.end {
                let e = (p + chunk).min(union.end);
                tasks.push((n, grp, rs.clone(), p..e));
                p = e;
            }
        }
    }
    let run = |(n, grp, rs, chunk): &Task, th: Threads| {
        let xg_off = (n * g.c + grp * g.cg) * g.h * g.w;
        let blocks = |bdata: &[f32], boff: usize, brs: usize, base: usize| {
            for r in rs.iter() {
                let pix = r.pix.start.max(chunk.start)..r.pix.end.min(chunk.end);
                if pix.is_empty() {
                    continue;
                }
                let bm = MatRef {
                    data: bdata,
                    offset: boff + pix.start - base,
                    rs: brs,
                    cs: 1,
                };
                // SAFETY: tasks cover disjoint (channel, pixel) blocks of the output:
                // rectangles partition the row range, chunks partition each group's pixels.
                unsafe { gemm_block(g, (w, b), optr, *n, r.oc.clone(), pix, bm, th) };
            }
        };
        if direct_b {
            blocks(x, xg_off, g.h * g.w, 0);
        } else {
            with_scratch(ckk * chunk.len(), |col| {
                im2col(g, &x[xg_off..], chunk.start, chunk.end, col);
                blocks(col, 0, chunk.len(), chunk.start);
            });
        }
    };
    if tasks.len() >= threads && threads > 1 {
        tasks.par_iter().for_each(|t| run(t, Threads::Single));
    } else {
        tasks.iter().for_each(|t| run(t, Threads::Pool));
    }
}

/// The GEMM path for one (image, group) whose rectangles `rs` have at least as many output
/// channels as pixels: im2col of the pixel `union` once (in parallel over input channels), then
/// each rectangle's channels cut in one part per thread.
fn channel_split(
    g: &Geom2,
    (x, w, b): (&[f32], &[f32], Option<&[f32]>),
    optr: OutPtr,
    (n, grp): (usize, usize),
    rs: &[Rect],
    union: Range<usize>,
    direct_b: bool,
) {
    let threads = rayon::current_num_threads().max(1);
    let mut parts: Vec<(Range<usize>, Range<usize>)> = Vec::new();
    for r in rs {
        let k = if r.oc.len() >= 8 * threads {
            threads
        } else {
            1
        };
        let step = r.oc.len().div_ceil(k);
        let mut c = r.oc.start;
        while c < r.oc.end {
            parts.push((c..(c + step).min(r.oc.end), r.pix.clone()));
            c += step;
        }
    }
    let xg_off = (n * g.c + grp * g.cg) * g.h * g.w;
    let go = |bdata: &[f32], boff: usize, brs: usize, base: usize| {
        let one = |(oc, pix): &(Range<usize>, Range<usize>), th: Threads| {
            let bm = MatRef {
                data: bdata,
                offset: boff + pix.start - base,
                rs: brs,
                cs: 1,
            };
            // SAFETY: the parts cut the rectangles (disjoint output blocks) by channel.
            unsafe { gemm_block(g, (w, b), optr, n, oc.clone(), pix.clone(), bm, th) };
        };
        if parts.len() >= threads && threads > 1 {
            parts.par_iter().for_each(|p| one(p, Threads::Single));
        } else {
            parts.iter().for_each(|p| one(p, Threads::Pool));
        }
    };
    if direct_b {
        go(x, xg_off, g.h * g.w, 0);
    } else {
        with_scratch(g.ckk() * union.len(), |col| {
            im2col_par(g, &x[xg_off..], union.start, union.end, col);
            go(col, 0, union.len(), union.start);
        });
    }
}

/// Output channels `oc` x pixels `pix` of image `n`: the GEMM of those weight rows with `bm`
/// (`ckk` rows of B starting at the block's first pixel), then the bias while the block is
/// still in cache.
///
/// # Safety
/// No other thread may access that output block during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_block(
    g: &Geom2,
    (w, b): (&[f32], Option<&[f32]>),
    optr: OutPtr,
    n: usize,
    oc: Range<usize>,
    pix: Range<usize>,
    bm: MatRef,
    th: Threads,
) {
    let (plane, ckk) = (g.oh * g.ow, g.ckk());
    let first = (n * g.m + oc.start) * plane + pix.start;
    let a = MatRef::row_major(w, oc.start * ckk, ckk);
    // SAFETY: the caller holds the block exclusively; sgemm_raw checks it lies in the output.
    unsafe {
        sgemm_raw(
            oc.len(),
            pix.len(),
            ckk,
            1.0,
            a,
            bm,
            0.0,
            optr.ptr(),
            optr.1,
            (first, plane, 1),
            th,
        );
    }
    let Some(b) = b else { return };
    for (i, c) in oc.enumerate() {
        let at = first + i * plane;
        assert!(at + pix.len() <= optr.1, "Conv bias block out of bounds");
        // SAFETY: in bounds (checked) and held exclusively by this call (caller contract).
        let line = unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(at), pix.len()) };
        line.iter_mut().for_each(|v| *v += b[c]);
    }
}

/// Compute output lines `rows` of a convolution on the CPU (f32).
pub fn conv_cpu(
    g: &Geom2,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let rows = rows.start.min(g.n * g.m * g.oh)..rows.end.min(g.n * g.m * g.oh);
    if rows.is_empty() || g.ow == 0 {
        return;
    }
    if g.cg == 1 {
        return direct_path(g, x, w, b, out, rows);
    }
    gemm_path(g, x, w, b, out, rows);
}

/// Params of `conv.wgsl` (layout mirrored there).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ConvParams {
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
    blk0: u32,
    e_start: u32,
    e_end: u32,
    bpp: u32,
    threads: u32,
    ocb: u32,
    mgb: u32,
    _pad: [u32; 3],
}

fn u32_of(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| OpError::Unsupported(format!("Conv on GPU: size {v} exceeds u32")))
}

impl Op for Conv {
    fn name(&self) -> &'static str {
        "Conv"
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let (_, shape) = self.geom(&shapes(ins))?;
        for (i, t) in ins.iter().enumerate() {
            if t.dtype != DType::F32 {
                return Err(OpError::Unsupported(format!(
                    "Conv: input {i} has dtype {}, only f32 is implemented",
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
                let o = (g.n * g.m * g.oh * g.ow) as u64;
                2 * o * g.ckk() as u64 + if ins.len() > 2 { o } else { 0 }
            })
            .unwrap_or(0);
        Work {
            flops,
            bytes_read: ins.iter().map(|i| i.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        Some(2)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let sh: Vec<&[usize]> = ins.iter().map(|t| t.shape.as_slice()).collect();
        let (g, _) = self.geom(&sh)?;
        let x = f32_in("Conv", ins[0])?;
        let w = f32_in("Conv", ins[1])?;
        let b = ins.get(2).map(|t| f32_in("Conv", t)).transpose()?;
        let out = f32_out("Conv", &mut outs[0])?;
        conv_cpu(&g, x, w, b, out, rows);
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let (g, _) = self.geom(&shapes(ins))?;
        let total = g.n * g.m * g.oh;
        let rows = rows.start.min(total)..rows.end.min(total);
        if rows.is_empty() || g.ow == 0 {
            return Ok(Vec::new());
        }
        let plane = g.oh * g.ow;
        let (e0, e1) = (rows.start * g.ow, rows.end * g.ow);
        let (pl0, pl1) = (e0 / plane, (e1 - 1) / plane);
        let bpp = plane.div_ceil(4);
        let ocb = if g.mg >= 4 { 4 } else { 1 };
        let mgb = g.mg.div_ceil(ocb);
        let block = |pl: usize| {
            let oc = pl % g.m;
            (pl / g.m) * mgb * g.group + (oc / g.mg) * mgb + (oc % g.mg) / ocb
        };
        let (b0, b1) = (block(pl0), block(pl1));
        let threads = (b1 + 1 - b0) * bpp;
        u32_of(g.n * g.m * plane)?;
        let p = ConvParams {
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
            pt: g.pt as i32,
            pl: g.pl as i32,
            cg: u32_of(g.cg)?,
            mg: u32_of(g.mg)?,
            has_bias: (ins.len() > 2) as u32,
            blk0: u32_of(b0)?,
            e_start: e0 as u32,
            e_end: e1 as u32,
            bpp: bpp as u32,
            threads: u32_of(threads)?,
            ocb: ocb as u32,
            mgb: u32_of(mgb)?,
            _pad: [0; 3],
        };
        let inputs = if ins.len() > 2 {
            vec![0, 1, 2]
        } else {
            vec![0, 1, 1]
        };
        Ok(vec![GpuKernel::new(
            tandem_shaders::CONV,
            inputs,
            vec![0],
            &p,
            grid_1d(threads as u64, 64),
        )
        .with_override("WG", 64.0)])
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

    /// Conv by the definition, 2-D, explicit begin pads, any group.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        x: &[f32],
        xs: [usize; 4],
        w: &[f32],
        ws: [usize; 4],
        b: Option<&[f32]>,
        group: usize,
        s: [usize; 2],
        d: [usize; 2],
        p: [i64; 2],
        o: [usize; 2],
    ) -> Vec<f32> {
        let [n, c, h, wd] = xs;
        let [m, cg, kh, kw] = ws;
        let mg = m / group;
        let mut out = vec![0.0; n * m * o[0] * o[1]];
        for ni in 0..n {
            for oc in 0..m {
                let g = oc / mg;
                for y in 0..o[0] {
                    for xo in 0..o[1] {
                        let mut acc = b.map_or(0.0, |b| b[oc]);
                        for ci in 0..cg {
                            for i in 0..kh {
                                for j in 0..kw {
                                    let ih = (y * s[0] + i * d[0]) as i64 - p[0];
                                    let iw = (xo * s[1] + j * d[1]) as i64 - p[1];
                                    if ih < 0 || iw < 0 || ih >= h as i64 || iw >= wd as i64 {
                                        continue;
                                    }
                                    let xi = ((ni * c + g * cg + ci) * h + ih as usize) * wd
                                        + iw as usize;
                                    acc += x[xi] * w[((oc * cg + ci) * kh + i) * kw + j];
                                }
                            }
                        }
                        out[((ni * m + oc) * o[0] + y) * o[1] + xo] = acc;
                    }
                }
            }
        }
        out
    }

    #[allow(clippy::too_many_arguments, clippy::single_range_in_vec_init)]
    fn case(
        xs: [usize; 4],
        m: usize,
        k: [usize; 2],
        group: usize,
        s: [usize; 2],
        d: [usize; 2],
        pads: [i64; 4],
        bias: bool,
    ) {
        let ws = [m, xs[1] / group, k[0], k[1]];
        let x = Tensor::f32(&xs, fill(xs.iter().product(), 1));
        let w = Tensor::f32(&ws, fill(ws.iter().product(), 2));
        let b = Tensor::f32(&[m], fill(m, 3));
        let attrs = Attrs::new(11)
            .with("group", AttrValue::Int(group as i64))
            .with(
                "strides",
                AttrValue::Ints(s.iter().map(|&v| v as i64).collect()),
            )
            .with(
                "dilations",
                AttrValue::Ints(d.iter().map(|&v| v as i64).collect()),
            )
            .with("pads", AttrValue::Ints(pads.to_vec()));
        let op = conv(&attrs).unwrap();
        let mut ins = vec![x.clone(), w.clone()];
        if bias {
            ins.push(b.clone());
        }
        let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
        let mrefs: Vec<&TensorMeta> = metas.iter().collect();
        let oshape = op.infer(&mrefs).unwrap()[0].shape.clone();
        let o = [oshape[2], oshape[3]];
        let want = naive(
            x.as_f32().unwrap(),
            xs,
            w.as_f32().unwrap(),
            ws,
            bias.then(|| b.as_f32().unwrap()),
            group,
            s,
            d,
            [pads[0], pads[1]],
            o,
        );
        let rows = oshape[0] * oshape[1] * oshape[2];
        let refs: Vec<&Tensor> = ins.iter().collect();
        let cut = rows / 3 + 1;
        for parts in [vec![0..rows], vec![0..cut, cut..rows]] {
            let mut out = vec![Tensor::zeros(DType::F32, &oshape)];
            for r in parts {
                op.cpu(&refs, &mut out, r).unwrap();
            }
            for (i, (gv, wv)) in out[0].as_f32().unwrap().iter().zip(&want).enumerate() {
                assert!(
                    (gv - wv).abs() < 1e-4,
                    "{xs:?} m {m} k {k:?} g {group} s {s:?}: [{i}] {gv} vs {wv}"
                );
            }
        }
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn conv_matches_definition() {
        case(
            [1, 3, 9, 11],
            5,
            [3, 3],
            1,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            true,
        );
        case(
            [2, 4, 10, 7],
            6,
            [3, 2],
            2,
            [2, 1],
            [1, 2],
            [0, 1, 2, 0],
            false,
        );
        case(
            [1, 8, 6, 6],
            8,
            [3, 3],
            8,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            true,
        );
        case(
            [1, 4, 12, 12],
            8,
            [5, 5],
            4,
            [2, 2],
            [1, 1],
            [2, 2, 2, 2],
            true,
        );
        case(
            [2, 6, 5, 7],
            4,
            [1, 1],
            1,
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            true,
        );
        case(
            [1, 16, 20, 20],
            12,
            [3, 3],
            1,
            [1, 1],
            [2, 2],
            [2, 2, 2, 2],
            false,
        );
        case(
            [1, 1, 7, 7],
            3,
            [3, 3],
            1,
            [2, 2],
            [1, 1],
            [1, 0, 1, 0],
            true,
        );
        // many pixel chunks, rectangles starting inside a chunk, several images and groups
        type Case = ([usize; 4], usize, usize, [usize; 2], [i64; 4]);
        let big: &[Case] = &[
            ([1, 8, 40, 40], 16, 1, [1, 1], [1, 1, 1, 1]),
            ([2, 8, 33, 30], 6, 2, [1, 2], [1, 1, 1, 1]),
            ([2, 32, 17, 19], 8, 1, [1, 1], [0, 0, 0, 0]),
        ];
        for &(xs, m, group, s, pads) in big {
            let k = if pads[0] == 0 { [1, 1] } else { [3, 3] };
            case(xs, m, k, group, s, [1, 1], pads, true);
        }
    }

    /// The paths added for speed, each against the 7-loop definition: 1-D convolutions (one
    /// pixel per output line: the strided im2col column), channel-split GEMMs (at least as many
    /// output channels as pixels: one shared im2col block, or X read directly for 1x1), grouped
    /// channel splits, and depthwise lines batched per task with strides and dilations.
    #[test]
    fn fast_paths_match_definition() {
        type Case = (
            [usize; 4],
            usize,
            [usize; 2],
            usize,
            [usize; 2],
            [usize; 2],
            [i64; 4],
        );
        let cases: &[Case] = &[
            ([1, 16, 30, 1], 40, [5, 1], 1, [1, 1], [1, 1], [2, 0, 2, 0]),
            ([2, 6, 23, 1], 12, [3, 1], 1, [2, 1], [2, 1], [1, 0, 0, 0]),
            ([1, 256, 20, 1], 64, [5, 1], 1, [1, 1], [1, 1], [0, 0, 0, 0]),
            ([2, 64, 5, 5], 96, [3, 3], 2, [1, 1], [1, 1], [1, 1, 1, 1]),
            ([1, 128, 4, 4], 64, [1, 1], 1, [1, 1], [1, 1], [0, 0, 0, 0]),
            ([1, 40, 9, 7], 48, [3, 3], 1, [2, 2], [1, 1], [1, 1, 1, 1]),
            (
                [1, 12, 15, 15],
                12,
                [3, 3],
                12,
                [2, 2],
                [2, 2],
                [2, 2, 2, 2],
            ),
            ([2, 6, 9, 9], 12, [3, 3], 6, [1, 2], [1, 1], [1, 0, 1, 2]),
            (
                [1, 32, 56, 56],
                32,
                [3, 3],
                32,
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
            ),
        ];
        for &(xs, m, k, group, s, d, pads) in cases {
            for bias in [true, false] {
                case(xs, m, k, group, s, d, pads, bias);
            }
        }
    }

    #[test]
    fn auto_pad_and_one_dimensional_shapes() {
        let x = TensorMeta::new(DType::F32, vec![1, 2, 7, 5]);
        let w = TensorMeta::new(DType::F32, vec![3, 2, 3, 3]);
        let same = |mode: &str| {
            conv(
                &Attrs::new(11)
                    .with("auto_pad", AttrValue::String(mode.into()))
                    .with("strides", AttrValue::Ints(vec![2, 2])),
            )
            .unwrap()
        };
        assert_eq!(
            same("SAME_UPPER").infer(&[&x, &w]).unwrap()[0].shape,
            vec![1, 3, 4, 3]
        );
        assert_eq!(
            same("VALID").infer(&[&x, &w]).unwrap()[0].shape,
            vec![1, 3, 3, 2]
        );
        let x1 = TensorMeta::new(DType::F32, vec![1, 2, 9]);
        let w1 = TensorMeta::new(DType::F32, vec![4, 2, 3]);
        let op = conv(&Attrs::new(11)).unwrap();
        assert_eq!(op.infer(&[&x1, &w1]).unwrap()[0].shape, vec![1, 4, 7]);
        let bad = TensorMeta::new(DType::F32, vec![4, 3, 3]);
        assert!(matches!(op.infer(&[&x1, &bad]), Err(OpError::Invalid(_))));
        assert_eq!(
            conv_out_len(5, (3, 2, 1, 0, 0), AutoPad::SameLower).unwrap(),
            (3, 1)
        );
        assert_eq!(
            conv_out_len(6, (3, 2, 1, 0, 0), AutoPad::SameUpper).unwrap(),
            (3, 0)
        );
    }
}
