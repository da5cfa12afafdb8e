//! The caching memory pool, one implementation for every backend, modelled on PyTorch's CUDA caching
//! allocator. It takes segments from a backend's own allocator ([`RawAllocator`]) and hands out
//! blocks inside them:
//!
//! - sizes round up to 512 bytes;
//! - requests up to 1 MiB are *small* and carved from 2 MiB segments (or, where `max_size` leaves less
//!   room than that, a segment of their own size); larger ones are *large* and get segments of their
//!   own size rounded to 2 MiB; the two kinds never share a segment;
//! - a free block is found best-fit (smallest that fits, lowest address on ties) or first-fit (lowest
//!   address that fits), and split when the rest is worth keeping (512 bytes for small blocks, over
//!   1 MiB for large ones, as PyTorch does);
//! - with `enable_defrag`, a freed block merges with free neighbours in its segment;
//! - `max_size` bounds the bytes held from the backend: a request that would pass it first releases
//!   the cached segments that are wholly free and tries once more (as does a request the backend
//!   refuses), then answers [`BackendError::MemoryPoolExhausted`];
//! - `AllocationStrategy::Exact` caches nothing: every block is its own segment, returned on free;
//! - `initial_size` is reserved up front as one segment that serves requests of both kinds before
//!   new segments are taken (and, like any idle segment, goes back on `empty_cache`).
//!
//! - stream-aware: a freed block whose backend gives a fence ([`RawAllocator::reuse_fence`]; CUDA
//!   once work has gone to more than one stream) waits, out of every free list, until the fence says
//!   the work queued on every stream when it was freed has finished, so no stream gets memory that
//!   another stream's queued kernels still use. Requests take back the blocks whose fences have
//!   completed; a request that would otherwise fail waits for the rest first, as does `empty_cache`.
//!   Backends whose ops complete before they return, and single-queue WebGPU, give no fences.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::compute::{ComputeBackend, DevicePtr, MemoryFence};
use crate::error::{BackendError, Result};

/// Rounding of every request, in bytes.
pub const ROUND: usize = 512;
/// Largest request served from small segments.
pub const SMALL_LIMIT: usize = 1 << 20;
/// Size of a small segment, and the rounding of large ones.
pub const SEGMENT: usize = 2 << 20;

/// How the pool chooses among free blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllocationStrategy {
    /// The smallest free block that fits (lowest address among equals).
    #[default]
    BestFit,
    /// The free block at the lowest address that fits.
    FirstFit,
    /// No caching: each allocation is its own segment from the backend, returned when freed.
    Exact,
}

/// Settings of a memory pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryPoolConfig {
    /// Bytes reserved from the backend when the pool is made (one large segment; 0 for none).
    pub initial_size: usize,
    /// Most bytes the pool holds from the backend, cached ones included.
    pub max_size: usize,
    /// How free blocks are chosen.
    pub strategy: AllocationStrategy,
    /// Merge a freed block with its free neighbours.
    pub enable_defrag: bool,
}

impl Default for MemoryPoolConfig {
    fn default() -> Self {
        MemoryPoolConfig {
            initial_size: 0,
            max_size: usize::MAX,
            strategy: AllocationStrategy::BestFit,
            enable_defrag: true,
        }
    }
}

/// Usage figures of a pool, after `torch.cuda.memory_stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryStats {
    /// Bytes in blocks handed out (rounded sizes).
    pub allocated_bytes: usize,
    /// Most `allocated_bytes` since creation or [`reset_peak_stats`](MemoryPool::reset_peak_stats).
    pub peak_allocated_bytes: usize,
    /// Bytes held from the backend (segments), cached ones included.
    pub reserved_bytes: usize,
    /// Most `reserved_bytes` since creation or the last reset.
    pub peak_reserved_bytes: usize,
    /// Blocks handed out, in all.
    pub alloc_count: u64,
    /// Blocks returned, in all.
    pub free_count: u64,
    /// Segments held now.
    pub segments: usize,
    /// Times a request released cached segments and tried again.
    pub retries: u64,
    /// Requests answered with an error after the retry.
    pub ooms: u64,
    /// The share of free reserved bytes outside the largest free block: 0 when all free memory is one
    /// block (or there is none), near 1 when it is scattered in small pieces.
    pub fragmentation: f64,
    /// Bytes freed but not reusable yet: blocks waiting for work on the device's other streams to
    /// finish (see the module notes). Neither allocated nor free.
    pub fenced_bytes: usize,
}

