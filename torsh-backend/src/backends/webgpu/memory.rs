//! Device memory of the WebGPU backend: one wgpu buffer per allocation behind a synthetic device
//! address (the [`AllocationTable`] checks every pointer and extent), freed buffers kept for reuse by
//! size class ([`WebGpuBufferPool`]), and copies between host and device through staging buffers.
//!
//! A buffer may be larger than the adapter lets one binding see (`max_storage_buffer_binding_size`,
//! 128 MiB on lavapipe): kernels then bind windows of it ([`Binding`]) covering what the op
//! touches in that allocation ([`Memory::open`]), one window for views near each other and one of
//! its own for a view far from the rest ([`windows`]), so views into a large tensor run as any other.
//! Ops over all of one run in pieces or two passes where they can be cut (`large/`); an op with a
//! single view larger than a binding, or with overlapping views that one binding cannot hold
//! together, answers `FeatureUnavailable`.
//!
//! wgpu copies whole 4-byte words. A host-to-device copy whose ends are not word-aligned (a 16-bit
//! dtype at an odd element) reads the edge words back and merges them, so no byte outside the
//! destination range changes; a device-to-host copy reads the covering words and keeps the bytes
//! asked for.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU64;

use crate::compute::{Accesses, AllocationTable, DevicePtr};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

use super::context::{driver, Gpu};

/// Every buffer's usages: bound as storage by kernels, and copied to and from.
const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// wgpu's copy granularity.
const WORD: u64 = wgpu::COPY_BUFFER_ALIGNMENT;

/// Usage figures of the buffer pool, like PyTorch's `memory_stats` in small.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes the caller asked for in live allocations.
    pub allocated_bytes: usize,
    /// The most `allocated_bytes` has been.
    pub peak_allocated_bytes: usize,
    /// Bytes of wgpu buffers held: live ones (rounded to their size class) plus cached free ones.
    pub reserved_bytes: usize,
    /// Bytes of freed buffers kept for reuse.
    pub cached_bytes: usize,
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that created a new wgpu buffer.
    pub misses: u64,
}

/// Freed wgpu buffers kept for reuse, by size class: sizes rounded up to 256 bytes below 1 MiB, else
/// to a sixteenth of the power of two below them (at most about 6 % waste). Holds at most
/// `limit_bytes`; beyond it freed buffers are destroyed.
#[derive(Debug)]
pub struct WebGpuBufferPool {
    free: BTreeMap<u64, Vec<wgpu::Buffer>>,
    limit_bytes: u64,
    stats: PoolStats,
}

impl WebGpuBufferPool {
    /// An empty pool that caches at most `limit_bytes` of freed buffers.
    pub fn new(limit_bytes: u64) -> Self {
        WebGpuBufferPool {
            free: BTreeMap::new(),
            limit_bytes,
            stats: PoolStats::default(),
        }
    }

    /// The size class of a request of `bytes`; `None` when rounding up overflows.
    pub fn class(bytes: u64) -> Option<u64> {
        let bytes = bytes.max(1);
        if bytes <= 1 << 20 {
            return bytes.checked_next_multiple_of(256);
        }
        let step = (1u64 << (u64::BITS - 1 - bytes.leading_zeros())) / 16;
        bytes.checked_next_multiple_of(step)
    }

    /// The pool's figures.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// A buffer of size class `class`: a cached one, or a new one from `create`.
    fn get(
        &mut self,
        class: u64,
        create: impl FnOnce() -> Result<wgpu::Buffer>,
    ) -> Result<wgpu::Buffer> {
        let cached = self.free.get_mut(&class).and_then(Vec::pop);
        if self.free.get(&class).is_some_and(Vec::is_empty) {
            self.free.remove(&class);
        }
        let buffer = match cached {
            Some(b) => {
                self.stats.hits += 1;
                self.stats.cached_bytes -= class as usize;
                b
            }
            None => {
                let b = create()?;
                self.stats.misses += 1;
                self.stats.reserved_bytes += class as usize;
                b
            }
        };
        Ok(buffer)
    }

