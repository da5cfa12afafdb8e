//! Scaled dot-product attention over `[batch, heads, seq, head_dim]` tensors.

use crate::backend::Backend;
use crate::compute::{stats_dtype, AttentionBackwardDesc, AttentionDesc};
use crate::error::{BackendError, Result};
use crate::tensor::Tensor;

use super::{expect_rank, expect_shape};

/// Attention's output with the log-sum-exp of each query row's scaled scores, which
/// [`Backend::attention_backward`] takes.
#[derive(Clone, Debug)]
pub struct AttentionOutput {
    /// `[B, H, Sq, D]`, as [`Backend::attention`] returns.
    pub output: Tensor,
    /// `[B, H, Sq]` of [`stats_dtype`] (f32 for f16, bf16 and f32 operands, f64 for f64):
    /// `ln Σ_j exp(scale · q_i · k_j)` over the keys query `i` sees.
    pub lse: Tensor,
}

/// The gradients [`Backend::attention_backward`] returns, each of its operand's shape and dtype.
#[derive(Clone, Debug)]
pub struct AttentionGrads {
    /// Gradient of the queries.
    pub q: Tensor,
    /// Gradient of the keys.
    pub k: Tensor,
    /// Gradient of the values.
    pub v: Tensor,
}

/// Checks attention operands: one dtype, rank 4, Q `[B, H, Sq, D]` against K and V `[B, H, Skv, D]`.
/// Returns the dtype.
fn check_qkv(
    be: &Backend,
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<crate::dtype::DType> {
    let dtype = be.check_operands(op, &[q, k, v])?;
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        expect_rank(op, name, t, 4)?;
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    if qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3] || ks != vs {
        return Err(BackendError::shape(
            op,
            format!("q {qs:?}, k {ks:?} and v {vs:?} must share batch, heads and head_dim, and k and v must match"),
        ));
    }
    Ok(dtype)
}

