//! The compiler pipeline for one captured graph, as one short function: decompose → fuse → lower →
//! plan. Backends that run kernels (the kernel interpreter now; wgpu and CUDA next) take its result and
//! only render and launch.

use crate::data::TensorData;
use crate::decompose::Decomposed;
use crate::error::{Error, Result};
use crate::fuse::{fuse, Feedback, Fusion, FusionMode, Region, RegionKind};
use crate::interp::bind_symbols;
use crate::ir::{Graph, NodeId};
use crate::kernel::{Access, Kernel};
use crate::loc::SourceLoc;
use crate::lower::{lower, LowerFailure};
use crate::plan::{plan, Plan};
use crate::target::Target;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use web_time::Instant;

/// Milliseconds each stage of compiling one graph took.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PhaseTimes {
    /// Decomposition and dead-node pruning.
    pub decompose_ms: f64,
    /// Scheduling into regions (summed over rescheduling rounds).
    pub fuse_ms: f64,
    /// Regions to kernels.
    pub lower_ms: f64,
    /// The memory plan.
    pub plan_ms: f64,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// The members of a matmul region that its product `node` reads, through layout views and other
/// members: its prologue (`fuse`'s `absorb_prologue`), not the epilogue after it.
fn prologue(g: &Graph, members: &[NodeId], node: NodeId) -> BTreeSet<NodeId> {
    let (mut found, mut seen) = (BTreeSet::new(), BTreeSet::new());
    let mut stack = g.node(node).inputs.clone();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) {
            continue;
        }
        let member = members.contains(&x);
        if member {
            found.insert(x);
        }
        if member || crate::fuse::role(g, x) == crate::fuse::Role::Transparent {
            stack.extend(g.node(x).inputs.iter().copied());
        }
    }
    found
}

/// Whether node `n` reads, through layout views, a value `assembly` places in the family of `root`.
fn reads_root(g: &Graph, n: NodeId, assembly: &crate::in_place::Assembly, root: NodeId) -> bool {
    let mut stack = g.node(n).inputs.clone();
    let mut seen = BTreeSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) {
            continue;
        }
        if assembly.home.get(&x).is_some_and(|(r, _)| *r == root) {
            return true;
        }
        if crate::fuse::role(g, x) == crate::fuse::Role::Transparent {
            stack.extend(g.node(x).inputs.iter().copied());
        }
    }
    false
}

/// Everything compiling one graph produced.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CompiledGraph {
    /// The graph after decomposition, with each node's user-level origin.
    pub primitive: Decomposed,
    /// The regions, in launch order.
    pub fusion: Fusion,
    /// One kernel per region.
    pub kernels: Vec<Kernel>,
    /// Buffers and launch order.
    pub plan: Plan,
    /// What it was compiled for.
    pub target: Target,
    /// How long each stage took when it was compiled (not when loaded from a cache).
    #[serde(default)]
    pub timings: PhaseTimes,
    /// Each kernel's structural id, computed once (see [`CompiledGraph::kernel_ids`]).
    #[serde(skip)]
    ids: std::sync::OnceLock<Vec<u64>>,
}

/// Compiles `graph` for `target`, fusing everything the policy allows.
pub fn compile_graph(graph: &Graph, target: &Target) -> Result<CompiledGraph> {
    compile_graph_with(graph, target, FusionMode::Fused)
}

/// [`compile_graph_with`] through the compile cache: structurally equal graphs compile once, in memory
/// and across runs (see `cache`).
pub fn compile_cached(graph: &Graph, target: &Target, mode: FusionMode) -> Result<std::sync::Arc<CompiledGraph>> {
    let key = crate::cache::key(graph, target, mode);
    let c = crate::cache::get_or_compile(&key, || compile_graph_with(graph, target, mode))?;
    Ok(with_locations_of(c, graph))
}

/// A cached compile of a structurally equal graph carries the source lines of whichever graph compiled
/// first; errors and reports must name *this* graph's lines, so they are copied over (through the
/// origin map) when they differ.
fn with_locations_of(c: std::sync::Arc<CompiledGraph>, graph: &Graph) -> std::sync::Arc<CompiledGraph> {
    let loc_of = |i: usize| graph.nodes.get(c.primitive.origin[i].index()).map(|n| &n.loc);
    let same =
        (0..c.primitive.graph.nodes.len()).all(|i| loc_of(i).is_none_or(|l| *l == c.primitive.graph.nodes[i].loc));
    if same {
        return c;
    }
    let mut patched = (*c).clone();
    for i in 0..patched.primitive.graph.nodes.len() {
        if let Some(l) = loc_of(i) {
            patched.primitive.graph.nodes[i].loc = l.clone();
        }
    }
    std::sync::Arc::new(patched)
}

