//! The loop budget: software Vulkan (llvmpipe / lavapipe) ends every loop of a shader invocation
//! once all its loops together have run 65 535 iterations, silently. The backend never launches a
//! kernel past its budget (`WebGpuBackendConfig::max_loop_iterations`): it cuts the work instead.
//!
//! The first tests run sizes past the real limit with the default budget, against exact answers or
//! the reference; the others lower the budget so that every kernel's cut runs on small tensors
//! (and a cut left out fails: the launch is refused, `FeatureUnavailable`).

use torsh_backend::compute::ComputeBackend;
use torsh_backend::webgpu::{self, WebGpuBackend, WebGpuBackendConfig};
use torsh_backend::{Backend, BackendError, CrossEntropyConfig, DType, Reduction, Tensor};

use super::{backend, check_dtype, values};

/// Elements per row past the real limit with 8 threads a row: 65 535 × 8 = 524 280.
const LONG: usize = 700_000;

/// Asserts every value of `t` is `want` within `tol` (relative).
fn all_near(name: &str, t: &Tensor, want: f64, tol: f64) {
    for (i, v) in values(t).iter().enumerate() {
        assert!(
            (v - want).abs() <= tol * want.abs().max(1.0),
            "{name}: element {i} is {v}, not {want}"
        );
    }
}

#[test]
fn rows_past_the_real_loop_limit_reduce_and_normalise_exactly() {
    let Some(b) = backend() else { return };
    for n in [524_257, LONG] {
        let ones = b.ones(&[n], DType::F32).unwrap();
        all_near("sum_all", &ones.sum_all().unwrap(), n as f64, 0.0);
        all_near("mean_all", &ones.mean_all().unwrap(), 1.0, 1e-6);
        let arange = b.arange(0.0, n as f64, 1.0, DType::F32).unwrap();
        let last = (n - 1) as f64;
        all_near("max", &arange.max(0, false).unwrap(), last, 0.0);
        all_near("argmax", &arange.argmax(0, false).unwrap(), last, 0.0);
        all_near("argmin", &arange.argmin(0, false).unwrap(), 0.0, 0.0);
        all_near("var of ones", &ones.var(0, 1, false).unwrap(), 0.0, 0.0);
        let row = b.ones(&[1, n], DType::F32).unwrap();
        all_near("softmax", &row.softmax(-1).unwrap(), 1.0 / n as f64, 1e-5);
        let log_n = -(n as f64).ln();
        all_near("log_softmax", &row.log_softmax(-1).unwrap(), log_n, 1e-6);
        let norm = row.layer_norm(&[n], None, None, 1e-5).unwrap();
        all_near("layer_norm", &norm, 0.0, 0.0);
        if n < LONG {
            // A product's inner dim is past the limit either way (a 1 × 1 product costs a whole
            // 64 × 64 tile a step on lavapipe: once is enough).
            continue;
        }
        let column = b.ones(&[n, 1], DType::F32).unwrap();
        all_near("matmul", &row.matmul(&column).unwrap(), n as f64, 0.0);
        let x = b.ones(&[n], DType::F32).unwrap();
        let y = b.zeros(&[1], DType::F32).unwrap();
        all_near("gemv", &row.gemv(&x, 1.0, &y, 0.0).unwrap(), n as f64, 0.0);
    }
}

/// A wave of `shape` (values in about `[-2, 2]`) on `be`, in `dtype`.
fn wave_tensor(be: &Backend, shape: &[usize], phase: f32, dtype: DType) -> Tensor {
    let host = super::wave(shape.iter().product(), phase);
    super::dtype_tensor(be, &host, shape, dtype)
}

