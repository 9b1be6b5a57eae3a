//! The one blocked SIMD f32 GEMM that MatMul, Gemm, Conv and ConvTranspose run on the CPU.
//!
//! Sits between those operator files (which describe their operands as strided matrices) and
//! the `gemm` crate (packed, cache-blocked, runtime-dispatched AVX2/AVX-512/NEON micro-kernels,
//! parallelised over the current rayon pool). Every call here checks that its strided views lie
//! inside the slices it was given, so the unsafe call into `gemm` cannot read or write out of
//! bounds. Products with few rows and a transposed B (Gemm transB=1, linear layers) go to the
//! dot-product tiles of `cpu_gemm_dot.rs` instead, where those measured faster. MatMuls whose B
//! is a model constant run on `cpu_gemm_packed.rs` where the CPU has AVX-512 (B packed once).
//! On wasm32, where the crate has only scalar kernels, everything else runs on the 128-bit
//! lanes of `cpu_gemm_lanes.rs`.
//!
//! # Why the `gemm` crate and not our own micro-kernel (measured)
//! `cargo bench -p tandem-bench --bench cpu_gemm` on the team machine (AMD EPYC, 2 cores, AVX-512,
//! shared with other builds while measuring, so the 2-thread column is pessimistic), GFLOP/s,
//! f32, row-major operands, criterion median:
//!
//! | shape M x K x N            | gemm crate 1 thr | gemm crate 2 thr | own 6x16 1 thr | own 6x16 2 thr |
//! |----------------------------|-----------------:|-----------------:|---------------:|---------------:|
//! | 1024 x 1024 x 1024         |              100 |              120 |             88 |            107 |
//! | 128 x 384 x 384            |              118 |              119 |             92 |             92 |
//! | 128 x 384 x 1536           |              107 |              114 |             81 |             79 |
//!
//! Through the ops (same bench, gemm crate): MatMul 12 heads `[128x64]x[64x128]` 105 / 119
//! (1 / 2 threads); Conv 3x3 16->16 on 640x640 36 (im2col-bound); Conv 1x1 64->64 on 160x160
//! 104; depthwise 3x3 on 64x160x160 (direct loop) 16.5.
//!
//! "own 6x16" is a packed kernel (A in 6-row slivers, B in 16-column panels, K blocked by 256,
//! 12 AVX2+FMA accumulators, rayon over 72-row blocks of C), kept in the bench file for this
//! comparison. The `gemm` crate wins every shape by 15-35 % (AVX-512 kernels, better packing
//! and blocking for small M), so it is the one used here.

pub use gemm_common::Parallelism;

/// Have the `gemm` crate read the cache sizes it blocks its loops by, on a thread of its own,
/// once a process (later calls return at once). It reads them lazily, inside the first GEMM
/// it runs, from every file of every CPU's cache directories in sysfs: a model's first run
/// paid that (a lone 48 -> 192 1x1 conv on 13 x 13: about 1 ms, against 35-55 us after).
/// Sessions call this as they start loading, so the files are read beside the load.
pub fn read_cache_sizes_in_background() {
    #[cfg(target_os = "linux")]
    {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            let read = || {
                std::hint::black_box(gemm_common::cache::CACHE_INFO[0].cache_bytes);
            };
            if std::thread::Builder::new().spawn(read).is_err() {
                read(); // no thread: the first GEMM reads them, as before
            }
        });
    }
}

#[path = "cpu_gemm_dot.rs"]
mod dot;

#[path = "cpu_gemm_lanes.rs"]
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))] // tested natively, run on wasm32
mod lanes;

