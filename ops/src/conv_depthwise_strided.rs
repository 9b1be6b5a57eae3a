//! Depthwise convs of a 3x3 or 5x5 window of stride 2 (pads up to K / 2), on AVX-512 and
//! AVX2, read in place: output row `i` reads input rows `2i - pt + d`; a vector of outputs
//! `j..j + N` reads, per tap row, two vector pairs from column `2j - pl` (and `+ 2`, `+ 4`)
//! and pulls their even and odd columns apart (as the strided 3x3 pools do, `pool_3x3.rs`):
//! the taps across are those evens and odds, in [`Lanes::evens_odds_unordered`]'s order, each
//! sum put in column order once before its store (on AVX2 that saves two permutes per tap
//! row and pair; Zen 3, alternated run by run: 5x5/2 on 96 x 112 x 112 0.90x of its time,
//! 3x3/2 on 116 x 56 x 56 0.98x). Lanes outside the row are
//! masked to zero on load, rows outside the plane are zero vectors, and the taps are summed
//! in window order after the bias, as the phase planes do: the same bits. Several output rows
//! at a time, their sums independent chains.
//!
//! The phase planes copy each plane's four phases first; on shufflenet's 14x14 -> 7x7 planes
//! that copy is most of the conv.
//!
//! Sits between `conv_depthwise.rs` (which routes the strided convs it [`applies`] to here)
//! and the CPU's vector units (`lanes.rs`).

use super::Plane;
use crate::conv::Geom2;
use crate::lanes::{load_lanes, Lanes};
use std::ops::Range;

/// Whether [`rows`] computes `g` (a `cg == 1` conv): a 3x3 or 5x5 window of stride 2,
/// undilated, begin pads at most K / 2.
pub(super) fn applies(g: &Geom2) -> bool {
    let k = g.kh;
    (k == 3 || k == 5)
        && g.kw == k
        && (g.sh, g.sw, g.dh, g.dw) == (2, 2, 1, 1)
        && (0..=(k / 2) as i64).contains(&g.pt)
        && (0..=(k / 2) as i64).contains(&g.pl)
        && g.ow > 0
}

/// Per vector of an output row of `ow` (`lanes` each), per tap pair (0..=K / 2), per half
/// of the pair: the lanes (bits) of the load from column `2 * lanes * v + 2 * pair + half *
/// lanes - pl` that lie in the row of `w`. The same for every row and plane: once per call.
pub(super) fn column_masks(k: usize, (w, ow, pl): (usize, usize, usize), lanes: usize) -> Vec<u32> {
    let pairs = k / 2 + 1;
    let mut masks = Vec::with_capacity(ow.div_ceil(lanes) * pairs * 2);
    for v in 0..ow.div_ceil(lanes) {
        for pair in 0..pairs {
            for half in 0..2 {
                let at = (2 * lanes * v + 2 * pair + half * lanes) as isize - pl as isize;
                let lo = (-at).clamp(0, lanes as isize);
                let hi = (w as isize - at).clamp(lo, lanes as isize);
                masks.push(((1u64 << hi) - (1u64 << lo)) as u32);
            }
        }
    }
    masks
}

/// Output rows computed side by side.
const GROUP: usize = 4;

/// Output rows `lines` of one plane into `dst` (`lines.len()` rows of `ow`), begin pads
/// `(pt, pl)`, `masks`: [`column_masks`] for `V::N` lanes. Whole vectors are stored, a row's
/// last first: one that runs past its row into the next is overwritten by that row's first,
/// and only the block's last is cut.
///
/// # Safety
/// `V`'s instructions present (inlined into its `#[target_feature]` function).
#[inline(always)]
unsafe fn rows<V: Lanes, const K: usize>(
    p: &Plane,
    (pt, pl, ow): (usize, usize, usize),
    lines: Range<usize>,
    dst: &mut [f32],
    masks: &[u32],
) {
    let (n, w, pairs) = (V::N, p.w, K / 2 + 1);
    let vecs = ow.div_ceil(n);
    assert_eq!(
        dst.len(),
        lines.len() * ow,
        "depthwise stride 2: output block size"
    );
    assert!(
        p.x.len() == p.h * w && p.taps.len() == K * K && masks.len() == vecs * pairs * 2,
        "depthwise stride 2: plane"
    );
    let (weights, bias) = p.splat::<V>();
    let zero = V::splat(0.0);
    let out = dst.as_mut_ptr();
    for first in lines.clone().step_by(GROUP) {
        for v in (0..vecs).rev() {
            let masks = &masks[v * pairs * 2..][..pairs * 2];
            let mut acc = [bias; GROUP];
            for d in 0..K {
                // Each row's input row `d`, where it lies in the plane.
                let mut from = [None; GROUP];
                for (g, from) in from.iter_mut().enumerate() {
                    let ir = (2 * (first + g) + d) as isize - pt as isize;
                    if first + g < lines.end && (0..p.h as isize).contains(&ir) {
                        let col = (2 * n * v) as isize - pl as isize;
                        *from = Some(ir * w as isize + col);
                    }
                }
                for pair in 0..pairs {
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let (evens, odds) = match from[g] {
                            Some(row) => {
                                let at = row + 2 * pair as isize;
                                // SAFETY: only the lanes in the row are read.
                                let a = load_lanes(zero, masks[2 * pair], p.x, at);
                                let b = load_lanes(zero, masks[2 * pair + 1], p.x, at + n as isize);
                                V::evens_odds_unordered(a, b)
                            }
                            None => (zero, zero),
                        };
                        for (a, x) in [(2 * pair, evens), (2 * pair + 1, odds)] {
                            if a < K {
                                *acc = V::add(*acc, V::mul(weights[d * K + a], x));
                            }
                        }
                    }
                }
            }
            for (g, &sum) in acc.iter().enumerate() {
                if first + g >= lines.end {
                    break;
                }
                // Summed lane by lane in the strided order; stored in column order.
                let sum = V::in_order(sum);
                let at = (first + g - lines.start) * ow + n * v;
                match at + n <= dst.len() {
                    true => V::store(out.add(at), sum),
                    false => V::store_first(out.add(at), sum, dst.len() - at),
                }
            }
        }
    }
}

crate::lanes::per_set! {
    /// [`rows`] compiled for each set's instructions.
    pub(super) trait Compiled {
        fn rows<const K: usize>(
            p: &Plane,
            geometry: (usize, usize, usize),
            lines: Range<usize>,
            dst: &mut [f32],
            masks: &[u32],
        );
    }
}
