//! Each op cut into pieces that each fit one storage binding (the `Plan::Pieces` of
//! [`super::super::Plan`]): by the dims of its independent parts, or by elements where every operand is
//! dense.

use crate::compute::{
    AdamDesc, AttentionBackwardDesc, AttentionDesc, BatchNormBackwardDesc, BatchNormDesc,
    BatchedGemmDesc, BinaryDesc, CastDesc, Conv2dBackwardInputDesc, Conv2dBackwardWeightDesc,
    Conv2dDesc, CopyDesc, CrossEntropyDesc, DevicePtr, FillDesc, GemmDesc, GemvDesc,
    LayerNormBackwardDesc, LayerNormDesc, Pool2dBackwardDesc, Pool2dDesc, RandomDesc, ReduceDesc,
    SoftmaxBackwardDesc, SoftmaxDesc, StridedBuf, Transpose, UnaryDesc, UnscaleDesc,
};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::Layout;

use super::super::memory::Memory;

use super::cuts::*;

/// `desc` by outer slices.
pub(crate) fn softmax(mem: &Memory, desc: &SoftmaxDesc) -> Result<Option<Vec<SoftmaxDesc>>> {
    let (pointers, step) = ((desc.input, desc.output), desc.axis_len * desc.inner);
    split_io(
        mem,
        desc,
        desc.dtype,
        desc.outer,
        step,
        pointers,
        SoftmaxDesc::accesses,
        |input, output, outer| SoftmaxDesc {
            input,
            output,
            outer,
            ..desc.clone()
        },
    )
}

