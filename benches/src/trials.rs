//! Spread: a configuration measured in several fresh processes (`--trials N`), or a peer's result files
//! from several runs, folded into one row with the median of the trials' medians and their min–max. A
//! comparison is a win or a loss only when the ranges do not overlap; otherwise it is a tie.

use crate::report::{Report, ResultRow};
use std::collections::BTreeMap;

/// The median of `v` (the lower middle for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// Folds rows with the same workload, backend and mode into one: the median trial's row, with the
/// trials' min and max and their count; the call time, compile times and checks fold the same way (a
/// compile time only over the trials that measured it: cold in the first, warm in the rest). Order of
/// first appearance is kept.
pub fn fold(rows: Vec<ResultRow>) -> Vec<ResultRow> {
    let mut order: Vec<(String, String, String)> = Vec::new();
    let mut groups: BTreeMap<(String, String, String), Vec<ResultRow>> = BTreeMap::new();
    for r in rows {
        let key = (r.workload.clone(), r.backend.clone(), r.mode.clone());
        if !groups.contains_key(&key) {
            order.push(key.clone());
        }
        groups.entry(key).or_default().push(r);
    }
    order.into_iter().filter_map(|k| groups.remove(&k)).map(fold_group).collect()
}

fn fold_group(mut g: Vec<ResultRow>) -> ResultRow {
    let some = |f: &dyn Fn(&ResultRow) -> Option<f64>| -> Vec<f64> { g.iter().filter_map(f).collect() };
    let mid = |v: Vec<f64>| (!v.is_empty()).then(|| median(v));
    let (times, calls) = (some(&|r| Some(r.median_ms)), some(&|r| r.call_ms));
    let lo = |v: &[f64], extra: Vec<f64>| v.iter().chain(&extra).copied().fold(f64::INFINITY, f64::min);
    let hi = |v: &[f64], extra: Vec<f64>| v.iter().chain(&extra).copied().fold(f64::NEG_INFINITY, f64::max);
    let trials: usize = g.iter().map(|r| r.trials.max(1)).sum();
    let (min, max) = (lo(&times, some(&|r| r.min_ms)), hi(&times, some(&|r| r.max_ms)));
    let (call_min, call_max) = (lo(&calls, some(&|r| r.call_min_ms)), hi(&calls, some(&|r| r.call_max_ms)));
    let call = mid(calls.clone());
    let cold = mid(some(&|r| r.cold_compile_ms));
    let warm = mid(some(&|r| r.warm_compile_ms));
    let checks: Vec<bool> = g.iter().filter_map(|r| r.correct).collect();
    let worst = g.iter().filter_map(|r| r.max_rel_err).reduce(f64::max);
    let peak = g.iter().filter_map(|r| r.peak_bytes).max();
    let compiles = g.iter().filter_map(|r| r.compiles).max();
    let checked = g.iter().find_map(|r| r.checked.clone());
    let m = median(times.clone());
    let at = times.iter().position(|&t| t == m).unwrap_or(0);
    let mut row = g.swap_remove(at);
    let many = trials > 1;
    row.trials = trials;
    row.min_ms = many.then_some(min);
    row.max_ms = many.then_some(max);
    row.call_ms = call;
    row.call_min_ms = (many && call.is_some()).then_some(call_min);
    row.call_max_ms = (many && call.is_some()).then_some(call_max);
    row.cold_compile_ms = cold;
    row.warm_compile_ms = warm;
    row.correct = (!checks.is_empty()).then(|| checks.iter().all(|&c| c));
    row.max_rel_err = worst;
    row.peak_bytes = peak;
    row.compiles = compiles;
    row.checked = checked;
    row
}

/// The range of a row's trials (its median alone for one trial).
fn range(r: &ResultRow) -> (f64, f64) {
    (r.min_ms.unwrap_or(r.median_ms), r.max_ms.unwrap_or(r.median_ms))
}

/// `a` against `b` (lower is better): `win` or `loss` when their ranges do not overlap, else `tie`.
pub fn verdict(a: &ResultRow, b: &ResultRow) -> &'static str {
    let ((a_lo, a_hi), (b_lo, b_hi)) = (range(a), range(b));
    if a_hi < b_lo {
        "win"
    } else if b_hi < a_lo {
        "loss"
    } else {
        "tie"
    }
}

/// Modes that time the device (events back to back) as a compiler's best effort: not the eager
/// baselines, the reference, or the dynamic-shape rows (timed per call).
fn device_mode(r: &ResultRow) -> bool {
    r.mode != "eager" && r.mode != "reference" && !r.workload.ends_with("-dynamic")
}

/// Per workload (SDPA variants count as their workload: `W5-sdpa` is W5's), the row `pick` accepts
/// with the lowest `key` among the device-time modes.
pub fn best_rows(
    report: &Report,
    pick: &dyn Fn(&ResultRow) -> bool,
    key: &dyn Fn(&ResultRow) -> Option<f64>,
) -> BTreeMap<String, ResultRow> {
    let mut m: BTreeMap<String, ResultRow> = BTreeMap::new();
    for r in report.results.iter().filter(|r| pick(r) && device_mode(r)) {
        let Some(k) = key(r) else { continue };
        let id = r.workload.trim_end_matches("-sdpa").to_string();
        if m.get(&id).and_then(key).is_none_or(|b| k < b) {
            m.insert(id, r.clone());
        }
    }
    m
}

