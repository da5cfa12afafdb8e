//! Graph capture and replay (`capture_graph` / `launch_graph`), for every backend.
//!
//! [`Backend::capture_graph`] runs a closure once, for real, while recording each device call its ops
//! make (`tap.rs`). The memory the calls touch is either made during the capture (intermediates and
//! outputs, which the [`Graph`] then keeps) or existed before it: each such allocation is an *input*,
//! known by the view the closure first used it through, in order of first use. The graph keeps its own
//! copy of every input's allocation and points the recorded calls at it (`node.rs`).
//!
//! [`Backend::launch_graph`] copies new input tensors into those copies, issues the recorded calls
//! again with the same descriptors (on WebGPU in one queue submission, through
//! [`ComputeBackend::batch`]), writes inputs that the graph updates in place back into the tensors
//! passed, and returns fresh copies of the outputs. Because the same calls run on the same kinds of
//! operands, a replay is bitwise equal to running the closure's ops eagerly on inputs of the captured
//! layouts.
//!
//! What a graph fixes at capture time, as a CUDA graph does: every host value the ops took (scalar
//! operands, Adam's step and learning rate, shapes, which kernels ran). What a capture refuses, with
//! `GraphCapture`: reading device memory on the host (`to_vec`, `item`), random fills (they would
//! replay the same values), raw device memory from `compute().alloc`, launching a graph, and a second
//! capture on the same backend. Ops of other threads run normally and are not recorded.
//!
//! On CUDA this replays the recorded calls on the current stream; it does not use CUDA's own stream
//! capture (`cudaGraph`).

mod node;
mod tap;

use std::sync::{Arc, Mutex};

pub(crate) use tap::Tap;

use crate::backend::Backend;
use crate::compute::{ComputeBackend, CopyDesc, StridedBuf};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::tensor::{Storage, Tensor};
use node::{relocate_buf, Node, Relocation};

/// A recorded sequence of device calls with the memory it runs on. Made by
/// [`Backend::capture_graph`], run by [`Backend::launch_graph`]. It keeps the intermediates and
/// outputs of the capture and a copy of each input's allocation alive until it is dropped.
pub struct Graph {
    backend: Backend,
    nodes: Vec<Node>,
    inputs: Vec<GraphInput>,
    outputs: Vec<Tensor>,
    moves: Vec<Relocation>,
    _created: Vec<Arc<Storage>>,
    /// One launch at a time: launches share the graph's memory.
    launch: Mutex<()>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("backend", &self.backend)
            .field("ops", &self.nodes.len())
            .field("inputs", &self.input_specs())
            .field("outputs", &self.output_specs())
            .finish()
    }
}

/// One input of a graph.
struct GraphInput {
    shape: Vec<usize>,
    dtype: DType,
    /// The captured view, on the graph's copy of the allocation.
    view: StridedBuf,
    /// The graph's copy of the allocation; kept alive for `view`.
    _copy: Tensor,
    /// True when a recorded call writes into it (in-place state such as Adam moments).
    written: bool,
}

/// What a captured closure may return: the graph's outputs, in order.
pub trait GraphOutputs {
    /// The output tensors.
    fn into_tensors(self) -> Vec<Tensor>;
}

impl GraphOutputs for Tensor {
    fn into_tensors(self) -> Vec<Tensor> {
        vec![self]
    }
}

impl GraphOutputs for Vec<Tensor> {
    fn into_tensors(self) -> Vec<Tensor> {
        self
    }
}

impl GraphOutputs for () {
    fn into_tensors(self) -> Vec<Tensor> {
        Vec::new()
    }
}

impl GraphOutputs for (Tensor, Tensor) {
    fn into_tensors(self) -> Vec<Tensor> {
        vec![self.0, self.1]
    }
}

impl GraphOutputs for (Tensor, Tensor, Tensor) {
    fn into_tensors(self) -> Vec<Tensor> {
        vec![self.0, self.1, self.2]
    }
}

impl Graph {
    /// The number of recorded device calls.
    pub fn num_ops(&self) -> usize {
        self.nodes.len()
    }

