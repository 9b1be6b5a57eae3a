//! ONNX node attributes to [`tandem_ops::Attrs`], and `Constant` nodes to tensors.
//!
//! Sits between the protobuf `AttributeProto`s of a node and the operator constructors
//! (`tandem_ops::registry::build`), which read the converted values.

use super::tensor::tensor_from_proto;
use super::Problem;
use crate::onnx_proto::{attribute_type as at, AttributeProto, NodeProto};
use std::path::Path;
use tandem_ops::{AttrValue, Attrs, Tensor};

/// The attributes of `node`, with `opset` (the version of the node's domain).
pub fn convert_attrs(
    node: &NodeProto,
    opset: i64,
    base_dir: Option<&Path>,
) -> Result<Attrs, Problem> {
    let mut attrs = Attrs::new(opset);
    for a in &node.attribute {
        if a.name.is_empty() {
            return Err(Problem::Invalid("an attribute has no name".into()));
        }
        if !a.ref_attr_name.is_empty() {
            return Err(Problem::Invalid(format!(
                "attribute `{}` refers to function attribute `{}` outside a function",
                a.name, a.ref_attr_name
            )));
        }
        let v = convert(a, base_dir)?;
        if attrs.values.insert(a.name.clone(), v).is_some() {
            return Err(Problem::Invalid(format!(
                "attribute `{}` is given twice",
                a.name
            )));
        }
    }
    Ok(attrs)
}

/// The attribute's type; very old models leave `type` unset and only fill the value field.
fn attr_type(a: &AttributeProto) -> i32 {
    if a.r#type != at::UNDEFINED {
        return a.r#type;
    }
    if a.f.is_some() {
        at::FLOAT
    } else if a.i.is_some() {
        at::INT
    } else if a.s.is_some() {
        at::STRING
    } else if a.t.is_some() {
        at::TENSOR
    } else if a.g.is_some() || !a.graphs.is_empty() {
        at::GRAPH
    } else if !a.floats.is_empty() {
        at::FLOATS
    } else if !a.ints.is_empty() {
        at::INTS
    } else if !a.strings.is_empty() {
        at::STRINGS
    } else {
        at::UNDEFINED
    }
}

fn utf8(name: &str, b: &[u8]) -> Result<String, Problem> {
    String::from_utf8(b.to_vec())
        .map_err(|_| Problem::Invalid(format!("attribute `{name}` is not valid UTF-8")))
}

fn convert(a: &AttributeProto, base_dir: Option<&Path>) -> Result<AttrValue, Problem> {
    let name = a.name.as_str();
    let other = |kind: &str| {
        Err(Problem::Unsupported(format!(
            "attribute `{name}` of type {kind} is not supported"
        )))
    };
    Ok(match attr_type(a) {
        at::FLOAT => AttrValue::Float(a.f.unwrap_or(0.0)),
        at::INT => AttrValue::Int(a.i.unwrap_or(0)),
        at::STRING => AttrValue::String(utf8(name, a.s.as_deref().unwrap_or(&[]))?),
        at::TENSOR => {
            let t = a.t.as_ref().ok_or_else(|| {
                Problem::Invalid(format!("tensor attribute `{name}` has no tensor"))
            })?;
            let t = tensor_from_proto(t, base_dir)
                .map_err(|p| p.context(&format!("attribute `{name}`")))?;
            AttrValue::Tensor(t)
        }
        at::FLOATS => AttrValue::Floats(a.floats.clone()),
        at::INTS => AttrValue::Ints(a.ints.clone()),
        at::STRINGS => AttrValue::Strings(
            a.strings
                .iter()
                .map(|s| utf8(name, s))
                .collect::<Result<_, _>>()?,
        ),
        at::GRAPH | at::GRAPHS => {
            return Err(Problem::Unsupported(format!(
                "attribute `{name}` is a graph: subgraphs (If/Loop/Scan) are not supported"
            )))
        }
        at::TENSORS => return other("TENSORS"),
        at::SPARSE_TENSOR => return other("SPARSE_TENSOR"),
        at::SPARSE_TENSORS => return other("SPARSE_TENSORS"),
        at::TYPE_PROTO => return other("TYPE_PROTO"),
        at::TYPE_PROTOS => return other("TYPE_PROTOS"),
        at::UNDEFINED => {
            return Err(Problem::Invalid(format!(
                "attribute `{name}` has no type and no value"
            )))
        }
        t => {
            return Err(Problem::Invalid(format!(
                "attribute `{name}` has unknown type {t}"
            )))
        }
    })
}

