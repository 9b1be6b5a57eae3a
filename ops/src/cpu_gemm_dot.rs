//! Products with few rows of A and a transposed B (`Gemm transB=1`, a linear layer's weight
//! stored `[N, K]`): every element of C is a dot product of a contiguous row of A with a
//! contiguous row of the stored B.
//!
//! Sits between [`super::sgemm`] (which routes such views here where [`wins`] says so) and the
//! CPU's vector units (through [`crate::simd::kernel`]). The `gemm` crate runs these layouts
//! at 5-20 GFLOP/s for M = 4..16 where the same product with a row-major B runs at 120-200
//! (`gemm_op`'s `gemm_speed` probe, one thread; the cause inside the crate is not pinned down:
//! setting its RHS packing threshold to 0 changed nothing). Here 4 x 4 tiles of C are summed in
//! 16 lanes each (16 AVX-512 accumulators; the AVX2 copy spills them and is slower), over K
//! blocks of [`KC`] once A outgrows L2, and the pool works on separate column blocks of C.
//! Measured on one thread against the crate: M = 16, K = N = 1024 0.27 vs 1.8 ms; M = 4, K = N =
//! 4096 2.5 vs 28 ms; 1 x 25088 x 4096 (vgg19's first FC) 10.0 vs 16.6 ms.
//! `TANDEM_GEMM_DOT=0` sends everything back to the crate (for A/B timing in one build).

use super::{MatRef, Threads};

/// Rows of A per tile.
const MR: usize = 4;
/// Rows of the stored B (columns of C) per tile.
const NR: usize = 4;
/// Partial sums per dot product: one AVX-512 vector (two AVX2, four SSE).
const L: usize = 16;
/// K per block: the tile's 8 rows (32 KiB) stay in L1 across the block.
const KC: usize = 1024;
/// A smaller A than this many elements (256 KiB) stays in L2 whole: K is not blocked (B's rows
/// stream in one pass, C is written once).
const A_IN_L2: usize = 1 << 16;
/// Columns of C per parallel task (a multiple of `NR`).
const NB: usize = 64;
/// Below this many multiply-adds the product runs on the calling thread (waking a worker costs
/// more).
const PAR_MACS: usize = 1 << 18;

/// `L` lanes of a dot product.
type V = [f32; L];

/// `acc[l] += x[l] * y[l]`: one vector multiply and add.
#[inline(always)]
fn madd(acc: &mut V, x: &V, y: &V) {
    for l in 0..L {
        acc[l] += x[l] * y[l];
    }
}

/// Lanes `o..o + L` of `s`.
#[inline(always)]
fn lanes(s: &[f32], o: usize) -> &V {
    s[o..o + L].try_into().expect("L lanes")
}

/// The sum of `L` partial sums (halves added pairwise, so it vectorises) and the scalar tail
/// `body..k`: the same operations in the same order on every SIMD level.
#[inline(always)]
fn finish(part: &V, x: &[f32], y: &[f32], body: usize) -> f32 {
    let tail: f32 = x[body..].iter().zip(&y[body..]).map(|(p, q)| p * q).sum();
    let mut v = *part;
    let mut w = L / 2;
    while w > 0 {
        for l in 0..w {
            v[l] += v[l + w];
        }
        w /= 2;
    }
    v[0] + tail
}

crate::simd::kernel! {
    /// `t[r][c]` = dot(a[r], b[c]) over the first `k` elements: a 4 x 4 tile whose 16
    /// accumulators are named one by one (loops over them are not unrolled into registers).
    fn tile_4x4(a: [&[f32]; 4], b: [&[f32]; 4], k: usize) -> [[f32; 4]; 4] {
        let [a0, a1, a2, a3] = a.map(|x| &x[..k]);
        let [b0, b1, b2, b3] = b.map(|x| &x[..k]);
        let z = [0.0f32; L];
        let (mut s00, mut s01, mut s02, mut s03) = (z, z, z, z);
        let (mut s10, mut s11, mut s12, mut s13) = (z, z, z, z);
        let (mut s20, mut s21, mut s22, mut s23) = (z, z, z, z);
        let (mut s30, mut s31, mut s32, mut s33) = (z, z, z, z);
        let body = k / L * L;
        let mut o = 0;
        while o < body {
            let (x0, x1, x2, x3) = (lanes(a0, o), lanes(a1, o), lanes(a2, o), lanes(a3, o));
            let (y0, y1, y2, y3) = (lanes(b0, o), lanes(b1, o), lanes(b2, o), lanes(b3, o));
            madd(&mut s00, x0, y0);
            madd(&mut s01, x0, y1);
            madd(&mut s02, x0, y2);
            madd(&mut s03, x0, y3);
            madd(&mut s10, x1, y0);
            madd(&mut s11, x1, y1);
            madd(&mut s12, x1, y2);
            madd(&mut s13, x1, y3);
            madd(&mut s20, x2, y0);
            madd(&mut s21, x2, y1);
            madd(&mut s22, x2, y2);
            madd(&mut s23, x2, y3);
            madd(&mut s30, x3, y0);
            madd(&mut s31, x3, y1);
            madd(&mut s32, x3, y2);
            madd(&mut s33, x3, y3);
            o += L;
        }
        let part = [
            [s00, s01, s02, s03],
            [s10, s11, s12, s13],
            [s20, s21, s22, s23],
            [s30, s31, s32, s33],
        ];
        let (a, b) = ([a0, a1, a2, a3], [b0, b1, b2, b3]);
        std::array::from_fn(|r| std::array::from_fn(|c| finish(&part[r][c], a[r], b[c], body)))
    }
}

