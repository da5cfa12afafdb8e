//! Training ops: batch norm modes, the fused Adam step and the backward ops.

use super::*;

// ---------------------------------------------------------------------------------------------------
// Batch norm modes
// ---------------------------------------------------------------------------------------------------

#[test]
fn batch_norm_mode_errors() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let f = DType::F32;
        let rm = b.zeros(&[3], f).expect("zeros");
        let rv = b.ones(&[3], f).expect("ones");
        let x13 = seq(&b, &[1, 3]);
        let x43 = seq(&b, &[4, 3]);

        // training with one value per channel
        let err = assert_err!(b.batch_norm(&x13, &rm, &rv, true), InvalidArgument);
        assert_mentions(&err, &["batch_norm", "one value per channel"]);
        assert_err!(
            b.batch_norm(&seq(&b, &[1, 3, 1, 1]), &rm, &rv, true),
            InvalidArgument
        );
        assert_err!(
            b.batch_norm_with(
                &x13,
                BatchNormConfig {
                    training: true,
                    ..Default::default()
                }
            ),
            InvalidArgument
        );
        // inference without running statistics
        let err = assert_err!(
            b.batch_norm_with(
                &x43,
                BatchNormConfig {
                    training: false,
                    ..Default::default()
                }
            ),
            InvalidArgument
        );
        assert_mentions(&err, &["batch_norm", "running_mean"]);
        assert_err!(x43.batch_norm(BatchNormConfig::default()), InvalidArgument);
        assert_err!(
            b.batch_norm_with(
                &x43,
                BatchNormConfig {
                    running_mean: Some(&rm),
                    training: false,
                    ..Default::default()
                }
            ),
            InvalidArgument
        );
        // bad momentum / eps
        let with = |momentum: Option<f64>, eps: Option<f64>| BatchNormConfig {
            running_mean: Some(&rm),
            running_var: Some(&rv),
            training: true,
            momentum,
            eps,
            ..Default::default()
        };
        assert_err!(
            b.batch_norm_with(&x43, with(Some(1.5), None)),
            InvalidArgument
        );
        assert_err!(
            b.batch_norm_with(&x43, with(Some(f64::NAN), None)),
            InvalidArgument
        );
        assert_err!(
            b.batch_norm_with(&x43, with(None, Some(-1.0))),
            InvalidArgument
        );
        assert_err!(
            b.batch_norm_with(&x43, with(None, Some(f64::INFINITY))),
            InvalidArgument
        );
        assert_eq!(
            vals(&rm),
            vec![0.0; 3],
            "running_mean written by a failed op"
        );
        assert_eq!(
            vals(&rv),
            vec![1.0; 3],
            "running_var written by a failed op"
        );

        // valid calls still work: training updates the running mean by momentum · batch mean
        let y = assert_ok!(b.batch_norm(&x43, &rm, &rv, true));
        assert_eq!(y.shape(), &[4, 3]);
        assert_close(&vals(&rm), &[0.0125, 0.0375, 0.0625], 1e-6);
        // inference with one value per channel is fine
        let y = assert_ok!(b.batch_norm(&x13, &rm, &rv, false));
        assert_eq!(y.shape(), &[1, 3]);
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Fused Adam
// ---------------------------------------------------------------------------------------------------

