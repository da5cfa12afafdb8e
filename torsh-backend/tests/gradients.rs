//! Backward ops against finite differences of their forward ops on the reference backend in f64:
//! the gradients every backend's parity case is then compared with are the calculus's, not only
//! each other's. Central differences with step `h` are accurate to O(h²); the points avoid each
//! op's kinks (`abs` and `relu` at 0).

mod common;

use torsh_backend::{
    Backend, BatchNormConfig, ConvConfig, ConvTransposeConfig, CrossEntropyConfig, DType,
    Pool2dConfig, Reduction, Result, Tensor, UnaryOp,
};

/// Asserts that `got` is the gradient of `forward` at `xs`: each element within 1e-6 of the central
/// difference with step 1e-6 along it.
fn assert_finite_differences(
    xs: &[f64],
    got: &[f64],
    what: &str,
    forward: impl Fn(&[f64]) -> Result<f64>,
) -> Result<()> {
    let h = 1e-6;
    for k in 0..xs.len() {
        let (mut up, mut down) = (xs.to_vec(), xs.to_vec());
        up[k] += h;
        down[k] -= h;
        let want = (forward(&up)? - forward(&down)?) / (2.0 * h);
        assert!(
            (got[k] - want).abs() < 1e-6,
            "{what} element {k}: got {}, finite differences {want}",
            got[k]
        );
    }
    Ok(())
}

/// `Σ g · op(x)` differentiated by central differences at each `x`, against `unary_backward`.
#[test]
fn unary_backward_matches_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    let h = 1e-6;
    let general: Vec<f64> = (0..23).map(|i| -2.9 + 0.26 * i as f64).collect();
    let positive: Vec<f64> = (0..23).map(|i| 0.3 + 0.17 * i as f64).collect();
    let grad: Vec<f64> = (0..23).map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0).collect();
    for &op in UnaryOp::ALL {
        let xs = match op {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => &positive,
            _ => &general,
        };
        let n = xs.len();
        let x = b.from_f64(xs, &[n], DType::F64)?;
        let g = b.from_f64(&grad, &[n], DType::F64)?;
        let got = x.unary_backward_from_input(op, &g)?.to_vec_f64()?;
        let shifted = |d: f64| -> Result<Vec<f64>> {
            let moved: Vec<f64> = xs.iter().map(|v| v + d).collect();
            b.unary(op, &b.from_f64(&moved, &[n], DType::F64)?)?
                .to_vec_f64()
        };
        let (up, down) = (shifted(h)?, shifted(-h)?);
        for k in 0..n {
            let want = grad[k] * (up[k] - down[k]) / (2.0 * h);
            let err = (got[k] - want).abs() / want.abs().max(1.0);
            assert!(
                err < 1e-6,
                "{} at x = {}: got {}, finite differences {want}",
                op.name(),
                xs[k],
                got[k]
            );
        }
    }
    Ok(())
}

/// The backward reads what `UnaryOp::saved` names: from the output for `exp`, `relu`, ..., from
/// the input for the others, and the gradient of `relu` is 0 where its output is not positive.
#[test]
fn unary_backward_reads_the_saved_tensor() -> Result<()> {
    let b = Backend::reference()?;
    let x = b.from_f64(&[-1.0, 0.0, 2.0], &[3], DType::F64)?;
    let g = b.from_f64(&[3.0, 3.0, 3.0], &[3], DType::F64)?;
    let y = x.exp()?;
    let from_y = y.unary_backward(UnaryOp::Exp, &g)?.to_vec_f64()?;
    let want: Vec<f64> = [-1.0f64, 0.0, 2.0].iter().map(|v| 3.0 * v.exp()).collect();
    assert_eq!(from_y, want);
    let relu = x.relu()?.unary_backward(UnaryOp::Relu, &g)?.to_vec_f64()?;
    assert_eq!(relu, [0.0, 0.0, 3.0]);
    let sin = x.unary_backward(UnaryOp::Sin, &g)?.to_vec_f64()?;
    assert_eq!(sin[2], 3.0 * 2f64.cos());
    Ok(())
}

/// Dropout zeroes about `p` of the elements and scales the rest by `1 / (1 − p)`; its backward
/// applies the same mask to the gradient, regenerated from the seed; the same seed gives the same
/// mask and another seed another.
#[test]
fn dropout_masks_by_the_seed_and_its_backward_reuses_the_mask() -> Result<()> {
    let b = Backend::reference()?;
    let n = 20_000;
    let x = b.from_f64(&vec![2.0; n], &[n], DType::F64)?;
    let (p, seed) = (0.3, 11);
    let y = x.dropout(p, seed)?.to_vec_f64()?;
    let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
    assert!((kept - 0.7).abs() < 0.02, "kept {kept}");
    assert!(y.iter().all(|&v| v == 0.0 || v == 2.0 / 0.7));
    let grad: Vec<f64> = (0..n).map(|i| (i % 7) as f64 - 3.0).collect();
    let g = b.from_f64(&grad, &[n], DType::F64)?;
    let dx = b.dropout_backward(&g, p, seed)?.to_vec_f64()?;
    for k in 0..n {
        let want = if y[k] != 0.0 { grad[k] / 0.7 } else { 0.0 };
        assert_eq!(dx[k], want, "element {k}");
    }
    assert_eq!(x.dropout(p, seed)?.to_vec_f64()?, y);
    assert_ne!(x.dropout(p, seed + 1)?.to_vec_f64()?, y);
    assert!(x
        .dropout(1.0, seed)?
        .to_vec_f64()?
        .iter()
        .all(|&v| v == 0.0));
    assert_eq!(x.dropout(0.0, seed)?.to_vec_f64()?, vec![2.0; n]);
    Ok(())
}

