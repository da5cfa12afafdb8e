//! Streams, events, page-locked host buffers, and futures that complete when device work does.
//!
//! - [`Backend::create_stream`] gives a [`Stream`]; [`Stream::run`] makes it current on this thread for
//!   the ops inside a closure. Before those ops, the stream waits (on the device) for the work already
//!   enqueued on the default stream, so their inputs are ready; nothing else is implied, so order other
//!   streams with [`Stream::record_event`] and [`Stream::wait_event`].
//! - [`Backend::matmul_async`], [`Backend::copy_host_to_device_async`] and
//!   [`Backend::copy_device_to_host_async`] return a [`Completion`]: a future that resolves when the
//!   device work it stands for has completed. It needs no async runtime: a waiting thread wakes the task.
//!   Dropping an unfinished `Completion` blocks until the work is done, so host memory it borrows cannot
//!   be freed or changed under a copy.
//! - [`Backend::alloc_pinned`] gives a [`PinnedBuffer`]: page-locked host memory on CUDA (copies from it
//!   overlap with compute), ordinary memory on backends whose ops complete before they return.
//!
//! On the reference and CPU backends every op completes before it returns, so their streams are ordered
//! queues by construction and every `Completion` is ready at once.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::backend::Backend;
use crate::compute::{EventId, HostBuffer, StreamId};
use crate::dtype::{DType, Element};
use crate::error::{BackendError, Result};
use crate::shape::checked_numel;
use crate::tensor::Tensor;

/// An ordered queue of work on one backend's device.
#[derive(Clone, Debug)]
pub struct Stream {
    backend: Backend,
    id: StreamId,
}

/// Restores the previous current stream when dropped.
struct CurrentStream<'a> {
    backend: &'a Backend,
    previous: StreamId,
}

impl Drop for CurrentStream<'_> {
    fn drop(&mut self) {
        // Restoring a stream this backend handed out cannot fail.
        let _ = self.backend.compute().set_current_stream(self.previous);
    }
}

impl Stream {
    /// The stream's id within its backend.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The backend the stream belongs to.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Runs `f` with this stream current on this thread, so the ops `f` issues on this backend are
    /// enqueued here. First the stream waits for the work already enqueued on the default stream. The
    /// previous current stream is restored afterwards, also when `f` fails.
    pub fn run<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let compute = self.backend.compute();
        if self.id != StreamId::DEFAULT {
            let previous = compute.set_current_stream(StreamId::DEFAULT)?;
            let guard = CurrentStream {
                backend: &self.backend,
                previous,
            };
            let inputs_ready = Event::record(&self.backend)?;
            compute.set_current_stream(self.id)?;
            compute.wait_event(inputs_ready.id)?;
            let out = f();
            drop(guard);
            return out;
        }
        let previous = compute.set_current_stream(self.id)?;
        let _guard = CurrentStream {
            backend: &self.backend,
            previous,
        };
        f()
    }

    /// Records an event after the work enqueued on this stream so far.
    pub fn record_event(&self) -> Result<Event> {
        let compute = self.backend.compute();
        let previous = compute.set_current_stream(self.id)?;
        let _guard = CurrentStream {
            backend: &self.backend,
            previous,
        };
        Event::record(&self.backend)
    }

    /// Makes this stream wait (on the device) for `event`. `DeviceMismatch` for an event of another
    /// backend instance.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        if !event.backend.same_instance(&self.backend) {
            return Err(BackendError::DeviceMismatch {
                op: "wait_event",
                details: "the event was recorded on another backend instance".into(),
            });
        }
        let compute = self.backend.compute();
        let previous = compute.set_current_stream(self.id)?;
        let _guard = CurrentStream {
            backend: &self.backend,
            previous,
        };
        compute.wait_event(event.id)
    }

    /// Blocks until the work enqueued on this stream so far has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.record_event()?.synchronize()
    }
}

/// A point in a stream: complete when the work enqueued before it is. Released on drop.
#[derive(Debug)]
pub struct Event {
    backend: Backend,
    id: EventId,
}

impl Event {
    /// Records an event on this thread's current stream of `backend`.
    fn record(backend: &Backend) -> Result<Event> {
        Ok(Event {
            backend: backend.clone(),
            id: backend.compute().record_event()?,
        })
    }

    /// Whether the work before the event has completed.
    pub fn is_complete(&self) -> Result<bool> {
        self.backend.compute().event_complete(self.id)
    }

