//! 2-D max and average pooling on the CPU, and their input gradients.
//!
//! Work is split across threads by output rows of all `N·C` planes. An output row accumulates its
//! window one tap at a time: for tap `(r, s)` the output columns whose input column is inside the
//! image form one range, so the inner loop runs branch-free along the output width (contiguous loads
//! for stride 1). Padding never enters a max; a NaN in a window makes its max NaN; averages divide by
//! the full window or by the number of real elements, as the descriptor says.
//!
//! A pool without padding whose window columns do not overlap (2×2/2 and the like: [`Flat`])
//! instead runs on blocks of output rows taken from as many planes as a block holds, in passes
//! of whole vectors, so that a plane of 8 × 8 costs no more per element than a large one; with
//! positions, each tap is one pass over the block's windows in window order. A max with positions
//! whose windows overlap searches [`LANES`] windows side by side, flattened over every plane,
//! when no window needs clipping, and otherwise walks each window tap by tap.
//!
//! The gradients split by planes: each task zeroes a plane of the input gradient and adds every
//! window's gradient into it (max: at the position its index names) in row-major window order, the
//! reference's order, after every index has been checked.

use std::ops::Range;

use super::host::{for_chunks, widen_into, with_float, with_simd, Ctx, Element, Real, Span};
use super::reduce::{as_acc, as_acc_mut, Source};
use super::stream::{stream_copy, worth_streaming};
use super::vector::{on_vectors, Step, Vector};
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
    if let Some(flat) = Flat::of(d) {
        for_chunks(n * c * oh, ctx.threads, min_rows, |out_rows| {
            let task = FlatPositions {
                x,
                y,
                at,
                g: &flat,
                rows: out_rows,
            };
            // SAFETY: `FlatPositions` reads the input and writes output rows `out_rows` of both
            // outputs, which this task owns; `Flat::of` checked that every window lies inside
            // its plane.
            unsafe { on_vectors(ctx.simd, task) }
        });
        return Ok(());
    }
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
    if let Some(flat) = Flat::of(d) {
        let min_rows = items_per_task((ow * flat.kernel[0] * flat.kernel[1]).max(1));
        for_chunks(n * c * oh, ctx.threads, min_rows, |out_rows| {
            let task = FlatRows {
                x,
                y,
                g: &flat,
                rows: out_rows,
            };
            // SAFETY: `FlatRows` reads the input and writes output rows `out_rows`, which this
            // task owns; `Flat::of` checked that every window lies inside its plane.
            unsafe { on_vectors(ctx.simd, task) }
        });
        return Ok(());
    }
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

/// Input elements of the row-pooled block [`FlatRows`] works on at a time (16 KiB of f32).
const FLAT_BLOCK: usize = 4096;

/// A pool without padding whose windows all lie inside their planes and whose columns do not
/// overlap (`kw ≤ sw`, `ow·sw ≤ w`): the 2×2/2 pool of most networks. It runs in two passes over
/// a block of output rows, from as many planes as the block holds. First each output row's `kh`
/// input rows are pooled column by column into one row of `ow·sw` columns; in those rows, laid
/// end to end, output `i` of the block (counted over all its rows) reads columns
/// `i·sw .. i·sw + kw`, so the second pass runs on whole vectors however short a row is.
#[derive(Clone, Copy, Debug)]
struct Flat {
    /// Input rows and columns per plane.
    input: [usize; 2],
    /// Output rows and columns per plane.
    output: [usize; 2],
    /// Window rows and columns.
    kernel: [usize; 2],
    /// Window strides (rows, columns).
    stride: [usize; 2],
    /// Average (sum, then divide by the window) rather than max.
    avg: bool,
}

