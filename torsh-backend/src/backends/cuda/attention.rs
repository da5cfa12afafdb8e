//! Host side of the attention kernels (`kernels/attention.cu`): a FlashAttention-2 style kernel that
//! never materialises the score matrix.
//!
//! One block of [`THREADS`] threads handles [`BLOCK_ROWS`] query rows of one (batch, head) and one group
//! of output columns. The kernel comes in three column-group widths (64, 128, 256 columns, entry points
//! `attention_w{64,128,256}_<dtype>`); the smallest width that covers `head_dim` is used, and a
//! `head_dim` above 256 takes several 256-column groups, each of which recomputes the scores. Blocks
//! walk the work items grid-stride, so any problem size fits in one launch.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::launch::{suffix, to_i64};
use super::Gpu;
use crate::compute::AttentionDesc;
use crate::error::{BackendError, Result};

/// Operation name in errors.
const OP: &str = "attention";

/// Threads per block (`ATT_THREADS` in the kernel).
const THREADS: u32 = 128;

/// Query rows per block (`ATT_BQ` in the kernel).
const BLOCK_ROWS: usize = 16;

/// The column-group widths the kernel is instantiated for, ascending.
const WIDTHS: [usize; 3] = [64, 128, 256];

/// Most blocks a 1-D launch may have (`gridDim.x` ≤ 2³¹ − 1).
const MAX_BLOCKS: usize = i32::MAX as usize;

/// How one attention call is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    /// Output columns per block: the entry point's `w` suffix.
    width: usize,
    /// Work items: (batch·head, query tile, column group) triples.
    items: usize,
    /// Blocks launched; each walks the items grid-stride.
    blocks: u32,
}

/// The column-group width for `head_dim`: the smallest instantiated width that covers it, else the
/// widest (several groups).
fn column_width(head_dim: usize) -> usize {
    WIDTHS
        .iter()
        .copied()
        .find(|&w| head_dim <= w)
        .unwrap_or(WIDTHS[WIDTHS.len() - 1])
}

/// The launch for `heads` (= batch · heads) heads of `seq_q` queries of width `head_dim`, all non-zero.
fn plan(heads: usize, seq_q: usize, head_dim: usize) -> Result<Plan> {
    let width = column_width(head_dim);
    let items = heads
        .checked_mul(seq_q.div_ceil(BLOCK_ROWS))
        .and_then(|n| n.checked_mul(head_dim.div_ceil(width)))
        .ok_or_else(|| BackendError::overflow(OP, "the number of attention tiles overflows"))?;
    to_i64(OP, items)?; // the kernel counts items in 64 bits
    let blocks = items.clamp(1, MAX_BLOCKS) as u32;
    Ok(Plan {
        width,
        items,
        blocks,
    })
}

/// The entry point's name for `width` and `dtype`.
fn entry_name(width: usize, dtype: crate::dtype::DType) -> String {
    format!("attention_w{width}_{}", suffix(dtype))
}

/// Enqueues `O = softmax(scale · Q·Kᵀ [causal]) · V`. Empty outputs (no heads, no queries, zero
/// head_dim) launch nothing. The regions were checked by the caller.
pub(crate) fn attention(gpu: &Gpu, d: &AttentionDesc) -> Result<()> {
    if d.batch == 0 || d.heads == 0 || d.seq_q == 0 || d.head_dim == 0 {
        return Ok(()); // O is empty; K and V may be any length.
    }
    let heads = d
        .batch
        .checked_mul(d.heads)
        .ok_or_else(|| BackendError::overflow(OP, "batch · heads overflows"))?;
    let plan = plan(heads, d.seq_q, d.head_dim)?;
    let f = gpu.function_for("attention", d.dtype, &entry_name(plan.width, d.dtype))?;
    let (bh, sq, skv, dim) = (
        to_i64(OP, heads)?,
        to_i64(OP, d.seq_q)?,
        to_i64(OP, d.seq_kv)?,
        to_i64(OP, d.head_dim)?,
    );
    let causal = i32::from(d.causal);
    let (q, k, v, o) = (d.q.0, d.k.0, d.v.0, d.o.0);
    let cfg = LaunchConfig {
        grid_dim: (plan.blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&q)
        .arg(&k)
        .arg(&v)
        .arg(&o)
        .arg(&bh)
        .arg(&sq)
        .arg(&skv)
        .arg(&dim)
        .arg(&d.scale)
        .arg(&causal);
    // SAFETY: the caller checked every region against live allocations and for aliasing; the arguments
    // match the kernel's parameters (four pointers, four i64, a double, an int).
    unsafe { b.launch(cfg) }.map_err(|e| super::driver_error("attention", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn the_narrowest_covering_width_is_chosen() {
        assert_eq!(column_width(1), 64);
        assert_eq!(column_width(64), 64);
        assert_eq!(column_width(65), 128);
        assert_eq!(column_width(128), 128);
        assert_eq!(column_width(129), 256);
        assert_eq!(column_width(256), 256);
        assert_eq!(column_width(257), 256);
        assert_eq!(column_width(1000), 256);
    }

    #[test]
    fn items_cover_every_head_query_tile_and_column_group() {
        let p = plan(6, 5, 7).unwrap();
        assert_eq!((p.width, p.items, p.blocks), (64, 6, 6));
        let p = plan(1, 16, 128).unwrap();
        assert_eq!((p.width, p.items), (128, 1));
        let p = plan(1, 17, 128).unwrap();
        assert_eq!(p.items, 2);
        // 300 columns: two 256-wide groups.
        let p = plan(3, 33, 300).unwrap();
        assert_eq!((p.width, p.items, p.blocks), (256, 3 * 3 * 2, 18));
    }

    #[test]
    fn huge_problems_are_capped_or_rejected() {
        let p = plan(1 << 40, 1, 1).unwrap();
        assert_eq!(p.items, 1 << 40);
        assert_eq!(p.blocks, i32::MAX as u32);
        assert!(plan(usize::MAX, 17, 1).is_err());
        assert!(plan(usize::MAX / 2, 1, 257).is_err());
    }

    #[test]
    fn entry_names_match_the_kernel_source() {
        let src = include_str!("kernels/attention.cu");
        assert!(src.contains("attention_w##W##_##S"));
        for w in WIDTHS {
            assert!(src.contains(&format!("ENTRY_W({w}, {}, S, T)", w / 32)));
        }
        assert_eq!(entry_name(64, DType::F32), "attention_w64_f32");
        assert_eq!(entry_name(256, DType::BF16), "attention_w256_bf16");
        assert!(src.contains("#define ATT_THREADS (ATT_WARPS * 32)"));
        assert!(src.contains("#define ATT_WARPS 4") && src.contains("#define ATT_ROWS 4"));
        assert_eq!(THREADS, 4 * 32);
        assert_eq!(BLOCK_ROWS, 4 * 4);
    }
}
