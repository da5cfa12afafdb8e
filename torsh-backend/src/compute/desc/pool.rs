//! The 2-D pooling descriptor.

use super::{check_output_shape, window_output_size};
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// The kind of pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// Maximum over the window (padding never wins; NaN propagates).
    Max,
    /// Mean over the window.
    Avg {
        /// Divide by the full window size including padding (PyTorch's default) rather than by the
        /// number of real elements.
        count_include_pad: bool,
    },
}

/// 2-D pooling over contiguous NCHW operands.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool2dDesc {
    /// Max or average.
    pub kind: PoolKind,
    /// Element type.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// `[N, C, H, W]`.
    pub input_shape: [usize; 4],
    /// Output pointer.
    pub output: DevicePtr,
    /// `[N, C, OH, OW]`; must equal [`Pool2dDesc::expected_output_shape`].
    pub output_shape: [usize; 4],
    /// Window `[kh, kw]`, each ≥ 1.
    pub kernel: [usize; 2],
    /// `[sh, sw]`, each ≥ 1.
    pub stride: [usize; 2],
    /// `[ph, pw]`, each at most half the window (PyTorch's rule).
    pub padding: [usize; 2],
    /// Max only: where to write, as dense `I64` of `output_shape`, the position `iy·W + ix` within
    /// its plane of each window's maximum, as PyTorch's `max_pool2d(return_indices=True)`: the first
    /// tap holding the largest value in row-major window order, or the last NaN tap when the window
    /// holds a NaN (so the value written is always the input at that position).
    pub indices: Option<DevicePtr>,
}

impl Pool2dDesc {
    /// The output shape implied by the input and window, with every check on them.
    pub fn expected_output_shape(
        input_shape: [usize; 4],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<[usize; 4]> {
        let op = "pool2d";
        if kernel.contains(&0) || stride.contains(&0) {
            return Err(BackendError::invalid(
                op,
                "kernel and stride must be at least 1",
            ));
        }
        if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
            return Err(BackendError::invalid(
                op,
                format!("padding {padding:?} must be at most half the kernel {kernel:?}"),
            ));
        }
        let [n, c, h, w] = input_shape;
        match (
            window_output_size(h, kernel[0], stride[0], padding[0], 1),
            window_output_size(w, kernel[1], stride[1], padding[1], 1),
        ) {
            (Some(oh), Some(ow)) => Ok([n, c, oh, ow]),
            _ => Err(BackendError::shape(
                op,
                format!("window {kernel:?} is larger than the padded input {h}×{w} (padding {padding:?})"),
            )),
        }
    }

    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "pool2d";
        let expected =
            Self::expected_output_shape(self.input_shape, self.kernel, self.stride, self.padding)?;
        check_output_shape(op, &expected, &self.output_shape)?;
        check_indices(op, self.kind, self.indices.is_some(), false)?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push_dense(
            "input",
            self.input,
            &self.input_shape,
            self.dtype,
            Access::Read,
        )?;
        acc.push_dense(
            "output",
            self.output,
            &self.output_shape,
            self.dtype,
            Access::Write,
        )?;
        if let Some(p) = self.indices {
            acc.push_dense("indices", p, &self.output_shape, DType::I64, Access::Write)?;
        }
        Ok(acc)
    }
}

