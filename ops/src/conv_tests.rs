//! Conv's CPU tests: every fast path (1-D, shared im2col, channel x pixel tiles, grouped,
//! depthwise with stride and dilation) against the convolution's definition as nested loops.

use super::*;
use crate::AttrValue;
use cpu::winograd::Variant;

fn fill(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as u32 * 7 + seed * 13) % 23) as f32 / 11.0 - 1.0)
        .collect()
}

/// Conv by the definition, 2-D, explicit begin pads, any group.
#[allow(clippy::too_many_arguments)]
fn naive(
    x: &[f32],
    xs: [usize; 4],
    w: &[f32],
    ws: [usize; 4],
    b: Option<&[f32]>,
    group: usize,
    s: [usize; 2],
    d: [usize; 2],
    p: [i64; 2],
    o: [usize; 2],
) -> Vec<f32> {
    let [n, c, h, wd] = xs;
    let [m, cg, kh, kw] = ws;
    let mg = m / group;
    let mut out = vec![0.0; n * m * o[0] * o[1]];
    for ni in 0..n {
        for oc in 0..m {
            let g = oc / mg;
            for y in 0..o[0] {
                for xo in 0..o[1] {
                    let mut acc = b.map_or(0.0, |b| b[oc]);
                    for ci in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let ih = (y * s[0] + i * d[0]) as i64 - p[0];
                                let iw = (xo * s[1] + j * d[1]) as i64 - p[1];
                                if ih < 0 || iw < 0 || ih >= h as i64 || iw >= wd as i64 {
                                    continue;
                                }
                                let xi =
                                    ((ni * c + g * cg + ci) * h + ih as usize) * wd + iw as usize;
                                acc += x[xi] * w[((oc * cg + ci) * kh + i) * kw + j];
                            }
                        }
                    }
                    out[((ni * m + oc) * o[0] + y) * o[1] + xo] = acc;
                }
            }
        }
    }
    out
}

/// A Conv's attributes: group, strides, dilations, pads.
fn conv_attrs(group: usize, s: [usize; 2], d: [usize; 2], pads: [i64; 4]) -> Attrs {
    let ints = |v: [usize; 2]| AttrValue::Ints(v.iter().map(|&v| v as i64).collect());
    Attrs::new(11)
        .with("group", AttrValue::Int(group as i64))
        .with("strides", ints(s))
        .with("dilations", ints(d))
        .with("pads", AttrValue::Ints(pads.to_vec()))
}

/// The CPU kernel's output (whole, then cut in two at a row inside a channel) and the
/// definition's, for a Conv with `m` output channels over `xs` (bias from `fill` where `bias`).
#[allow(clippy::too_many_arguments)]
fn outputs(
    xs: [usize; 4],
    m: usize,
    k: [usize; 2],
    group: usize,
    s: [usize; 2],
    d: [usize; 2],
    pads: [i64; 4],
    bias: bool,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let op = conv(&conv_attrs(group, s, d, pads)).unwrap();
    outputs_of(&*op, xs, m, k, group, s, d, pads, bias)
}

/// [`outputs`] of a given op (made from [`conv_attrs`] of the same arguments); the definition
/// has no activation.
#[allow(clippy::too_many_arguments, clippy::single_range_in_vec_init)]
fn outputs_of(
    op: &dyn Op,
    xs: [usize; 4],
    m: usize,
    k: [usize; 2],
    group: usize,
    s: [usize; 2],
    d: [usize; 2],
    pads: [i64; 4],
    bias: bool,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let ws = [m, xs[1] / group, k[0], k[1]];
    let x = Tensor::f32(&xs, fill(xs.iter().product(), 1));
    let w = Tensor::f32(&ws, fill(ws.iter().product(), 2));
    let b = Tensor::f32(&[m], fill(m, 3));
    let mut ins = vec![x.clone(), w.clone()];
    if bias {
        ins.push(b.clone());
    }
    let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
    let mrefs: Vec<&TensorMeta> = metas.iter().collect();
    let oshape = op.infer(&mrefs).unwrap()[0].shape.clone();
    let o = [oshape[2], oshape[3]];
    let want = naive(
        x.as_f32().unwrap(),
        xs,
        w.as_f32().unwrap(),
        ws,
        bias.then(|| b.as_f32().unwrap()),
        group,
        s,
        d,
        [pads[0], pads[1]],
        o,
    );
    let rows = oshape[0] * oshape[1] * oshape[2];
    let refs: Vec<&Tensor> = ins.iter().collect();
    let cut = rows / 3 + 1;
    let got = [vec![0..rows], vec![0..cut, cut..rows]].map(|parts| {
        let mut out = vec![Tensor::zeros(DType::F32, &oshape)];
        for r in parts {
            op.cpu(&refs, &mut out, r).unwrap();
        }
        out[0].as_f32().unwrap().to_vec()
    });
    (got.to_vec(), want)
}

/// [`outputs`]: the kernel's within 1e-4 of the definition's.
#[allow(clippy::too_many_arguments)]
fn case(
    xs: [usize; 4],
    m: usize,
    k: [usize; 2],
    group: usize,
    s: [usize; 2],
    d: [usize; 2],
    pads: [i64; 4],
    bias: bool,
) {
    let (got, want) = outputs(xs, m, k, group, s, d, pads, bias);
    for g in got {
        for (i, (gv, wv)) in g.iter().zip(&want).enumerate() {
            assert!(
                (gv - wv).abs() < 1e-4,
                "{xs:?} m {m} k {k:?} g {group} s {s:?}: [{i}] {gv} vs {wv}"
            );
        }
    }
}

/// [`outputs_of`] a Conv op against the definition with the op's activation applied.
#[allow(clippy::too_many_arguments)]
fn activated_case(
    op: &Conv,
    xs: [usize; 4],
    m: usize,
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
    pads: [i64; 4],
    bias: bool,
) {
    let act = op.activation;
    let (got, want) = outputs_of(op, xs, m, k, 1, s, d, pads, bias);
    for g in got {
        for (j, (gv, wv)) in g.iter().zip(&want).enumerate() {
            let wv = act.apply(*wv);
            assert!(
                (gv - wv).abs() < 1e-4,
                "{xs:?} m {m} k {k:?} s {s:?} bias {bias} {act:?}: [{j}] {gv} vs {wv}"
            );
        }
    }
}

/// A stride-1 Conv + Relu of a kept W with both residuals, `relu(conv + b + z)` and
/// `relu(conv + b) + z`, against the definition.
fn residual_cases(xs: [usize; 4], m: usize, k: [usize; 2], pads: [i64; 4]) {
    let [n, c, h, w] = xs;
    let (oh, ow) = (
        (h as i64 + pads[0] + pads[2]) as usize - k[0] + 1,
        (w as i64 + pads[1] + pads[3]) as usize - k[1] + 1,
    );
    let ws = [m, c, k[0], k[1]];
    let (x, wt, b) = (
        fill(n * c * h * w, 1),
        fill(ws.iter().product(), 2),
        fill(m, 3),
    );
    let z = fill(n * m * oh * ow, 4);
    let p = [pads[0], pads[1]];
    let conv = naive(&x, xs, &wt, ws, Some(&b), 1, [1, 1], [1, 1], p, [oh, ow]);
    for residual in [Residual::BeforeAct, Residual::AfterAct] {
        let attrs = conv_attrs(1, [1, 1], [1, 1], pads);
        let op = Conv {
            activation: Activation::Relu,
            residual,
            ..Conv::plain(&attrs).unwrap().with_constant_weight()
        };
        let ins = [
            Tensor::f32(&xs, x.clone()),
            Tensor::f32(&ws, wt.clone()),
            Tensor::f32(&[m], b.clone()),
            Tensor::f32(&[n, m, oh, ow], z.clone()),
        ];
        let refs: Vec<&Tensor> = ins.iter().collect();
        let mut out = vec![Tensor::zeros(DType::F32, &[n, m, oh, ow])];
        op.cpu(&refs, &mut out, 0..n * m * oh).unwrap();
        for (j, gv) in out[0].as_f32().unwrap().iter().enumerate() {
            let wv = match residual {
                Residual::BeforeAct => Activation::Relu.apply(conv[j] + z[j]),
                _ => Activation::Relu.apply(conv[j]) + z[j],
            };
            assert!(
                (gv - wv).abs() < 1e-4,
                "{xs:?} {residual:?}: [{j}] {gv} vs {wv}"
            );
        }
    }
}

#[test]
#[allow(clippy::single_range_in_vec_init)]
fn conv_matches_definition() {
    case(
        [1, 3, 9, 11],
        5,
        [3, 3],
        1,
        [1, 1],
        [1, 1],
        [1, 1, 1, 1],
        true,
    );
    case(
        [2, 4, 10, 7],
        6,
        [3, 2],
        2,
        [2, 1],
        [1, 2],
        [0, 1, 2, 0],
        false,
    );
    case(
        [1, 8, 6, 6],
        8,
        [3, 3],
        8,
        [1, 1],
        [1, 1],
        [1, 1, 1, 1],
        true,
    );
    case(
        [1, 4, 12, 12],
        8,
        [5, 5],
        4,
        [2, 2],
        [1, 1],
        [2, 2, 2, 2],
        true,
    );
    case(
        [2, 6, 5, 7],
        4,
        [1, 1],
        1,
        [1, 1],
        [1, 1],
        [0, 0, 0, 0],
        true,
    );
    case(
        [1, 16, 20, 20],
        12,
        [3, 3],
        1,
        [1, 1],
        [2, 2],
        [2, 2, 2, 2],
        false,
    );
    case(
        [1, 1, 7, 7],
        3,
        [3, 3],
        1,
        [2, 2],
        [1, 1],
        [1, 0, 1, 0],
        true,
    );
    // many pixel chunks, rectangles starting inside a chunk, several images and groups
    type Case = ([usize; 4], usize, usize, [usize; 2], [i64; 4]);
    let big: &[Case] = &[
        ([1, 8, 40, 40], 16, 1, [1, 1], [1, 1, 1, 1]),
        ([2, 8, 33, 30], 6, 2, [1, 2], [1, 1, 1, 1]),
        ([2, 32, 17, 19], 8, 1, [1, 1], [0, 0, 0, 0]),
    ];
    for &(xs, m, group, s, pads) in big {
        let k = if pads[0] == 0 { [1, 1] } else { [3, 3] };
        case(xs, m, k, group, s, [1, 1], pads, true);
    }
}

