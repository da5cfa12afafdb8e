//! Dense device-to-device copies: `memcpy` in chunks spread over the backend's threads.

use super::host::{for_chunks, Ctx, Span};
use crate::backends::reference::memory::HostMemory;
use crate::compute::DevicePtr;
use crate::error::Result;

/// Bytes one task copies at least: below this a copy stays on one thread.
const MIN_CHUNK_BYTES: usize = 1 << 20;

/// Copies `bytes` bytes from `src` to `dst`. The caller checked both regions against the live
/// allocations and that they do not overlap.
pub(crate) fn device_to_device(
    mem: &mut HostMemory,
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    ctx: Ctx,
) -> Result<()> {
    let from = Span::<u8>::of(mem, "copy_dtod", src, bytes)?;
    let to = Span::<u8>::of(mem, "copy_dtod", dst, bytes)?;
    for_chunks(bytes, ctx.threads, MIN_CHUNK_BYTES, |range| {
        // SAFETY: the regions are disjoint (checked by the caller) and each task copies its own range.
        unsafe {
            to.slice_mut(range.clone())
                .copy_from_slice(from.slice(range))
        }
    });
    Ok(())
}
