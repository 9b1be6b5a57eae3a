//! Resize (opsets 10 to 19) and Upsample (opsets 7, 9): nearest, n-linear and cubic
//! interpolation with the ONNX coordinate transformation modes.
//!
//! Sits between the operator contract (`op.rs`) and its kernels: a CPU kernel over precomputed
//! per-axis tap tables (nearest for any dtype, linear/cubic for f32) and `resize.wgsl`, which
//! computes the same taps per element. Scales / sizes / roi are read at plan time.

use crate::movement::{
    absent, check_gpu_size, cpu_metas, pack8, plan_value, row_elems, with_same_type, Elem,
    SameTypeKernel,
};
use crate::pad::scalar_of;
use crate::shape::{grid_1d, normalize_axis, strides};
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta};
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Nearest = 0,
    Linear = 1,
    Cubic = 2,
}

/// Coordinate transformation modes, numbered as in `resize.wgsl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coord {
    HalfPixel = 0,
    Asymmetric = 1,
    AlignCorners = 2,
    PytorchHalfPixel = 3,
    TfCropAndResize = 4,
    TfHalfPixelForNn = 5,
    HalfPixelSymmetric = 6,
}

/// Nearest rounding, numbered as in `resize.wgsl` (`Simple`: opset < 11 behaviour).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nearest {
    RoundPreferFloor = 0,
    RoundPreferCeil = 1,
    Floor = 2,
    Ceil = 3,
    Simple = 4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Stretch,
    NotLarger,
    NotSmaller,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Resize {
    name: &'static str,
    mode: Mode,
    coord: Coord,
    nearest: Nearest,
    cubic_a: f32,
    exclude_outside: bool,
    extrapolation: f32,
    axes: Option<Vec<i64>>,
    policy: Policy,
    /// Input layout: `true` for X, scales (Resize-10, Upsample-9); Upsample-7 takes attributes.
    scales_only: bool,
    scales_attr: Option<Vec<f32>>,
}

fn parse_mode(op: &str, m: &str) -> Result<Mode> {
    match m {
        "nearest" => Ok(Mode::Nearest),
        "linear" | "bilinear" => Ok(Mode::Linear),
        "cubic" if op == "Resize" => Ok(Mode::Cubic),
        _ => Err(OpError::Invalid(format!("{op}: unknown mode `{m}`"))),
    }
}

/// Resize: validates the mode strings; `antialias` = 1 is `Unsupported`.
pub fn resize(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let mode = parse_mode("Resize", &attrs.string("mode", "nearest")?)?;
    if attrs.int("antialias", 0)? != 0 {
        return Err(OpError::Unsupported("Resize: antialias = 1".into()));
    }
    let old = attrs.opset < 11;
    let coord = match attrs
        .string("coordinate_transformation_mode", "half_pixel")?
        .as_str()
    {
        _ if old => Coord::Asymmetric,
        "half_pixel" => Coord::HalfPixel,
        "asymmetric" => Coord::Asymmetric,
        "align_corners" => Coord::AlignCorners,
        "pytorch_half_pixel" => Coord::PytorchHalfPixel,
        "tf_crop_and_resize" => Coord::TfCropAndResize,
        "tf_half_pixel_for_nn" => Coord::TfHalfPixelForNn,
        "half_pixel_symmetric" => Coord::HalfPixelSymmetric,
        m => {
            return Err(OpError::Invalid(format!(
                "Resize: unknown coordinate_transformation_mode `{m}`"
            )))
        }
    };
    let nearest = match attrs.string("nearest_mode", "round_prefer_floor")?.as_str() {
        _ if old => Nearest::Simple,
        "round_prefer_floor" => Nearest::RoundPreferFloor,
        "round_prefer_ceil" => Nearest::RoundPreferCeil,
        "floor" => Nearest::Floor,
        "ceil" => Nearest::Ceil,
        m => {
            return Err(OpError::Invalid(format!(
                "Resize: unknown nearest_mode `{m}`"
            )))
        }
    };
    let policy = match attrs
        .string("keep_aspect_ratio_policy", "stretch")?
        .as_str()
    {
        "stretch" => Policy::Stretch,
        "not_larger" => Policy::NotLarger,
        "not_smaller" => Policy::NotSmaller,
        m => {
            return Err(OpError::Invalid(format!(
                "Resize: unknown keep_aspect_ratio_policy `{m}`"
            )))
        }
    };
    Ok(Box::new(Resize {
        name: "Resize",
        mode,
        coord,
        nearest,
        cubic_a: attrs.float("cubic_coeff_a", -0.75)?,
        exclude_outside: attrs.int("exclude_outside", 0)? != 0,
        extrapolation: attrs.float("extrapolation_value", 0.0)?,
        axes: attrs.ints_opt("axes")?,
        policy,
        scales_only: old,
        scales_attr: None,
    }))
}

