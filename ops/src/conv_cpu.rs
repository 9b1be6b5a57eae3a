//! Conv's CPU paths: the direct loop over output lines for `cg == 1` (depthwise and
//! single-input-channel convs) and the GEMM per (image, group) over pixel chunks, with im2col
//! into per-thread scratch, the shared-im2col tiles (deep layers, and
//! convs whose pixel chunks would leave threads idle), and the rectangles
//! a row range becomes. A fused epilogue ([`Epilogue`]: activation, affine, residual) is applied
//! to each output block (a direct line, a GEMM block) right after it is written, while it is
//! still in cache; the direct and Winograd paths add a residual in a pass after their blocks.
//!
//! Undilated `cg == 1` convs go plane by plane instead (`conv_planes.rs`); those of a 3x3 or
//! 5x5 window, stride 1 keeping the plane's size or stride 2, read each plane in place on
//! AVX2 and AVX-512 (`conv_depthwise.rs`; `TANDEM_CONV_DEPTHWISE=0` turns it off).
//! 3x3 stride-1 convs with enough channels take Winograd F(4x4, 3x3) or F(2x2, 3x3) instead
//! (`conv_winograd.rs`, [`winograd::applies`]; `TANDEM_CONV_WINOGRAD=0` turns it off),
//! convs of few channels (stride 1 or strided; on AVX2 strided from 100 taps) the sum over
//! taps of shifted input lines (`conv_taps.rs`, [`taps::applies`]; `TANDEM_CONV_TAPS=0`), and other
//! convs of a constant W with many output channels the GEMM on W packed once
//! (`conv_packed.rs`, [`packed::applies`]; AVX-512, and AVX2 on Zen 1), which reads the
//! im2col of a kernel of several taps in place (`conv_implicit.rs`; `TANDEM_CONV_IMPLICIT=0`).
//! 1x1 convs of few output or input channels (on AVX-512 and planes from 28x28, up to 256
//! input channels) run as `W @ X` on the input planes, read in place (on AVX2 from copied
//! spans; `conv_pointwise.rs`, [`pointwise::applies`]; `TANDEM_CONV_POINTWISE=0`). On planes
//! below 14x14 (Winograd) and 40x40 (taps) a kept W takes the packed path rather than those two.
//!
//! Sits between the Conv operator (`conv.rs`: attributes, geometry `Geom2`, the GPU kernel) and
//! the shared CPU GEMM (`cpu_gemm.rs`).

use super::*;
use crate::cpu_gemm::{sgemm_raw, MatRef, Threads};
use crate::cpu_gemm_packed::PackedB;
use crate::phase_planes::{copy_every, strided_copy};

#[path = "conv_winograd.rs"]
pub(super) mod winograd;

#[path = "conv_taps.rs"]
pub(super) mod taps;

#[path = "conv_planes.rs"]
mod planes;

#[cfg(target_arch = "x86_64")]
#[path = "conv_depthwise.rs"]
mod depthwise;

#[path = "conv_packed.rs"]
pub(super) mod packed;

#[path = "conv_implicit.rs"]
pub(super) mod implicit;

#[path = "conv_pointwise.rs"]
pub(super) mod pointwise;

#[path = "conv_sigmoid.rs"]
mod sigmoid;

/// Raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(*mut f32, usize);
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
/// channel, several lines per task (a depthwise line is often only 7 to 56 elements); the
/// undilated ones go to `conv_planes.rs` instead.
pub(super) fn direct_path(
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&[f32], Option<&[f32]>, Epilogue),
    out: &mut [f32],
    rows: Range<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    if depthwise::applies(g) {
        return depthwise::plane_path(g, x, (w, b, ep), out, rows);
    }
    if planes::applies(g) {
        return planes::plane_path(g, x, (w, b, ep), out, rows);
    }
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
    crate::parallel::for_each_chunk_mut(dst, per * ow, |ci, chunk| {
        direct_lines(g, (x, w, b), &taps, rows.start + ci * per, chunk);
        epilogue(chunk, None, None, ep);
    });
}

crate::simd::kernel! {
    /// Output lines `r0..` of a `cg == 1` convolution into `chunk` (whole lines), each by
    /// [`direct_line`]: one call per task, so that the taps' short row segments are multiplied
    /// inline, not by a dispatched kernel each (a 3x3 kernel: 9 calls per line).
    fn direct_lines(
        g: &Geom2,
        xwb: (&[f32], &[f32], Option<&[f32]>),
        taps: &[(Range<usize>, usize)],
        r0: usize,
        chunk: &mut [f32],
    ) {
        for (i, line) in chunk.chunks_mut(g.ow.max(1)).enumerate() {
            direct_line(g, xwb, taps, r0 + i, line);
        }
    }
}

