//! Concrete tensor data on the host: what users hand in and read back, and what the CPU reference holds.
//!
//! Data is kept in its dtype's bytes; the f64 reference reads an f64 view of it (exact for every dtype,
//! i64 within ±2^53).

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::loc::SourceLoc;
use crate::shape::Shape;
use std::sync::OnceLock;

#[track_caller]
fn check_len(len: usize, dims: &[usize]) -> Result<()> {
    let numel: usize = dims.iter().product();
    if len == numel {
        return Ok(());
    }
    Err(Error::DataLength { len, shape: Shape::from_dims(dims).to_string(), numel, loc: SourceLoc::caller() })
}

/// The most bytes one host tensor of the reference may take: `KILN_HOST_MEMORY_LIMIT_MB` (MiB) when set,
/// so a process can bound what a model it did not write may ask for (the fuzz targets do), else
/// whatever the allocator grants.
fn host_limit() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let mb = std::env::var("KILN_HOST_MEMORY_LIMIT_MB").ok()?.trim().parse::<u64>().ok()?;
        Some(mb.saturating_mul(1 << 20))
    })
}

/// An empty vector with room for `n` f64 values, or [`Error::OutOfMemory`] (past the host limit, or
/// refused by the allocator).
pub(crate) fn host_reserve(n: usize, what: impl Fn() -> String) -> Result<Vec<f64>> {
    let mut v: Vec<f64> = Vec::new();
    let bytes = (n as u64).saturating_mul(8);
    let limit = host_limit();
    let oom = |limit| Error::OutOfMemory { device: "host".into(), what: what(), bytes, limit };
    if let Some(l) = limit.filter(|&l| bytes > l) {
        return Err(oom(Some(l)));
    }
    v.try_reserve_exact(n).map_err(|_| oom(None))?;
    Ok(v)
}

/// A dense, row-major tensor on the host, held in its dtype: f32 as 4 bytes, bf16 as 2, bool as 1, in the
/// little-endian layout devices hold (an upload is one copy). The CPU reference reads it widened to f64
/// ([`TensorData::values`]), a view made on first use and kept; data the reference computes starts as
/// that view and gets its bytes when a device or the user asks.
#[derive(Clone)]
pub struct TensorData {
    dtype: DType,
    dims: Vec<usize>,
    bytes: OnceLock<Vec<u8>>,
    values: OnceLock<Vec<f64>>,
}

impl PartialEq for TensorData {
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype && self.dims == other.dims && self.values() == other.values()
    }
}

impl std::fmt::Debug for TensorData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorData({} {:?}, {:?})", self.dtype, self.dims, self.values())
    }
}

fn with_bytes(dtype: DType, dims: Vec<usize>, bytes: Vec<u8>) -> TensorData {
    let t = TensorData { dtype, dims, bytes: OnceLock::new(), values: OnceLock::new() };
    let _ = t.bytes.set(bytes);
    t
}

impl TensorData {
    /// Builds from typed elements (one bulk copy into the dtype's bytes); errors when `values.len()` is
    /// not the product of `dims`.
    #[track_caller]
    pub fn new<T: Element>(values: &[T], dims: &[usize]) -> Result<Self> {
        check_len(values.len(), dims)?;
        Ok(with_bytes(T::DTYPE, dims.to_vec(), <T as Element>::to_le(values)))
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
        let t = TensorData { dtype, dims, bytes: OnceLock::new(), values: OnceLock::new() };
        let _ = t.values.set(values);
        t
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
        self.dims.iter().product()
    }

    /// The values widened to f64 (made from the bytes on first use, then kept).
    pub fn values(&self) -> &[f64] {
        self.values.get_or_init(|| {
            let b = self.le_bytes();
            match self.dtype {
                DType::F32 => <f32 as Element>::from_le(b).into_iter().map(f64::from).collect(),
                DType::F64 => <f64 as Element>::from_le(b),
                DType::F16 => <half::f16 as Element>::from_le(b).into_iter().map(|x| x.to_f64()).collect(),
                DType::BF16 => <half::bf16 as Element>::from_le(b).into_iter().map(|x| x.to_f64()).collect(),
                DType::I32 => <i32 as Element>::from_le(b).into_iter().map(f64::from).collect(),
                DType::I64 => <i64 as Element>::from_le(b).into_iter().map(|x| x as f64).collect(),
                DType::U32 => <u32 as Element>::from_le(b).into_iter().map(f64::from).collect(),
                DType::U64 => <u64 as Element>::from_le(b).into_iter().map(|x| x as f64).collect(),
                DType::Bool => b.iter().map(|&x| f64::from(u8::from(x != 0))).collect(),
                DType::U8 | DType::U4 | DType::U2 => b.iter().map(|&x| f64::from(x)).collect(),
                // The 2- and 4-bit signed integers are held sign-extended to their byte.
                DType::I8 | DType::I4 | DType::I2 => b.iter().map(|&x| f64::from(x as i8)).collect(),
                DType::U16 => <u16 as Element>::from_le(b).into_iter().map(f64::from).collect(),
                DType::I16 => <i16 as Element>::from_le(b).into_iter().map(f64::from).collect(),
                DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 => {
                    match self.dtype.minifloat() {
                        Some(f) => b.iter().map(|&c| f.decode(c)).collect(),
                        None => Vec::new(),
                    }
                }
            }
        })
    }