/// Upsample: `scales` attribute (opset 7) or input 1 (opset 9); asymmetric coordinates.
pub fn upsample(attrs: &Attrs) -> Result<Box<dyn Op>> {
    let scales_attr = if attrs.opset < 9 {
        Some(attrs.floats_opt("scales")?.ok_or_else(|| {
            OpError::Invalid("Upsample (opset < 9): attribute `scales` is required".into())
        })?)
    } else {
        None
    };
    Ok(Box::new(Resize {
        name: "Upsample",
        mode: parse_mode("Upsample", &attrs.string("mode", "nearest")?)?,
        coord: Coord::Asymmetric,
        nearest: Nearest::Simple,
        cubic_a: -0.75,
        exclude_outside: false,
        extrapolation: 0.0,
        axes: None,
        policy: Policy::Stretch,
        scales_only: true,
        scales_attr,
    }))
}

/// What Resize does to each axis: output size, scale and (tf_crop_and_resize) roi.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    out: Vec<usize>,
    scale: Vec<f64>,
    roi_start: Vec<f64>,
    roi_end: Vec<f64>,
}

/// Up to 4 (input offset, weight) taps of one output coordinate on one axis; `None` when it
/// falls outside the roi (tf_crop_and_resize writes the extrapolation value).
type Taps = Option<([(usize, f32); 4], usize)>;

impl Resize {
    fn plan(&self, ins: &[&TensorMeta]) -> Result<Plan> {
        let op = self.name;
        let shape = &ins[0].shape;
        let r = shape.len();
        let floats = |i: usize, name: &str| -> Result<Option<Vec<f64>>> {
            if absent(ins, i) || ins[i].numel() == 0 {
                return Ok(None);
            }
            Ok(Some(plan_value(op, name, ins[i])?.to_f64_vec()))
        };
        let (roi, scales, sizes) = if self.scales_only {
            let s = match &self.scales_attr {
                Some(s) => s.iter().map(|&v| v as f64).collect(),
                None => floats(1, "scales")?
                    .ok_or_else(|| OpError::Invalid(format!("{op}: input `scales` is missing")))?,
            };
            (None, Some(s), None)
        } else {
            let sizes = if absent(ins, 3) || ins[3].numel() == 0 {
                None
            } else {
                Some(plan_value(op, "sizes", ins[3])?.to_i64_vec())
            };
            (floats(1, "roi")?, floats(2, "scales")?, sizes)
        };
        let axes: Vec<usize> = match &self.axes {
            Some(a) => a
                .iter()
                .map(|&a| normalize_axis(a, r))
                .collect::<Result<_>>()?,
            None => (0..r).collect(),
        };
        let n = axes.len();
        let mut out = shape.clone();
        let mut scale = vec![1.0; r];
        match (scales, sizes) {
            (Some(s), None) => {
                if s.len() != n || s.iter().any(|&v| !(v > 0.0 && v.is_finite())) {
                    return Err(OpError::Invalid(format!(
                        "{op}: scales {s:?} must be {n} positive values"
                    )));
                }
                for (i, &a) in axes.iter().enumerate() {
                    scale[a] = s[i];
                    out[a] = (s[i] * shape[a] as f64).floor() as usize;
                }
            }
            (None, Some(z)) => {
                if z.len() != n || z.iter().any(|&v| v < 0) {
                    return Err(OpError::Invalid(format!(
                        "{op}: sizes {z:?} must be {n} non-negative values"
                    )));
                }
                let ratio = |i: usize| z[i] as f64 / shape[axes[i]] as f64;
                let pick = match self.policy {
                    Policy::Stretch => None,
                    Policy::NotLarger => Some((0..n).map(ratio).fold(f64::INFINITY, f64::min)),
                    Policy::NotSmaller => Some((0..n).map(ratio).fold(0.0, f64::max)),
                };
                for (i, &a) in axes.iter().enumerate() {
                    match pick {
                        None => {
                            out[a] = z[i] as usize;
                            scale[a] = ratio(i);
                        }
                        Some(s) => {
                            scale[a] = s;
                            out[a] = (s * shape[a] as f64 + 0.5) as usize;
                        }
                    }
                }
            }
            _ => {
                return Err(OpError::Invalid(format!(
                    "{op}: exactly one of `scales` and `sizes` must be given"
                )))
            }
        }
        if let Some(a) = (0..r).find(|&a| shape[a] == 0 && out[a] > 0) {
            return Err(OpError::Invalid(format!(
                "{op}: axis {a} is empty and cannot be resized to {}",
                out[a]
            )));
        }
        let mut roi_start = vec![0.0; r];
        let mut roi_end = vec![1.0; r];
        if let (Some(roi), Coord::TfCropAndResize) = (roi, self.coord) {
            if roi.len() != 2 * n {
                return Err(OpError::Invalid(format!(
                    "{op}: roi has {} values for {n} axes",
                    roi.len()
                )));
            }
            for (i, &a) in axes.iter().enumerate() {
                roi_start[a] = roi[i];
                roi_end[a] = roi[n + i];
            }
        }
        Ok(Plan {
            out,
            scale,
            roi_start,
            roi_end,
        })
    }