/// A read-only strided matrix view: element `(i, j)` is `data[offset + i * rs + j * cs]`.
/// Strides may be zero (broadcast), never negative.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major matrix with `cols` columns starting at `offset`.
    pub fn row_major(data: &'a [f32], offset: usize, cols: usize) -> MatRef<'a> {
        MatRef {
            data,
            offset,
            rs: cols,
            cs: 1,
        }
    }

    /// The same matrix transposed (no copy).
    pub fn t(self) -> MatRef<'a> {
        MatRef {
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    pub(crate) fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0
            || cols == 0
            || self.offset + (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// A mutable strided matrix view (`rs`, `cs` as in [`MatRef`]; the view must not alias itself,
/// so neither stride may be zero unless that dimension is 1).
#[derive(Debug)]
pub struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatMut<'a> {
    /// A row-major matrix with row stride `ld` starting at `offset`.
    pub fn row_major(data: &'a mut [f32], offset: usize, ld: usize) -> MatMut<'a> {
        MatMut {
            data,
            offset,
            rs: ld,
            cs: 1,
        }
    }
}

/// How many threads a GEMM may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// All threads of the current rayon pool (`rayon::current_num_threads()`).
    Pool,
    /// One thread: the caller already parallelises over several GEMMs.
    Single,
}

/// `C = alpha * A * B + beta * C` with `A` of shape `m x k`, `B` `k x n`, `C` `m x n`.
/// When `beta == 0` the old contents of `C` are ignored (NaN in C does not propagate).
///
/// Panics if a view does not lie inside its slice or `C` aliases itself: those are bugs of the
/// calling operator (shapes are validated there), not bad model input.
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: MatRef,
    b: MatRef,
    beta: f32,
    c: MatMut,
    threads: Threads,
) {
    if m == 0 || n == 0 {
        return;
    }
    let c_ref = MatRef {
        data: c.data,
        offset: c.offset,
        rs: c.rs,
        cs: c.cs,
    };
    assert!(c_ref.fits(m, n), "sgemm: C view {m}x{n} out of bounds");
    assert!(
        (m == 1 || c.rs != 0) && (n == 1 || c.cs != 0),
        "sgemm: C view must not alias itself"
    );
    if k == 0 {
        // A*B is all zeros: C = beta * C.
        for i in 0..m {
            for j in 0..n {
                let p = c.offset + i * c.rs + j * c.cs;
                c.data[p] = if beta == 0.0 { 0.0 } else { beta * c.data[p] };
            }
        }
        return;
    }
    assert!(a.fits(m, k), "sgemm: A view {m}x{k} out of bounds");
    assert!(b.fits(k, n), "sgemm: B view {k}x{n} out of bounds");
    // SAFETY: the three views were checked to lie inside their slices (offsets plus the largest
    // strided index), strides are non-negative and C does not alias itself; A and B are only
    // read and cannot overlap C (C is borrowed mutably).
    unsafe {
        gemm_ptr(
            (m, n, k),
            alpha,
            a,
            b,
            beta,
            c.data.as_mut_ptr().add(c.offset),
            (c.rs, c.cs),
            threads,
        )
    }
}

/// The call into the `gemm` crate. Safety: A and B lie in their slices (checked by callers),
/// `c` with strides `c_rs`, `c_cs` addresses `m x n` valid, exclusively held elements.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_ptr(
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: MatRef,
    b: MatRef,
    beta: f32,
    c: *mut f32,
    (c_rs, c_cs): (usize, usize),
    threads: Threads,
) {
    if a.cs == 1 && b.rs == 1 && routes_to_dot(m, n, k, b.cs, threads) {
        // SAFETY: forwarded from the caller's contract.
        return unsafe { dot::gemm_bt((m, n, k), alpha, a, b, beta, c, (c_rs, c_cs), threads) };
    }
    if m == 1 && n * k <= SMALL_GEMM {
        // SAFETY: forwarded from the caller's contract.
        return unsafe { small_gemm((m, n, k), alpha, a, b, beta, c, (c_rs, c_cs)) };
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = threads;
        // SAFETY: forwarded from the caller's contract; A and B checked in bounds.
        return unsafe { lanes::gemm((m, n, k), alpha, a, b, beta, c, (c_rs, c_cs)) };
    }
    #[allow(unreachable_code)]
    let par = match threads {
        Threads::Single => Parallelism::None,
        Threads::Pool if crate::parallel::serial() => Parallelism::None,
        Threads::Pool => match rayon::current_num_threads() {
            0 | 1 => Parallelism::None,
            t => Parallelism::Rayon(t),
        },
    };
    // SAFETY: forwarded from the caller's contract; A and B offsets are in bounds.
    unsafe {
        crate_gemm(
            (m, n, k),
            (c, c_cs as isize, c_rs as isize),
            beta != 0.0,
            (a.data.as_ptr().add(a.offset), a.cs as isize, a.rs as isize),
            (b.data.as_ptr().add(b.offset), b.cs as isize, b.rs as isize),
            (beta, alpha),
            par,
        );
    }
}

