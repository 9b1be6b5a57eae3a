// cast: out[i] = convert(x[i]) for i in [params.start, params.start + params.count), between the
// GPU element kinds: f32 (also holding f16/f64 values), i32 (also holding i64/i8/u8 values) and
// bool (u32 0/1). Float to integer truncates toward zero; to bool is x != 0.
// SRC: 0 = f32, 1 = i32, 2 = bool.
// DST: 0 = f32, 1 = f32 rounded to f16 precision, 2 = i32, 3 = i8 (wraps), 4 = u8 (wraps),
// 5 = bool.
// SRC and DST are overrides, not params: lavapipe runs every case of a switch on a uniform value.
// Bindings: 0 x (read), 1 out (read_write), 2 params. Overrides: WG (workgroup size), SRC, DST.

override WG: u32 = 64u;
override SRC: u32;
override DST: u32;

struct Params {
    start: u32,
    count: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

fn from_float(v: f32) -> u32 {
    switch DST {
        case 0u: { return bitcast<u32>(v); }
        case 1u: { return bitcast<u32>(unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x); }
        case 2u: { return bitcast<u32>(i32(v)); }
        case 3u: { return bitcast<u32>((i32(v) << 24u) >> 24u); }
        case 4u: { return bitcast<u32>(i32(v)) & 0xffu; }
        default: { return select(0u, 1u, v != 0.0 || (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u); }
    }
}

fn from_int(v: i32) -> u32 {
    switch DST {
        case 0u: { return bitcast<u32>(f32(v)); }
        case 1u: { return bitcast<u32>(unpack2x16float(pack2x16float(vec2<f32>(f32(v), 0.0))).x); }
        case 2u: { return bitcast<u32>(v); }
        case 3u: { return bitcast<u32>((v << 24u) >> 24u); }
        case 4u: { return bitcast<u32>(v) & 0xffu; }
        default: { return select(0u, 1u, v != 0); }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let j = params.start + i;
    let bits = x[j];
    if (SRC == 0u) {
        out[j] = from_float(bitcast<f32>(bits));
    } else if (SRC == 1u) {
        out[j] = from_int(bitcast<i32>(bits));
    } else {
        out[j] = from_int(select(0, 1, bits != 0u));
    }
}
