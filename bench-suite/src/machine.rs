//! The machine a run measures: host memory high-water mark, the CPU clock and its f32 peak,
//! and the keys (`CpuInfo`, `AdapterKey`) reports are pooled by.
//!
//! Sits between the OS (`/proc/self/status`, `/proc/self/clear_refs`), the CPU (a timed
//! dependent add chain for the clock, timed independent FMA chains for its vector FMA pipes)
//! and the report's `Machine` and `Peak`.

use crate::schema::{Machine, Peak};
use std::time::Instant;
use tandem::cost::keys::AdapterKey;
use tandem::cpu_info::CpuInfo;

/// Reset this process's peak-RSS counter (VmHWM) to the current RSS (Linux >= 4.0); returns
/// false where that is not possible (then peaks include earlier rows).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's peak resident memory (VmHWM) in MiB, where the OS reports it.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The clock of the core this thread runs on, GHz, best of `times` timings: a chain of
/// dependent register-register adds (`x += x`) retires one add per cycle on every x86-64 core
/// of the last decade. Not `x += 1`: Intel cores from Golden Cove on fold chains of immediate
/// adds at rename (an H100 host's Xeon measured "10.4 GHz" that way).
#[cfg(target_arch = "x86_64")]
pub fn measure_clock_ghz(times: usize) -> Option<f64> {
    const ITERS: u64 = 1_000_000;
    let best = best_seconds(times, || {
        let mut x: u64 = 1;
        let mut n = ITERS;
        // SAFETY: register-only arithmetic, no memory access.
        unsafe {
            std::arch::asm!(
                "2:",
                "add {x}, {x}", "add {x}, {x}", "add {x}, {x}", "add {x}, {x}",
                "add {x}, {x}", "add {x}, {x}", "add {x}, {x}", "add {x}, {x}",
                "dec {n}",
                "jnz 2b",
                x = inout(reg) x,
                n = inout(reg) n,
                options(nomem, nostack),
            );
        }
        std::hint::black_box((x, n));
    });
    Some(8.0 * ITERS as f64 / best / 1e9)
}

#[cfg(not(target_arch = "x86_64"))]
pub fn measure_clock_ghz(times: usize) -> Option<f64> {
    let _ = times;
    None
}

/// The clock `/proc/cpuinfo` states (`cpu MHz` of the first core), GHz: a cross-check of the
/// measured one (virtual machines often report the nominal clock).
pub fn cpuinfo_ghz() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu MHz"))?;
    let mhz: f64 = line.split(':').nth(1)?.trim().parse().ok()?;
    Some(mhz / 1e3)
}

/// The 1-minute load average (`/proc/loadavg`): above the core count, other work competed
/// with the measurement.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// f32 lanes of the widest SIMD the kernels use (from `CpuInfo::simd`).
pub fn simd_lanes(simd: &str) -> usize {
    if simd.starts_with("avx512") {
        16
    } else if simd.starts_with("avx") {
        8
    } else if simd.starts_with("sse") || simd.starts_with("neon") || simd == "simd128" {
        4
    } else {
        1
    }
}

/// Independent FMA chains the throughput loop keeps in flight: at least latency (4 cycles)
/// x pipes (2) on every x86 core of the last decade, and within AVX2's 16 registers.
const FMA_CHAINS: usize = 12;

/// Rounds of the throughput loop per timing (each `FMA_CHAINS` FMAs).
const FMA_ROUNDS: usize = 100_000;