/// `Σ g · softmax(x)` and `Σ g · log_softmax(x)` differentiated by central differences at each
/// element of `x`, along either axis, against the backward ops.
#[test]
fn softmax_backward_matches_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    let (rows, cols) = (3, 5);
    let xs: Vec<f64> = (0..rows * cols)
        .map(|i| ((i * 5 % 7) as f64 - 3.0) / 2.0)
        .collect();
    let gs: Vec<f64> = (0..rows * cols)
        .map(|i| ((i * 3 % 5) as f64 - 2.0) / 3.0)
        .collect();
    let g = b.from_f64(&gs, &[rows, cols], DType::F64)?;
    for log in [false, true] {
        for axis in [1, 0] {
            let forward = |v: &[f64]| -> Result<f64> {
                let t = b.from_f64(v, &[rows, cols], DType::F64)?;
                let y = if log {
                    t.log_softmax(axis)?
                } else {
                    t.softmax(axis)?
                };
                Ok(y.to_vec_f64()?.iter().zip(&gs).map(|(y, g)| y * g).sum())
            };
            let x = b.from_f64(&xs, &[rows, cols], DType::F64)?;
            let got = if log {
                b.log_softmax_backward(&g, &x.log_softmax(axis)?, axis)?
            } else {
                b.softmax_backward(&g, &x.softmax(axis)?, axis)?
            }
            .to_vec_f64()?;
            assert_finite_differences(&xs, &got, &format!("log {log} axis {axis}"), forward)?;
        }
    }
    Ok(())
}

/// `Σ g · pool(x)` differentiated by central differences at each input element, against the
/// pooling gradients: max (from the forward's positions) and average both ways, with windows that
/// overlap (stride below the window), padding and unequal sides. The input's values are distinct
/// and far apart next to the step, so no window's maximum changes place.
#[test]
fn pooling_gradients_match_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    let shape = [2, 2, 5, 6];
    let n: usize = shape.iter().product();
    // 0..n permuted (37 is prime to n = 120), spread over [-3, 3).
    let xs: Vec<f64> = (0..n).map(|i| ((i * 37) % n) as f64 * 0.05 - 3.0).collect();
    let x = b.from_f64(&xs, &shape, DType::F64)?;
    for (kernel, stride, padding) in [
        ([3, 3], [1, 1], [1, 1]),
        ([3, 3], [2, 2], [1, 1]),
        ([3, 2], [2, 1], [1, 0]),
        ([2, 2], [2, 2], [0, 0]),
    ] {
        for count_include_pad in [true, false] {
            let config = Pool2dConfig {
                kernel,
                stride,
                padding,
                count_include_pad,
            };
            let (y, indices) = x.max_pool2d_with_indices(config)?;
            let m = y.numel();
            let gs: Vec<f64> = (0..m).map(|i| ((i * 7 % 11) as f64 - 5.0) / 4.0).collect();
            let g = b.from_f64(&gs, y.shape(), DType::F64)?;
            for max in [true, false] {
                let got = if max {
                    b.max_pool2d_backward(&g, &indices, &shape, config)?
                } else {
                    b.avg_pool2d_backward(&g, &shape, config)?
                }
                .to_vec_f64()?;
                let forward = |v: &[f64]| -> Result<f64> {
                    let t = b.from_f64(v, &shape, DType::F64)?;
                    let y = if max {
                        t.max_pool2d(config)?
                    } else {
                        t.avg_pool2d(config)?
                    };
                    Ok(y.to_vec_f64()?.iter().zip(&gs).map(|(y, g)| y * g).sum())
                };
                assert_finite_differences(&xs, &got, &format!("max {max} {config:?}"), forward)?;
            }
        }
    }
    Ok(())
}

