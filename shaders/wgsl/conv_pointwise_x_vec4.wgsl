// conv_pointwise_x_vec4: conv_pointwise.wgsl's X (binding 0) as vec4s, for 1x1s of stride 1
// without pads whose planes are whole vec4s (the host checks it): the block's 8 pixels are two
// vec4s of each input plane.

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;

// vec4 indices of pixels p0 .. p0 + 3 and p0 + 4 .. p0 + 7 (the first again past the plane:
// computed, never written) in the group's first input plane, and a plane's vec4s.
struct XAt {
    a: u32,
    b: u32,
    plane: u32,
}

fn x_at(b: Block) -> XAt {
    let npix = params.oh * params.ow;
    var at: XAt;
    at.a = ((b.n * params.c + b.g * params.cg) * npix + b.p0) / 4u;
    at.b = select(at.a, at.a + 1u, b.p0 + 4u < npix);
    at.plane = npix / 4u;
    return at;
}

// The block's pixels in input channel k of its group.
fn x_pixels(at: XAt, k: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(x[at.a + k * at.plane], x[at.b + k * at.plane]);
}
