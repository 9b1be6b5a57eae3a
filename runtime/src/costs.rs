//! The interface between the scheduler and the cost model: predicted times of nodes on each
//! device and of the transfers between them.
//!
//! Sits between `schedule.rs` (which only asks questions through [`Costs`]) and `cost/` (the
//! learned, persisted model that answers them). Frozen cost tables in tests implement it too.

use crate::plan::Device;
use std::borrow::Cow;
use tandem_ops::conv::{Conv, Geom2};
use tandem_ops::cpu_gemm;
use tandem_ops::gemm_op::Gemm;
use tandem_ops::matmul::{gpu_workgroup_rows, GPU_TILE};
use tandem_ops::{DType, Op, TensorMeta, Work};

/// What the scheduler needs to know of one node to predict its time.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeCostQuery<'a> {
    /// ONNX op type, e.g. "Conv".
    pub op_type: &'a str,
    /// Dtype of output 0.
    pub dtype: DType,
    /// Work of the whole node (all rows).
    pub work: Work,
    /// Number of GPU dispatches (launch overhead), usually 1.
    pub dispatches: usize,
    /// Which kernel path of the op runs (see [`kernel_variant`]); "" when the op has one.
    pub variant: &'static str,
    /// GPU work launched per unit of useful work, >= 1 ([`gpu_padding`]): the GPU's cost
    /// features are `work.flops * gpu_pad`. 1.0 where unknown.
    pub gpu_pad: f64,
    /// Output rows of the whole node (lines along its split axis, `shape::row_count`), a
    /// feature of the cost per row; 0.0 where unknown.
    pub rows: f64,
}

impl NodeCostQuery<'_> {
    /// The cost model's key for this node on the CPU: `op_type`, or `op_type/variant`.
    pub fn cost_key(&self) -> Cow<'_, str> {
        cost_key(self.op_type, self.variant)
    }

    /// The cost model's key for this node on `device`: `op_type`, or `op_type/variant` with
    /// the variant as that device runs it ([`device_variant`]).
    pub fn cost_key_on(&self, device: Device) -> Cow<'_, str> {
        cost_key(self.op_type, device_variant(self.variant, device))
    }

    /// Flops of `fraction` of the rows as `device` executes them (padded on the GPU).
    pub fn flops_on(&self, device: Device, fraction: f64) -> f64 {
        let pad = match device {
            Device::Cpu => 1.0,
            Device::Gpu => self.gpu_pad.max(1.0),
        };
        self.work.flops as f64 * fraction * pad
    }
}

/// Work the GPU kernel launches per unit of useful work (>= 1) where its launch geometry rounds
/// the output up (workgroup quantisation, as in CoDL): MatMul and Gemm compute whole 64x64
/// output tiles, so a 16-row product costs what a 64-row one does; a one-row product, whole
/// 1 x 64 tiles ([`gpu_workgroup_rows`]). 1.0 for other ops (their kernels run one invocation per output element or row,
/// rounded up by at most one workgroup). On an adapter that runs shaders on the CPU a product
/// whose A rows go through uniform windows (`matmul_window.wgsl`) rounds its rows up to 8 per
/// window only: it launches less than this says (the model, fitted per adapter on the same
/// count, then overestimates such products of fewer than 64 rows there).
pub fn gpu_padding(op_type: &str, outs: &[TensorMeta]) -> f64 {
    if !matches!(op_type, "MatMul" | "Gemm") {
        return 1.0;
    }
    let (m, n) = match outs.first().map(|o| o.shape.as_slice()) {
        Some([.., m, n]) => (*m, *n),
        Some([n]) => (1, *n),
        _ => return 1.0,
    };
    if m == 0 || n == 0 {
        return 1.0;
    }
    let up = |v: usize, tile: usize| v.div_ceil(tile) * tile;
    let launched = up(m, gpu_workgroup_rows(m)) * up(n, GPU_TILE);
    launched as f64 / (m * n) as f64
}

/// `op`, or `op/variant` when the variant is not empty.
pub fn cost_key<'a>(op: &'a str, variant: &str) -> Cow<'a, str> {
    if variant.is_empty() {
        Cow::Borrowed(op)
    } else {
        Cow::Owned(format!("{op}/{variant}"))
    }
}

