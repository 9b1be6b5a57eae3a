//! Pooling: MaxPool (with its optional Indices output), AveragePool, GlobalAveragePool and
//! GlobalMaxPool, over 1, 2 or 3 spatial dimensions of an `[N, C, D1...]` input.
//!
//! Sits between the operator contract (`op.rs`) and `pool.wgsl` (the global pools are
//! reductions and run `reduce.wgsl` through [`crate::reduce`]). Output sizes follow the ONNX
//! reference: explicit pads with floor or ceil (a last window must start inside the input or its
//! begin padding), or `auto_pad` SAME_UPPER / SAME_LOWER / VALID. Every output element is
//! independent; rows are cut on output axis `rank - 2` (the output row for 2-D pooling).

use crate::phase_planes::{combine, max_nan};
use crate::reduce::{fold_runs_f32, global_pool, ReduceKind};
use crate::shape::{self, grid_1d};
use crate::{Attrs, DType, Data, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// MaxPool or AveragePool.
#[derive(Debug)]
struct Pool {
    name: &'static str,
    max: bool,
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    /// `[begin..., end...]`.
    pads: Vec<usize>,
    auto_pad: AutoPad,
    ceil_mode: bool,
    count_include_pad: bool,
    /// MaxPool Indices: column-major spatial index when true.
    column_major: bool,
}

/// The pooling geometry of one input, spatial dims padded to 3 in front.
#[derive(Debug, Clone, Copy)]
struct Geo {
    nc: usize,
    ind: [usize; 3],
    outd: [usize; 3],
    k: [usize; 3],
    s: [usize; 3],
    d: [usize; 3],
    pb: [usize; 3],
    /// End padding: windows may overhang it in ceil mode, and only positions before
    /// `input + pe` count for `count_include_pad`.
    pe: [usize; 3],
}

fn ints(a: &Attrs, name: &str, op: &str, len: usize, default: usize) -> Result<Vec<usize>> {
    match a.ints_opt(name)? {
        None => Ok(vec![default; len]),
        Some(v) if v.len() == len && v.iter().all(|&x| x >= 0) => {
            Ok(v.iter().map(|&x| x as usize).collect())
        }
        Some(v) => Err(OpError::Invalid(format!(
            "{op}: attribute `{name}` {v:?} must hold {len} non-negative values"
        ))),
    }
}

fn make(a: &Attrs, name: &'static str, max: bool) -> Result<Box<dyn Op>> {
    let kernel = match a.ints_opt("kernel_shape")? {
        Some(k) if !k.is_empty() && k.len() <= 3 && k.iter().all(|&v| v >= 1) => {
            k.iter().map(|&v| v as usize).collect::<Vec<_>>()
        }
        Some(k) => {
            return Err(OpError::Invalid(format!(
                "{name}: kernel_shape {k:?} must have 1 to 3 positive values"
            )))
        }
        None => {
            return Err(OpError::Invalid(format!(
                "{name}: attribute `kernel_shape` is required"
            )))
        }
    };
    let n = kernel.len();
    let strides = ints(a, "strides", name, n, 1)?;
    let dilations = ints(a, "dilations", name, n, 1)?;
    if strides.contains(&0) || dilations.contains(&0) {
        return Err(OpError::Invalid(format!(
            "{name}: strides and dilations must be >= 1"
        )));
    }
    let auto_pad = match a.string("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        other => {
            return Err(OpError::Invalid(format!(
                "{name}: unknown auto_pad `{other}`"
            )))
        }
    };
    let storage_order = a.int("storage_order", 0)?;
    if !(0..=1).contains(&storage_order) {
        return Err(OpError::Invalid(format!(
            "{name}: storage_order must be 0 or 1"
        )));
    }
    let pads = ints(a, "pads", name, 2 * n, 0)?;
    // A window made of padding only has no input: pads must be smaller than the (dilated) kernel.
    let span = |a: usize| {
        (kernel[a] - 1)
            .saturating_mul(dilations[a])
            .saturating_add(1)
    };
    // Window arithmetic (positions, SAME pads) stays in isize.
    if let Some(a) = (0..n).find(|&a| span(a) > isize::MAX as usize) {
        return Err(OpError::Invalid(format!(
            "{name}: dilated kernel of dim {a} ({} x dilation {}) exceeds 2^63",
            kernel[a], dilations[a]
        )));
    }
    if let Some(i) = (0..2 * n).find(|&i| pads[i] >= span(i % n)) {
        return Err(OpError::Invalid(format!(
            "{name}: pads {pads:?}: pad {} must be smaller than the dilated kernel ({})",
            pads[i],
            span(i % n)
        )));
    }
    Ok(Box::new(Pool {
        name,
        max,
        pads,
        kernel,
        strides,
        dilations,
        auto_pad,
        ceil_mode: a.int("ceil_mode", 0)? != 0,
        count_include_pad: a.int("count_include_pad", 0)? != 0,
        column_major: storage_order == 1,
    }))
}

