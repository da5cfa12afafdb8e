//! Dense device-to-device copies: `memcpy` in chunks spread over the backend's threads, with
//! streaming stores for copies of [`worth_streaming`] size.

use super::cost::{FLOPS_PER_BYTE, TEAM_WORK};
use super::host::{for_chunks, Ctx, Span};
use super::stream::{worth_streaming, Streamer};
use crate::backends::reference::memory::HostMemory;
use crate::compute::DevicePtr;
use crate::error::Result;

/// Bytes one task copies at least: a task's work in the threading cost model (each byte is read
/// and written).
const TASK_BYTES: usize = TEAM_WORK / (2 * FLOPS_PER_BYTE);

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
    let stream = worth_streaming(bytes);
    for_chunks(bytes, ctx.threads, TASK_BYTES, |range| {
        // SAFETY: the regions are disjoint (checked by the caller) and each task copies its own range.
        let (src, dst) = unsafe { (from.slice(range.clone()), to.slice_mut(range)) };
        if stream {
            Streamer::new().copy(src, dst);
        } else {
            dst.copy_from_slice(src);
        }
    });
    Ok(())
}
