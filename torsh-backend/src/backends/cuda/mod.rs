//! The CUDA backend: cudarc's driver API loaded at run time, kernels of our own compiled by NVRTC,
//! cuBLAS for GEMM, and cuDNN for conv2d where it can be loaded (optional: `cudnn.rs`).
//!
//! Nothing of CUDA is needed to build: the driver, NVRTC and cuBLAS are opened with `dlopen` when a CUDA
//! backend is first asked for, and their absence is an `Unavailable` error with the reason
//! (`loader.rs`). Each backend instance owns one context (the device's primary context), one stream on
//! which every op is enqueued in order, a caching allocator (`memory.rs`) and its loaded kernels
//! ([`kernels`]). Every op checks its regions against the live allocations and for aliasing, under the
//! memory lock, before it enqueues anything.
//!
//! One file per op family holds the host side of its kernels; the CUDA C sources are in `kernels/`.

mod attention;
mod blas;
mod conv;
mod cudnn;
mod device;
mod elementwise;
mod index;
pub mod kernels;
mod launch;
pub(crate) mod loader;
mod loss;
mod memory;
mod norm;
mod optim;
mod pinned;
mod pool;
mod reduce;
mod scan;
mod select;
mod sort;
mod streams;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::{result as drv, sys, CudaContext, CudaStream, DriverError, LaunchConfig};

use crate::compute::op::ops_by_impl;
use crate::compute::*;
use crate::device::{BackendType, DeviceInfo};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use device::GpuProperties;
use kernels::KernelCache;
use memory::DeviceMemory;

pub(crate) use device::list as list_devices;

/// Settings of a CUDA backend instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// The GPU's index.
    pub ordinal: usize,
    /// Whether f32 GEMM may use TF32 tensor cores (off by default, as in PyTorch).
    pub tensor_cores: bool,
    /// Whether cuDNN may serve convolutions.
    pub cudnn: bool,
}

/// Why the CUDA backend cannot run on this machine, or `None` when it can.
pub fn unavailable_reason() -> Option<String> {
    loader::unavailable_reason()
}

/// The NVRTC version `(major, minor)`, or why NVRTC cannot be loaded.
pub fn nvrtc_version() -> std::result::Result<(i32, i32), String> {
    loader::nvrtc_version()
}

/// The CUDA implementation of [`ComputeBackend`]. Build it through [`crate::Backend::cuda`].
#[derive(Debug)]
pub struct CudaBackend {
    options: CudaOptions,
    gpu: Option<Gpu>,
}

/// Everything an initialised backend holds. Op files receive `&Gpu`.
#[derive(Debug)]
pub(crate) struct Gpu {
    /// cuDNN for conv2d and its gradients, created by the first of them when `options.cudnn`
    /// (`Err`: why it cannot serve). Declared first so that it is destroyed before the streams it was bound to.
    cudnn: OnceLock<std::result::Result<cudnn::Cudnn, String>>,
    /// cuBLAS, which holds no reference to the context: declared before `ctx`, `streams` and
    /// `kernels` (the context's owners here) so that it is destroyed while the context and the
    /// streams it was bound to still exist.
    blas: blas::Blas,
    ctx: Arc<CudaContext>,
    streams: streams::Streams,
    props: GpuProperties,
    options: CudaOptions,
    kernels: KernelCache,
    memory: Mutex<DeviceMemory>,
    /// Fill fresh allocations with NaN bytes (debug builds, or `TORSH_POISON=1`).
    poison: bool,
    /// The flag of kernels that check indices on the device (`index.rs`).
    errors: index::ErrorFlag,
}

