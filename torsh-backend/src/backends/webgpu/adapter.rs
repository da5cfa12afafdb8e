//! Finding WebGPU adapters: one wgpu instance per process over the native APIs (Vulkan, Metal, DX12),
//! the adapters it sees, their ranking, and what `list_devices` shows of each.

use std::sync::OnceLock;

use crate::device::{BackendType, Device, DeviceInfo};
use crate::error::{BackendError, Result};

use super::context::block_on;

/// The native APIs the backend asks wgpu for. GLES is left out: its compute support is too partial
/// for the kernels here.
pub(crate) const NATIVE_APIS: wgpu::Backends = wgpu::Backends::VULKAN
    .union(wgpu::Backends::METAL)
    .union(wgpu::Backends::DX12);

/// The process-wide wgpu instance. Creating one loads the Vulkan loader (and the others) once;
/// adapters and devices made from it live as long as they are used.
pub(crate) fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = NATIVE_APIS;
        // No validation layers by default; wgpu's WGPU_VALIDATION / WGPU_DEBUG variables turn them on.
        desc.flags = wgpu::InstanceFlags::empty().with_env();
        wgpu::Instance::new(desc)
    })
}

/// Every adapter wgpu finds on the native APIs, best first: discrete GPUs, then integrated, virtual,
/// other, and CPU implementations last; Vulkan first among APIs. Empty when there is no
/// Vulkan, Metal or DX12 driver.
pub async fn enumerate_adapters() -> Result<Vec<wgpu::Adapter>> {
    let mut adapters = instance().enumerate_adapters(NATIVE_APIS).await;
    adapters.sort_by_key(|a| rank(&a.get_info()));
    Ok(adapters)
}

/// The adapters, best first, enumerated once per process (drivers can print on every enumeration,
/// and it costs milliseconds); wgpu's native futures complete at once, so no executor is needed.
pub(crate) fn adapters() -> Vec<wgpu::Adapter> {
    static ADAPTERS: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    ADAPTERS
        .get_or_init(|| {
            // A driver that makes wgpu panic while enumerating means no usable adapter, not a crash.
            std::panic::catch_unwind(|| block_on(enumerate_adapters()))
                .ok()
                .and_then(|r| r.ok())
                .unwrap_or_default()
        })
        .clone()
}

/// The adapter's descriptive fields: name, vendor, device, type, driver and backend.
pub fn get_adapter_info(adapter: &wgpu::Adapter) -> wgpu::AdapterInfo {
    adapter.get_info()
}

/// True when wgpu finds at least one adapter (a GPU, or a CPU implementation such as lavapipe).
pub fn is_available() -> bool {
    !adapters().is_empty()
}

/// Sort key of an adapter: discrete GPUs first, then integrated, virtual, other, and CPU
/// implementations last; Vulkan before the other APIs for the same kind.
pub(crate) fn rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let api = match info.backend {
        wgpu::Backend::Vulkan => 0,
        wgpu::Backend::Metal => 1,
        wgpu::Backend::Dx12 => 2,
        _ => 3,
    };
    (kind, api)
}

/// True for a hardware GPU (discrete, integrated or virtual), which `Backend::auto` may prefer to
/// the CPU backend; a CPU implementation of Vulkan is slower than the native CPU kernels.
pub(crate) fn is_hardware_gpu(info: &wgpu::AdapterInfo) -> bool {
    matches!(
        info.device_type,
        wgpu::DeviceType::DiscreteGpu
            | wgpu::DeviceType::IntegratedGpu
            | wgpu::DeviceType::VirtualGpu
    )
}

/// Whether the best ranked adapter (the one a default backend opens) is a hardware GPU.
pub(crate) fn has_hardware_gpu() -> bool {
    adapters()
        .first()
        .is_some_and(|a| is_hardware_gpu(&a.get_info()))
}

/// Why no adapter of `api` can run here, or `None` when wgpu found one.
pub(crate) fn api_unavailable_reason(api: wgpu::Backend) -> Option<String> {
    if adapters().iter().any(|a| a.get_info().backend == api) {
        return None;
    }
    Some(format!("wgpu found no {} adapter", api_name(api)))
}

