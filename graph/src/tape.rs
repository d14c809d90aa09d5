//! Eager autograd, PyTorch's familiar form: `requires_grad_`, `backward`, `grad`, `detach`, `no_grad`.
//! Every graph kiln runs on tensors that track gradients — an eager op's one-node graph, a compiled
//! function's graph, each graph of a trace split by graph breaks — notes itself (the graph, its input
//! tensors and their values at that moment) on its results. `backward` splices those graphs into one,
//! differentiates it with the reverse-mode pass `value_and_grad` uses ([`crate::autodiff::grad_graph`]),
//! runs the joint graph compiled and fused where the leaves live, and adds each gradient to its leaf's
//! `.grad`. So `loss = compiled_model.call(x)?; loss.backward()?` works as in torch, across graph breaks.
//! Inside a compiled function `backward()` joins the trace (`trace::backward`), as `value_and_grad` does.

use crate::error::{Error, Result};
use crate::ir::{Graph, InputKind, Node, NodeId, Op};
use crate::loc::SourceLoc;
use crate::runtime::lock;
use crate::trace::{Tensor, TensorCell};
use crate::value::Value;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A tensor's autograd state.
#[derive(Default)]
pub(crate) struct Autograd {
    /// A leaf whose gradient `backward` accumulates.
    requires_grad: bool,
    /// The accumulated gradient.
    grad: Option<Tensor>,
    /// The graph run that made this tensor from tracked inputs, and which of its nodes it is.
    made_by: Option<(Arc<Step>, NodeId)>,
}

/// One graph run as `backward` replays it.
pub(crate) struct Step {
    graph: Arc<Graph>,
    /// The tensor behind each of the graph's inputs (in `Graph::inputs` order) and its value when the
    /// graph ran (a weight reassigned since keeps its old value here).
    inputs: Vec<(Tensor, Arc<Value>)>,
}

/// A long history (a training loop's eager ops, each step's result feeding the next) is a chain of
/// steps; dropping it must not recurse once per step, or the stack overflows. Whatever this step alone
/// holds is taken apart here, in a loop.
impl Drop for Step {
    fn drop(&mut self) {
        let mut pending: Vec<Tensor> = self.inputs.drain(..).map(|(t, _)| t).collect();
        while let Some(t) = pending.pop() {
            if Arc::strong_count(&t.cell) != 1 {
                continue;
            }
            let made_by = lock(&t.cell.grad).made_by.take();
            if let Some(Ok(mut step)) = made_by.map(|(s, _)| Arc::try_unwrap(s)) {
                pending.extend(step.inputs.drain(..).map(|(t, _)| t));
            }
        }
    }
}

