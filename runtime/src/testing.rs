//! Test helpers: run one operator on the CPU, on the GPU, or split by rows across both, and
//! compare tensors with a tolerance.
//!
//! Sits between operator tests (`runtime/tests/gpu_*.rs`, conformance, models) and the executor's
//! building blocks ([`crate::gpu`]). Functions panic with a message on failure: they are for tests.

use crate::cost::{AdapterKey, CostModel, CpuKey, EntryKey, Sample};
use crate::gpu::{Gpu, GpuTensor};
use crate::{DType, Device};
use std::ops::Range;
use std::sync::{Arc, OnceLock};
use tandem_ops::shape::{row_count, row_len};
use tandem_ops::{registry, AttrValue, Attrs, Data, GpuKernel, Op, Tensor, TensorMeta, Work};

/// The GPU shared by all tests of a process. Panics if no adapter exists: in CI a missing
/// adapter is a failure, never a skip.
pub fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        Arc::new(Gpu::new().unwrap_or_else(|e| {
            panic!("no GPU adapter ({e}); install lavapipe: apt-get install mesa-vulkan-drivers libvulkan1")
        }))
    })
    .clone()
}

/// Operator `name` of `opset` with `attrs`, as the registry builds it; panics where it
/// refuses them (a test's own mistake).
pub fn op(name: &str, opset: i64, attrs: &[(&str, AttrValue)]) -> Box<dyn Op> {
    let a = attrs
        .iter()
        .fold(Attrs::new(opset), |a, (k, v)| a.with(k, v.clone()));
    registry::build(name, &a).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A deterministic f32 tensor of `shape`: element `i` is a 12-bit multiplicative hash of `i`
/// and `seed` (0 to 4095) times `step`, plus `low`.
pub fn hashed(shape: &[usize], seed: u32, low: f32, step: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(40503))
                >> 20;
            h as f32 * step + low
        })
        .collect();
    Tensor::f32(shape, v)
}

/// A cost model for `gpu`'s adapter and `threads` CPU threads that believes MatMul takes
/// `cpu_per_flop` seconds a FLOP on the CPU and `gpu_per_flop` on the GPU (and 1 us a call),
/// from four calibration samples on each: a plan made from it puts products where a test
/// wants them, whatever the devices really do.
pub fn matmul_believed(
    gpu: &Gpu,
    threads: usize,
    cpu_per_flop: f64,
    gpu_per_flop: f64,
) -> CostModel {
    let model = CostModel::unmeasured(
        Some(AdapterKey::from_desc(gpu.adapter())),
        CpuKey::detect(threads),
    );
    for (device, per_flop) in [(Device::Cpu, cpu_per_flop), (Device::Gpu, gpu_per_flop)] {
        let samples: Vec<Sample> = [1e6, 4e6, 1.6e7, 6.4e7]
            .iter()
            .map(|&flops| Sample {
                flops,
                bytes: flops / 64.0,
                seconds: flops * per_flop + 1e-6,
                rows: 0.0,
            })
            .collect();
        let key = EntryKey {
            op: "MatMul".into(),
            dtype: DType::F32,
            device,
        };
        model.add_calibration(key, &samples);
    }
    model
}

/// Plan-time metas of `ins`, every input marked constant (so ops can read shape-like inputs).
pub fn const_metas(ins: &[Tensor]) -> Vec<TensorMeta> {
    ins.iter()
        .map(|t| TensorMeta::constant(t.clone()))
        .collect()
}

fn infer(op: &dyn Op, metas: &[TensorMeta]) -> (Vec<TensorMeta>, usize) {
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let outs = op
        .infer(&refs)
        .unwrap_or_else(|e| panic!("{}: infer failed: {e}", op.name()));
    let rows = row_count(&outs[0].shape, op.split_axis(&refs, &outs));
    (outs, rows)
}

/// Rows of `op`'s output 0 for `ins` (1 when it cannot be split).
pub fn row_count_of(op: &dyn Op, ins: &[Tensor]) -> usize {
    infer(op, &const_metas(ins)).1
}

/// The standard check of one op: every output of `want` matches on the CPU and on the GPU, and
/// output 0 matches when split across both at row 1, an odd middle row and the last row. On an
/// adapter that runs shaders on the CPU (lavapipe), kernels with a variant for such adapters
/// ([`GpuKernel::on_cpu_adapter`]) are checked both ways, whole and split: the variant, and the
/// kernel a GPU would run.
pub fn check_all_placements(op: &dyn Op, ins: &[Tensor], want: &[Tensor], tol: f32) {
    let cpu = run_cpu(op, ins);
    let gpu = run_gpu(op, ins);
    for (i, w) in want.iter().enumerate() {
        assert_close(&cpu[i], w, tol, tol);
        assert_close(&gpu[i], w, tol, tol);
    }
    let both_layouts = self::gpu().runs_on_cpu() && has_cpu_adapter_variant(op, ins);
    if both_layouts {
        let as_on_a_gpu = try_run_gpu_kernels(op, ins, None, false)
            .unwrap_or_else(|e| panic!("{}: gpu (GPU layout) failed: {e}", op.name()));
        for (i, w) in want.iter().enumerate() {
            assert_close(&as_on_a_gpu[i], w, tol, tol);
        }
    }
    let rows = row_count_of(op, ins);
    for cut in [1, (rows / 2) | 1, rows.saturating_sub(1)] {
        assert_close(&run_split(op, ins, cut)[0], &want[0], tol, tol);
        if both_layouts {
            assert_close(&split_kernels(op, ins, cut, false)[0], &want[0], tol, tol);
        }
    }
}