/// Compiles `graph` for `target` with the given fusion mode (`PerOp`: the eager baseline).
pub fn compile_graph_with(graph: &Graph, target: &Target, mode: FusionMode) -> Result<CompiledGraph> {
    target.check_dtypes(graph)?;
    let mut timings = PhaseTimes::default();
    let clock = Instant::now();
    // The eager baseline runs each op as the user wrote it, attention included.
    // Reductions split for the device in both modes: an eager sum is one user op however many passes
    // it takes, as PyTorch's eager kernels are.
    let attentions = crate::decompose::Attentions::For { target, fuse: mode == FusionMode::Fused };
    let mut decomposed = crate::decompose::decompose_for(graph, attentions, true)?;
    if !target.collectives {
        // A process on this device is a world of one: each all-reduce is its input, renamed.
        for n in decomposed.graph.nodes.iter_mut().filter(|n| matches!(n.op, crate::ir::Op::AllReduce { .. })) {
            n.op = crate::ir::Op::Reshape;
        }
    }
    // Tracing records every op the user ran; only what an output needs is compiled.
    let (mut live, kept) = decomposed.graph.without_dead_nodes();
    let mut origin: Vec<NodeId> = kept.iter().map(|k| decomposed.origin[k.index()]).collect();
    // An output that is an input (a saved or minimized graph can return one) is written by a copy into
    // a buffer of its own: a kernel storing a value into the buffer it loads it from binds one buffer
    // as both read and write, which devices reject.
    for k in 0..live.outputs.len() {
        let o = live.outputs[k];
        if matches!(live.node(o).op, crate::ir::Op::Input { .. }) {
            let mut copy = live.node(o).clone();
            copy.op = crate::ir::Op::Reshape;
            copy.inputs = vec![o];
            live.outputs[k] = live.push(copy);
            origin.push(origin[o.index()]);
        }
    }
    // A product making too few workgroups over a long depth runs as partial products (`split_k`); the
    // eager baseline runs the user's product as one kernel.
    let (live, origin) = match mode {
        FusionMode::Fused => crate::split_k::split_products(&live, &origin, target),
        FusionMode::PerOp => (live, origin),
    };
    // A device that binds few buffers cannot read a wide concatenation's sources in one kernel.
    let (live, origin, inner) =
        crate::fan_in::split_wide_concats(&live, &origin, crate::fan_in::concat_fan_in(target.max_bindings));
    // Concatenations of products along an inner axis become outermost ones their parts can be written into.
    let (live, origin, inner, copies) = match mode {
        FusionMode::Fused => crate::in_place::outermost(&live, &origin, &inner, target),
        FusionMode::PerOp => (live, origin, inner, BTreeSet::new()),
    };
    let primitive = Decomposed { graph: live, origin };
    // Kernels are named for the user's ops; a fused attention is named for itself (its origin is the
    // final matmul of the written-out form).
    let names: Vec<String> = (primitive.origin.iter().zip(&primitive.graph.nodes))
        .map(|(&o, n)| match n.op {
            ref op @ (crate::ir::Op::Attention { .. }
            | crate::ir::Op::AttentionLse { .. }
            | crate::ir::Op::AttentionGrad { .. }) => op.name().to_string(),
            _ => graph.node(o).op.name().to_string(),
        })
        .collect();
    timings.decompose_ms = ms(clock);
    let tf32 = crate::gemm::tf32_products(&primitive.graph, &primitive.origin, graph, target);
    let mut feedback = Feedback { materialized: inner, ..Feedback::default() };
    feedback.materialized.extend(copies.iter().copied());
    feedback.kept = copies;
    feedback.materialized.extend(crate::attention::stored_permutes(&primitive.graph));
    if mode == FusionMode::PerOp {
        // The eager baseline runs a conversion the user wrote as its own kernel, as PyTorch's eager mode
        // does; compiled code computes it in its readers (`fuse::widens`).
        let g = &primitive.graph;
        feedback
            .materialized
            .extend((0..g.nodes.len() as u32).map(NodeId).filter(|&n| crate::fuse::widens(g, g.node(n))));
    }
    feedback.materialized = crate::lower::library_views_to_store(&primitive.graph, target, &feedback.materialized);
    {
        // A collective reads its input as one contiguous run: any other view of it is stored first.
        let g = &primitive.graph;
        let transparent =
            |n| crate::fuse::role(g, n) == crate::fuse::Role::Transparent && !feedback.materialized.contains(&n);
        let views = crate::bucket::views_to_store(g, transparent);
        feedback.materialized.extend(views);
    }
    let mut lowered = Lowered::default();
    // Families of assembled concatenations some kernel binds in conflict (see `Assembly::conflict`).
    let mut unassembled = BTreeSet::new();
    loop {
        let per_op = (mode == FusionMode::PerOp).then_some(primitive.origin.as_slice());
        let clock = Instant::now();
        let fusion = fuse(&primitive.graph, &names, target, &feedback, per_op)?;
        let assembly = match mode {
            FusionMode::Fused => {
                crate::in_place::assemble(&primitive.graph, &fusion, &feedback.materialized, &unassembled, target)
            }
            FusionMode::PerOp => Default::default(),
        };
        // Kernels read an assembled concatenation from its buffer, as they read a stored copy.
        let mut stored_views = feedback.materialized.clone();
        stored_views.extend(assembly.concats(&primitive.graph));
        timings.fuse_ms += ms(clock);
        let clock = Instant::now();
        // Every region is lowered even after one fails, so one more round schedules around all the
        // failures at once: a backward graph has dozens, and a round each made compiling quadratic.
        let mut kernels = Vec::with_capacity(fusion.regions.len());
        let mut failures = Vec::new();
        for r in &fusion.regions {
            match lowered.reuse(r, &stored_views) {
                Some(k) => kernels.push(k),
                None => match lower(&primitive.graph, r, target, &stored_views, &tf32) {
                    (Ok(k), asked) => {
                        lowered.keep(r, &k, asked, &stored_views);
                        kernels.push(k);
                    }
                    (Err(f), _) => failures.push(f),
                },
            }
        }
        timings.lower_ms += ms(clock);
        if let Some((root, k)) = failures.is_empty().then(|| assembly.conflict(&kernels)).flatten() {
            // A product that reads the family through its prologue (the members it reads) and writes a
            // part of it reads its operands stored instead; otherwise the family is kept apart. Each round
            // takes one of those steps, so the rounds end.
            if let Some(&RegionKind::MatMul { node }) = fusion.regions.get(k).map(|r| &r.kind) {
                let prologue = prologue(&primitive.graph, &fusion.regions[k].members, node);
                let reads_family = prologue.into_iter().any(|p| reads_root(&primitive.graph, p, &assembly, root));
                if reads_family && feedback.whole_operands.insert(node) {
                    continue;
                }
            }
            if unassembled.insert(root) {
                continue;
            }
            return Err(Error::Unsupported {
                what: format!("assembling {root} in place: a kernel binds its buffer twice after it was kept apart"),
                loc: SourceLoc::internal(),
            });
        }
        if failures.is_empty() {
            if mode == FusionMode::Fused {
                // Launch-bound kernels nothing between them depends on share a launch (the eager
                // baseline launches each op, as PyTorch's eager mode does).
                let assembled: BTreeSet<NodeId> = assembly.home.keys().copied().collect();
                crate::combine::combine(&mut kernels, target, &assembled);
            }
            for k in &kernels {
                crate::validate::validate(k, target).map_err(|e| Error::Unsupported {
                    what: crate::error::rejected_source(&k.name, "the kernel-IR validator", &e.rule, &k.to_string()),
                    loc: SourceLoc::internal(),
                })?;
            }
            let clock = Instant::now();
            let plan = plan(&primitive.graph, &kernels, &assembly);
            crate::plan::reads_disjoint_from_writes(&kernels, &plan).map_err(|e| Error::Unsupported {
                what: format!("the memory plan: {e}"),
                loc: SourceLoc::internal(),
            })?;
            timings.plan_ms = ms(clock);
            tracing::debug!(target: "kiln::fusion", kernels = kernels.len(), ?timings, "compiled graph");
            for k in &kernels {
                tracing::debug!(target: "kiln::output_code", kernel = %k.name, "\n{k}");
            }
            return Ok(CompiledGraph {
                primitive,
                fusion,
                kernels,
                plan,
                target: target.clone(),
                timings,
                ids: Default::default(),
            });
        }
        let mut progressed = false;
        for f in &failures {
            progressed |= match *f {
                // Lowering found a member reading a reduction at another row: schedule again without it.
                LowerFailure::Refuse(n) => feedback.refused.insert(n),
                // A GEMM library cannot read this view in place: store it first.
                LowerFailure::Materialize(n) => feedback.materialized.insert(n),
            };
        }
        if !progressed {
            let (n, what) = match failures[0] {
                LowerFailure::Refuse(n) => (n, "lowering refused it twice"),
                LowerFailure::Materialize(n) => (n, "materialising it did not help"),
            };
            return Err(Error::Unsupported {
                what: format!("scheduling {n} ({}): {what}", primitive.graph.node(n).op.name()),
                loc: primitive.graph.node(n).loc.clone(),
            });
        }
    }
}

