//! The public API: load a model once, run it many times.
//!
//! Sits between callers (the CLI, apps, the bench suite, the web demo) and the importer,
//! planner and executor. A `Session` is `Send + Sync`: plans are cached per input-shape
//! signature behind a lock, runs share the GPU and the constant uploads.

use crate::exec::{self, GpuConstants};
use crate::gpu::Gpu;
use crate::graph::{Dim, Graph};
use crate::plan::{self, Device, ForcedPlacer, Plan, Selector};
use crate::report::RunReport;
use crate::{import, Error, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tandem_ops::{Tensor, TensorMeta};

/// Where nodes run when no override names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every node on the CPU.
    Cpu,
    /// Every node the GPU can run on the GPU; the others on the CPU, each with its reason in the
    /// run report.
    Gpu,
}

impl std::str::FromStr for Placement {
    type Err = Error;
    fn from_str(s: &str) -> Result<Placement> {
        match s {
            "cpu" => Ok(Placement::Cpu),
            "gpu" => Ok(Placement::Gpu),
            other => Err(Error::Usage(format!(
                "unknown placement `{other}` (expected cpu or gpu)"
            ))),
        }
    }
}

/// How a session is set up.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub placement: Placement,
    /// Per-node overrides, by node name or op type; later entries win.
    pub overrides: Vec<(Selector, Device)>,
    /// CPU threads for kernels (default: all cores).
    pub cpu_threads: Option<usize>,
    /// A GPU to share between sessions; when `None`, one is opened if the placement needs it.
    pub gpu: Option<Arc<Gpu>>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            placement: Placement::Cpu,
            overrides: Vec::new(),
            cpu_threads: None,
            gpu: None,
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

    pub fn gpu(mut self, gpu: Arc<Gpu>) -> Self {
        self.gpu = Some(gpu);
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
    gpu: Option<Arc<Gpu>>,
    pool: rayon::ThreadPool,
    placer: ForcedPlacer,
    plans: Mutex<HashMap<Vec<Vec<usize>>, Arc<Plan>>>,
    constants: GpuConstants,
}

/// A model input or output as declared.
#[derive(Debug, Clone)]
pub struct IoInfo {
    pub name: String,
    pub dtype: Option<tandem_ops::DType>,
    pub shape: Option<Vec<Dim>>,
}

impl Session {
    /// Load and check a model. Fails with a typed error for an unreadable or invalid model or an
    /// unsupported node (named), and when the GPU is asked for but none can be opened.
    pub fn new<'a>(model: impl Into<ModelSource<'a>>, options: SessionOptions) -> Result<Session> {
        let graph = match model.into() {
            ModelSource::Path(p) => import::import_file(p)?,
            ModelSource::Bytes(b) => import::import_bytes(b, None)?,
        };
        let wants_gpu = options.placement == Placement::Gpu
            || options.overrides.iter().any(|(_, d)| *d == Device::Gpu);
        let gpu = match (options.gpu, wants_gpu) {
            (Some(g), _) => Some(g),
            (None, true) => Some(Arc::new(Gpu::new()?)),
            (None, false) => None,
        };
        let threads = options.cpu_threads.unwrap_or(0);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tandem-cpu-{i}"))
            .build()
            .map_err(|e| Error::Usage(format!("cannot start {threads} CPU threads: {e}")))?;
        let default = match options.placement {
            Placement::Cpu => Device::Cpu,
            Placement::Gpu => Device::Gpu,
        };
        Ok(Session {
            graph,
            gpu,
            pool,
            placer: ForcedPlacer {
                default,
                overrides: Arc::new(options.overrides),
            },
            plans: Mutex::new(HashMap::new()),
            constants: GpuConstants::default(),
        })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.gpu.as_ref()
    }

    /// CPU threads used by kernels.
    pub fn cpu_threads(&self) -> usize {
        self.pool.current_num_threads()
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
    pub fn run(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        Ok(self.run_with_report(inputs)?.0)
    }

    /// `run`, for callers that cannot block (the browser); the same work on native targets.
    pub async fn run_async(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        self.run(inputs)
    }

    /// Run the model and report, per node, where it ran and how long it took.
    pub fn run_with_report(
        &self,
        inputs: &[(&str, Tensor)],
    ) -> Result<(Vec<(String, Tensor)>, RunReport)> {
        let ordered = self.order_inputs(inputs)?;
        let plan = self.plan_for(&ordered)?;
        let cx = exec::Context {
            graph: &self.graph,
            plan: &plan,
            gpu: self.gpu.as_deref(),
            pool: &self.pool,
            constants: &self.constants,
        };
        let (outs, report) = exec::execute(&cx, ordered)?;
        let names = self
            .graph
            .outputs
            .iter()
            .map(|&v| self.graph.values[v].name.clone());
        Ok((names.zip(outs).collect(), report))
    }

    /// The plan for these inputs' shapes (built once per shape signature).
    pub fn plan_for(&self, ordered: &[Tensor]) -> Result<Arc<Plan>> {
        let key: Vec<Vec<usize>> = ordered.iter().map(|t| t.shape.clone()).collect();
        if let Some(p) = self.plans.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let metas: Vec<TensorMeta> = ordered.iter().map(|t| t.meta()).collect();
        let plan = Arc::new(plan::build(
            &self.graph,
            &metas,
            &self.placer,
            self.gpu.as_deref(),
            &self.pool,
        )?);
        self.plans.lock().unwrap().insert(key, plan.clone());
        Ok(plan)
    }

    /// Check the given inputs against the model and put them in the model's order.
    fn order_inputs(&self, given: &[(&str, Tensor)]) -> Result<Vec<Tensor>> {
        for (name, _) in given {
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
        let mut out = Vec::with_capacity(self.graph.inputs.len());
        for &v in &self.graph.inputs {
            let val = &self.graph.values[v];
            let Some((_, t)) = given.iter().find(|(n, _)| *n == val.name) else {
                return Err(Error::MissingInput {
                    name: val.name.clone(),
                    dtype: val.dtype.unwrap_or(tandem_ops::DType::F32),
                    shape: describe_shape(val.shape.as_deref()),
                });
            };
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
            out.push(t.clone());
        }
        Ok(out)
    }
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