impl Flat {
    /// The geometry of `d` when it is such a pool (and its output not empty), else `None`.
    fn of(d: &Pool2dDesc) -> Option<Flat> {
        let [_, _, h, w] = d.input_shape;
        let [_, _, oh, ow] = d.output_shape;
        let ([kh, kw], [sh, sw]) = (d.kernel, d.stride);
        let rows_inside = (oh.checked_sub(1)?)
            .checked_mul(sh)
            .and_then(|r| r.checked_add(kh))
            .is_some_and(|r| r <= h);
        let columns_apart = ow.checked_mul(sw).is_some_and(|c| c <= w) && kw <= sw;
        let flat =
            d.padding == [0, 0] && kh > 0 && kw > 0 && ow > 0 && rows_inside && columns_apart;
        flat.then_some(Flat {
            input: [h, w],
            output: [oh, ow],
            kernel: [kh, kw],
            stride: [sh, sw],
            avg: matches!(d.kind, PoolKind::Avg { .. }),
        })
    }
}

/// Runs of consecutive output rows within one plane, from output row `k` (counted over every
/// plane), without a division per run.
struct PlaneRuns {
    /// Output rows per plane.
    oh: usize,
    /// The next run's plane and its first row in the plane.
    plane: usize,
    oy: usize,
}

impl PlaneRuns {
    /// Runs from output row `k`.
    fn from(k: usize, oh: usize) -> PlaneRuns {
        PlaneRuns {
            oh,
            plane: k / oh,
            oy: k % oh,
        }
    }

    /// The next run of at most `rows` output rows: its plane, its first row and its length.
    #[inline(always)]
    fn next(&mut self, rows: usize) -> (usize, usize, usize) {
        let run = (self.plane, self.oy, (self.oh - self.oy).min(rows));
        self.oy += run.2;
        if self.oy == self.oh {
            (self.plane, self.oy) = (self.plane + 1, 0);
        }
        run
    }
}

/// The input of a run of `rows` output rows of a [`Flat`] pool starting at output row `oy` of
/// `plane`, in the compute type: every tap row of every window, as a slice starting at the first
/// window's first element, with the step between input rows. Borrowed in place when the element
/// type is the compute type, else widened into `widened`, rows cut to the `ow·sw` columns used.
///
/// # Safety
/// The run's windows lie inside `x` ([`Flat::of`]), and no task writes the input meanwhile.
#[inline(always)]
unsafe fn run_input<'a, T: Element>(
    x: Span<T>,
    g: &Flat,
    (plane, oy, rows): (usize, usize, usize),
    widened: &'a mut Vec<T::Acc>,
) -> (&'a [T::Acc], usize) {
    let ([h, w], [_, ow], [kh, _], [sh, sw]) = (g.input, g.output, g.kernel, g.stride);
    let width = ow * sw;
    let input_rows = (rows - 1) * sh + kh;
    let first = plane * h * w + oy * sh * w;
    // SAFETY: the caller's contract.
    let input = unsafe { x.slice(first..first + (input_rows - 1) * w + width) };
    match as_acc(input) {
        Some(a) => (a, w),
        None => {
            widened.resize(input_rows * width, <T::Acc as Real>::ZERO);
            for (r, dst) in widened.chunks_exact_mut(width).enumerate() {
                widen_into(&input[r * w..r * w + width], dst);
            }
            (&widened[..], width)
        }
    }
}

/// Outputs `range` of `y` as the compute type: in place when the element type is the compute
/// type, else `narrow`, resized to the range, for [`narrow_outputs`] to round into `y`.
///
/// # Safety
/// `range` is inside `y`, and no other slice of it lives or is written while this one lives.
#[inline(always)]
unsafe fn outputs_in_acc<T: Element>(
    y: Span<T>,
    range: Range<usize>,
    narrow: &mut Vec<T::Acc>,
) -> &mut [T::Acc] {
    let len = range.len();
    // SAFETY: the caller's contract.
    match as_acc_mut(unsafe { y.slice_mut(range) }) {
        Some(out) => out,
        None => {
            narrow.resize(len, <T::Acc as Real>::ZERO);
            narrow
        }
    }
}

/// Rounds `narrow` into outputs `range` of `y` when [`outputs_in_acc`] gave it for them (the
/// element type is not the compute type); nothing otherwise.
///
/// # Safety
/// As [`outputs_in_acc`].
#[inline(always)]
unsafe fn narrow_outputs<T: Element>(y: Span<T>, range: Range<usize>, narrow: &[T::Acc]) {
    if as_acc::<T>(&[]).is_none() {
        // SAFETY: the caller's contract.
        super::host::narrow_into(narrow, unsafe { y.slice_mut(range) });
    }
}

