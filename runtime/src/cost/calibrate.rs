//! Calibration: micro-benchmarks of real operators (built through the registry with real
//! attributes, at shapes taken from the models tandem runs) on the CPU (the current rayon pool)
//! and the GPU (timestamp queries), within a time budget; link and sync costs; a held-out
//! accuracy report.
//!
//! Sits between the operators (`tandem_ops::registry`), the GPU layer (`gpu.rs`) and the cost
//! model (`cost/mod.rs`), which it fills with samples and priors.

use super::{
    device_rank, fit, keys, median, rank_device, CostModel, EntryKey, Line, Links, Roofline, Sample,
};
use crate::gpu::{Gpu, GpuTensor};
use crate::plan::Device;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use tandem_ops::shape::row_count;
use tandem_ops::{registry, AttrValue, Attrs, DType, Op, Tensor, TensorMeta};

/// What to calibrate and for how long.
#[derive(Debug, Clone)]
pub struct CalibrationOptions {
    /// Wall-clock budget for all measurements (default 60 s). Benchmarks run smallest shapes
    /// first, round-robin over op kinds, and stop when the budget is spent.
    pub budget: Duration,
    /// Only these op kinds (None: all of the suite).
    pub ops: Option<Vec<String>>,
    /// Measure the CPU (current rayon pool) and the GPU (when one is given).
    pub cpu: bool,
    pub gpu: bool,
}

impl Default for CalibrationOptions {
    fn default() -> CalibrationOptions {
        CalibrationOptions {
            budget: Duration::from_secs(60),
            ops: None,
            cpu: true,
            gpu: true,
        }
    }
}

impl CalibrationOptions {
    /// About 5 s over a reduced suite (for tests).
    pub fn quick() -> CalibrationOptions {
        CalibrationOptions {
            budget: Duration::from_secs(5),
            ops: Some(
                ["MatMul", "Conv", "Add", "Relu", "Softmax", "Transpose"]
                    .map(String::from)
                    .to_vec(),
            ),
            ..Default::default()
        }
    }
}

/// Where calibration is, for a progress display.
#[derive(Debug, Clone)]
pub struct Progress {
    pub elapsed: Duration,
    pub budget: Duration,
    /// Measurements done and planned (planned ones may be skipped when the budget runs out).
    pub done: usize,
    pub planned: usize,
    /// What was just measured, e.g. "MatMul [128, 128] x [128, 128] on gpu".
    pub what: String,
}

/// Held-out accuracy of one (op kind, device): predictions of a model fitted without these
/// shapes against their measured times.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldOut {
    pub op: String,
    pub device: Device,
    pub count: usize,
    /// Share of held-out predictions within +-10% of the measured time.
    pub within_10: f64,
    /// Median of |predicted - measured| / measured.
    pub median_rel_err: f64,
}

/// What calibration measured and how well the fit predicts shapes it did not see.
#[derive(Debug, Clone)]
pub struct CalibrationReport {
    pub held_out: Vec<HeldOut>,
    /// Share of all held-out predictions within +-10%.
    pub overall_within_10: f64,
    pub samples: usize,
    pub elapsed: Duration,
    pub links: Option<Links>,
    /// Why GPU measurements stopped, if they failed.
    pub gpu_error: Option<String>,
}

impl std::fmt::Display for CalibrationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{:<22} {:<6} {:>5} {:>8} {:>11}",
            "op", "device", "n", "+-10%", "median err"
        )?;
        for h in &self.held_out {
            writeln!(
                f,
                "{:<22} {:<6} {:>5} {:>7.0}% {:>10.1}%",
                h.op,
                h.device.to_string(),
                h.count,
                h.within_10 * 100.0,
                h.median_rel_err * 100.0
            )?;
        }
        if let Some(l) = &self.links {
            writeln!(
                f,
                "links: upload {:.1} us + {:.2} GB/s, download {:.1} us + {:.2} GB/s, sync {:.1} us",
                l.upload.latency * 1e6,
                1e-9 / l.upload.seconds_per_byte.max(1e-30),
                l.download.latency * 1e6,
                1e-9 / l.download.seconds_per_byte.max(1e-30),
                l.sync * 1e6
            )?;
        }
        if let Some(e) = &self.gpu_error {
            writeln!(f, "GPU measurements stopped: {e}")?;
        }
        write!(
            f,
            "overall: {:.0}% of held-out predictions within +-10% ({} samples in {:.1} s)",
            self.overall_within_10 * 100.0,
            self.samples,
            self.elapsed.as_secs_f64()
        )
    }
}

