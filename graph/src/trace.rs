//! Capture: `Tensor` is a handle that either holds concrete data or names a node in the graph being traced.
//!
//! Every op goes through [`record`]. Under `compile` it appends a node to the active tracer's graph;
//! outside it (eager mode) it builds a one-node graph and runs it at once, so eager and compiled execution
//! share one path. A host read of a traced value is a *graph break*: the graph so far runs with every
//! still-live traced tensor as an output, those tensors become concrete, and tracing continues in a fresh
//! graph that lifts them back in as inputs. Concrete tensors read by a traced function are always lifted
//! into graph inputs (never baked in as constants), which is how weights work.

use crate::backend::{Backend, CpuReference};
use crate::data::TensorData;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{Graph, InputKind, Node, NodeId, Op};
use crate::loc::SourceLoc;
use crate::pipeline::CompiledGraph;
use crate::runtime::lock;
use crate::shape::Shape;
use crate::value::Value;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

mod assign;
mod backward;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

thread_local! {
    static ACTIVE: RefCell<Option<Rc<Tracer>>> = const { RefCell::new(None) };
    /// Where eager ops (outside any trace) run; the CPU reference unless set.
    static EAGER: RefCell<Option<Arc<dyn Backend>>> = const { RefCell::new(None) };
}

/// Makes eager ops on this thread run on `backend`: each op becomes its own kernel through the same
/// pipeline and runtime as compiled code (the baseline torch calls eager mode). `None` restores the
/// default: an op runs on the device its inputs live on, and on the CPU reference when they are all on
/// the host. On a device backend, eager results stay on the device until read.
pub fn set_eager_backend(backend: Option<Arc<dyn Backend>>) {
    EAGER.with(|e| *e.borrow_mut() = backend);
}

/// A tensor: concrete data, or a value in the graph being traced.
///
/// Cloning is cheap (a shared handle). Tensors are `Send + Sync`: a concrete tensor may be used from any
/// thread; tracing is per thread (each thread traces its own calls), as in PyTorch.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) cell: Arc<TensorCell>,
}

pub(crate) struct TensorCell {
    id: u64,
    state: Mutex<State>,
    /// Gradient bookkeeping of eager autograd ([`crate::tape`]).
    pub(crate) grad: Mutex<crate::tape::Autograd>,
}

enum State {
    Concrete {
        data: Arc<Value>,
        /// `(trace id, graph index)` when an earlier graph of a trace computed it.
        carried_from: Option<(u64, usize)>,
    },
    Lazy {
        trace: u64,
        graph: usize,
        node: NodeId,
        dtype: DType,
        shape: Shape,
    },
}

impl Tensor {
    /// Wraps concrete host data.
    pub fn from_data(data: TensorData) -> Tensor {
        Self::concrete(Value::from_host(Arc::new(data)), None)
    }

    /// Wraps a concrete value (host or device; no copy).
    pub fn from_value(value: Arc<Value>) -> Tensor {
        Self::concrete(value, None)
    }

    fn concrete(data: Arc<Value>, carried_from: Option<(u64, usize)>) -> Tensor {
        Tensor {
            cell: Arc::new(TensorCell {
                id: next_id(),
                state: Mutex::new(State::Concrete { data, carried_from }),
                grad: Mutex::default(),
            }),
        }
    }

    /// The concrete value, or `None` while traced.
    pub fn value(&self) -> Option<Arc<Value>> {
        match &*lock(&self.cell.state) {
            State::Concrete { data, .. } => Some(data.clone()),
            State::Lazy { .. } => None,
        }
    }

