//! Ops over all of a tensor larger than one storage binding that no split into independent parts
//! fits (`pieces.rs`): a reduction along the leading dim, and batch norm in training, where each
//! output depends on elements throughout the tensor; and reductions along any dim whose rows are
//! longer than one launch takes within the loop budget (`loops.rs`).
//!
//! Both run in two passes. The leading dim (images, for batch norm; for a reduction, the reduced
//! dim, moved first) is cut into the fewest equal blocks whose accesses fit a binding (and, for a
//! reduction, whose rows a launch takes within the loop budget) ([`pieces::blocks`]); each block
//! is reduced on the device into partial results, which the host reads back and combines in f64,
//! rounding once into the output:
//! - sums and means from partial f32 sums;
//! - maxima and minima from partial extremes in the dtype (exact), a NaN anywhere giving NaN;
//! - variances from partial f32 means and biased variances, by Chan's formula;
//! - arg-reductions from each block's extreme and its index, the first block holding the overall
//!   extreme (or a NaN) winning, as the first index does in one pass;
//! - batch norm's per-channel mean and variance from each block's, which the one-pass kernel
//!   computes in training mode with momentum 1 (so that its running statistics become the
//!   block's), after which the host updates the running statistics and the device normalises
//!   block by block in inference mode with the batch's statistics (as f32).
//!
//! A reduction one index of whose leading dim is larger than a binding is first cut along dim 1,
//! whose outputs are independent, into blocks of which one leading index fits (or, where even one
//! index of dim 1 is too large, into reductions of a rank less), each then reduced as above.
//!
//! 16-bit operands of sums, means, variances and batch norm are cast to f32 block by block before
//! they are reduced or normalised, so no partial is rounded to 16 bits; their blocks are budgeted
//! for those f32 copies. The combine waits for the device and reads the partials back (one or two
//! values per output element and block): costs that only ops too large for one binding pay.

use crate::compute::{
    BatchNormDesc, CastDesc, ComputeBackend, DevicePtr, FillDesc, ReduceDesc, ReduceOp, StridedBuf,
    Temporaries,
};
use crate::dtype::DType;
use crate::dtype::{decode, decode_int, encode, encode_int};
use crate::error::{BackendError, Result};

use super::super::loops;
use super::super::WebGpuBackend;
use super::cuts::{advance, blocks, leading, narrowed, without_dim};
use super::pieces::batch_norm_images;
use crate::shape::Layout;

/// Whether `dtype` operands of a sum, mean, variance or batch norm are cast to f32 blocks first.
fn cast_first(dtype: DType) -> bool {
    dtype != DType::F32
}

/// How many times larger than its operands the f32 copies of a block of `dtype` are.
fn widen(dtype: DType) -> usize {
    if cast_first(dtype) {
        4 / dtype.size_in_bytes()
    } else {
        1
    }
}

/// `view` of `dtype` cast into `f32_buf`, as a dense f32 view of the same shape.
fn cast_to_f32(
    be: &WebGpuBackend,
    dtype: DType,
    view: StridedBuf,
    f32_buf: DevicePtr,
) -> Result<StridedBuf> {
    let shape = view.layout.shape().to_vec();
    be.cast(&CastDesc {
        src_dtype: dtype,
        dst_dtype: DType::F32,
        input: view,
        output: f32_buf,
    })?;
    Ok(StridedBuf::contiguous(f32_buf, &shape))
}

/// `values` bytes of `dtype` at `ptr`, read back and decoded as f64 (indices for I64).
pub(crate) fn read(
    be: &WebGpuBackend,
    ptr: DevicePtr,
    dtype: DType,
    values: usize,
) -> Result<Vec<f64>> {
    let size = dtype.size_in_bytes();
    let mut bytes = vec![0u8; values * size];
    be.copy_dtoh(&mut bytes, ptr)?;
    Ok(bytes
        .chunks_exact(size)
        .map(|b| match dtype {
            DType::I64 => decode_int(dtype, b) as f64,
            _ => decode(dtype, b),
        })
        .collect())
}

