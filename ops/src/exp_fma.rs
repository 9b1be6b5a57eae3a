//! e^x on AVX2 + FMA and AVX-512 vectors, and the softmax row of the fused attention built on
//! it. [`exp_f32`](crate::unary::exp_f32) is written for the compiler to vectorise, and Rust
//! never contracts to an FMA, so its degree-6 polynomial is twice the multiplies and adds;
//! here the same reduction, polynomial and limits run with FMAs, n rounded by `vroundscaleps`
//! (`vroundps` on AVX2) and 2^n made by `vscalefps` (on AVX2 from exponent bits, as `exp_f32`
//! builds it). Results are within a few ulp of `exp_f32`'s, not bit for bit, so the ops whose
//! SIMD levels must agree bit for bit (Softmax, Exp, Sigmoid: `simd.rs`) keep the portable
//! code; kernels whose results already differ per level use these: conv's Sigmoid and SiLU
//! epilogue (`conv_sigmoid.rs`) and the attention's softmax ([`softmax_rows`]), where the
//! portable softmax took 56 % of a tiny Llama attention block on an Intel Xeon.
//!
//! Limits as `exp_f32`: the argument clamped to [`EXP_CLAMP`](crate::unary::EXP_CLAMP), +inf
//! above it, 0 below ln(f32::MIN_POSITIVE), NaN kept.
//!
//! Sits between those kernels and the CPU's AVX2 and AVX-512 units.

