//! Conv fusion (`tandem::fuse`): BatchNormalization folding, activation epilogues and residual
//! Adds.
//!
//! Sits between the fusion pass / the fused Conv kernels and their definitions. Two levels:
//! the fused Conv op alone (every activation, with and without the scalar affine after it, on
//! the CPU, on the GPU (lavapipe) and split across both, over the direct, GEMM, 1x1 and
//! Winograd paths) against a naive loop written here; and small models built with the
//! importer's protobuf messages, run fused and with `SessionOptions::fuse(false)`, against the
//! same loop (or the unfused nodes' formulas), with the graph checked for what was (and what
//! must not be) fused.

use prost::Message;
use tandem::import::proto::*;
use tandem::testing::{assert_close, check_all_placements, gpu, run_cpu};
use tandem::{Placement, Session, SessionOptions, Tensor};
use tandem_ops::conv::{Activation, Conv, Epilogue, Residual};
use tandem_ops::{AttrValue, Attrs, Op};

#[path = "fusion/attention.rs"]
mod attention;
#[path = "fusion/gelu.rs"]
mod gelu;
#[path = "fusion/matmul_bias.rs"]
mod matmul_bias;
#[path = "fusion/repeated.rs"]
mod repeated;
#[path = "fusion/rms_norm.rs"]
mod rms_norm;
#[path = "fusion/rotary.rs"]
mod rotary;
#[path = "fusion/transposes.rs"]
mod transposes;

fn fill(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as u32 * 7 + seed * 13) % 23) as f32 / 5.0 - 2.2)
        .collect()
}

/// Geometry of a test convolution (2-D, or 1-D when `x` has 3 dims; dilation 1).
#[derive(Clone, Copy)]
struct Geo {
    x: [usize; 4],
    w: [usize; 4],
    group: usize,
    stride: usize,
    pad: usize,
    one_d: bool,
}

impl Geo {
    fn out(&self) -> [usize; 4] {
        let o = |i: usize, k: usize| (i + 2 * self.pad - k) / self.stride + 1;
        let ow = if self.one_d {
            1
        } else {
            o(self.x[3], self.w[3])
        };
        [self.x[0], self.w[0], o(self.x[2], self.w[2]), ow]
    }
    fn dims(&self, d: [usize; 4]) -> Vec<usize> {
        if self.one_d {
            d[..3].to_vec()
        } else {
            d.to_vec()
        }
    }
}

/// BatchNormalization parameters: scale, beta, mean, var, epsilon.
type Bn<'a> = (&'a [f32], &'a [f32], &'a [f32], &'a [f32], f64);

/// `ep` by its definition, in f64.
fn epilogue_f64(ep: Epilogue, v: f64) -> f64 {
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let unit = |v: f64| v.clamp(0.0, 1.0);
    let y = match ep.act {
        Activation::None => v,
        Activation::Relu => v.max(0.0),
        Activation::LeakyRelu(a) => {
            if v < 0.0 {
                a as f64 * v
            } else {
                v
            }
        }
        Activation::Clip(lo, hi) => v.max(lo as f64).min(hi as f64),
        Activation::Sigmoid => sig(v),
        Activation::Silu => v * sig(v),
        Activation::HardSigmoid(a, b) => unit(a as f64 * v + b as f64),
        Activation::HardSwish(a, b) => v * unit(a as f64 * v + b as f64),
    };
    ep.post.map_or(y, |(s, t)| y * s as f64 + t as f64)
}

/// Conv by its definition in f64, then per-channel `(y - mean) * k + beta` for a BN given as
/// (scale, beta, mean, var, eps), then the epilogue, all by hand.
fn naive(
    g: &Geo,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    bn: Option<Bn>,
    ep: Epilogue,
) -> Vec<f32> {
    let [n, c, h, wd] = g.x;
    let [m, cg, kh, kw] = g.w;
    let [_, _, oh, ow] = g.out();
    let mg = m / g.group;
    let mut out = Vec::new();
    for ni in 0..n {
        for oc in 0..m {
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[oc] as f64);
                    for ci in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let ih = (y * g.stride + i) as i64 - g.pad as i64;
                                let iw = if g.one_d {
                                    0
                                } else {
                                    (xo * g.stride + j) as i64 - g.pad as i64
                                };
                                if ih < 0 || iw < 0 || ih >= h as i64 || iw >= wd as i64 {
                                    continue;
                                }
                                let xi = ((ni * c + (oc / mg) * cg + ci) * h + ih as usize) * wd
                                    + iw as usize;
                                acc += x[xi] as f64 * w[((oc * cg + ci) * kh + i) * kw + j] as f64;
                            }
                        }
                    }
                    if let Some((s, beta, mean, var, eps)) = bn {
                        let k = s[oc] as f64 / (var[oc] as f64 + eps).sqrt();
                        acc = (acc - mean[oc] as f64) * k + beta[oc] as f64;
                    }
                    out.push(epilogue_f64(ep, acc) as f32);
                }
            }
        }
    }
    out
}

const ACTIVATIONS: [Activation; 8] = [
    Activation::None,
    Activation::Relu,
    Activation::LeakyRelu(0.125),
    Activation::Clip(-0.5, 1.5),
    Activation::Sigmoid,
    Activation::Silu,
    Activation::HardSigmoid(0.2, 0.5),
    Activation::HardSwish(1.0 / 6.0, 0.5),
];

/// A scalar affine after the activation, as the fusion pass absorbs it.
const POST: (f32, f32) = (-0.75, 0.375);

/// Geometries reaching each CPU path: GEMM with im2col (3x3, padded, strided), the shared
/// im2col channel split (more channels than pixels), 1x1 read straight from X, the direct
/// depthwise loop, grouped GEMM, and a 1-D convolution; then the vec4 kernels of adapters that
/// run shaders on the CPU: an aligned 1x1 (`conv_pointwise.wgsl`), a 1x1 of stride 2
/// (`conv_pointwise_x_pixels.wgsl`), rows of 12 and 8 floats at
/// strides 1 and 2 (`conv_rows.wgsl`, blocks of 8 pixels and short ones) and a 1-D conv it
/// runs as a row of 16.
fn geometries() -> Vec<Geo> {
    let g = |x, w, group, stride, pad| Geo {
        x,
        w,
        group,
        stride,
        pad,
        one_d: false,
    };
    vec![
        g([2, 3, 9, 7], [5, 3, 3, 3], 1, 2, 1),
        g([1, 8, 3, 3], [24, 8, 3, 3], 1, 1, 1),
        g([1, 6, 5, 6], [7, 6, 1, 1], 1, 1, 0),
        g([1, 4, 6, 5], [4, 1, 3, 3], 4, 1, 1),
        g([1, 4, 5, 5], [6, 2, 3, 3], 2, 1, 0),
        g([1, 8, 4, 6], [12, 8, 1, 1], 1, 1, 0),
        g([1, 8, 9, 7], [10, 8, 1, 1], 1, 2, 0),
        g([1, 5, 6, 12], [10, 5, 3, 3], 1, 1, 1),
        g([2, 3, 9, 8], [5, 3, 3, 3], 1, 2, 1),
        Geo {
            one_d: true,
            ..g([2, 3, 11, 1], [4, 3, 3, 1], 1, 1, 1)
        },
        Geo {
            one_d: true,
            ..g([1, 4, 16, 1], [6, 4, 5, 1], 1, 1, 2)
        },
    ]
}

