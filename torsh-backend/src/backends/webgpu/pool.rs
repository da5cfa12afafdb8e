//! Host side of `shaders/pool.wgsl` (2-D pooling, one invocation per output) and
//! `shaders/pool_backward.wgsl` (the max pool that writes its positions, one invocation per output,
//! and the gradients, one per input element), in f32, and in f16 where the device has
//! `SHADER_F16`. Other dtypes, misaligned operands and sizes beyond the kernels' 32-bit words answer
//! [`Launch::Stage`].

use crate::compute::{Pool2dBackwardDesc, Pool2dDesc, PoolKind};
use crate::error::{BackendError, Result};

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{composed, pieces, Loops, Plan};
use super::loops;
use super::math_dtype;
use super::memory::Binding;
use super::memory::Memory;
use super::pipelines::{
    for_dtype, grid_1d, Dispatch, Kernels, POOL, POOL_BACKWARD, POOL_BACKWARD_F16, POOL_F16,
};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;

/// `values` as parameter words, or `None` when one does not fit in 32 bits.
pub(super) fn words(values: &[usize]) -> Option<Vec<u32>> {
    values.iter().map(|&v| u32::try_from(v).ok()).collect()
}

/// The kernels' code for a kind of pooling.
fn kind_code(kind: PoolKind) -> usize {
    match kind {
        PoolKind::Max => 0,
        PoolKind::Avg {
            count_include_pad: true,
        } => 1,
        PoolKind::Avg {
            count_include_pad: false,
        } => 2,
    }
}

/// The code `pool_backward.wgsl` raises the error flag with (`index::FLAG_OPS`).
const FLAG_CODE: usize = 2;

/// The window's geometry as parameter words 1..12 of both shaders, with the padded reach of the last
/// window (which must fit in 32 bits as well); `None` when a number does not fit.
fn geometry(
    [h, w]: [usize; 2],
    [oh, ow]: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    kind: PoolKind,
) -> Option<Vec<u32>> {
    let reach = |o: usize, axis: usize| {
        o.checked_mul(stride[axis])?
            .checked_add(kernel[axis])?
            .checked_add(padding[axis])
    };
    let planes = [h.checked_mul(w)?, oh.checked_mul(ow)?];
    words(&[
        h,
        w,
        oh,
        ow,
        kernel[0],
        kernel[1],
        stride[0],
        stride[1],
        padding[0],
        padding[1],
        kind_code(kind),
        reach(oh, 0)?,
        reach(ow, 1)?,
        planes[0],
        planes[1],
    ])
}

/// The max pool of `d` that also writes its positions, in f32, or f16 where the device has
/// `SHADER_F16`.
fn max_with_indices(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &Pool2dDesc,
    indices: crate::compute::DevicePtr,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, POOL_BACKWARD, POOL_BACKWARD_F16) else {
        return Ok(Launch::Stage);
    };
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.output_shape;
    let outputs = n * c * oh * ow;
    let (Some(x), Some(out), Some(ix)) = (
        mem.elements_u32(d.input, n * c * h * w, size)?,
        mem.elements_u32(d.output, outputs, size)?,
        mem.elements_u32(indices, 2 * outputs, 4)?,
    ) else {
        return Ok(Launch::Stage);
    };
    let Some(g) = geometry([h, w], [oh, ow], d.kernel, d.stride, d.padding, d.kind) else {
        return Ok(Launch::Stage);
    };
    let Some(head) = words(&[outputs]) else {
        return Ok(Launch::Stage);
    };
    let mut p = head;
    p.extend_from_slice(&g[..11]);
    p.extend_from_slice(&[x.1, out.1, ix.1, 0]);
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry: "max_pool2d_indices",
            constants: &[],
            buffers: &[x.0, out.0, ix.0, Binding::whole(&gpu.error_flag)],
            params: &p,
            groups: grid_1d(outputs, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops: loops::pool2d(d.kernel[0], d.kernel[1]),
        },
    )?;
    Ok(Launch::Done)
}

