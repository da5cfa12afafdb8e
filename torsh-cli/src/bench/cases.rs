//! What `bench` measures: the cases of each section, their labels, and the work each does (flops or
//! bytes). The sizes per backend class are in `plan.rs`, how ours runs each case in `prepare.rs`.

use serde_json::{json, Value};
use torsh_backend::DType;

/// One call of the measured op; errors as text (ours and the peers' alike).
pub type Runner<'a> = Box<dyn FnMut() -> Result<(), String> + 'a>;

/// The table a case belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// Matrix products.
    Gemm,
    /// Memory-bound ops over large tensors.
    Memory,
    /// Scaled dot-product attention.
    Attention,
    /// 2-D convolutions.
    Conv,
    /// Fused optimizer steps.
    Optimizer,
}

impl Section {
    /// Every section, in the order of the tables.
    pub const ALL: [Section; 5] = [
        Section::Gemm,
        Section::Memory,
        Section::Attention,
        Section::Conv,
        Section::Optimizer,
    ];

    /// The section's name in the JSON.
    pub fn key(self) -> &'static str {
        match self {
            Section::Gemm => "gemm",
            Section::Memory => "memory",
            Section::Attention => "attention",
            Section::Conv => "conv2d",
            Section::Optimizer => "optimizer",
        }
    }

    /// The title line of the section's table.
    pub fn title(self) -> &'static str {
        match self {
            Section::Gemm => {
                "GEMM: matmul of row-major [M,K]·[K,N], shape M x N x K, 2·M·N·K flops"
            }
            Section::Memory => {
                "Memory-bound: bytes read + written, outputs preallocated; ceiling = copy bandwidth"
            }
            Section::Attention => {
                "Attention: softmax(Q·Kᵀ/√D)·V over [B,H,S,D], 4·B·H·S²·D flops (half when causal)"
            }
            Section::Conv => {
                "Conv2d (NCHW, ResNet-like layers): 2·N·K·OH·OW·(C/groups)·R·S flops (twice that for \
                 the backward: input and weight gradients)"
            }
            Section::Optimizer => {
                "Fused Adam: one step over a list of parameters; 4 reads + 3 writes per element"
            }
        }
    }

    /// Whether the section's cases are measured in bytes (GB/s) rather than flops.
    pub fn in_bytes(self) -> bool {
        matches!(self, Section::Memory | Section::Optimizer)
    }
}

/// Which backend instance runs a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The backend the user chose.
    Main,
    /// A second CUDA backend built with `enable_tensor_cores(true)` (TF32 f32 GEMM).
    Tf32,
}

