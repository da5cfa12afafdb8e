//! conv2d and its two gradients through cuDNN 9's legacy convolution API, for backends built with
//! `enable_cudnn(true)` (the default) on machines where `libcudnn.so.9` can be loaded.
//!
//! One call is: tensor descriptors (NCHW) for input and output, a filter descriptor `[K, C/groups, R, S]`,
//! a convolution descriptor (padding, stride, dilation, `CUDNN_CROSS_CORRELATION`, group count, math
//! type), an algorithm from cuDNN's heuristic (`cudnnGetConvolution{Forward,BackwardData,
//! BackwardFilter}Algorithm_v7`), a workspace from the backend's allocator, the product
//! (`cudnnConvolutionForward`, `cudnnConvolutionBackwardData` for the input gradient and the transposed
//! convolution, `cudnnConvolutionBackwardFilter` for the weight gradient) with `beta = 0` (the written
//! tensor is not read), then a bias with `cudnnAddTensor` as a `1×K×1×1` tensor (forward) or `1×C×1×1`
//! (a transposed convolution's bias on the input gradient). cuDNN never decides an answer on its own:
//! whenever it declines (unsupported configuration, no acceptable algorithm, any error status, no room
//! for a workspace) the caller runs this backend's own kernel (`conv.rs`) for that call, which writes
//! every element, so a partial cuDNN result is overwritten.
//!
//! Numerics:
//! - Types as in cuDNN's supported configurations: f32 data with f32 compute, f64 with f64, and f16 and
//!   bf16 data with f32 compute (`PSEUDO_HALF_CONFIG` / `PSEUDO_BFLOAT16_CONFIG`; bf16 needs sm_80+,
//!   elsewhere cuDNN reports it unsupported and the kernel runs).
//! - Math type: f32 asks for `CUDNN_FMA_MATH` (no TF32: on sm_80+ `CUDNN_DEFAULT_MATH` would allow it)
//!   unless the backend was built with `enable_tensor_cores(true)`, then `CUDNN_DEFAULT_MATH` (TF32
//!   permitted, as in PyTorch with `allow_tf32`). f16 and bf16 ask for `CUDNN_TENSOR_OP_MATH`, f64 for
//!   `CUDNN_DEFAULT_MATH`. `CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION` is never accepted: it may round f32 or
//!   bf16 operands to f16. Each algorithm's reported math type is set on the descriptor before it runs
//!   (cuDNN picks algorithm and math type as a pair), and for f32 without tensor cores only
//!   `CUDNN_FMA_MATH` results are accepted.
//! - Algorithms: only the GEMM family (`IMPLICIT_GEMM`, `IMPLICIT_PRECOMP_GEMM`, `GEMM`) and
//!   `DIRECT` forward, `ALGO_0` / `ALGO_1` for the input gradient and `ALGO_0` / `ALGO_1` /
//!   `ALGO_3` for the weight gradient, deterministic ones only (so a gradient is bitwise the same
//!   from run to run, as with PyTorch's `cudnn.deterministic`), in the heuristic's order. FFT and
//!   Winograd are never used: they lose precision (f32 bound 1e-5 would not hold) and mix taps, so
//!   one infinite input or weight turns outputs the reference computes as ±inf into NaN. The GEMM
//!   family computes each output as a sum of products of the same taps as the reference, with f32
//!   (or f64) accumulation.
//! - Padding and non-finite weights: cuDNN multiplies padded taps as zeros, so a ±inf or NaN weight gives
//!   NaN where its tap falls in the padding, while the reference (and the implicit-GEMM kernel) skips
//!   padded taps. This is accepted: it only differs for weights that are already non-finite (a broken
//!   model), cuDNN is what PyTorch uses on CUDA (PyTorch's CPU im2col path gives the same NaN), and
//!   checking weights for finiteness would need a device reduction and a host synchronisation per call.
//!   `enable_cudnn(false)` keeps the reference's exact semantics.
//! - The bias is added to the rounded convolution output, so f16 and bf16 results see two roundings
//!   (within the 1e-2 bound of those dtypes).
//!
//! cuDNN's status codes are printed with `cudnnGetErrorString` and their number, never through the
//! bindings' `Debug`, so a code newer than the bindings is still reported.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cudarc::cudnn::result as dnn;
use cudarc::cudnn::sys;

use super::memory::DeviceMemory;
use super::{loader, Gpu};
use crate::compute::{Conv2dBackwardInputDesc, Conv2dBackwardWeightDesc, Conv2dDesc, DevicePtr};
use crate::dtype::DType;

/// Why cuDNN declined a call; the caller then runs the implicit-GEMM kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Declined(pub String);

/// A step of the cuDNN path.
type Step<T> = std::result::Result<T, Declined>;

/// Results asked of the `_v7` heuristics: every algorithm under both math types.
const REQUESTED_ALGOS: usize = 16;

/// Operand alignment cuDNN's vectorised kernels may assume; other pointers go to the kernel.
const ALIGNMENT: u64 = 16;

/// Cached algorithm lists beyond which the cache is cleared (distinct shapes seen by one backend).
const MAX_PLANS: usize = 4096;

/// One cuDNN handle with the algorithm choices made so far. Work goes to the current stream of the
/// calling thread (set on the handle at every call).
pub(crate) struct Cudnn {
    state: Mutex<State>,
    /// `"9.21.0 (built for CUDA 13.0)"`.
    version: &'static str,
    /// Whether f32 may use TF32 tensor cores.
    tensor_cores: bool,
}

/// What the mutex guards.
struct State {
    handle: sys::cudnnHandle_t,
    /// The algorithm choice per convolution.
    plans: HashMap<Problem, Plan>,
    /// Calls cuDNN served.
    served: u64,
    /// Calls that fell back to the kernel.
    declined: u64,
    /// Why the latest fallback happened.
    last_decline: Option<String>,
}

// SAFETY: the handle is only used under the mutex, and cuDNN handles may move between threads.
unsafe impl Send for Cudnn {}
// SAFETY: as above.
unsafe impl Sync for Cudnn {}

impl std::fmt::Debug for Cudnn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cudnn")
            .field("version", &self.version)
            .field("tensor_cores", &self.tensor_cores)
            .finish()
    }
}

