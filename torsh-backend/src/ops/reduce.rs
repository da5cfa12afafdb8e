//! Reductions along an axis, with `keepdim`: `sum`, `mean`, `max`, `min`, `var`, `argmax`, `argmin`.

use crate::backend::Backend;
use crate::compute::{ReduceDesc, ReduceOp};
use crate::error::{BackendError, Result};
use crate::shape::normalize_axis;
use crate::tensor::Tensor;

impl Backend {
    /// Reduces `x` along `axis` (negative counts from the end). The result drops the axis, or keeps it
    /// with size 1 when `keepdim`. Index reductions return `I64`. `InvalidArgument` for an axis out of
    /// range, a 0-d input, or max/min/arg over an empty axis.
    pub fn reduce(&self, op: ReduceOp, x: &Tensor, axis: isize, keepdim: bool) -> Result<Tensor> {
        let dtype = self.check_operands(op.name(), &[x])?;
        if x.rank() == 0 {
            return Err(BackendError::invalid(
                op.name(),
                "cannot reduce a 0-d tensor along an axis; reshape it to [1]",
            ));
        }
        let axis = normalize_axis(op.name(), axis, x.rank())?;
        let desc_shape: Vec<usize> = x
            .shape()
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != axis)
            .map(|(_, &d)| d)
            .collect();
        let out = self.empty(&desc_shape, op.output_dtype(dtype))?;
        self.compute().reduce(&ReduceDesc {
            op,
            dtype,
            input: x.strided_buf(),
            axis,
            output: out.data_ptr(),
        })?;
        if keepdim {
            out.unsqueeze(axis as isize)
        } else {
            Ok(out)
        }
    }

    /// Sum along `axis`.
    pub fn sum(&self, x: &Tensor, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, x, axis, keepdim)
    }

    /// Mean along `axis`.
    pub fn mean(&self, x: &Tensor, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, x, axis, keepdim)
    }

    /// Maximum along `axis` (NaN propagates).
    pub fn max(&self, x: &Tensor, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, x, axis, keepdim)
    }

    /// Minimum along `axis` (NaN propagates).
    pub fn min(&self, x: &Tensor, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, x, axis, keepdim)
    }

    /// Variance along `axis` with `correction` subtracted from the count (1: unbiased, as `torch.var`).
    pub fn var(&self, x: &Tensor, axis: isize, correction: u32, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Var { correction }, x, axis, keepdim)
    }

    /// Index of the first maximum along `axis`, as `I64`.
    pub fn argmax(&self, x: &Tensor, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, x, axis, keepdim)
    }

    /// Index of the first minimum along `axis`, as `I64`.
    pub fn argmin(&self, x: &Tensor, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMin, x, axis, keepdim)
    }

    /// Sum of all elements as a 0-d tensor.
    pub fn sum_all(&self, x: &Tensor) -> Result<Tensor> {
        self.sum(&x.flatten()?, 0, false)
    }

    /// Mean of all elements as a 0-d tensor.
    pub fn mean_all(&self, x: &Tensor) -> Result<Tensor> {
        self.mean(&x.flatten()?, 0, false)
    }
}

macro_rules! tensor_reductions {
    ($($name:ident),*) => {
        impl Tensor {
            $(
                #[doc = concat!("See [`Backend::", stringify!($name), "`].")]
                pub fn $name(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
                    self.backend().$name(self, axis, keepdim)
                }
            )*
        }
    };
}

tensor_reductions!(sum, mean, max, min, argmax, argmin);

impl Tensor {
    /// See [`Backend::var`].
    pub fn var(&self, axis: isize, correction: u32, keepdim: bool) -> Result<Tensor> {
        self.backend().var(self, axis, correction, keepdim)
    }

    /// See [`Backend::sum_all`].
    pub fn sum_all(&self) -> Result<Tensor> {
        self.backend().sum_all(self)
    }

    /// See [`Backend::mean_all`].
    pub fn mean_all(&self) -> Result<Tensor> {
        self.backend().mean_all(self)
    }
}
