//! Conv as a sum over its taps of shifted input lines, for stride-1 convs of few input
//! channels (squeezenet's 16 -> 64 3x3 on 55x55, yolov8n's 16- and 32-channel 3x3 convs,
//! inception_v1's 5x5 ones) and strided convs of few input channels (first convs: 3x3/2,
//! 7x7/2, alexnet's 11x11/4; yolov8n's 16 -> 32 3x3/2), on AVX-512, and on AVX2 through
//! `conv_taps_avx2.rs`'s kernel (fewer convs: [`MAX_OUT_CHANNELS_AVX2`],
//! [`MIN_STRIDED_TAPS_AVX2`]); elsewhere these stay on im2col + GEMM.
//!
//! The input planes are copied zero-padded to `wp = ow + (kw - 1) dw` columns, so output
//! pixel `(oy, ox)` sits at line position `p = oy wp + ox` and tap `(a, b)` reads the padded
//! plane at `p + a dh wp + b dw`: every tap is the same plane shifted, and a run of output
//! positions is a run of input floats. The kernel keeps `MR` output channels x `NV` vectors
//! of 16 positions in registers over all `C x taps`, loading `NV` vectors of the plane and
//! broadcasting `MR` weights per (channel, tap): no im2col, no packing of the pixels. It
//! starts from the bias, applies a Relu and stores its block straight into the NCHW output,
//! masked: the `kw - 1` positions past each row's `ow` are computed and not stored
//! ([`RowGaps`]; a copy of each row out of a task buffer, with the bias and Relu in a pass
//! over it, had cost squeezenet's 16 -> 64 3x3 on 55x55 about 15%). Other epilogues and a
//! residual run in a pass after. W goes into blocks of `MR` output channels
//! (`[block][c][tap][MR]`), kept for a constant W (`Conv::with_constant_weight`), packed on
//! every call otherwise. The kernel also serves 1x1 convs with one tap (`conv_pointwise.rs`).
//! A strided conv reads `sh x sw` phase planes of each channel instead, where its taps are
//! shifted lines again ([`Lines`]).
//!
//! On AVX-512 a tile whose every position is in the line loads its vectors plain; only a
//! line's last, part-filled tile masks its loads (likely why: a zero-masking load needs a
//! vector uop besides the load on Intel cores, on the ports the FMAs use; not confirmed, this
//! host has no counters). Masking every load had cost (one process, the two alternated, 1
//! thread unless noted) squeezenet's 16 -> 64 3x3 on 55x55 1.11x the time
//! (1.07x on 2 threads), a 7x7/2 3 -> 64 first conv on 224x224 1.11x, 16 -> 16 3x3 on 80x80
//! 1.10x, 1x1s through `conv_pointwise.rs` 1.06-1.14x (128 -> 16 on 55x55 even). Whole
//! models, one session alternating the two 40 times: squeezenet 0.98x of its time (median of
//! the rounds' ratios, quartiles 0.95-1.02), inception_v1 even (docs/bench.md, "Plain loads in
//! the taps kernel").
//!
//! A conv of a kept W on a plane under 40x40 ([`MIN_PIXELS_BESIDE_IMPLICIT`]) takes the packed
//! path's im2col read in place instead (`conv_implicit.rs`), measured faster there.
//!
//! Sits between `conv_cpu.rs`'s path choice ([`applies`]) and the CPU's vector units.

use super::{packed::finish_lines, padded_plane, rects, with_scratch, with_tmp, OutPtr};
use crate::conv::{Activation, Epilogue, Geom2, Residual};
use crate::phase_planes::{copy_every, inside_columns};
use crate::simd::Level;
use std::ops::Range;

/// Output channels per kernel call (rows of accumulators).
pub(in crate::conv) const MR: usize = 8;
/// Vectors of 16 line positions per kernel call.
const NV: usize = 3;
/// Line positions per kernel call.
pub(in crate::conv) const NP: usize = 16 * NV;
/// Fewest line positions per output row here: a vector of 16 then touches at most three
/// rows (the kernel's stores, [`RowGaps`]).
const MIN_ROW: usize = 8;

/// Input channels (at least, at most) and output channels (at most) where this path was
/// measured faster than im2col + GEMM (docs/bench.md, "Conv as a sum over taps"): 16 -> 16
/// 3x3 on 80x80 1.76-1.87x, 32 -> 32 3x3 on 40x40 1.44-1.79x, 16 -> 64 3x3 on 55x55
/// 1.17-1.18x, 32 -> 96 5x5 on 27x27 1.22-1.27x, 16 -> 48 5x5 on 13x13 1.36-1.44x. 32 -> 128
/// (3x3 on 27x27) measured 0.85-1.08x, 48 -> 192 and 64 -> 256 (3x3 on 13x13) 0.45-0.62x:
/// the broadcast weights outnumber the positions loaded, and small planes leave more of the
/// last `NP` positions empty. Small planes need many taps: output pixels x taps from 3600
/// (3x3 on 20x20 1.03-1.25x, 5x5 on 13x13 1.19-1.56x; 32 -> 96 3x3 on 14x14 0.71-0.82x).
const MIN_CHANNELS: usize = 8;
const MAX_CHANNELS: usize = 32;
const MAX_OUT_CHANNELS: usize = 96;
const MIN_PIXEL_TAPS: usize = 3600;

