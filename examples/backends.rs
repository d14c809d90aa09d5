//! Lists the backends this machine can run and the wgpu adapter kiln picks (never mistake lavapipe or a
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
}
