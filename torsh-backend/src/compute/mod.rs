//! The low-level device interface: [`ComputeBackend`], [`DevicePtr`], op descriptors and the memory
//! checks every backend applies before touching memory.
//!
//! The contract:
//! - **Safe**: every pointer-plus-extent is checked against the backend's live allocations, and outputs
//!   against inputs for aliasing, before any memory is touched. Bad numbers give `InvalidPointer`,
//!   `OutOfBounds`, `Aliasing`, `ShapeMismatch`, `InvalidArgument` or `SizeOverflow`, never undefined
//!   behaviour.
//! - **Ordered**: ops on one backend instance complete in submission order, like one GPU stream.
//! - **Honest**: an op a backend lacks returns `Unsupported`; no method returns `Ok` without its work done.
//! - **Column-major GEMM** with leading dimensions (BLAS). Row-major callers use `Cᵀ = Bᵀ·Aᵀ`.

pub mod access;
pub mod allocations;
pub mod desc;
pub mod op;
pub mod stream;
pub mod tunable;

use std::fmt::Debug;

pub use access::{Access, Accesses, InPlace, Region};
pub use allocations::AllocationTable;
pub use desc::*;
pub use op::{AnyOp, OpDesc, Operand, Slot};
pub use stream::{EventId, HostBuffer, MemoryFence, PageableBuffer, StreamId};
pub use tunable::{TunableOp, TuneKey};

use crate::device::{BackendType, DeviceInfo};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// [`ComputeBackend::unscale_and_check`] composed from `fill`, `binary`, `unary` and `reduce` on
/// temporaries, with one value read back to the host: the provided body, and the fallback of backends
/// whose fused kernel cannot judge a case.
pub(crate) fn unscale_by_parts<B: ComputeBackend + ?Sized>(
    device: &B,
    desc: &UnscaleDesc,
) -> Result<()> {
    desc.accesses()?.check_aliasing()?;
    if !desc.dtype.is_float() {
        return Err(BackendError::Unsupported {
            op: "unscale_and_check",
            backend: device.backend_type(),
            dtype: desc.dtype,
        });
    }
    // The flag is an operand even when nothing is unscaled or nothing overflows: reading it checks
    // its pointer (a foreign, freed or short flag fails here). It is read before any temporary is
    // allocated: a caching allocator may hand a just-freed flag's address to a temporary, which a
    // device-side copy would then report as aliasing instead of the stale pointer it is.
    let mut probe = [0u8; 4];
    device.copy_dtoh(&mut probe, desc.found_inf)?;
    let scratch = Temporaries::new(device);
    if desc.len == 0 {
        return Ok(());
    }
    let size = desc.dtype.size_in_bytes();
    device.binary(&BinaryDesc {
        op: BinaryOp::Mul,
        dtype: desc.dtype,
        lhs: StridedBuf::contiguous(desc.input, &[desc.len]),
        rhs: Value::Scalar(desc.inv_scale),
        output: desc.output,
    })?;
    // max |x| is NaN when any element is NaN and inf when any is infinite.
    let magnitude = scratch.alloc(desc.len * size)?;
    device.unary(&UnaryDesc {
        op: UnaryOp::Abs,
        dtype: desc.dtype,
        input: StridedBuf::contiguous(desc.output, &[desc.len]),
        output: magnitude,
    })?;
    let worst = scratch.alloc(size)?;
    device.reduce(&ReduceDesc {
        op: ReduceOp::Max,
        dtype: desc.dtype,
        input: StridedBuf::contiguous(magnitude, &[desc.len]),
        axis: 0,
        output: worst,
    })?;
    let mut host = [0u8; 8];
    device.copy_dtoh(&mut host[..size], worst)?;
    let value = crate::dtype::decode(desc.dtype, &host[..size]);
    if !value.is_finite() {
        device.fill(&FillDesc {
            dtype: DType::F32,
            ptr: desc.found_inf,
            len: 1,
            value: 1.0,
        })?;
    }
    Ok(())
}

/// Device allocations freed when dropped (the scratch of provided method bodies and of ops composed
/// from others).
pub(crate) struct Temporaries<'a, B: ComputeBackend + ?Sized> {
    device: &'a B,
    held: std::cell::RefCell<Vec<DevicePtr>>,
}

