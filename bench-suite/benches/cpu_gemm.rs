//! CPU GEMM benchmarks: the shared `sgemm` (gemm crate) against a hand-written packed AVX2/FMA
//! 6x16 micro-kernel, at 1024^3 and the model-like shapes, on 1 and 2 rayon threads; plus
//! MatMul (attention heads), Gemm transB=1 at small M (linear layers) and Conv ops end to end.
//! Names: `cpu/{impl}/{shape}/t{threads}`.
//! Throughput is reported in elements = flops, so criterion's "Gelem/s" reads as GFLOP/s.
//!
//! Sits between criterion and `tandem_ops` (`cpu_gemm`, `matmul`, `conv`); the numbers feed
//! the decision documented in `ops/src/cpu_gemm.rs`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use tandem_ops::cpu_gemm::{sgemm, MatMut, MatRef, Threads};
use tandem_ops::{registry, AttrValue, Attrs, DType, Tensor};

fn fill(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 % 23) as f32) / 23.0 - 0.5)
        .collect()
}

/// The alternative to the gemm crate: B packed in 16-column panels, A packed in 6-row slivers,
/// a 6x16 register tile (12 ymm accumulators) with AVX2 + FMA, K blocked by 256, rayon over
/// blocks of 72 rows of C.
mod own {
    use rayon::prelude::*;
    const MR: usize = 6;
    const NR: usize = 16;
    const KC: usize = 256;
    const MC: usize = 72;

