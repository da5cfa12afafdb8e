//! Normalisations one of whose independent parts is larger than one storage binding — a softmax
//! slice, a layer-norm row, an image in batch norm — which no cut into parts can fit
//! (`pieces.rs`, `two_pass.rs`).
//!
//! - **Batch norm in inference** is elementwise once the statistics are known: each image runs by
//!   blocks of its channels, and a channel larger than a binding by ranges of its positions.
//! - **Batch norm in training** takes each channel's statistics over every image, but channels are
//!   independent: blocks of channels are copied out of every image into a dense scratch tensor,
//!   normalised there (in two passes where that is still past a binding) and copied back.
//! - **Softmax, log-softmax, their gradients and layer norm** of such a slice are composed of ops
//!   that cut themselves as far as needed: the slice's maximum (or mean and variance, or the
//!   gradient's sum) by a reduction, then
//!   broadcasting elementwise ops. They run in f32: a 16-bit slice is cast to an f32 copy first and
//!   the result rounded once, so no intermediate is rounded to 16 bits.
//!
//! - **Pooling** with a window of more taps than a launch takes within the loop budget
//!   (`loops.rs`) runs as a pass along rows (a window of one row) into a scratch tensor, then a pass
//!   along its columns (a window of one column): a maximum of maxima, or (a window's sum being the
//!   sum of its rows' sums, and its count the product of its real rows and columns) an average of
//!   averages, in f32 for 16-bit averages.
//!
//! Softmax, log-softmax, their gradients and layer norm are composed so too when their rows are longer than a launch
//! takes within the loop budget, their reductions then cut into blocks of the row (`two_pass.rs`).
//!
//! Each costs extra passes over the data (and, for 16-bit and training, copies), which only ops too
//! large for one binding, or for one launch, pay.

use crate::compute::{
    BatchNormDesc, BinaryDesc, BinaryOp, CastDesc, ComputeBackend, CopyDesc, DevicePtr, FillDesc,
    LayerNormDesc, Pool2dDesc, PoolKind, ReduceDesc, ReduceOp, SoftmaxBackwardDesc, SoftmaxDesc,
    StridedBuf, Temporaries, UnaryDesc, UnaryOp, Value,
};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::Layout;

use super::super::loops;
use super::super::WebGpuBackend;
use super::cuts::{advance, blocks};

/// The typed error for a part no cut fits.
fn too_large(op: &'static str, what: &str) -> BackendError {
    BackendError::FeatureUnavailable {
        feature: "ops spanning more than one storage binding",
        reason: format!("{op}: {what} takes more than a storage binding; run it on smaller views"),
    }
}

/// `desc` (with statistics given) restricted to channels `c0..c0 + cb` of image `image`, and to
/// positions `s0..s0 + sn` of them.
fn channel_block(
    desc: &BatchNormDesc,
    image: usize,
    (c0, cb): (usize, usize),
    (s0, sn): (usize, usize),
) -> Result<BatchNormDesc> {
    let size = desc.dtype.size_in_bytes();
    let at = (image * desc.channels + c0) * desc.spatial + s0;
    let stat = |p: Option<DevicePtr>| p.map(|p| advance(p, c0, size)).transpose();
    let saved_size = crate::compute::stats_dtype(desc.dtype).size_in_bytes();
    let saved = |p: Option<DevicePtr>| p.map(|p| advance(p, c0, saved_size)).transpose();
    Ok(BatchNormDesc {
        input: advance(desc.input, at, size)?,
        output: advance(desc.output, at, size)?,
        batch: 1,
        channels: cb,
        spatial: sn,
        weight: stat(desc.weight)?,
        bias: stat(desc.bias)?,
        running_mean: stat(desc.running_mean)?,
        running_var: stat(desc.running_var)?,
        saved_mean: saved(desc.saved_mean)?,
        saved_invstd: saved(desc.saved_invstd)?,
        ..desc.clone()
    })
}