/// The `gemm` crate's f32 product, `dst = alpha * dst + beta * lhs * rhs` (the crate's names:
/// `(alpha, beta)` scale the old destination and the product), each matrix given as (pointer,
/// column stride, row stride) and read only where `read_dst`. Calls the crate's f32 kernels
/// (`gemm-f32`) without its front (`gemm::gemm`, which pulls in its f64, f16 and complex kernels
/// too), doing what the front does for f32 with non-negative strides: a destination whose
/// columns lie closer than its rows is handed over transposed (`C^T = B^T A^T`), the layout its
/// micro-kernels prefer.
///
/// # Safety
/// The crate's: every view of `m x n`, `m x k` and `k x n` elements with its strides lies in
/// one allocation, strides are non-negative, and `dst` is not read or written elsewhere
/// meanwhile.
pub unsafe fn crate_gemm(
    (m, n, k): (usize, usize, usize),
    dst: (*mut f32, isize, isize),
    read_dst: bool,
    lhs: (*const f32, isize, isize),
    rhs: (*const f32, isize, isize),
    (alpha, beta): (f32, f32),
    par: Parallelism,
) {
    let strides = [dst.1, dst.2, lhs.1, lhs.2, rhs.1, rhs.2];
    debug_assert!(strides.iter().all(|&s| s >= 0), "negative stride");
    let (m, n, dst, lhs, rhs) = if dst.1 < dst.2 {
        fn t<P>((p, cs, rs): (P, isize, isize)) -> (P, isize, isize) {
            (p, rs, cs)
        }
        (n, m, t(dst), t(rhs), t(lhs))
    } else {
        (m, n, dst, lhs, rhs)
    };
    let gemm = gemm_f32::gemm::f32::get_gemm_fn();
    // SAFETY: the caller's contract, which the transposed call keeps (same views, strides
    // swapped).
    unsafe {
        gemm(
            m, n, k, dst.0, dst.1, dst.2, read_dst, lhs.0, lhs.1, lhs.2, rhs.0, rhs.1, rhs.2,
            alpha, beta, false, false, false, par,
        )
    }
}

/// Products with at most this many rows, A's rows and B's columns contiguous (Gemm transB=1)
/// run as tiles of dot products ([`dot`]) where those win (`dot::wins`).
const DOT_MAX_M: usize = 64;

/// Whether an `m x k` by `k x n` product with A's rows and B's columns contiguous (Gemm
/// transA=0, transB=1; B's columns `ld` floats apart) and at least two rows runs as
/// dot-product tiles: such products cost differently per flop than on the crate, so the cost
/// model keys them apart (`Gemm/dot`). Single-row products are left out: whether they take the
/// tiles depends on the pool at run time, and they are bandwidth-bound either way (`gemv`).
pub fn takes_dot_tiles(m: usize, n: usize, k: usize, ld: usize) -> bool {
    m >= 2 && routes_to_dot(m, n, k, ld, Threads::Single)
}

/// Whether [`gemm_ptr`] sends a product with A's rows and B's columns contiguous to the
/// dot-product tiles: at most [`dot_max_m`] rows and where `dot::wins`.
fn routes_to_dot(m: usize, n: usize, k: usize, ld: usize, threads: Threads) -> bool {
    m <= dot_max_m() && dot::wins(m, n, k, ld, threads)
}

/// Whether rows `ld` floats apart fall into few cache sets: a stride of an even number of
/// 64-byte lines, from 1 KiB up. The `gemm` crate packs a transposed B's rows together and
/// slows down 1.5-4x at such strides (one thread, M = 128, K = N = 1024: 98 GFLOP/s, 218 with
/// 16 floats more per row), so `gemm_op` pads constant weights' rows away from them.
pub fn stride_aliases(ld: usize) -> bool {
    ld >= 256 && ld.is_multiple_of(32)
}

