//! The scaled dot-product attention descriptor.

use super::dense_bytes;
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::{stats_dtype, DevicePtr};
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
    /// Where to write each query row's log-sum-exp of its scaled scores over the keys it sees,
    /// `ln Σ_j exp(scale · q_i · k_j)` (`[batch, heads, seq_q]` of [`stats_dtype`]`(dtype)`), which
    /// [`AttentionBackwardDesc`] takes.
    pub lse: Option<DevicePtr>,
}

/// The scores' shapes shared by the forward and the backward, checked: the scale finite, and keys
/// present wherever a query is (`[batch, heads, seq_q, seq_kv]`, not multiplied: their product may
/// overflow, which the region checks report).
fn check_sizes(
    op: &'static str,
    scale: f64,
    [batch, heads, seq_q, seq_kv]: [usize; 4],
) -> Result<()> {
    if !scale.is_finite() {
        return Err(BackendError::invalid(
            op,
            format!("scale {scale} must be finite"),
        ));
    }
    if seq_kv == 0 && seq_q > 0 && batch > 0 && heads > 0 {
        return Err(BackendError::invalid(
            op,
            "seq_kv is 0: every query would attend to nothing",
        ));
    }
    Ok(())
}

impl AttentionDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "attention";
        check_sizes(
            op,
            self.scale,
            [self.batch, self.heads, self.seq_q, self.seq_kv],
        )?;
        let q_shape = [self.batch, self.heads, self.seq_q, self.head_dim];
        let kv_shape = [self.batch, self.heads, self.seq_kv, self.head_dim];
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push_dense("q", self.q, &q_shape, self.dtype, Access::Read)?;
        acc.push_dense("k", self.k, &kv_shape, self.dtype, Access::Read)?;
        acc.push_dense("v", self.v, &kv_shape, self.dtype, Access::Read)?;
        acc.push_dense("o", self.o, &q_shape, self.dtype, Access::Write)?;
        if let Some(lse) = self.lse {
            let rows = [self.batch, self.heads, self.seq_q];
            acc.push_dense("lse", lse, &rows, stats_dtype(self.dtype), Access::Write)?;
        }
        Ok(acc)
    }

    /// The log-sum-exp rows of a call of head dim 0, where every score is 0: `ln` of the number
    /// of keys each query sees. A backend whose kernels take no empty head writes these.
    pub(crate) fn lse_without_head_dim(&self) -> Vec<f64> {
        let rows = self.batch * self.heads * self.seq_q;
        (0..rows)
            .map(|r| {
                let i = r % self.seq_q;
                let seen = if self.causal {
                    (i + 1).min(self.seq_kv)
                } else {
                    self.seq_kv
                };
                (seen as f64).ln()
            })
            .collect()
    }
}

/// The gradients of [`AttentionDesc`]'s attention, flash style, from its output and log-sum-exp:
/// with `P_ij = exp(scale · q_i · k_j − lse_i)` (0 for keys masked from query `i`) and
/// `D_i = Σ_d dO_id · O_id`,
/// `dV_j = Σ_i P_ij · dO_i`, `dS_ij = P_ij · (dO_i · v_j − D_i)`, `dQ_i = scale · Σ_j dS_ij · k_j`,
/// `dK_j = scale · Σ_i dS_ij · q_i`. The scores are recomputed a tile at a time; no
/// `seq_q × seq_kv` matrix is stored. Every gradient is written (a key no query sees gets zeros).
/// Operands are contiguous `[batch, heads, seq, head_dim]` as in the forward; `lse` is
/// `[batch, heads, seq_q]` of [`stats_dtype`]`(dtype)`. Errors: `InvalidArgument` for a scale that
/// is not finite or no keys for present queries, `SizeOverflow`, and the region checks (outputs
/// may alias neither each other nor an input).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionBackwardDesc {
    /// Element type of every operand but `lse`.
    pub dtype: DType,
    /// dO, `[batch, heads, seq_q, head_dim]`.
    pub grad_output: DevicePtr,
    /// Q of the forward.
    pub q: DevicePtr,
    /// K of the forward, `[batch, heads, seq_kv, head_dim]`.
    pub k: DevicePtr,
    /// V of the forward.
    pub v: DevicePtr,
    /// O, the forward's output.
    pub o: DevicePtr,
    /// The forward's log-sum-exp per query row.
    pub lse: DevicePtr,
    /// dQ, written.
    pub grad_q: DevicePtr,
    /// dK, written.
    pub grad_k: DevicePtr,
    /// dV, written.
    pub grad_v: DevicePtr,
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
    /// The forward's score scale. Must be finite.
    pub scale: f64,
    /// The forward's causal mask.
    pub causal: bool,
}

impl AttentionBackwardDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "attention_backward";
        check_sizes(
            op,
            self.scale,
            [self.batch, self.heads, self.seq_q, self.seq_kv],
        )?;
        let q_shape = [self.batch, self.heads, self.seq_q, self.head_dim];
        let kv_shape = [self.batch, self.heads, self.seq_kv, self.head_dim];
        let lse = dense_bytes(
            op,
            &[self.batch, self.heads, self.seq_q],
            stats_dtype(self.dtype),
        )?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        for (name, ptr, shape) in [
            ("grad_output", self.grad_output, &q_shape),
            ("q", self.q, &q_shape),
            ("k", self.k, &kv_shape),
            ("v", self.v, &kv_shape),
            ("o", self.o, &q_shape),
        ] {
            acc.push_dense(name, ptr, shape, self.dtype, Access::Read)?;
        }
        acc.push("lse", self.lse, lse, Access::Read, true);
        for (name, ptr, shape) in [
            ("grad_q", self.grad_q, &q_shape),
            ("grad_k", self.grad_k, &kv_shape),
            ("grad_v", self.grad_v, &kv_shape),
        ] {
            acc.push_dense(name, ptr, shape, self.dtype, Access::Write)?;
        }
        Ok(acc)
    }
}

crate::compute::op::op_desc!(AttentionDesc => attention, dtype: dtype, {
    dense "q": q,
    dense "k": k,
    dense "v": v,
    dense "o": o,
    optional "lse": lse as |d: &AttentionDesc| stats_dtype(d.dtype),
});

crate::compute::op::op_desc!(AttentionBackwardDesc => attention_backward, dtype: dtype, {
    dense "grad_output": grad_output,
    dense "q": q,
    dense "k": k,
    dense "v": v,
    dense "o": o,
    dense "lse": lse as |d: &AttentionBackwardDesc| stats_dtype(d.dtype),
    dense "grad_q": grad_q,
    dense "grad_k": grad_k,
    dense "grad_v": grad_v,
});
