//! Softmax and log-softmax, layer norm and batch norm. Softmax and layer norm run on the row
//! kernels of `shaders/rows.wgsl` (one workgroup per row, as reductions do: `reduce.rs`), batch norm
//! on `shaders/batch_norm.wgsl` (workgroups over chunks of each channel, or one per channel); in
//! f32, and in f16 where the device has `SHADER_F16` (f32 math, one rounding per stored value).
//! Other dtypes, misaligned operands and sizes beyond the kernels' 32-bit words answer
//! [`Launch::Stage`].

use crate::compute::{BatchNormDesc, DevicePtr, LayerNormDesc, SoftmaxDesc};
use crate::error::Result;

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{composed, pieces, two_pass, Loops, Plan};
use super::loops;
use super::math_dtype;
use super::memory::{Binding, Memory};
use super::pipelines::{
    combining, for_dtype, grid_1d, grid_rows, Dispatch, Kernels, BATCH_NORM, BATCH_NORM_F16,
    BATCH_NORM_F16_SUBGROUP, BATCH_NORM_SUBGROUP,
};
use super::pool::words;
use super::reduce::{launch, module, word};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;

/// Softmax or log-softmax of `[outer, axis_len, inner]` along the middle dim.
pub(crate) fn softmax(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &SoftmaxDesc,
) -> Result<Launch> {
    let Some((module, size)) = module(gpu, d.dtype) else {
        return Ok(Launch::Stage);
    };
    let (Some((input, in_off)), Some((output, out_off))) =
        (mem.elements(d.input, size)?, mem.elements(d.output, size)?)
    else {
        return Ok(Launch::Stage);
    };
    let n = d.outer * d.axis_len * d.inner;
    let rows = d.outer * d.inner;
    let fits = [n + in_off, n + out_off, d.axis_len, d.inner, rows]
        .iter()
        .all(|&v| word(v).is_some());
    if !fits {
        return Ok(Launch::Stage);
    }
    let mut p = vec![0u32; 8];
    p[0] = rows as u32;
    p[1] = d.axis_len as u32;
    p[4] = out_off as u32;
    p[5] = in_off as u32;
    p[6] = d.inner.max(1) as u32;
    p[7] = u32::from(d.log);
    launch(
        gpu,
        kernels,
        (
            module,
            "softmax",
            loops::softmax(gpu.row_threads, d.axis_len),
        ),
        rows,
        [input, input, input, output],
        &p,
    )
}

/// Layer norm over the last `cols` elements of each of `rows` rows.
pub(crate) fn layer_norm(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &LayerNormDesc,
) -> Result<Launch> {
    let Some((module, size)) = module(gpu, d.dtype) else {
        return Ok(Launch::Stage);
    };
    let (Some((input, in_off)), Some((output, out_off))) =
        (mem.elements(d.input, size)?, mem.elements(d.output, size)?)
    else {
        return Ok(Launch::Stage);
    };
    let optional = |ptr: Option<DevicePtr>| -> Result<Option<Option<(Binding<'_>, usize)>>> {
        match ptr {
            None => Ok(Some(None)),
            Some(p) => Ok(mem.elements(p, size)?.map(Some)),
        }
    };
    let (Some(weight), Some(bias)) = (optional(d.weight)?, optional(d.bias)?) else {
        return Ok(Launch::Stage);
    };
    let n = d.rows * d.cols;
    let fits = [n + in_off, n + out_off, d.rows, d.cols]
        .iter()
        .chain(weight.iter().map(|w| &w.1))
        .chain(bias.iter().map(|b| &b.1))
        .all(|&v| word(v + d.cols).is_some());
    if !fits {
        return Ok(Launch::Stage);
    }
    let mut p = vec![0u32; 11];
    p[0] = d.rows as u32;
    p[1] = d.cols as u32;
    p[4] = out_off as u32;
    p[5] = in_off as u32;
    p[6] = (d.eps as f32).to_bits();
    p[7] = u32::from(weight.is_some());
    p[8] = u32::from(bias.is_some());
    p[9] = weight.map_or(0, |w| w.1 as u32);
    p[10] = bias.map_or(0, |b| b.1 as u32);
    let (w, b) = (weight.map_or(input, |w| w.0), bias.map_or(input, |b| b.0));
    launch(
        gpu,
        kernels,
        (
            module,
            "layer_norm",
            loops::layer_norm(gpu.row_threads, d.cols),
        ),
        d.rows,
        [input, w, b, output],
        &p,
    )
}