impl Cudnn {
    /// A handle, or why cuDNN cannot serve this backend (library missing or unusable, handle creation
    /// failed). The caller has bound the backend's context.
    pub(crate) fn new(tensor_cores: bool) -> std::result::Result<Cudnn, String> {
        let version = loader::cudnn()?;
        let _setup = crate::backends::device_setup();
        let handle = loader::guarded("creating the cuDNN handle", dnn::create_handle)?
            .map_err(|e| decline("cudnnCreate", e).0)?;
        Ok(Cudnn {
            state: Mutex::new(State {
                handle,
                plans: HashMap::new(),
                served: 0,
                declined: 0,
                last_decline: None,
            }),
            version,
            tensor_cores,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every step, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enqueues the convolution `d` (regions checked, output non-empty) on the current stream, or
    /// declines; a decline is counted and its reason kept for `device_info`. `only`: run that
    /// algorithm alone (an autotuner variant, [`CONV_VARIANTS`]), declining when cuDNN does not
    /// accept it for `d`; `None`: the accepted algorithms in the heuristic's order.
    pub(crate) fn conv2d(
        &self,
        gpu: &Gpu,
        mem: &mut DeviceMemory,
        d: &Conv2dDesc,
        only: Option<sys::cudnnConvolutionFwdAlgo_t>,
    ) -> Step<()> {
        let operands = Operands {
            x: d.input,
            w: d.weight,
            y: d.output,
            bias: d.bias,
        };
        let only = only.map(Algo::Forward);
        self.serve(gpu, mem, &Problem::forward(d), operands, only)
    }

    /// Enqueues the input gradient (or transposed convolution) `d` with
    /// `cudnnConvolutionBackwardData`, then its bias of the input's channels; or declines, as
    /// [`Cudnn::conv2d`].
    pub(crate) fn conv2d_backward_input(
        &self,
        gpu: &Gpu,
        mem: &mut DeviceMemory,
        d: &Conv2dBackwardInputDesc,
    ) -> Step<()> {
        let operands = Operands {
            x: d.grad_input,
            w: d.weight,
            y: d.grad_output,
            bias: d.bias,
        };
        self.serve(gpu, mem, &Problem::data(d), operands, None)
    }

    /// Enqueues the weight gradient `d` with `cudnnConvolutionBackwardFilter`, or declines, as
    /// [`Cudnn::conv2d`].
    pub(crate) fn conv2d_backward_weight(
        &self,
        gpu: &Gpu,
        mem: &mut DeviceMemory,
        d: &Conv2dBackwardWeightDesc,
    ) -> Step<()> {
        let operands = Operands {
            x: d.input,
            w: d.grad_weight,
            y: d.grad_output,
            bias: None,
        };
        self.serve(gpu, mem, &Problem::filter(d), operands, None)
    }

    /// One call of direction `p.direction`, counted as served or declined.
    fn serve(
        &self,
        gpu: &Gpu,
        mem: &mut DeviceMemory,
        p: &Problem,
        operands: Operands,
        only: Option<Algo>,
    ) -> Step<()> {
        let mut state = self.lock();
        let out = state.call(self.tensor_cores, gpu, mem, p, operands, only);
        match &out {
            Ok(()) => state.served += 1,
            Err(Declined(reason)) => {
                state.declined += 1;
                state.last_decline = Some(reason.clone());
            }
        }
        out
    }

    /// The `device_info` line: version and how many calls cuDNN served and declined.
    fn describe(&self) -> String {
        let state = self.lock();
        let mut text = format!(
            "cuDNN {}: served {}, fell back {}",
            self.version, state.served, state.declined
        );
        if let Some(reason) = &state.last_decline {
            text.push_str(&format!(
                " (latest fallback to the implicit-GEMM kernel: {reason})"
            ));
        }
        text
    }
}

impl Drop for Cudnn {
    fn drop(&mut self) {
        let handle = self
            .state
            .get_mut()
            .map(|s| s.handle)
            .unwrap_or_else(|e| e.into_inner().handle);
        // SAFETY: the handle is not used after this.
        let _ = unsafe { dnn::destroy_handle(handle) };
    }
}

/// The `device_info` value for conv2d: which path serves it and why. `cell` is the backend's lazily
/// created handle (empty until the first conv2d).
pub(crate) fn describe(
    enabled: bool,
    cell: &OnceLock<std::result::Result<Cudnn, String>>,
) -> String {
    if !enabled {
        return "implicit-GEMM kernel (enable_cudnn(false))".into();
    }
    match cell.get() {
        Some(Ok(cudnn)) => cudnn.describe(),
        Some(Err(reason)) => format!("implicit-GEMM kernel ({reason})"),
        None => match loader::cudnn() {
            Ok(version) => format!("cuDNN {version}; handle created by the first convolution"),
            Err(reason) => format!("implicit-GEMM kernel ({reason})"),
        },
    }
}

/// A cuDNN error status as a decline: `"what: CUDNN_STATUS_X (status N)"`.
fn decline(what: &str, e: dnn::CudnnError) -> Declined {
    // SAFETY: the symbol exists (checked by the probe); the result is a static string or null.
    let name = unsafe { sys::cudnnGetErrorString(e.0) };
    let name = if name.is_null() {
        "unknown status".into()
    } else {
        // SAFETY: a NUL-terminated string owned by cuDNN for the process's lifetime.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    Declined(format!("{what}: {name} (status {})", e.0 as u32))
}

/// Which of a convolution's three products a call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Direction {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx` from `dy` and `w` (also the transposed convolution).
    Data,
    /// `dw` from `x` and `dy`.
    Filter,
}

/// A convolution as cuDNN describes it, whichever product is computed: `x` `[N, C, H, W]`, `w`
/// `[K, C/groups, R, S]`, `y` `[N, K, OH, OW]` (the forward's output, or the gradient given). Also
/// what identifies an algorithm choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Problem {
    direction: Direction,
    dtype: DType,
    input: [usize; 4],
    weight: [usize; 4],
    output: [usize; 4],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
}

impl Problem {
    fn forward(d: &Conv2dDesc) -> Problem {
        Problem {
            direction: Direction::Forward,
            dtype: d.dtype,
            input: d.input_shape,
            weight: d.weight_shape,
            output: d.output_shape,
            stride: d.stride,
            padding: d.padding,
            dilation: d.dilation,
            groups: d.groups,
        }
    }

    fn data(d: &Conv2dBackwardInputDesc) -> Problem {
        Problem {
            direction: Direction::Data,
            dtype: d.dtype,
            input: d.grad_input_shape,
            weight: d.weight_shape,
            output: d.grad_output_shape,
            stride: d.stride,
            padding: d.padding,
            dilation: d.dilation,
            groups: d.groups,
        }
    }

    fn filter(d: &Conv2dBackwardWeightDesc) -> Problem {
        Problem {
            direction: Direction::Filter,
            dtype: d.dtype,
            input: d.input_shape,
            weight: d.weight_shape,
            output: d.grad_output_shape,
            stride: d.stride,
            padding: d.padding,
            dilation: d.dilation,
            groups: d.groups,
        }
    }
}

/// The device operands of one call, by their place in the forward: `x` the input (or its gradient,
/// written by [`Direction::Data`]), `w` the weight (or its gradient, written by
/// [`Direction::Filter`]), `y` the output (written by [`Direction::Forward`]) or its gradient, and a
/// bias added to the written tensor afterwards (`[K]` forward, `[C]` for the input gradient).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Operands {
    x: DevicePtr,
    w: DevicePtr,
    y: DevicePtr,
    bias: Option<DevicePtr>,
}

/// One cuDNN algorithm of a direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

/// The backward-data algorithms used: both sum the same products as the reference (FFT and Winograd
/// are never used, see the module notes).
const EXACT_DATA_ALGOS: [sys::cudnnConvolutionBwdDataAlgo_t; 2] = {
    use sys::cudnnConvolutionBwdDataAlgo_t::*;
    [
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
    ]
};

/// The backward-filter algorithms used, as [`EXACT_DATA_ALGOS`].
const EXACT_FILTER_ALGOS: [sys::cudnnConvolutionBwdFilterAlgo_t; 3] = {
    use sys::cudnnConvolutionBwdFilterAlgo_t::*;
    [
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
    ]
};

impl Algo {
    /// The algorithm numbered `raw` in `direction` if it is one this module uses.
    fn exact(direction: Direction, raw: u32) -> Option<Algo> {
        match direction {
            Direction::Forward => exact_algo(raw).map(Algo::Forward),
            Direction::Data => EXACT_DATA_ALGOS
                .into_iter()
                .find(|a| *a as u32 == raw)
                .map(Algo::Data),
            Direction::Filter => EXACT_FILTER_ALGOS
                .into_iter()
                .find(|a| *a as u32 == raw)
                .map(Algo::Filter),
        }
    }

