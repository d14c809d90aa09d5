//! kiln's browser demo: the explorer (`kiln-app`) and the whole compiler built for wasm32 and started
//! on the page's canvas. kiln computes on the page's WebGPU device, opened without blocking; where the
//! browser offers none, the page says so and the demo runs on kiln's CPU kernel interpreter (the same
//! compiler and kernels, executed on the CPU). The UI draws through WebGL, so it shows either way.
//!
//! The page publishes its state in `<pre id="kiln-status" data-state=…>`: `ready`, then, when the URL
//! asks for runs (`?run=W1,W2,W3`, and `expr=` lines of the expression language, repeatable), `running`
//! and finally `done` (every run matched the reference) or `failed`, with the runs as JSON. The
//! `kiln-web-check` binary drives the page in headless Chromium and reads it.

#[cfg(target_arch = "wasm32")]
mod page;

/// The state names the page publishes in `data-state`, shared by the page and its checker.
pub mod state {
    /// The app is starting.
    pub const LOADING: &str = "loading";
    /// The app is up and nothing was asked of it.
    pub const READY: &str = "ready";
    /// Runs the URL asked for are under way.
    pub const RUNNING: &str = "running";
    /// Every run the URL asked for finished and matched the reference.
    pub const DONE: &str = "done";
    /// A run failed or disagreed with the reference, or the page could not start.
    pub const FAILED: &str = "failed";
}