    /// The values in the dtype's own little-endian layout (`size_bytes` each; bool as one byte 0/1): what
    /// byte-addressed devices (CUDA) hold, so an upload is one copy.
    pub fn le_bytes(&self) -> &[u8] {
        self.bytes.get_or_init(|| {
            let v = self.values.get().map(Vec::as_slice).unwrap_or_default();
            match self.dtype {
                DType::F32 => <f32 as Element>::to_le(&v.iter().map(|&x| x as f32).collect::<Vec<_>>()),
                DType::F64 => <f64 as Element>::to_le(v),
                DType::F16 => {
                    <half::f16 as Element>::to_le(&v.iter().map(|&x| half::f16::from_f64(x)).collect::<Vec<_>>())
                }
                DType::BF16 => {
                    <half::bf16 as Element>::to_le(&v.iter().map(|&x| half::bf16::from_f64(x)).collect::<Vec<_>>())
                }
                DType::I32 => <i32 as Element>::to_le(&v.iter().map(|&x| x as i32).collect::<Vec<_>>()),
                DType::I64 => <i64 as Element>::to_le(&v.iter().map(|&x| x as i64).collect::<Vec<_>>()),
                DType::U32 => <u32 as Element>::to_le(&v.iter().map(|&x| x as u32).collect::<Vec<_>>()),
                DType::U64 => <u64 as Element>::to_le(&v.iter().map(|&x| x as u64).collect::<Vec<_>>()),
                DType::Bool => v.iter().map(|&x| u8::from(x != 0.0)).collect(),
                DType::U8 | DType::U4 | DType::U2 => v.iter().map(|&x| x as u8).collect(),
                DType::I8 | DType::I4 | DType::I2 => v.iter().map(|&x| x as i8 as u8).collect(),
                DType::U16 => <u16 as Element>::to_le(&v.iter().map(|&x| x as u16).collect::<Vec<_>>()),
                DType::I16 => <i16 as Element>::to_le(&v.iter().map(|&x| x as i16).collect::<Vec<_>>()),
                DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 => {
                    match self.dtype.minifloat() {
                        Some(f) => v.iter().map(|&x| f.encode(f.round(x))).collect(),
                        None => Vec::new(),
                    }
                }
            }
        })
    }

    /// [`TensorData::le_bytes`], owned.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.le_bytes().to_vec()
    }

    /// The bytes [`TensorData::le_bytes`] gives, taken (no copy when the data is held as bytes): a loader
    /// collates its next batch into the memory of one it has uploaded.
    pub fn into_le_bytes(self) -> Vec<u8> {
        self.le_bytes();
        self.bytes.into_inner().unwrap_or_default()
    }

    /// [`TensorData::from_le_bytes`] taking the bytes it is given (no copy): what a loader collating a
    /// batch hands over. Bytes past the elements are dropped.
    pub fn from_le_vec(mut bytes: Vec<u8>, dims: &[usize], dtype: DType) -> Result<Self> {
        let n = dims.iter().product::<usize>() * dtype.size_bytes();
        if bytes.len() < n {
            return Self::from_le_bytes(&bytes, dims, dtype);
        }
        bytes.truncate(n);
        Ok(with_bytes(dtype, dims.to_vec(), bytes))
    }

    /// Reads `dims` elements of `dtype` from bytes in the layout [`TensorData::le_bytes`] gives (one
    /// copy); bytes past the elements are ignored (device buffers are rounded up).
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
        Ok(with_bytes(dtype, dims.to_vec(), bytes[..n * w].to_vec()))
    }

    /// The values converted to a host element type: a bulk copy when `T` is the dtype, else a cast of
    /// each value.
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        if T::DTYPE == self.dtype {
            if let Some(b) = self.bytes.get() {
                return <T as Element>::from_le(b);
            }
        }
        self.values().iter().map(|&v| T::from_f64(T::DTYPE.round(v))).collect()
    }
}