    /// The device this tensor's data lives on (`None`: the host, or traced).
    pub fn device_name(&self) -> Option<&'static str> {
        self.value().and_then(|v| v.device_name())
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match &*lock(&self.cell.state) {
            State::Concrete { data, .. } => data.dtype(),
            State::Lazy { dtype, .. } => *dtype,
        }
    }

    /// Shape (symbolic where the trace made it so).
    pub fn shape(&self) -> Shape {
        let concrete = match &*lock(&self.cell.state) {
            State::Concrete { data, .. } => Ok(data.shape()),
            State::Lazy { shape, .. } => Err(shape.clone()),
        };
        match concrete {
            // An argument traced with symbolic dims shows the trace its symbolic shape, so every op
            // recorded on it is shape-generic.
            Ok(shape) => active().and_then(|t| t.arg_shape(self.id())).unwrap_or(shape),
            Err(shape) => shape,
        }
    }

    /// Replaces this tensor's value with `src`'s (same dtype and shape): how a weight is updated in place.
    /// Compiled functions that captured this tensor read the new value on their next call (they guard on
    /// the tensor, not on its data), and upload it to their device once.
    ///
    /// Inside a compiled function (an optimizer's update written as torch's `p.sub_(..)`), the new value
    /// is the traced one: the rest of the function reads it, and every call — traced or cached — leaves
    /// it in this tensor when the graph has run.
    #[track_caller]
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        let loc = SourceLoc::caller();
        let Some(old) = self.value() else {
            return Err(Error::Unsupported { what: "assigning to a traced tensor".into(), loc });
        };
        if src.dtype() != old.dtype() || src.shape() != self.shape() {
            return Err(Error::Shape {
                op: "assign".into(),
                msg: format!("{} {} into {} {}", src.dtype(), src.shape(), old.dtype(), self.shape()),
                loc,
            });
        }
        if let Some(tracer) = active() {
            tracer.assign(self, src);
            return Ok(());
        }
        let Some(new) = src.value() else {
            return Err(Error::Unsupported { what: "assigning a traced tensor after its trace ended".into(), loc });
        };
        self.replace_value(new);
        Ok(())
    }

    /// Makes this tensor hold `data` (same dtype and shape, checked by the caller).
    pub(crate) fn replace_value(&self, data: Arc<Value>) {
        *lock(&self.cell.state) = State::Concrete { data, carried_from: None };
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.shape().rank()
    }

    /// True while this tensor names a node of a graph being traced.
    pub fn is_traced(&self) -> bool {
        matches!(&*lock(&self.cell.state), State::Lazy { .. })
    }

    /// A stable identity for this handle's value (used for lifting and, later, guards).
    pub fn id(&self) -> u64 {
        self.cell.id
    }

    /// The concrete data on the host (read back from the device, and kept, when it lives there). Reading
    /// a traced value is a graph break (see the module docs).
    #[track_caller]
    pub fn to_data(&self) -> Result<Arc<TensorData>> {
        self.read_host("to_data")
    }

    /// The elements in row-major order, converted to `T`. A graph break when traced.
    #[track_caller]
    pub fn to_vec<T: crate::dtype::Element>(&self) -> Result<Vec<T>> {
        Ok(self.read_host("to_vec")?.to_vec())
    }

    /// [`Tensor::to_vec`] without blocking: how a browser (which cannot block) or an async caller reads a
    /// tensor that lives on a device. Not for traced tensors (await outside the traced function).
    pub async fn to_vec_async<T: crate::dtype::Element>(&self) -> Result<Vec<T>> {
        Ok(self.to_data_async().await?.to_vec())
    }

    /// [`Tensor::to_data`] without blocking (see [`Tensor::to_vec_async`]).
    pub async fn to_data_async(&self) -> Result<Arc<TensorData>> {
        let value = self.value().ok_or_else(|| Error::Unsupported {
            what: "an asynchronous read of a traced tensor".into(),
            loc: SourceLoc::internal(),
        })?;
        value.to_host_async().await
    }

    /// The single element of a one-element tensor. A graph break when traced.
    #[track_caller]
    pub fn item<T: crate::dtype::Element>(&self) -> Result<T> {
        let loc = SourceLoc::caller();
        let data = self.read_host("item")?;
        if data.numel() != 1 {
            return Err(Error::Shape {
                op: "item".into(),
                msg: format!("needs exactly one element, the tensor has shape {}", data.shape()),
                loc,
            });
        }
        Ok(data.to_vec::<T>()[0])
    }

    #[track_caller]
    fn read_host(&self, what: &str) -> Result<Arc<TensorData>> {
        let loc = SourceLoc::caller();
        if assign::pending(self.id()) {
            // Assigned a traced value: the graph runs and stores it first.
            if let Some(t) = active() {
                t.graph_break(format!("host read `{what}()` of a tensor assigned in the trace"), loc.clone())?;
            }
        }
        if let Some(data) = self.value() {
            // Reading an argument's values makes what follows depend on them: a break, so no cached
            // entry is ever specialised on data it does not guard.
            if let Some(t) = active().filter(|t| t.is_arg(self.id())) {
                t.graph_break(format!("host read `{what}()` of an argument's values"), loc)?;
            }
            return data.to_host();
        }
        let tracer = active().ok_or_else(|| Error::Unsupported {
            what: "reading a traced tensor after its trace ended".into(),
            loc: loc.clone(),
        })?;
        tracer.graph_break(format!("host read `{what}()` of a traced tensor"), loc)?;
        match self.value() {
            Some(data) => data.to_host(),
            None => unreachable!("a graph break materialises every live traced tensor"),
        }
    }

    /// This tensor's data on `backend`'s device (uploaded once; a no-op when it is there already). On a
    /// backend without a device (the CPU reference) the data moves to the host.
    #[track_caller]
    pub fn to(&self, backend: impl crate::backend::IntoBackend) -> Result<Tensor> {
        let backend = backend.into_backend()?;
        let value = self.value().ok_or_else(|| Error::Unsupported {
            what: "moving a traced tensor (move its inputs instead)".into(),
            loc: SourceLoc::caller(),
        })?;
        match backend.runtime() {
            Some(rt) => {
                let on = Value::all_on(std::slice::from_ref(&value), &rt)?.pop().expect("one value");
                Ok(Tensor::from_value(Value::from_device(on.into_owned())))
            }
            None => Ok(Tensor::from_data(value.to_host()?.as_ref().clone())),
        }
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*lock(&self.cell.state) {
            State::Concrete { data, .. } => write!(f, "Tensor({data:?})"),
            State::Lazy { dtype, shape, node, .. } => write!(f, "Tensor(traced {node}: {dtype} {shape})"),
        }
    }
}

