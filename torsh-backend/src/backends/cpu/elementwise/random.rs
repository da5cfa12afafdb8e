//! Random fills on the CPU: the crate's counter-based streams, the same values as the reference.

use super::*;
use crate::backends::cpu::cost::TASK_ELEMENTS;

/// Fills with the crate's counter-based streams, bit-identical to the reference: each value in f64,
/// rounded once.
pub(crate) fn random(mem: &mut HostMemory, d: &RandomDesc, ctx: Ctx) -> Result<()> {
    with_float!(d.dtype, T => random_t::<T>(mem, d, ctx), _ => reference::random(mem, d))
}

/// [`random`] for element type `T`.
fn random_t<T: Lanes>(mem: &mut HostMemory, d: &RandomDesc, ctx: Ctx) -> Result<()> {
    let out = Span::<T>::of(mem, "random", d.ptr, d.len)?;
    let seed = d.seed;
    match d.distribution {
        Distribution::Uniform { low, high } => generate(out, ctx, TASK_ELEMENTS / 4, move |i| {
            low + (high - low) * rng::uniform(seed, i)
        }),
        Distribution::Normal { mean, std } => generate(out, ctx, TASK_ELEMENTS / 16, move |i| {
            mean + std * rng::normal(seed, i)
        }),
    }
    Ok(())
}

/// Dropout by the counter-based mask, the reference's values: each kept element times the scale
/// in f64, rounded once; threaded.
pub(crate) fn dropout(mem: &mut HostMemory, d: &DropoutDesc, ctx: Ctx) -> Result<()> {
    with_float!(d.dtype, T => dropout_t::<T>(mem, d, ctx), _ => reference::dropout(mem, d))
}

/// Elements [`dropout_t`] masks at a time: its input widened and its values in f64 stay in L1.
const DROPOUT_RUN: usize = 256;

/// [`dropout`] for element type `T`: runs of [`DROPOUT_RUN`] elements, each widened into a
/// buffer, masked without a branch (a kept element's draw is a coin flip, so a branch would miss
/// half the time) and written back, so that the output may be exactly the input.
fn dropout_t<T: Lanes>(mem: &mut HostMemory, d: &DropoutDesc, ctx: Ctx) -> Result<()> {
    let x = Span::<T>::of(mem, "dropout", d.input, d.len)?;
    let out = Span::<T>::of(mem, "dropout", d.output, d.len)?;
    let (key, t, scale) = (rng::stream_key(d.seed), d.threshold(), d.scale());
    for_chunks(d.len, ctx.threads, TASK_ELEMENTS / 4, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut wide = [<T::Acc as Real>::ZERO; DROPOUT_RUN];
                let mut values = [0.0f64; DROPOUT_RUN];
                for start in range.clone().step_by(DROPOUT_RUN) {
                    let run = start..range.end.min(start + DROPOUT_RUN);
                    let n = run.len();
                    // SAFETY: this task owns `run` of the output, which is either the input's
                    // elements (read here, before the output's slice is made) or overlaps no
                    // input.
                    T::load(unsafe { x.slice(run.clone()) }, &mut wide[..n]);
                    for ((v, &w), i) in values[..n].iter_mut().zip(&wide).zip(start as u64..) {
                        let kept = rng::keyed_bits(key, i) >> 11 >= t;
                        let scaled = w.to_f64() * scale;
                        *v = if kept { scaled } else { 0.0 };
                    }
                    // SAFETY: as above; no slice of the input lives any more.
                    let out = unsafe { out.slice_mut(run) };
                    for (o, &v) in out.iter_mut().zip(&values) {
                        *o = T::from_f64(v);
                    }
                }
            },
        )
    });
    Ok(())
}

impl OpImpl<DropoutDesc> for CpuBackend {
    fn op(&self, desc: &DropoutDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.dropout(desc);
        };
        self.kernel(acc, |mem, ctx| dropout(mem, desc, ctx))
    }
}

/// `out[i] = value(i)` rounded once, threaded in chunks of at least `min_chunk`.
fn generate<T: Lanes>(
    out: Span<T>,
    ctx: Ctx,
    min_chunk: usize,
    value: impl Fn(u64) -> f64 + Copy + Send + Sync,
) {
    for_chunks(out.len(), ctx.threads, min_chunk, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // SAFETY: this task owns `range` of the output.
                let ys = unsafe { out.slice_mut(range.clone()) };
                for (y, i) in ys.iter_mut().zip(range.start as u64..) {
                    *y = T::from_f64(value(i));
                }
            },
        )
    });
}

impl OpImpl<RandomDesc> for CpuBackend {
    fn op(&self, desc: &RandomDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.random(desc);
        };
        self.kernel(acc, |mem, ctx| random(mem, desc, ctx))
    }
}
