//! Malformed and adversarial models: each must end in a specific typed error naming the node
//! (or value) and the reason, never a panic, a hang or an unbounded allocation. Models are
//! built here with the importer's protobuf messages and `tandem::fuzzgen`'s helpers.
//!
//! Kinds tested, with `runtime/tests/import.rs` (I) and this file (M):
//! - I bad protobuf bytes; I empty bytes (no graph); I every byte of a model corrupted
//! - I dangling input name; I value produced twice (node, input, initializer); I cycle; I self-loop
//! - I raw_data length != dims; I typed data length != dims; I dims overflowing u64
//! - I dims over the 16 GiB tensor limit; I negative dims; I string dtype; I bfloat16 input
//! - I sequence-typed input; I complex64 output; I sparse initializer; I output not produced
//! - I unknown domain; I no default-domain opset; I unknown op type; I Gemm transA = 2
//! - I subgraph attribute; I external data: past the end of file, length mismatch, missing file,
//!   absolute / `..` paths, symlink leading out, no model folder; I model file not found
//! - M truncated model; M garbage bytes (text); M a 4 GiB initializer declared without data
//! - M unknown dtype code; M UNDEFINED dtype; M negative declared input dim
//! - M attribute without name; M attribute given twice; M attribute of unknown type
//! - M attribute referring to a function attribute; M invalid UTF-8 string attribute
//! - M node without op_type; M Constant node with an input; M model-local function op
//! - M graph without outputs; M opset version 0; M external data offset not a number
//! - M Conv negative strides; M Conv group 0; M Conv group not dividing channels
//! - M Conv zero-size kernel; M Conv kernel larger than the padded input; M Conv zero dilation
//! - M MaxPool pads not smaller than the kernel; M Pad cropping more than the input
//! - M Max/AveragePool strides of 2^63 - 1 (valid: one window per axis; no buffer sized by them)
//! - M Max/AveragePool kernels 2^40 wide with SAME pads (valid: each window clipped to the input;
//!   no loop over the kernel's taps); M AveragePool over an empty axis with pads
//! - M Softmax axis out of range; M Reshape with two -1; M Reshape element count mismatch
//! - M Gather constant index out of range; M GatherElements indices larger than data off the axis
//! - M Concat rank mismatch; M MatMul inner-dim mismatch
//! - M Split sizes not summing; M Split of a scalar; M Transpose perm not a permutation
//! - M too few / too many inputs for the op's schema; M a required input left empty
//! - M Slice step 0; M an axis of a scalar (Slice, Softmax, Concat, Gather); M Resize of an empty axis; M Resize NaN scale; M Expand to 2^40 elements
//! - M Cast to string; M Range with delta 0
//! - M run: wrong input shape; wrong input dtype; missing input; unknown input name
//! - M run: NaN reaching a shape (Cast(NaN) -> Reshape)

use prost::Message;
use tandem::fuzzgen::{attribute, tensor_proto, value_info};
use tandem::import::proto::*;
use tandem::{DType, Error, Placement, Session, SessionOptions, Tensor};
use tandem_ops::{AttrValue, OpError};

// ---- building models ----

/// A model of `nodes` over f32 graph inputs `inputs` and initializers `consts`, with the
/// outputs named in `outputs` (types not declared) and default-domain opset 18.
fn model(
    nodes: Vec<NodeProto>,
    inputs: &[(&str, &[usize])],
    consts: &[(&str, Tensor)],
    outputs: &[&str],
) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        producer_name: "malformed".into(),
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: consts.iter().map(|(n, t)| tensor_proto(n, t)).collect(),
            input: inputs
                .iter()
                .map(|(n, s)| value_info(n, DType::F32, s))
                .collect(),
            output: outputs
                .iter()
                .map(|n| ValueInfoProto {
                    name: n.to_string(),
                    r#type: None,
                })
                .collect(),
            ..Default::default()
        }),
        functions: vec![],
    }
}

