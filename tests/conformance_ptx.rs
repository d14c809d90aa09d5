//! The conformance suite with every kernel rendered to PTX and assembled by ptxas for sm_80 and sm_90
//! (results from the kernel interpreter). Without ptxas it fails saying how to install it, unless
//! KILN_PTXAS_TESTS=skip opts out explicitly.

mod conformance;

fn ptx() -> Option<std::sync::Arc<dyn kiln::graph::Backend>> {
    if std::env::var("KILN_PTXAS_TESTS").as_deref() == Ok("skip") {
        eprintln!("KILN_PTXAS_TESTS=skip: ptxas checks skipped on request");
        return None;
    }
    match kiln_ptx::PtxasChecked::runtime() {
        Ok(b) => Some(b),
        Err(e) => panic!("{e}"),
    }
}

conformance_suite!(backend = ptx(), random_cases = 300, big = false, ieee_nan = true);

/// The matmul template with two stages of operand tiles (CUDA plans one, `Target::cuda`) and no GEMM
/// library, so every product of the matmul cases is a template kernel: each assembled by ptxas for
/// sm_80 and sm_90, the values the interpreter's. The two-stage PTX runs on the GPU machine
/// (`KILN_CUDA_MATMUL_STAGES=2 KILN_CUDA_GEMM=kiln conformance_cuda`, `benches/NOTES.md` session 44).
#[test]
fn two_stage_matmul_template_assembles() {
    if std::env::var("KILN_PTXAS_TESTS").as_deref() == Ok("skip") {
        eprintln!("KILN_PTXAS_TESTS=skip: ptxas checks skipped on request");
        return;
    }
    let target = kiln::graph::Target { matmul_stages: 2, library_gemm: false, ..kiln::graph::Target::cuda(90) };
    let device = kiln_ptx::PtxasChecked::with_target(target).unwrap_or_else(|e| panic!("{e}"));
    let rt = kiln::graph::runtime::Runtime::new(device);
    let b: std::sync::Arc<dyn kiln::graph::Backend> = rt;
    conformance::ops::matmul_schedules(&b);
    conformance::ops::large_matmuls(&b);
    conformance::ops::split_products(&b);
}
