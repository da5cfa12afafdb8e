//! Indexing descriptors: gathering elements by integer index tensors.
//!
//! Index tensors hold `I32` or `I64` values; any other dtype is `DTypeMismatch`. An index outside
//! `0..size` of the dim it indexes is [`BackendError::IndexOutOfRange`], naming the op, the value and
//! the size. Backends whose ops complete before they return (the reference and the CPU) check every
//! index before writing anything. A backend that runs ops asynchronously skips the bad elements,
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

crate::compute::op::op_desc!(GatherDesc => gather, dtype: dtype, {
    strided "input": input,
    strided "index": index as |d: &GatherDesc| d.index_dtype,
    dense "output": output,
});