/// Output line `r` = `(n, oc, oh)` of a `cg == 1` convolution: the bias, then each tap's
/// weight times the input row segment it reads (`taps`: see [`direct_path`]).
#[inline(always)]
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
                for (o, xv) in dst.iter_mut().zip(&src[..vr.len()]) {
                    *o += wv * xv;
                }
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
pub(super) fn im2col(g: &Geom2, xg: &[f32], p0: usize, p1: usize, col: &mut [f32]) {
    let per_c = g.kh * g.kw * (p1 - p0);
    for (c, part) in col[..g.cg * per_c].chunks_mut(per_c).enumerate() {
        im2col_channel(g, &xg[c * g.h * g.w..][..g.h * g.w], p0, p1, part);
    }
}

/// [`im2col`] split over input channels on the pool (one block of columns that every task
/// then reads).
pub(super) fn im2col_par(g: &Geom2, xg: &[f32], p0: usize, p1: usize, col: &mut [f32]) {
    let per_c = g.kh * g.kw * (p1 - p0);
    crate::parallel::for_each_chunk_mut(&mut col[..g.cg * per_c], per_c, |c, part| {
        im2col_channel(g, &xg[c * g.h * g.w..][..g.h * g.w], p0, p1, part)
    });
}

crate::simd::kernel! {
    /// The `kh * kw` im2col rows of one input plane for pixels `p0..p1`. A kernel, so that
    /// a strided conv's row segments (7 to 56 floats, one per output row and tap) are copied
    /// inline on the CPU's widest vectors, not by a dispatched call each.
    pub(super) fn im2col_channel(
        g: &Geom2,
        xplane: &[f32],
        p0: usize,
        p1: usize,
        rows: &mut [f32],
    ) {
        let np = p1 - p0;
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = &mut rows[(ki * g.kw + kj) * np..][..np];
                let off = (kj * g.dw) as i64 - g.pl;
                if g.ow == 1 {
                    im2col_column(g, xplane, ki, off, p0, row);
                    continue;
                }
                if g.sw == 1 && g.sh == 1 && g.ow == g.w {
                    im2col_shifted(g, xplane, (ki, kj), p0, row);
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
                        copy_every(dst, src, g.sw);
                    }
                }
            }
        }
    }
}

/// One im2col row of a stride-1 conv whose output rows are as long as its input rows (the
/// "same" 3x3 and 5x5 convs): pixel `p` reads input `p + (ki * dh - pt) * w + kj * dw - pl`,
/// so the row is one copy of the input shifted by a constant,
/// zero where the tap's input row is outside the input, then the columns whose tap falls in the
/// left or right padding zeroed.
pub(super) fn im2col_shifted(
    g: &Geom2,
    xplane: &[f32],
    (ki, kj): (usize, usize),
    p0: usize,
    row: &mut [f32],
) {
    let (w, p1) = (g.w, p0 + row.len());
    let off = (kj * g.dw) as i64 - g.pl;
    let dh = (ki * g.dh) as i64 - g.pt;
    // Output rows whose tap row lies inside the input.
    let vr = valid_range(g.oh, g.sh, dh, g.h);
    let (a, b) = ((vr.start * w).clamp(p0, p1), (vr.end * w).clamp(p0, p1));
    row[..a - p0].fill(0.0);
    row[b - p0..].fill(0.0);
    if a >= b {
        return;
    }
    let delta = dh * w as i64 + off;
    // The first and last pixels may map before the plane or past it (their columns are
    // padding, zeroed below): copy the part that maps inside.
    let lo = a.max((-delta).max(0) as usize);
    let hi = b.min((xplane.len() as i64 - delta).max(0) as usize);
    if lo < hi {
        let src = (lo as i64 + delta) as usize;
        row[lo - p0..hi - p0].copy_from_slice(&xplane[src..src + (hi - lo)]);
    }
    row[a - p0..lo.min(b) - p0].fill(0.0);
    row[hi.clamp(a, b) - p0..b - p0].fill(0.0);
    // Columns whose tap is in the left (ow < -off) or right (ow + off >= w) padding.
    let cl = valid_range(g.ow, 1, off, w);
    for r in a / w..b.div_ceil(w) {
        let base = r * w;
        for c in (0..cl.start).chain(cl.end..w) {
            let p = base + c;
            if (a..b).contains(&p) {
                row[p - p0] = 0.0;
            }
        }
    }
}

