//! Softmax, layer-norm and batch-norm descriptors.

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
        Ok(acc)
    }
}

crate::compute::op::op_desc!(SoftmaxDesc => softmax, dtype: dtype, {
    dense "input": input,
    dense "output": output,
});

crate::compute::op::op_desc!(LayerNormDesc => layer_norm, dtype: dtype, {
    dense "input": input,
    optional "weight": weight,
    optional "bias": bias,
    dense "output": output,
});

crate::compute::op::op_desc!(BatchNormDesc => batch_norm, dtype: dtype, {
    dense "input": input,
    optional "weight": weight,
    optional "bias": bias,
    optional "running_mean": running_mean,
    optional "running_var": running_var,
    dense "output": output,
});
