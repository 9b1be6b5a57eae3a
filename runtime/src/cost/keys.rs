//! What a cost profile is valid for: the GPU adapter, the CPU (with the thread count in use), the
//! shader sources and the CPU kernels' sources, and the file name derived from them.
//!
//! Sits between the device descriptions (`gpu::AdapterDesc`, `cpu_info::CpuInfo`) and the
//! persisted profiles (`cost/persist.rs`).

use crate::cpu_info::CpuInfo;
use crate::gpu::AdapterDesc;
use serde::{Deserialize, Serialize};

/// Identifies a GPU adapter and its driver: a profile measured on one is not used on another.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AdapterKey {
    pub vendor: u32,
    pub device: u32,
    pub name: String,
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
}

impl AdapterKey {
    pub fn from_desc(d: &AdapterDesc) -> AdapterKey {
        AdapterKey {
            vendor: d.vendor,
            device: d.device,
            name: d.name.clone(),
            backend: d.backend.clone(),
            driver: d.driver.clone(),
            driver_info: d.driver_info.clone(),
        }
    }
}

/// Identifies the CPU side: model, cores, SIMD level and the kernel thread count in use. The
/// SIMD level is the CPU's (`avx512f+fma`) and the one tandem's kernels run at
/// (`tandem_ops::simd::level`, lowered by `TANDEM_SIMD`), e.g. `avx512f+fma, kernels avx2`,
/// so a profile measured at one level is not used at another.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CpuKey {
    pub model: String,
    pub cores: usize,
    pub simd: String,
    pub threads: usize,
}

impl CpuKey {
    /// This host's CPU with `threads` kernel threads.
    pub fn detect(threads: usize) -> CpuKey {
        CpuKey::from_info(&CpuInfo::detect(), threads)
    }

    pub fn from_info(info: &CpuInfo, threads: usize) -> CpuKey {
        CpuKey {
            model: info.model.clone(),
            cores: info.cores,
            simd: format!(
                "{}, kernels {}",
                info.simd,
                tandem_ops::simd::level().name()
            ),
            threads: threads.max(1),
        }
    }
}

/// 64-bit FNV-1a: stable across Rust versions and platforms (unlike `DefaultHasher`).
pub fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Hash of every shader's name and source (`tandem_shaders::ALL`), as 16 hex digits. Changing
/// any kernel changes it, which invalidates the GPU entries of saved profiles.
pub fn shader_hash() -> String {
    let mut h = FNV_OFFSET;
    for s in tandem_shaders::ALL {
        h = fnv1a(s.name.as_bytes(), h);
        h = fnv1a(&[0], h);
        h = fnv1a(s.source.as_bytes(), h);
        h = fnv1a(&[0], h);
    }
    format!("{h:016x}")
}

/// Hash of the CPU kernels' sources (every `.rs` file of the ops crate, computed by the build
/// script). Changing any CPU kernel changes it, which makes saved profiles stale: a faster CPU
/// kernel with an old profile would otherwise send work to the GPU for nothing.
pub fn cpu_kernels_hash() -> &'static str {
    env!("TANDEM_CPU_KERNELS_HASH")
}

/// File stem of the profile for this (adapter, CPU, shaders, CPU kernels) combination.
pub fn profile_stem(
    adapter: Option<&AdapterKey>,
    cpu: &CpuKey,
    shaders: &str,
    cpu_kernels: &str,
) -> String {
    let text =
        serde_json::to_string(&(adapter, cpu, shaders, cpu_kernels)).expect("keys serialise");
    format!("{:016x}", fnv1a(text.as_bytes(), FNV_OFFSET))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_vectors() {
        assert_eq!(fnv1a(b"", FNV_OFFSET), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a", FNV_OFFSET), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar", FNV_OFFSET), 0x85944171f73967e8);
    }

    #[test]
    fn stems_differ_by_adapter_threads_and_shaders() {
        let cpu = CpuKey {
            model: "m".into(),
            cores: 2,
            simd: "avx2".into(),
            threads: 1,
        };
        let a = AdapterKey {
            vendor: 1,
            device: 2,
            name: "x".into(),
            backend: "Vulkan".into(),
            driver: "d".into(),
            driver_info: "i".into(),
        };
        let base = profile_stem(Some(&a), &cpu, "h", "k");
        assert_ne!(base, profile_stem(None, &cpu, "h", "k"));
        assert_ne!(base, profile_stem(Some(&a), &cpu, "h2", "k"));
        assert_ne!(base, profile_stem(Some(&a), &cpu, "h", "k2"));
        let cpu2 = CpuKey {
            threads: 2,
            ..cpu.clone()
        };
        assert_ne!(base, profile_stem(Some(&a), &cpu2, "h", "k"));
        assert_eq!(base, profile_stem(Some(&a.clone()), &cpu, "h", "k"));
        assert_eq!(shader_hash().len(), 16);
        assert_eq!(cpu_kernels_hash().len(), 16, "built inside the workspace");
    }
}
