//! Host side of the attention kernels (`kernels/attention.cu`): FlashAttention-2 style kernels that
//! never materialise the score matrix.
//!
//! Two kernels:
//! - The tensor-core kernel (`attention_mma_d{64,128}_{f16,bf16}`): f16 and bf16 with `head_dim` 64 or
//!   128 on compute capability 8.0 and above, with Q, K, V and O 16-byte aligned. Scores and P·V are
//!   `mma.sync.m16n8k16` with f32 accumulation; P is rounded to the input dtype before P·V, as in
//!   FlashAttention. One block of [`MMA_THREADS`] threads handles [`MMA_BLOCK_ROWS`] query rows of one
//!   (batch, head).
//! - The SIMT kernel (`attention_w{64,128,256}_<dtype>`), everything else: one block of [`THREADS`]
//!   threads handles [`BLOCK_ROWS`] query rows of one (batch, head) and one group of output columns; the
//!   smallest of the three column-group widths (64, 128, 256) that covers `head_dim` is used, and a
//!   `head_dim` above 256 takes several 256-column groups, each of which recomputes the scores.
//!
//! With a log-sum-exp output both kernels write each query row's `m + ln l` too.
//!
//! The gradients (`attention_backward_w{64,128,256}_<dtype>`) are SIMT kernels in two launches: dQ
//! with a warp per [`GRAD_ROWS`] query rows walking the keys, then dK and dV with a warp per
//! [`GRAD_ROWS`] key rows walking the queries; each rebuilds P and dS from the log-sum-exp per
//! (query, key) pair and sums its rows in a fixed order (no atomics). They are compiled under NVRTC in
//! CI and have not run on a GPU.
//!
//! Setting the environment variable `TORSH_CUDA_ATTENTION=simt` makes every call use the SIMT kernel
//! (read on each call), so one GPU run can compare the two. Both kernels walk their work items
//! grid-stride, so any problem size fits in one launch.

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use super::launch;
use super::launch::{suffix, to_i64};
use super::Gpu;
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::{stats_dtype, AttentionBackwardDesc, AttentionDesc};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// Operation name in errors.
const OP: &str = "attention";

/// Threads per block (`ATT_THREADS` in the kernel).
const THREADS: u32 = 128;

/// Query rows per block (`ATT_BQ` in the kernel).
const BLOCK_ROWS: usize = 16;

/// The column-group widths the kernel is instantiated for, ascending.
const WIDTHS: [usize; 3] = [64, 128, 256];

/// Rows (queries or keys) per warp of the gradient kernels (`ATT_GRAD_ROWS`).
const GRAD_ROWS: usize = 4;

/// Most blocks a 1-D launch may have (`gridDim.x` ≤ 2³¹ − 1).
const MAX_BLOCKS: usize = i32::MAX as usize;

/// Threads per block of the tensor-core kernel (`MMA_THREADS`).
const MMA_THREADS: u32 = 128;

/// Query rows per block of the tensor-core kernel (`MMA_BQ`): 16 per warp.
const MMA_BLOCK_ROWS: usize = 64;

/// The head widths the tensor-core kernel is instantiated for.
const MMA_DIMS: [usize; 2] = [64, 128];

/// The environment variable that can force the SIMT kernel, and the value that does.
const KERNEL_VAR: (&str, &str) = ("TORSH_CUDA_ATTENTION", "simt");

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
fn entry_name(width: usize, dtype: DType) -> String {
    format!("attention_w{width}_{}", suffix(dtype))
}

/// The tensor-core entry point's name for `head_dim` and `dtype`.
fn mma_entry_name(head_dim: usize, dtype: DType) -> String {
    format!("attention_mma_d{head_dim}_{}", suffix(dtype))
}