/// Where the pool gets and returns its segments.
pub trait RawAllocator {
    /// `bytes` of device memory. The backend's `OutOfMemory` when it has none.
    fn raw_alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Returns memory `raw_alloc` gave.
    fn raw_free(&self, ptr: DevicePtr) -> Result<()>;
    /// A fence for a block the pool takes back now: the block is handed out again only once it is
    /// complete. `None` (the default) when reuse is safe at once.
    fn reuse_fence(&self) -> Result<Option<Box<dyn MemoryFence>>> {
        Ok(None)
    }
}

impl<B: ComputeBackend + ?Sized> RawAllocator for B {
    fn raw_alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.alloc(bytes)
    }
    fn raw_free(&self, ptr: DevicePtr) -> Result<()> {
        self.free(ptr)
    }
    fn reuse_fence(&self) -> Result<Option<Box<dyn MemoryFence>>> {
        self.memory_fence()
    }
}

/// A block inside a segment.
#[derive(Clone, Copy, Debug)]
struct Block {
    size: usize,
    free: bool,
}

/// Which requests a segment serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Requests up to [`SMALL_LIMIT`].
    Small,
    /// Larger requests.
    Large,
    /// Both: the `initial_size` reservation, which requests of either kind use before new segments.
    Shared,
}

/// One allocation from the backend.
#[derive(Debug)]
struct Segment {
    size: usize,
    kind: Kind,
    /// Blocks by address; together they cover the segment.
    blocks: BTreeMap<u64, Block>,
}

/// The caching allocator. Not thread-safe by itself; [`crate::Backend`] keeps it behind a mutex.
#[derive(Debug)]
pub struct MemoryPool {
    config: MemoryPoolConfig,
    /// Segments by base address.
    segments: BTreeMap<u64, Segment>,
    /// Free blocks as (size, address), one set per kind.
    free_small: BTreeSet<(usize, u64)>,
    free_large: BTreeSet<(usize, u64)>,
    free_shared: BTreeSet<(usize, u64)>,
    /// Blocks handed out: address to segment base.
    live: HashMap<u64, u64>,
    /// Blocks freed behind a fence: (address, segment base, fence), in order of freeing.
    fenced: VecDeque<(u64, u64, Box<dyn MemoryFence>)>,
    stats: MemoryStats,
}

fn round_up(bytes: usize, to: usize) -> Option<usize> {
    bytes.max(1).checked_next_multiple_of(to)
}

impl MemoryPool {
    /// A pool with `config`, reserving `initial_size` from `raw` at once. `InvalidArgument` when
    /// `initial_size` exceeds `max_size`; the backend's error when it cannot give `initial_size`.
    pub fn new(config: MemoryPoolConfig, raw: &(impl RawAllocator + ?Sized)) -> Result<MemoryPool> {
        if config.initial_size > config.max_size {
            return Err(BackendError::invalid(
                "memory_pool",
                format!(
                    "initial_size {} exceeds max_size {}",
                    config.initial_size, config.max_size
                ),
            ));
        }
        let mut pool = MemoryPool {
            config,
            segments: BTreeMap::new(),
            free_small: BTreeSet::new(),
            free_large: BTreeSet::new(),
            free_shared: BTreeSet::new(),
            live: HashMap::new(),
            fenced: VecDeque::new(),
            stats: MemoryStats::default(),
        };
        if config.initial_size > 0 && config.strategy != AllocationStrategy::Exact {
            let size = round_up(config.initial_size, ROUND).ok_or_else(|| {
                BackendError::overflow("memory_pool", "initial_size overflows when rounded")
            })?;
            pool.add_segment(raw, size, Kind::Shared)?;
        }
        Ok(pool)
    }

    /// The configuration.
    pub fn config(&self) -> &MemoryPoolConfig {
        &self.config
    }

    /// A block of at least `bytes`. `MemoryPoolExhausted` when `max_size` would be passed even after
    /// releasing the cache; the backend's `OutOfMemory` when it refuses after the same retry;
    /// `SizeOverflow` for a size that overflows when rounded.
    pub fn alloc(&mut self, raw: &(impl RawAllocator + ?Sized), bytes: usize) -> Result<DevicePtr> {
        let rounded = round_up(bytes, ROUND)
            .ok_or_else(|| BackendError::overflow("alloc", format!("{bytes} bytes overflow")))?;
        let small = rounded <= SMALL_LIMIT && self.config.strategy != AllocationStrategy::Exact;
        self.reclaim(false)?;
        let addr = match self.find_free(rounded, small) {
            Some(addr) => addr,
            None => {
                let segment = if self.config.strategy == AllocationStrategy::Exact {
                    rounded
                } else if small {
                    // A whole small segment where the bound leaves room for one, else just this block.
                    let room = self
                        .config
                        .max_size
                        .saturating_sub(self.stats.reserved_bytes);
                    if room >= SEGMENT {
                        SEGMENT
                    } else {
                        rounded
                    }
                } else {
                    round_up(rounded, SEGMENT).ok_or_else(|| {
                        BackendError::overflow("alloc", format!("{bytes} bytes overflow"))
                    })?
                };
                match self.grow(raw, segment, small, bytes) {
                    Ok(addr) => addr,
                    Err(e) => {
                        self.stats.ooms += 1;
                        return Err(e);
                    }
                }
            }
        };
        self.take(addr, rounded);
        Ok(DevicePtr(addr))
    }

