//! The WebGPU backend: wgpu over Vulkan, Metal or DX12, with kernels written in WGSL.
//!
//! Nothing is needed at build time: wgpu is pure Rust and opens the Vulkan loader (or Metal, DX12) at
//! run time, so any machine with a Vulkan driver runs it — a GPU, or Mesa's lavapipe on the CPU, where
//! CI tests it. One backend instance opens one adapter (`adapter.rs`) as a device with the adapter's own
//! limits (`context.rs`), keeps one wgpu buffer per allocation behind synthetic device addresses with
//! a pool of freed buffers (`memory.rs`), and builds each kernel's pipeline once (`pipelines.rs`).
//! Callers' own WGSL runs through [`WebGpuKernelExecutor`] (`custom.rs`).
//!
//! **Coverage.** Every op runs on the device. f32 kernels (`shaders/`): fill, unary and binary ops
//! (broadcasting by strides), strided copies, GEMM, batched GEMM, GEMV, conv2d (implicit GEMM),
//! attention (flash style, causal chunks skipped), reductions, softmax and log-softmax, layer norm,
//! batch norm, max and average pooling, Adam/AdamW and random fills (the crate's counter stream).
//! Casts, copies and fills of every dtype run in `cast.wgsl`. In f16 and bf16 the math ops stage their
//! operands into f32 copies on the device and convert the results back (`staging.rs`), as they do
//! for f32 operands at unaligned addresses. f64 math answers `Unsupported`: WGSL has no f64, and an
//! emulation would be neither fast nor the reference's rounding (f64 casts and copies do run).
//!
//! **Loop budget.** No launch runs more than 64 000 loop passes per invocation, every loop of the
//! kernel together, on any adapter (`loops.rs`): llvmpipe (lavapipe) silently ends every loop of an
//! invocation once they have run 65 535 passes in all, which turned a sum of 700 000 ones into
//! 524 256. Each launch states its count and `Kernels::dispatch` refuses one past the budget; ops
//! whose launches would exceed it cut their work (reductions, softmax and layer norm by blocks of
//! the row, batch norm by chunks, GEMMs along the inner dim, conv2d by input channels, attention by
//! ranges of keys, pooling windows as a row then a column pass), and answer `FeatureUnavailable`
//! where no cut fits. [`WebGpuBackendConfig::max_loop_iterations`] lowers the budget.
//!
//! Work is ordered like a stream: one queue, one submission per op, in call order.

mod adapter;
mod attention;
mod blas;
mod cast;
mod context;
mod conv;
mod custom;
mod elementwise;
mod events;
mod index;
mod large;
mod loops;
mod loss;
mod memory;
mod norm;
mod optim;
mod pipelines;
mod pool;
mod random;
mod reduce;
mod scan;
mod select;
mod sort;
mod staging;

use std::sync::{Mutex, MutexGuard};

use crate::compute::*;
use crate::device::{BackendType, DeviceInfo};
use crate::error::{BackendError, Result};

use crate::compute::op::ops_by_impl;
pub(crate) use adapter::{
    api_unavailable_reason, has_hardware_gpu, list_devices, unavailable_reason,
};
pub use adapter::{enumerate_adapters, get_adapter_info, is_available};
pub use context::block_on;
use context::Gpu;
pub use custom::{PipelineStats, WebGpuKernelExecutor};
use elementwise::Launch;
use memory::Memory;
pub use memory::{PoolStats, WebGpuBufferPool};
use pipelines::Kernels;

/// The wgpu crate this backend is built on, for the types its API takes and returns.
pub use wgpu;