    /// The shape and dtype of each input, in the order [`Backend::launch_graph`] takes them: the
    /// order in which the closure first used each tensor that existed before the capture.
    pub fn input_specs(&self) -> Vec<(Vec<usize>, DType)> {
        self.inputs
            .iter()
            .map(|i| (i.shape.clone(), i.dtype))
            .collect()
    }

    /// The shape and dtype of each output, in the order the closure returned them.
    pub fn output_specs(&self) -> Vec<(Vec<usize>, DType)> {
        self.outputs
            .iter()
            .map(|o| (o.shape().to_vec(), o.dtype()))
            .collect()
    }

    /// Which inputs the graph writes into (in-place updates): [`Backend::launch_graph`] writes
    /// those back into the tensors it is given.
    pub fn updated_inputs(&self) -> Vec<usize> {
        (0..self.inputs.len())
            .filter(|&i| self.inputs[i].written)
            .collect()
    }
}

/// Ends a capture if the closure panics.
struct CaptureGuard<'a>(&'a Tap);

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

impl Backend {
    /// Runs `ops` once and records the device calls its ops on this backend make, for replay with
    /// [`Backend::launch_graph`]. The closure's results are real; it returns the graph's outputs
    /// (a tensor, a tuple of two or three, a `Vec`, or `()`). The graph's inputs are the tensors
    /// made before the capture that the ops read or write, in order of first use
    /// ([`Graph::input_specs`]).
    ///
    /// Errors: the closure's own error; `GraphCapture` when a call cannot be recorded (reading device
    /// memory on the host, a random fill, raw device memory, launching a graph, an input used again
    /// through a view reaching outside the first one) or a capture is already under way on this
    /// backend; `DeviceMismatch` when an output lives on another backend.
    pub fn capture_graph<T: GraphOutputs>(&self, ops: impl FnOnce() -> Result<T>) -> Result<Graph> {
        let tap = self.graph_tap();
        tap.begin()?;
        let guard = CaptureGuard(tap);
        let outputs = ops().map(GraphOutputs::into_tensors);
        if let Ok(outputs) = &outputs {
            // An output may be an input returned as it is: it must be known to the graph.
            for o in outputs.iter().filter(|o| o.backend().same_instance(self)) {
                tap.note_used(o);
            }
        }
        let recording = tap.end();
        drop(guard);
        let outputs = outputs?;
        let recording = recording.ok_or_else(|| BackendError::GraphCapture {
            op: "capture_graph",
            details: "internal: the recording disappeared".into(),
        })?;
        if let Some((op, details)) = recording.refused {
            return Err(BackendError::GraphCapture { op, details });
        }
        for o in &outputs {
            self.check_owner("capture_graph", o)?;
        }

        // The graph's own copy of each input's allocation, holding its values at the end of the
        // capture (they show where a later view reads past what a launch refills).
        let mut inputs = Vec::with_capacity(recording.inputs.len());
        let mut moves = Vec::with_capacity(recording.inputs.len());
        for t in &recording.inputs {
            let (base, bytes) = t.storage().extent();
            let copy = Tensor::alloc(self, &[bytes], DType::U8)?;
            let to = copy.data_ptr();
            if bytes > 0 {
                self.compute().copy_dtod(to, base, bytes)?;
            }
            moves.push(Relocation {
                from: base,
                bytes,
                to,
            });
            inputs.push(GraphInput {
                shape: t.shape().to_vec(),
                dtype: t.dtype(),
                view: StridedBuf {
                    ptr: to,
                    layout: t.layout().clone(),
                },
                _copy: copy,
                written: false,
            });
        }

        let created: Vec<_> = recording.created.iter().map(|s| s.extent()).collect();
        let mut nodes = recording.nodes;
        for node in &mut nodes {
            let acc = node.accesses()?;
            for r in acc.regions.iter().filter(|r| r.bytes > 0) {
                let end = r.ptr.0.saturating_add(r.bytes as u64);
                let within = |(base, bytes): (crate::compute::DevicePtr, usize)| {
                    r.ptr.0 >= base.0 && end <= base.0.saturating_add(bytes as u64)
                };
                if let Some(i) = moves.iter().position(|m| within((m.from, m.bytes))) {
                    inputs[i].written |= r.access.writes();
                } else if !created.iter().any(|&e| within(e)) {
                    return Err(BackendError::GraphCapture {
                        op: acc.op,
                        details: format!(
                            "operand {} is device memory that is neither a tensor made during the \
                             capture nor one the closure's ops were given (raw memory from \
                             compute().alloc?); a graph replays tensor memory only",
                            r.name
                        ),
                    });
                }
            }
            node.relocate(&moves);
        }

        Ok(Graph {
            backend: self.clone(),
            nodes,
            inputs,
            outputs,
            moves,
            _created: recording.created,
            launch: Mutex::new(()),
        })
    }