crate::simd::kernel! {
    /// `t[c]` = dot(a, b[c]) over the first `k` elements: one row of A against 4 of B.
    fn tile_1x4(a: &[f32], b: [&[f32]; 4], k: usize) -> [f32; 4] {
        let a = &a[..k];
        let [b0, b1, b2, b3] = b.map(|x| &x[..k]);
        let z = [0.0f32; L];
        let (mut s0, mut s1, mut s2, mut s3) = (z, z, z, z);
        let body = k / L * L;
        let mut o = 0;
        while o < body {
            let x = lanes(a, o);
            madd(&mut s0, x, lanes(b0, o));
            madd(&mut s1, x, lanes(b1, o));
            madd(&mut s2, x, lanes(b2, o));
            madd(&mut s3, x, lanes(b3, o));
            o += L;
        }
        let (part, b) = ([s0, s1, s2, s3], [b0, b1, b2, b3]);
        std::array::from_fn(|c| finish(&part[c], a, b[c], body))
    }
}

crate::simd::kernel! {
    /// dot(a, b) over the first `k` elements (the columns left over after tiles of 4).
    fn tile_1x1(a: &[f32], b: &[f32], k: usize) -> f32 {
        let (a, b) = (&a[..k], &b[..k]);
        let mut s = [0.0f32; L];
        let body = k / L * L;
        let mut o = 0;
        while o < body {
            madd(&mut s, lanes(a, o), lanes(b, o));
            o += L;
        }
        finish(&s, a, b, body)
    }
}

/// Whether [`gemm_bt`] splits the columns of C over the pool.
fn parallel(m: usize, n: usize, k: usize, threads: Threads) -> bool {
    threads == Threads::Pool && n > NB && m * n * k >= PAR_MACS && rayon::current_num_threads() > 1
}

/// A B of at least this many elements (16 MiB) comes from memory, where 4 rows streamed at
/// once beat the `gemm` crate's one-row gemv (1 x 4096 x 4096: 1.5 vs 2.3 ms on one thread).
const BIG_B: usize = 1 << 22;

/// Whether [`gemm_bt`] beats the `gemm` crate on an `m x k` by `k x n` product with a
/// transposed B, as measured with `gemm_op`'s `gemm_speed` probe (one thread, K = N):
/// M = 1 in cache: the crate's gemv is 10-30 % faster (1 x 512 x 512 12 vs 17 us), unless the
/// columns are split over threads or B comes from memory; M = 2..8: the tiles win at every K
/// (M = 4, K = 256: 13 vs 23 us; K = 1024: 0.07 vs 1.7 ms); M = 9..64: the crate wins below
/// K = 512 (M = 32, K = 256: 42 vs 65 us), the tiles from there on (M = 16, K = 1024: 0.27 vs
/// 1.8 ms; M = 64, K = 4096: 18 vs 36 ms) while B's row stride `ld` falls into few cache sets
/// ([`super::stride_aliases`]). At a padded stride (`gemm_op`'s constant weights) the crate
/// wins from M = 32 (one thread, tiles vs crate: 32 x 1024 x 512 259 vs 220 us, 64 x 512 x 256
/// 155 vs 86, 64 x 2048 x 2048 4.2 vs 2.9 ms; M = 16, K = N = 1024 still 273 vs 308).
pub(super) fn wins(m: usize, n: usize, k: usize, ld: usize, threads: Threads) -> bool {
    match m {
        0 => false,
        1 => parallel(m, n, k, threads) || n * k >= BIG_B,
        2..=8 => true,
        9..=31 => k >= 512,
        _ => k >= 512 && super::stride_aliases(ld),
    }
}

/// The C pointer shared by the tasks of one call; each task writes its own columns.
#[derive(Clone, Copy)]
struct CPtr(*mut f32);
// SAFETY: tasks write disjoint column blocks of C (see `gemm_bt`).
unsafe impl Send for CPtr {}
// SAFETY: as above.
unsafe impl Sync for CPtr {}

impl CPtr {
    /// Element `off` of C (a method, so closures capture the whole `Sync` wrapper).
    ///
    /// # Safety
    /// `off` lies inside the caller's C view.
    unsafe fn at(self, off: usize) -> *mut f32 {
        // SAFETY: forwarded to the caller.
        unsafe { self.0.add(off) }
    }
}

