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
pub(crate) struct Streamer {
    /// The widest streaming store this CPU has.
    #[cfg(target_arch = "x86_64")]
    width: x86::Width,
}

impl Streamer {
    /// A streamer for one task's writes, storing with the widest streaming stores the CPU has
    /// (whatever the backend's SIMD level: a copy's result does not depend on it).
    #[inline]
    pub(crate) fn new() -> Streamer {
        Streamer {
            #[cfg(target_arch = "x86_64")]
            width: x86::Width::detect(),
        }
    }

    /// Copies `src` into `dst`: on x86-64 the 16-byte-aligned part of `dst` with streaming stores,
    /// a whole 64-byte line per store where the CPU has AVX-512 and the line is aligned (32 bytes
    /// per store with AVX, 16 with SSE2), the rest with ordinary ones; elsewhere an ordinary copy.
    /// Panics if the lengths differ, as `copy_from_slice` does.
    ///
    /// The width matters on CPUs that combine the partial lines of narrow streaming stores
    /// slowly: on a Zen 4 core, 1 KiB blocks streamed out of L1 in 16-byte stores wrote about
    /// 18 GB/s where 64-byte stores wrote 28 GB/s in the same minutes.
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
            let (s, d) = (src.as_ptr().cast::<u8>(), dst.as_mut_ptr().cast::<u8>());
            // SAFETY: `src` and `dst` are valid for `bytes` bytes, do not overlap (a shared and
            // an exclusive borrow), and `T: Copy` has no drop glue, so copying its bytes is a copy
            // of it. The width was detected on this CPU, so its instructions run here. The fence
            // is `Drop`'s.
            unsafe {
                match self.width {
                    x86::Width::Line => x86::stream_lines(s, d, bytes),
                    x86::Width::Half => x86::stream_halves(s, d, bytes),
                    x86::Width::Quarter => x86::stream_bytes(s, d, bytes),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        dst.copy_from_slice(src);
    }

    /// Writes `dst` a block of [`BLOCK_BYTES`] (at most `buf.len()` elements) at a time: `make(at,
    /// block)` fills the block for `dst[at ..]`, in `buf`, and the block is streamed out. The
    /// block starts on the first 64-byte line of `buf` where a whole block fits after it (else at
    /// its start). Panics when `buf` is empty and `dst` is not.
    ///
    /// The line matters: the block's stores and the streaming copy's loads that follow them at
    /// once then cover the same lines. On a Zen 4 core, a block 16, 32 or 48 bytes off a line
    /// (where the stack happened to put it, process by process) made the streamed ops about
    /// three times slower than on a line.
    #[inline(always)]
    pub(crate) fn blocks<T: Copy>(
        &mut self,
        dst: &mut [T],
        buf: &mut [T],
        mut make: impl FnMut(usize, &mut [T]),
    ) {
        assert!(!buf.is_empty() || dst.is_empty(), "an empty block buffer");
        let size = std::mem::size_of::<T>().max(1);
        let want = (BLOCK_BYTES / size).max(1);
        let buf = on_a_line(buf, want);
        let n = want.clamp(1, buf.len().max(1));
        for (k, d) in dst.chunks_mut(n).enumerate() {
            let b = &mut buf[..d.len()];
            make(k * n, b);
            self.copy(b, d);
        }
    }
}

/// `buf` from its first 64-byte line on, when at least `len` elements follow the line's start; else
/// all of `buf`. A block built there and streamed out at once runs at full speed (see
/// [`Streamer::blocks`]).
#[inline(always)]
pub(crate) fn on_a_line<T>(buf: &mut [T], len: usize) -> &mut [T] {
    let size = std::mem::size_of::<T>().max(1);
    let line = buf.as_ptr().cast::<u8>().align_offset(64) / size;
    if buf.len().checked_sub(line).is_some_and(|rest| rest >= len) {
        &mut buf[line..]
    } else {
        buf
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
    use std::arch::x86_64::{
        __m128i, __m256i, __m512i, _mm256_loadu_si256, _mm256_stream_si256, _mm512_loadu_si512,
        _mm512_stream_si512, _mm_loadu_si128, _mm_stream_si128,
    };

    /// Bytes per streaming store: a whole 64-byte line (AVX-512F), half (AVX), a quarter (SSE2,
    /// part of x86-64).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Width {
        Line,
        Half,
        Quarter,
    }

    impl Width {
        /// The widest this CPU has (std caches the detection: a load and a test).
        #[inline]
        pub(super) fn detect() -> Width {
            if std::arch::is_x86_feature_detected!("avx512f") {
                Width::Line
            } else if std::arch::is_x86_feature_detected!("avx") {
                Width::Half
            } else {
                Width::Quarter
            }
        }
    }

    /// The head of `n` bytes at `dst` before its first `align`-byte boundary, and the body after
    /// it: whole `align`-byte blocks.
    #[inline(always)]
    fn split(dst: *mut u8, n: usize, align: usize) -> (usize, usize) {
        let head = dst.align_offset(align).min(n);
        (head, (n - head) / align * align)
    }

    /// `n` bytes from `src` to `dst`, the 64-byte-aligned lines of `dst` streamed a line per
    /// store (unfenced), the parts before and after them as [`stream_bytes`] copies them.
    ///
    /// # Safety
    /// As [`stream_bytes`], on a CPU with AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn stream_lines(src: *const u8, dst: *mut u8, n: usize) {
        let (head, body) = split(dst, n, 64);
        // SAFETY: the caller's contract: every access is within both regions, and `dst + i` is
        // 64-byte aligned in the loop.
        unsafe {
            stream_bytes(src, dst, head);
            let mut i = head;
            while i < head + body {
                let v = _mm512_loadu_si512(src.add(i).cast::<__m512i>());
                _mm512_stream_si512(dst.add(i).cast::<__m512i>(), v);
                i += 64;
            }
            stream_bytes(src.add(i), dst.add(i), n - i);
        }
    }