    /// Takes back a buffer of size class `class`: cached when the limit allows, else released.
    /// Released buffers are dropped rather than destroyed, so the device frees them once the last
    /// submitted or held-back command using them is done.
    fn put(&mut self, class: u64, buffer: wgpu::Buffer) {
        if self.stats.cached_bytes as u64 + class > self.limit_bytes {
            drop(buffer);
            self.stats.reserved_bytes -= class as usize;
            return;
        }
        self.stats.cached_bytes += class as usize;
        self.free.entry(class).or_default().push(buffer);
    }

    /// Releases every cached buffer (freed once no submitted command uses it).
    pub fn empty_cache(&mut self) {
        for (class, buffers) in std::mem::take(&mut self.free) {
            for b in buffers {
                drop(b);
                self.stats.reserved_bytes -= class as usize;
            }
        }
        self.stats.cached_bytes = 0;
    }
}

/// One allocation's buffer and its size class.
#[derive(Debug)]
struct Allocation {
    buffer: wgpu::Buffer,
    class: u64,
}

/// What a storage binding may see: at most `bytes`, starting on a multiple of `align`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BindingLimit {
    /// `max_storage_buffer_binding_size` (or the backend's `max_binding_size` when lower),
    /// rounded down to whole 4-byte words.
    pub bytes: u64,
    /// `min_storage_buffer_offset_alignment`.
    pub align: u64,
}

impl BindingLimit {
    /// The window over bytes `start..end` of a buffer: its first byte (`start` aligned down) and
    /// its length in bytes (rounded up to whole words); longer than `self.bytes` when it does not fit.
    fn window(&self, start: u64, end: u64) -> (u64, u64) {
        let first = start / self.align * self.align;
        let bytes = end.saturating_sub(first).next_multiple_of(WORD).max(WORD);
        (first, bytes)
    }

    /// The limits of `limits`, with bindings of at most `cap` bytes.
    pub fn of(limits: &wgpu::Limits, cap: u64) -> BindingLimit {
        BindingLimit {
            bytes: limits.max_storage_buffer_binding_size.min(cap) / WORD * WORD,
            align: u64::from(limits.min_storage_buffer_offset_alignment).max(WORD),
        }
    }
}

/// The byte spans `(start, end)` an op touches in one allocation, gathered into the fewest windows
/// one binding can see each, sorted: in order of start, a span joins the window before it when the
/// two still fit a binding together, and opens a new one otherwise, so that each operand's kernel
/// binding is the window holding its span. `None` when a span alone is longer than a binding or two
/// windows overlap (spans that overlap without fitting one binding together).
fn windows(spans: &[(u64, u64)], limit: BindingLimit) -> Option<Vec<(u64, u64)>> {
    let mut sorted = spans.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
    for (start, end) in sorted {
        if limit.window(start, end).1 > limit.bytes {
            return None;
        }
        match out.last_mut() {
            Some(last) if limit.window(last.0, last.1.max(end)).1 <= limit.bytes => {
                last.1 = last.1.max(end);
            }
            Some(last) if start < last.1 => return None,
            _ => out.push((start, end)),
        }
    }
    Some(out)
}

/// What a kernel binds of an allocation: the whole buffer, or a window of it (a buffer larger than
/// one binding may see).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Binding<'a> {
    /// The buffer.
    pub buffer: &'a wgpu::Buffer,
    /// The window's first byte and length; `None` for the whole buffer.
    window: Option<(u64, NonZeroU64)>,
}

impl<'a> Binding<'a> {
    /// The whole of `buffer` (which must fit one binding).
    pub fn whole(buffer: &'a wgpu::Buffer) -> Self {
        Binding {
            buffer,
            window: None,
        }
    }

    /// The bind group resource.
    pub fn resource(&self) -> wgpu::BindingResource<'a> {
        match self.window {
            None => self.buffer.as_entire_binding(),
            Some((offset, size)) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: self.buffer,
                offset,
                size: Some(size),
            }),
        }
    }
}

/// The live allocations and the pool.
#[derive(Debug)]
pub(crate) struct Memory {
    pub table: AllocationTable,
    /// Largest allocation allowed by the backend's configuration.
    max_bytes: u64,
    /// What one binding may see.
    binding: BindingLimit,
    /// Whether the math kernels take f16 as it is (the device has `SHADER_F16`).
    native_f16: bool,
    /// The op being launched: per allocation larger than a binding (by base), the byte ranges of
    /// it that the op's accesses touch ([`Memory::open`]).
    spans: HashMap<u64, Vec<(u64, u64)>>,
    live: HashMap<u64, Allocation>,
    pub pool: WebGpuBufferPool,
}