/// A memory-bound op over a `[rows, cols]` tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemOp {
    /// The ceiling: `ComputeBackend::copy_dtod` of a dense buffer (the device's own memcpy).
    Memcpy,
    /// `Tensor::copy` of a dense tensor.
    Copy,
    /// `x.t().contiguous()`: a strided read, dense write.
    CopyTransposed,
    /// `x + y`.
    Add,
    /// `x · y`.
    Mul,
    /// `exp(x)`.
    Exp,
    /// GELU, exact (erf) form.
    Gelu,
    /// `erf(x)`.
    Erf,
    /// `tanh(x)`.
    Tanh,
    /// `sigmoid(x) = 1 / (1 + exp(−x))`.
    Sigmoid,
    /// Softmax over each row.
    Softmax,
    /// Layer norm over each row, no affine parameters.
    LayerNorm,
    /// Sum over each row.
    Sum,
    /// Sum over each column (along the leading dim, as a bias gradient is): on WebGPU a tensor larger
    /// than one storage binding takes the two-pass path.
    SumColumns,
    /// Max over each row.
    Max,
    /// Batch norm in training (batch statistics, running statistics updated), with weight and bias,
    /// over `[rows, BATCH_NORM_CHANNELS, cols / BATCH_NORM_CHANNELS]`.
    BatchNormTraining,
    /// Batch norm in inference (running statistics), with weight and bias, over the same shape.
    BatchNormInference,
    /// Cast to bf16.
    CastBf16,
    /// Fill with a constant (writes only).
    Fill,
    /// `x.gather(1, index)` with a random `I64` index of `x`'s shape: each element read from a
    /// random column of its row.
    Gather,
    /// `x.index_select(0, index)` with `rows` random `I64` row indices (an embedding lookup of
    /// `rows` tokens into a table of `rows` rows).
    IndexSelect,
    /// An embedding lookup: `2 · rows` random rows of a `[rows, cols]` table, through the same
    /// gather kernel as `IndexSelect` (a 4096 × 512 table by 8192 tokens at the CPU and GPU scales).
    Embedding,
    /// `index_add` in place: `rows` rows of a source added into random rows of the output (an
    /// embedding's gradient), repeats summing.
    IndexAdd,
    /// `where(mask, x, y)` with a random `U8` mask, all three dense.
    Where,
    /// `cumsum` along each row (dim 1).
    Cumsum,
    /// `topk` of [`TOPK`] along each row, largest first (values and `I64` indices).
    Topk,
    /// `cat` of the two halves of the columns, `[rows, cols / 2]` each, along dim 1, through the
    /// tensor API (which allocates its output each call).
    Cat,
    /// `gelu`'s backward (`unary_backward`): the input and a gradient read, the input's gradient
    /// written.
    GeluBackward,
    /// `softmax_backward` along each row: the gradient and the forward's output read, the
    /// input's gradient written.
    SoftmaxBackward,
    /// `dropout` with p = 0.5 (the counter-based mask).
    Dropout,
    /// `max_pool2d` 2×2 / 2 of the tensor as [`pool_image`] images.
    MaxPool,
    /// `max_pool2d_backward` of [`MemOp::MaxPool`] from its `I64` positions.
    MaxPoolBackward,
    /// `avg_pool2d_backward` 2×2 / 2 of the [`pool_image`] images.
    AvgPoolBackward,
    /// `cross_entropy` (mean) of `[rows, cols]` logits against `rows` random classes, through the
    /// tensor API (the fused kernel, then the mean of the `rows` losses; allocates each call).
    CrossEntropy,
    /// `cross_entropy_backward` of [`MemOp::CrossEntropy`], likewise.
    CrossEntropyBackward,
    /// `layer_norm_backward` over each row with a weight, every gradient, from saved statistics.
    LayerNormBackward,
    /// `batch_norm_backward` in training over the [`MemOp::BatchNormTraining`] shape with a
    /// weight, every gradient, from saved statistics.
    BatchNormBackward,
}

/// Rows of each image plane of the pooling cases: the `[rows, cols]` tensor is
/// `[rows / POOL_ROWS, 1, POOL_ROWS, cols]` (every scale's `rows` divides by it).
pub const POOL_ROWS: usize = 8;

/// The NCHW shape of the pooling cases' input for a `[rows, cols]` case.
pub fn pool_image(rows: usize, cols: usize) -> [usize; 4] {
    [rows / POOL_ROWS, 1, POOL_ROWS, cols]
}

impl MemOp {
    /// The op's name, as `--op` takes it.
    fn name(self) -> &'static str {
        match self {
            MemOp::Memcpy => "memcpy",
            MemOp::Copy | MemOp::CopyTransposed => "copy",
            MemOp::Add => "add",
            MemOp::Mul => "mul",
            MemOp::Exp => "exp",
            MemOp::Gelu => "gelu",
            MemOp::Erf => "erf",
            MemOp::Tanh => "tanh",
            MemOp::Sigmoid => "sigmoid",
            MemOp::Softmax => "softmax",
            MemOp::LayerNorm => "layer_norm",
            MemOp::Sum | MemOp::SumColumns => "sum",
            MemOp::Max => "max",
            MemOp::BatchNormTraining | MemOp::BatchNormInference => "batch_norm",
            MemOp::CastBf16 => "cast",
            MemOp::Fill => "fill",
            MemOp::Gather => "gather",
            MemOp::IndexSelect | MemOp::Embedding => "index_select",
            MemOp::IndexAdd => "index_add",
            MemOp::Where => "where",
            MemOp::Cumsum => "cumsum",
            MemOp::Topk => "topk",
            MemOp::Cat => "cat",
            MemOp::GeluBackward => "gelu_backward",
            MemOp::SoftmaxBackward => "softmax_backward",
            MemOp::Dropout => "dropout",
            MemOp::MaxPool => "max_pool2d",
            MemOp::MaxPoolBackward => "max_pool2d_backward",
            MemOp::AvgPoolBackward => "avg_pool2d_backward",
            MemOp::CrossEntropy => "cross_entropy",
            MemOp::CrossEntropyBackward => "cross_entropy_backward",
            MemOp::LayerNormBackward => "layer_norm_backward",
            MemOp::BatchNormBackward => "batch_norm_backward",
        }
    }

    /// The variant of the op's name worth naming in the JSON, where one name covers several ops.
    fn variant(self) -> Option<&'static str> {
        match self {
            MemOp::CopyTransposed => Some("transposed"),
            MemOp::CastBf16 => Some("to bf16"),
            MemOp::Embedding => Some("embedding"),
            MemOp::SumColumns => Some("columns"),
            MemOp::BatchNormTraining => Some("training"),
            MemOp::BatchNormInference => Some("inference"),
            _ => None,
        }
    }
}

