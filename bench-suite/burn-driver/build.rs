//! Build script of the burn peer: runs burn-onnx's `ModelGen` on each model of
//! models/manifest.json and writes `$OUT_DIR/models.rs`, the table the driver runs from.
//!
//! Sits between the model set (manifest.json, fetched by scripts/fetch_models.py) and the
//! driver binary (src/main.rs `include!`s the table). burn-onnx panics on operators or shapes
//! it does not support: each model is generated under `catch_unwind`, so one failure does not
//! stop the others, and the table records per model either its runner (glue code calling the
//! generated `Model::forward` with the inputs in the manifest's order) or the reason it is
//! missing. `SKIP` below lists models whose generated code burn-onnx writes but rustc rejects
//! (that would fail this whole crate), with the error seen, so they show as rows too.
//!
//! Environment: `TANDEM_MODELS` (folder with manifest.json, default <repo>/models) and
//! `TANDEM_BURN_MODELS` (comma-separated subset of model names, for a quicker build).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Models burn-onnx imports but whose generated code does not compile, with the reason.
const SKIP: &[(&str, &str)] = &[];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TANDEM_MODELS");
    println!("cargo:rerun-if-env-changed=TANDEM_BURN_MODELS");
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let models = std::env::var_os("TANDEM_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest_dir.join("../../models"));
    let manifest = models.join("manifest.json");
    println!("cargo:rerun-if-changed={}", manifest.display());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let entries: Vec<serde_json::Value> = match std::fs::read(&manifest) {
        Ok(b) => serde_json::from_slice(&b).expect("manifest.json is a JSON list"),
        Err(e) => {
            println!(
                "cargo:warning={}: {e}; the driver will have no models",
                manifest.display()
            );
            Vec::new()
        }
    };
    let only: Option<Vec<String>> = std::env::var("TANDEM_BURN_MODELS")
        .ok()
        .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());

    // Quiet panics: the message is kept as the model's reason instead.
    std::panic::set_hook(Box::new(|_| {}));
    let mut table = String::new();
    let mut modules = String::new();
    let mut runners = String::new();
    for (k, e) in entries.iter().enumerate() {
        let name = e["name"].as_str().unwrap_or("?").to_string();
        let names = |key: &str| -> Vec<String> {
            e[key].as_array().map_or(Vec::new(), |a| {
                a.iter()
                    .map(|x| x["name"].as_str().unwrap_or("?").to_string())
                    .collect()
            })
        };
        let io = format!("&{:?}, &{:?}", names("inputs"), names("outputs"));
        if let Some(only) = &only {
            if !only.contains(&name) {
                let _ = writeln!(
                    table,
                    "    ({name:?}, {io}, Err(\"not in TANDEM_BURN_MODELS at build time\")),"
                );
                continue;
            }
        }
        let status = generate(&models, &out_dir, k, e);
        match status {
            Ok(glue) => {
                let _ = writeln!(
                    modules,
                    "#[allow(clippy::all, unused, non_snake_case)]\npub mod m{k} {{\n    \
                     include!(concat!(env!(\"OUT_DIR\"), \"/m{k}/model.rs\"));\n}}"
                );
                runners.push_str(&glue);
                let _ = writeln!(table, "    ({name:?}, {io}, Ok(load_m{k} as Loader)),");
            }
            Err(reason) => {
                println!("cargo:warning=burn-onnx: {name}: {reason}");
                let _ = writeln!(table, "    ({name:?}, {io}, Err({reason:?})),");
            }
        }
    }
    let code = format!(
        "{modules}\n{runners}\n/// Every manifest model: name, input names, output names (manifest order), and its loader\n\
         /// or why burn has none.\n\
         pub static MODELS: &[Entry] = &[\n{table}];\n"
    );
    std::fs::write(out_dir.join("models.rs"), code).unwrap();
}

