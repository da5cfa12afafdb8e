//! Comparisons into `U8` masks and selection by a mask on the CPU.
//!
//! Both walk their operands as runs along the innermost dim after merging the dims every operand
//! steps through alike ([`Dims`]), spread over the backend's threads by [`for_chunks`]. A run whose
//! operands are dense or one repeated value (a broadcast dim or a scalar) is a tight loop the
//! compiler vectorises; any other run indexes each operand by its stride. Comparisons read elements
//! as an ordered key ([`Key`]: f16 and bf16 widened to f32 exactly, the others as they are), so
//! IEEE's rules hold as on the reference; `where` moves elements as raw bits of their width.

use bytemuck::Pod;
use half::{bf16, f16};

use super::elementwise::Dims;
use super::host::{for_chunks, with_simd, Ctx, Span};
use super::vmath;
use crate::backends::cpu::cost::TASK_ELEMENTS;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::memory::HostMemory;
use crate::backends::reference::select::scalar_bytes;
use crate::compute::op::OpImpl;
use crate::compute::{
    Accesses, CompareDesc, CompareOp, ComputeBackend, DevicePtr, Value, WhereDesc,
};
use crate::dtype::DType;
use crate::error::Result;

/// An element type read as an ordered key for comparisons.
pub(super) trait Key: Pod + Send + Sync {
    /// The key: a type whose `PartialOrd` is IEEE's for floats.
    type K: PartialOrd + Copy + Send + Sync;
    /// The key of zero (for the logical ops).
    const ZERO: Self::K;
    /// This element's key, exactly.
    fn key(self) -> Self::K;
}

/// [`Key`] for a type that is its own key.
macro_rules! own_key {
    ($($t:ty = $zero:expr),*) => {$(
        impl Key for $t {
            type K = $t;
            const ZERO: $t = $zero;
            #[inline(always)]
            fn key(self) -> $t {
                self
            }
        }
    )*};
}
own_key!(f32 = 0.0, f64 = 0.0, i32 = 0, i64 = 0, u8 = 0);

impl Key for f16 {
    type K = f32;
    const ZERO: f32 = 0.0;
    #[inline(always)]
    fn key(self) -> f32 {
        vmath::f16_bits_to_f32(self.to_bits())
    }
}

