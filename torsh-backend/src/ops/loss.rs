//! Classification losses and their gradients: `cross_entropy` (with `ignore_index` and label
//! smoothing) and `nll_loss`, as `torch.nn.functional` defines them, over `[N, C]` scores and `[N]`
//! class indices.
//!
//! `cross_entropy` and its gradient run as one fused kernel over the logits
//! ([`CrossEntropyDesc`]: a pass over each row after its maximum and sum), then a reduction of the
//! `[N]` per-sample values; where a backend answers the kernel `FeatureUnavailable` (WebGPU rows
//! past a binding or its loop budget) they are composed of `log_softmax`, `gather` and `one_hot`
//! instead. `nll_loss` is composed of `gather`, `one_hot`, masks and reductions. A
//! target outside `0..C` (other than `ignore_index`) is `IndexOutOfRange` (on GPUs at the next
//! synchronize or host read).

use crate::backend::Backend;
use crate::compute::{check_index_dtype, CompareOp, CrossEntropyDesc};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::tensor::Tensor;

use super::{expect_rank, expect_shape};

/// How a loss combines its per-sample values (PyTorch's `reduction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The `[N]` per-sample losses (ignored samples give 0).
    None,
    /// Their mean over the samples not ignored, as a 0-d tensor (NaN when every sample is ignored,
    /// as PyTorch).
    #[default]
    Mean,
    /// Their sum, as a 0-d tensor.
    Sum,
}

/// The options of [`Backend::cross_entropy`]; `Default` gives PyTorch's (mean, ignore index -100,
/// no smoothing).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyConfig {
    /// How the per-sample losses are combined.
    pub reduction: Reduction,
    /// Samples whose target equals this contribute nothing, to the loss or to the mean's count
    /// (`None`: every sample counts).
    pub ignore_index: Option<i64>,
    /// `ε` in `[0, 1]`: the target distribution is `(1 − ε)` on the target class plus `ε / C` on
    /// every class.
    pub label_smoothing: f64,
}

impl Default for CrossEntropyConfig {
    fn default() -> Self {
        CrossEntropyConfig {
            reduction: Reduction::Mean,
            ignore_index: Some(-100),
            label_smoothing: 0.0,
        }
    }
}

/// The checked targets of a loss over `[N, C]` scores.
struct Targets {
    /// `[N, 1]` class indices, ignored samples' replaced by 0 (so every gather is in range).
    safe: Tensor,
    /// `[N]` `U8`, nonzero for the samples that count; `None` when all do.
    counted: Option<Tensor>,
}

impl Backend {
    /// Checks `scores` (`[N, C]`, a float dtype) and `target` (`[N]`, `I32` or `I64`) of `op`.
    fn check_loss(&self, op: &'static str, scores: &Tensor, target: &Tensor) -> Result<()> {
        self.check_operands(op, &[scores])?;
        self.check_owner(op, target)?;
        if !scores.dtype().is_float() {
            return Err(BackendError::DTypeMismatch {
                op,
                expected: DType::F32,
                got: scores.dtype(),
            });
        }
        check_index_dtype(op, target.dtype())?;
        expect_rank(op, "scores", scores, 2)?;
        expect_shape(op, "target", target, &scores.shape()[..1])
    }

    /// Checks the operands of `op` ([`Backend::check_loss`]) and builds its targets.
    fn loss_targets(
        &self,
        op: &'static str,
        scores: &Tensor,
        target: &Tensor,
        ignore_index: Option<i64>,
    ) -> Result<Targets> {
        self.check_loss(op, scores, target)?;
        let n = scores.shape()[0];
        let Some(ignore) = ignore_index else {
            return Ok(Targets {
                safe: target.reshape(&[n, 1])?,
                counted: None,
            });
        };
        let ignored = self.compare_scalar(CompareOp::Eq, target, ignore as f64)?;
        Ok(Targets {
            safe: target.masked_fill(&ignored, 0.0)?.reshape(&[n, 1])?,
            counted: Some(ignored.logical_not()?),
        })
    }

