//! Importer tests: small models built here with the prost messages (no committed binaries),
//! one per validation error plus happy paths; and, when the ONNX node tests have been
//! generated into conformance-data/node, a sweep checking that every one of them imports or
//! fails with an `Unsupported` node error (never `InvalidModel`, never a panic).

use prost::Message;
use std::path::{Path, PathBuf};
use tandem::graph::{Dim, Graph};
use tandem::import::proto::*;
use tandem::import::{import_bytes, import_file, read_tensor_pb};
use tandem::{DType, Data, Error, Tensor};
use tandem_ops::OpError;

// ---- model building helpers ----

fn vi(name: &str, elem: i32, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| match d {
                            Ok(v) => Dimension {
                                dim_value: Some(*v),
                                dim_param: None,
                            },
                            Err("") => Dimension::default(),
                            Err(p) => Dimension {
                                dim_value: None,
                                dim_param: Some(p.to_string()),
                            },
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
    }
}

fn f32_vi(name: &str, dims: &[i64]) -> ValueInfoProto {
    let d: Vec<Result<i64, &str>> = dims.iter().map(|&v| Ok(v)).collect();
    vi(name, data_type::FLOAT, &d)
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

fn raw_f32(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::FLOAT,
        raw_data: Some(
            v.iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        ),
        ..Default::default()
    }
}

fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i: Some(v),
        ..Default::default()
    }
}

fn graph(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
) -> GraphProto {
    GraphProto {
        node: nodes,
        name: "g".into(),
        initializer: inits,
        input: inputs,
        output: outputs,
        ..Default::default()
    }
}

fn model(g: GraphProto) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 13,
        }],
        producer_name: "test".into(),
        graph: Some(g),
        functions: vec![],
    }
}

fn import(m: &ModelProto) -> tandem::Result<Graph> {
    import_bytes(&m.encode_to_vec(), None)
}

/// A valid two-node chain X -> MatMul(W) -> T -> MatMul(W2) -> Y.
fn chain() -> GraphProto {
    graph(
        vec![
            node("MatMul", "mm0", &["X", "W"], &["T"]),
            node("MatMul", "mm1", &["T", "W2"], &["Y"]),
        ],
        vec![f32_vi("X", &[1, 2])],
        vec![f32_vi("Y", &[1, 2])],
        vec![
            raw_f32("W", &[2, 2], &[1., 2., 3., 4.]),
            raw_f32("W2", &[2, 2], &[1., 0., 0., 1.]),
        ],
    )
}

fn invalid_msg(r: tandem::Result<Graph>) -> String {
    match r {
        Err(Error::InvalidModel(m)) => m,
        other => panic!("expected InvalidModel, got {other:?}"),
    }
}

fn node_err(r: tandem::Result<Graph>) -> (String, String, i64, OpError) {
    match r {
        Err(Error::Node {
            node,
            op_type,
            opset,
            source,
        }) => (node, op_type, opset, source),
        other => panic!("expected a node error, got {other:?}"),
    }
}