/// Output rows `rows` (counted over every plane) of a [`Flat`] pool of `x` into `y`.
struct FlatRows<'a, T> {
    x: Span<T>,
    y: Span<T>,
    g: &'a Flat,
    rows: Range<usize>,
}

impl<T: Element> Step<T::Acc> for FlatRows<'_, T> {
    type Out = ();

    /// # Safety
    /// The geometry is [`Flat::of`] the descriptor `x` and `y` belong to (so every window of
    /// every output row lies inside `x`), `rows` is inside the output, and no other task reads or
    /// writes those output rows meanwhile.
    #[inline(always)]
    unsafe fn run<V: Vector<T::Acc>>(self) {
        let FlatRows { x, y, g, rows } = self;
        let ([_, ow], [kh, kw], [sh, sw]) = (g.output, g.kernel, g.stride);
        let zero = <T::Acc as Real>::ZERO;
        let width = ow * sw;
        let block = (FLAT_BLOCK / width).clamp(1, rows.len().max(1));
        // Each pooled row is stored as whole vectors (past its end, into the next row's place);
        // the column pass reads up to two vectors past the block's last output.
        let mut pooled = vec![zero; block * width + 2 * V::LANES];
        // The input widened to the compute type, for element types narrower than it.
        let mut widened = Vec::new();
        // The block's outputs in the compute type, likewise.
        let mut narrow = Vec::new();
        let mut runs = PlaneRuns::from(rows.start, g.output[0]);
        let mut start = rows.start;
        while start < rows.end {
            let end = (start + block).min(rows.end);
            let mut done = 0;
            while start + done < end {
                let run = runs.next(end - start - done);
                // SAFETY: the run's windows lie inside the input (the caller's contract).
                let (input, row_step) = unsafe { run_input(x, g, run, &mut widened) };
                let geometry = RowPass {
                    rows: run.2,
                    taps: kh,
                    width,
                    row_step,
                    window_step: sh * row_step,
                };
                // SAFETY: at this level (the caller's); `pooled` holds the block's rows and two
                // vectors more.
                unsafe {
                    pool_rows::<T::Acc, V>(&mut pooled[done * width..], input, geometry, g.avg)
                };
                done += run.2;
            }
            // SAFETY: output rows `start .. end` are this task's (the caller's contract).
            let dst = unsafe { outputs_in_acc(y, start * ow..end * ow, &mut narrow) };
            // SAFETY: at this level; `pooled` holds the block's rows and two vectors more.
            unsafe { pool_columns::<T::Acc, V>(dst, &pooled, sw, kw, g.avg) };
            if g.avg {
                let window = <T::Acc as Real>::from_f64((kh * kw) as f64);
                for a in dst.iter_mut() {
                    *a = *a / window;
                }
            }
            // SAFETY: as above.
            unsafe { narrow_outputs(y, start * ow..end * ow, &narrow) };
            start = end;
        }
    }
}

/// Output rows `rows` (counted over every plane) of a [`Flat`] max pool of `x` into `y`, with
/// each window's position in its plane into `at`: the first largest tap in row-major window
/// order, or the last NaN, as the reference. Each tap row of a block is copied into its own
/// buffer, rows end to end, so that every tap `(r, s)` is one strided pass over all the block's
/// outputs, in window order.
struct FlatPositions<'a, T> {
    x: Span<T>,
    y: Span<T>,
    at: Span<i64>,
    g: &'a Flat,
    rows: Range<usize>,
}