impl Gpu {
    /// The stream this thread's ops go to: the default stream unless the thread made another
    /// current (see `streams.rs`).
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        self.streams.current()
    }

    /// Kernel `function` of module `module`, from the full module (every dtype): for modules whose
    /// kernels take no dtype (`copy`).
    pub(crate) fn function(
        &self,
        module: &'static str,
        function: &str,
    ) -> Result<cudarc::driver::CudaFunction> {
        self.kernels.function(module, None, function)
    }

    /// Kernel `function` of module `module` compiled for `dtype` only (`-DTORSH_ONLY_<DTYPE>`), so
    /// the first use of a dtype compiles just that dtype's entry points. `function` must be one of
    /// `dtype`'s entry points (for a cast: one from `dtype`).
    pub(crate) fn function_for(
        &self,
        module: &'static str,
        dtype: DType,
        function: &str,
    ) -> Result<cudarc::driver::CudaFunction> {
        self.kernels.function(module, Some(dtype), function)
    }

    /// A 1-D grid-stride launch over `n` items.
    pub(crate) fn grid(&self, n: usize) -> LaunchConfig {
        launch::grid_for(n, self.props.sm_count)
    }

    /// Streaming multiprocessors on the device.
    pub(crate) fn sm_count(&self) -> i32 {
        self.props.sm_count
    }

    /// The device's compute capability (major, minor).
    pub(crate) fn compute_capability(&self) -> (i32, i32) {
        self.props.compute_capability
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("binding the CUDA context", e))
    }

    /// cuDNN, or `None` when the backend was built with `enable_cudnn(false)` or cuDNN cannot serve
    /// (missing, or its handle could not be created). The handle is created on first use; the caller
    /// has bound the context.
    fn cudnn(&self) -> Option<&cudnn::Cudnn> {
        if !self.options.cudnn {
            return None;
        }
        self.cudnn
            .get_or_init(|| cudnn::Cudnn::new(self.options.tensor_cores))
            .as_ref()
            .ok()
    }

    /// Returns a temporary block an op took from the locked `mem` (a library's workspace) once the
    /// work using it has been enqueued on this thread's current stream; fenced like
    /// [`ComputeBackend::free`].
    pub(crate) fn free_temp(&self, mem: &mut DeviceMemory, ptr: DevicePtr) -> Result<()> {
        let fences = self.streams.fences()?;
        mem.free(ptr, fences)
    }

    fn memory(&self) -> MutexGuard<'_, DeviceMemory> {
        // Ops store nothing in the table before their checks pass, so a poisoned lock is still sound.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A driver error from `what` as a `BackendError`: errors that leave the context unusable are
/// `DeviceLost`, out-of-memory is `OutOfMemory`, the rest `Driver` with the code and the driver's text.
pub(crate) fn driver_error(what: &str, e: DriverError) -> BackendError {
    use sys::CUresult::*;
    let message = format!("{what}: {}", loader::describe(e));
    match e.0 {
        CUDA_ERROR_OUT_OF_MEMORY => BackendError::OutOfMemory {
            requested: 0,
            available: drv::mem_get_info().map(|(free, _)| free).unwrap_or(0),
        },
        CUDA_ERROR_ILLEGAL_ADDRESS
        | CUDA_ERROR_LAUNCH_FAILED
        | CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUDA_ERROR_MISALIGNED_ADDRESS
        | CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUDA_ERROR_ECC_UNCORRECTABLE
        | CUDA_ERROR_CONTEXT_IS_DESTROYED => BackendError::DeviceLost {
            backend: BackendType::Cuda,
            reason: format!(
                "{message} (the CUDA context cannot be used again; build a new backend)"
            ),
        },
        code => BackendError::Driver {
            backend: BackendType::Cuda,
            code: code as i64,
            message,
        },
    }
}

impl CudaBackend {
    /// An uninitialised backend for `options`; [`ComputeBackend::init`] opens the device.
    pub fn new(options: CudaOptions) -> Self {
        CudaBackend { options, gpu: None }
    }

    fn gpu(&self) -> Result<&Gpu> {
        let gpu = self.gpu.as_ref().ok_or(BackendError::NotInitialized {
            backend: BackendType::Cuda,
        })?;
        gpu.bind()?;
        Ok(gpu)
    }

