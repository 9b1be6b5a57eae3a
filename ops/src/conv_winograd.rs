//! Winograd convolution for Conv 3x3, stride 1, dilation 1, group 1 (any pads, any N), in two
//! variants ([`Variant`]): F(4x4, 3x3) on planes of at least 784 output pixels (each 4x4 tile
//! of outputs from the 6x6 input patch under it: 36 multiplications per (input, output
//! channel) pair instead of 144, `conv_winograd_f4.rs`), F(2x2, 3x3) on smaller ones (16
//! instead of 36, `conv_winograd_f2.rs`), where F(4x4, 3x3)'s 2.25x larger transformed weights
//! and thinner GEMMs lose (docs/bench.md, "Winograd F(4x4, 3x3) on large planes").
//!
//! Sits between `conv_cpu.rs`'s path choice ([`applies`]) and the shared CPU GEMM
//! (`cpu_gemm.rs`) or the taps path's kernel (`conv_taps.rs`, [`tiled`]); the variants'
//! transforms sit below it. The weights are transformed (`U = G g G^T`, one value per
//! transform point and (oc, c), layout `[oc][point][c]`, or `[block][point][c][8]` for the taps
//! kernel: [`weights_len`]) once per call, or once for good where the op keeps them (a
//! constant W, `Conv::with_constant_weight`); then per image, in blocks of tile rows (bounded
//! scratch): the input transform (`V = B^T d B`, layout `[c][point][slot]`), one GEMM per
//! transform point `M[p] = U[p] (K x C) x V[p] (C x slots)`, and the output transform
//! (`Y = A^T M A`) with the bias and the fused activation (on AVX-512 in registers straight
//! into the output rows with the bias and a Relu, any other activation in a pass after:
//! `conv_winograd_out_avx512.rs`). Large planes
//! run one block per task (all of it on one thread); small ones parallelise each phase of a
//! block (channels, points, output channels).
//! A row range (`(n, oc, oh)` lines) becomes the rectangles of `conv_cpu::rects`; each is
//! computed from the tiles overlapping its output rows and writes only the rows inside it, so
//! CPU/GPU row splits see the same values as a whole run.
//!
//! A block's tiles sit in `tw + 1` slots per tile row (the last a padding slot), so every
//! transform step is one pass over the whole block and vectorises through
//! [`kernel!`](crate::simd::kernel). The result differs from direct summation by rounding
//! only (checked against an f64 loop in the tests; F(4x4, 3x3)'s coefficients up to 8 round a
//! few times more than F(2x2, 3x3)'s 0, +-1 and 1/2).

use super::taps::{pack_weights, tile, InKernel, TileOut, MR, NP};
use super::{epilogue, rects, with_scratch, with_tmp, OutPtr};
use crate::conv::{Epilogue, Geom2};
use crate::cpu_gemm::{sgemm_raw, MatRef, Threads};
use std::ops::Range;

#[path = "conv_winograd_f2.rs"]
mod f2;

#[path = "conv_winograd_f4.rs"]
mod f4;

#[cfg(target_arch = "x86_64")]
#[path = "conv_winograd_out_avx512.rs"]
mod out_avx512;

/// Which Winograd transform a conv runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::conv) enum Variant {
    /// F(2x2, 3x3): 16 points per 2x2 tile.
    F2,
    /// F(4x4, 3x3): 36 points per 4x4 tile.
    F4,
}

/// Output pixels per image from which F(4x4, 3x3) runs (28x28), and (input, output) channel
/// pairs below which it does: measured 1.1-1.4x faster than F(2x2, 3x3) on 28x28 to 224x224
/// planes up to 128 -> 128 channels, 0.9x on 20x20 and 0.5-0.75x on 14x14 and below; 1.0-1.1x
/// for 256 -> 256 on 56x56 and 0.8x for 512 -> 512 on 28x28, where each block rereads 36
/// instead of 16 transformed weights per pair (docs/bench.md, "Winograd F(4x4, 3x3) on large
/// planes").
const F4_MIN_PIXELS: usize = 784;
const F4_MAX_PAIRS: usize = 256 * 256;

impl Variant {
    /// The variant for `g`'s output plane.
    pub(in crate::conv) fn of(g: &Geom2) -> Variant {
        if g.oh * g.ow >= F4_MIN_PIXELS && g.c * g.m < F4_MAX_PAIRS {
            Variant::F4
        } else {
            Variant::F2
        }
    }

    /// Transform points per tile.
    pub(in crate::conv) fn points(self) -> usize {
        match self {
            Variant::F2 => f2::POINTS,
            Variant::F4 => f4::POINTS,
        }
    }

    /// Output pixels per tile side.
    fn tile(self) -> usize {
        match self {
            Variant::F2 => f2::TILE,
            Variant::F4 => f4::TILE,
        }
    }