/// The paths added for speed, each against the 7-loop definition: 1-D convolutions (one
/// pixel per output line: the strided im2col column), tiled GEMMs (at least as many output
/// channels as pixels: one shared im2col block, or X read directly for 1x1), grouped tiles, depthwise lines batched per task with strides and dilations, and the
/// shifted-copy im2col of stride-1 convs whose output rows are as long as their input rows,
/// and pixel chunks cut by their output size.
#[test]
fn fast_paths_match_definition() {
    type Case = (
        [usize; 4],
        usize,
        [usize; 2],
        usize,
        [usize; 2],
        [usize; 2],
        [i64; 4],
    );
    let cases: &[Case] = &[
        ([1, 16, 30, 1], 40, [5, 1], 1, [1, 1], [1, 1], [2, 0, 2, 0]),
        ([2, 6, 23, 1], 12, [3, 1], 1, [2, 1], [2, 1], [1, 0, 0, 0]),
        ([1, 256, 20, 1], 64, [5, 1], 1, [1, 1], [1, 1], [0, 0, 0, 0]),
        ([2, 64, 5, 5], 96, [3, 3], 2, [1, 1], [1, 1], [1, 1, 1, 1]),
        ([1, 128, 4, 4], 64, [1, 1], 1, [1, 1], [1, 1], [0, 0, 0, 0]),
        ([1, 40, 9, 7], 48, [3, 3], 1, [2, 2], [1, 1], [1, 1, 1, 1]),
        (
            [1, 12, 15, 15],
            12,
            [3, 3],
            12,
            [2, 2],
            [2, 2],
            [2, 2, 2, 2],
        ),
        ([2, 6, 9, 9], 12, [3, 3], 6, [1, 2], [1, 1], [1, 0, 1, 2]),
        // Depthwise with strides past the kernel: the plane path keeps only the phases a tap
        // reads (a stride of 2^31 once asked for 2^31 phase planes).
        ([1, 6, 17, 19], 6, [3, 2], 6, [4, 5], [1, 1], [1, 0, 1, 2]),
        ([2, 5, 13, 1], 5, [3, 1], 5, [7, 3], [1, 1], [2, 0, 2, 0]),
        // Depthwise 5x5 (its taps summed in registers, like 3x3), strided and not.
        ([1, 8, 20, 19], 8, [5, 5], 8, [2, 2], [1, 1], [2, 2, 2, 2]),
        ([2, 3, 9, 11], 3, [5, 5], 3, [1, 1], [1, 1], [1, 2, 3, 0]),
        // Stride 1, output rows as long as input rows: the shifted-copy im2col, with pixel
        // chunks that start mid-row and asymmetric pads.
        ([1, 24, 37, 29], 20, [5, 5], 1, [1, 1], [1, 1], [2, 2, 2, 2]),
        ([2, 6, 11, 13], 7, [3, 3], 1, [1, 1], [1, 1], [0, 2, 2, 0]),
        ([1, 5, 8, 9], 9, [3, 3], 1, [1, 1], [2, 1], [3, 1, 1, 1]),
        // A first layer (3 input channels, 64 outputs, 3x3/2): pixel chunks cut at 1024 by
        // the cap on output elements, mid-row.
        ([1, 3, 70, 70], 64, [3, 3], 1, [2, 2], [1, 1], [1, 1, 1, 1]),
        (
            [1, 32, 56, 56],
            32,
            [3, 3],
            32,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
        ),
    ];
    for &(xs, m, k, group, s, d, pads) in cases {
        for bias in [true, false] {
            case(xs, m, k, group, s, d, pads, bias);
        }
    }
}

/// The shared-im2col tiles of channels x pixels (`tile_split`) that keep every thread busy
/// where pixel chunks would not, in pools whose sizes cut them differently (3 threads: pixel
/// parts; 8: a 2 x 4 grid; 16: more tiles than threads, the minimum sizes allow no exact grid),
/// with the row ranges of `case` that start inside a channel. Strided 3x3, strided 1x1 (im2col),
/// 1x1 read in place over two images, grouped.
#[test]
fn tiles_for_many_threads_match_definition() {
    type Case = (
        [usize; 4],
        usize,
        [usize; 2],
        usize,
        [usize; 2],
        [i64; 4],
        bool,
    );
    let cases: &[Case] = &[
        ([1, 16, 20, 20], 24, [3, 3], 1, [2, 2], [1, 1, 1, 1], true),
        ([1, 12, 28, 28], 40, [1, 1], 1, [2, 2], [0, 0, 0, 0], true),
        ([2, 8, 15, 15], 64, [1, 1], 1, [1, 1], [0, 0, 0, 0], false),
        ([1, 8, 18, 18], 32, [3, 3], 2, [1, 1], [1, 1, 1, 1], true),
    ];
    for threads in [3, 8, 16] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            for &(xs, m, k, group, s, pads, bias) in cases {
                case(xs, m, k, group, s, [1, 1], pads, bias);
            }
        });
    }
}

/// Tile grids: exactly one tile per thread where the minimum tile (8 channels, 16 pixels)
/// allows, the grid with the least operand reads among those, and no tile below the minimum.
#[test]
fn tile_grid_keeps_threads_busy_with_the_smallest_reads() {
    // 128 channels x 784 pixels on 16 threads: reads per tile 128 + 49 (1 x 16), 64 + 98
    // (2 x 8), 32 + 196 (4 x 4), ...: 2 x 8.
    assert_eq!(cpu::tile_grid(128, 784, 16), (2, 8));
    // Deep layer, 7x7: channels only.
    assert_eq!(cpu::tile_grid(512, 49, 16), (16, 1));
    // One thread: one tile.
    assert_eq!(cpu::tile_grid(512, 49, 1), (1, 1));
    for (oc, pix, threads) in [(24, 100, 16), (8, 16, 4), (1, 3000, 16), (300, 7, 8)] {
        let (kc, kp) = cpu::tile_grid(oc, pix, threads);
        assert!(
            kc == 1 || oc / kc >= 8,
            "{oc}x{pix}/{threads}: {kc} channel parts"
        );
        assert!(
            kp == 1 || pix / kp >= 16,
            "{oc}x{pix}/{threads}: {kp} pixel parts"
        );
        assert!(kc * kp <= threads + kc, "{oc}x{pix}/{threads}: {kc}x{kp}");
    }
    assert_eq!(cpu::tile_grid(1, 3000, 16), (1, 16));
    assert_eq!(cpu::tile_grid(24, 100, 16), (3, 6));
}

#[test]
fn auto_pad_and_one_dimensional_shapes() {
    let x = TensorMeta::new(DType::F32, vec![1, 2, 7, 5]);
    let w = TensorMeta::new(DType::F32, vec![3, 2, 3, 3]);
    let same = |mode: &str| {
        conv(
            &Attrs::new(11)
                .with("auto_pad", AttrValue::String(mode.into()))
                .with("strides", AttrValue::Ints(vec![2, 2])),
        )
        .unwrap()
    };
    assert_eq!(
        same("SAME_UPPER").infer(&[&x, &w]).unwrap()[0].shape,
        vec![1, 3, 4, 3]
    );
    assert_eq!(
        same("VALID").infer(&[&x, &w]).unwrap()[0].shape,
        vec![1, 3, 3, 2]
    );
    let x1 = TensorMeta::new(DType::F32, vec![1, 2, 9]);
    let w1 = TensorMeta::new(DType::F32, vec![4, 2, 3]);
    let op = conv(&Attrs::new(11)).unwrap();
    assert_eq!(op.infer(&[&x1, &w1]).unwrap()[0].shape, vec![1, 4, 7]);
    let bad = TensorMeta::new(DType::F32, vec![4, 3, 3]);
    assert!(matches!(op.infer(&[&x1, &bad]), Err(OpError::Invalid(_))));
    assert_eq!(
        conv_out_len(5, (3, 2, 1, 0, 0), AutoPad::SameLower).unwrap(),
        (3, 1)
    );
    assert_eq!(
        conv_out_len(6, (3, 2, 1, 0, 0), AutoPad::SameUpper).unwrap(),
        (3, 0)
    );
}

/// Pseudo-random values in [-1, 1) (a 32-bit LCG), so sums over many channels do not cancel
/// by pattern.
fn random(len: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// 3x3 stride-1 group-1 Conv by the definition in f64: per output, the exact sum (bias
/// included) and the sum of the magnitudes of its terms (the scale its rounding error has).
fn naive_3x3_f64(
    x: &[f32],
    [n, c, h, wd]: [usize; 4],
    w: &[f32],
    m: usize,
    b: Option<&[f32]>,
    [pt, pl]: [i64; 2],
    [oh, ow]: [usize; 2],
) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(n * m * oh * ow);
    for ni in 0..n {
        for oc in 0..m {
            for y in 0..oh {
                for xo in 0..ow {
                    let bv = b.map_or(0.0, |b| b[oc] as f64);
                    let (mut acc, mut mag) = (bv, bv.abs());
                    for ci in 0..c {
                        for i in 0..3 {
                            for j in 0..3 {
                                let ih = (y + i) as i64 - pt;
                                let iw = (xo + j) as i64 - pl;
                                if ih < 0 || iw < 0 || ih >= h as i64 || iw >= wd as i64 {
                                    continue;
                                }
                                let xv = x[((ni * c + ci) * h + ih as usize) * wd + iw as usize];
                                let t = xv as f64 * w[((oc * c + ci) * 3 + i) * 3 + j] as f64;
                                acc += t;
                                mag += t.abs();
                            }
                        }
                    }
                    out.push((acc, mag));
                }
            }
        }
    }
    out
}