/// Fewest taps of a strided conv here (read as phase planes, [`Lines`]), at any channel
/// count up to [`MAX_CHANNELS`]: against im2col + GEMM (two threads, the path alone)
/// alexnet's 3 -> 64 11x11/4 on 224x224 0.86-1.00 ms against 1.42-1.53 (in the model 1.57-1.70
/// against 2.10-2.48). 7x7/2 first convs were even until the kernel stored straight into the
/// output; since, 3 -> 64 on 224x224 runs 0.88-0.90x of im2col's time and 3 -> 96 0.96-1.04x.
/// 3x3/2 ones lost (3 -> 64 on 224x224 1.07-1.16x) while each tile stored to every output
/// plane of its task; with spans ([`SPAN_BYTES`]) they win in the models (AMD Zen 4, 2
/// threads, the two alternated process by process, medians of 6-8 rounds): squeezenet's 3 -> 64
/// 0.45 -> 0.35 ms, shufflenet's 3 -> 24 (pad 1) 0.164 -> 0.146, yolov8n's 16 -> 32 on
/// 160x160 0.550 -> 0.467; yolov8n's 3 -> 16 on 320x320 and 32 -> 64 on 80x80 and ppocr_det's
/// first conv even (0.98-1.04x).
const MIN_STRIDED_TAPS: usize = 9;

/// Output channels (at most, stride 1) and taps (at least, strided) where the AVX2 kernel
/// (`conv_taps_avx2.rs`) was measured faster than im2col + the `gemm` crate (AMD Zen 3, 2
/// threads, the paths alone alternated: the `taps_speed` test): 16 -> 16 3x3 on 80x80
/// 1.10-1.37x, 32 -> 32 on 40x40 1.05-1.23x, alexnet's 3 -> 64 11x11/4 1.12-1.22x. From 48
/// output channels it lost or tied (16 -> 64 3x3 on 55x55 0.80-0.93x, 32 -> 64 on 40x40
/// 0.94-0.97x, 16 -> 48 5x5 on 13x13 0.83-0.93x, 32 -> 96 5x5 on 27x27 0.83-1.03x), and so
/// did 7x7/2 first convs (3 -> 64 0.94-0.99x). Winograd F(4x4, 3x3) still comes first for a
/// kept W of 16 channels (`conv_winograd.rs`): 0.61-0.88x of this kernel's time on those
/// 3x3s.
const MAX_OUT_CHANNELS_AVX2: usize = 32;
const MIN_STRIDED_TAPS_AVX2: usize = 100;

/// Fewest output pixels per image where the packed path reads a conv of a kept W in place
/// (`conv_implicit.rs`): on smaller planes that path was measured faster (32 -> 96 5x5 on
/// 27x27 1.60x of im2col against 1.19x here, 16 -> 48 5x5 on 13x13 1.76x against 1.24x, 24 ->
/// 64 3x3 on 28x28 1.29x against 1.05x); from 40x40 this one (16 -> 16 3x3 on 80x80 2.25x
/// against 1.00x, 16 -> 64 on 55x55 1.22x against 1.13x; 32 -> 64 on 40x40 1.37x against 1.35x).
const MIN_PIXELS_BESIDE_IMPLICIT: usize = 1600;

/// Whether `TANDEM_CONV_TAPS=0` turned this path off (read once).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CONV_TAPS").as_deref() != Ok("0"))
}

/// Whether `conv_cpu` takes this path: AVX2 or AVX-512, group 1, a 2-D kernel (more than one
/// tap on both axes), at most [`MAX_CHANNELS`] input channels (from [`MIN_CHANNELS`] at
/// stride 1; a strided kernel of [`MIN_STRIDED_TAPS`], on AVX2 [`MIN_STRIDED_TAPS_AVX2`]) and
/// [`MAX_OUT_CHANNELS`] output channels (on AVX2 at stride 1 [`MAX_OUT_CHANNELS_AVX2`]),
/// [`MIN_PIXEL_TAPS`], enabled; for a `kept` W the packed path reads in place, planes of
/// [`MIN_PIXELS_BESIDE_IMPLICIT`] or more.
pub(in crate::conv) fn applies(g: &Geom2, kept: bool) -> bool {
    let min_pixels = match kept && super::implicit::takes_kept(g) {
        true => MIN_PIXELS_BESIDE_IMPLICIT,
        false => 0,
    };
    g.oh * g.ow >= min_pixels
        && g.group == 1
        && g.kh > 1
        && g.kw > 1
        && Lines::row(g) >= MIN_ROW
        && g.c <= MAX_CHANNELS
        && match (g.sh, g.sw, crate::simd::level()) {
            (_, _, Level::Baseline) => false,
            (1, 1, Level::Avx2) => g.c >= MIN_CHANNELS && g.m <= MAX_OUT_CHANNELS_AVX2,
            (1, 1, _) => g.c >= MIN_CHANNELS,
            (_, _, Level::Avx2) => g.kh * g.kw >= MIN_STRIDED_TAPS_AVX2,
            _ => g.kh * g.kw >= MIN_STRIDED_TAPS,
        }
        && g.m <= MAX_OUT_CHANNELS
        && g.oh * g.ow * g.kh * g.kw >= MIN_PIXEL_TAPS
        && enabled()
}

