//! What a training run has to write down to continue exactly where it stopped: the model's parameters,
//! the optimizer's moments (and a half-precision model's f32 masters), where in which epoch the loop was,
//! the callbacks' own memory and the history so far. Every random choice the loop makes (the epoch's
//! order, the dropout keys) is a function of the seed and the step, so nothing else is needed for the
//! continuation to be bit-identical to a run that never stopped.

use super::metrics::History;
use crate::nn::Module;
use crate::optim::AdamWState;
use crate::{Error, Result, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The loop's position and memory, as `state.json` holds it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// Epoch the loop is in (from 0).
    pub epoch: u64,
    /// The next batch of that epoch to train on.
    pub batch: usize,
    /// Optimizer steps taken.
    pub step: u64,
    /// The seed every random choice derives from.
    pub seed: u64,
    /// The best value of the monitored metric so far, and the epoch it was reached in.
    pub best: Option<(f64, u64)>,
    /// Epochs since the monitored metric last improved (early stopping's count).
    pub stale_epochs: u64,
    /// Every step's and epoch's metrics so far.
    pub history: History,
}

/// The version of the checkpoint layout this build writes and reads.
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    #[serde(flatten)]
    state: LoopState,
}

fn format_error(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Format { what: format!("training checkpoint {}", path.display()), msg: msg.to_string() }
}

/// Writes a checkpoint to the directory `dir` (replacing one there): `model.safetensors` (loadable by
/// [`crate::nn::load`] and by torch), `optimizer.safetensors` and `state.json`. It is written beside
/// `dir` and renamed into place, so a run killed while writing leaves the previous checkpoint whole.
pub fn save<M: Module>(
    dir: &Path,
    model: &M,
    masters: Option<&[Tensor]>,
    optimizer: &AdamWState,
    state: &LoopState,
) -> Result<()> {
    let staging = sibling(dir, "writing");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| format_error(&staging, e))?;
    crate::nn::save(model, &staging.join("model.safetensors"))?;
    let names: Vec<String> = model.parameters().into_iter().map(|(n, _)| n).collect();
    let mut tensors: Vec<(String, std::sync::Arc<TensorData>)> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        tensors.push((format!("m.{name}"), optimizer.m[i].to_data()?));
        tensors.push((format!("v.{name}"), optimizer.v[i].to_data()?));
        if let Some(w) = masters {
            tensors.push((format!("master.{name}"), w[i].to_data()?));
        }
    }
    let optim_path = staging.join("optimizer.safetensors");
    let views = tensors
        .iter()
        .map(|(n, d)| {
            let dtype = crate::nn::safetensors_dtype(d.dtype())
                .map_err(|e| format_error(&optim_path, format!("`{n}`: {e}")))?;
            let v = safetensors::tensor::TensorView::new(dtype, d.dims().to_vec(), d.le_bytes())
                .map_err(|e| format_error(&optim_path, e))?;
            Ok((n.clone(), v))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = [("adamw_step".to_string(), optimizer.step.to_string())].into_iter().collect();
    safetensors::serialize_to_file(views, Some(meta), &optim_path).map_err(|e| format_error(&optim_path, e))?;
    let json = serde_json::to_string_pretty(&StateFile { version: VERSION, state: state.clone() })
        .map_err(|e| format_error(dir, e))?;
    std::fs::write(staging.join("state.json"), json).map_err(|e| format_error(&staging, e))?;
    // Swap the new checkpoint in: the old one moves aside first, so one whole checkpoint always exists.
    let old = sibling(dir, "old");
    let _ = std::fs::remove_dir_all(&old);
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(|e| format_error(dir, e))?;
    }
    std::fs::rename(&staging, dir).map_err(|e| format_error(dir, e))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// `dir` with `.suffix` appended to its last component.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".{suffix}"));
    dir.with_file_name(name)
}

/// A checkpoint read back: the model (its parameters placed where `like`'s are), the masters, the
/// optimizer's state and the loop's.
pub struct Restored<M> {
    /// The model with the checkpoint's parameters.
    pub model: M,
    /// A half-precision model's f32 masters.
    pub masters: Option<Vec<Tensor>>,
    /// The optimizer's moments and step count.
    pub optimizer: AdamWState,
    /// Where the loop was.
    pub state: LoopState,
}

/// Reads the checkpoint in `dir` for a model shaped like `like` (same parameter names, shapes and
/// dtypes; `mixed`: with f32 masters). A missing file or tensor, a layout of another version or a
/// mismatched parameter is an [`Error::Format`] naming it.
pub fn load<M: Module>(dir: &Path, like: &M, mixed: bool) -> Result<Restored<M>> {
    // A run killed between [`save`]'s two renames left its previous checkpoint beside the directory.
    let old = sibling(dir, "old");
    let dir = if !dir.join("state.json").exists() && old.join("state.json").exists() { old.as_path() } else { dir };
    let state_path = dir.join("state.json");
    let text = std::fs::read_to_string(&state_path).map_err(|e| format_error(&state_path, e))?;
    let file: StateFile = serde_json::from_str(&text).map_err(|e| format_error(&state_path, e))?;
    if file.version != VERSION {
        return Err(format_error(&state_path, format!("layout version {}, this build reads {VERSION}", file.version)));
    }
    let model = crate::nn::load(like, &dir.join("model.safetensors"))?;
    let optim_path = dir.join("optimizer.safetensors");
    let bytes = std::fs::read(&optim_path).map_err(|e| format_error(&optim_path, e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| format_error(&optim_path, e))?;
    let step = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("adamw_step"))
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| format_error(&optim_path, "no `adamw_step` in its metadata"))?;
    let file_tensors = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format_error(&optim_path, e))?;
    let anchor = like.tensors();
    let read = |name: &str, want: &Tensor, dtype: crate::DType| -> Result<Tensor> {
        let view = file_tensors.tensor(name).map_err(|e| format_error(&optim_path, format!("`{name}`: {e}")))?;
        let got = crate::nn::kiln_dtype(view.dtype())
            .ok_or_else(|| format_error(&optim_path, format!("`{name}` is {:?}", view.dtype())))?;
        let dims = want.shape().as_concrete().unwrap_or_default();
        if got != dtype || view.shape() != dims.as_slice() {
            return Err(format_error(
                &optim_path,
                format!("`{name}` is {got}{:?}, the trainer's is {dtype}{dims:?}", view.shape()),
            ));
        }
        let t = Tensor::from_data(TensorData::from_le_bytes(view.data(), view.shape(), got)?);
        match want.value().and_then(|v| v.device()) {
            Some(d) => t.to(d.buffer.runtime().clone()),
            None => Ok(t),
        }
    };
    let (mut m, mut v, mut masters) = (Vec::new(), Vec::new(), Vec::new());
    for ((name, _), p) in like.parameters().into_iter().zip(&anchor) {
        // Moments and masters are f32 for a half-precision model (the update runs on the masters).
        let dtype = if mixed { crate::DType::F32 } else { p.dtype() };
        m.push(read(&format!("m.{name}"), p, dtype)?);
        v.push(read(&format!("v.{name}"), p, dtype)?);
        if mixed {
            masters.push(read(&format!("master.{name}"), p, crate::DType::F32)?);
        }
    }
    Ok(Restored { model, masters: mixed.then_some(masters), optimizer: AdamWState { m, v, step }, state: file.state })
}
