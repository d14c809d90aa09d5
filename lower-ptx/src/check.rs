//! A device for tests without a GPU: every kernel it loads is rendered to PTX for sm_80 and sm_90 and
//! assembled by ptxas, then run by the CPU kernel interpreter. The conformance suite, instantiated with
//! it, checks that every kernel the suite produces is valid PTX — through the same runtime core as CUDA.

use crate::ptxas::{assemble, find, INSTALL_HINT};
use crate::render::render;
use kiln_graph::device::{Driver, Launch, Module, Raw};
use kiln_graph::kernel::Kernel;
use kiln_graph::runtime::Runtime;
use kiln_graph::{Error, KernelInterpreter, Result, Target};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Renders and assembles every kernel it loads, then interprets it.
pub struct PtxasChecked {
    interpreter: KernelInterpreter,
    ptxas: PathBuf,
    seen: Mutex<HashSet<String>>,
    assembled: AtomicUsize,
}

impl PtxasChecked {
    /// Finds ptxas or says how to install it.
    pub fn new() -> Result<Self> {
        PtxasChecked::with_target(Target::cuda(90))
    }

    /// [`PtxasChecked::new`] compiling for `target` (a CUDA target with other schedules than the
    /// default's, such as the matmul template's two stages).
    pub fn with_target(target: Target) -> Result<Self> {
        let ptxas = find().ok_or_else(|| Error::Backend { backend: "ptx".into(), msg: INSTALL_HINT.into() })?;
        Ok(PtxasChecked {
            interpreter: KernelInterpreter::new(target),
            ptxas,
            seen: Mutex::default(),
            assembled: AtomicUsize::new(0),
        })
    }

    /// A runtime over this checking device.
    pub fn runtime() -> Result<Arc<Runtime>> {
        Ok(Runtime::new(PtxasChecked::new()?))
    }

    /// Distinct kernels assembled so far (each for sm_80 and sm_90).
    pub fn assembled(&self) -> usize {
        self.assembled.load(Ordering::Relaxed)
    }

    /// Renders and assembles one kernel for sm_80 and sm_90 (library GEMMs are runtime calls: no PTX).
    pub fn check(&self, k: &Kernel) -> Result<()> {
        if k.gemm().is_some() {
            return Ok(());
        }
        for sm in [80, 90] {
            let ptx = render(k, sm).map_err(|e| Error::Backend { backend: "ptx".into(), msg: e.to_string() })?;
            let body = ptx.source.replace(&k.name, "kernel");
            if !self.seen.lock().unwrap_or_else(|e| e.into_inner()).insert(body) {
                continue;
            }
            assemble(&self.ptxas, &k.name, &ptx.source, sm)
                .map_err(|msg| Error::Backend { backend: "ptx".into(), msg })?;
            self.assembled.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Driver for PtxasChecked {
    fn name(&self) -> &'static str {
        "ptxas-checked"
    }
    fn target(&self) -> &Target {
        self.interpreter.target()
    }
    fn describe(&self) -> String {
        format!("ptxas ({}) over {}", self.ptxas.display(), self.interpreter.describe())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn alloc(&self, bytes: u64) -> Result<Raw> {
        self.interpreter.alloc(bytes)
    }
    fn write(&self, dst: &Raw, bytes: &[u8]) -> Result<()> {
        self.interpreter.write(dst, bytes)
    }
    fn read(&self, src: &Raw, bytes: u64) -> Result<Vec<u8>> {
        self.interpreter.read(src, bytes)
    }
    fn zero(&self, dst: &Raw, offset: u64, bytes: u64) -> Result<()> {
        self.interpreter.zero(dst, offset, bytes)
    }
    fn copy(&self, src: &Raw, dst: &Raw, bytes: u64) -> Result<()> {
        self.interpreter.copy(src, dst, bytes)
    }
    fn load(&self, kernel: &Kernel) -> Result<Module> {
        self.check(kernel)?;
        self.interpreter.load(kernel)
    }
    fn launch(&self, kernel: &Kernel, launch: &Launch) -> Result<()> {
        self.interpreter.launch(kernel, launch)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