    /// Temporary floats the transforms of a block of `rows` tile rows need.
    fn tmp_len(self, t: &Tiles, rows: usize) -> usize {
        match self {
            Variant::F2 => f2::tmp_len(t, rows),
            Variant::F4 => f4::tmp_len(t, rows),
        }
    }

    /// One input channel's transformed tiles `dst` (`[p][slot]`) for tile rows `tys`.
    fn input_channel(
        self,
        t: &Tiles,
        xp: &[f32],
        tys: Range<usize>,
        dst: &mut [f32],
        tmp: &mut [f32],
    ) {
        match self {
            Variant::F2 => f2::input_channel(t, xp, tys, dst, tmp),
            Variant::F4 => f4::input_channel(t, xp, tys, dst, tmp),
        }
    }

    /// One output channel's rows `orow` (`op` holds exactly those rows) from its `mk`
    /// (`[p][slot]`, tile rows `tys`), before the bias and epilogue.
    fn output_channel(
        self,
        t: &Tiles,
        mk: &[f32],
        tys: Range<usize>,
        orow: Range<usize>,
        op: &mut [f32],
        tmp: &mut [f32],
    ) {
        match self {
            Variant::F2 => f2::output_channel(t, mk, tys, orow, op, tmp),
            Variant::F4 => f4::output_channel(t, mk, tys, orow, op, tmp),
        }
    }
}

/// Scratch floats per block of tile rows (V and M together, 4 MiB): bounds memory on large
/// images while keeping the GEMMs (one per transform point) wide enough.
const BLOCK_FLOATS: usize = 1 << 20;

/// A plane of F(4x4, 3x3) whose blocks are fewer than two a thread runs as one band of tile
/// rows per thread (each task its band's transforms and GEMMs, its own V) where its tile rows
/// split evenly over the threads, a band fills at least [`BAND_MIN_SLOTS`] slots (one call of
/// the taps kernel's 48) and its V holds at most [`BAND_MAX_V`] floats; its M then goes
/// [`BAND_M_CHANNELS`] output channels at a time. Such planes otherwise share one V, written
/// per input channel by both cores and read whole by both: where the cores sit far apart (this
/// host's slow mode) squeezenet's 16 -> 64 3x3s on 55x55 took 0.17 ms that way against 0.12-0.14
/// in bands; in the fast mode 0.089-0.091 against 0.088-0.090 (docs/bench.md, "Winograd's small
/// planes in bands"). Its F(2x2) 32 -> 128 on 27x27 gained more in the slow mode (0.18 -> 0.11)
/// but lost in the fast one (0.090 -> 0.096), and four bands (4, 4, 4, 2 tile rows on two
/// threads) had cost the fast mode 1.06x.
const BAND_MAX_V: usize = 1 << 16;
const BAND_MIN_SLOTS: usize = 48;
const BAND_M_CHANNELS: usize = 16;

/// Smallest input and output channel counts, and output pixels per image, where Winograd was
/// measured faster than im2col + GEMM inside models (docs/bench.md, "Winograd" and "Winograd
/// weights kept", both F(2x2, 3x3)). With W transformed on every call, planes below 20x20 do
/// not amortise the transform (16 floats per (oc, c) written, then read by the GEMMs): 14x14
/// measured 0.95-1.03x inside inception_v2, 7x7 0.5x. With W kept (a model constant), 14x14
/// planes measured 1.42-1.79x inside resnet50 and inception_v2 and 10x10 1.45x in a loop; 7x7
/// 0.98-1.06x stays on im2col. 16 and 32 input channels lose on small planes (GEMMs too thin).
/// Output channels from 16 win where the inputs are deep (docs/bench.md, "Winograd from 16
/// output channels"): ppocr_det's 96 -> 24 conv on 160x160 9.6-10.0 -> 5.2 ms, densenet121's
/// 128 -> 32 convs (56x56 to 14x14) 26.9 -> 18.5 ms.
const MIN_CHANNELS: usize = 64;
const MIN_OUT_CHANNELS: usize = 16;
const MIN_PIXELS: usize = 400;
const MIN_PIXELS_KEPT: usize = 100;

/// Fewest output pixels per image with W kept, and fewest input channels, where the packed
/// path reads the conv's im2col in place (`conv_implicit.rs`, AVX-512) and Winograd still
/// runs: below 14x14 that path was measured faster from fewer channels (64 -> 256 on 13x13
/// 1.10-1.36x of im2col against F(2x2, 3x3)'s 0.69-0.85x, 128 -> 256 1.11-1.15x against
/// 0.84-0.92x, 128 -> 128 on 10x10 1.56x against 1.04x); at 14x14 and up (256 -> 256 F(2x2)
/// 1.45-1.65x, in place 1.23-1.38x), and from 256 channels (384 -> 256 on 13x13 1.15-1.24x
/// against 1.09-1.10x; alexnet's 256 -> 384 1.22x slower in place in the model) Winograd
/// stays, but for 10x10 planes ([`MIN_PIXELS_DEEP_BESIDE_IMPLICIT`]).
const MIN_PIXELS_BESIDE_IMPLICIT: usize = 196;
const MAX_CHANNELS_BESIDE_IMPLICIT: usize = 255;