/// The gradient of 2-D pooling with respect to its input: `output[n, c, iy, ix]` (dense
/// `input_shape`, overwritten) is the sum, over the windows of the forward that hold input element
/// `(iy, ix)`, in row-major window order, of
/// - max: `grad[n, c, oy, ox]` where `indices[n, c, oy, ox] == iy·W + ix` (the position
///   [`Pool2dDesc::indices`] wrote: overlapping windows that picked the same element all add to it);
/// - average: `grad[n, c, oy, ox] / divisor`, the divisor of the forward (the whole window, or its
///   taps inside the input without `count_include_pad`).
///
/// `grad` (and `indices`, `I64`) are dense `[N, C, OH, OW]` with `OH`, `OW` those the forward gives for
/// `input_shape` and the window. Errors: `ShapeMismatch` when `grad_shape` is not the forward's
/// output shape; `InvalidArgument` for a max without indices, an average with them, or a window the
/// forward refuses. An index that is not the position of an element inside its own window is
/// `IndexOutOfRange` (`size` = `H·W`): the reference and CPU backends check every index before writing;
/// GPUs skip that window's gradient and raise the device's error flag, reported at the next
/// synchronize or host read.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool2dBackwardDesc {
    /// Max or average.
    pub kind: PoolKind,
    /// Element type of `grad` and `output`.
    pub dtype: DType,
    /// Gradient of the pooled output, dense `grad_shape`.
    pub grad: DevicePtr,
    /// `[N, C, OH, OW]`.
    pub grad_shape: [usize; 4],
    /// Max only: the `I64` positions of the forward's maxima, dense `grad_shape`.
    pub indices: Option<DevicePtr>,
    /// Gradient of the input, dense `input_shape`; every element is written.
    pub output: DevicePtr,
    /// `[N, C, H, W]`.
    pub input_shape: [usize; 4],
    /// Window `[kh, kw]`.
    pub kernel: [usize; 2],
    /// `[sh, sw]`.
    pub stride: [usize; 2],
    /// `[ph, pw]`.
    pub padding: [usize; 2],
}

impl Pool2dBackwardDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "pool2d_backward";
        let expected = Pool2dDesc::expected_output_shape(
            self.input_shape,
            self.kernel,
            self.stride,
            self.padding,
        )?;
        if self.grad_shape != expected {
            return Err(BackendError::shape(
                op,
                format!(
                    "the gradient is {:?}, but pooling {:?} gives {expected:?}",
                    self.grad_shape, self.input_shape
                ),
            ));
        }
        check_indices(op, self.kind, self.indices.is_some(), true)?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push_dense(
            "grad",
            self.grad,
            &self.grad_shape,
            self.dtype,
            Access::Read,
        )?;
        if let Some(p) = self.indices {
            acc.push_dense("indices", p, &self.grad_shape, DType::I64, Access::Read)?;
        }
        acc.push_dense(
            "output",
            self.output,
            &self.input_shape,
            self.dtype,
            Access::Write,
        )?;
        Ok(acc)
    }
}

/// `InvalidArgument` unless indices go with a max, and only with a max (`required`: the backward).
fn check_indices(op: &'static str, kind: PoolKind, given: bool, required: bool) -> Result<()> {
    match kind {
        PoolKind::Avg { .. } if given => {
            Err(BackendError::invalid(op, "average pooling has no indices"))
        }
        PoolKind::Max if required && !given => Err(BackendError::invalid(
            op,
            "the gradient of max pooling needs the forward's indices",
        )),
        _ => Ok(()),
    }
}

/// The outputs along one dim whose window holds input position `i`: `o` with
/// `o·stride ≤ i + pad < o·stride + kernel` and `o < out`.
pub fn windows_over(
    i: usize,
    out: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
) -> std::ops::Range<usize> {
    let p = i + pad;
    let lo = if p + 1 > kernel {
        (p + 1 - kernel).div_ceil(stride)
    } else {
        0
    };
    let hi = (p / stride + 1).min(out);
    lo..hi.max(lo)
}

impl Pool2dBackwardDesc {
    /// Whether `index` is the position `iy·W + ix` of an input element inside the window of output
    /// `(oy, ox)` (taps on padding excluded).
    pub fn index_in_window(&self, index: i64, oy: usize, ox: usize) -> bool {
        let [_, _, h, w] = self.input_shape;
        let Ok(v) = usize::try_from(index) else {
            return false;
        };
        if w == 0 || v >= h * w {
            return false;
        }
        let inside = |at: usize, o: usize, axis: usize| {
            let start = o * self.stride[axis];
            let p = at + self.padding[axis];
            p >= start && p < start + self.kernel[axis]
        };
        inside(v / w, oy, 0) && inside(v % w, ox, 1)
    }
}

crate::compute::op::op_desc!(Pool2dDesc => pool2d, dtype: dtype, {
    dense "input": input,
    dense "output": output,
    optional "indices": indices as |_: &Pool2dDesc| DType::I64,
});

crate::compute::op::op_desc!(Pool2dBackwardDesc => pool2d_backward, dtype: dtype, {
    dense "grad": grad,
    optional "indices": indices as |_: &Pool2dBackwardDesc| DType::I64,
    dense "output": output,
});
