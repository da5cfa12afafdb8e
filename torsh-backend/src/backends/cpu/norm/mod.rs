//! Softmax (`softmax.rs`) and its gradient (`softmax_backward.rs`), layer norm and batch norm on the CPU.
//!
//! Layer norm and batch norm compute their statistics with the reduction kernels' [`Moments`] (two passes over each block
//! while it is in L1, blocks merged in f64 with Chan's formula; Welford per column where the runs are
//! short), then normalise in the compute type with the mean split into a high and a low part, so a
//! large common offset costs no accuracy. Layer norm is threaded over rows; batch norm over
//! `(sample, channel)` runs or rows for its statistics and its output.

mod backward;
mod softmax;
mod softmax_backward;

pub(super) use softmax::{exp_store, max_of, sum_of, widened, Exp};

use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use super::host::{
    for_chunks, narrow_into, with_float, with_simd, Ctx, Element, Real, Span, BLOCK,
};
use super::reduce::{
    acc_of, as_acc_mut, columns, lane_state, lanes, Grid, Matrices, Moments, Source,
};
use crate::backends::cpu::cost::items_per_task;
use crate::backends::cpu::stream::{on_a_line, worth_streaming, Streamer, BLOCK_BYTES};
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{memory::HostMemory, norm as reference};
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::{
    BatchNormBackwardDesc, BatchNormDesc, DevicePtr, LayerNormBackwardDesc, LayerNormDesc,
};
use crate::error::Result;

/// Spatial sizes below this take batch norm's row-wise paths (per-column statistics, expanded
/// coefficients) instead of one run per `(sample, channel)`.
const SHORT_RUN: usize = 32;

/// A mean split into its nearest compute-type value and the rest, so `(x - hi) - lo` is accurate
/// where `x - mean` rounded to the compute type would not be.
#[derive(Clone, Copy, Debug)]
struct Centre<A> {
    /// The mean rounded to the compute type.
    hi: A,
    /// `mean - hi`, rounded.
    lo: A,
}

impl<A: Real> Centre<A> {
    /// The split of `mean`.
    fn of(mean: f64) -> Centre<A> {
        let hi = A::from_f64(mean);
        let lo = if mean.is_finite() {
            A::from_f64(mean - hi.to_f64())
        } else {
            A::ZERO
        };
        Centre { hi, lo }
    }
}

/// Writes `f(ys)` into `dst`: directly when `T` is its own compute type (with a `streamer`, built
/// in `buf` and streamed out), else through `buf` (at least `dst.len()` long) and one rounding.
#[inline(always)]
fn store<T: Element>(
    dst: &mut [T],
    buf: &mut [T::Acc],
    streamer: Option<&mut Streamer>,
    f: impl FnOnce(&mut [T::Acc]),
) {
    let len = dst.len();
    match (as_acc_mut(dst), streamer) {
        (Some(ys), Some(streamer)) => {
            let b = &mut on_a_line(buf, len)[..len];
            f(b);
            streamer.copy(b, ys);
        }
        (Some(ys), None) => f(ys),
        (None, _) => {
            f(&mut buf[..len]);
            narrow_into(&buf[..len], dst);
        }
    }
}

/// Elements of the blocks an output is written in: [`BLOCK`], or with streaming stores
/// [`BLOCK_BYTES`] of `T` (see [`Streamer::blocks`]).
fn block_len<T>(stream: bool) -> usize {
    if stream {
        (BLOCK_BYTES / std::mem::size_of::<T>()).clamp(1, BLOCK)
    } else {
        BLOCK
    }
}

/// Whether an output of `n` elements of `T` is streamed past the cache: f32 and f64 outputs of
/// [`worth_streaming`] size.
fn streams<T: Element>(n: usize) -> bool {
    std::mem::size_of::<T>() == std::mem::size_of::<T::Acc>()
        && worth_streaming(n * std::mem::size_of::<T>())
}

// ---------------------------------------------------------------------------------------------
// Layer norm.

/// Layer norm's operands.
struct LayerNorm<T: Element> {
    /// `[rows, cols]` input.
    x: Span<T>,
    /// `[rows, cols]` output.
    y: Span<T>,
    /// Optional `[cols]` scale.
    w: Option<Span<T>>,
    /// Optional `[cols]` shift.
    b: Option<Span<T>>,
    /// Row width.
    cols: usize,
    /// Added to the variance.
    eps: f64,
    /// Where each row's mean and inverse standard deviation go, when saved.
    saved: Option<Saved<T::Acc>>,
}