#[test]
fn fused_adam_rejects_bad_input_without_updating_anything() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let p0 = t(&b, &[1.0, 2.0], &[2]);
        let p1 = t(&b, &[3.0, 4.0, 5.0], &[3]);
        let g0 = t(&b, &[0.5, -0.5], &[2]);
        let g1 = t(&b, &[1.0, 1.0, -1.0], &[3]);
        let grads = vec![g0.clone(), g1.clone()];
        let mut params = vec![p0.clone(), p1.clone()];
        let mut state = AdamState::adam();
        let snapshot = |ps: &[Tensor]| ps.iter().map(vals).collect::<Vec<_>>();
        let before = snapshot(&params);
        let betas = (0.9, 0.999);

        // counts and shapes
        let err = assert_err!(
            b.fused_adam_step(&mut params, &grads[..1], &mut state, 0.1, betas),
            ShapeMismatch
        );
        assert_mentions(&err, &["fused_adam_step", "2 params", "1 grads"]);
        assert_err!(
            b.fused_adam_step(&mut params, &[], &mut state, 0.1, betas),
            ShapeMismatch
        );
        let wrong = vec![g0.clone(), t(&b, &[1.0, 1.0], &[2])];
        let err = assert_err!(
            b.fused_adam_step(&mut params, &wrong, &mut state, 0.1, betas),
            ShapeMismatch
        );
        assert_mentions(&err, &["param 1"]);

        // hyper-parameters
        for (lr, betas) in [
            (-0.1, (0.9, 0.999)),
            (f32::NAN, (0.9, 0.999)),
            (f32::INFINITY, (0.9, 0.999)),
            (0.1, (1.0, 0.999)),
            (0.1, (0.9, 1.0)),
            (0.1, (0.9, 1.5)),
            (0.1, (-0.1, 0.999)),
        ] {
            let err = assert_err!(
                b.fused_adam_step(&mut params, &grads, &mut state, lr, betas),
                InvalidArgument
            );
            assert_mentions(&err, &["adam"]);
        }
        let mut bad_eps = AdamState::adam().with_eps(-1.0);
        assert_err!(
            b.fused_adam_step(&mut params, &grads, &mut bad_eps, 0.1, betas),
            InvalidArgument
        );
        let mut bad_wd = AdamState::adam().with_weight_decay(-0.01);
        assert_err!(
            b.fused_adam_step(&mut params, &grads, &mut bad_wd, 0.1, betas),
            InvalidArgument
        );

        // dtypes and devices
        let g64 = b.from_slice(&[0.5f64, -0.5], &[2]).expect("f64 grad");
        assert_err!(
            b.fused_adam_step(&mut params, &[g64, g1.clone()], &mut state, 0.1, betas),
            DTypeMismatch
        );
        let other = Backend::reference().expect("reference");
        let foreign = vec![g0.clone(), t(&other, &[1.0, 1.0, -1.0], &[3])];
        assert_err!(
            b.fused_adam_step(&mut params, &foreign, &mut state, 0.1, betas),
            DeviceMismatch
        );

        assert_eq!(snapshot(&params), before, "a failed step changed params");
        assert_eq!(state.step(), 0, "a failed step advanced the step count");
        for s in [&state, &bad_eps, &bad_wd] {
            for m in s.exp_avg().iter().chain(s.exp_avg_sq()) {
                assert!(vals(m).iter().all(|&v| v == 0.0), "moments changed");
            }
        }

        // one valid step: p -= lr · sign(g) on the first step
        assert_ok!(b.fused_adam_step(&mut params, &grads, &mut state, 0.1, betas));
        assert_eq!(state.step(), 1);
        let after = snapshot(&params);
        assert_close(&after[0], &[0.9, 2.1], 1e-5);
        assert_close(&after[1], &[2.9, 3.9, 5.1], 1e-5);
        let moments: Vec<Vec<f32>> = state.exp_avg().iter().map(vals).collect();

        // the state now holds two parameters: one, or reshaped ones, do not fit
        let mut one = vec![p0.clone()];
        assert_err!(
            b.fused_adam_step(&mut one, &grads[..1], &mut state, 0.1, betas),
            ShapeMismatch
        );
        let mut reshaped = vec![assert_ok!(p0.reshape(&[2, 1])), p1.clone()];
        let reshaped_grads = vec![assert_ok!(g0.reshape(&[2, 1])), g1.clone()];
        assert_err!(
            b.fused_adam_step(&mut reshaped, &reshaped_grads, &mut state, 0.1, betas),
            ShapeMismatch
        );
        assert_err!(
            b.fused_adam_step(&mut params, &grads, &mut state, -1.0, betas),
            InvalidArgument
        );
        assert_eq!(snapshot(&params), after, "a failed step changed params");
        assert_eq!(state.step(), 1, "a failed step advanced the step count");
        let moments_now: Vec<Vec<f32>> = state.exp_avg().iter().map(vals).collect();
        assert_eq!(moments_now, moments, "a failed step changed the moments");

        assert_backend_works(&b);
    }
}

