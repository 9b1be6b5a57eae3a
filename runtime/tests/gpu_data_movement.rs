//! GPU-vs-reference tests of the data movement family: views, Transpose, Concat, Split, Slice,
//! Gather, GatherElements, Expand, Tile, Pad, Resize, Upsample and the generators.
//!
//! Every expected output is built here by a naive per-coordinate reference (`build`), then the
//! op runs on the CPU, on the GPU (lavapipe in CI) and split across both at odd rows.

use tandem::testing::{assert_close, check_all_placements, op, run_cpu, run_gpu};
use tandem_ops::{AttrValue, DType, Data, Tensor};

/// f32 values that are distinct and not multiples of anything in particular.
fn fill(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::f32(shape, (0..n).map(|i| i as f32 * 0.5 - 7.25).collect())
}

fn ints(v: &[i64]) -> Tensor {
    Tensor::i64(&[v.len()], v.to_vec())
}

fn empty() -> Tensor {
    Tensor::f32(&[0], vec![])
}

/// Row-major coordinates of flat index `i` in `shape`.
fn coords(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d];
        i /= shape[d];
    }
    c
}

/// Flat index of coordinates `c` in `shape`.
fn flat(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |acc, (&x, &n)| acc * n + x)
}

/// A tensor of `shape` whose element at coordinates c is `f(c)` (f32).
fn build(shape: &[usize], f: impl Fn(&[usize]) -> f32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::f32(shape, (0..n).map(|i| f(&coords(i, shape))).collect())
}

fn at(t: &Tensor, c: &[usize]) -> f32 {
    t.data.get_f64(flat(c, &t.shape)) as f32
}

#[test]
fn views_copy_rows_on_both_devices() {
    let x = fill(&[3, 5, 7]);
    let want = Tensor::f32(&[15, 7], x.as_f32().unwrap().to_vec());
    check_all_placements(
        &*op("Reshape", 14, &[]),
        &[x.clone(), ints(&[-1, 7])],
        std::slice::from_ref(&want),
        0.0,
    );
    check_all_placements(
        &*op("Flatten", 13, &[("axis", AttrValue::Int(2))]),
        std::slice::from_ref(&x),
        std::slice::from_ref(&want),
        0.0,
    );
    let want = Tensor::f32(&[1, 3, 5, 7], x.as_f32().unwrap().to_vec());
    check_all_placements(
        &*op("Unsqueeze", 13, &[]),
        &[x.clone(), ints(&[0])],
        std::slice::from_ref(&want),
        0.0,
    );
    check_all_placements(
        &*op("Squeeze", 13, &[]),
        &[want.clone(), ints(&[0])],
        std::slice::from_ref(&x),
        0.0,
    );
    check_all_placements(
        &*op("Identity", 13, &[]),
        std::slice::from_ref(&x),
        std::slice::from_ref(&x),
        0.0,
    );
    let d = op("Dropout", 13, &[]);
    check_all_placements(&*d, std::slice::from_ref(&x), std::slice::from_ref(&x), 0.0);
    let mask = &run_gpu(&*d, std::slice::from_ref(&x))[1];
    assert_eq!(mask.data, Data::Bool(vec![true; 105]));
}

#[test]
fn transpose_of_odd_shapes_and_bools() {
    let x = fill(&[3, 5, 7, 2]);
    let perm = [2usize, 0, 3, 1];
    let out_shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let want = build(&out_shape, |c| {
        let mut src = [0; 4];
        for (d, &p) in perm.iter().enumerate() {
            src[p] = c[d];
        }
        at(&x, &src)
    });
    let t = op(
        "Transpose",
        13,
        &[("perm", AttrValue::Ints(vec![2, 0, 3, 1]))],
    );
    check_all_placements(&*t, &[x], std::slice::from_ref(&want), 0.0);
    // bool: the default (reversed) permutation of a 9 x 11 matrix
    let b = Tensor::new(
        vec![9, 11],
        Data::Bool((0..99).map(|i| i % 3 == 0).collect()),
    );
    let g = run_gpu(&*op("Transpose", 13, &[]), std::slice::from_ref(&b));
    let want: Vec<bool> = (0..99).map(|i| (i % 9 * 11 + i / 9) % 3 == 0).collect();
    assert_eq!(g[0].data, Data::Bool(want));
}

