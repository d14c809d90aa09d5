//! A compile report read from any text (the explorer opens files people hand it): a typed error or a
//! report, never a panic; a report that reads answers shape questions without panicking either.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(r) = kiln_graph::report::CompileReport::from_json(text) {
        let _ = r.try_shapes(&[vec![2, 3], vec![0]]);
        let _ = r.kernel_count();
        for e in &r.entries {
            let _ = e.guard_lines();
        }
    }
});
