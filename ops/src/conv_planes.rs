//! Undilated convolutions with one input channel per output channel (depthwise), a plane at a
//! time, through the padded phase planes of `phase_planes.rs` (zero fill, one weight per tap).
//! The line-by-line loop (`conv_cpu::direct_path`) multiplies 7 to 56 elements per tap and line
//! in the models; on AVX-512 those short segments barely fill a vector, and strided ones not at
//! all.
//!
//! 3x3 and 5x5 windows of stride 1 (same size) or 2 on AVX2 and AVX-512 take
//! `conv_depthwise.rs` instead, which reads each plane in place.
//!
//! Sits between `conv_cpu::direct_path` (which routes undilated `cg == 1` convs here,
//! [`applies`]) and `phase_planes.rs`.

use super::{epilogue, Epilogue, Geom2};
use crate::phase_planes::{fold_block, Fold, Scratch, Window};
use crate::shape::rows_by_block;
use std::ops::Range;

/// Whether [`plane_path`] computes `g`: no dilation.
pub(super) fn applies(g: &Geom2) -> bool {
    g.dh == 1 && g.dw == 1 && g.ow > 0
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
    let win = Window {
        h: g.h,
        w: g.w,
        ow,
        kh: g.kh,
        kw: g.kw,
        sh: g.sh,
        sw: g.sw,
        pt: g.pt,
        pl: g.pl,
    };
    let table = win.tap_table();
    // One piece per plane the rows touch: (plane, its output rows, their block of `out`).
    let pieces = rows_by_block(&mut out[rows.start * ow..rows.end * ow], rows, g.oh, ow);
    crate::parallel::for_each_item_init(
        pieces,
        1,
        Scratch::default,
        |scratch, (plane, lines, dst): (usize, std::ops::Range<usize>, &mut [f32])| {
            let (n, oc) = (plane / g.m, plane % g.m);
            let xplane = &x[(n * g.c + oc / g.mg) * g.h * g.w..][..g.h * g.w];
            let taps = &w[oc * g.kh * g.kw..][..g.kh * g.kw];
            let bias = b.map_or(0.0, |b| b[oc]);
            let fold = Fold::Weighted(taps, bias);
            fold_block(&win, xplane, lines, &table, 0.0, fold, scratch);
            for (line, a) in dst
                .chunks_exact_mut(ow)
                .zip(scratch.1.chunks_exact(win.cols()))
            {
                line.copy_from_slice(&a[..ow]);
            }
            epilogue(dst, None, None, ep);
        },
    );
}
