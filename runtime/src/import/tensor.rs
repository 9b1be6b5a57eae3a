//! ONNX tensors and declared types to tandem's [`Tensor`], [`DType`] and [`Dim`].
//!
//! Sits between the protobuf messages (`onnx_proto`) and the graph assembly in `import.rs`:
//! initializers, `Constant` values and tensor attributes (raw little-endian data, the typed
//! `*_data` fields, external data files) and the declared types of inputs and outputs.
//! Sizes are checked against the data before anything is allocated.

use super::Problem;
use crate::graph::Dim;
use crate::onnx_proto::{data_type as dt, TensorProto, ValueInfoProto, DATA_LOCATION_EXTERNAL};
use half::f16;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};
use tandem_ops::{DType, Data, Tensor};

/// Largest tensor the importer will materialise (16 GiB): dims beyond this are refused
/// before allocating, whatever the data claims.
pub const MAX_TENSOR_BYTES: u64 = 1 << 34;

/// tandem's dtype for an ONNX `TensorProto.DataType` code; unsupported types say which.
pub fn dtype_of(code: i32) -> Result<DType, Problem> {
    let name = match code {
        dt::FLOAT => return Ok(DType::F32),
        dt::UINT8 => return Ok(DType::U8),
        dt::INT8 => return Ok(DType::I8),
        dt::INT32 => return Ok(DType::I32),
        dt::INT64 => return Ok(DType::I64),
        dt::BOOL => return Ok(DType::Bool),
        dt::FLOAT16 => return Ok(DType::F16),
        dt::DOUBLE => return Ok(DType::F64),
        0 => return Err(Problem::Invalid("data type is UNDEFINED (0)".into())),
        dt::UINT16 => "uint16",
        dt::INT16 => "int16",
        dt::STRING => "string",
        dt::UINT32 => "uint32",
        dt::UINT64 => "uint64",
        dt::COMPLEX64 => "complex64",
        dt::COMPLEX128 => "complex128",
        dt::BFLOAT16 => "bfloat16",
        17 => "float8e4m3fn",
        18 => "float8e4m3fnuz",
        19 => "float8e5m2",
        20 => "float8e5m2fnuz",
        21 => "uint4",
        22 => "int4",
        23 => "float4e2m1",
        24 => "float8e8m0",
        25 => "uint2",
        26 => "int2",
        27 => "float6e2m3",
        28 => "float6e3m2",
        other => return Err(Problem::Invalid(format!("unknown data type code {other}"))),
    };
    Err(Problem::Unsupported(format!(
        "dtype {name} is not supported (tandem handles f32, f16, f64, i64, i32, i8, u8, bool)"
    )))
}

/// Element count of `dims` as a shape, refusing negative dims, overflow and tensors larger
/// than [`MAX_TENSOR_BYTES`] for elements of `elem_size` bytes.
pub fn checked_shape(dims: &[i64], elem_size: usize) -> Result<(Vec<usize>, usize), Problem> {
    let mut shape = Vec::with_capacity(dims.len());
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d)
            .map_err(|_| Problem::Invalid(format!("negative dimension {d} in dims {dims:?}")))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| Problem::Invalid(format!("dims {dims:?}: element count overflows")))?;
        shape.push(d);
    }
    let bytes = (n as u128) * (elem_size as u128);
    if bytes > MAX_TENSOR_BYTES as u128 {
        return Err(Problem::Invalid(format!(
            "dims {dims:?}: {bytes} bytes exceeds the {MAX_TENSOR_BYTES}-byte tensor limit"
        )));
    }
    Ok((shape, n))
}