impl CompiledGraph {
    /// The shape-symbol values that `inputs` give (and a check that they fit the graph's inputs).
    pub fn bindings(&self, inputs: &[&TensorData]) -> Result<crate::sym::Bindings> {
        bind_symbols(&self.primitive.graph, inputs)
    }

    /// Each graph output's plan buffer, dims and dtype under `bindings` (what a runtime reads back).
    pub fn output_slots(&self, bindings: &crate::sym::Bindings) -> Result<Vec<(usize, Vec<usize>, crate::DType)>> {
        let g = &self.primitive.graph;
        g.outputs
            .iter()
            .map(|o| {
                let b = *self.plan.value_buffer.get(o).ok_or_else(|| Error::Unsupported {
                    what: format!("output {o} was not written by any kernel"),
                    loc: SourceLoc::internal(),
                })?;
                let node = g.node(*o);
                Ok((b, node.shape.eval(bindings)?, node.dtype))
            })
            .collect()
    }

    /// Device bytes for each plan buffer under `bindings`: the widest value placed in it, in the device's
    /// layout (`bytes(dtype, elements)`), rounded up to 16 so vector accesses stay inside it.
    pub fn buffer_bytes(
        &self,
        bindings: &crate::sym::Bindings,
        bytes: impl Fn(crate::DType, usize) -> u64,
    ) -> Result<Vec<u64>> {
        let g = &self.primitive.graph;
        let mut sizes = vec![16u64; self.plan.buffers.len()];
        let mut place = |node: NodeId, dtype, len: usize| -> Result<()> {
            let b = *self.plan.value_buffer.get(&node).ok_or_else(|| Error::Unsupported {
                what: format!("{node} has no buffer"),
                loc: SourceLoc::internal(),
            })?;
            // A value placed at an offset keeps at least one element of room past it, so even an empty
            // part binds a window inside its buffer.
            let (offset, len) = match self.plan.value_offset.get(&node) {
                Some(o) => (o.eval(bindings)?.max(0) as usize, len.max(1)),
                None => (0, len),
            };
            sizes[b] = sizes[b].max(bytes(dtype, offset + len).div_ceil(16) * 16);
            Ok(())
        };
        for gi in &g.inputs {
            let n = g.node(gi.node);
            place(gi.node, n.dtype, n.shape.eval(bindings)?.iter().product())?;
        }
        for k in &self.kernels {
            for b in &k.buffers {
                place(b.node, b.dtype, b.len.eval(bindings)?.max(0) as usize)?;
            }
        }
        Ok(sizes)
    }

