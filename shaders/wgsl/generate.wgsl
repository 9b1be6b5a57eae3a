// generate: outputs computed from params, for output elements [params.start, params.start +
// params.count), as 4-byte words. op 0 fill: out = params.value (ConstantOfShape, Dropout mask);
// op 1 range f32: out = f_start + f32(i) * f_delta; op 2 range i32: out = i_start + i * i_delta;
// op 3 Trilu: out = src where (col - row >= k) when upper, (col - row <= k) otherwise, else 0,
// over matrices of `rows` x `cols`, k = aux[0] when k_input is set (the run-time k input); op 4 table: out = table[i] (Shape, Size: at most 16 words);
// op 5 EyeLike: out = params.value where col - row == k, else 0.
// Bindings: 0 src (read; only Trilu reads it, the others bind any input), 1 aux (read, i32;
// Trilu's k input, else any input), 2 out (read_write), 3 params. Overrides: WG.

override WG: u32 = 64u;

struct Params {
    op: u32,
    start: u32,
    count: u32,
    value: u32,
    f_start: f32,
    f_delta: f32,
    i_start: i32,
    i_delta: i32,
    rows: u32,
    cols: u32,
    k: i32,
    upper: u32,
    k_input: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    table: array<vec4<u32>, 4>,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read> aux: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let v = params.start + i;
    switch params.op {
        case 0u: {
            out[v] = params.value;
        }
        case 1u: {
            out[v] = bitcast<u32>(params.f_start + f32(v) * params.f_delta);
        }
        case 2u: {
            out[v] = bitcast<u32>(params.i_start + i32(v) * params.i_delta);
        }
        case 3u, 5u: {
            let col = i32(v % params.cols);
            let row = i32((v / params.cols) % params.rows);
            let diag = col - row;
            var k = params.k;
            if (params.k_input != 0u) {
                k = aux[0];
            }
            if (params.op == 5u) {
                out[v] = select(0u, params.value, diag == k);
            } else {
                let keep = select(diag <= k, diag >= k, params.upper != 0u);
                out[v] = select(0u, src[v], keep);
            }
        }
        default: {
            out[v] = params.table[v / 4u][v % 4u];
        }
    }
}
