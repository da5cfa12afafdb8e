//! The WebGPU backend on whatever adapter wgpu finds — in CI, Mesa's lavapipe (Vulkan on the CPU).
//! The parity suite (`tests/parity.rs`) and the bad-input tests (`tests/errors/`) run on it as on
//! every available backend; this file adds what is particular to it: the WGSL kernels really serve
//! f32 ops (pipelines get built), GEMM tile edges and transposes, launches larger than one grid
//! dimension, copies that start or end inside a 4-byte word, casts between every pair of dtypes bit
//! for bit, the staging of f16/bf16 and unaligned operands, random fills, the buffer pool, and device
//! selection.
//!
//! Without an adapter every test says why it skips; `TORSH_REQUIRE=webgpu` (set by CI) makes that a
//! failure.

#![cfg(feature = "webgpu")]

use torsh_backend::compute::{
    ComputeBackend, Distribution, FillDesc, GemmDesc, StridedBuf, Transpose, UnaryDesc,
};
use torsh_backend::validation;
use torsh_backend::webgpu::{self, WebGpuBackend, WebGpuBackendConfig};
use torsh_backend::{Backend, BackendError, BackendType, DType, UnaryOp};

mod common;
use common::special_values;

#[path = "webgpu/loop_limit.rs"]
mod loop_limit;

/// An initialised raw backend on the best adapter, or `None` (after saying why) when there is none.
fn raw() -> Option<WebGpuBackend> {
    let mut b = WebGpuBackend::new(WebGpuBackendConfig::default());
    match b.init() {
        Ok(()) => Some(b),
        Err(e) => {
            common::skip("webgpu", e);
            None
        }
    }
}

/// The tensor-level backend, or `None` when there is no adapter.
fn backend() -> Option<Backend> {
    match Backend::webgpu().build() {
        Ok(b) => Some(b),
        Err(e) => {
            common::skip("webgpu", e);
            None
        }
    }
}

fn upload_f32(b: &WebGpuBackend, xs: &[f32]) -> torsh_backend::DevicePtr {
    let ptr = b.alloc(xs.len() * 4).unwrap();
    b.copy_htod(ptr, bytemuck::cast_slice(xs)).unwrap();
    ptr
}

fn download_f32(b: &WebGpuBackend, ptr: torsh_backend::DevicePtr, len: usize) -> Vec<f32> {
    let mut out = vec![0f32; len];
    b.copy_dtoh(bytemuck::cast_slice_mut(&mut out), ptr)
        .unwrap();
    out
}

#[test]
fn adapters_are_listed_with_their_api() {
    if backend().is_none() {
        return;
    }
    let devices = Backend::list_devices().unwrap();
    let ours: Vec<_> = devices
        .iter()
        .filter(|d| d.backend_type() == BackendType::WebGpu)
        .collect();
    assert!(!ours.is_empty(), "{devices:?}");
    for d in ours {
        assert!(d.api.starts_with("WebGPU on "), "{d:?}");
        assert!(
            d.details.iter().any(|(k, _)| k == "max storage binding"),
            "{d:?}"
        );
    }
    assert!(webgpu::is_available());
}

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

#[test]
fn freed_buffers_are_reused_and_stats_return_to_zero() {
    let Some(b) = raw() else { return };
    let start = b.pool_stats().unwrap();
    let p = b.alloc(10_000).unwrap();
    let s = b.pool_stats().unwrap();
    assert_eq!(s.allocated_bytes, start.allocated_bytes + 10_000);
    b.free(p).unwrap();
    let q = b.alloc(9_990).unwrap();
    let after = b.pool_stats().unwrap();
    assert_eq!(
        after.hits,
        s.hits + 1,
        "a freed buffer of the same class is reused"
    );
    b.free(q).unwrap();
    assert_eq!(
        b.pool_stats().unwrap().allocated_bytes,
        start.allocated_bytes
    );
    b.empty_cache().unwrap();
    assert_eq!(b.pool_stats().unwrap().cached_bytes, 0);
    // A freed pointer is invalid afterwards.
    assert!(matches!(
        b.free(q),
        Err(BackendError::InvalidPointer { .. })
    ));
}

#[test]
fn allocations_beyond_the_configured_limit_are_out_of_memory() {
    if raw().is_none() {
        return;
    }
    let mut b = WebGpuBackend::new(WebGpuBackendConfig {
        max_buffer_size: 1 << 20,
        ..Default::default()
    });
    b.init().unwrap();
    assert!(b.alloc(1 << 20).is_ok());
    assert!(matches!(
        b.alloc((1 << 20) + 1),
        Err(BackendError::OutOfMemory { .. })
    ));
}

#[test]
fn device_selection_is_checked() {
    if backend().is_none() {
        return;
    }
    let err = Backend::webgpu().device(10_000).build().unwrap_err();
    assert!(matches!(err, BackendError::InvalidArgument { .. }), "{err}");
    let mut odd = WebGpuBackend::new(WebGpuBackendConfig {
        preferred_workgroup_size: (64, 1, 1),
        ..Default::default()
    });
    assert!(matches!(
        odd.init(),
        Err(BackendError::InvalidArgument { .. })
    ));
    let mut debug = WebGpuBackend::new(WebGpuBackendConfig {
        debug_mode: true,
        ..Default::default()
    });
    assert!(matches!(
        debug.init(),
        Err(BackendError::FeatureUnavailable { .. })
    ));
    // Without the pipeline cache every launch builds its pipeline and keeps none.
    let mut uncached = WebGpuBackend::new(WebGpuBackendConfig {
        enable_pipeline_cache: false,
        ..Default::default()
    });
    uncached.init().unwrap();
    let ptr = uncached.alloc(64).unwrap();
    uncached
        .fill(&FillDesc {
            dtype: DType::F32,
            ptr,
            len: 16,
            value: 2.0,
        })
        .unwrap();
    assert_eq!(uncached.pipeline_count(), 0);
    assert_eq!(download_f32(&uncached, ptr, 16), vec![2.0; 16]);
    // The seed's async constructors, driven without a runtime.
    let device = webgpu::block_on(webgpu::WebGpuDevice::from_best_adapter(0)).unwrap();
    assert!(!device.name().is_empty());
    assert!(device.limits().max_storage_buffer_binding_size > 0);
}

