//! 3x3 MaxPools of stride 2 (the vision models' downsampling pools: squeezenet's, resnet50's,
//! inception's, densenet121's) on AVX-512, in registers: each output vector loads its window
//! rows' 2N columns once (two vectors), splits them into even and odd columns, takes the
//! next even columns from the next vector's evens shifted by a lane, and folds across, then
//! down. Two output rows at a time share the input row between them (five rows for two
//! outputs), and fetches the next pair's new rows into L1 first (as `pool_3x3.rs` does, for
//! the same reason). `pool_3x3.rs` reduced every input row across into a scratch row, then
//! down from it, a row of scratch stored and loaded again per input row. Against it (AMD Zen
//! 4, the two alternated): one thread, in cache, 64 planes of 111 x 111 136-140 -> 91-94 us,
//! 128 of 55 x 55 85-87 -> 53-54, 64 of 112 x 112 with pads of 1 146-153 -> 94-100, 256 of 27
//! x 27 even (43 us); on AVX2 (`TANDEM_SIMD=avx2`, the same host) 64 of 111 x 111 181-184 ->
//! 166-169. In the models, two threads, three rounds each: squeezenet's three MaxPools
//! 0.19-0.23 -> 0.15 ms, resnet50's 0.13-0.16 -> 0.09-0.10, densenet121's 0.11-0.12 -> 0.07
//! (docs/bench.md, "Stride-2 MaxPools in registers").
//!
//! The maximum is the same as `pool_3x3.rs`'s, bit for bit: each fold keeps the earlier
//! operand on a tie and propagates NaN, across (columns in order) then down (rows in order),
//! so the first maximum in row-major window order. Pads and row ends are masked off in the
//! loads; window rows outside the plane are left out of the fold.
//!
//! Sits between `pool_3x3.rs` (which pools take this path) and the CPU's vector units.

use super::Geo;
use crate::lanes::{fetch, lane_bits, load_lanes_unbranched, row_lane_bits, Lanes};
use std::ops::Range;

/// Output rows `lines` of one plane into `dst` (`lines.len()` rows of `OW`): window maxima of
/// a 3x3 stride-2 pool. `masks` is scratch.
///
/// # Safety
/// `V`'s instructions present (inlined into its `#[target_feature]` function); `g` passed
/// `pool_3x3.rs`'s `applies` with strides of 2; `xplane` is one input plane.
#[inline(always)]
pub(super) unsafe fn plane_rows<V: Lanes>(
    g: &Geo,
    xplane: &[f32],
    lines: Range<usize>,
    dst: &mut [f32],
    masks: &mut Vec<[u32; 2]>,
) {
    let n = V::N;
    let (h, w, ow) = (g.ind[1], g.ind[2], g.outd[2]);
    let (pt, pl) = (g.pb[1] as isize, g.pb[2] as isize);
    let vecs = ow.div_ceil(n);
    // Block k holds input columns 2Nk - pl .. 2N(k+1) - pl, two loads; block `vecs` only
    // gives the last vector its next even column.
    masks.clear();
    masks.extend((0..=vecs).map(|k| {
        let from = (2 * n * k) as isize - pl;
        [
            row_lane_bits(from, w, n),
            row_lane_bits(from + n as isize, w, n),
        ]
    }));
    assert_eq!(dst.len(), lines.len() * ow, "pool 3x3/2: output block size");
    let out = Out {
        at: dst.as_mut_ptr(),
        ow,
        vecs,
    };
    // Input row `t` of output row `i`'s window, where it lies in the plane.
    let row = |i: usize, t: usize| {
        let r = (2 * i + t) as isize - pt;
        (0..h as isize).contains(&r).then(|| r as usize * w)
    };
    let mut i = lines.start;
    while i < lines.end {
        let j = i - lines.start;
        let inside = |i: usize| (0..3).all(|t| row(i, t).is_some());
        if i + 1 < lines.end && inside(i) && inside(i + 1) {
            let rows: [usize; 5] = std::array::from_fn(|t| row(i, t).expect("inside"));
            // The next pair's four new rows, into L1 (module docs).
            fetch(xplane.as_ptr().wrapping_add(rows[4] + w), 4 * w);
            group::<V, 5>(xplane, rows, masks, pl, out.row(j));
            i += 2;
            continue;
        }
        let mut rows = [0; 3];
        let mut count = 0;
        for t in 0..3 {
            if let Some(r) = row(i, t) {
                rows[count] = r;
                count += 1;
            }
        }
        match count {
            3 => group::<V, 3>(xplane, rows, masks, pl, out.row(j)),
            2 => group::<V, 2>(xplane, [rows[0], rows[1]], masks, pl, out.row(j)),
            _ => group::<V, 1>(xplane, [rows[0]], masks, pl, out.row(j)),
        }
        i += 1;
    }
}