fn node(op: &str, inputs: &[&str], attrs: &[(&str, AttrValue)]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec!["y".into()],
        name: "bad".into(),
        op_type: op.into(),
        attribute: attrs.iter().map(|(k, v)| attribute(k, v)).collect(),
        ..Default::default()
    }
}

/// One node `bad` reading graph input `x` of `shape` (and initializers), output `y`.
fn one(
    op: &str,
    shape: &[usize],
    consts: &[(&str, Tensor)],
    attrs: &[(&str, AttrValue)],
) -> ModelProto {
    let mut ins = vec!["x"];
    ins.extend(consts.iter().map(|(n, _)| *n));
    model(vec![node(op, &ins, attrs)], &[("x", shape)], consts, &["y"])
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::i64(&[v.len()], v.to_vec())
}

fn ones(shape: &[usize]) -> Tensor {
    Tensor::f32(shape, vec![1.0; shape.iter().product()])
}

fn load(m: &ModelProto) -> tandem::Result<Session> {
    load_bytes(&m.encode_to_vec())
}

fn load_bytes(b: &[u8]) -> tandem::Result<Session> {
    Session::new(
        b,
        SessionOptions::default()
            .placement(Placement::Cpu)
            .cpu_threads(1),
    )
}

/// Loads `m` and runs it on zeros of the declared input shapes; the first error.
fn first_error(m: &ModelProto) -> Error {
    let r = load(m).and_then(|s| {
        let feeds: Vec<(String, Tensor)> = s
            .inputs()
            .into_iter()
            .map(|io| {
                let shape = io.shape_or_ones();
                (
                    io.name,
                    Tensor::zeros(io.dtype.unwrap_or(DType::F32), &shape),
                )
            })
            .collect();
        let feeds: Vec<(&str, Tensor)> =
            feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        s.run(&feeds)
    });
    match r {
        Ok(_) => panic!("the model was accepted"),
        Err(e) => e,
    }
}

/// Asserts an `InvalidModel` error whose message contains every word.
fn invalid(e: Error, words: &[&str]) {
    match &e {
        Error::InvalidModel(m) if words.iter().all(|w| m.contains(w)) => {}
        _ => panic!("expected InvalidModel with {words:?}, got {e:?}"),
    }
}

/// Asserts a node error on `node` of kind `Invalid` (`unsupported` false) or `Unsupported`
/// whose message contains every word.
fn node_error(e: Error, node: &str, unsupported: bool, words: &[&str]) {
    match &e {
        Error::Node {
            node: n, source, ..
        } if n == node => {
            let (m, kind) = match source {
                OpError::Invalid(m) => (m, false),
                OpError::Unsupported(m) => (m, true),
            };
            assert_eq!(kind, unsupported, "{e}");
            assert!(
                words.iter().all(|w| m.contains(w)),
                "expected {words:?} in: {e}"
            );
        }
        _ => panic!("expected a node error on `{node}`, got {e:?}"),
    }
}

fn bad_invalid(m: &ModelProto, words: &[&str]) {
    node_error(first_error(m), "bad", false, words)
}

/// A valid Relu model.
fn relu() -> ModelProto {
    one("Relu", &[2, 3], &[], &[])
}

// ---- bytes and protobuf ----

#[test]
fn truncated_model_is_invalid() {
    let b = relu().encode_to_vec();
    invalid(load_bytes(&b[..b.len() - 3]).err().unwrap(), &["protobuf"]);
}

#[test]
fn garbage_bytes_are_invalid() {
    let e = load_bytes(b"this is not an onnx model, just some text\n")
        .err()
        .unwrap();
    invalid(e, &["not an ONNX model"]);
}

#[test]
fn huge_initializer_declared_without_data_is_refused_before_allocating() {
    // 4 GiB of f32 declared, no data: refused by the length check, nothing allocated.
    let mut m = relu();
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![1 << 15, 1 << 15],
        data_type: data_type::FLOAT,
        ..Default::default()
    });
    m.graph.as_mut().unwrap().node[0].input.push("w".into());
    invalid(
        load(&m).err().unwrap(),
        &["`w`", "1073741824 elements", "float_data has 0"],
    );
}

