//! Bad models and bad calls give typed errors that name what is wrong (the node, its op type and opset,
//! the input, the file), never a panic; a `dim_param` batch runs every size from one compiled entry.

use kiln_graph::{CpuReference, DType, Error, Tensor};
use kiln_onnx::proto::{
    tensor_proto::{DataLocation, DataType},
    AttributeProto, GraphProto, NodeProto, StringStringEntryProto, TensorProto,
};

mod common;

use common::{model, node, value, weight};

#[test]
fn garbage_is_a_format_error() {
    let e = kiln_onnx::load_bytes(&[0xff, 0x12, 0x00, 0x99, 0x42], "junk.onnx").expect_err("not a model");
    assert!(matches!(e, Error::Format { .. }), "{e}");
    assert!(e.to_string().contains("junk.onnx"), "{e}");
    let e = kiln_onnx::load("/nonexistent/model.onnx").expect_err("no file");
    assert!(e.to_string().contains("/nonexistent/model.onnx"), "{e}");
}

#[test]
fn an_unknown_op_names_the_node_at_load() {
    let bytes = model(
        vec![node("Frobnicate", "frob_1", &["x"], &["y"])],
        vec![value("x", &[Ok(2)])],
        vec![value("y", &[Ok(2)])],
        vec![],
        17,
    );
    let e = kiln_onnx::load_bytes(&bytes, "m.onnx").expect_err("unknown op");
    match &e {
        Error::Import { node, op_type, opset, unsupported, .. } => {
            assert_eq!((node.as_str(), op_type.as_str(), *opset, *unsupported), ("frob_1", "Frobnicate", 17, true));
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("m.onnx: node `frob_1` (Frobnicate, opset 17): unsupported"), "{e}");
    let mut custom = node("Relu", "r", &["x"], &["y"]);
    custom.domain = Some("com.example".into());
    let bytes = model(vec![custom], vec![value("x", &[Ok(2)])], vec![value("y", &[Ok(2)])], vec![], 17);
    let e = kiln_onnx::load_bytes(&bytes, "m.onnx").expect_err("unknown domain");
    assert!(e.to_string().contains("com.example"), "{e}");
}

#[test]
fn an_opset_kiln_does_not_read_is_unsupported() {
    let bytes = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![value("x", &[Ok(2)])],
        vec![value("y", &[Ok(2)])],
        vec![],
        3,
    );
    let e = kiln_onnx::load_bytes(&bytes, "old.onnx").expect_err("opset 3");
    assert!(matches!(e, Error::Unsupported { .. }) && e.to_string().contains("opset 3"), "{e}");
    assert!(e.to_string().contains("`Relu` changed at opset 6"), "{e}");
    // An op defined alike at opset 1 and 7 (`Transpose`) reads an opset-1 model as opset 7.
    let bytes = model(
        vec![node("Transpose", "t", &["x"], &["y"])],
        vec![value("x", &[Ok(2), Ok(3)])],
        vec![value("y", &[Ok(3), Ok(2)])],
        vec![],
        1,
    );
    let m = kiln_onnx::load_bytes(&bytes, "old.onnx").unwrap().backend(CpuReference);
    let y = m.call(vec![Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap()]).unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    // Past the newest opset kiln reads.
    let bytes = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![value("x", &[Ok(2)])],
        vec![value("y", &[Ok(2)])],
        vec![],
        26,
    );
    let e = kiln_onnx::load_bytes(&bytes, "new.onnx").expect_err("opset 26");
    assert!(e.to_string().contains("opset 26 (kiln reads opsets 7 to 25)"), "{e}");
}

#[test]
fn a_node_that_breaks_its_op_names_it_at_call() {
    let mut conv = node("Conv", "conv_bad", &["x", "w"], &["y"]);
    conv.attribute.push(AttributeProto { name: Some("strides".into()), ints: vec![1, 1, 1], ..Default::default() });
    let bytes = model(
        vec![conv],
        vec![value("x", &[Ok(1), Ok(1), Ok(4), Ok(4)])],
        vec![value("y", &[Ok(1), Ok(1), Ok(2), Ok(2)])],
        vec![weight("w", &[1.0; 9], &[1, 1, 3, 3])],
        17,
    );
    let m = kiln_onnx::load_bytes(&bytes, "m.onnx").unwrap().backend(CpuReference);
    let e = m.call(vec![Tensor::zeros(&[1, 1, 4, 4], DType::F32).unwrap()]).expect_err("3 strides for 2 axes");
    assert!(e.to_string().contains("conv_bad") && e.to_string().contains("strides"), "{e}");
}

