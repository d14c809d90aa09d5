//! Element types. Every tensor has one; the reference computes floats in f64 and rounds each result to its
//! dtype, so what it stores is exactly what a device holding that dtype can hold.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16: f32's exponent range with an 8-bit significand.
    BF16,
    /// 32-bit two's complement integer.
    I32,
    /// 64-bit two's complement integer (the reference holds it exactly within ±2^53).
    I64,
    /// Boolean, stored as 0 or 1.
    Bool,
    /// 8-bit unsigned integer (images, quantized tensors).
    U8,
    /// 8-bit two's complement integer (quantized tensors).
    I8,
    /// 16-bit unsigned integer.
    U16,
    /// 16-bit two's complement integer.
    I16,
}

impl DType {
    /// Every dtype, in a fixed order (docs and tests iterate it).
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
    ];

    /// True for f32, f16 and bf16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// True for f16 and bf16 (two-byte floats, computed in f32 where kernels can).
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// True for every integer dtype.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64) || self.is_narrow_int()
    }

    /// True for the 8- and 16-bit integers: held in 1 or 2 bytes, computed in i32 and wrapped to their
    /// width wherever an op can leave it (so every backend agrees with the reference's modular result).
    pub fn is_narrow_int(self) -> bool {
        matches!(self, DType::U8 | DType::I8 | DType::U16 | DType::I16)
    }

    /// A narrow integer's width in bits and whether it is signed.
    pub fn narrow_bits(self) -> Option<(u32, bool)> {
        match self {
            DType::U8 => Some((8, false)),
            DType::I8 => Some((8, true)),
            DType::U16 => Some((16, false)),
            DType::I16 => Some((16, true)),
            _ => None,
        }
    }

    /// Bytes one element takes on a device.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 => 2,
        }
    }

    /// The lower-case name used in errors, docs and exports.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
        }
    }

    /// Rounds an f64 to the nearest value this dtype can hold, returned as f64.
    ///
    /// Floats round to nearest-even; integers truncate toward zero and wrap like a device cast
    /// (NaN becomes 0, as Rust's saturating `as` gives); bool is `x != 0`.
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F32 => x as f32 as f64,
            DType::F16 => round_to_binary(x, 11, -14, f16::MAX.to_f64()),
            DType::BF16 => round_to_binary(x, 8, -126, bf16::MAX.to_f64()),
            DType::I32 => (x as i64) as i32 as f64,
            DType::I64 => (x as i64) as f64,
            DType::U8 => (x as i64) as u8 as f64,
            DType::I8 => (x as i64) as i8 as f64,
            DType::U16 => (x as i64) as u16 as f64,
            DType::I16 => (x as i64) as i16 as f64,
            DType::Bool => {
                if x != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }

    /// The smallest value of this dtype (`-inf` for floats): the identity of a max reduction.
    pub fn min_value(self) -> f64 {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => f64::NEG_INFINITY,
            DType::I32 => i32::MIN as f64,
            DType::I64 => i64::MIN as f64,
            DType::I8 => i8::MIN as f64,
            DType::I16 => i16::MIN as f64,
            DType::Bool | DType::U8 | DType::U16 => 0.0,
        }
    }

    /// The largest value of this dtype (`+inf` for floats): the identity of a min reduction.
    pub fn max_value(self) -> f64 {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => f64::INFINITY,
            DType::I32 => i32::MAX as f64,
            DType::I64 => i64::MAX as f64,
            DType::U8 => u8::MAX as f64,
            DType::I8 => i8::MAX as f64,
            DType::U16 => u16::MAX as f64,
            DType::I16 => i16::MAX as f64,
            DType::Bool => 1.0,
        }
    }
}

