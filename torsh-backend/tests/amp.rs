//! Mixed precision (`runtime/amp.rs`) on every available backend: matmul, gemm, conv2d and
//! attention on f32 tensors run in f16/bf16 within the 16-bit error bound of the reference and
//! return f32, and the loss scaler follows `torch.amp.GradScaler`'s documented behaviour step by
//! step.

use torsh_backend::prelude::*;
use torsh_backend::validation::{self, compare};
use torsh_backend::{AdamState, LossScaler, MixedPrecisionConfig};

mod common;
use common::backends;

/// One op on a backend, giving its output.
type Case<'a> = Box<dyn Fn(&Backend) -> Tensor + 'a>;

fn config(compute_dtype: DType) -> MixedPrecisionConfig {
    MixedPrecisionConfig {
        compute_dtype,
        accum_dtype: DType::F32,
        scale_factor: 65536.0,
    }
}

#[test]
fn seed_mixed_precision_snippet() -> Result<()> {
    let backend = Backend::new(BackendType::Auto)?;
    let backend = backend.enable_mixed_precision(MixedPrecisionConfig {
        compute_dtype: DType::F16,
        accum_dtype: DType::F32,
        scale_factor: 65536.0,
    })?;
    let a = backend.randn(&[8, 8], DType::F32)?;
    assert_eq!(a.matmul(&a)?.dtype(), DType::F32);
    Ok(())
}

