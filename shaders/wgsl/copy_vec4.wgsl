// copy_vec4: out[out_first + i] = src[src_first + i] for vec4s i < params.count: index_map.wgsl's
// result where its map is one contiguous run whose ends are whole vec4s of both buffers
// (Concat's inputs along an outer axis, Split's outputs, Slices of whole rows), on adapters
// that run shaders on the CPU, where each storage load or store is a loop over the lanes: four
// words a loop instead of one, and no index arithmetic. Words are raw 4-byte elements.
// Bindings: 0 src (read), 1 out (read_write), 2 params. Overrides: WG (workgroup size).

override WG: u32 = 64u;

struct Params {
    src_first: u32,
    out_first: u32,
    count: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<u32>>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    out[params.out_first + i] = src[params.src_first + i];
}