    /// The input coordinate of output coordinate `c` on axis `d` (mirrors `resize.wgsl`).
    fn original(&self, p: &Plan, d: usize, in_len: usize, c: usize) -> f64 {
        let (x, s, n) = (c as f64, p.scale[d], in_len as f64);
        let out_len = s * n;
        match self.coord {
            Coord::HalfPixel => (x + 0.5) / s - 0.5,
            Coord::Asymmetric => x / s,
            Coord::AlignCorners if out_len == 1.0 => 0.0,
            Coord::AlignCorners => x * (n - 1.0) / (out_len - 1.0),
            Coord::PytorchHalfPixel if out_len == 1.0 => -0.5,
            Coord::PytorchHalfPixel => (x + 0.5) / s - 0.5,
            Coord::TfCropAndResize => {
                let (r0, r1) = (p.roi_start[d], p.roi_end[d]);
                if out_len == 1.0 {
                    (r1 - r0) * (n - 1.0) / 2.0 + r0 * (n - 1.0)
                } else {
                    x * (r1 - r0) * (n - 1.0) / (out_len - 1.0) + r0 * (n - 1.0)
                }
            }
            Coord::TfHalfPixelForNn => (x + 0.5) / s,
            Coord::HalfPixelSymmetric => {
                let adjustment = p.out[d] as f64 / out_len;
                n / 2.0 * (1.0 - adjustment) + (x + 0.5) / s - 0.5
            }
        }
    }

    fn cubic(&self, t: f64) -> f64 {
        let a = self.cubic_a as f64;
        let x = t.abs();
        if x <= 1.0 {
            ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
        } else {
            0.0
        }
    }

    /// Taps of output coordinate `c` on axis `d`, offsets pre-multiplied by `stride`.
    fn taps(&self, p: &Plan, d: usize, in_len: usize, stride: usize, c: usize) -> Taps {
        let x = self.original(p, d, in_len, c);
        let last = in_len as i64 - 1;
        if self.coord == Coord::TfCropAndResize && (x < 0.0 || x > last as f64) {
            return None;
        }
        let at = |i: i64| i.clamp(0, last.max(0)) as usize * stride;
        let mut t = [(0usize, 0f32); 4];
        let f = x.floor();
        let r = x - f;
        let f = f as i64;
        match self.mode {
            Mode::Nearest => {
                let up = match self.nearest {
                    _ if r == 0.0 => false,
                    Nearest::RoundPreferFloor => r > 0.5,
                    Nearest::RoundPreferCeil => r >= 0.5,
                    Nearest::Floor => false,
                    Nearest::Ceil => true,
                    Nearest::Simple => p.scale[d] < 1.0,
                };
                t[0] = (at(f + up as i64), 1.0);
                Some((t, 1))
            }
            Mode::Linear => {
                let mut n = 0;
                for (j, w) in [(0, 1.0 - r), (1, r)] {
                    if w != 0.0 {
                        t[n] = (at(f + j), w as f32);
                        n += 1;
                    }
                }
                Some((t, n))
            }
            Mode::Cubic => {
                let mut n = 0;
                let mut sum = 0.0;
                let mut ws = [0.0; 4];
                for (j, w) in ws.iter_mut().enumerate() {
                    let i = f + j as i64 - 1;
                    *w = self.cubic(j as f64 - 1.0 - r);
                    if self.exclude_outside && (i < 0 || i > last) {
                        *w = 0.0;
                    }
                    sum += *w;
                }
                for (j, &w) in ws.iter().enumerate() {
                    if w != 0.0 {
                        let w = if self.exclude_outside && sum != 0.0 {
                            w / sum
                        } else {
                            w
                        };
                        t[n] = (at(f + j as i64 - 1), w as f32);
                        n += 1;
                    }
                }
                Some((t, n))
            }
        }
    }

    /// Split on the second-to-last output axis (one row = one output line), or axis 0.
    fn axis(out: &[usize]) -> Option<usize> {
        match out.len() {
            0 => None,
            1 => Some(0),
            r => Some(r - 2),
        }
    }
}

/// The CPU kernel over tap tables: `tables[d][c]` are the taps of output coordinate c on axis d.
struct Interp<'a> {
    out_dims: &'a [usize],
    tables: &'a [Vec<Taps>],
    start: usize,
    end: usize,
}

