//! The 2-D convolution descriptor and the window arithmetic shared with pooling.

use super::check_output_shape;
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// 2-D convolution (cross-correlation, as in PyTorch), NCHW, contiguous operands.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2dDesc {
    /// Element type of every operand.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// `[N, C, H, W]`.
    pub input_shape: [usize; 4],
    /// Weight pointer.
    pub weight: DevicePtr,
    /// `[K, C / groups, R, S]`.
    pub weight_shape: [usize; 4],
    /// Optional bias pointer, `[K]`.
    pub bias: Option<DevicePtr>,
    /// Output pointer.
    pub output: DevicePtr,
    /// `[N, K, OH, OW]`; must equal [`Conv2dDesc::expected_output_shape`].
    pub output_shape: [usize; 4],
    /// `[sh, sw]`, each ≥ 1.
    pub stride: [usize; 2],
    /// `[ph, pw]`, zero padding on both sides.
    pub padding: [usize; 2],
    /// `[dh, dw]`, each ≥ 1.
    pub dilation: [usize; 2],
    /// Channel groups (≥ 1, dividing C and K).
    pub groups: usize,
}

/// Output size of one spatial dim of a convolution or pooling window, or `None` when the (dilated)
/// window is larger than the padded input.
pub fn window_output_size(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    let padded = input.checked_add(padding.checked_mul(2)?)?;
    let span = dilation
        .checked_mul(kernel.checked_sub(1)?)?
        .checked_add(1)?;
    Some(padded.checked_sub(span)? / stride + 1)
}

impl Conv2dDesc {
    /// The output shape implied by the input, weight and window parameters, with every check on them.
    pub fn expected_output_shape(
        input_shape: [usize; 4],
        weight_shape: [usize; 4],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<[usize; 4]> {
        let op = "conv2d";
        let [n, c, h, w] = input_shape;
        let [k, cg, r, s] = weight_shape;
        if groups == 0 || stride.contains(&0) || dilation.contains(&0) {
            return Err(BackendError::invalid(
                op,
                "groups, stride and dilation must all be at least 1",
            ));
        }
        if c % groups != 0 || k % groups != 0 {
            return Err(BackendError::shape(
                op,
                format!(
                    "groups = {groups} must divide both input channels {c} and output channels {k}"
                ),
            ));
        }
        if cg != c / groups {
            return Err(BackendError::shape(
                op,
                format!(
                    "weight {weight_shape:?} must have C/groups = {} input channels, has {cg}",
                    c / groups
                ),
            ));
        }
        if r == 0 || s == 0 {
            return Err(BackendError::shape(
                op,
                format!("weight {weight_shape:?} has an empty kernel"),
            ));
        }
        let oh = window_output_size(h, r, stride[0], padding[0], dilation[0]);
        let ow = window_output_size(w, s, stride[1], padding[1], dilation[1]);
        match (oh, ow) {
            (Some(oh), Some(ow)) => Ok([n, k, oh, ow]),
            _ => Err(BackendError::shape(
                op,
                format!(
                    "kernel {r}×{s} (dilation {dilation:?}) is larger than the padded input {}×{}",
                    h.saturating_add(padding[0].saturating_mul(2)),
                    w.saturating_add(padding[1].saturating_mul(2))
                ),
            )),
        }
    }

    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "conv2d";
        let expected = Self::expected_output_shape(
            self.input_shape,
            self.weight_shape,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )?;
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
            "weight",
            self.weight,
            &self.weight_shape,
            self.dtype,
            Access::Read,
        )?;
        if let Some(bias) = self.bias {
            acc.push_dense(
                "bias",
                bias,
                &[self.weight_shape[0]],
                self.dtype,
                Access::Read,
            )?;
        }
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

crate::compute::op::op_desc!(Conv2dDesc => conv2d_forward, dtype: dtype, {
    dense "input": input,
    dense "weight": weight,
    optional "bias": bias,
    dense "output": output,
});