/// Output tensors for `op`'s CPU kernel: zeros, or for an op that says it overwrites its
/// outputs ([`Op::overwrites_outputs`]) a poison value (f32 1e30, i64 and i32 -7777) that a
/// row it leaves unwritten carries into the comparison.
pub fn cpu_outputs(op: &dyn Op, metas: &[TensorMeta]) -> Vec<Tensor> {
    metas
        .iter()
        .map(|m| {
            let mut t = Tensor::zeros(m.dtype, &m.shape);
            if op.overwrites_outputs() {
                match &mut t.data {
                    Data::F32(v) => v.fill(1e30),
                    Data::I64(v) => v.fill(-7777),
                    Data::I32(v) => v.fill(-7777),
                    _ => {}
                }
            }
            t
        })
        .collect()
}

/// Run all rows of `op` on the CPU.
pub fn run_cpu(op: &dyn Op, ins: &[Tensor]) -> Vec<Tensor> {
    let metas = const_metas(ins);
    let (outs, rows) = infer(op, &metas);
    let mut out = cpu_outputs(op, &outs);
    let refs: Vec<&Tensor> = ins.iter().collect();
    op.cpu(&refs, &mut out, 0..rows)
        .unwrap_or_else(|e| panic!("{}: cpu failed: {e}", op.name()));
    out
}

/// Whether some kernel of `op` on all rows of `ins` carries a variant for adapters that run
/// shaders on the CPU.
fn has_cpu_adapter_variant(op: &dyn Op, ins: &[Tensor]) -> bool {
    let metas = const_metas(ins);
    let (outs, rows) = infer(op, &metas);
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    op.gpu(&refs, &outs, 0..rows)
        .is_ok_and(|ks| ks.iter().any(|k| !k.on_cpu_adapter.is_empty()))
}

/// Run `rows` of `op` on the GPU and return the whole outputs (rows outside `rows` are zero).
pub fn try_run_gpu_rows(
    op: &dyn Op,
    ins: &[Tensor],
    rows: Option<Range<usize>>,
) -> crate::Result<Vec<Tensor>> {
    try_run_gpu_kernels(op, ins, rows, true)
}

/// [`try_run_gpu_rows`]; with `variants` false, kernels drop their variants for adapters that
/// run shaders on the CPU, so the adapter runs what a GPU would.
fn try_run_gpu_kernels(
    op: &dyn Op,
    ins: &[Tensor],
    rows: Option<Range<usize>>,
    variants: bool,
) -> crate::Result<Vec<Tensor>> {
    let gpu = gpu();
    let metas = const_metas(ins);
    let (outs, all_rows) = infer(op, &metas);
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let mut kernels = op
        .gpu(&refs, &outs, rows.unwrap_or(0..all_rows))
        .map_err(|e| crate::Error::Gpu(format!("{}: {e}", op.name())))?;
    if !variants {
        kernels.iter_mut().for_each(|k| k.on_cpu_adapter.clear());
    }
    // Only inputs some kernel binds go to the GPU (as in the executor).
    let inputs: Vec<GpuTensor> = ins
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if kernels.iter().any(|k| k.inputs.contains(&i)) {
                gpu.upload(t)
            } else {
                gpu.alloc(t.dtype(), 0)
            }
        })
        .collect::<crate::Result<_>>()?;
    let outputs: Vec<GpuTensor> = outs
        .iter()
        .map(|m| gpu.alloc(m.dtype, m.numel()))
        .collect::<crate::Result<_>>()?;
    let mut batch = gpu.batch();
    for o in &outputs {
        batch.clear(o);
    }
    for k in &kernels {
        let i: Vec<&GpuTensor> = k.inputs.iter().map(|&i| &inputs[i]).collect();
        let o: Vec<&GpuTensor> = k.outputs.iter().map(|&o| &outputs[o]).collect();
        batch.dispatch(k, &i, &o, 0)?;
    }
    batch.submit()?.wait()?;
    let want: Vec<(&GpuTensor, &[usize])> = outputs
        .iter()
        .zip(&outs)
        .map(|(g, m)| (g, m.shape.as_slice()))
        .collect();
    gpu.download(&want)
}