/// Settings of a WebGPU backend.
#[derive(Clone, Debug, PartialEq)]
pub struct WebGpuBackendConfig {
    /// The adapter, as an index into [`enumerate_adapters`]' ranking; `None` picks by
    /// `power_preference`.
    pub adapter_index: Option<usize>,
    /// Which adapter `adapter_index: None` picks: `HighPerformance` (or `None`) takes the best
    /// ranked (discrete before integrated before CPU implementations), `LowPower` an integrated GPU
    /// when there is one.
    pub power_preference: wgpu::PowerPreference,
    /// Ask wgpu for its validation layers. The wgpu instance is shared by the whole process, so this
    /// cannot be chosen per backend: `true` makes `init` answer `FeatureUnavailable` saying to set
    /// `WGPU_VALIDATION=1` (and `WGPU_DEBUG=1`) in the environment instead, which wgpu reads.
    pub debug_mode: bool,
    /// Largest allocation the backend makes, in bytes; capped by the adapter's `max_buffer_size`.
    /// Buffers beyond the adapter's storage binding size are bound in windows covering what each
    /// op touches; ops over all of such a buffer run in pieces where they can be cut, and answer
    /// `FeatureUnavailable` where they cannot (`docs/backends.md`).
    pub max_buffer_size: u64,
    /// Keep built pipelines for reuse (`false` builds each kernel's pipeline anew at every launch,
    /// which costs far more than the kernel on small tensors; for measuring that cost).
    pub enable_pipeline_cache: bool,
    /// Workgroup size of the elementwise kernels. Only `(256, 1, 1)` is built in this version; other
    /// values are `InvalidArgument`.
    pub preferred_workgroup_size: (u32, u32, u32),
    /// Only adapters of this graphics API (`Some(wgpu::Backend::Metal)` is what
    /// [`crate::Backend::metal`] builds); `None` takes any. `init` answers `Unavailable` when wgpu
    /// found no adapter of the API, and `InvalidArgument` when `adapter_index` names one of another.
    pub api: Option<wgpu::Backend>,
    /// The optional features the backend may use where the adapter has them: `SHADER_F16`,
    /// `SUBGROUP` (the row kernels' subgroup combines), `TIMESTAMP_QUERY` (device timing of events);
    /// default all three. Leave one out to run the paths that do without it; others are ignored.
    pub optional_features: wgpu::Features,
    /// Threads per row of the row kernels (reductions, softmax, log-softmax, layer norm; per
    /// channel for batch norm): `None`
    /// picks by adapter (256 on GPUs, the SIMD width on CPU implementations such as lavapipe);
    /// otherwise a power of two from 1 to 256, and `init` answers `InvalidArgument` for any other.
    pub row_workgroup_size: Option<u32>,
    /// Largest storage binding the kernels use, in bytes; capped by the adapter's
    /// `max_storage_buffer_binding_size`. Allocations larger than a binding are bound in windows,
    /// and ops over all of one run in pieces or two passes (`docs/backends.md`); lowering this
    /// runs those paths on small tensors, as the tests do. At least [`MIN_BINDING_SIZE`]; `init`
    /// answers `InvalidArgument` below that.
    pub max_binding_size: u64,
    /// Most workgroups the kernels launch along one grid dimension; `None` takes the adapter's
    /// `max_compute_workgroups_per_dimension` (65 535 on most). Launches of more fold into a
    /// second dimension or run in blocks; lowering this runs those paths on small tensors, as the
    /// tests do. At least [`MIN_WORKGROUPS_PER_DIMENSION`]; `init` answers `InvalidArgument`
    /// below that.
    pub max_workgroups_per_dimension: Option<u32>,
    /// Most loop passes one kernel invocation may run, every loop of it together (each loop counts
    /// its iterations and one more, the pass that ends it); `None` takes the budget every adapter
    /// gets, 64 000, below the 65 535 after which llvmpipe (lavapipe) silently ends an
    /// invocation's loops. Ops whose launches would run more cut their work (reductions by blocks
    /// of the row, GEMMs along the inner dim, attention by ranges of keys, ...) and answer
    /// `FeatureUnavailable` where no cut fits; lowering this runs those paths on small tensors,
    /// as the tests do, and is capped by the default. At least [`MIN_LOOP_ITERATIONS`]; `init`
    /// answers `InvalidArgument` below that.
    pub max_loop_iterations: Option<u32>,
}

/// The smallest [`WebGpuBackendConfig::max_binding_size`]: 64 KiB.
pub const MIN_BINDING_SIZE: u64 = 64 << 10;

/// The smallest [`WebGpuBackendConfig::max_workgroups_per_dimension`]: 64.
pub const MIN_WORKGROUPS_PER_DIMENSION: u32 = 64;

/// The smallest [`WebGpuBackendConfig::max_loop_iterations`]: 4096, enough for the smallest cut of
/// every kernel (one chunk of keys of the widest attention head, a row kernel of 256 threads).
pub const MIN_LOOP_ITERATIONS: u32 = 4096;

