//! Eager autograd, PyTorch's familiar form: `requires_grad_`, `backward`, `grad`, `detach`, `no_grad`.
//! An eager op on a tensor that tracks gradients notes what it did (op, inputs and their values at that
//! moment) on its result. `backward` turns those notes into a graph, differentiates it with the same
//! reverse-mode pass `value_and_grad` uses ([`crate::autodiff::grad_graph`]), runs the joint graph
//! compiled and fused where the leaves live, and adds each gradient to its leaf's `.grad`. Inside a
//! compiled function, gradients come from `value_and_grad`, which joins the trace.

use crate::error::{Error, Result};
use crate::ir::{Graph, InputKind, Node, NodeId, Op};
use crate::loc::SourceLoc;
use crate::runtime::lock;
use crate::shape::Shape;
use crate::trace::Tensor;
use crate::value::Value;
use crate::DType;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;

/// A tensor's autograd state.
#[derive(Default)]
pub(crate) struct Autograd {
    /// A leaf whose gradient `backward` accumulates.
    requires_grad: bool,
    /// The accumulated gradient.
    grad: Option<Tensor>,
    /// How an eager op made this tensor from tracked inputs.
    made_by: Option<Arc<Step>>,
}

/// One eager op as `backward` replays it.
struct Step {
    op: Op,
    /// Each input and its value when the op ran (a weight reassigned since keeps its old value here).
    inputs: Vec<(Tensor, Option<Arc<Value>>)>,
    dtype: DType,
    shape: Shape,
    loc: SourceLoc,
}

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

fn tracks(t: &Tensor) -> bool {
    let a = lock(&t.cell.grad);
    a.requires_grad || a.made_by.is_some()
}

/// Whether an eager op on `inputs` must note itself for `backward`.
pub(crate) fn tracking(inputs: &[&Tensor]) -> bool {
    NO_GRAD.with(|n| n.get() == 0) && inputs.iter().any(|t| tracks(t))
}

/// Notes on `out` that `op` made it from `inputs`.
pub(crate) fn note(out: &Tensor, op: Op, inputs: &[&Tensor], dtype: DType, shape: Shape, loc: SourceLoc) {
    let inputs = inputs.iter().map(|t| ((*t).clone(), t.value())).collect();
    lock(&out.cell.grad).made_by = Some(Arc::new(Step { op, inputs, dtype, shape, loc }));
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

    /// The same value with no gradient history: ops on it are not differentiated.
    pub fn detach(&self) -> Tensor {
        match self.value() {
            Some(v) => Tensor::from_value(v),
            None => self.clone(),
        }
    }

    /// Differentiates this scalar with respect to every leaf it was computed from that
    /// [`requires_grad`](Tensor::requires_grad_), adding each gradient to the leaf's [`Tensor::grad`].
    /// The ops are replayed as one graph, differentiated and run compiled and fused on the leaves'
    /// device.
    #[track_caller]
    pub fn backward(&self) -> Result<()> {
        let loc = SourceLoc::caller();
        if self.is_traced() {
            return Err(unsupported(
                "backward() inside a compiled function: use value_and_grad there (or train::Trainer)",
                loc,
            ));
        }
        let numel: usize = self.shape().as_concrete().map_or(0, |d| d.iter().product());
        if numel != 1 {
            return Err(unsupported(
                format!("backward() of a tensor of shape {}: it needs one element", self.shape()),
                loc,
            ));
        }
        let (graph, args, leaves) = replay(self)?;
        if leaves.is_empty() {
            return Err(unsupported("backward() of a value no tensor with requires_grad contributed to", loc));
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
}

/// The graph that computes `root` from its recorded steps: every tensor without a step is an input
/// (argument `k`, its value in `args[k]`); `leaves` lists the inputs that require gradients.
#[allow(clippy::type_complexity)]
fn replay(root: &Tensor) -> Result<(Graph, Vec<Tensor>, Vec<(usize, Tensor)>)> {
    let mut graph = Graph::new();
    let mut args = Vec::new();
    let mut leaves = Vec::new();
    let mut node_of: HashMap<u64, NodeId> = HashMap::new();
    // Depth-first without recursion (a long training graph has thousands of steps): a tensor is pushed
    // again after its inputs, and emitted once they all have nodes.
    let mut stack: Vec<(Tensor, Option<Arc<Value>>, bool)> = vec![(root.clone(), root.value(), false)];
    while let Some((t, value, expanded)) = stack.pop() {
        if node_of.contains_key(&t.id()) {
            continue;
        }
        let step = lock(&t.cell.grad).made_by.clone();
        match step {
            Some(s) if !expanded => {
                stack.push((t.clone(), value, true));
                for (input, v) in s.inputs.iter().rev() {
                    stack.push((input.clone(), v.clone(), false));
                }
            }
            Some(s) => {
                let inputs = s.inputs.iter().map(|(i, _)| node_of[&i.id()]).collect();
                let n = graph.push(Node {
                    op: s.op.clone(),
                    inputs,
                    dtype: s.dtype,
                    shape: s.shape.clone(),
                    loc: s.loc.clone(),
                });
                node_of.insert(t.id(), n);
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
