//! onnx-ir-gap: how many ONNX models can `onnx-ir` load, and how faithfully?
//!
//! Sits outside the tandem workspace (it pulls burn-tensor); its only job is to produce the
//! numbers behind docs/importer.md. Usage:
//!   onnx-ir-gap DIR_OR_FILE...
//! Every `*.onnx` below the arguments is parsed with `OnnxGraphBuilder::new().parse_file`
//! (panics caught). Printed: loaded / failed / panicked counts, the most frequent failure
//! reasons (digits and quoted names folded so that similar errors group), and, for the loaded
//! models, how often onnx-ir renamed op types (Conv -> Conv2d...), fell back to its `Custom`
//! node, or returned graph outputs without the static shape the model itself declares.

use onnx_ir::{ArgType, Message, ModelProto, OnnxGraphBuilder};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn collect(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let Ok(rd) = std::fs::read_dir(path) else {
            return;
        };
        let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for e in entries {
            collect(&e, out);
        }
    } else if path.extension().is_some_and(|e| e == "onnx") {
        out.push(path.to_path_buf());
    }
}

/// Folds digits and quoted/backticked names so that errors differing only in names group.
fn reason_key(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or("").trim();
    let mut out = String::new();
    let mut quote: Option<char> = None;
    let mut last_digit = false;
    for c in first.chars() {
        if let Some(q) = quote {
            if c == q {
                out.push(c);
                quote = None;
            }
            continue;
        }
        if c == '\'' || c == '`' || c == '"' {
            out.push(c);
            out.push('…');
            quote = Some(c);
            continue;
        }
        if c.is_ascii_digit() {
            if !last_digit {
                out.push('N');
            }
            last_digit = true;
            continue;
        }
        last_digit = false;
        out.push(c);
    }
    out.chars().take(160).collect()
}

/// A coarse class of an onnx-ir failure message.
fn category(msg: &str) -> &'static str {
    if msg.contains("Unsupported ONNX operation") {
        "op not implemented in onnx-ir"
    } else if msg.contains("Failed to build") {
        "subgraph body (If/Loop/Scan) failed"
    } else if msg.contains("ank-0") || msg.contains("ank 0") {
        "rank-0 tensor rejected"
    } else if msg.contains("dtype") || msg.contains("Float8") || msg.contains("DType") {
        "dtype not supported"
    } else if msg.contains("Type mismatch") {
        "type mismatch (scalar vs tensor typing)"
    } else if msg.contains("not supported") || msg.contains("Unsupported") {
        "attribute / mode not supported"
    } else {
        "other"
    }
}

/// What the ONNX file itself says: op types and whether each output has a full static shape.
struct Declared {
    op_types: BTreeSet<String>,
    node_names: BTreeSet<String>,
    outputs_static: Vec<bool>,
}

fn declared(path: &Path) -> Option<Declared> {
    let bytes = std::fs::read(path).ok()?;
    let model = ModelProto::parse_from_bytes(&bytes).ok()?;
    let graph = model.graph.as_ref()?;
    let op_types = graph.node.iter().map(|n| n.op_type.clone()).collect();
    let node_names = graph
        .node
        .iter()
        .filter(|n| !n.name.is_empty())
        .map(|n| n.name.clone())
        .collect();
    let outputs_static = graph
        .output
        .iter()
        .map(|o| {
            o.type_.as_ref().is_some_and(|t| {
                t.has_tensor_type()
                    && t.tensor_type()
                        .shape
                        .as_ref()
                        .is_some_and(|s| s.dim.iter().all(|d| d.has_dim_value()))
            })
        })
        .collect();
    Some(Declared {
        op_types,
        node_names,
        outputs_static,
    })
}