#[test]
fn slice_with_negative_steps_and_clamped_ends() {
    let x = fill(&[6, 9, 5]);
    // x[5:0:-2, 1:INT32_MAX:3, -1:-6:-1] (testing::run_gpu uploads every input, and an
    // int64 INT_MAX does not fit the GPU's i32: the clamping itself is tested in ops/src/slice.rs)
    let s = op("Slice", 13, &[]);
    let ins = [
        x.clone(),
        ints(&[5, 1, -1]),
        ints(&[0, i32::MAX as i64, -6]),
        ints(&[0, 1, 2]),
        ints(&[-2, 3, -1]),
    ];
    let want = build(&[3, 3, 5], |c| {
        at(&x, &[5 - 2 * c[0], 1 + 3 * c[1], 4 - c[2]])
    });
    check_all_placements(&*s, &ins, std::slice::from_ref(&want), 0.0);
    // an empty result
    let ins = [x.clone(), ints(&[3]), ints(&[3]), ints(&[1])];
    let out = run_gpu(&*s, &ins);
    assert_eq!(out[0].shape, vec![6, 0, 5]);
}

#[test]
fn concat_on_inner_and_first_axis() {
    let a = fill(&[4, 3, 5]);
    let b = build(&[4, 2, 5], |c| 100.0 + (c[0] * 10 + c[1] * 5 + c[2]) as f32);
    let want = build(&[4, 5, 5], |c| {
        if c[1] < 3 {
            at(&a, c)
        } else {
            at(&b, &[c[0], c[1] - 3, c[2]])
        }
    });
    check_all_placements(
        &*op("Concat", 13, &[("axis", AttrValue::Int(1))]),
        &[a.clone(), b],
        std::slice::from_ref(&want),
        0.0,
    );
    let c = fill(&[3, 3, 5]);
    let want = build(&[7, 3, 5], |k| {
        if k[0] < 4 {
            at(&a, k)
        } else {
            at(&c, &[k[0] - 4, k[1], k[2]])
        }
    });
    check_all_placements(
        &*op("Concat", 13, &[("axis", AttrValue::Int(0))]),
        &[a, c],
        std::slice::from_ref(&want),
        0.0,
    );
}

/// A batch-1 Concat on channels whose inputs are whole vec4s (`copy_vec4.wgsl` on lavapipe),
/// of i64s (narrowed to 4-byte words on the GPU), and one whose inputs are not.
#[test]
fn concat_of_whole_vec4_runs() {
    for (a, b) in [([1, 8, 6], [1, 4, 6]), ([1, 3, 6], [1, 6, 6])] {
        let (x, y) = (fill(&a), build(&b, |c| 500.0 + (c[1] * 6 + c[2]) as f32));
        let want = build(&[1, a[1] + b[1], 6], |c| match c[1] < a[1] {
            true => at(&x, c),
            false => at(&y, &[0, c[1] - a[1], c[2]]),
        });
        let concat = op("Concat", 13, &[("axis", AttrValue::Int(1))]);
        check_all_placements(&*concat, &[x, y], std::slice::from_ref(&want), 0.0);
    }
    let x = Tensor::i64(&[1, 2, 4], (0..8).collect());
    let y = Tensor::i64(&[1, 1, 4], vec![-1, -2, -3, -4]);
    let got = run_gpu(&*op("Concat", 13, &[("axis", AttrValue::Int(1))]), &[x, y]);
    let want: Vec<i64> = (0..8).chain([-1, -2, -3, -4]).collect();
    assert_eq!(got[0].data, Data::I64(want));
}

#[test]
fn split_uneven_on_gpu() {
    let x = fill(&[3, 11]);
    let s = op(
        "Split",
        18,
        &[
            ("axis", AttrValue::Int(1)),
            ("num_outputs", AttrValue::Int(3)),
        ],
    );
    let g = run_gpu(&*s, std::slice::from_ref(&x));
    let widths = [4, 4, 3];
    let mut off = 0;
    for (k, &w) in widths.iter().enumerate() {
        let want = build(&[3, w], |c| at(&x, &[c[0], c[1] + off]));
        assert_close(&g[k], &want, 0.0, 0.0);
        assert_close(&run_cpu(&*s, std::slice::from_ref(&x))[k], &want, 0.0, 0.0);
        off += w;
    }
}

