//! The recording side of graph capture: [`Tap`] stands between a backend's ops and its device while
//! a thread captures. Every call still runs on the device (the closure's results are real); each op
//! that succeeds is also appended to the [`Recording`]. Calls a replay could not repeat faithfully —
//! reading device memory on the host, random fills — are refused with `GraphCapture`.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use super::node::Node;
use crate::compute::{
    ComputeBackend, DevicePtr, EventId, HostBuffer, MemoryFence, OpDesc, RandomDesc, StreamId,
    TunableOp,
};
use crate::device::{BackendType, DeviceInfo};
use crate::error::{BackendError, Result};
use crate::tensor::{Storage, Tensor};

/// What one capture has seen so far.
pub(crate) struct Recording {
    /// The capturing thread; other threads' calls are not recorded.
    pub thread: ThreadId,
    /// The ops, in order.
    pub nodes: Vec<Node>,
    /// For each allocation made before the capture that an op touched, the view it was first
    /// touched through: the graph's inputs, in that order.
    pub inputs: Vec<Tensor>,
    /// Allocations made during the capture; the graph keeps them.
    pub created: Vec<Arc<Storage>>,
    created_ids: HashSet<usize>,
    /// The first call the capture refused (op and reason); the capture fails with it even if the
    /// closure ignored the error.
    pub refused: Option<(&'static str, String)>,
}

impl Recording {
    /// Notes the refusal (the first one wins) and returns it as an error.
    fn refuse(&mut self, op: &'static str, details: String) -> BackendError {
        if self.refused.is_none() {
            self.refused = Some((op, details.clone()));
        }
        BackendError::GraphCapture { op, details }
    }
}

/// A backend's device with a recorder in front of it.
pub(crate) struct Tap {
    device: Arc<dyn ComputeBackend>,
    recording: Mutex<Option<Recording>>,
    /// True while any thread captures (a lock-free check for the common case).
    active: AtomicBool,
}

impl fmt::Debug for Tap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tap").field("device", &self.device).finish()
    }
}

