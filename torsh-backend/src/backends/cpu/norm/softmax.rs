//! Softmax and log-softmax on the CPU.
//!
//! The input is `[outer, axis_len, inner]`, reduced along the middle dim as the reference does:
//! `m = max` (NaN ignored, as `f64::max` does), `s = Σ exp(x − m)`, then `exp(x − m)/s` or
//! `x − m − ln s`. A row holding NaN or +∞ (and a row of −∞ only) therefore comes out all NaN, and a
//! −∞ entry gives 0 (softmax) or −∞ (log-softmax), exactly like the reference.
//!
//! With `inner == 1` every row is contiguous: one pass for the max, one that stores `exp(x − m)` and
//! sums it, one that scales (log-softmax: sum only, then one pass writing `x − m − ln s`), threaded
//! over rows, each row prefetching the next during its exponentials (for an output of 16 MiB and
//! more, f32 and f64 rows store `exp(x − m)` in a scratch row and the last pass streams the scaled
//! row past the cache, `cpu/stream.rs`); f32 and f64 rows past
//! [`LONG_ROW_BYTES`] take each block's own max and sum while it is in cache and are scaled block
//! by block ([`long_row`]); a few very long rows are instead split across threads pass by pass
//! when there are fewer than two per thread. With `inner > 1`
//! the kernel vectorises across `inner`: a tile of columns is reduced down the axis in three passes
//! (max, sum, output) that stay in cache. f32 uses `vmath::exp_nonpositive_f32` (the arguments
//! `x − m` are never positive; terms below 2⁻¹²⁶ of the row's largest flush to 0), f64 the
//! standard library's `exp`; sums run in lanes of the compute type within a [`BLOCK`] and in f64
//! across blocks, so long rows lose no accuracy. f16 and bf16 are widened to f32 per row (or tile
//! row) and rounded once; a row whose f32 copy would pass [`LONG_ROW_BYTES`] is widened a block
//! at a time instead ([`long_widened_row`]), so no scratch grows with the row's length.

use super::super::team::{par_for, par_map};

use super::super::accumulators::pairwise;
use super::super::elementwise::Lanes;
use super::super::host::{for_chunks, with_float, with_simd, Ahead, Ctx, Real, Span, BLOCK};
use super::super::vmath;
use crate::backends::cpu::cost::{items_per_task, TASK_ELEMENTS};
use crate::backends::cpu::stream::{on_a_line, worth_streaming, Streamer};
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{memory::HostMemory, norm as reference};
use crate::compute::op::OpImpl;
use crate::compute::{ComputeBackend, SoftmaxDesc};
use crate::error::Result;

/// Independent accumulators per reduction: four AVX-512 registers of f32.
pub(super) const LANES: usize = 64;

/// Bytes of input one column tile of the `inner > 1` path spans (it is read three times).
pub(super) const TILE_BYTES: usize = 128 * 1024;

/// The compute type's exponential: vectorisable for f32, the standard library's for f64.
pub(in crate::backends::cpu) trait Exp: Real {
    /// eˢᵉˡᶠ.
    fn vexp(self) -> Self;

    /// eˢᵉˡᶠ for a softmax's shifted argument `x − max ≤ 0` (or NaN): in f32 a cheaper kernel whose
    /// results below 2⁻¹²⁶ flush towards 0 and whose positive arguments past 88 give unspecified
    /// results ([`vmath::exp_nonpositive_f32`]); in f64 the same as [`Exp::vexp`].
    fn vexp_shifted(self) -> Self;
}

impl Exp for f32 {
    #[inline(always)]
    fn vexp(self) -> f32 {
        vmath::exp_f32(self)
    }

    #[inline(always)]
    fn vexp_shifted(self) -> f32 {
        vmath::exp_nonpositive_f32(self)
    }
}

impl Exp for f64 {
    #[inline(always)]
    fn vexp(self) -> f64 {
        self.exp()
    }

    #[inline(always)]
    fn vexp_shifted(self) -> f64 {
        self.exp()
    }
}

/// Softmax or log-softmax of `[outer, axis_len, inner]` along the middle dim.
pub(crate) fn softmax(mem: &mut HostMemory, d: &SoftmaxDesc, ctx: Ctx) -> Result<()> {
    with_float!(d.dtype, T => typed::<T>(mem, d, ctx), _ => reference::softmax(mem, d))
}

