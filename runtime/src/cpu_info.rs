//! What the host CPU is: model name, cores, SIMD level. Used by `tandem info` and as part of the
//! key of CPU cost profiles.
//!
//! Sits between the operating system (`/proc/cpuinfo`, CPUID) and the rest of the runtime.

/// The host CPU as the cost model keys it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CpuInfo {
    pub model: String,
    pub cores: usize,
    /// Widest SIMD the kernels can use here, e.g. `avx512f+fma`, `avx2+fma`, `neon`, `simd128`.
    pub simd: String,
}

impl CpuInfo {
    pub fn detect() -> CpuInfo {
        CpuInfo {
            model: model_name(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            simd: simd_level(),
        }
    }
}

fn model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[allow(unreachable_code)]
fn simd_level() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let fma = if is_x86_feature_detected!("fma") {
            "+fma"
        } else {
            ""
        };
        let level = if is_x86_feature_detected!("avx512f") {
            "avx512f"
        } else if is_x86_feature_detected!("avx2") {
            "avx2"
        } else if is_x86_feature_detected!("avx") {
            "avx"
        } else {
            "sse2"
        };
        return format!("{level}{fma}");
    }
    #[cfg(target_arch = "aarch64")]
    {
        return "neon".into();
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        return "simd128".into();
    }
    "scalar".into()
}
