//! Host side of `shaders/attention.wgsl`: scaled dot-product attention in f32 (and f16 with f32 math
//! where the device has `SHADER_F16`) with an online softmax
//! over chunks of keys (causal chunks past the rows never visited). Head dims up to 128 run the tiled
//! kernel (16 query rows per workgroup sharing each staged key and value) where the device has the
//! workgroup memory for it; larger head dims, or grids too large for it, run the row kernel (one
//! workgroup per query row). Other dtypes, head dims above 1024, misaligned operands and offsets
//! beyond 32 bits answer [`Launch::Stage`].
//!
//! The gradients (`shaders/attention_backward.wgsl`) take three kinds of launch: D = dO · O per
//! query row next to the log-sum-exps (copied into a scratch buffer first), dQ a workgroup per
//! query row over ranges of keys, dK and dV a workgroup per key row over ranges of queries; each
//! range within the loop budget, later ranges adding to the outputs (16-bit outputs are rounded
//! once per range). Operands past one binding answer `FeatureUnavailable`.
//!
//! A launch may take a range of the keys only ([`attention_keys`]), writing each row's unnormalised
//! sums and its (maximum, denominator) pair for the host to combine (`large/attention_split.rs`): keys too
//! many for one launch within the loop budget (`loops.rs`).

use crate::compute::{AttentionBackwardDesc, AttentionDesc, ComputeBackend, DevicePtr};
use crate::dtype::DType;
use crate::error::Result;

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{pieces, Plan};
use super::loops;
use super::memory::Binding;
use super::memory::Memory;
use super::pipelines::{
    for_dtype, grid_1d, grid_rows, Dispatch, Kernels, ATTENTION, ATTENTION_BACKWARD,
    ATTENTION_BACKWARD_F16, ATTENTION_F16,
};
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

/// f32 attention, with its log-sum-exp rows where `d` asks for them.
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
/// into `stats`, for the host to combine with other ranges; without, the output of those keys
/// (and the log-sum-exp rows `d` asks for, which only a launch over all its keys may).
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
    let (stats, mode) = match (stats, d.lse) {
        (Some(ptr), _) => (mem.elements_u32(ptr, 2 * rows, 4)?, 1),
        (None, Some(lse)) => (mem.elements_u32(lse, rows, 4)?, 2),
        (None, None) => (None, 0),
    };
    if mode != 0 && stats.is_none() {
        return Ok(Launch::Stage);
    }
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
        mode,
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

