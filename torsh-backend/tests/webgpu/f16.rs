//! Native f16 kernels (`SHADER_F16`) against the staged path, bit for bit.

use super::*;

/// f16 values covering the rounding cases: random normals across f16's range, both zeros, the
/// largest finite, the smallest normal and subnormal, infinities, NaN, and values whose results
/// overflow, underflow or sit near rounding ties.
fn f16_inputs() -> Vec<f32> {
    let mut xs: Vec<f32> = (0..600)
        .map(|i| {
            let t = i as f32 * 0.618_034;
            (t.sin() * 4.0) * 2f32.powi(i % 9 - 4)
        })
        .collect();
    xs.extend([
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        -65504.0,
        6.103_515_6e-5,
        5.960_464_5e-8,
        -5.960_464_5e-8,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        11.5,
        -17.0,
        250.0,
        1.000_488_3,
        2049.0,
        3.140_625,
    ]);
    xs
}

/// Whether the best adapter has `shader-f16` (saying so when it has not).
pub(super) fn has_shader_f16() -> bool {
    let device = webgpu::block_on(webgpu::WebGpuDevice::from_best_adapter(0)).unwrap();
    let has = device.features().contains(wgpu::Features::SHADER_F16);
    if !has {
        eprintln!("webgpu: the adapter has no shader-f16; f16 math is staged (tested elsewhere)");
    }
    has
}

/// Two backends on the best adapter: one with every optional feature, so f16 math runs natively,
/// and one without `shader-f16`, so it is staged through f32 copies.
pub(super) fn native_and_staged_f16() -> (Backend, Backend) {
    let all = WebGpuBackendConfig::default().optional_features;
    let make = |features: wgpu::Features| {
        Backend::from_compute(Box::new(WebGpuBackend::new(WebGpuBackendConfig {
            optional_features: features,
            ..Default::default()
        })))
        .unwrap()
    };
    (make(all), make(all - wgpu::Features::SHADER_F16))
}

/// The f16 bits of a tensor, every NaN as one pattern (payloads are the device's).
fn f16_bits(t: &torsh_backend::Tensor) -> Vec<u16> {
    t.to_vec::<half::f16>()
        .unwrap()
        .iter()
        .map(|h| if h.is_nan() { u16::MAX } else { h.to_bits() })
        .collect()
}