/// Generate model `k` under `$OUT_DIR/m{k}/` and return its glue code, or why not.
fn generate(
    models: &Path,
    out_dir: &Path,
    k: usize,
    e: &serde_json::Value,
) -> Result<String, String> {
    let name = e["name"].as_str().unwrap_or("?");
    if let Some((_, why)) = SKIP.iter().find(|(n, _)| *n == name) {
        return Err(why.to_string());
    }
    let onnx = models.join(e["path"].as_str().ok_or("manifest entry has no path")?);
    if !onnx.is_file() {
        return Err(format!(
            "{} missing (scripts/fetch_models.py)",
            onnx.display()
        ));
    }
    let onnx_s = onnx.to_str().ok_or("non-UTF-8 model path")?.to_string();
    let sub = format!("m{k}");
    let run = std::panic::catch_unwind(|| {
        burn_onnx::ModelGen::new()
            .input(&onnx_s)
            .out_dir(&sub)
            .run_from_script();
    });
    if let Err(p) = run {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic without a message".into());
        return Err(format!("burn-onnx import failed: {}", first_lines(&msg)));
    }
    let rs = out_dir.join(&sub).join("model.rs");
    let code = std::fs::read_to_string(&rs).map_err(|e| format!("{}: {e}", rs.display()))?;
    let (params, ret) = forward_signature(&code)?;
    let n_inputs = e["inputs"].as_array().map_or(0, |a| a.len());
    if params.len() != n_inputs {
        return Err(format!(
            "generated forward takes {} inputs, the model declares {n_inputs}",
            params.len()
        ));
    }
    let mut args = String::new();
    for (i, ty) in params.iter().enumerate() {
        let _ = write!(args, "{}, ", to_arg(ty, i)?);
    }
    let outs: Vec<String> = split_top(ret.trim_start_matches('(').trim_end_matches(')'))
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    let collect = if ret.starts_with('(') {
        let parts: Vec<String> = outs
            .iter()
            .enumerate()
            .map(|(i, ty)| from_out(ty, &format!("out.{i}")))
            .collect::<Result<_, _>>()?;
        parts.join(", ")
    } else {
        from_out(&ret, "out")?
    };
    Ok(format!(
        "struct R{k}(m{k}::Model, Device);\n\
         impl Runner for R{k} {{\n    \
           fn run(&self, inputs: &[Host]) -> Result<Vec<Host>, String> {{\n        \
             let d = &self.1;\n        \
             let out = self.0.forward({args});\n        \
             Ok(vec![{collect}])\n    }}\n}}\n\
         fn load_m{k}(d: &Device) -> Box<dyn Runner> {{\n    \
           let bpk = concat!(env!(\"OUT_DIR\"), \"/m{k}/model.bpk\");\n    \
           Box::new(R{k}(m{k}::Model::from_file(bpk, d), d.clone()))\n}}\n"
    ))
}

/// The first three lines of a panic message (burn-onnx's can run to pages).
fn first_lines(msg: &str) -> String {
    msg.lines().take(3).collect::<Vec<_>>().join(" | ")
}

/// The parameter types and return type of the top-level `Model::forward`.
fn forward_signature(code: &str) -> Result<(Vec<String>, String), String> {
    let at = code
        .find("impl Model {")
        .ok_or("generated code has no `impl Model`")?;
    let rest = &code[at..];
    let f = rest
        .find("pub fn forward(")
        .ok_or("generated Model has no forward")?;
    let sig = &rest[f + "pub fn forward(".len()..];
    let close = matching_paren(sig).ok_or("unbalanced forward signature")?;
    let params: Vec<String> = split_top(&sig[..close])
        .into_iter()
        .filter(|p| !p.is_empty() && p != "&self")
        .map(|p| {
            p.split_once(':')
                .map_or(p.clone(), |(_, t)| t.trim().to_string())
        })
        .collect();
    let after = &sig[close + 1..];
    let brace = after.find('{').ok_or("forward has no body")?;
    let ret = after[..brace]
        .trim()
        .trim_start_matches("->")
        .trim()
        .to_string();
    Ok((params, ret))
}

/// Index of the `)` closing the one opened just before `s`.
fn matching_paren(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' | '>' | ']' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// `s` split on commas outside brackets, each part trimmed.
fn split_top(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur.trim().to_string());
    out
}

/// Expression converting host input `i` to a forward parameter of type `ty`.
fn to_arg(ty: &str, i: usize) -> Result<String, String> {
    let t: String = ty.chars().filter(|c| !c.is_whitespace()).collect();
    if let Some(inner) = t.strip_prefix("Tensor<").and_then(|s| s.strip_suffix('>')) {
        let mut it = inner.split(',');
        let rank = it.next().unwrap_or("");
        let kind = it.next().unwrap_or("Float");
        return Ok(format!("to_tensor::<{rank}, {kind}>(&inputs[{i}], d)?"));
    }
    match t.as_str() {
        "f32" | "f64" | "i32" | "i64" | "bool" => Ok(format!("inputs[{i}].scalar::<{t}>()?")),
        _ => Err(format!("forward parameter {i} has unsupported type `{ty}`")),
    }
}

/// Expression converting forward output `expr` of type `ty` to a host tensor.
fn from_out(ty: &str, expr: &str) -> Result<String, String> {
    let t: String = ty.chars().filter(|c| !c.is_whitespace()).collect();
    if t.starts_with("Tensor<") {
        return Ok(format!("from_tensor({expr})?"));
    }
    match t.as_str() {
        "f32" | "f64" | "i32" | "i64" | "bool" => Ok(format!("Host::from_scalar({expr})")),
        _ if t.starts_with("[i64;") => Ok(format!("Host::from_shape(&{expr})")),
        _ => Err(format!("forward output has unsupported type `{ty}`")),
    }
}
