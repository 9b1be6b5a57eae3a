//! Kernel benches at shapes taken from the models, named `{placement}/{op}/{shape}`:
//! MatMul, Gemm, Conv (dense and depthwise), elementwise (Add, Relu, Sigmoid), Softmax and
//! LayerNormalization on the CPU (the op's rayon kernel on a 2-thread pool, like the model rows)
//! and on the GPU adapter (the op's WGSL kernels on pre-uploaded buffers; each iteration
//! records, submits and waits for the queue: a device sync, so GPU time is real, not enqueue
//! time).
//! Throughput is in elements = flops (or elements touched for memory-bound ops), so criterion's
//! "Gelem/s" reads as GFLOP/s. At the end, CPU MatMul 1024^3 is printed next to the machine's
//! f32 peak, the `gemm` crate and numpy's BLAS measured in the same run.
//!
//! Sits between criterion and `tandem_ops` (op registry) + `tandem::gpu` (buffers, batches).
//! `TANDEM_BENCH_GPU=0` skips the GPU half (a machine without an adapter).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use tandem::gpu::GpuTensor;
use tandem_ops::{registry, AttrValue, Attrs, Op, Tensor, TensorMeta};

const THREADS: usize = 2;

fn fill(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + seed) % 23) as f32 / 23.0 - 0.5)
        .collect()
}

fn t(shape: &[usize], seed: usize) -> Tensor {
    Tensor::f32(shape, fill(shape.iter().product(), seed))
}

/// One benchmarked case: op, inputs, and the work one run does (flops or elements).
struct Case {
    op: &'static str,
    shape: &'static str,
    built: Box<dyn Op>,
    inputs: Vec<Tensor>,
    work: u64,
}

fn case(
    op: &'static str,
    shape: &'static str,
    attrs: &[(&str, AttrValue)],
    inputs: Vec<Tensor>,
    work: u64,
) -> Case {
    let mut a = Attrs::new(17);
    for (k, v) in attrs {
        a = a.with(k, v.clone());
    }
    Case {
        op,
        shape,
        built: registry::build(op, &a).unwrap_or_else(|e| panic!("{op}: {e}")),
        inputs,
        work,
    }
}

/// A depthwise Conv (`group` = channels) over `c` square planes of side `h`, kernel `k`,
/// stride `s`, "same" pads.
fn depthwise(shape: &'static str, c: usize, h: usize, k: usize, s: usize) -> Case {
    let p = k / 2;
    let o = (h + 2 * p - k) / s + 1;
    case(
        "Conv",
        shape,
        &[
            ("strides", AttrValue::Ints(vec![s as i64; 2])),
            ("pads", AttrValue::Ints(vec![p as i64; 4])),
            ("group", AttrValue::Int(c as i64)),
        ],
        vec![t(&[1, c, h, h], 0), t(&[c, 1, k, k], 3)],
        (2 * c * o * o * k * k) as u64,
    )
}

fn cases() -> Vec<Case> {
    let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
    vec![
        // MatMul: square reference, MiniLM attention scores (12 heads, 128 tokens, 32 dims), MiniLM FFN
        case(
            "MatMul",
            "1024x1024x1024",
            &[],
            vec![t(&[1024, 1024], 0), t(&[1024, 1024], 3)],
            2 * 1024 * 1024 * 1024,
        ),
        case(
            "MatMul",
            "12x128x32x128",
            &[],
            vec![t(&[12, 128, 32], 0), t(&[12, 32, 128], 3)],
            2 * 12 * 128 * 32 * 128,
        ),
        case(
            "MatMul",
            "128x384x1536",
            &[],
            vec![t(&[128, 384], 0), t(&[384, 1536], 3)],
            2 * 128 * 384 * 1536,
        ),
        // Gemm: resnet50 classifier, vgg19 fc7 (transB like the models)
        case(
            "Gemm",
            "1x2048x1000",
            &[("transB", AttrValue::Int(1))],
            vec![t(&[1, 2048], 0), t(&[1000, 2048], 3), t(&[1000], 5)],
            2 * 2048 * 1000,
        ),
        case(
            "Gemm",
            "1x4096x4096",
            &[("transB", AttrValue::Int(1))],
            vec![t(&[1, 4096], 0), t(&[4096, 4096], 3), t(&[4096], 5)],
            2 * 4096 * 4096,
        ),
        // Conv: resnet50 stem, resnet50 3x3 block, resnet50 1x1 reduce
        case(
            "Conv",
            "3to64_k7s2_224",
            &[("strides", ints(&[2, 2])), ("pads", ints(&[3, 3, 3, 3]))],
            vec![t(&[1, 3, 224, 224], 0), t(&[64, 3, 7, 7], 3)],
            2 * 64 * 112 * 112 * 3 * 49,
        ),
        case(
            "Conv",
            "64to64_k3_56",
            &[("pads", ints(&[1, 1, 1, 1]))],
            vec![t(&[1, 64, 56, 56], 0), t(&[64, 64, 3, 3], 3)],
            2 * 64 * 56 * 56 * 64 * 9,
        ),
        case(
            "Conv",
            "256to64_k1_56",
            &[],
            vec![t(&[1, 256, 56, 56], 0), t(&[64, 256, 1, 1], 3)],
            2 * 64 * 56 * 56 * 256,
        ),
        // Depthwise: shufflenet's 3x3 on 14x14 and 7x7 and its 3x3/2 on 56x56, ppocr_det's 5x5
        depthwise("dw272_k3_14", 272, 14, 3, 1),
        depthwise("dw544_k3_7", 544, 7, 3, 1),
        depthwise("dw112_k3s2_56", 112, 56, 3, 2),
        depthwise("dw384_k5_20", 384, 20, 5, 1),
        // elementwise at resnet's first activation size
        case(
            "Add",
            "1x64x112x112",
            &[],
            vec![t(&[1, 64, 112, 112], 0), t(&[1, 64, 112, 112], 3)],
            64 * 112 * 112,
        ),
        case(
            "Relu",
            "1x64x112x112",
            &[],
            vec![t(&[1, 64, 112, 112], 0)],
            64 * 112 * 112,
        ),
        case(
            "Sigmoid",
            "1x64x112x112",
            &[],
            vec![t(&[1, 64, 112, 112], 0)],
            64 * 112 * 112,
        ),
        // MiniLM attention softmax and LayerNorm
        case(
            "Softmax",
            "12x128x128",
            &[("axis", AttrValue::Int(-1))],
            vec![t(&[1, 12, 128, 128], 0)],
            12 * 128 * 128,
        ),
        case(
            "LayerNormalization",
            "128x384",
            &[("axis", AttrValue::Int(-1))],
            vec![t(&[1, 128, 384], 0), t(&[384], 3), t(&[384], 5)],
            128 * 384,
        ),
    ]
}