/// One input of a benchmark.
#[derive(Debug, Clone)]
enum Input {
    /// Pseudo-random f32 in [-1, 1).
    Rand(Vec<usize>),
    /// i64 indices in `0..max`.
    Indices(Vec<usize>, i64),
    F32(Vec<usize>, Vec<f32>),
    I64(Vec<usize>, Vec<i64>),
    /// An omitted optional input (empty f32 constant).
    Omitted,
}

/// One op kind with its attributes and shapes (ascending size).
struct Bench {
    op: &'static str,
    attrs: Attrs,
    shapes: Vec<Vec<Input>>,
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

/// Element counts for elementwise and data movement benchmarks, as [rows, 256].
const ELEMS: [usize; 12] = [
    1 << 10,
    1 << 12,
    1 << 13,
    1 << 14,
    1 << 15,
    3 << 14,
    1 << 16,
    1 << 17,
    3 << 16,
    1 << 18,
    1 << 19,
    1 << 20,
];

fn suite() -> Vec<Bench> {
    use Input::*;
    let rows = |n: usize| vec![n / 256, 256];
    let mut v = Vec::new();
    let mm = [
        (16, 16, 16),
        (32, 64, 32),
        (64, 64, 64),
        (128, 64, 96),
        (128, 128, 128),
        (192, 256, 128),
        (256, 256, 256),
        (384, 256, 384),
        (256, 512, 384),
        (1, 768, 768),
        (512, 256, 512),
        (512, 512, 512),
    ];
    v.push(Bench {
        op: "MatMul",
        attrs: Attrs::new(17),
        shapes: mm
            .iter()
            .map(|&(m, k, n)| vec![Rand(vec![m, k]), Rand(vec![k, n])])
            .collect(),
    });
    let gemm = [
        (1, 256, 128),
        (8, 256, 256),
        (32, 256, 256),
        (1, 1024, 512),
        (64, 512, 256),
        (128, 512, 256),
        (128, 512, 512),
        (256, 512, 512),
        (1, 2048, 1000),
        (256, 768, 768),
        (16, 1024, 1024),
        (384, 768, 768),
    ];
    v.push(Bench {
        op: "Gemm",
        attrs: Attrs::new(13).with("transB", AttrValue::Int(1)),
        shapes: gemm
            .iter()
            .map(|&(m, k, n)| vec![Rand(vec![m, k]), Rand(vec![n, k]), Rand(vec![n])])
            .collect(),
    });
    // Dense 3x3 (pad 1), depthwise 3x3 and pointwise 1x1 convolutions share the "Conv" entry.
    let conv = |c: usize, co: usize, hw: usize, k: usize, group: usize| {
        vec![
            Rand(vec![1, c, hw, hw]),
            Rand(vec![co, c / group, k, k]),
            Rand(vec![co]),
        ]
    };
    let conv_attrs = |k: i64, group: i64| {
        let p = k / 2;
        Attrs::new(13)
            .with("kernel_shape", ints(&[k, k]))
            .with("pads", ints(&[p, p, p, p]))
            .with("group", AttrValue::Int(group))
    };
    for (k, depthwise) in [(3, false), (3, true), (1, false)] {
        let sizes = [
            (8, 16),
            (16, 16),
            (16, 32),
            (32, 16),
            (32, 32),
            (16, 64),
            (64, 32),
            (32, 64),
            (128, 16),
            (64, 56),
            (128, 28),
            (96, 64),
        ];
        // One group count per benchmark keeps attributes fixed; depthwise uses group = C = 32
        // and varies only the spatial size.
        if depthwise {
            v.push(Bench {
                op: "Conv",
                attrs: conv_attrs(k, 32),
                shapes: [8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160]
                    .iter()
                    .map(|&hw| conv(32, 32, hw, k as usize, 32))
                    .collect(),
            });
        } else {
            v.push(Bench {
                op: "Conv",
                attrs: conv_attrs(k, 1),
                shapes: sizes
                    .iter()
                    .map(|&(c, hw)| conv(c, c * (1 + k as usize % 2), hw, k as usize, 1))
                    .collect(),
            });
        }
    }
    for op in ["Relu", "Sigmoid", "Tanh", "Erf"] {
        v.push(Bench {
            op,
            attrs: Attrs::new(13),
            shapes: ELEMS.iter().map(|&n| vec![Rand(rows(n))]).collect(),
        });
    }
    for (op, broadcast) in [("Add", false), ("Mul", true), ("Sub", false), ("Div", true)] {
        v.push(Bench {
            op,
            attrs: Attrs::new(14),
            shapes: ELEMS
                .iter()
                .map(|&n| {
                    let b = if broadcast { vec![256] } else { rows(n) };
                    vec![Rand(rows(n)), Rand(b)]
                })
                .collect(),
        });
    }
    let rc = [
        (16, 64),
        (64, 128),
        (128, 256),
        (256, 256),
        (256, 512),
        (512, 512),
        (1024, 512),
        (2048, 512),
        (1024, 1000),
        (4096, 128),
        (4096, 512),
        (2048, 2048),
    ];
    v.push(Bench {
        op: "Softmax",
        attrs: Attrs::new(13).with("axis", AttrValue::Int(-1)),
        shapes: rc.iter().map(|&(r, c)| vec![Rand(vec![r, c])]).collect(),
    });
    let ln = [
        (16, 128),
        (64, 128),
        (128, 384),
        (256, 384),
        (512, 384),
        (512, 768),
        (1024, 768),
        (2048, 384),
        (128, 768),
        (4096, 384),
        (2048, 768),
        (4096, 768),
    ];
    v.push(Bench {
        op: "LayerNormalization",
        attrs: Attrs::new(17).with("axis", AttrValue::Int(-1)),
        shapes: ln
            .iter()
            .map(|&(r, c)| vec![Rand(vec![r, c]), Rand(vec![c]), Rand(vec![c])])
            .collect(),
    });
    v.push(Bench {
        op: "ReduceMean",
        attrs: Attrs::new(13).with("axes", ints(&[-1])),
        shapes: rc.iter().map(|&(r, c)| vec![Rand(vec![r, c])]).collect(),
    });
    v.push(Bench {
        op: "ReduceSum",
        attrs: Attrs::new(13),
        shapes: rc
            .iter()
            .map(|&(r, c)| vec![Rand(vec![c, r]), I64(vec![1], vec![0])])
            .collect(),
    });
    let pools = [
        (8, 16),
        (16, 32),
        (32, 32),
        (16, 64),
        (32, 64),
        (64, 56),
        (64, 112),
        (32, 160),
        (128, 56),
        (256, 28),
        (64, 224),
        (128, 112),
    ];
    let nchw = |&(c, hw): &(usize, usize)| vec![Rand(vec![1, c, hw, hw])];
    v.push(Bench {
        op: "MaxPool",
        attrs: Attrs::new(12)
            .with("kernel_shape", ints(&[3, 3]))
            .with("strides", ints(&[2, 2]))
            .with("pads", ints(&[1, 1, 1, 1])),
        shapes: pools.iter().map(nchw).collect(),
    });
    v.push(Bench {
        op: "AveragePool",
        attrs: Attrs::new(11)
            .with("kernel_shape", ints(&[2, 2]))
            .with("strides", ints(&[2, 2])),
        shapes: pools.iter().map(nchw).collect(),
    });
    v.push(Bench {
        op: "GlobalAveragePool",
        attrs: Attrs::new(1),
        shapes: pools.iter().map(nchw).collect(),
    });
    v.push(Bench {
        op: "Transpose",
        attrs: Attrs::new(13).with("perm", ints(&[0, 2, 1, 3])),
        shapes: ELEMS
            .iter()
            .map(|&n| vec![Rand(vec![1, n / 512, 8, 64])])
            .collect(),
    });
    v.push(Bench {
        op: "Concat",
        attrs: Attrs::new(13).with("axis", AttrValue::Int(1)),
        shapes: ELEMS
            .iter()
            .map(|&n| vec![Rand(vec![1, 16, n / 512]), Rand(vec![1, 16, n / 512])])
            .collect(),
    });
    v.push(Bench {
        op: "Gather",
        attrs: Attrs::new(13),
        shapes: ELEMS
            .iter()
            .map(|&n| vec![Rand(vec![4096, 64]), Indices(vec![n / 64], 4096)])
            .collect(),
    });
    v.push(Bench {
        op: "Resize",
        attrs: Attrs::new(13).with("mode", AttrValue::String("nearest".into())),
        shapes: ELEMS
            .iter()
            .map(|&n| {
                vec![
                    Rand(vec![1, 16, 8, n / 512]),
                    Omitted,
                    F32(vec![4], vec![1.0, 1.0, 2.0, 2.0]),
                ]
            })
            .collect(),
    });
    v
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn make(inputs: &[Input], rng: &mut Lcg) -> Vec<Tensor> {
    inputs
        .iter()
        .map(|i| match i {
            Input::Rand(s) => Tensor::f32(s, (0..s.iter().product()).map(|_| rng.next()).collect()),
            Input::Indices(s, max) => Tensor::i64(
                s,
                (0..s.iter().product())
                    .map(|_| ((rng.next() * 0.5 + 0.5) * *max as f32) as i64 % max)
                    .collect(),
            ),
            Input::F32(s, v) => Tensor::f32(s, v.clone()),
            Input::I64(s, v) => Tensor::i64(s, v.clone()),
            Input::Omitted => Tensor::f32(&[0], vec![]),
        })
        .collect()
}

fn describe(inputs: &[Input]) -> String {
    let shapes: Vec<String> = inputs
        .iter()
        .filter_map(|i| match i {
            Input::Rand(s) | Input::Indices(s, _) => Some(format!("{s:?}")),
            _ => None,
        })
        .collect();
    shapes.join(" x ")
}

/// One prepared benchmark instance: op, inputs, inferred outputs and work features.
struct Prepared {
    op: Box<dyn Op>,
    ins: Vec<Tensor>,
    metas: Vec<TensorMeta>,
    outs: Vec<TensorMeta>,
    flops: f64,
    bytes: f64,
}

fn prepare(b: &Bench, inputs: &[Input], rng: &mut Lcg) -> Result<Prepared, String> {
    let op = registry::build(b.op, &b.attrs).map_err(|e| format!("{}: {e}", b.op))?;
    let ins = make(inputs, rng);
    let metas: Vec<TensorMeta> = ins
        .iter()
        .map(|t| TensorMeta::constant(t.clone()))
        .collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let mut outs = op.infer(&refs).map_err(|e| format!("{}: {e}", b.op))?;
    // Models use output 0 of these ops (MaxPool's Indices, LayerNormalization's statistics
    // are optional and computed on the CPU only).
    outs.truncate(1);
    let w = op.work(&refs, &outs);
    Ok(Prepared {
        flops: w.flops as f64,
        bytes: (w.bytes_read + w.bytes_written) as f64,
        op,
        ins,
        metas,
        outs,
    })
}

/// Repetitions for a kernel whose first run took `first` seconds: about 30 ms of repeats,
/// between 3 and 15 (the sample is their median).
fn reps_for(first: f64) -> usize {
    ((0.03 / first.max(1e-7)).ceil() as usize).clamp(3, 15)
}

/// Median CPU time of all rows of `p` on the current rayon pool (one untimed warm-up).
fn measure_cpu(p: &Prepared) -> Result<f64, String> {
    let refs: Vec<&TensorMeta> = p.metas.iter().collect();
    let rows = row_count(&p.outs[0].shape, p.op.split_axis(&refs, &p.outs));
    let ins: Vec<&Tensor> = p.ins.iter().collect();
    let mut out: Vec<Tensor> = p
        .outs
        .iter()
        .map(|m| Tensor::zeros(m.dtype, &m.shape))
        .collect();
    let mut run = || -> Result<f64, String> {
        let t = Instant::now();
        p.op.cpu(&ins, &mut out, 0..rows)
            .map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_secs_f64())
    };
    let first = run()?;
    let n = reps_for(first);
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        times.push(run()?);
    }
    Ok(median(times))
}

