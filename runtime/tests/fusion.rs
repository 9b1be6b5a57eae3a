//! Conv fusion (`tandem::fuse`): BatchNormalization folding and activation epilogues.
//!
//! Sits between the fusion pass / the fused Conv kernels and their definitions. Two levels:
//! the fused Conv op alone (every activation, on the CPU, on the GPU (lavapipe) and split
//! across both, over the direct, GEMM and 1x1 paths) against a naive loop written here; and
//! small models built with the importer's protobuf messages, run fused and with
//! `SessionOptions::fuse(false)`, against the same loop, with the graph checked for what was
//! (and what must not be) fused.

use prost::Message;
use tandem::import::proto::*;
use tandem::testing::{assert_close, check_all_placements, gpu};
use tandem::{Placement, Session, SessionOptions, Tensor};
use tandem_ops::conv::{Activation, Conv};
use tandem_ops::{AttrValue, Attrs, Op};

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

/// Conv by its definition in f64, then per-channel `(y - mean) * k + beta` for a BN given as
/// (scale, beta, mean, var, eps), then the activation, all by hand.
fn naive(
    g: &Geo,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    bn: Option<Bn>,
    act: Activation,
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
                    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
                    out.push(match act {
                        Activation::None => acc,
                        Activation::Relu => acc.max(0.0),
                        Activation::LeakyRelu(a) => {
                            if acc < 0.0 {
                                a as f64 * acc
                            } else {
                                acc
                            }
                        }
                        Activation::Clip(lo, hi) => acc.max(lo as f64).min(hi as f64),
                        Activation::Sigmoid => sig(acc),
                        Activation::Silu => acc * sig(acc),
                    } as f32);
                }
            }
        }
    }
    out
}

const ACTIVATIONS: [Activation; 6] = [
    Activation::None,
    Activation::Relu,
    Activation::LeakyRelu(0.125),
    Activation::Clip(-0.5, 1.5),
    Activation::Sigmoid,
    Activation::Silu,
];

/// Geometries reaching each CPU path: GEMM with im2col (3x3, padded, strided), the shared
/// im2col channel split (more channels than pixels), 1x1 read straight from X, the direct
/// depthwise loop, grouped GEMM, and a 1-D convolution.
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
        Geo {
            one_d: true,
            ..g([2, 3, 11, 1], [4, 3, 3, 1], 1, 1, 1)
        },
    ]
}

fn conv_op(g: &Geo, act: Activation) -> Conv {
    let r = if g.one_d { 1 } else { 2 };
    let attrs = Attrs::new(17)
        .with("group", AttrValue::Int(g.group as i64))
        .with("strides", AttrValue::Ints(vec![g.stride as i64; r]))
        .with("pads", AttrValue::Ints(vec![g.pad as i64; 2 * r]));
    let op = tandem_ops::conv::conv(&attrs).unwrap();
    let mut c = op.as_any().unwrap().downcast_ref::<Conv>().unwrap().clone();
    c.activation = act;
    c
}

