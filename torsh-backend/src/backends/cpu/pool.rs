//! 2-D max and average pooling on the CPU, and their input gradients.
//!
//! Work is split across threads by output rows of all `N·C` planes. An output row accumulates its
//! window one tap at a time: for tap `(r, s)` the output columns whose input column is inside the
//! image form one range, so the inner loop runs branch-free along the output width (contiguous loads
//! for stride 1). Padding never enters a max; a NaN in a window makes its max NaN; averages divide by
//! the full window or by the number of real elements, as the descriptor says. A max that also writes
//! its positions searches [`LANES`] windows side by side, flattened over every plane, when no
//! window needs clipping (small planes cost no more per window than large ones), and otherwise
//! walks each window tap by tap.
//!
//! The gradients split by planes: each task zeroes a plane of the input gradient and adds every
//! window's gradient into it (max: at the position its index names) in row-major window order, the
//! reference's order, after every index has been checked.

use std::ops::Range;

use super::host::{for_chunks, with_float, with_simd, Ctx, Element, Real, Span};
use super::reduce::{as_acc_mut, Source};
use super::stream::{stream_copy, worth_streaming};
use crate::backends::cpu::cost::items_per_task;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{memory::HostMemory, pool as reference};
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::{Pool2dBackwardDesc, Pool2dDesc, PoolKind};
use crate::error::Result;

/// Pools each `[N, C]` plane.
pub(crate) fn pool2d(mem: &mut HostMemory, d: &Pool2dDesc, ctx: Ctx) -> Result<()> {
    if d.output_shape.contains(&0) {
        return Ok(());
    }
    match d.indices {
        Some(indices) => with_float!(
            d.dtype,
            T => max_with_indices::<T>(mem, d, indices, ctx),
            _ => reference::pool2d(mem, d)
        ),
        None => with_float!(d.dtype, T => typed::<T>(mem, d, ctx), _ => reference::pool2d(mem, d)),
    }
}

/// The taps `t` of a window starting at padded coordinate `start` whose input coordinate
/// `start + t - pad` lies in `0..size`.
fn real_taps(start: usize, kernel: usize, pad: usize, size: usize) -> Range<usize> {
    let lo = pad.saturating_sub(start);
    let hi = (size + pad).saturating_sub(start).min(kernel);
    lo..hi.max(lo)
}

/// A max pool that also writes each window's position: the first largest tap, or the last NaN.
fn max_with_indices<T: Element>(
    mem: &mut HostMemory,
    d: &Pool2dDesc,
    indices: crate::compute::DevicePtr,
    ctx: Ctx,
) -> Result<()> {
    const OP: &str = "pool2d";
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.output_shape;
    let x = Span::<T>::of(mem, OP, d.input, n * c * h * w)?;
    let y = Span::<T>::of(mem, OP, d.output, n * c * oh * ow)?;
    let at = Span::<i64>::of(mem, OP, indices, n * c * oh * ow)?;
    let ([kh, kw], [sh, sw], [ph, pw]) = (d.kernel, d.stride, d.padding);
    let min_rows = items_per_task(ow * kh * kw);
    // Without padding, and with every window inside its plane (true unless the descriptor's output
    // is smaller than its input allows), the windows need no clipping.
    if ph == 0 && pw == 0 && (oh - 1) * sh + kh <= h && (ow - 1) * sw + kw <= w {
        let taps: Vec<usize> = (0..kh)
            .flat_map(|r| (0..kw).map(move |s| r * w + s))
            .collect();
        let geometry = Unpadded {
            plane: (h * w, w, oh, ow),
            stride: (sh, sw),
            taps: &taps,
        };
        for_chunks(n * c * oh, ctx.threads, min_rows, |out_rows| {
            let outs = out_rows.start * ow..out_rows.end * ow;
            // SAFETY: the input is only read; this task owns output rows `out_rows` of both outputs.
            let (xs, ys, is) = unsafe {
                (
                    x.slice(0..x.len()),
                    y.slice_mut(outs.clone()),
                    at.slice_mut(outs.clone()),
                )
            };
            with_simd(
                ctx.simd,
                #[inline(always)]
                || geometry.max_with_indices(xs, outs.start, ys, is),
            );
        });
        return Ok(());
    }
    for_chunks(n * c * oh, ctx.threads, min_rows, |out_rows| {
        for k in out_rows {
            let (plane, oy) = (k / oh, k % oh);
            // SAFETY: the input is only read; this task owns output rows `out_rows` of both outputs.
            let (xp, ys, is) = unsafe {
                (
                    x.slice(plane * h * w..(plane + 1) * h * w),
                    y.slice_mut(k * ow..(k + 1) * ow),
                    at.slice_mut(k * ow..(k + 1) * ow),
                )
            };
            let rows = real_taps(oy * sh, kh, ph, h);
            for ox in 0..ow {
                let mut best = <T::Acc as Real>::NEG_INFINITY;
                let mut first = usize::MAX;
                for r in rows.clone() {
                    let iy = oy * sh + r - ph;
                    for s in real_taps(ox * sw, kw, pw, w) {
                        let i = iy * w + ox * sw + s - pw;
                        let v = xp[i].widen();
                        if first == usize::MAX || v > best || v.is_nan() {
                            best = v;
                            first = i;
                        }
                    }
                }
                // Every window holds a real tap (padding is at most half the window).
                let first = first.min(xp.len().saturating_sub(1));
                ys[ox] = xp[first];
                is[ox] = first as i64;
            }
        }
    });
    Ok(())
}