    /// The number of `target`'s samples that are not `ignore_index`, as a 0-d tensor of `dtype`.
    fn counted_targets(
        &self,
        target: &Tensor,
        ignore_index: Option<i64>,
        dtype: DType,
    ) -> Result<Tensor> {
        match ignore_index {
            Some(ignore) => self
                .compare_scalar(CompareOp::Ne, target, ignore as f64)?
                .cast(dtype)?
                .sum_all(),
            None => self.full(&[], target.shape()[0] as f64, dtype),
        }
    }

    /// Runs the fused cross-entropy kernel over `logits` and `target` (checked), with the `[N]`
    /// per-sample gradients `grad` for the backward, into a fresh output.
    fn cross_entropy_kernel(
        &self,
        logits: &Tensor,
        target: &Tensor,
        grad: Option<&Tensor>,
        config: CrossEntropyConfig,
    ) -> Result<Tensor> {
        let [rows, classes] = [logits.shape()[0], logits.shape()[1]];
        let shape: &[usize] = if grad.is_some() {
            &[rows, classes]
        } else {
            &[rows]
        };
        let out = self.empty(shape, logits.dtype())?;
        if rows == 0 {
            return Ok(out);
        }
        let (x, t) = (logits.contiguous()?, target.contiguous()?);
        let grad = grad.map(Tensor::contiguous).transpose()?;
        self.compute().cross_entropy(&CrossEntropyDesc {
            dtype: logits.dtype(),
            index_dtype: target.dtype(),
            logits: x.data_ptr(),
            target: t.data_ptr(),
            grad: grad.as_ref().map(Tensor::data_ptr),
            output: out.data_ptr(),
            rows,
            classes,
            ignore_index: config.ignore_index,
            label_smoothing: config.label_smoothing,
        })?;
        Ok(out)
    }

    /// `per` (`[N]`) with the ignored samples zeroed, combined by `reduction`.
    fn reduce_loss(&self, per: Tensor, t: &Targets, reduction: Reduction) -> Result<Tensor> {
        let per = match &t.counted {
            Some(counted) => self.where_(counted, &per, &self.zeros(&[1], per.dtype())?)?,
            None => per,
        };
        match reduction {
            Reduction::None => Ok(per),
            Reduction::Sum => per.sum_all(),
            Reduction::Mean => per.sum_all()?.div(&self.counted(&per, t)?),
        }
    }

    /// The number of samples that count, as a 0-d tensor of `like`'s dtype.
    fn counted(&self, like: &Tensor, t: &Targets) -> Result<Tensor> {
        match &t.counted {
            Some(counted) => counted.cast(like.dtype())?.sum_all(),
            None => self.full(&[], like.shape()[0] as f64, like.dtype()),
        }
    }

    /// Each sample's weight in the gradient (`[N, 1]`): `grad` itself (`None`), or the 0-d `grad`
    /// (divided by the count for `Mean`), zero for ignored samples.
    fn loss_weights(
        &self,
        op: &'static str,
        grad: &Tensor,
        like: &Tensor,
        t: &Targets,
        reduction: Reduction,
    ) -> Result<Tensor> {
        let n = like.shape()[0];
        self.check_operands(op, &[grad, like])?;
        let per = match reduction {
            Reduction::None => {
                expect_shape(op, "grad", grad, &[n])?;
                grad.clone()
            }
            Reduction::Sum | Reduction::Mean => {
                expect_shape(op, "grad", grad, &[])?;
                let g = if reduction == Reduction::Mean {
                    grad.div(&self.counted(like, t)?)?
                } else {
                    grad.clone()
                };
                g.reshape(&[1])?.broadcast_to(&[n])?
            }
        };
        let per = match &t.counted {
            Some(counted) => self.where_(counted, &per, &self.zeros(&[1], like.dtype())?)?,
            None => per,
        };
        per.reshape(&[n, 1])
    }

