//! Host side of the norm kernels (`kernels/norm.cu`): softmax and log-softmax and their gradient,
//! layer norm, batch norm
//! (saving their statistics where asked) and the norms' gradients.
//!
//! Each kernel gives one row (a softmax lane, a layer-norm row, a batch-norm channel) to a group of 1,
//! 32 or 256 threads, chosen by [`super::reduce::group_size`].

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::launch::{check_aligned, grid_for, suffix, to_i64};
use super::reduce::{group_launch, group_size};
use super::Gpu;
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::{
    stats_dtype, BatchNormBackwardDesc, BatchNormDesc, DevicePtr, LayerNormBackwardDesc,
    LayerNormDesc, SoftmaxBackwardDesc, SoftmaxDesc,
};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// Kernel `<kernel>_g<group>_<dtype>` of the norm module.
fn function(gpu: &Gpu, kernel: &str, group: u32, dtype: DType) -> Result<CudaFunction> {
    gpu.function_for(
        "norm",
        dtype,
        &format!("{kernel}_g{group}_{}", suffix(dtype)),
    )
}

/// An optional operand as the kernels take it: its address, or 0 (null) when absent.
fn optional(p: Option<DevicePtr>) -> u64 {
    p.map_or(0, |p| p.0)
}

/// `a · b`, `SizeOverflow` when it does not fit.
fn mul(op: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| BackendError::overflow(op, format!("{a} × {b} overflows")))
}

/// `[outer, len, inner]` as the softmax kernels take it: the lanes (`outer · inner`) and the three
/// dims as kernel arguments; `None` when there is no element, `SizeOverflow` for products that do
/// not fit.
fn lanes(
    op: &'static str,
    outer: usize,
    len: usize,
    inner: usize,
) -> Result<Option<(usize, [i64; 3])>> {
    let rows = mul(op, outer, inner)?;
    if mul(op, rows, len)? == 0 {
        return Ok(None);
    }
    let dims = [to_i64(op, outer)?, to_i64(op, len)?, to_i64(op, inner)?];
    Ok(Some((rows, dims)))
}

/// Softmax (or log-softmax) of `[outer, axis_len, inner]` along the middle dim, one group per lane.
pub(crate) fn softmax(gpu: &Gpu, d: &SoftmaxDesc) -> Result<()> {
    let op = if d.log { "log_softmax" } else { "softmax" };
    let Some((rows, [outer, len, inner])) = lanes(op, d.outer, d.axis_len, d.inner)? else {
        return Ok(());
    };
    check_aligned(op, d.dtype, &[d.input, d.output])?;
    let group = group_size(d.axis_len, rows, d.inner == 1, gpu.sm_count());
    let f = function(gpu, "softmax", group, d.dtype)?;
    let (x, y) = (d.input.0, d.output.0);
    let log = i32::from(d.log);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&x)
        .arg(&y)
        .arg(&outer)
        .arg(&len)
        .arg(&inner)
        .arg(&log);
    // SAFETY: the caller checked the dense input and output regions of `outer · len · inner` elements;
    // the arguments match `softmax_g<G>_<dtype>`'s parameters.
    unsafe { b.launch(group_launch(rows, group, gpu.sm_count())) }
        .map_err(|e| super::driver_error(op, e))?;
    Ok(())
}

/// The input gradient of softmax (or log-softmax) of `[outer, axis_len, inner]` along the middle
/// dim, one group per lane.
pub(crate) fn softmax_backward(gpu: &Gpu, d: &SoftmaxBackwardDesc) -> Result<()> {
    let op = d.name();
    let Some((rows, [outer, len, inner])) = lanes(op, d.outer, d.axis_len, d.inner)? else {
        return Ok(());
    };
    check_aligned(op, d.dtype, &[d.grad_output, d.output, d.grad_input])?;
    let group = group_size(d.axis_len, rows, d.inner == 1, gpu.sm_count());
    let f = function(gpu, "softmax_backward", group, d.dtype)?;
    let (dy, y, dx) = (d.grad_output.0, d.output.0, d.grad_input.0);
    let log = i32::from(d.log);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&dy).arg(&y).arg(&dx);
    b.arg(&outer).arg(&len).arg(&inner).arg(&log);
    // SAFETY: the caller checked the three dense regions of `outer · len · inner` elements; the
    // arguments match `softmax_backward_g<G>_<dtype>`'s parameters.
    unsafe { b.launch(group_launch(rows, group, gpu.sm_count())) }
        .map_err(|e| super::driver_error(op, e))?;
    Ok(())
}

