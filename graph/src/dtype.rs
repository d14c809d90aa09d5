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
    /// IEEE binary64: computed as itself where the device has it (PTX; WGSL only with `shader-f64`, never
    /// in browsers), its transcendental functions written out in its own arithmetic
    /// ([`crate::f64_math`]).
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16: f32's exponent range with an 8-bit significand.
    BF16,
    /// 32-bit two's complement integer.
    I32,
    /// 64-bit two's complement integer (the reference holds it exactly within ±2^53).
    I64,
    /// 32-bit unsigned integer: computed as itself (unsigned division, comparison and right shift).
    U32,
    /// 64-bit unsigned integer (the reference holds it exactly below 2^53).
    U64,
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
    /// 4-bit two's complement integer (ONNX's `int4`: quantized weights), held one to a byte, sign-extended.
    I4,
    /// 4-bit unsigned integer (ONNX's `uint4`), held one to a byte.
    U4,
    /// 2-bit two's complement integer (ONNX's `int2`), held one to a byte, sign-extended.
    I2,
    /// 2-bit unsigned integer (ONNX's `uint2`), held one to a byte.
    U2,
    /// 8-bit float with 4 exponent and 3 mantissa bits, no infinities (OCP's E4M3FN: largest 448).
    /// A storage dtype, as in PyTorch: cast to compute.
    F8E4M3,
    /// 8-bit float with 5 exponent and 2 mantissa bits, IEEE's specials (OCP's E5M2: largest 57,344).
    /// A storage dtype, as in PyTorch: cast to compute.
    F8E5M2,
    /// 8-bit float with 4 exponent and 3 mantissa bits, exponent bias 8, one zero and one NaN (the
    /// negative zero's code, 0x80), no infinities (E4M3FNUZ, AMD's and ONNX's: largest 240).
    F8E4M3FNUZ,
    /// 8-bit float with 5 exponent and 2 mantissa bits, exponent bias 16, one zero and one NaN (0x80), no
    /// infinities (E5M2FNUZ: largest 57,344).
    F8E5M2FNUZ,
    /// 4-bit float with 2 exponent and 1 mantissa bits, exponent bias 1, no infinities and no NaN (OCP's
    /// MX E2M1, ONNX's `float4e2m1`: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}), held one to a byte. A storage dtype.
    F4E2M1,
}

/// The layout of an 8- or 4-bit float dtype: what the reference's rounding and both renderers' encoders
/// read. Codes are held one to a byte, the sign in the code's top bit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Minifloat {
    /// Bits of a code: 8, or 4 (E2M1).
    pub bits: u32,
    /// Mantissa bits (3, 2 or 1); the exponent takes the others but the sign's.
    pub mantissa_bits: u32,
    /// Exponent bias.
    pub bias: i32,
    /// Largest finite value.
    pub max: f64,
    /// Whether the all-ones exponent holds infinities and NaNs (E5M2), rather than only the one
    /// all-ones NaN (E4M3FN).
    pub infinities: bool,
    /// Whether the format has one zero, unsigned, and its NaN at the negative zero's code 0x80 (the
    /// FNUZ formats: no infinities, every other code finite).
    pub unsigned_zero: bool,
    /// Whether the format has a NaN (every 8-bit one does). Without one (E2M1) NaN casts to −0, as
    /// ONNX's reference and test data have it.
    pub nan: bool,
}

impl Minifloat {
    /// Exponent of the smallest normal value.
    pub fn emin(self) -> i32 {
        1 - self.bias
    }

    /// The sign bit of a code: 0x80, or 0x8 for a 4-bit one.
    pub fn sign_bit(self) -> u8 {
        1 << (self.bits - 1)
    }

    /// Bits of the exponent field.
    pub fn exponent_bits(self) -> u32 {
        self.bits - 1 - self.mantissa_bits
    }

    /// The value nearest `x`, ties to even; past `max` `±max`, as ONNX's saturating cast (an infinity
    /// too where the format has none); NaN stays NaN, or is −0 in a format without NaN; a zero is +0 in a
    /// format without −0. A value of the format is itself: E5M2's ±∞ too (a cast into it clamps
    /// infinities first: `Tensor::cast`).
    pub fn round(self, x: f64) -> f64 {
        if x.is_nan() && !self.nan {
            return -0.0;
        }
        if x.is_nan() || (x.is_infinite() && self.infinities) {
            return x;
        }
        let a = x.abs().min(self.max);
        let r = round_to_binary(a, self.mantissa_bits as i32 + 1, self.emin(), self.max);
        if self.unsigned_zero && r == 0.0 {
            return 0.0;
        }
        r.copysign(x)
    }

