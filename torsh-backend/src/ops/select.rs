//! Comparisons, logical ops and selection by a mask.
//!
//! Masks are `U8` tensors holding 0 and 1 (the crate has no separate boolean dtype, as candle's
//! comparisons also answer `U8`); every op that reads a mask takes any nonzero byte as true, so a
//! mask can come from anywhere. Comparisons follow IEEE 754 (NaN compares unequal to everything,
//! itself included; `-0 == +0`) and broadcast like NumPy; scalars travel in the op's descriptor, so
//! `x.gt_scalar(0.0)` is one launch with no allocation but the output.

use crate::backend::Backend;
use crate::compute::{check_scalar, CompareDesc, CompareOp, Value, WhereDesc};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::broadcast_shapes;
use crate::tensor::Tensor;

impl Backend {
    /// `op(a, b)` elementwise as a `U8` mask of 0 and 1, after broadcasting both to their common
    /// shape; any dtype (see [`CompareOp`]). `ShapeMismatch` when the shapes do not broadcast,
    /// `DTypeMismatch` when the dtypes differ.
    pub fn compare(&self, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let dtype = self.check_operands(op.name(), &[a, b])?;
        let shape = broadcast_shapes(op.name(), a.shape(), b.shape())?;
        let (a, b) = (a.broadcast_to(&shape)?, b.broadcast_to(&shape)?);
        let out = self.empty(&shape, DType::U8)?;
        self.compute().compare(&CompareDesc {
            op,
            dtype,
            lhs: a.strided_buf(),
            rhs: Value::Tensor(b.strided_buf()),
            output: out.data_ptr(),
        })?;
        Ok(out)
    }

    /// `op(x, scalar)` elementwise as a `U8` mask. For float dtypes the scalar is rounded to `x`'s
    /// dtype first (as PyTorch does). For integer dtypes the comparison is exact against the real
    /// number `scalar`: `x.lt_scalar(2.5)` is `x <= 2`, and a scalar outside the dtype's range gives
    /// a constant mask. The logical ops take a nonzero (or NaN) scalar as true.
    pub fn compare_scalar(&self, op: CompareOp, x: &Tensor, scalar: f64) -> Result<Tensor> {
        self.check_owner(op.name(), x)?;
        let dtype = x.dtype();
        let (op, scalar) = match integer_comparison(op, dtype, scalar) {
            Comparison::Constant(v) => {
                return self.full(x.shape(), f64::from(u8::from(v)), DType::U8)
            }
            Comparison::Op(op, s) => (op, s),
        };
        let out = self.empty(x.shape(), DType::U8)?;
        self.compute().compare(&CompareDesc {
            op,
            dtype,
            lhs: x.strided_buf(),
            rhs: Value::Scalar(scalar),
            output: out.data_ptr(),
        })?;
        Ok(out)
    }

    /// PyTorch's `logical_not`: 1 where `x` is zero, else 0 (NaN is true, so it gives 0).
    pub fn logical_not(&self, x: &Tensor) -> Result<Tensor> {
        self.compare_scalar(CompareOp::Eq, x, 0.0)
    }

    /// 1 where `x` is NaN (`x != x`); all 0 for integer dtypes.
    pub fn isnan(&self, x: &Tensor) -> Result<Tensor> {
        if !x.dtype().is_float() {
            self.check_owner("isnan", x)?;
            return self.zeros(x.shape(), DType::U8);
        }
        self.compare(CompareOp::Ne, x, x)
    }

    /// 1 where `x` is ±∞ (`x == ∞ or x == −∞`, three comparison launches, so every dtype on every
    /// backend); all 0 for integer dtypes.
    pub fn isinf(&self, x: &Tensor) -> Result<Tensor> {
        if !x.dtype().is_float() {
            self.check_owner("isinf", x)?;
            return self.zeros(x.shape(), DType::U8);
        }
        let up = self.compare_scalar(CompareOp::Eq, x, f64::INFINITY)?;
        let down = self.compare_scalar(CompareOp::Eq, x, f64::NEG_INFINITY)?;
        self.compare(CompareOp::Or, &up, &down)
    }

    /// 1 where `x` is neither NaN nor ±∞ (`x > −∞ and x < ∞`); all 1 for integer dtypes.
    pub fn isfinite(&self, x: &Tensor) -> Result<Tensor> {
        if !x.dtype().is_float() {
            self.check_owner("isfinite", x)?;
            return self.full(x.shape(), 1.0, DType::U8);
        }
        let above = self.compare_scalar(CompareOp::Gt, x, f64::NEG_INFINITY)?;
        let below = self.compare_scalar(CompareOp::Lt, x, f64::INFINITY)?;
        self.compare(CompareOp::And, &above, &below)
    }

