//! Softmax and log-softmax and their gradient, layer norm and batch norm. Softmax, its gradient
//! and layer norm run on the row
//! kernels of `shaders/rows.wgsl` (one workgroup per row, as reductions do: `reduce.rs`), batch norm
//! on `shaders/batch_norm.wgsl` (workgroups over chunks of each channel, or one per channel); in
//! f32, and in f16 where the device has `SHADER_F16` (f32 math, one rounding per stored value).
//! Other dtypes, misaligned operands and sizes beyond the kernels' 32-bit words answer
//! [`Launch::Stage`].

use crate::compute::{
    BatchNormBackwardDesc, BatchNormDesc, BinaryDesc, BinaryOp, DevicePtr, LayerNormBackwardDesc,
    LayerNormDesc, SoftmaxBackwardDesc, SoftmaxDesc, StridedBuf, Temporaries, Value,
};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{composed, pieces, two_pass, Loops, Plan};
use super::loops;
use super::math_dtype;
use super::memory::{Binding, Memory};
use super::pipelines::{
    combining, for_dtype, grid_1d, grid_rows, Dispatch, Kernels, Module, BATCH_NORM,
    BATCH_NORM_F16, BATCH_NORM_F16_SUBGROUP, BATCH_NORM_SUBGROUP, NORM_BACKWARD, NORM_BACKWARD_F16,
    NORM_BACKWARD_F16_SUBGROUP, NORM_BACKWARD_SUBGROUP,
};
use super::pool::words;
use super::reduce::{launch, module, word};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;

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
        [input, input, input, output, output],
        &p,
    )
}

