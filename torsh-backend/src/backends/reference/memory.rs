//! Host memory of the reference and CPU backends: byte buffers behind synthetic device addresses,
//! checked by an [`AllocationTable`], an optional cache that recycles freed buffers, and conversion of
//! elements to and from f64 (`crate::dtype::{decode, encode}`).

use crate::compute::allocations::AddressMap;
use crate::compute::{Accesses, AllocationTable, DevicePtr, StridedBuf};
use crate::dtype::{decode, encode, DType};
use crate::error::{BackendError, Result};

/// The byte every fresh allocation is filled with: `0xFF…` is a NaN in every float dtype (and -1 in the
/// signed integers), so an output element a kernel forgot to write cannot pass a comparison.
pub const POISON_BYTE: u8 = 0xFF;

/// 64 bytes aligned to 64: the unit host buffers are made of, so every buffer starts on a cache line
/// and SIMD kernels may assume element alignment at element offsets.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// One allocation: whole cache lines, of which the first `len` bytes are the allocation.
struct Buffer {
    lines: Vec<Line>,
    len: usize,
}

impl Buffer {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes)", self.len)
    }
}

/// Freed buffers kept for reuse, by capacity in lines, so that a loop allocating and freeing tensors
/// of the same sizes touches pages the process already has instead of faulting fresh ones in (a fresh
/// allocation per call measured about 10× slower than a reused buffer for large tensors).
struct Recycler {
    /// Buffers by line capacity (a size class), in a map with the allocation table's cheap hash:
    /// a tensor's drop and the next allocation of its size each look one class up.
    free: AddressMap<Vec<Vec<Line>>>,
    /// Bytes held in `free`.
    cached_bytes: usize,
    /// Most bytes `free` may hold; beyond it freed buffers go back to the system allocator.
    limit_bytes: usize,
    /// Refill reused buffers with [`POISON_BYTE`] (fresh ones always are).
    poison: bool,
}

impl std::fmt::Debug for Recycler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Recycler({} of {} bytes cached, poison {})",
            self.cached_bytes, self.limit_bytes, self.poison
        )
    }
}

impl Recycler {
    /// The size class of a request: lines rounded up to 8 (512 bytes) below 1 MiB, else to a sixteenth
    /// of the power of two below it, so reuse wastes at most about 6 %.
    fn class(lines: usize) -> usize {
        if lines <= (1 << 14) {
            return lines.next_multiple_of(8).max(8);
        }
        let step = (1usize << (usize::BITS - 1 - lines.leading_zeros())) / 16;
        lines.next_multiple_of(step)
    }

    /// A cached buffer of exactly `class` lines, if there is one. A bucket it empties is kept,
    /// with its capacity, so that a steady cycle of allocations and frees of one size allocates
    /// nothing here (at most one bucket per size class ever used stays behind).
    fn take(&mut self, class: usize) -> Option<Vec<Line>> {
        let lines = self.free.get_mut(&(class as u64))?.pop()?;
        self.cached_bytes -= class * 64;
        Some(lines)
    }

    /// Keeps `lines` for reuse unless the cache would exceed its limit.
    fn give(&mut self, lines: Vec<Line>) {
        let bytes = lines.len() * 64;
        if self.cached_bytes + bytes > self.limit_bytes {
            return;
        }
        self.cached_bytes += bytes;
        self.free.entry(lines.len() as u64).or_default().push(lines);
    }
}

/// The host memory of the reference and CPU backends: 64-byte aligned buffers.
#[derive(Debug, Default)]
pub struct HostMemory {
    /// Live allocations, for every pointer check.
    pub table: AllocationTable,
    buffers: AddressMap<Buffer>,
    /// Freed buffers kept for reuse; `None` (the reference backend) frees at once.
    recycler: Option<Recycler>,
}

impl HostMemory {
    /// Memory that keeps up to `limit_bytes` of freed buffers for reuse by later allocations of the
    /// same size class. Reused buffers keep their old contents unless `poison` is set (the CPU backend
    /// sets it in debug builds and under `TORSH_POISON=1`); fresh buffers are always poisoned.
    pub fn recycling(limit_bytes: usize, poison: bool) -> HostMemory {
        HostMemory {
            recycler: Some(Recycler {
                free: AddressMap::default(),
                cached_bytes: 0,
                limit_bytes,
                poison,
            }),
            ..HostMemory::default()
        }
    }