/// A checked place in device memory: the allocation's buffer and the byte offset in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
}

impl Memory {
    /// Memory whose allocations are at most `max_bytes`, bound within `binding`, and whose pool
    /// caches at most `cache_limit` bytes of freed buffers; `native_f16` when the math kernels take
    /// f16 as it is (the device has `SHADER_F16`), which [`Memory::widening`] needs.
    pub fn new(
        max_bytes: u64,
        binding: BindingLimit,
        cache_limit: u64,
        native_f16: bool,
    ) -> Memory {
        Memory {
            table: AllocationTable::new(),
            max_bytes,
            binding,
            native_f16,
            spans: HashMap::new(),
            live: HashMap::new(),
            pool: WebGpuBufferPool::new(cache_limit),
        }
    }

    /// Allocates `bytes`. `OutOfMemory` when the size exceeds the largest buffer
    /// (`max_buffer_size`, or the configured `max_buffer_size` when smaller) or the device cannot
    /// provide it.
    pub fn alloc(&mut self, gpu: &Gpu, bytes: usize) -> Result<DevicePtr> {
        let limit = gpu.limits.max_buffer_size.min(self.max_bytes);
        let class = WebGpuBufferPool::class(bytes as u64).unwrap_or(u64::MAX);
        if class > limit {
            return Err(BackendError::OutOfMemory {
                requested: bytes,
                available: limit as usize,
            });
        }
        let buffer = self.pool.get(class, || {
            gpu.scoped("creating a buffer", bytes, || {
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("torsh tensor"),
                    size: class,
                    usage: USAGE,
                    mapped_at_creation: false,
                })
            })
        })?;
        let ptr = match self.table.allocate_synthetic(bytes) {
            Ok(p) => p,
            Err(e) => {
                self.pool.put(class, buffer);
                return Err(e);
            }
        };
        self.live.insert(ptr.0, Allocation { buffer, class });
        self.pool.stats.allocated_bytes += bytes;
        self.pool.stats.peak_allocated_bytes = self
            .pool
            .stats
            .peak_allocated_bytes
            .max(self.pool.stats.allocated_bytes);
        Ok(ptr)
    }

    /// Frees the allocation at `base`; `InvalidPointer` for anything else.
    pub fn free(&mut self, base: DevicePtr) -> Result<()> {
        let bytes = self.table.remove(base)?;
        self.pool.stats.allocated_bytes -= bytes;
        if let Some(a) = self.live.remove(&base.0) {
            self.pool.put(a.class, a.buffer);
        }
        Ok(())
    }

    /// The allocation holding `bytes` at `ptr`, its base and the offset of `ptr` in it, after the
    /// bounds check. `InvalidPointer` or `OutOfBounds` from the allocation table.
    fn allocation(&self, ptr: DevicePtr, bytes: usize) -> Result<(u64, &Allocation, u64)> {
        let (base, offset) = self.table.check(ptr, bytes)?;
        let a = self
            .live
            .get(&base.0)
            .ok_or_else(|| BackendError::InvalidPointer {
                ptr: ptr.0,
                reason: "allocation table and buffers disagree (internal error)".into(),
            })?;
        Ok((base.0, a, offset as u64))
    }

    /// The buffer and offset of `bytes` at `ptr`, after the bounds check.
    pub fn place(&self, ptr: DevicePtr, bytes: usize) -> Result<Place<'_>> {
        let (_, a, offset) = self.allocation(ptr, bytes)?;
        Ok(Place {
            buffer: &a.buffer,
            offset,
        })
    }

    /// What one binding may see.
    pub fn binding_limit(&self) -> BindingLimit {
        self.binding
    }

    /// How many times larger than its operands the copies are that a math op of `dtype` over `acc`
    /// runs on: 1 where the kernels take `dtype` as it is (f32, and f16 on devices with
    /// `SHADER_F16`, when every operand is at a whole element), 2 where the 16-bit operands are
    /// staged through f32 copies (`staging.rs`). The budget [`Memory::fits`] allows for.
    pub fn widening(&self, dtype: DType, acc: &Accesses) -> usize {
        let size = dtype.size_in_bytes();
        let aligned = acc.regions.iter().all(|r| r.ptr.0 % size as u64 == 0);
        let native = dtype == DType::F32 || (dtype == DType::F16 && self.native_f16);
        if native && aligned {
            1
        } else {
            (4 / size).max(1)
        }
    }

    /// Whether an op of `acc` can be launched whole: each accessed region stays within a binding
    /// once widened `widen` times (the f32 copies of 16-bit operands that are staged,
    /// `staging.rs`), and in each allocation larger than one binding the regions fall into windows
    /// that each fit one ([`windows`]). Pointers the allocation table rejects count as fitting: the
    /// launch reports them.
    pub fn fits(&self, acc: &Accesses, widen: usize) -> bool {
        let mut spans: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for r in acc.regions.iter().filter(|r| r.bytes > 0) {
            let Ok((base, a, start)) = self.allocation(r.ptr, r.bytes) else {
                continue;
            };
            let widened = (r.bytes as u64).saturating_mul(widen as u64);
            if widened.saturating_add(2 * self.binding.align) > self.binding.bytes {
                return false;
            }
            if a.class > self.binding.bytes {
                spans
                    .entry(base)
                    .or_default()
                    .push((start, start + r.bytes as u64));
            }
        }
        spans.values().all(|s| windows(s, self.binding).is_some())
    }

    /// Records the byte ranges the op of `acc` touches in each allocation larger than one binding,
    /// so that [`Memory::bound`] can give its kernels windows covering them. `FeatureUnavailable`
    /// when they do not fall into windows that each fit a binding ([`windows`]).
    pub fn open(&mut self, acc: &Accesses) -> Result<()> {
        self.spans.clear();
        for r in acc.regions.iter().filter(|r| r.bytes > 0) {
            self.cover(acc.op, r.ptr, r.bytes)?;
        }
        Ok(())
    }

    /// Adds `bytes` at `ptr` to what the op being launched touches (see [`Memory::open`]): a
    /// staged copy, for instance. `FeatureUnavailable` when the op's accesses to that allocation
    /// then no longer fall into windows that each fit a binding.
    pub fn cover(&mut self, op: &'static str, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let (base, a, start) = self.allocation(ptr, bytes)?;
        if a.class <= self.binding.bytes {
            return Ok(());
        }
        let spans = self.spans.entry(base).or_default();
        spans.push((start, start + bytes as u64));
        if windows(spans, self.binding).is_some() {
            return Ok(());
        }
        let (first, last) = spans
            .iter()
            .fold((u64::MAX, 0), |(f, l), &(s, e)| (f.min(s), l.max(e)));
        Err(BackendError::FeatureUnavailable {
            feature: "ops spanning more than one storage binding",
            reason: format!(
                "{op} touches {} bytes of one allocation in views that overlap or that one storage \
                 binding of {} bytes (the adapter's max_storage_buffer_binding_size, or the \
                 backend's max_binding_size when lower) cannot see at once; run it on views that \
                 each span less",
                last - first,
                self.binding.bytes
            ),
        })
    }

    /// The window of an allocation larger than a binding that covers bytes `start..end`: its first
    /// byte aligned down, its length rounded up to whole words. `FeatureUnavailable` when longer
    /// than a binding.
    fn window(&self, op: &'static str, start: u64, end: u64) -> Result<(u64, NonZeroU64)> {
        let (first, bytes) = self.binding.window(start, end);
        if bytes > self.binding.bytes {
            return Err(BackendError::FeatureUnavailable {
                feature: "ops spanning more than one storage binding",
                reason: format!(
                    "{op} touches {bytes} bytes of one allocation, more than the storage binding \
                     of {} bytes (the adapter's max_storage_buffer_binding_size, or the backend's \
                     max_binding_size when lower) lets a kernel see at once; run it on views that \
                     each span less",
                    self.binding.bytes
                ),
            });
        }
        Ok((first, NonZeroU64::new(bytes).unwrap_or(NonZeroU64::MIN)))
    }

    /// What a kernel binds to reach `ptr`, and the byte offset of `ptr` within it: the whole
    /// buffer for allocations that fit one binding; for a larger one, the window over what the op
    /// being launched touches there ([`Memory::open`]) that holds `ptr` (or, for a `ptr` before
    /// such a window, that window extended down to it). `InvalidPointer` as [`Memory::place`];
    /// `FeatureUnavailable` when the window would exceed a binding (or the allocation is not among
    /// the op's accesses).
    pub fn bound(&self, ptr: DevicePtr) -> Result<(Binding<'_>, u64)> {
        let (base, a, offset) = self.allocation(ptr, 0)?;
        if a.class <= self.binding.bytes {
            return Ok((Binding::whole(&a.buffer), offset));
        }
        let touched = self
            .spans
            .get(&base)
            .and_then(|s| windows(s, self.binding))
            .unwrap_or_default();
        let (start, end) = touched
            .iter()
            .find(|&&(_, e)| offset < e)
            .map_or((offset, a.class), |&(s, e)| (s.min(offset), e));
        let window = self.window("a kernel", start, end.max(offset))?;
        Ok((
            Binding {
                buffer: &a.buffer,
                window: Some(window),
            },
            offset - window.0,
        ))
    }

    /// [`Memory::bound`] in elements of `size` bytes: the binding and the offset of `ptr` in it in
    /// elements, when that offset is a multiple of `size`; `None` when it is not (the kernels index
    /// whole elements, so such an operand is staged, `staging.rs`).
    pub fn elements(&self, ptr: DevicePtr, size: usize) -> Result<Option<(Binding<'_>, usize)>> {
        let (binding, offset) = self.bound(ptr)?;
        Ok(offset
            .is_multiple_of(size as u64)
            .then_some((binding, (offset / size as u64) as usize)))
    }

    /// [`Memory::elements`] for the first element of a view at element `first` past `ptr`: kernels
    /// index views from there, so that a window of a large allocation starts at the view.
    /// `SizeOverflow` when the view's address overflows.
    pub fn view_elements(
        &self,
        ptr: DevicePtr,
        first: usize,
        size: usize,
    ) -> Result<Option<(Binding<'_>, usize)>> {
        let at = first
            .checked_mul(size)
            .and_then(|bytes| ptr.offset(bytes))
            .ok_or_else(|| {
                BackendError::overflow("webgpu view", "pointer + view offset overflows")
            })?;
        self.elements(at, size)
    }

    /// [`Memory::elements_u32`] for each `(ptr, elements)` in turn, of elements of `size` bytes:
    /// their bindings and element offsets, or `None` when any one is misaligned or out of 32-bit
    /// reach.
    pub fn elements_u32_each(
        &self,
        operands: &[(DevicePtr, usize)],
        size: usize,
    ) -> Result<Option<(Vec<Binding<'_>>, Vec<u32>)>> {
        let mut buffers = Vec::with_capacity(operands.len());
        let mut offsets = Vec::with_capacity(operands.len());
        for &(ptr, elements) in operands {
            let Some((buffer, first)) = self.elements_u32(ptr, elements, size)? else {
                return Ok(None);
            };
            buffers.push(buffer);
            offsets.push(first);
        }
        Ok(Some((buffers, offsets)))
    }

    /// [`Memory::elements`] for an operand of `elements` elements of `size` bytes, with the element
    /// offset as a `u32`: `None` also when the operand's last element is past what 32-bit indices
    /// reach.
    pub fn elements_u32(
        &self,
        ptr: DevicePtr,
        elements: usize,
        size: usize,
    ) -> Result<Option<(Binding<'_>, u32)>> {
        Ok(self.elements(ptr, size)?.and_then(|(buffer, first)| {
            let end = first.checked_add(elements)?;
            u32::try_from(end).ok()?;
            Some((buffer, first as u32))
        }))
    }

    /// Destroys every buffer, live or cached (the backend is going away).
    pub fn release_all(&mut self) {
        for (_, a) in self.live.drain() {
            a.buffer.destroy();
        }
        self.pool.empty_cache();
    }
}

