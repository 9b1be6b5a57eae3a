//! Host tensors of the burn driver: read from and written to .npy (the files tandem-bench and
//! scripts/ort_driver.py exchange), and converted to and from burn tensors on a device.
//!
//! Sits between the suite's files and the generated models' `forward` (build.rs writes glue
//! that calls [`to_tensor`] per input and [`from_tensor`] per output).

use burn::tensor::kind::Basic;
use burn::tensor::{Device, Tensor, TensorData};

/// Element storage of a host tensor, one variant per dtype the suite exchanges.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
}

/// A dense row-major tensor on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct Host {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Host {
    /// A rank-0 tensor from a scalar `forward` output.
    pub fn from_scalar<T: num_from::ToData>(v: T) -> Host {
        Host {
            shape: Vec::new(),
            data: v.to_data(),
        }
    }

    /// A 1-D i64 tensor from a shape-valued `forward` output (`[i64; N]`).
    pub fn from_shape<const N: usize>(s: &[i64; N]) -> Host {
        Host {
            shape: vec![N],
            data: Data::I64(s.to_vec()),
        }
    }

    /// The single element of this tensor as `T` (a scalar `forward` parameter).
    pub fn scalar<T: num_from::FromF64>(&self) -> Result<T, String> {
        let v = match &self.data {
            Data::F32(v) => v.first().map(|x| *x as f64),
            Data::I64(v) => v.first().map(|x| *x as f64),
            Data::I32(v) => v.first().map(|x| *x as f64),
            Data::Bool(v) => v.first().map(|x| *x as u8 as f64),
        };
        v.map(T::from_f64)
            .ok_or_else(|| "empty scalar input".into())
    }

    /// Parse a C-order .npy file (`<f4`, `<i8`, `<i4`, `|b1`).
    pub fn from_npy(bytes: &[u8]) -> Result<Host, String> {
        if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
            return Err("not a .npy file".into());
        }
        let (hlen, start) = match bytes[6] {
            1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
            _ if bytes.len() >= 12 => (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            ),
            _ => return Err("truncated .npy header".into()),
        };
        let header = std::str::from_utf8(bytes.get(start..start + hlen).ok_or("truncated")?)
            .map_err(|_| "non-UTF-8 .npy header")?;
        if header.contains("'fortran_order': True") {
            return Err("Fortran-order .npy is not supported".into());
        }
        let descr = field(header, "descr")?
            .trim_matches(|c| c == '\'' || c == '"')
            .to_string();
        let shape_s = field(header, "shape")?;
        let shape: Vec<usize> = shape_s
            .trim_matches(|c| c == '(' || c == ')')
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().map_err(|_| format!("bad shape `{shape_s}`")))
            .collect::<Result<_, _>>()?;
        let body = &bytes[start + hlen..];
        let n: usize = shape.iter().product();
        let chunks = |w: usize| -> Result<std::slice::ChunksExact<'_, u8>, String> {
            if body.len() < n * w {
                return Err(format!("{descr}: {} bytes for {n} elements", body.len()));
            }
            Ok(body[..n * w].chunks_exact(w))
        };
        let data = match descr.as_str() {
            "<f4" => Data::F32(
                chunks(4)?
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            "<i8" => Data::I64(
                chunks(8)?
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            "<i4" => Data::I32(
                chunks(4)?
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            "|b1" => Data::Bool(chunks(1)?.map(|c| c[0] != 0).collect()),
            d => return Err(format!(".npy dtype `{d}` is not supported")),
        };
        Ok(Host { shape, data })
    }

    /// This tensor as a .npy file.
    pub fn to_npy(&self) -> Vec<u8> {
        let (descr, body): (&str, Vec<u8>) = match &self.data {
            Data::F32(v) => ("<f4", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            Data::I64(v) => ("<i8", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            Data::I32(v) => ("<i4", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            Data::Bool(v) => ("|b1", v.iter().map(|x| *x as u8).collect()),
        };
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        let shape = match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.join(", ")),
        };
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&body);
        out
    }
}

/// The value of `key` in a .npy header dict.
fn field<'a>(header: &'a str, key: &str) -> Result<&'a str, String> {
    let at = header
        .find(&format!("'{key}'"))
        .ok_or_else(|| format!(".npy header has no `{key}`"))?;
    let rest = header[at + key.len() + 2..]
        .trim_start()
        .trim_start_matches(':')
        .trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|i| i + 1)
    } else {
        rest.find(',')
    };
    Ok(&rest[..end.unwrap_or(rest.len())])
}