impl Key for bf16 {
    type K = f32;
    const ZERO: f32 = 0.0;
    #[inline(always)]
    fn key(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

/// One operand's elements along a run.
#[derive(Clone, Copy)]
enum Run<'a, T> {
    /// Consecutive elements.
    Dense(&'a [T]),
    /// One value for every element.
    Splat(T),
    /// Every `stride`-th element from the first.
    Strided(&'a [T], usize),
}

impl<T: Copy> Run<'_, T> {
    /// Element `k` of the run.
    #[inline(always)]
    fn get(&self, k: usize) -> T {
        match *self {
            Run::Dense(s) => s[k],
            Run::Splat(v) => v,
            Run::Strided(s, stride) => s[k * stride],
        }
    }
}

/// An operand of a walk: a view's elements from its first to its last, or a constant.
#[derive(Clone, Copy)]
enum Src<T> {
    View(Span<T>),
    Const(T),
}

impl<T: Pod> Src<T> {
    /// The operand's `len` (at least 1) elements from position `pos` at `stride`.
    ///
    /// # Safety
    /// The positions are inside the view and nothing writes them while the run lives.
    #[inline(always)]
    unsafe fn run<'a>(self, pos: usize, stride: usize, len: usize) -> Run<'a, T> {
        match self {
            Src::Const(v) => Run::Splat(v),
            Src::View(span) => match stride {
                0 => Run::Splat(span.read(pos)),
                1 => Run::Dense(span.slice(pos..pos + len)),
                s => Run::Strided(span.slice(pos..pos + (len - 1) * s + 1), s),
            },
        }
    }
}

/// `v` as an operand of `dtype` elements (`T` of that width) over a walk of `rank` dims, with its
/// strides (all 0 for a scalar).
fn src<T: Pod>(
    mem: &mut HostMemory,
    op: &'static str,
    dtype: DType,
    v: &Value,
    rank: usize,
) -> Result<(Src<T>, Vec<usize>)> {
    match v {
        Value::Tensor(buf) => {
            let start = buf.layout.offset();
            let end = buf.layout.span_elements()?;
            let first = DevicePtr(buf.ptr.0 + (start * std::mem::size_of::<T>()) as u64);
            let span = Span::of(mem, op, first, end - start)?;
            Ok((Src::View(span), buf.layout.strides().to_vec()))
        }
        Value::Scalar(s) => Ok((
            Src::Const(bytemuck::pod_read_unaligned(&scalar_bytes(dtype, *s))),
            vec![0; rank],
        )),
    }
}

/// The comparison of `d` for elements of type `T`.
fn compare_t<T: Key>(mem: &mut HostMemory, d: &CompareDesc, ctx: Ctx) -> Result<()> {
    const OP: &str = "compare";
    let shape = d.lhs.layout.shape();
    let n = d.lhs.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let lhs = Value::Tensor(d.lhs.clone());
    let (a, sa) = src::<T>(mem, OP, d.dtype, &lhs, shape.len())?;
    let (b, sb) = src::<T>(mem, OP, d.dtype, &d.rhs, shape.len())?;
    let out = Span::<u8>::of(mem, OP, d.output, n)?;
    let dims = Dims::new(shape, [&sa[..], &sb[..]]);
    let z = T::ZERO;
    macro_rules! walk {
        ($f:expr) => {
            compare_walk::<T>(&dims, [a, b], out, ctx, $f)
        };
    }
    match d.op {
        CompareOp::Eq => walk!(|x, y| x == y),
        CompareOp::Ne => walk!(|x, y| x != y),
        CompareOp::Lt => walk!(|x, y| x < y),
        CompareOp::Le => walk!(|x, y| x <= y),
        CompareOp::Gt => walk!(|x, y| x > y),
        CompareOp::Ge => walk!(|x, y| x >= y),
        CompareOp::And => walk!(move |x, y| x != z && y != z),
        CompareOp::Or => walk!(move |x, y| x != z || y != z),
        CompareOp::Xor => walk!(move |x, y| (x != z) != (y != z)),
    }
    Ok(())
}

/// `out[i] = f(a[i], b[i])` as 0 or 1 over the walk `dims`, threaded.
fn compare_walk<T: Key>(
    dims: &Dims<2>,
    [a, b]: [Src<T>; 2],
    out: Span<u8>,
    ctx: Ctx,
    f: impl Fn(T::K, T::K) -> bool + Copy + Send + Sync,
) {
    let (_, [sa, sb]) = dims.inner();
    for_chunks(dims.numel(), ctx.threads, TASK_ELEMENTS, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                dims.runs(
                    range,
                    #[inline(always)]
                    |at, [pa, pb], len| {
                        // SAFETY: the runs stay inside the views the checks bounded; this task owns
                        // output elements `at..at + len`, and no input overlaps the output.
                        let (ra, rb, o) = unsafe {
                            (
                                a.run(pa, sa, len),
                                b.run(pb, sb, len),
                                out.slice_mut(at..at + len),
                            )
                        };
                        match (ra, rb) {
                            (Run::Dense(x), Run::Dense(y)) => {
                                for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                                    *o = u8::from(f(x.key(), y.key()));
                                }
                            }
                            (Run::Dense(x), Run::Splat(y)) => {
                                let y = y.key();
                                for (o, &x) in o.iter_mut().zip(x) {
                                    *o = u8::from(f(x.key(), y));
                                }
                            }
                            _ => {
                                for (k, o) in o.iter_mut().enumerate() {
                                    *o = u8::from(f(ra.get(k).key(), rb.get(k).key()));
                                }
                            }
                        }
                    },
                );
            },
        )
    });
}

/// The selection of `d` for elements of width `W` (moved as bits).
fn where_t<W: Bits>(mem: &mut HostMemory, d: &WhereDesc, ctx: Ctx) -> Result<()> {
    const OP: &str = "where";
    let shape = d.cond.layout.shape();
    let n = d.cond.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let cond = Value::Tensor(d.cond.clone());
    let (c, sc) = src::<u8>(mem, OP, DType::U8, &cond, shape.len())?;
    let (t, st) = src::<W>(mem, OP, d.dtype, &d.on_true, shape.len())?;
    let (f, sf) = src::<W>(mem, OP, d.dtype, &d.on_false, shape.len())?;
    let out = Span::<W>::of(mem, OP, d.output, n)?;
    let dims = Dims::new(shape, [&sc[..], &st[..], &sf[..]]);
    let (_, [ic, it, iff]) = dims.inner();
    for_chunks(dims.numel(), ctx.threads, TASK_ELEMENTS, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                dims.runs(
                    range,
                    #[inline(always)]
                    |at, [pc, pt, pf], len| {
                        // SAFETY: as in `compare_walk`.
                        let (rc, rt, rf, o) = unsafe {
                            (
                                c.run(pc, ic, len),
                                t.run(pt, it, len),
                                f.run(pf, iff, len),
                                out.slice_mut(at..at + len),
                            )
                        };
                        select_run(rc, rt, rf, o);
                    },
                );
            },
        )
    });
    Ok(())
}

/// An element that `where` moves as raw bits of its width.
trait Bits: Pod + Send + Sync {
    /// `t` when `c ≠ 0`, else `f`, computed from both without a branch. Written as an `if`, the
    /// dense loop compiled to a load from the chosen operand lane by lane, about ten times slower
    /// on a random mask than this form, which vectorises as a blend.
    fn pick(c: u8, t: Self, f: Self) -> Self;
}