/// Whether the tensor-core kernel serves a call: f16 or bf16, `head_dim` 64 or 128, compute capability
/// `(major, minor)` at least 8.0, every operand address 16-byte aligned, and the SIMT kernel not forced.
fn use_mma(
    dtype: DType,
    head_dim: usize,
    capability: (i32, i32),
    addresses: &[u64],
    simt_forced: bool,
) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
        && MMA_DIMS.contains(&head_dim)
        && capability.0 >= 8
        && addresses.iter().all(|a| a % 16 == 0)
        && !simt_forced
}

/// Whether `TORSH_CUDA_ATTENTION=simt` is set.
fn simt_forced() -> bool {
    std::env::var_os(KERNEL_VAR.0).is_some_and(|v| v == KERNEL_VAR.1)
}

/// Blocks of the tensor-core kernel for `heads` heads of `seq_q` queries, both non-zero: one per
/// (head, 64-row query tile), capped at [`MAX_BLOCKS`] (the kernel walks the rest grid-stride).
fn mma_blocks(heads: usize, seq_q: usize) -> Result<u32> {
    let items = heads
        .checked_mul(seq_q.div_ceil(MMA_BLOCK_ROWS))
        .ok_or_else(|| BackendError::overflow(OP, "the number of attention tiles overflows"))?;
    to_i64(OP, items)?; // the kernel counts items in 64 bits
    Ok(items.clamp(1, MAX_BLOCKS) as u32)
}

/// Enqueues `O = softmax(scale · Q·Kᵀ [causal]) · V`. Empty outputs (no heads, no queries, zero
/// head_dim) launch nothing. The regions were checked by the caller.
pub(crate) fn attention(gpu: &Gpu, d: &AttentionDesc) -> Result<()> {
    if d.batch == 0 || d.heads == 0 || d.seq_q == 0 {
        return Ok(()); // O is empty; K and V may be any length.
    }
    if d.head_dim == 0 {
        return Ok(()); // The caller writes the log-sum-exps of zero scores.
    }
    let heads = d
        .batch
        .checked_mul(d.heads)
        .ok_or_else(|| BackendError::overflow(OP, "batch · heads overflows"))?;
    let addresses = [d.q.0, d.k.0, d.v.0, d.o.0];
    if use_mma(
        d.dtype,
        d.head_dim,
        gpu.compute_capability(),
        &addresses,
        simt_forced(),
    ) {
        let blocks = mma_blocks(heads, d.seq_q)?;
        let f = gpu.function_for("attention", d.dtype, &mma_entry_name(d.head_dim, d.dtype))?;
        return launch(gpu, &f, blocks, MMA_THREADS, d, heads);
    }
    let plan = plan(heads, d.seq_q, d.head_dim)?;
    let f = gpu.function_for("attention", d.dtype, &entry_name(plan.width, d.dtype))?;
    launch(gpu, &f, plan.blocks, THREADS, d, heads)
}

/// Launches attention kernel `f` (either kernel: they take the same parameters) on `blocks` blocks of
/// `threads` threads for `d` with `heads` = batch · heads.
fn launch(
    gpu: &Gpu,
    f: &CudaFunction,
    blocks: u32,
    threads: u32,
    d: &AttentionDesc,
    heads: usize,
) -> Result<()> {
    let (bh, sq, skv, dim) = (
        to_i64(OP, heads)?,
        to_i64(OP, d.seq_q)?,
        to_i64(OP, d.seq_kv)?,
        to_i64(OP, d.head_dim)?,
    );
    let causal = i32::from(d.causal);
    let (q, k, v, o) = (d.q.0, d.k.0, d.v.0, d.o.0);
    let lse = d.lse.map_or(0u64, |p| p.0);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = gpu.stream().launch_builder(f);
    b.arg(&q)
        .arg(&k)
        .arg(&v)
        .arg(&o)
        .arg(&lse)
        .arg(&bh)
        .arg(&sq)
        .arg(&skv)
        .arg(&dim)
        .arg(&d.scale)
        .arg(&causal);
    // SAFETY: the caller checked every region against live allocations and for aliasing; the arguments
    // match the kernel's parameters (five pointers, the log-sum-exp's null when not asked, four i64,
    // a double, an int); the tensor-core kernel
    // is launched only for its head_dim and with 16-byte aligned operands.
    unsafe { b.launch(cfg) }.map_err(|e| super::driver_error("attention", e))?;
    Ok(())
}

