//! Host side of `shaders/conv.wgsl` and `shaders/conv_backward.wgsl`: f32 conv2d (and f16 with f32 accumulation where the device has
//! `SHADER_F16`) (NCHW, any stride, padding, dilation and groups,
//! optional bias) as an implicit GEMM per group, its (group, pixel tile) pairs folded over two grid
//! dimensions. Other dtypes, misaligned operands, grids beyond two dimensions of pairs and sizes
//! whose indices do not fit the kernel's 32-bit words answer [`Launch::Stage`].
//!
//! The gradients run direct kernels: one invocation per input element (input gradient), one
//! workgroup per weight element (weight gradient). Each launch keeps within the loop budget by
//! taking a block of the group's output channels (input gradient) or of the images (weight
//! gradient), later blocks adding into the result. Operands larger than one storage binding run by
//! pieces of images (the weight gradient's pieces summed through scratch); only an image whose own
//! operands pass a binding answers `FeatureUnavailable`.

use crate::compute::{
    BinaryDesc, BinaryOp, ComputeBackend, Conv2dBackwardInputDesc, Conv2dBackwardWeightDesc,
    Conv2dDesc, StridedBuf, Temporaries, Value,
};
use crate::error::{BackendError, Result};

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{conv_split, pieces, Loops, Plan};
use super::loops;
use super::math_dtype;
use super::memory::Memory;
use super::pipelines::{
    for_dtype, grid_1d, grid_rows, Dispatch, Kernels, CONV, CONV_BACKWARD, CONV_BACKWARD_F16,
    CONV_F16,
};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;

/// Rows (output channels) and columns (output pixels) of a workgroup's tile.
pub(crate) const TILE: usize = 64;

/// The most (input channel, tap) pairs of a group one launch takes within the device's loop
/// budget (`loops.rs`); `None` when not even one step fits.
pub(crate) fn max_depth(gpu: &Gpu) -> Option<usize> {
    loops::longest(usize::MAX / 2, gpu.loop_limit, loops::conv2d)
}

/// An f32 convolution, or f16 (f32 accumulation) where the device has `SHADER_F16`.
pub(crate) fn conv2d(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &Conv2dDesc) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, CONV, CONV_F16) else {
        return Ok(Launch::Stage);
    };
    if d.output_shape.contains(&0) {
        return Ok(Launch::Done);
    }
    let (Some(input), Some(weight), Some(output)) = (
        mem.elements(d.input, size)?,
        mem.elements(d.weight, size)?,
        mem.elements(d.output, size)?,
    ) else {
        return Ok(Launch::Stage);
    };
    let bias = match d.bias {
        Some(b) => match mem.elements(b, size)? {
            Some(found) => Some(found),
            None => return Ok(Launch::Stage),
        },
        None => None,
    };
    let [n, c, h, w] = d.input_shape;
    let [k, cg, r, s] = d.weight_shape;
    let [_, _, oh, ow] = d.output_shape;
    let kg = k / d.groups;
    let limit = gpu.limits.max_compute_workgroups_per_dimension as usize;
    // Every index the kernel forms must fit in 32 bits: element offsets of the operands, the padded
    // input coordinates, the im2col depth and the column count.
    let biggest = [
        input.1.checked_add(n * c * h * w),
        weight.1.checked_add(k * cg * r * s),
        output.1.checked_add(n * k * oh * ow),
        bias.map_or(Some(0), |b| b.1.checked_add(k)),
        oh.checked_mul(d.stride[0])
            .and_then(|v| v.checked_add(r.checked_mul(d.dilation[0])?)),
        ow.checked_mul(d.stride[1])
            .and_then(|v| v.checked_add(s.checked_mul(d.dilation[1])?)),
        Some(cg * r * s + TILE),
        Some(n * oh * ow + TILE),
    ];
    let fits = biggest
        .iter()
        .all(|v| v.is_some_and(|v| u32::try_from(v).is_ok()));
    // Tiles of output channels along x; the (group, tile of output pixels) pairs folded over y
    // and z.
    let pixel_tiles = (n * oh * ow).div_ceil(TILE);
    let channel_tiles = kg.div_ceil(TILE);
    let pairs = pixel_tiles.checked_mul(d.groups);
    let folded =
        pairs.and_then(|pairs| grid_rows(pairs, gpu.limits.max_compute_workgroups_per_dimension));
    let (Some(pairs), Some((gy, gz, _))) = (pairs, folded) else {
        return Ok(Launch::Stage);
    };
    if !fits || channel_tiles > limit || u32::try_from(pairs).is_err() {
        return Ok(Launch::Stage);
    }
    let words: Option<Vec<u32>> = [
        n,
        c,
        h,
        w,
        k,
        cg,
        r,
        s,
        oh,
        ow,
        d.stride[0],
        d.stride[1],
        d.padding[0],
        d.padding[1],
        d.dilation[0],
        d.dilation[1],
        kg,
        input.1,
        weight.1,
        bias.map_or(0, |b| b.1),
        output.1,
        usize::from(bias.is_some()),
        pixel_tiles,
        d.groups,
    ]
    .iter()
    .map(|&v| u32::try_from(v).ok())
    .collect();
    let Some(words) = words else {
        return Ok(Launch::Stage);
    };
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry: "conv2d",
            constants: &[("PADDED", u64::from(d.padding != [0, 0]))],
            buffers: &[input.0, weight.0, bias.map_or(input.0, |b| b.0), output.0],
            params: &words,
            groups: (channel_tiles as u32, gy, gz),
            loops: loops::conv2d(cg * r * s),
        },
    )?;
    Ok(Launch::Done)
}

