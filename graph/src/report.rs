//! The compile report: one serialisable, versioned record of what compiling a function did — the graphs
//! it captured (every node with its op, shape, dtype and the user's line), the breaks between them, what
//! each graph decomposed into, the fused regions and the kernels they became (with each kernel's source
//! in every registered language, the user lines it came from, its launch and its traffic), the memory
//! plan, the guards of each cached entry, the recompiles and their reasons, and the phase timings.
//!
//! It is the one place the explorer app, `KILN_REPORT` files and tools read (as torch's structured trace
//! is for tlparse): built from the compiled function's own state, never re-derived elsewhere. Kernel
//! sources come from renderers the lowering crates register ([`register_renderer`]); `graph` knows no
//! language itself.

use crate::compile::CompileStats;
use crate::error::{Error, Result};
use crate::fuse::RegionKind;
use crate::ir::Graph;
use crate::kernel::{Access, Kernel};
use crate::loc::SourceLoc;
use crate::pipeline::CompiledGraph;
use crate::trace::GraphBreak;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::RwLock;

/// The report format this build writes and reads.
pub const REPORT_VERSION: u32 = 1;

/// Everything one compiled function did so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompileReport {
    /// [`REPORT_VERSION`] when written.
    pub version: u32,
    /// Where the function was compiled (the `compile(..)` call).
    pub function: SourceLoc,
    /// The backend it runs on.
    pub backend: String,
    /// Each cached entry (one per guard set), oldest first, then the trace of a function whose graph breaks keep it uncached, if any.
    pub entries: Vec<EntryReport>,
    /// When dims become symbolic (`auto`, `always`, `never`).
    pub dynamic: crate::guard::Dynamic,
    /// Calls, traces, cache hits, recompiles and their reasons.
    pub stats: CompileStats,
    /// The device's memory when the report was made, on backends with a device.
    pub memory: Option<crate::runtime::MemoryStats>,
}

/// One cached entry — the guards it runs under and what its trace captured — or, for a function with
/// graph breaks (traced on every call, each graph compiled once), its latest trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryReport {
    /// Its guards; `None` for the trace of a function whose graph breaks keep it from caching.
    pub guards: Option<crate::guard::Guards>,
    /// Static arguments, printed.
    pub static_args: Vec<String>,
    /// Its graphs, in the order they ran (more than one when the function has graph breaks).
    pub graphs: Vec<GraphReport>,
    /// Every graph break of its trace, in order.
    pub breaks: Vec<GraphBreak>,
}

/// One captured graph and what compiling it made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphReport {
    /// The graph as captured: nodes with op, attributes, shape, dtype and the user's line.
    pub captured: Graph,
    /// The break that ended it (`None` for the graph that ran at the function's return).
    pub ended_by: Option<GraphBreak>,
    /// Which level of the compile cache (memory, disk) served its compilation, when one did.
    #[serde(default)]
    pub cache_level: Option<crate::cache::CacheLevel>,
    /// Decomposition (with each node's origin), regions, kernels, memory plan and phase timings; `None`
    /// on the CPU reference, which runs graphs without compiling them.
    pub compiled: Option<CompiledGraph>,
    /// One per kernel, in launch order.
    pub kernels: Vec<KernelReport>,
    /// How the kernels' `device_ms` were measured (`CUDA events`, `timestamp queries`, …), when this
    /// graph was profiled ([`crate::compile::Compiled::profile`]).
    #[serde(default)]
    pub profiled_with: Option<String>,
    /// For each backward joined to the graph, what its partitioner chose to read and to compute again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<crate::remat::Partition>,
}

/// One kernel, as a person inspects it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelReport {
    /// Its name (what it fuses).
    pub name: String,
    /// Pointwise, rows, matmul template or library GEMM.
    pub kind: String,
    /// The captured graph's nodes it computes (through the decomposition's origin map), ascending.
    pub nodes: Vec<usize>,
    /// The user's lines those nodes came from, in order of first appearance.
    pub lines: Vec<SourceLoc>,
    /// Threads per workgroup.
    pub threads: u32,
    /// Workgroups, as an expression of the shape symbols.
    pub groups: String,
    /// Bytes it reads and writes (expressions of the shape symbols; plain numbers for static shapes).
    pub bytes_read: String,
    /// See `bytes_read`.
    pub bytes_written: String,
    /// Statements of its kernel IR.
    pub statements: usize,
    /// Its source in each registered language (WGSL, PTX, …), or why it could not be rendered.
    pub sources: Vec<KernelSource>,
    /// Its device time in one run, ms, when the graph was profiled (every launch of it added up).
    #[serde(default)]
    pub device_ms: Option<f64>,
}

