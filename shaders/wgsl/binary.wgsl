// binary: out[i] = f(a[ia], b[ib]) with numpy broadcasting (rank <= 8), for output elements
// i in [params.start, params.start + params.count); f is the override OP (the BinaryKind codes
// of ops/src/binary.rs: Add, Sub, Mul, Div, Pow, Max, Min, Mod, Fmod, PRelu, comparisons, logic).
// MODE: 0 = f32 operands, 1 = i32 operands, 2 = bool (u32) operands. Comparisons write
// bool (u32 0/1). Elements are bound as u32 and bitcast.
// FLAGS: bit 0 = a is the output itself (fold of variadic Sum/Mean/Max/Min, Clip), bit 1
// = b is of the other numeric kind (Pow: i32 exponent of an f32 base in mode 0, f32 exponent of
// an i32 base in mode 1), bit 2 = divide the result by params.divisor (Mean), bits 4/5 = wrap
// integer results to i8/u8 (held as i32). RANK: the number of output dims after merging those
// every operand walks as one (>= 1; same-shape operands: one dim of stride 1).
// OP, MODE, FLAGS and RANK are overrides, not params, so each kind compiles to its own pipeline
// with the others' code and the broadcast loop's bounds folded away: lavapipe ran every case of
// a run-time switch (a bias Add ~3x slower than with them known).
// Bindings: 0 a (read), 1 b (read), 2 out (read_write), 3 params. Overrides: WG, OP, MODE,
// FLAGS, RANK.

override WG: u32 = 64u;
override OP: u32;
override MODE: u32;
override FLAGS: u32;
override RANK: u32;

