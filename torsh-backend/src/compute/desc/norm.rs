//! Softmax, layer-norm and batch-norm descriptors, and the normalisations' gradients.

use super::{dense_bytes, mul};
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// Softmax (or log-softmax) of a contiguous `[outer, axis_len, inner]` tensor along the middle dim.
#[derive(Clone, Debug, PartialEq)]
pub struct SoftmaxDesc {
    /// Element type.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// Output pointer (same shape).
    pub output: DevicePtr,
    /// Product of the dims before the axis.
    pub outer: usize,
    /// Length of the axis.
    pub axis_len: usize,
    /// Product of the dims after the axis.
    pub inner: usize,
    /// Compute `log_softmax` instead.
    pub log: bool,
}

impl SoftmaxDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = if self.log { "log_softmax" } else { "softmax" };
        let bytes = dense_bytes(op, &[self.outer, self.axis_len, self.inner], self.dtype)?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("input", self.input, bytes, Access::Read, true);
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// The input gradient of softmax (or log-softmax) of a contiguous `[outer, axis_len, inner]`
/// tensor along the middle dim, from the output's gradient and the forward's output `y`:
/// `y · (grad − Σ grad · y)` (softmax) or `grad − exp(y) · Σ grad` (log-softmax), each sum along
/// the axis, in one pass over the data (PyTorch's `_softmax_backward_data` and
/// `_log_softmax_backward_data`).
#[derive(Clone, Debug, PartialEq)]
pub struct SoftmaxBackwardDesc {
    /// Element type of every operand.
    pub dtype: DType,
    /// The output's gradient.
    pub grad_output: DevicePtr,
    /// The forward's output (softmax or log-softmax).
    pub output: DevicePtr,
    /// Where the input's gradient goes (same shape; overlaps no operand).
    pub grad_input: DevicePtr,
    /// Product of the dims before the axis.
    pub outer: usize,
    /// Length of the axis.
    pub axis_len: usize,
    /// Product of the dims after the axis.
    pub inner: usize,
    /// The forward was `log_softmax`.
    pub log: bool,
}

impl SoftmaxBackwardDesc {
    /// The op's name: `softmax_backward` or `log_softmax_backward`.
    pub fn name(&self) -> &'static str {
        if self.log {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        }
    }

    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = self.name();
        let bytes = dense_bytes(op, &[self.outer, self.axis_len, self.inner], self.dtype)?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("grad_output", self.grad_output, bytes, Access::Read, true);
        acc.push("output", self.output, bytes, Access::Read, true);
        acc.push("grad_input", self.grad_input, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// Layer normalisation of a contiguous `[rows, cols]` tensor over each row, with biased variance:
/// `y = (x - μ) / √(σ² + eps) · weight + bias`.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormDesc {
    /// Element type.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// Optional `[cols]` scale.
    pub weight: Option<DevicePtr>,
    /// Optional `[cols]` shift.
    pub bias: Option<DevicePtr>,
    /// Output pointer (same shape).
    pub output: DevicePtr,
    /// Rows.
    pub rows: usize,
    /// Normalised width.
    pub cols: usize,
    /// Added to the variance; finite and ≥ 0.
    pub eps: f64,
    /// Where to write each row's mean (`[rows]` of [`stats_dtype`]`(dtype)`), for the backward;
    /// given together with `saved_invstd`.
    pub saved_mean: Option<DevicePtr>,
    /// Where to write each row's `1 / √(σ² + eps)` (`[rows]` of [`stats_dtype`]`(dtype)`).
    pub saved_invstd: Option<DevicePtr>,
}

/// The element type of the statistics a normalisation saves for its backward (mean and inverse
/// standard deviation): f64 for f64 data, f32 otherwise (as PyTorch keeps half-precision
/// statistics in f32).
pub const fn stats_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// Pushes the saved-statistics outputs `[len]` each, `InvalidArgument` unless both or neither
/// are given.
fn push_saved(
    acc: &mut Accesses,
    op: &'static str,
    dtype: DType,
    len: usize,
    mean: Option<DevicePtr>,
    invstd: Option<DevicePtr>,
) -> Result<()> {
    match (mean, invstd) {
        (None, None) => Ok(()),
        (Some(m), Some(i)) => {
            let bytes = dense_bytes(op, &[len], stats_dtype(dtype))?;
            acc.push("saved_mean", m, bytes, Access::Write, true);
            acc.push("saved_invstd", i, bytes, Access::Write, true);
            Ok(())
        }
        _ => Err(BackendError::invalid(
            op,
            "saved_mean and saved_invstd must be given together",
        )),
    }
}

