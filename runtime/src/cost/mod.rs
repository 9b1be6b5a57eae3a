//! The learned cost model of one (GPU adapter, CPU, shader set): per (op kind, dtype, device)
//! `time = a*flops + b*bytes + c` fitted by non-negative least squares, a roofline prior per
//! device for op kinds never measured, link costs (upload, download, sync) measured on the
//! adapter, and online refinement from run reports.
//!
//! Sits between calibration (`calibrate.rs`, which measures), persistence (`persist.rs`, one
//! JSON profile per adapter) and the scheduler, which only asks through [`crate::costs::Costs`].

pub mod calibrate;
pub mod frozen;
pub mod keys;
pub mod nnls;
pub mod persist;
mod suite;

pub use calibrate::{CalibrationOptions, CalibrationReport, HeldOut, HeldOutPoint, Progress};
pub use frozen::FrozenCosts;
pub use keys::{AdapterKey, CpuKey};
pub use persist::{LoadedProfile, ProfileError};

use crate::costs::{gpu_padding, kernel_variant, Costs, NodeCostQuery};
use crate::graph::Graph;
use crate::plan::{Device, Plan, StepKind};
use crate::report::{Ran, RunReport};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::RwLock;
use tandem_ops::shape::row_count;
use tandem_ops::{DType, TensorMeta};

/// Peak rates of one device: answers op kinds with no fitted entry as
/// `launch * dispatches + max(flops / peak_flops, bytes / bandwidth)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// Flop/s.
    pub peak_flops: f64,
    /// Bytes/s.
    pub bandwidth: f64,
    /// Seconds of fixed cost per kernel (dispatch or CPU task start).
    pub launch: f64,
}

impl Roofline {
    pub fn time(&self, flops: f64, bytes: f64, dispatches: usize) -> f64 {
        self.launch * dispatches.max(1) as f64
            + (flops / self.peak_flops.max(1.0)).max(bytes / self.bandwidth.max(1.0))
    }

    /// A guess for a CPU with `threads` kernel threads, used until calibration measures it.
    pub fn default_cpu(threads: usize) -> Roofline {
        Roofline {
            peak_flops: 8e9 * threads.max(1) as f64,
            bandwidth: 5e9,
            launch: 5e-6,
        }
    }

    /// A deliberately modest guess for an unmeasured GPU.
    pub fn default_gpu() -> Roofline {
        Roofline {
            peak_flops: 2e10,
            bandwidth: 1e10,
            launch: 5e-5,
        }
    }
}

/// A transfer as `latency + bytes * seconds_per_byte`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub latency: f64,
    pub seconds_per_byte: f64,
}

impl Line {
    pub fn time(&self, bytes: u64) -> f64 {
        self.latency + bytes as f64 * self.seconds_per_byte
    }
}

/// CPU-GPU link costs. `upload` and `download` exclude the synchronisation, which is
/// [`Links::sync`] (submit + map + wait of an empty-ish batch), paid once per sync point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Links {
    pub upload: Line,
    pub download: Line,
    pub sync: f64,
    /// Seconds each GPU dispatch costs beyond its kernel's timed run: the host recording it
    /// (output buffer, clear, bind group, pass) and the GPU's gaps between passes. Fitted GPU
    /// curves time kernels alone (timestamps), so GPU node times add this per dispatch; a
    /// small model of many short kernels is host-bound on a fast GPU. 0 until measured (the
    /// unmeasured prior's launch cost stands for it).
    pub dispatch: f64,
}

impl Default for Links {
    fn default() -> Links {
        Links {
            upload: Line {
                latency: 2e-5,
                seconds_per_byte: 1.0 / 5e9,
            },
            download: Line {
                latency: 2e-5,
                seconds_per_byte: 1.0 / 5e9,
            },
            sync: 1e-4,
            dispatch: 0.0,
        }
    }
}

/// One measured time with its work features (of the part that ran).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub flops: f64,
    pub bytes: f64,
    pub seconds: f64,
    /// Output rows (lines along the op's split axis) of the part that ran; 0 where unknown.
    #[serde(default)]
    pub rows: f64,
}

/// Fitted coefficients: seconds per flop, per byte, and fixed seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Coeffs {
    pub per_flop: f64,
    pub per_byte: f64,
    pub fixed: f64,
}

impl Coeffs {
    pub fn time(&self, flops: f64, bytes: f64) -> f64 {
        self.per_flop * flops + self.per_byte * bytes + self.fixed
    }
}