/// Converts a `TensorProto` (initializer, `Constant` value, tensor attribute or test data)
/// into a host tensor. External data is resolved below `base_dir` (the model's folder).
pub fn tensor_from_proto(t: &TensorProto, base_dir: Option<&Path>) -> Result<Tensor, Problem> {
    let dtype = dtype_of(t.data_type)?;
    if t.segment.is_some() {
        return Err(Problem::Unsupported(
            "segmented tensors are not supported".into(),
        ));
    }
    let (shape, n) = checked_shape(&t.dims, dtype.size())?;
    let bytes = n * dtype.size();
    let data = if t.data_location == DATA_LOCATION_EXTERNAL {
        let raw = read_external(t, base_dir, bytes)?;
        decode_raw(dtype, &raw)
    } else if let Some(raw) = &t.raw_data {
        if raw.len() != bytes {
            return Err(Problem::Invalid(format!(
                "dims {:?} of {dtype} need {bytes} bytes of raw_data, found {}",
                t.dims,
                raw.len()
            )));
        }
        decode_raw(dtype, raw)
    } else {
        decode_typed(t, dtype, n)?
    };
    Ok(Tensor::new(shape, data))
}

/// Little-endian bytes (length already checked) to elements.
fn decode_raw(dtype: DType, raw: &[u8]) -> Data {
    fn le<const N: usize, T>(raw: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        raw.chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunks_exact yields N bytes")))
            .collect()
    }
    match dtype {
        DType::F32 => Data::F32(le(raw, f32::from_le_bytes)),
        DType::F16 => Data::F16(le(raw, |b| f16::from_bits(u16::from_le_bytes(b)))),
        DType::F64 => Data::F64(le(raw, f64::from_le_bytes)),
        DType::I64 => Data::I64(le(raw, i64::from_le_bytes)),
        DType::I32 => Data::I32(le(raw, i32::from_le_bytes)),
        DType::I8 => Data::I8(raw.iter().map(|&b| b as i8).collect()),
        DType::U8 => Data::U8(raw.to_vec()),
        DType::Bool => Data::Bool(raw.iter().map(|&b| b != 0).collect()),
    }
}

/// The typed `*_data` field ONNX uses for `dtype`, checked to hold `n` elements.
fn decode_typed(t: &TensorProto, dtype: DType, n: usize) -> Result<Data, Problem> {
    let check = |field: &str, len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(Problem::Invalid(format!(
                "dims {:?} of {dtype} need {n} elements, {field} has {len}",
                t.dims
            )))
        }
    };
    let ints = &t.int32_data;
    Ok(match dtype {
        DType::F32 => {
            check("float_data", t.float_data.len())?;
            Data::F32(t.float_data.clone())
        }
        DType::F64 => {
            check("double_data", t.double_data.len())?;
            Data::F64(t.double_data.clone())
        }
        DType::I64 => {
            check("int64_data", t.int64_data.len())?;
            Data::I64(t.int64_data.clone())
        }
        DType::I32 => {
            check("int32_data", ints.len())?;
            Data::I32(ints.clone())
        }
        DType::I8 => {
            check("int32_data", ints.len())?;
            Data::I8(ints.iter().map(|&v| v as i8).collect())
        }
        DType::U8 => {
            check("int32_data", ints.len())?;
            Data::U8(ints.iter().map(|&v| v as u8).collect())
        }
        DType::Bool => {
            check("int32_data", ints.len())?;
            Data::Bool(ints.iter().map(|&v| v != 0).collect())
        }
        // float16 values travel as their bit patterns in int32_data.
        DType::F16 => {
            check("int32_data", ints.len())?;
            Data::F16(ints.iter().map(|&v| f16::from_bits(v as u16)).collect())
        }
    })
}

