//! Bad input returns a typed error naming the user's line — never a panic. One test per case.

mod common;
use common::*;
use kiln::{compile, DType, Error, SourceLoc, Tensor};

#[track_caller]
fn assert_here(loc: &SourceLoc, line: u32) {
    assert_eq!(loc.line, line, "error should point at the user's line, got {loc}");
    assert!(loc.file.ends_with("errors.rs"), "error should name the user's file, got {loc}");
}

#[test]
fn shape_mismatch_names_both_shapes_and_the_line() {
    let (a, b) = (f32s(&[0.0; 6], &[2, 3]), f32s(&[0.0; 4], &[4]));
    let (r, line) = (a.add(&b), line!());
    match r.unwrap_err() {
        e @ Error::Broadcast { .. } => {
            let msg = e.to_string();
            assert!(msg.contains("[2, 3]") && msg.contains("[4]"), "{msg}");
            let Error::Broadcast { loc, op, .. } = e else { unreachable!() };
            assert_eq!(op, "add");
            assert_here(&loc, line);
        }
        e => panic!("expected a broadcast error, got {e}"),
    }
}

#[test]
fn wrong_dtype_is_a_dtype_error() {
    let x = i64s(&[1, 2], &[2]);
    let (r, line) = (x.exp(), line!());
    match r.unwrap_err() {
        Error::DType { op, got, loc, .. } => {
            assert_eq!((op.as_str(), got), ("exp", DType::I64));
            assert_here(&loc, line);
        }
        e => panic!("expected a dtype error, got {e}"),
    }
    let (r, line) = (f32s(&[1.0], &[1]).add(&x), line!());
    match r.unwrap_err() {
        Error::DType { loc, .. } => assert_here(&loc, line),
        e => panic!("expected a dtype error, got {e}"),
    }
    let (r, line) = (f32s(&[1.0], &[1]).where_(1.0, 2.0), line!());
    assert!(matches!(r, Err(Error::DType { ref loc, .. }) if loc.line == line));
}

#[test]
fn bad_axis_is_an_axis_error() {
    let x = f32s(&[0.0; 6], &[2, 3]);
    let (r, line) = (x.sum(&[2], false), line!());
    match r.unwrap_err() {
        Error::Axis { axis, rank, loc, .. } => {
            assert_eq!((axis, rank), (2, 2));
            assert_here(&loc, line);
        }
        e => panic!("expected an axis error, got {e}"),
    }
    for (r, line) in [
        (x.softmax(-3), line!()),
        (x.transpose(0, 5), line!()),
        (x.argmax(9, false), line!()),
        (x.slice(2, 0, None, 1), line!()),
        (x.unsqueeze(4), line!()),
    ] {
        assert!(matches!(r, Err(Error::Axis { ref loc, .. }) if loc.line == line), "{r:?}");
    }
}

#[test]
fn reshape_to_a_wrong_size_is_a_reshape_error() {
    let x = f32s(&[0.0; 6], &[2, 3]);
    let (r, line) = (x.reshape(&[4, 2]), line!());
    match r.unwrap_err() {
        e @ Error::Reshape { .. } => {
            assert!(e.to_string().contains("6 elements") && e.to_string().contains("8 elements"), "{e}");
            let Error::Reshape { loc, .. } = e else { unreachable!() };
            assert_here(&loc, line);
        }
        e => panic!("expected a reshape error, got {e}"),
    }
    let (r, line) = (x.reshape(&[4, -1]), line!());
    assert!(matches!(r, Err(Error::Reshape { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (x.reshape(&[-1, -1]), line!());
    assert!(matches!(r, Err(Error::InvalidArgument { ref loc, .. }) if loc.line == line), "{r:?}");
}

#[test]
fn other_bad_arguments_are_typed() {
    let x = f32s(&[0.0; 6], &[2, 3]);
    let (r, line) = (x.matmul(&f32s(&[0.0; 4], &[2, 2])), line!());
    assert!(matches!(r, Err(Error::Shape { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (x.permute(&[0, 0]), line!());
    assert!(matches!(r, Err(Error::InvalidArgument { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (x.slice(0, 0, None, 0), line!());
    assert!(matches!(r, Err(Error::InvalidArgument { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (Tensor::from_slice(&[1.0f32; 5], &[2, 3]), line!());
    assert!(matches!(r, Err(Error::DataLength { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (x.linear(&f32s(&[0.0; 8], &[2, 4]), None), line!());
    assert!(matches!(r, Err(Error::Shape { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (Tensor::concat(&[&x, &f32s(&[0.0; 4], &[2, 2])], 0), line!());
    assert!(matches!(r, Err(Error::Shape { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (f32s(&[], &[0]).max(&[], false), line!());
    assert!(matches!(r, Err(Error::Shape { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (x.item::<f32>(), line!());
    assert!(matches!(r, Err(Error::Shape { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (x.expand(&[3, 3]), line!());
    assert!(matches!(r, Err(Error::Broadcast { ref loc, .. }) if loc.line == line), "{r:?}");
    let (r, line) = (Tensor::arange(0.0, 1.0, 0.0, DType::F32), line!());
    assert!(matches!(r, Err(Error::InvalidArgument { ref loc, .. }) if loc.line == line), "{r:?}");
}

#[test]
fn errors_inside_a_compiled_function_point_at_the_users_line() {
    let bad_line = line!() + 1;
    let f = compile(|x: &Tensor| x.reshape(&[5]));
    match f.call(&f32s(&[0.0; 6], &[2, 3])).unwrap_err() {
        Error::Reshape { loc, .. } => assert_here(&loc, bad_line),
        e => panic!("expected a reshape error, got {e}"),
    }
}

#[test]
fn f64_on_a_target_without_it_is_a_typed_error_naming_the_line() {
    let x = Tensor::from_slice(&[1.0f64, 2.0], &[2]).expect("data");
    // WebGPU's default target: no `shader-f64` (as every browser).
    let webgpu = kiln::graph::KernelInterpreter::new(kiln::graph::Target::webgpu_default());
    let line = line!() + 1;
    let f = compile(|x: &Tensor| x.mul(2.0)?.exp()).backend(webgpu);
    match f.call(&x).unwrap_err() {
        Error::Unsupported { what, loc } => {
            assert!(what.contains("f64") && what.contains("CPU reference"), "{what}");
            assert_here(&loc, line);
        }
        e => panic!("expected an unsupported-dtype error, got {e}"),
    }
    let upload = kiln::graph::Target::webgpu_default().check_upload(&x.to_data().expect("host data"));
    assert!(matches!(upload, Err(Error::Unsupported { .. })), "{upload:?}");
}
