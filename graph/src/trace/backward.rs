//! `loss.backward()` inside a compiled function: the gradients join the graph being traced.
//!
//! The trace's graph so far is replaced by its joint graph ([`crate::autodiff::joint_graph`]): its
//! forward decomposed, then the backward of the traced loss with respect to every lifted tensor that
//! requires gradients. The forward is not traced twice: every traced tensor the function still holds is
//! moved onto its node of the joint graph, so the values the user returns (the loss, the logits) and the
//! backward share one forward, and fusion and recomputation see both sides as one graph — the
//! AOTAutograd shape, reached from torch's familiar form.
//!
//! Each leaf's `.grad` becomes a traced gradient (added to the gradient it held, lifted in, as torch
//! accumulates), so the rest of the function (an optimizer's update, a clip) reads it like any traced
//! value. What the entry records ([`GradLeaf`]) lets a cached call write the same gradients back without
//! tracing: which leaves, whether each held a gradient when traced (a guard: a call where that differs
//! traces again), and which output each `.grad` ends as.
//!
//! A loss that depends on values with a gradient history of their own (made by eager ops, or by a graph
//! before a break in this call) is a graph break: the graph runs, and the eager backward (`tape`) replays
//! the whole history.

use super::{State, TraceState, Tracer};
use crate::error::{Error, Result};
use crate::ir::NodeId;
use crate::loc::SourceLoc;
use crate::runtime::lock;
use crate::trace::Tensor;
use std::collections::HashMap;

/// A leaf `backward()` gave a gradient inside a trace.
#[derive(Clone)]
pub(crate) struct GradLeaf {
    /// The tensor whose `.grad` the trace set.
    pub leaf: Tensor,
    /// Whether it held a gradient when the trace first added to it.
    pub had_grad: bool,
}

fn unsupported(what: impl Into<String>, loc: &SourceLoc) -> Error {
    Error::Unsupported { what: what.into(), loc: loc.clone() }
}

impl Tracer {
    /// `root.backward()` for a traced `root` (see the module docs).
    pub(crate) fn backward(&self, root: &Tensor, loc: &SourceLoc) -> Result<()> {
        let (wrt, leaves, history) = {
            let st = self.st.borrow();
            if st.read.len() != st.graph.inputs.len() {
                return Err(unsupported("backward() inside a function captured without data", loc));
            }
            let mut wrt = Vec::new();
            let mut leaves = Vec::new();
            let mut history = false;
            for (position, t) in st.read.iter().enumerate() {
                if t.requires_grad() {
                    wrt.push(position);
                    leaves.push(t.clone());
                } else {
                    history |= crate::tape::has_history(t);
                }
            }
            (wrt, leaves, history)
        };
        if history {
            self.graph_break(
                "backward() through values with a gradient history made outside this graph (by eager ops, or \
                 before a graph break)"
                    .into(),
                loc.clone(),
            )?;
            return crate::tape::backward_concrete(root, loc);
        }
        if leaves.is_empty() {
            return Err(unsupported("backward() of a value no tensor with requires_grad contributed to", loc));
        }
        let grads = self.join_backward(root, &wrt, loc)?;
        for (leaf, g) in leaves.iter().zip(grads) {
            let old = leaf.grad();
            {
                let mut st = self.st.borrow_mut();
                if !st.grads.iter().any(|l| l.leaf.id() == leaf.id()) {
                    st.grads.push(GradLeaf { leaf: leaf.clone(), had_grad: old.is_some() });
                }
                if let Some(o) = old.as_ref().filter(|o| o.value().is_some()) {
                    st.grad_sources.insert(o.id(), leaf.clone());
                }
            }
            let new = match old {
                Some(o) => crate::tape::no_grad(|| o.add(&g))?,
                None => g,
            };
            crate::tape::set_grad(leaf, Some(new));
        }
        Ok(())
    }

    /// Replaces the current graph by its joint graph for `root` with respect to the inputs at `wrt`,
    /// moves every live traced tensor onto its node there, and returns the gradients as traced tensors.
    fn join_backward(&self, root: &Tensor, wrt: &[usize], loc: &SourceLoc) -> Result<Vec<Tensor>> {
        let mut st = self.st.borrow_mut();
        let root_node = self.current_node(&st, root, loc)?;
        if st.stopped.contains(&root_node) {
            return Err(unsupported("backward() of a value computed under no_grad or detached", loc));
        }
        let live: Vec<(Tensor, NodeId)> = st
            .live
            .iter()
            .filter_map(|w| w.upgrade())
            .map(|cell| Tensor { cell })
            .filter_map(|t| self.current_node(&st, &t, loc).ok().map(|n| (t, n)))
            .collect();
        let mut forward = st.graph.clone();
        forward.outputs = std::iter::once(root_node).chain(live.iter().map(|(_, n)| *n)).collect();
        let joint = crate::autodiff::joint_graph(&forward, wrt, &st.stopped)?;
        st.partitions.push(joint.partition);
        let mut graph = joint.graph;
        let kept = &graph.outputs[1 + wrt.len()..];
        for ((t, _), &node) in live.iter().zip(kept) {
            if let State::Lazy { node: n, .. } = &mut *lock(&t.cell.state) {
                *n = node;
            }
        }
        // Inputs keep their positions; their nodes may move.
        let input_at: HashMap<NodeId, NodeId> =
            forward.inputs.iter().zip(&graph.inputs).map(|(old, new)| (old.node, new.node)).collect();
        for node in st.lifted.values_mut() {
            *node = input_at[node];
        }
        let grad_nodes = graph.outputs[1..=wrt.len()].to_vec();
        graph.outputs.clear();
        st.graph = graph;
        st.stopped = joint.stopped;
        Ok(grad_nodes.into_iter().map(|n| self.lazy(&mut st, n)).collect())
    }

    /// The node `t` stands for in the current graph.
    fn current_node(&self, st: &TraceState, t: &Tensor, loc: &SourceLoc) -> Result<NodeId> {
        match &*lock(&t.cell.state) {
            State::Lazy { trace, graph, node, .. } if *trace == self.id && *graph == st.graph_index => Ok(*node),
            _ => Err(unsupported("a traced tensor used outside the trace that made it", loc)),
        }
    }

    /// Notes what the partitioner chose for a backward joined to the current graph.
    pub(crate) fn note_partition(&self, p: crate::remat::Partition) {
        self.st.borrow_mut().partitions.push(p);
    }

    /// The leaves this trace gave gradients, each with the `.grad` it holds now.
    pub(crate) fn grad_leaves(&self) -> Vec<(GradLeaf, Option<Tensor>)> {
        self.st.borrow().grads.iter().map(|l| (l.clone(), l.leaf.grad())).collect()
    }

    /// The leaf whose gradient the lifted tensor `id` is (see `TraceState::grad_sources`).
    pub(crate) fn grad_source(&self, id: u64) -> Option<Tensor> {
        self.st.borrow().grad_sources.get(&id).cloned()
    }

    /// The position among the traced function's tensor arguments of the tensor `id`, if it is one.
    pub(crate) fn arg_index(&self, id: u64) -> Option<usize> {
        self.st.borrow().args.get(&id).copied()
    }
}