/// [`MIN_PIXELS_BESIDE_IMPLICIT`] where the paths built for full-width AVX-512 lose to
/// Winograd ([`winograd_over_wide_paths`](crate::simd::winograd_over_wide_paths)): on AMD
/// Zen 4 13x13 planes took 0.80-0.93x the in-place im2col's time (inception_v1's 96 -> 208 to
/// 160 -> 320, squeezenet's 64 -> 256), 10x10 ones 1.14-1.17x (yolov8n's 64 -> 64 and
/// 128 -> 128 at 320x320); on AMD Zen 5 squeezenet's 64 -> 256 on 13x13 0.94-0.95x.
const MIN_PIXELS_BESIDE_IMPLICIT_HALF_WIDTH: usize = 169;

/// Fewest output pixels per image with W kept, from [`MAX_CHANNELS_BESIDE_IMPLICIT`] + 1 input
/// channels, where the in-place path takes the conv and Winograd still runs: 10x10 planes go
/// in place. On AMD Zen 5, two threads, in the model, the two alternated process by process
/// (8 rounds): yolov8n's two 256 -> 64 3x3s on 10x10 (its head at 320x320) 0.143 and 0.141 ms
/// on F(2x2, 3x3), 0.111 and 0.100 in place; alexnet's 256 -> 384 on 13x13 stays on Winograd
/// (in place 1.22x slower in the model, [`MIN_PIXELS_BESIDE_IMPLICIT`]'s doc).
const MIN_PIXELS_DEEP_BESIDE_IMPLICIT: usize = 121;

/// Fewest input channels, and output pixels per image, where a kept W takes Winograd on a CPU
/// where the paths built for full-width AVX-512 lose to it (on AVX2, the taps path's AVX2
/// kernel, `conv_taps_avx2.rs`, took 1.1-1.6x Winograd's time on 16 -> 16 3x3 on 80x80 and
/// 32 -> 32 on 40x40, and the rest are im2col + GEMM's):
/// F(4x4, 3x3) ran 1.18-1.80x as fast as im2col from 16 channels on 28x28 to 160x160 planes,
/// 1.03x for 16 -> 16 on 40x40, F(2x2, 3x3) 1.10x for 32 -> 128 on 27x27, but 1.01-1.04x on
/// 20x20 and 13x13 (AMD Zen 3, 2 threads; docs/bench.md, "The packed GEMM on AVX2; Winograd
/// from 16 channels without AVX-512"). On AMD Zen 4 (AVX-512 at half width) squeezenet's
/// 16 -> 64 on 55x55 and 32 -> 128 on 27x27 took 0.76-0.88x the taps kernel's time, yolov8n's
/// 16 -> 16 on 80x80 and 32 -> 32 on 40x40 0.82-0.89x (docs/bench.md, "Zen 4: Winograd where
/// AVX2 hosts take it"). On AMD Zen 5 (full width), with the output transforms in registers,
/// squeezenet's 16 -> 64 on 55x55 took 0.75-0.82x, 32 -> 128 on 27x27 0.78-0.79x.
const MIN_CHANNELS_WITHOUT_TAPS: usize = 16;
const MIN_PIXELS_WITHOUT_TAPS: usize = 729;

/// Whether `TANDEM_CONV_WINOGRAD=0` turned Winograd off (read once).
pub(in crate::conv) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CONV_WINOGRAD").as_deref() != Ok("0"))
}

/// Whether the geometry is one Winograd computes: 3x3, stride 1, dilation 1,
/// group 1, non-empty output.
pub(in crate::conv) fn supports(g: &Geom2) -> bool {
    (g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.group) == (3, 3, 1, 1, 1, 1, 1) && g.oh * g.ow > 0
}