/// Outputs of a max pool searched side by side.
const LANES: usize = 16;

/// The geometry of a max pool without padding, whose windows all lie inside their planes: built
/// only when `(oh − 1)·sh + kh ≤ h` and `(ow − 1)·sw + kw ≤ w`, so that every tap of every output
/// of `n·c` planes reads inside an input of `n·c·h·w` elements.
struct Unpadded<'a> {
    /// Input elements per plane and per row, output rows and columns per plane.
    plane: (usize, usize, usize, usize),
    /// Window strides (rows, columns).
    stride: (usize, usize),
    /// Each tap's offset from its window's first element, in window order.
    taps: &'a [usize],
}

impl Unpadded<'_> {
    /// Outputs `first ..` (counted over every plane, `ys.len()` of them) of the max pool of `xs`
    /// and their positions: [`LANES`] windows at a time, each lane's search independent of the
    /// others (a search of one window is a chain of dependent compares), keeping the first largest
    /// tap or the last NaN, as the reference does.
    #[inline(always)]
    fn max_with_indices<T: Element>(&self, xs: &[T], first: usize, ys: &mut [T], is: &mut [i64]) {
        let ((hw, w, oh, ow), (sh, sw)) = (self.plane, self.stride);
        if ys.is_empty() {
            return;
        }
        // Every output's plane lies inside the input.
        let planes = (first + ys.len()).div_ceil(oh * ow);
        assert!(
            planes * hw <= xs.len() && is.len() == ys.len(),
            "max pool past its input"
        );
        // The output (plane, row, column) of the next output, advanced one output at a time.
        let (mut k, mut ox) = (first / ow, first % ow);
        let mut done = 0;
        while done < ys.len() {
            let len = LANES.min(ys.len() - done);
            // Each lane's plane start and window start within its plane.
            let mut plane = [0usize; LANES];
            let mut start = [0usize; LANES];
            for l in 0..LANES {
                plane[l] = (k / oh) * hw;
                start[l] = (k % oh) * sh * w + ox * sw;
                if l + 1 < len {
                    ox += 1;
                    if ox == ow {
                        ox = 0;
                        k += 1;
                    }
                }
            }
            ox += 1;
            if ox == ow {
                ox = 0;
                k += 1;
            }
            let mut best = [<T::Acc as Real>::NEG_INFINITY; LANES];
            let mut at = [0usize; LANES];
            for l in 0..LANES {
                best[l] = xs[plane[l] + start[l]].widen();
                at[l] = start[l];
            }
            for &t in self.taps {
                for l in 0..LANES {
                    let i = start[l] + t;
                    // SAFETY: lane l is an output of a plane below `planes` (checked above), and
                    // its window lies inside that plane ([`Unpadded`]'s construction).
                    let v = unsafe { xs.get_unchecked(plane[l] + i) }.widen();
                    let take = v > best[l] || v.is_nan();
                    best[l] = if take { v } else { best[l] };
                    at[l] = if take { i } else { at[l] };
                }
            }
            for l in 0..len {
                ys[done + l] = xs[plane[l] + at[l]];
                is[done + l] = at[l] as i64;
            }
            done += len;
        }
    }
}

/// The input gradient of each `[N, C]` plane.
pub(crate) fn pool2d_backward(
    mem: &mut HostMemory,
    d: &Pool2dBackwardDesc,
    ctx: Ctx,
) -> Result<()> {
    if d.input_shape.contains(&0) {
        return Ok(());
    }
    with_float!(
        d.dtype,
        T => backward::<T>(mem, d, ctx),
        _ => reference::pool2d_backward(mem, d)
    )
}

/// The largest max-pool input-gradient plane built in scratch to be streamed out (a core's L2
/// share); larger planes are written in place.
const STREAM_PLANE_BYTES: usize = 1 << 20;

