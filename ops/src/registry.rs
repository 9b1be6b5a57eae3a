//! The table from ONNX op type to operator constructor: one line per operator.
//!
//! Sits between the runtime's importer (which looks op types up here) and the operator files.

use crate::{Attrs, Op, OpError, Result};

/// Builds an operator from its attributes (validating them).
pub type Constructor = fn(&Attrs) -> Result<Box<dyn Op>>;

/// Every supported op type of the default ONNX domain, with its constructor.
pub const OPS: &[(&str, Constructor)] = &[
    ("Reshape", crate::view::reshape),
    ("Flatten", crate::view::flatten),
    ("Squeeze", crate::view::squeeze),
    ("Unsqueeze", crate::view::unsqueeze),
    ("Identity", crate::view::identity),
    ("Dropout", crate::view::dropout),
    ("Transpose", crate::transpose::transpose),
    ("Concat", crate::concat_split::concat),
    ("Split", crate::concat_split::split),
    ("Slice", crate::slice::slice),
    ("Gather", crate::gather::gather),
    ("GatherElements", crate::gather::gather_elements),
    ("Expand", crate::expand_tile::expand),
    ("Tile", crate::expand_tile::tile),
    ("Pad", crate::pad::pad),
    ("Resize", crate::resize::resize),
    ("Upsample", crate::resize::upsample),
    ("Shape", crate::generate::shape),
    ("Size", crate::generate::size),
    ("ConstantOfShape", crate::generate::constant_of_shape),
    ("Range", crate::generate::range),
    ("Constant", crate::generate::constant),
    ("Trilu", crate::generate::trilu),
    ("EyeLike", crate::generate::eye_like),
    ("Relu", crate::unary::relu),
    ("LeakyRelu", crate::unary::leaky_relu),
    ("Sigmoid", crate::unary::sigmoid_op),
    ("Tanh", crate::unary::tanh),
    ("Erf", crate::unary::erf),
    ("Gelu", crate::unary::gelu),
    ("HardSigmoid", crate::unary::hard_sigmoid),
    ("HardSwish", crate::unary::hard_swish),
    ("Clip", crate::unary::clip_op),
    ("Sqrt", crate::unary::sqrt),
    ("Exp", crate::unary::exp),
    ("Log", crate::unary::log),
    ("Neg", crate::unary::neg),
    ("Reciprocal", crate::unary::reciprocal),
    ("Floor", crate::unary::floor),
    ("Ceil", crate::unary::ceil),
    ("Round", crate::unary::round),
    ("Abs", crate::unary::abs),
    ("Sign", crate::unary::sign_op),
    ("Sin", crate::unary::sin),
    ("Cos", crate::unary::cos),
    ("Softplus", crate::unary::softplus_op),
    ("Softsign", crate::unary::softsign),
    ("Elu", crate::unary::elu),
    ("Selu", crate::unary::selu),
    ("Not", crate::unary::not),
    ("IsNaN", crate::unary::is_nan),
    ("IsInf", crate::unary::is_inf),
    ("Add", crate::binary::add),
    ("Sub", crate::binary::sub),
    ("Mul", crate::binary::mul),
    ("Div", crate::binary::div),
    ("Pow", crate::binary::pow),
    ("Mod", crate::binary::modulo),
    ("PRelu", crate::binary::prelu),
    ("Equal", crate::binary::equal),
    ("Less", crate::binary::less),
    ("Greater", crate::binary::greater),
    ("LessOrEqual", crate::binary::less_or_equal),
    ("GreaterOrEqual", crate::binary::greater_or_equal),
    ("And", crate::binary::and),
    ("Or", crate::binary::or),
    ("Xor", crate::binary::xor),
    ("Sum", crate::binary::sum),
    ("Mean", crate::binary::mean),
    ("Max", crate::binary::max),
    ("Min", crate::binary::min),
    ("Where", crate::where_op::where_op),
    ("Cast", crate::cast::cast),
    ("CastLike", crate::cast::cast_like),
    ("Softmax", crate::softmax::softmax),
    ("LogSoftmax", crate::softmax::log_softmax),
    ("Hardmax", crate::softmax::hardmax),
    ("ReduceSum", crate::reduce::reduce_sum),
    ("ReduceMean", crate::reduce::reduce_mean),
    ("ReduceMax", crate::reduce::reduce_max),
    ("ReduceMin", crate::reduce::reduce_min),
    ("ReduceProd", crate::reduce::reduce_prod),
    ("ReduceL1", crate::reduce::reduce_l1),
    ("ReduceL2", crate::reduce::reduce_l2),
    ("ReduceSumSquare", crate::reduce::reduce_sum_square),
    ("ReduceLogSumExp", crate::reduce::reduce_log_sum_exp),
    ("ReduceLogSum", crate::reduce::reduce_log_sum),
    ("ArgMax", crate::reduce::arg_max),
    ("ArgMin", crate::reduce::arg_min),
    ("MaxPool", crate::pool::max_pool),
    ("AveragePool", crate::pool::average_pool),
    ("GlobalAveragePool", crate::pool::global_average_pool),
    ("GlobalMaxPool", crate::pool::global_max_pool),
    ("LayerNormalization", crate::norm::layer_normalization),
    ("RMSNormalization", crate::norm::rms_normalization),
    ("InstanceNormalization", crate::norm::instance_normalization),
    (
        "BatchNormalization",
        crate::norm_channel::batch_normalization,
    ),
    ("LRN", crate::norm_channel::lrn),
    ("MatMul", crate::matmul::matmul),
    ("Gemm", crate::gemm_op::gemm),
    ("Conv", crate::conv::conv),
    ("ConvTranspose", crate::conv_transpose::conv_transpose),
];

/// Build the operator for `op_type` of the default domain.
pub fn build(op_type: &str, attrs: &Attrs) -> Result<Box<dyn Op>> {
    match OPS.iter().find(|(name, _)| *name == op_type) {
        Some((_, make)) => make(attrs),
        None => Err(OpError::Unsupported(format!(
            "op type `{op_type}` is not implemented; supported: {}",
            supported().join(", ")
        ))),
    }
}

/// Names of the supported op types, sorted.
pub fn supported() -> Vec<&'static str> {
    let mut v: Vec<_> = OPS.iter().map(|(n, _)| *n).collect();
    v.sort();
    v
}