/// `h` as a rank-`D` burn tensor of kind `K` on `device`, keeping the input's dtype.
pub fn to_tensor<const D: usize, K: Basic>(
    h: &Host,
    device: &Device,
) -> Result<Tensor<D, K>, String> {
    if h.shape.len() != D {
        return Err(format!(
            "input of rank {} where the model takes rank {D}",
            h.shape.len()
        ));
    }
    let data = match &h.data {
        Data::F32(v) => TensorData::new(v.clone(), h.shape.clone()),
        Data::I64(v) => TensorData::new(v.clone(), h.shape.clone()),
        Data::I32(v) => TensorData::new(v.clone(), h.shape.clone()),
        Data::Bool(v) => {
            return Ok(Tensor::from_data(
                TensorData::new(v.clone(), h.shape.clone()),
                device,
            ))
        }
    };
    // The ONNX input's own dtype, as burn-onnx types the model's constants (the device's
    // default int dtype, e.g. ndarray's i64, would not match an int32 graph).
    let dtype = data.dtype();
    Ok(Tensor::from_data(data, (device, dtype)))
}

/// A burn tensor read back to the host (this waits for the device): floats as f32, integers
/// as i64, booleans as bool.
pub fn from_tensor<const D: usize, K: Basic>(t: Tensor<D, K>) -> Result<Host, String> {
    let data = t
        .try_into_data()
        .map_err(|e| format!("reading an output: {e:?}"))?;
    let shape = data.shape().as_slice().to_vec();
    let dtype = data.dtype();
    let err = |e| format!("converting an output of dtype {dtype:?}: {e:?}");
    let data = if dtype.is_float() {
        Data::F32(data.try_into_vec_as::<f32>().map_err(err)?)
    } else if dtype.is_bool() {
        Data::Bool(data.try_into_vec_as::<bool>().map_err(err)?)
    } else {
        Data::I64(data.try_into_vec_as::<i64>().map_err(err)?)
    };
    Ok(Host { shape, data })
}

/// Scalar conversion for scalar `forward` parameters.
pub mod num_from {
    /// A primitive that can be made from an f64 (with `as` semantics).
    pub trait FromF64 {
        fn from_f64(v: f64) -> Self;
    }
    macro_rules! impl_from {
        ($($t:ty),*) => {$(impl FromF64 for $t { fn from_f64(v: f64) -> Self { v as $t } })*};
    }
    impl_from!(f32, f64, i32, i64);

    /// A primitive as one-element host data (a scalar `forward` output).
    pub trait ToData {
        fn to_data(self) -> super::Data;
    }
    impl ToData for f32 {
        fn to_data(self) -> super::Data {
            super::Data::F32(vec![self])
        }
    }
    impl ToData for f64 {
        fn to_data(self) -> super::Data {
            super::Data::F32(vec![self as f32])
        }
    }
    impl ToData for i64 {
        fn to_data(self) -> super::Data {
            super::Data::I64(vec![self])
        }
    }
    impl ToData for i32 {
        fn to_data(self) -> super::Data {
            super::Data::I64(vec![self as i64])
        }
    }
    impl ToData for bool {
        fn to_data(self) -> super::Data {
            super::Data::Bool(vec![self])
        }
    }
    impl FromF64 for bool {
        fn from_f64(v: f64) -> Self {
            v != 0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trip() {
        for h in [
            Host {
                shape: vec![2, 3],
                data: Data::F32(vec![1.0, -2.5, 3.0, 0.0, 5.0, 6.0]),
            },
            Host {
                shape: vec![3],
                data: Data::I64(vec![1, -2, 1 << 40]),
            },
            Host {
                shape: vec![],
                data: Data::I32(vec![7]),
            },
            Host {
                shape: vec![2],
                data: Data::Bool(vec![true, false]),
            },
        ] {
            assert_eq!(Host::from_npy(&h.to_npy()).unwrap(), h);
        }
    }
}
