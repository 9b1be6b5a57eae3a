//! CPU GEMM next to the machine's f32 peak: tandem's MatMul kernel (the op the runtime runs),
//! the `gemm` crate called directly, and numpy's BLAS (through `scripts/ort_driver.py
//! --numpy-gemm`), all on the same thread count in the same run, taking turns (`TURNS`):
//! measured one after another, the same call through tandem and the crate read 143 and 109
//! GFLOP/s in one run (2026-11-30, a 2-vCPU VM whose speed swings by up to 2x within
//! minutes), whichever ran in the slow stretch losing.
//!
//! Sits between `tandem_ops` (MatMul through the op registry), the `gemm` crate, the Python
//! venv and the report's `GemmResult`.

use crate::machine::f32_peak;
use crate::schema::GemmResult;
use std::time::Instant;
use tandem::cpu_info::CpuInfo;
use tandem_ops::cpu_gemm::{crate_gemm, Parallelism};
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

/// Turns each implementation takes, each `secs / TURNS` long (module docs).
const TURNS: usize = 4;

/// Each of `measures` called `turns` times, in turn (all of them once, then all again), and
/// the best (largest) result of each; a measure that fails in any turn gives its first error.
fn best_in_turns(
    turns: usize,
    measures: &mut [&mut dyn FnMut() -> Result<f64, String>],
) -> Vec<Result<f64, String>> {
    let mut best: Vec<Result<f64, String>> = vec![Ok(f64::NEG_INFINITY); measures.len()];
    for _ in 0..turns {
        for (m, b) in measures.iter_mut().zip(&mut best) {
            if let Ok(so_far) = b {
                *b = m().map(|g| g.max(*so_far));
            }
        }
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
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    let t = best_of(secs, || {
        let rs = n as isize;
        // SAFETY: a, b, c are n x n row-major buffers of n*n floats (row stride n, col 1).
        unsafe {
            crate_gemm(
                (n, n, n),
                (c.as_mut_ptr(), 1, rs),
                false,
                (a.as_ptr(), 1, rs),
                (b.as_ptr(), 1, rs),
                (0.0, 1.0),
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
    let turn = secs / TURNS as f64;
    let mut numpy_name = String::new();
    let best = best_in_turns(
        TURNS,
        &mut [
            &mut || tandem_matmul_gflops(n, threads, turn),
            &mut || Ok(gemm_crate_gflops(n, threads, turn)),
            &mut || {
                numpy_gflops(n, threads, turn).map(|(g, name)| {
                    numpy_name = name;
                    g
                })
            },
        ],
    );
    let named = |name: String, r: &Result<f64, String>, failed: &str| match r {
        Ok(g) => (name, *g),
        Err(e) => (format!("{name} ({failed}: {e})"), f64::NAN),
    };
    let numpy = match best[2] {
        Ok(_) => numpy_name,
        Err(_) => "numpy".to_string(),
    };
    let gflops = vec![
        named("tandem MatMul".to_string(), &best[0], "failed"),
        named("gemm crate 0.19".to_string(), &best[1], "failed"),
        named(numpy, &best[2], "unavailable"),
    ];
    GemmResult {
        shape: format!("{n}x{n}x{n}"),
        threads,
        peak,
        gflops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// The measures take turns (a slow stretch of the machine then falls on every one), each
    /// keeps its best turn, and one that fails stops being called and reports its error.
    #[test]
    fn measures_take_turns_and_keep_their_best() {
        let calls = RefCell::new(Vec::new());
        let script = [[3.0, 5.0, 4.0], [9.0, 1.0, 2.0]];
        let turn = |i: usize| {
            let mut c = calls.borrow_mut();
            c.push(i);
            c.iter().filter(|&&j| j == i).count() - 1
        };
        let best = best_in_turns(
            3,
            &mut [
                &mut || Ok(script[0][turn(0)]),
                &mut || Ok(script[1][turn(1)]),
                &mut || match turn(2) {
                    0 => Ok(7.0),
                    _ => Err("gone".to_string()),
                },
            ],
        );
        assert_eq!(calls.into_inner(), vec![0, 1, 2, 0, 1, 2, 0, 1]);
        assert_eq!(best, vec![Ok(5.0), Ok(9.0), Err("gone".to_string())]);
    }
}