/// Numbers shared by the steps: the phase planes' row length and rows, how many phases each
/// input channel has, and each tap's line offset (phase plane included).
///
/// A strided conv reads its padded input as `sh x sw` phase planes, phase `(pa, pb)` holding
/// padded pixels `(r sh + pa, c sw + pb)`: tap `(a, b)` of output pixel `(oy, ox)` is then
/// phase `(a dh % sh, b dw % sw)` at `(oy + a dh / sh, ox + b dw / sw)`, a shifted line again.
/// Stride 1 has one phase, the padded plane itself.
struct Lines {
    wp: usize,
    hp: usize,
    /// The output row whose taps' input rows the planes begin with: 0 for a whole image's
    /// planes, a task's first output row for its own.
    first: usize,
    phases: usize,
    offs: Vec<usize>,
}

impl Lines {
    /// Line positions per output row: its `ow` pixels and the taps' overhang.
    fn row(g: &Geom2) -> usize {
        g.ow + (g.kw - 1) * g.dw / g.sw
    }

    fn of(g: &Geom2) -> Lines {
        Lines::for_rows(g, 0, g.oh)
    }

    /// The phase planes of output rows `first..first + rows` only: the plane rows those
    /// output rows read (a task's own planes in [`taps_path`]).
    fn for_rows(g: &Geom2, first: usize, rows: usize) -> Lines {
        let wp = Lines::row(g);
        let hp = rows + (g.kh - 1) * g.dh / g.sh;
        let offs = (0..g.kh)
            .flat_map(|a| (0..g.kw).map(move |b| (a * g.dh, b * g.dw)))
            .map(|(ra, cb)| {
                let phase = (ra % g.sh) * g.sw + cb % g.sw;
                phase * hp * wp + ra / g.sh * wp + cb / g.sw
            })
            .collect();
        Lines {
            wp,
            hp,
            first,
            phases: g.sh * g.sw,
            offs,
        }
    }

    /// A task's `positions` in spans of whole tiles whose input lines (every channel's phase
    /// planes from the span's first position to its last plus the taps' overhang) fit in
    /// [`SPAN_BYTES`], at least one tile each.
    fn spans(&self, c: usize, positions: usize) -> impl Iterator<Item = (usize, usize)> {
        let overhang = self.offs.iter().map(|o| o % (self.hp * self.wp)).max();
        let per_plane = SPAN_BYTES / 4 / (c * self.phases).max(1);
        let span = (per_plane.saturating_sub(overhang.unwrap_or(0)) / NP * NP).max(NP);
        (0..positions)
            .step_by(span)
            .map(move |s0| (s0, (s0 + span).min(positions)))
    }

    /// Floats per input channel: its phase planes, then zeros for the reads of the last
    /// positions past them (a tile's `NP` and a row's worth of column offsets).
    fn channel(&self) -> usize {
        self.phases * self.hp * self.wp + NP + self.wp
    }

    /// Every input channel of `x` (`h x w` each, from the first image the call reads) as its
    /// phase planes into `xp` ([`Lines::channel`] floats each), in parallel over channels and
    /// phases: a 3-channel first conv of stride 2 is 12 pieces for the threads, not 3 (2:1 on
    /// two threads; yolov8n's 3 -> 16 3x3/2 on 320x320 0.226 -> 0.176 ms in the model). A
    /// task filling its own planes runs it in order on its thread (`parallel::serially`).
    fn fill(&self, g: &Geom2, x: &[f32], xp: &mut [f32]) {
        let size = self.hp * self.wp;
        let mut pieces = Vec::with_capacity(xp.len() / self.channel() * self.phases);
        for (i, channel) in xp.chunks_exact_mut(self.channel()).enumerate() {
            let (planes, tail) = channel.split_at_mut(self.phases * size);
            tail.fill(0.0);
            pieces.extend(
                planes
                    .chunks_exact_mut(size)
                    .enumerate()
                    .map(|(p, d)| (i, p, d)),
            );
        }
        crate::parallel::for_each_item(pieces, |(i, phase, dst)| {
            self.fill_phase(g, &x[i * g.h * g.w..][..g.h * g.w], phase, dst);
        });
    }

    /// Phase plane `phase` (`hp x wp` floats) of input channel `src` (`h x w`) into `plane`.
    fn fill_phase(&self, g: &Geom2, src: &[f32], phase: usize, plane: &mut [f32]) {
        let (pt, pl) = (g.pt, g.pl);
        let first_row = self.first as i64;
        if self.phases == 1 {
            let rows_from = pt - first_row;
            return padded_plane(src, (g.h, g.w, rows_from, pl), (self.wp, self.hp), plane);
        }
        let (pa, first) = ((phase / g.sw) as i64, (phase % g.sw) as i64 - pl);
        let cols = inside_columns(g.w, g.sw, first, self.wp);
        let at = PhaseAt {
            h: g.h,
            w: g.w,
            sh: g.sh,
            sw: g.sw,
            top: first_row * g.sh as i64 + pa - pt,
            first,
        };
        phase_rows(plane, src, self.wp, cols, &at);
    }
}

/// Where a phase plane's rows come from: input rows `r sh + top` of the `h x w` input, input
/// columns `c sw + first` ([`phase_rows`]).
struct PhaseAt {
    h: usize,
    w: usize,
    sh: usize,
    sw: usize,
    top: i64,
    first: i64,
}