/// [`pool2d_backward`] for element type `T`.
fn backward<T: Element>(mem: &mut HostMemory, d: &Pool2dBackwardDesc, ctx: Ctx) -> Result<()> {
    const OP: &str = "pool2d_backward";
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.grad_shape;
    let (plane_in, plane_out) = (h * w, oh * ow);
    let index = match d.indices {
        Some(p) => {
            let index = Span::<i64>::of(mem, OP, p, n * c * plane_out)?;
            if !indices_in_windows(d, index, ctx) {
                // The first bad index in order, as the reference reports it.
                reference::checked_indices(mem, d)?;
            }
            Some(index)
        }
        None => None,
    };
    let g = Span::<T>::of(mem, OP, d.grad, n * c * plane_out)?;
    let dx = Span::<T>::of(mem, OP, d.output, n * c * plane_in)?;
    let geometry = Geometry::of(d);
    // A max-pool plane is built in scratch to be streamed out: only planes that stay in cache,
    // so that the scratch costs no more than a cache's worth of memory per thread.
    let plane_bytes = plane_in * std::mem::size_of::<T>();
    let stream = worth_streaming(n * c * plane_bytes)
        && (d.kind != PoolKind::Max || plane_bytes <= STREAM_PLANE_BYTES);
    let min_planes = items_per_task(plane_in + plane_out);
    for_chunks(n * c, ctx.threads, min_planes, |planes| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut scratch = Scratch::<T::Acc>::default();
                for plane in planes {
                    // SAFETY: the gradient and indices are only read; this task owns these planes
                    // of the output.
                    let (gp, out) = unsafe {
                        (
                            g.slice(plane * plane_out..(plane + 1) * plane_out),
                            dx.slice_mut(plane * plane_in..(plane + 1) * plane_in),
                        )
                    };
                    match (d.kind, index) {
                        (PoolKind::Max, Some(index)) => {
                            // SAFETY: as above; every index was checked to lie inside its window.
                            let ip =
                                unsafe { index.slice(plane * plane_out..(plane + 1) * plane_out) };
                            max_plane(gp, ip, out, &mut scratch, stream);
                        }
                        (PoolKind::Avg { count_include_pad }, _) => {
                            let how = (count_include_pad, stream);
                            avg_plane(gp, out, &geometry, how, &mut scratch)
                        }
                        (PoolKind::Max, None) => {}
                    }
                }
            },
        )
    });
    Ok(())
}

/// The windows of a gradient along both dims.
struct Geometry {
    rows: Axis,
    cols: Axis,
    /// Per output column: its window's real taps, as a divisor factor.
    col_counts: Vec<f64>,
}

impl Geometry {
    fn of(d: &Pool2dBackwardDesc) -> Geometry {
        let [_, _, h, w] = d.input_shape;
        let [_, _, oh, ow] = d.grad_shape;
        let axis = |size, out, k: usize| Axis {
            size,
            out,
            kernel: d.kernel[k],
            stride: d.stride[k],
            pad: d.padding[k],
        };
        let cols = axis(w, ow, 1);
        Geometry {
            rows: axis(h, oh, 0),
            col_counts: (0..ow).map(|o| cols.count(o) as f64).collect(),
            cols,
        }
    }
}

/// Per-task buffers of the gradient kernels.
#[derive(Default)]
struct Scratch<A> {
    /// A plane (16-bit types) or a row (averages) of the input gradient in the arithmetic type.
    acc: Vec<A>,
    /// The gradient of each window divided by its divisor.
    scaled: Vec<A>,
    /// An input row split into its column phases.
    phases: Vec<A>,
}

/// The input gradient of one plane of a max pool: zeroed, then each window's gradient added at its
/// position, in row-major window order. With `stream`, an f32 or f64 plane is built in scratch and
/// written with streaming stores.
#[inline(always)]
fn max_plane<T: Element>(
    gp: &[T],
    ip: &[i64],
    out: &mut [T],
    scratch: &mut Scratch<T::Acc>,
    stream: bool,
) {
    let zero = <T::Acc as Real>::ZERO;
    #[inline(always)]
    fn scatter<T: Element>(acc: &mut [T::Acc], ip: &[i64], gp: &[T]) {
        for (&i, &v) in ip.iter().zip(gp) {
            acc[i as usize] += v.widen();
        }
    }
    if !stream {
        if let Some(acc) = as_acc_mut(out) {
            acc.fill(zero);
            scatter(acc, ip, gp);
            return;
        }
    }
    scratch.acc.clear();
    scratch.acc.resize(out.len(), zero);
    scatter(&mut scratch.acc, ip, gp);
    if let Some(acc) = as_acc_mut(out) {
        stream_copy(&scratch.acc, acc);
    } else {
        super::host::narrow_into(&scratch.acc, out);
    }
}

