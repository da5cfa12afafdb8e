//! The fused Adam/AdamW step on the CPU.
//!
//! One pass over params, grads and both moments, [`BLOCK`] elements at a time, written as
//! `torch.optim.Adam`'s single-tensor step: `denom = √v / √(1 - β₂ᵗ) + eps`, `step = lr / (1 - β₁ᵗ)`,
//! `p -= step · m / denom`, with the weight decay added to the gradient (Adam) or applied to the
//! parameters first (AdamW). f32, f16 and bf16 compute in f32 (the half types widened a block at a
//! time and rounded once on store), f64 in f64; the scalar coefficients are computed in f64.

use super::host::{
    for_chunks, narrow_into, widen_into, with_float, with_simd, Ctx, Element, Real, Span, BLOCK,
};
use super::reduce::{as_acc, as_acc_mut};
use crate::backends::cpu::cost::TASK_ELEMENTS;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{memory::HostMemory, optim as reference};
use crate::compute::op::OpImpl;
use crate::compute::AdamDesc;
use crate::compute::ComputeBackend;
use crate::compute::UnscaleDesc;
use crate::error::Result;

/// How the weight decay enters the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decay {
    /// None (Adam with `weight_decay = 0`).
    None,
    /// `g += wd · p` (Adam).
    L2,
    /// `p *= 1 - lr · wd` (AdamW).
    Decoupled,
}

/// The step's scalars in the compute type.
#[derive(Clone, Copy, Debug)]
struct Coefficients<A> {
    /// β₁.
    beta1: A,
    /// 1 - β₁.
    one_minus_beta1: A,
    /// β₂.
    beta2: A,
    /// 1 - β₂.
    one_minus_beta2: A,
    /// `lr / (1 - β₁ᵗ)`.
    step_size: A,
    /// `√(1 - β₂ᵗ)`.
    bias_correction2_sqrt: A,
    /// ε.
    eps: A,
    /// The weight decay (Adam).
    weight_decay: A,
    /// `1 - lr · wd` (AdamW).
    decay: A,
}

impl<A: Real> Coefficients<A> {
    /// The coefficients of step `d`, in f64 then rounded once.
    fn of(d: &AdamDesc) -> Coefficients<A> {
        let t = d.step as f64;
        let bias_correction1 = 1.0 - d.beta1.powf(t);
        let bias_correction2 = 1.0 - d.beta2.powf(t);
        let a = A::from_f64;
        Coefficients {
            beta1: a(d.beta1),
            one_minus_beta1: a(1.0 - d.beta1),
            beta2: a(d.beta2),
            one_minus_beta2: a(1.0 - d.beta2),
            step_size: a(d.lr / bias_correction1),
            bias_correction2_sqrt: a(bias_correction2.sqrt()),
            eps: a(d.eps),
            weight_decay: a(d.weight_decay),
            decay: a(1.0 - d.lr * d.weight_decay),
        }
    }
}

/// One step over params, grads and both moments.
pub(crate) fn adam_step(mem: &mut HostMemory, d: &AdamDesc, ctx: Ctx) -> Result<()> {
    if d.len == 0 {
        return Ok(());
    }
    with_float!(d.dtype, T => typed::<T>(mem, d, ctx), _ => reference::adam_step(mem, d))
}

/// [`adam_step`] for element type `T`.
fn typed<T: Element>(mem: &mut HostMemory, d: &AdamDesc, ctx: Ctx) -> Result<()> {
    const OP: &str = "adam_step";
    let p = Span::<T>::of(mem, OP, d.params, d.len)?;
    let g = Span::<T>::of(mem, OP, d.grads, d.len)?;
    let m = Span::<T>::of(mem, OP, d.exp_avg, d.len)?;
    let v = Span::<T>::of(mem, OP, d.exp_avg_sq, d.len)?;
    let k = Coefficients::<T::Acc>::of(d);
    let decay = if d.decoupled_weight_decay {
        Decay::Decoupled
    } else if d.weight_decay != 0.0 {
        Decay::L2
    } else {
        Decay::None
    };
    for_chunks(d.len, ctx.threads, TASK_ELEMENTS, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // Widened copies of the four operands, for the types that need them.
                let direct = as_acc::<T>(&[]).is_some();
                let mut buf = vec![<T::Acc as Real>::ZERO; if direct { 0 } else { 4 * BLOCK }];
                let mut start = range.start;
                while start < range.end {
                    let r = start..(start + BLOCK).min(range.end);
                    // SAFETY: the four operands are distinct (the checks rejected overlap) and this task
                    // owns elements `range` of each.
                    let (p, g, m, v) = unsafe {
                        (
                            p.slice_mut(r.clone()),
                            g.slice(r.clone()),
                            m.slice_mut(r.clone()),
                            v.slice_mut(r.clone()),
                        )
                    };
                    block(p, g, m, v, &k, decay, &mut buf);
                    start = r.end;
                }
            },
        )
    });
    Ok(())
}