/// [`softmax`] for element type `T`.
fn typed<T: Lanes>(mem: &mut HostMemory, d: &SoftmaxDesc, ctx: Ctx) -> Result<()>
where
    T::Acc: Exp,
{
    let op = if d.log { "log_softmax" } else { "softmax" };
    // The descriptor's checks computed this product without overflow.
    let n = d.outer * d.axis_len * d.inner;
    if n == 0 {
        return Ok(());
    }
    let x = Span::<T>::of(mem, op, d.input, n)?;
    let y = Span::<T>::of(mem, op, d.output, n)?;
    let shape = Shape {
        outer: d.outer,
        len: d.axis_len,
        inner: d.inner,
        log: d.log,
    };
    if d.inner > 1 {
        columns(x, y, shape, ctx);
    } else if d.outer < 2 * ctx.threads && d.axis_len >= 4 * TASK_ELEMENTS && ctx.threads > 1 {
        for r in 0..d.outer {
            wide_row(x, y, r, shape, ctx);
        }
    } else {
        rows(x, y, shape, ctx);
    }
    Ok(())
}

/// The problem: `[outer, len, inner]`, and which function.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Product of the dims before the axis.
    outer: usize,
    /// Length of the axis.
    len: usize,
    /// Product of the dims after the axis.
    inner: usize,
    /// Log-softmax.
    log: bool,
}

// Reductions over a slice, in `LANES` independent accumulators.

/// The largest element of `xs` (−∞ when empty), ignoring NaN.
///
/// The accumulators are only ever indexed by constants (the tail is padded to a whole block of
/// lanes with −∞), so LLVM keeps them in vector registers: a tail loop over a prefix of them made
/// it keep them on the stack behind masked stores, which do not forward to the next iteration's
/// loads.
#[inline(always)]
pub(in crate::backends::cpu) fn max_of<A: Real>(xs: &[A]) -> A {
    let greater = |m: A, v: A| if v > m { v } else { m };
    let (chunks, tail) = xs.as_chunks::<LANES>();
    let mut acc = [A::NEG_INFINITY; LANES];
    for c in chunks {
        acc = std::array::from_fn(
            #[inline(always)]
            |i| greater(acc[i], c[i]),
        );
    }
    if !tail.is_empty() {
        let p = padded(tail, A::NEG_INFINITY);
        acc = std::array::from_fn(
            #[inline(always)]
            |i| greater(acc[i], p[i]),
        );
    }
    // Pairwise: a fold over the lanes would be a chain of `LANES` dependent compares, which costs
    // more than the row itself for short rows. The lanes hold no NaN (a NaN never replaces a
    // lane), so the order does not change the result.
    pairwise(acc, greater)
}

/// Bytes of `ahead` prefetched per chunk of [`LANES`] elements of `A` in the exponential passes:
/// as many as the chunk holds, so that a row of the same type is prefetched in one pass over
/// another.
fn ahead_step<A>() -> usize {
    LANES * std::mem::size_of::<A>()
}

/// `Σ f(x)` over `xs`: in `LANES` accumulators of `A` within each [`BLOCK`], in f64 across blocks.
/// `ahead` is prefetched as the loop goes (see [`exp_store`]).
#[inline(always)]
pub(in crate::backends::cpu) fn sum_of<A: Real>(
    xs: &[A],
    f: impl Fn(A) -> A,
    mut ahead: Ahead,
) -> f64 {
    let mut total = 0.0;
    for block in xs.chunks(BLOCK) {
        let (chunks, tail) = block.as_chunks::<LANES>();
        let mut acc = [A::ZERO; LANES];
        for c in chunks {
            ahead.step(ahead_step::<A>());
            acc = std::array::from_fn(
                #[inline(always)]
                |i| acc[i] + f(c[i]),
            );
        }
        if let Some(&first) = tail.first() {
            // A whole block of lanes, the unused ones masked: a scalar tail loop would cost
            // more than the vectors for short rows (a row of 62 is all tail).
            let p = padded(tail, first);
            acc = std::array::from_fn(
                #[inline(always)]
                |i| acc[i] + if i < tail.len() { f(p[i]) } else { A::ZERO },
            );
        }
        total += lane_sum(acc);
    }
    total
}

/// `exp(c[i] − m)` for a chunk.
#[inline(always)]
fn exp_chunk<A: Exp>(c: &[A; LANES], m: A) -> [A; LANES] {
    std::array::from_fn(
        #[inline(always)]
        |i| (c[i] - m).vexp_shifted(),
    )
}

/// `acc[i] + e[i]` for the first `n` lanes, `acc[i]` for the rest.
#[inline(always)]
fn add_lanes<A: Real>(acc: [A; LANES], e: &[A; LANES], n: usize) -> [A; LANES] {
    std::array::from_fn(
        #[inline(always)]
        |i| acc[i] + if i < n { e[i] } else { A::ZERO },
    )
}

