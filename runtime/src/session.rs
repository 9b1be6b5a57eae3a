//! The public API: load a model once, run it many times.
//!
//! Sits between callers (the CLI, apps, the bench suite, the web demo) and the importer,
//! planner and executor. A `Session` is `Send + Sync`: plans are cached per input-shape
//! signature behind a lock, runs share the GPU and the constant uploads.

use crate::cost::{CostModel, ProfileError};
use crate::exec::{self, GpuConstants};
use crate::gpu::Gpu;
use crate::graph::{Dim, Graph};
use crate::plan::{self, Device, Placement, Plan, Request, Selector};
use crate::report::RunReport;
use crate::schedule::Policy;
use crate::{import, Error, Result};
use std::borrow::Borrow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tandem_ops::{Tensor, TensorMeta};

mod cache;
mod handoff;
mod pool;
mod spin;
mod spread;
use cache::{learns_from_run, uses_gpu, CachedPlan};
pub use cache::{LEARN_EVERY, LEARN_FIRST, WARM_UP_RUNS};

/// How a session is set up.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub placement: Placement,
    /// Per-node overrides, by node name or op type; later entries win.
    pub overrides: Vec<(Selector, Device)>,
    /// CPU threads for kernels (default: all cores).
    pub cpu_threads: Option<usize>,
    /// Whether those threads are pinned, one to a CPU (default: no).
    pub pin_threads: bool,
    /// A GPU to share between sessions; when `None`, one is opened if the placement needs it
    /// (`auto` opens one if the machine has any, and runs on the CPU alone otherwise).
    pub gpu: Option<Arc<Gpu>>,
    /// The cost model `auto` plans with; when `None`, the profile saved for this adapter and CPU
    /// is loaded (see [`CostModel::load_or_calibrate`]).
    pub cost_model: Option<Arc<CostModel>>,
    /// The file of that profile (default: `$TANDEM_PROFILE`, else one per adapter and CPU in
    /// the platform cache directory; a named file keeps one profile per adapter and CPU); see
    /// [`SessionOptions::cost_profile`].
    pub cost_profile: Option<PathBuf>,
    /// The scheduling policy of `auto` (default HEFT with row splits).
    pub policy: Policy,
    /// Time `auto` may spend calibrating when no saved profile fits this adapter and CPU.
    pub calibration_budget: std::time::Duration,
    /// Most bytes of GPU buffers a plan may hold (see [`SessionOptions::max_gpu_memory`]).
    pub max_gpu_memory: Option<u64>,
    /// Most host bytes a run may need (see [`SessionOptions::max_host_memory`]).
    pub max_host_memory: Option<u64>,
    /// Fold BatchNormalization and activations into Convs at load time (see
    /// [`SessionOptions::fuse`]; default on).
    pub fuse: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            placement: Placement::Auto,
            overrides: Vec::new(),
            cpu_threads: None,
            pin_threads: false,
            gpu: None,
            cost_model: None,
            cost_profile: None,
            policy: Policy::HeftSplit,
            calibration_budget: std::time::Duration::from_secs(10),
            max_gpu_memory: None,
            max_host_memory: None,
            fuse: true,
        }
    }
}

impl SessionOptions {
    pub fn placement(mut self, p: Placement) -> Self {
        self.placement = p;
        self
    }

    /// Force the nodes matched by `selector` onto `device`.
    pub fn force(mut self, selector: Selector, device: Device) -> Self {
        self.overrides.push((selector, device));
        self
    }

    pub fn cpu_threads(mut self, n: usize) -> Self {
        self.cpu_threads = Some(n);
        self
    }

    /// Pin the CPU kernel threads one to a CPU (thread `i` to the `i`-th CPU the process may run
    /// on; Linux and Android) for the session's life, instead of leaving them to the OS
    /// scheduler ([`Session::pinned_cpus`] says where they went). Unpinned, a run that follows
    /// a pause of 2 ms or more already keeps its threads on CPUs of their own until it ends
    /// (module `session::spread`), as a scheduler that packs woken threads onto busy CPUs (a KVM
    /// guest here) would otherwise run it on one CPU for its first milliseconds.
    pub fn pin_threads(mut self, pin: bool) -> Self {
        self.pin_threads = pin;
        self
    }

    pub fn gpu(mut self, gpu: Arc<Gpu>) -> Self {
        self.gpu = Some(gpu);
        self
    }