/// Copies `src` into the buffer at `at`. Whole words go through `Queue::write_buffer` (ordered
/// before any later submission); partial edge words are read back first and merged.
pub(crate) fn write(gpu: &Gpu, at: Place<'_>, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    let start = at.offset;
    let end = start + src.len() as u64;
    let (lo, hi) = (start / WORD * WORD, end.next_multiple_of(WORD));
    let staged;
    let data = if lo == start && hi == end {
        src
    } else {
        // The covering words, with the caller's bytes merged in.
        let mut words = read(gpu, at.buffer, lo, hi - lo)?;
        let from = (start - lo) as usize;
        words[from..from + src.len()].copy_from_slice(src);
        staged = words;
        &staged
    };
    gpu.scoped("writing to a buffer", data.len(), || {
        gpu.write_buffer(at.buffer, lo, data);
    })
}

/// Reads `len` bytes at byte `offset` of `buffer` (any alignment) into a new vector.
pub(crate) fn read_bytes(gpu: &Gpu, at: Place<'_>, len: usize) -> Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let start = at.offset;
    let end = start + len as u64;
    let (lo, hi) = (start / WORD * WORD, end.next_multiple_of(WORD));
    let words = read(gpu, at.buffer, lo, hi - lo)?;
    let from = (start - lo) as usize;
    Ok(words[from..from + len].to_vec())
}

