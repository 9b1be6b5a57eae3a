//! WGSL that naga accepts but Chrome's compiler (Tint) rejects, checked without a browser.
//!
//! Tint evaluates const-expressions at shader creation and rejects any whose value is NaN or
//! infinite ("value nan cannot be represented as 'f32'"), so `bitcast<f32>(0x7fc00000u)` breaks
//! the whole module in the browser (every node of that shader falls back to the CPU), while
//! naga and lavapipe run it. Binding the bits to a `let` first makes it a runtime expression,
//! which Tint accepts (both verified in headless Chromium 156 on SwiftShader).

/// `bitcast<f32>(LITERAL)` where the literal's bits are a NaN or an infinity.
fn const_non_finite_bitcasts(source: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices("bitcast<f32>(") {
            let arg = &code[at + "bitcast<f32>(".len()..];
            let lit: String = arg
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            let digits = lit.trim_end_matches(['u', 'i']);
            let bits = match digits.strip_prefix("0x") {
                Some(hex) => u32::from_str_radix(hex, 16).ok(),
                None => digits.parse::<u32>().ok(),
            };
            let closes = arg[lit.len()..].starts_with(')');
            if let (Some(b), true) = (bits, closes) {
                if !f32::from_bits(b).is_finite() {
                    found.push((i + 1, line.trim().to_string()));
                }
            }
        }
    }
    found
}

#[test]
fn the_check_finds_const_nan_and_accepts_let_bound_bits() {
    let bad = "fn f() -> f32 {\n    return bitcast<f32>(0x7fc00000u);\n}";
    assert_eq!(const_non_finite_bitcasts(bad).len(), 1);
    let inf = "let m = select(0.0, bitcast<f32>(0x7f800000u), big);";
    assert_eq!(const_non_finite_bitcasts(inf).len(), 1);
    let ok =
        "let nan_bits = 0x7fc00000u;\nreturn bitcast<f32>(nan_bits);\nbitcast<f32>(0x3f800000u)";
    assert!(const_non_finite_bitcasts(ok).is_empty());
}

#[test]
fn shaders_have_no_const_expression_nan_or_infinity() {
    let mut bad = Vec::new();
    for s in tandem_shaders::ALL {
        for (line, text) in const_non_finite_bitcasts(s.source) {
            bad.push(format!("{}.wgsl:{line}: {text}", s.name));
        }
    }
    assert!(
        bad.is_empty(),
        "Chrome's WGSL compiler rejects these const-expression NaN/Inf values (the whole shader \
         fails in the browser); bind the bits to a `let` first, e.g. `let nan_bits = \
         0x7fc00000u; return bitcast<f32>(nan_bits);`:\n  {}",
        bad.join("\n  ")
    );
}
