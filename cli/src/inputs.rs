//! Model inputs for the CLI: loaded from `.npy` files, or filled with documented defaults.

use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use tandem::graph::Dim;
use tandem::{DType, Data, Session, Tensor};

/// Inputs from `NAME=FILE.npy` arguments, then defaults for every model input not given.
pub fn load(session: &Session, args: &[String], dims: &[String]) -> Result<Vec<(String, Tensor)>> {
    let mut given = Vec::new();
    for a in args {
        let (name, file) = a
            .split_once('=')
            .with_context(|| format!("--input {a}: expected NAME=FILE.npy"))?;
        let bytes = std::fs::read(file).with_context(|| format!("reading {file}"))?;
        let t = tandem::npy::from_npy(&bytes).with_context(|| format!("--input {name}"))?;
        given.push((name.to_string(), t));
    }
    let mut dim_values = HashMap::new();
    for d in dims {
        let (n, v) = d
            .split_once('=')
            .with_context(|| format!("--dim {d}: expected NAME=N"))?;
        let v: usize = v
            .parse()
            .with_context(|| format!("--dim {d}: N must be a number"))?;
        dim_values.insert(n.to_string(), v);
    }
    for io in session.inputs() {
        if given.iter().any(|(n, _)| *n == io.name) {
            continue;
        }
        let shape: Vec<usize> = match &io.shape {
            None => bail!(
                "input `{}` declares no shape: give it with --input",
                io.name
            ),
            Some(d) => d
                .iter()
                .map(|d| match d {
                    Dim::Fixed(n) => *n,
                    Dim::Symbolic(s) => dim_values.get(s).copied().unwrap_or(1),
                })
                .collect(),
        };
        let t = default_tensor(&io.name, io.dtype.unwrap_or(DType::F32), &shape);
        given.push((io.name.clone(), t));
    }
    Ok(given)
}

/// The documented default for an input not given: floats a fixed pseudo-random sequence in
/// [0, 1), integers 0 (1 when the name contains "mask"), bools true.
pub fn default_tensor(name: &str, dtype: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let int = if name.to_lowercase().contains("mask") {
        1
    } else {
        0
    };
    let data = match dtype {
        DType::F32 => Data::F32((0..n).map(|_| next()).collect()),
        DType::F16 => Data::F16((0..n).map(|_| half::f16::from_f32(next())).collect()),
        DType::F64 => Data::F64((0..n).map(|_| next() as f64).collect()),
        DType::I64 => Data::I64(vec![int; n]),
        DType::I32 => Data::I32(vec![int as i32; n]),
        DType::I8 => Data::I8(vec![int as i8; n]),
        DType::U8 => Data::U8(vec![int as u8; n]),
        DType::Bool => Data::Bool(vec![true; n]),
    };
    Tensor::new(shape.to_vec(), data)
}

/// A short description of a tensor's values: a few first elements and min/max/mean.
pub fn summary(t: &Tensor) -> String {
    let n = t.numel();
    if n == 0 {
        return "(empty)".into();
    }
    let v: Vec<f64> = (0..n).map(|i| t.data.get_f64(i)).collect();
    let first: Vec<String> = v.iter().take(4).map(|x| format!("{x:.4}")).collect();
    let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mean = v.iter().sum::<f64>() / n as f64;
    format!(
        "[{}{}] min {min:.4} max {max:.4} mean {mean:.4}",
        first.join(", "),
        if n > 4 { ", ..." } else { "" }
    )
}

/// A file name from an output name: characters outside `[A-Za-z0-9._-]` become `_`.
pub fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_names_become_safe_file_names() {
        assert_eq!(file_safe("logits"), "logits");
        assert_eq!(file_safe("out/0:1 x"), "out_0_1_x");
        assert_eq!(file_safe("a.b-c_d"), "a.b-c_d");
    }

    #[test]
    fn defaults_follow_the_documented_rules() {
        let m = default_tensor("attention_mask", DType::I64, &[1, 3]);
        assert_eq!(m.data, Data::I64(vec![1, 1, 1]));
        let ids = default_tensor("input_ids", DType::I64, &[2]);
        assert_eq!(ids.data, Data::I64(vec![0, 0]));
        let x = default_tensor("x", DType::F32, &[1000]);
        let v = x.as_f32().unwrap();
        assert!(v.iter().all(|&e| (0.0..1.0).contains(&e)));
        assert!(v.windows(2).any(|w| w[0] != w[1]));
    }
}