/// One Winograd case: the op's geometry for X `xs`, `m` 3x3 filters, `pads`, run through
/// `winograd_path` directly (whatever the size thresholds say) over each list of row ranges
/// of `cuts`, each into an output prefilled with NaN, against the f64 loop: every element
/// inside the ranges within 1e-5 of the largest sum of terms' magnitudes in its 4x4 output
/// tile (after the activation; measured worst 1.8e-6), every element outside them untouched.
fn winograd_case(xs: [usize; 4], m: usize, pads: [i64; 4], bias: bool, act: Activation) {
    let ws = [m, xs[1], 3, 3];
    let x = random(xs.iter().product(), 1);
    let w = random(ws.iter().product(), 2);
    let b = random(m, 3);
    let attrs = Attrs::new(11).with("pads", AttrValue::Ints(pads.to_vec()));
    let op = Conv {
        activation: act,
        ..Conv::plain(&attrs).unwrap()
    };
    let (g, oshape) = op.geom(&[&xs, &ws]).unwrap();
    assert!(cpu::winograd::supports(&g));
    let bias = bias.then_some(b.as_slice());
    let want = naive_3x3_f64(&x, xs, &w, m, bias, [pads[0], pads[1]], [g.oh, g.ow]);
    let rows = g.n * g.m * g.oh;
    // Whole range; thirds cut mid-tile and mid-channel; a single odd row; a middle range.
    let c1 = rows / 3 + 1;
    let c2 = (2 * rows / 3) | 1;
    let cuts: Vec<Vec<Range<usize>>> = vec![
        vec![0..rows],
        vec![0..c1, c1..c2, c2..rows],
        vec![g.oh + 1..g.oh + 2],
        vec![c1..c2],
    ];
    for v in [Variant::F2, Variant::F4] {
        winograd_variant_case(v, (&g, &oshape), (&x, &w, bias), &want, act, &cuts);
    }
}

/// Winograd's rounding spreads across a tile: the scale of output `i`'s error is the largest
/// sum of terms' magnitudes (`want[..].1`) in its 4x4 output tile (tiles start at row and
/// column 0 of each plane; F(2x2, 3x3)'s tiles lie inside these).
fn tile_mag(g: &Geom2, want: &[(f64, f64)], i: usize) -> f64 {
    let (plane, oy, ox) = (i / (g.oh * g.ow), i / g.ow % g.oh, i % g.ow);
    let (ty, tx) = (oy / 4 * 4, ox / 4 * 4);
    let at = |y: usize, x: usize| want[(plane * g.oh + y) * g.ow + x].1;
    (ty..(ty + 4).min(g.oh))
        .flat_map(|y| (tx..(tx + 4).min(g.ow)).map(move |x| (y, x)))
        .map(|(y, x)| at(y, x))
        .fold(0.0f64, f64::max)
}

/// [`winograd_case`] for one variant.
fn winograd_variant_case(
    v: Variant,
    (g, oshape): (&Geom2, &[usize]),
    (x, w, bias): (&[f32], &[f32], Option<&[f32]>),
    want: &[(f64, f64)],
    act: Activation,
    cuts: &[Vec<Range<usize>>],
) {
    let (xs, m, pads) = ([g.n, g.c, g.h, g.w], g.m, [g.pt, g.pl]);
    // W transformed per call, and kept for all output channels (ranges that start
    // mid-channel read the kept rows from an offset).
    let mut all = vec![0.0f32; cpu::winograd::weights_len(v, g, m)];
    cpu::winograd::transform_weights(v, g, w, 0..m, &mut all);
    // Default blocks, then one tile row per block (one task per block).
    let budgets = [None, Some(1)];
    let runs = cuts
        .iter()
        .flat_map(|c| budgets.map(|b| (c.clone(), b)))
        .flat_map(|(c, b)| [None, Some(all.as_slice())].map(|k| (c.clone(), b, k)));
    for (parts, budget, kept) in runs {
        let mut out = vec![f32::NAN; oshape.iter().product()];
        cpu::winograd::TEST_BLOCK.with(|c| c.set(budget));
        for r in &parts {
            let wbe = (w, bias, act.into());
            cpu::winograd::winograd_path(v, g, x, wbe, kept, &mut out, r.clone());
        }
        cpu::winograd::TEST_BLOCK.with(|c| c.set(None));
        let inside = |row: usize| parts.iter().any(|r| r.contains(&row));
        for (i, (got, (exact, _))) in out.iter().zip(want).enumerate() {
            if !inside(i / g.ow) {
                assert!(
                    got.is_nan(),
                    "{xs:?} {pads:?} {parts:?}: [{i}] written: {got}"
                );
                continue;
            }
            let expect = act.apply(*exact as f32);
            let tol = 1e-5 * tile_mag(g, want, i) as f32 + 1e-6;
            assert!(
                (got - expect).abs() <= tol,
                "{v:?} {xs:?} m {m} pads {pads:?} {act:?} {parts:?} {budget:?} kept {}: [{i}] {got} vs {expect} (tol {tol})",
                kept.is_some()
            );
        }
    }
}

/// Winograd F(2x2, 3x3) and F(4x4, 3x3) against the f64 definition: sizes that are not
/// multiples of the tile, pads 0, 1, asymmetric and larger than the kernel, two images, up to
/// 256 input channels, every activation, with and without bias, row ranges cut mid-tile and
/// mid-channel; a plane whose point GEMMs run on the taps kernel (`winograd::tiled`).
#[test]
fn winograd_matches_f64_definition() {
    let acts = [
        Activation::None,
        Activation::Relu,
        Activation::LeakyRelu(0.1),
        Activation::Clip(-0.5, 0.75),
        Activation::Sigmoid,
        Activation::Silu,
    ];
    type Case = ([usize; 4], usize, [i64; 4]);
    let cases: &[Case] = &[
        ([1, 5, 9, 11], 7, [1, 1, 1, 1]),
        ([2, 8, 10, 13], 6, [0, 0, 0, 0]),
        ([1, 6, 7, 8], 5, [0, 2, 2, 0]),
        ([2, 3, 4, 5], 2, [3, 1, 2, 4]),
        ([1, 4, 3, 3], 3, [0, 0, 0, 0]),
        ([1, 2, 1, 1], 3, [1, 1, 1, 1]),
        ([2, 17, 6, 1], 4, [1, 0, 1, 2]),
        ([1, 256, 12, 9], 20, [1, 1, 1, 1]),
        ([2, 64, 15, 14], 33, [1, 0, 0, 1]),
        // 210 tile slots at F(4x4, 3x3): the point GEMMs on the taps kernel (AVX-512),
        // output channels in two blocks of 8 and one of 4.
        ([1, 16, 54, 56], 20, [1, 1, 1, 1]),
    ];
    for (i, &(xs, m, pads)) in cases.iter().enumerate() {
        for bias in [true, false] {
            winograd_case(xs, m, pads, bias, acts[i % acts.len()]);
        }
    }
    for act in acts {
        winograd_case([1, 9, 7, 10], 5, [1, 1, 1, 1], true, act);
    }
}

/// Small F(4x4) planes whose tile rows split evenly over the threads run one band per thread,
/// each with its own V, M 16 output channels at a time (`winograd::BAND_MAX_V`): at two
/// threads squeezenet's 16 -> 64 on 55x55 does, in bands of 7 tile rows; F(2x2) planes
/// (squeezenet's 32 -> 128 on 27x27), 64 input channels (V too large), an odd count of tile
/// rows and 12x12 planes do not; one thread never. The banded planes match the f64 definition in a
/// pool of two threads (20 output channels: M in a chunk of 16 and one of 4), whole and cut.
#[test]
fn winograd_small_planes_run_in_bands() {
    let geom = |xs: [usize; 4], m: usize| {
        let op = Conv::plain(&Attrs::new(11).with("pads", AttrValue::Ints(vec![1; 4]))).unwrap();
        op.geom(&[&xs, &[m, xs[1], 3, 3]]).unwrap().0
    };
    for (xs, m, v, bands) in [
        ([1, 16, 55, 55], 64, Variant::F4, Some(7)),
        ([1, 32, 27, 27], 128, Variant::F2, None),
        ([1, 64, 55, 55], 64, Variant::F4, None),
        ([1, 16, 54, 54], 64, Variant::F2, None),
        ([1, 16, 12, 12], 64, Variant::F4, None),
    ] {
        let g = geom(xs, m);
        assert_eq!(cpu::winograd::bands_of(v, &g, 2), bands, "{xs:?} {v:?}");
        assert_eq!(cpu::winograd::bands_of(v, &g, 1), None, "{xs:?} {v:?}");
    }
    let two = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    two.install(|| {
        assert_eq!(
            cpu::winograd::bands_of(Variant::F4, &geom([1, 16, 55, 55], 20), 2),
            Some(7)
        );
        winograd_case([1, 16, 55, 55], 20, [1, 1, 1, 1], true, Activation::Relu);
    });
}

/// Through `Op::cpu`: a conv large enough for `conv_cpu` to choose Winograd (unless
/// `TANDEM_CONV_WINOGRAD=0`) matches the f64 definition, whole and cut in two mid-channel.
#[test]
fn conv_cpu_takes_winograd_where_it_applies() {
    // A 420-pixel plane (F(2x2, 3x3)) and an 870-pixel one (F(4x4, 3x3)).
    for (h, w, variant) in [(21, 20, Variant::F2), (29, 30, Variant::F4)] {
        conv_cpu_winograd_case([2, 64, h, w], variant);
    }
}

