//! The CPU GEMM where the `gemm` crate has no vector kernels: wasm32 (the browser demo). There
//! the crate runs its scalar micro-kernels, and magika's one Conv took 153 of the 179 ms a run
//! took in V8 (Node 20, one thread), against 71 ms for onnxruntime-web's whole wasm run. On
//! these lanes magika's run took 0.46x the time (280 -> 107 ms), and 0.71x of that again once
//! the tile ran on SIMD128 intrinsics (42 -> 30 ms, the two builds alternated run by run in
//! one Node process; docs/bench.md, "magika on wasm: the lanes tile on SIMD128 intrinsics";
//! `scripts/web.sh bench`).
//!
//! `C = alpha * A @ B + beta * C` for any strides: K in blocks of [`KC`]; strip by strip of
//! [`NR`] columns, the block of B packed K-major (zero-padded), so a step of K reads one strip
//! row, then [`MR`] rows of A at a time, each element of A broadcast over the strip row:
//! [`MR`] x [`NR`] sums in [`X4`] vectors: wasm's `v128`, or plain arrays natively. The unit
//! test runs both: natively in `cargo test`, and built for wasm32-wasip1 with SIMD128 in Node's
//! WASI (`scripts/web.sh test`). The blocks' partial sums add up in C. A product
//! of at most [`MR`] rows (a linear layer on one vector) reads a row-major B's full strips in
//! place: packing would copy all of B for one pass over it. One thread: wasm32 without
//! atomics has no pool.
//!
//! Sits between `cpu_gemm.rs` (which checks the views and routes wasm32 here) and wasm's
//! 128-bit lanes.

use super::MatRef;

/// Rows of A per micro-tile.
const MR: usize = 2;
/// Columns of B per strip (four 128-bit vectors). 2 x 16 holds 8 sums, 4 strip vectors, 2
/// broadcasts and a product: 15 of x86's 16 vector registers under V8. Tiles needing more ran
/// 1.4-1.9x its time (3 x 16, 3 x 12), smaller ones 1.05-1.2x (4 x 8, 2 x 8; docs/bench.md).
const NR: usize = 16;
/// Steps of K per block: a strip of `KC x NR` floats is 16 KB.
const KC: usize = 256;

/// `C = alpha * A @ B + beta * C` (`m x k` by `k x n`, `k > 0`: the callers answer `k == 0`);
/// `beta == 0` ignores C's contents.
///
/// # Safety
/// `a` and `b` lie inside their slices for `m x k` and `k x n` (the caller checks
/// [`MatRef::fits`]); C's `m x n` view at `c` with strides `(c_rs, c_cs)` is valid for reads
/// and writes and no one else's during the call.
pub(super) unsafe fn gemm(
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: MatRef,
    b: MatRef,
    beta: f32,
    c: *mut f32,
    (c_rs, c_cs): (usize, usize),
) {
    let strips = n.div_ceil(NR);
    // Strip by strip, each packed right before its tiles read it; with one tile of rows
    // (`m <= MR`) a strip is read once, so a row-major B's full strips are read in place.
    let in_place = m <= MR && b.cs == 1;
    let mut packed = vec![0.0f32; KC.min(k) * NR];
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        for s in 0..strips {
            let (j0, cols) = (s * NR, NR.min(n - s * NR));
            let (strip, ld): (&[f32], usize) = if in_place && cols == NR {
                (&b.data[b.offset + k0 * b.rs + j0..], b.rs)
            } else {
                pack_strip(b, (k0, kc), (j0, cols), &mut packed[..kc * NR]);
                (&packed[..kc * NR], NR)
            };
            for i0 in (0..m).step_by(MR) {
                let rows = MR.min(m - i0);
                // Rows past `m` repeat the last one: computed, never stored.
                let row = |r: usize| a.offset + (i0 + r.min(rows - 1)) * a.rs + k0 * a.cs;
                // SAFETY: rows i0.. of A's view, K steps k0..k0 + kc (caller contract); the
                // strip holds kc rows of NR floats ld apart (packed, or inside B's view).
                let acc = unsafe { tile(kc, a.data, std::array::from_fn(row), a.cs, (strip, ld)) };
                for (r, sums) in acc.iter().enumerate().take(rows) {
                    for (j, &v) in sums.iter().enumerate().take(cols) {
                        // SAFETY: (i0 + r, j0 + j) is inside C's view (caller contract).
                        let p = unsafe { c.add((i0 + r) * c_rs + (j0 + j) * c_cs) };
                        let v = alpha * v;
                        // SAFETY: as above.
                        unsafe {
                            *p = if k0 > 0 {
                                v + *p
                            } else if beta == 0.0 {
                                v
                            } else {
                                v + beta * *p
                            }
                        };
                    }
                }
            }
        }
    }
}

