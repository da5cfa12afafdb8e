//! Ops over operands larger than one storage binding, run in pieces that each fit one.
//!
//! A kernel sees at most a binding's worth of each allocation ([`super::memory`]). Fill, cast,
//! copy, unary and binary ops whose operands are all dense views of the same element count (no
//! broadcasting) are the same op on any contiguous range of elements, and a random fill is too once
//! each piece starts at its place in the stream, so when an operand is larger than a piece they run
//! as consecutive ops over ranges that each fit.
//!
//! Ops made of independent parts split along the dim of those parts instead ([`split`]): softmax
//! by outer slices, layer norm by rows, a reduction by its leading dim (when it reduces another),
//! Adam and the loss scaler's unscale by elements, a GEMM by column blocks of C, else row blocks, a
//! GEMV by rows, a batched GEMM by batch, conv2d by image (also to keep its grid within the
//! device's), attention by (batch, head), pooling by (image, channel) and batch norm in inference by
//! image; each into the fewest equal parts whose accesses fit, trying 2, 4, 8, ... parts (so an op
//! no split can fit costs a search over its dim before it is refused). A reduction of the leading
//! dim and batch norm in training run in two passes instead (`two_pass.rs`). Other ops on such
//! operands (a single image, head or row larger than a binding) answer `FeatureUnavailable` from the
//! window check.
//!
//! Pieces are budgeted for the copies their op runs on ([`Memory::widening`]): their own size where
//! the kernels take the dtype natively, twice that for 16-bit operands staged through f32.

use crate::compute::{
    Accesses, AdamDesc, AttentionDesc, BatchNormDesc, BatchedGemmDesc, BinaryDesc, CastDesc,
    Conv2dDesc, CopyDesc, DevicePtr, FillDesc, GemmDesc, GemvDesc, LayerNormDesc, Pool2dDesc,
    RandomDesc, ReduceDesc, SoftmaxDesc, StridedBuf, Transpose, UnaryDesc, UnscaleDesc,
};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::Layout;

use super::memory::{BindingLimit, Memory};

/// Elements of `widest` bytes per piece: a binding's worth, less room for a window that starts up
/// to one alignment before its piece and ends on a whole word, in multiples of 1024 elements.
fn piece_len(limit: BindingLimit, widest: usize) -> usize {
    let room = limit.bytes.saturating_sub(2 * limit.align + 8) / widest as u64;
    ((room as usize) / 1024 * 1024).max(1024)
}

/// The element size a math op's pieces are counted in: `size` times the op's widening
/// ([`Memory::widening`]), as 16-bit dtypes without a native kernel run on f32 copies of the piece
/// (`staging.rs`), which must fit a binding too.
fn math_size(mem: &Memory, dtype: DType, acc: &Accesses) -> usize {
    dtype.size_in_bytes() * mem.widening(dtype, acc)
}

/// `ptr` advanced by `elements` of `size` bytes; `SizeOverflow` when that wraps.
pub(crate) fn advance(ptr: DevicePtr, elements: usize, size: usize) -> Result<DevicePtr> {
    elements
        .checked_mul(size)
        .and_then(|bytes| ptr.offset(bytes))
        .ok_or_else(|| BackendError::overflow("webgpu pieces", "pointer + piece offset overflows"))
}

/// Whether `buf` is a dense view of `n` elements.
fn dense(buf: &StridedBuf, n: usize) -> bool {
    buf.layout.is_contiguous() && buf.layout.numel() == n
}

/// Elements `start..start + len` of the dense view `buf` of `size`-byte elements, as a 1-D view.
fn part(buf: &StridedBuf, size: usize, start: usize, len: usize) -> Result<StridedBuf> {
    let first = advance(buf.ptr, buf.layout.offset(), size)?;
    Ok(StridedBuf::contiguous(advance(first, start, size)?, &[len]))
}

/// The ranges `(start, len)` covering `0..n` in pieces of `widest`-byte elements, when an operand
/// of `n` such elements is larger than one piece; `None` when the op fits as it is.
fn ranges(limit: BindingLimit, n: usize, widest: usize) -> Option<Vec<(usize, usize)>> {
    let step = piece_len(limit, widest);
    (n > step).then(|| {
        (0..n)
            .step_by(step)
            .map(|start| (start, step.min(n - start)))
            .collect()
    })
}

/// The pieces `piece(start, len)` of each range, when there are ranges.
fn each<D>(
    ranges: Option<Vec<(usize, usize)>>,
    piece: impl Fn(usize, usize) -> Result<D>,
) -> Result<Option<Vec<D>>> {
    ranges
        .map(|r| {
            r.into_iter()
                .map(|(start, len)| piece(start, len))
                .collect()
        })
        .transpose()
}