/// `y = softmax(x)` per row of `w` elements (`x.chunks(w)`, `y` as long as `x`), as
/// [`crate::softmax::lane`] computes each (the max, e^(x - max) summed, the sum's reciprocal;
/// a NaN anywhere, +inf, or a row of only -inf gives all NaN), with the FMA exp on AVX2 and
/// AVX-512, else that lane itself. AVX-512 takes two rows at a time, interleaved: one row of
/// attention's 128 keys is too short to hide the exp's latency, and its passes wait on the
/// max and the sum before them.
pub(crate) fn softmax_rows(x: &[f32], y: &mut [f32], w: usize) {
    if w == 0 {
        return;
    }
    let y = &mut y[..x.len()];
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() >= crate::simd::Level::Avx2 {
        // SAFETY: the level says AVX2 and FMA, or AVX-512 (F/BW/DQ/VL detected), are present;
        // `y` is as long as `x`.
        unsafe {
            match crate::simd::avx512() {
                true => avx512::softmax_rows(x, y, w),
                false => {
                    for (x, y) in x.chunks_exact(w).zip(y.chunks_exact_mut(w)) {
                        avx2::softmax_row(x, y);
                    }
                }
            }
        }
        return;
    }
    for (x, y) in x.chunks_exact(w).zip(y.chunks_exact_mut(w)) {
        crate::softmax::lane(x, y, false);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use crate::unary::{EXP_CLAMP, EXP_POLY, EXP_UNDERFLOW, LN2_PARTS};
    use std::arch::x86_64::*;

    /// e^u per lane (see the module doc).
    ///
    /// # Safety
    /// AVX-512F present (inlined into a `target_feature` caller).
    #[inline(always)]
    pub(crate) unsafe fn exp(u: __m512) -> __m512 {
        let (lo, hi) = EXP_CLAMP;
        // Clamped as `exp_f32`, NaN kept (vmaxps and vminps return their second operand then).
        let xc = _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), u));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_PARTS.0), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_PARTS.1), r);
        let mut p = _mm512_set1_ps(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        let e = _mm512_scalef_ps(y, n);
        let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(u, _mm512_set1_ps(hi));
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(u, _mm512_set1_ps(EXP_UNDERFLOW));
        let e = _mm512_mask_mov_ps(e, over, _mm512_set1_ps(f32::INFINITY));
        _mm512_mask_mov_ps(e, under, _mm512_setzero_ps())
    }

    /// Lanes `0..k` of a vector (a row's last, partial one).
    fn first(k: usize) -> __mmask16 {
        ((1u32 << k.min(16)) - 1) as __mmask16
    }

    /// [`super::softmax_rows`] on 16-lane vectors: pairs of rows, then the last one alone.
    ///
    /// # Safety
    /// AVX-512F present; `y` as long as `x`, `w` > 0.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn softmax_rows(x: &[f32], y: &mut [f32], w: usize) {
        let rows = x.len() / w;
        let mut r = 0;
        while r + 2 <= rows {
            rows_at::<2>(x, y, w, r);
            r += 2;
        }
        if r < rows {
            rows_at::<1>(x, y, w, r);
        }
    }

    /// Rows `r0..r0 + R` of [`softmax_rows`], each pass over all R rows at once.
    ///
    /// # Safety
    /// As [`softmax_rows`]; those rows lie in `x` and `y`.
    #[inline(always)]
    unsafe fn rows_at<const R: usize>(x: &[f32], y: &mut [f32], w: usize, r0: usize) {
        let xp: [*const f32; R] = std::array::from_fn(|j| x.as_ptr().add((r0 + j) * w));
        let yp: [*mut f32; R] = std::array::from_fn(|j| y.as_mut_ptr().add((r0 + j) * w));
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        // The max ignores NaN (vmaxps returns its second operand, the running max, then).
        let mut mx = [ninf; R];
        for i in (0..w).step_by(16) {
            let k = first(w - i);
            for j in 0..R {
                mx[j] = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k, xp[j].add(i)), mx[j]);
            }
        }
        let m: [__m512; R] = std::array::from_fn(|j| _mm512_set1_ps(_mm512_reduce_max_ps(mx[j])));
        let mut sum = [_mm512_setzero_ps(); R];
        for i in (0..w).step_by(16) {
            let k = first(w - i);
            for j in 0..R {
                let e = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xp[j].add(i)), m[j]));
                sum[j] = _mm512_mask_add_ps(sum[j], k, sum[j], e);
                _mm512_mask_storeu_ps(yp[j].add(i), k, e);
            }
        }
        let r: [__m512; R] =
            std::array::from_fn(|j| _mm512_set1_ps(1.0 / _mm512_reduce_add_ps(sum[j])));
        for i in (0..w).step_by(16) {
            let k = first(w - i);
            for j in 0..R {
                let v = _mm512_maskz_loadu_ps(k, yp[j].add(i));
                _mm512_mask_storeu_ps(yp[j].add(i), k, _mm512_mul_ps(v, r[j]));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use crate::unary::{exp_f32, EXP_CLAMP, EXP_POLY, EXP_UNDERFLOW, LN2_PARTS};
    use std::arch::x86_64::*;

    /// e^u per lane (see the module doc): 2^n from exponent bits, 2^(n-1) times 2 so that
    /// n = 128 stays a normal number.
    ///
    /// # Safety
    /// AVX2 and FMA present (inlined into a `target_feature` caller).
    #[inline(always)]
    pub(crate) unsafe fn exp(u: __m256) -> __m256 {
        let (lo, hi) = EXP_CLAMP;
        // Clamped as `exp_f32`, NaN kept (vmaxps and vminps return their second operand then).
        let xc = _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), u));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_PARTS.0), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_PARTS.1), r);
        let mut p = _mm256_set1_ps(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        // n is in -125..=128 (the clamp), so n + 126 is a normal exponent; a NaN's n converts
        // to i32::MIN, whose bits make some number that the NaN in y keeps out of the result.
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(126),
        ));
        let e = _mm256_mul_ps(
            _mm256_mul_ps(y, _mm256_castsi256_ps(bits)),
            _mm256_set1_ps(2.0),
        );
        let over = _mm256_cmp_ps::<_CMP_GT_OQ>(u, _mm256_set1_ps(hi));
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(u, _mm256_set1_ps(EXP_UNDERFLOW));
        let e = _mm256_blendv_ps(e, _mm256_set1_ps(f32::INFINITY), over);
        _mm256_andnot_ps(under, e)
    }

    /// One row of [`super::softmax_rows`] on 8-lane vectors, the last partial one's lanes by
    /// `exp_f32`.
    ///
    /// # Safety
    /// AVX2 and FMA present; `y` as long as `x`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softmax_row(x: &[f32], y: &mut [f32]) {
        let (n, whole) = (x.len(), x.len() / 8 * 8);
        let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
        // The max ignores NaN (vmaxps returns its second operand, the running max, then).
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..whole).step_by(8) {
            mx = _mm256_max_ps(_mm256_loadu_ps(xp.add(i)), mx);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), mx);
        let m = (lanes.iter().chain(&x[whole..])).fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mv = _mm256_set1_ps(m);
        let mut sum = _mm256_setzero_ps();
        for i in (0..whole).step_by(8) {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(xp.add(i)), mv));
            sum = _mm256_add_ps(sum, e);
            _mm256_storeu_ps(yp.add(i), e);
        }
        let mut tail = 0.0;
        for (y, &v) in y[whole..n].iter_mut().zip(&x[whole..]) {
            *y = exp_f32(v - m);
            tail += *y;
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
        let r = 1.0 / (lanes.iter().sum::<f32>() + tail);
        let rv = _mm256_set1_ps(r);
        for i in (0..whole).step_by(8) {
            _mm256_storeu_ps(yp.add(i), _mm256_mul_ps(_mm256_loadu_ps(yp.add(i)), rv));
        }
        y[whole..n].iter_mut().for_each(|y| *y *= r);
    }
}

#[cfg(test)]
#[path = "exp_fma_tests.rs"]
mod tests;