/// `ys[i] = exp(xs[i] − m)` (`ys` as long as `xs`), returning the sum as [`sum_of`] does.
///
/// `ahead` (often the next row) is prefetched a chunk's bytes per chunk of `xs`, so that the next
/// pass over it finds it in cache: this pass is arithmetic-bound, and the memory system would
/// otherwise be idle during it (a row's max pass, which reads it from memory, then took a third
/// of a softmax over 4096 × 4096).
#[inline(always)]
pub(in crate::backends::cpu) fn exp_store<A: Exp>(
    xs: &[A],
    m: A,
    ys: &mut [A],
    mut ahead: Ahead,
) -> f64 {
    let mut total = 0.0;
    for (xb, yb) in xs.chunks(BLOCK).zip(ys.chunks_mut(BLOCK)) {
        let ((xc, tail), (yc, yt)) = (xb.as_chunks::<LANES>(), yb.as_chunks_mut::<LANES>());
        let mut acc = [A::ZERO; LANES];
        for (xc, yc) in xc.iter().zip(yc) {
            ahead.step(ahead_step::<A>());
            let e = exp_chunk(xc, m);
            acc = add_lanes(acc, &e, LANES);
            *yc = e;
        }
        if !tail.is_empty() {
            let e = exp_chunk(&padded(tail, m), m);
            acc = add_lanes(acc, &e, tail.len());
            yt.copy_from_slice(&e[..tail.len()]);
        }
        total += lane_sum(acc);
    }
    total
}

/// `xs[i] = exp(xs[i] − m)`, returning the sum as [`sum_of`] does; `ahead` is prefetched as
/// [`exp_store`] does.
#[inline(always)]
fn exp_in_place<A: Exp>(xs: &mut [A], m: A, mut ahead: Ahead) -> f64 {
    let mut total = 0.0;
    for block in xs.chunks_mut(BLOCK) {
        let (chunks, tail) = block.as_chunks_mut::<LANES>();
        let mut acc = [A::ZERO; LANES];
        for c in chunks {
            ahead.step(ahead_step::<A>());
            let e = exp_chunk(c, m);
            acc = add_lanes(acc, &e, LANES);
            *c = e;
        }
        if !tail.is_empty() {
            let e = exp_chunk(&padded(tail, m), m);
            acc = add_lanes(acc, &e, tail.len());
            let len = tail.len();
            tail.copy_from_slice(&e[..len]);
        }
        total += lane_sum(acc);
    }
    total
}

/// `tail` (at most [`LANES`] long) in a whole block of lanes, the rest filled with `fill`.
#[inline(always)]
fn padded<A: Real>(tail: &[A], fill: A) -> [A; LANES] {
    let mut p = [fill; LANES];
    p[..tail.len()].copy_from_slice(tail);
    p
}

/// Pairwise sum of the accumulators, in f64.
#[inline(always)]
pub(super) fn lane_sum<A: Real>(acc: [A; LANES]) -> f64 {
    pairwise(
        std::array::from_fn(
            #[inline(always)]
            |i| acc[i].to_f64(),
        ),
        #[inline(always)]
        |a, b| a + b,
    )
}

/// `xs` in the compute type: itself for f32 and f64, else widened into `buf` (at least as long).
#[inline(always)]
pub(in crate::backends::cpu) fn widened<'a, T: Lanes>(
    xs: &'a [T],
    buf: &'a mut [T::Acc],
) -> &'a [T::Acc] {
    match T::as_acc(xs) {
        Some(a) => a,
        None => {
            let b = &mut buf[..xs.len()];
            T::load(xs, b);
            b
        }
    }
}

// inner == 1: contiguous rows.

/// Every row of `[outer, len]`, threaded over rows; an output of [`worth_streaming`] size is
/// written with streaming stores (rows of f32 and f64 up to [`LONG_ROW_BYTES`]).
fn rows<T: Lanes>(x: Span<T>, y: Span<T>, sh: Shape, ctx: Ctx)
where
    T::Acc: Exp,
{
    let len = sh.len;
    let stream = T::DIRECT && worth_streaming(sh.outer * len * std::mem::size_of::<T>());
    for_chunks(sh.outer, ctx.threads, items_per_task(len), |rows| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // A row whose compute-type copy passes `LONG_ROW_BYTES` takes `long_row` (f32,
                // f64) or `long_widened_row` (half types), which need no row of scratch (zeroing
                // one would cost as much as a pass over the row).
                let long = len * std::mem::size_of::<T::Acc>() > LONG_ROW_BYTES;
                let staged = !long && (!T::DIRECT || stream);
                // The row starts on a 64-byte line: the exponential pass's vector stores and the
                // scaling pass's loads then never straddle two lines.
                let line = 64 / std::mem::size_of::<T::Acc>();
                let mut buf = vec![<T::Acc as Real>::ZERO; if staged { len + line } else { 0 }];
                let buf = on_a_line(&mut buf, len);
                let mut block = scratch_row::<T>();
                let mut streamer = stream.then(Streamer::new);
                let last = rows.end.saturating_sub(1);
                for r in rows {
                    let range = r * len..(r + 1) * len;
                    // SAFETY: input and output do not overlap (the checks forbid it) and this task owns
                    // rows `rows` of the output; nothing writes the input.
                    let (xs, ys) = unsafe { (x.slice(range.clone()), y.slice_mut(range)) };
                    let next = if r < last {
                        // SAFETY: as above; row `r + 1` is only read.
                        unsafe { x.slice((r + 1) * len..(r + 2) * len) }
                    } else {
                        &[]
                    };
                    let out = streamer.as_mut().map(|s| (s, &mut block[..]));
                    row(xs, ys, next, buf, sh.log, out);
                }
            },
        )
    });
}