/// `whole` split along a dim of `total` independent parts into the fewest equal pieces (2, 4, 8,
/// ... of them) whose accesses all fit one binding per allocation ([`Memory::fits`]), `piece(start,
/// len)` making each; `None` when `whole` fits as it is, or no split along this dim fits (the
/// launch then reports it).
fn split<D>(
    mem: &Memory,
    whole: &D,
    dtype: DType,
    total: usize,
    accesses: impl Fn(&D) -> Result<Accesses>,
    piece: impl Fn(usize, usize) -> Result<D>,
) -> Result<Option<Vec<D>>> {
    split_until(mem, whole, dtype, total, accesses, |_| true, piece)
}

/// [`split`], where a piece must also pass `launchable` (a grid that fits the device's, say).
fn split_until<D>(
    mem: &Memory,
    whole: &D,
    dtype: DType,
    total: usize,
    accesses: impl Fn(&D) -> Result<Accesses>,
    launchable: impl Fn(&D) -> bool,
    piece: impl Fn(usize, usize) -> Result<D>,
) -> Result<Option<Vec<D>>> {
    let fits = |d: &D| -> Result<bool> {
        let acc = accesses(d)?;
        Ok(launchable(d) && mem.fits(&acc, mem.widening(dtype, &acc)))
    };
    if fits(whole)? {
        return Ok(None);
    }
    let Some(ranges) = blocks(total, |start, len| fits(&piece(start, len)?))? else {
        return Ok(None);
    };
    ranges
        .into_iter()
        .map(|(start, len)| piece(start, len))
        .collect::<Result<Vec<D>>>()
        .map(Some)
}

/// The fewest equal ranges `(start, len)` covering `0..total` that each pass `fits`, trying
/// ranges of `total / 2`, `total / 4`, ... (rounded up) down to ranges of one; `None` when even
/// ranges of one do not pass (or `total` is 0).
pub(crate) fn blocks(
    total: usize,
    fits: impl Fn(usize, usize) -> Result<bool>,
) -> Result<Option<Vec<(usize, usize)>>> {
    if total == 0 {
        return Ok(None);
    }
    let mut parts = 2;
    loop {
        let step = total.div_ceil(parts);
        let ranges: Vec<(usize, usize)> = (0..total)
            .step_by(step)
            .map(|start| (start, step.min(total - start)))
            .collect();
        let mut fit = true;
        for &(start, len) in &ranges {
            fit = fit && fits(start, len)?;
        }
        if fit {
            return Ok(Some(ranges));
        }
        if step == 1 {
            return Ok(None);
        }
        parts = parts.saturating_mul(2);
    }
}

/// [`split`] of an op whose input and output hold `step` dense elements per index of the split dim
/// (at `input` and `output`): `piece(input, output, len)` makes each piece from its own pointers.
#[allow(clippy::too_many_arguments)]
fn split_io<D>(
    mem: &Memory,
    whole: &D,
    dtype: DType,
    total: usize,
    step: usize,
    (input, output): (DevicePtr, DevicePtr),
    accesses: impl Fn(&D) -> Result<Accesses>,
    piece: impl Fn(DevicePtr, DevicePtr, usize) -> D,
) -> Result<Option<Vec<D>>> {
    let size = dtype.size_in_bytes();
    split(mem, whole, dtype, total, accesses, |start, len| {
        Ok(piece(
            advance(input, start * step, size)?,
            advance(output, start * step, size)?,
            len,
        ))
    })
}

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
        |input, output, rows| LayerNormDesc {
            input,
            output,
            rows,
            ..desc.clone()
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

/// `desc` (column-major) by column blocks of C, or else by row blocks.
pub(crate) fn gemm(mem: &Memory, desc: &GemmDesc) -> Result<Option<Vec<GemmDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let by_columns = split(
        mem,
        desc,
        desc.dtype,
        desc.n,
        GemmDesc::accesses,
        |start, len| {
            // Column j of op(B): stored column j, or stored row j when B is transposed.
            let b_step = match desc.trans_b {
                Transpose::No => desc.ldb,
                Transpose::Yes => 1,
            };
            Ok(GemmDesc {
                b: advance(desc.b, start * b_step, size)?,
                c: advance(desc.c, start * desc.ldc, size)?,
                n: len,
                ..desc.clone()
            })
        },
    )?;
    let acc = desc.accesses()?;
    if by_columns.is_some() || mem.fits(&acc, mem.widening(desc.dtype, &acc)) {
        return Ok(by_columns);
    }
    split(
        mem,
        desc,
        desc.dtype,
        desc.m,
        GemmDesc::accesses,
        |start, len| {
            // Row i of op(A): stored row i, or stored column i when A is transposed.
            let a_step = match desc.trans_a {
                Transpose::No => 1,
                Transpose::Yes => desc.lda,
            };
            Ok(GemmDesc {
                a: advance(desc.a, start * a_step, size)?,
                c: advance(desc.c, start, size)?,
                m: len,
                ..desc.clone()
            })
        },
    )
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
            Ok(BatchedGemmDesc {
                gemm: GemmDesc {
                    a: advance(g.a, start * desc.stride_a, size)?,
                    b: advance(g.b, start * desc.stride_b, size)?,
                    c: advance(g.c, start * desc.stride_c, size)?,
                    ..g.clone()
                },
                batch_count: len,
                ..desc.clone()
            })
        },
    )
}