#[test]
fn rocm_points_amd_users_at_the_vulkan_route() {
    match Backend::rocm().build() {
        Err(BackendError::Unavailable { reason, .. }) => {
            assert!(
                reason.contains("Vulkan") && reason.contains("webgpu"),
                "{reason}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn auto_picks_webgpu_only_on_a_hardware_gpu() {
    let auto = Backend::auto().unwrap();
    let adapters = webgpu::block_on(webgpu::enumerate_adapters()).unwrap();
    let best_is_gpu = adapters.first().is_some_and(|a| {
        matches!(
            a.get_info().device_type,
            webgpu::wgpu::DeviceType::DiscreteGpu
                | webgpu::wgpu::DeviceType::IntegratedGpu
                | webgpu::wgpu::DeviceType::VirtualGpu
        )
    });
    let cuda = Backend::available().contains(&BackendType::Cuda);
    if cuda {
        assert_eq!(auto.backend_type(), BackendType::Cuda);
    } else if best_is_gpu {
        assert_eq!(auto.backend_type(), BackendType::WebGpu);
    } else {
        // lavapipe and other CPU adapters rank below the native CPU backend.
        assert_eq!(auto.backend_type(), BackendType::Cpu);
    }
}

/// A custom kernel: doubles each element, guarded by `arrayLength`.
const DOUBLE: &str = r#"
@group(0) @binding(0) var<storage, read> input: array<f32>;
@group(0) @binding(1) var<storage, read_write> output: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) global_id: vec3<u32>) {
    let index = global_id.x;
    if (index >= arrayLength(&output)) {
        return;
    }
    output[index] = input[index] * 2.0;
}
"#;

#[test]
fn custom_kernels_run_on_tensors() {
    let Some(b) = backend() else { return };
    let exec = webgpu::WebGpuKernelExecutor::new(&b).unwrap();
    let xs: Vec<f32> = (0..1000).map(|i| i as f32 * 0.25 - 7.0).collect();
    let input = b.from_slice(&xs, &[1000]).unwrap();
    let output = b.full(&[1000], f64::NAN, DType::F32).unwrap();
    webgpu::block_on(exec.execute_custom_kernel(
        DOUBLE,
        "main",
        &[&input, &output],
        (64, 1, 1),
        (16, 1, 1),
        None,
    ))
    .unwrap();
    let got = output.to_vec::<f32>().unwrap();
    assert_eq!(got, xs.iter().map(|x| x * 2.0).collect::<Vec<_>>());
    assert!(exec.pipeline_stats().pipeline_count >= 1);

    // Uniform data at the binding after the buffers.
    let scale = r#"
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
struct Params { factor: f32, bias: f32 }
@group(0) @binding(1) var<uniform> params: Params;
@compute @workgroup_size(32, 2)
fn scale(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x * 2u + id.y;
    if (i < arrayLength(&data)) { data[i] = data[i] * params.factor + params.bias; }
}
"#;
    let uniforms: Vec<u8> = [3.0f32, 0.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    webgpu::block_on(exec.execute_custom_kernel(
        scale,
        "scale",
        &[&output],
        (32, 2, 1),
        (16, 1, 1),
        Some(&uniforms),
    ))
    .unwrap();
    let scaled = output.to_vec::<f32>().unwrap();
    assert_eq!(
        scaled,
        xs.iter().map(|x| x * 2.0 * 3.0 + 0.5).collect::<Vec<_>>()
    );
}

#[test]
fn custom_kernel_mistakes_are_typed_errors() {
    let Some(b) = backend() else { return };
    let exec = webgpu::WebGpuKernelExecutor::new(&b).unwrap();
    let input = b.ones(&[64], DType::F32).unwrap();
    let output = b.zeros(&[64], DType::F32).unwrap();
    let run = |src: &str, entry: &str, bufs: &[&torsh_backend::Tensor], size, count| {
        webgpu::block_on(exec.execute_custom_kernel(src, entry, bufs, size, count, None))
    };
    // A syntax error: naga's message names the line.
    let broken = DOUBLE.replace("input[index] * 2.0;", "input[index] * ;");
    match run(&broken, "main", &[&input, &output], (64, 1, 1), (1, 1, 1)) {
        Err(BackendError::KernelCompile { log, .. }) => assert!(log.contains(':'), "{log}"),
        other => panic!("expected KernelCompile, got {other:?}"),
    }
    // A type error only validation finds.
    let mistyped = DOUBLE.replace("input[index] * 2.0", "input[index] * 2u");
    assert!(matches!(
        run(&mistyped, "main", &[&input, &output], (64, 1, 1), (1, 1, 1)),
        Err(BackendError::KernelCompile { .. })
    ));
    for (entry, size, count) in [
        ("missing", (64, 1, 1), (1, 1, 1)),
        ("main", (32, 1, 1), (1, 1, 1)),
        ("main", (64, 1, 1), (1 << 20, 1, 1)),
    ] {
        let r = run(DOUBLE, entry, &[&input, &output], size, count);
        assert!(
            matches!(r, Err(BackendError::InvalidArgument { .. })),
            "{entry} {size:?} {count:?}: {r:?}"
        );
    }
    let too_big = DOUBLE.replace("@workgroup_size(64)", "@workgroup_size(4096)");
    let r = run(
        &too_big,
        "main",
        &[&input, &output],
        (4096, 1, 1),
        (1, 1, 1),
    );
    assert!(
        matches!(r, Err(BackendError::InvalidArgument { .. })),
        "{r:?}"
    );
    // One buffer where the shader binds two: the driver's validation, as InvalidArgument.
    let r = run(DOUBLE, "main", &[&input], (64, 1, 1), (1, 1, 1));
    assert!(
        matches!(r, Err(BackendError::InvalidArgument { .. })),
        "{r:?}"
    );
    // A strided view, and a tensor of another backend.
    let m = b.ones(&[8, 8], DType::F32).unwrap();
    let r = run(
        DOUBLE,
        "main",
        &[&m.t().unwrap(), &output],
        (64, 1, 1),
        (1, 1, 1),
    );
    assert!(
        matches!(r, Err(BackendError::InvalidArgument { .. })),
        "{r:?}"
    );
    let cpu = Backend::cpu().build().unwrap();
    let foreign = cpu.ones(&[64], DType::F32).unwrap();
    let r = run(DOUBLE, "main", &[&foreign, &output], (64, 1, 1), (1, 1, 1));
    assert!(
        matches!(r, Err(BackendError::DeviceMismatch { .. })),
        "{r:?}"
    );
    assert!(matches!(
        webgpu::WebGpuKernelExecutor::new(&cpu),
        Err(BackendError::InvalidArgument { .. })
    ));
    // The backend still works after all of that.
    run(DOUBLE, "main", &[&input, &output], (64, 1, 1), (1, 1, 1)).unwrap();
    assert_eq!(output.to_vec::<f32>().unwrap(), vec![2.0; 64]);
}

/// A computation run on both the backend under test and the reference.
type Case = Box<dyn Fn(&Backend) -> torsh_backend::Result<torsh_backend::Tensor>>;

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
fn rel_error(got: &[f64], want: &[f64]) -> f64 {
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
fn check_batch_norm(
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

#[test]
fn fresh_allocations_are_poisoned_to_their_last_byte() {
    let Some(b) = raw() else { return };
    if !cfg!(debug_assertions) && std::env::var("TORSH_POISON").as_deref() != Ok("1") {
        common::skipped("a release build without TORSH_POISON=1 does not poison");
        return;
    }
    // Larger than one poisoning chunk (1 MiB) and not a whole number of words.
    let len = (3 << 20) + 5;
    let ptr = b.alloc(len).unwrap();
    for at in [0, (1 << 20) - 1, 1 << 20, len - 7] {
        let mut bytes = [0u8; 7];
        b.copy_dtoh(&mut bytes, ptr.offset(at).unwrap()).unwrap();
        assert_eq!(bytes, [0xFF; 7], "at byte {at}");
    }
}

/// Runs `op` on a raw WebGPU backend and on the raw reference backend; each call gets the backend and
/// returns the bytes to compare.
fn on_both(op: impl Fn(&dyn ComputeBackend) -> Vec<u8>) -> Option<(Vec<u8>, Vec<u8>)> {
    let gpu = raw()?;
    let mut reference =
        torsh_backend::backends::reference::ReferenceBackend::new(BackendType::Reference);
    reference.init().unwrap();
    Some((op(&gpu), op(&reference)))
}

/// Uploads `bytes` at byte `at` of a fresh allocation of `at + bytes.len() + tail` bytes filled with
/// 0xA5; returns the allocation's base.
fn upload_at(
    b: &dyn ComputeBackend,
    bytes: &[u8],
    at: usize,
    tail: usize,
) -> torsh_backend::DevicePtr {
    let base = b.alloc(at + bytes.len() + tail).unwrap();
    let mut all = vec![0xA5u8; at + bytes.len() + tail];
    all[at..at + bytes.len()].copy_from_slice(bytes);
    b.copy_htod(base, &all).unwrap();
    base
}

fn download(b: &dyn ComputeBackend, ptr: torsh_backend::DevicePtr, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    b.copy_dtoh(&mut out, ptr).unwrap();
    out
}

/// Test values of `dtype` as little-endian bytes: every bit pattern of the 8- and 16-bit types, and
/// for the others the edges of every conversion (subnormals, halfway cases of each narrower format,
/// overflow, NaN payloads, integer extremes, values whose conversion through f64 rounds twice).
fn cast_inputs(dtype: DType) -> Vec<u8> {
    let mut rng = torsh_backend::rng::HostRng::new(5);
    match dtype {
        DType::U8 => (0..=255u8).collect(),
        DType::F16 | DType::BF16 => (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect(),
        DType::F32 => {
            let mut v: Vec<u32> = vec![
                0,
                0x8000_0000,
                1,
                0x007f_ffff,
                0x0080_0000,
                0x7f7f_ffff,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0000,
                0x7fc0_0001,
                0x7f80_0001,
                0xffa0_0000,
                0x3f80_1000,
                0x3f80_3000,
                0x3f80_1001,
                0x3f80_8000,
                0x3f81_8000,
                0x477f_f000,
                0x477f_efff,
                0x3300_0000,
                0x3340_0000,
                0x33c0_0000,
                0x4f00_0000,
                0xcf00_0000,
                0xcf00_0001,
                0x5f00_0000,
                0xdf00_0000,
                0x437f_e666,
                0xbf66_6666,
                0xc300_8000,
            ];
            v.extend(
                [
                    255.9f32,
                    -0.9,
                    300.7,
                    -300.7,
                    1.0 / 3.0,
                    1e20,
                    -1e20,
                    2.5,
                    3.5,
                    -2.5,
                ]
                .map(f32::to_bits),
            );
            v.extend((0..200).map(|_| (rng.uniform(-1e6, 1e6) as f32).to_bits()));
            v.extend((0..200).map(|_| rng.next_u64() as u32));
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
        DType::F64 => {
            let mut v: Vec<u64> = vec![
                0,
                1 << 63,
                1,
                0x000f_ffff_ffff_ffff,
                0x7fef_ffff_ffff_ffff,
                0x7ff0_0000_0000_0000,
                0xfff0_0000_0000_0000,
                0x7ff8_0000_0000_0001,
                0x7ff0_0000_0000_0001,
            ];
            v.extend(
                [
                    1.0 + 2f64.powi(-24),
                    1.0 + 2f64.powi(-24) + 2f64.powi(-60),
                    1.0 + 3.0 * 2f64.powi(-24),
                    1.0 + 2f64.powi(-11),
                    1.0 + 2f64.powi(-11) + 2f64.powi(-40),
                    65520.0,
                    65519.999,
                    3.4028235677973366e38,
                    3.4028235e38,
                    1e300,
                    -1e300,
                    1e-300,
                    1e-45,
                    7e-46,
                    2f64.powi(-150),
                    2f64.powi(-150) * 1.5,
                    2f64.powi(63),
                    -(2f64.powi(63)),
                    9.3e18,
                    -9.3e18,
                    2f64.powi(31),
                    -(2f64.powi(31)) - 0.5,
                    4294967296.5,
                    255.99,
                    256.0,
                    -0.99,
                    -1.0,
                ]
                .map(f64::to_bits),
            );
            v.extend((0..200).map(|_| rng.uniform(-1e9, 1e9).to_bits()));
            v.extend((0..200).map(|_| rng.next_u64()));
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
        DType::I32 => {
            let mut v = vec![
                0i32,
                1,
                -1,
                i32::MIN,
                i32::MAX,
                255,
                256,
                -129,
                16_777_217,
                16_777_219,
                -16_777_217,
                2049,
                2051,
                65520,
                65519,
                -65536,
            ];
            v.extend((0..200).map(|_| rng.next_u64() as i32));
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
        DType::I64 => {
            let mut v = vec![
                0i64,
                1,
                -1,
                i64::MIN,
                i64::MAX,
                (1 << 53) + 1,
                (1 << 53) + 3,
                (1 << 62) + (1 << 38) + 1,
                (1 << 62) + (1 << 38),
                -((1 << 62) + (1 << 38) + 1),
                (1 << 40) + (1 << 29),
                (1 << 40) + (1 << 29) + 1,
                4_294_967_296 + 7,
                255,
                -256,
            ];
            v.extend((0..200).map(|_| rng.next_u64() as i64));
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
    }
}

/// The element at `i` of `bytes` as f64 (for NaN checks).
fn element(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size_in_bytes();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DType::F16 => half::f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => half::bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U8 => b[0] as f64,
    }
}

#[test]
fn casts_between_every_pair_of_dtypes_match_the_reference_bit_for_bit() {
    for src in DType::ALL {
        let input = cast_inputs(src);
        let n = input.len() / src.size_in_bytes();
        for dst in DType::ALL {
            let out_bytes = n * dst.size_in_bytes();
            // The source one byte into its buffer and the destination 1 to 3 bytes in, so the kernel
            // meets unaligned views; the bytes around the destination must survive.
            let lead = 1 + (src.size_in_bytes() + dst.size_in_bytes()) % 3;
            let Some((ours, theirs)) = on_both(|b| {
                let s = upload_at(b, &input, src.size_in_bytes(), 0);
                let d = upload_at(b, &vec![0x5A; out_bytes], lead, 5);
                let input_view = StridedBuf {
                    ptr: s,
                    layout: torsh_backend::Layout::new(vec![n], vec![1], 1).unwrap(),
                };
                b.cast(&torsh_backend::compute::CastDesc {
                    src_dtype: src,
                    dst_dtype: dst,
                    input: input_view,
                    output: d.offset(lead).unwrap(),
                })
                .unwrap();
                download(b, d, lead + out_bytes + 5)
            }) else {
                return;
            };
            assert_eq!(ours[..lead], theirs[..lead], "{src}→{dst}: bytes before");
            assert_eq!(
                ours[lead + out_bytes..],
                theirs[lead + out_bytes..],
                "{src}→{dst}: after"
            );
            let (o, t) = (
                &ours[lead..lead + out_bytes],
                &theirs[lead..lead + out_bytes],
            );
            for i in 0..n {
                let s = dst.size_in_bytes();
                let (a, e) = (&o[i * s..(i + 1) * s], &t[i * s..(i + 1) * s]);
                // NaN payloads may differ (hardware quiets them); NaN-ness may not.
                let both_nan = element(dst, o, i).is_nan() && element(dst, t, i).is_nan();
                assert!(
                    a == e || both_nan,
                    "{src}→{dst} element {i} (input {:?}): got {a:?}, reference {e:?}",
                    &input[i * src.size_in_bytes()..(i + 1) * src.size_in_bytes()]
                );
            }
        }
    }
}

#[test]
fn strided_copies_of_narrow_dtypes_keep_their_neighbours() {
    // A transposed [5, 7] view of u8 and of f16 copied into every other element of a buffer at an odd
    // address: the skipped elements and the bytes around must stay as they were.
    for dtype in [DType::U8, DType::F16, DType::I64] {
        let size = dtype.size_in_bytes();
        let src_bytes: Vec<u8> = (0..35 * size).map(|i| (i * 37 % 251) as u8).collect();
        let Some((ours, theirs)) = on_both(|b| {
            let s = upload_at(b, &src_bytes, 0, 0);
            let d = upload_at(b, &vec![0x11; 2 * 35 * size], size, 3);
            b.copy_strided(&torsh_backend::compute::CopyDesc {
                dtype,
                src: StridedBuf {
                    ptr: s,
                    layout: torsh_backend::Layout::new(vec![7, 5], vec![1, 7], 0).unwrap(),
                },
                dst: StridedBuf {
                    ptr: d.offset(size).unwrap(),
                    layout: torsh_backend::Layout::new(vec![7, 5], vec![10, 2], 0).unwrap(),
                },
            })
            .unwrap();
            download(b, d, size + 2 * 35 * size + 3)
        }) else {
            return;
        };
        assert_eq!(ours, theirs, "{dtype}");
    }
}

#[test]
fn f16_and_bf16_ops_run_on_f32_copies_and_free_them() {
    if raw().is_none() {
        return;
    }
    // Without shader-f16, so f16 is staged as bf16 is (with it, f16 math runs natively).
    let (_, b) = native_and_staged_f16();
    let reference = Backend::reference().unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let x = b.randn(&[37, 29], DType::F32).unwrap();
        let host = x.to_vec::<f32>().unwrap();
        let xr = reference.from_slice(&host, &[37, 29]).unwrap();
        let before = b.allocated_bytes();
        let run = |x: &torsh_backend::Tensor| {
            let h = x.cast(dtype).unwrap();
            let y = h.matmul(&h.t().unwrap()).unwrap().softmax(1).unwrap();
            let z = y.add(&h.matmul(&h.t().unwrap()).unwrap()).unwrap();
            z.sum(0, false)
                .unwrap()
                .cast(DType::F64)
                .unwrap()
                .to_vec::<f64>()
                .unwrap()
        };
        let (ours, theirs) = (run(&x), run(&xr));
        let e = rel_error(&ours, &theirs);
        assert!(e <= 1e-2, "{dtype}: relative error {e}");
        assert_eq!(
            b.allocated_bytes(),
            before,
            "{dtype}: staged copies were not freed"
        );
    }
}

#[test]
fn staging_keeps_the_gaps_of_a_strided_output_bit_for_bit() {
    // f16 GEMM into C with ldc = m + 3: the three rows past m in each column are not the op's, and
    // hold patterns (a signalling NaN, a subnormal, -0) that must come back unchanged.
    let (m, n, k, ldc) = (5usize, 4usize, 3usize, 8usize);
    let a: Vec<u8> = (0..m * k)
        .flat_map(|i| half::f16::from_f32(i as f32 * 0.25 - 1.0).to_le_bytes())
        .collect();
    let bm: Vec<u8> = (0..k * n)
        .flat_map(|i| half::f16::from_f32(0.5 - i as f32 * 0.125).to_le_bytes())
        .collect();
    let c: Vec<u8> = (0..ldc * n)
        .flat_map(|i| [0x7c01u16, 0x0001, 0x8000][i % 3].to_le_bytes())
        .collect();
    let Some((ours, theirs)) = on_both(|b| {
        let (pa, pb, pc) = (
            upload_at(b, &a, 0, 0),
            upload_at(b, &bm, 0, 0),
            upload_at(b, &c, 0, 0),
        );
        b.gemm(&GemmDesc {
            dtype: DType::F16,
            trans_a: Transpose::No,
            trans_b: Transpose::No,
            m,
            n,
            k,
            alpha: 1.0,
            a: pa,
            lda: m,
            b: pb,
            ldb: k,
            beta: 0.0,
            c: pc,
            ldc,
        })
        .unwrap();
        download(b, pc, c.len())
    }) else {
        return;
    };
    assert_eq!(ours, theirs);
}

#[test]
fn f32_operands_at_unaligned_addresses_are_staged() {
    // exp of f32 values stored 2 bytes into their buffer, written 6 bytes into another.
    let xs: Vec<u8> = (0..101)
        .flat_map(|i| (i as f32 * 0.03 - 1.5).to_le_bytes())
        .collect();
    let Some((ours, theirs)) = on_both(|b| {
        let x = upload_at(b, &xs, 2, 2);
        let y = upload_at(b, &vec![0u8; xs.len()], 6, 2);
        b.unary(&UnaryDesc {
            op: UnaryOp::Exp,
            dtype: DType::F32,
            input: StridedBuf::contiguous(x.offset(2).unwrap(), &[101]),
            output: y.offset(6).unwrap(),
        })
        .unwrap();
        download(b, y, 6 + xs.len() + 2)
    }) else {
        return;
    };
    assert_eq!(ours[..6], theirs[..6]);
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&ours[6..6 + xs.len()]);
    let want: Vec<f32> = bytemuck::pod_collect_to_vec(&theirs[6..6 + xs.len()]);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 4.0 * f32::EPSILON * w.abs(), "{g} vs {w}");
    }
}

#[test]
fn random_fills_follow_the_reference_stream() {
    let Some(b) = backend() else { return };
    let reference = Backend::reference().unwrap();
    for distribution in [
        Distribution::Normal {
            mean: -1.0,
            std: 3.0,
        },
        Distribution::Uniform {
            low: -2.0,
            high: 5.0,
        },
    ] {
        // Many workgroups, and an odd length.
        let draw = |be: &Backend| {
            be.random_seeded(&[300_007], DType::F32, distribution, 99)
                .unwrap()
                .to_vec_f64()
                .unwrap()
        };
        let (ours, theirs) = (draw(&b), draw(&reference));
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(o, t)| (o - t).abs() / t.abs().max(1.0))
            .fold(0.0, f64::max);
        assert!(worst <= 1e-5, "{distribution:?}: worst error {worst}");
        if let Distribution::Uniform { low, high } = distribution {
            assert!(ours.iter().all(|&v| (low..=high).contains(&v)));
        }
    }
}

#[test]
fn f64_math_is_unsupported_but_f64_data_moves() {
    let Some(b) = backend() else { return };
    let x = b.from_slice(&[1.5f64, -2.25, 1e300], &[3]).unwrap();
    let err = x.exp().unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::Unsupported {
                dtype: DType::F64,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        b.matmul(&x.reshape(&[1, 3]).unwrap(), &x.reshape(&[3, 1]).unwrap()),
        Err(BackendError::Unsupported { .. })
    ));
    let back = x
        .cast(DType::F32)
        .unwrap()
        .cast(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    assert_eq!(back, vec![1.5, -2.25, f64::INFINITY]);
    assert_eq!(
        b.full(&[2], 0.1, DType::F64)
            .unwrap()
            .to_vec::<f64>()
            .unwrap(),
        vec![0.1, 0.1]
    );
}

#[test]
fn adapters_can_be_restricted_to_one_api() {
    let Some(b) = raw() else { return };
    let api = b.device_info().api;
    drop(b);
    let on = |api: Option<webgpu::wgpu::Backend>, adapter_index: Option<usize>| {
        let mut b = WebGpuBackend::new(WebGpuBackendConfig {
            api,
            adapter_index,
            ..Default::default()
        });
        b.init().map(|()| b.device_info().api)
    };
    // The best adapter's own API opens it; an API no adapter has is Unavailable, and an index of an
    // adapter of another API is InvalidArgument.
    let adapters = webgpu::block_on(webgpu::enumerate_adapters()).unwrap();
    let own = adapters[0].get_info().backend;
    assert_eq!(on(Some(own), None).unwrap(), api);
    let missing = [
        webgpu::wgpu::Backend::Vulkan,
        webgpu::wgpu::Backend::Metal,
        webgpu::wgpu::Backend::Dx12,
    ]
    .into_iter()
    .find(|&api| adapters.iter().all(|a| a.get_info().backend != api))
    .unwrap();
    let err = on(Some(missing), None).unwrap_err();
    assert!(matches!(err, BackendError::Unavailable { .. }), "{err}");
    let err = on(Some(missing), Some(0)).unwrap_err();
    assert!(matches!(err, BackendError::InvalidArgument { .. }), "{err}");
}

#[test]
fn metal_is_the_webgpu_backend_on_metal_and_refuses_mps() {
    let mps = Backend::metal().enable_mps(true).build();
    let plain = Backend::metal().build();
    if cfg!(target_vendor = "apple") {
        if let Ok(b) = plain {
            assert_eq!(b.device_info().api, "WebGPU on Metal");
            assert!(
                matches!(mps, Err(BackendError::FeatureUnavailable { .. })),
                "{mps:?}"
            );
        }
    } else {
        for r in [mps, plain] {
            match r {
                Err(BackendError::Unavailable { reason, .. }) => {
                    assert!(reason.contains("Apple"), "{reason}")
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
        }
    }
}

#[test]
fn events_mark_the_queue_and_time_it_with_timestamps() {
    let Some(b) = backend() else { return };
    let stream = b.default_stream();
    let x = b.randn(&[256, 256], DType::F32).unwrap();
    let start = stream.record_event().unwrap();
    let mut y = x.clone();
    for _ in 0..4 {
        y = y.matmul(&x).unwrap().tanh().unwrap();
    }
    let end = stream.record_event().unwrap();
    end.synchronize().unwrap();
    assert!(start.is_complete().unwrap() && end.is_complete().unwrap());
    let timed = webgpu::block_on(webgpu::enumerate_adapters()).unwrap()[0]
        .features()
        .contains(webgpu::wgpu::Features::TIMESTAMP_QUERY);
    match start.elapsed_ms(&end) {
        Ok(ms) => {
            assert!(timed);
            // Four 256³ products take measurable device time, and less than a minute.
            assert!(ms > 0.0 && ms < 60_000.0, "{ms} ms");
        }
        Err(e) => {
            assert!(!timed, "{e}");
            assert!(matches!(e, BackendError::FeatureUnavailable { .. }), "{e}");
        }
    }
    // The raw events API refuses ids it never gave out.
    let raw = raw().unwrap();
    let bogus = torsh_backend::compute::EventId(12_345);
    assert!(matches!(
        raw.destroy_event(bogus),
        Err(BackendError::InvalidArgument { .. })
    ));
    assert!(matches!(
        raw.event_synchronize(bogus),
        Err(BackendError::InvalidArgument { .. })
    ));
    let e = raw.record_event().unwrap();
    raw.event_synchronize(e).unwrap();
    raw.destroy_event(e).unwrap();
    assert!(raw.destroy_event(e).is_err());
}

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
fn has_shader_f16() -> bool {
    let device = webgpu::block_on(webgpu::WebGpuDevice::from_best_adapter(0)).unwrap();
    let has = device.features().contains(wgpu::Features::SHADER_F16);
    if !has {
        eprintln!("webgpu: the adapter has no shader-f16; f16 math is staged (tested elsewhere)");
    }
    has
}

/// Two backends on the best adapter: one with every optional feature, so f16 math runs natively,
/// and one without `shader-f16`, so it is staged through f32 copies.
fn native_and_staged_f16() -> (Backend, Backend) {
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
        ]
    };
    for (i, (got, want)) in products(&native).iter().zip(products(&staged)).enumerate() {
        assert_eq!(f16_bits(got), f16_bits(&want), "product {i}");
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

/// A backend, host values and an f32 tensor of them past one binding, or `None` (after saying why)
/// when the adapter's limits leave no room for one. With `lowered`, the backend binds at most that
/// many bytes (`max_binding_size`) and the tensor is 96 KiB past it; without, the adapter's own
/// binding (128 MiB on lavapipe) and 12 MiB past it.
fn larger_than_a_binding(
    lowered: Option<u64>,
) -> Option<(Backend, Vec<f32>, torsh_backend::Tensor)> {
    let probe = raw()?;
    let device = webgpu::block_on(webgpu::WebGpuDevice::from_best_adapter(0)).unwrap();
    let limits = device.limits();
    let own = limits.max_storage_buffer_binding_size;
    let binding = lowered.map_or(own, |l| l.min(own));
    let bytes = binding
        + if lowered.is_some() {
            96 << 10
        } else {
            12 << 20
        };
    if limits.max_buffer_size < bytes || binding > 1 << 30 {
        eprintln!("webgpu: the adapter's binding limit ({binding} bytes) leaves no room to test");
        return None;
    }
    drop(probe);
    let b = match lowered {
        Some(l) => with_binding(l)?,
        None => backend()?,
    };
    let n = (bytes / 4) as usize;
    let host: Vec<f32> = (0..n)
        .map(|i| ((i as f32) * 0.618_034).sin() * 2.0)
        .collect();
    let big = b.from_slice(&host, &[n]).unwrap();
    Some((b, host, big))
}

/// The values of a tensor, as f64.
fn values(t: &torsh_backend::Tensor) -> Vec<f64> {
    t.cast(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// An f32 tensor's values in a tensor of the same shape on `reference`.
fn on_reference(reference: &Backend, t: &torsh_backend::Tensor) -> torsh_backend::Tensor {
    reference
        .from_slice(&t.to_vec::<f32>().unwrap(), t.shape())
        .unwrap()
}

/// Asserts `got` is within 1e-5 of `want` in relative error.
fn check_close(name: &str, got: &torsh_backend::Tensor, want: &torsh_backend::Tensor) {
    let e = rel_error(&values(got), &values(want));
    assert!(e <= 1e-5, "{name}: relative error {e}");
}

#[test]
fn tensors_larger_than_one_binding_run_elementwise_ops_in_pieces_and_views_through_windows() {
    let Some((b, host, big)) = larger_than_a_binding(None) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let n = host.len();
    // Views of the host data on the reference backend, to compare with.
    let on_ref = |start: usize, shape: &[usize]| {
        let len = shape.iter().product::<usize>();
        reference
            .from_slice(&host[start..start + len], shape)
            .unwrap()
    };
    let check = check_close;
    // Dense elementwise ops over the whole tensor run in pieces that each fit a binding; fresh
    // outputs are poisoned, so a piece left unwritten shows.
    let exp = b
        .unary(UnaryOp::Exp, &big)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want: Vec<f64> = host.iter().map(|&x| f64::from(x).exp()).collect();
    let got: Vec<f64> = exp.iter().map(|&x| f64::from(x)).collect();
    assert!(rel_error(&got, &want) <= 1e-6);
    let twice = b.binary(torsh_backend::BinaryOp::Add, &big, &big).unwrap();
    let twice = twice.to_vec::<f32>().unwrap();
    assert!(twice.iter().zip(&host).all(|(t, x)| *t == x + x));
    let halves = big.cast(DType::F16).unwrap().to_vec::<half::f16>().unwrap();
    assert!(halves
        .iter()
        .zip(&host)
        .all(|(h, x)| *h == half::f16::from_f32(*x)));
    let zeros = b.zeros(&[n], DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert!(zeros.iter().all(|&z| z == 0.0));
    drop((exp, twice, halves, zeros));
    // Random fills in pieces continue the stream: element i is the reference's element i (values
    // formed in f32 here, in f64 there), across the piece boundaries.
    b.manual_seed(41);
    reference.manual_seed(41);
    check_close(
        "randn",
        &b.randn(&[n], DType::F32).unwrap(),
        &reference.randn(&[n], DType::F32).unwrap(),
    );

    // Views past the first binding's reach, at an odd element (not on a binding-offset boundary).
    let (rows, cols) = (37, 61);
    let start = n - rows * cols - 5;
    let view = big.narrow(0, start, rows * cols).unwrap();
    let matrix = view.reshape(&[rows, cols]).unwrap();
    let want_matrix = on_ref(start, &[rows, cols]);
    check(
        "exp",
        &b.unary(UnaryOp::Exp, &matrix).unwrap(),
        &reference.unary(UnaryOp::Exp, &want_matrix).unwrap(),
    );
    let other = b.randn(&[rows, cols], DType::F32).unwrap();
    let other_ref = on_reference(&reference, &other);
    check(
        "mul",
        &b.binary(torsh_backend::BinaryOp::Mul, &matrix, &other)
            .unwrap(),
        &reference
            .binary(torsh_backend::BinaryOp::Mul, &want_matrix, &other_ref)
            .unwrap(),
    );
    check(
        "matmul",
        &matrix.matmul(&other.t().unwrap()).unwrap(),
        &want_matrix.matmul(&other_ref.t().unwrap()).unwrap(),
    );
    check(
        "sum",
        &matrix.sum(0, false).unwrap(),
        &want_matrix.sum(0, false).unwrap(),
    );
    check(
        "softmax",
        &matrix.softmax(1).unwrap(),
        &want_matrix.softmax(1).unwrap(),
    );
    check(
        "layer_norm",
        &matrix.layer_norm(&[cols], None, None, 1e-5).unwrap(),
        &want_matrix.layer_norm(&[cols], None, None, 1e-5).unwrap(),
    );
    // A transposed copy and a cast (the strided copy and cast kernels).
    check(
        "contiguous",
        &matrix.t().unwrap().contiguous().unwrap(),
        &want_matrix.t().unwrap().contiguous().unwrap(),
    );
    check(
        "cast",
        &matrix.cast(DType::F16).unwrap(),
        &want_matrix.cast(DType::F16).unwrap(),
    );
    // A view at the very start and one at the very end of the buffer in one op: more than a
    // binding apart, so each is bound through a window of its own.
    let head = big.narrow(0, 0, 7).unwrap();
    let tail = big.narrow(0, n - 7, 7).unwrap();
    let far = b
        .binary(torsh_backend::BinaryOp::Add, &head, &tail)
        .unwrap();
    let want: Vec<f32> = (0..7).map(|i| host[i] + host[n - 7 + i]).collect();
    assert_eq!(far.to_vec::<f32>().unwrap(), want);

    // Writes into the large buffer through a window land where they should and nowhere else.
    let raw = b.compute();
    let len = 1000;
    let at = n - len - 3;
    let src = b.from_slice(&host[..len], &[len]).unwrap();
    let dst = big.data_ptr().offset(at * 4).unwrap();
    raw.unary(&UnaryDesc {
        op: UnaryOp::Neg,
        dtype: DType::F32,
        input: StridedBuf::contiguous(src.data_ptr(), &[len]),
        output: dst,
    })
    .unwrap();
    let after = big
        .narrow(0, at - 5, len + 8)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mut want = host[at - 5..at + len + 3].to_vec();
    for (w, x) in want[5..5 + len].iter_mut().zip(&host[..len]) {
        *w = -x;
    }
    assert_eq!(after, want);
}

#[test]
fn ops_over_all_of_a_tensor_larger_than_one_binding_split_into_pieces_that_fit() {
    // On a binding lowered to 1 MiB: the same code paths as at the adapter's own limit (the
    // elementwise test above runs there), at a size the reference checks in full.
    let Some((b, host, big)) = larger_than_a_binding(Some(1 << 20)) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let n = host.len();
    let check = check_close;
    // Ops made of independent rows split along them: softmax, layer norm and a sum by rows, a GEMM
    // by blocks, Adam by elements; against the reference on all of the tensor.
    let (rows_all, cols_all) = (n / 1024, 1024);
    assert_eq!(rows_all * cols_all, n);
    let all = big.reshape(&[rows_all, cols_all]).unwrap();
    let all_ref = reference.from_slice(&host, &[rows_all, cols_all]).unwrap();
    check(
        "softmax of all",
        &all.softmax(1).unwrap(),
        &all_ref.softmax(1).unwrap(),
    );
    check(
        "layer_norm of all",
        &all.layer_norm(&[cols_all], None, None, 1e-5).unwrap(),
        &all_ref.layer_norm(&[cols_all], None, None, 1e-5).unwrap(),
    );
    check(
        "sum of all rows",
        &all.sum(1, false).unwrap(),
        &all_ref.sum(1, false).unwrap(),
    );
    let w = b.randn(&[cols_all, 3], DType::F32).unwrap();
    let w_ref = on_reference(&reference, &w);
    check(
        "matmul of all",
        &all.matmul(&w).unwrap(),
        &all_ref.matmul(&w_ref).unwrap(),
    );
    // A column sum reads the whole tensor for every output: two passes over blocks of rows.
    check(
        "sum of all columns",
        &all.sum(0, false).unwrap(),
        &all_ref.sum(0, false).unwrap(),
    );
    // Adam updates its parameters in place: on a fresh copy, so `big` keeps the host's values.
    let step = |be: &Backend| {
        let mut params = vec![be.from_slice(&host, &[n]).unwrap()];
        let grads = [be
            .binary_scalar(torsh_backend::BinaryOp::Mul, &params[0], 0.01)
            .unwrap()];
        let mut state = torsh_backend::AdamState::adamw(0.1);
        be.fused_adam_step(&mut params, &grads, &mut state, 1e-3, (0.9, 0.999))
            .unwrap();
        params.pop().unwrap()
    };
    check("adam over all", &step(&b), &step(&reference));

    // Batched and per-image ops split by batch, image, head or channel: a GEMV, a batched GEMM,
    // conv2d, max pooling and causal attention, against the reference on all of it.
    let v = b.randn(&[cols_all], DType::F32).unwrap();
    let v_ref = on_reference(&reference, &v);
    let y = b.randn(&[rows_all], DType::F32).unwrap();
    let y_ref = on_reference(&reference, &y);
    check(
        "gemv of all",
        &all.gemv(&v, 1.0, &y, 0.5).unwrap(),
        &all_ref.gemv(&v_ref, 1.0, &y_ref, 0.5).unwrap(),
    );
    let (batch, side) = (rows_all, 32);
    let cube = big.reshape(&[batch, side, side]).unwrap();
    let cube_ref = reference.from_slice(&host, &[batch, side, side]).unwrap();
    let right = b.randn(&[batch, side, 2], DType::F32).unwrap();
    let right_ref = on_reference(&reference, &right);
    check(
        "batched matmul of all",
        &cube.matmul(&right).unwrap(),
        &cube_ref.matmul(&right_ref).unwrap(),
    );
    let images = big.reshape(&[batch, 1, side, side]).unwrap();
    let images_ref = reference
        .from_slice(&host, &[batch, 1, side, side])
        .unwrap();
    let kernel = b.randn(&[2, 1, 3, 3], DType::F32).unwrap();
    let kernel_ref = on_reference(&reference, &kernel);
    let conv = torsh_backend::ConvConfig::default();
    check(
        "conv2d of all",
        &b.conv2d(&images, &kernel, conv).unwrap(),
        &reference.conv2d(&images_ref, &kernel_ref, conv).unwrap(),
    );
    let pool = torsh_backend::Pool2dConfig {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0],
        count_include_pad: true,
    };
    check(
        "max_pool2d of all",
        &b.max_pool2d(&images, pool).unwrap(),
        &reference.max_pool2d(&images_ref, pool).unwrap(),
    );
    let heads = big.reshape(&[batch / 2, 2, 16, 64]).unwrap();
    let heads_ref = reference
        .from_slice(&host, &[batch / 2, 2, 16, 64])
        .unwrap();
    check(
        "attention of all",
        &b.attention(&heads, &heads, &heads, true).unwrap(),
        &reference
            .attention(&heads_ref, &heads_ref, &heads_ref, true)
            .unwrap(),
    );
}

/// A tensor-level backend whose kernels bind at most `bytes` (`max_binding_size`), so that small
/// tensors take the paths of tensors larger than a binding (windows, pieces, two passes); `None`
/// when there is no adapter.
fn with_binding(bytes: u64) -> Option<Backend> {
    raw()?;
    let config = WebGpuBackendConfig {
        max_binding_size: bytes,
        ..Default::default()
    };
    Some(Backend::from_compute(Box::new(WebGpuBackend::new(config))).unwrap())
}

/// `host` as an f32 tensor of `shape` on `be`, cast to `dtype`.
fn dtype_tensor(
    be: &Backend,
    host: &[f32],
    shape: &[usize],
    dtype: DType,
) -> torsh_backend::Tensor {
    be.from_slice(host, shape).unwrap().cast(dtype).unwrap()
}

/// Asserts `got` matches `want` within `dtype`'s parity bound, NaN for NaN.
fn check_dtype(
    name: &str,
    dtype: DType,
    got: &torsh_backend::Tensor,
    want: &torsh_backend::Tensor,
) {
    let cmp = validation::compare(&values(got), &values(want));
    let bound = validation::tolerance(if got.dtype() == DType::I64 {
        DType::I64
    } else {
        dtype
    });
    assert!(cmp.within(bound), "{name} ({dtype:?}): {cmp}");
}

#[test]
fn max_binding_size_below_the_smallest_supported_is_an_invalid_argument() {
    if raw().is_none() {
        return;
    }
    let mut b = WebGpuBackend::new(WebGpuBackendConfig {
        max_binding_size: webgpu::MIN_BINDING_SIZE - 4,
        ..Default::default()
    });
    let err = b.init().unwrap_err();
    assert!(
        matches!(err, BackendError::InvalidArgument { .. }),
        "{err:?}"
    );
}

#[test]
fn leading_dim_reductions_larger_than_a_binding_combine_partials_of_blocks() {
    let binding = 256 << 10;
    let Some(b) = with_binding(binding) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    // 131 × 1031: 270 KB even in f16, past the 256 KiB binding. Column 5 holds a NaN late (it must
    // win max, min and both arg-reductions), column 7 a tied maximum and minimum in two blocks (the
    // first must win).
    let (rows, cols) = (131, 1031);
    let mut host: Vec<f32> = (0..rows * cols)
        .map(|i| ((i as f32) * 0.754_877_7).sin() * 3.0 + 0.25)
        .collect();
    host[100 * cols + 5] = f32::NAN;
    for r in [3, 90] {
        host[r * cols + 7] = 9.0;
    }
    for r in [11, 120] {
        host[r * cols + 7] = -9.0;
    }
    type Reduction = fn(&torsh_backend::Tensor) -> torsh_backend::Result<torsh_backend::Tensor>;
    let reductions: [(&str, Reduction); 7] = [
        ("sum", |t| t.sum(0, false)),
        ("mean", |t| t.mean(0, false)),
        ("max", |t| t.max(0, false)),
        ("min", |t| t.min(0, false)),
        ("var", |t| t.var(0, 1, false)),
        ("argmax", |t| t.argmax(0, false)),
        ("argmin", |t| t.argmin(0, false)),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let x = dtype_tensor(&b, &host, &[rows, cols], dtype);
        let x_ref = dtype_tensor(&reference, &host, &[rows, cols], dtype);
        // The whole matrix, a view with strided rows, and a 3-D view reduced along its leading dim.
        let views = |t: &torsh_backend::Tensor| {
            [
                t.clone(),
                t.narrow(1, 3, cols - 4).unwrap(),
                t.narrow(1, 0, 1030)
                    .unwrap()
                    .reshape(&[rows, 10, 103])
                    .unwrap(),
            ]
        };
        for (view, (v, v_ref)) in views(&x).iter().zip(views(&x_ref)).enumerate() {
            for (name, reduce) in reductions {
                let name = format!("{name} of view {view}");
                check_dtype(&name, dtype, &reduce(v).unwrap(), &reduce(&v_ref).unwrap());
            }
        }
        // All of a 1-D tensor: its one output from every block.
        let flat = x.reshape(&[rows * cols]).unwrap();
        let flat_ref = x_ref.reshape(&[rows * cols]).unwrap();
        let no_nan = |t: &torsh_backend::Tensor| t.narrow(0, 101 * cols, 30 * cols).unwrap();
        check_dtype(
            "sum of all",
            dtype,
            &no_nan(&flat).sum(0, false).unwrap(),
            &no_nan(&flat_ref).sum(0, false).unwrap(),
        );
    }
    // A captured graph of two-pass reductions replays on new inputs as eager execution does, bit
    // for bit (its host combine runs inside the replay).
    let x = b.from_slice(&host, &[rows, cols]).unwrap();
    let graph = b
        .capture_graph(|| {
            Ok(vec![
                x.sum(0, false)?,
                x.var(0, 1, false)?,
                x.argmax(0, false)?,
            ])
        })
        .unwrap();
    let shifted: Vec<f32> = host.iter().map(|v| v * 0.5 - 1.0).collect();
    let fresh = b.from_slice(&shifted, &[rows, cols]).unwrap();
    let replayed = b
        .launch_graph(&graph, std::slice::from_ref(&fresh))
        .unwrap();
    let eager = [
        fresh.sum(0, false).unwrap(),
        fresh.var(0, 1, false).unwrap(),
        fresh.argmax(0, false).unwrap(),
    ];
    for (r, e) in replayed.iter().zip(&eager) {
        assert_eq!(r.to_bytes().unwrap(), e.to_bytes().unwrap());
    }
}

#[test]
fn reductions_whose_leading_indices_each_exceed_a_binding_cut_the_other_dims() {
    // On a 64 KiB binding, every index of the leading dim below is larger than the binding: along
    // the leading dim the outputs are cut into blocks of dim 1 (or, for [2, 2, 20 011], where even
    // one index of dim 1 is too large, into reductions of a rank less), along other dims each
    // leading index is a reduction of its own (in two passes where that is along its leading dim).
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    type Reduction =
        fn(&torsh_backend::Tensor, isize) -> torsh_backend::Result<torsh_backend::Tensor>;
    let reductions: [(&str, Reduction); 7] = [
        ("sum", |t, d| t.sum(d, false)),
        ("mean", |t, d| t.mean(d, false)),
        ("max", |t, d| t.max(d, false)),
        ("min", |t, d| t.min(d, false)),
        ("var", |t, d| t.var(d, 1, false)),
        ("argmax", |t, d| t.argmax(d, false)),
        ("argmin", |t, d| t.argmin(d, false)),
    ];
    let shapes: [&[usize]; 3] = [&[3, 5, 4099], &[2, 20_011], &[2, 2, 20_011]];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for shape in shapes {
            let len = shape.iter().product();
            let host = wave(len, 0.6);
            let x = dtype_tensor(&b, &host, shape, dtype);
            let x_ref = dtype_tensor(&reference, &host, shape, dtype);
            for axis in 0..shape.len() {
                for (name, reduce) in reductions {
                    let name = format!("{name} of {shape:?} along {axis}");
                    let axis = axis as isize;
                    let got = reduce(&x, axis).unwrap();
                    check_dtype(&name, dtype, &got, &reduce(&x_ref, axis).unwrap());
                }
            }
        }
    }
}

#[test]
fn batch_norm_larger_than_a_binding_normalises_with_statistics_of_every_image() {
    // 37 images of 3 channels of 11 × 97 on a 256 KiB binding: 474 KB in f32, 237 KB in f16 (past
    // the binding once staged or cast to f32). And 3 rows of 12 000 channels on a 64 KiB binding:
    // blocks of one row, each channel's block a single value whose variance is 0 (its unbiased
    // variance 0 / 0), so the batch's variance is all between blocks. Channel means far from zero,
    // and images whose means differ, test the combination of moments.
    for (binding, shape) in [
        (256 << 10, vec![37, 3, 11, 97]),
        (64 << 10, vec![3, 12_000]),
    ] {
        let Some(b) = with_binding(binding) else {
            return;
        };
        let (n, c) = (shape[0], shape[1]);
        let image: usize = shape[1..].iter().product();
        let spatial = image / c;
        let host: Vec<f32> = (0..n * image)
            .map(|i| {
                let (im, ch) = (i / image, (i / spatial) % c);
                let offset = 4.0 * (ch % 3) as f32 - 2.0 + 0.5 * (im % 5) as f32;
                ((i as f32) * 0.381_966).sin() * (1.0 + (ch % 3) as f32) + offset
            })
            .collect();
        // Weight, bias, running mean and running variance (positive), per channel.
        let param = |k: usize| -> Vec<f32> {
            (0..c)
                .map(|ch| {
                    let v = ((ch * 7 + k * 13) as f32 * 0.618_034).sin();
                    if k == 3 {
                        0.5 + v.abs()
                    } else {
                        v * 1.5
                    }
                })
                .collect()
        };
        let params = [param(0), param(1), param(2), param(3)];
        let params = [&params[0][..], &params[1], &params[2], &params[3]];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for training in [true, false] {
                let data = (&host[..], &shape[..], dtype);
                check_batch_norm(&b, "in blocks", data, params, training, 0.3);
            }
        }
    }
}

#[test]
fn native_f16_ops_are_budgeted_without_f32_copies_so_a_tensor_that_fits_runs_whole() {
    if !has_shader_f16() {
        return;
    }
    let binding = 256 << 10;
    let Some(b) = with_binding(binding) else {
        return;
    };
    let exec = webgpu::WebGpuKernelExecutor::new(&b).unwrap();
    let launches = || exec.pipeline_stats().kernel_launches;
    // 0.75 of a binding in f16: whole with shader-f16, where f32 copies would take 1.5 bindings.
    let elements = (binding as usize * 3 / 4) / 2;
    let x = b.randn(&[elements / 1024, 1024], DType::F16).unwrap();
    let before = launches();
    let y = x.softmax(1).unwrap();
    let e = x.exp().unwrap();
    assert_eq!(launches() - before, 2, "softmax and exp, one launch each");
    let reference = Backend::reference().unwrap();
    let x_ref = reference
        .from_slice(&x.to_vec::<half::f16>().unwrap(), x.shape())
        .unwrap();
    check_dtype("softmax", DType::F16, &y, &x_ref.softmax(1).unwrap());
    check_dtype("exp", DType::F16, &e, &x_ref.exp().unwrap());
}

#[test]
fn views_far_apart_in_one_allocation_are_bound_through_windows_of_their_own() {
    let Some(b) = with_binding(256 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    // One flat allocation of 1.2 MB, over four bindings of 256 KiB, as a framework keeps all its
    // parameters; each op below takes views from its far ends and its middle.
    let n = 300_000;
    let host: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.457_1).cos() * 1.5).collect();
    let run = |be: &Backend| {
        let flat = be.from_slice(&host, &[n]).unwrap();
        let a = flat
            .narrow(0, 5, 64 * 48)
            .unwrap()
            .reshape(&[64, 48])
            .unwrap();
        let w = flat
            .narrow(0, n - 48 * 32 - 9, 48 * 32)
            .unwrap()
            .reshape(&[48, 32])
            .unwrap();
        let (gamma, beta) = (
            flat.narrow(0, n / 2, 48).unwrap(),
            flat.narrow(0, n - 48, 48).unwrap(),
        );
        let product = a.matmul(&w).unwrap();
        let normed = a
            .layer_norm(&[48], Some(&gamma), Some(&beta), 1e-5)
            .unwrap();
        let row = flat
            .narrow(0, n - 2 * 48, 48)
            .unwrap()
            .reshape(&[1, 48])
            .unwrap();
        let sum = be.binary(torsh_backend::BinaryOp::Add, &a, &row).unwrap();
        // Adam on parameters at the front of the allocation with gradients at its back, in place.
        let mut params = vec![flat.narrow(0, 11, 5000).unwrap()];
        let grads = [flat.narrow(0, n - 5003, 5000).unwrap()];
        let mut state = torsh_backend::AdamState::adamw(0.01);
        be.fused_adam_step(&mut params, &grads, &mut state, 1e-3, (0.9, 0.999))
            .unwrap();
        [product, normed, sum, flat.narrow(0, 0, 5100).unwrap()]
    };
    let (got, want) = (run(&b), run(&reference));
    for (name, (g, w)) in ["matmul", "layer_norm", "add", "adam"]
        .iter()
        .zip(got.iter().zip(&want))
    {
        check_close(name, g, w);
    }
}

/// `len` values of a fixed pseudo-random sequence in about [-2, 2], none zero in practice.
fn wave(len: usize, phase: f32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as f32) * 0.734_271 + phase).sin() * 2.0 + 0.01)
        .collect()
}

#[test]
fn gemms_whose_operands_each_exceed_a_binding_cut_rows_columns_and_the_inner_dim() {
    // On a 64 KiB binding, A (131 × 257 stored, plus 3 rows of gap) and B (257 × 199, plus 2) are
    // each larger than a binding even in f16, so whichever way they are transposed no block of C
    // alone narrows both: A untransposed and B transposed only narrow along the inner dim. C is a
    // strided block (ldc = m + 5) with beta 0.5, so the 16-bit path's cast of C into f32 and its
    // rounding back through a dense scratch both run.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let (m, n, k) = (131, 199, 257);
    let transposes = [Transpose::No, Transpose::Yes];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (trans_a, trans_b) in transposes
            .iter()
            .flat_map(|&a| transposes.iter().map(move |&b| (a, b)))
        {
            let stored = |t: Transpose, rows: usize, cols: usize| match t {
                Transpose::No => (rows, cols),
                Transpose::Yes => (cols, rows),
            };
            let ((ar, ac), (br, bc)) = (stored(trans_a, m, k), stored(trans_b, k, n));
            let (lda, ldb, ldc) = (ar + 3, br + 2, m + 5);
            let run = |be: &Backend| {
                let a = dtype_tensor(be, &wave(lda * ac, 0.1), &[lda * ac], dtype);
                let bm = dtype_tensor(be, &wave(ldb * bc, 0.7), &[ldb * bc], dtype);
                let c = dtype_tensor(be, &wave(ldc * n, 1.3), &[ldc * n], dtype);
                be.compute()
                    .gemm(&GemmDesc {
                        dtype,
                        trans_a,
                        trans_b,
                        m,
                        n,
                        k,
                        alpha: 1.25,
                        a: a.data_ptr(),
                        lda,
                        b: bm.data_ptr(),
                        ldb,
                        beta: 0.5,
                        c: c.data_ptr(),
                        ldc,
                    })
                    .unwrap();
                c
            };
            let name = format!("gemm {trans_a:?} {trans_b:?}");
            check_dtype(&name, dtype, &run(&b), &run(&reference));
        }
    }
}

