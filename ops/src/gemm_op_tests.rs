//! Gemm against a naive loop (transposes, C broadcasts, row ranges), and an ignored speed probe.

use super::*;
use crate::AttrValue;

fn fill(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as u32 * 7 + seed * 13) % 23) as f32 / 11.0 - 1.0)
        .collect()
}

/// Y[i][j] = alpha * sum_p A'[i][p] B'[p][j] + beta * C[i or 0][j or 0], transposes by index,
/// summed in f64; with each element the error an f32 evaluation may make (1e-5 of the sum of
/// the terms' magnitudes).
#[allow(clippy::too_many_arguments)]
fn naive(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    c: Option<(&[f32], &[usize])>,
    ta: bool,
    tb: bool,
    alpha: f32,
    beta: f32,
) -> Vec<(f32, f32)> {
    let mut y = vec![(0.0, 0.0); m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut mag) = (0.0f64, 0.0f64);
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                s += av as f64 * bv as f64;
                mag += (av as f64 * bv as f64).abs();
            }
            let cv = match c {
                None => 0.0,
                Some((c, []) | (c, [1])) => c[0],
                Some((c, [cn])) => c[if *cn == 1 { 0 } else { j }],
                Some((c, [cm, cn])) => {
                    c[(if *cm == 1 { 0 } else { i }) * cn + if *cn == 1 { 0 } else { j }]
                }
                _ => unreachable!(),
            } as f64;
            let (alpha, beta) = (alpha as f64, beta as f64);
            let v = alpha * s + beta * cv;
            let tol = 1e-5 * (alpha.abs() * mag + (beta * cv).abs()) + 1e-6;
            y[i * n + j] = (v as f32, tol as f32);
        }
    }
    y
}

/// One Gemm (A [m, k] or [k, m], B [k, n] or [n, k], C of `cshape`) through `Op::cpu` over the
/// row ranges `cuts` splits M into, on the current rayon pool, against [`naive`]; the output
/// starts as NaN, so rows left unwritten or a `beta = 0` that reads C fail.
#[allow(clippy::too_many_arguments)]
fn check(
    (m, n, k): (usize, usize, usize),
    (ta, tb): (bool, bool),
    cshape: Option<&[usize]>,
    (alpha, beta): (f32, f32),
    cuts: &[usize],
) {
    let attrs = Attrs::new(13)
        .with("alpha", AttrValue::Float(alpha))
        .with("beta", AttrValue::Float(beta))
        .with("transA", AttrValue::Int(ta as i64))
        .with("transB", AttrValue::Int(tb as i64));
    let op = gemm(&attrs).unwrap();
    let sa = if ta { [k, m] } else { [m, k] };
    let a = Tensor::f32(&sa, fill(m * k, 1));
    let sb = if tb { [n, k] } else { [k, n] };
    let b = Tensor::f32(&sb, fill(k * n, 2));
    let mut ins = vec![a.clone(), b.clone()];
    if let Some(cs) = cshape {
        ins.push(Tensor::f32(cs, fill(cs.iter().product(), 3)));
    }
    let want = naive(
        m,
        n,
        k,
        a.as_f32().unwrap(),
        b.as_f32().unwrap(),
        cshape.map(|s| (ins[2].as_f32().unwrap(), s)),
        ta,
        tb,
        alpha,
        beta,
    );
    let refs: Vec<&Tensor> = ins.iter().collect();
    let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
    let mrefs: Vec<&TensorMeta> = metas.iter().collect();
    assert_eq!(op.infer(&mrefs).unwrap()[0].shape, vec![m, n]);
    let mut out = vec![Tensor::f32(&[m, n], vec![f32::NAN; m * n])];
    for w in cuts.windows(2) {
        op.cpu(&refs, &mut out, w[0]..w[1]).unwrap();
    }
    for (idx, (g, (w, tol))) in out[0].as_f32().unwrap().iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= *tol,
            "{m}x{n}x{k} ta {ta} tb {tb} c {cshape:?} alpha {alpha} beta {beta} cuts {cuts:?} \
             [{}, {}]: {g} vs {w}",
            idx / n,
            idx % n
        );
    }
}

#[test]
fn gemm_matches_reference_for_transposes_and_c_broadcasts() {
    let (m, n, k) = (5, 7, 3);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        for cshape in [
            None,
            Some(vec![]),
            Some(vec![n]),
            Some(vec![m, 1]),
            Some(vec![m, n]),
        ] {
            check(
                (m, n, k),
                (ta, tb),
                cshape.as_deref(),
                (0.5, 2.0),
                &[0, 2, m],
            );
        }
    }
}

