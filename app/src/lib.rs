//! kiln explorer: where a person sees what kiln did to their code — the graphs it captured and the breaks
//! between them, the regions it fused, the kernels they became (WGSL and PTX side by side, with the user
//! lines they came from), the guards and recompiles — and, from bench reports, what it bought.
//!
//! Everything shown comes from a [`kiln::CompileReport`] (the one record the compiler writes: built-in
//! workloads are compiled live on a worker thread, other programs' reports are opened from
//! `KILN_REPORT=dir` files) or a `kiln-bench` JSON. The app is wasm-compatible: the browser demo runs it.

mod bench;
mod demo;
mod explorer;
#[cfg(not(target_arch = "wasm32"))]
mod export;
pub mod expr;
mod graph_view;
mod guards_view;
mod highlight;
mod kernel_view;
mod layout;
pub mod live;
mod open;
mod screenshot;
mod source_view;
mod timelines;

pub use bench::{side_by_side, BenchRow, BenchTable, Series};
#[cfg(not(target_arch = "wasm32"))]
pub use explorer::json_dialog;
pub use explorer::{Explorer, Tab};
#[cfg(not(target_arch = "wasm32"))]
pub use export::{crop as crop_chart, ChartShot};
pub use graph_view::{boxes as graph_boxes, Boxes};
pub use live::{LiveMsg, LiveRun, LiveTime, Subject};
pub use open::{synthetic_report, workload_report};
pub use screenshot::check_screenshot;
pub use timelines::{memory_profile, BufferSpan};

/// Runs the future `make` returns off the UI: natively on a worker thread that blocks on it; in a
/// browser page (one thread) as a task the page's event loop drives, which runs after this frame is drawn.
pub(crate) fn spawn_task<F, Fut>(make: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    #[cfg(not(target_arch = "wasm32"))]
    std::thread::spawn(move || pollster::block_on(make()));
    #[cfg(target_arch = "wasm32")]
    wasm_bindgen_futures::spawn_local(make());
}

/// Lets a browser page draw a frame and handle input in the middle of long work (a task runs until it
/// awaits something pending); nothing to do natively, where work runs on its own thread.
pub(crate) async fn yield_to_page() {
    #[cfg(target_arch = "wasm32")]
    {
        let promise = js_sys::Promise::new(&mut |resolve, _| match web_sys::window() {
            Some(w) => drop(w.set_timeout_with_callback(&resolve)),
            None => drop(resolve.call0(&wasm_bindgen::JsValue::NULL)),
        });
        let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
    }
}