impl OpImpl<AttentionDesc> for CudaBackend {
    fn op(&self, desc: &AttentionDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("attention", desc.dtype)?;
        if let (0, Some(lse)) = (desc.head_dim, desc.lse) {
            // No head dim: log-sum-exps of zero scores, from the host.
            let stats = stats_dtype(desc.dtype);
            let size = stats.size_in_bytes();
            let values = desc.lse_without_head_dim();
            let mut bytes = vec![0u8; values.len() * size];
            for (v, out) in values.iter().zip(bytes.chunks_exact_mut(size)) {
                crate::dtype::encode(stats, *v, out);
            }
            return crate::compute::ComputeBackend::copy_htod(self, lse, &bytes);
        }
        self.run(acc, |gpu| {
            let ptrs = [desc.q, desc.k, desc.v, desc.o];
            launch::check_aligned("attention", desc.dtype, &ptrs)?;
            attention(gpu, desc)
        })
    }
}

/// Enqueues the gradients of `d`: dQ, then dK and dV. Nothing to write without keys or head dim.
pub(crate) fn attention_backward(gpu: &Gpu, d: &AttentionBackwardDesc) -> Result<()> {
    let op = "attention_backward";
    if d.batch == 0 || d.heads == 0 || d.seq_kv == 0 || d.head_dim == 0 {
        return Ok(());
    }
    let heads = d
        .batch
        .checked_mul(d.heads)
        .ok_or_else(|| BackendError::overflow(op, "batch · heads overflows"))?;
    let width = column_width(d.head_dim);
    let f = gpu.function_for(
        "attention",
        d.dtype,
        &format!("attention_backward_w{width}_{}", suffix(d.dtype)),
    )?;
    let (bh, sq, skv, dim) = (
        to_i64(op, heads)?,
        to_i64(op, d.seq_q)?,
        to_i64(op, d.seq_kv)?,
        to_i64(op, d.head_dim)?,
    );
    let causal = i32::from(d.causal);
    let ptrs = [
        d.grad_output.0,
        d.q.0,
        d.k.0,
        d.v.0,
        d.o.0,
        d.lse.0,
        d.grad_q.0,
        d.grad_k.0,
        d.grad_v.0,
    ];
    for (which, rows) in [(0i32, d.seq_q), (1, d.seq_kv)] {
        let items = heads
            .checked_mul(rows.div_ceil(GRAD_ROWS))
            .ok_or_else(|| BackendError::overflow(op, "the number of attention tiles overflows"))?;
        to_i64(op, items)?;
        if items == 0 {
            continue;
        }
        let warps = (THREADS / 32) as usize;
        let blocks = items.div_ceil(warps).clamp(1, MAX_BLOCKS) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = gpu.stream().launch_builder(&f);
        for p in &ptrs {
            b.arg(p);
        }
        b.arg(&bh)
            .arg(&sq)
            .arg(&skv)
            .arg(&dim)
            .arg(&d.scale)
            .arg(&causal)
            .arg(&which);
        // SAFETY: the caller checked every region against live allocations and for aliasing; the
        // arguments match the kernel's parameters (nine pointers, four i64, a double, two ints).
        unsafe { b.launch(cfg) }.map_err(|e| super::driver_error(op, e))?;
    }
    Ok(())
}

