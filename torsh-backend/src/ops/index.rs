//! Indexing by integer index tensors (`I32` or `I64`), with PyTorch's semantics: `gather`,
//! `index_select` and `embedding`, all one [`GatherDesc`] op (the last two pass the index as a view
//! that repeats along the other dims, so nothing is copied or materialised), and `scatter`,
//! `scatter_add`, `index_add` and `one_hot`, all one [`ScatterDesc`] op on a copy of the input.
//!
//! Indices must lie in `0..size` of the dim they index (negative indices are errors, as in
//! PyTorch's `gather`); a bad one is `IndexOutOfRange` (see [`GatherDesc`] for when GPU backends
//! report it).

use crate::backend::Backend;
use crate::compute::{check_index_dtype, GatherDesc, ScatterDesc, ScatterReduce};
use crate::dtype::DType;
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

impl Backend {
    /// A copy of `x` with `src` scattered into it along `dim` by `index` (see [`ScatterDesc`]);
    /// `src` is cut to the index's shape where it is longer (PyTorch's rule).
    fn scatter_impl(
        &self,
        op: &'static str,
        x: &Tensor,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        (reduce, alpha): (ScatterReduce, f64),
    ) -> Result<Tensor> {
        let dtype = self.check_operands(op, &[x, src])?;
        self.check_owner(op, index)?;
        check_index_dtype(op, index.dtype())?;
        if x.rank() == 0 {
            normalize_axis(op, dim, 1)?;
            let one = |t: &Tensor| t.reshape(&[t.numel().max(1)]);
            let out = self.scatter_impl(
                op,
                &x.reshape(&[1])?,
                0,
                &one(index)?,
                &one(src)?,
                (reduce, alpha),
            )?;
            return out.reshape(&[]);
        }
        let dim = normalize_axis(op, dim, x.rank())?;
        let fits = src.rank() == index.rank()
            && src.shape().iter().zip(index.shape()).all(|(&s, &i)| s >= i);
        if !fits {
            return Err(BackendError::shape(
                op,
                format!(
                    "src {:?} must be at least as long as index {:?} along every dim",
                    src.shape(),
                    index.shape()
                ),
            ));
        }
        let mut src = src.clone();
        for (d, &len) in index.shape().iter().enumerate() {
            if src.shape()[d] != len {
                src = src.narrow(d as isize, 0, len)?;
            }
        }
        let out = x.copy()?;
        self.compute().scatter(&ScatterDesc {
            dtype,
            index_dtype: index.dtype(),
            reduce,
            output: out.data_ptr(),
            output_shape: out.shape().to_vec(),
            dim,
            index: index.strided_buf(),
            src: src.strided_buf(),
            alpha,
        })?;
        Ok(out)
    }

    /// PyTorch's `scatter` (out of place): a copy of `x` where, for every position `i` of `index`,
    /// the element at `i` with its coordinate along `dim` replaced by `index[i]` becomes `src[i]`.
    /// Where several positions name one element the last in row-major order wins, on every
    /// backend. `src` has `x`'s dtype and is at least as long as the index along every dim. Errors
    /// as [`Backend::gather`], and `ShapeMismatch` for a `src` shorter than the index.
    pub fn scatter(&self, x: &Tensor, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.scatter_impl("scatter", x, dim, index, src, (ScatterReduce::Assign, 1.0))
    }

    /// PyTorch's `scatter_add` (out of place): as [`Backend::scatter`], adding `src[i]` instead of
    /// replacing; repeated indices sum in the index's row-major order on every backend
    /// (deterministic). Float dtypes; `Unsupported` for others.
    pub fn scatter_add(
        &self,
        x: &Tensor,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
    ) -> Result<Tensor> {
        self.scatter_impl("scatter_add", x, dim, index, src, (ScatterReduce::Add, 1.0))
    }

    /// PyTorch's `index_add` (out of place): a copy of `x` with `alpha · src` added along `dim` at
    /// the positions in `index` (rank 1, repeats summing in order). `src` has `x`'s shape with
    /// `dim` as long as the index. Errors as [`Backend::scatter_add`], `ShapeMismatch` for an index
    /// of rank above 1 or a `src` of another shape, `InvalidArgument` for a non-finite alpha.
    pub fn index_add(
        &self,
        x: &Tensor,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        alpha: f64,
    ) -> Result<Tensor> {
        let op = "index_add";
        self.check_owner(op, index)?;
        if index.rank() > 1 {
            return Err(BackendError::shape(
                op,
                format!("index must have rank 0 or 1, got shape {:?}", index.shape()),
            ));
        }
        let rank = x.rank().max(1);
        let axis = normalize_axis(op, dim, rank)?;
        let mut want = if x.rank() == 0 {
            vec![1]
        } else {
            x.shape().to_vec()
        };
        want[axis] = index.numel();
        let src = if x.rank() == 0 {
            src.reshape(&[src.numel()])?
        } else {
            src.clone()
        };
        if src.shape() != want {
            return Err(BackendError::shape(
                op,
                format!("src must have shape {want:?}, got {:?}", src.shape()),
            ));
        }
        let mut strides = vec![0; rank];
        strides[axis] = index.strides().first().copied().unwrap_or(0);
        let spread = index.view(Layout::new(want, strides, index.layout().offset())?);
        let x1 = if x.rank() == 0 {
            x.reshape(&[1])?
        } else {
            x.clone()
        };
        let out = self.scatter_impl(
            op,
            &x1,
            axis as isize,
            &spread,
            &src,
            (ScatterReduce::Add, alpha),
        )?;
        if x.rank() == 0 {
            out.reshape(&[])
        } else {
            Ok(out)
        }
    }

    /// PyTorch's `one_hot`: a tensor of `index.shape() + [classes]` in `dtype`, 1 where the last
    /// coordinate equals the index and 0 elsewhere. Errors as [`Backend::gather`]
    /// (`IndexOutOfRange` for an index outside `0..classes`).
    pub fn one_hot(&self, index: &Tensor, classes: usize, dtype: DType) -> Result<Tensor> {
        let op = "one_hot";
        self.check_owner(op, index)?;
        check_index_dtype(op, index.dtype())?;
        let mut shape = index.shape().to_vec();
        shape.push(classes);
        let zeros = self.zeros(&shape, dtype)?;
        let at = index.unsqueeze(-1)?;
        let one = self.ones(&[1], dtype)?.reshape(&vec![1; at.rank()])?;
        let ones = one.broadcast_to(at.shape())?;
        self.scatter_impl(op, &zeros, -1, &at, &ones, (ScatterReduce::Assign, 1.0))
    }
}

impl Tensor {
    /// `scatter` along `dim`; see [`Backend::scatter`].
    pub fn scatter(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.backend().scatter(self, dim, index, src)
    }

    /// `scatter_add` along `dim`; see [`Backend::scatter_add`].
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.backend().scatter_add(self, dim, index, src)
    }

    /// `index_add` along `dim`; see [`Backend::index_add`].
    pub fn index_add(
        &self,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        alpha: f64,
    ) -> Result<Tensor> {
        self.backend().index_add(self, dim, index, src, alpha)
    }

    /// This index tensor as one-hot vectors of `classes` in `dtype`; see [`Backend::one_hot`].
    pub fn one_hot(&self, classes: usize, dtype: DType) -> Result<Tensor> {
        self.backend().one_hot(self, classes, dtype)
    }

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