#[test]
fn fused_adam_with_a_gradient_aliasing_its_parameter_updates_all_or_nothing() {
    // The second gradient IS the second parameter. Whether the library accepts that (reading the
    // gradient before writing) or refuses it (Aliasing), the step must be all-or-nothing: a refusal
    // must not leave the first parameter updated.
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let p0 = t(&b, &[1.0, 2.0], &[2]);
        let p1 = t(&b, &[3.0, -4.0], &[2]);
        let mut params = vec![p0.clone(), p1.clone()];
        let grads = vec![t(&b, &[0.5, 0.5], &[2]), p1.clone()];
        let mut state = AdamState::adam();
        match no_panic!(b.fused_adam_step(&mut params, &grads, &mut state, 0.1, (0.9, 0.999))) {
            Ok(()) => {
                assert_eq!(state.step(), 1);
                assert_close(&vals(&p0), &[0.9, 1.9], 1e-5);
                assert_close(&vals(&p1), &[2.9, -3.9], 1e-5);
            }
            Err(err @ BackendError::Aliasing { .. }) => {
                assert_mentions(&err, &["adam"]);
                assert_eq!(
                    vals(&p0),
                    vec![1.0, 2.0],
                    "fused_adam_step returned {err:?} but had already updated param 0"
                );
                assert_eq!(vals(&p1), vec![3.0, -4.0]);
                assert_eq!(state.step(), 0);
            }
            Err(other) => panic!("expected Ok or Err(Aliasing), got {other:?}"),
        }
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Backward ops
// ---------------------------------------------------------------------------------------------------

#[test]
fn backward_ops_reject_mismatched_operands() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let y = seq(&b, &[2, 3]);
        let other = seq(&b, &[3, 2]);
        let err = assert_err!(b.softmax_backward(&other, &y, -1), ShapeMismatch);
        assert_mentions(&err, &["softmax_backward", "grad"]);
        assert_err!(b.log_softmax_backward(&other, &y, -1), ShapeMismatch);
        assert_err!(b.softmax_backward(&y, &y, 2), InvalidArgument);
        let wide = y.cast(DType::F64).expect("cast");
        assert_err!(b.softmax_backward(&wide, &y, -1), DTypeMismatch);
        assert_err!(b.unary_backward(UnaryOp::Exp, &y, &other), ShapeMismatch);
        assert_err!(b.dropout(&y, 1.5, 0), InvalidArgument);
    }
}

#[test]
fn pooling_gradients_reject_mismatched_operands() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let config = Pool2dConfig::new([2, 2]);
        let shape = [1, 2, 4, 4];
        let x = seq(&b, &shape);
        let (y, indices) = assert_ok!(x.max_pool2d_with_indices(config));
        assert_eq!(y.shape(), [1, 2, 2, 2]);
        // The gradient must have the forward's output shape; the input shape rank 4.
        let err = assert_err!(b.avg_pool2d_backward(&x, &shape, config), ShapeMismatch);
        assert_mentions(&err, &["pool2d_backward", "grad"]);
        assert_err!(b.avg_pool2d_backward(&y, &[2, 4, 4], config), ShapeMismatch);
        assert_err!(
            b.max_pool2d_backward(&y, &indices, &[1, 2, 5, 5, 1], config),
            ShapeMismatch
        );
        // Indices: I64 of the gradient's shape.
        let narrow = assert_ok!(indices.cast(DType::I32));
        assert_err!(
            b.max_pool2d_backward(&y, &narrow, &shape, config),
            DTypeMismatch
        );
        let flat = assert_ok!(indices.reshape(&[8]));
        assert_err!(
            b.max_pool2d_backward(&y, &flat, &shape, config),
            ShapeMismatch
        );
        // A window the forward refuses.
        let wide = Pool2dConfig {
            padding: [2, 0],
            ..config
        };
        assert_err!(b.avg_pool2d_backward(&y, &shape, wide), InvalidArgument);
        assert_backend_works(&b);
    }
}

