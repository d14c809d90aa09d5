//! The driver: `compile(f)` returns a callable. A call checks the guards of the entries compiled so far
//! and runs the first that holds, without tracing; otherwise it traces `f` (graph breaks split the trace),
//! compiles each graph (`pipeline`: decompose → fuse → lower → plan, structure-keyed cache), runs it on the
//! backend, and — when the trace was one unbroken graph — keeps it as a new entry under its guards.
//! The traced function must be pure in its tensor inputs and static arguments, as with `jax.jit`.

use crate::backend::{Backend, IntoBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::explain::Explanation;
use crate::guard::{ArgGuard, CallSignature, DimGuard, Dynamic, GuardFailure, Guards};
use crate::ir::Graph;
use crate::loc::SourceLoc;
use crate::pipeline::CompiledGraph;
use crate::runtime::lock;
use crate::shape::Shape;
use crate::sym::Expr;
use crate::trace::{active, ActiveGuard, Located, Tensor, TraceOptions, Tracer};
use crate::value::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Collects the tensor and static arguments of a traced call.
#[derive(Default)]
pub struct ArgVisitor {
    tensors: Vec<Tensor>,
    statics: Vec<String>,
}

impl ArgVisitor {
    /// Declares a tensor argument.
    pub fn tensor(&mut self, t: &Tensor) {
        self.tensors.push(t.clone());
    }

    /// Declares a static (non-tensor) argument by its printed value.
    pub fn static_arg(&mut self, printed: String) {
        self.statics.push(printed);
    }
}

/// Arguments a compiled function can take: tensors, tuples and vectors of them, and [`Static`] values.
pub trait Args {
    /// Reports every tensor and static value inside, in order.
    fn visit(&self, v: &mut ArgVisitor);
}

impl Args for Tensor {
    fn visit(&self, v: &mut ArgVisitor) {
        v.tensor(self);
    }
}

impl<T: Args + ?Sized> Args for &T {
    fn visit(&self, v: &mut ArgVisitor) {
        (**self).visit(v);
    }
}

impl<T: Args> Args for Vec<T> {
    fn visit(&self, v: &mut ArgVisitor) {
        self.iter().for_each(|t| t.visit(v));
    }
}

impl<T: Args> Args for [T] {
    fn visit(&self, v: &mut ArgVisitor) {
        self.iter().for_each(|t| t.visit(v));
    }
}

macro_rules! tuple_args {
    ($($name:ident),+) => {
        impl<$($name: Args),+> Args for ($($name,)+) {
            #[allow(non_snake_case)]
            fn visit(&self, v: &mut ArgVisitor) {
                let ($($name,)+) = self;
                $($name.visit(v);)+
            }
        }
    };
}
tuple_args!(A);
tuple_args!(A, B);
tuple_args!(A, B, C);
tuple_args!(A, B, C, D);
tuple_args!(A, B, C, D, E);

/// A non-tensor argument that changes what the function does (a flag, a size). It is recorded with the
/// trace (and, once the compile cache lands, guarded: a new value recompiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Static<T>(pub T);

impl<T: Debug> Args for Static<T> {
    fn visit(&self, v: &mut ArgVisitor) {
        v.static_arg(format!("{:?}", self.0));
    }
}

/// How an output value was laid out, so a cached entry can rebuild it without running `f`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutTree {
    /// One tensor.
    Leaf,
    /// A sequence (tuple or vector) of sub-trees.
    List(Vec<OutTree>),
}

/// What a compiled function may return: tensors, and tuples and vectors of them.
pub trait Outputs: Sized {
    /// Appends every tensor inside, in order, and describes the layout.
    fn flatten(&self, out: &mut Vec<Tensor>) -> OutTree;
    /// Rebuilds from tensors in `flatten`'s order and its layout.
    fn rebuild(tree: &OutTree, tensors: &mut dyn Iterator<Item = Tensor>) -> Option<Self>;
}

impl Outputs for Tensor {
    fn flatten(&self, out: &mut Vec<Tensor>) -> OutTree {
        out.push(self.clone());
        OutTree::Leaf
    }

    fn rebuild(tree: &OutTree, tensors: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        matches!(tree, OutTree::Leaf).then(|| tensors.next()).flatten()
    }
}

impl<T: Outputs> Outputs for Vec<T> {
    fn flatten(&self, out: &mut Vec<Tensor>) -> OutTree {
        OutTree::List(self.iter().map(|t| t.flatten(out)).collect())
    }

    fn rebuild(tree: &OutTree, tensors: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
        match tree {
            OutTree::List(items) => items.iter().map(|t| T::rebuild(t, tensors)).collect(),
            OutTree::Leaf => None,
        }
    }
}

macro_rules! tuple_outputs {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: Outputs),+> Outputs for ($($name,)+) {
            fn flatten(&self, out: &mut Vec<Tensor>) -> OutTree {
                OutTree::List(vec![$(self.$idx.flatten(out)),+])
            }

            fn rebuild(tree: &OutTree, tensors: &mut dyn Iterator<Item = Tensor>) -> Option<Self> {
                match tree {
                    OutTree::List(items) => Some(($($name::rebuild(items.get($idx)?, tensors)?,)+)),
                    OutTree::Leaf => None,
                }
            }
        }
    };
}
tuple_outputs!(A 0, B 1);
tuple_outputs!(A 0, B 1, C 2);
tuple_outputs!(A 0, B 1, C 2, D 3);
tuple_outputs!(A 0, B 1, C 2, D 3, E 4);