/// The shapes of the dot-product path for a transposed B (`cpu_gemm`'s small-M route): M of
/// 1, 3, 16 and 64 (and 65, past it), N that leaves 1-3 columns after tiles of 4 and blocks of
/// 64, K below the 16 lanes, with a tail, and past the 1024-deep K block (blocked once A passes
/// 2^16 elements); on a 2-thread pool
/// (the larger products split over column blocks) and row ranges that cut M off the tiles.
#[test]
fn gemm_trans_b_small_m_matches_reference() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let cases: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (1, 37, 1031),
        (1, 1000, 544),
        (3, 13, 15),
        (3, 6, 2049),
        (16, 131, 1031),
        (16, 64, 16),
        (64, 70, 33),
        (64, 70, 1100),
        (65, 9, 100),
    ];
    pool.install(|| {
        for &(m, n, k) in cases {
            let cuts: Vec<usize> = if m > 2 {
                vec![0, 1, m / 2 + 1, m]
            } else {
                vec![0, m]
            };
            for ta in [false, true] {
                let cshapes = [None, Some(vec![n]), Some(vec![m, 1]), Some(vec![m, n])];
                for cshape in cshapes {
                    check((m, n, k), (ta, true), cshape.as_deref(), (0.5, 2.0), &cuts);
                }
            }
            // beta = 0 ignores C (and the NaN the output starts as); alpha 1, whole M.
            check((m, n, k), (false, true), Some(&[n]), (1.0, 0.0), &[0, m]);
            // transB = 0 at the same small M (the gemm crate's path) for comparison.
            check((m, n, k), (false, false), Some(&[n]), (0.5, 2.0), &cuts);
        }
    });
}

/// A transposed weight with padded rows gives the unpadded result on the dot-product tiles
/// (16 rows) and on the crate (70 rows), over row ranges; the padding holds NaN, so reading it
/// fails. The rule pads only K >= 256 in whole even cache lines and 16 or more (or unknown)
/// rows.
#[test]
fn padded_weight_rows_give_the_unpadded_product() {
    let op = Gemm {
        alpha: 0.5,
        beta: 2.0,
        trans_a: false,
        trans_b: true,
        b_row_pad: 0,
    };
    for (m, n, k) in [(16, 9, 256), (70, 40, 512)] {
        let a = Tensor::f32(&[m, k], fill(m * k, 1));
        let b = Tensor::f32(&[n, k], fill(n * k, 2));
        let c = Tensor::f32(&[n], fill(n, 3));
        let (padded, mut pb) = op.with_padded_weight(Some(&[m, k]), &b).unwrap();
        assert_eq!(pb.shape, vec![n, k + ROW_PAD]);
        for row in pb.as_f32_mut().unwrap().chunks_exact_mut(k + ROW_PAD) {
            row[k..].fill(f32::NAN);
        }
        let metas = [a.meta(), pb.meta(), c.meta()];
        let mrefs: Vec<&TensorMeta> = metas.iter().collect();
        assert_eq!(padded.infer(&mrefs).unwrap()[0].shape, vec![m, n]);
        let mut out = vec![Tensor::f32(&[m, n], vec![f32::NAN; m * n])];
        for r in [0..1, 1..m / 2, m / 2..m] {
            padded.cpu(&[&a, &pb, &c], &mut out, r).unwrap();
        }
        let (ad, bd) = (a.as_f32().unwrap(), b.as_f32().unwrap());
        let want = naive(
            m,
            n,
            k,
            ad,
            bd,
            Some((c.as_f32().unwrap(), &[n])),
            false,
            true,
            0.5,
            2.0,
        );
        for (g, (w, tol)) in out[0].as_f32().unwrap().iter().zip(&want) {
            assert!((g - w).abs() <= *tol, "{m}x{n}x{k}: {g} vs {w}");
        }
    }
    let b = Tensor::f32(&[8, 512], fill(8 * 512, 2));
    assert!(op.with_padded_weight(None, &b).is_some());
    assert!(op.with_padded_weight(Some(&[8, 512]), &b).is_none());
    let odd_k = Tensor::f32(&[8, 496], fill(8 * 496, 2));
    assert!(op.with_padded_weight(None, &odd_k).is_none());
    let not_transposed = Gemm {
        trans_b: false,
        ..op.clone()
    };
    assert!(not_transposed.with_padded_weight(None, &b).is_none());
}

