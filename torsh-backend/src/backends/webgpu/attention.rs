//! Host side of `shaders/attention.wgsl`: f32 scaled dot-product attention, one workgroup per query
//! row with an online softmax over chunks of keys (causal chunks past the row never visited). Other
//! dtypes, head dims above 1024, misaligned operands and offsets beyond 32 bits answer
//! [`Launch::Stage`].

use crate::compute::AttentionDesc;
use crate::dtype::DType;
use crate::error::Result;

use super::context::Gpu;
use super::elementwise::Launch;
use super::memory::Memory;
use super::pipelines::{grid_rows, Dispatch, Kernels, ATTENTION};

/// Largest head dim the kernel's per-thread accumulators cover (128 threads × 8 dims).
const MAX_HEAD_DIM: usize = 1024;

/// f32 attention.
pub(crate) fn attention(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &AttentionDesc,
) -> Result<Launch> {
    if d.dtype != DType::F32 || d.head_dim > MAX_HEAD_DIM {
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
        mem.words_u32(d.q, qo)?,
        mem.words_u32(d.k, kv)?,
        mem.words_u32(d.v, kv)?,
        mem.words_u32(d.o, qo)?,
    ) else {
        return Ok(Launch::Stage);
    };
    let Some(groups) = grid_rows(rows, gpu.limits.max_compute_workgroups_per_dimension) else {
        return Ok(Launch::Stage);
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
    ];
    kernels.dispatch(
        gpu,
        Dispatch {
            module: ATTENTION,
            entry: "attention",
            constants: &[],
            buffers: &[q.0, k.0, v.0, o.0],
            params: &words,
            groups,
        },
    )?;
    Ok(Launch::Done)
}
