//! tandem in the browser: the JS API of the runtime, built with wasm-bindgen.
//!
//! Sits between the page (`web-demo/www/`, ES modules from `wasm-bindgen --target web`) and the
//! runtime crate: WebGPU through wgpu's webgpu backend, the CPU kernels compiled to wasm (one
//! thread: the one that loads this module; the demo loads it in a module Web Worker,
//! `www/worker.js`, so CPU work never blocks the page), and `auto` planned with costs measured
//! in this browser (`browser_costs`). Every call that waits for the GPU returns a promise.
//!
//! ```js
//! const s = await Session.create(bytes, { placement: "auto" });   // "cpu" | "gpu" | "auto"
//! const out = await s.run({ bytes: { dtype: "int32", shape: [1, 2048], data: Int32Array } });
//! const r = s.report();   // per node: device, start, time, predictions; GPU limits; link costs
//! ```

pub mod browser_costs;
pub mod report_json;

use serde_json::{json, Value};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use tandem::{DType, Data, Placement, SessionOptions, Tensor};
use wasm_bindgen::prelude::*;
use web_time::Instant;

/// A loaded model (JS class `Session`).
#[wasm_bindgen]
pub struct Session {
    inner: Arc<tandem::Session>,
    placement: Placement,
    /// How the session was set up: GPU, link costs, calibration, warnings (JSON).
    setup: Value,
    /// The last run's report (JSON), shared with the promise that produces it.
    last: Rc<RefCell<Value>>,
    runs: Rc<RefCell<usize>>,
}