/// A forward's saved statistics, one per row or channel, in the compute type (which is the
/// statistics' dtype, `stats_dtype`).
#[derive(Clone, Copy)]
struct Saved<A> {
    mean: Span<A>,
    invstd: Span<A>,
}

impl<A: Element> Saved<A> {
    /// The `[len]` statistics of `d`'s `mean` and `invstd` pointers, when given.
    fn of(
        mem: &mut HostMemory,
        op: &'static str,
        mean: Option<DevicePtr>,
        invstd: Option<DevicePtr>,
        len: usize,
    ) -> Result<Option<Saved<A>>> {
        match (mean, invstd) {
            (Some(m), Some(i)) => Ok(Some(Saved {
                mean: Span::of(mem, op, m, len)?,
                invstd: Span::of(mem, op, i, len)?,
            })),
            _ => Ok(None),
        }
    }

    /// Writes entry `at`.
    ///
    /// # Safety
    /// `at` is in range and no other task writes it.
    unsafe fn write(&self, at: usize, mean: f64, invstd: f64) {
        let narrow = |v: f64| A::narrow(<A::Acc as Real>::from_f64(v));
        self.mean.write(at, narrow(mean));
        self.invstd.write(at, narrow(invstd));
    }
}

/// Layer norm over each row of `[rows, cols]`.
pub(crate) fn layer_norm(mem: &mut HostMemory, d: &LayerNormDesc, ctx: Ctx) -> Result<()> {
    if d.rows == 0 || d.cols == 0 {
        // No element to normalise; the reference writes the (NaN) statistics of empty rows.
        return reference::layer_norm(mem, d);
    }
    with_float!(d.dtype, T => layer_norm_typed::<T>(mem, d, ctx), _ => reference::layer_norm(mem, d))
}

/// [`layer_norm`] for element type `T`.
fn layer_norm_typed<T: Element>(mem: &mut HostMemory, d: &LayerNormDesc, ctx: Ctx) -> Result<()>
where
    T::Acc: Element,
{
    const OP: &str = "layer_norm";
    let n = d.rows * d.cols;
    let op = LayerNorm {
        x: Span::<T>::of(mem, OP, d.input, n)?,
        y: Span::<T>::of(mem, OP, d.output, n)?,
        w: optional(mem, OP, d.weight, d.cols)?,
        b: optional(mem, OP, d.bias, d.cols)?,
        cols: d.cols,
        eps: d.eps,
        saved: Saved::of(mem, OP, d.saved_mean, d.saved_invstd, d.rows)?,
    };
    let min_rows = items_per_task(d.cols);
    let stream = streams::<T>(n);
    for_chunks(d.rows, ctx.threads, min_rows, |rows| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || layer_norm_rows(&op, rows, stream),
        )
    });
    Ok(())
}

/// The `[len]` operand at `p`, when given.
fn optional<T: Element>(
    mem: &mut HostMemory,
    op: &'static str,
    p: Option<DevicePtr>,
    len: usize,
) -> Result<Option<Span<T>>> {
    p.map(|p| Span::of(mem, op, p, len)).transpose()
}

