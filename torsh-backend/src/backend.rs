//! [`Backend`]: the public handle to one device, how it is found ([`Backend::auto`],
//! [`Backend::available`], [`Backend::list_devices`]) and configured ([`BackendBuilder`] and the
//! per-backend builders).
//!
//! A `Backend` is a cheap, cloneable handle (an `Arc`) to one `dyn ComputeBackend` instance. Tensors keep
//! their backend alive. Ops live in [`crate::ops`], one file per family, as methods on `Backend`.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backends::reference::ReferenceBackend;
use crate::compute::ComputeBackend;
use crate::device::{BackendType, DeviceInfo};
use crate::error::{BackendError, Result};
use crate::runtime::autotune::Autotuner;
use crate::runtime::graph::Tap;
use crate::runtime::{MemoryPool, MemoryPoolConfig, MemoryStats, MixedPrecisionConfig};

/// The seed a new backend's random stream starts from (see [`Backend::manual_seed`]).
pub const DEFAULT_SEED: u64 = 0x7043_6b5f_5eed;

/// Settings a backend was built with.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendConfig {
    /// The backend kind (never `Auto` once built).
    pub backend_type: BackendType,
    /// Device index within the backend.
    pub device_id: usize,
    /// Worker threads requested for the CPU backend (`None`: all cores).
    pub num_threads: Option<usize>,
    /// Whether SIMD kernels may be used (CPU).
    pub enable_simd: bool,
    /// Whether f32 GEMM/conv may use reduced-precision tensor cores (TF32). Off by default, as in
    /// PyTorch; backends without tensor cores ignore it.
    pub enable_tensor_cores: bool,
    /// Whether cuDNN may serve convolutions (CUDA).
    pub enable_cudnn: bool,
    /// Whether Metal Performance Shaders may be used (Metal).
    pub enable_mps: bool,
}

impl BackendConfig {
    fn new(backend_type: BackendType) -> Self {
        BackendConfig {
            backend_type,
            device_id: 0,
            num_threads: None,
            enable_simd: true,
            enable_tensor_cores: false,
            enable_cudnn: true,
            enable_mps: false,
        }
    }
}

struct Inner {
    compute: Arc<dyn ComputeBackend>,
    /// The same device behind a recorder, used while a thread captures a graph.
    tap: Tap,
    /// Made by [`Backend::from_compute`]: the crate cannot build more devices of it.
    custom: bool,
    config: BackendConfig,
    seed: AtomicU64,
    draws: AtomicU64,
    /// The caching pool tensors allocate from, once [`Backend::memory_pool`] set one.
    pool: Mutex<Option<MemoryPool>>,
    /// True once `pool` holds a pool, which is never taken out again: read without the lock, so
    /// that tensors of a backend without a pool are made and dropped without locking `pool`.
    pooled: AtomicBool,
    /// Mixed precision for matmul, conv2d and attention, once enabled.
    amp: Mutex<Option<MixedPrecisionConfig>>,
    /// True while `amp` holds a configuration, read without the lock by every op it applies to.
    amp_on: AtomicBool,
    /// The autotuner's table and cache file.
    tuner: Mutex<Autotuner>,
    /// The autotuner's switch, read without locking `tuner` by every op with variants.
    tuning: AtomicBool,
}

impl Inner {
    /// A backend's state around `compute`: no pool, mixed precision off, autotuner off.
    fn new(compute: Arc<dyn ComputeBackend>, custom: bool, config: BackendConfig) -> Inner {
        Inner {
            tap: Tap::new(Arc::clone(&compute)),
            compute,
            custom,
            config,
            seed: AtomicU64::new(DEFAULT_SEED),
            draws: AtomicU64::new(0),
            pool: Mutex::new(None),
            pooled: AtomicBool::new(false),
            amp: Mutex::new(None),
            amp_on: AtomicBool::new(false),
            tuner: Mutex::new(Autotuner::default()),
            tuning: AtomicBool::new(false),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // No tensor is left (each holds a Backend): every segment goes back to the device.
        let pool = self.pool.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(pool) = pool.as_mut() {
            pool.release_all(&*self.compute);
        }
    }
}

/// A handle to one device's backend. Clone it freely: clones share the device, its memory and its
/// random stream.
#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("backend_type", &self.inner.config.backend_type)
            .field("device_id", &self.inner.config.device_id)
            .finish()
    }
}

