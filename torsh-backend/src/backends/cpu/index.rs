//! Gathering and scattering by index tensors on the CPU, spread over the backend's threads. A
//! scatter checks every index first, so a bad one leaves the output untouched. A gather checks each
//! output row's indices just before it gathers the row, while they are in cache, and reports the
//! first bad index in the index's memory order after the pass; on that error the output's contents
//! are unspecified (a gather writes nothing but its output).
//!
//! A gather writes its output in row-major order by runs along the last dim. Elements move as raw
//! bits of their width, so every dtype gathers. A run whose index repeats along the last dim
//! (`index_select` and `embedding` rows) and whose input is dense there is one `memcpy`. A dense
//! row gathered by a dense row of indices first reads its input row in order, one element per
//! cache line, when the picks outnumber the row's lines, and streams an output of
//! [`STREAM_BYTES`](crate::backends::cpu::stream::STREAM_BYTES) or more past the cache.
//!
//! A scatter runs by columns: the index positions that share every coordinate but `dim`, which land
//! on output elements no other column touches. Each column is walked along `dim` in order, so
//! repeated indices assign (the last wins) or add (in the index's order) exactly as the reference
//! does, whatever the thread count; additions accumulate in the dtype's compute type (f32 for f16 and
//! bf16, rounded at each addition).

use std::sync::atomic::{AtomicBool, Ordering};

use super::host::{for_chunks, with_simd, Ctx, Element, Real, Span};
use crate::backends::cpu::cost::{items_per_task, TASK_ELEMENTS};
use crate::backends::cpu::stream::{worth_streaming, Streamer, BLOCK_BYTES, STREAM_RUN_BYTES};
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::index::step;
use crate::backends::reference::memory::HostMemory;
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::{check_index, DevicePtr, GatherDesc, ScatterDesc, ScatterReduce, StridedBuf};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::contiguous_strides;

/// An index element type.
trait IndexValue: bytemuck::Pod + Send + Sync {
    fn get(self) -> i64;
}

impl IndexValue for i32 {
    #[inline(always)]
    fn get(self) -> i64 {
        self as i64
    }
}

impl IndexValue for i64 {
    #[inline(always)]
    fn get(self) -> i64 {
        self
    }
}

/// A strided view's elements from its first to its last, and its strides relative to the first.
struct Strided<T> {
    span: Span<T>,
    strides: Vec<usize>,
}

impl<T: bytemuck::Pod> Strided<T> {
    fn of(mem: &mut HostMemory, op: &'static str, buf: &StridedBuf) -> Result<Strided<T>> {
        let start = buf.layout.offset();
        let end = buf.layout.span_elements()?;
        let first = DevicePtr(buf.ptr.0 + (start * std::mem::size_of::<T>()) as u64);
        Ok(Strided {
            span: Span::of(mem, op, first, end - start)?,
            strides: buf.layout.strides().to_vec(),
        })
    }
}

/// `IndexOutOfRange` for the first index of the view `buf` (held by `index`) outside `0..size`,
/// checked in the index's memory order over the backend's threads (a broadcast index is read once).
fn check_all<I: IndexValue>(
    op: &'static str,
    index: &Strided<I>,
    buf: &StridedBuf,
    size: usize,
    ctx: Ctx,
) -> Result<()> {
    // SAFETY: the span is the index view's extent and nothing writes it during the op.
    let raw = unsafe { index.span.slice(0..index.span.len()) };
    let bad = AtomicBool::new(false);
    let limit = size as u64;
    for_chunks(raw.len(), ctx.threads, TASK_ELEMENTS, |range| {
        // As unsigned, a negative index is past every size.
        if raw[range].iter().any(|i| i.get() as u64 >= limit) {
            bad.store(true, Ordering::Relaxed);
        }
    });
    if bad.into_inner() {
        // The view may skip elements of its span: the first bad index it reads, if any.
        let offset = buf.layout.offset();
        let mut first_bad = None;
        buf.layout.for_each_index(|e| {
            let v = raw[e - offset].get();
            if first_bad.is_none() && check_index(op, v, size).is_err() {
                first_bad = Some(v);
            }
        });
        if let Some(v) = first_bad {
            return check_index(op, v, size);
        }
    }
    Ok(())
}