/// The (offset, weight) combinations of one line's outer axes ([`Interp::outer`]), in two
/// buffers kept from line to line rather than a new `Vec` per axis and line.
#[derive(Default)]
struct Combos {
    now: Vec<(usize, f32)>,
    next: Vec<(usize, f32)>,
}

impl Interp<'_> {
    /// The (offset, weight) combinations of the outer axes of the line at outer coordinates
    /// `coords` ([`Interp::line_coords`]), into `c.now`; false where the line lies outside the
    /// roi.
    fn outer(&self, coords: &[usize], c: &mut Combos) -> bool {
        c.now.clear();
        c.now.push((0, 1.0));
        for (d, &at) in coords.iter().enumerate().rev() {
            let Some((t, n)) = self.tables[d][at] else {
                return false;
            };
            c.next.clear();
            for &(o, w) in &c.now {
                for &(to, tw) in &t[..n] {
                    c.next.push((o + to, w * tw));
                }
            }
            std::mem::swap(&mut c.now, &mut c.next);
        }
        true
    }

    /// The outer coordinates (all axes but the last) of output line `line`.
    fn line_coords(&self, mut line: usize) -> Vec<usize> {
        let outer = &self.out_dims[..self.out_dims.len() - 1];
        let mut coords = vec![0; outer.len()];
        for (c, &d) in coords.iter_mut().zip(outer).rev() {
            *c = line % d;
            line /= d;
        }
        coords
    }

    /// Steps `coords` to the next line's, the last outer axis fastest: lines are walked
    /// without a division per line and axis (those divisions, and a new tap list per axis and
    /// line, were most of yolov8n's 2x nearest upsamplings: 0.2-0.3 ms each on 2 threads,
    /// onnxruntime 0.02-0.05; now 0.05-0.07).
    fn next_line(&self, coords: &mut [usize]) {
        let outer = &self.out_dims[..coords.len()];
        for (c, &d) in coords.iter_mut().zip(outer).rev() {
            *c += 1;
            if *c < d {
                return;
            }
            *c = 0;
        }
    }

    /// Nearest: the source offset of a line's first tap on each outer axis, summed; `None`
    /// where the line lies outside the roi.
    fn nearest_base(&self, coords: &[usize]) -> Option<usize> {
        let mut base = 0;
        for (table, &c) in self.tables.iter().zip(coords) {
            base += table[c].as_ref()?.0[0].0;
        }
        Some(base)
    }
}

impl Interp<'_> {
    /// Writes elements `start..end`: `value(taps)` from the combined (offset, weight) taps of
    /// each element, or `fill` outside the roi.
    fn walk<T: Elem>(&self, out: &mut [T], fill: T, value: impl Fn(&[(usize, f32)]) -> T + Sync) {
        let r = self.out_dims.len();
        if r == 0 {
            out[0] = value(&[(0, 1.0)]);
            return;
        }
        let n = self.out_dims[r - 1];
        let chunk = n * (4096 / n.max(1)).max(1);
        let last = &self.tables[r - 1];
        crate::parallel::for_each_chunk_mut(&mut out[self.start..self.end], chunk, |ci, block| {
            let mut combos = Combos::default();
            let mut taps = Vec::new();
            let mut j = self.start + ci * chunk;
            let mut coords = self.line_coords(j / n);
            let mut k = 0;
            while k < block.len() {
                let c0 = j % n;
                let len = (n - c0).min(block.len() - k);
                let inside = self.outer(&coords, &mut combos);
                for (t, o) in block[k..k + len].iter_mut().enumerate() {
                    *o = match &last[c0 + t] {
                        Some((lt, ln)) if inside => {
                            taps.clear();
                            for &(co, cw) in &combos.now {
                                for &(to, tw) in &lt[..*ln] {
                                    taps.push((co + to, cw * tw));
                                }
                            }
                            value(&taps)
                        }
                        _ => fill,
                    };
                }
                if c0 + len == n {
                    self.next_line(&mut coords);
                }
                k += len;
                j += len;
            }
        });
    }
}

