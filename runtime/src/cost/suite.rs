//! The calibration suite: which operators are measured, with which attributes, at which shapes
//! (taken from the models tandem runs, ascending size), and the pseudo-random inputs.
//!
//! Sits between `tandem_ops::registry` (the operators) and `calibrate.rs`, which measures them.

use tandem_ops::{AttrValue, Attrs, Tensor};

/// One input of a benchmark.
#[derive(Debug, Clone)]
pub(crate) enum Input {
    /// Pseudo-random f32 in [-1, 1).
    Rand(Vec<usize>),
    /// i64 indices in `0..max`.
    Indices(Vec<usize>, i64),
    F32(Vec<usize>, Vec<f32>),
    I64(Vec<usize>, Vec<i64>),
    /// An omitted optional input (empty f32 constant).
    Omitted,
}

/// One op kind with its attributes and shapes (ascending size).
pub(crate) struct Bench {
    pub(crate) op: &'static str,
    pub(crate) attrs: Attrs,
    pub(crate) shapes: Vec<Vec<Input>>,
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

/// Element counts for elementwise and data movement benchmarks, as [rows, 256].
pub(crate) const ELEMS: [usize; 12] = [
    1 << 10,
    1 << 12,
    1 << 13,
    1 << 14,
    1 << 15,
    3 << 14,
    1 << 16,
    1 << 17,
    3 << 16,
    1 << 18,
    1 << 19,
    1 << 20,
];

pub(crate) fn suite() -> Vec<Bench> {
    use Input::*;
    let rows = |n: usize| vec![n / 256, 256];
    let mut v = Vec::new();
    let mm = [
        (16, 16, 16),
        (32, 64, 32),
        (64, 64, 64),
        (128, 64, 96),
        (128, 128, 128),
        (192, 256, 128),
        (256, 256, 256),
        (384, 256, 384),
        (256, 512, 384),
        (1, 768, 768),
        (512, 256, 512),
        (512, 512, 512),
    ];
    v.push(Bench {
        op: "MatMul",
        attrs: Attrs::new(17),
        shapes: mm
            .iter()
            .map(|&(m, k, n)| vec![Rand(vec![m, k]), Rand(vec![k, n])])
            .collect(),
    });
    // Single-row products (decoders, classifier heads) take the `gemv` kernel path.
    let gemv = [
        (64, 64),
        (128, 128),
        (256, 128),
        (256, 256),
        (384, 256),
        (512, 256),
        (512, 512),
        (768, 512),
        (768, 768),
        (1024, 512),
        (1024, 768),
        (1024, 1024),
    ];
    v.push(Bench {
        op: "MatMul",
        attrs: Attrs::new(17),
        shapes: gemv
            .iter()
            .map(|&(k, n)| vec![Rand(vec![1, k]), Rand(vec![k, n])])
            .collect(),
    });
    v.push(Bench {
        op: "Gemm",
        attrs: Attrs::new(13).with("transB", AttrValue::Int(1)),
        shapes: gemv
            .iter()
            .map(|&(k, n)| vec![Rand(vec![1, k]), Rand(vec![n, k]), Rand(vec![n])])
            .collect(),
    });
    // Linear layers on the `gemm` crate (and three single-row classifier heads, `gemv`).
    let gemm = [
        (1, 256, 128),
        (32, 256, 256),
        (48, 384, 256),
        (1, 1024, 512),
        (128, 512, 256),
        (96, 384, 512),
        (128, 512, 512),
        (256, 512, 512),
        (1, 2048, 1000),
        (256, 768, 768),
        (128, 1024, 1024),
        (384, 768, 768),
    ];
    // Linear layers of 2..31 rows that the CPU runs as dot-product tiles (`Gemm/dot`).
    let gemm_dot = [
        (2, 256, 256),
        (4, 512, 256),
        (8, 256, 256),
        (8, 512, 512),
        (16, 512, 512),
        (4, 1024, 1024),
        (12, 768, 768),
        (16, 1024, 1024),
    ];
    // Gemm transB=1 (a weight stored `[N, K]`) with a bias, one bench per kernel path.
    let linear = |shapes: &[(usize, usize, usize)]| Bench {
        op: "Gemm",
        attrs: Attrs::new(13).with("transB", AttrValue::Int(1)),
        shapes: shapes
            .iter()
            .map(|&(m, k, n)| vec![Rand(vec![m, k]), Rand(vec![n, k]), Rand(vec![n])])
            .collect(),
    };
    v.push(linear(&gemm));
    v.push(linear(&gemm_dot));
    // Dense 3x3 (pad 1), depthwise 3x3 and pointwise 1x1 convolutions: each is its own cost
    // entry (`Conv/kxk`, `Conv/winograd`, `Conv/depthwise`, `Conv/1x1`).
    let conv = |c: usize, co: usize, hw: usize, k: usize, group: usize| {
        vec![
            Rand(vec![1, c, hw, hw]),
            Rand(vec![co, c / group, k, k]),
            Rand(vec![co]),
        ]
    };
    let conv_attrs = |k: i64, group: i64| {
        let p = k / 2;
        Attrs::new(13)
            .with("kernel_shape", ints(&[k, k]))
            .with("pads", ints(&[p, p, p, p]))
            .with("group", AttrValue::Int(group))
    };
    // (C, M, H = W). 3x3 stride 1 with C, M >= 64 and >= 100 output pixels is Winograd on
    // the CPU (`Conv/winograd`, its W kept as a session keeps it; the GPU runs both lists
    // through one kernel), fewer channels or pixels im2col + GEMM (`Conv/kxk`).
    let kxk = [
        (8, 16, 16),
        (16, 32, 16),
        (16, 32, 32),
        (32, 64, 16),
        (64, 128, 8),
        (128, 256, 7),
        (32, 64, 32),
        (16, 32, 64),
        (256, 256, 7),
        (32, 64, 64),
        (48, 96, 56),
        (32, 64, 96),
    ];
    let winograd = [
        (64, 64, 20),
        (64, 128, 16),
        (64, 64, 24),
        (64, 64, 28),
        (64, 128, 20),
        (64, 64, 32),
        (96, 96, 24),
        (128, 256, 14),
        (64, 128, 28),
        (128, 128, 20),
        (128, 256, 16),
        (64, 64, 48),
        (128, 128, 28),
        (64, 64, 56),
        (128, 128, 32),
    ];
    for list in [&kxk[..], &winograd[..]] {
        v.push(Bench {
            op: "Conv",
            attrs: conv_attrs(3, 1),
            shapes: list
                .iter()
                .map(|&(c, co, hw)| conv(c, co, hw, 3, 1))
                .collect(),
        });
    }
    // Depthwise uses group = C = 32 and varies only the spatial size.
    v.push(Bench {
        op: "Conv",
        attrs: conv_attrs(3, 32),
        shapes: [8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160]
            .iter()
            .map(|&hw| conv(32, 32, hw, 3, 32))
            .collect(),
    });
    let pointwise = [
        (8, 16),
        (16, 16),
        (16, 32),
        (32, 16),
        (32, 32),
        (16, 64),
        (64, 32),
        (32, 64),
        (128, 16),
        (64, 56),
        (128, 28),
        (96, 64),
    ];
    v.push(Bench {
        op: "Conv",
        attrs: conv_attrs(1, 1),
        shapes: pointwise
            .iter()
            .map(|&(c, hw)| conv(c, 2 * c, hw, 1, 1))
            .collect(),
    });
    for op in ["Relu", "Sigmoid", "Tanh", "Erf"] {
        v.push(Bench {
            op,
            attrs: Attrs::new(13),
            shapes: ELEMS.iter().map(|&n| vec![Rand(rows(n))]).collect(),
        });
    }
    for (op, broadcast) in [("Add", false), ("Mul", true), ("Sub", false), ("Div", true)] {
        v.push(Bench {
            op,
            attrs: Attrs::new(14),
            shapes: ELEMS
                .iter()
                .map(|&n| {
                    let b = if broadcast { vec![256] } else { rows(n) };
                    vec![Rand(rows(n)), Rand(b)]
                })
                .collect(),
        });
    }
    let rc = [
        (16, 64),
        (64, 128),
        (128, 256),
        (256, 256),
        (256, 512),
        (512, 512),
        (1024, 512),
        (2048, 512),
        (1024, 1000),
        (4096, 128),
        (4096, 512),
        (2048, 2048),
    ];
    v.push(Bench {
        op: "Softmax",
        attrs: Attrs::new(13).with("axis", AttrValue::Int(-1)),
        shapes: rc.iter().map(|&(r, c)| vec![Rand(vec![r, c])]).collect(),
    });
    let ln = [
        (16, 128),
        (64, 128),
        (128, 384),
        (256, 384),
        (512, 384),
        (512, 768),
        (1024, 768),
        (2048, 384),
        (128, 768),
        (4096, 384),
        (2048, 768),
        (4096, 768),
    ];
    v.push(Bench {
        op: "LayerNormalization",
        attrs: Attrs::new(17).with("axis", AttrValue::Int(-1)),
        shapes: ln
            .iter()
            .map(|&(r, c)| vec![Rand(vec![r, c]), Rand(vec![c]), Rand(vec![c])])
            .collect(),
    });
    v.push(Bench {
        op: "ReduceMean",
        attrs: Attrs::new(13).with("axes", ints(&[-1])),
        shapes: rc.iter().map(|&(r, c)| vec![Rand(vec![r, c])]).collect(),
    });
    v.push(Bench {
        op: "ReduceSum",
        attrs: Attrs::new(13),
        shapes: rc
            .iter()
            .map(|&(r, c)| vec![Rand(vec![c, r]), I64(vec![1], vec![0])])
            .collect(),
    });
    let pools = [
        (8, 16),
        (16, 32),
        (32, 32),
        (16, 64),
        (32, 64),
        (64, 56),
        (64, 112),
        (32, 160),
        (128, 56),
        (256, 28),
        (64, 224),
        (128, 112),
    ];
    let nchw = |&(c, hw): &(usize, usize)| vec![Rand(vec![1, c, hw, hw])];
    v.push(Bench {
        op: "MaxPool",
        attrs: Attrs::new(12)
            .with("kernel_shape", ints(&[3, 3]))
            .with("strides", ints(&[2, 2]))
            .with("pads", ints(&[1, 1, 1, 1])),
        shapes: pools.iter().map(nchw).collect(),
    });
    v.push(Bench {
        op: "AveragePool",
        attrs: Attrs::new(11)
            .with("kernel_shape", ints(&[2, 2]))
            .with("strides", ints(&[2, 2])),
        shapes: pools.iter().map(nchw).collect(),
    });
    v.push(Bench {
        op: "GlobalAveragePool",
        attrs: Attrs::new(1),
        shapes: pools.iter().map(nchw).collect(),
    });
    v.push(Bench {
        op: "Transpose",
        attrs: Attrs::new(13).with("perm", ints(&[0, 2, 1, 3])),
        shapes: ELEMS
            .iter()
            .map(|&n| vec![Rand(vec![1, n / 512, 8, 64])])
            .collect(),
    });
    v.push(Bench {
        op: "Concat",
        attrs: Attrs::new(13).with("axis", AttrValue::Int(1)),
        shapes: ELEMS
            .iter()
            .map(|&n| vec![Rand(vec![1, 16, n / 512]), Rand(vec![1, 16, n / 512])])
            .collect(),
    });
    v.push(Bench {
        op: "Gather",
        attrs: Attrs::new(13),
        shapes: ELEMS
            .iter()
            .map(|&n| vec![Rand(vec![4096, 64]), Indices(vec![n / 64], 4096)])
            .collect(),
    });
    v.push(Bench {
        op: "Resize",
        attrs: Attrs::new(13).with("mode", AttrValue::String("nearest".into())),
        shapes: ELEMS
            .iter()
            .map(|&n| {
                vec![
                    Rand(vec![1, 16, 8, n / 512]),
                    Omitted,
                    F32(vec![4], vec![1.0, 1.0, 2.0, 2.0]),
                ]
            })
            .collect(),
    });
    v
}

pub(crate) struct Lcg(pub(crate) u64);
impl Lcg {
    pub(crate) fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

pub(crate) fn make(inputs: &[Input], rng: &mut Lcg) -> Vec<Tensor> {
    inputs
        .iter()
        .map(|i| match i {
            Input::Rand(s) => Tensor::f32(s, (0..s.iter().product()).map(|_| rng.next()).collect()),
            Input::Indices(s, max) => Tensor::i64(
                s,
                (0..s.iter().product())
                    .map(|_| ((rng.next() * 0.5 + 0.5) * *max as f32) as i64 % max)
                    .collect(),
            ),
            Input::F32(s, v) => Tensor::f32(s, v.clone()),
            Input::I64(s, v) => Tensor::i64(s, v.clone()),
            Input::Omitted => Tensor::f32(&[0], vec![]),
        })
        .collect()
}

pub(crate) fn describe(inputs: &[Input]) -> String {
    let shapes: Vec<String> = inputs
        .iter()
        .filter_map(|i| match i {
            Input::Rand(s) | Input::Indices(s, _) => Some(format!("{s:?}")),
            _ => None,
        })
        .collect();
    shapes.join(" x ")
}
