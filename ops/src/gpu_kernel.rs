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
    /// The same work laid out as dispatches for an adapter that runs shaders on the CPU
    /// (lavapipe, SwiftShader, WARP: device type Cpu), which the runtime dispatches there
    /// instead, in order (Conv: one per window of its weights, `uniform_window`). Such
    /// an adapter runs a workgroup's invocations as SIMD lanes on a few cores, so it needs few
    /// invocations, and each load of a storage buffer is a per-lane gather: a bigger register
    /// tile per invocation (fewer loads per FMA) wins there, where a GPU would lose occupancy.
    /// They bind the same inputs and outputs; empty: this kernel runs there too.
    pub on_cpu_adapter: Vec<GpuKernel>,
    /// Input `inputs[binding]`'s elements `first .. first + len`, which the runtime copies into
    /// a uniform buffer of [`UNIFORM_WINDOW_BYTES`] and binds instead of the tensor (the shader
    /// declares that binding `var<uniform>`, an array of that size). On an adapter that runs
    /// shaders on the CPU a uniform load is a vector load, where a storage load is a per-lane
    /// loop with a bounds check.
    pub uniform_window: Option<UniformWindow>,
    /// Positions in `inputs` (bindings) of inputs the runtime copies whole into an rgba32uint
    /// texture [`TEXTURE_WIDTH`] texels wide each, vec4 `i` at texel
    /// `(i % TEXTURE_WIDTH, i / TEXTURE_WIDTH)`, and binds instead (the shader declares those
    /// bindings `texture_2d<u32>`). On an adapter that runs shaders on the CPU a texel fetch at
    /// indices that differ between lanes is a gather, where a storage load is a per-lane loop.
    pub texture_inputs: Vec<usize>,
}

/// Texels a row of the texture of a [`GpuKernel::texture_inputs`] entry (16 KiB of rgba32uint: a
/// multiple of the 256 bytes a buffer-to-texture copy's rows must be).
pub const TEXTURE_WIDTH: usize = 1024;

/// Rows of such a texture at most: WebGPU's least `maxTextureDimension2D`, so every adapter with
/// the default limits creates it (8M vec4s, 128 MiB).
pub const TEXTURE_MAX_ROWS: usize = 8192;

/// Bytes of the uniform buffer a [`UniformWindow`] is copied into: WebGPU's least
/// `maxUniformBufferBindingSize` (64 KiB), so every adapter with the default limits binds it.
pub const UNIFORM_WINDOW_BYTES: usize = 65536;

/// Part of an input bound as a uniform buffer ([`GpuKernel::uniform_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniformWindow {
    /// The position in [`GpuKernel::inputs`] (the binding) it replaces.
    pub binding: usize,
    /// Its first element of the input and its element count (`len * 4` at most
    /// [`UNIFORM_WINDOW_BYTES`]).
    pub first: usize,
    pub len: usize,
}

/// Whether kernels for adapters that run shaders on the CPU read their big operands from
/// textures ([`GpuKernel::texture_inputs`]: MatMul's B, attention's Kt and V, Conv's X);
/// `TANDEM_GPU_TEXTURES=0` keeps them storage buffers.
pub fn textures_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_GPU_TEXTURES").as_deref() != Ok("0"))
}

/// Whether GPUs run Conv and MatMul through tiles staged in workgroup memory
/// (`conv_tiled.wgsl`, `matmul_tiled.wgsl`) where they fit; `TANDEM_GPU_TILED=0` keeps the
/// register-tiled kernels (`conv.wgsl`, `matmul.wgsl`), to measure one against the other.
pub fn tiled_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_GPU_TILED").as_deref() != Ok("0"))
}

/// Whether an operand of `elems` elements is read from a texture: textures are on and it fits
/// one ([`TEXTURE_MAX_ROWS`] rows of [`TEXTURE_WIDTH`] vec4s).
pub fn texture_fits(elems: usize) -> bool {
    textures_enabled() && elems <= 4 * TEXTURE_WIDTH * TEXTURE_MAX_ROWS
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
            on_cpu_adapter: Vec::new(),
            uniform_window: None,
            texture_inputs: Vec::new(),
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

    /// This kernel, binding `window` as a uniform buffer ([`GpuKernel::uniform_window`]).
    pub fn with_uniform_window(mut self, window: UniformWindow) -> GpuKernel {
        debug_assert!(window.binding < self.inputs.len() && window.len * 4 <= UNIFORM_WINDOW_BYTES);
        self.uniform_window = Some(window);
        self
    }

    /// This kernel, binding inputs `bindings` as textures ([`GpuKernel::texture_inputs`]).
    pub fn with_texture_inputs(mut self, bindings: &[usize]) -> GpuKernel {
        debug_assert!(bindings.iter().all(|&b| b < self.inputs.len()));
        self.texture_inputs = bindings.to_vec();
        self
    }

    /// This kernel, with `variants` to dispatch instead, in order, on an adapter of device
    /// type Cpu ([`GpuKernel::on_cpu_adapter`]).
    pub fn with_cpu_adapter_variants(mut self, variants: Vec<GpuKernel>) -> GpuKernel {
        debug_assert!(variants
            .iter()
            .all(|v| v.inputs == self.inputs && v.outputs == self.outputs));
        self.on_cpu_adapter = variants;
        self
    }

    /// [`GpuKernel::with_cpu_adapter_variants`] with one variant.
    pub fn with_cpu_adapter_variant(self, variant: GpuKernel) -> GpuKernel {
        self.with_cpu_adapter_variants(vec![variant])
    }

    /// The kernels to dispatch, in order, on an adapter that runs shaders on the CPU
    /// (`cpu_adapter`) or on a GPU.
    pub fn for_adapter(&self, cpu_adapter: bool) -> &[GpuKernel] {
        if cpu_adapter && !self.on_cpu_adapter.is_empty() {
            &self.on_cpu_adapter
        } else {
            std::slice::from_ref(self)
        }
    }
}
