//! Reductions along an axis, through the row kernels of `shaders/rows.wgsl` (which `norm.rs`
//! launches too, for softmax and layer norm): in f32, and in f16 where the device has `SHADER_F16`
//! (f32 math, one rounding per stored value), one workgroup per row. Other dtypes, misaligned operands and views whose offsets do not
//! fit the kernels' 32-bit words answer [`Launch::Stage`].

use crate::compute::{ReduceDesc, ReduceOp};
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::{coalesce, Layout};

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{pieces, two_pass, Loops, Plan};
use super::loops;
use super::math_dtype;
use super::memory::{Binding, Memory};
use super::pipelines::{
    combining, for_dtype, grid_rows, Dispatch, Kernels, Module, ROWS, ROWS_F16, ROWS_F16_SUBGROUP,
    ROWS_SUBGROUP,
};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;

/// Most dims of a reduction's row index.
const MAX_RANK: usize = 8;

/// `v` as a parameter word, if it fits.
pub(super) fn word(v: usize) -> Option<u32> {
    u32::try_from(v).ok()
}

/// The row module that serves `dtype` on this device with its element size; `None` for dtypes that
/// are staged.
pub(super) fn module(gpu: &Gpu, dtype: DType) -> Option<(Module, usize)> {
    for_dtype(
        gpu,
        dtype,
        combining(gpu, ROWS, ROWS_SUBGROUP),
        combining(gpu, ROWS_F16, ROWS_F16_SUBGROUP),
    )
}

/// Launches `entry` of `module` over `rows` rows with the input, layer norm's weight and bias (the
/// input where absent) and the output bound (twice: as values and as index words), `params` as
/// parameter words, and `loops` loop passes an invocation (`loops.rs`).
pub(super) fn launch(
    gpu: &Gpu,
    kernels: &Kernels,
    (module, entry, loops): (Module, &'static str, u64),
    rows: usize,
    [input, weight, bias, output, idx]: [Binding<'_>; 5],
    params: &[u32],
) -> Result<Launch> {
    if rows == 0 {
        return Ok(Launch::Done);
    }
    let Some(groups) = grid_rows(rows, gpu.limits.max_compute_workgroups_per_dimension) else {
        return Ok(Launch::Stage);
    };
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry,
            constants: &[("WG", u64::from(gpu.row_threads))],
            buffers: &[input, weight, bias, output, idx],
            params,
            groups,
            loops,
        },
    )?;
    Ok(Launch::Done)
}

/// A reduction along `d.axis`.
pub(crate) fn reduce(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &ReduceDesc) -> Result<Launch> {
    let Some((module, size)) = module(gpu, d.dtype) else {
        return Ok(Launch::Stage);
    };
    let indices = matches!(d.op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    let layout = &d.input.layout;
    let (len, stride) = (layout.shape()[d.axis], layout.strides()[d.axis]);
    let mut shape = layout.shape().to_vec();
    let mut strides = layout.strides().to_vec();
    shape.remove(d.axis);
    strides.remove(d.axis);
    let rows_layout = Layout::new(shape, strides, 0)?;
    let (shape, [strides]) = coalesce("reduce", [&rows_layout])?;
    // Indices are i64, written as pairs of 32-bit words.
    let out_size = if indices { 4 } else { size };
    let (Some((input, in_off)), Some((output, out_off))) = (
        mem.view_elements(d.input.ptr, layout.offset(), size)?,
        mem.elements(d.output, out_size)?,
    ) else {
        return Ok(Launch::Stage);
    };
    let rows: usize = shape.iter().product();
    if rows == 0 {
        return Ok(Launch::Done);
    }
    // The last element the kernel reads must be addressable.
    let last = shape
        .iter()
        .zip(&strides)
        .try_fold(in_off, |acc, (&e, &s)| {
            acc.checked_add((e - 1).checked_mul(s)?)
        })
        .and_then(|a| a.checked_add(len.saturating_sub(1).checked_mul(stride)?));
    let out_units = if indices { 2 } else { 1 };
    if shape.len() > MAX_RANK
        || last.and_then(word).is_none()
        || rows
            .checked_mul(out_units)
            .and_then(|w| w.checked_add(out_off))
            .and_then(word)
            .is_none()
    {
        return Ok(Launch::Stage);
    }
    let correction = match d.op {
        ReduceOp::Var { correction } => correction,
        _ => 0,
    };
    let code = d.op.code();
    let mut p = vec![0u32; 24];
    p[0] = rows as u32;
    p[1] = len as u32;
    p[2] = word(stride).unwrap_or(0);
    p[3] = code;
    p[4] = out_off as u32;
    p[5] = in_off as u32;
    p[6] = correction;
    p[7] = shape.len() as u32;
    for (k, (&e, &s)) in shape.iter().zip(&strides).enumerate() {
        p[8 + k] = e as u32;
        p[16 + k] = s as u32;
    }
    if word(len).is_none() || word(stride).is_none() {
        return Ok(Launch::Stage);
    }
    launch(
        gpu,
        kernels,
        (module, "reduce", loops::reduce(gpu.row_threads, d.op, len)),
        rows,
        [input, input, input, output, output],
        &p,
    )
}

impl OpImpl<ReduceDesc> for WebGpuBackend {
    fn op(&self, desc: &ReduceDesc) -> Result<()> {
        math_dtype("reduce", desc.dtype, desc)?;
        let len = desc.input.layout.shape()[desc.axis];
        let loops = Loops {
            elements: desc.input.layout.numel(),
            passes: &|gpu| loops::reduce(gpu.row_threads, desc.op, len),
        };
        let run = |d: &ReduceDesc| self.run(d, reduce);
        match self.plan(desc, desc.dtype, pieces::reduce, Some(loops))? {
            Plan::Whole => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // Rows longer than a launch takes within the loop budget: two passes over blocks of
            // them.
            Plan::PastBudget => two_pass::reduce(self, desc),
            // Too large for one binding and not cut by leading index (`pieces::reduce` cuts those
            // that reduce another dim): along the leading dim, two passes over blocks of it; along
            // another, one index of the leading dim past a binding, a reduction of one rank less
            // per index.
            Plan::TooLarge if desc.axis == 0 => two_pass::reduce(self, desc),
            Plan::TooLarge => pieces::reduce_by_index(desc)?
                .iter()
                .try_for_each(|d| self.reduce(d)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::webgpu::pipelines::shader_codes;

    #[test]
    fn reduce_codes_match_the_shader() {
        let codes = shader_codes(include_str!("shaders/rows.wgsl"), "RED_");
        assert_eq!(codes.len(), ReduceOp::ALL.len(), "RED_* constants");
        for &op in ReduceOp::ALL {
            let name = op.name().to_uppercase();
            assert!(codes.contains(&(name.clone(), op.code())), "RED_{name}");
        }
    }
}
