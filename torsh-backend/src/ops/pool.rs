//! `max_pool2d` and `avg_pool2d` over NCHW tensors, and their input gradients.

use crate::backend::Backend;
use crate::compute::{Pool2dBackwardDesc, Pool2dDesc, PoolKind};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::tensor::Tensor;

use super::{expect_rank, expect_shape};

/// A pooling window. `Pool2dConfig::new([2, 2])` gives a 2×2 window with stride 2 and no padding
/// (PyTorch's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dConfig {
    /// Window `[kh, kw]`.
    pub kernel: [usize; 2],
    /// `[sh, sw]`.
    pub stride: [usize; 2],
    /// Implicit padding `[ph, pw]`, at most half the window.
    pub padding: [usize; 2],
    /// For average pooling: divide by the whole window including padding (PyTorch's default `true`).
    pub count_include_pad: bool,
}

impl Pool2dConfig {
    /// A window of `kernel` with stride equal to the window and no padding.
    pub fn new(kernel: [usize; 2]) -> Self {
        Pool2dConfig {
            kernel,
            stride: kernel,
            padding: [0, 0],
            count_include_pad: true,
        }
    }
}

impl Backend {
    /// The pooled output, and the `I64` positions of the maxima when `with_indices`.
    fn pool2d(
        &self,
        kind: PoolKind,
        x: &Tensor,
        config: Pool2dConfig,
        with_indices: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let op = "pool2d";
        let dtype = self.check_operands(op, &[x])?;
        expect_rank(op, "input", x, 4)?;
        let s = x.shape();
        let input_shape = [s[0], s[1], s[2], s[3]];
        let output_shape = Pool2dDesc::expected_output_shape(
            input_shape,
            config.kernel,
            config.stride,
            config.padding,
        )?;
        let out = self.empty(&output_shape, dtype)?;
        let indices = if with_indices {
            Some(self.empty(&output_shape, DType::I64)?)
        } else {
            None
        };
        if out.numel() == 0 {
            return Ok((out, indices));
        }
        let x = x.contiguous()?;
        self.compute().pool2d(&Pool2dDesc {
            kind,
            dtype,
            input: x.data_ptr(),
            input_shape,
            output: out.data_ptr(),
            output_shape,
            kernel: config.kernel,
            stride: config.stride,
            padding: config.padding,
            indices: indices.as_ref().map(Tensor::data_ptr),
        })?;
        Ok((out, indices))
    }

    /// The gradient of a pooling of an input of `input_shape` by `config`, from `grad` (the pooled
    /// output's gradient) and, for a max, the forward's `indices`.
    fn pool2d_backward(
        &self,
        kind: PoolKind,
        grad: &Tensor,
        indices: Option<&Tensor>,
        input_shape: &[usize],
        config: Pool2dConfig,
    ) -> Result<Tensor> {
        let op = "pool2d_backward";
        let dtype = self.check_operands(op, &[grad])?;
        expect_rank(op, "grad", grad, 4)?;
        let input_shape: [usize; 4] = input_shape.try_into().map_err(|_| {
            BackendError::shape(
                op,
                format!("the input shape must have rank 4, got {input_shape:?}"),
            )
        })?;
        let s = grad.shape();
        let grad_shape = [s[0], s[1], s[2], s[3]];
        if let Some(ix) = indices {
            self.check_owner(op, ix)?;
            if ix.dtype() != DType::I64 {
                return Err(BackendError::DTypeMismatch {
                    op,
                    expected: DType::I64,
                    got: ix.dtype(),
                });
            }
            expect_shape(op, "indices", ix, &grad_shape)?;
        }
        let expected = Pool2dDesc::expected_output_shape(
            input_shape,
            config.kernel,
            config.stride,
            config.padding,
        )?;
        expect_shape(op, "grad", grad, &expected)?;
        let out = self.empty(&input_shape, dtype)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let grad = grad.contiguous()?;
        let indices = indices.map(Tensor::contiguous).transpose()?;
        self.compute().pool2d_backward(&Pool2dBackwardDesc {
            kind,
            dtype,
            grad: grad.data_ptr(),
            grad_shape,
            indices: indices.as_ref().map(Tensor::data_ptr),
            output: out.data_ptr(),
            input_shape,
            kernel: config.kernel,
            stride: config.stride,
            padding: config.padding,
        })?;
        Ok(out)
    }

