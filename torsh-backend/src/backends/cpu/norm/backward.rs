//! The gradients of layer norm and batch norm on the CPU, from the statistics the forward saved.
//!
//! Layer norm takes a row per step: one fused pass over the row for its two sums (`Σ g`,
//! `Σ g · xhat` with `g = grad · weight`) and the weight and bias gradients' per-column terms, one
//! more over the same row (still in cache, `g` and `xhat` recomputed rather than stored) for the
//! input gradient, written with streaming stores when it is large ([`worth_streaming`]); threads
//! take blocks of rows, each accumulating its own weight and bias partials, merged in row order.
//! Batch norm takes the per-channel sums `Σ grad` and `Σ grad · (x − mean)` in one pass (by
//! `(sample, channel)` runs, or by samples where the runs are short), then the input gradient in a
//! second. Sums run in the compute type over blocks and in f64 across them, so results do not
//! depend on the thread count.

use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use super::{optional, store, SHORT_RUN};
use crate::backends::cpu::cost::items_per_task;
use crate::backends::cpu::host::{
    for_chunks, with_float, with_simd, Ctx, Element, Real, Span, BLOCK,
};
use crate::backends::cpu::reduce::{acc_of, as_acc_mut, Source};
use crate::backends::cpu::stream::{stream_copy, worth_streaming};
use crate::backends::reference::{memory::HostMemory, norm as reference};
use crate::compute::{BatchNormBackwardDesc, DevicePtr, LayerNormBackwardDesc};
use crate::error::Result;

/// Each task's (first item, partial results), merged in item order.
type Parts<S> = Mutex<Vec<(usize, Vec<S>)>>;

/// Independent accumulators of the sums, to let them vectorise.
const LANES: usize = 16;

/// Rows whose weight and bias terms add up in the compute type before they join the f64 sums.
const ROWS: usize = 64;

/// `Σ a[i] · b[i]` and `Σ a[i]` over equal-length slices, in [`LANES`] accumulators.
#[inline(always)]
fn dot_and_sum<A: Real>(a: &[A], b: &[A]) -> (A, A) {
    let (mut dot, mut sum) = ([A::ZERO; LANES], [A::ZERO; LANES]);
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (xa, xb) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            dot[l] = xa[l].mul_add(xb[l], dot[l]);
            sum[l] += xa[l];
        }
    }
    let (mut d, mut s) = (A::ZERO, A::ZERO);
    for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
        d = x.mul_add(y, d);
        s += x;
    }
    for l in 0..LANES {
        d += dot[l];
        s += sum[l];
    }
    (d, s)
}