/// [`geometries`] and one the CPU computes by Winograd (3x3, stride 1, 64 channels).
fn geometries_and_winograd() -> Vec<Geo> {
    let mut geos = geometries();
    geos.push(Geo {
        x: [1, 64, 20, 21],
        w: [64, 64, 3, 3],
        group: 1,
        stride: 1,
        pad: 1,
        one_d: false,
    });
    geos
}

/// X, W and B of geometry `g` (W of rank 3 for a 1-D one), as data and as the op's inputs.
fn op_inputs(g: &Geo) -> ([Vec<f32>; 3], Vec<Tensor>) {
    let (xn, wn): (usize, usize) = (g.x.iter().product(), g.w.iter().product());
    let (x, w, b) = (fill(xn, 1), fill(wn, 2), fill(g.w[0], 3));
    let wdims = if g.one_d { &g.w[..3] } else { &g.w[..] };
    let ins = vec![
        Tensor::f32(&g.dims(g.x), x.clone()),
        Tensor::f32(wdims, w.clone()),
        Tensor::f32(&[g.w[0]], b.clone()),
    ];
    ([x, w, b], ins)
}

fn conv_op(g: &Geo, ep: Epilogue) -> Conv {
    let r = if g.one_d { 1 } else { 2 };
    let attrs = Attrs::new(17)
        .with("group", AttrValue::Int(g.group as i64))
        .with("strides", AttrValue::Ints(vec![g.stride as i64; r]))
        .with("pads", AttrValue::Ints(vec![g.pad as i64; 2 * r]));
    let op = tandem_ops::conv::conv(&attrs).unwrap();
    let mut c = op.as_any().unwrap().downcast_ref::<Conv>().unwrap().clone();
    (c.activation, c.post, c.residual) = (ep.act, ep.post, ep.residual);
    c
}

// GPU checks of the fused epilogue. Every Conv kernel ends in `finish4` of `conv_common.wgsl`
// (bias, residual, activation, affine, each chosen by an override constant), so a geometry,
// which picks the kernel and how it indexes channels, pixels and Z, needs each part of the
// epilogue on the GPU once, not every activation with every part: each GPU check compiles new
// lavapipe pipelines, about 1.2 s a check with an empty Mesa shader cache (a fresh CI machine),
// and the full products took 107 s (fused Conv) and 77 s (residual) of the tests' time there.

/// A residual fused into the Conv (its fourth input Z), before the activation and after the
/// activation and affine, with the activations ResNet and YOLO put around it, over every CPU
/// path (and the Winograd one, which adds Z in a pass after its blocks): against the unfused
/// formulas, `ep(conv + b + z)` and `ep(conv + b) + z`. Every combination on the CPU; on the
/// GPU and split each geometry takes two of the six, both residual modes with two of the three
/// activations, in turn over the geometries (GPU checks: the note above).
#[test]
fn conv_with_a_residual_matches_the_definition_on_cpu_gpu_and_split() {
    let geos = geometries_and_winograd();
    for (gi, g) in geos.iter().enumerate() {
        let ([x, w, b], mut ins) = op_inputs(g);
        let z = fill(g.out().iter().product(), 4);
        ins.push(Tensor::f32(&g.dims(g.out()), z.clone()));
        let raw = naive(g, &x, &w, Some(&b), None, Epilogue::default());
        for (ai, (act, post)) in [
            (Activation::Relu, None),
            (Activation::Silu, None),
            (Activation::None, Some(POST)),
        ]
        .into_iter()
        .enumerate()
        {
            for (ri, residual) in [Residual::BeforeAct, Residual::AfterAct]
                .into_iter()
                .enumerate()
            {
                let ep = Epilogue {
                    act,
                    post,
                    residual,
                };
                let plain = Epilogue {
                    residual: Residual::None,
                    ..ep
                };
                let want: Vec<f32> = (raw.iter().zip(&z))
                    .map(|(&v, &z)| match residual {
                        Residual::BeforeAct => epilogue_f64(plain, v as f64 + z as f64),
                        _ => epilogue_f64(plain, v as f64) + z as f64,
                    } as f32)
                    .collect();
                eprintln!("geometry {gi}, {ep:?}");
                let want = Tensor::f32(&g.dims(g.out()), want);
                let combo = 2 * ai + ri;
                if combo == gi % 6 || combo == (gi + 3) % 6 {
                    check_all_placements(&conv_op(g, ep), &ins, &[want], 1e-4);
                } else {
                    assert_close(&run_cpu(&conv_op(g, ep), &ins)[0], &want, 1e-4, 1e-4);
                }
            }
        }
        // A residual of another shape is refused with the shapes named, not broadcast.
        let op = conv_op(
            g,
            Epilogue {
                residual: Residual::BeforeAct,
                ..Epilogue::default()
            },
        );
        let metas: Vec<_> = (ins.iter().map(|t| t.meta())).collect();
        let mut short = metas.clone();
        short[3] = tandem::TensorMeta::new(tandem::DType::F32, vec![1, g.w[0], 1, 1]);
        let err = op.infer(&short.iter().collect::<Vec<_>>()).unwrap_err();
        assert!(err.to_string().contains("residual"), "{err}");
        assert!(op.infer(&metas.iter().collect::<Vec<_>>()).is_ok());
    }
}

/// The fused Conv op with each activation, alone and with a scalar affine after it, with and
/// without its bias: every combination on the CPU; on the GPU and split one per geometry, the
/// activations and the four combinations of affine and bias in turn over the geometries (GPU
/// checks: the note above the residual test). The Winograd geometry with HardSwish only.
#[test]
fn fused_conv_op_matches_the_definition_on_cpu_gpu_and_split() {
    let geos = geometries_and_winograd();
    for (gi, g) in geos.iter().enumerate() {
        let ([x, w, b], ins) = op_inputs(g);
        let winograd = gi >= geometries().len();
        let acts: &[Activation] = if winograd {
            &[Activation::HardSwish(1.0 / 6.0, 0.5)]
        } else {
            &ACTIVATIONS
        };
        for (ai, &act) in acts.iter().enumerate() {
            for (ci, (post, bias)) in [
                (None, true),
                (Some(POST), true),
                (None, false),
                (Some(POST), false),
            ]
            .into_iter()
            .enumerate()
            {
                let ep = Epilogue {
                    act,
                    post,
                    ..Epilogue::default()
                };
                let want = naive(g, &x, &w, bias.then_some(&b[..]), None, ep);
                let want = Tensor::f32(&g.dims(g.out()), want);
                let (op, ins) = (conv_op(g, ep), if bias { &ins[..] } else { &ins[..2] });
                eprintln!("geometry {gi}, {ep:?}, bias {bias}");
                if ai == gi % acts.len() && ci == gi % 4 {
                    check_all_placements(&op, ins, std::slice::from_ref(&want), 1e-4);
                } else {
                    assert_close(&run_cpu(&op, ins)[0], &want, 1e-4, 1e-4);
                }
            }
        }
    }
}

