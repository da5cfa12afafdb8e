//! Streams and events of one CUDA backend instance.
//!
//! Besides its default stream, an instance hands out streams from a pool of [`POOL_SIZE`], created on
//! first use and reused round-robin (as PyTorch's CUDA stream pool does), so `create_stream` is cheap and
//! bounded. Which stream a thread's ops go to is per thread and per instance ([`Streams::current`]).
//! Events live in a table by id until the caller destroys them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};

use super::driver_error;
use crate::compute::{EventId, MemoryFence, StreamId};
use crate::error::{BackendError, Result};

/// Streams in each instance's pool.
pub(crate) const POOL_SIZE: usize = 32;

/// Distinguishes instances in the per-thread table of current streams.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's current stream per instance; absent means the default stream.
    static CURRENT: RefCell<HashMap<u64, u64>> = RefCell::new(HashMap::new());
}

/// The streams and events of one backend instance.
#[derive(Debug)]
pub(crate) struct Streams {
    instance: u64,
    ctx: Arc<CudaContext>,
    default: Arc<CudaStream>,
    pool: Vec<OnceLock<Arc<CudaStream>>>,
    creating: Mutex<()>,
    next_pool_slot: AtomicUsize,
    /// Set once any pool stream exists: from then on freed memory is fenced (see `fences`).
    pool_in_use: AtomicBool,
    events: Mutex<HashMap<u64, Arc<CudaEvent>>>,
    next_event: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Streams {
    /// The streams of a new instance whose default stream is `default`.
    pub(crate) fn new(ctx: Arc<CudaContext>, default: Arc<CudaStream>) -> Streams {
        Streams {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            ctx,
            default,
            pool: (0..POOL_SIZE).map(|_| OnceLock::new()).collect(),
            creating: Mutex::new(()),
            next_pool_slot: AtomicUsize::new(0),
            pool_in_use: AtomicBool::new(false),
            events: Mutex::new(HashMap::new()),
            next_event: AtomicU64::new(1),
        }
    }

    /// The stream this thread's ops on this instance go to.
    pub(crate) fn current(&self) -> &Arc<CudaStream> {
        let id = CURRENT.with(|c| c.borrow().get(&self.instance).copied().unwrap_or(0));
        self.get(id).unwrap_or(&self.default)
    }

    fn get(&self, id: u64) -> Option<&Arc<CudaStream>> {
        match id {
            0 => Some(&self.default),
            k => self.pool.get(k as usize - 1).and_then(OnceLock::get),
        }
    }

    /// The next pool stream, created on first use.
    pub(crate) fn create(&self) -> Result<StreamId> {
        let slot = self.next_pool_slot.fetch_add(1, Ordering::Relaxed) % POOL_SIZE;
        if self.pool[slot].get().is_none() {
            let _creating = lock(&self.creating);
            if self.pool[slot].get().is_none() {
                let s = self
                    .ctx
                    .new_stream()
                    .map_err(|e| driver_error("creating a stream", e))?;
                let _ = self.pool[slot].set(s);
            }
        }
        if !self.pool_in_use.swap(true, Ordering::SeqCst) {
            // Blocks freed until now carry no fences (only the default stream could use them), and
            // an op on the new stream may take one: let the default stream's work on them finish
            // first. Frees from here on are fenced, so this happens once per instance.
            self.default
                .synchronize()
                .map_err(|e| driver_error("cuStreamSynchronize", e))?;
        }
        Ok(StreamId(slot as u64 + 1))
    }

    /// Makes `id` this thread's current stream; returns the previous one. `InvalidArgument` for a
    /// stream this instance has not created.
    pub(crate) fn set_current(&self, id: StreamId) -> Result<StreamId> {
        if self.get(id.0).is_none() {
            return Err(BackendError::invalid(
                "set_current_stream",
                format!("stream {} was not created by this CUDA backend", id.0),
            ));
        }
        let previous = CURRENT.with(|c| {
            let mut map = c.borrow_mut();
            let previous = if id == StreamId::DEFAULT {
                map.remove(&self.instance)
            } else {
                map.insert(self.instance, id.0)
            };
            previous.unwrap_or(0)
        });
        Ok(StreamId(previous))
    }

    /// Records a timing-capable event on the current stream.
    pub(crate) fn record_event(&self) -> Result<EventId> {
        let event = self
            .current()
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| driver_error("cuEventRecord", e))?;
        let id = self.next_event.fetch_add(1, Ordering::Relaxed);
        lock(&self.events).insert(id, Arc::new(event));
        Ok(EventId(id))
    }