/// Writes `values` to `ptr` as `dtype`, each rounded once.
pub(crate) fn write(
    be: &WebGpuBackend,
    ptr: DevicePtr,
    dtype: DType,
    values: &[f64],
) -> Result<()> {
    let size = dtype.size_in_bytes();
    let mut bytes = vec![0u8; values.len() * size];
    for (v, b) in values.iter().zip(bytes.chunks_exact_mut(size)) {
        match dtype {
            DType::I64 => encode_int(dtype, *v as i64, b),
            _ => encode(dtype, *v, b),
        }
    }
    be.copy_htod(ptr, &bytes)
}

/// The reductions each block runs for `op`: f32 partial sums for sums and means, the extreme for
/// maxima and minima, mean and biased variance for variances, index and extreme for the
/// arg-reductions.
fn partial_ops(op: ReduceOp) -> &'static [ReduceOp] {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => &[ReduceOp::Sum],
        ReduceOp::Max => &[ReduceOp::Max],
        ReduceOp::Min => &[ReduceOp::Min],
        ReduceOp::Var { .. } => &[ReduceOp::Mean, ReduceOp::Var { correction: 0 }],
        ReduceOp::ArgMax => &[ReduceOp::ArgMax, ReduceOp::Max],
        ReduceOp::ArgMin => &[ReduceOp::ArgMin, ReduceOp::Min],
    }
}

/// `desc` as a reduction along its input's leading dim: the view with the reduced dim moved first,
/// the others in order (so the output, dense over them, is the same).
fn reduced_dim_first(desc: &ReduceDesc) -> Result<ReduceDesc> {
    let layout = &desc.input.layout;
    let (mut shape, mut strides) = (layout.shape().to_vec(), layout.strides().to_vec());
    let (len, stride) = (shape.remove(desc.axis), strides.remove(desc.axis));
    shape.insert(0, len);
    strides.insert(0, stride);
    Ok(ReduceDesc {
        input: StridedBuf {
            ptr: desc.input.ptr,
            layout: Layout::new(shape, strides, layout.offset())?,
        },
        axis: 0,
        ..desc.clone()
    })
}

