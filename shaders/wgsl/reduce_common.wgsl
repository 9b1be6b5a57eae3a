// Prelude of reduce.wgsl (one invocation per output element) and reduce_wide.wgsl (one
// workgroup per output element): what both read and how they fold. Output elements e in
// [params.start, params.start + params.count) each fold the input elements that map to e. The
// input is described as groups of kept dims (kdims/kstr, outermost first: e unravels over them
// to a base offset) and reduced dims (rdims/rstr: r in 0..params.n unravels over them to an
// offset from the base).
// op: 0 sum, 1 mean, 2 max, 3 min, 4 prod, 5 L1, 6 L2, 7 sum of squares, 8 log-sum-exp
// (online max shift), 9 argmax, 10 argmin (select_last: ties pick the last index), 11 log of
// the sum.
// Ops 0-8 and 11 write the f32 bits; 9-10 write an i32 index.
// OP, NK (kept groups) and NR (reduced groups, 1..=8) are overrides, not params: lavapipe runs
// both sides of a branch on a uniform value, so the fold paid for every op's code (two exps of
// log-sum-exp included) and eight groups' divisions per element.
// Bindings: 0 x (f32, read), 1 out (4-byte elements, read_write), 2 params. Overrides: OP, NK,
// NR.
//
// Loop budget: llvmpipe (lavapipe, Mesa's software Vulkan) ends every loop of an invocation
// once all its loops together have gone round 65,535 times (gallivm's
// LP_MAX_TGSI_LOOP_ITERATIONS), silently. So a fold has one loop, without a `switch` inside
// it (lowered to a loop there) or an offset loop per element: offsets are straight-line code,
// and four elements go per round (reduce.rs refuses folds past what that allows).

override OP: u32;
override NK: u32;
override NR: u32;

struct Params {
    kdims: array<vec4<u32>, 2>,
    kstr: array<vec4<u32>, 2>,
    rdims: array<vec4<u32>, 2>,
    rstr: array<vec4<u32>, 2>,
    n: u32,
    start: u32,
    count: u32,
    select_last: u32,
    inf_bits: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

// Kept groups innermost first; the outermost needs no division (what is left of e is below its
// size).
fn base_offset(e: u32) -> u32 {
    var rem = e;
    var off = 0u;
    for (var d = i32(NK) - 1; d > 0; d = d - 1) {
        let size = params.kdims[d / 4][d % 4];
        off = off + (rem % size) * params.kstr[d / 4][d % 4];
        rem = rem / size;
    }
    if (NK > 0u) {
        off = off + rem * params.kstr[0].x;
    }
    return off;
}

// Straight-line over the (at most 8) reduced groups: no loop (see the loop budget above).
fn reduced_offset(r: u32) -> u32 {
    var rem = r;
    var off = 0u;
    for_group(&rem, &off, 7u);
    for_group(&rem, &off, 6u);
    for_group(&rem, &off, 5u);
    for_group(&rem, &off, 4u);
    for_group(&rem, &off, 3u);
    for_group(&rem, &off, 2u);
    for_group(&rem, &off, 1u);
    off = off + rem * params.rstr[0].x; // the outermost: rem is below its size
    return off;
}

fn for_group(rem: ptr<function, u32>, off: ptr<function, u32>, d: u32) {
    if (d < NR) {
        let size = params.rdims[d / 4u][d % 4u];
        *off = *off + (*rem % size) * params.rstr[d / 4u][d % 4u];
        *rem = *rem / size;
    }
}

// One input into the fold of op (not 9, 10): acc, and m for log-sum-exp. An if-chain, not a
// `switch` (see the loop budget above).
fn fold(acc: ptr<function, f32>, m: ptr<function, f32>, v: f32, op: u32, inf: f32) {
    if (op == 2u) {
        if ((v > *acc || is_nan(v)) && !is_nan(*acc)) { *acc = v; }
    } else if (op == 3u) {
        if ((v < *acc || is_nan(v)) && !is_nan(*acc)) { *acc = v; }
    } else if (op == 4u) {
        *acc = *acc * v;
    } else if (op == 5u) {
        *acc = *acc + abs(v);
    } else if (op == 6u || op == 7u) {
        *acc = *acc + v * v;
    } else if (op == 8u) {
        if (is_nan(v) || is_nan(*m)) {
            *m = nan_f32(); // NaN wins
            *acc = *m;
        } else if (v > *m) {
            *acc = *acc * exp(*m - v) + 1.0;
            *m = v;
        } else if (v != -inf) {
            *acc = *acc + exp(v - *m);
        }
    } else {
        *acc = *acc + v;
    }
}

// Fold the inputs first, first + step, first + 2 step, ... below n of the output element at
// base into acc (and m, log-sum-exp's shift), in that order, four a loop round (the budget).
fn fold_inputs(
    acc: ptr<function, f32>,
    m: ptr<function, f32>,
    base: u32,
    first: u32,
    step: u32,
    n: u32,
    op: u32,
    inf: f32,
) {
    var r = first;
    for (; r + 3u * step < n; r = r + 4u * step) {
        fold(acc, m, x[base + reduced_offset(r)], op, inf);
        fold(acc, m, x[base + reduced_offset(r + step)], op, inf);
        fold(acc, m, x[base + reduced_offset(r + 2u * step)], op, inf);
        fold(acc, m, x[base + reduced_offset(r + 3u * step)], op, inf);
    }
    if (r < n) {
        fold(acc, m, x[base + reduced_offset(r)], op, inf);
    }
    if (r + step < n) {
        fold(acc, m, x[base + reduced_offset(r + step)], op, inf);
    }
    if (r + 2u * step < n) {
        fold(acc, m, x[base + reduced_offset(r + 2u * step)], op, inf);
    }
}

// The fold's start: acc before any input.
fn fold_start(op: u32, inf: f32) -> f32 {
    if (op == 2u) {
        return -inf;
    } else if (op == 3u) {
        return inf;
    } else if (op == 4u) {
        return 1.0;
    }
    return 0.0;
}

// The output of a fold of n inputs: acc (and m, log-sum-exp's shift) finished.
fn fold_end(acc: f32, m: f32, n: u32, op: u32, inf: f32) -> f32 {
    if (op == 1u) {
        return acc / f32(n);
    } else if (op == 6u) {
        return sqrt(acc);
    } else if (op == 11u) {
        return log(acc);
    } else if (op == 8u) {
        if (m == -inf || m == inf || is_nan(m)) {
            return m;
        }
        return log(acc) + m;
    }
    return acc;
}

// Whether an ArgMax (op 9) or ArgMin (10) scan moves from best to v, a later input (NaN is
// handled by the scans).
fn arg_better(v: f32, best: f32, op: u32) -> bool {
    if (op == 9u) {
        return v > best || (params.select_last != 0u && v == best);
    }
    return v < best || (params.select_last != 0u && v == best);
}
