//! GEMM against a B packed once: `C = A @ B` where B is a model constant (a MatMul's weight),
//! packed into panels of [`NR`] columns the first time it is used and kept.
//!
//! The `gemm` crate packs both operands on every call. For the products of transformer layers
//! (128 x 384 @ 384 x 1536 in minilm) packing B costs as much as a third of the product, and
//! onnxruntime packs such weights once at load. Here each panel holds `K x NR` floats, K-major,
//! so the micro-kernel reads three 16-float vectors per k and broadcasts [`MR`] rows of A read
//! in place (any strides). AVX-512 only: without it ([`available`] false) callers keep the
//! `gemm` crate.
//!
//! Sits between `matmul.rs` (which keeps a [`KeptPacking`] per constant-weight MatMul, set by
//! the runtime's load-time `layout` pass) and the CPU's vector units.

use crate::cpu_gemm::{MatRef, Threads};
use crate::kept::Kept;
use rayon::prelude::*;

/// Columns of B per panel: three AVX-512 vectors.
pub const NR: usize = 48;
/// Rows of A per micro-kernel call: 8 rows x 3 vectors = 24 accumulators of the 32 registers.
pub const MR: usize = 8;

/// B (`k x n`) packed into `n.div_ceil(NR)` panels of `k x NR` floats, columns past `n` zero.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedB {
    pub k: usize,
    pub n: usize,
    data: Vec<f32>,
}

impl PackedB {
    /// Pack `b` (`k x n`, any strides).
    pub fn pack(b: MatRef, k: usize, n: usize) -> PackedB {
        assert!(b.fits(k, n), "PackedB: B view {k}x{n} out of bounds");
        let panels = n.div_ceil(NR);
        let mut data = vec![0.0; panels * k * NR];
        for (p, panel) in data.chunks_mut((k * NR).max(1)).enumerate().take(panels) {
            let cols = (n - p * NR).min(NR);
            for (kk, row) in panel.chunks_mut(NR).enumerate() {
                let at = b.offset + kk * b.rs + p * NR * b.cs;
                for (j, v) in row[..cols].iter_mut().enumerate() {
                    *v = b.data[at + j * b.cs];
                }
            }
        }
        PackedB { k, n, data }
    }

    fn panel(&self, p: usize) -> &[f32] {
        &self.data[p * self.k * NR..][..self.k * NR]
    }
}

/// A packed B kept across calls (shared by clones of the op that holds it): packed by the
/// first call, reused by every later one. Only for a B that cannot change between runs.
#[derive(Clone, Default, Debug)]
pub struct KeptPacking(Kept<PackedB>);

impl KeptPacking {
    /// The packing of `b` (`k x n`): made on the first call (racing first calls each pack,
    /// one result is kept), then the kept one.
    pub fn get(&self, b: MatRef, k: usize, n: usize) -> &PackedB {
        let p = self.0.get_or_make(|| PackedB::pack(b, k, n));
        assert!(
            p.k == k && p.n == n,
            "KeptPacking: B was packed as {}x{}, now read as {k}x{n}",
            p.k,
            p.n
        );
        p
    }
}

