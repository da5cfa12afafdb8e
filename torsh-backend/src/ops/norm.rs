//! `softmax`, `log_softmax`, `layer_norm` and `batch_norm` (training and inference, running statistics).

use crate::backend::Backend;
use crate::compute::{BatchNormDesc, LayerNormDesc, SoftmaxDesc};
use crate::error::{BackendError, Result};
use crate::shape::normalize_axis;
use crate::tensor::Tensor;

use super::{expect_shape, product, with_dense_inplace};

/// Everything `batch_norm` can take beyond the input. `BatchNormConfig::default()` is PyTorch's:
/// inference mode, momentum 0.1, eps 1e-5, no affine parameters, no running statistics.
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchNormConfig<'a> {
    /// Per-channel scale `[C]`.
    pub weight: Option<&'a Tensor>,
    /// Per-channel shift `[C]`.
    pub bias: Option<&'a Tensor>,
    /// Running mean `[C]`: updated in place in training, used in inference.
    pub running_mean: Option<&'a Tensor>,
    /// Running variance `[C]`: updated in place in training (unbiased batch variance), used in inference.
    pub running_var: Option<&'a Tensor>,
    /// Training mode: normalise with batch statistics.
    pub training: bool,
    /// Weight of the batch statistics in the running update (`None`: 0.1).
    pub momentum: Option<f64>,
    /// Added to the variance (`None`: 1e-5).
    pub eps: Option<f64>,
}

impl Backend {
    fn softmax_impl(&self, x: &Tensor, axis: isize, log: bool) -> Result<Tensor> {
        let op = if log { "log_softmax" } else { "softmax" };
        let dtype = self.check_operands(op, &[x])?;
        let (x, shape) = if x.rank() == 0 {
            (x.reshape(&[1])?, vec![])
        } else {
            (x.clone(), x.shape().to_vec())
        };
        let axis = normalize_axis(op, axis, x.rank())?;
        let out = self.empty(&shape, dtype)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let x = x.contiguous()?;
        self.compute().softmax(&SoftmaxDesc {
            dtype,
            input: x.data_ptr(),
            output: out.data_ptr(),
            outer: product(&x.shape()[..axis]),
            axis_len: x.shape()[axis],
            inner: product(&x.shape()[axis + 1..]),
            log,
        })?;
        Ok(out)
    }

    /// Softmax along `axis` (negative counts from the end). `InvalidArgument` for an axis out of range.
    pub fn softmax(&self, x: &Tensor, axis: isize) -> Result<Tensor> {
        self.softmax_impl(x, axis, false)
    }

    /// Log-softmax along `axis`, computed stably (not as `log(softmax)`).
    pub fn log_softmax(&self, x: &Tensor, axis: isize) -> Result<Tensor> {
        self.softmax_impl(x, axis, true)
    }

    /// The gradient of [`Backend::softmax`]'s input along `axis` from `grad`, its output's
    /// gradient, and `y`, its output: `y · (grad − Σ grad · y)`, the sum along `axis` (PyTorch's
    /// `_softmax_backward_data`). Composed of elementwise ops and one sum, so it runs on every
    /// backend; four passes over the data, not yet one fused kernel. Errors: `ShapeMismatch` when
    /// `grad` and `y` differ in shape, `DTypeMismatch` when their dtypes differ, `InvalidArgument`
    /// for an axis out of range.
    pub fn softmax_backward(&self, grad: &Tensor, y: &Tensor, axis: isize) -> Result<Tensor> {
        let op = "softmax_backward";
        self.check_operands(op, &[grad, y])?;
        expect_shape(op, "grad", grad, y.shape())?;
        let dot = self.sum(&grad.mul(y)?, axis, true)?;
        y.mul(&grad.sub(&dot)?)
    }

    /// The gradient of [`Backend::log_softmax`]'s input along `axis` from `grad` and `y`, its
    /// output: `grad − exp(y) · Σ grad`, the sum along `axis` (PyTorch's
    /// `_log_softmax_backward_data`). Composed as [`Backend::softmax_backward`] is. Errors as
    /// [`Backend::softmax_backward`].
    pub fn log_softmax_backward(&self, grad: &Tensor, y: &Tensor, axis: isize) -> Result<Tensor> {
        let op = "log_softmax_backward";
        self.check_operands(op, &[grad, y])?;
        expect_shape(op, "grad", grad, y.shape())?;
        let total = self.sum(grad, axis, true)?;
        grad.sub(&y.exp()?.mul(&total)?)
    }