/// The `k` of the `topk` case (a sampler's top-k over a vocabulary row).
pub const TOPK: usize = 50;

/// Channels of the batch-norm cases: each row of their `[rows, cols]` tensor is one image of this
/// many channels of `cols / BATCH_NORM_CHANNELS` positions (every scale's `cols` divides by it).
pub const BATCH_NORM_CHANNELS: usize = 32;

/// The op of a case with its sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Row-major `[m,k]·[k,n]`.
    Matmul {
        /// Rows of the output.
        m: usize,
        /// Columns of the output.
        n: usize,
        /// The reduced dimension.
        k: usize,
    },
    /// A memory-bound op over a `[rows, cols]` tensor.
    Memory {
        /// Which op.
        op: MemOp,
        /// Rows (the reduced ops reduce each row).
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// `softmax(Q·Kᵀ/√D)·V` over `[b, h, s, d]`.
    Attention {
        /// Batch.
        b: usize,
        /// Heads.
        h: usize,
        /// Sequence length of queries and keys.
        s: usize,
        /// Head dimension.
        d: usize,
        /// Causal mask (top-left aligned).
        causal: bool,
        /// The gradients (dq, dk, dv from the forward's output and log-sum-exp) instead of the
        /// forward.
        backward: bool,
    },
    /// Square images and kernels: input `[n, c, hw, hw]`, weight `[k, c/groups, r, r]`.
    Conv2d {
        /// Batch.
        n: usize,
        /// Input channels.
        c: usize,
        /// Input height and width.
        hw: usize,
        /// Output channels.
        k: usize,
        /// Kernel height and width.
        r: usize,
        /// Stride (both axes).
        stride: usize,
        /// Zero padding (both axes, both sides).
        pad: usize,
        /// Channel groups (`c` for a depthwise convolution).
        groups: usize,
        /// With a `[k]` bias.
        bias: bool,
        /// The backward instead of the forward: the input's and the weight's gradients (and the
        /// bias's, with a bias) from a random output gradient, twice the forward's flops.
        backward: bool,
    },
    /// `tensors` parameters of `len` elements each.
    Adam {
        /// Number of parameter tensors.
        tensors: usize,
        /// Elements of each.
        len: usize,
    },
}

/// Every op name `--op` accepts.
pub const OP_NAMES: [&str; 39] = [
    "matmul",
    "memcpy",
    "copy",
    "add",
    "mul",
    "exp",
    "gelu",
    "erf",
    "tanh",
    "sigmoid",
    "softmax",
    "layer_norm",
    "batch_norm",
    "layer_norm_backward",
    "batch_norm_backward",
    "sum",
    "max",
    "cast",
    "fill",
    "gather",
    "index_select",
    "index_add",
    "where",
    "cumsum",
    "topk",
    "cat",
    "gelu_backward",
    "softmax_backward",
    "dropout",
    "max_pool2d",
    "max_pool2d_backward",
    "avg_pool2d_backward",
    "cross_entropy",
    "cross_entropy_backward",
    "attention",
    "attention_backward",
    "conv2d",
    "conv2d_backward",
    "adam",
];