fn with_init(dtype: i32) -> ModelProto {
    let mut m = relu();
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![1],
        data_type: dtype,
        ..Default::default()
    });
    g.node.push(NodeProto {
        name: "other".into(),
        ..node("Relu", &["w"], &[])
    });
    g.node[1].output = vec!["z".into()];
    m
}

#[test]
fn unknown_dtype_code_is_invalid() {
    invalid(
        load(&with_init(99)).err().unwrap(),
        &["`w`", "unknown data type code 99"],
    );
}

#[test]
fn undefined_dtype_is_invalid() {
    invalid(load(&with_init(0)).err().unwrap(), &["`w`", "UNDEFINED"]);
}

#[test]
fn negative_declared_input_dim_is_invalid() {
    let mut m = relu();
    let dims = &mut m.graph.as_mut().unwrap().input[0].r#type.as_mut().unwrap();
    let shape = dims.tensor_type.as_mut().unwrap().shape.as_mut().unwrap();
    shape.dim[0].dim_value = Some(-3);
    invalid(
        load(&m).err().unwrap(),
        &["`x`", "negative declared dimension -3"],
    );
}

// ---- attributes and nodes ----

fn with_attrs(attrs: Vec<AttributeProto>) -> ModelProto {
    let mut m = relu();
    m.graph.as_mut().unwrap().node[0].attribute = attrs;
    m
}

#[test]
fn attribute_without_name_is_invalid() {
    let e = load(&with_attrs(vec![attribute("", &AttrValue::Int(1))]))
        .err()
        .unwrap();
    node_error(e, "bad", false, &["no name"]);
}

#[test]
fn attribute_given_twice_is_invalid() {
    let a = attribute("alpha", &AttrValue::Float(1.0));
    let e = load(&with_attrs(vec![a.clone(), a])).err().unwrap();
    node_error(e, "bad", false, &["`alpha` is given twice"]);
}

#[test]
fn attribute_of_unknown_type_is_invalid() {
    let mut a = attribute("alpha", &AttrValue::Float(1.0));
    a.r#type = 77;
    let e = load(&with_attrs(vec![a])).err().unwrap();
    node_error(e, "bad", false, &["`alpha`", "unknown type 77"]);
}

#[test]
fn attribute_referring_to_a_function_attribute_is_invalid() {
    let mut a = attribute("alpha", &AttrValue::Float(1.0));
    a.ref_attr_name = "outer".into();
    let e = load(&with_attrs(vec![a])).err().unwrap();
    node_error(
        e,
        "bad",
        false,
        &["`alpha`", "`outer`", "outside a function"],
    );
}

#[test]
fn invalid_utf8_string_attribute_is_invalid() {
    let mut a = attribute("mode", &AttrValue::String("x".into()));
    a.s = Some(vec![0xff, 0xfe]);
    let e = load(&with_attrs(vec![a])).err().unwrap();
    node_error(e, "bad", false, &["`mode`", "UTF-8"]);
}

#[test]
fn node_without_op_type_is_invalid() {
    let mut m = relu();
    m.graph.as_mut().unwrap().node[0].op_type.clear();
    invalid(load(&m).err().unwrap(), &["node 0 has no op_type"]);
}

#[test]
fn constant_node_with_an_input_is_invalid() {
    let v = AttrValue::Tensor(ones(&[1]));
    let m = model(
        vec![node("Constant", &["x"], &[("value", v)])],
        &[("x", &[1])],
        &[],
        &["y"],
    );
    node_error(
        load(&m).err().unwrap(),
        "bad",
        false,
        &["Constant takes no inputs"],
    );
}

#[test]
fn model_local_function_is_unsupported() {
    let mut m = relu();
    m.functions.push(FunctionProto {
        name: "MyOp".into(),
        domain: "local".into(),
    });
    let n = &mut m.graph.as_mut().unwrap().node[0];
    n.op_type = "MyOp".into();
    n.domain = "local".into();
    node_error(
        load(&m).err().unwrap(),
        "bad",
        true,
        &["model-local functions"],
    );
}

