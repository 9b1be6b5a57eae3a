//! A product's rows cut into dispatches of `matmul_window.wgsl` whose A rows fit one uniform
//! window ([`crate::UniformWindow`]): on adapters that run shaders on the CPU a uniform load at
//! an index shared by the lanes is a scalar load and a broadcast, where a storage load is a
//! per-lane loop.
//!
//! Sits between `matmul_kernels` (which builds the storage-buffer kernels and asks for these
//! on Cpu adapters) and the product's geometry ([`MmGeom`]).

use super::{b_rows_fit, u32_of, MatmulParams, MmGeom};
use crate::{GpuKernel, UniformWindow, UNIFORM_WINDOW_BYTES};
use std::ops::Range;

/// Rows an invocation of `matmul_window.wgsl` keeps (its override TM) where a window has as
/// many.
const ROWS_PER_INVOCATION: usize = 8;
/// Columns a workgroup covers (8 invocations of 8: one SIMD batch of lavapipe; 16 left a
/// product of few rows too few workgroups for the cores).
const COLUMNS_PER_WORKGROUP: usize = 64;

/// The dispatches of `matmul_window.wgsl` for logical rows `lr` of `g` (`p` has M, N, K,
/// alpha, beta and the strides), binding op inputs `inputs` as a, b, c; `None` where A's rows
/// are not one contiguous run, B differs between batches, a row does not fit a window, or
/// the windows would be too small to pay for their dispatches.
pub fn window_kernels(
    g: &MmGeom,
    p: &MatmulParams,
    inputs: &[usize],
    lr: Range<usize>,
) -> Option<Vec<GpuKernel>> {
    if !b_rows_fit(g, p) || !rows_are_contiguous(g, p) || g.b_bs.iter().any(|&s| s != 0) {
        return None;
    }
    // K not a multiple of 4: A read a float at a time (K_UNALIGNED); the alternative there is
    // `matmul.wgsl`, all storage loads (magika's 2048 x 257 x 64 in 40-50 ms), so smaller
    // windows pay
    let unaligned = !g.k.is_multiple_of(4);
    let b_texture = crate::gpu_kernel::texture_fits(g.k * p.b_rs as usize);
    // fewer rows than an invocation keeps (decode's one): with B from storage
    // matmul_vec4.wgsl, 1.1x faster there; from a texture this kernel, decode's MatMuls in
    // 0.4x the GPU time (docs/bench.md, "Textures for the operands lanes gather")
    if g.k == 0 || (lr.len() < ROWS_PER_INVOCATION && !b_texture) {
        return None;
    }
    let most = UNIFORM_WINDOW_BYTES / 4 / g.k;
    let rows_per_window = match most {
        0 => return None,
        _ if most >= ROWS_PER_INVOCATION => most / ROWS_PER_INVOCATION * ROWS_PER_INVOCATION,
        _ => most,
    };
    let windows = lr.len().div_ceil(rows_per_window);
    // a dispatch costs about 50 us on lavapipe: several windows only where each has >= 2^20 FMAs
    // (2^18 against `matmul.wgsl`)
    let least = if unaligned { 1 << 18 } else { 1 << 20 };
    if windows > 1 && rows_per_window * g.n * g.k < least {
        return None;
    }
    // fewer rows an invocation where a window or the product holds fewer (K > 2048, decode)
    let tm = ROWS_PER_INVOCATION.min(rows_per_window).min(lr.len());
    let gx = u32_of(g.n.div_ceil(COLUMNS_PER_WORKGROUP), "N / 64")
        .ok()
        .filter(|&gx| gx <= 65535)?;
    (lr.clone().step_by(rows_per_window))
        .map(|r0| {
            let r1 = (r0 + rows_per_window).min(lr.end);
            let mut q = *p;
            q.row_start = u32_of(r0, "row").ok()?;
            q.row_end = u32_of(r1, "row").ok()?;
            let gy = (r1 - r0).div_ceil(tm) as u32;
            let window = UniformWindow {
                binding: 0,
                first: r0 * g.k,
                len: (r1 - r0) * g.k,
            };
            let shader = match b_texture {
                true => tandem_shaders::MATMUL_WINDOW_TEXTURE,
                false => tandem_shaders::MATMUL_WINDOW,
            };
            let kernel = GpuKernel::new(shader, inputs.to_vec(), vec![0], &q, [gx, gy, 1])
                .with_override("TM", tm as f64)
                .with_override("K_UNALIGNED", f64::from(u8::from(unaligned)))
                .with_override("HAS_C", has_c(&q))
                .with_override("C_ROW", f64::from(u8::from(q.c_rs == 0)))
                .with_uniform_window(window);
            Some(match b_texture {
                true => kernel.with_texture_inputs(&[1]),
                false => kernel,
            })
        })
        .collect()
}

