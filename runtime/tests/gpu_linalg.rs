//! GPU-vs-reference tests of the linear algebra family: MatMul, Gemm, Conv, ConvTranspose.
//!
//! Each case is computed by a naive nested-loop reference written here, then by the op on the
//! CPU, on the GPU (lavapipe in CI) and split across both at an odd row.

use tandem::testing::{self, check_all_placements, gpu, hashed};
use tandem_ops::gemm_op::Gemm;
use tandem_ops::{AttrValue, Attrs, Op, Tensor};

fn fill(shape: &[usize], seed: u32) -> Tensor {
    hashed(shape, seed, -0.5, 1.0 / 4096.0)
}

fn op(name: &str, attrs: &[(&str, AttrValue)]) -> Box<dyn Op> {
    testing::op(name, 17, attrs)
}

// ---------------------------------------------------------------- MatMul / Gemm

/// Batched row-major product with numpy broadcasting of the batch dims of `a` [.., M, K] and
/// `b` [.., K, N] (both rank >= 2).
fn naive_matmul(a: &Tensor, b: &Tensor) -> Tensor {
    let (sa, sb) = (&a.shape, &b.shape);
    let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
    let rank = sa.len().max(sb.len()) - 2;
    let pad = |s: &[usize]| {
        let mut v = vec![1; rank + 2 - s.len()];
        v.extend_from_slice(&s[..s.len() - 2]);
        v
    };
    let (pa, pb) = (pad(sa), pad(sb));
    let batch: Vec<usize> = (0..rank).map(|d| pa[d].max(pb[d])).collect();
    let nb: usize = batch.iter().product();
    let (av, bv) = (a.as_f32().unwrap(), b.as_f32().unwrap());
    let mut out = vec![0.0; nb * m * n];
    for bi in 0..nb {
        let (mut r, mut ia, mut ib, mut sa_, mut sb_) = (bi, 0, 0, 1, 1);
        for d in (0..rank).rev() {
            let idx = r % batch[d];
            r /= batch[d];
            ia += if pa[d] == 1 { 0 } else { idx * sa_ };
            ib += if pb[d] == 1 { 0 } else { idx * sb_ };
            sa_ *= pa[d];
            sb_ *= pb[d];
        }
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += av[ia * m * k + i * k + p] as f64 * bv[ib * k * n + p * n + j] as f64;
                }
                out[(bi * m + i) * n + j] = s as f32;
            }
        }
    }
    let mut shape = batch;
    shape.extend([m, n]);
    Tensor::f32(&shape, out)
}

#[test]
fn matmul_gpu_matches_reference() {
    let mm = op("MatMul", &[]);
    for (sa, sb) in [
        (vec![1, 1], vec![1, 1]),
        (vec![67, 33], vec![33, 71]),
        (vec![130, 5], vec![5, 129]),
        (vec![2, 1, 17, 9], vec![3, 9, 66]),
        (vec![12, 1, 64], vec![12, 64, 40]),
        // M = 1: one row a workgroup, 3 workgroups of 64 columns, the last partial
        (vec![1, 70], vec![70, 131]),
        // K and N multiples of 4: matmul_vec4.wgsl on Cpu adapters (lavapipe). One row; two
        // row tiles with a last partial column block; broadcast batches.
        (vec![1, 96], vec![96, 136]),
        (vec![70, 20], vec![20, 68]),
        (vec![2, 3, 9, 8], vec![3, 8, 12]),
        // A's rows through uniform windows (matmul_window.wgsl on Cpu adapters): 16 rows of
        // K 1024 a window, flat over 2 batches, the last window 10 rows; 6 rows of K 2500
        (vec![2, 37, 1024], vec![1024, 68]),
        (vec![13, 2500], vec![2500, 72]),
        // K not a multiple of 4 (K_UNALIGNED): magika's K of 257 in two windows of 56 rows
        // over 2 batches, K 6 in one window, K 7 in one row
        (vec![2, 37, 257], vec![257, 64]),
        (vec![9, 6], vec![6, 8]),
        (vec![1, 7], vec![7, 12]),
        (vec![3, 0, 4], vec![4, 5]),
        (vec![5, 0], vec![0, 6]),
    ] {
        let a = fill(&sa, 1);
        let b = fill(&sb, 2);
        let want = naive_matmul(&a, &b);
        check_all_placements(mm.as_ref(), &[a, b], std::slice::from_ref(&want), 1e-4);
    }
}

