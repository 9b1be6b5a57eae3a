//! Conv (1-D and 2-D): groups (depthwise included), strides, dilations, pads, auto_pad, bias,
//! kernel shape from W. Also the attribute parsing and output-size arithmetic shared with
//! ConvTranspose.
//!
//! Sits between the operator contract ([`crate::Op`]) and the shared CPU GEMM
//! ([`crate::cpu_gemm`]) / the `conv` shader. 1-D convolutions run as 2-D ones with H = L and
//! W = 1, so everything below speaks of (H, W); except that the packed path can take a conv
//! over one column as the same conv over one row ([`Geom2::as_row`], `conv_implicit.rs`).
//!
//! Rows: output axis 2 (the first spatial axis), i.e. one row is one output line `(n, oc, oh)`
//! of OW elements; rows = N * M * OH. That is finer than cutting on channels (a 640x640 conv
//! with 8 output channels still splits at any line), and a row range is still contiguous.
//!
//! CPU paths (`conv_cpu.rs`): `cg == 1` (depthwise and single-input-channel convs) is direct
//! (GEMM with K = kh*kw is wasteful): undilated ones a plane at a time, one long multiply-add
//! per tap over zero-padded phase planes (`conv_planes.rs`, `phase_planes.rs`), dilated ones a loop over output
//! lines; 3x3 stride-1 convs with enough channels and pixels take Winograd (F(4x4, 3x3) on
//! large planes, F(2x2, 3x3) on small ones)
//! (`conv_winograd.rs`); convs of few channels the sum over taps of shifted input lines
//! (`conv_taps.rs`), 1x1s of few output or input channels (AVX-512, from 28x28: up to 256 in)
//! `W @ X` on the input planes in place (`conv_pointwise.rs`, the same kernel), constant-W
//! convs of many output channels the packed path (`conv_packed.rs`, `conv_implicit.rs`);
//! everything else is a GEMM per (image, group) on pixel chunks:
//! `out[oc, p] = W[oc, (c,kh,kw)] x col[(c,kh,kw), p]`, with `col` built by im2col for the
//! chunk (bounded scratch, parallel over chunks), or read straight from X for 1x1 stride-1
//! unpadded convs. A row range becomes at most three rectangles (oc range x pixel range)
//! per group: a partial head channel, whole channels, a partial tail channel.

use crate::matmul::{f32_in, f32_out};
use crate::shape::grid_1d;
use crate::{Attrs, DType, GpuKernel, Op, OpError, Result, Tensor, TensorMeta, Work};
use std::ops::Range;
use tandem_shaders::{
    CONV, CONV_POINTWISE, CONV_POINTWISE_STRIDED, CONV_ROWS, CONV_ROWS_TEXTURE, CONV_ROWS_UNIFORM,
    CONV_ROWS_UNIFORM_TEXTURE, CONV_TILED,
};

#[path = "conv_cpu.rs"]
mod cpu;
pub use cpu::packed::runs_here as packed_paths_run_here;
pub use cpu::{conv_cpu, KeptWeight};
#[path = "conv_weight_windows.rs"]
mod weight_windows;
use weight_windows::{weight_windows, WeightWindow};

/// ONNX `auto_pad`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Attributes shared by Conv and ConvTranspose, as given (lengths checked against the spatial
/// rank once W is known).
#[derive(Debug, Clone, PartialEq)]
pub struct ConvAttrs {
    pub auto_pad: AutoPad,
    pub group: usize,
    pub kernel_shape: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    pub pads: Option<Vec<i64>>,
}

fn positive(op: &str, name: &str, v: Option<Vec<i64>>) -> Result<Option<Vec<usize>>> {
    match v {
        None => Ok(None),
        Some(v) if v.iter().all(|&x| x >= 1) => Ok(Some(v.iter().map(|&x| x as usize).collect())),
        Some(v) => Err(OpError::Invalid(format!(
            "{op}: `{name}` must be >= 1, got {v:?}"
        ))),
    }
}

impl ConvAttrs {
    /// Read and validate the shared attributes of `op` ("Conv" or "ConvTranspose").
    pub fn parse(op: &str, attrs: &Attrs) -> Result<ConvAttrs> {
        let auto_pad = match attrs.string("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "" => AutoPad::NotSet,
            "SAME_UPPER" => AutoPad::SameUpper,
            "SAME_LOWER" => AutoPad::SameLower,
            "VALID" => AutoPad::Valid,
            other => {
                return Err(OpError::Invalid(format!(
                    "{op}: unknown auto_pad `{other}`"
                )))
            }
        };
        let group = attrs.int("group", 1)?;
        if group < 1 {
            return Err(OpError::Invalid(format!(
                "{op}: group must be >= 1, got {group}"
            )));
        }
        let pads = attrs.ints_opt("pads")?;
        if op == "Conv" && pads.as_ref().is_some_and(|p| p.iter().any(|&x| x < 0)) {
            return Err(OpError::Invalid(format!("Conv: negative pads {pads:?}")));
        }
        Ok(ConvAttrs {
            auto_pad,
            group: group as usize,
            kernel_shape: positive(op, "kernel_shape", attrs.ints_opt("kernel_shape")?)?,
            strides: positive(op, "strides", attrs.ints_opt("strides")?)?,
            dilations: positive(op, "dilations", attrs.ints_opt("dilations")?)?,
            pads,
        })
    }

