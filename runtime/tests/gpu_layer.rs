//! The GPU layer on the real adapter: upload, dispatch, row ranges, pooling, timing, readback.

use std::ops::Range;
use tandem::gpu::{from_gpu_bytes, to_gpu_bytes};
use tandem::testing::{gpu, run_gpu, run_split};
use tandem_ops::shape::grid_1d;
use tandem_ops::{DType, GpuKernel, Op, Result, Tensor, TensorMeta};

/// Copies its input, one row per element: the smallest op that exercises every GPU code path.
#[derive(Debug)]
struct CopyOp;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    start: u32,
    count: u32,
    pad: [u32; 2],
}

impl Op for CopyOp {
    fn name(&self) -> &'static str {
        "TestCopy"
    }
    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        Ok(vec![TensorMeta::new(ins[0].dtype, ins[0].shape.clone())])
    }
    fn split_axis(&self, _: &[&TensorMeta], outs: &[TensorMeta]) -> Option<usize> {
        outs[0].shape.len().checked_sub(1)
    }
    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        outs[0].copy_from(ins[0], rows);
        Ok(())
    }
    fn gpu(
        &self,
        _: &[&TensorMeta],
        _: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let p = Params {
            start: rows.start as u32,
            count: rows.len() as u32,
            pad: [0; 2],
        };
        let wg = grid_1d(rows.len() as u64, 64);
        Ok(vec![GpuKernel::new(
            tandem_shaders::COPY,
            vec![0],
            vec![0],
            &p,
            wg,
        )
        .with_override("WG", 64.0)])
    }
}

#[test]
fn copy_roundtrips_every_gpu_dtype_and_odd_sizes() {
    for n in [0usize, 1, 63, 64, 65, 1000, 70_001] {
        let f = Tensor::f32(&[n], (0..n).map(|i| i as f32 * 0.5 - 3.0).collect());
        assert_eq!(run_gpu(&CopyOp, std::slice::from_ref(&f))[0], f, "n = {n}");
        let i = Tensor::i64(&[n], (0..n as i64).map(|i| i * 7 - 100).collect());
        assert_eq!(run_gpu(&CopyOp, std::slice::from_ref(&i))[0], i, "n = {n}");
    }
    let b = Tensor::new(vec![3], tandem_ops::Data::Bool(vec![true, false, true]));
    assert_eq!(run_gpu(&CopyOp, std::slice::from_ref(&b))[0], b);
}

#[test]
fn a_split_run_joins_cpu_and_gpu_rows() {
    let t = Tensor::f32(&[4, 25], (0..100).map(|i| i as f32).collect());
    for cut in [0, 1, 37, 99, 100] {
        assert_eq!(
            run_split(&CopyOp, std::slice::from_ref(&t), cut)[0],
            t,
            "cut {cut}"
        );
    }
}

#[test]
fn more_than_65535_workgroups_spread_over_two_dimensions() {
    let n = 65536 * 64 + 5;
    let t = Tensor::f32(&[n], (0..n).map(|i| (i % 1013) as f32).collect());
    assert_eq!(grid_1d(n as u64, 64)[1], 2);
    assert_eq!(run_gpu(&CopyOp, std::slice::from_ref(&t))[0], t);
}

#[test]
fn batches_time_each_dispatch_and_buffers_are_reused() {
    let g = gpu();
    let t = Tensor::f32(&[4096], vec![1.5; 4096]);
    let a = g.upload(&t).unwrap();
    let b = g.alloc(DType::F32, 4096).unwrap();
    let k = CopyOp.gpu(&[], &[], 0..4096).unwrap().remove(0);
    let mut batch = g.batch();
    batch.dispatch(&k, &[&a], &[&b], 7).unwrap();
    batch.dispatch(&k, &[&b], &[&a], 8).unwrap();
    let timing = batch.submit().unwrap().wait().unwrap();
    assert!(timing.wall.as_nanos() > 0);
    if g.has_timestamps() {
        let labels: Vec<usize> = timing.per_label.iter().map(|(l, _)| *l).collect();
        assert_eq!(labels, vec![7, 8]);
    }
    assert_eq!(g.download(&[(&a, &[4096])]).unwrap()[0], t);
    let before = g.pooled_bytes();
    drop((a, b));
    let _c = g.alloc(DType::F32, 4096).unwrap();
    assert_eq!(
        g.pooled_bytes(),
        before,
        "a freed buffer of the same size class is reused"
    );
}

/// More dispatches in one batch than one timestamp query set holds (2048 dispatches x 2):
/// every dispatch runs, in order, and gets its time.
#[test]
fn a_batch_of_more_than_2048_dispatches_runs_and_times_each() {
    let g = gpu();
    let t = Tensor::f32(&[64], (0..64).map(|i| i as f32).collect());
    let (a, b) = (g.upload(&t).unwrap(), g.alloc(DType::F32, 64).unwrap());
    let k = CopyOp.gpu(&[], &[], 0..64).unwrap().remove(0);
    let n = 2101; // odd: the result is in b
    let mut batch = g.batch();
    for i in 0..n {
        let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        batch.dispatch(&k, &[from], &[to], i).unwrap();
    }
    let timing = batch.submit().unwrap().wait().unwrap();
    if g.has_timestamps() {
        let labels: Vec<usize> = timing.per_label.iter().map(|(l, _)| *l).collect();
        assert_eq!(labels, (0..n).collect::<Vec<_>>());
        assert!(
            timing.starts.windows(2).all(|w| w[0] <= w[1]),
            "{:?}",
            &timing.starts
        );
    }
    assert_eq!(g.download(&[(&b, &[64])]).unwrap()[0], t);
}

#[test]
fn gpu_bytes_convert_both_ways() {
    let t = Tensor::new(vec![2], tandem_ops::Data::U8(vec![0, 255]));
    assert_eq!(
        from_gpu_bytes(&to_gpu_bytes(&t).unwrap(), DType::U8, &[2]),
        t
    );
    assert!(to_gpu_bytes(&Tensor::new(vec![1], tandem_ops::Data::F64(vec![1.0]))).is_err());
}