/// Median GPU time of all rows of `p`: per-dispatch timestamps summed over the op's dispatches
/// when the adapter has them, else the batch's wall time divided by the repetitions.
fn measure_gpu(gpu: &Gpu, p: &Prepared) -> Result<f64, String> {
    let e = |e: crate::Error| e.to_string();
    let refs: Vec<&TensorMeta> = p.metas.iter().collect();
    let rows = row_count(&p.outs[0].shape, p.op.split_axis(&refs, &p.outs));
    let kernels =
        p.op.gpu(&refs, &p.outs, 0..rows)
            .map_err(|e| e.to_string())?;
    let mut inputs: Vec<Option<GpuTensor>> = vec![None; p.ins.len()];
    for k in &kernels {
        for &i in &k.inputs {
            if inputs[i].is_none() {
                inputs[i] = Some(gpu.upload(&p.ins[i]).map_err(e)?);
            }
        }
    }
    let outputs: Vec<GpuTensor> = p
        .outs
        .iter()
        .map(|m| gpu.alloc(m.dtype, m.numel()))
        .collect::<crate::Result<_>>()
        .map_err(e)?;
    let run = |reps: usize| -> Result<Vec<f64>, String> {
        let mut batch = gpu.batch();
        for rep in 0..reps {
            for k in &kernels {
                let i: Vec<&GpuTensor> = k
                    .inputs
                    .iter()
                    .filter_map(|&i| inputs[i].as_ref())
                    .collect();
                let o: Vec<&GpuTensor> = k.outputs.iter().map(|&o| &outputs[o]).collect();
                batch.dispatch(k, &i, &o, rep).map_err(e)?;
            }
        }
        let timing = batch.submit().and_then(|s| s.wait()).map_err(e)?;
        if timing.per_label.is_empty() {
            return Ok(vec![timing.wall.as_secs_f64() / reps as f64]);
        }
        let mut per_rep = vec![0.0; reps];
        for (label, d) in timing.per_label {
            per_rep[label] += d.as_secs_f64();
        }
        Ok(per_rep)
    };
    let first = median(run(1)?);
    Ok(median(run(reps_for(first))?))
}

