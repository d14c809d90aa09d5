//! Concrete tensor data on the host: what users hand in and read back, and what the CPU reference holds.
//!
//! Values are kept as f64 already rounded to the dtype, so one representation serves every dtype and
//! the reference can compute in f64 without conversions at each op. (i64 is exact within ±2^53.)

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::loc::SourceLoc;
use crate::shape::Shape;

#[track_caller]
fn check_len(len: usize, dims: &[usize]) -> Result<()> {
    let numel: usize = dims.iter().product();
    if len == numel {
        return Ok(());
    }
    Err(Error::DataLength { len, shape: Shape::from_dims(dims).to_string(), numel, loc: SourceLoc::caller() })
}

/// An empty vector with room for `n` f64 values, or [`Error::OutOfMemory`].
pub(crate) fn host_reserve(n: usize, what: impl Fn() -> String) -> Result<Vec<f64>> {
    let mut v: Vec<f64> = Vec::new();
    let bytes = (n as u64).saturating_mul(8);
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        device: "host".into(),
        what: what(),
        bytes,
        limit: None,
    })?;
    Ok(v)
}

/// A dense, row-major tensor on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorData {
    dtype: DType,
    dims: Vec<usize>,
    values: Vec<f64>,
}

impl TensorData {
    /// Builds from typed elements; errors when `values.len()` is not the product of `dims`.
    #[track_caller]
    pub fn new<T: Element>(values: &[T], dims: &[usize]) -> Result<Self> {
        check_len(values.len(), dims)?;
        Ok(TensorData { dtype: T::DTYPE, dims: dims.to_vec(), values: values.iter().map(|v| v.to_f64()).collect() })
    }

    /// Builds from f64 values, rounding each to `dtype`.
    #[track_caller]
    pub fn from_f64(values: Vec<f64>, dims: &[usize], dtype: DType) -> Result<Self> {
        check_len(values.len(), dims)?;
        Ok(Self::from_rounded(values.into_iter().map(|v| dtype.round(v)).collect(), dims.to_vec(), dtype))
    }

    /// Wraps values the caller has already rounded to `dtype` (the reference's hot path).
    pub(crate) fn from_rounded(values: Vec<f64>, dims: Vec<usize>, dtype: DType) -> Self {
        debug_assert_eq!(values.len(), dims.iter().product::<usize>());
        TensorData { dtype, dims, values }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dims, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The shape as constant dims.
    pub fn shape(&self) -> Shape {
        Shape::from_dims(&self.dims)
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.values.len()
    }

    /// The values widened to f64.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// The values in the dtype's own little-endian layout (`size_bytes` each; bool as one byte 0/1): what
    /// byte-addressed devices (CUDA) hold, so uploads are one copy.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.values.len() * self.dtype.size_bytes());
        for &x in &self.values {
            match self.dtype {
                DType::F32 => out.extend((x as f32).to_le_bytes()),
                DType::F16 => out.extend(half::f16::from_f64(x).to_le_bytes()),
                DType::BF16 => out.extend(half::bf16::from_f64(x).to_le_bytes()),
                DType::I32 => out.extend((x as i32).to_le_bytes()),
                DType::I64 => out.extend((x as i64).to_le_bytes()),
                DType::Bool => out.push(u8::from(x != 0.0)),
            }
        }
        out
    }

    /// Reads `dims` elements of `dtype` from bytes in the layout [`TensorData::to_le_bytes`] writes;
    /// bytes past the elements are ignored (device buffers are rounded up).
    #[track_caller]
    pub fn from_le_bytes(bytes: &[u8], dims: &[usize], dtype: DType) -> Result<Self> {
        let n: usize = dims.iter().product();
        let w = dtype.size_bytes();
        if bytes.len() < n * w {
            return Err(Error::Format {
                what: "tensor bytes".into(),
                msg: format!("{} bytes hold fewer than the {n} {} elements of {dims:?}", bytes.len(), dtype.name()),
            });
        }
        let values = bytes[..n * w]
            .chunks_exact(w)
            .map(|b| match dtype {
                DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
                DType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
                DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                DType::I64 => i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64,
                DType::Bool => f64::from(u8::from(b[0] != 0)),
            })
            .collect();
        Ok(TensorData { dtype, dims: dims.to_vec(), values })
    }

    /// The values converted to a host element type (a cast when `T` differs from the dtype).
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        self.values.iter().map(|&v| T::from_f64(T::DTYPE.round(v))).collect()
    }
}
