//! Non-negative least squares (Lawson-Hanson active set) for the cost model's few features.
//!
//! Sits between the cost model's samples (`cost/mod.rs`, which builds the weighted design
//! matrix) and its fitted coefficients. Small dense problems only (a handful of columns).

/// Solve `min ||A x - b||` subject to `x >= 0`. `a` is row-major with `n` columns; returns `x`
/// (length `n`). Columns may be collinear or zero: the passive-set solves carry a tiny ridge so
/// they never divide by zero, and the result is then one of the minimisers.
pub fn nnls(a: &[f64], b: &[f64], n: usize) -> Vec<f64> {
    let m = b.len();
    assert_eq!(a.len(), m * n, "nnls: A must be {m}x{n}");
    let mut x = vec![0.0; n];
    if m == 0 || n == 0 {
        return x;
    }
    let scale = b.iter().map(|v| v.abs()).fold(0.0, f64::max).max(1e-300);
    let tol = 1e-12 * scale * (m as f64).sqrt();
    let mut passive = vec![false; n];
    for _ in 0..3 * n + 3 {
        let w = gradient(a, b, &x, n);
        let candidate = (0..n)
            .filter(|&j| !passive[j] && w[j] > tol)
            .max_by(|&i, &j| w[i].total_cmp(&w[j]));
        let Some(j) = candidate else { break };
        passive[j] = true;
        for _ in 0..3 * n + 3 {
            let z = solve_passive(a, b, n, &passive);
            let blocking: Vec<usize> = (0..n).filter(|&k| passive[k] && z[k] <= 0.0).collect();
            if blocking.is_empty() {
                x = z;
                break;
            }
            let alpha = blocking
                .iter()
                .map(|&k| x[k] / (x[k] - z[k]))
                .fold(f64::INFINITY, f64::min)
                .clamp(0.0, 1.0);
            for k in 0..n {
                x[k] += alpha * (z[k] - x[k]);
                if passive[k] && x[k] <= 1e-15 * (1.0 + z[k].abs()) {
                    passive[k] = false;
                    x[k] = 0.0;
                }
            }
            // The entering column must stay out if it immediately drops again (degenerate).
            if !passive.iter().any(|&p| p) {
                break;
            }
        }
    }
    x.iter_mut().for_each(|v| *v = v.max(0.0));
    x
}

/// `A^T (b - A x)`: the negative gradient of the squared residual.
fn gradient(a: &[f64], b: &[f64], x: &[f64], n: usize) -> Vec<f64> {
    let mut w = vec![0.0; n];
    for (row, bi) in a.chunks_exact(n).zip(b) {
        let r = bi - row.iter().zip(x).map(|(p, q)| p * q).sum::<f64>();
        for (wj, aj) in w.iter_mut().zip(row) {
            *wj += aj * r;
        }
    }
    w
}

/// Unconstrained least squares over the passive columns (others 0), via the normal equations
/// with a relative ridge of 1e-12 (the columns are pre-scaled by the caller).
fn solve_passive(a: &[f64], b: &[f64], n: usize, passive: &[bool]) -> Vec<f64> {
    let cols: Vec<usize> = (0..n).filter(|&j| passive[j]).collect();
    let k = cols.len();
    let mut g = vec![0.0; k * k];
    let mut r = vec![0.0; k];
    for (row, bi) in a.chunks_exact(n).zip(b) {
        for (p, &cp) in cols.iter().enumerate() {
            r[p] += row[cp] * bi;
            for (q, &cq) in cols.iter().enumerate() {
                g[p * k + q] += row[cp] * row[cq];
            }
        }
    }
    let trace = (0..k).map(|p| g[p * k + p]).sum::<f64>().max(1e-300);
    for p in 0..k {
        g[p * k + p] += 1e-12 * trace;
    }
    let sol = solve_dense(g, r, k);
    let mut z = vec![0.0; n];
    for (p, &c) in cols.iter().enumerate() {
        z[c] = sol[p];
    }
    z
}

