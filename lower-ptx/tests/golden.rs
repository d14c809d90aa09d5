//! Golden PTX (sm_90) for the W1–W3 kernels at their quick sizes: a codegen change shows up here as a
//! reviewed snapshot diff (`cargo insta review`). ptxas assembles the same kernels in
//! `examples/ptxas_check.rs` and the conformance suite runs them.

use kiln_graph::{capture, compile_graph, workloads, Target};

fn ptx(id: &str) -> String {
    let w = workloads::all().into_iter().find(|w| w.id == id).expect("a workload");
    let g = capture(&w.quick, w.f).unwrap();
    let c = compile_graph(&g, &Target::cuda(90)).unwrap();
    c.kernels.iter().map(|k| kiln_ptx::render(k, 90).unwrap().source).collect::<Vec<_>>().join("\n")
}

#[test]
fn w1_pointwise() {
    insta::assert_snapshot!(ptx("W1"));
}

#[test]
fn w2_softmax() {
    insta::assert_snapshot!(ptx("W2"));
}

#[test]
fn w3_layernorm_gelu() {
    insta::assert_snapshot!(ptx("W3"));
}