/// The positions are the first maximum of each window in row-major order (ties go to the earlier
/// tap), or the last NaN, and overlapping windows that pick the same element both add to it, on
/// every backend.
#[test]
fn max_pool_positions_follow_pytorch() -> Result<()> {
    for b in common::backends() {
        let xs = [1.0, 5.0, 5.0, 2.0, f64::NAN, 0.0, 3.0, f64::NAN, 4.0];
        let x = b.from_f64(&xs, &[1, 1, 3, 3], DType::F32)?;
        let config = Pool2dConfig {
            kernel: [2, 2],
            stride: [1, 1],
            padding: [0, 0],
            count_include_pad: true,
        };
        let (y, indices) = x.max_pool2d_with_indices(config)?;
        assert_eq!(indices.to_vec::<i64>()?, [4, 4, 7, 7]);
        assert!(y.to_vec_f64()?.iter().all(|v| v.is_nan()));
        // Both windows hold the 5 at position 1 first: both gradients reach it.
        let x = b.from_f64(&[1.0, 5.0, 5.0, 2.0, 0.0, 3.0], &[1, 1, 2, 3], DType::F32)?;
        let (y, indices) = x.max_pool2d_with_indices(config)?;
        assert_eq!(indices.to_vec::<i64>()?, [1, 1]);
        assert_eq!(y.to_vec_f64()?, [5.0, 5.0]);
        let g = b.from_f64(&[1.0, 2.0], &[1, 1, 1, 2], DType::F32)?;
        let dx = b.max_pool2d_backward(&g, &indices, &[1, 1, 2, 3], config)?;
        assert_eq!(dx.to_vec_f64()?, [0.0, 3.0, 0.0, 0.0, 0.0, 0.0]);
        let other = b.from_slice(&[0i64, 2], &[1, 1, 1, 2])?;
        let dx = b.max_pool2d_backward(&g, &other, &[1, 1, 2, 3], config)?;
        assert_eq!(dx.to_vec_f64()?, [1.0, 0.0, 2.0, 0.0, 0.0, 0.0]);
    }
    Ok(())
}

/// `g · cross_entropy(x)` and `g · nll_loss(x)` differentiated by central differences at each
/// logit, against their backward ops: every reduction, an ignored sample, label smoothing.
#[test]
fn loss_gradients_match_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    let (n, c) = (4, 5);
    let xs: Vec<f64> = (0..n * c)
        .map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0)
        .collect();
    let target = b.from_slice(&[3i64, -100, 0, 4], &[n])?;
    let weights: Vec<f64> = (0..n).map(|i| i as f64 - 1.5).collect();
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        // The loss's gradient: 0-d for the reductions, one weight per sample for `None`; `dot` is
        // the loss weighted so, whose gradient the backward gives.
        let (grad, gw) = match reduction {
            Reduction::None => (b.from_f64(&weights, &[n], DType::F64)?, weights.clone()),
            _ => (b.full(&[], 0.75, DType::F64)?, vec![0.75]),
        };
        let dot = |y: &Tensor| -> Result<f64> {
            Ok(y.to_vec_f64()?.iter().zip(&gw).map(|(y, w)| y * w).sum())
        };
        for label_smoothing in [0.0, 0.1] {
            let config = CrossEntropyConfig {
                reduction,
                label_smoothing,
                ..Default::default()
            };
            let x = b.from_f64(&xs, &[n, c], DType::F64)?;
            let got = b
                .cross_entropy_backward(&grad, &x, &target, config)?
                .to_vec_f64()?;
            let forward = |v: &[f64]| -> Result<f64> {
                dot(&b
                    .from_f64(v, &[n, c], DType::F64)?
                    .cross_entropy(&target, config)?)
            };
            let what = format!("cross_entropy {reduction:?} smoothing {label_smoothing}");
            assert_finite_differences(&xs, &got, &what, forward)?;
        }
        let x = b.from_f64(&xs, &[n, c], DType::F64)?;
        let got = b
            .nll_loss_backward(&grad, &x, &target, reduction, Some(-100))?
            .to_vec_f64()?;
        let forward = |v: &[f64]| -> Result<f64> {
            let x = b.from_f64(v, &[n, c], DType::F64)?;
            dot(&x.nll_loss(&target, reduction, Some(-100))?)
        };
        assert_finite_differences(&xs, &got, &format!("nll_loss {reduction:?}"), forward)?;
    }
    Ok(())
}

