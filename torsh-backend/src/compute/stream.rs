//! Streams, events and page-locked host memory at the trait level.
//!
//! A stream is an ordered queue of work on one device; ops on different streams may overlap. Each
//! backend instance has a default stream ([`StreamId::DEFAULT`]), on which every op runs unless the
//! calling thread has made another stream current with [`ComputeBackend::set_current_stream`]. An event
//! marks a point in a stream: it completes when the work enqueued before it has.
//!
//! Backends whose ops complete before they return (the reference and the CPU) keep the provided
//! defaults of these methods: there every stream is trivially ordered and every event is complete when
//! it is recorded. Device backends (CUDA) override them with real streams and events.
//!
//! [`ComputeBackend::set_current_stream`]: crate::compute::ComputeBackend::set_current_stream

use std::fmt::Debug;

/// A stream of one backend instance. `StreamId::DEFAULT` always exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The stream every op uses unless another is current.
    pub const DEFAULT: StreamId = StreamId(0);
}

/// An event recorded on a stream of one backend instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

/// Host memory a backend can copy to and from asynchronously (page-locked on CUDA). Dropping it
/// returns the memory; callers must not drop it while a copy from or into it is in flight (the
/// crate's `Completion` futures wait on drop to guarantee that).
pub trait HostBuffer: Send + Sync + Debug {
    /// The bytes.
    fn as_bytes(&self) -> &[u8];
    /// The bytes, writable.
    fn as_bytes_mut(&mut self) -> &mut [u8];
    /// True when the memory is page-locked (copies from it can overlap with compute).
    fn is_page_locked(&self) -> bool;
}

/// Ordinary host memory: what backends without page-locked memory hand out.
#[derive(Debug)]
pub struct PageableBuffer(pub Vec<u8>);

impl HostBuffer for PageableBuffer {
    fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }

    fn is_page_locked(&self) -> bool {
        false
    }
}

/// Work that may still use memory being freed: a caching allocator above the backend (the runtime
/// pool) hands a freed block out again only once its fence is complete. See
/// [`ComputeBackend::memory_fence`](crate::compute::ComputeBackend::memory_fence).
pub trait MemoryFence: Send + Debug {
    /// Whether the work has completed. The backend's error when the device cannot tell.
    fn is_complete(&self) -> crate::error::Result<bool>;
    /// Blocks until the work has completed. The backend's error when the device fails.
    fn wait(&self) -> crate::error::Result<()>;
}