/// A graph break: why tracing stopped, and where.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphBreak {
    /// What forced the break.
    pub reason: String,
    /// The user's line.
    pub loc: SourceLoc,
    /// Index of the graph the break ended (graphs with no ops are not kept, so this may repeat).
    pub after_graph: Option<usize>,
}

/// A finished graph of one traced call.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TracedGraph {
    /// The graph as captured.
    pub graph: Graph,
    /// The break that ended it, or `None` for the graph that ran at the function's return.
    pub ended_by: Option<GraphBreak>,
    /// What the pipeline made of it, on backends that run kernels.
    #[serde(skip)]
    pub compiled: Option<Arc<CompiledGraph>>,
    /// Per graph input: the tensor it was lifted from (`None` for the function's arguments).
    #[serde(skip)]
    pub sources: Vec<Option<Tensor>>,
    /// Which level of the compile cache served its compilation, when one did (a structurally equal graph
    /// compiled before: the graphs of a function with breaks, traced again on every call, compile once).
    #[serde(default)]
    pub cache_level: Option<crate::cache::CacheLevel>,
    /// For each backward joined to it (`backward()`, `value_and_grad`), what its partitioner chose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<crate::remat::Partition>,
}

impl PartialEq for TracedGraph {
    /// The captured graphs and breaks; what they were compiled to and lifted from is not compared.
    fn eq(&self, other: &Self) -> bool {
        self.graph == other.graph && self.ended_by == other.ended_by
    }
}

/// Options a tracer runs under.
#[derive(Clone)]
pub struct TraceOptions {
    /// Make a graph break an error.
    pub fullgraph: bool,
    /// Where graphs run.
    pub backend: Arc<dyn Backend>,
    /// Tune each graph's kernel schedules on the device as it compiles (`Mode::MaxAutotune`).
    pub tune: bool,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions { fullgraph: false, backend: Arc::new(CpuReference), tune: false }
    }
}

/// The state of one traced call.
pub(crate) struct Tracer {
    id: u64,
    opts: TraceOptions,
    st: RefCell<TraceState>,
}

