//! `fused_adam_step` and [`AdamState`]: Adam and AdamW as `torch.optim.Adam` / `AdamW` define them;
//! and `unscale_and_check`, a loss scaler's fused unscale with its inf/NaN check.

use crate::backend::Backend;
use crate::compute::{Access, Accesses, AdamDesc, InPlace, UnscaleDesc};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::tensor::Tensor;

use super::with_dense_inplace;

/// Widens an `f32` hyper-parameter through its shortest decimal form, so `0.9f32` means `0.9`, as the
/// user wrote it, rather than `0.89999997615814`.
pub(crate) fn widen(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

/// Optimizer state for [`Backend::fused_adam_step`]: the moments of each parameter (created as zeros on
/// the first step), the step count and the hyper-parameters that do not change per call.
///
/// Not `Clone`: the moments are tensor handles, so a shallow copy would share (and co-update) them.
#[derive(Debug)]
pub struct AdamState {
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    step: u64,
    /// Added to the denominator (default 1e-8).
    pub eps: f64,
    /// Weight decay (default 0; AdamW's default is 0.01).
    pub weight_decay: f64,
    /// AdamW: decay the weights directly instead of adding `weight_decay · p` to the gradient.
    pub decoupled_weight_decay: bool,
}

impl Default for AdamState {
    fn default() -> Self {
        AdamState::adam()
    }
}

impl AdamState {
    /// Adam with `torch.optim.Adam`'s defaults: eps 1e-8, no weight decay.
    pub fn adam() -> Self {
        AdamState {
            exp_avg: Vec::new(),
            exp_avg_sq: Vec::new(),
            step: 0,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
        }
    }

    /// AdamW with decoupled `weight_decay` (PyTorch's default is 0.01) and eps 1e-8.
    pub fn adamw(weight_decay: f64) -> Self {
        AdamState {
            weight_decay,
            decoupled_weight_decay: true,
            ..AdamState::adam()
        }
    }

    /// Sets eps.
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// Sets the (L2, for Adam) weight decay.
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// Steps taken so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The first moments, one per parameter (empty before the first step).
    pub fn exp_avg(&self) -> &[Tensor] {
        &self.exp_avg
    }

    /// The second moments, one per parameter (empty before the first step).
    pub fn exp_avg_sq(&self) -> &[Tensor] {
        &self.exp_avg_sq
    }
}

impl Backend {
    /// One Adam/AdamW step over every parameter, in place, with moments kept in `state` (f32
    /// hyper-parameters are widened through their shortest decimal form, so `0.9f32` means 0.9).
    /// All inputs are validated before anything is updated: `ShapeMismatch` when counts or shapes
    /// of params, grads and state disagree, `DTypeMismatch`/`DeviceMismatch` for foreign operands,
    /// `InvalidArgument` for bad hyper-parameters.
    pub fn fused_adam_step(
        &self,
        params: &mut [Tensor],
        grads: &[Tensor],
        state: &mut AdamState,
        lr: f32,
        betas: (f32, f32),
    ) -> Result<()> {
        let op = "fused_adam_step";
        if params.len() != grads.len() {
            return Err(BackendError::shape(
                op,
                format!("{} params but {} grads", params.len(), grads.len()),
            ));
        }
        if !state.exp_avg.is_empty() && state.exp_avg.len() != params.len() {
            return Err(BackendError::shape(
                op,
                format!(
                    "the state holds {} parameters, {} were given",
                    state.exp_avg.len(),
                    params.len()
                ),
            ));
        }
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            self.check_operands(op, &[p, g])?;
            if p.shape() != g.shape() {
                return Err(BackendError::shape(
                    op,
                    format!(
                        "param {i} is {:?} but its grad is {:?}",
                        p.shape(),
                        g.shape()
                    ),
                ));
            }
            if let (Some(m), Some(v)) = (state.exp_avg.get(i), state.exp_avg_sq.get(i)) {
                self.check_operands(op, &[p, m, v])?;
                if m.shape() != p.shape() || v.shape() != p.shape() {
                    return Err(BackendError::shape(
                        op,
                        format!(
                            "state of param {i} does not match its shape {:?}",
                            p.shape()
                        ),
                    ));
                }
            }
        }
        // Every parameter, gradient and moment, checked together so that nothing is updated when any
        // written operand overlaps another.
        let mut all = Accesses::new(op, InPlace::Forbidden);
        for (i, p) in params.iter().enumerate() {
            p.strided_buf()
                .add_region(&mut all, "params", p.dtype(), Access::ReadWrite)?;
            grads[i]
                .strided_buf()
                .add_region(&mut all, "grads", p.dtype(), Access::Read)?;
            for (name, t) in [
                ("exp_avg", state.exp_avg.get(i)),
                ("exp_avg_sq", state.exp_avg_sq.get(i)),
            ] {
                if let Some(t) = t {
                    t.strided_buf()
                        .add_region(&mut all, name, p.dtype(), Access::ReadWrite)?;
                }
            }
        }
        all.check_aliasing()?;
        let step = state.step + 1;
        let desc = |p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor| AdamDesc {
            dtype: p.dtype(),
            params: p.data_ptr(),
            grads: g.data_ptr(),
            exp_avg: m.data_ptr(),
            exp_avg_sq: v.data_ptr(),
            len: p.numel(),
            lr: widen(lr),
            beta1: widen(betas.0),
            beta2: widen(betas.1),
            eps: state.eps,
            weight_decay: state.weight_decay,
            decoupled_weight_decay: state.decoupled_weight_decay,
            step,
        };
        // Check the hyper-parameters once, before touching anything.
        if let Some(p) = params.first() {
            let probe = desc(p, p, p, p);
            if let Err(e @ BackendError::InvalidArgument { .. }) = probe.accesses() {
                return Err(e);
            }
        }
        if state.exp_avg.is_empty() {
            for p in params.iter() {
                state.exp_avg.push(self.zeros(p.shape(), p.dtype())?);
                state.exp_avg_sq.push(self.zeros(p.shape(), p.dtype())?);
            }
        }
        for (i, p) in params.iter().enumerate() {
            let g = grads[i].contiguous()?;
            let (m, v) = (&state.exp_avg[i], &state.exp_avg_sq[i]);
            with_dense_inplace(p, |p| self.compute().adam_step(&desc(p, &g, m, v)))?;
        }
        state.step = step;
        Ok(())
    }
}

