//! Scaled dot-product attention, one query row at a time: scores, a max-subtracted softmax, the weighted
//! sum of values; and its gradients, from the probabilities rebuilt from the saved log-sum-exp. f64
//! throughout.

use crate::compute::{stats_dtype, AttentionBackwardDesc, AttentionDesc};
use crate::error::Result;

use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;

/// `O[b, h, i] = Σ_j softmax_j(scale · Q[b, h, i] · K[b, h, j]) · V[b, h, j]`, with `j ≤ i` when causal.
pub fn attention(mem: &mut HostMemory, d: &AttentionDesc) -> Result<()> {
    let (bh, sq, skv, dim) = (d.batch * d.heads, d.seq_q, d.seq_kv, d.head_dim);
    if bh == 0 || sq == 0 {
        return Ok(()); // O is empty; K and V may be any length.
    }
    if dim == 0 {
        return match d.lse {
            Some(ptr) => mem.store(stats_dtype(d.dtype), ptr, &d.lse_without_head_dim()),
            None => Ok(()),
        };
    }
    let q = mem.load_dense(d.dtype, d.q, bh * sq * dim)?;
    let k = mem.load_dense(d.dtype, d.k, bh * skv * dim)?;
    let v = mem.load_dense(d.dtype, d.v, bh * skv * dim)?;
    let mut out = vec![0.0f64; bh * sq * dim];
    let mut lse = vec![0.0f64; bh * sq];
    let mut scores = vec![0.0f64; skv];
    for head in 0..bh {
        for i in 0..sq {
            let visible = if d.causal { (i + 1).min(skv) } else { skv };
            let qi = &q[(head * sq + i) * dim..][..dim];
            for (j, score) in scores.iter_mut().enumerate().take(visible) {
                let kj = &k[(head * skv + j) * dim..][..dim];
                *score = d.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>();
            }
            let max = scores[..visible]
                .iter()
                .cloned()
                .fold(f64::NEG_INFINITY, f64::max);
            let mut denom = 0.0;
            for score in &mut scores[..visible] {
                *score = (*score - max).exp();
                denom += *score;
            }
            lse[head * sq + i] = max + denom.ln();
            let oi = &mut out[(head * sq + i) * dim..][..dim];
            for (j, &p) in scores[..visible].iter().enumerate() {
                let vj = &v[(head * skv + j) * dim..][..dim];
                for (o, &vv) in oi.iter_mut().zip(vj) {
                    *o += p / denom * vv;
                }
            }
        }
    }
    if let Some(ptr) = d.lse {
        mem.store(stats_dtype(d.dtype), ptr, &lse)?;
    }
    mem.store(d.dtype, d.o, &out)
}

/// The gradients of [`attention`] (see [`AttentionBackwardDesc`]): per head, `D_i = dO_i · O_i`,
/// then for every visible (query, key) pair `P = exp(scale · q·k − lse)`, `dS = P · (dO·v − D)`,
/// added into dV, dK and dQ.
pub fn attention_backward(mem: &mut HostMemory, d: &AttentionBackwardDesc) -> Result<()> {
    let (bh, sq, skv, dim) = (d.batch * d.heads, d.seq_q, d.seq_kv, d.head_dim);
    if bh == 0 || skv == 0 || dim == 0 {
        return Ok(()); // No key: no query either (checked), nothing to write.
    }
    let (nq, nkv) = (bh * sq * dim, bh * skv * dim);
    let load = |mem: &HostMemory, ptr, n| mem.load_dense(d.dtype, ptr, n);
    let dout = load(mem, d.grad_output, nq)?;
    let (q, k, v, o) = (
        load(mem, d.q, nq)?,
        load(mem, d.k, nkv)?,
        load(mem, d.v, nkv)?,
        load(mem, d.o, nq)?,
    );
    let lse = mem.load_dense(stats_dtype(d.dtype), d.lse, bh * sq)?;
    let (mut dq, mut dk, mut dv) = (vec![0.0f64; nq], vec![0.0f64; nkv], vec![0.0f64; nkv]);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for head in 0..bh {
        for i in 0..sq {
            let row = (head * sq + i) * dim;
            let (qi, doi) = (&q[row..][..dim], &dout[row..][..dim]);
            let di = dot(doi, &o[row..][..dim]);
            let visible = if d.causal { (i + 1).min(skv) } else { skv };
            for j in 0..visible {
                let col = (head * skv + j) * dim;
                let (kj, vj) = (&k[col..][..dim], &v[col..][..dim]);
                let p = (d.scale * dot(qi, kj) - lse[head * sq + i]).exp();
                let ds = p * (dot(doi, vj) - di);
                for c in 0..dim {
                    dv[col + c] += p * doi[c];
                    dk[col + c] += d.scale * ds * qi[c];
                    dq[row + c] += d.scale * ds * kj[c];
                }
            }
        }
    }
    mem.store(d.dtype, d.grad_q, &dq)?;
    mem.store(d.dtype, d.grad_k, &dk)?;
    mem.store(d.dtype, d.grad_v, &dv)
}

impl OpImpl<AttentionDesc> for ReferenceBackend {
    fn op(&self, desc: &AttentionDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("attention", desc.dtype)?;
        self.run(acc, |mem| attention(mem, desc))
    }
}

impl OpImpl<AttentionBackwardDesc> for ReferenceBackend {
    fn op(&self, desc: &AttentionBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("attention_backward", desc.dtype)?;
        self.run(acc, |mem| attention_backward(mem, desc))
    }
}