/// A fitted time curve: the linear model, whose cost per byte may change at a working-set
/// size, either way: a cache level that no longer holds the data makes CPU elementwise ops
/// slower per byte past L2; longer rows amortise per-row loop overheads, so pooling and
/// depthwise kernels get cheaper per byte on large planes. The change is a kink (only the
/// bytes past the point pay the other rate) or a step (every byte of a working set past it
/// does: an elementwise op whose operands fit L2 streams them at about 200 GB/s here, all of
/// them at about 125 GB/s once they do not).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Curve {
    /// `per_byte` applies to bytes up to `spill_at` when there is a kink, else to all.
    pub coeffs: Coeffs,
    /// Bytes of work where the kink is (0: none).
    pub spill_at: f64,
    /// Seconds per byte of work beyond `spill_at` (of all the work, with `spill_whole`).
    pub per_spill_byte: f64,
    /// Past `spill_at`, every byte costs `per_spill_byte` (a step), not only those beyond it.
    #[serde(default)]
    pub spill_whole: bool,
    /// Seconds per output row (see [`CurveShape::rows`]; 0 without the row term).
    pub per_row: f64,
    /// The most rows per byte of work among the samples fitted (0: no bound): a query of
    /// shorter rows than any measured pays the row term for the rows that many bytes held at
    /// the shortest rows measured, not for all of its own. Unbounded, magika's 1-D conv (260k
    /// output rows of one element) read 8.0 ms from a row term that calibration convs of 7 to
    /// 56 columns had fitted, for a conv that runs in 3.
    #[serde(default)]
    pub rows_per_byte: f64,
}

impl Curve {
    pub fn time(&self, flops: f64, bytes: f64, rows: f64) -> f64 {
        let rows = match self.rows_per_byte > 0.0 {
            true => rows.min(self.rows_per_byte * bytes),
            false => rows,
        };
        let rows = self.per_row * rows;
        let shape = CurveShape {
            spill_at: (self.spill_at > 0.0).then_some(self.spill_at),
            whole: self.spill_whole,
            rows: false,
        };
        let (below, past) = shape.split_bytes(bytes);
        self.coeffs.time(flops, below) + self.per_spill_byte * past + rows
    }
}

/// The terms a [`Curve`] is fitted with beyond `a*flops + b*bytes + c`.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct CurveShape {
    /// The working-set size where the cost per byte changes, if any.
    pub spill_at: Option<f64>,
    /// The change is a step (all bytes of a larger working set pay the second rate), not a
    /// kink.
    pub whole: bool,
    /// A cost per output row: kernels that set up each plane or row (pooling and depthwise convs copy
    /// each plane into padded phase planes) cost more per byte on small planes than the bytes
    /// alone say.
    pub rows: bool,
}

impl CurveShape {
    /// `bytes` of work as (bytes at the first rate, bytes at the spill rate).
    fn split_bytes(&self, bytes: f64) -> (f64, f64) {
        match self.spill_at {
            None => (bytes, 0.0),
            Some(c) if self.whole => match bytes > c {
                true => (0.0, bytes),
                false => (bytes, 0.0),
            },
            Some(c) => (bytes.min(c), (bytes - c).max(0.0)),
        }
    }
}

/// Working-set sizes tried as the spill point of a [`Curve`] (bytes of work, inputs +
/// outputs).
pub const SPILL_CANDIDATES: [f64; 7] = [128e3, 256e3, 512e3, 1e6, 2e6, 4e6, 8e6];

/// Fit `seconds ~ a*flops + b*bytes + c` with `a, b, c >= 0`, minimising squared *relative*
/// error (each row weighted by 1/seconds), so that 10 us ops matter as much as 100 ms ones.
/// `None` without samples.
pub fn fit(samples: &[Sample]) -> Option<Coeffs> {
    fit_spill(samples, CurveShape::default()).map(|c| c.coeffs)
}

/// [`fit`] with a kink at `spill_at` when given: `b * min(bytes, spill_at) + d * max(0, bytes -
/// spill_at)`, or a step (`b * bytes` up to `spill_at`, `d * bytes` past it), both slopes
/// non-negative and independent, and a cost per row when asked.
fn fit_spill(samples: &[Sample], shape: CurveShape) -> Option<Curve> {
    let good: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.seconds > 0.0 && s.seconds.is_finite())
        .collect();
    if good.is_empty() {
        return None;
    }
    const N: usize = 5;
    let mut a = Vec::with_capacity(good.len() * N);
    for s in &good {
        let w = 1.0 / s.seconds;
        let (below, spill) = shape.split_bytes(s.bytes);
        let rows = if shape.rows { s.rows * w } else { 0.0 };
        a.extend_from_slice(&[s.flops * w, below * w, w, spill * w, rows]);
    }
    // Column scales so the normal equations are well conditioned.
    let mut scale = [0.0f64; N];
    for row in a.chunks_exact(N) {
        for (m, v) in scale.iter_mut().zip(row) {
            *m = m.max(v.abs());
        }
    }
    let scale = scale.map(|m| if m > 0.0 { m } else { 1.0 });
    for row in a.chunks_exact_mut(N) {
        for (v, m) in row.iter_mut().zip(&scale) {
            *v /= m;
        }
    }
    let b = vec![1.0; good.len()];
    let x = nnls::nnls(&a, &b, N);
    let rows_per_byte = match shape.rows {
        true => (good.iter())
            .filter(|s| s.bytes > 0.0)
            .map(|s| s.rows / s.bytes)
            .fold(0.0, f64::max),
        false => 0.0,
    };
    Some(Curve {
        coeffs: Coeffs {
            per_flop: x[0] / scale[0],
            per_byte: x[1] / scale[1],
            fixed: x[2] / scale[2],
        },
        spill_at: shape.spill_at.unwrap_or(0.0),
        per_spill_byte: x[3] / scale[3],
        spill_whole: shape.whole && shape.spill_at.is_some(),
        per_row: x[4] / scale[4],
        rows_per_byte,
    })
}

