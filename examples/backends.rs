//! Lists the backends this machine can run, the wgpu adapter kiln picks and every other one it can run on (never mistake lavapipe or a
//! GL fallback for a GPU). `cargo run --example backends`

use kiln::Backend;

fn main() {
    println!("backends available here, best first: {:?}", Backend::available());
    for b in [Backend::Cuda, Backend::Wgpu] {
        match b.runtime() {
            Ok(Some(rt)) => println!("{}: {}", rt.name(), rt.driver().describe()),
            Ok(None) => {}
            Err(e) => println!("{e}"),
        }
    }
    for (n, adapter) in kiln::wgpu_adapters().iter().enumerate() {
        println!("Backend::WgpuAdapter({n}) (`wgpu:{n}`): {adapter}");
    }
}