    /// Bytes of freed buffers held for reuse (0 without recycling).
    pub fn cached_bytes(&self) -> usize {
        self.recycler.as_ref().map_or(0, |r| r.cached_bytes)
    }

    /// Allocates `bytes` filled with [`POISON_BYTE`] (or, for a recycled buffer without poisoning, its
    /// old contents). `OutOfMemory` if the host cannot provide them.
    pub fn alloc(&mut self, bytes: usize) -> Result<DevicePtr> {
        let needed = bytes.div_ceil(64);
        let lines = match self.recycler.as_mut() {
            Some(r) => {
                let class = Recycler::class(needed);
                match r.take(class) {
                    Some(mut lines) => {
                        if r.poison {
                            lines.fill(Line([POISON_BYTE; 64]));
                        }
                        lines
                    }
                    None => fresh_lines(class, bytes)?,
                }
            }
            None => fresh_lines(needed, bytes)?,
        };
        let ptr = self.table.allocate_synthetic(bytes)?;
        self.buffers.insert(ptr.0, Buffer { lines, len: bytes });
        Ok(ptr)
    }

    /// Frees an allocation by its base pointer (keeping its buffer for reuse when recycling).
    pub fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        self.table.remove(ptr)?;
        if let Some(buffer) = self.buffers.remove(&ptr.0) {
            if let Some(r) = self.recycler.as_mut() {
                r.give(buffer.lines);
            }
        }
        Ok(())
    }

    /// The base and offset of the live allocation holding the `bytes` bytes at `ptr`, as
    /// [`AllocationTable::check`] finds them and with its errors. An allocation's own base
    /// pointer, what every dense tensor passes, is found by one hash lookup; any other pointer
    /// takes the table's ordered search.
    fn locate(&self, ptr: DevicePtr, bytes: usize) -> Result<(DevicePtr, usize)> {
        match self.buffers.get(&ptr.0) {
            Some(buf) if bytes <= buf.len => Ok((ptr, 0)),
            _ => self.table.check(ptr, bytes),
        }
    }

    /// Checks every region of an op against the live allocations, then for aliasing, as
    /// [`AllocationTable::check_accesses`] does and with its errors.
    pub fn check_accesses(&self, accesses: &Accesses) -> Result<()> {
        for r in &accesses.regions {
            self.locate(r.ptr, r.bytes)?;
        }
        accesses.check_aliasing()
    }

    /// The `bytes` bytes at `ptr`, after a bounds check.
    pub fn bytes(&self, ptr: DevicePtr, bytes: usize) -> Result<&[u8]> {
        let (base, off) = self.locate(ptr, bytes)?;
        let buf = self.buffer(base)?;
        Ok(&buf.bytes()[off..off + bytes])
    }

    /// The `bytes` bytes at `ptr`, mutably, after a bounds check.
    pub fn bytes_mut(&mut self, ptr: DevicePtr, bytes: usize) -> Result<&mut [u8]> {
        let (base, off) = self.locate(ptr, bytes)?;
        let buf = self
            .buffers
            .get_mut(&base.0)
            .ok_or_else(|| lost_buffer(base))?;
        Ok(&mut buf.bytes_mut()[off..off + bytes])
    }

    /// The address in host memory of the `bytes` bytes at `ptr`, after a bounds check, for kernels that
    /// work on raw pointers (the CPU backend's GEMM). The caller holds `&mut self` for as long as it
    /// uses the pointer and has checked the op's regions for aliasing.
    ///
    /// The address comes from `Vec::as_mut_ptr`, which creates no reference to the buffer, so several
    /// addresses into one buffer (two input views of one allocation) stay valid together.
    pub fn host_address(&mut self, ptr: DevicePtr, bytes: usize) -> Result<*mut u8> {
        let (base, off) = self.locate(ptr, bytes)?;
        let buf = self
            .buffers
            .get_mut(&base.0)
            .ok_or_else(|| lost_buffer(base))?;
        // SAFETY: `off + bytes <= len <= 64 × lines.len()` (checked against the table above), so the
        // offset stays inside the allocation.
        Ok(unsafe { buf.lines.as_mut_ptr().cast::<u8>().add(off) })
    }

    fn buffer(&self, base: DevicePtr) -> Result<&Buffer> {
        self.buffers.get(&base.0).ok_or_else(|| lost_buffer(base))
    }

    /// `len` contiguous elements of `dtype` at `ptr`, as f64.
    pub fn load_dense(&self, dtype: DType, ptr: DevicePtr, len: usize) -> Result<Vec<f64>> {
        let size = dtype.size_in_bytes();
        let bytes = self.bytes(ptr, len * size)?;
        Ok(bytes.chunks_exact(size).map(|c| decode(dtype, c)).collect())
    }

    /// The elements of a strided view in row-major order of the view, as f64. `OutOfMemory` when the
    /// host cannot hold them (a broadcast view may have far more elements than its buffer).
    pub fn load(&self, dtype: DType, buf: &StridedBuf) -> Result<Vec<f64>> {
        let mut out = host_vec(buf.layout.numel())?;
        self.for_each_element(dtype, buf, |b| out.push(decode(dtype, b)))?;
        Ok(out)
    }

    /// Calls `f` with the bytes of each element of a strided view, in row-major order of the view.
    pub fn for_each_element(
        &self,
        dtype: DType,
        buf: &StridedBuf,
        mut f: impl FnMut(&[u8]),
    ) -> Result<()> {
        let size = dtype.size_in_bytes();
        let start = buf.layout.offset();
        let span = buf.layout.span_elements()?;
        let region_start = DevicePtr(buf.ptr.0 + (start * size) as u64);
        let bytes = self.bytes(region_start, (span - start) * size)?;
        buf.layout.for_each_index(|e| {
            let at = (e - start) * size;
            f(&bytes[at..at + size]);
        });
        Ok(())
    }

    /// Stores `values` as contiguous elements of `dtype` at `ptr`.
    pub fn store(&mut self, dtype: DType, ptr: DevicePtr, values: &[f64]) -> Result<()> {
        let size = dtype.size_in_bytes();
        let bytes = self.bytes_mut(ptr, values.len() * size)?;
        for (chunk, &v) in bytes.chunks_exact_mut(size).zip(values) {
            encode(dtype, v, chunk);
        }
        Ok(())
    }
}