#[test]
fn f16_elementwise_and_products_run_natively_and_match_the_staged_path_bit_for_bit() {
    let Some(probe) = raw() else { return };
    if !has_shader_f16() {
        return;
    }
    // Native: an f16 unary op allocates nothing on the device (the staged path makes f32 copies).
    let n = 64;
    let x = probe.alloc(n * 2).unwrap();
    let y = probe.alloc(n * 2).unwrap();
    probe
        .copy_htod(x, bytemuck::cast_slice(&vec![half::f16::ONE; n]))
        .unwrap();
    let before = probe.pool_stats().unwrap();
    probe
        .unary(&UnaryDesc {
            op: UnaryOp::Exp,
            dtype: DType::F16,
            input: StridedBuf::contiguous(x, &[n]),
            output: y,
        })
        .unwrap();
    let after = probe.pool_stats().unwrap();
    assert_eq!(
        (after.hits, after.misses),
        (before.hits, before.misses),
        "an f16 op with shader-f16 must not stage"
    );

    let (native, staged) = native_and_staged_f16();
    let xs = f16_inputs();
    let ys: Vec<f32> = xs.iter().rev().map(|v| v * 0.75 + 0.5).collect();
    let inputs = |b: &Backend| {
        let x = b
            .from_slice(&xs, &[xs.len()])
            .unwrap()
            .cast(DType::F16)
            .unwrap();
        let y = b
            .from_slice(&ys, &[ys.len()])
            .unwrap()
            .cast(DType::F16)
            .unwrap();
        (x, y)
    };
    let (xn, yn) = inputs(&native);
    let (xs16, ys16) = inputs(&staged);
    for &op in UnaryOp::ALL {
        let got = f16_bits(&native.unary(op, &xn).unwrap());
        let want = f16_bits(&staged.unary(op, &xs16).unwrap());
        assert_eq!(got, want, "{op:?}");
    }
    for &op in torsh_backend::BinaryOp::ALL {
        let got = f16_bits(&native.binary(op, &xn, &yn).unwrap());
        let want = f16_bits(&staged.binary(op, &xs16, &ys16).unwrap());
        assert_eq!(got, want, "{op:?}");
        // A view at an odd element offset (not 4-byte aligned) against one element broadcast.
        let pair = |x: &torsh_backend::Tensor, y: &torsh_backend::Tensor| {
            let at_odd = x.narrow(0, 1, 7).unwrap();
            let one = y.narrow(0, 3, 1).unwrap().broadcast_to(&[7]).unwrap();
            (at_odd, one)
        };
        let (a, b) = pair(&xn, &yn);
        let got = f16_bits(&native.binary(op, &a, &b).unwrap());
        let (a, b) = pair(&xs16, &ys16);
        let want = f16_bits(&staged.binary(op, &a, &b).unwrap());
        assert_eq!(got, want, "{op:?} at an odd offset, broadcast");
        // A scalar right operand, at an odd offset.
        let got = f16_bits(
            &native
                .binary_scalar(op, &xn.narrow(0, 1, 7).unwrap(), 1.3)
                .unwrap(),
        );
        let want = f16_bits(
            &staged
                .binary_scalar(op, &xs16.narrow(0, 1, 7).unwrap(), 1.3)
                .unwrap(),
        );
        assert_eq!(got, want, "{op:?} with a scalar");
    }
    // Products: f32 accumulation on f16 storage, one rounding, as the staged path (GEMM with a
    // transposed operand and beta, batched GEMM, GEMV with beta, conv2d padded and strided with bias,
    // attention on the tiled and the row kernel), and pooling, at sizes off every tile.
    let products = |b: &Backend| -> Vec<torsh_backend::Tensor> {
        b.manual_seed(17);
        let h = |shape: &[usize]| {
            b.randn(shape, DType::F32)
                .unwrap()
                .cast(DType::F16)
                .unwrap()
        };
        let (a, w, c) = (h(&[37, 29]), h(&[13, 29]), h(&[37, 13]));
        let (batch_a, batch_b) = (h(&[3, 9, 70]), h(&[3, 70, 5]));
        let (v, y) = (h(&[29]), h(&[37]));
        let (image, kernel, bias) = (h(&[2, 5, 11, 9]), h(&[7, 5, 3, 3]), h(&[7]));
        let conv = |padding: usize, stride: usize| {
            b.conv2d_with_bias(
                &image,
                &kernel,
                Some(&bias),
                torsh_backend::ConvConfig {
                    stride: [stride, stride],
                    padding: [padding, padding],
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let pooling = |count_include_pad: bool| torsh_backend::Pool2dConfig {
            kernel: [3, 2],
            stride: [2, 1],
            padding: [1, 1],
            count_include_pad,
        };
        let attention = |dim: usize, causal: bool| {
            let (q, k, v) = (
                h(&[1, 2, 19, dim]),
                h(&[1, 2, 23, dim]),
                h(&[1, 2, 23, dim]),
            );
            b.attention(&q, &k, &v, causal).unwrap()
        };
        vec![
            a.matmul(&w.t().unwrap()).unwrap(),
            a.gemm(&w.t().unwrap(), 0.5, &c, -1.25).unwrap(),
            batch_a.matmul(&batch_b).unwrap(),
            a.gemv(&v, 2.0, &y, 0.75).unwrap(),
            conv(1, 1),
            conv(0, 2),
            attention(40, true),
            attention(136, false),
            b.max_pool2d(&image, pooling(true)).unwrap(),
            b.avg_pool2d(&image, pooling(true)).unwrap(),
            b.avg_pool2d(&image, pooling(false)).unwrap(),
            image.max_pool2d_with_indices(pooling(true)).unwrap().0,
            pool_grad(b, &image, true),
            pool_grad(b, &image, false),
        ]
    };
    for (i, (got, want)) in products(&native).iter().zip(products(&staged)).enumerate() {
        assert_eq!(f16_bits(got), f16_bits(&want), "product {i}");
    }
}

/// The max-pool gradient (from the forward's positions) or the average-pool gradient (counting
/// padding) of `image`, with the pooled output as the gradient, for the products compared above.
fn pool_grad(b: &Backend, image: &torsh_backend::Tensor, max: bool) -> torsh_backend::Tensor {
    let config = torsh_backend::Pool2dConfig {
        kernel: [3, 2],
        stride: [2, 1],
        padding: [1, 1],
        count_include_pad: true,
    };
    let (y, indices) = image.max_pool2d_with_indices(config).unwrap();
    if max {
        b.max_pool2d_backward(&y, &indices, image.shape(), config)
            .unwrap()
    } else {
        b.avg_pool2d_backward(&y, image.shape(), config).unwrap()
    }
}

/// The bits of an f16 tensor, or the values of an i64 one, for bit-for-bit comparison.
fn exact_bits(t: &torsh_backend::Tensor) -> Vec<i64> {
    match t.dtype() {
        DType::I64 => t.to_vec::<i64>().unwrap(),
        _ => f16_bits(t).into_iter().map(i64::from).collect(),
    }
}

#[test]
fn f16_rows_norms_optimizer_and_random_fills_run_natively_and_match_the_staged_path_bit_for_bit() {
    if raw().is_none() {
        return;
    }
    if !has_shader_f16() {
        return;
    }
    // Device allocations so far: a native op allocates its outputs and nothing else, where the
    // staged path also makes f32 copies of its operands.
    let allocations = |b: &Backend| {
        let raw = b.compute().as_any().unwrap();
        let stats = raw.downcast_ref::<WebGpuBackend>().unwrap().pool_stats();
        let stats = stats.unwrap();
        stats.hits + stats.misses
    };
    // Runs every op, returning the results and, per op, the allocations it made beyond `outputs`.
    let run = |b: &Backend| -> (Vec<torsh_backend::Tensor>, Vec<u64>) {
        b.manual_seed(29);
        let h = |shape: &[usize], scale: f32| {
            let x = b.randn(shape, DType::F32).unwrap();
            let s = b.full(&[1], f64::from(scale), DType::F32).unwrap();
            b.binary(torsh_backend::BinaryOp::Mul, &x, &s)
                .unwrap()
                .cast(DType::F16)
                .unwrap()
        };
        // Rows holding the rounding cases, infinities and a NaN, and rows of plain normals.
        let special = b
            .from_slice(&f16_inputs(), &[6, 103])
            .unwrap()
            .cast(DType::F16)
            .unwrap();
        let plain = h(&[7, 45], 3.0);
        let mut extra = Vec::new();
        let mut results = Vec::new();
        let mut op = |results: &mut Vec<torsh_backend::Tensor>,
                      outputs: u64,
                      f: &dyn Fn() -> Vec<torsh_backend::Tensor>| {
            let before = allocations(b);
            let got = f();
            extra.push(allocations(b) - before - outputs);
            results.extend(got);
        };
        use torsh_backend::ReduceOp::*;
        for x in [&special, &plain] {
            let transposed = x.t().unwrap();
            for reduce in [Sum, Mean, Max, Min, Var { correction: 1 }, ArgMax, ArgMin] {
                for (input, axis) in [(x, 1), (x, 0), (&transposed, 1)] {
                    op(&mut results, 1, &|| {
                        vec![b.reduce(reduce, input, axis, false).unwrap()]
                    });
                }
            }
            for axis in [1, 0] {
                op(&mut results, 1, &|| vec![b.softmax(x, axis).unwrap()]);
                op(&mut results, 1, &|| vec![b.log_softmax(x, axis).unwrap()]);
            }
            let cols = x.shape()[1];
            let (w, bias) = (h(&[cols], 1.5), h(&[cols], 0.5));
            op(&mut results, 1, &|| {
                vec![b
                    .layer_norm(x, &[cols], Some(&w), Some(&bias), 1e-5)
                    .unwrap()]
            });
            op(&mut results, 1, &|| {
                vec![b.layer_norm(x, &[cols], None, None, 1e-3).unwrap()]
            });
        }
        // Batch norm, training (the running statistics updated in f16) and inference, with an
        // affine transform; 5 channels of 3 images of 3 x 7.
        let image = h(&[3, 5, 3, 7], 2.0);
        let (w, bias) = (h(&[5], 1.0), h(&[5], 1.0));
        let (mean, var) = (h(&[5], 0.5), b.full(&[5], 1.5, DType::F32).unwrap());
        let var = var.cast(DType::F16).unwrap();
        for training in [true, false] {
            op(&mut results, 1, &|| {
                let config = torsh_backend::BatchNormConfig {
                    weight: Some(&w),
                    bias: Some(&bias),
                    running_mean: Some(&mean),
                    running_var: Some(&var),
                    training,
                    momentum: Some(0.3),
                    eps: None,
                };
                vec![b.batch_norm_with(&image, config).unwrap()]
            });
        }
        results.extend([mean, var]);
        // Random fills, formed in f32 and rounded once.
        op(&mut results, 1, &|| {
            vec![b.randn(&[300], DType::F16).unwrap()]
        });
        op(&mut results, 1, &|| {
            vec![b.rand(&[7, 3], DType::F16).unwrap()]
        });
        // The loss scaler's fused unscale (one flag, one output per gradient): a clean set, and one
        // holding the special rows (infinities and a NaN) that sets the flag.
        let grads = [h(&[300], 100.0), h(&[7, 3], 100.0)];
        for (set, inf) in [(&grads[..], false), (&[special.clone()][..], true)] {
            op(&mut results, 1 + set.len() as u64, &|| {
                let (out, found) = b.unscale_and_check(set, 1.0 / 1024.0).unwrap();
                assert_eq!(found, inf);
                out
            });
        }
        // Adam with L2 decay and AdamW, three steps each over more than one workgroup; the first
        // step allocates the moments, later ones nothing.
        for mut state in [
            torsh_backend::AdamState::adam().with_weight_decay(0.01),
            torsh_backend::AdamState::adamw(0.1),
        ] {
            let mut params = vec![h(&[300], 1.0), h(&[7, 3], 1.0)];
            let grads = [h(&[300], 0.1), h(&[7, 3], 0.1)];
            b.fused_adam_step(&mut params, &grads, &mut state, 1e-2, (0.9, 0.999))
                .unwrap();
            for _ in 0..2 {
                let before = allocations(b);
                b.fused_adam_step(&mut params, &grads, &mut state, 1e-2, (0.9, 0.999))
                    .unwrap();
                extra.push(allocations(b) - before);
            }
            results.extend(params);
            results.extend(state.exp_avg().iter().cloned());
            results.extend(state.exp_avg_sq().iter().cloned());
        }
        (results, extra)
    };
    let (native, staged) = native_and_staged_f16();
    let (got, extra) = run(&native);
    let (want, staged_extra) = run(&staged);
    assert!(
        extra.iter().all(|&e| e == 0),
        "native f16 ops allocated beyond their outputs: {extra:?}"
    );
    assert!(
        staged_extra.iter().all(|&e| e > 0),
        "the staged path makes f32 copies: {staged_extra:?}"
    );
    assert_eq!(got.len(), want.len());
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(got.dtype(), want.dtype(), "result {i}");
        assert_eq!(exact_bits(got), exact_bits(want), "result {i}");
    }
}
