//! The input gradients of softmax and log-softmax on the CPU.
//!
//! Over `[outer, axis_len, inner]` along the middle dim, from the output's gradient `g` and the
//! forward's output `y`: `y · (g − Σ g·y)` (softmax) or `g − exp(y) · Σ g` (log-softmax), as the
//! reference computes them. Each row is read twice (its sum, then the output pass), the second
//! time from cache, so the op moves three tensors' bytes once.
//!
//! With `inner == 1` the rows are contiguous and threaded over; a few very long rows are instead
//! split across threads pass by pass (partial sums combined in chunk order, deterministic for a
//! thread count). With `inner > 1` a tile of columns is summed down the axis, then written, threaded
//! over (outer, tile) pairs. Sums run in lanes of the compute type within a [`BLOCK`] and in f64
//! across blocks (per column in f64 on the column path); f16 and bf16 are widened to f32 a block
//! at a time and rounded once.

use super::super::team::{par_for, par_map};

use super::super::elementwise::Lanes;
use super::super::host::{for_chunks, with_float, with_simd, Ahead, Ctx, Real, Span, BLOCK};
use super::super::stream::{stream_copy, worth_streaming};
use super::softmax::{lane_sum, scratch_row, sum_of, widened, Exp, LANES, TILE_BYTES};
use crate::backends::cpu::cost::{items_per_task, TASK_ELEMENTS};
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{memory::HostMemory, norm as reference};
use crate::compute::op::OpImpl;
use crate::compute::{ComputeBackend, SoftmaxBackwardDesc};
use crate::error::Result;

/// The input gradient of softmax or log-softmax of `[outer, axis_len, inner]` along the middle dim.
pub(crate) fn softmax_backward(
    mem: &mut HostMemory,
    d: &SoftmaxBackwardDesc,
    ctx: Ctx,
) -> Result<()> {
    with_float!(d.dtype, T => typed::<T>(mem, d, ctx), _ => reference::softmax_backward(mem, d))
}

/// The operands: `[outer, len, inner]` gradient, forward output and input gradient.
#[derive(Clone, Copy)]
struct Operands<T> {
    g: Span<T>,
    y: Span<T>,
    dx: Span<T>,
    outer: usize,
    len: usize,
    inner: usize,
    log: bool,
}

/// [`softmax_backward`] for element type `T`.
fn typed<T: Lanes>(mem: &mut HostMemory, d: &SoftmaxBackwardDesc, ctx: Ctx) -> Result<()>
where
    T::Acc: Exp,
{
    let op = d.name();
    // The descriptor's checks computed this product without overflow.
    let n = d.outer * d.axis_len * d.inner;
    if n == 0 {
        return Ok(());
    }
    let o = Operands {
        g: Span::<T>::of(mem, op, d.grad_output, n)?,
        y: Span::<T>::of(mem, op, d.output, n)?,
        dx: Span::<T>::of(mem, op, d.grad_input, n)?,
        outer: d.outer,
        len: d.axis_len,
        inner: d.inner,
        log: d.log,
    };
    if d.inner > 1 {
        columns(o, ctx);
    } else if d.outer < 2 * ctx.threads && d.axis_len >= 4 * TASK_ELEMENTS && ctx.threads > 1 {
        for r in 0..d.outer {
            wide_row(o, r, ctx);
        }
    } else {
        rows(o, ctx);
    }
    Ok(())
}

/// Block scratch for widening the two inputs.
struct Scratch<A> {
    g: [A; BLOCK],
    y: [A; BLOCK],
}

impl<A: Real> Scratch<A> {
    #[inline(always)]
    fn new<T: Lanes<Acc = A>>() -> Scratch<A> {
        Scratch {
            g: scratch_row::<T>(),
            y: scratch_row::<T>(),
        }
    }
}