/// `desc`, batch norm in inference one image of which is larger than a binding: each image by
/// blocks of channels, a channel larger than a binding by ranges of its positions.
pub(crate) fn batch_norm_inference(be: &WebGpuBackend, desc: &BatchNormDesc) -> Result<()> {
    let fits = |d: &BatchNormDesc| be.fits(&d.accesses()?, d.dtype, 1);
    let (c, s) = (desc.channels, desc.spatial);
    for image in 0..desc.batch {
        let whole = (0, s);
        let fitting = blocks(c, |c0, cb| {
            fits(&channel_block(desc, image, (c0, cb), whole)?)
        })?;
        if let Some(ranges) = fitting {
            for channels in ranges {
                be.batch_norm(&channel_block(desc, image, channels, whole)?)?;
            }
            continue;
        }
        for channel in 0..c {
            let one = (channel, 1);
            let ranges = blocks(s, |s0, sn| {
                fits(&channel_block(desc, image, one, (s0, sn))?)
            })?
            .ok_or_else(|| too_large("batch_norm", "one position of one channel"))?;
            for positions in ranges {
                be.batch_norm(&channel_block(desc, image, one, positions)?)?;
            }
        }
    }
    Ok(())
}

/// `desc`, batch norm in training one image of which is larger than a binding, by blocks of
/// channels (each image's block of which fits a binding with copies `widen` times larger): each
/// block copied out of every image into a dense scratch tensor, normalised in training there, and
/// copied back.
pub(crate) fn batch_norm_training(
    be: &WebGpuBackend,
    desc: &BatchNormDesc,
    widen: usize,
) -> Result<()> {
    let (n, c, s) = (desc.batch, desc.channels, desc.spatial);
    let whole = (0, s);
    let ranges = blocks(c, |c0, cb| {
        let block = channel_block(desc, 0, (c0, cb), whole)?;
        be.fits(&block.regions()?, desc.dtype, widen)
    })?
    .ok_or_else(|| too_large("batch_norm", "one channel of one image"))?;
    let size = desc.dtype.size_in_bytes();
    let longest = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let temps = Temporaries::new(be);
    let (xs, ys) = (
        temps.alloc(n * longest * s * size)?,
        temps.alloc(n * longest * s * size)?,
    );
    for (c0, cb) in ranges {
        // The block in every image: images `c · s` apart, its channels `s` apart.
        let view = |ptr: DevicePtr| -> Result<StridedBuf> {
            Ok(StridedBuf {
                ptr,
                layout: Layout::new(vec![n, cb, s], vec![c * s, s, 1], c0 * s)?,
            })
        };
        let dense = |ptr: DevicePtr| StridedBuf::contiguous(ptr, &[n, cb, s]);
        be.copy_strided(&CopyDesc {
            dtype: desc.dtype,
            src: view(desc.input)?,
            dst: dense(xs),
        })?;
        let stats = channel_block(desc, 0, (c0, cb), whole)?;
        be.batch_norm(&BatchNormDesc {
            input: xs,
            output: ys,
            batch: n,
            ..stats
        })?;
        be.copy_strided(&CopyDesc {
            dtype: desc.dtype,
            src: dense(ys),
            dst: view(desc.output)?,
        })?;
    }
    Ok(())
}

/// Device scratch for one composed op: f32 buffers of the slice's size, and scalars.
struct Work<'a> {
    be: &'a WebGpuBackend,
    temps: Temporaries<'a, WebGpuBackend>,
}

impl<'a> Work<'a> {
    fn new(be: &'a WebGpuBackend) -> Self {
        Work {
            be,
            temps: Temporaries::new(be),
        }
    }

    /// A fresh f32 buffer of `len` elements.
    fn f32s(&self, len: usize) -> Result<DevicePtr> {
        self.temps.alloc(len * 4)
    }

    /// `len` elements of `dtype` at `ptr` as f32: themselves for f32, else cast into `scratch`.
    fn as_f32(&self, dtype: DType, ptr: DevicePtr, len: usize, scratch: DevicePtr) -> Result<()> {
        if dtype == DType::F32 && ptr == scratch {
            return Ok(());
        }
        self.be.cast(&CastDesc {
            src_dtype: dtype,
            dst_dtype: DType::F32,
            input: StridedBuf::contiguous(ptr, &[len]),
            output: scratch,
        })
    }

    /// The reduction `op` of the f32 matrix `[rows, cols]` at `ptr` along its rows (axis 0), into
    /// `[cols]` at `out`.
    fn reduce_rows(
        &self,
        op: ReduceOp,
        ptr: DevicePtr,
        shape: [usize; 2],
        out: DevicePtr,
    ) -> Result<()> {
        self.be.reduce(&ReduceDesc {
            op,
            dtype: DType::F32,
            input: StridedBuf::contiguous(ptr, &shape),
            axis: 0,
            output: out,
        })
    }