/// The step over one block: in place for f32 and f64, through widened copies in `buf` (`4 · BLOCK`
/// long) for f16 and bf16.
#[inline(always)]
fn block<T: Element>(
    p: &mut [T],
    g: &[T],
    m: &mut [T],
    v: &mut [T],
    k: &Coefficients<T::Acc>,
    decay: Decay,
    buf: &mut [T::Acc],
) {
    if let Some(g) = as_acc(g) {
        if let (Some(p), Some(m), Some(v)) = (as_acc_mut(p), as_acc_mut(m), as_acc_mut(v)) {
            step(p, g, m, v, k, decay);
            return;
        }
    }
    let n = p.len();
    let (pw, rest) = buf.split_at_mut(BLOCK);
    let (gw, rest) = rest.split_at_mut(BLOCK);
    let (mw, vw) = rest.split_at_mut(BLOCK);
    let (pw, gw, mw, vw) = (&mut pw[..n], &mut gw[..n], &mut mw[..n], &mut vw[..n]);
    widen_into(p, pw);
    widen_into(g, gw);
    widen_into(m, mw);
    widen_into(v, vw);
    step(pw, gw, mw, vw, k, decay);
    narrow_into(pw, p);
    narrow_into(mw, m);
    narrow_into(vw, v);
}

/// The step over equal-length slices in the compute type, one loop per decay mode.
#[inline(always)]
fn step<A: Real>(
    p: &mut [A],
    g: &[A],
    m: &mut [A],
    v: &mut [A],
    k: &Coefficients<A>,
    decay: Decay,
) {
    match decay {
        Decay::None => step_with::<A, 0>(p, g, m, v, k),
        Decay::L2 => step_with::<A, 1>(p, g, m, v, k),
        Decay::Decoupled => step_with::<A, 2>(p, g, m, v, k),
    }
}

/// The step for decay mode `MODE` (0 none, 1 L2, 2 decoupled), in the reference's order of
/// operations.
#[inline(always)]
fn step_with<A: Real, const MODE: u8>(
    p: &mut [A],
    g: &[A],
    m: &mut [A],
    v: &mut [A],
    k: &Coefficients<A>,
) {
    let k = *k;
    let it = p.iter_mut().zip(g).zip(m.iter_mut().zip(v.iter_mut()));
    for ((p, &g), (m, v)) in it {
        let mut grad = g;
        let mut param = *p;
        if MODE == 2 {
            param = param * k.decay;
        } else if MODE == 1 {
            grad += k.weight_decay * param;
        }
        let mm = k.beta1 * *m + k.one_minus_beta1 * grad;
        let vv = k.beta2 * *v + k.one_minus_beta2 * grad * grad;
        let denom = vv.sqrt() / k.bias_correction2_sqrt + k.eps;
        *p = param - k.step_size * mm / denom;
        *m = mm;
        *v = vv;
    }
}

impl OpImpl<AdamDesc> for CpuBackend {
    fn op(&self, desc: &AdamDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.adam_step(desc);
        };
        self.kernel(acc, |mem, ctx| adam_step(mem, desc, ctx))
    }
}

impl OpImpl<UnscaleDesc> for CpuBackend {
    /// The reference's fused loop: one pass over the gradients, on the calling thread.
    fn op(&self, desc: &UnscaleDesc) -> Result<()> {
        self.scalar.unscale_and_check(desc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::cpu::reduce::tests::{check, on_threads, random, upload};
    use crate::dtype::DType;

    /// One step of length `len` against the reference, on every float dtype with 1 and 2 threads;
    /// compares params and both moments.
    fn check_step(len: usize, weight_decay: f64, decoupled: bool, step: u64) {
        let seed = len as u64 + step;
        let p = random(len, seed);
        let g = random(len, seed + 1);
        let m: Vec<f64> = random(len, seed + 2).iter().map(|v| v * 0.1).collect();
        let v: Vec<f64> = random(len, seed + 3).iter().map(|v| v * v * 0.01).collect();
        for dtype in DType::FLOATS {
            let mut mem = HostMemory::default();
            let gp = upload(&mut mem, dtype, &g);
            let mut results = Vec::new();
            for run in 0..3 {
                // Run 0 is the reference; runs 1 and 2 use 1 and 2 threads.
                let ops = [
                    upload(&mut mem, dtype, &p),
                    upload(&mut mem, dtype, &m),
                    upload(&mut mem, dtype, &v),
                ];
                let desc = AdamDesc {
                    dtype,
                    params: ops[0],
                    grads: gp,
                    exp_avg: ops[1],
                    exp_avg_sq: ops[2],
                    len,
                    lr: 1e-2,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay,
                    decoupled_weight_decay: decoupled,
                    step,
                };
                if run == 0 {
                    reference::adam_step(&mut mem, &desc).unwrap();
                } else {
                    on_threads(run, |ctx| adam_step(&mut mem, &desc, ctx)).unwrap();
                }
                results.push(ops.map(|o| mem.load_dense(dtype, o, len).unwrap()));
            }
            for (threads, got) in results.iter().enumerate().skip(1) {
                for (k, name) in ["params", "exp_avg", "exp_avg_sq"].iter().enumerate() {
                    let what = format!(
                        "adam {name} {dtype} len {len} wd {weight_decay} decoupled {decoupled} step {step}, {threads} thread(s)"
                    );
                    check(dtype, &got[k], &results[0][k], &what);
                }
            }
        }
    }

    #[test]
    fn adam_and_adamw_match_the_reference() {
        for len in [1, 7, 2049, 70_001] {
            for (weight_decay, decoupled) in
                [(0.0, false), (0.01, false), (0.05, true), (0.0, true)]
            {
                for step in [1, 3] {
                    check_step(len, weight_decay, decoupled, step);
                }
            }
        }
    }
}