/// The input gradient of softmax or log-softmax of `[outer, axis_len, inner]` along the middle
/// dim.
pub(crate) fn softmax_backward(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &SoftmaxBackwardDesc,
) -> Result<Launch> {
    let Some((module, size)) = module(gpu, d.dtype) else {
        return Ok(Launch::Stage);
    };
    let (Some((grad, g_off)), Some((y, y_off)), Some((output, out_off))) = (
        mem.elements(d.grad_output, size)?,
        mem.elements(d.output, size)?,
        mem.elements(d.grad_input, size)?,
    ) else {
        return Ok(Launch::Stage);
    };
    let n = d.outer * d.axis_len * d.inner;
    let rows = d.outer * d.inner;
    let fits = [n + g_off, n + y_off, n + out_off, d.axis_len, d.inner, rows]
        .iter()
        .all(|&v| word(v).is_some());
    if !fits {
        return Ok(Launch::Stage);
    }
    let mut p = vec![0u32; 9];
    p[0] = rows as u32;
    p[1] = d.axis_len as u32;
    p[4] = out_off as u32;
    p[5] = g_off as u32;
    p[6] = d.inner.max(1) as u32;
    p[7] = u32::from(d.log);
    p[8] = y_off as u32;
    launch(
        gpu,
        kernels,
        (
            module,
            "softmax_backward",
            loops::softmax_backward(gpu.row_threads, d.axis_len),
        ),
        rows,
        [grad, y, grad, output, output],
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
    let mut p = vec![0u32; 14];
    p[0] = d.rows as u32;
    p[1] = d.cols as u32;
    p[4] = out_off as u32;
    p[5] = in_off as u32;
    p[6] = (d.eps as f32).to_bits();
    p[7] = u32::from(weight.is_some());
    p[8] = u32::from(bias.is_some());
    p[9] = weight.map_or(0, |w| w.1 as u32);
    p[10] = bias.map_or(0, |b| b.1 as u32);
    let saved = d.saved_mean.zip(d.saved_invstd);
    if !saved_aligned(mem, saved, d.rows)? {
        return Ok(Launch::Stage);
    }
    let scratch = saved.map(|_| saved_scratch(gpu, 0, d.rows));
    if saved.is_some() {
        (p[11], p[12], p[13]) = (1, 0, d.rows as u32);
    }
    let (w, b) = (weight.map_or(input, |w| w.0), bias.map_or(input, |b| b.0));
    let stats = scratch.as_ref().map_or(output, Binding::whole);
    let launched = launch(
        gpu,
        kernels,
        (
            module,
            "layer_norm",
            loops::layer_norm(gpu.row_threads, d.cols),
        ),
        d.rows,
        [input, w, b, output, stats],
        &p,
    )?;
    if let (Launch::Done, Some(scratch), Some(saved)) = (&launched, &scratch, saved) {
        copy_saved(gpu, mem, scratch, 0, d.rows, saved)?;
    }
    Ok(launched)
}

/// A scratch buffer for a forward's saved statistics: `words` f32 words before them, then `len`
/// means and `len` inverse standard deviations, which [`copy_saved`] moves to their places.
fn saved_scratch(gpu: &Gpu, words: usize, len: usize) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("saved statistics"),
        size: (4 * (words + 2 * len)).max(4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

/// True unless the `len` saved statistics are misaligned for a copy into them (the op stages).
fn saved_aligned(mem: &Memory, saved: Option<(DevicePtr, DevicePtr)>, len: usize) -> Result<bool> {
    let Some((mean, invstd)) = saved else {
        return Ok(true);
    };
    Ok(mem.elements_u32(mean, len, 4)?.is_some() && mem.elements_u32(invstd, len, 4)?.is_some())
}

/// Copies the `len` means and inverse standard deviations at word `from` of `scratch` (as
/// [`saved_scratch`] lays them out) to the saved statistics' places, after the launches before.
fn copy_saved(
    gpu: &Gpu,
    mem: &Memory,
    scratch: &wgpu::Buffer,
    from: usize,
    len: usize,
    (mean, invstd): (DevicePtr, DevicePtr),
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let bytes = 4 * len as u64;
    let places = [mem.place(mean, 4 * len)?, mem.place(invstd, 4 * len)?];
    gpu.scoped("saving normalisation statistics", 0, || {
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        for (k, place) in places.iter().enumerate() {
            let src = 4 * from as u64 + k as u64 * bytes;
            encoder.copy_buffer_to_buffer(scratch, src, place.buffer, place.offset, bytes);
        }
        gpu.submit(encoder.finish());
    })
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
    // The chunks' moments and the batch's statistics, f32 (see `shaders/batch_norm.wgsl`), then
    // the statistics to save.
    let saved = d.saved_mean.zip(d.saved_invstd);
    if !saved_aligned(mem, saved, d.channels)? {
        return Ok(Launch::Stage);
    }
    let saved_at = 2 * d.channels * chunks + 2 * d.channels;
    let saved_len = if saved.is_some() { 2 * d.channels } else { 0 };
    let partial_bytes = 4 * (saved_at + saved_len) as u64;
    let three_launches = d.training && chunks > 1 && partial_bytes <= mem.binding_limit().bytes;
    if saved.is_some() && partial_bytes > mem.binding_limit().bytes {
        return Ok(Launch::Stage);
    }
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
        usize::from(saved.is_some()),
        saved_at,
        saved_at + d.channels,
    ]) else {
        return Ok(Launch::Stage);
    };
    p[7] = (d.momentum as f32).to_bits();
    p[8] = (d.eps as f32).to_bits();
    let input = x.0;
    let [w_buf, b_buf, mean_buf, var_buf] =
        [weight, bias, mean, var].map(|o| o.map_or(input, |o| o.0));
    // Dropped once encoded: wgpu keeps it alive until the launches that use it have run.
    let scratch =
        (three_launches || saved.is_some()).then(|| saved_scratch(gpu, saved_at, saved_len / 2));
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
    if let (Some(scratch), Some(saved)) = (&scratch, saved) {
        copy_saved(gpu, mem, scratch, saved_at, d.channels, saved)?;
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

impl OpImpl<SoftmaxBackwardDesc> for WebGpuBackend {
    fn op(&self, desc: &SoftmaxBackwardDesc) -> Result<()> {
        math_dtype(desc.name(), desc.dtype, desc)?;
        let loops = Loops {
            elements: [desc.outer, desc.axis_len, desc.inner]
                .iter()
                .fold(1usize, |a, &b| a.saturating_mul(b)),
            passes: &|gpu| loops::softmax_backward(gpu.row_threads, desc.axis_len),
        };
        let run = |d: &SoftmaxBackwardDesc| self.run(d, softmax_backward);
        match self.plan(desc, desc.dtype, pieces::softmax_backward, Some(loops))? {
            Plan::Whole => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // One outer slice larger than a binding, or rows longer than a launch takes within
            // the loop budget: composed of reductions and elementwise ops.
            Plan::TooLarge | Plan::PastBudget => composed::softmax_backward(self, desc),
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

/// The operands every norm-backward launch binds: output gradient, input, weight (the input
/// when absent), means, inverse deviations, with their element offsets.
struct GradOperands<'m> {
    dy: (Binding<'m>, u32),
    x: (Binding<'m>, u32),
    weight: Option<(Binding<'m>, u32)>,
    mean: (Binding<'m>, u32),
    invstd: (Binding<'m>, u32),
}

impl<'m> GradOperands<'m> {
    /// The operands of `len` elements, weight and statistics of `groups`; `None` where one is
    /// misaligned or past 32-bit words (the op stages).
    fn of(
        mem: &'m Memory,
        size: usize,
        (dy, x, len): (DevicePtr, DevicePtr, usize),
        weight: Option<DevicePtr>,
        weight_len: usize,
        (mean, invstd, groups): (DevicePtr, DevicePtr, usize),
    ) -> Result<Option<GradOperands<'m>>> {
        let weight = match weight {
            None => Some(None),
            Some(w) => mem.elements_u32(w, weight_len, size)?.map(Some),
        };
        Ok(
            match (
                mem.elements_u32(dy, len, size)?,
                mem.elements_u32(x, len, size)?,
                weight,
                mem.elements_u32(mean, groups, 4)?,
                mem.elements_u32(invstd, groups, 4)?,
            ) {
                (Some(dy), Some(x), Some(weight), Some(mean), Some(invstd)) => Some(GradOperands {
                    dy,
                    x,
                    weight,
                    mean,
                    invstd,
                }),
                _ => None,
            },
        )
    }

    /// The data bindings with `out` and `sums` (`norm_backward.wgsl`'s order).
    fn buffers(&self, out: Binding<'m>, sums: Binding<'m>) -> [Binding<'m>; 7] {
        let w = self.weight.map_or(self.x.0, |w| w.0);
        [
            self.dy.0,
            self.x.0,
            w,
            self.mean.0,
            self.invstd.0,
            out,
            sums,
        ]
    }
}

/// The module of `norm_backward.wgsl` for `dtype` and its element size; `None` where the device
/// has no kernel for it.
fn grad_module(gpu: &Gpu, dtype: DType) -> Option<(Module, usize)> {
    for_dtype(
        gpu,
        dtype,
        combining(gpu, NORM_BACKWARD, NORM_BACKWARD_SUBGROUP),
        combining(gpu, NORM_BACKWARD_F16, NORM_BACKWARD_F16_SUBGROUP),
    )
}

/// A scratch buffer of `words` f32 words for the weight and bias gradients' sums.
fn sums_scratch(gpu: &Gpu, words: usize) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("norm gradient sums"),
        size: (4 * words).max(4) as u64,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    })
}

/// Rounds `len` sums, `sums[from + 2 i]`, into each asked gradient `(ptr, from)`.
fn store_sums(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    (module, size): (Module, usize),
    ops: &GradOperands<'_>,
    (sums, len): (&wgpu::Buffer, usize),
    targets: [(Option<DevicePtr>, usize); 2],
) -> Result<Option<()>> {
    let limit = gpu.limits.max_compute_workgroups_per_dimension;
    for (ptr, from) in targets {
        let Some(ptr) = ptr else { continue };
        let Some((out, out_at)) = mem.elements_u32(ptr, len, size)? else {
            return Ok(None);
        };
        let Some(p) = words(&[len, from, 0, out_at as usize]) else {
            return Ok(None);
        };
        kernels.dispatch(
            gpu,
            Dispatch {
                module,
                entry: "norm_backward_store",
                constants: &[("WG", u64::from(gpu.row_threads))],
                buffers: &ops.buffers(out, Binding::whole(sums)),
                params: &p,
                groups: grid_1d(len, limit)?,
                loops: 0,
            },
        )?;
    }
    Ok(Some(()))
}

/// The gradients of layer norm: the input's by a workgroup a row, the weight's and bias's by an
/// invocation a column over launches of rows within the loop budget, summed in f32.
pub(crate) fn layer_norm_backward(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &LayerNormBackwardDesc,
) -> Result<Launch> {
    let Some((module, size)) = grad_module(gpu, d.dtype) else {
        return Ok(Launch::Stage);
    };
    let (rows, cols) = (d.rows, d.cols);
    let n = rows * cols;
    if n == 0 {
        // Empty sums: the reference's zeros, through staging.
        return Ok(Launch::Stage);
    }
    let Some(ops) = GradOperands::of(
        mem,
        size,
        (d.grad_output, d.input, n),
        d.weight,
        cols,
        (d.mean, d.invstd, rows),
    )?
    else {
        return Ok(Launch::Stage);
    };
    let limit = gpu.limits.max_compute_workgroups_per_dimension;
    let wg = [("WG", u64::from(gpu.row_threads))];
    let offset = |o: Option<(Binding<'_>, u32)>| o.map_or(0, |o| o.1 as usize);
    let mut words_of = [
        rows,
        cols,
        ops.dy.1 as usize,
        ops.x.1 as usize,
        usize::from(ops.weight.is_some()),
        offset(ops.weight),
        ops.mean.1 as usize,
        ops.invstd.1 as usize,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    let sums = sums_scratch(gpu, 2 * cols);
    if let Some(dx) = d.grad_input {
        let Some((out, out_at)) = mem.elements_u32(dx, n, size)? else {
            return Ok(Launch::Stage);
        };
        words_of[8] = out_at as usize;
        let (Some(p), Some(groups)) = (words(&words_of), grid_rows(rows, limit)) else {
            return Ok(Launch::Stage);
        };
        kernels.dispatch(
            gpu,
            Dispatch {
                module,
                entry: "layer_norm_backward_input",
                constants: &wg,
                buffers: &ops.buffers(out, Binding::whole(&sums)),
                params: &p,
                groups,
                loops: loops::layer_norm_backward_input(gpu.row_threads, cols),
            },
        )?;
    }
    if d.grad_weight.is_none() && d.grad_bias.is_none() {
        return Ok(Launch::Done);
    }
    // Rows a launch: as many as the loop budget lets one invocation walk.
    let most = loops::longest(rows, gpu.loop_limit, loops::layer_norm_backward_params).unwrap_or(1);
    let mut first = 0;
    while first < rows {
        let len = most.min(rows - first);
        (words_of[0], words_of[13], words_of[14]) = (len, first, usize::from(first > 0));
        let Some(p) = words(&words_of) else {
            return Ok(Launch::Stage);
        };
        kernels.dispatch(
            gpu,
            Dispatch {
                module,
                entry: "layer_norm_backward_params",
                constants: &wg,
                buffers: &ops.buffers(ops.dy.0, Binding::whole(&sums)),
                params: &p,
                groups: grid_1d(cols, limit)?,
                loops: loops::layer_norm_backward_params(len),
            },
        )?;
        first += len;
    }
    let targets = [(d.grad_weight, 0), (d.grad_bias, 1)];
    Ok(
        match store_sums(
            gpu,
            kernels,
            mem,
            (module, size),
            &ops,
            (&sums, cols),
            targets,
        )? {
            Some(()) => Launch::Done,
            None => Launch::Stage,
        },
    )
}

/// What one call of [`batch_norm_backward_part`] launches, and where the per-channel totals live.
#[derive(Clone, Copy)]
struct Role<'a> {
    /// A sums buffer shared by the pieces of a batch (`None`: a scratch of this call's own).
    shared: Option<&'a wgpu::Buffer>,
    /// Word offset of the totals in the sums buffer (`None`: right after this call's partials).
    totals_at: Option<usize>,
    /// The whole batch's values per channel, `M`.
    count: usize,
    /// Launch the chunk sums and add them into the totals (after the first piece: `add`).
    sums: bool,
    /// Add into the totals rather than overwrite them.
    add: bool,
    /// Round the totals into the asked weight and bias gradients.
    store: bool,
    /// Launch the input gradient from the totals.
    input: bool,
}

/// The chunk length and chunks per channel the batch-norm gradient kernels use over
/// `per_channel` values of a channel.
fn backward_chunks(gpu: &Gpu, per_channel: usize) -> (usize, usize) {
    let limit = gpu.limits.max_compute_workgroups_per_dimension.max(1) as usize;
    let threads = gpu.row_threads;
    let chunk = loops::longest(per_channel, gpu.loop_limit, |l| {
        loops::batch_norm_backward_sums(threads, l)
    })
    .unwrap_or(1)
    .min(chunk_len(
        per_channel,
        threads as usize,
        limit,
        gpu.loop_limit,
        false,
    ));
    (chunk, per_channel.div_ceil(chunk))
}

/// The gradients of batch norm in f32, or f16 (f32 math) where the device has `SHADER_F16`: the
/// per-channel sums by chunks, their totals, the input gradient, then the weight and bias
/// gradients rounded from the totals.
pub(crate) fn batch_norm_backward(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &BatchNormBackwardDesc,
) -> Result<Launch> {
    let role = Role {
        shared: None,
        totals_at: None,
        count: d.batch * d.spatial,
        sums: d.training || d.grad_weight.is_some() || d.grad_bias.is_some(),
        add: false,
        store: true,
        input: d.grad_input.is_some(),
    };
    batch_norm_backward_part(gpu, kernels, mem, d, role)
}

/// The launches of `role` for `d` (the whole batch, or a piece of its images).
fn batch_norm_backward_part(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &BatchNormBackwardDesc,
    role: Role<'_>,
) -> Result<Launch> {
    let Some((module, size)) = grad_module(gpu, d.dtype) else {
        return Ok(Launch::Stage);
    };
    let (n, c, s) = (d.batch, d.channels, d.spatial);
    let len = n * c * s;
    if len == 0 {
        return Ok(Launch::Stage);
    }
    let Some(ops) = GradOperands::of(
        mem,
        size,
        (d.grad_output, d.input, len),
        d.weight,
        c,
        (d.mean, d.invstd, c),
    )?
    else {
        return Ok(Launch::Stage);
    };
    let limit = gpu.limits.max_compute_workgroups_per_dimension.max(1) as usize;
    let threads = gpu.row_threads;
    let (chunk, chunks) = backward_chunks(gpu, n * s);
    let Some((cy, cz, _)) = grid_rows(c, limit as u32) else {
        return Ok(Launch::Stage);
    };
    let totals = role.totals_at.unwrap_or(2 * c * chunks);
    let sums_words = totals + 2 * c;
    if 4 * sums_words as u64 > mem.binding_limit().bytes {
        return Ok(Launch::Stage);
    }
    let own;
    let sums = match role.shared {
        Some(shared) => shared,
        None => {
            own = sums_scratch(gpu, sums_words);
            &own
        }
    };
    let offset = |o: Option<(Binding<'_>, u32)>| o.map_or(0, |o| o.1 as usize);
    let dx = match d.grad_input.filter(|_| role.input) {
        None => None,
        Some(p) => match mem.elements_u32(p, len, size)? {
            None => return Ok(Launch::Stage),
            some => some,
        },
    };
    let Some(p) = words(&[
        n,
        c,
        s,
        ops.dy.1 as usize,
        ops.x.1 as usize,
        usize::from(ops.weight.is_some()),
        offset(ops.weight),
        ops.mean.1 as usize,
        ops.invstd.1 as usize,
        offset(dx),
        chunk,
        chunks,
        usize::from(d.training),
        totals,
        usize::from(role.add),
        role.count,
    ]) else {
        return Ok(Launch::Stage);
    };
    let wg = [("WG", u64::from(threads))];
    let chunked = (chunks as u32, cy, cz);
    let out = dx.map_or(ops.dy.0, |o| o.0);
    let mut launches: Vec<(&str, (u32, u32, u32), u64)> = Vec::new();
    if role.sums {
        launches.push((
            "batch_norm_backward_sums",
            chunked,
            loops::batch_norm_backward_sums(threads, chunk),
        ));
        launches.push((
            "batch_norm_backward_params",
            grid_1d(c, limit as u32)?,
            loops::batch_norm_stats(chunks),
        ));
    }
    if dx.is_some() {
        launches.push((
            "batch_norm_backward_input",
            chunked,
            loops::batch_norm_infer(threads, chunk),
        ));
    }
    for (entry, groups, loops) in launches {
        kernels.dispatch(
            gpu,
            Dispatch {
                module,
                entry,
                constants: &wg,
                buffers: &ops.buffers(out, Binding::whole(sums)),
                params: &p,
                groups,
                loops,
            },
        )?;
    }
    if !role.store {
        return Ok(Launch::Done);
    }
    let targets = [(d.grad_weight, totals), (d.grad_bias, totals + 1)];
    Ok(
        match store_sums(gpu, kernels, mem, (module, size), &ops, (sums, c), targets)? {
            Some(()) => Launch::Done,
            None => Launch::Stage,
        },
    )
}

impl WebGpuBackend {
    /// The weight and bias gradients of a norm over no value: zero sums, filled (the kernels need
    /// values to walk).
    fn zero_param_grads(
        &self,
        dtype: DType,
        grads: [Option<DevicePtr>; 2],
        len: usize,
    ) -> Result<()> {
        for ptr in grads.into_iter().flatten() {
            self.fill(&crate::compute::FillDesc {
                dtype,
                ptr,
                len,
                value: 0.0,
            })?;
        }
        Ok(())
    }
}

impl OpImpl<LayerNormBackwardDesc> for WebGpuBackend {
    fn op(&self, desc: &LayerNormBackwardDesc) -> Result<()> {
        math_dtype("layer_norm_backward", desc.dtype, desc)?;
        if desc.rows == 0 {
            desc.accesses()?;
            return self.zero_param_grads(
                desc.dtype,
                [desc.grad_weight, desc.grad_bias],
                desc.cols,
            );
        }
        match self.plan(desc, desc.dtype, pieces::layer_norm_backward, None)? {
            Plan::Pieces(parts) => self.layer_norm_backward_by_rows(desc, &parts),
            // A row or the weight larger than a binding: the launch reports it.
            Plan::Whole | Plan::TooLarge | Plan::PastBudget => self.run(desc, layer_norm_backward),
        }
    }
}

impl WebGpuBackend {
    /// `desc`, larger than a binding, as `parts` (pieces of its rows): the first writes the weight
    /// and bias gradients, each later one writes its own into scratch, added into them.
    fn layer_norm_backward_by_rows(
        &self,
        desc: &LayerNormBackwardDesc,
        parts: &[LayerNormBackwardDesc],
    ) -> Result<()> {
        let temps = Temporaries::new(self);
        let bytes = desc.cols * desc.dtype.size_in_bytes();
        let scratch = |p: Option<DevicePtr>| p.map(|_| temps.alloc(bytes)).transpose();
        let (dw, db) = (scratch(desc.grad_weight)?, scratch(desc.grad_bias)?);
        for (k, part) in parts.iter().enumerate() {
            if k == 0 {
                self.run(part, layer_norm_backward)?;
                continue;
            }
            let piece = LayerNormBackwardDesc {
                grad_weight: dw,
                grad_bias: db,
                ..part.clone()
            };
            self.run(&piece, layer_norm_backward)?;
            for (total, this) in [(desc.grad_weight, dw), (desc.grad_bias, db)] {
                if let (Some(total), Some(this)) = (total, this) {
                    self.binary(&BinaryDesc {
                        op: BinaryOp::Add,
                        dtype: desc.dtype,
                        lhs: StridedBuf::contiguous(total, &[desc.cols]),
                        rhs: Value::Tensor(StridedBuf::contiguous(this, &[desc.cols])),
                        output: total,
                    })?;
                }
            }
        }
        Ok(())
    }
}

impl OpImpl<BatchNormBackwardDesc> for WebGpuBackend {
    fn op(&self, desc: &BatchNormBackwardDesc) -> Result<()> {
        math_dtype("batch_norm_backward", desc.dtype, desc)?;
        if desc.batch == 0 || desc.spatial == 0 {
            desc.accesses()?;
            let grads = [desc.grad_weight, desc.grad_bias];
            return self.zero_param_grads(desc.dtype, grads, desc.channels);
        }
        // Each launch keeps within the loop budget by itself (chunks of each channel).
        match self.plan(desc, desc.dtype, pieces::batch_norm_backward, None)? {
            Plan::Whole | Plan::PastBudget => self.run(desc, batch_norm_backward),
            Plan::Pieces(parts) => self.batch_norm_backward_by_images(desc, &parts),
            Plan::TooLarge => Err(BackendError::FeatureUnavailable {
                feature: "WebGPU storage binding",
                reason: "batch_norm_backward: one image's operands are larger than one storage \
                         binding, below which the batch-norm gradients do not cut"
                    .into(),
            }),
        }
    }
}

impl WebGpuBackend {
    /// `desc`, larger than a binding, as `parts` (pieces of its images) sharing one sums buffer:
    /// every piece adds its per-channel sums into the totals, the last rounds them into the weight
    /// and bias gradients, then every piece writes its input gradient from the batch's totals.
    fn batch_norm_backward_by_images(
        &self,
        desc: &BatchNormBackwardDesc,
        parts: &[BatchNormBackwardDesc],
    ) -> Result<()> {
        let gpu = &self.state()?.device.gpu;
        let c = desc.channels;
        // The totals after the largest piece's partials.
        let totals = parts
            .iter()
            .map(|p| 2 * c * backward_chunks(gpu, p.batch * p.spatial).1)
            .max()
            .unwrap_or(0);
        let shared = sums_scratch(gpu, totals + 2 * c);
        let base = Role {
            shared: Some(&shared),
            totals_at: Some(totals),
            count: desc.batch * desc.spatial,
            sums: false,
            add: false,
            store: false,
            input: false,
        };
        let run = |d: &BatchNormBackwardDesc, role: Role<'_>| {
            self.run(d, |gpu, kernels, mem, d| {
                batch_norm_backward_part(gpu, kernels, mem, d, role)
            })
        };
        if desc.training || desc.grad_weight.is_some() || desc.grad_bias.is_some() {
            let last = parts.len() - 1;
            for (k, part) in parts.iter().enumerate() {
                let role = Role {
                    sums: true,
                    add: k > 0,
                    store: k == last,
                    ..base
                };
                run(part, role)?;
            }
        }
        if desc.grad_input.is_some() {
            for part in parts {
                // Only the input gradient is written here (staging writes back what it is given).
                let piece = BatchNormBackwardDesc {
                    grad_weight: None,
                    grad_bias: None,
                    ..part.clone()
                };
                run(
                    &piece,
                    Role {
                        input: true,
                        ..base
                    },
                )?;
            }
        }
        Ok(())
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