#[test]
fn other_kernels_past_the_real_loop_limit_match_the_reference() {
    // Each past 65 535 loop iterations of one invocation as launched whole: a convolution over
    // 72 000 (input channel, tap) pairs, attention over 40 000 keys (row kernel, head dim 136) and
    // 100 000 keys (tiled kernel), pooling a 300 × 300 window, batch norm of a 700 000-value
    // channel in training and inference.
    let Some(b) = backend() else { return };
    let reference = Backend::reference().unwrap();
    let f32 = DType::F32;
    let run = |be: &Backend| -> Vec<(&str, Tensor)> {
        let conv_in = be.ones(&[1, 8000, 3, 3], f32).unwrap();
        let conv_w = be.ones(&[1, 8000, 3, 3], f32).unwrap();
        let q_row = wave_tensor(be, &[1, 1, 2, 136], 0.1, f32);
        let kv_row = wave_tensor(be, &[1, 1, 40_000, 136], 0.2, f32);
        let q_tiled = wave_tensor(be, &[1, 1, 3, 64], 0.3, f32);
        let kv_tiled = wave_tensor(be, &[1, 1, 100_000, 64], 0.4, f32);
        let plane = wave_tensor(be, &[1, 2, 300, 300], 0.5, f32);
        // Rising values: the maximum is the window's last tap.
        let rising = be.arange(0.0, 180_000.0, 1.0, f32).unwrap();
        let rising = rising.reshape(&[1, 2, 300, 300]).unwrap();
        let window = torsh_backend::Pool2dConfig::new([300, 300]);
        let channel = wave_tensor(be, &[1, 1, LONG], 0.6, f32);
        let stats = |v: f64| be.full(&[1], v, f32).unwrap();
        let (mean, var) = (stats(0.25), stats(2.0));
        let train = be.batch_norm(&channel, &mean, &var, true).unwrap();
        let infer = be.batch_norm(&channel, &mean, &var, false).unwrap();
        vec![
            (
                "conv2d",
                be.conv2d(&conv_in, &conv_w, Default::default()).unwrap(),
            ),
            (
                "attention (rows)",
                be.attention(&q_row, &kv_row, &kv_row, false).unwrap(),
            ),
            (
                "attention (tiled)",
                be.attention(&q_tiled, &kv_tiled, &kv_tiled, false).unwrap(),
            ),
            ("max_pool2d", be.max_pool2d(&rising, window).unwrap()),
            ("avg_pool2d", be.avg_pool2d(&plane, window).unwrap()),
            ("batch_norm (training)", train),
            ("running mean", mean),
            ("running var", var),
            ("batch_norm (inference)", infer),
        ]
    };
    for ((name, got), (_, want)) in run(&b).into_iter().zip(run(&reference)) {
        check_dtype(name, DType::F32, &got, &want);
    }
}

/// A tensor-level backend whose launches run at most the smallest loop budget
/// (`max_loop_iterations`) with 8 threads a row on any adapter, so that small tensors take the cuts
/// of tensors past the real limit; `None` when there is no adapter.
fn low_budget() -> Option<Backend> {
    super::raw()?;
    let config = WebGpuBackendConfig {
        max_loop_iterations: Some(webgpu::MIN_LOOP_ITERATIONS),
        row_workgroup_size: Some(8),
        ..Default::default()
    };
    Some(Backend::from_compute(Box::new(WebGpuBackend::new(config))).unwrap())
}