    /// The plan buffer of each graph input, in input order (where a runtime uploads them).
    pub fn input_buffers(&self) -> Vec<usize> {
        self.primitive.graph.inputs.iter().map(|gi| self.plan.value_buffer[&gi.node]).collect()
    }

    /// Bytes the computation itself must move: its inputs read once, its outputs written once. Achieved
    /// bandwidth is quoted against this, as for any implementation.
    pub fn io_bytes(&self, bindings: &crate::sym::Bindings) -> Result<u64> {
        let g = &self.primitive.graph;
        let nodes = g.inputs.iter().map(|gi| gi.node).chain(g.outputs.iter().copied());
        let mut total = 0u64;
        for n in nodes {
            let node = g.node(n);
            total += (node.shape.eval(bindings)?.iter().product::<usize>() * node.dtype.size_bytes()) as u64;
        }
        Ok(total)
    }

    /// Bytes every kernel reads and writes per run (intermediates included).
    pub fn traffic_bytes(&self, bindings: &crate::sym::Bindings) -> Result<u64> {
        let mut total = 0u64;
        for k in &self.kernels {
            for b in &k.buffers {
                total += b.len.eval(bindings)?.max(0) as u64 * b.dtype.size_bytes() as u64;
            }
        }
        Ok(total)
    }

