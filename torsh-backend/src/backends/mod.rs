//! The device backends, one folder each: the reference backend (the oracle), the CPU, CUDA and
//! WebGPU. Metal and ROCm answer `Unavailable` (see [`crate::Backend::probe`]).

#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod reference;
#[cfg(feature = "webgpu")]
pub mod webgpu;