#[test]
fn products_conv_and_attention_run_in_16_bits_and_return_f32() {
    let reference = Backend::reference().unwrap();
    for b in backends() {
        let kind = b.backend_type();
        for dtype in [DType::F16, DType::BF16] {
            let b = b.clone().enable_mixed_precision(config(dtype)).unwrap();
            let data = |n: usize, seed: usize| -> Vec<f32> {
                (0..n)
                    .map(|i| (((i * 7919 + seed) % 1000) as f32 / 500.0) - 1.0)
                    .collect()
            };
            let cases: Vec<(&str, Case<'_>)> = vec![
                (
                    "matmul",
                    Box::new(|be: &Backend| {
                        let a = be.from_slice(&data(37 * 29, 1), &[37, 29]).unwrap();
                        let w = be.from_slice(&data(29 * 11, 2), &[29, 11]).unwrap();
                        a.matmul(&w).unwrap()
                    }),
                ),
                (
                    "gemm",
                    Box::new(|be: &Backend| {
                        let a = be.from_slice(&data(37 * 29, 8), &[37, 29]).unwrap();
                        let w = be.from_slice(&data(11 * 29, 9), &[11, 29]).unwrap();
                        let bias = be.from_slice(&data(11, 10), &[11]).unwrap();
                        a.gemm(&w.t().unwrap(), 0.5, &bias, 2.0).unwrap()
                    }),
                ),
                (
                    "conv2d",
                    Box::new(|be: &Backend| {
                        let x = be
                            .from_slice(&data(2 * 3 * 9 * 9, 3), &[2, 3, 9, 9])
                            .unwrap();
                        let w = be
                            .from_slice(&data(4 * 3 * 3 * 3, 4), &[4, 3, 3, 3])
                            .unwrap();
                        be.conv2d(
                            &x,
                            &w,
                            ConvConfig {
                                padding: [1, 1],
                                ..ConvConfig::default()
                            },
                        )
                        .unwrap()
                    }),
                ),
                (
                    "attention",
                    Box::new(|be: &Backend| {
                        let q = be
                            .from_slice(&data(2 * 3 * 5 * 8, 5), &[2, 3, 5, 8])
                            .unwrap();
                        let k = be
                            .from_slice(&data(2 * 3 * 7 * 8, 6), &[2, 3, 7, 8])
                            .unwrap();
                        let v = be
                            .from_slice(&data(2 * 3 * 7 * 8, 7), &[2, 3, 7, 8])
                            .unwrap();
                        be.attention(&q, &k, &v, true).unwrap()
                    }),
                ),
            ];
            for (name, case) in &cases {
                let ours = case(&b);
                assert_eq!(ours.dtype(), DType::F32, "{kind} {dtype} {name}");
                let want = case(&reference).to_vec_f64().unwrap();
                let e = compare(&ours.to_vec_f64().unwrap(), &want).rel_error;
                // Within the 16-bit bound, and not f32's: the operands really were rounded.
                assert!(e <= 1e-2, "{kind} {dtype} {name}: relative error {e}");
                assert!(
                    e > 1e-6,
                    "{kind} {dtype} {name}: relative error {e} is f32's"
                );
            }
            // Other dtypes are left alone (f64 math is Unsupported on WebGPU), and switching off
            // restores f32.
            let x = b.from_slice(&[1.0f64, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
            match x.matmul(&x) {
                Ok(y) => assert_eq!(y.dtype(), DType::F64),
                Err(e) => assert!(
                    kind == BackendType::WebGpu && matches!(e, BackendError::Unsupported { .. }),
                    "{kind}: {e}"
                ),
            }
            b.disable_mixed_precision();
            assert_eq!(b.mixed_precision(), None);
        }
    }
}

#[test]
fn bad_mixed_precision_settings_are_refused() {
    let b = Backend::cpu().build().unwrap();
    for bad in [
        MixedPrecisionConfig {
            compute_dtype: DType::F32,
            ..config(DType::F16)
        },
        MixedPrecisionConfig {
            accum_dtype: DType::F16,
            ..config(DType::F16)
        },
        MixedPrecisionConfig {
            scale_factor: 0.0,
            ..config(DType::BF16)
        },
        MixedPrecisionConfig {
            scale_factor: f32::NAN,
            ..config(DType::BF16)
        },
    ] {
        let err = b.clone().enable_mixed_precision(bad).unwrap_err();
        assert!(matches!(err, BackendError::InvalidArgument { .. }), "{err}");
    }
    assert_eq!(b.mixed_precision(), None);
}

#[test]
fn the_loss_scaler_follows_grad_scaler() {
    for b in backends() {
        let kind = b.backend_type();
        let mut scaler = LossScaler::from_config(&config(DType::F16));
        scaler.growth_interval = 3;
        assert_eq!(scaler.get_scale(), 65536.0);
        let loss = b.from_slice(&[0.5f32], &[1]).unwrap();
        assert_eq!(
            scaler.scale(&loss).unwrap().to_vec::<f32>().unwrap(),
            vec![32768.0]
        );

        let mut params = vec![b.from_slice(&[1.0f32, -2.0, 3.0], &[3]).unwrap()];
        let mut state = AdamState::adam();
        let grads_of = |values: [f32; 3], scale: f64| {
            vec![b
                .from_slice(&values.map(|v| v * scale as f32), &[3])
                .unwrap()]
        };
        // Three clean steps: each runs; after the third, the scale doubles.
        for step in 1..=3 {
            let mut grads = grads_of([0.25, -0.5, 1.0], scaler.get_scale());
            let before = params[0].to_vec::<f32>().unwrap();
            assert!(scaler
                .fused_adam_step(&b, &mut params, &mut grads, &mut state, 1e-2, (0.9, 0.999))
                .unwrap());
            // The gradients were unscaled exactly (the scale is a power of two).
            assert_eq!(
                grads[0].to_vec::<f32>().unwrap(),
                vec![0.25, -0.5, 1.0],
                "{kind}"
            );
            assert_ne!(
                params[0].to_vec::<f32>().unwrap(),
                before,
                "{kind}: step {step} ran"
            );
            scaler.update().unwrap();
            let want = if step < 3 { 65536.0 } else { 131072.0 };
            assert_eq!(scaler.get_scale(), want, "{kind}: after step {step}");
        }
        assert_eq!(scaler.growth_tracker(), 0);
        // An inf, then a NaN: both steps are skipped (parameters untouched) and the scale halves.
        for (bad, want_scale) in [(f32::INFINITY, 65536.0), (f32::NAN, 32768.0)] {
            let mut grads = vec![b.from_slice(&[1.0f32, bad, 2.0], &[3]).unwrap()];
            let before = params[0].to_vec::<f32>().unwrap();
            assert!(!scaler
                .fused_adam_step(&b, &mut params, &mut grads, &mut state, 1e-2, (0.9, 0.999))
                .unwrap());
            assert_eq!(
                params[0].to_vec::<f32>().unwrap(),
                before,
                "{kind}: the step was skipped"
            );
            scaler.update().unwrap();
            assert_eq!(scaler.get_scale(), want_scale, "{kind}");
        }
        // A clean step restarts the growth count from zero.
        let mut grads = grads_of([0.1, 0.1, 0.1], scaler.get_scale());
        assert!(!scaler.unscale(&mut grads).unwrap());
        assert!(
            scaler.unscale(&mut grads).is_err(),
            "unscale twice in one step is refused"
        );
        scaler.update().unwrap();
        assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (32768.0, 1));
        assert!(
            scaler.update().is_err(),
            "update without an inf check is refused"
        );
    }
}

/// The fused unscale-and-check on every backend and float dtype it supports: bit for bit the
/// reference's outputs at power-of-two scales (within the dtype's bound at others), the flag raised by
/// an inf, a NaN or an overflow past the dtype's range and by nothing else, and in-place use.
#[test]
fn fused_unscale_and_check_matches_the_reference() {
    let reference = Backend::reference().unwrap();
    for b in backends() {
        let kind = b.backend_type();
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let run = |be: &Backend, values: &[Vec<f64>], inv: f64| {
                let grads: Vec<Tensor> = values
                    .iter()
                    .map(|v| be.from_f64(v, &[v.len()], dtype).unwrap())
                    .collect();
                be.unscale_and_check(&grads, inv)
            };
            let clean: Vec<Vec<f64>> = [1usize, 7, 1000, 65_537]
                .iter()
                .map(|&n| {
                    (0..n)
                        .map(|i| ((i * 7919 % 2001) as f64 - 1000.0) * 3.0)
                        .collect()
                })
                .collect();
            if matches!(run(&b, &clean, 0.5), Err(BackendError::Unsupported { .. })) {
                eprintln!("{kind}: {dtype} unscale unsupported");
                continue;
            }
            for inv in [1.0 / 65536.0, 1.0 / 3000.0] {
                let (got, found) = run(&b, &clean, inv).unwrap();
                let (want, want_found) = run(&reference, &clean, inv).unwrap();
                assert!(!found && !want_found, "{kind} {dtype}: nothing to flag");
                for (g, w) in got.iter().zip(&want) {
                    if inv == 1.0 / 65536.0 {
                        assert_eq!(
                            g.to_bytes().unwrap(),
                            w.to_bytes().unwrap(),
                            "{kind} {dtype}"
                        );
                    } else {
                        let cmp = compare(&g.to_vec_f64().unwrap(), &w.to_vec_f64().unwrap());
                        assert!(
                            cmp.within(validation::tolerance(dtype)),
                            "{kind} {dtype}: {cmp}"
                        );
                    }
                }
            }
            for (what, bad, inv) in [
                ("inf", f64::INFINITY, 0.5),
                ("nan", f64::NAN, 0.5),
                // 60 000 · 4 overflows f16 (and nothing else): a scale below 1 after backoffs.
                ("overflow", 60_000.0, 4.0),
            ] {
                let mut values = clean.clone();
                values[2][999] = bad;
                let (_, found) = run(&b, &values, inv).unwrap();
                let (_, want) = run(&reference, &values, inv).unwrap();
                assert_eq!(found, want, "{kind} {dtype} {what}");
                if what != "overflow" || dtype == DType::F16 {
                    assert!(found, "{kind} {dtype}: {what} flagged");
                }
            }
            // In place, through the low-level op.
            let x = b.from_f64(&clean[2], &[1000], dtype).unwrap();
            let flag = b.zeros(&[1], DType::F32).unwrap();
            let want = x.mul_scalar(0.25).unwrap().to_bytes().unwrap();
            b.compute()
                .unscale_and_check(&torsh_backend::compute::UnscaleDesc {
                    dtype,
                    input: x.data_ptr(),
                    output: x.data_ptr(),
                    len: 1000,
                    inv_scale: 0.25,
                    found_inf: flag.data_ptr(),
                })
                .unwrap();
            assert_eq!(x.to_bytes().unwrap(), want, "{kind} {dtype}: in place");
            assert_eq!(flag.item().unwrap(), 0.0);
        }
        // Bad scales are refused before anything runs.
        let g = b.ones(&[4], DType::F32).unwrap();
        for inv in [0.0, f64::INFINITY, f64::NAN] {
            assert!(
                matches!(
                    b.unscale_and_check(std::slice::from_ref(&g), inv),
                    Err(BackendError::InvalidArgument { .. })
                ),
                "{kind}: inv_scale {inv}"
            );
        }
    }
}
