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
    /// pipeline cache key: keep the set of distinct values small (an op code, a mode, a rank).
    pub overrides: Vec<(&'static str, f64)>,
    /// Which op inputs are bound, in binding order (inputs read only at plan time are left out).
    pub inputs: Vec<usize>,
    /// Which op outputs are bound, in binding order (usually `vec![0]`).
    pub outputs: Vec<usize>,
    /// Bytes of the shader's `Params` struct (a `#[repr(C)]` `bytemuck::Pod`).
    pub params: Vec<u8>,
    /// Workgroup counts, each at most 65535 (use [`crate::shape::grid_1d`]).
    pub workgroups: [u32; 3],
    /// The same dispatch laid out for an adapter that runs shaders on the CPU (lavapipe,
    /// SwiftShader, WARP: device type Cpu), which the runtime dispatches there instead. Such
    /// an adapter runs a workgroup's invocations as SIMD lanes on a few cores, so it needs few
    /// invocations, and each load of a storage buffer is a per-lane gather: a bigger register
    /// tile per invocation (fewer loads per FMA) wins there, where a GPU would lose occupancy.
    /// It binds the same inputs and outputs.
    pub on_cpu_adapter: Option<Box<GpuKernel>>,
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
            on_cpu_adapter: None,
        }
    }

    pub fn with_override(mut self, name: &'static str, value: f64) -> GpuKernel {
        self.overrides.push((name, value));
        self
    }

    /// The value this kernel gives override `name`, if it gives one.
    pub fn override_value(&self, name: &str) -> Option<f64> {
        self.overrides.iter().find(|(n, _)| *n == name).map(|o| o.1)
    }

    /// This kernel, with `variant` to run instead on an adapter of device type Cpu
    /// ([`GpuKernel::on_cpu_adapter`]).
    pub fn with_cpu_adapter_variant(mut self, variant: GpuKernel) -> GpuKernel {
        debug_assert!(variant.inputs == self.inputs && variant.outputs == self.outputs);
        self.on_cpu_adapter = Some(Box::new(variant));
        self
    }

    /// The kernel to dispatch on an adapter that runs shaders on the CPU (`cpu_adapter`) or
    /// on a GPU.
    pub fn for_adapter(&self, cpu_adapter: bool) -> &GpuKernel {
        match &self.on_cpu_adapter {
            Some(v) if cpu_adapter => v,
            _ => self,
        }
    }
}
