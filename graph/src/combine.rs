//! Horizontal fusion: kernels too small to fill the device, none of which reads what another writes,
//! run as one launch.
//!
//! A training step updates a few dozen bias and norm parameters of a few hundred elements each: W5's
//! has 34 such optimizer kernels (768 workgroups of 32 threads, a few microseconds of work) and as many
//! partial column sums before them. Launched one by one, each costs a launch and leaves most of the
//! device idle; PyTorch's fused optimizers (`foreach`) and Inductor's combo kernels launch such lists
//! once. Here the decision is made once, in `graph`, from the `Target`: kernels of at most
//! `Target::combined_launch_threads` threads with the same workgroup shape are gathered in launch order
//! into one kernel whose [`Kernel::parts`] they become; renderers print the parts behind a branch on the
//! workgroup, and the kernel interpreter runs them one after another.
//!
//! A combined kernel runs where its last part stood. So a kernel joins a gathering only while no kernel
//! since its first part has read what its parts write (such a read closes the gathering), and the
//! kernels its parts came from keep their places as kernels that launch nothing
//! ([`Kernel::launched_in`]), so region `i` still has kernel `i`. The memory plan is made after this
//! step: a part's inputs stay allocated until the combined launch has read them.

use crate::ir::NodeId;
use crate::kernel::{Access, Kernel, Launch, Scalar, Stmt};
use crate::sym::{Expr, SymId};
use crate::target::Target;
use std::collections::{BTreeMap, BTreeSet};

/// The launch shape kernels must share to be combined: threads per workgroup and workgroups packed to a
/// device workgroup (parts that differ in either would need different launches).
type Shape = (u32, u32);

/// Kernels gathered so far for one launch.
struct Gathering {
    shape: Shape,
    members: Vec<usize>,
    writes: BTreeSet<NodeId>,
    buffers: usize,
}

/// Whether `k` may be a part of a combined launch on `target`: a kernel of generated code (not a template,
/// library call or collective) without run-time checks, whose whole launch is at most the target's
/// `combined_launch_threads`, and that writes no part of a concatenation assembled in place (whose
/// buffer's lifetime is its family's).
fn combinable(k: &Kernel, target: &Target, assembled: &BTreeSet<NodeId>) -> bool {
    let template = |s: &Stmt| matches!(s, Stmt::MatMul(_) | Stmt::Gemm(_) | Stmt::Attention(_) | Stmt::AllReduce(_));
    let threads = k.launch.groups.as_const().map(|g| g.max(0) as u64 * k.launch.threads as u64);
    k.parts.is_empty()
        && k.launched_in.is_none()
        && k.faults.is_empty()
        && !k.body.is_empty()
        && !k.body.iter().any(template)
        && threads.is_some_and(|t| t > 0 && t <= target.combined_launch_threads)
        && k.buffers.iter().all(|b| b.access == Access::Read || !assembled.contains(&b.node))
}

/// Gathers the combinable kernels of `kernels` (in launch order) into combined launches: each gathering
/// of two or more becomes one kernel at its last member's place, the others kernels that launch
/// nothing. `assembled` are the values of concatenations assembled in place.
pub fn combine(kernels: &mut [Kernel], target: &Target, assembled: &BTreeSet<NodeId>) {
    if target.combined_launch_threads == 0 {
        return;
    }
    let budget = target.max_bindings as usize;
    let mut open: Vec<Gathering> = Vec::new();
    let mut closed: Vec<Vec<usize>> = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        let reads: BTreeSet<NodeId> = k.buffers.iter().filter(|b| b.access == Access::Read).map(|b| b.node).collect();
        // A kernel reading what a gathering writes must run after its launch: the gathering ends here.
        let (ended, kept): (Vec<Gathering>, Vec<Gathering>) =
            open.into_iter().partition(|g| !g.writes.is_disjoint(&reads));
        closed.extend(ended.into_iter().map(|g| g.members));
        open = kept;
        if !combinable(k, target, assembled) {
            continue;
        }
        let shape = (k.launch.threads, k.launch.packed.max(1));
        let writes = k.buffers.iter().filter(|b| b.access == Access::Write).map(|b| b.node);
        match open.iter().position(|g| g.shape == shape) {
            Some(g) if open[g].buffers + k.buffers.len() <= budget => {
                let g = &mut open[g];
                g.members.push(i);
                g.writes.extend(writes);
                g.buffers += k.buffers.len();
            }
            full => {
                // A full gathering launches as it is; this kernel starts the next.
                if let Some(g) = full {
                    closed.push(open.swap_remove(g).members);
                }
                open.push(Gathering { shape, members: vec![i], writes: writes.collect(), buffers: k.buffers.len() });
            }
        }
    }
    closed.extend(open.into_iter().map(|g| g.members));
    for members in closed.into_iter().filter(|m| m.len() > 1) {
        let parts: Vec<Kernel> = members.iter().map(|&m| kernels[m].clone()).collect();
        let last = *members.last().expect("a gathering has members");
        let combined = combined(parts);
        for &m in &members[..members.len() - 1] {
            kernels[m] = launched_in(&kernels[m], &combined.name);
        }
        kernels[last] = combined;
    }
}

