//! Calibration: micro-benchmarks of real operators (built through the registry with real
//! attributes, at shapes taken from the models tandem runs) on the CPU (the current rayon pool)
//! and the GPU (timestamp queries), within a time budget; link and sync costs; a held-out
//! accuracy report.
//!
//! Sits between the operators (`tandem_ops::registry`), the GPU layer (`gpu.rs`) and the cost
//! model (`cost/mod.rs`), which it fills with samples and priors.

use super::suite::{describe, make, suite, Bench, Input, Lcg};
use super::{
    device_rank, fit, fit_curve, keys, median, rank_device, CostModel, EntryKey, Line, Links,
    Roofline, Sample,
};
use crate::costs::{cost_key, device_variant, gpu_padding, kernel_variant};
use crate::gpu::{Gpu, GpuTensor};
use crate::plan::Device;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use tandem_ops::conv::Conv;
use tandem_ops::gemm_op::Gemm;
use tandem_ops::matmul::MatMul;
use tandem_ops::shape::row_count;
use tandem_ops::{registry, DType, Op, Tensor, TensorMeta};

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
    /// Share of these points whose passes agree within +-10% (the measurement's noise floor;
    /// a point measured once counts as agreeing).
    pub passes_agree: f64,
    /// Each held-out point: its shape, predicted and measured seconds.
    pub points: Vec<HeldOutPoint>,
}

/// One held-out prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldOutPoint {
    /// The benchmark's input shapes, e.g. "[128, 64] x [64, 96]".
    pub shape: String,
    pub predicted: f64,
    pub measured: f64,
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
    /// The noise floor of the held-out measurement itself: of the held-out points measured in
    /// two or more passes, the share whose passes agree within +-10% (max / min <= 1.1), and
    /// how many such points there were.
    pub repeat_within_10: f64,
    pub repeated: usize,
}

impl std::fmt::Display for CalibrationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{:<22} {:<6} {:>5} {:>8} {:>11} {:>13}",
            "op", "device", "n", "+-10%", "median err", "passes agree"
        )?;
        for h in &self.held_out {
            writeln!(
                f,
                "{:<22} {:<6} {:>5} {:>7.0}% {:>10.1}% {:>12.0}%",
                h.op,
                h.device.to_string(),
                h.count,
                h.within_10 * 100.0,
                h.median_rel_err * 100.0,
                h.passes_agree * 100.0
            )?;
            // `{:#}`: every held-out point with its prediction.
            if f.alternate() {
                for p in &h.points {
                    writeln!(
                        f,
                        "    {:<40} predicted {:>10.1} us, measured {:>10.1} us ({:+.0}%)",
                        p.shape,
                        p.predicted * 1e6,
                        p.measured * 1e6,
                        (p.predicted / p.measured - 1.0) * 100.0
                    )?;
                }
            }
        }
        if let Some(l) = &self.links {
            writeln!(
                f,
                "links: upload {:.1} us + {:.2} GB/s, download {:.1} us + {:.2} GB/s, sync {:.1} us, \
                 {:.1} us per dispatch",
                l.upload.latency * 1e6,
                1e-9 / l.upload.seconds_per_byte.max(1e-30),
                l.download.latency * 1e6,
                1e-9 / l.download.seconds_per_byte.max(1e-30),
                l.sync * 1e6,
                l.dispatch * 1e6
            )?;
        }
        if let Some(e) = &self.gpu_error {
            writeln!(f, "GPU measurements stopped: {e}")?;
        }
        writeln!(
            f,
            "noise floor: {:.0}% of {} held-out points measured in 2+ passes agree within +-10% \
             across passes",
            self.repeat_within_10 * 100.0,
            self.repeated
        )?;
        write!(
            f,
            "overall: {:.0}% of held-out predictions within +-10% ({} samples in {:.1} s)",
            self.overall_within_10 * 100.0,
            self.samples,
            self.elapsed.as_secs_f64()
        )
    }
}

/// One prepared benchmark instance: op, inputs, inferred outputs and work features.
struct Prepared {
    /// The op type and its CPU kernel variant ([`kernel_variant`]).
    name: &'static str,
    variant: &'static str,
    op: Box<dyn Op>,
    ins: Vec<Tensor>,
    metas: Vec<TensorMeta>,
    outs: Vec<TensorMeta>,
    flops: f64,
    bytes: f64,
    /// [`gpu_padding`]: GPU samples count `flops * gpu_pad`.
    gpu_pad: f64,
    /// Output rows along the op's split axis.
    rows: f64,
}

