//! One opened WebGPU device: the wgpu device and queue, its limits and features, and the error
//! plumbing that turns wgpu's errors into [`BackendError`]s instead of panics.
//!
//! wgpu reports validation and out-of-memory errors asynchronously, to an error scope or else to an
//! "uncaptured error" handler whose default panics. Every piece of work here runs inside
//! [`Gpu::scoped`], which pushes validation, out-of-memory and internal scopes and maps what they
//! caught; the uncaptured handler only records (it never panics), and a lost device is remembered
//! and reported by every later call.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use crate::device::BackendType;
use crate::error::{BackendError, Result};

/// Drives `future` to completion on this thread, parking it while the future is pending: a minimal
/// executor for this module's `async` functions (they complete without waiting on native targets)
/// and for callers without an async runtime.
pub fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => std::thread::park(),
        }
    }
}

/// An opened device and its queue.
#[derive(Debug)]
pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    /// Threads per row of the row kernels and per channel of batch norm (the `WG` of
    /// `shaders/combine.wgsl`): see [`row_threads_for`].
    pub row_threads: u32,
    /// The most loop passes a launch may run per invocation (`loops.rs`).
    pub loop_limit: u64,
    /// Set by the device-lost callback: why the device was lost.
    lost: Arc<Mutex<Option<String>>>,
    /// Errors no scope caught (the handler records them instead of panicking).
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// Command buffers held back while a batch is open ([`Gpu::batch`]).
    pending: Mutex<Option<Vec<wgpu::CommandBuffer>>>,
    /// Queue submissions so far.
    submissions: AtomicU64,
    /// Kernel dispatches so far.
    launches: AtomicU64,
}

/// The optional features the backend uses when the adapter has them.
pub(crate) const OPTIONAL_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::TIMESTAMP_QUERY);

/// Threads per row of the row kernels on an adapter: 256 on GPUs; on a CPU implementation such as
/// lavapipe, its SIMD width (the largest subgroup it reports, 8 when it reports none), because it
/// runs a workgroup's SIMD groups one after another and switches between them at every barrier,
/// which made 256 threads per row 5 to 18 times slower there than one SIMD group.
pub(crate) fn row_threads_for(info: &wgpu::AdapterInfo) -> u32 {
    if info.device_type == wgpu::DeviceType::Cpu {
        let simd = if info.subgroup_max_size == 0 {
            8
        } else {
            info.subgroup_max_size
        };
        simd.clamp(1, 256).next_power_of_two().min(256)
    } else {
        256
    }
}

impl Gpu {
    /// Whether a launch of `loops` passes per invocation is within the loop budget.
    pub fn loops_fit(&self, loops: u64) -> bool {
        loops <= self.loop_limit
    }

