//! Services every backend shares, built once above the [`crate::compute::ComputeBackend`] trait:
//! the caching memory pool (`pool.rs`). The autotuner, graph capture and mixed precision of
//! DESIGN.md's runtime section come next.

pub mod pool;

pub use pool::{AllocationStrategy, MemoryPool, MemoryPoolConfig, MemoryStats, RawAllocator};