/// Whether `conv_cpu` takes the Winograd path: supported, enabled, and channels and plane
/// large enough to be measured faster than im2col + GEMM, with W transformed per call or
/// `kept` ([`Conv::with_constant_weight`](crate::conv::Conv::with_constant_weight)); a kept
/// W the packed path reads in place needs [`MIN_PIXELS_BESIDE_IMPLICIT`] below 256 channels
/// ([`MIN_PIXELS_BESIDE_IMPLICIT_HALF_WIDTH`] where the paths built for full-width AVX-512
/// lose to Winograd), [`MIN_PIXELS_DEEP_BESIDE_IMPLICIT`] from 256, and one of few channels
/// [`MIN_PIXELS_WITHOUT_TAPS`] there too.
pub(in crate::conv) fn applies(g: &Geom2, kept: bool) -> bool {
    let full_width = !crate::simd::winograd_over_wide_paths();
    let min_pixels = match kept {
        true if super::implicit::takes_kept(g) => {
            match (g.c <= MAX_CHANNELS_BESIDE_IMPLICIT, full_width) {
                (true, true) => MIN_PIXELS_BESIDE_IMPLICIT,
                (true, false) => MIN_PIXELS_BESIDE_IMPLICIT_HALF_WIDTH,
                (false, _) => MIN_PIXELS_DEEP_BESIDE_IMPLICIT,
            }
        }
        true => MIN_PIXELS_KEPT,
        false => MIN_PIXELS,
    };
    let few_channels = kept
        && g.c >= MIN_CHANNELS_WITHOUT_TAPS
        && g.oh * g.ow >= MIN_PIXELS_WITHOUT_TAPS
        && !full_width;
    supports(g)
        && (g.c >= MIN_CHANNELS || few_channels)
        && g.m >= MIN_OUT_CHANNELS
        && g.oh * g.ow >= min_pixels
        && enabled()
}

/// Tile-grid numbers shared by the transforms.
#[derive(Debug, Clone, Copy)]
struct Tiles {
    h: usize,
    w: usize,
    pt: i64,
    pl: i64,
    ow: usize,
    /// Tiles per tile row: `ceil(ow / tile)`.
    tw: usize,
}

impl Tiles {
    /// The tile grid of variant `v` over `g`'s output.
    fn of(v: Variant, g: &Geom2) -> Tiles {
        Tiles {
            h: g.h,
            w: g.w,
            pt: g.pt,
            pl: g.pl,
            ow: g.ow,
            tw: g.ow.div_ceil(v.tile()),
        }
    }

    /// Tile rows per block (at least one, at most `tile_rows`): as many as keep V and M of
    /// `c` input and `m` output channels over `points` transform points within `budget`
    /// floats.
    fn block_rows(
        &self,
        budget: usize,
        points: usize,
        (c, m): (usize, usize),
        tile_rows: usize,
    ) -> usize {
        (budget / (points * (c + m) * self.row_slots())).clamp(1, tile_rows)
    }

    /// Tile rows per band where `tile_rows` of variant `v` (in blocks of `block_rows`) run as
    /// one band per thread ([`BAND_MAX_V`]), for `c` input channels; `None` where they do not.
    fn band_rows(
        &self,
        (v, c): (Variant, usize),
        (tile_rows, block_rows): (usize, usize),
        threads: usize,
    ) -> Option<usize> {
        let rows = tile_rows / threads.max(1);
        let (slots, points) = (self.slots(rows), v.points());
        (v == Variant::F4
            && threads > 1
            && tile_rows.div_ceil(block_rows.max(1)) < 2 * threads
            && tile_rows.is_multiple_of(threads)
            && slots >= BAND_MIN_SLOTS
            && c * points * slots <= BAND_MAX_V)
            .then_some(rows)
    }

    /// Slots per tile row: `tw + 1` (the last is padding, so every transform is one pass over
    /// the whole block; its GEMM column is ignored).
    fn row_slots(&self) -> usize {
        self.tw + 1
    }

    /// Tile slots of a block of `rows` tile rows.
    fn slots(&self, rows: usize) -> usize {
        rows * self.row_slots()
    }
}

/// One block: image, output channels, tile rows, and the output rows (inside both the
/// block's tile rows and its rectangle) it writes.
type Block = (usize, Range<usize>, Range<usize>, Range<usize>);

