//! The LeNet-style network, its gradients and its Adam step, written with the crate's public ops on
//! device tensors. For `[N, 1, 8, 8]` images:
//!
//! conv 1→8 (3×3, padding 1) → relu → max-pool 2×2 → conv 8→16 (3×3, padding 1) → relu →
//! max-pool 2×2 → flatten (16·2·2 = 64) → linear 64→10 → cross-entropy (mean).
//!
//! The backward pass is written out op by op, as an autograd engine would record it: each forward
//! op saves what its gradient reads (the relu outputs, the max-pool positions, the flattened
//! features), and each backward op consumes one gradient and produces the next.

use torsh_backend::compute::Distribution;
use torsh_backend::prelude::*;

use crate::data::{CLASSES, SIDE};

/// Channels out of the first and the second convolution.
const C1: usize = 8;
const C2: usize = 16;
/// Features into the linear layer: `C2` planes of `(SIDE / 4)²` after two 2×2 poolings.
const FEATURES: usize = C2 * (SIDE / 4) * (SIDE / 4);

/// The shapes of the parameters, in the order [`LeNet::params`] holds them: each convolution's
/// weight and bias, then the linear layer's `[CLASSES, FEATURES]` weight and its bias.
pub fn parameter_shapes() -> [Vec<usize>; 6] {
    [
        vec![C1, 1, 3, 3],
        vec![C1],
        vec![C2, C1, 3, 3],
        vec![C2],
        vec![CLASSES, FEATURES],
        vec![CLASSES],
    ]
}

/// 3×3 windows with "same" padding.
fn same() -> ConvConfig {
    ConvConfig {
        padding: [1, 1],
        ..Default::default()
    }
}

/// 2×2 windows, stride 2.
fn pool() -> Pool2dConfig {
    Pool2dConfig::new([2, 2])
}

/// What one training step's forward pass leaves for its backward pass.
pub struct Forward {
    /// The mean cross-entropy loss, 0-d.
    pub loss: Tensor,
    r1: Tensor,
    i1: Tensor,
    p1: Tensor,
    r2: Tensor,
    i2: Tensor,
    features: Tensor,
    logits: Tensor,
}

/// The network's parameters and its optimizer state.
pub struct LeNet {
    /// The parameters, in [`parameter_shapes`]' order.
    pub params: Vec<Tensor>,
    adam: AdamState,
    lr: f32,
}

impl LeNet {
    /// A network initialised as PyTorch initialises `Conv2d` and `Linear`: every weight and bias
    /// uniform in `±1/√fan_in`, drawn from the crate's seeded generator (the same values on every
    /// backend). Trained by Adam with learning rate `lr` and PyTorch's other defaults.
    pub fn new(b: &Backend, dtype: DType, seed: u64, lr: f32) -> Result<LeNet> {
        let fan_in = [9, 9, C1 * 9, C1 * 9, FEATURES, FEATURES];
        let params = parameter_shapes()
            .iter()
            .zip(fan_in)
            .enumerate()
            .map(|(i, (shape, fan_in))| {
                let bound = 1.0 / (fan_in as f64).sqrt();
                let uniform = Distribution::Uniform {
                    low: -bound,
                    high: bound,
                };
                b.random_seeded(shape, dtype, uniform, seed.wrapping_add(i as u64))
            })
            .collect::<Result<_>>()?;
        Ok(LeNet {
            params,
            adam: AdamState::adam(),
            lr,
        })
    }

    /// The logits `[N, CLASSES]` of `images` `[N, 1, SIDE, SIDE]`, saving nothing (inference).
    pub fn logits(&self, images: &Tensor) -> Result<Tensor> {
        let p = &self.params;
        let b = images.backend();
        let h = b
            .conv2d_with_bias(images, &p[0], Some(&p[1]), same())?
            .relu()?;
        let h = h.max_pool2d(pool())?;
        let h = b.conv2d_with_bias(&h, &p[2], Some(&p[3]), same())?.relu()?;
        let h = h.max_pool2d(pool())?;
        let h = h.reshape(&[images.shape()[0], FEATURES])?;
        h.matmul(&p[4].t()?)?.add(&p[5])
    }