/// One im2col row when every output line is one pixel (`ow == 1`, 1-D convolutions): pixel `p`
/// is output line `p`, so the row is a strided copy down input column `off`, zero where the
/// tap falls in the padding.
pub(super) fn im2col_column(
    g: &Geom2,
    xplane: &[f32],
    ki: usize,
    off: i64,
    p0: usize,
    row: &mut [f32],
) {
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
        let dst = &mut row[a - p0..b - p0];
        match g.sh * g.w {
            // A column of a one-wide input read at stride 1 is a slice (magika's conv).
            1 => dst.copy_from_slice(&xplane[first..first + dst.len()]),
            s => strided_copy(dst, &xplane[first..], s),
        }
    }
}

thread_local! {
    /// This thread's im2col buffer, reused across calls (see [`with_scratch`]).
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Largest im2col buffer a thread keeps between calls (16 MiB); larger ones are freed.
pub(super) const SCRATCH_KEEP: usize = 4 << 20;

/// Run `f` on `len` floats of this thread's im2col buffer: grown when needed, never cleared
/// (im2col writes every element it hands on). The buffer is taken out of the thread-local for
/// the call, so a nested call on the same thread (rayon work-stealing inside a GEMM) gets a
/// buffer of its own instead of sharing this one.
pub(super) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
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

thread_local! {
    /// Per-thread temporaries of tasks (Winograd's transforms, the implicit path's sums).
    static TMP: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Run `f` on `len` floats of this thread's task temporaries (taken out for the call).
pub(super) fn with_tmp<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut v = TMP.with(|s| s.take());
    if v.len() < len {
        v.resize(len, 0.0);
    }
    let r = f(&mut v[..len]);
    TMP.with(|s| s.set(v));
    r
}

/// Row `ih` of input plane `xp` (`h x w`) as a zero-padded row of `row.len()` floats: padded
/// column `p` holds input column `p - pl`; zeros outside the input (all of it for a row
/// outside `0..h`). Inlined into Winograd's transform kernels and the taps path's padding.
#[inline(always)]
pub(super) fn padded_row(xp: &[f32], (h, w, pl): (usize, usize, i64), ih: i64, row: &mut [f32]) {
    let wp = row.len() as i64;
    let c0 = pl.clamp(0, wp) as usize;
    let c1 = (pl + w as i64).clamp(c0 as i64, wp) as usize;
    if ih < 0 || ih >= h as i64 || c0 >= c1 {
        row.fill(0.0);
        return;
    }
    let src = &xp[ih as usize * w..][..w];
    row[..c0].fill(0.0);
    row[c1..].fill(0.0);
    let s0 = (c0 as i64 - pl) as usize;
    row[c0..c1].copy_from_slice(&src[s0..s0 + (c1 - c0)]);
}

/// Input plane `xp` (`h x w`) zero-padded into `dst`: its first `rows` rows of `wp` floats
/// from input row `-pt` on ([`padded_row`]), then zeros to the end of `dst`. The padded
/// planes of the taps path and of the packed path's im2col read in place.
pub(super) fn padded_plane(
    xp: &[f32],
    (h, w, pt, pl): (usize, usize, i64, i64),
    (wp, rows): (usize, usize),
    dst: &mut [f32],
) {
    for (r, row) in dst.chunks_exact_mut(wp).take(rows).enumerate() {
        padded_row(xp, (h, w, pl), r as i64 - pt, row);
    }
    dst[rows * wp..].fill(0.0);
}

/// One rectangle of a row range inside a group: output channels `oc` (absolute) x pixels.
#[derive(Debug, Clone)]
pub(super) struct Rect {
    oc: Range<usize>,
    pix: Range<usize>,
}

/// Split group-local rows `q` (`ocl * OH + oh`) into at most 3 rectangles.
pub(super) fn rects(g: &Geom2, oc0: usize, q: Range<usize>) -> Vec<Rect> {
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
/// parallel (each with its own im2col block), or one im2col block shared by tiles of channels
/// x pixels ([`tile_split`]) where pixel chunks would not keep every thread busy or the
/// rectangles have at least as many output channels as pixels (deep layers, 1-D
/// convolutions: pixel chunks would each repack all the weights).
pub(super) fn gemm_path(
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&[f32], Option<&[f32]>, Epilogue),
    z: Option<&[f32]>,
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
    let img_rows = g.m * g.oh;
    // (image, group, its rectangles, the union of their pixels)
    let mut units = Vec::new();
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
            units.push((n, grp, rs, union));
        }
    }
    // Pixel chunks of a union: of about 256K im2col elements, and of at most 64K output
    // elements (`chans` channels of its pixels) down to 1024 pixels, so that the epilogue
    // finds the block the GEMM wrote still in L2 (a conv over few input channels, such as a
    // network's first, would otherwise write megabytes first); a 1x1 conv reads X in place:
    // one chunk. A multiple of the thread count where there are pixels enough, so no thread
    // idles through a last round.
    let count = |pixels: usize, chans: usize| {
        let target = if direct_b {
            pixels
        } else {
            (262_144 / ckk)
                .min((65_536 / chans.max(1)).max(1024))
                .max(64)
        };
        let count = pixels.div_ceil(target);
        if pixels >= 64 * threads {
            count.next_multiple_of(threads)
        } else {
            count
        }
    };
    let chans = |rs: &[Rect]| rs.iter().map(|r| r.oc.len()).max().unwrap();
    let chunks: usize = units.iter().map(|u| count(u.3.len(), chans(&u.2))).sum();
    let mut tasks: Vec<Task> = Vec::new();
    for (n, grp, rs, union) in units {
        let chans = chans(&rs);
        if chans >= union.len() || chunks < threads {
            tile_split(g, (x, w, b, ep), z, optr, (n, grp), &rs, union, direct_b);
            continue;
        }
        let chunk = union.len().div_ceil(count(union.len(), chans));
        let rs = std::sync::Arc::new(rs);
        let mut p = union.start;
        while p < union.end {
            let e = (p + chunk).min(union.end);
            tasks.push((n, grp, rs.clone(), p..e));
            p = e;
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
                unsafe { gemm_block(g, (w, b, ep), z, optr, *n, r.oc.clone(), pix, bm, th) };
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
        crate::parallel::for_each_ref(&tasks, |t| run(t, Threads::Single));
    } else {
        tasks.iter().for_each(|t| run(t, Threads::Pool));
    }
}