/// Normalises rows `rows`, with streaming stores when `stream`.
#[inline(always)]
fn layer_norm_rows<T: Element>(op: &LayerNorm<T>, rows: Range<usize>, stream: bool)
where
    T::Acc: Element,
{
    let cols = op.cols;
    let (mut wbuf, mut bbuf) = (Vec::new(), Vec::new());
    // SAFETY: weight and bias are inputs; nothing writes them.
    let w = op.w.as_ref().map(|w| unsafe { w.slice(0..cols) });
    // SAFETY: as above.
    let b = op.b.as_ref().map(|b| unsafe { b.slice(0..cols) });
    let w = w.map(|w| acc_of(w, &mut wbuf));
    let b = b.map(|b| acc_of(b, &mut bbuf));
    let mut scratch = vec![<T::Acc as Real>::ZERO; BLOCK];
    let mut ybuf = vec![<T::Acc as Real>::ZERO; BLOCK];
    let mut streamer = stream.then(Streamer::new);
    let step = block_len::<T>(stream);
    for r in rows {
        let base = r * cols;
        let m: Moments = lane_state(&op.x, base, cols, &mut scratch);
        let centre = Centre::of(m.mean);
        let inv_f64 = 1.0 / (m.variance() + op.eps).sqrt();
        if let Some(saved) = &op.saved {
            // SAFETY: this task owns rows `rows`.
            unsafe { saved.write(r, m.mean, inv_f64) };
        }
        let inv = <T::Acc as Real>::from_f64(inv_f64);
        let mut c0 = 0;
        while c0 < cols {
            let len = (cols - c0).min(step);
            let at = base + c0..base + c0 + len;
            // SAFETY: the input is only read, and the output never overlaps it.
            let xs = unsafe { op.x.load(at.start, len, &mut scratch) };
            // SAFETY: this task owns rows `rows` of the output.
            let ys = unsafe { op.y.slice_mut(at) };
            let (wc, bc) = (w.map(|w| &w[c0..c0 + len]), b.map(|b| &b[c0..c0 + len]));
            store(
                ys,
                &mut ybuf,
                streamer.as_mut(),
                #[inline(always)]
                |ys| normalise_row(xs, ys, centre, inv, wc, bc),
            );
            c0 += len;
        }
    }
}

