//! The bench report: one row per workload × backend × mode, as versioned JSON and a Markdown table.

use kiln_graph::workloads::Workload;
use serde::Serialize;
use std::collections::BTreeMap;

/// JSON schema name and version. Version 2: both numbers on every row (device time and the public
/// call), checks that may be absent (`None`: not checked), compile times that may be absent (cold only
/// in a process that started with empty caches, warm only in one that did not).
pub const SCHEMA: &str = "kiln-bench/2";

/// One measured configuration: a workload on a backend in a mode.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct ResultRow {
    /// Workload id.
    pub workload: String,
    /// Backend name.
    pub backend: String,
    /// kiln: `eager` (one kernel per op), `compiled`, `reduce-overhead`; torch: its modes.
    pub mode: String,
    /// Device time of one call, ms: calls back to back between two device events, divided by their
    /// count; the median of the samples (of the trials' medians when folded).
    pub median_ms: f64,
    /// How the device time was taken.
    pub timing: String,
    /// The user's call on inputs already on the device, then a synchronise: host wall time, ms (median).
    #[serde(default)]
    pub call_ms: Option<f64>,
    /// Worst relative error of this configuration's own output where the expected value is not tiny
    /// (`None`: not checked).
    #[serde(default)]
    pub max_rel_err: Option<f64>,
    /// Whether every element of the output met the tolerance rule (`None`: not checked).
    #[serde(default)]
    pub correct: Option<bool>,
    /// What the output was checked against, at what size, and the tolerance used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<String>,
    /// Kernels launched per run (`None` where the peer does not say).
    pub kernels: Option<usize>,
    /// Bytes the computation must read and write (inputs once, outputs once); GB/s is quoted on these.
    pub bytes: u64,
    /// Bytes all kernels actually read and write per run (intermediates included).
    #[serde(default)]
    pub traffic_bytes: u64,
    /// Achieved bandwidth, GB/s.
    pub gbps: f64,
    /// Fraction of the copy bandwidth measured in the same run.
    pub frac_copy: f64,
    /// FLOP/s where matmuls dominate.
    pub tflops: Option<f64>,
    /// Trace + compile + first load, ms, in a process that started with every cache empty (kiln's
    /// compile cache and the driver's JIT cache; torch's Inductor and Triton caches).
    #[serde(default)]
    pub cold_compile_ms: Option<f64>,
    /// The same in a later process with those caches kept.
    #[serde(default)]
    pub warm_compile_ms: Option<f64>,
    /// Peak bytes of live device tensors while the configuration ran (inputs included; the allocator's
    /// cache not).
    #[serde(default)]
    pub peak_bytes: Option<u64>,
    /// Graphs compiled over the run (the dynamic-shape rows).
    #[serde(default, alias = "recompiles")]
    pub compiles: Option<usize>,
    /// Per-kernel device time of one run, ms, in launch order (`--profile`, where the device can say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Vec<KernelTime>>,
    /// Fresh processes (or peer runs) this row folds; `median_ms` is the median of their medians.
    #[serde(default = "one")]
    pub trials: usize,
    /// The fastest trial's device time, ms (several trials only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ms: Option<f64>,
    /// The slowest trial's device time, ms (several trials only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<f64>,
    /// The fastest trial's call time, ms (several trials only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_min_ms: Option<f64>,
    /// The slowest trial's call time, ms (several trials only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_max_ms: Option<f64>,
}

fn one() -> usize {
    1
}

/// One kernel's share of a profiled run.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct KernelTime {
    /// Kernel name (what it fuses).
    pub kernel: String,
    /// Device time, ms.
    pub ms: f64,
}

/// The whole report.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Report {
    /// Schema tag.
    pub schema: String,
    /// kiln version.
    pub kiln_version: String,
    /// Whether sizes were the `--quick` ones.
    pub quick: bool,
    /// Devices and adapters, one line each.
    pub devices: Vec<String>,
    /// Copy bandwidth per backend, GB/s.
    pub copy_gbps: BTreeMap<String, f64>,
    /// Rows.
    pub results: Vec<ResultRow>,
    /// What is not measured and why.
    pub notes: Vec<String>,
}

