//! The device backends, one folder each: the reference backend (the oracle), the CPU, CUDA and
//! WebGPU. Metal and ROCm answer `Unavailable` (see [`crate::Backend::probe`]).

#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod reference;
#[cfg(feature = "webgpu")]
pub mod webgpu;

/// Held while a GPU backend opens its device (a CUDA context with its stream and library handles, a
/// WebGPU device), so that no two threads of the process open devices at once. Opening one is rare
/// and slow already; run concurrently from several threads, CUDA context creation and Vulkan device
/// creation on one NVIDIA GPU were seen to hang. A poisoned lock is taken as it is: it guards no data.
#[cfg(any(feature = "cuda", feature = "webgpu"))]
pub(crate) fn device_setup() -> std::sync::MutexGuard<'static, ()> {
    static SETUP: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SETUP.lock().unwrap_or_else(|e| e.into_inner())
}
