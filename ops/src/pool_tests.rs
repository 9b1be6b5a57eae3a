//! CPU tests of the pools: hand-worked ONNX examples and a naive reference that slides the
//! window over the input, skipping positions outside it (`naive_window`).

use super::*;
use crate::{AttrValue, Attrs, Op};

fn run(op: &dyn Op, x: &Tensor, n_outs: usize, cut: Option<usize>) -> Vec<Tensor> {
    let m = x.meta();
    let om = op.infer(&[&m]).unwrap();
    let om = &om[..n_outs];
    let mut outs: Vec<Tensor> = om
        .iter()
        .map(|o| Tensor::zeros(o.dtype, &o.shape))
        .collect();
    let rows = crate::shape::row_count(&om[0].shape, op.split_axis(&[&m], om));
    match cut {
        Some(c) => {
            op.cpu(&[x], &mut outs, 0..c).unwrap();
            op.cpu(&[x], &mut outs, c..rows).unwrap();
        }
        None => op.cpu(&[x], &mut outs, 0..rows).unwrap(),
    }
    outs
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

fn iota(n: usize) -> Vec<f32> {
    (1..=n).map(|v| v as f32).collect()
}

#[test]
fn onnx_examples_ceil_mode() {
    // 4x4 of 1..16, kernel 3, stride 2, ceil_mode: last window starts at 2, inside the input.
    let x = Tensor::f32(&[1, 1, 4, 4], iota(16));
    let a = Attrs::new(19)
        .with("kernel_shape", ints(&[3, 3]))
        .with("strides", ints(&[2, 2]))
        .with("ceil_mode", AttrValue::Int(1));
    let y = run(&*max_pool(&a).unwrap(), &x, 1, None);
    assert_eq!(y[0].shape, vec![1, 1, 2, 2]);
    assert_eq!(y[0].as_f32().unwrap(), &[11., 12., 15., 16.]);
    let y = run(&*average_pool(&a).unwrap(), &x, 1, None);
    assert_eq!(y[0].as_f32().unwrap(), &[6., 7.5, 12., 13.5]);
}

#[test]
fn ceil_mode_drops_a_window_starting_in_the_end_padding() {
    // 1-D: x = 5, kernel 2, stride 2, pads [1, 1]: ceil((7 - 2) / 2) + 1 = 4, but the 4th
    // window would start at 3 * 2 = 6 >= 5 + 1 (in the end padding), so it is dropped.
    let x = Tensor::f32(&[1, 1, 5], iota(5));
    let a = Attrs::new(19)
        .with("kernel_shape", ints(&[2]))
        .with("strides", ints(&[2]))
        .with("pads", ints(&[1, 1]))
        .with("ceil_mode", AttrValue::Int(1));
    let y = run(&*max_pool(&a).unwrap(), &x, 1, None);
    assert_eq!(y[0].shape, vec![1, 1, 3]);
    assert_eq!(y[0].as_f32().unwrap(), &[1., 3., 5.]);
}

#[test]
fn count_include_pad_does_not_count_the_ceil_overhang() {
    // x = 1..5, kernel 2, stride 2, ceil: windows [1, 2], [3, 4], [5, overhang]. The overhang
    // lies past the (zero) end padding, so the last average is 5 / 1 (as the ONNX tests do).
    let x = Tensor::f32(&[1, 1, 5], iota(5));
    let a = Attrs::new(19)
        .with("kernel_shape", ints(&[2]))
        .with("strides", ints(&[2]))
        .with("ceil_mode", AttrValue::Int(1))
        .with("count_include_pad", AttrValue::Int(1));
    let y = run(&*average_pool(&a).unwrap(), &x, 1, None);
    assert_eq!(y[0].as_f32().unwrap(), &[1.5, 3.5, 5.0]);
    // With an explicit end pad of 1 the padded position counts: 5 / 2.
    let a = a.with("pads", ints(&[0, 1]));
    let y = run(&*average_pool(&a).unwrap(), &x, 1, None);
    assert_eq!(y[0].as_f32().unwrap(), &[1.5, 3.5, 2.5]);
}

#[test]
fn max_pool_indices_row_and_column_major() {
    // 3x3, kernel 2, stride 1: maxima are the bottom-right of each window.
    let x = Tensor::f32(&[1, 2, 3, 3], iota(18));
    let a = Attrs::new(12).with("kernel_shape", ints(&[2, 2]));
    let y = run(&*max_pool(&a).unwrap(), &x, 2, Some(1));
    assert_eq!(
        y[0].as_f32().unwrap(),
        &[5., 6., 8., 9., 14., 15., 17., 18.]
    );
    assert_eq!(y[1].to_i64_vec(), vec![4, 5, 7, 8, 13, 14, 16, 17]);
    let a = a.with("storage_order", AttrValue::Int(1));
    let y = run(&*max_pool(&a).unwrap(), &x, 2, None);
    // (h, w) -> w * 3 + h, plus 9 for the second channel.
    assert_eq!(y[1].to_i64_vec(), vec![4, 7, 5, 8, 13, 16, 14, 17]);
}

/// 2-D pooling attributes (opset 19): kernel, strides, dilations, pads [hb, wb, he, we] and
/// count_include_pad.
fn attrs_2d(
    k: (usize, usize),
    s: (usize, usize),
    d: (usize, usize),
    pads: [usize; 4],
    cip: i64,
) -> Attrs {
    Attrs::new(19)
        .with("kernel_shape", ints(&[k.0 as i64, k.1 as i64]))
        .with("strides", ints(&[s.0 as i64, s.1 as i64]))
        .with("dilations", ints(&[d.0 as i64, d.1 as i64]))
        .with("pads", ints(&pads.map(|p| p as i64)))
        .with("count_include_pad", AttrValue::Int(cip))
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs(), "at {i}: {x} vs {y}");
    }
}