    /// Where a non-saturating cast overflows: a magnitude past `max` that rounds (to nearest, ties to
    /// even) beyond it — above `max` plus half its step, or at exactly that tie when `max`'s last
    /// mantissa bit is odd (the tie then goes up). Returns the limit and whether the tie overflows.
    pub fn overflow_limit(self) -> (f64, bool) {
        let exponent = self.max.log2().floor() as i32;
        let step = 2f64.powi(exponent - self.mantissa_bits as i32);
        let odd = (self.max / step) as u64 % 2 == 1;
        (self.max + step / 2.0, odd)
    }

    /// The code of NaN: 0x80 in the FNUZ formats, 0x7f in the others; in a format without NaN the code
    /// NaN casts to, −0's (0x8).
    pub fn nan_code(self) -> u8 {
        if self.unsigned_zero || !self.nan {
            self.sign_bit()
        } else {
            self.sign_bit() - 1
        }
    }

    /// The bits of `r`, a value of this format (`round`'s): NaN as [`Minifloat::nan_code`], ±∞ (E5M2's) as
    /// the all-ones exponent, a zero unsigned where the format has one zero.
    pub fn encode(self, r: f64) -> u8 {
        let sign = if r.is_sign_negative() && !(self.unsigned_zero && r == 0.0) { self.sign_bit() } else { 0 };
        let m = self.mantissa_bits;
        if r.is_nan() {
            return self.nan_code();
        }
        let a = r.abs();
        if a.is_infinite() {
            let top = (1u8 << self.exponent_bits()) - 1;
            return sign | if self.infinities { top << m } else { self.sign_bit() - 1 };
        }
        let exponent = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let code = if a == 0.0 || exponent < self.emin() {
            (a / 2f64.powi(self.emin() - m as i32)) as u32
        } else {
            let fraction = ((a / 2f64.powi(exponent) - 1.0) * f64::from(1u32 << m)) as u32;
            (((exponent + self.bias) as u32) << m) | fraction
        };
        sign | code as u8
    }

    /// The value of bits `c`.
    pub fn decode(self, c: u8) -> f64 {
        let m = self.mantissa_bits;
        let top = (1 << self.exponent_bits()) - 1;
        let (f, e) = (u32::from(c) & ((1 << m) - 1), (u32::from(c) >> m) & top);
        let sign = self.sign_bit();
        let v = if self.unsigned_zero {
            if c == sign {
                return f64::NAN;
            }
            if e == 0 {
                f64::from(f) * 2f64.powi(self.emin() - m as i32)
            } else {
                (1.0 + f64::from(f) / f64::from(1u32 << m)) * 2f64.powi(e as i32 - self.bias)
            }
        } else if self.infinities && e == top {
            if f == 0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        } else if self.nan && !self.infinities && c & (sign - 1) == sign - 1 {
            f64::NAN
        } else if e == 0 {
            f64::from(f) * 2f64.powi(self.emin() - m as i32)
        } else {
            (1.0 + f64::from(f) / f64::from(1u32 << m)) * 2f64.powi(e as i32 - self.bias)
        };
        if c & sign != 0 {
            -v
        } else {
            v
        }
    }
}