impl<T: Element> Step<T::Acc> for FlatPositions<'_, T> {
    type Out = ();

    /// # Safety
    /// As [`FlatRows::run`], for both outputs.
    #[inline(always)]
    unsafe fn run<V: Vector<T::Acc>>(self) {
        let FlatPositions { x, y, at, g, rows } = self;
        let ([_, w], [_, ow], [kh, kw], [sh, sw]) = (g.input, g.output, g.kernel, g.stride);
        let zero = <T::Acc as Real>::ZERO;
        let width = ow * sw;
        let block = (FLAT_BLOCK / (kh * width)).clamp(1, rows.len().max(1));
        // Tap row `r` of the block's output rows, end to end, each row stored as whole vectors.
        let region = block * width + V::LANES;
        let mut tap_rows = vec![zero; kh * region];
        let mut widened = Vec::new();
        let mut narrow = Vec::new();
        // Per output of the block: the chosen tap's offset from its window's first element.
        let mut chosen = vec![0i64; block * ow];
        // Each output column's first window element, from its row's start.
        let columns: Vec<i64> = (0..ow).map(|ox| (ox * sw) as i64).collect();
        // The first row in its plane of each run of the block, and the run's length.
        let mut block_runs = Vec::new();
        let mut runs = PlaneRuns::from(rows.start, g.output[0]);
        let mut start = rows.start;
        while start < rows.end {
            let end = (start + block).min(rows.end);
            let outs = (end - start) * ow;
            block_runs.clear();
            let mut done = 0;
            while start + done < end {
                let run = runs.next(end - start - done);
                // SAFETY: the run's windows lie inside the input (the caller's contract).
                let (input, row_step) = unsafe { run_input(x, g, run, &mut widened) };
                for (r, dst) in tap_rows.chunks_exact_mut(region).enumerate() {
                    let geometry = RowPass {
                        rows: run.2,
                        taps: 1,
                        width,
                        row_step,
                        window_step: sh * row_step,
                    };
                    // SAFETY: at this level (the caller's); `dst` holds the block's rows and a
                    // vector more.
                    unsafe {
                        pool_rows::<T::Acc, V>(
                            &mut dst[done * width..],
                            &input[r * row_step..],
                            geometry,
                            false,
                        )
                    };
                }
                block_runs.push((run.1, run.2));
                done += run.2;
            }
            let chosen = &mut chosen[..outs];
            // SAFETY: output rows `start .. end` are this task's (the caller's contract).
            let best = unsafe { outputs_in_acc(y, start * ow..end * ow, &mut narrow) };
            for r in 0..kh {
                let row = &tap_rows[r * region..r * region + outs * sw];
                for s in 0..kw {
                    let tap = ((r * w + s) as i64, r + s == 0);
                    search_tap(best, chosen, row, (sw, s), tap);
                }
            }
            // SAFETY: as above.
            unsafe { narrow_outputs(y, start * ow..end * ow, &narrow) };
            // SAFETY: as above.
            let is = unsafe { at.slice_mut(start * ow..end * ow) };
            let mut outputs = is.chunks_exact_mut(ow).zip(chosen.chunks_exact(ow));
            for &(oy, len) in &block_runs {
                for ((is, chosen), oy) in outputs.by_ref().take(len).zip(oy..) {
                    let row_start = (oy * sh * w) as i64;
                    for ((p, &c), &t) in is.iter_mut().zip(&columns).zip(chosen) {
                        *p = row_start + c + t;
                    }
                }
            }
            start = end;
        }
    }
}

/// The geometry of a [`pool_rows`] pass: `rows` output rows of `width` columns, each pooling
/// `taps` input rows `row_step` apart, the first input row of output row `i` at
/// `i·window_step`.
#[derive(Clone, Copy)]
struct RowPass {
    rows: usize,
    taps: usize,
    width: usize,
    row_step: usize,
    window_step: usize,
}

/// Pools the taps of each output row of `input` column by column into `dst` (output row `i` at
/// `i·width`): their sum when `sum`, else their max (NaN if any is NaN); a single tap is copied.
/// Rows are written in whole vectors, the last up to one vector past its end; `input` is read
/// only inside the rows.
///
/// # Safety
/// As [`Vector`]'s methods for `V`. Panics when the pass has no rows or taps, `input` is shorter
/// than its rows, or `dst` shorter than its rows with the last rounded up to whole vectors.
#[inline(always)]
unsafe fn pool_rows<A: Real, V: Vector<A>>(dst: &mut [A], input: &[A], g: RowPass, sum: bool) {
    let lanes = V::LANES;
    let RowPass {
        rows,
        taps,
        width,
        row_step,
        window_step,
    } = g;
    assert!(
        rows > 0
            && taps > 0
            && input.len() >= (rows - 1) * window_step + (taps - 1) * row_step + width
            && dst.len() >= (rows - 1) * width + width.div_ceil(lanes) * lanes,
        "pooled rows outside their buffers"
    );
    let (s, d) = (input.as_ptr(), dst.as_mut_ptr());
    if width <= lanes {
        // One vector per row: a loop over rows alone.
        for i in 0..rows {
            // SAFETY: row `i`'s window and `dst[i·width .. i·width + lanes]` are inside (checked
            // above).
            unsafe {
                pool_window::<A, V>(s.add(i * window_step), 0, g, sum).store(d.add(i * width))
            };
        }
        return;
    }
    for i in 0..rows {
        let mut j = 0;
        while j < width {
            // SAFETY: `j < width`: as above.
            unsafe {
                pool_window::<A, V>(s.add(i * window_step), j, g, sum).store(d.add(i * width + j))
            };
            j += lanes;
        }
    }
}

