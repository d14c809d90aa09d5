//! A device as the bench drives it: kiln's runtime core over one driver. Prepare a compiled graph once,
//! launch it again and again, time a launch the best way the device has.

use kiln_graph::runtime::Prepared;
use kiln_graph::{Backend, CompiledGraph, Result, Runtime, Target, TensorData};
use std::sync::Arc;

/// A device runtime under measurement.
pub struct Device {
    /// The runtime core.
    pub rt: Arc<Runtime>,
}

impl Device {
    /// Backend name in the report (`wgpu`, `cuda`).
    pub fn name(&self) -> &'static str {
        self.rt.name()
    }

    /// The target kernels are compiled for.
    pub fn target(&self) -> &Target {
        self.rt.target()
    }

    /// The backend, for the correctness check and the public-call row through `kiln::compile`.
    pub fn backend(&self) -> Arc<dyn Backend> {
        self.rt.clone()
    }

    /// Forgets loaded modules (cold compiles).
    pub fn clear(&self) {
        self.rt.clear_modules();
    }

    /// Binds a compiled graph to memory, its inputs uploaded first.
    pub fn prepare(&self, c: &Arc<CompiledGraph>, inputs: &[&TensorData]) -> Result<Prepared> {
        let devs = inputs.iter().map(|d| self.rt.upload(d)).collect::<Result<Vec<_>>>()?;
        self.rt.prepare(c, &devs)
    }

    /// Records a prepared run for replay (a CUDA graph); `false` where the device has none.
    pub fn capture(&self, run: &mut Prepared) -> Result<bool> {
        self.rt.record(run)
    }

    /// Device bytes at their most since the last reset: the runtime's buffers and the driver's scratch
    /// (cuBLAS's workspace, which torch's allocator counts too).
    pub fn peak(&self) -> u64 {
        let m = self.rt.memory_stats();
        m.peak + m.scratch
    }

    /// Enqueues one run.
    pub fn launch(&self, run: &Prepared) -> Result<()> {
        self.rt.launch(run).map(drop)
    }

    /// Waits for everything enqueued (and reports failed run-time checks).
    pub fn wait(&self) -> Result<()> {
        self.rt.synchronize()
    }

    /// How one timed sample is taken.
    pub fn timing(&self) -> &'static str {
        self.rt.driver().timing()
    }

    /// GB/s of the device's own copy of `bytes` (no kiln kernel), where it times itself.
    pub fn native_copy_gbps(&self, bytes: usize, repeat: usize) -> Result<Option<f64>> {
        self.rt.copy_rate(bytes as u64, repeat)
    }

    /// Milliseconds each kernel of one run took, in launch order, where the device times itself.
    pub fn profile(&self, run: &Prepared) -> Result<Option<Vec<kiln_graph::runtime::LaunchTime>>> {
        self.rt.profile(run)
    }
}
