//! The vector instructions the hand-written window kernels run, for AVX2 (8 lanes) and
//! AVX-512 (16): each a plain intrinsic or two behind one trait ([`Lanes`]), so that a kernel
//! is one generic body, inlined into each set's `#[target_feature]` copy of it. Loads and
//! stores take masks, so kernels read input planes in place, pads and row ends masked off;
//! [`load_lanes`] keeps AVX2's slow masked load for vectors that leave the plane, and
//! [`load_lanes_unbranched`] masks every load on AVX-512 where masks change load by load.
//!
//! Sits between the kernels that read planes in place (`pool_3x3.rs`, `pool_3x3_flat.rs`,
//! `pool_3x3_max2.rs`, `conv_depthwise.rs`) and the CPU's vector units.

use std::arch::x86_64::*;
use std::ops::Range;

/// Fetch `len` floats from `at` into L1, a cache line (16 floats) at a time: the rows or
/// planes a kernel reads next, where the hardware prefetchers stop at a 4 KB page. Only
/// fetched, never read, so `at` may point past the input (a prefetch does not fault).
#[inline(always)]
pub(crate) fn fetch(at: *const f32, len: usize) {
    for line in (0..len).step_by(16) {
        // SAFETY: SSE is baseline on x86_64; a prefetch reads nothing architecturally.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast()) };
    }
}

