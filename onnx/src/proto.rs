//! The ONNX protobuf schema as Rust types, generated at build time from `proto/onnx.proto` (see
//! `build.rs`).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