/// PyTorch's values: the mean over the samples not ignored, ignored samples 0 under `None`, the
/// smoothed target, and NaN for a mean over no sample.
#[test]
fn cross_entropy_follows_pytorch() -> Result<()> {
    for b in common::backends() {
        let logits = b.from_f64(&[1.0, 2.0, 3.0, 0.5, 0.5, 0.5], &[2, 3], DType::F32)?;
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        let flat = 3f64.ln();
        let target = b.from_slice(&[2i64, 0], &[2])?;
        let loss = |t: &Tensor, config| -> Result<Vec<f64>> {
            logits.cross_entropy(t, config)?.to_vec_f64()
        };
        let close = |got: &[f64], want: &[f64]| {
            assert_eq!(got.len(), want.len(), "{}", b.backend_type());
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs() < 1e-5,
                    "{}: {got:?} vs {want:?}",
                    b.backend_type()
                );
            }
        };
        close(
            &loss(&target, Default::default())?,
            &[(lse - 3.0 + flat) / 2.0],
        );
        let none = CrossEntropyConfig {
            reduction: Reduction::None,
            ..Default::default()
        };
        let ignored = b.from_slice(&[2i64, -100], &[2])?;
        close(&loss(&ignored, none)?, &[lse - 3.0, 0.0]);
        close(&loss(&ignored, Default::default())?, &[lse - 3.0]);
        let smoothed = CrossEntropyConfig {
            label_smoothing: 0.3,
            ..none
        };
        // (1 − ε)·(lse − x_t) + ε·(lse − mean(x)).
        close(
            &loss(&target, smoothed)?,
            &[0.7 * (lse - 3.0) + 0.3 * (lse - 2.0), flat],
        );
        let all_ignored = b.from_slice(&[-100i64, -100], &[2])?;
        assert!(loss(&all_ignored, Default::default())?[0].is_nan());
        // nll_loss of log-probabilities is cross_entropy of the logits.
        let nll = logits
            .log_softmax(1)?
            .nll_loss(&target, Reduction::Sum, None)?
            .to_vec_f64()?;
        close(&nll, &[lse - 3.0 + flat]);
    }
    Ok(())
}

/// `Σ g · conv2d(x, w) + b` differentiated by central differences along every element of the
/// input, the weight and the bias, against the three convolution gradients: padded, strided,
/// dilated, grouped, depthwise (with a channel multiplier) and pointwise strided windows, with
/// unequal sides.
#[test]
fn conv2d_gradients_match_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    let values = |n: usize, seed: usize| -> Vec<f64> {
        (0..n)
            .map(|i| (((i * 37 + seed * 11) % 23) as f64 - 11.0) / 7.0)
            .collect()
    };
    let x_shape = [2, 4, 7, 6];
    let xs = values(x_shape.iter().product(), 1);
    for (w_shape, config) in [
        (
            [5, 4, 3, 3],
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
                stride: [2, 1],
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
        let ws = values(w_shape.iter().product(), 2);
        let bs = values(w_shape[0], 3);
        let x = b.from_f64(&xs, &x_shape, DType::F64)?;
        let w = b.from_f64(&ws, &w_shape, DType::F64)?;
        let bias = b.from_f64(&bs, &[w_shape[0]], DType::F64)?;
        let y = b.conv2d_with_bias(&x, &w, Some(&bias), config)?;
        let gs = values(y.numel(), 4);
        let g = b.from_f64(&gs, y.shape(), DType::F64)?;
        let loss = |xv: &[f64], wv: &[f64], bv: &[f64]| -> Result<f64> {
            let y = b.conv2d_with_bias(
                &b.from_f64(xv, &x_shape, DType::F64)?,
                &b.from_f64(wv, &w_shape, DType::F64)?,
                Some(&b.from_f64(bv, &[w_shape[0]], DType::F64)?),
                config,
            )?;
            Ok(y.to_vec_f64()?.iter().zip(&gs).map(|(y, g)| y * g).sum())
        };
        let what = format!("{w_shape:?} {config:?}");
        let dx = b.conv2d_backward_input(&g, &w, &x_shape, config)?;
        assert_finite_differences(&xs, &dx.to_vec_f64()?, &format!("input {what}"), |v| {
            loss(v, &ws, &bs)
        })?;
        let dw = b.conv2d_backward_weight(&g, &x, &w_shape, config)?;
        assert_finite_differences(&ws, &dw.to_vec_f64()?, &format!("weight {what}"), |v| {
            loss(&xs, v, &bs)
        })?;
        let db = b.conv2d_backward_bias(&g)?;
        assert_finite_differences(&bs, &db.to_vec_f64()?, &format!("bias {what}"), |v| {
            loss(&xs, &ws, v)
        })?;
    }
    Ok(())
}

