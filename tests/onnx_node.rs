//! The ONNX backend node tests (`onnx/backend/test/data/node` from the `onnx` package: a one-op model,
//! its inputs and expected outputs as protobuf files, ~1,650 of them) on the CPU reference and on wgpu
//! (lavapipe in CI). Every test either passes on both, or kiln says why it does not support it (an op,
//! an attribute, a dtype): a wrong answer or any other error fails. The outcome table is
//! `docs/onnx.md`, regenerated here and compared with the committed file (`KILN_BLESS=1` rewrites it),
//! so the coverage it claims is what this run measured.
//!
//! The data comes from `scripts/deps.sh` (`KILN_ONNX_NODE_TESTS`); without it the test fails saying so,
//! unless `KILN_ONNX_NODE_TESTS=skip` opts out explicitly.

mod common;

use kiln::graph::{Backend, CpuReference, IntoBackend};
use kiln::onnx::proto::TensorProto;
use kiln::{Error, Tensor, TensorData};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How one node test went on one backend.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Pass,
    /// kiln says it does not do this, and why.
    Unsupported(String),
    /// A wrong answer, or an error other than "unsupported".
    Fail(String),
}

fn data_dir() -> Option<PathBuf> {
    match std::env::var("KILN_ONNX_NODE_TESTS") {
        Ok(v) if v == "skip" => None,
        Ok(v) => Some(PathBuf::from(v)),
        Err(_) => {
            let local = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/onnx-1.20.1/node");
            if local.is_dir() {
                return Some(local);
            }
            panic!(
                "the ONNX node tests are not here: `source scripts/deps.sh` fetches them into .tools/ (needs python3 \
                 with pip), or set KILN_ONNX_NODE_TESTS to their folder, or to `skip` to opt out"
            )
        }
    }
}

/// Reads a `.pb` tensor; `Err` says why it is not one kiln reads (a sequence, an optional, a dtype).
fn read_pb(path: &Path) -> Result<TensorData, String> {
    use prost::Message;
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let t =
        TensorProto::decode(bytes.as_slice()).map_err(|_| "a non-tensor value (sequence or optional)".to_string())?;
    if t.data_type.is_none() {
        return Err("a non-tensor value (sequence or optional)".into());
    }
    kiln::onnx::tensor::to_data(&t, None)
}

fn unsupported_reason(e: &Error) -> Option<String> {
    match e {
        Error::Import { unsupported: true, op_type, msg, .. } => Some(format!("{op_type}: {msg}")),
        Error::Unsupported { what, .. } => {
            // The model's path is noise in the table.
            Some(what.split_once(": ").map_or(what.as_str(), |(_, w)| w).to_string())
        }
        _ => None,
    }
}

/// `|got - want| <= 1e-3 |want| + atol` (ONNX's backend-test rule, with kiln's absolute floor), same
/// NaNs and infinities; integers and booleans exactly.
fn compare(got: &TensorData, want: &TensorData) -> Result<(), String> {
    if got.dims() != want.dims() {
        return Err(format!("shape {:?}, expected {:?}", got.dims(), want.dims()));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {}, expected {}", got.dtype(), want.dtype()));
    }
    let float = want.dtype().is_float();
    let (rtol, atol) = match want.dtype() {
        kiln::DType::F32 => (1e-3, 1e-5),
        kiln::DType::F16 | kiln::DType::BF16 => (1e-2, 1e-3),
        _ => (0.0, 0.0),
    };
    for (i, (&a, &b)) in got.values().iter().zip(want.values()).enumerate() {
        let ok = if !float {
            a == b
        } else if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= rtol * b.abs() + atol
        };
        if !ok {
            return Err(format!("element {i}: {a}, expected {b}"));
        }
    }
    Ok(())
}

fn run_case(dir: &Path, backend: &Arc<dyn Backend>) -> Outcome {
    let model = match kiln::onnx::load(dir.join("model.onnx")) {
        Ok(m) => m.backend(backend.clone()),
        Err(e) => return unsupported_reason(&e).map_or_else(|| Outcome::Fail(e.to_string()), Outcome::Unsupported),
    };
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    sets.sort();
    for set in sets {
        let read_all = |prefix: &str| -> Result<Vec<TensorData>, String> {
            (0..)
                .map(|i| set.join(format!("{prefix}_{i}.pb")))
                .take_while(|p| p.exists())
                .map(|p| read_pb(&p))
                .collect()
        };
        let (inputs, want) = match (read_all("input"), read_all("output")) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => return Outcome::Unsupported(e),
        };
        let inputs: Vec<Tensor> = inputs.into_iter().map(Tensor::from_data).collect();
        let got = match model.call(inputs) {
            Ok(g) => g,
            Err(e) => return unsupported_reason(&e).map_or_else(|| Outcome::Fail(e.to_string()), Outcome::Unsupported),
        };
        if got.len() < want.len() {
            return Outcome::Fail(format!("{} outputs, expected {}", got.len(), want.len()));
        }
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = match g.to_data() {
                Ok(g) => g,
                Err(e) => return Outcome::Fail(e.to_string()),
            };
            if let Err(m) = compare(&g, w) {
                return Outcome::Fail(format!("output {k}: {m}"));
            }
        }
    }
    Outcome::Pass
}

