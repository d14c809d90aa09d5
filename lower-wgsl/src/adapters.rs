//! Finding the adapters wgpu offers here and choosing one: ranked best first, so "the best adapter" and
//! "adapter 0" are the same device, and a program can open any other by its place in the list (the
//! explorer runs on each). Native code finds them once per process; a browser offers one.

use kiln_graph::{Error, Result};

fn err(msg: impl Into<String>) -> Error {
    Error::Backend { backend: "wgpu".into(), msg: msg.into() }
}

/// Ranks adapters: real GPUs first, then software ones; Vulkan/Metal/DX12 over GL.
fn score(info: &wgpu::AdapterInfo) -> i32 {
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 40,
        wgpu::DeviceType::IntegratedGpu => 30,
        wgpu::DeviceType::VirtualGpu => 20,
        wgpu::DeviceType::Cpu => 10,
        wgpu::DeviceType::Other => 0,
    };
    let api = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 | wgpu::Backend::BrowserWebGpu => 5,
        _ => 0,
    };
    kind + api
}

/// How to get an adapter here, for the error when none is found.
#[cfg(not(target_arch = "wasm32"))]
pub const NO_ADAPTER_HINT: &str = "no GPU adapter found: install a Vulkan driver (on Debian/Ubuntu without a GPU: \
     `apt-get install -y mesa-vulkan-drivers libvulkan1` for lavapipe), or set KILN_WGPU_ADAPTER to one of the \
     listed adapters";

/// How to get an adapter in a browser, for the error when none is found.
#[cfg(target_arch = "wasm32")]
pub const NO_ADAPTER_HINT: &str =
    "the browser gave no WebGPU adapter (WebGPU is off, or not offered by this browser on this machine)";

/// Every adapter wgpu finds (but its no-op one), best first.
pub async fn find() -> Vec<wgpu::Adapter> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let mut adapters: Vec<wgpu::Adapter> = instance
        .enumerate_adapters(wgpu::Backends::all())
        .await
        .into_iter()
        .filter(|a| a.get_info().backend != wgpu::Backend::Noop)
        .collect();
    // Stable: adapters of one rank keep the order wgpu found them in.
    adapters.sort_by_key(|a| std::cmp::Reverse(score(&a.get_info())));
    adapters
}

/// [`find`]'s adapters, found once per process (opening each device stays separate).
#[cfg(not(target_arch = "wasm32"))]
pub fn here() -> &'static [wgpu::Adapter] {
    static FOUND: std::sync::OnceLock<Vec<wgpu::Adapter>> = std::sync::OnceLock::new();
    FOUND.get_or_init(|| pollster::block_on(find()))
}

/// Each adapter in words: name, API, kind.
pub fn names(adapters: &[wgpu::Adapter]) -> Vec<String> {
    adapters
        .iter()
        .map(|a| a.get_info())
        .map(|i| format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type))
        .collect()
}

/// The words for asking for adapter `n` where there is none.
pub fn missing(n: usize, adapters: &[wgpu::Adapter]) -> String {
    format!("no wgpu adapter {n}: adapters here, best first: [{}]", names(adapters).join(", "))
}

/// Where in `adapters` (best first) the default device is: the first whose name contains
/// `KILN_WGPU_ADAPTER` when it is set, else the best.
pub fn default_index(adapters: &[wgpu::Adapter]) -> Result<usize> {
    let wanted = std::env::var("KILN_WGPU_ADAPTER").ok().map(|w| w.to_lowercase());
    adapters
        .iter()
        .position(|a| wanted.as_ref().is_none_or(|w| a.get_info().name.to_lowercase().contains(w)))
        .ok_or_else(|| err(format!("{NO_ADAPTER_HINT}; adapters present: [{}]", names(adapters).join(", "))))
}