impl<'a, B: ComputeBackend + ?Sized> Temporaries<'a, B> {
    /// No allocations yet, on `device`.
    pub(crate) fn new(device: &'a B) -> Self {
        Temporaries {
            device,
            held: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// Allocates `bytes`, freed when `self` drops; the errors of [`ComputeBackend::alloc`].
    pub(crate) fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let ptr = self.device.alloc(bytes)?;
        self.held.borrow_mut().push(ptr);
        Ok(ptr)
    }
}

impl<B: ComputeBackend + ?Sized> Drop for Temporaries<'_, B> {
    fn drop(&mut self) {
        for ptr in self.held.get_mut().drain(..) {
            let _ = self.device.free(ptr);
        }
    }
}

/// An opaque device address. Offset arithmetic is allowed (`ptr.offset(bytes)`); validity is checked
/// by the backend on every use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The pointer `bytes` further on, or `None` on overflow.
    pub fn offset(self, bytes: usize) -> Option<DevicePtr> {
        self.0.checked_add(bytes as u64).map(DevicePtr)
    }
}

/// One compute device's ops over raw device memory. Object-safe: used as `Box<dyn ComputeBackend>`.
///
/// Every op takes a descriptor whose `accesses()` method performs the shape checks common to all
/// backends; an implementation checks the resulting regions with an [`AllocationTable`] (or its own
/// equivalent) before running.
///
/// Every op method has a provided body that answers `Unsupported`, so a backend adopts a new op when
/// it is ready; the parity suite reports such cells as unsupported. [`for_each_op!`](crate::for_each_op)
/// lists the op methods, and each descriptor's [`OpDesc`] impl says what the op touches.
pub trait ComputeBackend: Send + Sync + Debug {
    /// Short name ("reference", "cpu", "cuda", ...).
    fn name(&self) -> &str;

    /// The backend kind this instance serves.
    fn backend_type(&self) -> BackendType;

    /// This backend as `Any`, for APIs particular to one backend (such as
    /// `webgpu::WebGpuKernelExecutor` in builds with WebGPU); `None` by default.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// Selects the device and creates its context. Idempotent. Other methods return
    /// `NotInitialized` until it has succeeded.
    fn init(&mut self) -> Result<()>;

    /// True once `init` has succeeded.
    fn is_initialized(&self) -> bool;

    /// A description of the device this instance drives.
    fn device_info(&self) -> DeviceInfo;

    /// Blocks until every op submitted so far has completed.
    fn synchronize(&self) -> Result<()>;

    /// Allocates `bytes` of device memory; `OutOfMemory` when it cannot. The contents are unspecified
    /// (the reference backend fills them with `0xFF` bytes, a NaN pattern, so unwritten outputs show).
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;

    /// Bytes currently allocated through this instance and not yet freed, where the backend tracks them
    /// (`None` otherwise).
    fn allocated_bytes(&self) -> Option<usize> {
        None
    }

    /// Frees an allocation by its base pointer; `InvalidPointer` for anything else. The reference and
    /// CPU backends never hand a freed address out again, so a stale pointer stays invalid there; CUDA
    /// pointers are driver addresses, and its caching allocator may return a freed block from a later
    /// `alloc`, after which the old pointer names the new allocation (as with `cudaFree`).
    fn free(&self, ptr: DevicePtr) -> Result<()>;

    /// Copies `src` to device memory at `dst`.
    fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;

    /// Copies `dst.len()` bytes of device memory at `src` to `dst`.
    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()>;

    /// Copies `bytes` from `src` to `dst` on the device; overlapping ranges are `Aliasing`.
    fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;