#[test]
fn graph_without_outputs_is_invalid() {
    let mut m = relu();
    m.graph.as_mut().unwrap().output.clear();
    invalid(load(&m).err().unwrap(), &["declares no outputs"]);
}

#[test]
fn opset_version_zero_is_invalid() {
    let mut m = relu();
    m.opset_import[0].version = 0;
    invalid(first_error(&m), &["`bad`", "opset", "version 0"]);
}

#[test]
fn external_data_offset_must_be_a_number() {
    let mut m = with_init(data_type::FLOAT);
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.data_location = DATA_LOCATION_EXTERNAL;
    w.external_data = vec![
        StringStringEntryProto {
            key: "location".into(),
            value: "w.bin".into(),
        },
        StringStringEntryProto {
            key: "offset".into(),
            value: "-1".into(),
        },
    ];
    invalid(
        load(&m).err().unwrap(),
        &["`w`", "`offset` = `-1` is not a number"],
    );
}

// ---- attributes out of range and inconsistent shapes ----

fn conv(x: &[usize], w: &[usize], attrs: &[(&str, AttrValue)]) -> ModelProto {
    one("Conv", x, &[("w", ones(w))], attrs)
}

#[test]
fn conv_negative_strides_are_invalid() {
    bad_invalid(
        &conv(&[1, 1, 5, 5], &[1, 1, 3, 3], &[("strides", ints(&[-1, 1]))]),
        &["strides"],
    );
}

#[test]
fn conv_group_zero_is_invalid() {
    bad_invalid(
        &conv(
            &[1, 2, 5, 5],
            &[2, 1, 3, 3],
            &[("group", AttrValue::Int(0))],
        ),
        &["group"],
    );
}

#[test]
fn conv_group_not_dividing_channels_is_invalid() {
    bad_invalid(
        &conv(
            &[1, 3, 5, 5],
            &[2, 1, 3, 3],
            &[("group", AttrValue::Int(2))],
        ),
        &["group"],
    );
}

#[test]
fn conv_zero_size_kernel_is_invalid() {
    bad_invalid(&conv(&[1, 1, 5, 5], &[1, 1, 0, 3], &[]), &["kernel"]);
}

#[test]
fn conv_kernel_larger_than_padded_input_is_invalid() {
    bad_invalid(
        &conv(
            &[1, 1, 2, 2],
            &[1, 1, 5, 5],
            &[("pads", ints(&[1, 1, 1, 1]))],
        ),
        &["kernel"],
    );
}

#[test]
fn conv_zero_dilation_is_invalid() {
    bad_invalid(
        &conv(
            &[1, 1, 5, 5],
            &[1, 1, 3, 3],
            &[("dilations", ints(&[0, 1]))],
        ),
        &["dilation"],
    );
}

#[test]
fn pool_pads_not_smaller_than_kernel_are_invalid() {
    let a = [
        ("kernel_shape", ints(&[2, 2])),
        ("pads", ints(&[5, 5, 5, 5])),
    ];
    bad_invalid(&one("MaxPool", &[1, 1, 4, 4], &[], &a), &["pads"]);
}

#[test]
fn pad_cropping_more_than_the_input_is_invalid() {
    let m = one("Pad", &[2, 3], &[("p", i64s(&[0, -5, 0, 0]))], &[]);
    bad_invalid(&m, &["pad"]);
}

#[test]
fn softmax_axis_out_of_range_is_invalid() {
    bad_invalid(
        &one("Softmax", &[2, 3], &[], &[("axis", AttrValue::Int(5))]),
        &["axis 5"],
    );
}

#[test]
fn reshape_with_two_minus_ones_is_invalid() {
    bad_invalid(
        &one("Reshape", &[2, 3], &[("s", i64s(&[-1, -1]))], &[]),
        &["-1"],
    );
}

#[test]
fn reshape_element_count_mismatch_is_invalid() {
    bad_invalid(
        &one("Reshape", &[2, 3], &[("s", i64s(&[4, 2]))], &[]),
        &["Reshape"],
    );
}