/// `Σ g·y` in `LANES` accumulators, in f64 at the end.
#[inline(always)]
fn dot_of<A: Real>(g: &[A], y: &[A]) -> f64 {
    let ((gc, gt), (yc, yt)) = (g.as_chunks::<LANES>(), y.as_chunks::<LANES>());
    let mut acc = [A::ZERO; LANES];
    for (a, b) in gc.iter().zip(yc) {
        acc = std::array::from_fn(
            #[inline(always)]
            |i| acc[i] + a[i] * b[i],
        );
    }
    let tail = gt.iter().zip(yt).fold(A::ZERO, |s, (&a, &b)| s + a * b);
    lane_sum(acc) + tail.to_f64()
}

/// The row's sum (`Σ g·y`, or `Σ g` for log-softmax) over contiguous `g` and `y`, a block at a
/// time, in f64 across blocks.
#[inline(always)]
fn row_sum<T: Lanes>(g: &[T], y: &[T], log: bool, buf: &mut Scratch<T::Acc>) -> f64 {
    let mut total = 0.0;
    for (gb, yb) in g.chunks(BLOCK).zip(y.chunks(BLOCK)) {
        let ga = widened(gb, &mut buf.g);
        total += if log {
            sum_of(ga, |v| v, Ahead::none())
        } else {
            dot_of(ga, widened(yb, &mut buf.y))
        };
    }
    total
}

/// The output pass over at most [`BLOCK`] elements: `y · (g − s)` or `g − exp(y) · s`, with `s`
/// given per element index by `sum`. With `stream`, an f32 or f64 block is computed into scratch
/// and written with streaming stores ([`stream_copy`]).
#[inline(always)]
fn finish<T: Lanes>(
    g: &[T],
    y: &[T],
    dx: &mut [T],
    buf: &mut Scratch<T::Acc>,
    sum: impl Fn(usize) -> T::Acc,
    (log, stream): (bool, bool),
) where
    T::Acc: Exp,
{
    let out = |j: usize, g: T::Acc, y: T::Acc| {
        if log {
            g - y.vexp() * sum(j)
        } else {
            y * (g - sum(j))
        }
    };
    if let (Some(ga), Some(ya), Some(da)) = (T::as_acc(g), T::as_acc(y), T::as_acc_mut(dx)) {
        if stream {
            let block = &mut buf.g[..da.len()];
            for (j, ((d, &g), &y)) in block.iter_mut().zip(ga).zip(ya).enumerate() {
                *d = out(j, g, y);
            }
            stream_copy(block, da);
            return;
        }
        for (j, ((d, &g), &y)) in da.iter_mut().zip(ga).zip(ya).enumerate() {
            *d = out(j, g, y);
        }
        return;
    }
    let n = g.len();
    T::load(g, &mut buf.g[..n]);
    T::load(y, &mut buf.y[..n]);
    let (gb, yb) = (&mut buf.g[..n], &buf.y[..n]);
    for (j, (g, &y)) in gb.iter_mut().zip(yb).enumerate() {
        *g = out(j, *g, y);
    }
    T::store(gb, dx);
}

/// Every row of `[outer, len]`, threaded over rows.
fn rows<T: Lanes>(o: Operands<T>, ctx: Ctx)
where
    T::Acc: Exp,
{
    let len = o.len;
    let stream = worth_streaming(o.outer * len * std::mem::size_of::<T>());
    for_chunks(o.outer, ctx.threads, items_per_task(len), |rows| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut buf = Scratch::new::<T>();
                for r in rows {
                    let range = r * len..(r + 1) * len;
                    // SAFETY: the output overlaps no input (the checks forbid it), nothing writes
                    // the inputs, and this task owns rows `rows` of the output.
                    let (g, y, dx) = unsafe {
                        (
                            o.g.slice(range.clone()),
                            o.y.slice(range.clone()),
                            o.dx.slice_mut(range),
                        )
                    };
                    let s = <T::Acc as Real>::from_f64(row_sum(g, y, o.log, &mut buf));
                    for ((gb, yb), db) in g
                        .chunks(BLOCK)
                        .zip(y.chunks(BLOCK))
                        .zip(dx.chunks_mut(BLOCK))
                    {
                        finish(gb, yb, db, &mut buf, |_| s, (o.log, stream));
                    }
                }
            },
        )
    });
}

