//! Conv's CPU tests: every fast path (1-D, shared im2col, 1x1 channel split, grouped,
//! depthwise with stride and dilation) against the convolution's definition as nested loops.

use super::*;
use crate::AttrValue;

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

#[allow(clippy::too_many_arguments, clippy::single_range_in_vec_init)]
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
    let ws = [m, xs[1] / group, k[0], k[1]];
    let x = Tensor::f32(&xs, fill(xs.iter().product(), 1));
    let w = Tensor::f32(&ws, fill(ws.iter().product(), 2));
    let b = Tensor::f32(&[m], fill(m, 3));
    let attrs = Attrs::new(11)
        .with("group", AttrValue::Int(group as i64))
        .with(
            "strides",
            AttrValue::Ints(s.iter().map(|&v| v as i64).collect()),
        )
        .with(
            "dilations",
            AttrValue::Ints(d.iter().map(|&v| v as i64).collect()),
        )
        .with("pads", AttrValue::Ints(pads.to_vec()));
    let op = conv(&attrs).unwrap();
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
    for parts in [vec![0..rows], vec![0..cut, cut..rows]] {
        let mut out = vec![Tensor::zeros(DType::F32, &oshape)];
        for r in parts {
            op.cpu(&refs, &mut out, r).unwrap();
        }
        for (i, (gv, wv)) in out[0].as_f32().unwrap().iter().zip(&want).enumerate() {
            assert!(
                (gv - wv).abs() < 1e-4,
                "{xs:?} m {m} k {k:?} g {group} s {s:?}: [{i}] {gv} vs {wv}"
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
/// pixel per output line: the strided im2col column), channel-split GEMMs (at least as many
/// output channels as pixels: one shared im2col block, or X read directly for 1x1), grouped
/// channel splits, depthwise lines batched per task with strides and dilations, and the
/// shifted-copy im2col of stride-1 convs whose output rows are as long as their input rows.
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
        // Stride 1, output rows as long as input rows: the shifted-copy im2col, with pixel
        // chunks that start mid-row and asymmetric pads.
        ([1, 24, 37, 29], 20, [5, 5], 1, [1, 1], [1, 1], [2, 2, 2, 2]),
        ([2, 6, 11, 13], 7, [3, 3], 1, [1, 1], [1, 1], [0, 2, 2, 0]),
        ([1, 5, 8, 9], 9, [3, 3], 1, [1, 1], [2, 1], [3, 1, 1, 1]),
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
