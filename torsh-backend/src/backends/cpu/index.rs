//! Gathering by index tensors on the CPU: every index is checked first (so a bad one leaves the
//! output untouched), then the output is written in row-major order by runs along its last dim,
//! spread over the backend's threads. Elements move as raw bits of their width, so every dtype
//! gathers. A run whose index repeats along the last dim (`index_select` and `embedding` rows) and
//! whose input is dense there is one `memcpy`.

use super::host::{for_chunks, Ctx, Span, SERIAL_ELEMENTS};
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::index::step;
use crate::backends::reference::memory::HostMemory;
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::{check_index, DevicePtr, GatherDesc, StridedBuf};
use crate::dtype::DType;
use crate::error::Result;

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
    // Every index first, in the index's memory order (a broadcast index is read once).
    // SAFETY: the span is the index view's extent and nothing writes it during the op.
    let raw = unsafe { index.span.slice(0..index.span.len()) };
    let bad = std::sync::atomic::AtomicBool::new(false);
    let limit = size as u64;
    for_chunks(raw.len(), ctx.threads, SERIAL_ELEMENTS, |range| {
        // As unsigned, a negative index is past every size.
        if raw[range].iter().any(|i| i.get() as u64 >= limit) {
            bad.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    if bad.into_inner() {
        // The view may skip elements of its span: the first bad index it reads, if any.
        let offset = d.index.layout.offset();
        let mut first_bad = None;
        d.index.layout.for_each_index(|e| {
            let v = raw[e - offset].get();
            if first_bad.is_none() && check_index(op, v, size).is_err() {
                first_bad = Some(v);
            }
        });
        if let Some(v) = first_bad {
            return check_index(op, v, size);
        }
    }
    let rank = shape.len();
    let last = rank - 1;
    let len = shape[last];
    let rows = n / len;
    let (dim, dim_stride) = (d.dim, input.strides[d.dim]);
    let (in_last, ix_last) = (input.strides[last], index.strides[last]);
    let row_run = dim != last && ix_last == 0 && in_last == 1;
    let min_rows = SERIAL_ELEMENTS.div_ceil(len).max(1);
    for_chunks(rows, ctx.threads, min_rows, |range| {
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
            // SAFETY: every index was checked to lie in `0..size`, so each read is inside the input's
            // extent; tasks write disjoint row ranges of the output, which overlaps no input.
            unsafe {
                if row_run {
                    let from = at_in + index.span.read(at_ix).get() as usize * dim_stride;
                    out.slice_mut(first..first + len)
                        .copy_from_slice(input.span.slice(from..from + len));
                } else if dim == last && ix_last == 1 && dim_stride == 1 {
                    // A dense row gathered by a dense row of indices.
                    let from = input.span.slice(at_in..at_in + size);
                    let picks = index.span.slice(at_ix..at_ix + len);
                    for (o, i) in out.slice_mut(first..first + len).iter_mut().zip(picks) {
                        *o = *from.get_unchecked(i.get() as usize);
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
            if last > 0 {
                step(&mut coord[..last], &shape[..last]);
            }
        }
    });
    Ok(())
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
        self.kernel(acc, |mem, ctx| gather(mem, desc, ctx))
    }
}