/// Set once any tensor has asked for gradients: until then no run looks at its inputs' autograd state
/// (a compiled call with hundreds of weight inputs pays nothing for autograd it does not use).
static EVER: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// How many `no_grad` scopes are open on this thread.
    static NO_GRAD: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` without recording anything for gradients (evaluation, optimizer updates), as
/// `torch.no_grad()`.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Open;
    impl Drop for Open {
        fn drop(&mut self) {
            NO_GRAD.with(|n| n.set(n.get() - 1));
        }
    }
    NO_GRAD.with(|n| n.set(n.get() + 1));
    let _open = Open;
    f()
}

/// Whether a `no_grad` scope is open on this thread (a traced op recorded now is not differentiated).
pub(crate) fn grad_disabled() -> bool {
    NO_GRAD.with(|n| n.get() > 0)
}

/// Whether `t` was made from tracked tensors (not a leaf): gradients flow on through its history.
pub(crate) fn has_history(t: &Tensor) -> bool {
    lock(&t.cell.grad).made_by.is_some()
}

/// Sets `leaf`'s accumulated gradient (a trace's `backward()`, a cached call writing its gradients back).
pub(crate) fn set_grad(leaf: &Tensor, grad: Option<Tensor>) {
    lock(&leaf.cell.grad).grad = grad;
}

fn tracks(t: &Tensor) -> bool {
    let a = lock(&t.cell.grad);
    a.requires_grad || a.made_by.is_some()
}

/// Whether a run on `inputs` must note itself for `backward`.
pub(crate) fn tracking<'a>(inputs: impl IntoIterator<Item = &'a Tensor>) -> bool {
    EVER.load(Ordering::Relaxed) && NO_GRAD.with(|n| n.get() == 0) && inputs.into_iter().any(tracks)
}

/// A run of `graph` on `inputs` (one per graph input, with the values it read), to note on its results.
pub(crate) fn step(graph: Arc<Graph>, inputs: &[Tensor], values: &[Arc<Value>]) -> Arc<Step> {
    Arc::new(Step { graph, inputs: inputs.iter().cloned().zip(values.iter().cloned()).collect() })
}

/// Notes on `cell` that it is `node` of `step`'s run.
pub(crate) fn note(cell: &TensorCell, step: &Arc<Step>, node: NodeId) {
    lock(&cell.grad).made_by = Some((step.clone(), node));
}

fn unsupported(what: impl Into<String>, loc: SourceLoc) -> Error {
    Error::Unsupported { what: what.into(), loc }
}

impl Tensor {
    /// Marks this concrete tensor as a leaf whose gradient [`Tensor::backward`] accumulates in
    /// [`Tensor::grad`] (or stops marking it). Returns the tensor, for chaining.
    #[track_caller]
    pub fn requires_grad_(self, on: bool) -> Result<Tensor> {
        if self.is_traced() {
            return Err(unsupported(
                "requires_grad on a traced tensor: inside a compiled function, use value_and_grad",
                SourceLoc::caller(),
            ));
        }
        if on {
            EVER.store(true, Ordering::Relaxed);
        }
        lock(&self.cell.grad).requires_grad = on;
        Ok(self)
    }

    /// Whether this is a leaf that accumulates gradients.
    pub fn requires_grad(&self) -> bool {
        lock(&self.cell.grad).requires_grad
    }

    /// The gradient [`Tensor::backward`] accumulated here, if any.
    pub fn grad(&self) -> Option<Tensor> {
        lock(&self.cell.grad).grad.clone()
    }

    /// Forgets the accumulated gradient (torch's `zero_grad(set_to_none=True)`).
    pub fn zero_grad(&self) {
        lock(&self.cell.grad).grad = None;
    }

    /// The same value with no gradient history: ops on it are not differentiated. Traced, it is a view of
    /// the value that a `backward()` in the trace does not differentiate through.
    #[track_caller]
    pub fn detach(&self) -> Tensor {
        match self.value() {
            Some(v) => Tensor::from_value(v),
            None => {
                no_grad(|| crate::trace::record(Op::Reshape, &[self], self.dtype(), self.shape(), SourceLoc::caller()))
                    .unwrap_or_else(|_| self.clone())
            }
        }
    }

    /// Differentiates this scalar with respect to every leaf it was computed from that
    /// [`requires_grad`](Tensor::requires_grad_), adding each gradient to the leaf's [`Tensor::grad`].
    /// The ops are replayed as one graph, differentiated and run compiled and fused on the leaves'
    /// device.
    ///
    /// Inside a compiled function the backward joins the graph being traced (one graph, forward and
    /// backward fused together), each leaf's `.grad` is a traced value the rest of the function can read,
    /// and every call of the compiled function, traced or cached, leaves the gradients in `.grad` as an
    /// eager call would.
    #[track_caller]
    pub fn backward(&self) -> Result<()> {
        let loc = SourceLoc::caller();
        let numel: Option<usize> = self.shape().as_concrete().map(|d| d.iter().product());
        if numel != Some(1) {
            return Err(unsupported(
                format!("backward() of a tensor of shape {}: it needs one element", self.shape()),
                loc,
            ));
        }
        if self.is_traced() {
            let tracer = crate::trace::active()
                .ok_or_else(|| unsupported("backward() of a traced tensor after its trace ended", loc.clone()))?;
            return tracer.backward(self, &loc);
        }
        backward_concrete(self, &loc)
    }
}

/// [`Tensor::backward`] of a concrete scalar: its recorded history replayed as one graph and
/// differentiated.
pub(crate) fn backward_concrete(root: &Tensor, loc: &SourceLoc) -> Result<()> {
    let (graph, args, leaves) = replay(root)?;
    if leaves.is_empty() {
        return Err(unsupported("backward() of a value no tensor with requires_grad contributed to", loc.clone()));
    }
    let wrt: Vec<usize> = leaves.iter().map(|(i, _)| *i).collect();
    let joint = crate::autodiff::grad_graph(&graph, &wrt)?;
    let outs = crate::autodiff::run_joint(&joint, &args)?;
    no_grad(|| {
        for ((_, leaf), g) in leaves.iter().zip(&outs[1..]) {
            let old = lock(&leaf.cell.grad).grad.take();
            let new = match old {
                Some(o) => o.add(g)?,
                None => g.clone(),
            };
            lock(&leaf.cell.grad).grad = Some(new);
        }
        Ok(())
    })
}

/// The graph that computes `root` from the runs noted on it: every tensor no tracked run made is an
/// input (argument `k`, its value in `args[k]`); `leaves` lists the inputs that require gradients.
#[allow(clippy::type_complexity)]
fn replay(root: &Tensor) -> Result<(Graph, Vec<Tensor>, Vec<(usize, Tensor)>)> {
    let mut graph = Graph::new();
    let mut args = Vec::new();
    let mut leaves = Vec::new();
    let mut node_of: HashMap<u64, NodeId> = HashMap::new();
    // Each run's graph is spliced in once; its node ids map to the combined graph's.
    let mut spliced: HashMap<*const Step, Vec<NodeId>> = HashMap::new();
    // Depth-first without recursion (a long training graph has thousands of runs): a tensor is pushed
    // again after its run's inputs, and given its node once they all have theirs.
    let mut stack: Vec<(Tensor, Option<Arc<Value>>, bool)> = vec![(root.clone(), root.value(), false)];
    while let Some((t, value, expanded)) = stack.pop() {
        if node_of.contains_key(&t.id()) {
            continue;
        }
        let made_by = lock(&t.cell.grad).made_by.clone();
        match made_by {
            Some((s, _)) if !expanded => {
                stack.push((t.clone(), value, true));
                for (input, v) in s.inputs.iter().rev() {
                    stack.push((input.clone(), Some(v.clone()), false));
                }
            }
            Some((s, node)) => {
                let ids = match spliced.entry(Arc::as_ptr(&s)) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(splice(&mut graph, &s, &node_of)?),
                };
                node_of.insert(t.id(), ids[node.index()]);
            }
            None => {
                let v =
                    value.ok_or_else(|| unsupported("backward() through a traced tensor", SourceLoc::internal()))?;
                let index = args.len();
                let n = graph.add_input(v.dtype(), v.shape(), InputKind::Arg { index }, SourceLoc::internal());
                node_of.insert(t.id(), n);
                if t.requires_grad() {
                    leaves.push((index, t.clone()));
                }
                args.push(Tensor::from_value(v));
            }
        }
    }
    graph.outputs = vec![node_of[&root.id()]];
    Ok((graph, args, leaves))
}

/// Copies `step`'s graph into `graph`, its inputs bound to the nodes of the tensors it read; returns
/// each of its node ids' new id.
fn splice(graph: &mut Graph, step: &Step, node_of: &HashMap<u64, NodeId>) -> Result<Vec<NodeId>> {
    let g = &step.graph;
    if g.nodes.iter().any(|n| n.shape.as_concrete().is_none()) {
        return Err(unsupported(
            "backward() through a graph compiled with dynamic shapes: compile it with Dynamic::Never",
            g.outputs.first().map_or_else(SourceLoc::internal, |o| g.node(*o).loc.clone()),
        ));
    }
    let mut ids = Vec::with_capacity(g.nodes.len());
    for (i, n) in g.nodes.iter().enumerate() {
        let id = match n.op {
            Op::Input { .. } => {
                let k = g.inputs.iter().position(|gi| gi.node.index() == i).expect("an input node is a graph input");
                node_of[&step.inputs[k].0.id()]
            }
            _ => graph.push(Node {
                op: n.op.clone(),
                inputs: n.inputs.iter().map(|a| ids[a.index()]).collect(),
                dtype: n.dtype,
                shape: n.shape.clone(),
                loc: n.loc.clone(),
            }),
        };
        ids.push(id);
    }
    Ok(ids)
}
