//! Run-time choice of the vector instruction set for the ops' hot CPU loops.
//!
//! Sits between the ops' CPU loops and the CPU's instruction set. This crate is compiled for
//! the target's baseline (SSE2 on x86-64, NEON on aarch64, simd128-less wasm32), so a plain
//! loop uses 4-lane vectors at best. [`kernel!`](crate::simd::kernel) wraps a function so that
//! its body is compiled three times on x86-64 — for AVX-512 (F/BW/DQ/VL), for AVX2 + FMA and
//! for the baseline — and each call runs the widest copy the CPU supports, detected once
//! ([`level`]). The compiler autovectorises the same Rust source for each level; kernel bodies
//! are written for that (slices cut to length before the loop, `chunks_exact`, fixed-width
//! partial sums for reductions, no early exits, `#[inline(always)]` helpers, no `mul_add`, and
//! `for` loops rather than `Iterator::for_each` around a large closure: a `for_each` the
//! compiler leaves out of line is compiled for the baseline, whatever the caller's level).
//! Rust never contracts `a * b + c` into an FMA and never reorders float reductions, so every
//! level computes bit-identical results; only the speed differs. Other targets always run the
//! baseline copy.
//!
//! `TANDEM_SIMD=baseline|avx2|avx512` caps the level (read once, for A/B timing in one build).

use std::sync::atomic::{AtomicU8, Ordering};

/// An instruction-set level a [`kernel!`](crate::simd::kernel) function has a copy for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The target's baseline (SSE2 on x86-64; every non-x86-64 target).
    Baseline = 0,
    /// x86-64 AVX2 + FMA + F16C (256-bit vectors).
    Avx2 = 1,
    /// x86-64 AVX-512 F/BW/DQ/VL + AVX2 + FMA + F16C (512-bit vectors).
    Avx512 = 2,
}

impl Level {
    /// Name as `TANDEM_SIMD` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Baseline => "baseline",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    /// f32 lanes of this level's widest vector (4 for the baseline's 128-bit vectors).
    pub fn f32_lanes(self) -> usize {
        match self {
            Level::Baseline => 4,
            Level::Avx2 => 8,
            Level::Avx512 => 16,
        }
    }

    fn from_u8(v: u8) -> Level {
        match v {
            2 => Level::Avx512,
            1 => Level::Avx2,
            _ => Level::Baseline,
        }
    }
}

/// Not detected yet.
const UNSET: u8 = u8::MAX;
static DETECTED: AtomicU8 = AtomicU8::new(UNSET);

/// The widest level this CPU runs, ignoring `TANDEM_SIMD`.
pub fn cpu_level() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let v3 = has!("avx2") && has!("fma") && has!("f16c");
        if v3 && has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
            return Level::Avx512;
        }
        if v3 {
            return Level::Avx2;
        }
    }
    Level::Baseline
}

/// Whether [`level`] is AVX-512: the paths written with AVX-512 intrinsics alone run only
/// then.
#[inline]
pub fn avx512() -> bool {
    level() == Level::Avx512
}

/// Whether [`avx512`] holds on a core that runs 512-bit vectors at full width, so that an
/// AVX-512 instruction does twice an AVX2 one's work. AMD Zen 4 (family 0x19) splits each
/// into two 256-bit halves: there the conv paths chosen for AVX-512's width (the taps kernel
/// and the in-place im2col on 13x13 to 14x14 planes) lose to Winograd, as on AVX2 hosts
/// (`conv_winograd.rs`, docs/bench.md "Zen 4: Winograd where AVX2 hosts take it").
/// `TANDEM_AVX512_FULL_WIDTH=0|1` overrides the detection (read once, for A/B timing).
pub fn avx512_full_width() -> bool {
    static FULL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    avx512() && *FULL.get_or_init(|| full_width_override().unwrap_or(!amd_family_19h()))
}

/// `TANDEM_AVX512_FULL_WIDTH=0|1` (read once): what [`avx512_full_width`] says whatever the
/// CPU, and [`winograd_over_wide_paths`] with it; `None` where unset or another value.
fn full_width_override() -> Option<bool> {
    static SET: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *SET.get_or_init(
        || match std::env::var("TANDEM_AVX512_FULL_WIDTH").as_deref() {
            Ok("0") => Some(false),
            Ok("1") => Some(true),
            _ => None,
        },
    )
}