impl OpImpl<Conv2dDesc> for WebGpuBackend {
    fn op(&self, desc: &Conv2dDesc) -> Result<()> {
        math_dtype("conv2d", desc.dtype, desc)?;
        let [_, cg, r, s] = desc.weight_shape;
        let loops = Loops {
            elements: desc.output_shape.iter().product(),
            passes: &|_| loops::conv2d(cg * r * s),
        };
        let run = |d: &Conv2dDesc| self.run(d, conv2d);
        match self.plan(desc, desc.dtype, pieces::conv2d, Some(loops))? {
            Plan::Whole => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // Not even one image fits a binding, or a group's (input channel, tap) pairs are more
            // than a launch takes within the loop budget: by channels of each image.
            Plan::TooLarge | Plan::PastBudget => conv_split::conv2d(self, desc),
        }
    }
}

/// The window of a convolution as words 1..=17 of `conv_backward.wgsl`, or `None` when a number the
/// kernels form (a padded coordinate, a window's reach) does not fit in 32 bits.
fn window_words(
    input_shape: [usize; 4],
    weight_shape: [usize; 4],
    output_shape: [usize; 4],
    window: ([usize; 2], [usize; 2], [usize; 2], usize),
) -> Option<Vec<u32>> {
    let (stride, padding, dilation, groups) = window;
    let [n, c, h, w] = input_shape;
    let [k, cg, r, s] = weight_shape;
    let [_, _, oh, ow] = output_shape;
    // The largest coordinate either kernel forms along an axis: (out − 1)·stride + taps·dilation
    // + pad, or input + pad.
    let reach = |out: usize, st: usize, taps: usize, dil: usize, pad: usize, input: usize| {
        out.checked_mul(st)?
            .checked_add(taps.checked_mul(dil)?)?
            .checked_add(pad)?
            .max(input.checked_add(pad)?)
            .checked_add(st)
    };
    reach(oh, stride[0], r, dilation[0], padding[0], h).filter(|&v| u32::try_from(v).is_ok())?;
    reach(ow, stride[1], s, dilation[1], padding[1], w).filter(|&v| u32::try_from(v).is_ok())?;
    super::pool::words(&[
        n,
        c,
        h,
        w,
        k,
        cg,
        r,
        s,
        oh,
        ow,
        stride[0],
        stride[1],
        padding[0],
        padding[1],
        dilation[0],
        dilation[1],
        k / groups,
    ])
}

/// The error for a gradient whose launch cannot fit the loop budget even in its smallest block.
fn past_budget(op: &'static str, what: String) -> BackendError {
    BackendError::FeatureUnavailable {
        feature: "WebGPU loop budget",
        reason: format!("{op}: {what} need more loop passes than one launch may run"),
    }
}