    /// PyTorch's `where(cond, a, b)`: `a` where the `U8` mask `cond` is nonzero, else `b`, all three
    /// broadcast to their common shape; elements are moved as they are, so every dtype works.
    /// Errors: `DTypeMismatch` for a `cond` that is not `U8` or branches of different dtypes,
    /// `ShapeMismatch` when the shapes do not broadcast.
    pub fn where_(&self, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let op = "where";
        self.check_mask(op, cond)?;
        let dtype = self.check_operands(op, &[a, b])?;
        let shape = broadcast_shapes(op, cond.shape(), a.shape())?;
        let shape = broadcast_shapes(op, &shape, b.shape())?;
        let (a, b) = (a.broadcast_to(&shape)?, b.broadcast_to(&shape)?);
        self.select(
            dtype,
            cond,
            Value::Tensor(a.strided_buf()),
            Value::Tensor(b.strided_buf()),
            &shape,
        )
    }

    /// PyTorch's `masked_fill`: `x` with `value` wherever the `U8` mask (broadcast to `x`'s shape)
    /// is nonzero. `value` converts to `x`'s dtype (rounded for floats; for integer dtypes it must be
    /// a whole number in range, else `InvalidArgument`). Errors: `DTypeMismatch` for a mask that is
    /// not `U8`, `ShapeMismatch` when the mask does not broadcast to `x`'s shape.
    pub fn masked_fill(&self, x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor> {
        let op = "masked_fill";
        self.check_mask(op, mask)?;
        self.check_owner(op, x)?;
        check_scalar(op, x.dtype(), value)?;
        let shape = broadcast_shapes(op, mask.shape(), x.shape())?;
        if shape != x.shape() {
            return Err(BackendError::shape(
                op,
                format!(
                    "mask {:?} must broadcast to the tensor's shape {:?}",
                    mask.shape(),
                    x.shape()
                ),
            ));
        }
        self.select(
            x.dtype(),
            mask,
            Value::Scalar(value),
            Value::Tensor(x.strided_buf()),
            &shape,
        )
    }

    /// The `where` kernel over branches already broadcast to `shape`.
    fn select(
        &self,
        dtype: DType,
        cond: &Tensor,
        on_true: Value,
        on_false: Value,
        shape: &[usize],
    ) -> Result<Tensor> {
        let cond = cond.broadcast_to(shape)?;
        let out = self.empty(shape, dtype)?;
        self.compute().where_(&WhereDesc {
            dtype,
            cond_dtype: cond.dtype(),
            cond: cond.strided_buf(),
            on_true,
            on_false,
            output: out.data_ptr(),
        })?;
        Ok(out)
    }

    /// The owner check of a mask operand, and `DTypeMismatch` unless it is `U8`.
    fn check_mask(&self, op: &'static str, mask: &Tensor) -> Result<()> {
        self.check_owner(op, mask)?;
        if mask.dtype() != DType::U8 {
            return Err(BackendError::DTypeMismatch {
                op,
                expected: DType::U8,
                got: mask.dtype(),
            });
        }
        Ok(())
    }
}

/// A comparison with a scalar, restated for the kernel.
#[derive(Debug, PartialEq)]
enum Comparison {
    /// Every element compares the same way.
    Constant(bool),
    /// The op and a scalar the dtype holds exactly.
    Op(CompareOp, f64),
}

/// `x op scalar` for `x` of `dtype`: unchanged for float dtypes; for integer dtypes, the same
/// comparison against a whole number the dtype holds, or a constant when `scalar` lies beyond the
/// dtype's range or is NaN.
fn integer_comparison(op: CompareOp, dtype: DType, scalar: f64) -> Comparison {
    if dtype.is_float() {
        return Comparison::Op(op, scalar);
    }
    let fits = |v: f64| check_scalar(op.name(), dtype, v).is_ok();
    if scalar.is_nan() {
        return match op {
            CompareOp::Ne => Comparison::Constant(true),
            CompareOp::And | CompareOp::Or | CompareOp::Xor => Comparison::Op(op, 1.0),
            _ => Comparison::Constant(false),
        };
    }
    // Each case: the bound the integers compare with, and the answer when it lies above every
    // value of the dtype (below every value, the answer is the opposite).
    let (bound, above) = match op {
        CompareOp::And | CompareOp::Or | CompareOp::Xor => {
            return Comparison::Op(op, f64::from(u8::from(scalar != 0.0)))
        }
        CompareOp::Eq | CompareOp::Ne => {
            return if fits(scalar) {
                Comparison::Op(op, scalar)
            } else {
                Comparison::Constant(op == CompareOp::Ne)
            }
        }
        // x < s ⇔ x < ⌈s⌉; x ≥ s ⇔ x ≥ ⌈s⌉; x ≤ s ⇔ x ≤ ⌊s⌋; x > s ⇔ x > ⌊s⌋.
        CompareOp::Lt => (scalar.ceil(), true),
        CompareOp::Ge => (scalar.ceil(), false),
        CompareOp::Le => (scalar.floor(), true),
        CompareOp::Gt => (scalar.floor(), false),
    };
    if fits(bound) {
        Comparison::Op(op, bound)
    } else {
        Comparison::Constant(if bound > 0.0 { above } else { !above })
    }
}

macro_rules! compare_ops {
    ($($name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                #[doc = concat!("Broadcasting `", stringify!($name), "` with `other` as a `U8` mask; see [`Backend::compare`].")]
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.backend().compare(CompareOp::$op, self, other)
                }

                #[doc = concat!("`", stringify!($name), "` with a scalar as a `U8` mask; see [`Backend::compare_scalar`].")]
                pub fn $scalar(&self, scalar: f64) -> Result<Tensor> {
                    self.backend().compare_scalar(CompareOp::$op, self, scalar)
                }
            )*
        }
    };
}

