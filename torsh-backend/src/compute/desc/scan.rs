//! Scan descriptors: inclusive prefix sums and products along one dim.

use super::index::check_dim;
use super::{dense_bytes, ScanOp, StridedBuf};
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::Result;

/// PyTorch's `cumsum` / `cumprod` along `dim`: `output[.., i, ..] = input[.., 0, ..] ∘ … ∘
/// input[.., i, ..]` (see [`ScanOp`]), into a dense output of the input's shape and dtype. The input
/// may be any strided view. Every dtype: floats accumulate in order along the dim (the reference in
/// f64, rounding each output once; the other backends in their kernels' accumulation type, f32 for
/// f16, bf16 and f32 and f64 for f64, as a sequential sum in that type rounds); integers wrap as
/// two's complement in the dtype. The output must not overlap the input. Errors: `InvalidArgument`
/// for `dim >= rank` (a 0-d input has no dim to scan).
#[derive(Clone, Debug, PartialEq)]
pub struct ScanDesc {
    /// Sum or product.
    pub op: ScanOp,
    /// Element type of input and output.
    pub dtype: DType,
    /// Input view.
    pub input: StridedBuf,
    /// The dim scanned along.
    pub dim: usize,
    /// Output pointer (dense, the input's shape).
    pub output: DevicePtr,
}

impl ScanDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "scan";
        let shape = self.input.layout.shape();
        check_dim(op, self.dim, shape.len())?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        self.input
            .add_region(&mut acc, "input", self.dtype, Access::Read)?;
        let bytes = dense_bytes(op, shape, self.dtype)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }

    /// The lengths before, along and after the dim: `(outer, len, inner)`.
    pub fn geometry(&self) -> (usize, usize, usize) {
        let shape = self.input.layout.shape();
        let outer = shape[..self.dim].iter().product();
        let inner = shape[self.dim + 1..].iter().product();
        (outer, shape[self.dim], inner)
    }
}

crate::compute::op::op_desc!(ScanDesc => scan, dtype: dtype, {
    strided "input": input,
    dense "output": output,
});