    /// Layer normalisation over the trailing dims given by `normalized_shape`, with optional `weight` and
    /// `bias` of that shape, as `torch.nn.functional.layer_norm`. `ShapeMismatch` when the trailing dims
    /// or the affine parameters do not match; `InvalidArgument` for a negative or non-finite eps.
    pub fn layer_norm(
        &self,
        x: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = "layer_norm";
        let mut operands = vec![x];
        operands.extend(weight);
        operands.extend(bias);
        let dtype = self.check_operands(op, &operands)?;
        let r = normalized_shape.len();
        if r == 0 || x.rank() < r || &x.shape()[x.rank() - r..] != normalized_shape {
            return Err(BackendError::shape(
                op,
                format!("normalized_shape {normalized_shape:?} must be non-empty and end the input shape {:?}", x.shape()),
            ));
        }
        for (name, p) in [("weight", weight), ("bias", bias)] {
            if let Some(p) = p {
                expect_shape(op, name, p, normalized_shape)?;
            }
        }
        let out = self.empty(x.shape(), dtype)?;
        let cols = product(normalized_shape);
        let rows = product(&x.shape()[..x.rank() - r]);
        let (x, w, b) = (
            x.contiguous()?,
            weight.map(Tensor::contiguous).transpose()?,
            bias.map(Tensor::contiguous).transpose()?,
        );
        self.compute().layer_norm(&LayerNormDesc {
            dtype,
            input: x.data_ptr(),
            weight: w.as_ref().map(Tensor::data_ptr),
            bias: b.as_ref().map(Tensor::data_ptr),
            output: out.data_ptr(),
            rows,
            cols,
            eps,
        })?;
        Ok(out)
    }

    /// Batch normalisation with running statistics: `mean` and `var` are the
    /// running statistics (updated in place when `training`), momentum 0.1, eps 1e-5, no affine
    /// parameters. See [`Backend::batch_norm_with`].
    pub fn batch_norm(
        &self,
        input: &Tensor,
        mean: &Tensor,
        var: &Tensor,
        training: bool,
    ) -> Result<Tensor> {
        self.batch_norm_with(
            input,
            BatchNormConfig {
                running_mean: Some(mean),
                running_var: Some(var),
                training,
                ..Default::default()
            },
        )
    }

    /// Batch normalisation of `input` `[N, C, ...]` per channel, as `torch.nn.functional.batch_norm`.
    /// `ShapeMismatch` for rank < 2 or per-channel tensors not of shape `[C]`; `InvalidArgument` for
    /// training with one value per channel, inference without running statistics, or a bad
    /// momentum/eps.
    pub fn batch_norm_with(&self, input: &Tensor, config: BatchNormConfig<'_>) -> Result<Tensor> {
        let op = "batch_norm";
        let per_channel = [
            config.weight,
            config.bias,
            config.running_mean,
            config.running_var,
        ];
        let mut operands = vec![input];
        operands.extend(per_channel.iter().flatten().copied());
        let dtype = self.check_operands(op, &operands)?;
        if input.rank() < 2 {
            return Err(BackendError::shape(
                op,
                format!("input must be [N, C, ...], got {:?}", input.shape()),
            ));
        }
        let (n, c) = (input.shape()[0], input.shape()[1]);
        for (name, t) in ["weight", "bias", "running_mean", "running_var"]
            .into_iter()
            .zip(per_channel)
        {
            if let Some(t) = t {
                expect_shape(op, name, t, &[c])?;
            }
        }
        let out = self.empty(input.shape(), dtype)?;
        let x = input.contiguous()?;
        let (w, b) = (
            config.weight.map(Tensor::contiguous).transpose()?,
            config.bias.map(Tensor::contiguous).transpose()?,
        );
        let run = |rm: Option<&Tensor>, rv: Option<&Tensor>| {
            self.compute().batch_norm(&BatchNormDesc {
                dtype,
                input: x.data_ptr(),
                output: out.data_ptr(),
                batch: n,
                channels: c,
                spatial: product(&input.shape()[2..]),
                weight: w.as_ref().map(Tensor::data_ptr),
                bias: b.as_ref().map(Tensor::data_ptr),
                running_mean: rm.map(Tensor::data_ptr),
                running_var: rv.map(Tensor::data_ptr),
                training: config.training,
                momentum: config.momentum.unwrap_or(0.1),
                eps: config.eps.unwrap_or(1e-5),
            })
        };
        match (config.running_mean, config.running_var) {
            (Some(rm), Some(rv)) => with_dense_inplace(rm, |rm| {
                with_dense_inplace(rv, |rv| run(Some(rm), Some(rv)))
            })?,
            (rm, rv) => run(rm, rv)?,
        }
        Ok(out)
    }
}

impl Tensor {
    /// See [`Backend::softmax`].
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        self.backend().softmax(self, axis)
    }

    /// See [`Backend::log_softmax`].
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        self.backend().log_softmax(self, axis)
    }

    /// See [`Backend::layer_norm`].
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        self.backend()
            .layer_norm(self, normalized_shape, weight, bias, eps)
    }

    /// See [`Backend::batch_norm_with`].
    pub fn batch_norm(&self, config: BatchNormConfig<'_>) -> Result<Tensor> {
        self.backend().batch_norm_with(self, config)
    }
}
