//! Conv as `C = W @ X` for 1x1 convs of stride 1 without padding, on AVX-512 and AVX2 (the
//! taps kernel of each, fewer convs on AVX2: [`MAX_CHANNELS_AVX2`]): each output plane is a
//! row of C, each input plane a row of X, both read and written in place.
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
//! and keep their paths. Output channels not a multiple of 8
//! leave a block part empty (yolov8n's 64 -> 18 ran 1.2-1.6x), and a plane of one pixel fills
//! one of the kernel's 48 positions.
//!
//! Sits between `conv_cpu.rs`'s path choice ([`applies`]) and `conv_taps.rs`'s kernel.

use super::taps::{
    block_groups, block_in, image_rects, pack_weights, tile, InKernel, TileOut, MR, NP,
};
use super::{packed::finish_lines, with_scratch, OutPtr};
use crate::conv::{Epilogue, Geom2};
use crate::simd::Level;
use rayon::prelude::*;
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

/// Fewest output pixels: a plane of one pixel (a squeeze-excite block's) would fill one of
/// the kernel's 48 positions.
const MIN_PIXELS: usize = 16;

/// Input channels up to which (at most [`MAX_OUT_CHANNELS_AVX2`] output channels: up to
/// [`MAX_CHANNELS_FEW_OUT_AVX2`]), and output pixels from which, the AVX2 kernel was measured
/// faster than im2col + the `gemm` crate (AMD Zen 3, 2 threads, the paths alone alternated:
/// the `taps_speed` test; docs/bench.md, "The taps kernel on AVX2"): 16 -> 64 on 55x55
/// 1.06-1.24x, 32 -> 128 on 27x27 1.27-1.41x, 32 -> 32 on 80x80 1.00-1.08x, 64 -> 16 on 55x55
/// 1.09-1.17x. It lost from 64 channels to more outputs (64 -> 64 on 56x56 0.84-0.94x, 64 ->
/// 256 0.90-0.92x, 64 -> 64 on 40x40 0.86-1.07x), from 128 channels (128 -> 16 on 55x55
/// 0.87-1.05x, 256 -> 32 on 27x27 0.90-0.99x), and on 13x13 (48 -> 192 0.76-0.97x, 256 -> 48
/// 0.73-0.86x).
const MAX_CHANNELS_AVX2: usize = 32;
const MAX_CHANNELS_FEW_OUT_AVX2: usize = 64;
const MAX_OUT_CHANNELS_AVX2: usize = 16;
const MIN_PIXELS_AVX2: usize = 729;

/// Whether `conv_cpu` takes this path: a 1x1 conv of stride 1, unpadded, one group, a
/// multiple of 8 output channels, at least [`MIN_PIXELS`], enabled; on AVX-512 fewer than
/// 64 output channels or at most 32 input channels, on AVX2 planes of [`MIN_PIXELS_AVX2`]
/// and the channels of [`MAX_CHANNELS_AVX2`].
pub(in crate::conv) fn applies(g: &Geom2) -> bool {
    let pixels = g.oh * g.ow;
    (g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.group) == (1, 1, 1, 1, 0, 0, 1)
        && (g.oh, g.ow) == (g.h, g.w)
        && g.m.is_multiple_of(MR)
        && pixels >= MIN_PIXELS
        && match crate::simd::level() {
            Level::Avx512 => g.m <= MAX_OUT_CHANNELS || g.c <= MAX_CHANNELS_ANY_OUT,
            Level::Avx2 => {
                pixels >= MIN_PIXELS_AVX2
                    && (g.c <= MAX_CHANNELS_AVX2
                        || g.c <= MAX_CHANNELS_FEW_OUT_AVX2 && g.m <= MAX_OUT_CHANNELS_AVX2)
            }
            Level::Baseline => false,
        }
        && enabled()
}

/// Bytes of input lines a span of pixels reads (in L1 while every block of output channels
/// runs over the span).
const SPAN_BYTES: usize = 32 << 10;

/// Output lines `rows` (`(n, oc, oh)`) of a convolution [`applies`] accepts: the bias and a
/// plain Relu applied by the kernel, any other `ep` and the residual `z` in a pass over each
/// task's block after its product. `blocks` is W as [`pack_weights`] lays it out, where the
/// op keeps it; without it W is packed for the call.
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
        tasks.par_iter().for_each(|(n, oc, pix)| {
            let xn = &x[n * g.c * plane..][..g.c * plane];
            let (mb0, mb1) = (oc.start / MR, oc.end.div_ceil(MR));
            let first = (n * g.m + oc.start) * plane;
            assert!(
                first + (oc.len() - 1) * plane + pix.end <= optr.1,
                "pointwise: output block out of bounds"
            );
            // Spans of pixels whose input lines stay in L1 (one tile at least): every block
            // of output channels runs over a whole span, so that the stores of a block's
            // 8 output lines are long runs (a 12 -> 96 conv on 160x160 writes 96 planes;
            // tile by tile, each tile's stores went to all 96).
            let span = (SPAN_BYTES / (4 * g.c)).max(NP) / NP * NP;
            for s0 in pix.clone().step_by(span) {
                let s1 = (s0 + span).min(pix.end);
                for mb in mb0..mb1 {
                    let (ks, wb) = block_in(wk, g.c * MR, mb, oc);
                    let to = |p: usize| TileOut::of(&ks, plane, (s1 - p).min(NP), ke, None);
                    for p in (s0..s1).step_by(NP) {
                        // SAFETY: AVX2 or AVX-512 present (`applies`); X's planes are
                        // read at pixels `p..s1` only (`positions`), in bounds of `xn`; the
                        // output rows `ks` at those pixels are in bounds (checked above) and
                        // written by this task only (tasks are distinct (image, channels,
                        // pixels) blocks).
                        unsafe {
                            tile(
                                xn.as_ptr().add(p),
                                plane,
                                g.c,
                                &[0],
                                wb,
                                optr.ptr().add((n * g.m + ks.start) * plane + p),
                                to(p),
                            )
                        }
                    }
                }
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