crate::simd::kernel! {
    /// The rows of a phase plane (`wp` floats each) from `src`, columns `cols` inside the
    /// input and zeros elsewhere, on the widest vectors the CPU has (stride 2's
    /// deinterleave: SSE moved 4 floats a shuffle).
    fn phase_rows(plane: &mut [f32], src: &[f32], wp: usize, cols: Range<usize>, at: &PhaseAt) {
        let Range { start: c0, end: c1 } = cols;
        for (r, row) in plane.chunks_exact_mut(wp).enumerate() {
            let iy = r as i64 * at.sh as i64 + at.top;
            if !(0..at.h as i64).contains(&iy) || c0 == c1 {
                row.fill(0.0);
                continue;
            }
            let line = &src[iy as usize * at.w..][..at.w];
            row[..c0].fill(0.0);
            row[c1..].fill(0.0);
            let ix0 = (c0 as i64 * at.sw as i64 + at.first) as usize;
            copy_every(&mut row[c0..c1], &line[ix0..], at.sw);
        }
    }
}

/// Bytes of input lines a span of a task's positions reads ([`Lines::spans`]): every block of
/// output channels runs over a whole span before the next block, so that each block's stores
/// are long runs of its `MR` output planes, while the span's input stays in L2 (a quarter of
/// Zen 4's). Tile by tile, each tile's stores went to every output plane of the task: the
/// 7x7/2 first convs took 1.06-1.11x the time in the models (AMD Zen 4, 2 threads, the two
/// alternated process by process, medians of 6 rounds: resnet50's 1.43 -> 1.32 ms,
/// inception_v1's 1.45 -> 1.31, zfnet512's 3 -> 96 1.94 -> 1.80); convs of stride 1 were
/// even (16 -> 32 5x5 on 80x80, 32 -> 96 on 160x160: 0.98-1.02x).
const SPAN_BYTES: usize = 256 << 10;

/// Line positions a task covers at least (where the rectangle has them): fewer leave most of
/// a task to its last, partly empty, `NP` positions.
const MIN_TASK_POSITIONS: usize = 8 * NP;