#[test]
fn gather_constant_index_out_of_range_is_invalid() {
    let m = one(
        "Gather",
        &[2, 3],
        &[("i", i64s(&[0, 7]))],
        &[("axis", AttrValue::Int(1))],
    );
    bad_invalid(&m, &["index 7", "out of range"]);
}

#[test]
fn gather_elements_indices_larger_than_data_off_the_axis_are_invalid() {
    // Found by CI's fuzzing (load_and_plan): the CPU kernel read past the data.
    let m = one(
        "GatherElements",
        &[2, 3],
        &[("i", Tensor::i64(&[2, 4], vec![0; 8]))],
        &[("axis", AttrValue::Int(0))],
    );
    bad_invalid(&m, &["GatherElements", "dim 1 is 4", "only 3"]);
}

#[test]
fn concat_rank_mismatch_is_invalid() {
    let m = one(
        "Concat",
        &[2, 3],
        &[("c", ones(&[2, 3, 1]))],
        &[("axis", AttrValue::Int(0))],
    );
    bad_invalid(&m, &["does not match"]);
}

#[test]
fn matmul_inner_dim_mismatch_is_invalid() {
    bad_invalid(
        &one("MatMul", &[2, 3], &[("w", ones(&[4, 5]))], &[]),
        &["3", "4"],
    );
}

#[test]
fn split_sizes_not_summing_are_invalid() {
    let m = one("Split", &[6, 2], &[("s", i64s(&[2, 2]))], &[]);
    bad_invalid(&m, &["do not add up to dim 6"]);
}

#[test]
fn split_of_a_scalar_is_invalid() {
    // Found by the load_and_plan fuzz target (it indexed the dims of a rank-0 input).
    let m = model(
        vec![node("Split", &["c"], &[("num_outputs", AttrValue::Int(1))])],
        &[],
        &[("c", Tensor::f32(&[], vec![1.0]))],
        &["y"],
    );
    bad_invalid(&m, &["scalar"]);
}

#[test]
fn transpose_perm_not_a_permutation_is_invalid() {
    bad_invalid(
        &one("Transpose", &[2, 3], &[], &[("perm", ints(&[0, 0]))]),
        &["perm"],
    );
}

#[test]
fn slice_step_zero_is_invalid() {
    let c = [
        ("st", i64s(&[0])),
        ("en", i64s(&[2])),
        ("ax", i64s(&[0])),
        ("sp", i64s(&[0])),
    ];
    bad_invalid(&one("Slice", &[4], &c, &[]), &["step"]);
}

#[test]
fn wrong_input_count_is_invalid() {
    // Found by fuzzing (load_and_plan): Transpose and Split with no inputs indexed their
    // first input. The counts come from the ONNX schemas (ops/src/arity.rs).
    let x = [("x", &[2usize, 3][..])];
    let cases: [(&str, &[&str], &[&str]); 5] = [
        ("Transpose", &[], &["Transpose", "takes 1 inputs", "has 0"]),
        ("Split", &[], &["Split", "1 to 2 inputs", "has 0"]),
        ("Add", &["x"], &["Add", "takes 2 inputs", "has 1"]),
        ("Relu", &["x", "x"], &["Relu", "takes 1 inputs", "has 2"]),
        ("Concat", &[], &["at least 1", "has 0"]),
    ];
    for (op, ins, words) in cases {
        let m = model(vec![node(op, ins, &[])], &x, &[], &["y"]);
        bad_invalid(&m, words);
    }
    // A required input left empty (""): Gather's indices.
    let m = model(vec![node("Gather", &["x", ""], &[])], &x, &[], &["y"]);
    bad_invalid(&m, &["input 1 of Gather is required"]);
}

