//! The memory plan: which buffer each value lives in, and the launch order. Inputs and outputs get their
//! own buffers; an intermediate is allocated when its kernel writes it and freed after the last kernel
//! that reads it, and a freed buffer of the same (possibly symbolic) size serves the next intermediate.
//! The values of an assembled concatenation ([`crate::in_place`]) share one buffer, each at its offset,
//! alive from the first write of any of them to the last read of any.

use crate::dtype::DType;
use crate::in_place::Assembly;
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
    /// Values stored inside a buffer from an element offset other than 0 (the parts of an assembled
    /// concatenation): the offset, in elements of the value's dtype.
    #[serde(default)]
    pub value_offset: BTreeMap<NodeId, Expr>,
    /// Kernels before which the device waits for the collectives still running beside the kernels
    /// ([`Kernel::all_reduce`]: a bucket runs on a stream of its own from its launch on): the first
    /// reader of any of a bucket's results. A run also waits for all of them at its end.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub waits: std::collections::BTreeSet<usize>,
}

fn bytes(dtype: DType, len: &Expr) -> Expr {
    len.clone() * Expr::from(dtype.size_bytes())
}

/// Plans `kernels`, which run in the given order, over `graph`, with the values `assembly` places in
/// a shared buffer.
pub fn plan(graph: &Graph, kernels: &[Kernel], assembly: &Assembly) -> Plan {
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
    // A family lives until the last kernel touching any of its values.
    let mut family_until: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (k, kernel) in kernels.iter().enumerate() {
        for (root, _) in kernel.buffers.iter().filter_map(|b| assembly.home.get(&b.node)) {
            family_until.insert(*root, k);
        }
    }
    // A collective reads its inputs while the kernels after it run: they (or the assembled family an
    // input is part of) stay allocated until the kernel that waits for it, so no later kernel is
    // handed their memory before then.
    let waits = collective_waits(kernels);
    for (k, kernel) in kernels.iter().enumerate().filter(|(_, k)| k.all_reduce().is_some()) {
        let until = waits.range(k + 1..).next().copied().unwrap_or(last);
        for b in kernel.buffers.iter().filter(|b| b.access == Access::Read) {
            let l = last_read.entry(b.node).or_insert(until);
            *l = (*l).max(until);
            if let Some((root, _)) = assembly.home.get(&b.node) {
                let f = family_until.entry(*root).or_insert(until);
                *f = (*f).max(until);
            }
        }
    }
    let mut free: Vec<usize> = Vec::new();
    let mut reused = 0;
    let mut frees_after: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut value_offset = BTreeMap::new();
    for (k, kernel) in kernels.iter().enumerate() {
        for b in kernel.buffers.iter().filter(|b| b.access == Access::Write) {
            if value_buffer.contains_key(&b.node) {
                continue;
            }
            // A part of an assembled concatenation: its family's buffer, allocated at the first write.
            let (node, size) = match assembly.home.get(&b.node) {
                Some((root, _)) => {
                    let r = graph.node(*root);
                    (*root, bytes(r.dtype, &r.shape.numel()))
                }
                None => (b.node, bytes(b.dtype, &b.len)),
            };
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
            let until = match node == b.node {
                true => last_read.get(&b.node).copied().unwrap_or(k),
                false => family_until.get(&node).copied().unwrap_or(k),
            };
            if node == b.node {
                value_buffer.insert(b.node, buf);
            } else {
                for (n, (_, off)) in assembly.home.iter().filter(|(_, (root, _))| *root == node) {
                    value_buffer.insert(*n, buf);
                    if off.as_const() != Some(0) {
                        value_offset.insert(*n, off.clone());
                    }
                }
            }
            live[buf].1 = live[buf].1.max(until);
            frees_after.entry(until).or_default().push(buf);
        }
        if let Some(done) = frees_after.remove(&k) {
            free.extend(done);
        }
    }
    Plan { buffers, value_buffer, live, launches: (0..kernels.len()).collect(), reused, value_offset, waits }
}

/// Checks that no kernel reads a buffer it writes: each value a kernel reads lives in another plan
/// buffer than each value it writes (liveness frees a buffer only after its last reader, and
/// [`Assembly::conflict`] keeps apart a concatenation one kernel would bind written and read). WebGPU
/// rejects a dispatch that binds a buffer both ways, and the PTX lowering reads a kernel's inputs
/// through the read-only cache, whose contents must not change while the kernel runs. An `Err` names
/// the kernel and the value.
pub fn reads_disjoint_from_writes(kernels: &[Kernel], plan: &Plan) -> Result<(), String> {
    for kernel in kernels {
        let buffer = |b: &&crate::kernel::BufferParam| plan.value_buffer.get(&b.node).copied();
        let written: std::collections::BTreeSet<usize> =
            kernel.buffers.iter().filter(|b| b.access == Access::Write).filter_map(|b| buffer(&b)).collect();
        let mut reads = kernel.buffers.iter().filter(|b| b.access == Access::Read);
        if let Some(b) = reads.find(|b| buffer(b).is_some_and(|x| written.contains(&x))) {
            return Err(format!("kernel {} reads {} from a buffer it also writes", kernel.name, b.node));
        }
    }
    Ok(())
}

/// The first reader of each collective's results, where the device must wait for it (see
/// [`Plan::waits`]).
fn collective_waits(kernels: &[Kernel]) -> std::collections::BTreeSet<usize> {
    let mut waits = std::collections::BTreeSet::new();
    for (k, kernel) in kernels.iter().enumerate().filter(|(_, k)| k.all_reduce().is_some()) {
        let results: Vec<NodeId> =
            kernel.buffers.iter().filter(|b| b.access == Access::Write).map(|b| b.node).collect();
        let reader = (k + 1..kernels.len())
            .find(|&j| kernels[j].buffers.iter().any(|b| b.access == Access::Read && results.contains(&b.node)));
        waits.extend(reader);
    }
    waits
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{capture, compile_graph, DType, Target, TensorSpec};

    /// A planned graph passes; the same plan with a written value moved into the buffer of a value its
    /// kernel reads is refused, naming the kernel.
    #[test]
    fn a_kernel_never_reads_a_buffer_it_writes() {
        let g = capture(&[TensorSpec::new(DType::F32, &[64, 300])], |t| {
            Ok(vec![t[0].softmax(-1)?.exp()?.sum(&[0], false)?])
        })
        .unwrap();
        let c = compile_graph(&g, &Target::cuda(90)).unwrap();
        reads_disjoint_from_writes(&c.kernels, &c.plan).unwrap();
        let k = &c.kernels[0];
        let read = k.buffers.iter().find(|b| b.access == Access::Read).unwrap().node;
        let written = k.buffers.iter().find(|b| b.access == Access::Write).unwrap().node;
        let mut bad = c.plan.clone();
        bad.value_buffer.insert(written, bad.value_buffer[&read]);
        let e = reads_disjoint_from_writes(&c.kernels, &bad).unwrap_err();
        assert!(e.contains(&k.name) && e.contains("reads"), "{e}");
    }
}
