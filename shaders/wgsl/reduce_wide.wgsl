// reduce_wide: one workgroup of WIDE invocations per output element e (reduce_common.wgsl,
// prepended, has the params, the bindings and the fold), for folds longer than one invocation
// may take within llvmpipe's loop budget: invocation t folds inputs t, t + WIDE, t + 2 WIDE, ...
// (four a round), then the partial folds combine in pairs in workgroup memory, log2(WIDE)
// steps; a sum's order differs from reduce.wgsl's. ArgMax/ArgMin scan the same way and
// combine (value, index) pairs: the first NaN, else the extreme, a tie to the first index (the
// last with select_last), as the one-invocation scan picks.
// Workgroups form a 2-D grid: element i = wid.x + wid.y * nwg.x.

const WIDE: u32 = 64u;
// The index of an invocation that scanned nothing.
const NONE: u32 = 0xffffffffu;

var<workgroup> part_acc: array<f32, 64>;
var<workgroup> part_m: array<f32, 64>;
var<workgroup> part_at: array<u32, 64>;

// Partial fold t + s into partial fold t (ops 0-8, 11): each is the fold of its inputs,
// fold_start's value where it had none. Max, min and product fold b as one more input
// (fold's NaN rules); sums of the partial terms add.
fn combine(t: u32, s: u32, op: u32, inf: f32) {
    let a = part_acc[t];
    let b = part_acc[t + s];
    if (op == 2u || op == 3u || op == 4u) {
        var acc = a;
        var unused = 0.0;
        fold(&acc, &unused, b, op, inf);
        part_acc[t] = acc;
    } else if (op == 8u) {
        // Log-sum-exp: sums of exp(v - m) under shifts ma and mb.
        let ma = part_m[t];
        let mb = part_m[t + s];
        if (is_nan(ma) || is_nan(mb)) {
            part_m[t] = nan_f32();
            part_acc[t] = part_m[t];
        } else if (ma == -inf) {
            part_m[t] = mb;
            part_acc[t] = b;
        } else if (mb == -inf) {
            // b folded only -inf: a stands.
        } else if (ma == inf || mb == inf) {
            part_m[t] = inf; // fold_end returns m
        } else if (mb > ma) {
            part_acc[t] = a * exp(ma - mb) + b;
            part_m[t] = mb;
        } else {
            part_acc[t] = a + b * exp(mb - ma);
        }
    } else {
        part_acc[t] = a + b;
    }
}

// Partial scan t + s into partial scan t (ops 9, 10).
fn arg_combine(t: u32, s: u32, op: u32) {
    let a = part_acc[t];
    let b = part_acc[t + s];
    let ia = part_at[t];
    let ib = part_at[t + s];
    var take = false;
    if (ib == NONE) {
        take = false;
    } else if (ia == NONE) {
        take = true;
    } else if (is_nan(a) || is_nan(b)) {
        take = is_nan(b) && (!is_nan(a) || ib < ia);
    } else if (a == b) {
        take = (params.select_last != 0u) == (ib > ia);
    } else if (op == 9u) {
        take = b > a;
    } else {
        take = b < a;
    }
    if (take) {
        part_acc[t] = b;
        part_at[t] = ib;
    }
}

@compute @workgroup_size(64)
fn main(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = wid.x + wid.y * nwg.x;
    if (i >= params.count) {
        return; // the whole workgroup
    }
    let t = lid.x;
    let e = params.start + i;
    let base = base_offset(e);
    let inf = bitcast<f32>(params.inf_bits);
    let op = OP;
    let n = params.n;

    if (op == 9u || op == 10u) {
        var best = 0.0;
        var at = NONE;
        for (var r = t; r < n; r = r + WIDE) {
            let v = x[base + reduced_offset(r)];
            if (at == NONE || is_nan(v) || arg_better(v, best, op)) {
                best = v;
                at = r;
            }
            if (is_nan(v)) {
                break; // the first NaN of this invocation's inputs
            }
        }
        part_acc[t] = best;
        part_at[t] = at;
    } else {
        var acc = fold_start(op, inf);
        var m = -inf;
        fold_inputs(&acc, &m, base, t, WIDE, n, op, inf);
        part_acc[t] = acc;
        part_m[t] = m;
    }
    workgroupBarrier();
    for (var s = WIDE / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            if (op == 9u || op == 10u) {
                arg_combine(t, s, op);
            } else {
                combine(t, s, op, inf);
            }
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        if (op == 9u || op == 10u) {
            out[e] = part_at[0];
        } else {
            out[e] = bitcast<u32>(fold_end(part_acc[0], part_m[0], n, op, inf));
        }
    }
}