/// The kernel path an op takes for these shapes and attributes, where one op type runs kernels
/// whose time per flop differs a lot, so that they get separate cost entries: Conv is
/// `depthwise`, `grouped`, `1x1`, `winograd` (a 3x3 stride-1 convolution the CPU computes by
/// Winograd, F(4x4, 3x3) or F(2x2, 3x3), `Conv::cpu_takes_winograd`, about 1.5x faster per flop
/// than im2col), `taps` (a convolution of few channels, stride 1 or a strided kernel of 100
/// taps, the CPU computes as a sum over its taps of shifted input lines,
/// `Conv::cpu_takes_taps`, 1.2-1.9x faster per flop) or `kxk`
/// (every other dense kernel); MatMul and Gemm with a single output row are `gemv`
/// (bandwidth-bound, and a tiled GPU kernel computes a whole tile of rows for it); Gemm with a
/// transposed B and few rows is `dot` (the CPU's dot-product tiles, 5-10x faster per flop than
/// the `gemm` crate on that layout). "" for
/// everything else. The variant is the CPU's; [`device_variant`] maps it to another device's.
pub fn kernel_variant(op: &dyn Op, ins: &[&TensorMeta], outs: &[TensorMeta]) -> &'static str {
    match op.name() {
        "Conv" => {
            let (Some(x), Some(w)) = (ins.first(), ins.get(1)) else {
                return "";
            };
            if x.shape.len() < 3 || w.shape.len() != x.shape.len() || w.shape[1] == 0 {
                return "";
            }
            let group = x.shape[1] / w.shape[1];
            if group > 1 && w.shape[1] == 1 {
                "depthwise"
            } else if group > 1 {
                "grouped"
            } else if w.shape[2..].iter().product::<usize>() == 1 {
                "1x1"
            } else if conv_takes(op, ins, Conv::cpu_takes_winograd) {
                "winograd"
            } else if conv_takes(op, ins, Conv::cpu_takes_taps) {
                "taps"
            } else {
                "kxk"
            }
        }
        "MatMul" | "Gemm" => match outs.first().map(|o| o.shape.as_slice()) {
            Some([.., m, _]) if *m == 1 => "gemv",
            Some([_]) => "gemv",
            Some([m, n]) if takes_dot_tiles(op, ins, *m, *n) => "dot",
            _ => "",
        },
        _ => "",
    }
}

/// Whether `op` is a Conv whose CPU kernel takes `path` (`Conv::cpu_takes_winograd`,
/// `Conv::cpu_takes_taps`) for these inputs (false for shapes the Conv rejects).
fn conv_takes(op: &dyn Op, ins: &[&TensorMeta], path: fn(&Conv, &Geom2) -> bool) -> bool {
    let Some(conv) = op.as_any().and_then(|a| a.downcast_ref::<Conv>()) else {
        return false;
    };
    let shapes: Vec<&[usize]> = ins.iter().map(|t| t.shape.as_slice()).collect();
    conv.geom(&shapes).is_ok_and(|(g, _)| path(conv, &g))
}

/// Whether `op` is a Gemm (transA=0, transB=1) whose `m x n` output the CPU computes as
/// dot-product tiles ([`tandem_ops::cpu_gemm::takes_dot_tiles`]).
fn takes_dot_tiles(op: &dyn Op, ins: &[&TensorMeta], m: usize, n: usize) -> bool {
    let Some(gemm) = op.as_any().and_then(|a| a.downcast_ref::<Gemm>()) else {
        return false;
    };
    let (Some(a), Some(b)) = (ins.first(), ins.get(1)) else {
        return false;
    };
    let (k, ld) = (a.shape.last().copied(), b.shape.last().copied());
    let (Some(k), Some(ld)) = (k, ld) else {
        return false;
    };
    !gemm.trans_a && gemm.trans_b && cpu_gemm::takes_dot_tiles(m, n, k, ld)
}

