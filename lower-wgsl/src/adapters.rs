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
    let apis: Vec<(wgpu::Backend, String)> =
        adapters.iter().map(|a| a.get_info()).map(|i| (i.backend, i.name)).collect();
    let mut apis_in_order = apis.iter();
    adapters.retain(|_| apis_in_order.next().is_none_or(|(api, name)| !gl_twin(*api, name, &apis)));
    // Stable: adapters of one rank keep the order wgpu found them in.
    adapters.sort_by_key(|a| std::cmp::Reverse(score(&a.get_info())));
    adapters
}

/// Whether the adapter `name` on `api` is a GL adapter over a device another adapter in `all` reaches through Vulkan, Metal
/// or DX12 (GL names it the same, with `/PCIe/SSE2`-style suffixes). The twin adds nothing kiln can use
/// (GL's compute is the weaker path to the same memory), and on NVIDIA's headless EGL it lists but
/// cannot open a device ("Parent device is lost", gfx-rs/wgpu#7068). With only GL adapters present
/// (`WGPU_BACKEND=gl`) none is a twin.
fn gl_twin(api: wgpu::Backend, name: &str, all: &[(wgpu::Backend, String)]) -> bool {
    use wgpu::Backend::Gl;
    api == Gl && all.iter().any(|(other, o)| *other != Gl && !o.is_empty() && name.starts_with(o.as_str()))
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

#[cfg(test)]
mod tests {
    use super::gl_twin;
    use wgpu::Backend::{Gl, Vulkan};

    #[test]
    fn a_gl_adapter_over_a_vulkan_device_is_a_twin() {
        let all = |names: &[(wgpu::Backend, &str)]| names.iter().map(|&(b, n)| (b, n.to_string())).collect::<Vec<_>>();
        let here = all(&[(Vulkan, "NVIDIA H200"), (Gl, "NVIDIA H200/PCIe/SSE2"), (Gl, "llvmpipe (LLVM 15.0.6)")]);
        assert!(gl_twin(Gl, "NVIDIA H200/PCIe/SSE2", &here));
        assert!(!gl_twin(Vulkan, "NVIDIA H200", &here), "the Vulkan adapter stays");
        assert!(!gl_twin(Gl, "llvmpipe (LLVM 15.0.6)", &here), "a GL adapter over a device nothing else reaches stays");
        let gl_only = all(&[(Gl, "NVIDIA H200/PCIe/SSE2"), (Gl, "llvmpipe (LLVM 15.0.6)")]);
        assert!(!gl_twin(Gl, "NVIDIA H200/PCIe/SSE2", &gl_only), "only GL adapters: none is a twin");
    }
}