/// The input gradient (or transposed convolution) in f32, or f16 (f32 math) where the device has
/// `SHADER_F16`, in blocks of the group's output channels that fit the loop budget.
pub(crate) fn conv2d_backward_input(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &Conv2dBackwardInputDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, CONV_BACKWARD, CONV_BACKWARD_F16) else {
        return Ok(Launch::Stage);
    };
    let inputs: usize = d.grad_input_shape.iter().product();
    if inputs == 0 {
        return Ok(Launch::Done);
    }
    let [c] = [d.grad_input_shape[1]];
    let mut operands = vec![
        (d.grad_output, d.grad_output_shape.iter().product()),
        (d.weight, d.weight_shape.iter().product()),
        (d.grad_input, inputs),
    ];
    operands.extend(d.bias.map(|b| (b, c)));
    let Some((buffers, offsets)) = mem.elements_u32_each(&operands, size)? else {
        return Ok(Launch::Stage);
    };
    let window = (d.stride, d.padding, d.dilation, d.groups);
    let (Some(geometry), Some(count)) = (
        window_words(
            d.grad_input_shape,
            d.weight_shape,
            d.grad_output_shape,
            window,
        ),
        super::pool::words(&[inputs]),
    ) else {
        return Ok(Launch::Stage);
    };
    let [_, _, r, s] = d.weight_shape;
    let kg = d.weight_shape[0] / d.groups;
    let step = loops::longest(kg.max(1), gpu.loop_limit, |m| {
        loops::conv2d_backward_input(m, r, s)
    })
    .ok_or_else(|| {
        past_budget(
            "conv2d_backward_input",
            format!("the {r}×{s} taps of one output channel"),
        )
    })?;
    let groups = grid_1d(inputs, gpu.limits.max_compute_workgroups_per_dimension)?;
    let bias = d.bias.map_or((buffers[0], 0), |_| (buffers[3], offsets[3]));
    let mut k0 = 0;
    loop {
        let k1 = kg.min(k0 + step);
        let mut p = count.clone();
        p.extend_from_slice(&geometry);
        p.extend_from_slice(&[
            offsets[0],
            offsets[1],
            k0 as u32,
            k1 as u32,
            u32::from(k0 > 0),
            u32::from(d.bias.is_some()),
            bias.1,
            offsets[2],
        ]);
        kernels.dispatch(
            gpu,
            Dispatch {
                module,
                entry: "conv2d_backward_input",
                constants: &[],
                buffers: &[buffers[0], buffers[1], bias.0, buffers[2]],
                params: &p,
                groups,
                loops: loops::conv2d_backward_input(k1 - k0, r, s),
            },
        )?;
        k0 = k1;
        if k0 >= kg {
            return Ok(Launch::Done);
        }
    }
}

/// The weight gradient in f32, or f16 (f32 math) where the device has `SHADER_F16`, in blocks of
/// images that fit the loop budget.
pub(crate) fn conv2d_backward_weight(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &Conv2dBackwardWeightDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, CONV_BACKWARD, CONV_BACKWARD_F16) else {
        return Ok(Launch::Stage);
    };
    let weights: usize = d.weight_shape.iter().product();
    if weights == 0 {
        return Ok(Launch::Done);
    }
    let operands = [
        (d.input, d.input_shape.iter().product()),
        (d.grad_output, d.grad_output_shape.iter().product()),
        (d.grad_weight, weights),
    ];
    let Some((buffers, offsets)) = mem.elements_u32_each(&operands, size)? else {
        return Ok(Launch::Stage);
    };
    let window = (d.stride, d.padding, d.dilation, d.groups);
    let (Some(geometry), Some(count)) = (
        window_words(d.input_shape, d.weight_shape, d.grad_output_shape, window),
        super::pool::words(&[weights]),
    ) else {
        return Ok(Launch::Stage);
    };
    let [n, _, oh, ow] = d.grad_output_shape;
    let positions = oh * ow;
    let step = loops::longest(n.max(1), gpu.loop_limit, |images| {
        loops::conv2d_backward_weight(images.saturating_mul(positions))
    })
    .ok_or_else(|| {
        past_budget(
            "conv2d_backward_weight",
            format!("the {oh}×{ow} output positions of one image"),
        )
    })?;
    let limit = gpu.limits.max_compute_workgroups_per_dimension;
    let Some(groups) = grid_rows(weights, limit) else {
        return Ok(Launch::Stage);
    };
    let mut n0 = 0;
    loop {
        let n1 = n.min(n0 + step);
        let mut p = count.clone();
        p.extend_from_slice(&geometry);
        p.extend_from_slice(&[
            offsets[0],
            offsets[1],
            n0 as u32,
            n1 as u32,
            u32::from(n0 > 0),
            0,
            0,
            offsets[2],
        ]);
        kernels.dispatch(
            gpu,
            Dispatch {
                module,
                entry: "conv2d_backward_weight",
                constants: &[],
                buffers: &[buffers[0], buffers[1], buffers[0], buffers[2]],
                params: &p,
                groups,
                loops: loops::conv2d_backward_weight((n1 - n0) * positions),
            },
        )?;
        n0 = n1;
        if n0 >= n {
            return Ok(Launch::Done);
        }
    }
}

