//! Conv as `C = W @ X` for 1x1 convs of stride 1 without padding, on AVX-512 and AVX2 (the
//! taps kernel of each, fewer convs on AVX2: [`MAX_CHANNELS_AVX2`]): each output plane is a
//! row of C, each input plane a row of X, written in place and read in place (on AVX2, from
//! a copy of each span of the rows).
//!
//! The taps path's kernel (`conv_taps.rs`, one tap at offset 0) keeps 8 output channels x 48
//! pixels in registers over all input channels, loading 3 vectors of each input plane and
//! broadcasting 8 weights per input channel (a constant W kept in those blocks), and stores
//! its block straight into the NCHW output with the bias and a Relu applied: no im2col, no
//! packing of X, no transposed store. The packed path (`conv_packed.rs`) broadcasts pixels
//! against vectors of output channels instead and stores each block transposed, wasting
//! most of a 32-column panel on 16 output channels; the `gemm` crate packs X on every call.
//!
//! Measured against the path each conv took before (the product alone, 2 threads, Intel
//! Xeon, alternated in one process; docs/bench.md, "1x1 convs as W @ X"): 0.63-0.93x of the
//! time for every zoo 1x1 of fewer than 64 output channels (squeezenet's 128 -> 16 on 55x55,
//! inception_v1's 480 -> 16 and 832 -> 32), 0.58-0.79x for those of at most 32 input
//! channels (32 -> 128 on 27x27, 16 -> 64 on 55x55). From more input channels, 64 and 128
//! output channels ran 0.77-1.23x (wider ones up to 3.3x with a first version of the kernel)
//! and kept their paths there; on AMD Zen 5, inside the models, those of 128 to 256 input
//! channels (or 64 outputs) on planes from 28x28 won ([`MIN_PIXELS_WIDE`]). Output channels
//! not a multiple of 8
//! leave a block part empty (yolov8n's 64 -> 18 ran 1.2-1.6x), and a plane of one pixel fills
//! one of the kernel's 48 positions.
//!
//! On AVX2 (AMD Zen 3, 32 KB of L1) each task first copies a span of its pixels from every
//! input plane into lines next to each other, starting on a cache line, then runs every
//! block of output channels over the copy. Read in place, the lines of a span lie a plane
//! apart on few cache sets (2 threads, the paths alone alternated in one process, crate time
//! / this path's: 64 -> 256 on 56x56 0.84-1.00 in place, 1.05-1.27 copied; 128 -> 512 on
//! 28x28 0.74-1.10 and 1.09-1.12; 1024 -> 256 on 14x14 0.58-0.71 and 0.87-0.98; copied
//! faster in 45 of 46 pairs; docs/bench.md, "1x1 convs on AVX2 from copied input lines").
//! The copy also let it take more convs ([`MAX_CHANNELS_AVX2`]). Copying the input channels
//! in chunks of 16 KB, each chunk's sums continued from the stored block, lost to one copy
//! of all of them (128 -> 512 on 28x28 0.94-1.01 against 1.06-1.14). AVX-512 reads in place
//! as measured on the Intel Xeon.
//!
//! Sits between `conv_cpu.rs`'s path choice ([`applies`]) and `conv_taps.rs`'s kernel.

use super::taps::{
    block_groups, block_in, image_rects, pack_weights, tile, InKernel, TileOut, MR, NP,
};
use super::{packed::finish_lines, with_scratch, with_tmp, OutPtr};
use crate::conv::{Epilogue, Geom2};
use crate::simd::Level;
use std::ops::Range;

/// Whether `TANDEM_CONV_POINTWISE=0` turned this path off (read once).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CONV_POINTWISE").as_deref() != Ok("0"))
}

/// Output channels below which, and input channels up to which, this path was measured
/// faster than the packed path and the `gemm` crate (module docs).
const MAX_OUT_CHANNELS: usize = 63;
const MAX_CHANNELS_ANY_OUT: usize = 32;

/// On planes of at least [`MIN_PIXELS_WIDE`] (28x28), AVX-512 also takes 1x1s of
/// [`MIN_CHANNELS_WIDE`] to [`MAX_CHANNELS_WIDE`] input channels, and those of fewer input
/// channels to 64 outputs: inside the models, against the `gemm` crate (which packs W and X
/// on every call) that took them before, on AMD Zen 5 (2 threads, the binaries alternated
/// process by process, per-node medians): resnet50's 64 -> 64 on 56x56 0.85x, 256 -> 64
/// 0.92-0.96x, 128 -> 512 on 28x28 0.87x (0.93x with the residual Sum), inception_v1's 64
/// -> 64 on 56x56 0.80x, yolov8n's 128 -> 64 on 40x40 0.96x (192 -> 64 there 1.16x, the one
/// loss); 256 -> 128 on 56x56 even. From fewer input channels to more outputs it lost in
/// the model (resnet50's 64 -> 256 on 56x56 1.13x, 1.44x with its residual Sum), as did 512
/// -> 128 on 28x28 (1.05x) and every 1x1 on 14x14 and 7x7 (1.25-2.0x: 196 and 49 pixels
/// leave most of a last 48-pixel tile empty). docs/bench.md, "1x1s of up to 256 input
/// channels on the pointwise kernel".
const MIN_PIXELS_WIDE: usize = 784;
const MIN_CHANNELS_WIDE: usize = 128;
const MAX_CHANNELS_WIDE: usize = 256;
const MAX_OUT_CHANNELS_NARROW_IN: usize = 64;