/// Writes gradient `values` (f64) to the `[len]` operand at `p`, rounded once.
fn write_f64<T: Element>(
    mem: &mut HostMemory,
    op: &'static str,
    p: DevicePtr,
    values: &[f64],
) -> Result<()> {
    let dst = Span::<T>::of(mem, op, p, values.len())?;
    // SAFETY: no task runs meanwhile and the gradient is a distinct output.
    let dst = unsafe { dst.slice_mut(0..values.len()) };
    for (d, &v) in dst.iter_mut().zip(values) {
        *d = T::narrow(<T::Acc as Real>::from_f64(v));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Layer norm.

/// Layer norm backward's operands.
struct LayerNormGrad<T: Element> {
    dy: Span<T>,
    x: Span<T>,
    w: Option<Span<T>>,
    mean: Span<T::Acc>,
    invstd: Span<T::Acc>,
    dx: Option<Span<T>>,
    cols: usize,
    /// Whether the weight and bias gradients are wanted.
    params: bool,
}

/// The gradients of layer norm over each row of `[rows, cols]`.
pub(crate) fn layer_norm_backward(
    mem: &mut HostMemory,
    d: &LayerNormBackwardDesc,
    ctx: Ctx,
) -> Result<()> {
    if d.rows == 0 || d.cols == 0 {
        return reference::layer_norm_backward(mem, d);
    }
    with_float!(d.dtype, T => layer_norm_typed::<T>(mem, d, ctx), _ => reference::layer_norm_backward(mem, d))
}

/// [`layer_norm_backward`] for element type `T`.
fn layer_norm_typed<T: Element>(
    mem: &mut HostMemory,
    d: &LayerNormBackwardDesc,
    ctx: Ctx,
) -> Result<()>
where
    T::Acc: Element,
{
    const OP: &str = "layer_norm_backward";
    let (rows, cols) = (d.rows, d.cols);
    let n = rows * cols;
    let op = LayerNormGrad {
        dy: Span::<T>::of(mem, OP, d.grad_output, n)?,
        x: Span::<T>::of(mem, OP, d.input, n)?,
        w: optional(mem, OP, d.weight, cols)?,
        mean: Span::of(mem, OP, d.mean, rows)?,
        invstd: Span::of(mem, OP, d.invstd, rows)?,
        dx: optional(mem, OP, d.grad_input, n)?,
        cols,
        params: d.grad_weight.is_some() || d.grad_bias.is_some(),
    };
    // Each task's (first row, weight and bias partial sums).
    let partials: Parts<f64> = Mutex::new(Vec::new());
    let min_rows = items_per_task(cols);
    let stream = worth_streaming(n * std::mem::size_of::<T>());
    for_chunks(rows, ctx.threads, min_rows, |range| {
        let start = range.start;
        let part = with_simd(
            ctx.simd,
            #[inline(always)]
            || layer_norm_rows(&op, range, stream),
        );
        if let Some(part) = part {
            let mut all = partials.lock().unwrap_or_else(PoisonError::into_inner);
            all.push((start, part));
        }
    });
    if op.params {
        let mut parts = partials
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        parts.sort_by_key(|p| p.0);
        let mut total = vec![0.0f64; 2 * cols];
        for (_, part) in &parts {
            for (t, p) in total.iter_mut().zip(part) {
                *t += p;
            }
        }
        if let Some(p) = d.grad_weight {
            write_f64::<T>(mem, OP, p, &total[..cols])?;
        }
        if let Some(p) = d.grad_bias {
            write_f64::<T>(mem, OP, p, &total[cols..])?;
        }
    }
    Ok(())
}

/// The gradients of rows `rows`; returns their weight and bias terms (`[2 · cols]`, f64) when
/// those are wanted. With `stream`, an f32 or f64 input gradient is written a block at a time with
/// streaming stores ([`stream_copy`]).
#[inline(always)]
fn layer_norm_rows<T: Element>(
    op: &LayerNormGrad<T>,
    rows: Range<usize>,
    stream: bool,
) -> Option<Vec<f64>>
where
    T::Acc: Element,
{
    let cols = op.cols;
    let zero = <T::Acc as Real>::ZERO;
    let mut wbuf = Vec::new();
    // SAFETY: the weight is an input; nothing writes it.
    let w = op.w.as_ref().map(|w| unsafe { w.slice(0..cols) });
    // No weight scales like a weight of ones.
    let w = match w {
        Some(w) => acc_of(w, &mut wbuf),
        None => {
            wbuf.resize(cols, <T::Acc as Real>::ONE);
            &wbuf[..]
        }
    };
    let (mut s_dy, mut s_x) = (vec![zero; BLOCK], vec![zero; BLOCK]);
    let mut out = vec![zero; BLOCK];
    // Weight and bias terms: in the compute type for up to ROWS rows, then into f64.
    let (mut acc, mut total) = if op.params {
        (vec![zero; 2 * cols], vec![0.0f64; 2 * cols])
    } else {
        (Vec::new(), Vec::new())
    };
    let flush = |acc: &mut [T::Acc], total: &mut [f64]| {
        for (t, a) in total.iter_mut().zip(acc.iter_mut()) {
            *t += a.to_f64();
            *a = zero;
        }
    };
    for (k, r) in rows.enumerate() {
        // SAFETY: the statistics are inputs.
        let (mean, inv) = unsafe { (op.mean.read(r), op.invstd.read(r)) };
        let base = r * cols;
        // Pass 1: g, xhat, Σ g and Σ g · xhat, and the weight and bias terms.
        let (mut sum_g, mut sum_gx) = (0.0f64, 0.0f64);
        let mut c0 = 0;
        while c0 < cols {
            let len = (cols - c0).min(BLOCK);
            let cs = c0..c0 + len;
            // SAFETY: inputs, only read.
            let (dys, xs) = unsafe {
                (
                    op.dy.load(base + c0, len, &mut s_dy),
                    op.x.load(base + c0, len, &mut s_x),
                )
            };
            let rows = Pass1 {
                dy: dys,
                x: xs,
                w: &w[cs.clone()],
            };
            let (gs, gx) = if op.params {
                let (dw, db) = acc.split_at_mut(cols);
                rows.run(mean, inv, Some((&mut dw[cs.clone()], &mut db[cs])))
            } else {
                rows.run(mean, inv, None)
            };
            sum_g += gs.to_f64();
            sum_gx += gx.to_f64();
            c0 += len;
        }
        if op.params && (k + 1) % ROWS == 0 {
            flush(&mut acc, &mut total);
        }
        let Some(dx) = op.dx else {
            continue;
        };
        // Pass 2, over the row again (in cache): dx = inv · (g − mean(g) − xhat · mean(g · xhat)),
        // g and xhat recomputed, which costs less than keeping them.
        let mean_g = <T::Acc as Real>::from_f64(sum_g / cols as f64);
        let mean_gx = <T::Acc as Real>::from_f64(sum_gx / cols as f64);
        let mut c0 = 0;
        while c0 < cols {
            let len = (cols - c0).min(BLOCK);
            // SAFETY: inputs, only read.
            let (dys, xs) = unsafe {
                (
                    op.dy.load(base + c0, len, &mut s_dy),
                    op.x.load(base + c0, len, &mut s_x),
                )
            };
            let ws = &w[c0..c0 + len];
            let terms = (mean, inv, mean_g, mean_gx);
            // SAFETY: this task owns rows `rows` of the input gradient.
            let ys = unsafe { dx.slice_mut(base + c0..base + c0 + len) };
            match as_acc_mut(ys) {
                Some(ys) if stream => {
                    input_grad(&mut out[..len], (dys, xs, ws), terms);
                    stream_copy(&out[..len], ys);
                }
                _ => store(
                    ys,
                    &mut out,
                    None,
                    #[inline(always)]
                    |ys| input_grad(ys, (dys, xs, ws), terms),
                ),
            }
            c0 += len;
        }
    }
    op.params.then(|| {
        flush(&mut acc, &mut total);
        total
    })
}

/// A block of layer norm's input gradient from its `dy`, `x` and weight and the row's `(mean,
/// invstd, mean(g), mean(g · xhat))`: `invstd · (g − mean(g) − xhat · mean(g · xhat))`.
#[inline(always)]
fn input_grad<A: Real>(
    ys: &mut [A],
    (dy, x, w): (&[A], &[A], &[A]),
    (mean, inv, mg, mgx): (A, A, A, A),
) {
    for (((y, &dy), &x), &w) in ys.iter_mut().zip(dy).zip(x).zip(w) {
        let h = (x - mean) * inv;
        *y = inv * ((dy * w - mg) - h * mgx);
    }
}

/// `xs[i .. i + LANES]` as an array.
#[inline(always)]
fn lanes<A: Copy>(xs: &[A], i: usize) -> [A; LANES] {
    let xs = &xs[i..i + LANES];
    std::array::from_fn(|l| xs[l])
}

/// One block of a layer-norm row in pass 1: its `dy`, `x` and weight, from which it sums
/// `g = dy · w` and `g · xhat` with `xhat = (x − mean) · invstd`.
struct Pass1<'a, A> {
    dy: &'a [A],
    x: &'a [A],
    w: &'a [A],
}

impl<A: Real> Pass1<'_, A> {
    /// Adds `dy · xhat` and `dy` into the weight and bias terms `params` when given, and returns
    /// `(Σ g, Σ g · xhat)`; one fused loop in [`LANES`] accumulators.
    #[inline(always)]
    fn run(self, mean: A, inv: A, mut params: Option<(&mut [A], &mut [A])>) -> (A, A) {
        let (mut sg, mut sgx) = ([A::ZERO; LANES], [A::ZERO; LANES]);
        let n = self.dy.len();
        let whole = n - n % LANES;
        // Whole lanes through local arrays (values, so they vectorise), then the tail one element
        // at a time in lane 0.
        for i in (0..whole).step_by(LANES) {
            let dy = lanes(self.dy, i);
            let (mut h, mut gv) = (lanes(self.x, i), lanes(self.w, i));
            for l in 0..LANES {
                h[l] = (h[l] - mean) * inv;
                gv[l] = dy[l] * gv[l];
                sg[l] += gv[l];
                sgx[l] = gv[l].mul_add(h[l], sgx[l]);
            }
            if let Some((dw, db)) = params.as_mut() {
                let (mut w, mut b) = (lanes(dw, i), lanes(db, i));
                for l in 0..LANES {
                    w[l] = dy[l].mul_add(h[l], w[l]);
                    b[l] += dy[l];
                }
                dw[i..i + LANES].copy_from_slice(&w);
                db[i..i + LANES].copy_from_slice(&b);
            }
        }
        for i in whole..n {
            let (dy, h) = (self.dy[i], (self.x[i] - mean) * inv);
            let gv = dy * self.w[i];
            sg[0] += gv;
            sgx[0] = gv.mul_add(h, sgx[0]);
            if let Some((dw, db)) = params.as_mut() {
                dw[i] = dy.mul_add(h, dw[i]);
                db[i] += dy;
            }
        }
        let (mut a, mut b) = (A::ZERO, A::ZERO);
        for l in 0..LANES {
            a += sg[l];
            b += sgx[l];
        }
        (a, b)
    }
}

