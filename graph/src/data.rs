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

    /// The values converted to a host element type (a cast when `T` differs from the dtype).
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        self.values.iter().map(|&v| T::from_f64(T::DTYPE.round(v))).collect()
    }
}