/// Reads the `bytes` bytes of an externally stored tensor: `location` must be a relative path
/// that stays inside `base_dir` (no absolute paths, no `..`, no symlink leading out), and
/// `offset`/`length` must lie within the file.
fn read_external(
    t: &TensorProto,
    base_dir: Option<&Path>,
    bytes: usize,
) -> Result<Vec<u8>, Problem> {
    let inv = |m: String| Problem::Invalid(m);
    let (mut location, mut offset, mut length) = (None, 0u64, None);
    for e in &t.external_data {
        let num = |v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| inv(format!("external data `{}` = `{v}` is not a number", e.key)))
        };
        match e.key.as_str() {
            "location" => location = Some(e.value.as_str()),
            "offset" => offset = num(&e.value)?,
            "length" => length = Some(num(&e.value)?),
            _ => {}
        }
    }
    let location = location
        .filter(|l| !l.is_empty())
        .ok_or_else(|| inv("external data has no `location`".into()))?;
    let rel = Path::new(location);
    let escapes = rel.is_absolute()
        || location.starts_with(['/', '\\'])
        || location.contains(':')
        || location.split(['/', '\\']).any(|seg| seg == "..")
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if escapes {
        return Err(inv(format!(
            "external data location `{location}` must be a relative path inside the model's folder"
        )));
    }
    let base = base_dir.ok_or_else(|| {
        inv(format!(
            "external data in `{location}` but the model's folder is unknown (load it with import_file)"
        ))
    })?;
    let path = base.join(rel);
    if !path.is_file() {
        return Err(inv(format!(
            "external data file `{}` not found",
            path.display()
        )));
    }
    let io = |e: std::io::Error| inv(format!("external data file `{}`: {e}", path.display()));
    let real_base = base.canonicalize().map_err(io)?;
    let real = path.canonicalize().map_err(io)?;
    if !real.starts_with(&real_base) {
        return Err(inv(format!(
            "external data file `{location}` resolves outside the model's folder"
        )));
    }
    if let Some(len) = length {
        if len != bytes as u64 {
            return Err(inv(format!(
                "external data `{location}`: length {len} but dims {:?} need {bytes} bytes",
                t.dims
            )));
        }
    }
    let file_len = std::fs::metadata(&real).map_err(io)?.len();
    let end = offset.checked_add(bytes as u64);
    if end.is_none_or(|end| end > file_len) {
        return Err(inv(format!(
            "external data `{location}`: {bytes} bytes at offset {offset} exceed the file's {file_len} bytes"
        )));
    }
    let mut f = std::fs::File::open(&real).map_err(io)?;
    f.seek(SeekFrom::Start(offset)).map_err(io)?;
    let mut buf = vec![0u8; bytes];
    f.read_exact(&mut buf).map_err(io)?;
    Ok(buf)
}

/// Declared dtype and shape of a graph input, output or `value_info` entry. Missing type
/// information gives `None`; an unknown dimension becomes `Dim::Symbolic("")`.
pub type Declared = (Option<DType>, Option<Vec<Dim>>);

/// Reads the declared type of `vi`; non-tensor types and unsupported dtypes are `Unsupported`.
pub fn declared_type(vi: &ValueInfoProto) -> Result<Declared, Problem> {
    let Some(ty) = &vi.r#type else {
        return Ok((None, None));
    };
    let kind = if ty.sequence_type.is_some() {
        "sequence"
    } else if ty.map_type.is_some() {
        "map"
    } else if ty.optional_type.is_some() {
        "optional"
    } else if ty.sparse_tensor_type.is_some() {
        "sparse tensor"
    } else if ty.opaque_type.is_some() {
        "opaque"
    } else {
        ""
    };
    if !kind.is_empty() {
        return Err(Problem::Unsupported(format!(
            "{kind} values are not supported (only tensors)"
        )));
    }
    let Some(tt) = &ty.tensor_type else {
        return Ok((None, None));
    };
    let dtype = match tt.elem_type {
        0 => None,
        code => Some(dtype_of(code)?),
    };
    let shape = match &tt.shape {
        None => None,
        Some(s) => Some(
            s.dim
                .iter()
                .map(|d| match (d.dim_value, &d.dim_param) {
                    (Some(v), _) => usize::try_from(v)
                        .map(Dim::Fixed)
                        .map_err(|_| Problem::Invalid(format!("negative declared dimension {v}"))),
                    (None, Some(p)) => Ok(Dim::Symbolic(p.clone())),
                    (None, None) => Ok(Dim::Symbolic(String::new())),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok((dtype, shape))
}
