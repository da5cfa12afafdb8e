//! Adapters and device selection: listing, APIs, ROCm and Metal routes, `Backend::auto`, events.

use super::*;

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