/// The input gradient of one plane of an average pool, row by row. Each window's gradient is
/// divided by its divisor once; an input row then sums, over the windows holding it in row-major
/// order, their quotients: with a column stride `s` the row is kept as its `s` phases (every
/// `s`-th element), where each tap of the window adds a contiguous run, and interleaved at the end.
/// With `stream`, f32 and f64 rows are interleaved in scratch and written with streaming stores.
#[inline(always)]
fn avg_plane<T: Element>(
    gp: &[T],
    out: &mut [T],
    g: &Geometry,
    (count_include_pad, stream): (bool, bool),
    scratch: &mut Scratch<T::Acc>,
) {
    let (rows, cols) = (g.rows, g.cols);
    let (w, ow, sw) = (cols.size, cols.out, cols.stride);
    let zero = <T::Acc as Real>::ZERO;
    let from = <T::Acc as Real>::from_f64;
    scratch.scaled.clear();
    for oy in 0..rows.out {
        let grads = &gp[oy * ow..(oy + 1) * ow];
        if count_include_pad {
            let area = from((rows.kernel * cols.kernel) as f64);
            scratch
                .scaled
                .extend(grads.iter().map(|&v| v.widen() / area));
        } else {
            let real_rows = rows.count(oy) as f64;
            scratch.scaled.extend(
                grads
                    .iter()
                    .zip(&g.col_counts)
                    .map(|(&v, &cc)| v.widen() / from(real_rows * cc)),
            );
        }
    }
    // Phase p holds input columns p, p + sw, ...; tap t of output column o lands on phase
    // (t - pad) mod sw at o + (t - pad) div sw.
    let phase_len = w.div_ceil(sw);
    let phases_used = sw.min(w);
    scratch.phases.clear();
    scratch.phases.resize(phase_len * phases_used, zero);
    scratch.acc.clear();
    scratch.acc.resize(w, zero);
    let taps: Vec<(Range<usize>, usize, isize)> = (0..cols.kernel)
        .map(|t| {
            let shift = t as isize - cols.pad as isize;
            (
                cols.valid(t),
                shift.rem_euclid(sw as isize) as usize,
                shift.div_euclid(sw as isize),
            )
        })
        .collect();
    for iy in 0..rows.size {
        scratch.phases.fill(zero);
        for oy in crate::compute::windows_over(iy, rows.out, rows.kernel, rows.stride, rows.pad) {
            let scaled = &scratch.scaled[oy * ow..(oy + 1) * ow];
            for (valid, phase, shift) in &taps {
                if valid.is_empty() {
                    continue;
                }
                let first = (valid.start as isize + shift) as usize;
                let dst = &mut scratch.phases
                    [phase * phase_len + first..phase * phase_len + first + valid.len()];
                for (a, &v) in dst.iter_mut().zip(&scaled[valid.clone()]) {
                    *a += v;
                }
            }
        }
        let dst = &mut out[iy * w..(iy + 1) * w];
        match as_acc_mut(dst) {
            Some(row) if !stream => interleave(&scratch.phases, phase_len, sw, row),
            Some(row) => {
                interleave(&scratch.phases, phase_len, sw, &mut scratch.acc);
                stream_copy(&scratch.acc, row);
            }
            None => {
                interleave(&scratch.phases, phase_len, sw, &mut scratch.acc);
                super::host::narrow_into(&scratch.acc, dst);
            }
        }
    }
}

/// `row[q·stride + p] = phases[p][q]`: a row put back together from its `stride` column phases of
/// `phase_len` elements each.
#[inline(always)]
fn interleave<A: Copy>(phases: &[A], phase_len: usize, stride: usize, row: &mut [A]) {
    if stride == 1 {
        row.copy_from_slice(&phases[..row.len()]);
        return;
    }
    let full = row.len() / stride;
    if stride == 2 {
        // The common 2 × 2 / 2 window, in a loop the compiler vectorises.
        let (even, odd) = phases.split_at(phase_len);
        for ((out, &a), &b) in row.chunks_exact_mut(2).zip(even).zip(odd) {
            out[0] = a;
            out[1] = b;
        }
        if row.len() % 2 == 1 {
            row[row.len() - 1] = even[full];
        }
        return;
    }
    for (q, out) in row.chunks_exact_mut(stride).enumerate() {
        for (p, o) in out.iter_mut().enumerate() {
            *o = phases[p * phase_len + q];
        }
    }
    for (p, o) in row[full * stride..].iter_mut().enumerate() {
        *o = phases[p * phase_len + full];
    }
}

