// copy: out[i] = src[i] for i in [params.start, params.start + params.count).
// Bindings: 0 src (read), 1 out (read_write), 2 params. Overrides: WG (workgroup size).
// Used for views that must materialise and for row-range joins on the GPU.

override WG: u32 = 64u;

struct Params {
    start: u32,
    count: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let j = params.start + i;
    out[j] = src[j];
}