/// MaxPool (kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, storage_order). The
/// optional Indices output (flat input indices, i64) is computed on the CPU only.
pub fn max_pool(a: &Attrs) -> Result<Box<dyn Op>> {
    make(a, "MaxPool", true)
}

/// AveragePool (kernel_shape, strides, pads, dilations, ceil_mode, auto_pad, count_include_pad).
pub fn average_pool(a: &Attrs) -> Result<Box<dyn Op>> {
    make(a, "AveragePool", false)
}

/// GlobalAveragePool: the mean over every spatial axis, keeping them as size 1.
pub fn global_average_pool(_: &Attrs) -> Result<Box<dyn Op>> {
    Ok(global_pool("GlobalAveragePool", ReduceKind::Mean))
}

/// GlobalMaxPool: the maximum over every spatial axis, keeping them as size 1.
pub fn global_max_pool(_: &Attrs) -> Result<Box<dyn Op>> {
    Ok(global_pool("GlobalMaxPool", ReduceKind::Max))
}

impl Pool {
    fn geometry(&self, shape: &[usize]) -> Result<Geo> {
        let n = self.kernel.len();
        if shape.len() != n + 2 {
            return Err(OpError::Invalid(format!(
                "{}: input rank {} does not match kernel_shape of {n} spatial dims",
                self.name,
                shape.len()
            )));
        }
        let off = 3 - n;
        let mut g = Geo {
            nc: shape[0] * shape[1],
            ind: [1; 3],
            outd: [1; 3],
            k: [1; 3],
            s: [1; 3],
            d: [1; 3],
            pb: [0; 3],
            pe: [0; 3],
        };
        for i in 0..n {
            let (x, k, s, d) = (
                shape[2 + i],
                self.kernel[i],
                self.strides[i],
                self.dilations[i],
            );
            let window = (k - 1) * d + 1;
            let (out, pb, pe) = match self.auto_pad {
                AutoPad::NotSet => {
                    let (pb, pe) = (self.pads[i], self.pads[n + i]);
                    let span = x.saturating_add(pb).saturating_add(pe);
                    if span > isize::MAX as usize {
                        return Err(OpError::Invalid(format!(
                            "{}: spatial dim {i} ({x}) with pads {pb}+{pe} exceeds 2^63",
                            self.name
                        )));
                    }
                    if span < window {
                        return Err(OpError::Invalid(format!(
                            "{}: spatial dim {i} ({x} + pads {pb}+{pe}) is smaller than the window {window}",
                            self.name
                        )));
                    }
                    let mut out = if self.ceil_mode {
                        (span - window).div_ceil(s) + 1
                    } else {
                        (span - window) / s + 1
                    };
                    if self.ceil_mode && (out - 1) * s >= x + pb {
                        out -= 1;
                    }
                    (out, pb, pe)
                }
                AutoPad::Valid => {
                    if x < window {
                        return Err(OpError::Invalid(format!(
                            "{}: spatial dim {i} ({x}) is smaller than the window {window}",
                            self.name
                        )));
                    }
                    ((x - window) / s + 1, 0, 0)
                }
                AutoPad::SameUpper | AutoPad::SameLower => {
                    let out = x.div_ceil(s);
                    let total = ((out.max(1) - 1) * s + window).saturating_sub(x);
                    let pb = if self.auto_pad == AutoPad::SameUpper {
                        total / 2
                    } else {
                        total - total / 2
                    };
                    (out, pb, total - pb)
                }
            };
            g.ind[off + i] = x;
            g.outd[off + i] = out;
            g.k[off + i] = k;
            g.s[off + i] = s;
            g.d[off + i] = d;
            g.pb[off + i] = pb;
            g.pe[off + i] = pe;
        }
        Ok(g)
    }