/// Layer norm over each row of `[rows, cols]`, one group per row.
pub(crate) fn layer_norm(gpu: &Gpu, d: &LayerNormDesc) -> Result<()> {
    let op = "layer_norm";
    // Rows of no element still save their (NaN) statistics.
    if mul(op, d.rows, d.cols)? == 0 && (d.rows == 0 || d.saved_mean.is_none()) {
        return Ok(());
    }
    let optional_ptrs = [d.weight, d.bias].into_iter().flatten();
    let ptrs: Vec<DevicePtr> = [d.input, d.output]
        .into_iter()
        .chain(optional_ptrs)
        .collect();
    check_aligned(op, d.dtype, &ptrs)?;
    let group = group_size(d.cols, d.rows, true, gpu.sm_count());
    let f = function(gpu, "layer_norm", group, d.dtype)?;
    let (x, w, bias, y) = (d.input.0, optional(d.weight), optional(d.bias), d.output.0);
    let (rows, cols) = (to_i64(op, d.rows)?, to_i64(op, d.cols)?);
    let (save_mean, save_invstd) = saved(op, d.dtype, d.saved_mean, d.saved_invstd)?;
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&x).arg(&w).arg(&bias).arg(&y);
    b.arg(&rows).arg(&cols).arg(&d.eps);
    b.arg(&save_mean).arg(&save_invstd);
    // SAFETY: the caller checked the input and output (`rows · cols` elements), the optional
    // `cols`-element weight and bias and the optional `rows` saved statistics; absent ones are
    // null and never touched. The arguments match `layer_norm_g<G>_<dtype>`'s parameters.
    unsafe { b.launch(group_launch(d.rows, group, gpu.sm_count())) }
        .map_err(|e| super::driver_error(op, e))?;
    Ok(())
}

/// Batch norm of `[batch, channels, spatial]` per channel, one group per channel; in training it also
/// updates the running statistics when they are given.
pub(crate) fn batch_norm(gpu: &Gpu, d: &BatchNormDesc) -> Result<()> {
    let op = "batch_norm";
    let count = mul(op, d.batch, d.spatial)?;
    if mul(op, count, d.channels)? == 0 && (d.channels == 0 || d.saved_mean.is_none()) {
        // No element to normalise, and training with channels needs more than one value each;
        // inference still saves the statistics of its channels.
        return Ok(());
    }
    let optional_ptrs = [d.weight, d.bias, d.running_mean, d.running_var]
        .into_iter()
        .flatten();
    let ptrs: Vec<DevicePtr> = [d.input, d.output]
        .into_iter()
        .chain(optional_ptrs)
        .collect();
    check_aligned(op, d.dtype, &ptrs)?;
    let group = group_size(count, d.channels, d.spatial > 1, gpu.sm_count());
    let f = function(gpu, "batch_norm", group, d.dtype)?;
    let (x, y) = (d.input.0, d.output.0);
    let (w, bias) = (optional(d.weight), optional(d.bias));
    let (rm, rv) = (optional(d.running_mean), optional(d.running_var));
    let batch = to_i64(op, d.batch)?;
    let channels = to_i64(op, d.channels)?;
    let spatial = to_i64(op, d.spatial)?;
    let training = i32::from(d.training);
    let (save_mean, save_invstd) = saved(op, d.dtype, d.saved_mean, d.saved_invstd)?;
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&x).arg(&y).arg(&w).arg(&bias).arg(&rm).arg(&rv);
    b.arg(&batch).arg(&channels).arg(&spatial);
    b.arg(&training).arg(&d.momentum).arg(&d.eps);
    b.arg(&save_mean).arg(&save_invstd);
    // SAFETY: the caller checked the input and output (`batch · channels · spatial` elements) and the
    // optional `channels`-element operands (running statistics writable in training, saved
    // statistics written); absent ones are null and never touched. The arguments match
    // `batch_norm_g<G>_<dtype>`'s parameters.
    unsafe { b.launch(group_launch(d.channels, group, gpu.sm_count())) }
        .map_err(|e| super::driver_error(op, e))?;
    Ok(())
}