/// `desc` by blocks of rows, when it is larger than a binding.
pub(crate) fn cross_entropy(
    mem: &Memory,
    desc: &CrossEntropyDesc,
) -> Result<Option<Vec<CrossEntropyDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let index = desc.index_dtype.size_in_bytes();
    split(
        mem,
        desc,
        desc.dtype,
        desc.rows,
        CrossEntropyDesc::accesses,
        |start, len| {
            let out_row = if desc.grad.is_some() { desc.classes } else { 1 };
            Ok(CrossEntropyDesc {
                logits: advance(desc.logits, start * desc.classes, size)?,
                target: advance(desc.target, start, index)?,
                grad: desc.grad.map(|g| advance(g, start, size)).transpose()?,
                output: advance(desc.output, start * out_row, size)?,
                rows: len,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by outer slices.
pub(crate) fn softmax_backward(
    mem: &Memory,
    desc: &SoftmaxBackwardDesc,
) -> Result<Option<Vec<SoftmaxBackwardDesc>>> {
    let (size, step) = (desc.dtype.size_in_bytes(), desc.axis_len * desc.inner);
    split(
        mem,
        desc,
        desc.dtype,
        desc.outer,
        SoftmaxBackwardDesc::accesses,
        |start, len| {
            Ok(SoftmaxBackwardDesc {
                grad_output: advance(desc.grad_output, start * step, size)?,
                output: advance(desc.output, start * step, size)?,
                grad_input: advance(desc.grad_input, start * step, size)?,
                outer: len,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by rows.
pub(crate) fn layer_norm(mem: &Memory, desc: &LayerNormDesc) -> Result<Option<Vec<LayerNormDesc>>> {
    let pointers = (desc.input, desc.output);
    split_io(
        mem,
        desc,
        desc.dtype,
        desc.rows,
        desc.cols,
        pointers,
        LayerNormDesc::accesses,
        |input, output, rows| {
            // The piece's first row, and its saved statistics from there.
            let row_bytes = (desc.cols * desc.dtype.size_in_bytes()).max(1) as u64;
            let first = (input.0 - desc.input.0) / row_bytes;
            let stat_bytes = crate::compute::stats_dtype(desc.dtype).size_in_bytes() as u64;
            let from = |p: Option<DevicePtr>| p.map(|p| DevicePtr(p.0 + first * stat_bytes));
            LayerNormDesc {
                input,
                output,
                rows,
                saved_mean: from(desc.saved_mean),
                saved_invstd: from(desc.saved_invstd),
                ..desc.clone()
            }
        },
    )
}

/// `desc` by rows, each piece writing its rows' input gradient and its own rows' weight and bias
/// gradients (which [`WebGpuBackend`](super::super::WebGpuBackend)'s op then adds up).
pub(crate) fn layer_norm_backward(
    mem: &Memory,
    desc: &LayerNormBackwardDesc,
) -> Result<Option<Vec<LayerNormBackwardDesc>>> {
    let (size, cols) = (desc.dtype.size_in_bytes(), desc.cols);
    let stat = crate::compute::stats_dtype(desc.dtype).size_in_bytes();
    split(
        mem,
        desc,
        desc.dtype,
        desc.rows,
        LayerNormBackwardDesc::accesses,
        |start, len| {
            Ok(LayerNormBackwardDesc {
                grad_output: advance(desc.grad_output, start * cols, size)?,
                input: advance(desc.input, start * cols, size)?,
                mean: advance(desc.mean, start, stat)?,
                invstd: advance(desc.invstd, start, stat)?,
                grad_input: desc
                    .grad_input
                    .map(|p| advance(p, start * cols, size))
                    .transpose()?,
                rows: len,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by its input's leading dim, when it reduces another.
pub(crate) fn reduce(mem: &Memory, desc: &ReduceDesc) -> Result<Option<Vec<ReduceDesc>>> {
    let layout = &desc.input.layout;
    let (shape, strides) = (layout.shape(), layout.strides());
    if desc.axis == 0 || shape.is_empty() {
        return Ok(None);
    }
    let out_size = desc.op.output_dtype(desc.dtype).size_in_bytes();
    // Output elements per index of the leading dim: the output is dense in the other dims.
    let per_lead: usize = shape[1..]
        .iter()
        .enumerate()
        .filter(|&(d, _)| d + 1 != desc.axis)
        .map(|(_, &e)| e)
        .product();
    split(
        mem,
        desc,
        desc.dtype,
        shape[0],
        ReduceDesc::accesses,
        |start, len| {
            let mut part_shape = shape.to_vec();
            part_shape[0] = len;
            let offset = layout.offset() + start * strides[0];
            Ok(ReduceDesc {
                input: StridedBuf {
                    ptr: desc.input.ptr,
                    layout: Layout::new(part_shape, strides.to_vec(), offset)?,
                },
                output: advance(desc.output, start * per_lead, out_size)?,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by images, in inference (the running statistics are only read); `None` in training,
/// whose statistics take every image (`two_pass.rs`).
pub(crate) fn batch_norm(mem: &Memory, desc: &BatchNormDesc) -> Result<Option<Vec<BatchNormDesc>>> {
    if desc.training {
        return Ok(None);
    }
    let images = |start, len| batch_norm_images(desc, start, len);
    split(
        mem,
        desc,
        desc.dtype,
        desc.batch,
        BatchNormDesc::accesses,
        images,
    )
}

/// `desc` by images: each piece reads and writes the tensors of its images, and shares the weight,
/// the statistics and the weight and bias gradients (the caller sums the pieces into those).
pub(crate) fn batch_norm_backward(
    mem: &Memory,
    desc: &BatchNormBackwardDesc,
) -> Result<Option<Vec<BatchNormBackwardDesc>>> {
    let (size, image) = (desc.dtype.size_in_bytes(), desc.channels * desc.spatial);
    split(
        mem,
        desc,
        desc.dtype,
        desc.batch,
        BatchNormBackwardDesc::accesses,
        |start, len| {
            Ok(BatchNormBackwardDesc {
                grad_output: advance(desc.grad_output, start * image, size)?,
                input: advance(desc.input, start * image, size)?,
                grad_input: desc
                    .grad_input
                    .map(|p| advance(p, start * image, size))
                    .transpose()?,
                batch: len,
                ..desc.clone()
            })
        },
    )
}

/// `desc` over its images `start..start + len` only.
pub(crate) fn batch_norm_images(
    desc: &BatchNormDesc,
    start: usize,
    len: usize,
) -> Result<BatchNormDesc> {
    let (size, image) = (desc.dtype.size_in_bytes(), desc.channels * desc.spatial);
    Ok(BatchNormDesc {
        input: advance(desc.input, start * image, size)?,
        output: advance(desc.output, start * image, size)?,
        batch: len,
        ..desc.clone()
    })
}

/// `desc` by elements.
pub(crate) fn adam(mem: &Memory, desc: &AdamDesc) -> Result<Option<Vec<AdamDesc>>> {
    let size = desc.dtype.size_in_bytes();
    split(
        mem,
        desc,
        desc.dtype,
        desc.len,
        AdamDesc::accesses,
        |start, len| {
            Ok(AdamDesc {
                params: advance(desc.params, start, size)?,
                grads: advance(desc.grads, start, size)?,
                exp_avg: advance(desc.exp_avg, start, size)?,
                exp_avg_sq: advance(desc.exp_avg_sq, start, size)?,
                len,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by elements, every piece setting the one flag.
pub(crate) fn unscale(mem: &Memory, desc: &UnscaleDesc) -> Result<Option<Vec<UnscaleDesc>>> {
    let pointers = (desc.input, desc.output);
    split_io(
        mem,
        desc,
        desc.dtype,
        desc.len,
        1,
        pointers,
        UnscaleDesc::accesses,
        |input, output, len| UnscaleDesc {
            input,
            output,
            len,
            ..desc.clone()
        },
    )
}

/// How a GEMM too large for one binding is cut: ranges of the rows of C, of its columns and of the
/// inner dim. The pieces of one block of C over successive inner ranges accumulate into it, the
/// first with the GEMM's `beta` and the others with 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmCuts {
    /// The cut of the rows of C.
    pub rows: Cut,
    /// The cut of the columns of C.
    pub cols: Cut,
    /// The cut of the inner dim.
    pub inner: Cut,
}

impl GemmCuts {
    /// Whether the pieces accumulate into C over more than one inner range.
    pub fn splits_inner(&self) -> bool {
        self.inner.count() > 1
    }

    /// The pieces' (rows, columns, inner) ranges, in the order they run: by blocks of C, each over
    /// its inner ranges in turn.
    pub fn pieces(&self) -> impl Iterator<Item = [(usize, usize); 3]> {
        let (rows, inner) = (self.rows, self.inner);
        self.cols.ranges().flat_map(move |c| {
            rows.ranges()
                .flat_map(move |r| inner.ranges().map(move |k| [r, c, k]))
        })
    }
}

/// Element offset of `(row, col)` of `op(X)`, for X column-major with leading dimension `ld`;
/// `SizeOverflow` when it does not fit a `usize`.
pub(crate) fn op_offset(t: Transpose, ld: usize, row: usize, col: usize) -> Result<usize> {
    let (row, col) = match t {
        Transpose::No => (row, col),
        Transpose::Yes => (col, row),
    };
    col.checked_mul(ld)
        .and_then(|v| v.checked_add(row))
        .ok_or_else(|| BackendError::overflow("webgpu pieces", "matrix offset overflows"))
}

/// The GEMM over rows `r`, columns `c` and inner range `k` of `desc`, each `(start, len)`: C's block
/// `r × c` gets `alpha · op(A)[r, k] · op(B)[k, c]` added, scaled by `beta` first when `k` starts
/// the inner dim (and by 1 otherwise).
pub(crate) fn gemm_piece(desc: &GemmDesc, [r, c, k]: [(usize, usize); 3]) -> Result<GemmDesc> {
    let size = desc.dtype.size_in_bytes();
    // With an empty inner range A and B are never read: their pointers stay where they are (a
    // zero-byte allocation has no element to advance to).
    let operand = |ptr: DevicePtr, offset: Result<usize>| match k.1 {
        0 => Ok(ptr),
        _ => advance(ptr, offset?, size),
    };
    Ok(GemmDesc {
        m: r.1,
        n: c.1,
        k: k.1,
        a: operand(desc.a, op_offset(desc.trans_a, desc.lda, r.0, k.0))?,
        b: operand(desc.b, op_offset(desc.trans_b, desc.ldb, k.0, c.0))?,
        c: advance(desc.c, op_offset(Transpose::No, desc.ldc, r.0, c.0)?, size)?,
        beta: if k.0 == 0 { desc.beta } else { 1.0 },
        ..desc.clone()
    })
}

/// `desc` (column-major) cut into the fewest pieces whose accesses each fit one binding
/// ([`Memory::fits`]) and whose inner dim is at most `max_inner` (what a launch takes within the
/// loop budget); `None` when it fits whole, or no cut fits (the launch then reports it).
///
/// Blocks of C's rows and columns are independent products, and are tried first: column blocks
/// narrow B (unless transposed) and C, row blocks narrow A when it is transposed. Only where no
/// such cut fits (A untransposed and B transposed or both larger than a binding, say) is the
/// inner dim cut too, which narrows A untransposed and B transposed; those pieces are budgeted for
/// f32 copies of 16-bit operands, which they accumulate in (`split_k.rs`). Among cuts of each kind
/// the fewest pieces win, column blocks before row blocks on a tie.
pub(crate) fn gemm_cuts(
    mem: &Memory,
    desc: &GemmDesc,
    max_inner: usize,
) -> Result<Option<GemmCuts>> {
    let fits = |d: &GemmDesc, widen: Option<usize>| -> Result<bool> {
        let acc = d.accesses()?;
        Ok(mem.fits(&acc, widen.unwrap_or_else(|| mem.widening(d.dtype, &acc))))
    };
    if desc.k <= max_inner && fits(desc, None)? {
        return Ok(None);
    }
    let (rows, cols, inner) = (cuts(desc.m), cuts(desc.n), cuts(desc.k));
    let f32_copies = (4 / desc.dtype.size_in_bytes()).max(1);
    for (cut_inner, widen) in [(false, None), (true, Some(f32_copies))] {
        let mut candidates: Vec<(usize, usize, usize)> = (0..rows.len())
            .flat_map(|r| (0..cols.len()).map(move |c| (r, c)))
            .flat_map(|(r, c)| (0..inner.len()).map(move |k| (r, c, k)))
            .filter(|&(_, _, k)| (k > 0) == cut_inner && inner[k].longest() <= max_inner)
            .collect();
        let count = |&(r, c, k): &(usize, usize, usize)| {
            let (rows, cols, inner) = (rows[r].count(), cols[c].count(), inner[k].count());
            (rows.saturating_mul(cols).saturating_mul(inner), rows)
        };
        candidates.sort_by_key(count);
        for (r, c, k) in candidates {
            let plan = GemmCuts {
                rows: rows[r],
                cols: cols[c],
                inner: inner[k],
            };
            if all_fit(plan.pieces(), |p| fits(&gemm_piece(desc, p)?, widen))? {
                return Ok(Some(plan));
            }
        }
    }
    Ok(None)
}

/// `desc` by rows of op(A) and y.
pub(crate) fn gemv(mem: &Memory, desc: &GemvDesc) -> Result<Option<Vec<GemvDesc>>> {
    let size = desc.dtype.size_in_bytes();
    // Rows of op(A): m when A is not transposed, else n.
    let (rows, a_step) = match desc.trans {
        Transpose::No => (desc.m, 1),
        Transpose::Yes => (desc.n, desc.lda),
    };
    split(
        mem,
        desc,
        desc.dtype,
        rows,
        GemvDesc::accesses,
        |start, len| {
            let (m, n) = match desc.trans {
                Transpose::No => (len, desc.n),
                Transpose::Yes => (desc.m, len),
            };
            Ok(GemvDesc {
                a: advance(desc.a, start * a_step, size)?,
                y: advance(desc.y, start * desc.incy, size)?,
                m,
                n,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by batch.
pub(crate) fn batched_gemm(
    mem: &Memory,
    desc: &BatchedGemmDesc,
) -> Result<Option<Vec<BatchedGemmDesc>>> {
    let g = &desc.gemm;
    let size = g.dtype.size_in_bytes();
    split(
        mem,
        desc,
        g.dtype,
        desc.batch_count,
        BatchedGemmDesc::accesses,
        |start, len| {
            let (sa, sb) = operand_strides(desc);
            Ok(BatchedGemmDesc {
                gemm: GemmDesc {
                    a: advance(g.a, start * sa, size)?,
                    b: advance(g.b, start * sb, size)?,
                    c: advance(g.c, start * desc.stride_c, size)?,
                    ..g.clone()
                },
                batch_count: len,
                ..desc.clone()
            })
        },
    )
}

/// Product `index` of the batch `desc`, as a GEMM of its own.
pub(crate) fn batch_element(desc: &BatchedGemmDesc, index: usize) -> Result<GemmDesc> {
    let g = &desc.gemm;
    let size = g.dtype.size_in_bytes();
    let at = |ptr: DevicePtr, stride: usize| {
        let elements = index
            .checked_mul(stride)
            .ok_or_else(|| BackendError::overflow("webgpu pieces", "batch offset overflows"))?;
        advance(ptr, elements, size)
    };
    let (sa, sb) = operand_strides(desc);
    Ok(GemmDesc {
        a: at(g.a, sa)?,
        b: at(g.b, sb)?,
        c: at(g.c, desc.stride_c)?,
        ..g.clone()
    })
}

/// The strides between `desc`'s A and B matrices as its pieces advance by them: 0 with k = 0, where
/// A and B are never read (and may be zero-byte allocations).
pub(crate) fn operand_strides(desc: &BatchedGemmDesc) -> (usize, usize) {
    if desc.gemm.k == 0 {
        (0, 0)
    } else {
        (desc.stride_a, desc.stride_b)
    }
}

/// `desc` as the GEMM of the same values transposed, `yᵀ = alpha · xᵀ · op(A)ᵀ + beta · yᵀ`: one row
/// of C (y, its elements `incy` apart), A' = xᵀ (`incx` apart), B' = op(A)ᵀ. Any strides map, and
/// the GEMM's cuts include the inner dim, which a GEMV by rows cannot cut.
pub(crate) fn gemv_as_gemm(desc: &GemvDesc) -> GemmDesc {
    let (x_len, y_len) = desc.vector_lens();
    GemmDesc {
        dtype: desc.dtype,
        trans_a: Transpose::No,
        trans_b: match desc.trans {
            Transpose::No => Transpose::Yes,
            Transpose::Yes => Transpose::No,
        },
        m: 1,
        n: y_len,
        k: x_len,
        alpha: desc.alpha,
        a: desc.x,
        lda: desc.incx,
        b: desc.a,
        ldb: desc.lda,
        beta: desc.beta,
        c: desc.y,
        ldc: desc.incy,
    }
}

/// `desc` by image (weight and bias shared).
pub(crate) fn conv2d(mem: &Memory, desc: &Conv2dDesc) -> Result<Option<Vec<Conv2dDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let [n, c, h, w] = desc.input_shape;
    let [_, k, oh, ow] = desc.output_shape;
    let piece = |start: usize, len: usize| {
        Ok(Conv2dDesc {
            input: advance(desc.input, start * c * h * w, size)?,
            input_shape: [len, c, h, w],
            output: advance(desc.output, start * k * oh * ow, size)?,
            output_shape: [len, k, oh, ow],
            ..desc.clone()
        })
    };
    split(mem, desc, desc.dtype, n, Conv2dDesc::accesses, piece)
}

/// `desc` by image (weight and bias shared): each piece is the input gradient of its images.
pub(crate) fn conv2d_backward_input(
    mem: &Memory,
    desc: &Conv2dBackwardInputDesc,
) -> Result<Option<Vec<Conv2dBackwardInputDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let [n, c, h, w] = desc.grad_input_shape;
    let [_, k, oh, ow] = desc.grad_output_shape;
    let piece = |start: usize, len: usize| {
        Ok(Conv2dBackwardInputDesc {
            grad_input: advance(desc.grad_input, start * c * h * w, size)?,
            grad_input_shape: [len, c, h, w],
            grad_output: advance(desc.grad_output, start * k * oh * ow, size)?,
            grad_output_shape: [len, k, oh, ow],
            ..desc.clone()
        })
    };
    split(
        mem,
        desc,
        desc.dtype,
        n,
        Conv2dBackwardInputDesc::accesses,
        piece,
    )
}

/// `desc` by image: each piece is the weight gradient of its images alone, which the caller sums.
pub(crate) fn conv2d_backward_weight(
    mem: &Memory,
    desc: &Conv2dBackwardWeightDesc,
) -> Result<Option<Vec<Conv2dBackwardWeightDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let [n, c, h, w] = desc.input_shape;
    let [_, k, oh, ow] = desc.grad_output_shape;
    let piece = |start: usize, len: usize| {
        Ok(Conv2dBackwardWeightDesc {
            input: advance(desc.input, start * c * h * w, size)?,
            input_shape: [len, c, h, w],
            grad_output: advance(desc.grad_output, start * k * oh * ow, size)?,
            grad_output_shape: [len, k, oh, ow],
            ..desc.clone()
        })
    };
    split(
        mem,
        desc,
        desc.dtype,
        n,
        Conv2dBackwardWeightDesc::accesses,
        piece,
    )
}

/// `desc` by (batch, head), as a batch of one-head problems.
pub(crate) fn attention(mem: &Memory, desc: &AttentionDesc) -> Result<Option<Vec<AttentionDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let (q_each, kv_each) = (desc.seq_q * desc.head_dim, desc.seq_kv * desc.head_dim);
    let problems = desc.batch * desc.heads;
    split(
        mem,
        desc,
        desc.dtype,
        problems,
        AttentionDesc::accesses,
        |start, len| {
            Ok(AttentionDesc {
                q: advance(desc.q, start * q_each, size)?,
                k: advance(desc.k, start * kv_each, size)?,
                v: advance(desc.v, start * kv_each, size)?,
                o: advance(desc.o, start * q_each, size)?,
                lse: desc
                    .lse
                    .map(|lse| advance(lse, start * desc.seq_q, 4))
                    .transpose()?,
                batch: len,
                heads: 1,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by (batch, head), as a batch of one-head problems: each piece the gradients of its heads.
pub(crate) fn attention_backward(
    mem: &Memory,
    desc: &AttentionBackwardDesc,
) -> Result<Option<Vec<AttentionBackwardDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let stat = crate::compute::stats_dtype(desc.dtype).size_in_bytes();
    let (q_each, kv_each) = (desc.seq_q * desc.head_dim, desc.seq_kv * desc.head_dim);
    split(
        mem,
        desc,
        desc.dtype,
        desc.batch * desc.heads,
        AttentionBackwardDesc::accesses,
        |start, len| {
            let (q_at, kv_at) = (start * q_each, start * kv_each);
            Ok(AttentionBackwardDesc {
                grad_output: advance(desc.grad_output, q_at, size)?,
                q: advance(desc.q, q_at, size)?,
                k: advance(desc.k, kv_at, size)?,
                v: advance(desc.v, kv_at, size)?,
                o: advance(desc.o, q_at, size)?,
                lse: advance(desc.lse, start * desc.seq_q, stat)?,
                grad_q: advance(desc.grad_q, q_at, size)?,
                grad_k: advance(desc.grad_k, kv_at, size)?,
                grad_v: advance(desc.grad_v, kv_at, size)?,
                batch: len,
                heads: 1,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by (image, channel), as a batch of one-channel images.
pub(crate) fn pool2d(mem: &Memory, desc: &Pool2dDesc) -> Result<Option<Vec<Pool2dDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let [n, c, h, w] = desc.input_shape;
    let [_, _, oh, ow] = desc.output_shape;
    split(
        mem,
        desc,
        desc.dtype,
        n * c,
        Pool2dDesc::accesses,
        |start, len| {
            Ok(Pool2dDesc {
                input: advance(desc.input, start * h * w, size)?,
                input_shape: [len, 1, h, w],
                output: advance(desc.output, start * oh * ow, size)?,
                output_shape: [len, 1, oh, ow],
                indices: desc
                    .indices
                    .map(|p| advance(p, start * oh * ow, 8))
                    .transpose()?,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by planes, when its operands are larger than a binding.
pub(crate) fn pool2d_backward(
    mem: &Memory,
    desc: &Pool2dBackwardDesc,
) -> Result<Option<Vec<Pool2dBackwardDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let [n, c, h, w] = desc.input_shape;
    let [_, _, oh, ow] = desc.grad_shape;
    split(
        mem,
        desc,
        desc.dtype,
        n * c,
        Pool2dBackwardDesc::accesses,
        |start, len| {
            Ok(Pool2dBackwardDesc {
                grad: advance(desc.grad, start * oh * ow, size)?,
                grad_shape: [len, 1, oh, ow],
                indices: desc
                    .indices
                    .map(|p| advance(p, start * oh * ow, 8))
                    .transpose()?,
                output: advance(desc.output, start * h * w, size)?,
                input_shape: [len, 1, h, w],
                ..desc.clone()
            })
        },
    )
}

/// `desc` as fills of pieces, when its output is larger than a piece.
pub(crate) fn fill(mem: &Memory, desc: &FillDesc) -> Result<Option<Vec<FillDesc>>> {
    let limit = mem.binding_limit();
    let size = desc.dtype.size_in_bytes();
    each(ranges(limit, desc.len, size), |start, len| {
        Ok(FillDesc {
            ptr: advance(desc.ptr, start, size)?,
            len,
            ..desc.clone()
        })
    })
}

/// `desc` as random fills of pieces, each with the stream element it starts at, when its output is
/// larger than a piece.
pub(crate) fn random(mem: &Memory, desc: &RandomDesc) -> Result<Option<Vec<(u64, RandomDesc)>>> {
    let limit = mem.binding_limit();
    let size = desc.dtype.size_in_bytes();
    let widest = math_size(mem, desc.dtype, &desc.accesses()?);
    each(ranges(limit, desc.len, widest), |start, len| {
        let ptr = advance(desc.ptr, start, size)?;
        Ok((start as u64, RandomDesc { ptr, len, ..*desc }))
    })
}

/// `desc` as casts of pieces: by elements when its input is dense, else by the leading dim.
pub(crate) fn cast(mem: &Memory, desc: &CastDesc) -> Result<Option<Vec<CastDesc>>> {
    let limit = mem.binding_limit();
    let n = desc.input.layout.numel();
    let (from, to) = (
        desc.src_dtype.size_in_bytes(),
        desc.dst_dtype.size_in_bytes(),
    );
    if dense(&desc.input, n) {
        return each(ranges(limit, n, from.max(to)), |start, len| {
            Ok(CastDesc {
                input: part(&desc.input, from, start, len)?,
                output: advance(desc.output, start, to)?,
                ..desc.clone()
            })
        });
    }
    let shape = desc.input.layout.shape();
    let Some(&lead) = shape.first() else {
        return Ok(None);
    };
    let step = per_lead(shape);
    // Casts take every dtype as it is: F32 stands for no widening.
    split(
        mem,
        desc,
        DType::F32,
        lead,
        CastDesc::accesses,
        |start, len| {
            Ok(CastDesc {
                input: leading(&desc.input, start, len)?,
                output: advance(desc.output, start * step, to)?,
                ..desc.clone()
            })
        },
    )
}

/// `desc` as copies of pieces: by elements when both views are dense, else by tiles ([`tiles`]).
pub(crate) fn copy(mem: &Memory, desc: &CopyDesc) -> Result<Option<Vec<CopyDesc>>> {
    let limit = mem.binding_limit();
    let n = desc.src.layout.numel();
    let size = desc.dtype.size_in_bytes();
    if dense(&desc.src, n) && dense(&desc.dst, n) {
        return each(ranges(limit, n, size), |start, len| {
            Ok(CopyDesc {
                src: part(&desc.src, size, start, len)?,
                dst: part(&desc.dst, size, start, len)?,
                ..desc.clone()
            })
        });
    }
    tiles(mem, desc)
}

/// `desc`, a copy between strided views, cut into the fewest tiles that each fit: blocks of the
/// dim along which the source's stride is largest and of the one along which the destination's
/// is (one dim when they are the same), as a transposing copy needs (either dim alone leaves the
/// other view spanning nearly all of its tensor). `None` when the copy fits whole or no tiles fit.
fn tiles(mem: &Memory, desc: &CopyDesc) -> Result<Option<Vec<CopyDesc>>> {
    let acc = desc.accesses()?;
    if mem.fits(&acc, 1) {
        return Ok(None);
    }
    let shape = desc.src.layout.shape();
    let widest = |view: &StridedBuf| {
        (0..shape.len())
            .filter(|&d| shape[d] > 1)
            .max_by_key(|&d| view.layout.strides()[d])
    };
    let (Some(a), Some(b)) = (widest(&desc.src), widest(&desc.dst)) else {
        return Ok(None);
    };
    let tile = |ra: (usize, usize), rb: (usize, usize)| -> Result<CopyDesc> {
        let narrow = |view: &StridedBuf| -> Result<StridedBuf> {
            let view = narrowed(view, a, ra.0, ra.1)?;
            if a == b {
                return Ok(view);
            }
            narrowed(&view, b, rb.0, rb.1)
        };
        Ok(CopyDesc {
            src: narrow(&desc.src)?,
            dst: narrow(&desc.dst)?,
            ..desc.clone()
        })
    };
    let (cuts_a, cuts_b) = (cuts(shape[a]), cuts(if a == b { 1 } else { shape[b] }));
    let mut candidates: Vec<(Cut, Cut)> = cuts_a
        .iter()
        .flat_map(|&ca| cuts_b.iter().map(move |&cb| (ca, cb)))
        .collect();
    candidates.sort_by_key(|(ca, cb)| ca.count().saturating_mul(cb.count()));
    for (ca, cb) in candidates {
        let each_tile = || {
            ca.ranges()
                .flat_map(move |ra| cb.ranges().map(move |rb| (ra, rb)))
        };
        if all_fit(each_tile(), |(ra, rb)| {
            Ok(mem.fits(&tile(ra, rb)?.accesses()?, 1))
        })? {
            return each_tile()
                .map(|(ra, rb)| tile(ra, rb))
                .collect::<Result<_>>()
                .map(Some);
        }
    }
    Ok(None)
}

/// `desc` as unary ops on pieces: by elements when its input is dense, else by the leading dim.
pub(crate) fn unary(mem: &Memory, desc: &UnaryDesc) -> Result<Option<Vec<UnaryDesc>>> {
    let limit = mem.binding_limit();
    let n = desc.input.layout.numel();
    let size = desc.dtype.size_in_bytes();
    if dense(&desc.input, n) {
        let widest = math_size(mem, desc.dtype, &desc.accesses()?);
        return each(ranges(limit, n, widest), |start, len| {
            Ok(UnaryDesc {
                input: part(&desc.input, size, start, len)?,
                output: advance(desc.output, start, size)?,
                ..desc.clone()
            })
        });
    }
    let shape = desc.input.layout.shape();
    let Some((&lead, rest)) = shape.split_first() else {
        return Ok(None);
    };
    let per_lead: usize = rest.iter().product();
    split(
        mem,
        desc,
        desc.dtype,
        lead,
        UnaryDesc::accesses,
        |start, len| {
            Ok(UnaryDesc {
                input: leading(&desc.input, start, len)?,
                output: advance(desc.output, start * per_lead, size)?,
                ..desc.clone()
            })
        },
    )
}

/// `desc` as binary ops on pieces: by elements when both inputs are dense views of the output's
/// element count (or `rhs` a scalar), else by the output's leading dim (a broadcast operand, and a
/// scalar, keeps its place).
pub(crate) fn binary(mem: &Memory, desc: &BinaryDesc) -> Result<Option<Vec<BinaryDesc>>> {
    let limit = mem.binding_limit();
    let n = desc.lhs.layout.numel();
    let size = desc.dtype.size_in_bytes();
    if dense(&desc.lhs, n) && desc.rhs.view().is_none_or(|rhs| dense(rhs, n)) {
        let widest = math_size(mem, desc.dtype, &desc.accesses()?);
        return each(ranges(limit, n, widest), |start, len| {
            Ok(BinaryDesc {
                lhs: part(&desc.lhs, size, start, len)?,
                rhs: desc.rhs.map_view(|v| part(v, size, start, len))?,
                output: advance(desc.output, start, size)?,
                ..desc.clone()
            })
        });
    }
    let shape = desc.lhs.layout.shape();
    let Some((&lead, rest)) = shape.split_first() else {
        return Ok(None);
    };
    let per_lead: usize = rest.iter().product();
    split(
        mem,
        desc,
        desc.dtype,
        lead,
        BinaryDesc::accesses,
        |start, len| {
            Ok(BinaryDesc {
                lhs: leading(&desc.lhs, start, len)?,
                rhs: desc.rhs.map_view(|v| leading(v, start, len))?,
                output: advance(desc.output, start * per_lead, size)?,
                ..desc.clone()
            })
        },
    )
}

/// `desc`, a reduction along a dim other than the leading one, as one reduction of a rank less per
/// index of its leading dim; `InvalidArgument` for a reduction along the leading dim, which its
/// caller runs in two passes instead (`two_pass.rs`).
pub(crate) fn reduce_by_index(desc: &ReduceDesc) -> Result<Vec<ReduceDesc>> {
    let shape = desc.input.layout.shape();
    let size = desc.op.output_dtype(desc.dtype).size_in_bytes();
    // Output elements per leading index: the product of the dims kept but the first.
    let per_lead: usize = (1..shape.len())
        .filter(|&d| d != desc.axis)
        .map(|d| shape[d])
        .product();
    if desc.axis == 0 {
        return Err(BackendError::invalid(
            "reduce",
            "a reduction along the leading dim is not cut by leading index",
        ));
    }
    by_index("reduce", shape.len(), shape[0], |i| {
        Ok(ReduceDesc {
            input: without_dim(&desc.input, 0, i)?,
            axis: desc.axis - 1,
            output: advance(desc.output, i * per_lead, size)?,
            ..desc.clone()
        })
    })
}

/// `desc` as one binary op of a rank less per index of its output's leading dim (a broadcast
/// operand, of stride 0 there, gives the same view to each).
pub(crate) fn binary_by_index(desc: &BinaryDesc) -> Result<Vec<BinaryDesc>> {
    let shape = desc.lhs.layout.shape();
    let (size, step) = (desc.dtype.size_in_bytes(), per_lead(shape));
    by_index(
        "binary",
        shape.len(),
        shape.first().copied().unwrap_or(1),
        |i| {
            Ok(BinaryDesc {
                lhs: without_dim(&desc.lhs, 0, i)?,
                rhs: desc.rhs.map_view(|v| without_dim(v, 0, i))?,
                output: advance(desc.output, i * step, size)?,
                ..desc.clone()
            })
        },
    )
}

/// `desc` as one copy of a rank less per index of the views' leading dim.
pub(crate) fn copy_by_index(desc: &CopyDesc) -> Result<Vec<CopyDesc>> {
    let shape = desc.src.layout.shape();
    by_index(
        "copy",
        shape.len(),
        shape.first().copied().unwrap_or(1),
        |i| {
            Ok(CopyDesc {
                src: without_dim(&desc.src, 0, i)?,
                dst: without_dim(&desc.dst, 0, i)?,
                ..desc.clone()
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::webgpu::memory::BindingLimit;
    use crate::dtype::DType;

    const LIMIT: BindingLimit = BindingLimit {
        bytes: 1 << 20,
        align: 256,
    };

    #[test]
    fn pieces_cover_every_element_once_and_each_fits_a_binding() {
        for n in [1, 1023, 262_144, 300_001, 1 << 22] {
            let size = DType::F32.size_in_bytes();
            let step = piece_len(LIMIT, size);
            assert!((step * size) as u64 + 2 * LIMIT.align + 8 <= LIMIT.bytes);
            match ranges(LIMIT, n, size) {
                None => assert!(n <= step),
                Some(r) => {
                    let mut next = 0;
                    for (start, len) in r {
                        assert_eq!(start, next);
                        assert!(len > 0 && len <= step);
                        next = start + len;
                    }
                    assert_eq!(next, n);
                }
            }
        }
    }

    #[test]
    fn blocks_are_the_fewest_that_fit_down_to_single_indices_of_any_total() {
        // Ranges of at most `most` pass.
        let upto = |most: usize| move |_: usize, len: usize| Ok(len <= most);
        let lens =
            |r: Option<Vec<(usize, usize)>>| r.map(|r| r.iter().map(|b| b.1).collect::<Vec<_>>());
        // Three indices, pairs too large: single ones (the doubling alone would stop at 2 parts).
        assert_eq!(lens(blocks(3, upto(1)).unwrap()), Some(vec![1, 1, 1]));
        assert_eq!(lens(blocks(5, upto(1)).unwrap()), Some(vec![1; 5]));
        assert_eq!(lens(blocks(5, upto(2)).unwrap()), Some(vec![2, 2, 1]));
        assert_eq!(
            lens(blocks(37, upto(10)).unwrap()),
            Some(vec![10, 10, 10, 7])
        );
        assert_eq!(lens(blocks(8, upto(4)).unwrap()), Some(vec![4, 4]));
        // Even one index too large, or nothing to split: none.
        assert_eq!(blocks(3, upto(0)).unwrap(), None);
        assert_eq!(blocks(0, upto(1)).unwrap(), None);
        // Every range is offered to `fits` at its own start.
        let starts = std::cell::RefCell::new(Vec::new());
        let fits = |start: usize, len: usize| {
            starts.borrow_mut().push(start);
            Ok(len <= 2)
        };
        blocks(5, fits).unwrap();
        assert!(
            starts.borrow().ends_with(&[0, 2, 4]),
            "{:?}",
            starts.borrow()
        );
    }

    #[test]
    fn cuts_run_from_the_whole_to_single_indices() {
        let lens = |total| {
            cuts(total)
                .iter()
                .map(|c| c.ranges().map(|r| r.1).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        assert_eq!(lens(0), vec![vec![0]]);
        assert_eq!(lens(1), vec![vec![1]]);
        assert_eq!(
            lens(5),
            vec![vec![5], vec![3, 2], vec![2, 2, 1], vec![1; 5]]
        );
        for total in [2, 3, 7, 64, 1000] {
            for cut in cuts(total) {
                let ranges: Vec<_> = cut.ranges().collect();
                assert_eq!(ranges.len(), cut.count());
                assert_eq!(ranges.iter().map(|r| r.1).sum::<usize>(), total);
                assert!(ranges.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
                assert_eq!(ranges.iter().map(|r| r.1).max(), Some(cut.longest()));
            }
        }
        // A long dim's cuts are a few numbers each, not its ranges.
        assert_eq!(cuts(1 << 40).len(), 41);
    }

    #[test]
    fn offsets_of_transposed_operands_swap_rows_and_columns() {
        assert_eq!(op_offset(Transpose::No, 10, 3, 2).unwrap(), 23);
        assert_eq!(op_offset(Transpose::Yes, 10, 3, 2).unwrap(), 32);
        assert!(op_offset(Transpose::No, usize::MAX, 1, 2).is_err());
    }

    #[test]
    fn gemm_pieces_start_where_their_blocks_do_and_accumulate_after_the_first() {
        let desc = GemmDesc {
            dtype: DType::F32,
            trans_a: Transpose::Yes,
            trans_b: Transpose::No,
            m: 6,
            n: 5,
            k: 7,
            alpha: 2.0,
            a: DevicePtr(1 << 20),
            lda: 8,
            b: DevicePtr(2 << 20),
            ldb: 9,
            beta: 0.5,
            c: DevicePtr(3 << 20),
            ldc: 10,
        };
        let piece = gemm_piece(&desc, [(2, 4), (1, 3), (4, 3)]).unwrap();
        // op(A)[2, 4] = A[4, 2] (transposed): 4 + 2·8; op(B)[4, 1]: 4 + 1·9; C[2, 1]: 2 + 1·10.
        assert_eq!(piece.a, DevicePtr((1 << 20) + 4 * 20));
        assert_eq!(piece.b, DevicePtr((2 << 20) + 4 * 13));
        assert_eq!(piece.c, DevicePtr((3 << 20) + 4 * 12));
        assert_eq!((piece.m, piece.n, piece.k, piece.beta), (4, 3, 3, 1.0));
        let first = gemm_piece(&desc, [(0, 6), (0, 5), (0, 4)]).unwrap();
        assert_eq!((first.a, first.beta, first.k), (desc.a, 0.5, 4));
    }
}
