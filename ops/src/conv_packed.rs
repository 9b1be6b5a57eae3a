//! Conv as `C^T = col^T @ W^T` on W packed once: the GEMM path for convs whose W is a model
//! constant with many output channels and a long K, on AVX-512.
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
//! The packed copy is as large as W (resnet50's peak RSS 232 -> 325 MB); `TANDEM_CONV_PACKED=0`
//! turns the path off.
//!
//! Sits between `conv_cpu.rs`'s path choice ([`applies`]) and `cpu_gemm_packed.rs`.

use super::{epilogue, im2col_par, with_scratch, OutPtr};
use crate::conv::{Epilogue, Geom2};
use crate::cpu_gemm::{MatRef, Threads};
use crate::cpu_gemm_packed::{self, sgemm_packed_t, PackedB};
use rayon::prelude::*;
use std::ops::Range;

/// Fewest output channels, and fewest `K = C * kh * kw`, where the packed path was measured
/// faster than `gemm_path` (module docs): 32 output channels (a 32-column panel) for convs of
/// stride 1, 96 for strided ones, whose im2col the crate's own packing reads better.
const MIN_OUT_CHANNELS: usize = 32;
const MIN_OUT_CHANNELS_STRIDED: usize = 96;
const MIN_K: usize = 256;

/// im2col floats per block of pixels (4 MiB): bounds the scratch of a large image.
const COL_FLOATS: usize = 1 << 20;

/// Output floats per block of pixels (1 MiB).
const OUT_FLOATS: usize = 1 << 18;

/// Whether `TANDEM_CONV_PACKED=0` turned the packed path off (read once): the packed copy of
/// W is as large as W (resnet50's peak RSS 232 -> 325 MB), and A/B timing in one binary.
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CONV_PACKED").as_deref() != Ok("0"))
}

/// Whether a Conv whose W is kept (a model constant) takes the packed path for rows `rows`:
/// one group, enough output channels (for the stride) and K, whole images (a CPU/GPU split's
/// part keeps `gemm_path`), AVX-512, and not turned off ([`enabled`]).
pub(in crate::conv) fn applies(g: &Geom2, rows: &Range<usize>) -> bool {
    let img = g.m * g.oh;
    enabled()
        && g.group == 1
        && g.m
            >= match (g.sh, g.sw) {
                (1, 1) => MIN_OUT_CHANNELS,
                _ => MIN_OUT_CHANNELS_STRIDED,
            }
        && g.ckk() >= MIN_K
        && rows.start.is_multiple_of(img)
        && rows.end.is_multiple_of(img)
        && cpu_gemm_packed::available()
}

/// Images `rows / (M * OH)` of the convolution into `out`: per block of pixels, im2col (or the
/// input planes in place for a 1x1, stride-1, unpadded conv), the product on the pool, then
/// the bias and epilogue (and residual `z`) over each channel's line of the block.
pub(in crate::conv) fn packed_path(
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&PackedB, Option<&[f32]>, Epilogue),
    z: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    let (plane, ckk, img) = (g.oh * g.ow, g.ckk(), g.m * g.oh);
    let in_place =
        (g.kh, g.kw, g.sh, g.sw, g.pt, g.pl) == (1, 1, 1, 1, 0, 0) && (g.oh, g.ow) == (g.h, g.w);
    // Pixels per block: at most OUT_FLOATS outputs (the epilogue then finds them in L2), and
    // at most COL_FLOATS of im2col.
    let chunk = match in_place {
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
                // SAFETY: in bounds (checked); nothing else touches `out` during the call.
                let c = unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(first), len) };
                sgemm_packed_t(p1 - p0, a, w, c, plane, Threads::Pool);
            };
            if in_place {
                block(MatRef::row_major(xn, p0, plane).t());
            } else {
                with_scratch(ckk * (p1 - p0), |col| {
                    im2col_par(g, xn, p0, p1, col);
                    block(MatRef::row_major(col, 0, p1 - p0).t());
                });
            }
            if b.is_some() || ep != Epilogue::default() {
                (0..g.m).into_par_iter().for_each(|c| {
                    let at = (n * g.m + c) * plane + p0;
                    assert!(at + (p1 - p0) <= optr.1, "Conv bias block out of bounds");
                    // SAFETY: in bounds (checked); each channel's line is one task's.
                    let line =
                        unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(at), p1 - p0) };
                    epilogue(
                        line,
                        b.map(|b| b[c]),
                        z.map(|z| &z[at..at + line.len()]),
                        ep,
                    );
                });
            }
            p0 = p1;
        }
    }
}
