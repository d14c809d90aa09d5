//! A compile-cache entry on disk, as any bytes (a truncated write, another build, a hostile file): the
//! entry as written, and a payload wrapped with a valid checksum so decoding reaches it. A typed
//! rejection or a compiled graph, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = kiln_graph::cache::decode(text, "k");
    let _ = kiln_graph::cache::decode(&kiln_graph::cache::encode_entry("k", text), "k");
});