/// One row: straight from `xs` into `ys` for f32 and f64, through `buf` (the row's length) for
/// the half types up to [`LONG_ROW_BYTES`] of f32 (`buf` may be empty past it). `next` (the next
/// row, or empty) is prefetched during the exponential pass.
/// With a streamer and its block buffer (f32 and f64, `buf` the row's length), the output is
/// built in `buf` and the final pass streams it out.
#[inline(always)]
fn row<T: Lanes>(
    xs: &[T],
    ys: &mut [T],
    next: &[T],
    buf: &mut [T::Acc],
    log: bool,
    stream: Option<(&mut Streamer, &mut [T::Acc])>,
) where
    T::Acc: Exp,
{
    let ahead = Ahead::new(next);
    if let (Some(xa), Some(ya)) = (T::as_acc(xs), T::as_acc_mut(ys)) {
        if std::mem::size_of_val(xa) > LONG_ROW_BYTES {
            return long_row(xa, ya, log);
        }
        let m = max_of(xa);
        if log {
            let s = sum_of(xa, |v| (v - m).vexp_shifted(), ahead);
            let c = <T::Acc as Real>::from_f64(s.ln());
            match stream {
                Some((streamer, block)) => streamer.blocks(
                    ya,
                    block,
                    #[inline(always)]
                    |at, b| {
                        for (y, &v) in b.iter_mut().zip(&xa[at..]) {
                            *y = v - m - c;
                        }
                    },
                ),
                None => {
                    for (y, &v) in ya.iter_mut().zip(xa) {
                        *y = v - m - c;
                    }
                }
            }
        } else {
            match stream {
                Some((streamer, block)) => {
                    let e = &mut buf[..xa.len()];
                    let inv = <T::Acc as Real>::from_f64(1.0 / exp_store(xa, m, e, ahead));
                    streamer.blocks(
                        ya,
                        block,
                        #[inline(always)]
                        |at, b| {
                            for (y, &v) in b.iter_mut().zip(&e[at..]) {
                                *y = v * inv;
                            }
                        },
                    );
                }
                None => {
                    let inv = <T::Acc as Real>::from_f64(1.0 / exp_store(xa, m, ya, ahead));
                    for y in ya {
                        *y = *y * inv;
                    }
                }
            }
        }
        return;
    }
    if xs.len() * std::mem::size_of::<T::Acc>() > LONG_ROW_BYTES {
        return long_widened_row(xs, ys, log);
    }
    let b = &mut buf[..xs.len()];
    T::load(xs, b);
    let m = max_of(b);
    if log {
        let s = sum_of(b, |v| (v - m).vexp_shifted(), ahead);
        let c = <T::Acc as Real>::from_f64(s.ln());
        for v in b.iter_mut() {
            *v = *v - m - c;
        }
    } else {
        let inv = <T::Acc as Real>::from_f64(1.0 / exp_in_place(b, m, ahead));
        for v in b.iter_mut() {
            *v = *v * inv;
        }
    }
    T::store(b, ys);
}

/// Rows of more bytes than this (a quarter of a typical L2) take [`long_row`]: they do not stay in
/// cache from one pass over the row to the next.
const LONG_ROW_BYTES: usize = 128 * 1024;

