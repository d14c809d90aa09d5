//! `docs/ops.md` is generated from the code; this test fails when they disagree.
//! `KILN_BLESS=1 cargo test -p kiln-graph --test ops_doc` rewrites the file.

use kiln_graph::interp;
use kiln_graph::opdocs::{catalog, ops_markdown};
use std::collections::BTreeSet;

fn generated() -> String {
    let cpu: &dyn Fn(&kiln_graph::Op) -> bool = &interp::supports;
    ops_markdown(&[("cpu", cpu)])
}

#[test]
fn ops_md_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/ops.md");
    let want = generated();
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(path, &want).expect("docs/ops.md is writable");
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/ops.md is out of date with the code; regenerate it with \
         `KILN_BLESS=1 cargo test -p kiln-graph --test ops_doc`"
    );
}

#[test]
fn the_catalog_names_every_op_once() {
    let names: Vec<&str> = catalog().iter().map(|o| o.name()).collect();
    let distinct: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(names.len(), distinct.len(), "duplicate op names: {names:?}");
    for required in
        ["exp", "erf", "pow", "logical_or", "where", "argmin", "gather", "pad", "matmul", "causal_mask", "var"]
    {
        assert!(distinct.contains(required), "{required} missing from the catalogue");
    }
}