/// Elements of a channel per workgroup of `wg` threads (a chunk), for channels of
/// `per_channel` elements and grids of at most `limit` workgroups per dimension: with a GPU's wide
/// workgroups (32 threads or more), chunks of 16 elements per thread, so that a tensor of few
/// channels still fills the device (in training too, then in three launches); with a CPU implementation's workgroup of one SIMD group
/// ([`super::context::row_threads_for`]), the whole channel, which measured fastest on lavapipe (a
/// 70 MiB tensor of 16 channels: 23 ms, against 51–81 ms in chunks of 16 to 20 000 elements per
/// thread). Never so small that the chunks exceed `limit`, and never so long that a launch runs
/// more than `budget` loop passes an invocation (`loops.rs`): a chunk's moments or normalisation,
/// and in `training` a whole channel in one launch (else it is two chunks at least, so three
/// launches).
fn chunk_len(per_channel: usize, wg: usize, limit: usize, budget: u64, training: bool) -> usize {
    let wg32 = wg as u32;
    let chunk = if wg >= 32 { wg * 16 } else { per_channel };
    let mut chunk = chunk.max(per_channel.div_ceil(limit.max(1))).max(1);
    let most = loops::longest(per_channel, budget, |c| loops::batch_norm_moments(wg32, c));
    if let Some(most) = most.filter(|&most| most < per_channel) {
        chunk = chunk.min(most);
    }
    let whole = loops::batch_norm_training(wg32, per_channel);
    if training && chunk >= per_channel && per_channel > 1 && whole > budget {
        chunk = per_channel.div_ceil(2);
    }
    chunk
}

