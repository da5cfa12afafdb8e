//! Page-locked host memory (`cuMemAllocHost`): copies between it and the device run asynchronously.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result as drv, CudaContext};

use super::driver_error;
use crate::compute::HostBuffer;
use crate::error::{BackendError, Result};

/// A page-locked host allocation, zeroed, freed on drop.
#[derive(Debug)]
pub(crate) struct PinnedHost {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is owned exclusively by this value; access goes through `&self`/`&mut self`.
unsafe impl Send for PinnedHost {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// `len` zeroed bytes of page-locked memory. `OutOfMemory` when the driver cannot lock that much.
    pub(crate) fn new(ctx: Arc<CudaContext>, len: usize) -> Result<PinnedHost> {
        if len == 0 {
            return Ok(PinnedHost {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len,
                ctx,
            });
        }
        ctx.bind_to_thread()
            .map_err(|e| driver_error("binding the CUDA context", e))?;
        // SAFETY: a plain allocation call; the pointer is checked below.
        let ptr = unsafe { drv::malloc_host(len, 0) }.map_err(|e| {
            if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                BackendError::OutOfMemory {
                    requested: len,
                    available: 0,
                }
            } else {
                driver_error("cuMemAllocHost", e)
            }
        })? as *mut u8;
        // SAFETY: `ptr` points to `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedHost { ptr, len, ctx })
    }
}

impl HostBuffer for PinnedHost {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn is_page_locked(&self) -> bool {
        true
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if self.len == 0 || self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: `ptr` came from cuMemAllocHost and is freed once.
        let _ = unsafe { drv::free_host(self.ptr as *mut c_void) };
    }
}
