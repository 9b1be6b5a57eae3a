//! WGSL that naga accepts but Chrome's compiler (Tint) rejects, checked without a browser
//! (`scripts/web.sh test` also has headless Chromium compile every kernel).
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

/// `check`'s findings over every kernel, as `name.wgsl:line: text`.
fn in_every_shader(check: fn(&str) -> Vec<(usize, String)>) -> Vec<String> {
    (tandem_shaders::ALL.iter())
        .flat_map(|s| {
            check(s.source)
                .into_iter()
                .map(move |(line, text)| (s.name, line, text))
        })
        .map(|(name, line, text)| format!("{name}.wgsl:{line}: {text}"))
        .collect()
}

#[test]
fn shaders_have_no_const_expression_nan_or_infinity() {
    let bad = in_every_shader(const_non_finite_bitcasts);
    assert!(
        bad.is_empty(),
        "Chrome's WGSL compiler rejects these const-expression NaN/Inf values (the whole shader \
         fails in the browser); bind the bits to a `let` first, e.g. `let nan_bits = \
         0x7fc00000u; return bitcast<f32>(nan_bits);`:\n  {}",
        bad.join("\n  ")
    );
}

/// Float literals whose value lies past the largest finite f32: Tint evaluates the literal
/// exactly and rejects it ("value -340282349999999991754788743781432688640.0 cannot be
/// represented as 'f32'" for `-3.4028235e38`), where naga rounds it to FLT_MAX.
fn float_literals_past_f32_max(source: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("").as_bytes();
        let mut at = 0;
        while at < code.len() {
            let starts = code[at].is_ascii_digit()
                && (at == 0 || !(code[at - 1].is_ascii_alphanumeric() || code[at - 1] == b'_'));
            if !starts {
                at += 1;
                continue;
            }
            let mut end = at;
            while end < code.len() {
                let c = code[end];
                let sign = (c == b'+' || c == b'-') && matches!(code[end - 1], b'e' | b'E');
                if !(c.is_ascii_digit() || c == b'.' || c == b'e' || c == b'E' || sign) {
                    break;
                }
                end += 1;
            }
            let lit = std::str::from_utf8(&code[at..end]).unwrap_or("");
            let float = lit.contains(['.', 'e', 'E']) && !lit.starts_with("0x");
            if let (true, Ok(v)) = (float, lit.parse::<f64>()) {
                if v.abs() > f32::MAX as f64 {
                    found.push((i + 1, line.trim().to_string()));
                }
            }
            at = end;
        }
    }
    found
}

#[test]
fn the_check_finds_float_literals_past_f32_max() {
    assert_eq!(
        float_literals_past_f32_max("var best = -3.4028235e38;").len(),
        1
    );
    assert_eq!(
        float_literals_past_f32_max("let none = m < -3.40282347e38;").len(),
        1
    );
    let ok = "var best = -3.4028234663852886e38; let a = 1.5e3 + x2e99 + 0.25; // 1e39";
    assert!(float_literals_past_f32_max(ok).is_empty());
}

#[test]
fn shaders_have_no_float_literal_past_f32_max() {
    let bad = in_every_shader(float_literals_past_f32_max);
    assert!(
        bad.is_empty(),
        "Chrome's WGSL compiler rejects these literals past the largest f32 (the whole shader \
         fails in the browser); write FLT_MAX as 3.4028234663852886e38:\n  {}",
        bad.join("\n  ")
    );
}