    fn out_shape(&self, shape: &[usize], g: &Geo) -> Vec<usize> {
        let n = self.kernel.len();
        let mut out = shape[..2].to_vec();
        out.extend_from_slice(&g.outd[3 - n..]);
        out
    }

    /// Output element `e` (flat over `[N*C, O0, O1, O2]`): the pooled value and, for MaxPool, the
    /// spatial index `(d, h, w)` of the maximum (`None` when the window holds no input).
    fn element(&self, x: &[f32], g: &Geo, e: usize) -> (f32, Option<[usize; 3]>) {
        let o2 = e % g.outd[2];
        let o1 = e / g.outd[2] % g.outd[1];
        let o0 = e / (g.outd[2] * g.outd[1]) % g.outd[0];
        let nc = e / (g.outd[2] * g.outd[1] * g.outd[0]);
        let plane = &x[nc * g.ind[0] * g.ind[1] * g.ind[2]..][..g.ind[0] * g.ind[1] * g.ind[2]];
        let start = |o: usize, a: usize| (o * g.s[a]) as isize - g.pb[a] as isize;
        let (s0, s1, s2) = (start(o0, 0), start(o1, 1), start(o2, 2));
        let mut best = f32::MIN;
        let mut at = None;
        let mut sum = 0.0f32;
        let mut count = 0usize;
        for i0 in positions(g, s0, 0) {
            for i1 in positions(g, s1, 1) {
                let row = &plane[(i0 * g.ind[1] + i1) * g.ind[2]..][..g.ind[2]];
                for i2 in positions(g, s2, 2) {
                    let v = row[i2];
                    if self.max {
                        // NaN propagates: the first NaN of the window wins.
                        if at.is_none() || ((v > best || v.is_nan()) && !best.is_nan()) {
                            best = v;
                            at = Some([i0, i1, i2]);
                        }
                    } else {
                        sum += v;
                        count += 1;
                    }
                }
            }
        }
        if self.max {
            (best, at)
        } else if self.count_include_pad {
            // Window positions inside the input or its explicit padding (not the ceil overhang).
            let count = inside(g, s0, 0) * inside(g, s1, 1) * inside(g, s2, 2);
            (sum / count as f32, None)
        } else {
            (sum / count as f32, None)
        }
    }

    /// Output elements `start..start + y.len()` (and their Indices) from an f32 input.
    fn pool_f32(
        &self,
        x: &[f32],
        g: &Geo,
        y: &mut [f32],
        start: usize,
        indices: Option<&mut [i64]>,
    ) {
        let ch = y
            .len()
            .div_ceil(4 * rayon::current_num_threads())
            .clamp(1, 4096);
        let plane = g.outd[0] * g.outd[1] * g.outd[2];
        match indices {
            None if g.whole_plane(!self.max && self.count_include_pad) => {
                let kind = if self.max {
                    ReduceKind::Max
                } else {
                    ReduceKind::Mean
                };
                fold_runs_f32(kind, x, g.ind.iter().product(), y, start)
            }
            None if self.plane_fits(g) => self.pool_planes_f32(x, g, y, start / g.outd[2].max(1)),
            None => self.pool_rows_f32(x, g, y, start),
            Some(idx) => {
                let one = |(ci, (chunk, ichunk)): (usize, (&mut [f32], &mut [i64]))| {
                    for (k, (y, i)) in chunk.iter_mut().zip(ichunk).enumerate() {
                        let e = start + ci * ch + k;
                        let (v, at) = self.element(x, g, e);
                        *y = v;
                        *i = at.map_or(-1, |at| self.index(g, e / plane, at));
                    }
                };
                // The pairs of pieces as items: the parallel helper serves both outputs (and
                // serial mode) without a second copy of the chain.
                let pieces: Vec<_> = y
                    .chunks_mut(ch)
                    .zip(idx.chunks_mut(ch))
                    .enumerate()
                    .collect();
                crate::parallel::for_each_item(pieces, one);
            }
        }
    }

