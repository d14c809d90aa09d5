//! A backend of your own, as torch's `backend=` callable is: kiln hands it each captured graph with the
//! call's inputs (after tracing, guards and graph breaks, which stay kiln's), and it returns the outputs.
//! This one compiles each graph with kiln's pipeline for the wgpu device, writes every kernel it gets
//! (WGSL, with the kernel IR as a comment) to a directory, and runs them on wgpu — or on the kernel
//! interpreter where no adapter is found. It checks its answers against the CPU reference and exits
//! non-zero if any differs (`scripts/test.sh` runs it).
//!
//! `cargo run --example custom_backend [DIR]`

use kiln::graph::ir::Graph;
use kiln::graph::pipeline::compile_graph;
use kiln::graph::{Backend as GraphBackend, Runtime, TensorData};
use kiln::{compile, Backend, Tensor};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Records every kernel it is given, then delegates to a device runtime.
struct KernelRecorder {
    dir: PathBuf,
    device: Arc<Runtime>,
    /// Compiled graphs by their JSON, so a graph seen again is not compiled again.
    compiled: Mutex<HashMap<String, Arc<kiln::graph::CompiledGraph>>>,
}

impl GraphBackend for KernelRecorder {
    fn name(&self) -> &str {
        "kernel-recorder"
    }

    fn run(&self, graph: &Graph, inputs: &[&TensorData]) -> kiln::Result<Vec<TensorData>> {
        let key = kiln::graph::export::to_json(graph);
        let compiled = {
            let mut seen = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
            match seen.get(&key) {
                Some(c) => c.clone(),
                None => {
                    let c = Arc::new(compile_graph(graph, self.device.target())?);
                    for k in &c.kernels {
                        let source = match kiln_wgsl::render(k, false) {
                            Ok(s) => s.source,
                            Err(e) => format!("// not rendered: {e}"),
                        };
                        let ir: String = k.to_string().lines().map(|l| format!("// {l}\n")).collect();
                        let path = self.dir.join(format!("{}.wgsl", k.name));
                        std::fs::write(&path, format!("{ir}{source}")).map_err(|e| kiln::Error::Format {
                            what: path.display().to_string(),
                            msg: e.to_string(),
                        })?;
                    }
                    seen.insert(key, c.clone());
                    c
                }
            }
        };
        self.device.run_host(&compiled, inputs)
    }
}

fn main() -> kiln::Result<()> {
    let dir = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("kiln-kernels"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| kiln::Error::Format { what: dir.display().to_string(), msg: e.to_string() })?;
    let device = match Backend::Wgpu.runtime() {
        Ok(Some(rt)) => rt,
        _ => Backend::Kernels.runtime()?.expect("the kernel interpreter is a runtime"),
    };
    let recorder: Arc<dyn GraphBackend> =
        Arc::new(KernelRecorder { dir: dir.clone(), device: device.clone(), compiled: Mutex::default() });
    // A function with a graph break (`item` reads a value on the host): the backend gets both graphs.
    let f = |x: &Tensor| -> kiln::Result<Tensor> {
        let h = x.mul(1.5)?.add(0.5)?.gelu()?;
        let scale: f32 = h.sum(&[0], false)?.item()?;
        h.softmax(-1)?.mul(scale)
    };
    let mine = compile(f).backend(recorder);
    let reference = compile(f).backend(Backend::Cpu);
    let x = Tensor::from_slice(&(0..64).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>(), &[64])?;
    for _ in 0..3 {
        let (got, want): (Vec<f32>, Vec<f32>) = (mine.call(&x)?.to_vec()?, reference.call(&x)?.to_vec()?);
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / w.abs().max(1.0)).fold(0.0f32, f32::max);
        if worst > 1e-4 {
            eprintln!("custom_backend: wrong answer (worst relative error {worst:e})");
            std::process::exit(1);
        }
    }
    let mut written: Vec<String> = std::fs::read_dir(&dir)
        .map(|r| r.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    written.sort();
    println!(
        "custom_backend: answers match the reference; run on {}; kernels written to {}:",
        device.name(),
        dir.display()
    );
    for w in &written {
        println!("  {w}");
    }
    if written.iter().filter(|w| w.ends_with(".wgsl")).count() < 2 {
        eprintln!("custom_backend: expected the kernels of both graphs");
        std::process::exit(1);
    }
    Ok(())
}