/// Whether wgpu's best ranked adapter is a hardware GPU (false without the `webgpu` feature).
fn webgpu_has_hardware_gpu() -> bool {
    #[cfg(feature = "webgpu")]
    {
        crate::backends::webgpu::has_hardware_gpu()
    }
    #[cfg(not(feature = "webgpu"))]
    {
        false
    }
}

/// Whether a backend kind can be used on this machine, and why not.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendStatus {
    /// The backend kind.
    pub backend_type: BackendType,
    /// `Ok` when usable; otherwise the reason, as `Backend::new` would report it.
    pub availability: std::result::Result<(), String>,
}

impl Backend {
    /// A backend of `backend_type` on device 0 with default settings. `Auto` picks the best available
    /// (see [`Backend::auto`]); a kind that cannot run here is `Unavailable` with the reason.
    pub fn new(backend_type: BackendType) -> Result<Backend> {
        BackendBuilder::new().backend_type(backend_type).build()
    }

    /// The best available backend: CUDA, then ROCm, Metal, then WebGPU when its best adapter is a
    /// hardware GPU (discrete, integrated or virtual), then the CPU. A WebGPU adapter that is itself
    /// a CPU implementation (Mesa's lavapipe, WARP) ranks below the native CPU backend, so `auto`
    /// never picks it; ask for it with [`Backend::webgpu`]. The CPU is always available, so this
    /// fails only if every candidate failed to initialise.
    pub fn auto() -> Result<Backend> {
        let mut last = None;
        for kind in BackendType::CONCRETE {
            if kind == BackendType::Reference
                || (kind == BackendType::WebGpu && !webgpu_has_hardware_gpu())
            {
                continue;
            }
            match Backend::new(kind) {
                Ok(b) => return Ok(b),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(BackendError::Unavailable {
            backend: BackendType::Auto,
            reason: "no backend could be initialised".into(),
        }))
    }

    /// The backend kinds that can run on this machine, best first (the order [`Backend::auto`] tries).
    pub fn available() -> Vec<BackendType> {
        Backend::probe()
            .into_iter()
            .filter(|s| s.availability.is_ok())
            .map(|s| s.backend_type)
            .collect()
    }

    /// Every concrete backend kind with its availability and, where unavailable, the reason.
    pub fn probe() -> Vec<BackendStatus> {
        BackendType::CONCRETE
            .into_iter()
            .map(|kind| BackendStatus {
                backend_type: kind,
                availability: match unavailable_reason(kind) {
                    None => Ok(()),
                    Some(reason) => Err(reason),
                },
            })
            .collect()
    }

    /// Every device of every available backend: each GPU the CUDA driver reports (name, memory,
    /// compute capability, SM count), then one entry per other kind. An error when a backend that
    /// probed as available fails to describe its devices.
    pub fn list_devices() -> Result<Vec<DeviceInfo>> {
        let mut all = Vec::new();
        for kind in Backend::available() {
            match kind {
                #[cfg(feature = "cuda")]
                BackendType::Cuda => all.extend(crate::backends::cuda::list_devices()?),
                #[cfg(feature = "webgpu")]
                BackendType::WebGpu => all.extend(crate::backends::webgpu::list_devices()?),
                _ => all.push(Backend::new(kind)?.device_info()),
            }
        }
        Ok(all)
    }

    /// The scalar reference backend, the oracle of the parity suite.
    pub fn reference() -> Result<Backend> {
        Backend::new(BackendType::Reference)
    }

    /// A builder for the CPU backend.
    pub fn cpu() -> CpuBuilder {
        CpuBuilder {
            config: BackendConfig::new(BackendType::Cpu),
        }
    }

    /// A builder for the CUDA backend.
    pub fn cuda() -> CudaBuilder {
        CudaBuilder {
            config: BackendConfig::new(BackendType::Cuda),
        }
    }

    /// A builder for the Metal backend.
    pub fn metal() -> MetalBuilder {
        MetalBuilder {
            config: BackendConfig::new(BackendType::Metal),
        }
    }

    /// A builder for the WebGPU backend.
    pub fn webgpu() -> WebGpuBuilder {
        WebGpuBuilder {
            config: BackendConfig::new(BackendType::WebGpu),
        }
    }

    /// A builder for the ROCm backend.
    pub fn rocm() -> RocmBuilder {
        RocmBuilder {
            config: BackendConfig::new(BackendType::Rocm),
        }
    }

    /// Wraps a caller-supplied [`ComputeBackend`] (a custom device, an instrumented or test backend),
    /// initialising it if needed. Its tensors work with every op of this crate.
    pub fn from_compute(mut compute: Box<dyn ComputeBackend>) -> Result<Backend> {
        if !compute.is_initialized() {
            compute.init()?;
        }
        let config = BackendConfig::new(compute.backend_type());
        let compute: Arc<dyn ComputeBackend> = Arc::from(compute);
        Ok(Backend {
            inner: Arc::new(Inner::new(compute, true, config)),
        })
    }

    /// A backend of the same kind and settings on device `index`. `InvalidArgument` when the backend
    /// has no such device, or was supplied through [`Backend::from_compute`].
    pub fn device(&self, index: usize) -> Result<Backend> {
        if self.inner.custom {
            return Err(BackendError::invalid(
                "device",
                "this backend was supplied through Backend::from_compute; build its other devices the same way",
            ));
        }
        let mut config = self.inner.config.clone();
        config.device_id = index;
        build(config)
    }

    /// Blocks until all work submitted to this backend has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.compute.synchronize()
    }