impl Backend {
    /// `softmax(Q·Kᵀ / √head_dim [+ causal mask]) · V` for `q` `[B, H, Sq, D]` and `k`, `v`
    /// `[B, H, Skv, D]`, as `torch.nn.functional.scaled_dot_product_attention`. The causal mask is
    /// top-left aligned (query `i` sees keys `0..=i`), as PyTorch's `is_causal`. `ShapeMismatch` when
    /// batch, heads or head_dim disagree or K and V lengths differ.
    pub fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
        let head_dim = q.shape().last().copied().unwrap_or(0);
        self.attention_with_scale(q, k, v, causal, 1.0 / (head_dim.max(1) as f64).sqrt())
    }

    /// [`Backend::attention`] with an explicit score scale (multiplying `Q·Kᵀ`). With mixed precision
    /// on ([`Backend::enable_mixed_precision`]), f32 operands run in its compute dtype and the result
    /// comes back as f32.
    pub fn attention_with_scale(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: f64,
    ) -> Result<Tensor> {
        crate::runtime::amp::autocast(self, &[q, k, v], |t| {
            Ok(self
                .attention_as_is(t[0], t[1], t[2], causal, scale, false)?
                .0)
        })
    }

    /// [`Backend::attention_with_scale`] that also returns each query row's log-sum-exp, for
    /// [`Backend::attention_backward`] (as PyTorch's flash-attention forward does). It runs in the
    /// operands' dtype (mixed precision does not apply). Errors as [`Backend::attention`].
    pub fn attention_with_lse(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: f64,
    ) -> Result<AttentionOutput> {
        let (output, lse) = self.attention_as_is(q, k, v, causal, scale, true)?;
        let lse = lse.ok_or_else(|| {
            BackendError::invalid("attention", "internal: the forward returned no log-sum-exp")
        })?;
        Ok(AttentionOutput { output, lse })
    }

    /// The attention of `q`, `k`, `v`, with the log-sum-exp per query row when `with_lse`.
    fn attention_as_is(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: f64,
        with_lse: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let op = "attention";
        let dtype = check_qkv(self, op, q, k, v)?;
        let (qs, ks) = (q.shape(), k.shape());
        let out = self.empty(qs, dtype)?;
        let lse = with_lse
            .then(|| self.empty(&qs[..3], stats_dtype(dtype)))
            .transpose()?;
        // Rows without a head dim still have a log-sum-exp (of zero scores).
        if out.numel() == 0 && lse.as_ref().is_none_or(|l| l.numel() == 0) {
            return Ok((out, lse));
        }
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        self.compute().attention(&AttentionDesc {
            dtype,
            q: q.data_ptr(),
            k: k.data_ptr(),
            v: v.data_ptr(),
            o: out.data_ptr(),
            batch: qs[0],
            heads: qs[1],
            seq_q: qs[2],
            seq_kv: ks[2],
            head_dim: qs[3],
            scale,
            causal,
            lse: lse.as_ref().map(Tensor::data_ptr),
        })?;
        Ok((out, lse))
    }

    /// The gradients of [`Backend::attention_with_lse`] from `grad` (the output's gradient), the
    /// forward's `q`, `k`, `v`, its `output` and `lse`, and its `causal` and `scale`, flash style
    /// (PyTorch's `_scaled_dot_product_flash_attention_backward`): the scores are rebuilt a tile at
    /// a time from `lse`, never as a `Sq × Skv` matrix. Errors: `ShapeMismatch` for operands
    /// [`Backend::attention`] would refuse, a `grad` or `output` not of `q`'s shape or an `lse` not of
    /// `[B, H, Sq]`; `DTypeMismatch` when the operands differ in dtype or `lse` is not of
    /// [`stats_dtype`]; `InvalidArgument` for a scale that is not finite.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &self,
        grad: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        output: &Tensor,
        lse: &Tensor,
        causal: bool,
        scale: f64,
    ) -> Result<AttentionGrads> {
        let op = "attention_backward";
        let dtype = check_qkv(self, op, q, k, v)?;
        self.check_operands(op, &[q, grad, output])?;
        let qs = q.shape();
        expect_shape(op, "grad", grad, qs)?;
        expect_shape(op, "output", output, qs)?;
        let lse_dtype = self.check_operands(op, &[lse])?;
        if lse_dtype != stats_dtype(dtype) {
            return Err(BackendError::DTypeMismatch {
                op,
                expected: stats_dtype(dtype),
                got: lse_dtype,
            });
        }
        expect_shape(op, "lse", lse, &qs[..3])?;
        let grads = AttentionGrads {
            q: self.empty(qs, dtype)?,
            k: self.empty(k.shape(), dtype)?,
            v: self.empty(v.shape(), dtype)?,
        };
        let dense = |t: &Tensor| t.contiguous();
        let (dy, q, k, v, o, lse) = (
            dense(grad)?,
            dense(q)?,
            dense(k)?,
            dense(v)?,
            dense(output)?,
            dense(lse)?,
        );
        let ks = k.shape();
        self.compute().attention_backward(&AttentionBackwardDesc {
            dtype,
            grad_output: dy.data_ptr(),
            q: q.data_ptr(),
            k: k.data_ptr(),
            v: v.data_ptr(),
            o: o.data_ptr(),
            lse: lse.data_ptr(),
            grad_q: grads.q.data_ptr(),
            grad_k: grads.k.data_ptr(),
            grad_v: grads.v.data_ptr(),
            batch: qs[0],
            heads: qs[1],
            seq_q: qs[2],
            seq_kv: ks[2],
            head_dim: qs[3],
            scale,
            causal,
        })?;
        Ok(grads)
    }
}

impl Tensor {
    /// Attention with this tensor as the queries; see [`Backend::attention`].
    pub fn attention(&self, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
        self.backend().attention(self, k, v, causal)
    }
}