/// Output lines `rows` (`(n, oc, oh)`) of a convolution [`supports`] accepts, computed by
/// Winograd variant `v` (`kept`, if given, transformed for it); `ep` applied after the bias.
///
/// Work is cut into blocks of tile rows (V and M of a block within [`block_floats`]). With at
/// least two blocks per thread, each block is one task (transforms and GEMMs on one thread,
/// in its cache). Small planes whose tile rows split into one band a thread
/// ([`BAND_MAX_V`]) run so too, a band's M a few output channels at a time. Otherwise (small
/// planes) blocks run one after another, each with its input
/// transform parallel over input channels into a V shared by the threads, then GEMMs and
/// output transform parallel over parts of its output channels, each part's M in its task's
/// own temporaries ([`with_tmp`]), reused while hot: as one buffer shared by the threads, M
/// (1.8 MB for resnet50's 64 -> 64 on 56x56) was written cold at a run's first such conv,
/// which took 0.5 ms against 0.3 for the same conv later in the run (docs/bench.md,
/// "Winograd's M per task").
#[allow(clippy::too_many_arguments)]
pub(in crate::conv) fn winograd_path(
    v: Variant,
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&[f32], Option<&[f32]>, Epilogue),
    kept: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    debug_assert!(supports(g));
    let (tile, points) = (v.tile(), v.points());
    let t = Tiles::of(v, g);
    let threads = rayon::current_num_threads().max(1);
    let img_rows = g.m * g.oh;
    let budget = block_floats();
    let mut blocks: Vec<Block> = Vec::new();
    let mut banded = true;
    for n in rows.start / img_rows..rows.end.div_ceil(img_rows) {
        let lo = n * img_rows;
        let q = rows.start.max(lo) - lo..rows.end.min(lo + img_rows) - lo;
        if q.is_empty() {
            continue;
        }
        for r in rects(g, 0, q) {
            let orow = r.pix.start / g.ow..r.pix.end / g.ow;
            let tys = orow.start / tile..orow.end.div_ceil(tile);
            let bt = t.block_rows(budget, points, (g.c, r.oc.len()), tys.len());
            let bands = t.band_rows((v, g.c), (tys.len(), bt), threads);
            banded &= bands.is_some();
            let bt = bands.unwrap_or(bt);
            let mut ty = tys.start;
            while ty < tys.end {
                let te = (ty + bt).min(tys.end);
                let wr = orow.start.max(tile * ty)..orow.end.min(tile * te);
                blocks.push((n, r.oc.clone(), ty..te, wr));
                ty = te;
            }
        }
    }
    let oc_lo = blocks.iter().map(|k| k.1.start).min().unwrap_or(0);
    let oc_hi = blocks.iter().map(|k| k.1.end).max().unwrap_or(0);
    let optr = OutPtr(out.as_mut_ptr(), out.len());
    let tiles = tiled(v, g);
    let ulen = match kept {
        Some(_) => 0,
        None => weights_len(v, g, oc_hi - oc_lo),
    };
    let many = blocks.len() >= 2 * threads || threads == 1 || banded;
    let tb_max = blocks.iter().map(|k| t.slots(k.2.len())).max().unwrap_or(0);
    let vshared = if many { 0 } else { g.c * points * tb_max };
    with_scratch(ulen + vshared, |buf| {
        let (own, rest) = buf.split_at_mut(ulen);
        let vbuf = &mut rest[..vshared];
        // U and its first output channel.
        let u: (&[f32], usize) = match kept {
            Some(all) => (all, 0),
            None => {
                transform_weights(v, g, w, oc_lo..oc_hi, own);
                (own, oc_lo)
            }
        };
        let xn = |n: usize| &x[n * g.c * g.h * g.w..][..g.c * g.h * g.w];
        // The output transform in registers on AVX-512 (`out_avx512`), with the bias and a
        // Relu; any other epilogue in one pass over each channel's rows after it.
        #[cfg(target_arch = "x86_64")]
        let (in_registers, fused) = (crate::simd::avx512(), out_avx512::applies(ep));
        // Output transform of channels `oc` of block `(n, tys, wr)` from their `mm`.
        let outputs = |(n, oc, tys, wr): (usize, Range<usize>, &Range<usize>, &Range<usize>),
                       mm: &[f32],
                       tmp: &mut [f32]| {
            let tb = t.slots(tys.len());
            for (k, mk) in oc.clone().zip(mm.chunks_exact(points * tb)) {
                let at = ((n * g.m + k) * g.oh + wr.start) * g.ow;
                let len = wr.len() * g.ow;
                assert!(at + len <= optr.1, "Winograd output block out of bounds");
                // SAFETY: in bounds (checked); tasks write disjoint (channel, row) blocks:
                // rectangles partition the range, blocks their rows, chunks their channels.
                let op = unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(at), len) };
                let bias = b.map(|b| b[k]);
                #[cfg(target_arch = "x86_64")]
                if in_registers {
                    let relu = fused && ep.act == crate::conv::Activation::Relu;
                    // SAFETY: `in_registers` checked AVX-512; `op` holds rows `wr`, inside the
                    // tile rows `tys` of `mk`.
                    unsafe {
                        out_avx512::output_channel(
                            v,
                            &t,
                            mk,
                            tys.clone(),
                            wr.clone(),
                            op,
                            (bias, relu),
                        )
                    };
                    if !fused {
                        epilogue(op, None, None, ep);
                    }
                    continue;
                }
                v.output_channel(&t, mk, tys.clone(), wr.clone(), op, tmp);
                // One line: the channel's rows, one bias (a call per row of a small plane cost
                // more than its work).
                epilogue(op, bias, None, ep);
            }
        };
        if many {
            let run = |(n, oc, tys, wr): &Block| {
                let tb = t.slots(tys.len());
                let vlen = g.c * points * tb;
                // A small V's M (every band's) a few output channels at a time (`BAND_MAX_V`).
                let kc = match vlen <= BAND_MAX_V {
                    true => BAND_M_CHANNELS.min(oc.len()),
                    false => oc.len(),
                };
                let mlen = kc * points * tb;
                with_tmp(vlen + mlen + v.tmp_len(&t, tys.len()), |buf| {
                    let (vt, rest) = buf.split_at_mut(vlen);
                    let (mm, tmp) = rest.split_at_mut(mlen);
                    for (c, dst) in vt.chunks_exact_mut(points * tb).enumerate() {
                        let xp = &xn(*n)[c * g.h * g.w..][..g.h * g.w];
                        v.input_channel(&t, xp, tys.clone(), dst, tmp);
                    }
                    for k0 in oc.clone().step_by(kc.max(1)) {
                        let ks = k0..(k0 + kc).min(oc.end);
                        let mm = &mut mm[..ks.len() * points * tb];
                        let mp = OutPtr(mm.as_mut_ptr(), mm.len());
                        for p in 0..points {
                            // SAFETY: `mm` is this task's own buffer.
                            unsafe { point_product(tiles, u, vt, (g.c, &ks, tb), (p, points), mp) };
                        }
                        outputs((*n, ks.clone(), tys, wr), mm, tmp);
                    }
                })
            };
            if threads > 1 {
                crate::parallel::for_each_ref(&blocks, run);
            } else {
                blocks.iter().for_each(run);
            }
            return;
        }
        for (n, oc, tys, wr) in &blocks {
            let tb = t.slots(tys.len());
            let vt = &mut vbuf[..g.c * points * tb];
            let cper = g.c.div_ceil(4 * threads);
            crate::parallel::for_each_chunk_mut(vt, points * tb * cper, |ci, chunk| {
                with_tmp(v.tmp_len(&t, tys.len()), |tmp| {
                    for (i, dst) in chunk.chunks_exact_mut(points * tb).enumerate() {
                        let xp = &xn(*n)[(ci * cper + i) * g.h * g.w..][..g.h * g.w];
                        v.input_channel(&t, xp, tys.clone(), dst, tmp);
                    }
                })
            });
            let vt = &*vt;
            // Each task: its output channels' point GEMMs, then their output transform, while
            // their M is in its cache.
            let kper = oc.len().div_ceil(4 * threads).next_multiple_of(MR);
            let parts: Vec<Range<usize>> = (oc.start..oc.end)
                .step_by(kper)
                .map(|k0| k0..(k0 + kper).min(oc.end))
                .collect();
            crate::parallel::for_each_ref(&parts, |ks| {
                let mlen = ks.len() * points * tb;
                with_tmp(mlen + v.tmp_len(&t, tys.len()), |buf| {
                    let (mm, tmp) = buf.split_at_mut(mlen);
                    let mp = OutPtr(mm.as_mut_ptr(), mm.len());
                    for p in 0..points {
                        // SAFETY: the task's own rows `[k - ks.start][p][..]` of `mm`.
                        unsafe { point_product(tiles, u, vt, (g.c, ks, tb), (p, points), mp) };
                    }
                    outputs((*n, ks.clone(), tys, wr), mm, tmp)
                })
            });
        }
    });
}

