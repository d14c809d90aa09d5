//! Saving and loading a module's parameters as safetensors (the format torch, JAX and candle read), by
//! parameter name, so a checkpoint written by kiln loads in `safetensors.torch.load_file` and the reverse.

use super::Module;
use crate::{DType, Error, Result, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

fn format_error(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Format { what: format!("checkpoint {}", path.display()), msg: msg.to_string() }
}

/// The safetensors name of a kiln dtype, or an error message saying why it has none.
pub(crate) fn to_safetensors(d: DType) -> std::result::Result<Dtype, String> {
    Ok(match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::I8 => Dtype::I8,
        DType::U16 => Dtype::U16,
        DType::I16 => Dtype::I16,
        DType::F8E4M3 => Dtype::F8_E4M3,
        DType::F8E5M2 => Dtype::F8_E5M2,
        DType::F8E4M3FNUZ => Dtype::F8_E4M3FNUZ,
        DType::F8E5M2FNUZ => Dtype::F8_E5M2FNUZ,
        // safetensors has no 2- or 4-bit integers, and its F4 is packed two to a byte where kiln holds
        // one: cast to a byte-wide dtype to save.
        DType::I4 | DType::U4 | DType::I2 | DType::U2 | DType::F4E2M1 => {
            return Err(format!("safetensors holds no {d} tensor a byte an element: cast it to i8, u8 or f32 to save"))
        }
    })
}

/// The kiln dtype of a safetensors one, if kiln holds it.
pub(crate) fn from_safetensors(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U32 => DType::U32,
        Dtype::U64 => DType::U64,
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::I8 => DType::I8,
        Dtype::U16 => DType::U16,
        Dtype::I16 => DType::I16,
        Dtype::F8_E4M3 => DType::F8E4M3,
        Dtype::F8_E5M2 => DType::F8E5M2,
        Dtype::F8_E4M3FNUZ => DType::F8E4M3FNUZ,
        Dtype::F8_E5M2FNUZ => DType::F8E5M2FNUZ,
        _ => return None,
    })
}

/// Writes every parameter of `module` (read back from its device) to `path`, named as
/// [`Module::parameters`] names them.
pub fn save(module: &impl Module, path: &Path) -> Result<()> {
    let data: Vec<(String, std::sync::Arc<TensorData>)> =
        module.parameters().into_iter().map(|(n, t)| Ok((n, t.to_data()?))).collect::<Result<_>>()?;
    let views = data
        .iter()
        .map(|(n, d)| {
            let dtype = to_safetensors(d.dtype()).map_err(|e| format_error(path, format!("`{n}`: {e}")))?;
            let v = safetensors::tensor::TensorView::new(dtype, d.dims().to_vec(), d.le_bytes())
                .map_err(|e| format_error(path, e))?;
            Ok((n.clone(), v))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| format_error(path, e))
}

/// `module` with every parameter replaced by the tensor of the same name in `path` (same shape and
/// dtype), placed where the module's own parameter lives. A missing name, another shape or dtype, or
/// a file that is not safetensors is an [`Error::Format`] naming it.
pub fn load<M: Module>(module: &M, path: &Path) -> Result<M> {
    let bytes = std::fs::read(path).map_err(|e| format_error(path, e))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| format_error(path, e))?;
    let mut loaded = Vec::new();
    for (name, current) in module.parameters() {
        let view = file.tensor(&name).map_err(|e| format_error(path, format!("`{name}`: {e}")))?;
        let dtype = from_safetensors(view.dtype())
            .ok_or_else(|| format_error(path, format!("`{name}` is {:?}, which kiln does not hold", view.dtype())))?;
        let want = current.shape().as_concrete().unwrap_or_default();
        if dtype != current.dtype() || view.shape() != want.as_slice() {
            return Err(format_error(
                path,
                format!("`{name}` is {dtype}{:?}, the module's is {}{want:?}", view.shape(), current.dtype()),
            ));
        }
        let t = Tensor::from_data(TensorData::from_le_bytes(view.data(), view.shape(), dtype)?);
        loaded.push(match current.value().and_then(|v| v.device()) {
            Some(d) => t.to(d.buffer.runtime().clone())?,
            None => t,
        });
    }
    module.load(&loaded)
}