/// Fit a [`Curve`] of the shape [`choose_shape`] picks.
pub fn fit_curve(samples: &[Sample]) -> Option<Curve> {
    fit_spill(samples, choose_shape(samples))
}

/// The terms of a [`Curve`] for these samples: the spill point (none, or one of
/// [`SPILL_CANDIDATES`], as a kink or a step) and the row term (only where the samples know their rows), chosen
/// by leave-one-out cross-validation over the samples (each interior sample by bytes predicted
/// from the others, error capped at 100%); a shape other than the plain line must cut that
/// error by 10% (and by more than 1% in total) to be kept. With fewer than 6 samples, the
/// plain linear fit.
pub fn choose_shape(samples: &[Sample]) -> CurveShape {
    let mut good: Vec<Sample> = samples
        .iter()
        .filter(|s| s.seconds > 0.0 && s.seconds.is_finite())
        .copied()
        .collect();
    if good.len() < 6 {
        return CurveShape::default();
    }
    good.sort_by(|a, b| a.bytes.total_cmp(&b.bytes));
    let loo = |shape: CurveShape| -> f64 {
        (1..good.len() - 1)
            .map(|j| {
                let rest: Vec<Sample> = good[..j].iter().chain(&good[j + 1..]).copied().collect();
                let s = good[j];
                fit_spill(&rest, shape).map_or(1.0, |c| {
                    ((c.time(s.flops, s.bytes, s.rows) - s.seconds).abs() / s.seconds).min(1.0)
                })
            })
            .sum()
    };
    let mut best = (loo(CurveShape::default()), CurveShape::default());
    let plain = best.0;
    // Only spill points with samples on both sides can be told apart from a straight line.
    let spills = SPILL_CANDIDATES.into_iter().filter(|&c| {
        let above = good.iter().filter(|s| s.bytes > c).count();
        above >= 2 && good.len() - above >= 2
    });
    let with_rows: &[bool] = if good.iter().any(|s| s.rows > 0.0) {
        &[false, true]
    } else {
        &[false]
    };
    let spills: Vec<Option<f64>> = std::iter::once(None).chain(spills.map(Some)).collect();
    for &rows in with_rows {
        for (&spill_at, whole) in spills.iter().flat_map(|s| [(s, false), (s, true)]) {
            let shape = CurveShape {
                spill_at,
                whole,
                rows,
            };
            if shape == CurveShape::default() || (whole && spill_at.is_none()) {
                continue;
            }
            let e = loo(shape);
            if e < best.0 && e < 0.9 * plain && plain - e > 0.01 {
                best = (e, shape);
            }
        }
    }
    best.1
}

/// The median of a non-empty list.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Samples kept per key from calibration and, separately, from runs (oldest dropped first):
/// runs keep up to 64 shapes of the op kind `MAX_SAME_POINT` times each, the distinct shapes
/// of a few models, so one model's runs do not push out the times of the shapes others ran
/// (`Entry::measured`).
pub const MAX_CALIBRATION_SAMPLES: usize = 64;
pub const MAX_OBSERVED_SAMPLES: usize = 512;
/// Observations of one feature point kept (repeated runs of the same shape must not push out
/// every other shape); 8, whose median a run or two in a slow spell of the host moves less.
const MAX_SAME_POINT: usize = 8;

/// Which fitted entry answers a query.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryKey {
    pub op: String,
    pub dtype: DType,
    pub device: Device,
}

/// Devices in a fixed order (CPU first), for sorted maps.
pub(crate) fn device_rank(d: Device) -> u8 {
    match d {
        Device::Cpu => 0,
        Device::Gpu => 1,
    }
}

pub(crate) fn rank_device(r: u8) -> Device {
    if r == 0 {
        Device::Cpu
    } else {
        Device::Gpu
    }
}

impl Ord for EntryKey {
    fn cmp(&self, o: &EntryKey) -> std::cmp::Ordering {
        (&self.op, self.dtype, device_rank(self.device)).cmp(&(
            &o.op,
            o.dtype,
            device_rank(o.device),
        ))
    }
}