/// `FeatureUnavailable` for a gradient whose single image does not fit a storage binding.
fn image_too_large(op: &'static str) -> BackendError {
    BackendError::FeatureUnavailable {
        feature: "WebGPU storage binding",
        reason: format!(
            "{op}: one image's operands are larger than one storage binding, below which the \
             convolution gradients do not cut"
        ),
    }
}

impl OpImpl<Conv2dBackwardInputDesc> for WebGpuBackend {
    fn op(&self, desc: &Conv2dBackwardInputDesc) -> Result<()> {
        const OP: &str = "conv2d_backward_input";
        math_dtype(OP, desc.dtype, desc)?;
        let run = |d: &Conv2dBackwardInputDesc| self.run(d, conv2d_backward_input);
        // Each launch keeps within the loop budget by itself (blocks of output channels).
        match self.plan(desc, desc.dtype, pieces::conv2d_backward_input, None)? {
            Plan::Whole | Plan::PastBudget => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            Plan::TooLarge => Err(image_too_large(OP)),
        }
    }
}

impl OpImpl<Conv2dBackwardWeightDesc> for WebGpuBackend {
    fn op(&self, desc: &Conv2dBackwardWeightDesc) -> Result<()> {
        const OP: &str = "conv2d_backward_weight";
        math_dtype(OP, desc.dtype, desc)?;
        match self.plan(desc, desc.dtype, pieces::conv2d_backward_weight, None)? {
            Plan::Whole | Plan::PastBudget => self.run(desc, conv2d_backward_weight),
            Plan::Pieces(parts) => self.conv2d_backward_weight_by_images(desc, &parts),
            Plan::TooLarge => Err(image_too_large(OP)),
        }
    }
}

impl WebGpuBackend {
    /// `desc`, larger than a binding, as `parts` (pieces of its images): the first writes the
    /// weight gradient, each later one writes its own into scratch, added into it in piece order.
    fn conv2d_backward_weight_by_images(
        &self,
        desc: &Conv2dBackwardWeightDesc,
        parts: &[Conv2dBackwardWeightDesc],
    ) -> Result<()> {
        let temps = Temporaries::new(self);
        let weights: usize = desc.weight_shape.iter().product();
        let scratch = temps.alloc(weights * desc.dtype.size_in_bytes())?;
        for (k, part) in parts.iter().enumerate() {
            if k == 0 {
                self.run(part, conv2d_backward_weight)?;
                continue;
            }
            let piece = Conv2dBackwardWeightDesc {
                grad_weight: scratch,
                ..part.clone()
            };
            self.run(&piece, conv2d_backward_weight)?;
            self.binary(&BinaryDesc {
                op: BinaryOp::Add,
                dtype: desc.dtype,
                lhs: StridedBuf::contiguous(desc.grad_weight, &[weights]),
                rhs: Value::Tensor(StridedBuf::contiguous(scratch, &[weights])),
                output: desc.grad_weight,
            })?;
        }
        Ok(())
    }
}