/// Whether the conv paths built for AVX-512 at full width (the taps kernel for convs of few
/// channels, the in-place im2col on 13x13 to 14x14 planes) lose to Winograd on this CPU: where
/// AVX-512 is not at full width ([`avx512_full_width`] false: AVX2, AMD Zen 4), and on AMD
/// Zen 5 (family 0x1A), which runs it at full width but where, since Winograd's output
/// transforms run in registers (`conv_winograd_out_avx512.rs`), squeezenet took 0.92-0.95x of
/// its time with them (docs/bench.md, "Zen 5"). Intel's full-width cores were measured before
/// that change only. `TANDEM_AVX512_FULL_WIDTH=0|1` decides alone where set.
pub fn winograd_over_wide_paths() -> bool {
    static ZEN5: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !avx512_full_width()
        || *ZEN5.get_or_init(|| full_width_override().is_none() && amd_family_1ah())
}

/// Whether this core splits each 256-bit AVX2 instruction into two 128-bit halves: AMD Zen
/// and Zen+ (family 0x17, models below 0x30; Zen 2 runs them whole). There the depthwise
/// kernels that read planes in place lose to the phase planes (`conv_depthwise.rs`), and the
/// packed conv paths run on AVX2 (`conv_packed.rs`).
/// `TANDEM_AVX2_HALF_WIDTH=0|1` overrides the detection (read once, for A/B timing).
pub fn avx2_half_width() -> bool {
    #[cfg(test)]
    if let Some(half) = FORCED_HALF_WIDTH.with(|f| f.get()) {
        return half;
    }
    static HALF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HALF.get_or_init(
        || match std::env::var("TANDEM_AVX2_HALF_WIDTH").as_deref() {
            Ok("0") => false,
            Ok("1") => true,
            _ => amd_family_model().is_some_and(splits_256_bit),
        },
    )
}

/// Whether an AMD core of this family and model splits 256-bit instructions: Zen and Zen+.
fn splits_256_bit((family, model): (u32, u32)) -> bool {
    family == 0x17 && model < 0x30
}

/// Whether this is an AMD core of family 0x19 (Zen 3 and Zen 4; of them only Zen 4 has
/// AVX-512).
fn amd_family_19h() -> bool {
    amd_family_model().is_some_and(|(family, _)| family == 0x19)
}

/// Whether this is an AMD core of family 0x1A (Zen 5).
fn amd_family_1ah() -> bool {
    amd_family_model().is_some_and(|(family, _)| family == 0x1a)
}

/// The family and model of an AMD core (CPUID leaf 1, extended fields added), `None` on
/// other vendors and architectures.
fn amd_family_model() -> Option<(u32, u32)> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // CPUID leaves 0 (vendor) and 1 (signature) exist on every x86-64 CPU.
        let (vendor, signature) = (__cpuid(0), __cpuid(1).eax);
        let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
        amd.then(|| family_model(signature))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The family and model a CPUID leaf 1 signature (EAX) names, extended fields added.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // x86-64's CPUID; tested anywhere
fn family_model(signature: u32) -> (u32, u32) {
    let family = ((signature >> 8) & 0xf) + ((signature >> 20) & 0xff);
    let model = ((signature >> 4) & 0xf) | (((signature >> 16) & 0xf) << 4);
    (family, model)
}

/// Every level this CPU runs, baseline first.
pub fn cpu_levels() -> Vec<Level> {
    let top = cpu_level();
    [Level::Baseline, Level::Avx2, Level::Avx512]
        .into_iter()
        .filter(|&l| l <= top)
        .collect()
}

fn detect() -> Level {
    let top = cpu_level();
    let cap = match std::env::var("TANDEM_SIMD").as_deref() {
        Ok("baseline") => Level::Baseline,
        Ok("avx2") => Level::Avx2,
        _ => Level::Avx512,
    };
    top.min(cap)
}

/// The level [`kernel!`](crate::simd::kernel) functions run at: the CPU's widest, capped by
/// `TANDEM_SIMD`; detected on the first call, then one relaxed atomic load.
#[inline]
pub fn level() -> Level {
    #[cfg(test)]
    if let Some(l) = FORCED.with(|f| f.get()) {
        return l;
    }
    match DETECTED.load(Ordering::Relaxed) {
        UNSET => {
            let l = detect();
            DETECTED.store(l as u8, Ordering::Relaxed);
            l
        }
        v => Level::from_u8(v),
    }
}

