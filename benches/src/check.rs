//! Output checks: every timed configuration's own output, at the size it was timed, compared element by
//! element with an expected output — torch's float64 run on the same seeded inputs where the peer wrote
//! one, else kiln's f64 reference — under the one tolerance rule (`kiln_graph::tolerance`, stated in every
//! report).

pub use kiln_graph::tolerance::{compare, compare_values, Expected, Outcome, Tolerance, RULE};
use kiln_graph::TensorData;

/// Kiln's f64 reference (the CPU interpreter) for `f` on `inputs`: every output, in order (a train
/// step's loss, updated parameters and optimizer state are all checked).
pub fn reference(
    f: fn(&[kiln::Tensor]) -> kiln::Result<Vec<kiln::Tensor>>,
    inputs: &[TensorData],
    source: &str,
) -> kiln::Result<Vec<Expected>> {
    let inputs: Vec<kiln::Tensor> = inputs.iter().map(|d| kiln::Tensor::from_data(d.clone())).collect();
    let out = kiln::compile(|x: Vec<kiln::Tensor>| f(&x)).backend(kiln::Backend::Cpu).call(inputs)?;
    if out.is_empty() {
        return Err(kiln::Error::Format { what: source.into(), msg: "no output".into() });
    }
    out.iter().map(|t| Ok(Expected::of(&*t.to_data()?, source))).collect()
}

/// The outputs of a safetensors file (F32, F64, BF16 or F16) in order: tensor `out`, then `out.1`,
/// `out.2`, … while present (a train step's state after the step); `None` when the file does not exist.
pub fn load(path: &std::path::Path, source: &str) -> kiln::Result<Option<Vec<Expected>>> {
    let bad = |msg: String| kiln::Error::Format { what: format!("expected outputs {}", path.display()), msg };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
    };
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let mut all = vec![tensor(&file, "out", source).map_err(bad)?];
    while let Ok(e) = tensor(&file, &format!("out.{}", all.len()), source) {
        all.push(e);
    }
    Ok(Some(all))
}

/// Tensor `name` of `file`, widened to f64.
fn tensor(file: &safetensors::SafeTensors, name: &str, source: &str) -> Result<Expected, String> {
    let t = file.tensor(name).map_err(|e| e.to_string())?;
    let data = t.data();
    use safetensors::Dtype as D;
    let values: Vec<f64> = match t.dtype() {
        D::F32 => data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        D::F64 => data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(),
        D::BF16 => data.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        D::F16 => data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        other => return Err(format!("tensor `{name}` is {other:?}, not a float")),
    };
    Ok(Expected::new(t.shape().to_vec(), values, source))
}

/// Fills in the peer's rows' checks: torch's own output in each mode at the check size
/// (`DIR/<id>.check.<mode>.safetensors`, written by the peer for the same seeded inputs) against kiln's
/// f64 reference, under the same rule. Rows without a file stay unchecked.
pub fn peer_rows(results: &mut [crate::report::ResultRow], dir: &std::path::Path) -> kiln::Result<()> {
    let all: Vec<_> = kiln_graph::workloads::all().into_iter().chain(crate::train_step::all()).collect();
    let mut reference: std::collections::BTreeMap<(String, bool), (Vec<Expected>, Tolerance)> = Default::default();
    for r in results.iter_mut().filter(|r| r.backend.starts_with("torch") && r.correct.is_none()) {
        let path = dir.join(format!("{}.check.{}.safetensors", r.workload, r.mode));
        let Some(got) = load(&path, "torch")? else { continue };
        let base = crate::timing::base_id(&r.workload).to_string();
        let Some(w) = all.iter().find(|w| w.id == base) else { continue };
        // torch runs f32 convolutions in TF32 on CUDA by default (the peer reports the flag), as kiln's
        // CUDA target does: its rows get the rule kiln's CUDA rows get, other backends the plain one.
        let on_cuda = r.backend == "torch-cuda";
        let key = (base.clone(), on_cuda);
        if !reference.contains_key(&key) {
            let inputs: Vec<TensorData> = kiln_graph::workloads::inputs(&w.check);
            let want = self::reference(w.f, &inputs, "kiln's f64 reference (check size)")?;
            let graph = kiln_graph::capture(&w.check, w.f)?;
            let tol = match on_cuda {
                true => Tolerance::of_on(&graph, &kiln_graph::Target::cuda(90))?,
                false => Tolerance::of(&graph)?,
            };
            reference.insert(key.clone(), (want, tol));
        }
        let (want, tol) = &reference[&key];
        // Every output kiln's reference has must be in torch's file (a train step writes its whole state).
        let o = Outcome::of_each(want, &got, |g, w| compare_values(&g.dims, &g.values, w, *tol));
        r.max_rel_err = Some(o.max_rel_err);
        r.correct = Some(o.correct);
        r.checked =
            Some(format!("{} ({} outputs), rtol {:.1e}, atol {:.1e}", want[0].source, want.len(), tol.rtol, tol.atol));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_output_of_a_file_is_loaded_in_order() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (a, b, c) = (f32s(&[1.0, 2.0]), f32s(&[3.0]), f32s(&[4.0, 5.0, 6.0]));
        fn view(bytes: &[u8], n: usize) -> safetensors::tensor::TensorView<'_> {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![n], bytes).expect("a view")
        }
        // Written out of order, read in output order; a gap (no out.3) ends the list.
        let tensors =
            vec![("out.2", view(&c, 3)), ("out", view(&a, 2)), ("out.1", view(&b, 1)), ("out.4", view(&b, 1))];
        let path = std::env::temp_dir().join(format!("kiln-check-load-{}.safetensors", std::process::id()));
        safetensors::serialize_to_file(tensors, None, &path).expect("writes");
        let got = load(&path, "test").expect("reads").expect("exists");
        let _ = std::fs::remove_file(&path);
        let values: Vec<Vec<f64>> = got.iter().map(|e| e.values.clone()).collect();
        assert_eq!(values, vec![vec![1.0, 2.0], vec![3.0], vec![4.0, 5.0, 6.0]]);
        assert!(load(&std::env::temp_dir().join("no-such-kiln-file"), "test").expect("fine").is_none());
    }
}
