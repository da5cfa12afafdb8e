//! `softmax`, `log_softmax`, `layer_norm` and `batch_norm` (training and inference, running
//! statistics), the forwards that also return their saved statistics, and the norms' gradients.

use crate::backend::Backend;
use crate::compute::{
    stats_dtype, BatchNormBackwardDesc, BatchNormDesc, LayerNormBackwardDesc, LayerNormDesc,
    SoftmaxBackwardDesc, SoftmaxDesc,
};
use crate::dtype::DType;
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

/// A normalisation's output with the statistics it normalised with, which its backward takes:
/// `mean` and `invstd` (`1 / √(var + eps)`) are of [`stats_dtype`] (f32 for f16, bf16 and f32
/// data, f64 for f64), one per row of a layer norm (the shape of the leading, unnormalised dims)
/// or per channel of a batch norm (`[C]`).
#[derive(Clone, Debug)]
pub struct Normalized {
    /// The normalised tensor.
    pub output: Tensor,
    /// The means.
    pub mean: Tensor,
    /// The inverse standard deviations.
    pub invstd: Tensor,
}

impl Normalized {
    /// The output with the statistics a forward that saved them returned.
    /// `InvalidArgument` (an internal error) when the forward returned no statistics.
    fn of(op: &'static str, output: Tensor, stats: Option<(Tensor, Tensor)>) -> Result<Normalized> {
        let (mean, invstd) = stats.ok_or_else(|| {
            BackendError::invalid(op, "internal: the forward returned no saved statistics")
        })?;
        Ok(Normalized {
            output,
            mean,
            invstd,
        })
    }
}

/// The gradients a normalisation's backward returns: of its input (the input's shape), and of its
/// weight and bias (the parameters' shape; computed whether or not the forward had them).
#[derive(Clone, Debug)]
pub struct NormGrads {
    /// Gradient of the input.
    pub input: Tensor,
    /// Gradient of the weight.
    pub weight: Tensor,
    /// Gradient of the bias.
    pub bias: Tensor,
}

/// A norm backward's dense operands and its fresh gradients.
struct GradCall {
    dy: Tensor,
    x: Tensor,
    w: Option<Tensor>,
    grads: NormGrads,
}

impl GradCall {
    /// `grad`, `x` and `weight` dense, with gradients of `x`'s shape and `params` (the weight's).
    fn new(
        be: &Backend,
        grad: &Tensor,
        x: &Tensor,
        weight: Option<&Tensor>,
        params: &[usize],
    ) -> Result<GradCall> {
        let dtype = x.dtype();
        Ok(GradCall {
            dy: grad.contiguous()?,
            x: x.contiguous()?,
            w: weight.map(Tensor::contiguous).transpose()?,
            grads: NormGrads {
                input: be.empty(x.shape(), dtype)?,
                weight: be.empty(params, dtype)?,
                bias: be.empty(params, dtype)?,
            },
        })
    }
}

