//! The public API: its documented snippets (those that need no GPU and no runtime service), run on
//! the CPU backend, and the tensor API's behaviour on small, hand-checked values.

use torsh_backend::prelude::*;

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// The CPU backend and the reference: every body below runs on both.
fn both() -> torsh_backend::Result<Vec<Backend>> {
    Ok(vec![Backend::cpu().build()?, Backend::reference()?])
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
fn seed_architecture_snippet() -> TestResult {
    // `use torsh_backends::{Backend, BackendType, Device};` — the library is `torsh_backend`.
    use torsh_backend::{Backend, BackendType, Device};
    let backend = Backend::new(BackendType::Auto)?;
    let device: Device = backend.randn(&[2], DType::F32)?.device();
    assert_eq!(device.backend_type, backend.backend_type());
    // Explicit CUDA and Metal: on a machine without them this is `Unavailable` with a reason.
    for kind in [BackendType::Cuda, BackendType::Metal] {
        match Backend::new(kind) {
            Ok(b) => assert_eq!(b.backend_type(), kind),
            Err(BackendError::Unavailable { backend, reason }) => {
                assert_eq!(backend, kind);
                assert!(!reason.is_empty());
            }
            Err(e) => panic!("unexpected error for {kind}: {e}"),
        }
    }
    Ok(())
}

#[test]
fn seed_unified_backend_snippet() -> TestResult {
    let backend = Backend::auto()?;
    for backend_type in Backend::available() {
        println!("Available: {:?}", backend_type);
    }
    assert!(Backend::available().contains(&BackendType::Cpu));
    // The builder of the seed asks for CUDA and a 4 GiB pool bound; without a GPU, CUDA says it is
    // unavailable instead of being ignored.
    let built = BackendBuilder::new()
        .backend_type(BackendType::Cuda)
        .device_id(0)
        .memory_pool_size(4 * 1024 * 1024 * 1024)
        .enable_tensor_cores(true)
        .build();
    if !Backend::available().contains(&BackendType::Cuda) {
        assert!(built.is_err());
    }
    let cpu = BackendBuilder::new()
        .backend_type(BackendType::Cpu)
        .device_id(0)
        .enable_tensor_cores(true)
        .build()?;
    assert_eq!(cpu.backend_type(), BackendType::Cpu);
    // All backends use the same API.
    let a = backend.randn(&[64, 48], DType::F32)?;
    let b = backend.randn(&[48, 32], DType::F32)?;
    let c = backend.matmul(&a, &b)?;
    assert_eq!(c.shape(), &[64, 32]);
    Ok(())
}

#[test]
fn seed_cpu_snippet() -> TestResult {
    let cpu_backend = Backend::cpu().num_threads(8).enable_simd(true).build()?;
    let a = cpu_backend.randn(&[16, 8], DType::F32)?;
    let b = cpu_backend.randn(&[8, 4], DType::F32)?;
    let c = cpu_backend.randn(&[16, 4], DType::F32)?;
    let result = cpu_backend.gemm(&a, &b, 1.0, &c, 0.0)?;
    let expected = cpu_backend.matmul(&a, &b)?;
    assert!(close(&result.to_vec_f64()?, &expected.to_vec_f64()?, 1e-6));
    let info = cpu_backend.device_info();
    assert!(info
        .details
        .iter()
        .any(|(k, v)| k == "threads requested" && v == "8"));
    Ok(())
}

#[test]
fn seed_conv_snippet_on_cpu() -> TestResult {
    // The Metal snippet's call, on the CPU.
    let backend = Backend::cpu().build()?;
    let input = backend.randn(&[1, 3, 8, 8], DType::F32)?;
    let kernel = backend.randn(&[4, 3, 3, 3], DType::F32)?;
    let result = backend.conv2d(
        &input,
        &kernel,
        ConvConfig {
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
        },
    )?;
    assert_eq!(result.shape(), &[1, 4, 8, 8]);
    Ok(())
}

#[test]
fn seed_unified_operations_signatures() -> TestResult {
    for backend in both()? {
        seed_unified_operations_signatures_on(&backend)?;
    }
    Ok(())
}

fn seed_unified_operations_signatures_on(backend: &Backend) -> TestResult {
    let a = backend.randn(&[5, 3], DType::F32)?;
    let x = backend.randn(&[3], DType::F32)?;
    let y = backend.randn(&[5], DType::F32)?;
    let _ = backend.gemv(&a, &x, 1.0, &y, 0.5)?;
    let input = backend.randn(&[4, 2, 3], DType::F32)?;
    let mean = backend.zeros(&[2], DType::F32)?;
    let var = backend.ones(&[2], DType::F32)?;
    let _ = backend.batch_norm(&input, &mean, &var, true)?;
    let mut params = vec![backend.randn(&[3, 3], DType::F32)?];
    let grads = vec![backend.randn(&[3, 3], DType::F32)?];
    let mut state = AdamState::adam();
    backend.fused_adam_step(&mut params, &grads, &mut state, 1e-3, (0.9, 0.999))?;
    assert_eq!(state.step(), 1);
    Ok(())
}

#[test]
fn seed_device_management_snippet() -> TestResult {
    let devices = Backend::list_devices()?;
    for device in &devices {
        println!(
            "{}: {} ({}GB memory)",
            device.id(),
            device.name(),
            device.memory_gb()
        );
    }
    assert!(devices.iter().any(|d| d.backend_type() == BackendType::Cpu));
    // Multi-device: CUDA exists exactly where a device of it is listed; the CPU has one device.
    let cuda_listed = devices
        .iter()
        .any(|d| d.backend_type() == BackendType::Cuda);
    match Backend::new(BackendType::Cuda) {
        Ok(_) => assert!(cuda_listed, "CUDA built but lists no device"),
        Err(BackendError::Unavailable { .. }) => assert!(!cuda_listed),
        Err(e) => panic!("unexpected error for CUDA: {e}"),
    }
    let backend = Backend::new(BackendType::Cpu)?.device(0)?;
    backend.synchronize()?;
    Ok(())
}

#[test]
fn small_products_by_hand() -> TestResult {
    for backend in both()? {
        small_products_by_hand_on(&backend)?;
    }
    Ok(())
}

fn small_products_by_hand_on(b: &Backend) -> TestResult {
    let x = b.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    let y = b.from_slice(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2])?;
    assert_eq!(x.matmul(&y)?.to_vec::<f32>()?, vec![19.0, 22.0, 43.0, 50.0]);
    // xᵀ as a view, no copy by the caller.
    assert_eq!(
        x.t()?.matmul(&y)?.to_vec::<f32>()?,
        vec![26.0, 30.0, 38.0, 44.0]
    );
    // gemm with alpha and beta, and a broadcast c.
    let c = b.from_slice(&[1.0f32, -1.0], &[2])?;
    assert_eq!(
        b.gemm(&x, &y, 2.0, &c, 3.0)?.to_vec::<f32>()?,
        vec![41.0, 41.0, 89.0, 97.0]
    );
    let v = b.from_slice(&[1.0f32, 1.0], &[2])?;
    assert_eq!(
        b.gemv(&x, &v, 1.0, &c, -1.0)?.to_vec::<f32>()?,
        vec![2.0, 8.0]
    );
    assert_eq!(v.matmul(&v)?.shape(), &[] as &[usize]);
    assert_eq!(v.matmul(&v)?.item()?, 2.0);
    Ok(())
}