/// Link costs: sync = a 16-byte download (submit + map + wait); upload and download of several
/// sizes fitted as latency + bytes / bandwidth, the sync subtracted.
fn measure_links(gpu: &Gpu) -> Result<Links, String> {
    let e = |e: crate::Error| e.to_string();
    let tiny = gpu.upload(&Tensor::f32(&[4], vec![0.0; 4])).map_err(e)?;
    let mut syncs = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        gpu.download(&[(&tiny, &[4])]).map_err(e)?;
        syncs.push(t.elapsed().as_secs_f64());
    }
    let sync = median(syncs);
    let mut up = Vec::new();
    let mut down = Vec::new();
    let mut rng = Lcg(3);
    for &n in &[1usize << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20] {
        let host = make(&[Input::Rand(vec![n])], &mut rng).remove(0);
        let mut tu = Vec::new();
        let mut td = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let g = gpu.upload(&host).map_err(e)?;
            gpu.download(&[(&tiny, &[4])]).map_err(e)?;
            tu.push((t.elapsed().as_secs_f64() - sync).max(1e-7));
            let t = Instant::now();
            gpu.download(&[(&g, &[n])]).map_err(e)?;
            td.push((t.elapsed().as_secs_f64() - sync).max(1e-7));
        }
        let bytes = (n * 4) as f64;
        up.push(Sample {
            flops: 0.0,
            bytes,
            seconds: median(tu),
        });
        down.push(Sample {
            flops: 0.0,
            bytes,
            seconds: median(td),
        });
    }
    let line = |s: &[Sample]| {
        let c = fit(s).unwrap_or_default();
        Line {
            latency: c.fixed,
            seconds_per_byte: c.per_byte,
        }
    };
    Ok(Links {
        upload: line(&up),
        download: line(&down),
        sync,
    })
}

