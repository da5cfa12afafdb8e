//! Unary ops on the CPU: f32-family ops through `vmath`, f64 ops as the reference defines them.

use super::*;
use crate::backends::cpu::cost::TASK_ELEMENTS;
use crate::backends::cpu::stream::{worth_streaming, Streamer};

/// `match $op { $pattern => map($x, $out, $ctx, |v| ...), ... }`, each closure marked
/// `#[inline(always)]`. The closures are not redundant: passed as fn items, the ops are called
/// through an out-of-line `Fn::call` shim compiled without the SIMD features (so `mul_add` becomes a
/// libm call); an `#[inline(always)]` closure is inlined into the vector loop instead.
macro_rules! map_by_op {
    ($op:expr, $x:expr, $out:expr, $ctx:expr, { $($pat:pat => |$v:ident| $f:expr),* $(,)? }) => {
        match $op {
            $($pat => map($x, $out, $ctx, Each(#[inline(always)] move |$v| $f)),)*
        }
    };
}

/// A function applied element by element to a block of compute-type values.
trait Elementwise<A>: Copy + Send + Sync {
    /// `ys[i] = f(xs[i])` for `i < min(xs.len(), ys.len())`.
    fn block(&self, xs: &[A], ys: &mut [A]);
    /// `b[i] = f(b[i])`.
    fn block_in_place(&self, b: &mut [A]);
    /// [`Elementwise::block`] with the output written by unfenced streaming stores (the caller
    /// fences), where the function has such a form and `ys` suits it; `false`, writing nothing,
    /// elsewhere.
    #[inline(always)]
    fn block_streamed(&self, _xs: &[A], _ys: &mut [A]) -> bool {
        false
    }
}

/// A scalar function as an [`Elementwise`]: loops the compiler vectorises inside `with_simd`.
#[derive(Clone, Copy)]
struct Each<F>(F);

impl<A: Copy, F: Fn(A) -> A + Copy + Send + Sync> Elementwise<A> for Each<F> {
    #[inline(always)]
    fn block(&self, xs: &[A], ys: &mut [A]) {
        for (y, &v) in ys.iter_mut().zip(xs) {
            *y = (self.0)(v);
        }
    }

    #[inline(always)]
    fn block_in_place(&self, b: &mut [A]) {
        for v in b {
            *v = (self.0)(*v);
        }
    }
}

/// A function with an AVX-512 form ([`vmath::avx512`]), on its registers: made only where the
/// CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx512(vmath::avx512::Func);

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    /// The AVX-512 form of `op`, when it has one and `simd` is AVX-512 (detected on this CPU).
    fn of(op: UnaryOp, simd: SimdLevel) -> Option<Avx512> {
        use vmath::avx512::Func;
        let f = match op {
            UnaryOp::Exp => Func::Exp,
            UnaryOp::Sigmoid => Func::Sigmoid,
            UnaryOp::Tanh => Func::Tanh,
            UnaryOp::Gelu => Func::Gelu,
            _ => return None,
        };
        (simd == SimdLevel::Avx512).then_some(Avx512(f))
    }
}

#[cfg(target_arch = "x86_64")]
impl Elementwise<f32> for Avx512 {
    #[inline(always)]
    fn block(&self, xs: &[f32], ys: &mut [f32]) {
        // SAFETY: an `Avx512` exists only where the CPU has AVX-512F (`of`).
        unsafe { vmath::avx512::map(self.0, xs, ys) }
    }

    #[inline(always)]
    fn block_in_place(&self, b: &mut [f32]) {
        // SAFETY: as in `block`.
        unsafe { vmath::avx512::map_in_place(self.0, b) }
    }

    #[inline(always)]
    fn block_streamed(&self, xs: &[f32], ys: &mut [f32]) -> bool {
        // SAFETY: as in `block`.
        unsafe { vmath::avx512::map_streamed(self.0, xs, ys) }
    }
}

/// A function with an AVX2 form ([`vmath::avx2`]), on its registers: made only where the CPU has
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx2(vmath::avx2::Func);

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    /// The AVX2 form of `op`, when it has one and `simd` includes AVX2 and FMA (detected on this
    /// CPU).
    fn of(op: UnaryOp, simd: SimdLevel) -> Option<Avx2> {
        use vmath::avx2::Func;
        let f = match op {
            UnaryOp::Exp => Func::Exp,
            UnaryOp::Sigmoid => Func::Sigmoid,
            UnaryOp::Tanh => Func::Tanh,
            UnaryOp::Gelu => Func::Gelu,
            _ => return None,
        };
        matches!(simd, SimdLevel::Avx2Fma | SimdLevel::Avx512).then_some(Avx2(f))
    }
}

#[cfg(target_arch = "x86_64")]
impl Elementwise<f32> for Avx2 {
    #[inline(always)]
    fn block(&self, xs: &[f32], ys: &mut [f32]) {
        // SAFETY: an `Avx2` exists only where the CPU has AVX2 and FMA (`of`).
        unsafe { vmath::avx2::map(self.0, xs, ys) }
    }

    #[inline(always)]
    fn block_in_place(&self, b: &mut [f32]) {
        // SAFETY: as in `block`.
        unsafe { vmath::avx2::map_in_place(self.0, b) }
    }

    #[inline(always)]
    fn block_streamed(&self, xs: &[f32], ys: &mut [f32]) -> bool {
        // SAFETY: as in `block`.
        unsafe { vmath::avx2::map_streamed(self.0, xs, ys) };
        true
    }
}

/// `output[i] = op(input[i])`.
pub(crate) fn unary(mem: &mut HostMemory, d: &UnaryDesc, ctx: Ctx) -> Result<()> {
    match d.dtype {
        DType::F32 => unary_f32::<f32>(mem, d, ctx),
        DType::F16 => unary_f32::<f16>(mem, d, ctx),
        DType::BF16 => unary_f32::<bf16>(mem, d, ctx),
        DType::F64 => unary_f64(mem, d, ctx),
        _ => reference::unary(mem, d),
    }
}

/// The input view and the output of `d`, or `None` when the output is the input's memory but the
/// input is not dense (the checks never let that through; the reference copes if they did).
fn unary_operands<T: Lanes>(
    mem: &mut HostMemory,
    d: &UnaryDesc,
) -> Result<Option<(View<T>, Span<T>)>> {
    let x = View::<T>::of(mem, "unary", &d.input)?;
    let out = Span::<T>::of(mem, "unary", d.output, x.numel())?;
    if out.same_as(&x.span()) && !x.is_contiguous() {
        return Ok(None);
    }
    Ok(Some((x, out)))
}

/// [`unary`] for the types that compute in f32.
#[allow(clippy::redundant_closure)]
fn unary_f32<T: Lanes<Acc = f32>>(mem: &mut HostMemory, d: &UnaryDesc, ctx: Ctx) -> Result<()> {
    let Some((x, out)) = unary_operands::<T>(mem, d)? else {
        return reference::unary(mem, d);
    };
    let x = &x;
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = Avx512::of(d.op, ctx.simd) {
        map(x, out, ctx, f);
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = Avx2::of(d.op, ctx.simd) {
        map(x, out, ctx, f);
        return Ok(());
    }
    map_by_op!(d.op, x, out, ctx, {
        UnaryOp::Neg => |v| neg::<f32>(v),
        UnaryOp::Abs => |v| f32::abs(v),
        UnaryOp::Exp => |v| vmath::exp_f32(v),
        UnaryOp::Log => |v| vmath::ln_f32(v),
        UnaryOp::Sqrt => |v| f32::sqrt(v),
        UnaryOp::Rsqrt => |v| rsqrt::<f32>(v),
        UnaryOp::Recip => |v| recip::<f32>(v),
        UnaryOp::Square => |v| square::<f32>(v),
        UnaryOp::Relu => |v| relu::<f32>(v),
        UnaryOp::Gelu => |v| vmath::gelu_f32(v),
        UnaryOp::GeluTanh => |v| vmath::gelu_tanh_f32(v),
        UnaryOp::Sigmoid => |v| vmath::sigmoid_f32(v),
        UnaryOp::Silu => |v| vmath::silu_f32(v),
        UnaryOp::Tanh => |v| vmath::tanh_f32(v),
        UnaryOp::Sin => |v| f32::sin(v),
        UnaryOp::Cos => |v| f32::cos(v),
        UnaryOp::Erf => |v| vmath::erf_f32(v),
    });
    Ok(())
}

/// [`unary`] for f64: the reference's own definitions per element (accuracy first), threaded; the
/// ops that are plain arithmetic vectorise.
#[allow(clippy::redundant_closure)]
fn unary_f64(mem: &mut HostMemory, d: &UnaryDesc, ctx: Ctx) -> Result<()> {
    let Some((x, out)) = unary_operands::<f64>(mem, d)? else {
        return reference::unary(mem, d);
    };
    let x = &x;
    map_by_op!(d.op, x, out, ctx, {
        UnaryOp::Neg => |v| neg::<f64>(v),
        UnaryOp::Abs => |v| f64::abs(v),
        UnaryOp::Sqrt => |v| f64::sqrt(v),
        UnaryOp::Rsqrt => |v| rsqrt::<f64>(v),
        UnaryOp::Recip => |v| recip::<f64>(v),
        UnaryOp::Square => |v| square::<f64>(v),
        UnaryOp::Relu => |v| relu::<f64>(v),
        op => |v| math::unary(op, v),
    });
    Ok(())
}

/// `−x`.
#[inline(always)]
fn neg<R: Real>(x: R) -> R {
    -x
}

/// `1/√x`.
#[inline(always)]
fn rsqrt<R: Real>(x: R) -> R {
    R::ONE / x.sqrt()
}

/// `1/x`.
#[inline(always)]
fn recip<R: Real>(x: R) -> R {
    R::ONE / x
}

/// `x²`.
#[inline(always)]
fn square<R: Real>(x: R) -> R {
    x * x
}

/// `max(x, 0)`, keeping NaN (and turning −0 into 0), as the reference does.
#[inline(always)]
fn relu<R: Real>(x: R) -> R {
    if x > R::ZERO || x.is_nan() {
        x
    } else {
        R::ZERO
    }
}

/// `out[i] = f(x[i])` over every element, threaded; an output of [`worth_streaming`] size that is not
/// the input is written with streaming stores.
fn map<T: Lanes>(x: &View<T>, out: Span<T>, ctx: Ctx, f: impl Elementwise<T::Acc>) {
    let in_place = out.same_as(&x.span());
    let stream = !in_place && worth_streaming(out.len() * std::mem::size_of::<T>());
    for_chunks(out.len(), ctx.threads, TASK_ELEMENTS, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || map_range(x, out, range, in_place, stream, f),
        )
    });
}

