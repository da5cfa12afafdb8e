//! Sorting: `sort`, `argsort` and `topk` along a dim.

use crate::backend::Backend;
use crate::compute::SortDesc;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::normalize_axis;
use crate::tensor::Tensor;

impl Backend {
    /// PyTorch's `sort(x, dim, descending, stable=True)`: each line along `dim` (negative counts
    /// from the end) in ascending order, or descending, as `(values, indices)`: the sorted values
    /// and the `I64` position along the dim each came from. The order is total and the same on
    /// every backend: NaN after every number (first when descending), `-0` equal to `+0`, equal
    /// elements in their input order. Any dtype. Errors: `InvalidArgument` for a dim out of range
    /// (a 0-d tensor has none).
    pub fn sort(&self, x: &Tensor, dim: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        match self.sort_into(x, dim, descending, true, None)? {
            (Some(values), indices) => Ok((values, indices)),
            (None, _) => Err(BackendError::invalid("sort", "the values were not written")),
        }
    }

    /// The indices of [`Backend::sort`] alone (no values are written).
    pub fn argsort(&self, x: &Tensor, dim: isize, descending: bool) -> Result<Tensor> {
        Ok(self.sort_into(x, dim, descending, false, None)?.1)
    }

    /// PyTorch's `topk(x, k, dim, largest, sorted=True)`: the `k` largest elements of each line
    /// along `dim` (the smallest when `largest` is false), in order, with their `I64` positions;
    /// equal elements come in their input order (lowest position first), NaN counts as the largest
    /// value. The sort kernel writes only the first `k` (the CPU selects them before sorting them;
    /// the GPU kernels rank every element and keep those below `k`). Errors:
    /// `InvalidArgument` for a dim out of range or `k` past the dim's length.
    pub fn topk(
        &self,
        x: &Tensor,
        k: usize,
        dim: isize,
        largest: bool,
    ) -> Result<(Tensor, Tensor)> {
        let op = "topk";
        self.check_owner(op, x)?;
        let d = normalize_axis(op, dim, x.rank())?;
        if k > x.shape()[d] {
            return Err(BackendError::invalid(
                op,
                format!(
                    "k = {k} is past the length {} of dim {d} of shape {:?}",
                    x.shape()[d],
                    x.shape()
                ),
            ));
        }
        match self.sort_into(x, dim, largest, true, Some(k))? {
            (Some(values), indices) => Ok((values, indices)),
            (None, _) => Err(BackendError::invalid(op, "the values were not written")),
        }
    }

    /// Runs the sort kernel over a dense copy of `x`, with or without the values, keeping the
    /// first `k` of each line (all of them for `None`).
    fn sort_into(
        &self,
        x: &Tensor,
        dim: isize,
        descending: bool,
        with_values: bool,
        k: Option<usize>,
    ) -> Result<(Option<Tensor>, Tensor)> {
        let op = "sort";
        self.check_owner(op, x)?;
        let dim = normalize_axis(op, dim, x.rank())?;
        let x = x.contiguous()?;
        let k = k.unwrap_or(x.shape()[dim]);
        let mut shape = x.shape().to_vec();
        shape[dim] = k;
        let values = if with_values {
            Some(self.empty(&shape, x.dtype())?)
        } else {
            None
        };
        let indices = self.empty(&shape, DType::I64)?;
        self.compute().sort(&SortDesc {
            dtype: x.dtype(),
            input: x.strided_buf(),
            dim,
            descending,
            k,
            values: values.as_ref().map(Tensor::data_ptr),
            indices: Some(indices.data_ptr()),
        })?;
        Ok((values, indices))
    }
}

impl Tensor {
    /// `(values, indices)` of this tensor sorted along `dim`; see [`Backend::sort`].
    pub fn sort(&self, dim: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        self.backend().sort(self, dim, descending)
    }

    /// The positions that sort this tensor along `dim`; see [`Backend::argsort`].
    pub fn argsort(&self, dim: isize, descending: bool) -> Result<Tensor> {
        self.backend().argsort(self, dim, descending)
    }

    /// The `k` largest (or smallest) elements along `dim` and their positions; see
    /// [`Backend::topk`].
    pub fn topk(&self, k: usize, dim: isize, largest: bool) -> Result<(Tensor, Tensor)> {
        self.backend().topk(self, k, dim, largest)
    }
}