#[derive(serde::Deserialize)]
struct PeerFile {
    schema: String,
    #[serde(default)]
    peer: String,
    #[serde(default)]
    devices: Vec<String>,
    #[serde(default)]
    copy_gbps: BTreeMap<String, f64>,
    results: Vec<ResultRow>,
}

impl Report {
    /// Adds a peer's results (same schema) to the report.
    pub fn merge_peer(&mut self, path: &std::path::Path) -> kiln::Result<()> {
        let bad = |msg: String| kiln::Error::Format { what: format!("peer results {}", path.display()), msg };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let peer: PeerFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if peer.schema != SCHEMA {
            return Err(bad(format!("schema {} is not {SCHEMA}", peer.schema)));
        }
        self.devices.extend(peer.devices.into_iter().map(|d| format!("peer {}: {d}", peer.peer)));
        self.copy_gbps.extend(peer.copy_gbps);
        self.results.extend(peer.results);
        Ok(())
    }

    /// A report written earlier (`--json`).
    pub fn load(path: &std::path::Path) -> Result<Report, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let r: Report = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if r.schema != SCHEMA {
            return Err(format!("{}: schema {} is not {SCHEMA}", path.display(), r.schema));
        }
        Ok(r)
    }

    /// Takes in a later part of a merged comparison (`--merge`): as `absorb`, except that its rows replace
    /// this report's rows of the same workload, backend and mode (the later part re-measured them).
    pub fn supersede(&mut self, later: Report) {
        let key = |r: &ResultRow| (r.workload.clone(), r.backend.clone(), r.mode.clone());
        let newer: std::collections::HashSet<_> = later.results.iter().map(key).collect();
        self.results.retain(|r| !newer.contains(&key(r)));
        self.absorb(later);
    }

    /// Takes in another report of the same run (another trial, another part): its rows, devices and
    /// notes not yet listed, and the lower copy bandwidth per backend.
    pub fn absorb(&mut self, other: Report) {
        self.results.extend(other.results);
        for (b, g) in other.copy_gbps {
            self.copy_gbps.entry(b).and_modify(|x| *x = x.min(g)).or_insert(g);
        }
        for d in other.devices {
            if !self.devices.contains(&d) {
                self.devices.push(d);
            }
        }
        for n in other.notes {
            if !self.notes.contains(&n) {
                self.notes.push(n);
            }
        }
    }

    /// An empty report.
    pub fn new(quick: bool) -> Self {
        Report {
            schema: SCHEMA.into(),
            kiln_version: env!("CARGO_PKG_VERSION").into(),
            quick,
            devices: Vec::new(),
            copy_gbps: BTreeMap::new(),
            results: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Pretty JSON.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the report is plain data")
    }

    /// A Markdown table with a header naming devices and copy bandwidth.
    pub fn markdown(&self) -> String {
        let mut s =
            format!("# kiln-bench ({}{})\n\n", self.kiln_version, if self.quick { ", quick sizes" } else { "" });
        // Every process measures the copy rate once: a merged run lists one range per backend, where
        // its first measurement stood.
        let mut copies: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        let mut lines: Vec<Result<&str, usize>> = Vec::new();
        for d in &self.devices {
            match copy_line(d) {
                Some((b, rates)) => match copies.iter().position(|(c, _)| *c == b) {
                    Some(i) => copies[i].1.push(rates),
                    None => {
                        lines.push(Err(copies.len()));
                        copies.push((b, vec![rates]));
                    }
                },
                None => lines.push(Ok(d)),
            }
        }
        for line in lines {
            let text = match line {
                Ok(d) => d.to_string(),
                Err(i) => {
                    let (b, all) = &copies[i];
                    let range = |f: fn(&(f64, f64)) -> f64| {
                        let (lo, hi) = all.iter().map(f).fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(v), h.max(v)));
                        if lo == hi {
                            format!("{lo:.0}")
                        } else {
                            format!("{lo:.0}–{hi:.0}")
                        }
                    };
                    let (k, n) = (range(|r| r.0), range(|r| r.1));
                    format!("{b}: copy bandwidth in {} process(es): kiln's copy kernel {k} GB/s, the device's own copy {n} GB/s", all.len())
                }
            };
            s.push_str(&format!("- {text}\n"));
        }
        for (b, g) in &self.copy_gbps {
            s.push_str(&format!("- copy bandwidth on {b}: {g:.1} GB/s (bytes read + written)\n"));
        }
        s.push_str("\n| workload | backend | mode | device ms (min–max) | call + sync ms (min–max) | kernels | GB/s | % of copy | TFLOP/s | peak MiB | max rel err | cold compile ms | warm compile ms |\n");
        s.push_str("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        let opt = |v: Option<f64>, digits: usize| v.map_or("—".into(), |v| format!("{v:.digits$}"));
        for r in &self.results {
            s.push_str(&format!(
                "| {} | {} | {}{} | {} | {} | {} | {:.1} | {:.0}% | {} | {} | {} | {} | {} |\n",
                r.workload,
                r.backend,
                r.mode,
                r.compiles.map_or(String::new(), |c| format!(" ({c} graphs compiled)")),
                spread(r.median_ms, r.min_ms, r.max_ms),
                r.call_ms.map_or("—".into(), |c| spread(c, r.call_min_ms, r.call_max_ms)),
                r.kernels.map_or("—".into(), |k| k.to_string()),
                r.gbps,
                r.frac_copy * 100.0,
                opt(r.tflops, 2),
                opt(r.peak_bytes.map(|b| b as f64 / (1u64 << 20) as f64), 0),
                match (r.max_rel_err, r.correct) {
                    (Some(e), Some(true)) => format!("{e:.1e} ✓"),
                    (Some(e), Some(false)) => format!("{e:.1e} ✗"),
                    _ => "not checked".into(),
                },
                opt(r.cold_compile_ms, 1),
                opt(r.warm_compile_ms, 1),
            ));
        }
        s.push_str(&format!("\nOutputs: {}.\n", crate::check::RULE));
        let mut against: Vec<(String, String)> =
            self.results.iter().filter_map(|r| Some((r.workload.clone(), r.checked.clone()?))).collect();
        against.sort();
        against.dedup();
        for (w, a) in against {
            s.push_str(&format!("- {w} checked against {a}\n"));
        }
        for r in &self.results {
            let Some(p) = &r.profile else { continue };
            // Kernels with the same name pattern (64 equal layers) add up: group by name without its index.
            let mut by: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
            for k in p {
                let e = by.entry(k.kernel.split_once('_').map_or(k.kernel.as_str(), |x| x.1)).or_default();
                *e = (e.0 + k.ms, e.1 + 1);
            }
            let total: f64 = p.iter().map(|k| k.ms).sum();
            let mut top: Vec<_> = by.into_iter().collect();
            top.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
            s.push_str(&format!(
                "\n{} on {} ({}), {total:.3} ms in {} kernels:\n",
                r.workload,
                r.backend,
                r.mode,
                p.len()
            ));
            for (name, (ms, n)) in top.iter().take(8) {
                s.push_str(&format!(
                    "- {ms:.3} ms ({:.0}%) {name}{}\n",
                    100.0 * ms / total,
                    if *n > 1 { format!(" ×{n}") } else { String::new() }
                ));
            }
        }
        for backend in ["cuda", "wgpu"] {
            s.push_str(&crate::trials::versus_torch(self, backend));
        }
        for n in &self.notes {
            s.push_str(&format!("\n- {n}"));
        }
        s.push('\n');
        s
    }
}

