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