impl PartialOrd for EntryKey {
    fn partial_cmp(&self, o: &EntryKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) coeffs: Option<Curve>,
    /// Median measured/fitted ratio over the run observations (1 without any): runs happen in
    /// a context calibration does not see (the other device busy, caches), so the recent
    /// evidence corrects the whole curve, not only the shapes it was measured at.
    pub(crate) scale: f64,
    pub(crate) calibration: Vec<Sample>,
    pub(crate) observed: VecDeque<Sample>,
    /// Each observed (flops, bytes) point's median time, which answers a query of exactly that
    /// work: the curve times `scale` is a compromise between every shape observed, from every
    /// model that ran (in the profile the bench's models share, squeezenet's first plan read
    /// 1.45-1.59x its runs without this; docs/bench.md, "Learnt costs saved with the
    /// profile").
    pub(crate) measured: HashMap<(u64, u64), f64>,
    pub(crate) dirty: bool,
    /// The curve shape chosen by [`choose_shape`]'s cross-validation, once chosen: refits
    /// after runs reuse it, since choosing costs hundreds of fits.
    pub(crate) spill: Option<CurveShape>,
}

impl Default for Entry {
    fn default() -> Entry {
        Entry {
            coeffs: None,
            scale: 1.0,
            calibration: Vec::new(),
            observed: VecDeque::new(),
            measured: HashMap::new(),
            dirty: true,
            spill: None,
        }
    }
}

impl Entry {
    fn samples(&self) -> Vec<Sample> {
        self.calibration
            .iter()
            .chain(self.observed.iter())
            .copied()
            .collect()
    }

    /// Distinct (flops, bytes) points: fewer than 3 cannot pin three coefficients.
    fn distinct_points(&self) -> usize {
        let mut pts: Vec<(u64, u64)> = self
            .calibration
            .iter()
            .chain(self.observed.iter())
            .map(|s| point(s.flops, s.bytes))
            .collect();
        pts.sort_unstable();
        pts.dedup();
        pts.len()
    }

    /// Keep a run observation: a point's oldest goes once it has [`MAX_SAME_POINT`], else the
    /// entry's oldest once it has [`MAX_OBSERVED_SAMPLES`].
    fn push_observed(&mut self, s: Sample) {
        let mut same = (self.observed.iter().enumerate())
            .filter(|(_, o)| o.flops == s.flops && o.bytes == s.bytes);
        let first = same.next().map(|(i, _)| i);
        if let (Some(i), true) = (first, same.count() + 1 >= MAX_SAME_POINT) {
            self.observed.remove(i);
        } else if self.observed.len() >= MAX_OBSERVED_SAMPLES {
            self.observed.pop_front();
        }
        self.observed.push_back(s);
        self.dirty = true;
    }

    fn refit(&mut self) {
        let samples = self.samples();
        let shape = *self.spill.get_or_insert_with(|| choose_shape(&samples));
        self.coeffs = fit_spill(&samples, shape);
        self.scale = 1.0;
        if let (Some(c), false) = (self.coeffs, self.observed.is_empty()) {
            let ratios: Vec<f64> = self
                .observed
                .iter()
                .map(|s| s.seconds / c.time(s.flops, s.bytes, s.rows))
                .filter(|r| r.is_finite() && *r > 0.0)
                .collect();
            if !ratios.is_empty() {
                self.scale = median(ratios);
            }
        }
        let mut by_point: HashMap<(u64, u64), Vec<f64>> = HashMap::new();
        for s in &self.observed {
            (by_point.entry(point(s.flops, s.bytes)).or_default()).push(s.seconds);
        }
        self.measured = (by_point.into_iter())
            .map(|(k, times)| (k, median(times)))
            .collect();
        self.dirty = false;
    }
}

/// The key of a (flops, bytes) point: observations and queries of one node compute both the
/// same way, so equal work has equal bits.
fn point(flops: f64, bytes: f64) -> (u64, u64) {
    (flops.to_bits(), bytes.to_bits())
}

/// The cost model. Cheap to query from many threads; `observe` marks entries for a lazy refit.
#[derive(Debug)]
pub struct CostModel {
    pub adapter: Option<AdapterKey>,
    pub cpu: CpuKey,
    /// [`keys::shader_hash`] of the shaders the GPU entries were measured with.
    pub shaders: String,
    /// [`keys::cpu_kernels_hash`] of the CPU kernels the CPU entries were measured with.
    pub cpu_kernels: String,
    pub cpu_prior: Roofline,
    pub gpu_prior: Roofline,
    pub links: Links,
    /// True when GPU node times in run reports come from timestamp queries (else they are a
    /// batch's wall time shared out, too coarse to learn from).
    pub gpu_timestamps: bool,
    entries: RwLock<BTreeMap<EntryKey, Entry>>,
    families: RwLock<HashMap<(&'static str, Device), Coeffs>>,
}

impl Clone for CostModel {
    fn clone(&self) -> CostModel {
        CostModel {
            adapter: self.adapter.clone(),
            cpu: self.cpu.clone(),
            shaders: self.shaders.clone(),
            cpu_kernels: self.cpu_kernels.clone(),
            cpu_prior: self.cpu_prior,
            gpu_prior: self.gpu_prior,
            links: self.links,
            gpu_timestamps: self.gpu_timestamps,
            entries: RwLock::new(self.entries.read().unwrap().clone()),
            families: RwLock::new(self.families.read().unwrap().clone()),
        }
    }
}

/// The op type of a cost key (`Conv/depthwise` -> `Conv`).
pub fn base_op(key: &str) -> &str {
    key.split_once('/').map_or(key, |(op, _)| op)
}

/// The op family whose pooled fit answers op kinds of it that were never measured.
pub fn family(op: &str) -> &'static str {
    let op = base_op(op);
    match op {
        "MatMul" | "Gemm" | "Attention" => "matmul",
        "Conv" | "ConvTranspose" => "conv",
        "Softmax" | "LogSoftmax" => "softmax",
        "LayerNormalization" | "InstanceNormalization" | "BatchNormalization" | "LRN" => "norm",
        "MaxPool" | "AveragePool" | "GlobalAveragePool" | "GlobalMaxPool" => "pool",
        "ArgMax" | "ArgMin" => "reduce",
        o if o.starts_with("Reduce") => "reduce",
        "Transpose" | "Concat" | "Split" | "Slice" | "Gather" | "GatherElements" | "Expand"
        | "Tile" | "Pad" | "Resize" | "Upsample" | "Trilu" | "EyeLike" | "Range"
        | "ConstantOfShape" => "movement",
        _ => "elementwise",
    }
}