#[test]
fn gather_and_gather_elements() {
    let x = fill(&[5, 7, 3]);
    let idx = Tensor::i64(&[2, 3], vec![0, -1, 3, 6, 2, -7]);
    let fix = |v: i64| if v < 0 { (v + 7) as usize } else { v as usize };
    let iv = idx.to_i64_vec();
    let want = build(&[5, 2, 3, 3], |c| {
        at(&x, &[c[0], fix(iv[c[1] * 3 + c[2]]), c[3]])
    });
    check_all_placements(
        &*op("Gather", 13, &[("axis", AttrValue::Int(1))]),
        &[x.clone(), idx],
        std::slice::from_ref(&want),
        0.0,
    );
    // scalar index drops the axis; i32 indices; i64 data
    let xi = Tensor::i64(&[4, 6], (0..24).map(|v| v * 3 - 20).collect());
    let g = op("Gather", 13, &[]);
    let got = run_gpu(&*g, &[xi.clone(), Tensor::new(vec![], Data::I32(vec![-2]))]);
    assert_eq!(
        got[0].data,
        Data::I64((12..18).map(|v| v * 3 - 20).collect())
    );
    // GatherElements on axis 0
    let ge = op("GatherElements", 13, &[]);
    let idx = Tensor::i64(
        &[3, 7, 3],
        (0..63).map(|i| (i * 7 % 5) as i64 - 2).collect(),
    );
    let iv = idx.to_i64_vec();
    let want = build(&[3, 7, 3], |c| {
        let v = iv[flat(c, &[3, 7, 3])];
        at(
            &x,
            &[
                if v < 0 { (v + 5) as usize } else { v as usize },
                c[1],
                c[2],
            ],
        )
    });
    check_all_placements(&*ge, &[x, idx], std::slice::from_ref(&want), 0.0);
}

#[test]
fn expand_and_tile() {
    let x = fill(&[3, 1, 5]);
    let want = build(&[2, 3, 4, 5], |c| at(&x, &[c[1], 0, c[3]]));
    check_all_placements(
        &*op("Expand", 13, &[]),
        &[x.clone(), ints(&[2, 1, 4, 1])],
        std::slice::from_ref(&want),
        0.0,
    );
    let want = build(&[6, 3, 10], |c| at(&x, &[c[0] % 3, 0, c[2] % 5]));
    check_all_placements(
        &*op("Tile", 13, &[]),
        &[x, ints(&[2, 3, 2])],
        std::slice::from_ref(&want),
        0.0,
    );
}

#[test]
fn pad_every_mode() {
    let x = fill(&[3, 4]);
    let pads = [2i64, 3, 1, -1]; // begin (2, 3), end (1, -1)
    for mode in ["constant", "reflect", "edge", "wrap"] {
        let src = |v: i64, n: i64| -> Option<usize> {
            if (0..n).contains(&v) {
                return Some(v as usize);
            }
            match mode {
                "constant" => None,
                "edge" => Some(v.clamp(0, n - 1) as usize),
                "wrap" => Some(v.rem_euclid(n) as usize),
                _ => {
                    let p = 2 * (n - 1);
                    let m = v.rem_euclid(p);
                    Some(if m >= n { p - m } else { m } as usize)
                }
            }
        };
        let want = build(&[6, 6], |c| {
            match (src(c[0] as i64 - 2, 3), src(c[1] as i64 - 3, 4)) {
                (Some(r), Some(k)) => at(&x, &[r, k]),
                _ => 1.5,
            }
        });
        let p = op("Pad", 19, &[("mode", AttrValue::String(mode.into()))]);
        check_all_placements(
            &*p,
            &[x.clone(), ints(&pads), Tensor::f32(&[], vec![1.5])],
            std::slice::from_ref(&want),
            0.0,
        );
    }
}

/// Naive half-pixel bilinear on the last two axes (clamped coordinates).
fn naive_bilinear(x: &Tensor, oh: usize, ow: usize) -> Tensor {
    let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (sh, sw) = (oh as f64 / h as f64, ow as f64 / w as f64);
    build(&[n, c, oh, ow], |k| {
        let fy = ((k[2] as f64 + 0.5) / sh - 0.5).clamp(0.0, (h - 1) as f64);
        let fx = ((k[3] as f64 + 0.5) / sw - 0.5).clamp(0.0, (w - 1) as f64);
        let (y0, x0) = (fy.floor() as usize, fx.floor() as usize);
        let (y1, x1) = ((y0 + 1).min(h - 1), (x0 + 1).min(w - 1));
        let (dy, dx) = (fy - y0 as f64, fx - x0 as f64);
        let g = |y: usize, xx: usize| at(x, &[k[0], k[1], y, xx]) as f64;
        ((1.0 - dy) * ((1.0 - dx) * g(y0, x0) + dx * g(y0, x1))
            + dy * ((1.0 - dx) * g(y1, x0) + dx * g(y1, x1))) as f32
    })
}