/// The transposed convolution is the adjoint of the convolution with the same weight and window
/// (`⟨conv2d(x, w), y⟩ = ⟨x, conv_transpose2d(y, w)⟩`), output padding fills the rows a strided
/// convolution drops, and two small cases match values worked by hand, on every backend.
#[test]
fn conv_transpose2d_is_the_adjoint_of_conv2d() -> Result<()> {
    let r = Backend::reference()?;
    let config = ConvTransposeConfig {
        stride: [2, 3],
        padding: [1, 0],
        output_padding: [1, 2],
        dilation: [1, 2],
        groups: 2,
    };
    let y_shape = [2, 4, 4, 3];
    let w_shape = [4, 3, 3, 2];
    let out_shape = config.output_shape(y_shape, w_shape)?;
    // (4 − 1)·2 − 2 + 1·2 + 1 + 1 = 8 rows; (3 − 1)·3 − 0 + 2·1 + 2 + 1 = 11 columns.
    assert_eq!(out_shape, [2, 6, 8, 11]);
    let fill = |n: usize, seed: usize| -> Vec<f64> {
        (0..n)
            .map(|i| (((i * 29 + seed * 7) % 19) as f64 - 9.0) / 5.0)
            .collect()
    };
    let ys = fill(y_shape.iter().product(), 1);
    let ws = fill(w_shape.iter().product(), 2);
    let xs = fill(out_shape.iter().product(), 3);
    let y = r.from_f64(&ys, &y_shape, DType::F64)?;
    let w = r.from_f64(&ws, &w_shape, DType::F64)?;
    let x = r.from_f64(&xs, &out_shape, DType::F64)?;
    let forward = ConvConfig {
        stride: config.stride,
        padding: config.padding,
        dilation: config.dilation,
        groups: config.groups,
    };
    let conv = r.conv2d(&x, &w, forward)?;
    assert_eq!(conv.shape(), &y_shape);
    let t = r.conv_transpose2d(&y, &w, None, config)?;
    let lhs: f64 = conv.to_vec_f64()?.iter().zip(&ys).map(|(a, b)| a * b).sum();
    let rhs: f64 = t.to_vec_f64()?.iter().zip(&xs).map(|(a, b)| a * b).sum();
    assert!(
        (lhs - rhs).abs() < 1e-9 * lhs.abs().max(1.0),
        "{lhs} vs {rhs}"
    );

    for b in common::backends() {
        let x = b.from_f64(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2], DType::F32)?;
        let ones = b.from_f64(&[1.0; 4], &[1, 1, 2, 2], DType::F32)?;
        let tiled = b.conv_transpose2d(
            &x,
            &ones,
            None,
            ConvTransposeConfig {
                stride: [2, 2],
                ..Default::default()
            },
        )?;
        #[rustfmt::skip]
        let want = [
            1.0, 1.0, 2.0, 2.0,
            1.0, 1.0, 2.0, 2.0,
            3.0, 3.0, 4.0, 4.0,
            3.0, 3.0, 4.0, 4.0,
        ];
        assert_eq!(tiled.to_vec_f64()?, want, "{}", b.backend_type());
        let diagonal = b.from_f64(&[1.0, 0.0, 0.0, 1.0], &[1, 1, 2, 2], DType::F32)?;
        let bias = b.from_f64(&[0.5], &[1], DType::F32)?;
        let spread = b.conv_transpose2d(&x, &diagonal, Some(&bias), Default::default())?;
        let want = [1.5, 2.5, 0.5, 3.5, 5.5, 2.5, 0.5, 3.5, 4.5];
        assert_eq!(spread.shape(), &[1, 1, 3, 3]);
        assert_eq!(spread.to_vec_f64()?, want, "{}", b.backend_type());
    }
    Ok(())
}

/// Gradients whose sums are empty still write every element: the weight gradient of no image is
/// zero, and the input gradient with no output channel is its bias (a transposed convolution of
/// no input channel), on every backend, into outputs filled with NaN first.
#[test]
fn convolution_gradients_of_empty_sums_write_every_element() -> Result<()> {
    use torsh_backend::compute::{Conv2dBackwardInputDesc, Conv2dBackwardWeightDesc};
    for b in common::backends() {
        let poisoned = |shape: &[usize]| b.full(shape, f64::NAN, DType::F32);
        let x = poisoned(&[0, 2, 5, 5])?;
        let y = poisoned(&[0, 3, 5, 5])?;
        let dw = poisoned(&[3, 2, 3, 3])?;
        b.compute()
            .conv2d_backward_weight(&Conv2dBackwardWeightDesc {
                dtype: DType::F32,
                input: x.data_ptr(),
                input_shape: [0, 2, 5, 5],
                grad_output: y.data_ptr(),
                grad_output_shape: [0, 3, 5, 5],
                grad_weight: dw.data_ptr(),
                weight_shape: [3, 2, 3, 3],
                stride: [1, 1],
                padding: [1, 1],
                dilation: [1, 1],
                groups: 1,
            })?;
        assert_eq!(dw.to_vec_f64()?, vec![0.0; 54], "{}", b.backend_type());
        let none = poisoned(&[1, 0, 4, 4])?;
        let w = poisoned(&[0, 2, 3, 3])?;
        let bias = b.from_f64(&[0.5, -2.0], &[2], DType::F32)?;
        let dx = poisoned(&[1, 2, 4, 4])?;
        b.compute()
            .conv2d_backward_input(&Conv2dBackwardInputDesc {
                dtype: DType::F32,
                grad_output: none.data_ptr(),
                grad_output_shape: [1, 0, 4, 4],
                weight: w.data_ptr(),
                weight_shape: [0, 2, 3, 3],
                bias: Some(bias.data_ptr()),
                grad_input: dx.data_ptr(),
                grad_input_shape: [1, 2, 4, 4],
                stride: [1, 1],
                padding: [1, 1],
                dilation: [1, 1],
                groups: 1,
            })?;
        let mut want = vec![0.5; 16];
        want.extend([-2.0; 16]);
        assert_eq!(dx.to_vec_f64()?, want, "{}", b.backend_type());
    }
    Ok(())
}