/// The gather of `d` with elements of width `W` and indices of type `I`.
fn gather_typed<W: bytemuck::Pod + Send + Sync, I: IndexValue>(
    mem: &mut HostMemory,
    d: &GatherDesc,
    ctx: Ctx,
) -> Result<()> {
    let op = "gather";
    let shape = d.index.layout.shape().to_vec();
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    let input = Strided::<W>::of(mem, op, &d.input)?;
    let index = Strided::<I>::of(mem, op, &d.index)?;
    let out = Span::<W>::of(mem, op, d.output, n)?;
    let size = d.input.layout.shape()[d.dim];
    // As unsigned, a negative index is past every size.
    let limit = size as u64;
    let bad = AtomicBool::new(false);
    let rank = shape.len();
    let last = rank - 1;
    let len = shape[last];
    let rows = n / len;
    let (dim, dim_stride) = (d.dim, input.strides[d.dim]);
    let (in_last, ix_last) = (input.strides[last], index.strides[last]);
    let row_run = dim != last && ix_last == 0 && in_last == 1;
    let dense_rows = dim == last && ix_last == 1 && dim_stride == 1;
    let width = std::mem::size_of::<W>();
    // Dense rows picked by dense rows of indices stream a large output past the cache, a block
    // built in L1 at a time (see `stream`).
    let stream = dense_rows
        && worth_streaming(n.saturating_mul(width))
        && len.saturating_mul(width) >= STREAM_RUN_BYTES;
    // Rows whose picks outnumber their cache lines are read in order first (`touch_lines`).
    let sweep = dense_rows && size.div_ceil((LINE_BYTES / width).max(1)) <= len;
    let min_rows = items_per_task(len);
    for_chunks(rows, ctx.threads, min_rows, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // A line more than a block, so that the block can start on a line.
                let block = (BLOCK_BYTES + LINE_BYTES) / width;
                let mut streamer = stream.then(|| (Streamer::new(), vec![W::zeroed(); block]));
                // The multi-index of the first row, then row by row.
                let mut coord = vec![0usize; rank];
                let mut rest = range.start;
                for k in (0..last).rev() {
                    coord[k] = rest % shape[k];
                    rest /= shape[k];
                }
                for row in range {
                    let (mut at_in, mut at_ix) = (0usize, 0usize);
                    for (k, &c) in coord[..last].iter().enumerate() {
                        at_ix += c * index.strides[k];
                        if k != dim {
                            at_in += c * input.strides[k];
                        }
                    }
                    let first = row * len;
                    if last > 0 {
                        step(&mut coord[..last], &shape[..last]);
                    }
                    // Without an early exit, so that a dense row of indices is checked a vector
                    // at a time.
                    // SAFETY: the row's indices are inside the index's extent, which nothing
                    // writes.
                    let out_of_range = unsafe {
                        if row_run {
                            index.span.read(at_ix).get() as u64 >= limit
                        } else {
                            (0..len).fold(false, |any, j| {
                                any | (index.span.read(at_ix + j * ix_last).get() as u64 >= limit)
                            })
                        }
                    };
                    if out_of_range {
                        bad.store(true, Ordering::Relaxed);
                        continue;
                    }
                    // SAFETY: every index of the row was checked to lie in `0..size`, so each read
                    // is inside the input's extent; tasks write disjoint row ranges of the output,
                    // which overlaps no input.
                    unsafe {
                        if row_run {
                            let from = at_in + index.span.read(at_ix).get() as usize * dim_stride;
                            out.slice_mut(first..first + len)
                                .copy_from_slice(input.span.slice(from..from + len));
                        } else if dense_rows {
                            // A dense row gathered by a dense row of indices.
                            let from = input.span.slice(at_in..at_in + size);
                            let picks = index.span.slice(at_ix..at_ix + len);
                            let dst = out.slice_mut(first..first + len);
                            if sweep {
                                touch_lines(from);
                            }
                            match streamer.as_mut() {
                                Some((s, block)) => s.blocks(dst, block, |at, b| {
                                    pick(from, &picks[at..at + b.len()], b)
                                }),
                                None => pick(from, picks, dst),
                            }
                        } else if dim == last {
                            for j in 0..len {
                                let i = index.span.read(at_ix + j * ix_last).get() as usize;
                                out.write(first + j, input.span.read(at_in + i * dim_stride));
                            }
                        } else {
                            for j in 0..len {
                                let i = index.span.read(at_ix + j * ix_last).get() as usize;
                                let from = at_in + i * dim_stride + j * in_last;
                                out.write(first + j, input.span.read(from));
                            }
                        }
                    }
                }
            },
        )
    });
    if bad.into_inner() {
        // Some row held an index out of range (its output row is unwritten): the first in the
        // index's memory order is the error, which the check finds.
        check_all(op, &index, &d.index, size, ctx)?;
        return Err(BackendError::invalid(
            op,
            "a row's index was out of range but the check found none (internal error)",
        ));
    }
    Ok(())
}