    /// PyTorch's `cross_entropy(logits, target, reduction, ignore_index, label_smoothing)` over
    /// `[N, C]` logits and `[N]` class indices: per sample `−Σ_c q_c · log_softmax(logits)_c` with
    /// `q` the target class smoothed by `config.label_smoothing`, then reduced. One fused pass over
    /// the logits. Errors: `ShapeMismatch` unless the logits are `[N, C]` and the target `[N]`;
    /// `DTypeMismatch` for a target that is not `I32`/`I64` or logits that are not floats;
    /// `InvalidArgument` for a smoothing outside `[0, 1]`; `IndexOutOfRange` for a target outside
    /// `0..C` that is not the ignore index (see the module's note on GPUs).
    pub fn cross_entropy(
        &self,
        logits: &Tensor,
        target: &Tensor,
        config: CrossEntropyConfig,
    ) -> Result<Tensor> {
        let op = "cross_entropy";
        check_smoothing(op, config.label_smoothing)?;
        self.check_loss(op, logits, target)?;
        let per = match self.cross_entropy_kernel(logits, target, None, config) {
            Err(BackendError::FeatureUnavailable { .. }) => {
                return self.cross_entropy_composed(logits, target, config);
            }
            per => per?,
        };
        match config.reduction {
            Reduction::None => Ok(per),
            Reduction::Sum => per.sum_all(),
            Reduction::Mean => {
                let count = self.counted_targets(target, config.ignore_index, per.dtype())?;
                per.sum_all()?.div(&count)
            }
        }
    }

    /// The gradient of [`Backend::cross_entropy`] with respect to its logits, from `grad` (the
    /// loss's gradient: 0-d for `Mean` and `Sum`, `[N]` for `None`): per sample
    /// `(softmax(logits) − q) · weight`, ignored samples 0, in one fused pass. Errors as
    /// [`Backend::cross_entropy`], and `ShapeMismatch` for a `grad` of another shape.
    pub fn cross_entropy_backward(
        &self,
        grad: &Tensor,
        logits: &Tensor,
        target: &Tensor,
        config: CrossEntropyConfig,
    ) -> Result<Tensor> {
        let op = "cross_entropy_backward";
        check_smoothing(op, config.label_smoothing)?;
        self.check_loss(op, logits, target)?;
        self.check_operands(op, &[grad, logits])?;
        let n = logits.shape()[0];
        let weights = match config.reduction {
            Reduction::None => {
                expect_shape(op, "grad", grad, &[n])?;
                grad.clone()
            }
            Reduction::Sum | Reduction::Mean => {
                expect_shape(op, "grad", grad, &[])?;
                let g = if config.reduction == Reduction::Mean {
                    grad.div(&self.counted_targets(target, config.ignore_index, grad.dtype())?)?
                } else {
                    grad.clone()
                };
                g.reshape(&[1])?.broadcast_to(&[n])?
            }
        };
        match self.cross_entropy_kernel(logits, target, Some(&weights), config) {
            Err(BackendError::FeatureUnavailable { .. }) => {
                self.cross_entropy_backward_composed(grad, logits, target, config)
            }
            out => out,
        }
    }

    /// [`Backend::cross_entropy`] composed of `log_softmax`, `gather` and reductions, for logits
    /// the fused kernel does not take (WebGPU rows past a binding or the loop budget).
    fn cross_entropy_composed(
        &self,
        logits: &Tensor,
        target: &Tensor,
        config: CrossEntropyConfig,
    ) -> Result<Tensor> {
        let op = "cross_entropy";
        let eps = config.label_smoothing;
        let t = self.loss_targets(op, logits, target, config.ignore_index)?;
        let n = logits.shape()[0];
        let logp = logits.log_softmax(1)?;
        let picked = logp.gather(1, &t.safe)?;
        let per = if eps > 0.0 {
            let spread = self.mean(&logp, 1, true)?;
            picked
                .mul_scalar(1.0 - eps)?
                .add(&spread.mul_scalar(eps)?)?
        } else {
            picked
        };
        self.reduce_loss(per.neg()?.reshape(&[n])?, &t, config.reduction)
    }