#[cfg(test)]
thread_local! {
    static FORCED: std::cell::Cell<Option<Level>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
thread_local! {
    static FORCED_HALF_WIDTH: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Testing hook: runs `f` with [`avx2_half_width`] `half` on this thread (path choices made
/// there; the kernels they pick run wherever rayon sends them).
#[cfg(test)]
pub(crate) fn with_avx2_half_width<R>(half: bool, f: impl FnOnce() -> R) -> R {
    let prev = FORCED_HALF_WIDTH.with(|c| c.replace(Some(half)));
    let r = f();
    FORCED_HALF_WIDTH.with(|c| c.set(prev));
    r
}

/// Testing hook: runs `f` with every kernel called on this thread at `level` (which the CPU
/// must have: see [`cpu_levels`]). Kernels that fan out to rayon workers run there at the
/// detected level, so tests keep inputs below the parallel thresholds.
#[cfg(test)]
pub(crate) fn with_level<R>(level: Level, f: impl FnOnce() -> R) -> R {
    assert!(level <= cpu_level(), "{level:?} not available on this CPU");
    let prev = FORCED.with(|c| c.replace(Some(level)));
    let r = f();
    FORCED.with(|c| c.set(prev));
    r
}

/// Defines a function whose body runs compiled for the widest [`Level`] the CPU has:
///
/// ```ignore
/// crate::simd::kernel! {
///     /// doc
///     pub(crate) fn add_into<F: Fn(f32) -> f32>(acc: &mut [f32], x: &[f32], f: &F) {
///         for (a, &v) in acc.iter_mut().zip(x) { *a += f(v); }
///     }
/// }
/// ```
///
/// The body becomes an `#[inline(always)]` function, inlined into one
/// `#[target_feature]` copy per x86-64 level; the wrapper picks the copy by [`level`]. Closures
/// passed in are inlined into each copy like any small callee, so keep them small and their
/// helpers `#[inline(always)]`. Parameters are `name: Type` (no patterns); generic parameters
/// take one bound path each; no `where` clauses.
#[macro_export]
#[doc(hidden)]
macro_rules! __simd_kernel {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident $(<$($g:ident : $b:path),* $(,)?>)?
            ($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        $vis fn $name $(<$($g: $b),*>)? ($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn plain $(<$($g: $b),*>)? ($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
            unsafe fn avx512 $(<$($g: $b),*>)? ($($arg: $ty),*) $(-> $ret)? {
                plain($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2 $(<$($g: $b),*>)? ($($arg: $ty),*) $(-> $ret)? {
                plain($($arg),*)
            }

            match $crate::simd::level() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `level` only reports Avx512 when the CPU has every feature enabled.
                $crate::simd::Level::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `level` only reports Avx2 when the CPU has AVX2, FMA and F16C.
                $crate::simd::Level::Avx2 => unsafe { avx2($($arg),*) },
                _ => plain($($arg),*),
            }
        }
    };
}

pub use crate::__simd_kernel as kernel;

kernel! {
    /// `dst[i] = f(src[i])` over the shorter length, on the widest vectors the CPU has.
    pub(crate) fn map<T: Copy, U: Copy, F: Fn(T) -> U>(src: &[T], dst: &mut [U], f: &F) {
        for (o, &x) in dst.iter_mut().zip(src) {
            *o = f(x);
        }
    }
}

kernel! {
    /// `v[i] = f(v[i])`, on the widest vectors the CPU has.
    pub fn map_in_place<T: Copy, F: Fn(T) -> T>(v: &mut [T], f: &F) {
        for x in v.iter_mut() {
            *x = f(*x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered_and_forcing_is_scoped_to_the_thread() {
        let levels = cpu_levels();
        assert_eq!(levels[0], Level::Baseline);
        assert_eq!(*levels.last().unwrap(), cpu_level());
        for &l in &levels {
            with_level(l, || assert_eq!(level(), l));
        }
        let x: Vec<f32> = (0..37).map(|i| i as f32 - 18.5).collect();
        for &l in &levels {
            let mut y = vec![0.0f32; 37];
            with_level(l, || map(&x, &mut y, &|v: f32| v * 2.0 + 1.0));
            let want: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
            assert_eq!(y, want, "{l:?}");
        }
    }

    /// CPUID signatures of real AMD server parts: EPYC 7551 (Zen), 7742 (Zen 2), 7763 (Zen 3),
    /// 9654 (Zen 4). Only the first splits 256-bit instructions.
    #[test]
    fn signatures_name_family_and_model() {
        assert_eq!(family_model(0x0080_0f12), (0x17, 0x01));
        assert_eq!(family_model(0x0083_0f10), (0x17, 0x31));
        assert_eq!(family_model(0x00a0_0f11), (0x19, 0x01));
        assert_eq!(family_model(0x00a1_0f11), (0x19, 0x11));
        let half: Vec<bool> = [0x0080_0f12, 0x0083_0f10, 0x00a0_0f11, 0x00a1_0f11]
            .map(|sig| splits_256_bit(family_model(sig)))
            .to_vec();
        assert_eq!(half, [true, false, false, false]);
        with_avx2_half_width(true, || assert!(avx2_half_width()));
        with_avx2_half_width(false, || assert!(!avx2_half_width()));
    }
}

#[cfg(test)]
#[path = "simd_tests.rs"]
mod kernel_tests;