    /// The backend kind.
    pub fn backend_type(&self) -> BackendType {
        self.inner.config.backend_type
    }

    /// The settings this backend was built with.
    pub fn config(&self) -> &BackendConfig {
        &self.inner.config
    }

    /// A description of the device.
    pub fn device_info(&self) -> DeviceInfo {
        let mut info = self.inner.compute.device_info();
        if let Some(n) = self.inner.config.num_threads {
            info.details
                .push(("threads requested".into(), n.to_string()));
        }
        info
    }

    /// Makes tensors of this backend (all its clones) allocate from a caching pool with `config`
    /// (`memory_pool`), returning the backend for chaining. Tensors allocated before keep
    /// their memory and return it to the device. `InvalidArgument` when a pool with blocks in use is
    /// already set or `initial_size` exceeds `max_size`; the device's `OutOfMemory` when it cannot
    /// reserve `initial_size`.
    pub fn memory_pool(self, config: MemoryPoolConfig) -> Result<Backend> {
        {
            let mut slot = self.pool();
            if let Some(old) = slot.as_mut() {
                if old.stats().allocated_bytes > 0 {
                    return Err(BackendError::invalid(
                        "memory_pool",
                        "the current pool has tensors in use; drop them before replacing it",
                    ));
                }
                old.release_all(self.compute());
            }
            *slot = Some(MemoryPool::new(config, self.compute())?);
            self.inner.pooled.store(true, Ordering::Release);
        }
        Ok(self)
    }

    /// Makes matmul, conv2d and attention on f32 tensors of this backend (all its clones) run in
    /// `config.compute_dtype` with f32 accumulation and return f32; other dtypes run as they are.
    /// Returns the backend for chaining. `InvalidArgument` for a compute dtype other than f16/bf16,
    /// an accumulation dtype other than f32, or a scale that is not positive and finite. Pair it
    /// with a [`LossScaler`](crate::LossScaler) built by [`LossScaler::from_config`](crate::LossScaler::from_config).
    pub fn enable_mixed_precision(self, config: MixedPrecisionConfig) -> Result<Backend> {
        config.validate()?;
        {
            let mut amp = self.inner.amp.lock().unwrap_or_else(|e| e.into_inner());
            *amp = Some(config);
            self.inner.amp_on.store(true, Ordering::Release);
        }
        Ok(self)
    }

    /// Turns mixed precision off again.
    pub fn disable_mixed_precision(&self) {
        let mut amp = self.inner.amp.lock().unwrap_or_else(|e| e.into_inner());
        *amp = None;
        self.inner.amp_on.store(false, Ordering::Release);
    }

