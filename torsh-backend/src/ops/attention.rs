//! Scaled dot-product attention over `[batch, heads, seq, head_dim]` tensors.

use crate::backend::Backend;
use crate::compute::AttentionDesc;
use crate::error::{BackendError, Result};
use crate::tensor::Tensor;

use super::expect_rank;

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
            self.attention_as_is(&t[0], &t[1], &t[2], causal, scale)
        })
    }

    fn attention_as_is(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: f64,
    ) -> Result<Tensor> {
        let op = "attention";
        let dtype = self.check_operands(op, &[q, k, v])?;
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
        let out = self.empty(qs, dtype)?;
        if out.numel() == 0 {
            return Ok(out);
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
        })?;
        Ok(out)
    }
}

impl Tensor {
    /// Attention with this tensor as the queries; see [`Backend::attention`].
    pub fn attention(&self, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
        self.backend().attention(self, k, v, causal)
    }
}