/// With K not a multiple of 4 the window kernel's last group of four k runs past K: the A
/// floats there belong to the next row and B's rows there do not exist. Both are read as 0:
/// an infinity at the start of A's next row and in B's last row reach only the outputs they
/// belong to (read unmasked, inf x 0 would put NaN in others). The same for a GPU's
/// `matmul_tiled.wgsl` (40 rows), whose step of 16 k runs past K = 5 and reads there, clamped,
/// the last k of A's row (an infinity in row 2) and B's last row.
#[test]
fn matmul_with_k_not_a_multiple_of_4_keeps_infinities_in_their_rows() {
    let mm = op("MatMul", &[]);
    for (m, k, n) in [(9, 5, 8), (40, 5, 8)] {
        let mut a = fill(&[m, k], 1);
        a.as_f32_mut().unwrap()[k] = f32::INFINITY;
        a.as_f32_mut().unwrap()[3 * k - 1] = f32::INFINITY;
        let mut b = fill(&[k, n], 2);
        b.as_f32_mut().unwrap()[(k - 1) * n + 3] = f32::NEG_INFINITY;
        let want = naive_matmul(&a, &b);
        check_all_placements(mm.as_ref(), &[a, b], std::slice::from_ref(&want), 1e-4);
    }
}

/// A fused bias (`MatMul::bias`, the fusion pass's `MatMul+Add`) over each kernel: windows of
/// A's rows (C read once an invocation), matmul_vec4.wgsl (one row), matmul.wgsl (N odd),
/// batched, and a bias of rank 3 over a rank-3 output.
#[test]
fn matmul_with_a_bias_matches_reference() {
    let mm = tandem_ops::matmul::MatMul {
        bias: true,
        ..Default::default()
    };
    for (sa, sb, sc) in [
        (vec![2, 37, 1024], vec![1024, 68], vec![68]),
        (vec![128, 384], vec![384, 384], vec![1, 384]),
        (vec![30, 257], vec![257, 64], vec![64]),
        (vec![1, 96], vec![96, 136], vec![136]),
        (vec![70, 20], vec![20, 67], vec![67]),
        (vec![2, 3, 9, 8], vec![3, 8, 12], vec![1, 1, 12]),
    ] {
        let (a, b, c) = (fill(&sa, 1), fill(&sb, 2), fill(&sc, 3));
        let mut want = naive_matmul(&a, &b);
        let n = *sb.last().unwrap();
        let bias = c.as_f32().unwrap().to_vec();
        for row in want.as_f32_mut().unwrap().chunks_mut(n) {
            row.iter_mut().zip(&bias).for_each(|(o, b)| *o += b);
        }
        check_all_placements(&mm, &[a, b, c], std::slice::from_ref(&want), 1e-4);
    }
    // a bias that is not one row of N, or of higher rank than the output: named errors
    let metas = |shapes: [&[usize]; 3]| {
        shapes.map(|s| tandem_ops::TensorMeta::new(tandem_ops::DType::F32, s.to_vec()))
    };
    for bad in [
        [&[4, 6][..], &[6, 5], &[2, 5]],
        [&[4, 6], &[6, 5], &[4]],
        [&[4, 6], &[6, 5], &[1, 1, 5]],
    ] {
        let m = metas(bad);
        let err = mm.infer(&[&m[0], &m[1], &m[2]]).unwrap_err().to_string();
        assert!(err.contains("bias of shape"), "{err}");
    }
}

