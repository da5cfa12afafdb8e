//! Building backends: unavailable kinds, bad builder settings, use before `init`.

use super::*;

// ---------------------------------------------------------------------------------------------------
// Construction
// ---------------------------------------------------------------------------------------------------

#[test]
fn unavailable_backends_and_bad_builder_settings() {
    let available = Backend::available();
    for kind in [
        BackendType::Cuda,
        BackendType::WebGpu,
        BackendType::Rocm,
        BackendType::Metal,
    ] {
        if available.contains(&kind) {
            continue;
        }
        let err = assert_err!(Backend::new(kind), Unavailable);
        match &err {
            BackendError::Unavailable { backend, reason } => {
                assert_eq!(*backend, kind);
                assert!(!reason.trim().is_empty(), "{kind}: empty reason");
            }
            other => unreachable!("{other:?}"),
        }
        assert_mentions(&err, &[kind.name(), "unavailable"]);
    }
    if available.contains(&BackendType::Cuda) {
        assert_err!(Backend::cuda().device(1 << 20).build(), InvalidArgument);
    } else {
        assert_err!(Backend::cuda().build(), Unavailable);
        assert_err!(Backend::cuda().device(3).build(), Unavailable);
    }
    if available.contains(&BackendType::WebGpu) {
        assert_err!(Backend::webgpu().device(1 << 20).build(), InvalidArgument);
    } else {
        assert_err!(Backend::webgpu().build(), Unavailable);
    }
    assert_err!(Backend::rocm().build(), Unavailable);
    assert_err!(Backend::metal().build(), Unavailable);
    for status in Backend::probe() {
        if let Err(reason) = &status.availability {
            assert!(
                !reason.trim().is_empty(),
                "{}: empty reason",
                status.backend_type
            );
        }
    }

    let r = Backend::reference().expect("reference");
    let err = assert_err!(r.device(1), InvalidArgument);
    assert_mentions(&err, &["device", "1"]);
    let cpu = Backend::cpu().build().expect("cpu");
    assert_err!(cpu.device(7), InvalidArgument);
    assert_err!(
        BackendBuilder::new()
            .backend_type(BackendType::Reference)
            .device_id(2)
            .build(),
        InvalidArgument
    );
    assert_ok!(r.device(0));

    let err = assert_err!(Backend::cpu().num_threads(0).build(), InvalidArgument);
    assert_mentions(&err, &["num_threads"]);
    assert_err!(
        BackendBuilder::new()
            .backend_type(BackendType::Cpu)
            .num_threads(0)
            .build(),
        InvalidArgument
    );

    // A pool bound is enforced, not ignored: past it, allocations fail with the pool's figures.
    let bounded = assert_ok!(BackendBuilder::new()
        .backend_type(BackendType::Reference)
        .memory_pool_size(1 << 20)
        .build());
    let err = assert_err!(bounded.zeros(&[1 << 20], DType::F32), MemoryPoolExhausted);
    assert_mentions(&err, &["memory pool exhausted", "1048576-byte limit"]);
    assert_backend_works(&bounded);

    assert_backend_works(&r);
    assert_backend_works(&cpu);
}

#[test]
fn use_before_init_is_not_initialized() {
    let mut raw = ReferenceBackend::new(BackendType::Reference);
    assert!(!raw.is_initialized());
    let err = assert_err!(raw.alloc(16), NotInitialized);
    assert_mentions(&err, &["init"]);
    assert_err!(raw.synchronize(), NotInitialized);
    assert_err!(raw.free(DevicePtr(1 << 20)), NotInitialized);
    let p = DevicePtr(1 << 20);
    assert_err!(raw.gemm(&gemm_desc(p, p, p, 0, 0, 0)), NotInitialized);
    assert_ok!(raw.init());
    raw_works(&raw);
}
