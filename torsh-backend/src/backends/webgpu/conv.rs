//! Host side of `shaders/conv.wgsl`: f32 conv2d (and f16 with f32 accumulation where the device has
//! `SHADER_F16`) (NCHW, any stride, padding, dilation and groups,
//! optional bias) as an implicit GEMM per group, its (group, pixel tile) pairs folded over two grid
//! dimensions. Other dtypes, misaligned operands, grids beyond two dimensions of pairs and sizes
//! whose indices do not fit the kernel's 32-bit words answer [`Launch::Stage`].

use crate::compute::Conv2dDesc;
use crate::error::Result;

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{conv_split, pieces, Loops, Plan};
use super::loops;
use super::math_dtype;
use super::memory::Memory;
use super::pipelines::{for_dtype, grid_rows, Dispatch, Kernels, CONV, CONV_F16};
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
