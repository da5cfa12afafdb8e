//! Indexing descriptors: gathering and scattering elements by integer index tensors.
//!
//! Index tensors hold `I32` or `I64` values; any other dtype is `DTypeMismatch`. An index outside
//! `0..size` of the dim it indexes is [`BackendError::IndexOutOfRange`], naming the op, the value and
//! the size. Backends whose ops complete before they return (the reference and the CPU) check every
//! index of a scatter before writing anything; after a gather's error its output's contents are
//! unspecified (the CPU checks each output row's indices as it gathers the row). A backend that
//! runs ops asynchronously skips the bad elements,
//! touching no memory outside the operands, and reports the error no later than the next
//! `synchronize` or host read.

use super::{dense_bytes, StridedBuf};
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// `DTypeMismatch` (expecting `I64`) unless `dtype` is an index dtype, `I32` or `I64`.
pub fn check_index_dtype(op: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::I32 | DType::I64 => Ok(()),
        got => Err(BackendError::DTypeMismatch {
            op,
            expected: DType::I64,
            got,
        }),
    }
}

/// The ops whose GPU kernels check indices on the device and raise the backend's error flag, by
/// the code each kernel records; the flag is reported as `IndexOutOfRange` naming the op.
pub(crate) const FLAG_OPS: [&str; 5] = [
    "gather",
    "scatter",
    "max_pool2d_backward",
    "cross_entropy",
    "cross_entropy_backward",
];

/// `InvalidArgument` unless `dim < rank`.
pub(crate) fn check_dim(op: &'static str, dim: usize, rank: usize) -> Result<()> {
    if dim < rank {
        Ok(())
    } else {
        Err(BackendError::invalid(
            op,
            format!("dim {dim} is out of range for rank {rank}"),
        ))
    }
}

/// `IndexOutOfRange` unless `0 <= index < size`.
pub fn check_index(op: &'static str, index: i64, size: usize) -> Result<()> {
    if index >= 0 && (index as u64) < size as u64 {
        Ok(())
    } else {
        Err(BackendError::IndexOutOfRange { op, index, size })
    }
}

/// PyTorch's `gather`: `output[i] = input[i with its coordinate along dim replaced by index[i]]`.
///
/// `input` and `index` have the same rank (at least 1); along every dim but `dim` the index is no
/// longer than the input. The output is contiguous with the index's shape and any dtype the input
/// has (gather moves elements, so integer tensors gather too). Strided and broadcast (stride-0)
/// views are allowed for both operands: `index_select` and `embedding` are gathers whose index
/// repeats along the other dims. Errors: `DTypeMismatch` for an index dtype other than `I32`/`I64`,
/// `InvalidArgument` for `dim >= rank`, `ShapeMismatch` for ranks or lengths that do not fit,
/// `IndexOutOfRange` (see the module) for an index outside `0..input.shape[dim]`.
#[derive(Clone, Debug, PartialEq)]
pub struct GatherDesc {
    /// Element type of input and output.
    pub dtype: DType,
    /// Element type of the index, `I32` or `I64`.
    pub index_dtype: DType,
    /// The tensor gathered from.
    pub input: StridedBuf,
    /// The dim the index selects along.
    pub dim: usize,
    /// The indices, with the output's shape.
    pub index: StridedBuf,
    /// Output pointer (contiguous, the index's shape).
    pub output: DevicePtr,
}

