//! Host side of `shaders/random.wgsl`: uniform and normal fills from the crate's counter-based stream,
//! and of `shaders/dropout.wgsl`, dropout by the same streams.
//! The stream's key `mix64(seed ^ GOLDEN)` is computed here once; every element's 64 bits are then the
//! reference's, and the values are formed in f32 (see the shader) and stored as f32 or f16.

use crate::compute::{Distribution, DropoutDesc, RandomDesc};
use crate::error::{BackendError, Result};
use crate::rng::{mix64, stream_key, GOLDEN};

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{pieces, Plan};
use super::math_dtype;
use super::memory::Memory;
use super::pipelines::{
    for_dtype, grid_1d, Dispatch, Kernels, DROPOUT, DROPOUT_F16, RANDOM, RANDOM_F16,
};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;

/// A random fill of f32, or (with `SHADER_F16`) of f16 rounded once from the f32 values; `Stage` for
/// other dtypes, a misaligned output or more than 2^32 elements.
pub(crate) fn random(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &RandomDesc) -> Result<Launch> {
    random_from(gpu, kernels, mem, d, 0)
}

/// [`random`] for the piece of a fill that starts at element `first` of the stream (`large/pieces.rs`):
/// its elements are the stream's `first`, `first + 1`, ..., as if the whole fill ran at once.
pub(crate) fn random_from(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &RandomDesc,
    first: u64,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, RANDOM, RANDOM_F16) else {
        return Ok(Launch::Stage);
    };
    let Some((buffer, offset)) = mem.elements_u32(d.ptr, d.len, size)? else {
        return Ok(Launch::Stage);
    };
    let Ok(n) = u32::try_from(d.len) else {
        return Ok(Launch::Stage);
    };
    let (normal, a, b) = match d.distribution {
        Distribution::Uniform { low, high } => (false, low, high - low),
        Distribution::Normal { mean, std } => (true, mean, std),
    };
    // Element i of the stream draws from index i (uniform) or 2i and 2i + 1 (normal), and index j's
    // bits are mix64(key + j·GOLDEN): starting `first` elements in is starting from a key advanced
    // by that many indices.
    let per_element = if normal { 2 } else { 1 };
    let skipped = first.wrapping_mul(per_element).wrapping_mul(GOLDEN);
    let key = mix64(d.seed ^ GOLDEN).wrapping_add(skipped);
    let params = [
        n,
        offset,
        key as u32,
        (key >> 32) as u32,
        (a as f32).to_bits(),
        (b as f32).to_bits(),
    ];
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry: "random",
            constants: &[("NORMAL", u64::from(normal))],
            buffers: &[buffer],
            params: &params,
            groups: grid_1d(d.len, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops: super::loops::RANDOM,
        },
    )?;
    Ok(Launch::Done)
}

/// Dropout of f32, or (with `SHADER_F16`) f16, elements by the counter-based mask, the threshold
/// compared as integers; `Stage` for other dtypes or misaligned operands, `FeatureUnavailable` for
/// operands past 32-bit element offsets or one storage binding.
pub(crate) fn dropout(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &DropoutDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, DROPOUT, DROPOUT_F16) else {
        return Ok(Launch::Stage);
    };
    let beyond = || BackendError::FeatureUnavailable {
        feature: "WebGPU dropout",
        reason: format!(
            "{} elements past 32-bit element offsets: the kernel indexes at most 2^32",
            d.len
        ),
    };
    let n = u32::try_from(d.len).map_err(|_| beyond())?;
    // A misaligned operand is staged (into aligned f32 copies); one past 32-bit offsets is not.
    let (Some((input, x_first)), Some((output, y_first))) =
        (mem.elements(d.input, size)?, mem.elements(d.output, size)?)
    else {
        return Ok(Launch::Stage);
    };
    let reach = |first: usize| {
        let end = first.checked_add(d.len).ok_or_else(beyond)?;
        u32::try_from(end).map_err(|_| beyond())?;
        Ok::<u32, BackendError>(first as u32)
    };
    let (x_offset, y_offset) = (reach(x_first)?, reach(y_first)?);
    let key = stream_key(d.seed);
    let threshold = d.threshold();
    let params = [
        n,
        y_offset,
        key as u32,
        (key >> 32) as u32,
        x_offset,
        threshold as u32,
        (threshold >> 32) as u32,
        (d.scale() as f32).to_bits(),
    ];
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry: "dropout",
            constants: &[],
            buffers: &[input, output],
            params: &params,
            groups: grid_1d(d.len, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops: super::loops::DROPOUT,
        },
    )?;
    Ok(Launch::Done)
}

impl OpImpl<DropoutDesc> for WebGpuBackend {
    fn op(&self, desc: &DropoutDesc) -> Result<()> {
        math_dtype("dropout", desc.dtype, desc)?;
        self.run(desc, dropout)
    }
}

impl OpImpl<RandomDesc> for WebGpuBackend {
    fn op(&self, desc: &RandomDesc) -> Result<()> {
        math_dtype("random", desc.dtype, desc)?;
        match self.plan(desc, desc.dtype, pieces::random, None)? {
            // Each piece starts at its place in the stream.
            Plan::Pieces(parts) => parts.iter().try_for_each(|(first, d)| {
                self.run(d, |gpu, k, mem, d| random_from(gpu, k, mem, d, *first))
            }),
            _ => self.run(desc, random),
        }
    }
}