    /// The mixed-precision settings in force, if any.
    pub fn mixed_precision(&self) -> Option<MixedPrecisionConfig> {
        if !self.inner.amp_on.load(Ordering::Acquire) {
            return None;
        }
        *self.inner.amp.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The memory figures: the pool's when one is set ([`Backend::memory_pool`]); otherwise the
    /// device allocator's bytes in use as allocated, reserved and both peaks (0 where it does not
    /// count), and no counts: without a pool nothing tracks peaks or allocations.
    pub fn memory_stats(&self) -> MemoryStats {
        match self.pool().as_ref() {
            Some(pool) => pool.stats(),
            None => {
                let bytes = self.inner.compute.allocated_bytes().unwrap_or(0);
                MemoryStats {
                    allocated_bytes: bytes,
                    peak_allocated_bytes: bytes,
                    reserved_bytes: bytes,
                    peak_reserved_bytes: bytes,
                    ..MemoryStats::default()
                }
            }
        }
    }

    /// Returns the pool's cached segments (those with no tensor in them) to the device; nothing to
    /// do without a pool. The device's error if it refuses a free.
    pub fn empty_cache(&self) -> Result<()> {
        match self.pool().as_mut() {
            Some(pool) => pool.empty_cache(self.compute()),
            None => Ok(()),
        }
    }

    /// Sets the pool's peak figures to the current ones (as `torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak_stats(&self) {
        if let Some(pool) = self.pool().as_mut() {
            pool.reset_peak_stats();
        }
    }

    fn pool(&self) -> MutexGuard<'_, Option<MemoryPool>> {
        self.inner.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `bytes` of device memory for a tensor: from the pool when one is set. A pooled block is filled
    /// with NaN bytes (debug builds, or `TORSH_POISON=1`) as the backends fill fresh allocations, so a
    /// reused block cannot pass off a previous tensor's values as an op's output.
    pub(crate) fn alloc_storage(&self, bytes: usize) -> Result<crate::compute::DevicePtr> {
        if !self.inner.pooled.load(Ordering::Acquire) {
            return self.compute().alloc(bytes);
        }
        let mut slot = self.pool();
        let Some(pool) = slot.as_mut() else {
            return self.compute().alloc(bytes);
        };
        let ptr = pool.alloc(self.compute(), bytes)?;
        let poison =
            cfg!(debug_assertions) || std::env::var("TORSH_POISON").is_ok_and(|v| v == "1");
        if poison && bytes > 0 {
            let filled = self.compute().fill(&crate::compute::FillDesc {
                dtype: crate::dtype::DType::U8,
                ptr,
                len: bytes,
                value: f64::from(crate::backends::reference::POISON_BYTE),
            });
            if let Err(e) = filled {
                let _ = pool.free(self.compute(), ptr);
                return Err(e);
            }
        }
        Ok(ptr)
    }

    /// Returns a tensor's memory: to the pool when it came from it.
    pub(crate) fn free_storage(&self, ptr: crate::compute::DevicePtr) -> Result<()> {
        // A pointer the pool owns was allocated after `pooled` was set.
        if !self.inner.pooled.load(Ordering::Acquire) {
            return self.compute().free(ptr);
        }
        if let Some(pool) = self.pool().as_mut() {
            if pool.owns(ptr) {
                return pool.free(self.compute(), ptr);
            }
        }
        self.compute().free(ptr)
    }

    /// Bytes of device memory currently held by this backend's tensors (and raw allocations), where the
    /// backend tracks it; `None` otherwise.
    pub fn allocated_bytes(&self) -> Option<usize> {
        self.inner.compute.allocated_bytes()
    }

    /// The low-level backend, for callers that manage raw device memory themselves. While the
    /// calling thread captures a graph ([`Backend::capture_graph`]), its calls are recorded.
    pub fn compute(&self) -> &dyn ComputeBackend {
        if self.inner.tap.capturing_here() {
            &self.inner.tap
        } else {
            self.inner.compute.as_ref()
        }
    }

    /// The device itself, bypassing a graph capture's recorder (for work a capture must not record,
    /// such as the autotuner's trial runs).
    pub(crate) fn unrecorded(&self) -> &dyn ComputeBackend {
        self.inner.compute.as_ref()
    }

    /// Whether the autotuner is on ([`Backend::enable_autotuning`]).
    pub(crate) fn tuning(&self) -> bool {
        self.inner.tuning.load(Ordering::Acquire)
    }

