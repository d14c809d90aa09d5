//! Which CPUs each rank of a host runs on. Left to the scheduler, two ranks' threads (each a launch
//! thread, NCCL's proxy, the driver's callbacks) migrate between cores at will, and a data-parallel
//! step whose ranks meet at every bucket runs at whichever rank's host is slower at that moment: W5's
//! bf16 step on two H200s took 3.07–3.10 ms in some fresh processes and 3.31–3.37 in others, with each
//! process's own windows steady; with each rank bound to its own cores every run took 3.09–3.12
//! (`benches/NOTES.md`, session 47). So `kiln-run` binds each local rank to a slice of the CPUs it was
//! itself allowed, as NVIDIA's and torchrun's launchers do (`--cpu-bind none` opts out).

/// The CPUs rank `0..ranks` of a host gets: `allowed` (the launcher's own CPUs, in any order) sorted
/// and cut into `ranks` contiguous slices, the first `allowed.len() % ranks` one CPU longer. `None`
/// when there are fewer CPUs than ranks (no rank could have a CPU of its own: nothing is bound).
pub fn cpu_slices(allowed: &[usize], ranks: usize) -> Option<Vec<Vec<usize>>> {
    if ranks == 0 || allowed.len() < ranks {
        return None;
    }
    let mut cpus = allowed.to_vec();
    cpus.sort_unstable();
    cpus.dedup();
    if cpus.len() < ranks {
        return None;
    }
    let (each, extra) = (cpus.len() / ranks, cpus.len() % ranks);
    let mut rest = cpus.as_slice();
    Some(
        (0..ranks)
            .map(|r| {
                let (mine, later) = rest.split_at(each + usize::from(r < extra));
                rest = later;
                mine.to_vec()
            })
            .collect(),
    )
}

/// The CPUs this process may run on (Linux's affinity mask); `None` where it cannot be read.
pub fn allowed_cpus() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `set` is a zeroed `cpu_set_t` of the size passed; the call only writes into it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if r != 0 {
            return None;
        }
        let n = 8 * std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `i` is below the set's capacity in bits.
        Some((0..n).filter(|&i| unsafe { libc::CPU_ISSET(i, &set) }).collect())
    }
    #[cfg(not(target_os = "linux"))]
    None
}
