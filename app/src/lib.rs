//! kiln explorer: where a person sees what kiln did to their code — the graphs it captured and the breaks
//! between them, the regions it fused, the kernels they became (WGSL and PTX side by side, with the user
//! lines they came from), the guards and recompiles — and, from bench reports, what it bought.
//!
//! Everything shown comes from a [`kiln::CompileReport`] (the one record the compiler writes: built-in
//! workloads are compiled live on a worker thread, other programs' reports are opened from
//! `KILN_REPORT=dir` files) or a `kiln-bench` JSON. The app is wasm-compatible: the browser demo runs it.

mod bench;
mod explorer;
#[cfg(not(target_arch = "wasm32"))]
mod export;
mod graph_view;
mod guards_view;
mod highlight;
mod kernel_view;
mod layout;
mod live;
mod open;
mod screenshot;
mod source_view;
mod timelines;

pub use bench::{side_by_side, BenchRow, BenchTable, Series};
pub use explorer::{Explorer, Tab};
#[cfg(not(target_arch = "wasm32"))]
pub use export::{crop as crop_chart, ChartShot};
pub use graph_view::{boxes as graph_boxes, Boxes};
pub use live::{LiveMsg, LiveRun, LiveTime};
pub use open::{synthetic_report, workload_report};
pub use screenshot::check_screenshot;
pub use timelines::{memory_profile, BufferSpan};
