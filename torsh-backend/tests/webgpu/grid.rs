//! Launches of more workgroups than one grid dimension holds, and limits of the kernels.

use super::*;

/// A tensor-level backend whose kernels launch at most `limit` workgroups along a grid dimension
/// (`max_workgroups_per_dimension`), so that small tensors take the paths of larger grids; `None`
/// when there is no adapter.
fn with_grid(limit: u32) -> Option<Backend> {
    raw()?;
    let config = WebGpuBackendConfig {
        max_workgroups_per_dimension: Some(limit),
        ..Default::default()
    };
    Some(Backend::from_compute(Box::new(WebGpuBackend::new(config))).unwrap())
}

#[test]
fn launches_of_more_workgroups_than_a_grid_dimension_fold_or_run_in_blocks() {
    // With 64 workgroups a dimension: GEMMs and a GEMV of more 64-row or 64-column tiles than
    // that (5000 rows: 79 tiles) run as blocks of C; a batched GEMM of 70 products in two launches;
    // convolutions of more (group, pixel tile) pairs than that (one image of 64 × 80 pixels: 80
    // tiles of 64; a depthwise one of 33 channels of 40 tiles each: 1320 pairs) fold them over two
    // dimensions. Against the reference in f32, f16 and bf16.
    let Some(b) = with_grid(webgpu::MIN_WORKGROUPS_PER_DIMENSION) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let conv = |groups| torsh_backend::ConvConfig {
        padding: [1, 1],
        groups,
        ..Default::default()
    };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let run = |be: &Backend| {
            let tensor = |shape: &[usize], phase: f32| {
                dtype_tensor(be, &wave(shape.iter().product(), phase), shape, dtype)
            };
            let tall = tensor(&[5000, 5], 0.1);
            let small = tensor(&[5, 7], 0.2);
            let y = tensor(&[5000], 0.3);
            let x = tensor(&[5], 0.4);
            [
                tall.matmul(&small).unwrap(),
                small.t().unwrap().matmul(&tall.t().unwrap()).unwrap(),
                tensor(&[70, 3, 5], 0.5)
                    .matmul(&tensor(&[70, 5, 2], 0.6))
                    .unwrap(),
                tall.gemv(&x, 1.5, &y, 0.5).unwrap(),
                be.conv2d(
                    &tensor(&[1, 2, 64, 80], 0.7),
                    &tensor(&[3, 2, 3, 3], 0.8),
                    conv(1),
                )
                .unwrap(),
                be.conv2d(
                    &tensor(&[1, 33, 40, 64], 0.9),
                    &tensor(&[33, 1, 3, 3], 1.0),
                    conv(33),
                )
                .unwrap(),
            ]
        };
        let names = ["tall", "wide", "batched", "gemv", "conv", "depthwise"];
        for ((name, got), want) in names.iter().zip(run(&b)).zip(run(&reference)) {
            check_dtype(name, dtype, &got, &want);
        }
    }
    let mut low = WebGpuBackend::new(WebGpuBackendConfig {
        max_workgroups_per_dimension: Some(webgpu::MIN_WORKGROUPS_PER_DIMENSION - 1),
        ..Default::default()
    });
    assert!(matches!(
        low.init(),
        Err(BackendError::InvalidArgument { .. })
    ));
}

#[test]
fn every_kernel_folds_a_grid_past_the_workgroup_limit() {
    // With 64 workgroups a dimension, ops whose launches need more: elementwise ops and casts over
    // 70 000 elements (274 workgroups of 256), reductions, softmax and layer norm over 3000 rows,
    // batch norm of 100 channels, pooling of 70 planes, attention over 70 heads, Adam over 70 000
    // parameters and a random fill; against the reference. (The rows kernels fold into two
    // dimensions, up to the limit squared: 4096 rows here, past any tensor at 65 535.)
    let Some(b) = with_grid(webgpu::MIN_WORKGROUPS_PER_DIMENSION) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let run = |be: &Backend| {
        let tensor = |shape: &[usize], phase: f32| {
            be.from_slice(&wave(shape.iter().product(), phase), shape)
                .unwrap()
        };
        let flat = tensor(&[70_000], 0.1);
        let rows = tensor(&[3000, 14], 0.2);
        let images = tensor(&[2, 100, 5, 7], 0.3);
        let stats = |phase| tensor(&[100], phase).abs().unwrap();
        let planes = tensor(&[7, 10, 8, 8], 0.4);
        let heads = tensor(&[2, 35, 9, 8], 0.5);
        let pool = torsh_backend::Pool2dConfig {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
            count_include_pad: true,
        };
        let mut params = vec![tensor(&[70_000], 0.6)];
        let grads = [tensor(&[70_000], 0.7)];
        let mut adam = torsh_backend::AdamState::adamw(0.01);
        be.fused_adam_step(&mut params, &grads, &mut adam, 1e-3, (0.9, 0.999))
            .unwrap();
        be.manual_seed(3);
        vec![
            flat.exp().unwrap(),
            be.binary(torsh_backend::BinaryOp::Mul, &flat, &flat)
                .unwrap(),
            flat.cast(DType::BF16).unwrap().cast(DType::F32).unwrap(),
            rows.sum(1, false).unwrap(),
            rows.argmax(1, false).unwrap(),
            rows.sum(0, false).unwrap(),
            rows.softmax(1).unwrap(),
            rows.layer_norm(&[14], None, None, 1e-5).unwrap(),
            images
                .batch_norm(torsh_backend::BatchNormConfig {
                    weight: None,
                    bias: None,
                    running_mean: Some(&stats(0.8)),
                    running_var: Some(&stats(0.9)),
                    training: false,
                    momentum: None,
                    eps: None,
                })
                .unwrap(),
            be.max_pool2d(&planes, pool).unwrap(),
            planes.max_pool2d_with_indices(pool).unwrap().0,
            be.avg_pool2d_backward(&planes, &[7, 10, 16, 16], pool)
                .unwrap(),
            be.attention(&heads, &heads, &heads, true).unwrap(),
            params.pop().unwrap(),
            be.randn(&[70_000], DType::F32).unwrap(),
        ]
    };
    for (i, (got, want)) in run(&b).iter().zip(run(&reference)).enumerate() {
        check_dtype(&format!("result {i}"), DType::F32, got, &want);
    }
}

#[test]
fn a_limit_of_the_kernels_is_feature_unavailable_not_a_bad_argument() {
    // Attention with a head dim above the row kernel's 1024: valid on other backends, so the
    // error names a missing feature of this one.
    let Some(b) = backend() else {
        return;
    };
    let q = b.randn(&[1, 1, 2, 1025], DType::F32).unwrap();
    let err = b.attention(&q, &q, &q, false).unwrap_err();
    assert!(
        matches!(err, BackendError::FeatureUnavailable { .. }),
        "{err:?}"
    );
}