#[derive(Default)]
struct TraceState {
    graph: Graph,
    graph_index: usize,
    lifted: HashMap<u64, NodeId>,
    input_data: Vec<Arc<Value>>,
    live: Vec<Weak<TensorCell>>,
    args: HashMap<u64, usize>,
    /// Symbolic shapes of arguments traced with dynamic dims.
    arg_shapes: HashMap<u64, Shape>,
    /// Per input of the current graph: the tensor it reads (arguments too: gradients flow back to it).
    read: Vec<Tensor>,
    graphs: Vec<TracedGraph>,
    breaks: Vec<GraphBreak>,
    break_error: Option<Error>,
    /// The traced call's value of every shape symbol (what a symbolic dim is at this call).
    hints: crate::sym::Bindings,
    /// Shape expressions the trace assumed to be zero: guards of the entry it becomes.
    shape_checks: Vec<crate::sym::Expr>,
    /// Graphs whose compilation came from the compile cache.
    cache_hits: usize,
    /// Nodes of the current graph that gradients do not flow through: made under `no_grad`, detached,
    /// or gradients themselves ([`backward`]).
    stopped: std::collections::HashSet<NodeId>,
    /// The leaves `backward()` gave gradients during this trace ([`backward`]).
    grads: Vec<backward::GradLeaf>,
    /// Gradients lifted into the trace (what `.grad` held when a `backward()` added to it), by the
    /// lifted tensor's identity: each is the named leaf's gradient at the call, not that tensor.
    grad_sources: HashMap<u64, Tensor>,
    /// What the partitioner chose for each backward joined to the current graph.
    partitions: Vec<crate::remat::Partition>,
    /// Concrete tensors the function assigned new values to in the current graph, and the values (the
    /// latest one per tensor): ops read the value, and the graph's run stores it in the tensor.
    assigned: Vec<(Tensor, Tensor)>,
    /// Time spent tuning kernel schedules (`Mode::MaxAutotune`), ms.
    tuning_ms: f64,
    /// Kernels whose schedules were timed (not taken from the tuning cache).
    tuned_kernels: usize,
}

/// Where an output of the traced function comes from (see [`Tracer::locate`]).
#[derive(Clone, Debug)]
pub(crate) enum Located {
    /// A node of the final graph.
    Node(NodeId),
    /// Tensor argument `i`, returned unchanged.
    Arg(usize),
    /// A concrete value made during tracing.
    Const(Arc<Value>),
    /// A tensor that existed before the trace (a weight), returned or assigned as it is: a later call
    /// gives that tensor, with whatever value it holds then.
    Captured(Tensor),
}

/// What a finished trace leaves behind.
#[derive(Clone)]
pub(crate) struct TraceRecord {
    pub graphs: Vec<TracedGraph>,
    pub breaks: Vec<GraphBreak>,
}

pub(crate) fn active() -> Option<Rc<Tracer>> {
    ACTIVE.with(|a| a.borrow().clone())
}

/// Makes a tracer the active one until dropped (also on unwinding).
pub(crate) struct ActiveGuard {
    /// The trace that was active before (a trace started inside another, such as the forward graph
    /// `value_and_grad` captures inside a compiled train step): active again when this one ends.
    outer: Option<Rc<Tracer>>,
}

impl ActiveGuard {
    pub(crate) fn set(t: Rc<Tracer>) -> ActiveGuard {
        ActiveGuard { outer: ACTIVE.with(|a| a.borrow_mut().replace(t)) }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let outer = self.outer.take();
        ACTIVE.with(|a| *a.borrow_mut() = outer);
    }
}

impl Tracer {
    pub(crate) fn new(opts: TraceOptions) -> Rc<Tracer> {
        Rc::new(Tracer { id: next_id(), opts, st: RefCell::new(TraceState::default()) })
    }

    /// Declares a concrete tensor as tensor argument number `index` of the traced function.
    /// Declares a concrete tensor as argument `index`, optionally with the symbolic shape to trace it as.
    pub(crate) fn register_arg(&self, t: &Tensor, index: usize, shape: Option<Shape>) {
        let mut st = self.st.borrow_mut();
        st.args.entry(t.id()).or_insert(index);
        if let Some(s) = shape {
            st.arg_shapes.insert(t.id(), s);
        }
    }

    /// Records the traced call's value of a shape symbol.
    pub(crate) fn hint(&self, sym: crate::sym::SymId, value: i64) {
        self.st.borrow_mut().hints.bind(sym, value);
    }

    /// The shape checks this trace assumed, for the entry's guards.
    pub(crate) fn shape_checks(&self) -> Vec<crate::sym::Expr> {
        self.st.borrow().shape_checks.clone()
    }