/// Best of `times` short timings of `body` (seconds): on a shared machine some run gets a whole
/// time slice.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
fn best_seconds(times: usize, mut body: impl FnMut()) -> f64 {
    (0..times)
        .map(|_| {
            let t = Instant::now();
            body();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// `FMA_CHAINS` independent chains of `FMA_ROUNDS` vector FMAs on `V`, through `fma`.
#[inline(always)]
fn fma_chains<V: Copy>(start: V, m: V, fma: impl Fn(V, V) -> V) -> [V; FMA_CHAINS] {
    let mut acc = [start; FMA_CHAINS];
    for _ in 0..FMA_ROUNDS {
        for a in &mut acc {
            *a = fma(*a, m);
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_loop_avx512() {
    use std::arch::x86_64::*;
    let m = std::hint::black_box(_mm512_set1_ps(0.999_999));
    let acc = fma_chains(_mm512_set1_ps(1.0), m, |a, m| _mm512_fmadd_ps(a, m, m));
    std::hint::black_box(acc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_loop_avx2() {
    use std::arch::x86_64::*;
    let m = std::hint::black_box(_mm256_set1_ps(0.999_999));
    let acc = fma_chains(_mm256_set1_ps(1.0), m, |a, m| _mm256_fmadd_ps(a, m, m));
    std::hint::black_box(acc);
}

#[cfg(target_arch = "aarch64")]
fn fma_loop_neon() {
    use std::arch::aarch64::*;
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe {
        let m = std::hint::black_box(vdupq_n_f32(0.999_999));
        let acc = fma_chains(vdupq_n_f32(1.0), m, |a, m| vfmaq_f32(m, a, m));
        std::hint::black_box(acc);
    }
}

/// Vector FMAs one core retires per second on the widest vectors the kernels use (`simd`, from
/// `CpuInfo::simd`), best of `times` timings; `None` without FMA.
pub fn measure_fma_rate(simd: &str, times: usize) -> Option<f64> {
    let fmas = (FMA_CHAINS * FMA_ROUNDS) as f64;
    #[cfg(target_arch = "x86_64")]
    {
        if simd.starts_with("avx512") && is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present (checked above).
            return Some(fmas / best_seconds(times, || unsafe { fma_loop_avx512() }));
        }
        if simd.contains("fma")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA are present (checked above).
            return Some(fmas / best_seconds(times, || unsafe { fma_loop_avx2() }));
        }
    }
    #[cfg(target_arch = "aarch64")]
    if simd == "neon" {
        return Some(fmas / best_seconds(times, fma_loop_neon));
    }
    let _ = (simd, fmas, times);
    None
}

/// Turns of [`clock_and_fma_per_cycle`], and timings of each loop per turn.
const TURNS: usize = 20;
const TIMINGS_PER_TURN: usize = 20;

/// The clock (GHz, the best turn's) and the vector FMAs retired per cycle (the largest ratio of
/// one turn's FMA rate to the same turn's clock; `None` without FMA), timed in `TURNS` turns
/// of the add chain then the FMA loop, about a second in all. On the 2-vCPU VMs here the FMA
/// rate per cycle changes from moment to moment (an Emerald Rapids host, 30 measurements in a
/// row: 1.49 to 2.01, while the add chain kept its clock), so one short window of FMA
/// timings read 1 pipe where there are 2 (and put tandem's MatMul at "120 %" of peak,
/// 2026-11-28).
pub fn clock_and_fma_per_cycle(simd: &str) -> Option<(f64, Option<f64>)> {
    let (mut clock, mut per_cycle) = (None::<f64>, None::<f64>);
    for _ in 0..TURNS {
        let c = measure_clock_ghz(TIMINGS_PER_TURN)?;
        clock = Some(clock.map_or(c, |b| b.max(c)));
        if let Some(rate) = measure_fma_rate(simd, TIMINGS_PER_TURN) {
            let r = rate / (c * 1e9);
            per_cycle = Some(per_cycle.map_or(r, |b| b.max(r)));
        }
    }
    Some((clock?, per_cycle))
}

/// Vector FMAs per cycle, measured, to the nearest whole pipe (at least 1). Zen 4 runs a
/// 512-bit FMA as two 256-bit halves: 1 per cycle where Zen 5 and Intel server cores retire 2,
/// so the pipe count cannot be assumed from the SIMD level.
pub fn fma_units(per_cycle: f64) -> usize {
    (per_cycle.round() as usize).max(1)
}

/// The f32 peak of `cores` cores: `cores x clock x lanes x fma_units x 2` flops per second, with
/// the clock and the FMA pipes both measured on this core.
pub fn f32_peak(info: &CpuInfo, cores: usize) -> Option<Peak> {
    let (clock_ghz, per_cycle) = clock_and_fma_per_cycle(&info.simd)?;
    let lanes = simd_lanes(&info.simd);
    let fma = per_cycle.map_or(1, fma_units);
    Some(Peak {
        lanes,
        fma_units: fma,
        cores,
        clock_ghz,
        cpuinfo_ghz: cpuinfo_ghz(),
        gflops: cores as f64 * clock_ghz * lanes as f64 * fma as f64 * 2.0,
    })
}

/// `git describe --always --dirty` of the working tree, if git and a repository are there.
pub fn git_describe() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Round trip of a cache line between two threads that pass it back and forth through an
/// atomic, in ns (the quickest of 9 batches of 1,000, so that a batch in which another
/// process took one of the two CPUs does not count; one past 20 ms is dropped): how far apart
/// two cores the OS gives the process are, which decides what a multi-threaded kernel pays
/// for data another thread wrote. On a VM the host may move the vCPUs: a 2-vCPU AMD EPYC
/// Zen 5 measured 60-130 ns in some minutes and 360-420 ns in others (other core complexes),
/// where two-thread convs ran up to twice as long (docs/bench.md, "This host's two speeds").
/// `None` with fewer than two CPUs, or where every batch ran past its bound.
pub fn core_round_trip_ns() -> Option<f64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    const TRIPS: u64 = 1_000;
    // A batch past this (the other thread waiting for a CPU) is dropped.
    const BOUND: Duration = Duration::from_millis(20);
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return None;
    }
    let batch = || {
        let (ball, stop) = (AtomicU64::new(0), AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..=TRIPS {
                    while ball.load(Ordering::Acquire) != 2 * i + 1 {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                    }
                    ball.store(2 * i + 2, Ordering::Release);
                }
            });
            // Trip 0, untimed, waits for the other thread to start.
            let (begun, mut start) = (Instant::now(), Instant::now());
            for i in 0..=TRIPS {
                if i == 1 {
                    start = Instant::now();
                }
                ball.store(2 * i + 1, Ordering::Release);
                let mut polls = 0u32;
                while ball.load(Ordering::Acquire) != 2 * i + 2 {
                    polls = polls.wrapping_add(1);
                    if polls.is_multiple_of(4096) && begun.elapsed() > BOUND {
                        stop.store(true, Ordering::Relaxed);
                        return None;
                    }
                }
            }
            Some(start.elapsed().as_nanos() as f64 / TRIPS as f64)
        })
    };
    (0..9).filter_map(|_| batch()).min_by(f64::total_cmp)
}

/// This machine as the report keys it, with the adapters measured (the default one first).
pub fn describe(adapters: Vec<AdapterKey>) -> Machine {
    let info = CpuInfo::detect();
    Machine {
        cpu_model: info.model,
        cores: info.cores,
        simd: info.simd,
        adapter: adapters.first().cloned(),
        adapters,
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        git: git_describe(),
        load_average_start: load_average(),
        load_average_end: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_follow_the_simd_level() {
        assert_eq!(simd_lanes("avx512f+fma"), 16);
        assert_eq!(simd_lanes("avx2+fma"), 8);
        assert_eq!(simd_lanes("neon"), 4);
        assert_eq!(simd_lanes("scalar"), 1);
    }

    #[test]
    fn fma_pipes_are_whole_numbers_of_the_measured_rate() {
        assert_eq!(fma_units(2.01), 2);
        assert_eq!(fma_units(1.6), 2);
        assert_eq!(fma_units(0.98), 1);
        assert_eq!(fma_units(0.05), 1);
    }

    #[test]
    fn fma_rate_is_measured_wherever_the_kernels_have_fma() {
        let info = CpuInfo::detect();
        let rate = measure_fma_rate(&info.simd, 10);
        if info.simd.contains("fma") || info.simd == "neon" {
            let r = rate.unwrap_or_else(|| panic!("{} has FMA but no measured rate", info.simd));
            assert!(r.is_finite() && r > 0.0, "rate {r}");
        } else {
            assert_eq!(rate, None, "{}", info.simd);
        }
    }

    /// Two threads on two CPUs pass a line in tens to thousands of ns (a core's own L1 would
    /// be about 1 ns, a descheduled partner milliseconds).
    #[test]
    fn a_core_round_trip_is_measured_where_there_are_two_cpus() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        match core_round_trip_ns() {
            Some(ns) => assert!((10.0..100_000.0).contains(&ns), "{ns} ns"),
            None => assert!(cpus < 2, "{cpus} CPUs and no round trip"),
        }
    }

    #[test]
    fn clock_and_fma_per_cycle_are_plausible() {
        let info = CpuInfo::detect();
        let measured = clock_and_fma_per_cycle(&info.simd);
        assert_eq!(
            measured.is_some(),
            cfg!(target_arch = "x86_64"),
            "x86-64 measures its clock"
        );
        let Some((ghz, per_cycle)) = measured else {
            return;
        };
        assert!((0.5..7.0).contains(&ghz), "clock {ghz} GHz");
        if info.simd.contains("fma") {
            let r = per_cycle.expect("a rate where the kernels have FMA");
            assert!((0.5..4.5).contains(&r), "{r} vector FMAs per cycle");
        }
    }

    #[test]
    fn peak_rss_is_read_and_at_least_the_allocation() {
        let before = peak_rss_mib().expect("Linux reports VmHWM");
        let v = vec![1u8; 64 << 20];
        std::hint::black_box(&v);
        let after = peak_rss_mib().unwrap();
        assert!(after >= before);
        assert!(after >= 64.0, "64 MiB touched, VmHWM {after} MiB");
    }
}
