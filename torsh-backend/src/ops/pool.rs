//! `max_pool2d` and `avg_pool2d` over NCHW tensors.

use crate::backend::Backend;
use crate::compute::{Pool2dDesc, PoolKind};
use crate::error::Result;
use crate::tensor::Tensor;

use super::expect_rank;

/// A pooling window. `Pool2dConfig::new([2, 2])` gives a 2×2 window with stride 2 and no padding
/// (PyTorch's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dConfig {
    /// Window `[kh, kw]`.
    pub kernel: [usize; 2],
    /// `[sh, sw]`.
    pub stride: [usize; 2],
    /// Implicit padding `[ph, pw]`, at most half the window.
    pub padding: [usize; 2],
    /// For average pooling: divide by the whole window including padding (PyTorch's default `true`).
    pub count_include_pad: bool,
}

impl Pool2dConfig {
    /// A window of `kernel` with stride equal to the window and no padding.
    pub fn new(kernel: [usize; 2]) -> Self {
        Pool2dConfig {
            kernel,
            stride: kernel,
            padding: [0, 0],
            count_include_pad: true,
        }
    }
}

impl Backend {
    fn pool2d(&self, kind: PoolKind, x: &Tensor, config: Pool2dConfig) -> Result<Tensor> {
        let op = "pool2d";
        let dtype = self.check_operands(op, &[x])?;
        expect_rank(op, "input", x, 4)?;
        let s = x.shape();
        let input_shape = [s[0], s[1], s[2], s[3]];
        let output_shape = Pool2dDesc::expected_output_shape(
            input_shape,
            config.kernel,
            config.stride,
            config.padding,
        )?;
        let out = self.empty(&output_shape, dtype)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let x = x.contiguous()?;
        self.compute().pool2d(&Pool2dDesc {
            kind,
            dtype,
            input: x.data_ptr(),
            input_shape,
            output: out.data_ptr(),
            output_shape,
            kernel: config.kernel,
            stride: config.stride,
            padding: config.padding,
        })?;
        Ok(out)
    }

    /// Max over each window of `[N, C, H, W]`. `ShapeMismatch` when the window exceeds the padded input;
    /// `InvalidArgument` for a zero window or stride, or padding over half the window.
    pub fn max_pool2d(&self, x: &Tensor, config: Pool2dConfig) -> Result<Tensor> {
        self.pool2d(PoolKind::Max, x, config)
    }

    /// Mean over each window of `[N, C, H, W]`; errors as [`Backend::max_pool2d`].
    pub fn avg_pool2d(&self, x: &Tensor, config: Pool2dConfig) -> Result<Tensor> {
        let kind = PoolKind::Avg {
            count_include_pad: config.count_include_pad,
        };
        self.pool2d(kind, x, config)
    }
}

impl Tensor {
    /// See [`Backend::max_pool2d`].
    pub fn max_pool2d(&self, config: Pool2dConfig) -> Result<Tensor> {
        self.backend().max_pool2d(self, config)
    }

    /// See [`Backend::avg_pool2d`].
    pub fn avg_pool2d(&self, config: Pool2dConfig) -> Result<Tensor> {
        self.backend().avg_pool2d(self, config)
    }
}