/// Counters and timings of one compiled function, for explain and tests.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CompileStats {
    /// Calls made.
    pub calls: usize,
    /// Calls served by a cached entry, without tracing.
    pub cache_hits: usize,
    /// Calls that traced `f`.
    pub traces: usize,
    /// Traces caused by failed guards (the first compile is not a recompile).
    pub recompiles: usize,
    /// Each recompile's reason: the first guard that failed.
    pub guard_failures: Vec<String>,
    /// Calls run eagerly because the recompile limit was reached.
    pub eager_fallbacks: usize,
    /// Entries held.
    pub entries: usize,
    /// Traces made to check that an entry traced with other tensors does not depend on their identity
    /// (a tensor that was both an argument and a captured weight); not recompiles.
    pub verifications: usize,
    /// Graphs of traced calls whose compilation the compile cache served (a function with graph breaks
    /// re-runs its Rust code every call, but each graph between breaks compiles once).
    pub graph_cache_hits: usize,
    /// Time spent tracing and running traced calls, ms (compile and first run included).
    pub trace_ms: f64,
    /// Of `trace_ms`, time spent tuning kernel schedules on the device (`Mode::MaxAutotune`), ms.
    pub tuning_ms: f64,
    /// Kernels whose candidate schedules were timed (`Mode::MaxAutotune`); those whose choice came from
    /// the tuning cache are not counted.
    pub tuned_kernels: usize,
}

/// Where one input of a cached graph comes from on a call.
#[derive(Clone, Debug)]
enum InputSource {
    /// Tensor argument `i` of the call.
    Arg(usize),
    /// A tensor read from the environment at trace time (a weight).
    Tensor(Tensor),
    /// The gradient a leaf holds at the call (what a `backward()` in the function adds to).
    GradOf(CallTensor),
}

/// A tensor whose `.grad` a cached entry reads or writes: an argument of the call, or a captured one.
#[derive(Clone, Debug)]
enum CallTensor {
    /// Tensor argument `i` of the call.
    Arg(usize),
    /// A captured tensor (a weight).
    Tensor(Tensor),
}

impl CallTensor {
    fn resolve<'a>(&'a self, args: &'a [Tensor]) -> Result<&'a Tensor> {
        match self {
            CallTensor::Arg(i) => args.get(*i).ok_or_else(|| Error::Unsupported {
                what: format!("a cached entry's gradient belongs to argument {i} of {}", args.len()),
                loc: SourceLoc::internal(),
            }),
            CallTensor::Tensor(t) => Ok(t),
        }
    }

    fn same(&self, other: &CallTensor) -> bool {
        match (self, other) {
            (CallTensor::Arg(i), CallTensor::Arg(j)) => i == j,
            (CallTensor::Tensor(s), CallTensor::Tensor(t)) => s.id() == t.id(),
            _ => false,
        }
    }
}

/// A gradient a cached entry leaves in a leaf's `.grad` (the function called `backward()`).
#[derive(Clone, Debug)]
struct GradWrite {
    target: CallTensor,
    /// Whether the leaf held a gradient when traced: the graph added to it then, so a call must find
    /// one too (and none where it had none) — else it traces again.
    had_grad: bool,
    /// What `.grad` holds after the call (`None`: cleared, as `zero_grad` does).
    value: Option<OutputSource>,
}

/// Where one output tensor of a cached entry comes from.
#[derive(Clone, Debug)]
enum OutputSource {
    /// Output `k` of the graph.
    Graph(usize),
    /// Tensor argument `i`, returned unchanged.
    Arg(usize),
    /// A constant made during tracing.
    Const(Arc<Value>),
    /// A tensor from the function's environment (a weight), as it is at the call.
    Tensor(Tensor),
}