#[test]
fn a_16_bit_gemm_cut_along_its_inner_dim_rounds_once_from_f32() {
    // A (8 × 4096, ones) and op(B) (4096 × 8) are each 64 KiB in bf16, past a 64 KiB binding once
    // widened to f32, and only cuts of the inner dim narrow them. Each column of op(B) holds 256,
    // then 4095 values of 1.5 · 2⁻¹²: the exact sum, 257.4996, rounds to 258 in bf16 (its spacing at
    // 256 is 2), while any cut that rounded C after each inner range would add less than 1 to 256 each
    // time and stay at 256.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let (m, n, k) = (8, 8, 4096);
    let ones = vec![1.0f32; m * k];
    let mut column = vec![1.5 * 2f32.powi(-12); k];
    column[0] = 256.0;
    let b_host: Vec<f32> = (0..n).flat_map(|_| column.clone()).collect();
    let a = dtype_tensor(&b, &ones, &[m * k], DType::BF16);
    // B stored n × k column-major (ldb = n): element (j, p) at j + p·n, op(B) = Bᵀ.
    let b_stored: Vec<f32> = (0..k)
        .flat_map(|p| (0..n).map(move |j| (p, j)))
        .map(|(p, j)| b_host[j * k + p])
        .collect();
    let bm = dtype_tensor(&b, &b_stored, &[n * k], DType::BF16);
    let c = b.zeros(&[m * n], DType::BF16).unwrap();
    b.compute()
        .gemm(&GemmDesc {
            dtype: DType::BF16,
            trans_a: Transpose::No,
            trans_b: Transpose::Yes,
            m,
            n,
            k,
            alpha: 1.0,
            a: a.data_ptr(),
            lda: m,
            b: bm.data_ptr(),
            ldb: n,
            beta: 0.0,
            c: c.data_ptr(),
            ldc: m,
        })
        .unwrap();
    let got = c.cast(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert!(got.iter().all(|&v| v == 258.0), "{got:?}");
}

#[test]
fn gemvs_and_batched_gemms_past_a_binding_in_any_direction_run_as_cut_gemms() {
    // On a 64 KiB binding: GEMVs over rows of 20 011 values (80 KB each, so no block of rows fits)
    // and over an untransposed view (rows do not narrow it), and a batched GEMM whose every product
    // is larger than a binding; against the reference, in every float dtype the kernels take.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let tensor = |be: &Backend, shape: &[usize], phase: f32| {
            let len = shape.iter().product();
            dtype_tensor(be, &wave(len, phase), shape, dtype)
        };
        let run = |be: &Backend| {
            let long_rows = tensor(be, &[3, 20_011], 0.2);
            let x = tensor(be, &[20_011], 0.9);
            let y = tensor(be, &[3], 1.7);
            let tall = tensor(be, &[173, 211], 0.4).t().unwrap();
            let (x2, y2) = (tensor(be, &[173], 2.1), tensor(be, &[211], 2.9));
            let left = tensor(be, &[2, 131, 257], 0.5);
            let right = tensor(be, &[2, 257, 199], 1.1);
            [
                long_rows.gemv(&x, 1.5, &y, 0.5).unwrap(),
                tall.gemv(&x2, -0.75, &y2, 2.0).unwrap(),
                left.matmul(&right).unwrap(),
            ]
        };
        let names = ["gemv of long rows", "gemv of a transposed view", "batched"];
        for ((name, got), want) in names.iter().zip(run(&b)).zip(run(&reference)) {
            check_dtype(name, dtype, &got, &want);
        }
    }
}