/// What [`CompileReport::try_shapes`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeVerdict {
    /// The cached entry the call would run, if any.
    pub runs: Option<usize>,
    /// The symbol values that entry would bind (`s0 = 8`).
    pub bound: Vec<String>,
    /// Each entry checked before, and the guard that failed.
    pub reasons: Vec<(usize, String)>,
    /// Under `Dynamic::Auto`, the `(argument, dim)` the recompile would make symbolic.
    pub becomes_symbolic: Option<(usize, usize)>,
}

impl std::fmt::Display for ShapeVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.runs {
            Some(i) if self.bound.is_empty() => write!(f, "runs entry {i} (no symbolic dims)"),
            Some(i) => write!(f, "runs entry {i} with {}", self.bound.join(", ")),
            None => {
                write!(f, "recompiles")?;
                if let Some((_, why)) = self.reasons.first() {
                    write!(f, ": {why}")?;
                }
                if let Some((a, d)) = self.becomes_symbolic {
                    write!(f, "; input {a} dim {d} becomes symbolic (Dynamic::Auto)")?;
                }
                Ok(())
            }
        }
    }
}

impl EntryReport {
    /// Whether this is a cached entry (else the trace of a function with graph breaks).
    pub fn cached(&self) -> bool {
        self.guards.is_some()
    }

    /// Its guards, one per line (argument dtypes and dims — symbolic ones named —, statics, aliasing,
    /// shape checks); none when not cached.
    pub fn guard_lines(&self) -> Vec<String> {
        self.guards.as_ref().map(|g| g.to_string().lines().map(str::to_string).collect()).unwrap_or_default()
    }
}

/// One rendering of a kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelSource {
    /// The language (`wgsl`, `ptx`).
    pub language: String,
    /// The source, or the renderer's error.
    pub text: std::result::Result<String, String>,
}

/// Renders one kernel in one language.
pub type Renderer = fn(&Kernel) -> std::result::Result<String, String>;

static RENDERERS: RwLock<Vec<(&'static str, Renderer)>> = RwLock::new(Vec::new());

/// Makes reports carry each kernel's source in `language` (a lowering crate's renderer; registering a
/// language again replaces its renderer).
pub fn register_renderer(language: &'static str, render: Renderer) {
    let mut r = RENDERERS.write().unwrap_or_else(|e| e.into_inner());
    r.retain(|(l, _)| *l != language);
    r.push((language, render));
}

/// The languages reports render kernels in.
pub fn languages() -> Vec<&'static str> {
    RENDERERS.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(l, _)| *l).collect()
}

impl KernelReport {
    /// The report of kernel `k` of `c`, whose graph was captured as `captured`.
    pub fn new(c: &CompiledGraph, k: usize, captured: &Graph) -> KernelReport {
        KernelReport::build(c, k, captured, true)
    }