impl DType {
    /// Every dtype, in a fixed order (docs and tests iterate it).
    pub const ALL: [DType; 22] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U64,
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::F8E4M3FNUZ,
        DType::F8E5M2FNUZ,
        DType::F4E2M1,
    ];

    /// True for f32, f64, f16 and bf16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// True for f16 and bf16 (two-byte floats, computed in f32 where kernels can).
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// True for every integer dtype.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U32 | DType::U64) || self.is_narrow_int()
    }

    /// True for the unsigned integers (u2, u4, u8, u16, u32, u64): their division, remainder,
    /// comparisons and right shifts read the bits as unsigned.
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U2 | DType::U4 | DType::U8 | DType::U16 | DType::U32 | DType::U64)
    }

    /// True for the 2-, 4-, 8- and 16-bit integers: held in 1 or 2 bytes, computed in i32 and wrapped to
    /// their width wherever an op can leave it (so every backend agrees with the reference's modular
    /// result).
    pub fn is_narrow_int(self) -> bool {
        self.narrow_bits().is_some()
    }

    /// The layout of an 8-bit float dtype.
    pub fn minifloat(self) -> Option<Minifloat> {
        // OCP's E4M3FN; the others differ from it where they say.
        let f8 = Minifloat {
            bits: 8,
            mantissa_bits: 3,
            bias: 7,
            max: 448.0,
            infinities: false,
            unsigned_zero: false,
            nan: true,
        };
        match self {
            DType::F8E4M3 => Some(f8),
            DType::F8E5M2 => Some(Minifloat { mantissa_bits: 2, bias: 15, max: 57344.0, infinities: true, ..f8 }),
            DType::F8E4M3FNUZ => Some(Minifloat { mantissa_bits: 3, bias: 8, max: 240.0, unsigned_zero: true, ..f8 }),
            DType::F8E5M2FNUZ => {
                Some(Minifloat { mantissa_bits: 2, bias: 16, max: 57344.0, unsigned_zero: true, ..f8 })
            }
            DType::F4E2M1 => Some(Minifloat { bits: 4, mantissa_bits: 1, bias: 1, max: 6.0, nan: false, ..f8 }),
            _ => None,
        }
    }

    /// A narrow integer's width in bits and whether it is signed.
    pub fn narrow_bits(self) -> Option<(u32, bool)> {
        match self {
            DType::U8 => Some((8, false)),
            DType::I8 => Some((8, true)),
            DType::U16 => Some((16, false)),
            DType::I16 => Some((16, true)),
            DType::U4 => Some((4, false)),
            DType::I4 => Some((4, true)),
            DType::U2 => Some((2, false)),
            DType::I2 => Some((2, true)),
            _ => None,
        }
    }

    /// Bytes one element takes on a device.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 | DType::U64 | DType::F64 => 8,
            DType::Bool | DType::U8 | DType::I8 => 1,
            // The 2- and 4-bit types too: a byte an element on devices (ONNX's packed files are
            // unpacked when read).
            DType::I4 | DType::U4 | DType::I2 | DType::U2 | DType::F4E2M1 => 1,
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ => 1,
            DType::U16 | DType::I16 => 2,
        }
    }

    /// The lower-case name used in errors, docs and exports.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::F8E4M3 => "f8e4m3fn",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::I2 => "i2",
            DType::U2 => "u2",
            DType::F4E2M1 => "f4e2m1fn",
        }
    }

    /// Rounds an f64 to the nearest value this dtype can hold, returned as f64.
    ///
    /// Floats round to nearest-even; integers truncate toward zero and wrap like a device cast
    /// (NaN becomes 0, as Rust's saturating `as` gives); bool is `x != 0`.
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F32 => x as f32 as f64,
            DType::F64 => x,
            DType::F16 => round_to_binary(x, 11, -14, f16::MAX.to_f64()),
            DType::BF16 => round_to_binary(x, 8, -126, bf16::MAX.to_f64()),
            DType::I32 => (x as i64) as i32 as f64,
            DType::I64 => (x as i64) as f64,
            DType::U32 => (x as i64) as u32 as f64,
            // Through i64 so that a negative value wraps (`as u64` would saturate it to 0).
            DType::U64 if x >= 9_223_372_036_854_775_808.0 => (x as u64) as f64,
            DType::U64 => (x as i64) as u64 as f64,
            DType::U8 => (x as i64) as u8 as f64,
            DType::I8 => (x as i64) as i8 as f64,
            DType::U16 => (x as i64) as u16 as f64,
            DType::I16 => (x as i64) as i16 as f64,
            DType::I4 | DType::U4 | DType::I2 | DType::U2 => match self.narrow_bits() {
                Some((bits, signed)) => wrap(x as i64, bits, signed) as f64,
                None => x,
            },
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 => {
                self.minifloat().map_or(x, |f| f.round(x))
            }
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
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => f64::NEG_INFINITY,
            // Its layout's: -inf where it has infinities (E5M2), else its largest finite value negated.
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 => -self.max_value(),
            DType::I32 => i32::MIN as f64,
            DType::I64 => i64::MIN as f64,
            DType::I8 => i8::MIN as f64,
            DType::I16 => i16::MIN as f64,
            DType::I4 => -8.0,
            DType::I2 => -2.0,
            DType::Bool | DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::U4 | DType::U2 => 0.0,
        }
    }

    /// The largest value of this dtype (`+inf` for floats): the identity of a min reduction.
    pub fn max_value(self) -> f64 {
        match self {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => f64::INFINITY,
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 => {
                match self.minifloat() {
                    Some(f) if !f.infinities => f.max,
                    _ => f64::INFINITY,
                }
            }
            DType::I32 => i32::MAX as f64,
            DType::I64 => i64::MAX as f64,
            DType::U32 => u32::MAX as f64,
            DType::U64 => u64::MAX as f64,
            DType::U8 => u8::MAX as f64,
            DType::I8 => i8::MAX as f64,
            DType::U16 => u16::MAX as f64,
            DType::I16 => i16::MAX as f64,
            DType::I4 => 7.0,
            DType::U4 => 15.0,
            DType::I2 => 1.0,
            DType::U2 => 3.0,
            DType::Bool => 1.0,
        }
    }
}