#[test]
fn convolutions_of_images_larger_than_a_binding_cut_groups_and_channels() {
    // On a 64 KiB binding every image below is larger than a binding (even in f16), so the cut by
    // image cannot fit and each image is cut by channels: a dense convolution by blocks of output
    // and input channels (its partial sums accumulated in f32, the bias added once), a grouped one
    // by blocks of whole groups, a depthwise one likewise; with stride, padding and dilation.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let dense = torsh_backend::ConvConfig {
        stride: [2, 1],
        padding: [1, 2],
        dilation: [1, 2],
        groups: 1,
    };
    let grouped = torsh_backend::ConvConfig {
        padding: [1, 1],
        groups: 3,
        ..Default::default()
    };
    let depthwise = torsh_backend::ConvConfig {
        padding: [1, 1],
        groups: 16,
        ..Default::default()
    };
    let cases: [(&str, [usize; 4], [usize; 4], _); 3] = [
        ("dense", [2, 13, 53, 61], [11, 13, 3, 3], dense),
        ("grouped", [1, 12, 53, 61], [6, 4, 3, 3], grouped),
        ("depthwise", [1, 16, 53, 61], [16, 1, 3, 3], depthwise),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (name, input, weight, config) in cases {
            let run = |be: &Backend| {
                let x = dtype_tensor(be, &wave(input.iter().product(), 0.3), &input, dtype);
                let w = dtype_tensor(be, &wave(weight.iter().product(), 1.9), &weight, dtype);
                let bias = dtype_tensor(be, &wave(weight[0], 2.6), &[weight[0]], dtype);
                be.conv2d_with_bias(&x, &w, Some(&bias), config).unwrap()
            };
            check_dtype(name, dtype, &run(&b), &run(&reference));
        }
    }
    // One channel of one image larger than a binding (200 × 100 f32): no cut fits, the typed error.
    let plane = b.randn(&[1, 1, 200, 100], DType::F32).unwrap();
    let w = b.randn(&[1, 1, 3, 3], DType::F32).unwrap();
    let err = b
        .conv2d(&plane, &w, torsh_backend::ConvConfig::default())
        .unwrap_err();
    assert!(
        matches!(err, BackendError::FeatureUnavailable { .. }),
        "{err:?}"
    );
}