    /// [`Backend::cross_entropy_backward`] composed of `softmax`, `one_hot` and elementwise ops,
    /// as [`Backend::cross_entropy`] falls back to it.
    fn cross_entropy_backward_composed(
        &self,
        grad: &Tensor,
        logits: &Tensor,
        target: &Tensor,
        config: CrossEntropyConfig,
    ) -> Result<Tensor> {
        let op = "cross_entropy_backward";
        let eps = config.label_smoothing;
        let t = self.loss_targets(op, logits, target, config.ignore_index)?;
        let weights = self.loss_weights(op, grad, logits, &t, config.reduction)?;
        let classes = logits.shape()[1];
        let mut q = self.one_hot(&t.safe.flatten()?, classes, logits.dtype())?;
        if eps > 0.0 {
            q = q.mul_scalar(1.0 - eps)?.add_scalar(eps / classes as f64)?;
        }
        logits.softmax(1)?.sub(&q)?.mul(&weights)
    }

    /// PyTorch's `nll_loss(input, target, reduction, ignore_index)`: per sample `−input[i, target[i]]`
    /// over `[N, C]` log-probabilities, then reduced. Errors as [`Backend::cross_entropy`].
    pub fn nll_loss(
        &self,
        input: &Tensor,
        target: &Tensor,
        reduction: Reduction,
        ignore_index: Option<i64>,
    ) -> Result<Tensor> {
        let t = self.loss_targets("nll_loss", input, target, ignore_index)?;
        let n = input.shape()[0];
        let per = input.gather(1, &t.safe)?.neg()?.reshape(&[n])?;
        self.reduce_loss(per, &t, reduction)
    }

    /// The gradient of [`Backend::nll_loss`] with respect to its `input` (whose values it does not
    /// read): `−weight` at each sample's target, 0 elsewhere. Errors as
    /// [`Backend::cross_entropy_backward`].
    pub fn nll_loss_backward(
        &self,
        grad: &Tensor,
        input: &Tensor,
        target: &Tensor,
        reduction: Reduction,
        ignore_index: Option<i64>,
    ) -> Result<Tensor> {
        let op = "nll_loss_backward";
        let t = self.loss_targets(op, input, target, ignore_index)?;
        let weights = self.loss_weights(op, grad, input, &t, reduction)?;
        let picked = self.one_hot(&t.safe.flatten()?, input.shape()[1], input.dtype())?;
        picked.mul(&weights.neg()?)
    }
}

/// `label_smoothing`, or `InvalidArgument` outside `[0, 1]` (NaN included).
fn check_smoothing(op: &'static str, eps: f64) -> Result<f64> {
    if (0.0..=1.0).contains(&eps) {
        Ok(eps)
    } else {
        Err(BackendError::invalid(
            op,
            format!("label_smoothing must be in [0, 1], got {eps}"),
        ))
    }
}

impl Tensor {
    /// See [`Backend::cross_entropy`]; this tensor is the `[N, C]` logits.
    pub fn cross_entropy(&self, target: &Tensor, config: CrossEntropyConfig) -> Result<Tensor> {
        self.backend().cross_entropy(self, target, config)
    }

    /// See [`Backend::nll_loss`]; this tensor is the `[N, C]` log-probabilities.
    pub fn nll_loss(
        &self,
        target: &Tensor,
        reduction: Reduction,
        ignore_index: Option<i64>,
    ) -> Result<Tensor> {
        self.backend()
            .nll_loss(self, target, reduction, ignore_index)
    }
}