/// A window 2^33 columns wide (padded so that outputs exist) over a 4x4 plane: the pool must not
/// size anything by the kernel (a phase plane or tap table per tap aborted the fuzz run); each
/// output is the max / mean of its window's rows from its first column to the row's end.
/// (64-bit only: the width does not fit a 32-bit usize.)
#[cfg(target_pointer_width = "64")]
#[test]
fn a_hostile_kernel_width_is_pooled_without_sizing_by_it() {
    let wide = 1usize << 33;
    let x = Tensor::f32(&[1, 1, 4, 4], iota(16));
    let xv = &iota(16);
    for (max, make) in [(true, max_pool as fn(&Attrs) -> _), (false, average_pool)] {
        let a = attrs_2d((2, wide), (2, 2), (1, 1), [0, 0, 0, wide - 1], 0);
        let op = make(&a).unwrap();
        let y = run(&*op, &x, 1, None);
        let y = y[0].as_f32().unwrap();
        assert_eq!(y.len(), 2 * 2);
        for (i, &got) in y.iter().enumerate() {
            let (o1, o2) = (i / 2, i % 2);
            let window: Vec<f32> = (2 * o1..2 * o1 + 2)
                .flat_map(|r| (2 * o2..4).map(move |c| xv[r * 4 + c]))
                .collect();
            let want = if max {
                window.iter().copied().fold(f32::MIN, f32::max)
            } else {
                window.iter().sum::<f32>() / window.len() as f32
            };
            assert_eq!(got, want, "[{i}]");
        }
    }
}