/// The tensor a `Constant` node produces: exactly one of `value`, `value_float(s)`,
/// `value_int(s)` (string and sparse values are refused).
pub fn constant_value(attrs: &Attrs) -> Result<Tensor, Problem> {
    if attrs.values.len() != 1 {
        let names: Vec<&str> = attrs.values.keys().map(|k| k.as_str()).collect();
        return Err(Problem::Invalid(format!(
            "Constant needs exactly one value attribute, got {names:?}"
        )));
    }
    let (name, v) = attrs.values.iter().next().expect("one attribute");
    let wrong = || {
        Problem::Invalid(format!(
            "Constant attribute `{name}` has the wrong type: {v:?}"
        ))
    };
    Ok(match (name.as_str(), v) {
        ("value", AttrValue::Tensor(t)) => t.clone(),
        ("value_float", AttrValue::Float(f)) => Tensor::f32(&[], vec![*f]),
        ("value_floats", AttrValue::Floats(f)) => Tensor::f32(&[f.len()], f.clone()),
        ("value_int", AttrValue::Int(i)) => Tensor::i64(&[], vec![*i]),
        ("value_ints", AttrValue::Ints(i)) => Tensor::i64(&[i.len()], i.clone()),
        ("value_string" | "value_strings", _) => {
            return Err(Problem::Unsupported(
                "string constants are not supported (dtype string)".into(),
            ))
        }
        ("value" | "value_float" | "value_floats" | "value_int" | "value_ints", _) => {
            return Err(wrong())
        }
        _ => {
            return Err(Problem::Invalid(format!(
                "Constant has unknown attribute `{name}`"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx_proto::{data_type, Opaque, TensorProto};

    fn attr(name: &str, ty: i32) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: ty,
            ..Default::default()
        }
    }

    fn node_with(attrs: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            op_type: "X".into(),
            attribute: attrs,
            ..Default::default()
        }
    }

    #[test]
    fn every_supported_kind_converts_and_carries_the_opset() {
        let n = node_with(vec![
            AttributeProto {
                f: Some(0.25),
                ..attr("f", at::FLOAT)
            },
            AttributeProto {
                i: Some(-3),
                ..attr("i", at::INT)
            },
            AttributeProto {
                s: Some(b"NOTSET".to_vec()),
                ..attr("s", at::STRING)
            },
            AttributeProto {
                floats: vec![1.5, 2.0],
                ..attr("fs", at::FLOATS)
            },
            AttributeProto {
                ints: vec![0, 7],
                ..attr("is", at::INTS)
            },
            AttributeProto {
                strings: vec![b"a".to_vec(), b"bc".to_vec()],
                ..attr("ss", at::STRINGS)
            },
            AttributeProto {
                t: Some(TensorProto {
                    dims: vec![2],
                    data_type: data_type::INT64,
                    int64_data: vec![4, 5],
                    ..Default::default()
                }),
                ..attr("t", at::TENSOR)
            },
            // Old models: no type, the set field decides.
            AttributeProto {
                i: Some(9),
                ..attr("old_int", at::UNDEFINED)
            },
            AttributeProto {
                ints: vec![1],
                ..attr("old_ints", at::UNDEFINED)
            },
        ]);
        let a = convert_attrs(&n, 11, None).unwrap();
        assert_eq!(a.opset, 11);
        let v = |k: &str| a.values.get(k).cloned().unwrap();
        assert_eq!(v("f"), AttrValue::Float(0.25));
        assert_eq!(v("i"), AttrValue::Int(-3));
        assert_eq!(v("s"), AttrValue::String("NOTSET".into()));
        assert_eq!(v("fs"), AttrValue::Floats(vec![1.5, 2.0]));
        assert_eq!(v("is"), AttrValue::Ints(vec![0, 7]));
        assert_eq!(v("ss"), AttrValue::Strings(vec!["a".into(), "bc".into()]));
        assert_eq!(v("t"), AttrValue::Tensor(Tensor::i64(&[2], vec![4, 5])));
        assert_eq!(v("old_int"), AttrValue::Int(9));
        assert_eq!(v("old_ints"), AttrValue::Ints(vec![1]));
    }

    #[test]
    fn unsupported_and_malformed_attributes_are_refused() {
        let unsupported =
            |a: AttributeProto, want: &str| match convert_attrs(&node_with(vec![a]), 1, None) {
                Err(Problem::Unsupported(m)) => assert!(m.contains(want), "{m}"),
                other => panic!("expected Unsupported({want}), got {other:?}"),
            };
        unsupported(
            AttributeProto {
                g: Some(Opaque {}),
                ..attr("body", at::GRAPH)
            },
            "subgraphs (If/Loop/Scan) are not supported",
        );
        unsupported(
            AttributeProto {
                g: Some(Opaque {}),
                ..attr("body", 0)
            },
            "subgraphs",
        );
        unsupported(attr("sp", at::SPARSE_TENSOR), "SPARSE_TENSOR");
        unsupported(attr("ts", at::TENSORS), "TENSORS");
        unsupported(
            AttributeProto {
                t: Some(TensorProto {
                    data_type: 16,
                    ..Default::default()
                }),
                ..attr("t", at::TENSOR)
            },
            "bfloat16",
        );
        let invalid = |attrs: Vec<AttributeProto>| {
            let r = convert_attrs(&node_with(attrs), 1, None);
            assert!(matches!(r, Err(Problem::Invalid(_))), "{r:?}");
        };
        invalid(vec![AttributeProto {
            s: Some(vec![0xff, 0xfe]),
            ..attr("s", at::STRING)
        }]);
        invalid(vec![attr("a", at::INT), attr("a", at::INT)]);
        invalid(vec![attr("nothing", at::UNDEFINED)]);
        invalid(vec![attr("weird", 99)]);
        invalid(vec![attr("", at::INT)]);
    }

    #[test]
    fn constant_values() {
        let one = |name: &str, v: AttrValue| Attrs::new(13).with(name, v);
        let c = |a: &Attrs| constant_value(a);
        assert_eq!(
            c(&one("value_float", AttrValue::Float(2.5))).unwrap(),
            Tensor::f32(&[], vec![2.5])
        );
        assert_eq!(
            c(&one("value_ints", AttrValue::Ints(vec![3, -1]))).unwrap(),
            Tensor::i64(&[2], vec![3, -1])
        );
        assert_eq!(
            c(&one("value_int", AttrValue::Int(7))).unwrap(),
            Tensor::i64(&[], vec![7])
        );
        assert_eq!(
            c(&one("value_floats", AttrValue::Floats(vec![1.0]))).unwrap(),
            Tensor::f32(&[1], vec![1.0])
        );
        let t = Tensor::f32(&[1, 2], vec![1., 2.]);
        assert_eq!(c(&one("value", AttrValue::Tensor(t.clone()))).unwrap(), t);
        assert!(matches!(
            c(&one("value_string", AttrValue::String("x".into()))),
            Err(Problem::Unsupported(_))
        ));
        assert!(matches!(c(&Attrs::new(13)), Err(Problem::Invalid(_))));
        let two = one("value_int", AttrValue::Int(1)).with("value_float", AttrValue::Float(1.0));
        assert!(matches!(c(&two), Err(Problem::Invalid(_))));
        assert!(matches!(
            c(&one("value", AttrValue::Int(1))),
            Err(Problem::Invalid(_))
        ));
    }
}