    /// Blocks until the work before the event has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.backend.compute().event_synchronize(self.id)
    }

    /// Milliseconds of device time from this event to `end` (both complete; CUDA).
    /// `FeatureUnavailable` on backends whose ops complete before they return.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.backend.compute().event_elapsed_ms(self.id, end.id)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // An id this backend handed out is always known to it.
        let _ = self.backend.compute().destroy_event(self.id);
    }
}

/// Shared between a [`Completion`] and its waiting thread.
#[derive(Debug, Default)]
struct Wake {
    waker: Mutex<Option<Waker>>,
    spawned: std::sync::atomic::AtomicBool,
}

/// A future that resolves to `T` once the device work it stands for has completed. It borrows what the
/// work reads or writes for `'a`; dropping it before completion blocks until the work is done.
#[must_use = "a Completion does nothing unless awaited; dropping it waits for the work"]
#[derive(Debug)]
pub struct Completion<'a, T> {
    event: Option<Arc<Event>>,
    value: Option<Result<T>>,
    wake: Arc<Wake>,
    _borrows: PhantomData<&'a mut ()>,
}

impl<'a, T> Completion<'a, T> {
    /// A completion of `value` after the work before `event`.
    fn after(event: Event, value: T) -> Self {
        Completion {
            event: Some(Arc::new(event)),
            value: Some(Ok(value)),
            wake: Arc::default(),
            _borrows: PhantomData,
        }
    }

    /// A completion that fails at once with `error` (no work was enqueued).
    fn failed(error: BackendError) -> Self {
        Completion {
            event: None,
            value: Some(Err(error)),
            wake: Arc::default(),
            _borrows: PhantomData,
        }
    }

    /// Blocks the calling thread until the work completes, without an executor.
    pub fn wait(mut self) -> Result<T> {
        if let Some(event) = self.event.take() {
            event.synchronize()?;
        }
        self.take_value()
    }

    fn take_value(&mut self) -> Result<T> {
        self.value.take().unwrap_or_else(|| {
            Err(BackendError::invalid(
                "Completion",
                "polled again after it returned Ready",
            ))
        })
    }
}

impl<T> Unpin for Completion<'_, T> {}

impl<T> Future for Completion<'_, T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let Some(event) = self.event.clone() else {
            return Poll::Ready(self.take_value());
        };
        match event.is_complete() {
            Err(e) => {
                self.event = None;
                return Poll::Ready(Err(e));
            }
            Ok(true) => {
                self.event = None;
                return Poll::Ready(self.take_value());
            }
            Ok(false) => {}
        }
        *self.wake.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        if !self
            .wake
            .spawned
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let wake = self.wake.clone();
            let spawned = std::thread::Builder::new()
                .name("torsh-completion".into())
                .spawn(move || {
                    // Errors surface on the next poll through `is_complete`.
                    let _ = event.synchronize();
                    if let Some(w) = wake.waker.lock().unwrap_or_else(|e| e.into_inner()).take() {
                        w.wake();
                    }
                });
            if let Err(e) = spawned {
                self.event = None;
                return Poll::Ready(Err(BackendError::invalid(
                    "Completion",
                    format!("could not start the thread that waits for the device: {e}"),
                )));
            }
        }
        Poll::Pending
    }
}

impl<T> Drop for Completion<'_, T> {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            // The work may still read or write memory this completion borrows: wait for it.
            let _ = event.synchronize();
        }
    }
}

/// Host memory for asynchronous copies, with a shape and dtype: page-locked on CUDA.
#[derive(Debug)]
pub struct PinnedBuffer {
    memory: Box<dyn HostBuffer>,
    shape: Vec<usize>,
    dtype: DType,
}

impl PinnedBuffer {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// True when the memory is page-locked (CUDA), so copies from it run asynchronously.
    pub fn is_page_locked(&self) -> bool {
        self.memory.is_page_locked()
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.memory.as_bytes()
    }