/// A compiled entry: one unbroken graph, valid under its guards.
///
/// Tracing cannot tell an argument from a captured tensor that *is* the same tensor (`g(&w)` where `g`
/// also reads `w`): both are one handle, merged into one input. So an entry is first trusted only for
/// the argument identities it was traced with; the first call with other tensors traces again
/// (`verifications`), and either confirms the entry (the same graph and inputs: it serves every tensor
/// from then on) or pins it to the tensors it was traced with.
struct Entry {
    guards: Guards,
    /// Identities of the tensor arguments it was traced with.
    traced_ids: Vec<u64>,
    /// A trace with other argument tensors gave the same graph and inputs.
    verified: AtomicBool,
    /// A trace with other argument tensors did not: only the traced tensors may use this entry.
    pinned: AtomicBool,
    graph: Option<(Arc<Graph>, Option<Arc<CompiledGraph>>)>,
    inputs: Vec<InputSource>,
    outputs: Vec<OutputSource>,
    /// Gradients the call leaves in leaves' `.grad`.
    grad_writes: Vec<GradWrite>,
    /// Tensors the function assigned new values to (`Tensor::assign`), and where each value comes from.
    assign_writes: Vec<(CallTensor, OutputSource)>,
    tree: OutTree,
    explanation: Explanation,
    /// The latest [`Compiled::profile`] of its graph: how it was timed and each launch's time.
    profile: Mutex<Option<(&'static str, Vec<crate::runtime::LaunchTime>)>>,
}

#[derive(Default)]
struct CacheState {
    entries: Vec<Arc<Entry>>,
    /// `(argument, dim)` pairs a recompile showed to vary (Dynamic::Auto).
    promoted: BTreeSet<(usize, usize)>,
    /// Every argument's dims at the first trace: a recompile under Dynamic::Auto makes every dim that
    /// differs from them symbolic at once (as torch's automatic dynamic shapes do), not only the dim
    /// whose guard failed first — a batch dim shared by inputs and targets changes in both.
    first_dims: Option<Vec<Vec<usize>>>,
    /// `(argument, dim)` pairs a call took past their 32-bit index bound: traced unbounded from then on
    /// (bounding them again would recompile at every larger size).
    unbounded: BTreeSet<(usize, usize)>,
    stats: CompileStats,
    warned: bool,
    /// A trace that became no entry (a function with graph breaks traces every call): the latest one
    /// whose breaks differ from the one before.
    uncached: Option<Explanation>,
}

/// A symbolic dim's range, `(lo, hi)` inclusive (`hi` unbounded when `None`).
type DimRange = (i64, Option<i64>);

/// A compiled function. Build with [`compile`], configure with the builder methods, run with `call`.
///
/// `Send + Sync` when `F` is: many threads may call one compiled function at once (each traces on its
/// own thread when it must; entries and statistics are shared behind a lock held only briefly).
pub struct Compiled<F> {
    f: F,
    fullgraph: bool,
    backend: Result<Arc<dyn Backend>, String>,
    dynamic: Dynamic,
    marks: BTreeMap<(usize, usize), (i64, Option<i64>)>,
    recompile_limit: usize,
    fail_on_recompile: bool,
    mode: crate::backend::Mode,
    state: Mutex<CacheState>,
    /// Where `compile` was called: names the function in reports.
    loc: crate::loc::SourceLoc,
}

impl Entry {
    /// Whether `other` runs the same graph on the same inputs (arguments by position, captured tensors by
    /// identity) and returns the same outputs: then this entry does not depend on which tensors it got.
    fn same_program(&self, other: &Entry) -> bool {
        let graphs = match (&self.graph, &other.graph) {
            (Some((a, _)), Some((b, _))) => a == b,
            (None, None) => true,
            _ => false,
        };
        let inputs = self.inputs.len() == other.inputs.len()
            && self.inputs.iter().zip(&other.inputs).all(|(a, b)| match (a, b) {
                (InputSource::Arg(i), InputSource::Arg(j)) => i == j,
                (InputSource::Tensor(s), InputSource::Tensor(t)) => s.id() == t.id(),
                (InputSource::GradOf(s), InputSource::GradOf(t)) => s.same(t),
                _ => false,
            });
        let outputs = self.outputs.len() == other.outputs.len()
            && self.outputs.iter().zip(&other.outputs).all(|(a, b)| a.same(b));
        let grads = self.grad_writes.len() == other.grad_writes.len()
            && self.grad_writes.iter().zip(&other.grad_writes).all(|(a, b)| {
                a.target.same(&b.target)
                    && a.had_grad == b.had_grad
                    && match (&a.value, &b.value) {
                        (Some(x), Some(y)) => x.same(y),
                        (None, None) => true,
                        _ => false,
                    }
            });
        let assigns = self.assign_writes.len() == other.assign_writes.len()
            && self.assign_writes.iter().zip(&other.assign_writes).all(|((a, x), (b, y))| a.same(b) && x.same(y));
        graphs && inputs && outputs && grads && assigns && self.guards == other.guards && self.tree == other.tree
    }

    /// Why this entry's gradients cannot serve a call: a leaf whose `.grad` is set where it was not when
    /// traced, or the other way round.
    fn grad_failure(&self, args: &[Tensor]) -> Option<GuardFailure> {
        self.grad_writes.iter().find_map(|w| {
            let held = w.target.resolve(args).ok()?.grad().is_some();
            (held != w.had_grad).then(|| GuardFailure {
                arg: None,
                dim: None,
                reason: format!(
                    "a tensor's .grad was {} when traced and is {} now (backward() adds to it)",
                    if w.had_grad { "set" } else { "empty" },
                    if held { "set" } else { "empty" },
                ),
                past_bound: false,
            })
        })
    }
}

impl OutputSource {
    fn same(&self, other: &OutputSource) -> bool {
        match (self, other) {
            (OutputSource::Graph(i), OutputSource::Graph(j)) => i == j,
            (OutputSource::Arg(i), OutputSource::Arg(j)) => i == j,
            (OutputSource::Const(x), OutputSource::Const(y)) => Arc::ptr_eq(x, y),
            (OutputSource::Tensor(s), OutputSource::Tensor(t)) => s.id() == t.id(),
            _ => false,
        }
    }

    /// The tensor this output is at a call whose graph gave `results`.
    fn tensor(&self, results: &[Arc<Value>], args: &[Tensor]) -> Tensor {
        match self {
            OutputSource::Graph(k) => Tensor::from_value(results[*k].clone()),
            OutputSource::Arg(i) => args[*i].clone(),
            OutputSource::Const(d) => Tensor::from_value(d.clone()),
            OutputSource::Tensor(t) => t.clone(),
        }
    }
}

/// Wraps `f` for tracing. Nothing runs until the first call.
#[track_caller]
pub fn compile<F>(f: F) -> Compiled<F> {
    Compiled {
        f,
        fullgraph: false,
        backend: Ok(TraceOptions::default().backend),
        dynamic: Dynamic::Auto,
        marks: BTreeMap::new(),
        recompile_limit: 8,
        fail_on_recompile: false,
        mode: crate::backend::Mode::Default,
        state: Mutex::new(CacheState::default()),
        loc: crate::loc::SourceLoc::caller(),
    }
}

fn signature<'a>(tensors: &[Tensor], values: &'a [Option<Arc<Value>>]) -> Vec<(DType, Cow<'a, [usize]>)> {
    // A concrete tensor's dims borrowed from its value (no symbolic shape built, nothing copied): this
    // runs every call, once per argument.
    tensors
        .iter()
        .zip(values)
        .map(|(t, v)| match v {
            Some(v) => (v.dtype(), Cow::Borrowed(v.dims())),
            None => (t.dtype(), Cow::Owned(t.shape().as_concrete().unwrap_or_default())),
        })
        .collect()
}