/// Run all rows of `op` on the GPU (the real adapter). Panics on any failure.
pub fn run_gpu(op: &dyn Op, ins: &[Tensor]) -> Vec<Tensor> {
    try_run_gpu_rows(op, ins, None).unwrap_or_else(|e| panic!("{}: gpu failed: {e}", op.name()))
}

/// Rows `0..cut` on the CPU and `cut..` on the GPU, joined into one output (ops that cannot be
/// split run whole on the CPU).
pub fn run_split(op: &dyn Op, ins: &[Tensor], cut: usize) -> Vec<Tensor> {
    split_kernels(op, ins, cut, true)
}

/// [`run_split`]; with `variants` false the GPU's rows run the kernels a GPU would
/// ([`try_run_gpu_kernels`]).
fn split_kernels(op: &dyn Op, ins: &[Tensor], cut: usize, variants: bool) -> Vec<Tensor> {
    let metas = const_metas(ins);
    let (outs, rows) = infer(op, &metas);
    let cut = cut.min(rows);
    let mut out = cpu_outputs(op, &outs);
    let refs: Vec<&Tensor> = ins.iter().collect();
    op.cpu(&refs, &mut out, 0..cut)
        .unwrap_or_else(|e| panic!("{}: cpu failed: {e}", op.name()));
    if cut < rows {
        let from_gpu = try_run_gpu_kernels(op, ins, Some(cut..rows), variants)
            .unwrap_or_else(|e| panic!("{}: gpu failed: {e}", op.name()));
        let mrefs: Vec<&TensorMeta> = metas.iter().collect();
        let len = row_len(&outs[0].shape, op.split_axis(&mrefs, &outs));
        out[0].copy_from(&from_gpu[0], cut * len..rows * len);
    }
    out
}

/// Largest violation of `|got - want| <= atol + rtol * |want|`, as (index, got, want), if any.
/// NaN must match NaN, and infinities must match exactly.
pub fn first_mismatch(
    got: &Tensor,
    want: &Tensor,
    rtol: f64,
    atol: f64,
) -> Option<(usize, f64, f64)> {
    let mut worst: Option<(usize, f64, f64, f64)> = None;
    for i in 0..want.numel() {
        let (g, w) = (got.data.get_f64(i), want.data.get_f64(i));
        let bad = if w.is_nan() || g.is_nan() {
            !(w.is_nan() && g.is_nan())
        } else if w.is_infinite() || g.is_infinite() {
            g != w
        } else {
            (g - w).abs() > atol + rtol * w.abs()
        };
        if bad {
            let excess = if (g - w).is_finite() {
                (g - w).abs()
            } else {
                f64::INFINITY
            };
            if worst.is_none_or(|(_, _, _, e)| excess > e) {
                worst = Some((i, g, w, excess));
            }
        }
    }
    worst.map(|(i, g, w, _)| (i, g, w))
}

/// Assert `got` equals `want` in dtype and shape and within `atol + rtol * |want|` elementwise.
pub fn assert_close(got: &Tensor, want: &Tensor, rtol: f32, atol: f32) {
    assert_eq!(got.dtype(), want.dtype(), "dtype differs");
    assert_eq!(got.shape, want.shape, "shape differs");
    if let Some((i, g, w)) = first_mismatch(got, want, rtol as f64, atol as f64) {
        panic!(
            "element {i}: got {g}, want {w} (rtol {rtol}, atol {atol}); shape {:?}",
            want.shape
        );
    }
}

/// Max absolute difference between two same-shaped tensors (NaN-safe: NaN vs NaN counts 0).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (0..a.numel().min(b.numel()))
        .map(|i| {
            let (x, y) = (a.data.get_f64(i), b.data.get_f64(i));
            if x.is_nan() && y.is_nan() || x == y {
                0.0
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f64::max)
}

/// An op computing only the first `.1` outputs of another (e.g. MaxPool without its Indices
/// output, which the GPU kernel does not produce), so the placement helpers compare just those.
#[derive(Debug)]
pub struct FirstOutputs<O>(pub O, pub usize);

impl<O: std::ops::Deref<Target = dyn Op> + std::fmt::Debug + Send + Sync> Op for FirstOutputs<O> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn infer(&self, ins: &[&TensorMeta]) -> tandem_ops::Result<Vec<TensorMeta>> {
        let mut o = self.0.infer(ins)?;
        o.truncate(self.1);
        Ok(o)
    }
    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        self.0.work(ins, outs)
    }
    fn split_axis(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        self.0.split_axis(ins, outs)
    }
    fn cpu(
        &self,
        ins: &[&Tensor],
        outs: &mut [Tensor],
        rows: Range<usize>,
    ) -> tandem_ops::Result<()> {
        self.0.cpu(ins, outs, rows)
    }
    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> tandem_ops::Result<Vec<GpuKernel>> {
        self.0.gpu(ins, outs, rows)
    }
}