    /// C (m x n, row-major) = A (m x k) * B (k x n), both row-major.
    pub fn sgemm(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
        assert_eq!(c.len(), m * n);
        assert!(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
        let panels = n.div_ceil(NR);
        let mut bp = vec![0.0f32; panels * KC * NR];
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            // pack B[pc..pc+kc, :] into panels of kc x NR (zero padded)
            bp.par_chunks_mut(KC * NR)
                .enumerate()
                .for_each(|(jp, panel)| {
                    for p in 0..kc {
                        for j in 0..NR {
                            let col = jp * NR + j;
                            panel[p * NR + j] = if col < n { b[(pc + p) * n + col] } else { 0.0 };
                        }
                    }
                });
            let bp = &bp;
            c.par_chunks_mut(MC * n).enumerate().for_each(|(ib, cblk)| {
                let rows = cblk.len() / n;
                let mut ap = [0.0f32; MR * KC];
                let mut tmp = [0.0f32; MR * NR];
                for ir in (0..rows).step_by(MR) {
                    let mr = MR.min(rows - ir);
                    for p in 0..kc {
                        for i in 0..MR {
                            ap[p * MR + i] = if i < mr {
                                a[(ib * MC + ir + i) * k + pc + p]
                            } else {
                                0.0
                            };
                        }
                    }
                    for jp in 0..panels {
                        let nr = NR.min(n - jp * NR);
                        // SAFETY: AVX2/FMA checked above; ap, panel and tmp hold kc*MR,
                        // kc*NR and MR*NR floats.
                        unsafe { kernel(kc, ap.as_ptr(), bp[jp * KC * NR..].as_ptr(), &mut tmp) };
                        for i in 0..mr {
                            let row = &mut cblk[(ir + i) * n + jp * NR..][..nr];
                            for j in 0..nr {
                                if pc == 0 {
                                    row[j] = tmp[i * NR + j];
                                } else {
                                    row[j] += tmp[i * NR + j];
                                }
                            }
                        }
                    }
                }
            });
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel(kc: usize, ap: *const f32, bp: *const f32, out: &mut [f32; MR * NR]) {
        use std::arch::x86_64::*;
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for p in 0..kc {
            let b0 = _mm256_loadu_ps(bp.add(p * NR));
            let b1 = _mm256_loadu_ps(bp.add(p * NR + 8));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(p * MR + i));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
        }
        for (i, row) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(i * NR), row[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(i * NR + 8), row[1]);
        }
    }
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

fn gemm_shapes(c: &mut Criterion) {
    let shapes = [(1024, 1024, 1024), (128, 384, 384), (128, 384, 1536)];
    let mut g = c.benchmark_group("cpu");
    g.sample_size(10);
    g.warm_up_time(std::time::Duration::from_millis(500));
    g.measurement_time(std::time::Duration::from_secs(2));
    for &(m, k, n) in &shapes {
        let (a, b) = (fill(m * k), fill(k * n));
        let mut cm = vec![0.0f32; m * n];
        // correctness of the alternative against the crate before timing it
        let mut want = vec![0.0f32; m * n];
        sgemm(
            m,
            n,
            k,
            1.0,
            MatRef::row_major(&a, 0, k),
            MatRef::row_major(&b, 0, n),
            0.0,
            MatMut::row_major(&mut want, 0, n),
            Threads::Pool,
        );
        own::sgemm(m, n, k, &a, &b, &mut cm);
        let err = cm
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(err < 1e-2, "own kernel differs from gemm crate by {err}");
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        for t in [1, 2] {
            let p = pool(t);
            let shape = format!("{m}x{k}x{n}/t{t}");
            g.bench_function(format!("gemm_crate/{shape}"), |bch| {
                p.install(|| {
                    bch.iter(|| {
                        sgemm(
                            m,
                            n,
                            k,
                            1.0,
                            MatRef::row_major(&a, 0, k),
                            MatRef::row_major(&b, 0, n),
                            0.0,
                            MatMut::row_major(&mut cm, 0, n),
                            Threads::Pool,
                        );
                        black_box(&cm);
                    })
                })
            });
            g.bench_function(format!("own_6x16/{shape}"), |bch| {
                p.install(|| bch.iter(|| own::sgemm(m, n, k, &a, &b, black_box(&mut cm))))
            });
        }
    }
    g.finish();
}

#[allow(clippy::type_complexity)]
fn ops(c: &mut Criterion) {
    let mut g = c.benchmark_group("cpu");
    g.sample_size(10);
    g.warm_up_time(std::time::Duration::from_millis(500));
    g.measurement_time(std::time::Duration::from_secs(2));
    let attrs = |v: &[(&str, AttrValue)]| {
        let mut a = Attrs::new(17);
        for (k, x) in v {
            a = a.with(k, x.clone());
        }
        a
    };
    // (name, op, inputs, flops)
    let cases: Vec<(&str, Box<dyn tandem_ops::Op>, Vec<Tensor>, u64)> = vec![
        (
            "matmul_attn_12x128x64x128",
            registry::build("MatMul", &attrs(&[])).unwrap(),
            vec![
                Tensor::f32(&[12, 128, 64], fill(12 * 128 * 64)),
                Tensor::f32(&[12, 64, 128], fill(12 * 64 * 128)),
            ],
            2 * 12 * 128 * 64 * 128,
        ),
        (
            // A linear layer at small batch (weight stored [N, K]): cpu_gemm_dot.rs's tiles.
            "gemm_transb_16x1024x1024",
            registry::build("Gemm", &attrs(&[("transB", AttrValue::Int(1))])).unwrap(),
            vec![
                Tensor::f32(&[16, 1024], fill(16 * 1024)),
                Tensor::f32(&[1024, 1024], fill(1024 * 1024)),
                Tensor::f32(&[1024], fill(1024)),
            ],
            2 * 16 * 1024 * 1024,
        ),
        (
            "gemm_transb_1x4096x4096",
            registry::build("Gemm", &attrs(&[("transB", AttrValue::Int(1))])).unwrap(),
            vec![
                Tensor::f32(&[1, 4096], fill(4096)),
                Tensor::f32(&[4096, 4096], fill(4096 * 4096)),
                Tensor::f32(&[4096], fill(4096)),
            ],
            2 * 4096 * 4096,
        ),
        (
            "conv3x3_16to16_640x640",
            registry::build(
                "Conv",
                &attrs(&[("pads", AttrValue::Ints(vec![1, 1, 1, 1]))]),
            )
            .unwrap(),
            vec![
                Tensor::f32(&[1, 16, 640, 640], fill(16 * 640 * 640)),
                Tensor::f32(&[16, 16, 3, 3], fill(16 * 16 * 9)),
            ],
            2 * 16 * 640 * 640 * 16 * 9,
        ),
        (
            "conv1x1_64to64_160x160",
            registry::build("Conv", &attrs(&[])).unwrap(),
            vec![
                Tensor::f32(&[1, 64, 160, 160], fill(64 * 160 * 160)),
                Tensor::f32(&[64, 64, 1, 1], fill(64 * 64)),
            ],
            2 * 64 * 160 * 160 * 64,
        ),
        (
            "depthwise3x3_64_160x160",
            registry::build(
                "Conv",
                &attrs(&[
                    ("group", AttrValue::Int(64)),
                    ("pads", AttrValue::Ints(vec![1, 1, 1, 1])),
                ]),
            )
            .unwrap(),
            vec![
                Tensor::f32(&[1, 64, 160, 160], fill(64 * 160 * 160)),
                Tensor::f32(&[64, 1, 3, 3], fill(64 * 9)),
            ],
            2 * 64 * 160 * 160 * 9,
        ),
    ];
    for (name, op, ins, flops) in &cases {
        let metas: Vec<_> = ins.iter().map(|t| t.meta()).collect();
        let mrefs: Vec<_> = metas.iter().collect();
        let outs = op.infer(&mrefs).unwrap();
        let rows = tandem_ops::shape::row_count(&outs[0].shape, op.split_axis(&mrefs, &outs));
        let refs: Vec<&Tensor> = ins.iter().collect();
        let mut out = vec![Tensor::zeros(DType::F32, &outs[0].shape)];
        g.throughput(Throughput::Elements(*flops));
        for t in [1, 2] {
            let p = pool(t);
            g.bench_function(format!("op/{name}/t{t}"), |bch| {
                p.install(|| bch.iter(|| op.cpu(&refs, black_box(&mut out), 0..rows).unwrap()))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, gemm_shapes, ops);
criterion_main!(benches);
