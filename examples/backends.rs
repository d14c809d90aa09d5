//! Lists the backends this machine can run and the wgpu adapter kiln picks (never mistake lavapipe or a
//! GL fallback for a GPU). `cargo run --example backends`

use kiln::Backend;

fn main() {
    println!("backends available here, best first: {:?}", Backend::available());
    match kiln_wgsl::WgpuBackend::new() {
        Ok(b) => println!("wgpu adapter: {}", b.gpu().describe()),
        Err(e) => println!("wgpu: {e}"),
    }
}
