//! The conformance suite on the CPU kernel interpreter: the whole compiler pipeline, no GPU.

mod conformance;

conformance_suite!(
    backend = Some(kiln::graph::KernelInterpreter::default().runtime()),
    random_cases = 10_000,
    big = false,
    ieee_nan = true
);
