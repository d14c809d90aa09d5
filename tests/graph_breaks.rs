//! Tracing with graph breaks: a host read inside a compiled function splits the trace, data-dependent
//! Rust control flow works, and each path taken gets its own graph.

mod common;
use common::*;
use kiln::graph::ir::{InputKind, Op};
use kiln::{compile, Error, Result, Static, Tensor};

/// Branches on a value computed from the input: the read is line `READ_LINE`.
fn branchy(x: &Tensor) -> Result<Tensor> {
    let total = x.sum(&[], false)?;
    let doubled = x.mul(2.0)?;
    let positive = total.item::<f32>()? > 0.0; // the graph break
    if positive {
        doubled.add(1.0)
    } else {
        doubled.sub(1.0)?.neg()?.exp()
    }
}
const READ_LINE: u32 = 13;

#[test]
fn a_branch_splits_the_trace_and_each_path_gets_its_graph() {
    let f = compile(branchy);

    let x = f32s(&[1.0, 2.0, -0.5], &[3]);
    let (y, ex) = f.call_explained(&x).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 5.0, 0.0]);
    assert_eq!(ex.graph_count(), 2, "{ex}");
    assert_eq!(ex.break_count(), 1);
    let brk = &ex.breaks[0];
    assert_eq!(brk.loc.line, READ_LINE, "{ex}");
    assert!(brk.loc.file.ends_with("graph_breaks.rs"));
    assert!(brk.reason.contains("item"), "{}", brk.reason);
    assert_eq!(ex.graphs[0].ended_by.as_ref(), Some(brk));
    // Before the read: the sum and the doubling; both outlive the break, so both are outputs.
    assert_eq!(ex.graphs[0].graph.op_histogram(), vec![("full", 1), ("mul", 1), ("sum", 1)]);
    assert_eq!(ex.graphs[0].graph.outputs.len(), 2);
    // After the read: the positive branch only, reading the carried-over doubled tensor.
    assert_eq!(ex.graphs[1].graph.op_histogram(), vec![("add", 1), ("full", 1)]);
    assert_eq!(ex.graphs[1].graph.inputs[0].kind, InputKind::Carried { from_graph: 0 });

    let x = f32s(&[-1.0, -2.0, 0.5], &[3]);
    let (y, ex) = f.call_explained(&x).unwrap();
    let want: Vec<f32> = [-1.0f64, -2.0, 0.5].iter().map(|v| (-(2.0 * v - 1.0)).exp() as f32).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
    assert_eq!(ex.graph_count(), 2);
    assert_eq!(ex.graphs[0].graph.op_histogram(), vec![("full", 1), ("mul", 1), ("sum", 1)]);
    assert_eq!(ex.graphs[1].graph.op_histogram(), vec![("exp", 1), ("full", 1), ("neg", 1), ("sub", 1)]);
    let text = ex.to_string();
    assert!(text.contains("2 graph(s), 1 graph break(s)"), "{text}");
    assert!(text.contains(&format!("graph_breaks.rs:{READ_LINE}")), "{text}");
}

#[test]
fn a_data_dependent_loop_makes_one_graph_per_stretch() {
    let halve_until_small = compile(|x: &Tensor| -> Result<Tensor> {
        let mut x = x.clone();
        while x.max(&[], false)?.item::<f32>()? > 1.0 {
            x = x.div(2.0)?;
        }
        x.add(0.0)
    });
    let (y, ex) = halve_until_small.call_explained(&f32s(&[5.0, 3.0], &[2])).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.625, 0.375]);
    // max (break), div+max (break) x3, add — four breaks, five graphs.
    assert_eq!(ex.break_count(), 4, "{ex}");
    assert_eq!(ex.graph_count(), 5, "{ex}");
    assert_eq!(ex.graphs[4].graph.op_histogram(), vec![("add", 1), ("full", 1)]);
}

