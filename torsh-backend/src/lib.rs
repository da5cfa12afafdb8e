//! # torsh-backend
//!
//! One backend API for a Rust tensor library over every compute device. A [`Backend`] is a device; a
//! [`Tensor`] is a strided view of its memory; every op (GEMM, batched matmul, GEMV, conv2d, attention,
//! normalisation, softmax, reductions, elementwise, pooling, fused Adam) is a method on both, and gives
//! the same answer on every backend within floating-point error.
//!
//! ```
//! use torsh_backend::prelude::*;
//!
//! # fn main() -> Result<()> {
//! let backend = Backend::auto()?;
//! let a = backend.randn(&[64, 32], DType::F32)?;
//! let b = backend.randn(&[32, 16], DType::F32)?;
//! let c = backend.matmul(&a, &b)?.relu()?;
//! assert_eq!(c.shape(), &[64, 16]);
//! # Ok(())
//! # }
//! ```
//!
//! Layers (docs/architecture.md in the repository has more):
//! - [`Backend`] / [`Tensor`] and [`ops`]: the public API, shape and dtype checks, broadcasting;
//! - [`ComputeBackend`]: the low-level, object-safe device trait over raw, validated [`DevicePtr`]s;
//! - [`backends`]: one implementation per device kind; [`backends::reference`] is the f64 oracle;
//! - [`validation`]: the parity suite that compares every backend with the reference.
//!
//! Errors are [`BackendError`] values; library code does not panic on bad input.

#![warn(missing_docs)]

pub mod backend;
pub mod backends;
pub mod compute;
pub mod device;
pub mod dtype;
pub mod error;
pub mod ops;
pub mod rng;
pub mod runtime;
pub mod shape;
pub mod stream;
pub mod tensor;
pub mod validation;

/// The WebGPU backend's own API: adapters, devices, the buffer pool, and the wgpu crate it
/// is built on.
#[cfg(feature = "webgpu")]
pub use backends::webgpu;

pub use backend::{Backend, BackendBuilder, BackendConfig, BackendStatus};
pub use compute::{
    BinaryOp, CompareOp, ComputeBackend, DevicePtr, ReduceOp, SavedTensor, ScanOp, Transpose,
    TunableOp, UnaryOp,
};
pub use device::{BackendType, Device, DeviceInfo};
pub use dtype::{DType, Element};
pub use error::{BackendError, BackendResult, Result};
pub use ops::attention::{AttentionGrads, AttentionOutput};
pub use ops::conv::{ConvConfig, ConvTransposeConfig};
pub use ops::loss::{CrossEntropyConfig, Reduction};
pub use ops::norm::{BatchNormConfig, NormGrads, Normalized};
pub use ops::optim::AdamState;
pub use ops::pool::Pool2dConfig;
pub use runtime::{
    AllocationStrategy, AutotuneStats, Graph, GraphOutputs, LossScaler, MemoryPoolConfig,
    MemoryStats, MixedPrecisionConfig, TunedChoice,
};
pub use shape::Layout;
pub use stream::{Completion, Event, PinnedBuffer, Stream};
pub use tensor::Tensor;

/// Everything a user of the tensor API needs: `use torsh_backend::prelude::*;`.
pub mod prelude {
    pub use crate::backend::{Backend, BackendBuilder};
    pub use crate::compute::{BinaryOp, CompareOp, ReduceOp, ScanOp, UnaryOp};
    pub use crate::device::{BackendType, Device, DeviceInfo};
    pub use crate::dtype::DType;
    pub use crate::error::{BackendError, Result};
    pub use crate::ops::attention::{AttentionGrads, AttentionOutput};
    pub use crate::ops::conv::{ConvConfig, ConvTransposeConfig};
    pub use crate::ops::loss::{CrossEntropyConfig, Reduction};
    pub use crate::ops::norm::{BatchNormConfig, NormGrads, Normalized};
    pub use crate::ops::optim::AdamState;
    pub use crate::ops::pool::Pool2dConfig;
    pub use crate::tensor::Tensor;
    pub use half::{bf16, f16};
}

/// Compiles and runs the README's examples as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// Compiles and runs the guide's examples (`docs/guide.md`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide.md")]
pub struct GuideDoctests;

/// Compiles and runs the runtime services' examples (`docs/runtime.md`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/runtime.md")]
pub struct RuntimeDoctests;
