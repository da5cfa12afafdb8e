//! Mixed precision: [`MixedPrecisionConfig`] makes f32 operands of matmul, conv2d and attention run
//! in f16 or bf16 (f32 accumulation, f32 result), and [`LossScaler`] is a dynamic loss scaler with
//! `torch.amp.GradScaler`'s semantics.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::ops::optim::AdamState;
use crate::tensor::Tensor;

/// Settings of mixed precision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MixedPrecisionConfig {
    /// The dtype matmul, conv2d and attention compute in: `F16` or `BF16`.
    pub compute_dtype: DType,
    /// The accumulation dtype: `F32`, which is what every backend's 16-bit kernels accumulate in (the
    /// reference, the oracle, accumulates in f64).
    pub accum_dtype: DType,
    /// The initial loss scale of [`LossScaler::new`] (PyTorch's default is 65536).
    pub scale_factor: f32,
}

impl MixedPrecisionConfig {
    /// `InvalidArgument` unless the compute dtype is 16-bit, accumulation is f32 and the scale is a
    /// positive finite number.
    pub fn validate(&self) -> Result<()> {
        let op = "enable_mixed_precision";
        if !matches!(self.compute_dtype, DType::F16 | DType::BF16) {
            return Err(BackendError::invalid(
                op,
                format!(
                    "compute_dtype must be f16 or bf16, not {}",
                    self.compute_dtype
                ),
            ));
        }
        if self.accum_dtype != DType::F32 {
            return Err(BackendError::invalid(
                op,
                format!(
                    "accum_dtype must be f32 (the 16-bit kernels accumulate in f32), not {}",
                    self.accum_dtype
                ),
            ));
        }
        if !(self.scale_factor.is_finite() && self.scale_factor > 0.0) {
            return Err(BackendError::invalid(
                op,
                format!(
                    "scale_factor must be positive and finite, not {}",
                    self.scale_factor
                ),
            ));
        }
        Ok(())
    }
}

/// Runs `op` in the compute dtype when mixed precision is on and every operand is f32: operands are
/// cast down, the result cast back to f32. Otherwise runs `op` on the operands as they are.
pub(crate) fn autocast(
    backend: &Backend,
    operands: &[&Tensor],
    op: impl FnOnce(&[&Tensor]) -> Result<Tensor>,
) -> Result<Tensor> {
    match backend.mixed_precision() {
        Some(config) if operands.iter().all(|t| t.dtype() == DType::F32) => {
            let low: Vec<Tensor> = operands
                .iter()
                .map(|t| t.cast(config.compute_dtype))
                .collect::<Result<_>>()?;
            op(&low.iter().collect::<Vec<_>>())?.cast(DType::F32)
        }
        // The operands as they are: no clone, no allocation on the common path.
        _ => op(operands),
    }
}

/// A dynamic loss scaler with `torch.amp.GradScaler`'s semantics: the loss is multiplied by the
/// scale before backward; the gradients are divided by it before the optimiser step, which is skipped
/// when any of them holds an inf or NaN; then [`update`](Self::update) halves the scale after such a
/// step, or doubles it after `growth_interval` clean steps in a row.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    scale: f64,
    /// Multiplier after `growth_interval` clean steps (2).
    pub growth_factor: f64,
    /// Multiplier after a step with inf/NaN gradients (0.5).
    pub backoff_factor: f64,
    /// Clean steps in a row before the scale grows (2000).
    pub growth_interval: u32,
    growth_tracker: u32,
    /// This step's unscale found inf/NaN (`None` before unscaling).
    found_inf: Option<bool>,
}

impl LossScaler {
    /// PyTorch's defaults with `init_scale` (65536 there): growth 2, backoff 0.5, interval 2000.
    pub fn new(init_scale: f64) -> LossScaler {
        LossScaler {
            scale: init_scale,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 0,
            found_inf: None,
        }
    }

    /// A scaler starting at the config's `scale_factor`.
    pub fn from_config(config: &MixedPrecisionConfig) -> LossScaler {
        LossScaler::new(f64::from(config.scale_factor))
    }

