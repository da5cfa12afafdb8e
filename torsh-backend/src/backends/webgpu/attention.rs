//! Host side of `shaders/attention.wgsl`: scaled dot-product attention in f32 (and f16 with f32 math
//! where the device has `SHADER_F16`) with an online softmax
//! over chunks of keys (causal chunks past the rows never visited). Head dims up to 128 run the tiled
//! kernel (16 query rows per workgroup sharing each staged key and value) where the device has the
//! workgroup memory for it; larger head dims, or grids too large for it, run the row kernel (one
//! workgroup per query row). Other dtypes, head dims above 1024, misaligned operands and offsets
//! beyond 32 bits answer [`Launch::Stage`].
//!
//! A launch may take a range of the keys only ([`attention_keys`]), writing each row's unnormalised
//! sums and its (maximum, denominator) pair for the host to combine (`large/attention_split.rs`): keys too
//! many for one launch within the loop budget (`loops.rs`).

use crate::compute::{AttentionDesc, DevicePtr};
use crate::error::Result;

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{pieces, Plan};
use super::loops;
use super::memory::Memory;
use super::pipelines::{for_dtype, grid_rows, Dispatch, Kernels, ATTENTION, ATTENTION_F16};
use super::{large, math_dtype};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::error::BackendError;

/// Largest head dim the row kernel's per-thread accumulators cover (128 threads × 8 dims).
const MAX_HEAD_DIM: usize = 1024;

/// Largest head dim of the tiled kernel (its tiles hold 32 vec4s per row).
const TILED_MAX_HEAD_DIM: usize = 128;

/// Query rows per workgroup of the tiled kernel.
const TILED_ROWS: usize = 16;

/// Workgroup memory of the tiled kernel: query, key and value tiles of 16 × 128 f32 and 16 × 16
/// scores.
const TILED_SHARED_BYTES: u32 = 3 * 16 * 128 * 4 + 16 * 16 * 4;

/// Whether `d` runs the tiled kernel on this device (else the row kernel).
fn tiled(gpu: &Gpu, d: &AttentionDesc) -> bool {
    let limit = gpu.limits.max_compute_workgroups_per_dimension as usize;
    d.head_dim <= TILED_MAX_HEAD_DIM
        && gpu.limits.max_compute_workgroup_storage_size >= TILED_SHARED_BYTES
        && d.seq_q.div_ceil(TILED_ROWS) <= limit
        && d.batch * d.heads <= limit
}

/// Loop passes an invocation of `d`'s kernel runs over `span` keys (`loops.rs`).
fn loops_over(gpu: &Gpu, d: &AttentionDesc, span: usize) -> u64 {
    if tiled(gpu, d) {
        loops::attention_tiled(d.head_dim, span)
    } else {
        loops::attention_rows(d.head_dim, span)
    }
}

/// The most keys one launch of `d` takes within the device's loop budget: all of them, or fewer
/// (`large/attention_split.rs` then runs ranges of them); `None` when not even one chunk of keys fits
/// (a head dim too wide for the budget). Head dims the kernels do not take at all have no limit
/// here (the launch answers them).
pub(crate) fn max_keys(gpu: &Gpu, d: &AttentionDesc) -> Option<usize> {
    if d.head_dim > MAX_HEAD_DIM || d.seq_kv == 0 {
        return Some(d.seq_kv);
    }
    loops::longest(d.seq_kv, gpu.loop_limit, |span| loops_over(gpu, d, span))
}

/// f32 attention.
pub(crate) fn attention(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &AttentionDesc,
) -> Result<Launch> {
    attention_keys(gpu, kernels, mem, d, (0, d.seq_kv), None)
}

/// Attention of `d` over keys `first..end` only: with `stats` (an f32 allocation of a (maximum,
/// denominator) pair per query row), each row's sums unnormalised into the output and its pair
/// into `stats`, for the host to combine with other ranges; without, the output of those keys.
pub(crate) fn attention_keys(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &AttentionDesc,
    (first, end): (usize, usize),
    stats: Option<DevicePtr>,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, ATTENTION, ATTENTION_F16) else {
        return Ok(Launch::Stage);
    };
    if d.head_dim > MAX_HEAD_DIM {
        return Ok(Launch::Stage);
    }
    let bh = d.batch * d.heads;
    let rows = bh * d.seq_q;
    if rows == 0 || d.head_dim == 0 {
        return Ok(Launch::Done);
    }
    let kv = bh * d.seq_kv * d.head_dim;
    let qo = rows * d.head_dim;
    let (Some(q), Some(k), Some(v), Some(o)) = (
        mem.elements_u32(d.q, qo, size)?,
        mem.elements_u32(d.k, kv, size)?,
        mem.elements_u32(d.v, kv, size)?,
        mem.elements_u32(d.o, qo, size)?,
    ) else {
        return Ok(Launch::Stage);
    };
    let stats = match stats {
        Some(ptr) => match mem.elements_u32(ptr, 2 * rows, 4)? {
            Some(found) => Some(found),
            None => return Ok(Launch::Stage),
        },
        None => None,
    };
    let (entry, groups) = if tiled(gpu, d) {
        let tiles = d.seq_q.div_ceil(TILED_ROWS);
        ("attention_tiled", (tiles as u32, bh as u32, 1))
    } else {
        let Some(groups) = grid_rows(rows, gpu.limits.max_compute_workgroups_per_dimension) else {
            return Ok(Launch::Stage);
        };
        ("attention", groups)
    };
    let words = [
        rows as u32,
        d.seq_q as u32,
        d.seq_kv as u32,
        d.head_dim as u32,
        (d.scale as f32).to_bits(),
        u32::from(d.causal),
        q.1,
        k.1,
        v.1,
        o.1,
        first as u32,
        end as u32,
        stats.map_or(0, |s| s.1),
        u32::from(stats.is_some()),
    ];
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry,
            constants: &[],
            buffers: &[q.0, k.0, v.0, o.0, stats.map_or(o.0, |s| s.0)],
            params: &words,
            groups,
            loops: loops_over(gpu, d, end - first),
        },
    )?;
    Ok(Launch::Done)
}

impl OpImpl<AttentionDesc> for WebGpuBackend {
    fn op(&self, desc: &AttentionDesc) -> Result<()> {
        math_dtype("attention", desc.dtype, desc)?;
        // More keys than a launch takes within the loop budget: by ranges of keys.
        let run = |d: &AttentionDesc| match max_keys(&self.state()?.device.gpu, d) {
            Some(span) if span >= d.seq_kv => self.run(d, attention),
            Some(span) => large::attention_split::attention(self, d, span),
            None => Err(BackendError::FeatureUnavailable {
                feature: "WebGPU loop budget",
                reason: format!(
                    "attention: one chunk of keys of head dim {} needs more loop passes than the \
                     budget of {}",
                    d.head_dim,
                    self.state()?.device.gpu.loop_limit
                ),
            }),
        };
        match self.plan(desc, desc.dtype, pieces::attention, None)? {
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // A single head larger than a binding: the launch's window check reports it.
            _ => run(desc),
        }
    }
}
