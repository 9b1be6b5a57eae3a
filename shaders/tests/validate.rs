//! Every shader parses and validates with naga, follows the binding convention
//! (group 0, consecutive bindings, a single params uniform and it is the last binding; an input
//! may be a uniform window, `array<vec4<f32>, 4096>`) and has `main`.

use naga::valid::{Capabilities, ValidationFlags, Validator};

#[test]
fn every_shader_parses_validates_and_follows_the_binding_convention() {
    assert!(!tandem_shaders::ALL.is_empty());
    let mut names = std::collections::HashSet::new();
    for shader in tandem_shaders::ALL {
        assert!(
            names.insert(shader.name),
            "shader name {} listed twice",
            shader.name
        );
        let module = naga::front::wgsl::parse_str(shader.source)
            .unwrap_or_else(|e| panic!("{}: {}", shader.name, e.emit_to_string(shader.source)));
        Validator::new(ValidationFlags::all(), Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {e:?}", shader.name));
        assert!(
            module.entry_points.iter().any(|e| e.name == "main"),
            "{} has no entry point `main`",
            shader.name
        );
        let mut bindings: Vec<(u32, bool)> = module
            .global_variables
            .iter()
            .filter_map(|(_, v)| {
                let b = v.binding.as_ref()?;
                assert_eq!(b.group, 0, "{}: only group 0 is used", shader.name);
                let uniform = matches!(v.space, naga::AddressSpace::Uniform);
                // an input read through a uniform window is not the params uniform
                let window = uniform && is_uniform_window(&module, v.ty);
                Some((b.binding, uniform && !window))
            })
            .collect();
        bindings.sort();
        for (i, (b, _)) in bindings.iter().enumerate() {
            assert_eq!(
                *b as usize, i,
                "{}: bindings must be consecutive from 0",
                shader.name
            );
        }
        let uniforms: Vec<_> = bindings.iter().filter(|(_, u)| *u).collect();
        assert_eq!(
            uniforms.len(),
            1,
            "{}: exactly one params uniform",
            shader.name
        );
        assert!(
            bindings.last().unwrap().1,
            "{}: params must be the last binding",
            shader.name
        );
        assert!(
            shader.source.starts_with("// "),
            "{}: a header comment must say what it computes",
            shader.name
        );
    }
}

/// Whether `ty` is the runtime's uniform window of an input: 4096 vec4s of f32, the 64 KiB
/// (`tandem_ops::UNIFORM_WINDOW_BYTES`) it copies.
fn is_uniform_window(module: &naga::Module, ty: naga::Handle<naga::Type>) -> bool {
    let naga::TypeInner::Array { base, size, .. } = module.types[ty].inner else {
        return false;
    };
    let vec4_f32 = naga::TypeInner::Vector {
        size: naga::VectorSize::Quad,
        scalar: naga::Scalar::F32,
    };
    module.types[base].inner == vec4_f32
        && matches!(size, naga::ArraySize::Constant(n) if n.get() == 4096)
}