    /// Max over each window of `[N, C, H, W]`. `ShapeMismatch` when the window exceeds the padded input;
    /// `InvalidArgument` for a zero window or stride, or padding over half the window.
    pub fn max_pool2d(&self, x: &Tensor, config: Pool2dConfig) -> Result<Tensor> {
        Ok(self.pool2d(PoolKind::Max, x, config, false)?.0)
    }

    /// [`Backend::max_pool2d`] and, as PyTorch's `return_indices=True`, the position of each
    /// window's maximum within its `H·W` plane (`I64`, the output's shape): the first tap holding the
    /// largest value in row-major window order, or the last NaN. Errors as [`Backend::max_pool2d`].
    pub fn max_pool2d_with_indices(
        &self,
        x: &Tensor,
        config: Pool2dConfig,
    ) -> Result<(Tensor, Tensor)> {
        let (out, indices) = self.pool2d(PoolKind::Max, x, config, true)?;
        let indices = indices.ok_or_else(|| BackendError::invalid("pool2d", "no indices"))?;
        Ok((out, indices))
    }

    /// The gradient of [`Backend::max_pool2d_with_indices`] with respect to its input of
    /// `input_shape`: each element of `grad` (the pooled output's gradient) is added to the input
    /// element its index names, so overlapping windows that picked the same element both reach it
    /// (in row-major window order). Errors: `ShapeMismatch` when `input_shape` is not of rank 4 or
    /// `grad` and `indices` are not the forward's output shape; `DTypeMismatch` when `indices` is not
    /// `I64`; `IndexOutOfRange` for an index that is not the position of an element inside its own
    /// window (on GPUs reported at the next synchronize or host read; see [`Pool2dBackwardDesc`]);
    /// the window errors of [`Backend::max_pool2d`].
    pub fn max_pool2d_backward(
        &self,
        grad: &Tensor,
        indices: &Tensor,
        input_shape: &[usize],
        config: Pool2dConfig,
    ) -> Result<Tensor> {
        self.pool2d_backward(PoolKind::Max, grad, Some(indices), input_shape, config)
    }

    /// Mean over each window of `[N, C, H, W]`; errors as [`Backend::max_pool2d`].
    pub fn avg_pool2d(&self, x: &Tensor, config: Pool2dConfig) -> Result<Tensor> {
        Ok(self.pool2d(avg(config), x, config, false)?.0)
    }

    /// The gradient of [`Backend::avg_pool2d`] with respect to its input of `input_shape`: each
    /// element of `grad` divided by its window's divisor (per `config.count_include_pad`) and added
    /// to every input element of its window. Errors as [`Backend::max_pool2d_backward`] without the
    /// index ones.
    pub fn avg_pool2d_backward(
        &self,
        grad: &Tensor,
        input_shape: &[usize],
        config: Pool2dConfig,
    ) -> Result<Tensor> {
        self.pool2d_backward(avg(config), grad, None, input_shape, config)
    }
}

/// The average pooling `config` asks for.
fn avg(config: Pool2dConfig) -> PoolKind {
    PoolKind::Avg {
        count_include_pad: config.count_include_pad,
    }
}

impl Tensor {
    /// See [`Backend::max_pool2d`].
    pub fn max_pool2d(&self, config: Pool2dConfig) -> Result<Tensor> {
        self.backend().max_pool2d(self, config)
    }

    /// See [`Backend::avg_pool2d`].
    pub fn avg_pool2d(&self, config: Pool2dConfig) -> Result<Tensor> {
        self.backend().avg_pool2d(self, config)
    }

    /// See [`Backend::max_pool2d_with_indices`].
    pub fn max_pool2d_with_indices(&self, config: Pool2dConfig) -> Result<(Tensor, Tensor)> {
        self.backend().max_pool2d_with_indices(self, config)
    }
}