/// Every `(name, result)` of `run` on `b` against the reference, in each of `dtypes`.
fn against_reference(
    b: &Backend,
    dtypes: &[DType],
    run: impl Fn(&Backend, DType) -> Vec<(&'static str, Tensor)>,
) {
    let reference = Backend::reference().unwrap();
    for &dtype in dtypes {
        for ((name, got), (_, want)) in run(b, dtype).into_iter().zip(run(&reference, dtype)) {
            check_dtype(name, dtype, &got, &want);
        }
    }
}

const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

#[test]
fn reductions_of_rows_past_the_loop_budget_combine_blocks_of_them() {
    // A budget of 4096 passes with 8 threads: sums of up to 32 616 elements a row in one launch,
    // variances 16 264. Rows of 40 009 (contiguous, and strided: reducing the leading dim) in
    // blocks, every op.
    let Some(b) = low_budget() else { return };
    against_reference(&b, &ALL, |be, dtype| {
        let long = wave_tensor(be, &[3, 40_009], 0.1, dtype);
        let tall = wave_tensor(be, &[40_009, 3], 0.2, dtype);
        let index = |t: Tensor| t.cast(DType::F64).unwrap();
        vec![
            ("sum", long.sum(1, false).unwrap()),
            ("mean", long.mean(1, false).unwrap()),
            ("var", long.var(1, 1, false).unwrap()),
            ("max", long.max(1, false).unwrap()),
            ("min", long.min(1, false).unwrap()),
            ("argmax", index(long.argmax(1, false).unwrap())),
            ("argmin", index(long.argmin(1, false).unwrap())),
            ("sum of columns", tall.sum(0, false).unwrap()),
            ("var of columns", tall.var(0, 0, false).unwrap()),
            ("argmax of columns", index(tall.argmax(0, false).unwrap())),
        ]
    });
}

#[test]
fn normalisations_of_rows_past_the_loop_budget_are_composed() {
    // Softmax, log-softmax and layer norm of rows of 12 011 (one launch takes 10 864), inner > 1
    // too, and softmax's gradients and cross-entropy of rows of 20 011; batch norm of channels of 30 021 and 13 001 values, in chunks within the budget
    // (training in three launches), with running statistics.
    let Some(b) = low_budget() else { return };
    against_reference(&b, &ALL, |be, dtype| {
        let rows = wave_tensor(be, &[2, 12_011], 0.3, dtype);
        let inner = wave_tensor(be, &[2, 12_011, 3], 0.4, dtype);
        let w = wave_tensor(be, &[12_011], 0.5, dtype);
        let bias = wave_tensor(be, &[12_011], 0.6, dtype);
        let images = wave_tensor(be, &[3, 2, 10_007], 0.7, dtype);
        let one = wave_tensor(be, &[1, 2, 13_001], 0.8, dtype);
        let stat = |v: f64| be.full(&[2], v, dtype).unwrap();
        let (mean, var) = (stat(0.1), stat(1.5));
        let trained = be.batch_norm(&images, &mean, &var, true).unwrap();
        let (mean1, var1) = (stat(-0.2), stat(0.5));
        let trained1 = be.batch_norm(&one, &mean1, &var1, true).unwrap();
        let inferred = be.batch_norm(&images, &mean, &var, false).unwrap();
        // Gradients of rows of 20 011, past what one launch takes.
        let long = wave_tensor(be, &[2, 20_011], 0.9, dtype);
        let long_inner = wave_tensor(be, &[2, 20_011, 3], 1.0, dtype);
        let grad = wave_tensor(be, &[2, 20_011], 1.1, dtype);
        let grad_inner = wave_tensor(be, &[2, 20_011, 3], 1.2, dtype);
        let y = long.softmax(-1).unwrap();
        let log_y = long.log_softmax(-1).unwrap();
        let y_inner = long_inner.softmax(1).unwrap();
        // Cross-entropy of rows of 20 011 classes: composed past the budget.
        let target = be.from_slice(&[5i64, 20_000], &[2]).unwrap();
        let config = CrossEntropyConfig {
            reduction: Reduction::None,
            label_smoothing: 0.1,
            ..Default::default()
        };
        let per_sample = be
            .from_slice(&[0.5f32, -1.5], &[2])
            .unwrap()
            .cast(dtype)
            .unwrap();
        vec![
            (
                "cross_entropy",
                long.cross_entropy(&target, config).unwrap(),
            ),
            (
                "cross_entropy_backward",
                be.cross_entropy_backward(&per_sample, &long, &target, config)
                    .unwrap(),
            ),
            (
                "softmax_backward",
                be.softmax_backward(&grad, &y, -1).unwrap(),
            ),
            (
                "log_softmax_backward",
                be.log_softmax_backward(&grad, &log_y, -1).unwrap(),
            ),
            (
                "softmax_backward, inner > 1",
                be.softmax_backward(&grad_inner, &y_inner, 1).unwrap(),
            ),
            ("softmax", rows.softmax(-1).unwrap()),
            ("log_softmax", rows.log_softmax(-1).unwrap()),
            ("softmax, inner > 1", inner.softmax(1).unwrap()),
            (
                "layer_norm",
                rows.layer_norm(&[12_011], Some(&w), Some(&bias), 1e-5)
                    .unwrap(),
            ),
            ("batch_norm (training)", trained),
            ("running mean", mean),
            ("running var", var),
            ("batch_norm (training, two chunks)", trained1),
            ("running mean (two chunks)", mean1),
            ("running var (two chunks)", var1),
            ("batch_norm (inference)", inferred),
        ]
    });
}

#[test]
fn products_past_the_loop_budget_cut_their_inner_dim() {
    // One launch takes an inner dim of 1232: GEMMs (both transposes), a GEMV and batched GEMMs
    // over 2003, accumulating the ranges (in f32 for 16-bit products).
    let Some(b) = low_budget() else { return };
    against_reference(&b, &ALL, |be, dtype| {
        let a = wave_tensor(be, &[5, 2003], 0.1, dtype);
        let bt = wave_tensor(be, &[7, 2003], 0.2, dtype);
        let x = wave_tensor(be, &[2003], 0.3, dtype);
        let y = wave_tensor(be, &[7], 0.4, dtype);
        let c = wave_tensor(be, &[5, 7], 0.5, dtype);
        let batched_a = wave_tensor(be, &[3, 5, 2003], 0.6, dtype);
        let batched_b = wave_tensor(be, &[3, 2003, 4], 0.7, dtype);
        let b2 = bt.t().unwrap();
        vec![
            ("matmul", a.matmul(&b2).unwrap()),
            (
                "matmul, contiguous B",
                a.matmul(&b2.contiguous().unwrap()).unwrap(),
            ),
            ("gemm with beta", a.gemm(&b2, 1.5, &c, 0.5).unwrap()),
            ("gemv", bt.gemv(&x, 2.0, &y, 0.25).unwrap()),
            (
                "gemv, transposed",
                a.t()
                    .unwrap()
                    .contiguous()
                    .unwrap()
                    .t()
                    .unwrap()
                    .gemv(&x, 1.0, &c.sum(1, false).unwrap(), 1.0)
                    .unwrap(),
            ),
            ("batched", batched_a.matmul(&batched_b).unwrap()),
        ]
    });
}

#[test]
fn convolutions_past_the_loop_budget_accumulate_blocks_of_input_channels() {
    // One launch takes 1824 (input channel, tap) pairs: 211 channels of 3 × 3 taps (1899), padded,
    // with a bias, two images; and a grouped one of 2 × 211 channels.
    let Some(b) = low_budget() else { return };
    against_reference(&b, &ALL, |be, dtype| {
        let input = wave_tensor(be, &[2, 211, 6, 5], 0.1, dtype);
        let weight = wave_tensor(be, &[4, 211, 3, 3], 0.2, dtype);
        let bias = wave_tensor(be, &[4], 0.3, dtype);
        let grouped_in = wave_tensor(be, &[1, 422, 4, 4], 0.4, dtype);
        let grouped_w = wave_tensor(be, &[6, 211, 3, 3], 0.5, dtype);
        let config = |groups| torsh_backend::ConvConfig {
            padding: [1, 1],
            groups,
            ..Default::default()
        };
        vec![
            (
                "conv2d",
                be.conv2d_with_bias(&input, &weight, Some(&bias), config(1))
                    .unwrap(),
            ),
            (
                "grouped",
                be.conv2d(&grouped_in, &grouped_w, config(2)).unwrap(),
            ),
        ]
    });
}

#[test]
fn convolution_gradients_past_the_loop_budget_add_blocks() {
    // The input gradient takes 240 output channels of 3 × 3 taps a launch: 300 of them (and a
    // transposed convolution with a bias over them) in two blocks. The weight gradient takes
    // 261 504 output positions a launch: three images of 170 × 170 in two blocks. Positive values,
    // so that these long sums do not cancel (which would magnify f32 rounding past the bound).
    let Some(b) = low_budget() else { return };
    against_reference(&b, &ALL, |be, dtype| {
        let config = torsh_backend::ConvConfig {
            padding: [1, 1],
            ..Default::default()
        };
        let positive = |shape: &[usize], phase: f32| {
            let host: Vec<f32> = super::wave(shape.iter().product(), phase)
                .iter()
                .map(|v| v.abs() + 0.1)
                .collect();
            super::dtype_tensor(be, &host, shape, dtype)
        };
        let weight = positive(&[300, 2, 3, 3], 0.1);
        let grad = positive(&[1, 300, 4, 4], 0.2);
        let bias = positive(&[2], 0.3);
        let image = positive(&[3, 1, 170, 170], 0.4);
        let image_grad = positive(&[3, 2, 170, 170], 0.5);
        vec![
            (
                "conv2d_backward_input",
                be.conv2d_backward_input(&grad, &weight, &[1, 2, 4, 4], config)
                    .unwrap(),
            ),
            (
                "conv_transpose2d",
                be.conv_transpose2d(&grad, &weight, Some(&bias), Default::default())
                    .unwrap(),
            ),
            (
                "conv2d_backward_weight",
                be.conv2d_backward_weight(&image_grad, &image, &[2, 1, 3, 3], config)
                    .unwrap(),
            ),
        ]
    });
}

#[test]
fn norm_gradients_and_saved_statistics_past_the_loop_budget_are_cut() {
    // Layer norm: rows of 12 011 (composed forward) save their statistics; the weight and bias
    // gradients of 9 001 rows take 4 095 rows a launch (three, adding in f32). Batch norm: channels
    // of 30 021 values in chunks (forward in three launches, backward sums over chunks), in
    // training and inference.
    let Some(b) = low_budget() else { return };
    against_reference(&b, &ALL, |be, dtype| {
        // Offset, so that the means are not sums that cancel (whose f32 rounding is relatively
        // large).
        let rows = wave_tensor(be, &[2, 12_011], 0.3, dtype)
            .add_scalar(3.0)
            .unwrap();
        let long = rows
            .layer_norm_with_stats(&[12_011], None, None, 1e-5)
            .unwrap();
        let x = wave_tensor(be, &[9_001, 5], 0.4, dtype);
        let w = wave_tensor(be, &[5], 0.5, dtype);
        let saved = x.layer_norm_with_stats(&[5], Some(&w), None, 1e-5).unwrap();
        let g = wave_tensor(be, &[9_001, 5], 0.6, dtype).abs().unwrap();
        let ln = be
            .layer_norm_backward(&g, &x, &[5], Some(&w), &saved.mean, &saved.invstd)
            .unwrap();
        let images = wave_tensor(be, &[3, 2, 10_007], 0.7, dtype)
            .add_scalar(3.0)
            .unwrap();
        let wb = wave_tensor(be, &[2], 0.8, dtype);
        let trained = images
            .batch_norm_with_stats(torsh_backend::BatchNormConfig {
                weight: Some(&wb),
                training: true,
                ..Default::default()
            })
            .unwrap();
        let (mean, var) = (
            be.full(&[2], 0.1, dtype).unwrap(),
            be.full(&[2], 1.5, dtype).unwrap(),
        );
        let inferred = images
            .batch_norm_with_stats(torsh_backend::BatchNormConfig {
                running_mean: Some(&mean),
                running_var: Some(&var),
                ..Default::default()
            })
            .unwrap();
        let gb = wave_tensor(be, &[3, 2, 10_007], 0.9, dtype);
        let bn = be
            .batch_norm_backward(
                &gb,
                &images,
                Some(&wb),
                &trained.mean,
                &trained.invstd,
                true,
            )
            .unwrap();
        vec![
            ("layer_norm mean (composed)", long.mean),
            ("layer_norm invstd (composed)", long.invstd),
            ("layer_norm mean", saved.mean),
            ("layer_norm invstd", saved.invstd),
            ("layer_norm_backward input", ln.input),
            ("layer_norm_backward weight", ln.weight),
            ("layer_norm_backward bias", ln.bias),
            ("batch_norm mean (training)", trained.mean),
            ("batch_norm invstd (training)", trained.invstd),
            ("batch_norm mean (inference)", inferred.mean),
            ("batch_norm invstd (inference)", inferred.invstd),
            ("batch_norm_backward input", bn.input),
            ("batch_norm_backward weight", bn.weight),
            ("batch_norm_backward bias", bn.bias),
        ]
    });
}

#[test]
fn attention_past_the_loop_budget_combines_ranges_of_keys() {
    // One launch takes 624 keys of head dim 64 (the tiled kernel) and 1152 of head dim 136 (the
    // row kernel): 1009 and 2503 keys in ranges, causal and not.
    let Some(b) = low_budget() else { return };
    against_reference(&b, &ALL, |be, dtype| {
        let q = wave_tensor(be, &[1, 2, 37, 64], 0.1, dtype);
        let kv = wave_tensor(be, &[1, 2, 1009, 64], 0.2, dtype);
        let q_wide = wave_tensor(be, &[1, 1, 3, 136], 0.3, dtype);
        let kv_wide = wave_tensor(be, &[1, 1, 2503, 136], 0.4, dtype);
        let long_q = wave_tensor(be, &[1, 2, 1009, 64], 0.5, dtype);
        vec![
            ("tiled", be.attention(&q, &kv, &kv, false).unwrap()),
            (
                "tiled, causal",
                be.attention(&long_q, &kv, &kv, true).unwrap(),
            ),
            (
                "rows",
                be.attention(&q_wide, &kv_wide, &kv_wide, false).unwrap(),
            ),
            (
                "rows, causal",
                be.attention(&q_wide, &kv_wide, &kv_wide, true).unwrap(),
            ),
        ]
    });
}

#[test]
fn attention_gradients_past_the_loop_budget_add_ranges() {
    // Head dim 136: a forward launch takes 1152 keys (1400 in two ranges, the log-sum-exps
    // combined on the host); a gradient launch about 1270 keys or queries, so dQ adds two ranges of
    // keys and dK, dV two ranges of queries. Causal and not. (A scale of 0.05 makes a few causal
    // rows of these inputs ill-conditioned in f32 on every backend: dS cancels.)
    let Some(b) = low_budget() else { return };
    // bf16 runs the f32 kernels on cast copies.
    against_reference(&b, &[DType::F32, DType::F16], |be, dtype| {
        let q = wave_tensor(be, &[1, 1, 1300, 136], 0.1, dtype);
        let k = wave_tensor(be, &[1, 1, 1400, 136], 0.2, dtype);
        let v = wave_tensor(be, &[1, 1, 1400, 136], 0.3, dtype);
        let g = wave_tensor(be, &[1, 1, 1300, 136], 0.4, dtype);
        let mut out = Vec::new();
        for (causal, names) in [
            (false, ["output", "lse", "dq", "dk", "dv"]),
            (
                true,
                [
                    "causal output",
                    "causal lse",
                    "causal dq",
                    "causal dk",
                    "causal dv",
                ],
            ),
        ] {
            let fwd = be.attention_with_lse(&q, &k, &v, causal, 0.02).unwrap();
            // The gradients from the reference's forward, so that only the backward differs.
            let reference = Backend::reference().unwrap();
            let on = |t: &Tensor| {
                let moved = t.to_vec_f64().unwrap();
                reference.from_f64(&moved, t.shape(), t.dtype()).unwrap()
            };
            let exact = reference
                .attention_with_lse(&on(&q), &on(&k), &on(&v), causal, 0.02)
                .unwrap();
            let back = |t: &Tensor| {
                let moved = t.to_vec_f64().unwrap();
                be.from_f64(&moved, t.shape(), t.dtype()).unwrap()
            };
            let (o, lse) = (back(&exact.output), back(&exact.lse));
            let grads = be
                .attention_backward(&g, &q, &k, &v, &o, &lse, causal, 0.02)
                .unwrap();
            let lse = fwd.lse.cast(dtype).unwrap();
            out.extend(
                names
                    .into_iter()
                    .zip([fwd.output, lse, grads.q, grads.k, grads.v]),
            );
        }
        out
    });
}

#[test]
fn pooling_windows_past_the_loop_budget_run_as_row_then_column_passes() {
    // A 70 × 70 window (5041 passes) with stride and padding, max and both averages.
    let Some(b) = low_budget() else { return };
    against_reference(&b, &ALL, |be, dtype| {
        let x = wave_tensor(be, &[2, 3, 79, 73], 0.1, dtype);
        let config = |count_include_pad| torsh_backend::Pool2dConfig {
            kernel: [70, 70],
            stride: [3, 2],
            padding: [5, 7],
            count_include_pad,
        };
        vec![
            ("max_pool2d", be.max_pool2d(&x, config(true)).unwrap()),
            ("avg_pool2d", be.avg_pool2d(&x, config(true)).unwrap()),
            (
                "avg_pool2d, real taps",
                be.avg_pool2d(&x, config(false)).unwrap(),
            ),
        ]
    });
}

#[test]
fn what_no_cut_brings_within_the_loop_budget_is_feature_unavailable() {
    // One input channel's 45 × 45 taps, a pooling window 4100 wide: more passes than the budget
    // on their own. And a budget below the smallest is refused.
    let Some(b) = low_budget() else { return };
    let f32 = DType::F32;
    let x = b.ones(&[1, 1, 45, 45], f32).unwrap();
    let unavailable = |r: torsh_backend::Result<Tensor>| {
        let err = r.unwrap_err();
        assert!(
            matches!(err, BackendError::FeatureUnavailable { .. }),
            "{err:?}"
        );
    };
    unavailable(b.conv2d(&x, &x, Default::default()));
    let wide = b.ones(&[1, 1, 1, 4100], f32).unwrap();
    unavailable(b.max_pool2d(&wide, torsh_backend::Pool2dConfig::new([1, 4100])));
    let mut low = WebGpuBackend::new(WebGpuBackendConfig {
        max_loop_iterations: Some(webgpu::MIN_LOOP_ITERATIONS - 1),
        ..Default::default()
    });
    assert!(matches!(
        low.init(),
        Err(BackendError::InvalidArgument { .. })
    ));
}