    /// Output rows (`outd[2]` elements each, the first at flat element `start`, a row start)
    /// without Indices, rows in parallel (see [`Pool::pool_row`]).
    fn pool_rows_f32(&self, x: &[f32], g: &Geo, y: &mut [f32], start: usize) {
        let w = g.outd[2];
        if w == 0 || y.is_empty() {
            return;
        }
        let rows_per = (y.len() / w)
            .div_ceil(4 * rayon::current_num_threads())
            .max(1);
        crate::parallel::for_each_chunk_mut(y, rows_per * w, |ci, chunk| {
            let mut scratch = self.scratch(g);
            for (r, out) in chunk.chunks_mut(w).enumerate() {
                let row = start / w + ci * rows_per + r;
                self.pool_row(x, g, row, out, &mut scratch);
            }
        });
    }

    /// One output row, separably: the input rows of the window (along the outer axes) are
    /// folded into `t` (max, or sum in row order), then each output takes the max / sum of its
    /// window along the last axis of `t`. Windows wholly inside the input along the last axis
    /// (the interior) run one vectorised pass per kernel tap; the few border outputs clip their
    /// window. Every loop runs on the widest vectors the CPU has (`crate::simd`). Max is exact;
    /// an average sums in a different order than [`Pool::element`] (same value up to rounding).
    fn pool_row(&self, x: &[f32], g: &Geo, row: usize, out: &mut [f32], sc: &mut Scratch) {
        let w = out.len();
        let o1 = row % g.outd[1];
        let o0 = row / g.outd[1] % g.outd[0];
        let nc = row / (g.outd[1] * g.outd[0]);
        let plane_len = g.ind[0] * g.ind[1] * g.ind[2];
        let plane = &x[nc * plane_len..][..plane_len];
        let start = |o: usize, a: usize| (o * g.s[a]) as isize - g.pb[a] as isize;
        let (s0, s1) = (start(o0, 0), start(o1, 1));
        let rows = &mut sc.rows;
        rows.clear();
        rows.extend(
            positions(g, s0, 0)
                .flat_map(|i0| positions(g, s1, 1).map(move |i1| (i0 * g.ind[1] + i1) * g.ind[2])),
        );
        if rows.is_empty() {
            // Every window lies in the padding: the definition gives f32::MIN / NaN.
            for (o2, v) in out.iter_mut().enumerate() {
                *v = self.element(x, g, row * w + o2).0;
            }
            return;
        }
        let in2 = g.ind[2];
        let t = &mut sc.t[..in2 + 1];
        t[..in2].copy_from_slice(&plane[rows[0]..][..in2]);
        for &r in &rows[1..] {
            fold_row(&mut t[..in2], &plane[r..][..in2], self.max);
        }
        let (k2, s2, d2, pb2) = (g.k[2], g.s[2], g.d[2], g.pb[2]);
        let (lo, hi) = interior(g, w);
        let taps = |o2: usize| taps(g, o2);
        for o2 in (0..lo).chain(hi..w) {
            let mut it = taps(o2).map(|i| t[i]);
            out[o2] = match it.next() {
                None if self.max => f32::MIN,
                None => f32::NAN,
                Some(first) if self.max => it.fold(first, max_nan),
                Some(first) => it.fold(first, |a, v| a + v),
            };
        }
        if lo < hi {
            let acc = &mut out[lo..hi];
            let n = acc.len();
            let first = lo * s2 - pb2;
            // Strides 1 and 2 read whole chunks of s2 (an overrun of s2 - 1 <= 1); wider ones
            // only the n elements they use (a stride may be 2^63: no padding by s2).
            let len = if s2 <= 2 { n * s2 } else { (n - 1) * s2 + 1 };
            for k in 0..k2 {
                let src = &t[first + k * d2..][..len];
                window_tap(acc, src, s2, k == 0, self.max);
            }
        }
        if !self.max {
            let outer = if self.count_include_pad {
                // Positions inside the input or its explicit padding (not the ceil overhang).
                inside(g, s0, 0) * inside(g, s1, 1)
            } else {
                rows.len()
            };
            divide_counts(out, &sc.counts, outer as f32);
        }
    }

