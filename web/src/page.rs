//! The page's start-up (wasm32 only): open WebGPU, build the explorer on its demo tab, queue what the
//! URL asks for, and hand the canvas to eframe's web runner; then publish the state after each frame.

use crate::state;
use kiln_app::{Explorer, Tab};
use wasm_bindgen::prelude::*;

/// Runs when the module loads.
#[wasm_bindgen(start)]
pub fn start() {
    wasm_bindgen_futures::spawn_local(async {
        if let Err(e) = run().await {
            publish(state::FAILED, &format!("the page could not start: {e}"));
            web_sys::console::error_1(&JsValue::from_str(&e));
        }
    });
}

/// What the URL asks for: built-in workloads to run and expression lines to try, in order.
struct Asked {
    workloads: Vec<String>,
    expressions: Vec<String>,
    /// Timed calls per mode (`calls=N`; the app's default otherwise).
    calls: Option<usize>,
}

impl Asked {
    fn from_url(window: &web_sys::Window) -> Asked {
        let search = window.location().search().unwrap_or_default();
        let params = web_sys::UrlSearchParams::new_with_str(&search).ok();
        let all = |key: &str| -> Vec<String> {
            params.as_ref().map_or(Vec::new(), |p| p.get_all(key).iter().filter_map(|v| v.as_string()).collect())
        };
        let workloads = all("run")
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let calls = all("calls").first().and_then(|n| n.parse().ok()).filter(|n| *n > 0);
        Asked { workloads, expressions: all("expr"), calls }
    }

    fn any(&self) -> bool {
        !self.workloads.is_empty() || !self.expressions.is_empty()
    }
}

async fn run() -> Result<(), String> {
    let window = web_sys::window().ok_or("no window")?;
    let document = window.document().ok_or("no document")?;
    let canvas: web_sys::HtmlCanvasElement = document
        .get_element_by_id("kiln")
        .ok_or("the page has no <canvas id=\"kiln\">")?
        .dyn_into()
        .map_err(|_| "#kiln is not a canvas")?;
    let mut app = Explorer::default();
    app.tab = Tab::Demo;
    match kiln::open_wgpu().await {
        Ok(rt) => {
            app.run_backend = kiln::Backend::Wgpu;
            app.notice = Some(format!("kiln computes on this page's WebGPU device: {}", rt.driver().describe()));
        }
        Err(e) => {
            app.run_backend = kiln::Backend::Kernels;
            app.notice = Some(format!(
                "This browser offers no WebGPU device ({e}). The demo runs on kiln's CPU kernel interpreter instead: the same compiler and kernels, executed on the CPU."
            ));
        }
    }
    let asked = Asked::from_url(&window);
    if let Some(n) = asked.calls {
        app.run_calls = n;
    }
    // Workloads first, then the expression lines: a bad one is rejected at once, a good one is queued.
    let mut rejected = Vec::new();
    let ids: Vec<&str> = asked.workloads.iter().map(String::as_str).collect();
    app.run_demo(&ids);
    for line in &asked.expressions {
        app.expression = line.clone();
        app.run_expression();
        if let Some(e) = app.expression_error.take() {
            rejected.push(serde_json::json!({ "expression": line, "error": e }));
        }
    }
    let auto = asked.any();
    publish(if auto { state::RUNNING } else { state::READY }, "");
    let page = Page { app, auto, rejected, published: false };
    eframe::WebRunner::new()
        .start(canvas, eframe::WebOptions::default(), Box::new(move |_| Ok(Box::new(page))))
        .await
        .map_err(|e| format!("{e:?}"))
}

/// The explorer, and what the page has published of the runs the URL asked for.
struct Page {
    app: Explorer,
    auto: bool,
    rejected: Vec<serde_json::Value>,
    published: bool,
}

impl eframe::App for Page {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.app.show(ui);
        if self.auto && !self.published && self.app.runs_idle() {
            let mut json = self.app.runs_json();
            json["rejected"] = serde_json::Value::Array(self.rejected.clone());
            let ok = json["correct"].as_bool() == Some(true);
            publish(if ok { state::DONE } else { state::FAILED }, &json.to_string());
            self.published = true;
        }
    }
}

/// Writes the page's state and text into `#kiln-status`.
fn publish(state: &str, text: &str) {
    let Some(el) = web_sys::window().and_then(|w| w.document()).and_then(|d| d.get_element_by_id("kiln-status")) else {
        return;
    };
    let _ = el.set_attribute("data-state", state);
    el.set_text_content(Some(text));
}
