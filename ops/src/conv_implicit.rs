//! Conv as the GEMM on W packed once with its im2col read in place: the packed path
//! (`conv_packed.rs`) for kernels of more than one tap, where that path runs (AVX-512, Zen 1).
//!
//! The input planes of an image are copied zero-padded once, `hp x wp` each, so output pixel
//! `(y, x)` at tap `(a, b)` reads padded float `(y sh + a dh) wp + x sw + b dw`: column
//! `c * taps + t` of the im2col is input plane `c` shifted by tap `t`'s offset, and a run of
//! one output row's pixels is a run of that plane at stride `sw`. The packed kernel
//! (`cpu_gemm_packed::taps_block`) reads A so, broadcasting each pixel against 16-channel
//! vectors of a panel of W and storing the block transposed into the NCHW output: no im2col
//! is written or read back, and the padded copy is `taps` times smaller than it. Blocks never
//! cross an output row, whose pixels are contiguous in the output. Where a panel outgrows a
//! quarter of L2, K runs in chunks of input channels, each block's sums kept between them.
//! Where the padded planes outweigh W, each task pads only the rows its band of output rows
//! reads, into its own temporaries ([`implicit_path`]), so no core reads planes the other
//! wrote.
//!
//! Measured against im2col + GEMM (the kernel alone, 2 threads, interleaved): 1.1-1.8x on
//! 3x3 convs of 32 to 256 channels on 7x7 to 56x56 planes, 1.3-1.8x strided (docs/bench.md,
//! "Conv im2col read in place"). Winograd stays ahead from 14x14 planes, the taps path from
//! 40x40 ones of few channels; `TANDEM_CONV_IMPLICIT=0` turns this path off.
//!
//! Sits between `conv_packed.rs`'s path (which W is packed for) and `cpu_gemm_packed.rs`.

use super::packed::finish_lines;
use super::{padded_plane, with_scratch, with_tmp, OutPtr};
use crate::conv::{Epilogue, Geom2};
use crate::cpu_gemm::MatRef;
use crate::cpu_gemm_packed::{taps_block, BlockOut, PackedB, TapSteps, CHUNK_BYTES};
use std::ops::Range;

/// Whether `TANDEM_CONV_IMPLICIT=0` turned this path off (read once).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CONV_IMPLICIT").as_deref() != Ok("0"))
}

/// Fewest input and output channels where this path was measured faster than im2col + GEMM
/// (docs/bench.md, "Conv im2col read in place"): 3 -> 64 7x7/2 and 3x3/2 first convs ran
/// 0.64-0.92x (a K of 147 or 27 over 3 planes), 16 -> 16 3x3 on 80x80 1.00x (half of each
/// 32-column panel empty).
const MIN_CHANNELS: usize = 8;
const MIN_OUT_CHANNELS: usize = 32;

/// Longest column [`column_as_row`] reads in place: each k step of a block reads another
/// channel's plane, and up to a page (4 KB) on Intel's prefetchers follow. Longer ones keep
/// im2col: a 256 -> 512 5x1 over 2044 pixels ran 1.13-1.2x slower read in place once (0.97x
/// on the Emerald Rapids host), over 3996 pixels 0.97-1.05x (im2col's tiles are compact).
const MAX_COLUMN_AS_ROW: usize = 1024;

/// Whether the packed path reads this conv's im2col in place: more than one tap,
/// [`MIN_CHANNELS`], [`MIN_OUT_CHANNELS`], more than one output column, enabled.
pub(in crate::conv) fn applies(g: &Geom2) -> bool {
    g.kh * g.kw > 1 && g.ow > 1 && g.c >= MIN_CHANNELS && g.m >= MIN_OUT_CHANNELS && enabled()
}

/// Whether a conv of a kept W (whole images) takes this path: [`applies`], where the packed
/// path runs (`packed::runs_here`, `TANDEM_CONV_PACKED` not 0). Winograd and the taps path
/// yield to it on small planes.
pub(in crate::conv) fn takes_kept(g: &Geom2) -> bool {
    applies(g) && g.group == 1 && super::packed::enabled() && super::packed::runs_here()
}

/// A conv of a kept W over one column that the packed path takes (which would write its
/// im2col) as the same conv over one row ([`Geom2::as_row`]), whose im2col this path reads in
/// place, where the column is at most [`MAX_COLUMN_AS_ROW`] long and the row [`takes_kept`],
/// on AVX-512. magika's 256 -> 512 5x1 over 512 pixels (2 KB per channel): 1.5-6 % faster
/// alone, the model 1-2.4 % (docs/bench.md). On Zen 1 (AVX2) the row read in place ran at
/// 0.86-0.89x of the `gemm` crate's speed alone, the column's im2col through the packed path
/// at 0.99-1.00x, so there it stays a column. Convs that the packed path does not take stay
/// columns: as rows read in place, 32 -> 64 9-tap ones over 512 to 4000 pixels ran up to
/// 1.5x slower than their im2col + GEMM.
pub(in crate::conv) fn column_as_row(
    g: &Geom2,
    rows: &Range<usize>,
) -> Option<(Geom2, Range<usize>)> {
    g.as_row(rows)
        .filter(|(row, _)| row.w <= MAX_COLUMN_AS_ROW && takes_kept(row) && crate::simd::avx512())
}

