//! Winograd F(2x2, 3x3) for Conv 3x3, stride 1, dilation 1, group 1 (any pads, any N): each
//! 2x2 block of output pixels ("tile") is computed from the 4x4 input patch under it with 16
//! multiplications per (input, output channel) pair instead of 36 (2.25x fewer).
//!
//! Sits between `conv_cpu.rs`'s path choice ([`applies`]) and the shared CPU GEMM
//! (`cpu_gemm.rs`). The weights are transformed (`U = G g G^T`, 16 values per (oc, c), layout
//! `[oc][point][c]`) once per call, or once for good where the op keeps them (a constant W,
//! `Conv::with_constant_weight`); then per image, in blocks of tile rows (bounded scratch):
//! the input transform (`V = B^T d B`, layout `[c][point][slot]`), one GEMM per transform point
//! `M[p] = U[p] (K x C) x V[p] (C x slots)` (16 of them), and the output transform
//! (`Y = A^T M A`) with the bias and the fused activation. Large planes run one block per task
//! (all of it on one thread); small ones parallelise each phase of a block (channels, points,
//! output channels). A row range (`(n, oc, oh)` lines) becomes the rectangles of
//! `conv_cpu::rects`; each is computed from the tiles overlapping its output rows and writes
//! only the rows inside it, so CPU/GPU row splits see the same values as a whole run.
//!
//! A block's tiles sit in `tw + 1` slots per tile row (the last a padding slot), so every
//! transform step is one pass over the whole block and vectorises through
//! [`kernel!`](crate::simd::kernel). Coefficients are 0, +-1 and 1/2: the result differs from
//! direct summation by rounding only (checked against an f64 loop in the tests).

use super::{epilogue, rects, with_scratch, OutPtr};
use crate::conv::{Epilogue, Geom2};
use crate::cpu_gemm::{sgemm_raw, MatRef, Threads};
use rayon::prelude::*;
use std::ops::Range;

/// Transform points per tile (4x4).
pub(in crate::conv) const POINTS: usize = 16;

/// Scratch floats per block of tile rows (V and M together, 4 MiB): bounds memory on large
/// images while keeping the 16 GEMMs wide enough.
const BLOCK_FLOATS: usize = 1 << 20;

/// Smallest input and output channel counts, and output pixels per image, where Winograd was
/// measured faster than im2col + GEMM inside models (docs/bench.md, "Winograd" and "Winograd
/// weights kept"). With W transformed on every call, planes below 20x20 do not amortise the
/// transform (16 floats per (oc, c) written, then read by the GEMMs): 14x14 measured 0.95-1.03x
/// inside inception_v2, 7x7 0.5x. With W kept (a model constant), 14x14 planes measured
/// 1.42-1.79x inside resnet50 and inception_v2 and 10x10 1.45x in a loop; 7x7 0.98-1.06x stays
/// on im2col. 16 and 32 input channels lose on small planes (GEMMs too thin). Output channels
/// from 16 win where the inputs are deep (docs/bench.md, "Winograd from 16 output channels"):
/// ppocr_det's 96 -> 24 conv on 160x160 9.6-10.0 -> 5.2 ms, densenet121's 128 -> 32 convs
/// (56x56 to 14x14) 26.9 -> 18.5 ms.
const MIN_CHANNELS: usize = 64;
const MIN_OUT_CHANNELS: usize = 16;
const MIN_PIXELS: usize = 400;
const MIN_PIXELS_KEPT: usize = 100;

/// Whether `TANDEM_CONV_WINOGRAD=0` turned Winograd off (read once).
pub(in crate::conv) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CONV_WINOGRAD").as_deref() != Ok("0"))
}

/// Whether the geometry is one Winograd F(2x2, 3x3) computes: 3x3, stride 1, dilation 1,
/// group 1, non-empty output.
pub(in crate::conv) fn supports(g: &Geom2) -> bool {
    (g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.group) == (3, 3, 1, 1, 1, 1, 1) && g.oh * g.ow > 0
}

/// Whether `conv_cpu` takes the Winograd path: supported, enabled, and channels and plane
/// large enough to be measured faster than im2col + GEMM, with W transformed per call or
/// `kept` ([`Conv::with_constant_weight`](crate::conv::Conv::with_constant_weight)).
pub(in crate::conv) fn applies(g: &Geom2, kept: bool) -> bool {
    let min_pixels = if kept { MIN_PIXELS_KEPT } else { MIN_PIXELS };
    supports(g)
        && g.c >= MIN_CHANNELS
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
    /// Tiles per tile row: `ceil(ow / 2)`.
    tw: usize,
}