/// [`Bits`] for unsigned integers: an all-ones or all-zeros mask from `c`.
macro_rules! bits {
    ($($t:ty),*) => {$(
        impl Bits for $t {
            #[inline(always)]
            fn pick(c: u8, t: $t, f: $t) -> $t {
                let m = <$t>::from(c != 0).wrapping_neg();
                (t & m) | (f & !m)
            }
        }
    )*};
}
bits!(u8, u16, u32, u64);

/// `o[k] = c[k] ≠ 0 ? t[k] : f[k]` for one run.
#[inline(always)]
fn select_run<W: Bits>(rc: Run<'_, u8>, rt: Run<'_, W>, rf: Run<'_, W>, o: &mut [W]) {
    match (rc, rt, rf) {
        (Run::Splat(c), _, _) => {
            let r = if c != 0 { rt } else { rf };
            match r {
                Run::Dense(s) => o.copy_from_slice(s),
                Run::Splat(v) => o.fill(v),
                _ => o.iter_mut().enumerate().for_each(|(k, o)| *o = r.get(k)),
            }
        }
        (Run::Dense(c), Run::Dense(t), Run::Dense(f)) => {
            for (((o, &c), &t), &f) in o.iter_mut().zip(c).zip(t).zip(f) {
                *o = W::pick(c, t, f);
            }
        }
        (Run::Dense(c), Run::Dense(t), Run::Splat(f)) => {
            for ((o, &c), &t) in o.iter_mut().zip(c).zip(t) {
                *o = W::pick(c, t, f);
            }
        }
        (Run::Dense(c), Run::Splat(t), Run::Dense(f)) => {
            for ((o, &c), &f) in o.iter_mut().zip(c).zip(f) {
                *o = W::pick(c, t, f);
            }
        }
        (Run::Dense(c), Run::Splat(t), Run::Splat(f)) => {
            for (o, &c) in o.iter_mut().zip(c) {
                *o = W::pick(c, t, f);
            }
        }
        _ => {
            for (k, o) in o.iter_mut().enumerate() {
                *o = W::pick(rc.get(k), rt.get(k), rf.get(k));
            }
        }
    }
}

/// True when every region of `acc` is aligned to its elements (`U8` for the regions named in
/// `bytes`, `dtype` for the others); the raw trait allows any byte address.
fn aligned(acc: &Accesses, dtype: DType, bytes: &[&str]) -> bool {
    let size = dtype.size_in_bytes() as u64;
    acc.regions
        .iter()
        .all(|r| bytes.contains(&r.name) || r.ptr.0.is_multiple_of(size))
}

impl OpImpl<CompareDesc> for CpuBackend {
    fn op(&self, desc: &CompareDesc) -> Result<()> {
        let acc = desc.accesses()?;
        if !aligned(&acc, desc.dtype, &["output"]) {
            return self.scalar.compare(desc);
        }
        self.kernel(acc, |mem, ctx| match desc.dtype {
            DType::F32 => compare_t::<f32>(mem, desc, ctx),
            DType::F64 => compare_t::<f64>(mem, desc, ctx),
            DType::F16 => compare_t::<f16>(mem, desc, ctx),
            DType::BF16 => compare_t::<bf16>(mem, desc, ctx),
            DType::I32 => compare_t::<i32>(mem, desc, ctx),
            DType::I64 => compare_t::<i64>(mem, desc, ctx),
            DType::U8 => compare_t::<u8>(mem, desc, ctx),
        })
    }
}

impl OpImpl<WhereDesc> for CpuBackend {
    fn op(&self, desc: &WhereDesc) -> Result<()> {
        let acc = desc.accesses()?;
        if !aligned(&acc, desc.dtype, &["cond"]) {
            return self.scalar.where_(desc);
        }
        self.kernel(acc, |mem, ctx| match desc.dtype.size_in_bytes() {
            1 => where_t::<u8>(mem, desc, ctx),
            2 => where_t::<u16>(mem, desc, ctx),
            4 => where_t::<u32>(mem, desc, ctx),
            _ => where_t::<u64>(mem, desc, ctx),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Bits;

    /// `pick` for one width: `t` for every non-zero condition byte, `f` for zero, every bit kept.
    fn picks<W: Bits + std::fmt::Debug + PartialEq>(t: W, f: W) {
        for c in [0u8, 1, 2, 0x80, 0xff] {
            let want = if c != 0 { t } else { f };
            assert_eq!(W::pick(c, t, f), want, "condition {c:#x}");
        }
    }

    #[test]
    fn pick_takes_the_true_operand_for_any_non_zero_condition() {
        picks(0xa5u8, 0x5a);
        picks(0xa5c3u16, 0x5a3c);
        // An f32 NaN with a payload and a negative zero, as raw bits.
        picks(0x7fc0_1234u32, 0x8000_0000);
        picks(0xfff8_0000_0000_0001u64, 0x0123_4567_89ab_cdef);
    }
}