    /// cuDNN's number for it.
    fn raw(self) -> u32 {
        match self {
            Algo::Forward(a) => a as u32,
            Algo::Data(a) => a as u32,
            Algo::Filter(a) => a as u32,
        }
    }
}

/// An acceptable algorithm with the math type it runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Candidate {
    algo: Algo,
    math: sys::cudnnMathType_t,
    /// Workspace bytes the heuristic reported.
    memory: usize,
}

/// The acceptable algorithms for one convolution, in the heuristic's order, and what cuDNN offered
/// (for the decline message when nothing is acceptable).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Plan {
    candidates: Vec<Candidate>,
    /// `"algo A math M status S deterministic D"` per offer.
    offered: String,
}

impl Plan {
    fn from_offers(
        offers: &[RawPerf],
        direction: Direction,
        dtype: DType,
        tensor_cores: bool,
    ) -> Plan {
        Plan {
            candidates: offers
                .iter()
                .filter_map(|p| candidate(p, direction, dtype, tensor_cores))
                .collect(),
            offered: offers
                .iter()
                .map(|p| {
                    format!(
                        "algo {} math {} status {} deterministic {}",
                        p.algo, p.math_type, p.status, p.determinism
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// `cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t` (one layout) with its enums as plain
/// integers: cuDNN writes these, and a value the bindings do not know must not become a Rust enum.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RawPerf {
    algo: u32,
    status: u32,
    time: f32,
    memory: usize,
    determinism: u32,
    math_type: u32,
    reserved: [c_int; 3],
}

const _: () = assert!(
    std::mem::size_of::<RawPerf>() == std::mem::size_of::<sys::cudnnConvolutionFwdAlgoPerf_t>()
        && std::mem::align_of::<RawPerf>()
            == std::mem::align_of::<sys::cudnnConvolutionFwdAlgoPerf_t>()
        && std::mem::size_of::<RawPerf>()
            == std::mem::size_of::<sys::cudnnConvolutionBwdDataAlgoPerf_t>()
        && std::mem::align_of::<RawPerf>()
            == std::mem::align_of::<sys::cudnnConvolutionBwdDataAlgoPerf_t>()
        && std::mem::size_of::<RawPerf>()
            == std::mem::size_of::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>()
        && std::mem::align_of::<RawPerf>()
            == std::mem::align_of::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>()
);

/// The algorithms used (the GEMM family and DIRECT; see the module notes), with the names of the
/// autotuner variants that run each alone.
const EXACT_ALGOS: [(&str, sys::cudnnConvolutionFwdAlgo_t); 4] = {
    use sys::cudnnConvolutionFwdAlgo_t::*;
    [
        (
            "cudnn_implicit_gemm",
            CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        ),
        (
            "cudnn_implicit_precomp_gemm",
            CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        ),
        ("cudnn_gemm", CUDNN_CONVOLUTION_FWD_ALGO_GEMM),
        ("cudnn_direct", CUDNN_CONVOLUTION_FWD_ALGO_DIRECT),
    ]
};

/// The conv2d variants of a backend with cuDNN, for the autotuner: `cudnn` (the default: the
/// accepted algorithms in the heuristic's order, else the implicit-GEMM kernel), each algorithm of
/// [`EXACT_ALGOS`] alone (a variant cuDNN does not accept for a shape fails, and the autotuner
/// passes it over), and `kernel`, the implicit-GEMM kernel alone.
pub(crate) const CONV_VARIANTS: [&str; 6] = [
    "cudnn",
    EXACT_ALGOS[0].0,
    EXACT_ALGOS[1].0,
    EXACT_ALGOS[2].0,
    EXACT_ALGOS[3].0,
    "kernel",
];

/// The algorithm a `cudnn_*` variant of [`CONV_VARIANTS`] runs alone.
pub(crate) fn variant_algo(variant: &str) -> Option<sys::cudnnConvolutionFwdAlgo_t> {
    EXACT_ALGOS
        .iter()
        .find(|(name, _)| *name == variant)
        .map(|(_, algo)| *algo)
}

/// The algorithm `raw` if it is one of the GEMM family or DIRECT (see the module notes).
fn exact_algo(raw: u32) -> Option<sys::cudnnConvolutionFwdAlgo_t> {
    EXACT_ALGOS
        .into_iter()
        .map(|(_, algo)| algo)
        .find(|a| *a as u32 == raw)
}

/// The math type `raw` if it keeps `dtype`'s precision (see the module notes).
fn acceptable_math(raw: u32, dtype: DType, tensor_cores: bool) -> Option<sys::cudnnMathType_t> {
    use sys::cudnnMathType_t::*;
    let math = [CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_FMA_MATH]
        .into_iter()
        .find(|m| *m as u32 == raw)?;
    match dtype {
        DType::F32 if !tensor_cores => (math == CUDNN_FMA_MATH).then_some(math),
        _ => Some(math),
    }
}

/// The usable candidate of one heuristic result of `direction`, if any.
fn candidate(
    p: &RawPerf,
    direction: Direction,
    dtype: DType,
    tensor_cores: bool,
) -> Option<Candidate> {
    let success = p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS as u32;
    let deterministic = p.determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC as u32;
    if !success || !deterministic {
        return None;
    }
    Some(Candidate {
        algo: Algo::exact(direction, p.algo)?,
        math: acceptable_math(p.math_type, dtype, tensor_cores)?,
        memory: p.memory,
    })
}

/// Data type, compute type and the math type asked for, per dtype (see the module notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Types {
    data: sys::cudnnDataType_t,
    compute: sys::cudnnDataType_t,
    math: sys::cudnnMathType_t,
}

impl Types {
    fn of(dtype: DType, tensor_cores: bool) -> Step<Types> {
        use sys::cudnnDataType_t::*;
        use sys::cudnnMathType_t::*;
        let (data, compute, math) = match dtype {
            DType::F32 if tensor_cores => (CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH),
            DType::F32 => (CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH),
            DType::F64 => (CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, CUDNN_DEFAULT_MATH),
            DType::F16 => (CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH),
            DType::BF16 => (CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH),
            other => return Err(Declined(format!("{other:?} is not a cuDNN float type"))),
        };
        Ok(Types {
            data,
            compute,
            math,
        })
    }
}

/// The scaling factors cuDNN reads from host memory: double for f64 data, float otherwise.
enum Scalars {
    F32([f32; 2]),
    F64([f64; 2]),
}

impl Scalars {
    /// `[1, 0]` in the precision `dtype` needs.
    fn for_dtype(dtype: DType) -> Scalars {
        match dtype {
            DType::F64 => Scalars::F64([1.0, 0.0]),
            _ => Scalars::F32([1.0, 0.0]),
        }
    }

    /// Pointer to 1.
    fn one(&self) -> *const c_void {
        match self {
            Scalars::F32(s) => (&s[0] as *const f32).cast(),
            Scalars::F64(s) => (&s[0] as *const f64).cast(),
        }
    }

    /// Pointer to 0.
    fn zero(&self) -> *const c_void {
        match self {
            Scalars::F32(s) => (&s[1] as *const f32).cast(),
            Scalars::F64(s) => (&s[1] as *const f64).cast(),
        }
    }
}

/// The descriptor's dims as cuDNN's `int`s, after the checks that keep the call inside what the legacy
/// API can describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dims {
    input: [c_int; 4],
    weight: [c_int; 4],
    output: [c_int; 4],
    padding: [c_int; 2],
    stride: [c_int; 2],
    dilation: [c_int; 2],
    groups: c_int,
}

/// `v` as an `int`, or a decline.
fn int(what: &str, v: usize) -> Step<c_int> {
    c_int::try_from(v).map_err(|_| Declined(format!("{what} = {v} exceeds cuDNN's 32-bit limit")))
}

/// The four dims of a tensor as `int`s; every dim non-zero and the element count within `int`, so
/// the packed strides fit too.
fn dims4(what: &str, shape: [usize; 4]) -> Step<[c_int; 4]> {
    if shape.contains(&0) {
        return Err(Declined(format!(
            "{what} {shape:?} has a zero dim, which cuDNN does not describe"
        )));
    }
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .unwrap_or(usize::MAX);
    int(&format!("{what} element count"), numel)?;
    Ok([
        int(what, shape[0])?,
        int(what, shape[1])?,
        int(what, shape[2])?,
        int(what, shape[3])?,
    ])
}

impl Dims {
    fn of(d: &Problem) -> Step<Dims> {
        let pair = |what: &str, v: [usize; 2]| -> Step<[c_int; 2]> {
            Ok([int(what, v[0])?, int(what, v[1])?])
        };
        Ok(Dims {
            input: dims4("input", d.input)?,
            weight: dims4("weight", d.weight)?,
            output: dims4("output", d.output)?,
            padding: pair("padding", d.padding)?,
            stride: pair("stride", d.stride)?,
            dilation: pair("dilation", d.dilation)?,
            groups: int("groups", d.groups)?,
        })
    }
}

/// Declines unless every operand is [`ALIGNMENT`]-aligned.
fn check_alignment(d: &Operands) -> Step<()> {
    let ptrs = [Some(d.x), Some(d.w), d.bias, Some(d.y)];
    if ptrs.iter().flatten().all(|p| p.0 % ALIGNMENT == 0) {
        Ok(())
    } else {
        Err(Declined(format!(
            "an operand is not {ALIGNMENT}-byte aligned"
        )))
    }
}

/// A tensor descriptor, destroyed on drop.
struct TensorDesc(sys::cudnnTensorDescriptor_t);

impl TensorDesc {
    /// A packed NCHW descriptor.
    fn nchw(data: sys::cudnnDataType_t, dims: [c_int; 4]) -> Step<TensorDesc> {
        let desc = TensorDesc(
            dnn::create_tensor_descriptor()
                .map_err(|e| decline("cudnnCreateTensorDescriptor", e))?,
        );
        // SAFETY: a live descriptor.
        unsafe {
            dnn::set_tensor4d_descriptor(
                desc.0,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                data,
                dims,
            )
        }
        .map_err(|e| decline("cudnnSetTensor4dDescriptor", e))?;
        Ok(desc)
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by `nchw`, destroyed once.
        let _ = unsafe { dnn::destroy_tensor_descriptor(self.0) };
    }
}

/// A filter descriptor, destroyed on drop.
struct FilterDesc(sys::cudnnFilterDescriptor_t);

impl FilterDesc {
    /// `[K, C/groups, R, S]`, NCHW (KCRS).
    fn kcrs(data: sys::cudnnDataType_t, dims: [c_int; 4]) -> Step<FilterDesc> {
        let desc = FilterDesc(
            dnn::create_filter_descriptor()
                .map_err(|e| decline("cudnnCreateFilterDescriptor", e))?,
        );
        // SAFETY: a live descriptor.
        unsafe {
            dnn::set_filter4d_descriptor(
                desc.0,
                data,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                dims,
            )
        }
        .map_err(|e| decline("cudnnSetFilter4dDescriptor", e))?;
        Ok(desc)
    }
}

impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created by `kcrs`, destroyed once.
        let _ = unsafe { dnn::destroy_filter_descriptor(self.0) };
    }
}

/// A convolution descriptor, destroyed on drop.
struct ConvDesc(sys::cudnnConvolutionDescriptor_t);

impl ConvDesc {
    /// Cross-correlation with the window of `dims`, its group count, the compute type and math type.
    fn new(dims: &Dims, types: &Types) -> Step<ConvDesc> {
        let desc = ConvDesc(
            dnn::create_convolution_descriptor()
                .map_err(|e| decline("cudnnCreateConvolutionDescriptor", e))?,
        );
        // SAFETY: a live descriptor; plain integer parameters.
        unsafe {
            dnn::set_convolution2d_descriptor(
                desc.0,
                dims.padding[0],
                dims.padding[1],
                dims.stride[0],
                dims.stride[1],
                dims.dilation[0],
                dims.dilation[1],
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                types.compute,
            )
        }
        .map_err(|e| decline("cudnnSetConvolution2dDescriptor", e))?;
        // SAFETY: as above.
        unsafe { dnn::set_convolution_group_count(desc.0, dims.groups) }
            .map_err(|e| decline("cudnnSetConvolutionGroupCount", e))?;
        desc.set_math(types.math)?;
        Ok(desc)
    }