impl CostModel {
    /// A model with no measurements: every answer comes from the default priors.
    pub fn unmeasured(adapter: Option<AdapterKey>, cpu: CpuKey) -> CostModel {
        let threads = cpu.threads;
        CostModel {
            adapter,
            cpu,
            shaders: keys::shader_hash(),
            cpu_kernels: keys::cpu_kernels_hash().to_string(),
            cpu_prior: Roofline::default_cpu(threads),
            gpu_prior: Roofline::default_gpu(),
            links: Links::default(),
            gpu_timestamps: false,
            entries: RwLock::new(BTreeMap::new()),
            families: RwLock::new(HashMap::new()),
        }
    }

    fn prior(&self, device: Device) -> &Roofline {
        match device {
            Device::Cpu => &self.cpu_prior,
            Device::Gpu => &self.gpu_prior,
        }
    }

    /// Add calibration samples for a key (kept apart from run observations) and refit it.
    pub fn add_calibration(&self, key: EntryKey, samples: &[Sample]) {
        let mut entries = self.entries.write().unwrap();
        let e = entries.entry(key).or_default();
        e.calibration.extend_from_slice(samples);
        let excess = e.calibration.len().saturating_sub(MAX_CALIBRATION_SAMPLES);
        e.calibration.drain(..excess);
        e.spill = None;
        e.refit();
        drop(entries);
        self.refit();
    }

    /// Record a measured time of `fraction` of a node's rows on `device`. The entry is refitted
    /// lazily, on its next query.
    pub fn observe_fraction(
        &self,
        q: &NodeCostQuery<'_>,
        device: Device,
        fraction: f64,
        seconds: f64,
    ) {
        if !(seconds > 0.0 && seconds.is_finite() && fraction > 0.0) {
            return;
        }
        let f = fraction.min(1.0);
        let s = Sample {
            flops: q.flops_on(device, f),
            bytes: (q.work.bytes_read + q.work.bytes_written) as f64 * f,
            seconds,
            rows: q.rows * f,
        };
        let key = EntryKey {
            op: q.cost_key_on(device).into_owned(),
            dtype: q.dtype,
            device,
        };
        let mut entries = self.entries.write().unwrap();
        entries.entry(key).or_default().push_observed(s);
    }

    /// Take in the run observations of `saved` (the entries of this model's profile as another
    /// process saved it since this one loaded it) that this model does not hold, as older than
    /// its own, and its entries this model lacks (stale, fitted when next used); the caps then
    /// keep the newest, as if this process had seen the other's runs first. So two processes
    /// saving one profile keep both their lessons.
    pub(crate) fn absorb_observed(&self, saved: BTreeMap<EntryKey, Entry>) {
        let mut entries = self.entries.write().unwrap();
        for (key, theirs) in saved {
            let Some(e) = entries.get_mut(&key) else {
                entries.insert(key, theirs);
                continue;
            };
            let held = |s: &Sample| e.observed.iter().any(|o| o == s);
            let older: Vec<Sample> = theirs.observed.into_iter().filter(|s| !held(s)).collect();
            if older.is_empty() {
                continue;
            }
            let ours = std::mem::take(&mut e.observed);
            for s in older.into_iter().chain(ours) {
                e.push_observed(s);
            }
        }
    }

    /// Record a measured time of a whole node on `device`.
    pub fn observe(&self, q: &NodeCostQuery<'_>, device: Device, seconds: f64) {
        self.observe_fraction(q, device, 1.0, seconds);
    }

