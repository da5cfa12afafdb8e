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
    /// The same as `major × 1000 + minor × 10` (`cuDriverGetVersion`).
    pub driver_version_code: i32,
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
                    driver_version_code: version,
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

/// Every cuDNN entry point `cudnn.rs` calls. The probe checks them all, so no call can panic on a
/// missing symbol later.
const CUDNN_SYMBOLS: &[&str] = &[
    "cudnnGetVersion",
    "cudnnGetCudartVersion",
    "cudnnGetErrorString",
    "cudnnCreate",
    "cudnnDestroy",
    "cudnnSetStream",
    "cudnnCreateTensorDescriptor",
    "cudnnSetTensor4dDescriptor",
    "cudnnDestroyTensorDescriptor",
    "cudnnCreateFilterDescriptor",
    "cudnnSetFilter4dDescriptor",
    "cudnnDestroyFilterDescriptor",
    "cudnnCreateConvolutionDescriptor",
    "cudnnSetConvolution2dDescriptor",
    "cudnnSetConvolutionGroupCount",
    "cudnnSetConvolutionMathType",
    "cudnnDestroyConvolutionDescriptor",
    "cudnnGetConvolution2dForwardOutputDim",
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionForwardWorkspaceSize",
    "cudnnConvolutionForward",
    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardDataWorkspaceSize",
    "cudnnConvolutionBackwardData",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
    "cudnnConvolutionBackwardFilter",
    "cudnnAddTensor",
];

/// A cuDNN entry point without arguments returning a status.
type CudnnCheck = unsafe fn() -> cudarc::cudnn::sys::cudnnStatus_t;

/// Sub-library checks cuDNN 9 offers (`cudnnOpsVersionCheck`, `cudnnCnnVersionCheck`): called when
/// exported, and a failure means the convolution sub-libraries are missing or of another version.
const CUDNN_VERSION_CHECKS: &[(&str, CudnnCheck)] = &[
    (
        "cudnnOpsVersionCheck",
        cudarc::cudnn::sys::cudnnOpsVersionCheck,
    ),
    (
        "cudnnCnnVersionCheck",
        cudarc::cudnn::sys::cudnnCnnVersionCheck,
    ),
];

/// cuDNN as `major.minor.patch` from `cudnnGetVersion` (9.x encodes `major·10000 + minor·100 + patch`,
/// 8.x and older `major·1000 + minor·100 + patch`), with whether it is a 9.x release.
fn cudnn_version(v: usize) -> (String, bool) {
    if v >= 90_000 {
        let text = format!("{}.{}.{}", v / 10_000, v % 10_000 / 100, v % 100);
        (text, v < 100_000)
    } else {
        (
            format!("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100),
            false,
        )
    }
}

/// cuDNN present in version 9 with every entry point the convolution path needs: its version as
/// `"9.21.0 (built for CUDA 13.0)"`, or why it cannot be used. cuDNN is optional: without it conv2d
/// runs this backend's own kernel, so this is not part of [`unavailable_reason`].
pub(crate) fn cudnn() -> Result<&'static str, String> {
    static PROBE: OnceLock<Result<String, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only `dlopen` attempts.
            if !unsafe { cudarc::cudnn::sys::is_culib_present() } {
                return Err(
                    "cuDNN (libcudnn.so.9) was not found: install cuDNN 9 or `pip install \
                     nvidia-cudnn-cu13` (or -cu12, matching the driver), and put the folder holding \
                     the library on LD_LIBRARY_PATH"
                        .into(),
                );
            }
            guarded("probing cuDNN", cudnn_checks)?
        })
        .as_ref()
        .map(String::as_str)
        .map_err(Clone::clone)
}

/// The symbol, version and sub-library checks of [`cudnn`], once the library is known to open.
fn cudnn_checks() -> Result<String, String> {
    use cudarc::cudnn::sys;
    // SAFETY: the library opens (checked by the caller), so `culib` does not panic; looking a symbol
    // up has no side effect.
    let lib = unsafe { sys::culib() };
    // SAFETY: as above; the function pointer type is never called through.
    let has = |name: &str| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok();
    if let Some(missing) = CUDNN_SYMBOLS.iter().find(|name| !has(name)) {
        return Err(format!(
            "the cuDNN library found lacks `{missing}`: it is not a cuDNN 9 release"
        ));
    }
    // SAFETY: both symbols exist (checked above); they take no arguments.
    let (version, cudart) = unsafe { (sys::cudnnGetVersion(), sys::cudnnGetCudartVersion()) };
    let (version, is_9) = cudnn_version(version);
    if !is_9 {
        return Err(format!(
            "cuDNN {version} was found, but this backend needs cuDNN 9"
        ));
    }
    for (name, check) in CUDNN_VERSION_CHECKS {
        if has(name) {
            // SAFETY: the symbol exists; the call takes no arguments and only compares versions.
            let status = unsafe { check() };
            if status != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                return Err(format!(
                    "cuDNN {version}: {name} failed with status {} (its convolution sub-libraries \
                     are missing or of another version)",
                    status as u32
                ));
            }
        }
    }
    Ok(format!(
        "{version} (built for CUDA {}.{})",
        cudart / 1000,
        cudart % 1000 / 10
    ))
}

/// Why the CUDA backend cannot run here, or `None` when driver, device, NVRTC and cuBLAS are all present.
pub(crate) fn unavailable_reason() -> Option<String> {
    driver()
        .err()
        .or_else(|| nvrtc().err())
        .or_else(|| nvrtc_not_newer_than_driver().err())
        .or_else(|| cublas().err())
}

/// NVRTC emits PTX of its own CUDA version, which a driver of an older CUDA version refuses to load
/// (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION` at the first op). Caught here, before any op, with the fix.
fn nvrtc_not_newer_than_driver() -> Result<(), String> {
    let driver = driver()?;
    let (major, minor) = nvrtc_version()?;
    if major * 1000 + minor * 10 <= driver.driver_version_code {
        return Ok(());
    }
    Err(format!(
        "NVRTC {major}.{minor} produces kernels that the CUDA {} driver cannot load: use an NVRTC no \
         newer than the driver (for example `pip install \"nvidia-cuda-nvrtc-cu12=={}.*\"` for a CUDA 12 \
         driver) or update the NVIDIA driver",
        driver.driver_version, driver.driver_version
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cudnn_versions_decode_both_encodings() {
        assert_eq!(cudnn_version(92_100), ("9.21.0".to_string(), true));
        assert_eq!(cudnn_version(90_001), ("9.0.1".to_string(), true));
        assert_eq!(cudnn_version(8907), ("8.9.7".to_string(), false));
        assert_eq!(cudnn_version(100_200), ("10.2.0".to_string(), false));
    }

    #[test]
    fn a_missing_cudnn_is_a_reason_not_a_panic() {
        match cudnn() {
            Ok(version) => assert!(version.starts_with("9."), "{version}"),
            Err(reason) => assert!(reason.contains("cuDNN"), "{reason}"),
        }
    }
}