fn unsupported_msg(r: tandem::Result<Graph>) -> String {
    match node_err(r).3 {
        OpError::Unsupported(m) => m,
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-import-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

// ---- happy paths ----

#[test]
fn imports_out_of_order_nodes_initializers_constants_and_declared_types() {
    let mut g = graph(
        vec![
            // Listed consumer-first: the importer must sort.
            node("MatMul", "", &["T", "W"], &["Y"]),
            node("MatMul", "first", &["X", "C"], &["T"]),
            NodeProto {
                attribute: vec![AttributeProto {
                    name: "value_floats".into(),
                    r#type: attribute_type::FLOATS,
                    floats: vec![1., 0., 0., 1.],
                    ..Default::default()
                }],
                ..node("Constant", "c", &[], &["C"])
            },
        ],
        vec![
            vi("X", data_type::FLOAT, &[Err("batch"), Ok(4), Err("")]),
            // Also an initializer: not a graph input to feed.
            f32_vi("W", &[2, 2]),
        ],
        vec![f32_vi("Y", &[3, 2])],
        vec![TensorProto {
            name: "W".into(),
            dims: vec![2, 2],
            data_type: data_type::FLOAT,
            float_data: vec![1., 2., 3., 4.],
            ..Default::default()
        }],
    );
    g.value_info
        .push(vi("T", data_type::FLOAT, &[Ok(3), Err("n")]));
    let mut m = model(g);
    m.opset_import = vec![
        OperatorSetIdProto {
            domain: "ai.onnx".into(),
            version: 17,
        },
        OperatorSetIdProto {
            domain: "ai.onnx.ml".into(),
            version: 3,
        },
    ];
    let g = import(&m).unwrap();

    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        ["first", "MatMul_0"],
        "topological order, default name"
    );
    assert!(g.nodes.iter().all(|n| n.opset == 17 && n.domain.is_empty()));

    let x = g.value_id("X").unwrap();
    assert_eq!(g.inputs, vec![x], "W is an initializer, not an input");
    let xv = &g.values[x];
    assert_eq!(xv.dtype, Some(DType::F32));
    assert_eq!(
        xv.shape,
        Some(vec![
            Dim::Symbolic("batch".into()),
            Dim::Fixed(4),
            Dim::Symbolic(String::new())
        ])
    );
    assert!(xv.constant.is_none());

    let w = &g.values[g.value_id("W").unwrap()];
    assert_eq!(
        **w.constant.as_ref().unwrap(),
        Tensor::f32(&[2, 2], vec![1., 2., 3., 4.])
    );
    assert_eq!(w.shape, Some(vec![Dim::Fixed(2), Dim::Fixed(2)]));

    // The Constant node is folded into a constant value.
    let c = &g.values[g.value_id("C").unwrap()];
    assert_eq!(
        **c.constant.as_ref().unwrap(),
        Tensor::f32(&[4], vec![1., 0., 0., 1.])
    );

    let t = g.value_id("T").unwrap();
    assert_eq!(
        g.values[t].shape,
        Some(vec![Dim::Fixed(3), Dim::Symbolic("n".into())])
    );
    assert_eq!(g.nodes[0].outputs, vec![t]);
    assert_eq!(g.nodes[1].inputs, vec![Some(t), g.value_id("W")]);
    let y = g.value_id("Y").unwrap();
    assert_eq!(g.outputs, vec![y]);
    assert_eq!(g.values[y].shape, Some(vec![Dim::Fixed(3), Dim::Fixed(2)]));
}

#[test]
fn optional_inputs_with_empty_names_are_none_and_trailing_ones_dropped() {
    let g = graph(
        vec![
            node("Clip", "mid", &["A", "", "C"], &["Y"]),
            node("Clip", "tail", &["A", "B", ""], &["Z"]),
        ],
        vec![f32_vi("A", &[2, 2]), f32_vi("B", &[]), f32_vi("C", &[])],
        vec![f32_vi("Y", &[2, 2]), f32_vi("Z", &[2, 2])],
        vec![],
    );
    let g = import(&model(g)).unwrap();
    let id = |n: &str| g.value_id(n);
    assert_eq!(g.nodes[0].inputs, vec![id("A"), None, id("C")]);
    assert_eq!(g.nodes[1].inputs, vec![id("A"), id("B")]);
    assert_eq!(g.inputs.len(), 3);
}

#[test]
fn typed_data_fields_decode_per_dtype() {
    let t = |data_type: i32, dims: &[i64]| TensorProto {
        name: format!("t{data_type}"),
        dims: dims.to_vec(),
        data_type,
        ..Default::default()
    };
    let cases = vec![
        // float16 travels as bit patterns: 0x3C00 = 1.0, 0xC000 = -2.0.
        (
            TensorProto {
                int32_data: vec![0x3C00, 0xC000],
                ..t(data_type::FLOAT16, &[2])
            },
            Data::F16(vec![half::f16::from_f32(1.0), half::f16::from_f32(-2.0)]),
        ),
        (
            TensorProto {
                int32_data: vec![1, 0, 7],
                ..t(data_type::BOOL, &[3])
            },
            Data::Bool(vec![true, false, true]),
        ),
        (
            TensorProto {
                int32_data: vec![-5, 127],
                ..t(data_type::INT8, &[2])
            },
            Data::I8(vec![-5, 127]),
        ),
        (
            TensorProto {
                int32_data: vec![200],
                ..t(data_type::UINT8, &[1])
            },
            Data::U8(vec![200]),
        ),
        (
            TensorProto {
                int32_data: vec![-3, 4],
                ..t(data_type::INT32, &[2, 1])
            },
            Data::I32(vec![-3, 4]),
        ),
        (
            TensorProto {
                int64_data: vec![1 << 40],
                ..t(data_type::INT64, &[])
            },
            Data::I64(vec![1 << 40]),
        ),
        (
            TensorProto {
                double_data: vec![0.5, -1.25],
                ..t(data_type::DOUBLE, &[2])
            },
            Data::F64(vec![0.5, -1.25]),
        ),
        // raw_data is little endian: i64 258 = 02 01 00.., i32 -2 = fe ff ff ff.
        (
            TensorProto {
                raw_data: Some(vec![2, 1, 0, 0, 0, 0, 0, 0].into()),
                ..t(data_type::INT64, &[1])
            },
            Data::I64(vec![258]),
        ),
        (
            TensorProto {
                raw_data: Some(vec![0xfe, 0xff, 0xff, 0xff].into()),
                ..t(data_type::INT32, &[1])
            },
            Data::I32(vec![-2]),
        ),
        (
            TensorProto {
                raw_data: Some(vec![0x00, 0x3c].into()),
                ..t(data_type::FLOAT16, &[1])
            },
            Data::F16(vec![half::f16::from_f32(1.0)]),
        ),
        (
            TensorProto {
                raw_data: Some(vec![0, 1, 2].into()),
                ..t(data_type::BOOL, &[3])
            },
            Data::Bool(vec![false, true, true]),
        ),
        // An empty tensor.
        (t(data_type::FLOAT, &[0, 3]), Data::F32(vec![])),
    ];
    for (proto, want) in cases {
        let (name, got) = read_tensor_pb(&proto.encode_to_vec()).unwrap();
        assert_eq!(name, proto.name);
        assert_eq!(got.data, want, "{name}");
        let dims: Vec<usize> = proto.dims.iter().map(|&d| d as usize).collect();
        assert_eq!(got.shape, dims);
    }
}

#[test]
fn external_data_is_read_relative_to_the_model_folder() {
    let dir = tmpdir("ext");
    std::fs::create_dir_all(dir.join("w")).unwrap();
    // 3 junk bytes, then W's four f32 values.
    let mut bytes = vec![9u8, 9, 9];
    for v in [1f32, -2., 3.5, 4.] {
        bytes.extend(v.to_le_bytes());
    }
    std::fs::write(dir.join("w/data.bin"), &bytes).unwrap();
    let ext = |loc: &str, offset: &str, length: Option<&str>| {
        let mut e = vec![
            StringStringEntryProto {
                key: "location".into(),
                value: loc.into(),
            },
            StringStringEntryProto {
                key: "offset".into(),
                value: offset.into(),
            },
        ];
        if let Some(l) = length {
            e.push(StringStringEntryProto {
                key: "length".into(),
                value: l.into(),
            });
        }
        let mut g = chain();
        g.initializer[0] = TensorProto {
            name: "W".into(),
            dims: vec![2, 2],
            data_type: data_type::FLOAT,
            external_data: e,
            data_location: DATA_LOCATION_EXTERNAL,
            ..Default::default()
        };
        let path = dir.join("model.onnx");
        std::fs::write(&path, model(g).encode_to_vec()).unwrap();
        path
    };

    let g = import_file(&ext("w/data.bin", "3", Some("16"))).unwrap();
    let w = g.values[g.value_id("W").unwrap()].constant.clone().unwrap();
    assert_eq!(*w, Tensor::f32(&[2, 2], vec![1., -2., 3.5, 4.]));

    let m = invalid_msg(import_file(&ext("w/data.bin", "4", Some("16"))));
    assert!(m.contains("exceed"), "{m}");
    let m = invalid_msg(import_file(&ext("w/data.bin", "0", Some("12"))));
    assert!(m.contains("length 12"), "{m}");
    let m = invalid_msg(import_file(&ext("w/missing.bin", "0", None)));
    assert!(m.contains("not found"), "{m}");
    for bad in ["/etc/passwd", "../data.bin", "w/../../x.bin"] {
        let m = invalid_msg(import_file(&ext(bad, "0", None)));
        assert!(m.contains("inside the model's folder"), "{bad}: {m}");
    }
    // A symlink leading out of the folder is refused too.
    #[cfg(unix)]
    {
        let outside = tmpdir("ext-outside");
        std::fs::write(outside.join("d.bin"), &bytes).unwrap();
        std::os::unix::fs::symlink(outside.join("d.bin"), dir.join("link.bin")).unwrap();
        let m = invalid_msg(import_file(&ext("link.bin", "3", None)));
        assert!(m.contains("outside the model's folder"), "{m}");
        std::fs::remove_dir_all(outside).unwrap();
    }
    // Without a folder, external data cannot be resolved.
    let bytes = std::fs::read(ext("w/data.bin", "3", None)).unwrap();
    let m = invalid_msg(import_bytes(&bytes, None));
    assert!(m.contains("folder is unknown"), "{m}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn missing_file_is_an_io_error() {
    let r = import_file(Path::new("/nonexistent/model.onnx"));
    assert!(matches!(r, Err(Error::Io { .. })), "{r:?}");
}

// ---- validation errors ----

#[test]
fn bad_protobuf_is_invalid_model() {
    let m = invalid_msg(import_bytes(&[0xff, 0xff, 0xff, 0x07, 0x01], None));
    assert!(m.contains("protobuf"), "{m}");
    let m = invalid_msg(import_bytes(&[], None));
    assert!(m.contains("no graph"), "{m}");
}

#[test]
fn corrupted_models_never_panic() {
    let good = model(chain()).encode_to_vec();
    for i in 0..good.len() {
        let _ = import_bytes(&good[..i], None);
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = good.clone();
            b[i] ^= flip;
            let _ = import_bytes(&b, None);
        }
    }
}

#[test]
fn dangling_input_is_invalid() {
    let mut g = chain();
    g.node[1].input[1] = "nowhere".into();
    let m = invalid_msg(import(&model(g)));
    assert!(m.contains("mm1") && m.contains("nowhere"), "{m}");
}

#[test]
fn value_produced_twice_is_invalid() {
    let mut g = chain();
    g.node[1].output[0] = "T".into();
    let m = invalid_msg(import(&model(g)));
    assert!(m.contains("`T` is produced twice"), "{m}");

    let mut g = chain();
    g.node[0].output[0] = "X".into();
    let m = invalid_msg(import(&model(g)));
    assert!(m.contains("`X` is produced twice"), "{m}");

    let mut g = chain();
    g.initializer.push(raw_f32("W", &[1], &[0.]));
    let m = invalid_msg(import(&model(g)));
    assert!(m.contains("`W` is produced twice"), "{m}");
}

#[test]
fn cycle_is_invalid_and_names_a_node_in_it() {
    // `down` (listed first) only depends on the cycle a <-> b.
    let g = graph(
        vec![
            node("MatMul", "down", &["U", "W"], &["Y"]),
            node("MatMul", "a", &["X", "U"], &["T"]),
            node("MatMul", "b", &["T", "W"], &["U"]),
        ],
        vec![f32_vi("X", &[2, 2])],
        vec![f32_vi("Y", &[2, 2])],
        vec![raw_f32("W", &[2, 2], &[0.; 4])],
    );
    let m = invalid_msg(import(&model(g)));
    assert!(m.contains("cycle"), "{m}");
    assert!(m.contains("`a`") || m.contains("`b`"), "{m}");

    let g = graph(
        vec![node("MatMul", "self", &["X", "T"], &["T"])],
        vec![f32_vi("X", &[2, 2])],
        vec![f32_vi("T", &[2, 2])],
        vec![],
    );
    let m = invalid_msg(import(&model(g)));
    assert!(m.contains("cycle through node `self`"), "{m}");
}

#[test]
fn initializer_length_must_match_dims() {
    let mut g = chain();
    g.initializer[0] = raw_f32("W", &[2, 2], &[1., 2., 3.]);
    let m = invalid_msg(import(&model(g)));
    assert!(
        m.contains("`W`") && m.contains("16 bytes") && m.contains("12"),
        "{m}"
    );

    let mut g = chain();
    g.initializer[0] = TensorProto {
        name: "W".into(),
        dims: vec![2, 2],
        data_type: data_type::FLOAT,
        float_data: vec![1.; 5],
        ..Default::default()
    };
    let m = invalid_msg(import(&model(g)));
    assert!(m.contains("float_data has 5"), "{m}");
}

#[test]
fn huge_or_negative_dims_are_refused_before_allocating() {
    for (dims, want) in [
        (vec![i64::MAX, 4], "overflows"),
        (vec![1 << 20, 1 << 20, 1 << 10], "limit"),
        (vec![2, -1], "negative"),
    ] {
        let mut g = chain();
        g.initializer[0] = TensorProto {
            name: "W".into(),
            dims,
            data_type: data_type::FLOAT,
            raw_data: Some(vec![0; 4].into()),
            ..Default::default()
        };
        let m = invalid_msg(import(&model(g)));
        assert!(m.contains(want), "{m}");
    }
}

#[test]
fn unsupported_dtypes_are_named_on_the_node_using_them() {
    let mut g = chain();
    g.initializer[0] = TensorProto {
        name: "W".into(),
        dims: vec![1],
        data_type: data_type::STRING,
        string_data: vec![b"hi".to_vec()],
        ..Default::default()
    };
    let (node, op_type, opset, src) = node_err(import(&model(g)));
    assert_eq!(
        (node.as_str(), op_type.as_str(), opset),
        ("mm0", "MatMul", 13)
    );
    assert!(matches!(&src, OpError::Unsupported(m) if m.contains("string") && m.contains("`W`")));

    let mut g = chain();
    g.input[0] = vi("X", data_type::BFLOAT16, &[Ok(1), Ok(2)]);
    let m = unsupported_msg(import(&model(g)));
    assert!(m.contains("bfloat16") && m.contains("`X`"), "{m}");

    let mut g = chain();
    g.input[0].r#type = Some(TypeProto {
        sequence_type: Some(Opaque {}),
        ..Default::default()
    });
    let m = unsupported_msg(import(&model(g)));
    assert!(m.contains("sequence"), "{m}");

    // A declared output type tandem cannot hold fails on its producer.
    let mut g = chain();
    g.output[0] = vi("Y", data_type::COMPLEX64, &[]);
    let (node, _, _, src) = node_err(import(&model(g)));
    assert_eq!(node, "mm1");
    assert!(matches!(&src, OpError::Unsupported(m) if m.contains("complex64")));

    // An unused initializer of an unsupported dtype is dropped, not an error.
    let mut g = chain();
    g.initializer.push(TensorProto {
        name: "unused".into(),
        dims: vec![1],
        data_type: data_type::UINT16,
        int32_data: vec![1],
        ..Default::default()
    });
    let g = import(&model(g)).unwrap();
    assert!(g.value_id("unused").is_none());
}