#[test]
fn axis_of_a_scalar_is_invalid() {
    // Found by CI's fuzzing (load_and_plan): Slice of a rank-0 input indexed past its axes,
    // because axis 0 counted as in range for rank 0. Every op taking an axis must refuse it.
    let refused =
        |op: &str, ins: &[&str], extra: Vec<(&str, Tensor)>, attrs: &[(&str, AttrValue)]| {
            let mut consts = vec![("c", Tensor::f32(&[], vec![1.0]))];
            consts.extend(extra);
            let m = model(vec![node(op, ins, attrs)], &[], &consts, &["y"]);
            bad_invalid(&m, &["rank"]);
        };
    let axis0 = [("axis", AttrValue::Int(0))];
    refused(
        "Slice",
        &["c", "st", "en"],
        vec![("st", i64s(&[0])), ("en", i64s(&[1]))],
        &[],
    );
    refused("Softmax", &["c"], vec![], &axis0);
    refused("Concat", &["c", "c"], vec![], &axis0);
    refused(
        "Gather",
        &["c", "i"],
        vec![("i", Tensor::i64(&[], vec![0]))],
        &[],
    );
}

#[test]
fn resize_of_an_empty_axis_is_invalid() {
    // Found by fuzz_graphs (seed 101): the CPU kernel indexed the empty axis.
    let c = [
        ("roi", Tensor::f32(&[0], vec![])),
        ("sc", Tensor::f32(&[0], vec![])),
        ("sz", i64s(&[1, 1, 2])),
    ];
    let m = one(
        "Resize",
        &[1, 1, 0],
        &c,
        &[("mode", AttrValue::String("cubic".into()))],
    );
    bad_invalid(&m, &["axis 2 is empty"]);
}

#[test]
fn resize_nan_scale_is_invalid() {
    let c = [
        ("roi", Tensor::f32(&[0], vec![])),
        ("sc", Tensor::f32(&[2], vec![1.0, f32::NAN])),
    ];
    bad_invalid(&one("Resize", &[2, 2], &c, &[]), &["scales"]);
}

#[test]
fn expand_to_two_to_the_forty_elements_is_refused_before_allocating() {
    let m = one("Expand", &[1, 1], &[("s", i64s(&[1 << 20, 1 << 20]))], &[]);
    bad_invalid(&m, &["exceeds", "tensor limit"]);
}

#[test]
fn cast_to_string_is_unsupported() {
    let m = one(
        "Cast",
        &[2],
        &[],
        &[("to", AttrValue::Int(data_type::STRING as i64))],
    );
    node_error(first_error(&m), "bad", true, &["target type code 8"]);
}

#[test]
fn range_with_zero_delta_is_invalid() {
    let s = |v: f32| Tensor::f32(&[], vec![v]);
    let c = [("a", s(0.0)), ("b", s(5.0)), ("d", s(0.0))];
    let m = model(vec![node("Range", &["a", "b", "d"], &[])], &[], &c, &["y"]);
    bad_invalid(&m, &["delta"]);
}

// ---- bad inputs at run time ----

fn run_relu(feeds: &[(&str, Tensor)]) -> Error {
    load(&relu()).unwrap().run(feeds).expect_err("refused")
}

#[test]
fn wrong_input_shape_is_an_input_error() {
    let e = run_relu(&[("x", ones(&[3, 2]))]);
    assert!(
        matches!(&e, Error::Input { name, reason } if name == "x" && reason.contains("[2, 3]")),
        "{e:?}"
    );
}

#[test]
fn wrong_input_dtype_is_an_input_error() {
    let e = run_relu(&[("x", Tensor::i64(&[2, 3], vec![0; 6]))]);
    assert!(
        matches!(&e, Error::Input { name, reason } if name == "x" && reason.contains("f32")),
        "{e:?}"
    );
}

#[test]
fn missing_input_is_named() {
    let e = run_relu(&[]);
    assert!(
        matches!(&e, Error::MissingInput { name, .. } if name == "x"),
        "{e:?}"
    );
}

#[test]
fn unknown_input_name_is_an_input_error() {
    let e = run_relu(&[("x", ones(&[2, 3])), ("nope", ones(&[1]))]);
    assert!(
        matches!(&e, Error::Input { name, reason } if name == "nope" && reason.contains("no such input")),
        "{e:?}"
    );
}

