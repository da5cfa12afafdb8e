//! Cross-entropy per sample and its logits' gradient on the CPU, one pass over each row after its
//! maximum and sum.
//!
//! Every target is read and checked first (`IndexOutOfRange` before anything is written). Rows are
//! threaded over; each is read a [`BLOCK`] at a time (widened to f32 for f16 and bf16): its maximum,
//! `Σ exp(x − m)` (and `Σ x` for a smoothed forward) in lanes of the compute type within a block and
//! f64 across blocks, then the loss in f64, or the gradient `w · (p − ε/C)` in the compute type
//! with `w · (1 − ε)` taken from the target's element: f32 and f64 keep `exp(x − m)` in the output
//! from the sum pass and scale it by `w / s` (one exponential a logit); f16 and bf16 recompute
//! `exp(x − lse)` a block at a time and round once.

use super::elementwise::Lanes;
use super::host::{for_chunks, with_float, with_simd, Ahead, Ctx, Real, Span, BLOCK};
use super::norm::{exp_store, max_of, sum_of, widened, Exp};
use crate::backends::cpu::cost::items_per_task;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{index::load_indices, loss as reference, memory::HostMemory};
use crate::compute::op::OpImpl;
use crate::compute::{ComputeBackend, CrossEntropyDesc, StridedBuf};
use crate::error::Result;

/// The losses (forward) or the logits' gradient (backward) of `d`.
pub(crate) fn cross_entropy(mem: &mut HostMemory, d: &CrossEntropyDesc, ctx: Ctx) -> Result<()> {
    with_float!(d.dtype, T => typed::<T>(mem, d, ctx), _ => reference::cross_entropy(mem, d))
}

/// [`cross_entropy`] for element type `T`.
fn typed<T: Lanes>(mem: &mut HostMemory, d: &CrossEntropyDesc, ctx: Ctx) -> Result<()>
where
    T::Acc: Exp,
{
    let op = d.name();
    let targets = load_indices(
        mem,
        d.index_dtype,
        &StridedBuf::contiguous(d.target, &[d.rows]),
    )?;
    let classes: Vec<Option<usize>> = targets
        .iter()
        .map(|&t| d.class_of(t))
        .collect::<Result<_>>()?;
    if d.rows == 0 {
        return Ok(());
    }
    // The descriptor's checks computed this product without overflow.
    let n = d.rows * d.classes;
    let x = Span::<T>::of(mem, op, d.logits, n)?;
    let grad = d
        .grad
        .map(|g| Span::<T>::of(mem, op, g, d.rows))
        .transpose()?;
    let out = Span::<T>::of(mem, op, d.output, if grad.is_some() { n } else { d.rows })?;
    let (c, eps) = (d.classes, d.label_smoothing);
    for_chunks(d.rows, ctx.threads, items_per_task(c), |rows| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut buf = [<T::Acc as Real>::ZERO; BLOCK];
                for r in rows {
                    // SAFETY: the logits are only read; the output overlaps no operand.
                    let xs = unsafe { x.slice(r * c..(r + 1) * c) };
                    match grad {
                        None => {
                            // A `match`, not `map_or`: a closure here is not inlined into
                            // the SIMD-compiled function, and its `mul_add`s become calls.
                            let loss = match classes[r] {
                                Some(t) => row_loss(xs, t, eps, &mut buf),
                                None => 0.0,
                            };
                            // SAFETY: this task owns row `r` of the output.
                            unsafe { out.write(r, T::from_f64(loss)) };
                        }
                        Some(g) => {
                            // SAFETY: this task owns row `r` of the output; `grad` is only read.
                            let (ys, w) = unsafe {
                                (out.slice_mut(r * c..(r + 1) * c), g.slice(r..r + 1)[0])
                            };
                            match classes[r] {
                                Some(t) => row_grad(xs, ys, t, w, eps, &mut buf),
                                None => ys.fill(T::from_f64(0.0)),
                            }
                        }
                    }
                }
            },
        )
    });
    Ok(())
}