/// Rows `k0..k0 + kc` of B's columns `j0..j0 + cols` as a strip of [`NR`] columns, K-major,
/// zero past `cols`.
fn pack_strip(b: MatRef, (k0, kc): (usize, usize), (j0, cols): (usize, usize), out: &mut [f32]) {
    for (p, row) in out.chunks_exact_mut(NR).take(kc).enumerate() {
        let at = b.offset + (k0 + p) * b.rs + j0 * b.cs;
        if b.cs == 1 {
            row[..cols].copy_from_slice(&b.data[at..at + cols]);
        } else {
            for (j, v) in row[..cols].iter_mut().enumerate() {
                *v = b.data[at + j * b.cs];
            }
        }
        row[cols..].fill(0.0);
    }
}

/// The `MR x NR` sums of rows `rows` of A (each `kc` elements `a_cs` apart in `a`) times the
/// strip's `kc` rows, `ld` floats apart.
///
/// # Safety
/// `r + p * a_cs < a.len()` for every `r` in `rows` and `p < kc` (A's view, checked by
/// `cpu_gemm.rs`, covers them), and `(kc - 1) * ld + NR <= strip.len()`; read unchecked, so
/// that the loop carries no bounds test per row and step.
#[inline(always)]
unsafe fn tile(
    kc: usize,
    a: &[f32],
    rows: [usize; MR],
    a_cs: usize,
    (strip, ld): (&[f32], usize),
) -> [[f32; NR]; MR] {
    debug_assert!((kc - 1) * ld + NR <= strip.len());
    let mut acc = [[X4::ZERO; NR / 4]; MR];
    for p in 0..kc {
        // SAFETY: row `p` of the strip (this function's contract).
        let b: [X4; NR / 4] =
            std::array::from_fn(|v| unsafe { X4::load(strip.as_ptr().add(p * ld + 4 * v)) });
        for (sums, &r) in acc.iter_mut().zip(&rows) {
            debug_assert!(r + p * a_cs < a.len());
            // SAFETY: in bounds (this function's contract).
            let x = unsafe { X4::splat(a.as_ptr().add(r + p * a_cs)) };
            for (s, &y) in sums.iter_mut().zip(&b) {
                *s = s.add_mul(x, y);
            }
        }
    }
    acc.map(|sums| {
        let mut row = [0.0; NR];
        for (out, s) in row.chunks_exact_mut(4).zip(sums) {
            out.copy_from_slice(&s.lanes());
        }
        row
    })
}

