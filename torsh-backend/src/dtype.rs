//! Element types: [`DType`] names them at run time, [`Element`] ties them to Rust types.

use std::fmt;

use half::{bf16, f16};

/// The element type of a tensor or of a buffer passed to a [`crate::ComputeBackend`] op.
///
/// Floating types carry the numerics; `I32`, `I64` and `U8` serve as indices, masks and raw data
/// (they can be created, filled, cast, copied and read back; math ops on them answer
/// [`crate::BackendError::Unsupported`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE-754 binary32.
    F32,
    /// IEEE-754 binary64.
    F64,
    /// IEEE-754 binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`): f32's exponent with an 8-bit significand.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer (the dtype of `argmax` results).
    I64,
    /// Unsigned 8-bit integer.
    U8,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
    ];

    /// The floating-point dtypes, which every math op supports on the reference backend.
    pub const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

    /// Size of one element in bytes.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// The lowercase name used in messages and reports (`"f32"`, `"bf16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
        }
    }

    /// True for `F32`, `F64`, `F16` and `BF16`.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Parses a name as printed by [`DType::name`]; `None` for anything else.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the host representation of a [`DType`].
///
/// Implemented for `f32`, `f64`, `half::f16`, `half::bf16`, `i32`, `i64` and `u8`; sealed.
pub trait Element:
    bytemuck::Pod + Copy + Send + Sync + fmt::Debug + sealed::Sealed + 'static
{
    /// The dtype this type represents.
    const DTYPE: DType;
    /// Converts to f64 (exact for every type but `i64` beyond 2^53).
    fn to_f64(self) -> f64;
    /// Converts from f64 with Rust `as` semantics (round to nearest for floats; truncate toward zero
    /// and saturate for integers, NaN becoming 0).
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, |$x:ident| $to:expr, |$v:ident| $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            fn from_f64($v: f64) -> Self {
                $from
            }
        }
    };
}

element!(f32, DType::F32, |x| x as f64, |v| v as f32);
element!(f64, DType::F64, |x| x, |v| v);
element!(f16, DType::F16, |x| x.to_f64(), |v| f16_from_f64(v));
element!(bf16, DType::BF16, |x| x.to_f64(), |v| bf16_from_f64(v));

/// `v` rounded to f32 *to odd*: the nearest f32 when exact, otherwise whichever of the two neighbours
/// has an odd last bit. Rounding that result again to a format with at least two bits fewer (f16,
/// bf16) gives the correctly rounded value of `v`, where plain `v as f32` could round twice.
fn f32_rounded_to_odd(v: f64) -> f32 {
    let r = v as f32;
    if !r.is_finite() || r as f64 == v || r.to_bits() & 1 == 1 {
        return r;
    }
    // r is even and inexact: step to its odd neighbour on v's side.
    let bits = r.to_bits();
    f32::from_bits(if (r as f64).abs() > v.abs() {
        bits - 1
    } else {
        bits + 1
    })
}

/// f64 → f16 rounded to nearest, ties to even, once. (`half::f16::from_f64` goes through f32 with
/// plain rounding on x86 with F16C, which rounds twice, and directly elsewhere, so its answers
/// depend on the machine; every backend here uses this instead.)
pub fn f16_from_f64(v: f64) -> f16 {
    f16::from_f32(f32_rounded_to_odd(v))
}

/// f64 → bf16 rounded to nearest, ties to even, once. (`half::bf16::from_f64` drops the low 32
/// significand bits before rounding, which misrounds values just above a tie.)
pub fn bf16_from_f64(v: f64) -> bf16 {
    bf16::from_f32(f32_rounded_to_odd(v))
}
element!(i32, DType::I32, |x| x as f64, |v| v as i32);
element!(i64, DType::I64, |x| x as f64, |v| v as i64);
element!(u8, DType::U8, |x| x as f64, |v| v as u8);

/// Decodes one element of `dtype` from the start of `b` as f64.
pub(crate) fn decode(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::F64 => f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
        DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::I32 | DType::I64 | DType::U8 => decode_int(dtype, b) as f64,
    }
}

/// Decodes one integer element of `dtype` (0 for a float dtype: callers branch on the dtype first).
pub(crate) fn decode_int(dtype: DType, b: &[u8]) -> i64 {
    match dtype {
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
        DType::I64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
        DType::U8 => b[0] as i64,
        _ => 0,
    }
}