    /// Opens `adapter` with its own limits (wgpu's defaults cap storage buffers at 128 MiB) and
    /// those of the `wanted` features it has (see [`OPTIONAL_FEATURES`]). `Unavailable` when the
    /// adapter refuses.
    pub fn open(adapter: &wgpu::Adapter, wanted: wgpu::Features) -> Result<Gpu> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let features = adapter.features() & wanted & OPTIONAL_FEATURES;
        let desc = wgpu::DeviceDescriptor {
            label: Some("torsh-backend"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) =
            block_on(adapter.request_device(&desc)).map_err(|e| BackendError::Unavailable {
                backend: BackendType::WebGpu,
                reason: format!("the adapter {} refused to open a device: {e}", info.name),
            })?;
        let lost = Arc::new(Mutex::new(None));
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        {
            let lost = Arc::clone(&lost);
            device.set_device_lost_callback(move |reason, message| {
                if let Ok(mut l) = lost.lock() {
                    *l = Some(format!("{reason:?}: {message}"));
                }
            });
        }
        {
            let uncaptured = Arc::clone(&uncaptured);
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                if let Ok(mut u) = uncaptured.lock() {
                    u.push(e.to_string());
                }
            }));
        }
        Ok(Gpu {
            device,
            queue,
            row_threads: row_threads_for(&info),
            loop_limit: super::loops::LOOP_LIMIT.into(),
            info,
            limits,
            features,
            lost,
            uncaptured,
            pending: Mutex::new(None),
            submissions: AtomicU64::new(0),
            launches: AtomicU64::new(0),
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Option<Vec<wgpu::CommandBuffer>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Submits `commands` to the queue, or holds them back while a batch is open. Queue writes
    /// (`write_buffer`) and reads must call [`Gpu::flush`] first, so that they stay in order.
    pub fn submit(&self, commands: wgpu::CommandBuffer) {
        let mut pending = self.pending();
        match pending.as_mut() {
            Some(held) => held.push(commands),
            None => {
                drop(pending);
                self.submit_now([commands]);
            }
        }
    }

    /// Submits `commands` to the queue at once (after [`Gpu::flush`] where order matters).
    pub fn submit_now(
        &self,
        commands: impl IntoIterator<Item = wgpu::CommandBuffer>,
    ) -> wgpu::SubmissionIndex {
        self.submissions.fetch_add(1, Ordering::Relaxed);
        self.queue.submit(commands)
    }

    /// Submits the commands a batch holds back so far, in one submission; the batch stays open.
    pub fn flush(&self) {
        let held = self.pending().as_mut().map(std::mem::take);
        if let Some(held) = held.filter(|h| !h.is_empty()) {
            self.submit_now(held);
        }
    }

    /// Runs `work` with its command buffers held back and submitted together when it returns (a
    /// batch inside a batch joins the outer one). Work that writes or reads buffers from the host
    /// flushes what is held first, so order is kept. Returns `work`'s error, or the submission's.
    pub fn batch(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        {
            let mut pending = self.pending();
            if pending.is_some() {
                drop(pending);
                return work();
            }
            *pending = Some(Vec::new());
        }
        // One set of error scopes for the whole batch: the ops inside skip their own.
        self.check_alive()?;
        let scopes = self.push_scopes();
        let out = work();
        let held = self.pending().take().unwrap_or_default();
        if !held.is_empty() {
            self.submit_now(held);
        }
        let caught = self.pop_scopes(scopes, "running a batch of commands", 0);
        out.and(caught)
    }

    /// Queue submissions made so far on this device.
    pub fn submissions(&self) -> u64 {
        self.submissions.load(Ordering::Relaxed)
    }

    /// Counts one kernel dispatch (the backend's own or a caller's).
    pub fn count_launch(&self) {
        self.launches.fetch_add(1, Ordering::Relaxed);
    }

    /// Kernel dispatches recorded so far on this device.
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// `DeviceLost` once the device has been lost.
    pub fn check_alive(&self) -> Result<()> {
        match self.lost.lock().ok().and_then(|l| l.clone()) {
            Some(reason) => Err(BackendError::DeviceLost {
                backend: BackendType::WebGpu,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes and maps what they caught:
    /// out of memory to `OutOfMemory { requested: bytes }`, a WGSL compile failure to
    /// `KernelCompile`, anything else to `Driver`. `what` names the work in messages.
    pub fn scoped<R>(&self, what: &str, bytes: usize, f: impl FnOnce() -> R) -> Result<R> {
        self.check_alive()?;
        if self.pending().is_some() {
            // Inside a batch, whose scopes catch what this work raises.
            return Ok(f());
        }
        let scopes = self.push_scopes();
        let out = f();
        self.pop_scopes(scopes, what, bytes).map(|()| out)
    }

    /// Pushes validation, out-of-memory and internal error scopes.
    fn push_scopes(&self) -> [wgpu::ErrorScopeGuard; 3] {
        [
            self.device.push_error_scope(wgpu::ErrorFilter::Validation),
            self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
            self.device.push_error_scope(wgpu::ErrorFilter::Internal),
        ]
    }

    /// Pops the scopes of [`Gpu::push_scopes`] and maps the first error caught, as `scoped` does.
    fn pop_scopes(
        &self,
        scopes: [wgpu::ErrorScopeGuard; 3],
        what: &str,
        bytes: usize,
    ) -> Result<()> {
        let [validation, memory, internal] = scopes;
        // Scopes pop in reverse order.
        let errors = [
            block_on(internal.pop()),
            block_on(memory.pop()),
            block_on(validation.pop()),
        ];
        self.check_alive()?;
        match errors.into_iter().flatten().next() {
            None => Ok(()),
            Some(e) => Err(map_error(what, bytes, e)),
        }
    }

    /// Blocks until the queue has finished all submitted work (and runs map callbacks).
    pub fn wait(&self) -> Result<()> {
        self.check_alive()?;
        self.flush();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| driver(format!("waiting for the queue: {e}")))?;
        self.check_alive()?;
        if let Some(e) = self.uncaptured.lock().ok().and_then(|mut u| u.pop()) {
            return Err(driver(format!("an earlier command failed: {e}")));
        }
        Ok(())
    }
}

/// A `Driver` error of the WebGPU backend.
pub(crate) fn driver(message: String) -> BackendError {
    BackendError::Driver {
        backend: BackendType::WebGpu,
        code: 0,
        message,
    }
}

/// The `BackendError` for a wgpu error raised while doing `what`.
fn map_error(what: &str, bytes: usize, e: wgpu::Error) -> BackendError {
    match e {
        wgpu::Error::OutOfMemory { .. } => BackendError::OutOfMemory {
            requested: bytes,
            available: 0,
        },
        wgpu::Error::Validation { description, .. } if description.contains("Shader") => {
            BackendError::KernelCompile {
                backend: BackendType::WebGpu,
                kernel: what.to_string(),
                log: description,
            }
        }
        other => driver(format!("{what}: {other}")),
    }
}