#[test]
fn sparse_initializers_are_unsupported() {
    let mut g = chain();
    g.initializer.remove(0);
    g.sparse_initializer.push(SparseTensorProto {
        values: Some(TensorProtoName { name: "W".into() }),
    });
    let m = unsupported_msg(import(&model(g)));
    assert!(m.contains("sparse"), "{m}");
}

#[test]
fn graph_output_must_be_produced() {
    let mut g = chain();
    g.output.push(f32_vi("ghost", &[1]));
    let m = invalid_msg(import(&model(g)));
    assert!(m.contains("`ghost`"), "{m}");
}

#[test]
fn unknown_domain_is_unsupported_and_named() {
    let mut g = chain();
    g.node[1].domain = "com.example".into();
    let mut m = model(g);
    m.opset_import.push(OperatorSetIdProto {
        domain: "com.example".into(),
        version: 2,
    });
    let (node, _, opset, src) = node_err(import(&m));
    assert_eq!((node.as_str(), opset), ("mm1", 2));
    assert!(matches!(&src, OpError::Unsupported(m) if m.contains("`com.example`")));
}

#[test]
fn missing_default_opset_is_invalid() {
    let mut m = model(chain());
    m.opset_import.clear();
    let msg = invalid_msg(import(&m));
    assert!(msg.contains("opset_import"), "{msg}");
}

