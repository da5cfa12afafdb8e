//! CUDA-specific checks. The parity suite (`tests/parity.rs`) runs every op on CUDA wherever a GPU is
//! present; this file holds what must run even without one:
//! - every kernel source compiles under NVRTC for sm_80 and sm_90 wherever `libnvrtc` can be loaded
//!   (pip's `nvidia-cuda-nvrtc` wheel provides it on any x86-64 Linux machine), so a syntax error in a
//!   kernel cannot hide until someone has a GPU. `TORSH_REQUIRE=nvrtc` makes a missing NVRTC a failure;
//! - on a machine without CUDA, asking for the backend is an `Unavailable` error with a reason.
#![cfg(feature = "cuda")]

use torsh_backend::backends::cuda::{self, kernels};
use torsh_backend::{Backend, BackendError, BackendType};

mod common;
use common::required;

#[test]
fn every_kernel_compiles_under_nvrtc_for_sm80_and_sm90() {
    if let Err(reason) = cuda::nvrtc_version() {
        common::skip("nvrtc", format!("NVRTC cannot be loaded: {reason}"));
        return;
    }
    for arch in ["compute_80", "compute_90"] {
        let compiled = kernels::compile_all(arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(compiled.len(), kernels::SOURCES.len());
        for (name, ptx_bytes) in compiled {
            assert!(ptx_bytes > 0, "{name}.cu produced no PTX for {arch}");
        }
    }
}

#[test]
fn a_syntax_error_is_reported_with_nvrtc_log() {
    if let Err(reason) = cuda::nvrtc_version() {
        common::skip("nvrtc", format!("NVRTC cannot be loaded: {reason}"));
        return;
    }
    let err = kernels::compile_source(
        "broken",
        "extern \"C\" __global__ void k() { int x = ; }",
        "compute_80",
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("broken.cu") && text.contains("error"),
        "{text}"
    );
}

#[test]
fn without_cuda_the_backend_is_unavailable_with_a_reason() {
    let Some(reason) = cuda::unavailable_reason() else {
        // A GPU is present: the backend must build.
        let b = Backend::cuda()
            .build()
            .expect("CUDA is available but the backend failed to build");
        assert_eq!(b.backend_type(), BackendType::Cuda);
        return;
    };
    assert!(!required("cuda"), "TORSH_REQUIRE names cuda: {reason}");
    match Backend::cuda().build() {
        Err(BackendError::Unavailable { backend, reason: r }) => {
            assert_eq!(backend, BackendType::Cuda);
            assert_eq!(r, reason);
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let status = Backend::probe()
        .into_iter()
        .find(|s| s.backend_type == BackendType::Cuda)
        .unwrap();
    assert_eq!(status.availability, Err(reason));
    assert_ne!(Backend::auto().unwrap().backend_type(), BackendType::Cuda);
}

/// The CUDA backend, or `None` (after printing why) where this machine has none. With
/// `TORSH_REQUIRE=cuda` a missing GPU fails the test instead.
fn gpu() -> Option<Backend> {
    match Backend::cuda().build() {
        Ok(b) => Some(b),
        Err(e) => {
            common::skip("cuda", e);
            None
        }
    }
}

#[test]
fn devices_are_listed_with_capability_and_sm_count() {
    let Some(b) = gpu() else { return };
    let gpus: Vec<_> = Backend::list_devices()
        .unwrap()
        .into_iter()
        .filter(|d| d.backend_type() == BackendType::Cuda)
        .collect();
    assert!(!gpus.is_empty());
    for (i, d) in gpus.iter().enumerate() {
        assert_eq!(d.id(), i);
        assert!(d.memory_gb() > 0.0, "{d:?}");
        let keys: Vec<&str> = d.details.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            keys.contains(&"compute capability") && keys.contains(&"SMs"),
            "{d:?}"
        );
    }
    assert_eq!(b.device_info().name, gpus[0].name);
    let last = gpus.len() - 1;
    assert_eq!(b.device(last).unwrap().device_info().device.index, last);
    assert!(matches!(
        b.device(gpus.len()),
        Err(BackendError::InvalidArgument { .. })
    ));
    b.synchronize().unwrap();
}

#[test]
fn fresh_memory_is_poisoned_and_freed_blocks_are_reused() {
    let Some(b) = gpu() else { return };
    let c = b.compute();
    let before = c.allocated_bytes().unwrap();
    let p = c.alloc(1000).unwrap();
    let mut bytes = vec![0u8; 1000];
    c.copy_dtoh(&mut bytes, p).unwrap();
    if cfg!(debug_assertions) {
        assert!(
            bytes.iter().all(|&x| x == 0xFF),
            "fresh memory is not poisoned"
        );
    }
    assert_eq!(c.allocated_bytes().unwrap(), before + 1000);
    c.free(p).unwrap();
    assert!(matches!(
        c.free(p),
        Err(BackendError::InvalidPointer { .. })
    ));
    let q = c.alloc(900).unwrap();
    assert_eq!(
        q, p,
        "a freed block of the same size class should be reused"
    );
    c.free(q).unwrap();
    assert_eq!(c.allocated_bytes().unwrap(), before);
}

#[test]
fn copies_round_trip_at_odd_sizes_and_are_bounds_checked() {
    let Some(b) = gpu() else { return };
    let c = b.compute();
    for n in [1usize, 7, 4099, (1 << 20) + 13] {
        let data: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
        let a = c.alloc(n).unwrap();
        let d = c.alloc(n).unwrap();
        c.copy_htod(a, &data).unwrap();
        c.copy_dtod(d, a, n).unwrap();
        let mut back = vec![0u8; n];
        c.copy_dtoh(&mut back, d).unwrap();
        assert_eq!(back, data, "n = {n}");
        assert!(matches!(
            c.copy_htod(a, &vec![0u8; n + 1]),
            Err(BackendError::OutOfBounds { .. })
        ));
        assert!(matches!(
            c.copy_dtod(a, a, n),
            Err(BackendError::Aliasing { .. })
        ));
        c.free(a).unwrap();
        c.free(d).unwrap();
    }
}

#[test]
fn tf32_is_opt_in_and_stays_within_its_precision() {
    let Some(_) = gpu() else { return };
    let reference = Backend::reference().unwrap();
    let (m, k, n) = (67, 129, 33);
    let av: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let bv: Vec<f32> = (0..k * n)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 24.0)
        .collect();
    let want = reference
        .from_slice(&av, &[m, k])
        .unwrap()
        .matmul(&reference.from_slice(&bv, &[k, n]).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let scale = want.iter().fold(0f32, |a, &x| a.max(x.abs()));
    for (tensor_cores, bound) in [(false, 1e-5f32), (true, 2e-2)] {
        let g = Backend::cuda()
            .enable_tensor_cores(tensor_cores)
            .build()
            .unwrap();
        let got = g
            .from_slice(&av, &[m, k])
            .unwrap()
            .matmul(&g.from_slice(&bv, &[k, n]).unwrap())
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs() / scale));
        assert!(worst <= bound, "tensor cores {tensor_cores}: error {worst}");
    }
}