impl Default for WebGpuBackendConfig {
    fn default() -> Self {
        WebGpuBackendConfig {
            adapter_index: None,
            power_preference: wgpu::PowerPreference::HighPerformance,
            debug_mode: false,
            max_buffer_size: u64::MAX,
            enable_pipeline_cache: true,
            preferred_workgroup_size: (pipelines::WORKGROUP, 1, 1),
            api: None,
            optional_features: context::OPTIONAL_FEATURES,
            row_workgroup_size: None,
            max_binding_size: u64::MAX,
            max_workgroups_per_dimension: None,
            max_loop_iterations: None,
        }
    }
}

/// One opened adapter: its name, kind, limits and memory use.
#[derive(Debug)]
pub struct WebGpuDevice {
    gpu: Gpu,
    index: usize,
}

impl WebGpuDevice {
    /// Opens the best ranked adapter (see [`enumerate_adapters`]). `Unavailable` when there is none.
    /// The first adapter, opened; `_device_id` is accepted for compatibility and ignored (wgpu opens
    /// one device per adapter: [`WebGpuDevice::from_adapter_index`] picks another adapter).
    pub async fn from_best_adapter(_device_id: usize) -> Result<WebGpuDevice> {
        Self::from_adapter_index(0, 0).await
    }

    /// Opens adapter `adapter_index` of [`enumerate_adapters`]' ranking. `InvalidArgument` when there
    /// is no such adapter, `Unavailable` when it refuses to open.
    pub async fn from_adapter_index(
        adapter_index: usize,
        _device_id: usize,
    ) -> Result<WebGpuDevice> {
        Self::open(adapter_index, context::OPTIONAL_FEATURES)
    }

    /// Opens adapter `adapter_index` using those of the `features` it has.
    fn open(adapter_index: usize, features: wgpu::Features) -> Result<WebGpuDevice> {
        if let Some(reason) = unavailable_reason() {
            return Err(BackendError::Unavailable {
                backend: BackendType::WebGpu,
                reason,
            });
        }
        let adapter = adapter::adapter_at(adapter_index)?;
        Ok(WebGpuDevice {
            gpu: Gpu::open(&adapter, features)?,
            index: adapter_index,
        })
    }

    /// The adapter's name.
    pub fn name(&self) -> &str {
        &self.gpu.info.name
    }

    /// The adapter's kind (discrete, integrated, CPU, ...).
    pub fn device_type(&self) -> wgpu::DeviceType {
        self.gpu.info.device_type
    }

    /// The adapter's description (name, limits, features) as `list_devices` shows it.
    pub fn info(&self) -> DeviceInfo {
        let adapters = adapter::adapters();
        match adapters.get(self.index) {
            Some(a) => adapter::describe(self.index, a),
            None => DeviceInfo {
                device: crate::device::Device {
                    backend_type: BackendType::WebGpu,
                    index: self.index,
                },
                name: self.gpu.info.name.clone(),
                memory_bytes: self.gpu.limits.max_buffer_size,
                api: format!("WebGPU on {}", adapter::api_name(self.gpu.info.backend)),
                details: Vec::new(),
            },
        }
    }

    /// The limits the device was opened with (the adapter's own).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.gpu.limits
    }

    /// The optional features in use (`SHADER_F16`, `SUBGROUP`, `TIMESTAMP_QUERY` where present).
    pub fn features(&self) -> wgpu::Features {
        self.gpu.features
    }
}

/// The WebGPU implementation of [`ComputeBackend`]. Build it through [`crate::Backend::webgpu`].
#[derive(Debug)]
pub struct WebGpuBackend {
    config: WebGpuBackendConfig,
    state: Option<State>,
}

/// An initialised backend.
#[derive(Debug)]
struct State {
    device: WebGpuDevice,
    kernels: Kernels,
    memory: Mutex<Memory>,
    events: Mutex<events::Events>,
    /// Fill fresh allocations with NaN bytes (debug builds, or `TORSH_POISON=1`).
    poison: bool,
}

/// Bytes of freed buffers the pool keeps by default.
const DEFAULT_CACHE_BYTES: u64 = 1 << 30;