    /// Turns the autotuner on or off.
    pub(crate) fn set_tuning(&self, on: bool) {
        self.inner.tuning.store(on, Ordering::Release);
    }

    /// The autotuner's state.
    pub(crate) fn tuner(&self) -> MutexGuard<'_, Autotuner> {
        self.inner.tuner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The graph recorder in front of this backend's device.
    pub(crate) fn graph_tap(&self) -> &Tap {
        &self.inner.tap
    }

    /// True when both handles refer to the same backend instance (tensors of one can be used with the
    /// other without a copy).
    pub fn same_instance(&self, other: &Backend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Restarts this backend's random stream at `seed`: the sequence of `randn`/`rand` results that
    /// follows is then reproducible, on every backend kind.
    pub fn manual_seed(&self, seed: u64) {
        self.inner.seed.store(seed, Ordering::SeqCst);
        self.inner.draws.store(0, Ordering::SeqCst);
    }

    /// The seed for the next random tensor: a hash of the stream seed and the number of draws so far.
    pub(crate) fn next_seed(&self) -> u64 {
        let draw = self.inner.draws.fetch_add(1, Ordering::SeqCst);
        crate::rng::bits(self.inner.seed.load(Ordering::SeqCst), draw)
    }
}

/// Why `kind` cannot run here, or `None` when it can.
fn unavailable_reason(kind: BackendType) -> Option<String> {
    match kind {
        BackendType::Cpu | BackendType::Reference => None,
        BackendType::Auto => None,
        BackendType::Cuda => cuda_unavailable_reason(),
        BackendType::WebGpu => webgpu_unavailable_reason(),
        BackendType::Rocm => Some(
            "torsh-backend has no ROCm backend yet; AMD GPUs run through Vulkan: use \
             Backend::webgpu() (BackendType::WebGpu)"
                .into(),
        ),
        BackendType::Metal => metal_unavailable_reason(),
    }
}

/// `Backend::metal()` runs the WebGPU backend on wgpu's Metal adapter until a native Metal backend
/// exists: available on Apple platforms where wgpu finds a Metal adapter.
fn metal_unavailable_reason() -> Option<String> {
    if !cfg!(target_vendor = "apple") {
        return Some("Metal exists only on Apple platforms".into());
    }
    #[cfg(feature = "webgpu")]
    {
        crate::backends::webgpu::api_unavailable_reason(wgpu::Backend::Metal).map(|r| {
            format!("Backend::metal() runs the WebGPU kernels on wgpu's Metal adapter: {r}")
        })
    }
    #[cfg(not(feature = "webgpu"))]
    {
        Some(
            "Backend::metal() runs the WebGPU kernels on wgpu's Metal adapter, and this build \
             leaves out the `webgpu` feature"
                .into(),
        )
    }
}

#[cfg(feature = "webgpu")]
fn webgpu_unavailable_reason() -> Option<String> {
    crate::backends::webgpu::unavailable_reason()
}

#[cfg(not(feature = "webgpu"))]
fn webgpu_unavailable_reason() -> Option<String> {
    Some("this build of torsh-backend leaves out the WebGPU backend (enable the `webgpu` feature, on by default)".into())
}

#[cfg(feature = "cuda")]
fn cuda_unavailable_reason() -> Option<String> {
    crate::backends::cuda::unavailable_reason()
}

#[cfg(not(feature = "cuda"))]
fn cuda_unavailable_reason() -> Option<String> {
    Some("this build of torsh-backend leaves out the CUDA backend (enable the `cuda` feature, on by default)".into())
}

fn build(config: BackendConfig) -> Result<Backend> {
    let kind = config.backend_type;
    if kind == BackendType::Auto {
        let mut auto = Backend::auto()?;
        // Carry the user's settings onto the chosen backend.
        let chosen = auto.backend_type();
        let mut merged = config;
        merged.backend_type = chosen;
        if merged != auto.inner.config {
            auto = build(merged)?;
        }
        return Ok(auto);
    }
    if let Some(reason) = unavailable_reason(kind) {
        return Err(BackendError::Unavailable {
            backend: kind,
            reason,
        });
    }
    let host = matches!(kind, BackendType::Cpu | BackendType::Reference);
    if host && config.device_id != 0 {
        return Err(BackendError::invalid(
            "device",
            format!(
                "device index {} is out of range: the {kind} backend has 1 device (index 0)",
                config.device_id
            ),
        ));
    }
    if config.num_threads == Some(0) {
        return Err(BackendError::invalid(
            "num_threads",
            "the thread count must be at least 1",
        ));
    }
    let mut compute: Box<dyn ComputeBackend> = match kind {
        #[cfg(feature = "cpu")]
        BackendType::Cpu => Box::new(crate::backends::cpu::CpuBackend::new(
            config.num_threads,
            config.enable_simd,
        )?),
        #[cfg(not(feature = "cpu"))]
        BackendType::Cpu => Box::new(ReferenceBackend::new(kind)),
        BackendType::Reference => Box::new(ReferenceBackend::new(kind)),
        #[cfg(feature = "cuda")]
        BackendType::Cuda => Box::new(crate::backends::cuda::CudaBackend::new(
            crate::backends::cuda::CudaOptions {
                ordinal: config.device_id,
                tensor_cores: config.enable_tensor_cores,
                cudnn: config.enable_cudnn,
            },
        )),
        #[cfg(feature = "webgpu")]
        BackendType::Metal => {
            if config.enable_mps {
                return Err(BackendError::FeatureUnavailable {
                    feature: "Metal Performance Shaders",
                    reason:
                        "there is no native Metal backend yet: Backend::metal() runs the WebGPU \
                             kernels on wgpu's Metal adapter; build it without enable_mps(true)"
                            .into(),
                });
            }
            Box::new(crate::backends::webgpu::WebGpuBackend::new(
                crate::backends::webgpu::WebGpuBackendConfig {
                    api: Some(wgpu::Backend::Metal),
                    ..Default::default()
                },
            ))
        }
        #[cfg(feature = "webgpu")]
        BackendType::WebGpu => Box::new(crate::backends::webgpu::WebGpuBackend::new(
            crate::backends::webgpu::WebGpuBackendConfig {
                adapter_index: Some(config.device_id),
                ..Default::default()
            },
        )),
        _ => {
            return Err(BackendError::Unavailable {
                backend: kind,
                reason: "no implementation".into(),
            })
        }
    };
    compute.init()?;
    let compute: Arc<dyn ComputeBackend> = Arc::from(compute);
    Ok(Backend {
        inner: Arc::new(Inner::new(compute, false, config)),
    })
}

/// Configures any backend kind:
/// `BackendBuilder::new().backend_type(BackendType::Cpu).device_id(0).build()`.
#[derive(Clone, Debug)]
pub struct BackendBuilder {
    config: BackendConfig,
    memory_pool_size: Option<usize>,
}

impl Default for BackendBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BackendBuilder {
    /// A builder for `BackendType::Auto` on device 0.
    pub fn new() -> Self {
        BackendBuilder {
            config: BackendConfig::new(BackendType::Auto),
            memory_pool_size: None,
        }
    }