#[test]
fn matmul_gpu_one_dimensional_operands() {
    let mm = op("MatMul", &[]);
    let a = fill(&[2, 7, 9], 3);
    let v = fill(&[9], 4);
    let want = naive_matmul(&a, &Tensor::f32(&[9, 1], v.as_f32().unwrap().to_vec()));
    let want = Tensor::f32(&[2, 7], want.as_f32().unwrap().to_vec());
    check_all_placements(
        mm.as_ref(),
        &[a.clone(), v.clone()],
        std::slice::from_ref(&want),
        1e-4,
    );
    let b = fill(&[2, 9, 5], 5);
    let want = naive_matmul(&Tensor::f32(&[1, 9], v.as_f32().unwrap().to_vec()), &b);
    let want = Tensor::f32(&[2, 5], want.as_f32().unwrap().to_vec());
    check_all_placements(mm.as_ref(), &[v, b], std::slice::from_ref(&want), 1e-4);
}

fn transpose(t: &Tensor) -> Tensor {
    let (r, c) = (t.shape[0], t.shape[1]);
    let v = t.as_f32().unwrap();
    Tensor::f32(
        &[c, r],
        (0..r * c).map(|i| v[(i % r) * c + i / r]).collect(),
    )
}

/// A constant transposed weight stored with padded rows (as a session stores it,
/// `tandem::layout`) gives the plain product on the CPU, the GPU and split; the padding holds
/// NaN, so a kernel that reads it fails.
#[test]
fn gemm_with_padded_weight_rows_matches_reference() {
    let (m, n, k) = (33, 70, 288);
    let attrs = Attrs::new(13).with("transB", AttrValue::Int(1));
    let gemm = tandem_ops::gemm_op::gemm(&attrs).unwrap();
    let gemm = gemm.as_any().unwrap().downcast_ref::<Gemm>().unwrap();
    let (a, b) = (fill(&[m, k], 7), fill(&[k, n], 8));
    let want = naive_matmul(&a, &b);
    let (padded, mut bt) = gemm
        .with_padded_weight(Some(&[m, k]), &transpose(&b))
        .unwrap();
    let ld = bt.shape[1];
    assert!(ld > k);
    for row in bt.as_f32_mut().unwrap().chunks_exact_mut(ld) {
        row[k..].fill(f32::NAN);
    }
    check_all_placements(&padded, &[a, bt], std::slice::from_ref(&want), 1e-4);
}

#[test]
fn gemm_gpu_matches_reference() {
    // The second and third sizes have K and N multiples of 4 (on lavapipe untransposed:
    // matmul_window.wgsl, one window of A's rows, then 3 of 16, 16 and 5 rows).
    for ((m, n, k), (ta, tb)) in [(67, 70, 19), (67, 72, 20), (37, 68, 1024)]
        .into_iter()
        .flat_map(|s| [(false, false), (true, true), (true, false)].map(|t| (s, t)))
    {
        for cshape in [
            None,
            Some(vec![n]),
            Some(vec![m, 1]),
            Some(vec![m, n]),
            Some(vec![]),
        ] {
            let g = op(
                "Gemm",
                &[
                    ("alpha", AttrValue::Float(0.75)),
                    ("beta", AttrValue::Float(-1.5)),
                    ("transA", AttrValue::Int(ta as i64)),
                    ("transB", AttrValue::Int(tb as i64)),
                ],
            );
            let a = fill(&[m, k], 7);
            let b = fill(&[k, n], 8);
            let prod = naive_matmul(&a, &b);
            let mut ins = vec![
                if ta { transpose(&a) } else { a },
                if tb { transpose(&b) } else { b },
            ];
            let mut want: Vec<f32> = prod.as_f32().unwrap().iter().map(|v| 0.75 * v).collect();
            if let Some(cs) = &cshape {
                let c = fill(cs, 9);
                let cv = c.as_f32().unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let idx = match cs.as_slice() {
                            [] => 0,
                            [_] => j,
                            [_, 1] => i,
                            _ => i * n + j,
                        };
                        want[i * n + j] += -1.5 * cv[idx];
                    }
                }
                ins.push(c);
            }
            check_all_placements(
                g.as_ref(),
                &ins,
                std::slice::from_ref(&Tensor::f32(&[m, n], want)),
                1e-4,
            );
        }
    }
}

