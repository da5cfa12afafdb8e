//! `conv2d` over NCHW tensors with stride, padding, dilation, groups and an optional bias.

use crate::backend::Backend;
use crate::compute::{Conv2dDesc, TunableOp};
use crate::error::Result;
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

fn dims4(t: &Tensor) -> [usize; 4] {
    [t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]]
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
            self.conv2d_as_is(&t[0], &t[1], t.get(2), config)
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

impl Tensor {
    /// Convolution of this `[N, C, H, W]` tensor; see [`Backend::conv2d`].
    pub fn conv2d(&self, weight: &Tensor, config: ConvConfig) -> Result<Tensor> {
        self.backend().conv2d(self, weight, config)
    }
}