/// An index that is not an element of its own window is `IndexOutOfRange` naming the op and the
/// plane's size: before anything is written where ops are checked on the host, at the next host
/// read on GPUs; the backend works afterwards.
#[test]
fn pooling_gradient_indices_outside_their_windows_are_errors() {
    for b in backends() {
        let name = b.backend_type();
        let config = Pool2dConfig::new([2, 2]);
        let shape = [1, 1, 4, 4];
        let grad = seq(&b, &[1, 1, 2, 2]);
        // Window (0, 0) holds positions 0, 1, 4 and 5: 2 is one column past it, 8 one row below
        // it (and the next window's), 16 past the plane, -1 before it.
        for bad in [2i64, 8, 16, -1] {
            let ix = assert_ok!(b.from_slice(&[bad, 3, 8, 10], &[1, 1, 2, 2]));
            let err = match no_panic!(b.max_pool2d_backward(&grad, &ix, &shape, config)) {
                Err(e) => e,
                Ok(dx) => {
                    no_panic!(dx.to_vec_f64()).expect_err("a bad index must fail by the read")
                }
            };
            assert!(
                matches!(
                    err,
                    BackendError::IndexOutOfRange {
                        op: "max_pool2d_backward",
                        index,
                        size: 16
                    } if index == bad
                ),
                "{name}: index {bad}: {err:?}"
            );
            assert_mentions(&err, &["max_pool2d_backward"]);
        }
        let good = assert_ok!(b.from_slice(&[0i64, 3, 8, 10], &[1, 1, 2, 2]));
        let dx = assert_ok!(b.max_pool2d_backward(&grad, &good, &shape, config));
        let g = vals(&grad);
        let mut want = vec![0.0; 16];
        for (at, v) in [0, 3, 8, 10].into_iter().zip(g) {
            want[at] = v;
        }
        assert_eq!(vals(&dx), want, "{name}");
        assert_backend_works(&b);
    }
}

#[test]
fn losses_reject_bad_targets_shapes_and_smoothing() {
    for b in backends() {
        let name = b.backend_type();
        let logits = seq(&b, &[3, 4]);
        let target = assert_ok!(b.from_slice(&[0i64, 3, 1], &[3]));
        let config = CrossEntropyConfig::default();
        // Targets: integer indices, one per row.
        let floats = assert_ok!(target.cast(DType::F32));
        let err = assert_err!(logits.cross_entropy(&floats, config), DTypeMismatch);
        assert_mentions(&err, &["cross_entropy"]);
        let short = assert_ok!(b.from_slice(&[0i64, 3], &[2]));
        assert_err!(logits.cross_entropy(&short, config), ShapeMismatch);
        assert_err!(
            seq(&b, &[3, 4, 1]).cross_entropy(&target, config),
            ShapeMismatch
        );
        let err = assert_err!(
            logits.cross_entropy(
                &target,
                CrossEntropyConfig {
                    label_smoothing: 1.5,
                    ..config
                }
            ),
            InvalidArgument
        );
        assert_mentions(&err, &["label_smoothing"]);
        // The gradient: 0-d for a mean, [N] for none.
        let scalar = assert_ok!(b.full(&[], 1.0, DType::F32));
        assert_err!(
            b.cross_entropy_backward(&seq(&b, &[3]), &logits, &target, config),
            ShapeMismatch
        );
        let none = CrossEntropyConfig {
            reduction: Reduction::None,
            ..config
        };
        assert_err!(
            b.cross_entropy_backward(&scalar, &logits, &target, none),
            ShapeMismatch
        );
        assert_err!(
            b.nll_loss_backward(&scalar, &logits, &floats, Reduction::Sum, None),
            DTypeMismatch
        );
        // A target past the classes: IndexOutOfRange, now or at the host read.
        let past = assert_ok!(b.from_slice(&[0i64, 4, 1], &[3]));
        // The error comes now (CPU) or at the host read (GPUs).
        let failed = |r: torsh_backend::Result<torsh_backend::Tensor>| match r {
            Err(e) => e,
            Ok(y) => no_panic!(y.to_vec_f64()).expect_err("a bad target must fail by the read"),
        };
        let err = failed(no_panic!(logits.cross_entropy(&past, config)));
        assert!(
            matches!(
                err,
                BackendError::IndexOutOfRange {
                    index: 4,
                    size: 4,
                    ..
                }
            ),
            "{name}: {err:?}"
        );
        // The gradient, from a negative I32 target.
        let negative = assert_ok!(b.from_slice(&[0i32, -3, 1], &[3]));
        let err = failed(no_panic!(
            b.cross_entropy_backward(&scalar, &logits, &negative, config)
        ));
        assert!(
            matches!(
                err,
                BackendError::IndexOutOfRange {
                    op: "cross_entropy_backward",
                    index: -3,
                    size: 4,
                }
            ),
            "{name}: {err:?}"
        );
        assert_backend_works(&b);
    }
}

