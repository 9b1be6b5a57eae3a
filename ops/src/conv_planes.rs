//! Undilated convolutions with one input channel per output channel (depthwise), a plane at a
//! time: the input rows a block of output rows reads are copied once into zero-padded phase
//! planes (phase `(a, b)` holds the padded input at rows `a`, `a + sh`, ... and columns `b`,
//! `b + sw`, ..., so a stride becomes a shift; only the phases a tap reads, so a stride past
//! the kernel costs no more than one equal to it), each row as long as the output row plus
//! `(kw - 1) / sw`, so that each kernel tap is one multiply-add over the whole block of output
//! rows (the columns past each row's end are computed and dropped). The line-by-line loop
//! (`conv_cpu::direct_path`) multiplies 7 to 56 elements per tap and line in the models; on
//! AVX-512 those short segments barely fill a vector, and strided ones not at all.
//!
//! Sits between `conv_cpu::direct_path` (which routes undilated `cg == 1` convs here,
//! [`applies`]) and the CPU's vector units (through [`crate::simd::kernel`]).

use super::{epilogue, Epilogue, Geom2};
use crate::shape::rows_by_block;
use rayon::prelude::*;
use std::ops::Range;

/// Whether [`plane_path`] computes `g`: no dilation.
pub(super) fn applies(g: &Geom2) -> bool {
    g.dh == 1 && g.dw == 1 && g.ow > 0
}

/// Phases a tap reads, down and across: `min(sh, kh)` by `min(sw, kw)` (tap `(ki, kj)` reads
/// phase `(ki % sh, kj % sw)`).
fn phase_grid(g: &Geom2) -> (usize, usize) {
    (g.sh.min(g.kh), g.sw.min(g.kw))
}

/// Columns of a phase plane's row: the output row plus the taps' reach past it.
fn phase_cols(g: &Geom2) -> usize {
    g.ow + (g.kw - 1) / g.sw
}

/// Output lines `rows` (`(n, oc, oh)` flattened, as in `direct_path`) of a `cg == 1`
/// convolution that [`applies`], into `out` (the whole output), `ep` applied to each block.
pub(super) fn plane_path(
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&[f32], Option<&[f32]>, Epilogue),
    out: &mut [f32],
    rows: Range<usize>,
) {
    let ow = g.ow;
    // One piece per plane the rows touch: (plane, its output rows, their block of `out`).
    let pieces = rows_by_block(&mut out[rows.start * ow..rows.end * ow], rows, g.oh, ow);
    pieces.into_par_iter().for_each_init(
        || (Vec::new(), Vec::new()),
        |(padded, acc), (plane, lines, dst)| {
            let (n, oc) = (plane / g.m, plane % g.m);
            let xplane = &x[(n * g.c + oc / g.mg) * g.h * g.w..][..g.h * g.w];
            let taps = &w[oc * g.kh * g.kw..][..g.kh * g.kw];
            let bias = b.map_or(0.0, |b| b[oc]);
            pad_phases(g, xplane, lines.clone(), padded);
            plane_lines(g, padded, taps, bias, lines.len(), acc);
            for (line, a) in dst
                .chunks_exact_mut(ow)
                .zip(acc.chunks_exact(phase_cols(g)))
            {
                line.copy_from_slice(&a[..ow]);
            }
            epilogue(dst, None, ep);
        },
    );
}

/// The input that output lines `lines` read, as the [`phase_grid`]'s zero-padded phase
/// planes of [`phase_rows`] rows and [`phase_cols`] columns: row `i`, column `j` of phase `(a, b)` is
/// input row `(lines.start + i) * sh + a - pt`, column `j * sw + b - pl` (zero outside the
/// plane); then `kw` zeros for the last row's dropped columns.
fn pad_phases(g: &Geom2, xplane: &[f32], lines: Range<usize>, padded: &mut Vec<f32>) {
    let (rows, cols) = (phase_rows(g, lines.len()), phase_cols(g));
    padded.clear();
    let (down, across) = phase_grid(g);
    padded.resize(down * across * rows * cols + g.kw, 0.0);
    let phases = padded.chunks_exact_mut(rows * cols).take(down * across);
    for (p, phase) in phases.enumerate() {
        let (a, b) = (p / across, p % across);
        for (i, prow) in phase.chunks_exact_mut(cols).enumerate() {
            let ih = ((lines.start + i) * g.sh + a) as i64 - g.pt;
            if ih < 0 || ih >= g.h as i64 {
                continue;
            }
            let xrow = &xplane[ih as usize * g.w..][..g.w];
            // Columns j whose input column j * sw + b - pl lies in 0..w.
            let (sw, first) = (g.sw as i64, b as i64 - g.pl);
            let lo = ((-first).max(0) as usize).div_ceil(g.sw);
            let hi = ((g.w as i64 - first).max(0) as usize)
                .div_ceil(g.sw)
                .min(cols);
            if lo >= hi {
                continue;
            }
            let src = &xrow[(lo as i64 * sw + first) as usize..];
            if g.sw == 1 {
                prow[lo..hi].copy_from_slice(&src[..hi - lo]);
            } else {
                for (v, x) in prow[lo..hi].iter_mut().zip(src.iter().step_by(g.sw)) {
                    *v = *x;
                }
            }
        }
    }
}

/// Rows of a phase plane for `lines` output rows: those plus the taps' reach below them.
fn phase_rows(g: &Geom2, lines: usize) -> usize {
    lines + (g.kh - 1) / g.sh
}

crate::simd::kernel! {
    /// `acc` (`lines` rows of [`phase_cols`]) = `bias` plus, for each tap `(ki, kj)`, its
    /// weight times phase `(ki % sh, kj % sw)` of `padded` shifted by `ki / sh` rows and
    /// `kj / sw` columns: one long multiply-add per tap, in the order of the line loop (taps
    /// row by row), so finite results are bit-identical to it.
    fn plane_lines(
        g: &Geom2,
        padded: &[f32],
        taps: &[f32],
        bias: f32,
        lines: usize,
        acc: &mut Vec<f32>,
    ) {
        let (rows, cols) = (phase_rows(g, lines), phase_cols(g));
        let len = lines * cols;
        let across = phase_grid(g).1;
        acc.clear();
        acc.resize(len, bias);
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let wv = taps[ki * g.kw + kj];
                let phase = (ki % g.sh) * across + kj % g.sw;
                let at = phase * rows * cols + (ki / g.sh) * cols + kj / g.sw;
                let src = &padded[at..][..len];
                for (o, xv) in acc.iter_mut().zip(src) {
                    *o += wv * xv;
                }
            }
        }
    }
}
