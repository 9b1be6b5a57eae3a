//! Sliding windows over one plane without dilation (depthwise Conv, MaxPool, AveragePool), a
//! block of output rows at a time: the input rows the block reads are copied once into padded
//! phase planes (phase `(a, b)` holds the padded input at rows `a`, `a + sh`, ... and columns
//! `b`, `b + sw`, ..., so a stride becomes a shift; only the phases a tap reads, so a stride
//! past the kernel costs no more than one equal to it), each row as long as the output row plus
//! `(kw - 1) / sw`. Then every tap is one pass over the whole block ([`fold_taps`]: the
//! columns past each row's end are computed and dropped), and 3x3 and 5x5 windows keep each
//! output in a register across their taps. Short rows (7 to 56 outputs in the vision models)
//! thus cost one long vector loop per block instead of one short loop per row and tap.
//!
//! Sits between the window ops (`conv_planes.rs`, `pool_plane.rs`: geometry, epilogue,
//! averaging) and the CPU's vector units (through [`crate::simd::kernel`]).

use std::ops::Range;

/// One plane's window geometry: input `h x w`, output rows of `ow`, kernel `kh x kw`, strides,
/// begin pads (dilation 1).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub h: usize,
    pub w: usize,
    pub ow: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub pt: i64,
    pub pl: i64,
}

/// What a window computes from its taps, in row-major tap order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fold<'a> {
    /// `bias + w[0] * x[0] + w[1] * x[1] + ...` (one weight per tap).
    Weighted(&'a [f32], f32),
    /// The maximum; NaN wins.
    Max,
    /// The sum.
    Sum,
}

/// Outputs past a block's end that [`fold_taps`] may compute (and drop), so that every block
/// is whole vectors; [`Window::pad`] leaves that many fill values more after the last phase.
const SPARE: usize = 16;

impl Window {
    /// Phases a tap reads, down and across: `min(sh, kh)` by `min(sw, kw)` (tap `(ki, kj)`
    /// reads phase `(ki % sh, kj % sw)`).
    fn grid(&self) -> (usize, usize) {
        (self.sh.min(self.kh), self.sw.min(self.kw))
    }

    /// Columns of a phase plane's row: the output row plus the taps' reach past it.
    pub fn cols(&self) -> usize {
        self.ow + (self.kw - 1) / self.sw
    }

    /// Rows of a phase plane for `lines` output rows: those plus the taps' reach below them.
    fn rows(&self, lines: usize) -> usize {
        lines + (self.kh - 1) / self.sh
    }

    /// Where each tap `(ki, kj)` (row by row) reads in a block's phase planes, as `(phase,
    /// rows down, columns across)`; computed once per call, passed to [`fold_taps`].
    pub fn tap_table(&self) -> Vec<(usize, usize, usize)> {
        let across = self.grid().1;
        let mut v = Vec::with_capacity(self.kh * self.kw);
        for ki in 0..self.kh {
            for kj in 0..self.kw {
                v.push((
                    (ki % self.sh) * across + kj % self.sw,
                    ki / self.sh,
                    kj / self.sw,
                ));
            }
        }
        v
    }

    /// The input that output rows `lines` read, as the padded phase planes: row `i`, column `j`
    /// of phase `(a, b)` is input row `(lines.start + i) * sh + a - pt`, column `j * sw + b - pl`
    /// (`fill` outside the plane); then `kw + SPARE` more `fill` values. Inlined into
    /// [`fold_block`], copies and all.
    #[inline(always)]
    fn pad(&self, xplane: &[f32], lines: Range<usize>, fill: f32, padded: &mut Vec<f32>) {
        let (rows, cols) = (self.rows(lines.len()), self.cols());
        let (down, across) = self.grid();
        padded.clear();
        padded.resize(down * across * rows * cols + self.kw + SPARE, fill);
        let phases = padded.chunks_exact_mut(rows * cols).take(down * across);
        for (p, phase) in phases.enumerate() {
            let (a, b) = (p / across, p % across);
            let first = b as i64 - self.pl;
            let Range { start: lo, end: hi } = inside_columns(self.w, self.sw, first, cols);
            if lo >= hi {
                continue;
            }
            for (i, prow) in phase.chunks_exact_mut(cols).enumerate() {
                let ih = ((lines.start + i) * self.sh + a) as i64 - self.pt;
                if ih < 0 || ih >= self.h as i64 {
                    continue;
                }
                let xrow = &xplane[ih as usize * self.w..][..self.w];
                let src = &xrow[(lo as i64 * self.sw as i64 + first) as usize..];
                copy_every(&mut prow[lo..hi], src, self.sw);
            }
        }
    }
}