/// The GEMM path for one (image, group) as tiles: im2col of the pixel `union` once (in
/// parallel over input channels), then each rectangle cut into tiles of channels x pixels
/// ([`tile_grid`]), about one per thread, multiplied in parallel.
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_split(
    g: &Geom2,
    (x, w, b, ep): (&[f32], &[f32], Option<&[f32]>, Epilogue),
    z: Option<&[f32]>,
    optr: OutPtr,
    (n, grp): (usize, usize),
    rs: &[Rect],
    union: Range<usize>,
    direct_b: bool,
) {
    let threads = rayon::current_num_threads().max(1);
    let mut parts: Vec<(Range<usize>, Range<usize>)> = Vec::new();
    for r in rs {
        let (kc, kp) = tile_grid(r.oc.len(), r.pix.len(), threads);
        let (cstep, pstep) = (r.oc.len().div_ceil(kc), r.pix.len().div_ceil(kp));
        for c in r.oc.clone().step_by(cstep) {
            for p in r.pix.clone().step_by(pstep) {
                parts.push((c..(c + cstep).min(r.oc.end), p..(p + pstep).min(r.pix.end)));
            }
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
            // SAFETY: the tiles cut the rectangles (disjoint output blocks) into disjoint blocks.
            unsafe { gemm_block(g, (w, b, ep), z, optr, n, oc.clone(), pix.clone(), bm, th) };
        };
        if parts.len() >= threads && threads > 1 {
            crate::parallel::for_each_ref(&parts, |p| one(p, Threads::Single));
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

/// How to cut `oc` channels x `pix` pixels into tiles for `threads` threads: `(kc, kp)` parts
/// of the channels and of the pixels. A tile keeps at least 8 channels and 16 pixels; among
/// the grids of exactly `threads` tiles that allow, the one whose tiles read the least (a
/// tile's weight rows plus its im2col columns, both `ckk` long), else as many tiles as the
/// minimum sizes allow.
pub(super) fn tile_grid(oc: usize, pix: usize, threads: usize) -> (usize, usize) {
    let (max_kc, max_kp) = ((oc / 8).clamp(1, threads), (pix / 16).clamp(1, threads));
    (1..=max_kc)
        .filter(|&kc| threads.is_multiple_of(kc) && threads / kc <= max_kp)
        .map(|kc| (kc, threads / kc))
        .min_by_key(|&(kc, kp)| oc.div_ceil(kc) + pix.div_ceil(kp))
        .unwrap_or((max_kc, threads.div_ceil(max_kc).min(max_kp)))
}

/// Output channels `oc` x pixels `pix` of image `n`: the GEMM of those weight rows with `bm`
/// (`ckk` rows of B starting at the block's first pixel), then the bias, the activation and
/// the residual `z` (where `ep.residual` places it) while the block is still in cache.
///
/// # Safety
/// No other thread may access that output block during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_block(
    g: &Geom2,
    (w, b, ep): (&[f32], Option<&[f32]>, Epilogue),
    z: Option<&[f32]>,
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
    if b.is_none() && ep == Epilogue::default() {
        return;
    }
    for (i, c) in oc.enumerate() {
        let at = first + i * plane;
        assert!(at + pix.len() <= optr.1, "Conv bias block out of bounds");
        // SAFETY: in bounds (checked) and held exclusively by this call (caller contract).
        let line = unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(at), pix.len()) };
        epilogue(line, b.map(|b| b[c]), z.map(|z| &z[at..at + pix.len()]), ep);
    }
}