/// Columns `j .. min(j + LANES, width)` of the window at `p` (its `taps` rows `row_step`
/// apart), pooled as [`pool_rows`] does; the lanes past `width` are zero.
///
/// # Safety
/// As [`Vector`]'s methods for `V`; `j < width` and every tap row of the window holds `width`
/// readable elements.
#[inline(always)]
unsafe fn pool_window<A: Real, V: Vector<A>>(p: *const A, j: usize, g: RowPass, sum: bool) -> V {
    let left = g.width - j;
    // SAFETY: the caller's contract.
    let load = |q: *const A| unsafe {
        if left >= V::LANES {
            V::load(q.add(j))
        } else {
            V::load_first(q.add(j), left)
        }
    };
    let mut v = load(p);
    for r in 1..g.taps {
        // SAFETY: as above.
        let x = load(unsafe { p.add(r * g.row_step) });
        // SAFETY: the caller's contract.
        v = unsafe {
            if sum {
                v.add(x)
            } else {
                v.max(x)
            }
        };
    }
    v
}

/// One tap of a max search over windows `i` whose tap `(r, s)` is `row[i·sw + s]`: where it is
/// larger than `best` or NaN, it becomes the best and its offset (`tap.0`) the chosen one. The
/// window's first tap (`tap.1`) starts the search instead.
#[inline(always)]
fn search_tap<A: Real>(
    best: &mut [A],
    chosen: &mut [i64],
    row: &[A],
    (sw, s): (usize, usize),
    tap: (i64, bool),
) {
    match (sw, s) {
        (1, 0) => search_column::<A, 1, 0>(best, chosen, row, tap),
        (2, 0) => search_column::<A, 2, 0>(best, chosen, row, tap),
        (2, 1) => search_column::<A, 2, 1>(best, chosen, row, tap),
        _ => {
            let columns = row.chunks_exact(sw).map(|group| group[s]);
            search_values(best, chosen, columns, tap)
        }
    }
}

/// [`search_tap`] for a stride and a column known at compile time (so that the strided loads
/// vectorise).
#[inline(always)]
fn search_column<A: Real, const SW: usize, const S: usize>(
    best: &mut [A],
    chosen: &mut [i64],
    row: &[A],
    tap: (i64, bool),
) {
    let (groups, _) = row.as_chunks::<SW>();
    search_values(best, chosen, groups.iter().map(|g| g[S]), tap)
}

/// [`search_tap`] over the tap's values in window order.
#[inline(always)]
fn search_values<A: Real>(
    best: &mut [A],
    chosen: &mut [i64],
    values: impl Iterator<Item = A>,
    (offset, first): (i64, bool),
) {
    let outs = best.iter_mut().zip(chosen.iter_mut()).zip(values);
    if first {
        for ((b, c), v) in outs {
            (*b, *c) = (v, offset);
        }
    } else {
        for ((b, c), v) in outs {
            let take = (v > *b) | v.is_nan();
            *b = if take { v } else { *b };
            *c = if take { offset } else { *c };
        }
    }
}

