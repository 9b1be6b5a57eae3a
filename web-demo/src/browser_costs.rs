//! The page's GPU and cost model: one WebGPU device per page, its link costs measured in this
//! browser, and one cost model that every session of the page teaches.
//!
//! Sits between the JS API (`lib.rs`) and the runtime's `Gpu` / `CostModel`. Readback in a
//! browser is a `mapAsync` promise that settles on the JS event loop (0.4-3.4 ms on headless
//! Chromium's SwiftShader), not the tens of microseconds of a native `poll(Wait)`, so `auto` must
//! plan with costs measured here: [`measure_links`] times a few upload + readback round trips and
//! a 1 MiB copy each way, and the result replaces the model's link costs (sync, upload,
//! download). Node costs are learnt from run reports (`observe_report`) of the sessions that ran
//! on one device (see `lib.rs`, calibration at `Session.create` for `auto`).

use std::cell::RefCell;
use std::sync::Arc;
use tandem::cost::{AdapterKey, CostModel, CpuKey, Line, Links};
use tandem::gpu::Gpu;
use tandem::{Result, Tensor};
use web_time::Instant;

thread_local! {
    /// The page's GPU: opened on first use; `Err` keeps why there is none.
    static GPU: RefCell<Option<std::result::Result<Arc<Gpu>, String>>> = const { RefCell::new(None) };
    /// The page's cost model (one per page, shared by its sessions).
    static COSTS: RefCell<Option<Arc<CostModel>>> = const { RefCell::new(None) };
}

/// The page's GPU, opened (and its links measured) on first call; `Err(reason)` when the
/// browser has none (no `navigator.gpu`, or `requestAdapter()` returned null).
pub async fn page_gpu() -> std::result::Result<Arc<Gpu>, String> {
    if let Some(g) = GPU.with(|g| g.borrow().clone()) {
        return g;
    }
    let opened = match Gpu::new_async().await {
        Ok(gpu) => {
            let gpu = Arc::new(gpu);
            match measure_links(&gpu).await {
                Ok(links) => {
                    let costs = page_costs(Some(&gpu));
                    let mut model = (*costs).clone();
                    model.links = links;
                    COSTS.with(|c| *c.borrow_mut() = Some(Arc::new(model)));
                    Ok(gpu)
                }
                Err(e) => Err(format!("measuring readback on {}: {e}", gpu.adapter())),
            }
        }
        Err(e) => Err(e.to_string()),
    };
    GPU.with(|g| *g.borrow_mut() = Some(opened.clone()));
    opened
}

/// The page's cost model: priors until sessions teach it, links measured in this browser once
/// a GPU was opened.
pub fn page_costs(gpu: Option<&Arc<Gpu>>) -> Arc<CostModel> {
    COSTS.with(|c| {
        c.borrow_mut()
            .get_or_insert_with(|| {
                let adapter = gpu.map(|g| AdapterKey::from_desc(g.adapter()));
                let mut model = CostModel::unmeasured(adapter, CpuKey::detect(1));
                model.gpu_timestamps = gpu.is_some_and(|g| g.has_timestamps());
                Arc::new(model)
            })
            .clone()
    })
}

/// Round trips and bandwidth of this browser's CPU-GPU link: `sync` is the median time of a
/// 4-byte upload + readback (submit, `mapAsync`, copy out), and upload/download cost per byte
/// comes from a 1 MiB round trip beyond that. Three of each; medians.
pub async fn measure_links(gpu: &Gpu) -> Result<Links> {
    const BIG: usize = 1 << 18; // f32 elements: 1 MiB
    let tiny = Tensor::f32(&[1], vec![1.0]);
    let big = Tensor::f32(&[BIG], vec![0.5; BIG]);
    let mut small = Vec::new();
    let mut large = Vec::new();
    // The first round trip allocates the staging buffers; it is not timed.
    round_trip(gpu, &tiny).await?;
    for _ in 0..3 {
        small.push(round_trip(gpu, &tiny).await?);
        large.push(round_trip(gpu, &big).await?);
    }
    let sync = median(&mut small);
    // Below timer resolution and noise the difference can vanish: never assume more than
    // 50 GB/s.
    let per_byte = ((median(&mut large) - sync) / (2.0 * 4.0 * BIG as f64)).max(1.0 / 50e9);
    let line = Line {
        latency: 0.0,
        seconds_per_byte: per_byte,
    };
    Ok(Links {
        upload: line,
        download: line,
        sync,
        // Not measured here: without timestamps the GPU's learnt times are not kept, and the
        // prior's launch cost stands for the recording.
        dispatch: 0.0,
    })
}

/// Seconds for one upload of `t` and its readback.
async fn round_trip(gpu: &Gpu, t: &Tensor) -> Result<f64> {
    let began = Instant::now();
    let g = gpu.upload(t)?;
    gpu.download_async(&[(&g, &t.shape)]).await?;
    Ok(began.elapsed().as_secs_f64())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