/// The input gradient of `d`, in f32, or f16 where the device has `SHADER_F16`.
pub(crate) fn pool2d_backward(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &Pool2dBackwardDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, POOL_BACKWARD, POOL_BACKWARD_F16) else {
        return Ok(Launch::Stage);
    };
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.grad_shape;
    let inputs = n * c * h * w;
    if inputs == 0 {
        return Ok(Launch::Done);
    }
    let (Some(grad), Some(out)) = (
        mem.elements_u32(d.grad, n * c * oh * ow, size)?,
        mem.elements_u32(d.output, inputs, size)?,
    ) else {
        return Ok(Launch::Stage);
    };
    // An average binds the gradient again where the positions would be (never read).
    let ix = match d.indices {
        Some(p) => match mem.elements_u32(p, 2 * n * c * oh * ow, 4)? {
            Some(ix) => ix,
            None => return Ok(Launch::Stage),
        },
        None => (grad.0, 0),
    };
    let Some(g) = geometry([h, w], [oh, ow], d.kernel, d.stride, d.padding, d.kind) else {
        return Ok(Launch::Stage);
    };
    let Some(head) = words(&[inputs]) else {
        return Ok(Launch::Stage);
    };
    let mut p = head;
    p.extend_from_slice(&g[..11]);
    p.extend_from_slice(&[grad.1, out.1, ix.1, FLAG_CODE as u32]);
    if d.indices.is_some() {
        gpu.flag_armed
            .store(true, std::sync::atomic::Ordering::Release);
    }
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry: "pool2d_backward",
            constants: &[],
            buffers: &[grad.0, out.0, ix.0, Binding::whole(&gpu.error_flag)],
            params: &p,
            groups: grid_1d(inputs, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops: backward_loops(d),
        },
    )?;
    Ok(Launch::Done)
}

/// Loop passes of one invocation of `pool2d_backward`: the windows over an input element, at most
/// `⌈k / stride⌉` along each side.
fn backward_loops(d: &Pool2dBackwardDesc) -> u64 {
    loops::pool2d(
        d.kernel[0].div_ceil(d.stride[0]),
        d.kernel[1].div_ceil(d.stride[1]),
    )
}

/// Max or average pooling in f32, or f16 (f32 math) where the device has `SHADER_F16`.
pub(crate) fn pool2d(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &Pool2dDesc) -> Result<Launch> {
    if let Some(indices) = d.indices {
        if d.output_shape.contains(&0) {
            return Ok(Launch::Done);
        }
        return max_with_indices(gpu, kernels, mem, d, indices);
    }
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

impl OpImpl<Pool2dBackwardDesc> for WebGpuBackend {
    fn op(&self, desc: &Pool2dBackwardDesc) -> Result<()> {
        math_dtype("pool2d_backward", desc.dtype, desc)?;
        let loops = Loops {
            elements: desc.input_shape.iter().product(),
            passes: &|_| backward_loops(desc),
        };
        match self.plan(desc, desc.dtype, pieces::pool2d_backward, Some(loops))? {
            Plan::Pieces(parts) => parts.iter().try_for_each(|d| self.run(d, pool2d_backward)),
            Plan::PastBudget => Err(BackendError::FeatureUnavailable {
                feature: "WebGPU loop budget",
                reason: format!(
                    "pool2d_backward: the {:?} window with stride {:?} overlaps more windows than \
                     a launch loops over within the budget",
                    desc.kernel, desc.stride
                ),
            }),
            Plan::Whole | Plan::TooLarge => self.run(desc, pool2d_backward),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_code_names_the_gradient_and_the_shader_reads_it() {
        assert_eq!(
            super::super::index::FLAG_OPS[FLAG_CODE],
            "max_pool2d_backward"
        );
        let src = POOL_BACKWARD.source;
        assert!(src.contains("atomicStore(&flag[1], p[15]);"));
        assert!(src.contains("fn max_pool2d_indices("));
        assert!(src.contains("fn pool2d_backward("));
    }

    #[test]
    fn geometry_words_follow_the_shader_layout() {
        let kind = PoolKind::Avg {
            count_include_pad: false,
        };
        let g = geometry([7, 5], [4, 6], [3, 2], [2, 1], [1, 1], kind).unwrap();
        assert_eq!(&g[..11], &[7, 5, 4, 6, 3, 2, 2, 1, 1, 1, 2]);
        assert!(geometry([1 << 31, 4], [1 << 30, 1], [2, 2], [2, 2], [0, 0], kind).is_none());
    }
}