    /// Replays `graph` on `inputs` (one per [`Graph::input_specs`] entry, same shapes and dtypes,
    /// any layout) and returns new tensors holding its outputs. Inputs the graph updates in place
    /// ([`Graph::updated_inputs`]) are updated in the tensors passed. The result is bitwise equal to
    /// running the captured ops eagerly when the inputs have the layouts used in the capture.
    ///
    /// Errors: `GraphCapture` for a graph captured on another backend instance or a launch during a
    /// capture; `InvalidArgument` for the wrong number of inputs; `ShapeMismatch`/`DTypeMismatch`
    /// naming the input that differs; `DeviceMismatch` for an input on another backend; the device's
    /// errors from the replayed calls.
    pub fn launch_graph(&self, graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let op = "launch_graph";
        if !graph.backend.same_instance(self) {
            return Err(BackendError::GraphCapture {
                op,
                details:
                    "the graph was captured on another backend instance; capture it on this one"
                        .into(),
            });
        }
        if self.graph_tap().capturing_here() {
            return Err(BackendError::GraphCapture {
                op,
                details: "a graph cannot be launched while this thread captures another; call its \
                          ops inside the capture instead"
                    .into(),
            });
        }
        if inputs.len() != graph.inputs.len() {
            return Err(BackendError::invalid(
                op,
                format!(
                    "the graph takes {} inputs {:?}, got {}",
                    graph.inputs.len(),
                    graph.input_specs(),
                    inputs.len()
                ),
            ));
        }
        for (i, (t, spec)) in inputs.iter().zip(&graph.inputs).enumerate() {
            self.check_owner(op, t)?;
            if t.shape() != spec.shape {
                return Err(BackendError::shape(
                    op,
                    format!(
                        "input {i} must have shape {:?}, got {:?}",
                        spec.shape,
                        t.shape()
                    ),
                ));
            }
            if t.dtype() != spec.dtype {
                return Err(BackendError::DTypeMismatch {
                    op,
                    expected: spec.dtype,
                    got: t.dtype(),
                });
            }
        }
        let _one_at_a_time = graph.launch.lock().unwrap_or_else(|e| e.into_inner());
        let outputs = graph
            .outputs
            .iter()
            .map(|o| self.empty(o.shape(), o.dtype()))
            .collect::<Result<Vec<_>>>()?;
        let device = self.compute();
        device.batch(&mut || replay(device, graph, inputs, &outputs))?;
        Ok(outputs)
    }
}

/// Fills the graph's inputs, issues its calls, writes updated inputs back and copies the outputs.
fn replay(
    device: &dyn ComputeBackend,
    graph: &Graph,
    inputs: &[Tensor],
    outputs: &[Tensor],
) -> Result<()> {
    for (t, input) in inputs.iter().zip(&graph.inputs) {
        device.copy_strided(&CopyDesc {
            dtype: input.dtype,
            src: t.strided_buf(),
            dst: input.view.clone(),
        })?;
    }
    for node in &graph.nodes {
        node.run(device)?;
    }
    for (t, input) in inputs.iter().zip(&graph.inputs) {
        if input.written {
            device.copy_strided(&CopyDesc {
                dtype: input.dtype,
                src: input.view.clone(),
                dst: t.strided_buf(),
            })?;
        }
    }
    for (out, captured) in outputs.iter().zip(&graph.outputs) {
        device.copy_strided(&CopyDesc {
            dtype: captured.dtype(),
            src: relocate_buf(&captured.strided_buf(), &graph.moves),
            dst: out.strided_buf(),
        })?;
    }
    Ok(())
}
