//! The loop budget: how many loop passes one invocation of each kernel runs, and the most any
//! launch may.
//!
//! llvmpipe, the compiler under Mesa's lavapipe (Vulkan on the CPU), gives every shader invocation
//! a loop limiter (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`, 65 535) shared by all its loops: a
//! counter set on entry and decremented at the end of every pass through any loop — each
//! iteration, and the last pass, which finds the loop done — that ends whichever loop it is in
//! when it reaches 0, silently. A row kernel of 8 threads summing 700 000 elements (87 500 passes
//! a thread) returned the sum of the first 524 256. Other drivers are not known to limit loops,
//! but none can be asked, so every adapter gets the same budget, [`LOOP_LIMIT`] passes per
//! invocation (lowered by `WebGpuBackendConfig::max_loop_iterations`); on a GPU it only binds at
//! extreme sizes (a row of about 16 million elements at 256 threads a row).
//!
//! Every launch states the passes one invocation runs at most ([`Dispatch::loops`], counted by the
//! functions here: every loop, those of constant trip count that a compiler may unroll included,
//! and each workgroup combine), and [`Kernels::dispatch`] refuses one past the budget with
//! `FeatureUnavailable`, so a missed cut is an error, never a truncated loop. The ops cut their
//! work so that each launch fits:
//! - reductions whose rows are too long: blocks of the reduced dim, combined on the host in f64
//!   (`large/two_pass.rs`);
//! - softmax, log-softmax and layer norm: composed of such reductions and elementwise ops
//!   (`large/composed.rs`);
//! - batch norm: chunks of each channel short enough, in training in three launches;
//! - GEMMs: ranges of the inner dim (`large/pieces.rs`, `gemm_cuts`; `large/split_k.rs` accumulates
//!   16-bit ones in f32), GEMVs as GEMMs, batched GEMMs by inner ranges (f32) or product by
//!   product;
//! - conv2d: blocks of input channels accumulated in f32 (`large/conv_split.rs`);
//! - attention: ranges of keys, each row's results combined on the host in f64 from each range's
//!   output, maximum and denominator (`large/attention_split.rs`);
//! - pooling: a window too large as a row pass then a column pass (`large/composed.rs`).
//!
//! A kernel that cannot run even its smallest cut within the budget (a convolution whose taps of
//! one input channel, or a pooling window one of whose sides, need more passes on their own; an
//! attention head too wide for one chunk of keys) answers `FeatureUnavailable`.
//!
//! [`Dispatch::loops`]: super::pipelines::Dispatch::loops
//! [`Kernels::dispatch`]: super::pipelines::Kernels::dispatch

use crate::compute::ReduceOp;

/// Loop passes one invocation may run: llvmpipe's 65 535 less a margin.
pub(crate) const LOOP_LIMIT: u32 = 64_000;

/// Passes of one run of a loop of `iterations` iterations: one per iteration and one that ends it.
pub(crate) const fn passes(iterations: u64) -> u64 {
    iterations.saturating_add(1)
}

/// `v` as a count of passes, at most 2^40 (past any tensor), so that products of counts never
/// overflow.
fn count(v: usize) -> u64 {
    (v as u64).min(1 << 40)
}

/// `a / b` rounded up, as a pass count.
fn ceil(a: usize, b: usize) -> u64 {
    count(a.div_ceil(b.max(1)))
}

/// Passes of a workgroup combine of `wg` threads (`combine.wgsl`): a tree runs log2(`wg`)
/// iterations, a subgroup combine `wg` over the subgroup's lanes; at most `wg` either way.
fn combine(wg: u32) -> u64 {
    passes(u64::from(wg))
}

/// Passes of a loop striding `len` elements `wg` apart (`len / wg` iterations, rounded up).
fn strided(wg: u32, len: usize) -> u64 {
    passes(ceil(len, wg as usize))
}

/// Passes of `rows.wgsl`'s blocked sum over `len` elements `wg` apart: an outer loop over blocks of
/// [`SUM_BLOCK`] of a thread's values (one pass a block, one to leave), each an inner loop (its
/// values, one pass to leave).
fn blocked(wg: u32, len: usize) -> u64 {
    let values = ceil(len, wg as usize);
    let blocks = values.div_ceil(SUM_BLOCK);
    values + 2 * blocks + 1
}

/// Values a thread of `rows.wgsl` adds up before adding their sum to its total.
const SUM_BLOCK: u64 = 64;

/// `rows.wgsl`'s `reduce` of `op` over rows of `len` elements with `wg` threads a row: the
/// row-index walk (up to 8 dims), one pass over the row (a strided one for extremes, a blocked sum
/// otherwise; two for variances) and a combine after each.
pub(crate) fn reduce(wg: u32, op: ReduceOp, len: usize) -> u64 {
    let sweep = match op {
        ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin => strided(wg, len),
        _ => blocked(wg, len),
    };
    let sweeps = if matches!(op, ReduceOp::Var { .. }) {
        2
    } else {
        1
    };
    passes(8) + sweeps * (sweep + combine(wg))
}