/// The `HAS_C` override of `matmul_window.wgsl`: 1 where beta * C adds to the product.
fn has_c(p: &MatmulParams) -> f64 {
    f64::from(u8::from(p.beta != 0.0))
}

/// Whether logical row `r` (`b * M + m`) of A starts at element `r * K`: rows contiguous and
/// batches one after another (A broadcast over a batch dim is not).
fn rows_are_contiguous(g: &MmGeom, p: &MatmulParams) -> bool {
    let mut expected = g.m * g.k;
    for d in (0..g.batch.len()).rev() {
        if g.batch[d] != 1 && g.a_bs[d] != expected {
            return false;
        }
        expected *= g.batch[d];
    }
    p.a_cs == 1 && p.a_rs as usize == g.k
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::MatMul;
    use super::*;
    use crate::{DType, Op, TensorMeta};

    /// The window kernel's name: B from a texture unless `TANDEM_GPU_TEXTURES=0`.
    pub(crate) fn window_shader() -> &'static str {
        match crate::gpu_kernel::textures_enabled() {
            true => "matmul_window_texture",
            false => "matmul_window",
        }
    }

    /// A dispatch as (shader, window, rows written, TM).
    type Dispatch = (&'static str, Option<UniformWindow>, Range<u32>, Option<f64>);

    /// The kernels of MatMul `a` x `b` for output rows `rows` on a Cpu adapter.
    fn cpu_adapter_gpu_kernels(a: &[usize], b: &[usize], rows: Range<usize>) -> Vec<GpuKernel> {
        let f = |s: &[usize]| TensorMeta::new(DType::F32, s.to_vec());
        let (a, b) = (f(a), f(b));
        let outs = MatMul::default().infer(&[&a, &b]).unwrap();
        let k = MatMul::default().gpu(&[&a, &b], &outs, rows).unwrap();
        assert_eq!(k.len(), 1);
        k[0].for_adapter(true).to_vec()
    }

    /// The dispatches of MatMul `a` x `b` for output rows `rows` on a Cpu adapter.
    fn cpu_adapter_kernels(a: &[usize], b: &[usize], rows: Range<usize>) -> Vec<Dispatch> {
        (cpu_adapter_gpu_kernels(a, b, rows).iter())
            .map(|k| {
                let p: &MatmulParams = bytemuck::from_bytes(&k.params);
                let rows = p.row_start..p.row_end;
                (
                    k.shader.name,
                    k.uniform_window,
                    rows,
                    k.override_value("TM"),
                )
            })
            .collect()
    }

    #[test]
    fn windows_cover_the_rows_with_as_many_rows_as_fit() {
        // K 1024: 16 rows a window; 74 rows flat over 2 batches of 37, the last window of 10
        let k = cpu_adapter_kernels(&[2, 37, 1024], &[1024, 68], 0..74);
        assert_eq!(k.len(), 5);
        for (i, (shader, window, rows, tm)) in k.iter().enumerate() {
            let r0 = 16 * i as u32;
            assert_eq!(*shader, window_shader());
            assert_eq!(*rows, r0..(r0 + 16).min(74));
            let w = window.unwrap();
            assert_eq!(
                (w.binding, w.first, w.len),
                (0, r0 as usize * 1024, rows.len() * 1024)
            );
            assert_eq!(*tm, Some(8.0));
        }
        // a split's rows: the windows start at its first row
        let k = cpu_adapter_kernels(&[2, 37, 1024], &[1024, 68], 10..30);
        let rows: Vec<_> = k.iter().map(|k| k.2.clone()).collect();
        assert_eq!(rows, [10..26, 26..30]);
        // K 2500: 6 rows fit, 6 an invocation
        let k = cpu_adapter_kernels(&[13, 2500], &[2500, 72], 0..13);
        assert_eq!(k.len(), 3);
        assert!(k
            .iter()
            .all(|k| k.3 == Some(6.0) && k.1.unwrap().len <= 6 * 2500));
        // 8 rows: one window
        let k = cpu_adapter_kernels(&[8, 96], &[96, 136], 0..8);
        assert_eq!((k.len(), k[0].0, k[0].3), (1, window_shader(), Some(8.0)));
        // K 257 (magika's): 63 rows fit, 56 a window; windows of 56 x 64 x 257 FMAs pay
        // against matmul.wgsl
        let k = cpu_adapter_kernels(&[2048, 257], &[257, 64], 0..2048);
        assert_eq!(k.len(), 37);
        assert!(k
            .iter()
            .all(|k| k.0 == window_shader() && k.1.unwrap().len <= 56 * 257));
        assert_eq!(k[36].2, 2016..2048);
    }

    #[test]
    fn k_not_a_multiple_of_4_reads_a_a_float_at_a_time() {
        let unaligned = |a: &[usize], b: &[usize]| {
            cpu_adapter_gpu_kernels(a, b, 0..a[0])[0].override_value("K_UNALIGNED")
        };
        assert_eq!(unaligned(&[9, 6], &[6, 8]), Some(1.0));
        assert_eq!(unaligned(&[9, 8], &[8, 8]), Some(0.0));
    }

    #[test]
    fn no_windows_where_they_do_not_fit_or_pay() {
        let shader = |a: &[usize], b: &[usize], rows| cpu_adapter_kernels(a, b, rows)[0].0;
        // B differs between batches; A broadcast over a batch; K past a window
        assert_eq!(shader(&[2, 3, 9, 8], &[3, 8, 12], 0..54), "matmul_vec4");
        assert_eq!(shader(&[1, 9, 8], &[3, 8, 12], 0..27), "matmul_vec4");
        assert_eq!(shader(&[4, 16400], &[16400, 4], 0..4), "matmul_vec4");
        // 7 windows of 16 x 8 x 1024 FMAs each: too small for a dispatch each, and of 16 x 24
        // x 1024; with K 1023 (the alternative matmul.wgsl) those of 16 x 24 x 1023 pay, those
        // of 16 x 8 x 1023 do not
        assert_eq!(shader(&[100, 1024], &[1024, 8], 0..100), "matmul_vec4");
        assert_eq!(shader(&[100, 1024], &[1024, 24], 0..100), "matmul_vec4");
        assert_eq!(shader(&[100, 1023], &[1023, 24], 0..100), window_shader());
        assert_eq!(shader(&[100, 1023], &[1023, 8], 0..100), "matmul");
        // N not a multiple of 4
        assert_eq!(shader(&[70, 20], &[20, 66], 0..70), "matmul");
        // fewer rows than an invocation keeps: one row (decode), or a split's 7; with B from a
        // texture the window kernel, that many rows an invocation
        let few = match crate::gpu_kernel::textures_enabled() {
            true => window_shader(),
            false => "matmul_vec4",
        };
        assert_eq!(shader(&[1, 96], &[96, 136], 0..1), few);
        assert_eq!(shader(&[70, 20], &[20, 68], 3..10), few);
        if crate::gpu_kernel::textures_enabled() {
            let k = cpu_adapter_kernels(&[1, 96], &[96, 136], 0..1);
            assert_eq!((k.len(), k[0].2.clone(), k[0].3), (1, 0..1, Some(1.0)));
        }
    }
}