    fn build(c: &CompiledGraph, k: usize, captured: &Graph, sources: bool) -> KernelReport {
        let kernel = &c.kernels[k];
        let region = c.fusion.regions.get(k);
        let members = region.map_or(&[][..], |r| &r.members[..]);
        let nodes: BTreeSet<usize> =
            members.iter().filter_map(|m| c.primitive.origin.get(m.0 as usize)).map(|o| o.0 as usize).collect();
        let mut lines: Vec<SourceLoc> = Vec::new();
        for n in &nodes {
            if let Some(node) = captured.nodes.get(*n) {
                if !lines.contains(&node.loc) {
                    lines.push(node.loc.clone());
                }
            }
        }
        let traffic = |access: Access| {
            let total = kernel
                .buffers
                .iter()
                .filter(|b| b.access == access)
                .map(|b| b.len.clone() * crate::sym::Expr::from(b.dtype.size_bytes()))
                .fold(crate::sym::Expr::from(0i64), |a, b| a + b);
            total.to_string()
        };
        // A kernel that runs inside another's launch has no code of its own.
        let renderers = if sources && kernel.launched_in.is_none() {
            RENDERERS.read().unwrap_or_else(|e| e.into_inner()).clone()
        } else {
            Vec::new()
        };
        KernelReport {
            name: kernel.name.clone(),
            kind: match (&kernel.launched_in, kernel.parts.len()) {
                (Some(host), _) => format!("part of {host}"),
                (None, n) if n > 0 => format!("{n} kernels, one launch"),
                _ => region.map_or_else(|| "kernel".into(), |r| kind_name(&r.kind, kernel).into()),
            },
            nodes: nodes.into_iter().collect(),
            lines,
            threads: kernel.launch.threads,
            groups: kernel.launch.groups.to_string(),
            bytes_read: traffic(Access::Read),
            bytes_written: traffic(Access::Write),
            statements: kernel.stmt_count(),
            sources: renderers
                .iter()
                .map(|(language, render)| KernelSource { language: (*language).into(), text: render(kernel) })
                .collect(),
            device_ms: None,
        }
    }

    /// The source in `language`, when rendered.
    pub fn source(&self, language: &str) -> Option<&str> {
        self.sources.iter().find(|s| s.language == language).and_then(|s| s.text.as_deref().ok())
    }
}

fn kind_name(kind: &RegionKind, kernel: &Kernel) -> &'static str {
    match kind {
        RegionKind::Pointwise => "pointwise",
        RegionKind::Rows { .. } => "rows",
        RegionKind::MatMul { .. } if kernel.gemm().is_some() => "library gemm",
        RegionKind::MatMul { .. } => "matmul",
        RegionKind::Attention { .. } => "attention",
        RegionKind::Collective => "all-reduce",
    }
}

impl GraphReport {
    /// The report of one traced graph.
    pub fn new(t: &crate::trace::TracedGraph) -> GraphReport {
        GraphReport::build(t, true)
    }

    /// The report of one traced graph, its kernels rendered in every registered language when `sources`
    /// (the text form, which prints no sources, skips that work).
    pub fn build(t: &crate::trace::TracedGraph, sources: bool) -> GraphReport {
        let compiled = t.compiled.as_deref().cloned();
        let kernels = compiled
            .as_ref()
            .map(|c| (0..c.kernels.len()).map(|k| KernelReport::build(c, k, &t.graph, sources)).collect())
            .unwrap_or_default();
        GraphReport {
            captured: t.graph.clone(),
            ended_by: t.ended_by.clone(),
            cache_level: t.cache_level,
            compiled,
            kernels,
            profiled_with: None,
            partitions: t.partitions.clone(),
        }
    }

    /// Notes a profiled run's launch times on the kernels they ran (`timing`: how they were measured).
    pub fn set_profile(&mut self, timing: &str, launches: &[crate::runtime::LaunchTime]) {
        for k in &mut self.kernels {
            k.device_ms = None;
        }
        for l in launches {
            if let Some(k) = self.kernels.get_mut(l.kernel) {
                *k.device_ms.get_or_insert(0.0) += l.ms;
            }
        }
        self.profiled_with = Some(timing.into());
    }

    /// The profiled device time of all its kernels, ms (`None` when not profiled).
    pub fn device_ms(&self) -> Option<f64> {
        self.profiled_with.as_ref()?;
        Some(self.kernels.iter().filter_map(|k| k.device_ms).sum())
    }
}