    /// Floating-point dtypes only; others are `Unsupported` for `op`.
    fn float_only(op: &'static str, dtype: DType) -> Result<()> {
        if dtype.is_float() {
            Ok(())
        } else {
            Err(BackendError::Unsupported {
                op,
                backend: BackendType::Cuda,
                dtype,
            })
        }
    }

    /// Checks `acc` against the live allocations and for aliasing, then enqueues `f`, all under the
    /// memory lock so no allocation can change in between.
    fn run(&self, acc: Accesses, f: impl FnOnce(&Gpu) -> Result<()>) -> Result<()> {
        self.run_with_memory(acc, |gpu, _| f(gpu))
    }

    /// [`run`](Self::run) for ops that need temporary device memory: `f` also gets the locked memory.
    fn run_with_memory(
        &self,
        acc: Accesses,
        f: impl FnOnce(&Gpu, &mut DeviceMemory) -> Result<()>,
    ) -> Result<()> {
        let gpu = self.gpu()?;
        let mut mem = gpu.memory();
        mem.table.check_accesses(&acc)?;
        let out = f(gpu, &mut mem);
        drop(mem);
        out
    }
}

/// True when `bytes` lie in page-locked memory the driver knows (`cuMemAllocHost`/`cuMemHostRegister`).
fn is_page_locked(bytes: &[u8]) -> bool {
    let mut flags = 0u32;
    // SAFETY: a query on a host address; pageable memory just returns an error code.
    unsafe { sys::cuMemHostGetFlags(&mut flags, bytes.as_ptr() as *mut std::ffi::c_void) }
        .result()
        .is_ok()
}

impl CudaBackend {
    /// Checks the destination and enqueues a host-to-device copy on the current stream. The caller
    /// keeps `src` unchanged until the copy has completed (see `copy_htod`).
    fn enqueue_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<&Gpu> {
        let gpu = self.gpu()?;
        let mem = gpu.memory();
        mem.table.check(dst, src.len())?;
        if !src.is_empty() {
            // SAFETY: the destination range is inside a live allocation; `src` outlives the copy
            // as the caller guarantees.
            unsafe { drv::memcpy_htod_async(dst.0, src, gpu.stream().cu_stream()) }
                .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))?;
        }
        Ok(gpu)
    }

    /// Checks the source and enqueues a device-to-host copy on the current stream. The caller does
    /// not read `dst` until the copy has completed.
    fn enqueue_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<&Gpu> {
        let gpu = self.gpu()?;
        let mem = gpu.memory();
        mem.table.check(src, dst.len())?;
        if !dst.is_empty() {
            // SAFETY: the source range is inside a live allocation; `dst` outlives the copy as the
            // caller guarantees.
            unsafe { drv::memcpy_dtoh_async(dst, src.0, gpu.stream().cu_stream()) }
                .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))?;
        }
        Ok(gpu)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Some(gpu) = self.gpu.take() {
            if gpu.bind().is_ok() {
                let _ = gpu.streams.synchronize_all();
                gpu.memory().release_all();
            }
        }
    }
}