/// Bytes of a cache line.
const LINE_BYTES: usize = 64;

/// Reads one element of each cache line of `row`, in order. A gather's picks read a row's lines in
/// random order, which the hardware prefetchers cannot follow, so each first touch waits for
/// memory; read in order first, the row streams into cache (on a 4096-element f32 row, the gather
/// ran about 15 % faster).
#[inline(always)]
fn touch_lines<W: Copy>(row: &[W]) {
    let step = (LINE_BYTES / std::mem::size_of::<W>().max(1)).max(1);
    for w in row.iter().step_by(step) {
        std::hint::black_box(*w);
    }
}

/// `out[j] = from[picks[j]]` for each `j`.
///
/// # Safety
/// Every index of `picks` lies in `0..from.len()`, and the lengths of `picks` and `out` match.
#[inline(always)]
unsafe fn pick<W: Copy, I: IndexValue>(from: &[W], picks: &[I], out: &mut [W]) {
    for (o, i) in out.iter_mut().zip(picks) {
        // SAFETY: the caller checked the index.
        *o = unsafe { *from.get_unchecked(i.get() as usize) };
    }
}

/// The gather of `d`, by element width and index type.
fn gather(mem: &mut HostMemory, d: &GatherDesc, ctx: Ctx) -> Result<()> {
    macro_rules! by_index {
        ($w:ty) => {
            match d.index_dtype {
                DType::I32 => gather_typed::<$w, i32>(mem, d, ctx),
                _ => gather_typed::<$w, i64>(mem, d, ctx),
            }
        };
    }
    match d.dtype.size_in_bytes() {
        1 => by_index!(u8),
        2 => by_index!(u16),
        4 => by_index!(u32),
        _ => by_index!(u64),
    }
}

/// How a scatter combines a source element with the output element it lands on.
trait Combine<W>: Copy + Send + Sync {
    /// Combines `src[s]` into `out[t]`.
    ///
    /// # Safety
    /// `t` and `s` are inside their spans and no other task touches `out[t]` meanwhile.
    unsafe fn apply(self, out: Span<W>, t: usize, src: Span<W>, s: usize);

    /// Combines each element of `src` into the same element of `out` (equal lengths).
    fn apply_run(self, out: &mut [W], src: &[W]);
}

/// `out[t] = src[s]`, bits moved.
#[derive(Clone, Copy)]
struct Assign;

impl<W: bytemuck::Pod + Send + Sync> Combine<W> for Assign {
    #[inline(always)]
    unsafe fn apply(self, out: Span<W>, t: usize, src: Span<W>, s: usize) {
        // SAFETY: as the trait method's contract.
        unsafe { out.write(t, src.read(s)) }
    }

    #[inline(always)]
    fn apply_run(self, out: &mut [W], src: &[W]) {
        out.copy_from_slice(src);
    }
}

/// `out[t] += alpha · src[s]` in `T`'s compute type, rounded once per addition.
struct AddScaled<T: Element> {
    alpha: T::Acc,
}

impl<T: Element> Clone for AddScaled<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Element> Copy for AddScaled<T> {}