/// Tile rows per band of a whole plane of `g` at `threads` threads (`Tiles::band_rows`), for
/// the tests.
#[cfg(test)]
pub(in crate::conv) fn bands_of(v: Variant, g: &Geom2, threads: usize) -> Option<usize> {
    let t = Tiles::of(v, g);
    let tile_rows = g.oh.div_ceil(v.tile());
    let block_rows = t.block_rows(BLOCK_FLOATS, v.points(), (g.c, g.m), tile_rows);
    t.band_rows((v, g.c), (tile_rows, block_rows), threads)
}

/// Scratch floats per block ([`BLOCK_FLOATS`], or the test hook's budget).
fn block_floats() -> usize {
    #[cfg(test)]
    if let Some(b) = TEST_BLOCK.with(|c| c.get()) {
        return b;
    }
    BLOCK_FLOATS
}

/// Whether the GEMM of each transform point of `g` runs on the taps path's kernel
/// (`conv_taps.rs`'s `tile`: 8 output channels x 48 slots in registers over all input
/// channels, V's rows read in place, the sums stored straight into M's rows) with U in its
/// blocks of output channels, rather than on the `gemm` crate, which packs U and V on every
/// call: AVX-512, at most [`MAX_TILED_CHANNELS`] input channels, blocks whose slots fill at
/// least [`MIN_TILED_SHARE`] of the kernel's vectors of 16, `TANDEM_WINOGRAD_TILES=0` turning
/// it off (read once). Those GEMMs are thin (K is the input channels: 16 to 64 in squeezenet,
/// whose Winograd convs spent most of their time in the crate's micro-kernel): on AMD Zen 4,
/// the models' nodes alternated process by process, squeezenet's 16 -> 64 on 55x55 and
/// 32 -> 128 on 27x27 took 0.88-0.95x of the crate's time, 64 -> 256 on 13x13 0.93-0.95x,
/// resnet50's 64 -> 64 on 56x56 and 128 -> 128 on 28x28 0.90-0.98x, vgg19's 128 -> 128 on
/// 112x112 0.95x (docs/bench.md, "Winograd's point GEMMs on the taps kernel").
pub(in crate::conv) fn tiled(v: Variant, g: &Geom2) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // The slots of a whole image's block ([`winograd_path`]'s plan, without the test hook).
    let t = Tiles::of(v, g);
    let rows = t.block_rows(
        BLOCK_FLOATS,
        v.points(),
        (g.c, g.m),
        g.oh.div_ceil(v.tile()),
    );
    let slots = t.slots(rows);
    g.c <= MAX_TILED_CHANNELS
        && (slots as f64) >= MIN_TILED_SHARE * slots.next_multiple_of(16) as f64
        && crate::simd::avx512()
        && *ON.get_or_init(|| std::env::var("TANDEM_WINOGRAD_TILES").as_deref() != Ok("0"))
}

