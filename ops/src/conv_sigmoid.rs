//! Conv's fused Sigmoid and SiLU epilogues on AVX2 and AVX-512, written with intrinsics.
//! yolov8n's SiLU after every conv took about 11 % of its time in the compiler's
//! vectorisation of [`exp_f32`](crate::unary::exp_f32): Rust never contracts to an FMA, so its
//! polynomial is twice the multiplies and adds. Here a line in cache takes 0.39 ns an element
//! against 0.63 on an Intel Xeon (AVX-512), 0.82-0.85 against 1.22-1.25 on an AMD EPYC Zen 3
//! (AVX2; one thread each). yolov8n at 320x320 took 2.6-3.7 % less time on the Xeon; on the
//! Zen 3 the expected 3 % was below the host's drift (docs/bench.md).
//!
//! e^-x is `exp_fma.rs`'s (`exp_f32`'s reduction, polynomial and limits with FMAs), then a
//! true division, `1 / (1 + e^-x)` or, for a SiLU, `x / (1 + e^-x)`. The result is within a
//! few ulp of `exp_f32`'s, not bit for bit, so this stays out of the unary Sigmoid op, whose
//! SIMD levels must agree bit for bit (`simd.rs`), and serves only the conv epilogue, whose
//! GEMM already differs per level. As there, NaN stays NaN and x below -88.72 gives 0 (a SiLU
//! -0).
//!
//! Sits between `conv_cpu.rs`'s [`epilogue`](super::epilogue) and the CPU's AVX2 and AVX-512
//! units.

use crate::conv::{Activation, Epilogue, Residual};

/// Whether [`line`] computes `ep` on this CPU: a Sigmoid or SiLU, kernels at AVX2 or
/// AVX-512.
fn applies(ep: Epilogue) -> bool {
    matches!(ep.act, Activation::Sigmoid | Activation::Silu)
        && crate::simd::level() >= crate::simd::Level::Avx2
}

