//! Elementwise operands that are a view of device memory or one value for every element
//! ([`Value`]), and the checks on scalars.

use super::StridedBuf;
use crate::compute::access::{Access, Accesses};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// An elementwise operand: a strided view with the output's shape (broadcast by stride-0 dims), or
/// one value for every element.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A view of device memory.
    Tensor(StridedBuf),
    /// A scalar, converted to the op's dtype before use: rounded to nearest for float dtypes; for
    /// integer dtypes it must be a whole number in the dtype's range (see [`check_scalar`]).
    Scalar(f64),
}

impl From<StridedBuf> for Value {
    /// The view as an operand.
    fn from(view: StridedBuf) -> Value {
        Value::Tensor(view)
    }
}

impl Value {
    /// The view's shape, or `None` for a scalar.
    pub fn shape(&self) -> Option<&[usize]> {
        match self {
            Value::Tensor(b) => Some(b.layout.shape()),
            Value::Scalar(_) => None,
        }
    }

    /// The view, or `None` for a scalar.
    pub fn view(&self) -> Option<&StridedBuf> {
        match self {
            Value::Tensor(b) => Some(b),
            Value::Scalar(_) => None,
        }
    }

    /// The same operand with its view replaced by `f(view)`; a scalar stays as it is. The error of
    /// `f`, if any.
    pub fn map_view(&self, f: impl FnOnce(&StridedBuf) -> Result<StridedBuf>) -> Result<Value> {
        Ok(match self {
            Value::Tensor(b) => Value::Tensor(f(b)?),
            Value::Scalar(s) => Value::Scalar(*s),
        })
    }

    /// Adds the view's region to `acc` (a scalar has none).
    pub(crate) fn add_region(
        &self,
        acc: &mut Accesses,
        name: &'static str,
        dtype: DType,
    ) -> Result<()> {
        match self {
            Value::Tensor(b) => b.add_region(acc, name, dtype, Access::Read),
            Value::Scalar(v) => check_scalar(acc.op, dtype, *v),
        }
    }
}

/// `InvalidArgument` unless `value` converts to `dtype` without changing what it means: any value
/// (NaN and infinities included) for a float dtype; a whole number in the dtype's range for an
/// integer dtype (`I64` takes whole numbers in `[-2⁶³, 2⁶³)`, which f64 spells exactly up to 2⁵³).
pub fn check_scalar(op: &'static str, dtype: DType, value: f64) -> Result<()> {
    let range = match dtype {
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::I64 => (-(2f64.powi(63)), 2f64.powi(63)),
        DType::U8 => (0.0, 255.0),
        _ => return Ok(()),
    };
    let whole = value.is_finite() && value.fract() == 0.0;
    let inside = value >= range.0 && (value < range.1 || dtype != DType::I64 && value <= range.1);
    if whole && inside {
        Ok(())
    } else {
        Err(BackendError::invalid(
            op,
            format!("scalar {value} is not a whole number in the range of {dtype}"),
        ))
    }
}

/// `ShapeMismatch` unless every tensor operand in `values` has `shape`.
pub(crate) fn check_shapes(
    op: &'static str,
    shape: &[usize],
    values: &[(&str, &Value)],
) -> Result<()> {
    for (name, v) in values {
        if let Some(s) = v.shape().filter(|s| *s != shape) {
            return Err(BackendError::shape(
                op,
                format!(
                    "{name} {s:?} must have the output's shape {shape:?} (broadcast with stride-0 dims)"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_must_fit_integer_dtypes() {
        assert!(check_scalar("t", DType::F16, f64::NAN).is_ok());
        assert!(check_scalar("t", DType::U8, 255.0).is_ok());
        assert!(check_scalar("t", DType::U8, 256.0).is_err());
        assert!(check_scalar("t", DType::U8, -1.0).is_err());
        assert!(check_scalar("t", DType::I32, 0.5).is_err());
        assert!(check_scalar("t", DType::I32, -2147483648.0).is_ok());
        assert!(check_scalar("t", DType::I64, -(2f64.powi(63))).is_ok());
        assert!(check_scalar("t", DType::I64, 2f64.powi(63)).is_err());
        assert!(check_scalar("t", DType::I64, f64::INFINITY).is_err());
    }
}