    pub fn cost_model(mut self, model: Arc<CostModel>) -> Self {
        self.cost_model = Some(model);
        self
    }

    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Keep each plan's GPU buffers (uploaded constants + live intermediates) within `bytes`:
    /// nodes past it run on the CPU, each with the reason in the run report. A device the
    /// session opens itself is also capped at `bytes` (allocations past it fail as out of
    /// memory and that node runs on the CPU); a shared device's cap is its owner's
    /// (`Gpu::set_memory_cap`).
    pub fn max_gpu_memory(mut self, bytes: u64) -> Self {
        self.max_gpu_memory = Some(bytes);
        self
    }

    /// Fold each BatchNormalization with constant parameters into the Conv before it, and a
    /// following Relu, LeakyRelu, Clip, Sigmoid or SiLU into the Conv as an epilogue, after
    /// dropping nodes that repeat an earlier node's work (`crate::fuse`); `false` keeps the
    /// graph as imported, but for the row padding of constant Gemm weights (`crate::layout`,
    /// which never changes a result). Default `true`.
    pub fn fuse(mut self, on: bool) -> Self {
        self.fuse = on;
        self
    }

    /// Read `auto`'s cost profile from `path` (calibrating and saving one there if it holds
    /// none for this adapter and CPU), and save what runs teach to it
    /// ([`Session::save_cost_profile`]): for an app that keeps its own files, or a machine
    /// without a cache directory (where every process would calibrate again).
    pub fn cost_profile(mut self, path: impl Into<PathBuf>) -> Self {
        self.cost_profile = Some(path.into());
        self
    }

    /// Refuse, with `Error::ResourceLimit` and before allocating, a run whose host working set
    /// (inputs + constants + peak live intermediates, from the plan) exceeds `bytes`. The
    /// host buffers a session keeps for reuse between runs stay within what is left of `bytes`
    /// above that working set (without a cap: up to three times the peak of live
    /// intermediates, trimmed to what runs take).
    pub fn max_host_memory(mut self, bytes: u64) -> Self {
        self.max_host_memory = Some(bytes);
        self
    }
}

/// Where a model comes from.
pub enum ModelSource<'a> {
    Path(&'a Path),
    Bytes(&'a [u8]),
}

impl<'a> From<&'a Path> for ModelSource<'a> {
    fn from(p: &'a Path) -> Self {
        ModelSource::Path(p)
    }
}

impl<'a> From<&'a [u8]> for ModelSource<'a> {
    fn from(b: &'a [u8]) -> Self {
        ModelSource::Bytes(b)
    }
}

/// A loaded model, ready to run.
pub struct Session {
    graph: Graph,
    /// The GPU, replaced by a new device after it was lost (see `recover.rs`).
    gpu: crate::recover::GpuSlot,
    limits: crate::limits::Limits,
    /// Why `auto` runs without a GPU, when it does.
    gpu_missing: Option<String>,
    pool: Arc<rayon::ThreadPool>,
    /// The CPU each of `pool`'s workers is pinned to (empty: none).
    pinned: Vec<usize>,
    /// How a run after a pause spreads `pool`'s workers over the CPUs.
    spread: spread::Spread,
    placement: Placement,
    overrides: Vec<(Selector, Device)>,
    policy: Policy,
    costs: Option<Arc<CostModel>>,
    /// The file `costs` was loaded from (or calibrated into), where it is saved again.
    profile_file: Option<PathBuf>,
    /// Observations this session's runs gave `costs` (nothing to save while 0).
    observations: std::sync::atomic::AtomicUsize,
    warnings: Vec<String>,
    plans: Mutex<HashMap<Vec<Vec<usize>>, CachedPlan>>,
    /// Set once a plan needed the contents of small integer inputs (see `plan_for`).
    plans_by_value: std::sync::atomic::AtomicBool,
    constants: GpuConstants,
    /// Node name -> label (`Conv+BatchNormalization+Relu`) of the Convs fusion made.
    fused: Arc<HashMap<String, String>>,
    /// The nodes fusion dropped for repeating an earlier one.
    merged: Arc<Vec<crate::fuse::repeated::Merged>>,
    /// Host buffers kept between runs ([`exec::HostBuffers`]): one store per run in flight, at
    /// most [`KEPT_STORES`] kept.
    host_buffers: Mutex<Vec<exec::HostBuffers>>,
    /// The last runs' times per input shapes, on the pool and on the caller's thread: where the
    /// next runs, and how long to wait for it ([`handoff::run_on`]).
    last_run: handoff::Expected,
}

