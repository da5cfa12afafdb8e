//! Host side of `shaders/loss.wgsl`: the fused cross-entropy, a workgroup per row, in f32 and in
//! f16 where the device has `SHADER_F16` (bf16 and misaligned operands are staged). A target
//! outside `0..classes` that is not the ignore index raises the device's error flag (`index.rs`).
//! Rows past one binding run in pieces of rows; a tensor no cut fits, or rows longer than a launch
//! takes within the loop budget, answer `FeatureUnavailable` (the tensor-level
//! `Backend::cross_entropy` then composes the op of others).

use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::CrossEntropyDesc;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{pieces, Loops, Plan};
use super::loops;
use super::math_dtype;
use super::memory::{Binding, Memory};
use super::pipelines::{
    combining, for_dtype, grid_rows, Dispatch, Kernels, LOSS, LOSS_F16, LOSS_F16_SUBGROUP,
    LOSS_SUBGROUP,
};

/// The codes the kernel raises the error flag with, forward and backward (`index::FLAG_OPS`).
const FLAG_CODES: [u32; 2] = [3, 4];

/// Launches `d` whole.
fn cross_entropy(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &CrossEntropyDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(
        gpu,
        d.dtype,
        combining(gpu, LOSS, LOSS_SUBGROUP),
        combining(gpu, LOSS_F16, LOSS_F16_SUBGROUP),
    ) else {
        return Ok(Launch::Stage);
    };
    let n = d.rows * d.classes;
    let out_len = if d.grad.is_some() { n } else { d.rows };
    let words = if d.index_dtype == DType::I64 { 2 } else { 1 };
    let (Some(x), Some(target), Some(out)) = (
        mem.elements_u32(d.logits, n, size)?,
        mem.elements_u32(d.target, words * d.rows, 4)?,
        mem.elements_u32(d.output, out_len, size)?,
    ) else {
        return Ok(Launch::Stage);
    };
    let w = match d.grad {
        Some(g) => match mem.elements_u32(g, d.rows, size)? {
            Some(w) => w,
            None => return Ok(Launch::Stage),
        },
        // The logits stand in for the absent gradients (never read).
        None => x,
    };
    let (Ok(rows), Ok(classes)) = (u32::try_from(d.rows), u32::try_from(d.classes)) else {
        return Ok(Launch::Stage);
    };
    let Some(groups) = grid_rows(d.rows, gpu.limits.max_compute_workgroups_per_dimension) else {
        return Ok(Launch::Stage);
    };
    let ignore = d.ignore_index.unwrap_or(0) as u64;
    let p = [
        rows,
        classes,
        x.1,
        target.1,
        u32::from(d.index_dtype == DType::I64),
        u32::from(d.grad.is_some()),
        w.1,
        out.1,
        u32::from(d.ignore_index.is_some()),
        ignore as u32,
        (ignore >> 32) as u32,
        (d.label_smoothing as f32).to_bits(),
        FLAG_CODES[usize::from(d.grad.is_some())],
    ];
    gpu.flag_armed
        .store(true, std::sync::atomic::Ordering::Release);
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry: "cross_entropy",
            constants: &[("WG", u64::from(gpu.row_threads))],
            buffers: &[x.0, target.0, w.0, out.0, Binding::whole(&gpu.error_flag)],
            params: &p,
            groups,
            loops: loops::cross_entropy(gpu.row_threads, d.classes),
        },
    )?;
    Ok(Launch::Done)
}

impl OpImpl<CrossEntropyDesc> for WebGpuBackend {
    fn op(&self, desc: &CrossEntropyDesc) -> Result<()> {
        math_dtype(desc.name(), desc.dtype, desc)?;
        let loops = Loops {
            elements: desc.rows,
            passes: &|gpu| loops::cross_entropy(gpu.row_threads, desc.classes),
        };
        let run = |d: &CrossEntropyDesc| self.run(d, cross_entropy);
        match self.plan(desc, desc.dtype, pieces::cross_entropy, Some(loops))? {
            Plan::Whole => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            Plan::TooLarge | Plan::PastBudget => Err(BackendError::FeatureUnavailable {
                feature: "cross_entropy past one binding or the loop budget",
                reason: format!(
                    "{} of rows of {} classes: a row larger than a binding, or longer than a \
                     launch takes within the loop budget",
                    desc.name(),
                    desc.classes
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_codes_name_the_op_and_the_shader_reads_them() {
        let ops = super::super::index::FLAG_OPS;
        assert_eq!(ops[FLAG_CODES[0] as usize], "cross_entropy");
        assert_eq!(ops[FLAG_CODES[1] as usize], "cross_entropy_backward");
        assert!(include_str!("shaders/loss.wgsl").contains("atomicStore(&flag[1], p[12]);"));
    }
}