/// Encodes `v` as `dtype` into the start of `out`, rounding to nearest for floats and with Rust `as`
/// semantics for integers.
pub(crate) fn encode(dtype: DType, v: f64, out: &mut [u8]) {
    match dtype {
        DType::F32 => out[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out[..8].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out[..2].copy_from_slice(&f16_from_f64(v).to_le_bytes()),
        DType::BF16 => out[..2].copy_from_slice(&bf16_from_f64(v).to_le_bytes()),
        DType::I32 => out[..4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => out[..8].copy_from_slice(&(v as i64).to_le_bytes()),
        DType::U8 => out[0] = v as u8,
    }
}

/// `v` encoded as one element of `dtype` (as [`encode`] does), in the low bits of a little-endian
/// word.
pub(crate) fn element_bits(dtype: DType, v: f64) -> u64 {
    let mut b = [0u8; 8];
    encode(dtype, v, &mut b);
    u64::from_le_bytes(b)
}

/// `v` as the nearest value of `dtype` (encoded, then decoded), as f64.
pub(crate) fn rounded(dtype: DType, v: f64) -> f64 {
    decode(dtype, &element_bits(dtype, v).to_le_bytes())
}

/// Encodes integer `v` as `dtype`, wrapping for narrower integers and rounding for floats.
pub(crate) fn encode_int(dtype: DType, v: i64, out: &mut [u8]) {
    match dtype {
        DType::I32 => out[..4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => out[..8].copy_from_slice(&v.to_le_bytes()),
        DType::U8 => out[0] = v as u8,
        _ => encode(dtype, v as f64, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_to_16_bit_floats_round_once() {
        // 1 + 2^-11 is a tie between f16 neighbours; a hair above it must round up, not to even.
        let above_tie = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f16_from_f64(above_tie).to_bits(), 0x3c01);
        assert_eq!(f16_from_f64(1.0 + 2f64.powi(-11)).to_bits(), 0x3c00);
        assert_eq!(f16_from_f64(1.0 + 3.0 * 2f64.powi(-11)).to_bits(), 0x3c02);
        let above_bf16_tie = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(bf16_from_f64(above_bf16_tie).to_bits(), 0x3f81);
        assert_eq!(bf16_from_f64(1.0 + 2f64.powi(-8)).to_bits(), 0x3f80);
        // Overflow, underflow, signs and NaN.
        assert_eq!(f16_from_f64(65520.0).to_bits(), 0x7c00);
        assert_eq!(f16_from_f64(65519.99).to_bits(), 0x7bff);
        assert_eq!(f16_from_f64(-(2f64.powi(-25))).to_bits(), 0x8000);
        assert_eq!(f16_from_f64(2f64.powi(-25) * 1.0000001).to_bits(), 0x0001);
        assert_eq!(bf16_from_f64(1e-300).to_bits(), 0);
        assert_eq!(bf16_from_f64(3.4e38).to_bits(), 0x7f80);
        assert!(f16_from_f64(f64::NAN).is_nan() && bf16_from_f64(f64::NAN).is_nan());
        // Agreement with the single rounding from f32 wherever the f64 is an f32.
        for bits in (0..u32::MAX).step_by(65_521) {
            let x = f32::from_bits(bits);
            if x.is_nan() {
                continue;
            }
            assert_eq!(f16_from_f64(x as f64), f16::from_f32(x), "{x:e}");
            assert_eq!(bf16_from_f64(x as f64), bf16::from_f32(x), "{x:e}");
        }
    }

    #[test]
    fn sizes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::BF16.size_in_bytes(), 2);
        assert_eq!(DType::I64.size_in_bytes(), 8);
        assert_eq!(DType::from_name("f8"), None);
        assert!(DType::F16.is_float() && !DType::U8.is_float());
    }

    #[test]
    fn element_bits_encode_as_the_reference_does() {
        assert_eq!(element_bits(DType::F32, 1.5), u64::from(1.5f32.to_bits()));
        assert_eq!(element_bits(DType::F64, -0.375), (-0.375f64).to_bits());
        assert_eq!(element_bits(DType::F16, 1.0), 0x3c00);
        assert_eq!(element_bits(DType::BF16, -2.0), 0xc000);
        // Overflows to +inf.
        assert_eq!(element_bits(DType::F16, 1e6), 0x7c00);
        // Float → integer: truncation toward zero, saturation, NaN → 0.
        assert_eq!(element_bits(DType::I32, -2.9), u64::from((-2i32) as u32));
        assert_eq!(element_bits(DType::I32, 1e12), u64::from(i32::MAX as u32));
        assert_eq!(element_bits(DType::I32, f64::NAN), 0);
        assert_eq!(element_bits(DType::I64, -1e30), i64::MIN as u64);
        assert_eq!(element_bits(DType::U8, 300.7), 255);
        assert_eq!(element_bits(DType::U8, -5.0), 0);
        assert_eq!(element_bits(DType::U8, 7.99), 7);
    }
}