/// `ys = ((xs - mean) · inv) · w + b`, with `w` and `b` optional.
#[inline(always)]
fn normalise_row<A: Real>(
    xs: &[A],
    ys: &mut [A],
    c: Centre<A>,
    inv: A,
    w: Option<&[A]>,
    b: Option<&[A]>,
) {
    let norm = |x: A| ((x - c.hi) - c.lo) * inv;
    match (w, b) {
        (Some(w), Some(b)) => {
            for (((y, &x), &w), &b) in ys.iter_mut().zip(xs).zip(w).zip(b) {
                *y = norm(x) * w + b;
            }
        }
        (Some(w), None) => {
            for ((y, &x), &w) in ys.iter_mut().zip(xs).zip(w) {
                *y = norm(x) * w;
            }
        }
        (None, Some(b)) => {
            for ((y, &x), &b) in ys.iter_mut().zip(xs).zip(b) {
                *y = norm(x) + b;
            }
        }
        (None, None) => {
            for (y, &x) in ys.iter_mut().zip(xs) {
                *y = norm(x);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Batch norm.

/// One channel's normalisation `y = ((x - centre) · scale) + shift`, in the compute type.
#[derive(Clone, Copy, Debug)]
struct Affine<A> {
    /// The mean.
    centre: Centre<A>,
    /// `weight / √(var + eps)`.
    scale: A,
    /// The bias.
    shift: A,
}

/// Batch norm of `[batch, channels, spatial]` per channel.
pub(crate) fn batch_norm(mem: &mut HostMemory, d: &BatchNormDesc, ctx: Ctx) -> Result<()> {
    if d.batch == 0 || d.channels == 0 || d.spatial == 0 {
        // No element to normalise; training needs more than one value per channel, so no running
        // statistic changes either. The reference writes the saved statistics of inference.
        return reference::batch_norm(mem, d);
    }
    with_float!(d.dtype, T => batch_norm_typed::<T>(mem, d, ctx), _ => reference::batch_norm(mem, d))
}

/// [`batch_norm`] for element type `T`.
fn batch_norm_typed<T: Element>(mem: &mut HostMemory, d: &BatchNormDesc, ctx: Ctx) -> Result<()>
where
    T::Acc: Element,
{
    const OP: &str = "batch_norm";
    let (n, c, s) = (d.batch, d.channels, d.spatial);
    let x = Span::<T>::of(mem, OP, d.input, n * c * s)?;
    let y = Span::<T>::of(mem, OP, d.output, n * c * s)?;
    let w = optional::<T>(mem, OP, d.weight, c)?;
    let b = optional::<T>(mem, OP, d.bias, c)?;
    let rm = optional::<T>(mem, OP, d.running_mean, c)?;
    let rv = optional::<T>(mem, OP, d.running_var, c)?;
    let saved = Saved::<T::Acc>::of(mem, OP, d.saved_mean, d.saved_invstd, c)?;
    let stats: Vec<(f64, f64)> = if d.training {
        let moments = channel_moments(x, n, c, s, ctx);
        if let (Some(rm), Some(rv)) = (rm, rv) {
            update_running(rm, rv, &moments, d.momentum);
        }
        moments.iter().map(|m| (m.mean, m.variance())).collect()
    } else if let (Some(rm), Some(rv)) = (rm, rv) {
        // SAFETY: running statistics are inputs in inference; nothing writes them.
        let (rm, rv) = unsafe { (rm.slice(0..c), rv.slice(0..c)) };
        rm.iter()
            .zip(rv)
            .map(|(m, v)| (m.widen().to_f64(), v.widen().to_f64()))
            .collect()
    } else {
        vec![(0.0, 1.0); c]
    };
    let coefficient = |p: Option<Span<T>>, ch: usize, default: f64| {
        p.map_or(default, |p| {
            // SAFETY: weight and bias are inputs; nothing writes them.
            let v = unsafe { p.slice(ch..ch + 1)[0] };
            v.widen().to_f64()
        })
    };
    let affine: Vec<Affine<T::Acc>> = stats
        .iter()
        .enumerate()
        .map(|(ch, &(mean, var))| {
            let inv = 1.0 / (var + d.eps).sqrt();
            if let Some(saved) = &saved {
                // SAFETY: no task runs meanwhile; the saved statistics are written only here.
                unsafe { saved.write(ch, mean, inv) };
            }
            Affine {
                centre: Centre::of(mean),
                scale: <T::Acc as Real>::from_f64(inv * coefficient(w, ch, 1.0)),
                shift: <T::Acc as Real>::from_f64(coefficient(b, ch, 0.0)),
            }
        })
        .collect();
    if s >= SHORT_RUN {
        normalise_runs(x, y, &affine, n, s, ctx);
    } else {
        normalise_rows(x, y, &affine, n, s, ctx);
    }
    Ok(())
}

/// Per-channel moments over batch and spatial dims, each folded in element order.
fn channel_moments<T: Element>(x: Span<T>, n: usize, c: usize, s: usize, ctx: Ctx) -> Vec<Moments> {
    if s >= SHORT_RUN {
        // One lane per (sample, channel) run; a channel is the fold of its runs over the batch.
        let runs = Mutex::new(vec![Moments::default(); n * c]);
        let emit = |at: usize, states: &[Moments]| {
            let mut runs = runs.lock().unwrap_or_else(PoisonError::into_inner);
            runs[at..at + states.len()].copy_from_slice(states);
        };
        lanes::<T::Acc, Moments, _>(&x, &Grid::new(vec![n * c], vec![s]), s, ctx, &emit);
        let runs = runs.into_inner().unwrap_or_else(PoisonError::into_inner);
        (0..c)
            .map(|ch| fold_moments((0..n).map(|i| runs[i * c + ch])))
            .collect()
    } else {
        // Columns of the `[n, c·s]` matrix; a channel is the fold of its `s` columns.
        let width = c * s;
        let cols = Mutex::new(vec![Moments::default(); width]);
        let emit = |at: usize, _step: usize, states: &[Moments]| {
            let mut cols = cols.lock().unwrap_or_else(PoisonError::into_inner);
            cols[at..at + states.len()].copy_from_slice(states);
        };
        let m = Matrices::dense(Grid::new(Vec::new(), Vec::new()), n, width, width);
        columns::<T::Acc, Moments, _>(&x, &m, ctx, &emit);
        let cols = cols.into_inner().unwrap_or_else(PoisonError::into_inner);
        cols.chunks(s)
            .map(|run| fold_moments(run.iter().copied()))
            .collect()
    }
}

/// The ordered fold of `parts`.
fn fold_moments(parts: impl Iterator<Item = Moments>) -> Moments {
    parts.fold(Moments::default(), |a, b| {
        super::reduce::State::<f64>::merge(a, b)
    })
}

/// `running = (1 - momentum) · running + momentum · batch`, with the unbiased batch variance.
fn update_running<T: Element>(rm: Span<T>, rv: Span<T>, moments: &[Moments], momentum: f64) {
    let c = moments.len();
    // SAFETY: the running statistics are distinct ReadWrite operands (the checks rejected overlap)
    // and no task runs meanwhile; each slice lives alone.
    let (rm, rv) = unsafe { (rm.slice_mut(0..c), rv.slice_mut(0..c)) };
    let old = |v: T| v.widen().to_f64();
    let new = |v: f64| T::narrow(<T::Acc as Real>::from_f64(v));
    for ((m, v), st) in rm.iter_mut().zip(rv.iter_mut()).zip(moments) {
        let unbiased = st.m2 / (st.n - 1.0);
        *m = new((1.0 - momentum) * old(*m) + momentum * st.mean);
        *v = new((1.0 - momentum) * old(*v) + momentum * unbiased);
    }
}

/// Normalises each `(sample, channel)` run of `s` elements, runs split across threads; an output of
/// [`worth_streaming`] size in f32 or f64 with streaming stores.
fn normalise_runs<T: Element>(
    x: Span<T>,
    y: Span<T>,
    affine: &[Affine<T::Acc>],
    n: usize,
    s: usize,
    ctx: Ctx,
) {
    let c = affine.len();
    let min_runs = items_per_task(s);
    let stream = streams::<T>(n * c * s);
    let step = block_len::<T>(stream);
    for_chunks(n * c, ctx.threads, min_runs, |runs| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut scratch = vec![<T::Acc as Real>::ZERO; BLOCK];
                let mut ybuf = vec![<T::Acc as Real>::ZERO; BLOCK];
                let mut streamer = stream.then(Streamer::new);
                for j in runs {
                    let f = affine[j % c];
                    let mut start = j * s;
                    let end = start + s;
                    while start < end {
                        let len = (end - start).min(step);
                        // SAFETY: the input is only read, and the output never overlaps it.
                        let xs = unsafe { x.load(start, len, &mut scratch) };
                        // SAFETY: this task owns runs `runs` of the output.
                        let ys = unsafe { y.slice_mut(start..start + len) };
                        store(
                            ys,
                            &mut ybuf,
                            streamer.as_mut(),
                            #[inline(always)]
                            |ys| {
                                for (y, &x) in ys.iter_mut().zip(xs) {
                                    *y = ((x - f.centre.hi) - f.centre.lo) * f.scale + f.shift;
                                }
                            },
                        );
                        start += len;
                    }
                }
            },
        )
    });
}

/// Normalises each sample's `c · s` row with per-column coefficients (short spatial runs), rows
/// split across threads; an output of [`worth_streaming`] size in f32 or f64 with streaming stores.
fn normalise_rows<T: Element>(
    x: Span<T>,
    y: Span<T>,
    affine: &[Affine<T::Acc>],
    n: usize,
    s: usize,
    ctx: Ctx,
) {
    let width = affine.len() * s;
    let expand = |f: fn(&Affine<T::Acc>) -> T::Acc| -> Vec<T::Acc> {
        affine
            .iter()
            .flat_map(|a| std::iter::repeat_n(f(a), s))
            .collect()
    };
    let (hi, lo) = (expand(|a| a.centre.hi), expand(|a| a.centre.lo));
    let (scale, shift) = (expand(|a| a.scale), expand(|a| a.shift));
    let min_rows = items_per_task(width);
    let stream = streams::<T>(n * width);
    let step = block_len::<T>(stream);
    for_chunks(n, ctx.threads, min_rows, |rows| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut scratch = vec![<T::Acc as Real>::ZERO; BLOCK];
                let mut ybuf = vec![<T::Acc as Real>::ZERO; BLOCK];
                let mut streamer = stream.then(Streamer::new);
                for r in rows {
                    let mut c0 = 0;
                    while c0 < width {
                        let len = (width - c0).min(step);
                        let start = r * width + c0;
                        // SAFETY: the input is only read, and the output never overlaps it.
                        let xs = unsafe { x.load(start, len, &mut scratch) };
                        // SAFETY: this task owns rows `rows` of the output.
                        let ys = unsafe { y.slice_mut(start..start + len) };
                        let k = c0..c0 + len;
                        let coef = (&hi[k.clone()], &lo[k.clone()], &scale[k.clone()], &shift[k]);
                        store(
                            ys,
                            &mut ybuf,
                            streamer.as_mut(),
                            #[inline(always)]
                            |ys| {
                                let it = ys.iter_mut().zip(xs).zip(coef.0).zip(coef.1);
                                for ((((y, &x), &h), &l), (&a, &b)) in
                                    it.zip(coef.2.iter().zip(coef.3))
                                {
                                    *y = ((x - h) - l) * a + b;
                                }
                            },
                        );
                        c0 += len;
                    }
                }
            },
        )
    });
}

