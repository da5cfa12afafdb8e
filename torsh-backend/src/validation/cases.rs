//! The body of each op's parity case. Inputs are random (never zeros), sizes include 1, primes and
//! sizes that are no multiple of any tile, and strided views (transposes, narrows, broadcasts) appear
//! wherever the op accepts them.

use super::{Inputs, ParityCase};
use crate::compute::{
    BinaryOp, CompareOp, Distribution, ReduceOp, ScanDesc, ScanOp, SortDesc, UnaryOp,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::conv::{ConvConfig, ConvTransposeConfig};
use crate::ops::loss::{CrossEntropyConfig, Reduction};
use crate::ops::norm::BatchNormConfig;
use crate::ops::optim::AdamState;
use crate::ops::pool::Pool2dConfig;
use crate::tensor::Tensor;

const FLOATS: &[DType] = &DType::FLOATS;

/// Every parity case, in report order. A case's inputs come from its index's seed
/// ([`super::case_seed`]), so new cases go at the end, leaving every other case's inputs as they were.
pub fn all() -> Vec<ParityCase> {
    vec![
        ParityCase {
            op: "matmul",
            dtypes: FLOATS,
            body: matmul,
        },
        ParityCase {
            op: "matmul_batched",
            dtypes: FLOATS,
            body: matmul_batched,
        },
        ParityCase {
            op: "gemm",
            dtypes: FLOATS,
            body: gemm,
        },
        ParityCase {
            op: "gemv",
            dtypes: FLOATS,
            body: gemv,
        },
        ParityCase {
            op: "conv2d",
            dtypes: FLOATS,
            body: conv2d,
        },
        ParityCase {
            op: "attention",
            dtypes: FLOATS,
            body: attention,
        },
        ParityCase {
            op: "softmax",
            dtypes: FLOATS,
            body: softmax,
        },
        ParityCase {
            op: "layer_norm",
            dtypes: FLOATS,
            body: layer_norm,
        },
        ParityCase {
            op: "batch_norm",
            dtypes: FLOATS,
            body: batch_norm,
        },
        ParityCase {
            op: "unary",
            dtypes: FLOATS,
            body: unary,
        },
        ParityCase {
            op: "unary_backward",
            dtypes: FLOATS,
            body: unary_backward,
        },
        ParityCase {
            op: "softmax_backward",
            dtypes: FLOATS,
            body: softmax_backward,
        },
        ParityCase {
            op: "cross_entropy",
            dtypes: FLOATS,
            body: cross_entropy,
        },
        ParityCase {
            op: "dropout",
            dtypes: FLOATS,
            body: dropout,
        },
        ParityCase {
            op: "binary",
            dtypes: FLOATS,
            body: binary,
        },
        ParityCase {
            op: "reduce",
            dtypes: FLOATS,
            body: reduce,
        },
        ParityCase {
            op: "pool2d",
            dtypes: FLOATS,
            body: pool2d,
        },
        ParityCase {
            op: "pool2d_backward",
            dtypes: FLOATS,
            body: pool2d_backward,
        },
        ParityCase {
            op: "adam",
            dtypes: FLOATS,
            body: adam,
        },
        ParityCase {
            op: "unscale",
            dtypes: FLOATS,
            body: unscale,
        },
        ParityCase {
            op: "cast_copy",
            dtypes: FLOATS,
            body: cast_copy,
        },
        ParityCase {
            op: "random",
            dtypes: FLOATS,
            body: random,
        },
        ParityCase {
            op: "gather",
            dtypes: FLOATS,
            body: gather,
        },
        ParityCase {
            op: "scatter",
            dtypes: FLOATS,
            body: scatter,
        },
        ParityCase {
            op: "shape",
            dtypes: FLOATS,
            body: shape,
        },
        ParityCase {
            op: "compare",
            dtypes: &DType::ALL,
            body: compare,
        },
        ParityCase {
            op: "scan",
            dtypes: &DType::ALL,
            body: scan,
        },
        ParityCase {
            op: "sort",
            dtypes: &DType::ALL,
            body: sort,
        },
        ParityCase {
            op: "conv2d_backward",
            dtypes: FLOATS,
            body: conv2d_backward,
        },
        ParityCase {
            op: "norm_backward",
            dtypes: FLOATS,
            body: norm_backward,
        },
        ParityCase {
            op: "cnn_training_step",
            // In 16 bits a max-pool window whose two largest values lie within a rounding of each
            // other may pick either on different backends (each op within its bounds), which
            // routes a gradient elsewhere: the 16-bit dtypes are checked op by op above.
            dtypes: &[DType::F32, DType::F64],
            body: cnn_training_step,
        },
        ParityCase {
            op: "attention_backward",
            dtypes: FLOATS,
            body: attention_backward,
        },
    ]
}

/// Looks a case up by name.
pub fn find(op: &str) -> Option<ParityCase> {
    all().into_iter().find(|c| c.op == op)
}

fn matmul(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let mut out = Vec::new();
    // (13, 128, 67): whole four-vector column blocks, a masked tail and a row remainder on the
    // CPU's small-product tiles, at their largest inner dimension.
    for &(m, k, n) in &[
        (1, 1, 1),
        (7, 13, 5),
        (17, 3, 31),
        (33, 65, 9),
        (13, 128, 67),
    ] {
        let a = i.normal(&[m, k])?;
        let b = i.normal(&[k, n])?;
        out.push(a.matmul(&b)?);
    }
    // Transposed and narrowed operands reach the kernel as strided views.
    let at = i.normal(&[11, 6])?.t()?;
    let bt = i.normal(&[5, 11])?.t()?;
    out.push(at.matmul(&bt)?);
    let wide = i.normal(&[6, 20])?.narrow(1, 3, 11)?;
    out.push(wide.matmul(&i.normal(&[11, 4])?)?);
    let skip = i.normal(&[12, 9])?.narrow(0, 1, 9)?.t()?.narrow(0, 0, 7)?;
    out.push(skip.matmul(&i.normal(&[9, 3])?)?);
    // Vector rules.
    let v = i.normal(&[7])?;
    out.push(i.normal(&[5, 7])?.matmul(&v)?);
    out.push(v.matmul(&i.normal(&[7, 4])?)?);
    out.push(v.matmul(&v)?);
    Ok(out)
}

fn matmul_batched(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let a = i.normal(&[3, 5, 7])?;
    let b = i.normal(&[3, 7, 2])?;
    let bc_a = i.normal(&[2, 1, 4, 6])?;
    let bc_b = i.normal(&[3, 6, 5])?;
    let perm = i.normal(&[5, 3, 7])?.permute(&[1, 0, 2])?;
    let shared = i.normal(&[7, 4])?;
    // Many small products: each too small to split, together worth the CPU's threads, which run
    // them side by side.
    let many_a = i.normal(&[64, 16, 17])?;
    let many_b = i.normal(&[64, 17, 18])?;
    Ok(vec![
        a.matmul(&b)?,
        bc_a.matmul(&bc_b)?,
        perm.matmul(&shared)?,
        a.matmul(&b.transpose(1, 2)?.transpose(1, 2)?)?,
        many_a.matmul(&many_b)?,
    ])
}

fn gemm(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let a = i.normal(&[9, 5])?;
    let w = i.normal(&[5, 13])?;
    let c = i.normal(&[9, 13])?;
    let row = i.normal(&[13])?;
    Ok(vec![
        b.gemm(&a, &w, 0.7, &c, -1.3)?,
        b.gemm(&a, &w, 1.5, &c, 0.0)?,
        b.gemm(&a.t()?.t()?, &i.normal(&[13, 5])?.t()?, 1.0, &row, 1.0)?,
    ])
}

fn gemv(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let a = i.normal(&[11, 7])?;
    let x = i.normal(&[7])?;
    let y = i.normal(&[11])?;
    let at = i.normal(&[7, 11])?.t()?;
    let strided_x = i
        .normal(&[14])?
        .reshape(&[7, 2])?
        .narrow(1, 1, 1)?
        .squeeze(1)?;
    Ok(vec![
        b.gemv(&a, &x, 0.9, &y, -0.4)?,
        b.gemv(&at, &strided_x, 1.0, &y, 0.0)?,
    ])
}

fn conv2d(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let x = i.normal(&[2, 4, 9, 7])?;
    let w = i.normal(&[6, 4, 3, 3])?;
    let bias = i.normal(&[6])?;
    let plain = b.conv2d(
        &x,
        &w,
        ConvConfig {
            padding: [1, 1],
            ..Default::default()
        },
    )?;
    let grouped = b.conv2d_with_bias(
        &x,
        &i.normal(&[6, 2, 3, 2])?,
        Some(&i.normal(&[6])?),
        ConvConfig {
            stride: [2, 1],
            padding: [1, 1],
            dilation: [2, 1],
            groups: 2,
        },
    )?;
    let depthwise = b.conv2d(
        &x,
        &i.normal(&[4, 1, 3, 3])?,
        ConvConfig {
            groups: 4,
            padding: [1, 0],
            ..Default::default()
        },
    )?;
    let with_bias = b.conv2d_with_bias(
        &x.permute(&[0, 1, 3, 2])?,
        &w,
        Some(&bias),
        ConvConfig::default(),
    )?;
    let one = b.conv2d(
        &i.normal(&[1, 1, 1, 1])?,
        &i.normal(&[1, 1, 1, 1])?,
        ConvConfig::default(),
    )?;
    // Channel-rich 3×3 at stride 1, odd sizes (6 × 7 tiles of 2×2, partial at both edges, and
    // at least the 32 tiles the default asks for): the CPU's Winograd kernel.
    let deep = b.conv2d_with_bias(
        &i.normal(&[1, 16, 11, 13])?,
        &i.normal(&[17, 16, 3, 3])?,
        Some(&i.normal(&[17])?),
        ConvConfig {
            padding: [1, 1],
            ..Default::default()
        },
    )?;
    // A first layer's 7×7 window at stride 2 on three channels: the CPU's direct kernel.
    let stem = b.conv2d_with_bias(
        &i.normal(&[1, 3, 17, 19])?,
        &i.normal(&[7, 3, 7, 7])?,
        Some(&i.normal(&[7])?),
        ConvConfig {
            stride: [2, 2],
            padding: [3, 3],
            ..Default::default()
        },
    )?;
    Ok(vec![plain, grouped, depthwise, with_bias, one, deep, stem])
}

fn cnn_training_step(i: &mut Inputs) -> Result<Vec<Tensor>> {
    // Two steps of `validation::cnn` on a batch of 3 images: each step's loss and gradients, then
    // the parameters and Adam's moments.
    use super::cnn;
    let b = i.backend();
    let images = i.normal(&[3, 1, cnn::SIDE, cnn::SIDE])?;
    let labels = i.indices(&[3], cnn::CLASSES, DType::I64)?;
    let mut params = cnn::parameter_shapes()
        .iter()
        .map(|shape| i.normal(shape))
        .collect::<Result<Vec<_>>>()?;
    let mut state = AdamState::adam();
    let mut out = Vec::new();
    for _ in 0..2 {
        let (loss, grads) = cnn::training_step(b, &images, &labels, &mut params, &mut state)?;
        out.push(loss);
        out.extend(grads);
    }
    out.extend(params);
    out.extend(state.exp_avg().iter().cloned());
    out.extend(state.exp_avg_sq().iter().cloned());
    Ok(out)
}

fn norm_backward(i: &mut Inputs) -> Result<Vec<Tensor>> {
    // The forwards that save their statistics, then the backwards from statistics given as inputs
    // (so each backend differentiates at the same point): layer norm over 37 columns with a
    // weight and over [3, 10] without, a transposed gradient; batch norm with long runs in
    // training, short runs with fixed statistics, and [N, C] without a weight.
    let b = i.backend();
    let stats_dtype = crate::compute::stats_dtype(i.dtype());
    let stats = |i: &mut Inputs, n: usize| -> Result<(Tensor, Tensor)> {
        let mean = i.uniform(&[n], -0.5, 0.5)?.cast(stats_dtype)?;
        let invstd = i.uniform(&[n], 0.5, 2.0)?.cast(stats_dtype)?;
        Ok((mean, invstd))
    };
    let mut out = Vec::new();
    let x = i.normal(&[5, 37])?;
    let w = i.normal(&[37])?;
    let bias = i.normal(&[37])?;
    let saved = x.layer_norm_with_stats(&[37], Some(&w), Some(&bias), 1e-5)?;
    out.extend([saved.output, saved.mean, saved.invstd]);
    let (mean, invstd) = stats(i, 5)?;
    let g = i.normal(&[37, 5])?.t()?;
    let grads = b.layer_norm_backward(&g, &x, &[37], Some(&w), &mean, &invstd)?;
    out.extend([grads.input, grads.weight, grads.bias]);
    let x3 = i.normal(&[2, 3, 10])?;
    let (mean, invstd) = stats(i, 2)?;
    let grads =
        b.layer_norm_backward(&i.normal(&[2, 3, 10])?, &x3, &[3, 10], None, &mean, &invstd)?;
    out.extend([grads.input, grads.weight, grads.bias]);

    let xb = i.normal(&[3, 4, 41])?;
    let wb = i.normal(&[4])?;
    let saved = xb.batch_norm_with_stats(BatchNormConfig {
        weight: Some(&wb),
        training: true,
        ..Default::default()
    })?;
    out.extend([saved.output, saved.mean, saved.invstd]);
    let (mean, invstd) = stats(i, 4)?;
    for training in [true, false] {
        let g = i.normal(&[3, 4, 41])?;
        let grads = b.batch_norm_backward(&g, &xb, Some(&wb), &mean, &invstd, training)?;
        out.extend([grads.input, grads.weight, grads.bias]);
    }
    let xs = i.normal(&[6, 5, 2, 3])?;
    let (mean, invstd) = stats(i, 5)?;
    let grads =
        b.batch_norm_backward(&i.normal(&[6, 5, 2, 3])?, &xs, None, &mean, &invstd, true)?;
    out.extend([grads.input, grads.weight, grads.bias]);
    let flat = i.normal(&[9, 3])?;
    let (mean, invstd) = stats(i, 3)?;
    let grads = b.batch_norm_backward(&i.normal(&[9, 3])?, &flat, None, &mean, &invstd, true)?;
    out.extend([grads.input, grads.weight, grads.bias]);
    Ok(out)
}

fn conv2d_backward(i: &mut Inputs) -> Result<Vec<Tensor>> {
    // Padded, strided-dilated-grouped, depthwise with a channel multiplier, and strided pointwise
    // windows; the input, weight and bias gradients of each, the output gradient of the second a
    // transposed view; then a transposed convolution with output padding and a bias.
    let b = i.backend();
    let x = i.normal(&[2, 4, 9, 7])?;
    let mut out = Vec::new();
    for (w_shape, config) in [
        (
            [6, 4, 3, 3],
            ConvConfig {
                padding: [1, 1],
                ..Default::default()
            },
        ),
        (
            [6, 2, 3, 2],
            ConvConfig {
                stride: [2, 1],
                padding: [1, 1],
                dilation: [2, 1],
                groups: 2,
            },
        ),
        (
            [8, 1, 3, 3],
            ConvConfig {
                stride: [2, 2],
                padding: [1, 0],
                groups: 4,
                ..Default::default()
            },
        ),
        (
            [3, 4, 1, 1],
            ConvConfig {
                stride: [2, 2],
                ..Default::default()
            },
        ),
    ] {
        let w = i.normal(&w_shape)?;
        let y_shape = b.conv2d(&x, &w, config)?.shape().to_vec();
        let grad = if config.groups == 2 {
            let [n, k, oh, ow] = [y_shape[0], y_shape[1], y_shape[2], y_shape[3]];
            i.normal(&[n, k, ow, oh])?.transpose(2, 3)?
        } else {
            i.normal(&y_shape)?
        };
        out.push(b.conv2d_backward_input(&grad, &w, x.shape(), config)?);
        out.push(b.conv2d_backward_weight(&grad, &x, &w_shape, config)?);
        out.push(b.conv2d_backward_bias(&grad)?);
    }
    let transposed = b.conv_transpose2d(
        &i.normal(&[2, 4, 5, 4])?,
        &i.normal(&[4, 3, 3, 2])?,
        Some(&i.normal(&[6])?),
        ConvTransposeConfig {
            stride: [2, 3],
            padding: [1, 0],
            output_padding: [1, 2],
            dilation: [1, 2],
            groups: 2,
        },
    )?;
    out.push(transposed);
    Ok(out)
}

fn attention(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let q = i.normal(&[2, 3, 5, 8])?;
    let k = i.normal(&[2, 3, 7, 8])?;
    let v = i.normal(&[2, 3, 7, 8])?;
    let q_strided = i.normal(&[2, 3, 8, 5])?.transpose(2, 3)?;
    let q_long = i.normal(&[1, 2, 9, 4])?;
    let kv = i.normal(&[1, 2, 6, 4])?;
    Ok(vec![
        b.attention(&q, &k, &v, false)?,
        b.attention(&q, &k, &v, true)?,
        b.attention(&q_long, &kv, &kv, true)?,
        b.attention_with_scale(&q_strided, &k, &v, false, 0.3)?,
        b.attention(
            &i.normal(&[1, 1, 1, 1])?,
            &i.normal(&[1, 1, 1, 1])?,
            &i.normal(&[1, 1, 1, 1])?,
            true,
        )?,
    ])
}

fn attention_backward(i: &mut Inputs) -> Result<Vec<Tensor>> {
    // The forward's output and log-sum-exp, then the gradients from an output and log-sum-exp
    // given as inputs (so each backend differentiates at the same point): non-causal with more
    // keys than queries, causal with more queries than keys, several key and query tiles with a
    // transposed query and gradient, and a single key.
    let b = i.backend();
    let stats_dtype = crate::compute::stats_dtype(i.dtype());
    let mut out = Vec::new();
    let (q, k, v) = (
        i.normal(&[2, 3, 5, 8])?,
        i.normal(&[2, 3, 7, 8])?,
        i.normal(&[2, 3, 7, 8])?,
    );
    let fwd = b.attention_with_lse(&q, &k, &v, true, 0.4)?;
    out.extend([fwd.output, fwd.lse]);
    let cases: [([usize; 5], bool, bool); 4] = [
        ([2, 3, 5, 7, 8], false, false),
        ([1, 2, 9, 6, 4], true, false),
        ([1, 2, 70, 133, 16], true, true),
        ([1, 1, 1, 1, 3], false, false),
    ];
    for ([batch, heads, sq, skv, dim], causal, strided) in cases {
        let q = if strided {
            i.normal(&[batch, heads, dim, sq])?.transpose(2, 3)?
        } else {
            i.normal(&[batch, heads, sq, dim])?
        };
        let (k, v) = (
            i.normal(&[batch, heads, skv, dim])?,
            i.normal(&[batch, heads, skv, dim])?,
        );
        let o = i.normal(&[batch, heads, sq, dim])?;
        let g = if strided {
            i.normal(&[batch, heads, dim, sq])?.transpose(2, 3)?
        } else {
            i.normal(&[batch, heads, sq, dim])?
        };
        let lse = i
            .uniform(&[batch, heads, sq], 2.0, 3.0)?
            .cast(stats_dtype)?;
        let scale = 1.0 / (dim as f64).sqrt();
        let grads = b.attention_backward(&g, &q, &k, &v, &o, &lse, causal, scale)?;
        out.extend([grads.q, grads.k, grads.v]);
    }
    Ok(out)
}

fn softmax(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let x = i.uniform(&[3, 7, 5], -4.0, 4.0)?;
    let xt = x.transpose(0, 2)?;
    Ok(vec![
        x.softmax(-1)?,
        x.softmax(1)?,
        x.log_softmax(0)?,
        xt.log_softmax(-1)?,
        xt.softmax(1)?,
    ])
}

fn layer_norm(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let x = i.normal(&[4, 3, 10])?;
    let w = i.normal(&[10])?;
    let bias = i.normal(&[10])?;
    let w2 = i.normal(&[3, 10])?;
    Ok(vec![
        x.layer_norm(&[10], Some(&w), Some(&bias), 1e-5)?,
        x.layer_norm(&[3, 10], Some(&w2), None, 1e-3)?,
        x.transpose(0, 1)?.layer_norm(&[10], None, None, 1e-5)?,
    ])
}

fn batch_norm(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let x = i.normal(&[5, 3, 4, 3])?;
    let w = i.normal(&[3])?;
    let bias = i.normal(&[3])?;
    let rm = i.normal(&[3])?;
    let rv = i.uniform(&[3], 0.5, 2.0)?;
    let train = x.batch_norm(BatchNormConfig {
        weight: Some(&w),
        bias: Some(&bias),
        running_mean: Some(&rm),
        running_var: Some(&rv),
        training: true,
        momentum: Some(0.3),
        eps: Some(1e-5),
    })?;
    let infer = i
        .backend()
        .batch_norm(&x.permute(&[0, 1, 3, 2])?, &rm, &rv, false)?;
    let flat = i.normal(&[7, 3])?.batch_norm(BatchNormConfig {
        training: true,
        ..Default::default()
    })?;
    Ok(vec![train, rm, rv, infer, flat])
}

fn unary(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let general = i.uniform(&[6, 7], -3.0, 3.0)?.t()?;
    let positive = i.uniform(&[5, 3], 0.25, 4.0)?;
    let mut out = Vec::new();
    for &op in UnaryOp::ALL {
        let x = match op {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => &positive,
            _ => &general,
        };
        out.push(i.backend().unary(op, x)?);
    }
    Ok(out)
}

fn unary_backward(i: &mut Inputs) -> Result<Vec<Tensor>> {
    // A transposed input, a gradient of its shape, and a row of gradients broadcast down it.
    let general = i.uniform(&[6, 7], -3.0, 3.0)?.t()?;
    let positive = i.uniform(&[7, 6], 0.25, 4.0)?;
    let grad = i.normal(&[7, 6])?;
    let row = i.normal(&[1, 6])?;
    let mut out = Vec::new();
    for &op in UnaryOp::ALL {
        let x = match op {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => &positive,
            _ => &general,
        };
        out.push(x.unary_backward_from_input(op, &grad)?);
        out.push(x.unary_backward_from_input(op, &row)?);
    }
    // One element, and none.
    let one = i.uniform(&[1], 0.5, 2.0)?;
    out.push(one.unary_backward_from_input(UnaryOp::Gelu, &i.normal(&[1])?)?);
    let none = i.normal(&[0, 3])?;
    out.push(none.unary_backward_from_input(UnaryOp::Tanh, &i.normal(&[0, 3])?)?);
    Ok(out)
}

fn softmax_backward(i: &mut Inputs) -> Result<Vec<Tensor>> {
    // Along the last dim and the first, of outputs of a transposed input; an odd row length.
    let x = i.normal(&[5, 11])?.t()?;
    let grad = i.normal(&[11, 5])?;
    let b = i.backend();
    let mut out = Vec::new();
    for axis in [-1, 0] {
        out.push(b.softmax_backward(&grad, &x.softmax(axis)?, axis)?);
        out.push(b.log_softmax_backward(&grad, &x.log_softmax(axis)?, axis)?);
    }
    // A row of one.
    let one = i.normal(&[3, 1])?;
    out.push(b.softmax_backward(&i.normal(&[3, 1])?, &one.softmax(1)?, 1)?);
    // The middle dim of [3, 67, 9] (inner > 1), rows of 1 031 across blocks, and a 0-d tensor.
    let mid = i.normal(&[3, 67, 9])?;
    let grad = i.normal(&[3, 67, 9])?;
    out.push(b.softmax_backward(&grad, &mid.softmax(1)?, 1)?);
    out.push(b.log_softmax_backward(&grad, &mid.log_softmax(1)?, 1)?);
    let long = i.normal(&[4, 1031])?;
    let grad = i.normal(&[4, 1031])?;
    out.push(b.softmax_backward(&grad, &long.softmax(-1)?, -1)?);
    out.push(b.log_softmax_backward(&grad, &long.log_softmax(-1)?, -1)?);
    let scalar = i.normal(&[])?;
    out.push(b.log_softmax_backward(&i.normal(&[])?, &scalar.log_softmax(0)?, 0)?);
    Ok(out)
}

fn cross_entropy(i: &mut Inputs) -> Result<Vec<Tensor>> {
    // Logits of a transposed view with an odd class count, an ignored sample, every reduction with
    // and without smoothing, their gradients, and nll_loss.
    let logits = i.normal(&[11, 7])?.t()?;
    let b = i.backend();
    let target = b.from_slice(&[3i64, 10, -100, 0, 5, 5, 1], &[7])?;
    let mut out = Vec::new();
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let grad = match reduction {
            Reduction::None => i.normal(&[7])?,
            _ => i.normal(&[])?,
        };
        for label_smoothing in [0.0, 0.2] {
            let config = CrossEntropyConfig {
                reduction,
                label_smoothing,
                ..Default::default()
            };
            out.push(logits.cross_entropy(&target, config)?);
            out.push(b.cross_entropy_backward(&grad, &logits, &target, config)?);
        }
        let logp = logits.log_softmax(1)?;
        out.push(logp.nll_loss(&target, reduction, Some(-100))?);
        out.push(b.nll_loss_backward(&grad, &logp, &target, reduction, Some(-100))?);
    }
    // Rows of 1 031 classes with I32 targets, no ignore index, full smoothing; a class of one.
    let wide = i.normal(&[3, 1031])?;
    let target = b.from_slice(&[1030i32, 0, 517], &[3])?;
    let grad = i.normal(&[3])?;
    for label_smoothing in [0.0, 1.0] {
        let config = CrossEntropyConfig {
            reduction: Reduction::None,
            ignore_index: None,
            label_smoothing,
        };
        out.push(wide.cross_entropy(&target, config)?);
        out.push(b.cross_entropy_backward(&grad, &wide, &target, config)?);
    }
    let single = i.normal(&[2, 1])?;
    let zeros = b.from_slice(&[0i64, 0], &[2])?;
    let config = CrossEntropyConfig::default();
    out.push(single.cross_entropy(&zeros, config)?);
    out.push(b.cross_entropy_backward(&i.normal(&[])?, &single, &zeros, config)?);
    Ok(out)
}