impl OpImpl<SoftmaxDesc> for CudaBackend {
    fn op(&self, desc: &SoftmaxDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("softmax", desc.dtype)?;
        self.run(acc, |gpu| softmax(gpu, desc))
    }
}

impl OpImpl<SoftmaxBackwardDesc> for CudaBackend {
    fn op(&self, desc: &SoftmaxBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only(desc.name(), desc.dtype)?;
        self.run(acc, |gpu| softmax_backward(gpu, desc))
    }
}

impl OpImpl<LayerNormDesc> for CudaBackend {
    fn op(&self, desc: &LayerNormDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("layer_norm", desc.dtype)?;
        self.run(acc, |gpu| layer_norm(gpu, desc))
    }
}

impl OpImpl<BatchNormDesc> for CudaBackend {
    fn op(&self, desc: &BatchNormDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("batch_norm", desc.dtype)?;
        self.run(acc, |gpu| batch_norm(gpu, desc))
    }
}

/// A forward's saved-statistics pointers as the kernels take them (null when absent), checked for
/// the alignment of the statistics' dtype.
fn saved(
    op: &'static str,
    dtype: DType,
    mean: Option<DevicePtr>,
    invstd: Option<DevicePtr>,
) -> Result<(u64, u64)> {
    let ptrs: Vec<DevicePtr> = [mean, invstd].into_iter().flatten().collect();
    check_aligned(op, stats_dtype(dtype), &ptrs)?;
    Ok((optional(mean), optional(invstd)))
}

/// Checks a norm backward's operands `[grad_output, input, mean, invstd]` and optional `[weight,
/// grad_input, grad_weight, grad_bias]` for their dtypes' alignment.
fn check_grad_aligned(
    op: &'static str,
    dtype: DType,
    [dy, x, mean, invstd]: [DevicePtr; 4],
    optional: [Option<DevicePtr>; 4],
) -> Result<()> {
    let ptrs: Vec<DevicePtr> = [dy, x]
        .into_iter()
        .chain(optional.into_iter().flatten())
        .collect();
    check_aligned(op, dtype, &ptrs)?;
    check_aligned(op, stats_dtype(dtype), &[mean, invstd])
}

/// The gradients of layer norm: the input's a group per row, the weight's and bias's a thread per
/// column.
pub(crate) fn layer_norm_backward(gpu: &Gpu, d: &LayerNormBackwardDesc) -> Result<()> {
    let op = "layer_norm_backward";
    let n = mul(op, d.rows, d.cols)?;
    check_grad_aligned(
        op,
        d.dtype,
        [d.grad_output, d.input, d.mean, d.invstd],
        [d.weight, d.grad_input, d.grad_weight, d.grad_bias],
    )?;
    let (dy, x, w) = (d.grad_output.0, d.input.0, optional(d.weight));
    let (mean, invstd) = (d.mean.0, d.invstd.0);
    let (rows, cols) = (to_i64(op, d.rows)?, to_i64(op, d.cols)?);
    if let Some(dx) = d.grad_input.filter(|_| n > 0) {
        let group = group_size(d.cols, d.rows, true, gpu.sm_count());
        let f = function(gpu, "layer_norm_backward_input", group, d.dtype)?;
        let dx = dx.0;
        let mut b = gpu.stream().launch_builder(&f);
        b.arg(&dy).arg(&x).arg(&w).arg(&mean).arg(&invstd).arg(&dx);
        b.arg(&rows).arg(&cols);
        // SAFETY: the caller checked the `rows · cols`-element gradient, input and input gradient,
        // the optional `cols`-element weight (null when absent) and the `rows` statistics. The
        // arguments match `layer_norm_backward_input_g<G>_<dtype>`'s parameters.
        unsafe { b.launch(group_launch(d.rows, group, gpu.sm_count())) }
            .map_err(|e| super::driver_error(op, e))?;
    }
    if (d.grad_weight.is_some() || d.grad_bias.is_some()) && d.cols > 0 {
        let f = gpu.function_for(
            "norm",
            d.dtype,
            &format!("layer_norm_backward_params_{}", suffix(d.dtype)),
        )?;
        let (dw, db) = (optional(d.grad_weight), optional(d.grad_bias));
        let mut b = gpu.stream().launch_builder(&f);
        b.arg(&dy).arg(&x).arg(&mean).arg(&invstd).arg(&dw).arg(&db);
        b.arg(&rows).arg(&cols);
        // SAFETY: as above; the optional `cols`-element weight and bias gradients are null when
        // absent. The arguments match `layer_norm_backward_params_<dtype>`'s parameters.
        unsafe { b.launch(grid_for(d.cols, gpu.sm_count())) }
            .map_err(|e| super::driver_error(op, e))?;
    }
    Ok(())
}

