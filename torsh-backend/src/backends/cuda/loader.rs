//! Finding CUDA at run time. cudarc panics when a library it needs cannot be opened, so every library is
//! probed with `dlopen` first and its absence becomes a reason string a user can act on. Probes run once
//! per process; their answers are cached.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use cudarc::driver::result as drv;

/// How to make a missing toolkit library (`pip` package name as argument) visible to the loader.
fn toolkit_hint(pip_package: &str) -> String {
    format!(
        "install the CUDA toolkit or `pip install {pip_package}`, and put the folder holding the library \
         on LD_LIBRARY_PATH"
    )
}

/// Runs a cudarc call that may panic (a library or symbol missing) and turns the panic into a message.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let detail = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("unknown failure");
        format!("{what} failed: {detail}")
    })
}

/// What the probe found: the number of devices and the driver's CUDA version, or why CUDA cannot run.
#[derive(Clone, Debug)]
pub(crate) struct DriverStatus {
    /// GPUs the driver reports.
    pub device_count: usize,
    /// The driver's CUDA version as `major.minor`.
    pub driver_version: String,
}

/// The driver probe: `libcuda.so.1` present, `cuInit` succeeds, at least one device.
pub(crate) fn driver() -> Result<&'static DriverStatus, String> {
    static PROBE: OnceLock<Result<DriverStatus, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err(
                    "the NVIDIA driver library (libcuda.so.1) was not found: this machine has no NVIDIA \
                     driver installed, or the driver's library folder is not on LD_LIBRARY_PATH"
                        .into(),
                );
            }
            guarded("initialising the CUDA driver", || -> Result<DriverStatus, String> {
                drv::init().map_err(|e| format!("cuInit failed: {}", describe(e)))?;
                let count = drv::device::get_count()
                    .map_err(|e| format!("cuDeviceGetCount failed: {}", describe(e)))?;
                if count <= 0 {
                    return Err("the NVIDIA driver reports no CUDA device".into());
                }
                let mut version = 0;
                // SAFETY: a plain out-parameter call on an initialised driver.
                unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
                    .result()
                    .map_err(|e| format!("cuDriverGetVersion failed: {}", describe(e)))?;
                Ok(DriverStatus {
                    device_count: count as usize,
                    driver_version: format!("{}.{}", version / 1000, (version % 1000) / 10),
                })
            })?
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// NVRTC present (needed to compile the backend's kernels).
pub(crate) fn nvrtc() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only `dlopen` attempts.
            if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                Ok(())
            } else {
                Err(format!(
                    "NVRTC (libnvrtc.so), which compiles this backend's kernels, was not found: {}",
                    toolkit_hint("nvidia-cuda-nvrtc")
                ))
            }
        })
        .clone()
}

/// cuBLAS present (needed for GEMM).
pub(crate) fn cublas() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only `dlopen` attempts.
            if unsafe { cudarc::cublas::sys::is_culib_present() } {
                Ok(())
            } else {
                Err(format!(
                    "cuBLAS (libcublas.so), which serves GEMM, was not found: {}",
                    toolkit_hint("nvidia-cublas")
                ))
            }
        })
        .clone()
}

/// Why the CUDA backend cannot run here, or `None` when driver, device, NVRTC and cuBLAS are all present.
pub(crate) fn unavailable_reason() -> Option<String> {
    driver()
        .err()
        .or_else(|| nvrtc().err())
        .or_else(|| cublas().err())
}

/// The NVRTC version as `(major, minor)`, or why NVRTC cannot be used.
pub(crate) fn nvrtc_version() -> Result<(i32, i32), String> {
    nvrtc()?;
    guarded("asking NVRTC for its version", || {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two out-parameters.
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map(|()| (major, minor))
            .map_err(|e| format!("nvrtcVersion failed: {e:?}"))
    })?
}

/// A driver error as "NAME: description".
pub(crate) fn describe(e: drv::DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}: {text}")
}