/// The work of one call: what throughput is computed from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Work {
    /// Floating-point operations (an FMA counts 2).
    Flops(f64),
    /// Bytes read plus bytes written.
    Bytes(f64),
}

impl Work {
    /// GFLOP/s or GB/s (1e9 bytes) at `seconds` per call.
    pub fn per_second(self, seconds: f64) -> f64 {
        match self {
            Work::Flops(x) | Work::Bytes(x) => x / seconds / 1e9,
        }
    }

    /// The unit of [`Work::per_second`].
    pub fn unit(self) -> &'static str {
        match self {
            Work::Flops(_) => "GFLOP/s",
            Work::Bytes(_) => "GB/s",
        }
    }
}

/// One measured case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    /// The op and its sizes.
    pub op: Op,
    /// The element type of the inputs.
    pub dtype: DType,
    /// The backend instance that runs it.
    pub target: Target,
}

impl Case {
    /// A case on the chosen backend.
    pub fn new(op: Op, dtype: DType) -> Case {
        Case {
            op,
            dtype,
            target: Target::Main,
        }
    }

    /// The table the case belongs to.
    pub fn section(&self) -> Section {
        match self.op {
            Op::Matmul { .. } => Section::Gemm,
            Op::Memory { .. } => Section::Memory,
            Op::Attention { .. } => Section::Attention,
            Op::Conv2d { .. } => Section::Conv,
            Op::Adam { .. } => Section::Optimizer,
        }
    }