    /// The backend kind (`Auto` by default).
    pub fn backend_type(mut self, backend_type: BackendType) -> Self {
        self.config.backend_type = backend_type;
        self
    }

    /// The device index (0 by default).
    pub fn device_id(mut self, device_id: usize) -> Self {
        self.config.device_id = device_id;
        self
    }

    /// Bounds device memory: tensors allocate from a caching pool whose `max_size` is `bytes`
    /// (see [`Backend::memory_pool`]).
    pub fn memory_pool_size(mut self, bytes: usize) -> Self {
        self.memory_pool_size = Some(bytes);
        self
    }

    /// Allows TF32 tensor cores for f32 GEMM and convolution (off by default).
    pub fn enable_tensor_cores(mut self, enable: bool) -> Self {
        self.config.enable_tensor_cores = enable;
        self
    }

    /// CPU worker threads (`InvalidArgument` at `build` for 0).
    pub fn num_threads(mut self, n: usize) -> Self {
        self.config.num_threads = Some(n);
        self
    }

    /// Whether CPU SIMD kernels may be used.
    pub fn enable_simd(mut self, enable: bool) -> Self {
        self.config.enable_simd = enable;
        self
    }

    /// Builds the backend: `Unavailable` when the kind cannot run here, `InvalidArgument` for a device
    /// index out of range. With [`memory_pool_size`](Self::memory_pool_size), tensors allocate from a
    /// caching pool bounded by it (the defaults of [`MemoryPoolConfig`] otherwise).
    pub fn build(self) -> Result<Backend> {
        let backend = build(self.config)?;
        match self.memory_pool_size {
            Some(max_size) => backend.memory_pool(MemoryPoolConfig {
                max_size,
                ..MemoryPoolConfig::default()
            }),
            None => Ok(backend),
        }
    }
}

/// Configures the CPU backend: `Backend::cpu().num_threads(8).enable_simd(true).build()`.
///
/// Every op runs SIMD kernels chosen for the CPU at run time, on a team of `num_threads` threads
/// (misaligned operands, and some ops on integer dtypes, take the scalar reference kernels; see
/// `backends::cpu`). `device_info()` reports the threads used and the SIMD level.
#[derive(Clone, Debug)]
pub struct CpuBuilder {
    config: BackendConfig,
}

impl CpuBuilder {
    /// Worker threads (all cores by default; `InvalidArgument` at `build` for 0).
    pub fn num_threads(mut self, n: usize) -> Self {
        self.config.num_threads = Some(n);
        self
    }