    /// Per spatial axis: (kernel, stride, dilation, pad begin, pad end), checking lengths and
    /// that `kernel_shape` (if given) agrees with W's spatial dims `wk`.
    pub fn per_axis(&self, op: &str, wk: &[usize]) -> Result<Vec<AxisParams>> {
        let r = wk.len();
        let len_ok = |name: &str, l: Option<usize>, want: usize| match l {
            Some(l) if l != want => Err(OpError::Invalid(format!(
                "{op}: `{name}` has {l} values, expected {want} for {r} spatial dims"
            ))),
            _ => Ok(()),
        };
        len_ok(
            "kernel_shape",
            self.kernel_shape.as_ref().map(|v| v.len()),
            r,
        )?;
        len_ok("strides", self.strides.as_ref().map(|v| v.len()), r)?;
        len_ok("dilations", self.dilations.as_ref().map(|v| v.len()), r)?;
        len_ok("pads", self.pads.as_ref().map(|v| v.len()), 2 * r)?;
        if let Some(ks) = &self.kernel_shape {
            if ks.as_slice() != wk {
                return Err(OpError::Invalid(format!(
                    "{op}: kernel_shape {ks:?} differs from W's spatial dims {wk:?}"
                )));
            }
        }
        Ok((0..r)
            .map(|i| {
                (
                    wk[i],
                    self.strides.as_ref().map_or(1, |v| v[i]),
                    self.dilations.as_ref().map_or(1, |v| v[i]),
                    self.pads.as_ref().map_or(0, |v| v[i]),
                    self.pads.as_ref().map_or(0, |v| v[i + r]),
                )
            })
            .collect())
    }
}

/// One spatial axis: (kernel, stride, dilation, pad begin, pad end).
pub type AxisParams = (usize, usize, usize, i64, i64);

/// Output size and begin pad of one spatial axis of a convolution.
pub fn conv_out_len(
    input: usize,
    (k, s, d, pb, pe): AxisParams,
    auto_pad: AutoPad,
) -> Result<(usize, i64)> {
    let dk = ((k - 1) * d + 1) as i64;
    let inp = input as i64;
    let (s_, out, pb) = match auto_pad {
        AutoPad::NotSet => (s as i64, None, pb),
        AutoPad::Valid => (s as i64, None, 0),
        AutoPad::SameUpper | AutoPad::SameLower => {
            let out = (inp + s as i64 - 1) / s as i64;
            let total = ((out - 1) * s as i64 + dk - inp).max(0);
            let b = if auto_pad == AutoPad::SameUpper {
                total / 2
            } else {
                total - total / 2
            };
            (s as i64, Some(out), b)
        }
    };
    if let Some(out) = out {
        return Ok((out as usize, pb));
    }
    let pe = if auto_pad == AutoPad::Valid { 0 } else { pe };
    let span = inp + pb + pe - dk;
    if span < 0 {
        return Err(OpError::Invalid(format!(
            "Conv: dilated kernel {dk} is larger than the padded input {}",
            inp + pb + pe
        )));
    }
    Ok(((span / s_ + 1) as usize, pb))
}

/// A convolution normalised to 2-D (1-D: H = L, W = 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geom2 {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub m: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    pub pt: i64,
    pub pl: i64,
    pub oh: usize,
    pub ow: usize,
    pub group: usize,
    /// Input channels per group.
    pub cg: usize,
    /// Output channels per group.
    pub mg: usize,
}

impl Geom2 {
    /// A conv over one column (a 1-D conv, or a 2-D one of `kw == 1` on `w == 1`) as the same
    /// conv over one row, with `rows` (output lines `(n, m, oh)`) as that geometry's lines:
    /// the same floats in the same order (W's too), for the paths that work along rows. `None`
    /// where the geometry is not one column or `rows` does not cover whole planes.
    pub fn as_row(&self, rows: &Range<usize>) -> Option<(Geom2, Range<usize>)> {
        let column = self.w == 1 && self.kw == 1 && self.ow == 1 && self.pl == 0 && self.oh > 1;
        if !column || !rows.start.is_multiple_of(self.oh) || !rows.end.is_multiple_of(self.oh) {
            return None;
        }
        let g = Geom2 {
            h: 1,
            w: self.h,
            kh: 1,
            kw: self.kh,
            sh: 1,
            sw: self.sh,
            dh: 1,
            dw: self.dh,
            pt: 0,
            pl: self.pt,
            oh: 1,
            ow: self.oh,
            ..*self
        };
        Some((g, rows.start / self.oh..rows.end / self.oh))
    }

    /// The geometry of a 1-D or 2-D convolution (a 1-D one as 2-D, one column wide) from X's
    /// dims `[N, C, H(, W)]`, `m` output channels, each spatial axis's parameters and (output
    /// size, begin pad), and `(group, cg, mg)`.
    pub fn of_axes(
        x: &[usize],
        m: usize,
        (axes, outs): (&[AxisParams], &[(usize, i64)]),
        (group, cg, mg): (usize, usize, usize),
    ) -> Geom2 {
        let (ax_w, (ow, pl), w) = match (axes.get(1), outs.get(1)) {
            (Some(&a), Some(&o)) => (a, o, x[3]),
            _ => ((1, 1, 1, 0, 0), (1, 0), 1),
        };
        Geom2 {
            n: x[0],
            c: x[1],
            h: x[2],
            w,
            m,
            kh: axes[0].0,
            kw: ax_w.0,
            sh: axes[0].1,
            sw: ax_w.1,
            dh: axes[0].2,
            dw: ax_w.2,
            pt: outs[0].1,
            pl,
            oh: outs[0].0,
            ow,
            group,
            cg,
            mg,
        }
    }

    /// Elements per kernel window of one output channel: `cg * kh * kw`.
    pub fn ckk(&self) -> usize {
        self.cg * self.kh * self.kw
    }
}

