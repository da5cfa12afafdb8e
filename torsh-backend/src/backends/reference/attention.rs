//! Scaled dot-product attention, one query row at a time: scores, a max-subtracted softmax, the weighted
//! sum of values. f64 throughout.

use crate::compute::AttentionDesc;
use crate::error::Result;

use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;

/// `O[b, h, i] = Σ_j softmax_j(scale · Q[b, h, i] · K[b, h, j]) · V[b, h, j]`, with `j ≤ i` when causal.
pub fn attention(mem: &mut HostMemory, d: &AttentionDesc) -> Result<()> {
    let (bh, sq, skv, dim) = (d.batch * d.heads, d.seq_q, d.seq_kv, d.head_dim);
    if bh == 0 || sq == 0 || dim == 0 {
        return Ok(()); // O is empty; K and V may be any length.
    }
    let q = mem.load_dense(d.dtype, d.q, bh * sq * dim)?;
    let k = mem.load_dense(d.dtype, d.k, bh * skv * dim)?;
    let v = mem.load_dense(d.dtype, d.v, bh * skv * dim)?;
    let mut out = vec![0.0f64; bh * sq * dim];
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
            let oi = &mut out[(head * sq + i) * dim..][..dim];
            for (j, &p) in scores[..visible].iter().enumerate() {
                let vj = &v[(head * skv + j) * dim..][..dim];
                for (o, &vv) in oi.iter_mut().zip(vj) {
                    *o += p / denom * vv;
                }
            }
        }
    }
    mem.store(d.dtype, d.o, &out)
}

impl OpImpl<AttentionDesc> for ReferenceBackend {
    fn op(&self, desc: &AttentionDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("attention", desc.dtype)?;
        self.run(acc, |mem| attention(mem, desc))
    }
}