impl SameTypeKernel for Interp<'_> {
    /// Nearest for any dtype; ins: data, extrapolation value (one element). Each element reads
    /// the first tap only (what `walk` would pass first), so no tap lists are built.
    fn run<T: Elem>(&self, ins: &[&[T]], out: &mut [T]) -> Result<()> {
        let (src, fill) = (ins[0], ins[1][0]);
        let r = self.out_dims.len();
        if r == 0 {
            self.walk(out, fill, |taps| src[taps[0].0]);
            return Ok(());
        }
        let n = self.out_dims[r - 1];
        let chunk = (n * (4096 / n.max(1)).max(1)).max(1);
        // The last axis's source offsets, `None` outside the roi: compact, read once per line.
        let cols: Vec<Option<usize>> = self.tables[r - 1]
            .iter()
            .map(|t| t.as_ref().map(|(lt, _)| lt[0].0))
            .collect();
        let repeat = repeat_factor(&cols);
        crate::parallel::for_each_chunk_mut(&mut out[self.start..self.end], chunk, |ci, block| {
            let (mut j, mut k) = (self.start + ci * chunk, 0);
            let mut coords = self.line_coords(j / n);
            // The source line of the last whole line written in this block: upsampling
            // along an outer axis repeats it, and a repeat is a copy.
            let mut prev: Option<Option<usize>> = None;
            while k < block.len() {
                let c0 = j % n;
                let len = (n - c0).min(block.len() - k);
                let base = self.nearest_base(&coords);
                if len == n && prev == Some(base) {
                    block.copy_within(k - n..k, k);
                } else {
                    let line = &mut block[k..k + len];
                    match (base, repeat) {
                        // Whole lines of an integer upsampling: each source value f times.
                        (Some(b), Some((first, f))) if len == n => {
                            repeat_each(line, &src[b + first..][..n.div_ceil(f)], f)
                        }
                        (Some(b), _) => {
                            for (o, c) in line.iter_mut().zip(&cols[c0..c0 + len]) {
                                *o = c.map_or(fill, |c| src[b + c]);
                            }
                        }
                        (None, _) => line.fill(fill),
                    }
                }
                prev = (len == n).then_some(base);
                if c0 + len == n {
                    self.next_line(&mut coords);
                }
                k += len;
                j += len;
            }
        });
        Ok(())
    }
}

/// `Some((first, f))` when source offsets `cols` are `first` repeated f times, then `first + 1`
/// f times, and so on (nearest upsampling by an integer factor f >= 2 along the last axis).
fn repeat_factor(cols: &[Option<usize>]) -> Option<(usize, usize)> {
    let first = (*cols.first()?)?;
    let f = cols.iter().take_while(|&&c| c == Some(first)).count();
    let all = cols
        .iter()
        .enumerate()
        .all(|(t, &c)| c == Some(first + t / f));
    (f >= 2 && all).then_some((first, f))
}

/// `line[t] = srow[t / f]`: each source value written f times (`line` may end mid-group).
fn repeat_each<T: Copy>(line: &mut [T], srow: &[T], f: usize) {
    if f == 2 {
        // Pairs as fixed-size stores, which the compiler turns into vector interleaves.
        let mut pairs = line.chunks_exact_mut(2);
        for (o, &v) in (&mut pairs).zip(srow) {
            o[0] = v;
            o[1] = v;
        }
        if let [last] = pairs.into_remainder() {
            *last = srow[srow.len() - 1];
        }
        return;
    }
    for (o, &v) in line.chunks_mut(f).zip(srow) {
        o.fill(v);
    }
}

/// Parameters of `resize.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct ResizeParams {
    in_dims: [u32; 8],
    out_dims: [u32; 8],
    in_stride: [u32; 8],
    scale: [f32; 8],
    roi_start: [f32; 8],
    roi_end: [f32; 8],
    start: u32,
    count: u32,
    cubic_a: f32,
    extrapolation: f32,
}