    /// `output = op(lhs, row)` over the f32 matrix `shape` at `lhs`, `row` (`[cols]`) broadcast
    /// down its rows.
    fn with_row(
        &self,
        op: BinaryOp,
        lhs: DevicePtr,
        row: DevicePtr,
        shape: [usize; 2],
        output: DevicePtr,
    ) -> Result<()> {
        self.be.binary(&BinaryDesc {
            op,
            dtype: DType::F32,
            lhs: StridedBuf::contiguous(lhs, &shape),
            rhs: Value::Tensor(StridedBuf {
                ptr: row,
                layout: Layout::new(shape.to_vec(), vec![0, 1], 0)?,
            }),
            output,
        })
    }

    /// `op` of the f32 elements `len` at `ptr`, in place.
    fn unary_in_place(&self, op: UnaryOp, ptr: DevicePtr, len: usize) -> Result<()> {
        self.be.unary(&UnaryDesc {
            op,
            dtype: DType::F32,
            input: StridedBuf::contiguous(ptr, &[len]),
            output: ptr,
        })
    }

    /// Rounds the f32 elements `len` at `f32` into `output` of `dtype` (nothing for f32 in place).
    fn round_into(
        &self,
        f32: DevicePtr,
        len: usize,
        dtype: DType,
        output: DevicePtr,
    ) -> Result<()> {
        if dtype == DType::F32 && f32 == output {
            return Ok(());
        }
        self.be.cast(&CastDesc {
            src_dtype: DType::F32,
            dst_dtype: dtype,
            input: StridedBuf::contiguous(f32, &[len]),
            output,
        })
    }
}

/// `desc`, a softmax or log-softmax one outer slice of which is larger than a binding, slice by
/// slice: the maximum along the axis, `t = x - max`, `e = exp(t)`, its sum along the axis, then
/// `e / sum` (or `t - log(sum)`), in f32.
pub(crate) fn softmax(be: &WebGpuBackend, desc: &SoftmaxDesc) -> Result<()> {
    let shape = [desc.axis_len, desc.inner];
    let len = desc.axis_len * desc.inner;
    let size = desc.dtype.size_in_bytes();
    let work = Work::new(be);
    let native = desc.dtype == DType::F32;
    let x32 = if native { None } else { Some(work.f32s(len)?) };
    let t = work.f32s(len)?;
    let exps = if desc.log {
        Some(work.f32s(len)?)
    } else {
        None
    };
    let (max, sum) = (work.f32s(desc.inner)?, work.f32s(desc.inner)?);
    for outer in 0..desc.outer {
        let input = advance(desc.input, outer * len, size)?;
        let output = advance(desc.output, outer * len, size)?;
        let x = match x32 {
            Some(scratch) => {
                work.as_f32(desc.dtype, input, len, scratch)?;
                scratch
            }
            None => input,
        };
        // Softmax in f32 works in the output itself; log-softmax keeps `t` beside the exps.
        let t = if native && !desc.log { output } else { t };
        work.reduce_rows(ReduceOp::Max, x, shape, max)?;
        work.with_row(BinaryOp::Sub, x, max, shape, t)?;
        let e = exps.unwrap_or(t);
        work.be.unary(&UnaryDesc {
            op: UnaryOp::Exp,
            dtype: DType::F32,
            input: StridedBuf::contiguous(t, &[len]),
            output: e,
        })?;
        work.reduce_rows(ReduceOp::Sum, e, shape, sum)?;
        if desc.log {
            work.unary_in_place(UnaryOp::Log, sum, desc.inner)?;
            work.with_row(BinaryOp::Sub, t, sum, shape, t)?;
        } else {
            work.with_row(BinaryOp::Div, e, sum, shape, e)?;
        }
        let result = if desc.log { t } else { e };
        work.round_into(result, len, desc.dtype, output)?;
    }
    Ok(())
}

