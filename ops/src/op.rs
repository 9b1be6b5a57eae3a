//! The operator contract shared by the runtime and every operator file.
//!
//! Sits between the runtime (which plans, places and executes nodes) and the operator files
//! (`ops/src/<family>.rs`), which implement [`Op`]: shape inference, work estimate, a CPU kernel
//! that can compute any row range of its output, and the description of its GPU kernel.

use crate::{GpuKernel, Tensor, TensorMeta};
use std::fmt::Debug;
use std::ops::Range;

/// Errors an operator reports. The runtime adds the node name and op type.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpError {
    /// The model is wrong: bad attribute, inconsistent shapes, wrong arity.
    #[error("{0}")]
    Invalid(String),
    /// The model is valid but this operator does not support it (mode, dtype, opset...).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

pub type Result<T, E = OpError> = std::result::Result<T, E>;

/// Cost features of one node: what the cost model learns time from.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    pub flops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// An ONNX operator with both kernels. Implementations are immutable after construction
/// (attributes are parsed in the constructor) and shared across threads.
///
/// Rows: an op that can be split names an axis of its first output ([`Op::split_axis`]); its
/// rows are the flattened dimensions up to and including that axis (see
/// [`crate::shape::row_count`]), so any row range is one contiguous block of the output. Both
/// kernels must compute exactly the rows asked for and leave the rest of the output untouched.
/// An op that cannot be split has a single row.
///
/// Inputs come in ONNX order. Omitted trailing optional inputs are absent (`ins.len()` is
/// smaller); an omitted optional input followed by a given one (an empty name in ONNX) arrives
/// as an empty constant: dtype f32, shape `[0]`, `value` set. Constructors receive attributes
/// only; `Attrs::opset` selects version-dependent behaviour.
pub trait Op: Debug + Send + Sync {
    /// The ONNX op type, e.g. `"Conv"`.
    fn name(&self) -> &'static str;

    /// The op as `Any`, for graph rewrites that must recognise its concrete type (the runtime's
    /// fusion pass looks for [`crate::conv::Conv`]). Default `None`: not rewritable.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// Output types and shapes from input metas (the only shape logic). `value` of an input
    /// meta is set when that input is a plan-time constant; ops whose output shape depends on
    /// an input's contents (Reshape, Slice...) read it there and fail with `Unsupported` if it is
    /// not constant. Returned metas have `value: None`, except when the output is fully known
    /// from input metas alone (Shape, Size): then set it, and the planner folds the node.
    fn infer(&self, ins: &[&TensorMeta]) -> Result<Vec<TensorMeta>>;

    /// Flops and bytes moved, for the cost model. The default suits elementwise ops.
    fn work(&self, ins: &[&TensorMeta], outs: &[TensorMeta]) -> Work {
        Work {
            flops: outs.iter().map(|o| o.numel() as u64).sum(),
            bytes_read: ins.iter().map(|i| i.bytes()).sum(),
            bytes_written: outs.iter().map(|o| o.bytes()).sum(),
        }
    }

    /// The axis of output 0 along which rows may be cut, or `None` if the op is not splittable.
    fn split_axis(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Option<usize> {
        None
    }

    /// Inputs that output 0 reads row for row along its split: with `R` output rows (see
    /// [`Op::split_axis`]) and input `i` listed, `ins[i].numel()` is a multiple of `R` and
    /// computing output rows `a..b` reads only elements `a*L..b*L` of input `i`, `L =
    /// ins[i].numel() / R`. The runtime then keeps a value split between the devices across a
    /// chain of such ops with no join (each half reads its own half). Default: none.
    fn row_local(&self, _ins: &[&TensorMeta], _outs: &[TensorMeta]) -> Vec<usize> {
        Vec::new()
    }

    /// True when output 0 is input 0's elements unchanged (only the shape differs): Reshape,
    /// Flatten, Squeeze, Unsqueeze, Identity, Dropout. The runtime then shares the storage and
    /// neither kernel is called.
    fn is_view(&self) -> bool {
        false
    }

    /// True when output 0 is its inputs' elements one after another, in input order (a Concat
    /// with only 1s before its axis): the runtime may then grow input 0's buffer into the
    /// output, appending the others, instead of calling [`Op::cpu`] to copy all of them.
    fn appends_inputs(&self, _ins: &[&TensorMeta]) -> bool {
        false
    }

    /// True when [`Op::cpu`] writes every element of the output rows it is asked for, in every
    /// output it computes: the runtime then hands it reused buffers as they are instead of
    /// zero-filling them first (a memset per output, up to a fifth of a densenet121 run).
    /// Default false: outputs arrive zero-filled. The tests' `run_cpu` fills the outputs of an
    /// op that says true with a poison value, so a row left unwritten fails them.
    fn overwrites_outputs(&self) -> bool {
        false
    }

    /// Compute `rows` of the outputs on the host. `outs` are allocated by the caller with the
    /// inferred dtypes and shapes (zero filled unless [`Op::overwrites_outputs`]); there are as
    /// many as the model asks for, a prefix of the op's outputs (compute only those), in `cpu`
    /// and `gpu` alike.
    fn cpu(&self, ins: &[&Tensor], outs: &mut [Tensor], rows: Range<usize>) -> Result<()>;

    /// Describe the GPU dispatches (usually one) that compute `rows` of the outputs, or say why
    /// this node cannot run on the GPU (`Unsupported` with the reason: the runtime reports it,
    /// never silently). The runtime zero-fills output buffers before the first dispatch.
    fn gpu(
        &self,
        ins: &[&TensorMeta],
        outs: &[TensorMeta],
        rows: Range<usize>,
    ) -> Result<Vec<GpuKernel>>;
}

/// Inputs with output 0's shape: what an elementwise op reads row for row (its
/// [`Op::row_local`]); broadcast inputs read other rows and are left out.
pub fn same_shape_inputs(ins: &[&TensorMeta], outs: &[TensorMeta]) -> Vec<usize> {
    (0..ins.len())
        .filter(|&i| outs.first().is_some_and(|o| ins[i].shape == o.shape))
        .collect()
}