    /// The op's name (`matmul`, `softmax`, ...).
    pub fn name(&self) -> &'static str {
        match self.op {
            Op::Matmul { .. } => "matmul",
            Op::Memory { op, .. } => op.name(),
            Op::Attention {
                backward: false, ..
            } => "attention",
            Op::Attention { backward: true, .. } => "attention_backward",
            Op::Conv2d {
                backward: false, ..
            } => "conv2d",
            Op::Conv2d { backward: true, .. } => "conv2d_backward",
            Op::Adam { .. } => "adam",
        }
    }

    /// The dtype as the table shows it (`tf32` for f32 GEMM on tensor cores).
    pub fn dtype_label(&self) -> &'static str {
        match self.target {
            Target::Tf32 => "tf32",
            Target::Main => self.dtype.name(),
        }
    }

    /// A variant worth naming in the JSON (`tf32`, `causal`, `transposed`, `to bf16`, `depthwise`).
    pub fn variant(&self) -> Option<&'static str> {
        match self.op {
            _ if self.target == Target::Tf32 => Some("tf32"),
            Op::Attention { causal: true, .. } => Some("causal"),
            Op::Memory { op, .. } => op.variant(),
            Op::Conv2d { c, groups, .. } if groups == c && c > 1 => Some("depthwise"),
            _ => None,
        }
    }

    /// The shape column of the table.
    pub fn shape_label(&self) -> String {
        match self.op {
            Op::Matmul { m, n, k } => format!("{m}x{n}x{k}"),
            Op::Memory { op, rows, cols } => match op {
                MemOp::Memcpy => format!("{rows}x{cols} dense"),
                MemOp::CopyTransposed => format!("{rows}x{cols} .t()"),
                MemOp::CastBf16 => format!("{rows}x{cols} -> bf16"),
                MemOp::SumColumns => format!("{rows}x{cols} cols"),
                MemOp::Gather => format!("{rows}x{cols} by {rows}x{cols}"),
                MemOp::IndexSelect => format!("{rows}x{cols} by {rows} rows"),
                MemOp::Embedding => format!("{rows}x{cols} by {} tokens", 2 * rows),
                MemOp::IndexAdd => format!("{rows}x{cols} into {rows} rows"),
                MemOp::Cat => format!("2 x {rows}x{} along 1", cols / 2),
                MemOp::Where => format!("{rows}x{cols} by a u8 mask"),
                MemOp::Cumsum => format!("{rows}x{cols} rows"),
                MemOp::Topk => format!("{rows}x{cols} rows, k {TOPK}"),
                MemOp::BatchNormTraining | MemOp::BatchNormBackward => {
                    format!(
                        "{rows}x{BATCH_NORM_CHANNELS}x{} train",
                        cols / BATCH_NORM_CHANNELS
                    )
                }
                MemOp::BatchNormInference => {
                    format!(
                        "{rows}x{BATCH_NORM_CHANNELS}x{} infer",
                        cols / BATCH_NORM_CHANNELS
                    )
                }
                MemOp::Softmax
                | MemOp::LayerNorm
                | MemOp::LayerNormBackward
                | MemOp::Sum
                | MemOp::Max => {
                    format!("{rows}x{cols} rows")
                }
                _ => format!("{rows}x{cols}"),
            },
            Op::Attention {
                b, h, s, d, causal, ..
            } => {
                format!("B{b} H{h} S{s} D{d}{}", if causal { " causal" } else { "" })
            }
            Op::Conv2d {
                n,
                c,
                hw,
                k,
                r,
                stride,
                groups,
                bias,
                ..
            } => format!(
                "N{n} C{c} {hw}x{hw} K{k} {r}x{r}/{stride}{}{}",
                if groups > 1 { " dw" } else { "" },
                if bias { " +b" } else { "" }
            ),
            Op::Adam { tensors, len } => format!("{tensors} x {len}"),
        }
    }

    /// The sizes as a JSON object.
    pub fn dims_json(&self) -> Value {
        match self.op {
            Op::Matmul { m, n, k } => json!({"m": m, "n": n, "k": k}),
            Op::Memory {
                op: MemOp::BatchNormTraining | MemOp::BatchNormInference | MemOp::BatchNormBackward,
                rows,
                cols,
            } => json!({
                "rows": rows, "cols": cols, "n": rows, "c": BATCH_NORM_CHANNELS,
                "spatial": cols / BATCH_NORM_CHANNELS,
            }),
            Op::Memory {
                op: MemOp::MaxPool | MemOp::MaxPoolBackward | MemOp::AvgPoolBackward,
                rows,
                cols,
            } => {
                let [n, c, h, w] = pool_image(rows, cols);
                json!({"rows": rows, "cols": cols, "n": n, "c": c, "h": h, "w": w, "kernel": 2, "stride": 2})
            }
            Op::Memory { rows, cols, .. } => json!({"rows": rows, "cols": cols}),
            Op::Attention {
                b,
                h,
                s,
                d,
                causal,
                backward,
            } => {
                json!({"batch": b, "heads": h, "seq_q": s, "seq_kv": s, "head_dim": d, "causal": causal, "backward": backward})
            }
            Op::Conv2d {
                n,
                c,
                hw,
                k,
                r,
                stride,
                pad,
                groups,
                bias,
                backward,
            } => json!({
                "n": n, "c": c, "h": hw, "w": hw, "k": k, "r": r, "s": r,
                "stride": stride, "padding": pad, "groups": groups, "bias": bias,
                "backward": backward,
                "out_hw": conv_out(hw, r, stride, pad),
            }),
            Op::Adam { tensors, len } => json!({"tensors": tensors, "len": len}),
        }
    }

    /// Flops or bytes of one call.
    pub fn work(&self) -> Work {
        let size = self.dtype.size_in_bytes() as f64;
        match self.op {
            Op::Matmul { m, n, k } => Work::Flops(2.0 * (m * n) as f64 * k as f64),
            Op::Memory { op, rows, cols } => {
                let n = (rows * cols) as f64;
                Work::Bytes(match op {
                    MemOp::Add | MemOp::Mul => 3.0 * n * size,
                    MemOp::Sum | MemOp::Max => n * size + rows as f64 * size,
                    MemOp::SumColumns => n * size + cols as f64 * size,
                    MemOp::CastBf16 => n * (size + DType::BF16.size_in_bytes() as f64),
                    MemOp::Fill => n * size,
                    // Elements read and written, and the I64 indices.
                    MemOp::Gather => n * (2.0 * size + 8.0),
                    MemOp::IndexSelect => 2.0 * n * size + rows as f64 * 8.0,
                    // Twice the table's size gathered and written, and the tokens.
                    MemOp::Embedding => 4.0 * n * size + 2.0 * rows as f64 * 8.0,
                    // The source read, the output read and written, the indices.
                    MemOp::IndexAdd => 3.0 * n * size + rows as f64 * 8.0,
                    // The rows read, k values and indices written per row.
                    MemOp::Topk => n * size + (rows * TOPK) as f64 * (size + 8.0),
                    // Two branches read and the output written, the mask's bytes.
                    MemOp::Where => n * (3.0 * size + 1.0),
                    // Two operands read, the gradient written (the least any kernel moves).
                    MemOp::GeluBackward | MemOp::SoftmaxBackward => 3.0 * n * size,
                    // The input read, a quarter of it written.
                    MemOp::MaxPool => 1.25 * n * size,
                    // A quarter of the input's size read (with the I64 positions), all written.
                    MemOp::MaxPoolBackward => 1.25 * n * size + n / 4.0 * 8.0,
                    MemOp::AvgPoolBackward => 1.25 * n * size,
                    // The logits read (and their gradient written), the targets.
                    MemOp::CrossEntropy => n * size + rows as f64 * 8.0,
                    MemOp::CrossEntropyBackward => 2.0 * n * size + rows as f64 * 8.0,
                    // The gradient and the input read, the input's gradient written (the least a
                    // kernel moves; batch norm's reads both twice).
                    MemOp::LayerNormBackward | MemOp::BatchNormBackward => 3.0 * n * size,
                    _ => 2.0 * n * size,
                })
            }
            Op::Attention {
                b,
                h,
                s,
                d,
                causal,
                backward,
            } => {
                // The backward's five products of the forward's two (FlashAttention's count).
                let passes = if backward { 2.5 } else { 1.0 };
                let full = passes * 4.0 * (b * h) as f64 * (s * s) as f64 * d as f64;
                Work::Flops(if causal { full / 2.0 } else { full })
            }
            Op::Conv2d {
                n,
                c,
                hw,
                k,
                r,
                stride,
                pad,
                groups,
                backward,
                ..
            } => {
                let o = conv_out(hw, r, stride, pad) as f64;
                let per_group = (c / groups.max(1)) * r * r;
                let passes = if backward { 2.0 } else { 1.0 };
                Work::Flops(passes * 2.0 * (n * k) as f64 * o * o * per_group as f64)
            }
            Op::Adam { tensors, len } => Work::Bytes(7.0 * (tensors * len) as f64 * size),
        }
    }
}