/// The convolution gradients and the transposed convolution answer typed errors for shapes that do
/// not match the forward, bad windows, mixed dtypes and raw descriptors whose shapes disagree.
#[test]
fn convolution_gradients_reject_mismatched_operands() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let config = ConvConfig {
            padding: [1, 1],
            ..Default::default()
        };
        let x = seq(&b, &[1, 2, 5, 5]);
        let w = seq(&b, &[3, 2, 3, 3]);
        let y = assert_ok!(b.conv2d(&x, &w, config));
        // The output gradient must be what the forward of these shapes gives.
        let err = assert_err!(
            b.conv2d_backward_input(&x, &w, &[1, 2, 5, 5], config),
            ShapeMismatch
        );
        assert_mentions(&err, &["conv2d_backward_input", "grad_output"]);
        assert_err!(
            b.conv2d_backward_input(&y, &w, &[1, 2, 5], config),
            ShapeMismatch
        );
        assert_err!(
            b.conv2d_backward_input(&y, &w, &[1, 4, 5, 5], config),
            ShapeMismatch
        );
        assert_err!(
            b.conv2d_backward_weight(&y, &x, &[3, 2, 2, 2], config),
            ShapeMismatch
        );
        assert_err!(
            b.conv2d_backward_bias(&w.reshape(&[54]).unwrap()),
            ShapeMismatch
        );
        let stride0 = ConvConfig {
            stride: [0, 1],
            ..config
        };
        assert_err!(
            b.conv2d_backward_weight(&y, &x, &[3, 2, 3, 3], stride0),
            InvalidArgument
        );
        let half = assert_ok!(y.cast(DType::F16));
        assert_err!(
            b.conv2d_backward_input(&half, &w, &[1, 2, 5, 5], config),
            DTypeMismatch
        );
        // Transposed: output padding below the stride, the weight's first dim the input's
        // channels, something left after the padding.
        let t = ConvTransposeConfig {
            stride: [2, 2],
            output_padding: [2, 0],
            ..Default::default()
        };
        let err = assert_err!(b.conv_transpose2d(&y, &w, None, t), InvalidArgument);
        assert_mentions(&err, &["conv_transpose2d", "output padding"]);
        assert_err!(
            b.conv_transpose2d(&x, &w, None, Default::default()),
            ShapeMismatch
        );
        let crop = ConvTransposeConfig {
            padding: [4, 4],
            ..Default::default()
        };
        assert_err!(b.conv_transpose2d(&y, &w, None, crop), ShapeMismatch);
        let bias = seq(&b, &[3]);
        assert_err!(
            b.conv_transpose2d(&y, &w, Some(&bias), Default::default()),
            ShapeMismatch
        );
        // A raw descriptor whose output gradient disagrees with its window.
        let raw = Conv2dBackwardWeightDesc {
            dtype: DType::F32,
            input: x.data_ptr(),
            input_shape: [1, 2, 5, 5],
            grad_output: y.data_ptr(),
            grad_output_shape: [1, 3, 3, 3],
            grad_weight: w.data_ptr(),
            weight_shape: [3, 2, 3, 3],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
        };
        let err = assert_err!(b.compute().conv2d_backward_weight(&raw), ShapeMismatch);
        assert_mentions(&err, &["conv2d_backward_weight"]);
        let raw = Conv2dBackwardInputDesc {
            dtype: DType::F32,
            grad_output: y.data_ptr(),
            grad_output_shape: [1, 3, 5, 5],
            weight: w.data_ptr(),
            weight_shape: [3, 2, 3, 3],
            bias: None,
            grad_input: y.data_ptr(),
            grad_input_shape: [1, 2, 5, 5],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
        };
        // The gradient written over the output gradient it reads.
        assert_err!(b.compute().conv2d_backward_input(&raw), Aliasing);
        assert_backend_works(&b);
    }
}