/// `lines` poisoned cache lines for an allocation of `bytes`, or `OutOfMemory`.
fn fresh_lines(lines: usize, bytes: usize) -> Result<Vec<Line>> {
    let mut v: Vec<Line> = Vec::new();
    v.try_reserve_exact(lines)
        .map_err(|_| BackendError::OutOfMemory {
            requested: bytes,
            available: 0,
        })?;
    advise_huge_pages(v.as_mut_ptr().cast(), lines * 64);
    v.resize(lines, Line([POISON_BYTE; 64]));
    Ok(v)
}

/// Buffers at least this large ask the kernel for transparent huge pages.
const HUGE_PAGE: usize = 2 << 20;

/// Asks Linux to back the whole 2 MiB pages inside `[start, start + len)` with transparent huge pages
/// (`MADV_HUGEPAGE`), before the first touch faults them in: a kernel streaming through a 64 MiB
/// tensor otherwise takes a TLB miss every 4 KiB. Only advice: where the kernel refuses (THP
/// disabled, another OS), the buffer works the same on small pages.
fn advise_huge_pages(start: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let first = (start as usize).next_multiple_of(HUGE_PAGE);
        let end = (start as usize).saturating_add(len) & !(HUGE_PAGE - 1);
        if len >= HUGE_PAGE && end > first {
            // SAFETY: madvise only changes how the pages of this range, which lies inside the
            // vector's own reserved allocation, are backed; their contents and validity are unchanged.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len, HUGE_PAGE);
}

/// An empty vector with room for `n` f64 values, or `OutOfMemory` instead of an allocation failure.
pub fn host_vec(n: usize) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| BackendError::OutOfMemory {
            requested: n.saturating_mul(8),
            available: 0,
        })?;
    Ok(v)
}