    fn set_math(&self, math: sys::cudnnMathType_t) -> Step<()> {
        // SAFETY: a live descriptor.
        unsafe { dnn::set_convolution_math_type(self.0, math) }
            .map_err(|e| decline("cudnnSetConvolutionMathType", e))
    }

    /// Declines unless cuDNN computes the output shape the descriptor has (same window arithmetic).
    fn check_output(&self, x: &TensorDesc, w: &FilterDesc, expected: [c_int; 4]) -> Step<()> {
        let mut got: [c_int; 4] = [0; 4];
        let [n, c, h, wd] = &mut got;
        // SAFETY: live descriptors; four out-parameters.
        unsafe { sys::cudnnGetConvolution2dForwardOutputDim(self.0, x.0, w.0, n, c, h, wd) }
            .result()
            .map_err(|e| decline("cudnnGetConvolution2dForwardOutputDim", e))?;
        if got == expected {
            Ok(())
        } else {
            Err(Declined(format!(
                "cuDNN computes output {got:?}, the descriptor has {expected:?}"
            )))
        }
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { dnn::destroy_convolution_descriptor(self.0) };
    }
}

/// The descriptors of one call.
struct Descs {
    x: TensorDesc,
    w: FilterDesc,
    conv: ConvDesc,
    y: TensorDesc,
}

/// A workspace block from the backend's allocator, returned to it on drop (after the work using it
/// has been enqueued: stream order, and the allocator's fences for other streams, make reuse safe).
struct Workspace<'a> {
    gpu: &'a Gpu,
    mem: &'a mut DeviceMemory,
    ptr: Option<DevicePtr>,
}