/// [`conv_cpu_takes_winograd_where_it_applies`] on X of shape `xs` (64 channels), which takes
/// Winograd `variant`.
fn conv_cpu_winograd_case(xs: [usize; 4], variant: Variant) {
    let ws = [64, 64, 3, 3];
    let attrs = Attrs::new(11).with("pads", AttrValue::Ints(vec![1, 1, 1, 1]));
    let op = Conv {
        activation: Activation::Relu,
        ..Conv::plain(&attrs).unwrap()
    };
    let (g, oshape) = op.geom(&[&xs, &ws]).unwrap();
    assert_eq!(cpu::winograd::applies(&g, false), cpu::winograd::enabled());
    assert_eq!(Variant::of(&g), variant);
    let x = Tensor::f32(&xs, random(xs.iter().product(), 4));
    let w = Tensor::f32(&ws, random(ws.iter().product(), 5));
    let b = Tensor::f32(&[64], random(64, 6));
    let (xv, wv, bv) = (
        x.as_f32().unwrap(),
        w.as_f32().unwrap(),
        b.as_f32().unwrap(),
    );
    let want = naive_3x3_f64(xv, xs, wv, 64, Some(bv), [1, 1], [g.oh, g.ow]);
    let rows = g.n * g.m * g.oh;
    let cut = rows / 2 + 7;
    // A W the op keeps the transform of: the first call computes it, the later ones read it.
    let kept = op.with_constant_weight();
    assert_eq!(kept.cpu_takes_winograd(&g), cpu::winograd::enabled());
    #[allow(clippy::single_range_in_vec_init)]
    let splits = [vec![0..rows], vec![0..cut, cut..rows]];
    for (op, parts) in [&op, &kept, &kept].into_iter().zip(splits.iter().cycle()) {
        let mut out = vec![Tensor::zeros(DType::F32, &oshape)];
        for r in parts.clone() {
            op.cpu(&[&x, &w, &b], &mut out, r).unwrap();
        }
        for (i, (got, (exact, _))) in out[0].as_f32().unwrap().iter().zip(&want).enumerate() {
            let expect = Activation::Relu.apply(*exact as f32);
            assert!(
                (got - expect).abs() <= 1e-5 * tile_mag(&g, &want, i) as f32 + 1e-6,
                "{variant:?} [{i}] {got} vs {expect}"
            );
        }
    }
}

/// Speed of Winograd F(2x2, 3x3) and F(4x4, 3x3) (W kept) and of the packed GEMM path against
/// im2col + GEMM on the 3x3 stride-1 shapes of the models (not a test: `cargo test --release
/// -p tandem-ops --lib winograd_speed -- --ignored --nocapture`).
#[test]
#[ignore]
fn winograd_speed() {
    let shapes: &[(usize, usize, usize)] = &[
        (64, 64, 224),
        (128, 128, 112),
        (256, 256, 56),
        (512, 512, 28),
        (64, 192, 56),
        (64, 64, 56),
        (64, 96, 28),
        (96, 96, 28),
        (128, 128, 28),
        (96, 128, 14),
        (128, 160, 14),
        (192, 256, 14),
        (256, 256, 14),
        (192, 320, 7),
        (224, 224, 7),
        (512, 512, 7),
        (16, 16, 80),
        (32, 32, 40),
        (64, 64, 20),
        (128, 128, 10),
        (64, 256, 13),
        (256, 256, 12),
        (32, 32, 14),
        (16, 32, 28),
    ];
    let reps = 30;
    for &(c, m, hw) in shapes {
        let xs = [1, c, hw, hw];
        let x = random(c * hw * hw, 1);
        let w = random(m * c * 9, 2);
        let b = random(m, 3);
        let attrs = Attrs::new(11).with("pads", AttrValue::Ints(vec![1, 1, 1, 1]));
        let op = Conv {
            activation: Activation::Relu,
            ..Conv::plain(&attrs).unwrap()
        };
        let (g, _) = op.geom(&[&xs, &[m, c, 3, 3]]).unwrap();
        let rows = m * hw;
        let mut out = vec![0.0f32; m * hw * hw];
        let ab = (w.as_slice(), Some(b.as_slice()), Activation::Relu.into());
        let kept = [Variant::F2, Variant::F4].map(|v| {
            let mut u = vec![0.0f32; cpu::winograd::weights_len(v, &g, m)];
            cpu::winograd::transform_weights(v, &g, &w, 0..m, &mut u);
            (v, u)
        });
        // W packed once for the packed GEMM path (where it runs; else its column repeats im2col).
        let kept_w = ConstantWeight::default();
        let packed = cpu::packed::runs_here().then(|| kept_w.packed(&g, &w));
        let best = best_times(reps, |k| {
            match (k, &packed) {
                (1 | 2, _) => {
                    let (v, u) = &kept[k - 1];
                    cpu::winograd::winograd_path(*v, &g, &x, ab, Some(u), &mut out, 0..rows)
                }
                (3, Some(p)) => {
                    let pab = (*p, Some(b.as_slice()), Activation::Relu.into());
                    cpu::packed::packed_path(&g, &x, pab, None, &mut out, 0..rows)
                }
                _ => cpu::gemm_path(&g, &x, ab, None, &mut out, 0..rows),
            }
            true
        });
        let gf = 2.0 * (m * c * 9 * hw * hw) as f64 / 1e9;
        let [tg, t2, t4, tp] = best;
        println!(
            "C {c:4} M {m:4} {hw:3}x{hw:<3} im2col {:8.1} us {:4.0} GF/s | F2 {:8.1} us x{:.2} | F4 {:8.1} us x{:.2} | packed W {:8.1} us x{:.2}",
            tg * 1e6,
            gf / tg,
            t2 * 1e6,
            tg / t2,
            t4 * 1e6,
            tg / t4,
            tp * 1e6,
            tg / tp
        );
    }
}

/// Depthwise convs (the plane path, whose weighted taps run several vectors at a time, and
/// the in-place path of same-size 3x3 and 5x5 windows, `conv_depthwise.rs`) add each output's
/// taps in window order after the bias, so they equal the definition's loop to the bit
/// (padding taps add zero products, which leave a nonzero sum unchanged): 3x3 and 5x5, strided
/// and not, planes whose blocks end inside and outside a group of vectors, planes narrower
/// than a vector and than the window (a vector then spans several rows, a tap several rows
/// past its own), strided rows of several vectors, two output channels per input channel,
/// and blocks that start and end inside a plane (the split run); on AVX2 both paths, AVX2 at
/// full width and at half width (Zen 1, which takes the phase planes).
#[test]
fn depthwise_sums_taps_in_window_order() {
    // (input shape, output channels, kernel, strides, pads)
    type Case = ([usize; 4], usize, [usize; 2], [usize; 2], [i64; 4]);
    let cases: &[Case] = &[
        ([1, 5, 13, 17], 5, [5, 5], [1, 1], [2, 2, 2, 2]),
        ([2, 7, 20, 19], 7, [3, 3], [1, 1], [1, 1, 1, 1]),
        ([1, 4, 15, 15], 4, [3, 3], [2, 2], [1, 1, 1, 1]),
        ([1, 3, 7, 7], 3, [5, 5], [2, 2], [2, 2, 2, 2]),
        ([1, 6, 7, 7], 6, [3, 3], [1, 1], [1, 1, 1, 1]),
        ([2, 3, 14, 14], 6, [3, 3], [1, 1], [1, 1, 1, 1]),
        ([1, 4, 3, 3], 4, [5, 5], [1, 1], [2, 2, 2, 2]),
        ([1, 4, 2, 1], 4, [3, 3], [1, 1], [1, 1, 1, 1]),
        ([1, 2, 1, 9], 2, [3, 3], [1, 1], [1, 1, 1, 1]),
        ([1, 2, 9, 2], 4, [5, 5], [1, 1], [2, 2, 2, 2]),
        ([1, 3, 9, 40], 3, [3, 3], [2, 2], [1, 1, 1, 1]),
        ([1, 2, 11, 37], 2, [5, 5], [2, 2], [2, 2, 1, 1]),
    ];
    // Half width: the phase planes where AVX2 takes the in-place path, and the reverse.
    for half in [false, true] {
        for &(xs, m, k, s, pads) in cases {
            let (got, want) = crate::simd::with_avx2_half_width(half, || {
                outputs(xs, m, k, xs[1], s, [1, 1], pads, true)
            });
            for g in got {
                for (i, (gv, wv)) in g.iter().zip(&want).enumerate() {
                    assert_eq!(
                        gv.to_bits(),
                        wv.to_bits(),
                        "{xs:?} k {k:?} s {s:?} half width {half}: [{i}] {gv} vs {wv}"
                    );
                }
            }
        }
    }
}

/// Convs whose W is kept packed (`conv_packed.rs`: constant W, at least 32 output channels (96
/// strided) and K of 256, AVX-512 or Zen 1's AVX2) against the definition: a 1x1 read in
/// place over two images, a strided 1x1 through im2col and a strided 3x3 (its im2col read in place,
/// `conv_implicit.rs`, as for every kernel of several taps here), magika's 5x1 shape (a
/// one-column conv: through im2col), 40
/// and 56 channels on 32-wide panels (a 1x1 and a padded 3x3), output channels that end
/// mid-panel, with and without bias, and Relu; a row range that starts inside an image keeps
/// `gemm_path` (same values). Planes of more than 384 pixels run as tiles: a 1x1 in place over
/// two images (420 pixels: a short last tile; two tiles, so two panel groups on two threads),
/// a padded 3x3 (667 pixels, three tiles) and a strided one.
#[test]
fn packed_weights_match_definition() {
    // On any AVX2 host as on Zen 1, where the path runs (`packed::runs_here`).
    crate::simd::with_avx2_half_width(true, packed_weights_cases)
}