/// Whether every index of `d` names an element inside its own window (checked without stopping
/// at the first bad one, so the loop vectorises).
fn indices_in_windows(d: &Pool2dBackwardDesc, index: Span<i64>, ctx: Ctx) -> bool {
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.grad_shape;
    let g = Geometry::of(d);
    // Per output column, the window's real input columns; per output row, its real input rows.
    let col_ranges: Vec<(u64, u64)> = (0..ow)
        .map(|o| {
            let t = real_taps(o * g.cols.stride, g.cols.kernel, g.cols.pad, w);
            let first = (o * g.cols.stride + t.start - g.cols.pad) as u64;
            (first, t.len() as u64)
        })
        .collect();
    let plane = (h * w) as u64;
    // Rows by a reciprocal in f64, exact while `index · w` stays far below 2^52; a division past it.
    let exact = plane < (1 << 24);
    let inv_w = 1.0 / w.max(1) as f64;
    let bad = std::sync::atomic::AtomicBool::new(false);
    let min_rows = items_per_task(ow);
    /// Whether every index of one output row lies in its window, with `row_of` giving the input row
    /// of an index clamped into the plane.
    #[inline(always)]
    fn row_ok(
        ix: &[i64],
        cols: &[(u64, u64)],
        (row0, nrows): (u64, u64),
        (plane, w): (u64, u64),
        row_of: impl Fn(i64) -> i64,
    ) -> bool {
        ix.iter().zip(cols).fold(true, |all, (&v, &(col0, ncols))| {
            let clamped = v.clamp(0, plane as i64 - 1);
            let iy = row_of(clamped);
            let col = (clamped - iy * w as i64) as u64;
            all & ((v as u64) < plane)
                & ((iy as u64).wrapping_sub(row0) < nrows)
                & (col.wrapping_sub(col0) < ncols)
        })
    }
    for_chunks(n * c * oh, ctx.threads, min_rows, |out_rows| {
        let ok = with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut ok = true;
                for k in out_rows {
                    let oy = k % oh;
                    let t = real_taps(oy * g.rows.stride, g.rows.kernel, g.rows.pad, h);
                    let rows = (
                        (oy * g.rows.stride + t.start - g.rows.pad) as u64,
                        t.len() as u64,
                    );
                    // SAFETY: the indices are only read during the op.
                    let ix = unsafe { index.slice(k * ow..(k + 1) * ow) };
                    let at = (plane, w as u64);
                    ok &= if exact {
                        row_ok(ix, &col_ranges, rows, at, |v| {
                            // SAFETY: `v` is in `0..plane`, so the quotient is a small finite
                            // non-negative number.
                            unsafe { ((v as f64 + 0.5) * inv_w).to_int_unchecked::<i64>() }
                        })
                    } else {
                        row_ok(ix, &col_ranges, rows, at, |v| v / w as i64)
                    };
                }
                ok
            },
        );
        if !ok {
            bad.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    !bad.into_inner()
}

/// The window's geometry along one dim.
#[derive(Clone, Copy, Debug)]
struct Axis {
    /// Input size.
    size: usize,
    /// Output size.
    out: usize,
    /// Window size.
    kernel: usize,
    /// Step between windows.
    stride: usize,
    /// Padding before the first element.
    pad: usize,
}

impl Axis {
    /// The outputs whose tap `t` reads a real element: `o` with `0 ≤ o·stride + t - pad < size`.
    #[inline(always)]
    fn valid(&self, t: usize) -> Range<usize> {
        let lo = if t >= self.pad {
            0
        } else {
            (self.pad - t).div_ceil(self.stride)
        };
        let hi = if self.size + self.pad > t {
            ((self.size + self.pad - t - 1) / self.stride + 1).min(self.out)
        } else {
            0
        };
        lo..hi.max(lo)
    }

    /// Real elements in output `o`'s window.
    fn count(&self, o: usize) -> usize {
        (0..self.kernel)
            .filter(|&t| (o * self.stride + t).wrapping_sub(self.pad) < self.size)
            .count()
    }
}

/// [`pool2d`] for element type `T`.
fn typed<T: Element>(mem: &mut HostMemory, d: &Pool2dDesc, ctx: Ctx) -> Result<()> {
    const OP: &str = "pool2d";
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.output_shape;
    let x = Span::<T>::of(mem, OP, d.input, n * c * h * w)?;
    let y = Span::<T>::of(mem, OP, d.output, n * c * oh * ow)?;
    let rows = Axis {
        size: h,
        out: oh,
        kernel: d.kernel[0],
        stride: d.stride[0],
        pad: d.padding[0],
    };
    let cols = Axis {
        size: w,
        out: ow,
        kernel: d.kernel[1],
        stride: d.stride[1],
        pad: d.padding[1],
    };
    // Per output column: the divisor's column factor for averages without padding.
    let col_counts: Vec<T::Acc> = (0..ow)
        .map(|o| <T::Acc as Real>::from_f64(cols.count(o) as f64))
        .collect();
    let work = (ow * rows.kernel * cols.kernel).max(1);
    let min_rows = items_per_task(work);
    for_chunks(n * c * oh, ctx.threads, min_rows, |out_rows| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut acc = vec![<T::Acc as Real>::ZERO; ow];
                let mut scratch = vec![<T::Acc as Real>::ZERO; w];
                let phase_len = if cols.stride > 1 {
                    w.div_ceil(cols.stride)
                } else {
                    0
                };
                // Phases past the row's width are empty: a stride wider than the row needs `w`.
                let phases_used = cols.stride.min(w);
                let mut phases = vec![<T::Acc as Real>::ZERO; phase_len * phases_used];
                for k in out_rows {
                    let (plane, oy) = (k / oh, k % oh);
                    let at = (plane * h * w, oy);
                    let bufs = (&mut scratch[..], &mut phases[..]);
                    match d.kind {
                        PoolKind::Max => max_row(&x, at, (rows, cols), &mut acc, bufs),
                        PoolKind::Avg { count_include_pad } => {
                            sum_row(&x, at, (rows, cols), &mut acc, bufs);
                            let window = if count_include_pad {
                                rows.kernel * cols.kernel
                            } else {
                                rows.count(oy)
                            };
                            divide(&mut acc, window, !count_include_pad, &col_counts);
                        }
                    }
                    // SAFETY: this task owns output rows `out_rows`; the output never overlaps the input.
                    let out = unsafe { y.slice_mut(k * ow..(k + 1) * ow) };
                    write(out, &acc);
                }
            },
        )
    });
    Ok(())
}