/// One long row of f32 or f64, read from memory twice instead of three times: a first pass takes
/// each [`BLOCK`]'s own maximum `m_b` and `s_b = Σ exp(x − m_b)` while the block is in L1 (for
/// softmax storing `exp(x − m_b)` in the output), then `m = max m_b` and `s = Σ s_b·exp(m_b − m)`
/// (in f64), and a second pass writes `x − m − ln s` or scales each block of the output by
/// `exp(m_b − m)/s`. A block of −∞ only contributes 0 (its own `exp(x − m_b)` would be NaN); a row
/// of −∞ only, or holding NaN or +∞, comes out all NaN, as in the reference. Each softmax output
/// is the product of two exponentials, so it may be a few ulp further off than a short row's.
#[inline(always)]
fn long_row<A: Exp>(xa: &[A], ya: &mut [A], log: bool) {
    let mut blocks = Vec::with_capacity(xa.len().div_ceil(BLOCK));
    for (b, (xb, yb)) in xa.chunks(BLOCK).zip(ya.chunks_mut(BLOCK)).enumerate() {
        // The next block, prefetched during this one's exponentials.
        let ahead = Ahead::new(xa.get((b + 1) * BLOCK..).unwrap_or(&[]));
        let mb = max_of(xb);
        let sb = if mb == A::NEG_INFINITY {
            // −∞ only, or with NaN (which the maximum skips): 0, or NaN for the whole row.
            yb.fill(A::ZERO);
            if xb.iter().any(|v| v.is_nan()) {
                f64::NAN
            } else {
                0.0
            }
        } else if log {
            sum_of(xb, |v| (v - mb).vexp_shifted(), ahead)
        } else {
            exp_store(xb, mb, yb, ahead)
        };
        blocks.push((mb, sb));
    }
    let m = blocks
        .iter()
        .fold(A::NEG_INFINITY, |m, &(mb, _)| if mb > m { mb } else { m });
    let m64 = m.to_f64();
    let s: f64 = blocks
        .iter()
        .map(|&(mb, sb)| sb * (mb.to_f64() - m64).exp())
        .sum();
    if log {
        let c = A::from_f64(s.ln());
        for (y, &v) in ya.iter_mut().zip(xa) {
            *y = v - m - c;
        }
        return;
    }
    for (yb, &(mb, _)) in ya.chunks_mut(BLOCK).zip(&blocks) {
        let k = A::from_f64((mb.to_f64() - m64).exp() / s);
        for y in yb {
            *y = *y * k;
        }
    }
}

/// One long row of a half type (its f32 copy past [`LONG_ROW_BYTES`]) with a block of scratch
/// instead of a widened copy of the row: a first pass takes each [`BLOCK`]'s maximum `m_b` and
/// `s_b = Σ exp(x − m_b)` and merges them as it goes into the row's `m = max m_b` and
/// `s = Σ s_b·exp(m_b − m)` (in f64); a second pass writes `exp(x − m)/s` or `x − m − ln s`,
/// rounded once. Each exponential is taken twice. A block of −∞ only contributes 0; a row of −∞
/// only, or holding NaN or +∞, comes out all NaN, as in the reference.
#[inline(always)]
fn long_widened_row<T: Lanes>(xs: &[T], ys: &mut [T], log: bool)
where
    T::Acc: Exp,
{
    let mut m = <T::Acc as Real>::NEG_INFINITY;
    let mut s = 0.0f64;
    widened_blocks(xs, |b| {
        let mb = max_of(b);
        if mb == <T::Acc as Real>::NEG_INFINITY {
            // −∞ only, or with NaN (which the maximum skips): nothing, or NaN for the whole row.
            if b.iter().any(|v| v.is_nan()) {
                s = f64::NAN;
            }
            return;
        }
        let sb = sum_of(b, |v| (v - mb).vexp_shifted(), Ahead::none());
        if mb > m {
            // Also the first finite block: `m` is −∞, its factor 0 and `s` 0 (or NaN).
            s = s * (m.to_f64() - mb.to_f64()).exp() + sb;
            m = mb;
        } else {
            s += sb * (mb.to_f64() - m.to_f64()).exp();
        }
    });
    let k = <T::Acc as Real>::from_f64(if log { s.ln() } else { 1.0 / s });
    let mut buf = scratch_row::<T>();
    for (xb, yb) in xs.chunks(BLOCK).zip(ys.chunks_mut(BLOCK)) {
        finish(xb, yb, &mut buf, |_| (m, k), log);
    }
}

/// Calls `f` on each [`BLOCK`] of `xs` in order, in the compute type: the elements themselves for
/// f32 and f64, else widened into one block of scratch, so that a row of any length needs no
/// scratch of its own length.
#[inline(always)]
fn widened_blocks<T: Lanes>(xs: &[T], mut f: impl FnMut(&[T::Acc])) {
    if let Some(xa) = T::as_acc(xs) {
        xa.chunks(BLOCK).for_each(f);
        return;
    }
    let mut buf = scratch_row::<T>();
    for xb in xs.chunks(BLOCK) {
        f(widened(xb, &mut buf));
    }
}