fn dropout(i: &mut Inputs) -> Result<Vec<Tensor>> {
    // A strided view (made dense first), an odd length, the backward, and both ends of p.
    let x = i.normal(&[9, 13])?.t()?;
    let grad = i.normal(&[13, 9])?;
    let mut out = Vec::new();
    for (p, seed) in [(0.3, 5), (0.5, 6), (0.0, 7), (1.0, 8)] {
        out.push(x.dropout(p, seed)?);
        out.push(i.backend().dropout_backward(&grad, p, seed)?);
    }
    // One element, and none.
    out.push(i.normal(&[1])?.dropout(0.5, 9)?);
    out.push(i.normal(&[0, 4])?.dropout(0.5, 9)?);
    Ok(out)
}

fn binary(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let a = i.uniform(&[4, 1, 5], 0.5, 2.0)?;
    let b = i.uniform(&[3, 1], 0.5, 2.0)?;
    let c = i.uniform(&[5, 3], -2.0, 2.0)?.t()?;
    let row = i.uniform(&[1, 5], 0.5, 2.0)?;
    let mut out = Vec::new();
    for &op in BinaryOp::ALL {
        out.push(i.backend().binary(op, &a, &b)?);
        if op != BinaryOp::Pow {
            out.push(i.backend().binary(op, &c, &row)?);
        }
    }
    // Scalars in the descriptor, on a strided view.
    let strided = a.permute(&[2, 0, 1])?;
    for &op in BinaryOp::ALL {
        let s = if op == BinaryOp::Pow { 1.3 } else { -0.3 };
        out.push(i.backend().binary_scalar(op, &strided, s)?);
    }
    out.push(c.mul_scalar(-1.75)?);
    Ok(out)
}