impl OpImpl<AttentionBackwardDesc> for CudaBackend {
    fn op(&self, desc: &AttentionBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("attention_backward", desc.dtype)?;
        self.run(acc, |gpu| {
            let ptrs = [
                desc.grad_output,
                desc.q,
                desc.k,
                desc.v,
                desc.o,
                desc.grad_q,
                desc.grad_k,
                desc.grad_v,
            ];
            launch::check_aligned("attention_backward", desc.dtype, &ptrs)?;
            launch::check_aligned("attention_backward", stats_dtype(desc.dtype), &[desc.lse])?;
            attention_backward(gpu, desc)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn gradient_entry_names_match_the_kernel_source() {
        let src = include_str!("kernels/attention.cu");
        assert!(src.contains("attention_backward_w##W##_##S"));
        for w in WIDTHS {
            assert!(src.contains(&format!("GRAD_ENTRY_W({w}, {}, S, T)", w / 32)));
        }
        assert!(src.contains(&format!("#define ATT_GRAD_ROWS {GRAD_ROWS}")));
    }

    #[test]
    fn tensor_cores_serve_f16_and_bf16_at_64_and_128_on_sm80_and_later() {
        let aligned = [0x1000u64, 0x2000, 0x3010, 0x4000];
        for dtype in [DType::F16, DType::BF16] {
            for dim in MMA_DIMS {
                assert!(use_mma(dtype, dim, (8, 0), &aligned, false));
                assert!(use_mma(dtype, dim, (9, 0), &aligned, false));
                assert!(use_mma(dtype, dim, (12, 0), &aligned, false));
                assert!(!use_mma(dtype, dim, (7, 5), &aligned, false));
                assert!(!use_mma(dtype, dim, (9, 0), &aligned, true), "forced SIMT");
                assert!(!use_mma(
                    dtype,
                    dim,
                    (9, 0),
                    &[0x1000, 0x2002, 0x3000, 0x4000],
                    false
                ));
                assert!(!use_mma(
                    dtype,
                    dim,
                    (9, 0),
                    &[0x1000, 0x2000, 0x3000, 0x4008],
                    false
                ));
            }
            for dim in [1, 8, 32, 63, 65, 96, 127, 129, 256] {
                assert!(
                    !use_mma(dtype, dim, (9, 0), &aligned, false),
                    "head_dim {dim}"
                );
            }
        }
        for dtype in [DType::F32, DType::F64] {
            assert!(!use_mma(dtype, 64, (9, 0), &aligned, false));
        }
    }

    #[test]
    fn tensor_core_blocks_cover_every_head_and_query_tile() {
        assert_eq!(mma_blocks(1, 1).unwrap(), 1);
        assert_eq!(mma_blocks(3, 64).unwrap(), 3);
        assert_eq!(mma_blocks(3, 65).unwrap(), 6);
        assert_eq!(mma_blocks(2, 129).unwrap(), 6);
        assert_eq!(mma_blocks(1 << 40, 1).unwrap(), i32::MAX as u32);
        assert!(mma_blocks(usize::MAX, 65).is_err());
    }

    #[test]
    fn tensor_core_entry_names_match_the_kernel_source() {
        let src = include_str!("kernels/attention.cu");
        assert!(src.contains("attention_mma_d##D##_##S"));
        assert!(
            src.contains("#define MMA_ENTRY(S, T) MMA_ENTRY_D(64, S, T) MMA_ENTRY_D(128, S, T)")
        );
        assert!(src.contains("MMA_ENTRY(f16, f16_t)") && src.contains("MMA_ENTRY(bf16, bf16_t)"));
        assert!(
            src.contains("#define MMA_WARPS 4") && src.contains("#define MMA_BQ (MMA_WARPS * 16)")
        );
        assert!(src.contains("#define MMA_THREADS (MMA_WARPS * 32)"));
        assert_eq!(MMA_THREADS, 4 * 32);
        assert_eq!(MMA_BLOCK_ROWS, 4 * 16);
        assert_eq!(MMA_DIMS, [64, 128]);
        assert_eq!(mma_entry_name(64, DType::F16), "attention_mma_d64_f16");
        assert_eq!(mma_entry_name(128, DType::BF16), "attention_mma_d128_bf16");
        let (var, value) = KERNEL_VAR;
        let doc = include_str!("attention.rs");
        assert!(doc.contains(&format!("`{var}={value}`")));
    }
}