/// The gradients of `d`: D beside the log-sum-exps, then dQ over ranges of keys and dK, dV over
/// ranges of queries, each within the loop budget.
pub(crate) fn attention_backward(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &AttentionBackwardDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, ATTENTION_BACKWARD, ATTENTION_BACKWARD_F16)
    else {
        return Ok(Launch::Stage);
    };
    let bh = d.batch * d.heads;
    let (rows, kv_rows, dim) = (bh * d.seq_q, bh * d.seq_kv, d.head_dim);
    if d.head_dim > MAX_HEAD_DIM {
        return Ok(Launch::Stage);
    }
    if rows == 0 || kv_rows == 0 || dim == 0 {
        return Ok(Launch::Done); // The host fills the key gradients of no query.
    }
    let (qo, kv) = (rows * dim, kv_rows * dim);
    let Some((buffers, at)) = mem.elements_u32_each(
        &[
            (d.grad_output, qo),
            (d.q, qo),
            (d.k, kv),
            (d.v, kv),
            (d.o, qo),
            (d.grad_q, qo),
            (d.grad_k, kv),
            (d.grad_v, kv),
        ],
        size,
    )?
    else {
        return Ok(Launch::Stage);
    };
    if mem.elements_u32(d.lse, rows, 4)?.is_none() {
        return Ok(Launch::Stage);
    }
    let limit = gpu.limits.max_compute_workgroups_per_dimension;
    let (Some(query_groups), Some(key_groups)) =
        (grid_rows(rows, limit), grid_rows(kv_rows, limit))
    else {
        return Ok(Launch::Stage);
    };
    let unavailable = |what: String| BackendError::FeatureUnavailable {
        feature: "WebGPU loop budget",
        reason: format!("attention_backward: {what}"),
    };
    let budget = |len: usize| {
        loops::longest(len, gpu.loop_limit, |span| {
            loops::attention_backward(dim, span)
        })
        .ok_or_else(|| {
            unavailable(format!(
                "one chunk of rows of head dim {dim} needs more loop passes than the budget of {}",
                gpu.loop_limit
            ))
        })
    };
    let (key_span, query_span) = (budget(d.seq_kv)?, budget(d.seq_q)?);
    let stats_bytes = 8 * rows as u64;
    if stats_bytes > mem.binding_limit().bytes {
        return Err(unavailable(format!(
            "{rows} query rows' statistics take more than a binding"
        )));
    }
    let stats = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("attention gradient statistics"),
        size: stats_bytes,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let lse = mem.place(d.lse, 4 * rows)?;
    gpu.scoped("attention gradient statistics", 0, || {
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        encoder.copy_buffer_to_buffer(lse.buffer, lse.offset, &stats, 0, 4 * rows as u64);
        gpu.submit(encoder.finish());
    })?;
    let [dout, q, k, v, o, dq, dk, dv] = [0, 1, 2, 3, 4, 5, 6, 7].map(|i| buffers[i]);
    let stats = Binding::whole(&stats);
    let words = |x: u32, y: u32, (first, end): (usize, usize)| {
        [
            rows as u32,
            d.seq_q as u32,
            d.seq_kv as u32,
            dim as u32,
            (d.scale as f32).to_bits(),
            u32::from(d.causal),
            at[0],
            at[1],
            at[2],
            at[3],
            x,
            y,
            first as u32,
            end as u32,
            u32::from(first > 0),
            kv_rows as u32,
        ]
    };
    // Every launch binds dO, Q, K, V, two outputs (or O) and the statistics.
    let launch = |entry, [x, y]: [Binding<'_>; 2], params: &[u32], groups, loops| {
        kernels.dispatch(
            gpu,
            Dispatch {
                module,
                entry,
                constants: &[],
                buffers: &[dout, q, k, v, x, y, stats],
                params,
                groups,
                loops,
            },
        )
    };
    launch(
        "attention_backward_delta",
        [o, o],
        &words(at[4], at[4], (0, 0)),
        grid_1d(rows, limit)?,
        loops::passes(dim as u64),
    )?;
    for first in (0..d.seq_kv).step_by(key_span) {
        let end = (first + key_span).min(d.seq_kv);
        launch(
            "attention_backward_dq",
            [dq, dq],
            &words(at[5], at[5], (first, end)),
            query_groups,
            loops::attention_backward(dim, end - first),
        )?;
    }
    for first in (0..d.seq_q).step_by(query_span) {
        let end = (first + query_span).min(d.seq_q);
        launch(
            "attention_backward_dkv",
            [dk, dv],
            &words(at[6], at[7], (first, end)),
            key_groups,
            loops::attention_backward(dim, end - first),
        )?;
    }
    Ok(Launch::Done)
}

impl OpImpl<AttentionBackwardDesc> for WebGpuBackend {
    fn op(&self, desc: &AttentionBackwardDesc) -> Result<()> {
        math_dtype("attention_backward", desc.dtype, desc)?;
        let kv = desc.batch * desc.heads * desc.seq_kv * desc.head_dim;
        if desc.seq_q == 0 && kv > 0 {
            // No query: the key and value gradients are zeros.
            for ptr in [desc.grad_k, desc.grad_v] {
                self.fill(&crate::compute::FillDesc {
                    dtype: desc.dtype,
                    ptr,
                    len: kv,
                    value: 0.0,
                })?;
            }
            return Ok(());
        }
        // Each launch keeps within the loop budget by itself (ranges of keys or queries).
        let run = |d: &AttentionBackwardDesc| self.run(d, attention_backward);
        match self.plan(desc, desc.dtype, pieces::attention_backward, None)? {
            Plan::Whole | Plan::PastBudget => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            Plan::TooLarge => Err(BackendError::FeatureUnavailable {
                feature: "WebGPU storage binding",
                reason: "attention_backward: one head's operands are larger than one storage \
                         binding, below which the attention gradients do not cut"
                    .into(),
            }),
        }
    }
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
        let rows = desc.batch * desc.heads * desc.seq_q;
        if let (0, Some(lse), true) = (desc.head_dim, desc.lse, rows > 0) {
            // No head dim: no output, and log-sum-exps of zero scores.
            let values = desc.lse_without_head_dim();
            return large::two_pass::write(self, lse, DType::F32, &values);
        }
        match self.plan(desc, desc.dtype, pieces::attention, None)? {
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // A single head larger than a binding: the launch's window check reports it.
            _ => run(desc),
        }
    }
}