/// Where output rows go: `ow` outputs a row, `vecs` vectors of them.
#[derive(Clone, Copy)]
struct Out {
    at: *mut f32,
    ow: usize,
    vecs: usize,
}

impl Out {
    /// Row `j` and the rows after it.
    fn row(self, j: usize) -> Out {
        Out {
            at: self.at.wrapping_add(j * self.ow),
            ..self
        }
    }

    /// Vector `k` of row `r` (of this one and the next), a row's last one cut at its end.
    ///
    /// # Safety
    /// `V`'s instructions present; row `r` lies in the output block.
    #[inline(always)]
    unsafe fn store<V: Lanes>(self, r: usize, k: usize, v: V) {
        let p = self.at.add(r * self.ow + V::N * k);
        match V::N * (k + 1) <= self.ow {
            true => V::store(p, v),
            false => V::store_first(p, v, self.ow - V::N * k),
        }
    }
}

/// One output row from its `R` window rows inside the plane (`R` up to 3), or two from five
/// (`R == 5`: rows 0..3 and 2..5), the rows given as offsets of their first column in
/// `xplane`.
///
/// # Safety
/// As [`plane_rows`]; `masks` holds `out.vecs + 1` blocks.
#[inline(always)]
unsafe fn group<V: Lanes, const R: usize>(
    xplane: &[f32],
    rows: [usize; R],
    masks: &[[u32; 2]],
    pl: isize,
    out: Out,
) {
    let fill = V::splat(f32::NEG_INFINITY);
    let every = V::bits(lane_bits(0..V::N));
    let mut cur = [(fill, fill); R];
    for r in 0..R {
        cur[r] = block(fill, xplane, rows[r], 0, masks, pl);
    }
    for k in 0..out.vecs {
        let mut across = [fill; R];
        for r in 0..R {
            let next = block(fill, xplane, rows[r], k + 1, masks, pl);
            let (e, o) = cur[r];
            // Columns 2j, 2j + 1, 2j + 2 of each output j, in that order.
            across[r] = V::max_first(V::max_first(e, o), V::across(e, next.0, 1, every));
            cur[r] = next;
        }
        match R {
            5 => {
                out.store(0, k, down(&across[0..3]));
                out.store(1, k, down(&across[2..5]));
            }
            _ => out.store(0, k, down(&across)),
        }
    }
}

/// The rows reduced across, folded down in order.
///
/// # Safety
/// `V`'s instructions present.
#[inline(always)]
unsafe fn down<V: Lanes>(across: &[V]) -> V {
    let mut m = across[0];
    for a in &across[1..] {
        m = V::max_first(m, *a);
    }
    m
}

/// Block `k` of the row at `row`: its even and its odd columns, lanes off the row `fill`.
///
/// # Safety
/// As [`group`].
#[inline(always)]
unsafe fn block<V: Lanes>(
    fill: V,
    xplane: &[f32],
    row: usize,
    k: usize,
    masks: &[[u32; 2]],
    pl: isize,
) -> (V, V) {
    let at = (row + 2 * V::N * k) as isize - pl;
    let [a, b] = masks[k];
    V::evens_odds(
        load_lanes_unbranched(fill, a, xplane, at),
        load_lanes_unbranched(fill, b, xplane, at + V::N as isize),
    )
}