// ---------------------------------------------------------------------------------------------
// Batch norm.

/// Batch norm backward's operands.
struct BatchNormGrad<T: Element> {
    dy: Span<T>,
    x: Span<T>,
    /// Per-channel means, in the compute type.
    mean: Vec<T::Acc>,
    n: usize,
    c: usize,
    s: usize,
}

/// The gradients of batch norm of `[batch, channels, spatial]` per channel.
pub(crate) fn batch_norm_backward(
    mem: &mut HostMemory,
    d: &BatchNormBackwardDesc,
    ctx: Ctx,
) -> Result<()> {
    if d.batch == 0 || d.channels == 0 || d.spatial == 0 {
        return reference::batch_norm_backward(mem, d);
    }
    with_float!(d.dtype, T => batch_norm_typed::<T>(mem, d, ctx), _ => reference::batch_norm_backward(mem, d))
}

/// [`batch_norm_backward`] for element type `T`.
fn batch_norm_typed<T: Element>(
    mem: &mut HostMemory,
    d: &BatchNormBackwardDesc,
    ctx: Ctx,
) -> Result<()>
where
    T::Acc: Element,
{
    const OP: &str = "batch_norm_backward";
    let (n, c, s) = (d.batch, d.channels, d.spatial);
    let stat = |mem: &mut HostMemory, p| -> Result<Vec<T::Acc>> {
        let span = Span::<T::Acc>::of(mem, OP, p, c)?;
        // SAFETY: an input, only read.
        Ok(unsafe { span.slice(0..c) }.to_vec())
    };
    let (mean, inv) = (stat(mem, d.mean)?, stat(mem, d.invstd)?);
    let w: Vec<f64> = match optional::<T>(mem, OP, d.weight, c)? {
        // SAFETY: an input, only read.
        Some(w) => unsafe { w.slice(0..c) }
            .iter()
            .map(|v| v.widen().to_f64())
            .collect(),
        None => vec![1.0; c],
    };
    let op = BatchNormGrad {
        dy: Span::<T>::of(mem, OP, d.grad_output, n * c * s)?,
        x: Span::<T>::of(mem, OP, d.input, n * c * s)?,
        mean,
        n,
        c,
        s,
    };
    let need_sums = d.grad_weight.is_some() || d.grad_bias.is_some() || d.training;
    // Per channel: Σ dy and Σ dy · (x − mean).
    let sums = if need_sums {
        channel_sums(&op, ctx)
    } else {
        vec![(0.0, 0.0); c]
    };
    let inv64: Vec<f64> = inv.iter().map(|v| v.to_f64()).collect();
    if let Some(p) = d.grad_weight {
        let dw: Vec<f64> = sums.iter().zip(&inv64).map(|(s, i)| s.1 * i).collect();
        write_f64::<T>(mem, OP, p, &dw)?;
    }
    if let Some(p) = d.grad_bias {
        let db: Vec<f64> = sums.iter().map(|s| s.0).collect();
        write_f64::<T>(mem, OP, p, &db)?;
    }
    let Some(dx) = d.grad_input else {
        return Ok(());
    };
    let dx = Span::<T>::of(mem, OP, dx, n * c * s)?;
    // dx = a · ((dy − k) − (x − mean) · b) per channel: the mean gradient is subtracted before
    // the scale `a` (up to 1/√eps) multiplies, so equal gradients of a constant channel give 0.
    let count = (n * s) as f64;
    let coef: Vec<Coef<T::Acc>> = (0..c)
        .map(|ch| {
            let a = w[ch] * inv64[ch];
            let (b, k) = if d.training {
                (
                    inv64[ch] * inv64[ch] * sums[ch].1 / count,
                    sums[ch].0 / count,
                )
            } else {
                (0.0, 0.0)
            };
            let from = <T::Acc as Real>::from_f64;
            Coef {
                a: from(a),
                b: from(b),
                k: from(k),
                mean: op.mean[ch],
            }
        })
        .collect();
    if s >= SHORT_RUN {
        input_grad_runs(&op, dx, &coef, ctx);
    } else {
        input_grad_rows(&op, dx, &coef, ctx);
    }
    Ok(())
}