#[test]
fn pools_match_naive_with_pads_strides_dilations() {
    let (h, w) = (7, 6);
    let nc = 2 * 3;
    let xv: Vec<f32> = (0..nc * h * w)
        .map(|i| ((i * 41 % 29) as f32 - 14.0) * 0.5)
        .collect();
    let x = Tensor::f32(&[2, 3, h, w], xv.clone());
    // (kernel, strides, dilations, pads [hb, wb, he, we])
    let cases = [
        ((3, 2), (2, 1), (1, 1), [1, 0, 1, 1]),
        ((2, 3), (1, 2), (2, 1), [0, 1, 2, 0]),
        ((3, 3), (3, 3), (1, 2), [2, 2, 2, 2]),
    ];
    for (k, s, d, pads) in cases {
        let out = (
            (h + pads[0] + pads[2] - ((k.0 - 1) * d.0 + 1)) / s.0 + 1,
            (w + pads[1] + pads[3] - ((k.1 - 1) * d.1 + 1)) / s.1 + 1,
        );
        for (mode, make, cip) in [
            (0u8, max_pool as fn(&Attrs) -> _, 0),
            (1, average_pool, 0),
            (2, average_pool, 1),
        ] {
            let a = attrs_2d(k, s, d, pads, cip);
            let y = run(&*make(&a).unwrap(), &x, 1, Some(5));
            assert_eq!(y[0].shape, vec![2, 3, out.0, out.1]);
            let want = naive_window(&xv, (h, w), k, s, d, pads, out, mode);
            close(y[0].as_f32().unwrap(), &want);
        }
    }
}

#[test]
fn same_upper_lower_and_valid() {
    // 1-D x = 1..5, kernel 2, stride 1. SAME_UPPER pads the end: [1.5, 2.5, 3.5, 4.5, 5];
    // SAME_LOWER pads the start: [1, 1.5, 2.5, 3.5, 4.5]; VALID: 4 outputs.
    let x = Tensor::f32(&[1, 1, 5], iota(5));
    let base = Attrs::new(11).with("kernel_shape", ints(&[2]));
    let up = base
        .clone()
        .with("auto_pad", AttrValue::String("SAME_UPPER".into()));
    let y = run(&*average_pool(&up).unwrap(), &x, 1, None);
    assert_eq!(y[0].as_f32().unwrap(), &[1.5, 2.5, 3.5, 4.5, 5.]);
    let lo = base
        .clone()
        .with("auto_pad", AttrValue::String("SAME_LOWER".into()));
    let y = run(&*average_pool(&lo).unwrap(), &x, 1, None);
    assert_eq!(y[0].as_f32().unwrap(), &[1., 1.5, 2.5, 3.5, 4.5]);
    let va = base.with("auto_pad", AttrValue::String("VALID".into()));
    let y = run(&*max_pool(&va).unwrap(), &x, 1, None);
    assert_eq!(y[0].as_f32().unwrap(), &[2., 3., 4., 5.]);
}

#[test]
fn three_d_pool_and_global_pools() {
    let x = Tensor::f32(&[1, 2, 2, 2, 2], iota(16));
    let a = Attrs::new(12).with("kernel_shape", ints(&[2, 2, 2]));
    let y = run(&*average_pool(&a).unwrap(), &x, 1, None);
    assert_eq!(y[0].shape, vec![1, 2, 1, 1, 1]);
    assert_eq!(y[0].as_f32().unwrap(), &[4.5, 12.5]);
    let x = Tensor::f32(&[2, 3, 2, 2], iota(24));
    let y = run(
        &*global_average_pool(&Attrs::new(1)).unwrap(),
        &x,
        1,
        Some(2),
    );
    assert_eq!(y[0].shape, vec![2, 3, 1, 1]);
    assert_eq!(y[0].as_f32().unwrap(), &[2.5, 6.5, 10.5, 14.5, 18.5, 22.5]);
    let y = run(&*global_max_pool(&Attrs::new(1)).unwrap(), &x, 1, None);
    assert_eq!(y[0].as_f32().unwrap(), &[4., 8., 12., 16., 20., 24.]);
}

#[test]
fn bad_attributes_are_invalid() {
    assert!(max_pool(&Attrs::new(12)).is_err());
    let a = Attrs::new(12)
        .with("kernel_shape", ints(&[2, 2]))
        .with("pads", ints(&[1, 1]));
    assert!(max_pool(&a).is_err());
    let a = Attrs::new(12).with("kernel_shape", ints(&[2, 2]));
    let op = max_pool(&a).unwrap();
    assert!(op
        .infer(&[&TensorMeta::new(DType::F32, vec![1, 1, 4])])
        .is_err());
}

