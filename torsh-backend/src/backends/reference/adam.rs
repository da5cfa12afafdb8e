//! One Adam/AdamW step, written as `torch.optim.Adam`'s single-tensor implementation is, in f64.

use crate::compute::AdamDesc;
use crate::error::Result;

use super::memory::HostMemory;

/// Updates params, exp_avg and exp_avg_sq in place.
pub fn adam_step(mem: &mut HostMemory, d: &AdamDesc) -> Result<()> {
    let mut p = mem.load_dense(d.dtype, d.params, d.len)?;
    let g = mem.load_dense(d.dtype, d.grads, d.len)?;
    let mut m = mem.load_dense(d.dtype, d.exp_avg, d.len)?;
    let mut v = mem.load_dense(d.dtype, d.exp_avg_sq, d.len)?;
    let t = d.step as f64;
    let bias_correction1 = 1.0 - d.beta1.powf(t);
    let bias_correction2 = 1.0 - d.beta2.powf(t);
    let step_size = d.lr / bias_correction1;
    for i in 0..d.len {
        let mut grad = g[i];
        if d.decoupled_weight_decay {
            p[i] *= 1.0 - d.lr * d.weight_decay;
        } else if d.weight_decay != 0.0 {
            grad += d.weight_decay * p[i];
        }
        m[i] = d.beta1 * m[i] + (1.0 - d.beta1) * grad;
        v[i] = d.beta2 * v[i] + (1.0 - d.beta2) * grad * grad;
        let denom = v[i].sqrt() / bias_correction2.sqrt() + d.eps;
        p[i] -= step_size * m[i] / denom;
    }
    mem.store(d.dtype, d.params, &p)?;
    mem.store(d.dtype, d.exp_avg, &m)?;
    mem.store(d.dtype, d.exp_avg_sq, &v)
}