/// `n` values uniform on [-1, 1) from `seed` (SplitMix64), the same on every machine.
fn uniform(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// `(‖got − want‖ / ‖want‖, max |got − want| / max |want|)`; infinite when `got` has a NaN or inf.
fn conv_errors(got: &[f64], want: &[f64]) -> (f64, f64) {
    assert_eq!(got.len(), want.len());
    if got.iter().any(|x| !x.is_finite()) {
        return (f64::INFINITY, f64::INFINITY);
    }
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    let diff = norm(&mut got.iter().zip(want).map(|(a, b)| a - b));
    let worst = got
        .iter()
        .zip(want)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    (diff / norm(&mut want.iter().copied()), worst / scale)
}

/// conv2d with cuDNN (`enable_cudnn(true)`) and with the implicit-GEMM kernel (`enable_cudnn(false)`)
/// against the reference on the same inputs: odd sizes, stride 2, padding, dilation, groups (depthwise
/// included), bias, 1×1, in f32 (bound 1e-5: cuDNN runs FMA math with GEMM-family algorithms only) and
/// f16 (bound 1e-2). Where cuDNN cannot be loaded both backends run the kernel, and the test says so;
/// `TORSH_REQUIRE=cudnn` makes that a failure, and also any call cuDNN declined.
#[test]
fn conv2d_through_cudnn_and_the_kernel_matches_the_reference() {
    use torsh_backend::DType;
    let Some(_) = gpu() else { return };
    let reference = Backend::reference().unwrap();
    let with = Backend::cuda().enable_cudnn(true).build().unwrap();
    let without = Backend::cuda().enable_cudnn(false).build().unwrap();
    let cases = conv_cases();
    for (dtype, bound) in [(DType::F32, 1e-5), (DType::F16, 1e-2)] {
        for (i, &(input, weight, config, has_bias)) in cases.iter().enumerate() {
            let seed = 1000 * i as u64;
            let xv = uniform(input.iter().product(), seed + 1);
            let wv = uniform(weight.iter().product(), seed + 2);
            let bv = uniform(weight[0], seed + 3);
            let run = |b: &Backend| -> Vec<f64> {
                let x = b.from_f64(&xv, &input, dtype).unwrap();
                let w = b.from_f64(&wv, &weight, dtype).unwrap();
                let bias = has_bias.then(|| b.from_f64(&bv, &[weight[0]], dtype).unwrap());
                b.conv2d_with_bias(&x, &w, bias.as_ref(), config)
                    .unwrap()
                    .to_vec_f64()
                    .unwrap()
            };
            let want = run(&reference);
            for (path, b) in [("cuDNN", &with), ("kernel", &without)] {
                let (rel, worst) = conv_errors(&run(b), &want);
                assert!(
                    rel <= bound && worst <= bound,
                    "{path}, {dtype:?}, case {i} ({input:?} * {weight:?}, {config:?}, bias \
                     {has_bias}): relative error {rel:e}, worst {worst:e} > {bound:e}"
                );
            }
        }
    }
    check_conv_path(&with, &without, "conv2d");
}

/// The conv2d path `device_info` reports: the kernel without cuDNN; with it, printed, and under
/// `TORSH_REQUIRE=cudnn` cuDNN 9 with no call declined.
fn check_conv_path(with: &Backend, without: &Backend, what: &str) {
    let conv_path = |b: &Backend| {
        b.device_info()
            .details
            .into_iter()
            .find(|(k, _)| k == "conv2d")
            .map(|(_, v)| v)
            .unwrap_or_default()
    };
    assert_eq!(
        conv_path(without),
        "implicit-GEMM kernel (enable_cudnn(false))"
    );
    let used = conv_path(with);
    eprintln!("{what} with enable_cudnn(true): {used}");
    if required("cudnn") {
        assert!(
            used.starts_with("cuDNN 9.") && used.contains("fell back 0"),
            "TORSH_REQUIRE names cudnn: {used}"
        );
    }
}

/// conv2d's input and weight gradients and the transposed convolution (with a bias of its output
/// channels and an output padding where the stride allows one) through cuDNN's backward-data and
/// backward-filter and through the direct kernels, against the reference on the cases of
/// [`conv_cases`], f32 (1e-5) and f16 (1e-2).
#[test]
fn conv2d_gradients_through_cudnn_and_the_kernels_match_the_reference() {
    use torsh_backend::{ConvTransposeConfig, DType};
    let Some(_) = gpu() else { return };
    let reference = Backend::reference().unwrap();
    let with = Backend::cuda().enable_cudnn(true).build().unwrap();
    let without = Backend::cuda().enable_cudnn(false).build().unwrap();
    for (dtype, bound) in [(DType::F32, 1e-5), (DType::F16, 1e-2)] {
        for (i, &(input, weight, config, _)) in conv_cases().iter().enumerate() {
            let seed = 1000 * i as u64 + 500;
            let xv = uniform(input.iter().product(), seed + 1);
            let wv = uniform(weight.iter().product(), seed + 2);
            let out: [usize; 4] = {
                let x = reference.from_f64(&xv, &input, DType::F32).unwrap();
                let w = reference.from_f64(&wv, &weight, DType::F32).unwrap();
                let y = reference.conv2d(&x, &w, config).unwrap();
                y.shape().try_into().unwrap()
            };
            let gv = uniform(out.iter().product(), seed + 3);
            // A transposed convolution maps `out` back to `input`'s size; its bias has C entries.
            let bv = uniform(input[1], seed + 4);
            // The output padding that brings the transposed convolution back to `input`'s size.
            let reach = |d: usize| {
                (out[d + 2] - 1) * config.stride[d] + config.dilation[d] * (weight[d + 2] - 1) + 1
                    - 2 * config.padding[d]
            };
            let transpose = ConvTransposeConfig {
                stride: config.stride,
                padding: config.padding,
                output_padding: [input[2] - reach(0), input[3] - reach(1)],
                dilation: config.dilation,
                groups: config.groups,
            };
            let run = |b: &Backend| -> [Vec<f64>; 3] {
                let x = b.from_f64(&xv, &input, dtype).unwrap();
                let w = b.from_f64(&wv, &weight, dtype).unwrap();
                let g = b.from_f64(&gv, &out, dtype).unwrap();
                let bias = b.from_f64(&bv, &[input[1]], dtype).unwrap();
                let dx = b.conv2d_backward_input(&g, &w, &input, config).unwrap();
                let dw = b.conv2d_backward_weight(&g, &x, &weight, config).unwrap();
                let t = b.conv_transpose2d(&g, &w, Some(&bias), transpose).unwrap();
                [dx, dw, t].map(|t| t.to_vec_f64().unwrap())
            };
            let want = run(&reference);
            for (path, b) in [("cuDNN", &with), ("kernels", &without)] {
                let got = run(b);
                for (what, (g, w)) in ["input gradient", "weight gradient", "conv_transpose2d"]
                    .iter()
                    .zip(got.iter().zip(&want))
                {
                    let (rel, worst) = conv_errors(g, w);
                    assert!(
                        rel <= bound && worst <= bound,
                        "{path}, {what}, {dtype:?}, case {i} ({input:?} * {weight:?}, \
                         {config:?}): relative error {rel:e}, worst {worst:e} > {bound:e}"
                    );
                }
            }
        }
    }
    check_conv_path(&with, &without, "conv2d gradients");
}

/// The convolutions of the cuDNN tests: input, weight, window, bias. Odd sizes, stride 2, padding,
/// dilation, groups (depthwise included), 1×1, a 5×5 window.
fn conv_cases() -> [([usize; 4], [usize; 4], torsh_backend::ConvConfig, bool); 6] {
    use torsh_backend::ConvConfig;
    let cfg = |stride, padding, dilation, groups| ConvConfig {
        stride,
        padding,
        dilation,
        groups,
    };
    [
        (
            [2, 3, 17, 13],
            [5, 3, 3, 3],
            cfg([2, 2], [1, 1], [1, 1], 1),
            true,
        ),
        (
            [1, 6, 11, 19],
            [9, 2, 3, 5],
            cfg([1, 2], [2, 1], [2, 1], 3),
            true,
        ),
        (
            [3, 4, 10, 9],
            [4, 1, 3, 3],
            cfg([2, 1], [1, 2], [1, 2], 4),
            false,
        ),
        (
            [2, 8, 7, 7],
            [16, 8, 1, 1],
            cfg([1, 1], [0, 0], [1, 1], 1),
            true,
        ),
        (
            [1, 16, 23, 29],
            [32, 16, 3, 3],
            cfg([1, 1], [1, 1], [1, 1], 1),
            true,
        ),
        (
            [2, 5, 8, 8],
            [7, 5, 5, 5],
            cfg([2, 2], [3, 3], [1, 1], 1),
            false,
        ),
    ]
}

/// The cases of the tensor-core attention test: dtype, `[batch, heads, seq_q, head_dim]`, `seq_kv`,
/// causal. Every f16/bf16 case with head_dim 64 or 128 takes the tensor-core kernel on sm_80 and later;
/// the sequence lengths are not multiples of its 64-row tiles (or are exactly one tile).
fn attention_cases() -> Vec<(torsh_backend::DType, [usize; 4], usize, bool)> {
    use torsh_backend::DType;
    let lengths = [1, 17, 64, 129];
    let mut cases = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for head_dim in [64, 128] {
            for seq_q in lengths {
                for seq_kv in lengths {
                    for causal in [false, true] {
                        cases.push((dtype, [1, 2, seq_q, head_dim], seq_kv, causal));
                    }
                }
            }
        }
    }
    cases
}