fn reduce(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let x = i.normal(&[4, 7, 3])?;
    let xt = x.permute(&[2, 0, 1])?;
    let distinct = i.distinct(&[5, 11])?;
    let b = i.backend();
    let mut out = Vec::new();
    for op in [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Var { correction: 1 },
        ReduceOp::Var { correction: 0 },
    ] {
        out.push(b.reduce(op, &x, 1, false)?);
        out.push(b.reduce(op, &xt, -1, true)?);
    }
    for op in [ReduceOp::ArgMax, ReduceOp::ArgMin] {
        out.push(b.reduce(op, &distinct, 1, false)?);
        out.push(b.reduce(op, &distinct.t()?, 1, true)?);
    }
    out.push(x.sum_all()?);
    // Columns of rows wider than 16 KiB in f32, which the CPU pushes four rows at a time.
    let wide = i.normal(&[9, 4099])?;
    out.push(b.reduce(ReduceOp::Sum, &wide, 0, false)?);
    out.push(b.reduce(ReduceOp::Max, &wide, 0, false)?);
    Ok(out)
}

fn pool2d(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let x = i.normal(&[2, 3, 9, 8])?;
    let padded = Pool2dConfig {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
        count_include_pad: true,
    };
    Ok(vec![
        x.max_pool2d(Pool2dConfig::new([2, 2]))?,
        x.avg_pool2d(Pool2dConfig::new([2, 2]))?,
        x.max_pool2d(padded)?,
        x.avg_pool2d(padded)?,
        x.avg_pool2d(Pool2dConfig {
            count_include_pad: false,
            ..padded
        })?,
        x.transpose(2, 3)?.avg_pool2d(Pool2dConfig {
            kernel: [3, 2],
            stride: [1, 2],
            padding: [0, 1],
            count_include_pad: true,
        })?,
    ])
}