/// Fewest output pixels: a plane of one pixel (a squeeze-excite block's) would fill one of
/// the kernel's 48 positions.
const MIN_PIXELS: usize = 16;

/// Input channels up to which (at most [`MAX_OUT_CHANNELS_AVX2`] output channels: up to
/// [`MAX_CHANNELS_FEW_OUT_AVX2`]), and output pixels from which, the AVX2 kernel on copied
/// spans was measured faster than im2col + the `gemm` crate, with the bias and a Relu in the
/// kernel (AMD Zen 3, 2 threads, the paths alone alternated in one process, crate time /
/// this path's, two runs; `taps_speed` lists these shapes; docs/bench.md, "1x1 convs on
/// AVX2 from copied input lines"): 64 -> 256 on 56x56 1.05-1.27x, 64 -> 64 1.03-1.31x,
/// 128 -> 128 1.13-1.25x, 96 -> 128 1.23-1.40x, 128 -> 512 on 28x28 1.09-1.12x, 128 -> 32
/// on 27x27 1.15-1.40x, 256 -> 32 1.15-1.25x, 96 -> 16 on 55x55 1.17-1.21x. From more
/// input channels to more outputs it lost (256 -> 64 on 56x56 0.89-0.92x, 512 -> 128 on
/// 28x28 0.94-0.95x, 1024 -> 256 on 14x14 0.87-0.98x), as on planes below 27x27 (480 -> 64
/// on 14x14 0.82-0.87x). With a residual or another epilogue after the product (a pass over
/// each task's block) it tied or lost (0.88-1.10x; 128 -> 512 on 28x28 0.90-0.91x, 16 ->
/// 64 on 55x55 0.88-0.92x), so AVX2 takes only convs whose whole epilogue the kernel
/// applies.
const MAX_CHANNELS_AVX2: usize = 128;
const MAX_CHANNELS_FEW_OUT_AVX2: usize = 256;
const MAX_OUT_CHANNELS_AVX2: usize = 32;
const MIN_PIXELS_AVX2: usize = 729;

/// Whether `conv_cpu` takes this path for a conv of epilogue `ep`: a 1x1 conv of stride 1,
/// unpadded, one group, a multiple of 8 output channels, at least [`MIN_PIXELS`], enabled;
/// on AVX-512 fewer than 64 output channels or at most 32 input channels (on planes of
/// [`MIN_PIXELS_WIDE`] also 128 to 256 input channels, or 64 outputs), on AVX2 planes of
/// [`MIN_PIXELS_AVX2`], the channels of [`MAX_CHANNELS_AVX2`] and an epilogue the kernel
/// applies whole.
pub(in crate::conv) fn applies(g: &Geom2, ep: Epilogue) -> bool {
    let pixels = g.oh * g.ow;
    (g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.group) == (1, 1, 1, 1, 0, 0, 1)
        && (g.oh, g.ow) == (g.h, g.w)
        && g.m.is_multiple_of(MR)
        && pixels >= MIN_PIXELS
        && match crate::simd::level() {
            Level::Avx512 => {
                g.m <= MAX_OUT_CHANNELS
                    || g.c <= MAX_CHANNELS_ANY_OUT
                    || pixels >= MIN_PIXELS_WIDE
                        && g.c <= MAX_CHANNELS_WIDE
                        && (g.c >= MIN_CHANNELS_WIDE || g.m <= MAX_OUT_CHANNELS_NARROW_IN)
            }
            Level::Avx2 => {
                pixels >= MIN_PIXELS_AVX2
                    && InKernel::whole(ep)
                    && (g.c <= MAX_CHANNELS_AVX2
                        || g.c <= MAX_CHANNELS_FEW_OUT_AVX2 && g.m <= MAX_OUT_CHANNELS_AVX2)
            }
            Level::Baseline => false,
        }
        && enabled()
}

/// Bytes of input lines a span of pixels reads (in L1 while every block of output channels
/// runs over the span), in place or copied (on AVX2 spans of 16 KB took 0.83-1.10x the time,
/// 0.99x on average over 46 convs and runs).
const SPAN_BYTES: usize = 32 << 10;

/// Floats of one cache line: the copied lines start on one.
const LINE_FLOATS: usize = 16;