/// The CPU reference on the check sizes: correctness only (it is the reference), time for scale.
pub fn cpu_reference_row(w: &Workload) -> kiln::Result<ResultRow> {
    let inputs: Vec<kiln::Tensor> =
        kiln_graph::workloads::inputs(&w.check).into_iter().map(kiln::Tensor::from_data).collect();
    let f = kiln::compile(|x: Vec<kiln::Tensor>| (w.f)(&x)).backend(kiln::Backend::Cpu);
    let t = std::time::Instant::now();
    f.call(inputs)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(ResultRow::timed(w.id, "cpu", "reference", ms, "wall, 1 run at check size"))
}

impl ResultRow {
    /// A row holding a time alone (nothing else measured): the reference row, peers' and tests' rows.
    pub fn timed(workload: &str, backend: &str, mode: &str, median_ms: f64, timing: &str) -> ResultRow {
        ResultRow {
            workload: workload.into(),
            backend: backend.into(),
            mode: mode.into(),
            median_ms,
            timing: timing.into(),
            call_ms: None,
            max_rel_err: None,
            correct: None,
            checked: None,
            kernels: None,
            bytes: 0,
            traffic_bytes: 0,
            gbps: 0.0,
            frac_copy: 0.0,
            tflops: None,
            cold_compile_ms: None,
            warm_compile_ms: None,
            peak_bytes: None,
            compiles: None,
            profile: None,
            trials: 1,
            min_ms: None,
            max_ms: None,
            call_min_ms: None,
            call_max_ms: None,
        }
    }
}