/// Row `r` of `[outer, len]` (a long one), each pass split across the team: partial sums per
/// chunk, combined in chunk order.
fn wide_row<T: Lanes>(o: Operands<T>, r: usize, ctx: Ctx)
where
    T::Acc: Exp,
{
    let len = o.len;
    let chunks = (len / TASK_ELEMENTS).clamp(1, 4 * ctx.threads);
    let chunk = len.div_ceil(chunks).next_multiple_of(BLOCK);
    let part = |c: usize| r * len + c * chunk..r * len + ((c + 1) * chunk).min(len);
    let count = len.div_ceil(chunk);
    let sums: Vec<f64> = par_map(count, |c| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // SAFETY: nothing writes the inputs.
                let (g, y) = unsafe { (o.g.slice(part(c)), o.y.slice(part(c))) };
                row_sum(g, y, o.log, &mut Scratch::new::<T>())
            },
        )
    });
    let s = <T::Acc as Real>::from_f64(sums.iter().sum());
    par_for(count, |c| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // SAFETY: chunk `c` of the output row is written by this task only; the output
                // overlaps no input.
                let (g, y, dx) = unsafe {
                    (
                        o.g.slice(part(c)),
                        o.y.slice(part(c)),
                        o.dx.slice_mut(part(c)),
                    )
                };
                let mut buf = Scratch::new::<T>();
                for ((gb, yb), db) in g
                    .chunks(BLOCK)
                    .zip(y.chunks(BLOCK))
                    .zip(dx.chunks_mut(BLOCK))
                {
                    finish(gb, yb, db, &mut buf, |_| s, (o.log, false));
                }
            },
        )
    });
}

/// `[outer, len, inner]` with `inner > 1`: tiles of columns, each summed down the axis (per column,
/// in f64) and then written, threaded over (outer, tile) pairs.
fn columns<T: Lanes>(o: Operands<T>, ctx: Ctx)
where
    T::Acc: Exp,
{
    let size = std::mem::size_of::<T>().max(1);
    let tile = (TILE_BYTES / (2 * o.len * size))
        .clamp(LANES, BLOCK)
        .min(o.inner);
    let tiles = o.inner.div_ceil(tile);
    let min_tasks = items_per_task(o.len * tile);
    for_chunks(o.outer * tiles, ctx.threads, min_tasks, |tasks| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut s = vec![0.0f64; tile];
                let mut k = vec![<T::Acc as Real>::ZERO; tile];
                let mut buf = Scratch::new::<T>();
                for t in tasks {
                    let (outer, i0) = (t / tiles, (t % tiles) * tile);
                    let w = tile.min(o.inner - i0);
                    let at = |a: usize| (outer * o.len + a) * o.inner + i0;
                    // SAFETY: nothing writes the inputs.
                    let rows = |a: usize| unsafe {
                        (o.g.slice(at(a)..at(a) + w), o.y.slice(at(a)..at(a) + w))
                    };
                    let (s, k) = (&mut s[..w], &mut k[..w]);
                    s.fill(0.0);
                    for a in 0..o.len {
                        let (g, y) = rows(a);
                        let ga = widened(g, &mut buf.g);
                        if o.log {
                            for (sj, &v) in s.iter_mut().zip(ga) {
                                *sj += v.to_f64();
                            }
                        } else {
                            let ya = widened(y, &mut buf.y);
                            for ((sj, &a), &b) in s.iter_mut().zip(ga).zip(ya) {
                                *sj += (a * b).to_f64();
                            }
                        }
                    }
                    for (kj, &sj) in k.iter_mut().zip(s.iter()) {
                        *kj = <T::Acc as Real>::from_f64(sj);
                    }
                    for a in 0..o.len {
                        let (g, y) = rows(a);
                        // SAFETY: this task owns columns `i0..i0 + w` of outer index `outer` of the
                        // output, which overlaps no input.
                        let dx = unsafe { o.dx.slice_mut(at(a)..at(a) + w) };
                        finish(g, y, dx, &mut buf, |j| k[j], (o.log, false));
                    }
                }
            },
        )
    });
}