/// One channel's input gradient `a · ((dy − k) − (x − mean) · b)`.
#[derive(Clone, Copy, Debug)]
struct Coef<A> {
    a: A,
    b: A,
    k: A,
    mean: A,
}

/// Per channel, `(Σ dy, Σ dy · (x − mean))` over the batch and spatial dims, in f64, folded in
/// sample order.
fn channel_sums<T: Element>(op: &BatchNormGrad<T>, ctx: Ctx) -> Vec<(f64, f64)>
where
    T::Acc: Element,
{
    let (n, c, s) = (op.n, op.c, op.s);
    // Each task's (first item, sums): per run (long runs) or per channel (short runs).
    let parts: Parts<(f64, f64)> = Mutex::new(Vec::new());
    let push = |start: usize, part: Vec<(f64, f64)>| {
        let mut all = parts.lock().unwrap_or_else(PoisonError::into_inner);
        all.push((start, part));
    };
    let long = s >= SHORT_RUN;
    let (items, per_item) = if long { (n * c, s) } else { (n, c * s) };
    let min_items = items_per_task(per_item);
    for_chunks(items, ctx.threads, min_items, |range| {
        let start = range.start;
        let part = with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let zero = <T::Acc as Real>::ZERO;
                let mut bufs = [vec![zero; BLOCK], vec![zero; BLOCK], vec![zero; BLOCK]];
                if long {
                    // A plain loop: a closure here would be compiled without the SIMD features.
                    let mut sums = Vec::with_capacity(range.len());
                    for j in range {
                        sums.push(run_sums(op, j * s, s, j % c, &mut bufs));
                    }
                    sums
                } else {
                    let mut acc = vec![(0.0, 0.0); c];
                    for sample in range {
                        for (ch, a) in acc.iter_mut().enumerate() {
                            let (sd, sdx) = run_sums(op, (sample * c + ch) * s, s, ch, &mut bufs);
                            a.0 += sd;
                            a.1 += sdx;
                        }
                    }
                    acc
                }
            },
        );
        push(start, part);
    });
    let mut parts = parts.into_inner().unwrap_or_else(PoisonError::into_inner);
    parts.sort_by_key(|p| p.0);
    let mut sums = vec![(0.0, 0.0); c];
    if long {
        // Runs in order: run j is sample j / c, channel j % c.
        let runs = parts.into_iter().flat_map(|p| p.1);
        for (j, (sd, sdx)) in runs.enumerate() {
            sums[j % c].0 += sd;
            sums[j % c].1 += sdx;
        }
    } else {
        for (_, part) in parts {
            for (t, p) in sums.iter_mut().zip(part) {
                t.0 += p.0;
                t.1 += p.1;
            }
        }
    }
    sums
}