/// [`DOT_MAX_M`], or what `TANDEM_GEMM_DOT` says (`0`: never, for A/B timing in one build);
/// read once.
fn dot_max_m() -> usize {
    static MAX_M: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX_M.get_or_init(|| {
        std::env::var("TANDEM_GEMM_DOT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DOT_MAX_M)
    })
}

/// Single-row products of at most this many multiply-adds (a decode step's 1 x 128 x 128) run
/// in plain loops on the calling thread ([`vec_mat`] for a row-major B), on par with the
/// `gemm` crate there (one thread: 1 x 256 x 128 2.1 vs 2.3 us, 1 x 128 x 128 1.0 vs 0.8).
/// Products of more rows go to the crate whatever their size: row by row, these loops ran
/// 5-10x slower than the crate (32 x 64 x 32 6.8 vs 0.64 us, 4 x 64 x 64 1.2 vs 0.22).
const SMALL_GEMM: usize = 1 << 16;

/// `C = alpha * A * B + beta * C` for small products: rows of C accumulated from rows of B
/// (contiguous B rows), or dot products (contiguous B columns), else plain indexing. Same
/// contract as [`gemm_ptr`]; `beta == 0` ignores the old C.
unsafe fn small_gemm(
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: MatRef,
    b: MatRef,
    beta: f32,
    c: *mut f32,
    (c_rs, c_cs): (usize, usize),
) {
    let at = |i: usize, p: usize| a.data[a.offset + i * a.rs + p * a.cs];
    // Rows of C are summed in place where nothing of the old C is read, else in `scratch`.
    let in_place = c_cs == 1 && beta == 0.0;
    let mut scratch = Vec::new();
    for i in 0..m {
        let acc: &mut [f32] = if in_place {
            // SAFETY: row i of the C view, n contiguous valid and exclusive elements (caller
            // contract, c_cs == 1).
            unsafe { std::slice::from_raw_parts_mut(c.add(i * c_rs), n) }
        } else {
            scratch.resize(n, 0.0);
            &mut scratch
        };
        let gathered: Vec<f32>;
        let arow: &[f32] = if a.cs == 1 {
            &a.data[a.offset + i * a.rs..][..k]
        } else {
            gathered = (0..k).map(|p| at(i, p)).collect();
            &gathered
        };
        if b.cs == 1 {
            vec_mat(acc, arow, &b.data[b.offset..][..(k - 1) * b.rs + n], b.rs);
        } else if b.rs == 1 {
            for (j, s) in acc.iter_mut().enumerate() {
                *s = dot(arow, &b.data[b.offset + j * b.cs..][..k]);
            }
        } else {
            for (j, s) in acc.iter_mut().enumerate() {
                *s = (0..k)
                    .map(|p| arow[p] * b.data[b.offset + p * b.rs + j * b.cs])
                    .sum();
            }
        }
        if in_place {
            if alpha != 1.0 {
                acc.iter_mut().for_each(|v| *v *= alpha);
            }
            continue;
        }
        for (j, v) in acc.iter().enumerate() {
            // SAFETY: element (i, j) of the C view, valid and exclusive (caller contract).
            unsafe {
                let p = c.add(i * c_rs + j * c_cs);
                *p = alpha * v + if beta == 0.0 { 0.0 } else { beta * *p };
            }
        }
    }
}

crate::simd::kernel! {
    /// `acc[j] = a[0] * b[j] + a[1] * b[ld + j] + ...` (a row vector times the `a.len() x
    /// acc.len()` matrix `b` with rows `ld` apart), summed in that order from zero: 64, then 16
    /// columns at a time held in registers across the rows (one store per output instead of one
    /// per row), on the widest vectors the CPU has (`crate::simd`). No fused multiply-add, so
    /// every level gives the same bits.
    fn vec_mat(acc: &mut [f32], a: &[f32], b: &[f32], ld: usize) {
        let n = acc.len();
        let wide = n / 64 * 64;
        let narrow = n / 16 * 16;
        for j in (0..wide).step_by(64) {
            columns::<64>(&mut acc[j..j + 64], a, &b[j..], ld);
        }
        for j in (wide..narrow).step_by(16) {
            columns::<16>(&mut acc[j..j + 16], a, &b[j..], ld);
        }
        let tail = &mut acc[narrow..];
        tail.fill(0.0);
        for (p, &av) in a.iter().enumerate() {
            for (s, v) in tail.iter_mut().zip(&b[p * ld + narrow..]) {
                *s += av * v;
            }
        }
    }
}

/// [`vec_mat`] for `L` columns (`out`) starting at `b[0]`, the sums in registers.
#[inline(always)]
fn columns<const L: usize>(out: &mut [f32], a: &[f32], b: &[f32], ld: usize) {
    let mut s = [0.0f32; L];
    for (p, &av) in a.iter().enumerate() {
        let x: &[f32; L] = b[p * ld..][..L].try_into().unwrap();
        for l in 0..L {
            s[l] += av * x[l];
        }
    }
    out.copy_from_slice(&s);
}

crate::simd::kernel! {
    /// Dot product of two equally long slices in 16 partial sums (so it vectorises), on the
    /// widest vectors the CPU has (`crate::simd`).
    fn dot(x: &[f32], y: &[f32]) -> f32 {
        let mut part = [0.0f32; 16];
        let (xc, yc) = (x.chunks_exact(16), y.chunks_exact(16));
        let tail: f32 = (xc.remainder().iter())
            .zip(yc.remainder())
            .map(|(a, b)| a * b)
            .sum();
        for (xs, ys) in xc.zip(yc) {
            for l in 0..16 {
                part[l] += xs[l] * ys[l];
            }
        }
        part.iter().sum::<f32>() + tail
    }
}

/// [`sgemm`] into a destination given by raw pointer, for callers that let several threads
/// write disjoint blocks of one output (Conv's pixel chunks).
///
/// # Safety
/// `c` must point to `c_len` valid f32s; the view (`c_off`, `c_rs`, `c_cs`, `m x n`) must lie
/// inside them (checked here), must not alias itself, and no other thread may access those
/// elements during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm_raw(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: MatRef,
    b: MatRef,
    beta: f32,
    c: *mut f32,
    c_len: usize,
    (c_off, c_rs, c_cs): (usize, usize, usize),
    threads: Threads,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        c_off + (m - 1) * c_rs + (n - 1) * c_cs < c_len,
        "sgemm_raw: C view {m}x{n} out of bounds"
    );
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                // SAFETY: in bounds (checked above) and exclusively ours (caller contract).
                unsafe {
                    let p = c.add(c_off + i * c_rs + j * c_cs);
                    *p = if beta == 0.0 { 0.0 } else { beta * *p };
                }
            }
        }
        return;
    }
    assert!(a.fits(m, k), "sgemm_raw: A view {m}x{k} out of bounds");
    assert!(b.fits(k, n), "sgemm_raw: B view {k}x{n} out of bounds");
    // SAFETY: views checked above; C exclusivity is the caller's contract.
    unsafe {
        gemm_ptr(
            (m, n, k),
            alpha,
            a,
            b,
            beta,
            c.add(c_off),
            (c_rs, c_cs),
            threads,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += a[i * k + p] as f64 * b[p * n + j] as f64;
                }
                c[i * n + j] = s as f32;
            }
        }
        c
    }

    /// Deterministic values in [-0.5, 0.5) (also `cpu_gemm_lanes.rs`'s tests).
    pub(super) fn fill(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 16) as f32 / 65536.0
                    - 0.5
            })
            .collect()
    }

    #[test]
    fn matches_naive_on_odd_shapes_with_alpha_beta_and_transposes() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (7, 13, 5),
            (1, 128, 128),
            (1, 100, 7),
            (1, 20, 300),
            (3, 37, 200),
            (65, 33, 129),
            (130, 70, 3),
        ] {
            let a = fill(m * k, 1);
            let b = fill(k * n, 2);
            let want = naive(m, n, k, &a, &b);
            let mut c = vec![f32::NAN; m * n];
            sgemm(
                m,
                n,
                k,
                1.0,
                MatRef::row_major(&a, 0, k),
                MatRef::row_major(&b, 0, n),
                0.0,
                MatMut::row_major(&mut c, 0, n),
                Threads::Pool,
            );
            for (g, w) in c.iter().zip(&want) {
                assert!((g - w).abs() < 1e-4, "{m}x{n}x{k}: {g} vs {w}");
            }
            // Transposed storage of A (k x m) and B (n x k), alpha 2, beta 0.5 on C = 1.
            let mut at = vec![0.0; m * k];
            for i in 0..m {
                for p in 0..k {
                    at[p * m + i] = a[i * k + p];
                }
            }
            let mut bt = vec![0.0; n * k];
            for p in 0..k {
                for j in 0..n {
                    bt[j * k + p] = b[p * n + j];
                }
            }
            let mut c = vec![1.0; m * n];
            sgemm(
                m,
                n,
                k,
                2.0,
                MatRef::row_major(&at, 0, m).t(),
                MatRef::row_major(&bt, 0, k).t(),
                0.5,
                MatMut::row_major(&mut c, 0, n),
                Threads::Single,
            );
            for (g, w) in c.iter().zip(&want) {
                assert!((g - (2.0 * w + 0.5)).abs() < 1e-4);
            }
            // Row-major A with transposed B (the dot-product form of small products).
            let mut c = vec![f32::NAN; m * n];
            sgemm(
                m,
                n,
                k,
                1.0,
                MatRef::row_major(&a, 0, k),
                MatRef::row_major(&bt, 0, k).t(),
                0.0,
                MatMut::row_major(&mut c, 0, n),
                Threads::Pool,
            );
            for (g, w) in c.iter().zip(&want) {
                assert!((g - w).abs() < 1e-4, "{m}x{n}x{k} A.B^T: {g} vs {w}");
            }
        }
    }

    #[test]
    fn k_zero_scales_c() {
        let mut c = vec![2.0; 6];
        sgemm(
            2,
            3,
            0,
            1.0,
            MatRef::row_major(&[], 0, 0),
            MatRef::row_major(&[], 0, 3),
            0.5,
            MatMut::row_major(&mut c, 0, 3),
            Threads::Pool,
        );
        assert_eq!(c, vec![1.0; 6]);
    }
}