impl Tiles {
    /// Padded input row length the tiles of one tile row read: `2 * tw + 2`.
    fn wp(&self) -> usize {
        2 * self.tw + 2
    }

    /// Tile slots of a block of `rows` tile rows: `tw + 1` per row (the last is padding, so
    /// every transform is one pass over the whole block; its GEMM column is ignored).
    fn slots(&self, rows: usize) -> usize {
        rows * (self.tw + 1)
    }

    /// Temporary floats the transforms of a block of `rows` tile rows need.
    fn tmp_len(&self, rows: usize) -> usize {
        16 * self.slots(rows) + 4 * self.wp()
    }
}

/// One block: image, output channels, tile rows, and the output rows (inside both the
/// block's tile rows and its rectangle) it writes.
type Block = (usize, Range<usize>, Range<usize>, Range<usize>);

/// Output lines `rows` (`(n, oc, oh)`) of a convolution [`supports`] accepts, computed by
/// Winograd F(2x2, 3x3); `ep` applied after the bias.
///
/// Work is cut into blocks of tile rows (V and M of a block within [`block_floats`]). With at
/// least two blocks per thread, each block is one task (transforms and GEMMs on one thread,
/// in its cache). Otherwise (small planes) blocks run one after another, each with its input
/// transform parallel over input channels, then GEMMs and output transform parallel over
/// parts of its output channels.
pub(in crate::conv) fn winograd_path(
    g: &Geom2,
    x: &[f32],
    (w, b, ep): (&[f32], Option<&[f32]>, Epilogue),
    kept: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
) {
    debug_assert!(supports(g));
    let t = Tiles {
        h: g.h,
        w: g.w,
        pt: g.pt,
        pl: g.pl,
        ow: g.ow,
        tw: g.ow.div_ceil(2),
    };
    let threads = rayon::current_num_threads().max(1);
    let img_rows = g.m * g.oh;
    let budget = block_floats();
    let mut blocks: Vec<Block> = Vec::new();
    for n in rows.start / img_rows..rows.end.div_ceil(img_rows) {
        let lo = n * img_rows;
        let q = rows.start.max(lo) - lo..rows.end.min(lo + img_rows) - lo;
        if q.is_empty() {
            continue;
        }
        for r in rects(g, 0, q) {
            let orow = r.pix.start / g.ow..r.pix.end / g.ow;
            let tys = orow.start / 2..orow.end.div_ceil(2);
            let bt = (budget / (POINTS * (g.c + r.oc.len()) * (t.tw + 1))).clamp(1, tys.len());
            let mut ty = tys.start;
            while ty < tys.end {
                let te = (ty + bt).min(tys.end);
                let wr = orow.start.max(2 * ty)..orow.end.min(2 * te);
                blocks.push((n, r.oc.clone(), ty..te, wr));
                ty = te;
            }
        }
    }
    let oc_lo = blocks.iter().map(|k| k.1.start).min().unwrap_or(0);
    let oc_hi = blocks.iter().map(|k| k.1.end).max().unwrap_or(0);
    let optr = OutPtr(out.as_mut_ptr(), out.len());
    let ulen = match kept {
        Some(_) => 0,
        None => (oc_hi - oc_lo) * POINTS * g.c,
    };
    let many = blocks.len() >= 2 * threads || threads == 1;
    let tb_max = blocks.iter().map(|k| t.slots(k.2.len())).max().unwrap_or(0);
    let (vshared, mshared) = if many {
        (0, 0)
    } else {
        (g.c * POINTS * tb_max, (oc_hi - oc_lo) * POINTS * tb_max)
    };
    with_scratch(ulen + vshared + mshared, |buf| {
        let (own, rest) = buf.split_at_mut(ulen);
        let (vbuf, mbuf) = rest.split_at_mut(vshared);
        let u: &[f32] = match kept {
            Some(all) => &all[oc_lo * POINTS * g.c..oc_hi * POINTS * g.c],
            None => {
                transform_weights(w, g.c, oc_lo..oc_hi, own);
                own
            }
        };
        let xn = |n: usize| &x[n * g.c * g.h * g.w..][..g.c * g.h * g.w];
        // Output transform of channels `oc` of block `(n, tys, wr)` from their `mm`.
        let outputs = |(n, oc, tys, wr): (usize, Range<usize>, &Range<usize>, &Range<usize>),
                       mm: &[f32],
                       tmp: &mut [f32]| {
            let tb = t.slots(tys.len());
            for (k, mk) in oc.clone().zip(mm.chunks_exact(POINTS * tb)) {
                let at = ((n * g.m + k) * g.oh + wr.start) * g.ow;
                let len = wr.len() * g.ow;
                assert!(at + len <= optr.1, "Winograd output block out of bounds");
                // SAFETY: in bounds (checked); tasks write disjoint (channel, row) blocks:
                // rectangles partition the range, blocks their rows, chunks their channels.
                let op = unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(at), len) };
                output_channel(&t, mk, tys.clone(), wr.clone(), op, tmp);
                for line in op.chunks_exact_mut(g.ow) {
                    epilogue(line, b.map(|b| b[k]), None, ep);
                }
            }
        };
        if many {
            let run = |(n, oc, tys, wr): &Block| {
                let tb = t.slots(tys.len());
                let (vlen, mlen) = (g.c * POINTS * tb, oc.len() * POINTS * tb);
                with_tmp(vlen + mlen + t.tmp_len(tys.len()), |buf| {
                    let (v, rest) = buf.split_at_mut(vlen);
                    let (mm, tmp) = rest.split_at_mut(mlen);
                    for (c, dst) in v.chunks_exact_mut(POINTS * tb).enumerate() {
                        let xp = &xn(*n)[c * g.h * g.w..][..g.h * g.w];
                        input_channel(&t, xp, tys.clone(), dst, tmp);
                    }
                    let a0 = (oc.start - oc_lo) * POINTS * g.c;
                    let mp = OutPtr(mm.as_mut_ptr(), mm.len());
                    for p in 0..POINTS {
                        // SAFETY: `mm` is this task's own buffer.
                        unsafe { point_gemm(u, a0, v, (g.c, oc.len(), tb), p, mp) };
                    }
                    outputs((*n, oc.clone(), tys, wr), mm, tmp);
                })
            };
            if threads > 1 {
                blocks.par_iter().for_each(run);
            } else {
                blocks.iter().for_each(run);
            }
            return;
        }
        for (n, oc, tys, wr) in &blocks {
            let tb = t.slots(tys.len());
            let v = &mut vbuf[..g.c * POINTS * tb];
            let cper = g.c.div_ceil(4 * threads);
            v.par_chunks_mut(POINTS * tb * cper)
                .enumerate()
                .for_each(|(ci, chunk)| {
                    with_tmp(t.tmp_len(tys.len()), |tmp| {
                        for (i, dst) in chunk.chunks_exact_mut(POINTS * tb).enumerate() {
                            let xp = &xn(*n)[(ci * cper + i) * g.h * g.w..][..g.h * g.w];
                            input_channel(&t, xp, tys.clone(), dst, tmp);
                        }
                    })
                });
            let v = &*v;
            let mm = &mut mbuf[..oc.len() * POINTS * tb];
            let mp = OutPtr(mm.as_mut_ptr(), mm.len());
            let a0 = (oc.start - oc_lo) * POINTS * g.c;
            (0..POINTS).into_par_iter().for_each(|p| {
                // SAFETY: each point writes its own rows `[k][p][..]` of `mm`.
                unsafe { point_gemm(u, a0, v, (g.c, oc.len(), tb), p, mp) };
            });
            let kper = oc.len().div_ceil(4 * threads);
            mm.par_chunks(POINTS * tb * kper)
                .enumerate()
                .for_each(|(i, chunk)| {
                    let k0 = oc.start + i * kper;
                    let ks = k0..(k0 + kper).min(oc.end);
                    with_tmp(t.tmp_len(tys.len()), |tmp| {
                        outputs((*n, ks, tys, wr), chunk, tmp)
                    })
                });
        }
    });
}

