//! Build script: a hash of the CPU kernels' sources (every `.rs` file under `ops/src`), so that a
//! cost profile measured with other CPU kernels is recognised as stale (`cost::keys`).
//!
//! Sits between the ops crate's sources and `tandem::cost::keys::cpu_kernels_hash`.

use std::path::{Path, PathBuf};

/// 64-bit FNV-1a, the same function as `cost::keys::fnv1a`.
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/src");
    println!("cargo:rerun-if-changed={}", ops.display());
    println!("cargo:rerun-if-changed=build.rs");
    let mut files = Vec::new();
    rust_files(&ops, &mut files);
    files.sort();
    let hash = if files.is_empty() {
        // Built without the workspace (a packaged crate): the ops crate's version stands in.
        format!("ops-{}", env!("CARGO_PKG_VERSION"))
    } else {
        let mut h = 0xcbf2_9ce4_8422_2325;
        for f in &files {
            let rel = f.strip_prefix(&ops).unwrap_or(f);
            h = fnv1a(rel.to_string_lossy().replace('\\', "/").as_bytes(), h);
            h = fnv1a(&[0], h);
            h = fnv1a(&std::fs::read(f).unwrap_or_default(), h);
            h = fnv1a(&[0], h);
        }
        format!("{h:016x}")
    };
    println!("cargo:rustc-env=TANDEM_CPU_KERNELS_HASH={hash}");
}