    /// Learn from one run: every node that ran on a device (not views or folded nodes) with its
    /// measured time, and both parts of split nodes (CPU rows: `time`, GPU rows: `gpu_time`).
    /// GPU times are used only when they came from timestamp queries. Returns the number of
    /// observations taken. Cheap: refits happen lazily on the next query.
    pub fn observe_report(&self, graph: &Graph, plan: &Plan, report: &RunReport) -> usize {
        // Report entries are matched to plan steps by node name (names are unique in the
        // graph; a duplicated name is skipped rather than guessed).
        let mut by_name: HashMap<&str, Option<&crate::plan::Step>> = HashMap::new();
        for step in &plan.steps {
            let Some(node) = graph.nodes.get(step.node) else {
                continue;
            };
            by_name
                .entry(node.name.as_str())
                .and_modify(|e| *e = None)
                .or_insert(Some(step));
        }
        let mut taken = 0;
        for r in &report.nodes {
            let Some(Some(step)) = by_name.get(&*r.name) else {
                continue;
            };
            let node = &graph.nodes[step.node];
            if *r.op_type != *node.op_type || matches!(step.kind, StepKind::View) {
                continue;
            }
            let outs = &step.outputs;
            if outs.is_empty() {
                continue;
            }
            let refs: Vec<&TensorMeta> = step.inputs.iter().collect();
            let total = row_count(&outs[0].shape, node.op.split_axis(&refs, outs)).max(1);
            let q = NodeCostQuery {
                op_type: &node.op_type,
                dtype: outs[0].dtype,
                work: node.op.work(&refs, outs),
                dispatches: 1,
                variant: kernel_variant(node.op.as_ref(), &refs, outs),
                gpu_pad: gpu_padding(&node.op_type, outs),
                rows: total as f64,
            };
            // (device, fraction of the rows, measured time)
            let parts: Vec<(Device, f64, Option<std::time::Duration>)> = match r.ran {
                Ran::On(device) => {
                    vec![(device, step.rows.len() as f64 / total as f64, Some(r.time))]
                }
                Ran::Split { cut, rows } if rows > 0 => vec![
                    (Device::Cpu, cut as f64 / rows as f64, Some(r.time)),
                    (
                        Device::Gpu,
                        (rows - cut.min(rows)) as f64 / rows as f64,
                        r.gpu_time,
                    ),
                ],
                _ => Vec::new(),
            };
            for (device, fraction, time) in parts {
                let Some(time) = time else { continue };
                if device == Device::Gpu && !self.gpu_timestamps {
                    continue;
                }
                if fraction > 0.0 && !time.is_zero() {
                    self.observe_fraction(&q, device, fraction, time.as_secs_f64());
                    taken += 1;
                }
            }
        }
        taken
    }