/// The kernel that launches `parts` (same launch shape, constant groups) as one.
fn combined(parts: Vec<Kernel>) -> Kernel {
    let first = &parts[0];
    let name = format!("{}_combined{}", parts[parts.len() - 1].name, parts.len());
    let launch = Launch {
        groups: parts.iter().fold(Expr::from(0i64), |at, p| at + p.launch.groups.clone()),
        threads: first.launch.threads,
        packed: first.launch.packed,
    };
    let buffers: Vec<_> = parts.iter().flat_map(|p| p.buffers.iter().cloned()).collect();
    let mut ranges: BTreeMap<SymId, (i64, Option<i64>)> = BTreeMap::new();
    for p in &parts {
        ranges.extend(p.symbols.iter().copied().zip(p.symbol_ranges.iter().copied()));
    }
    let mut base = 0;
    let parts: Vec<Kernel> = parts
        .into_iter()
        .map(|mut p| {
            shift_buffers(&mut p.body, base);
            base += p.buffers.len();
            Kernel { buffers: buffers.clone(), ..p }
        })
        .collect();
    Kernel {
        name,
        buffers,
        symbols: ranges.keys().copied().collect(),
        symbol_ranges: ranges.values().copied().collect(),
        launch,
        vector_width: 1,
        row_cache: None,
        row_lanes: 1,
        body: Vec::new(),
        faults: Vec::new(),
        parts,
        launched_in: None,
    }
}

/// What remains of `k` once it runs as a part of kernel `host`: its name, nothing bound or launched.
fn launched_in(k: &Kernel, host: &str) -> Kernel {
    Kernel {
        name: k.name.clone(),
        buffers: Vec::new(),
        symbols: Vec::new(),
        symbol_ranges: Vec::new(),
        launch: Launch::new(Expr::from(0i64), k.launch.threads),
        vector_width: 1,
        row_cache: None,
        row_lanes: 1,
        body: Vec::new(),
        faults: Vec::new(),
        parts: Vec::new(),
        launched_in: Some(host.to_string()),
    }
}

/// Renumbers the buffers `body` loads and stores by `by` (a part's buffers follow those of the parts
/// before it in the combined kernel's list).
fn shift_buffers(body: &mut [Stmt], by: usize) {
    for s in body {
        match s {
            Stmt::Let { value: Scalar::Load { buffer, .. }, .. } | Stmt::Store { buffer, .. } => *buffer += by,
            Stmt::Loop { body, .. } | Stmt::Reduce { body, .. } => shift_buffers(body, by),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{capture, compile_graph, interp, DType, Target, TensorData, TensorSpec};

    /// Twelve independent column sums on a target binding 8 buffers: gatherings of four (two buffers a
    /// sum), each one kernel at its last member's place with the others launching nothing inside it; the
    /// results are the reference's, and with combined launches off every kernel launches alone.
    #[test]
    fn gatherings_fill_the_bindings_and_keep_region_places() {
        let specs: Vec<TensorSpec> = (0..12).map(|_| TensorSpec::new(DType::F32, &[6, 9])).collect();
        let g = capture(&specs, |t| t.iter().map(|x| x.sum(&[0], false)).collect()).unwrap();
        let target = Target::interpreter().with_max_bindings(8);
        let c = compile_graph(&g, &target).unwrap();
        assert_eq!(c.kernels.len(), 12, "one kernel a region");
        let hosts: Vec<usize> = (0..12).filter(|&k| !c.kernels[k].parts.is_empty()).collect();
        assert_eq!(hosts, vec![3, 7, 11], "each gathering at its last member's place");
        for (k, kernel) in c.kernels.iter().enumerate().filter(|(k, _)| !hosts.contains(k)) {
            let host = &c.kernels[k | 3];
            assert_eq!(kernel.launched_in.as_deref(), Some(host.name.as_str()));
            assert!(kernel.buffers.is_empty() && kernel.launch.groups.as_const() == Some(0));
        }
        assert!(hosts.iter().all(|&h| c.kernels[h].parts.len() == 4 && c.kernels[h].buffers.len() == 8));
        // The validator checks each combined kernel's parts: a launch of another workgroup shape than its
        // parts' is refused.
        let mut odd = c.kernels[3].clone();
        odd.launch.threads /= 2;
        let e = crate::validate::validate(&odd, &target).unwrap_err();
        assert!(e.rule.contains(&odd.parts[0].name) && e.rule.contains("the launch's"), "{e}");
        let data: Vec<TensorData> = (0..12)
            .map(|i| {
                TensorData::new(&(0..54).map(|j| (i * 54 + j) as f32 * 0.25).collect::<Vec<f32>>(), &[6, 9]).unwrap()
            })
            .collect();
        let refs: Vec<&TensorData> = data.iter().collect();
        let want = interp::run(&g, &refs).unwrap();
        assert_eq!(c.run_interpreted(&refs).unwrap(), want);
        let alone = Target { combined_launch_threads: 0, ..target };
        let c = compile_graph(&g, &alone).unwrap();
        assert!(c.kernels.iter().all(|k| k.parts.is_empty() && k.launched_in.is_none()));
        assert_eq!(c.run_interpreted(&refs).unwrap(), want);
    }
}