/// Reads the word-aligned range `[offset, offset + len)` of `buffer`: a copy into a mappable staging
/// buffer, then a blocking map.
pub(crate) fn read(gpu: &Gpu, buffer: &wgpu::Buffer, offset: u64, len: u64) -> Result<Vec<u8>> {
    let staging = gpu.scoped("creating a staging buffer", len as usize, || {
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("torsh read-back"),
            size: len,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, len);
        gpu.submit_now([encoder.finish()]);
        staging
    })?;
    let out = map_read(gpu, &staging);
    staging.destroy();
    out
}

/// The contents of a `MAP_READ` buffer once the work submitted so far has completed (a blocking map).
pub(crate) fn map_read(gpu: &Gpu, staging: &wgpu::Buffer) -> Result<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    gpu.wait()?;
    rx.recv()
        .map_err(|_| driver("the read-back mapping never completed".into()))?
        .map_err(|e| driver(format!("mapping a read-back buffer: {e}")))?;
    let out = staging
        .get_mapped_range(..)
        .map(|view| view.to_vec())
        .map_err(|e| driver(format!("reading a mapped read-back buffer: {e}")))?;
    staging.unmap();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{windows, BindingLimit, WebGpuBufferPool};

    #[test]
    fn spans_gather_into_the_fewest_windows_that_each_fit_a_binding() {
        let limit = BindingLimit {
            bytes: 1000,
            align: 100,
        };
        // Near spans share a window; a far one opens its own; nesting adds nothing.
        assert_eq!(
            windows(&[(5000, 5100), (150, 400), (420, 900), (200, 300)], limit),
            Some(vec![(150, 900), (5000, 5100)])
        );
        // Aligned down, 150..1050 takes 1000 bytes from 100: still one window; 150..1120 not.
        assert_eq!(
            windows(&[(150, 400), (900, 1050)], limit),
            Some(vec![(150, 1050)])
        );
        assert_eq!(
            windows(&[(150, 400), (900, 1120)], limit),
            Some(vec![(150, 400), (900, 1120)])
        );
        // Overlapping spans that one binding cannot hold together, and one span too long alone.
        assert_eq!(windows(&[(0, 800), (600, 1400)], limit), None);
        assert_eq!(windows(&[(50, 1060)], limit), None);
        assert_eq!(windows(&[], limit), Some(vec![]));
    }

    #[test]
    fn size_classes_round_up_and_waste_little() {
        let class = |b| WebGpuBufferPool::class(b).unwrap();
        assert_eq!(class(0), 256);
        assert_eq!(class(257), 512);
        assert_eq!(class(1 << 20), 1 << 20);
        assert_eq!(WebGpuBufferPool::class(u64::MAX), None);
        let big = (3 << 20) + 1;
        let c = class(big);
        assert!(c >= big && (c - big) * 16 <= big);
        assert_eq!(c % 4, 0);
    }
}
