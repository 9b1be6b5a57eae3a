// softmax: Softmax / LogSoftmax / Hardmax over lanes of a [outer, n, inner] tensor. One invocation per
// lane l in [params.first_lane, params.first_lane + params.lanes): o = l / inner, j = l % inner,
// elements x[o * n * inner + k * inner + j] for k in 0..n. Three passes: max, sum of
// exp(x - max), write. MODE 0: exp(x - max) / sum; 1: (x - max) - ln(sum); 2 (Hardmax): 1 at
// the first maximum, 0 elsewhere. MODE is an override (lavapipe runs both sides of a branch on a
// uniform value). Softmax and LogSoftmax lanes of at most CACHED elements read each element
// once into a local array and take each exp once (`cached`): on lavapipe yolov8n's DFL softmax
// (16 elements, 8400 lanes) took 10.9 ms in the three passes, 1.0 ms so.
// Bindings: 0 x (f32, read), 1 y (f32, read_write), 2 params. Overrides: WG, MODE.

override WG: u32 = 64u;
override MODE: u32;

struct Params {
    n: u32,
    inner: u32,
    first_lane: u32,
    lanes: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

const CACHED: u32 = 32u;

// Softmax (MODE 0) or LogSoftmax (MODE 1) of the lane of n <= CACHED elements from `base`. A
// NaN element or an infinite max makes the lane NaN, tested on the bits (float_bits.wgsl): on
// lavapipe a lone NaN came out as 1 through the arithmetic alone.
fn cached(base: u32, n: u32, inner: u32) {
    var v: array<f32, CACHED>;
    var m = x[base];
    // 0 times each element but its -inf (a run-time 0, which the compiler cannot fold): NaN
    // where an element is NaN or +inf. A plain sum overflowed (3e38 + 3e38 - inf), and a test
    // per element on the bits took the kernel to 18-25 ms from 1.0.
    let zero = f32(n >> 31u);
    var t = 0.0;
    for (var k = 0u; k < n; k = k + 1u) {
        v[k] = x[base + k * inner];
        m = select(m, v[k], v[k] > m);
        t = t + select(v[k], 0.0, v[k] < 0.0) * zero;
    }
    let nan = is_nan(t) || (bitcast<u32>(m) & 0x7fffffffu) == 0x7f800000u;
    // Softmax keeps the exps in v, LogSoftmax the elements less the max (less log(sum) after:
    // `v - (m + log(sum))` lost log(sum) beside a max of 3e38)
    var s = 0.0;
    for (var k = 0u; k < n; k = k + 1u) {
        let d = v[k] - m;
        let e = exp(d);
        s = s + e;
        v[k] = select(e, d, MODE == 1u);
    }
    // the factor (Softmax) or the offset (LogSoftmax) of every element: NaN for a NaN lane
    let c = select(select(1.0 / s, log(s), MODE == 1u), nan_f32(), nan);
    for (var k = 0u; k < n; k = k + 1u) {
        y[base + k * inner] = select(v[k] * c, v[k] - c, MODE == 1u);
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.lanes) {
        return;
    }
    let l = params.first_lane + i;
    let inner = params.inner;
    let n = params.n;
    let base = (l / inner) * n * inner + l % inner;
    if (MODE != 2u && n <= CACHED) {
        cached(base, n, inner);
        return;
    }

    var m = x[base];
    var at = 0u;
    for (var k = 1u; k < n; k = k + 1u) {
        let v = x[base + k * inner];
        if (v > m) {
            m = v;
            at = k;
        }
    }
    if (MODE == 2u) {
        for (var k = 0u; k < n; k = k + 1u) {
            y[base + k * inner] = select(0.0, 1.0, k == at);
        }
        return;
    }
    // No fix-up for an infinite max: a lane with +inf (or only -inf) gives NaN everywhere, like
    // the CPU kernel and onnxruntime (README.md, "Numerics").
    var s = 0.0;
    for (var k = 0u; k < n; k = k + 1u) {
        s = s + exp(x[base + k * inner] - m);
    }
    if (MODE == 1u) {
        let c = log(s);
        for (var k = 0u; k < n; k = k + 1u) {
            let at = base + k * inner;
            y[at] = (x[at] - m) - c;
        }
    } else {
        let r = 1.0 / s;
        for (var k = 0u; k < n; k = k + 1u) {
            let at = base + k * inner;
            y[at] = exp(x[at] - m) * r;
        }
    }
}
