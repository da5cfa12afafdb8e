//! The WGSL kernels against the reference: GEMM tiles and transposes, launches past one grid
//! dimension, sub-word copies, row kernels, batch norm, Adam, conv, attention and pooling.

use super::*;

/// A computation run on both the backend under test and the reference.
type Case = Box<dyn Fn(&Backend) -> torsh_backend::Result<torsh_backend::Tensor>>;

#[test]
fn f32_ops_run_as_wgsl_kernels() {
    let Some(b) = raw() else { return };
    let xs: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let x = upload_f32(&b, &xs);
    let y = b.alloc(xs.len() * 4).unwrap();
    let before = b.pipeline_count();
    b.unary(&UnaryDesc {
        op: UnaryOp::Exp,
        dtype: DType::F32,
        input: StridedBuf::contiguous(x, &[xs.len()]),
        output: y,
    })
    .unwrap();
    assert_eq!(
        b.pipeline_count(),
        before + 1,
        "exp must build its pipeline"
    );
    let got = download_f32(&b, y, xs.len());
    for (g, x) in got.iter().zip(&xs) {
        let want = (*x as f64).exp();
        assert!(
            ((*g as f64) - want).abs() <= 4e-6 * want,
            "exp({x}) = {g}, want {want}"
        );
    }
    // The same op again reuses the pipeline.
    b.unary(&UnaryDesc {
        op: UnaryOp::Exp,
        dtype: DType::F32,
        input: StridedBuf::contiguous(x, &[xs.len()]),
        output: y,
    })
    .unwrap();
    assert_eq!(b.pipeline_count(), before + 1);
}

