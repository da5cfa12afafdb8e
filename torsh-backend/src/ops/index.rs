//! Indexing by integer index tensors (`I32` or `I64`), with PyTorch's semantics: `gather`,
//! `index_select` and `embedding`, all one [`GatherDesc`] op (the last two pass the index as a view
//! that repeats along the other dims, so nothing is copied or materialised).
//!
//! Indices must lie in `0..size` of the dim they index (negative indices are errors, as in
//! PyTorch's `gather`); a bad one is `IndexOutOfRange` (see [`GatherDesc`] for when GPU backends
//! report it).

use crate::backend::Backend;
use crate::compute::{check_index_dtype, GatherDesc};
use crate::error::{BackendError, Result};
use crate::shape::{normalize_axis, Layout};
use crate::tensor::Tensor;

use super::expect_rank;

impl Backend {
    /// PyTorch's `gather`: `out[i] = x[i with its coordinate along dim replaced by index[i]]`, with
    /// the index's shape and `x`'s dtype. `index` has `x`'s rank and along every other dim is no
    /// longer than `x`. Errors: `DeviceMismatch` for a tensor of another backend, `DTypeMismatch` for
    /// a non-integer index, `ShapeMismatch` for ranks or lengths that do not fit, `InvalidArgument`
    /// for a dim out of range, `IndexOutOfRange` for an index outside `0..x.shape()[dim]`.
    pub fn gather(&self, x: &Tensor, dim: isize, index: &Tensor) -> Result<Tensor> {
        let op = "gather";
        self.check_owner(op, x)?;
        self.check_owner(op, index)?;
        check_index_dtype(op, index.dtype())?;
        if x.rank() != index.rank() {
            return Err(BackendError::shape(
                op,
                format!(
                    "x {:?} and index {:?} must have the same rank",
                    x.shape(),
                    index.shape()
                ),
            ));
        }
        if x.rank() == 0 {
            normalize_axis(op, dim, 1)?;
            return self
                .gather(&x.reshape(&[1])?, 0, &index.reshape(&[1])?)?
                .reshape(&[]);
        }
        let dim = normalize_axis(op, dim, x.rank())?;
        let out = self.empty(index.shape(), x.dtype())?;
        self.compute().gather(&GatherDesc {
            dtype: x.dtype(),
            index_dtype: index.dtype(),
            input: x.strided_buf(),
            dim,
            index: index.strided_buf(),
            output: out.data_ptr(),
        })?;
        Ok(out)
    }

    /// PyTorch's `index_select`: the slices of `x` along `dim` at the positions in `index` (rank 1,
    /// or 0-d for one slice), in index order, repeats allowed. The result has `x`'s shape with
    /// `dim` as long as the index. Errors as [`Backend::gather`], and `ShapeMismatch` for an index of
    /// rank above 1.
    pub fn index_select(&self, x: &Tensor, dim: isize, index: &Tensor) -> Result<Tensor> {
        let op = "index_select";
        self.check_owner(op, index)?;
        if index.rank() > 1 {
            return Err(BackendError::shape(
                op,
                format!("index must have rank 0 or 1, got shape {:?}", index.shape()),
            ));
        }
        if x.rank() == 0 {
            normalize_axis(op, dim, 1)?;
            return self.index_select(&x.reshape(&[1])?, 0, index)?.reshape(&[]);
        }
        let dim = normalize_axis(op, dim, x.rank())?;
        let mut shape = x.shape().to_vec();
        shape[dim] = index.numel();
        let mut strides = vec![0; x.rank()];
        strides[dim] = index.strides().first().copied().unwrap_or(0);
        let spread = index.view(Layout::new(shape, strides, index.layout().offset())?);
        self.gather(x, dim as isize, &spread)
    }

    /// PyTorch's `embedding`: the rows of `weight` (`[num_embeddings, dim]`) at the positions in
    /// `index` (any shape), as a tensor of shape `index.shape() + [dim]`. Errors as
    /// [`Backend::gather`], and `ShapeMismatch` unless `weight` has rank 2.
    pub fn embedding(&self, weight: &Tensor, index: &Tensor) -> Result<Tensor> {
        let op = "embedding";
        expect_rank(op, "weight", weight, 2)?;
        self.check_owner(op, index)?;
        let k = index.rank();
        if k == 0 {
            let row = self.embedding(weight, &index.reshape(&[1])?)?;
            return row.reshape(&[weight.shape()[1]]);
        }
        // The weight repeated along the index's leading dims, gathered along dim k − 1 by the index
        // repeated along the embedding dim.
        let (rows, width) = (weight.shape()[0], weight.shape()[1]);
        let mut shape = index.shape()[..k - 1].to_vec();
        shape.extend([rows, width]);
        let mut strides = vec![0; k - 1];
        strides.extend_from_slice(weight.strides());
        let table = weight.view(Layout::new(shape, strides, weight.layout().offset())?);
        let mut shape = index.shape().to_vec();
        shape.push(width);
        let mut strides = index.strides().to_vec();
        strides.push(0);
        let spread = index.view(Layout::new(shape, strides, index.layout().offset())?);
        self.gather(&table, k as isize - 1, &spread)
    }
}

impl Tensor {
    /// `gather` along `dim` by `index`; see [`Backend::gather`].
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        self.backend().gather(self, dim, index)
    }

    /// `index_select` along `dim`; see [`Backend::index_select`].
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        self.backend().index_select(self, dim, index)
    }

    /// This tensor as an embedding table, looked up at `index`; see [`Backend::embedding`].
    pub fn embedding(&self, index: &Tensor) -> Result<Tensor> {
        self.backend().embedding(self, index)
    }
}