/// Deterministic values spread over [-11/7, 11/7] (none repeats within 23).
fn spread(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| (((i * 37 + seed * 11) % 23) as f64 - 11.0) / 7.0)
        .collect()
}

/// Layer norm's input, weight and bias gradients from the saved statistics, over one and two
/// trailing dims, with and without an affine weight, against finite differences of `Σ g · y`.
#[test]
fn layer_norm_gradients_match_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    for (shape, normalized, affine) in [
        (vec![3usize, 5], vec![5usize], true),
        (vec![2, 3, 4], vec![3, 4], true),
        (vec![4, 7], vec![7], false),
        (vec![2, 1], vec![1], true),
    ] {
        let n: usize = shape.iter().product();
        let cols: usize = normalized.iter().product();
        let (xs, gs) = (spread(n, 1), spread(n, 2));
        let (ws, bs) = (spread(cols, 3), spread(cols, 4));
        let eps = 1e-3;
        let loss = |xv: &[f64], wv: &[f64], bv: &[f64]| -> Result<f64> {
            let (w, bias) = (
                b.from_f64(wv, &normalized, DType::F64)?,
                b.from_f64(bv, &normalized, DType::F64)?,
            );
            let y = b.layer_norm(
                &b.from_f64(xv, &shape, DType::F64)?,
                &normalized,
                affine.then_some(&w),
                affine.then_some(&bias),
                eps,
            )?;
            Ok(y.to_vec_f64()?.iter().zip(&gs).map(|(y, g)| y * g).sum())
        };
        let x = b.from_f64(&xs, &shape, DType::F64)?;
        let (w, bias) = (
            b.from_f64(&ws, &normalized, DType::F64)?,
            b.from_f64(&bs, &normalized, DType::F64)?,
        );
        let (w, bias) = (affine.then_some(&w), affine.then_some(&bias));
        let fwd = b.layer_norm_with_stats(&x, &normalized, w, bias, eps)?;
        assert_eq!(fwd.mean.shape(), &shape[..shape.len() - normalized.len()]);
        let want = b.layer_norm(&x, &normalized, w, bias, eps)?.to_vec_f64()?;
        assert_eq!(
            fwd.output.to_vec_f64()?,
            want,
            "the saving forward's output"
        );
        let g = b.from_f64(&gs, &shape, DType::F64)?;
        let grads = b.layer_norm_backward(&g, &x, &normalized, w, &fwd.mean, &fwd.invstd)?;
        let what = format!("layer_norm {shape:?} over {normalized:?} affine {affine}");
        assert_finite_differences(
            &xs,
            &grads.input.to_vec_f64()?,
            &format!("input {what}"),
            |v| loss(v, &ws, &bs),
        )?;
        if affine {
            let dw = grads.weight.to_vec_f64()?;
            assert_finite_differences(&ws, &dw, &format!("weight {what}"), |v| loss(&xs, v, &bs))?;
            let db = grads.bias.to_vec_f64()?;
            assert_finite_differences(&bs, &db, &format!("bias {what}"), |v| loss(&xs, &ws, v))?;
        }
    }
    Ok(())
}