/// Every case of [`attention_cases`] run on `b`, as f64, in order. Q is scaled by 3 so that the
/// softmax is far from uniform.
fn attention_outputs(b: &Backend) -> Vec<Vec<f64>> {
    attention_cases()
        .iter()
        .enumerate()
        .map(|(i, &(dtype, shape, seq_kv, causal))| {
            let kv_shape = [shape[0], shape[1], seq_kv, shape[3]];
            let seed = 100 * i as u64;
            let qv: Vec<f64> = uniform(shape.iter().product(), seed)
                .iter()
                .map(|x| 3.0 * x)
                .collect();
            let kv = uniform(kv_shape.iter().product(), seed + 1);
            let vv = uniform(kv_shape.iter().product(), seed + 2);
            let q = b.from_f64(&qv, &shape, dtype).unwrap();
            let k = b.from_f64(&kv, &kv_shape, dtype).unwrap();
            let v = b.from_f64(&vv, &kv_shape, dtype).unwrap();
            b.attention(&q, &k, &v, causal)
                .unwrap()
                .to_vec_f64()
                .unwrap()
        })
        .collect()
}

/// Set (to a file path) in the child run of
/// `attention_tensor_cores_match_the_reference_and_the_simt_kernel`: the child writes its outputs there.
const ATTENTION_DUMP: &str = "TORSH_TEST_ATTENTION_DUMP";