impl<T: Element> Combine<T> for AddScaled<T> {
    #[inline(always)]
    unsafe fn apply(self, out: Span<T>, t: usize, src: Span<T>, s: usize) {
        // SAFETY: as the trait method's contract.
        unsafe {
            let v = out.read(t).widen() + self.alpha * src.read(s).widen();
            out.write(t, T::narrow(v));
        }
    }

    #[inline(always)]
    fn apply_run(self, out: &mut [T], src: &[T]) {
        for (o, &x) in out.iter_mut().zip(src) {
            *o = T::narrow(o.widen() + self.alpha * x.widen());
        }
    }
}

/// Columns a scatter task advances along `dim` together.
const COLUMN_BLOCK: usize = 1024;

/// Where each column of a scatter starts in the index, the source and the output, and the steps
/// along `dim` of each.
struct Columns {
    /// The index's shape without `dim`.
    outer: Vec<usize>,
    /// The strides of index, source and output over `outer`.
    strides: [Vec<usize>; 3],
    /// Positions along `dim`, and the step of index, source and output along it.
    len: usize,
    steps: [usize; 3],
}

impl Columns {
    fn of(d: &ScatterDesc, index: &[usize], src: &[usize]) -> Columns {
        let out = contiguous_strides(&d.output_shape);
        let shape = d.index.layout.shape();
        let others = |v: &[usize]| -> Vec<usize> {
            v.iter()
                .enumerate()
                .filter(|&(k, _)| k != d.dim)
                .map(|(_, &x)| x)
                .collect()
        };
        Columns {
            outer: others(shape),
            strides: [others(index), others(src), others(&out)],
            len: shape[d.dim],
            steps: [index[d.dim], src[d.dim], out[d.dim]],
        }
    }

    /// The number of columns.
    fn count(&self) -> usize {
        self.outer.iter().product()
    }

    /// Where column `c` starts in index, source and output.
    fn start(&self, mut c: usize) -> [usize; 3] {
        let mut at = [0usize; 3];
        for k in (0..self.outer.len()).rev() {
            let i = c % self.outer[k];
            c /= self.outer[k];
            for (a, s) in at.iter_mut().zip(&self.strides) {
                *a += i * s[k];
            }
        }
        at
    }
}

/// The scatter of `d` with elements `W` combined by `combine`, indices of type `I`.
fn scatter_typed<W: bytemuck::Pod + Send + Sync, I: IndexValue>(
    mem: &mut HostMemory,
    d: &ScatterDesc,
    ctx: Ctx,
    combine: impl Combine<W>,
) -> Result<()> {
    let op = "scatter";
    let n: usize = d.index.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let index = Strided::<I>::of(mem, op, &d.index)?;
    let src = Strided::<W>::of(mem, op, &d.src)?;
    let total: usize = d.output_shape.iter().product();
    let out = Span::<W>::of(mem, op, d.output, total)?;
    let size = d.output_shape[d.dim];
    check_all(op, &index, &d.index, size, ctx)?;
    let cols = Columns::of(d, &index.strides, &src.strides);
    let min = items_per_task(cols.len);
    if cols.outer.len() == 1 && cols.strides.iter().map(|s| s[0]).eq([0, 1, 1]) {
        // Whole rows (`index_add` or `index_copy` along dim 0 of a matrix): one index per step
        // along `dim`, rows dense in the source and the output, so each step combines a run of
        // neighbouring columns in a vectorised loop.
        for_chunks(cols.count(), ctx.threads, min, |range| {
            with_simd(
                ctx.simd,
                #[inline(always)]
                || {
                    for j in 0..cols.len {
                        // SAFETY: as below; the index is read at step `j` of column 0, which
                        // every column shares.
                        let row = unsafe { index.span.read(j * cols.steps[0]).get() as usize };
                        let (t, s) = (row * cols.steps[2], j * cols.steps[1]);
                        // SAFETY: as below: this task owns these columns of every row, and the
                        // output overlaps no input.
                        let (o, x) = unsafe {
                            (
                                out.slice_mut(t + range.start..t + range.end),
                                src.span.slice(s + range.start..s + range.end),
                            )
                        };
                        combine.apply_run(o, x);
                    }
                },
            )
        });
        return Ok(());
    }
    for_chunks(cols.count(), ctx.threads, min, |range| {
        // Blocks of neighbouring columns advance along `dim` together, so each step reads and
        // writes runs of neighbouring elements; each column still walks `dim` in order.
        let (start, end) = (range.start, range.end);
        let mut starts = Vec::with_capacity(COLUMN_BLOCK.min(end - start));
        for first in (start..end).step_by(COLUMN_BLOCK) {
            starts.clear();
            starts.extend((first..(first + COLUMN_BLOCK).min(end)).map(|c| cols.start(c)));
            for j in 0..cols.len {
                let (dix, dsrc) = (j * cols.steps[0], j * cols.steps[1]);
                for &[at_ix, at_src, base] in &starts {
                    // SAFETY: every index was checked to lie in `0..size`, so each target is inside
                    // the output; columns touch disjoint output elements, the output overlaps no
                    // input, and this task owns these columns.
                    unsafe {
                        let t = base + index.span.read(at_ix + dix).get() as usize * cols.steps[2];
                        combine.apply(out, t, src.span, at_src + dsrc);
                    }
                }
            }
        }
    });
    Ok(())
}