/// `v`'s low `bits` bits as a signed or unsigned integer: the value a device's narrow store keeps.
fn wrap(v: i64, bits: u32, signed: bool) -> i64 {
    let shift = 64 - bits;
    if signed {
        (v << shift) >> shift
    } else {
        ((v as u64) << shift >> shift) as i64
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
element!(f64, DType::F64, |x| x, |y| y);
element!(f16, DType::F16, |x| x.to_f64(), |y| f16::from_f64(y));
element!(bf16, DType::BF16, |x| x.to_f64(), |y| bf16::from_f64(y));
element!(i32, DType::I32, |x| x as f64, |y| y as i32);
element!(i64, DType::I64, |x| x as f64, |y| y as i64);
element!(u32, DType::U32, |x| x as f64, |y| y as u32);
element!(u64, DType::U64, |x| x as f64, |y| y as u64);
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

    /// Each 8- and 4-bit float's overflow limit is where rounding to nearest even, with the exponent left
    /// unbounded, first leaves the format: just below it stays at `max`, just above it does not, and
    /// at the limit itself it goes up exactly when the limit says the tie overflows.
    #[test]
    fn the_overflow_limit_is_where_rounding_passes_the_largest_value() {
        let mut limits = Vec::new();
        for d in DType::ALL.into_iter().filter(|d| d.minifloat().is_some()) {
            let f = d.minifloat().unwrap();
            let (limit, tie_overflows) = f.overflow_limit();
            let unbounded = |x: f64| round_to_binary(x, f.mantissa_bits as i32 + 1, f.emin(), f64::MAX);
            assert_eq!(unbounded(limit * (1.0 - 1e-9)), f.max, "{d}");
            assert!(unbounded(limit * (1.0 + 1e-9)) > f.max, "{d}");
            assert_eq!(unbounded(limit) > f.max, tie_overflows, "{d}");
            limits.push((limit, tie_overflows));
        }
        assert_eq!(limits, [(464.0, false), (61440.0, true), (248.0, true), (61440.0, true), (7.0, true)]);
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
        assert_eq!(DType::U32.round(-1.0), 4_294_967_295.0);
        assert_eq!(DType::U32.round(4_294_967_296.0 + 5.0), 5.0);
        assert_eq!(DType::U64.round(-1.0), u64::MAX as f64);
        assert_eq!(DType::U64.round(1e19), 1e19);
        assert_eq!(DType::U64.round(2f64.powi(64)), u64::MAX as f64);
        assert_eq!(DType::I4.round(8.0), -8.0);
        assert_eq!(DType::I4.round(-9.0), 7.0);
        assert_eq!(DType::U4.round(-1.0), 15.0);
        assert_eq!(DType::I2.round(2.0), -2.0);
        assert_eq!(DType::U2.round(-3.0), 1.0);
        for d in DType::ALL.into_iter().filter(|d| d.is_narrow_int()) {
            let (bits, signed) = d.narrow_bits().unwrap();
            assert_eq!(d.size_bytes() * 8, (bits as usize).max(8), "{d}");
            assert_eq!(d.max_value() - d.min_value() + 1.0, 2f64.powi(bits as i32), "{d}");
            assert_eq!(d.min_value() < 0.0, signed, "{d}");
            assert_eq!(d.round(d.max_value() + 1.0), d.min_value(), "{d}");
        }
    }

    /// Every code of every 8- and 4-bit float decodes to a value that rounds to itself and encodes back to the
    /// code (NaNs to the NaN code, negative zero kept where the format has one, E5M2's infinities
    /// kept); ties go to the even code; past the largest finite value rounding saturates (an infinity
    /// too where the format has none).
    #[test]
    fn minifloat_codes_round_trip_and_casts_saturate() {
        for d in DType::ALL.into_iter().filter(|d| d.minifloat().is_some()) {
            let f = d.minifloat().unwrap();
            for c in 0..=((1u32 << f.bits) - 1) as u8 {
                let v = f.decode(c);
                if v.is_nan() {
                    assert_eq!(f.encode(f.round(v)), f.nan_code(), "{d} {c:#x}");
                } else if v.is_infinite() {
                    // E5M2's infinities are values of it; a cast into it saturates them.
                    assert_eq!((f.round(v), f.encode(v)), (v, c), "{d} {c:#x}");
                } else {
                    assert_eq!(f.round(v).to_bits(), v.to_bits(), "{d} {c:#x}");
                    assert_eq!(f.encode(v), c, "{d} {c:#x} = {v}");
                }
            }
            assert_eq!(d.round(1e9), f.max);
            assert_eq!(d.round(-1e9), -f.max);
            let inf = if f.infinities { f64::INFINITY } else { f.max };
            assert_eq!(d.round(f64::INFINITY), inf, "{d} holds an infinity as itself where it has them");
        }
        let e4 = DType::F8E4M3;
        // 1 + 1/16 is halfway between 1 and 1.125: to even, 1; 1.125 + 1/16 goes up to 1.25.
        assert_eq!(e4.round(1.0625), 1.0);
        assert_eq!(e4.round(1.1875), 1.25);
        // Subnormals: steps of 2^-9; half the smallest rounds to 0, just over it to the smallest.
        assert_eq!(e4.round(2f64.powi(-10)), 0.0);
        assert_eq!(e4.round(2f64.powi(-10) * 1.01), 2f64.powi(-9));
        assert_eq!(DType::F8E5M2.round(3.75), 4.0);
    }

    /// E2M1 as ONNX's table and test data have it: eight magnitudes, no infinities, no NaN (NaN casts
    /// to −0, ±∞ saturate to ±6), ties to even.
    #[test]
    fn e2m1_holds_eight_magnitudes_and_no_nan() {
        let f = DType::F4E2M1.minifloat().unwrap();
        let values: Vec<f64> = (0..8u8).map(|c| f.decode(c)).collect();
        assert_eq!(values, [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]);
        assert_eq!(f.decode(0xf), -6.0);
        assert!((0..16u8).all(|c| f.decode(c).is_finite()));
        let r = DType::F4E2M1;
        assert_eq!(r.round(f64::NAN).to_bits(), (-0f64).to_bits());
        assert_eq!(f.encode(r.round(f64::NAN)), 0x8);
        assert_eq!((r.round(f64::INFINITY), r.round(-1e6)), (6.0, -6.0));
        // 2.5 ties between 2 and 3 (to even: 2); 5 between 4 and 6 (to even: 4); 0.25 to 0.
        assert_eq!((r.round(2.5), r.round(5.0), r.round(0.25), r.round(0.26)), (2.0, 4.0, 0.0, 0.5));
        assert_eq!(r.round(0.48), 0.5);
    }

    /// The FNUZ formats as ONNX's tables have them: their largest values (0x7f), their one NaN (0x80,
    /// the only NaN code: all 255 others finite), their one zero (a negative value rounding to zero
    /// is +0, code 0), and bias 8 / 16 (E4M3FNUZ's smallest normal 2^-7, step 2^-10 below it).
    #[test]
    fn fnuz_floats_have_one_zero_and_one_nan() {
        let (e4, e5) = (DType::F8E4M3FNUZ.minifloat().unwrap(), DType::F8E5M2FNUZ.minifloat().unwrap());
        assert_eq!((e4.decode(0x7f), e5.decode(0x7f)), (240.0, 57344.0));
        assert_eq!((e4.decode(0xff), e5.decode(0xff)), (-240.0, -57344.0));
        for f in [e4, e5] {
            assert_eq!((0..=255u8).filter(|&c| f.decode(c).is_nan()).collect::<Vec<_>>(), vec![0x80]);
            assert!((0..=255u8).all(|c| !f.decode(c).is_infinite()));
            assert_eq!(f.round(-1e-9).to_bits(), 0f64.to_bits());
            assert_eq!(f.encode(f.round(-0.0)), 0);
            assert_eq!(f.encode(f64::NAN), 0x80);
            assert_eq!(f.round(f64::INFINITY), f.max);
        }
        assert_eq!(e4.decode(0x08), 2f64.powi(-7));
        assert_eq!(e4.decode(0x01), 2f64.powi(-10));
        assert_eq!(e5.decode(0x04), 2f64.powi(-15));
        assert_eq!(DType::F8E4M3FNUZ.round(241.0), 240.0);
        // OCP's E4M3FN reads 0x7f as NaN and keeps −0: the layouts differ where they should.
        assert!(DType::F8E4M3.minifloat().unwrap().decode(0x7f).is_nan());
        assert_eq!(DType::F8E4M3.round(-1e-9).to_bits(), (-0f64).to_bits());
    }
}
