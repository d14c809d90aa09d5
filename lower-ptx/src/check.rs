//! A backend for tests without a GPU: every kernel is rendered to PTX for sm_80 and sm_90 and assembled by
//! ptxas, then the graph runs on the CPU kernel interpreter. The conformance suite, instantiated with it,
//! checks that every kernel the suite produces is valid PTX.

use crate::ptxas::{assemble, find, INSTALL_HINT};
use crate::render::render;
use kiln_graph::{Backend, CompiledGraph, Error, Result, Target, TensorData};
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::path::PathBuf;

/// Renders and assembles every kernel it is given, then interprets the graph.
pub struct PtxasChecked {
    target: Target,
    ptxas: PathBuf,
    seen: RefCell<HashSet<String>>,
    assembled: Cell<usize>,
}

impl PtxasChecked {
    /// Finds ptxas or says how to install it.
    pub fn new() -> Result<Self> {
        let ptxas = find().ok_or_else(|| Error::Backend { backend: "ptx".into(), msg: INSTALL_HINT.into() })?;
        Ok(PtxasChecked {
            target: Target::cuda(90),
            ptxas,
            seen: RefCell::new(HashSet::new()),
            assembled: Cell::new(0),
        })
    }

    /// Distinct kernels assembled so far (each for sm_80 and sm_90).
    pub fn assembled(&self) -> usize {
        self.assembled.get()
    }

    /// Renders and assembles the kernels of a compiled graph.
    pub fn check(&self, compiled: &CompiledGraph) -> Result<()> {
        // Library GEMMs are runtime calls: there is no PTX to assemble.
        for k in compiled.kernels.iter().filter(|k| k.gemm().is_none()) {
            for sm in [80, 90] {
                let ptx = render(k, sm).map_err(|e| Error::Backend { backend: "ptx".into(), msg: e.to_string() })?;
                let body = ptx.source.replace(&k.name, "kernel");
                if !self.seen.borrow_mut().insert(body) {
                    continue;
                }
                assemble(&self.ptxas, &k.name, &ptx.source, sm)
                    .map_err(|msg| Error::Backend { backend: "ptx".into(), msg })?;
                self.assembled.set(self.assembled.get() + 1);
            }
        }
        Ok(())
    }
}

impl Backend for PtxasChecked {
    fn name(&self) -> &str {
        "ptxas-checked"
    }

    fn target(&self) -> Option<&Target> {
        Some(&self.target)
    }

    fn run_compiled(&self, compiled: &CompiledGraph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        self.check(compiled)?;
        compiled.run_interpreted(inputs)
    }
}