/// The row's maximum and `ln Σ exp(x − m)`, and `Σ x` when `total`, a block at a time.
#[inline(always)]
fn row_stats<T: Lanes>(xs: &[T], total: bool, buf: &mut [T::Acc; BLOCK]) -> (T::Acc, f64, f64)
where
    T::Acc: Exp,
{
    let mut m = <T::Acc as Real>::NEG_INFINITY;
    for block in xs.chunks(BLOCK) {
        let v = max_of(widened(block, buf));
        m = if v > m { v } else { m };
    }
    let (mut s, mut sx) = (0.0, 0.0);
    for block in xs.chunks(BLOCK) {
        let xa = widened(block, buf);
        s += sum_of(xa, |v| (v - m).vexp_shifted(), Ahead::none());
        if total {
            sx += sum_of(xa, |v| v, Ahead::none());
        }
    }
    (m, s.ln(), sx)
}

/// The loss of one row whose target is class `t`.
#[inline(always)]
fn row_loss<T: Lanes>(xs: &[T], t: usize, eps: f64, buf: &mut [T::Acc; BLOCK]) -> f64
where
    T::Acc: Exp,
{
    let (m, log_s, sum) = row_stats(xs, eps > 0.0, buf);
    let mut loss = m.to_f64() + log_s;
    if eps < 1.0 {
        loss -= (1.0 - eps) * xs[t].widen().to_f64();
    }
    if eps > 0.0 {
        loss -= eps * sum / xs.len() as f64;
    }
    loss
}

/// The gradient of one row whose target is class `t`, scaled by the row's gradient `w`.
#[inline(always)]
fn row_grad<T: Lanes>(xs: &[T], ys: &mut [T], t: usize, w: T, eps: f64, buf: &mut [T::Acc; BLOCK])
where
    T::Acc: Exp,
{
    let w = w.widen();
    let spread = <T::Acc as Real>::from_f64(eps / xs.len() as f64);
    let hot = <T::Acc as Real>::from_f64(1.0 - eps);
    if let (Some(xa), Some(ya)) = (T::as_acc(xs), T::as_acc_mut(ys)) {
        // f32 and f64: the sum pass stores exp(x − m) in the output, which the next pass scales
        // by w / s while it is in cache, one exponential a logit.
        let m = max_of(xa);
        let k = w * <T::Acc as Real>::from_f64(1.0 / exp_store(xa, m, ya, Ahead::none()));
        let shift = w * spread;
        for y in ya.iter_mut() {
            *y = *y * k - shift;
        }
        ya[t] = ya[t] - w * hot;
        return;
    }
    let (m, log_s, _) = row_stats(xs, false, buf);
    let lse = <T::Acc as Real>::from_f64(m.to_f64() + log_s);
    for (b, (xb, yb)) in xs.chunks(BLOCK).zip(ys.chunks_mut(BLOCK)).enumerate() {
        let len = xb.len();
        let at = t.checked_sub(b * BLOCK).filter(|&j| j < len);
        let grad = |v: T::Acc| w * ((v - lse).vexp() - spread);
        if let (Some(xa), Some(ya)) = (T::as_acc(xb), T::as_acc_mut(yb)) {
            for (y, &v) in ya.iter_mut().zip(xa) {
                *y = grad(v);
            }
            if let Some(j) = at {
                ya[j] = w * (((xa[j] - lse).vexp() - spread) - hot);
            }
            continue;
        }
        let ba = &mut buf[..len];
        T::load(xb, ba);
        let target = at.map(|j| ba[j]);
        for v in ba.iter_mut() {
            *v = grad(*v);
        }
        if let (Some(j), Some(v)) = (at, target) {
            ba[j] = w * (((v - lse).vexp() - spread) - hot);
        }
        T::store(ba, yb);
    }
}

impl OpImpl<CrossEntropyDesc> for CpuBackend {
    fn op(&self, desc: &CrossEntropyDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.cross_entropy(desc);
        };
        self.kernel(acc, |mem, ctx| cross_entropy(mem, desc, ctx))
    }
}