fn pool2d_backward(i: &mut Inputs) -> Result<Vec<Tensor>> {
    // Windows that tile, overlap (stride below the window) and pad, with unequal sides, on a
    // transposed view; the positions of the maxima, and both gradients from each backend's own
    // positions.
    let x = i.normal(&[2, 3, 9, 8])?.transpose(2, 3)?;
    let shape = x.shape().to_vec();
    let b = i.backend();
    let mut out = Vec::new();
    for (kernel, stride, padding) in [
        ([2, 2], [2, 2], [0, 0]),
        ([3, 3], [1, 1], [1, 1]),
        ([3, 2], [2, 1], [1, 1]),
    ] {
        for count_include_pad in [true, false] {
            let config = Pool2dConfig {
                kernel,
                stride,
                padding,
                count_include_pad,
            };
            let (y, indices) = x.max_pool2d_with_indices(config)?;
            let grad = i.normal(y.shape())?;
            out.push(b.avg_pool2d_backward(&grad, &shape, config)?);
            if count_include_pad {
                out.push(b.max_pool2d_backward(&grad, &indices, &shape, config)?);
                out.extend([y, indices]);
            }
        }
    }
    // One element.
    let one = i.normal(&[1, 1, 1, 1])?;
    let config = Pool2dConfig::new([1, 1]);
    let (y, indices) = one.max_pool2d_with_indices(config)?;
    out.push(b.max_pool2d_backward(&i.normal(&[1, 1, 1, 1])?, &indices, &[1, 1, 1, 1], config)?);
    out.extend([y, indices]);
    Ok(out)
}

