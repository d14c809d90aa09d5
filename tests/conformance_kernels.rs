//! The conformance suite on the CPU kernel interpreter: the whole compiler pipeline, no GPU.

mod conformance;

conformance_suite!(
    backend = Some(kiln::graph::KernelInterpreter::default().runtime()),
    random_cases = 10_000,
    big = false,
    ieee_nan = true
);

/// The big-tensor checks the GPU tests run at 3·2^30 elements, at 3·2^12 here: the checks themselves are
/// exercised (reading back, comparing against the reference) wherever CI runs.
#[test]
fn big_tensor_checks_at_a_small_size() {
    let b: std::sync::Arc<dyn kiln::graph::Backend> = kiln::graph::KernelInterpreter::default().runtime();
    conformance::user_cases::big_tensors(&b, 3 << 12).unwrap();
}