/// Output `i` of `dst` pools `pooled[i·sw .. i·sw + kw]` (sum when `sum`, else max with NaN
/// propagated): deinterleaved whole vectors for `sw = 2`, a copy for `sw = kw = 1`, element by
/// element otherwise.
///
/// # Safety
/// As [`Vector`]'s methods for `V`. Panics when `kw > sw` or `pooled` holds fewer than
/// `dst.len()·sw + 2·LANES` elements.
#[inline(always)]
unsafe fn pool_columns<A: Real, V: Vector<A>>(
    dst: &mut [A],
    pooled: &[A],
    sw: usize,
    kw: usize,
    sum: bool,
) {
    let (n, lanes) = (dst.len(), V::LANES);
    assert!(
        kw <= sw && pooled.len() >= n * sw + 2 * lanes,
        "column pass past its rows"
    );
    if sw == 2 {
        let (p, d) = (pooled.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        while i < n {
            // SAFETY: `i < n`, so `pooled[2i .. 2i + 2·lanes]` is inside (checked above), and
            // `dst[i .. i + min(lanes, n − i)]` is.
            unsafe {
                let (even, odd) = V::deinterleave(p.add(2 * i));
                let v = match (kw, sum) {
                    (1, _) => even,
                    (_, true) => even.add(odd),
                    (_, false) => even.max(odd),
                };
                if n - i >= lanes {
                    v.store(d.add(i));
                } else {
                    v.store_first(d.add(i), n - i);
                }
            }
            i += lanes;
        }
    } else if sw == 1 {
        dst.copy_from_slice(&pooled[..n]);
    } else {
        for (i, o) in dst.iter_mut().enumerate() {
            let taps = &pooled[i * sw..i * sw + kw];
            *o = taps[1..].iter().fold(taps[0], |m, &v| match sum {
                true => m + v,
                false if (v > m) | v.is_nan() => v,
                false => m,
            });
        }
    }
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
    use crate::backends::cpu::SimdLevel;
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
                    for simd in SimdLevel::runnable() {
                        let got_ptr = mem.alloc(m * dtype.size_in_bytes()).unwrap();
                        on_threads(threads, |ctx| {
                            pool2d(&mut mem, &desc(got_ptr), Ctx { simd, ..ctx })
                        })
                        .unwrap();
                        let got = mem.load_dense(dtype, got_ptr, m).unwrap();
                        let what = format!(
                            "{kind:?} {dtype} {shape:?} k {kernel:?} s {stride:?} p {padding:?}, {threads} thread(s), {simd:?}"
                        );
                        check(dtype, &got, &want, &what);
                        mem.free(got_ptr).unwrap();
                    }
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

    /// What a positions test's input holds besides random values.
    #[derive(Clone, Copy, PartialEq)]
    enum Fill {
        Random,
        /// Every 29th element NaN.
        Nans,
        /// Values rounded to the five integers −2 ..= 2, so most windows hold their largest value
        /// more than once and only the first may be chosen.
        Ties,
    }

    /// The max pool with positions, and both gradients, on every float dtype with 1 and 2 threads,
    /// against the reference: positions exactly, values within the dtype's bound.
    fn check_indices_and_gradients(
        shape: [usize; 4],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        fill: Fill,
    ) {
        let n: usize = shape.iter().product();
        let mut x = random(n, (3 * n + kernel[1]) as u64);
        match fill {
            Fill::Random => {}
            Fill::Nans => x.iter_mut().skip(5).step_by(29).for_each(|v| *v = f64::NAN),
            Fill::Ties => x
                .iter_mut()
                .for_each(|v| *v = (*v * 2.0).round().clamp(-2.0, 2.0)),
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
                // Every SIMD level into fresh (poisoned) outputs; the gradients below read the
                // last level's positions.
                let mut got_ix = None;
                for simd in SimdLevel::runnable() {
                    let (got, ix) = (mem.alloc(m * size).unwrap(), mem.alloc(m * 8).unwrap());
                    on_threads(threads, |ctx| {
                        pool2d(&mut mem, &forward(got, ix), Ctx { simd, ..ctx })
                    })
                    .unwrap();
                    assert_eq!(
                        load_i64(&mem, ix, m),
                        want_ix,
                        "positions, {what}, {simd:?}"
                    );
                    let got = mem.load_dense(dtype, got, m).unwrap();
                    check(dtype, &got, &want, &format!("{what}, {simd:?}"));
                    got_ix = Some(ix);
                }
                let got_ix = got_ix.unwrap();
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
            check_indices_and_gradients(shape, kernel, stride, padding, Fill::Random);
        }
        check_indices_and_gradients([2, 3, 9, 8], [3, 3], [1, 2], [1, 1], Fill::Nans);
    }

    /// The [`Flat`] geometries (no padding, columns apart) with positions: many small planes, a
    /// window narrower than its stride, a stride of 3, rows wider than a vector with a ragged
    /// end, and rows split between tasks and blocks in mid-plane; with NaN and with ties.
    #[test]
    fn flat_pools_find_the_reference_positions() {
        for (shape, kernel, stride) in [
            ([32, 8, 8, 8], [2, 2], [2, 2]),
            ([3, 5, 7, 9], [2, 2], [2, 2]),
            ([2, 3, 9, 8], [3, 1], [2, 2]),
            ([2, 3, 9, 11], [2, 3], [1, 3]),
            ([1, 2, 11, 70], [2, 2], [2, 2]),
            ([2, 3, 130, 102], [2, 2], [2, 2]),
        ] {
            assert!(flat(shape, kernel, stride, [0, 0]).is_some(), "{shape:?}");
            for fill in [Fill::Random, Fill::Nans, Fill::Ties] {
                check_indices_and_gradients(shape, kernel, stride, [0, 0], fill);
            }
        }
    }

    /// [`Flat::of`] the max pool of `shape` with this window.
    fn flat(
        shape: [usize; 4],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Option<Flat> {
        let output_shape =
            Pool2dDesc::expected_output_shape(shape, kernel, stride, padding).unwrap();
        let p = crate::compute::DevicePtr(64);
        Flat::of(&Pool2dDesc {
            kind: PoolKind::Max,
            dtype: DType::F32,
            input: p,
            input_shape: shape,
            output: p,
            output_shape,
            kernel,
            stride,
            padding,
            indices: None,
        })
    }

    /// The two-pass kernel takes only windows without padding whose columns do not overlap.
    #[test]
    fn flat_pools_are_unpadded_with_columns_apart() {
        let shape = [2, 3, 9, 8];
        assert!(flat(shape, [2, 2], [2, 2], [0, 0]).is_some());
        assert!(flat(shape, [1, 1], [1, 1], [0, 0]).is_some());
        assert!(flat(shape, [3, 2], [1, 2], [0, 0]).is_some());
        // Padding, overlapping columns, and a stride that leaves a row's last columns unused
        // past its width (`ow·sw > w`).
        assert!(flat(shape, [2, 2], [2, 2], [1, 1]).is_none());
        assert!(flat(shape, [3, 3], [2, 2], [0, 0]).is_none());
        assert!(flat(shape, [2, 2], [1, 1], [0, 0]).is_none());
        assert!(flat([1, 1, 4, 7], [2, 1], [2, 3], [0, 0]).is_none());
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

    /// The [`Flat`] geometries of `flat_pools_find_the_reference_positions`, for max and both
    /// averages, with and without NaN.
    #[test]
    fn flat_pools_match_the_reference() {
        for (shape, kernel, stride) in [
            ([32, 8, 8, 8], [2, 2], [2, 2]),
            ([3, 5, 7, 9], [2, 2], [2, 2]),
            ([2, 3, 9, 8], [3, 1], [2, 2]),
            ([2, 3, 9, 11], [2, 3], [1, 3]),
            ([1, 2, 11, 70], [2, 2], [2, 2]),
            ([2, 3, 130, 102], [2, 2], [2, 2]),
        ] {
            assert!(flat(shape, kernel, stride, [0, 0]).is_some(), "{shape:?}");
            check_pool(shape, kernel, stride, [0, 0], false);
            check_pool(shape, kernel, stride, [0, 0], true);
        }
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
        check_indices_and_gradients(shape, [2, 2], [2, 2], [0, 0], Fill::Random);
    }

    #[test]
    fn nan_makes_its_windows_max_nan() {
        check_pool([2, 3, 9, 8], [3, 3], [2, 2], [1, 1], true);
        check_pool([1, 2, 20, 21], [2, 3], [1, 1], [0, 1], true);
    }
}
