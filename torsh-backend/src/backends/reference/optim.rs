//! One Adam/AdamW step, written as `torch.optim.Adam`'s single-tensor implementation is, in f64; and
//! the loss scaler's fused unscale-and-check.

use crate::compute::{AdamDesc, UnscaleDesc};
use crate::dtype::DType;
use crate::error::Result;

use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;

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

/// `output = input · inv_scale` (the scale rounded to the dtype first, each product rounded once on
/// store), setting the flag to 1 when an output is not finite.
pub fn unscale_and_check(mem: &mut HostMemory, d: &UnscaleDesc) -> Result<()> {
    let size = d.dtype.size_in_bytes();
    let mut bytes = [0u8; 8];
    crate::dtype::encode(d.dtype, d.inv_scale, &mut bytes[..size]);
    let inv = crate::dtype::decode(d.dtype, &bytes[..size]);
    let x = mem.load_dense(d.dtype, d.input, d.len)?;
    let out: Vec<f64> = x.iter().map(|v| v * inv).collect();
    mem.store(d.dtype, d.output, &out)?;
    // Judge the values as stored: a product that overflows the dtype is infinite there.
    let stored = mem.load_dense(d.dtype, d.output, d.len)?;
    if stored.iter().any(|v| !v.is_finite()) {
        mem.store(DType::F32, d.found_inf, &[1.0])?;
    }
    Ok(())
}

impl OpImpl<AdamDesc> for ReferenceBackend {
    fn op(&self, desc: &AdamDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("adam_step", desc.dtype)?;
        self.run(acc, |mem| adam_step(mem, desc))
    }
}

impl OpImpl<UnscaleDesc> for ReferenceBackend {
    fn op(&self, desc: &UnscaleDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("unscale_and_check", desc.dtype)?;
        self.run(acc, |mem| unscale_and_check(mem, desc))
    }
}
