//! `conv2d` over NCHW tensors with stride, padding, dilation, groups and an optional bias, its
//! gradients, and the transposed convolution.

use crate::backend::Backend;
use crate::compute::{Conv2dBackwardInputDesc, Conv2dBackwardWeightDesc, Conv2dDesc, TunableOp};
use crate::error::{BackendError, Result};
use crate::tensor::Tensor;

use super::{expect_rank, expect_shape};

/// Window parameters of a 2-D convolution:
/// `ConvConfig { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 1 }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvConfig {
    /// `[sh, sw]`, each ≥ 1.
    pub stride: [usize; 2],
    /// Zero padding `[ph, pw]` on both sides.
    pub padding: [usize; 2],
    /// `[dh, dw]`, each ≥ 1.
    pub dilation: [usize; 2],
    /// Channel groups, dividing both channel counts.
    pub groups: usize,
}

impl Default for ConvConfig {
    /// Stride 1, no padding, no dilation, one group.
    fn default() -> Self {
        ConvConfig {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Window parameters of a transposed 2-D convolution (`torch.nn.functional.conv_transpose2d`):
/// `ConvTransposeConfig { stride: [2, 2], ..Default::default() }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvTransposeConfig {
    /// `[sh, sw]`, each ≥ 1: the stride of the convolution this one transposes.
    pub stride: [usize; 2],
    /// `[ph, pw]`: the padding of the convolution this one transposes (removed from each side of
    /// the output).
    pub padding: [usize; 2],
    /// `[oph, opw]`, each below its stride: rows and columns added at the bottom and right of the
    /// output, choosing among the input sizes a strided convolution maps to the same output size.
    pub output_padding: [usize; 2],
    /// `[dh, dw]`, each ≥ 1.
    pub dilation: [usize; 2],
    /// Channel groups, dividing both channel counts.
    pub groups: usize,
}

impl Default for ConvTransposeConfig {
    /// Stride 1, no padding or output padding, no dilation, one group.
    fn default() -> Self {
        ConvTransposeConfig {
            stride: [1, 1],
            padding: [0, 0],
            output_padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl ConvTransposeConfig {
    /// The output shape of the transposed convolution of `input_shape` `[N, C_in, H, W]` with
    /// `weight_shape` `[C_in, C_out / groups, R, S]`: `[N, C_out, OH, OW]` with
    /// `OH = (H − 1)·sh − 2·ph + dh·(R − 1) + oph + 1` (and likewise `OW`).
    ///
    /// `InvalidArgument` for a zero stride, dilation or group count, or an output padding not below
    /// its stride (PyTorch also accepts one below the dilation; this crate does not);
    /// `ShapeMismatch` when `groups` does not divide `C_in`, the weight's first dim is not `C_in`,
    /// its kernel is empty, or the output would have no rows or columns.
    pub fn output_shape(
        &self,
        input_shape: [usize; 4],
        weight_shape: [usize; 4],
    ) -> Result<[usize; 4]> {
        let op = "conv_transpose2d";
        let [n, c_in, h, w] = input_shape;
        let [wc, cg, r, s] = weight_shape;
        if self.groups == 0 || self.stride.contains(&0) || self.dilation.contains(&0) {
            return Err(BackendError::invalid(
                op,
                "groups, stride and dilation must all be at least 1",
            ));
        }
        if self.output_padding[0] >= self.stride[0] || self.output_padding[1] >= self.stride[1] {
            return Err(BackendError::invalid(
                op,
                format!(
                    "output padding {:?} must be below the stride {:?}",
                    self.output_padding, self.stride
                ),
            ));
        }
        if wc != c_in || c_in % self.groups != 0 {
            return Err(BackendError::shape(
                op,
                format!(
                    "weight {weight_shape:?} must have the input's {c_in} channels first, \
                     divisible by groups = {}",
                    self.groups
                ),
            ));
        }
        if r == 0 || s == 0 {
            return Err(BackendError::shape(
                op,
                format!("weight {weight_shape:?} has an empty kernel"),
            ));
        }
        let side = |i: usize, taps: usize, axis: usize| -> Option<usize> {
            let full = i
                .checked_sub(1)?
                .checked_mul(self.stride[axis])?
                .checked_add(self.dilation[axis].checked_mul(taps - 1)?)?
                .checked_add(self.output_padding[axis] + 1)?;
            full.checked_sub(self.padding[axis].checked_mul(2)?)
                .filter(|&v| v > 0)
        };
        match (side(h, r, 0), side(w, s, 1)) {
            (Some(oh), Some(ow)) => {
                let c_out = cg.checked_mul(self.groups).ok_or_else(|| {
                    BackendError::overflow(op, format!("{cg} × {} channels", self.groups))
                })?;
                Ok([n, c_out, oh, ow])
            }
            _ => Err(BackendError::shape(
                op,
                format!(
                    "input {input_shape:?} with kernel {r}×{s} leaves no output rows or columns \
                     after removing the padding {:?}",
                    self.padding
                ),
            )),
        }
    }
}

fn dims4(t: &Tensor) -> [usize; 4] {
    [t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]]
}

/// `shape` as an NCHW shape, or `ShapeMismatch` naming `what`.
fn shape4(op: &'static str, what: &str, shape: &[usize]) -> Result<[usize; 4]> {
    shape.try_into().map_err(|_| {
        BackendError::shape(
            op,
            format!("the {what} shape must have rank 4, got {shape:?}"),
        )
    })
}

impl Backend {
    /// 2-D convolution (cross-correlation, as `torch.nn.functional.conv2d`) of `input` `[N, C, H, W]` with
    /// `weight` `[K, C/groups, R, S]`, giving `[N, K, OH, OW]`. `ShapeMismatch` for wrong ranks, channel
    /// counts, or a kernel larger than the padded input; `InvalidArgument` for zero stride, dilation or groups.
    pub fn conv2d(&self, input: &Tensor, weight: &Tensor, config: ConvConfig) -> Result<Tensor> {
        self.conv2d_with_bias(input, weight, None, config)
    }

    /// [`Backend::conv2d`] plus a `[K]` bias added to every output position. With mixed precision on
    /// ([`Backend::enable_mixed_precision`]), f32 operands run in its compute dtype and the result
    /// comes back as f32.
    pub fn conv2d_with_bias(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        config: ConvConfig,
    ) -> Result<Tensor> {
        let mut operands = vec![input, weight];
        operands.extend(bias);
        crate::runtime::amp::autocast(self, &operands, |t| {
            self.conv2d_as_is(t[0], t[1], t.get(2).copied(), config)
        })
    }

    fn conv2d_as_is(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        config: ConvConfig,
    ) -> Result<Tensor> {
        let op = "conv2d";
        let mut operands = vec![input, weight];
        operands.extend(bias);
        let dtype = self.check_operands(op, &operands)?;
        expect_rank(op, "input", input, 4)?;
        expect_rank(op, "weight", weight, 4)?;
        let (input_shape, weight_shape) = (dims4(input), dims4(weight));
        if let Some(b) = bias {
            expect_shape(op, "bias", b, &[weight_shape[0]])?;
        }
        let output_shape = Conv2dDesc::expected_output_shape(
            input_shape,
            weight_shape,
            config.stride,
            config.padding,
            config.dilation,
            config.groups,
        )?;
        let out = self.empty(&output_shape, dtype)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let (x, w) = (input.contiguous()?, weight.contiguous()?);
        let b = bias.map(|b| b.contiguous()).transpose()?;
        // The autotuner may choose among the backend's ways of running it.
        self.run_tunable(&TunableOp::Conv2d(Conv2dDesc {
            dtype,
            input: x.data_ptr(),
            input_shape,
            weight: w.data_ptr(),
            weight_shape,
            bias: b.as_ref().map(|b| b.data_ptr()),
            output: out.data_ptr(),
            output_shape,
            stride: config.stride,
            padding: config.padding,
            dilation: config.dilation,
            groups: config.groups,
        }))?;
        Ok(out)
    }
}

impl Backend {
    /// The gradient of [`Backend::conv2d`] with respect to its input of `input_shape`
    /// `[N, C, H, W]`, from the output's gradient `grad_output` `[N, K, OH, OW]` and the forward's
    /// `weight` `[K, C/groups, R, S]`, as PyTorch's `conv2d` backward: every stride, padding,
    /// dilation and group count the forward takes. `ShapeMismatch` when `input_shape` is not of
    /// rank 4 or the forward of these shapes under `config` does not give `grad_output`'s shape;
    /// `DTypeMismatch` for mixed dtypes; the window errors of [`Backend::conv2d`].
    pub fn conv2d_backward_input(
        &self,
        grad_output: &Tensor,
        weight: &Tensor,
        input_shape: &[usize],
        config: ConvConfig,
    ) -> Result<Tensor> {
        let op = "conv2d_backward_input";
        let input_shape = shape4(op, "input", input_shape)?;
        self.backward_input(op, grad_output, weight, None, input_shape, config)
    }

    /// [`Conv2dBackwardInputDesc`] for `grad_output` and `weight` (shapes checked by the
    /// descriptor), plus an optional bias of the result's channels.
    fn backward_input(
        &self,
        op: &'static str,
        grad_output: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        grad_input_shape: [usize; 4],
        config: ConvConfig,
    ) -> Result<Tensor> {
        let mut operands = vec![grad_output, weight];
        operands.extend(bias);
        let dtype = self.check_operands(op, &operands)?;
        expect_rank(op, "grad_output", grad_output, 4)?;
        expect_rank(op, "weight", weight, 4)?;
        if let Some(b) = bias {
            expect_shape(op, "bias", b, &[grad_input_shape[1]])?;
        }
        let expected = Conv2dDesc::expected_output_shape(
            grad_input_shape,
            dims4(weight),
            config.stride,
            config.padding,
            config.dilation,
            config.groups,
        )?;
        expect_shape(op, "grad_output", grad_output, &expected)?;
        let out = self.empty(&grad_input_shape, dtype)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let (dy, w) = (grad_output.contiguous()?, weight.contiguous()?);
        let b = bias.map(|b| b.contiguous()).transpose()?;
        self.compute()
            .conv2d_backward_input(&Conv2dBackwardInputDesc {
                dtype,
                grad_output: dy.data_ptr(),
                grad_output_shape: expected,
                weight: w.data_ptr(),
                weight_shape: dims4(&w),
                bias: b.as_ref().map(Tensor::data_ptr),
                grad_input: out.data_ptr(),
                grad_input_shape,
                stride: config.stride,
                padding: config.padding,
                dilation: config.dilation,
                groups: config.groups,
            })?;
        Ok(out)
    }

    /// The gradient of [`Backend::conv2d`] with respect to its weight of `weight_shape`
    /// `[K, C/groups, R, S]`, from the output's gradient `grad_output` `[N, K, OH, OW]` and the
    /// forward's `input` `[N, C, H, W]`, summed over the batch. Errors as
    /// [`Backend::conv2d_backward_input`].
    pub fn conv2d_backward_weight(
        &self,
        grad_output: &Tensor,
        input: &Tensor,
        weight_shape: &[usize],
        config: ConvConfig,
    ) -> Result<Tensor> {
        let op = "conv2d_backward_weight";
        let weight_shape = shape4(op, "weight", weight_shape)?;
        let dtype = self.check_operands(op, &[grad_output, input])?;
        expect_rank(op, "grad_output", grad_output, 4)?;
        expect_rank(op, "input", input, 4)?;
        let expected = Conv2dDesc::expected_output_shape(
            dims4(input),
            weight_shape,
            config.stride,
            config.padding,
            config.dilation,
            config.groups,
        )?;
        expect_shape(op, "grad_output", grad_output, &expected)?;
        let out = self.empty(&weight_shape, dtype)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let (dy, x) = (grad_output.contiguous()?, input.contiguous()?);
        self.compute()
            .conv2d_backward_weight(&Conv2dBackwardWeightDesc {
                dtype,
                input: x.data_ptr(),
                input_shape: dims4(&x),
                grad_output: dy.data_ptr(),
                grad_output_shape: expected,
                grad_weight: out.data_ptr(),
                weight_shape,
                stride: config.stride,
                padding: config.padding,
                dilation: config.dilation,
                groups: config.groups,
            })?;
        Ok(out)
    }

    /// The gradient of a convolution's bias: `grad_output` `[N, K, OH, OW]` summed over images
    /// and positions, `[K]`. `ShapeMismatch` unless `grad_output` has rank 4.
    pub fn conv2d_backward_bias(&self, grad_output: &Tensor) -> Result<Tensor> {
        self.check_operands("conv2d_backward_bias", &[grad_output])?;
        expect_rank("conv2d_backward_bias", "grad_output", grad_output, 4)?;
        grad_output.sum_dims(&[0, 2, 3], false)
    }

    /// Transposed 2-D convolution (`torch.nn.functional.conv_transpose2d`, sometimes called
    /// deconvolution) of `input` `[N, C_in, H, W]` with `weight` `[C_in, C_out/groups, R, S]` and an
    /// optional `[C_out]` bias, giving [`ConvTransposeConfig::output_shape`]: the input gradient of
    /// the convolution with that weight, which it runs on (the same kernels). With mixed precision
    /// on ([`Backend::enable_mixed_precision`]), f32 operands run in its compute dtype and the result
    /// comes back as f32. Errors: those of [`ConvTransposeConfig::output_shape`], `ShapeMismatch`
    /// for wrong ranks or a bias of the wrong length, `DTypeMismatch` for mixed dtypes.
    pub fn conv_transpose2d(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        config: ConvTransposeConfig,
    ) -> Result<Tensor> {
        let mut operands = vec![input, weight];
        operands.extend(bias);
        crate::runtime::amp::autocast(self, &operands, |t| {
            let op = "conv_transpose2d";
            let (input, weight) = (t[0], t[1]);
            self.check_operands(op, &[input, weight])?;
            expect_rank(op, "input", input, 4)?;
            expect_rank(op, "weight", weight, 4)?;
            let out_shape = config.output_shape(dims4(input), dims4(weight))?;
            let window = ConvConfig {
                stride: config.stride,
                padding: config.padding,
                dilation: config.dilation,
                groups: config.groups,
            };
            self.backward_input(op, input, weight, t.get(2).copied(), out_shape, window)
        })
    }
}

impl Tensor {
    /// Convolution of this `[N, C, H, W]` tensor; see [`Backend::conv2d`].
    pub fn conv2d(&self, weight: &Tensor, config: ConvConfig) -> Result<Tensor> {
        self.backend().conv2d(self, weight, config)
    }
}
