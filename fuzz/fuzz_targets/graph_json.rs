//! A graph or a `kiln check` case read from any text (`kiln check FILE`): a typed error or a value,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(g) = kiln_graph::export::from_json(text) {
        let _ = kiln_graph::export::to_json(&g);
        let _ = kiln_graph::check::seeded_inputs(&g).map(|v| v.len());
    }
    let _ = kiln_graph::minimize::Case::from_json(text);
});
