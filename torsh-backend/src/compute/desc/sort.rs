//! Sort descriptors: each line along one dim put in order, with the permutation.

use super::index::check_dim;
use super::{dense_bytes, StridedBuf};
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// PyTorch's `sort(stable=True)`: each line along `dim` of the input put in ascending order (or
/// descending), of which the first `k` are written as dense `values` (the input's dtype) and dense
/// `indices` (`I64`: where along the dim each value was in the input), both of the input's shape
/// with `dim` cut to `k` (`k` = the dim's length for a full sort; less for `topk`, which backends may
/// answer with a selection instead of a full sort); either output may be left out (`argsort` writes
/// only the indices). The order is total, as PyTorch's: NaN after every
/// number (first when descending), `-0` equal to `+0`, and equal elements keep their input order in
/// both directions (stable), so every backend writes the same permutation. Any dtype; the input
/// may be any strided view; the outputs must not overlap each other or the input. Errors:
/// `InvalidArgument` for `dim >= rank`, `k` past the dim's length, or no output at all.
#[derive(Clone, Debug, PartialEq)]
pub struct SortDesc {
    /// Element type of the input and of `values`.
    pub dtype: DType,
    /// Input view.
    pub input: StridedBuf,
    /// The dim sorted along.
    pub dim: usize,
    /// Largest first.
    pub descending: bool,
    /// Sorted elements written per line (at most the dim's length).
    pub k: usize,
    /// The sorted values (dense, the input's shape), if wanted.
    pub values: Option<DevicePtr>,
    /// The `I64` positions of the sorted values (dense, the input's shape), if wanted.
    pub indices: Option<DevicePtr>,
}

impl SortDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "sort";
        let shape = self.input.layout.shape();
        check_dim(op, self.dim, shape.len())?;
        if self.values.is_none() && self.indices.is_none() {
            return Err(BackendError::invalid(
                op,
                "neither values nor indices were asked for",
            ));
        }
        if self.k > shape[self.dim] {
            return Err(BackendError::invalid(
                op,
                format!(
                    "k = {} is past the length {} of dim {} of shape {shape:?}",
                    self.k, shape[self.dim], self.dim
                ),
            ));
        }
        let out = self.output_shape();
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        self.input
            .add_region(&mut acc, "input", self.dtype, Access::Read)?;
        if let Some(p) = self.values {
            let bytes = dense_bytes(op, &out, self.dtype)?;
            acc.push("values", p, bytes, Access::Write, true);
        }
        if let Some(p) = self.indices {
            let bytes = dense_bytes(op, &out, DType::I64)?;
            acc.push("indices", p, bytes, Access::Write, true);
        }
        Ok(acc)
    }

    /// The shape of both outputs: the input's with `dim` cut to `k`.
    pub fn output_shape(&self) -> Vec<usize> {
        let mut shape = self.input.layout.shape().to_vec();
        shape[self.dim] = self.k;
        shape
    }

    /// The lengths before, along and after the dim: `(outer, len, inner)`.
    pub fn geometry(&self) -> (usize, usize, usize) {
        let shape = self.input.layout.shape();
        let outer = shape[..self.dim].iter().product();
        let inner = shape[self.dim + 1..].iter().product();
        (outer, shape[self.dim], inner)
    }
}

crate::compute::op::op_desc!(SortDesc => sort, dtype: dtype, {
    strided "input": input,
    optional "values": values,
    optional "indices": indices as |_: &SortDesc| DType::I64,
});