impl Op for Resize {
    fn name(&self) -> &'static str {
        self.name
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        if self.mode != Mode::Nearest && ins[0].dtype != DType::F32 {
            return Err(OpError::Unsupported(format!(
                "{}: {:?} interpolation of {} (f32 only)",
                self.name, self.mode, ins[0].dtype
            )));
        }
        Ok(vec![TensorMeta::new(ins[0].dtype, self.plan(ins)?.out)])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> crate::Work {
        let taps = match self.mode {
            Mode::Nearest => 1,
            Mode::Linear => 4,
            Mode::Cubic => 16,
        };
        crate::Work {
            flops: 2 * taps * outs[0].numel() as u64,
            bytes_read: ins[0].bytes(),
            bytes_written: outs[0].bytes(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        Self::axis(&outs[0].shape)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let metas = cpu_metas(ins);
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let p = self.plan(&refs)?;
        let (start, end) = row_elems(&p.out, Self::axis(&p.out), &rows);
        if start >= end {
            return Ok(());
        }
        let in_shape = &ins[0].shape;
        let st = strides(in_shape);
        let tables: Vec<Vec<Taps>> = (0..p.out.len())
            .map(|d| {
                (0..p.out[d])
                    .map(|c| self.taps(&p, d, in_shape[d], st[d], c))
                    .collect()
            })
            .collect();
        let fill = Tensor::new(
            vec![1],
            scalar_of(ins[0].dtype(), self.extrapolation as f64),
        );
        let k = Interp {
            out_dims: &p.out,
            tables: &tables,
            start,
            end,
        };
        if self.mode == Mode::Nearest {
            return with_same_type(
                self.name,
                &k,
                &[&ins[0].data, &fill.data],
                &mut outs[0].data,
            );
        }
        let (Some(src), Some(out)) = (ins[0].as_f32(), outs[0].as_f32_mut()) else {
            return Err(OpError::Unsupported(format!(
                "{}: {:?} interpolation of {} (f32 only)",
                self.name,
                self.mode,
                ins[0].dtype()
            )));
        };
        k.walk(out, self.extrapolation, |taps| {
            taps.iter().map(|&(o, w)| w * src[o]).sum()
        });
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        check_gpu_size(self.name, &[ins[0], &outs[0]])?;
        let p = self.plan(ins)?;
        let (start, end) = row_elems(&p.out, Self::axis(&p.out), &rows);
        if start >= end {
            return Ok(vec![]);
        }
        let op = self.name;
        let u = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<_>>();
        let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
        let params = ResizeParams {
            in_dims: pack8(op, &u(&ins[0].shape))?,
            out_dims: pack8(op, &u(&p.out))?,
            in_stride: pack8(op, &u(&strides(&ins[0].shape)))?,
            scale: pack8(op, &f(&p.scale))?,
            roi_start: pack8(op, &f(&p.roi_start))?,
            roi_end: pack8(op, &f(&p.roi_end))?,
            start: start as u32,
            count: (end - start) as u32,
            cubic_a: self.cubic_a,
            extrapolation: self.extrapolation,
        };
        Ok(vec![GpuKernel::new(
            tandem_shaders::RESIZE,
            vec![0],
            vec![0],
            &params,
            grid_1d((end - start) as u64, 64),
        )
        .with_override("WG", 64.0)
        .with_override("RANK", p.out.len() as f64)
        .with_override("MODE", self.mode as u32 as f64)
        .with_override("COORD_MODE", self.coord as u32 as f64)
        .with_override("NEAREST_MODE", self.nearest as u32 as f64)
        .with_override(
            "EXCLUDE_OUTSIDE",
            self.exclude_outside as u32 as f64,
        )])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AttrValue;

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
        // two halves, to exercise row ranges
        op.cpu(&t, &mut out, 0..rows / 2).unwrap();
        op.cpu(&t, &mut out, rows / 2..rows).unwrap();
        out.remove(0)
    }

    fn close(got: &Tensor, want: &[f32]) {
        let g = got.as_f32().unwrap();
        assert_eq!(g.len(), want.len(), "{got:?}");
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-4, "{g:?} vs {want:?}");
        }
    }

    fn empty() -> Tensor {
        Tensor::f32(&[0], vec![])
    }

