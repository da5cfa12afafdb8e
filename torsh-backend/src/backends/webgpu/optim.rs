//! Host side of `shaders/optim.wgsl`: one fused Adam/AdamW step, in f32, and in f16 (f32 math) where
//! the device has `SHADER_F16`. Bias corrections, `1 - β`
//! and the AdamW decay factor are computed here in f64 and passed rounded to f32. And of
//! `shaders/unscale.wgsl`: the loss scaler's fused unscale and inf/NaN check, in the same dtypes.

use crate::compute::{AdamDesc, UnscaleDesc};
use crate::error::Result;

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{pieces, Plan};
use super::math_dtype;
use super::memory::Memory;
use super::pipelines::{
    for_dtype, grid_1d, Dispatch, Kernels, OPTIM, OPTIM_F16, UNSCALE, UNSCALE_F16,
};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::unscale_by_parts;

/// An Adam or AdamW step in f32 or (with `SHADER_F16`) f16; `Stage` for other dtypes, misaligned
/// operands or offsets beyond 32 bits.
pub(crate) fn adam_step(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &AdamDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, OPTIM, OPTIM_F16) else {
        return Ok(Launch::Stage);
    };
    let operands = [d.params, d.grads, d.exp_avg, d.exp_avg_sq].map(|ptr| (ptr, d.len));
    let Some((buffers, offsets)) = mem.elements_u32_each(&operands, size)? else {
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
            module,
            entry: "adam",
            constants: &[],
            buffers: &buffers,
            params: &p,
            groups: grid_1d(d.len, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops: super::loops::NONE,
        },
    )?;
    Ok(Launch::Done)
}

/// The unscale and check in f32 or (with `SHADER_F16`) f16; `Stage` for other dtypes, misaligned
/// operands or offsets beyond 32 bits.
pub(crate) fn unscale_and_check(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &UnscaleDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, UNSCALE, UNSCALE_F16) else {
        return Ok(Launch::Stage);
    };
    let operands = [(d.input, d.len), (d.output, d.len)];
    let Ok(n) = u32::try_from(d.len) else {
        return Ok(Launch::Stage);
    };
    let (Some((mut buffers, offsets)), Some(flag)) = (
        mem.elements_u32_each(&operands, size)?,
        mem.elements_u32(d.found_inf, 1, 4)?,
    ) else {
        return Ok(Launch::Stage);
    };
    buffers.push(flag.0);
    let mut p = vec![n];
    p.extend(offsets);
    p.push(flag.1);
    // The scale rounded to f32 once, as `mul` by a scalar rounds it.
    p.push((d.inv_scale as f32).to_bits());
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry: "unscale",
            constants: &[],
            buffers: &buffers,
            params: &p,
            groups: grid_1d(d.len, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops: super::loops::NONE,
        },
    )?;
    Ok(Launch::Done)
}

impl OpImpl<AdamDesc> for WebGpuBackend {
    fn op(&self, desc: &AdamDesc) -> Result<()> {
        math_dtype("adam_step", desc.dtype, desc)?;
        let run = |d: &AdamDesc| self.run(d, adam_step);
        match self.plan(desc, desc.dtype, pieces::adam, None)? {
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            _ => run(desc),
        }
    }
}

impl OpImpl<UnscaleDesc> for WebGpuBackend {
    fn op(&self, desc: &UnscaleDesc) -> Result<()> {
        math_dtype("unscale_and_check", desc.dtype, desc)?;
        if desc.dtype != crate::dtype::DType::F32 && desc.inv_scale.abs() > 1.0 {
            // A scale below 1 can grow a 16-bit value past its dtype's range, which the f32 kernel
            // on staged copies would not see: judge the stored values instead.
            return unscale_by_parts(self, desc);
        }
        let run = |d: &UnscaleDesc| self.run(d, unscale_and_check);
        match self.plan(desc, desc.dtype, pieces::unscale, None)? {
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            _ => run(desc),
        }
    }
}