    /// Runs the kernels on the CPU kernel interpreter (through the runtime core, on a host-memory device
    /// of this graph's target), host data in and out.
    pub fn run_interpreted(&self, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        let rt = crate::KernelInterpreter::new(self.target.clone()).runtime();
        rt.run_host(&std::sync::Arc::new(self.clone()), inputs)
    }

    /// The error a kernel's fault word stands for (`Ok` for 0): the failed check's op and message, at the
    /// user's line that recorded the op. Every runtime reads the word after a run and calls this.
    pub fn check_fault(&self, kernel: usize, word: u32) -> Result<()> {
        if word == 0 {
            return Ok(());
        }
        let k = &self.kernels[kernel];
        let Some(site) = k.faults.get(word as usize - 1) else {
            return Err(Error::Unsupported {
                what: format!("kernel {} reported fault word {word}, which it does not define", k.name),
                loc: SourceLoc::internal(),
            });
        };
        let loc = self.primitive.graph.nodes.get(site.node.index()).map_or_else(SourceLoc::internal, |n| n.loc.clone());
        Err(Error::Runtime { op: site.op.clone(), msg: format!("{} (kernel {})", site.msg, k.name), loc })
    }

    /// This graph with other kernels of the same regions (other schedules of each: `tune`).
    pub(crate) fn with_kernels(&self, kernels: Vec<crate::kernel::Kernel>) -> CompiledGraph {
        CompiledGraph { kernels, ids: std::sync::OnceLock::new(), ..self.clone() }
    }

    /// Each kernel's structural id: a hash of the kernel IR (which already names its target's choices),
    /// computed once per compiled graph. Runtimes key loaded modules on it, so equal kernels render and
    /// load once however many graphs hold them — and however many layers of one graph: a model's four
    /// blocks are four copies of each kernel, one module each (W5's training step: 134 generated kernels,
    /// 23 modules; a cold compile assembled all 134).
    pub fn kernel_ids(&self) -> &[u64] {
        self.ids.get_or_init(|| {
            self.kernels
                .iter()
                .map(|k| {
                    // The name is for people, and the graph values a kernel's buffers hold and its checks
                    // report are for the plan and the error message: none is in the module's code, so two
                    // kernels that differ only in them are one module.
                    let anonymous = anonymous(k);
                    let text = serde_json::to_string(&anonymous).unwrap_or_default();
                    let h = blake3::hash(text.as_bytes());
                    u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap_or_default())
                })
                .collect()
        })
    }

    /// Kernels with run-time checks, in launch order: `(position in plan.launches, kernel)`. A runtime
    /// binds one fault word to each.
    pub fn checked_launches(&self) -> Vec<(usize, usize)> {
        self.plan
            .launches
            .iter()
            .enumerate()
            .filter(|(_, &k)| !self.kernels[k].faults.is_empty())
            .map(|(i, &k)| (i, k))
            .collect()
    }

    /// Whether any kernel is a collective call (a bucket of all-reduces).
    pub fn has_collectives(&self) -> bool {
        self.kernels.iter().any(|k| k.all_reduce().is_some())
    }

    /// Kernels of each kind: `(pointwise, rows, matmul)` (a fused attention counts as a matmul).
    pub fn kernel_kinds(&self) -> (usize, usize, usize) {
        let mut k = (0, 0, 0);
        for r in &self.fusion.regions {
            match r.kind {
                RegionKind::Pointwise => k.0 += 1,
                RegionKind::Rows { .. } => k.1 += 1,
                RegionKind::MatMul { .. } | RegionKind::Attention { .. } => k.2 += 1,
                // A collective call computes nothing on this device.
                RegionKind::Collective => {}
            }
        }
        k
    }
}

