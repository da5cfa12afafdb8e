//! One opened WebGPU device: the wgpu device and queue, its limits and features, and the error
//! plumbing that turns wgpu's errors into [`BackendError`]s instead of panics.
//!
//! wgpu reports validation and out-of-memory errors asynchronously, to an error scope or else to an
//! "uncaptured error" handler whose default panics. Every piece of work here runs inside
//! [`Gpu::scoped`], which pushes validation, out-of-memory and internal scopes and maps what they
//! caught; the uncaptured handler only records (it never panics), and a lost device is remembered
//! and reported by every later call.
//!
//! Threads share one device. wgpu's error scopes belong to the thread that pushed them, so a batch
//! ([`Gpu::batch`]) belongs to the thread that opened it: only that thread's command buffers are
//! held back and only its work skips its own scopes. Every queue operation (a submission, a
//! host-to-buffer write) takes the one queue lock and first submits whatever batches hold, so the
//! queue sees each thread's work in its order and a buffer freed while a held command still reads
//! it cannot be written by another thread ahead of that command.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::ThreadId;

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
    /// The queue lock: open batches and the command buffers they hold back ([`Gpu::batch`]).
    queued: Mutex<Queued>,
    /// Queue submissions so far.
    submissions: AtomicU64,
    /// Kernel dispatches so far.
    launches: AtomicU64,
    /// The error flag of kernels that check their input on the device (`shaders/index.wgsl`):
    /// words [raised, op code, index low, index high, size, 0, 0, 0].
    pub error_flag: wgpu::Buffer,
    /// Whether a kernel that may raise the flag has been dispatched on this device (from then on,
    /// every synchronize and host read reads the flag).
    pub flag_armed: std::sync::atomic::AtomicBool,
}

/// What the queue lock guards.
#[derive(Debug, Default)]
struct Queued {
    /// Threads with a batch open.
    open: Vec<ThreadId>,
    /// Command buffers those batches held back, in the order they were recorded.
    held: Vec<wgpu::CommandBuffer>,
}

impl Queued {
    fn in_batch(&self) -> bool {
        self.open.contains(&std::thread::current().id())
    }
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
        let setup = crate::backends::device_setup();
        let (device, queue) =
            block_on(adapter.request_device(&desc)).map_err(|e| BackendError::Unavailable {
                backend: BackendType::WebGpu,
                reason: format!("the adapter {} refused to open a device: {e}", info.name),
            })?;
        drop(setup);
        // wgpu zero-initialises new buffers: the flag starts lowered.
        let error_flag = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("torsh error flag"),
            size: 32,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
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
            queued: Mutex::new(Queued::default()),
            submissions: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            error_flag,
            flag_armed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn queued(&self) -> MutexGuard<'_, Queued> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Submits what batches hold, then `commands`, in one submission, under the queue lock `q`.
    fn submit_locked(
        &self,
        q: &mut Queued,
        commands: impl IntoIterator<Item = wgpu::CommandBuffer>,
    ) -> wgpu::SubmissionIndex {
        let mut all = std::mem::take(&mut q.held);
        all.extend(commands);
        self.submissions.fetch_add(1, Ordering::Relaxed);
        self.queue.submit(all)
    }

    /// Submits what batches hold, if anything, under the queue lock `q`.
    fn flush_locked(&self, q: &mut Queued) {
        if !q.held.is_empty() {
            self.submit_locked(q, []);
        }
    }

    /// Submits `commands` to the queue, or holds them back while this thread has a batch open.
    pub fn submit(&self, commands: wgpu::CommandBuffer) {
        let mut q = self.queued();
        if q.in_batch() {
            q.held.push(commands);
        } else {
            self.submit_locked(&mut q, [commands]);
        }
    }

    /// Submits `commands` at once, after what batches hold (a read must not wait for a batch).
    pub fn submit_now(
        &self,
        commands: impl IntoIterator<Item = wgpu::CommandBuffer>,
    ) -> wgpu::SubmissionIndex {
        self.submit_locked(&mut self.queued(), commands)
    }

    /// Submits the commands batches hold so far, in one submission; the batches stay open.
    pub fn flush(&self) {
        self.flush_locked(&mut self.queued());
    }

    /// Writes `data` to `buffer` at byte `offset` through the queue, after what batches hold: the
    /// write lands after every command recorded before it, on any thread.
    pub fn write_buffer(&self, buffer: &wgpu::Buffer, offset: u64, data: &[u8]) {
        let mut q = self.queued();
        self.flush_locked(&mut q);
        self.queue.write_buffer(buffer, offset, data);
    }

    /// Runs `work` with this thread's command buffers held back and submitted together when it
    /// returns (a batch inside a batch joins the outer one; other threads' work is not held). Work
    /// that writes or reads buffers from the host submits what is held first, so order is kept.
    /// Returns `work`'s error, or the submission's.
    pub fn batch(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let me = std::thread::current().id();
        {
            let mut q = self.queued();
            if q.in_batch() {
                drop(q);
                return work();
            }
            q.open.push(me);
        }
        // One set of error scopes for the whole batch (this thread's): the ops inside skip their
        // own.
        let scopes = self.check_alive().map(|()| self.push_scopes());
        let out = match &scopes {
            Ok(_) => work(),
            Err(_) => Ok(()),
        };
        {
            let mut q = self.queued();
            q.open.retain(|t| *t != me);
            self.flush_locked(&mut q);
        }
        let caught = scopes.and_then(|s| self.pop_scopes(s, "running a batch of commands", 0));
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
        if self.queued().in_batch() {
            // Inside this thread's batch, whose scopes catch what this work raises.
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