impl Backend {
    /// Divides every gradient by a loss scale — multiplies it by `inv_scale` — into new tensors, and
    /// says whether any result holds an inf or NaN (PyTorch's
    /// `_amp_foreach_non_finite_check_and_unscale_`): one fused pass per tensor
    /// ([`crate::ComputeBackend::unscale_and_check`]) and one read of the device for the whole set.
    /// The inputs are left as they are. `InvalidArgument` for an `inv_scale` that is zero or not
    /// finite; `DeviceMismatch` for a tensor of another backend; `Unsupported` for integer dtypes.
    pub fn unscale_and_check(
        &self,
        grads: &[Tensor],
        inv_scale: f64,
    ) -> Result<(Vec<Tensor>, bool)> {
        let op = "unscale_and_check";
        for g in grads {
            self.check_owner(op, g)?;
        }
        let flag = self.zeros(&[1], DType::F32)?;
        let mut out = Vec::with_capacity(grads.len());
        for g in grads {
            let dense = g.contiguous()?;
            let unscaled = self.empty(g.shape(), g.dtype())?;
            self.compute().unscale_and_check(&UnscaleDesc {
                dtype: g.dtype(),
                input: dense.data_ptr(),
                output: unscaled.data_ptr(),
                len: g.numel(),
                inv_scale,
                found_inf: flag.data_ptr(),
            })?;
            out.push(unscaled);
        }
        let found = flag.item()? != 0.0;
        Ok((out, found))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn widening_keeps_the_decimal_value() {
        assert_eq!(super::widen(0.9), 0.9f64);
        assert_eq!(super::widen(0.999), 0.999f64);
        assert_eq!(super::widen(1e-3), 1e-3f64);
    }
}