/// Output lines `rows` (`(n, oc, oh)`) of a convolution [`applies`] accepts: the bias and a
/// plain Relu applied by the kernel, any other `ep` and the residual `z` in a pass over each
/// task's block after its product. `blocks` is W as [`pack_weights`] lays it out, where the
/// op keeps it; without it W is packed for the call.
///
/// Tasks of output rows x blocks of `MR` channels, about four per thread, each running every
/// block of its channels over a span of its positions ([`Lines::spans`], the input lines in
/// L2) `NP` at a time, the kernel storing each row's first `ow` positions straight into the
/// output ([`RowGaps`]). Where every task runs all its channels (the planes are tall enough
/// for four row chunks a thread), each first fills the padded (phase) plane rows its output
/// rows read into its own temporaries ([`Lines::for_rows`]); otherwise the planes of each
/// image the range touches are made first, shared (parallel over channels and phases). Shared
/// planes are written by both cores and read by both, and where the cores sit far apart
/// every run's fill then waits on the other core's copies of the lines: squeezenet's first
/// conv 0.87x of its time with its own planes in that mode, even in the other (docs/bench.md,
/// "Each task fills the plane rows it reads").
pub(in crate::conv) fn taps_path(
    g: &Geom2,
    x: &[f32],
    (w, blocks): (&[f32], Option<&[f32]>),
    (b, ep): (Option<&[f32]>, Epilogue),
    z: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let l = Lines::of(g);
    let taps = l.offs.len();
    let threads = rayon::current_num_threads().max(1);
    // (image, channels, output rows) per rectangle of the range.
    let rs: Vec<_> = image_rects(g, &rows)
        .into_iter()
        .map(|(n, oc, pix)| (n, oc, pix.start / g.ow..pix.end / g.ow))
        .collect();
    let (Some(n_lo), Some(n_hi)) = (rs.first().map(|r| r.0), rs.last().map(|r| r.0 + 1)) else {
        return;
    };
    let oc_hi = rs.iter().map(|r| r.1.end).max().unwrap_or(0);
    // Tasks: each rectangle's rows in chunks of at least MIN_TASK_POSITIONS positions, its
    // blocks of channels in groups, about four tasks per thread in all.
    let want = 4 * threads;
    let mut tasks = Vec::new();
    // Whether every task runs all its rectangle's channels: then each fills the phase-plane
    // rows it reads itself ([`Lines::for_rows`]).
    let mut own_planes = true;
    for (n, oc, oy) in &rs {
        let min_rows = MIN_TASK_POSITIONS.div_ceil(l.wp).max(1);
        let chunks = (want.div_ceil(rs.len()))
            .min(oy.len().div_ceil(min_rows))
            .max(1);
        let per_rows = oy.len().div_ceil(chunks);
        let groups = want.div_ceil(rs.len() * chunks);
        own_planes &= block_groups(oc, groups).count() == 1;
        for y in (oy.start..oy.end).step_by(per_rows) {
            for ks in block_groups(oc, groups) {
                tasks.push((*n, ks, y..(y + per_rows).min(oy.end)));
            }
        }
    }
    let wlen = match blocks {
        Some(_) => 0,
        None => oc_hi.div_ceil(MR) * g.c * taps * MR + MR,
    };
    let xlen = match own_planes {
        true => 0,
        false => (n_hi - n_lo) * g.c * l.channel(),
    };
    let optr = OutPtr(out.as_mut_ptr(), out.len());
    let ke = InKernel::of(b, z, ep);
    let fetch = fetches_output(g);
    let image = |n: usize| &x[n * g.c * g.h * g.w..][..g.c * g.h * g.w];
    with_scratch(wlen + xlen, |buf| {
        let (wk, xp) = buf.split_at_mut(wlen);
        let wk: &[f32] = match blocks {
            Some(kept) => kept,
            None => {
                pack_weights(w, g.c, taps, 0..oc_hi, &mut wk[..wlen - MR]);
                wk
            }
        };
        // Output rows `oy` of channels `oc` of image `n` from phase planes `lines` at `x0`
        // (their row 0 the planes' row `oy.start`).
        let rows_of = |x0: &[f32], lines: &Lines, (n, oc, oy): &Task| {
            let plane = lines.channel();
            let span = oy.len() * lines.wp;
            let (mb0, mb1) = (oc.start / MR, oc.end.div_ceil(MR));
            let first = ((n * g.m + oc.start) * g.oh + oy.start) * g.ow;
            let len = oy.len() * g.ow;
            assert!(
                first + (oc.len() - 1) * g.oh * g.ow + len <= optr.1,
                "taps: output block out of bounds"
            );
            for (s0, s1) in lines.spans(g.c, span) {
                for mb in mb0..mb1 {
                    let (ks, wb) = block_in(wk, g.c * taps * MR, mb, oc);
                    for t in (s0..s1).step_by(NP) {
                        let gaps = RowGaps {
                            wp: lines.wp,
                            ow: g.ow,
                            at: t,
                        };
                        let to = TileOut::of(&ks, g.oh * g.ow, (span - t).min(NP), ke, Some(gaps))
                            .fetching(fetch);
                        // SAFETY: AVX2 or AVX-512 present (`applies`); every plane has `NP` +
                        // the largest offset floats past its last row's positions (the task's
                        // own planes hold its rows and their overhang); the output rows
                        // `ks` of the task's output rows are in bounds (checked above) and
                        // written by this task only (tasks are distinct (image, channels,
                        // rows) blocks), the kernel storing the first `ow` of each row's
                        // positions.
                        unsafe {
                            tile(
                                x0.as_ptr().add(t),
                                plane,
                                g.c,
                                &lines.offs,
                                wb,
                                optr.ptr().add(first + (ks.start - oc.start) * g.oh * g.ow),
                                to,
                            )
                        }
                    }
                }
            }
            if !ke.whole {
                let pixels = (oy.start * g.ow, len);
                finish_lines(g, optr, (*n, oc.clone()), pixels, (b, z, ep));
            }
        };
        if own_planes {
            crate::parallel::for_each_ref(&tasks, |task| {
                let mine = Lines::for_rows(g, task.2.start, task.2.len());
                with_tmp(g.c * mine.channel(), |xt| {
                    // On this task's thread: its pieces are small, and a fork per task
                    // would hand half of its planes to the other core.
                    crate::parallel::serially(|| mine.fill(g, image(task.0), xt));
                    rows_of(xt, &mine, task);
                })
            });
            return;
        }
        l.fill(g, &x[n_lo * g.c * g.h * g.w..], xp);
        let xp = &*xp;
        crate::parallel::for_each_ref(&tasks, |task| {
            let x0 = &xp[(task.0 - n_lo) * g.c * l.channel() + task.2.start * l.wp..];
            rows_of(x0, &l, task);
        });
    });
}

/// A task of [`taps_path`]: image, output channels, output rows.
type Task = (usize, Range<usize>, Range<usize>);

/// [`Lines::spans`] of `positions` of a task of `g`, for the tests.
#[cfg(test)]
pub(in crate::conv) fn spans_of(g: &Geom2, positions: usize) -> Vec<(usize, usize)> {
    Lines::of(g).spans(g.c, positions).collect()
}

/// (image, output channels, pixels) per rectangle of output lines `rows` (`(n, oc, oh)`),
/// image by image ([`rects`]).
pub(in crate::conv) fn image_rects(
    g: &Geom2,
    rows: &Range<usize>,
) -> Vec<(usize, Range<usize>, Range<usize>)> {
    let img_rows = g.m * g.oh;
    let mut rs = Vec::new();
    for n in rows.start / img_rows..rows.end.div_ceil(img_rows) {
        let lo = n * img_rows;
        let q = rows.start.max(lo) - lo..rows.end.min(lo + img_rows) - lo;
        if !q.is_empty() {
            rs.extend(rects(g, 0, q).into_iter().map(|r| (n, r.oc, r.pix)));
        }
    }
    rs
}

/// Output channels `oc` in at most `groups` runs of whole blocks of `MR` (counted from
/// channel 0, as [`pack_weights`] lays out a kept W; the first and last runs cut at `oc`).
pub(in crate::conv) fn block_groups(
    oc: &Range<usize>,
    groups: usize,
) -> impl Iterator<Item = Range<usize>> + '_ {
    let (b0, b1) = (oc.start / MR, oc.end.div_ceil(MR));
    let per = (b1 - b0).div_ceil(groups.clamp(1, (b1 - b0).max(1))).max(1);
    (b0..b1)
        .step_by(per)
        .map(move |bb| (bb * MR).max(oc.start)..((bb + per) * MR).min(oc.end))
}

