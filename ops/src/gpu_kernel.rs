//! The description of one GPU dispatch, produced by an operator and run by the runtime's GPU layer.
//!
//! Sits between the operators (which know their shader, overrides and parameters) and
//! `tandem::gpu` (which owns devices, buffers and pipelines). No wgpu types here.

use tandem_shaders::Shader;

/// One compute dispatch. Bindings (group 0): `inputs` (op input indices, in binding order),
/// then `outputs` (op output indices, in binding order), then the `params` uniform. An op may
/// need several dispatches (Concat: one per input; Split: one per output); they run in order.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuKernel {
    pub shader: Shader,
    /// Pipeline-overridable constants (`override` in WGSL), e.g. `("WG", 64.0)`. Part of the
    /// pipeline cache key: keep the set of distinct values small.
    pub overrides: Vec<(&'static str, f64)>,
    /// Which op inputs are bound, in binding order (inputs read only at plan time are left out).
    pub inputs: Vec<usize>,
    /// Which op outputs are bound, in binding order (usually `vec![0]`).
    pub outputs: Vec<usize>,
    /// Bytes of the shader's `Params` struct (a `#[repr(C)]` `bytemuck::Pod`).
    pub params: Vec<u8>,
    /// Workgroup counts, each at most 65535 (use [`crate::shape::grid_1d`]).
    pub workgroups: [u32; 3],
}

impl GpuKernel {
    /// A kernel binding op inputs `inputs` and op outputs `outputs`, with `params` as its uniform.
    pub fn new<P: bytemuck::Pod>(
        shader: Shader,
        inputs: Vec<usize>,
        outputs: Vec<usize>,
        params: &P,
        workgroups: [u32; 3],
    ) -> GpuKernel {
        let params = bytemuck::bytes_of(params).to_vec();
        assert!(
            params.len().is_multiple_of(16),
            "{}: Params must be padded to a multiple of 16 bytes (uniform layout)",
            shader.name
        );
        GpuKernel {
            shader,
            overrides: Vec::new(),
            inputs,
            outputs,
            params,
            workgroups,
        }
    }

    pub fn with_override(mut self, name: &'static str, value: f64) -> GpuKernel {
        self.overrides.push((name, value));
        self
    }
}