/// Roofline prior of a device from its samples: the best flop rate of compute-bound samples,
/// the best byte rate of all, the smallest time as launch latency.
fn roofline_from(samples: &[Sample], default: Roofline) -> Roofline {
    if samples.is_empty() {
        return default;
    }
    let peak = samples
        .iter()
        .filter(|s| s.flops > 4.0 * s.bytes)
        .map(|s| s.flops / s.seconds)
        .fold(0.0, f64::max);
    let bw = samples
        .iter()
        .map(|s| s.bytes / s.seconds)
        .fold(0.0, f64::max);
    let launch = samples
        .iter()
        .map(|s| s.seconds)
        .fold(f64::INFINITY, f64::min);
    Roofline {
        peak_flops: if peak > 0.0 { peak } else { default.peak_flops },
        bandwidth: if bw > 0.0 { bw } else { default.bandwidth },
        launch: launch.min(default.launch * 10.0),
    }
}

/// Every 4th shape of each op kind (the 3rd, 7th...) is held out of the report's fit.
fn held_out(tier: usize) -> bool {
    tier % 4 == 2
}

/// Measure, fit and report. Uses the current rayon pool for CPU kernels (its thread count goes
/// into the CPU key). `progress` is called after each measurement. Never panics on a failing
/// op or device: a GPU error stops GPU measurements and is reported.
pub fn calibrate(
    gpu: Option<&Gpu>,
    opts: &CalibrationOptions,
    progress: &mut dyn FnMut(&Progress),
) -> (CostModel, CalibrationReport) {
    let start = Instant::now();
    let threads = rayon::current_num_threads();
    let adapter = gpu.map(|g| keys::AdapterKey::from_desc(g.adapter()));
    let mut model = CostModel::unmeasured(adapter, keys::CpuKey::detect(threads));
    let gpu = gpu.filter(|_| opts.gpu);
    let mut gpu_error = None;
    let mut links = None;
    if let Some(g) = gpu {
        model.gpu_timestamps = g.has_timestamps();
        match measure_links(g) {
            Ok(l) => {
                model.links = l;
                links = Some(l);
            }
            Err(e) => gpu_error = Some(e),
        }
    }
    let benches: Vec<Bench> = suite()
        .into_iter()
        .filter(|b| {
            opts.ops
                .as_ref()
                .is_none_or(|o| o.iter().any(|n| n == b.op))
        })
        .collect();
    let mut devices = Vec::new();
    if opts.cpu {
        devices.push(Device::Cpu);
    }
    if gpu.is_some() && gpu_error.is_none() {
        devices.push(Device::Gpu);
    }
    let planned: usize = benches.iter().map(|b| b.shapes.len()).sum::<usize>() * devices.len();
    let tiers = benches.iter().map(|b| b.shapes.len()).max().unwrap_or(0);
    // (bench, device) -> last measured seconds; None once skipped for the rest.
    let mut last: HashMap<(usize, Device), Option<f64>> = HashMap::new();
    // (op, device) -> (tier, sample)
    let mut samples: BTreeMap<(&'static str, u8), Vec<(usize, Sample)>> = BTreeMap::new();
    let mut done = 0;
    let mut rng = Lcg(42);
    'tiers: for tier in 0..tiers {
        for (bi, b) in benches.iter().enumerate() {
            let Some(inputs) = b.shapes.get(tier) else {
                continue;
            };
            let prepared = match prepare(b, inputs, &mut rng) {
                Ok(p) => p,
                Err(_) => continue,
            };
            for &device in &devices {
                let elapsed = start.elapsed();
                if elapsed >= opts.budget {
                    break 'tiers;
                }
                let remaining = (opts.budget - elapsed).as_secs_f64();
                let prev = last.entry((bi, device)).or_insert(Some(0.0));
                match *prev {
                    // Skipped for good: the last size was too slow for what is left.
                    None => continue,
                    Some(t) if t * 8.0 > remaining => {
                        *prev = None;
                        continue;
                    }
                    _ => {}
                }
                if device == Device::Gpu && gpu_error.is_some() {
                    continue;
                }
                let measured = match device {
                    Device::Cpu => measure_cpu(&prepared),
                    Device::Gpu => measure_gpu(gpu.expect("gpu device only with a gpu"), &prepared),
                };
                done += 1;
                match measured {
                    Ok(seconds) if seconds > 0.0 => {
                        *last.get_mut(&(bi, device)).unwrap() = Some(seconds);
                        samples
                            .entry((b.op, device_rank(device)))
                            .or_default()
                            .push((
                                tier,
                                Sample {
                                    flops: prepared.flops,
                                    bytes: prepared.bytes,
                                    seconds,
                                },
                            ));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        *last.get_mut(&(bi, device)).unwrap() = None;
                        if device == Device::Gpu && gpu.is_some_and(|g| g.is_lost()) {
                            gpu_error = Some(e);
                        }
                    }
                }
                progress(&Progress {
                    elapsed: start.elapsed(),
                    budget: opts.budget,
                    done,
                    planned,
                    what: format!("{} {} on {device}", b.op, describe(inputs)),
                });
            }
        }
    }
    // Held-out report: fit without the held-out tiers, predict them.
    let mut report_rows = Vec::new();
    let (mut hits, mut total) = (0usize, 0usize);
    for (&(op, rank), s) in &samples {
        let device = rank_device(rank);
        let train: Vec<Sample> = s
            .iter()
            .filter(|(t, _)| !held_out(*t))
            .map(|(_, s)| *s)
            .collect();
        let test: Vec<Sample> = s
            .iter()
            .filter(|(t, _)| held_out(*t))
            .map(|(_, s)| *s)
            .collect();
        let Some(c) = fit(&train) else { continue };
        if test.is_empty() {
            continue;
        }
        let errs: Vec<f64> = test
            .iter()
            .map(|s| (c.time(s.flops, s.bytes) - s.seconds).abs() / s.seconds)
            .collect();
        let within = errs.iter().filter(|e| **e <= 0.10).count();
        hits += within;
        total += errs.len();
        report_rows.push(HeldOut {
            op: op.to_string(),
            device,
            count: errs.len(),
            within_10: within as f64 / errs.len() as f64,
            median_rel_err: median(errs),
        });
    }
    // The saved model uses every sample.
    let mut per_device: HashMap<Device, Vec<Sample>> = HashMap::new();
    let mut count = 0;
    for (&(op, rank), s) in &samples {
        let device = rank_device(rank);
        let all: Vec<Sample> = s.iter().map(|(_, s)| *s).collect();
        count += all.len();
        per_device.entry(device).or_default().extend(&all);
        model.add_calibration(
            EntryKey {
                op: op.to_string(),
                dtype: DType::F32,
                device,
            },
            &all,
        );
    }
    let empty = Vec::new();
    model.cpu_prior = roofline_from(
        per_device.get(&Device::Cpu).unwrap_or(&empty),
        model.cpu_prior,
    );
    model.gpu_prior = roofline_from(
        per_device.get(&Device::Gpu).unwrap_or(&empty),
        model.gpu_prior,
    );
    model.refit();
    let report = CalibrationReport {
        held_out: report_rows,
        overall_within_10: if total > 0 {
            hits as f64 / total as f64
        } else {
            0.0
        },
        samples: count,
        elapsed: start.elapsed(),
        links,
        gpu_error,
    };
    (model, report)
}

/// [`calibrate`] on a rayon pool of `threads` kernel threads (0: all cores), built for the
/// purpose (the thread count is part of the profile's CPU key).
pub fn calibrate_on_threads(
    gpu: Option<&Gpu>,
    threads: usize,
    opts: &CalibrationOptions,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> (CostModel, CalibrationReport) {
    match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(pool) => pool.install(|| calibrate(gpu, opts, progress)),
        Err(_) => calibrate(gpu, opts, progress),
    }
}