/// Batch norm's gradients: in training (statistics of the batch, so the input gradient runs
/// through them) and with fixed statistics (inference), with and without spatial dims and an
/// affine weight, against finite differences of `Σ g · y`; the saved statistics are the ones
/// each mode normalises with.
#[test]
fn batch_norm_gradients_match_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    for (shape, training, affine) in [
        (vec![3usize, 2, 5], true, true),
        (vec![4, 3], true, false),
        (vec![2, 3, 2, 3], true, true),
        (vec![2, 3, 4], false, true),
    ] {
        let n: usize = shape.iter().product();
        let c = shape[1];
        let (xs, gs) = (spread(n, 5), spread(n, 6));
        let (ws, bs) = (spread(c, 7), spread(c, 8));
        let rm: Vec<f64> = spread(c, 9).iter().map(|v| v / 3.0).collect();
        let rv: Vec<f64> = spread(c, 10).iter().map(|v| 1.0 + v.abs()).collect();
        let eps = 1e-3;
        let forward = |xv: &[f64], wv: &[f64], bv: &[f64]| -> Result<torsh_backend::Normalized> {
            let (w, bias) = (
                b.from_f64(wv, &[c], DType::F64)?,
                b.from_f64(bv, &[c], DType::F64)?,
            );
            let (mean, var) = (
                b.from_f64(&rm, &[c], DType::F64)?,
                b.from_f64(&rv, &[c], DType::F64)?,
            );
            b.batch_norm_with_stats(
                &b.from_f64(xv, &shape, DType::F64)?,
                BatchNormConfig {
                    weight: affine.then_some(&w),
                    bias: affine.then_some(&bias),
                    running_mean: (!training).then_some(&mean),
                    running_var: (!training).then_some(&var),
                    training,
                    eps: Some(eps),
                    ..Default::default()
                },
            )
        };
        let loss = |xv: &[f64], wv: &[f64], bv: &[f64]| -> Result<f64> {
            let y = forward(xv, wv, bv)?.output.to_vec_f64()?;
            Ok(y.iter().zip(&gs).map(|(y, g)| y * g).sum())
        };
        let fwd = forward(&xs, &ws, &bs)?;
        if !training {
            assert_eq!(
                fwd.mean.to_vec_f64()?,
                rm,
                "inference saves the running mean"
            );
            let want: Vec<f64> = rv.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
            assert_eq!(fwd.invstd.to_vec_f64()?, want);
        }
        let x = b.from_f64(&xs, &shape, DType::F64)?;
        let g = b.from_f64(&gs, &shape, DType::F64)?;
        let w = b.from_f64(&ws, &[c], DType::F64)?;
        let grads = b.batch_norm_backward(
            &g,
            &x,
            affine.then_some(&w),
            &fwd.mean,
            &fwd.invstd,
            training,
        )?;
        let what = format!("batch_norm {shape:?} training {training} affine {affine}");
        assert_finite_differences(
            &xs,
            &grads.input.to_vec_f64()?,
            &format!("input {what}"),
            |v| loss(v, &ws, &bs),
        )?;
        if affine {
            let dw = grads.weight.to_vec_f64()?;
            assert_finite_differences(&ws, &dw, &format!("weight {what}"), |v| loss(&xs, v, &bs))?;
            let db = grads.bias.to_vec_f64()?;
            assert_finite_differences(&bs, &db, &format!("bias {what}"), |v| loss(&xs, &ws, v))?;
        }
    }
    Ok(())
}

/// The small CNN of `validation::cnn` (conv → relu → max-pool twice, linear, cross-entropy): every
/// parameter's gradient from the backward ops against finite differences of the loss, on the
/// reference in f64 (random values, so no relu or pooling kink lies within a step of a point).
#[test]
fn cnn_gradients_match_finite_differences() -> Result<()> {
    use torsh_backend::validation::cnn;
    let b = Backend::reference()?;
    let images = b.randn(&[2, 1, cnn::SIDE, cnn::SIDE], DType::F64)?;
    let labels = b.from_slice(&[1i64, 4], &[2])?;
    let shapes = cnn::parameter_shapes();
    let values: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let t = b.randn(s, DType::F64)?;
            Ok(t.to_vec_f64()?
                .iter()
                .map(|v| v * 0.5 + 0.01 * k as f64)
                .collect())
        })
        .collect::<Result<_>>()?;
    let params = |values: &[Vec<f64>]| -> Result<Vec<Tensor>> {
        values
            .iter()
            .zip(&shapes)
            .map(|(v, s)| b.from_f64(v, s, DType::F64))
            .collect()
    };
    let (_, grads) = cnn::loss_and_grads(&b, &images, &labels, &params(&values)?)?;
    for (k, grad) in grads.iter().enumerate() {
        assert_eq!(grad.shape(), &shapes[k][..]);
        assert_finite_differences(
            &values[k],
            &grad.to_vec_f64()?,
            &format!("cnn parameter {k}"),
            |v| {
                let mut perturbed = values.clone();
                perturbed[k] = v.to_vec();
                cnn::loss(&b, &images, &labels, &params(&perturbed)?)?
                    .to_vec_f64()
                    .map(|l| l[0])
            },
        )?;
    }
    Ok(())
}