/// Scratch floats per block ([`BLOCK_FLOATS`], or the test hook's budget).
fn block_floats() -> usize {
    #[cfg(test)]
    if let Some(b) = TEST_BLOCK.with(|c| c.get()) {
        return b;
    }
    BLOCK_FLOATS
}

/// `u[k][p][c] = (G g G^T)[p]` for output channels `ocs` of `w` (`[M][C][3][3]`), with
/// `G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]`; parallel over channels.
pub(in crate::conv) fn transform_weights(w: &[f32], c: usize, ocs: Range<usize>, u: &mut [f32]) {
    let wk = &w[ocs.start * c * 9..ocs.end * c * 9];
    u.par_chunks_mut(POINTS * c)
        .zip(wk.par_chunks(9 * c))
        .for_each(|(uk, gk)| weights_of_channel(gk, uk));
}

crate::simd::kernel! {
    /// One output channel's 16 transformed weight rows (`uk`: `[p][c]`) from its `[c][3][3]`
    /// taps.
    fn weights_of_channel(gk: &[f32], uk: &mut [f32]) {
        let c = gk.len() / 9;
        for (ci, g) in gk.chunks_exact(9).enumerate() {
            // tmp = G g (4 x 3), then U = tmp G^T (4 x 4).
            let mut tmp = [[0.0f32; 3]; 4];
            for j in 0..3 {
                let (g0, g1, g2) = (g[j], g[3 + j], g[6 + j]);
                tmp[0][j] = g0;
                tmp[1][j] = 0.5 * (g0 + g1 + g2);
                tmp[2][j] = 0.5 * (g0 - g1 + g2);
                tmp[3][j] = g2;
            }
            for (bi, r) in tmp.iter().enumerate() {
                let row = [r[0], 0.5 * (r[0] + r[1] + r[2]), 0.5 * (r[0] - r[1] + r[2]), r[2]];
                for (a, val) in row.into_iter().enumerate() {
                    uk[(bi * 4 + a) * c + ci] = val;
                }
            }
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Testing hook: the block budget of calls on this thread (tiny budgets give one tile row
    /// per block, so the one-task-per-block schedule runs on small planes too).
    pub(in crate::conv) static TEST_BLOCK: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

thread_local! {
    /// Per-thread temporaries of the transforms (a few padded rows).
    static TMP: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Run `f` on `len` floats of this thread's transform temporaries (taken out for the call).
fn with_tmp<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut v = TMP.with(|s| s.take());
    if v.len() < len {
        v.resize(len, 0.0);
    }
    let r = f(&mut v[..len]);
    TMP.with(|s| s.set(v));
    r
}

crate::simd::kernel! {
    /// One input channel's transformed tiles `dst` (`[p][slot]`) for tile rows `tys`: the
    /// zero-padded input rows they read, split into even and odd rows (tile row `r` reads
    /// even rows `r`, `r + 1` and odd rows `r`, `r + 1`), combined across rows (`B^T d`) for
    /// the whole block at once, then each combination split into even and odd columns and
    /// combined along the rows (`. B`).
    fn input_channel(t: &Tiles, xp: &[f32], tys: Range<usize>, dst: &mut [f32], tmp: &mut [f32]) {
        let (tw, wp, bt) = (t.tw, t.wp(), tys.len());
        let ts = t.slots(bt);
        let (ev, rest) = tmp.split_at_mut((bt + 1) * wp);
        let (od, rest) = rest.split_at_mut((bt + 1) * wp);
        let (comb, rest) = rest.split_at_mut(bt * wp);
        let (e, rest) = rest.split_at_mut(ts);
        let o = &mut rest[..ts];
        // Padded columns p read input column p - pl.
        let c0 = t.pl.clamp(0, wp as i64) as usize;
        let c1 = (t.pl + t.w as i64).clamp(c0 as i64, wp as i64) as usize;
        for (r, (er, or)) in ev.chunks_exact_mut(wp).zip(od.chunks_exact_mut(wp)).enumerate() {
            for (dy, pr) in [er, or].into_iter().enumerate() {
                let ih = (2 * (tys.start + r) + dy) as i64 - t.pt;
                if ih < 0 || ih >= t.h as i64 || c0 >= c1 {
                    pr.fill(0.0);
                    continue;
                }
                let src = &xp[ih as usize * t.w..][..t.w];
                pr[..c0].fill(0.0);
                pr[c1..].fill(0.0);
                let s0 = (c0 as i64 - t.pl) as usize;
                pr[c0..c1].copy_from_slice(&src[s0..s0 + (c1 - c0)]);
            }
        }
        let n = bt * wp;
        let (e0, e1, o0, o1) = (&ev[..n], &ev[wp..], &od[..n], &od[wp..]);
        for bi in 0..4 {
            match bi {
                0 => zip2(comb, e0, e1, |a, b| a - b),
                1 => zip2(comb, o0, e1, |a, b| a + b),
                2 => zip2(comb, e1, o0, |a, b| a - b),
                _ => zip2(comb, o0, o1, |a, b| a - b),
            }
            for ((ev, ov), pair) in e.iter_mut().zip(o.iter_mut()).zip(comb.chunks_exact(2)) {
                *ev = pair[0];
                *ov = pair[1];
            }
            let l = ts - 1;
            let at = |a: usize| (bi * 4 + a) * ts;
            zip2(&mut dst[at(0)..at(0) + l], &e[..l], &e[1..], |a, b| a - b);
            zip2(&mut dst[at(1)..at(1) + l], &o[..l], &e[1..], |a, b| a + b);
            zip2(&mut dst[at(2)..at(2) + l], &e[1..], &o[..l], |a, b| a - b);
            zip2(&mut dst[at(3)..at(3) + l], &o[..l], &o[1..], |a, b| a - b);
            for a in 0..4 {
                dst[at(a) + l] = 0.0;
            }
        }
        let _ = tw;
    }
}

/// `dst[i] = f(a[i], b[i])` over the shortest length (inlined into the kernels above).
#[inline(always)]
fn zip2(dst: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(*x, *y);
    }
}

/// GEMM of transform point `p`: `mm[k][p][slot] = sum_c u[a0 + k][p][c] * v[c][p][slot]`
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
    p: usize,
    mm: OutPtr,
) {
    let a = MatRef {
        data: u,
        offset: a0 + p * c,
        rs: POINTS * c,
        cs: 1,
    };
    let bm = MatRef {
        data: v,
        offset: p * tb,
        rs: POINTS * tb,
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
            (p * tb, POINTS * tb, 1),
            Threads::Single,
        )
    }
}

crate::simd::kernel! {
    /// One output channel's rows `orow` (`op` holds exactly those rows) from its `mk`
    /// (`[p][slot]`, tile rows `tys`): `A^T m` across the transform's rows, then `. A` along
    /// them, for the whole block at once, the two values of each tile interleaved into a
    /// block of output rows that the rows in `orow` are copied from.
    fn output_channel(t: &Tiles, mk: &[f32], tys: Range<usize>, orow: Range<usize>, op: &mut [f32], tmp: &mut [f32]) {
        let ts = t.slots(tys.len());
        let (s, rest) = tmp.split_at_mut(8 * ts);
        let (y0, rest) = rest.split_at_mut(2 * ts);
        let y1 = &mut rest[..2 * ts];
        let m = |p: usize| &mk[p * ts..][..ts];
        // s[0][a] = m0a + m1a + m2a, s[1][a] = m1a - m2a - m3a.
        for a in 0..4 {
            let (s0, s1) = s[a * ts..].split_at_mut(4 * ts);
            for ((((d0, d1), x0), x1), (x2, x3)) in s0[..ts]
                .iter_mut()
                .zip(&mut s1[..ts])
                .zip(m(a))
                .zip(m(4 + a))
                .zip(m(8 + a).iter().zip(m(12 + a)))
            {
                *d0 = x0 + x1 + x2;
                *d1 = x1 - x2 - x3;
            }
        }
        for (half, y) in [&mut *y0, &mut *y1].into_iter().enumerate() {
            let sa = |a: usize| &s[(half * 4 + a) * ts..][..ts];
            for ((((pair, v0), v1), v2), v3) in y
                .chunks_exact_mut(2)
                .zip(sa(0))
                .zip(sa(1))
                .zip(sa(2))
                .zip(sa(3))
            {
                pair[0] = v0 + v1 + v2;
                pair[1] = v1 - v2 - v3;
            }
        }
        let yw = 2 * (t.tw + 1);
        for (li, ty) in tys.enumerate() {
            for (dy, y) in [&*y0, &*y1].into_iter().enumerate() {
                let r = 2 * ty + dy;
                if orow.contains(&r) {
                    op[(r - orow.start) * t.ow..][..t.ow].copy_from_slice(&y[li * yw..][..t.ow]);
                }
            }
        }
    }
}