    /// Event `id`. `InvalidArgument` for an unknown id.
    fn event(&self, id: EventId) -> Result<Arc<CudaEvent>> {
        lock(&self.events).get(&id.0).cloned().ok_or_else(|| {
            BackendError::invalid(
                "event",
                format!("event {} is not a live event of this CUDA backend", id.0),
            )
        })
    }

    /// The current stream waits for event `id`.
    pub(crate) fn wait_event(&self, id: EventId) -> Result<()> {
        self.current()
            .wait(self.event(id)?.as_ref())
            .map_err(|e| driver_error("cuStreamWaitEvent", e))
    }

    /// Whether event `id` has completed.
    pub(crate) fn event_complete(&self, id: EventId) -> Result<bool> {
        self.event(id)?
            .try_is_complete()
            .map_err(|e| driver_error("cuEventQuery", e))
    }

    /// Blocks until event `id` completes (the event table is not locked meanwhile).
    pub(crate) fn event_synchronize(&self, id: EventId) -> Result<()> {
        self.event(id)?
            .synchronize()
            .map_err(|e| driver_error("cuEventSynchronize", e))
    }

    /// Milliseconds between two events, once both have completed.
    pub(crate) fn elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        self.event(start)?
            .elapsed_ms(self.event(end)?.as_ref())
            .map_err(|e| driver_error("cuEventElapsedTime", e))
    }

    /// Releases event `id`.
    pub(crate) fn destroy_event(&self, id: EventId) -> Result<()> {
        lock(&self.events).remove(&id.0).map(drop).ok_or_else(|| {
            BackendError::invalid(
                "destroy_event",
                format!("event {} is not a live event of this CUDA backend", id.0),
            )
        })
    }

    /// Events after the work enqueued so far on every stream of this instance (the default stream and
    /// each pool stream), for memory being freed: the block may be reused only once they complete, on
    /// whichever stream reuses it. Empty while no pool stream exists (everything is then on the default
    /// stream, which orders reuse by itself).
    pub(crate) fn fences(&self) -> Result<Vec<CudaEvent>> {
        if !self.pool_in_use.load(Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        std::iter::once(&self.default)
            .chain(self.pool.iter().filter_map(OnceLock::get))
            .map(|s| {
                s.record_event(None)
                    .map_err(|e| driver_error("cuEventRecord", e))
            })
            .collect()
    }

    /// [`Streams::fences`] as a fence for the runtime pool, `None` when there are none.
    pub(crate) fn memory_fence(&self) -> Result<Option<Box<dyn MemoryFence>>> {
        let events = self.fences()?;
        Ok((!events.is_empty()).then(|| Box::new(StreamsFence(events)) as Box<dyn MemoryFence>))
    }

    /// Blocks until every stream of this instance is idle.
    pub(crate) fn synchronize_all(&self) -> Result<()> {
        for s in std::iter::once(&self.default).chain(self.pool.iter().filter_map(OnceLock::get)) {
            s.synchronize()
                .map_err(|e| driver_error("cuStreamSynchronize", e))?;
        }
        Ok(())
    }
}

/// Events recorded on every stream of an instance ([`Streams::fences`]): complete when all are.
#[derive(Debug)]
struct StreamsFence(Vec<CudaEvent>);

impl MemoryFence for StreamsFence {
    fn is_complete(&self) -> Result<bool> {
        for event in &self.0 {
            if !event
                .try_is_complete()
                .map_err(|e| driver_error("cuEventQuery", e))?
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn wait(&self) -> Result<()> {
        for event in &self.0 {
            event
                .synchronize()
                .map_err(|e| driver_error("cuEventSynchronize", e))?;
        }
        Ok(())
    }
}
