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
        Ok(acc)
    }
}

crate::compute::op::op_desc!(Pool2dDesc => pool2d, dtype: dtype, {
    dense "input": input,
    dense "output": output,
});