/// `desc`, a softmax or log-softmax gradient one outer slice of which is larger than a binding (or
/// whose rows are past the loop budget), slice by slice in f32: `s = Σ g·y` (or `Σ g`) along the
/// axis, then `y · (g − s)` (or `g − exp(y) · s`).
pub(crate) fn softmax_backward(be: &WebGpuBackend, desc: &SoftmaxBackwardDesc) -> Result<()> {
    let shape = [desc.axis_len, desc.inner];
    let len = desc.axis_len * desc.inner;
    let size = desc.dtype.size_in_bytes();
    let work = Work::new(be);
    let native = desc.dtype == DType::F32;
    let (g32, y32) = if native {
        (None, None)
    } else {
        (Some(work.f32s(len)?), Some(work.f32s(len)?))
    };
    let t = work.f32s(len)?;
    let sum = work.f32s(desc.inner)?;
    let mul = |lhs: DevicePtr, rhs: DevicePtr, output: DevicePtr| {
        be.binary(&BinaryDesc {
            op: BinaryOp::Mul,
            dtype: DType::F32,
            lhs: StridedBuf::contiguous(lhs, &[len]),
            rhs: Value::Tensor(StridedBuf::contiguous(rhs, &[len])),
            output,
        })
    };
    for outer in 0..desc.outer {
        let at = |p: DevicePtr| advance(p, outer * len, size);
        let f32_of = |p: DevicePtr, scratch: Option<DevicePtr>| -> Result<DevicePtr> {
            let p = at(p)?;
            match scratch {
                Some(s) => {
                    work.as_f32(desc.dtype, p, len, s)?;
                    Ok(s)
                }
                None => Ok(p),
            }
        };
        let (g, y) = (f32_of(desc.grad_output, g32)?, f32_of(desc.output, y32)?);
        if desc.log {
            work.reduce_rows(ReduceOp::Sum, g, shape, sum)?;
            be.unary(&UnaryDesc {
                op: UnaryOp::Exp,
                dtype: DType::F32,
                input: StridedBuf::contiguous(y, &[len]),
                output: t,
            })?;
            work.with_row(BinaryOp::Mul, t, sum, shape, t)?;
            be.binary(&BinaryDesc {
                op: BinaryOp::Sub,
                dtype: DType::F32,
                lhs: StridedBuf::contiguous(g, &[len]),
                rhs: Value::Tensor(StridedBuf::contiguous(t, &[len])),
                output: t,
            })?;
        } else {
            mul(g, y, t)?;
            work.reduce_rows(ReduceOp::Sum, t, shape, sum)?;
            work.with_row(BinaryOp::Sub, g, sum, shape, t)?;
            mul(t, y, t)?;
        }
        work.round_into(t, len, desc.dtype, at(desc.grad_input)?)?;
    }
    Ok(())
}

/// `desc`, a layer norm one row of which is larger than a binding, row by row: the row's mean and
/// biased variance by reductions, then `(x - mean) · rsqrt(var + eps) · weight + bias`, in f32.
pub(crate) fn layer_norm(be: &WebGpuBackend, desc: &LayerNormDesc) -> Result<()> {
    let cols = desc.cols;
    let size = desc.dtype.size_in_bytes();
    let work = Work::new(be);
    let native = desc.dtype == DType::F32;
    let x32 = if native { None } else { Some(work.f32s(cols)?) };
    let y = work.f32s(cols)?;
    // The affine parameters as f32, once for every row.
    let affine = |p: Option<DevicePtr>| -> Result<Option<DevicePtr>> {
        p.map(|p| {
            let f32 = if native { p } else { work.f32s(cols)? };
            work.as_f32(desc.dtype, p, cols, f32)?;
            Ok(f32)
        })
        .transpose()
    };
    let (weight, bias) = (affine(desc.weight)?, affine(desc.bias)?);
    // Mean, then variance + eps and its reciprocal square root, as `[1]` rows.
    let (mean, scale) = (work.f32s(1)?, work.f32s(1)?);
    let eps = work.f32s(1)?;
    be.fill(&FillDesc {
        dtype: DType::F32,
        ptr: eps,
        len: 1,
        value: desc.eps,
    })?;
    let row = [1, cols];
    for r in 0..desc.rows {
        let input = advance(desc.input, r * cols, size)?;
        let output = advance(desc.output, r * cols, size)?;
        let x = match x32 {
            Some(scratch) => {
                work.as_f32(desc.dtype, input, cols, scratch)?;
                scratch
            }
            None => input,
        };
        // y = x - x[0], each scalar broadcast along the row: the moments are taken about the row's
        // first value, so that a constant row normalises to exactly 0 (a mean reduced in blocks of
        // f32 is not exactly the constant).
        let by_scalar = |op: BinaryOp, lhs: DevicePtr, scalar: DevicePtr| -> Result<()> {
            be.binary(&BinaryDesc {
                op,
                dtype: DType::F32,
                lhs: StridedBuf::contiguous(lhs, &[cols]),
                rhs: Value::Tensor(StridedBuf {
                    ptr: scalar,
                    layout: Layout::new(vec![cols], vec![0], 0)?,
                }),
                output: y,
            })
        };
        by_scalar(BinaryOp::Sub, x, x)?;
        let column = [cols, 1];
        work.reduce_rows(ReduceOp::Mean, y, column, mean)?;
        work.reduce_rows(ReduceOp::Var { correction: 0 }, y, column, scale)?;
        work.with_row(BinaryOp::Add, scale, eps, [1, 1], scale)?;
        work.unary_in_place(UnaryOp::Rsqrt, scale, 1)?;
        if let (Some(m), Some(i)) = (desc.saved_mean, desc.saved_invstd) {
            // The row's mean is the pivot (its first value) plus the mean about it.
            be.binary(&BinaryDesc {
                op: BinaryOp::Add,
                dtype: DType::F32,
                lhs: StridedBuf::contiguous(mean, &[1]),
                rhs: Value::Tensor(StridedBuf::contiguous(x, &[1])),
                output: advance(m, r, 4)?,
            })?;
            be.copy_dtod(advance(i, r, 4)?, scale, 4)?;
        }
        // y = (y - mean) · scale.
        by_scalar(BinaryOp::Sub, y, mean)?;
        by_scalar(BinaryOp::Mul, y, scale)?;
        for (op, param) in [(BinaryOp::Mul, weight), (BinaryOp::Add, bias)] {
            if let Some(p) = param {
                work.with_row(op, y, p, row, y)?;
            }
        }
        work.round_into(y, cols, desc.dtype, output)?;
    }
    Ok(())
}