    /// Returns a block. `InvalidPointer` for a pointer this pool did not hand out (or already took
    /// back). With `Exact`, the segment goes back to the backend at once (whose own allocator orders
    /// its reuse). Otherwise, where the backend gives a fence the block waits for it before it can be
    /// handed out again; when the fence cannot be recorded, that error, and the block stays in use
    /// (it is never reused unfenced).
    pub fn free(&mut self, raw: &(impl RawAllocator + ?Sized), ptr: DevicePtr) -> Result<()> {
        let base = *self
            .live
            .get(&ptr.0)
            .ok_or_else(|| BackendError::InvalidPointer {
                ptr: ptr.0,
                reason: "not a block of this memory pool".into(),
            })?;
        let size = self
            .segments
            .get(&base)
            .and_then(|s| s.blocks.get(&ptr.0))
            .ok_or_else(|| {
                BackendError::invalid("free", "memory pool block missing (internal error)")
            })?
            .size;
        let exact = self.config.strategy == AllocationStrategy::Exact;
        let fence = if exact { None } else { raw.reuse_fence()? };
        self.live.remove(&ptr.0);
        self.stats.allocated_bytes -= size;
        self.stats.free_count += 1;
        if exact {
            self.mark_free(base, ptr.0);
            return self.release_segment(raw, base);
        }
        match fence {
            Some(fence) => {
                self.stats.fenced_bytes += size;
                self.fenced.push_back((ptr.0, base, fence));
            }
            None => self.make_reusable(base, ptr.0),
        }
        Ok(())
    }

    /// Marks block `addr` of segment `base` free, without putting it in a free set.
    fn mark_free(&mut self, base: u64, addr: u64) -> usize {
        match self
            .segments
            .get_mut(&base)
            .and_then(|s| s.blocks.get_mut(&addr))
        {
            Some(block) => {
                block.free = true;
                block.size
            }
            None => 0,
        }
    }

    /// Puts block `addr` of segment `base` in its free set (merged with its free neighbours when
    /// `enable_defrag`).
    fn make_reusable(&mut self, base: u64, addr: u64) {
        let size = self.mark_free(base, addr);
        let Some(kind) = self.segments.get(&base).map(|s| s.kind) else {
            return;
        };
        let (mut addr, mut size) = (addr, size);
        if self.config.enable_defrag {
            (addr, size) = self.coalesce(base, addr, size);
        }
        self.free_set(kind).insert((size, addr));
    }

    /// Makes fenced blocks reusable, oldest first, up to the first whose fence has not completed
    /// (fences are recorded in order, so later ones are rarely done before it, and a request then
    /// queries one fence, not every one); with `wait`, waits for every fence. The backend's error
    /// when a fence cannot be queried or waited for (the blocks not known to be done stay fenced).
    fn reclaim(&mut self, wait: bool) -> Result<()> {
        while let Some((_, _, fence)) = self.fenced.front() {
            let done = if wait {
                fence.wait().map(|()| true)
            } else {
                fence.is_complete()
            }?;
            if !done {
                break;
            }
            let Some((addr, base, _)) = self.fenced.pop_front() else {
                break;
            };
            let size = self
                .segments
                .get(&base)
                .and_then(|s| s.blocks.get(&addr))
                .map_or(0, |b| b.size);
            self.stats.fenced_bytes -= size;
            self.make_reusable(base, addr);
        }
        Ok(())
    }

    /// Whether `ptr` is a block this pool handed out.
    pub fn owns(&self, ptr: DevicePtr) -> bool {
        self.live.contains_key(&ptr.0)
    }

