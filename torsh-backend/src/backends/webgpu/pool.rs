//! Host side of `shaders/pool.wgsl`: 2-D pooling, one invocation per output, in f32, and in f16
//! where the device has `SHADER_F16`. Other dtypes, misaligned operands and sizes beyond the kernels' 32-bit words
//! answer [`Launch::Stage`].

use crate::compute::{Pool2dDesc, PoolKind};
use crate::error::Result;

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{composed, pieces, Loops, Plan};
use super::loops;
use super::math_dtype;
use super::memory::Memory;
use super::pipelines::{for_dtype, grid_1d, Dispatch, Kernels, POOL, POOL_F16};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;

/// `values` as parameter words, or `None` when one does not fit in 32 bits.
pub(super) fn words(values: &[usize]) -> Option<Vec<u32>> {
    values.iter().map(|&v| u32::try_from(v).ok()).collect()
}

/// Max or average pooling in f32, or f16 (f32 math) where the device has `SHADER_F16`.
pub(crate) fn pool2d(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &Pool2dDesc) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, POOL, POOL_F16) else {
        return Ok(Launch::Stage);
    };
    if d.output_shape.contains(&0) {
        return Ok(Launch::Done);
    }
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.output_shape;
    let outputs = n * c * oh * ow;
    let (Some(x), Some(out)) = (
        mem.elements_u32(d.input, n * c * h * w, size)?,
        mem.elements_u32(d.output, outputs, size)?,
    ) else {
        return Ok(Launch::Stage);
    };
    let kind = match d.kind {
        PoolKind::Max => 0,
        PoolKind::Avg {
            count_include_pad: true,
        } => 1,
        PoolKind::Avg {
            count_include_pad: false,
        } => 2,
    };
    // The window's padded coordinates must fit too.
    let reach_y = oh
        .checked_mul(d.stride[0])
        .and_then(|v| v.checked_add(d.kernel[0]));
    let reach_x = ow
        .checked_mul(d.stride[1])
        .and_then(|v| v.checked_add(d.kernel[1]));
    let window = d.kernel[0].checked_mul(d.kernel[1]);
    let (Some(reach_y), Some(reach_x), Some(window)) = (reach_y, reach_x, window) else {
        return Ok(Launch::Stage);
    };
    let Some(p) = words(&[
        outputs,
        h,
        w,
        oh,
        ow,
        d.kernel[0],
        d.kernel[1],
        d.stride[0],
        d.stride[1],
        d.padding[0],
        d.padding[1],
        kind,
        x.1 as usize,
        out.1 as usize,
        reach_y,
        reach_x,
        window,
        oh * ow,
        h * w,
    ]) else {
        return Ok(Launch::Stage);
    };
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry: "pool2d",
            constants: &[],
            buffers: &[x.0, out.0],
            params: &p[..14],
            groups: grid_1d(outputs, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops: loops::pool2d(d.kernel[0], d.kernel[1]),
        },
    )?;
    Ok(Launch::Done)
}

impl OpImpl<Pool2dDesc> for WebGpuBackend {
    fn op(&self, desc: &Pool2dDesc) -> Result<()> {
        math_dtype("pool2d", desc.dtype, desc)?;
        let loops = Loops {
            elements: desc.output_shape.iter().product(),
            passes: &|_| loops::pool2d(desc.kernel[0], desc.kernel[1]),
        };
        let run = |d: &Pool2dDesc| self.run(d, pool2d);
        match self.plan(desc, desc.dtype, pieces::pool2d, Some(loops))? {
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // A window of more taps than a launch takes within the loop budget: a pass along
            // rows, then one along columns.
            Plan::PastBudget => composed::pool2d(self, desc),
            // A single plane larger than a binding: the launch's window check reports it.
            Plan::Whole | Plan::TooLarge => run(desc),
        }
    }
}
