//! Fuzz target: arbitrary bytes as a model. Loading must end in a session or a typed error;
//! a session is planned and run on the CPU with zero-filled inputs of the declared shapes
//! (symbolic dims as 1), within 1 GiB of host memory, when they hold at most `MAX_INPUT_ELEMENTS` elements in all.
//! Seeds: `runtime/fuzz/seed.sh` (real models and ONNX node-test models).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tandem::{DType, Placement, Session, SessionOptions, Tensor};

const MAX_INPUT_ELEMENTS: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let opts = SessionOptions::default()
        .placement(Placement::Cpu)
        .cpu_threads(1)
        .max_host_memory(1 << 30);
    let Ok(session) = Session::new(data, opts) else {
        return;
    };
    let mut feeds = Vec::new();
    let mut total = 0usize;
    for io in session.inputs() {
        let shape = io.shape_or_ones();
        let Some(n) = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) else {
            return;
        };
        total = total.saturating_add(n);
        if total > MAX_INPUT_ELEMENTS {
            return;
        }
        feeds.push((
            io.name,
            Tensor::zeros(io.dtype.unwrap_or(DType::F32), &shape),
        ));
    }
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    if session.plan(&feeds).is_ok() {
        let _ = session.run(&feeds);
    }
});