/// `C = alpha * A * B + beta * C` where A's rows (`a.cs == 1`) and B's columns (`b.rs == 1`)
/// are contiguous; `beta == 0` ignores the old C.
///
/// # Safety
/// As [`super::gemm_ptr`]: A and B lie in their slices (checked by the callers), `c` with
/// strides `c_rs`, `c_cs` addresses `m x n` valid elements no one else touches during the call.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_bt(
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: MatRef,
    b: MatRef,
    beta: f32,
    c: *mut f32,
    (c_rs, c_cs): (usize, usize),
    threads: Threads,
) {
    debug_assert!(a.cs == 1 && b.rs == 1);
    let arow = |i: usize, p0: usize, kb: usize| &a.data[a.offset + i * a.rs + p0..][..kb];
    let brow = |j: usize, p0: usize, kb: usize| &b.data[b.offset + j * b.cs + p0..][..kb];
    let c = CPtr(c);
    // Columns j0..j1 of C, all rows, K in blocks.
    let block = |j0: usize, j1: usize| {
        let kc = if m * k <= A_IN_L2 { k } else { KC };
        for p0 in (0..k).step_by(kc) {
            let kb = kc.min(k - p0);
            let first = p0 == 0;
            let put = |i: usize, j: usize, v: f32| {
                // SAFETY: (i, j) is inside the m x n view of C, whose columns j0..j1 only this
                // task writes (caller contract plus the disjoint column blocks below).
                unsafe {
                    let p = c.at(i * c_rs + j * c_cs);
                    *p = if !first {
                        *p + alpha * v
                    } else if beta == 0.0 {
                        alpha * v
                    } else {
                        alpha * v + beta * *p
                    };
                }
            };
            let mut j = j0;
            while j < j1 {
                let nr = NR.min(j1 - j);
                let mut i = 0;
                while i < m {
                    let mr = MR.min(m - i);
                    if mr == MR && nr == NR {
                        let t = tile_4x4(
                            std::array::from_fn(|r| arow(i + r, p0, kb)),
                            std::array::from_fn(|s| brow(j + s, p0, kb)),
                            kb,
                        );
                        for (r, row) in t.iter().enumerate() {
                            for (s, &v) in row.iter().enumerate() {
                                put(i + r, j + s, v);
                            }
                        }
                    } else if nr == NR {
                        for r in 0..mr {
                            let bs = std::array::from_fn(|s| brow(j + s, p0, kb));
                            let t = tile_1x4(arow(i + r, p0, kb), bs, kb);
                            for (s, &v) in t.iter().enumerate() {
                                put(i + r, j + s, v);
                            }
                        }
                    } else {
                        for r in 0..mr {
                            for s in 0..nr {
                                let v = tile_1x1(arow(i + r, p0, kb), brow(j + s, p0, kb), kb);
                                put(i + r, j + s, v);
                            }
                        }
                    }
                    i += mr;
                }
                j += nr;
            }
        }
    };
    if parallel(m, n, k, threads) {
        crate::parallel::for_each_index(n.div_ceil(NB), |t| block(t * NB, ((t + 1) * NB).min(n)));
    } else {
        block(0, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{cpu_levels, with_level};

    /// Every SIMD level gives the same bits, close to an f64 loop (tiles, a 1-3 row and column
    /// tail, a lane tail and two K blocks; one thread, where `with_level` applies).
    #[test]
    fn levels_agree_and_match_f64() {
        let (m, n, k) = (66, 11, 1043);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..n * k)
            .map(|i| ((i * 53 % 97) as f32) / 48.0 - 1.0)
            .collect();
        let run = || {
            let mut c = vec![f32::NAN; m * n];
            // SAFETY: A (m x k), B^T (n x k) and C (m x n) are whole, row-major, owned here.
            unsafe {
                gemm_bt(
                    (m, n, k),
                    1.0,
                    MatRef::row_major(&a, 0, k),
                    MatRef::row_major(&b, 0, k).t(),
                    0.0,
                    c.as_mut_ptr(),
                    (n, 1),
                    Threads::Single,
                )
            };
            c
        };
        let levels = cpu_levels();
        let outs: Vec<Vec<f32>> = levels.iter().map(|&l| with_level(l, run)).collect();
        for (i, o) in outs.iter().enumerate() {
            assert_eq!(o, &outs[0], "{:?} differs from {:?}", levels[i], levels[0]);
        }
        for i in 0..m {
            for j in 0..n {
                let row = a[i * k..][..k].iter().zip(&b[j * k..][..k]);
                let want: f64 = row.map(|(x, y)| *x as f64 * *y as f64).sum();
                let got = outs[0][i * n + j] as f64;
                assert!((got - want).abs() < 1e-3, "[{i}, {j}] {got} vs {want}");
            }
        }
    }
}