impl LayerNormDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "layer_norm";
        if !(self.eps >= 0.0 && self.eps.is_finite()) {
            return Err(BackendError::invalid(
                op,
                format!("eps {} must be finite and ≥ 0", self.eps),
            ));
        }
        let bytes = dense_bytes(op, &[self.rows, self.cols], self.dtype)?;
        let row = dense_bytes(op, &[self.cols], self.dtype)?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("input", self.input, bytes, Access::Read, true);
        if let Some(w) = self.weight {
            acc.push("weight", w, row, Access::Read, true);
        }
        if let Some(b) = self.bias {
            acc.push("bias", b, row, Access::Read, true);
        }
        acc.push("output", self.output, bytes, Access::Write, true);
        push_saved(
            &mut acc,
            op,
            self.dtype,
            self.rows,
            self.saved_mean,
            self.saved_invstd,
        )?;
        Ok(acc)
    }
}

/// Batch normalisation of a contiguous `[batch, channels, spatial]` tensor per channel, as PyTorch's
/// `batch_norm`: in training, batch statistics normalise (biased variance) and running statistics, when
/// given, become `(1 - momentum)·old + momentum·batch` (unbiased variance); in inference the running
/// statistics normalise.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNormDesc {
    /// Element type of every operand.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// Output pointer (same shape).
    pub output: DevicePtr,
    /// N.
    pub batch: usize,
    /// C.
    pub channels: usize,
    /// Product of the spatial dims (1 for `[N, C]` input).
    pub spatial: usize,
    /// Optional `[C]` scale.
    pub weight: Option<DevicePtr>,
    /// Optional `[C]` shift.
    pub bias: Option<DevicePtr>,
    /// `[C]` running mean: read in inference, updated in training.
    pub running_mean: Option<DevicePtr>,
    /// `[C]` running variance: read in inference, updated in training.
    pub running_var: Option<DevicePtr>,
    /// Training mode.
    pub training: bool,
    /// Weight of the new batch statistics in the running update, in `[0, 1]`.
    pub momentum: f64,
    /// Added to the variance; finite and ≥ 0.
    pub eps: f64,
    /// Where to write each channel's mean as it normalised (`[C]` of [`stats_dtype`]`(dtype)`):
    /// the batch's in training, the running mean in inference (0 without running statistics).
    /// Given together with `saved_invstd`.
    pub saved_mean: Option<DevicePtr>,
    /// Where to write each channel's `1 / √(var + eps)` as it normalised (`[C]` of
    /// [`stats_dtype`]`(dtype)`): the batch's biased variance in training, the running variance
    /// in inference (1 without running statistics).
    pub saved_invstd: Option<DevicePtr>,
}

impl BatchNormDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "batch_norm";
        if !(self.eps >= 0.0 && self.eps.is_finite() && (0.0..=1.0).contains(&self.momentum)) {
            return Err(BackendError::invalid(
                op,
                format!(
                    "eps {} must be finite and ≥ 0, momentum {} in [0, 1]",
                    self.eps, self.momentum
                ),
            ));
        }
        if self.running_mean.is_some() != self.running_var.is_some() {
            return Err(BackendError::invalid(
                op,
                "running_mean and running_var must be given together",
            ));
        }
        let per_channel = mul(op, self.batch, self.spatial)?;
        if self.training && per_channel <= 1 && self.channels > 0 {
            return Err(BackendError::invalid(
                op,
                format!("training needs more than one value per channel, got {per_channel}"),
            ));
        }
        if !self.training && self.running_mean.is_none() {
            return Err(BackendError::invalid(
                op,
                "inference needs running_mean and running_var",
            ));
        }
        self.regions()
    }

    /// The regions the op touches, without the checks of its mode that [`BatchNormDesc::accesses`]
    /// makes first (more than one value per channel in training, running statistics in
    /// inference): for sizing blocks of a larger op, which a block alone may not pass.
    /// `SizeOverflow` when a size overflows.
    pub fn regions(&self) -> Result<Accesses> {
        let op = "batch_norm";
        let bytes = dense_bytes(op, &[self.batch, self.channels, self.spatial], self.dtype)?;
        let chan = dense_bytes(op, &[self.channels], self.dtype)?;
        let stats = if self.training {
            Access::ReadWrite
        } else {
            Access::Read
        };
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("input", self.input, bytes, Access::Read, true);
        for (name, p, a) in [
            ("weight", self.weight, Access::Read),
            ("bias", self.bias, Access::Read),
            ("running_mean", self.running_mean, stats),
            ("running_var", self.running_var, stats),
        ] {
            if let Some(p) = p {
                acc.push(name, p, chan, a, true);
            }
        }
        acc.push("output", self.output, bytes, Access::Write, true);
        push_saved(
            &mut acc,
            op,
            self.dtype,
            self.channels,
            self.saved_mean,
            self.saved_invstd,
        )?;
        Ok(acc)
    }
}

