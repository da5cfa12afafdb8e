//! A small CNN's training step, written with the crate's forward and backward ops: the parity suite
//! runs it on every backend against the reference, and a test checks its gradients by finite
//! differences. The network, for `[N, 1, 8, 8]` images and [`CLASSES`] classes:
//! conv 1→4 (3×3, padding 1) → relu → max-pool 2×2 → conv 4→6 (3×3, padding 1) → relu → max-pool
//! 2×2 → linear 24→[`CLASSES`] → cross-entropy (mean), then one Adam step.

use crate::backend::Backend;
use crate::compute::UnaryOp;
use crate::error::Result;
use crate::ops::conv::ConvConfig;
use crate::ops::loss::CrossEntropyConfig;
use crate::ops::optim::AdamState;
use crate::ops::pool::Pool2dConfig;
use crate::tensor::Tensor;

/// Classes of the classifier.
pub const CLASSES: usize = 5;

/// Side of the square single-channel input images.
pub const SIDE: usize = 8;

/// The parameters' shapes, in the order [`loss_and_grads`] takes and returns them: the two
/// convolutions' weights and biases, then the linear layer's `[CLASSES, 24]` weight and bias.
pub fn parameter_shapes() -> [Vec<usize>; 6] {
    [
        vec![4, 1, 3, 3],
        vec![4],
        vec![6, 4, 3, 3],
        vec![6],
        vec![CLASSES, 6 * (SIDE / 4) * (SIDE / 4)],
        vec![CLASSES],
    ]
}

/// The convolutions' window: 3×3 "same" padding.
fn same() -> ConvConfig {
    ConvConfig {
        padding: [1, 1],
        ..Default::default()
    }
}

/// The pooling window: 2×2, stride 2.
fn pool() -> Pool2dConfig {
    Pool2dConfig::new([2, 2])
}

/// What the backward needs of the forward.
struct Forward {
    r1: Tensor,
    i1: Tensor,
    p1: Tensor,
    r2: Tensor,
    i2: Tensor,
    h: Tensor,
    logits: Tensor,
    loss: Tensor,
}

/// The forward pass of `images` `[N, 1, SIDE, SIDE]` against `labels` `[N]` (`I64`).
fn forward(b: &Backend, images: &Tensor, labels: &Tensor, p: &[Tensor]) -> Result<Forward> {
    let r1 = b
        .conv2d_with_bias(images, &p[0], Some(&p[1]), same())?
        .relu()?;
    let (p1, i1) = r1.max_pool2d_with_indices(pool())?;
    let r2 = b
        .conv2d_with_bias(&p1, &p[2], Some(&p[3]), same())?
        .relu()?;
    let (p2, i2) = r2.max_pool2d_with_indices(pool())?;
    let h = p2.reshape(&[p2.shape()[0], p[4].shape()[1]])?;
    let logits = h.matmul(&p[4].t()?)?.add(&p[5])?;
    let loss = logits.cross_entropy(labels, CrossEntropyConfig::default())?;
    Ok(Forward {
        r1,
        i1,
        p1,
        r2,
        i2,
        h,
        logits,
        loss,
    })
}

/// The mean cross-entropy loss (a 0-d tensor) of the network with parameters `params` (of
/// [`parameter_shapes`]) on `images` `[N, 1, SIDE, SIDE]` and `labels` `[N]` (`I64`). Errors: those
/// of the ops, e.g. `ShapeMismatch` for parameters of other shapes.
pub fn loss(b: &Backend, images: &Tensor, labels: &Tensor, params: &[Tensor]) -> Result<Tensor> {
    Ok(forward(b, images, labels, params)?.loss)
}

/// The loss and its gradient with respect to each parameter (in `params`' order), through the
/// backward ops: `cross_entropy_backward`, the linear layer's two matmuls and a column sum,
/// `max_pool2d_backward`, `unary_backward` of relu and the three convolution gradients. Errors as
/// [`loss`].
pub fn loss_and_grads(
    b: &Backend,
    images: &Tensor,
    labels: &Tensor,
    params: &[Tensor],
) -> Result<(Tensor, Vec<Tensor>)> {
    let f = forward(b, images, labels, params)?;
    let one = b.full(&[], 1.0, f.loss.dtype())?;
    let config = CrossEntropyConfig::default();
    let dlogits = b.cross_entropy_backward(&one, &f.logits, labels, config)?;
    let dfc_w = dlogits.t()?.matmul(&f.h)?;
    let dfc_b = b.sum(&dlogits, 0, false)?;
    let dh = dlogits.matmul(&params[4])?;
    let p2_shape = [f.h.shape()[0], params[2].shape()[0], SIDE / 4, SIDE / 4];
    let dr2 = b.max_pool2d_backward(&dh.reshape(&p2_shape)?, &f.i2, f.r2.shape(), pool())?;
    let da2 = f.r2.unary_backward(UnaryOp::Relu, &dr2)?;
    let dw2 = b.conv2d_backward_weight(&da2, &f.p1, params[2].shape(), same())?;
    let db2 = b.conv2d_backward_bias(&da2)?;
    let dp1 = b.conv2d_backward_input(&da2, &params[2], f.p1.shape(), same())?;
    let dr1 = b.max_pool2d_backward(&dp1, &f.i1, f.r1.shape(), pool())?;
    let da1 = f.r1.unary_backward(UnaryOp::Relu, &dr1)?;
    let dw1 = b.conv2d_backward_weight(&da1, images, params[0].shape(), same())?;
    let db1 = b.conv2d_backward_bias(&da1)?;
    Ok((f.loss, vec![dw1, db1, dw2, db2, dfc_w, dfc_b]))
}

/// One training step: the loss and gradients of [`loss_and_grads`], then an Adam step (lr 1e-2,
/// betas 0.9 and 0.999) on `params` in place. Returns the loss and the gradients.
pub fn training_step(
    b: &Backend,
    images: &Tensor,
    labels: &Tensor,
    params: &mut [Tensor],
    state: &mut AdamState,
) -> Result<(Tensor, Vec<Tensor>)> {
    let (loss, grads) = loss_and_grads(b, images, labels, params)?;
    b.fused_adam_step(params, &grads, state, 1e-2, (0.9, 0.999))?;
    Ok((loss, grads))
}