/// Columns `j < cols` of a phase plane's row whose input column `j * sw + first` lies in
/// `0..w` (empty where none does): the ones copied, the rest pads.
pub(crate) fn inside_columns(w: usize, sw: usize, first: i64, cols: usize) -> Range<usize> {
    let lo = ((-first).max(0) as usize).div_ceil(sw).min(cols);
    let hi = ((w as i64 - first).max(0) as usize)
        .div_ceil(sw)
        .clamp(lo, cols);
    lo..hi
}

/// A block's scratch: its phase planes and its outputs (see [`fold_block`]).
pub(crate) type Scratch = (Vec<f32>, Vec<f32>);

crate::simd::kernel! {
    /// The outputs of rows `lines` of one plane (`xplane`), in `scratch.1` as rows of
    /// [`Window::cols`] (the first `ow` of each are the outputs; then up to [`SPARE`] dropped
    /// values): its phase planes (`fill` outside the input) in `scratch.0`, then the fold of
    /// each output's taps ([`fold_taps`]; `table`: [`Window::tap_table`]).
    pub(crate) fn fold_block(
        win: &Window,
        xplane: &[f32],
        lines: Range<usize>,
        table: &[(usize, usize, usize)],
        fill: f32,
        fold: Fold,
        scratch: &mut Scratch,
    ) {
        win.pad(xplane, lines.clone(), fill, &mut scratch.0);
        fold_taps(win, &scratch.0, table, fold, lines.len(), &mut scratch.1);
    }
}

/// `acc` = the fold of each output's taps for `lines` output rows (rows of
/// [`Window::cols`], then up to [`SPARE`] dropped values) from `padded` ([`Window::pad`];
/// `table`: [`Window::tap_table`]). Taps are taken in row-major order, so finite results
/// are bit-identical to a loop over the window. Weighted 3x3 and 5x5 windows and 3x3 sums
/// and maxima keep each output in a register across their taps ([`taps_fixed`]; the max as
/// "the tap when it is larger or NaN", a compare and a blend, where [`max_nan`] over memory
/// cost a pass per tap: squeezenet's 3x3/2 MaxPools 0.25 / 0.135 / 0.097 -> 0.216 / 0.118 /
/// 0.084 ms); the rest fold one tap at a time.
#[inline(always)]
fn fold_taps(
    win: &Window,
    padded: &[f32],
    table: &[(usize, usize, usize)],
    fold: Fold,
    lines: usize,
    acc: &mut Vec<f32>,
) {
    let (rows, cols) = (win.rows(lines), win.cols());
    let len = (lines * cols).next_multiple_of(SPARE);
    let mut at = [0usize; 25];
    let offs = &mut at[..table.len().min(25)];
    for (o, &(phase, down, across)) in offs.iter_mut().zip(table) {
        *o = phase * rows * cols + down * cols + across;
    }
    acc.clear();
    match (table.len(), fold) {
        (9 | 25, Fold::Weighted(w, bias)) => {
            let step = |s: f32, t: usize, x: f32| {
                if t == 0 {
                    bias + w[0] * x
                } else {
                    s + w[t] * x
                }
            };
            match table.len() {
                9 => taps_fixed::<9, true>(padded, offs, step, len, acc),
                _ => taps_fixed::<25, true>(padded, offs, step, len, acc),
            }
        }
        // NaN-sticky: a NaN tap, or a NaN kept so far (no tap compares above it), stays.
        (9, Fold::Max) => taps_fixed::<9, false>(
            padded,
            offs,
            |s, t, x| if t == 0 || x > s || x.is_nan() { x } else { s },
            len,
            acc,
        ),
        (9, Fold::Sum) => taps_fixed::<9, false>(
            padded,
            offs,
            |s, t, x| if t == 0 { x } else { s + x },
            len,
            acc,
        ),
        _ => {
            let start = |t: usize| {
                let (phase, down, across) = table[t];
                phase * rows * cols + down * cols + across
            };
            match fold {
                Fold::Weighted(w, bias) => {
                    acc.resize(len, bias);
                    for (t, &wv) in w.iter().enumerate() {
                        for (o, xv) in acc.iter_mut().zip(&padded[start(t)..][..len]) {
                            *o += wv * xv;
                        }
                    }
                }
                Fold::Max | Fold::Sum => {
                    acc.resize(len, 0.0);
                    let max = matches!(fold, Fold::Max);
                    for t in 0..table.len() {
                        combine(acc, &padded[start(t)..][..len], t == 0, max);
                    }
                }
            }
        }
    }
}