/// The gradients of layer normalisation over each row of contiguous `[rows, cols]` operands, from
/// the statistics its forward saved (`xhat = (x − mean) · invstd`, `g = grad_output · weight`):
/// `grad_input = invstd · (g − mean_row(g) − xhat · mean_row(g · xhat))`,
/// `grad_weight = Σ_rows grad_output · xhat`, `grad_bias = Σ_rows grad_output`. Each gradient is
/// computed only where its pointer is given; a weight gradient of no row is zero. Errors:
/// `InvalidArgument` when no gradient is asked for, `SizeOverflow`, and the region checks.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormBackwardDesc {
    /// Element type of every operand but the statistics.
    pub dtype: DType,
    /// `[rows, cols]` gradient of the output.
    pub grad_output: DevicePtr,
    /// `[rows, cols]` input of the forward.
    pub input: DevicePtr,
    /// Optional `[cols]` scale of the forward (1 when absent).
    pub weight: Option<DevicePtr>,
    /// `[rows]` means, of [`stats_dtype`]`(dtype)`.
    pub mean: DevicePtr,
    /// `[rows]` inverse standard deviations, of [`stats_dtype`]`(dtype)`.
    pub invstd: DevicePtr,
    /// `[rows, cols]` gradient of the input, written.
    pub grad_input: Option<DevicePtr>,
    /// `[cols]` gradient of the weight, written.
    pub grad_weight: Option<DevicePtr>,
    /// `[cols]` gradient of the bias, written.
    pub grad_bias: Option<DevicePtr>,
    /// Rows.
    pub rows: usize,
    /// Normalised width.
    pub cols: usize,
}

impl LayerNormBackwardDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        grad_accesses(
            "layer_norm_backward",
            self.dtype,
            (&[self.rows, self.cols], self.cols, self.rows),
            [self.grad_output, self.input, self.mean, self.invstd],
            self.weight,
            [self.grad_input, self.grad_weight, self.grad_bias],
        )
    }
}

/// The regions of a norm's backward over `data` elements with `params`-long weight and
/// gradients of it and `groups` statistics: `[grad_output, input, mean, invstd]` read, the
/// optional weight read, the asked gradients `[input, weight, bias]` written.
fn grad_accesses(
    op: &'static str,
    dtype: DType,
    (data, params, groups): (&[usize], usize, usize),
    [grad_output, input, mean, invstd]: [DevicePtr; 4],
    weight: Option<DevicePtr>,
    grads: [Option<DevicePtr>; 3],
) -> Result<Accesses> {
    gradients_asked(op, grads)?;
    let bytes = dense_bytes(op, data, dtype)?;
    let row = dense_bytes(op, &[params], dtype)?;
    let stats = dense_bytes(op, &[groups], stats_dtype(dtype))?;
    let mut acc = Accesses::new(op, InPlace::Forbidden);
    acc.push("grad_output", grad_output, bytes, Access::Read, true);
    acc.push("input", input, bytes, Access::Read, true);
    if let Some(w) = weight {
        acc.push("weight", w, row, Access::Read, true);
    }
    acc.push("mean", mean, stats, Access::Read, true);
    acc.push("invstd", invstd, stats, Access::Read, true);
    let [gi, gw, gb] = grads;
    for (name, p, len) in [
        ("grad_input", gi, bytes),
        ("grad_weight", gw, row),
        ("grad_bias", gb, row),
    ] {
        if let Some(p) = p {
            acc.push(name, p, len, Access::Write, true);
        }
    }
    Ok(acc)
}

/// `InvalidArgument` when none of a backward's gradients is asked for.
fn gradients_asked(op: &'static str, grads: [Option<DevicePtr>; 3]) -> Result<()> {
    if grads.iter().all(Option::is_none) {
        return Err(BackendError::invalid(
            op,
            "asks for no gradient (grad_input, grad_weight and grad_bias are all absent)",
        ));
    }
    Ok(())
}

