//! Compiles the ONNX schema (`proto/onnx.proto`, vendored from the `onnx` project, Apache-2.0) into Rust
//! types with a pure-Rust protobuf compiler: building needs no system `protoc`.

fn main() {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let descriptors = protox::compile(["onnx.proto"], ["proto"]).expect("proto/onnx.proto is a valid schema");
    prost_build::Config::new().compile_fds(descriptors).expect("prost renders the ONNX schema");
}