#[test]
fn nan_reaching_a_shape_is_a_node_error() {
    // x (NaN at run time) -> Cast to int64 -> Reshape's shape: a typed error, not a panic.
    let mut cast = node("Cast", &["x"], &[("to", AttrValue::Int(7))]);
    cast.output = vec!["s".into()];
    cast.name = "cast".into();
    let m = model(
        vec![cast, node("Reshape", &["d", "s"], &[])],
        &[("x", &[2])],
        &[("d", ones(&[2, 3]))],
        &["y"],
    );
    let s = load(&m).unwrap();
    let e = s
        .run(&[("x", Tensor::f32(&[2], vec![f32::NAN, 3.0]))])
        .expect_err("refused");
    match &e {
        Error::Node { node, .. } if node == "bad" => {}
        _ => panic!("expected a node error on the Reshape, got {e:?}"),
    }
}

#[test]
fn conv_weight_with_no_elements_but_huge_channels_is_not_fused() {
    // Found by CI's fuzzing (load_and_plan): the fusion pass sized its per-channel tables by
    // W's first dim (2^40 here, with no elements since another dim is 0) before checking W's
    // length: a 2 TB allocation and an abort at load time. Loading must end normally.
    let mut conv = node("Conv", &["x", "w"], &[]);
    conv.output = vec!["c".into()];
    let bn = node("BatchNormalization", &["c", "s", "b", "m", "v"], &[]);
    let p = || Tensor::f32(&[1], vec![1.0]);
    let m = model(
        vec![conv, bn],
        &[("x", &[1, 0, 1, 1])],
        &[
            ("w", Tensor::f32(&[1 << 40, 0, 1, 1], vec![])),
            ("s", p()),
            ("b", p()),
            ("m", p()),
            ("v", p()),
        ],
        &["y"],
    );
    // A typed error or a session with the BatchNormalization left unfused; the process lives.
    if let Ok(s) = load(&m) {
        assert_eq!(s.graph().nodes.len(), 2, "nothing to fold into an empty W");
    }
}

/// A stride of 2^63 - 1 is valid (one window per axis); 3-D pooling once sized a row buffer by
/// it (capacity overflow panic, found by the generated_graph fuzz target).
#[test]
fn pool_strides_of_2_pow_63_give_one_window_per_axis() {
    for rank in 1..=3 {
        let shape: Vec<usize> = [2, 1]
            .into_iter()
            .chain([3; 3].into_iter().take(rank))
            .collect();
        let x: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|v| v as f32)
            .collect();
        for op in ["AveragePool", "MaxPool"] {
            let a = [
                ("kernel_shape", ints(&vec![2; rank])),
                ("strides", ints(&vec![i64::MAX; rank])),
            ];
            let s = load(&one(op, &shape, &[], &a)).expect("loads");
            let y = s
                .run(&[("x", Tensor::f32(&shape, x.clone()))])
                .expect("runs");
            let y = y[0].1.as_f32().expect("f32");
            // The one window: offsets 0..2 on each spatial axis of each of the 2 planes.
            let plane = 3usize.pow(rank as u32);
            let want: Vec<f32> = (0..2)
                .map(|n| {
                    let w: Vec<f32> = (0..1usize << rank)
                        .map(|bits| {
                            let off = (0..rank).fold(0, |o, a| o * 3 + (bits >> a & 1));
                            x[n * plane + off]
                        })
                        .collect();
                    if op == "MaxPool" {
                        w.iter().cloned().fold(f32::MIN, f32::max)
                    } else {
                        w.iter().sum::<f32>() / w.len() as f32
                    }
                })
                .collect();
            assert_eq!(y, want.as_slice(), "{op} rank {rank}");
        }
    }
}