#[test]
fn unsupported_op_comes_from_the_registry_with_node_context() {
    let mut g = chain();
    g.node[1].op_type = "NoSuchOp".into();
    g.node[1].name = String::new();
    let (node, op_type, opset, src) = node_err(import(&model(g)));
    assert_eq!(
        (node.as_str(), op_type.as_str(), opset),
        ("NoSuchOp_1", "NoSuchOp", 13)
    );
    assert!(matches!(&src, OpError::Unsupported(m) if m.contains("NoSuchOp")));
}

#[test]
fn attributes_reach_the_constructor() {
    // Gemm refuses transA = 2: the INT attribute arrived.
    let g = graph(
        vec![NodeProto {
            attribute: vec![attr_int("transA", 2)],
            ..node("Gemm", "g", &["A", "B"], &["Y"])
        }],
        vec![f32_vi("A", &[2, 2]), f32_vi("B", &[2, 2])],
        vec![f32_vi("Y", &[2, 2])],
        vec![],
    );
    let (node, _, _, src) = node_err(import(&model(g)));
    assert_eq!(node, "g");
    assert!(
        matches!(&src, OpError::Invalid(m) if m.contains("transA")),
        "{src:?}"
    );
}

#[test]
fn subgraph_attributes_are_unsupported() {
    let mut g = chain();
    g.node[0].attribute.push(AttributeProto {
        name: "then_branch".into(),
        r#type: attribute_type::GRAPH,
        g: Some(Opaque {}),
        ..Default::default()
    });
    let m = unsupported_msg(import(&model(g)));
    assert!(
        m.contains("subgraphs (If/Loop/Scan) are not supported"),
        "{m}"
    );
}