/// Most input channels where [`tiled`] holds: the kernel reads a run of 48 slots of V over
/// all of them for each block of 8 output channels, 24 KB at 128 channels (in a 32 KB L1).
/// vgg19's 256 -> 256 on 56x56 took 1.08x the crate's time.
const MAX_TILED_CHANNELS: usize = 128;

/// Least share of the kernel's positions a block's slots fill where [`tiled`] holds (a
/// block's last tile computes only the vectors its slots reach: squeezenet's 64 -> 256 on
/// 13x13, 56 slots, runs 48 and 16 of them). Before the short tiles did, 56 slots as 48 and 48
/// took 1.06-1.13x the crate's time, vgg19's blocks of 60 slots 1.19x.
const MIN_TILED_SHARE: f64 = 0.8;

/// Floats of U for `ocs` output channels of `g`: `[oc][p][c]`, or where [`tiled`]
/// `[block][p][c][MR]` (`[oc][p][c]` in the taps kernel's blocks of `MR` channels from the
/// first, the last padded with zeros: `taps::pack_weights`) and `MR` more (a range that starts
/// mid-block reads its block from an offset).
pub(in crate::conv) fn weights_len(v: Variant, g: &Geom2, ocs: usize) -> usize {
    match tiled(v, g) {
        true => v.points() * ocs.div_ceil(MR) * g.c * MR + MR,
        false => ocs * v.points() * g.c,
    }
}

/// U (`(G g G^T)[p]`, laid out as [`weights_len`] says) of variant `v` for output channels
/// `ocs` of `w` (`[M][C][3][3]`); parallel over channels.
pub(in crate::conv) fn transform_weights(
    v: Variant,
    g: &Geom2,
    w: &[f32],
    ocs: Range<usize>,
    u: &mut [f32],
) {
    let c = g.c;
    let wk = &w[ocs.start * c * 9..ocs.end * c * 9];
    let per_channel = |dst: &mut [f32]| {
        crate::parallel::for_each_chunk_mut(dst, v.points() * c, |k, uk| {
            let gk = &wk[k * 9 * c..][..9 * c];
            match v {
                Variant::F2 => f2::weights_of_channel(gk, uk),
                Variant::F4 => f4::weights_of_channel(gk, uk),
            }
        })
    };
    if !tiled(v, g) {
        return per_channel(&mut u[..ocs.len() * v.points() * c]);
    }
    let mut rows = vec![0.0; ocs.len() * v.points() * c];
    per_channel(&mut rows);
    // Each output channel's row `[p][c]` as the taps of one input channel.
    let packed = ocs.len().div_ceil(MR) * v.points() * c * MR;
    pack_weights(&rows, v.points() * c, 1, 0..ocs.len(), &mut u[..packed]);
    u[packed..].fill(0.0);
}

