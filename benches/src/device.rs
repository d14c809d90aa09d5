//! The two GPU runtimes as the bench drives them: prepare a compiled graph once, launch it again and
//! again, time a launch the best way the runtime has. One trait, so the measuring code is written once.

use kiln_graph::{Backend, CompiledGraph, Result, Target, TensorData};
use std::rc::Rc;
use std::time::Instant;

/// A device runtime under measurement.
pub trait Device {
    /// A compiled graph bound to device memory.
    type Run;
    /// Backend name in the report (`wgpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// The target kernels are compiled for.
    fn target(&self) -> &Target;
    /// The backend, for the correctness check through `kiln::compile`.
    fn backend(&self) -> Rc<dyn Backend>;
    /// Forgets compiled pipelines/modules (cold compiles).
    fn clear(&self);
    /// Binds a compiled graph to memory and uploads its inputs.
    fn prepare(&self, c: &CompiledGraph, inputs: &[&TensorData]) -> Result<Self::Run>;
    /// Turns a prepared run into its reduce-overhead form (a CUDA graph); `false` where the runtime has
    /// none beyond what `prepare` already did.
    fn capture(&self, run: &mut Self::Run) -> Result<bool>;
    /// Kernel launches per run.
    fn launches(&self, run: &Self::Run) -> usize;
    /// `(io_bytes, traffic_bytes)` of a run.
    fn bytes(&self, run: &Self::Run) -> (u64, u64);
    /// Enqueues one run.
    fn launch(&self, run: &Self::Run) -> Result<()>;
    /// Waits for everything enqueued.
    fn wait(&self) -> Result<()>;
    /// How one timed sample is taken.
    fn timing(&self) -> &'static str {
        "fenced wall time"
    }
    /// GB/s of the runtime's own device-to-device copy of `bytes` (the driver's memcpy), where it has one
    /// that is not a kiln kernel.
    fn native_copy_gbps(&self, _bytes: usize, _repeat: usize) -> Result<Option<f64>> {
        Ok(None)
    }
    /// Milliseconds each kernel of one run took, in launch order, where the device can say.
    fn profile(&self, _run: &Self::Run) -> Result<Option<Vec<(String, f64)>>> {
        Ok(None)
    }
    /// Seconds one launch takes, as `timing` says (default: launch, wait, wall clock).
    fn sample(&self, run: &Self::Run) -> Result<f64> {
        wall_time(self, run)
    }
}

/// Seconds from enqueueing one launch to the device having finished it.
fn wall_time<D: Device + ?Sized>(dev: &D, run: &D::Run) -> Result<f64> {
    let t = Instant::now();
    dev.launch(run)?;
    dev.wait()?;
    Ok(t.elapsed().as_secs_f64())
}

impl Device for kiln_wgsl::WgpuBackend {
    type Run = kiln_wgsl::Prepared;
    fn name(&self) -> &'static str {
        "wgpu"
    }
    fn target(&self) -> &Target {
        self.gpu().target()
    }
    fn backend(&self) -> Rc<dyn Backend> {
        Rc::new(self.clone())
    }
    fn clear(&self) {
        self.gpu().clear_pipelines();
    }
    fn prepare(&self, c: &CompiledGraph, inputs: &[&TensorData]) -> Result<Self::Run> {
        pollster::block_on(self.gpu().prepare(c, inputs))
    }
    fn capture(&self, _: &mut Self::Run) -> Result<bool> {
        Ok(false)
    }
    fn launches(&self, run: &Self::Run) -> usize {
        run.launches()
    }
    fn bytes(&self, run: &Self::Run) -> (u64, u64) {
        (run.io_bytes, run.bytes_moved)
    }
    fn launch(&self, run: &Self::Run) -> Result<()> {
        self.gpu().launch(run);
        Ok(())
    }
    fn wait(&self) -> Result<()> {
        self.gpu().wait()
    }
    fn timing(&self) -> &'static str {
        if self.gpu().has_timestamps() {
            "timestamp queries"
        } else {
            "fenced wall time"
        }
    }
    fn sample(&self, run: &Self::Run) -> Result<f64> {
        match self.gpu().time_launch(run)? {
            Some(s) => Ok(s),
            None => wall_time(self, run),
        }
    }
}

impl Device for kiln_ptx::CudaBackend {
    type Run = kiln_ptx::Prepared;
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn target(&self) -> &Target {
        self.cuda().target()
    }
    fn backend(&self) -> Rc<dyn Backend> {
        Rc::new(self.clone())
    }
    fn clear(&self) {
        self.cuda().clear_modules();
    }
    fn prepare(&self, c: &CompiledGraph, inputs: &[&TensorData]) -> Result<Self::Run> {
        self.cuda().prepare(c, inputs)
    }
    fn capture(&self, run: &mut Self::Run) -> Result<bool> {
        self.cuda().capture(run)?;
        Ok(true)
    }
    fn launches(&self, run: &Self::Run) -> usize {
        run.launches()
    }
    fn bytes(&self, run: &Self::Run) -> (u64, u64) {
        (run.io_bytes, run.bytes_moved)
    }
    fn launch(&self, run: &Self::Run) -> Result<()> {
        self.cuda().launch(run)
    }
    fn wait(&self) -> Result<()> {
        self.cuda().wait()
    }
    fn timing(&self) -> &'static str {
        "CUDA events"
    }
    fn sample(&self, run: &Self::Run) -> Result<f64> {
        self.cuda().time_launch(run)
    }
    fn profile(&self, run: &Self::Run) -> Result<Option<Vec<(String, f64)>>> {
        self.cuda().profile(run).map(Some)
    }
    fn native_copy_gbps(&self, bytes: usize, repeat: usize) -> Result<Option<f64>> {
        self.cuda().memcpy_gbps(bytes, repeat).map(Some)
    }
}