// ---------------------------------------------------------------- Conv

/// Conv by the definition: x [N, C, H, W], w [M, C/group, KH, KW], begin pads `p`, output
/// size `o`.
#[allow(clippy::too_many_arguments)]
fn naive_conv(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    group: usize,
    s: [usize; 2],
    d: [usize; 2],
    p: [i64; 2],
    o: [usize; 2],
) -> Tensor {
    let (xs, ws) = (&x.shape, &w.shape);
    let (n, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
    let (m, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let (xv, wv) = (x.as_f32().unwrap(), w.as_f32().unwrap());
    let mg = m / group;
    let mut out = vec![0.0; n * m * o[0] * o[1]];
    for ni in 0..n {
        for oc in 0..m {
            let g = oc / mg;
            for y in 0..o[0] {
                for xo in 0..o[1] {
                    let mut acc = b.map_or(0.0, |b| b.as_f32().unwrap()[oc]);
                    for ci in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let ih = (y * s[0] + i * d[0]) as i64 - p[0];
                                let iw = (xo * s[1] + j * d[1]) as i64 - p[1];
                                if ih < 0 || iw < 0 || ih >= h as i64 || iw >= wd as i64 {
                                    continue;
                                }
                                acc += xv
                                    [((ni * c + g * cg + ci) * h + ih as usize) * wd + iw as usize]
                                    * wv[((oc * cg + ci) * kh + i) * kw + j];
                            }
                        }
                    }
                    out[((ni * m + oc) * o[0] + y) * o[1] + xo] = acc;
                }
            }
        }
    }
    Tensor::f32(&[n, m, o[0], o[1]], out)
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