/// [`map`] over elements `range`, with streaming stores when `stream` (never in place).
#[inline(always)]
fn map_range<T: Lanes>(
    x: &View<T>,
    out: Span<T>,
    range: Range<usize>,
    in_place: bool,
    stream: bool,
    f: impl Elementwise<T::Acc>,
) {
    let span = x.span();
    if in_place {
        // SAFETY: the output is exactly the (dense) input and this task owns `range` of it; this is
        // the only slice of that memory the task makes.
        let ys = unsafe { out.slice_mut(range) };
        if let Some(ys) = T::as_acc_mut(ys) {
            f.block_in_place(ys);
            return;
        }
        let mut buf = scratch::<T::Acc>();
        for ys in ys.chunks_mut(BLOCK) {
            let b = &mut buf[..ys.len()];
            T::load(ys, b);
            f.block_in_place(b);
            T::store(b, ys);
        }
    } else if x.is_contiguous() {
        // SAFETY: the output does not overlap the input (the checks allow only exact in-place) and
        // this task owns `range` of the output.
        let (xs, ys) = unsafe { (span.slice(range.clone()), out.slice_mut(range)) };
        if stream {
            map_streamed(xs, ys, f);
            return;
        }
        if let (Some(xs), Some(ys)) = (T::as_acc(xs), T::as_acc_mut(ys)) {
            f.block(xs, ys);
            return;
        }
        let mut buf = scratch::<T::Acc>();
        for (xs, ys) in xs.chunks(BLOCK).zip(ys.chunks_mut(BLOCK)) {
            let b = &mut buf[..xs.len()];
            T::load(xs, b);
            f.block_in_place(b);
            T::store(b, ys);
        }
    } else {
        let mut buf = scratch::<T::Acc>();
        for r in blocks(range) {
            let b = &mut buf[..r.len()];
            // SAFETY: nothing writes the input while this runs (the output is disjoint from it).
            unsafe { x.gather(r.start, b) };
            f.block_in_place(b);
            // SAFETY: this task owns `range` of the output.
            T::store(b, unsafe { out.slice_mut(r) });
        }
    }
}