impl<'a> Workspace<'a> {
    /// `bytes` of device memory (none for 0).
    fn alloc(gpu: &'a Gpu, mem: &'a mut DeviceMemory, bytes: usize) -> Step<Workspace<'a>> {
        let ptr = if bytes == 0 {
            None
        } else {
            Some(
                mem.alloc(bytes)
                    .map_err(|e| Declined(format!("no workspace of {bytes} bytes: {e}")))?,
            )
        };
        Ok(Workspace { gpu, mem, ptr })
    }

    fn as_ptr(&self) -> *mut c_void {
        self.ptr
            .map_or(std::ptr::null_mut(), |p| p.0 as *mut c_void)
    }
}

impl Drop for Workspace<'_> {
    fn drop(&mut self) {
        if let Some(ptr) = self.ptr.take() {
            // On failure (no fence could be recorded) the block stays live: leaked until the backend
            // is dropped, never reused while cuDNN may still use it.
            let _ = self.gpu.free_temp(self.mem, ptr);
        }
    }
}

impl State {
    /// The whole cuDNN path of one call.
    fn call(
        &mut self,
        tensor_cores: bool,
        gpu: &Gpu,
        mem: &mut DeviceMemory,
        p: &Problem,
        operands: Operands,
        only: Option<Algo>,
    ) -> Step<()> {
        let dims = Dims::of(p)?;
        check_alignment(&operands)?;
        let types = Types::of(p.dtype, tensor_cores)?;
        // SAFETY: a live handle and the live current stream of the bound context.
        unsafe { dnn::set_stream(self.handle, gpu.stream().cu_stream() as sys::cudaStream_t) }
            .map_err(|e| decline("cudnnSetStream", e))?;
        let descs = Descs {
            x: TensorDesc::nchw(types.data, dims.input)?,
            w: FilterDesc::kcrs(types.data, dims.weight)?,
            conv: ConvDesc::new(&dims, &types)?,
            y: TensorDesc::nchw(types.data, dims.output)?,
        };
        descs.conv.check_output(&descs.x, &descs.w, dims.output)?;
        let plan = self.plan(&descs, p, tensor_cores)?;
        let scalars = Scalars::for_dtype(p.dtype);
        let mut reason = Declined(format!(
            "no deterministic exact {:?} algorithm with an accepted math type for {:?} {:?} * {:?} \
             among cuDNN's offers [{}]",
            p.direction, p.dtype, p.input, p.weight, plan.offered
        ));
        if let Some(algo) = only {
            reason = Declined(format!(
                "cuDNN does not accept {:?} algorithm {} for {:?} {:?} * {:?} (offers [{}])",
                p.direction,
                algo.raw(),
                p.dtype,
                p.input,
                p.weight,
                plan.offered
            ));
        }
        let chosen = plan
            .candidates
            .into_iter()
            .filter(|c| only.is_none_or(|algo| c.algo == algo));
        for c in chosen {
            match self.product(&descs, c, &scalars, gpu, mem, &operands) {
                Ok(()) => return self.add_bias(&descs, &scalars, &types, &dims, p, &operands),
                Err(e) => reason = e,
            }
        }
        Err(reason)
    }