/// The tensor-core attention kernel (f16/bf16, head_dim 64 and 128, sm_80 and later) against the
/// reference and against the SIMT kernel on odd sequence lengths, causal and not: norm-wise and
/// worst-element error at most 1e-2 each. The SIMT outputs come from a child run of this test with
/// `TORSH_CUDA_ATTENTION=simt` (the switch is read on every call; setting it here would race with the
/// other tests' threads).
#[test]
fn attention_tensor_cores_match_the_reference_and_the_simt_kernel() {
    let Some(g) = gpu() else { return };
    let got = attention_outputs(&g);
    if let Some(path) = std::env::var_os(ATTENTION_DUMP) {
        let bytes: Vec<u8> = got.iter().flatten().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
        return;
    }
    let name = "attention_tensor_cores_match_the_reference_and_the_simt_kernel";
    let path = std::env::temp_dir().join(format!("torsh-{name}-{}.bin", std::process::id()));
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("TORSH_CUDA_ATTENTION", "simt")
        .env(ATTENTION_DUMP, &path)
        .status()
        .unwrap();
    assert!(status.success(), "the SIMT child run failed: {status}");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let simt: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(simt.len(), got.iter().map(Vec::len).sum::<usize>());

    let want = attention_outputs(&Backend::reference().unwrap());
    let bound = 1e-2;
    let mut offset = 0;
    let mut differ = false;
    for ((case, got), want) in attention_cases().iter().zip(&got).zip(&want) {
        let simt = &simt[offset..offset + got.len()];
        offset += got.len();
        for (what, a, b) in [
            ("default vs reference", got.as_slice(), want.as_slice()),
            ("SIMT vs reference", simt, want.as_slice()),
            ("default vs SIMT", got.as_slice(), simt),
        ] {
            let (rel, worst) = conv_errors(a, b);
            assert!(
                rel <= bound && worst <= bound,
                "{what}, {case:?}: relative error {rel:e}, worst {worst:e} > {bound:e}"
            );
        }
        differ |= got.as_slice() != simt;
    }
    // The tensor-core kernel rounds P to the dtype before P·V, so where it is the default (sm_80 and
    // later, SIMT not forced) its outputs cannot all equal the SIMT kernel's bit for bit.
    let capability = g
        .device_info()
        .details
        .into_iter()
        .find(|(k, _)| k == "compute capability")
        .map(|(_, v)| v)
        .unwrap_or_default();
    let major: i32 = capability
        .split('.')
        .next()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(0);
    let forced = std::env::var("TORSH_CUDA_ATTENTION").is_ok_and(|v| v == "simt");
    eprintln!(
        "attention on compute capability {capability}: tensor-core path {}",
        major >= 8 && !forced
    );
    if major >= 8 && !forced {
        assert!(
            differ,
            "the tensor-core kernel did not run (outputs equal the SIMT kernel's)"
        );
    }
}