impl<F> Compiled<F> {
    /// `KILN_REPORT=dir`: the report, rewritten whenever an entry is added (a failure to write is logged,
    /// never the call's error).
    fn write_report(&self) {
        let Some(dir) = std::env::var_os("KILN_REPORT") else { return };
        match self.report().write_to(std::path::Path::new(&dir)) {
            Ok(path) => tracing::info!(target: "kiln::graph", path = %path.display(), "compile report written"),
            Err(e) => tracing::warn!(target: "kiln::graph", error = %e, "compile report not written"),
        }
    }
}

/// A reduce-overhead function's recordings (and the buffers they hold) go back to the device when the
/// function is dropped, rather than waiting to be pushed out of the runtime's last-16 list.
impl<F> Drop for Compiled<F> {
    fn drop(&mut self) {
        if self.mode != crate::backend::Mode::ReduceOverhead {
            return;
        }
        let Some(rt) = self.backend.as_ref().ok().and_then(|b| b.runtime()) else { return };
        for e in &lock(&self.state).entries {
            if let Some((_, Some(c))) = &e.graph {
                rt.release_recordings(c);
            }
        }
    }
}

impl<F> Compiled<F> {
    /// When true, a graph break is an error pointing at the user's line instead of a split.
    pub fn fullgraph(mut self, on: bool) -> Self {
        self.fullgraph = on;
        self
    }

    /// Where the captured graphs run. An unavailable backend is reported by the first call.
    pub fn backend(mut self, b: impl IntoBackend) -> Self {
        self.backend = b.into_backend().map_err(|e| e.to_string());
        self
    }

    /// When dims become symbolic (default: [`Dynamic::Auto`]).
    pub fn dynamic(mut self, policy: Dynamic) -> Self {
        self.dynamic = policy;
        self
    }