fn prepare(b: &Bench, inputs: &[Input], rng: &mut Lcg) -> Result<Prepared, String> {
    let mut op = registry::build(b.op, &b.attrs).map_err(|e| format!("{}: {e}", b.op))?;
    let mut ins = make(inputs, rng);
    // A constant transposed Gemm weight is stored as a session stores it (`crate::layout`).
    let padded = (op.as_any().and_then(|a| a.downcast_ref::<Gemm>()))
        .and_then(|g| g.with_padded_weight(Some(&ins[0].shape), &ins[1]));
    if let Some((gemm, weight)) = padded {
        op = Box::new(gemm);
        ins[1] = weight;
    }
    // So is a constant Conv weight: Winograd keeps its transform.
    if let Some(conv) = op.as_any().and_then(|a| a.downcast_ref::<Conv>()) {
        op = Box::new(conv.with_constant_weight());
    }
    // And a MatMul's B: models' large MatMuls with one B are weight products, kept packed.
    if let Some(mm) = op.as_any().and_then(|a| a.downcast_ref::<MatMul>()) {
        op = Box::new(mm.with_constant_b());
    }
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
        name: b.op,
        variant: kernel_variant(op.as_ref(), &refs, &outs),
        flops: w.flops as f64,
        bytes: (w.bytes_read + w.bytes_written) as f64,
        gpu_pad: gpu_padding(b.op, &outs),
        rows: row_count(&outs[0].shape, op.split_axis(&refs, &outs)) as f64,
        op,
        ins,
        metas,
        outs,
    })
}

impl Prepared {
    /// The cost key of this instance on `device` (`Conv/winograd` on the CPU is `Conv/kxk` on
    /// the GPU).
    fn key_on(&self, device: Device) -> String {
        cost_key(self.name, device_variant(self.variant, device)).into_owned()
    }
}

/// Repetitions for a kernel whose first run took `first` seconds: about 30 ms of repeats,
/// between 3 and 40 (the sample is their least).
fn reps_for(first: f64) -> usize {
    ((0.03 / first.max(1e-7)).ceil() as usize).clamp(3, 40)
}

/// How CPU kernels are timed: with a one-thread pool every kernel runs on the calling thread,
/// so its CPU time (Linux `CLOCK_THREAD_CPUTIME_ID`) is the kernel's time without the time other
/// processes held the core (this machine is shared with builds); otherwise wall time.
#[derive(Clone, Copy)]
enum KernelClock {
    Wall(Instant),
    #[cfg(target_os = "linux")]
    Thread,
}

#[cfg(target_os = "linux")]
fn thread_cpu_seconds() -> Option<f64> {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec (two 64-bit fields on 64-bit Linux) to a valid
    // pointer and reads nothing else.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.sec as f64 + ts.nsec as f64 * 1e-9)
}

impl KernelClock {
    fn for_current_pool() -> KernelClock {
        #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
        if rayon::current_num_threads() == 1 && thread_cpu_seconds().is_some() {
            return KernelClock::Thread;
        }
        KernelClock::Wall(Instant::now())
    }

    /// Seconds since an arbitrary origin.
    fn now(&self) -> f64 {
        match self {
            KernelClock::Wall(origin) => origin.elapsed().as_secs_f64(),
            #[cfg(target_os = "linux")]
            KernelClock::Thread => thread_cpu_seconds().unwrap_or(0.0),
        }
    }
}

/// Seconds of kernel calls per CPU sample (see [`measure_cpu`]). At 20 us, a 3 us Relu timed
/// right after a lavapipe measurement read 4.3-6.9 us against 2.9-3.1 us when timed after
/// itself; at 200 us both read 2.9-3.1 us (the thread clock is a 0.6-0.8 us system call here,
/// and the kernel needs more calls than 40 short samples give to reach its steady speed).
const INNER_SAMPLE: f64 = 200e-6;

