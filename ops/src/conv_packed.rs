//! Conv as `C^T = col^T @ W^T` on W packed once: the GEMM path for convs whose W is a model
//! constant with many output channels and a long K, on AVX-512 and on Zen 1's AVX2
//! ([`runs_here`]; the measurements below are AVX-512's).
//!
//! The `gemm` crate packs both operands on every call; here W (`M x K`) is packed into panels
//! of output channels the first time (`cpu_gemm_packed.rs`, kept with the op like Winograd's
//! transform) and the micro-kernel broadcasts pixels of the im2col block (or, for a 1x1 conv,
//! of the input planes, read in place) against 16-channel vectors of the panel, then stores
//! each 8-pixel x 16-channel tile transposed into the NCHW output. onnxruntime keeps its conv
//! weights packed alike. Measured (ops example, 2 threads, the product alone, against the
//! crate): magika's 256 -> 512 5x1 conv 3.57 -> 3.00 ms, resnet50's 1024 -> 256 1x1 on 14x14
//! 0.67 -> 0.47, squeezenet's last conv (512 -> 1000) 1.61 -> 0.87. With K below 256 (the
//! transposed store is a larger share) it lost, so those keep `gemm_path` (docs/bench.md,
//! "Conv weights packed once"); so did strided convs of fewer than 96 output channels. Since
//! panels can be 32 wide, unstrided ones from 32 channels win: squeezenet's 384 -> 64 1x1 on
//! 13x13 54 -> 48 us and 512 -> 64 76 -> 62 in the model, densenet's 128 -> 32 3x3 on 7x7
//! 67 -> 58 alone; strided ones (64 -> 64 3x3/2 on 56x56) stayed 3 % slower
//! (docs/bench.md, "Light-zoo weights marked constant").
//!
//! Planes of more than [`WHOLE_PLANE_MAX`] pixels (tiles) need K of 512: below it the crate
//! was faster on the Intel Xeon, the product alone interleaved in one process (2 threads):
//! resnet50's 256 -> 64 and 256 -> 128 1x1 on 56x56 1.07-1.24x and 1.12-1.24x, its 256 -> 512
//! 1x1/2 on 56x56 1.17-1.46x; at K of 288 to 480 on 28x28 the two were within noise of each
//! other (docs/bench.md, "Tiles of a short K on the crate").
//!
//! On an Intel core (Cascade Lake, two 512-bit FMA pipes) the kernel's A reads decide: a
//! transposed im2col view steps `pixels` floats from one k to the next, one new cache line per
//! step, and past a page's worth of pixels no prefetcher follows (one thread, the product alone,
//! 784 x 1152 @ 1152 x 128: 47 GFLOP/s as one block, 126 as blocks of 48 pixels). Larger
//! planes therefore run as tiles of at most 384 pixels, one task each (docs/bench.md, "Packed
//! panels on cache lines, convs in tiles").
//!
//! Convs of more than one tap with at least 8 input and 32 output channels read their
//! im2col in place from padded input planes instead (`conv_implicit.rs`, whatever K and the
//! stride): the thresholds above are for the im2col written here (1x1s, and 3-channel
//! first convs).
//!
//! The packed copy is as large as W (resnet50's peak RSS 232 -> 325 MB); `TANDEM_CONV_PACKED=0`
//! turns the path off.
//!
//! Sits between `conv_cpu.rs`'s path choice ([`applies`]) and `cpu_gemm_packed.rs`.

use super::{epilogue, im2col, im2col_par, with_scratch, OutPtr};
use crate::conv::{Epilogue, Geom2};
use crate::cpu_gemm::{MatRef, Threads};
use crate::cpu_gemm_packed::{sgemm_packed_t, sgemm_packed_t_panels, PackedB};
use std::ops::Range;

/// Fewest output channels, and fewest `K = C * kh * kw`, where the packed path was measured
/// faster than `gemm_path` (module docs): 32 output channels (a 32-column panel) for convs of
/// stride 1, 96 for strided ones, whose im2col the crate's own packing reads better; K of 256
/// on planes of at most [`WHOLE_PLANE_MAX`] pixels, of 512 on larger ones.
const MIN_OUT_CHANNELS: usize = 32;
const MIN_OUT_CHANNELS_STRIDED: usize = 96;
const MIN_K: usize = 256;
const MIN_K_TILED: usize = 512;

/// im2col floats of a task's tile of pixels (at most 256 KiB, in L2 while each panel of the
/// task reads it, one cache line per k step at a stride the prefetchers follow), within
/// [`MIN_TILE`, `MAX_TILE`] pixels.
const TILE_FLOATS: usize = 1 << 16;
const MIN_TILE: usize = 48;
const MAX_TILE: usize = 384;

/// Output planes of at most this many pixels take [`whole_plane_path`].
const WHOLE_PLANE_MAX: usize = 384;

/// [`whole_plane_path`]'s blocks of pixels: at most OUT_FLOATS outputs (the epilogue then
/// finds them in L2) and COL_FLOATS of im2col.
const OUT_FLOATS: usize = 1 << 18;
const COL_FLOATS: usize = 1 << 20;