#[test]
fn max_pool_of_u8() {
    let x = Tensor::new(vec![1, 1, 2, 3], Data::U8(vec![1, 200, 3, 250, 5, 6]));
    let a = Attrs::new(22).with("kernel_shape", ints(&[2, 2]));
    let y = run(&*max_pool(&a).unwrap(), &x, 2, None);
    assert_eq!(y[0].data, Data::U8(vec![250, 200]));
    assert_eq!(y[1].to_i64_vec(), vec![3, 1]);
    assert!(average_pool(&a).unwrap().infer(&[&x.meta()]).is_err());
}

/// Naive 2-D pooling straight from the definition: windows clipped to the input, max with
/// NaN propagating, averages over the input elements or (count_include_pad) over the window
/// positions before `h + pads_end` / `w + pads_end`.
#[allow(clippy::too_many_arguments)]
fn naive_window(
    x: &[f32],
    (h, w): (usize, usize),
    k: (usize, usize),
    s: (usize, usize),
    d: (usize, usize),
    pads: [usize; 4],
    (oh, ow): (usize, usize),
    mode: u8,
) -> Vec<f32> {
    let mut y = Vec::new();
    for plane in x.chunks_exact(h * w) {
        for oi in 0..oh {
            for oj in 0..ow {
                let (mut best, mut sum, mut n, mut cip) = (f32::MIN, 0.0f64, 0, 0);
                for a in 0..k.0 {
                    for b in 0..k.1 {
                        let i = (oi * s.0 + a * d.0) as isize - pads[0] as isize;
                        let j = (oj * s.1 + b * d.1) as isize - pads[1] as isize;
                        if i < (h + pads[2]) as isize && j < (w + pads[3]) as isize {
                            cip += 1;
                        }
                        if i < 0 || j < 0 || i >= h as isize || j >= w as isize {
                            continue;
                        }
                        let v = plane[i as usize * w + j as usize];
                        if v.is_nan() || v > best && !best.is_nan() {
                            best = if best.is_nan() { best } else { v };
                        }
                        sum += v as f64;
                        n += 1;
                    }
                }
                y.push(match mode {
                    0 => best,
                    1 => (sum / n as f64) as f32,
                    _ => (sum / cip as f64) as f32,
                });
            }
        }
    }
    y
}

