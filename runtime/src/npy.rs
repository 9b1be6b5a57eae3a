//! Reading and writing NumPy `.npy` files (format 1.0-3.0, little-endian, C order).
//!
//! Sits between files on disk (the CLI's `--input`/`--output`, test fixtures) and [`Tensor`].

use crate::{Error, Result};
use half::f16;
use tandem_ops::{DType, Data, Tensor};

const MAGIC: &[u8] = b"\x93NUMPY";

fn bad(msg: impl Into<String>) -> Error {
    Error::Usage(format!("npy: {}", msg.into()))
}

fn descr(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::F64 => "<f8",
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::Bool => "|b1",
    }
}

/// Serialise a tensor as `.npy` bytes.
pub fn to_npy(t: &Tensor) -> Vec<u8> {
    let shape = match t.shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", t.shape[0]),
        _ => format!(
            "({})",
            t.shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        descr(t.dtype()),
        shape
    );
    let total = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&t.data.to_le_bytes());
    out
}

fn header_field<'a>(header: &'a str, key: &str) -> Result<&'a str> {
    let at = header
        .find(&format!("'{key}'"))
        .ok_or_else(|| bad(format!("header has no `{key}`")))?;
    let rest = header[at + key.len() + 2..].trim_start();
    let rest = rest
        .strip_prefix(':')
        .ok_or_else(|| bad("malformed header"))?
        .trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|e| e + 1)
    } else {
        rest.find(',')
    }
    .ok_or_else(|| bad("malformed header"))?;
    Ok(rest[..end].trim())
}

/// Parse `.npy` bytes.
pub fn from_npy(bytes: &[u8]) -> Result<Tensor> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("not an .npy file (bad magic)"));
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(bad(format!("unsupported format version {v}"))),
    };
    let header = bytes
        .get(hstart..hstart + hlen)
        .ok_or_else(|| bad("truncated header"))?;
    let header = std::str::from_utf8(header).map_err(|_| bad("header is not text"))?;
    if header_field(header, "fortran_order")? != "False" {
        return Err(bad("Fortran-order arrays are not supported"));
    }
    let d = header_field(header, "descr")?.trim_matches(|c| c == '\'' || c == '"');
    let shape_text = header_field(header, "shape")?;
    let shape: Vec<usize> = shape_text
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|_| bad(format!("bad shape {shape_text}")))
        })
        .collect::<Result<_>>()?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| bad("shape overflows"))?;
    let body = &bytes[hstart + hlen..];
    let size = match d {
        "<f4" | "<i4" => 4,
        "<f8" | "<i8" => 8,
        "<f2" => 2,
        "|i1" | "|u1" | "|b1" => 1,
        other => return Err(bad(format!("unsupported dtype {other}"))),
    };
    let need = n.checked_mul(size).ok_or_else(|| bad("shape overflows"))?;
    if body.len() < need {
        return Err(bad(format!(
            "expected {need} data bytes, found {}",
            body.len()
        )));
    }
    let b = &body[..need];
    let data = match d {
        "<f4" => Data::F32(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        "<i4" => Data::I32(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        "<f8" => Data::F64(
            b.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        "<i8" => Data::I64(
            b.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        "<f2" => Data::F16(
            b.chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        "|i1" => Data::I8(b.iter().map(|x| *x as i8).collect()),
        "|u1" => Data::U8(b.to_vec()),
        _ => Data::Bool(b.iter().map(|x| *x != 0).collect()),
    };
    Ok(Tensor::new(shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_every_dtype_and_rank() {
        let cases = [
            Tensor::f32(&[2, 3], vec![1.0, -2.5, 3.0, 0.0, 1e-7, f32::MAX]),
            Tensor::i64(&[], vec![-7]),
            Tensor::new(vec![3], Data::Bool(vec![true, false, true])),
            Tensor::new(
                vec![1, 2],
                Data::F16(vec![f16::from_f32(1.5), f16::from_f32(-2.0)]),
            ),
            Tensor::new(vec![0, 4], Data::I32(vec![])),
        ];
        for t in cases {
            let bytes = to_npy(&t);
            assert_eq!(
                (MAGIC.len() + 4 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64,
                0
            );
            assert_eq!(from_npy(&bytes).unwrap(), t);
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(from_npy(b"hello").is_err());
        let mut b = to_npy(&Tensor::f32(&[4], vec![1.0; 4]));
        b.truncate(b.len() - 3);
        assert!(from_npy(&b).is_err());
    }
}