/// Floats of W as [`pack_weights`] lays out all `M` output channels of `g`, and `MR` zeros
/// after (the pointwise path reads a block from a channel inside it).
pub(in crate::conv) fn blocks_len(g: &Geom2) -> usize {
    g.m.div_ceil(MR) * g.c * g.kh * g.kw * MR + MR
}

/// W (`[M][C][taps]`) for output channels `ocs` as `[block][c][tap][MR]`, blocks of `MR`
/// channels, the last padded with zeros: what [`tile`] reads. Kept for a constant W
/// (`Conv::with_constant_weight`), packed on every call otherwise.
pub(in crate::conv) fn pack_weights(
    w: &[f32],
    c: usize,
    taps: usize,
    ocs: Range<usize>,
    wk: &mut [f32],
) {
    crate::parallel::for_each_chunk_mut(wk, c * taps * MR, |mb, blk| {
        for (ct, dst) in blk.chunks_exact_mut(MR).enumerate() {
            for (i, d) in dst.iter_mut().enumerate() {
                let k = ocs.start + mb * MR + i;
                *d = if k < ocs.end {
                    w[k * c * taps + ct]
                } else {
                    0.0
                };
            }
        }
    });
}

/// What [`tile`] applies of a conv's epilogue: the bias and a plain Relu, where those are all
/// of it (no residual, no affine after, no other activation); else nothing, and the caller
/// runs the whole epilogue in a pass over each task's block after the product
/// ([`finish_lines`]).
#[derive(Clone, Copy)]
pub(in crate::conv) struct InKernel<'a> {
    /// Whether the kernel applies the whole epilogue.
    pub whole: bool,
    bias: Option<&'a [f32]>,
    relu: bool,
}

impl<'a> InKernel<'a> {
    /// Whether the kernel applies all of `ep`: no residual, no affine, no activation but a
    /// Relu.
    pub(in crate::conv) fn whole(ep: Epilogue) -> bool {
        ep.residual == Residual::None
            && ep.post.is_none()
            && matches!(ep.act, Activation::None | Activation::Relu)
    }

    pub(in crate::conv) fn of(
        b: Option<&'a [f32]>,
        z: Option<&[f32]>,
        ep: Epilogue,
    ) -> InKernel<'a> {
        let whole = z.is_none() && InKernel::whole(ep);
        InKernel {
            whole,
            bias: b.filter(|_| whole),
            relu: whole && ep.act == Activation::Relu,
        }
    }
}

/// Block `mb`'s output channels cut to `oc` (on a split range a rectangle may start
/// mid-block), and its weights from the first of them on: the block's in `wk` (blocks of
/// `len` floats, as [`pack_weights`] lays them out) read that many floats in (the kernel
/// stores no rows past the cut).
pub(in crate::conv) fn block_in<'w>(
    wk: &'w [f32],
    len: usize,
    mb: usize,
    oc: &Range<usize>,
) -> (Range<usize>, &'w [f32]) {
    let start = mb * MR;
    let ks = start.max(oc.start)..(start + MR).min(oc.end);
    let wb = &wk[mb * len + (ks.start - start)..][..len];
    (ks, wb)
}

/// Where [`tile`] stores its `MR x NP` block and what it starts from and ends with: the
/// first `rows` rows and `positions` columns at stride `ld` (skipping `gaps`), the sums
/// started from the bias per row at `bias` (else from zero), and Relu'd before the store
/// where `relu`; on AVX-512 the block's output lines fetched for writing before the sums
/// where `fetch` ([`fetches_output`]).
#[derive(Clone, Copy)]
pub(in crate::conv) struct TileOut {
    ld: usize,
    rows: usize,
    positions: usize,
    bias: Option<*const f32>,
    relu: bool,
    gaps: Option<RowGaps>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fetch: bool,
}

/// Input channels up to which a conv is taken for a network's first (it reads the image), and
/// the multiply-adds per output from which such a conv's tiles fetch their output lines for
/// writing before they compute ([`fetches_output`]).
const FIRST_CONV_CHANNELS: usize = 4;
const FETCH_MIN_DEPTH: usize = 100;

/// Whether the tiles of `g` fetch their output lines for writing (`PREFETCHW`) before their
/// sums: a network's first conv writes the run's first large output, whose lines a model
/// with more weights than the L3 holds has pushed out of every cache since the last run.
/// Each store of a tile then waited for its line from memory: resnet50's 3 -> 64 7x7/2 on
/// 224x224 took 0.67 ms after a 64 MB pass and 0.51 with its output warm (onnxruntime's
/// 0.47 either way). Fetched while the tile computes (147 multiply-adds an output there),
/// the lines arrive before the stores: inside the models (AMD Zen 5, 2 threads, alternated
/// process by process) resnet50's 0.79x, inception_v2's 0.81x, inception_v1's 0.85x,
/// densenet121's 0.87x, zfnet512's 3 -> 96 0.78x, alexnet's 11x11/4 0.92x; the models
/// 0.97-0.999x. 3x3 first convs (27 multiply-adds an output) gained where the output was
/// cold (squeezenet 0.95x) and lost where the model's working set keeps it in the L3
/// (yolov8n's, shufflenet's 1.06x); the 3x3s after them (144-288), whose outputs are warm,
/// lost 10-12 % (squeezenet). docs/bench.md, "1x1s of up to 256 input
/// channels on the pointwise kernel; first convs fetch their output lines; ...".
pub(in crate::conv) fn fetches_output(g: &Geom2) -> bool {
    g.c <= FIRST_CONV_CHANNELS && g.ckk() >= FETCH_MIN_DEPTH
}