#[test]
fn plane_paths_match_naive_on_vision_shapes_at_every_simd_level() {
    // Bands, phase planes (strided), whole-plane windows (a reduction).
    // (planes, h, w, kernel, strides, dilations, pads [hb, wb, he, we], ceil_mode)
    type Case = (
        usize,
        (usize, usize),
        (usize, usize),
        (usize, usize),
        (usize, usize),
    );
    let cases: [(Case, [usize; 4], bool); 17] = [
        ((5, (14, 14), (3, 3), (1, 1), (1, 1)), [1, 1, 1, 1], false),
        ((3, (7, 7), (3, 3), (1, 1), (1, 1)), [1, 1, 1, 1], false),
        ((3, (28, 29), (3, 3), (2, 2), (1, 1)), [0, 0, 0, 0], true),
        ((2, (56, 56), (3, 3), (2, 2), (1, 1)), [1, 1, 1, 1], false),
        ((4, (20, 21), (2, 2), (2, 2), (1, 1)), [0, 0, 0, 0], true),
        ((2, (9, 11), (5, 5), (1, 1), (1, 1)), [2, 2, 2, 2], false),
        ((2, (9, 11), (2, 3), (3, 3), (2, 2)), [1, 0, 1, 2], true),
        ((2, (8, 8), (3, 3), (2, 1), (1, 1)), [2, 1, 0, 2], false),
        // Input rows stride times the output's (one pass per tap over the band).
        ((3, (16, 16), (3, 3), (2, 2), (1, 1)), [1, 1, 1, 1], false),
        ((2, (20, 20), (2, 2), (2, 2), (1, 1)), [0, 0, 0, 0], false),
        ((2, (12, 12), (3, 3), (3, 3), (1, 1)), [0, 0, 0, 0], false),
        ((2, (16, 16), (3, 3), (2, 2), (2, 2)), [2, 2, 2, 2], false),
        // The window is the whole plane (resnet50's last pool), and the plane with pads around it
        // (inception_v1's).
        ((6, (7, 7), (7, 7), (1, 1), (1, 1)), [0, 0, 0, 0], false),
        ((3, (6, 6), (7, 7), (1, 1), (1, 1)), [0, 0, 1, 1], false),
        ((2, (5, 6), (7, 7), (1, 1), (1, 1)), [1, 0, 1, 1], false),
        // One window that does not hold the whole plane.
        ((2, (6, 6), (4, 4), (3, 3), (1, 1)), [0, 0, 0, 0], false),
        // Wide rows: bands of 27 output rows, cut mid-plane.
        ((1, (40, 600), (3, 3), (1, 1), (1, 1)), [1, 1, 1, 1], false),
    ];
    for ((nc, (h, w), k, s, d), pads, ceil) in cases {
        let mut xv: Vec<f32> = (0..nc * h * w)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25)
            .collect();
        xv[h * w / 2 + 3] = f32::NAN;
        let x = Tensor::f32(&[1, nc, h, w], xv.clone());
        for (mode, make, cip) in [
            (0u8, max_pool as fn(&Attrs) -> _, 0),
            (1, average_pool, 0),
            (2, average_pool, 1),
        ] {
            let a = attrs_2d(k, s, d, pads, cip).with("ceil_mode", AttrValue::Int(ceil as i64));
            let op = make(&a).unwrap();
            let out = op.infer(&[&x.meta()]).unwrap()[0].shape.clone();
            let want = naive_window(&xv, (h, w), k, s, d, pads, (out[2], out[3]), mode);
            for level in crate::simd::cpu_levels() {
                let rows = nc * out[2];
                for cut in [None, Some(rows / 2 + 1)] {
                    let y = crate::simd::with_level(level, || run(&*op, &x, 1, cut));
                    let y = y[0].as_f32().unwrap();
                    for (i, (g, e)) in y.iter().zip(&want).enumerate() {
                        let ok = if mode == 0 {
                            g.to_bits() == e.to_bits() || g.is_nan() && e.is_nan()
                        } else {
                            g.is_nan() && e.is_nan() || (g - e).abs() <= 1e-5 + 1e-5 * e.abs()
                        };
                        assert!(
                            ok,
                            "{h}x{w} k{k:?} s{s:?} mode {mode} {level:?} at {i}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn pools_3x3_of_stride_1_or_2_match_the_definition_at_every_pad_width_and_level() {
    // 3x3 windows (`pool_3x3.rs` on AVX2 and AVX-512, phase planes or bands elsewhere): widths
    // around the 8-, 16- and 32-column vector edges, begin and end pads, ceil overhangs; NaNs in
    // a column past a vector pair (read only by the third tap), zeros of both signs tied. A max
    // is the first maximum bit for bit; averages (positions or the padded window counted)
    // within rounding.
    for w in [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 34, 35, 66, 111] {
        for ((pt, pl), s) in [(0, 0), (1, 2), (2, 1)]
            .into_iter()
            .flat_map(|p| [(1, 1), (2, 2), (1, 2), (2, 1)].map(|s| (p, s)))
        {
            for ceil in [false, true] {
                let (nc, h) = (2, 9);
                let mut xv: Vec<f32> = (0..nc * h * w)
                    .map(|i| ((i * 29 % 61) as f32 - 30.0) * 0.5)
                    .collect();
                // Rows 0..3 of the first plane negative but for a -0 then a +0 (same window).
                for (i, v) in xv[..3 * w].iter_mut().enumerate() {
                    *v = -1.0 - (i % 5) as f32;
                }
                let c = w.min(32).saturating_sub(2);
                (xv[c], xv[c + 1]) = (-0.0, 0.0);
                xv[w * h + (w + 1).min(w * h - 1)] = f32::NAN;
                xv[(3 * w + 32).min(w * h - 1)] = f32::NAN;
                xv[w * h + 5 * w + (w - 1).min(32)] = f32::NAN;
                let x = Tensor::f32(&[1, nc, h, w], xv.clone());
                let end = (pt.min(1), 3usize.saturating_sub(w + pl).max(pl.min(1)));
                let pads = [pt, pl, end.0, end.1];
                for (mode, make, cip) in [
                    (0u8, max_pool as fn(&Attrs) -> _, 0),
                    (1, average_pool, 0),
                    (2, average_pool, 1),
                ] {
                    let a = attrs_2d((3, 3), s, (1, 1), pads, cip)
                        .with("ceil_mode", AttrValue::Int(ceil as i64));
                    let op = make(&a).unwrap();
                    let out = op.infer(&[&x.meta()]).unwrap()[0].shape.clone();
                    let o = (out[2], out[3]);
                    let want = naive_window(&xv, (h, w), (3, 3), s, (1, 1), pads, o, mode);
                    let rows = nc * out[2];
                    for level in crate::simd::cpu_levels() {
                        for cut in [None, Some(rows / 2 + 1)] {
                            let y = crate::simd::with_level(level, || run(&*op, &x, 1, cut));
                            let y = y[0].as_f32().unwrap();
                            for (i, (g, e)) in y.iter().zip(&want).enumerate() {
                                let ok = g.is_nan() && e.is_nan()
                                    || if mode == 0 {
                                        g.to_bits() == e.to_bits()
                                    } else {
                                        (g - e).abs() <= 1e-5 + 1e-5 * e.abs()
                                    };
                                assert!(
                                    ok,
                                    "w {w} pads {pads:?} s {s:?} ceil {ceil} mode {mode} \
                                     {level:?} at {i}: {g} vs {e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A 3x3 stride-1 AveragePool with pads of 1 in `pool_3x3.rs`'s order: each window row
/// summed left, centre, right, then the rows above, centre, below (positions outside the
/// plane skipped), divided by its positions down times across (`cip`: 3 x 3 for every window).
fn average_3x3_same_in_order(plane: &[f32], (h, w): (usize, usize), cip: bool) -> Vec<f32> {
    let near = |i: usize, n: usize| (i.saturating_sub(1)..(i + 2).min(n)).collect::<Vec<_>>();
    let mut y = Vec::new();
    for i in 0..h {
        for j in 0..w {
            let (rows, cols) = (near(i, h), near(j, w));
            let across = |r: usize| cols.iter().map(|&c| plane[r * w + c]).reduce(|a, v| a + v);
            let sum = rows.iter().filter_map(|&r| across(r)).reduce(|a, v| a + v);
            let count = if cip {
                9.0
            } else {
                (cols.len() * rows.len()) as f32
            };
            y.push(sum.expect("a window inside the plane") / count);
        }
    }
    y
}

/// `op`'s output on `x` at every SIMD level, whole and cut at each of `cuts` (two calls),
/// bit for bit `want` (any NaN for a NaN).
fn same_bits_at_every_level(op: &dyn Op, x: &Tensor, want: &[f32], cuts: &[usize], what: &str) {
    let cuts = std::iter::once(None).chain(cuts.iter().copied().map(Some));
    for level in crate::simd::cpu_levels() {
        for cut in cuts.clone() {
            let y = crate::simd::with_level(level, || run(op, x, 1, cut));
            let y = y[0].as_f32().unwrap();
            assert_eq!(y.len(), want.len(), "{what}: output size");
            for (i, (g, e)) in y.iter().zip(want).enumerate() {
                assert!(
                    g.to_bits() == e.to_bits() || g.is_nan() && e.is_nan(),
                    "{what} {level:?} cut {cut:?} at {i}: {g} vs {e}"
                );
            }
        }
    }
}

#[test]
fn small_size_keeping_3x3_pools_match_the_definition_bit_for_bit_at_every_level() {
    // `pool_3x3_flat.rs` takes whole planes of up to 28 columns (AVX-512; the others the row
    // vectors or bands): planes around the 8- and 16-lane edges, flat vectors crossing rows;
    // NaNs, zeros of both signs tied, a cut mid-plane and one on a plane's edge (the planes
    // between whole, those around row by row).
    for (h, w) in [
        (2, 2),
        (3, 5),
        (7, 7),
        (4, 8),
        (5, 16),
        (9, 17),
        (14, 14),
        (28, 28),
        (6, 29),
    ] {
        let nc = 4;
        let mut xv: Vec<f32> = (0..nc * h * w)
            .map(|i| ((i * 29 % 61) as f32 - 30.0) * 0.5)
            .collect();
        for v in &mut xv[..h * w] {
            *v = -v.abs() - 1.0;
        }
        (xv[0], xv[1]) = (-0.0, 0.0);
        xv[w + 1] = -0.0;
        xv[2 * h * w + h * w / 2] = f32::NAN;
        let x = Tensor::f32(&[1, nc, h, w], xv.clone());
        for (max, cip) in [(true, false), (false, false), (false, true)] {
            let make = if max { max_pool } else { average_pool };
            let op = make(&attrs_2d((3, 3), (1, 1), (1, 1), [1, 1, 1, 1], cip as i64)).unwrap();
            let want: Vec<f32> = match max {
                true => naive_window(&xv, (h, w), (3, 3), (1, 1), (1, 1), [1; 4], (h, w), 0),
                false => xv
                    .chunks_exact(h * w)
                    .flat_map(|p| average_3x3_same_in_order(p, (h, w), cip))
                    .collect(),
            };
            let what = format!("{h}x{w} max {max} cip {cip}");
            same_bits_at_every_level(&*op, &x, &want, &[nc * h / 2 + 1, h], &what);
        }
    }
}

#[test]
fn small_halving_3x3_max_pools_match_the_definition_bit_for_bit_at_every_level() {
    // `pool_3x3_flat.rs` takes stride-2 MaxPools whose windows are all centred inside planes
    // of up to 28 columns (inception's 320 x 28 x 28 and 576 x 14 x 14 with end pads,
    // squeezenet's 27 x 27 in ceil mode); the others stay on the row vectors.
    // (h, w, pads [hb, wb, he, we], ceil_mode)
    let cases = [
        (14, 14, [0, 0, 1, 1], false),
        (28, 28, [0, 0, 1, 1], false),
        (27, 27, [0, 0, 0, 0], true),
        (13, 13, [1, 1, 1, 1], false),
        (7, 7, [1, 1, 1, 1], true),
        (9, 17, [0, 1, 0, 1], false),
        (5, 3, [1, 0, 1, 0], true),
        (4, 28, [2, 2, 2, 2], false),
    ];
    for (h, w, pads, ceil) in cases {
        let nc = 3;
        let mut xv: Vec<f32> = (0..nc * h * w)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25)
            .collect();
        (xv[0], xv[1], xv[w]) = (-0.0, 0.0, -0.0);
        xv[h * w + h * w / 2] = f32::NAN;
        let x = Tensor::f32(&[1, nc, h, w], xv.clone());
        let a = attrs_2d((3, 3), (2, 2), (1, 1), pads, 0)
            .with("ceil_mode", AttrValue::Int(ceil as i64));
        let op = max_pool(&a).unwrap();
        let out = op.infer(&[&x.meta()]).unwrap()[0].shape.clone();
        let o = (out[2], out[3]);
        let want = naive_window(&xv, (h, w), (3, 3), (2, 2), (1, 1), pads, o, 0);
        let what = format!("{h}x{w} pads {pads:?} ceil {ceil}");
        same_bits_at_every_level(&*op, &x, &want, &[nc * out[2] / 2 + 1, out[2]], &what);
    }
}