fn js_err(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

fn parse_placement(options: &JsValue) -> Result<Placement, JsError> {
    let p = js_sys::Reflect::get(options, &"placement".into())
        .ok()
        .and_then(|v| v.as_string())
        .unwrap_or_else(|| "auto".into());
    match p.as_str() {
        "cpu" => Ok(Placement::Cpu),
        "gpu" => Ok(Placement::Gpu),
        "auto" => Ok(Placement::Auto),
        other => Err(js_err(format!(
            "placement must be cpu, gpu or auto, not {other:?}"
        ))),
    }
}

#[wasm_bindgen]
impl Session {
    /// `Session.create(bytes, {placement})`: load an ONNX model. `gpu` fails when the browser
    /// has no WebGPU adapter; `auto` then runs on the CPU alone (see `report().setup.gpu`), and
    /// with a GPU first runs the model once on each device to learn this browser's node costs.
    pub async fn create(bytes: Vec<u8>, options: JsValue) -> Result<Session, JsError> {
        let placement = parse_placement(&options)?;
        let mut setup = json!({ "placement": format!("{placement:?}").to_lowercase() });
        let gpu = match placement {
            Placement::Cpu => None,
            _ => match browser_costs::page_gpu().await {
                Ok(g) => Some(g),
                Err(reason) if placement == Placement::Gpu => {
                    return Err(js_err(format!("placement gpu: {reason}")))
                }
                Err(reason) => {
                    setup["gpuMissing"] = reason.into();
                    None
                }
            },
        };
        let costs = browser_costs::page_costs(gpu.as_ref());
        let mut opts = SessionOptions::default()
            .placement(placement)
            .cost_model(costs.clone());
        if let Some(g) = &gpu {
            opts = opts.gpu(g.clone());
            setup["gpu"] = report_json::gpu_json(g);
        }
        if placement == Placement::Auto {
            if let Some(g) = &gpu {
                let began = Instant::now();
                let learnt = calibrate(&bytes, g, &costs).await;
                setup["calibration"] = match learnt {
                    Ok(n) => json!({ "samples": n, "ms": began.elapsed().as_secs_f64() * 1e3 }),
                    Err(e) => json!({ "error": e.to_string() }),
                };
            }
        }
        setup["links"] = report_json::links_json(&costs);
        let inner = tandem::Session::new(bytes.as_slice(), opts).map_err(js_err)?;
        setup["warnings"] = inner.warnings().to_vec().into();
        Ok(Session {
            inner: Arc::new(inner),
            placement,
            setup,
            last: Rc::new(RefCell::new(Value::Null)),
            runs: Rc::new(RefCell::new(0)),
        })
    }

    /// `session.run({name: {dtype, shape, data}})` -> `Promise<{name: {dtype, shape, data}}>`.
    /// dtypes: float32, int32, int64 (BigInt64Array), uint8, bool (Uint8Array).
    pub fn run(&self, inputs: JsValue) -> js_sys::Promise {
        let inner = self.inner.clone();
        let last = self.last.clone();
        let runs = self.runs.clone();
        let learns = self.placement != Placement::Auto;
        wasm_bindgen_futures::future_to_promise(async move {
            let named = tensors_from_js(&inputs).map_err(JsValue::from)?;
            let refs: Vec<(&str, Tensor)> =
                named.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            let (outs, report) = inner
                .run_with_report_async(&refs)
                .await
                .map_err(|e| JsValue::from(js_err(e)))?;
            let plan = inner.plan(&refs).map_err(|e| JsValue::from(js_err(e)))?;
            // Single-device sessions teach the page's cost model (not from their first run,
            // which compiles pipelines); `auto` sessions learn on their own.
            *runs.borrow_mut() += 1;
            if learns && *runs.borrow() > 1 {
                if let Some(c) = inner.cost_model() {
                    c.observe_report(inner.graph(), &plan, &report);
                }
            }
            *last.borrow_mut() = report_json::run_json(inner.graph(), &plan, &report);
            tensors_to_js(&outs)
        })
    }

    /// The last run's report and the session's setup, as a plain object: `{setup: {placement,
    /// gpu: {adapter, maxStorageBufferBindingSize, maxBufferSize, ...}, links: {syncMs, ...},
    /// calibration, warnings}, run: {totalMs, predictedMs, nodes: [{name, op, device, startMs,
    /// timeMs, gpuTimeMs, predicted: {cpuMs, gpuMs, splitMs, why}}], transfers}}`.
    pub fn report(&self) -> Result<JsValue, JsError> {
        let v = json!({ "setup": self.setup, "run": *self.last.borrow() });
        js_sys::JSON::parse(&v.to_string()).map_err(|_| js_err("report is not JSON"))
    }

    /// Names of the model's inputs.
    #[wasm_bindgen(js_name = inputNames)]
    pub fn input_names(&self) -> Vec<String> {
        self.inner.inputs().into_iter().map(|i| i.name).collect()
    }
}

/// `gpuInfo()` -> `Promise<{available, reason?, adapter?, limits...}>`: opens the page's GPU
/// (once) and measures its readback cost.
#[wasm_bindgen(js_name = gpuInfo)]
pub async fn gpu_info() -> JsValue {
    let v = match browser_costs::page_gpu().await {
        Ok(g) => {
            let mut v = report_json::gpu_json(&g);
            v["available"] = true.into();
            v["links"] = report_json::links_json(&browser_costs::page_costs(Some(&g)));
            v
        }
        Err(reason) => json!({ "available": false, "reason": reason }),
    };
    js_sys::JSON::parse(&v.to_string()).unwrap_or(JsValue::NULL)
}

/// Run the model once on each device (after a warm-up run) with zero inputs of its declared
/// shapes (symbolic dimensions 1) and teach the page's cost model what each node took here.
/// Returns the number of samples learnt.
async fn calibrate(
    bytes: &[u8],
    gpu: &Arc<tandem::gpu::Gpu>,
    costs: &Arc<tandem::cost::CostModel>,
) -> tandem::Result<usize> {
    let mut learnt = 0;
    for placement in [Placement::Cpu, Placement::Gpu] {
        let s = tandem::Session::new(
            bytes,
            SessionOptions::default()
                .placement(placement)
                .gpu(gpu.clone())
                .cost_model(costs.clone()),
        )?;
        let inputs: Vec<(String, Tensor)> = s
            .inputs()
            .into_iter()
            .map(|i| {
                let shape = i.shape_or_ones();
                (i.name, Tensor::zeros(i.dtype.unwrap_or(DType::F32), &shape))
            })
            .collect();
        let refs: Vec<(&str, Tensor)> = inputs
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        s.run_with_report_async(&refs).await?;
        let (_, report) = s.run_with_report_async(&refs).await?;
        learnt += costs.observe_report(s.graph(), &*s.plan(&refs)?, &report);
    }
    Ok(learnt)
}

fn get(o: &JsValue, key: &str) -> Result<JsValue, JsError> {
    js_sys::Reflect::get(o, &key.into()).map_err(|_| js_err(format!("missing field {key}")))
}

/// `{name: {dtype, shape, data}}` -> named tensors.
fn tensors_from_js(inputs: &JsValue) -> Result<Vec<(String, Tensor)>, JsError> {
    let obj: &js_sys::Object = inputs
        .dyn_ref()
        .ok_or_else(|| js_err("inputs must be an object {name: {dtype, shape, data}}"))?;
    let mut out = Vec::new();
    for entry in js_sys::Object::entries(obj).iter() {
        let pair: js_sys::Array = entry.into();
        let name = pair.get(0).as_string().unwrap_or_default();
        let t = pair.get(1);
        let dtype = get(&t, "dtype")?.as_string().unwrap_or_default();
        let shape: Vec<usize> = js_sys::Array::from(&get(&t, "shape")?)
            .iter()
            .map(|d| d.as_f64().unwrap_or(0.0) as usize)
            .collect();
        let d = get(&t, "data")?;
        let data = match dtype.as_str() {
            "float32" => Data::F32(js_sys::Float32Array::new(&d).to_vec()),
            "int32" => Data::I32(js_sys::Int32Array::new(&d).to_vec()),
            "int64" => Data::I64(js_sys::BigInt64Array::new(&d).to_vec()),
            "uint8" => Data::U8(js_sys::Uint8Array::new(&d).to_vec()),
            "bool" => Data::Bool(
                js_sys::Uint8Array::new(&d)
                    .to_vec()
                    .iter()
                    .map(|&b| b != 0)
                    .collect(),
            ),
            other => return Err(js_err(format!("input {name}: unsupported dtype {other:?}"))),
        };
        let numel: usize = shape.iter().product();
        let t = Tensor::new(shape, data);
        if t.numel() != numel {
            return Err(js_err(format!(
                "input {name}: data length does not match its shape"
            )));
        }
        out.push((name, t));
    }
    Ok(out)
}

/// Named tensors -> `{name: {dtype, shape, data}}`.
fn tensors_to_js(outs: &[(String, Tensor)]) -> Result<JsValue, JsValue> {
    let obj = js_sys::Object::new();
    for (name, t) in outs {
        let (dtype, data): (&str, JsValue) = match &t.data {
            Data::F32(v) => ("float32", js_sys::Float32Array::from(&v[..]).into()),
            Data::I32(v) => ("int32", js_sys::Int32Array::from(&v[..]).into()),
            Data::I64(v) => ("int64", js_sys::BigInt64Array::from(&v[..]).into()),
            Data::U8(v) => ("uint8", js_sys::Uint8Array::from(&v[..]).into()),
            Data::Bool(v) => {
                let b: Vec<u8> = v.iter().map(|&x| x as u8).collect();
                ("bool", js_sys::Uint8Array::from(&b[..]).into())
            }
            other => {
                let v: Vec<f32> = Tensor::new(t.shape.clone(), other.clone())
                    .to_f64_vec()
                    .iter()
                    .map(|&x| x as f32)
                    .collect();
                ("float32", js_sys::Float32Array::from(&v[..]).into())
            }
        };
        let o = js_sys::Object::new();
        let shape: js_sys::Array = t.shape.iter().map(|&d| JsValue::from(d as f64)).collect();
        js_sys::Reflect::set(&o, &"dtype".into(), &dtype.into())?;
        js_sys::Reflect::set(&o, &"shape".into(), &shape)?;
        js_sys::Reflect::set(&o, &"data".into(), &data)?;
        js_sys::Reflect::set(&obj, &name.into(), &o)?;
    }
    Ok(obj.into())
}