    /// The algorithm choice for `p`, from the cache or the heuristic of its direction.
    fn plan(&mut self, descs: &Descs, p: &Problem, tensor_cores: bool) -> Step<Plan> {
        if let Some(plan) = self.plans.get(p) {
            return Ok(plan.clone());
        }
        let mut perf = [RawPerf::default(); REQUESTED_ALGOS];
        let mut returned: c_int = 0;
        let requested = REQUESTED_ALGOS as c_int;
        // SAFETY: live handle and descriptors; `perf` has room for the requested count and the same
        // layout as each direction's `cudnnConvolution*AlgoPerf_t` (checked at compile time).
        let (what, status) = unsafe {
            match p.direction {
                Direction::Forward => (
                    "cudnnGetConvolutionForwardAlgorithm_v7",
                    sys::cudnnGetConvolutionForwardAlgorithm_v7(
                        self.handle,
                        descs.x.0,
                        descs.w.0,
                        descs.conv.0,
                        descs.y.0,
                        requested,
                        &mut returned,
                        perf.as_mut_ptr().cast(),
                    ),
                ),
                Direction::Data => (
                    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                    sys::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                        self.handle,
                        descs.w.0,
                        descs.y.0,
                        descs.conv.0,
                        descs.x.0,
                        requested,
                        &mut returned,
                        perf.as_mut_ptr().cast(),
                    ),
                ),
                Direction::Filter => (
                    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                    sys::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                        self.handle,
                        descs.x.0,
                        descs.y.0,
                        descs.conv.0,
                        descs.w.0,
                        requested,
                        &mut returned,
                        perf.as_mut_ptr().cast(),
                    ),
                ),
            }
        };
        status.result().map_err(|e| decline(what, e))?;
        let count = usize::try_from(returned).unwrap_or(0).min(REQUESTED_ALGOS);
        let plan = Plan::from_offers(&perf[..count], p.direction, p.dtype, tensor_cores);
        if self.plans.len() >= MAX_PLANS {
            self.plans.clear();
        }
        self.plans.insert(*p, plan.clone());
        Ok(plan)
    }

    /// The product of candidate `c` (forward, backward data or backward filter, by its algorithm):
    /// math type set, workspace sized and allocated, `beta = 0`. Declines (nothing enqueued, or a
    /// partial result the kernel will overwrite) on any failure.
    fn product(
        &self,
        descs: &Descs,
        c: Candidate,
        scalars: &Scalars,
        gpu: &Gpu,
        mem: &mut DeviceMemory,
        o: &Operands,
    ) -> Step<()> {
        descs.conv.set_math(c.math)?;
        let h = self.handle;
        let (x, w, conv, y) = (descs.x.0, descs.w.0, descs.conv.0, descs.y.0);
        let mut bytes = 0usize;
        // SAFETY: live handle and descriptors; `bytes` is an out-parameter.
        let (what, status) = unsafe {
            match c.algo {
                Algo::Forward(a) => (
                    "cudnnGetConvolutionForwardWorkspaceSize",
                    sys::cudnnGetConvolutionForwardWorkspaceSize(h, x, w, conv, y, a, &mut bytes),
                ),
                Algo::Data(a) => (
                    "cudnnGetConvolutionBackwardDataWorkspaceSize",
                    sys::cudnnGetConvolutionBackwardDataWorkspaceSize(
                        h, w, y, conv, x, a, &mut bytes,
                    ),
                ),
                Algo::Filter(a) => (
                    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                    sys::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                        h, x, y, conv, w, a, &mut bytes,
                    ),
                ),
            }
        };
        status.result().map_err(|e| decline(what, e))?;
        let bytes = bytes.max(c.memory);
        let workspace = Workspace::alloc(gpu, mem, bytes)?;
        let ws = workspace.as_ptr();
        let (one, zero) = (scalars.one(), scalars.zero());
        let (xp, wp, yp) = (
            o.x.0 as *mut c_void,
            o.w.0 as *mut c_void,
            o.y.0 as *mut c_void,
        );
        // SAFETY: the regions were checked against live allocations (and for aliasing) by the
        // caller and match the descriptors (packed NCHW / KCRS of the descriptor's shapes); the
        // workspace holds `bytes`; the scalars are host values read during the call; beta = 0, so
        // the written tensor is not read.
        let (what, status) = unsafe {
            match c.algo {
                Algo::Forward(a) => (
                    "cudnnConvolutionForward",
                    sys::cudnnConvolutionForward(
                        h, one, x, xp, w, wp, conv, a, ws, bytes, zero, y, yp,
                    ),
                ),
                Algo::Data(a) => (
                    "cudnnConvolutionBackwardData",
                    sys::cudnnConvolutionBackwardData(
                        h, one, w, wp, y, yp, conv, a, ws, bytes, zero, x, xp,
                    ),
                ),
                Algo::Filter(a) => (
                    "cudnnConvolutionBackwardFilter",
                    sys::cudnnConvolutionBackwardFilter(
                        h, one, x, xp, y, yp, conv, a, ws, bytes, zero, w, wp,
                    ),
                ),
            }
        };
        status.result().map_err(|e| decline(what, e))
    }

    /// `written += bias` over a `1×K×1×1` (forward) or `1×C×1×1` (input gradient) bias tensor,
    /// when there is a bias.
    fn add_bias(
        &self,
        descs: &Descs,
        scalars: &Scalars,
        types: &Types,
        dims: &Dims,
        p: &Problem,
        o: &Operands,
    ) -> Step<()> {
        let Some(bias) = o.bias else {
            return Ok(());
        };
        let (channels, target, ptr) = match p.direction {
            Direction::Forward => (dims.output[1], &descs.y, o.y),
            Direction::Data => (dims.input[1], &descs.x, o.x),
            Direction::Filter => return Err(Declined("a weight gradient has no bias".into())),
        };
        let b = TensorDesc::nchw(types.data, [1, channels, 1, 1])?;
        // SAFETY: the bias region (one element per channel) and the written tensor were checked by
        // the caller; alpha = beta = 1 are host values read during the call.
        unsafe {
            sys::cudnnAddTensor(
                self.handle,
                scalars.one(),
                b.0,
                bias.0 as *const c_void,
                scalars.one(),
                target.0,
                ptr.0 as *mut c_void,
            )
        }
        .result()
        .map_err(|e| decline("cudnnAddTensor", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(bias: bool) -> Conv2dDesc {
        let (input, weight) = ([2, 4, 9, 7], [6, 2, 3, 2]);
        let output =
            Conv2dDesc::expected_output_shape(input, weight, [2, 1], [1, 1], [2, 1], 2).unwrap();
        Conv2dDesc {
            dtype: DType::F32,
            input: DevicePtr(0x1000),
            input_shape: input,
            weight: DevicePtr(0x2000),
            weight_shape: weight,
            bias: bias.then_some(DevicePtr(0x3000)),
            output: DevicePtr(0x4000),
            output_shape: output,
            stride: [2, 1],
            padding: [1, 1],
            dilation: [2, 1],
            groups: 2,
        }
    }

    /// A forward heuristic result's candidate.
    fn forward_candidate(p: &RawPerf, dtype: DType, tensor_cores: bool) -> Option<Candidate> {
        candidate(p, Direction::Forward, dtype, tensor_cores)
    }

    /// The operands of a forward descriptor.
    fn operands(d: &Conv2dDesc) -> Operands {
        Operands {
            x: d.input,
            w: d.weight,
            y: d.output,
            bias: d.bias,
        }
    }

    #[test]
    fn dims_carry_the_window_and_groups() {
        let dims = Dims::of(&Problem::forward(&desc(true))).unwrap();
        assert_eq!(
            dims,
            Dims {
                input: [2, 4, 9, 7],
                weight: [6, 2, 3, 2],
                output: [2, 6, 4, 8],
                padding: [1, 1],
                stride: [2, 1],
                dilation: [2, 1],
                groups: 2,
            }
        );
    }

    #[test]
    fn every_algorithm_variant_names_one_exact_algorithm() {
        let mut names = CONV_VARIANTS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CONV_VARIANTS.len(), "{CONV_VARIANTS:?}");
        assert_eq!(
            CONV_VARIANTS[0], "cudnn",
            "the default runs the heuristic's order"
        );
        for name in CONV_VARIANTS {
            match variant_algo(name) {
                Some(algo) => assert_eq!(exact_algo(algo as u32), Some(algo), "{name}"),
                None => assert!(name == "cudnn" || name == "kernel", "{name}"),
            }
        }
        use sys::cudnnConvolutionFwdAlgo_t::*;
        for excluded in [
            CUDNN_CONVOLUTION_FWD_ALGO_FFT,
            CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        ] {
            assert_eq!(exact_algo(excluded as u32), None);
        }
    }

    #[test]
    fn shapes_cudnn_cannot_describe_are_declined() {
        let mut d = desc(false);
        d.input_shape = [1, 0, 9, 7];
        assert!(Dims::of(&Problem::forward(&d)).is_err());
        let mut d = desc(false);
        d.input_shape = [1 << 16, 1 << 8, 1 << 4, 1 << 4];
        assert!(Dims::of(&Problem::forward(&d)).is_err(), "2^32 elements");
        let mut d = desc(false);
        d.padding = [1 << 31, 0];
        assert!(Dims::of(&Problem::forward(&d)).is_err());
    }

    #[test]
    fn misaligned_operands_are_declined() {
        assert!(check_alignment(&operands(&desc(true))).is_ok());
        let mut d = desc(true);
        d.bias = Some(DevicePtr(0x3004));
        assert!(check_alignment(&operands(&d)).is_err());
        let mut d = desc(false);
        d.output = DevicePtr(0x4008);
        assert!(check_alignment(&operands(&d)).is_err());
    }

    #[test]
    fn types_follow_cudnn_supported_configurations() {
        use sys::cudnnDataType_t::*;
        use sys::cudnnMathType_t::*;
        let t = |d, tc| Types::of(d, tc).map(|t| (t.data, t.compute, t.math));
        assert_eq!(
            t(DType::F32, false),
            Ok((CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH))
        );
        assert_eq!(
            t(DType::F32, true),
            Ok((CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH))
        );
        assert_eq!(
            t(DType::F64, false),
            Ok((CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, CUDNN_DEFAULT_MATH))
        );
        assert_eq!(
            t(DType::F16, false),
            Ok((CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH))
        );
        assert_eq!(
            t(DType::BF16, false),
            Ok((CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH))
        );
        assert!(Types::of(DType::I32, false).is_err());
    }

    #[test]
    fn only_exact_algorithms_and_math_types_are_candidates() {
        use sys::cudnnConvolutionFwdAlgo_t::*;
        use sys::cudnnMathType_t::*;
        let perf = |algo: sys::cudnnConvolutionFwdAlgo_t, math: sys::cudnnMathType_t| RawPerf {
            algo: algo as u32,
            status: 0,
            time: 0.1,
            memory: 4096,
            determinism: 1,
            math_type: math as u32,
            reserved: [0; 3],
        };
        let c = forward_candidate(
            &perf(
                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                CUDNN_FMA_MATH,
            ),
            DType::F32,
            false,
        );
        assert_eq!(
            c,
            Some(Candidate {
                algo: Algo::Forward(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM),
                math: CUDNN_FMA_MATH,
                memory: 4096,
            })
        );
        for algo in [
            CUDNN_CONVOLUTION_FWD_ALGO_FFT,
            CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
            CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
            CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
        ] {
            assert_eq!(
                forward_candidate(&perf(algo, CUDNN_FMA_MATH), DType::F32, false),
                None
            );
        }
        // Strict f32 takes FMA math only; TF32 opens the others; conversion to f16 never.
        let gemm = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
        assert_eq!(
            forward_candidate(&perf(gemm, CUDNN_DEFAULT_MATH), DType::F32, false),
            None
        );
        assert_eq!(
            forward_candidate(&perf(gemm, CUDNN_TENSOR_OP_MATH), DType::F32, false),
            None
        );
        assert!(forward_candidate(&perf(gemm, CUDNN_TENSOR_OP_MATH), DType::F32, true).is_some());
        assert!(forward_candidate(&perf(gemm, CUDNN_TENSOR_OP_MATH), DType::F16, false).is_some());
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let p = perf(gemm, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
            assert_eq!(forward_candidate(&p, dtype, true), None);
        }
        // Failed, non-deterministic and unknown results are skipped.
        let mut p = perf(gemm, CUDNN_FMA_MATH);
        p.status = sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED as u32;
        assert_eq!(forward_candidate(&p, DType::F32, false), None);
        let mut p = perf(gemm, CUDNN_FMA_MATH);
        p.determinism = 0;
        assert_eq!(forward_candidate(&p, DType::F32, false), None);
        let mut p = perf(gemm, CUDNN_FMA_MATH);
        p.algo = 99;
        assert_eq!(forward_candidate(&p, DType::F32, false), None);
        let mut p = perf(gemm, CUDNN_FMA_MATH);
        p.math_type = 7;
        assert_eq!(forward_candidate(&p, DType::F32, false), None);
    }

    #[test]
    fn a_plan_keeps_the_heuristic_order_and_lists_every_offer() {
        use sys::cudnnConvolutionFwdAlgo_t::*;
        use sys::cudnnMathType_t::*;
        let offer = |algo: sys::cudnnConvolutionFwdAlgo_t, memory| RawPerf {
            algo: algo as u32,
            status: 0,
            time: 0.0,
            memory,
            determinism: 1,
            math_type: CUDNN_FMA_MATH as u32,
            reserved: [0; 3],
        };
        let offers = [
            offer(CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, 1),
            offer(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 2),
            offer(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, 0),
        ];
        let plan = Plan::from_offers(&offers, Direction::Forward, DType::F32, false);
        let algos: Vec<_> = plan.candidates.iter().map(|c| (c.algo, c.memory)).collect();
        assert_eq!(
            algos,
            [
                (
                    Algo::Forward(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM),
                    2
                ),
                (Algo::Forward(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM), 0)
            ]
        );
        assert_eq!(
            plan.offered,
            "algo 7 math 3 status 0 deterministic 1, algo 1 math 3 status 0 deterministic 1, \
             algo 0 math 3 status 0 deterministic 1"
        );
        assert!(
            Plan::from_offers(&[], Direction::Forward, DType::F32, false)
                .candidates
                .is_empty()
        );
    }

    #[test]
    fn gradients_take_only_their_exact_deterministic_algorithms() {
        use sys::cudnnConvolutionBwdDataAlgo_t as D;
        use sys::cudnnConvolutionBwdFilterAlgo_t as F;
        let perf = |algo: u32, determinism: u32| RawPerf {
            algo,
            status: 0,
            time: 0.0,
            memory: 64,
            determinism,
            math_type: sys::cudnnMathType_t::CUDNN_FMA_MATH as u32,
            reserved: [0; 3],
        };
        let take = |direction, algo, det| {
            candidate(&perf(algo, det), direction, DType::F32, false).map(|c| c.algo)
        };
        for algo in EXACT_DATA_ALGOS {
            assert_eq!(
                take(Direction::Data, algo as u32, 1),
                Some(Algo::Data(algo))
            );
            assert_eq!(take(Direction::Data, algo as u32, 0), None, "{algo:?}");
        }
        for algo in EXACT_FILTER_ALGOS {
            assert_eq!(
                take(Direction::Filter, algo as u32, 1),
                Some(Algo::Filter(algo))
            );
        }
        for algo in [
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
        ] {
            assert_eq!(take(Direction::Data, algo as u32, 1), None, "{algo:?}");
        }
        for algo in [
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        ] {
            assert_eq!(take(Direction::Filter, algo as u32, 1), None, "{algo:?}");
        }
        // The same number means a different algorithm per direction: forward 2 is GEMM (exact),
        // backward-data 2 is FFT (not used).
        assert!(take(Direction::Forward, 2, 1).is_some());
        assert_eq!(take(Direction::Data, 2, 1), None);
        assert_eq!(
            Algo::Filter(F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3).raw(),
            3
        );
    }

    #[test]
    fn each_gradient_describes_the_forward_convolution() {
        let f = desc(true);
        let data = Conv2dBackwardInputDesc {
            dtype: f.dtype,
            grad_output: f.output,
            grad_output_shape: f.output_shape,
            weight: f.weight,
            weight_shape: f.weight_shape,
            bias: Some(DevicePtr(0x5000)),
            grad_input: f.input,
            grad_input_shape: f.input_shape,
            stride: f.stride,
            padding: f.padding,
            dilation: f.dilation,
            groups: f.groups,
        };
        let filter = Conv2dBackwardWeightDesc {
            dtype: f.dtype,
            input: f.input,
            input_shape: f.input_shape,
            grad_output: f.output,
            grad_output_shape: f.output_shape,
            grad_weight: f.weight,
            weight_shape: f.weight_shape,
            stride: f.stride,
            padding: f.padding,
            dilation: f.dilation,
            groups: f.groups,
        };
        let forward = Problem::forward(&f);
        for (p, direction) in [
            (Problem::data(&data), Direction::Data),
            (Problem::filter(&filter), Direction::Filter),
        ] {
            assert_eq!(p.direction, direction);
            assert_eq!(
                Problem {
                    direction: Direction::Forward,
                    ..p
                },
                forward
            );
            assert_ne!(p, forward, "plans are cached per direction");
            assert_eq!(Dims::of(&p), Dims::of(&forward));
        }
    }

    #[test]
    fn scalars_match_the_data_type() {
        let s = Scalars::for_dtype(DType::F64);
        // SAFETY: the pointers point into `s`, which is alive.
        unsafe {
            assert_eq!(*s.one().cast::<f64>(), 1.0);
            assert_eq!(*s.zero().cast::<f64>(), 0.0);
        }
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let s = Scalars::for_dtype(dtype);
            // SAFETY: as above.
            unsafe {
                assert_eq!(*s.one().cast::<f32>(), 1.0);
                assert_eq!(*s.zero().cast::<f32>(), 0.0);
            }
        }
    }

    #[test]
    fn without_cudnn_the_path_says_why() {
        let cell = OnceLock::new();
        assert_eq!(
            describe(false, &cell),
            "implicit-GEMM kernel (enable_cudnn(false))"
        );
        let text = describe(true, &cell);
        match loader::cudnn() {
            Ok(version) => assert!(text.starts_with("cuDNN 9.") && text.contains(version)),
            Err(reason) => {
                assert!(reason.contains("cuDNN"), "{reason}");
                assert_eq!(text, format!("implicit-GEMM kernel ({reason})"));
            }
        }
        let failed: OnceLock<std::result::Result<Cudnn, String>> = OnceLock::new();
        let _ = failed.set(Err("cudnnCreate failed: X".into()));
        assert_eq!(
            describe(true, &failed),
            "implicit-GEMM kernel (cudnnCreate failed: X)"
        );
    }
}