/// `(Σ dy, Σ dy · (x − mean))` of the `len` values from element `at`, of channel `ch`, through
/// `bufs` (three [`BLOCK`]-long scratch buffers).
#[inline(always)]
fn run_sums<T: Element>(
    op: &BatchNormGrad<T>,
    at: usize,
    len: usize,
    ch: usize,
    bufs: &mut [Vec<T::Acc>; 3],
) -> (f64, f64)
where
    T::Acc: Element,
{
    let [s_dy, s_x, dev] = bufs;
    let mean = op.mean[ch];
    let (mut sd, mut sdx) = (0.0, 0.0);
    let mut i = 0;
    while i < len {
        let l = (len - i).min(BLOCK);
        // SAFETY: inputs, only read.
        let (dys, xs) = unsafe { (op.dy.load(at + i, l, s_dy), op.x.load(at + i, l, s_x)) };
        for (d, &x) in dev[..l].iter_mut().zip(xs) {
            *d = x - mean;
        }
        let (dot, sum) = dot_and_sum(dys, &dev[..l]);
        sd += sum.to_f64();
        sdx += dot.to_f64();
        i += l;
    }
    (sd, sdx)
}

/// The input gradient by `(sample, channel)` runs, split across threads.
fn input_grad_runs<T: Element>(op: &BatchNormGrad<T>, dx: Span<T>, coef: &[Coef<T::Acc>], ctx: Ctx)
where
    T::Acc: Element,
{
    let (c, s) = (op.c, op.s);
    let min_runs = items_per_task(s);
    for_chunks(op.n * c, ctx.threads, min_runs, |runs| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let zero = <T::Acc as Real>::ZERO;
                let (mut s_dy, mut s_x, mut buf) =
                    (vec![zero; BLOCK], vec![zero; BLOCK], vec![zero; BLOCK]);
                for j in runs {
                    let f = coef[j % c];
                    let (mut at, end) = (j * s, (j + 1) * s);
                    while at < end {
                        let len = (end - at).min(BLOCK);
                        // SAFETY: inputs, only read; this task owns runs `runs` of the output.
                        let (dys, xs, ys) = unsafe {
                            (
                                op.dy.load(at, len, &mut s_dy),
                                op.x.load(at, len, &mut s_x),
                                dx.slice_mut(at..at + len),
                            )
                        };
                        store(
                            ys,
                            &mut buf,
                            None,
                            #[inline(always)]
                            |ys| {
                                for ((y, &dy), &x) in ys.iter_mut().zip(dys).zip(xs) {
                                    *y = f.a * ((dy - f.k) - (x - f.mean) * f.b);
                                }
                            },
                        );
                        at += len;
                    }
                }
            },
        )
    });
}

