//! The driver: `compile(f)` returns a callable that traces `f` on each call and runs what it captured.
//!
//! Today the pipeline is: trace (with graph breaks) → run each graph on the backend. The later stages
//! (guards → decompose → fuse → lower → plan) slot in between without changing this API.
//! The traced function must be pure in its tensor inputs and static arguments, as with `jax.jit`.

use crate::backend::{Backend, IntoBackend};
use crate::error::Result;
use crate::explain::Explanation;
use crate::trace::{active, ActiveGuard, Tensor, TraceOptions, Tracer};
use std::fmt::Debug;
use std::rc::Rc;

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

/// A compiled function. Build with [`compile`], configure with the builder methods, run with `call`.
pub struct Compiled<F> {
    f: F,
    fullgraph: bool,
    backend: Result<Rc<dyn Backend>, String>,
}

/// Wraps `f` for tracing. Nothing runs until the first call.
pub fn compile<F>(f: F) -> Compiled<F> {
    Compiled { f, fullgraph: false, backend: Ok(TraceOptions::default().backend) }
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

    /// Name of the backend graphs run on.
    pub fn backend_name(&self) -> String {
        match &self.backend {
            Ok(b) => b.name().to_string(),
            Err(e) => format!("unavailable ({e})"),
        }
    }

    /// Traces and runs `f` on `args`, returning its result.
    pub fn call<A: Args, R>(&self, args: A) -> Result<R>
    where
        F: Fn(A) -> Result<R>,
    {
        Ok(self.call_explained(args)?.0)
    }

    /// Traces and runs `f`, returning its result with the [`Explanation`] of what was captured.
    pub fn call_explained<A: Args, R>(&self, args: A) -> Result<(R, Explanation)>
    where
        F: Fn(A) -> Result<R>,
    {
        let backend = self.backend.clone().map_err(|what| crate::error::Error::Unsupported {
            what: format!("backend: {what}"),
            loc: crate::loc::SourceLoc::internal(),
        })?;
        let mut visitor = ArgVisitor::default();
        args.visit(&mut visitor);
        if active().is_some() {
            // A compiled function called from inside a trace is inlined into it, as torch does.
            let r = (self.f)(args)?;
            return Ok((r, Explanation::inlined(backend.name(), visitor.statics)));
        }
        let tracer = Tracer::new(TraceOptions { fullgraph: self.fullgraph, backend: backend.clone() });
        for (i, t) in visitor.tensors.iter().enumerate() {
            tracer.register_arg(t, i);
        }
        let result = {
            let _active = ActiveGuard::set(tracer.clone());
            (self.f)(args)
        };
        if let Some(e) = tracer.take_break_error() {
            return Err(e);
        }
        let result = result?;
        tracer.flush(None)?;
        let record = tracer.finish();
        Ok((result, Explanation::new(backend.name(), record, visitor.statics)))
    }

    /// Traces and runs `f` and returns only the explanation (like `torch._dynamo.explain`).
    pub fn explain<A: Args, R>(&self, args: A) -> Result<Explanation>
    where
        F: Fn(A) -> Result<R>,
    {
        Ok(self.call_explained(args)?.1)
    }
}