#[cfg(test)]
thread_local! {
    /// Testing hook: the block budget of calls on this thread (tiny budgets give one tile row
    /// per block, so the one-task-per-block schedule runs on small planes too).
    pub(in crate::conv) static TEST_BLOCK: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// `a[i] = src[2 i]`, `b[i] = src[2 i + 1]` (`src` holds `2 a.len()` values). Both variants'
/// column splits go through this pair and [`interleave`]: these loops vectorise, 4-wide ones
/// and `chunks_exact(2)` ones did not.
#[inline(always)]
fn deinterleave(src: &[f32], a: &mut [f32], b: &mut [f32]) {
    let n = a.len().min(b.len()).min(src.len() / 2);
    let (src, a, b) = (&src[..2 * n], &mut a[..n], &mut b[..n]);
    for i in 0..n {
        a[i] = src[2 * i];
        b[i] = src[2 * i + 1];
    }
}

/// `dst[2 i] = a[i]`, `dst[2 i + 1] = b[i]`.
#[inline(always)]
fn interleave(a: &[f32], b: &[f32], dst: &mut [f32]) {
    let n = a.len().min(b.len()).min(dst.len() / 2);
    let (a, b, dst) = (&a[..n], &b[..n], &mut dst[..2 * n]);
    for i in 0..n {
        dst[2 * i] = a[i];
        dst[2 * i + 1] = b[i];
    }
}

/// `N` disjoint rows of `len` floats, `stride` apart, from the start of `buf`.
#[inline(always)]
fn rows_mut<const N: usize>(buf: &mut [f32], stride: usize, len: usize) -> [&mut [f32]; N] {
    let mut rows = buf.chunks_mut(stride);
    std::array::from_fn(|_| &mut rows.next().expect("N rows")[..len])
}

/// `mm[k - oc.start][p][slot] = sum_c U[k][p][c] * v[c][p][slot]` for output channels `oc`
/// and `tb` slots, on this thread: [`point_tiles`] where `tiles` ([`tiled`]), else
/// [`point_gemm`]. `u` holds U from output channel `u.1` on, laid out as [`weights_len`] says.
///
/// # Safety
/// As [`point_gemm`].
unsafe fn point_product(
    tiles: bool,
    (u, u0): (&[f32], usize),
    v: &[f32],
    (c, oc, tb): (usize, &Range<usize>, usize),
    (p, points): (usize, usize),
    mm: OutPtr,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match tiles {
            true => point_tiles((u, u0), v, (c, oc, tb), (p, points), mm),
            false => point_gemm(
                u,
                (oc.start - u0) * points * c,
                v,
                (c, oc.len(), tb),
                (p, points),
                mm,
            ),
        }
    }
}

/// [`point_product`] on the taps kernel: each block of up to `MR` output channels (cut where
/// `oc` starts or ends inside one) over the slots in runs of `NP`.
///
/// # Safety
/// As [`point_gemm`]; AVX-512 present ([`tiled`]), `u` in its blocks.
unsafe fn point_tiles(
    (u, u0): (&[f32], usize),
    v: &[f32],
    (c, oc, tb): (usize, &Range<usize>, usize),
    (p, points): (usize, usize),
    mm: OutPtr,
) {
    let ld = points * tb;
    let block = c * MR;
    let blocks = (u.len() - MR) / (points * block);
    assert!(
        oc.start >= u0 && oc.end - u0 <= blocks * MR && (c - 1) * ld + p * tb + tb <= v.len(),
        "Winograd point {p}: channels {oc:?} of U from {u0} ({blocks} blocks), V of {}",
        v.len()
    );
    assert!(
        oc.len() * ld <= mm.1,
        "Winograd point {p}: M of {} floats",
        mm.1
    );
    let plain = InKernel::of(None, None, Epilogue::default());
    let mut k = oc.start;
    while k < oc.end {
        let (mb, off) = ((k - u0) / MR, (k - u0) % MR);
        let ks = k..(u0 + (mb + 1) * MR).min(oc.end);
        let wb = &u[(mb * points + p) * block + off..][..block];
        for s in (0..tb).step_by(NP) {
            let to = TileOut::of(&ks, ld, (tb - s).min(NP), plain, None);
            // SAFETY: AVX-512 ([`tiled`]); V's rows `c` at stride `ld` from slot `p tb + s` are
            // read at fewer than `tb - s` slots, M's rows `ks` at stride `ld` written at as
            // many, both in bounds (checked above); the caller gives this call those rows.
            unsafe {
                let x = v.as_ptr().add(p * tb + s);
                tile(
                    x,
                    ld,
                    c,
                    &[0],
                    wb,
                    mm.ptr().add((k - oc.start) * ld + p * tb + s),
                    to,
                )
            };
        }
        k = ks.end;
    }
}

/// GEMM of transform point `p` (of `points`):
/// `mm[k][p][slot] = sum_c u[a0 + k][p][c] * v[c][p][slot]`
/// for `kr` output channels and `tb` slots, on this thread.
///
/// # Safety
/// `mm` points to `mm_len` floats; no other thread accesses the rows `[k][p][..]` it writes.
#[allow(clippy::too_many_arguments)]
unsafe fn point_gemm(
    u: &[f32],
    a0: usize,
    v: &[f32],
    (c, kr, tb): (usize, usize, usize),
    (p, points): (usize, usize),
    mm: OutPtr,
) {
    let a = MatRef {
        data: u,
        offset: a0 + p * c,
        rs: points * c,
        cs: 1,
    };
    let bm = MatRef {
        data: v,
        offset: p * tb,
        rs: points * tb,
        cs: 1,
    };
    // SAFETY: sgemm_raw checks the view lies in `mm`; exclusivity is the caller's contract.
    unsafe {
        sgemm_raw(
            kr,
            tb,
            c,
            1.0,
            a,
            bm,
            0.0,
            mm.ptr(),
            mm.1,
            (p * tb, points * tb, 1),
            Threads::Single,
        )
    }
}