    /// Graphs of this trace whose compilation was served by the compile cache.
    pub(crate) fn cache_hits(&self) -> usize {
        self.st.borrow().cache_hits
    }

    /// What tuning this trace's graphs cost (`Mode::MaxAutotune`): ms, and kernels timed.
    pub(crate) fn tuning(&self) -> (f64, usize) {
        let st = self.st.borrow();
        (st.tuning_ms, st.tuned_kernels)
    }

    /// The symbol table of the graph being traced (where dynamic dims get their symbols).
    pub(crate) fn with_symbols<T>(&self, f: impl FnOnce(&mut crate::sym::SymTable) -> T) -> T {
        f(&mut self.st.borrow_mut().graph.symbols)
    }

    fn arg_shape(&self, id: u64) -> Option<Shape> {
        self.st.try_borrow().ok()?.arg_shapes.get(&id).cloned()
    }

    fn is_arg(&self, id: u64) -> bool {
        self.st.try_borrow().is_ok_and(|st| st.args.contains_key(&id))
    }

    pub(crate) fn take_break_error(&self) -> Option<Error> {
        self.st.borrow_mut().break_error.take()
    }

    /// The node that stands for `t` in the current graph, lifting concrete data in as an input.
    fn node_of(&self, st: &mut TraceState, t: &Tensor, loc: &SourceLoc) -> Result<NodeId> {
        if let Some(value) = st.assigned.iter().find(|(target, _)| target.id() == t.id()).map(|(_, v)| v.clone()) {
            return self.node_of(st, &value, loc);
        }
        match &*lock(&t.cell.state) {
            State::Lazy { trace, graph, node, .. } => {
                if *trace == self.id && *graph == st.graph_index {
                    Ok(*node)
                } else {
                    Err(Error::Unsupported {
                        what: "a traced tensor used outside the trace that made it".into(),
                        loc: loc.clone(),
                    })
                }
            }
            State::Concrete { data, carried_from } => {
                if let Some(&n) = st.lifted.get(&t.id()) {
                    return Ok(n);
                }
                let kind = match (st.args.get(&t.id()), carried_from) {
                    (Some(&index), _) => InputKind::Arg { index },
                    (None, Some((trace, g))) if *trace == self.id => InputKind::Carried { from_graph: *g },
                    _ => InputKind::Lifted,
                };
                let shape = st.arg_shapes.get(&t.id()).cloned().unwrap_or_else(|| data.shape());
                let n = st.graph.add_input(data.dtype(), shape, kind, loc.clone());
                st.lifted.insert(t.id(), n);
                st.input_data.push(data.clone());
                st.read.push(t.clone());
                Ok(n)
            }
        }
    }

    fn record(&self, op: Op, inputs: &[&Tensor], dtype: DType, shape: Shape, loc: SourceLoc) -> Result<Tensor> {
        let mut st = self.st.borrow_mut();
        let ids = inputs.iter().map(|t| self.node_of(&mut st, t, &loc)).collect::<Result<Vec<_>>>()?;
        let node = st.graph.push(Node { op, inputs: ids, dtype, shape, loc });
        if crate::tape::grad_disabled() {
            st.stopped.insert(node);
        }
        Ok(self.lazy(&mut st, node))
    }

    /// A traced tensor standing for `node` of the current graph.
    fn lazy(&self, st: &mut TraceState, node: NodeId) -> Tensor {
        let n = st.graph.node(node);
        let (dtype, shape) = (n.dtype, n.shape.clone());
        let cell = Arc::new(TensorCell {
            id: next_id(),
            state: Mutex::new(State::Lazy { trace: self.id, graph: st.graph_index, node, dtype, shape }),
            grad: Mutex::default(),
        });
        st.live.push(Arc::downgrade(&cell));
        Tensor { cell }
    }

    /// A host read at `loc`: an error under fullgraph, else run the graph so far and start a new one.
    pub(crate) fn graph_break(&self, reason: String, loc: SourceLoc) -> Result<()> {
        if self.opts.fullgraph {
            let err = || Error::GraphBreak { reason: reason.clone(), loc: loc.clone() };
            self.st.borrow_mut().break_error.get_or_insert_with(err);
            return Err(err());
        }
        tracing::debug!(target: "kiln::graph", %loc, %reason, "graph break");
        self.flush(Some(GraphBreak { reason, loc, after_graph: None }))
    }