    /// `n` bytes from `src` to `dst`, the 32-byte-aligned middle of `dst` streamed 32 bytes per
    /// store (unfenced), the parts before and after it as [`stream_bytes`] copies them.
    ///
    /// # Safety
    /// As [`stream_bytes`], on a CPU with AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn stream_halves(src: *const u8, dst: *mut u8, n: usize) {
        let (head, body) = split(dst, n, 32);
        // SAFETY: as in `stream_lines`, with 32-byte alignment.
        unsafe {
            stream_bytes(src, dst, head);
            let mut i = head;
            while i < head + body {
                let v = _mm256_loadu_si256(src.add(i).cast::<__m256i>());
                _mm256_stream_si256(dst.add(i).cast::<__m256i>(), v);
                i += 32;
            }
            stream_bytes(src.add(i), dst.add(i), n - i);
        }
    }

    /// `n` bytes from `src` to `dst`: an unaligned head and tail copied, the 16-byte-aligned middle
    /// streamed (unfenced).
    ///
    /// # Safety
    /// `src` valid for reads and `dst` for writes of `n` bytes, not overlapping.
    #[inline(always)]
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

    /// Every store width this CPU has copies every byte at every alignment and length, and writes
    /// nothing outside the destination.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_store_width_copies_exactly_its_bytes() {
        type Copier = unsafe fn(*const u8, *mut u8, usize);
        let mut widths: Vec<(&str, Copier)> =
            vec![("16 bytes", |s, d, n| unsafe { x86::stream_bytes(s, d, n) })];
        if std::arch::is_x86_feature_detected!("avx") {
            widths.push(("32 bytes", x86::stream_halves));
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            widths.push(("64 bytes", x86::stream_lines));
        }
        let src: Vec<u8> = (0..700u32).map(|i| (i * 31 + 7) as u8).collect();
        for (name, copy) in widths {
            for start in [0, 1, 15, 16, 31, 33, 63, 64, 65] {
                for len in [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 511, 600] {
                    // A 64-byte-aligned destination buffer, so `start` is the line offset.
                    let mut dst = vec![[0xeeu8; 64]; 12];
                    let bytes = dst.as_flattened_mut();
                    let from = (start * 3) % 50;
                    // SAFETY: both ranges are inside their buffers and do not overlap; the
                    // width's features were detected above.
                    unsafe {
                        copy(src[from..].as_ptr(), bytes[start..].as_mut_ptr(), len);
                        std::arch::x86_64::_mm_sfence();
                    }
                    let at = format!("{name}, start {start}, len {len}");
                    assert_eq!(&bytes[start..start + len], &src[from..from + len], "{at}");
                    assert!(bytes[..start].iter().all(|&b| b == 0xee), "{at}");
                    assert!(bytes[start + len..].iter().all(|&b| b == 0xee), "{at}");
                }
            }
        }
    }
}