    /// Per-chunk scratch of [`Pool::pool_row`]; `counts[o2]`: window positions along the
    /// last axis that an average divides by (same for every row).
    fn scratch(&self, g: &Geo) -> Scratch {
        let w = g.outd[2];
        let (lo, hi) = interior(g, w);
        let counts = (0..w)
            .map(|o2| {
                if self.count_include_pad {
                    inside(g, (o2 * g.s[2]) as isize - g.pb[2] as isize, 2)
                } else if (lo..hi).contains(&o2) {
                    g.k[2]
                } else {
                    taps(g, o2).count()
                }
            })
            .map(|c| c as f32)
            .collect();
        Scratch {
            // Padded so the chunked reads of strides 1 and 2 may overrun the row by s - 1.
            t: vec![0.0; g.ind[2] + 1],
            rows: Vec::with_capacity(g.k[0].min(g.ind[0]) * g.k[1].min(g.ind[1])),
            counts,
        }
    }

    /// The ONNX Indices value of a maximum at spatial `(d, h, w)` of plane `nc`.
    fn index(&self, g: &Geo, nc: usize, [i0, i1, i2]: [usize; 3]) -> i64 {
        let [d0, d1, d2] = g.ind;
        let spatial = if self.column_major {
            // Column-major over the spatial dims (the first varies fastest).
            let n = self.kernel.len();
            let dims = &[d0, d1, d2][3 - n..];
            let idx = &[i0, i1, i2][3 - n..];
            let mut v = 0;
            for a in (0..n).rev() {
                v = v * dims[a] + idx[a];
            }
            v
        } else {
            (i0 * d1 + i1) * d2 + i2
        };
        (nc * d0 * d1 * d2 + spatial) as i64
    }
}

/// Scratch of one parallel chunk of pooling rows (see [`Pool::scratch`]).
struct Scratch {
    /// The window rows folded into one.
    t: Vec<f32>,
    /// Offsets of the window's input rows in the plane.
    rows: Vec<usize>,
    counts: Vec<f32>,
}

impl Geo {
    /// Whether the one window (no dilation) holds the whole input plane: a global pool. Pads
    /// around the plane are allowed unless they count (`pads_count`: an average with
    /// count_include_pad), as inception_v1's 7x7 average over a 6x6 plane with end pads
    /// (0.16 ms by bands, one task for 1,024 one-pixel planes).
    fn whole_plane(&self, pads_count: bool) -> bool {
        (0..3).all(|a| {
            let reaches = match pads_count {
                true => self.k[a] == self.ind[a] && self.pb[a] + self.pe[a] == 0,
                false => self.k[a] >= self.ind[a] + self.pb[a],
            };
            reaches && self.ind[a] > 0 && (self.d[a], self.outd[a]) == (1, 1)
        })
    }
}

/// Outputs along the last axis whose window lies wholly inside the input:
/// `o * s >= pb` and `o * s - pb + (k - 1) * d < in`.
fn interior(g: &Geo, w: usize) -> (usize, usize) {
    let (k2, s2, d2, pb2, in2) = (g.k[2], g.s[2], g.d[2], g.pb[2], g.ind[2]);
    let span = (k2 - 1) * d2;
    let hi = if in2 + pb2 > span {
        w.min((in2 - 1 + pb2 - span) / s2 + 1)
    } else {
        0
    };
    (pb2.div_ceil(s2).min(hi), hi)
}