/// An elementwise function applied to each output element after the bias (an epilogue fused
/// into the Conv by the runtime's graph rewrite, `tandem::fuse`), with the semantics of the
/// unfused ONNX op: NaN stays NaN for Relu, LeakyRelu, Clip, HardSigmoid and HardSwish.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Activation {
    #[default]
    None,
    Relu,
    /// `x < 0 ? alpha * x : x`.
    LeakyRelu(f32),
    /// Clip to `[lo, hi]` (`lo > hi` gives `hi`, as ONNX).
    Clip(f32, f32),
    Sigmoid,
    /// SiLU: `x * sigmoid(x)` (the `Mul(x, Sigmoid(x))` pattern).
    Silu,
    /// `clamp(alpha * x + beta, 0, 1)` (ONNX HardSigmoid), NaN staying NaN.
    HardSigmoid(f32, f32),
    /// `x * clamp(alpha * x + beta, 0, 1)`: ONNX HardSwish is (1/6, 1/2); so is opset < 14
    /// exporters' `Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)` and `Mul(x, HardSigmoid(x))`.
    HardSwish(f32, f32),
}

impl Activation {
    /// The activation code of `conv.wgsl` (its override `ACT`) and its two parameters.
    pub fn gpu_params(self) -> (u32, f32, f32) {
        match self {
            Activation::None => (0, 0.0, 0.0),
            Activation::Relu => (1, 0.0, 0.0),
            Activation::LeakyRelu(a) => (2, a, 0.0),
            Activation::Clip(lo, hi) => (3, lo, hi),
            Activation::Sigmoid => (4, 0.0, 0.0),
            Activation::Silu => (5, 0.0, 0.0),
            Activation::HardSigmoid(a, b) => (6, a, b),
            Activation::HardSwish(a, b) => (7, a, b),
        }
    }

    /// Flops per output element, for [`Op::work`].
    pub fn flops(self) -> u64 {
        match self {
            Activation::None => 0,
            Activation::Relu => 1,
            Activation::LeakyRelu(_) | Activation::Clip(..) => 2,
            Activation::Sigmoid => 4,
            Activation::Silu => 5,
            Activation::HardSigmoid(..) => 3,
            Activation::HardSwish(..) => 4,
        }
    }

    /// Apply to one value.
    #[inline(always)]
    pub fn apply(self, v: f32) -> f32 {
        let sigmoid = |v: f32| 1.0 / (1.0 + crate::unary::exp_f32(-v));
        match self {
            Activation::None => v,
            Activation::Relu => {
                if v < 0.0 {
                    0.0
                } else {
                    v
                }
            }
            Activation::LeakyRelu(a) => {
                if v < 0.0 {
                    a * v
                } else {
                    v
                }
            }
            Activation::Clip(lo, hi) => {
                let y = if v < lo { lo } else { v };
                if y > hi {
                    hi
                } else {
                    y
                }
            }
            Activation::Sigmoid => sigmoid(v),
            Activation::Silu => v * sigmoid(v),
            Activation::HardSigmoid(a, b) => unit_clamp(a * v + b),
            Activation::HardSwish(a, b) => v * unit_clamp(a * v + b),
        }
    }
}

/// `v` clamped to `[0, 1]`, NaN staying NaN (compare-and-select, so it vectorises).
#[inline(always)]
fn unit_clamp(v: f32) -> f32 {
    let y = if v < 0.0 { 0.0 } else { v };
    if y > 1.0 {
        1.0
    } else {
        y
    }
}

/// What a fused Conv applies to each output element after the bias: its activation, then, when
/// `post` is `Some((scale, shift))`, `y * scale + shift` (scalar Mul and Add nodes after the
/// activation that the fusion pass absorbed, such as PP-OCRv3's learnable affine blocks); and,
/// where [`Residual`] says, the element of the Conv's fourth input Z of the same index.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Epilogue {
    pub act: Activation,
    pub post: Option<(f32, f32)>,
    pub residual: Residual,
}

/// Where a fused residual (the other operand of an Add or two-input Sum that read the Conv's
/// output: ResNet's shortcut, YOLOv8's bottleneck) enters the epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Residual {
    /// No residual: the Conv has 2 or 3 inputs.
    #[default]
    None,
    /// `ep(conv + bias + z)`: the Add came before the activation (`Relu(Add(Conv, z))`).
    BeforeAct,
    /// `ep(conv + bias) + z`: the Add came after the activation and affine.
    AfterAct,
}

impl From<Activation> for Epilogue {
    fn from(act: Activation) -> Epilogue {
        Epilogue {
            act,
            ..Epilogue::default()
        }
    }
}

impl Epilogue {
    /// Flops per output element, for [`Op::work`].
    pub fn flops(self) -> u64 {
        self.act.flops()
            + if self.post.is_some() { 2 } else { 0 }
            + u64::from(self.residual != Residual::None)
    }

    /// The part applied to each output block as it is computed when the residual is added in a
    /// pass of its own after it ([`Residual::BeforeAct`]: nothing; else all of it but Z).
    pub fn before_residual(self) -> Epilogue {
        match self.residual {
            Residual::BeforeAct => Epilogue::default(),
            _ => Epilogue {
                residual: Residual::None,
                ..self
            },
        }
    }

    /// The rest, applied by that pass: Z and what follows it.
    pub fn from_residual(self) -> Epilogue {
        match self.residual {
            Residual::BeforeAct => self,
            residual => Epilogue {
                residual,
                ..Epilogue::default()
            },
        }
    }
}

/// One node a fused Conv absorbed: its op type and node name (for reports). A chain of nodes
/// that computes one function is one entry: the function's name (`HardSwish` for `Add -> Clip
/// -> Mul -> Div`) and the node names joined by `,`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Absorbed {
    pub op_type: String,
    pub node: String,
}

