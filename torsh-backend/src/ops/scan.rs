//! Scans: cumulative sums and products along a dim.

use crate::backend::Backend;
use crate::compute::{ScanDesc, ScanOp};
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::normalize_axis;
use crate::tensor::Tensor;

impl Backend {
    /// PyTorch's `cumsum` (`ScanOp::Sum`) or `cumprod` (`ScanOp::Prod`) along `dim` (negative
    /// counts from the end): each output element combines the input's elements up to it along the
    /// dim (see [`ScanDesc`] for how each backend accumulates). Integer inputs are first cast to
    /// `I64`, as PyTorch promotes them, so a mask's running count does not wrap; a strided view is
    /// copied dense first. Errors: `InvalidArgument` for a dim out of range (a 0-d tensor has
    /// none).
    pub fn scan(&self, op: ScanOp, x: &Tensor, dim: isize) -> Result<Tensor> {
        self.check_owner(op.name(), x)?;
        let dim = normalize_axis(op.name(), dim, x.rank())?;
        let x = if x.dtype().is_float() {
            x.contiguous()?
        } else {
            x.cast(DType::I64)?.contiguous()?
        };
        let out = self.empty(x.shape(), x.dtype())?;
        self.compute().scan(&ScanDesc {
            op,
            dtype: x.dtype(),
            input: x.strided_buf(),
            dim,
            output: out.data_ptr(),
        })?;
        Ok(out)
    }
}

impl Tensor {
    /// Cumulative sum along `dim`; see [`Backend::scan`].
    pub fn cumsum(&self, dim: isize) -> Result<Tensor> {
        self.backend().scan(ScanOp::Sum, self, dim)
    }

    /// Cumulative product along `dim`; see [`Backend::scan`].
    pub fn cumprod(&self, dim: isize) -> Result<Tensor> {
        self.backend().scan(ScanOp::Prod, self, dim)
    }
}