/// `line[i] = ep(line[i] + bias)`: the bias, the fused activation and the affine after it
/// of one output line, in one pass, on the widest vectors the CPU has; with `z` (the
/// residual's elements at the line's indices) added where `ep.residual` says:
/// `ep(line[i] + bias + z[i])` or `ep(line[i] + bias) + z[i]`. `z` is ignored when
/// `ep.residual` is `None`. A Sigmoid or SiLU on AVX2 or AVX-512 runs `conv_sigmoid.rs`,
/// every other one the compiler's vectorisation ([`epilogue_vectorised`]).
pub(super) fn epilogue(line: &mut [f32], bias: Option<f32>, z: Option<&[f32]>, ep: Epilogue) {
    if !sigmoid::line(line, bias, z, ep) {
        epilogue_vectorised(line, bias, z, ep)
    }
}

crate::simd::kernel! {
    /// [`epilogue`] at each SIMD level (`simd.rs`), bit for bit the same at each.
    pub(super) fn epilogue_vectorised(
        line: &mut [f32],
        bias: Option<f32>,
        z: Option<&[f32]>,
        ep: Epilogue,
    ) {
        epilogue_plain(line, bias, (z, ep.residual), ep)
    }
}

#[inline(always)]
fn epilogue_plain(
    line: &mut [f32],
    bias: Option<f32>,
    z: (Option<&[f32]>, Residual),
    ep: Epilogue,
) {
    #[inline(always)]
    fn each(
        line: &mut [f32],
        bias: Option<f32>,
        (z, residual): (Option<&[f32]>, Residual),
        f: impl Fn(f32) -> f32,
    ) {
        // `for` loops, not `for_each`: `for_each` is not always inlined, and a loop left out
        // of line is compiled without the caller's target features (SSE2 instead of AVX-512:
        // yolov8n's SiLU epilogues took 21 % of its time that way).
        let b = bias.unwrap_or(0.0);
        match (z, residual) {
            (_, Residual::None) | (None, _) => match bias {
                Some(b) => {
                    for v in line.iter_mut() {
                        *v = f(*v + b);
                    }
                }
                None => {
                    for v in line.iter_mut() {
                        *v = f(*v);
                    }
                }
            },
            (Some(z), Residual::BeforeAct) => {
                let z = &z[..line.len()];
                for (v, z) in line.iter_mut().zip(z) {
                    *v = f(*v + b + z);
                }
            }
            (Some(z), Residual::AfterAct) => {
                let z = &z[..line.len()];
                for (v, z) in line.iter_mut().zip(z) {
                    *v = f(*v + b) + z;
                }
            }
        }
    }
    // One loop per (activation, post) pair, each with its function inlined: every closure
    // names its variant, so `apply` folds to that activation's code and the loop vectorises
    // (passing the `Activation` value instead left a match per element: 43% of yolov8n).
    #[inline(always)]
    fn then_post(
        line: &mut [f32],
        (bias, z): (Option<f32>, (Option<&[f32]>, Residual)),
        post: Option<(f32, f32)>,
        f: impl Fn(f32) -> f32,
    ) {
        match post {
            Some((s, t)) => each(line, bias, z, |v| f(v) * s + t),
            None => each(line, bias, z, f),
        }
    }
    let (post, bias) = (ep.post, (bias, z));
    match ep.act {
        Activation::None => then_post(line, bias, post, |v| v),
        Activation::Relu => then_post(line, bias, post, |v| Activation::Relu.apply(v)),
        Activation::LeakyRelu(a) => {
            then_post(line, bias, post, |v| Activation::LeakyRelu(a).apply(v))
        }
        Activation::Clip(lo, hi) => {
            then_post(line, bias, post, |v| Activation::Clip(lo, hi).apply(v))
        }
        Activation::Sigmoid => then_post(line, bias, post, |v| Activation::Sigmoid.apply(v)),
        Activation::Silu => then_post(line, bias, post, |v| Activation::Silu.apply(v)),
        Activation::HardSigmoid(a, b) => {
            then_post(line, bias, post, |v| Activation::HardSigmoid(a, b).apply(v))
        }
        Activation::HardSwish(a, b) => {
            then_post(line, bias, post, |v| Activation::HardSwish(a, b).apply(v))
        }
    }
}