/// Row `r` of `[outer, len]` (a long one), each pass split across the team: partial maxima and sums
/// per chunk, combined in chunk order (deterministic for a given thread count).
fn wide_row<T: Lanes>(x: Span<T>, y: Span<T>, r: usize, sh: Shape, ctx: Ctx)
where
    T::Acc: Exp,
{
    let len = sh.len;
    let chunks = (len / TASK_ELEMENTS).clamp(1, 4 * ctx.threads);
    let chunk = len.div_ceil(chunks).next_multiple_of(BLOCK);
    let part = |c: usize| r * len + c * chunk..r * len + ((c + 1) * chunk).min(len);
    let count = len.div_ceil(chunk);
    let maxima: Vec<T::Acc> = par_map(count, |c| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // SAFETY: input and output do not overlap (the checks forbid it); nothing writes
                // the input.
                let xs = unsafe { x.slice(part(c)) };
                let mut m = <T::Acc as Real>::NEG_INFINITY;
                widened_blocks(xs, |b| {
                    let mb = max_of(b);
                    m = if mb > m { mb } else { m };
                });
                m
            },
        )
    });
    let m = max_of(&maxima);
    let sums: Vec<f64> = par_map(count, |c| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // SAFETY: as above.
                let xs = unsafe { x.slice(part(c)) };
                // Block by block as `sum_of` sums a slice: the same f64 total.
                let mut s = 0.0;
                widened_blocks(xs, |b| {
                    s += sum_of(b, |v| (v - m).vexp_shifted(), Ahead::none());
                });
                s
            },
        )
    });
    let s: f64 = sums.iter().sum();
    let k = <T::Acc as Real>::from_f64(if sh.log { s.ln() } else { 1.0 / s });
    par_for(count, |c| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // SAFETY: chunk `c` of the row is written by this task only.
                let (xs, ys) = unsafe { (x.slice(part(c)), y.slice_mut(part(c))) };
                let mut buf = scratch_row::<T>();
                for (xb, yb) in xs.chunks(BLOCK).zip(ys.chunks_mut(BLOCK)) {
                    finish(xb, yb, &mut buf, |_| (m, k), sh.log);
                }
            },
        )
    });
}

/// A block of compute-type scratch.
#[inline(always)]
pub(super) fn scratch_row<T: Lanes>() -> [T::Acc; BLOCK] {
    [<T::Acc as Real>::ZERO; BLOCK]
}

/// The output pass for a block of at most [`BLOCK`] elements: `exp(x − m)·k` (softmax, `k = 1/s`)
/// or `x − m − k` (log-softmax, `k = ln s`), with `(m, k)` given per element index by `mk`.
#[inline(always)]
fn finish<T: Lanes>(
    xs: &[T],
    ys: &mut [T],
    buf: &mut [T::Acc; BLOCK],
    mk: impl Fn(usize) -> (T::Acc, T::Acc),
    log: bool,
) where
    T::Acc: Exp,
{
    let out = |j: usize, v: T::Acc| {
        let (m, k) = mk(j);
        if log {
            v - m - k
        } else {
            (v - m).vexp_shifted() * k
        }
    };
    if let (Some(xa), Some(ya)) = (T::as_acc(xs), T::as_acc_mut(ys)) {
        for (j, (y, &v)) in ya.iter_mut().zip(xa).enumerate() {
            *y = out(j, v);
        }
        return;
    }
    let b = &mut buf[..xs.len()];
    T::load(xs, b);
    for (j, v) in b.iter_mut().enumerate() {
        *v = out(j, *v);
    }
    T::store(b, ys);
}

// inner > 1: columns.

/// `[outer, len, inner]` with `inner > 1`: tiles of columns, each reduced down the axis in three
/// passes with per-column maxima and sums, threaded over (outer, tile) pairs.
fn columns<T: Lanes>(x: Span<T>, y: Span<T>, sh: Shape, ctx: Ctx)
where
    T::Acc: Exp,
{
    let size = std::mem::size_of::<T>().max(1);
    let tile = (TILE_BYTES / (sh.len * size))
        .clamp(LANES, BLOCK)
        .min(sh.inner);
    let tiles = sh.inner.div_ceil(tile);
    let per_task = sh.len * tile;
    let min_tasks = items_per_task(per_task);
    for_chunks(sh.outer * tiles, ctx.threads, min_tasks, |tasks| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut m = vec![<T::Acc as Real>::ZERO; tile];
                let mut s = vec![0.0f64; tile];
                let mut k = vec![<T::Acc as Real>::ZERO; tile];
                let mut buf = scratch_row::<T>();
                for t in tasks {
                    let (o, i0) = (t / tiles, (t % tiles) * tile);
                    let w = tile.min(sh.inner - i0);
                    let at = |a: usize| (o * sh.len + a) * sh.inner + i0;
                    let (m, s, k) = (&mut m[..w], &mut s[..w], &mut k[..w]);
                    let row = |a: usize| {
                        // SAFETY: input and output do not overlap; nothing writes the input.
                        unsafe { x.slice(at(a)..at(a) + w) }
                    };
                    m.fill(<T::Acc as Real>::NEG_INFINITY);
                    for a in 0..sh.len {
                        for (mj, &v) in m.iter_mut().zip(widened(row(a), &mut buf)) {
                            *mj = if v > *mj { v } else { *mj };
                        }
                    }
                    s.fill(0.0);
                    for a in 0..sh.len {
                        let xs = widened(row(a), &mut buf);
                        for ((sj, &mj), &v) in s.iter_mut().zip(m.iter()).zip(xs) {
                            *sj += (v - mj).vexp_shifted().to_f64();
                        }
                    }
                    for (kj, &sj) in k.iter_mut().zip(s.iter()) {
                        *kj = <T::Acc as Real>::from_f64(if sh.log { sj.ln() } else { 1.0 / sj });
                    }
                    for a in 0..sh.len {
                        // SAFETY: this task owns columns `i0..i0 + w` of outer index `o` of the output.
                        let ys = unsafe { y.slice_mut(at(a)..at(a) + w) };
                        finish(row(a), ys, &mut buf, |j| (m[j], k[j]), sh.log);
                    }
                }
            },
        )
    });
}