/// Gaussian elimination with partial pivoting on a k x k system (k <= a few).
fn solve_dense(mut g: Vec<f64>, mut r: Vec<f64>, k: usize) -> Vec<f64> {
    for c in 0..k {
        let p = (c..k)
            .max_by(|&i, &j| g[i * k + c].abs().total_cmp(&g[j * k + c].abs()))
            .unwrap_or(c);
        if p != c {
            for j in 0..k {
                g.swap(c * k + j, p * k + j);
            }
            r.swap(c, p);
        }
        let d = g[c * k + c];
        if d.abs() < 1e-300 {
            continue;
        }
        for i in c + 1..k {
            let f = g[i * k + c] / d;
            for j in c..k {
                g[i * k + j] -= f * g[c * k + j];
            }
            r[i] -= f * r[c];
        }
    }
    let mut x = vec![0.0; k];
    for c in (0..k).rev() {
        let d = g[c * k + c];
        let s = r[c] - (c + 1..k).map(|j| g[c * k + j] * x[j]).sum::<f64>();
        x[c] = if d.abs() < 1e-300 { 0.0 } else { s / d };
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn residual(a: &[f64], b: &[f64], x: &[f64], n: usize) -> f64 {
        a.chunks_exact(n)
            .zip(b)
            .map(|(row, bi)| {
                let p: f64 = row.iter().zip(x).map(|(u, v)| u * v).sum();
                (p - bi).powi(2)
            })
            .sum()
    }

    /// Best residual over every subset of columns whose unconstrained solution is >= 0.
    fn brute_force(a: &[f64], b: &[f64], n: usize) -> (f64, Vec<f64>) {
        let mut best = (residual(a, b, &vec![0.0; n], n), vec![0.0; n]);
        for mask in 1u32..(1 << n) {
            let passive: Vec<bool> = (0..n).map(|j| mask & (1 << j) != 0).collect();
            let z = solve_passive(a, b, n, &passive);
            if z.iter().all(|&v| v >= 0.0) {
                let r = residual(a, b, &z, n);
                if r < best.0 {
                    best = (r, z);
                }
            }
        }
        best
    }

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        }
    }

    #[test]
    fn matches_brute_force_on_random_problems() {
        let mut rng = Lcg(7);
        for trial in 0..400 {
            let n = 1 + trial % 4;
            let m = n + 1 + trial % 9;
            let a: Vec<f64> = (0..m * n).map(|_| rng.next()).collect();
            let b: Vec<f64> = (0..m).map(|_| rng.next()).collect();
            let x = nnls(&a, &b, n);
            assert!(x.iter().all(|&v| v >= 0.0), "{x:?}");
            let (best, bx) = brute_force(&a, &b, n);
            let got = residual(&a, &b, &x, n);
            assert!(
                got <= best * (1.0 + 1e-7) + 1e-12,
                "trial {trial}: nnls residual {got} > brute force {best} ({x:?} vs {bx:?})"
            );
        }
    }

    #[test]
    fn exact_nonnegative_solution_is_recovered() {
        // b = 2*c0 + 0*c1 + 3*c2 exactly.
        let a = [1.0, 0.5, 1.0, 2.0, 1.0, 1.0, 3.0, 0.2, 1.0, 4.0, 0.9, 1.0];
        let b: Vec<f64> = a.chunks(3).map(|r| 2.0 * r[0] + 3.0 * r[2]).collect();
        let x = nnls(&a, &b, 3);
        assert!((x[0] - 2.0).abs() < 1e-9 && x[1].abs() < 1e-9 && (x[2] - 3.0).abs() < 1e-9);
    }

    #[test]
    fn negative_unconstrained_coefficient_is_clamped_to_zero() {
        // Unconstrained fit of b = 1 - x would give a negative slope; NNLS keeps it at 0 and
        // fits the mean with the constant column.
        let a = [1.0, 1.0, 2.0, 1.0, 3.0, 1.0];
        let b = [0.0, -1.0, -2.0];
        let x = nnls(&a, &b, 2);
        assert_eq!(x, vec![0.0, 0.0]);
        let b2 = [3.0, 2.0, 1.0];
        let x2 = nnls(&a, &b2, 2);
        assert!(x2[0] == 0.0 && (x2[1] - 2.0).abs() < 1e-9, "{x2:?}");
    }

    #[test]
    fn collinear_and_zero_columns_do_not_break_it() {
        let a = [1.0, 2.0, 0.0, 2.0, 4.0, 0.0, 3.0, 6.0, 0.0];
        let b = [5.0, 10.0, 15.0];
        let x = nnls(&a, &b, 3);
        assert!(residual(&a, &b, &x, 3) < 1e-9, "{x:?}");
        assert_eq!(nnls(&[], &[], 2), vec![0.0, 0.0]);
    }
}