impl Tap {
    /// A tap in front of `device`, recording nothing.
    pub fn new(device: Arc<dyn ComputeBackend>) -> Tap {
        Tap {
            device,
            recording: Mutex::new(None),
            active: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Recording>> {
        self.recording.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when the calling thread is capturing through this tap. Inline, like the other
    /// checks every op makes: without a capture under way it is one atomic load.
    #[inline]
    pub fn capturing_here(&self) -> bool {
        self.active.load(Ordering::Acquire) && self.capturing_thread()
    }

    /// Whether the capture under way is the calling thread's.
    #[cold]
    fn capturing_thread(&self) -> bool {
        self.lock()
            .as_ref()
            .is_some_and(|r| r.thread == std::thread::current().id())
    }

    /// Starts recording the calling thread's calls. `GraphCapture` while a capture is under way.
    pub fn begin(&self) -> Result<()> {
        let mut slot = self.lock();
        if slot.is_some() {
            return Err(BackendError::GraphCapture {
                op: "capture_graph",
                details:
                    "a capture is already under way on this backend; finish it first (captures \
                          do not nest)"
                        .into(),
            });
        }
        *slot = Some(Recording {
            thread: std::thread::current().id(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            created: Vec::new(),
            created_ids: HashSet::new(),
            refused: None,
        });
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// Stops recording and hands back what was recorded.
    pub fn end(&self) -> Option<Recording> {
        let mut slot = self.lock();
        self.active.store(false, Ordering::Release);
        slot.take()
    }

    /// Notes an allocation made by the capturing thread.
    #[inline]
    pub fn note_created(&self, storage: &Arc<Storage>) {
        if self.active.load(Ordering::Acquire) {
            self.record_created(storage);
        }
    }

    #[cold]
    fn record_created(&self, storage: &Arc<Storage>) {
        let mut slot = self.lock();
        if let Some(rec) = slot.as_mut() {
            if rec.thread == std::thread::current().id() {
                rec.created_ids.insert(Arc::as_ptr(storage) as usize);
                rec.created.push(Arc::clone(storage));
            }
        }
    }

    /// Notes that the capturing thread handed `tensor`'s memory to an op. Memory made before the
    /// capture becomes an input, known by the view it was first used through; a later view of the
    /// same memory must stay within that view's bytes, since a replay fills only those.
    #[inline]
    pub fn note_used(&self, tensor: &Tensor) {
        if self.active.load(Ordering::Acquire) {
            self.record_used(tensor);
        }
    }

    #[cold]
    fn record_used(&self, tensor: &Tensor) {
        let mut slot = self.lock();
        let Some(rec) = slot.as_mut() else { return };
        if rec.thread != std::thread::current().id()
            || rec.created_ids.contains(&tensor.storage_id())
        {
            return;
        }
        match rec.inputs.iter().position(|t| t.shares_storage(tensor)) {
            None => rec.inputs.push(tensor.clone()),
            Some(i) => {
                let first = &rec.inputs[i];
                let within = tensor.numel() == 0
                    || match (first.byte_span(), tensor.byte_span()) {
                        (Some((a, b)), Some((c, d))) => a <= c && d <= b,
                        _ => false,
                    };
                if !within {
                    let details = format!(
                            "input {i} (shape {:?}) is also used through a view of shape {:?} that \
                             reaches memory outside it; a replay refills only the first view, so pass \
                             the whole tensor and take views of it inside the closure",
                            first.shape(),
                        tensor.shape()
                    );
                    rec.refuse("capture_graph", details);
                }
            }
        }
    }

    fn record(&self, node: Node) {
        if let Some(rec) = self.lock().as_mut() {
            rec.nodes.push(node);
        }
    }

    fn refuse(&self, op: &'static str, details: &str) -> BackendError {
        match self.lock().as_mut() {
            Some(rec) => rec.refuse(op, details.into()),
            None => BackendError::GraphCapture {
                op,
                details: details.into(),
            },
        }
    }
}

impl Tap {
    /// Runs one op on the device and records it when it succeeds. Random fills are refused: a replay
    /// would repeat the same values every launch.
    fn op<D: OpDesc>(&self, desc: &D) -> Result<()> {
        if D::NAME == RandomDesc::NAME {
            return Err(self.refuse(
                D::NAME,
                "a random fill inside a capture would replay the same values every launch; draw \
                 random tensors outside the closure and pass them in as inputs",
            ));
        }
        desc.run(&*self.device)?;
        self.record(Node::Op(Box::new(desc.clone())));
        Ok(())
    }
}

/// Every op method, through [`Tap::op`].
macro_rules! recorded {
    ($($method:ident($desc:ty)),* $(,)?) => {
        $(
            fn $method(&self, desc: &$desc) -> Result<()> {
                self.op(desc)
            }
        )*
    };
}

impl ComputeBackend for Tap {
    fn name(&self) -> &str {
        self.device.name()
    }

    fn backend_type(&self) -> BackendType {
        self.device.backend_type()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        self.device.as_any()
    }

    fn init(&mut self) -> Result<()> {
        if self.device.is_initialized() {
            Ok(())
        } else {
            Err(BackendError::NotInitialized {
                backend: self.device.backend_type(),
            })
        }
    }

    fn is_initialized(&self) -> bool {
        self.device.is_initialized()
    }

    fn device_info(&self) -> DeviceInfo {
        self.device.device_info()
    }

    fn synchronize(&self) -> Result<()> {
        self.device.synchronize()
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.device.alloc(bytes)
    }

    fn allocated_bytes(&self) -> Option<usize> {
        self.device.allocated_bytes()
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.device.free(ptr)
    }

    fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.device.copy_htod(dst, src)?;
        self.record(Node::Upload {
            dst,
            bytes: src.to_vec(),
        });
        Ok(())
    }

    fn copy_dtoh(&self, _dst: &mut [u8], _src: DevicePtr) -> Result<()> {
        Err(self.refuse(
            "copy_dtoh",
            "reading device memory on the host while capturing: a replay would not repeat what the \
             host did with the values; read results after the capture, or from launch_graph's outputs",
        ))
    }

    fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.device.copy_dtod(dst, src, bytes)?;
        self.record(Node::CopyDtod { dst, src, bytes });
        Ok(())
    }

    crate::for_each_op!(recorded);

    fn batch(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.device.batch(work)
    }

    fn fingerprint(&self) -> String {
        self.device.fingerprint()
    }

    fn variants(&self, op: &TunableOp) -> &'static [&'static str] {
        self.device.variants(op)
    }

    fn run_variant(&self, op: &TunableOp, variant: &str) -> Result<()> {
        self.device.run_variant(op, variant)?;
        self.record(Node::Tuned {
            op: op.clone(),
            variant: variant.into(),
        });
        Ok(())
    }

    fn create_stream(&self) -> Result<StreamId> {
        self.device.create_stream()
    }

    fn set_current_stream(&self, stream: StreamId) -> Result<StreamId> {
        self.device.set_current_stream(stream)
    }

    fn record_event(&self) -> Result<EventId> {
        self.device.record_event()
    }

    fn wait_event(&self, event: EventId) -> Result<()> {
        self.device.wait_event(event)
    }

    fn event_complete(&self, event: EventId) -> Result<bool> {
        self.device.event_complete(event)
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        self.device.event_synchronize(event)
    }

    fn event_elapsed_ms(&self, start: EventId, end: EventId) -> Result<f32> {
        self.device.event_elapsed_ms(start, end)
    }

    fn destroy_event(&self, event: EventId) -> Result<()> {
        self.device.destroy_event(event)
    }

    fn memory_fence(&self) -> Result<Option<Box<dyn MemoryFence>>> {
        self.device.memory_fence()
    }

    fn alloc_host(&self, bytes: usize) -> Result<Box<dyn HostBuffer>> {
        self.device.alloc_host(bytes)
    }

    fn copy_htod_async(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.device.copy_htod_async(dst, src)?;
        self.record(Node::Upload {
            dst,
            bytes: src.to_vec(),
        });
        Ok(())
    }

    fn copy_dtoh_async(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.copy_dtoh(dst, src)
    }
}
