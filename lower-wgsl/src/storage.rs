//! How each kiln dtype is laid out in a WGSL storage buffer, and the host-side conversions. WGSL has no
//! 8- or 64-bit integers and f16 only behind the `shader-f16` feature, so some dtypes are widened on the
//! device; values always keep their dtype's precision (the shaders round on every store).

use kiln_graph::{DType, Result, TensorData};

/// The device layout of one dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    /// `array<f32>`.
    F32,
    /// `array<f16>` (device has `shader-f16`).
    F16,
    /// `array<u32>`, two f16 per word (no `shader-f16`): the host's f16 layout, computed in f32.
    F16Packed,
    /// `array<u32>`, two bf16 per word: the host's bf16 layout, computed in f32.
    Bf16Packed,
    /// `array<i32>`.
    I32,
    /// `array<i32>`, two words per element (little-endian low, high): the host's i64 layout. Shaders
    /// compute in i32 and sign-extend on store.
    I64Pairs,
    /// `array<u32>`, 0 or 1.
    BoolU32,
}

impl Storage {
    /// The layout of `dtype` on a device with or without native f16.
    pub fn of(dtype: DType, f16_native: bool) -> Storage {
        match dtype {
            DType::F32 => Storage::F32,
            DType::F16 if f16_native => Storage::F16,
            DType::F16 => Storage::F16Packed,
            DType::BF16 => Storage::Bf16Packed,
            DType::I32 => Storage::I32,
            DType::I64 => Storage::I64Pairs,
            DType::Bool => Storage::BoolU32,
        }
    }

    /// The WGSL element type of the buffer array.
    pub fn wgsl_element(self) -> &'static str {
        match self {
            Storage::F32 => "f32",
            Storage::F16 => "f16",
            Storage::I32 | Storage::I64Pairs => "i32",
            Storage::BoolU32 | Storage::F16Packed | Storage::Bf16Packed => "u32",
        }
    }

    /// Bytes `len` elements take on the device.
    pub fn bytes(self, len: usize) -> usize {
        len * match self {
            Storage::F16 | Storage::F16Packed | Storage::Bf16Packed => 2,
            Storage::I64Pairs => 8,
            _ => 4,
        }
    }

    /// The host tensor in this layout: the host's own bytes (no copy) for every layout but bool's, whose
    /// one byte per element widens to a word.
    pub fn encode(self, data: &TensorData) -> std::borrow::Cow<'_, [u8]> {
        match self {
            Storage::BoolU32 => {
                std::borrow::Cow::Owned(data.le_bytes().iter().flat_map(|&b| u32::from(b != 0).to_le_bytes()).collect())
            }
            _ => std::borrow::Cow::Borrowed(data.le_bytes()),
        }
    }

    /// A host tensor of `dtype` and `dims` from device bytes in this layout (one copy but for bool).
    pub fn decode(self, bytes: &[u8], dims: &[usize], dtype: DType) -> Result<TensorData> {
        match self {
            Storage::BoolU32 => {
                let n: usize = dims.iter().product();
                let words: Vec<u8> = bytes.chunks_exact(4).take(n).map(|w| u8::from(w != [0, 0, 0, 0])).collect();
                TensorData::from_le_bytes(&words, dims, dtype)
            }
            _ => TensorData::from_le_bytes(bytes, dims, dtype),
        }
    }
}