/// [`packed_weights_match_definition`]'s cases, the paths chosen on this thread.
fn packed_weights_cases() {
    type Case = ([usize; 4], usize, [usize; 2], [usize; 2], [i64; 4]);
    let cases: &[Case] = &[
        ([2, 256, 9, 11], 100, [1, 1], [1, 1], [0, 0, 0, 0]),
        ([1, 256, 9, 9], 130, [1, 1], [2, 2], [0, 0, 0, 0]),
        ([1, 32, 15, 13], 96, [3, 3], [2, 2], [1, 1, 1, 1]),
        ([1, 64, 40, 1], 144, [5, 1], [1, 1], [0, 0, 0, 0]),
        ([1, 256, 7, 9], 72, [1, 1], [1, 1], [0, 0, 0, 0]),
        ([1, 48, 7, 7], 56, [3, 3], [1, 1], [1, 1, 1, 1]),
        // A small plane in two blocks of pixels (at most 2^18 outputs a block: 256 of 272).
        ([1, 256, 16, 17], 1024, [1, 1], [1, 1], [0, 0, 0, 0]),
        // Planes of more than 384 pixels (tiles) need K of 512.
        ([2, 512, 20, 21], 100, [1, 1], [1, 1], [0, 0, 0, 0]),
        ([1, 64, 23, 29], 40, [3, 3], [1, 1], [1, 1, 1, 1]),
        ([1, 64, 45, 41], 96, [3, 3], [2, 2], [1, 1, 1, 1]),
    ];
    let on = std::env::var("TANDEM_CONV_PACKED").as_deref() != Ok("0");
    for &(xs, m, k, s, pads) in cases {
        let attrs = conv_attrs(1, s, [1, 1], pads);
        for (bias, relu) in [(true, false), (false, false), (true, true)] {
            let op = Conv {
                activation: if relu {
                    Activation::Relu
                } else {
                    Activation::None
                },
                ..Conv::plain(&attrs).unwrap().with_constant_weight()
            };
            let (got, mut want) = outputs_of(&op, xs, m, k, 1, s, [1, 1], pads, bias);
            if relu {
                want.iter_mut().for_each(|v| *v = v.max(0.0));
            }
            for g in got {
                for (i, (gv, wv)) in g.iter().zip(&want).enumerate() {
                    assert!(
                        (gv - wv).abs() < 1e-4 * (1.0 + wv.abs()),
                        "{xs:?} m {m} k {k:?} s {s:?} bias {bias} relu {relu}: [{i}] {gv} vs {wv}"
                    );
                }
            }
            // Every one of these takes the packed path where the CPU runs it.
            let (g2, out) = op.geom(&[&xs, &[m, xs[1], k[0], k[1]]]).unwrap();
            let taken = cpu::packed::applies(&g2, &(0..out[0] * out[1] * out[2]))
                && !op.cpu_takes_taps(&g2)
                && !op.cpu_takes_pointwise(&g2);
            assert_eq!(taken, on && cpu::packed::runs_here(), "{xs:?} m {m}");
        }
    }
    // K of 256 takes the packed path on a plane of 384 pixels, not on one of 385 (tiles).
    for (hw, taken) in [([16, 24], true), ([5, 77], false)] {
        let op = Conv::plain(&conv_attrs(1, [1, 1], [1, 1], [0; 4])).unwrap();
        let (g2, out) = op
            .geom(&[&[1, 256, hw[0], hw[1]], &[64, 256, 1, 1]])
            .unwrap();
        assert_eq!(
            cpu::packed::applies(&g2, &(0..out[0] * out[1] * out[2])),
            taken && on && cpu::packed::runs_here(),
            "{hw:?}"
        );
    }
}

/// A one-group conv case: X's shape, output channels, kernel, strides, dilations, pads.
type OneGroupCase = (
    [usize; 4],
    usize,
    [usize; 2],
    [usize; 2],
    [usize; 2],
    [i64; 4],
);

/// Convs of a kept W whose im2col the packed path reads in place (`conv_implicit.rs`: more
/// than one tap, at least 8 input and 32 output channels, AVX-512 or Zen 1's AVX2) against
/// the definition, with bias and Relu: the fewest input channels on rows of 30 pixels (three
/// blocks a row), two images of 7-pixel rows (stores that would run past the band) with
/// asymmetric pads, a dilated 5x5 ending mid-panel, a strided 3x5, and K in chunks (384 -> 64
/// 3x3: a 884 KB panel in four chunks; 250 -> 50 on 12x13: three); on the global pool and on
/// 7 threads (bands of one or two rows). Planes that outweigh W take bands that pad their own
/// rows (`bands_own_planes`): the first case, two images strided in bands of unequal heights, a
/// dilated one with pads on every side, and K in chunks; the rest share planes.
#[test]
fn implicit_im2col_matches_definition() {
    // On any AVX2 host as on Zen 1, where the path runs (`packed::runs_here`).
    crate::simd::with_avx2_half_width(true, implicit_im2col_cases)
}