    fn x22() -> Tensor {
        Tensor::f32(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0])
    }

    #[test]
    fn nearest_integer_upsampling_matches_the_floor_formula() {
        // asymmetric + floor (ppocr's FPN): out[.., i, j] = x[.., i / sh, j / sw]. Factors
        // along the last axis 1 to 4 (repeated source values, then whole repeated lines),
        // along the rows 1 to 3, and a 1.5 along the last axis (no repeat pattern). 40
        // channels, so the output spans many parallel blocks, most starting mid-plane.
        let attrs = Attrs::new(13)
            .with(
                "coordinate_transformation_mode",
                AttrValue::String("asymmetric".into()),
            )
            .with("nearest_mode", AttrValue::String("floor".into()));
        let near = resize(&attrs).unwrap();
        let (ch, h, w) = (40, 5, 7);
        let x: Vec<f32> = (0..2 * ch * h * w).map(|i| i as f32 * 0.5 - 3.0).collect();
        for (sh, sw) in [
            (2.0f32, 2.0f32),
            (1.0, 3.0),
            (3.0, 4.0),
            (2.0, 1.0),
            (1.0, 1.5),
        ] {
            let xt = Tensor::f32(&[2, ch, h, w], x.clone());
            let scales = Tensor::f32(&[4], vec![1.0, 1.0, sh, sw]);
            let y = run(&*near, &[xt, empty(), scales]);
            let (oh, ow) = ((h as f32 * sh) as usize, (w as f32 * sw) as usize);
            assert_eq!(y.shape, vec![2, ch, oh, ow]);
            let mut want = Vec::new();
            for p in 0..2 * ch {
                for i in 0..oh {
                    for j in 0..ow {
                        let (si, sj) = ((i as f32 / sh) as usize, (j as f32 / sw) as usize);
                        want.push(x[(p * h + si) * w + sj]);
                    }
                }
            }
            assert_eq!(y.as_f32().unwrap(), &want[..], "scales {sh} x {sw}");
        }
    }

    #[test]
    fn linear_upsampling_over_many_blocks_matches_the_bilinear_formula() {
        // asymmetric: source coordinate out / scale, clamped at the last pixel. 40 channels of
        // 5 x 7 to 10 x 21, so the walk's parallel blocks start mid-plane.
        let attrs = Attrs::new(13)
            .with("mode", AttrValue::String("linear".into()))
            .with(
                "coordinate_transformation_mode",
                AttrValue::String("asymmetric".into()),
            );
        let op = resize(&attrs).unwrap();
        let (ch, h, w, sh, sw) = (40, 5, 7, 2usize, 3usize);
        let x: Vec<f32> = (0..ch * h * w)
            .map(|i| ((i * 7) % 23) as f32 - 11.0)
            .collect();
        let scales = Tensor::f32(&[4], vec![1.0, 1.0, sh as f32, sw as f32]);
        let y = run(
            &*op,
            &[Tensor::f32(&[1, ch, h, w], x.clone()), empty(), scales],
        );
        let (oh, ow) = (h * sh, w * sw);
        assert_eq!(y.shape, vec![1, ch, oh, ow]);
        let tap = |o: usize, s: usize, n: usize| {
            let at = o as f64 / s as f64;
            let lo = at.floor() as usize;
            (lo.min(n - 1), (lo + 1).min(n - 1), at - lo as f64)
        };
        let mut want = Vec::new();
        for p in 0..ch {
            for i in 0..oh {
                let (i0, i1, a) = tap(i, sh, h);
                for j in 0..ow {
                    let (j0, j1, b) = tap(j, sw, w);
                    let v = |r: usize, c: usize| x[(p * h + r) * w + c] as f64;
                    let top = v(i0, j0) * (1.0 - b) + v(i0, j1) * b;
                    let bottom = v(i1, j0) * (1.0 - b) + v(i1, j1) * b;
                    want.push((top * (1.0 - a) + bottom * a) as f32);
                }
            }
        }
        close(&y, &want);
    }

    #[test]
    fn repeats_are_found_only_where_every_offset_follows_them() {
        let some = |v: &[usize]| v.iter().map(|&c| Some(c)).collect::<Vec<_>>();
        assert_eq!(repeat_factor(&some(&[3, 3, 4, 4, 5])), Some((3, 2)));
        assert_eq!(repeat_factor(&some(&[0, 0, 0, 1, 1, 1])), Some((0, 3)));
        assert_eq!(repeat_factor(&some(&[0, 1, 2])), None);
        assert_eq!(repeat_factor(&some(&[0, 0, 1, 2])), None);
        assert_eq!(repeat_factor(&[Some(0), Some(0), None]), None);
        let mut line = [0; 7];
        repeat_each(&mut line, &[1, 2, 3, 4], 2);
        assert_eq!(line, [1, 1, 2, 2, 3, 3, 4]);
        let mut line = [0; 8];
        repeat_each(&mut line, &[1, 2, 3], 3);
        assert_eq!(line, [1, 1, 1, 2, 2, 2, 3, 3]);
    }

    #[test]
    fn nearest_and_linear_match_the_onnx_examples() {
        let near = resize(&Attrs::new(13)).unwrap();
        let y = run(
            &*near,
            &[x22(), empty(), Tensor::f32(&[4], vec![1.0, 1.0, 2.0, 3.0])],
        );
        let top = [1.0, 1.0, 1.0, 2.0, 2.0, 2.0];
        let bot = [3.0, 3.0, 3.0, 4.0, 4.0, 4.0];
        close(&y, &[top, top, bot, bot].concat());
        let up = upsample(&Attrs::new(9)).unwrap();
        let y = run(&*up, &[x22(), Tensor::f32(&[4], vec![1.0, 1.0, 2.0, 3.0])]);
        close(&y, &[top, top, bot, bot].concat());

        let lin = resize(&Attrs::new(13).with("mode", AttrValue::String("linear".into()))).unwrap();
        let y = run(
            &*lin,
            &[x22(), empty(), Tensor::f32(&[4], vec![1.0, 1.0, 2.0, 2.0])],
        );
        #[rustfmt::skip]
        close(&y, &[1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0]);
        let x24 = Tensor::f32(&[1, 1, 2, 4], (1..=8).map(|v| v as f32).collect());
        let y = run(
            &*lin,
            &[x24, empty(), Tensor::f32(&[4], vec![1.0, 1.0, 0.6, 0.6])],
        );
        close(&y, &[2.6666665, 4.333_333]);
        let ac = resize(
            &Attrs::new(13)
                .with("mode", AttrValue::String("linear".into()))
                .with(
                    "coordinate_transformation_mode",
                    AttrValue::String("align_corners".into()),
                ),
        )
        .unwrap();
        let y = run(
            &*ac,
            &[x22(), empty(), Tensor::f32(&[4], vec![1.0, 1.0, 2.0, 2.0])],
        );
        let t = 1.0 / 3.0;
        #[rustfmt::skip]
        close(&y, &[1.0, 1.0 + t, 1.0 + 2.0 * t, 2.0, 1.0 + 2.0 * t, 2.0, 2.0 + t, 2.0 + 2.0 * t,
            2.0 + t, 2.0 + 2.0 * t, 3.0, 3.0 + t, 3.0, 3.0 + t, 3.0 + 2.0 * t, 4.0]);
    }

    #[test]
    fn tf_crop_and_resize_and_keep_aspect_ratio() {
        let op = resize(
            &Attrs::new(13)
                .with("mode", AttrValue::String("linear".into()))
                .with(
                    "coordinate_transformation_mode",
                    AttrValue::String("tf_crop_and_resize".into()),
                ),
        )
        .unwrap();
        let x = Tensor::f32(&[1, 1, 4, 4], (1..=16).map(|v| v as f32).collect());
        let roi = Tensor::f32(&[8], vec![0.0, 0.0, 0.4, 0.6, 1.0, 1.0, 0.6, 0.8]);
        let y = run(
            &*op,
            &[x, roi, empty(), Tensor::i64(&[4], vec![1, 1, 3, 3])],
        );
        close(&y, &[7.6, 7.9, 8.2, 8.8, 9.1, 9.4, 10.0, 10.3, 10.6]);
        let keep = resize(
            &Attrs::new(18)
                .with("axes", AttrValue::Ints(vec![2, 3]))
                .with(
                    "keep_aspect_ratio_policy",
                    AttrValue::String("not_larger".into()),
                ),
        )
        .unwrap();
        let y = run(
            &*keep,
            &[x22(), empty(), empty(), Tensor::i64(&[2], vec![7, 8])],
        );
        assert_eq!(y.shape, vec![1, 1, 7, 7]);
        let not_const = [
            x22().meta(),
            empty().meta(),
            TensorMeta::new(DType::F32, vec![4]),
        ];
        let refs: Vec<&TensorMeta> = not_const.iter().collect();
        assert!(matches!(keep.infer(&refs), Err(OpError::Unsupported(_))));
    }

    /// Naive 1-D cubic from the spec's definition: the 4 nearest input indices of x (ties to
    /// the smaller), edge-padded, weighted by the Keys kernel of their distance.
    fn naive_cubic(x: &[f32], scale: f64, a: f64, exclude: bool) -> Vec<f32> {
        let n = x.len() as i64;
        let out = (scale * n as f64).floor() as usize;
        let keys = |d: f64| {
            let d = d.abs();
            if d <= 1.0 {
                (a + 2.0) * d * d * d - (a + 3.0) * d * d + 1.0
            } else if d < 2.0 {
                a * d * d * d - 5.0 * a * d * d + 8.0 * a * d - 4.0 * a
            } else {
                0.0
            }
        };
        (0..out)
            .map(|o| {
                let xo = (o as f64 + 0.5) / scale - 0.5;
                let mut idx: Vec<i64> = (-10..n + 10).collect();
                idx.sort_by(|p, q| {
                    ((*p as f64 - xo).abs(), *p)
                        .partial_cmp(&((*q as f64 - xo).abs(), *q))
                        .unwrap()
                });
                idx.truncate(4);
                let mut w: Vec<f64> = idx.iter().map(|&i| keys(i as f64 - xo)).collect();
                if exclude {
                    for (wi, &i) in w.iter_mut().zip(&idx) {
                        if i < 0 || i >= n {
                            *wi = 0.0;
                        }
                    }
                    let s: f64 = w.iter().sum();
                    w.iter_mut().for_each(|v| *v /= s);
                }
                idx.iter()
                    .zip(&w)
                    .map(|(&i, &wi)| wi * x[i.clamp(0, n - 1) as usize] as f64)
                    .sum::<f64>() as f32
            })
            .collect()
    }

    #[test]
    fn cubic_matches_naive_keys_kernel() {
        let x: Vec<f32> = vec![1.0, 4.0, 2.0, 8.0, 3.0];
        for (scale, exclude) in [(2.0, false), (1.6, true), (0.6, false)] {
            let op = resize(
                &Attrs::new(13)
                    .with("mode", AttrValue::String("cubic".into()))
                    .with("exclude_outside", AttrValue::Int(exclude as i64))
                    .with("cubic_coeff_a", AttrValue::Float(-0.5)),
            )
            .unwrap();
            let y = run(
                &*op,
                &[
                    Tensor::f32(&[1, 5], x.clone()),
                    empty(),
                    Tensor::f32(&[2], vec![1.0, scale as f32]),
                ],
            );
            close(&y, &naive_cubic(&x, scale as f32 as f64, -0.5, exclude));
        }
    }
}
