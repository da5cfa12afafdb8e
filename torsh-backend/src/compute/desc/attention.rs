//! The scaled dot-product attention descriptor.

use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// Scaled dot-product attention `O = softmax(scale · Q·Kᵀ [+ mask]) · V` over contiguous
/// `[batch, heads, seq, head_dim]` operands. The causal mask is aligned top-left, as in PyTorch's
/// `scaled_dot_product_attention(is_causal=True)`: query `i` sees keys `j ≤ i`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionDesc {
    /// Element type.
    pub dtype: DType,
    /// Q, `[batch, heads, seq_q, head_dim]`.
    pub q: DevicePtr,
    /// K, `[batch, heads, seq_kv, head_dim]`.
    pub k: DevicePtr,
    /// V, `[batch, heads, seq_kv, head_dim]`.
    pub v: DevicePtr,
    /// O, `[batch, heads, seq_q, head_dim]`.
    pub o: DevicePtr,
    /// Batch size.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Query length.
    pub seq_q: usize,
    /// Key/value length (≥ 1 when `seq_q` ≥ 1).
    pub seq_kv: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Multiplies the scores; usually `1/√head_dim`. Must be finite.
    pub scale: f64,
    /// Apply the causal mask.
    pub causal: bool,
}

impl AttentionDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "attention";
        if !self.scale.is_finite() {
            return Err(BackendError::invalid(
                op,
                format!("scale {} must be finite", self.scale),
            ));
        }
        if self.seq_kv == 0 && self.seq_q > 0 && self.batch * self.heads > 0 {
            return Err(BackendError::invalid(
                op,
                "seq_kv is 0: every query would attend to nothing",
            ));
        }
        let q_shape = [self.batch, self.heads, self.seq_q, self.head_dim];
        let kv_shape = [self.batch, self.heads, self.seq_kv, self.head_dim];
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push_dense("q", self.q, &q_shape, self.dtype, Access::Read)?;
        acc.push_dense("k", self.k, &kv_shape, self.dtype, Access::Read)?;
        acc.push_dense("v", self.v, &kv_shape, self.dtype, Access::Read)?;
        acc.push_dense("o", self.o, &q_shape, self.dtype, Access::Write)?;
        Ok(acc)
    }
}

crate::compute::op::op_desc!(AttentionDesc => attention, dtype: dtype, {
    dense "q": q,
    dense "k": k,
    dense "v": v,
    dense "o": o,
});