/// [`implicit_im2col_matches_definition`]'s cases, the paths chosen on this thread.
fn implicit_im2col_cases() {
    let cases: &[OneGroupCase] = &[
        ([1, 8, 9, 30], 32, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([2, 24, 11, 7], 40, [3, 3], [1, 1], [1, 1], [0, 1, 2, 1]),
        ([1, 16, 19, 17], 100, [5, 5], [1, 1], [2, 2], [4, 4, 4, 4]),
        ([1, 20, 14, 15], 70, [3, 5], [2, 2], [1, 1], [1, 2, 1, 2]),
        ([1, 384, 6, 5], 64, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([1, 250, 12, 13], 50, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([2, 16, 29, 31], 32, [3, 3], [2, 2], [1, 1], [1, 0, 0, 1]),
        ([1, 8, 40, 36], 32, [3, 3], [1, 1], [2, 2], [2, 1, 2, 3]),
        ([1, 384, 34, 34], 32, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
    ];
    let mut own_planes = Vec::new();
    let on = std::env::var("TANDEM_CONV_IMPLICIT").as_deref() != Ok("0")
        && std::env::var("TANDEM_CONV_PACKED").as_deref() != Ok("0");
    let seven = rayon::ThreadPoolBuilder::new()
        .num_threads(7)
        .build()
        .unwrap();
    for &(xs, m, k, s, d, pads) in cases {
        let op = Conv {
            activation: Activation::Relu,
            ..Conv::plain(&conv_attrs(1, s, d, pads))
                .unwrap()
                .with_constant_weight()
        };
        let (g, out) = op.geom(&[&xs, &[m, xs[1], k[0], k[1]]]).unwrap();
        let whole = 0..out[0] * out[1] * out[2];
        let taken = cpu::implicit::applies(&g)
            && cpu::packed::applies(&g, &whole)
            && !op.cpu_takes_winograd(&g)
            && !op.cpu_takes_taps(&g);
        assert_eq!(
            taken,
            on && cpu::packed::runs_here(),
            "{xs:?} m {m} k {k:?}"
        );
        own_planes.push(cpu::implicit::bands_own_planes_of(&g));
        for pool in [None, Some(&seven)] {
            let run = || outputs_of(&op, xs, m, k, 1, s, d, pads, true);
            let (got, mut want) = pool.map_or_else(run, |p| p.install(run));
            want.iter_mut().for_each(|v| *v = v.max(0.0));
            for g in got {
                for (i, (gv, wv)) in g.iter().zip(&want).enumerate() {
                    assert!(
                        (gv - wv).abs() < 1e-4 * (1.0 + wv.abs()),
                        "{xs:?} m {m} k {k:?} s {s:?} d {d:?} ({pool:?}): [{i}] {gv} vs {wv}"
                    );
                }
            }
        }
    }
    let own: Vec<_> = (0..own_planes.len()).filter(|&i| own_planes[i]).collect();
    assert_eq!(own, [0, 6, 7, 8]);
}

/// The taps path (`conv_taps.rs`) through `Op::cpu`, whole and in two row ranges that cut
/// through a channel, against the definition: 3x3 and 5x5, a 3x5 kernel, dilation, asymmetric
/// and no pads, channel counts not a multiple of the kernel's 8, several images, planes of one
/// task and of several; strided kernels (phase planes): alexnet's first conv, with dilation,
/// strides not dividing the kernel, unequal strides, pads, a 3x3/2 first conv, and 32
/// channels whose tasks run in several spans of positions. The AVX2 kernel takes the cases
/// marked so (at most 32 output channels at stride 1, 100 taps strided); the others run it
/// on AVX-512 only.
#[test]
fn taps_path_matches_definition() {
    let cases: &[(OneGroupCase, bool)] = &[
        (
            ([1, 8, 20, 23], 13, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            true,
        ),
        (
            ([2, 16, 23, 19], 24, [3, 3], [1, 1], [1, 1], [0, 2, 1, 0]),
            true,
        ),
        (
            ([1, 12, 30, 31], 40, [5, 5], [1, 1], [2, 2], [4, 4, 4, 4]),
            false,
        ),
        (
            ([1, 12, 30, 31], 28, [5, 5], [1, 1], [2, 2], [4, 4, 4, 4]),
            true,
        ),
        (
            ([1, 32, 19, 40], 96, [3, 5], [1, 1], [1, 1], [1, 2, 1, 2]),
            false,
        ),
        (
            ([1, 32, 19, 40], 32, [3, 5], [1, 1], [1, 1], [1, 2, 1, 2]),
            true,
        ),
        (
            ([3, 8, 22, 26], 8, [3, 3], [1, 1], [1, 1], [0, 0, 0, 0]),
            true,
        ),
        (
            ([1, 9, 64, 70], 17, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            true,
        ),
        (
            ([2, 3, 67, 67], 20, [11, 11], [4, 4], [1, 1], [0, 0, 0, 0]),
            true,
        ),
        (
            ([1, 3, 83, 80], 64, [11, 11], [4, 4], [1, 1], [2, 2, 2, 2]),
            true,
        ),
        (
            ([1, 5, 61, 64], 24, [10, 11], [2, 3], [1, 1], [0, 2, 1, 1]),
            true,
        ),
        (
            ([1, 16, 60, 62], 32, [5, 21], [2, 2], [2, 1], [4, 10, 4, 10]),
            true,
        ),
        (
            ([1, 2, 70, 66], 8, [11, 11], [3, 3], [1, 1], [5, 5, 5, 5]),
            true,
        ),
        (
            ([1, 8, 150, 6], 16, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            true,
        ),
        (
            ([1, 3, 45, 47], 24, [7, 7], [2, 2], [1, 1], [3, 3, 3, 3]),
            false,
        ),
        (
            ([1, 3, 224, 224], 64, [3, 3], [2, 2], [1, 1], [0, 0, 0, 0]),
            false,
        ),
        (
            ([1, 32, 120, 200], 16, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            false,
        ),
    ];
    let acts = [Activation::None, Activation::Relu, Activation::Sigmoid];
    for (i, &((xs, m, k, s, d, pads), avx2)) in cases.iter().enumerate() {
        let plain = Conv::plain(&conv_attrs(1, s, d, pads)).unwrap();
        let (g, _) = plain.geom(&[&xs, &[m, xs[1], k[0], k[1]]]).unwrap();
        let on = std::env::var("TANDEM_CONV_TAPS").as_deref() != Ok("0");
        let level = crate::simd::level();
        assert_eq!(
            cpu::taps::applies(&g, false),
            on && (level == crate::simd::Level::Avx512
                || avx2 && level == crate::simd::Level::Avx2),
            "{xs:?} m {m} k {k:?} s {s:?}"
        );
        for (bias, kept) in [(true, false), (false, false), (true, true)] {
            let op = Conv {
                activation: acts[(i + bias as usize) % acts.len()],
                ..plain.clone()
            };
            let op = match kept {
                true => op.with_constant_weight(),
                false => op,
            };
            activated_case(&op, xs, m, k, s, d, pads, bias);
        }
    }
    // First convs of 7x7 and wider fetch their output lines for writing before their sums
    // (the first large output of a run, cold); 3x3 first convs and the convs after do not.
    for (xs, m, k, s, fetch) in [
        ([1, 3, 224, 224], 64, 7, 2, true),
        ([1, 3, 227, 227], 96, 11, 4, true),
        ([1, 3, 224, 224], 64, 3, 2, false),
        ([1, 16, 55, 55], 64, 3, 1, false),
        ([1, 64, 56, 56], 64, 7, 1, false),
    ] {
        let op = Conv::plain(&conv_attrs(1, [s, s], [1, 1], [k as i64 / 2; 4])).unwrap();
        let (g, _) = op.geom(&[&xs, &[m, xs[1], k, k]]).unwrap();
        assert_eq!(cpu::taps::fetches_output(&g), fetch, "{xs:?} m {m} k {k}");
    }
    // The 32-channel case's spans: whole tiles, in order, covering a task's positions, its
    // 8 rows of 101 line positions in more than one.
    let op = Conv::plain(&conv_attrs(1, [2, 2], [1, 1], [1, 1, 1, 1])).unwrap();
    let (g, _) = op.geom(&[&[1, 32, 120, 200], &[16, 32, 3, 3]]).unwrap();
    let spans = cpu::taps::spans_of(&g, 8 * 101);
    assert!(spans.len() > 1, "{spans:?}");
    assert_eq!((spans[0].0, spans[spans.len() - 1].1), (0, 8 * 101));
    for pair in spans.windows(2) {
        assert_eq!(pair[0].1, pair[1].0);
        assert_eq!((pair[0].1 - pair[0].0) % 48, 0, "{spans:?}");
    }
    // Both residuals, on a plane where a kept W takes this path too.
    residual_cases([2, 8, 41, 40], 20, [3, 3], [1, 1, 1, 1]);
    // Measured slower here than im2col + GEMM: few channels at stride 1; rows of under 8
    // line positions (a vector would touch more than 3 rows).
    for (xs, m, k, s) in [([1, 3, 224, 224], 64, 3, 1), ([1, 8, 150, 5], 16, 3, 1)] {
        let op = Conv::plain(&conv_attrs(1, [s, s], [1, 1], [1, 1, 1, 1])).unwrap();
        let (g, _) = op.geom(&[&xs, &[m, xs[1], k, k]]).unwrap();
        assert!(!cpu::taps::applies(&g, false), "{xs:?} m {m} k {k} s {s}");
    }
}

/// The pointwise path (1x1, stride 1, unpadded, output channels a multiple of 8; which
/// channel counts per SIMD level below) against the definition, through `Op::cpu`, whole
/// and cut in two mid-plane and mid-block: planes not a multiple of the kernel's 48 pixels,
/// of one span and of several, several images, W kept and not; the bias and Relu applied by
/// the kernel, other activations and both residuals after it. The AVX2 kernel takes the
/// cases marked so (planes of 729 pixels, at most 128 input channels or 256 to 32 outputs,
/// no epilogue but a Relu; its copied spans of input lines, several to a plane and a part
/// one at its end); the AVX-512 kernel those marked in the last column (fewer than 64 outputs
/// or at most 32 inputs; on planes of 784 pixels and more also 128 to 256 inputs, or 64
/// outputs).
#[test]
fn pointwise_path_matches_definition() {
    let cases: &[([usize; 4], usize, bool, bool)] = &[
        ([2, 40, 9, 11], 16, false, true),
        ([1, 130, 7, 7], 40, false, true),
        ([1, 16, 23, 29], 96, false, true),
        ([1, 300, 5, 4], 8, false, true),
        ([3, 9, 17, 3], 24, false, true),
        ([1, 32, 13, 13], 64, false, true),
        ([1, 12, 100, 100], 56, true, true),
        ([2, 40, 28, 27], 16, true, true),
        ([1, 64, 31, 30], 16, true, true),
        ([1, 24, 31, 30], 120, true, true),
        ([3, 9, 37, 23], 24, true, true),
        ([2, 128, 28, 27], 64, true, false),
        ([1, 200, 27, 28], 24, true, true),
        ([1, 200, 27, 28], 40, false, true),
        ([1, 136, 28, 29], 72, false, true),
        ([1, 48, 29, 28], 64, true, true),
    ];
    let on = std::env::var("TANDEM_CONV_POINTWISE").as_deref() != Ok("0");
    let acts = [Activation::None, Activation::Relu, Activation::Sigmoid];
    let level = crate::simd::level();
    for (i, &(xs, m, avx2, avx512)) in cases.iter().enumerate() {
        let attrs = conv_attrs(1, [1, 1], [1, 1], [0, 0, 0, 0]);
        for (bias, kept) in [(true, true), (false, true), (true, false)] {
            let act = acts[(i + bias as usize) % acts.len()];
            let plain = Conv {
                activation: act,
                ..Conv::plain(&attrs).unwrap()
            };
            let op = match kept {
                true => plain.with_constant_weight(),
                false => plain,
            };
            activated_case(&op, xs, m, [1, 1], [1, 1], [1, 1], [0; 4], bias);
            let (g, _) = op.geom(&[&xs, &[m, xs[1], 1, 1]]).unwrap();
            let avx2 = avx2 && act != Activation::Sigmoid;
            assert_eq!(
                op.cpu_takes_pointwise(&g),
                on && (avx512 && level == crate::simd::Level::Avx512
                    || avx2 && level == crate::simd::Level::Avx2),
                "{xs:?} m {m} {act:?}"
            );
        }
    }
    residual_cases([2, 24, 7, 10], 24, [1, 1], [0; 4]);
    // Measured slower here than the packed path or the `gemm` crate: 64 or more output
    // channels from more than 128 input channels (AVX-512: 32; on planes of 28x28 and more
    // 256), output channels in a part-filled block, a plane of one pixel; padded or strided
    // 1x1s are not read in place.
    for (xs, m, s, pads) in [
        ([1, 160, 27, 28], 128, 1, 0),
        ([1, 512, 28, 28], 128, 1, 0),
        ([1, 512, 13, 13], 1000, 1, 0),
        ([1, 64, 40, 40], 18, 1, 0),
        ([1, 192, 1, 1], 48, 1, 0),
        ([1, 16, 20, 20], 8, 2, 0),
        ([1, 16, 20, 20], 8, 1, 1),
    ] {
        let op = Conv::plain(&conv_attrs(1, [s, s], [1, 1], [pads; 4])).unwrap();
        let (g, _) = op.geom(&[&xs, &[m, xs[1], 1, 1]]).unwrap();
        assert!(
            !op.cpu_takes_pointwise(&g),
            "{xs:?} m {m} s {s} pads {pads}"
        );
    }
    // On AVX-512 also from fewer than 128 input channels to more than 64 outputs (resnet50's
    // 64 -> 256 on 56x56; AVX2 takes it from its copied spans).
    let op = Conv::plain(&conv_attrs(1, [1, 1], [1, 1], [0; 4])).unwrap();
    let (g, _) = op.geom(&[&[1, 64, 56, 56], &[256, 64, 1, 1]]).unwrap();
    if level == crate::simd::Level::Avx512 {
        assert!(!op.cpu_takes_pointwise(&g), "64 -> 256 on 56x56");
    }
}

/// A kept-W conv over one column (`kw == 1` on `w == 1`: how ONNX 1-D convs arrive) that the
/// packed path takes runs as the same conv over one row ([`Geom2::as_row`]), its im2col read
/// in place (magika's 256 -> 512 5x1). Against the definition whole, cut inside a plane (which
/// keeps the column) and cut between planes, padded, strided and dilated, with a fused Relu.
/// Without AVX-512 the same cases check the paths that take them instead (on Zen 1 the packed
/// path, the columns through im2col).
#[test]
#[allow(clippy::single_range_in_vec_init)]
fn column_convs_run_as_rows() {
    type Case = ([usize; 4], usize, usize, usize, usize, [i64; 4]);
    // Without AVX-512 (or with a path turned off) they stay columns, on other paths (the
    // packed one where it runs, `packed::runs_here`).
    let off = |var: &str| std::env::var(var).as_deref() == Ok("0");
    let packed = cpu::packed::runs_here() && !off("TANDEM_CONV_PACKED");
    let implicit = !off("TANDEM_CONV_IMPLICIT");
    let cases: &[Case] = &[
        ([1, 64, 40, 1], 64, 5, 1, 1, [2, 0, 2, 0]),
        ([2, 96, 33, 1], 96, 3, 2, 2, [1, 0, 0, 0]),
        ([1, 64, 25, 1], 40, 4, 1, 3, [0, 0, 3, 0]),
    ];
    for &(xs, m, k, s, d, pads) in cases {
        let attrs = conv_attrs(1, [s, 1], [d, 1], pads);
        let op = Conv {
            activation: Activation::Relu,
            ..Conv::plain(&attrs).unwrap().with_constant_weight()
        };
        let ws = [m, xs[1], k, 1];
        let (g, _) = op.geom(&[&xs, &ws]).unwrap();
        let lines = g.n * g.m * g.oh;
        let (row, row_lines) = g.as_row(&(0..lines)).unwrap();
        assert_eq!(
            (row.h, row.w, row.kh, row.kw, row.oh, row.ow),
            (1, g.h, 1, k, 1, g.oh)
        );
        assert_eq!((row.sw, row.dw, row.pl), (s, d, pads[0]), "{xs:?}");
        assert_eq!(row_lines, 0..g.n * g.m);
        assert!(g.as_row(&(0..lines - 1)).is_none());
        assert_eq!(cpu::packed::applies(&g, &(0..lines)), packed, "{xs:?}");
        assert_eq!(
            cpu::implicit::column_as_row(&g, &(0..lines)).is_some(),
            packed && implicit && crate::simd::avx512(),
            "{xs:?}"
        );
        for bias in [true, false] {
            activated_case(&op, xs, m, [k, 1], [s, 1], [d, 1], pads, bias);
        }
        // Cut between planes: both parts as rows.
        let (_, want) = outputs_of(&op, xs, m, [k, 1], 1, [s, 1], [d, 1], pads, true);
        let x = Tensor::f32(&xs, fill(xs.iter().product(), 1));
        let w = Tensor::f32(&ws, fill(ws.iter().product(), 2));
        let b = Tensor::f32(&[m], fill(m, 3));
        let mut out = vec![Tensor::zeros(DType::F32, &[g.n, g.m, g.oh, 1])];
        let cut = g.oh * (lines / g.oh / 2);
        for r in [0..cut, cut..lines] {
            op.cpu(&[&x, &w, &b], &mut out, r).unwrap();
        }
        for (j, gv) in out[0].as_f32().unwrap().iter().enumerate() {
            let wv = Activation::Relu.apply(want[j]);
            assert!(
                (gv - wv).abs() < 1e-4,
                "{xs:?} cut {cut}: [{j}] {gv} vs {wv}"
            );
        }
    }
    // Columns longer than a page per channel keep im2col.
    let op = Conv::plain(&conv_attrs(1, [1, 1], [1, 1], [0; 4])).unwrap();
    let (g, _) = op.geom(&[&[1, 64, 1100, 1], &[64, 64, 5, 1]]).unwrap();
    let lines = g.n * g.m * g.oh;
    assert!(g.as_row(&(0..lines)).is_some());
    assert!(cpu::implicit::column_as_row(&g, &(0..lines)).is_none());
}

/// Speed of the taps path (`conv_taps.rs`; 1x1s: the pointwise path, `conv_pointwise.rs`)
/// against Winograd F(4x4, 3x3) (W kept, 3x3s) and im2col + GEMM on the model shapes it
/// serves, each with W in its kept form, alternated, best of 30 (not a test: `cargo test
/// --release -p tandem-ops --lib taps_speed -- --ignored --nocapture`).
#[test]
#[ignore]
fn taps_speed() {
    // (C, M, k, plane, stride, pad)
    let shapes: &[(usize, usize, usize, usize, usize, usize)] = &[
        (16, 64, 3, 55, 1, 1),
        (32, 128, 3, 27, 1, 1),
        (16, 16, 3, 80, 1, 1),
        (32, 32, 3, 40, 1, 1),
        (32, 64, 3, 40, 1, 1),
        (32, 96, 5, 27, 1, 2),
        (16, 48, 5, 13, 1, 2),
        (3, 64, 11, 224, 4, 2),
        (3, 64, 7, 224, 2, 3),
        (16, 64, 1, 55, 1, 0),
        (64, 16, 1, 55, 1, 0),
        (128, 16, 1, 55, 1, 0),
        (32, 128, 1, 27, 1, 0),
        (256, 32, 1, 27, 1, 0),
        (256, 48, 1, 13, 1, 0),
        (48, 192, 1, 13, 1, 0),
        (64, 64, 1, 56, 1, 0),
        (64, 256, 1, 56, 1, 0),
        (32, 32, 1, 80, 1, 0),
        (64, 64, 1, 40, 1, 0),
        (96, 16, 1, 55, 1, 0),
        (128, 32, 1, 27, 1, 0),
        (96, 128, 1, 56, 1, 0),
        (128, 128, 1, 56, 1, 0),
        (128, 512, 1, 28, 1, 0),
        (256, 64, 1, 56, 1, 0),
        (512, 128, 1, 28, 1, 0),
        (1024, 256, 1, 14, 1, 0),
    ];
    let reps = 30;
    for &(c, m, k, hw, s, p) in shapes {
        let SpeedCase { g, x, w, b } = speed_case([c, m], [k, k], [hw, hw], s, [p, p]);
        let rows = m * g.oh;
        let mut out = vec![0.0f32; m * g.oh * g.ow];
        let ab = (w.as_slice(), Some(b.as_slice()), Activation::Relu.into());
        let mut blocks = vec![0.0f32; cpu::taps::blocks_len(&g)];
        let bl = blocks.len() - cpu::taps::MR;
        cpu::taps::pack_weights(&w, c, k * k, 0..m, &mut blocks[..bl]);
        let wino = cpu::winograd::supports(&g).then(|| {
            let mut u = vec![0.0f32; cpu::winograd::weights_len(Variant::F4, &g, m)];
            cpu::winograd::transform_weights(Variant::F4, &g, &w, 0..m, &mut u);
            u
        });
        let wb = (w.as_slice(), Some(blocks.as_slice()));
        let bep = (Some(b.as_slice()), Activation::Relu.into());
        let best = best_times(reps, |j| {
            match (j, &wino) {
                (0, _) if k == 1 => {
                    cpu::pointwise::pointwise_path(&g, &x, wb, bep, None, &mut out, 0..rows)
                }
                (0, _) => cpu::taps::taps_path(&g, &x, wb, bep, None, &mut out, 0..rows),
                (1, Some(u)) => {
                    let v = Variant::F4;
                    cpu::winograd::winograd_path(v, &g, &x, ab, Some(u), &mut out, 0..rows)
                }
                (1, None) => return false,
                _ => cpu::gemm_path(&g, &x, ab, None, &mut out, 0..rows),
            }
            true
        });
        let gf = 2.0 * (m * c * k * k * g.oh * g.ow) as f64 / 1e9;
        let [tt, tw, tg] = best;
        println!(
            "C {c:4} M {m:4} {k}x{k}/{s} {hw:3}x{hw:<3} taps {:7.1} us {:4.0} GF/s | F4 {:7.1} us x{:.2} | im2col {:7.1} us x{:.2}",
            tt * 1e6,
            gf / tt,
            tw * 1e6,
            tw / tt,
            tg * 1e6,
            tg / tt
        );
    }
}

/// Adapters that run shaders on the CPU get `conv_pointwise.wgsl` for aligned 1x1s, the same
/// reading X a pixel at a time (`conv_pointwise_strided`) for other unpadded 1x1s of 4-aligned
/// input channels, and `conv_rows.wgsl` for rows it can window (horizontal stride 1 or 2, dilation 1, the taps
/// within its 24 columns), `conv.wgsl` otherwise; GPUs always `conv.wgsl`. `conv_rows` reads W
/// from uniform windows of 64 KiB (a dispatch per window) where a block of 8 output channels'
/// weights fit one, from the storage buffer otherwise; X from a texture where its rows are whole
/// vec4s (width a multiple of 4), from the storage buffer otherwise.
#[test]
fn cpu_adapters_take_windowed_kernels_where_they_fit() {
    let one = [1, 1];
    let kernels = |xs: [usize; 4], m: usize, k: [usize; 2], s: [usize; 2], d: [usize; 2], pads| {
        let op = conv(&conv_attrs(1, s, d, pads)).unwrap();
        let x = TensorMeta::new(DType::F32, xs.to_vec());
        let w = TensorMeta::new(DType::F32, vec![m, xs[1], k[0], k[1]]);
        let outs = op.infer(&[&x, &w]).unwrap();
        let rows = outs[0].shape[..3].iter().product();
        let ks = op.gpu(&[&x, &w], &outs, 0..rows).unwrap();
        assert_eq!(ks.len(), 1);
        ks.into_iter().next().unwrap()
    };
    let shaders = |xs, k, s, d, pads| {
        let k = kernels(xs, 12, k, s, d, pads);
        (k.shader.name, k.for_adapter(true)[0].shader.name)
    };
    let on_cpu = |xs, k, s, d, pads| shaders(xs, k, s, d, pads).1;
    let (none, pad1) = ([0; 4], [1; 4]);
    assert_eq!(
        shaders([1, 8, 4, 6], one, one, one, none),
        ("conv", "conv_pointwise")
    );
    // 1x1s of 8 input channels on 5 x 5 pixels (a plane not 4-aligned) or of stride 2 read X
    // a pixel at a time; with a pad past the end (an output pixel of zeros) or 6 input
    // channels they are windowed rows, X from a texture where rows are 8 wide
    let strided = "conv_pointwise_strided";
    assert_eq!(on_cpu([1, 8, 5, 5], one, one, one, none), strided);
    assert_eq!(on_cpu([1, 8, 4, 8], one, [2, 2], one, none), strided);
    assert_eq!(on_cpu([1, 8, 4, 8], one, [1, 3], one, none), strided);
    let rows = "conv_rows_uniform";
    let rows_x_texture = "conv_rows_uniform_texture";
    assert_eq!(on_cpu([1, 8, 5, 5], one, one, one, [0, 0, 1, 1]), rows);
    assert_eq!(on_cpu([1, 6, 4, 8], one, one, one, none), rows_x_texture);
    let k = kernels([1, 6, 4, 8], 12, one, one, one, none);
    assert_eq!(k.for_adapter(true)[0].texture_inputs, [0]);
    assert!(k.texture_inputs.is_empty(), "GPUs read X from storage");
    let k = kernels([1, 6, 5, 5], 12, one, one, one, none);
    assert_eq!(k.for_adapter(true)[0].shader.name, rows);
    assert!(k.for_adapter(true)[0].texture_inputs.is_empty());
    let x = [1, 5, 7, 10];
    assert_eq!(shaders(x, [3, 3], one, one, pad1), ("conv", rows));
    assert_eq!(on_cpu(x, [3, 3], [2, 2], one, pad1), rows);
    assert_eq!(on_cpu(x, [3, 3], [2, 3], one, pad1), "conv");
    assert_eq!(on_cpu(x, [3, 3], one, [1, 2], pad1), "conv");
    // a left pad of 5 starts before the window
    assert_eq!(on_cpu(x, [3, 3], one, one, [1, 5, 1, 1]), "conv");
    // a column (magika's 1-D conv as 2-D) runs as a row, 16 wide
    assert_eq!(
        on_cpu([1, 5, 16, 1], [5, 1], one, one, [2, 0, 2, 0]),
        rows_x_texture
    );
    assert_eq!(on_cpu([1, 5, 15, 1], [5, 1], one, one, [2, 0, 2, 0]), rows);
    // a 7-wide kernel of stride 2 fits the window (a first conv's 7x7), a 9-wide one reaches
    // past it
    assert_eq!(on_cpu(x, [7, 7], [2, 2], one, [3; 4]), rows);
    assert_eq!(on_cpu(x, [1, 9], one, one, [0, 4, 0, 4]), "conv");
    // 3x3s of 200 input channels: 9 channels' weights a window, so 12 output channels take two
    // dispatches (blocks 0..8 and 8..12), each binding its channels' weights; on 2 x 2 pixels
    // two dispatches cost more than storage loads. Of 300, 8 channels' overflow a window and 6
    // fit: blocks of 6, a window each. Of 600, 3 fit, and W is a storage buffer (blocks of 8).
    let ocb = |k: &GpuKernel| k.overrides.iter().find(|o| o.0 == "OCB").unwrap().1;
    for (c, blocks) in [(200, [8, 4]), (300, [6, 6])] {
        let k = kernels([1, c, 20, 30], 12, [3, 3], one, one, pad1);
        let per = c * 9;
        let windows: Vec<_> = (k.for_adapter(true).iter())
            .map(|k| (k.shader.name, k.uniform_window.map(|w| (w.first, w.len))))
            .collect();
        let want = [
            (rows, Some((0, blocks[0] * per))),
            (rows, Some((blocks[0] * per, blocks[1] * per))),
        ];
        assert_eq!(windows, want, "{c} input channels");
        assert!(k
            .for_adapter(true)
            .iter()
            .all(|k| ocb(k) == blocks[0] as f64));
    }
    for (x, shader) in [
        ([1, 200, 2, 2], "conv_rows_storage"),
        ([1, 600, 7, 10], "conv_rows_storage"),
        ([1, 600, 7, 12], "conv_rows_texture"),
    ] {
        let k = kernels(x, 12, [3, 3], one, one, pad1);
        let storage = k.for_adapter(true);
        assert_eq!(storage.len(), 1);
        assert_eq!(storage[0].shader.name, shader);
        assert_eq!(storage[0].uniform_window, None);
        assert_eq!(ocb(&storage[0]), 8.0);
    }
}

/// On GPUs a conv whose groups have at least 32 output channels and 16 weights each runs
/// `conv_tiled.wgsl` (a 64 x 64 tile staged in workgroup memory); depthwise, few-channel and
/// tiny-kernel convs keep `conv.wgsl`'s register tiles. Its grid: pixel tiles, channel tiles of
/// every group, images, of the rows asked for only (and its params say the first tiles).
#[test]
fn gpus_take_the_tiled_kernel_where_groups_fill_a_tile() {
    let kernel = |xs: [usize; 4], m: usize, group: usize, k: usize, rows: Option<Range<usize>>| {
        let op = conv(&conv_attrs(group, [1, 1], [1, 1], [0; 4])).unwrap();
        let x = TensorMeta::new(DType::F32, xs.to_vec());
        let w = TensorMeta::new(DType::F32, vec![m, xs[1] / group, k, k]);
        let outs = op.infer(&[&x, &w]).unwrap();
        let all = outs[0].shape[..3].iter().product();
        let ks = op.gpu(&[&x, &w], &outs, rows.unwrap_or(0..all)).unwrap();
        let word =
            |i: usize| u32::from_le_bytes(ks[0].params[4 * i..4 * i + 4].try_into().unwrap());
        // tile_x0 and tile_y0: words 28 and 29 of ConvParams
        (ks[0].shader.name, ks[0].workgroups, [word(28), word(29)])
    };
    // resnet50's 3x3 of 64 channels on 56 x 56 (49 pixel tiles, one channel tile)
    let resnet = |rows| kernel([1, 64, 58, 58], 64, 1, 3, rows);
    assert_eq!(resnet(None), ("conv_tiled", [49, 1, 1], [0, 0]));
    // rows 0-2 of channel 10: its pixels 0..168, tiles 0-2; channel 10's last row and channel
    // 11's first: every pixel tile
    assert_eq!(resnet(Some(560..563)), ("conv_tiled", [3, 1, 1], [0, 0]));
    assert_eq!(resnet(Some(615..617)), ("conv_tiled", [49, 1, 1], [0, 0]));
    // the last row of a channel: pixels 3080..3136, tile 48 alone
    assert_eq!(resnet(Some(615..616)), ("conv_tiled", [1, 1, 1], [48, 0]));
    // two groups of 100 channels over 2 x 2 weights: two channel tiles a group; two images;
    // image 1's channels 150-199 (group 1's tiles, numbers 2 and 3)
    let grouped = |rows| kernel([2, 8, 9, 9], 200, 2, 2, rows);
    assert_eq!(grouped(None), ("conv_tiled", [1, 4, 2], [0, 0]));
    let image1 = 200 * 8;
    let rows = image1 + 150 * 8..image1 + 200 * 8;
    assert_eq!(grouped(Some(rows)), ("conv_tiled", [1, 2, 1], [0, 2]));
    // 16 channels, a depthwise conv, and 1x1s over 8 input channels keep conv.wgsl
    assert_eq!(kernel([1, 64, 10, 10], 16, 1, 3, None).0, "conv");
    assert_eq!(kernel([1, 64, 10, 10], 64, 64, 3, None).0, "conv");
    assert_eq!(kernel([1, 8, 10, 10], 64, 1, 1, None).0, "conv");
}

/// Speed of the packed path (`conv_packed.rs`, `conv_implicit.rs`; run here whatever
/// `packed::runs_here` says) against im2col + the `gemm` crate on model shapes (magika's 5x1
/// as a row and as a column, resnet50's, squeezenet's), each with W in its kept form,
/// alternated, best of 30 (not a test: `cargo test --release -p tandem-ops --lib packed_speed
/// -- --ignored --nocapture`).
#[test]
#[ignore]
fn packed_speed() {
    // [C, M, kh, kw, h, w, stride, pad h, pad w]
    let shapes: &[[usize; 9]] = &[
        [256, 512, 1, 5, 1, 512, 1, 0, 0],
        [256, 512, 5, 1, 512, 1, 1, 0, 0],
        [64, 64, 3, 3, 56, 56, 1, 1, 1],
        [128, 128, 3, 3, 28, 28, 1, 1, 1],
        [256, 256, 3, 3, 14, 14, 1, 1, 1],
        [512, 512, 3, 3, 7, 7, 1, 1, 1],
        [64, 192, 3, 3, 28, 28, 1, 1, 1],
        [256, 64, 1, 1, 56, 56, 1, 0, 0],
        [1024, 256, 1, 1, 14, 14, 1, 0, 0],
        [512, 1000, 1, 1, 13, 13, 1, 0, 0],
        [64, 256, 1, 1, 13, 13, 1, 0, 0],
        [512, 2048, 1, 1, 7, 7, 1, 0, 0],
        [128, 128, 3, 3, 56, 56, 2, 1, 1],
    ];
    let reps = 30;
    for &[c, m, kh, kw, h, w_, s, ph, pw] in shapes {
        let SpeedCase { g, x, w, b } = speed_case([c, m], [kh, kw], [h, w_], s, [ph, pw]);
        let rows = m * g.oh;
        let mut out = vec![0.0f32; m * g.oh * g.ow];
        let ab = (w.as_slice(), Some(b.as_slice()), Activation::Relu.into());
        let kept_w = ConstantWeight::default();
        let p = kept_w.packed(&g, &w);
        let best = best_times(reps, |k| {
            match k {
                1 => {
                    let pab = (p, Some(b.as_slice()), Activation::Relu.into());
                    cpu::packed::packed_path(&g, &x, pab, None, &mut out, 0..rows)
                }
                _ => cpu::gemm_path(&g, &x, ab, None, &mut out, 0..rows),
            }
            true
        });
        let gf = 2.0 * (m * g.ckk() * g.oh * g.ow) as f64 / 1e9;
        let [tg, tp] = best;
        println!(
            "C {c:4} M {m:4} {kh}x{kw}/{s} {h:3}x{w_:<3} in place {:5} | im2col + gemm {:8.1} us {:4.0} GF/s | packed {:8.1} us {:4.0} GF/s x{:.2}",
            cpu::implicit::applies(&g),
            tg * 1e6,
            gf / tg,
            tp * 1e6,
            gf / tp,
            tg / tp
        );
    }
}

/// A speed test's conv: random X `[1, C, h, w]`, W `[M, C, kh, kw]` and bias, and the geometry
/// of their conv with a fused Relu at `stride`, padded `pads` (rows, columns) on both sides.
struct SpeedCase {
    g: Geom2,
    x: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
}

fn speed_case(
    [c, m]: [usize; 2],
    [kh, kw]: [usize; 2],
    [h, w]: [usize; 2],
    stride: usize,
    [ph, pw]: [usize; 2],
) -> SpeedCase {
    let pads = [ph as i64, pw as i64, ph as i64, pw as i64];
    let op = Conv {
        activation: Activation::Relu,
        ..Conv::plain(&conv_attrs(1, [stride, stride], [1, 1], pads)).unwrap()
    };
    let (g, _) = op.geom(&[&[1, c, h, w], &[m, c, kh, kw]]).unwrap();
    SpeedCase {
        g,
        x: random(c * h * w, 1),
        w: random(m * c * kh * kw, 2),
        b: random(m, 3),
    }
}

/// The best time of each of `N` paths (`run(k)` runs path `k`, false where it has none) over
/// `reps` rounds after an untimed one, the paths alternating so that a change of the
/// machine's load hits all of them.
fn best_times<const N: usize>(reps: usize, mut run: impl FnMut(usize) -> bool) -> [f64; N] {
    let mut best = [f64::MAX; N];
    for i in 0..=reps {
        for (k, t) in best.iter_mut().enumerate() {
            let start = std::time::Instant::now();
            if run(k) && i > 0 {
                *t = t.min(start.elapsed().as_secs_f64());
            }
        }
    }
    best
}