/// Output height (or width) of a square convolution.
pub fn conv_out(hw: usize, r: usize, stride: usize, pad: usize) -> usize {
    (hw + 2 * pad).saturating_sub(r) / stride + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_counts_follow_the_conventions() {
        let mm = Case::new(Op::Matmul { m: 2, n: 3, k: 4 }, DType::F32);
        assert_eq!(mm.work(), Work::Flops(48.0));
        let add = Case::new(
            Op::Memory {
                op: MemOp::Add,
                rows: 2,
                cols: 5,
            },
            DType::F32,
        );
        assert_eq!(add.work(), Work::Bytes(120.0));
        let att = |causal| {
            Case::new(
                Op::Attention {
                    b: 1,
                    h: 2,
                    s: 3,
                    d: 4,
                    causal,
                    backward: false,
                },
                DType::BF16,
            )
            .work()
        };
        assert_eq!(att(false), Work::Flops(288.0));
        assert_eq!(att(true), Work::Flops(144.0));
        // 3x3, pad 1, stride 1 keeps 8x8: 2·1·8·64·4·9.
        let conv = Case::new(
            Op::Conv2d {
                n: 1,
                c: 4,
                hw: 8,
                k: 8,
                r: 3,
                stride: 1,
                pad: 1,
                groups: 1,
                bias: false,
                backward: false,
            },
            DType::F32,
        );
        assert_eq!(conv.work(), Work::Flops(36864.0));
        // Depthwise: each output channel sees one input channel.
        let dw = Case::new(
            Op::Conv2d {
                n: 1,
                c: 4,
                hw: 8,
                k: 4,
                r: 3,
                stride: 1,
                pad: 1,
                groups: 4,
                bias: true,
                backward: false,
            },
            DType::F32,
        );
        assert_eq!(dw.work(), Work::Flops(2.0 * 4.0 * 64.0 * 9.0));
        assert_eq!(dw.variant(), Some("depthwise"));
        assert!(dw.shape_label().ends_with("dw +b"));
    }
}