/// The scatter of `d`, by element width (assign) or dtype (add) and index type.
fn scatter(mem: &mut HostMemory, d: &ScatterDesc, ctx: Ctx) -> Result<()> {
    macro_rules! by_index {
        ($w:ty, $combine:expr) => {
            match d.index_dtype {
                DType::I32 => scatter_typed::<$w, i32>(mem, d, ctx, $combine),
                _ => scatter_typed::<$w, i64>(mem, d, ctx, $combine),
            }
        };
    }
    fn add<T: Element>(alpha: f64) -> AddScaled<T> {
        AddScaled {
            alpha: <T::Acc as Real>::from_f64(alpha),
        }
    }
    match (d.reduce, d.dtype) {
        (ScatterReduce::Add, DType::F32) => by_index!(f32, add::<f32>(d.alpha)),
        (ScatterReduce::Add, DType::F64) => by_index!(f64, add::<f64>(d.alpha)),
        (ScatterReduce::Add, DType::F16) => by_index!(half::f16, add::<half::f16>(d.alpha)),
        (ScatterReduce::Add, _) => by_index!(half::bf16, add::<half::bf16>(d.alpha)),
        (ScatterReduce::Assign, dtype) => match dtype.size_in_bytes() {
            1 => by_index!(u8, Assign),
            2 => by_index!(u16, Assign),
            4 => by_index!(u32, Assign),
            _ => by_index!(u64, Assign),
        },
    }
}

impl OpImpl<ScatterDesc> for CpuBackend {
    fn op(&self, desc: &ScatterDesc) -> Result<()> {
        let acc = desc.accesses()?;
        let math = desc.reduce == ScatterReduce::Add;
        let aligned = acc
            .regions
            .iter()
            .zip([desc.index_dtype, desc.dtype, desc.dtype])
            .all(|(r, t)| r.ptr.0.is_multiple_of(t.size_in_bytes() as u64));
        if !aligned || (math && !desc.dtype.is_float()) {
            // Misaligned operands, or an addition of integers: the reference's answer.
            return self.scalar.scatter(desc);
        }
        self.kernel(acc, |mem, ctx| scatter(mem, desc, ctx))
    }
}

impl OpImpl<GatherDesc> for CpuBackend {
    fn op(&self, desc: &GatherDesc) -> Result<()> {
        let acc = desc.accesses()?;
        let aligned = acc
            .regions
            .iter()
            .zip([desc.dtype, desc.index_dtype, desc.dtype])
            .all(|(r, t)| r.ptr.0.is_multiple_of(t.size_in_bytes() as u64));
        if !aligned {
            // Misaligned operands (the raw trait allows any byte address): the reference kernel.
            return self.scalar.gather(desc);
        }
        // The work is the rows gathered, not the source they come from: a batch gathered from a
        // large data set is a small op (regions: source, index, output).
        let touched = acc.regions[1]
            .bytes
            .saturating_add(acc.regions[2].bytes.saturating_mul(2));
        self.kernel_on(acc, super::Work::bytes(touched).shares(), |mem, ctx| {
            gather(mem, desc, ctx)
        })
    }
}