/// Calls `f(inputs, outputs)` for every tap of output row `oy` whose input row is real: `inputs`
/// are the input elements that tap reads for output columns `outputs` (those whose input column is
/// real), in order. With a column stride above 1 the row is first split into its `stride` phases
/// (every `stride`-th element) in `phases`, so every tap reads a contiguous run. Only the first
/// `min(stride, width)` phases exist (a stride wider than the row leaves the others empty), so
/// `phases` holds `⌈width / stride⌉ · min(stride, width)` elements, never more than the row.
#[inline(always)]
fn taps<T: Element>(
    x: &Span<T>,
    (plane, oy): (usize, usize),
    (rows, cols): (Axis, Axis),
    scratch: &mut [T::Acc],
    phases: &mut [T::Acc],
    mut f: impl FnMut(&[T::Acc], Range<usize>),
) {
    let sw = cols.stride;
    let phase_len = cols.size.div_ceil(sw);
    for r in rows.valid_taps(oy) {
        let iy = oy * rows.stride + r - rows.pad;
        // SAFETY: the input row is inside the plane, and nothing writes the input.
        let row = unsafe { x.load(plane + iy * cols.size, cols.size, scratch) };
        if sw == 2 {
            deinterleave2(row, phases, phase_len);
        } else if sw > 2 {
            for (q, phase) in phases.chunks_mut(phase_len).take(sw).enumerate() {
                for (p, &v) in phase.iter_mut().zip(row[q..].iter().step_by(sw)) {
                    *p = v;
                }
            }
        }
        for s in 0..cols.kernel {
            let range = cols.valid(s);
            if range.is_empty() {
                continue;
            }
            let first = range.start * sw + s - cols.pad;
            let inputs = if sw == 1 {
                &row[first..first + range.len()]
            } else {
                let at = (first % sw) * phase_len + first / sw;
                &phases[at..at + range.len()]
            };
            f(inputs, range);
        }
    }
}

/// Splits `row` into its even and odd elements: `phases[i] = row[2i]`,
/// `phases[phase_len + i] = row[2i + 1]` (`phase_len = ⌈row.len() / 2⌉`), with vector shuffles.
#[inline(always)]
fn deinterleave2<A: Copy>(row: &[A], phases: &mut [A], phase_len: usize) {
    let (pairs, tail) = row.as_chunks::<2>();
    let (even, odd) = phases.split_at_mut(phase_len);
    for ((e, o), p) in even.iter_mut().zip(odd.iter_mut()).zip(pairs) {
        *e = p[0];
        *o = p[1];
    }
    if let (Some(&v), Some(e)) = (tail.first(), even.get_mut(pairs.len())) {
        *e = v;
    }
}

impl Axis {
    /// The taps of output `o` that read a real element.
    #[inline(always)]
    fn valid_taps(&self, o: usize) -> Range<usize> {
        let start = o * self.stride;
        let lo = self.pad.saturating_sub(start);
        let hi = (self.size + self.pad)
            .saturating_sub(start)
            .min(self.kernel);
        lo..hi.max(lo)
    }
}

/// Output row `oy` of max pooling into `acc`.
#[inline(always)]
fn max_row<T: Element>(
    x: &Span<T>,
    at: (usize, usize),
    geometry: (Axis, Axis),
    acc: &mut [T::Acc],
    (scratch, phases): (&mut [T::Acc], &mut [T::Acc]),
) {
    acc.fill(<T::Acc as Real>::NEG_INFINITY);
    taps::<T>(
        x,
        at,
        geometry,
        scratch,
        phases,
        #[inline(always)]
        |inputs, range| {
            for (m, &v) in acc[range].iter_mut().zip(inputs) {
                *m = if (v > *m) | v.is_nan() { v } else { *m };
            }
        },
    );
}

/// Output row `oy` of sums over the windows into `acc`.
#[inline(always)]
fn sum_row<T: Element>(
    x: &Span<T>,
    at: (usize, usize),
    geometry: (Axis, Axis),
    acc: &mut [T::Acc],
    (scratch, phases): (&mut [T::Acc], &mut [T::Acc]),
) {
    acc.fill(<T::Acc as Real>::ZERO);
    taps::<T>(
        x,
        at,
        geometry,
        scratch,
        phases,
        #[inline(always)]
        |inputs, range| {
            for (a, &v) in acc[range].iter_mut().zip(inputs) {
                *a += v;
            }
        },
    );
}

/// Divides sums by the window size: `window` alone, or `window ×` each column's count when
/// `per_column`.
#[inline(always)]
fn divide<A: Real>(acc: &mut [A], window: usize, per_column: bool, col_counts: &[A]) {
    let window = A::from_f64(window as f64);
    if per_column {
        for (a, &c) in acc.iter_mut().zip(col_counts) {
            *a = *a / (window * c);
        }
    } else {
        for a in acc.iter_mut() {
            *a = *a / window;
        }
    }
}

/// Stores `acc` into `out`, rounding once.
#[inline(always)]
fn write<T: Element>(out: &mut [T], acc: &[T::Acc]) {
    match as_acc_mut(out) {
        Some(o) => o.copy_from_slice(acc),
        None => super::host::narrow_into(acc, out),
    }
}

impl OpImpl<Pool2dDesc> for CpuBackend {
    fn op(&self, desc: &Pool2dDesc) -> Result<()> {
        let indices_aligned = desc.indices.is_none_or(|p| p.0.is_multiple_of(8));
        let Some(acc) = self
            .takes(desc.dtype, desc.accesses())
            .filter(|_| indices_aligned)
        else {
            return self.scalar.pool2d(desc);
        };
        self.kernel(acc, |mem, ctx| pool2d(mem, desc, ctx))
    }
}