#[test]
#[allow(clippy::type_complexity)]
fn conv_gpu_matches_reference() {
    // (x shape, M, kernel, group, strides, dilations, pads [t, l, b, r], bias)
    let cases: &[(
        [usize; 4],
        usize,
        [usize; 2],
        usize,
        [usize; 2],
        [usize; 2],
        [i64; 4],
        bool,
    )] = &[
        (
            [1, 3, 13, 11],
            5,
            [3, 3],
            1,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            true,
        ),
        (
            [2, 4, 10, 7],
            6,
            [3, 2],
            2,
            [2, 1],
            [1, 2],
            [0, 1, 2, 0],
            false,
        ),
        (
            [1, 8, 9, 9],
            8,
            [3, 3],
            8,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            true,
        ),
        (
            [1, 6, 12, 12],
            12,
            [5, 5],
            6,
            [2, 2],
            [1, 1],
            [2, 2, 2, 2],
            true,
        ),
        (
            [2, 6, 5, 7],
            4,
            [1, 1],
            1,
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            true,
        ),
        (
            [1, 16, 21, 19],
            12,
            [3, 3],
            1,
            [1, 1],
            [2, 2],
            [2, 2, 2, 2],
            false,
        ),
        // 10 output channels a group: an 8-channel block and a 2-channel one (the 8 x 8 tile
        // lavapipe runs), 17 columns: a partial block of 8 pixels per row
        (
            [1, 4, 9, 17],
            20,
            [3, 3],
            2,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            true,
        ),
        // lavapipe's vec4 kernels (`conv_pointwise.wgsl`, `conv_rows.wgsl`): a grouped 1x1 of
        // 8 input and 5 output channels a group (a block of 4 and one of 1); a 2 x 5 kernel
        // with a left pad of 2 and a vertical dilation over rows of 12 (a block of 8 pixels and
        // one of 4); stride 2 across, no left pad, a 4-wide kernel; a depthwise 3x3 of stride 2;
        // a first conv's 7x7 of stride 2 (rows of 11: a block of 8 pixels and one of 3)
        (
            [2, 16, 4, 5],
            10,
            [1, 1],
            2,
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            true,
        ),
        (
            [1, 5, 7, 12],
            10,
            [2, 5],
            1,
            [1, 1],
            [2, 1],
            [1, 2, 0, 2],
            true,
        ),
        (
            [1, 3, 8, 20],
            4,
            [3, 4],
            1,
            [1, 2],
            [1, 1],
            [1, 0, 1, 1],
            false,
        ),
        (
            [1, 8, 6, 8],
            8,
            [3, 3],
            8,
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            true,
        ),
        (
            [1, 3, 19, 21],
            5,
            [7, 7],
            1,
            [2, 2],
            [1, 1],
            [3, 3, 3, 3],
            true,
        ),
        // `conv_pointwise_x_pixels.wgsl` (lavapipe's 1x1s that `conv_pointwise.wgsl` cannot
        // read as vec4s): stride 2 on two images of 5 x 6 output pixels (30: blocks of 8 pixels
        // across rows, the last short), 10 output channels (a block of 8 and one of 2); two
        // groups of 4 input channels, stride 3 across (7 x 3 pixels)
        (
            [2, 8, 9, 11],
            10,
            [1, 1],
            1,
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            true,
        ),
        (
            [1, 8, 7, 7],
            12,
            [1, 1],
            2,
            [1, 3],
            [1, 1],
            [0, 0, 0, 0],
            false,
        ),
        // `conv_rows.wgsl` with W in uniform windows of 64 KiB: 576 weights a channel, so 28
        // channels a window and 40 output channels two dispatches an image (blocks cut at 24),
        // X from storage (30 wide) and from a texture (16 wide, the two dispatches sharing it);
        // two groups of 12 channels of 1152 weights (a dispatch a group); 2700 weights a channel
        // overflow a window in blocks of 8 and, on 4 x 9 pixels, windows of 6 do not pay, so W
        // stays a storage buffer; 2304 weights a channel: windows of 7 channels, the second
        // holding 3
        (
            [2, 64, 10, 16],
            40,
            [3, 3],
            1,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            true,
        ),
        (
            [2, 64, 24, 30],
            40,
            [3, 3],
            1,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            true,
        ),
        (
            [1, 256, 20, 30],
            24,
            [3, 3],
            2,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            false,
        ),
        (
            [1, 300, 4, 9],
            10,
            [3, 3],
            1,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            true,
        ),
        (
            [1, 256, 10, 12],
            10,
            [3, 3],
            1,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            true,
        ),
        // `conv_tiled.wgsl` (a GPU's kernel where a group has at least 32 output channels;
        // lavapipe runs it in check_all_placements' GPU layout): two groups of 35 channels
        // over 27 weights each (two steps of 16, the second short), stride 2 down, dilation 2
        // across, uneven pads; 130 channels over three tiles of 64, the last short, on two
        // images of 99 pixels (two pixel tiles each)
        (
            [1, 6, 15, 13],
            70,
            [3, 3],
            2,
            [2, 1],
            [1, 2],
            [1, 2, 0, 1],
            true,
        ),
        (
            [2, 5, 11, 9],
            130,
            [3, 3],
            1,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            false,
        ),
        (
            [0, 3, 5, 5],
            2,
            [3, 3],
            1,
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            true,
        ),
    ];
    for &(xs, m, k, group, s, d, pads, bias) in cases {
        let x = fill(&xs, 11);
        let w = fill(&[m, xs[1] / group, k[0], k[1]], 12);
        let b = fill(&[m], 13);
        let conv = op(
            "Conv",
            &[
                ("group", AttrValue::Int(group as i64)),
                ("strides", ints(&[s[0] as i64, s[1] as i64])),
                ("dilations", ints(&[d[0] as i64, d[1] as i64])),
                ("pads", ints(&pads)),
            ],
        );
        let o = [
            (xs[2] as i64 + pads[0] + pads[2] - ((k[0] - 1) * d[0] + 1) as i64) as usize / s[0] + 1,
            (xs[3] as i64 + pads[1] + pads[3] - ((k[1] - 1) * d[1] + 1) as i64) as usize / s[1] + 1,
        ];
        let want = naive_conv(
            &x,
            &w,
            bias.then_some(&b),
            group,
            s,
            d,
            [pads[0], pads[1]],
            o,
        );
        let mut ins = vec![x, w];
        if bias {
            ins.push(b);
        }
        check_all_placements(conv.as_ref(), &ins, std::slice::from_ref(&want), 1e-4);
    }
}

