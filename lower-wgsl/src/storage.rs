//! How each kiln dtype is laid out in a WGSL storage buffer. WGSL has no 8-, 16- or 64-bit integers and f16
//! only behind the `shader-f16` feature, so some dtypes are packed or widened on the device; values
//! always keep their dtype's precision (the shaders round on every store). Every layout holds the
//! host's bytes but bool's, whose words the target's `bool_words` tells the runtime core about.

use kiln_graph::DType;

/// The device layout of one dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    /// `array<f32>`.
    F32,
    /// `array<f64>` (device has `shader-f64`).
    F64,
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
    /// `array<u32>`.
    U32,
    /// `array<u32>`, two words per element: the host's u64 layout. Shaders compute in u32 and
    /// zero-extend on store.
    U64Pairs,
    /// `array<u32>`, 0 or 1.
    BoolU32,
    /// `array<u32>`, `32 / bits` narrow integers per word (the host's layout), computed in i32: read with
    /// `extractBits` (sign-extending when signed), written as the packed halves are. The 2- and 4-bit
    /// integers take a byte each, sign-extended where signed, as on the host.
    NarrowInt {
        /// Bits of storage an element: 8 or 16.
        bits: u32,
        /// Sign-extended on load.
        signed: bool,
    },
    /// `array<u32>`, four 8-bit (or 4-bit, a byte each) floats per word, computed in f32: decoded on load
    /// (`kf8_value`), encoded on store (`kf8_bits`), written as the packed halves are. The dtype's layout
    /// (`DType::minifloat`) says how.
    Minifloat(DType),
}

impl Storage {
    /// The layout of `dtype` on a device with or without native f16.
    pub fn of(dtype: DType, f16_native: bool) -> Storage {
        if let Some((_, signed)) = dtype.narrow_bits() {
            return Storage::NarrowInt { bits: 8 * dtype.size_bytes() as u32, signed };
        }
        if dtype.minifloat().is_some() {
            return Storage::Minifloat(dtype);
        }
        // The rest, one word (or two) an element.
        match dtype {
            DType::F32 => Storage::F32,
            DType::F64 => Storage::F64,
            DType::F16 if f16_native => Storage::F16,
            DType::F16 => Storage::F16Packed,
            DType::BF16 => Storage::Bf16Packed,
            DType::I32 => Storage::I32,
            DType::I64 => Storage::I64Pairs,
            DType::U32 => Storage::U32,
            DType::U64 => Storage::U64Pairs,
            DType::Bool => Storage::BoolU32,
            // Not reached (laid out above): named, not `_`, so a new dtype must be placed here.
            DType::U8 | DType::I8 | DType::U16 | DType::I16 => Storage::I32,
            DType::I4 | DType::U4 | DType::I2 | DType::U2 => Storage::I32,
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 => Storage::I32,
        }
    }

    /// Whether elements share 32-bit words that different threads write (stores are atomic).
    pub fn shares_words(self) -> bool {
        matches!(self, Storage::F16Packed | Storage::Bf16Packed | Storage::NarrowInt { .. } | Storage::Minifloat(_))
    }

    /// The WGSL element type of the buffer array.
    pub fn wgsl_element(self) -> &'static str {
        match self {
            Storage::F32 => "f32",
            Storage::F64 => "f64",
            Storage::F16 => "f16",
            Storage::I32 | Storage::I64Pairs => "i32",
            Storage::U32
            | Storage::U64Pairs
            | Storage::BoolU32
            | Storage::F16Packed
            | Storage::Bf16Packed
            | Storage::NarrowInt { .. }
            | Storage::Minifloat(_) => "u32",
        }
    }
}