/// The input gradient by samples, with the coefficients expanded along each sample's `c · s`
/// values (short spatial runs).
fn input_grad_rows<T: Element>(op: &BatchNormGrad<T>, dx: Span<T>, coef: &[Coef<T::Acc>], ctx: Ctx)
where
    T::Acc: Element,
{
    let width = op.c * op.s;
    let expand = |f: fn(&Coef<T::Acc>) -> T::Acc| -> Vec<T::Acc> {
        coef.iter()
            .flat_map(|k| std::iter::repeat_n(f(k), op.s))
            .collect()
    };
    let (a, b, k, mean) = (
        expand(|f| f.a),
        expand(|f| f.b),
        expand(|f| f.k),
        expand(|f| f.mean),
    );
    let min_rows = items_per_task(width);
    for_chunks(op.n, ctx.threads, min_rows, |rows| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let zero = <T::Acc as Real>::ZERO;
                let (mut s_dy, mut s_x, mut buf) =
                    (vec![zero; BLOCK], vec![zero; BLOCK], vec![zero; BLOCK]);
                for r in rows {
                    let mut c0 = 0;
                    while c0 < width {
                        let len = (width - c0).min(BLOCK);
                        let at = r * width + c0;
                        // SAFETY: inputs, only read; this task owns rows `rows` of the output.
                        let (dys, xs, ys) = unsafe {
                            (
                                op.dy.load(at, len, &mut s_dy),
                                op.x.load(at, len, &mut s_x),
                                dx.slice_mut(at..at + len),
                            )
                        };
                        let q = c0..c0 + len;
                        let (a, b, k, m) = (&a[q.clone()], &b[q.clone()], &k[q.clone()], &mean[q]);
                        store(
                            ys,
                            &mut buf,
                            None,
                            #[inline(always)]
                            |ys| {
                                for i in 0..ys.len() {
                                    ys[i] = a[i] * ((dys[i] - k[i]) - (xs[i] - m[i]) * b[i]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::cpu::reduce::tests::{check, on_threads, random, upload};
    use crate::compute::stats_dtype;
    use crate::dtype::DType;

    /// Uploads the statistics of `[groups]` random means near `offset` and positive inverse
    /// standard deviations.
    fn stats(
        mem: &mut HostMemory,
        dtype: DType,
        groups: usize,
        seed: u64,
    ) -> (DevicePtr, DevicePtr) {
        let mean: Vec<f64> = random(groups, seed).iter().map(|v| 0.3 * v).collect();
        let inv: Vec<f64> = random(groups, seed + 1)
            .iter()
            .map(|v| 0.5 + v.abs())
            .collect();
        (
            upload(mem, stats_dtype(dtype), &mean),
            upload(mem, stats_dtype(dtype), &inv),
        )
    }

    /// Poisoned (NaN) outputs of `lens` elements.
    fn poisoned(mem: &mut HostMemory, dtype: DType, lens: [usize; 3]) -> [DevicePtr; 3] {
        lens.map(|len| upload(mem, dtype, &vec![f64::NAN; len]))
    }

    fn check_layer_norm(rows: usize, cols: usize, seed: u64) {
        check_layer_norm_in(&DType::FLOATS, rows, cols, seed);
    }

    fn check_layer_norm_in(dtypes: &[DType], rows: usize, cols: usize, seed: u64) {
        for &dtype in dtypes {
            let mut mem = HostMemory::default();
            let dy = upload(&mut mem, dtype, &random(rows * cols, seed));
            let x = upload(&mut mem, dtype, &random(rows * cols, seed + 1));
            let w = upload(&mut mem, dtype, &random(cols, seed + 2));
            let (mean, invstd) = stats(&mut mem, dtype, rows, seed + 3);
            for weight in [None, Some(w)] {
                let lens = [rows * cols, cols, cols];
                let mut results = Vec::new();
                for run in 0..3 {
                    let [gi, gw, gb] = poisoned(&mut mem, dtype, lens);
                    let desc = LayerNormBackwardDesc {
                        dtype,
                        grad_output: dy,
                        input: x,
                        weight,
                        mean,
                        invstd,
                        grad_input: Some(gi),
                        grad_weight: Some(gw),
                        grad_bias: Some(gb),
                        rows,
                        cols,
                    };
                    if run == 0 {
                        reference::layer_norm_backward(&mut mem, &desc).unwrap();
                    } else {
                        on_threads(run, |ctx| layer_norm_backward(&mut mem, &desc, ctx)).unwrap();
                    }
                    results.push([gi, gw, gb].map(|p| {
                        mem.load_dense(dtype, p, if p == gi { rows * cols } else { cols })
                            .unwrap()
                    }));
                }
                for (threads, got) in results.iter().enumerate().skip(1) {
                    for (k, name) in ["input", "weight", "bias"].iter().enumerate() {
                        let what = format!(
                            "layer_norm_backward {name} {dtype} {rows}×{cols} weight {}, {threads} thread(s)",
                            weight.is_some()
                        );
                        check(dtype, &got[k], &results[0][k], &what);
                    }
                }
            }
        }
    }

    #[test]
    fn layer_norm_backward_matches_the_reference() {
        check_layer_norm(1, 1, 1);
        check_layer_norm(3, 7, 2);
        check_layer_norm(67, 129, 3);
        check_layer_norm(2, 2049 + 3, 4);
        check_layer_norm(300, 200, 5);
    }

    #[test]
    fn layer_norm_backward_streams_a_large_input_gradient() {
        // 1031 rows of 4099 (odd, so rows start off the 16-byte alignment): past STREAM_BYTES in
        // f32 and f64.
        let (rows, cols) = (1031, 4099);
        assert!(worth_streaming(rows * cols * 4));
        check_layer_norm_in(&[DType::F32, DType::F64], rows, cols, 6);
    }

    fn check_batch_norm(n: usize, c: usize, s: usize, seed: u64) {
        for dtype in DType::FLOATS {
            let mut mem = HostMemory::default();
            let len = n * c * s;
            let dy = upload(&mut mem, dtype, &random(len, seed));
            let x = upload(&mut mem, dtype, &random(len, seed + 1));
            let w = upload(&mut mem, dtype, &random(c, seed + 2));
            let (mean, invstd) = stats(&mut mem, dtype, c, seed + 3);
            for (weight, training) in [(None, true), (Some(w), true), (Some(w), false)] {
                let mut results = Vec::new();
                for run in 0..3 {
                    let [gi, gw, gb] = poisoned(&mut mem, dtype, [len, c, c]);
                    let desc = BatchNormBackwardDesc {
                        dtype,
                        grad_output: dy,
                        input: x,
                        weight,
                        mean,
                        invstd,
                        grad_input: Some(gi),
                        grad_weight: Some(gw),
                        grad_bias: Some(gb),
                        batch: n,
                        channels: c,
                        spatial: s,
                        training,
                    };
                    if run == 0 {
                        reference::batch_norm_backward(&mut mem, &desc).unwrap();
                    } else {
                        on_threads(run, |ctx| batch_norm_backward(&mut mem, &desc, ctx)).unwrap();
                    }
                    results.push(
                        [(gi, len), (gw, c), (gb, c)]
                            .map(|(p, l)| mem.load_dense(dtype, p, l).unwrap()),
                    );
                }
                for (threads, got) in results.iter().enumerate().skip(1) {
                    for (k, name) in ["input", "weight", "bias"].iter().enumerate() {
                        let what = format!(
                            "batch_norm_backward {name} {dtype} [{n}, {c}, {s}] weight {} training {training}, {threads} thread(s)",
                            weight.is_some()
                        );
                        check(dtype, &got[k], &results[0][k], &what);
                    }
                }
            }
        }
    }

    #[test]
    fn batch_norm_backward_short_runs_match_the_reference() {
        check_batch_norm(2, 3, 1, 10);
        check_batch_norm(7, 5, 3, 11);
        check_batch_norm(3000, 17, 1, 12);
    }

    #[test]
    fn batch_norm_backward_long_runs_match_the_reference() {
        check_batch_norm(4, 3, 33, 13);
        check_batch_norm(16, 5, 200, 14);
        check_batch_norm(2, 2, 70_001, 15);
    }

    #[test]
    fn only_the_asked_gradients_are_written() {
        let dtype = DType::F32;
        let (n, c, s) = (3, 2, 40);
        let mut mem = HostMemory::default();
        let dy = upload(&mut mem, dtype, &random(n * c * s, 1));
        let x = upload(&mut mem, dtype, &random(n * c * s, 2));
        let (mean, invstd) = stats(&mut mem, dtype, c, 3);
        let [_, gw, gb] = poisoned(&mut mem, dtype, [0, c, c]);
        let desc = BatchNormBackwardDesc {
            dtype,
            grad_output: dy,
            input: x,
            weight: None,
            mean,
            invstd,
            grad_input: None,
            grad_weight: Some(gw),
            grad_bias: None,
            batch: n,
            channels: c,
            spatial: s,
            training: true,
        };
        on_threads(2, |ctx| batch_norm_backward(&mut mem, &desc, ctx)).unwrap();
        assert!(mem
            .load_dense(dtype, gw, c)
            .unwrap()
            .iter()
            .all(|v| v.is_finite()));
        assert!(mem
            .load_dense(dtype, gb, c)
            .unwrap()
            .iter()
            .all(|v| v.is_nan()));
    }
}