/// `acc[i] = op(acc[i], x[i])` with op max (NaN propagates, [`max_nan`]) or +, or a copy for
/// the first; equal lengths. Inlined into the caller's SIMD level.
#[inline(always)]
pub(crate) fn combine(acc: &mut [f32], x: &[f32], first: bool, max: bool) {
    if first {
        acc.copy_from_slice(x);
    } else if max {
        acc.iter_mut()
            .zip(x)
            .for_each(|(a, &v)| *a = max_nan(*a, v));
    } else {
        acc.iter_mut().zip(x).for_each(|(a, &v)| *a += v);
    }
}

/// The larger of `a` and `v`; NaN once either is NaN (NaN propagates through MaxPool).
///
/// Written as a choice between two computed values, not as "`v`, or `a` unchanged": in the
/// latter form LLVM turns `*acc = max_nan(*acc, v)` into a masked store of `v` (`vmaskmovps`),
/// which AMD cores execute slowly (squeezenet's 3x3/2 MaxPool over 64x111x111: 0.49 ms, 80 %
/// of it in masked stores).
#[inline(always)]
pub(crate) fn max_nan(a: f32, v: f32) -> f32 {
    if a.is_nan() || v.is_nan() {
        a + v
    } else {
        a.max(v)
    }
}

/// [`fold_taps`] for a window of `T` taps: `acc[i] = step(...step(step(_, 0, x0[i]), 1,
/// x1[i])..., T - 1, x{T-1}[i])` (`xt`: `padded` from `offs[t]`), 16 outputs at a time (64
/// when `GROUPED`) held in registers across the taps (one store per output instead of one per
/// tap). `len` is a multiple of 16. Each output's taps are a chain of dependent steps, so one
/// vector alone waits out each step's latency: weighted sums take 4 vectors at a time
/// (depthwise 5x5 on 20x20 planes 181 -> 131 us, 3x3 on 14x14 37 -> 35 us, least of 20 x 200
/// runs on 2 threads); maxima and sums keep 1 (squeezenet's 3x3/2 MaxPools were slower).
#[inline(always)]
fn taps_fixed<const T: usize, const GROUPED: bool>(
    padded: &[f32],
    offs: &[usize],
    step: impl Fn(f32, usize, f32) -> f32,
    len: usize,
    acc: &mut Vec<f32>,
) {
    const L: usize = SPARE;
    let mut src: [&[f32]; T] = [&[]; T];
    for (s, &o) in src.iter_mut().zip(offs) {
        *s = &padded[o..][..len];
    }
    acc.resize(len, 0.0);
    const G: usize = 4;
    let whole = if GROUPED { len / (G * L) * (G * L) } else { 0 };
    let (grouped, rest) = acc.split_at_mut(whole);
    taps_chunks::<{ G * L }, T>(&src, &step, 0, grouped);
    taps_chunks::<L, T>(&src, &step, whole, rest);
}

/// [`taps_fixed`]'s outputs `at..at + out.len()` (a multiple of `N`) into `out`, `N` at a time
/// held in registers across the taps.
#[inline(always)]
fn taps_chunks<const N: usize, const T: usize>(
    src: &[&[f32]; T],
    step: &impl Fn(f32, usize, f32) -> f32,
    at: usize,
    out: &mut [f32],
) {
    for (c, out) in out.chunks_exact_mut(N).enumerate() {
        let mut s = [0.0f32; N];
        for (t, x) in src.iter().enumerate() {
            let x: &[f32; N] = x[at + c * N..][..N].try_into().unwrap();
            for k in 0..N {
                s[k] = step(s[k], t, x[k]);
            }
        }
        out.copy_from_slice(&s);
    }
}

crate::simd::kernel! {
    /// `dst[i] = src[i * s]`; `src` holds at least `(dst.len() - 1) * s + 1` elements. On the
    /// widest vectors the CPU has (im2col's strided rows).
    pub(crate) fn strided_copy(dst: &mut [f32], src: &[f32], s: usize) {
        copy_every(dst, src, s)
    }
}

/// [`strided_copy`] inlined into the caller's SIMD level (the phase planes' short rows and a
/// strided conv's im2col segments, where a dispatched call per row cost more than the copy).
/// Stride 2 reads pairs (a vectorised deinterleave) for all but the last element.
#[inline(always)]
pub(crate) fn copy_every(dst: &mut [f32], src: &[f32], s: usize) {
    let n = dst.len();
    match s {
        1 => dst.copy_from_slice(&src[..n]),
        2 if n > 1 => {
            for (v, pair) in dst[..n - 1]
                .iter_mut()
                .zip(src[..2 * (n - 1)].chunks_exact(2))
            {
                *v = pair[0];
            }
            dst[n - 1] = src[2 * (n - 1)];
        }
        _ => {
            for (v, x) in dst.iter_mut().zip(src.iter().step_by(s)) {
                *v = *x;
            }
        }
    }
}