/// The fused op's work counts the activation's flops.
#[test]
fn fused_work_counts_the_activation() {
    let g = geometries()[0];
    let metas = [
        tandem::TensorMeta::new(tandem::DType::F32, g.x.to_vec()),
        tandem::TensorMeta::new(tandem::DType::F32, g.w.to_vec()),
    ];
    let refs: Vec<_> = metas.iter().collect();
    let plain = conv_op(&g, Epilogue::default());
    let outs = plain.infer(&refs).unwrap();
    let base = plain.work(&refs, &outs).flops;
    let silu = conv_op(&g, Activation::Silu.into())
        .work(&refs, &outs)
        .flops;
    let outputs: usize = g.out().iter().product();
    assert_eq!(silu, base + 5 * outputs as u64);
    let hard_swish_affine = Epilogue {
        act: Activation::HardSwish(1.0 / 6.0, 0.5),
        post: Some(POST),
        ..Epilogue::default()
    };
    let flops = conv_op(&g, hard_swish_affine).work(&refs, &outs).flops;
    assert_eq!(flops, base + (4 + 2) * outputs as u64);
}

// ---- models: the graph rewrite ----

fn vi(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: data_type::FLOAT,
                shape: None,
            }),
            ..Default::default()
        }),
    }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

fn with_attr(mut n: NodeProto, a: AttributeProto) -> NodeProto {
    n.attribute.push(a);
    n
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// A Transpose node of `perm` (attention blocks' head splits and `K^T`).
fn transpose(name: &str, input: &str, output: &str, perm: &[i64]) -> NodeProto {
    with_attr(
        node("Transpose", name, &[input], &[output]),
        ints("perm", perm),
    )
}

fn float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::FLOAT,
        f: Some(v),
        ..Default::default()
    }
}

fn weight(name: &str, dims: &[usize], v: &[f32]) -> TensorProto {
    TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: data_type::FLOAT,
        name: name.into(),
        raw_data: Some(v.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    }
}

