//! What a compiled call captured, in a form people and tools read: the graphs, their ops, and every graph
//! break with its reason and the user's line. Its text is the compile report's (`report.rs`): one
//! structure for `explain`, `KILN_REPORT` files and the explorer.

use crate::ir::Graph;
use crate::trace::{GraphBreak, TraceRecord, TracedGraph};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The record of one traced call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// Backend the graphs ran on.
    pub backend: String,
    /// Every graph that ran, in order.
    pub graphs: Vec<TracedGraph>,
    /// Every graph break, in order.
    pub breaks: Vec<GraphBreak>,
    /// Static arguments, printed.
    pub static_args: Vec<String>,
    /// True when the call was inlined into an enclosing trace (its graphs belong to that trace), or ran
    /// eagerly past the recompile limit.
    pub inlined: bool,
    /// True when a cached entry served the call (no tracing); the graphs are the entry's.
    pub cached: bool,
    /// The device's memory after the call (in use, cached, peak, bytes moved to and from the host), on
    /// backends with a device.
    #[serde(default)]
    pub memory: Option<crate::runtime::MemoryStats>,
}

impl Explanation {
    pub(crate) fn new(backend: &str, r: TraceRecord, static_args: Vec<String>) -> Self {
        Explanation {
            backend: backend.into(),
            graphs: r.graphs,
            breaks: r.breaks,
            static_args,
            inlined: false,
            cached: false,
            memory: None,
        }
    }

    pub(crate) fn inlined(backend: &str, static_args: Vec<String>) -> Self {
        Explanation {
            backend: backend.into(),
            graphs: vec![],
            breaks: vec![],
            static_args,
            inlined: true,
            cached: false,
            memory: None,
        }
    }

    /// Number of graphs.
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }

    /// Number of graph breaks.
    pub fn break_count(&self) -> usize {
        self.breaks.len()
    }

    /// Ops over all graphs.
    pub fn op_count(&self) -> usize {
        self.graphs.iter().map(|g| g.graph.op_count()).sum()
    }

    /// The graphs alone.
    pub fn graph_list(&self) -> Vec<&Graph> {
        self.graphs.iter().map(|g| &g.graph).collect()
    }

    /// The call's capture as the compile report's entry (without kernel sources): the one structure
    /// that `explain`'s text, `KILN_REPORT` files and the explorer all read.
    pub fn report(&self) -> crate::report::EntryReport {
        crate::report::EntryReport {
            guards: None,
            static_args: self.static_args.clone(),
            graphs: self.graphs.iter().map(|g| crate::report::GraphReport::build(g, false)).collect(),
            breaks: self.breaks.clone(),
        }
    }
}

/// A summary line, the memory after the call, then the entry's text from the compile report.
impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} graph(s), {} graph break(s), {} op(s) on backend `{}`",
            self.graph_count(),
            self.break_count(),
            self.op_count(),
            self.backend
        )?;
        if let Some(m) = &self.memory {
            writeln!(
                f,
                "device memory: {} B in use, {} B cached, {} B peak; {} B uploaded, {} B downloaded since the last reset",
                m.in_use, m.cached, m.peak, m.uploaded, m.downloaded
            )?;
        }
        write!(f, "{}", self.report())?;
        Ok(())
    }
}