fn node_list(g: &Graph, nodes: &[NodeId]) -> String {
    nodes.iter().map(|n| format!("{n} {}", g.node(*n).op.name())).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for CompiledGraph {
    /// Regions (what each kernel fused, what it reads and writes) followed by each kernel's IR.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.primitive.graph;
        let t = &self.timings;
        writeln!(
            f,
            "{} kernel(s) for target `{}` ({} primitive nodes; {} buffers, {} reused; compiled in {:.2} ms: \
             decompose {:.2}, fuse {:.2}, lower {:.2}, plan {:.2})",
            self.kernels.len(),
            self.target.name,
            g.nodes.len(),
            self.plan.buffers.len(),
            self.plan.reused,
            t.decompose_ms + t.fuse_ms + t.lower_ms + t.plan_ms,
            t.decompose_ms,
            t.fuse_ms,
            t.lower_ms,
            t.plan_ms
        )?;
        for (r, k) in self.fusion.regions.iter().zip(&self.kernels) {
            let reads: Vec<NodeId> = k.buffers.iter().filter(|b| b.access == Access::Read).map(|b| b.node).collect();
            writeln!(f, "\nregion {} ({:?})", r.name, r.kind)?;
            writeln!(f, "  fuses:  {}", node_list(g, &r.members))?;
            writeln!(f, "  reads:  {}", node_list(g, &reads))?;
            writeln!(f, "  writes: {}", node_list(g, &r.stored))?;
            // Parts of a concatenation assembled in place: where in the shared buffer each lands.
            for n in r.stored.iter().filter(|n| self.plan.value_offset.contains_key(n)) {
                let (buffer, at) = (self.plan.value_buffer[n], &self.plan.value_offset[n]);
                writeln!(f, "  places: {n} at element {at} of buffer {buffer}, with the concatenation it is part of")?;
            }
            write!(f, "{k}")?;
        }
        Ok(())
    }
}

/// `k` without what is not in its module's code: its name (and its parts'), and the graph values its
/// buffers hold and its checks report (for the plan and the error message).
fn anonymous(k: &Kernel) -> Kernel {
    let mut a = Kernel { name: String::new(), launched_in: None, ..k.clone() };
    for b in &mut a.buffers {
        b.node = NodeId(0);
    }
    for f in &mut a.faults {
        f.node = NodeId(0);
    }
    a.parts = a.parts.iter().map(anonymous).collect();
    a
}

/// The kernels of earlier scheduling rounds, for the regions the next round schedules again unchanged.
/// A round that only stores a few more views (the usual failure: a GEMM operand the library cannot read
/// in place) leaves most regions as they were, and lowering every one of them again made a DenseNet's
/// compile three times as long as one round.
#[derive(Default)]
struct Lowered {
    /// Per region's members: its region (less the name, which numbering changes), the kernel, and which
    /// of the nodes the lowering asked about were stored.
    by_members: HashMap<Vec<NodeId>, Vec<LoweredRegion>>,
}

/// One lowered region: the region, its kernel, and whether each node its lowering asked about was stored.
type LoweredRegion = (Region, Kernel, BTreeMap<NodeId, bool>);

impl Lowered {
    /// The kernel lowered before for a region equal to `r` (but for its name), when every node its
    /// lowering asked about is stored now exactly as it was then; renamed as `r`.
    fn reuse(&self, r: &Region, materialized: &BTreeSet<NodeId>) -> Option<Kernel> {
        let (_, k, _) = self.by_members.get(&r.members)?.iter().find(|(old, _, asked)| {
            old.kind == r.kind
                && old.stored == r.stored
                && asked.iter().all(|(n, was)| materialized.contains(n) == *was)
        })?;
        Some(Kernel { name: r.name.clone(), ..k.clone() })
    }

    fn keep(&mut self, r: &Region, k: &Kernel, asked: BTreeSet<NodeId>, materialized: &BTreeSet<NodeId>) {
        let asked = asked.into_iter().map(|n| (n, materialized.contains(&n))).collect();
        self.by_members.entry(r.members.clone()).or_default().push((r.clone(), k.clone(), asked));
    }
}