/// A GPU's `conv_tiled.wgsl` reads, past a channel's 27 weights in its second step of 16, the
/// channel's last weight (clamped) and masks it to 0, and masks X there too (unmasked, image
/// 0's k = 27 would be image 1's first channel): an infinity in either place reaches only the
/// outputs it belongs to (inf x 0 would put NaN in others). 32 output channels: the tiled
/// kernel, run on lavapipe as a GPU's layout.
#[test]
fn conv_with_infinities_keeps_them_in_their_outputs() {
    let (xs, m) = ([2, 3, 6, 6], 32);
    let mut x = fill(&xs, 31);
    x.as_f32_mut().unwrap()[0] = f32::INFINITY;
    x.as_f32_mut().unwrap()[3 * 36] = f32::INFINITY;
    let mut w = fill(&[m, 3, 3, 3], 32);
    w.as_f32_mut().unwrap()[26] = f32::NEG_INFINITY;
    let conv = op("Conv", &[]);
    let want = naive_conv(&x, &w, None, 1, [1, 1], [1, 1], [0, 0], [4, 4]);
    check_all_placements(conv.as_ref(), &[x, w], std::slice::from_ref(&want), 1e-4);
}

#[test]
fn conv_gpu_auto_pad_and_1d() {
    // SAME_UPPER, stride 2, 7x6 input, 3x3 kernel: out 4x3, total pads 2 (t 1, b 1) and 1 (l 0)
    let x = fill(&[1, 2, 7, 6], 21);
    let w = fill(&[3, 2, 3, 3], 22);
    let conv = op(
        "Conv",
        &[
            ("auto_pad", AttrValue::String("SAME_UPPER".into())),
            ("strides", ints(&[2, 2])),
        ],
    );
    let want = naive_conv(&x, &w, None, 1, [2, 2], [1, 1], [1, 0], [4, 3]);
    check_all_placements(conv.as_ref(), &[x, w], std::slice::from_ref(&want), 1e-4);
    // 1-D: [N, C, L] is the 2-D case with W = 1.
    let x = fill(&[2, 4, 17], 23);
    let w = fill(&[6, 2, 3], 24);
    let conv = op(
        "Conv",
        &[
            ("group", AttrValue::Int(2)),
            ("pads", ints(&[2, 1])),
            ("dilations", ints(&[2])),
        ],
    );
    let x4 = Tensor::f32(&[2, 4, 17, 1], x.as_f32().unwrap().to_vec());
    let w4 = Tensor::f32(&[6, 2, 3, 1], w.as_f32().unwrap().to_vec());
    let want = naive_conv(&x4, &w4, None, 2, [1, 1], [2, 1], [2, 0], [16, 1]);
    let want = Tensor::f32(&[2, 6, 16], want.as_f32().unwrap().to_vec());
    check_all_placements(conv.as_ref(), &[x, w], std::slice::from_ref(&want), 1e-4);
}

// ---------------------------------------------------------------- ConvTranspose

