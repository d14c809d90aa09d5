//! The memory plan: which buffer each value lives in, and the launch order. Inputs and outputs get their
//! own buffers; an intermediate is allocated when its kernel writes it and freed after the last kernel
//! that reads it, and a freed buffer of the same (possibly symbolic) size serves the next intermediate.

use crate::dtype::DType;
use crate::ir::{Graph, NodeId};
use crate::kernel::{Access, Kernel};
use crate::sym::{Bindings, Expr, SymError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a value is to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueRole {
    /// Graph input `i`.
    Input(usize),
    /// Graph output `i`.
    Output(usize),
    /// Lives only between kernels.
    Intermediate,
}

/// One physical buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanBuffer {
    /// Size in bytes (symbolic when shapes are).
    pub bytes: Expr,
    /// Role of the first value placed in it.
    pub role: ValueRole,
}

/// Buffers and launch order for a list of kernels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Physical buffers.
    pub buffers: Vec<PlanBuffer>,
    /// The buffer each value (input or stored node) lives in.
    pub value_buffer: BTreeMap<NodeId, usize>,
    /// `(alive from kernel, alive through kernel)` for every buffer, for peak-memory accounting.
    pub live: Vec<(usize, usize)>,
    /// Kernels in launch order (indices into the kernel list).
    pub launches: Vec<usize>,
    /// Intermediates placed in a buffer freed by an earlier one.
    pub reused: usize,
}

fn bytes(dtype: DType, len: &Expr) -> Expr {
    len.clone() * Expr::from(dtype.size_bytes())
}

/// Plans `kernels`, which run in the given order, over `graph`.
pub fn plan(graph: &Graph, kernels: &[Kernel]) -> Plan {
    let mut buffers = Vec::new();
    let mut live = Vec::new();
    let mut value_buffer = BTreeMap::new();
    let last = kernels.len().saturating_sub(1);
    for (i, gi) in graph.inputs.iter().enumerate() {
        let n = graph.node(gi.node);
        value_buffer.insert(gi.node, buffers.len());
        buffers.push(PlanBuffer { bytes: bytes(n.dtype, &n.shape.numel()), role: ValueRole::Input(i) });
        live.push((0, last));
    }
    // Last kernel reading each value.
    let mut last_read: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (k, kernel) in kernels.iter().enumerate() {
        for b in kernel.buffers.iter().filter(|b| b.access == Access::Read) {
            last_read.insert(b.node, k);
        }
    }
    let mut free: Vec<usize> = Vec::new();
    let mut reused = 0;
    let mut frees_after: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (k, kernel) in kernels.iter().enumerate() {
        for b in kernel.buffers.iter().filter(|b| b.access == Access::Write) {
            if value_buffer.contains_key(&b.node) {
                continue;
            }
            let size = bytes(b.dtype, &b.len);
            if let Some(o) = graph.outputs.iter().position(|&o| o == b.node) {
                value_buffer.insert(b.node, buffers.len());
                buffers.push(PlanBuffer { bytes: size, role: ValueRole::Output(o) });
                live.push((k, last));
                continue;
            }
            let slot = free.iter().position(|&f| buffers[f].bytes == size).map(|p| free.swap_remove(p));
            let buf = match slot {
                Some(f) => {
                    reused += 1;
                    f
                }
                None => {
                    buffers.push(PlanBuffer { bytes: size, role: ValueRole::Intermediate });
                    live.push((k, k));
                    buffers.len() - 1
                }
            };
            value_buffer.insert(b.node, buf);
            let until = last_read.get(&b.node).copied().unwrap_or(k);
            live[buf].1 = live[buf].1.max(until);
            frees_after.entry(until).or_default().push(buf);
        }
        if let Some(done) = frees_after.remove(&k) {
            free.extend(done);
        }
    }
    Plan { buffers, value_buffer, live, launches: (0..kernels.len()).collect(), reused }
}

impl Plan {
    /// Bytes allocated at the busiest kernel, under symbol values.
    pub fn peak_bytes(&self, bindings: &Bindings) -> Result<u64, SymError> {
        let steps = self.launches.len().max(1);
        let mut peak = 0u64;
        for k in 0..steps {
            let mut total = 0u64;
            for (b, &(from, to)) in self.buffers.iter().zip(&self.live) {
                if from <= k && k <= to {
                    total += b.bytes.eval(bindings)?.max(0) as u64;
                }
            }
            peak = peak.max(total);
        }
        Ok(peak)
    }
}