/// Output lines `rows` (`(n, oc, oh)`) of a convolution [`applies`] accepts: the bias and a
/// plain Relu applied by the kernel, any other `ep` and the residual `z` (AVX-512 only) in a
/// pass over each task's block after its product. `blocks` is W as [`pack_weights`] lays it
/// out, where the op keeps it; without it W is packed for the call.
pub(in crate::conv) fn pointwise_path(
    g: &Geom2,
    x: &[f32],
    (w, blocks): (&[f32], Option<&[f32]>),
    (b, ep): (Option<&[f32]>, Epilogue),
    z: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let plane = g.oh * g.ow;
    let threads = rayon::current_num_threads().max(1);
    let rs = image_rects(g, &rows);
    let oc_hi = rs.iter().map(|r| r.1.end).max().unwrap_or(0);
    // Tasks: each rectangle's pixels in chunks of whole tiles (the last may be short), its
    // blocks of channels in groups only where the tiles are too few, about four tasks per
    // thread in all.
    let want = 4 * threads;
    let mut tasks = Vec::new();
    for (n, oc, pix) in &rs {
        let tiles = pix.len().div_ceil(NP);
        let chunks = want.div_ceil(rs.len()).min(tiles).max(1);
        let per_pixels = tiles.div_ceil(chunks) * NP;
        for p in (pix.start..pix.end).step_by(per_pixels) {
            for ks in block_groups(oc, want.div_ceil(rs.len() * chunks)) {
                tasks.push((*n, ks, p..(p + per_pixels).min(pix.end)));
            }
        }
    }
    let wlen = match blocks {
        Some(_) => 0,
        None => oc_hi.div_ceil(MR) * g.c * MR + MR,
    };
    let optr = OutPtr(out.as_mut_ptr(), out.len());
    with_scratch(wlen, |wk| {
        let wk: &[f32] = match blocks {
            Some(kept) => kept,
            None => {
                pack_weights(w, g.c, 1, 0..oc_hi, &mut wk[..wlen - MR]);
                wk
            }
        };
        let ke = InKernel::of(b, z, ep);
        crate::parallel::for_each_ref(&tasks, |(n, oc, pix)| {
            let xn = &x[n * g.c * plane..][..g.c * plane];
            let (mb0, mb1) = (oc.start / MR, oc.end.div_ceil(MR));
            let first = (n * g.m + oc.start) * plane;
            assert!(
                first + (oc.len() - 1) * plane + pix.end <= optr.1,
                "pointwise: output block out of bounds"
            );
            let run = |xs: &[f32], ld: usize, s0: usize, s1: usize| {
                for mb in mb0..mb1 {
                    let (ks, wb) = block_in(wk, g.c * MR, mb, oc);
                    let to = |p: usize| TileOut::of(&ks, plane, (s1 - p).min(NP), ke, None);
                    for p in (s0..s1).step_by(NP) {
                        // SAFETY: AVX2 or AVX-512 present (`applies`); `xs` holds the input
                        // lines at stride `ld` from pixel `s0`, read at pixels `p..s1` only
                        // (`positions`); the output rows `ks` at those pixels are in bounds
                        // (checked above) and written by this task only (tasks are distinct
                        // (image, channels, pixels) blocks).
                        unsafe {
                            tile(
                                xs.as_ptr().add(p - s0),
                                ld,
                                g.c,
                                &[0],
                                wb,
                                optr.ptr().add((n * g.m + ks.start) * plane + p),
                                to(p),
                            )
                        }
                    }
                }
            };
            // Spans of pixels whose input lines stay in L1 (one tile at least): every block
            // of output channels runs over a whole span, so that the stores of a block's
            // 8 output lines are long runs (a 12 -> 96 conv on 160x160 writes 96 planes;
            // tile by tile, each tile's stores went to all 96). On AVX2 each span's lines
            // are copied next to each other first (module docs).
            let span = (SPAN_BYTES / (4 * g.c)).max(NP) / NP * NP;
            let spans = pix
                .clone()
                .step_by(span)
                .map(|s0| (s0, (s0 + span).min(pix.end)));
            if crate::simd::avx512() {
                spans.for_each(|(s0, s1)| run(&xn[s0..], plane, s0, s1));
            } else {
                with_tmp(g.c * span + LINE_FLOATS, |buf| {
                    let at = buf.as_ptr().align_offset(64).min(LINE_FLOATS);
                    let buf = &mut buf[at..];
                    for (s0, s1) in spans {
                        for (ci, line) in buf.chunks_mut(span).take(g.c).enumerate() {
                            line[..s1 - s0].copy_from_slice(&xn[ci * plane + s0..][..s1 - s0]);
                        }
                        run(buf, span, s0, s1);
                    }
                });
            }
            if !ke.whole {
                finish_lines(
                    g,
                    optr,
                    (*n, oc.clone()),
                    (pix.start, pix.len()),
                    (b, z, ep),
                );
            }
        });
    });
}