/// Per workload: kiln's fastest device-time mode on `backend` against torch's fastest (any mode and
/// attention variant), as Markdown rows; empty without a peer.
pub fn versus_torch(report: &Report, backend: &str) -> String {
    let kiln = best_rows(report, &|r| r.backend == backend, &|r| Some(r.median_ms));
    let torch = best_rows(report, &|r| r.backend == "torch-cuda", &|r| Some(r.median_ms));
    let mut s = String::new();
    for (id, k) in &kiln {
        let Some(t) = torch.get(id) else { continue };
        s.push_str(&format!(
            "| {id} | {:.4} ({}) | {:.4} ({} {}) | {:.2}x | {} |\n",
            k.median_ms,
            k.mode,
            t.median_ms,
            t.workload,
            t.mode,
            k.median_ms / t.median_ms,
            verdict(k, t)
        ));
    }
    if s.is_empty() {
        return s;
    }
    format!(
        "\n## kiln {backend} vs torch's best (device time, lower is better; win/loss only when the trial ranges do not overlap)\n\n| id | kiln ms (mode) | torch ms (variant, mode) | ratio | verdict |\n|---|---:|---:|---:|---|\n{s}"
    )
}

/// `a` against `b` on their call times (lower is better), as [`verdict`] does for device times.
pub fn call_verdict(a: &ResultRow, b: &ResultRow) -> &'static str {
    let as_device = |r: &ResultRow| ResultRow {
        median_ms: r.call_ms.unwrap_or(f64::NAN),
        min_ms: r.call_min_ms,
        max_ms: r.call_max_ms,
        ..r.clone()
    };
    verdict(&as_device(a), &as_device(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(w: &str, b: &str, mode: &str, ms: f64) -> ResultRow {
        ResultRow::timed(w, b, mode, ms, "CUDA events")
    }

    #[test]
    fn median_takes_the_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(vec![5.0]), 5.0);
    }

    #[test]
    fn trials_fold_into_the_median_with_their_range() {
        let rows = vec![
            row("W1", "cuda", "compiled", 0.30),
            row("W2", "cuda", "compiled", 1.0),
            row("W1", "cuda", "compiled", 0.20),
        ];
        let mut more = rows.clone();
        more.push(row("W1", "cuda", "compiled", 0.25));
        let mut bad = row("W1", "cuda", "compiled", 0.9);
        bad.correct = Some(false);
        bad.call_ms = Some(1.0);
        bad.cold_compile_ms = Some(50.0);
        more.push(bad);
        let f = fold(more);
        assert_eq!(f.len(), 2, "one row per configuration, in first-seen order");
        assert_eq!((f[0].workload.as_str(), f[1].workload.as_str()), ("W1", "W2"));
        assert_eq!((f[0].median_ms, f[0].min_ms, f[0].max_ms, f[0].trials), (0.25, Some(0.20), Some(0.9), 4));
        assert_eq!(f[0].correct, Some(false), "one wrong trial makes the row wrong");
        assert_eq!((f[0].call_ms, f[0].call_min_ms), (Some(1.0), Some(1.0)), "calls fold over trials that have one");
        assert_eq!((f[0].cold_compile_ms, f[0].warm_compile_ms), (Some(50.0), None));
        assert_eq!(f[1].correct, None, "no trial checked it");
        assert_eq!((f[1].trials, f[1].min_ms), (1, None));
    }

    #[test]
    fn a_verdict_needs_ranges_that_do_not_overlap() {
        let f = |ms: &[f64]| fold(ms.iter().map(|&m| row("W1", "cuda", "compiled", m)).collect()).remove(0);
        assert_eq!(verdict(&f(&[1.0, 1.1, 1.2]), &f(&[1.3, 1.4])), "win");
        assert_eq!(verdict(&f(&[1.3, 1.4]), &f(&[1.0, 1.2])), "loss");
        assert_eq!(verdict(&f(&[1.0, 1.35]), &f(&[1.3, 1.4])), "tie");
    }

    #[test]
    fn kiln_meets_torch_best_over_modes_and_variants() {
        let mut report = Report::new(false);
        report.results = vec![
            row("W5", "cuda", "compiled", 7.6),
            row("W5", "cuda", "eager", 7.0),
            row("W5", "torch-cuda", "default", 7.1),
            row("W5-sdpa", "torch-cuda", "reduce-overhead", 6.4),
            row("W5", "torch-cuda", "eager", 5.0),
        ];
        let table = versus_torch(&report, "cuda");
        assert!(
            table.contains("| W5 | 7.6000 (compiled) | 6.4000 (W5-sdpa reduce-overhead) | 1.19x | loss |"),
            "{table}"
        );
    }
}