impl OpImpl<SoftmaxBackwardDesc> for CpuBackend {
    fn op(&self, desc: &SoftmaxBackwardDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.softmax_backward(desc);
        };
        self.kernel(acc, |mem, ctx| softmax_backward(mem, desc, ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::super::softmax::tests::{bound, for_threads, SHAPES};
    use super::*;
    use crate::dtype::DType;
    use crate::rng::HostRng;

    /// Runs the backward of `[outer, len, inner]` from random `g` and a forward output `y` (of
    /// softmax, or log-softmax when `log`) here, into a NaN-poisoned output, and in the reference;
    /// compares by norm-wise relative error within the dtype's bound.
    fn check(shape: (usize, usize, usize), dtype: DType, log: bool, seed: u64, ctx: Ctx) {
        let n = shape.0 * shape.1 * shape.2;
        let mut rng = HostRng::new(seed);
        let g = rng.uniform_vec(n, -2.0, 2.0);
        let x = rng.uniform_vec(n, -4.0, 4.0);
        let mut mem = HostMemory::default();
        let bytes = n * dtype.size_in_bytes();
        let [gp, xp, yp, mine, theirs] = [(); 5].map(|_| mem.alloc(bytes).unwrap());
        mem.store(dtype, gp, &g).unwrap();
        mem.store(dtype, xp, &x).unwrap();
        mem.store(dtype, mine, &vec![f64::NAN; n]).unwrap();
        reference::softmax(
            &mut mem,
            &crate::compute::SoftmaxDesc {
                dtype,
                input: xp,
                output: yp,
                outer: shape.0,
                axis_len: shape.1,
                inner: shape.2,
                log,
            },
        )
        .unwrap();
        let desc = |grad_input| SoftmaxBackwardDesc {
            dtype,
            grad_output: gp,
            output: yp,
            grad_input,
            outer: shape.0,
            axis_len: shape.1,
            inner: shape.2,
            log,
        };
        softmax_backward(&mut mem, &desc(mine), ctx).unwrap();
        reference::softmax_backward(&mut mem, &desc(theirs)).unwrap();
        let got = mem.load_dense(dtype, mine, n).unwrap();
        let want = mem.load_dense(dtype, theirs, n).unwrap();
        let bound = bound(dtype);
        let (mut num, mut den) = (0.0, 0.0);
        for (&a, &b) in got.iter().zip(&want) {
            num += (a - b) * (a - b);
            den += b * b;
        }
        let rel = (num / den.max(f64::MIN_POSITIVE)).sqrt();
        let what = format!("log {log} {dtype} {shape:?} ({} threads)", ctx.threads);
        assert!(rel <= bound, "{what}: relative error {rel:e}");
    }

    #[test]
    fn softmax_backward_matches_the_reference_for_every_shape_and_dtype() {
        for_threads(|ctx| {
            for (i, &shape) in SHAPES.iter().enumerate() {
                for dtype in DType::FLOATS {
                    for log in [false, true] {
                        check(shape, dtype, log, i as u64, ctx);
                    }
                }
            }
        });
    }

    #[test]
    fn outputs_past_the_streaming_size_are_written_with_streaming_stores() {
        // 1031 rows of 4099 (odd, so rows start off the 16-byte alignment): past STREAM_BYTES in
        // f32 and f64.
        let shape = (1031, 4099, 1);
        assert!(super::worth_streaming(shape.0 * shape.1 * 4));
        for_threads(|ctx| {
            for dtype in [DType::F32, DType::F64] {
                check(shape, dtype, false, 7, ctx);
                check(shape, dtype, true, 8, ctx);
            }
        });
    }

    #[test]
    fn long_rows_split_across_threads() {
        let len = 4 * TASK_ELEMENTS + BLOCK + 5;
        for_threads(|ctx| {
            for dtype in [DType::F32, DType::BF16] {
                for log in [false, true] {
                    check((1, len, 1), dtype, log, 3, ctx);
                }
            }
        });
    }
}
