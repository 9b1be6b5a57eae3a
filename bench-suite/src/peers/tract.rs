//! tract (sonos/tract, `tract-onnx`) as a peer, in-process: load, optimise, run on the same
//! tensors as tandem with the same number of threads.
//!
//! Sits between the suite's tensors (`tandem::Tensor`) and tract's; models whose declared
//! output shapes or value_info tract disagrees with are retried with
//! `with_ignore_output_shapes(true)` and `with_ignore_value_info(true)` (noted in the row).

use crate::interleave::{Failed, RoundRow, Slices};
use crate::machine::{peak_rss_mib, reset_peak_rss};
use crate::models::{max_abs_diff, Named};
use crate::schema::{AfterPause, Cold, Row};
use crate::stats::{Latency, Method, Pause, RunRule, Timed};
use crate::tandem_row::caught;
use std::path::Path;
use std::sync::Once;
use std::time::{Duration, Instant};
use tandem::{Data, Tensor};
use tract_onnx::prelude::{
    DatumType, Framework, InferenceFact, InferenceModelExt, IntoTValue, TValue, TVec,
    Tensor as TTensor, TractResult,
};

/// tract-onnx's version as built.
pub const VERSION: &str = "0.23";

fn to_tract(t: &Tensor) -> TractResult<TTensor> {
    let s = &t.shape;
    match &t.data {
        Data::F32(v) => TTensor::from_shape(s, v),
        Data::F64(v) => TTensor::from_shape(s, v),
        Data::I64(v) => TTensor::from_shape(s, v),
        Data::I32(v) => TTensor::from_shape(s, v),
        Data::I8(v) => TTensor::from_shape(s, v),
        Data::U8(v) => TTensor::from_shape(s, v),
        Data::Bool(v) => TTensor::from_shape(s, v),
        Data::F16(v) => {
            let f: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
            TTensor::from_shape(s, &f)?
                .cast_to_dt(DatumType::F16)
                .map(|c| c.into_owned())
        }
    }
}

/// A tract output as an f64 tandem tensor (values compared, dtypes not).
fn from_tract(t: &TTensor) -> TractResult<Tensor> {
    let f = t.cast_to::<f64>()?;
    let v = f.try_as_plain_ram()?.as_slice::<f64>()?.to_vec();
    Ok(Tensor::new(t.shape().to_vec(), Data::F64(v)))
}

type Plan = std::sync::Arc<tract_onnx::prelude::TypedSimplePlan>;

/// Load and optimise; `lenient` ignores the file's declared output shapes and intermediate
/// value_info (symbolic dims like `batch` that tract will not unify with our concrete inputs).
fn load(model: &Path, inputs: &Named, lenient: bool) -> TractResult<(Plan, Vec<usize>)> {
    let mut m = tract_onnx::onnx()
        .with_ignore_output_shapes(lenient)
        .with_ignore_value_info(lenient)
        .model_for_path(model)?;
    // feed order: the model's inputs, matched to ours by name
    let mut order = Vec::new();
    for (i, outlet) in m.input_outlets()?.to_vec().into_iter().enumerate() {
        let name = m.node(outlet.node).name.clone();
        let k = inputs
            .iter()
            .position(|(n, _)| *n == name)
            .unwrap_or(i.min(inputs.len().saturating_sub(1)));
        let t = &inputs[k].1;
        let dt = to_tract(&Tensor::zeros(t.dtype(), &[0]))?.datum_type();
        m.set_input_fact(i, InferenceFact::dt_shape(dt, t.shape.clone()))?;
        order.push(k);
    }
    use tract_onnx::prelude::IntoRunnable;
    Ok((m.into_optimized()?.into_runnable()?, order))
}

/// The inputs of one run: the fed tensors as tract values (each run consumes its own).
fn tvalues(feed: &[TTensor]) -> TVec<TValue> {
    feed.iter().map(|t| t.clone().into_tvalue()).collect()
}

/// One run of `plan` on `inputs`, its outputs dropped.
fn run(plan: &Plan, inputs: TVec<TValue>) -> Result<(), String> {
    plan.run(inputs)
        .map(drop)
        .map_err(|e| format!("run: {e:#}"))
}

/// tract at its first run's end, its timed runs to come in slices (`interleave.rs`).
pub struct Started {
    row: Row,
    plan: Plan,
    feed: Vec<TTensor>,
    timed: Timed,
    slice: Option<Duration>,
    pause: Pause,
    tick: Box<dyn FnMut(usize)>,
    cold: Cold,
}