/// Least CPU time of all rows of `p` over repetitions on the current rayon pool (two untimed
/// warm-ups). The least, not the median: even the thread's own CPU time grows when other
/// processes share the caches, the memory bus or (in a VM) the host core, so, as on the GPU,
/// load only ever adds time.
fn measure_cpu(p: &Prepared) -> Result<f64, String> {
    let refs: Vec<&TensorMeta> = p.metas.iter().collect();
    let rows = row_count(&p.outs[0].shape, p.op.split_axis(&refs, &p.outs));
    let ins: Vec<&Tensor> = p.ins.iter().collect();
    let mut out: Vec<Tensor> = p
        .outs
        .iter()
        .map(|m| Tensor::zeros(m.dtype, &m.shape))
        .collect();
    // Kernels under `INNER_SAMPLE` are timed `inner` calls at a time, so that the clock's own
    // cost and resolution and the kernel's warm-up do not become part of the sample.
    let clock = KernelClock::for_current_pool();
    let mut run = |inner: usize| -> Result<f64, String> {
        let t = clock.now();
        for _ in 0..inner {
            p.op.cpu(&ins, &mut out, 0..rows)
                .map_err(|e| e.to_string())?;
        }
        Ok((clock.now() - t) / inner as f64)
    };
    let first = run(1)?;
    let inner = ((INNER_SAMPLE / first.max(1e-8)).ceil() as usize).clamp(1, 1024);
    let mut run = || run(inner);
    let first = run()?;
    let n = reps_for(first * inner as f64);
    let mut least = f64::INFINITY;
    for _ in 0..n {
        least = least.min(run()?);
    }
    Ok(least)
}

/// Least GPU time of all rows of `p` over a batch of repetitions: per-dispatch timestamps
/// summed over the op's dispatches when the adapter has them, else the batch's wall time
/// divided by the repetitions.
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
    // The least repetition: GPU timestamps are wall time (on lavapipe, of a CPU thread that
    // other processes preempt), and load only ever adds time.
    Ok(run(reps_for(first))?
        .into_iter()
        .fold(f64::INFINITY, f64::min))
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
            rows: 0.0,
        });
        down.push(Sample {
            flops: 0.0,
            bytes,
            seconds: median(td),
            rows: 0.0,
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
        dispatch: measure_dispatch(gpu, sync)?,
    })
}

/// Dispatches recorded per batch when measuring [`Links::dispatch`].
const OVERHEAD_DISPATCHES: usize = 64;