/// # Safety
/// Every method needs its set's instructions: call them only from code compiled for the set
/// (inlined into a `#[target_feature]` function).
pub(crate) trait Lanes: Copy {
    /// Lanes a vector.
    const N: usize;
    /// Whether a masked load costs what a plain one does, so [`load_lanes_unbranched`] masks
    /// every load rather than branching on its mask (AVX-512; AVX2's VMASKMOVPS is slow).
    const MASKED_LOAD_CHEAP: bool;
    /// Which lanes a load reads.
    type Mask: Copy + Send;
    /// A mask of lanes `lanes`.
    unsafe fn lanes(lanes: Range<usize>) -> Self::Mask;
    /// A mask of the lanes whose bits (lane 0 the lowest) are set, built with the set's own
    /// instructions (a mask per load in a kernel's inner loop; [`Lanes::lanes`] is for code
    /// that closures run, compiled without them).
    unsafe fn bits(bits: u32) -> Self::Mask;
    unsafe fn splat(v: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    /// The lanes of `mask` from `p` (only those are read), `fill` elsewhere.
    unsafe fn load_masked(fill: Self, mask: Self::Mask, p: *const f32) -> Self;
    /// [`Lanes::load_masked`] where all `N` lanes from `p` may be read: a plain load and a
    /// blend on AVX2 ([`load_lanes`] picks it).
    unsafe fn load_blend(fill: Self, mask: Self::Mask, p: *const f32) -> Self {
        Self::load_masked(fill, mask, p)
    }
    unsafe fn store(p: *mut f32, v: Self);
    /// The first `n` lanes of `v` only.
    unsafe fn store_first(p: *mut f32, v: Self, n: usize);
    /// The larger of `earlier` and `later`, `earlier` on a tie, NaN if either is NaN.
    /// (AVX-512's VRANGEPS would be one instruction, but it returns the other operand of a
    /// quiet NaN.)
    unsafe fn max_first(earlier: Self, later: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn div(a: Self, b: Self) -> Self;
    /// The even and the odd lanes of `a` then `b` (columns 0, 2, .. and 1, 3, .. of the
    /// 2N columns they hold).
    unsafe fn evens_odds(a: Self, b: Self) -> (Self, Self);
    /// [`Lanes::evens_odds`] in an order of the set's own, the same for both vectors and for
    /// every call, so lane-wise operations on such vectors commute with it; [`Lanes::in_order`]
    /// puts one back in column order (AVX2 saves a permute per vector until then).
    unsafe fn evens_odds_unordered(a: Self, b: Self) -> (Self, Self);
    /// A vector of [`Lanes::evens_odds_unordered`]'s order in column order.
    unsafe fn in_order(v: Self) -> Self;
    /// Lanes `by..N + by` of `a` then `b` (`by` 1 or 2, or N - 1 or N - 2), the lanes off in
    /// `mask` zero.
    unsafe fn across(a: Self, b: Self, by: usize, mask: Self::Mask) -> Self;
}

/// Declares trait `$trait` with one method: the generic function of the same name (generic
/// over [`Lanes`] and one const parameter) compiled for each set, as `#[target_feature]`
/// copies for [`Avx2`] (with FMA) and [`Avx512`] that forward to `name::<Self, C>`, whose
/// body, inlined, then runs that set's instructions. A kernel calls `V::name::<C>(..)` for the
/// set `V` it picked.
///
/// ```ignore
/// crate::lanes::per_set! {
///     /// [`rows`] compiled for each set's instructions.
///     trait Compiled {
///         fn rows<const K: usize>(p: &Plane, lines: Range<usize>, dst: &mut [f32]);
///     }
/// }
/// ```
macro_rules! per_set {
    (
        $(#[$meta:meta])*
        $vis:vis trait $tr:ident {
            fn $name:ident<const $c:ident: $ct:ty>($($arg:ident: $ty:ty),* $(,)?);
        }
    ) => {
        $(#[$meta])*
        $vis trait $tr: $crate::lanes::Lanes {
            /// # Safety
            /// The set's instructions present; what the generic function asks.
            unsafe fn $name<const $c: $ct>($($arg: $ty),*);
        }

        impl $tr for $crate::lanes::Avx2 {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn $name<const $c: $ct>($($arg: $ty),*) {
                // SAFETY: forwarded; AVX2 and FMA enabled here.
                unsafe { $name::<Self, $c>($($arg),*) }
            }
        }

        impl $tr for $crate::lanes::Avx512 {
            #[target_feature(enable = "avx512f")]
            unsafe fn $name<const $c: $ct>($($arg: $ty),*) {
                // SAFETY: forwarded; AVX-512F enabled here.
                unsafe { $name::<Self, $c>($($arg),*) }
            }
        }
    };
}
pub(crate) use per_set;

/// The bits of the lanes of an `n`-lane load from position `from` of a row of `w` elements
/// (`from` may lie before the row or near its end) that lie inside the row.
pub(crate) fn row_lane_bits(from: isize, w: usize, n: usize) -> u32 {
    let lo = (-from).clamp(0, n as isize) as usize;
    let hi = (w as isize - from).clamp(0, n as isize) as usize;
    lane_bits(lo.min(hi)..hi)
}

/// The bits of lanes `lanes` (lane 0 the lowest), as [`load_lanes`] takes them.
pub(crate) fn lane_bits(lanes: Range<usize>) -> u32 {
    ((1u64 << lanes.end) - (1u64 << lanes.start)) as u32
}

/// The lanes whose `bits` are set (lane 0 the lowest) from `x[at..]`, `fill` elsewhere,
/// where `at` may lie before `x` or run past its end (only those lanes lie in `x`): a plain
/// load where every lane is set, a plain load and a blend ([`Lanes::load_blend`]) where all
/// `V::N` lanes from `at` lie in `x`, else the masked load. On a Zen 1 core AVX2's masked load
/// (VMASKMOVPS) took about 18 cycles against under 2 for a plain one, and the kernels that
/// mask a plane's pads and row ends load mostly inside it.
///
/// # Safety
/// `V`'s instructions present; the lanes of `bits` lie in `x`.
#[inline(always)]
pub(crate) unsafe fn load_lanes<V: Lanes>(fill: V, bits: u32, x: &[f32], at: isize) -> V {
    let p = x.as_ptr().wrapping_offset(at);
    if bits == u32::MAX >> (32 - V::N) {
        return V::load(p);
    }
    match at >= 0 && at as usize + V::N <= x.len() {
        true => V::load_blend(fill, V::bits(bits), p),
        false => V::load_masked(fill, V::bits(bits), p),
    }
}

/// [`load_lanes`] for loops whose masks change from load to load (a small plane's taps, each
/// vector across row ends): where a masked load costs what a plain one does
/// ([`Lanes::MASKED_LOAD_CHEAP`], AVX-512) always the masked load, no branch on the mask.
/// [`load_lanes`]'s branches, mispredicted there, had cost more than they saved (AMD Zen 5,
/// the two alternated process by process, inside the models: shufflenet's depthwise 3x3s on
/// 28 x 28 planes 0.66x of their time, the model 0.94x; docs/bench.md, "Masked loads without
/// branches"); where the masks repeat, plain loads stay faster (ppocr_det's stride-2
/// depthwise convs took 1.4x their time with every load masked).
///
/// # Safety
/// As [`load_lanes`].
#[inline(always)]
pub(crate) unsafe fn load_lanes_unbranched<V: Lanes>(
    fill: V,
    bits: u32,
    x: &[f32],
    at: isize,
) -> V {
    match V::MASKED_LOAD_CHEAP {
        true => V::load_masked(fill, V::bits(bits), x.as_ptr().wrapping_offset(at)),
        false => load_lanes(fill, bits, x, at),
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Avx2(__m256);

#[derive(Clone, Copy)]
pub(crate) struct Avx512(__m512);

impl Avx2 {
    /// `loaded` where `mask` is set, else `self`.
    #[inline(always)]
    unsafe fn blend(self, loaded: __m256, mask: __m256i) -> Self {
        Self(_mm256_blendv_ps(self.0, loaded, _mm256_castsi256_ps(mask)))
    }
}

/// The first `n` (at most 8) lanes of `v` to `p`, through the stack: a masked store
/// (VMASKMOVPS) takes a dozen cycles on AMD cores.
///
/// # Safety
/// AVX2 present; `p` covers `n` floats.
#[inline(always)]
pub(crate) unsafe fn store_first_avx2(p: *mut f32, v: __m256, n: usize) {
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
    std::ptr::copy_nonoverlapping(lanes.as_ptr(), p, n);
}

impl Lanes for Avx2 {
    const N: usize = 8;
    const MASKED_LOAD_CHEAP: bool = false;
    type Mask = __m256i;
    #[inline(always)]
    unsafe fn lanes(lanes: Range<usize>) -> __m256i {
        // Built in scalar code: its callers are closures, which are compiled without AVX2.
        let bits: [i32; 8] = std::array::from_fn(|i| -(lanes.contains(&i) as i32));
        // SAFETY: 32 bytes of plain integers either way.
        unsafe { std::mem::transmute::<[i32; 8], __m256i>(bits) }
    }
    #[inline(always)]
    unsafe fn bits(bits: u32) -> __m256i {
        let lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        let set = _mm256_and_si256(_mm256_set1_epi32(bits as i32), lane);
        _mm256_cmpeq_epi32(set, lane)
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Self(_mm256_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Self(_mm256_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn load_masked(fill: Self, mask: __m256i, p: *const f32) -> Self {
        fill.blend(_mm256_maskload_ps(p, mask), mask)
    }
    #[inline(always)]
    unsafe fn load_blend(fill: Self, mask: __m256i, p: *const f32) -> Self {
        fill.blend(_mm256_loadu_ps(p), mask)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        _mm256_storeu_ps(p, v.0)
    }
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, v: Self, n: usize) {
        store_first_avx2(p, v.0, n.min(8))
    }
    #[inline(always)]
    unsafe fn max_first(earlier: Self, later: Self) -> Self {
        // vmaxps(a, b) is `a > b ? a : b`, and `b` when either is NaN.
        let m = _mm256_max_ps(later.0, earlier.0);
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(later.0, later.0);
        Self(_mm256_blendv_ps(m, later.0, nan))
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        Self(_mm256_add_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        Self(_mm256_mul_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        Self(_mm256_div_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn evens_odds(a: Self, b: Self) -> (Self, Self) {
        let (e, o) = Self::evens_odds_unordered(a, b);
        (Self::in_order(e), Self::in_order(o))
    }
    #[inline(always)]
    unsafe fn evens_odds_unordered(a: Self, b: Self) -> (Self, Self) {
        // Per 128-bit half: a's evens (odds), then b's.
        let e = _mm256_shuffle_ps::<0b10_00_10_00>(a.0, b.0);
        let o = _mm256_shuffle_ps::<0b11_01_11_01>(a.0, b.0);
        (Self(e), Self(o))
    }
    #[inline(always)]
    unsafe fn in_order(v: Self) -> Self {
        // The 64-bit quarters reordered to a's low, a's high, b's low, b's high.
        Self(_mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(
            _mm256_castps_pd(v.0),
        )))
    }
    #[inline(always)]
    unsafe fn across(a: Self, b: Self, by: usize, mask: __m256i) -> Self {
        // Lanes 4..12 of a then b; each 128-bit half then shifts within itself.
        let mid = _mm256_castps_si256(_mm256_permute2f128_ps::<0x21>(a.0, b.0));
        let (a, b) = (_mm256_castps_si256(a.0), _mm256_castps_si256(b.0));
        let v = match by {
            1 => _mm256_alignr_epi8::<4>(mid, a),
            2 => _mm256_alignr_epi8::<8>(mid, a),
            6 => _mm256_alignr_epi8::<8>(b, mid),
            _ => _mm256_alignr_epi8::<12>(b, mid),
        };
        Self(_mm256_castsi256_ps(_mm256_and_si256(v, mask)))
    }
}

impl Lanes for Avx512 {
    const N: usize = 16;
    const MASKED_LOAD_CHEAP: bool = true;
    type Mask = __mmask16;
    #[inline(always)]
    unsafe fn lanes(lanes: Range<usize>) -> __mmask16 {
        ((1u32 << lanes.end) - (1u32 << lanes.start)) as __mmask16
    }
    #[inline(always)]
    unsafe fn bits(bits: u32) -> __mmask16 {
        bits as __mmask16
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Self(_mm512_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Self(_mm512_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn load_masked(fill: Self, mask: __mmask16, p: *const f32) -> Self {
        Self(_mm512_mask_loadu_ps(fill.0, mask, p))
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        _mm512_storeu_ps(p, v.0)
    }
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, v: Self, n: usize) {
        _mm512_mask_storeu_ps(p, Self::lanes(0..n), v.0)
    }
    #[inline(always)]
    unsafe fn max_first(earlier: Self, later: Self) -> Self {
        // vmaxps(a, b) is `a > b ? a : b`, and `b` when either is NaN.
        let m = _mm512_max_ps(later.0, earlier.0);
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(later.0, later.0);
        Self(_mm512_mask_mov_ps(m, nan, later.0))
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        Self(_mm512_add_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        Self(_mm512_mul_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        Self(_mm512_div_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn evens_odds(a: Self, b: Self) -> (Self, Self) {
        let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        (
            Self(_mm512_permutex2var_ps(a.0, evens, b.0)),
            Self(_mm512_permutex2var_ps(a.0, odds, b.0)),
        )
    }
    #[inline(always)]
    unsafe fn evens_odds_unordered(a: Self, b: Self) -> (Self, Self) {
        // One permute a vector either way.
        Self::evens_odds(a, b)
    }
    #[inline(always)]
    unsafe fn in_order(v: Self) -> Self {
        v
    }
    #[inline(always)]
    unsafe fn across(a: Self, b: Self, by: usize, mask: __mmask16) -> Self {
        let (a, b) = (_mm512_castps_si512(a.0), _mm512_castps_si512(b.0));
        let v = match by {
            1 => _mm512_maskz_alignr_epi32::<1>(mask, b, a),
            2 => _mm512_maskz_alignr_epi32::<2>(mask, b, a),
            14 => _mm512_maskz_alignr_epi32::<14>(mask, b, a),
            _ => _mm512_maskz_alignr_epi32::<15>(mask, b, a),
        };
        Self(_mm512_castsi512_ps(v))
    }
}