/// Norm gradients: a gradient not of the input's shape, a weight or statistics of the wrong
/// length or dtype, mixed dtypes, a raw descriptor asking for no gradient or writing over its
/// input, and saved statistics given without their pair.
#[test]
fn norm_gradients_reject_mismatched_operands() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let x = seq(&b, &[3, 4]);
        let w = seq(&b, &[4]);
        let saved = assert_ok!(x.layer_norm_with_stats(&[4], Some(&w), None, 1e-5));
        let (mean, invstd) = (&saved.mean, &saved.invstd);
        assert_ok!(b.layer_norm_backward(&x, &x, &[4], Some(&w), mean, invstd));
        let err = assert_err!(
            b.layer_norm_backward(&seq(&b, &[4, 3]), &x, &[4], None, mean, invstd),
            ShapeMismatch
        );
        assert_mentions(&err, &["layer_norm_backward", "grad"]);
        assert_err!(
            b.layer_norm_backward(&x, &x, &[3], None, mean, invstd),
            ShapeMismatch
        );
        assert_err!(
            b.layer_norm_backward(&x, &x, &[4], Some(&seq(&b, &[3])), mean, invstd),
            ShapeMismatch
        );
        let short = assert_ok!(mean.narrow(0, 0, 2));
        let err = assert_err!(
            b.layer_norm_backward(&x, &x, &[4], None, &short, invstd),
            ShapeMismatch
        );
        assert_mentions(&err, &["layer_norm_backward", "mean"]);
        let wide = assert_ok!(mean.cast(DType::F64));
        assert_err!(
            b.layer_norm_backward(&x, &x, &[4], None, &wide, invstd),
            DTypeMismatch
        );
        let half = assert_ok!(x.cast(DType::F16));
        assert_err!(
            b.layer_norm_backward(&half, &x, &[4], None, mean, invstd),
            DTypeMismatch
        );

        let images = seq(&b, &[2, 3, 5]);
        let bn = assert_ok!(images.batch_norm_with_stats(BatchNormConfig {
            training: true,
            ..Default::default()
        }));
        let (bm, bi) = (&bn.mean, &bn.invstd);
        assert_ok!(b.batch_norm_backward(&images, &images, None, bm, bi, true));
        assert_err!(
            b.batch_norm_backward(&images, &seq(&b, &[3]), None, bm, bi, true),
            ShapeMismatch
        );
        assert_err!(
            b.batch_norm_backward(&seq(&b, &[2, 5, 3]), &images, None, bm, bi, true),
            ShapeMismatch
        );
        assert_err!(
            b.batch_norm_backward(&images, &images, Some(&w), bm, bi, true),
            ShapeMismatch
        );
        assert_err!(
            b.batch_norm_backward(&images, &images, None, &short, bi, false),
            ShapeMismatch
        );

        // Raw descriptors.
        let out = seq(&b, &[3, 4]);
        let raw = LayerNormBackwardDesc {
            dtype: DType::F32,
            grad_output: x.data_ptr(),
            input: x.data_ptr(),
            weight: None,
            mean: mean.data_ptr(),
            invstd: invstd.data_ptr(),
            grad_input: None,
            grad_weight: None,
            grad_bias: None,
            rows: 3,
            cols: 4,
        };
        let err = assert_err!(b.compute().layer_norm_backward(&raw), InvalidArgument);
        assert_mentions(&err, &["layer_norm_backward", "no gradient"]);
        assert_err!(
            b.compute().layer_norm_backward(&LayerNormBackwardDesc {
                grad_input: Some(x.data_ptr()),
                ..raw.clone()
            }),
            Aliasing
        );
        assert_ok!(b.compute().layer_norm_backward(&LayerNormBackwardDesc {
            grad_input: Some(out.data_ptr()),
            ..raw.clone()
        }));
        let forward = LayerNormDesc {
            dtype: DType::F32,
            input: x.data_ptr(),
            weight: None,
            bias: None,
            output: out.data_ptr(),
            rows: 3,
            cols: 4,
            eps: 1e-5,
            saved_mean: Some(mean.data_ptr()),
            saved_invstd: None,
        };
        let err = assert_err!(b.compute().layer_norm(&forward), InvalidArgument);
        assert_mentions(&err, &["layer_norm", "saved_invstd"]);
        assert_backend_works(&b);
    }
}