    /// Column-major GEMM; see [`GemmDesc`].
    fn gemm(&self, desc: &GemmDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Strided batched GEMM; see [`BatchedGemmDesc`]. The provided implementation validates the whole
    /// descriptor (shapes, and aliasing between the regions all batches span), then issues one
    /// [`ComputeBackend::gemm`] per matrix ([`BatchedGemmDesc::batches`]: none when `m` or `n` is 0).
    /// It cannot check the regions against memory before the first GEMM, so a batch past the end of
    /// an allocation fails after the ones before it were written: backends with an allocation table
    /// override it to check every batch first (the reference and CPU backends do).
    fn batched_gemm(&self, desc: &BatchedGemmDesc) -> Result<()> {
        desc.accesses()?.check_aliasing()?;
        for gemm in desc.batches() {
            self.gemm(&gemm?)?;
        }
        Ok(())
    }

    /// Matrix-vector product; see [`GemvDesc`].
    fn gemv(&self, desc: &GemvDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// 2-D convolution forward; see [`Conv2dDesc`].
    fn conv2d_forward(&self, desc: &Conv2dDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// The input gradient of a 2-D convolution (and the transposed convolution); see
    /// [`Conv2dBackwardInputDesc`].
    fn conv2d_backward_input(&self, desc: &Conv2dBackwardInputDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// The weight gradient of a 2-D convolution; see [`Conv2dBackwardWeightDesc`].
    fn conv2d_backward_weight(&self, desc: &Conv2dBackwardWeightDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Scaled dot-product attention; see [`AttentionDesc`].
    fn attention(&self, desc: &AttentionDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// The gradients of scaled dot-product attention; see [`AttentionBackwardDesc`].
    fn attention_backward(&self, desc: &AttentionBackwardDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Reduction along an axis; see [`ReduceDesc`].
    fn reduce(&self, desc: &ReduceDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Elementwise unary op; see [`UnaryDesc`].
    fn unary(&self, desc: &UnaryDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Elementwise binary op with broadcasting by strides; see [`BinaryDesc`].
    fn binary(&self, desc: &BinaryDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// The gradient of a unary op's input from its output's gradient; see [`UnaryBackwardDesc`].
    fn unary_backward(&self, desc: &UnaryBackwardDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Dropout (forward, or backward on a gradient) from a counter-based mask; see
    /// [`DropoutDesc`].
    fn dropout(&self, desc: &DropoutDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Softmax or log-softmax; see [`SoftmaxDesc`].
    fn softmax(&self, desc: &SoftmaxDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// The input gradient of softmax or log-softmax; see [`SoftmaxBackwardDesc`].
    fn softmax_backward(&self, desc: &SoftmaxBackwardDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Cross-entropy per sample, or its logits' gradient; see [`CrossEntropyDesc`].
    fn cross_entropy(&self, desc: &CrossEntropyDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Layer normalisation; see [`LayerNormDesc`].
    fn layer_norm(&self, desc: &LayerNormDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Batch normalisation forward with running statistics; see [`BatchNormDesc`].
    fn batch_norm(&self, desc: &BatchNormDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// The gradients of layer normalisation; see [`LayerNormBackwardDesc`].
    fn layer_norm_backward(&self, desc: &LayerNormBackwardDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// The gradients of batch normalisation; see [`BatchNormBackwardDesc`].
    fn batch_norm_backward(&self, desc: &BatchNormBackwardDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Max or average 2-D pooling; see [`Pool2dDesc`].
    fn pool2d(&self, desc: &Pool2dDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// The input gradient of 2-D pooling; see [`Pool2dBackwardDesc`].
    fn pool2d_backward(&self, desc: &Pool2dBackwardDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// One fused Adam/AdamW step; see [`AdamDesc`].
    fn adam_step(&self, desc: &AdamDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Unscales gradients and notes any inf or NaN in one pass; see [`UnscaleDesc`]. The provided
    /// body composes it from `fill`, `binary`, `unary` and `reduce` on temporaries, reading one
    /// value per call back to the host; backends override it with a fused kernel.
    fn unscale_and_check(&self, desc: &UnscaleDesc) -> Result<()> {
        unscale_by_parts(self, desc)
    }

    /// Fills with a constant; see [`FillDesc`].
    fn fill(&self, desc: &FillDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Dtype conversion; see [`CastDesc`].
    fn cast(&self, desc: &CastDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Strided copy; see [`CopyDesc`].
    fn copy_strided(&self, desc: &CopyDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Random fill; see [`RandomDesc`].
    fn random(&self, desc: &RandomDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Gathers elements by an index tensor; see [`GatherDesc`].
    fn gather(&self, desc: &GatherDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Scatters elements by an index tensor, assigning or adding; see [`ScatterDesc`].
    fn scatter(&self, desc: &ScatterDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Compares two operands into a `U8` mask; see [`CompareDesc`].
    fn compare(&self, desc: &CompareDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Picks each element from one of two operands by a mask; see [`WhereDesc`].
    fn where_(&self, desc: &WhereDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Cumulative sum or product along a dim; see [`ScanDesc`].
    fn scan(&self, desc: &ScanDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// Stable sort along a dim, with the permutation; see [`SortDesc`].
    fn sort(&self, desc: &SortDesc) -> Result<()> {
        Err(desc.unsupported(self))
    }

    /// A string that identifies this device and the settings its kernels' speed depends on (the
    /// autotuner's cache files are valid for one fingerprint). Provided: the backend kind and the
    /// device name.
    fn fingerprint(&self) -> String {
        format!("{}/{}", self.backend_type(), self.device_info().name)
    }

    /// The names of the variants (kernels or launch configurations) this backend can run `op` with,
    /// the one its plain method would use first; fewer than two when there is nothing to choose.
    /// Provided: none.
    fn variants(&self, op: &TunableOp) -> &'static [&'static str] {
        let _ = op;
        &[]
    }

    /// Runs `op` with `variant`, one of [`ComputeBackend::variants`]; every variant computes the
    /// same op, with the same checks. `InvalidArgument` for a name that is not offered (the provided
    /// body, which offers none, answers that for every name).
    fn run_variant(&self, op: &TunableOp, variant: &str) -> Result<()> {
        Err(BackendError::invalid(
            op.name(),
            format!(
                "the {} backend has no variant `{variant}` of this op",
                self.name()
            ),
        ))
    }

    /// Runs `work`, which issues ops on this backend, letting the device gather the commands it
    /// issues and submit them together (WebGPU: one queue submission) when it returns; used by graph
    /// replay. Ordering and results are those of issuing the ops one by one. The provided body runs
    /// `work` as it is, and returns its error.
    fn batch(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        work()
    }

    // ----- Streams, events and page-locked memory (see [`stream`]) -------------------------------
    //
    // The provided bodies suit backends whose ops complete before they return: every stream is then
    // ordered with every other, and an event is complete as soon as it is recorded.

    /// A new stream. Device backends may hand out streams from a fixed pool, round-robin.
    fn create_stream(&self) -> Result<StreamId> {
        Ok(StreamId(1))
    }

    /// Makes `stream` the one this thread's ops on this backend use, returning the previous one.
    /// `InvalidArgument` for a stream this backend did not create.
    fn set_current_stream(&self, stream: StreamId) -> Result<StreamId> {
        // The provided `create_stream` hands out stream 1 only.
        if stream.0 > 1 {
            return Err(BackendError::invalid(
                "set_current_stream",
                format!("stream {} was not created by this backend", stream.0),
            ));
        }
        Ok(StreamId::DEFAULT)
    }

    /// Records an event on this thread's current stream.
    fn record_event(&self) -> Result<EventId> {
        Ok(EventId(0))
    }

    /// Makes this thread's current stream wait (on the device, without blocking the host) until
    /// `event` has completed.
    fn wait_event(&self, event: EventId) -> Result<()> {
        let _ = event;
        Ok(())
    }

    /// Whether the work before `event` has completed.
    fn event_complete(&self, event: EventId) -> Result<bool> {
        let _ = event;
        Ok(true)
    }

    /// Blocks until `event` has completed.
    fn event_synchronize(&self, event: EventId) -> Result<()> {
        let _ = event;
        Ok(())
    }

    /// Milliseconds of device time between two completed events, where the backend can time them;
    /// `FeatureUnavailable` otherwise.
    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        let _ = (start, end);
        Err(BackendError::FeatureUnavailable {
            feature: "event timing",
            reason: format!(
                "{} ops complete before they return; time them on the host",
                self.name()
            ),
        })
    }

    /// A fence after the work enqueued so far on every stream, for memory that a caching allocator
    /// above the backend (the runtime pool) is taking back: it hands the memory out again only once
    /// the fence is complete, so an op on one stream never gets memory another stream's queued work
    /// still reads or writes. `None` when reuse needs no fence: the provided body, for backends
    /// whose ops complete before they return or that have one queue; CUDA while all work has gone
    /// to the default stream. The backend's error when a fence cannot be recorded.
    fn memory_fence(&self) -> Result<Option<Box<dyn MemoryFence>>> {
        Ok(None)
    }

    /// Releases an event. Backends with real events answer `InvalidArgument` for an unknown id; the
    /// provided body (events that are complete when recorded) has nothing to release.
    fn destroy_event(&self, event: EventId) -> Result<()> {
        let _ = event;
        Ok(())
    }

    /// `bytes` of host memory for asynchronous copies: page-locked where the device has such memory,
    /// ordinary memory otherwise. `OutOfMemory` when it cannot be had.
    fn alloc_host(&self, bytes: usize) -> Result<Box<dyn HostBuffer>> {
        let mut v = Vec::new();
        v.try_reserve_exact(bytes)
            .map_err(|_| BackendError::OutOfMemory {
                requested: bytes,
                available: 0,
            })?;
        v.resize(bytes, 0);
        Ok(Box::new(PageableBuffer(v)))
    }

    /// Enqueues a copy of `src` to device memory at `dst` on the current stream. The caller keeps `src`
    /// alive and unchanged until an event recorded after this call completes.
    fn copy_htod_async(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.copy_htod(dst, src)
    }

    /// Enqueues a copy of device memory at `src` into `dst` on the current stream. The caller keeps
    /// `dst` alive and does not read it until an event recorded after this call completes.
    fn copy_dtoh_async(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.copy_dtoh(dst, src)
    }
}

/// Calls the macro `$callback` with every op method of [`ComputeBackend`] and its descriptor type,
/// as `method(Descriptor),` entries in the trait's order: the one list of ops, for code that must
/// write one method per op (a backend in front of another, such as graph capture's recorder).
///
/// ```
/// use torsh_backend::compute::{ComputeBackend, OpDesc};
///
/// macro_rules! names {
///     ($($method:ident($desc:ty)),* $(,)?) => { [$(<$desc as OpDesc>::NAME),*] };
/// }
/// let names = torsh_backend::for_each_op!(names);
/// assert_eq!(names[0], "gemm");
/// assert!(names.contains(&"attention"));
/// ```
#[macro_export]
macro_rules! for_each_op {
    ($callback:ident) => {
        $callback! {
            gemm($crate::compute::GemmDesc),
            batched_gemm($crate::compute::BatchedGemmDesc),
            gemv($crate::compute::GemvDesc),
            conv2d_forward($crate::compute::Conv2dDesc),
            conv2d_backward_input($crate::compute::Conv2dBackwardInputDesc),
            conv2d_backward_weight($crate::compute::Conv2dBackwardWeightDesc),
            attention($crate::compute::AttentionDesc),
            attention_backward($crate::compute::AttentionBackwardDesc),
            reduce($crate::compute::ReduceDesc),
            unary($crate::compute::UnaryDesc),
            binary($crate::compute::BinaryDesc),
            unary_backward($crate::compute::UnaryBackwardDesc),
            dropout($crate::compute::DropoutDesc),
            softmax($crate::compute::SoftmaxDesc),
            softmax_backward($crate::compute::SoftmaxBackwardDesc),
            cross_entropy($crate::compute::CrossEntropyDesc),
            layer_norm($crate::compute::LayerNormDesc),
            batch_norm($crate::compute::BatchNormDesc),
            layer_norm_backward($crate::compute::LayerNormBackwardDesc),
            batch_norm_backward($crate::compute::BatchNormBackwardDesc),
            pool2d($crate::compute::Pool2dDesc),
            pool2d_backward($crate::compute::Pool2dBackwardDesc),
            adam_step($crate::compute::AdamDesc),
            unscale_and_check($crate::compute::UnscaleDesc),
            fill($crate::compute::FillDesc),
            cast($crate::compute::CastDesc),
            copy_strided($crate::compute::CopyDesc),
            random($crate::compute::RandomDesc),
            gather($crate::compute::GatherDesc),
            scatter($crate::compute::ScatterDesc),
            compare($crate::compute::CompareDesc),
            where_($crate::compute::WhereDesc),
            scan($crate::compute::ScanDesc),
            sort($crate::compute::SortDesc),
        }
    };
}
