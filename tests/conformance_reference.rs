//! The user-reported cases on the CPU reference itself: the oracle every other backend is compared with
//! must get them right too (the rest of the suite compares backends *with* the reference).

mod conformance;

use conformance::user_cases;
use kiln::graph::{Backend, CpuReference};
use std::sync::Arc;

fn reference() -> Arc<dyn Backend> {
    Arc::new(CpuReference)
}

#[test]
fn aliased_arguments_are_not_merged() {
    user_cases::aliased_arguments(&reference());
}

#[test]
fn an_argument_that_is_a_captured_weight() {
    user_cases::argument_that_is_a_captured_weight(&reference());
}

#[test]
fn run_time_checks_are_typed_errors() {
    user_cases::run_time_checks(&reference());
}

#[test]
fn dynamic_dims_reshape_and_broadcast() {
    user_cases::dynamic_reshapes(&reference());
    user_cases::broadcast_errors_show_sizes(&reference());
}

#[test]
fn huge_sizes_are_typed_errors() {
    user_cases::huge_sizes(&reference());
}