/// Four f32 lanes: wasm's `v128` where the build has SIMD128, else a plain array (the native
/// unit tests, a wasm build without SIMD). The tile on plain arrays compiled to SIMD128 too,
/// but V8 ran it slower: magika's Conv (512 x 1280 by 1280 x 508) 34-35 ms against 24-25 on
/// these intrinsics in Node 20 (docs/bench.md).
#[derive(Clone, Copy)]
struct X4(
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))] std::arch::wasm32::v128,
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))] [f32; 4],
);

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
impl X4 {
    const ZERO: X4 = X4(std::arch::wasm32::f32x4(0.0, 0.0, 0.0, 0.0));
    /// # Safety
    /// Four floats readable from `p` (any alignment).
    unsafe fn load(p: *const f32) -> X4 {
        // SAFETY: the caller's contract; wasm loads take any alignment.
        X4(unsafe { std::arch::wasm32::v128_load(p.cast()) })
    }
    /// # Safety
    /// `*p` readable.
    unsafe fn splat(p: *const f32) -> X4 {
        // SAFETY: the caller's contract.
        X4(unsafe { std::arch::wasm32::v128_load32_splat(p.cast()) })
    }
    fn add_mul(self, x: X4, y: X4) -> X4 {
        use std::arch::wasm32::{f32x4_add, f32x4_mul};
        X4(f32x4_add(self.0, f32x4_mul(x.0, y.0)))
    }
    fn lanes(self) -> [f32; 4] {
        use std::arch::wasm32::f32x4_extract_lane as at;
        [
            at::<0>(self.0),
            at::<1>(self.0),
            at::<2>(self.0),
            at::<3>(self.0),
        ]
    }
}

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
impl X4 {
    const ZERO: X4 = X4([0.0; 4]);
    /// # Safety
    /// Four floats readable from `p`.
    unsafe fn load(p: *const f32) -> X4 {
        // SAFETY: the caller's contract.
        X4(unsafe { p.cast::<[f32; 4]>().read_unaligned() })
    }
    /// # Safety
    /// `*p` readable.
    unsafe fn splat(p: *const f32) -> X4 {
        // SAFETY: the caller's contract.
        X4([unsafe { *p }; 4])
    }
    fn add_mul(self, x: X4, y: X4) -> X4 {
        X4(std::array::from_fn(|i| self.0[i] + x.0[i] * y.0[i]))
    }
    fn lanes(self) -> [f32; 4] {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::fill;
    use super::*;

    /// Every shape around the tile, strip and K-block edges, A and B in either layout, C
    /// row- or column-major, alpha and beta (0 with a NaN in C: ignored), against f64 sums.
    #[test]
    fn matches_f64_sums_at_every_edge_and_layout() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (3, 7, 5),
            (4, 8, 256),
            (5, 9, 257),
            (9, 17, 513),
            (13, 3, 40),
            (2, 30, 700),
            (1, 48, 300),
        ] {
            for (a_t, b_t, c_t) in [
                (false, false, false),
                (true, true, true),
                (false, true, false),
            ] {
                for (alpha, beta) in [(1.0f32, 0.0f32), (0.5, 2.0)] {
                    let (av, bv) = (fill(m * k, 1), fill(k * n, 2));
                    // Transposed: stored as the transpose, row-major, read through `t()`.
                    let a = match a_t {
                        false => MatRef::row_major(&av, 0, k),
                        true => MatRef::row_major(&av, 0, m).t(),
                    };
                    let b = match b_t {
                        false => MatRef::row_major(&bv, 0, n),
                        true => MatRef::row_major(&bv, 0, k).t(),
                    };
                    let (c_rs, c_cs) = if c_t { (1, m) } else { (n, 1) };
                    let c0 = fill(m * n, 3);
                    let mut c = c0.clone();
                    if beta == 0.0 {
                        c.iter_mut().for_each(|v| *v = f32::NAN);
                    }
                    // SAFETY: the views cover exactly their vectors.
                    unsafe { gemm((m, n, k), alpha, a, b, beta, c.as_mut_ptr(), (c_rs, c_cs)) };
                    for i in 0..m {
                        for j in 0..n {
                            let dot: f64 = (0..k)
                                .map(|p| {
                                    av[a.offset + i * a.rs + p * a.cs] as f64
                                        * bv[b.offset + p * b.rs + j * b.cs] as f64
                                })
                                .sum();
                            let at = i * c_rs + j * c_cs;
                            let want = alpha as f64 * dot + beta as f64 * c0[at] as f64;
                            let got = c[at] as f64;
                            assert!(
                                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                                "{m}x{n}x{k} a_t {a_t} b_t {b_t} c_t {c_t} alpha {alpha} beta {beta} at ({i}, {j}): {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