/// Checks saved statistics against the data's dtype and the `count` values they hold (any shape
/// of that many elements): `DTypeMismatch` unless of [`stats_dtype`]`(dtype)`, `ShapeMismatch`
/// for another count. Returns them dense.
fn dense_stats(
    be: &Backend,
    op: &'static str,
    dtype: DType,
    count: usize,
    mean: &Tensor,
    invstd: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let want = stats_dtype(dtype);
    let got = be.check_operands(op, &[mean, invstd])?;
    if got != want {
        return Err(BackendError::DTypeMismatch {
            op,
            expected: want,
            got,
        });
    }
    for (name, t) in [("mean", mean), ("invstd", invstd)] {
        if t.numel() != count {
            return Err(BackendError::shape(
                op,
                format!(
                    "{name} must hold {count} values (one per normalised group), got shape {:?}",
                    t.shape()
                ),
            ));
        }
    }
    Ok((mean.contiguous()?, invstd.contiguous()?))
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
    /// `_softmax_backward_data`), in one pass over the data. Errors: `ShapeMismatch` when `grad`
    /// and `y` differ in shape, `DTypeMismatch` when their dtypes differ, `InvalidArgument` for an
    /// axis out of range, `Unsupported` for a dtype that is not a float.
    pub fn softmax_backward(&self, grad: &Tensor, y: &Tensor, axis: isize) -> Result<Tensor> {
        self.softmax_backward_impl(grad, y, axis, false)
    }

    /// The gradient of [`Backend::log_softmax`]'s input along `axis` from `grad` and `y`, its
    /// output: `grad − exp(y) · Σ grad`, the sum along `axis` (PyTorch's
    /// `_log_softmax_backward_data`), in one pass. Errors as [`Backend::softmax_backward`].
    pub fn log_softmax_backward(&self, grad: &Tensor, y: &Tensor, axis: isize) -> Result<Tensor> {
        self.softmax_backward_impl(grad, y, axis, true)
    }

    fn softmax_backward_impl(
        &self,
        grad: &Tensor,
        y: &Tensor,
        axis: isize,
        log: bool,
    ) -> Result<Tensor> {
        let op = if log {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        };
        let dtype = self.check_operands(op, &[grad, y])?;
        expect_shape(op, "grad", grad, y.shape())?;
        let shape = y.shape().to_vec();
        let dims = shape.len().max(1);
        let axis = normalize_axis(op, axis, dims)?;
        let out = self.empty(&shape, dtype)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let (grad, y) = (grad.contiguous()?, y.contiguous()?);
        let full = if shape.is_empty() { vec![1] } else { shape };
        self.compute().softmax_backward(&SoftmaxBackwardDesc {
            dtype,
            grad_output: grad.data_ptr(),
            output: y.data_ptr(),
            grad_input: out.data_ptr(),
            outer: product(&full[..axis]),
            axis_len: full[axis],
            inner: product(&full[axis + 1..]),
            log,
        })?;
        Ok(out)
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
        self.layer_norm_impl(x, normalized_shape, weight, bias, eps, false)
            .map(|(out, _)| out)
    }

    /// [`Backend::layer_norm`] that also returns each row's mean and inverse standard deviation,
    /// shaped as the leading (unnormalised) dims of `x` (PyTorch's `native_layer_norm`), for
    /// [`Backend::layer_norm_backward`]. A row of no element has a NaN mean and invstd. Errors as
    /// [`Backend::layer_norm`].
    pub fn layer_norm_with_stats(
        &self,
        x: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Normalized> {
        let (output, stats) = self.layer_norm_impl(x, normalized_shape, weight, bias, eps, true)?;
        Normalized::of("layer_norm", output, stats)
    }

    /// `ShapeMismatch` unless `normalized_shape` is non-empty and ends `x`'s shape; returns
    /// `(rows, cols)`.
    fn layer_norm_dims(
        op: &'static str,
        x: &Tensor,
        normalized_shape: &[usize],
    ) -> Result<(usize, usize)> {
        let r = normalized_shape.len();
        if r == 0 || x.rank() < r || &x.shape()[x.rank() - r..] != normalized_shape {
            return Err(BackendError::shape(
                op,
                format!("normalized_shape {normalized_shape:?} must be non-empty and end the input shape {:?}", x.shape()),
            ));
        }
        Ok((
            product(&x.shape()[..x.rank() - r]),
            product(normalized_shape),
        ))
    }

    fn layer_norm_impl(
        &self,
        x: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        saved: bool,
    ) -> Result<(Tensor, Option<(Tensor, Tensor)>)> {
        let op = "layer_norm";
        let mut operands = vec![x];
        operands.extend(weight);
        operands.extend(bias);
        let dtype = self.check_operands(op, &operands)?;
        let (rows, cols) = Self::layer_norm_dims(op, x, normalized_shape)?;
        for (name, p) in [("weight", weight), ("bias", bias)] {
            if let Some(p) = p {
                expect_shape(op, name, p, normalized_shape)?;
            }
        }
        let out = self.empty(x.shape(), dtype)?;
        let lead = &x.shape()[..x.rank() - normalized_shape.len()];
        let stats = self.saved_stats(saved, lead, dtype)?;
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
            saved_mean: stats.as_ref().map(|s| s.0.data_ptr()),
            saved_invstd: stats.as_ref().map(|s| s.1.data_ptr()),
        })?;
        Ok((out, stats))
    }

    /// Fresh `shape` tensors of [`stats_dtype`]`(dtype)` for a forward's mean and invstd, when
    /// `saved`: two halves of one allocation, so a device binds them as one buffer.
    fn saved_stats(
        &self,
        saved: bool,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Option<(Tensor, Tensor)>> {
        if !saved {
            return Ok(None);
        }
        let both = self.empty(&[2, product(shape)], stats_dtype(dtype))?;
        let half = |k: usize| both.narrow(0, k, 1)?.reshape(shape);
        Ok(Some((half(0)?, half(1)?)))
    }

    /// The gradients of [`Backend::layer_norm`] from `grad` (the output's gradient), the forward's
    /// input `x`, its `normalized_shape` and `weight`, and the `mean` and `invstd` that
    /// [`Backend::layer_norm_with_stats`] returned (any shapes of one value per row), in one pass
    /// over each row (PyTorch's `native_layer_norm_backward`). The weight and bias gradients have
    /// `normalized_shape`. Errors: `ShapeMismatch` when `grad` is not `x`'s shape, the trailing
    /// dims or weight do not match, or the statistics do not hold one value per row;
    /// `DTypeMismatch` when `grad`, `x` and `weight` differ in dtype or the statistics are not of
    /// [`stats_dtype`].
    pub fn layer_norm_backward(
        &self,
        grad: &Tensor,
        x: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        mean: &Tensor,
        invstd: &Tensor,
    ) -> Result<NormGrads> {
        let op = "layer_norm_backward";
        let mut operands = vec![grad, x];
        operands.extend(weight);
        let dtype = self.check_operands(op, &operands)?;
        expect_shape(op, "grad", grad, x.shape())?;
        let (rows, cols) = Self::layer_norm_dims(op, x, normalized_shape)?;
        if let Some(w) = weight {
            expect_shape(op, "weight", w, normalized_shape)?;
        }
        let (mean, invstd) = dense_stats(self, op, dtype, rows, mean, invstd)?;
        let g = GradCall::new(self, grad, x, weight, normalized_shape)?;
        self.compute().layer_norm_backward(&LayerNormBackwardDesc {
            dtype,
            grad_output: g.dy.data_ptr(),
            input: g.x.data_ptr(),
            weight: g.w.as_ref().map(Tensor::data_ptr),
            mean: mean.data_ptr(),
            invstd: invstd.data_ptr(),
            grad_input: Some(g.grads.input.data_ptr()),
            grad_weight: Some(g.grads.weight.data_ptr()),
            grad_bias: Some(g.grads.bias.data_ptr()),
            rows,
            cols,
        })?;
        Ok(g.grads)
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
        self.batch_norm_impl(input, config, false)
            .map(|(out, _)| out)
    }

    /// [`Backend::batch_norm_with`] that also returns the `[C]` mean and inverse standard
    /// deviation each channel was normalised with (PyTorch's `native_batch_norm`): the batch's
    /// (biased variance) in training, the running ones in inference (mean 0 and variance 1
    /// without them), for [`Backend::batch_norm_backward`]. Errors as
    /// [`Backend::batch_norm_with`].
    pub fn batch_norm_with_stats(
        &self,
        input: &Tensor,
        config: BatchNormConfig<'_>,
    ) -> Result<Normalized> {
        let (output, stats) = self.batch_norm_impl(input, config, true)?;
        Normalized::of("batch_norm", output, stats)
    }

    fn batch_norm_impl(
        &self,
        input: &Tensor,
        config: BatchNormConfig<'_>,
        saved: bool,
    ) -> Result<(Tensor, Option<(Tensor, Tensor)>)> {
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
        let stats = self.saved_stats(saved, &[c], dtype)?;
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
                saved_mean: stats.as_ref().map(|s| s.0.data_ptr()),
                saved_invstd: stats.as_ref().map(|s| s.1.data_ptr()),
            })
        };
        match (config.running_mean, config.running_var) {
            (Some(rm), Some(rv)) => with_dense_inplace(rm, |rm| {
                with_dense_inplace(rv, |rv| run(Some(rm), Some(rv)))
            })?,
            (rm, rv) => run(rm, rv)?,
        }
        Ok((out, stats))
    }

    /// The gradients of [`Backend::batch_norm_with`] from `grad` (the output's gradient), the
    /// forward's `input` `[N, C, ...]` and `weight`, and the `[C]` `mean` and `invstd` that
    /// [`Backend::batch_norm_with_stats`] returned (PyTorch's `native_batch_norm_backward`):
    /// `training` says the statistics were the batch's, so the input gradient runs through them
    /// too; otherwise they are constants (a frozen or inference-mode norm). The weight and bias
    /// gradients are `[C]`. One pass over the data for the per-channel sums and one for the input
    /// gradient. Errors: `ShapeMismatch` for rank < 2, `grad` not of the input's shape, or a
    /// weight or statistics not of `C` values; `DTypeMismatch` when `grad`, `input` and `weight`
    /// differ in dtype or the statistics are not of [`stats_dtype`].
    pub fn batch_norm_backward(
        &self,
        grad: &Tensor,
        input: &Tensor,
        weight: Option<&Tensor>,
        mean: &Tensor,
        invstd: &Tensor,
        training: bool,
    ) -> Result<NormGrads> {
        let op = "batch_norm_backward";
        let mut operands = vec![grad, input];
        operands.extend(weight);
        let dtype = self.check_operands(op, &operands)?;
        if input.rank() < 2 {
            return Err(BackendError::shape(
                op,
                format!("input must be [N, C, ...], got {:?}", input.shape()),
            ));
        }
        expect_shape(op, "grad", grad, input.shape())?;
        let (n, c) = (input.shape()[0], input.shape()[1]);
        if let Some(w) = weight {
            expect_shape(op, "weight", w, &[c])?;
        }
        let (mean, invstd) = dense_stats(self, op, dtype, c, mean, invstd)?;
        let g = GradCall::new(self, grad, input, weight, &[c])?;
        self.compute().batch_norm_backward(&BatchNormBackwardDesc {
            dtype,
            grad_output: g.dy.data_ptr(),
            input: g.x.data_ptr(),
            weight: g.w.as_ref().map(Tensor::data_ptr),
            mean: mean.data_ptr(),
            invstd: invstd.data_ptr(),
            grad_input: Some(g.grads.input.data_ptr()),
            grad_weight: Some(g.grads.weight.data_ptr()),
            grad_bias: Some(g.grads.bias.data_ptr()),
            batch: n,
            channels: c,
            spatial: product(&input.shape()[2..]),
            training,
        })?;
        Ok(g.grads)
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

    /// See [`Backend::layer_norm_with_stats`].
    pub fn layer_norm_with_stats(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Normalized> {
        self.backend()
            .layer_norm_with_stats(self, normalized_shape, weight, bias, eps)
    }

    /// See [`Backend::batch_norm_with_stats`].
    pub fn batch_norm_with_stats(&self, config: BatchNormConfig<'_>) -> Result<Normalized> {
        self.backend().batch_norm_with_stats(self, config)
    }
}