#[test]
fn bad_c_is_invalid() {
    let op = gemm(&Attrs::new(13)).unwrap();
    let a = TensorMeta::new(DType::F32, vec![2, 3]);
    let b = TensorMeta::new(DType::F32, vec![3, 4]);
    let c = TensorMeta::new(DType::F32, vec![3, 4]);
    assert!(matches!(op.infer(&[&a, &b, &c]), Err(OpError::Invalid(_))));
    assert!(gemm(&Attrs::new(13).with("transA", AttrValue::Int(2))).is_err());
}

/// Speed of Gemm through the op (C of shape [N], alpha = beta = 1), transB 0 against 1, on 1 and
/// 2 rayon threads, for small M and the vision models' FC layers (not a test:
/// `cargo test --release -p tandem-ops --lib gemm_speed -- --ignored --nocapture`;
/// `GEMM_SPEED=fc` or `=grid` runs one half; `GEMM_SPEED_M`, `GEMM_SPEED_KN` set the grid, e.g.
/// `1,4,16`).
#[test]
#[ignore]
fn gemm_speed() {
    let which = std::env::var("GEMM_SPEED").unwrap_or_default();
    if let Ok(v) = std::env::var("GEMM_RHS_PACK") {
        gemm_common::gemm::set_rhs_packing_threshold(v.parse().unwrap());
    }
    let mut shapes: Vec<(usize, usize, usize)> = Vec::new();
    if which != "fc" {
        let ms: Vec<usize> = match std::env::var("GEMM_SPEED_M") {
            Ok(v) => v.split(',').map(|x| x.parse().unwrap()).collect(),
            Err(_) => vec![1, 4, 16, 64, 128],
        };
        let kns: Vec<usize> = match std::env::var("GEMM_SPEED_KN") {
            Ok(v) => v.split(',').map(|x| x.parse().unwrap()).collect(),
            Err(_) => vec![512, 1024, 4096],
        };
        for &kn in &kns {
            for &m in &ms {
                shapes.push((m, kn, kn));
            }
        }
    }
    if which != "grid" {
        // (M, K, N) of the FC layers: vgg19, zfnet512, alexnet, resnet50, inception, shufflenet.
        shapes.extend([
            (1, 25088, 4096),
            (1, 18432, 4096),
            (1, 9216, 4096),
            (1, 4096, 4096),
            (1, 4096, 1024),
            (1, 4096, 1000),
            (1, 2048, 1000),
            (1, 1024, 1000),
            (1, 544, 1000),
        ]);
    }
    let pools: Vec<rayon::ThreadPool> = [1, 2]
        .iter()
        .map(|&t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        })
        .collect();
    for (m, k, n) in shapes {
        let a = Tensor::f32(&[m, k], fill(m * k, 1));
        let c = Tensor::f32(&[n], fill(n, 3));
        let bdata = fill(k * n, 2);
        let mut line = format!("M {m:4} K {k:5} N {n:5}");
        let flops = 2.0 * (m * k * n) as f64;
        for tb in [false, true] {
            let op = gemm(&Attrs::new(13).with("transB", AttrValue::Int(tb as i64))).unwrap();
            let b = Tensor::f32(&if tb { [n, k] } else { [k, n] }, bdata.clone());
            let ins = [&a, &b, &c];
            let mut out = vec![Tensor::zeros(DType::F32, &[m, n])];
            for pool in &pools {
                // Best of as many runs as fit in ~0.25 s (at least 3, after one warm-up).
                let mut best = f64::MAX;
                let (mut reps, start) = (0, std::time::Instant::now());
                while reps < 4 || (start.elapsed().as_secs_f64() < 0.25 && reps < 200) {
                    let t = std::time::Instant::now();
                    pool.install(|| op.cpu(&ins, &mut out, 0..m).unwrap());
                    let e = t.elapsed().as_secs_f64();
                    best = if reps == 0 { best } else { best.min(e) };
                    reps += 1;
                }
                line += &format!(
                    " | tB{} t{} {:9.1} us {:5.0} GF/s",
                    tb as u8,
                    pool.current_num_threads(),
                    best * 1e6,
                    flops / best / 1e9
                );
            }
        }
        println!("{line}");
    }
}