/// Whether `TANDEM_CONV_PACKED=0` turned the packed path off (read once): the packed copy of
/// W is as large as W (resnet50's peak RSS 232 -> 325 MB), and A/B timing in one binary.
pub(super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CONV_PACKED").as_deref() != Ok("0"))
}

/// Whether this CPU runs the packed conv paths (this one and `conv_implicit.rs`): AVX-512, or
/// AVX2 on a core that splits 256-bit instructions ([`crate::simd::avx2_half_width`], AMD Zen
/// and Zen+), where both this kernel and the `gemm` crate's run at the halved FMA rate and the
/// crate packs both operands on every call. Measured there (2 threads, alternated): the
/// product alone level with the crate on a quiet host (0.86-1.15x its speed on 12 model
/// shapes), ahead on a loaded one (1.00-1.47x); the models' latency mostly 0.8-0.98x
/// (docs/bench.md, "The packed conv paths on Zen 1"). On Zen 3, whose 256-bit FMAs run whole,
/// the paths ran at 0.6-0.95x (docs/bench.md, "The packed GEMM on AVX2").
pub fn runs_here() -> bool {
    use crate::simd::{avx2_half_width, avx512, level, Level};
    avx512() || level() == Level::Avx2 && avx2_half_width()
}

/// Whether a Conv whose W is kept (a model constant) takes the packed path for rows `rows`:
/// one group, its im2col read in place (`conv_implicit.rs`) or enough output channels (for
/// the stride) and K (for the plane) to pay for writing it, whole images (a CPU/GPU split's
/// part keeps `gemm_path`), a CPU it [`runs_here`], and not turned off ([`enabled`]).
pub(in crate::conv) fn applies(g: &Geom2, rows: &Range<usize>) -> bool {
    let img = g.m * g.oh;
    let through_im2col = || {
        g.m >= match (g.sh, g.sw) {
            (1, 1) => MIN_OUT_CHANNELS,
            _ => MIN_OUT_CHANNELS_STRIDED,
        } && g.ckk()
            >= match g.oh * g.ow > WHOLE_PLANE_MAX {
                true => MIN_K_TILED,
                false => MIN_K,
            }
    };
    enabled()
        && g.group == 1
        && (super::implicit::applies(g) || through_im2col())
        && rows.start.is_multiple_of(img)
        && rows.end.is_multiple_of(img)
        && runs_here()
}

/// Images `rows / (M * OH)` of the convolution into `out`. Planes of more than
/// [`WHOLE_PLANE_MAX`] pixels run as tasks of a tile of pixels x a group of W's panels (output
/// channels), each on one thread: the im2col of its tile (or, for a 1x1, stride-1, unpadded
/// conv, the input planes read in place), the product, then the bias and epilogue (and
/// residual `z`) over each of its channels' lines of the tile. The kernel reads a new cache
/// line of im2col each k step, `pixels` floats after the last: across a whole plane's block
/// (3136 floats at 56x56) Intel's prefetchers do not follow, within a tile they do (module
/// docs).
pub(in crate::conv) fn packed_path(
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&PackedB, Option<&[f32]>, Epilogue),
    z: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    if super::implicit::applies(g) {
        return super::implicit::implicit_path(g, x, (w, b, ep), z, out, rows);
    }
    let (plane, ckk, img) = (g.oh * g.ow, g.ckk(), g.m * g.oh);
    if plane <= WHOLE_PLANE_MAX {
        return whole_plane_path(g, x, (w, b, ep), z, out, rows);
    }
    let tile = (TILE_FLOATS / ckk).clamp(MIN_TILE, MAX_TILE).min(plane);
    let tiles = plane.div_ceil(tile);
    let images = rows.start / img..rows.end / img;
    // Panel groups: only where tiles are too few to keep every thread busy twice over (each
    // group repeats its tile's im2col).
    let (panels, nr) = (w.panels(), w.panel_width());
    let wanted = 2 * rayon::current_num_threads();
    let per_group = panels.div_ceil(wanted.div_ceil(images.len() * tiles).clamp(1, panels));
    let groups = panels.div_ceil(per_group);
    let optr = OutPtr(out.as_mut_ptr(), out.len());
    let task = |t: usize| {
        let (n, t) = (images.start + t / (tiles * groups), t % (tiles * groups));
        let (p0, group) = ((t / groups) * tile, t % groups);
        let p1 = (p0 + tile).min(plane);
        let pr = group * per_group..((group + 1) * per_group).min(panels);
        let ch = pr.start * nr..(pr.end * nr).min(g.m);
        let xn = &x[n * g.c * g.h * g.w..][..g.c * g.h * g.w];
        assert!(
            (n * g.m + ch.end - 1) * plane + p1 <= optr.1,
            "Conv output tile out of bounds"
        );
        let product = |a: MatRef| {
            // SAFETY: AVX2 or AVX-512 (`applies`); the tile's pixels of channels `ch` (the
            // panels' columns below M) are in bounds (checked) and written by this task only (tasks
            // are distinct (image, tile, group) triples).
            unsafe {
                let c = optr.ptr().add(n * g.m * plane + p0);
                sgemm_packed_t_panels(p1 - p0, a, w, pr.clone(), c, plane)
            }
        };
        with_a(g, xn, (p0, p1), false, product);
        finish_lines(g, optr, (n, ch), (p0, p1 - p0), (b, z, ep));
    };
    crate::parallel::for_each_index(images.len() * tiles * groups, task);
}