    /// Returns every segment with no block in use to the backend, after waiting for the fences of
    /// fenced blocks. The backend's error when a fence or a free fails.
    pub fn empty_cache(&mut self, raw: &(impl RawAllocator + ?Sized)) -> Result<()> {
        self.reclaim(true)?;
        let idle: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, s)| s.blocks.values().all(|b| b.free))
            .map(|(&base, _)| base)
            .collect();
        for base in idle {
            self.release_segment(raw, base)?;
        }
        Ok(())
    }

    /// Returns every segment, in use or not (the pool's owner is going away), after waiting for the
    /// fences of fenced blocks as far as the device answers.
    pub fn release_all(&mut self, raw: &(impl RawAllocator + ?Sized)) {
        for (_, _, fence) in std::mem::take(&mut self.fenced) {
            let _ = fence.wait();
        }
        self.stats.fenced_bytes = 0;
        for (base, _) in std::mem::take(&mut self.segments) {
            let _ = raw.raw_free(DevicePtr(base));
        }
        self.free_small.clear();
        self.free_large.clear();
        self.free_shared.clear();
        self.live.clear();
        self.stats.reserved_bytes = 0;
        self.stats.allocated_bytes = 0;
        self.stats.segments = 0;
    }

    /// The usage figures (fragmentation is computed here, from the free blocks).
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            fragmentation: self.fragmentation(),
            ..self.stats
        }
    }

    /// Sets the peaks to the current values.
    pub fn reset_peak_stats(&mut self) {
        self.stats.peak_allocated_bytes = self.stats.allocated_bytes;
        self.stats.peak_reserved_bytes = self.stats.reserved_bytes;
    }

    fn free_set(&mut self, kind: Kind) -> &mut BTreeSet<(usize, u64)> {
        match kind {
            Kind::Small => &mut self.free_small,
            Kind::Large => &mut self.free_large,
            Kind::Shared => &mut self.free_shared,
        }
    }

    /// A free block of at least `rounded` bytes for a request of the given kind (its own segments
    /// first, then the shared reservation), removed from its free set.
    fn find_free(&mut self, rounded: usize, small: bool) -> Option<u64> {
        let own = if small { Kind::Small } else { Kind::Large };
        self.find_in(own, rounded)
            .or_else(|| self.find_in(Kind::Shared, rounded))
    }

    fn find_in(&mut self, kind: Kind, rounded: usize) -> Option<u64> {
        let strategy = self.config.strategy;
        let set = self.free_set(kind);
        let found = match strategy {
            AllocationStrategy::Exact => None,
            AllocationStrategy::BestFit => set.range((rounded, 0)..).next().copied(),
            AllocationStrategy::FirstFit => set
                .iter()
                .filter(|(size, _)| *size >= rounded)
                .min_by_key(|(_, addr)| *addr)
                .copied(),
        }?;
        set.remove(&found);
        Some(found.1)
    }

    /// A new segment of `size` whose one free block is returned (not in a free set), releasing the
    /// cache and retrying once when `max_size` or the backend refuses.
    fn grow(
        &mut self,
        raw: &(impl RawAllocator + ?Sized),
        size: usize,
        small: bool,
        requested: usize,
    ) -> Result<u64> {
        let mut retried = false;
        loop {
            let within = self
                .stats
                .reserved_bytes
                .checked_add(size)
                .is_some_and(|r| r <= self.config.max_size);
            let kind = if small { Kind::Small } else { Kind::Large };
            let attempt = if within {
                self.add_segment(raw, size, kind).map(Some)
            } else {
                Ok(None)
            };
            match attempt {
                Ok(Some(addr)) => {
                    self.free_set(kind).remove(&(size, addr));
                    return Ok(addr);
                }
                Ok(None) | Err(_) if !retried => {
                    retried = true;
                    self.stats.retries += 1;
                    self.empty_cache(raw)?;
                }
                Ok(None) => {
                    return Err(BackendError::MemoryPoolExhausted {
                        requested,
                        allocated: self.stats.allocated_bytes,
                        reserved: self.stats.reserved_bytes,
                        limit: self.config.max_size,
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes `size` bytes from the backend as a segment holding one free block (in its free set).
    fn add_segment(
        &mut self,
        raw: &(impl RawAllocator + ?Sized),
        size: usize,
        kind: Kind,
    ) -> Result<u64> {
        let base = raw.raw_alloc(size)?.0;
        let mut blocks = BTreeMap::new();
        blocks.insert(base, Block { size, free: true });
        self.segments.insert(base, Segment { size, kind, blocks });
        self.free_set(kind).insert((size, base));
        self.stats.reserved_bytes += size;
        self.stats.peak_reserved_bytes = self
            .stats
            .peak_reserved_bytes
            .max(self.stats.reserved_bytes);
        self.stats.segments += 1;
        Ok(base)
    }

    /// Hands out the free block at `addr` (already out of its free set) for `rounded` bytes, splitting
    /// off the rest when it is worth keeping (in large segments, more than [`SMALL_LIMIT`]).
    fn take(&mut self, addr: u64, rounded: usize) {
        let Some((&base, segment)) = self.segments.range_mut(..=addr).next_back() else {
            return;
        };
        let kind = segment.kind;
        let small = kind != Kind::Large;
        let Some(block) = segment.blocks.get_mut(&addr) else {
            return;
        };
        let rest = block.size - rounded;
        let exact = self.config.strategy == AllocationStrategy::Exact;
        let split = !exact
            && if small {
                rest >= ROUND
            } else {
                rest > SMALL_LIMIT
            };
        let given = if split { rounded } else { block.size };
        block.size = given;
        block.free = false;
        if split {
            let tail = addr + rounded as u64;
            segment.blocks.insert(
                tail,
                Block {
                    size: rest,
                    free: true,
                },
            );
            self.free_set(kind).insert((rest, tail));
        }
        self.live.insert(addr, base);
        self.stats.allocated_bytes += given;
        self.stats.peak_allocated_bytes = self
            .stats
            .peak_allocated_bytes
            .max(self.stats.allocated_bytes);
        self.stats.alloc_count += 1;
    }

    /// Merges the free block (`addr`, `size`) of segment `base` with its free neighbours, taking
    /// them out of their free set; returns the merged block.
    fn coalesce(&mut self, base: u64, addr: u64, size: usize) -> (u64, usize) {
        let Some(segment) = self.segments.get_mut(&base) else {
            return (addr, size);
        };
        let kind = segment.kind;
        let mut removed = Vec::new();
        let (mut start, mut len) = (addr, size);
        if let Some((&next, b)) = segment.blocks.range(addr + 1..).next() {
            if b.free && next == addr + size as u64 {
                removed.push((b.size, next));
                len += b.size;
            }
        }
        if let Some((&prev, b)) = segment.blocks.range(..addr).next_back() {
            if b.free && prev + b.size as u64 == addr {
                removed.push((b.size, prev));
                start = prev;
                len += b.size;
            }
        }
        for &(_, at) in &removed {
            segment.blocks.remove(&at);
        }
        segment.blocks.remove(&addr);
        segment.blocks.insert(
            start,
            Block {
                size: len,
                free: true,
            },
        );
        let set = self.free_set(kind);
        for r in removed {
            set.remove(&r);
        }
        (start, len)
    }

    /// Returns segment `base` (all of whose blocks are free) to the backend.
    fn release_segment(&mut self, raw: &(impl RawAllocator + ?Sized), base: u64) -> Result<()> {
        let Some(segment) = self.segments.remove(&base) else {
            return Ok(());
        };
        let set = self.free_set(segment.kind);
        for (&at, b) in &segment.blocks {
            set.remove(&(b.size, at));
        }
        self.stats.reserved_bytes -= segment.size;
        self.stats.segments -= 1;
        raw.raw_free(DevicePtr(base))
    }

    /// The share of free reserved bytes outside the largest free block (0 with none free).
    fn fragmentation(&self) -> f64 {
        let sizes = self
            .free_small
            .iter()
            .chain(&self.free_large)
            .chain(&self.free_shared)
            .map(|&(s, _)| s);
        let (total, largest) = sizes.fold((0usize, 0usize), |(t, l), s| (t + s, l.max(s)));
        if total == 0 {
            0.0
        } else {
            1.0 - largest as f64 / total as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A backend allocator that hands out addresses 1 GiB apart and records what is live. With
    /// `fences` set, every free gets a fence that completes when the shared flag is set (or when it
    /// is waited for, which counts in `waits`); with `fence_error`, recording one fails.
    #[derive(Default)]
    struct Fake {
        next: RefCell<u64>,
        live: RefCell<HashMap<u64, usize>>,
        limit: Option<usize>,
        fences: Option<Arc<AtomicBool>>,
        fence_error: bool,
        waits: Arc<AtomicUsize>,
    }

    /// A fence of [`Fake`].
    #[derive(Debug)]
    struct FakeFence {
        done: Arc<AtomicBool>,
        waits: Arc<AtomicUsize>,
    }

    impl MemoryFence for FakeFence {
        fn is_complete(&self) -> Result<bool> {
            Ok(self.done.load(Ordering::SeqCst))
        }
        fn wait(&self) -> Result<()> {
            self.waits.fetch_add(1, Ordering::SeqCst);
            self.done.store(true, Ordering::SeqCst);
            Ok(())
        }
    }

    impl RawAllocator for Fake {
        fn raw_alloc(&self, bytes: usize) -> Result<DevicePtr> {
            let used: usize = self.live.borrow().values().sum();
            if self.limit.is_some_and(|l| used + bytes > l) {
                return Err(BackendError::OutOfMemory {
                    requested: bytes,
                    available: 0,
                });
            }
            let mut next = self.next.borrow_mut();
            *next += 1 << 30;
            self.live.borrow_mut().insert(*next, bytes);
            Ok(DevicePtr(*next))
        }
        fn raw_free(&self, ptr: DevicePtr) -> Result<()> {
            self.live
                .borrow_mut()
                .remove(&ptr.0)
                .map(|_| ())
                .ok_or(BackendError::InvalidPointer {
                    ptr: ptr.0,
                    reason: "unknown".into(),
                })
        }
        fn reuse_fence(&self) -> Result<Option<Box<dyn MemoryFence>>> {
            if self.fence_error {
                return Err(BackendError::invalid("fence", "no event could be recorded"));
            }
            Ok(self.fences.as_ref().map(|done| {
                Box::new(FakeFence {
                    done: Arc::clone(done),
                    waits: Arc::clone(&self.waits),
                }) as Box<dyn MemoryFence>
            }))
        }
    }

    /// A fake whose frees are fenced, with the fences' shared flag (unset: not complete).
    fn fenced() -> (Fake, Arc<AtomicBool>) {
        let done = Arc::new(AtomicBool::new(false));
        let raw = Fake {
            fences: Some(Arc::clone(&done)),
            ..Fake::default()
        };
        (raw, done)
    }

    #[test]
    fn a_fenced_block_is_reused_only_after_its_fence_completes() {
        let (raw, done) = fenced();
        let mut p = pool(MemoryPoolConfig::default(), &raw);
        let a = p.alloc(&raw, 4096).unwrap();
        p.free(&raw, a).unwrap();
        assert!(!p.owns(a));
        assert_eq!(p.stats().allocated_bytes, 0);
        assert_eq!(p.stats().fenced_bytes, 4096);
        let b = p.alloc(&raw, 4096).unwrap();
        assert_ne!(b, a, "a block behind an incomplete fence is not handed out");
        done.store(true, Ordering::SeqCst);
        let c = p.alloc(&raw, 4096).unwrap();
        assert_eq!(c, a, "the block is reused once its fence completes");
        assert_eq!(p.stats().fenced_bytes, 0);
        assert_eq!(raw.waits.load(Ordering::SeqCst), 0, "nothing waited");
        for ptr in [b, c] {
            p.free(&raw, ptr).unwrap();
        }
        p.empty_cache(&raw).unwrap();
        let stats = p.stats();
        assert_eq!(
            (
                stats.allocated_bytes,
                stats.reserved_bytes,
                stats.fenced_bytes
            ),
            (0, 0, 0)
        );
        assert!(raw.live.borrow().is_empty(), "every segment went back");
    }

    #[test]
    fn fenced_blocks_merge_with_free_neighbours_when_released() {
        let (raw, done) = fenced();
        let mut p = pool(MemoryPoolConfig::default(), &raw);
        let a = p.alloc(&raw, 512).unwrap();
        let b = p.alloc(&raw, 512).unwrap();
        p.free(&raw, a).unwrap();
        p.free(&raw, b).unwrap();
        done.store(true, Ordering::SeqCst);
        // Both come back and merge with the segment's free tail: one block covers the segment, so a
        // request for both their bytes starts at the first (unmerged, it would go to the tail).
        let both = p.alloc(&raw, 1024).unwrap();
        assert_eq!(both, a);
        assert_eq!(p.stats().segments, 1);
        assert_eq!(p.stats().fragmentation, 0.0);
    }

    #[test]
    fn a_request_that_would_fail_waits_for_fenced_blocks_first() {
        let (mut raw, _done) = fenced();
        raw.limit = Some(4 << 20);
        let config = MemoryPoolConfig {
            max_size: 4 << 20,
            ..MemoryPoolConfig::default()
        };
        let mut p = pool(config, &raw);
        let a = p.alloc(&raw, 3 << 20).unwrap();
        p.free(&raw, a).unwrap();
        // No room for a second segment and the only block is fenced: the pool waits for the fence,
        // releases the segment, and takes a new one.
        let b = p.alloc(&raw, 3 << 20).unwrap();
        assert_eq!(raw.waits.load(Ordering::SeqCst), 1);
        assert_eq!(p.stats().retries, 1);
        assert_eq!(p.stats().fenced_bytes, 0);
        assert_eq!(p.stats().reserved_bytes, 4 << 20);
        p.free(&raw, b).unwrap();
        // empty_cache waits for the fence of the block just freed, then returns its segment.
        p.empty_cache(&raw).unwrap();
        assert_eq!(raw.waits.load(Ordering::SeqCst), 2);
        assert_eq!(p.stats().reserved_bytes, 0);
        assert!(raw.live.borrow().is_empty());
    }

    #[test]
    fn a_free_whose_fence_cannot_be_recorded_keeps_the_block_in_use() {
        let raw = Fake::default();
        let mut p = pool(MemoryPoolConfig::default(), &raw);
        let a = p.alloc(&raw, 1000).unwrap();
        let failing = Fake {
            fence_error: true,
            ..Fake::default()
        };
        assert!(matches!(
            p.free(&failing, a),
            Err(BackendError::InvalidArgument { .. })
        ));
        assert!(p.owns(a), "never reused unfenced");
        assert_eq!(p.stats().allocated_bytes, 1024);
        p.free(&raw, a).unwrap();
        assert_eq!(p.stats().allocated_bytes, 0);
    }

    #[test]
    fn exact_blocks_go_back_to_the_backend_without_a_pool_fence() {
        let (raw, _done) = fenced();
        let config = MemoryPoolConfig {
            strategy: AllocationStrategy::Exact,
            ..MemoryPoolConfig::default()
        };
        let mut p = pool(config, &raw);
        let a = p.alloc(&raw, 1000).unwrap();
        p.free(&raw, a).unwrap();
        assert!(
            raw.live.borrow().is_empty(),
            "the backend's own free orders reuse"
        );
        assert_eq!(p.stats().fenced_bytes, 0);
    }

    fn pool(config: MemoryPoolConfig, raw: &Fake) -> MemoryPool {
        MemoryPool::new(config, raw).unwrap()
    }

    #[test]
    fn small_blocks_share_a_segment_and_are_reused() {
        let raw = Fake::default();
        let mut p = pool(MemoryPoolConfig::default(), &raw);
        let a = p.alloc(&raw, 1).unwrap();
        let b = p.alloc(&raw, 513).unwrap();
        assert_eq!(b.0, a.0 + 512, "a split after 512 rounded bytes");
        assert_eq!(p.stats().segments, 1);
        assert_eq!(p.stats().reserved_bytes, SEGMENT);
        assert_eq!(p.stats().allocated_bytes, 512 + 1024);
        p.free(&raw, a).unwrap();
        // Free: a's 512 bytes and the segment's tail; all but the tail count as fragmented.
        let free = (SEGMENT - 1024) as f64;
        assert!((p.stats().fragmentation - 512.0 / free).abs() < 1e-12);
        let c = p.alloc(&raw, 100).unwrap();
        assert_eq!(c, a, "the freed block is reused");
        assert_eq!(raw.live.borrow().len(), 1);
    }

    #[test]
    fn large_blocks_get_their_own_segments_and_split_only_big_rests() {
        let raw = Fake::default();
        let mut p = pool(MemoryPoolConfig::default(), &raw);
        let big = p.alloc(&raw, 3 << 20).unwrap();
        assert_eq!(p.stats().reserved_bytes, 4 << 20);
        // The 1 MiB rest is not over the split threshold: the block keeps it.
        assert_eq!(p.stats().allocated_bytes, 4 << 20);
        p.free(&raw, big).unwrap();
        let smaller = p.alloc(&raw, (1 << 20) + 1).unwrap();
        assert_eq!(smaller, big);
        // Now the rest (4 MiB - 1 MiB - 512) is over 1 MiB: split.
        assert_eq!(p.stats().allocated_bytes, (1 << 20) + 512);
        let small = p.alloc(&raw, 10).unwrap();
        assert_ne!(
            raw.live.borrow().len(),
            1,
            "small requests never use large segments"
        );
        p.free(&raw, small).unwrap();
        p.free(&raw, smaller).unwrap();
        p.empty_cache(&raw).unwrap();
        assert!(raw.live.borrow().is_empty());
        assert_eq!(p.stats().reserved_bytes, 0);
    }

    #[test]
    fn freed_neighbours_coalesce_only_with_defrag() {
        for defrag in [true, false] {
            let raw = Fake::default();
            let config = MemoryPoolConfig {
                enable_defrag: defrag,
                ..Default::default()
            };
            let mut p = pool(config, &raw);
            let blocks: Vec<_> = (0..4).map(|_| p.alloc(&raw, 4096).unwrap()).collect();
            p.free(&raw, blocks[1]).unwrap();
            p.free(&raw, blocks[2]).unwrap();
            // 8 KiB fits in the merged hole only when blocks 1 and 2 merged.
            let merged = p.alloc(&raw, 8192).unwrap();
            if defrag {
                assert_eq!(merged, blocks[1]);
            } else {
                assert_ne!(merged, blocks[1]);
            }
            assert!(p.stats().fragmentation >= 0.0 && p.stats().fragmentation < 1.0);
        }
    }

    #[test]
    fn best_fit_and_first_fit_choose_different_holes() {
        for strategy in [AllocationStrategy::BestFit, AllocationStrategy::FirstFit] {
            let raw = Fake::default();
            let config = MemoryPoolConfig {
                strategy,
                enable_defrag: false,
                ..Default::default()
            };
            let mut p = pool(config, &raw);
            let big_hole = p.alloc(&raw, 8192).unwrap();
            let _keep = p.alloc(&raw, 512).unwrap();
            let small_hole = p.alloc(&raw, 1024).unwrap();
            let _keep2 = p.alloc(&raw, 512).unwrap();
            p.free(&raw, big_hole).unwrap();
            p.free(&raw, small_hole).unwrap();
            let got = p.alloc(&raw, 1024).unwrap();
            match strategy {
                AllocationStrategy::BestFit => assert_eq!(got, small_hole),
                _ => assert_eq!(got, big_hole),
            }
        }
    }

    #[test]
    fn max_size_releases_the_cache_retries_once_then_refuses() {
        let raw = Fake::default();
        let config = MemoryPoolConfig {
            max_size: 6 << 20,
            ..Default::default()
        };
        let mut p = pool(config, &raw);
        let a = p.alloc(&raw, 4 << 20).unwrap();
        let b = p.alloc(&raw, 1 << 20).unwrap();
        p.free(&raw, b).unwrap();
        // 4 MiB live + a 4 MiB segment passes 6 MiB even after the cached small segment goes.
        let err = p.alloc(&raw, 3 << 20).unwrap_err();
        assert!(
            matches!(err, BackendError::MemoryPoolExhausted { .. }),
            "{err}"
        );
        let stats = p.stats();
        assert_eq!((stats.retries, stats.ooms), (1, 1));
        assert_eq!(
            stats.reserved_bytes,
            4 << 20,
            "the cache was released before giving up"
        );
        // With `a` back in the cache, a 6 MiB request releases it and fits.
        p.free(&raw, a).unwrap();
        let c = p.alloc(&raw, 6 << 20).unwrap();
        assert_eq!(p.stats().retries, 2);
        let err = p.alloc(&raw, 1).unwrap_err();
        match err {
            BackendError::MemoryPoolExhausted {
                requested,
                allocated,
                reserved,
                limit,
            } => assert_eq!(
                (requested, allocated, reserved, limit),
                (1, 6 << 20, 6 << 20, 6 << 20)
            ),
            other => panic!("{other}"),
        }
        p.free(&raw, c).unwrap();
        p.empty_cache(&raw).unwrap();
        assert!(raw.live.borrow().is_empty());
        assert_eq!(p.stats().allocated_bytes, 0);
    }

    #[test]
    fn a_refusing_backend_gets_one_retry_after_the_cache_is_released() {
        let raw = Fake {
            limit: Some(4 << 20),
            ..Default::default()
        };
        let mut p = pool(MemoryPoolConfig::default(), &raw);
        let a = p.alloc(&raw, 10).unwrap();
        p.free(&raw, a).unwrap();
        // 2 MiB cached + 4 MiB asked > the backend's 4 MiB: release, retry, succeed.
        let big = p.alloc(&raw, 3 << 20).unwrap();
        assert_eq!(p.stats().retries, 1);
        p.free(&raw, big).unwrap();
    }

    #[test]
    fn exact_returns_every_block_at_once_and_initial_size_is_reserved() {
        let raw = Fake::default();
        let exact = MemoryPoolConfig {
            strategy: AllocationStrategy::Exact,
            ..Default::default()
        };
        let mut p = pool(exact, &raw);
        let a = p.alloc(&raw, 1000).unwrap();
        assert_eq!(raw.live.borrow()[&a.0], 1024);
        p.free(&raw, a).unwrap();
        assert!(raw.live.borrow().is_empty());
        assert!(p.free(&raw, a).is_err(), "double free is refused");

        let reserved = MemoryPoolConfig {
            initial_size: 8 << 20,
            ..Default::default()
        };
        let mut p = pool(reserved, &raw);
        assert_eq!(p.stats().reserved_bytes, 8 << 20);
        let big = p.alloc(&raw, 3 << 20).unwrap();
        let small = p.alloc(&raw, 100).unwrap();
        assert_eq!(small.0, big.0 + (3 << 20));
        assert_eq!(
            raw.live.borrow().len(),
            1,
            "both kinds served from the initial segment"
        );
        p.free(&raw, big).unwrap();
        p.free(&raw, small).unwrap();
        p.empty_cache(&raw).unwrap();
        assert!(raw.live.borrow().is_empty());
        assert!(MemoryPool::new(
            MemoryPoolConfig {
                initial_size: 2,
                max_size: 1,
                ..Default::default()
            },
            &raw
        )
        .is_err());
    }
}