fn main() {
    let args: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    if args.is_empty() {
        eprintln!("usage: onnx-ir-gap DIR_OR_FILE...");
        std::process::exit(2);
    }
    let mut files = Vec::new();
    for a in &args {
        collect(a, &mut files);
    }
    std::panic::set_hook(Box::new(|_| {}));

    let (mut loaded, mut failed, mut panicked) = (0usize, 0usize, 0usize);
    let mut reasons: BTreeMap<String, (usize, String)> = BTreeMap::new();
    let mut cos_nodes = 0usize;
    let mut parse_time = std::time::Duration::ZERO;
    let mut categories: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut renamed_models = 0usize;
    let mut renames: BTreeMap<String, usize> = BTreeMap::new();
    let mut custom_models = 0usize;
    let mut lost_shape_models = 0usize;
    let mut lost_shape_example = String::new();
    let mut added_constant_models = 0usize;
    let mut renamed_nodes_models = 0usize;
    let mut named_models = 0usize;

    for f in &files {
        let name = f
            .strip_prefix(args.iter().find(|a| f.starts_with(a)).unwrap_or(f))
            .unwrap_or(f)
            .display()
            .to_string();
        let decl = declared(f);
        let t0 = std::time::Instant::now();
        let res = catch_unwind(AssertUnwindSafe(|| OnnxGraphBuilder::new().parse_file(f)));
        parse_time += t0.elapsed();
        let (key, msg) = match res {
            Ok(Ok(graph)) => {
                loaded += 1;
                let mut renamed = false;
                let mut custom = false;
                if let Some(d) = &decl {
                    let mut added_constant = false;
                    let mut renamed_node = false;
                    for n in &graph.nodes {
                        let t = n.node_type().to_string();
                        cos_nodes += (t == "ConstantOfShape") as usize;
                        if !d.node_names.is_empty() && !d.node_names.contains(n.name()) {
                            renamed_node = true;
                        }
                        if t == "Custom" {
                            custom = true;
                        } else if t == "Constant" && !d.op_types.contains(&t) {
                            added_constant = true;
                        } else if !d.op_types.contains(&t) {
                            renamed = true;
                            *renames.entry(t).or_default() += 1;
                        }
                    }
                    let lost = graph.outputs.iter().zip(&d.outputs_static).any(|(o, s)| {
                        *s && match &o.ty {
                            ArgType::Tensor(tt) => !tt
                                .static_shape
                                .as_ref()
                                .is_some_and(|v| v.iter().all(|d| d.is_some())),
                            _ => false,
                        }
                    });
                    lost_shape_models += lost as usize;
                    if lost && lost_shape_example.is_empty() {
                        let tys: Vec<String> = graph
                            .outputs
                            .iter()
                            .map(|o| format!("{:?}", o.ty))
                            .collect();
                        lost_shape_example = format!("{name}: outputs {}", tys.join(", "));
                    }
                    added_constant_models += added_constant as usize;
                    named_models += !d.node_names.is_empty() as usize;
                    renamed_nodes_models += renamed_node as usize;
                }
                renamed_models += renamed as usize;
                custom_models += custom as usize;
                continue;
            }
            Ok(Err(e)) => {
                failed += 1;
                let m = e.to_string();
                *categories.entry(category(&m)).or_default() += 1;
                (reason_key(&m), m)
            }
            Err(payload) => {
                panicked += 1;
                *categories.entry("panic").or_default() += 1;
                let m = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "<non-string panic>".into());
                (format!("PANIC: {}", reason_key(&m)), m)
            }
        };
        let e = reasons.entry(key).or_insert((0, String::new()));
        e.0 += 1;
        if e.1.is_empty() {
            e.1 = format!("{name}: {}", msg.lines().next().unwrap_or(""));
        }
    }

    let total = files.len();
    println!("models: {total}");
    println!("loaded: {loaded}");
    println!("failed (Err): {failed}");
    println!("panicked: {panicked}");
    println!("time in parse_file: {:.3} s", parse_time.as_secs_f64());
    println!("loaded but op types renamed (e.g. Conv -> Conv2d): {renamed_models}");
    println!("loaded with ops left as Custom (same-as-input fallback): {custom_models}");
    println!("loaded but a declared static output shape lost: {lost_shape_models}");
    let mut rn: Vec<_> = renames.into_iter().collect();
    rn.sort_by_key(|x| std::cmp::Reverse(x.1));
    let rn: Vec<String> = rn
        .iter()
        .take(12)
        .map(|(t, n)| format!("{t} x{n}"))
        .collect();
    if !lost_shape_example.is_empty() {
        println!("  e.g. {lost_shape_example}");
    }
    println!("loaded with initializers turned into added Constant nodes: {added_constant_models}");
    println!(
        "loaded models whose ONNX nodes have names: {named_models}, of which node names rewritten: {renamed_nodes_models}"
    );
    println!("ConstantOfShape nodes left unfolded in loaded graphs: {cos_nodes}");
    println!("renamed node types seen: {}", rn.join(", "));
    let mut cs: Vec<_> = categories.into_iter().collect();
    cs.sort_by_key(|x| std::cmp::Reverse(x.1));
    println!("failures by category:");
    for (c, n) in cs {
        println!("{n:5} | {c}");
    }
    let mut rs: Vec<_> = reasons.into_iter().collect();
    rs.sort_by_key(|x| std::cmp::Reverse(x.1 .0));
    println!("top failure reasons (count | reason | example):");
    for (k, (n, ex)) in &rs {
        println!(
            "{n:5} | {k}\n      e.g. {}",
            ex.chars().take(240).collect::<String>()
        );
    }
}