    /// Runs the current graph with every live traced tensor as an output and makes those tensors concrete.
    pub(crate) fn flush(&self, ended_by: Option<GraphBreak>) -> Result<()> {
        let mut st = self.st.borrow_mut();
        let mut cells = Vec::new();
        for w in std::mem::take(&mut st.live) {
            if let Some(c) = w.upgrade() {
                let node = match &*lock(&c.state) {
                    State::Lazy { node, .. } => Some(*node),
                    State::Concrete { .. } => None,
                };
                if let Some(node) = node {
                    cells.push((c, node));
                }
            }
        }
        let mut outputs: Vec<NodeId> = cells.iter().map(|(_, n)| *n).collect();
        outputs.sort();
        outputs.dedup();
        let mut graph = std::mem::take(&mut st.graph);
        graph.outputs = outputs;
        let input_data = std::mem::take(&mut st.input_data);
        let read = std::mem::take(&mut st.read);
        // What a cached entry binds each input to: the tensor itself, except the function's arguments.
        let sources: Vec<Option<Tensor>> = graph
            .inputs
            .iter()
            .zip(&read)
            .map(|(gi, t)| (!matches!(gi.kind, InputKind::Arg { .. })).then(|| t.clone()))
            .collect();
        // The next graph starts with the same symbols (its carried inputs may have symbolic shapes).
        st.graph.symbols = graph.symbols.clone();
        st.lifted.clear();
        st.stopped.clear();
        let ran = graph.op_count() > 0 || !graph.outputs.is_empty();
        let index = st.graphs.len();
        let mut compiled = None;
        let mut cache_level = None;
        if ran {
            let backend = &self.opts.backend;
            if let Some(target) = backend.target() {
                let before = crate::cache::stats();
                let c = crate::pipeline::compile_cached(&graph, target, crate::fuse::FusionMode::Fused)?;
                let after = crate::cache::stats();
                if after.memory_hits > before.memory_hits {
                    cache_level = Some(crate::cache::CacheLevel::Memory);
                } else if after.disk_hits > before.disk_hits {
                    cache_level = Some(crate::cache::CacheLevel::Disk);
                }
                if cache_level.is_some() {
                    st.cache_hits += 1;
                }
                let c = if self.opts.tune {
                    let started = web_time::Instant::now();
                    let (c, tuned) = crate::tune::tune(&graph, target, backend.as_ref(), &input_data, c)?;
                    st.tuning_ms += started.elapsed().as_secs_f64() * 1e3;
                    st.tuned_kernels += tuned.measured;
                    c
                } else {
                    c
                };
                compiled = Some(c);
            }
            let results = crate::backend::execute(
                backend.as_ref(),
                &graph,
                compiled.as_ref(),
                &input_data,
                crate::backend::Mode::Default,
            )?;
            let by_node: HashMap<NodeId, Arc<Value>> = graph.outputs.iter().copied().zip(results).collect();
            // A run on tensors that track gradients notes itself on its results, for `backward`.
            if crate::tape::tracking(&read) {
                let step = crate::tape::step(Arc::new(graph.clone()), &read, &input_data);
                for (cell, node) in &cells {
                    crate::tape::note(cell, &step, *node);
                }
            }
            for (cell, node) in cells {
                let data = by_node[&node].clone();
                *lock(&cell.state) = State::Concrete { data, carried_from: Some((self.id, index)) };
            }
        }
        for (target, value) in std::mem::take(&mut st.assigned) {
            if let Some(data) = value.value() {
                target.replace_value(data);
            }
        }
        let ended_by = ended_by.map(|mut b| {
            b.after_graph = ran.then_some(index).or(index.checked_sub(1));
            st.breaks.push(b.clone());
            b
        });
        if ran {
            let partitions = std::mem::take(&mut st.partitions);
            st.graphs.push(TracedGraph { graph, ended_by, compiled, sources, cache_level, partitions });
        }
        st.graph_index += 1;
        Ok(())
    }