#[test]
fn elementwise_ops_copies_and_casts_whose_leading_indices_each_exceed_a_binding() {
    // On a 64 KiB binding: a unary op, a copy and casts of transposed views whose every row spans
    // 160 KB or more (the copy cut into tiles of both views' widest dims, the others run on such a
    // dense copy), and broadcasting binary ops whose output rows are 80 KB each, each leading index
    // of which runs as an op of one rank less; so no block of leading indices fits any of them.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    use torsh_backend::BinaryOp;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let run = |be: &Backend| {
            let tall = dtype_tensor(be, &wave(2 * 20_011, 0.8), &[20_011, 2], dtype);
            let wide = dtype_tensor(be, &wave(3 * 20_011, 1.4), &[3, 20_011], dtype);
            let row = dtype_tensor(be, &wave(20_011, 2.2), &[1, 20_011], dtype);
            let column = dtype_tensor(be, &wave(3, 3.1), &[3, 1], dtype);
            [
                be.unary(UnaryOp::Exp, &tall.t().unwrap()).unwrap(),
                be.binary(BinaryOp::Add, &wide, &row).unwrap(),
                be.binary(BinaryOp::Mul, &column, &wide).unwrap(),
                be.binary(
                    BinaryOp::Sub,
                    &tall.t().unwrap(),
                    &column.narrow(0, 0, 2).unwrap(),
                )
                .unwrap(),
                tall.t().unwrap().contiguous().unwrap(),
                tall.t().unwrap().cast(DType::F32).unwrap(),
                wide.t().unwrap().cast(DType::BF16).unwrap(),
            ]
        };
        let names = [
            "exp of a transposed view",
            "add a row",
            "mul by a column",
            "sub",
            "copy of a transposed view",
            "cast of a transposed view",
            "cast of another",
        ];
        for ((name, got), want) in names.iter().zip(run(&b)).zip(run(&reference)) {
            check_dtype(name, dtype, &got, &want);
        }
    }
}