/// A small plane (at most [`WHOLE_PLANE_MAX`] pixels) of each image into `out`: per block of
/// pixels (all of them but for the longest K), one im2col shared by all tasks (or the input
/// planes in place), the product on the pool, each task applying the bias and epilogue (and
/// residual `z`) to the channels x pixels it stored while they are in its cache (a pass over
/// the channels after the product took squeezenet's 512 -> 1000 1x1 on 13x13 1/0.97 the
/// time, alone). Tiles of such planes would be too few to share out
/// without each panel group repeating its tile's im2col (a 512 -> 512 3x3 on 7x7, two
/// threads: 4.2 ms whole, 6.7 as tiles).
fn whole_plane_path(
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&PackedB, Option<&[f32]>, Epilogue),
    z: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let (plane, ckk, img) = (g.oh * g.ow, g.ckk(), g.m * g.oh);
    let chunk = match in_place(g) {
        true => OUT_FLOATS / g.m,
        false => (OUT_FLOATS / g.m).min(COL_FLOATS / ckk),
    }
    .max(64);
    let optr = OutPtr(out.as_mut_ptr(), out.len());
    for n in rows.start / img..rows.end / img {
        let xn = &x[n * g.c * g.h * g.w..][..g.c * g.h * g.w];
        let mut p0 = 0;
        while p0 < plane {
            let p1 = (p0 + chunk).min(plane);
            let block = |a: MatRef| {
                let first = n * g.m * plane + p0;
                let len = (g.m - 1) * plane + (p1 - p0);
                assert!(first + len <= optr.1, "Conv output block out of bounds");
                // Each task's channels x pixels, right after it stored them.
                let finish = |ch: Range<usize>, px: Range<usize>| {
                    finish_lines(g, optr, (n, ch), (p0 + px.start, px.len()), (b, z, ep))
                };
                let c = (optr.ptr().wrapping_add(first), len, plane);
                // SAFETY: in bounds (checked); nothing else touches `out` during the call but
                // `finish`, each call on the block its task stored.
                unsafe { sgemm_packed_t((p1 - p0, a), w, c, Threads::Pool, &finish) };
            };
            with_a(g, xn, (p0, p1), true, block);
            p0 = p1;
        }
    }
}

/// The bias, residual and epilogue ([`finish_line`]) of channels `ch` of image `n` over pixels
/// `p0..p0 + len` of their planes, a line each; nothing without a bias or an epilogue.
pub(super) fn finish_lines(
    g: &Geom2,
    out: OutPtr,
    (n, ch): (usize, Range<usize>),
    (p0, len): (usize, usize),
    (b, z, ep): (Option<&[f32]>, Option<&[f32]>, Epilogue),
) {
    if b.is_none() && ep == Epilogue::default() {
        return;
    }
    let plane = g.oh * g.ow;
    for c in ch {
        finish_line(
            out,
            (n * g.m + c) * plane + p0,
            len,
            (b.map(|b| b[c]), z, ep),
        );
    }
}

/// The bias, residual (`z`, at the same offset) and epilogue of the `len` outputs at `at`: one
/// channel's line of a block of pixels.
fn finish_line(
    out: OutPtr,
    at: usize,
    len: usize,
    (bias, z, ep): (Option<f32>, Option<&[f32]>, Epilogue),
) {
    assert!(at + len <= out.1, "Conv output line out of bounds");
    // SAFETY: in bounds (checked); each line is one caller's task's, written by no one else.
    let line = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), len) };
    epilogue(line, bias, z.map(|z| &z[at..at + len]), ep);
}

/// Whether a conv reads its input planes in place as A (1x1, stride 1, unpadded).
fn in_place(g: &Geom2) -> bool {
    (g.kh, g.kw, g.sh, g.sw, g.pt, g.pl) == (1, 1, 1, 1, 0, 0) && (g.oh, g.ow) == (g.h, g.w)
}

/// `f` on A for pixels `p0..p1` of image `xn`: its input planes in place ([`in_place`]), else
/// their im2col in this thread's scratch (built on the pool where `par`).
fn with_a(g: &Geom2, xn: &[f32], (p0, p1): (usize, usize), par: bool, f: impl FnOnce(MatRef)) {
    if in_place(g) {
        return f(MatRef::row_major(xn, p0, g.oh * g.ow).t());
    }
    with_scratch(g.ckk() * (p1 - p0), |col| {
        match par {
            true => im2col_par(g, xn, p0, p1, col),
            false => im2col(g, xn, p0, p1, col),
        }
        f(MatRef::row_major(col, 0, p1 - p0).t());
    });
}