impl OpImpl<LayerNormBackwardDesc> for CpuBackend {
    fn op(&self, desc: &LayerNormBackwardDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.layer_norm_backward(desc);
        };
        self.kernel(acc, |mem, ctx| {
            backward::layer_norm_backward(mem, desc, ctx)
        })
    }
}

impl OpImpl<BatchNormBackwardDesc> for CpuBackend {
    fn op(&self, desc: &BatchNormBackwardDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.batch_norm_backward(desc);
        };
        self.kernel(acc, |mem, ctx| {
            backward::batch_norm_backward(mem, desc, ctx)
        })
    }
}

impl OpImpl<LayerNormDesc> for CpuBackend {
    fn op(&self, desc: &LayerNormDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.layer_norm(desc);
        };
        self.kernel(acc, |mem, ctx| layer_norm(mem, desc, ctx))
    }
}

impl OpImpl<BatchNormDesc> for CpuBackend {
    fn op(&self, desc: &BatchNormDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.batch_norm(desc);
        };
        self.kernel(acc, |mem, ctx| batch_norm(mem, desc, ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::cpu::reduce::tests::{check, on_threads, random, upload};
    use crate::dtype::DType;

    /// Layer norm of `rows × cols` values (offset by `offset`) against the reference, with every
    /// combination of weight and bias, on `dtypes` with 1 and 2 threads.
    fn check_layer_norm(
        rows: usize,
        cols: usize,
        offset: f64,
        eps: f64,
        seed: u64,
        dtypes: &[DType],
    ) {
        let x: Vec<f64> = random(rows * cols, seed)
            .iter()
            .map(|v| v + offset)
            .collect();
        let (w, b) = (random(cols, seed + 1), random(cols, seed + 2));
        for &dtype in dtypes {
            let mut mem = HostMemory::default();
            let xp = upload(&mut mem, dtype, &x);
            let wp = upload(&mut mem, dtype, &w);
            let bp = upload(&mut mem, dtype, &b);
            for (weight, bias) in [
                (None, None),
                (Some(wp), None),
                (None, Some(bp)),
                (Some(wp), Some(bp)),
            ] {
                let desc = |output| LayerNormDesc {
                    dtype,
                    input: xp,
                    weight,
                    bias,
                    output,
                    rows,
                    cols,
                    eps,
                    saved_mean: None,
                    saved_invstd: None,
                };
                let bytes = rows * cols * dtype.size_in_bytes();
                let want_ptr = mem.alloc(bytes).unwrap();
                reference::layer_norm(&mut mem, &desc(want_ptr)).unwrap();
                let want = mem.load_dense(dtype, want_ptr, rows * cols).unwrap();
                for threads in [1, 2] {
                    let got_ptr = mem.alloc(bytes).unwrap();
                    on_threads(threads, |ctx| layer_norm(&mut mem, &desc(got_ptr), ctx)).unwrap();
                    let got = mem.load_dense(dtype, got_ptr, rows * cols).unwrap();
                    let what = format!(
                        "layer_norm {dtype} {rows}×{cols}+{offset} w {} b {}, {threads} thread(s)",
                        weight.is_some(),
                        bias.is_some()
                    );
                    check(dtype, &got, &want, &what);
                    mem.free(got_ptr).unwrap();
                }
            }
        }
    }

    #[test]
    fn layer_norm_matches_the_reference() {
        let all = DType::FLOATS;
        check_layer_norm(1, 1, 0.0, 1e-5, 1, &all);
        check_layer_norm(3, 7, 0.0, 1e-5, 2, &all);
        check_layer_norm(5, 2049, 0.0, 0.1, 3, &all);
        check_layer_norm(41, 1000, 0.0, 1e-5, 4, &all);
        check_layer_norm(2, 70_001, 0.0, 1e-5, 5, &all);
    }

    #[test]
    fn layer_norm_keeps_accuracy_under_a_large_offset() {
        // The compute-type kernels; in f64 the reference's own serial mean is the larger error here.
        let narrow = [DType::F32, DType::F16, DType::BF16];
        check_layer_norm(9, 3000, 1000.0, 1e-5, 6, &narrow);
    }

    /// Batch norm of `[n, c, s]` against the reference in training (with and without running
    /// statistics) and inference, with and without weight and bias, on every float dtype with 1 and
    /// 2 threads; compares the output and the running statistics.
    fn check_batch_norm(n: usize, c: usize, s: usize, seed: u64, dtypes: &[DType]) {
        let x: Vec<f64> = random(n * c * s, seed)
            .iter()
            .map(|v| 3.0 * v + 0.5)
            .collect();
        let (w, b, rm) = (
            random(c, seed + 1),
            random(c, seed + 2),
            random(c, seed + 3),
        );
        let rv: Vec<f64> = random(c, seed + 4).iter().map(|v| 1.0 + v.abs()).collect();
        for &dtype in dtypes {
            let mut mem = HostMemory::default();
            let xp = upload(&mut mem, dtype, &x);
            let wp = upload(&mut mem, dtype, &w);
            let bp = upload(&mut mem, dtype, &b);
            for (training, running, affine) in [
                (true, true, true),
                (true, false, false),
                (true, true, false),
                (false, true, true),
                (false, true, false),
            ] {
                let mut results = Vec::new();
                for run in 0..3 {
                    // Run 0 is the reference; runs 1 and 2 use 1 and 2 threads.
                    let rmp = upload(&mut mem, dtype, &rm);
                    let rvp = upload(&mut mem, dtype, &rv);
                    let out = mem.alloc(n * c * s * dtype.size_in_bytes()).unwrap();
                    let desc = BatchNormDesc {
                        dtype,
                        input: xp,
                        output: out,
                        batch: n,
                        channels: c,
                        spatial: s,
                        weight: affine.then_some(wp),
                        bias: affine.then_some(bp),
                        running_mean: running.then_some(rmp),
                        running_var: running.then_some(rvp),
                        training,
                        momentum: 0.3,
                        eps: 1e-5,
                        saved_mean: None,
                        saved_invstd: None,
                    };
                    if run == 0 {
                        reference::batch_norm(&mut mem, &desc).unwrap();
                    } else {
                        on_threads(run, |ctx| batch_norm(&mut mem, &desc, ctx)).unwrap();
                    }
                    results.push([
                        mem.load_dense(dtype, out, n * c * s).unwrap(),
                        mem.load_dense(dtype, rmp, c).unwrap(),
                        mem.load_dense(dtype, rvp, c).unwrap(),
                    ]);
                }
                for (threads, got) in results.iter().enumerate().skip(1) {
                    for (k, name) in ["out", "running_mean", "running_var"].iter().enumerate() {
                        let what = format!(
                            "batch_norm {name} {dtype} [{n}, {c}, {s}] training {training} running {running} affine {affine}, {threads} thread(s)"
                        );
                        check(dtype, &got[k], &results[0][k], &what);
                    }
                }
            }
        }
    }

    #[test]
    fn batch_norm_short_runs_match_the_reference() {
        check_batch_norm(2, 3, 1, 10, &DType::FLOATS);
        check_batch_norm(7, 3, 1, 11, &DType::FLOATS);
        check_batch_norm(5, 3, 12, 12, &DType::FLOATS);
        check_batch_norm(3000, 17, 1, 13, &DType::FLOATS);
    }

    #[test]
    fn batch_norm_long_runs_match_the_reference() {
        check_batch_norm(4, 3, 100, 14, &DType::FLOATS);
        check_batch_norm(64, 5, 200, 15, &DType::FLOATS);
        check_batch_norm(3, 2, 70_001, 16, &DType::FLOATS);
    }

    #[test]
    fn streamed_norm_outputs_match_the_reference() {
        // Outputs just past the streaming size in f32 and f64, odd lengths throughout: layer norm
        // rows, batch norm's long (sample, channel) runs and its short-run rows.
        let wide = [DType::F32, DType::F64];
        assert!(streams::<f32>(1027 * 4099) && streams::<f64>(1027 * 4099));
        check_layer_norm(1027, 4099, 0.0, 1e-5, 7, &wide);
        check_batch_norm(2, 3, 700_001, 17, &wide);
        check_batch_norm(140_001, 5, 6, 18, &wide);
        assert!(streams::<f32>(140_001 * 5 * 6) && !streams::<half::bf16>(1 << 24));
    }
}