struct Params {
    start: u32,
    count: u32,
    divisor: f32,
    _pad: u32,
    dims: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

// Mantissa of a finite non-zero |v| (bits `u`) as a 24-bit integer, and its exponent (below 1 for
// subnormals, which are normalised).
fn fmod_parts(u: u32) -> vec2<i32> {
    var e = i32(u >> 23u);
    if (e == 0) {
        var i = u << 9u;
        loop {
            if ((i >> 31u) != 0u) {
                break;
            }
            e = e - 1;
            i = i << 1u;
        }
        return vec2<i32>(bitcast<i32>(u << u32(1 - e)), e);
    }
    return vec2<i32>(bitcast<i32>((u & 0x7fffffu) | 0x800000u), e);
}

// C fmod on the bits (musl's fmodf): exact, with the sign of x; x for an infinite y; NaN for a
// zero y or an infinite x. Float arithmetic (x - y * trunc(x / y)) is off by one y when x / y
// rounds up to an integer, and lavapipe's fma is not fused, so it cannot repair that.
fn fmod_f(x: f32, y: f32) -> f32 {
    let sx = bitcast<u32>(x) & 0x80000000u;
    let ux = bitcast<u32>(x) & 0x7fffffffu;
    let uy = bitcast<u32>(y) & 0x7fffffffu;
    if (uy == 0u || ux >= 0x7f800000u || uy > 0x7f800000u) {
        return nan_f32();
    }
    if (ux < uy) {
        return x;
    }
    if (ux == uy) {
        return bitcast<f32>(sx);
    }
    let px = fmod_parts(ux);
    let py = fmod_parts(uy);
    var mx = u32(px.x);
    let my = u32(py.x);
    var ex = px.y;
    loop {
        if (ex <= py.y) {
            break;
        }
        if (mx >= my) {
            mx = mx - my;
            if (mx == 0u) {
                return bitcast<f32>(sx);
            }
        }
        mx = mx << 1u;
        ex = ex - 1;
    }
    if (mx >= my) {
        mx = mx - my;
        if (mx == 0u) {
            return bitcast<f32>(sx);
        }
    }
    loop {
        if ((mx >> 23u) != 0u) {
            break;
        }
        mx = mx << 1u;
        ex = ex - 1;
    }
    if (ex > 0) {
        mx = (mx - 0x800000u) | (u32(ex) << 23u);
    } else {
        mx = mx >> u32(1 - ex);
    }
    return bitcast<f32>(mx | sx);
}

fn float_op(x: f32, y: f32) -> u32 {
    var r: f32;
    switch OP {
        case 0u: { r = x + y; }
        case 1u: { r = x - y; }
        case 2u: { r = x * y; }
        case 3u: { r = x / y; }
        case 4u: { r = pow_f(x, y); }
        case 5u: { r = select(y, x, x > y || is_nan(x)); }
        case 6u: { r = select(y, x, x < y || is_nan(x)); }
        // Mod, sign of the divisor, from the exact fmod: `x % y` is off by one y where `/` is
        // approximate (NVIDIA: 3.87 for a multiple of 3.87).
        case 7u: {
            let t = fmod_f(x, y);
            r = select(t, t + y, t != 0.0 && ((t < 0.0) != (y < 0.0)));
        }
        case 8u: { r = fmod_f(x, y); }
        case 9u: { r = select(x, x * y, x < 0.0); }
        case 10u: { return select(0u, 1u, x == y); }
        case 11u: { return select(0u, 1u, x < y); }
        case 12u: { return select(0u, 1u, x > y); }
        case 13u: { return select(0u, 1u, x <= y); }
        case 14u: { return select(0u, 1u, x >= y); }
        default: { r = x; } // First
    }
    if ((FLAGS & 4u) != 0u) {
        r = r / params.divisor;
    }
    return bitcast<u32>(r);
}

fn pow_i(x: i32, y: i32) -> i32 {
    if (y < 0) {
        if (x == 1) {
            return 1;
        }
        if (x == -1) {
            return select(-1, 1, (y & 1) == 0);
        }
        return 0;
    }
    var base = x;
    var e = u32(y);
    var r = 1;
    loop {
        if (e == 0u) {
            break;
        }
        if ((e & 1u) == 1u) {
            r = r * base;
        }
        base = base * base;
        e = e >> 1u;
    }
    return r;
}

fn int_op(x: i32, y: i32) -> u32 {
    var r: i32;
    switch OP {
        case 0u: { r = x + y; }
        case 1u: { r = x - y; }
        case 2u: { r = x * y; }
        case 3u: { r = select(x / y, 0, y == 0); }
        case 4u: { r = pow_i(x, y); }
        case 5u: { r = max(x, y); }
        case 6u: { r = min(x, y); }
        case 7u: {
            let t = select(x % y, 0, y == 0);
            r = select(t, t + y, t != 0 && ((t < 0) != (y < 0)));
        }
        case 8u: { r = select(x % y, 0, y == 0); }
        case 9u: { r = select(x, x * y, x < 0); }
        case 10u: { return select(0u, 1u, x == y); }
        case 11u: { return select(0u, 1u, x < y); }
        case 12u: { return select(0u, 1u, x > y); }
        case 13u: { return select(0u, 1u, x <= y); }
        case 14u: { return select(0u, 1u, x >= y); }
        default: { r = x; }
    }
    return bitcast<u32>(wrap(r));
}

// Integer results of i8/u8 tensors wrap like their host type.
fn wrap(r: i32) -> i32 {
    if ((FLAGS & 16u) != 0u) {
        return (r << 24u) >> 24u;
    }
    if ((FLAGS & 32u) != 0u) {
        return r & 0xff;
    }
    return r;
}

// Integer base, float exponent: exact for integral exponents, else truncated float pow.
fn pow_int_float(x: i32, y: f32) -> u32 {
    if (floor(y) == y && abs(y) < 2147483647.0) {
        return bitcast<u32>(wrap(pow_i(x, i32(y))));
    }
    return bitcast<u32>(wrap(i32(pow_f(f32(x), y))));
}

fn bool_op(x: bool, y: bool) -> u32 {
    switch OP {
        case 10u: { return select(0u, 1u, x == y); }
        case 15u: { return select(0u, 1u, x && y); }
        case 16u: { return select(0u, 1u, x || y); }
        case 17u: { return select(0u, 1u, x != y); }
        default: { return select(0u, 1u, x); }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let j = params.start + i;
    // Coordinates over the (merged) output dims, innermost first; the outermost needs no
    // division: what is left of j is below its length.
    var rem = j;
    var ia = 0u;
    var ib = 0u;
    for (var k = RANK - 1u; k > 0u; k = k - 1u) {
        let len = params.dims[k / 4u][k % 4u];
        let c = rem % len;
        rem = rem / len;
        ia = ia + c * params.a_strides[k / 4u][k % 4u];
        ib = ib + c * params.b_strides[k / 4u][k % 4u];
    }
    ia = ia + rem * params.a_strides[0].x;
    ib = ib + rem * params.b_strides[0].x;
    var xa: u32;
    if ((FLAGS & 1u) != 0u) {
        xa = out[j];
    } else {
        xa = a[ia];
    }
    let xb = b[ib];
    var r: u32;
    if (MODE == 0u) {
        var y = bitcast<f32>(xb);
        if ((FLAGS & 2u) != 0u) {
            y = f32(bitcast<i32>(xb));
        }
        r = float_op(bitcast<f32>(xa), y);
    } else if (MODE == 1u) {
        if ((FLAGS & 2u) != 0u) {
            r = pow_int_float(bitcast<i32>(xa), bitcast<f32>(xb));
        } else {
            r = int_op(bitcast<i32>(xa), bitcast<i32>(xb));
        }
    } else {
        r = bool_op(xa != 0u, xb != 0u);
    }
    out[j] = r;
}