#[test]
fn resize_nearest_linear_cubic_and_upsample() {
    let x = fill(&[2, 3, 5, 7]);
    let lin = op(
        "Resize",
        13,
        &[("mode", AttrValue::String("linear".into()))],
    );
    let sizes = ints(&[2, 3, 9, 4]);
    check_all_placements(
        &*lin,
        &[x.clone(), empty(), empty(), sizes],
        std::slice::from_ref(&naive_bilinear(&x, 9, 4)),
        1e-4,
    );
    // nearest, asymmetric + floor, scales 2 x 1.5 on i64 data through the GPU
    let near = op(
        "Resize",
        19,
        &[
            (
                "coordinate_transformation_mode",
                AttrValue::String("asymmetric".into()),
            ),
            ("nearest_mode", AttrValue::String("floor".into())),
        ],
    );
    let scales = Tensor::f32(&[4], vec![1.0, 1.0, 2.0, 1.5]);
    let want = build(&[2, 3, 10, 10], |c| {
        at(
            &x,
            &[c[0], c[1], c[2] / 2, (c[3] as f64 / 1.5).floor() as usize],
        )
    });
    check_all_placements(
        &*near,
        &[x.clone(), empty(), scales.clone()],
        std::slice::from_ref(&want),
        0.0,
    );
    let up = op("Upsample", 9, &[]);
    check_all_placements(&*up, &[x.clone(), scales], std::slice::from_ref(&want), 0.0);
    // cubic: GPU and splits against the CPU kernel, itself checked against a naive Keys
    // kernel in ops/src/resize.rs
    let cubic = op(
        "Resize",
        13,
        &[
            ("mode", AttrValue::String("cubic".into())),
            ("exclude_outside", AttrValue::Int(1)),
        ],
    );
    let ins = [
        x.clone(),
        empty(),
        Tensor::f32(&[4], vec![1.0, 1.0, 1.6, 0.8]),
    ];
    let want = run_cpu(&*cubic, &ins).remove(0);
    check_all_placements(&*cubic, &ins, std::slice::from_ref(&want), 1e-4);
}

#[test]
fn generators() {
    let r = op("Range", 11, &[]);
    let f = |v: f32| Tensor::f32(&[], vec![v]);
    let want = Tensor::f32(&[130], (0..130).map(|i| 1.0 + i as f32 * 0.25).collect());
    check_all_placements(
        &*r,
        &[f(1.0), f(33.5), f(0.25)],
        std::slice::from_ref(&want),
        1e-5,
    );
    let i = |v: i64| Tensor::i64(&[], vec![v]);
    let got = run_gpu(&*r, &[i(10), i(-91), i(-3)]);
    assert_eq!(
        got[0].data,
        Data::I64((0..34).map(|k| 10 - 3 * k).collect())
    );

    let c = op(
        "ConstantOfShape",
        9,
        &[("value", AttrValue::Tensor(Tensor::f32(&[1], vec![2.5])))],
    );
    check_all_placements(
        &*c,
        &[ints(&[3, 67])],
        std::slice::from_ref(&Tensor::f32(&[3, 67], vec![2.5; 201])),
        0.0,
    );

    let x = fill(&[2, 5, 70]);
    for (upper, k) in [(1, 2i64), (0, -1)] {
        let t = op("Trilu", 14, &[("upper", AttrValue::Int(upper))]);
        let want = build(&[2, 5, 70], |c| {
            let d = c[2] as i64 - c[1] as i64;
            let keep = if upper == 1 { d >= k } else { d <= k };
            if keep {
                at(&x, c)
            } else {
                0.0
            }
        });
        check_all_placements(
            &*t,
            &[x.clone(), Tensor::i64(&[], vec![k])],
            std::slice::from_ref(&want),
            0.0,
        );
    }
    let eye = op("EyeLike", 9, &[("k", AttrValue::Int(1))]);
    let want = build(&[5, 70], |c| (c[1] == c[0] + 1) as i32 as f32);
    check_all_placements(&*eye, &[fill(&[5, 70])], std::slice::from_ref(&want), 0.0);

    let s = op("Shape", 15, &[("start", AttrValue::Int(1))]);
    assert_eq!(
        run_gpu(&*s, std::slice::from_ref(&x))[0].data,
        Data::I64(vec![5, 70])
    );
    let z = op("Size", 13, &[]);
    assert_eq!(run_gpu(&*z, &[x])[0].data, Data::I64(vec![700]));
    assert_eq!(
        run_cpu(
            &*op("Constant", 13, &[("value_int", AttrValue::Int(4))]),
            &[]
        )[0]
        .dtype(),
        DType::I64
    );
}
