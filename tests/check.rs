//! `kiln check` and its minimizer against a seeded wrong lowering (`KILN_TEST_WRONG_KERNEL=op:tanh`: every
//! kernel computing `tanh` gets it a quarter too large). One test, so the knob it sets and clears is seen
//! by nothing else in this process.

use kiln::graph::minimize::Case;
use kiln::graph::{capture, DType, TensorSpec};
use kiln::{Backend, Tensor};

/// A DAG of about 60 ops over two inputs: every step reads one or two of the last few values (values
/// stay of order one: no step cancels), `tanh` among them.
fn sixty_ops(t: &[Tensor]) -> kiln::Result<Vec<Tensor>> {
    let mut live = vec![t[0].clone(), t[1].clone()];
    for i in 0..40 {
        let n = live.len();
        let a = &live[n - 1 - i % n.min(3)];
        let b = &live[n - 1 - (i * 7 + 1) % n.min(5)];
        let y = match i % 6 {
            0 => a.add(b)?.mul(0.5)?,
            1 => a.sigmoid()?,
            2 => a.mul(b)?.add(0.5)?,
            3 => a.tanh()?,
            4 => a.sub(b)?.add(1.0)?,
            _ => a.mul(1.5)?,
        };
        live.push(y);
        if live.len() > 8 {
            live.remove(0);
        }
    }
    Ok(vec![live.pop().expect("values")])
}

fn set_knob(on: bool) {
    if on {
        std::env::set_var("KILN_TEST_WRONG_KERNEL", "op:tanh");
    } else {
        std::env::remove_var("KILN_TEST_WRONG_KERNEL");
    }
}

#[test]
fn check_catches_a_wrong_lowering_and_the_minimizer_cuts_it_to_a_few_nodes() {
    std::env::set_var("KILN_CACHE_DIR", std::env::temp_dir().join(format!("kiln-check-{}", std::process::id())));
    let targets = vec![kiln::graph::IntoBackend::into_backend(Backend::Kernels).expect("the kernel interpreter")];
    let specs = [TensorSpec::new(DType::F32, &[4, 8]), TensorSpec::new(DType::F32, &[4, 8])];
    let graph = capture(&specs, sixty_ops).expect("traces");
    // 60 ops, and the constants they add and multiply by.
    assert_eq!(graph.nodes.iter().filter(|n| !matches!(n.op.name(), "input" | "full")).count(), 60);
    let case = Case { graph, inputs: kiln::graph::workloads::inputs(&specs) };

    // Right lowering: every output and kernel within the rule.
    set_knob(false);
    let report = case.check(&targets).expect("runs");
    assert!(report.passed(), "{report}");
    assert!(report.outputs.iter().any(|o| o.mode == "reduce-overhead"), "both modes are checked");
    assert!(!report.kernels.is_empty(), "each kernel is checked alone");

    // Wrong lowering: the output and the kernel computing tanh are caught.
    set_knob(true);
    let report = case.check(&targets).expect("runs");
    assert!(!report.passed(), "{report}");
    assert!(report.outputs.iter().any(|o| !o.passed()), "{report}");
    assert!(report.kernels.iter().any(|k| k.outcome.as_ref().is_ok_and(|o| !o.correct)), "{report}");
    let what = report.first_failure().expect("a failure");

    // The same through the function-level API (a function run once, its graph recorded and checked).
    let x = Tensor::from_data(case.inputs[0].clone());
    let y = Tensor::from_data(case.inputs[1].clone());
    let checked = kiln::check(|(a, b): (&Tensor, &Tensor)| sixty_ops(&[a.clone(), b.clone()]), (&x, &y), &targets)
        .expect("checks");
    assert_eq!(checked.len(), 1, "one graph");
    assert!(!checked[0].1.passed());

    // Minimized: a handful of nodes that still fail, tanh among them.
    let small = kiln::check::minimize(case.clone(), &targets, 2000);
    eprintln!("minimized to {} op(s):\n{}", small.ops(), small.graph);
    assert!(small.ops() <= 5, "{} ops left:\n{}", small.ops(), small.graph);
    assert!(small.graph.nodes.iter().any(|n| n.op.name() == "tanh"), "{}", small.graph);
    assert!(!small.check(&targets).expect("runs").passed());
    // At the smallest sizes that still fail (the inputs were [4, 8]), with plain values.
    assert!(small.inputs.iter().all(|d| d.numel() <= 2), "{:?}", small.inputs);
    assert!(small.inputs.iter().all(|d| d.values().iter().all(|v| (v * 100.0).round() == v * 100.0)));

    // The reproducer: JSON plus a Rust test that replays it; failing with the knob, passing without.
    let dir = std::env::temp_dir().join(format!("kiln-minimized-{}", std::process::id()));
    let (json, rs) = kiln::graph::minimize::write_reproducer(&small, &what, &dir, "tanh_case").expect("writes");
    let test = std::fs::read_to_string(&rs).expect("the test");
    assert!(test.contains("include_str!(\"tanh_case.json\")") && test.contains("fn tanh_case()"), "{test}");
    let replay = Case::from_json(&std::fs::read_to_string(&json).expect("the case")).expect("reads back");
    assert_eq!(replay, small);
    assert!(!replay.check(&targets).expect("runs").passed(), "fails with the knob");
    set_knob(false);
    assert!(replay.check(&targets).expect("runs").passed(), "passes without it");
    let _ = std::fs::remove_dir_all(&dir);

    // Bad case files are typed errors.
    assert!(Case::from_json("{").is_err());
    assert!(Case::from_json(&std::fs::read_to_string(&json).unwrap_or_default().replace("kiln-case/1", "x")).is_err());
}
