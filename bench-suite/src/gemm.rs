//! CPU GEMM next to the machine's f32 peak: tandem's MatMul kernel (the op the runtime runs),
//! the `gemm` crate called directly, and numpy's BLAS (through `scripts/ort_driver.py
//! --numpy-gemm`), all on the same thread count in the same run.
//!
//! Sits between `tandem_ops` (MatMul through the op registry), the `gemm` crate, the Python
//! venv and the report's `GemmResult`.

use crate::machine::f32_peak;
use crate::schema::GemmResult;
use std::time::Instant;
use tandem::cpu_info::CpuInfo;
use tandem_ops::{registry, Attrs, DType, Tensor};

fn fill(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + seed) % 23) as f32 / 23.0 - 0.5)
        .collect()
}

/// Best time of `f` over `secs` seconds (after one warm-up call), seconds.
fn best_of(secs: f64, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    while start.elapsed().as_secs_f64() < secs || best.is_infinite() {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// GFLOP/s of tandem's MatMul CPU kernel on `n^3` with `threads` threads.
pub fn tandem_matmul_gflops(n: usize, threads: usize, secs: f64) -> Result<f64, String> {
    let op = registry::build("MatMul", &Attrs::new(17)).map_err(|e| e.to_string())?;
    let ins = [
        Tensor::f32(&[n, n], fill(n * n, 0)),
        Tensor::f32(&[n, n], fill(n * n, 5)),
    ];
    let refs: Vec<&Tensor> = ins.iter().collect();
    let mut out = vec![Tensor::zeros(DType::F32, &[n, n])];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    let mut err = None;
    let t = pool.install(|| {
        best_of(secs, || {
            if let Err(e) = op.cpu(&refs, &mut out, 0..n) {
                err = Some(e.to_string());
            }
        })
    });
    match err {
        Some(e) => Err(e),
        None => Ok(2.0 * (n as f64).powi(3) / t / 1e9),
    }
}

/// GFLOP/s of the `gemm` crate called directly on `n^3` with `threads` threads.
pub fn gemm_crate_gflops(n: usize, threads: usize, secs: f64) -> f64 {
    let (a, b) = (fill(n * n, 0), fill(n * n, 5));
    let mut c = vec![0.0f32; n * n];
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let t = best_of(secs, || {
        // SAFETY: a, b, c are n x n row-major buffers of n*n floats (row stride n, col 1).
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                par,
            )
        }
    });
    std::hint::black_box(&c);
    2.0 * (n as f64).powi(3) / t / 1e9
}

/// numpy's BLAS on `n^3` with `threads` threads: (GFLOP/s, `numpy <version> <blas>`).
pub fn numpy_gflops(n: usize, threads: usize, secs: f64) -> Result<(f64, String), String> {
    let out = std::process::Command::new(crate::peers::ort::python())
        .arg(crate::peers::ort::repo_root().join("scripts/ort_driver.py"))
        .args(["--numpy-gemm", &n.to_string()])
        .args(["--threads", &threads.to_string()])
        .args(["--secs", &secs.to_string()])
        .output()
        .map_err(|e| format!("cannot start Python: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("numpy gemm: {e}"))?;
    Ok((
        v["gflops"].as_f64().unwrap_or(f64::NAN),
        format!(
            "numpy {} ({})",
            v["numpy"].as_str().unwrap_or("?"),
            v["blas"].as_str().unwrap_or("?")
        ),
    ))
}

/// The whole comparison at `n^3` on `threads` threads; unavailable parts are left out with a
/// note in the implementation's name.
pub fn measure(n: usize, threads: usize, secs: f64) -> GemmResult {
    let info = CpuInfo::detect();
    let peak = f32_peak(&info, threads.min(info.cores)).unwrap_or(crate::schema::Peak {
        lanes: 0,
        fma_units: 0,
        cores: threads,
        clock_ghz: f64::NAN,
        cpuinfo_ghz: None,
        gflops: f64::NAN,
    });
    let mut gflops = Vec::new();
    match tandem_matmul_gflops(n, threads, secs) {
        Ok(g) => gflops.push(("tandem MatMul".to_string(), g)),
        Err(e) => gflops.push((format!("tandem MatMul (failed: {e})"), f64::NAN)),
    }
    gflops.push((
        "gemm crate 0.19".to_string(),
        gemm_crate_gflops(n, threads, secs),
    ));
    match numpy_gflops(n, threads, secs) {
        Ok((g, name)) => gflops.push((name, g)),
        Err(e) => gflops.push((format!("numpy (unavailable: {e})"), f64::NAN)),
    }
    GemmResult {
        shape: format!("{n}x{n}x{n}"),
        threads,
        peak,
        gflops,
    }
}