/// ConvTranspose by scattering each input element: x [N, C, H, W], w [C, M/group, KH, KW],
/// begin pads `p`, output size `o`.
#[allow(clippy::too_many_arguments)]
fn naive_conv_transpose(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    group: usize,
    s: [usize; 2],
    d: [usize; 2],
    p: [i64; 2],
    o: [usize; 2],
) -> Tensor {
    let (xs, ws) = (&x.shape, &w.shape);
    let (n, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
    let (mg, kh, kw) = (ws[1], ws[2], ws[3]);
    let (cg, m) = (c / group, mg * group);
    let (xv, wv) = (x.as_f32().unwrap(), w.as_f32().unwrap());
    let mut out = vec![0.0; n * m * o[0] * o[1]];
    if let Some(b) = b {
        for (i, v) in out.iter_mut().enumerate() {
            *v = b.as_f32().unwrap()[(i / (o[0] * o[1])) % m];
        }
    }
    for ni in 0..n {
        for ci in 0..c {
            for ih in 0..h {
                for iw in 0..wd {
                    for ocl in 0..mg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let oh = (ih * s[0] + i * d[0]) as i64 - p[0];
                                let ow = (iw * s[1] + j * d[1]) as i64 - p[1];
                                if oh < 0 || ow < 0 || oh >= o[0] as i64 || ow >= o[1] as i64 {
                                    continue;
                                }
                                let oc = (ci / cg) * mg + ocl;
                                out[((ni * m + oc) * o[0] + oh as usize) * o[1] + ow as usize] += xv
                                    [((ni * c + ci) * h + ih) * wd + iw]
                                    * wv[((ci * mg + ocl) * kh + i) * kw + j];
                            }
                        }
                    }
                }
            }
        }
    }
    Tensor::f32(&[n, m, o[0], o[1]], out)
}

#[test]
#[allow(clippy::type_complexity)]
fn conv_transpose_gpu_matches_reference() {
    // (x shape, M/group, kernel, group, strides, dilations, pads, output_padding, bias)
    let cases: &[(
        [usize; 4],
        usize,
        [usize; 2],
        usize,
        [usize; 2],
        [usize; 2],
        [i64; 4],
        [i64; 2],
        bool,
    )] = &[
        (
            [1, 4, 5, 6],
            3,
            [3, 3],
            2,
            [2, 2],
            [1, 1],
            [1, 1, 0, 1],
            [1, 0],
            true,
        ),
        (
            [2, 3, 4, 4],
            2,
            [2, 2],
            1,
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            [0, 0],
            false,
        ),
        (
            [1, 2, 3, 5],
            4,
            [3, 2],
            1,
            [1, 3],
            [2, 1],
            [0, 2, 1, 0],
            [0, 1],
            true,
        ),
        (
            [1, 6, 7, 7],
            1,
            [3, 3],
            6,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            [0, 0],
            true,
        ),
        // lavapipe's `conv_transpose_2x2.wgsl` (the 2x2 of stride 2 above is its OCB 1): two
        // images, two groups of 6 output channels (a block of 4 and one of 2), rows of 8; with
        // an output padding it is the gather again
        (
            [2, 8, 3, 8],
            6,
            [2, 2],
            2,
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            [0, 0],
            true,
        ),
        (
            [1, 4, 3, 4],
            4,
            [2, 2],
            1,
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            true,
        ),
    ];
    for &(xs, mg, k, group, s, d, pads, op_, bias) in cases {
        let x = fill(&xs, 31);
        let w = fill(&[xs[1], mg, k[0], k[1]], 32);
        let b = fill(&[mg * group], 33);
        let ct = op(
            "ConvTranspose",
            &[
                ("group", AttrValue::Int(group as i64)),
                ("strides", ints(&[s[0] as i64, s[1] as i64])),
                ("dilations", ints(&[d[0] as i64, d[1] as i64])),
                ("pads", ints(&pads)),
                ("output_padding", ints(&op_)),
            ],
        );
        let o: Vec<usize> = (0..2)
            .map(|a| {
                (s[a] * (xs[2 + a] - 1) + (k[a] - 1) * d[a] + 1) as i64 + op_[a]
                    - pads[a]
                    - pads[a + 2]
            })
            .map(|v| v as usize)
            .collect();
        let want = naive_conv_transpose(
            &x,
            &w,
            bias.then_some(&b),
            group,
            s,
            d,
            [pads[0], pads[1]],
            [o[0], o[1]],
        );
        let mut ins = vec![x, w];
        if bias {
            ins.push(b);
        }
        check_all_placements(ct.as_ref(), &ins, std::slice::from_ref(&want), 1e-4);
    }
    // output_shape larger than the natural size (ONNX: negative end pad, zeros at the end)
    let x = fill(&[1, 1, 3, 3], 34);
    let w = fill(&[1, 2, 3, 3], 35);
    let ct = op(
        "ConvTranspose",
        &[("strides", ints(&[3, 2])), ("output_shape", ints(&[10, 8]))],
    );
    let want = naive_conv_transpose(&x, &w, None, 1, [3, 2], [1, 1], [0, 0], [10, 8]);
    check_all_placements(ct.as_ref(), &[x, w], std::slice::from_ref(&want), 1e-4);
}

