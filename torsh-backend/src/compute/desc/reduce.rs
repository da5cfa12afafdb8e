//! Reductions along one axis: the op enum and the descriptor.

use super::StridedBuf;
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::checked_numel;

/// Reductions along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (0 over an empty axis).
    Sum,
    /// Mean (NaN over an empty axis).
    Mean,
    /// Maximum; NaN propagates.
    Max,
    /// Minimum; NaN propagates.
    Min,
    /// Variance `Σ(x-μ)² / (n - correction)` (`correction = 1` is the unbiased estimator).
    Var {
        /// Subtracted from the count in the denominator.
        correction: u32,
    },
    /// Index (`i64`) of the first maximum; a NaN counts as the maximum.
    ArgMax,
    /// Index (`i64`) of the first minimum; a NaN counts as the minimum.
    ArgMin,
}

impl ReduceOp {
    /// The lowercase name used in reports.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Var { .. } => "var",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }

    /// The op's code in the kernels (`RED_SUM` = 0 ... `RED_ARGMIN` = 6 in the CUDA and WGSL
    /// sources, which their backends' tests check against this).
    pub const fn code(self) -> u32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Mean => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Var { .. } => 4,
            ReduceOp::ArgMax => 5,
            ReduceOp::ArgMin => 6,
        }
    }

    /// Every op, with a variance of correction 0, in code order.
    pub const ALL: &'static [ReduceOp] = &[
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Var { correction: 0 },
        ReduceOp::ArgMax,
        ReduceOp::ArgMin,
    ];

    /// The dtype of the result for input dtype `dtype`: `I64` for the index reductions.
    pub const fn output_dtype(self, dtype: DType) -> DType {
        match self {
            ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
            _ => dtype,
        }
    }

    /// True when the reduction has no value over an empty axis (max, min and the index reductions).
    pub const fn needs_elements(self) -> bool {
        matches!(
            self,
            ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin
        )
    }
}

/// Reduction of a strided input along `axis` into a contiguous output whose shape is the input's
/// without `axis`, of dtype [`ReduceOp::output_dtype`].
#[derive(Clone, Debug, PartialEq)]
pub struct ReduceDesc {
    /// The reduction.
    pub op: ReduceOp,
    /// Input element type.
    pub dtype: DType,
    /// Input view (rank ≥ 1).
    pub input: StridedBuf,
    /// Axis to reduce, `< rank`.
    pub axis: usize,
    /// Output pointer.
    pub output: DevicePtr,
}

impl ReduceDesc {
    /// The output shape: the input's without `axis`.
    pub fn output_shape(&self) -> Vec<usize> {
        let mut s = self.input.layout.shape().to_vec();
        if self.axis < s.len() {
            s.remove(self.axis);
        }
        s
    }

    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "reduce";
        let shape = self.input.layout.shape();
        if self.axis >= shape.len() {
            return Err(BackendError::invalid(
                op,
                format!("axis {} out of range for shape {shape:?}", self.axis),
            ));
        }
        let out_shape = self.output_shape();
        if self.op.needs_elements() && shape[self.axis] == 0 && checked_numel(op, &out_shape)? > 0 {
            return Err(BackendError::invalid(
                op,
                format!(
                    "{} over an empty axis {} of shape {shape:?} has no value",
                    self.op.name(),
                    self.axis
                ),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        self.input
            .add_region(&mut acc, "input", self.dtype, Access::Read)?;
        let out_dtype = self.op.output_dtype(self.dtype);
        acc.push_dense("output", self.output, &out_shape, out_dtype, Access::Write)?;
        Ok(acc)
    }
}

crate::compute::op::op_desc!(ReduceDesc => reduce, dtype: dtype, {
    strided "input": input,
    dense "output": output as |d: &ReduceDesc| d.op.output_dtype(d.dtype),
});