impl WebGpuBackend {
    /// An uninitialised backend; [`ComputeBackend::init`] (or [`WebGpuBackend::initialize`]) opens
    /// the adapter.
    pub fn new(config: WebGpuBackendConfig) -> Self {
        WebGpuBackend {
            config,
            state: None,
        }
    }

    /// Opens the configured adapter, asynchronously. The errors of
    /// [`ComputeBackend::init`].
    pub async fn initialize(&mut self) -> Result<()> {
        self.init()
    }

    /// The buffer pool's usage figures; `NotInitialized` before `init`.
    pub fn pool_stats(&self) -> Result<PoolStats> {
        Ok(self.state()?.memory().pool.stats())
    }

    /// Queue submissions made so far on this backend's device (each op is one, a graph launch is
    /// one); `NotInitialized` before `init`.
    pub fn queue_submissions(&self) -> Result<u64> {
        Ok(self.state()?.device.gpu.submissions())
    }

    /// Kernel launches (compute dispatches) recorded so far on this backend's device, the
    /// backend's own and custom kernels alike: an op split into pieces (`docs/backends.md`) is
    /// one per piece, an op staged through f32 copies adds the casts'; `NotInitialized` before
    /// `init`.
    pub fn kernel_launches(&self) -> Result<u64> {
        Ok(self.state()?.device.gpu.launches())
    }

    /// Releases the pool's cached free buffers; `NotInitialized` before `init`.
    pub fn empty_cache(&self) -> Result<()> {
        self.state()?.memory().pool.empty_cache();
        Ok(())
    }

    /// Compute pipelines built so far (each kernel and specialisation once).
    pub fn pipeline_count(&self) -> usize {
        self.state
            .as_ref()
            .map_or(0, |s| s.kernels.pipeline_count())
    }

    fn state(&self) -> Result<&State> {
        self.state.as_ref().ok_or(BackendError::NotInitialized {
            backend: BackendType::WebGpu,
        })
    }

    /// The adapter index `init` opens: the configured one, or the best for the power preference.
    fn chosen_adapter(&self) -> Result<usize> {
        let all = adapter::adapters();
        let api_ok = |i: usize| {
            self.config
                .api
                .is_none_or(|api| all.get(i).is_some_and(|a| a.get_info().backend == api))
        };
        if let Some(i) = self.config.adapter_index {
            if i < all.len() && !api_ok(i) {
                return Err(BackendError::invalid(
                    "webgpu device",
                    format!(
                        "adapter {i} is served by {}, not the requested {}",
                        adapter::api_name(all[i].get_info().backend),
                        adapter::api_name(self.config.api.unwrap_or(wgpu::Backend::Noop))
                    ),
                ));
            }
            return Ok(i);
        }
        let candidates: Vec<usize> = (0..all.len()).filter(|&i| api_ok(i)).collect();
        let Some(&best) = candidates.first() else {
            let api = adapter::api_name(self.config.api.unwrap_or(wgpu::Backend::Noop));
            return Err(BackendError::Unavailable {
                backend: BackendType::WebGpu,
                reason: format!("wgpu found no {api} adapter"),
            });
        };
        if self.config.power_preference == wgpu::PowerPreference::LowPower {
            if let Some(&i) = candidates
                .iter()
                .find(|&&i| all[i].get_info().device_type == wgpu::DeviceType::IntegratedGpu)
            {
                return Ok(i);
            }
        }
        Ok(best)
    }

    /// Checks `desc`'s regions, then runs `kernel`; where it answers [`Launch::Stage`], runs it
    /// again on staged f32 copies of the operands (`staging.rs`).
    fn run<D: OpDesc>(
        &self,
        desc: &D,
        kernel: impl Fn(&Gpu, &Kernels, &Memory, &D) -> Result<Launch>,
    ) -> Result<()> {
        let acc = desc.accesses()?;
        let state = self.state()?;
        let mut mem = state.memory();
        mem.table.check_accesses(&acc)?;
        // Nothing to write (an empty output): nothing to launch, whatever the other extents are.
        if nothing_written(&acc) {
            return Ok(());
        }
        mem.open(&acc)?;
        let gpu = &state.device.gpu;
        match kernel(gpu, &state.kernels, &mem, desc)? {
            Launch::Done => Ok(()),
            Launch::Stage => staging::run_staged(
                gpu,
                &state.kernels,
                &mut mem,
                acc,
                desc,
                state.poison,
                kernel,
            ),
        }
    }

