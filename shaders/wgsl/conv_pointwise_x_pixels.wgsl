// conv_pointwise_x_pixels: conv_pointwise.wgsl's X (binding 0) read a float a pixel, at input
// pixel (oy sh, ox sw): 1x1s of stride 2, or on planes that are not whole vec4s (7 x 7), whose
// every output pixel reads a pixel of X (no pads in effect; the host checks it). Where
// conv_rows.wgsl took these, each invocation loaded its W floats one at a time and checked every
// X column against the row's bounds.

@group(0) @binding(0) var<storage, read> x: array<f32>;

// The group's first input plane and each pixel's offset in a plane (the block's first pixel
// again past its end: computed, never written), and a plane's floats.
struct XAt {
    first: u32,
    px: array<u32, 8>,
    plane: u32,
}

fn x_at(b: Block) -> XAt {
    var at: XAt;
    for (var j = 0u; j < 8u; j = j + 1u) {
        let p = b.p0 + select(0u, j, j < b.left);
        at.px[j] = (p / params.ow) * params.sh * params.w + (p % params.ow) * params.sw;
    }
    at.plane = params.h * params.w;
    at.first = (b.n * params.c + b.g * params.cg) * at.plane;
    return at;
}

// The block's pixels in input channel k of its group.
fn x_pixels(at: XAt, k: u32) -> array<vec4<f32>, 2> {
    let p = at.first + k * at.plane;
    let a = vec4<f32>(x[p + at.px[0]], x[p + at.px[1]], x[p + at.px[2]], x[p + at.px[3]]);
    let b = vec4<f32>(x[p + at.px[4]], x[p + at.px[5]], x[p + at.px[6]], x[p + at.px[7]]);
    return array<vec4<f32>, 2>(a, b);
}