/// `desc`, a reduction along the leading dim of an input larger than one binding, or along any dim
/// whose rows are longer than a launch takes within the loop budget, in two passes.
pub(crate) fn reduce(be: &WebGpuBackend, desc: &ReduceDesc) -> Result<()> {
    let desc = &reduced_dim_first(desc)?;
    let shape = desc.input.layout.shape();
    let lead = shape[0];
    let rest: usize = shape[1..].iter().product();
    if lead == 0
        && matches!(
            desc.op,
            ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Var { .. }
        )
    {
        // An empty reduced dim has no blocks: every output is the empty reduction's value, as the
        // row kernel gives it (0 for a sum, NaN for a mean or a variance).
        let value = if desc.op == ReduceOp::Sum {
            0.0
        } else {
            f64::NAN
        };
        return be.fill(&FillDesc {
            dtype: desc.dtype,
            ptr: desc.output,
            len: rest,
            value,
        });
    }
    let exact = matches!(
        desc.op,
        ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin
    );
    let cast = !exact && cast_first(desc.dtype);
    let widen = if cast { widen(desc.dtype) } else { 1 };
    let block_desc = |input: StridedBuf, op: ReduceOp, output: DevicePtr| ReduceDesc {
        op,
        dtype: if cast { DType::F32 } else { desc.dtype },
        input,
        axis: 0,
        output,
    };
    let Some(ranges) = blocks(lead, |start, len| {
        // The partial reductions of each block (a variance's, the heaviest, two sweeps of it)
        // within the loop budget, and its accesses within a binding.
        Ok(
            be.loops_fit(|gpu| loops::reduce(gpu.row_threads, desc.op, len))?
                && lead_fits(be, desc, leading(&desc.input, start, len)?, widen)?,
        )
    })?
    else {
        return by_columns(be, desc, widen);
    };
    let temps = Temporaries::new(be);
    let src_dtype = if cast { DType::F32 } else { desc.dtype };
    let ops = partial_ops(desc.op);
    let partials = ops
        .iter()
        .map(|op| {
            let dtype = op.output_dtype(src_dtype);
            Ok((
                dtype,
                temps.alloc(ranges.len() * rest * dtype.size_in_bytes())?,
            ))
        })
        .collect::<Result<Vec<(DType, DevicePtr)>>>()?;
    let longest = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let scratch = if cast {
        Some(temps.alloc(longest * rest * 4)?)
    } else {
        None
    };
    for (b, &(start, len)) in ranges.iter().enumerate() {
        let block = leading(&desc.input, start, len)?;
        let input = match scratch {
            Some(f32_block) => cast_to_f32(be, desc.dtype, block, f32_block)?,
            None => block,
        };
        for (&op, &(dtype, ptr)) in ops.iter().zip(&partials) {
            let row = advance(ptr, b * rest, dtype.size_in_bytes())?;
            be.reduce(&block_desc(input.clone(), op, row))?;
        }
    }
    let read_all = |i: usize| -> Result<Vec<f64>> {
        let (dtype, ptr) = partials[i];
        read(be, ptr, dtype, ranges.len() * rest)
    };
    let first = read_all(0)?;
    let second = if ops.len() > 1 {
        read_all(1)?
    } else {
        Vec::new()
    };
    let at = |values: &[f64], b: usize, j: usize| values[b * rest + j];
    let out: Vec<f64> = (0..rest)
        .map(|j| {
            let blocks = ranges.iter().enumerate();
            match desc.op {
                ReduceOp::Sum => blocks.map(|(b, _)| at(&first, b, j)).sum(),
                ReduceOp::Mean => blocks.map(|(b, _)| at(&first, b, j)).sum::<f64>() / lead as f64,
                ReduceOp::Max | ReduceOp::Min => blocks
                    .map(|(b, _)| at(&first, b, j))
                    .reduce(|best, v| {
                        let better = match desc.op {
                            ReduceOp::Max => v > best,
                            _ => v < best,
                        };
                        if best.is_nan() || v.is_nan() {
                            f64::NAN
                        } else if better {
                            v
                        } else {
                            best
                        }
                    })
                    .unwrap_or(f64::NAN),
                ReduceOp::Var { correction } => {
                    let n = lead as f64;
                    let mean = blocks
                        .clone()
                        .map(|(b, r)| r.1 as f64 * at(&first, b, j))
                        .sum::<f64>()
                        / n;
                    let squares: f64 = blocks
                        .map(|(b, r)| {
                            let d = at(&first, b, j) - mean;
                            r.1 as f64 * (at(&second, b, j) + d * d)
                        })
                        .sum();
                    squares / (n - f64::from(correction)).max(0.0)
                }
                ReduceOp::ArgMax | ReduceOp::ArgMin => {
                    let better = |v: f64, best: f64| match desc.op {
                        ReduceOp::ArgMax => v > best,
                        _ => v < best,
                    };
                    // (index, value) of the first block's extreme that no later block beats; a
                    // block whose extreme is NaN wins outright, as the first NaN does in one pass.
                    let mut best = (0.0, f64::NAN);
                    for (b, r) in blocks {
                        let (index, value) = (at(&first, b, j), at(&second, b, j));
                        if b == 0 || (!best.1.is_nan() && (value.is_nan() || better(value, best.1)))
                        {
                            best = (r.0 as f64 + index, value);
                        }
                    }
                    best.0
                }
            }
        })
        .collect();
    write(be, desc.output, desc.op.output_dtype(desc.dtype), &out)
}

/// Whether `desc` over the leading indices `input` (a block of its input) fits one binding with
/// copies `widen` times larger.
fn lead_fits(
    be: &WebGpuBackend,
    desc: &ReduceDesc,
    input: StridedBuf,
    widen: usize,
) -> Result<bool> {
    let block = ReduceDesc {
        input,
        ..desc.clone()
    };
    be.fits(&block.accesses()?, desc.dtype, widen)
}