fn lost_buffer(base: DevicePtr) -> BackendError {
    BackendError::InvalidPointer {
        ptr: base.0,
        reason: "allocation table and buffers disagree (internal error)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_and_waste_little() {
        assert_eq!(Recycler::class(0), 8);
        assert_eq!(Recycler::class(1), 8);
        assert_eq!(Recycler::class(9), 16);
        for lines in [1 << 14, (1 << 14) + 1, 123_457, 1 << 20, (1 << 22) + 3] {
            let c = Recycler::class(lines);
            assert!(c >= lines && (c - lines) * 16 <= lines, "{lines} -> {c}");
        }
    }

    #[test]
    fn freed_buffers_are_reused_by_the_same_size_class() {
        let mut mem = HostMemory::recycling(1 << 30, false);
        let a = mem.alloc(100_000).unwrap();
        mem.bytes_mut(a, 4).unwrap().copy_from_slice(&[1, 2, 3, 4]);
        let host = mem.host_address(a, 4).unwrap() as usize;
        mem.free(a).unwrap();
        assert!(mem.cached_bytes() >= 100_000);
        let b = mem.alloc(99_990).unwrap();
        assert_ne!(a, b, "device addresses are never reused");
        assert_eq!(mem.host_address(b, 4).unwrap() as usize, host);
        assert_eq!(
            mem.bytes(b, 4).unwrap(),
            &[1, 2, 3, 4],
            "no poisoning asked for"
        );
        assert_eq!(mem.cached_bytes(), 0);
        assert!(mem.bytes(a, 1).is_err(), "the freed pointer stays invalid");
    }

    #[test]
    fn reuse_poisons_when_asked_and_the_limit_bounds_the_cache() {
        let mut mem = HostMemory::recycling(200_000, true);
        let a = mem.alloc(150_000).unwrap();
        mem.bytes_mut(a, 150_000).unwrap().fill(0);
        mem.free(a).unwrap();
        let b = mem.alloc(150_000).unwrap();
        assert!(mem
            .bytes(b, 150_000)
            .unwrap()
            .iter()
            .all(|&x| x == POISON_BYTE));
        let c = mem.alloc(150_000).unwrap();
        mem.free(b).unwrap();
        mem.free(c).unwrap();
        assert!(mem.cached_bytes() <= 200_000, "{}", mem.cached_bytes());
    }

    /// Base pointers take the hash lookup, every other pointer the table's search: both give the
    /// table's answers, errors included, for in-bounds, past-the-end, interior and freed pointers.
    #[test]
    fn pointer_checks_agree_with_the_table() {
        use crate::compute::{Access, InPlace};
        let mut mem = HostMemory::recycling(1 << 20, false);
        let a = mem.alloc(100).unwrap();
        let b = mem.alloc(64).unwrap();
        let inside = DevicePtr(a.0 + 40);
        let cases = [
            (a, 100),
            (a, 101),
            (a, 0),
            (inside, 60),
            (inside, 61),
            (b, 64),
            (b, 65),
        ];
        for (ptr, bytes) in cases {
            let table = mem.table.check(ptr, bytes).map_err(|e| e.to_string());
            let located = mem.locate(ptr, bytes).map_err(|e| e.to_string());
            assert_eq!(located, table, "{ptr:?} + {bytes}");
            let address = mem.host_address(ptr, bytes);
            assert_eq!(address.is_ok(), table.is_ok(), "{ptr:?} + {bytes}");
            assert_eq!(mem.bytes(ptr, bytes).is_ok(), table.is_ok());
        }
        assert!(matches!(
            mem.bytes(a, 101),
            Err(BackendError::OutOfBounds {
                allocation_size: 100,
                ..
            })
        ));
        let mut acc = Accesses::new("t", InPlace::Forbidden);
        acc.push("x", a, 100, Access::Read, true);
        acc.push("y", b, 64, Access::Write, true);
        assert!(mem.check_accesses(&acc).is_ok());
        acc.push("z", inside, 61, Access::Read, false);
        assert!(matches!(
            mem.check_accesses(&acc),
            Err(BackendError::OutOfBounds { .. })
        ));
        mem.free(a).unwrap();
        for ptr in [a, inside] {
            assert!(matches!(
                mem.host_address(ptr, 1),
                Err(BackendError::InvalidPointer { .. })
            ));
        }
        // A buffer reused from the cache is found at its new address only.
        let c = mem.alloc(100).unwrap();
        assert!(mem.host_address(c, 100).is_ok());
        assert!(mem.bytes(a, 1).is_err());
    }

    #[test]
    fn the_reference_memory_does_not_recycle() {
        let mut mem = HostMemory::default();
        let a = mem.alloc(4096).unwrap();
        mem.free(a).unwrap();
        assert_eq!(mem.cached_bytes(), 0);
    }
}