impl TileOut {
    /// Output channels `ks` at stride `ld`, `positions` columns, what `ep` has the kernel
    /// apply, `gaps` skipped.
    pub(in crate::conv) fn of(
        ks: &Range<usize>,
        ld: usize,
        positions: usize,
        ep: InKernel,
        gaps: Option<RowGaps>,
    ) -> TileOut {
        TileOut {
            ld,
            rows: ks.len(),
            positions,
            bias: ep.bias.map(|b| b[ks.start..].as_ptr()),
            relu: ep.relu,
            gaps,
            fetch: false,
        }
    }

    /// The same, its output lines fetched for writing before the sums where `fetch`.
    pub(in crate::conv) fn fetching(self, fetch: bool) -> TileOut {
        TileOut { fetch, ..self }
    }
}

/// Columns a store skips: the tile's positions are line positions from `at` of rows of `wp`
/// positions, of which the first `ow` are output pixels, line position `r wp + c` stored at
/// `r ow + c` (from the output pointer, at line position 0). Without gaps position `j` of the
/// tile is stored at `j`.
#[derive(Clone, Copy)]
pub(in crate::conv) struct RowGaps {
    wp: usize,
    ow: usize,
    at: usize,
}

/// [`avx512::tile`] on AVX-512, [`avx2::tile`] on AVX2; [`applies`] keeps other CPUs and
/// targets off this path.
///
/// # Safety
/// As [`avx512::tile`], and AVX2 and FMA present.
pub(in crate::conv) unsafe fn tile(
    x: *const f32,
    plane: usize,
    c: usize,
    offs: &[usize],
    wb: &[f32],
    out: *mut f32,
    to: TileOut,
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract.
    unsafe {
        // Every lane of every load inside the positions: plain loads (module docs). A short
        // tile (a line's last) runs only the vectors its positions reach.
        let full = to.positions >= NP;
        let vectors = to.positions.div_ceil(16);
        let a = (x, plane, c, offs, wb, out, to);
        match (offs, crate::simd::avx512(), full, vectors) {
            ([0], true, true, _) => avx512::tile::<true, true, NV>(a),
            ([0], true, false, ..=1) => avx512::tile::<true, false, 1>(a),
            ([0], true, false, 2) => avx512::tile::<true, false, 2>(a),
            ([0], true, false, _) => avx512::tile::<true, false, NV>(a),
            (_, true, true, _) => avx512::tile::<false, true, NV>(a),
            (_, true, false, ..=1) => avx512::tile::<false, false, 1>(a),
            (_, true, false, 2) => avx512::tile::<false, false, 2>(a),
            (_, true, false, _) => avx512::tile::<false, false, NV>(a),
            ([0], false, ..) => avx2::tile::<true>(x, plane, c, offs, wb, out, to),
            (_, false, ..) => avx2::tile::<false>(x, plane, c, offs, wb, out, to),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "conv taps path without AVX2 {:?} {:?} {:?}",
        (x, plane, c, offs.len(), wb.len(), out),
        (to.ld, to.rows, to.positions, to.relu),
        (to.bias, to.gaps.map(|r| (r.wp, r.ow, r.at)))
    )
}

#[cfg(target_arch = "x86_64")]
#[path = "conv_taps_avx2.rs"]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    #[cfg(doc)]
    use super::MIN_ROW;
    use super::{RowGaps, TileOut, MR, NP};
    use std::arch::x86_64::*;

    /// Output rows a vector of 16 line positions touches at most, on rows of at least
    /// [`MIN_ROW`] positions.
    const SEGMENTS: usize = 3;

    /// `PREFETCHW` of every cache line [`tile`] will store to: its first `to.rows` rows from
    /// `out` at stride `to.ld`, the outputs of its first `to.positions` (at most `16 v`)
    /// columns (between the first and the last of them on each row where `to.gaps`).
    #[inline(always)]
    fn fetch_for_writing(out: *mut f32, to: &TileOut, v: usize) {
        let n = to.positions.min(16 * v);
        if n == 0 {
            return;
        }
        let (first, end) = match to.gaps {
            None => (0, n),
            Some(RowGaps { wp, ow, at }) => {
                let last = at + n - 1;
                let (r0, r1) = (at / wp, last / wp);
                (
                    r0 * ow + (at - r0 * wp).min(ow),
                    r1 * ow + (last - r1 * wp + 1).min(ow),
                )
            }
        };
        for i in 0..to.rows.min(MR) {
            let row = out.wrapping_add(i * to.ld);
            let mut line = row.wrapping_add(first) as usize & !63;
            let end = row.wrapping_add(end) as usize;
            while line < end {
                // SAFETY: a prefetch does not fault and writes nothing; PREFETCHW is on every
                // CPU with AVX-512 (Intel from Broadwell, AMD since the K6).
                unsafe {
                    std::arch::asm!("prefetchw [{0}]", in(reg) line, options(nostack, preserves_flags, readonly));
                }
                line += 64;
            }
        }
    }

    /// `MR x 16 V` outputs (`V` at most `NV` vectors: a short tile computes fewer):
    /// `out[i][j] = sum_{c, t} wb[c][t][i] x[c plane + offs[t] + j]`, of which the first
    /// `to.rows` rows and `to.positions` columns are read and stored at stride `to.ld`, columns
    /// in the gaps skipped ([`TileOut`], [`RowGaps`]). `FULL`: `to.positions` is at least
    /// `16 V`, and the loads are not masked.
    ///
    /// # Safety
    /// AVX-512F present; `to.positions` at most `16 V` unless `V` is `NV`; `x` readable at
    /// `c plane + offs[t] + j` for every `c`, `t`, `j < positions.min(16 V)`; `out` writable at
    /// `i ld` + where column `j < positions.min(16 V)` goes (`j`, or `at + j - r (wp - ow)` with
    /// gaps, for the columns not in a gap) for `i < rows.min(MR)`; with gaps, rows of at least
    /// [`MIN_ROW`] positions; a bias readable at `i < rows.min(MR)`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const ONE: bool, const FULL: bool, const V: usize>(
        (x, plane, c, offs, wb, out, to): (
            *const f32,
            usize,
            usize,
            &[usize],
            &[f32],
            *mut f32,
            TileOut,
        ),
    ) {
        let masks: [__mmask16; V] = std::array::from_fn(|v| {
            let n = to.positions.saturating_sub(16 * v).min(16);
            ((1u32 << n) - 1) as __mmask16
        });
        // Loops over all `MR` rows, rows past `to.rows` skipped inside: a loop of `to.rows`
        // steps would index the accumulators at run time, which LLVM then keeps in memory.
        let mut acc = [[_mm512_setzero_ps(); V]; MR];
        for (i, acc) in acc.iter_mut().enumerate() {
            for acc in acc.iter_mut() {
                if let (true, Some(b)) = (i < to.rows, to.bias) {
                    *acc = _mm512_set1_ps(*b.add(i));
                }
            }
        }
        if to.fetch {
            fetch_for_writing(out, &to, V);
        }
        let mut wp = wb.as_ptr();
        // One tap at offset 0 (`ONE`, a 1x1 conv) spares the loop over taps.
        let offs = if ONE { &[0][..] } else { offs };
        for ci in 0..c {
            let xc = x.add(ci * plane);
            for &o in offs {
                let xs = xc.add(o);
                _mm_prefetch::<_MM_HINT_T0>(xs.wrapping_add(2 * NP).cast());
                let mut xv = [_mm512_setzero_ps(); V];
                for (v, xv) in xv.iter_mut().enumerate() {
                    *xv = match FULL {
                        true => _mm512_loadu_ps(xs.add(16 * v)),
                        false => _mm512_maskz_loadu_ps(masks[v], xs.add(16 * v)),
                    };
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*wp.add(i));
                    for (acc, &xv) in acc.iter_mut().zip(&xv) {
                        *acc = _mm512_fmadd_ps(wv, xv, *acc);
                    }
                }
                wp = wp.add(MR);
            }
        }
        // Where each vector goes: at most `SEGMENTS` runs of lanes (one per output row it
        // touches), each a mask and the address of lane 0. Fixed-size loops below keep the
        // accumulators in registers.
        let mut segs = [[(0 as __mmask16, out); SEGMENTS]; V];
        match to.gaps {
            None => {
                for (v, segs) in segs.iter_mut().enumerate() {
                    segs[0] = (masks[v], out.wrapping_add(16 * v));
                }
            }
            Some(RowGaps { wp, ow, at }) => {
                // Row `r` of the line starts at position `row`; lane `j` of a vector from
                // `lo` in row `r` goes to `lo + j - r (wp - ow)`, lanes past `ow` masked off.
                let (mut r, mut row) = (at / wp, at / wp * wp);
                for (v, segs) in segs.iter_mut().enumerate() {
                    let (lo, hi) = (at + 16 * v, at + to.positions.min(16 * v + 16));
                    let mut q = lo;
                    for seg in segs.iter_mut() {
                        if q >= hi {
                            break;
                        }
                        if q >= row + wp {
                            (r, row) = (r + 1, row + wp);
                        }
                        let kept_end = (row + ow).min(hi);
                        if q < kept_end {
                            let mask = (1u32 << (kept_end - lo)) - (1u32 << (q - lo));
                            let base = out.wrapping_add(lo).wrapping_sub(r * (wp - ow));
                            *seg = (mask as __mmask16, base);
                        }
                        q = (row + wp).min(hi);
                    }
                }
            }
        }
        let zero = _mm512_setzero_ps();
        for (i, acc) in acc.iter().enumerate() {
            for (&acc, segs) in acc.iter().zip(&segs) {
                if i < to.rows {
                    // Zero's the first operand: a NaN sum stays NaN, as `Activation::Relu`.
                    let acc = if to.relu {
                        _mm512_max_ps(zero, acc)
                    } else {
                        acc
                    };
                    for &(mask, base) in segs {
                        if mask != 0 {
                            _mm512_mask_storeu_ps(base.wrapping_add(i * to.ld), mask, acc);
                        }
                    }
                }
            }
        }
    }
}