fn adam(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let mut out = Vec::new();
    for mut state in [
        AdamState::adam().with_weight_decay(0.01),
        AdamState::adamw(0.05),
    ] {
        let mut params = vec![i.normal(&[7, 3])?, i.normal(&[5])?];
        for _ in 0..3 {
            let grads = vec![i.normal(&[7, 3])?, i.normal(&[5])?];
            b.fused_adam_step(&mut params, &grads, &mut state, 1e-2, (0.9, 0.999))?;
        }
        out.extend(params);
        out.extend(state.exp_avg().iter().cloned());
        out.extend(state.exp_avg_sq().iter().cloned());
    }
    Ok(out)
}

/// The loss scaler's fused unscale and inf/NaN check: finite gradients (one a strided view) at a
/// power-of-two and an odd scale, then a set holding an infinity; the flag becomes a 0/1 tensor.
fn unscale(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let mut out = Vec::new();
    let grads = vec![i.normal(&[7, 3])?, i.normal(&[4, 5])?.t()?, i.normal(&[1])?];
    for inv_scale in [1.0 / 1024.0, 0.37] {
        let (unscaled, found) = b.unscale_and_check(&grads, inv_scale)?;
        out.extend(unscaled);
        out.push(b.full(&[1], f64::from(u8::from(found)), DType::F64)?);
    }
    let poisoned = b.from_f64(&[1.0, f64::INFINITY, -2.0], &[3], i.dtype())?;
    let (_, found) = b.unscale_and_check(&[grads[0].clone(), poisoned], 0.5)?;
    out.push(b.full(&[1], f64::from(u8::from(found)), DType::F64)?);
    Ok(out)
}