    /// The elements. `DTypeMismatch` unless `T` is the buffer's dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check::<T>("PinnedBuffer::as_slice")?;
        bytemuck::try_cast_slice(self.memory.as_bytes())
            .map_err(|e| BackendError::invalid("PinnedBuffer::as_slice", e.to_string()))
    }

    /// The elements, writable. `DTypeMismatch` unless `T` is the buffer's dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check::<T>("PinnedBuffer::as_mut_slice")?;
        bytemuck::try_cast_slice_mut(self.memory.as_bytes_mut())
            .map_err(|e| BackendError::invalid("PinnedBuffer::as_mut_slice", e.to_string()))
    }

    fn check<T: Element>(&self, op: &'static str) -> Result<()> {
        if T::DTYPE == self.dtype {
            Ok(())
        } else {
            Err(BackendError::DTypeMismatch {
                op,
                expected: self.dtype,
                got: T::DTYPE,
            })
        }
    }

    /// `ShapeMismatch`/`DTypeMismatch` unless `t` is a contiguous tensor of the buffer's shape and dtype.
    fn check_tensor(&self, op: &'static str, t: &Tensor) -> Result<()> {
        if t.dtype() != self.dtype {
            return Err(BackendError::DTypeMismatch {
                op,
                expected: self.dtype,
                got: t.dtype(),
            });
        }
        if t.shape() != self.shape.as_slice() || !t.is_contiguous() {
            return Err(BackendError::shape(
                op,
                format!(
                    "the tensor must be contiguous with the buffer's shape {:?}; got shape {:?}{}",
                    self.shape,
                    t.shape(),
                    if t.is_contiguous() {
                        ""
                    } else {
                        " (a strided view)"
                    }
                ),
            ));
        }
        Ok(())
    }
}

impl Backend {
    /// A new stream on this backend's device (CUDA hands them out from a pool of 32, round-robin).
    pub fn create_stream(&self) -> Result<Stream> {
        Ok(Stream {
            backend: self.clone(),
            id: self.compute().create_stream()?,
        })
    }

    /// The stream every op uses unless another is current.
    pub fn default_stream(&self) -> Stream {
        Stream {
            backend: self.clone(),
            id: StreamId::DEFAULT,
        }
    }

    /// A zeroed host buffer of `shape` and `dtype` for asynchronous copies: page-locked on CUDA.
    /// `SizeOverflow` for an impossible size, `OutOfMemory` when the memory cannot be had.
    pub fn alloc_pinned(&self, shape: &[usize], dtype: DType) -> Result<PinnedBuffer> {
        let op = "alloc_pinned";
        let bytes = checked_numel(op, shape)?
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| BackendError::overflow(op, format!("{shape:?} of {dtype} overflows")))?;
        Ok(PinnedBuffer {
            memory: self.compute().alloc_host(bytes)?,
            shape: shape.to_vec(),
            dtype,
        })
    }

    /// Copies `src` into the contiguous tensor `dst` on this thread's current stream; the future
    /// resolves when the copy has completed. `src` stays borrowed until then.
    pub fn copy_host_to_device_async<'a>(
        &self,
        src: &'a PinnedBuffer,
        dst: &'a Tensor,
    ) -> Completion<'a, ()> {
        let op = "copy_host_to_device_async";
        let enqueue = || -> Result<Event> {
            self.check_owner(op, dst)?;
            src.check_tensor(op, dst)?;
            self.compute()
                .copy_htod_async(dst.data_ptr(), src.memory.as_bytes())?;
            Event::record(self)
        };
        match enqueue() {
            Ok(event) => Completion::after(event, ()),
            Err(e) => Completion::failed(e),
        }
    }

    /// Copies the contiguous tensor `src` into `dst` on this thread's current stream; the future
    /// resolves when `dst` holds the data. `dst` stays borrowed until then.
    pub fn copy_device_to_host_async<'a>(
        &self,
        src: &'a Tensor,
        dst: &'a mut PinnedBuffer,
    ) -> Completion<'a, ()> {
        let op = "copy_device_to_host_async";
        let mut enqueue = || -> Result<Event> {
            self.check_owner(op, src)?;
            dst.check_tensor(op, src)?;
            self.compute()
                .copy_dtoh_async(dst.memory.as_bytes_mut(), src.data_ptr())?;
            Event::record(self)
        };
        match enqueue() {
            Ok(event) => Completion::after(event, ()),
            Err(e) => Completion::failed(e),
        }
    }

    /// `a @ b` enqueued on `stream`; the future resolves to the product once it has been computed.
    /// The same errors as [`Backend::matmul`], plus `DeviceMismatch` for a stream of another backend.
    pub fn matmul_async(
        &self,
        a: &Tensor,
        b: &Tensor,
        stream: &Stream,
    ) -> Completion<'static, Tensor> {
        if !stream.backend.same_instance(self) {
            return Completion::failed(BackendError::DeviceMismatch {
                op: "matmul_async",
                details: "the stream belongs to another backend instance".into(),
            });
        }
        let run = stream.run(|| {
            let product = self.matmul(a, b)?;
            Ok((product, Event::record(self)?))
        });
        match run {
            Ok((product, event)) => Completion::after(event, product),
            Err(e) => Completion::failed(e),
        }
    }
}
