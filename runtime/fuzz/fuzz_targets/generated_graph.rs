//! Fuzz target: the bytes drive `tandem::fuzzgen`, which builds a random model of supported
//! ops; it is loaded, planned and run on the CPU and, when this machine has a GPU adapter, with
//! placements gpu and auto too. Crashes: a panic anywhere, outputs that differ between the CPU
//! and another placement, or a valid (non-hostile) model that fails on the CPU.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};
use tandem::cost::{AdapterKey, CostModel, CpuKey};
use tandem::fuzzgen::{from_bytes, run_everywhere};
use tandem::gpu::Gpu;

/// The GPU (opened once per process) and a cost model for `auto`, if there is an adapter.
fn gpu() -> &'static Option<(Arc<Gpu>, Arc<CostModel>)> {
    static GPU: OnceLock<Option<(Arc<Gpu>, Arc<CostModel>)>> = OnceLock::new();
    GPU.get_or_init(|| {
        let gpu = Arc::new(Gpu::new().ok()?);
        let key = AdapterKey::from_desc(gpu.adapter());
        let costs = CostModel::unmeasured(Some(key), CpuKey::detect(1));
        Some((gpu, Arc::new(costs)))
    })
}

fuzz_target!(|data: &[u8]| {
    let g = from_bytes(data);
    let (gpu, costs) = match gpu() {
        Some((g, c)) => (Some(g.clone()), Some(c.clone())),
        None => (None, None),
    };
    let outcome = run_everywhere(&g, gpu, costs);
    assert!(
        outcome.mismatches.is_empty(),
        "outputs differ from the CPU: {:?}",
        outcome.mismatches
    );
    if let (false, Some((_, Err(e)))) = (g.hostile, outcome.runs.first()) {
        panic!("a valid generated model fails on the CPU: {e}");
    }
});