fn cast_copy(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let x = i.uniform(&[5, 4, 3], -100.0, 100.0)?;
    let mut out = vec![
        x.permute(&[2, 0, 1])?.contiguous()?,
        x.narrow(1, 1, 2)?.reshape(&[5, 6])?,
    ];
    for dtype in DType::ALL {
        out.push(x.transpose(0, 1)?.cast(dtype)?.cast(DType::F64)?);
    }
    // Transposing copies wide enough for whole register tiles (16 × 16 f32) with ragged edges on
    // both sides, of planes, and of 4- and 8-byte integers.
    let wide = i.uniform(&[67, 35], -100.0, 100.0)?;
    out.push(wide.t()?.contiguous()?);
    out.push(
        i.uniform(&[3, 19, 41], -100.0, 100.0)?
            .transpose(1, 2)?
            .contiguous()?,
    );
    for dtype in [DType::I32, DType::I64] {
        out.push(wide.cast(dtype)?.t()?.contiguous()?);
    }
    Ok(out)
}

fn random(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let seed = i.seed();
    let dtype = i.dtype();
    Ok(vec![
        b.random_seeded(
            &[37, 3],
            dtype,
            Distribution::Normal {
                mean: 0.5,
                std: 2.0,
            },
            seed,
        )?,
        b.random_seeded(
            &[101],
            dtype,
            Distribution::Uniform {
                low: -1.0,
                high: 3.0,
            },
            seed ^ 1,
        )?,
        b.arange(-2.0, 5.0, 0.5, dtype)?,
        b.full(&[3, 2], -0.375, dtype)?,
    ])
}

fn gather(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let (i32_, i64_) = (DType::I32, DType::I64);
    let mut out = Vec::new();
    // Along the last dim, repeats included; along the first with the index longer there and shorter
    // elsewhere; from a transposed input by a narrowed index.
    let x = i.normal(&[5, 7])?;
    out.push(x.gather(1, &i.indices(&[5, 3], 7, i64_)?)?);
    let x = i.normal(&[6, 4, 3])?;
    out.push(x.gather(0, &i.indices(&[11, 4, 2], 6, i32_)?)?);
    let xt = i.normal(&[7, 5])?.t()?;
    let index = i.indices(&[5, 9], 7, i64_)?.narrow(1, 2, 6)?;
    out.push(xt.gather(-1, &index)?);
    out.push(
        i.normal(&[1, 1])?
            .gather(0, &i.indices(&[1, 1], 1, i32_)?)?,
    );
    out.push(x.gather(2, &i.indices(&[0, 4, 3], 3, i64_)?)?);
    // index_select and embedding: rows looked up with repeats, by 1-D, 0-d and 2-D indices.
    let table = i.normal(&[13, 6])?;
    out.push(table.index_select(0, &i.indices(&[17], 13, i64_)?)?);
    out.push(table.index_select(1, &i.indices(&[4], 6, i32_)?)?);
    out.push(table.index_select(-1, &i.indices(&[], 6, i64_)?)?);
    out.push(table.embedding(&i.indices(&[3, 4], 13, i64_)?)?);
    out.push(table.embedding(&i.indices(&[], 13, i32_)?)?);
    out.push(
        i.normal(&[6, 13])?
            .t()?
            .embedding(&i.indices(&[2, 3, 5], 13, i32_)?)?,
    );
    Ok(out)
}