/// Conv with its attributes, and what the runtime's fusion pass folded into it: a following
/// BatchNormalization (already folded into W and B, only recorded here), an activation and a
/// scalar affine after it, applied to each output block ([`Conv::epilogue`]), and an Add of a
/// residual: then the Conv has four inputs X, W, B, Z, Z of the output's shape.
#[derive(Debug, Clone)]
pub struct Conv {
    pub attrs: ConvAttrs,
    pub activation: Activation,
    /// `(scale, shift)` applied after the activation ([`Epilogue::post`]).
    pub post: Option<(f32, f32)>,
    /// Where the fourth input Z is added ([`Residual::None`]: there is none).
    pub residual: Residual,
    /// Nodes folded into this one, in graph order (empty for a plain Conv).
    pub absorbed: Vec<Absorbed>,
    /// `Some` when W is a constant of the model ([`Conv::with_constant_weight`], set at load
    /// time): the CPU's Winograd transform of W, or W packed for `conv_packed.rs`, is then
    /// computed once and kept.
    pub constant_weight: Option<ConstantWeight>,
}

/// What the CPU derives from a constant W and keeps (shared by clones of the op): W's
/// Winograd transform (laid out as `winograd::weights_len` says) and W packed for
/// `conv_packed.rs`, each made by the first call whose path uses it. Only for a W that cannot
/// change between runs: a model constant, never a fed input.
#[derive(Clone, Default, Debug)]
pub struct ConstantWeight {
    /// Transformed weights per Winograd variant (`Variant as usize`).
    winograd: [crate::kept::Kept<Vec<f32>>; 2],
    packed: crate::cpu_gemm_packed::KeptPacking,
    /// W in the blocks of output channels the taps and pointwise paths read.
    blocks: crate::kept::Kept<Vec<f32>>,
}

impl ConstantWeight {
    /// The transform of `w` for geometry `g`: computed on the first call (with no lock held, so
    /// racing first calls each compute it and one result is kept), then the kept one.
    fn winograd(&self, g: &Geom2, w: &[f32]) -> &[f32] {
        let v = cpu::winograd::Variant::of(g);
        let len = cpu::winograd::weights_len(v, g, g.m);
        let u = self.winograd[v as usize].get_or_make(|| {
            let mut u = vec![0.0; len];
            cpu::winograd::transform_weights(v, g, w, 0..g.m, &mut u);
            u
        });
        assert_eq!(
            u.len(),
            len,
            "Conv: kept Winograd weights of another geometry"
        );
        u
    }

    /// `w` in the blocks of output channels of `conv_taps.rs`'s kernel (made on the first
    /// call, then kept).
    fn blocks(&self, g: &Geom2, w: &[f32]) -> &[f32] {
        let len = cpu::taps::blocks_len(g);
        let u = self.blocks.get_or_make(|| {
            let mut u = vec![0.0; len];
            let taps = g.kh * g.kw;
            cpu::taps::pack_weights(w, g.c, taps, 0..g.m, &mut u[..len - cpu::taps::MR]);
            u
        });
        assert_eq!(u.len(), len, "Conv: kept weight blocks of another geometry");
        u
    }

    /// `w` packed as the `K x M` B of `conv_packed.rs` (made on the first call, then kept).
    fn packed(&self, g: &Geom2, w: &[f32]) -> &crate::cpu_gemm_packed::PackedB {
        let wt = crate::cpu_gemm::MatRef::row_major(w, 0, g.ckk()).t();
        self.packed.get(wt, g.ckk(), g.m)
    }
}

/// Registry constructor.
pub fn conv(attrs: &Attrs) -> Result<Box<dyn Op>> {
    Ok(Box::new(Conv::plain(attrs)?))
}

impl Conv {
    /// A Conv as the model states it: its attributes, nothing fused, W not known constant.
    pub fn plain(attrs: &Attrs) -> Result<Conv> {
        Ok(Conv {
            attrs: ConvAttrs::parse("Conv", attrs)?,
            activation: Activation::None,
            post: None,
            residual: Residual::None,
            absorbed: Vec::new(),
            constant_weight: None,
        })
    }

    /// This Conv, told that its W is a constant of the model (the runtime's load-time
    /// `layout` pass): the CPU then keeps W's Winograd transform instead of redoing it on
    /// every call.
    pub fn with_constant_weight(&self) -> Conv {
        Conv {
            constant_weight: Some(ConstantWeight::default()),
            ..self.clone()
        }
    }

    /// Whether the CPU kernel computes geometry `g` of this Conv by Winograd (it keeps W's
    /// transform where W is a constant, which pays on smaller planes): the cost model
    /// (`tandem::costs::kernel_variant`) gives these their own entry.
    pub fn cpu_takes_winograd(&self, g: &Geom2) -> bool {
        cpu::winograd::applies(g, self.constant_weight.is_some())
    }

    /// Whether the CPU kernel computes geometry `g` of this Conv as a sum over its taps of
    /// shifted input lines (`conv_taps.rs`: few channels, stride 1 or a large strided kernel,
    /// AVX2 or AVX-512): the cost model gives these their own entry too.
    pub fn cpu_takes_taps(&self, g: &Geom2) -> bool {
        g.cg > 1
            && !self.cpu_takes_winograd(g)
            && cpu::taps::applies(g, self.constant_weight.is_some())
    }

    /// Whether the CPU kernel computes geometry `g` of this Conv as `W @ X` on its input
    /// planes (`conv_pointwise.rs`: a 1x1, stride 1, unpadded, of few output or input
    /// channels, AVX-512, or AVX2 where the kernel applies the whole epilogue).
    pub fn cpu_takes_pointwise(&self, g: &Geom2) -> bool {
        g.cg > 1 && cpu::pointwise::applies(g, self.epilogue())
    }