// ---- conformance sweep ----

/// Groups unsupported messages: the registry's "op type not implemented" and the importer's
/// own refusals (dtype, domain, subgraphs...) by their first words.
fn reason_class(m: &str) -> String {
    if m.contains("is not implemented; supported:") {
        return "op type not in the registry".into();
    }
    if let Some(i) = m.find("dtype ") {
        return m[i..].split(" is not").next().unwrap_or(m).to_string();
    }
    if m.starts_with("domain `") {
        return m.split(':').next().unwrap_or(m).to_string();
    }
    let m = m.split(": ").last().unwrap_or(m);
    m.chars().take(70).collect()
}

/// The generated ONNX node tests (scripts/gen_conformance.py), if present.
fn node_tests_dir() -> Option<PathBuf> {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance-data/node");
    d.is_dir().then_some(d)
}

#[test]
fn every_onnx_node_test_imports_or_is_unsupported() {
    let Some(dir) = node_tests_dir() else {
        eprintln!("conformance-data/node not generated: sweep skipped");
        return;
    };
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    cases.sort();
    let (mut ok, mut unsupported, mut bad) = (0, 0, Vec::new());
    let (mut pb_ok, mut pb_unsupported) = (0, 0);
    let mut reasons = std::collections::BTreeMap::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let r = std::panic::catch_unwind(|| import_file(&case.join("model.onnx")));
        match r {
            Ok(Ok(_)) => {
                ok += 1;
                // The test data of importable models must read too.
                let data = case.join("test_data_set_0");
                for f in std::fs::read_dir(&data).into_iter().flatten() {
                    let f = f.unwrap().path();
                    match read_tensor_pb(&std::fs::read(&f).unwrap()) {
                        Ok(_) => pb_ok += 1,
                        Err(Error::Input { .. }) => pb_unsupported += 1,
                        Err(e) => bad.push(format!("{name}/{}: {e}", f.display())),
                    }
                }
            }
            Ok(Err(Error::Node {
                source: OpError::Unsupported(m),
                ..
            })) => {
                unsupported += 1;
                *reasons.entry(reason_class(&m)).or_insert(0) += 1;
            }
            Ok(Err(e)) => bad.push(format!("{name}: {e}")),
            Err(_) => bad.push(format!("{name}: PANIC")),
        }
    }
    println!(
        "onnx node tests: {} models, {ok} imported, {unsupported} unsupported, {} wrong; \
         test data files: {pb_ok} read, {pb_unsupported} unsupported dtype",
        cases.len(),
        bad.len()
    );
    let mut reasons: Vec<_> = reasons.into_iter().collect();
    reasons.sort_by_key(|x| std::cmp::Reverse(x.1));
    for (r, n) in reasons {
        println!("{n:5} unsupported: {r}");
    }
    assert!(
        bad.is_empty(),
        "{} models failed wrongly:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