/// Batch normalisation, training or inference, in f32, or f16 (f32 math) where the device has
/// `SHADER_F16`.
pub(crate) fn batch_norm(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &BatchNormDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(
        gpu,
        d.dtype,
        combining(gpu, BATCH_NORM, BATCH_NORM_SUBGROUP),
        combining(gpu, BATCH_NORM_F16, BATCH_NORM_F16_SUBGROUP),
    ) else {
        return Ok(Launch::Stage);
    };
    let n = d.batch * d.channels * d.spatial;
    if n == 0 {
        return Ok(Launch::Stage);
    }
    let (Some(x), Some(out)) = (
        mem.elements_u32(d.input, n, size)?,
        mem.elements_u32(d.output, n, size)?,
    ) else {
        return Ok(Launch::Stage);
    };
    let optional = |ptr: Option<DevicePtr>| -> Result<Option<Option<(Binding<'_>, u32)>>> {
        match ptr {
            None => Ok(Some(None)),
            Some(p) => Ok(mem.elements_u32(p, d.channels, size)?.map(Some)),
        }
    };
    let (Some(weight), Some(bias), Some(mean), Some(var)) = (
        optional(d.weight)?,
        optional(d.bias)?,
        optional(d.running_mean)?,
        optional(d.running_var)?,
    ) else {
        return Ok(Launch::Stage);
    };
    // Chunks of each channel ([`chunk_len`]): several (a GPU) run training in three launches and
    // inference over a grid of chunks; one (a CPU implementation, or a small channel) runs training
    // in one launch of a workgroup per channel.
    let limit = gpu.limits.max_compute_workgroups_per_dimension.max(1) as usize;
    let per_channel = d.batch * d.spatial;
    let chunk = chunk_len(
        per_channel,
        gpu.row_threads as usize,
        limit,
        gpu.loop_limit,
        d.training,
    );
    let chunks = per_channel.div_ceil(chunk);
    let Some((cy, cz, _)) = grid_rows(d.channels, limit as u32) else {
        return Ok(Launch::Stage);
    };
    // Per (chunk, channel): grid_rows gives the channels as (x ≤ limit, rows of x), here y and z.
    let chunked = (chunks as u32, cy, cz);
    // The chunks' moments and the batch's statistics, f32 (see `shaders/batch_norm.wgsl`).
    let partial_bytes = 4 * (2 * d.channels * chunks + 2 * d.channels) as u64;
    let three_launches = d.training && chunks > 1 && partial_bytes <= mem.binding_limit().bytes;
    let offset = |o: Option<(Binding<'_>, u32)>| o.map_or(0, |o| o.1 as usize);
    let Some(mut p) = words(&[
        d.batch,
        d.channels,
        d.spatial,
        usize::from(d.training),
        usize::from(weight.is_some()),
        usize::from(bias.is_some()),
        usize::from(mean.is_some() && var.is_some()),
        0,
        0,
        x.1 as usize,
        out.1 as usize,
        offset(weight),
        offset(bias),
        offset(mean),
        offset(var),
        chunk,
        chunks,
        usize::from(three_launches),
    ]) else {
        return Ok(Launch::Stage);
    };
    p[7] = (d.momentum as f32).to_bits();
    p[8] = (d.eps as f32).to_bits();
    let input = x.0;
    let [w_buf, b_buf, mean_buf, var_buf] =
        [weight, bias, mean, var].map(|o| o.map_or(input, |o| o.0));
    // Dropped once encoded: wgpu keeps it alive until the launches that use it have run.
    let scratch = three_launches.then(|| {
        gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("batch_norm partial statistics"),
            size: partial_bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    });
    let partials = scratch.as_ref().map_or(input, Binding::whole);
    let buffers = [input, out.0, w_buf, b_buf, mean_buf, var_buf, partials];
    let wg = [("WG", u64::from(gpu.row_threads))];
    let threads = gpu.row_threads;
    let infer = (
        "batch_norm_infer",
        chunked,
        loops::batch_norm_infer(threads, chunk),
    );
    let launches: &[(&str, (u32, u32, u32), u64)] = if three_launches {
        &[
            (
                "batch_norm_moments",
                chunked,
                loops::batch_norm_moments(threads, chunk),
            ),
            (
                "batch_norm_stats",
                grid_1d(d.channels, limit as u32)?,
                loops::batch_norm_stats(chunks),
            ),
            infer,
        ]
    } else if d.training {
        let Some(groups) = grid_rows(d.channels, limit as u32) else {
            return Ok(Launch::Stage);
        };
        let one = loops::batch_norm_training(threads, per_channel);
        &[("batch_norm", groups, one)]
    } else {
        &[infer]
    };
    for &(entry, groups, loops) in launches {
        kernels.dispatch(
            gpu,
            Dispatch {
                module,
                entry,
                constants: &wg,
                buffers: &buffers,
                params: &p,
                groups,
                loops,
            },
        )?;
    }
    Ok(Launch::Done)
}

impl OpImpl<SoftmaxDesc> for WebGpuBackend {
    fn op(&self, desc: &SoftmaxDesc) -> Result<()> {
        math_dtype("softmax", desc.dtype, desc)?;
        let loops = Loops {
            elements: [desc.outer, desc.axis_len, desc.inner]
                .iter()
                .fold(1usize, |a, &b| a.saturating_mul(b)),
            passes: &|gpu| loops::softmax(gpu.row_threads, desc.axis_len),
        };
        let run = |d: &SoftmaxDesc| self.run(d, softmax);
        match self.plan(desc, desc.dtype, pieces::softmax, Some(loops))? {
            Plan::Whole => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // One outer slice larger than a binding, or rows longer than a launch takes within
            // the loop budget: composed of reductions and elementwise ops.
            Plan::TooLarge | Plan::PastBudget => composed::softmax(self, desc),
        }
    }
}

impl OpImpl<LayerNormDesc> for WebGpuBackend {
    fn op(&self, desc: &LayerNormDesc) -> Result<()> {
        math_dtype("layer_norm", desc.dtype, desc)?;
        let loops = Loops {
            elements: desc.rows.saturating_mul(desc.cols),
            passes: &|gpu| loops::layer_norm(gpu.row_threads, desc.cols),
        };
        let run = |d: &LayerNormDesc| self.run(d, layer_norm);
        match self.plan(desc, desc.dtype, pieces::layer_norm, Some(loops))? {
            Plan::Whole => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // One row larger than a binding, or longer than a launch takes within the loop
            // budget: composed of reductions and elementwise ops.
            Plan::TooLarge | Plan::PastBudget => composed::layer_norm(self, desc),
        }
    }
}

impl OpImpl<BatchNormDesc> for WebGpuBackend {
    fn op(&self, desc: &BatchNormDesc) -> Result<()> {
        math_dtype("batch_norm", desc.dtype, desc)?;
        let run = |d: &BatchNormDesc| self.run(d, batch_norm);
        match self.plan(desc, desc.dtype, pieces::batch_norm, None)? {
            Plan::Whole | Plan::PastBudget => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // In training, statistics over every image: two passes over blocks.
            Plan::TooLarge if desc.training => two_pass::batch_norm(self, desc),
            // In inference, one image larger than a binding: by channels, and positions.
            Plan::TooLarge => composed::batch_norm_inference(self, desc),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{chunk_len, loops};

    #[test]
    fn chunks_fill_a_gpu_and_keep_a_cpu_implementation_to_one_per_channel() {
        let chunk = |per_channel, wg| chunk_len(per_channel, wg, 65_535, 64_000, false);
        // A GPU's 256 threads: 4096 elements a chunk, and chunks never more than the grid holds.
        assert_eq!(chunk(1_000_000, 256), 4096);
        assert_eq!(chunk(10, 256), 4096);
        assert_eq!(chunk(1 << 30, 256), (1usize << 30).div_ceil(65_535));
        // A SIMD group per channel: the whole channel, up to the loop budget; never 0.
        assert_eq!(chunk(200_000, 8), 200_000);
        assert_eq!(chunk(0, 8), 1);
        let most = chunk(10_000_000, 8);
        assert!(most < 300_000 && loops::batch_norm_moments(8, most) <= 64_000);
        // Training a channel too long for one launch: two chunks at least.
        let training = chunk_len(200_000, 8, 65_535, 64_000, true);
        assert!(training < 200_000);
        assert!(loops::batch_norm_training(8, 200_000) > 64_000);
        assert_eq!(chunk_len(1000, 8, 65_535, 64_000, true), 1000);
    }
}
