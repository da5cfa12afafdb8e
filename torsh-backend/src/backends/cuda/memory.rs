//! Device memory: a caching allocator over `cuMemAlloc`, plus the allocation table every op's regions
//! are checked against.
//!
//! Blocks are rounded up to 512 bytes. A freed block goes to a cache keyed by its rounded size instead
//! of back to the driver; a later request takes the smallest cached block that fits and wastes at most a
//! quarter of it. When the driver is out of memory the cache is released and the request retried once.
//! While all work runs on the default stream, a block freed after the ops that use it were enqueued
//! can be handed to the next op without waiting: the stream orders them. Once other streams exist, a
//! freed block carries fences (events on every stream, [`super::streams::Streams::fences`]) and is
//! reused only when they have completed. The runtime pool above (`Backend::memory_pool`) fences its
//! own blocks the same way through `ComputeBackend::memory_fence`.

use std::collections::{BTreeMap, HashMap};

use cudarc::driver::{result as drv, sys, CudaEvent};

use crate::compute::{AllocationTable, DevicePtr};
use crate::error::{BackendError, Result};

/// Allocation granularity in bytes.
pub(crate) const ROUNDING: usize = 512;

/// The byte every fresh allocation is filled with when poisoning is on: 0xFF is NaN in every float dtype.
pub(crate) const POISON_BYTE: u8 = 0xFF;

/// Live allocations and the cache of freed blocks. Callers hold the backend's lock and have bound its
/// context to the thread.
#[derive(Debug, Default)]
pub(crate) struct DeviceMemory {
    /// Live allocations with their requested sizes: what op regions are checked against.
    pub table: AllocationTable,
    /// Rounded size of each live block.
    block_sizes: HashMap<u64, usize>,
    /// Freed blocks by rounded size, each with the events that must complete before it is reused.
    cached: BTreeMap<usize, Vec<(u64, Vec<CudaEvent>)>>,
    /// Bytes held in `cached`.
    cached_bytes: usize,
}

impl DeviceMemory {
    /// A device block of at least `bytes`, registered in the table. `OutOfMemory` when the device has
    /// no room even after the cache is released.
    pub(crate) fn alloc(&mut self, bytes: usize) -> Result<DevicePtr> {
        let rounded =
            bytes
                .max(1)
                .checked_next_multiple_of(ROUNDING)
                .ok_or(BackendError::OutOfMemory {
                    requested: bytes,
                    available: 0,
                })?;
        // A cached block may be up to a quarter larger than `rounded`: it keeps its own size.
        let (ptr, size) = match self.take_cached(rounded) {
            Some(block) => block,
            None => (self.alloc_from_driver(bytes, rounded)?, rounded),
        };
        self.block_sizes.insert(ptr, size);
        self.table.insert(DevicePtr(ptr), bytes);
        Ok(DevicePtr(ptr))
    }

    /// Returns `ptr` (an allocation's base) to the cache; it is reused only after every event in
    /// `fences` has completed (work on other streams that may still use it). `InvalidPointer` for
    /// anything but a live allocation's base.
    pub(crate) fn free(&mut self, ptr: DevicePtr, fences: Vec<CudaEvent>) -> Result<()> {
        self.table.remove(ptr)?;
        let rounded = self.block_sizes.remove(&ptr.0).unwrap_or(ROUNDING);
        self.cached
            .entry(rounded)
            .or_default()
            .push((ptr.0, fences));
        self.cached_bytes += rounded;
        Ok(())
    }

    /// Bytes held by live allocations (as requested) .
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.table.allocated_bytes()
    }

    /// Bytes held in the cache of freed blocks.
    pub(crate) fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    /// The smallest cached block that fits `rounded` (wasting at most a quarter of it) and whose
    /// fences have all completed, with its rounded size.
    fn take_cached(&mut self, rounded: usize) -> Option<(u64, usize)> {
        let limit = rounded.saturating_add(rounded / 4);
        let ready =
            |fences: &Vec<CudaEvent>| fences.iter().all(|e| e.try_is_complete().unwrap_or(false));
        let (size, index) = self
            .cached
            .range(rounded..=limit)
            .find_map(|(&size, list)| {
                list.iter().rposition(|(_, f)| ready(f)).map(|i| (size, i))
            })?;
        let list = self.cached.get_mut(&size)?;
        let (ptr, _) = list.swap_remove(index);
        if list.is_empty() {
            self.cached.remove(&size);
        }
        self.cached_bytes -= size;
        Some((ptr, size))
    }

    fn alloc_from_driver(&mut self, bytes: usize, rounded: usize) -> Result<u64> {
        // SAFETY: the caller has bound the backend's context; the result is checked.
        match unsafe { drv::malloc_sync(rounded) } {
            Ok(ptr) => Ok(ptr),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                self.release_cache()?;
                // SAFETY: as above.
                unsafe { drv::malloc_sync(rounded) }.map_err(|e| {
                    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                        BackendError::OutOfMemory {
                            requested: bytes,
                            available: drv::mem_get_info().map(|(free, _)| free).unwrap_or(0),
                        }
                    } else {
                        super::driver_error("cuMemAlloc", e)
                    }
                })
            }
            Err(e) => Err(super::driver_error("cuMemAlloc", e)),
        }
    }

    /// Gives every cached block back to the driver. The caller must have synchronised the stream if
    /// work that used those blocks may still be running (cuMemFree synchronises the device itself).
    pub(crate) fn release_cache(&mut self) -> Result<()> {
        for (size, list) in std::mem::take(&mut self.cached) {
            for (ptr, fences) in list {
                for fence in fences {
                    fence
                        .synchronize()
                        .map_err(|e| super::driver_error("cuEventSynchronize", e))?;
                }
                self.cached_bytes -= size;
                // SAFETY: `ptr` came from cuMemAlloc and is not live.
                unsafe { drv::free_sync(ptr) }.map_err(|e| super::driver_error("cuMemFree", e))?;
            }
        }
        Ok(())
    }

    /// Frees every block, live or cached (the backend is being dropped).
    pub(crate) fn release_all(&mut self) {
        let _ = self.release_cache();
        for (&ptr, _) in self.block_sizes.iter() {
            // SAFETY: as above; the backend is gone, so nothing can use these blocks again.
            let _ = unsafe { drv::free_sync(ptr) };
        }
        self.block_sizes.clear();
    }
}