    /// Whether SIMD kernels may be used (`false` forces the scalar path).
    pub fn enable_simd(mut self, enable: bool) -> Self {
        self.config.enable_simd = enable;
        self
    }

    /// Builds the CPU backend.
    pub fn build(self) -> Result<Backend> {
        build(self.config)
    }
}

/// Configures the CUDA backend: `Backend::cuda().device(0).enable_cudnn(true).build()`.
#[derive(Clone, Debug)]
pub struct CudaBuilder {
    config: BackendConfig,
}

impl CudaBuilder {
    /// The GPU index.
    pub fn device(mut self, index: usize) -> Self {
        self.config.device_id = index;
        self
    }

    /// Whether cuDNN may serve convolutions.
    pub fn enable_cudnn(mut self, enable: bool) -> Self {
        self.config.enable_cudnn = enable;
        self
    }

    /// Whether f32 GEMM may use TF32 tensor cores.
    pub fn enable_tensor_cores(mut self, enable: bool) -> Self {
        self.config.enable_tensor_cores = enable;
        self
    }

    /// Builds the CUDA backend (`Unavailable` with the reason where it cannot run).
    pub fn build(self) -> Result<Backend> {
        build(self.config)
    }
}

/// Configures the Metal backend: `Backend::metal().enable_mps(true).build()`.
#[derive(Clone, Debug)]
pub struct MetalBuilder {
    config: BackendConfig,
}

impl MetalBuilder {
    /// Whether Metal Performance Shaders may be used. There is no native Metal backend yet
    /// (`Backend::metal()` runs the WebGPU kernels on wgpu's Metal adapter), so `build` answers
    /// `FeatureUnavailable` when this is `true`.
    pub fn enable_mps(mut self, enable: bool) -> Self {
        self.config.enable_mps = enable;
        self
    }

    /// Builds the Metal backend: the WebGPU backend on wgpu's Metal adapter (its `device_info().api`
    /// says "WebGPU on Metal"). `Unavailable` off Apple platforms or without a Metal adapter.
    pub fn build(self) -> Result<Backend> {
        build(self.config)
    }
}

/// Configures the WebGPU backend.
#[derive(Clone, Debug)]
pub struct WebGpuBuilder {
    config: BackendConfig,
}

impl WebGpuBuilder {
    /// The adapter index, as listed by [`Backend::list_devices`].
    pub fn device(mut self, index: usize) -> Self {
        self.config.device_id = index;
        self
    }

    /// Builds the WebGPU backend (`Unavailable` with the reason where it cannot run).
    pub fn build(self) -> Result<Backend> {
        build(self.config)
    }
}

/// Configures the ROCm backend.
#[derive(Clone, Debug)]
pub struct RocmBuilder {
    config: BackendConfig,
}

impl RocmBuilder {
    /// The GPU index.
    pub fn device(mut self, index: usize) -> Self {
        self.config.device_id = index;
        self
    }

    /// Builds the ROCm backend (`Unavailable` with the reason where it cannot run).
    pub fn build(self) -> Result<Backend> {
        build(self.config)
    }
}