    /// The current scale.
    pub fn get_scale(&self) -> f64 {
        self.scale
    }

    /// Clean steps since the last change of scale.
    pub fn growth_tracker(&self) -> u32 {
        self.growth_tracker
    }

    /// `loss · scale`, in the loss's dtype. `Unsupported` for a non-float loss.
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        loss.mul_scalar(self.scale)
    }

    /// Divides every gradient by the scale (in place: each tensor is replaced by its unscaled value,
    /// all of them or, on an error, none) and records whether any holds an inf or NaN, which it
    /// returns. Once per step: a second call
    /// before [`update`](Self::update) is `InvalidArgument`, as in PyTorch.
    pub fn unscale(&mut self, grads: &mut [Tensor]) -> Result<bool> {
        if self.found_inf.is_some() {
            return Err(BackendError::invalid(
                "unscale",
                "unscale was already called since the last update",
            ));
        }
        let inv = 1.0 / self.scale;
        // One fused unscale-and-check per backend the gradients live on (usually one), each read
        // back once.
        let mut groups: Vec<(Backend, Vec<usize>)> = Vec::new();
        for (i, g) in grads.iter().enumerate() {
            match groups
                .iter_mut()
                .find(|(b, _)| b.same_instance(g.backend()))
            {
                Some((_, members)) => members.push(i),
                None => groups.push((g.backend().clone(), vec![i])),
            }
        }
        let mut found = false;
        let mut unscaled: Vec<Option<Tensor>> = vec![None; grads.len()];
        for (backend, members) in &groups {
            let set: Vec<Tensor> = members.iter().map(|&i| grads[i].clone()).collect();
            let (out, any) = backend.unscale_and_check(&set, inv)?;
            found |= any;
            for (&i, u) in members.iter().zip(out) {
                unscaled[i] = Some(u);
            }
        }
        // Only once every gradient is done: an error part-way leaves them all scaled, so a retry
        // cannot divide some twice.
        for (g, u) in grads.iter_mut().zip(unscaled) {
            if let Some(u) = u {
                *g = u;
            }
        }
        self.found_inf = Some(found);
        Ok(found)
    }

    /// One Adam/AdamW step through `backend` ([`Backend::fused_adam_step`]) on gradients that are still
    /// scaled: unscales them first (unless [`unscale`](Self::unscale) already ran this step) and skips
    /// the step when they hold an inf or NaN. Returns whether the step ran. The errors of
    /// `fused_adam_step`.
    #[allow(clippy::too_many_arguments)]
    pub fn fused_adam_step(
        &mut self,
        backend: &Backend,
        params: &mut [Tensor],
        grads: &mut [Tensor],
        state: &mut AdamState,
        lr: f32,
        betas: (f32, f32),
    ) -> Result<bool> {
        let found = match self.found_inf {
            Some(found) => found,
            None => self.unscale(grads)?,
        };
        if found {
            return Ok(false);
        }
        backend.fused_adam_step(params, grads, state, lr, betas)?;
        Ok(true)
    }

    /// Adjusts the scale after a step: × `backoff_factor` when the step found inf/NaN (and the clean
    /// count restarts), × `growth_factor` after `growth_interval` clean steps in a row.
    /// `InvalidArgument` when nothing was unscaled since the last update (PyTorch: "No inf checks
    /// were recorded prior to update").
    pub fn update(&mut self) -> Result<()> {
        match self.found_inf.take() {
            None => Err(BackendError::invalid(
                "update",
                "no inf checks were recorded since the last update: call unscale or \
                 fused_adam_step first",
            )),
            Some(true) => {
                self.scale *= self.backoff_factor;
                self.growth_tracker = 0;
                Ok(())
            }
            Some(false) => {
                self.growth_tracker += 1;
                if self.growth_tracker >= self.growth_interval {
                    self.scale *= self.growth_factor;
                    self.growth_tracker = 0;
                }
                Ok(())
            }
        }
    }
}