/// [`super::epilogue`] where `ep` [`applies`]: `line[i] = ep(line[i] + bias)`, with `z`
/// added where `ep.residual` says; `false` (nothing written) where it does not.
pub(super) fn line(line: &mut [f32], bias: Option<f32>, z: Option<&[f32]>, ep: Epilogue) -> bool {
    if !applies(ep) {
        return false;
    }
    let z = match (z, ep.residual) {
        (Some(z), Residual::BeforeAct | Residual::AfterAct) => Some(&z[..line.len()]),
        _ => None,
    };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `applies` checked that the kernels run AVX2 and FMA, or AVX-512 (F/BW/DQ/VL
    // detected); `z` is at least as long as `line`.
    unsafe {
        let bias = bias.unwrap_or(0.0);
        match (crate::simd::avx512(), ep.act == Activation::Silu) {
            (true, true) => avx512::line::<true>(line, bias, z, ep),
            (true, false) => avx512::line::<false>(line, bias, z, ep),
            (false, true) => avx2::line::<true>(line, bias, z, ep),
            (false, false) => avx2::line::<false>(line, bias, z, ep),
        }
    }
    #[cfg(target_arch = "x86_64")]
    return true;
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "conv sigmoid epilogue without AVX2: {:?}",
        (line.len(), bias, z, ep)
    );
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use crate::conv::{Epilogue, Residual};
    use std::arch::x86_64::*;

    /// `a / (1 + e^-v)` per lane (`a` 1 for a sigmoid, `v` for a SiLU); above the exp's
    /// clamp e^-v is +inf and the result 0.
    #[inline(always)]
    unsafe fn over_one_plus_exp_neg(a: __m512, v: __m512) -> __m512 {
        let e = crate::exp_fma::avx512::exp(_mm512_sub_ps(_mm512_setzero_ps(), v));
        _mm512_div_ps(a, _mm512_add_ps(_mm512_set1_ps(1.0), e))
    }

    /// `line[i] = ep(line[i] + bias)` (SiLU where `SILU`, else Sigmoid), with `z[i]` added
    /// before or after the activation as `ep.residual` says.
    ///
    /// # Safety
    /// AVX-512F present; `z`, where given, at least as long as `line`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn line<const SILU: bool>(
        line: &mut [f32],
        bias: f32,
        z: Option<&[f32]>,
        ep: Epilogue,
    ) {
        let (b, n, at) = (_mm512_set1_ps(bias), line.len(), line.as_mut_ptr());
        let one = _mm512_set1_ps(1.0);
        let (before, after) = match z {
            Some(z) => (
                (ep.residual == Residual::BeforeAct).then_some(z.as_ptr()),
                (ep.residual == Residual::AfterAct).then_some(z.as_ptr()),
            ),
            None => (None, None),
        };
        let post = ep.post.map(|(s, t)| (_mm512_set1_ps(s), _mm512_set1_ps(t)));
        for i in (0..n).step_by(16) {
            let m = if n - i >= 16 {
                0xffff
            } else {
                ((1u32 << (n - i)) - 1) as __mmask16
            };
            let mut v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, at.add(i)), b);
            if let Some(z) = before {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, z.add(i)));
            }
            let mut y = over_one_plus_exp_neg(if SILU { v } else { one }, v);
            if let Some((s, t)) = post {
                y = _mm512_add_ps(_mm512_mul_ps(y, s), t);
            }
            if let Some(z) = after {
                y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, z.add(i)));
            }
            _mm512_mask_storeu_ps(at.add(i), m, y);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::conv::{Epilogue, Residual};
    use std::arch::x86_64::*;

    /// `a / (1 + e^-v)` per lane, as the AVX-512 one.
    #[inline(always)]
    unsafe fn over_one_plus_exp_neg(a: __m256, v: __m256) -> __m256 {
        let e = crate::exp_fma::avx2::exp(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    /// Eight elements at `at`: `ep(v + bias)`, with the eight at `before` added first and
    /// those at `after` last, where given (`post` is `ep.post`'s scale and shift).
    ///
    /// # Safety
    /// AVX2 and FMA present (inlined into [`line`]); each pointer covers eight floats.
    #[inline(always)]
    unsafe fn eight<const SILU: bool>(
        at: *mut f32,
        (before, after): (Option<*const f32>, Option<*const f32>),
        bias: __m256,
        post: Option<(__m256, __m256)>,
    ) {
        let mut v = _mm256_add_ps(_mm256_loadu_ps(at), bias);
        if let Some(z) = before {
            v = _mm256_add_ps(v, _mm256_loadu_ps(z));
        }
        let a = if SILU { v } else { _mm256_set1_ps(1.0) };
        let mut y = over_one_plus_exp_neg(a, v);
        if let Some((s, t)) = post {
            y = _mm256_add_ps(_mm256_mul_ps(y, s), t);
        }
        if let Some(z) = after {
            y = _mm256_add_ps(y, _mm256_loadu_ps(z));
        }
        _mm256_storeu_ps(at, y);
    }

    /// `line[i] = ep(line[i] + bias)` (SiLU where `SILU`, else Sigmoid), with `z[i]` added
    /// before or after the activation as `ep.residual` says. A line's last partial vector
    /// goes through copies on the stack: AMD cores take a dozen cycles for a masked store.
    ///
    /// # Safety
    /// AVX2 and FMA present; `z`, where given, at least as long as `line`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn line<const SILU: bool>(
        line: &mut [f32],
        bias: f32,
        z: Option<&[f32]>,
        ep: Epilogue,
    ) {
        let (before, after) = match z {
            Some(z) => (
                (ep.residual == Residual::BeforeAct).then_some(z),
                (ep.residual == Residual::AfterAct).then_some(z),
            ),
            None => (None, None),
        };
        let bias = _mm256_set1_ps(bias);
        let post = ep.post.map(|(s, t)| (_mm256_set1_ps(s), _mm256_set1_ps(t)));
        let whole = line.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            let z_at = |z: &[f32]| z[i..].as_ptr();
            let z = (before.map(z_at), after.map(z_at));
            eight::<SILU>(line[i..].as_mut_ptr(), z, bias, post);
        }
        let rest = line.len() - whole;
        if rest > 0 {
            let (mut tail, mut z_tail) = ([0.0f32; 8], [0.0f32; 8]);
            tail[..rest].copy_from_slice(&line[whole..]);
            if let Some(z) = before.or(after) {
                z_tail[..rest].copy_from_slice(&z[whole..][..rest]);
            }
            let z = (
                before.map(|_| z_tail.as_ptr()),
                after.map(|_| z_tail.as_ptr()),
            );
            eight::<SILU>(tail.as_mut_ptr(), z, bias, post);
            line[whole..].copy_from_slice(&tail[..rest]);
        }
    }
}

#[cfg(test)]
#[path = "conv_sigmoid_tests.rs"]
mod tests;