#[test]
fn views_constructors_and_copies() -> TestResult {
    for backend in both()? {
        views_constructors_and_copies_on(&backend)?;
    }
    Ok(())
}

fn views_constructors_and_copies_on(b: &Backend) -> TestResult {
    let t = b.arange(0.0, 6.0, 1.0, DType::F64)?.reshape(&[2, 3])?;
    assert_eq!(
        t.transpose(0, 1)?.contiguous()?.to_vec::<f64>()?,
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    assert_eq!(
        t.narrow(1, 1, 2)?.to_vec::<f64>()?,
        vec![1.0, 2.0, 4.0, 5.0]
    );
    assert_eq!(t.reshape_infer(&[-1])?.shape(), &[6]);
    assert_eq!(
        t.permute(&[1, 0])?.reshape(&[6])?.to_vec::<f64>()?,
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    assert_eq!(
        b.from_slice(&[7.0f64], &[1])?
            .broadcast_to(&[2, 2])?
            .to_vec::<f64>()?,
        vec![7.0; 4]
    );
    assert_eq!(
        b.full(&[2], -2.5, DType::F16)?.to_vec::<f16>()?,
        vec![f16::from_f64(-2.5); 2]
    );
    assert_eq!(b.ones(&[3], DType::I32)?.to_vec::<i32>()?, vec![1, 1, 1]);
    assert_eq!(
        b.zeros(&[2], DType::BF16)?.to_vec::<bf16>()?,
        vec![bf16::ZERO; 2]
    );
    // Casts: float → int truncates toward zero and saturates; int → int wraps.
    let f = b.from_slice(&[-1.7f32, 2.9, 300.0, f32::NAN], &[4])?;
    assert_eq!(f.cast(DType::I32)?.to_vec::<i32>()?, vec![-1, 2, 300, 0]);
    assert_eq!(f.cast(DType::U8)?.to_vec::<u8>()?, vec![0, 2, 255, 0]);
    assert_eq!(
        b.from_slice(&[257i64, -1], &[2])?
            .cast(DType::U8)?
            .to_vec::<u8>()?,
        vec![1, 255]
    );
    // Another backend instance: `to` copies.
    let other = Backend::reference()?;
    let moved = t.to(&other)?;
    assert!(moved.backend().same_instance(&other));
    assert_eq!(moved.to_vec::<f64>()?, t.to_vec::<f64>()?);
    // In-place copy into a strided view.
    let dst = b.zeros(&[3, 2], DType::F64)?;
    dst.t()?.copy_from(&t)?;
    assert_eq!(dst.to_vec::<f64>()?, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    Ok(())
}

#[test]
fn random_streams_are_seeded_and_shared_across_backends() -> TestResult {
    for backend in both()? {
        random_streams_are_seeded_and_shared_across_backends_on(&backend)?;
    }
    Ok(())
}

fn random_streams_are_seeded_and_shared_across_backends_on(cpu: &Backend) -> TestResult {
    let reference = Backend::reference()?;
    cpu.manual_seed(11);
    reference.manual_seed(11);
    let a = cpu.randn(&[100], DType::F32)?.to_vec::<f32>()?;
    let b = reference.randn(&[100], DType::F32)?.to_vec::<f32>()?;
    assert_eq!(a, b);
    let c = cpu.randn(&[100], DType::F32)?.to_vec::<f32>()?;
    assert_ne!(a, c, "consecutive draws differ");
    cpu.manual_seed(11);
    assert_eq!(cpu.randn(&[100], DType::F32)?.to_vec::<f32>()?, a);
    let u = cpu.rand(&[1000], DType::F64)?.to_vec::<f64>()?;
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    assert!(a.iter().all(|x| x.is_finite()) && a.iter().any(|&x| x != 0.0));
    Ok(())
}

#[test]
fn reductions_softmax_and_norms() -> TestResult {
    for backend in both()? {
        reductions_softmax_and_norms_on(&backend)?;
    }
    Ok(())
}

fn reductions_softmax_and_norms_on(b: &Backend) -> TestResult {
    let x = b.from_slice(&[1.0f64, 5.0, 3.0, 2.0, 0.0, 4.0], &[2, 3])?;
    assert_eq!(x.sum(1, false)?.to_vec::<f64>()?, vec![9.0, 6.0]);
    assert_eq!(x.sum(0, true)?.shape(), &[1, 3]);
    assert_eq!(x.max(-1, false)?.to_vec::<f64>()?, vec![5.0, 4.0]);
    assert_eq!(x.argmax(1, false)?.to_vec::<i64>()?, vec![1, 2]);
    assert_eq!(x.argmin(0, false)?.to_vec::<i64>()?, vec![0, 1, 0]);
    assert_eq!(x.var(1, 1, false)?.to_vec::<f64>()?, vec![4.0, 4.0]);
    assert_eq!(x.mean_all()?.item()?, 2.5);
    let s = x.softmax(1)?.sum(1, false)?.to_vec::<f64>()?;
    assert!(close(&s, &[1.0, 1.0], 1e-15));
    let ls = x.log_softmax(0)?.exp()?.sum(0, false)?.to_vec::<f64>()?;
    assert!(close(&ls, &[1.0, 1.0, 1.0], 1e-15));
    let ln = x.layer_norm(&[3], None, None, 0.0)?;
    let m = ln.mean(1, false)?.to_vec::<f64>()?;
    assert!(close(&m, &[0.0, 0.0], 1e-15));
    // Batch norm in training moves the running statistics by momentum.
    let input = b.from_slice(&[1.0f64, 3.0, 5.0, 7.0], &[2, 2])?; // channel 0: {1, 5}, channel 1: {3, 7}
    let rm = b.zeros(&[2], DType::F64)?;
    let rv = b.ones(&[2], DType::F64)?;
    let out = b.batch_norm(&input, &rm, &rv, true)?;
    assert!(close(&rm.to_vec::<f64>()?, &[0.3, 0.5], 1e-15));
    assert!(close(
        &rv.to_vec::<f64>()?,
        &[0.9 + 0.1 * 8.0, 0.9 + 0.1 * 8.0],
        1e-15
    ));
    assert!(close(&out.to_vec::<f64>()?, &[-1.0, -1.0, 1.0, 1.0], 1e-5));
    Ok(())
}

#[test]
fn attention_with_one_key_returns_the_value() -> TestResult {
    for backend in both()? {
        attention_with_one_key_returns_the_value_on(&backend)?;
    }
    Ok(())
}

fn attention_with_one_key_returns_the_value_on(b: &Backend) -> TestResult {
    let q = b.randn(&[1, 2, 3, 4], DType::F32)?;
    let k = b.randn(&[1, 2, 1, 4], DType::F32)?;
    let v = b.randn(&[1, 2, 1, 4], DType::F32)?;
    let o = b.attention(&q, &k, &v, false)?;
    let vv = v.to_vec::<f32>()?;
    let mut expect = Vec::new();
    for h in 0..2 {
        for _query in 0..3 {
            expect.extend_from_slice(&vv[h * 4..h * 4 + 4]);
        }
    }
    assert_eq!(o.to_vec::<f32>()?, expect);
    // Causal: the first query sees only the first key.
    let kk = b.randn(&[1, 2, 5, 4], DType::F32)?;
    let vv5 = b.randn(&[1, 2, 5, 4], DType::F32)?;
    let oc = b.attention(&q, &kk, &vv5, true)?.to_vec::<f32>()?;
    let v5 = vv5.to_vec::<f32>()?;
    assert_eq!(&oc[..4], &v5[..4]);
    Ok(())
}

#[test]
fn pooling_by_hand() -> TestResult {
    for backend in both()? {
        pooling_by_hand_on(&backend)?;
    }
    Ok(())
}

fn pooling_by_hand_on(b: &Backend) -> TestResult {
    let x = b
        .arange(0.0, 16.0, 1.0, DType::F32)?
        .reshape(&[1, 1, 4, 4])?;
    assert_eq!(
        x.max_pool2d(Pool2dConfig::new([2, 2]))?.to_vec::<f32>()?,
        vec![5.0, 7.0, 13.0, 15.0]
    );
    assert_eq!(
        x.avg_pool2d(Pool2dConfig::new([2, 2]))?.to_vec::<f32>()?,
        vec![2.5, 4.5, 10.5, 12.5]
    );
    Ok(())
}

#[test]
fn memory_returns_on_drop() -> TestResult {
    for backend in both()? {
        memory_returns_on_drop_on(&backend)?;
    }
    Ok(())
}

fn memory_returns_on_drop_on(backend: &Backend) -> TestResult {
    assert_eq!(backend.allocated_bytes(), Some(0));
    {
        let a = backend.randn(&[32, 32], DType::F32)?;
        let b = a.matmul(&a.t()?)?.relu()?;
        let view = a.narrow(0, 1, 3)?;
        assert_eq!(backend.allocated_bytes(), Some(2 * 32 * 32 * 4));
        drop(a);
        assert_eq!(
            backend.allocated_bytes(),
            Some(2 * 32 * 32 * 4),
            "the view keeps a's memory alive"
        );
        drop(view);
        assert_eq!(backend.allocated_bytes(), Some(32 * 32 * 4));
        drop(b);
    }
    assert_eq!(backend.allocated_bytes(), Some(0));
    Ok(())
}

#[test]
fn a_custom_compute_backend_plugs_in() -> TestResult {
    use torsh_backend::backends::reference::ReferenceBackend;
    // Any ComputeBackend can serve the tensor API; the crate cannot build more devices of it.
    let custom = Backend::from_compute(Box::new(ReferenceBackend::new(BackendType::Reference)))?;
    let x = custom.from_slice(&[1.0f32, -2.0], &[2])?;
    assert_eq!(x.relu()?.to_vec::<f32>()?, vec![1.0, 0.0]);
    assert!(matches!(
        custom.device(0),
        Err(BackendError::InvalidArgument { .. })
    ));
    Ok(())
}

#[test]
fn host_buffers_too_large_for_memory_are_typed_errors() -> TestResult {
    let b = Backend::cpu().build()?;
    // 1e15 elements: the host staging vector cannot exist; the answer is an error, not an abort.
    let r = b.arange(0.0, 1e15, 1.0, DType::F32);
    assert!(matches!(r, Err(BackendError::OutOfMemory { .. })), "{r:?}");
    assert_eq!(b.allocated_bytes(), Some(0));
    Ok(())
}