/// The gradients of batch normalisation of contiguous `[batch, channels, spatial]` operands per
/// channel, from the statistics its forward saved (`xhat = (x − mean) · invstd`, `M = batch ·
/// spatial`): `grad_weight = Σ grad_output · xhat`, `grad_bias = Σ grad_output` (sums over the
/// batch and spatial dims); in `training` (the statistics are the batch's, so they depend on the
/// input) `grad_input = weight · invstd · (grad_output − grad_bias / M − xhat · grad_weight / M)`,
/// otherwise (fixed statistics, as in inference) `grad_input = weight · invstd · grad_output`. The
/// weight is 1 when absent. Each gradient is computed only where its pointer is given; the sums of
/// no value are zero. Errors: `InvalidArgument` when no gradient is asked for, `SizeOverflow`, and
/// the region checks.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNormBackwardDesc {
    /// Element type of every operand but the statistics.
    pub dtype: DType,
    /// `[batch, channels, spatial]` gradient of the output.
    pub grad_output: DevicePtr,
    /// `[batch, channels, spatial]` input of the forward.
    pub input: DevicePtr,
    /// Optional `[channels]` scale of the forward.
    pub weight: Option<DevicePtr>,
    /// `[channels]` means, of [`stats_dtype`]`(dtype)`.
    pub mean: DevicePtr,
    /// `[channels]` inverse standard deviations, of [`stats_dtype`]`(dtype)`.
    pub invstd: DevicePtr,
    /// `[batch, channels, spatial]` gradient of the input, written.
    pub grad_input: Option<DevicePtr>,
    /// `[channels]` gradient of the weight, written.
    pub grad_weight: Option<DevicePtr>,
    /// `[channels]` gradient of the bias, written.
    pub grad_bias: Option<DevicePtr>,
    /// N.
    pub batch: usize,
    /// C.
    pub channels: usize,
    /// Product of the spatial dims (1 for `[N, C]` input).
    pub spatial: usize,
    /// The statistics are the batch's (the forward ran in training).
    pub training: bool,
}

impl BatchNormBackwardDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        grad_accesses(
            "batch_norm_backward",
            self.dtype,
            (
                &[self.batch, self.channels, self.spatial],
                self.channels,
                self.channels,
            ),
            [self.grad_output, self.input, self.mean, self.invstd],
            self.weight,
            [self.grad_input, self.grad_weight, self.grad_bias],
        )
    }
}

crate::compute::op::op_desc!(SoftmaxDesc => softmax, dtype: dtype, {
    dense "input": input,
    dense "output": output,
});

crate::compute::op::op_desc!(SoftmaxBackwardDesc => softmax_backward, dtype: dtype, {
    dense "grad_output": grad_output,
    dense "output": output,
    dense "grad_input": grad_input,
});

crate::compute::op::op_desc!(LayerNormDesc => layer_norm, dtype: dtype, {
    dense "input": input,
    optional "weight": weight,
    optional "bias": bias,
    dense "output": output,
    optional "saved_mean": saved_mean as |d: &LayerNormDesc| stats_dtype(d.dtype),
    optional "saved_invstd": saved_invstd as |d: &LayerNormDesc| stats_dtype(d.dtype),
});

crate::compute::op::op_desc!(BatchNormDesc => batch_norm, dtype: dtype, {
    dense "input": input,
    optional "weight": weight,
    optional "bias": bias,
    optional "running_mean": running_mean,
    optional "running_var": running_var,
    dense "output": output,
    optional "saved_mean": saved_mean as |d: &BatchNormDesc| stats_dtype(d.dtype),
    optional "saved_invstd": saved_invstd as |d: &BatchNormDesc| stats_dtype(d.dtype),
});

crate::compute::op::op_desc!(LayerNormBackwardDesc => layer_norm_backward, dtype: dtype, {
    dense "grad_output": grad_output,
    dense "input": input,
    optional "weight": weight,
    dense "mean": mean as |d: &LayerNormBackwardDesc| stats_dtype(d.dtype),
    dense "invstd": invstd as |d: &LayerNormBackwardDesc| stats_dtype(d.dtype),
    optional "grad_input": grad_input,
    optional "grad_weight": grad_weight,
    optional "grad_bias": grad_bias,
});

crate::compute::op::op_desc!(BatchNormBackwardDesc => batch_norm_backward, dtype: dtype, {
    dense "grad_output": grad_output,
    dense "input": input,
    optional "weight": weight,
    dense "mean": mean as |d: &BatchNormBackwardDesc| stats_dtype(d.dtype),
    dense "invstd": invstd as |d: &BatchNormBackwardDesc| stats_dtype(d.dtype),
    optional "grad_input": grad_input,
    optional "grad_weight": grad_weight,
    optional "grad_bias": grad_bias,
});