fn scatter(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let (i32_, i64_) = (DType::I32, DType::I64);
    let mut out = Vec::new();
    // Repeated indices: the last assignment wins, additions sum in order, on every backend.
    let x = i.normal(&[5, 4])?;
    let index = i.indices(&[7, 3], 5, i64_)?;
    out.push(x.scatter(0, &index, &i.normal(&[7, 3])?)?);
    out.push(x.scatter_add(0, &index, &i.normal(&[8, 4])?)?);
    let x3 = i.normal(&[3, 4, 6])?;
    let index = i.indices(&[2, 4, 9], 6, i32_)?;
    out.push(x3.scatter_add(-1, &index, &i.normal(&[2, 4, 9])?)?);
    // A transposed source, a broadcast one, a narrowed index.
    let src = i.normal(&[3, 7])?.t()?;
    out.push(x.scatter(0, &i.indices(&[7, 3], 5, i32_)?, &src)?);
    let one = i.normal(&[1, 1])?.broadcast_to(&[4, 4])?;
    out.push(x.scatter_add(1, &i.indices(&[4, 6], 4, i64_)?.narrow(1, 1, 4)?, &one)?);
    out.push(x.scatter_add(0, &i.indices(&[0, 4], 5, i64_)?, &i.normal(&[0, 4])?)?);
    // index_add (an embedding's gradient) along each dim, and one_hot.
    let x = i.normal(&[6, 5])?;
    out.push(x.index_add(0, &i.indices(&[9], 6, i64_)?, &i.normal(&[9, 5])?, 0.5)?);
    out.push(x.index_add(1, &i.indices(&[3], 5, i32_)?, &i.normal(&[6, 3])?, -2.0)?);
    out.push(i.indices(&[3, 4], 7, i64_)?.one_hot(7, i.dtype())?);
    Ok(out)
}

fn shape(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let mut out = Vec::new();
    // cat along each dim, with a transposed, an empty and a one-element operand; stack.
    let (a, c) = (i.normal(&[3, 5])?, i.normal(&[4, 5])?);
    let t = i.normal(&[5, 2])?.t()?;
    let empty = i.normal(&[0, 5])?;
    out.push(b.cat(&[&a, &c, &empty, &t], 0)?);
    out.push(b.cat(
        &[
            &a,
            &i.normal(&[3, 1])?,
            &i.normal(&[3, 7])?.narrow(1, 2, 4)?,
        ],
        -1,
    )?);
    out.push(b.stack(&[&a, &i.normal(&[3, 5])?], 1)?);
    out.push(b.stack(&[&i.normal(&[])?], 0)?);
    // Constant padding of the last two dims, of a strided input; repeat with new leading dims.
    let x = i.normal(&[2, 3, 4])?;
    out.push(x.pad(&[(1, 2), (0, 3)], -0.5)?);
    out.push(x.transpose(0, 2)?.pad(&[(2, 0)], 1.5)?);
    out.push(x.repeat(&[2, 1, 3, 1])?);
    out.push(i.normal(&[3])?.repeat(&[2, 2])?);
    // Flips of one and several dims (of a strided view), and clamps with either bound or both.
    out.push(x.flip(&[-1])?);
    out.push(x.transpose(0, 1)?.flip(&[0, 2])?);
    out.push(x.clamp(Some(-0.5), Some(0.75))?);
    out.push(x.clamp(None, Some(0.25))?);
    out.push(x.clamp(Some(0.5), Some(-0.5))?);
    // Reductions over several dims (NCHW statistics), with and without keepdim.
    let y = i.normal(&[3, 4, 5, 7])?;
    out.push(y.sum_dims(&[0, 2, 3], false)?);
    out.push(y.mean_dims(&[0, -1], true)?);
    out.push(y.max_dims(&[1, 2], false)?);
    out.push(y.transpose(1, 3)?.min_dims(&[3, 0], true)?);
    Ok(out)
}

fn compare(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let (b, dtype) = (i.backend(), i.dtype());
    let mut out = Vec::new();
    // Values from a small set, so ties are common: every op against a broadcast row, a transposed
    // view, a whole scalar and a fractional one (exact against integers, rounded for floats).
    let x = i.indices(&[5, 7], 4, dtype)?;
    let row = i.indices(&[7], 4, dtype)?;
    let xt = i.indices(&[7, 5], 4, dtype)?.t()?;
    for &op in CompareOp::ALL {
        out.push(b.compare(op, &x, &row)?);
        out.push(b.compare(op, &xt, &x)?);
        out.push(b.compare_scalar(op, &x, 2.0)?);
        out.push(b.compare_scalar(op, &xt.narrow(1, 1, 5)?, 1.5)?);
    }
    // IEEE's special values against each other: NaN, ±0, ±∞ (integers see 0, 0, 0, and saturated
    // bounds); the predicates.
    let special = [
        f64::NAN,
        -0.0,
        0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1.0,
        -1.0,
    ];
    let s = b.from_f64(&special, &[7, 1], dtype)?;
    let s_row = b.from_f64(&special, &[1, 7], dtype)?;
    for &op in CompareOp::ALL {
        out.push(b.compare(op, &s, &s_row)?);
    }
    out.push(s.isnan()?);
    out.push(s_row.isinf()?);
    out.push(s.isfinite()?);
    out.push(s_row.logical_not()?);
    // where with all three operands broadcast, a transposed mask, scalars (masked_fill); empty.
    let mask = x.gt_scalar(1.0)?;
    out.push(b.where_(&mask, &i.normal(&[5, 1])?, &i.normal(&[7])?)?);
    let mask_t = i.indices(&[7, 5], 2, DType::U8)?.t()?;
    out.push(b.where_(&mask_t, &x, &xt.t()?.t()?)?);
    out.push(b.where_(&i.indices(&[5, 1], 3, DType::U8)?, &x, &row)?);
    out.push(x.masked_fill(&mask, 3.0)?);
    let (y, one) = (i.indices(&[5, 7], 4, dtype)?, i.indices(&[], 4, dtype)?);
    out.push(b.where_(&mask, &x, &y)?);
    out.push(b.where_(&mask, &x, &one)?);
    out.push(b.where_(&mask, &one, &b.full(&[], 2.0, dtype)?)?);
    out.push(x.masked_fill(&i.indices(&[7], 2, DType::U8)?, 0.0)?);
    let empty = i.normal(&[0, 3])?;
    out.push(b.where_(&i.indices(&[0, 3], 2, DType::U8)?, &empty, &empty)?);
    Ok(out)
}

