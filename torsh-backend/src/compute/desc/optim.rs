//! The fused Adam/AdamW step and the fused unscale-and-check of a loss scaler.

use super::dense_bytes;
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// One Adam or AdamW step over `len` contiguous elements, in place, following `torch.optim.Adam` /
/// `AdamW` (no AMSGrad): with `t = step`,
/// `g += wd·p` (Adam) or `p *= 1 - lr·wd` (AdamW); `m = β₁m + (1-β₁)g`; `v = β₂v + (1-β₂)g²`;
/// `p -= lr/(1-β₁ᵗ) · m / (√v/√(1-β₂ᵗ) + eps)`.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamDesc {
    /// Element type of every operand (moments are kept in the parameters' dtype, as PyTorch does).
    pub dtype: DType,
    /// Parameters, updated.
    pub params: DevicePtr,
    /// Gradients, read.
    pub grads: DevicePtr,
    /// First moment, updated.
    pub exp_avg: DevicePtr,
    /// Second moment, updated.
    pub exp_avg_sq: DevicePtr,
    /// Elements.
    pub len: usize,
    /// Learning rate, ≥ 0.
    pub lr: f64,
    /// β₁ in `[0, 1)`.
    pub beta1: f64,
    /// β₂ in `[0, 1)`.
    pub beta2: f64,
    /// ε ≥ 0.
    pub eps: f64,
    /// Weight decay ≥ 0.
    pub weight_decay: f64,
    /// AdamW (decoupled decay) instead of Adam (L2 added to the gradient).
    pub decoupled_weight_decay: bool,
    /// The step number after this update (1 for the first step).
    pub step: u64,
}

impl AdamDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "adam_step";
        let ok = self.lr >= 0.0
            && (0.0..1.0).contains(&self.beta1)
            && (0.0..1.0).contains(&self.beta2)
            && self.eps >= 0.0
            && self.weight_decay >= 0.0
            && self.lr.is_finite()
            && self.eps.is_finite()
            && self.weight_decay.is_finite();
        if !ok || self.step == 0 {
            return Err(BackendError::invalid(
                op,
                format!(
                    "need lr ≥ 0, betas in [0, 1), eps ≥ 0, weight_decay ≥ 0 (all finite) and step ≥ 1; got lr {}, betas ({}, {}), eps {}, weight_decay {}, step {}",
                    self.lr, self.beta1, self.beta2, self.eps, self.weight_decay, self.step
                ),
            ));
        }
        let bytes = dense_bytes(op, &[self.len], self.dtype)?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("params", self.params, bytes, Access::ReadWrite, true);
        acc.push("grads", self.grads, bytes, Access::Read, true);
        acc.push("exp_avg", self.exp_avg, bytes, Access::ReadWrite, true);
        acc.push(
            "exp_avg_sq",
            self.exp_avg_sq,
            bytes,
            Access::ReadWrite,
            true,
        );
        Ok(acc)
    }
}

/// A loss scaler's unscale with its inf/NaN check in one pass (PyTorch's
/// `_amp_foreach_non_finite_check_and_unscale_`): `output[i] = input[i] · inv_scale` over `len`
/// contiguous elements, with `inv_scale` rounded to `dtype` first and the product rounded once (as
/// `mul` by a scalar), and the f32 flag at `found_inf` set to 1 when any output element is inf or
/// NaN — left as it is otherwise, so one flag gathers a whole set of gradients. The flag must hold 0
/// or 1. `output` may be `input` (in place).
#[derive(Clone, Debug, PartialEq)]
pub struct UnscaleDesc {
    /// Element type of `input` and `output` (a float type).
    pub dtype: DType,
    /// Scaled gradients, read.
    pub input: DevicePtr,
    /// Unscaled gradients, written.
    pub output: DevicePtr,
    /// Elements.
    pub len: usize,
    /// The reciprocal of the loss scale: finite and non-zero.
    pub inv_scale: f64,
    /// One f32 flag: 0 or 1 on entry, 1 on return when a non-finite output was seen.
    pub found_inf: DevicePtr,
}

impl UnscaleDesc {
    /// Validates and lists the regions: `InvalidArgument` for an `inv_scale` that is zero or not
    /// finite.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "unscale_and_check";
        if !self.inv_scale.is_finite() || self.inv_scale == 0.0 {
            return Err(BackendError::invalid(
                op,
                format!(
                    "the inverse scale must be finite and non-zero, got {}",
                    self.inv_scale
                ),
            ));
        }
        let bytes = dense_bytes(op, &[self.len], self.dtype)?;
        let mut acc = Accesses::new(op, InPlace::ExactAllowed);
        acc.push("input", self.input, bytes, Access::Read, true);
        acc.push("output", self.output, bytes, Access::Write, true);
        acc.push(
            "found_inf",
            self.found_inf,
            DType::F32.size_in_bytes(),
            Access::ReadWrite,
            true,
        );
        Ok(acc)
    }
}

crate::compute::op::op_desc!(AdamDesc => adam_step, dtype: dtype, {
    dense "params": params,
    dense "grads": grads,
    dense "exp_avg": exp_avg,
    dense "exp_avg_sq": exp_avg_sq,
});

crate::compute::op::op_desc!(UnscaleDesc => unscale_and_check, dtype: dtype, {
    dense "input": input,
    dense "output": output,
    dense "found_inf": found_inf as |_: &UnscaleDesc| DType::F32,
});