    /// Refit every entry changed since its last fit and the family fits (an explicit, eager
    /// version of what queries do lazily; call before saving).
    pub fn refit(&self) {
        let mut entries = self.entries.write().unwrap();
        for e in entries.values_mut().filter(|e| e.dirty) {
            e.refit();
        }
        let mut pooled: HashMap<(&'static str, Device), Vec<Sample>> = HashMap::new();
        for (k, e) in entries.iter() {
            pooled
                .entry((family(&k.op), k.device))
                .or_default()
                .extend(e.calibration.iter().copied());
        }
        let mut families = self.families.write().unwrap();
        families.clear();
        for (k, samples) in pooled {
            if let Some(c) = fit(&samples) {
                families.insert(k, c);
            }
        }
    }

    /// The answer without the measured entry of `op` itself: its family's pooled fit, else the
    /// device's roofline prior.
    fn fallback(&self, op: &str, device: Device, flops: f64, bytes: f64, dispatches: usize) -> f64 {
        match self.families.read().unwrap().get(&(family(op), device)) {
            Some(c) => c.time(flops, bytes),
            None => self.prior(device).time(flops, bytes, dispatches),
        }
    }

    /// Predicted seconds for `flops` and `bytes` of cost key `op` (an op type, or
    /// `op/variant`) on `device`. Lookup order: the (op, dtype, device) entry, the (op, f32,
    /// device) entry, then the same two for the variant's op type, the family's pooled fit, the
    /// roofline prior. An entry with fewer than 3 distinct measured shapes only rescales the
    /// fallback by its median measured/fallback ratio.
    pub fn predict(
        &self,
        op: &str,
        dtype: DType,
        device: Device,
        flops: f64,
        bytes: f64,
        dispatches: usize,
    ) -> f64 {
        self.predict_rows(op, dtype, device, (flops, bytes, 0.0), dispatches)
    }

    /// [`CostModel::predict`] of work `(flops, bytes, output rows)`.
    pub fn predict_rows(
        &self,
        op: &str,
        dtype: DType,
        device: Device,
        (flops, bytes, rows): (f64, f64, f64),
        dispatches: usize,
    ) -> f64 {
        let mut keys = Vec::with_capacity(4);
        for name in [op, base_op(op)] {
            for d in [dtype, DType::F32] {
                let key = EntryKey {
                    op: name.to_string(),
                    dtype: d,
                    device,
                };
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
        for key in &keys {
            let needs_refit = match self.entries.read().unwrap().get(key) {
                None => continue,
                Some(e) => e.dirty,
            };
            if needs_refit {
                if let Some(e) = self.entries.write().unwrap().get_mut(key) {
                    if e.dirty {
                        e.refit();
                    }
                }
            }
            let entries = self.entries.read().unwrap();
            let Some(e) = entries.get(key) else { continue };
            if let Some(&t) = e.measured.get(&point(flops, bytes)) {
                return t;
            }
            let Some(c) = e.coeffs else { continue };
            if e.distinct_points() >= 3 {
                return e.scale * c.time(flops, bytes, rows).max(0.0);
            }
            let ratios: Vec<f64> = e
                .samples()
                .iter()
                .map(|s| s.seconds / self.fallback(op, device, s.flops, s.bytes, dispatches))
                .filter(|r| r.is_finite() && *r > 0.0)
                .collect();
            if ratios.is_empty() {
                continue;
            }
            return median(ratios) * self.fallback(op, device, flops, bytes, dispatches);
        }
        self.fallback(op, device, flops, bytes, dispatches)
    }

    /// The fitted coefficients of a key, if it has any (refitting it if stale), before the
    /// correction by run observations.
    pub fn coeffs(&self, key: &EntryKey) -> Option<Coeffs> {
        self.curve(key).map(|c| c.coeffs)
    }

    /// The fitted curve of a key (linear coefficients and spill term), refitting it if stale.
    pub fn curve(&self, key: &EntryKey) -> Option<Curve> {
        let mut entries = self.entries.write().unwrap();
        let e = entries.get_mut(key)?;
        if e.dirty {
            e.refit();
        }
        e.coeffs
    }

    /// Keys with fitted entries, sorted.
    pub fn keys(&self) -> Vec<EntryKey> {
        self.entries.read().unwrap().keys().cloned().collect()
    }

    pub(crate) fn entries_snapshot(&self) -> BTreeMap<EntryKey, Entry> {
        self.entries.read().unwrap().clone()
    }

    pub(crate) fn set_entries(&self, entries: BTreeMap<EntryKey, Entry>) {
        *self.entries.write().unwrap() = entries;
        self.refit();
    }
}

impl Costs for CostModel {
    fn node_time(&self, q: &NodeCostQuery<'_>, device: Device, fraction: f64) -> f64 {
        if fraction <= 0.0 {
            return 0.0;
        }
        let f = fraction.min(1.0);
        let flops = q.flops_on(device, f);
        let bytes = (q.work.bytes_read + q.work.bytes_written) as f64 * f;
        let work = (flops, bytes, q.rows * f);
        let host = match device {
            Device::Gpu => self.links.dispatch * q.dispatches.max(1) as f64,
            Device::Cpu => 0.0,
        };
        host + self.predict_rows(&q.cost_key_on(device), q.dtype, device, work, q.dispatches)
    }

    fn transfer_time(&self, bytes: u64, to: Device) -> f64 {
        match to {
            Device::Gpu => self.links.upload.time(bytes),
            Device::Cpu => self.links.download.time(bytes),
        }
    }

    fn sync_time(&self) -> f64 {
        self.links.sync
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_known_coefficients() {
        let truth = Coeffs {
            per_flop: 2e-11,
            per_byte: 3e-10,
            fixed: 4e-5,
        };
        let samples: Vec<Sample> = (0..12)
            .map(|i| {
                let flops = 1e5 * 3f64.powi(i % 7) + 1e4 * i as f64;
                let bytes = 1e4 * 2f64.powi(i % 5);
                Sample {
                    flops,
                    bytes,
                    seconds: truth.time(flops, bytes),
                    rows: 0.0,
                }
            })
            .collect();
        let c = fit(&samples).unwrap();
        for (got, want) in [
            (c.per_flop, truth.per_flop),
            (c.per_byte, truth.per_byte),
            (c.fixed, truth.fixed),
        ] {
            assert!((got - want).abs() <= 1e-6 * want, "{c:?} vs {truth:?}");
        }
    }

    #[test]
    fn fit_curve_finds_a_cache_spill_and_keeps_lines_straight() {
        // 100 GB/s up to 1 MB of work, 25% slower per byte beyond: the curve of a CPU
        // elementwise op.
        let per_byte = 1e-11;
        let truth = |b: f64| 2e-7 + per_byte * b + 0.25 * per_byte * (b - 1e6).max(0.0);
        let sizes: Vec<f64> = (0..12).map(|i| 12e3 * 1.6f64.powi(i)).collect();
        let spilled: Vec<Sample> = sizes
            .iter()
            .map(|&b| Sample {
                flops: b / 12.0,
                bytes: b,
                seconds: truth(b),
                rows: 0.0,
            })
            .collect();
        let c = fit_curve(&spilled).unwrap();
        assert_eq!(c.spill_at, 1e6, "{c:?}");
        for b in [5e5, 3e6, 1e7] {
            let rel = (c.time(b / 12.0, b, 0.0) - truth(b)).abs() / truth(b);
            assert!(rel < 0.01, "{b}: {rel}");
        }
        let straight: Vec<Sample> = sizes
            .iter()
            .map(|&b| Sample {
                flops: b / 12.0,
                bytes: b,
                seconds: 2e-7 + per_byte * b,
                rows: 0.0,
            })
            .collect();
        assert_eq!(fit_curve(&straight).unwrap().spill_at, 0.0);
    }

    #[test]
    fn fit_curve_steps_where_the_whole_working_set_leaves_the_cache() {
        // 200 GB/s while the operands fit 1 MB, 125 GB/s for all of them beyond: a CPU
        // elementwise op measured on warm caches.
        let truth = |b: f64| 2e-7 + b / if b <= 1e6 { 200e9 } else { 125e9 };
        let samples: Vec<Sample> = (0..12)
            .map(|i| 12e3 * 1.6f64.powi(i))
            .map(|b| Sample {
                flops: b / 12.0,
                bytes: b,
                seconds: truth(b),
                rows: 0.0,
            })
            .collect();
        let c = fit_curve(&samples).unwrap();
        assert!(c.spill_whole && c.spill_at == 1e6, "{c:?}");
        for b in [7.5e5, 9.9e5, 1.2e6, 1e7] {
            let rel = (c.time(b / 12.0, b, 0.0) - truth(b)).abs() / truth(b);
            assert!(rel < 0.01, "{b}: {rel}");
        }
    }

    #[test]
    fn fit_curve_takes_a_cost_per_row_where_planes_differ() {
        // A pooling-like kernel: 20 ns per output row on top of its bytes, measured on planes
        // of different widths (same bytes, 2x the rows on the narrower plane).
        let truth = |bytes: f64, rows: f64| 1e-6 + 3e-11 * bytes + 2e-8 * rows;
        let shapes: Vec<(f64, f64)> = (0..10)
            .map(|i| {
                let bytes = 1e4 * 2f64.powi(i);
                (bytes, bytes / 4.0 / [28.0, 56.0, 14.0][i as usize % 3])
            })
            .collect();
        let samples: Vec<Sample> = shapes
            .iter()
            .map(|&(bytes, rows)| Sample {
                flops: bytes / 4.0,
                bytes,
                seconds: truth(bytes, rows),
                rows,
            })
            .collect();
        let shape = choose_shape(&samples);
        assert!(shape.rows, "{shape:?}");
        let c = fit_curve(&samples).unwrap();
        for (bytes, rows) in [(3e5, 3e5 / 4.0 / 14.0), (3e5, 3e5 / 4.0 / 112.0)] {
            let rel = (c.time(bytes / 4.0, bytes, rows) - truth(bytes, rows)).abs();
            assert!(rel / truth(bytes, rows) < 0.01, "{bytes} {rows}: {c:?}");
        }
        // Rows shorter than any measured pay the row term of the shortest measured (14).
        let (bytes, shortest) = (3e5, 3e5 / 4.0 / 14.0);
        let t = |rows| c.time(bytes / 4.0, bytes, rows);
        assert!((t(bytes / 4.0 / 7.0) - t(shortest)).abs() < 1e-12 * t(shortest));
        // Samples that do not know their rows never get the term.
        let unknown: Vec<Sample> = samples.iter().map(|s| Sample { rows: 0.0, ..*s }).collect();
        assert!(!choose_shape(&unknown).rows);
    }

    #[test]
    fn a_row_term_does_not_extrapolate_to_rows_shorter_than_measured() {
        // This Zen 4's Conv/kxk calibration (output rows of 7 to 56 columns), where leave-one-
        // out chose a row term, and magika's 1-D conv: 512 x 508 output rows of one column,
        // measured at 2.93-3.03 ms in runs. The unbounded row term read 8.0 ms.
        let measured = [
            (593920.0, 29248.0, 7.4085e-6, 256.0),
            (2367488.0, 67712.0, 2.05705e-5, 512.0),
            (9453568.0, 172288.0, 5.91525e-5, 1024.0),
            (9445376.0, 344576.0, 5.4656e-5, 1024.0),
            (28913920.0, 1255936.0, 1.4792e-4, 1792.0),
            (57815296.0, 2460672.0, 2.86075e-4, 1792.0),
        ];
        let samples: Vec<Sample> = (measured.iter())
            .map(|&(flops, bytes, seconds, rows)| Sample {
                flops,
                bytes,
                seconds,
                rows,
            })
            .collect();
        let c = fit_curve(&samples).unwrap();
        assert!(c.per_row > 0.0, "the case needs a row term: {c:?}");
        let t = c.time(665845760.0, 4186112.0, 260096.0);
        assert!(
            (2.0e-3..4.5e-3).contains(&t),
            "{t} s for a 3 ms conv: {c:?}"
        );
    }

    #[test]
    fn family_names() {
        assert_eq!(family("Gemm"), "matmul");
        assert_eq!(family("ReduceL2"), "reduce");
        assert_eq!(family("Sin"), "elementwise");
        assert_eq!(family("Gather"), "movement");
    }
}