/// The op type a node test exercises: its model's op, or the op its name starts with for models of
/// several nodes (the `_expanded` function bodies).
fn op_of(dir: &Path) -> String {
    use prost::Message;
    let name = dir.file_name().unwrap_or_default().to_string_lossy().to_string();
    let ops: Vec<String> = std::fs::read(dir.join("model.onnx"))
        .ok()
        .and_then(|b| kiln::onnx::proto::ModelProto::decode(b.as_slice()).ok())
        .and_then(|m| m.graph)
        .map(|g| g.node.iter().map(|n| n.op_type().to_string()).collect())
        .unwrap_or_default();
    match ops.as_slice() {
        [one] => one.clone(),
        _ => {
            let lower = name.trim_start_matches("test_").to_lowercase();
            ops.iter()
                .filter(|o| lower.starts_with(&o.to_lowercase()))
                .max_by_key(|o| o.len())
                .cloned()
                .unwrap_or_else(|| format!("({})", name.trim_start_matches("test_").split('_').next().unwrap_or("")))
        }
    }
}

/// The table: per op type, how many of its tests pass on each backend; then every test that is not
/// supported, with the reason.
fn table(results: &BTreeMap<String, (String, Vec<Outcome>)>, backends: &[&str], version: &str) -> String {
    let mut s = format!(
        "# ONNX coverage\n\n\
         Generated by `cargo test --test onnx_node` from the ONNX backend node tests of `onnx` {version}\n\
         (`KILN_BLESS=1` rewrites it; the test fails when this file and the run disagree). A test passes\n\
         when every output matches (relative 1e-3, absolute 1e-5 for f32; exact for integers and\n\
         booleans); a test kiln does not support says why below. No test may fail outright.\n\n\
         Ops kiln imports (`kiln::onnx::SUPPORTED`): {}.\n\n",
        kiln::onnx::SUPPORTED.iter().map(|o| format!("`{o}`")).collect::<Vec<_>>().join(", ")
    );
    let mut per_op: BTreeMap<&str, (usize, Vec<usize>)> = BTreeMap::new();
    for (op, outcomes) in results.values() {
        let e = per_op.entry(op).or_insert_with(|| (0, vec![0; backends.len()]));
        e.0 += 1;
        for (k, o) in outcomes.iter().enumerate() {
            e.1[k] += usize::from(*o == Outcome::Pass);
        }
    }
    let total = results.len();
    let passing: Vec<usize> =
        (0..backends.len()).map(|k| results.values().filter(|(_, o)| o[k] == Outcome::Pass).count()).collect();
    s.push_str(&format!(
        "{total} node tests; passing: {}.\n\n",
        backends.iter().zip(&passing).map(|(b, p)| format!("{p} on {b}")).collect::<Vec<_>>().join(", ")
    ));
    s.push_str(&format!("| op | tests | {} |\n|---|---|{}\n", backends.join(" | "), "---|".repeat(backends.len())));
    for (op, (n, pass)) in &per_op {
        let cols: Vec<String> = pass.iter().map(|p| if p == n { format!("all {p}") } else { p.to_string() }).collect();
        s.push_str(&format!("| `{op}` | {n} | {} |\n", cols.join(" | ")));
    }
    s.push_str("\n## Not supported\n\n| test | reason |\n|---|---|\n");
    for (test, (_, outcomes)) in results {
        if let Some(Outcome::Unsupported(why)) = outcomes.iter().find(|o| matches!(o, Outcome::Unsupported(_))) {
            let why = why.replace('|', "\\|").replace('\n', " ");
            let why: String = why.chars().take(160).collect();
            s.push_str(&format!("| `{test}` | {why} |\n"));
        }
    }
    s
}

#[test]
fn onnx_node_tests() {
    let Some(dir) = data_dir() else { return };
    let version = dir.parent().and_then(|p| p.file_name()).map_or("?".into(), |n| n.to_string_lossy().to_string());
    let mut backends: Vec<(&str, Arc<dyn Backend>)> = vec![("reference", Arc::new(CpuReference))];
    if !common::wgpu_skipped() {
        backends.push(("wgpu", kiln::Backend::Wgpu.into_backend().unwrap_or_else(|e| panic!("{e}"))));
    }
    let mut tests: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    tests.sort();
    assert!(tests.len() > 1000, "{}: only {} node tests", dir.display(), tests.len());
    let started = std::time::Instant::now();
    let mut results = BTreeMap::new();
    let mut failures = vec![];
    for t in &tests {
        let name = t.file_name().unwrap_or_default().to_string_lossy().to_string();
        let outcomes: Vec<Outcome> = backends
            .iter()
            .map(|(_, b)| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(t, b))).unwrap_or_else(|p| {
                    Outcome::Fail(format!("panicked: {}", p.downcast_ref::<String>().cloned().unwrap_or_default()))
                })
            })
            .collect();
        for ((b, _), o) in backends.iter().zip(&outcomes) {
            if let Outcome::Fail(m) = o {
                failures.push(format!("{name} on {b}: {m}"));
            }
        }
        results.insert(name, (op_of(t), outcomes));
    }
    let names: Vec<&str> = backends.iter().map(|(n, _)| *n).collect();
    for (k, b) in names.iter().enumerate() {
        let pass = results.values().filter(|(_, o)| o[k] == Outcome::Pass).count();
        eprintln!(
            "onnx node tests on {b}: {pass} of {} pass ({:.1} s in all)",
            tests.len(),
            started.elapsed().as_secs_f64()
        );
    }
    assert!(failures.is_empty(), "{} node test(s) failed:\n{}", failures.len(), failures.join("\n"));
    if names.len() < 2 {
        return;
    }
    let doc = table(&results, &names, &version);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/onnx.md");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &doc).unwrap();
    } else {
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(committed == doc, "docs/onnx.md differs from this run: rerun with KILN_BLESS=1 and review the diff");
    }
}
