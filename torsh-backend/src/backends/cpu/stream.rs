//! Streaming (non-temporal) stores for outputs larger than the caches.
//!
//! A kernel that writes a large output with ordinary stores first reads every line it writes (the
//! cache fetches a line before a store may change part of it), so it moves a third more bytes than
//! it counts, and it evicts the inputs it is about to read. Streaming stores write whole lines past
//! the cache. They only pay where the output will not be read again while still cached, so kernels
//! use them only for outputs of at least [`STREAM_BYTES`], and write each block of the output into
//! an L1-resident buffer first, then stream it out ([`Streamer`]).

/// The smallest output, in bytes, written with streaming stores: well past the last-level cache
/// share of a core on the machines this crate targets (a few MiB), where the next op could not
/// find the output in cache anyway.
pub(crate) const STREAM_BYTES: usize = 16 << 20;

/// Whether an output of `bytes` is written with streaming stores.
#[inline]
pub(crate) fn worth_streaming(bytes: usize) -> bool {
    bytes >= STREAM_BYTES
}

/// The shortest contiguous run of an output, in bytes, that a kernel writing the output run by run
/// streams: shorter runs would write many lines partly with ordinary stores and partly streamed,
/// and an ordinary store to a line still being combined flushes it half written.
pub(crate) const STREAM_RUN_BYTES: usize = 4096;

/// Bytes of the blocks a kernel builds in L1 before streaming them out ([`Streamer::blocks`]):
/// 1 KiB, so that the loads of one block overlap the streamed stores of the one before. Blocks of
/// 2 KiB and more alternate long read and write phases; on one thread an 8 KiB block streamed 25 %
/// slower.
pub(crate) const BLOCK_BYTES: usize = 1024;

/// The streaming stores of one task: [`Streamer::copy`] writes past the cache without ordering the
/// stores, and dropping the streamer fences them (`sfence` on x86-64), so that they are visible to
/// any thread that synchronises with this one afterwards. Make one per task, around all of its
/// streamed writes.
pub(crate) struct Streamer(());

impl Streamer {
    /// A streamer for one task's writes.
    #[inline]
    pub(crate) fn new() -> Streamer {
        Streamer(())
    }

    /// Copies `src` into `dst`: on x86-64 the 16-byte-aligned part of `dst` with streaming stores
    /// (SSE2, present on every x86-64 CPU), the rest with ordinary ones; elsewhere an ordinary
    /// copy. Panics if the lengths differ, as `copy_from_slice` does.
    #[inline]
    pub(crate) fn copy<T: Copy>(&mut self, src: &[T], dst: &mut [T]) {
        assert_eq!(
            src.len(),
            dst.len(),
            "stream_copy of slices of different lengths"
        );
        #[cfg(target_arch = "x86_64")]
        {
            let bytes = std::mem::size_of_val(src);
            // SAFETY: `src` and `dst` are valid for `bytes` bytes, do not overlap (a shared and
            // an exclusive borrow), and `T: Copy` has no drop glue, so copying its bytes is a copy
            // of it. The fence is `Drop`'s.
            unsafe { x86::stream_bytes(src.as_ptr().cast(), dst.as_mut_ptr().cast(), bytes) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        dst.copy_from_slice(src);
    }

    /// Writes `dst` a block of [`BLOCK_BYTES`] (at most `buf.len()` elements) at a time: `make(at,
    /// block)` fills the block for `dst[at ..]`, in `buf`, and the block is streamed out. Panics
    /// when `buf` is empty and `dst` is not.
    #[inline(always)]
    pub(crate) fn blocks<T: Copy>(
        &mut self,
        dst: &mut [T],
        buf: &mut [T],
        mut make: impl FnMut(usize, &mut [T]),
    ) {
        let n = (BLOCK_BYTES / std::mem::size_of::<T>().max(1)).clamp(1, buf.len().max(1));
        assert!(!buf.is_empty() || dst.is_empty(), "an empty block buffer");
        for (k, d) in dst.chunks_mut(n).enumerate() {
            let b = &mut buf[..d.len()];
            make(k * n, b);
            self.copy(b, d);
        }
    }
}

impl Drop for Streamer {
    #[inline]
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: SSE is part of x86-64. Orders the streamed stores before later ones.
        unsafe {
            std::arch::x86_64::_mm_sfence()
        };
    }
}

/// Copies `src` into `dst` as [`Streamer::copy`] does, then fences. Panics if the lengths differ.
#[inline]
pub(crate) fn stream_copy<T: Copy>(src: &[T], dst: &mut [T]) {
    Streamer::new().copy(src, dst);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};

    /// `n` bytes from `src` to `dst`: an unaligned head and tail copied, the 16-byte-aligned middle
    /// streamed (unfenced).
    ///
    /// # Safety
    /// `src` valid for reads and `dst` for writes of `n` bytes, not overlapping.
    #[inline]
    pub(super) unsafe fn stream_bytes(src: *const u8, dst: *mut u8, n: usize) {
        let head = dst.align_offset(16).min(n);
        // SAFETY: within both regions (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let mut i = head;
        while i + 64 <= n {
            for k in [0, 16, 32, 48] {
                // SAFETY: `i + k + 16 ≤ n`; `dst + i + k` is 16-byte aligned; SSE2 is part of
                // x86-64.
                unsafe {
                    let v = _mm_loadu_si128(src.add(i + k).cast::<__m128i>());
                    _mm_stream_si128(dst.add(i + k).cast::<__m128i>(), v);
                }
            }
            i += 64;
        }
        while i + 16 <= n {
            // SAFETY: as above.
            unsafe {
                let v = _mm_loadu_si128(src.add(i).cast::<__m128i>());
                _mm_stream_si128(dst.add(i).cast::<__m128i>(), v);
            }
            i += 16;
        }
        // SAFETY: the rest of both regions.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_copy_copies_every_element_at_any_alignment_and_length() {
        let src: Vec<u32> = (0..300).map(|i| i * 7 + 1).collect();
        for start in 0..5 {
            for len in [0, 1, 3, 4, 5, 15, 16, 17, 63, 64, 65, 130, 290] {
                let mut dst = vec![u32::MAX; 300];
                let s = &src[..len];
                stream_copy(s, &mut dst[start..start + len]);
                assert_eq!(&dst[start..start + len], s, "start {start}, len {len}");
                assert!(dst[..start].iter().all(|&v| v == u32::MAX));
                assert!(dst[start + len..].iter().all(|&v| v == u32::MAX));
            }
        }
        let bytes: Vec<u8> = (0..=255).collect();
        let mut out = vec![0u8; 257];
        stream_copy(&bytes[3..200], &mut out[1..198]);
        assert_eq!(&out[1..198], &bytes[3..200]);
        assert!(worth_streaming(STREAM_BYTES) && !worth_streaming(STREAM_BYTES - 1));
    }
}