/// `desc`, pooling with a window of more taps than a launch takes within the loop budget: a pass
/// along rows (a `1 × kx` window, the horizontal stride and padding) into a scratch tensor of the
/// input's rows and the output's columns, then one along its columns (a `ky × 1` window, the
/// vertical stride and padding). 16-bit averages run on f32 copies, rounded once.
/// `FeatureUnavailable` when a pass's window side alone needs more loop passes than the budget.
pub(crate) fn pool2d(be: &WebGpuBackend, desc: &Pool2dDesc) -> Result<()> {
    let [n, c, h, w] = desc.input_shape;
    let [_, _, oh, ow] = desc.output_shape;
    let [ky, kx] = desc.kernel;
    let side_fits =
        be.loops_fit(|_| loops::pool2d(1, kx))? && be.loops_fit(|_| loops::pool2d(ky, 1))?;
    if desc.indices.is_some() {
        return Err(BackendError::FeatureUnavailable {
            feature: "WebGPU loop budget",
            reason: format!(
                "max_pool2d_with_indices: the {ky} × {kx} window needs more loop passes than the \
                 budget of {}, and its positions do not compose from passes along each side",
                be.state()?.device.gpu.loop_limit
            ),
        });
    }
    if !side_fits {
        return Err(BackendError::FeatureUnavailable {
            feature: "WebGPU loop budget",
            reason: format!(
                "pool2d: a side of the {ky} × {kx} window needs more loop passes than the budget \
                 of {}; pool in stages of smaller windows",
                be.state()?.device.gpu.loop_limit
            ),
        });
    }
    let work = Work::new(be);
    let in_f32 = desc.dtype != DType::F32 && matches!(desc.kind, PoolKind::Avg { .. });
    let (dtype, size) = if in_f32 {
        (DType::F32, 4)
    } else {
        (desc.dtype, desc.dtype.size_in_bytes())
    };
    let (input, output) = if in_f32 {
        let input = work.f32s(n * c * h * w)?;
        work.as_f32(desc.dtype, desc.input, n * c * h * w, input)?;
        (input, work.f32s(n * c * oh * ow)?)
    } else {
        (desc.input, desc.output)
    };
    let rows = work.temps.alloc(n * c * h * ow * size)?;
    be.pool2d(&Pool2dDesc {
        dtype,
        input,
        output: rows,
        output_shape: [n, c, h, ow],
        kernel: [1, kx],
        stride: [1, desc.stride[1]],
        padding: [0, desc.padding[1]],
        indices: None,
        ..desc.clone()
    })?;
    be.pool2d(&Pool2dDesc {
        dtype,
        input: rows,
        input_shape: [n, c, h, ow],
        output,
        kernel: [ky, 1],
        stride: [desc.stride[0], 1],
        padding: [desc.padding[0], 0],
        indices: None,
        ..desc.clone()
    })?;
    if in_f32 {
        work.round_into(output, n * c * oh * ow, desc.dtype, desc.output)?;
    }
    Ok(())
}