#[test]
fn attention_gradients_reject_mismatched_operands() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let (q, k, v) = (
            seq(&b, &[1, 2, 3, 4]),
            seq(&b, &[1, 2, 5, 4]),
            seq(&b, &[1, 2, 5, 4]),
        );
        let fwd = assert_ok!(b.attention_with_lse(&q, &k, &v, true, 0.5));
        let (o, lse) = (&fwd.output, &fwd.lse);
        assert_eq!(lse.shape(), &[1, 2, 3]);
        let grads = assert_ok!(b.attention_backward(&q, &q, &k, &v, o, lse, true, 0.5));
        assert_eq!(grads.k.shape(), &[1, 2, 5, 4]);
        let err = assert_err!(
            b.attention_backward(&seq(&b, &[1, 2, 4, 3]), &q, &k, &v, o, lse, true, 0.5),
            ShapeMismatch
        );
        assert_mentions(&err, &["attention_backward", "grad"]);
        assert_err!(
            b.attention_backward(&q, &q, &k, &v, &k, lse, true, 0.5),
            ShapeMismatch
        );
        assert_err!(
            b.attention_backward(&q, &q, &k, &seq(&b, &[1, 2, 4, 4]), o, lse, true, 0.5),
            ShapeMismatch
        );
        let short = assert_ok!(lse.narrow(2, 0, 2));
        let err = assert_err!(
            b.attention_backward(&q, &q, &k, &v, o, &short, true, 0.5),
            ShapeMismatch
        );
        assert_mentions(&err, &["attention_backward", "lse"]);
        let wide = assert_ok!(lse.cast(DType::F64));
        assert_err!(
            b.attention_backward(&q, &q, &k, &v, o, &wide, true, 0.5),
            DTypeMismatch
        );
        let half = assert_ok!(q.cast(DType::F16));
        assert_err!(
            b.attention_backward(&half, &q, &k, &v, o, lse, true, 0.5),
            DTypeMismatch
        );
        assert_err!(
            b.attention_backward(&q, &q, &k, &v, o, lse, true, f64::INFINITY),
            InvalidArgument
        );

        // Raw descriptors: outputs aliasing inputs or each other, no keys for present queries.
        let [dq, dk, dv] = [&q, &k, &v].map(|t| assert_ok!(b.empty(t.shape(), DType::F32)));
        let raw = AttentionBackwardDesc {
            dtype: DType::F32,
            grad_output: q.data_ptr(),
            q: q.data_ptr(),
            k: k.data_ptr(),
            v: v.data_ptr(),
            o: o.data_ptr(),
            lse: lse.data_ptr(),
            grad_q: dq.data_ptr(),
            grad_k: dk.data_ptr(),
            grad_v: dv.data_ptr(),
            batch: 1,
            heads: 2,
            seq_q: 3,
            seq_kv: 5,
            head_dim: 4,
            scale: 0.5,
            causal: false,
        };
        assert_ok!(b.compute().attention_backward(&raw));
        assert_err!(
            b.compute().attention_backward(&AttentionBackwardDesc {
                grad_q: q.data_ptr(),
                ..raw.clone()
            }),
            Aliasing
        );
        assert_err!(
            b.compute().attention_backward(&AttentionBackwardDesc {
                grad_v: dk.data_ptr(),
                ..raw.clone()
            }),
            Aliasing
        );
        let err = assert_err!(
            b.compute().attention_backward(&AttentionBackwardDesc {
                seq_kv: 0,
                ..raw.clone()
            }),
            InvalidArgument
        );
        assert_mentions(&err, &["attention_backward", "seq_kv"]);
        assert_err!(
            b.compute().attention_backward(&AttentionBackwardDesc {
                dtype: DType::I32,
                ..raw.clone()
            }),
            Unsupported
        );
        // No query: zero key and value gradients, written over NaN.
        let [nk, nv] = [0, 1].map(|_| assert_ok!(b.full(&[1, 2, 5, 4], f64::NAN, DType::F32)));
        assert_ok!(b.compute().attention_backward(&AttentionBackwardDesc {
            seq_q: 0,
            grad_k: nk.data_ptr(),
            grad_v: nv.data_ptr(),
            ..raw.clone()
        }));
        assert_eq!(assert_ok!(nk.to_vec_f64()), vec![0.0; 40]);
        assert_eq!(assert_ok!(nv.to_vec_f64()), vec![0.0; 40]);
        // No head dim: the log-sum-exps of zero scores, ln(keys seen).
        let none = assert_ok!(b.empty(&[1, 1, 3, 0], DType::F32));
        let keys = assert_ok!(b.empty(&[1, 1, 2, 0], DType::F32));
        let fwd = assert_ok!(b.attention_with_lse(&none, &keys, &keys, true, 0.5));
        let want = [1.0f32, 2.0, 2.0].map(f32::ln);
        assert_close(&assert_ok!(fwd.lse.to_vec::<f32>()), &want, 1e-6);
    }
}
