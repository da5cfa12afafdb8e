//! Comparison and selection descriptors: masks from comparing two operands ([`CompareDesc`]) and
//! elements picked by a mask ([`WhereDesc`]).
//!
//! Masks are `U8` tensors. Comparisons write 0 or 1; every op that reads a mask takes any nonzero
//! byte as true. Either operand of a comparison and either branch of a selection may be a scalar
//! that travels in the descriptor ([`Value::Scalar`]), so comparing with or filling by a constant
//! needs no allocation and no extra launch.

use super::{check_shapes, dense_bytes, CompareOp, StridedBuf, Value};
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// `output[i] = op(lhs[i], rhs[i])` as 0 or 1 in a dense `U8` output with `lhs`'s shape, for
/// operands of any dtype (see [`CompareOp`] for the IEEE rules). `rhs` is a view with `lhs`'s shape
/// (broadcast by stride-0 dims) or a scalar ([`Value::Scalar`]). The output must not overlap an
/// input. Errors: `ShapeMismatch` for an `rhs` of another shape, `InvalidArgument` for a scalar
/// that the dtype cannot hold ([`check_scalar`](super::check_scalar)).
#[derive(Clone, Debug, PartialEq)]
pub struct CompareDesc {
    /// The op.
    pub op: CompareOp,
    /// Element type of both operands.
    pub dtype: DType,
    /// Left operand view.
    pub lhs: StridedBuf,
    /// Right operand: a view or a scalar.
    pub rhs: Value,
    /// Output pointer (dense `U8`, `lhs`'s shape).
    pub output: DevicePtr,
}

impl CompareDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "compare";
        let shape = self.lhs.layout.shape();
        check_shapes(op, shape, &[("rhs", &self.rhs)])?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        self.lhs
            .add_region(&mut acc, "lhs", self.dtype, Access::Read)?;
        self.rhs.add_region(&mut acc, "rhs", self.dtype)?;
        let bytes = dense_bytes(op, shape, DType::U8)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// PyTorch's `where`: `output[i] = if cond[i] ≠ 0 { on_true[i] } else { on_false[i] }`, elements
/// moved as they are (any dtype), into a dense output of `cond`'s shape. `cond` is a `U8` mask;
/// each branch is a view with `cond`'s shape (broadcast by stride-0 dims) or a scalar
/// ([`Value::Scalar`], converted to `dtype` once). `masked_fill` is a `where` with a scalar
/// `on_true`. The output must not overlap an input. Errors: `DTypeMismatch` for a `cond` that is
/// not `U8`, `ShapeMismatch` for a branch of another shape, `InvalidArgument` for a scalar that the
/// dtype cannot hold ([`check_scalar`](super::check_scalar)).
#[derive(Clone, Debug, PartialEq)]
pub struct WhereDesc {
    /// Element type of both branches and the output.
    pub dtype: DType,
    /// Element type of the mask; must be `U8`.
    pub cond_dtype: DType,
    /// The mask.
    pub cond: StridedBuf,
    /// Where the mask is nonzero.
    pub on_true: Value,
    /// Where the mask is zero.
    pub on_false: Value,
    /// Output pointer (dense, `cond`'s shape).
    pub output: DevicePtr,
}

impl WhereDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "where";
        if self.cond_dtype != DType::U8 {
            return Err(BackendError::DTypeMismatch {
                op,
                expected: DType::U8,
                got: self.cond_dtype,
            });
        }
        let shape = self.cond.layout.shape();
        check_shapes(
            op,
            shape,
            &[("on_true", &self.on_true), ("on_false", &self.on_false)],
        )?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        self.cond
            .add_region(&mut acc, "cond", DType::U8, Access::Read)?;
        self.on_true.add_region(&mut acc, "on_true", self.dtype)?;
        self.on_false.add_region(&mut acc, "on_false", self.dtype)?;
        let bytes = dense_bytes(op, shape, self.dtype)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

crate::compute::op::op_desc!(CompareDesc => compare, dtype: dtype, {
    strided "lhs": lhs,
    value "rhs": rhs,
    dense "output": output as |_: &CompareDesc| DType::U8,
});

crate::compute::op::op_desc!(WhereDesc => where_, dtype: dtype, {
    strided "cond": cond as |d: &WhereDesc| d.cond_dtype,
    value "on_true": on_true,
    value "on_false": on_false,
    dense "output": output,
});