/// Attention's dq, dk and dv from the saved log-sum-exp against finite differences of `Σ g · O`,
/// causal and not, with fewer and more queries than keys; the log-sum-exp against its definition.
#[test]
fn attention_gradients_match_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    for ([batch, heads, sq, skv, dim], causal) in [
        ([1usize, 2, 3, 5, 4], false),
        ([1, 2, 3, 5, 4], true),
        ([2, 1, 5, 3, 3], true),
        ([1, 1, 1, 1, 2], false),
    ] {
        let (qs, ks) = (vec![batch, heads, sq, dim], vec![batch, heads, skv, dim]);
        let (nq, nk) = (batch * heads * sq * dim, batch * heads * skv * dim);
        let (qv, kv, vv, gv) = (spread(nq, 1), spread(nk, 2), spread(nk, 3), spread(nq, 4));
        let scale = 0.7;
        let t = |v: &[f64], shape: &[usize]| b.from_f64(v, shape, DType::F64);
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> Result<f64> {
            let o = b.attention_with_scale(&t(q, &qs)?, &t(k, &ks)?, &t(v, &ks)?, causal, scale)?;
            Ok(o.to_vec_f64()?.iter().zip(&gv).map(|(o, g)| o * g).sum())
        };
        let (q, k, v) = (t(&qv, &qs)?, t(&kv, &ks)?, t(&vv, &ks)?);
        let fwd = b.attention_with_lse(&q, &k, &v, causal, scale)?;
        assert_eq!(
            fwd.output.to_vec_f64()?,
            b.attention_with_scale(&q, &k, &v, causal, scale)?
                .to_vec_f64()?
        );
        assert_eq!(fwd.lse.shape(), &qs[..3]);
        let lse = fwd.lse.to_vec_f64()?;
        for (r, &got) in lse.iter().enumerate() {
            let (head, i) = (r / sq, r % sq);
            let seen = if causal { (i + 1).min(skv) } else { skv };
            let sum: f64 = (0..seen)
                .map(|j| {
                    let dot: f64 = (0..dim)
                        .map(|c| qv[r * dim + c] * kv[(head * skv + j) * dim + c])
                        .sum();
                    (scale * dot).exp()
                })
                .sum();
            assert!((got - sum.ln()).abs() < 1e-12, "lse row {r}: {got}");
        }
        let grads = b.attention_backward(
            &t(&gv, &qs)?,
            &q,
            &k,
            &v,
            &fwd.output,
            &fwd.lse,
            causal,
            scale,
        )?;
        let what = format!(
            "attention {:?} causal {causal}",
            [batch, heads, sq, skv, dim]
        );
        let dq = grads.q.to_vec_f64()?;
        assert_finite_differences(&qv, &dq, &format!("dq {what}"), |x| loss(x, &kv, &vv))?;
        let dk = grads.k.to_vec_f64()?;
        assert_finite_differences(&kv, &dk, &format!("dk {what}"), |x| loss(&qv, x, &vv))?;
        let dv = grads.v.to_vec_f64()?;
        assert_finite_differences(&vv, &dv, &format!("dv {what}"), |x| loss(&qv, &kv, x))?;
    }
    Ok(())
}

/// Norm gradients over no value still write their weight and bias gradients (zero sums), and the
/// statistics of rows of no element are NaN, on every backend; the gradients are NaN-filled first.
#[test]
fn norm_gradients_of_empty_sums_write_every_element() -> Result<()> {
    use torsh_backend::compute::{BatchNormBackwardDesc, LayerNormBackwardDesc};
    for b in common::backends() {
        let what = b.backend_type();
        let poisoned = |len: usize| b.full(&[len], f64::NAN, DType::F32);
        let none = b.randn(&[0], DType::F32)?;
        let w = b.randn(&[5], DType::F32)?;
        let (dw, db) = (poisoned(5)?, poisoned(5)?);
        b.compute().layer_norm_backward(&LayerNormBackwardDesc {
            dtype: DType::F32,
            grad_output: none.data_ptr(),
            input: none.data_ptr(),
            weight: Some(w.data_ptr()),
            mean: none.data_ptr(),
            invstd: none.data_ptr(),
            grad_input: None,
            grad_weight: Some(dw.data_ptr()),
            grad_bias: Some(db.data_ptr()),
            rows: 0,
            cols: 5,
        })?;
        assert_eq!(dw.to_vec_f64()?, vec![0.0; 5], "{what}");
        assert_eq!(db.to_vec_f64()?, vec![0.0; 5], "{what}");
        let (mean, invstd) = (b.randn(&[3], DType::F32)?, b.randn(&[3], DType::F32)?);
        let (dw, db) = (poisoned(3)?, poisoned(3)?);
        b.compute().batch_norm_backward(&BatchNormBackwardDesc {
            dtype: DType::F32,
            grad_output: none.data_ptr(),
            input: none.data_ptr(),
            weight: None,
            mean: mean.data_ptr(),
            invstd: invstd.data_ptr(),
            grad_input: None,
            grad_weight: Some(dw.data_ptr()),
            grad_bias: Some(db.data_ptr()),
            batch: 0,
            channels: 3,
            spatial: 4,
            training: false,
        })?;
        assert_eq!(dw.to_vec_f64()?, vec![0.0; 3], "{what}");
        assert_eq!(db.to_vec_f64()?, vec![0.0; 3], "{what}");
        // Rows of no element: NaN statistics, written over zeros.
        let (mean, invstd) = (b.zeros(&[2], DType::F32)?, b.zeros(&[2], DType::F32)?);
        b.compute()
            .layer_norm(&torsh_backend::compute::LayerNormDesc {
                dtype: DType::F32,
                input: none.data_ptr(),
                weight: None,
                bias: None,
                output: none.data_ptr(),
                rows: 2,
                cols: 0,
                eps: 1e-5,
                saved_mean: Some(mean.data_ptr()),
                saved_invstd: Some(invstd.data_ptr()),
            })?;
        assert!(mean.to_vec_f64()?.iter().all(|v| v.is_nan()), "{what}");
        assert!(invstd.to_vec_f64()?.iter().all(|v| v.is_nan()), "{what}");
    }
    Ok(())
}