/// Best-of-4 GPU time of all dispatches of `op` over all rows (inputs already resident).
fn time_gpu(op: &dyn Op, ins: &[Tensor]) -> f64 {
    let metas: Vec<_> = ins.iter().map(|t| t.meta()).collect();
    let refs: Vec<_> = metas.iter().collect();
    let outs = op.infer(&refs).unwrap();
    let rows = tandem_ops::shape::row_count(&outs[0].shape, op.split_axis(&refs, &outs));
    let kernels = op.gpu(&refs, &outs, 0..rows).unwrap();
    let g = gpu();
    let inputs: Vec<_> = ins.iter().map(|t| g.upload(t).unwrap()).collect();
    let out = g.alloc(outs[0].dtype, outs[0].numel()).unwrap();
    let mut best = f64::MAX;
    for _ in 0..4 {
        let mut batch = g.batch();
        for k in &kernels {
            let i: Vec<_> = k.inputs.iter().map(|&i| &inputs[i]).collect();
            batch.dispatch(k, &i, &[&out], 0).unwrap();
        }
        let t = std::time::Instant::now();
        batch.submit().unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// GPU throughput of the family's kernels on the adapter in use (run with
/// `cargo test --release -p tandem --test gpu_linalg -- --ignored --nocapture`).
#[test]
#[ignore]
#[allow(clippy::type_complexity)]
fn linalg_gpu_gflops() {
    println!("adapter: {:?}", gpu().adapter());
    let pads = ("pads", ints(&[1, 1, 1, 1]));
    let cases: Vec<(&str, Box<dyn Op>, Vec<Tensor>, f64)> = vec![
        (
            "matmul 512^3",
            op("MatMul", &[]),
            vec![fill(&[512, 512], 1), fill(&[512, 512], 2)],
            2.0 * 512f64.powi(3),
        ),
        (
            "matmul 128x384x1536",
            op("MatMul", &[]),
            vec![fill(&[128, 384], 1), fill(&[384, 1536], 2)],
            2.0 * 128.0 * 384.0 * 1536.0,
        ),
        (
            "conv3x3 16->16 320x320",
            op("Conv", std::slice::from_ref(&pads)),
            vec![fill(&[1, 16, 320, 320], 1), fill(&[16, 16, 3, 3], 2)],
            2.0 * 16.0 * 16.0 * 9.0 * 320.0 * 320.0,
        ),
        (
            "depthwise3x3 64 160x160",
            op("Conv", &[pads.clone(), ("group", AttrValue::Int(64))]),
            vec![fill(&[1, 64, 160, 160], 1), fill(&[64, 1, 3, 3], 2)],
            2.0 * 64.0 * 9.0 * 160.0 * 160.0,
        ),
    ];
    for (name, o, ins, flops) in &cases {
        let t = time_gpu(o.as_ref(), ins);
        println!("{name}: {:.2} GFLOP/s ({:.1} ms)", flops / t / 1e9, t * 1e3);
    }
}