/// Kernels 2^40 wide with SAME pads are valid: every window is clipped to the input. Pooling
/// once walked every tap of the kernel, checking each against the input (a run of hours, found
/// by the generated_graph fuzz target); the reference here is the clipped interval itself.
#[test]
fn pool_kernels_of_2_pow_40_with_same_pads_clip_to_the_input() {
    let huge = 1i64 << 40;
    for (shape, kernel, strides) in [
        (vec![1, 2, 3, 5], vec![2, huge], vec![2, 2]),
        (vec![1, 2, 3, 5], vec![huge, 1], vec![1, 3]),
        (vec![1, 1, 2, 3, 5], vec![1, huge, 2], vec![1, 2, 1]),
    ] {
        let spatial = &shape[2..];
        let x: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|v| ((v * 7) % 11) as f32 - 5.0)
            .collect();
        for pad in ["SAME_UPPER", "SAME_LOWER"] {
            for op in ["AveragePool", "MaxPool"] {
                let a = [
                    ("kernel_shape", ints(&kernel)),
                    ("strides", ints(&strides)),
                    ("auto_pad", AttrValue::String(pad.into())),
                ];
                let s = load(&one(op, &shape, &[], &a)).expect("loads");
                let y = s
                    .run(&[("x", Tensor::f32(&shape, x.clone()))])
                    .expect("runs");
                // Per axis: the output count and each output's clipped input interval.
                let axes: Vec<Vec<(usize, usize)>> = (0..spatial.len())
                    .map(|i| {
                        let (n, k, st) =
                            (spatial[i] as i128, kernel[i] as i128, strides[i] as i128);
                        let out = (n + st - 1) / st;
                        let total = ((out - 1) * st + k - n).max(0);
                        let pb = if pad == "SAME_UPPER" {
                            total / 2
                        } else {
                            total - total / 2
                        };
                        (0..out)
                            .map(|o| {
                                let b = o * st - pb;
                                (b.max(0) as usize, (b + k).min(n) as usize)
                            })
                            .collect()
                    })
                    .collect();
                let mut want = Vec::new();
                let plane: usize = spatial.iter().product();
                for c in 0..shape[1] {
                    // Each output's window: the offsets (within the plane) of its inputs.
                    let mut windows: Vec<Vec<usize>> = vec![vec![0]];
                    for (i, iv) in axes.iter().enumerate() {
                        let inner: usize = spatial[i + 1..].iter().product();
                        windows = windows
                            .iter()
                            .flat_map(|w| {
                                iv.iter().map(move |&(b, e)| {
                                    let w = w.iter();
                                    w.flat_map(|&o| (b..e).map(move |p| o + p * inner))
                                        .collect()
                                })
                            })
                            .collect();
                    }
                    for w in windows {
                        let v: Vec<f32> = w.iter().map(|&o| x[c * plane + o]).collect();
                        want.push(if op == "MaxPool" {
                            v.iter().cloned().fold(f32::MIN, f32::max)
                        } else {
                            v.iter().sum::<f32>() / v.len() as f32
                        });
                    }
                }
                let got = y[0].1.as_f32().expect("f32");
                assert_eq!(got, want.as_slice(), "{op} {pad} kernel {kernel:?}");
            }
        }
    }
}

/// An empty last axis with pads is valid: every window holds padding only. Its average counts
/// the padded positions (zeros) with count_include_pad, and nothing without (0 / 0). The band
/// path once cut input rows into chunks of their length, 0 (panic, found by fuzzing).
#[test]
fn average_pool_over_an_empty_axis_averages_padding_only() {
    for (include_pad, want) in [(1, 0.0f32), (0, f32::NAN)] {
        let a = [
            ("kernel_shape", ints(&[1, 2])),
            ("pads", ints(&[0, 1, 0, 1])),
            ("count_include_pad", AttrValue::Int(include_pad)),
        ];
        let s = load(&one("AveragePool", &[1, 1, 2, 0], &[], &a)).expect("loads");
        let y = s
            .run(&[("x", Tensor::f32(&[1, 1, 2, 0], vec![]))])
            .expect("runs");
        assert_eq!(y[0].1.shape, vec![1, 1, 2, 1]);
        for &v in y[0].1.as_f32().expect("f32") {
            assert!(v == want || (v.is_nan() && want.is_nan()), "{v} vs {want}");
        }
    }
}