/// Rounds `x` to nearest-even in a binary format with `precision` significand bits, minimum normal
/// exponent `emin` and largest finite value `max`, in one step.
///
/// Written out because converting f64 through f32 first (what `half`'s `from_f64` does) rounds twice and
/// is off by one ulp on values just above a tie.
fn round_to_binary(x: f64, precision: i32, emin: i32, max: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let a = x.abs();
    let biased = ((a.to_bits() >> 52) & 0x7ff) as i32;
    let exponent = (biased - 1023).max(emin);
    // Scaling by a power of two is exact, and so is rounding to an integer in f64.
    let quantum = 2f64.powi(exponent - (precision - 1));
    let r = (a / quantum).round_ties_even() * quantum;
    let r = if r > max { f64::INFINITY } else { r };
    r.copysign(x)
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A host element type that converts to and from a kiln dtype.
pub trait Element: Copy + 'static {
    /// The dtype this Rust type stores.
    const DTYPE: DType;
    /// Widens to f64 (exact for every dtype but i64 beyond ±2^53).
    fn to_f64(self) -> f64;
    /// Narrows from an f64 already rounded to `DTYPE`.
    fn from_f64(x: f64) -> Self;
    /// The elements in their little-endian byte layout, in bulk (one copy for every dtype but bool).
    fn to_le(values: &[Self]) -> Vec<u8>;
    /// Elements from bytes in that layout, in bulk.
    fn from_le(bytes: &[u8]) -> Vec<Self>;
}

// kiln's host layout is little-endian, as the devices': the bulk casts below rely on it.
#[cfg(target_endian = "big")]
compile_error!("kiln's host tensors use the little-endian layout of its devices");

macro_rules! element {
    ($t:ty, $d:expr, |$x:ident| $to:expr, |$y:ident| $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            fn from_f64($y: f64) -> Self {
                $from
            }
            fn to_le(values: &[Self]) -> Vec<u8> {
                bytemuck::cast_slice(values).to_vec()
            }
            fn from_le(bytes: &[u8]) -> Vec<Self> {
                // An owned copy: `bytes` need not be aligned for the element type.
                bytes.chunks_exact(std::mem::size_of::<Self>()).map(bytemuck::pod_read_unaligned).collect()
            }
        }
    };
}

element!(f32, DType::F32, |x| x as f64, |y| y as f32);
element!(f16, DType::F16, |x| x.to_f64(), |y| f16::from_f64(y));
element!(bf16, DType::BF16, |x| x.to_f64(), |y| bf16::from_f64(y));
element!(i32, DType::I32, |x| x as f64, |y| y as i32);
element!(i64, DType::I64, |x| x as f64, |y| y as i64);
element!(u8, DType::U8, |x| x as f64, |y| y as u8);
element!(i8, DType::I8, |x| x as f64, |y| y as i8);
element!(u16, DType::U16, |x| x as f64, |y| y as u16);
element!(i16, DType::I16, |x| x as f64, |y| y as i16);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    fn from_f64(x: f64) -> Self {
        x != 0.0
    }
    fn to_le(values: &[Self]) -> Vec<u8> {
        values.iter().map(|&b| u8::from(b)).collect()
    }
    fn from_le(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_rounding_is_single_step() {
        // Just above the tie between 1 and 1 + 2^-10: must round up (via f32 it would tie to 1).
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(DType::F16.round(x), 1.0 + 2f64.powi(-10));
        assert_eq!(DType::F16.round(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(DType::F16.round(65519.0), 65504.0);
        assert_eq!(DType::F16.round(65520.0), f64::INFINITY);
        assert_eq!(DType::F16.round(2f64.powi(-25)), 0.0);
        assert_eq!(DType::F16.round(3.0 * 2f64.powi(-26)), 2f64.powi(-24));
        assert_eq!(DType::F16.round(3.0 * 2f64.powi(-25)), 2f64.powi(-23));
        assert_eq!(DType::BF16.round(-4.6044615e-6f32 as f64), bf16::from_f32(-4.6044615e-6).to_f64());
        assert!(DType::BF16.round(f64::NAN).is_nan());
        assert_eq!(DType::BF16.round(-0.0).to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn narrow_integers_wrap_like_a_device_store() {
        assert_eq!(DType::U8.round(300.0), 44.0);
        assert_eq!(DType::U8.round(-1.0), 255.0);
        assert_eq!(DType::I8.round(128.0), -128.0);
        assert_eq!(DType::I8.round(-129.7), 127.0);
        assert_eq!(DType::U16.round(65536.0 + 7.0), 7.0);
        assert_eq!(DType::I16.round(32768.0), -32768.0);
        assert_eq!(DType::U8.round(f64::NAN), 0.0);
        for d in DType::ALL.into_iter().filter(|d| d.is_narrow_int()) {
            let (bits, signed) = d.narrow_bits().unwrap();
            assert_eq!(d.size_bytes() * 8, bits as usize, "{d}");
            assert_eq!(d.min_value() < 0.0, signed, "{d}");
            assert_eq!(d.round(d.max_value() + 1.0), d.min_value(), "{d}");
        }
    }
}