    /// What this Conv applies to each output element after the bias.
    pub fn epilogue(&self) -> Epilogue {
        Epilogue {
            act: self.activation,
            post: self.post,
            residual: self.residual,
        }
    }

    /// Geometry and output shape from X, W (and B, and Z) shapes.
    pub fn geom(&self, ins: &[&[usize]]) -> Result<(Geom2, Vec<usize>)> {
        let want = if self.residual == Residual::None {
            2..=3
        } else {
            4..=4
        };
        if !want.contains(&ins.len()) {
            return Err(OpError::Invalid(format!(
                "Conv takes {} to {} inputs, got {}",
                want.start(),
                want.end(),
                ins.len()
            )));
        }
        let (x, w) = (ins[0], ins[1]);
        if x.len() != w.len() || x.len() < 3 {
            return Err(OpError::Invalid(format!(
                "Conv: X {x:?} and W {w:?} ranks differ or < 3"
            )));
        }
        let r = x.len() - 2;
        if r > 2 {
            return Err(OpError::Unsupported(format!(
                "Conv with {r} spatial dims (1-D, 2-D only)"
            )));
        }
        let group = self.attrs.group;
        let (n, c, m) = (x[0], x[1], w[0]);
        if c != w[1] * group || m % group != 0 {
            return Err(OpError::Invalid(format!(
                "Conv: X {x:?}, W {w:?} and group {group} disagree (need C = W[1] * group, M % group = 0)"
            )));
        }
        if let Some(b) = ins.get(2) {
            if *b != [m] {
                return Err(OpError::Invalid(format!(
                    "Conv: bias shape {b:?}, expected [{m}]"
                )));
            }
        }
        if w[2..].contains(&0) {
            return Err(OpError::Invalid(format!("Conv: empty kernel {w:?}")));
        }
        let axes = self.attrs.per_axis("Conv", &w[2..])?;
        let mut outs = Vec::new();
        for i in 0..r {
            outs.push(conv_out_len(x[2 + i], axes[i], self.attrs.auto_pad)?);
        }
        let mut shape = vec![n, m];
        shape.extend(outs.iter().map(|o| o.0));
        if let Some(z) = ins.get(3) {
            if *z != shape.as_slice() {
                return Err(OpError::Invalid(format!(
                    "Conv: the residual it adds has shape {z:?}, the Conv's output {shape:?} \
                     (the fused Add does not broadcast)"
                )));
            }
        }
        let g = Geom2::of_axes(x, m, (&axes, &outs), (group, w[1], m / group));
        Ok((g, shape))
    }

    /// The `conv.wgsl` dispatch (or `shader`'s, which shares its params and layout) for output
    /// elements `e0..e1` (whole output rows) with `px` pixels (4 or 8) and `ocb` output
    /// channels (1, 4 or 8) a invocation; `n_ins` inputs. With `window`, W's elements in it are
    /// bound as a uniform buffer (`conv_rows.wgsl`), which holds the weights of every channel
    /// in `e0..e1`.
    fn gpu_kernel(
        &self,
        shader: tandem_shaders::Shader,
        g: &Geom2,
        n_ins: usize,
        (e0, e1): (usize, usize),
        (px, ocb): (usize, usize),
        window: Option<Range<usize>>,
    ) -> Result<GpuKernel> {
        let plane = g.oh * g.ow;
        let (pl0, pl1) = (e0 / plane, (e1 - 1) / plane);
        // `conv_rows.wgsl` numbers pixel blocks within output rows (its ROWS override)
        let rows = [
            CONV_ROWS,
            CONV_ROWS_UNIFORM,
            CONV_ROWS_TEXTURE,
            CONV_ROWS_UNIFORM_TEXTURE,
        ]
        .contains(&shader);
        let bpp = if rows {
            g.oh * g.ow.div_ceil(px)
        } else {
            plane.div_ceil(px)
        };
        let mgb = g.mg.div_ceil(ocb);
        let block = |pl: usize| {
            let oc = pl % g.m;
            (pl / g.m) * mgb * g.group + (oc / g.mg) * mgb + (oc % g.mg) / ocb
        };
        // `conv_tiled.wgsl`: blk0 is the first image, the grid the tiles of e0..e1 (`TileGrid`)
        let tiled = (shader == CONV_TILED).then(|| TileGrid::of(g, e0..e1));
        let (b0, b1) = match tiled {
            Some(_) => (pl0 / g.m, pl1 / g.m),
            None => (block(pl0), block(pl1)),
        };
        let threads = (b1 + 1 - b0) * bpp;
        let first_tile = tiled.map_or([0, 0], |t| t.first.map(|v| v as u32));
        let (act, act_a, act_b) = self.activation.gpu_params();
        let p = ConvParams {
            n: u32_of(g.n)?,
            c: u32_of(g.c)?,
            h: u32_of(g.h)?,
            w: u32_of(g.w)?,
            m: u32_of(g.m)?,
            oh: u32_of(g.oh)?,
            ow: u32_of(g.ow)?,
            kh: u32_of(g.kh)?,
            kw: u32_of(g.kw)?,
            sh: u32_of(g.sh)?,
            sw: u32_of(g.sw)?,
            dh: u32_of(g.dh)?,
            dw: u32_of(g.dw)?,
            pt: g.pt as i32,
            pl: g.pl as i32,
            cg: u32_of(g.cg)?,
            mg: u32_of(g.mg)?,
            blk0: u32_of(b0)?,
            e_start: e0 as u32,
            e_end: e1 as u32,
            bpp: bpp as u32,
            threads: u32_of(threads)?,
            mgb: u32_of(mgb)?,
            act_a,
            act_b,
            post_scale: self.post.map_or(1.0, |p| p.0),
            post_shift: self.post.map_or(0.0, |p| p.1),
            w_first: u32_of(window.as_ref().map_or(0, |w| w.start))?,
            tile_x0: first_tile[0],
            tile_y0: first_tile[1],
            _pad: [0; 2],
        };
        // Unused bindings get W again.
        let inputs = vec![
            0,
            1,
            if n_ins > 2 { 2 } else { 1 },
            if n_ins > 3 { 3 } else { 1 },
        ];
        // lavapipe runs a workgroup on one core: a window's dispatch of few blocks (a 3x3 of
        // 128 channels on 20 x 20, 8 channels a window) spreads over more of them in 16s (on
        // big ones 16 and 64 took the same time, and one size compiles half the pipelines)
        let wg = if window.is_some() { 16 } else { 64 };
        let grid = match tiled {
            Some(t) => t.workgroups()?,
            None => grid_1d(threads as u64, wg),
        };
        let k = GpuKernel::new(shader, inputs, vec![0], &p, grid)
            .with_override("WG", wg as f64)
            .with_override("PX", px as f64)
            .with_override("ROWS", rows as u32 as f64)
            .with_override("OCB", ocb as f64)
            .with_override("HAS_BIAS", (n_ins > 2) as u32 as f64)
            // [`Activation::gpu_params`].
            .with_override("ACT", act as f64)
            // 1: `v * post_scale + post_shift` after the activation ([`Epilogue::post`]).
            .with_override("POST", self.post.is_some() as u32 as f64)
            // [`Residual`] as 0 none, 1 before the activation, 2 after the affine.
            .with_override("RESIDUAL", self.residual as u32 as f64);
        // `conv_rows.wgsl`'s window: the kernel width, left pad and stride across
        let k = if rows {
            k.with_override("KW", g.kw as f64)
                .with_override("PL", g.pl as f64)
                .with_override("SW", g.sw as f64)
        } else {
            k
        };
        Ok(match window {
            Some(w) => k.with_uniform_window(crate::UniformWindow {
                binding: 1,
                first: w.start,
                len: w.len(),
            }),
            None => k,
        })
    }
}