    /// Checks `acc`, then runs `kernel` (which covers every operand it is given).
    fn run_direct(
        &self,
        acc: Accesses,
        kernel: impl FnOnce(&Gpu, &Kernels, &Memory) -> Result<()>,
    ) -> Result<()> {
        let state = self.state()?;
        let mut mem = state.memory();
        mem.table.check_accesses(&acc)?;
        if nothing_written(&acc) {
            // An empty output (a fill of no elements): nothing to bind or launch.
            return Ok(());
        }
        mem.open(&acc)?;
        kernel(&state.device.gpu, &state.kernels, &mem)
    }
}

/// True when no region of `acc` that the op writes has a byte: the op has nothing to do.
fn nothing_written(acc: &Accesses) -> bool {
    acc.regions
        .iter()
        .all(|r| !r.access.writes() || r.bytes == 0)
}

/// Whether the math kernels take `dtype`: f32, and f16 and bf16 through staging.
fn is_math_dtype(dtype: crate::dtype::DType) -> bool {
    use crate::dtype::DType;
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Validates `desc`, then answers `Unsupported` for `op` on a `dtype` the math kernels do not take
/// (f64 and the integers): a bad argument gets its own error whatever the dtype, as on every
/// backend.
fn math_dtype<D: OpDesc>(op: &'static str, dtype: crate::dtype::DType, desc: &D) -> Result<()> {
    desc.accesses()?;
    if is_math_dtype(dtype) {
        Ok(())
    } else {
        Err(BackendError::Unsupported {
            op,
            backend: BackendType::WebGpu,
            dtype,
        })
    }
}

impl State {
    fn memory(&self) -> MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn events(&self) -> MutexGuard<'_, events::Events> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for WebGpuBackend {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            let _ = state.device.gpu.wait();
            state.memory().release_all();
        }
    }
}