/// Input positions along the last axis in the window of output `o2`.
fn taps(g: &Geo, o2: usize) -> impl Iterator<Item = usize> {
    positions(g, (o2 * g.s[2]) as isize - g.pb[2] as isize, 2)
}

/// Input positions of axis `a` in the window starting at `s`, in order.
fn positions(g: &Geo, s: isize, a: usize) -> impl Iterator<Item = usize> {
    let d = g.d[a];
    taps_before(g, s, a, 0, g.ind[a]).map(move |k| (s + (k * d) as isize) as usize)
}

/// Per output along axis `a`, the window positions an average divides by: those inside the
/// input, or (`include_pad`) inside the input and its explicit padding.
fn window_counts(g: &Geo, a: usize, include_pad: bool) -> impl Iterator<Item = f32> + '_ {
    (0..g.outd[a]).map(move |o| {
        let s = (o * g.s[a]) as isize - g.pb[a] as isize;
        (if include_pad {
            inside(g, s, a)
        } else {
            positions(g, s, a).count()
        }) as f32
    })
}

/// Window positions of axis `a` starting at `s` that lie inside the input or its explicit
/// padding (not the ceil overhang), for `count_include_pad`.
fn inside(g: &Geo, s: isize, a: usize) -> usize {
    taps_before(g, s, a, isize::MIN, g.ind[a] + g.pe[a]).len()
}

/// The taps `k` (in `0..k[a]`) of the window of axis `a` starting at `s` whose position
/// `s + k * d[a]` lies in `lo..end`. Computed, not searched: a hostile kernel_shape may be
/// 2^63 wide (the dilated kernel, pads and input each fit in an isize, see `make`).
fn taps_before(g: &Geo, s: isize, a: usize, lo: isize, end: usize) -> Range<usize> {
    let (k, d) = (g.k[a] as i128, g.d[a] as i128);
    let (s, lo, end) = (s as i128, lo as i128, end as i128);
    let first = if s >= lo { 0 } else { (lo - s + d - 1) / d };
    let stop = if end <= s { 0 } else { (end - s + d - 1) / d };
    let stop = stop.min(k);
    first.min(stop) as usize..stop as usize
}

crate::simd::kernel! {
    /// `out[i] /= outer * counts[i]` (an average's divisor; exact small integers).
    fn divide_counts(out: &mut [f32], counts: &[f32], outer: f32) {
        for (v, &c) in out.iter_mut().zip(counts) {
            *v /= outer * c;
        }
    }
}

crate::simd::kernel! {
    /// `t[i] = max(t[i], x[i])` (NaN propagates) or `t[i] += x[i]`; equal lengths.
    fn fold_row(t: &mut [f32], x: &[f32], max: bool) {
        combine(t, x, false, max)
    }
}

crate::simd::kernel! {
    /// One kernel tap of a pooling row (see [`tap_any`]), at the CPU's widest vectors.
    fn window_tap(acc: &mut [f32], src: &[f32], s: usize, first: bool, max: bool) {
        tap_any(acc, src, s, first, max)
    }
}

/// One kernel tap of a pooling row: `acc[j] = op(acc[j], src[j * s])` with op max or +,
/// or `acc[j] = src[j * s]` for the `first` tap; `src.len()` is `acc.len() * s` for
/// `s <= 2`, at least `(acc.len() - 1) * s + 1` otherwise. Inlined into each caller's
/// SIMD level (the band path's `band` kernel uses it too).
#[inline(always)]
pub(super) fn tap_any(acc: &mut [f32], src: &[f32], s: usize, first: bool, max: bool) {
    #[inline(always)]
    fn tap<const S: usize>(acc: &mut [f32], src: &[f32], first: bool, max: bool) {
        let it = acc.iter_mut().zip(src.chunks_exact(S));
        if first {
            it.for_each(|(a, c)| *a = c[0]);
        } else if max {
            it.for_each(|(a, c)| *a = max_nan(*a, c[0]));
        } else {
            it.for_each(|(a, c)| *a += c[0]);
        }
    }
    match s {
        1 => tap::<1>(acc, src, first, max),
        2 => tap::<2>(acc, src, first, max),
        _ => {
            let it = acc.iter_mut().zip(src.iter().step_by(s));
            if first {
                it.for_each(|(a, &v)| *a = v);
            } else if max {
                it.for_each(|(a, &v)| *a = max_nan(*a, v));
            } else {
                it.for_each(|(a, &v)| *a += v);
            }
        }
    }
}