/// `rows.wgsl`'s `softmax` over rows of `len` elements: two strided passes, a blocked sum, two
/// combines.
pub(crate) fn softmax(wg: u32, len: usize) -> u64 {
    2 * strided(wg, len) + blocked(wg, len) + 2 * combine(wg)
}

/// `rows.wgsl`'s `softmax_backward` over rows of `len` elements: a blocked sum, a strided pass,
/// one combine.
pub(crate) fn softmax_backward(wg: u32, len: usize) -> u64 {
    blocked(wg, len) + strided(wg, len) + combine(wg)
}

/// `loss.wgsl`'s `cross_entropy` over rows of `classes` logits: a strided pass for the maximum, a
/// blocked sum, a strided output pass, three combines.
pub(crate) fn cross_entropy(wg: u32, classes: usize) -> u64 {
    2 * strided(wg, classes) + blocked(wg, classes) + 3 * combine(wg)
}

/// `rows.wgsl`'s `layer_norm` over rows of `len` elements: two blocked sums, a strided pass, two
/// combines.
pub(crate) fn layer_norm(wg: u32, len: usize) -> u64 {
    2 * blocked(wg, len) + strided(wg, len) + 2 * combine(wg)
}

/// `batch_norm.wgsl`'s `batch_norm_moments` over chunks of `len` values: two strided passes, two
/// combines.
pub(crate) fn batch_norm_moments(wg: u32, len: usize) -> u64 {
    2 * (strided(wg, len) + combine(wg))
}

/// `batch_norm.wgsl`'s `batch_norm` (training in one launch) over channels of `count` values: the
/// moments, then a strided pass normalising.
pub(crate) fn batch_norm_training(wg: u32, count: usize) -> u64 {
    batch_norm_moments(wg, count) + strided(wg, count)
}

/// `batch_norm.wgsl`'s `batch_norm_infer` over chunks of `len` values: one strided pass.
pub(crate) fn batch_norm_infer(wg: u32, len: usize) -> u64 {
    strided(wg, len)
}

/// `batch_norm.wgsl`'s `batch_norm_stats` over `chunks` chunks a channel: one pass per chunk.
pub(crate) fn batch_norm_stats(chunks: usize) -> u64 {
    passes(count(chunks))
}

/// `norm_backward.wgsl`'s `layer_norm_backward_input` over rows of `cols`: two strided passes,
/// two combines.
pub(crate) fn layer_norm_backward_input(wg: u32, cols: usize) -> u64 {
    2 * (strided(wg, cols) + combine(wg))
}

/// `norm_backward.wgsl`'s `layer_norm_backward_params` over `rows` rows: one pass a row.
pub(crate) fn layer_norm_backward_params(rows: usize) -> u64 {
    passes(count(rows))
}

/// `norm_backward.wgsl`'s `batch_norm_backward_sums` over chunks of `len` values: one strided
/// pass, two combines.
pub(crate) fn batch_norm_backward_sums(wg: u32, len: usize) -> u64 {
    strided(wg, len) + 2 * combine(wg)
}

/// Steps of the inner dim a GEMM or convolution tile takes at once (`TK` of the shaders).
const TK: usize = 16;

/// Passes of the 8 × 8 block's stores (`store` of `gemm.wgsl` and `conv.wgsl`): 8 rows of 8.
const BLOCK_STORE: u64 = 8 * passes(8);

/// `gemm.wgsl` with `tile` × `tile` tiles over an inner dim of `k`: per step of 16, the loads of A
/// and B (`tile` · 16 elements each over (`tile` / 8)² threads) and the 16 outer products; then
/// the stores.
pub(crate) fn gemm(tile: usize, k: usize) -> u64 {
    let threads = (tile / 8).pow(2).max(1);
    let loads = passes((tile * TK / threads) as u64);
    let steps = ceil(k, TK);
    passes(steps) + steps * (2 * loads + passes(TK as u64)) + BLOCK_STORE
}

/// `conv.wgsl` over `depth` (input channel, tap) pairs of a group: per step of 16, the staging and
/// the outer products; then the stores.
pub(crate) fn conv2d(depth: usize) -> u64 {
    let steps = ceil(depth, TK);
    passes(steps) + steps * 2 * passes(TK as u64) + BLOCK_STORE
}

/// `attention.wgsl`'s row kernel (128 threads, 8 output dims each) over `span` keys of width
/// `dim`: the query row's load and the accumulators' set-up, then per chunk of 128 keys the dot
/// products, two tree combines (7 levels) and the value sums of each owned dim; the stores.
pub(crate) fn attention_rows(dim: usize, span: usize) -> u64 {
    let owned = ceil(dim, 128).min(8);
    let chunks = ceil(span, 128);
    let per_chunk =
        passes(count(dim)) + 2 * passes(7) + passes(8) + owned * passes(span.min(128) as u64);
    strided(128, dim) + passes(8) + passes(chunks) + chunks * per_chunk + passes(8)
}

