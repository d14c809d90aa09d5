//! JSON export round-trips and rejects malformed input; DOT names op, shape, dtype and source line.

use kiln_graph::export::{from_json, to_dot, to_json};
use kiln_graph::{compile, Error, Result, Tensor};

fn sample_graph() -> kiln_graph::Graph {
    let w = Tensor::from_slice(&[0.5f32; 12], &[4, 3]).unwrap();
    let f =
        compile(|x: &Tensor| -> Result<Tensor> { x.linear(&w, None)?.gelu()?.softmax(-1)?.slice(1, 0, Some(2), 1) });
    let ex = f.explain(&Tensor::from_slice(&[1.0f32; 6], &[2, 3]).unwrap()).unwrap();
    ex.graphs[0].graph.clone()
}

#[test]
fn json_round_trips() {
    let g = sample_graph();
    let text = to_json(&g);
    assert!(text.contains("\"format\": \"kiln-graph\"") && text.contains("\"version\": 1"));
    assert!(text.contains("\"kind\": \"linear\""), "{text}");
    assert_eq!(from_json(&text).unwrap(), g);
}

#[test]
fn malformed_json_is_a_format_error() {
    let g = sample_graph();
    let text = to_json(&g);
    for bad in [
        "not json".to_string(),
        text.replace("\"version\": 1", "\"version\": 99"),
        text.replace("\"kind\": \"linear\"", "\"kind\": \"no_such_op\""),
        with_first_input_of_node(&text, g.nodes.len() - 1, 40),
    ] {
        assert!(matches!(from_json(&bad), Err(Error::Format { .. })), "accepted: {bad:.80}");
    }
}

/// The JSON with node `node`'s first input pointing at `to` (a forward or dangling reference).
fn with_first_input_of_node(text: &str, node: usize, to: u64) -> String {
    let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
    v["graph"]["nodes"][node]["inputs"][0] = serde_json::Value::from(to);
    v.to_string()
}

#[test]
fn dot_shows_op_shape_dtype_and_line() {
    let dot = to_dot(&sample_graph());
    assert!(dot.starts_with("digraph kiln {"));
    assert!(dot.contains("gelu") && dot.contains("f32[2, 4]") && dot.contains("export.rs:"), "{dot}");
    let g = sample_graph();
    let mut edges = 0;
    for (i, n) in g.nodes.iter().enumerate() {
        for a in &n.inputs {
            assert!(dot.contains(&format!("n{} -> n{i};", a.index())), "edge {a} -> n{i} missing: {dot}");
            edges += 1;
        }
    }
    assert_eq!(dot.matches(" -> ").count(), edges, "no edge beyond the graph's: {dot}");
    assert!(dot.contains("peripheries=2"), "outputs are marked: {dot}");
}
