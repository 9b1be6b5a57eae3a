//! The CPU GEMM where the `gemm` crate has no vector kernels: wasm32 (the browser demo). There
//! the crate runs its scalar micro-kernels, and magika's one Conv took 153 of the 179 ms a run
//! took in V8 (Node 20, one thread), against 71 ms for onnxruntime-web's whole wasm run. On
//! these lanes magika's run takes 0.46x the time (the two builds and onnxruntime-web
//! alternated run by run in one Node process: 280, 107 and 115 ms; docs/bench.md, "magika's
//! GEMMs on wasm's 128-bit lanes"; `scripts/web.sh bench`).
//!
//! `C = alpha * A @ B + beta * C` for any strides: K in blocks of [`KC`]; each block of B
//! packed K-major into strips of [`NR`] columns (zero-padded), so a step of K reads one strip
//! row; per strip, [`MR`] rows of A at a time, each element of A broadcast over the strip
//! row: [`MR`] x [`NR`] sums in plain arrays, which LLVM turns into 128-bit vector multiplies
//! and adds (simd128 on wasm32, SSE on x86-64, where the unit tests run this same code). The
//! blocks' partial sums add up in C. One thread: wasm32 without atomics has no pool.
//!
//! Sits between `cpu_gemm.rs` (which checks the views and routes wasm32 here) and the
//! compiler's vectoriser.

use super::MatRef;

/// Rows of A per micro-tile.
const MR: usize = 4;
/// Columns of B per strip (two 128-bit vectors).
const NR: usize = 8;
/// Steps of K per block: a strip row block of `KC x NR` floats is 8 KB.
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
    let mut packed = vec![0.0f32; strips * KC.min(k) * NR];
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        pack_b(b, (k0, kc), n, &mut packed[..strips * kc * NR]);
        for s in 0..strips {
            let strip = &packed[s * kc * NR..][..kc * NR];
            let (j0, cols) = (s * NR, NR.min(n - s * NR));
            for i0 in (0..m).step_by(MR) {
                let rows = MR.min(m - i0);
                // Rows past `m` repeat the last one: computed, never stored.
                let row = |r: usize| a.offset + (i0 + r.min(rows - 1)) * a.rs + k0 * a.cs;
                // SAFETY: rows i0.. of A's view, K steps k0..k0 + kc (caller contract).
                let acc = unsafe { tile(kc, a.data, std::array::from_fn(row), a.cs, strip) };
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

/// Rows `k0..k0 + kc` of B as strips of [`NR`] columns, K-major, zero past column `n`.
fn pack_b(b: MatRef, (k0, kc): (usize, usize), n: usize, out: &mut [f32]) {
    for (s, strip) in out.chunks_exact_mut(kc * NR).enumerate() {
        let (j0, cols) = (s * NR, NR.min(n - s * NR));
        for (p, row) in strip.chunks_exact_mut(NR).enumerate() {
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
}

/// The `MR x NR` sums of rows `rows` of A (each `kc` elements `a_cs` apart in `a`) times the
/// strip's `kc` rows.
///
/// # Safety
/// `r + p * a_cs < a.len()` for every `r` in `rows` and `p < kc` (A's view, checked by
/// `cpu_gemm.rs`, covers them); read unchecked, so that the loop carries no bounds test per
/// row and step.
#[inline(always)]
unsafe fn tile(
    kc: usize,
    a: &[f32],
    rows: [usize; MR],
    a_cs: usize,
    strip: &[f32],
) -> [[f32; NR]; MR] {
    let mut acc = [[0.0f32; NR]; MR];
    for (p, b) in strip.chunks_exact(NR).take(kc).enumerate() {
        let b: &[f32; NR] = b.try_into().expect("strip rows are NR long");
        for (sums, &r) in acc.iter_mut().zip(&rows) {
            debug_assert!(r + p * a_cs < a.len());
            // SAFETY: in bounds (this function's contract).
            let x = unsafe { *a.get_unchecked(r + p * a_cs) };
            for (s, &y) in sums.iter_mut().zip(b) {
                *s += x * y;
            }
        }
    }
    acc
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
