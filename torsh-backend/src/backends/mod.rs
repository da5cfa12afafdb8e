//! The device backends, one folder each: the reference backend (which also serves the CPU kind until
//! the CPU backend has kernels of its own) and CUDA. Every other kind answers `Unavailable` (see
//! [`crate::Backend::probe`]).

#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod reference;