/// Seconds per GPU dispatch that kernel timings miss ([`Links::dispatch`]): batches of
/// [`OVERHEAD_DISPATCHES`] tiny Relu steps recorded as the executor records a step (an output
/// taken from the pool, cleared, the kernel dispatched) and submitted as it submits them (each
/// time the batch is full, [`crate::gpu::Batch::is_full`]), then waited for. The host
/// clock from the first record to the end of the wait, less what calibration's GPU samples
/// do count (the dispatches' timestamps and one `sync`, or without timestamps the wall time
/// from submit), shared out per dispatch. The least of 5 batches: other load only adds.
fn measure_dispatch(gpu: &Gpu, sync: f64) -> Result<f64, String> {
    let e = |e: crate::Error| e.to_string();
    let op = registry::build("Relu", &tandem_ops::Attrs::new(13)).map_err(|e| e.to_string())?;
    let x = TensorMeta::new(DType::F32, vec![256]);
    let outs = op.infer(&[&x]).map_err(|e| e.to_string())?;
    let kernels = op.gpu(&[&x], &outs, 0..1).map_err(|e| e.to_string())?;
    let input = gpu
        .upload(&Tensor::f32(&[256], vec![1.0; 256]))
        .map_err(e)?;
    let mut least = f64::INFINITY;
    for _ in 0..5 {
        let began = Instant::now();
        let mut batch = gpu.batch();
        let mut submitted = Vec::new();
        let mut keep = Vec::with_capacity(OVERHEAD_DISPATCHES);
        for label in 0..OVERHEAD_DISPATCHES {
            let out = gpu.alloc(DType::F32, 256).map_err(e)?;
            batch.clear(&out);
            for k in &kernels {
                batch.dispatch(k, &[&input], &[&out], label).map_err(e)?;
            }
            keep.push(out);
            if batch.is_full() {
                submitted.push(
                    std::mem::replace(&mut batch, gpu.batch())
                        .submit()
                        .map_err(e)?,
                );
            }
        }
        if !batch.is_empty() {
            submitted.push(batch.submit().map_err(e)?);
        }
        let timings: Vec<_> = (submitted.into_iter().map(|s| s.wait()))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        let host = began.elapsed().as_secs_f64();
        let stamped: Vec<f64> = (timings.iter().flat_map(|t| &t.per_label))
            .map(|(_, d)| d.as_secs_f64())
            .collect();
        let counted = match stamped.is_empty() {
            // From the first submit to the end of the last batch.
            true => {
                let (first, last) = (&timings[0], &timings[timings.len() - 1]);
                match (first.submitted, last.submitted) {
                    (Some(a), Some(b)) => (b + last.wall).duration_since(a).as_secs_f64(),
                    _ => last.wall.as_secs_f64(),
                }
            }
            false => stamped.iter().sum::<f64>() + sync,
        };
        least = least.min((host - counted).max(0.0) / OVERHEAD_DISPATCHES as f64);
    }
    Ok(least)
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

/// Measurement passes over the suite, some seconds apart: the sample of a point is the least
/// of its passes' times, so that a burst of load from other processes (which only ever adds
/// time) during one pass does not become the model's truth. Later passes only repeat points
/// the first pass measured, while the budget lasts. The CPU gets more passes than the GPU:
/// lavapipe's times repeat within a few percent across passes (and cost most of the
/// budget), the CPU's small kernels are the ones load moves by more than 10%. So the GPU
/// leaves the CPU's later passes the time its first pass took (see `measure_suite`).
fn passes(device: Device) -> usize {
    match device {
        Device::Cpu => 5,
        Device::Gpu => 2,
    }
}

/// The most passes of any device.
const PASSES: usize = 5;

/// What a (bench, tier) point is: cost keys on the CPU and the GPU, flops, GPU padding,
/// bytes, output rows, input shapes.
type PointInfo = ([String; 2], f64, f64, f64, f64, String);

/// One measured point of the suite.
struct Measured {
    /// Index of the shape in its benchmark (held out when [`held_out`]).
    tier: usize,
    sample: Sample,
    /// The input shapes, for the report.
    shape: String,
    /// Seconds measured in each pass (the sample is their least).
    passes: Vec<f64>,
}

/// Run the suite's benchmarks on `devices` in [`passes`] (smallest shapes first,
/// round-robin over op kinds) within `opts.budget` from `start`. Returns per (cost key, device
/// rank) the measured points. A lost GPU sets `gpu_error` and ends GPU measurements.
fn measure_suite(
    benches: &[Bench],
    devices: &[Device],
    gpu: Option<&Gpu>,
    opts: &CalibrationOptions,
    start: Instant,
    gpu_error: &mut Option<String>,
    progress: &mut dyn FnMut(&Progress),
) -> BTreeMap<(String, u8), Vec<Measured>> {
    let per_pass: usize = benches.iter().map(|b| b.shapes.len()).sum::<usize>() * devices.len();
    let planned: usize =
        devices.iter().map(|&d| passes(d)).sum::<usize>() * per_pass / devices.len().max(1);
    let tiers = benches.iter().map(|b| b.shapes.len()).max().unwrap_or(0);
    // (bench, device) -> last measured seconds in the first pass; None once skipped.
    let mut last: HashMap<(usize, Device), Option<f64>> = HashMap::new();
    // (bench, tier, device rank) -> seconds, one per pass.
    let mut times: BTreeMap<(usize, usize, u8), Vec<f64>> = BTreeMap::new();
    let mut points: HashMap<(usize, usize), PointInfo> = HashMap::new();
    let mut done = 0;
    // Seconds the CPU's first pass took so far.
    let mut cpu_first_pass = 0.0;
    'passes: for pass in 0..PASSES {
        for tier in 0..tiers {
            for (bi, b) in benches.iter().enumerate() {
                let Some(inputs) = b.shapes.get(tier) else {
                    continue;
                };
                let rank_of = |d: Device| (bi, tier, device_rank(d));
                if pass > 0 && !devices.iter().any(|&d| times.contains_key(&rank_of(d))) {
                    continue;
                }
                // The same inputs in every pass.
                let mut rng = Lcg(42 + (bi * 1000 + tier) as u64);
                let Ok(prepared) = prepare(b, inputs, &mut rng) else {
                    continue;
                };
                for &device in devices {
                    let elapsed = start.elapsed();
                    if elapsed >= opts.budget {
                        break 'passes;
                    }
                    // The GPU leaves the CPU's later passes their time (a slow GPU such as
                    // lavapipe would otherwise spend the whole budget on its first pass).
                    let reserve = match device {
                        Device::Gpu if devices.contains(&Device::Cpu) => {
                            cpu_first_pass * passes(Device::Cpu).saturating_sub(pass + 1) as f64
                        }
                        _ => 0.0,
                    };
                    let remaining = (opts.budget - elapsed).as_secs_f64() - reserve;
                    if pass >= passes(device) || (device == Device::Gpu && gpu_error.is_some()) {
                        continue;
                    }
                    if pass == 0 {
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
                    } else {
                        match times.get(&rank_of(device)) {
                            Some(t) if t[0] * 4.0 <= remaining => {}
                            _ => continue,
                        }
                    }
                    let began = Instant::now();
                    let measured = match device {
                        Device::Cpu => measure_cpu(&prepared),
                        Device::Gpu => {
                            measure_gpu(gpu.expect("gpu device only with a gpu"), &prepared)
                        }
                    };
                    done += 1;
                    if device == Device::Cpu && pass == 0 {
                        cpu_first_pass += began.elapsed().as_secs_f64();
                    }
                    match measured {
                        Ok(seconds) if seconds > 0.0 => {
                            if pass == 0 {
                                last.insert((bi, device), Some(seconds));
                            }
                            times.entry(rank_of(device)).or_default().push(seconds);
                            points.entry((bi, tier)).or_insert_with(|| {
                                let shape = describe(inputs);
                                let p = &prepared;
                                let keys = [p.key_on(Device::Cpu), p.key_on(Device::Gpu)];
                                (keys, p.flops, p.gpu_pad, p.bytes, p.rows, shape)
                            });
                        }
                        Ok(_) => {}
                        Err(e) => {
                            last.insert((bi, device), None);
                            if device == Device::Gpu && gpu.is_some_and(|g| g.is_lost()) {
                                *gpu_error = Some(e);
                            }
                        }
                    }
                    progress(&Progress {
                        elapsed: start.elapsed(),
                        budget: opts.budget,
                        done,
                        planned: planned.max(done),
                        what: format!(
                            "{} {} on {device} (pass {})",
                            prepared.key_on(device),
                            describe(inputs),
                            pass + 1
                        ),
                    });
                }
            }
        }
    }
    let mut samples: BTreeMap<(String, u8), Vec<Measured>> = BTreeMap::new();
    for ((bi, tier, rank), t) in times {
        let (keys, flops, pad, bytes, rows, shape) = &points[&(bi, tier)];
        let pad = if rank_device(rank) == Device::Gpu {
            *pad
        } else {
            1.0
        };
        samples
            .entry((keys[usize::from(rank)].clone(), rank))
            .or_default()
            .push(Measured {
                tier,
                sample: Sample {
                    flops: flops * pad,
                    bytes: *bytes,
                    rows: *rows,
                    seconds: t.iter().copied().fold(f64::INFINITY, f64::min),
                },
                shape: shape.clone(),
                passes: t,
            });
    }
    samples
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
    let samples = measure_suite(
        &benches,
        &devices,
        gpu,
        opts,
        start,
        &mut gpu_error,
        progress,
    );
    // Held-out report: fit without the held-out tiers, predict them.
    let mut report_rows = Vec::new();
    let (mut hits, mut total) = (0usize, 0usize);
    let (mut agree, mut repeated) = (0usize, 0usize);
    for ((op, rank), s) in &samples {
        let device = rank_device(*rank);
        let train: Vec<Sample> = s
            .iter()
            .filter(|m| !held_out(m.tier))
            .map(|m| m.sample)
            .collect();
        let test: Vec<&Measured> = s.iter().filter(|m| held_out(m.tier)).collect();
        let agrees = |m: &Measured| {
            let hi = m.passes.iter().copied().fold(0.0, f64::max);
            hi <= 1.1 * m.sample.seconds
        };
        for m in test.iter().filter(|m| m.passes.len() >= 2) {
            repeated += 1;
            agree += usize::from(agrees(m));
        }
        let key_agree = test.iter().filter(|m| agrees(m)).count();
        let Some(c) = fit_curve(&train) else {
            continue;
        };
        if test.is_empty() {
            continue;
        }
        let points: Vec<HeldOutPoint> = test
            .iter()
            .map(|m| HeldOutPoint {
                shape: m.shape.clone(),
                predicted: c.time(m.sample.flops, m.sample.bytes, m.sample.rows),
                measured: m.sample.seconds,
            })
            .collect();
        let errs: Vec<f64> = points
            .iter()
            .map(|p| (p.predicted - p.measured).abs() / p.measured)
            .collect();
        let within = errs.iter().filter(|e| **e <= 0.10).count();
        hits += within;
        total += errs.len();
        report_rows.push(HeldOut {
            op: op.clone(),
            device,
            count: errs.len(),
            within_10: within as f64 / errs.len() as f64,
            median_rel_err: median(errs),
            passes_agree: key_agree as f64 / test.len() as f64,
            points,
        });
    }
    // The saved model uses every sample.
    let mut per_device: HashMap<Device, Vec<Sample>> = HashMap::new();
    let mut count = 0;
    for ((op, rank), s) in &samples {
        let device = rank_device(*rank);
        let all: Vec<Sample> = s.iter().map(|m| m.sample).collect();
        count += all.len();
        per_device.entry(device).or_default().extend(&all);
        model.add_calibration(
            EntryKey {
                op: op.clone(),
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
        repeat_within_10: agree as f64 / repeated.max(1) as f64,
        repeated,
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