fn outputs(c: &Case) -> (Vec<TensorMeta>, Vec<TensorMeta>, usize) {
    let metas = tandem::testing::const_metas(&c.inputs);
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let outs = c
        .built
        .infer(&refs)
        .unwrap_or_else(|e| panic!("{}: {e}", c.op));
    let rows = tandem_ops::shape::row_count(&outs[0].shape, c.built.split_axis(&refs, &outs));
    (metas, outs, rows)
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(300));
    g.measurement_time(Duration::from_secs(1));
    g
}

fn cpu(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(THREADS)
        .build()
        .unwrap();
    let mut g = group(c, "cpu");
    for k in cases() {
        let (_, outs, rows) = outputs(&k);
        let refs: Vec<&Tensor> = k.inputs.iter().collect();
        let mut out: Vec<Tensor> = outs
            .iter()
            .map(|m| Tensor::zeros(m.dtype, &m.shape))
            .collect();
        g.throughput(Throughput::Elements(k.work));
        g.bench_function(format!("{}/{}", k.op, k.shape), |b| {
            pool.install(|| b.iter(|| k.built.cpu(&refs, black_box(&mut out), 0..rows).unwrap()))
        });
    }
    g.finish();
}

fn gpu(c: &mut Criterion) {
    if std::env::var("TANDEM_BENCH_GPU").is_ok_and(|v| v == "0") {
        return;
    }
    let gpu = tandem::testing::gpu();
    let mut g = group(c, "gpu");
    for k in cases() {
        let (metas, outs, rows) = outputs(&k);
        let mrefs: Vec<&TensorMeta> = metas.iter().collect();
        let kernels = match k.built.gpu(&mrefs, &outs, 0..rows) {
            Ok(ks) => ks,
            Err(e) => {
                eprintln!("gpu/{}/{}: no GPU kernel: {e}", k.op, k.shape);
                continue;
            }
        };
        let ins: Vec<GpuTensor> = k
            .inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if kernels.iter().any(|kr| kr.inputs.contains(&i)) {
                    gpu.upload(t)
                } else {
                    gpu.alloc(t.dtype(), 0)
                }
            })
            .collect::<tandem::Result<_>>()
            .expect("upload");
        let outs_g: Vec<GpuTensor> = outs
            .iter()
            .map(|m| gpu.alloc(m.dtype, m.numel()))
            .collect::<tandem::Result<_>>()
            .expect("alloc");
        g.throughput(Throughput::Elements(k.work));
        g.bench_function(format!("{}/{}", k.op, k.shape), |b| {
            b.iter(|| {
                let mut batch = gpu.batch();
                for kr in &kernels {
                    let i: Vec<&GpuTensor> = kr.inputs.iter().map(|&i| &ins[i]).collect();
                    let o: Vec<&GpuTensor> = kr.outputs.iter().map(|&o| &outs_g[o]).collect();
                    batch.dispatch(kr, &i, &o, 0).expect("dispatch");
                }
                batch.submit().expect("submit").wait().expect("wait")
            })
        });
    }
    g.finish();
}

/// CPU MatMul 1024^3 next to the f32 peak and the other GEMMs (printed, not a criterion id).
fn gemm_vs_peak(_: &mut Criterion) {
    let r = tandem_bench::gemm::measure(1024, THREADS, 1.0);
    let p = &r.peak;
    println!(
        "\nCPU GEMM {} f32, {} threads; f32 peak {:.0} GFLOP/s = {} cores x {:.2} GHz (measured; /proc/cpuinfo {:?}) x {} lanes x {} FMA pipes (measured) x 2",
        r.shape, r.threads, p.gflops, p.cores, p.clock_ghz, p.cpuinfo_ghz, p.lanes, p.fma_units
    );
    for (name, v) in &r.gflops {
        println!(
            "  {name:<48} {v:>7.1} GFLOP/s  {:>4.0}% of peak",
            100.0 * v / p.gflops
        );
    }
}

criterion_group!(benches, cpu, gpu, gemm_vs_peak);
criterion_main!(benches);