/// The three taps of a window row one column apart at stride 2 (3x3 stride-2 pools) in one
/// pass: `acc[j] = op(op(src[2j], src[2j + 1]), src[2j + 2])`, the same operations in the same
/// order as three [`tap_any`] calls; `src.len() >= 2 * acc.len() + 1`.
#[inline(always)]
pub(super) fn taps3_stride2(acc: &mut [f32], src: &[f32], max: bool) {
    #[inline(always)]
    fn each(acc: &mut [f32], src: &[f32], op: impl Fn(f32, f32) -> f32) {
        let n = acc.len();
        if n == 0 {
            return;
        }
        let pairs = src.chunks_exact(2).zip(src[2..].chunks_exact(2));
        for (o, (c, d)) in acc[..n - 1].iter_mut().zip(pairs) {
            *o = op(op(c[0], c[1]), d[0]);
        }
        acc[n - 1] = op(op(src[2 * n - 2], src[2 * n - 1]), src[2 * n]);
    }
    if max {
        each(acc, src, max_nan);
    } else {
        each(acc, src, |a, b| a + b);
    }
}

/// `pool.wgsl` parameters: per spatial dim (padded to 3 in front) in `.xyz`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct PoolParams {
    in_dims: [u32; 4],
    out_dims: [u32; 4],
    kernel: [u32; 4],
    strides: [u32; 4],
    dilations: [u32; 4],
    pads: [u32; 4],
    pads_end: [u32; 4],
    start: u32,
    count: u32,
    _pad: [u32; 2],
}