    /// Where each of `outs` will come from once the final graph has run: a node of that graph (its index
    /// among the graph's outputs is resolved after the flush), an argument, or a constant. Call before the
    /// final [`Tracer::flush`].
    pub(crate) fn locate(&self, outs: &[Tensor]) -> Vec<Located> {
        let st = self.st.borrow();
        outs.iter()
            .map(|t| match &*lock(&t.cell.state) {
                State::Lazy { node, .. } => Located::Node(*node),
                State::Concrete { data, .. } => match st.args.get(&t.id()) {
                    Some(&i) => Located::Arg(i),
                    // Ids grow: a tensor older than this trace came from the function's environment.
                    None if t.id() < self.id => Located::Captured(t.clone()),
                    None => Located::Const(data.clone()),
                },
            })
            .collect()
    }

    pub(crate) fn finish(&self) -> TraceRecord {
        let mut st = self.st.borrow_mut();
        TraceRecord { graphs: std::mem::take(&mut st.graphs), breaks: std::mem::take(&mut st.breaks) }
    }
}

/// Under an active trace whose call sizes are known: the value of `expr` at this call.
pub(crate) fn concrete_value(expr: &crate::sym::Expr) -> Option<i64> {
    if let Some(c) = expr.as_const() {
        return Some(c);
    }
    let t = active()?;
    let st = t.st.try_borrow().ok()?;
    expr.eval(&st.hints).ok()
}

/// A shape printed with the sizes of the traced call (`[2, 8]`), followed by its symbolic form when it
/// has one (`[2, 8] (symbolic [2, s0])`): errors show users the sizes they passed.
pub(crate) fn shape_for_humans(s: &Shape) -> String {
    if s.as_concrete().is_some() {
        return s.to_string();
    }
    let dims: Option<Vec<String>> = s.dims().iter().map(|d| concrete_value(d).map(|v| v.to_string())).collect();
    match dims {
        Some(d) => format!("[{}] (symbolic {s})", d.join(", ")),
        None => s.to_string(),
    }
}

/// Under an active trace: whether `expr` is zero at this call's sizes. When it is, the trace assumes it
/// from now on and the entry guards it (a later call where it fails recompiles). `None` when there is no
/// trace or the value is unknown (placeholder capture).
pub(crate) fn assume_zero(expr: &crate::sym::Expr) -> Option<bool> {
    let value = concrete_value(expr)?;
    if value == 0 && expr.as_const().is_none() {
        let t = active()?;
        let mut st = t.st.try_borrow_mut().ok()?;
        if !st.shape_checks.contains(expr) {
            tracing::debug!(target: "kiln::guards", check = %expr, "shape guard added");
            st.shape_checks.push(expr.clone());
        }
    }
    Some(value == 0)
}

/// The element type and dims of a placeholder input for [`capture`].
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    /// Element type.
    pub dtype: DType,
    /// Dims.
    pub shape: Shape,
}

impl TensorSpec {
    /// A spec of constant dims.
    pub fn new(dtype: DType, dims: &[usize]) -> Self {
        TensorSpec { dtype, shape: Shape::from_dims(dims) }
    }
}

/// Traces `f` on placeholder inputs — no data, nothing runs — and returns the graph, with `f`'s results
/// as outputs. This is how tools (fusion tests, the explorer, the bench's kernel counts) inspect what a
/// function compiles to at full size. A host read inside `f` is an error here: there is no value to read.
pub fn capture(inputs: &[TensorSpec], f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>) -> Result<Graph> {
    let tracer = Tracer::new(TraceOptions { fullgraph: true, ..TraceOptions::default() });
    let handles: Vec<Tensor> = {
        let mut st = tracer.st.borrow_mut();
        inputs
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                let node =
                    st.graph.add_input(spec.dtype, spec.shape.clone(), InputKind::Arg { index }, SourceLoc::internal());
                Tensor {
                    cell: Arc::new(TensorCell {
                        id: next_id(),
                        state: Mutex::new(State::Lazy {
                            trace: tracer.id,
                            graph: 0,
                            node,
                            dtype: spec.dtype,
                            shape: spec.shape.clone(),
                        }),
                        grad: Mutex::default(),
                    }),
                }
            })
            .collect()
    };
    let outs = {
        let _active = ActiveGuard::set(tracer.clone());
        f(&handles)
    };
    if let Some(e) = tracer.take_break_error() {
        return Err(e);
    }
    let outs = outs?;
    let mut st = tracer.st.borrow_mut();
    let mut outputs = Vec::with_capacity(outs.len());
    for t in &outs {
        let node = tracer.node_of(&mut st, t, &SourceLoc::internal())?;
        outputs.push(node);
    }
    let mut graph = std::mem::take(&mut st.graph);
    graph.outputs = outputs;
    Ok(graph)
}