/// `attention.wgsl`'s tiled kernel (64 threads, 16 query rows a workgroup) over `span` keys of
/// width `dim`: the query tile's load, then per chunk of 16 keys the key and value loads, the dot
/// products, and the maximum and sums over the chunk's 16 scores; the stores.
pub(crate) fn attention_tiled(dim: usize, span: usize) -> u64 {
    let vec4s = ceil(dim, 4);
    // A thread loads every 4th vec4 column of a row, 4 elements each (`load4`).
    let columns = vec4s.div_ceil(4);
    let load = passes(4);
    let chunks = ceil(span, 16);
    let per_chunk =
        passes(columns) + columns * 2 * load + passes(vec4s) + passes(4) + 2 * passes(16);
    passes(columns) + columns * load + passes(chunks) + chunks * per_chunk + 8 * load
}

/// `attention_backward.wgsl`'s `attention_backward_dq` and `attention_backward_dkv` (128 threads, a
/// row of width `dim` each) over `span` keys or queries: the row loads, then per chunk of 128 the
/// thread's two dot products and its owned dims' sums over the chunk; the stores.
pub(crate) fn attention_backward(dim: usize, span: usize) -> u64 {
    let owned = ceil(dim, 128).min(8);
    let chunks = ceil(span, 128);
    let per_chunk = passes(count(dim)) + passes(8) + owned * passes(span.min(128) as u64);
    strided(128, dim) + passes(8) + passes(chunks) + chunks * per_chunk + passes(8)
}

/// `pool.wgsl` over a `ky` × `kx` window: a pass per row and per tap.
pub(crate) fn pool2d(ky: usize, kx: usize) -> u64 {
    passes(count(ky)) + count(ky).saturating_mul(passes(count(kx)))
}

/// `elementwise.wgsl`: up to three views' index walks of up to 8 dims.
pub(crate) const ELEMENTWISE: u64 = 3 * passes(8);

/// `cast.wgsl`: up to four elements a word (`cast_words`), each with its source's index walk of
/// up to 8 dims, and the destination's.
pub(crate) const CAST: u64 = passes(4) + 4 * passes(8) + passes(8);

/// `random.wgsl`: the series of `log_one_minus` (9 terms).
pub(crate) const RANDOM: u64 = passes(9);

/// `dropout.wgsl`: no loops.
pub(crate) const DROPOUT: u64 = 0;

/// Passes of `conv2d_backward_input` over `kg` output channels of an `r × s` kernel: a loop over
/// the channels, in each one over the kernel rows, in each one over its columns.
pub(crate) fn conv2d_backward_input(kg: usize, r: usize, s: usize) -> u64 {
    let row = passes(count(s));
    let taps = passes(count(r)) + count(r) * row;
    passes(count(kg)) + count(kg) * taps
}

/// Passes of `conv2d_backward_weight` over `positions` output positions: a loop striding them 64
/// apart, then the tree over the workgroup's 64 sums (6 levels).
pub(crate) fn conv2d_backward_weight(positions: usize) -> u64 {
    strided(64, positions) + passes(6)
}

/// `optim.wgsl` and `unscale.wgsl`: no loops.
pub(crate) const NONE: u64 = 0;

/// The longest `len` in `1..=total` whose `loops(len)` is within `limit`, for `loops` that grows
/// with `len`; `None` when not even 1 is.
pub(crate) fn longest(total: usize, limit: u64, loops: impl Fn(usize) -> u64) -> Option<usize> {
    if total == 0 || loops(1) > limit {
        return None;
    }
    let (mut good, mut bad) = (1, total + 1);
    if loops(total) <= limit {
        return Some(total);
    }
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if loops(mid) <= limit {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_cover_the_passes_lavapipe_was_measured_to_count() {
        // A sum over 8 threads a row came out wrong from 524 257 elements on: past the budget.
        assert!(reduce(8, ReduceOp::Sum, 524_257) > u64::from(LOOP_LIMIT));
        // A convolution was cut off after 1 872 steps of 16: 35 passes a step.
        assert_eq!(conv2d(16 * 1872) - conv2d(16 * 1871), 35);
        // A GEMM after 3 640 steps of 16 and 15 of the next: 18 passes a step at least.
        assert!(gemm(64, 32) - gemm(64, 16) >= 18);
        assert!(gemm(64, 16 * 3641) > u64::from(LOOP_LIMIT));
    }

    #[test]
    fn the_longest_fitting_length_is_found_at_every_edge() {
        let linear = |n: usize| n as u64;
        assert_eq!(longest(100, 50, linear), Some(50));
        assert_eq!(longest(40, 50, linear), Some(40));
        assert_eq!(longest(100, 0, linear), None);
        assert_eq!(longest(0, 50, linear), None);
        assert_eq!(longest(usize::MAX - 1, 1 << 40, linear), Some(1 << 40));
        // Costs that grow in steps: the last length of the last step that fits.
        assert_eq!(longest(1000, 10, |n| n.div_ceil(16) as u64), Some(160));
    }
}
