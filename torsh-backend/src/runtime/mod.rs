//! Services every backend shares, built once above the [`crate::compute::ComputeBackend`] trait:
//! the caching memory pool (`pool.rs`) and mixed precision with a loss scaler (`amp.rs`). The
//! autotuner and graph capture of DESIGN.md's runtime section come next.

pub mod amp;
pub mod pool;

pub use amp::{LossScaler, MixedPrecisionConfig};
pub use pool::{AllocationStrategy, MemoryPool, MemoryPoolConfig, MemoryStats, RawAllocator};
