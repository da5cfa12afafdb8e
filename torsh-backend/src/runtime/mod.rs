//! Services every backend shares, built once above the [`crate::compute::ComputeBackend`] trait:
//! the caching memory pool (`memory_pool.rs`), mixed precision with a loss scaler (`amp.rs`), graph
//! capture and replay (`graph/`), and the autotuner with its cache file (`autotune.rs`).

pub mod amp;
pub mod autotune;
pub mod graph;
pub mod memory_pool;

pub use amp::{LossScaler, MixedPrecisionConfig};
pub use autotune::{AutotuneStats, TunedChoice};
pub use graph::{Graph, GraphOutputs};
pub use memory_pool::{
    AllocationStrategy, MemoryPool, MemoryPoolConfig, MemoryStats, RawAllocator,
};