/// `desc`, a reduction along the leading dim one index of which is larger than a binding, as
/// reductions of blocks of its dim 1 (whose outputs are independent) of which one leading index
/// fits; where not even one index of dim 1 does, as one reduction of a rank less per index of dim
/// 1. Each runs as a reduction of its own (in two passes, or cut further).
fn by_columns(be: &WebGpuBackend, desc: &ReduceDesc, widen: usize) -> Result<()> {
    let shape = desc.input.layout.shape();
    if shape.len() < 2 {
        return Err(BackendError::FeatureUnavailable {
            feature: "ops spanning more than one storage binding",
            reason: "reduce: one element of its input takes more than a storage binding".into(),
        });
    }
    let out_size = desc.op.output_dtype(desc.dtype).size_in_bytes();
    let after: usize = shape[2..].iter().product();
    let part = |input: StridedBuf, start: usize| -> Result<ReduceDesc> {
        Ok(ReduceDesc {
            input,
            output: advance(desc.output, start * after, out_size)?,
            ..desc.clone()
        })
    };
    let one_lead_fits = |start, len| {
        let block = part(narrowed(&desc.input, 1, start, len)?, start)?;
        lead_fits(be, &block, leading(&block.input, 0, 1)?, widen)
    };
    match blocks(shape[1], one_lead_fits)? {
        Some(ranges) => ranges.iter().try_for_each(|&(start, len)| {
            be.reduce(&part(narrowed(&desc.input, 1, start, len)?, start)?)
        }),
        None => {
            (0..shape[1]).try_for_each(|i| be.reduce(&part(without_dim(&desc.input, 1, i)?, i)?))
        }
    }
}