/// Loads `model` on tract with `method`'s threads (not pinned: tract's executor has no
/// affinity) and makes its first run; returns it, or the failed row (never panics). Its timed
/// runs come in `method`'s slices under `rule`, then its runs after a pause; `tick` gets its
/// timed runs so far.
pub fn start(
    model: &Path,
    inputs: &Named,
    reference: Option<&Named>,
    rule: &RunRule,
    method: &Method,
    tick: Box<dyn FnMut(usize)>,
) -> Box<dyn RoundRow> {
    match caught(|| start_inner(model, inputs, reference, method.threads)) {
        Ok((row, plan, feed, cold)) => Box::new(Started {
            row,
            plan,
            feed,
            timed: Timed::new(*rule),
            slice: method.slice,
            pause: method.pause,
            tick,
            cold,
        }),
        Err(e) => Box::new(Failed(Row::failed("tract", "cpu", VERSION, e))),
    }
}

impl Slices for Started {
    fn process(&self) -> Option<u32> {
        Some(std::process::id())
    }

    fn next_slice(&mut self) -> Result<bool, String> {
        let Started {
            plan, feed, timed, ..
        } = self;
        caught(|| {
            timed.slice(
                self.slice,
                &mut || tvalues(feed),
                &mut |a| run(plan, a),
                &mut |n| (self.tick)(n),
            )
        })
    }
}

impl RoundRow for Started {
    fn finish(self: Box<Self>, err: Result<(), String>) -> Row {
        let Started {
            mut row,
            plan,
            feed,
            timed,
            pause,
            cold,
            ..
        } = *self;
        let paused =
            err.and_then(|()| caught(|| pause.measure(|| tvalues(&feed), |a| run(&plan, a))));
        let paused = match paused {
            Ok(samples) => samples,
            Err(e) => return Row::failed("tract", "cpu", VERSION, e),
        };
        row.after_pause = AfterPause::from_samples(pause.ms, paused);
        let rule = timed.rule();
        let latency = Latency::from_samples(timed.samples_ms, &rule);
        row.cold = Some(cold);
        row.throughput_per_s = Some(latency.throughput());
        row.latency = Some(latency);
        row.peak_rss_mib = peak_rss_mib();
        row
    }
}

/// Load, optimise, first run (its outputs compared with the reference): the row so far, the
/// plan, its inputs and the cold start.
fn start_inner(
    model: &Path,
    inputs: &Named,
    reference: Option<&Named>,
    threads: usize,
) -> Result<(Row, Plan, Vec<TTensor>, Cold), String> {
    static EXECUTOR: Once = Once::new();
    EXECUTOR.call_once(|| {
        if threads > 1 {
            tract_linalg::multithread::set_default_executor(
                tract_linalg::multithread::Executor::multithread(threads),
            );
        }
    });
    let mut row = Row::failed("tract", "cpu", VERSION, String::new());
    row.error = None;
    reset_peak_rss();
    let t = Instant::now();
    let (plan, order) = match load(model, inputs, false) {
        Ok(p) => p,
        Err(first) => {
            let p =
                load(model, inputs, true).map_err(|e| format!("load: {e:#} (first: {first:#})"))?;
            row.notes.push(
                "loaded with with_ignore_output_shapes(true) and with_ignore_value_info(true)"
                    .to_string(),
            );
            p
        }
    };
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let feed: Vec<TTensor> = order
        .iter()
        .map(|&k| to_tract(&inputs[k].1))
        .collect::<TractResult<_>>()
        .map_err(|e| format!("inputs: {e:#}"))?;
    let t = Instant::now();
    let outs = plan
        .run(tvalues(&feed))
        .map_err(|e| format!("first run: {e:#}"))?;
    let first_run_ms = t.elapsed().as_secs_f64() * 1e3;
    let names: Vec<String> = plan
        .model()
        .output_outlets()
        .map_err(|e| e.to_string())?
        .iter()
        .map(|o| {
            plan.model()
                .outlet_label(*o)
                .map_or_else(|| plan.model().node(o.node).name.clone(), str::to_string)
        })
        .collect();
    let got: Named = names
        .into_iter()
        .zip(outs.iter())
        .map(|(n, v)| from_tract(v).map(|t| (n, t)))
        .collect::<TractResult<_>>()
        .map_err(|e| format!("outputs: {e:#}"))?;
    if let Some(want) = reference {
        match max_abs_diff(&got, want) {
            Ok(d) => row.max_abs_diff = Some(d),
            Err(e) => row.notes.push(format!("outputs not compared: {e}")),
        }
    }
    let cold = Cold {
        load_ms,
        first_run_ms,
        settle: None,
    };
    Ok((row, plan, feed, cold))
}