/// Stores of host buffers a session keeps between runs (more concurrent runs allocate afresh).
const KEPT_STORES: usize = 2;

/// A run whose measured time differs from the plan's prediction by more than this fraction
/// counts as a miss.
pub const REPLAN_MARGIN: f64 = 0.5;
/// After this many consecutive misses the plan is rebuilt from the (meanwhile refined) model.
pub const REPLAN_AFTER: usize = 3;

/// A model input or output as declared.
#[derive(Debug, Clone)]
pub struct IoInfo {
    pub name: String,
    pub dtype: Option<tandem_ops::DType>,
    pub shape: Option<Vec<Dim>>,
}

impl IoInfo {
    /// The declared shape with every symbolic dimension taken as 1 (no declared shape: a
    /// scalar), e.g. for feeding zeros to a model of unknown use.
    pub fn shape_or_ones(&self) -> Vec<usize> {
        let dims = self.shape.as_deref().unwrap_or_default();
        dims.iter()
            .map(|d| match d {
                Dim::Fixed(n) => *n,
                Dim::Symbolic(_) => 1,
            })
            .collect()
    }
}

impl Session {
    /// Load and check a model. Fails with a typed error for an unreadable or invalid model or an
    /// unsupported node (named), and when the GPU is asked for but none can be opened.
    pub fn new<'a>(model: impl Into<ModelSource<'a>>, options: SessionOptions) -> Result<Session> {
        tandem_ops::cpu_gemm::read_cache_sizes_in_background();
        let mut graph = match model.into() {
            ModelSource::Path(p) => import::import_file(p)?,
            ModelSource::Bytes(b) => import::import_bytes(b, None)?,
        };
        let summary = match options.fuse {
            true => crate::fuse::fuse(&mut graph),
            false => Default::default(),
        };
        let fused: HashMap<String, String> = summary.fused.into_iter().collect();
        crate::layout::store_weights(&mut graph);
        let wants_gpu = options.placement == Placement::Gpu
            || options.overrides.iter().any(|(_, d)| *d == Device::Gpu);
        let mut gpu_missing = None;
        let own = crate::gpu::GpuOptions {
            max_memory: options.max_gpu_memory,
            ..Default::default()
        };
        let gpu = match (options.gpu, wants_gpu, options.placement) {
            (Some(g), _, _) => Some(g),
            (None, true, _) => Some(Arc::new(Gpu::with_options(own)?)),
            (None, false, Placement::Auto) => match Gpu::with_options(own) {
                Ok(g) => Some(Arc::new(g)),
                Err(e) => {
                    gpu_missing = Some(e.to_string());
                    None
                }
            },
            (None, false, _) => None,
        };
        let pool::CpuPool {
            pool,
            pinned,
            warning,
            spread,
        } = pool::cpu_pool(options.cpu_threads.unwrap_or(0), options.pin_threads)?;
        let mut warnings: Vec<String> = warning.into_iter().collect();
        let mut profile_file = None;
        let costs = match (options.placement, options.cost_model) {
            (_, Some(c)) => Some(c),
            (Placement::Auto, None) => {
                let loaded = CostModel::load_or_calibrate(
                    gpu.as_deref(),
                    pool.current_num_threads(),
                    options.cost_profile.as_deref(),
                    options.calibration_budget,
                );
                let warning = loaded.warning.map(|w| format!("cost profile: {w}"));
                warnings.extend(warning);
                profile_file = loaded.path;
                Some(Arc::new(loaded.model))
            }
            _ => None,
        };
        warnings.extend(
            gpu_missing
                .iter()
                .map(|w| format!("placement auto runs on the CPU only: {w}")),
        );
        let threads = pool.current_num_threads();
        let policy = match (options.placement, options.policy, gpu.as_deref()) {
            (Placement::Auto, Policy::HeftSplit, Some(g)) if g.shares_cores_with(threads) => {
                warnings.push(format!(
                    "auto places whole nodes, no row splits: the GPU adapter ({}) runs its \
                     shaders on this machine's cores, which the {threads} CPU kernel threads \
                     already use (a split's two parts would slow each other)",
                    g.adapter().name
                ));
                Policy::Heft
            }
            (_, p, _) => p,
        };
        Ok(Session {
            graph,
            gpu: crate::recover::GpuSlot::new(gpu),
            limits: crate::limits::Limits {
                gpu_memory: options.max_gpu_memory,
                host_memory: options.max_host_memory,
            },
            gpu_missing,
            pool,
            pinned,
            spread,
            placement: options.placement,
            overrides: options.overrides,
            policy,
            costs,
            profile_file,
            observations: Default::default(),
            warnings,
            plans: Mutex::new(HashMap::new()),
            plans_by_value: Default::default(),
            constants: GpuConstants::default(),
            fused: Arc::new(fused),
            merged: Arc::new(summary.merged),
            host_buffers: Mutex::new(Vec::new()),
            last_run: handoff::Expected::default(),
        })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The policy `auto` plans with: [`SessionOptions::policy`], or HEFT without row splits
    /// where the GPU adapter shares this session's CPU cores ([`Gpu::shares_cores_with`]).
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The session's GPU now (after a device loss, the one that replaced it).
    pub fn gpu(&self) -> Option<Arc<Gpu>> {
        self.gpu.get()
    }

    /// What a user should know about how this session was set up (a recalibrated cost profile,
    /// no GPU for `auto`).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Why placement `auto` runs on the CPU alone, if it does.
    pub fn gpu_missing(&self) -> Option<&str> {
        self.gpu_missing.as_deref()
    }

    /// The cost model `auto` plans with.
    pub fn cost_model(&self) -> Option<&Arc<CostModel>> {
        self.costs.as_ref()
    }

    /// Save the cost model, with what this session's runs taught it (each entry's latest run
    /// observations), to the profile file it was loaded from, so the next session's first plan
    /// starts from them: the calibration may have been measured while the machine was busy, or
    /// in a context runs do not share. Returns the file, or `None` where there is nothing to
    /// save: the session did not load its cost model from a file (placement other than
    /// `auto`, a model given by the caller, no cache directory), or its runs taught nothing
    /// yet (a plan's warm-up runs do not teach), which leaves the file as another process may
    /// have saved it meanwhile. Sessions and processes saving one profile keep each other's
    /// lessons: under the file's lock, the run observations the file holds and this model
    /// lacks are taken in first ([`CostModel::save_learnt`]); the write is atomic.
    pub fn save_cost_profile(&self) -> Result<Option<PathBuf>, ProfileError> {
        let (Some(costs), Some(file)) = (&self.costs, &self.profile_file) else {
            return Ok(None);
        };
        if self.observations.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return Ok(None);
        }
        costs.save_learnt(file)?;
        Ok(Some(file.clone()))
    }

    /// CPU threads used by kernels.
    pub fn cpu_threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The CPU each kernel thread is pinned to (thread `i` to entry `i`); empty where they are
    /// left to the OS ([`SessionOptions::pin_threads`]).
    pub fn pinned_cpus(&self) -> &[usize] {
        &self.pinned
    }

    fn io(&self, ids: &[usize]) -> Vec<IoInfo> {
        ids.iter()
            .map(|&v| {
                let val = &self.graph.values[v];
                IoInfo {
                    name: val.name.clone(),
                    dtype: val.dtype,
                    shape: val.shape.clone(),
                }
            })
            .collect()
    }

    /// The inputs `run` must be given.
    pub fn inputs(&self) -> Vec<IoInfo> {
        self.io(&self.graph.inputs)
    }

    pub fn outputs(&self) -> Vec<IoInfo> {
        self.io(&self.graph.outputs)
    }

    /// Run the model. Inputs by name; outputs in the model's order, with their names.
    /// GPU nodes are timed only on the runs the cost model learns from. The inputs are copied
    /// for the run: [`Session::run_owned`] reads them in place.
    pub fn run(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        Ok(self.run_blocking(copied(inputs), false)?.0)
    }

    /// [`Session::run`] without copying its inputs: each given by value (a `Tensor`, whose
    /// buffer the session keeps after the run for later runs' intermediates) or shared (an
    /// `Arc<Tensor>` the caller keeps and passes again to later runs; see
    /// [`Session::run_with_report_owned`]).
    pub fn run_owned<T: Into<Arc<Tensor>>>(
        &self,
        inputs: Vec<(&str, T)>,
    ) -> Result<Vec<(String, Tensor)>> {
        Ok(self.run_blocking(shared(inputs), false)?.0)
    }

    /// `run`, for callers that cannot block (the browser): GPU completions and readbacks are
    /// awaited. The same work as `run` on native targets.
    pub async fn run_async(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        Ok(self.run_owned_async(copied(inputs), false).await?.0)
    }

    /// Run the model and report, per node, where it ran and how long it took (GPU nodes timed
    /// by timestamp queries where the adapter has them, which slows runs of many short GPU
    /// kernels: [`Session::run`] skips them). Blocks; native targets only (in the browser use
    /// [`Session::run_with_report_async`]).
    pub fn run_with_report(
        &self,
        inputs: &[(&str, Tensor)],
    ) -> Result<(Vec<(String, Tensor)>, RunReport)> {
        self.run_blocking(copied(inputs), true)
    }

    /// [`Session::run_with_report`] without copying its inputs: they become the run's values
    /// as they are (a decode loop that feeds one step's present K/V back as the next step's
    /// past K/V moves them in; a caller running one input many times shares it as an
    /// `Arc<Tensor>`). Blocks; native targets only.
    pub fn run_with_report_owned<T: Into<Arc<Tensor>>>(
        &self,
        inputs: Vec<(&str, T)>,
    ) -> Result<(Vec<(String, Tensor)>, RunReport)> {
        self.run_blocking(shared(inputs), true)
    }

    /// [`Session::run_owned_async`], blocking. The executor runs on the session's pool, so that
    /// each CPU kernel starts inline instead of through a cross-thread `install` per node (5-10
    /// us each), or, for runs of input shapes that take less so, on the caller's thread with
    /// every kernel loop in order (`handoff.rs`).
    fn run_blocking(
        &self,
        inputs: Vec<(&str, Arc<Tensor>)>,
        node_times: bool,
    ) -> Result<(Vec<(String, Tensor)>, RunReport)> {
        let shapes = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for (name, t) in &inputs {
                (name, &t.shape).hash(&mut h);
            }
            h.finish()
        };
        handoff::run_on(&self.pool, &self.spread, &self.last_run, shapes, || {
            pollster::block_on(self.run_owned_async(inputs, node_times))
        })
    }

    /// [`Session::run_with_report`] without blocking.
    pub async fn run_with_report_async(
        &self,
        inputs: &[(&str, Tensor)],
    ) -> Result<(Vec<(String, Tensor)>, RunReport)> {
        self.run_owned_async(copied(inputs), true).await
    }

    /// The run behind every `run*` method, on inputs given by value. Nodes are timed when
    /// `node_times` asks (a report) or the cost model learns from this run
    /// ([`Session::learns_next`]).
    async fn run_owned_async(
        &self,
        inputs: Vec<(&str, Arc<Tensor>)>,
        node_times: bool,
    ) -> Result<(Vec<(String, Tensor)>, RunReport)> {
        let ordered = self.order_inputs(inputs)?;
        let (plan, key) = self.cached_plan(&refs(&ordered))?;
        crate::limits::check_host_memory(&self.graph, &plan, self.limits.host_memory)?;
        // A device lost in an earlier run is replaced here (recover.rs).
        let (gpu, reopened) = self.gpu.for_run(&self.constants);
        let plan = self.around_busy_gpu(gpu.as_deref(), plan)?;
        let node_times = node_times || self.learns_next(&key, &plan);
        let cx = exec::Context {
            graph: &self.graph,
            plan: &plan,
            gpu: gpu.as_deref(),
            pool: &self.pool,
            constants: &self.constants,
            node_times,
        };
        let mut buffers = self.host_buffers.lock().unwrap().pop().unwrap_or_default();
        buffers.set_cap(self.kept_host_bytes(&plan));
        let result = exec::execute_reusing(&cx, ordered, &mut buffers).await;
        let mut kept = self.host_buffers.lock().unwrap();
        if kept.len() < KEPT_STORES {
            kept.push(buffers);
        }
        drop(kept);
        let (outs, mut report) = result?;
        report.faults.splice(0..0, reopened);
        report.fused = self.fused.clone();
        report.merged = self.merged.clone();
        if plan.gpu_wait > 0.0 {
            report.notes.push(format!(
                "the shared GPU was busy with other sessions' work for about {:.1} ms more: \
                 this run was planned around that wait",
                plan.gpu_wait * 1e3
            ));
        }
        self.learn(&key, &plan, &report, node_times);
        let names = self
            .graph
            .outputs
            .iter()
            .map(|&v| self.graph.values[v].name.clone());
        Ok((names.zip(outs).collect(), report))
    }

    /// The most bytes of released host tensors kept for reuse during and after a run of
    /// `plan` ([`exec::HostBuffers::set_cap`]): three times its peak of live intermediates, so
    /// that the next run finds what this one released whatever their order, within the
    /// headroom [`SessionOptions::max_host_memory`] leaves above the run's own working set.
    fn kept_host_bytes(&self, plan: &Plan) -> u64 {
        let headroom = match self.limits.host_memory {
            None => u64::MAX,
            Some(cap) => cap.saturating_sub(crate::limits::host_working_set(&self.graph, plan)),
        };
        plan.host_peak.saturating_mul(3).min(headroom)
    }

    /// When other sessions' batches keep the shared GPU busy for a noticeable share of this
    /// plan's predicted time ([`plan::gpu_busy_enough`]), this run gets a plan made around that
    /// wait (not cached: the next run looks again). README, "Re-planning".
    fn around_busy_gpu(&self, gpu: Option<&Gpu>, plan: Arc<Plan>) -> Result<Arc<Plan>> {
        let (Some(gpu), Some(predicted)) = (gpu, plan.predicted) else {
            return Ok(plan);
        };
        // A plan without GPU work stays so with the GPU busy: nothing to ask.
        if !uses_gpu(&plan) {
            return Ok(plan);
        }
        let wait = gpu.expected_wait().as_secs_f64();
        if !plan::gpu_busy_enough(wait, predicted) {
            return Ok(plan);
        }
        let metas: Vec<TensorMeta> = (self.graph.inputs.iter())
            .filter_map(|&v| plan.metas[v].clone())
            .collect();
        let request = Request {
            placement: self.placement,
            overrides: &self.overrides,
            costs: self.costs.as_deref().map(|c| c as &dyn crate::costs::Costs),
            policy: self.policy,
            assume_gpu: false,
        };
        let mut busy = crate::limits::off_foreign_pool(&self.pool, || {
            plan::build_around_busy_gpu(&self.graph, &metas, &request, Some(gpu), &self.pool, wait)
        })?;
        if let Some(cap) = self.limits.gpu_memory {
            crate::limits::fit_gpu_memory(&mut busy, &self.graph, cap);
        }
        Ok(Arc::new(busy))
    }

    /// Feed the run's measured times to the cost model (where the run was `timed`: its nodes'
    /// times measured, [`exec::Context::node_times`]; after a plan's [`WARM_UP_RUNS`], its
    /// next [`LEARN_FIRST`] runs, then one in [`LEARN_EVERY`]); mark the plan stale after
    /// [`REPLAN_AFTER`] consecutive runs past the warm-up (times 2 per earlier re-plan that
    /// changed nothing) that missed its prediction by more than [`REPLAN_MARGIN`], so the next
    /// run plans again with what was learnt.
    fn learn(&self, key: &[Vec<usize>], plan: &Arc<Plan>, report: &RunReport, timed: bool) {
        let (Some(costs), Some(predicted)) = (&self.costs, plan.predicted) else {
            return;
        };
        let measured = report.total.as_secs_f64();
        let missed = (measured - predicted).abs() > REPLAN_MARGIN * predicted.max(1e-6);
        let run = match self.plans.lock().unwrap().get_mut(key) {
            // The cached plan: count the run and the miss.
            Some(c) if Arc::ptr_eq(&c.plan, plan) => {
                let warm = c.runs >= WARM_UP_RUNS;
                c.misses = if missed && warm { c.misses + 1 } else { 0 };
                if c.misses >= REPLAN_AFTER << c.same_replans.min(20) {
                    c.stale = true;
                }
                c.runs += 1;
                c.runs - 1
            }
            // A plan made around a busy GPU (not cached) or one replaced meanwhile: it learns.
            _ => WARM_UP_RUNS,
        };
        // An untimed report (its nodes' times 0) teaches nothing: a run whose plan was
        // replaced by another thread's between `learns_next` and here.
        if timed && learns_from_run(run) {
            let taken = costs.observe_report(&self.graph, plan, report);
            self.observations
                .fetch_add(taken, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Whether [`Session::learn`] will feed the next run of `plan` to the cost model.
    fn learns_next(&self, key: &[Vec<usize>], plan: &Arc<Plan>) -> bool {
        if self.costs.is_none() || plan.predicted.is_none() {
            return false;
        }
        match self.plans.lock().unwrap().get(key) {
            Some(c) if Arc::ptr_eq(&c.plan, plan) => learns_from_run(c.runs),
            _ => true,
        }
    }

    /// True once a plan of this session needed the contents of small integer inputs.
    fn by_value(&self) -> bool {
        self.plans_by_value
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The plan-cache key: shapes, plus the contents of shape-like inputs when `by_value`.
    fn plan_key(&self, ordered: &[&Tensor], by_value: bool) -> Vec<Vec<usize>> {
        if by_value {
            Self::value_signature(ordered)
        } else {
            ordered.iter().map(|t| t.shape.clone()).collect()
        }
    }

    /// The plan for these inputs (built once per shape signature). A model whose shapes depend
    /// on the contents of small integer inputs (axes, shapes fed as inputs) is planned with
    /// those contents, and its plans are keyed by them too.
    pub fn plan_for(&self, ordered: &[Tensor]) -> Result<Arc<Plan>> {
        Ok(self.cached_plan(&refs(ordered))?.0)
    }

    /// [`Session::plan_for`], with the plan's cache key.
    fn cached_plan(&self, ordered: &[&Tensor]) -> Result<(Arc<Plan>, Vec<Vec<usize>>)> {
        let by_value = self.by_value();
        let key = self.plan_key(ordered, by_value);
        if let Some(c) = self.plans.lock().unwrap().get(&key) {
            if !c.stale {
                return Ok((c.plan.clone(), key));
            }
        }
        match self.build_plan(ordered, key.clone(), by_value) {
            Ok(plan) => Ok((plan, key)),
            Err(
                e @ Error::Node {
                    source: tandem_ops::OpError::Unsupported(_),
                    ..
                },
            ) if !by_value && ordered.iter().any(|t| Self::is_shape_like(t)) => {
                // Perhaps a shape depends on an input's contents: plan with them.
                let key = self.plan_key(ordered, true);
                match self.build_plan(ordered, key.clone(), true) {
                    Ok(plan) => {
                        self.plans_by_value
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        Ok((plan, key))
                    }
                    Err(_) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Small integer inputs (shape-like: axes, shapes, pads) whose contents may be read at plan
    /// time.
    fn is_shape_like(t: &Tensor) -> bool {
        t.dtype().is_int() && t.numel() <= 16
    }

    /// Shapes, plus the contents of shape-like inputs.
    fn value_signature(ordered: &[&Tensor]) -> Vec<Vec<usize>> {
        ordered
            .iter()
            .map(|t| {
                let mut k = t.shape.clone();
                if Self::is_shape_like(t) {
                    k.push(usize::MAX);
                    k.extend(t.to_f64_vec().iter().map(|v| v.to_bits() as usize));
                }
                k
            })
            .collect()
    }

    fn build_plan(
        &self,
        ordered: &[&Tensor],
        key: Vec<Vec<usize>>,
        by_value: bool,
    ) -> Result<Arc<Plan>> {
        let plan = Arc::new(self.make_plan(ordered, by_value)?);
        crate::recover::log_limit_fallbacks(&self.graph, &plan);
        let mut plans = self.plans.lock().unwrap();
        // A re-plan (the old plan is stale) that changed no placement doubles the misses the
        // next one needs.
        let same_replans = match plans.get(&key) {
            Some(old) if old.stale && old.plan.same_placement(&plan) => old.same_replans + 1,
            _ => 0,
        };
        plans.insert(
            key,
            CachedPlan {
                plan: plan.clone(),
                misses: 0,
                runs: 0,
                same_replans,
                stale: false,
            },
        );
        Ok(plan)
    }

    /// A plan for `ordered` from the cost model as it stands (the contents of shape-like
    /// inputs read where `by_value`), neither cached nor logged.
    fn make_plan(&self, ordered: &[&Tensor], by_value: bool) -> Result<Plan> {
        let metas: Vec<TensorMeta> = ordered
            .iter()
            .map(|t| {
                if by_value && Self::is_shape_like(t) {
                    TensorMeta::constant((*t).clone())
                } else {
                    t.meta()
                }
            })
            .collect();
        let request = Request {
            placement: self.placement,
            overrides: &self.overrides,
            costs: self.costs.as_deref().map(|c| c as &dyn crate::costs::Costs),
            policy: self.policy,
            assume_gpu: false,
        };
        let gpu = self.gpu.get();
        let mut plan = crate::limits::off_foreign_pool(&self.pool, || {
            plan::build(&self.graph, &metas, &request, gpu.as_deref(), &self.pool)
        })?;
        if let Some(cap) = self.limits.gpu_memory {
            crate::limits::fit_gpu_memory(&mut plan, &self.graph, cap);
        }
        Ok(plan)
    }

    /// The plan for named inputs (for `--explain` and tools).
    pub fn plan(&self, inputs: &[(&str, Tensor)]) -> Result<Arc<Plan>> {
        Ok(self.cached_plan(&self.order_inputs(borrowed(inputs))?)?.0)
    }

    /// The plan the cost model would make for named inputs now, with what it has learnt from
    /// this session's runs, leaving the cached one in use: that one is rebuilt only after runs
    /// that missed its prediction by more than [`REPLAN_MARGIN`], so its `predicted` can date
    /// from the first run. For reports that set prediction against measurement; it does a
    /// plan's whole work, constant folding included, every call.
    pub fn plan_now(&self, inputs: &[(&str, Tensor)]) -> Result<Plan> {
        self.make_plan(&self.order_inputs(borrowed(inputs))?, self.by_value())
    }

    /// Check the given inputs against the model and put them in the model's order.
    fn order_inputs<T: Borrow<Tensor>>(&self, given: Vec<(&str, T)>) -> Result<Vec<T>> {
        for (name, _) in &given {
            if !self
                .graph
                .inputs
                .iter()
                .any(|&v| self.graph.values[v].name == *name)
            {
                let known: Vec<&str> = self
                    .graph
                    .inputs
                    .iter()
                    .map(|&v| self.graph.values[v].name.as_str())
                    .collect();
                return Err(Error::Input {
                    name: name.to_string(),
                    reason: format!("the model has no such input (inputs: {})", known.join(", ")),
                });
            }
        }
        let mut given: Vec<(&str, Option<T>)> =
            given.into_iter().map(|(n, t)| (n, Some(t))).collect();
        let mut out = Vec::with_capacity(self.graph.inputs.len());
        for &v in &self.graph.inputs {
            let val = &self.graph.values[v];
            let found = given.iter_mut().find(|(n, _)| *n == val.name);
            let Some(given) = found.and_then(|(_, t)| t.take()) else {
                return Err(Error::MissingInput {
                    name: val.name.clone(),
                    dtype: val.dtype.unwrap_or(tandem_ops::DType::F32),
                    shape: describe_shape(val.shape.as_deref()),
                });
            };
            let t: &Tensor = given.borrow();
            if let Some(d) = val.dtype {
                if d != t.dtype() {
                    return Err(Error::Input {
                        name: val.name.clone(),
                        reason: format!("expected dtype {d}, got {}", t.dtype()),
                    });
                }
            }
            if let Some(dims) = &val.shape {
                let fits = dims.len() == t.shape.len()
                    && dims.iter().zip(&t.shape).all(|(d, &n)| match d {
                        Dim::Fixed(f) => *f == n,
                        Dim::Symbolic(_) => true,
                    });
                if !fits {
                    return Err(Error::Input {
                        name: val.name.clone(),
                        reason: format!(
                            "expected shape {}, got {:?}",
                            describe_shape(Some(dims)),
                            t.shape
                        ),
                    });
                }
            }
            out.push(given);
        }
        Ok(out)
    }
}

/// Copies of borrowed inputs, as the run's values hold them, for the runs that take them by
/// reference.
fn copied<'a>(inputs: &[(&'a str, Tensor)]) -> Vec<(&'a str, Arc<Tensor>)> {
    inputs
        .iter()
        .map(|(n, t)| (*n, Arc::new(t.clone())))
        .collect()
}

/// Inputs as the run's values hold them, without a copy.
fn shared<T: Into<Arc<Tensor>>>(inputs: Vec<(&str, T)>) -> Vec<(&str, Arc<Tensor>)> {
    inputs.into_iter().map(|(n, t)| (n, t.into())).collect()
}

/// Named inputs by reference, for planning (which reads only their shapes and small values).
fn borrowed<'a, 't>(inputs: &'t [(&'a str, Tensor)]) -> Vec<(&'a str, &'t Tensor)> {
    inputs.iter().map(|(n, t)| (*n, t)).collect()
}

/// References to tensors however they are held.
fn refs<T: Borrow<Tensor>>(tensors: &[T]) -> Vec<&Tensor> {
    tensors.iter().map(Borrow::borrow).collect()
}

/// `[1, 3, height, width]`-style text for a declared shape.
pub fn describe_shape(dims: Option<&[Dim]>) -> String {
    match dims {
        None => "unknown".into(),
        Some(d) => format!(
            "[{}]",
            d.iter()
                .map(|d| match d {
                    Dim::Fixed(n) => n.to_string(),
                    Dim::Symbolic(s) if s.is_empty() => "?".into(),
                    Dim::Symbolic(s) => s.clone(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
