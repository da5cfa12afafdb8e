//! Host side of `shaders/optim.wgsl`: one fused Adam/AdamW step in f32. Bias corrections, `1 - β`
//! and the AdamW decay factor are computed here in f64 and passed rounded to f32. And of
//! `shaders/unscale.wgsl`: the loss scaler's fused unscale and inf/NaN check.

use crate::compute::{AdamDesc, UnscaleDesc};
use crate::dtype::DType;
use crate::error::Result;

use super::context::Gpu;
use super::elementwise::Launch;
use super::memory::Memory;
use super::pipelines::{grid_1d, Dispatch, Kernels, OPTIM, UNSCALE};

/// An f32 Adam or AdamW step; `Stage` for other dtypes, misaligned operands or offsets beyond 32 bits.
pub(crate) fn adam_step(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &AdamDesc,
) -> Result<Launch> {
    if d.dtype != DType::F32 {
        return Ok(Launch::Stage);
    }
    let operands = [d.params, d.grads, d.exp_avg, d.exp_avg_sq].map(|ptr| (ptr, d.len));
    let Some((buffers, offsets)) = mem.words_u32_each(&operands)? else {
        return Ok(Launch::Stage);
    };
    let Ok(n) = u32::try_from(d.len) else {
        return Ok(Launch::Stage);
    };
    let t = i32::try_from(d.step).unwrap_or(i32::MAX);
    let step_size = d.lr / (1.0 - d.beta1.powi(t));
    let bc2_sqrt = (1.0 - d.beta2.powi(t)).sqrt();
    let bits = |v: f64| (v as f32).to_bits();
    let mut p = vec![n];
    p.extend(&offsets);
    // AdamW scales the parameter; Adam adds the decay to the gradient.
    let (decay, l2) = if d.decoupled_weight_decay {
        (1.0 - d.lr * d.weight_decay, 0.0)
    } else {
        (1.0, d.weight_decay)
    };
    p.extend([
        bits(decay),
        bits(d.beta1),
        bits(d.beta2),
        bits(d.eps),
        bits(l2),
        bits(step_size),
        bits(bc2_sqrt),
        bits(1.0 - d.beta1),
        bits(1.0 - d.beta2),
    ]);
    kernels.dispatch(
        gpu,
        Dispatch {
            module: OPTIM,
            entry: "adam",
            constants: &[],
            buffers: &buffers,
            params: &p,
            groups: grid_1d(d.len, gpu.limits.max_compute_workgroups_per_dimension)?,
        },
    )?;
    Ok(Launch::Done)
}

/// The f32 unscale and check; `Stage` for other dtypes, misaligned operands or offsets beyond 32
/// bits.
pub(crate) fn unscale_and_check(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &UnscaleDesc,
) -> Result<Launch> {
    if d.dtype != DType::F32 {
        return Ok(Launch::Stage);
    }
    let operands = [(d.input, d.len), (d.output, d.len), (d.found_inf, 1)];
    let Ok(n) = u32::try_from(d.len) else {
        return Ok(Launch::Stage);
    };
    let Some((buffers, offsets)) = mem.words_u32_each(&operands)? else {
        return Ok(Launch::Stage);
    };
    let mut p = vec![n];
    p.extend(offsets);
    // The scale rounded to f32 once, as `mul` by a scalar rounds it.
    p.push((d.inv_scale as f32).to_bits());
    kernels.dispatch(
        gpu,
        Dispatch {
            module: UNSCALE,
            entry: "unscale",
            constants: &[],
            buffers: &buffers,
            params: &p,
            groups: grid_1d(d.len, gpu.limits.max_compute_workgroups_per_dimension)?,
        },
    )?;
    Ok(Launch::Done)
}
