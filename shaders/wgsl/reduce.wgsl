// reduce: one invocation per output element e, folding every input that maps to e in order
// (reduce_common.wgsl, prepended, has the params, the bindings and the fold; reduce.rs takes
// reduce_wide.wgsl instead where one invocation would fold too many). Override: WG.

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let e = params.start + i;
    let base = base_offset(e);
    let inf = bitcast<f32>(params.inf_bits);
    let op = OP;
    let n = params.n;

    if (op == 9u || op == 10u) {
        var best = x[base + reduced_offset(0u)];
        var at = 0u;
        // The first NaN is the extreme (numpy), as NaN wins in ReduceMax/ReduceMin.
        for (var r = 1u; r < n && !is_nan(best); r = r + 1u) {
            let v = x[base + reduced_offset(r)];
            if (is_nan(v)) {
                at = r;
                break;
            }
            if (arg_better(v, best, op)) {
                best = v;
                at = r;
            }
        }
        out[e] = at;
        return;
    }

    var acc = fold_start(op, inf);
    var m = -inf;
    fold_inputs(&acc, &m, base, 0u, 1u, n, op, inf);
    out[e] = bitcast<u32>(fold_end(acc, m, n, op, inf));
}