fn model(
    nodes: Vec<NodeProto>,
    weights: Vec<TensorProto>,
    inputs: &[&str],
    outputs: &[&str],
) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node: nodes,
            name: "fusion".into(),
            initializer: weights,
            input: inputs.iter().map(|n| vi(n)).collect(),
            output: outputs.iter().map(|n| vi(n)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// BN parameters for `m` channels: (scale, beta, mean, var), var > 0.
fn bn_params(m: usize) -> [Vec<f32>; 4] {
    [
        fill(m, 5),
        fill(m, 6),
        fill(m, 7),
        fill(m, 8).iter().map(|v| v.abs() + 0.05).collect(),
    ]
}

/// Conv (+ BN) (+ activation) as a model: the activation's nodes, input `x`, output `y`.
fn conv_model(g: &Geo, bias: bool, bn_eps: Option<f32>, act: Activation) -> Vec<u8> {
    let r = if g.one_d { 1 } else { 2 };
    let mut conv = node("Conv", "conv", &["x", "W"], &["c"]);
    if bias {
        conv.input.push("B".into());
    }
    conv = with_attr(conv, ints("strides", &vec![g.stride as i64; r]));
    conv = with_attr(conv, ints("pads", &vec![g.pad as i64; 2 * r]));
    conv.attribute.push(AttributeProto {
        name: "group".into(),
        r#type: attribute_type::INT,
        i: Some(g.group as i64),
        ..Default::default()
    });
    let wdims = if g.one_d {
        g.w[..3].to_vec()
    } else {
        g.w.to_vec()
    };
    let mut weights = vec![
        weight("W", &wdims, &fill(g.w.iter().product(), 2)),
        weight("B", &[g.w[0]], &fill(g.w[0], 3)),
    ];
    let mut nodes = vec![conv];
    let mut cur = "c";
    if let Some(eps) = bn_eps {
        let [s, beta, mean, var] = bn_params(g.w[0]);
        for (n, v) in [("s", s), ("beta", beta), ("mean", mean), ("var", var)] {
            weights.push(weight(n, &[g.w[0]], &v));
        }
        let bn = node(
            "BatchNormalization",
            "bn",
            &["c", "s", "beta", "mean", "var"],
            &["n"],
        );
        nodes.push(with_attr(bn, float("epsilon", eps)));
        cur = "n";
    }
    match act {
        Activation::None => nodes.push(node("Identity", "id", &[cur], &["y"])),
        Activation::Relu => nodes.push(node("Relu", "act", &[cur], &["y"])),
        Activation::Sigmoid => nodes.push(node("Sigmoid", "act", &[cur], &["y"])),
        Activation::LeakyRelu(a) => nodes.push(with_attr(
            node("LeakyRelu", "act", &[cur], &["y"]),
            float("alpha", a),
        )),
        Activation::Clip(lo, hi) => {
            weights.push(weight("lo", &[], &[lo]));
            weights.push(weight("hi", &[], &[hi]));
            nodes.push(node("Clip", "act", &[cur, "lo", "hi"], &["y"]));
        }
        Activation::Silu => {
            nodes.push(node("Sigmoid", "sig", &[cur], &["s_out"]));
            nodes.push(node("Mul", "mul", &["s_out", cur], &["y"]));
        }
        Activation::HardSigmoid(a, b) => nodes.push(with_attr(
            with_attr(
                node("HardSigmoid", "act", &[cur], &["y"]),
                float("alpha", a),
            ),
            float("beta", b),
        )),
        Activation::HardSwish(..) => nodes.push(node("HardSwish", "act", &[cur], &["y"])),
    }
    model(nodes, weights, &["x"], &["y"])
}

fn session(bytes: &[u8], placement: Placement, fuse: bool) -> Session {
    let mut o = SessionOptions::default().placement(placement).fuse(fuse);
    if placement == Placement::Gpu {
        o = o.gpu(gpu());
    }
    Session::new(bytes, o).unwrap()
}

/// Every activation, with and without BN folding, on the CPU and the GPU: fused equals the
/// naive loop and the unfused graph, and the report names what was absorbed.
#[test]
fn fused_models_match_the_definition() {
    let geos = geometries();
    for (gi, g) in [geos[0], geos[3], geos[4], geos[5]].iter().enumerate() {
        let x = fill(g.x.iter().product(), 1);
        let w = fill(g.w.iter().product(), 2);
        let b = fill(g.w[0], 3);
        let [s, beta, mean, var] = bn_params(g.w[0]);
        for bn in [None, Some(1e-3f32)] {
            for act in ACTIVATIONS {
                let bytes = conv_model(g, true, bn, act);
                let bn_ref = bn.map(|e| (&s[..], &beta[..], &mean[..], &var[..], e as f64));
                let want = naive(g, &x, &w, Some(&b), bn_ref, act.into());
                let want = Tensor::f32(&g.dims(g.out()), want);
                let mut label = "Conv".to_string();
                if bn.is_some() {
                    label.push_str("+BatchNormalization");
                }
                label.push_str(match act {
                    Activation::None => "",
                    Activation::Relu => "+Relu",
                    Activation::LeakyRelu(_) => "+LeakyRelu",
                    Activation::Clip(..) => "+Clip",
                    Activation::Sigmoid => "+Sigmoid",
                    Activation::Silu => "+Sigmoid+Mul",
                    Activation::HardSigmoid(..) => "+HardSigmoid",
                    Activation::HardSwish(..) => "+HardSwish",
                });
                for placement in [Placement::Cpu, Placement::Gpu] {
                    eprintln!("geometry {gi}, bn {bn:?}, {act:?}, {placement:?}");
                    for fuse in [true, false] {
                        let sess = session(&bytes, placement, fuse);
                        let xt = Tensor::f32(&g.dims(g.x), x.clone());
                        let (outs, report) = sess.run_with_report(&[("x", xt)]).unwrap();
                        assert_close(&outs[0].1, &want, 1e-4, 1e-4);
                        let got = report.fused.get("conv").cloned();
                        if fuse && label != "Conv" {
                            assert_eq!(got.as_deref(), Some(label.as_str()));
                            assert!(format!("{report}").contains(&label));
                        } else {
                            assert_eq!(got, None);
                        }
                        let convs = sess.graph().nodes.len();
                        let want_nodes = if act == Activation::None { 1 } else { 0 }
                            + if fuse || label == "Conv" {
                                1
                            } else {
                                label.matches('+').count() + 1
                            };
                        assert_eq!(convs, want_nodes, "{label}, fuse {fuse}");
                    }
                }
            }
        }
    }
}

/// Graphs that must not be fused (or only partly), and never panic: the results still match.
#[test]
fn odd_graphs_are_left_alone() {
    let g = geometries()[0];
    let x = Tensor::f32(&g.dims(g.x), fill(g.x.iter().product(), 1));
    let wv = fill(g.w.iter().product(), 2);
    let bv = fill(g.w[0], 3);
    let weights = || vec![weight("W", &g.w, &wv), weight("B", &[g.w[0]], &bv)];
    let relu = naive(
        &g,
        x.as_f32().unwrap(),
        &wv,
        Some(&bv),
        None,
        Activation::Relu.into(),
    );
    let plain = naive(
        &g,
        x.as_f32().unwrap(),
        &wv,
        Some(&bv),
        None,
        Activation::None.into(),
    );
    let out = g.dims(g.out());

    // The Conv output read by Relu and by Add: no fusion; y2 = c + relu(c).
    let bytes = model(
        vec![
            strided_conv(),
            node("Relu", "r", &["c"], &["y"]),
            node("Add", "add", &["c", "y"], &["y2"]),
        ],
        weights(),
        &["x"],
        &["y", "y2"],
    );
    let s = session(&bytes, Placement::Cpu, true);
    assert_eq!(s.graph().nodes.len(), 3);
    let outs = s.run(&[("x", x.clone())]).unwrap();
    assert_close(&outs[0].1, &Tensor::f32(&out, relu.clone()), 1e-4, 1e-4);
    let sum: Vec<f32> = plain.iter().zip(&relu).map(|(a, b)| a + b).collect();
    assert_close(&outs[1].1, &Tensor::f32(&out, sum), 1e-4, 1e-4);

    // The Conv output is a graph output: no fusion.
    let bytes = model(
        vec![strided_conv(), node("Relu", "r", &["c"], &["y"])],
        weights(),
        &["x"],
        &["c", "y"],
    );
    let s = session(&bytes, Placement::Cpu, true);
    assert_eq!(s.graph().nodes.len(), 2);
    let outs = s.run(&[("x", x.clone())]).unwrap();
    assert_close(&outs[0].1, &Tensor::f32(&out, plain.clone()), 1e-4, 1e-4);

    // A Relu read twice: fused into the Conv (its output is the Conv's now), both readers see it.
    let bytes = model(
        vec![
            strided_conv(),
            node("Relu", "r", &["c"], &["y"]),
            node("Add", "add", &["y", "y"], &["y2"]),
        ],
        weights(),
        &["x"],
        &["y2"],
    );
    let s = session(&bytes, Placement::Cpu, true);
    assert_eq!(s.graph().nodes.len(), 2);
    let outs = s.run(&[("x", x.clone())]).unwrap();
    let twice: Vec<f32> = relu.iter().map(|v| 2.0 * v).collect();
    assert_close(&outs[0].1, &Tensor::f32(&out, twice), 1e-4, 1e-4);

    // BN with a scale given at run time: not folded, the Relu after it stays too.
    let [sc, beta, mean, var] = bn_params(g.w[0]);
    let mut w = weights();
    for (n, v) in [("beta", &beta), ("mean", &mean), ("var", &var)] {
        w.push(weight(n, &[g.w[0]], v));
    }
    let bytes = model(
        vec![
            strided_conv(),
            node(
                "BatchNormalization",
                "bn",
                &["c", "s", "beta", "mean", "var"],
                &["n"],
            ),
            node("Relu", "r", &["n"], &["y"]),
        ],
        w,
        &["x", "s"],
        &["y"],
    );
    let s = session(&bytes, Placement::Cpu, true);
    assert_eq!(s.graph().nodes.len(), 3);
    let st = Tensor::f32(&[g.w[0]], sc.clone());
    let outs = s.run(&[("x", x.clone()), ("s", st)]).unwrap();
    let bn = Some((&sc[..], &beta[..], &mean[..], &var[..], 1e-5));
    let want = naive(
        &g,
        x.as_f32().unwrap(),
        &wv,
        Some(&bv),
        bn,
        Activation::Relu.into(),
    );
    assert_close(&outs[0].1, &Tensor::f32(&out, want), 1e-4, 1e-4);

    // W given at run time: BN cannot fold; the result is still right.
    let mut w = vec![weight("B", &[g.w[0]], &bv)];
    for (n, v) in [("s", &sc), ("beta", &beta), ("mean", &mean), ("var", &var)] {
        w.push(weight(n, &[g.w[0]], v));
    }
    let bytes = model(
        vec![
            strided_conv(),
            node(
                "BatchNormalization",
                "bn",
                &["c", "s", "beta", "mean", "var"],
                &["y"],
            ),
        ],
        w,
        &["x", "W"],
        &["y"],
    );
    let s = session(&bytes, Placement::Cpu, true);
    assert_eq!(s.graph().nodes.len(), 2);
    let outs = s
        .run(&[("x", x.clone()), ("W", Tensor::f32(&g.w, wv.clone()))])
        .unwrap();
    let want = naive(
        &g,
        x.as_f32().unwrap(),
        &wv,
        Some(&bv),
        bn,
        Activation::None.into(),
    );
    assert_close(&outs[0].1, &Tensor::f32(&out, want), 1e-4, 1e-4);

    // A 3-D Conv followed by Relu: loading and planning fail (or not) the same way either way.
    let c3 = node("Conv", "conv", &["x", "W"], &["c"]);
    let bytes = model(
        vec![c3, node("Relu", "r", &["c"], &["y"])],
        vec![weight("W", &[2, 1, 1, 1, 1], &[1.0, 2.0])],
        &["x"],
        &["y"],
    );
    let x3 = Tensor::f32(&[1, 1, 2, 2, 2], fill(8, 1));
    let run = |fuse: bool| {
        let o = SessionOptions::default()
            .placement(Placement::Cpu)
            .fuse(fuse);
        Session::new(&bytes[..], o).and_then(|s| s.run(&[("x", x3.clone())]).map(|_| ()))
    };
    assert_eq!(run(true).is_ok(), run(false).is_ok());
}

/// The per-channel affine tests' case: `geometries()[0]` (`m` output channels), its input, Conv
/// W and B, BN (scale, beta, mean, var), Mul and Add constants, and those as model weights
/// `W`, `B`, `s`, `beta`, `mean`, `var`, `mulc` (`[m, 1, 1]`) and `addc` (`[1, m, 1, 1]`).
struct AffineCase {
    g: Geo,
    m: usize,
    x: Tensor,
    wv: Vec<f32>,
    bv: Vec<f32>,
    bn: [Vec<f32>; 4],
    mulc: Vec<f32>,
    addc: Vec<f32>,
    weights: Vec<TensorProto>,
}

fn affine_case() -> AffineCase {
    let g = geometries()[0];
    let m = g.w[0];
    let x = Tensor::f32(&g.dims(g.x), fill(g.x.iter().product(), 1));
    let (wv, bv) = (fill(g.w.iter().product(), 2), fill(m, 3));
    let [sc, beta, mean, var] = bn_params(m);
    let (mulc, addc) = (fill(m, 9), fill(m, 10));
    let mut weights = vec![weight("W", &g.w, &wv), weight("B", &[m], &bv)];
    for (n, v) in [("s", &sc), ("beta", &beta), ("mean", &mean), ("var", &var)] {
        weights.push(weight(n, &[m], v));
    }
    weights.push(weight("mulc", &[m, 1, 1], &mulc));
    weights.push(weight("addc", &[1, m, 1, 1], &addc));
    AffineCase {
        g,
        m,
        x,
        wv,
        bv,
        bn: [sc, beta, mean, var],
        mulc,
        addc,
        weights,
    }
}

/// Conv `x`, `W`, `B` -> `c` with stride 2 and pads 1 (the Conv of the graph-rewrite tests).
fn strided_conv() -> NodeProto {
    let c = node("Conv", "conv", &["x", "W", "B"], &["c"]);
    let c = with_attr(c, ints("strides", &[2, 2]));
    with_attr(c, ints("pads", &[1, 1, 1, 1]))
}

/// BN, then Mul and Add by per-channel constants (inception_v2's pattern), then Relu: all
/// folded; a Mul by a constant that varies along W stays a node of its own.
#[test]
fn per_channel_mul_and_add_are_folded() {
    let AffineCase {
        g,
        m,
        x,
        wv,
        bv,
        bn: [sc, beta, mean, var],
        mulc,
        addc,
        weights,
    } = affine_case();
    let out = g.dims(g.out());
    let [_, _, oh, ow] = g.out();
    let bn = Some((&sc[..], &beta[..], &mean[..], &var[..], 1e-5));
    let base = naive(
        &g,
        x.as_f32().unwrap(),
        &wv,
        Some(&bv),
        bn,
        Activation::None.into(),
    );
    let wide: Vec<f32> = fill(ow, 11);
    let mut weights = weights;
    weights.push(weight("wide", &[1, 1, 1, ow], &wide));
    let bn_node = || {
        node(
            "BatchNormalization",
            "bn",
            &["c", "s", "beta", "mean", "var"],
            &["n"],
        )
    };

    let bytes = model(
        vec![
            strided_conv(),
            bn_node(),
            node("Mul", "mul", &["mulc", "n"], &["p"]),
            node("Add", "add", &["p", "addc"], &["q"]),
            node("Relu", "relu", &["q"], &["y"]),
        ],
        weights.clone(),
        &["x"],
        &["y"],
    );
    let want: Vec<f32> = (base.iter().enumerate())
        .map(|(i, v)| {
            let c = (i / (oh * ow)) % m;
            (v * mulc[c] + addc[c]).max(0.0)
        })
        .collect();
    for placement in [Placement::Cpu, Placement::Gpu] {
        let s = session(&bytes, placement, true);
        assert_eq!(s.graph().nodes.len(), 1);
        let (outs, report) = s.run_with_report(&[("x", x.clone())]).unwrap();
        assert_eq!(
            report.fused.get("conv").map(String::as_str),
            Some("Conv+BatchNormalization+Mul+Add+Relu")
        );
        assert_close(&outs[0].1, &Tensor::f32(&out, want.clone()), 1e-4, 1e-4);
    }

    // A Mul by a constant along W: BN folds, the Mul and the Relu after it stay.
    let bytes = model(
        vec![
            strided_conv(),
            bn_node(),
            node("Mul", "mul", &["n", "wide"], &["p"]),
            node("Relu", "relu", &["p"], &["y"]),
        ],
        weights,
        &["x"],
        &["y"],
    );
    let s = session(&bytes, Placement::Cpu, true);
    assert_eq!(s.graph().nodes.len(), 3);
    let want: Vec<f32> = (base.iter().enumerate())
        .map(|(i, v)| (v * wide[i % ow]).max(0.0))
        .collect();
    let outs = s.run(&[("x", x)]).unwrap();
    assert_close(&outs[0].1, &Tensor::f32(&out, want), 1e-4, 1e-4);
}

/// densenet121's pattern: a BatchNormalization that follows no Conv (here a fused Conv+Relu),
/// then Mul and Add by per-channel constants, then Relu: the Mul and the Add fold into the
/// BN's scale and B and the Relu runs in its pass, on the CPU and the GPU; without the Mul and
/// the Add, the Relu alone. A BN on a graph input of undeclared rank is left alone (a
/// `[m, 1, 1]` constant is per-channel only at rank 4).
#[test]
fn mul_and_add_after_a_lone_batch_norm_fold_into_it() {
    let AffineCase {
        g,
        m,
        x,
        wv,
        bv,
        bn: [sc, beta, mean, var],
        mulc,
        addc,
        weights,
    } = affine_case();
    let out = g.dims(g.out());
    let [_, _, oh, ow] = g.out();
    let relu_conv = naive(
        &g,
        x.as_f32().unwrap(),
        &wv,
        Some(&bv),
        None,
        Activation::Relu.into(),
    );
    // BN, then (with `affine`) Mul and Add, then Relu.
    let tail = |bn_in: &str, affine: bool| {
        let mut nodes = vec![node(
            "BatchNormalization",
            "bn",
            &[bn_in, "s", "beta", "mean", "var"],
            &["n"],
        )];
        if affine {
            nodes.push(node("Mul", "mul", &["mulc", "n"], &["p"]));
            nodes.push(node("Add", "add", &["p", "addc"], &["q"]));
        }
        nodes.push(node(
            "Relu",
            "relu2",
            &[if affine { "q" } else { "n" }],
            &["y"],
        ));
        nodes
    };
    let want = |affine: bool| -> Vec<f32> {
        (relu_conv.iter().enumerate())
            .map(|(i, &v)| {
                let c = (i / (oh * ow)) % m;
                let bn = (v - mean[c]) / (var[c] + 1e-5).sqrt() * sc[c] + beta[c];
                let (k, t) = if affine {
                    (mulc[c], addc[c])
                } else {
                    (1.0, 0.0)
                };
                (bn * k + t).max(0.0)
            })
            .collect()
    };
    for (affine, label) in [
        (true, "BatchNormalization+Mul+Add+Relu"),
        (false, "BatchNormalization+Relu"),
    ] {
        let mut nodes = vec![strided_conv(), node("Relu", "relu1", &["c"], &["r"])];
        nodes.extend(tail("r", affine));
        let bytes = model(nodes, weights.clone(), &["x"], &["y"]);
        for placement in [Placement::Cpu, Placement::Gpu] {
            let s = session(&bytes, placement, true);
            let ops: Vec<&str> = s.graph().nodes.iter().map(|n| n.op_type.as_str()).collect();
            assert_eq!(ops, ["Conv", "BatchNormalization"]);
            let (outs, report) = s.run_with_report(&[("x", x.clone())]).unwrap();
            assert_eq!(report.fused.get("bn").map(String::as_str), Some(label));
            assert_close(&outs[0].1, &Tensor::f32(&out, want(affine)), 1e-4, 1e-4);
        }
    }

    // The same tail on the graph input: its rank is not declared, nothing folds.
    let bytes = model(tail("x", true), weights, &["x"], &["y"]);
    let s = session(&bytes, Placement::Cpu, true);
    assert_eq!(s.graph().nodes.len(), 4);
    let outs = s
        .run(&[("x", Tensor::f32(&out, relu_conv.clone()))])
        .unwrap();
    assert_close(&outs[0].1, &Tensor::f32(&out, want(true)), 1e-4, 1e-4);
}

// ---- HardSwish chains and the affine after them (PP-OCRv3 det, paddle2onnx at opset 12) ----

/// How a test model spells HardSwish after `Conv -> Mul(ws) -> Add(wb)` (value `xx`):
/// `Add(xx, c) -> Clip(lo, hi) -> Mul(xx, .) -> Div(d)` (or Mul by `1/d`), then `Mul(s) ->
/// Add(t)` by scalars; `swap` puts the constant (Add), the Clip output (Mul) or `1/d` first.
#[derive(Debug, Clone, Copy)]
struct Chain {
    c: f32,
    lo: f32,
    hi: f32,
    d: f32,
    div: bool,
    swap: bool,
}

const PADDLE: Chain = Chain {
    c: 3.0,
    lo: 0.0,
    hi: 6.0,
    d: 6.0,
    div: true,
    swap: false,
};

const SCALARS: [(&str, f32); 4] = [("ws", 0.875), ("wb", 0.25), ("s", -1.25), ("t", 0.625)];

/// The chain's model (outputs `y`, then the values named in `also_out`) and its `y`, computed
/// node by node from `plain` (the Conv's output).
fn chain_model(g: &Geo, ch: Chain, also_out: &[&str], plain: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let conv = with_attr(
        with_attr(
            node("Conv", "conv", &["x", "W", "B"], &["c"]),
            ints("strides", &[g.stride as i64; 2]),
        ),
        ints("pads", &[g.pad as i64; 4]),
    );
    let pair = |a: &'static str, b: &'static str| if ch.swap { [b, a] } else { [a, b] };
    let rd = 1.0 / ch.d;
    let mut nodes = vec![
        conv,
        node("Mul", "mul_w", &["ws", "c"], &["c1"]),
        node("Add", "add_b", &["c1", "wb"], &["xx"]),
        node("Add", "add3", &pair("xx", "cc"), &["a"]),
        node("Clip", "clip", &["a", "lo", "hi"], &["cl"]),
        node("Mul", "mul_x", &pair("xx", "cl"), &["m"]),
    ];
    nodes.push(if ch.div {
        node("Div", "div", &["m", "dd"], &["h"])
    } else {
        node("Mul", "div", &pair("m", "rd"), &["h"])
    });
    nodes.push(node("Mul", "mul_s", &["h", "s"], &["p"]));
    nodes.push(node("Add", "add_t", &pair("p", "t"), &["y"]));
    let mut weights = vec![
        weight("W", &g.w, &fill(g.w.iter().product(), 2)),
        weight("B", &[g.w[0]], &fill(g.w[0], 3)),
        weight("cc", &[], &[ch.c]),
        weight("lo", &[], &[ch.lo]),
        weight("hi", &[], &[ch.hi]),
        weight("dd", &[], &[ch.d]),
        weight("rd", &[1], &[rd]),
    ];
    for (n, v) in SCALARS {
        weights.push(weight(n, &[1], &[v]));
    }
    let mut outs = vec!["y"];
    outs.extend(also_out);
    let k = |n: &str| SCALARS.iter().find(|s| s.0 == n).unwrap().1;
    let y = plain
        .iter()
        .map(|&v| {
            let xx = v * k("ws") + k("wb");
            let m = xx * (xx + ch.c).max(ch.lo).min(ch.hi);
            let h = if ch.div { m / ch.d } else { m * rd };
            h * k("s") + k("t")
        })
        .collect();
    (model(nodes, weights, &["x"], &outs), y)
}

/// Runs `bytes` fused on the CPU and the GPU and unfused on the CPU: output `y` matches `want`
/// each time, the fused graph has `nodes` nodes and the Conv the report label `label`. When
/// the Conv absorbed everything, its fused op also runs split across both devices.
fn check_fused(bytes: &[u8], x: &Tensor, want: &Tensor, label: &str, nodes: usize) {
    for (placement, fuse) in [
        (Placement::Cpu, true),
        (Placement::Gpu, true),
        (Placement::Cpu, false),
    ] {
        eprintln!("{label}: {placement:?}, fuse {fuse}");
        let s = session(bytes, placement, fuse);
        let (outs, report) = s.run_with_report(&[("x", x.clone())]).unwrap();
        assert_close(&outs[0].1, want, 1e-4, 1e-4);
        if !fuse {
            continue;
        }
        assert_eq!(report.fused.get("conv").map(String::as_str), Some(label));
        let graph = s.graph();
        assert_eq!(graph.nodes.len(), nodes, "{label}");
        if nodes == 1 {
            let conv = &graph.nodes[0];
            let mut ins = vec![x.clone()];
            for v in conv.inputs[1..].iter().flatten() {
                ins.push(graph.values[*v].constant.as_deref().unwrap().clone());
            }
            check_all_placements(conv.op.as_ref(), &ins, std::slice::from_ref(want), 1e-4);
        }
    }
}

/// PP-OCRv3's block: the Mul and Add before fold into W and B, the chain becomes HardSwish,
/// the Mul and Add after it the epilogue's affine; operands in either order, the Div as a Mul
/// by 1/d, and other constants (c = 2.5, d = 5: HardSwish(0.2, 0.5)).
#[test]
fn hard_swish_chains_fuse_with_the_affine_after_them() {
    let g = geometries()[0];
    let x = Tensor::f32(&g.dims(g.x), fill(g.x.iter().product(), 1));
    let (w, b) = (fill(g.w.iter().product(), 2), fill(g.w[0], 3));
    let plain = naive(
        &g,
        x.as_f32().unwrap(),
        &w,
        Some(&b),
        None,
        Epilogue::default(),
    );
    let chains = [
        PADDLE,
        Chain {
            swap: true,
            ..PADDLE
        },
        Chain {
            div: false,
            ..PADDLE
        },
        Chain {
            div: false,
            swap: true,
            ..PADDLE
        },
        Chain {
            c: 2.5,
            hi: 5.0,
            d: 5.0,
            ..PADDLE
        },
    ];
    for ch in chains {
        eprintln!("{ch:?}");
        let (bytes, y) = chain_model(&g, ch, &[], &plain);
        let want = Tensor::f32(&g.dims(g.out()), y);
        check_fused(&bytes, &x, &want, "Conv+Mul+Add+HardSwish+Mul+Add", 1);
    }
}

/// Look-alikes that are not HardSwish (Clip's lower bound not 0, its upper bound not the
/// divisor) and chains with a value read twice: left as they are, or fused only up to that
/// value; every result still equals the nodes' formulas.
#[test]
fn hard_swish_look_alikes_and_shared_values_are_not_fused() {
    let g = geometries()[0];
    let x = Tensor::f32(&g.dims(g.x), fill(g.x.iter().product(), 1));
    let (w, b) = (fill(g.w.iter().product(), 2), fill(g.w[0], 3));
    let plain = naive(
        &g,
        x.as_f32().unwrap(),
        &w,
        Some(&b),
        None,
        Epilogue::default(),
    );
    let unfused = "Conv+Mul+Add";
    let cases: [(Chain, &[&str], &str, usize); 6] = [
        (Chain { lo: -1.0, ..PADDLE }, &[], unfused, 7),
        (Chain { hi: 5.0, ..PADDLE }, &[], unfused, 7),
        (Chain { d: 5.0, ..PADDLE }, &[], unfused, 7),
        // The Clip's or the Add's output also a graph output: a second reader.
        (PADDLE, &["cl"], unfused, 7),
        (PADDLE, &["a"], unfused, 7),
        // The Mul after HardSwish read twice: the affine stops before the Add.
        (PADDLE, &["p"], "Conv+Mul+Add+HardSwish+Mul", 2),
    ];
    for (ch, also, label, nodes) in cases {
        eprintln!("{ch:?}, also output {also:?}");
        let (bytes, y) = chain_model(&g, ch, also, &plain);
        let want = Tensor::f32(&g.dims(g.out()), y);
        check_fused(&bytes, &x, &want, label, nodes);
    }
}

/// `Mul(x, HardSigmoid(x))` is HardSwish(alpha, beta); a scalar Add after it joins the
/// epilogue, a per-channel Mul after that does not.
#[test]
fn mul_by_hard_sigmoid_fuses_as_hard_swish() {
    let g = geometries()[0];
    let m = g.w[0];
    let x = Tensor::f32(&g.dims(g.x), fill(g.x.iter().product(), 1));
    let (w, b) = (fill(g.w.iter().product(), 2), fill(m, 3));
    let plain = naive(
        &g,
        x.as_f32().unwrap(),
        &w,
        Some(&b),
        None,
        Epilogue::default(),
    );
    let [_, _, oh, ow] = g.out();
    let per_channel = fill(m, 4);
    let conv = with_attr(
        with_attr(
            node("Conv", "conv", &["x", "W", "B"], &["c"]),
            ints("strides", &[2, 2]),
        ),
        ints("pads", &[1, 1, 1, 1]),
    );
    let hs = with_attr(
        with_attr(
            node("HardSigmoid", "hs", &["c"], &["h"]),
            float("alpha", 0.25),
        ),
        float("beta", 0.375),
    );
    let bytes = model(
        vec![
            conv,
            hs,
            node("Mul", "mul", &["h", "c"], &["q"]),
            node("Add", "add", &["t", "q"], &["r"]),
            node("Mul", "mul_c", &["r", "pc"], &["y"]),
        ],
        vec![
            weight("W", &g.w, &w),
            weight("B", &[m], &b),
            weight("t", &[1, 1, 1, 1], &[-0.5]),
            weight("pc", &[1, m, 1, 1], &per_channel),
        ],
        &["x"],
        &["y"],
    );
    let y: Vec<f32> = (plain.iter().enumerate())
        .map(|(i, &v)| {
            let hs = (0.25 * v + 0.375).clamp(0.0, 1.0);
            (hs * v - 0.5) * per_channel[(i / (oh * ow)) % m]
        })
        .collect();
    let want = Tensor::f32(&g.dims(g.out()), y);
    check_fused(&bytes, &x, &want, "Conv+HardSigmoid+Mul+Add", 2);
}

/// A graph input with a declared shape (the residual rule needs the shapes before any input).
fn shaped(name: &str, dims: &[usize]) -> ValueInfoProto {
    let mut v = vi(name);
    let t = v
        .r#type
        .as_mut()
        .and_then(|t| t.tensor_type.as_mut())
        .unwrap();
    t.shape = Some(TensorShapeProto {
        dim: (dims.iter())
            .map(|&d| Dimension {
                dim_value: Some(d as i64),
                dim_param: None,
            })
            .collect(),
    });
    v
}

/// ResNet's `Relu(Add(Conv, s))` and YOLO's `Add(s, Relu(Conv))` (the residual first) fuse into
/// the Conv when the declared shapes say the Add does not broadcast, and run as the unfused
/// graph does on the CPU and the GPU; a residual of unknown shape, one made after the Conv,
/// and one that broadcasts are left to the Add.
#[test]
fn residual_adds_fuse_where_the_shapes_are_known_equal() {
    let g = geometries()[0];
    let out = g.dims(g.out());
    let (xv, wv, bv) = (
        fill(g.x.iter().product(), 1),
        fill(g.w.iter().product(), 2),
        fill(g.w[0], 3),
    );
    let sv = fill(out.iter().product(), 4);
    let conv = naive(&g, &xv, &wv, Some(&bv), None, Epilogue::default());
    let relu = |v: f32| v.max(0.0);
    let before: Vec<f32> = conv.iter().zip(&sv).map(|(c, s)| relu(c + s)).collect();
    let after: Vec<f32> = conv.iter().zip(&sv).map(|(c, s)| s + relu(*c)).collect();
    let feeds = [
        ("x", Tensor::f32(&g.dims(g.x), xv.clone())),
        ("s", Tensor::f32(&out, sv.clone())),
    ];
    let build = |nodes: Vec<NodeProto>, s_shape: Option<&[usize]>| {
        let mut m = ModelProto::decode(&model(nodes, vec![], &[], &["y"])[..]).unwrap();
        let graph = m.graph.as_mut().unwrap();
        graph.initializer = vec![weight("W", &g.w, &wv), weight("B", &[g.w[0]], &bv)];
        graph.input = vec![shaped("x", &g.dims(g.x))];
        graph
            .input
            .push(s_shape.map_or_else(|| vi("s"), |d| shaped("s", d)));
        m.encode_to_vec()
    };
    let add_relu = || {
        vec![
            strided_conv(),
            node("Add", "add", &["c", "s"], &["a"]),
            node("Relu", "r", &["a"], &["y"]),
        ]
    };
    let relu_add = || {
        vec![
            strided_conv(),
            node("Relu", "r", &["c"], &["a"]),
            node("Add", "add", &["s", "a"], &["y"]),
        ]
    };
    // (case, model, expected output, fused label)
    let cases = [
        (
            "before",
            build(add_relu(), Some(&out)),
            &before,
            Some("Conv+Add+Relu"),
        ),
        (
            "after",
            build(relu_add(), Some(&out)),
            &after,
            Some("Conv+Relu+Add"),
        ),
        ("unknown shape", build(add_relu(), None), &before, None),
        (
            "later residual",
            {
                let mut nodes = add_relu();
                nodes[1] = node("Add", "add", &["c", "s2"], &["a"]);
                nodes.insert(1, node("Identity", "late", &["s"], &["s2"]));
                build(nodes, Some(&out))
            },
            &before,
            None,
        ),
    ];
    for (name, bytes, want, label) in cases {
        for placement in [Placement::Cpu, Placement::Gpu] {
            eprintln!("{name}: {placement:?}");
            let s = session(&bytes, placement, true);
            let (outs, report) = s.run_with_report(&feeds).unwrap();
            assert_close(&outs[0].1, &Tensor::f32(&out, want.to_vec()), 1e-4, 1e-4);
            assert_eq!(
                report.fused.get("conv").map(String::as_str),
                label,
                "{name}"
            );
            let nodes = s.graph().nodes.len();
            assert_eq!(
                nodes,
                if label.is_some() {
                    1
                } else {
                    3 + (name == "later residual") as usize
                },
                "{name}"
            );
        }
    }
    // A residual that broadcasts ([1, M, 1, 1]) stays an Add.
    let bytes = build(add_relu(), Some(&[1, g.w[0], 1, 1]));
    let s = session(&bytes, Placement::Cpu, true);
    assert_eq!(s.graph().nodes.len(), 3);
    let z = Tensor::f32(&[1, g.w[0], 1, 1], fill(g.w[0], 5));
    let outs = s.run(&[feeds[0].clone(), ("s", z.clone())]).unwrap();
    let plane: usize = out[2..].iter().product();
    let zb = z.as_f32().unwrap();
    let want: Vec<f32> = (conv.iter().enumerate())
        .map(|(i, c)| relu(c + zb[(i / plane) % g.w[0]]))
        .collect();
    assert_close(&outs[0].1, &Tensor::f32(&out, want), 1e-4, 1e-4);
}

/// A ConvTranspose (two groups of 3 output channels, 2x2 of stride 2) and, after it, an Add of a
/// per-channel constant, a BatchNormalization and a Mul by a scalar (ppocr_det runs the first
/// two after each of its up-convs): the chain folds into W and B, the report says
/// `ConvTranspose+Add+BatchNormalization+Mul`, and the fused model equals the unfused one on
/// the CPU and the GPU.
#[test]
fn conv_transpose_folds_the_affine_chain_after_it() {
    let (c, mg, group) = (4, 3, 2);
    let m = mg * group;
    let mut up = with_attr(
        node("ConvTranspose", "up", &["x", "W", "B"], &["t"]),
        ints("strides", &[2, 2]),
    );
    up.attribute.push(AttributeProto {
        name: "group".into(),
        r#type: attribute_type::INT,
        i: Some(group as i64),
        ..Default::default()
    });
    let bn = node(
        "BatchNormalization",
        "bn",
        &["u", "s", "beta", "mean", "var"],
        &["v"],
    );
    let nodes = vec![
        up,
        node("Add", "add", &["t", "a"], &["u"]),
        with_attr(bn, float("epsilon", 1e-3)),
        node("Mul", "mul", &["v", "k"], &["y"]),
    ];
    let mut weights = vec![
        weight("W", &[c, mg, 2, 2], &fill(c * mg * 4, 2)),
        weight("B", &[m], &fill(m, 3)),
        weight("a", &[1, m, 1, 1], &fill(m, 4)),
        weight("k", &[], &[-1.5]),
    ];
    let [s, beta, mean, var] = bn_params(m);
    for (n, v) in [("s", s), ("beta", beta), ("mean", mean), ("var", var)] {
        weights.push(weight(n, &[m], &v));
    }
    let bytes = model(nodes, weights, &["x"], &["y"]);
    let x = Tensor::f32(&[1, c, 3, 4], fill(c * 12, 1));
    let unfused = session(&bytes, Placement::Cpu, false);
    let (want, _) = unfused.run_with_report(&[("x", x.clone())]).unwrap();
    for placement in [Placement::Cpu, Placement::Gpu] {
        let sess = session(&bytes, placement, true);
        let (outs, report) = sess.run_with_report(&[("x", x.clone())]).unwrap();
        assert_close(&outs[0].1, &want[0].1, 1e-5, 1e-5);
        let label = report.fused.get("up").cloned();
        let want_label = "ConvTranspose+Add+BatchNormalization+Mul";
        assert_eq!(label.as_deref(), Some(want_label), "{placement:?}");
    }
}
