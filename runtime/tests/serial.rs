//! Serial mode (`tandem_ops::parallel::serially`, which `Session::run` uses for runs too short
//! to pay for a worker, and which an application may put around a run to keep it on its
//! thread): every CPU kernel family that reaches rayon, run from a thread outside any pool while
//! the global pool's workers are all held, must finish (a job handed to rayon would wait for
//! them forever: the test fails after a minute instead of hanging) and give the same bits as
//! run in parallel.

use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::Duration;
use tandem::testing::{hashed, op, run_cpu};
use tandem_ops::{AttrValue, Data, Op, Tensor};

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

/// (what, op, inputs): one case for each way a kernel family reaches rayon.
fn cases() -> Vec<(&'static str, Box<dyn Op>, Vec<Tensor>)> {
    let window = |name, k: i64, s: i64, p: i64, group: i64| {
        let mut attrs = vec![
            ("kernel_shape", ints(&[k, k])),
            ("strides", ints(&[s, s])),
            ("pads", ints(&[p; 4])),
        ];
        if name == "Conv" {
            attrs.push(("group", AttrValue::Int(group)));
        }
        op(name, 13, &attrs)
    };
    let conv = |k, s, p, group| window("Conv", k, s, p, group);
    let pool = |name, k, s, p| window(name, k, s, p, 1);
    let axis = |name, a: i64| op(name, 13, &[("axis", AttrValue::Int(a))]);
    let plain = |name, opset| op(name, opset, &[]);
    // Inputs of these shapes, each its own values (positive: BatchNormalization's variance).
    let seed = std::cell::Cell::new(0);
    let t = |shapes: &[&[usize]]| -> Vec<Tensor> {
        let tensor = |s: &&[usize]| hashed(s, seed.replace(seed.get() + 1), 0.05, 0.013);
        shapes.iter().map(tensor).collect()
    };
    vec![
        (
            "Conv 3x3 (Winograd)",
            conv(3, 1, 1, 1),
            t(&[&[1, 64, 20, 20], &[64, 64, 3, 3], &[64]]),
        ),
        (
            "Conv 3x3/2 first (taps)",
            conv(3, 2, 1, 1),
            t(&[&[1, 3, 64, 64], &[16, 3, 3, 3]]),
        ),
        (
            "Conv 7x7/2 first (fetching)",
            conv(7, 2, 3, 1),
            t(&[&[1, 3, 64, 64], &[64, 3, 7, 7]]),
        ),
        (
            "Conv 1x1 (pointwise)",
            conv(1, 1, 0, 1),
            t(&[&[1, 128, 28, 28], &[64, 128, 1, 1]]),
        ),
        (
            "Conv 1x1 (gemm crate)",
            conv(1, 1, 0, 1),
            t(&[&[1, 64, 28, 28], &[256, 64, 1, 1]]),
        ),
        (
            "Conv 3x3/2 (im2col)",
            conv(3, 2, 1, 1),
            t(&[&[1, 40, 15, 15], &[48, 40, 3, 3]]),
        ),
        (
            "Conv depthwise (planes)",
            conv(3, 1, 1, 32),
            t(&[&[1, 32, 30, 30], &[32, 1, 3, 3]]),
        ),
        (
            "MaxPool 3x3/2 + Indices",
            pool("MaxPool", 3, 2, 0),
            t(&[&[1, 32, 29, 29]]),
        ),
        (
            "AveragePool 3x3/2",
            pool("AveragePool", 3, 2, 1),
            t(&[&[1, 32, 28, 28]]),
        ),
        (
            "AveragePool 5x5",
            pool("AveragePool", 5, 1, 2),
            t(&[&[1, 8, 17, 19]]),
        ),
        (
            "GlobalAveragePool",
            plain("GlobalAveragePool", 13),
            t(&[&[1, 64, 9, 9]]),
        ),
        ("Softmax", axis("Softmax", -1), t(&[&[2048, 100]])),
        (
            "LogSoftmax strided",
            axis("LogSoftmax", 1),
            t(&[&[64, 50, 70]]),
        ),
        ("Hardmax", axis("Hardmax", 1), t(&[&[64, 50, 70]])),
        (
            "LayerNormalization",
            plain("LayerNormalization", 17),
            t(&[&[64, 96], &[96], &[96]]),
        ),
        (
            "InstanceNormalization",
            plain("InstanceNormalization", 6),
            t(&[&[2, 16, 900], &[16], &[16]]),
        ),
        (
            "BatchNormalization",
            plain("BatchNormalization", 15),
            t(&[&[1, 16, 40, 40], &[16], &[16], &[16], &[16]]),
        ),
        ("MatMul", plain("MatMul", 13), t(&[&[96, 160], &[160, 200]])),
        ("Add", plain("Add", 13), t(&[&[300, 512], &[512]])),
    ]
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u64>> {
    ts.iter()
        .map(|t| match &t.data {
            Data::F32(v) => v.iter().map(|f| f.to_bits() as u64).collect(),
            Data::I64(v) => v.iter().map(|&i| i as u64).collect(),
            _ => panic!("an output neither f32 nor i64"),
        })
        .collect()
}

#[test]
fn kernels_run_serially_on_the_callers_thread_with_the_same_bits() {
    let cases = cases();
    let names: Vec<&str> = cases.iter().map(|c| c.0).collect();
    // In parallel first, while the global pool is free.
    let want: Vec<_> = cases
        .iter()
        .map(|(_, op, ins)| bits(&run_cpu(op.as_ref(), ins)))
        .collect();
    // Hold every worker of the global pool.
    let workers = rayon::current_num_threads();
    let held = Arc::new(Barrier::new(workers + 1));
    let (release, wait) = mpsc::channel::<()>();
    let wait = Arc::new(Mutex::new(wait));
    for _ in 0..workers {
        let (held, wait) = (held.clone(), wait.clone());
        rayon::spawn(move || {
            held.wait();
            let _ = wait.lock().unwrap().recv();
        });
    }
    held.wait();
    // Serially on a plain thread; this one waits for it at most a minute.
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        for (what, op, ins) in &cases {
            let got = tandem_ops::parallel::serially(|| bits(&run_cpu(op.as_ref(), ins)));
            done.send((*what, got)).unwrap();
        }
    });
    for (i, want) in want.iter().enumerate() {
        let (what, got) = finished
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{}: handed work to rayon in serial mode (hung)", names[i]));
        assert_eq!(&got, want, "{what}: serial bits differ from parallel ones");
    }
    for _ in 0..workers {
        release.send(()).unwrap();
    }
}
