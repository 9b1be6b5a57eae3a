// tile_staging: the workgroup memory and inner step that conv_tiled.wgsl and matmul_tiled.wgsl
// share: a 16 x 16 workgroup computes a 64 x 64 output tile, each invocation (lid.y, lid.x)
// rows 4 lid.y .. + 3 by columns 4 lid.x .. + 3, over steps of KT k. Per step every
// invocation stages 4 values of the tile's rows (W's channels, A's rows) and 4 of its columns
// (X's pixels, B's columns) with stage_row and stage_col, then calls accumulate.

const TILE: u32 = 64u;
const KT: u32 = 16u;

// rows_staged[k * 16 + q]: step row k of the tile's rows 4 q .. 4 q + 3;
// cols_staged[k * 16 + q]: step row k of the tile's columns 4 q .. 4 q + 3.
var<workgroup> rows_staged: array<vec4<f32>, 256>;
var<workgroup> cols_staged: array<vec4<f32>, 256>;

fn stage_row(k: u32, r: u32, v: f32) {
    rows_staged[k * 16u + r / 4u][r % 4u] = v;
}

fn stage_col(k: u32, c: u32, v: f32) {
    cols_staged[k * 16u + c / 4u][c % 4u] = v;
}

// Once the step is staged: adds it to the invocation's accumulators (acc[i]: row 4 lid.y + i,
// its 4 columns), then waits until every invocation has, so the next step may be staged.
fn accumulate(acc: ptr<function, array<vec4<f32>, 4>>, lid: vec3<u32>) {
    workgroupBarrier();
    for (var k = 0u; k < KT; k = k + 1u) {
        let rv = rows_staged[k * 16u + lid.y];
        let cv = cols_staged[k * 16u + lid.x];
        (*acc)[0] = fma(vec4<f32>(rv.x), cv, (*acc)[0]);
        (*acc)[1] = fma(vec4<f32>(rv.y), cv, (*acc)[1]);
        (*acc)[2] = fma(vec4<f32>(rv.z), cv, (*acc)[2]);
        (*acc)[3] = fma(vec4<f32>(rv.w), cv, (*acc)[3]);
    }
    workgroupBarrier();
}