/// `desc` by image (weight and bias shared), also when its output positions need more workgroups
/// than one grid dimension of `max_groups` holds.
pub(crate) fn conv2d(
    mem: &Memory,
    desc: &Conv2dDesc,
    max_groups: u32,
) -> Result<Option<Vec<Conv2dDesc>>> {
    let size = desc.dtype.size_in_bytes();
    let [n, c, h, w] = desc.input_shape;
    let [_, k, oh, ow] = desc.output_shape;
    let launchable = |d: &Conv2dDesc| {
        let positions = d.output_shape[0] * oh * ow;
        positions.div_ceil(super::conv::TILE) <= max_groups as usize
    };
    let piece = |start: usize, len: usize| {
        Ok(Conv2dDesc {
            input: advance(desc.input, start * c * h * w, size)?,
            input_shape: [len, c, h, w],
            output: advance(desc.output, start * k * oh * ow, size)?,
            output_shape: [len, k, oh, ow],
            ..desc.clone()
        })
    };
    let accesses = Conv2dDesc::accesses;
    split_until(mem, desc, desc.dtype, n, accesses, launchable, piece)
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

/// `desc` as casts of pieces, when its input is dense and an operand is larger than a piece.
pub(crate) fn cast(mem: &Memory, desc: &CastDesc) -> Result<Option<Vec<CastDesc>>> {
    let limit = mem.binding_limit();
    let n = desc.input.layout.numel();
    let (from, to) = (
        desc.src_dtype.size_in_bytes(),
        desc.dst_dtype.size_in_bytes(),
    );
    let ranges = ranges(limit, n, from.max(to)).filter(|_| dense(&desc.input, n));
    each(ranges, |start, len| {
        Ok(CastDesc {
            input: part(&desc.input, from, start, len)?,
            output: advance(desc.output, start, to)?,
            ..desc.clone()
        })
    })
}

/// `desc` as copies of pieces, when both views are dense and larger than a piece.
pub(crate) fn copy(mem: &Memory, desc: &CopyDesc) -> Result<Option<Vec<CopyDesc>>> {
    let limit = mem.binding_limit();
    let n = desc.src.layout.numel();
    let size = desc.dtype.size_in_bytes();
    let ranges = ranges(limit, n, size).filter(|_| dense(&desc.src, n) && dense(&desc.dst, n));
    each(ranges, |start, len| {
        Ok(CopyDesc {
            src: part(&desc.src, size, start, len)?,
            dst: part(&desc.dst, size, start, len)?,
            ..desc.clone()
        })
    })
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
/// element count, else by the output's leading dim (a broadcast operand keeps its place).
pub(crate) fn binary(mem: &Memory, desc: &BinaryDesc) -> Result<Option<Vec<BinaryDesc>>> {
    let limit = mem.binding_limit();
    let n = desc.lhs.layout.numel();
    let size = desc.dtype.size_in_bytes();
    if dense(&desc.lhs, n) && dense(&desc.rhs, n) {
        let widest = math_size(mem, desc.dtype, &desc.accesses()?);
        return each(ranges(limit, n, widest), |start, len| {
            Ok(BinaryDesc {
                lhs: part(&desc.lhs, size, start, len)?,
                rhs: part(&desc.rhs, size, start, len)?,
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
                rhs: leading(&desc.rhs, start, len)?,
                output: advance(desc.output, start * per_lead, size)?,
                ..desc.clone()
            })
        },
    )
}

/// The view `buf` narrowed to indices `start..start + len` of its leading dim.
pub(crate) fn leading(buf: &StridedBuf, start: usize, len: usize) -> Result<StridedBuf> {
    let layout = &buf.layout;
    let mut shape = layout.shape().to_vec();
    shape[0] = len;
    let offset = layout.offset() + start * layout.strides()[0];
    Ok(StridedBuf {
        ptr: buf.ptr,
        layout: Layout::new(shape, layout.strides().to_vec(), offset)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