/// The padded planes' size and the offset of each tap (`a * kw + b`) in them.
struct Padded {
    hp: usize,
    wp: usize,
    offs: Vec<usize>,
}

impl Padded {
    fn of(g: &Geom2) -> Padded {
        let hp = Padded::rows_read(g, g.oh);
        let wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
        let offs = (0..g.kh)
            .flat_map(|a| (0..g.kw).map(move |b| a * g.dh * wp + b * g.dw))
            .collect();
        Padded { hp, wp, offs }
    }

    fn plane(&self) -> usize {
        self.hp * self.wp
    }

    /// Padded rows that `rows` output rows read.
    fn rows_read(g: &Geom2, rows: usize) -> usize {
        (rows.max(1) - 1) * g.sh + (g.kh - 1) * g.dh + 1
    }
}

/// Whole images `rows / (M * OH)` of the convolution into `out`, `ep` (and the residual `z`)
/// applied to each channel's lines of a task's band right after its panel, in about four
/// tasks per thread.
///
/// Where an image's padded planes outweigh W ([`bands_own_planes`]), tasks are bands of
/// output rows running every panel, and each first pads the input rows its band reads into
/// its own temporaries. Otherwise the padded planes of the images come first (parallel over
/// channels), shared, and tasks are a band x a group of W's panels, panels split first (the
/// padded image is then the smaller operand and every task reads its band of it). Shared
/// planes are written by both cores and read by both: where the two cores sit far apart (the
/// slow mode of docs/bench.md) every task waited on the other core's half of them, and
/// resnet50's 128 -> 128 3x3/2 on 56x56 took twice its time (docs/bench.md, "The implicit
/// path's bands pad their own rows").
pub(in crate::conv) fn implicit_path(
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&PackedB, Option<&[f32]>, Epilogue),
    z: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let pd = Padded::of(g);
    let img = g.m * g.oh;
    let images = rows.start / img..rows.end / img;
    let (panels, nr) = (w.panels(), w.panel_width());
    let want = 4 * rayon::current_num_threads().max(1);
    let optr = OutPtr(out.as_mut_ptr(), out.len());
    // One task: image `i` of the range, its panels `ps` over output rows `ys`, reading the
    // padded planes `at` (whose first row is output row `at.y0`'s).
    let task = |i: usize, ps: Range<usize>, at: &Band, partial: &mut [f32]| {
        let n = images.start + i;
        for p in ps {
            let ch = p * nr..((p + 1) * nr).min(g.m);
            let c0 = (n * g.m + ch.start) * g.oh * g.ow;
            assert!(
                c0 + (ch.len() - 1) * g.oh * g.ow + at.ys.end * g.ow <= optr.1,
                "Conv output band out of bounds"
            );
            band_product(g, w, p, at, partial, (optr, c0));
            let pixels = (at.ys.start * g.ow, at.ys.len() * g.ow);
            finish_lines(g, optr, (n, ch), pixels, (b, z, ep));
        }
    };
    if bands_own_planes(g, &pd) {
        // Rows split as evenly as they go (28 in 8 bands: 3 and 4 by turns, the halves
        // even); every band's planes as tall as the tallest band's (a shorter band's extra
        // rows zero), so one set of steps serves them all.
        let bands = want.div_ceil(images.len().max(1)).min(g.oh).max(1);
        let tallest = g.oh.div_ceil(bands);
        let pplane = Padded::rows_read(g, tallest) * pd.wp;
        let steps = TapSteps::new(&pd.offs, g.c, pplane);
        crate::parallel::for_each_index(images.len() * bands, |t| {
            let (i, band) = (t / bands, t % bands);
            let ys = band * g.oh / bands..(band + 1) * g.oh / bands;
            let image = &x[(images.start + i) * g.c * g.h * g.w..][..g.c * g.h * g.w];
            with_tmp(g.c * pplane + tallest * g.ow * nr, |tmp| {
                let (xt, partial) = tmp.split_at_mut(g.c * pplane);
                let (top, rows) = ((ys.start * g.sh) as i64, Padded::rows_read(g, ys.len()));
                for (src, dst) in image
                    .chunks_exact(g.h * g.w)
                    .zip(xt.chunks_exact_mut(pplane))
                {
                    padded_plane(src, (g.h, g.w, g.pt - top, g.pl), (pd.wp, rows), dst);
                }
                let at = Band {
                    xp: xt,
                    x0: 0,
                    y0: ys.start,
                    pplane,
                    wp: pd.wp,
                    steps: &steps,
                    ys,
                };
                task(i, 0..panels, &at, partial);
            })
        });
        return;
    }
    let groups = want.div_ceil(images.len().max(1)).min(panels);
    let per_group = panels.div_ceil(groups);
    let groups = panels.div_ceil(per_group);
    let bands = want.div_ceil(images.len() * groups).min(g.oh).max(1);
    let per_band = g.oh.div_ceil(bands);
    let bands = g.oh.div_ceil(per_band);
    let pplane = pd.plane();
    let steps = TapSteps::new(&pd.offs, g.c, pplane);
    with_scratch(images.len() * g.c * pplane, |xp| {
        crate::parallel::for_each_chunk_mut(xp, pplane, |i, dst| {
            let src = &x[(images.start * g.c + i) * g.h * g.w..][..g.h * g.w];
            padded_plane(src, (g.h, g.w, g.pt, g.pl), (pd.wp, pd.hp), dst);
        });
        let xp = &*xp;
        crate::parallel::for_each_index(images.len() * groups * bands, |t| {
            let (i, t) = (t / (groups * bands), t % (groups * bands));
            let (group, band) = (t / bands, t % bands);
            let ys = band * per_band..((band + 1) * per_band).min(g.oh);
            let ps = group * per_group..((group + 1) * per_group).min(panels);
            let at = Band {
                xp,
                x0: i * g.c * pplane,
                y0: 0,
                pplane,
                wp: pd.wp,
                steps: &steps,
                ys: ys.clone(),
            };
            with_tmp(ys.len() * g.ow * nr, |partial| task(i, ps, &at, partial))
        });
    });
}