compare_ops!(
    eq, eq_scalar => Eq,
    ne, ne_scalar => Ne,
    lt, lt_scalar => Lt,
    le, le_scalar => Le,
    gt, gt_scalar => Gt,
    ge, ge_scalar => Ge,
    logical_and, logical_and_scalar => And,
    logical_or, logical_or_scalar => Or,
    logical_xor, logical_xor_scalar => Xor,
);

impl Tensor {
    /// `logical_not`; see [`Backend::logical_not`].
    pub fn logical_not(&self) -> Result<Tensor> {
        self.backend().logical_not(self)
    }

    /// `isnan`; see [`Backend::isnan`].
    pub fn isnan(&self) -> Result<Tensor> {
        self.backend().isnan(self)
    }

    /// `isinf`; see [`Backend::isinf`].
    pub fn isinf(&self) -> Result<Tensor> {
        self.backend().isinf(self)
    }

    /// `isfinite`; see [`Backend::isfinite`].
    pub fn isfinite(&self) -> Result<Tensor> {
        self.backend().isfinite(self)
    }

    /// This tensor where the `U8` mask `cond` is nonzero, else `other`; see [`Backend::where_`].
    pub fn where_(&self, cond: &Tensor, other: &Tensor) -> Result<Tensor> {
        self.backend().where_(cond, self, other)
    }

    /// This tensor with `value` where `mask` is nonzero; see [`Backend::masked_fill`].
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        self.backend().masked_fill(self, mask, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_scalars_compare_as_real_numbers() {
        use Comparison::{Constant, Op};
        let c = |op, s| integer_comparison(op, DType::I32, s);
        assert_eq!(c(CompareOp::Lt, 2.5), Op(CompareOp::Lt, 3.0));
        assert_eq!(c(CompareOp::Le, 2.5), Op(CompareOp::Le, 2.0));
        assert_eq!(c(CompareOp::Gt, -2.5), Op(CompareOp::Gt, -3.0));
        assert_eq!(c(CompareOp::Ge, -2.5), Op(CompareOp::Ge, -2.0));
        assert_eq!(c(CompareOp::Eq, 2.5), Constant(false));
        assert_eq!(c(CompareOp::Ne, 2.5), Constant(true));
        assert_eq!(c(CompareOp::Lt, 1e10), Constant(true));
        assert_eq!(c(CompareOp::Lt, -1e10), Constant(false));
        assert_eq!(c(CompareOp::Ge, 1e10), Constant(false));
        assert_eq!(c(CompareOp::Gt, f64::NEG_INFINITY), Constant(true));
        assert_eq!(c(CompareOp::Gt, f64::NAN), Constant(false));
        assert_eq!(c(CompareOp::And, 0.5), Op(CompareOp::And, 1.0));
        let u = |op, s| integer_comparison(op, DType::U8, s);
        assert_eq!(u(CompareOp::Ge, -1.5), Constant(true));
        assert_eq!(u(CompareOp::Le, 256.5), Constant(true));
        assert_eq!(
            integer_comparison(CompareOp::Lt, DType::F16, 2.5),
            Op(CompareOp::Lt, 2.5)
        );
    }
}