impl GatherDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "gather";
        check_index_dtype(op, self.index_dtype)?;
        let (input, index) = (self.input.layout.shape(), self.index.layout.shape());
        if input.len() != index.len() {
            return Err(BackendError::shape(
                op,
                format!("input {input:?} and index {index:?} must have the same rank"),
            ));
        }
        check_dim(op, self.dim, input.len())?;
        if let Some(d) = (0..input.len()).find(|&d| d != self.dim && index[d] > input[d]) {
            return Err(BackendError::shape(
                op,
                format!(
                    "index {index:?} is longer than input {input:?} along dim {d} (only dim {} may differ freely)",
                    self.dim
                ),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        self.input
            .add_region(&mut acc, "input", self.dtype, Access::Read)?;
        self.index
            .add_region(&mut acc, "index", self.index_dtype, Access::Read)?;
        let bytes = dense_bytes(op, index, self.dtype)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// How [`ScatterDesc`] combines a source element with the output element it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterReduce {
    /// The source element replaces it (any dtype). Where several land on one element, the last in
    /// the index's row-major order wins, on every backend.
    Assign,
    /// `alpha ·` the source element is added to it (float dtypes). Where several land on one
    /// element, they are summed in the index's row-major order, on every backend (the reference in
    /// f64, rounding once; the others in their kernels' accumulation type), so results are
    /// deterministic.
    Add,
}

/// PyTorch's `scatter` / `scatter_add`, in place on a dense output: for every position `i` of the
/// index, `output[i with its coordinate along dim replaced by index[i]]` receives `src[i]` (see
/// [`ScatterReduce`]). `index` and `src` have the same shape and the output's rank; along every dim
/// but `dim` the index is no longer than the output. Elements of the output no index names are left
/// as they are. `src` may be strided or broadcast (stride 0: one value scattered everywhere, as
/// `one_hot` does). Errors as [`GatherDesc`], with `IndexOutOfRange` for an index outside
/// `0..output_shape[dim]`; `Unsupported` for `Add` on a non-float dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct ScatterDesc {
    /// Element type of output and source.
    pub dtype: DType,
    /// Element type of the index, `I32` or `I64`.
    pub index_dtype: DType,
    /// Assign or add.
    pub reduce: ScatterReduce,
    /// The dense output, read and written in place.
    pub output: DevicePtr,
    /// The output's shape.
    pub output_shape: Vec<usize>,
    /// The dim the index selects along.
    pub dim: usize,
    /// The indices.
    pub index: StridedBuf,
    /// The values scattered, with the index's shape.
    pub src: StridedBuf,
    /// The scale of the source for `Add` (`index_add`'s alpha); ignored by `Assign`.
    pub alpha: f64,
}

impl ScatterDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "scatter";
        check_index_dtype(op, self.index_dtype)?;
        let (out, index) = (&self.output_shape[..], self.index.layout.shape());
        if self.src.layout.shape() != index {
            return Err(BackendError::shape(
                op,
                format!(
                    "src {:?} must have the index's shape {index:?}",
                    self.src.layout.shape()
                ),
            ));
        }
        if out.len() != index.len() {
            return Err(BackendError::shape(
                op,
                format!("output {out:?} and index {index:?} must have the same rank"),
            ));
        }
        check_dim(op, self.dim, out.len())?;
        if let Some(d) = (0..out.len()).find(|&d| d != self.dim && index[d] > out[d]) {
            return Err(BackendError::shape(
                op,
                format!(
                    "index {index:?} is longer than output {out:?} along dim {d} (only dim {} may differ freely)",
                    self.dim
                ),
            ));
        }
        if !self.alpha.is_finite() {
            return Err(BackendError::invalid(
                op,
                format!("alpha must be finite, got {}", self.alpha),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        self.index
            .add_region(&mut acc, "index", self.index_dtype, Access::Read)?;
        self.src
            .add_region(&mut acc, "src", self.dtype, Access::Read)?;
        let bytes = dense_bytes(op, out, self.dtype)?;
        acc.push("output", self.output, bytes, Access::ReadWrite, true);
        Ok(acc)
    }
}

crate::compute::op::op_desc!(ScatterDesc => scatter, dtype: dtype, {
    strided "index": index as |d: &ScatterDesc| d.index_dtype,
    strided "src": src,
    dense "output": output,
});

crate::compute::op::op_desc!(GatherDesc => gather, dtype: dtype, {
    strided "input": input,
    strided "index": index as |d: &GatherDesc| d.index_dtype,
    dense "output": output,
});
