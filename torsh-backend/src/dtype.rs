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
element!(f16, DType::F16, |x| x.to_f64(), |v| f16::from_f64(v));
element!(bf16, DType::BF16, |x| x.to_f64(), |v| bf16::from_f64(v));
element!(i32, DType::I32, |x| x as f64, |v| v as i32);
element!(i64, DType::I64, |x| x as f64, |v| v as i64);
element!(u8, DType::U8, |x| x as f64, |v| v as u8);

#[cfg(test)]
mod tests {
    use super::*;

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
}