#[test]
fn normalisations_whose_single_slice_exceeds_a_binding_are_composed_or_cut_by_channels() {
    // On a 64 KiB binding: softmax and log-softmax of rows of 20 011 values (80 KB each) and over
    // the 7 channels of [2, 7, 3 001] (84 KB per outer slice), layer norm of such rows with weight
    // and bias, each composed of reductions and elementwise ops in f32; batch norm of images of
    // 82 KB (by blocks of channels, copied out of every image in training) and of one channel of
    // 80 KB in inference (by ranges of positions); against the reference in f32, f16 and bf16.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let run = |be: &Backend| {
            let rows = dtype_tensor(be, &wave(2 * 20_011, 0.35), &[2, 20_011], dtype);
            // Logits masked with -inf, as attention masks do: their probabilities are 0.
            let mut masked_host = wave(2 * 20_011, 0.35);
            for i in [5, 9_000, 20_011 + 7] {
                masked_host[i] = f32::NEG_INFINITY;
            }
            let masked = dtype_tensor(be, &masked_host, &[2, 20_011], dtype);
            let channels = dtype_tensor(be, &wave(2 * 7 * 3001, 1.05), &[2, 7, 3001], dtype);
            let weight = dtype_tensor(be, &wave(20_011, 2.45), &[20_011], dtype);
            let bias = dtype_tensor(be, &wave(20_011, 0.15), &[20_011], dtype);
            [
                masked.softmax(1).unwrap(),
                masked.log_softmax(1).unwrap(),
                channels.softmax(1).unwrap(),
                channels.log_softmax(1).unwrap(),
                rows.layer_norm(&[20_011], Some(&weight), Some(&bias), 1e-5)
                    .unwrap(),
            ]
        };
        let names = [
            "softmax of masked rows",
            "log_softmax of masked rows",
            "softmax over channels",
            "log_softmax over channels",
            "layer_norm of rows",
        ];
        for ((name, got), want) in names.iter().zip(run(&b)).zip(run(&reference)) {
            check_dtype(name, dtype, &got, &want);
        }
        for (shape, trainings) in [
            (vec![2, 5, 4099], &[true, false][..]),
            (vec![2, 1, 20_011], &[false][..]),
        ] {
            let (c, len) = (shape[1], shape.iter().product());
            let host: Vec<f32> = wave(len, 0.45)
                .iter()
                .enumerate()
                .map(|(i, v)| v + (i / (len / shape[0])) as f32)
                .collect();
            let param = |k: usize| -> Vec<f32> {
                wave(c, k as f32)
                    .iter()
                    .map(|v| if k == 3 { 0.5 + v.abs() } else { *v })
                    .collect()
            };
            let params = [param(0), param(1), param(2), param(3)];
            let params = [&params[0][..], &params[1], &params[2], &params[3]];
            for &training in trainings {
                let data = (&host[..], &shape[..], dtype);
                check_batch_norm(&b, "of large images", data, params, training, 0.3);
            }
        }
    }
    // Training without running statistics, in two passes over blocks of images ([6, 3, 4099]:
    // each image fits) and by blocks of channels ([2, 5, 4099]); and, with one channel of one
    // image larger than a binding, the typed error.
    let no_stats = torsh_backend::BatchNormConfig {
        weight: None,
        bias: None,
        running_mean: None,
        running_var: None,
        training: true,
        momentum: None,
        eps: None,
    };
    for shape in [[6, 3, 4099], [2, 5, 4099]] {
        let host = wave(shape.iter().product(), 0.85);
        let x = b.from_slice(&host, &shape).unwrap();
        let x_ref = reference.from_slice(&host, &shape).unwrap();
        check_close(
            "batch_norm without running statistics",
            &x.batch_norm(no_stats).unwrap(),
            &x_ref.batch_norm(no_stats).unwrap(),
        );
    }
    let x = b.randn(&[2, 1, 20_011], DType::F32).unwrap();
    let err = x.batch_norm(no_stats).unwrap_err();
    assert!(
        matches!(err, BackendError::FeatureUnavailable { .. }),
        "{err:?}"
    );
}

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
