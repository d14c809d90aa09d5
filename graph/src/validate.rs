//! The kernel-IR validator: every kernel `graph` lowers is checked against its target before any
//! renderer sees it, so a schedule the device cannot run is a compile error naming the kernel and the
//! rule, not a wrong answer, a hang at a barrier or a driver's refusal.
//!
//! The rules are the assumptions the renderers make without checking: how many threads a workgroup
//! has and which combines they use, what packed groups (`Launch::packed`) may do, how many buffers a
//! kernel binds, how a matmul's tile splits over its threads, and how much shared memory a template
//! declares. Index bounds are not checked here:
//! lowering clamps or guards every index it emits, and the kernel interpreter runs each one in CI.

use crate::kernel::{AttentionPass, AttentionUnits, Kernel, ReduceStrategy, Stmt};
use crate::target::Target;

/// A rule a kernel breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// The kernel.
    pub kernel: String,
    /// The rule and how it is broken.
    pub rule: String,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kernel {}: {}", self.kernel, self.rule)
    }
}

/// Checks `kernel` against `target`: the first rule it breaks, if any.
pub fn validate(kernel: &Kernel, target: &Target) -> Result<(), Invalid> {
    let broken = |rule: String| Err(Invalid { kernel: kernel.name.clone(), rule });
    let launch = &kernel.launch;
    if launch.threads == 0 || launch.packed == 0 {
        return broken(format!("{} threads in {} groups a workgroup", launch.threads, launch.packed));
    }
    if launch.device_threads() > target.max_threads_per_group {
        return broken(format!(
            "{} threads a workgroup ({} × {} packed) past the target's {}",
            launch.device_threads(),
            launch.threads,
            launch.packed,
            target.max_threads_per_group
        ));
    }
    // The fault word is one more storage binding (symbols travel as parameters or a uniform block). A
    // collective call binds nothing: it is handed pointers, as many as its bucket holds.
    let bindings = kernel.buffers.len() + usize::from(!kernel.faults.is_empty());
    if bindings > target.max_bindings as usize && kernel.all_reduce().is_none() {
        return broken(format!("{bindings} buffers bound past the target's {}", target.max_bindings));
    }
    if kernel.body.iter().any(group_combine) && !launch.threads.is_power_of_two() {
        // Shared-memory trees halve the thread count, and subgroup shuffles take whole subgroups.
        return broken(format!("a workgroup combine over {} threads, not a power of two", launch.threads));
    }
    if let Some(why) = kernel.body.iter().find_map(|st| bad_shuffle(st, launch.threads, target.subgroup_size)) {
        return broken(why);
    }
    if launch.packed > 1 {
        if target.subgroup_size != Some(launch.threads) {
            return broken(format!(
                "{} groups packed a workgroup need groups of one subgroup ({} threads; the target's subgroup: {:?})",
                launch.packed, launch.threads, target.subgroup_size
            ));
        }
        if !kernel.subgroup_combines() {
            return broken(format!(
                "{} groups packed a workgroup combine through shared memory (an arg reduction, a 64-bit one, \
                 or a template): packed groups may run different numbers of rows and must not meet at a barrier",
                launch.packed
            ));
        }
    }
    if let Some(why) = bad_row_lanes(kernel, target) {
        return broken(why);
    }
    // A combined launch (`crate::combine`): its parts share its workgroup shape and are checked as
    // kernels of their own; its binding count above covers them all.
    for part in &kernel.parts {
        if (part.launch.threads, part.launch.packed) != (launch.threads, launch.packed) {
            return broken(format!(
                "part {} of {} threads in {} groups a workgroup, the launch's {} in {}",
                part.name, part.launch.threads, part.launch.packed, launch.threads, launch.packed
            ));
        }
        if part.launch.groups.as_const().is_none() {
            return broken(format!("part {} of a symbolic workgroup count (parts are placed by constants)", part.name));
        }
        validate(part, target).map_err(|e| Invalid { kernel: kernel.name.clone(), rule: e.to_string() })?;
    }
    for st in &kernel.body {
        if let Stmt::MatMul(m) = st {
            if let Some(why) = m.tile.unfit(launch.threads) {
                return broken(format!("its matmul schedule: {why}"));
            }
            let shared = m.tile.shared_bytes(m.acc_dtype.size_bytes() as u32);
            let budget = target.template_shared_bytes();
            if shared > budget {
                return broken(format!("its matmul tiles take {shared} bytes of workgroup memory past {budget}"));
            }
        }
        if let Stmt::Attention(a) = st {
            let shared = match a.pass {
                AttentionPass::Forward | AttentionPass::Lse => a.tile.shared_bytes(a.head_dim, a.value_dim),
                AttentionPass::Grad(_) => a.tile.grad_shared_bytes(a.head_dim, a.value_dim),
            };
            if a.tile.stages > 1 && (a.tile.vector != 8 || matches!(a.pass, AttentionPass::Grad(_))) {
                return broken(format!(
                    "{} stages of attention tiles copy 16-byte pieces of a forward pass only (a {:?} pass, {}-element loads)",
                    a.tile.stages, a.pass, a.tile.vector
                ));
            }
            let budget = target.template_shared_bytes();
            if shared > budget {
                return broken(format!("its attention tiles take {shared} bytes of shared memory past {budget}"));
            }
            if launch.threads != a.tile.threads() {
                return broken(format!("{} threads for an attention tile of {} warps", launch.threads, a.tile.warps));
            }
            if a.tile.units != AttentionUnits::Matrix {
                let unfit = match a.tile.units {
                    AttentionUnits::Lanes => a.tile.lanes_unfit(a.head_dim, a.value_dim, target.subgroup_size),
                    _ => a.tile.registers_unfit(a.head_dim, a.value_dim),
                };
                if let Some(why) = unfit {
                    return broken(why);
                }
                if a.tile.row_shuffles && !crate::attention::rows_shuffle(target) {
                    return broken(format!(
                        "rows met by shuffles on subgroups of {:?} lanes (groups of eight needed)",
                        target.subgroup_size
                    ));
                }
                if a.second.is_some() && a.tile.units == AttentionUnits::Registers {
                    return broken("an attention on registers writes no second output".into());
                }
                if a.pass != AttentionPass::Forward || a.dtype != crate::DType::F32 {
                    return broken(format!(
                        "an attention on {:?} runs the f32 forward pass, not {:?} over {}",
                        a.tile.units, a.pass, a.dtype
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Why a persistent row's lanes (`Kernel::row_lanes`) cannot run as planned: they need the target's
/// `vector_rows`, a kept row (slots to group), groups of whole vectors (lanes dividing the slots and the
/// row, so a group is inside the row or past it entirely), one row a workgroup, and a vector the target
/// moves in one access.
fn bad_row_lanes(kernel: &Kernel, target: &Target) -> Option<String> {
    let lanes = kernel.row_lanes;
    if lanes <= 1 {
        return None;
    }
    let len = kernel.row_body().and_then(crate::kernel::RowLoad::row_len).and_then(crate::sym::Expr::as_const);
    let slots = kernel.row_cache.unwrap_or(0);
    if !target.vector_rows {
        Some(format!("rows of {lanes} lanes on a target without vector rows"))
    } else if slots == 0 || slots % lanes != 0 {
        Some(format!("rows of {lanes} lanes over {slots} kept slots a thread: not whole vectors"))
    } else if len.is_none_or(|n| n % lanes as i64 != 0) {
        Some(format!("rows of {lanes} lanes over a row of {len:?} elements: not whole vectors"))
    } else if kernel.launch.packed > 1 {
        Some(format!("rows of {lanes} lanes in {} packed groups", kernel.launch.packed))
    } else if lanes > target.max_vector_lanes || !lanes.is_power_of_two() {
        Some(format!("rows of {lanes} lanes past the target's {} a vector", target.max_vector_lanes))
    } else {
        None
    }
}

/// Why a subgroup combine in `st` (or inside it) cannot shuffle over `threads` threads on a target with
/// subgroups of `size`, if one cannot.
fn bad_shuffle(st: &Stmt, threads: u32, size: Option<u32>) -> Option<String> {
    match st {
        Stmt::Reduce { op, dtype, strategy: ReduceStrategy::Group { subgroup: Some(s) }, body, .. } => {
            if size != Some(*s) || !s.is_power_of_two() || threads % s != 0 {
                Some(format!("a combine shuffling in subgroups of {s} over {threads} threads (the target's: {size:?})"))
            } else if !crate::kernel::shuffles(*op, *dtype) {
                Some(format!("a {op:?} combine of {dtype} shuffled (32-bit sums, maxima and minima only)"))
            } else {
                body.iter().find_map(|b| bad_shuffle(b, threads, size))
            }
        }
        Stmt::Reduce { body, .. } | Stmt::Loop { body, .. } => body.iter().find_map(|b| bad_shuffle(b, threads, size)),
        _ => None,
    }
}

/// Whether `st` (or a statement inside it) combines across a workgroup's threads.
fn group_combine(st: &Stmt) -> bool {
    match st {
        Stmt::Reduce { strategy: ReduceStrategy::Group { .. }, .. } => true,
        Stmt::Reduce { body, .. } | Stmt::Loop { body, .. } => body.iter().any(group_combine),
        _ => false,
    }
}