fn scan(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let mut out = Vec::new();
    // Along the last, first and middle dims; of a transposed view; lengths 1 and prime; empty.
    let x = i.normal(&[5, 13])?;
    out.push(x.cumsum(-1)?);
    out.push(x.cumprod(-1)?);
    out.push(x.cumsum(0)?);
    let y = i.normal(&[3, 7, 4])?;
    out.push(y.cumsum(1)?);
    out.push(y.cumprod(1)?);
    out.push(y.transpose(0, 2)?.cumsum(0)?);
    // Enough rows along the last dim for the CPU's rows scanned side by side, and a remainder.
    let z = i.normal(&[19, 6])?;
    out.push(z.cumsum(1)?);
    out.push(z.cumprod(-1)?);
    out.push(i.normal(&[1])?.cumsum(0)?);
    out.push(i.normal(&[4, 1])?.cumprod(1)?);
    out.push(i.normal(&[0, 3])?.cumsum(1)?);
    // The kernel itself on a strided view (the tensor API hands it dense inputs).
    let xt = i.normal(&[11, 6])?.t()?;
    for op in [ScanOp::Sum, ScanOp::Prod] {
        let y = b.empty(xt.shape(), xt.dtype())?;
        b.compute().scan(&ScanDesc {
            op,
            dtype: xt.dtype(),
            input: xt.strided_buf(),
            dim: 1,
            output: y.data_ptr(),
        })?;
        out.push(y);
    }
    Ok(out)
}

fn sort(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let (b, dtype) = (i.backend(), i.dtype());
    let mut out = Vec::new();
    // Lines full of ties (values from a small set), both directions, along each dim, of a view.
    let x = i.indices(&[5, 13], 4, dtype)?;
    for descending in [false, true] {
        for dim in [-1, 0] {
            let (values, indices) = x.sort(dim, descending)?;
            out.extend([values, indices]);
        }
        out.push(x.t()?.argsort(1, descending)?);
    }
    // Distinct values along a middle dim; a line of one; an empty tensor.
    let y = i.normal(&[3, 7, 4])?;
    let (values, indices) = y.sort(1, true)?;
    out.extend([values, indices]);
    out.push(i.normal(&[4, 1])?.argsort(1, false)?);
    out.push(i.normal(&[0, 3])?.sort(1, false)?.0);
    // IEEE's special values in one line: NaN last (first descending), -0 equal to +0.
    let nan = f64::NAN;
    let special = [
        1.0,
        nan,
        -0.0,
        f64::INFINITY,
        0.0,
        f64::NEG_INFINITY,
        nan,
        -1.0,
        0.0,
    ];
    let s = b.from_f64(&special, &[1, 9], dtype)?;
    for descending in [false, true] {
        let (values, indices) = s.sort(1, descending)?;
        out.extend([values, indices]);
    }
    // topk of the largest and of the smallest.
    let (values, indices) = y.topk(3, 1, true)?;
    out.extend([values, indices]);
    let (values, indices) = x.topk(4, -1, false)?;
    out.extend([values, indices]);
    // Long lines full of ties: a selection or an unstable sort that broke them by anything but
    // position would differ from the reference.
    let long = i.indices(&[3, 97], 5, dtype)?;
    let (values, indices) = long.topk(40, 1, true)?;
    out.extend([values, indices]);
    out.push(long.argsort(1, false)?);
    // A k much smaller than the line, along the last dim and along the first of a view, and over
    // special values.
    for (k, descending) in [(5, true), (2, false), (1, true)] {
        let (values, indices) = long.topk(k, 1, descending)?;
        out.extend([values, indices]);
        let (values, indices) = long.t()?.topk(k, 0, descending)?;
        out.extend([values, indices]);
        let (values, indices) = s.topk(k, 1, descending)?;
        out.extend([values, indices]);
    }
    // Distinct random values in lines of at least 8·k, which the CPU scans against the worst of
    // the best k so far, along the last dim and along a middle one.
    let wide = i.normal(&[3, 301])?;
    let deep = i.normal(&[2, 211, 3])?;
    for descending in [false, true] {
        let (values, indices) = wide.topk(7, 1, descending)?;
        out.extend([values, indices]);
        let (values, indices) = deep.topk(13, 1, descending)?;
        out.extend([values, indices]);
    }
    // The kernel itself on a strided view, indices only, the first 11 of each line of 13.
    let xt = x.t()?;
    let indices = b.empty(&[11, 5], DType::I64)?;
    b.compute().sort(&SortDesc {
        dtype,
        input: xt.strided_buf(),
        dim: 0,
        descending: true,
        k: 11,
        values: None,
        indices: Some(indices.data_ptr()),
    })?;
    out.push(indices);
    Ok(out)
}
