//! The fused cross-entropy descriptor.

use super::check_index_dtype;
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// Cross-entropy of `[rows, classes]` logits against `[rows]` class indices, one pass over each
/// row (PyTorch's `cross_entropy` with `label_smoothing` ε): the row's target distribution is
/// `q = (1 − ε) · onehot(target) + ε / classes`.
///
/// - **Forward** (`grad` is `None`): `output[i] = lse_i − (1 − ε) · x_i,t − ε · mean_c x_i,c`,
///   `lse_i` the row's log-sum-exp (each term skipped when its factor is 0), `[rows]` values.
/// - **Backward** (`grad` is the `[rows]` per-sample gradient): `output[i, c] = grad[i] ·
///   (softmax(x_i)_c − q_c)`, `[rows, classes]` values.
///
/// A row whose target equals `ignore_index` gives a loss of 0 and a zero gradient. Any other target
/// outside `0..classes` is `IndexOutOfRange` (on GPUs raised by the kernel and returned at the next
/// synchronize or host read, its row left unwritten). Float dtypes; the target is `I32` or `I64`.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossEntropyDesc {
    /// Element type of the logits, `grad` and the output.
    pub dtype: DType,
    /// `I32` or `I64`.
    pub index_dtype: DType,
    /// `[rows, classes]` logits (dense).
    pub logits: DevicePtr,
    /// `[rows]` class indices (dense).
    pub target: DevicePtr,
    /// `[rows]` per-sample gradients for the backward; `None` for the forward.
    pub grad: Option<DevicePtr>,
    /// `[rows]` losses (forward) or the `[rows, classes]` logits' gradient (backward); overlaps no
    /// operand.
    pub output: DevicePtr,
    /// Samples.
    pub rows: usize,
    /// Classes.
    pub classes: usize,
    /// The target value that marks a sample to ignore, if any.
    pub ignore_index: Option<i64>,
    /// ε in `[0, 1]`.
    pub label_smoothing: f64,
}

impl CrossEntropyDesc {
    /// The op's name: `cross_entropy` or `cross_entropy_backward`.
    pub fn name(&self) -> &'static str {
        if self.grad.is_some() {
            "cross_entropy_backward"
        } else {
            "cross_entropy"
        }
    }

    /// The target a row counts with: `None` for an ignored row, else the target when it lies in
    /// `0..classes`; `IndexOutOfRange` otherwise.
    pub fn class_of(&self, target: i64) -> Result<Option<usize>> {
        if self.ignore_index == Some(target) {
            return Ok(None);
        }
        super::check_index(self.name(), target, self.classes)?;
        Ok(Some(target as usize))
    }

    /// Validates and lists the regions: `InvalidArgument` for a smoothing outside `[0, 1]`,
    /// `DTypeMismatch` for an index dtype that is not `I32`/`I64`.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = self.name();
        check_index_dtype(op, self.index_dtype)?;
        if !(0.0..=1.0).contains(&self.label_smoothing) {
            return Err(BackendError::invalid(
                op,
                format!(
                    "label_smoothing must be in [0, 1], got {}",
                    self.label_smoothing
                ),
            ));
        }
        let logits = [self.rows, self.classes];
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push_dense("logits", self.logits, &logits, self.dtype, Access::Read)?;
        acc.push_dense(
            "target",
            self.target,
            &[self.rows],
            self.index_dtype,
            Access::Read,
        )?;
        match self.grad {
            Some(grad) => {
                acc.push_dense("grad", grad, &[self.rows], self.dtype, Access::Read)?;
                acc.push_dense("output", self.output, &logits, self.dtype, Access::Write)?;
            }
            None => {
                acc.push_dense(
                    "output",
                    self.output,
                    &[self.rows],
                    self.dtype,
                    Access::Write,
                )?;
            }
        }
        Ok(acc)
    }
}

crate::compute::op::op_desc!(CrossEntropyDesc => cross_entropy, dtype: dtype, {
    dense "logits": logits,
    dense "target": target as |d: &CrossEntropyDesc| d.index_dtype,
    optional "grad": grad,
    dense "output": output,
});