/// `median (min–max, N trials)`, or the median alone for one trial.
pub fn spread(median: f64, min: Option<f64>, max: Option<f64>) -> String {
    match (min, max) {
        (Some(lo), Some(hi)) => format!("{median:.4} ({lo:.4}–{hi:.4})"),
        _ => format!("{median:.4}"),
    }
}

/// The device line a process writes about its copy rate (read back by [`copy_line`]).
pub fn copy_line_text(backend: &str, kernel: f64, device: f64) -> String {
    format!("{backend}: copy bandwidth: kiln's copy kernel {kernel:.0} GB/s, the device's own copy {device:.0} GB/s")
}

/// A device line [`copy_line_text`] wrote: its backend and the two rates.
fn copy_line(d: &str) -> Option<(String, (f64, f64))> {
    let (backend, rest) = d.split_once(": copy bandwidth: kiln's copy kernel ")?;
    let (kernel, rest) = rest.split_once(" GB/s, the device's own copy ")?;
    let device = rest.strip_suffix(" GB/s")?;
    Some((backend.to_string(), (kernel.parse().ok()?, device.parse().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_part_supersedes_the_rows_it_remeasured() {
        let part = |rows: Vec<ResultRow>| Report { results: rows, ..Report::new(false) };
        let row = |w: &str, ms: f64| ResultRow::timed(w, "cuda", "compiled", ms, "CUDA events");
        let mut merged = part(vec![row("W1", 0.2), row("W2", 0.3)]);
        merged.supersede(part(vec![row("W2", 0.1), row("W3", 0.4)]));
        let got: Vec<(String, f64)> = merged.results.iter().map(|r| (r.workload.clone(), r.median_ms)).collect();
        assert_eq!(got, vec![("W1".into(), 0.2), ("W2".into(), 0.1), ("W3".into(), 0.4)]);
        // Trials of one configuration are all kept (folded later), not superseded.
        merged.absorb(part(vec![row("W1", 0.25)]));
        assert_eq!(merged.results.iter().filter(|r| r.workload == "W1").count(), 2);
    }

    #[test]
    fn each_process_copy_rate_is_folded_into_one_range_per_backend() {
        let copy = |k: u32, n: u32| copy_line_text("cuda", k.into(), n.into());
        let mut r = Report::new(false);
        r.devices = vec!["cuda: an H200".into(), copy(4150, 3996), "peer torch: an H200".into(), copy(4202, 4010)];
        r.devices.push(copy(4171, 4116));
        let md = r.markdown();
        let header: Vec<&str> = md.lines().filter(|l| l.starts_with("- ")).collect();
        assert_eq!(
            header,
            [
                "- cuda: an H200",
                "- cuda: copy bandwidth in 3 process(es): kiln's copy kernel 4150–4202 GB/s, the device's own copy 3996–4116 GB/s",
                "- peer torch: an H200",
            ]
        );
    }
}