#[test]
fn a_wrong_input_is_a_typed_error_naming_the_input() {
    let bytes = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![value("x", &[Err("batch"), Ok(3)])],
        vec![value("y", &[Err("batch"), Ok(3)])],
        vec![],
        17,
    );
    let m = kiln_onnx::load_bytes(&bytes, "m.onnx").unwrap().backend(CpuReference);
    for bad in [
        Tensor::zeros(&[2, 4], DType::F32).unwrap(),
        Tensor::zeros(&[2, 3], DType::F16).unwrap(),
        Tensor::zeros(&[3], DType::F32).unwrap(),
    ] {
        let e = m.call(vec![bad]).expect_err("does not fit");
        assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("x: f32[batch, 3]"), "{e}");
    }
    assert!(m.call(vec![]).expect_err("no input").to_string().contains("takes 1 input"));
}

#[test]
fn missing_external_data_names_the_file() {
    let dir = std::env::temp_dir().join(format!("kiln-onnx-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = weight("w", &[], &[3]);
    w.data_location = Some(DataLocation::External as i32);
    w.external_data = vec![StringStringEntryProto { key: Some("location".into()), value: Some("weights.bin".into()) }];
    let bytes = model(
        vec![node("Add", "add", &["x", "w"], &["y"])],
        vec![value("x", &[Ok(3)])],
        vec![value("y", &[Ok(3)])],
        vec![w],
        17,
    );
    std::fs::write(dir.join("m.onnx"), &bytes).unwrap();
    let e = kiln_onnx::load(dir.join("m.onnx")).expect_err("no weights.bin");
    assert!(e.to_string().contains("weights.bin"), "{e}");
    // With the file there, the weights are read from it.
    let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join("weights.bin"), data).unwrap();
    let m = kiln_onnx::load(dir.join("m.onnx")).unwrap().backend(CpuReference);
    let y = m.call(vec![Tensor::from_slice(&[10.0f32, 20.0, 30.0], &[3]).unwrap()]).unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), [11.0, 22.0, 33.0]);
    // A location outside the model's folder is refused.
    let mut escape = weight("w", &[], &[3]);
    escape.data_location = Some(DataLocation::External as i32);
    escape.external_data =
        vec![StringStringEntryProto { key: Some("location".into()), value: Some("../weights.bin".into()) }];
    let bytes = model(
        vec![node("Add", "add", &["x", "w"], &["y"])],
        vec![value("x", &[Ok(3)])],
        vec![value("y", &[Ok(3)])],
        vec![escape],
        17,
    );
    std::fs::write(dir.join("m2.onnx"), &bytes).unwrap();
    assert!(kiln_onnx::load(dir.join("m2.onnx")).expect_err("escapes").to_string().contains("leaves"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `batch` is a `dim_param`: every batch size runs from the first compiled entry (symbolic from the
/// start), shape arithmetic included (`Shape → Gather → Concat → Reshape` flattens per row).
#[test]
fn a_dynamic_batch_compiles_once() {
    let shape_ints = |name: &str, v: &[i64]| TensorProto {
        name: Some(name.into()),
        data_type: Some(DataType::Int64 as i32),
        dims: vec![v.len() as i64],
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let mut gather = node("Gather", "batch_of", &["s", "zero"], &["b"]);
    gather.attribute.push(AttributeProto { name: Some("axis".into()), i: Some(0), ..Default::default() });
    let mut unsq = node("Unsqueeze", "as_vector", &["b", "axes"], &["b1"]);
    unsq.attribute.clear();
    let mut cat = node("Concat", "target", &["b1", "rest"], &["shape"]);
    cat.attribute.push(AttributeProto { name: Some("axis".into()), i: Some(0), ..Default::default() });
    let nodes = vec![
        node("Shape", "shape_of", &["x"], &["s"]),
        gather,
        unsq,
        cat,
        node("Reshape", "flatten", &["x", "shape"], &["f"]),
        node("MatMul", "project", &["f", "w"], &["y"]),
    ];
    let zero = TensorProto {
        name: Some("zero".into()),
        data_type: Some(DataType::Int64 as i32),
        int64_data: vec![0],
        ..Default::default()
    };
    let bytes = model(
        nodes,
        vec![value("x", &[Err("batch"), Ok(2), Ok(3)])],
        vec![value("y", &[Err("batch"), Ok(1)])],
        vec![
            zero,
            shape_ints("axes", &[0]),
            shape_ints("rest", &[6]),
            weight("w", &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[6, 1]),
        ],
        17,
    );
    let m = kiln_onnx::load_bytes(&bytes, "dyn.onnx").unwrap().backend(CpuReference);
    assert_eq!(m.inputs()[0].to_string(), "x: f32[batch, 2, 3]");
    for batch in [2usize, 5, 3] {
        let x = Tensor::from_slice(&vec![1.0f32; batch * 6], &[batch, 2, 3]).unwrap();
        let y = m.call(vec![x]).unwrap();
        assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![21.0; batch]);
    }
    let stats = m.compiled().stats();
    assert_eq!((stats.traces, stats.recompiles), (1, 0), "{:?}", m.compiled().guards());
}

fn ints(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(DataType::Int64 as i32),
        dims: vec![v.len() as i64],
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn attr_i(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: Some(name.into()), i: Some(i), ..Default::default() }
}

/// Runs a one-node model over `x` (f32 of `dims`) with the given initializers; the call's result.
fn run_one(n: NodeProto, dims: &[i64], init: Vec<TensorProto>) -> kiln_graph::Result<Vec<Tensor>> {
    let dd: Vec<Result<i64, &str>> = dims.iter().map(|&d| Ok(d)).collect();
    let bytes = model(vec![n], vec![value("x", &dd)], vec![value("y", &[])], init, 18);
    let m = kiln_onnx::load_bytes(&bytes, "hostile.onnx")?.backend(CpuReference);
    let numel: i64 = dims.iter().product();
    let x = Tensor::from_slice(&vec![1.0f32; numel as usize], &dims.iter().map(|&d| d as usize).collect::<Vec<_>>())?;
    m.call(vec![x])
}

/// Sizes a small file can ask for that would overflow, allocate without bound or divide by zero are
/// typed errors (found by review: each panicked or aborted before).
#[test]
fn hostile_sizes_are_errors_not_panics() {
    let mut tile = node("Tile", "tile", &["x", "reps"], &["y"]);
    tile.attribute.clear();
    assert!(run_one(tile, &[2], vec![ints("reps", &[1 << 40])]).is_err());
    let mut d2s = node("DepthToSpace", "d2s", &["x"], &["y"]);
    d2s.attribute.push(attr_i("blocksize", 1 << 32));
    assert!(run_one(d2s, &[1, 4, 2, 2], vec![]).is_err());
    // Folded integer arithmetic that overflows i64 is left to tensors, not a panic.
    let mul = node("Mul", "mul", &["a", "b"], &["c"]);
    let shape = node("Reshape", "r", &["x", "c"], &["y"]);
    let bytes = model(
        vec![mul, shape],
        vec![value("x", &[Ok(4)])],
        vec![value("y", &[])],
        vec![ints("a", &[1 << 62]), ints("b", &[4])],
        18,
    );
    let m = kiln_onnx::load_bytes(&bytes, "hostile.onnx").unwrap().backend(CpuReference);
    assert!(m.call(vec![Tensor::zeros(&[4], DType::F32).unwrap()]).is_err());
    let mut gather = node("Gather", "g", &["x", "i"], &["y"]);
    gather.attribute.push(attr_i("axis", 0));
    assert!(run_one(gather, &[], vec![ints("i", &[0])]).is_err(), "axis 0 of a scalar");
    let mut conv = node("Conv", "c", &["x", "w"], &["y"]);
    conv.attribute.push(AttributeProto { name: Some("dilations".into()), ints: vec![1 << 62], ..Default::default() });
    assert!(run_one(conv, &[1, 1, 8], vec![weight("w", &[1.0; 5], &[1, 1, 5])]).is_err());
}

/// Values ONNX defines that an earlier version got wrong (found by review): NLL's ignored rows.
#[test]
fn edge_values_follow_onnx() {
    // An ignored row is zero even where its log-probability is -inf; a picked -inf is +inf loss.
    let mut nll = node("NegativeLogLikelihoodLoss", "nll", &["x", "t"], &["y"]);
    nll.attribute.push(attr_i("ignore_index", 0));
    nll.attribute.push(AttributeProto {
        name: Some("reduction".into()),
        s: Some(b"mean".to_vec()),
        ..Default::default()
    });
    let bytes =
        model(vec![nll], vec![value("x", &[Ok(2), Ok(2)])], vec![value("y", &[])], vec![ints("t", &[0, 1])], 18);
    let loss = kiln_onnx::load_bytes(&bytes, "nll.onnx").unwrap().backend(CpuReference);
    let x = Tensor::from_slice(&[f32::NEG_INFINITY, 0.0, -1.0, -2.0], &[2, 2]).unwrap();
    assert_eq!(loss.call(vec![x]).unwrap()[0].to_vec::<f32>().unwrap(), [2.0]);
}

/// An `If` node with `then` running `then_op` and `else` running `Neg`, each on the outer `x`,
/// its condition the boolean initializer `c`.
fn if_model(cond: bool, then_op: &str) -> Vec<u8> {
    let branch = |op: &str, out: &str| GraphProto {
        node: vec![node(op, &format!("{op}_in_branch"), &["x"], &[out])],
        output: vec![value(out, &[Ok(3)])],
        ..Default::default()
    };
    let mut n = node("If", "if_1", &["c"], &["y"]);
    for (name, g) in [("then_branch", branch(then_op, "t")), ("else_branch", branch("Neg", "e"))] {
        n.attribute.push(AttributeProto { name: Some(name.into()), g: Some(g), ..Default::default() });
    }
    let c = TensorProto {
        name: Some("c".into()),
        data_type: Some(DataType::Bool as i32),
        dims: vec![],
        int32_data: vec![i32::from(cond)],
        ..Default::default()
    };
    model(vec![n], vec![value("x", &[Ok(3)])], vec![value("y", &[Ok(3)])], vec![c], 18)
}

/// The branch a known condition picks runs, reading a value from outside it; an unknown op inside a
/// branch is found at load, as one outside is.
#[test]
fn an_if_runs_the_branch_its_condition_picks() {
    let x = || Tensor::from_slice(&[-1.0f32, 0.5, 2.0], &[3]).unwrap();
    for (cond, want) in [(true, vec![0.0, 0.5, 2.0]), (false, vec![1.0, -0.5, -2.0])] {
        let m = kiln_onnx::load_bytes(&if_model(cond, "Relu"), "if.onnx").unwrap().backend(CpuReference);
        assert_eq!(m.call(vec![x()]).unwrap()[0].to_vec::<f32>().unwrap(), want, "condition {cond}");
    }
    let e = kiln_onnx::load_bytes(&if_model(true, "Frobnicate"), "if.onnx").expect_err("unknown op in a branch");
    assert!(e.to_string().contains("Frobnicate_in_branch"), "{e}");
}

/// A `Loop` of `trip` iterations whose body adds its own initializer `one` to the carried `x`.
fn loop_model(trip: i64) -> Vec<u8> {
    let body = GraphProto {
        node: vec![node("Identity", "c_pass", &["c"], &["c_out"]), node("Add", "y_add", &["y", "one"], &["y_out"])],
        input: vec![value("i", &[]), value("c", &[]), value("y", &[Ok(3)])],
        output: vec![value("c_out", &[]), value("y_out", &[Ok(3)])],
        initializer: vec![weight("one", &[1.0], &[1])],
        ..Default::default()
    };
    let mut n = node("Loop", "loop_1", &["m", "", "x"], &["y"]);
    n.attribute.push(AttributeProto { name: Some("body".into()), g: Some(body), ..Default::default() });
    let m = TensorProto {
        name: Some("m".into()),
        data_type: Some(DataType::Int64 as i32),
        int64_data: vec![trip],
        ..Default::default()
    };
    model(vec![n], vec![value("x", &[Ok(3)])], vec![value("y", &[Ok(3)])], vec![m], 18)
}

/// A loop whose trip count is known runs unrolled (its body reading its own initializer); past the
/// unrolling bound it is a typed error.
#[test]
fn a_loop_runs_unrolled_up_to_its_bound() {
    let x = || Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let m = kiln_onnx::load_bytes(&loop_model(3), "loop.onnx").unwrap().backend(CpuReference);
    assert_eq!(m.call(vec![x()]).unwrap()[0].to_vec::<f32>().unwrap(), vec![4.0, 5.0, 6.0]);
    let too_long = kiln_onnx::MAX_LOOP_ITERATIONS as i64 + 1;
    let m = kiln_onnx::load_bytes(&loop_model(too_long), "loop.onnx").unwrap().backend(CpuReference);
    let e = m.call(vec![x()]).expect_err("past the bound");
    assert!(e.to_string().contains("more than") && e.to_string().contains("loop_1"), "{e}");
}

/// A `Scan` (opset 9's form) over `x` `[2, 3]` along axis 1, last column first: the body adds each
/// column to the carried sum `s` (zeros), its scan output the running sum, stacked along axis 1 — in
/// order, or last first when `out_dir` is 1.
fn scan_model(out_dir: i64) -> Vec<u8> {
    let body = GraphProto {
        node: vec![node("Add", "s_add", &["s", "xt"], &["s_out"]), node("Identity", "sum_out", &["s_out"], &["r"])],
        input: vec![value("s", &[Ok(2)]), value("xt", &[Ok(2)])],
        output: vec![value("s_out", &[Ok(2)]), value("r", &[Ok(2)])],
        ..Default::default()
    };
    let mut n = node("Scan", "scan_1", &["zero", "x"], &["s_final", "sums"]);
    n.attribute.push(AttributeProto { name: Some("body".into()), g: Some(body), ..Default::default() });
    n.attribute.push(attr_i("num_scan_inputs", 1));
    let list = |name: &str, v: i64| AttributeProto { name: Some(name.into()), ints: vec![v], ..Default::default() };
    n.attribute.extend([
        list("scan_input_axes", 1),
        list("scan_input_directions", 1),
        list("scan_output_axes", -1),
        list("scan_output_directions", out_dir),
    ]);
    let outputs = vec![value("s_final", &[Ok(2)]), value("sums", &[Ok(2), Ok(3)])];
    model(vec![n], vec![value("x", &[Ok(2), Ok(3)])], outputs, vec![weight("zero", &[0.0, 0.0], &[2])], 11)
}

/// A scan runs unrolled along the axis and in the directions its attributes name.
#[test]
fn a_scan_runs_unrolled_along_its_axes_and_directions() {
    let x = || Tensor::from_slice(&[1.0f32, 2.0, 3.0, 10.0, 20.0, 30.0], &[2, 3]).unwrap();
    for (out_dir, sums) in [(0, [3.0, 5.0, 6.0, 30.0, 50.0, 60.0]), (1, [6.0, 5.0, 3.0, 60.0, 50.0, 30.0])] {
        let m = kiln_onnx::load_bytes(&scan_model(out_dir), "scan.onnx").unwrap().backend(CpuReference);
        let out = m.call(vec![x()]).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), [6.0, 60.0], "the final sum");
        assert_eq!(out[1].shape().as_concrete(), Some(vec![2, 3]));
        assert_eq!(out[1].to_vec::<f32>().unwrap(), sums, "output direction {out_dir}");
    }
}

/// Two `Bernoulli` nodes of p = 0.5 over 1,024 elements: unseeded, each draws its own numbers (a stream
/// per node, the same every run); seeded alike, they draw the same.
#[test]
fn unseeded_random_nodes_draw_apart_and_seeded_ones_repeat() {
    let two = |seed: Option<f32>| {
        let mut nodes = vec![node("Bernoulli", "b1", &["p"], &["y1"]), node("Bernoulli", "b2", &["p"], &["y2"])];
        if let Some(s) = seed {
            for n in &mut nodes {
                n.attribute.push(AttributeProto { name: Some("seed".into()), f: Some(s), ..Default::default() });
            }
        }
        let outputs = vec![value("y1", &[Ok(1024)]), value("y2", &[Ok(1024)])];
        let bytes = model(nodes, vec![value("p", &[Ok(1024)])], outputs, vec![], 18);
        let m = kiln_onnx::load_bytes(&bytes, "bernoulli.onnx").unwrap().backend(CpuReference);
        let out = m.call(vec![Tensor::full(0.5, &[1024], DType::F32).unwrap()]).unwrap();
        (out[0].to_vec::<f32>().unwrap(), out[1].to_vec::<f32>().unwrap())
    };
    let (a, b) = two(None);
    assert_ne!(a, b, "two unseeded nodes drew the same numbers");
    assert_eq!(two(None), (a, b), "an unseeded model draws the same each run");
    let (c, d) = two(Some(7.0));
    assert_eq!(c, d, "the same seed, the same numbers");
}