impl OpImpl<Pool2dBackwardDesc> for CpuBackend {
    fn op(&self, desc: &Pool2dBackwardDesc) -> Result<()> {
        let indices_aligned = desc.indices.is_none_or(|p| p.0.is_multiple_of(8));
        let Some(acc) = self
            .takes(desc.dtype, desc.accesses())
            .filter(|_| indices_aligned)
        else {
            return self.scalar.pool2d_backward(desc);
        };
        self.kernel(acc, |mem, ctx| pool2d_backward(mem, desc, ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::cpu::reduce::tests::{check, on_threads, random, upload};
    use crate::dtype::DType;

    /// Max, average with and without padding in the count, on every float dtype with 1 and 2
    /// threads, against the reference.
    fn check_pool(
        shape: [usize; 4],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        nans: bool,
    ) {
        let n: usize = shape.iter().product();
        let mut x = random(n, (n + kernel[0] * 7 + stride[1]) as u64);
        if nans {
            for v in x.iter_mut().step_by(37) {
                *v = f64::NAN;
            }
        }
        let out_shape = Pool2dDesc::expected_output_shape(shape, kernel, stride, padding).unwrap();
        let m: usize = out_shape.iter().product();
        for dtype in DType::FLOATS {
            let mut mem = HostMemory::default();
            let xp = upload(&mut mem, dtype, &x);
            for kind in [
                PoolKind::Max,
                PoolKind::Avg {
                    count_include_pad: true,
                },
                PoolKind::Avg {
                    count_include_pad: false,
                },
            ] {
                let desc = |output| Pool2dDesc {
                    kind,
                    dtype,
                    input: xp,
                    input_shape: shape,
                    output,
                    output_shape: out_shape,
                    kernel,
                    stride,
                    padding,
                    indices: None,
                };
                let want_ptr = mem.alloc(m * dtype.size_in_bytes()).unwrap();
                reference::pool2d(&mut mem, &desc(want_ptr)).unwrap();
                let want = mem.load_dense(dtype, want_ptr, m).unwrap();
                for threads in [1, 2] {
                    let got_ptr = mem.alloc(m * dtype.size_in_bytes()).unwrap();
                    on_threads(threads, |ctx| pool2d(&mut mem, &desc(got_ptr), ctx)).unwrap();
                    let got = mem.load_dense(dtype, got_ptr, m).unwrap();
                    let what = format!(
                        "{kind:?} {dtype} {shape:?} k {kernel:?} s {stride:?} p {padding:?}, {threads} thread(s)"
                    );
                    check(dtype, &got, &want, &what);
                    mem.free(got_ptr).unwrap();
                }
            }
        }
    }

    /// The I64 values at `p`.
    fn load_i64(mem: &HostMemory, p: crate::compute::DevicePtr, n: usize) -> Vec<i64> {
        mem.bytes(p, n * 8)
            .unwrap()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// The max pool with positions, and both gradients, on every float dtype with 1 and 2 threads,
    /// against the reference: positions exactly, values within the dtype's bound.
    fn check_indices_and_gradients(
        shape: [usize; 4],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        nans: bool,
    ) {
        let n: usize = shape.iter().product();
        let mut x = random(n, (3 * n + kernel[1]) as u64);
        if nans {
            for v in x.iter_mut().skip(5).step_by(29) {
                *v = f64::NAN;
            }
        }
        let out_shape = Pool2dDesc::expected_output_shape(shape, kernel, stride, padding).unwrap();
        let m: usize = out_shape.iter().product();
        let grad = random(m, m as u64 + 11);
        for dtype in DType::FLOATS {
            let mut mem = HostMemory::default();
            let xp = upload(&mut mem, dtype, &x);
            let gp = upload(&mut mem, dtype, &grad);
            let size = dtype.size_in_bytes();
            let forward = |output, indices| Pool2dDesc {
                kind: PoolKind::Max,
                dtype,
                input: xp,
                input_shape: shape,
                output,
                output_shape: out_shape,
                kernel,
                stride,
                padding,
                indices: Some(indices),
            };
            let (want, want_ix) = (mem.alloc(m * size).unwrap(), mem.alloc(m * 8).unwrap());
            reference::pool2d(&mut mem, &forward(want, want_ix)).unwrap();
            let (want, want_ix) = (
                mem.load_dense(dtype, want, m).unwrap(),
                load_i64(&mem, want_ix, m),
            );
            for threads in [1, 2] {
                let what = format!(
                    "{dtype} {shape:?} k {kernel:?} s {stride:?} p {padding:?}, {threads} thread(s)"
                );
                let (got, got_ix) = (mem.alloc(m * size).unwrap(), mem.alloc(m * 8).unwrap());
                on_threads(threads, |ctx| pool2d(&mut mem, &forward(got, got_ix), ctx)).unwrap();
                assert_eq!(load_i64(&mem, got_ix, m), want_ix, "positions, {what}");
                check(dtype, &mem.load_dense(dtype, got, m).unwrap(), &want, &what);
                for kind in [
                    PoolKind::Max,
                    PoolKind::Avg {
                        count_include_pad: true,
                    },
                    PoolKind::Avg {
                        count_include_pad: false,
                    },
                ] {
                    let backward = |output| Pool2dBackwardDesc {
                        kind,
                        dtype,
                        grad: gp,
                        grad_shape: out_shape,
                        indices: (kind == PoolKind::Max).then_some(got_ix),
                        output,
                        input_shape: shape,
                        kernel,
                        stride,
                        padding,
                    };
                    let want = mem.alloc(n * size).unwrap();
                    reference::pool2d_backward(&mut mem, &backward(want)).unwrap();
                    let want = mem.load_dense(dtype, want, n).unwrap();
                    let got = mem.alloc(n * size).unwrap();
                    on_threads(threads, |ctx| {
                        pool2d_backward(&mut mem, &backward(got), ctx)
                    })
                    .unwrap();
                    let got = mem.load_dense(dtype, got, n).unwrap();
                    check(dtype, &got, &want, &format!("{kind:?} gradient, {what}"));
                }
            }
        }
    }

    #[test]
    fn positions_and_gradients_match_the_reference() {
        for (shape, kernel, stride, padding) in [
            ([2, 3, 9, 8], [2, 2], [2, 2], [0, 0]),
            ([2, 5, 7, 11], [3, 2], [1, 2], [0, 0]),
            ([3, 7, 8, 8], [2, 2], [2, 2], [0, 0]),
            ([2, 3, 9, 8], [3, 3], [2, 2], [1, 1]),
            ([2, 3, 9, 8], [3, 3], [1, 1], [1, 1]),
            ([1, 2, 17, 31], [4, 5], [3, 2], [2, 2]),
            ([1, 1, 1, 1], [1, 1], [1, 1], [0, 0]),
            ([2, 4, 64, 65], [3, 3], [2, 2], [1, 1]),
        ] {
            check_indices_and_gradients(shape, kernel, stride, padding, false);
        }
        check_indices_and_gradients([2, 3, 9, 8], [3, 3], [1, 2], [1, 1], true);
    }

    #[test]
    fn an_index_outside_its_window_is_refused_before_writing() {
        let mut mem = HostMemory::default();
        let (shape, out_shape) = ([1, 1, 4, 4], [1, 1, 2, 2]);
        let gp = upload(&mut mem, DType::F32, &[1.0; 4]);
        let ix = mem.alloc(32).unwrap();
        let out = upload(&mut mem, DType::F32, &[7.0; 16]);
        // Window (0, 1) covers columns 2 and 3 of rows 0 and 1; position 1 is outside it.
        for (i, v) in [0i64, 1, 8, 10].iter().enumerate() {
            mem.bytes_mut(ix.offset(8 * i).unwrap(), 8)
                .unwrap()
                .copy_from_slice(&v.to_le_bytes());
        }
        let d = Pool2dBackwardDesc {
            kind: PoolKind::Max,
            dtype: DType::F32,
            grad: gp,
            grad_shape: out_shape,
            indices: Some(ix),
            output: out,
            input_shape: shape,
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        };
        for threads in [1, 2] {
            let err = on_threads(threads, |ctx| pool2d_backward(&mut mem, &d, ctx)).unwrap_err();
            assert!(
                matches!(
                    err,
                    crate::error::BackendError::IndexOutOfRange {
                        op: "max_pool2d_backward",
                        index: 1,
                        size: 16
                    }
                ),
                "{err:?}"
            );
            assert_eq!(mem.load_dense(DType::F32, out, 16).unwrap(), vec![7.0; 16]);
        }
    }

    #[test]
    fn windows_strides_and_padding_match_the_reference() {
        let shape = [2, 3, 9, 8];
        for (kernel, stride, padding) in [
            ([2, 2], [2, 2], [0, 0]),
            ([3, 3], [2, 2], [1, 1]),
            ([3, 2], [1, 2], [0, 1]),
            ([1, 1], [1, 1], [0, 0]),
            ([5, 3], [3, 1], [2, 1]),
            ([3, 3], [1, 1], [1, 1]),
            ([9, 8], [1, 1], [4, 4]),
        ] {
            check_pool(shape, kernel, stride, padding, false);
        }
        check_pool([1, 1, 1, 1], [1, 1], [1, 1], [0, 0], false);
        check_pool([1, 2, 17, 31], [4, 5], [3, 2], [2, 2], false);
    }

    #[test]
    fn large_planes_split_across_threads() {
        check_pool([2, 4, 64, 65], [3, 3], [2, 2], [1, 1], false);
        check_pool([1, 3, 130, 129], [2, 2], [1, 1], [1, 0], false);
    }

    #[test]
    fn gradients_past_the_streaming_size_are_written_with_streaming_stores() {
        // A 16.8 MB f32 input gradient (f64 too; the 16-bit ones stay below the size), with
        // 257 columns so rows start off the 16-byte alignment.
        let shape = [1, 64, 256, 257];
        assert!(super::worth_streaming(shape.iter().product::<usize>() * 4));
        // Max-pool planes of this size are streamed too.
        const { assert!(256 * 257 * 4 <= super::STREAM_PLANE_BYTES) };
        check_indices_and_gradients(shape, [2, 2], [2, 2], [0, 0], false);
    }

    #[test]
    fn nan_makes_its_windows_max_nan() {
        check_pool([2, 3, 9, 8], [3, 3], [2, 2], [1, 1], true);
        check_pool([1, 2, 20, 21], [2, 3], [1, 1], [0, 1], true);
    }
}