impl Op for Pool {
    fn name(&self) -> &'static str {
        self.name
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        if ins.len() != 1 {
            return Err(OpError::Invalid(format!(
                "{} takes 1 input, got {}",
                self.name,
                ins.len()
            )));
        }
        let dt = ins[0].dtype;
        if !(dt == DType::F32 || self.max && matches!(dt, DType::U8 | DType::I8)) {
            return Err(OpError::Unsupported(format!(
                "{}: dtype {dt} (f32; u8/i8 for MaxPool)",
                self.name
            )));
        }
        let g = self.geometry(&ins[0].shape)?;
        let out = self.out_shape(&ins[0].shape, &g);
        let mut outs = vec![TensorMeta::new(dt, out.clone())];
        if self.max {
            outs.push(TensorMeta::new(DType::I64, out));
        }
        Ok(outs)
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        // Taps per output: a window reads at most the input's extent along each axis.
        let spatial = &ins[0].shape[ins[0].shape.len().saturating_sub(self.kernel.len())..];
        let k = (self.kernel.iter().zip(spatial))
            .fold(1usize, |p, (&k, &n)| p.saturating_mul(k.min(n)));
        Work {
            flops: (outs[0].numel() as u64).saturating_mul(k as u64),
            bytes_read: ins[0].bytes(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        Some(outs[0].rank() - 2)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let g = self.geometry(&ins[0].shape)?;
        let rl = shape::row_len(&outs[0].shape, Some(outs[0].shape.len() - 2));
        let range = rows.start * rl..rows.end * rl;
        let (ys, rest) = outs.split_at_mut(1);
        let indices = match rest.first_mut().map(|t| &mut t.data) {
            Some(Data::I64(v)) if self.max => Some(&mut v[range.clone()]),
            None => None,
            Some(_) => {
                return Err(OpError::Invalid(format!(
                    "{}: Indices must be i64",
                    self.name
                )))
            }
        };
        let start = range.start;
        match (&ins[0].data, &mut ys[0].data) {
            (Data::F32(x), Data::F32(y)) => self.pool_f32(x, &g, &mut y[range], start, indices),
            // 8-bit MaxPool: exact through f32.
            (Data::U8(x), Data::U8(y)) if self.max => {
                let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                let mut yf = vec![0.0; range.len()];
                self.pool_f32(&xf, &g, &mut yf, start, indices);
                y[range].iter_mut().zip(yf).for_each(|(o, v)| *o = v as u8);
            }
            (Data::I8(x), Data::I8(y)) if self.max => {
                let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                let mut yf = vec![0.0; range.len()];
                self.pool_f32(&xf, &g, &mut yf, start, indices);
                y[range].iter_mut().zip(yf).for_each(|(o, v)| *o = v as i8);
            }
            (x, _) => {
                return Err(OpError::Unsupported(format!(
                    "{} on CPU: dtype {}",
                    self.name,
                    x.dtype()
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
        if outs.len() > 1 {
            return Err(OpError::Unsupported(format!(
                "{} on GPU: the Indices output is computed on the CPU only",
                self.name
            )));
        }
        let g = self.geometry(&ins[0].shape)?;
        let rl = shape::row_len(&outs[0].shape, Some(outs[0].shape.len() - 2));
        let range = rows.start * rl..rows.end * rl;
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let big = || OpError::Unsupported(format!("{} on GPU: sizes exceed u32", self.name));
        if ins[0].numel() > u32::MAX as usize || range.end > u32::MAX as usize {
            return Err(big());
        }
        // The shader walks windows in i32 positions: input, pads, dilated kernel and the last
        // window's start must fit (a kernel_shape of 2^31-1 with SAME pads wrapped around).
        let extent = |i: usize| {
            [
                (g.k[i] - 1).saturating_mul(g.d[i]),
                g.pb[i],
                g.pe[i],
                g.ind[i],
            ]
            .into_iter()
            .fold(g.outd[i].saturating_mul(g.s[i]), usize::saturating_add)
        };
        if (0..3).any(|i| extent(i) > i32::MAX as usize) {
            return Err(OpError::Unsupported(format!(
                "{} on GPU: window, pads and strides exceed the shader's i32 positions",
                self.name
            )));
        }
        let v4 = |a: [usize; 3], w: usize| [a[0] as u32, a[1] as u32, a[2] as u32, w as u32];
        let p = PoolParams {
            in_dims: v4(g.ind, g.nc),
            out_dims: v4(g.outd, 0),
            kernel: v4(g.k, 0),
            strides: v4(g.s, 0),
            // A kernel of 1 has one tap whatever its dilation; 1 keeps the shader's i32 tap
            // arithmetic in range.
            dilations: v4(
                std::array::from_fn(|i| if g.k[i] == 1 { 1 } else { g.d[i] }),
                0,
            ),
            pads: v4(g.pb, 0),
            pads_end: v4(g.pe, 0),
            start: range.start as u32,
            count: range.len() as u32,
            _pad: [0; 2],
        };
        // 0 max, 1 average over the input elements, 2 average over the whole kernel.
        let mode = match (self.max, self.count_include_pad) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => 2,
        };
        let dilated = p.dilations[..3].iter().any(|&d| d != 1);
        let wg = grid_1d(range.len() as u64, 64);
        Ok(vec![GpuKernel::new(
            tandem_shaders::POOL,
            vec![0],
            vec![0],
            &p,
            wg,
        )
        .with_override("MODE", mode as f64)
        .with_override("DILATED", dilated as u32 as f64)])
    }
}

#[path = "pool_plane.rs"]
mod plane;

#[path = "pool_3x3.rs"]
mod pool3x3;

#[cfg(target_arch = "x86_64")]
#[path = "pool_3x3_max2.rs"]
mod pool3x3_max2;

#[cfg(target_arch = "x86_64")]
#[path = "pool_3x3_flat.rs"]
mod pool3x3_flat;

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
