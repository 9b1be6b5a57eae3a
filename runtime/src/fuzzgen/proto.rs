//! tandem tensors and attribute values as ONNX protobuf messages, for generated models.
//!
//! Sits between `tandem_ops` values and the messages of `crate::import::proto`.

use crate::import::proto::*;
use tandem_ops::{AttrValue, DType, Tensor};

fn onnx_code(d: DType) -> i32 {
    match d {
        DType::F32 => data_type::FLOAT,
        DType::F16 => data_type::FLOAT16,
        DType::F64 => data_type::DOUBLE,
        DType::I64 => data_type::INT64,
        DType::I32 => data_type::INT32,
        DType::I8 => data_type::INT8,
        DType::U8 => data_type::UINT8,
        DType::Bool => data_type::BOOL,
    }
}

/// `t` as an initializer (raw little-endian data).
pub fn tensor_proto(name: &str, t: &Tensor) -> TensorProto {
    let raw = t.data.to_le_bytes();
    TensorProto {
        name: name.into(),
        dims: t.shape.iter().map(|&d| d as i64).collect(),
        data_type: onnx_code(t.dtype()),
        raw_data: Some(raw.into()),
        ..Default::default()
    }
}

/// A tensor value type with a fixed shape.
pub fn value_info(name: &str, dtype: DType, shape: &[usize]) -> ValueInfoProto {
    let dim = shape
        .iter()
        .map(|&d| Dimension {
            dim_value: Some(d as i64),
            dim_param: None,
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: onnx_code(dtype),
                shape: Some(TensorShapeProto { dim }),
            }),
            ..Default::default()
        }),
    }
}

/// An ONNX attribute holding `v`.
pub fn attribute(name: &str, v: &AttrValue) -> AttributeProto {
    use attribute_type as at;
    let a = AttributeProto {
        name: name.into(),
        ..Default::default()
    };
    match v {
        AttrValue::Int(i) => AttributeProto {
            r#type: at::INT,
            i: Some(*i),
            ..a
        },
        AttrValue::Float(f) => AttributeProto {
            r#type: at::FLOAT,
            f: Some(*f),
            ..a
        },
        AttrValue::Ints(v) => AttributeProto {
            r#type: at::INTS,
            ints: v.clone(),
            ..a
        },
        AttrValue::Floats(v) => AttributeProto {
            r#type: at::FLOATS,
            floats: v.clone(),
            ..a
        },
        AttrValue::String(s) => AttributeProto {
            r#type: at::STRING,
            s: Some(s.as_bytes().to_vec()),
            ..a
        },
        AttrValue::Strings(v) => AttributeProto {
            r#type: at::STRINGS,
            strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
            ..a
        },
        AttrValue::Tensor(t) => AttributeProto {
            r#type: at::TENSOR,
            t: Some(tensor_proto("", t)),
            ..a
        },
    }
}