fn shapes<'a>(ins: &[&'a TensorMeta]) -> Vec<&'a [usize]> {
    ins.iter().map(|t| t.shape.as_slice()).collect()
}

/// Output positions `o < out_len` whose input index `o * stride + offset` lies in `0..in_len`.
pub fn valid_range(out_len: usize, stride: usize, offset: i64, in_len: usize) -> Range<usize> {
    let s = stride as i64;
    let lo = if offset >= 0 {
        0
    } else {
        (-offset + s - 1) / s
    };
    let last = in_len as i64 - 1 - offset;
    let hi = if last < 0 { 0 } else { last / s + 1 };
    let lo = (lo as usize).min(out_len);
    lo..(hi as usize).clamp(lo, out_len)
}

/// Whether `conv_pointwise.wgsl` reading X as vec4s (`conv_pointwise_x_vec4.wgsl`) computes
/// this conv on an adapter that runs shaders on the CPU: a 1x1 of stride 1 without pads whose
/// planes and groups' input channels are multiples of 4 (its vec4 loads of X and W then stay
/// aligned).
fn pointwise_vec4_fits(g: &Geom2) -> bool {
    let one = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1;
    let unpadded = g.pt == 0 && g.pl == 0 && g.oh == g.h && g.ow == g.w;
    one && unpadded && (g.oh * g.ow).is_multiple_of(4) && g.cg.is_multiple_of(4)
}

/// Whether `conv_pointwise.wgsl` reading X a pixel at a time (`conv_pointwise_x_pixels.wgsl`)
/// computes this conv on an adapter that runs shaders on the CPU, where its vec4 reading does
/// not: a 1x1 of any stride whose every output pixel reads a pixel of X (no pads in effect)
/// and whose groups' input channels are a multiple of 4 (its vec4 loads of W then stay
/// aligned). resnet50's 1x1s of stride 2 and on 7 x 7 planes ran on `conv_rows.wgsl` in
/// 1.4-2.2x its time on lavapipe.
fn pointwise_strided_fits(g: &Geom2) -> bool {
    let one = g.kh == 1 && g.kw == 1 && g.pt == 0 && g.pl == 0;
    let inside = (g.oh - 1) * g.sh < g.h && (g.ow - 1) * g.sw < g.w;
    one && inside && g.cg.is_multiple_of(4)
}

/// Whether `conv_rows.wgsl` computes this conv on an adapter that runs shaders on the CPU:
/// horizontal stride 1 or 2 and dilation 1, and every tap's pixels inside the 24 columns it
/// can hold (`kw` at most 7, left pad at most 4, `kw - 1 - pl` at most `3 + sw`). On lavapipe
/// resnet50's first conv (7x7 of stride 2, 3 -> 64 channels on 224 x 224) took 0.36x the time
/// of `conv.wgsl`'s.
fn rows_window_fits(g: &Geom2) -> bool {
    let (kw, pl, sw) = (g.kw as i64, g.pl, g.sw as i64);
    let window = kw <= 7 && (0..=4).contains(&pl) && kw - 1 - pl <= 3 + sw;
    (1..=2).contains(&g.sw) && g.dw == 1 && window
}

/// Whether `conv_rows.wgsl` reads X from a texture (`conv_rows_x_texture.wgsl`) for `g`: where
/// textures are on, X's rows are whole vec4s (its width a multiple of 4) and X fits one.
/// On lavapipe magika's conv (256 -> 512 channels, 5 taps, 512 wide) spent about half its time
/// in X's storage loads.
fn rows_x_texture_fits(g: &Geom2) -> bool {
    g.w.is_multiple_of(4) && crate::gpu_kernel::texture_fits(g.n * g.c * g.h * g.w)
}