impl OpImpl<SoftmaxDesc> for CpuBackend {
    fn op(&self, desc: &SoftmaxDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.softmax(desc);
        };
        self.kernel(acc, |mem, ctx| softmax(mem, desc, ctx))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::backends::cpu::simd::SimdLevel;
    use crate::compute::DevicePtr;
    use crate::dtype::DType;
    use crate::rng::HostRng;

    const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

    /// Runs `f` with one thread, then with two inside a two-thread team.
    pub(in crate::backends::cpu::norm) fn for_threads(f: impl Fn(Ctx)) {
        f(Ctx {
            threads: 1,
            simd: SimdLevel::detect(),
        });
        crate::backends::cpu::team::on_threads(2, f);
    }

    /// `[outer, len, inner]` shapes that reach every path: rows of one, across blocks, many rows,
    /// columns in one tile and across tiles, one outer slice.
    pub(in crate::backends::cpu::norm) const SHAPES: [(usize, usize, usize); 9] = [
        (1, 1, 1),
        (3, 7, 1),
        (4, BLOCK + 3, 1),
        (37, 1500, 1),
        (2, 7, 5),
        (3, 5, 130),
        (2, 300, 70),
        (2, 3, BLOCK + 9),
        (1, 1, 9),
    ];

    /// The norm-wise relative error the kernels may have against the reference in `dtype`.
    pub(in crate::backends::cpu::norm) fn bound(dtype: DType) -> f64 {
        match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            _ => 1e-2,
        }
    }

    /// Runs softmax (or log-softmax) of `vals` as `[outer, len, inner]` here and in the reference and
    /// compares: norm-wise relative error within the dtype's parity bound, NaN exactly where the
    /// reference has NaN, equal infinities.
    fn check(vals: &[f64], shape: (usize, usize, usize), dtype: DType, log: bool, ctx: Ctx) {
        let mut mem = HostMemory::default();
        let n = vals.len();
        let size = dtype.size_in_bytes();
        let input = mem.alloc(n * size).unwrap();
        mem.store(dtype, input, vals).unwrap();
        let (mine, theirs): (DevicePtr, DevicePtr) =
            (mem.alloc(n * size).unwrap(), mem.alloc(n * size).unwrap());
        let desc = |output| SoftmaxDesc {
            dtype,
            input,
            output,
            outer: shape.0,
            axis_len: shape.1,
            inner: shape.2,
            log,
        };
        softmax(&mut mem, &desc(mine), ctx).unwrap();
        reference::softmax(&mut mem, &desc(theirs)).unwrap();
        let got = mem.load_dense(dtype, mine, n).unwrap();
        let want = mem.load_dense(dtype, theirs, n).unwrap();
        let what = format!("log {log} {dtype} {shape:?} ({} threads)", ctx.threads);
        let bound = bound(dtype);
        let (mut num, mut den) = (0.0, 0.0);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            if g.is_nan() || w.is_nan() {
                assert!(
                    g.is_nan() && w.is_nan(),
                    "{what}: element {i} is {g}, not {w}"
                );
            } else if g.is_infinite() || w.is_infinite() {
                assert_eq!(g, w, "{what}: element {i}");
            } else {
                num += (g - w) * (g - w);
                den += w * w;
            }
        }
        let rel = if den > 0.0 {
            (num / den).sqrt()
        } else {
            num.sqrt()
        };
        assert!(rel <= bound, "{what}: relative error {rel:e}");
    }

    #[test]
    fn softmax_matches_the_reference_for_every_shape_and_dtype() {
        for_threads(|ctx| {
            for (i, &(o, l, n)) in SHAPES.iter().enumerate() {
                let vals = HostRng::new(i as u64).uniform_vec(o * l * n, -10.0, 10.0);
                for dtype in FLOATS {
                    for log in [false, true] {
                        check(&vals, (o, l, n), dtype, log, ctx);
                    }
                }
            }
        });
    }

    #[test]
    fn rows_of_a_streamed_output_match_the_reference() {
        // Rows of 4099 elements (an odd tail in every block), past the streaming size in f32 and
        // f64; a row of −∞ but one and a row with NaN among them.
        let (outer, len) = (1027, 4099);
        let mut vals = HostRng::new(4).uniform_vec(outer * len, -20.0, 20.0);
        vals[5 * len..6 * len].fill(f64::NEG_INFINITY);
        vals[5 * len + 17] = 1.0;
        vals[9 * len + 4000] = f64::NAN;
        for_threads(|ctx| {
            for dtype in [DType::F32, DType::F64] {
                assert!(worth_streaming(outer * len * dtype.size_in_bytes()));
                for log in [false, true] {
                    check(&vals, (outer, len, 1), dtype, log, ctx);
                }
            }
        });
    }

    #[test]
    fn long_rows_of_a_streamed_output_match_the_reference() {
        // Rows past `LONG_ROW_BYTES` whose output is past the streaming size: they take
        // `long_row` and need no row of scratch; three rows, so that two threads share them.
        let (outer, len) = (
            3,
            (crate::backends::cpu::stream::STREAM_BYTES / 4).div_ceil(3) + 5,
        );
        let vals = HostRng::new(6).uniform_vec(outer * len, -25.0, 25.0);
        for_threads(|ctx| {
            for dtype in [DType::F32, DType::F64] {
                assert!(worth_streaming(outer * len * dtype.size_in_bytes()));
                assert!(len * dtype.size_in_bytes() > LONG_ROW_BYTES);
                for log in [false, true] {
                    check(&vals, (outer, len, 1), dtype, log, ctx);
                }
            }
        });
    }

    #[test]
    fn long_rows_split_across_threads() {
        let len = 4 * TASK_ELEMENTS + BLOCK + 5;
        let vals = HostRng::new(3).uniform_vec(len, -30.0, 30.0);
        for_threads(|ctx| {
            for dtype in [DType::F32, DType::BF16] {
                for log in [false, true] {
                    check(&vals, (1, len, 1), dtype, log, ctx);
                }
            }
        });
    }

    #[test]
    fn long_rows_take_each_block_on_its_own() {
        let len = 20 * BLOCK + 37;
        assert!(len * 4 > LONG_ROW_BYTES);
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        let mut vals = HostRng::new(5).uniform_vec(6 * len, -30.0, 30.0);
        // Row 1: a whole block of −∞ and a few more −∞; row 2: −∞ only; row 3: a NaN in a
        // block of −∞; row 4: one +∞; row 5: a large spread across blocks.
        let row = |r: usize| r * len..(r + 1) * len;
        vals[row(1)][3 * BLOCK..4 * BLOCK].fill(-inf);
        vals[row(1)][7] = -inf;
        vals[row(2)].fill(-inf);
        vals[row(3)][BLOCK..2 * BLOCK].fill(-inf);
        vals[row(3)][BLOCK + 100] = nan;
        vals[row(4)][9 * BLOCK + 1] = inf;
        vals[row(5)][2 * BLOCK + 5] = 85.0;
        vals[row(5)][17 * BLOCK + 3] = -120.0;
        for_threads(|ctx| {
            for dtype in FLOATS {
                for log in [false, true] {
                    check(&vals, (6, len, 1), dtype, log, ctx);
                }
            }
        });
    }

    #[test]
    fn special_rows_come_out_as_in_the_reference() {
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        // Rows of 5: a −∞ entry, a NaN, a +∞, all −∞, all equal, a huge spread.
        let rows = [
            [1.0, -inf, 2.0, 0.5, -3.0],
            [1.0, nan, 2.0, 0.5, -3.0],
            [1.0, inf, 2.0, 0.5, -3.0],
            [-inf, -inf, -inf, -inf, -inf],
            [4.0, 4.0, 4.0, 4.0, 4.0],
            [1e30, -1e30, 0.0, 80.0, -80.0],
        ];
        let vals: Vec<f64> = rows.iter().flatten().copied().collect();
        // The same values with the axis in the middle: [6, 5] read as [1, 6, 5] along the rows.
        let mut t = vec![0.0; 30];
        for (r, row) in rows.iter().enumerate() {
            for (c, &v) in row.iter().enumerate() {
                t[c * 6 + r] = v;
            }
        }
        for_threads(|ctx| {
            for dtype in FLOATS {
                for log in [false, true] {
                    check(&vals, (6, 5, 1), dtype, log, ctx);
                    check(&t, (1, 5, 6), dtype, log, ctx);
                }
            }
        });
    }
}