/// What a Conv keeps of a constant W for the CPU path that runs ([`Conv::with_constant_weight`]):
/// nothing (W not constant, or a path that reads W as it is), W's Winograd transform, W
/// packed for `conv_packed.rs`, or W in the blocks of output channels of the taps and
/// pointwise paths. A path given nothing derives what it needs on every call.
#[derive(Clone, Copy, Debug)]
pub enum KeptWeight<'a> {
    Nothing,
    Winograd(&'a [f32]),
    Packed(&'a PackedB),
    Blocks(&'a [f32]),
}

/// Compute output lines `rows` of a convolution on the CPU (f32), `ep` applied to each
/// output block right after it is computed. The path: W packed where kept so, the direct loop
/// for one input channel per group, Winograd, the taps path, the pointwise path, else im2col +
/// GEMM. `kept` is what the op keeps of a constant W for that path ([`KeptWeight`]; the
/// Winograd path counts a kept transform as W being constant). `z` is the residual
/// `ep.residual` places (of the output's shape): added in a pass over the rows after the
/// direct and Winograd paths, with the rest of the epilogue where it comes after the
/// residual (the other paths add it per task).
pub fn conv_cpu(
    g: &Geom2,
    x: &[f32],
    (w, kept): (&[f32], KeptWeight),
    (b, z): (Option<&[f32]>, Option<&[f32]>),
    ep: Epilogue,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let rows = rows.start.min(g.n * g.m * g.oh)..rows.end.min(g.n * g.m * g.oh);
    if rows.is_empty() || g.ow == 0 {
        return;
    }
    let z = z.filter(|_| ep.residual != Residual::None);
    let first = if z.is_some() {
        ep.before_residual()
    } else {
        ep
    };
    let (transform, blocks) = match kept {
        KeptWeight::Packed(packed) => {
            return packed::packed_path(g, x, (packed, b, ep), z, out, rows)
        }
        KeptWeight::Winograd(u) => (Some(u), None),
        KeptWeight::Blocks(u) => (None, Some(u)),
        KeptWeight::Nothing => (None, None),
    };
    if g.cg == 1 {
        direct_path(g, x, (w, b, first), out, rows.clone());
    } else if winograd::applies(g, transform.is_some()) {
        let v = winograd::Variant::of(g);
        winograd::winograd_path(v, g, x, (w, b, first), transform, out, rows.clone());
    } else if taps::applies(g, false) {
        return taps::taps_path(g, x, (w, blocks), (b, ep), z, out, rows);
    } else if pointwise::applies(g, ep) {
        return pointwise::pointwise_path(g, x, (w, blocks), (b, ep), z, out, rows);
    } else {
        return gemm_path(g, x, (w, b, ep), z, out, rows);
    }
    if let Some(z) = z {
        let span = rows.start * g.ow..rows.end * g.ow;
        let z = &z[span.clone()];
        crate::parallel::for_each_chunk_mut(&mut out[span], 16_384, |i, o| {
            epilogue(
                o,
                None,
                Some(&z[i * 16_384..][..o.len()]),
                ep.from_residual(),
            )
        });
    }
}