/// Whether `conv_rows.wgsl` computes `g` faster in dispatches `windows`, W in uniform windows,
/// than in one reading W from storage: one always does; several where they average at least
/// 2^20 multiply-adds each. A dispatch costs about 50 us on lavapipe, about 100 K of them:
/// resnet50's 1x1s of 2048 channels on 7 x 7 planes would take 64 windows each.
fn windows_pay(g: &Geom2, windows: &[WeightWindow]) -> bool {
    let fmas: usize = windows.iter().map(|w| w.weights.len() * g.oh * g.ow).sum();
    windows.len() == 1 || fmas / windows.len() >= 1 << 20
}

/// Output channels and pixels of a `conv_tiled.wgsl` workgroup's tile.
const TILE: usize = 64;

/// The `conv_tiled.wgsl` tiles a dispatch of output elements `e0..e1` covers: pixel tiles,
/// channel tiles of every group (group g's tile t is number `g * ceil(mg / 64) + t`), images;
/// only those the elements touch where they lie in one plane (pixels) or one image (channels),
/// so that a split's rows launch their own tiles, not the image's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TileGrid {
    /// The first pixel tile and channel tile (`tile_x0`, `tile_y0` of the params).
    first: [usize; 2],
    /// Pixel tiles, channel tiles, images.
    count: [usize; 3],
}

impl TileGrid {
    fn of(g: &Geom2, e: Range<usize>) -> TileGrid {
        let plane = g.oh * g.ow;
        let (pl0, pl1) = (e.start / plane, (e.end - 1) / plane);
        let per_group = g.mg.div_ceil(TILE);
        let channel_tile = |pl: usize| {
            let oc = pl % g.m;
            (oc / g.mg) * per_group + (oc % g.mg) / TILE
        };
        let (x0, x1) = match pl0 == pl1 {
            true => ((e.start % plane) / TILE, ((e.end - 1) % plane) / TILE),
            false => (0, plane.div_ceil(TILE) - 1),
        };
        let (y0, y1) = match pl0 / g.m == pl1 / g.m {
            true => (channel_tile(pl0), channel_tile(pl1)),
            false => (0, g.group * per_group - 1),
        };
        TileGrid {
            first: [x0, y0],
            count: [x1 + 1 - x0, y1 + 1 - y0, pl1 / g.m + 1 - pl0 / g.m],
        }
    }

    /// The dispatch's workgroups; an error where a count exceeds a dispatch's 65535 (the
    /// caller keeps `conv.wgsl`).
    fn workgroups(&self) -> Result<[u32; 3]> {
        match self.count.iter().all(|&d| d <= 65535) {
            true => Ok(self.count.map(|d| d as u32)),
            false => Err(OpError::Unsupported(format!(
                "Conv: {:?} tiles exceed a dispatch",
                self.count
            ))),
        }
    }
}

/// Whether a GPU computes `g` with `conv_tiled.wgsl` (W and X staged in workgroup memory) rather
/// than `conv.wgsl` (4 x 4 register tiles, every load from storage): where a group's output
/// channels and its reduction fill at least half a tile of 64 channels and a step of 16, and
/// the grid fits (and `TANDEM_GPU_TILED` is not 0). Depthwise and few-channel convs keep
/// `conv.wgsl`.
fn tiled_fits(g: &Geom2) -> bool {
    crate::gpu_kernel::tiled_enabled()
        && g.mg >= TILE / 2
        && g.ckk() >= 16
        && TileGrid::of(g, 0..g.n * g.m * g.oh * g.ow)
            .workgroups()
            .is_ok()
}

/// Output channels per invocation of `conv_rows.wgsl` with W in uniform windows: 8 (4 or 1 for
/// groups of fewer), or, where 8 channels' weights overflow a window and 4 or more fit, as
/// many as fit (the storage kernel keeps 8). On lavapipe resnet50's 3x3s of 256 channels on
/// 14 x 14, 7 a window, took 0.70-0.73x the time of 8 reading W from storage; 5 and 4 a window
/// (320 and 448 channels) 0.92x and 0.97x.
fn window_channels(g: &Geom2) -> usize {
    let ocb = gpu_channels(g.mg, 8);
    let fit = crate::UNIFORM_WINDOW_BYTES / 4 / (g.cg * g.kh * g.kw).max(1);
    match fit {
        _ if fit >= ocb => ocb,
        4.. => fit,
        _ => ocb,
    }
}

/// Output channels per invocation of `conv.wgsl` for groups of `mg` output channels, at most
/// `most` (4 or 8): one where a group has fewer than 4 (depthwise).
fn gpu_channels(mg: usize, most: usize) -> usize {
    match mg {
        _ if mg >= most => most,
        4.. => 4,
        _ => 1,
    }
}

/// Params of `conv.wgsl` (layout mirrored there; the channel block, the bias, the epilogue's
/// activation, affine and residual are its overrides).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ConvParams {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    m: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: i32,
    pl: i32,
    cg: u32,
    mg: u32,
    blk0: u32,
    e_start: u32,
    e_end: u32,
    bpp: u32,
    threads: u32,
    mgb: u32,
    /// Parameters of the activation ([`Activation::gpu_params`]).
    act_a: f32,
    act_b: f32,
    post_scale: f32,
    post_shift: f32,
    /// The first W element of the uniform window (`conv_rows.wgsl`); 0 for the others.
    w_first: u32,
    /// `conv_tiled.wgsl`'s first pixel tile and channel tile ([`TileGrid`]); 0 for the others.
    tile_x0: u32,
    tile_y0: u32,
    _pad: [u32; 2],
}