/// `desc`, batch norm in training over an input larger than one binding, in two passes: the
/// statistics from the per-channel moments of blocks of images, then inference-mode normalisation
/// of each block with them.
pub(crate) fn batch_norm(be: &WebGpuBackend, desc: &BatchNormDesc) -> Result<()> {
    let (n, c, s) = (desc.batch, desc.channels, desc.spatial);
    let size = desc.dtype.size_in_bytes();
    let cast = cast_first(desc.dtype);
    let image = c * s;
    let images = |start: usize, len: usize| -> Result<StridedBuf> {
        Ok(StridedBuf::contiguous(
            advance(desc.input, start * image, size)?,
            &[len, c, s],
        ))
    };
    // The regions of a block, whatever training would say of it alone (it refuses one value per
    // channel, which a block of one image of one position is; pass one handles such a block).
    let fits = |start, len| {
        let block = batch_norm_images(desc, start, len)?;
        be.fits(&block.regions()?, desc.dtype, widen(desc.dtype))
    };
    let Some(ranges) = blocks(n, fits)? else {
        // One image is larger than a binding: by blocks of channels.
        return super::composed::batch_norm_training(be, desc, widen(desc.dtype));
    };
    let temps = Temporaries::new(be);
    let longest = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let scratch = if cast {
        Some((
            temps.alloc(longest * image * 4)?,
            temps.alloc(longest * image * 4)?,
        ))
    } else {
        None
    };
    // The block's input as f32: itself, or cast into the first scratch buffer.
    let as_f32 = |start: usize, len: usize| -> Result<StridedBuf> {
        let block = images(start, len)?;
        match scratch {
            Some((f32_block, _)) => cast_to_f32(be, desc.dtype, block, f32_block),
            None => Ok(block),
        }
    };

    // Pass one: every block's per-channel mean and unbiased variance, by the one-pass kernel in
    // training mode with momentum 1, whose running statistics (zeroed first) thus become the
    // block's; it normalises into the output block (or the f32 scratch), which pass two overwrites.
    let block_stats = || -> Result<DevicePtr> {
        let ptr = temps.alloc(ranges.len() * c * 4)?;
        be.fill(&FillDesc {
            dtype: DType::F32,
            ptr,
            len: ranges.len() * c,
            value: 0.0,
        })?;
        Ok(ptr)
    };
    let (means, variances) = (block_stats()?, block_stats()?);
    for (b, &(start, len)) in ranges.iter().enumerate() {
        let input = as_f32(start, len)?;
        if len * s == 1 {
            // One value per channel (training refuses that): the values are the block's means,
            // its variances stay 0.
            be.copy_dtod(advance(means, b * c, 4)?, input.ptr, c * 4)?;
            continue;
        }
        let output = match scratch {
            Some((_, f32_out)) => f32_out,
            None => advance(desc.output, start * image, size)?,
        };
        be.batch_norm(&BatchNormDesc {
            dtype: DType::F32,
            input: input.ptr,
            output,
            batch: len,
            weight: None,
            bias: None,
            running_mean: Some(advance(means, b * c, 4)?),
            running_var: Some(advance(variances, b * c, 4)?),
            training: true,
            momentum: 1.0,
            // Pass two saves the batch's statistics.
            saved_mean: None,
            saved_invstd: None,
            ..desc.clone()
        })?;
    }
    let (m, u) = (
        read(be, means, DType::F32, ranges.len() * c)?,
        read(be, variances, DType::F32, ranges.len() * c)?,
    );
    // Chan's formula over the blocks, each of `len * s` values per channel; a block of one value
    // has variance 0.
    let count = (n * s) as f64;
    let (mut mean, mut var, mut unbiased) = (vec![0.0; c], vec![0.0; c], vec![0.0; c]);
    for ch in 0..c {
        let at = |values: &[f64], b: usize| values[b * c + ch];
        let weight = |len: usize| (len * s) as f64;
        let mu = ranges
            .iter()
            .enumerate()
            .map(|(b, r)| weight(r.1) * at(&m, b))
            .sum::<f64>()
            / count;
        let squares: f64 = ranges
            .iter()
            .enumerate()
            .map(|(b, r)| {
                let w = weight(r.1);
                let within = if w > 1.0 { at(&u, b) * (w - 1.0) } else { 0.0 };
                let d = at(&m, b) - mu;
                within + w * d * d
            })
            .sum();
        mean[ch] = mu;
        var[ch] = squares / count;
        unbiased[ch] = squares / (count - 1.0);
    }
    if let (Some(rm), Some(rv)) = (desc.running_mean, desc.running_var) {
        for (ptr, stat) in [(rm, &mean), (rv, &unbiased)] {
            let old = read(be, ptr, desc.dtype, c)?;
            let new: Vec<f64> = old
                .iter()
                .zip(stat.iter())
                .map(|(o, x)| (1.0 - desc.momentum) * o + desc.momentum * x)
                .collect();
            write(be, ptr, desc.dtype, &new)?;
        }
    }

    // Pass two: inference-mode normalisation of each block, in f32, with the batch's statistics.
    let stats = temps.alloc(2 * c * 4)?;
    write(be, stats, DType::F32, &[mean, var].concat())?;
    let affine = |p: Option<DevicePtr>| -> Result<Option<DevicePtr>> {
        match (p, cast) {
            (Some(p), true) => {
                let view = StridedBuf::contiguous(p, &[c]);
                Ok(Some(
                    cast_to_f32(be, desc.dtype, view, temps.alloc(c * 4)?)?.ptr,
                ))
            }
            _ => Ok(p),
        }
    };
    let (weight, bias) = (affine(desc.weight)?, affine(desc.bias)?);
    for &(start, len) in &ranges {
        let input = as_f32(start, len)?;
        let output = advance(desc.output, start * image, size)?;
        let normalised = scratch.map_or(output, |(_, f32_out)| f32_out);
        be.batch_norm(&BatchNormDesc {
            dtype: DType::F32,
            input: input.ptr,
            output: normalised,
            batch: len,
            weight,
            bias,
            running_mean: Some(stats),
            running_var: Some(advance(stats, c, 4)?),
            training: false,
            ..desc.clone()
        })?;
        if cast {
            be.cast(&CastDesc {
                src_dtype: DType::F32,
                dst_dtype: desc.dtype,
                input: StridedBuf::contiguous(normalised, &[len * image]),
                output,
            })?;
        }
    }
    Ok(())
}