/// Whether [`implicit_path`]'s tasks are bands that pad their own input rows: where an
/// image's padded planes hold at least as many floats as W (`m x c x taps`), which each such
/// task then reads whole (resnet50's 128 -> 128 3x3/2 on 56x56: 1.7 MB of planes, 0.6 MB of
/// W), rather than the panels splitting W between tasks that each read every plane.
fn bands_own_planes(g: &Geom2, pd: &Padded) -> bool {
    pd.plane() >= g.m * pd.offs.len()
}

/// [`bands_own_planes`] of `g`, for the tests.
#[cfg(test)]
pub(in crate::conv) fn bands_own_planes_of(g: &Geom2) -> bool {
    bands_own_planes(g, &Padded::of(g))
}

/// A task's band of output rows `ys` of one image: its padded planes (`pplane` floats, rows
/// of `wp`, the first that of output row `y0`) from `x0` in `xp`, and where each k step
/// reads in them.
struct Band<'a> {
    xp: &'a [f32],
    x0: usize,
    y0: usize,
    pplane: usize,
    wp: usize,
    steps: &'a TapSteps,
    ys: Range<usize>,
}

/// Panel `p`'s channels of the band into the output at `c0` (the panel's first channel),
/// over the input channels in chunks whose part of the panel stays in L2 while every block
/// of the band reads it ([`CHUNK_BYTES`]; a 256 -> 384 conv's 442 KB panel on 13x13 streamed
/// from L3 for every 7-pixel block), each block's sums kept in `partial` between chunks.
/// Each output row in blocks of equal size (to a pixel) of at most the panel's block rows.
fn band_product(
    g: &Geom2,
    w: &PackedB,
    p: usize,
    at: &Band,
    partial: &mut [f32],
    (optr, c0): (OutPtr, usize),
) {
    let (nr, taps) = (w.panel_width(), at.steps.taps());
    let chunks = (g.c * taps * nr * size_of::<f32>()).div_ceil(CHUNK_BYTES);
    let per_chunk = g.c.div_ceil(chunks);
    let blocks = g.ow.div_ceil(w.block_rows());
    let end = at.ys.end * g.ow;
    for k0 in (0..g.c).step_by(per_chunk) {
        let chunk = k0..(k0 + per_chunk).min(g.c);
        let (first_chunk, last_chunk) = (k0 == 0, chunk.end == g.c);
        for y in at.ys.clone() {
            let row = at.x0 + (y - at.y0) * g.sh * at.wp;
            let mut x0 = 0;
            for blk in 0..blocks {
                let r = g.ow / blocks + usize::from(blk < g.ow % blocks);
                let a = MatRef {
                    data: at.xp,
                    offset: row + x0 * g.sw,
                    rs: g.sw,
                    cs: at.pplane,
                };
                let first = y * g.ow + x0;
                let sums = partial[(first - at.ys.start * g.ow) * nr..][..r * nr].as_mut_ptr();
                let init = (!first_chunk).then_some(sums.cast_const());
                let out = match last_chunk {
                    // SAFETY (of the pointer): in bounds, the caller's check.
                    true => BlockOut::Transposed {
                        c: unsafe { optr.ptr().add(c0 + first) },
                        ldc: g.oh * g.ow,
                        room: end - first,
                    },
                    false => BlockOut::Partial(sums),
                };
                // The block's place among those over this chunk: the stretch it fetches ahead.
                let nth = (y - at.ys.start) * blocks + blk;
                // SAFETY: AVX2 or AVX-512 (the packed path's `applies`); the panel's channels'
                // floats from `first` to the band's end are in bounds (the caller's check) and
                // written by this task only (tasks are distinct (image, band, panel group)
                // triples); `sums` is this block's `r x nr` of the task's partial sums. A's
                // reads are checked by the callee.
                unsafe { taps_block(r, (a, at.steps), (w, p, chunk.clone(), nth), init, out) };
                x0 += r;
            }
        }
    }
}