    /// The forward pass of a training step on `images` `[N, 1, SIDE, SIDE]` and `labels` `[N]`
    /// (`I64`), keeping what [`LeNet::backward`] needs.
    pub fn forward(&self, images: &Tensor, labels: &Tensor) -> Result<Forward> {
        let p = &self.params;
        let b = images.backend();
        let r1 = b
            .conv2d_with_bias(images, &p[0], Some(&p[1]), same())?
            .relu()?;
        let (p1, i1) = r1.max_pool2d_with_indices(pool())?;
        let r2 = b
            .conv2d_with_bias(&p1, &p[2], Some(&p[3]), same())?
            .relu()?;
        let (p2, i2) = r2.max_pool2d_with_indices(pool())?;
        let features = p2.reshape(&[images.shape()[0], FEATURES])?;
        let logits = features.matmul(&p[4].t()?)?.add(&p[5])?;
        let loss = logits.cross_entropy(labels, CrossEntropyConfig::default())?;
        Ok(Forward {
            loss,
            r1,
            i1,
            p1,
            r2,
            i2,
            features,
            logits,
        })
    }

    /// The gradient of the loss with respect to each parameter, in [`LeNet::params`]' order.
    pub fn backward(&self, f: &Forward, images: &Tensor, labels: &Tensor) -> Result<Vec<Tensor>> {
        let p = &self.params;
        let b = images.backend();
        let one = b.full(&[], 1.0, f.loss.dtype())?;
        let config = CrossEntropyConfig::default();
        // Linear layer: dW = dYᵀ·X, db = Σ dY over the batch, dX = dY·W.
        let dlogits = b.cross_entropy_backward(&one, &f.logits, labels, config)?;
        let dfc_w = dlogits.t()?.matmul(&f.features)?;
        let dfc_b = dlogits.sum(0, false)?;
        let dfeatures = dlogits.matmul(&p[4])?;
        // Second block, from the pooled planes back to the first pool's output.
        let dp2 = dfeatures.reshape(&[images.shape()[0], C2, SIDE / 4, SIDE / 4])?;
        let dr2 = b.max_pool2d_backward(&dp2, &f.i2, f.r2.shape(), pool())?;
        let da2 = f.r2.unary_backward(UnaryOp::Relu, &dr2)?;
        let dw2 = b.conv2d_backward_weight(&da2, &f.p1, p[2].shape(), same())?;
        let db2 = b.conv2d_backward_bias(&da2)?;
        let dp1 = b.conv2d_backward_input(&da2, &p[2], f.p1.shape(), same())?;
        // First block: the images need no gradient.
        let dr1 = b.max_pool2d_backward(&dp1, &f.i1, f.r1.shape(), pool())?;
        let da1 = f.r1.unary_backward(UnaryOp::Relu, &dr1)?;
        let dw1 = b.conv2d_backward_weight(&da1, images, p[0].shape(), same())?;
        let db1 = b.conv2d_backward_bias(&da1)?;
        Ok(vec![dw1, db1, dw2, db2, dfc_w, dfc_b])
    }

    /// One Adam step on the parameters, in place.
    pub fn update(&mut self, grads: &[Tensor]) -> Result<()> {
        let b = self.params[0].backend().clone();
        b.fused_adam_step(
            &mut self.params,
            grads,
            &mut self.adam,
            self.lr,
            (0.9, 0.999),
        )
    }

    /// How many of `images` the network classifies as `labels` says (`I64`, `[N]`).
    pub fn correct(&self, images: &Tensor, labels: &Tensor) -> Result<usize> {
        let predicted = self.logits(images)?.argmax(1, false)?;
        let hits = predicted.eq(labels)?.cast(DType::F32)?.sum_all()?;
        Ok(hits.item()? as usize)
    }
}
