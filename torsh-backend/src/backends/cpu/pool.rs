//! 2-D max and average pooling on the CPU.
//!
//! Work is split across threads by output rows of all `N·C` planes. An output row accumulates its
//! window one tap at a time: for tap `(r, s)` the output columns whose input column is inside the
//! image form one range, so the inner loop runs branch-free along the output width (contiguous loads
//! for stride 1). Padding never enters a max; a NaN in a window makes its max NaN; averages divide by
//! the full window or by the number of real elements, as the descriptor says.

use std::ops::Range;

use super::host::{for_chunks, with_float, with_simd, Ctx, Element, Real, Span};
use super::reduce::{as_acc_mut, Source};
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{memory::HostMemory, pool as reference};
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::{Pool2dDesc, PoolKind};
use crate::error::Result;

/// Pools each `[N, C]` plane.
pub(crate) fn pool2d(mem: &mut HostMemory, d: &Pool2dDesc, ctx: Ctx) -> Result<()> {
    if d.output_shape.contains(&0) {
        return Ok(());
    }
    with_float!(d.dtype, T => typed::<T>(mem, d, ctx), _ => reference::pool2d(mem, d))
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
    let min_rows = (super::host::SERIAL_ELEMENTS / work).max(1);
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
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.pool2d(desc);
        };
        self.kernel(acc, |mem, ctx| pool2d(mem, desc, ctx))
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
    fn nan_makes_its_windows_max_nan() {
        check_pool([2, 3, 9, 8], [3, 3], [2, 2], [1, 1], true);
        check_pool([1, 2, 20, 21], [2, 3], [1, 1], [0, 1], true);
    }
}