fn u32_of(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| OpError::Unsupported(format!("Conv on GPU: size {v} exceeds u32")))
}

impl Op for Conv {
    fn name(&self) -> &'static str {
        "Conv"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>> {
        let (_, shape) = self.geom(&shapes(ins))?;
        for (i, t) in ins.iter().enumerate() {
            if t.dtype != DType::F32 {
                return Err(OpError::Unsupported(format!(
                    "Conv: input {i} has dtype {}, only f32 is implemented",
                    t.dtype
                )));
            }
        }
        Ok(vec![TensorMeta::new(DType::F32, shape)])
    }

    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        let flops = self
            .geom(&shapes(ins))
            .map(|(g, _)| {
                let o = (g.n * g.m * g.oh * g.ow) as u64;
                2 * o * g.ckk() as u64
                    + if ins.len() > 2 { o } else { 0 }
                    + o * self.epilogue().flops()
            })
            .unwrap_or(0);
        Work {
            flops,
            bytes_read: ins.iter().map(|i| i.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    fn split_axis(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        Some(2)
    }

    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()> {
        let sh: Vec<&[usize]> = ins.iter().map(|t| t.shape.as_slice()).collect();
        let (g, _) = self.geom(&sh)?;
        let as_row = match &self.constant_weight {
            Some(_) if cpu::packed::applies(&g, &rows) => cpu::implicit::column_as_row(&g, &rows),
            _ => None,
        };
        let (g, rows) = as_row.unwrap_or((g, rows));
        let x = f32_in("Conv", ins[0])?;
        let w = f32_in("Conv", ins[1])?;
        let b = ins.get(2).map(|t| f32_in("Conv", t)).transpose()?;
        let z = ins.get(3).map(|t| f32_in("Conv", t)).transpose()?;
        let out = f32_out("Conv", &mut outs[0])?;
        let kept = match &self.constant_weight {
            Some(u) if self.cpu_takes_winograd(&g) => KeptWeight::Winograd(u.winograd(&g, w)),
            Some(u) if self.cpu_takes_taps(&g) || self.cpu_takes_pointwise(&g) => {
                KeptWeight::Blocks(u.blocks(&g, w))
            }
            Some(u) if cpu::packed::applies(&g, &rows) => KeptWeight::Packed(u.packed(&g, w)),
            _ => KeptWeight::Nothing,
        };
        conv_cpu(&g, x, (w, kept), (b, z), self.epilogue(), out, rows);
        Ok(())
    }

    fn gpu(
        &self,
        ins: &[&TensorMeta],
        _outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>> {
        let (g, _) = self.geom(&shapes(ins))?;
        let total = g.n * g.m * g.oh;
        let rows = rows.start.min(total)..rows.end.min(total);
        if rows.is_empty() || g.ow == 0 {
            return Ok(Vec::new());
        }
        let plane = g.oh * g.ow;
        let (e0, e1) = (rows.start * g.ow, rows.end * g.ow);
        u32_of(g.n * g.m * plane)?;
        // GPUs: `conv_tiled.wgsl` where a group fills a tile, else 4 pixels x 4 channels an
        // invocation (`conv.wgsl`); 8 x 8 on an adapter that runs shaders on the
        // CPU, where each load is a gather: 16 loads for 64 FMAs instead of 8 for 16 (magika's
        // conv and a 64 -> 64 3x3 on 56 x 56 in 0.50x the time on lavapipe).
        let tile = |px, most| (px, gpu_channels(g.mg, most));
        let gpu = match tiled_fits(&g) {
            true => self.gpu_kernel(CONV_TILED, &g, ins.len(), (e0, e1), (4, 4), None)?,
            false => self.gpu_kernel(CONV, &g, ins.len(), (e0, e1), tile(4, 4), None)?,
        };
        // There a 1-D conv runs as a row (the same floats in the same order), which
        // `conv_rows.wgsl` can window.
        let r = g.as_row(&(0..total)).map_or(g, |(row, _)| row);
        let on_cpu = |shader| self.gpu_kernel(shader, &r, ins.len(), (e0, e1), tile(8, 8), None);
        let cpu_adapter = if pointwise_vec4_fits(&r) {
            vec![on_cpu(CONV_POINTWISE)?]
        } else if pointwise_strided_fits(&r) {
            vec![on_cpu(CONV_POINTWISE_STRIDED)?]
        } else if rows_window_fits(&r) {
            let x_texture = rows_x_texture_fits(&r);
            let (storage_w, uniform_w) = match x_texture {
                true => (CONV_ROWS_TEXTURE, CONV_ROWS_UNIFORM_TEXTURE),
                false => (CONV_ROWS, CONV_ROWS_UNIFORM),
            };
            let ocb = window_channels(&r);
            let kernels = match weight_windows(&r, e0..e1, ocb).filter(|w| windows_pay(&r, w)) {
                // a dispatch per piece whose channels' weights fit a uniform buffer
                Some(windows) => (windows.into_iter())
                    .map(|w| {
                        let e = (w.elems.start, w.elems.end);
                        self.gpu_kernel(uniform_w, &r, ins.len(), e, (8, ocb), Some(w.weights))
                    })
                    .collect::<Result<Vec<_>>>()?,
                None => vec![on_cpu(storage_w)?],
            };
            match x_texture {
                true => (kernels.into_iter())
                    .map(|k| k.with_texture_inputs(&[0]))
                    .collect(),
                false => kernels,
            }
        } else {
            vec![on_cpu(CONV)?]
        };
        Ok(vec![gpu.with_cpu_adapter_variants(cpu_adapter)])
    }
}

#[cfg(test)]
#[path = "conv_tests.rs"]
mod tests;
