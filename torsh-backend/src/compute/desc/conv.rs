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

/// [`Conv2dDesc::expected_output_shape`] with `op` named in its errors.
fn conv_output_shape(
    op: &'static str,
    input_shape: [usize; 4],
    weight_shape: [usize; 4],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> Result<[usize; 4]> {
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
        conv_output_shape(
            "conv2d",
            input_shape,
            weight_shape,
            stride,
            padding,
            dilation,
            groups,
        )
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

/// The window of a convolution whose gradients a backward descriptor computes, checked against its
/// operands' shapes: `ShapeMismatch` unless convolving `input_shape` with `weight_shape` under the
/// window gives exactly `grad_output_shape`.
fn check_gradient_shapes(
    op: &'static str,
    input_shape: [usize; 4],
    weight_shape: [usize; 4],
    grad_output_shape: [usize; 4],
    window: ([usize; 2], [usize; 2], [usize; 2], usize),
) -> Result<()> {
    let (stride, padding, dilation, groups) = window;
    let expected = conv_output_shape(
        op,
        input_shape,
        weight_shape,
        stride,
        padding,
        dilation,
        groups,
    )?;
    if expected != grad_output_shape {
        return Err(BackendError::shape(
            op,
            format!(
                "the output gradient is {grad_output_shape:?}, but convolving {input_shape:?} with \
                 {weight_shape:?} gives {expected:?}"
            ),
        ));
    }
    Ok(())
}

/// The gradient of a 2-D convolution with respect to its input, NCHW, contiguous operands:
/// `grad_input[n, c, y, x] = bias[c] + Σ grad_output[n, k, oy, ox] · weight[k, c − g·C/G, r, s]` over
/// the output channels `k` of `c`'s group `g` and the taps `(r, s)` with `oy·sh − ph + r·dh = y` and
/// `ox·sw − pw + s·dw = x`. It is also the transposed convolution (`conv_transpose2d`), whose input
/// is `grad_output` and whose optional bias is `bias`. Every element of `grad_input` is written
/// (zero where no window reaches).
///
/// `ShapeMismatch` unless the convolution of `grad_input_shape` with `weight_shape` under the
/// window gives `grad_output_shape`; `InvalidArgument` for a zero stride, dilation or group count.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2dBackwardInputDesc {
    /// Element type of every operand.
    pub dtype: DType,
    /// The output's gradient.
    pub grad_output: DevicePtr,
    /// `[N, K, OH, OW]`.
    pub grad_output_shape: [usize; 4],
    /// Weight pointer.
    pub weight: DevicePtr,
    /// `[K, C / groups, R, S]`.
    pub weight_shape: [usize; 4],
    /// Optional `[C]` added to every element of `grad_input` (a transposed convolution's bias).
    pub bias: Option<DevicePtr>,
    /// The input's gradient, written.
    pub grad_input: DevicePtr,
    /// `[N, C, H, W]`.
    pub grad_input_shape: [usize; 4],
    /// `[sh, sw]`, each ≥ 1.
    pub stride: [usize; 2],
    /// `[ph, pw]`.
    pub padding: [usize; 2],
    /// `[dh, dw]`, each ≥ 1.
    pub dilation: [usize; 2],
    /// Channel groups (≥ 1, dividing C and K).
    pub groups: usize,
}

impl Conv2dBackwardInputDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "conv2d_backward_input";
        check_gradient_shapes(
            op,
            self.grad_input_shape,
            self.weight_shape,
            self.grad_output_shape,
            (self.stride, self.padding, self.dilation, self.groups),
        )?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push_dense(
            "grad_output",
            self.grad_output,
            &self.grad_output_shape,
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
                &[self.grad_input_shape[1]],
                self.dtype,
                Access::Read,
            )?;
        }
        acc.push_dense(
            "grad_input",
            self.grad_input,
            &self.grad_input_shape,
            self.dtype,
            Access::Write,
        )?;
        Ok(acc)
    }
}

crate::compute::op::op_desc!(Conv2dBackwardInputDesc => conv2d_backward_input, dtype: dtype, {
    dense "grad_output": grad_output,
    dense "weight": weight,
    optional "bias": bias,
    dense "grad_input": grad_input,
});

/// The gradient of a 2-D convolution with respect to its weight, NCHW, contiguous operands:
/// `grad_weight[k, c, r, s] = Σ_{n, oy, ox} grad_output[n, k, oy, ox] · input[n, g·C/G + c,
/// oy·sh − ph + r·dh, ox·sw − pw + s·dw]` (zero padding), `g` the group of `k`. Every element of
/// `grad_weight` is written (zero when the batch is empty).
///
/// `ShapeMismatch` unless the convolution of `input_shape` with `weight_shape` under the window
/// gives `grad_output_shape`; `InvalidArgument` for a zero stride, dilation or group count.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2dBackwardWeightDesc {
    /// Element type of every operand.
    pub dtype: DType,
    /// The forward's input.
    pub input: DevicePtr,
    /// `[N, C, H, W]`.
    pub input_shape: [usize; 4],
    /// The output's gradient.
    pub grad_output: DevicePtr,
    /// `[N, K, OH, OW]`.
    pub grad_output_shape: [usize; 4],
    /// The weight's gradient, written.
    pub grad_weight: DevicePtr,
    /// `[K, C / groups, R, S]`.
    pub weight_shape: [usize; 4],
    /// `[sh, sw]`, each ≥ 1.
    pub stride: [usize; 2],
    /// `[ph, pw]`.
    pub padding: [usize; 2],
    /// `[dh, dw]`, each ≥ 1.
    pub dilation: [usize; 2],
    /// Channel groups (≥ 1, dividing C and K).
    pub groups: usize,
}

impl Conv2dBackwardWeightDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "conv2d_backward_weight";
        check_gradient_shapes(
            op,
            self.input_shape,
            self.weight_shape,
            self.grad_output_shape,
            (self.stride, self.padding, self.dilation, self.groups),
        )?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push_dense(
            "input",
            self.input,
            &self.input_shape,
            self.dtype,
            Access::Read,
        )?;
        acc.push_dense(
            "grad_output",
            self.grad_output,
            &self.grad_output_shape,
            self.dtype,
            Access::Read,
        )?;
        acc.push_dense(
            "grad_weight",
            self.grad_weight,
            &self.weight_shape,
            self.dtype,
            Access::Write,
        )?;
        Ok(acc)
    }
}

crate::compute::op::op_desc!(Conv2dBackwardWeightDesc => conv2d_backward_weight, dtype: dtype, {
    dense "input": input,
    dense "grad_output": grad_output,
    dense "grad_weight": grad_weight,
});