impl ComputeBackend for WebGpuBackend {
    fn name(&self) -> &str {
        "webgpu"
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn backend_type(&self) -> BackendType {
        BackendType::WebGpu
    }

    fn init(&mut self) -> Result<()> {
        if self.state.is_some() {
            return Ok(());
        }
        if self.config.preferred_workgroup_size != (pipelines::WORKGROUP, 1, 1) {
            return Err(BackendError::invalid(
                "webgpu",
                format!(
                    "workgroup size {:?} is not built: the kernels use ({}, 1, 1)",
                    self.config.preferred_workgroup_size,
                    pipelines::WORKGROUP
                ),
            ));
        }
        if self.config.debug_mode {
            return Err(BackendError::FeatureUnavailable {
                feature: "WebGPU debug_mode",
                reason: "the wgpu instance is shared by the process; set WGPU_VALIDATION=1 and \
                         WGPU_DEBUG=1 in the environment before the first WebGPU call instead"
                    .into(),
            });
        }
        if self.config.max_binding_size < MIN_BINDING_SIZE {
            return Err(BackendError::invalid(
                "webgpu",
                format!(
                    "max_binding_size {} is below the smallest supported, {MIN_BINDING_SIZE} bytes",
                    self.config.max_binding_size
                ),
            ));
        }
        if let Some(n) = self.config.max_workgroups_per_dimension {
            if n < MIN_WORKGROUPS_PER_DIMENSION {
                return Err(BackendError::invalid(
                    "webgpu",
                    format!(
                        "max_workgroups_per_dimension {n} is below the smallest supported, \
                         {MIN_WORKGROUPS_PER_DIMENSION}"
                    ),
                ));
            }
        }
        if let Some(n) = self.config.max_loop_iterations {
            if n < MIN_LOOP_ITERATIONS {
                return Err(BackendError::invalid(
                    "webgpu",
                    format!(
                        "max_loop_iterations {n} is below the smallest supported, \
                         {MIN_LOOP_ITERATIONS}"
                    ),
                ));
            }
        }
        if let Some(n) = self.config.row_workgroup_size {
            if !n.is_power_of_two() || n > 256 {
                return Err(BackendError::invalid(
                    "webgpu",
                    format!("row_workgroup_size {n} is not a power of two from 1 to 256"),
                ));
            }
        }
        let index = self.chosen_adapter()?;
        let mut device = WebGpuDevice::open(index, self.config.optional_features)?;
        if let Some(n) = self.config.row_workgroup_size {
            device.gpu.row_threads = n;
        }
        if let Some(n) = self.config.max_workgroups_per_dimension {
            let limit = &mut device.gpu.limits.max_compute_workgroups_per_dimension;
            *limit = (*limit).min(n);
        }
        if let Some(n) = self.config.max_loop_iterations {
            device.gpu.loop_limit = device.gpu.loop_limit.min(n.into());
        }
        let poison =
            cfg!(debug_assertions) || std::env::var("TORSH_POISON").is_ok_and(|v| v == "1");
        let binding = memory::BindingLimit::of(&device.gpu.limits, self.config.max_binding_size);
        let native_f16 = device.gpu.features.contains(wgpu::Features::SHADER_F16);
        self.state = Some(State {
            device,
            kernels: Kernels::new(self.config.enable_pipeline_cache),
            memory: Mutex::new(Memory::new(
                self.config.max_buffer_size,
                binding,
                DEFAULT_CACHE_BYTES,
                native_f16,
            )),
            events: Mutex::new(events::Events::default()),
            poison,
        });
        Ok(())
    }

    fn is_initialized(&self) -> bool {
        self.state.is_some()
    }

    fn device_info(&self) -> DeviceInfo {
        let Some(state) = self.state.as_ref() else {
            return DeviceInfo {
                device: crate::device::Device {
                    backend_type: BackendType::WebGpu,
                    index: self.config.adapter_index.unwrap_or(0),
                },
                name: "WebGPU (not initialised)".into(),
                memory_bytes: 0,
                api: "WebGPU".into(),
                details: Vec::new(),
            };
        };
        let mut info = state.device.info();
        let stats = state.memory().pool.stats();
        let gpu = &state.device.gpu;
        let narrow = if gpu.features.contains(wgpu::Features::SHADER_F16) {
            "f16 natively (shader-f16), bf16 through f32 copies on the device"
        } else {
            "f16 and bf16 through f32 copies on the device"
        };
        info.details.push((
            "WGSL kernels".into(),
            format!(
                "every op in f32; {narrow}; casts, copies and fills in every dtype; f64 math Unsupported"
            ),
        ));
        info.details.push((
            "row kernels".into(),
            format!(
                "{} threads per row, combining through {}",
                gpu.row_threads,
                if gpu.features.contains(wgpu::Features::SUBGROUP) {
                    "subgroup operations"
                } else {
                    "a tree in workgroup memory"
                }
            ),
        ));
        info.details.push((
            "buffer pool".into(),
            format!(
                "{} bytes allocated, {} reserved, {} cached; {} hits, {} misses",
                stats.allocated_bytes,
                stats.reserved_bytes,
                stats.cached_bytes,
                stats.hits,
                stats.misses
            ),
        ));
        info
    }

    fn synchronize(&self) -> Result<()> {
        let gpu = &self.state()?.device.gpu;
        gpu.wait()?;
        index::take_error(gpu)
    }

    fn batch(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.state()?.device.gpu.batch(work)
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let state = self.state()?;
        let gpu = &state.device.gpu;
        let mut mem = state.memory();
        let ptr = mem.alloc(gpu, bytes)?;
        if state.poison && bytes > 0 {
            // In chunks of at most 1 MiB, so poisoning a large buffer needs no host copy of its size.
            let chunk = vec![crate::backends::reference::POISON_BYTE; bytes.min(1 << 20)];
            let mut done = 0;
            while done < bytes {
                let len = chunk.len().min(bytes - done);
                let written = ptr
                    .offset(done)
                    .ok_or_else(|| BackendError::overflow("alloc", "pointer + offset overflows"))
                    .and_then(|p| mem.place(p, len))
                    .and_then(|at| memory::write(gpu, at, &chunk[..len]));
                if let Err(e) = written {
                    let _ = mem.free(ptr);
                    return Err(e);
                }
                done += len;
            }
        }
        Ok(ptr)
    }

    fn allocated_bytes(&self) -> Option<usize> {
        self.state
            .as_ref()
            .map(|s| s.memory().table.allocated_bytes())
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.state()?.memory().free(ptr)
    }

    fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let state = self.state()?;
        let mem = state.memory();
        let at = mem.place(dst, src.len())?;
        memory::write(&state.device.gpu, at, src)
    }

    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let state = self.state()?;
        let mem = state.memory();
        let at = mem.place(src, dst.len())?;
        let bytes = memory::read_bytes(&state.device.gpu, at, dst.len())?;
        dst.copy_from_slice(&bytes);
        index::take_error(&state.device.gpu)
    }

    fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let mut acc = Accesses::new("copy_dtod", InPlace::Forbidden);
        acc.push("src", src, bytes, Access::Read, true);
        acc.push("dst", dst, bytes, Access::Write, true);
        let state = self.state()?;
        let mem = state.memory();
        mem.table.check_accesses(&acc)?;
        if bytes == 0 {
            return Ok(());
        }
        let gpu = &state.device.gpu;
        let (from, to) = (mem.place(src, bytes)?, mem.place(dst, bytes)?);
        let aligned =
            from.offset.is_multiple_of(4) && to.offset.is_multiple_of(4) && bytes.is_multiple_of(4);
        if aligned && from.buffer != to.buffer {
            return gpu.scoped("copying between buffers", bytes, || {
                let mut encoder = gpu
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
                encoder.copy_buffer_to_buffer(
                    from.buffer,
                    from.offset,
                    to.buffer,
                    to.offset,
                    bytes as u64,
                );
                gpu.submit(encoder.finish());
            });
        }
        // A queue copy cannot have one buffer as both source and destination (two blocks of a
        // memory pool's segment are), nor unaligned ends: those run as a strided copy of 32-bit
        // words where aligned, else of bytes, which binds each view in a window of its own (or cuts
        // the copy where it is larger than a binding) and keeps the bytes around the destination.
        drop(mem);
        use crate::compute::StridedBuf;
        use crate::dtype::DType;
        let (dtype, len) = if aligned {
            (DType::I32, bytes / 4)
        } else {
            (DType::U8, bytes)
        };
        self.copy_strided(&CopyDesc {
            dtype,
            src: StridedBuf::contiguous(src, &[len]),
            dst: StridedBuf::contiguous(dst, &[len]),
        })
    }

    fn record_event(&self) -> Result<EventId> {
        let state = self.state()?;
        state.events().record(&state.device.gpu)
    }

    fn wait_event(&self, event: EventId) -> Result<()> {
        // One queue: what comes after is already ordered after the event.
        self.state()?.events().check("wait_event", event)
    }

    fn event_complete(&self, event: EventId) -> Result<bool> {
        let state = self.state()?;
        state.events().complete(&state.device.gpu, event)
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        let state = self.state()?;
        state.events().synchronize(&state.device.gpu, event)
    }

    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        let state = self.state()?;
        state.events().elapsed_ms(&state.device.gpu, start, end)
    }

    fn destroy_event(&self, event: EventId) -> Result<()> {
        self.state()?.events().destroy(event)
    }

    // Every op method runs this backend's `OpImpl` of its descriptor, in the file of its family.
    crate::for_each_op!(ops_by_impl);
    fn fingerprint(&self) -> String {
        match self.state() {
            Ok(state) => {
                let info = &state.device.gpu.info;
                format!(
                    "webgpu/{}/{:?}/{}/{}",
                    info.name, info.backend, info.driver, info.driver_info
                )
            }
            Err(_) => "webgpu/uninitialised".into(),
        }
    }

    fn variants(&self, op: &TunableOp) -> &'static [&'static str] {
        match op {
            TunableOp::Gemm(d) if is_math_dtype(d.dtype) => &blas::Tile::NAMES,
            _ => &[],
        }
    }

    fn run_variant(&self, op: &TunableOp, variant: &str) -> Result<()> {
        let tile = [blas::Tile::Large, blas::Tile::Small]
            .into_iter()
            .find(|t| t.name() == variant);
        match (op, tile) {
            (TunableOp::Gemm(d), Some(tile)) => {
                math_dtype("gemm", d.dtype, d)?;
                self.gemm_with(d, tile)
            }
            _ => Err(BackendError::invalid(
                op.name(),
                format!("the webgpu backend has no variant `{variant}` of this op"),
            )),
        }
    }
}