/// Whether this CPU runs the packed kernel (AVX-512F).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `C[m x n] = A[m x k] @ B` (B packed), C row-major with row stride `ldc` in `c`.
///
/// Panics if AVX-512 is absent ([`available`]) or a view does not lie inside its slice.
pub fn sgemm_packed(m: usize, a: MatRef, b: &PackedB, c: &mut [f32], ldc: usize, threads: Threads) {
    let (k, n) = (b.k, b.n);
    if m == 0 || n == 0 {
        return;
    }
    assert!(available(), "sgemm_packed without AVX-512");
    assert!(a.fits(m, k), "sgemm_packed: A view {m}x{k} out of bounds");
    assert!(
        ldc >= n && (m - 1) * ldc + n <= c.len(),
        "sgemm_packed: C {m}x{n} (row stride {ldc}) out of bounds of {}",
        c.len()
    );
    // Tasks: a panel of columns x a band of rows; bands only where panels are too few to keep
    // every thread busy for several tasks.
    let panels = n.div_ceil(NR);
    let workers = match threads {
        Threads::Pool => rayon::current_num_threads().max(1),
        Threads::Single => 1,
    };
    let blocks = m.div_ceil(MR);
    let bands = (4 * workers).div_ceil(panels).clamp(1, blocks);
    let band = blocks.div_ceil(bands) * MR;
    let cptr = CPtr(c.as_mut_ptr());
    let task = |t: usize| {
        let (p, r0) = (t % panels, (t / panels) * band);
        let cols = (n - p * NR).min(NR);
        let panel = b.panel(p);
        let mut i = r0;
        while i < (r0 + band).min(m) {
            let rows = (m - i).min(MR);
            let ai = MatRef {
                offset: a.offset + i * a.rs,
                ..a
            };
            // SAFETY: AVX-512F checked above; A's rows i..i+rows and the panel are in bounds
            // (checked views); C's block (rows i.., columns p*NR.. +cols) is in bounds (checked)
            // and written by this task only (tasks are distinct (panel, band) pairs).
            unsafe { block(rows, ai, panel, cptr.at(i * ldc + p * NR), ldc, cols) };
            i += rows;
        }
    };
    let tasks = panels * m.div_ceil(band);
    if workers > 1 && tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// C's pointer, shared by tasks that write disjoint blocks.
#[derive(Clone, Copy)]
struct CPtr(*mut f32);
// SAFETY: only used to hand disjoint output blocks to rayon tasks (see `sgemm_packed`).
unsafe impl Send for CPtr {}
unsafe impl Sync for CPtr {}

impl CPtr {
    /// The pointer `off` elements in (a method, so closures capture the whole wrapper).
    fn at(self, off: usize) -> *mut f32 {
        self.0.wrapping_add(off)
    }
}

/// One block of `rows <= MR` rows by `cols <= NR` columns.
///
/// # Safety
/// AVX-512F present; `a` covers `rows x panel.len() / NR`; `c` covers `rows` rows of `cols`
/// at stride `ldc`, written by no one else during the call.
unsafe fn block(rows: usize, a: MatRef, panel: &[f32], c: *mut f32, ldc: usize, cols: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller.
    unsafe {
        match rows {
            8 => avx512::kernel::<8>(a, panel, c, ldc, cols),
            7 => avx512::kernel::<7>(a, panel, c, ldc, cols),
            6 => avx512::kernel::<6>(a, panel, c, ldc, cols),
            5 => avx512::kernel::<5>(a, panel, c, ldc, cols),
            4 => avx512::kernel::<4>(a, panel, c, ldc, cols),
            3 => avx512::kernel::<3>(a, panel, c, ldc, cols),
            2 => avx512::kernel::<2>(a, panel, c, ldc, cols),
            _ => avx512::kernel::<1>(a, panel, c, ldc, cols),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rows, a, panel, c, ldc, cols);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MatRef, NR};
    use std::arch::x86_64::*;

    /// `R` rows of A times one panel into C: 3R accumulators over all of K, then masked stores
    /// of the first `cols` columns.
    ///
    /// # Safety
    /// As [`super::block`], with `R` rows.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn kernel<const R: usize>(
        a: MatRef,
        panel: &[f32],
        c: *mut f32,
        ldc: usize,
        cols: usize,
    ) {
        let k = panel.len() / NR;
        let mut acc = [[_mm512_setzero_ps(); 3]; R];
        let (ap, bp) = (a.data.as_ptr().add(a.offset), panel.as_ptr());
        for kk in 0..k {
            let b0 = _mm512_loadu_ps(bp.add(kk * NR));
            let b1 = _mm512_loadu_ps(bp.add(kk * NR + 16));
            let b2 = _mm512_loadu_ps(bp.add(kk * NR + 32));
            let col = ap.add(kk * a.cs);
            for (i, acc) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*col.add(i * a.rs));
                acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
                acc[2] = _mm512_fmadd_ps(av, b2, acc[2]);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                let first = 16 * v;
                if first >= cols {
                    break;
                }
                let mask = match cols - first {
                    16.. => 0xffff,
                    r => (1u16 << r) - 1,
                };
                _mm512_mask_storeu_ps(c.add(i * ldc + first), mask, *acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 37 + seed * 101) % 97) as f32 / 48.0 - 1.0)
            .collect()
    }

    /// `A @ B` by the definition, in f64.
    fn naive(a: MatRef, b: MatRef, m: usize, k: usize, n: usize) -> Vec<f64> {
        let at = |x: MatRef, i: usize, j: usize| x.data[x.offset + i * x.rs + j * x.cs] as f64;
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| at(a, i, l) * at(b, l, j)).sum();
            }
        }
        c
    }

    #[test]
    fn packing_keeps_every_element_and_zeroes_the_last_panel_past_n() {
        let (k, n) = (3, 50);
        let b = fill(k * n, 1);
        let p = PackedB::pack(MatRef::row_major(&b, 0, n), k, n);
        assert_eq!(p.data.len(), 2 * k * NR);
        for kk in 0..k {
            for j in 0..n {
                assert_eq!(p.panel(j / NR)[kk * NR + j % NR], b[kk * n + j]);
            }
            assert!(p.panel(1)[kk * NR + 2..(kk + 1) * NR]
                .iter()
                .all(|&v| v == 0.0));
        }
    }

    #[test]
    fn packed_products_match_the_definition_at_every_tail() {
        if !available() {
            eprintln!(
                "no AVX-512 here: the packed kernel cannot run (callers keep the gemm crate)"
            );
            return;
        }
        // Row tails 1..MR, column tails inside each of the three vectors, K of 1 and odd K,
        // A read in place with row-major and transposed strides, one thread and the pool.
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 7, 17),
            (8, 16, 48),
            (13, 33, 95),
            (37, 64, 130),
            (128, 96, 200),
        ] {
            let (a, bv) = (fill(m * k, m), fill(k * n, n));
            let b = MatRef::row_major(&bv, 0, n);
            let packed = PackedB::pack(b, k, n);
            for a_view in [MatRef::row_major(&a, 0, k), MatRef::row_major(&a, 0, m).t()] {
                let want = naive(a_view, b, m, k, n);
                for threads in [Threads::Single, Threads::Pool] {
                    let ldc = n + 3;
                    let mut c = vec![f32::NAN; m * ldc];
                    sgemm_packed(m, a_view, &packed, &mut c, ldc, threads);
                    for i in 0..m {
                        for j in 0..n {
                            let (got, w) = (c[i * ldc + j] as f64, want[i * n + j]);
                            assert!(
                                (got - w).abs() <= 1e-4 * (1.0 + w.abs()),
                                "{m}x{k}x{n} ({threads:?}) C[{i}][{j}] = {got}, want {w}"
                            );
                        }
                        // The padding between rows is never written.
                        assert!(c[i * ldc + n..][..(ldc - n).min(c.len() - i * ldc - n)]
                            .iter()
                            .all(|v| v.is_nan()));
                    }
                }
            }
        }
    }

    #[test]
    fn a_kept_packing_refuses_another_shape() {
        let b = fill(12, 0);
        let kept = KeptPacking::default();
        kept.get(MatRef::row_major(&b, 0, 4), 3, 4);
        let again = std::panic::catch_unwind(|| {
            kept.get(MatRef::row_major(&b, 0, 3), 4, 3);
        });
        assert!(again.is_err());
    }
}
