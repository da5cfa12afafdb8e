//! Listing CUDA devices: name, memory, compute capability and SM count, read from the driver.

use cudarc::driver::{result as drv, sys};

use super::loader;
use crate::device::{BackendType, Device, DeviceInfo};
use crate::error::{BackendError, Result};

/// What the backend needs to know about one GPU.
#[derive(Clone, Debug)]
pub(crate) struct GpuProperties {
    /// The driver's device name.
    pub name: String,
    /// Total device memory in bytes.
    pub memory_bytes: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: i32,
}

/// Reads device `ordinal`'s properties. The driver must have been probed successfully.
pub(crate) fn properties(ordinal: usize) -> Result<GpuProperties> {
    let dev =
        drv::device::get(ordinal as i32).map_err(|e| super::driver_error("cuDeviceGet", e))?;
    let attr = |a: sys::CUdevice_attribute| {
        // SAFETY: `dev` is a valid device handle.
        unsafe { drv::device::get_attribute(dev, a) }
            .map_err(|e| super::driver_error("cuDeviceGetAttribute", e))
    };
    use sys::CUdevice_attribute::*;
    Ok(GpuProperties {
        name: drv::device::get_name(dev).map_err(|e| super::driver_error("cuDeviceGetName", e))?,
        // SAFETY: as above.
        memory_bytes: unsafe { drv::device::total_mem(dev) }
            .map_err(|e| super::driver_error("cuDeviceTotalMem", e))? as u64,
        compute_capability: (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        sm_count: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
    })
}

/// The `DeviceInfo` of GPU `ordinal` as every listing shows it.
pub(crate) fn describe(ordinal: usize, props: &GpuProperties) -> DeviceInfo {
    let driver = loader::driver()
        .map(|d| d.driver_version.clone())
        .unwrap_or_default();
    let nvrtc = loader::nvrtc_version()
        .map(|(a, b)| format!("{a}.{b}"))
        .unwrap_or_else(|e| e);
    DeviceInfo {
        device: Device {
            backend_type: BackendType::Cuda,
            index: ordinal,
        },
        name: props.name.clone(),
        memory_bytes: props.memory_bytes,
        api: format!("CUDA driver {driver} (cudarc, loaded at run time)"),
        details: vec![
            (
                "compute capability".into(),
                format!(
                    "{}.{}",
                    props.compute_capability.0, props.compute_capability.1
                ),
            ),
            ("SMs".into(), props.sm_count.to_string()),
            ("NVRTC".into(), nvrtc),
        ],
    }
}

/// Every GPU the driver reports. `Unavailable` with the reason when CUDA cannot run here.
pub(crate) fn list() -> Result<Vec<DeviceInfo>> {
    let status = loader::driver().map_err(|reason| BackendError::Unavailable {
        backend: BackendType::Cuda,
        reason,
    })?;
    (0..status.device_count)
        .map(|i| properties(i).map(|p| describe(i, &p)))
        .collect()
}
