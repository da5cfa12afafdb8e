//! Tensor-level ops: validation, broadcasting, layout handling and output allocation, then one call
//! to the backend's [`crate::ComputeBackend`]. One file per op family; each defines the ops as methods
//! on [`Backend`] and the same ops as [`crate::Tensor`] methods.

pub mod attention;
pub mod conv;
pub mod create;
pub mod elementwise;
pub mod index;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod optim;
pub mod pool;
pub mod reduce;
pub mod scan;
pub mod select;
pub mod shape;
pub mod sort;

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::tensor::Tensor;

impl Backend {
    /// `DeviceMismatch` unless `t` lives on this backend instance. While this thread captures a
    /// graph, an operand made before the capture becomes one of its inputs here, in the order the
    /// ops name their operands (before any internal view of it is taken).
    pub(crate) fn check_owner(&self, op: &'static str, t: &Tensor) -> Result<()> {
        if t.backend().same_instance(self) {
            self.graph_tap().note_used(t);
            Ok(())
        } else {
            Err(BackendError::DeviceMismatch {
                op,
                details: format!(
                    "a tensor on {} was passed to an op on {} (another backend instance); move it with tensor.to(&backend)",
                    t.device(),
                    self.backend_type()
                ),
            })
        }
    }

    /// `DeviceMismatch` unless every tensor lives here; `DTypeMismatch` unless they share the first one's
    /// dtype, which is returned.
    pub(crate) fn check_operands(&self, op: &'static str, ts: &[&Tensor]) -> Result<DType> {
        let dtype = ts.first().map_or(DType::F32, |t| t.dtype());
        for t in ts {
            self.check_owner(op, t)?;
            if t.dtype() != dtype {
                return Err(BackendError::DTypeMismatch {
                    op,
                    expected: dtype,
                    got: t.dtype(),
                });
            }
        }
        Ok(dtype)
    }
}

/// `ShapeMismatch` unless `t` has rank `rank`.
pub(crate) fn expect_rank(op: &'static str, name: &str, t: &Tensor, rank: usize) -> Result<()> {
    if t.rank() == rank {
        Ok(())
    } else {
        Err(BackendError::shape(
            op,
            format!("{name} must have rank {rank}, got shape {:?}", t.shape()),
        ))
    }
}

/// `ShapeMismatch` unless `t` has exactly `shape`.
pub(crate) fn expect_shape(
    op: &'static str,
    name: &str,
    t: &Tensor,
    shape: &[usize],
) -> Result<()> {
    if t.shape() == shape {
        Ok(())
    } else {
        Err(BackendError::shape(
            op,
            format!("{name} must have shape {shape:?}, got {:?}", t.shape()),
        ))
    }
}

/// Product of `dims`, for shapes already checked to fit.
pub(crate) fn product(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Runs `f` with a dense tensor standing for `t`; when `t` is a strided view, a dense copy is passed
/// and written back afterwards. This is how in-place state reaches kernels that need dense operands.
pub(crate) fn with_dense_inplace<R>(t: &Tensor, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
    if t.is_contiguous() {
        return f(t);
    }
    let dense = t.contiguous()?;
    let r = f(&dense)?;
    t.copy_from(&dense)?;
    Ok(r)
}