/// The gradients of batch norm, a group per channel: the channel's sums, then its input gradient.
pub(crate) fn batch_norm_backward(gpu: &Gpu, d: &BatchNormBackwardDesc) -> Result<()> {
    let op = "batch_norm_backward";
    mul(op, mul(op, d.batch, d.spatial)?, d.channels)?;
    if d.channels == 0 {
        return Ok(());
    }
    check_grad_aligned(
        op,
        d.dtype,
        [d.grad_output, d.input, d.mean, d.invstd],
        [d.weight, d.grad_input, d.grad_weight, d.grad_bias],
    )?;
    let count = d.batch * d.spatial;
    let group = group_size(count, d.channels, d.spatial > 1, gpu.sm_count());
    let f = function(gpu, "batch_norm_backward", group, d.dtype)?;
    let (dy, x, w) = (d.grad_output.0, d.input.0, optional(d.weight));
    let (mean, invstd) = (d.mean.0, d.invstd.0);
    let (dx, dw, db) = (
        optional(d.grad_input),
        optional(d.grad_weight),
        optional(d.grad_bias),
    );
    let batch = to_i64(op, d.batch)?;
    let channels = to_i64(op, d.channels)?;
    let spatial = to_i64(op, d.spatial)?;
    let training = i32::from(d.training);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&dy).arg(&x).arg(&w).arg(&mean).arg(&invstd);
    b.arg(&dx).arg(&dw).arg(&db);
    b.arg(&batch).arg(&channels).arg(&spatial).arg(&training);
    // SAFETY: the caller checked the `batch · channels · spatial`-element gradient and input (and
    // input gradient when given), the `channels`-element statistics and the optional weight and
    // parameter gradients; absent ones are null and never touched. The arguments match
    // `batch_norm_backward_g<G>_<dtype>`'s parameters.
    unsafe { b.launch(group_launch(d.channels, group, gpu.sm_count())) }
        .map_err(|e| super::driver_error(op, e))?;
    Ok(())
}

impl OpImpl<LayerNormBackwardDesc> for CudaBackend {
    fn op(&self, desc: &LayerNormBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("layer_norm_backward", desc.dtype)?;
        self.run(acc, |gpu| layer_norm_backward(gpu, desc))
    }
}

impl OpImpl<BatchNormBackwardDesc> for CudaBackend {
    fn op(&self, desc: &BatchNormBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("batch_norm_backward", desc.dtype)?;
        self.run(acc, |gpu| batch_norm_backward(gpu, desc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_operands_are_null() {
        assert_eq!(optional(None), 0);
        assert_eq!(optional(Some(DevicePtr(0x1000))), 0x1000);
    }

    #[test]
    fn products_overflow_as_errors() {
        assert_eq!(mul("t", 3, 5).unwrap(), 15);
        assert!(matches!(
            mul("t", usize::MAX, 2),
            Err(BackendError::SizeOverflow { .. })
        ));
    }

    #[test]
    fn every_kernel_name_exists_in_the_source() {
        let src = include_str!("kernels/norm.cu");
        for kernel in [
            "softmax",
            "softmax_backward",
            "layer_norm",
            "batch_norm",
            "layer_norm_backward_input",
            "batch_norm_backward",
        ] {
            assert!(src.contains(&format!("{kernel}_g##G##_##S(")), "{kernel}");
        }
        assert!(src.contains("ENTRY_G(S, T, 1) ENTRY_G(S, T, 32) ENTRY_G(S, T, 256)"));
        assert!(src.contains("layer_norm_backward_params_##S("));
    }
}