    /// How compiled graphs are launched (`Mode::ReduceOverhead`: CUDA graphs where the backend has them).
    pub fn mode(mut self, mode: crate::backend::Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Traces dim `dim` of tensor argument `arg` as symbolic from the first call, for sizes in `range`
    /// (an end past `i64::MAX`, such as `usize::MAX`, is unbounded; an empty range is an error at the
    /// first call).
    pub fn mark_dynamic(mut self, arg: usize, dim: usize, range: std::ops::RangeInclusive<usize>) -> Self {
        let start = i64::try_from(*range.start()).unwrap_or(i64::MAX);
        self.marks.insert((arg, dim), (start, i64::try_from(*range.end()).ok()));
        self
    }

    /// How many entries a function may compile before further new shapes run eagerly (default 8).
    pub fn recompile_limit(mut self, limit: usize) -> Self {
        self.recompile_limit = limit;
        self
    }

    /// Makes reaching the recompile limit an error instead of an eager fallback.
    pub fn fail_on_recompile(mut self, on: bool) -> Self {
        self.fail_on_recompile = on;
        self
    }

    /// Name of the backend graphs run on.
    pub fn backend_name(&self) -> String {
        match &self.backend {
            Ok(b) => b.name().to_string(),
            Err(e) => format!("unavailable ({e})"),
        }
    }

    /// Counters and timings so far.
    pub fn stats(&self) -> CompileStats {
        let st = lock(&self.state);
        CompileStats { entries: st.entries.len(), ..st.stats.clone() }
    }

    /// What compiling this function did so far: every entry's guards, graphs, breaks, kernels (with
    /// their sources in each registered language) and memory plan, and the recompiles with reasons.
    pub fn report(&self) -> crate::report::CompileReport {
        use crate::report::{CompileReport, EntryReport, GraphReport};
        let (entries, uncached, stats) = {
            let st = lock(&self.state);
            (st.entries.clone(), st.uncached.clone(), CompileStats { entries: st.entries.len(), ..st.stats.clone() })
        };
        let entry = |guards: Option<&Guards>, x: &Explanation| EntryReport {
            guards: guards.cloned(),
            static_args: x.static_args.clone(),
            graphs: x.graphs.iter().map(GraphReport::new).collect(),
            breaks: x.breaks.clone(),
        };
        let mut entries: Vec<EntryReport> = entries
            .iter()
            .map(|e| {
                let mut r = entry(Some(&e.guards), &e.explanation);
                // A cached entry runs one graph: the profile is of it.
                if let (Some((timing, launches)), Some(g)) = (lock(&e.profile).as_ref(), r.graphs.first_mut()) {
                    g.set_profile(timing, launches);
                }
                r
            })
            .collect();
        entries.extend(uncached.iter().map(|x| entry(None, x)));
        let backend = self.backend.as_ref().ok();
        CompileReport {
            version: crate::report::REPORT_VERSION,
            function: self.loc.clone(),
            backend: self.backend_name(),
            dynamic: self.dynamic,
            entries,
            stats,
            memory: backend.and_then(|b| b.runtime()).map(|rt| rt.memory_stats()),
        }
    }

    /// The guards of every entry, printed (newest last).
    pub fn guards(&self) -> Vec<String> {
        lock(&self.state).entries.iter().map(|e| e.guards.to_string()).collect()
    }

    /// Runs `f` on `args` — from a cached entry when its guards hold, else by tracing — and returns its
    /// result.
    pub fn call<A: Args, R: Outputs>(&self, args: A) -> Result<R>
    where
        F: Fn(A) -> Result<R>,
    {
        Ok(self.call_with(args, false, false)?.0)
    }

    /// Runs `f` on `args` like `call`, and times each kernel of the entry that serves them alone on the
    /// device first: [`Compiled::report`] then carries every kernel's device time (`device_ms`) and how
    /// it was measured. The first call with new shapes compiles (untimed), so `args` is used twice. A
    /// function whose graph breaks keep it from caching, or a backend that cannot time itself, leaves
    /// the report without times.
    pub fn profile<A: Args + Clone, R: Outputs>(&self, args: A) -> Result<R>
    where
        F: Fn(A) -> Result<R>,
    {
        let _: R = self.call(args.clone())?;
        Ok(self.call_with(args, false, true)?.0)
    }

    /// Times each launch of `e`'s compiled graph alone on these inputs, and keeps the times in `e`.
    fn profile_entry(
        &self,
        e: &Entry,
        args: &[Tensor],
        mut values: Vec<Option<Arc<Value>>>,
        backend: &dyn Backend,
    ) -> Result<()> {
        let (Some((_, Some(c))), Some(rt)) = (&e.graph, backend.runtime()) else { return Ok(()) };
        let inputs = entry_inputs(e, args, &mut values)?;
        let devs = Value::all_on(&inputs, &rt)?;
        if let Some(times) = rt.profile_graph(c, &devs)? {
            *lock(&e.profile) = Some((rt.timing(), times));
        }
        Ok(())
    }

    /// Runs `f` and returns its result with the [`Explanation`] of what was captured.
    pub fn call_explained<A: Args, R: Outputs>(&self, args: A) -> Result<(R, Explanation)>
    where
        F: Fn(A) -> Result<R>,
    {
        let (r, ex) = self.call_with(args, true, false)?;
        let mut ex = ex.unwrap_or_else(|| Explanation::inlined("", Vec::new()));
        ex.memory = self.backend.as_ref().ok().and_then(|b| b.runtime()).map(|rt| rt.memory_stats());
        Ok((r, ex))
    }

    /// A call; the explanation of a cached entry (a copy of its graphs) is made only when `explain`; a
    /// cached entry's kernels are timed first when `profile`.
    fn call_with<A: Args, R: Outputs>(&self, args: A, explain: bool, profile: bool) -> Result<(R, Option<Explanation>)>
    where
        F: Fn(A) -> Result<R>,
    {
        let backend = self
            .backend
            .clone()
            .map_err(|what| Error::Unsupported { what: format!("backend: {what}"), loc: SourceLoc::internal() })?;
        let mut visitor = ArgVisitor::default();
        args.visit(&mut visitor);
        if active().is_some() {
            // A compiled function called from inside a trace is inlined into it, as torch does.
            let r = (self.f)(args)?;
            return Ok((r, Some(Explanation::inlined(backend.name(), visitor.statics))));
        }
        lock(&self.state).stats.calls += 1;
        // Each argument's value is looked up once (a lock each) and serves the guards and the run.
        let mut values: Vec<Option<Arc<Value>>> = visitor.tensors.iter().map(Tensor::value).collect();
        let sig = signature(&visitor.tensors, &values);
        let ids: Vec<u64> = visitor.tensors.iter().map(Tensor::id).collect();
        let call = CallSignature { args: &sig, statics: &visitor.statics, backend: backend.name(), ids: &ids };
        let mut first_failure: Option<GuardFailure> = None;
        let entries: Vec<Arc<Entry>> = lock(&self.state).entries.clone();
        // A verified entry whose guards hold serves the call; else the newest unverified one is checked
        // by tracing again with these tensors.
        let mut unverified: Option<Arc<Entry>> = None;
        for e in entries.iter().rev() {
            let same_tensors = e.traced_ids == ids;
            if e.pinned.load(Ordering::Acquire) && !same_tensors {
                continue;
            }
            if let Some(f) = e.grad_failure(&visitor.tensors) {
                first_failure.get_or_insert(f);
                continue;
            }
            match e.guards.check(&call) {
                Ok(_) if !e.verified.load(Ordering::Acquire) && !same_tensors => {
                    unverified.get_or_insert_with(|| e.clone());
                }
                Ok(_) => {
                    lock(&self.state).stats.cache_hits += 1;
                    if profile {
                        self.profile_entry(e, &visitor.tensors, values.clone(), backend.as_ref())?;
                    }
                    let r = self.run_entry(e, &visitor.tensors, std::mem::take(&mut values), backend.as_ref())?;
                    let ex = explain.then(|| Explanation { cached: true, ..e.explanation.clone() });
                    return Ok((r, ex));
                }
                Err(f) => {
                    first_failure.get_or_insert(f);
                }
            }
        }
        if let Some(e) = unverified {
            lock(&self.state).stats.verifications += 1;
            return self.trace(args, visitor, backend, Some(e)).map(|(r, ex)| (r, Some(ex)));
        }
        if let Some(f) = &first_failure {
            tracing::info!(target: "kiln::recompiles", reason = %f, "recompiling");
            let mut st = lock(&self.state);
            st.stats.recompiles += 1;
            st.stats.guard_failures.push(f.reason.clone());
            if let (Dynamic::Auto, Some(a), Some(d)) = (self.dynamic, f.arg, f.dim) {
                st.promoted.insert((a, d));
                let varied: Vec<(usize, usize)> = match &st.first_dims {
                    Some(first) => first
                        .iter()
                        .zip(&sig)
                        .enumerate()
                        .filter(|(_, (was, (_, now)))| was.len() == now.len())
                        .flat_map(|(i, (was, (_, now)))| {
                            was.iter()
                                .zip(now.iter())
                                .enumerate()
                                .filter(|(_, (a, b))| a != b)
                                .map(move |(d, _)| (i, d))
                        })
                        .collect(),
                    None => Vec::new(),
                };
                st.promoted.extend(varied);
            }
            if let (true, Some(a), Some(d)) = (f.past_bound, f.arg, f.dim) {
                st.unbounded.insert((a, d));
            }
            if st.entries.len() >= self.recompile_limit {
                if self.fail_on_recompile {
                    return Err(Error::Unsupported {
                        what: format!("recompile limit {} reached ({f})", self.recompile_limit),
                        loc: SourceLoc::internal(),
                    });
                }
                if !std::mem::replace(&mut st.warned, true) {
                    tracing::warn!(target: "kiln::recompiles", limit = self.recompile_limit, reason = %f,
                        "recompile limit reached: this function now runs eagerly");
                }
                st.stats.eager_fallbacks += 1;
                drop(st);
                let r = (self.f)(args)?;
                return Ok((r, Some(Explanation::inlined(backend.name(), visitor.statics))));
            }
        }
        self.trace(args, visitor, backend, None).map(|(r, ex)| (r, Some(ex)))
    }

    /// Traces and runs `f` and returns only the explanation (like `torch._dynamo.explain`).
    pub fn explain<A: Args, R: Outputs>(&self, args: A) -> Result<Explanation>
    where
        F: Fn(A) -> Result<R>,
    {
        Ok(self.call_explained(args)?.1)
    }

    /// The dims of every argument to trace symbolically, with their ranges, under the policy. A dim the
    /// policy makes symbolic is bounded so that the entry indexes in 32 bits ([`crate::guard::index_bounds`])
    /// unless a call has already gone past such a bound; a `mark_dynamic` range is the user's.
    fn dynamic_dims(&self, dims: &[Vec<usize>]) -> Vec<Vec<Option<DimRange>>> {
        let st = lock(&self.state);
        // Per dim: marked (the user's range), policy-symbolic (to bound), or static.
        let wanted: Vec<Vec<bool>> = dims
            .iter()
            .enumerate()
            .map(|(i, dims)| {
                dims.iter()
                    .enumerate()
                    .map(|(d, &v)| {
                        // Sizes 0 and 1 are specialised: broadcasting and emptiness change what code is right.
                        let policy = match self.dynamic {
                            Dynamic::Always => true,
                            Dynamic::Never => false,
                            Dynamic::Auto => st.promoted.contains(&(i, d)),
                        };
                        !self.marks.contains_key(&(i, d)) && policy && v >= 2
                    })
                    .collect()
            })
            .collect();
        let bounded: Vec<(&[usize], Vec<bool>)> = dims
            .iter()
            .zip(&wanted)
            .enumerate()
            .map(|(i, (dims, w))| {
                (&dims[..], w.iter().enumerate().map(|(d, &w)| w && !st.unbounded.contains(&(i, d))).collect())
            })
            .collect();
        let bounds = crate::guard::index_bounds(&bounded);
        (0..dims.len())
            .map(|i| {
                (0..dims[i].len())
                    .map(|d| match self.marks.get(&(i, d)) {
                        Some(&r) => Some(r),
                        None => wanted[i][d].then_some((2, bounds[i][d])),
                    })
                    .collect()
            })
            .collect()
    }

    /// Traces and runs `f`; keeps the result as a new entry when it is one unbroken graph. With
    /// `verifying`, the trace checks that entry instead (see [`Entry`]).
    fn trace<A: Args, R: Outputs>(
        &self,
        args: A,
        visitor: ArgVisitor,
        backend: Arc<dyn Backend>,
        verifying: Option<Arc<Entry>>,
    ) -> Result<(R, Explanation)>
    where
        F: Fn(A) -> Result<R>,
    {
        let start = web_time::Instant::now();
        let tune = self.mode == crate::backend::Mode::MaxAutotune;
        let tracer = Tracer::new(TraceOptions { fullgraph: self.fullgraph, backend: backend.clone(), tune });
        // Dynamic dims get symbols; equal sizes share one (duck sizing), which the guards then require.
        let mut by_size: BTreeMap<(usize, i64, Option<i64>), crate::sym::SymId> = BTreeMap::new();
        let mut arg_guards = Vec::with_capacity(visitor.tensors.len());
        let all_dims: Vec<Vec<usize>> =
            visitor.tensors.iter().map(|t| t.shape().as_concrete().unwrap_or_default()).collect();
        lock(&self.state).first_dims.get_or_insert_with(|| all_dims.clone());
        let all_dynamic = self.dynamic_dims(&all_dims);
        if let Some(((arg, dim), (lo, hi))) = self.marks.iter().find(|(_, (lo, hi))| hi.is_some_and(|h| h < *lo)) {
            return Err(Error::InvalidArgument {
                op: "mark_dynamic".into(),
                msg: format!("input {arg} dim {dim}: the range {lo}..={} is empty", hi.unwrap_or_default()),
                loc: SourceLoc::internal(),
            });
        }
        for (i, ((t, dims), dynamic)) in visitor.tensors.iter().zip(&all_dims).zip(all_dynamic).enumerate() {
            let mut shape = Vec::with_capacity(dims.len());
            let mut guards = Vec::with_capacity(dims.len());
            for (&v, dynamic) in dims.iter().zip(&dynamic) {
                match dynamic {
                    Some((lo, hi)) => {
                        let sym = *by_size.entry((v, *lo, *hi)).or_insert_with(|| {
                            tracer.with_symbols(|t| t.new_symbol(&format!("s{}", t.len()), *lo, *hi))
                        });
                        tracer.hint(sym, v as i64);
                        shape.push(Expr::sym(sym));
                        guards.push(DimGuard::Symbol { sym, lo: *lo, hi: *hi });
                    }
                    None => {
                        shape.push(Expr::from(v));
                        guards.push(DimGuard::Static(v));
                    }
                }
            }
            let symbolic = dynamic.iter().any(Option::is_some);
            tracer.register_arg(t, i, symbolic.then_some(Shape(shape)));
            arg_guards.push(ArgGuard { dtype: t.dtype(), dims: guards });
        }
        if verifying.is_none() {
            lock(&self.state).stats.traces += 1;
        }
        let result = {
            let _active = ActiveGuard::set(tracer.clone());
            (self.f)(args)
        };
        if let Some(e) = tracer.take_break_error() {
            return Err(e);
        }
        let result = result?;
        let mut outs = Vec::new();
        let tree = result.flatten(&mut outs);
        let located = tracer.locate(&outs);
        let grad_leaves = tracer.grad_leaves();
        let grads_now: Vec<Tensor> = grad_leaves.iter().filter_map(|(_, g)| g.clone()).collect();
        let mut grads_located = tracer.locate(&grads_now).into_iter();
        let call_tensor = |t: &Tensor| match tracer.arg_index(t.id()) {
            Some(i) => CallTensor::Arg(i),
            None => CallTensor::Tensor(t.clone()),
        };
        let grad_located: Vec<_> = grad_leaves
            .into_iter()
            .map(|(leaf, now)| (call_tensor(&leaf.leaf), leaf.had_grad, now.and_then(|_| grads_located.next())))
            .collect();
        let (assigned, assigned_values): (Vec<Tensor>, Vec<Tensor>) = tracer.assignments().into_iter().unzip();
        let assign_located: Vec<(CallTensor, Located)> =
            assigned.iter().map(call_tensor).zip(tracer.locate(&assigned_values)).collect();
        tracer.flush(None)?;
        let record = tracer.finish();
        let explanation = Explanation::new(backend.name(), record.clone(), visitor.statics.clone());
        {
            let mut st = lock(&self.state);
            st.stats.trace_ms += start.elapsed().as_secs_f64() * 1e3;
            st.stats.graph_cache_hits += tracer.cache_hits();
            let (tuning_ms, tuned) = tracer.tuning();
            st.stats.tuning_ms += tuning_ms;
            st.stats.tuned_kernels += tuned;
        }
        let ids: Vec<u64> = visitor.tensors.iter().map(Tensor::id).collect();
        let mut kept = false;
        // One unbroken graph (or none) becomes an entry; a broken trace is kept for the report, replaced
        // only when its breaks differ (such a function traces on every call: no copy per call).
        let cacheable = record.breaks.is_empty() && record.graphs.len() <= 1;
        if !cacheable {
            let changed = {
                let mut st = lock(&self.state);
                let changed = st.uncached.as_ref().is_none_or(|u| u.breaks != explanation.breaks);
                if changed {
                    st.uncached = Some(explanation.clone());
                }
                changed
            };
            if changed {
                self.write_report();
            }
        }
        if cacheable {
            let graph = record.graphs.into_iter().next();
            let source = |l: &Located| match l {
                Located::Node(n) => {
                    graph.as_ref().and_then(|g| g.graph.outputs.iter().position(|o| o == n)).map(OutputSource::Graph)
                }
                Located::Arg(i) => Some(OutputSource::Arg(*i)),
                Located::Const(d) => Some(OutputSource::Const(d.clone())),
                Located::Captured(t) => Some(OutputSource::Tensor(t.clone())),
            };
            let outputs = located.iter().map(source).collect::<Option<Vec<_>>>();
            let grad_writes = grad_located
                .into_iter()
                .map(|(target, had_grad, now)| {
                    let value = match now {
                        Some(l) => Some(source(&l)?),
                        None => None,
                    };
                    Some(GradWrite { target, had_grad, value })
                })
                .collect::<Option<Vec<_>>>();
            let assign_writes =
                assign_located.into_iter().map(|(target, l)| Some((target, source(&l)?))).collect::<Option<Vec<_>>>();
            if let (Some(outputs), Some(grad_writes), Some(assign_writes)) = (outputs, grad_writes, assign_writes) {
                let inputs: Vec<InputSource> = graph
                    .as_ref()
                    .map(|g| {
                        g.graph
                            .inputs
                            .iter()
                            .zip(&g.sources)
                            .map(|(gi, src)| match (&gi.kind, src) {
                                (crate::ir::InputKind::Arg { index }, _) => InputSource::Arg(*index),
                                (_, Some(t)) => match tracer.grad_source(t.id()) {
                                    Some(leaf) => InputSource::GradOf(call_tensor(&leaf)),
                                    None => InputSource::Tensor(t.clone()),
                                },
                                (_, None) => InputSource::Arg(usize::MAX),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let captured = inputs
                    .iter()
                    .filter_map(|i| if let InputSource::Tensor(t) = i { Some(t.id()) } else { None })
                    .collect();
                let entry = Entry {
                    guards: Guards {
                        args: arg_guards,
                        statics: visitor.statics,
                        backend: backend.name().to_string(),
                        aliases: crate::guard::alias_pattern(&ids),
                        captured,
                        shape_checks: tracer.shape_checks(),
                    },
                    traced_ids: ids.clone(),
                    verified: AtomicBool::new(false),
                    pinned: AtomicBool::new(false),
                    graph: graph.map(|g| (Arc::new(g.graph), g.compiled)),
                    inputs,
                    outputs,
                    grad_writes,
                    assign_writes,
                    tree,
                    explanation: explanation.clone(),
                    profile: Mutex::new(None),
                };
                match &verifying {
                    Some(old) if old.same_program(&entry) => {
                        old.verified.store(true, Ordering::Release);
                        kept = true;
                    }
                    _ => {
                        tracing::debug!(target: "kiln::guards", guards = %entry.guards, "new entry");
                        lock(&self.state).entries.push(Arc::new(entry));
                        kept = true;
                        self.write_report();
                    }
                }
            }
        }
        if let Some(old) = verifying.filter(|old| !old.verified.load(Ordering::Acquire)) {
            // These tensors traced to another program: the old entry serves only the tensors it was
            // traced with.
            tracing::info!(target: "kiln::guards", "an entry depends on its argument identities; pinned to them");
            old.pinned.store(true, Ordering::Release);
            if !kept {
                lock(&self.state).stats.traces += 1;
            }
        }
        Ok((result, explanation))
    }

    fn run_entry<R: Outputs>(
        &self,
        e: &Entry,
        args: &[Tensor],
        mut arg_values: Vec<Option<Arc<Value>>>,
        backend: &dyn Backend,
    ) -> Result<R> {
        let (results, step) = match &e.graph {
            None => (Vec::new(), None),
            Some((graph, compiled)) => {
                let values = entry_inputs(e, args, &mut arg_values)?;
                let results = crate::backend::execute(backend, graph, compiled.as_ref(), &values, self.mode)?;
                // A call on tensors that track gradients notes itself on its results, for `backward`.
                // (Checked on borrowed tensors first: nothing is collected on a call that tracks nothing.)
                let tracks = crate::tape::tracking(e.inputs.iter().filter_map(|src| match src {
                    InputSource::Arg(i) => args.get(*i),
                    InputSource::Tensor(t) => Some(t),
                    InputSource::GradOf(_) => None,
                }));
                let step = tracks.then(|| {
                    let read: Vec<Tensor> = e
                        .inputs
                        .iter()
                        .filter_map(|src| match src {
                            InputSource::Arg(i) => args.get(*i).cloned(),
                            InputSource::Tensor(t) => Some(t.clone()),
                            InputSource::GradOf(leaf) => leaf.resolve(args).ok().and_then(Tensor::grad),
                        })
                        .collect();
                    crate::tape::step(graph.clone(), &read, &values)
                });
                (results, step.map(|s| (s, graph)))
            }
        };
        for w in &e.grad_writes {
            let grad = w.value.as_ref().map(|v| v.tensor(&results, args));
            crate::tape::set_grad(w.target.resolve(args)?, grad);
        }
        // Every value is taken before any is stored: an assignment may hand one argument's value to
        // another (a swap).
        let assigned: Vec<Option<Arc<Value>>> =
            e.assign_writes.iter().map(|(_, v)| v.tensor(&results, args).value()).collect();
        for ((target, _), value) in e.assign_writes.iter().zip(assigned) {
            if let Some(v) = value {
                target.resolve(args)?.replace_value(v);
            }
        }
        let tensors: Vec<Tensor> = e
            .outputs
            .iter()
            .map(|o| {
                let t = o.tensor(&results, args);
                if let (OutputSource::Graph(k), Some((s, graph))) = (o, &step) {
                    crate::tape::note(&t.cell, s, graph.outputs[*k]);
                }
                t
            })
            .collect();
        R::rebuild(&e.tree, &mut tensors.into_iter()).ok_or_else(|| Error::Unsupported {
            what: "a cached entry's outputs do not match the function's result type".into(),
            loc: SourceLoc::internal(),
        })
    }
}

/// The values of `e`'s graph inputs for a call: each argument's value moves out of `arg_values` (each
/// argument feeds one graph input: aliased arguments were merged when traced), else is looked up anew;
/// captured tensors give theirs.
fn entry_inputs(e: &Entry, args: &[Tensor], arg_values: &mut [Option<Arc<Value>>]) -> Result<Vec<Arc<Value>>> {
    let mut values = Vec::with_capacity(e.inputs.len());
    for src in &e.inputs {
        let v = match src {
            InputSource::Arg(i) => match arg_values.get_mut(*i) {
                Some(v) => v.take().or_else(|| args.get(*i).and_then(Tensor::value)),
                None => {
                    return Err(Error::Unsupported {
                        what: "a cached graph input has no source".into(),
                        loc: SourceLoc::internal(),
                    })
                }
            },
            InputSource::Tensor(t) => t.value(),
            InputSource::GradOf(leaf) => leaf.resolve(args)?.grad().and_then(|g| g.value()),
        };
        values.push(v.ok_or_else(|| Error::Unsupported {
            what: "a traced tensor passed to a compiled function from inside another trace".into(),
            loc: SourceLoc::internal(),
        })?);
    }
    Ok(values)
}