impl CompileReport {
    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serialises")
    }

    /// A report read back; a malformed text or another version is a typed error, never a panic.
    pub fn from_json(text: &str) -> Result<CompileReport> {
        let bad = |msg: String| Error::Format { what: "compile report".into(), msg };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        match v.get("version").and_then(|v| v.as_u64()) {
            Some(n) if n == u64::from(REPORT_VERSION) => {}
            Some(n) => return Err(bad(format!("version {n}; this build of kiln reads version {REPORT_VERSION}"))),
            None => return Err(bad("no `version` field: not a kiln compile report".into())),
        }
        serde_json::from_value(v).map_err(|e| bad(e.to_string()))
    }

    /// What a call with argument shapes `dims` would do: run a cached entry (which, with the symbol
    /// values it binds), or trace again — with the first entry's failing guard as the reason, and under
    /// `Dynamic::Auto` the dim that would become symbolic.
    pub fn try_shapes(&self, dims: &[Vec<usize>]) -> ShapeVerdict {
        let mut reasons: Vec<(usize, String)> = Vec::new();
        let mut first_dim = None;
        for (i, e) in self.entries.iter().enumerate() {
            let Some(g) = &e.guards else { continue };
            match g.check_dims(dims) {
                Ok(b) => {
                    let bound: Vec<String> = b.iter().map(|(s, v)| format!("{s} = {v}")).collect();
                    return ShapeVerdict { runs: Some(i), bound, reasons, becomes_symbolic: None };
                }
                Err(f) => {
                    if reasons.is_empty() {
                        first_dim = f.arg.zip(f.dim);
                    }
                    reasons.push((i, f.reason));
                }
            }
        }
        let becomes_symbolic = if self.dynamic == crate::guard::Dynamic::Auto { first_dim } else { None };
        ShapeVerdict { runs: None, bound: Vec::new(), reasons, becomes_symbolic }
    }

    /// Kernels over every entry and graph.
    pub fn kernel_count(&self) -> usize {
        self.entries.iter().flat_map(|e| &e.graphs).map(|g| g.kernels.len()).sum()
    }

    /// Writes the report into `dir` as `<file>-<line>.json` of the `compile(..)` call (creating `dir`).
    pub fn write_to(&self, dir: &std::path::Path) -> Result<std::path::PathBuf> {
        let bad = |e: std::io::Error| Error::Format {
            what: format!("compile report in {}", dir.display()),
            msg: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(bad)?;
        let stem: String =
            self.function.file.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let path = dir.join(format!("{stem}-{}.json", self.function.line));
        std::fs::write(&path, self.to_json()).map_err(bad)?;
        Ok(path)
    }
}

/// The text form `explain` prints: the graph's ops, what compiling it made, its profile and its break.
impl std::fmt::Display for GraphReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = &self.captured;
        let hist: Vec<String> = g.op_histogram().iter().map(|(n, c)| format!("{n}×{c}")).collect();
        let hit = self.cache_level.map_or(String::new(), |level| format!(" (compile served from the {level} cache)"));
        writeln!(f, "{} op(s) [{}]{hit}", g.op_count(), hist.join(", "))?;
        for line in g.to_string().lines() {
            writeln!(f, "    {line}")?;
        }
        if let Some(c) = &self.compiled {
            for line in c.to_string().lines() {
                writeln!(f, "  {line}")?;
            }
        }
        if let (Some(timing), Some(total)) = (&self.profiled_with, self.device_ms()) {
            writeln!(f, "  profile ({timing}): {total:.4} ms over {} kernel(s)", self.kernels.len())?;
            for k in &self.kernels {
                if let Some(ms) = k.device_ms {
                    let share = if total > 0.0 { 100.0 * ms / total } else { 0.0 };
                    writeln!(f, "    {:>10.4} ms {share:>5.1}%  {}", ms, k.name)?;
                }
            }
        }
        for p in &self.partitions {
            writeln!(f, "  {p}")?;
        }
        if let Some(b) = &self.ended_by {
            writeln!(f, "  ended by a graph break at {}: {}", b.loc, b.reason)?;
        }
        Ok(())
    }
}

/// The text form of one entry: its guards (when cached), static arguments, graphs and breaks.
impl std::fmt::Display for EntryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(g) = &self.guards {
            writeln!(f, "guards: {g}")?;
        }
        if !self.static_args.is_empty() {
            writeln!(f, "static arguments: {}", self.static_args.join(", "))?;
        }
        for (i, g) in self.graphs.iter().enumerate() {
            write!(f, "\ngraph {i}: {g}")?;
        }
        if !self.breaks.is_empty() {
            writeln!(f, "\ngraph breaks:")?;
            for (i, b) in self.breaks.iter().enumerate() {
                writeln!(f, "  {}. {} — {}", i + 1, b.loc, b.reason)?;
            }
        }
        Ok(())
    }
}