/// `ys[i] = f(xs[i])` (equal lengths), each block built in L1 and streamed past the cache.
#[inline(always)]
fn map_streamed<T: Lanes>(xs: &[T], ys: &mut [T], f: impl Elementwise<T::Acc>) {
    let mut streamer = Streamer::new();
    let mut buf = scratch::<T::Acc>();
    if let (Some(xs), Some(ys)) = (T::as_acc(xs), T::as_acc_mut(ys)) {
        // Straight from the registers where the function can (the streamer's drop fences).
        if f.block_streamed(xs, ys) {
            return;
        }
        streamer.blocks(
            ys,
            &mut buf,
            #[inline(always)]
            |at, b| f.block(&xs[at..at + b.len()], b),
        );
        return;
    }
    let mut narrow = [<T as bytemuck::Zeroable>::zeroed(); BLOCK];
    streamer.blocks(
        ys,
        &mut narrow,
        #[inline(always)]
        |at, b| {
            let w = &mut buf[..b.len()];
            T::load(&xs[at..at + b.len()], w);
            f.block_in_place(w);
            T::store(w, b);
        },
    );
}

impl OpImpl<UnaryDesc> for CpuBackend {
    fn op(&self, desc: &UnaryDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.unary(desc);
        };
        self.kernel(acc, |mem, ctx| unary(mem, desc, ctx))
    }
}