#[test]
fn fullgraph_turns_a_break_into_an_error_at_the_line() {
    let f = compile(branchy).fullgraph(true);
    let err = f.call(&f32s(&[1.0], &[1])).unwrap_err();
    match err {
        Error::GraphBreak { loc, reason } => {
            assert_eq!(loc.line, READ_LINE);
            assert!(reason.contains("item"));
        }
        other => panic!("expected a graph-break error, got {other}"),
    }
    // Swallowing the error inside the function does not hide the break.
    let sneaky = compile(|x: &Tensor| -> Result<Tensor> {
        let _ = x.sum(&[], false)?.item::<f32>();
        x.add(1.0)
    })
    .fullgraph(true);
    assert!(matches!(sneaky.call(&f32s(&[1.0], &[1])), Err(Error::GraphBreak { .. })));
    // Without a host read, fullgraph compiles one graph.
    let fine = compile(|x: &Tensor| x.exp()?.sum(&[], false)).fullgraph(true);
    let ex = fine.explain(&f32s(&[0.0, 0.0], &[2])).unwrap();
    assert_eq!((ex.graph_count(), ex.break_count()), (1, 0));
}

#[test]
fn arguments_weights_and_statics_are_recorded() {
    let weight = f32s(&[2.0, 3.0], &[2]);
    let f = compile(|(x, Static(scale)): (&Tensor, Static<f64>)| x.mul(&weight)?.mul(scale));
    let x = f32s(&[1.0, 1.0], &[2]);
    let (y, ex) = f.call_explained((&x, Static(0.5))).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 1.5]);
    assert_eq!(ex.static_args, vec!["0.5".to_string()]);
    let g = &ex.graphs[0].graph;
    let kinds: Vec<&InputKind> = g.inputs.iter().map(|i| &i.kind).collect();
    assert_eq!(kinds, vec![&InputKind::Arg { index: 0 }, &InputKind::Lifted]);
    // The weight is an input, not a constant baked into the graph.
    assert!(!g.nodes.iter().any(|n| matches!(n.op, Op::Full { value } if value == 2.0)));
    // A new weight value needs no new code: the same function reads it on the next call.
    let again = compile(|x: &Tensor| x.mul(&weight));
    assert_eq!(again.call(&x).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
}

#[test]
fn a_compiled_function_called_inside_a_trace_is_inlined() {
    let inner = compile(|x: &Tensor| x.add(1.0));
    let outer = compile(|x: &Tensor| inner.call(x)?.mul(3.0));
    let (y, ex) = outer.call_explained(&f32s(&[1.0], &[1])).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![6.0]);
    assert_eq!(ex.graph_count(), 1);
    assert_eq!(ex.graphs[0].graph.op_histogram(), vec![("add", 1), ("full", 2), ("mul", 1)]);
}

#[test]
fn eager_and_compiled_agree_on_reads_outside_any_trace() {
    let x = f32s(&[1.0, 2.0], &[2]);
    let y = x.exp().unwrap();
    assert!(!y.is_traced());
    let (v, _) = read(&Ok(y));
    assert_close(&v, &[1f64.exp() as f32 as f64, 2f64.exp() as f32 as f64]);
    // The same function compiled (kernels, not the eager reference) agrees.
    let f = kiln::compile(|x: &kiln::Tensor| x.exp()).backend(kiln::Backend::Kernels);
    let (c, ex) = f.call_explained(&x).unwrap();
    assert_eq!((ex.graph_count(), ex.backend.as_str()), (1, "cpu-kernels"));
    assert_close(&read(&Ok(c)).0, &v);
}

/// A function with a graph break runs its Rust code on every call (it is opaque host code: the value
/// read decides what follows), but each graph between breaks compiles once: later calls are served by
/// the compile cache, and the stats and the explanation say so.
#[test]
fn graphs_around_a_break_compile_once() {
    let f = compile(|x: &Tensor| -> Result<Tensor> {
        let y = x.mul(2.0)?;
        // Data-dependent control flow: the host reads a value and picks a branch.
        if y.sum(&[0], false)?.item::<f32>()? > 0.0 {
            y.add(1.0)
        } else {
            y.sub(1.0)
        }
    })
    .backend(kiln::Backend::Kernels);
    for i in 0..4 {
        let x = f32s(&[1.0 + i as f32, 2.0], &[2]);
        let (y, ex) = f.call_explained(&x).unwrap();
        assert_close(&read(&Ok(y)).0, &[2.0 * (1.0 + i as f64) + 1.0, 5.0]);
        assert_eq!(ex.graph_count(), 2);
        if i > 0 {
            assert!(ex.graphs.iter().all(|g| g.cache_level.is_some()), "{ex}");
            assert!(ex.to_string().contains("compile served from the memory cache"), "{ex}");
        }
    }
    let s = f.stats();
    assert_eq!(s.traces, 4, "{s:?}");
    assert!(s.graph_cache_hits >= 6, "calls 2-4 reuse both graphs' compiles: {s:?}");
}
