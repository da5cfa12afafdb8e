//! Stable sorts along one dim on the CPU, over a dense input seen as `[outer, len, inner]`: the
//! lines (every position but the dim) spread over the backend's threads, each ordered by its
//! elements' keys ([`Key`]: f16 and bf16 widened to f32 exactly, the others as they are) in the
//! reference's total order with ties broken by position (the stable order), values moved as they
//! are. Where only the first `k` of a line are wanted (`topk`), they are selected first and only
//! they are sorted. Strided or misaligned operands take the
//! reference's kernel (the tensor API passes dense inputs).

use half::{bf16, f16};

use super::host::{for_chunks, Ctx, Span};
use super::select::Key;
use crate::backends::cpu::cost::items_per_task;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::memory::HostMemory;
use crate::backends::reference::sort::total_order;
use crate::compute::op::OpImpl;
use crate::compute::{ComputeBackend, DevicePtr, SortDesc};
use crate::dtype::DType;
use crate::error::Result;

/// The sort of `d` (dense input) for elements of type `T`.
fn sort_t<T: Key>(mem: &mut HostMemory, d: &SortDesc, ctx: Ctx) -> Result<()> {
    const OP: &str = "sort";
    let n = d.input.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let size = std::mem::size_of::<T>();
    let first = DevicePtr(d.input.ptr.0 + (d.input.layout.offset() * size) as u64);
    let x = Span::<T>::of(mem, OP, first, n)?;
    let (outer, len, inner) = d.geometry();
    let (descending, k) = (d.descending, d.k);
    let kept = outer * k * inner;
    if kept == 0 {
        return Ok(());
    }
    let values = d
        .values
        .map(|p| Span::<T>::of(mem, OP, p, kept))
        .transpose()?;
    let indices = d
        .indices
        .map(|p| Span::<i64>::of(mem, OP, p, kept))
        .transpose()?;
    // The total order with ties broken by position: the stable sort's order as a strict order, so
    // a selection of the first k and an unstable sort of them give the stable sort's first k.
    let cmp = move |a: &(T::K, usize), b: &(T::K, usize)| {
        let by_key = if descending {
            total_order(&b.0, &a.0)
        } else {
            total_order(&a.0, &b.0)
        };
        by_key.then(a.1.cmp(&b.1))
    };
    for_chunks(outer * inner, ctx.threads, items_per_task(len), |lines| {
        let mut order: Vec<(T::K, usize)> = Vec::with_capacity(len);
        for line in lines {
            let (o, j) = (line / inner, line % inner);
            let at = |i: usize| (o * len + i) * inner + j;
            let to = |i: usize| (o * k + i) * inner + j;
            order.clear();
            // SAFETY: every position is inside the input, which nothing writes during the op.
            order.extend((0..len).map(|i| (unsafe { x.read(at(i)) }.key(), i)));
            if k < len {
                order.select_nth_unstable_by(k - 1, cmp);
            }
            order[..k].sort_unstable_by(cmp);
            for (i, &(_, from)) in order[..k].iter().enumerate() {
                // SAFETY: this task owns its lines of both outputs, which overlap no input and
                // not each other.
                unsafe {
                    if let Some(v) = values {
                        v.write(to(i), x.read(at(from)));
                    }
                    if let Some(ix) = indices {
                        ix.write(to(i), from as i64);
                    }
                }
            }
        }
    });
    Ok(())
}

impl OpImpl<SortDesc> for CpuBackend {
    fn op(&self, desc: &SortDesc) -> Result<()> {
        let acc = desc.accesses()?;
        let size = desc.dtype.size_in_bytes() as u64;
        let aligned = acc.regions.iter().all(|r| {
            let width = if r.name == "indices" { 8 } else { size };
            r.ptr.0.is_multiple_of(width)
        });
        if !aligned || !desc.input.layout.is_contiguous() {
            return self.scalar.sort(desc);
        }
        self.kernel(acc, |mem, ctx| match desc.dtype {
            DType::F32 => sort_t::<f32>(mem, desc, ctx),
            DType::F64 => sort_t::<f64>(mem, desc, ctx),
            DType::F16 => sort_t::<f16>(mem, desc, ctx),
            DType::BF16 => sort_t::<bf16>(mem, desc, ctx),
            DType::I32 => sort_t::<i32>(mem, desc, ctx),
            DType::I64 => sort_t::<i64>(mem, desc, ctx),
            DType::U8 => sort_t::<u8>(mem, desc, ctx),
        })
    }
}