impl ComputeBackend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }

    fn backend_type(&self) -> BackendType {
        BackendType::Cuda
    }

    fn init(&mut self) -> Result<()> {
        if self.gpu.is_some() {
            return Ok(());
        }
        if let Some(reason) = loader::unavailable_reason() {
            return Err(BackendError::Unavailable {
                backend: BackendType::Cuda,
                reason,
            });
        }
        let count = loader::driver().map(|d| d.device_count).unwrap_or(0);
        let ordinal = self.options.ordinal;
        if ordinal >= count {
            return Err(BackendError::invalid(
                "device",
                format!("device index {ordinal} is out of range: the CUDA driver reports {count} device(s)"),
            ));
        }
        let props = device::properties(ordinal)?;
        let _setup = crate::backends::device_setup();
        let ctx = loader::guarded("creating the CUDA context", || CudaContext::new(ordinal))
            .map_err(|reason| BackendError::Unavailable {
                backend: BackendType::Cuda,
                reason,
            })?
            .map_err(|e| driver_error("creating the CUDA context", e))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_error("creating a stream", e))?;
        let (major, minor) = props.compute_capability;
        let arch = format!("compute_{major}{minor}");
        let blas = blas::Blas::new(&stream, self.options.tensor_cores)?;
        let streams = streams::Streams::new(ctx.clone(), stream);
        let poison =
            cfg!(debug_assertions) || std::env::var("TORSH_POISON").is_ok_and(|v| v == "1");
        self.gpu = Some(Gpu {
            kernels: KernelCache::new(ctx.clone(), arch),
            ctx,
            streams,
            props,
            options: self.options,
            memory: Mutex::new(DeviceMemory::default()),
            blas,
            cudnn: OnceLock::new(),
            poison,
            errors: index::ErrorFlag::default(),
        });
        Ok(())
    }

    fn is_initialized(&self) -> bool {
        self.gpu.is_some()
    }

    fn device_info(&self) -> DeviceInfo {
        match &self.gpu {
            Some(gpu) => {
                let mut info = device::describe(self.options.ordinal, &gpu.props);
                info.details.push((
                    "TF32 tensor cores".into(),
                    if gpu.options.tensor_cores {
                        "on"
                    } else {
                        "off"
                    }
                    .into(),
                ));
                info.details
                    .push(("kernels compiled for".into(), gpu.kernels.arch().into()));
                info.details.push((
                    "conv2d".into(),
                    cudnn::describe(gpu.options.cudnn, &gpu.cudnn),
                ));
                info.details.push((
                    "cached bytes".into(),
                    gpu.memory().cached_bytes().to_string(),
                ));
                info
            }
            None => match device::properties(self.options.ordinal) {
                Ok(p) => device::describe(self.options.ordinal, &p),
                Err(e) => DeviceInfo {
                    device: crate::device::Device {
                        backend_type: BackendType::Cuda,
                        index: self.options.ordinal,
                    },
                    name: "CUDA device (not initialised)".into(),
                    memory_bytes: 0,
                    api: "CUDA".into(),
                    details: vec![("error".into(), e.to_string())],
                },
            },
        }
    }

    fn synchronize(&self) -> Result<()> {
        let gpu = self.gpu()?;
        gpu.streams.synchronize_all()?;
        gpu.errors.take(gpu.stream())
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let gpu = self.gpu()?;
        let mut mem = gpu.memory();
        let ptr = mem.alloc(bytes)?;
        if gpu.poison && bytes > 0 {
            // SAFETY: `ptr` is a live block of at least `bytes` bytes; the memset is stream-ordered.
            let poisoned = unsafe {
                drv::memset_d8_async(ptr.0, memory::POISON_BYTE, bytes, gpu.stream().cu_stream())
            };
            if let Err(e) = poisoned {
                // Nothing was enqueued on the block: it can go back to the cache unfenced.
                let _ = mem.free(ptr, Vec::new());
                return Err(driver_error("cuMemsetD8Async", e));
            }
        }
        Ok(ptr)
    }

    fn allocated_bytes(&self) -> Option<usize> {
        self.gpu.as_ref().map(|g| g.memory().allocated_bytes())
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        let gpu = self.gpu()?;
        let mut mem = gpu.memory();
        // Check before fencing, so a bad pointer records nothing.
        mem.table.check(ptr, 0)?;
        let fences = gpu.streams.fences()?;
        mem.free(ptr, fences)
    }

    fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let gpu = self.enqueue_htod(dst, src)?;
        // From pageable memory the copy returns once `src` has been staged; from page-locked memory
        // it is truly asynchronous, so wait for it before the caller may change `src`.
        if !src.is_empty() && is_page_locked(src) {
            gpu.stream()
                .synchronize()
                .map_err(|e| driver_error("synchronizing after a host-to-device copy", e))?;
        }
        Ok(())
    }

    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let gpu = self.enqueue_dtoh(dst, src)?;
        gpu.stream()
            .synchronize()
            .map_err(|e| driver_error("synchronizing after a device-to-host copy", e))?;
        gpu.errors.take(gpu.stream())
    }

    fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let mut acc = Accesses::new("copy_dtod", InPlace::Forbidden);
        acc.push("src", src, bytes, Access::Read, true);
        acc.push("dst", dst, bytes, Access::Write, true);
        self.run(acc, |gpu| {
            if bytes == 0 {
                return Ok(());
            }
            // SAFETY: both ranges were checked against live allocations and do not overlap.
            unsafe { drv::memcpy_dtod_async(dst.0, src.0, bytes, gpu.stream().cu_stream()) }
                .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
        })
    }

    // Every op method runs this backend's `OpImpl` of its descriptor, in the file of its family.
    crate::for_each_op!(ops_by_impl);
    fn variants(&self, op: &TunableOp) -> &'static [&'static str] {
        let with_cudnn =
            self.gpu.as_ref().is_some_and(|g| g.options.cudnn) && loader::cudnn().is_ok();
        match op {
            TunableOp::Conv2d(d) if d.dtype.is_float() && with_cudnn => &cudnn::CONV_VARIANTS,
            _ => &[],
        }
    }

    fn run_variant(&self, op: &TunableOp, variant: &str) -> Result<()> {
        let TunableOp::Conv2d(desc) = op else {
            return Err(BackendError::invalid(
                op.name(),
                format!("the cuda backend has no variant `{variant}` of this op"),
            ));
        };
        let algo = cudnn::variant_algo(variant);
        match variant {
            "cudnn" => return self.conv2d_forward(desc),
            "kernel" => {}
            _ if algo.is_some() => {}
            _ => {
                return Err(BackendError::invalid(
                    "conv2d",
                    format!("the cuda backend has no variant `{variant}` of conv2d"),
                ))
            }
        }
        let acc = desc.accesses()?;
        Self::float_only("conv2d", desc.dtype)?;
        self.run_with_memory(acc, |gpu, mem| {
            if desc.output_shape.contains(&0) {
                return Ok(());
            }
            let Some(algo) = algo else {
                return conv::conv2d(gpu, desc);
            };
            let declined = |reason: String| BackendError::FeatureUnavailable {
                feature: "a cuDNN convolution algorithm",
                reason,
            };
            let dnn = gpu
                .cudnn()
                .ok_or_else(|| declined("cuDNN is off or cannot be loaded".into()))?;
            dnn.conv2d(gpu, mem, desc, Some(algo))
                .map_err(|cudnn::Declined(reason)| declined(reason))
        })
    }

    fn create_stream(&self) -> Result<StreamId> {
        self.gpu()?.streams.create()
    }

    fn set_current_stream(&self, stream: StreamId) -> Result<StreamId> {
        self.gpu()?.streams.set_current(stream)
    }

    fn record_event(&self) -> Result<EventId> {
        self.gpu()?.streams.record_event()
    }

    fn wait_event(&self, event: EventId) -> Result<()> {
        self.gpu()?.streams.wait_event(event)
    }

    fn event_complete(&self, event: EventId) -> Result<bool> {
        self.gpu()?.streams.event_complete(event)
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        self.gpu()?.streams.event_synchronize(event)
    }

    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        self.gpu()?.streams.elapsed_ms(start, end)
    }

    fn destroy_event(&self, event: EventId) -> Result<()> {
        self.gpu()?.streams.destroy_event(event)
    }

    fn memory_fence(&self) -> Result<Option<Box<dyn MemoryFence>>> {
        self.gpu()?.streams.memory_fence()
    }

    fn alloc_host(&self, bytes: usize) -> Result<Box<dyn HostBuffer>> {
        let gpu = self.gpu()?;
        Ok(Box::new(pinned::PinnedHost::new(gpu.ctx.clone(), bytes)?))
    }

    fn copy_htod_async(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.enqueue_htod(dst, src).map(drop)
    }

    fn copy_dtoh_async(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.enqueue_dtoh(dst, src).map(drop)
    }
}