/// The fused Conv op with each activation, on the CPU, the GPU and split at three rows.
#[test]
fn fused_conv_op_matches_the_definition_on_cpu_gpu_and_split() {
    for (gi, g) in geometries().iter().enumerate() {
        let xn: usize = g.x.iter().product();
        let wn: usize = g.w.iter().product();
        let (x, w, b) = (fill(xn, 1), fill(wn, 2), fill(g.w[0], 3));
        let wdims = if g.one_d {
            g.w[..3].to_vec()
        } else {
            g.w.to_vec()
        };
        let ins = [
            Tensor::f32(&g.dims(g.x), x.clone()),
            Tensor::f32(&wdims, w.clone()),
            Tensor::f32(&[g.w[0]], b.clone()),
        ];
        for act in ACTIVATIONS {
            let want = Tensor::f32(&g.dims(g.out()), naive(g, &x, &w, Some(&b), None, act));
            let op = conv_op(g, act);
            eprintln!("geometry {gi}, {act:?}");
            check_all_placements(&op, &ins, std::slice::from_ref(&want), 1e-4);
            // Without bias too (the epilogue must still run).
            let want = Tensor::f32(&g.dims(g.out()), naive(g, &x, &w, None, None, act));
            check_all_placements(&op, &ins[..2], &[want], 1e-4);
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
    let plain = conv_op(&g, Activation::None);
    let outs = plain.infer(&refs).unwrap();
    let base = plain.work(&refs, &outs).flops;
    let silu = conv_op(&g, Activation::Silu).work(&refs, &outs).flops;
    let outputs: usize = g.out().iter().product();
    assert_eq!(silu, base + 5 * outputs as u64);
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
                let want = Tensor::f32(&g.dims(g.out()), naive(g, &x, &w, Some(&b), bn_ref, act));
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
    let conv = || {
        let c = node("Conv", "conv", &["x", "W", "B"], &["c"]);
        let c = with_attr(c, ints("strides", &[2, 2]));
        with_attr(c, ints("pads", &[1, 1, 1, 1]))
    };
    let weights = || vec![weight("W", &g.w, &wv), weight("B", &[g.w[0]], &bv)];
    let relu = naive(
        &g,
        x.as_f32().unwrap(),
        &wv,
        Some(&bv),
        None,
        Activation::Relu,
    );
    let plain = naive(
        &g,
        x.as_f32().unwrap(),
        &wv,
        Some(&bv),
        None,
        Activation::None,
    );
    let out = g.dims(g.out());

    // The Conv output read by Relu and by Add: no fusion; y2 = c + relu(c).
    let bytes = model(
        vec![
            conv(),
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
        vec![conv(), node("Relu", "r", &["c"], &["y"])],
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
            conv(),
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
            conv(),
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
        Activation::Relu,
    );
    assert_close(&outs[0].1, &Tensor::f32(&out, want), 1e-4, 1e-4);

    // W given at run time: BN cannot fold; the result is still right.
    let mut w = vec![weight("B", &[g.w[0]], &bv)];
    for (n, v) in [("s", &sc), ("beta", &beta), ("mean", &mean), ("var", &var)] {
        w.push(weight(n, &[g.w[0]], v));
    }
    let bytes = model(
        vec![
            conv(),
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
        Activation::None,
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

/// BN, then Mul and Add by per-channel constants (inception_v2's pattern), then Relu: all
/// folded; a Mul by a constant that varies along W stays a node of its own.
#[test]
fn per_channel_mul_and_add_are_folded() {
    let g = geometries()[0];
    let m = g.w[0];
    let x = Tensor::f32(&g.dims(g.x), fill(g.x.iter().product(), 1));
    let (wv, bv) = (fill(g.w.iter().product(), 2), fill(m, 3));
    let [sc, beta, mean, var] = bn_params(m);
    let (mulc, addc) = (fill(m, 9), fill(m, 10));
    let out = g.dims(g.out());
    let [_, _, oh, ow] = g.out();
    let bn = Some((&sc[..], &beta[..], &mean[..], &var[..], 1e-5));
    let base = naive(
        &g,
        x.as_f32().unwrap(),
        &wv,
        Some(&bv),
        bn,
        Activation::None,
    );
    let mut weights = vec![weight("W", &g.w, &wv), weight("B", &[m], &bv)];
    for (n, v) in [("s", &sc), ("beta", &beta), ("mean", &mean), ("var", &var)] {
        weights.push(weight(n, &[m], v));
    }
    weights.push(weight("mulc", &[m, 1, 1], &mulc));
    weights.push(weight("addc", &[1, m, 1, 1], &addc));
    let wide: Vec<f32> = fill(ow, 11);
    weights.push(weight("wide", &[1, 1, 1, ow], &wide));
    let conv = || {
        let c = node("Conv", "conv", &["x", "W", "B"], &["c"]);
        let c = with_attr(c, ints("strides", &[2, 2]));
        with_attr(c, ints("pads", &[1, 1, 1, 1]))
    };
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
            conv(),
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
            conv(),
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
