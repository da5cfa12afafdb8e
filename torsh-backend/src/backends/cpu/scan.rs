//! Inclusive scans along one dim on the CPU, over a dense input seen as `[outer, len, inner]`.
//!
//! With `inner == 1` (the last dim) each row is a sequential scan, rows spread over the backend's
//! threads. Otherwise whole rows of `inner` elements are combined at once: the running values of a
//! block of columns stay in a scratch block in the compute type while the dim is walked, so the loop
//! over a block vectorises; (outer index, column block) pairs spread over the threads. Floats
//! accumulate in their compute type (f32 for f16, bf16 and f32; f64 for f64) and round once per
//! output; integers wrap. Strided or misaligned inputs take the reference's kernel.

use bytemuck::Pod;
use half::{bf16, f16};

use super::host::{for_chunks, with_simd, Ctx, Element, Span, BLOCK};
use crate::backends::cpu::cost::items_per_task;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::memory::HostMemory;
use crate::compute::op::OpImpl;
use crate::compute::{ComputeBackend, DevicePtr, ScanDesc, ScanOp};
use crate::dtype::DType;
use crate::error::Result;

/// An element type a scan runs over, with the type it accumulates in.
trait Scanned: Pod + Send + Sync {
    /// The accumulation type.
    type Acc: Copy + Send + Sync + Default;
    /// This element in the accumulation type (exact).
    fn widen(self) -> Self::Acc;
    /// `v` stored as an element (rounded to nearest for floats).
    fn narrow(v: Self::Acc) -> Self;
    /// `a + b` (wrapping for integers).
    fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `a · b` (wrapping for integers).
    fn mul(a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

/// [`Scanned`] for the float types, through [`Element`].
macro_rules! float_scanned {
    ($($t:ty),*) => {$(
        impl Scanned for $t {
            type Acc = <$t as Element>::Acc;
            #[inline(always)]
            fn widen(self) -> Self::Acc {
                Element::widen(self)
            }
            #[inline(always)]
            fn narrow(v: Self::Acc) -> Self {
                <$t as Element>::narrow(v)
            }
            #[inline(always)]
            fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc {
                a + b
            }
            #[inline(always)]
            fn mul(a: Self::Acc, b: Self::Acc) -> Self::Acc {
                a * b
            }
        }
    )*};
}
float_scanned!(f32, f64, f16, bf16);

/// [`Scanned`] for the integer types, wrapping.
macro_rules! int_scanned {
    ($($t:ty),*) => {$(
        impl Scanned for $t {
            type Acc = $t;
            #[inline(always)]
            fn widen(self) -> $t {
                self
            }
            #[inline(always)]
            fn narrow(v: $t) -> $t {
                v
            }
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
        }
    )*};
}
int_scanned!(i32, i64, u8);

/// The scan of `d` (dense input) for elements of type `T`.
fn scan_t<T: Scanned>(mem: &mut HostMemory, d: &ScanDesc, ctx: Ctx) -> Result<()> {
    const OP: &str = "scan";
    let n = d.input.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let first =
        DevicePtr(d.input.ptr.0 + (d.input.layout.offset() * std::mem::size_of::<T>()) as u64);
    let x = Span::<T>::of(mem, OP, first, n)?;
    let y = Span::<T>::of(mem, OP, d.output, n)?;
    let geometry = d.geometry();
    match d.op {
        ScanOp::Sum => walk::<T>(x, y, geometry, ctx, T::add),
        ScanOp::Prod => walk::<T>(x, y, geometry, ctx, T::mul),
    }
    Ok(())
}

/// `y = scan(x)` with `f` over `[outer, len, inner]`, threaded (see the module).
fn walk<T: Scanned>(
    x: Span<T>,
    y: Span<T>,
    (outer, len, inner): (usize, usize, usize),
    ctx: Ctx,
    f: impl Fn(T::Acc, T::Acc) -> T::Acc + Copy + Send + Sync,
) {
    if inner == 1 {
        let rows_per_task = items_per_task(len);
        for_chunks(outer, ctx.threads, rows_per_task, |rows| {
            with_simd(
                ctx.simd,
                #[inline(always)]
                || {
                    for o in rows {
                        let at = o * len..(o + 1) * len;
                        // SAFETY: this task owns output rows `rows`; the input is never written
                        // (the output overlaps no input).
                        let (xs, ys) = unsafe { (x.slice(at.clone()), y.slice_mut(at)) };
                        let mut acc = xs[0].widen();
                        ys[0] = T::narrow(acc);
                        for (o, &v) in ys[1..].iter_mut().zip(&xs[1..]) {
                            acc = f(acc, v.widen());
                            *o = T::narrow(acc);
                        }
                    }
                },
            )
        });
        return;
    }
    let blocks = inner.div_ceil(BLOCK);
    let per_task = items_per_task(len * BLOCK.min(inner));
    for_chunks(outer * blocks, ctx.threads, per_task, |tasks| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut acc = [T::Acc::default(); BLOCK];
                for t in tasks {
                    let (o, b) = (t / blocks, t % blocks);
                    let cols = b * BLOCK..((b + 1) * BLOCK).min(inner);
                    let width = cols.len();
                    let acc = &mut acc[..width];
                    for i in 0..len {
                        let start = (o * len + i) * inner + cols.start;
                        // SAFETY: this task owns these output elements (its outer index and
                        // column block); the input is never written.
                        let (xs, ys) = unsafe {
                            (
                                x.slice(start..start + width),
                                y.slice_mut(start..start + width),
                            )
                        };
                        if i == 0 {
                            for (a, &v) in acc.iter_mut().zip(xs) {
                                *a = v.widen();
                            }
                        } else {
                            for (a, &v) in acc.iter_mut().zip(xs) {
                                *a = f(*a, v.widen());
                            }
                        }
                        for (o, &a) in ys.iter_mut().zip(acc.iter()) {
                            *o = T::narrow(a);
                        }
                    }
                }
            },
        )
    });
}

impl OpImpl<ScanDesc> for CpuBackend {
    fn op(&self, desc: &ScanDesc) -> Result<()> {
        let acc = desc.accesses()?;
        let size = desc.dtype.size_in_bytes() as u64;
        let aligned = acc.regions.iter().all(|r| r.ptr.0.is_multiple_of(size));
        if !aligned || !desc.input.layout.is_contiguous() {
            // A strided or misaligned input: the reference's kernel (the tensor API passes dense
            // inputs).
            return self.scalar.scan(desc);
        }
        self.kernel(acc, |mem, ctx| match desc.dtype {
            DType::F32 => scan_t::<f32>(mem, desc, ctx),
            DType::F64 => scan_t::<f64>(mem, desc, ctx),
            DType::F16 => scan_t::<f16>(mem, desc, ctx),
            DType::BF16 => scan_t::<bf16>(mem, desc, ctx),
            DType::I32 => scan_t::<i32>(mem, desc, ctx),
            DType::I64 => scan_t::<i64>(mem, desc, ctx),
            DType::U8 => scan_t::<u8>(mem, desc, ctx),
        })
    }
}
