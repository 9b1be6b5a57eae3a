//! A conv's dispatches cut so that each one's weights fit one uniform window
//! ([`crate::UniformWindow`]): `conv_rows.wgsl` reads W as a uniform buffer on adapters that run
//! shaders on the CPU, where a uniform load is a vector load and a storage load a per-lane loop.
//!
//! Sits between `Conv::gpu` (which builds a kernel per piece) and the geometry ([`Geom2`]).

use super::Geom2;
use crate::UNIFORM_WINDOW_BYTES;
use std::ops::Range;

/// One dispatch of a conv: its output elements (whole output rows of one image) and the W
/// elements its channels read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightWindow {
    pub elems: Range<usize>,
    pub weights: Range<usize>,
}

/// Output elements `elems` (whole output rows of `g`) cut at images and at channel blocks of
/// `ocb` (numbered from each group's first channel, as the shaders number them), so that the
/// weights of each piece's channels fit [`UNIFORM_WINDOW_BYTES`]. `None` when one block's do not.
pub fn weight_windows(g: &Geom2, elems: Range<usize>, ocb: usize) -> Option<Vec<WeightWindow>> {
    let per_channel = g.cg * g.kh * g.kw;
    let most = UNIFORM_WINDOW_BYTES / 4;
    if ocb.min(g.mg) * per_channel > most {
        return None;
    }
    // Channel ranges, each as many whole blocks as fit.
    let mut channels = Vec::new();
    let mut start = 0;
    for group in 0..g.group {
        for oc0 in (group * g.mg..(group + 1) * g.mg).step_by(ocb) {
            let end = (oc0 + ocb).min((group + 1) * g.mg);
            if (end - start) * per_channel > most {
                channels.push(start..oc0);
                start = oc0;
            }
        }
    }
    channels.push(start..g.m);
    let plane = g.oh * g.ow;
    let mut windows = Vec::new();
    for n in 0..g.n {
        for ch in &channels {
            let at = |oc: usize| (n * g.m + oc) * plane;
            let e = at(ch.start).max(elems.start)..at(ch.end).min(elems.end);
            if !e.is_empty() {
                windows.push(WeightWindow {
                    elems: e,
                    weights: ch.start * per_channel..ch.end * per_channel,
                });
            }
        }
    }
    Some(windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A conv of `n` images of `m` output channels on 6 x 5 output planes, `group` groups of
    /// `cg` input channels, `k` x `k` kernels.
    fn geom(n: usize, (cg, m, group): (usize, usize, usize), k: usize) -> Geom2 {
        Geom2 {
            n,
            c: cg * group,
            h: 6,
            w: 5,
            m,
            kh: k,
            kw: k,
            sh: 1,
            sw: 1,
            dh: 1,
            dw: 1,
            pt: (k / 2) as i64,
            pl: (k / 2) as i64,
            oh: 6,
            ow: 5,
            group,
            cg,
            mg: m / group,
        }
    }

    /// The pieces cover `elems` in order, each within one image; each piece's weights start on
    /// a channel block, hold the weights of every channel its elements belong to, and fit.
    fn check(g: &Geom2, elems: Range<usize>, ocb: usize) -> usize {
        let ws = weight_windows(g, elems.clone(), ocb).unwrap();
        let (plane, per) = (g.oh * g.ow, g.cg * g.kh * g.kw);
        let mut at = elems.start;
        for w in &ws {
            assert_eq!(w.elems.start, at, "{ws:?}");
            assert!(w.elems.start < w.elems.end);
            at = w.elems.end;
            let (first, last) = (w.elems.start / plane, (w.elems.end - 1) / plane);
            assert_eq!(first / g.m, last / g.m, "one image: {w:?}");
            let (oc0, oc1) = (first % g.m, last % g.m);
            assert!(w.weights.start <= oc0 * per && (oc1 + 1) * per <= w.weights.end);
            assert_eq!(w.weights.start % per, 0);
            assert_eq!((w.weights.start / per % g.mg) % ocb, 0, "on a block: {w:?}");
            assert!(w.weights.len() * 4 <= UNIFORM_WINDOW_BYTES);
        }
        assert_eq!(at, elems.end);
        ws.len()
    }

    #[test]
    fn pieces_cover_the_rows_and_their_weights_fit_a_window() {
        let all = |g: &Geom2| 0..g.n * g.m * g.oh * g.ow;
        // 3x3 16 -> 32: all weights (18 KiB) in one window.
        let g = geom(1, (16, 32, 1), 3);
        assert_eq!(check(&g, all(&g), 8), 1);
        // 3x3 64 -> 64: 2304 bytes a channel, 28 channels a window: blocks of 8 cut at 24, 48.
        let g = geom(1, (64, 64, 1), 3);
        assert_eq!(check(&g, all(&g), 8), 3);
        // A part of the rows, starting and ending inside channels.
        assert_eq!(check(&g, 17 * 30 + 5..50 * 30 + 10, 8), 3);
        // Two images: the pieces restart at the second.
        let g = geom(2, (64, 64, 1), 3);
        assert_eq!(check(&g, all(&g), 8), 6);
        // Groups of 12 output channels: blocks at 0, 8 of each group.
        let g = geom(1, (100, 48, 4), 3);
        check(&g, all(&g), 8);
        check(&g, 31..1400, 4);
        // Depthwise: one channel a block.
        let g = geom(1, (1, 4096, 4096), 3);
        assert_eq!(check(&g, all(&g), 1), 3);
    }

    #[test]
    fn a_block_whose_weights_overflow_a_window_has_none() {
        // 3x3 512 -> 512: 18 KiB a channel, 4 channels 72 KiB.
        let g = geom(1, (512, 512, 1), 3);
        assert_eq!(weight_windows(&g, 0..30, 8), None);
        assert_eq!(weight_windows(&g, 0..30, 4), None);
        assert!(weight_windows(&g, 0..30, 1).is_some());
    }
}
