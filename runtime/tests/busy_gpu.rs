//! Re-planning around another session's work on a shared GPU: two users of one `Arc<Gpu>`, a
//! cost model that makes the GPU the better device for the model, and a long batch of the other
//! user's in flight. No timing assertions: the plan's choice and the report's note are checked.

use prost::Message;
use std::sync::Arc;
use tandem::cost::CostModel;
use tandem::gpu::{Gpu, GpuTensor};
use tandem::import::proto::*;
use tandem::report::Ran;
use tandem::{DType, Device, Placement, Session, SessionOptions, Tensor, TensorMeta};
use tandem_ops::{registry, Attrs};

fn vi(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&v| Dimension {
                            dim_value: Some(v),
                            dim_param: None,
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
    }
}

/// y = x [64, 256] @ W [256, 256].
fn matmul_model() -> Vec<u8> {
    let w: Vec<f32> = (0..256 * 256).map(|i| (i % 7) as f32 * 0.01).collect();
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["x".into(), "W".into()],
                output: vec!["y".into()],
                name: "mm".into(),
                op_type: "MatMul".into(),
                ..Default::default()
            }],
            name: "busy".into(),
            initializer: vec![TensorProto {
                dims: vec![256, 256],
                data_type: data_type::FLOAT,
                name: "W".into(),
                raw_data: Some(w.iter().flat_map(|v| v.to_le_bytes()).collect()),
                ..Default::default()
            }],
            input: vec![vi("x", &[64, 256])],
            output: vec![vi("y", &[64, 256])],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// A model in which MatMul runs 1 GFLOP/s on the CPU and 1 TFLOP/s on the GPU.
fn gpu_favoured(gpu: &Gpu) -> CostModel {
    tandem::testing::matmul_believed(gpu, 1, 1e-9, 1e-12)
}

/// The other user's work: a 1024^3 MatMul submitted to `gpu` `repeats` times in one batch
/// (one is seconds on lavapipe, about a millisecond on an H100).
struct Heavy {
    kernels: Vec<tandem_ops::GpuKernel>,
    inputs: Vec<GpuTensor>,
    output: GpuTensor,
    repeats: usize,
}

impl Heavy {
    fn new(gpu: &Gpu) -> Heavy {
        let n = 1024;
        let op = registry::build("MatMul", &Attrs::new(13)).unwrap();
        let ins = [
            Tensor::f32(&[n, n], vec![0.5; n * n]),
            Tensor::f32(&[n, n], vec![0.25; n * n]),
        ];
        let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let outs = op.infer(&refs).unwrap();
        Heavy {
            kernels: op.gpu(&refs, &outs, 0..n).unwrap(),
            inputs: ins.iter().map(|t| gpu.upload(t).unwrap()).collect(),
            output: gpu.alloc(DType::F32, n * n).unwrap(),
            repeats: 1,
        }
    }

    /// Repeat the MatMul so that a batch keeps this adapter busy for at least `secs`, from the
    /// time of one batch of one.
    fn lasting(mut self, gpu: &Gpu, secs: f64) -> Heavy {
        let start = std::time::Instant::now();
        self.submit(gpu).wait().unwrap();
        let one = start.elapsed().as_secs_f64();
        self.repeats = ((secs / one).ceil() as usize).clamp(1, 1000);
        self
    }

    fn submit<'g>(&self, gpu: &'g Gpu) -> tandem::gpu::Submitted<'g> {
        let mut batch = gpu.batch();
        for _ in 0..self.repeats {
            for k in &self.kernels {
                let ins: Vec<&GpuTensor> = k.inputs.iter().map(|&i| &self.inputs[i]).collect();
                batch.dispatch(k, &ins, &[&self.output], 0).unwrap();
            }
        }
        batch.submit().unwrap()
    }
}

fn ran_on(report: &tandem::RunReport) -> Ran {
    report.nodes.iter().find(|n| &*n.name == "mm").unwrap().ran
}

#[test]
fn a_session_plans_around_another_users_batches_on_the_shared_gpu() {
    let gpu = tandem::testing::gpu();
    let session = Session::new(
        matmul_model().as_slice(),
        SessionOptions::default()
            .placement(Placement::Auto)
            .cpu_threads(1)
            .gpu(gpu.clone())
            .cost_model(Arc::new(gpu_favoured(&gpu))),
    )
    .unwrap();
    let x = Tensor::f32(&[64, 256], (0..64 * 256).map(|i| (i % 5) as f32).collect());
    let inputs = [("x", x)];
    // Idle GPU: the model sends the MatMul there.
    let (want, idle) = session.run_with_report(&inputs).unwrap();
    assert_eq!(ran_on(&idle), Ran::On(Device::Gpu), "{idle}");
    assert!(idle.notes.is_empty(), "{idle}");
    // The other user: one long batch run to completion (the GPU learns how long its batches
    // take), then another left in flight.
    let heavy = Heavy::new(&gpu).lasting(&gpu, 0.5);
    heavy.submit(&gpu).wait().unwrap();
    let in_flight = heavy.submit(&gpu);
    assert!(gpu.expected_wait().as_secs_f64() > 0.0);
    let (got, busy) = session.run_with_report(&inputs).unwrap();
    assert_eq!(ran_on(&busy), Ran::On(Device::Cpu), "{busy}");
    assert_eq!(busy.notes.len(), 1, "{busy}");
    assert!(busy.notes[0].contains("busy"), "{}", busy.notes[0]);
    tandem::testing::assert_close(&got[0].1, &want[0].1, 1e-5, 1e-4);
    // Once that work is done, the cached plan (GPU) again.
    in_flight.wait().unwrap();
    let (_, after) = session.run_with_report(&inputs).unwrap();
    assert!(after.notes.is_empty(), "{after}");
    assert_eq!(ran_on(&after), Ran::On(Device::Gpu), "{after}");
}