/// The kernel variant `device` runs for a node whose CPU variant is `variant`: the GPU has no
/// Winograd or taps kernel, so its `winograd` and `taps` convolutions are its `kxk` ones (one
/// entry, one curve), nor
/// dot-product tiles, so its `Gemm/dot` products are plain tiled `Gemm`.
pub fn device_variant(variant: &'static str, device: Device) -> &'static str {
    match (variant, device) {
        ("winograd" | "taps", Device::Gpu) => "kxk",
        ("dot", Device::Gpu) => "",
        _ => variant,
    }
}

/// Predicted times, in seconds.
pub trait Costs: Send + Sync {
    /// Time of `fraction` (0..=1) of the node's rows on `device`.
    fn node_time(&self, q: &NodeCostQuery<'_>, device: Device, fraction: f64) -> f64;
    /// Time to move `bytes` to `to` (upload when `to` is the GPU, download otherwise).
    fn transfer_time(&self, bytes: u64, to: Device) -> f64;
    /// Fixed cost of one CPU-GPU synchronisation (submit + map + wait).
    fn sync_time(&self) -> f64;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_ops::{registry, AttrValue, Attrs};

    /// Whether the packed path's in-place im2col runs here (AVX-512 or Zen 1's AVX2, neither
    /// switch off).
    fn implicit_on() -> bool {
        tandem_ops::conv::packed_paths_run_here()
            && std::env::var("TANDEM_CONV_IMPLICIT").as_deref() != Ok("0")
            && std::env::var("TANDEM_CONV_PACKED").as_deref() != Ok("0")
    }

    /// The variant of a 3x3 Conv (pads 1) over `[1, c, hw, hw]` into `m` channels, its W a
    /// model constant when `kept`.
    fn conv_variant(c: usize, m: usize, hw: usize, stride: i64, kept: bool) -> &'static str {
        let attrs = Attrs::new(13)
            .with("kernel_shape", AttrValue::Ints(vec![3, 3]))
            .with("pads", AttrValue::Ints(vec![1, 1, 1, 1]))
            .with("strides", AttrValue::Ints(vec![stride, stride]));
        let mut op = registry::build("Conv", &attrs).unwrap();
        if kept {
            op = Box::new(
                op.as_any()
                    .unwrap()
                    .downcast_ref::<Conv>()
                    .unwrap()
                    .with_constant_weight(),
            );
        }
        let x = TensorMeta::new(DType::F32, vec![1, c, hw, hw]);
        let w = TensorMeta::new(DType::F32, vec![m, c, 3, 3]);
        let outs = op.infer(&[&x, &w]).unwrap();
        kernel_variant(op.as_ref(), &[&x, &w], &outs)
    }

    #[test]
    fn winograd_eligible_convs_get_their_own_variant() {
        // conv_winograd.rs takes 3x3 stride-1 group-1 convs with C, M >= 64 and >= 400
        // output pixels, or >= 100 where W is a constant the op keeps the transform of;
        // TANDEM_CONV_WINOGRAD=0 turns it off (then they are im2col's).
        // Where the paths built for full-width AVX-512 lose to it (AVX2, AMD Zen 4's halves,
        // Zen 5) a kept W takes it from 16 input channels on planes of 729 pixels and up.
        let on = std::env::var("TANDEM_CONV_WINOGRAD").as_deref() != Ok("0");
        let winograd = if on { "winograd" } else { "kxk" };
        let few = tandem_ops::simd::winograd_over_wide_paths();
        for kept in [false, true] {
            assert_eq!(conv_variant(64, 64, 32, 1, kept), winograd, "kept {kept}");
            assert_eq!(conv_variant(64, 64, 32, 2, kept), "kxk", "stride 2");
            let want = if kept && few { winograd } else { "kxk" };
            assert_eq!(
                conv_variant(48, 64, 32, 1, kept),
                want,
                "48 inputs, kept {kept}"
            );
            // (128 outputs: more than the taps path takes; with full-width AVX-512 it takes
            // the kept ones.)
            let want_16 = if few { want } else { "kxk" };
            assert_eq!(
                conv_variant(16, 128, 27, 1, kept),
                want_16,
                "16 inputs, kept {kept}"
            );
            assert_eq!(conv_variant(48, 64, 26, 1, kept), "kxk", "676 pixels");
            assert_eq!(conv_variant(15, 128, 32, 1, kept), "kxk", "15 inputs");
            assert_eq!(conv_variant(64, 64, 8, 1, kept), "kxk", "64 output pixels");
        }
        assert_eq!(
            conv_variant(64, 64, 16, 1, false),
            "kxk",
            "256 pixels, W per call"
        );
        assert_eq!(
            conv_variant(64, 64, 16, 1, true),
            winograd,
            "256 pixels, W kept"
        );
        // A kept W on 13x13 from 64 channels: Winograd's, unless the packed path's in-place
        // im2col (AVX-512) runs at full width; on 10x10 that path's wherever it runs.
        let implicit = implicit_on();
        let at_13 = match implicit && !few {
            true => "kxk",
            false => winograd,
        };
        assert_eq!(conv_variant(64, 256, 13, 1, true), at_13, "13x13, W kept");
        let at_10 = if implicit { "kxk" } else { winograd };
        assert_eq!(conv_variant(128, 128, 10, 1, true), at_10, "10x10, W kept");
        // From 256 channels Winograd keeps 13x13 planes beside that path, not 10x10 ones.
        assert_eq!(conv_variant(256, 64, 10, 1, true), at_10, "256 in on 10x10");
        assert_eq!(
            conv_variant(256, 64, 13, 1, true),
            winograd,
            "256 in on 13x13"
        );
        // The GPU has one kernel for both.
        assert_eq!(device_variant("winograd", Device::Gpu), "kxk");
        assert_eq!(device_variant("winograd", Device::Cpu), "winograd");
        assert_eq!(device_variant("depthwise", Device::Gpu), "depthwise");
    }

    #[test]
    fn few_channel_convs_get_the_taps_variant() {
        // conv_taps.rs takes stride-1 group-1 2-D convs of 8 to 32 input and at most 96 output
        // channels (on AVX2 at most 32), and on AVX-512 strided ones of at most 32 input
        // channels (on AVX2 from 100 taps), with output pixels x taps from 3600;
        // TANDEM_CONV_TAPS=0 turns it off (then they are im2col's). A kept W of 32 output
        // channels or more on a plane under 40x40 takes the packed path's im2col read in
        // place instead (`kxk`, AVX-512 or Zen 1).
        let level = tandem_ops::simd::level();
        let on = level >= tandem_ops::simd::Level::Avx2
            && std::env::var("TANDEM_CONV_TAPS").as_deref() != Ok("0");
        let implicit = implicit_on();
        // Where the wide paths lose to Winograd a kept W of these on 27x27 and up is its
        // (the test above).
        let winograd = tandem_ops::simd::winograd_over_wide_paths()
            && std::env::var("TANDEM_CONV_WINOGRAD").as_deref() != Ok("0");
        let taps = if on { "taps" } else { "kxk" };
        let wide_taps = match level {
            tandem_ops::simd::Level::Avx512 => taps,
            _ => "kxk",
        };
        for kept in [false, true] {
            let large = if kept && winograd { "winograd" } else { taps };
            assert_eq!(conv_variant(16, 16, 40, 1, kept), large, "kept {kept}");
            let large = if kept && winograd {
                "winograd"
            } else {
                wide_taps
            };
            assert_eq!(conv_variant(16, 64, 40, 1, kept), large, "kept {kept}");
            let small = if kept && implicit { "kxk" } else { wide_taps };
            assert_eq!(conv_variant(32, 96, 20, 1, kept), small, "kept {kept}");
            assert_eq!(conv_variant(32, 96, 19, 1, kept), "kxk", "3x3 on 19x19");
            assert_eq!(conv_variant(16, 16, 40, 2, kept), wide_taps, "stride 2");
            assert_eq!(
                conv_variant(64, 16, 40, 2, kept),
                "kxk",
                "stride 2, 64 inputs"
            );
            let wide = if kept && winograd { "winograd" } else { "kxk" };
            assert_eq!(conv_variant(32, 128, 27, 1, kept), wide, "128 outputs");
            assert_eq!(conv_variant(4, 16, 40, 1, kept), "kxk", "4 inputs");
        }
        assert_eq!(device_variant("taps", Device::Gpu), "kxk");
        assert_eq!(device_variant("taps", Device::Cpu), "taps");
    }

    #[test]
    fn other_conv_and_matmul_variants() {
        let op = registry::build("Conv", &Attrs::new(13).with("group", AttrValue::Int(8))).unwrap();
        let x = TensorMeta::new(DType::F32, vec![1, 8, 10, 10]);
        let w = TensorMeta::new(DType::F32, vec![8, 1, 3, 3]);
        let outs = op.infer(&[&x, &w]).unwrap();
        assert_eq!(kernel_variant(op.as_ref(), &[&x, &w], &outs), "depthwise");
        let mm = registry::build("MatMul", &Attrs::new(13)).unwrap();
        let a = TensorMeta::new(DType::F32, vec![1, 16]);
        let b = TensorMeta::new(DType::F32, vec![16, 4]);
        let outs = mm.infer(&[&a, &b]).unwrap();
        assert_eq!(kernel_variant(mm.as_ref(), &[&a, &b], &outs), "gemv");
    }

    /// The variant of Gemm `[m, k] x [n, k]^T` (transB=1) or `[m, k] x [k, n]` (transB=0).
    fn gemm_variant(m: usize, k: usize, n: usize, trans_b: bool) -> &'static str {
        let attrs = Attrs::new(13).with("transB", AttrValue::Int(trans_b as i64));
        let op = registry::build("Gemm", &attrs).unwrap();
        let a = TensorMeta::new(DType::F32, vec![m, k]);
        let b = TensorMeta::new(DType::F32, if trans_b { vec![n, k] } else { vec![k, n] });
        let outs = op.infer(&[&a, &b]).unwrap();
        kernel_variant(op.as_ref(), &[&a, &b], &outs)
    }

    #[test]
    fn few_row_linear_layers_are_dot_tiles_on_the_cpu_only() {
        // cpu_gemm_dot::wins: 2..8 rows at any K, 9..64 rows from K = 512, 32..64 only while
        // the weight's rows are not padded; TANDEM_GEMM_DOT=0 sends all of them to the crate.
        let on = std::env::var("TANDEM_GEMM_DOT").as_deref() != Ok("0");
        let dot = if on { "dot" } else { "" };
        assert_eq!(gemm_variant(4, 256, 256, true), dot);
        assert_eq!(gemm_variant(16, 1024, 1024, true), dot);
        assert_eq!(gemm_variant(32, 256, 256, true), "", "K below 512");
        assert_eq!(gemm_variant(128, 1024, 1024, true), "", "more than 64 rows");
        assert_eq!(gemm_variant(32, 1024, 512, true), dot, "aliasing stride");
        let padded = Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
            b_row_pad: 16,
        };
        let (a, b) = (
            TensorMeta::new(DType::F32, vec![32, 1024]),
            TensorMeta::new(DType::F32, vec![512, 1040]),
        );
        let outs = padded.infer(&[&a, &b]).unwrap();
        assert_eq!(kernel_variant(&padded, &[&a, &b], &outs), "", "padded rows");
        assert_eq!(gemm_variant(4, 256, 256, false), "", "B not transposed");
        assert_eq!(gemm_variant(1, 256, 256, true), "gemv");
        assert_eq!(device_variant("dot", Device::Gpu), "");
        assert_eq!(device_variant("dot", Device::Cpu), "dot");
    }

    #[test]
    fn matmul_padding_is_the_launched_tiles_over_the_outputs() {
        let op = registry::build("MatMul", &Attrs::new(13)).unwrap();
        for (m, k, n) in [
            (1, 70, 131),
            (1, 8, 64),
            (16, 8, 64),
            (67, 5, 129),
            (64, 3, 1),
            (70, 20, 68),
        ] {
            let a = TensorMeta::new(DType::F32, vec![m, k]);
            let b = TensorMeta::new(DType::F32, vec![k, n]);
            let outs = op.infer(&[&a, &b]).unwrap();
            // Each workgroup covers TM x WY rows, and T x WS columns (matmul.wgsl) or 8 lanes
            // of 8 (matmul_vec4.wgsl, K and N multiples of 4), or a 64 x 64 tile
            // (matmul_tiled.wgsl, GPUs from 32 rows); matmul_window.wgsl's, TM rows of 64
            // columns, pad rows only up to TM (Cpu adapters: at most the model's padding).
            for cpu_adapter in [false, true] {
                let launched: f64 = (op.gpu(&[&a, &b], &outs, 0..m).unwrap().iter())
                    .flat_map(|k| k.for_adapter(cpu_adapter))
                    .map(|k| {
                        let o = |name| k.override_value(name).unwrap();
                        let (rows, cols) = match k.shader.name {
                            "matmul_window" | "matmul_window_texture" => (o("TM"), 64.0),
                            "matmul_vec4" => (o("TM") * o("WY"), 64.0),
                            "matmul_tiled" => (64.0, 64.0),
                            _ => (o("TM") * o("WY"), o("T") * o("WS")),
                        };
                        let groups: u32 = k.workgroups.iter().product();
                        groups as f64 * rows * cols
                    })
                    .sum();
                let padding = launched / (m * n) as f64;
                let what = format!("{m} x {k} x {n}, cpu adapter {cpu_adapter}: {padding}");
                if cpu_adapter {
                    assert!(
                        (1.0..=gpu_padding("MatMul", &outs)).contains(&padding),
                        "{what}"
                    );
                } else {
                    assert_eq!(gpu_padding("MatMul", &outs), padding, "{what}");
                }
            }
        }
    }
}