/// Records every node of `graph` on `args` (its `Arg` inputs, by index), as the ops would record
/// themselves: into the active trace, or eagerly. How a graph kiln built (a joint forward-and-backward
/// graph) joins the function being traced, to be fused with the rest of it.
pub(crate) fn splice(graph: &Graph, args: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut made: Vec<Option<Tensor>> = vec![None; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        let t = match &node.op {
            Op::Input { .. } => match graph.inputs.iter().find(|gi| gi.node.index() == i).map(|gi| &gi.kind) {
                Some(InputKind::Arg { index }) => args.get(*index).cloned().ok_or_else(|| Error::Unsupported {
                    what: format!("a spliced graph reads argument {index} of {}", args.len()),
                    loc: node.loc.clone(),
                })?,
                _ => {
                    return Err(Error::Unsupported {
                        what: "a spliced graph reads a tensor that is not an argument".into(),
                        loc: node.loc.clone(),
                    })
                }
            },
            op => {
                let inputs: Vec<&Tensor> =
                    node.inputs.iter().map(|a| made[a.index()].as_ref().expect("topological order")).collect();
                record(op.clone(), &inputs, node.dtype, node.shape.clone(), node.loc.clone())?
            }
        };
        made[i] = Some(t);
    }
    Ok(graph.outputs.iter().map(|o| made[o.index()].clone().expect("outputs are nodes")).collect())
}

/// The backend an eager op on `inputs` runs on: the thread's eager backend if one was set, else the
/// device its inputs live on (as in PyTorch, ops on GPU tensors run on the GPU; nothing is copied to the
/// host), else the CPU reference.
pub(crate) fn eager_backend(inputs: &[&Tensor]) -> Arc<dyn Backend> {
    let on_device = || -> Option<Arc<dyn Backend>> {
        inputs.iter().find_map(|t| t.value()?.device()).map(|d| d.buffer.runtime().clone() as Arc<dyn Backend>)
    };
    EAGER.with(|e| e.borrow().clone()).or_else(on_device).unwrap_or_else(|| TraceOptions::default().backend)
}

/// Runs `f`'s ops as one eager graph — one kernel where they fuse, run on the backend eager ops on
/// `like` use — instead of one graph per op: a scalar operand's constant and a broadcast's expand are
/// then computed inside the op's kernel, not materialised at full size on the host first. Inside a
/// trace it is just `f`.
pub(crate) fn eager_group(like: &[&Tensor], f: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    // Tracked for gradients, each op runs (and notes itself) on its own.
    if active().is_some() || crate::tape::tracking(like.iter().copied()) {
        return f();
    }
    let tracer = Tracer::new(TraceOptions { fullgraph: false, backend: eager_backend(like), tune: false });
    let out = {
        let _active = ActiveGuard::set(tracer.clone());
        f()?
    };
    tracer.flush(None)?;
    Ok(out)
}

/// Records one op: into the active trace, or (eager mode) as a one-node graph run at once on the eager
/// backend ([`set_eager_backend`]'s choice, else its inputs' device, else the CPU reference). Shape and dtype inference happen before, in `ops`.
pub(crate) fn record(op: Op, inputs: &[&Tensor], dtype: DType, shape: Shape, loc: SourceLoc) -> Result<Tensor> {
    // Every size kiln computes later (bytes, strides, grids) stays inside i64 once this holds.
    if let Err(e) = shape.checked_numel() {
        return Err(Error::TooLarge { op: op.name().into(), msg: format!("a result of shape {shape}: {e}"), loc });
    }
    if let Some(t) = active() {
        return t.record(op, inputs, dtype, shape, loc);
    }
    let eager = Tracer::new(TraceOptions { fullgraph: false, backend: eager_backend(inputs), tune: false });
    let out = eager.record(op, inputs, dtype, shape, loc)?;
    eager.flush(None)?;
    Ok(out)
}