/// Relative error of a row-major `[m,k]·[k,n]` product against the reference, with either operand
/// transposed as a view.
fn matmul_error(b: &Backend, m: usize, k: usize, n: usize, transpose: (bool, bool)) -> f64 {
    let reference = Backend::reference().unwrap();
    let make = |be: &Backend, rows: usize, cols: usize, t: bool, seed: u64| {
        be.manual_seed(seed);
        let shape = if t { [cols, rows] } else { [rows, cols] };
        let x = be.randn(&shape, DType::F32).unwrap();
        if t {
            x.transpose(0, 1).unwrap()
        } else {
            x
        }
    };
    let run = |be: &Backend| {
        make(be, m, k, transpose.0, 1)
            .matmul(&make(be, k, n, transpose.1, 2))
            .unwrap()
            .to_vec_f64()
            .unwrap()
    };
    let (got, want) = (run(b), run(&reference));
    let num: f64 = got.iter().zip(&want).map(|(g, w)| (g - w) * (g - w)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

#[test]
fn gemm_tiles_edges_and_transposes_match_the_reference() {
    let Some(b) = backend() else { return };
    for &(m, k, n) in &[(1, 1, 1), (131, 257, 67), (64, 16, 64), (65, 17, 129)] {
        for transpose in [(false, false), (true, false), (false, true), (true, true)] {
            let e = matmul_error(&b, m, k, n, transpose);
            assert!(e <= 1e-5, "{m}x{k}x{n} {transpose:?}: {e}");
        }
    }
}

#[test]
fn gemm_with_beta_reads_c_and_without_it_ignores_nan() {
    let Some(b) = raw() else { return };
    let (m, n, k) = (3usize, 2usize, 4usize);
    let a = upload_f32(&b, &(0..m * k).map(|i| i as f32 - 5.0).collect::<Vec<_>>());
    let bb = upload_f32(&b, &(0..k * n).map(|i| 0.5 * i as f32).collect::<Vec<_>>());
    let c = upload_f32(&b, &vec![f32::NAN; m * n]);
    let desc = GemmDesc {
        dtype: DType::F32,
        trans_a: Transpose::No,
        trans_b: Transpose::No,
        m,
        n,
        k,
        alpha: 2.0,
        a,
        lda: m,
        b: bb,
        ldb: k,
        beta: 0.0,
        c,
        ldc: m,
    };
    b.gemm(&desc).unwrap();
    let first = download_f32(&b, c, m * n);
    let want: Vec<f32> = (0..m * n)
        .map(|e| {
            let (i, j) = (e % m, e / m);
            2.0 * (0..k)
                .map(|p| (i + p * m) as f32 - 5.0)
                .zip((0..k).map(|p| 0.5 * (p + j * k) as f32))
                .map(|(x, y)| x * y)
                .sum::<f32>()
        })
        .collect();
    assert_eq!(first, want, "beta = 0 must not read the NaN in C");
    b.gemm(&GemmDesc { beta: 1.0, ..desc }).unwrap();
    let second = download_f32(&b, c, m * n);
    for (s, w) in second.iter().zip(&want) {
        assert_eq!(*s, 2.0 * w);
    }
}

#[test]
fn launches_beyond_one_grid_dimension_reach_every_element() {
    let Some(b) = raw() else { return };
    // More workgroups of 256 than one dimension allows (65 535), so the grid needs a second row.
    let len = 256 * 65_535 + 300;
    let ptr = b.alloc(len * 4).unwrap();
    b.fill(&FillDesc {
        dtype: DType::F32,
        ptr,
        len,
        value: 1.25,
    })
    .unwrap();
    let mut tail = vec![0f32; 1000];
    b.copy_dtoh(
        bytemuck::cast_slice_mut(&mut tail),
        ptr.offset((len - 1000) * 4).unwrap(),
    )
    .unwrap();
    assert!(
        tail.iter().all(|&v| v == 1.25),
        "{:?}",
        &tail[tail.len() - 5..]
    );
    b.free(ptr).unwrap();
}

#[test]
fn copies_inside_a_word_keep_the_neighbouring_bytes() {
    let Some(b) = raw() else { return };
    let ptr = b.alloc(11).unwrap();
    let base: Vec<u8> = (100..111).collect();
    b.copy_htod(ptr, &base).unwrap();
    // Three bytes starting at byte 1 and two ending at byte 10: both ends inside a word.
    b.copy_htod(ptr.offset(1).unwrap(), &[1, 2, 3]).unwrap();
    b.copy_htod(ptr.offset(9).unwrap(), &[9, 10]).unwrap();
    let mut all = vec![0u8; 11];
    b.copy_dtoh(&mut all, ptr).unwrap();
    assert_eq!(all, [100, 1, 2, 3, 104, 105, 106, 107, 108, 9, 10]);
    let mut middle = vec![0u8; 3];
    b.copy_dtoh(&mut middle, ptr.offset(3).unwrap()).unwrap();
    assert_eq!(middle, [3, 104, 105]);
    // A device-to-device copy with unaligned ends.
    let other = b.alloc(7).unwrap();
    b.copy_htod(other, &[0; 7]).unwrap();
    b.copy_dtod(other.offset(2).unwrap(), ptr.offset(1).unwrap(), 5)
        .unwrap();
    let mut got = vec![0u8; 7];
    b.copy_dtoh(&mut got, other).unwrap();
    assert_eq!(got, [0, 0, 1, 2, 3, 104, 105]);
}

/// Runs each case on `b` and on the reference from the same `seed` and checks the relative error
/// against the f32 bound of the parity suite.
fn check_against_reference(b: &Backend, cases: Vec<(&str, Case)>, seed: u64) {
    let reference = Backend::reference().unwrap();
    for (name, case) in cases {
        b.manual_seed(seed);
        reference.manual_seed(seed);
        let got = case(b).unwrap().to_vec_f64().unwrap();
        let want = case(&reference).unwrap().to_vec_f64().unwrap();
        let e = rel_error(&got, &want);
        assert!(e <= 1e-5, "{name}: relative error {e}");
    }
}

/// Relative error of `got` against `want`, as the parity suite measures it.
pub(super) fn rel_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Row ops on rows longer than a workgroup (several elements per thread), a strided axis, inner > 1.
fn long_row_cases() -> Vec<(&'static str, Case)> {
    vec![
        (
            "sum",
            Box::new(|be| be.randn(&[3, 1000], DType::F32)?.sum(1, false)),
        ),
        (
            "mean of columns",
            Box::new(|be| be.randn(&[777, 5], DType::F32)?.mean(0, false)),
        ),
        (
            "max of a transposed view",
            Box::new(|be| be.randn(&[300, 7], DType::F32)?.t()?.max(1, false)),
        ),
        (
            "argmin",
            Box::new(|be| {
                be.randn(&[4, 513], DType::F32)?
                    .argmin(1, false)?
                    .cast(DType::F64)
            }),
        ),
        (
            "var",
            Box::new(|be| be.randn(&[6, 1001], DType::F32)?.var(1, 1, false)),
        ),
        (
            "softmax",
            Box::new(|be| be.randn(&[5, 777], DType::F32)?.softmax(-1)),
        ),
        (
            "softmax, inner > 1",
            Box::new(|be| be.randn(&[4, 300, 3], DType::F32)?.softmax(1)),
        ),
        (
            "log_softmax",
            Box::new(|be| be.randn(&[3, 2049], DType::F32)?.log_softmax(-1)),
        ),
        (
            "layer_norm",
            Box::new(|be| {
                let x = be.randn(&[6, 1000], DType::F32)?;
                let w = be.randn(&[1000], DType::F32)?;
                let bias = be.randn(&[1000], DType::F32)?;
                x.layer_norm(&[1000], Some(&w), Some(&bias), 1e-5)
            }),
        ),
    ]
}

#[test]
fn row_kernels_match_the_reference_on_long_and_strided_rows() {
    let Some(b) = backend() else { return };
    check_against_reference(&b, long_row_cases(), 7);
}

#[test]
fn row_kernels_and_batch_norm_agree_with_and_without_subgroups_at_every_width() {
    if raw().is_none() {
        return;
    }
    let reference = Backend::reference().unwrap();
    let all = WebGpuBackendConfig::default().optional_features;
    let no_subgroups = all - wgpu::Features::SUBGROUP;
    // The tree and the subgroup combines, at a GPU's 256 threads per row, a CPU adapter's SIMD
    // width, and the extremes of one thread and a width no subgroup size divides evenly into rows.
    let configs = [
        (no_subgroups, Some(256)),
        (no_subgroups, Some(8)),
        (no_subgroups, Some(1)),
        (all, Some(256)),
        (all, Some(32)),
        (all, Some(1)),
    ];
    for (features, width) in configs {
        let config = WebGpuBackendConfig {
            optional_features: features,
            row_workgroup_size: width,
            ..Default::default()
        };
        let label = format!(
            "subgroups {}, width {width:?}",
            features.contains(wgpu::Features::SUBGROUP)
        );
        let b = Backend::from_compute(Box::new(WebGpuBackend::new(config))).unwrap();
        for (i, op) in ["reduce", "softmax", "layer_norm", "batch_norm"]
            .into_iter()
            .enumerate()
        {
            let case = validation::cases::find(op).unwrap();
            let r =
                validation::run_case(&case, &b, &reference, DType::F32, validation::case_seed(i));
            assert!(r.passed(), "{label}: {op}: {:?}", r.outcome);
        }
        check_against_reference(&b, long_row_cases(), 11);
        let wrong = special_values::mismatches(&b, &reference);
        assert!(wrong.is_empty(), "{label}:\n{}", wrong.join("\n"));
    }
}

/// Batch norm of `host` as a `shape` tensor of `dtype`, with weight, bias, running mean and
/// running variance `params[0..4]`, on `be` and on the reference; each result (output, running
/// mean, running variance) checked against the reference's.
pub(super) fn check_batch_norm(
    be: &Backend,
    label: &str,
    (host, shape, dtype): (&[f32], &[usize], DType),
    params: [&[f32]; 4],
    training: bool,
    momentum: f64,
) {
    let run = |on: &Backend| {
        let x = dtype_tensor(on, host, shape, dtype);
        let [weight, bias, mean, var] = params.map(|p| dtype_tensor(on, p, &[p.len()], dtype));
        let y = x
            .batch_norm(torsh_backend::BatchNormConfig {
                weight: Some(&weight),
                bias: Some(&bias),
                running_mean: Some(&mean),
                running_var: Some(&var),
                training,
                momentum: Some(momentum),
                eps: None,
            })
            .unwrap();
        [y, mean, var]
    };
    let (got, want) = (run(be), run(&Backend::reference().unwrap()));
    let name = format!("batch_norm {label} {shape:?} (training {training})");
    for (what, (g, w)) in ["output", "running mean", "running var"]
        .iter()
        .zip(got.iter().zip(&want))
    {
        check_dtype(&format!("{name} {what}"), dtype, g, w);
    }
}

#[test]
fn batch_norm_covers_chunks_of_a_channel_and_channels_beyond_one_grid_dimension() {
    if raw().is_none() {
        return;
    }
    // Channels of 5 × 1 999 = 9 995 elements: three chunks at 256 threads (4 096 each, the last
    // short), 20 at 32 (512 each), so training runs in three launches; the whole channel at a SIMD
    // group's 8, in one; and 70 001 channels, beyond the 65 535 workgroups of one grid dimension.
    let shapes: [&[usize]; 2] = [&[5, 3, 1_999], &[3, 70_001]];
    for width in [Some(256), Some(32), Some(8)] {
        let config = WebGpuBackendConfig {
            row_workgroup_size: width,
            ..Default::default()
        };
        let b = Backend::from_compute(Box::new(WebGpuBackend::new(config))).unwrap();
        for shape in shapes {
            let c = shape[1];
            // Images whose means differ, so that chunks of a channel do too.
            let image: usize = shape[1..].iter().product();
            let host: Vec<f32> = (0..shape.iter().product::<usize>())
                .map(|j| {
                    let wave = ((j as f32) * 0.713_2).sin() * 2.0 + (j % 7) as f32 * 0.25;
                    wave + 1.5 * (j / image) as f32
                })
                .collect();
            let stat = |k: usize| -> Vec<f32> {
                (0..c)
                    .map(|ch| 0.6 + ((ch * 3 + k) as f32 * 0.41).cos().abs())
                    .collect()
            };
            let params = [stat(0), stat(1), stat(2), stat(3)];
            let params = [&params[0][..], &params[1], &params[2], &params[3]];
            // Every dtype on the chunked channels (f16 natively where the adapter has
            // shader-f16, bf16 on f32 copies), f32 on the many channels.
            let dtypes: &[DType] = if shape.len() == 3 {
                &[DType::F32, DType::F16, DType::BF16]
            } else {
                &[DType::F32]
            };
            for &dtype in dtypes {
                for training in [false, true] {
                    let label = format!("width {width:?}");
                    let data = (&host[..], shape, dtype);
                    check_batch_norm(&b, &label, data, params, training, 0.25);
                }
            }
        }
    }
}

#[test]
fn batch_norm_in_three_launches_replays_from_a_captured_graph_as_eagerly() {
    if raw().is_none() {
        return;
    }
    // The GPU configuration: training over chunks in three launches, whose partial statistics live
    // in a buffer of the launch's own, submitted together with the rest of the graph.
    let config = WebGpuBackendConfig {
        row_workgroup_size: Some(256),
        ..Default::default()
    };
    let b = Backend::from_compute(Box::new(WebGpuBackend::new(config))).unwrap();
    let x = b.randn(&[6, 2, 2_000], DType::F32).unwrap();
    let mean = b.zeros(&[2], DType::F32).unwrap();
    let var = b.ones(&[2], DType::F32).unwrap();
    let run = |x: &torsh_backend::Tensor| {
        x.batch_norm(torsh_backend::BatchNormConfig {
            running_mean: Some(&mean),
            running_var: Some(&var),
            training: true,
            ..Default::default()
        })
    };
    let graph = b.capture_graph(|| run(&x)).unwrap();
    let fresh = b.randn(&[6, 2, 2_000], DType::F32).unwrap();
    let (mean0, var0) = (mean.to_vec::<f32>().unwrap(), var.to_vec::<f32>().unwrap());
    let replayed = b
        .launch_graph(&graph, &[fresh.clone(), mean.clone(), var.clone()])
        .unwrap();
    let (mean1, var1) = (mean.to_vec::<f32>().unwrap(), var.to_vec::<f32>().unwrap());
    // Eagerly, from the same running statistics as the replay started with.
    mean.copy_from(&b.from_slice(&mean0, &[2]).unwrap())
        .unwrap();
    var.copy_from(&b.from_slice(&var0, &[2]).unwrap()).unwrap();
    let eager = run(&fresh).unwrap();
    assert_eq!(replayed[0].to_bytes().unwrap(), eager.to_bytes().unwrap());
    assert_eq!(mean.to_vec::<f32>().unwrap(), mean1);
    assert_eq!(var.to_vec::<f32>().unwrap(), var1);
    assert_ne!(mean1, mean0, "the running mean moved");
}

#[test]
fn row_widths_that_are_not_powers_of_two_are_refused() {
    if raw().is_none() {
        return;
    }
    for width in [0, 3, 512] {
        let mut b = WebGpuBackend::new(WebGpuBackendConfig {
            row_workgroup_size: Some(width),
            ..Default::default()
        });
        assert!(
            matches!(b.init(), Err(BackendError::InvalidArgument { .. })),
            "width {width}"
        );
    }
}

#[test]
fn adam_over_many_workgroups_matches_the_reference() {
    let Some(b) = backend() else { return };
    let reference = Backend::reference().unwrap();
    // The same inputs on both sides (drawn on the reference: WebGPU's normals are computed in f32 and
    // may differ from the reference's by an ulp).
    let draw = |seed: u64| {
        let x = reference
            .random_seeded(
                &[100_003],
                DType::F32,
                Distribution::Normal {
                    mean: 0.0,
                    std: 1.0,
                },
                seed,
            )
            .unwrap();
        x.to_vec::<f32>().unwrap()
    };
    let run = |be: &Backend, state: &mut torsh_backend::AdamState| {
        let mut params = vec![be.from_slice(&draw(11), &[100_003]).unwrap()];
        for step in 0..3 {
            let grads = vec![be.from_slice(&draw(12 + step), &[100_003]).unwrap()];
            be.fused_adam_step(&mut params, &grads, state, 1e-3, (0.9, 0.999))
                .unwrap();
        }
        params[0].to_vec_f64().unwrap()
    };
    for (mut ours, mut theirs) in [
        (
            torsh_backend::AdamState::adam().with_weight_decay(0.01),
            torsh_backend::AdamState::adam().with_weight_decay(0.01),
        ),
        (
            torsh_backend::AdamState::adamw(0.05),
            torsh_backend::AdamState::adamw(0.05),
        ),
    ] {
        let e = rel_error(&run(&b, &mut ours), &run(&reference, &mut theirs));
        assert!(e <= 1e-6, "adam: relative error {e}");
    }
}

#[test]
fn conv_and_attention_kernels_match_the_reference() {
    let Some(b) = backend() else { return };
    let conv = |n, c, hw, k, r, stride, pad, dilation, groups: usize| -> Case {
        Box::new(move |be: &Backend| {
            let x = be.randn(&[n, c, hw, hw + 3], DType::F32)?;
            let w = be.randn(&[k, c / groups, r, r], DType::F32)?;
            let bias = be.randn(&[k], DType::F32)?;
            be.conv2d_with_bias(
                &x,
                &w,
                Some(&bias),
                torsh_backend::ConvConfig {
                    stride: [stride, stride],
                    padding: [pad, pad],
                    dilation: [dilation, dilation],
                    groups,
                },
            )
        })
    };
    let attention = |heads, sq, skv, dim, causal: bool| -> Case {
        Box::new(move |be: &Backend| {
            let q = be.randn(&[2, heads, sq, dim], DType::F32)?;
            let k = be.randn(&[2, heads, skv, dim], DType::F32)?;
            let v = be.randn(&[2, heads, skv, dim], DType::F32)?;
            be.attention(&q, &k, &v, causal)
        })
    };
    let cases: Vec<(&str, Case)> = vec![
        (
            "conv 3x3 same, more than one tile of channels and pixels",
            conv(2, 5, 13, 70, 3, 1, 1, 1, 1),
        ),
        (
            "conv 5x5 stride 2 dilation 2",
            conv(1, 4, 17, 9, 5, 2, 3, 2, 1),
        ),
        ("conv grouped", conv(2, 6, 9, 9, 3, 1, 1, 1, 3)),
        (
            "conv 3x3 unpadded, grouped, stride 2",
            conv(2, 6, 12, 10, 3, 2, 0, 1, 2),
        ),
        ("conv depthwise", conv(1, 8, 11, 8, 3, 1, 1, 1, 8)),
        (
            "conv 1x1 over 4097 pixels",
            conv(1, 3, 64, 5, 1, 1, 0, 1, 1),
        ),
        (
            "attention over several key chunks",
            attention(3, 7, 300, 16, false),
        ),
        (
            "attention tiled, head dim 128, causal, more queries than keys",
            attention(2, 37, 20, 128, true),
        ),
        (
            "attention tiled, head dim 64, a partial last row tile",
            attention(1, 50, 70, 64, false),
        ),
        (
            "attention tiled, head dim 3, causal",
            attention(2, 17, 5, 3, true),
        ),
        (
            "attention tiled, one of everything",
            attention(1, 1, 1, 1, false),
        ),
        ("attention causal, square", attention(2, 260, 260, 8, true)),
        (
            "attention causal, more keys than queries",
            attention(1, 5, 9, 130, true),
        ),
        (
            "attention, head dim above a workgroup",
            attention(1, 3, 4, 300, false),
        ),
    ];
    check_against_reference(&b, cases, 21);
}

#[test]
fn conv_skips_padded_taps_like_the_reference() {
    let Some(b) = backend() else { return };
    // An infinite weight whose tap lands only on padding at the border must not make the border NaN.
    let x = b.ones(&[1, 1, 3, 3], DType::F32).unwrap();
    let mut w = vec![0.5f32; 9];
    w[0] = f32::INFINITY;
    let w = b.from_slice(&w, &[1, 1, 3, 3]).unwrap();
    let config = torsh_backend::ConvConfig {
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    };
    let got = b.conv2d(&x, &w, config).unwrap().to_vec::<f32>().unwrap();
    let reference = Backend::reference().unwrap();
    let want = reference
        .conv2d(
            &x.to(&reference).unwrap(),
            &w.to(&reference).unwrap(),
            config,
        )
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(g == w || (g.is_nan() && w.is_nan()), "{got:?} vs {want:?}");
    }
    assert!(
        got[0].is_finite(),
        "the top-left output only sees the infinite tap on padding"
    );
}

#[test]
fn pooling_and_batch_norm_kernels_match_the_reference() {
    let Some(b) = backend() else { return };
    let pool = |max: bool, count_include_pad: bool| -> Case {
        Box::new(move |be: &Backend| {
            let x = be.randn(&[2, 3, 37, 29], DType::F32)?;
            let config = torsh_backend::Pool2dConfig {
                kernel: [3, 4],
                stride: [2, 3],
                padding: [1, 2],
                count_include_pad,
            };
            if max {
                x.max_pool2d(config)
            } else {
                x.avg_pool2d(config)
            }
        })
    };
    // Which of (output, running mean, running var) after one batch-norm call.
    let norm = |training: bool, which: usize| -> Case {
        Box::new(move |be: &Backend| {
            let x = be.randn(&[3, 5, 301], DType::F32)?;
            let w = be.randn(&[5], DType::F32)?;
            let bias = be.randn(&[5], DType::F32)?;
            let mean = be.randn(&[5], DType::F32)?;
            let var = be.binary_scalar(
                torsh_backend::BinaryOp::Add,
                &be.rand(&[5], DType::F32)?,
                0.5,
            )?;
            let y = x.batch_norm(torsh_backend::BatchNormConfig {
                weight: Some(&w),
                bias: Some(&bias),
                running_mean: Some(&mean),
                running_var: Some(&var),
                training,
                momentum: Some(0.2),
                eps: None,
            })?;
            Ok([y, mean, var][which].clone())
        })
    };
    let cases: Vec<(&str, Case)> = vec![
        ("max pool", pool(true, true)),
        ("avg pool counting padding", pool(false, true)),
        ("avg pool over real elements", pool(false, false)),
        ("batch norm, training", norm(true, 0)),
        ("batch norm running mean", norm(true, 1)),
        ("batch norm running var", norm(true, 2)),
        ("batch norm, inference", norm(false, 0)),
    ];
    check_against_reference(&b, cases, 5);
}