/// Why the WebGPU backend cannot run here, or `None` when some adapter exists.
pub(crate) fn unavailable_reason() -> Option<String> {
    if adapters().is_empty() {
        Some(
            "wgpu found no Vulkan, Metal or DX12 adapter: install a GPU driver with Vulkan support \
             (on Linux without a GPU, Mesa's lavapipe: `apt-get install mesa-vulkan-drivers libvulkan1`)"
                .into(),
        )
    } else {
        None
    }
}

/// The API name of a wgpu backend, as `devices` shows it.
pub(crate) fn api_name(backend: wgpu::Backend) -> &'static str {
    match backend {
        wgpu::Backend::Vulkan => "Vulkan",
        wgpu::Backend::Metal => "Metal",
        wgpu::Backend::Dx12 => "DX12",
        wgpu::Backend::Gl => "GLES",
        wgpu::Backend::BrowserWebGpu => "browser WebGPU",
        _ => "none",
    }
}

/// The kind of device in words.
fn kind_name(kind: wgpu::DeviceType) -> &'static str {
    match kind {
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Cpu => "CPU (software implementation)",
        wgpu::DeviceType::Other => "other",
    }
}

/// What `list_devices` shows of adapter `index`: name, API, kind, driver and the limits the backend
/// relies on. wgpu does not report memory sizes; `memory_bytes` is the largest buffer the adapter
/// allows.
pub(crate) fn describe(index: usize, adapter: &wgpu::Adapter) -> DeviceInfo {
    let info = adapter.get_info();
    let limits = adapter.limits();
    let features = adapter.features();
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let mut details = vec![
        ("kind".to_string(), kind_name(info.device_type).to_string()),
        (
            "driver".to_string(),
            format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
        ),
        (
            "max buffer".to_string(),
            format!("{} MiB", limits.max_buffer_size >> 20),
        ),
        (
            "max storage binding".to_string(),
            format!("{} MiB", limits.max_storage_buffer_binding_size >> 20),
        ),
        (
            "max workgroup".to_string(),
            format!(
                "{} invocations, {} bytes shared",
                limits.max_compute_invocations_per_workgroup,
                limits.max_compute_workgroup_storage_size
            ),
        ),
        (
            "shader f16".to_string(),
            yes_no(features.contains(wgpu::Features::SHADER_F16)),
        ),
        (
            "subgroups".to_string(),
            yes_no(features.contains(wgpu::Features::SUBGROUP)),
        ),
        (
            "timestamp queries".to_string(),
            yes_no(features.contains(wgpu::Features::TIMESTAMP_QUERY)),
        ),
    ];
    let auto = if !is_hardware_gpu(&info) {
        "not chosen by Backend::auto (a CPU implementation; the CPU backend is faster)"
    } else if index == 0 {
        "chosen by Backend::auto when no CUDA, ROCm or Metal backend runs"
    } else {
        "not chosen by Backend::auto (it opens the best ranked adapter, [0])"
    };
    details.push(("auto".to_string(), auto.into()));
    DeviceInfo {
        device: Device {
            backend_type: BackendType::WebGpu,
            index,
        },
        name: info.name.clone(),
        memory_bytes: limits.max_buffer_size,
        api: format!("WebGPU on {}", api_name(info.backend)),
        details,
    }
}

/// Every adapter as a `DeviceInfo`, best first.
pub(crate) fn list_devices() -> Result<Vec<DeviceInfo>> {
    Ok(adapters()
        .iter()
        .enumerate()
        .map(|(i, a)| describe(i, a))
        .collect())
}

/// Adapter `index` in rank order, or `InvalidArgument` naming how many there are.
pub(crate) fn adapter_at(index: usize) -> Result<wgpu::Adapter> {
    let mut all = adapters();
    if index >= all.len() {
        return Err(BackendError::invalid(
            "webgpu device",
            format!(
                "device index {index} is out of range: wgpu found {} adapter(s)",
                all.len()
            ),
        ));
    }
    Ok(all.swap_remove(index))
}
