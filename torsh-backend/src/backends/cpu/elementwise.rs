//! Unary, binary (with broadcasting), cast, fill, strided copy and random fill on the CPU.
//!
//! Every kernel splits its output into [`for_chunks`] ranges (at least [`SERIAL_ELEMENTS`] each, so
//! small tensors stay on the calling thread) and runs each range inside [`with_simd`]. f32 and f64
//! compute straight from the operands; f16 and bf16 are widened to f32 a [`BLOCK`] at a time with the
//! branch-free conversions of [`vmath`] and rounded once on store. f32-family transcendentals use the
//! vectorisable [`vmath`] functions (sin and cos excepted); f64 uses the standard library and `libm`
//! per element, exactly as the reference does.
//!
//! Strided and broadcast operands are walked as runs along their innermost dim after merging the dims
//! every operand steps through contiguously ([`Dims`]), so a bias add is a loop of dense or
//! scalar-broadcast runs. An output may be exactly a (dense) input: the kernels then only ever hold
//! the output's mutable slice, or read a block into scratch before making it.

use std::ops::Range;

use half::{bf16, f16};

use super::host::{
    for_chunks, with_float, with_simd, Ctx, Element, Real, Span, View, BLOCK, SERIAL_ELEMENTS,
};
use super::vmath;
use crate::backends::reference::{elementwise as reference, math, memory::HostMemory};
use crate::compute::{
    BinaryDesc, BinaryOp, CastDesc, CopyDesc, DevicePtr, Distribution, FillDesc, RandomDesc,
    StridedBuf, UnaryDesc, UnaryOp,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::rng;

// Element access.

/// A float element type with vectorisable conversions to and from the type it computes in.
pub(super) trait Lanes: Element {
    /// True when the type is its own compute type (f32, f64).
    const DIRECT: bool;
    /// `xs` itself as compute-type values when the type is its own compute type.
    fn as_acc(xs: &[Self]) -> Option<&[Self::Acc]>;
    /// `xs` itself as compute-type values, mutably, when the type is its own compute type.
    fn as_acc_mut(xs: &mut [Self]) -> Option<&mut [Self::Acc]>;
    /// Widens `src` into `dst` (equal lengths), exactly.
    fn load(src: &[Self], dst: &mut [Self::Acc]);
    /// Rounds `src` into `dst` (equal lengths) to nearest even.
    fn store(src: &[Self::Acc], dst: &mut [Self]);
    /// `v` rounded once to this type, as the reference's `encode` rounds it.
    fn from_f64(v: f64) -> Self;
}

/// [`Lanes`] for a type that is its own compute type.
macro_rules! direct_lanes {
    ($t:ty) => {
        impl Lanes for $t {
            const DIRECT: bool = true;
            #[inline(always)]
            fn as_acc(xs: &[$t]) -> Option<&[$t]> {
                Some(xs)
            }
            #[inline(always)]
            fn as_acc_mut(xs: &mut [$t]) -> Option<&mut [$t]> {
                Some(xs)
            }
            #[inline(always)]
            fn load(src: &[$t], dst: &mut [$t]) {
                dst.copy_from_slice(src);
            }
            #[inline(always)]
            fn store(src: &[$t], dst: &mut [$t]) {
                dst.copy_from_slice(src);
            }
            #[inline(always)]
            fn from_f64(v: f64) -> $t {
                v as $t
            }
        }
    };
}
direct_lanes!(f32);
direct_lanes!(f64);

/// [`Lanes`] for a 16-bit type computed in f32, through `vmath`'s bit conversions.
macro_rules! half_lanes {
    ($t:ty, $widen:path, $narrow:path) => {
        impl Lanes for $t {
            const DIRECT: bool = false;
            #[inline(always)]
            fn as_acc(_: &[$t]) -> Option<&[f32]> {
                None
            }
            #[inline(always)]
            fn as_acc_mut(_: &mut [$t]) -> Option<&mut [f32]> {
                None
            }
            #[inline(always)]
            fn load(src: &[$t], dst: &mut [f32]) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = $widen(s.to_bits());
                }
            }
            #[inline(always)]
            fn store(src: &[f32], dst: &mut [$t]) {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = <$t>::from_bits($narrow(s));
                }
            }
            #[inline(always)]
            fn from_f64(v: f64) -> $t {
                // Rounded once, as the reference rounds (not `half`'s own `from_f64`).
                <$t as crate::dtype::Element>::from_f64(v)
            }
        }
    };
}
half_lanes!(f16, vmath::f16_bits_to_f32, vmath::f32_to_f16_bits);
half_lanes!(bf16, vmath::bf16_bits_to_f32, vmath::f32_to_bf16_bits);

/// A scratch block of compute-type values.
#[inline(always)]
fn scratch<A: Real>() -> [A; BLOCK] {
    [A::ZERO; BLOCK]
}

/// `range` cut into blocks of at most [`BLOCK`] elements.
#[inline(always)]
fn blocks(range: Range<usize>) -> impl Iterator<Item = Range<usize>> {
    let end = range.end;
    range.step_by(BLOCK).map(move |s| s..(s + BLOCK).min(end))
}

/// The span of a strided operand: from its first element (the layout's offset) to its last.
fn raw_span<E: bytemuck::Pod>(
    mem: &mut HostMemory,
    op: &'static str,
    buf: &StridedBuf,
) -> Result<Span<E>> {
    let start = buf.layout.offset();
    let end = buf.layout.span_elements()?;
    let first = DevicePtr(buf.ptr.0 + (start * std::mem::size_of::<E>()) as u64);
    Span::of(mem, op, first, end - start)
}

// Walking strided operands.

/// The dims of an elementwise walk over `K` strided operands in row-major order of their common
/// shape: size-1 dims dropped and neighbouring dims merged where every operand steps through them as
/// one, so the innermost dim is as long as it can be. At least one dim.
#[derive(Clone, Debug)]
pub(super) struct Dims<const K: usize> {
    /// Extents, outermost first.
    shape: Vec<usize>,
    /// Each dim's stride in each operand, in elements.
    strides: Vec<[usize; K]>,
}

impl<const K: usize> Dims<K> {
    /// The walk over `shape` with the operands' `strides`.
    pub(super) fn new(shape: &[usize], strides: [&[usize]; K]) -> Dims<K> {
        // Built innermost first.
        let mut dims: Vec<(usize, [usize; K])> = Vec::with_capacity(shape.len());
        for d in (0..shape.len()).rev() {
            if shape[d] == 1 {
                continue;
            }
            let s: [usize; K] = std::array::from_fn(|k| strides[k][d]);
            if let Some((len, inner)) = dims.last_mut() {
                if (0..K).all(|k| s[k] == inner[k] * *len) {
                    *len *= shape[d];
                    continue;
                }
            }
            dims.push((shape[d], s));
        }
        if dims.is_empty() {
            dims.push((1, [0; K]));
        }
        dims.reverse();
        Dims {
            shape: dims.iter().map(|d| d.0).collect(),
            strides: dims.iter().map(|d| d.1).collect(),
        }
    }

    /// Elements walked.
    pub(super) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Length of the innermost dim and each operand's stride along it.
    pub(super) fn inner(&self) -> (usize, [usize; K]) {
        let last = self.shape.len() - 1;
        (self.shape[last], self.strides[last])
    }

    /// Calls `f(first, positions, len)` for each run along the innermost dim inside elements `range`
    /// of the walk: `first` is the run's first element in walk order, `positions` its element offset
    /// in each operand.
    #[inline(always)]
    pub(super) fn runs(&self, range: Range<usize>, mut f: impl FnMut(usize, [usize; K], usize)) {
        let rank = self.shape.len();
        let last = rank - 1;
        let mut idx = vec![0usize; rank];
        let mut pos = [0usize; K];
        let mut rem = range.start;
        for d in (0..rank).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
            for (p, s) in pos.iter_mut().zip(self.strides[d]) {
                *p += idx[d] * s;
            }
        }
        let (inner_len, inner) = self.inner();
        let mut at = range.start;
        while at < range.end {
            let len = (inner_len - idx[last]).min(range.end - at);
            f(at, pos, len);
            at += len;
            idx[last] += len;
            for (p, s) in pos.iter_mut().zip(inner) {
                *p += len * s;
            }
            if idx[last] < inner_len || at == range.end {
                continue;
            }
            // Carry into the outer dims.
            for (p, s) in pos.iter_mut().zip(inner) {
                *p -= inner_len * s;
            }
            idx[last] = 0;
            let mut d = last;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                for (p, s) in pos.iter_mut().zip(self.strides[d]) {
                    *p += s;
                }
                if idx[d] < self.shape[d] {
                    break;
                }
                for (p, s) in pos.iter_mut().zip(self.strides[d]) {
                    *p -= self.shape[d] * s;
                }
                idx[d] = 0;
            }
        }
    }
}

// Unary.

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
// The closures are not redundant: passed as fn items, the ops are called through an out-of-line
// `Fn::call` shim compiled without the SIMD features (so `mul_add` becomes a libm call); an
// `#[inline(always)]` closure is inlined into the vector loop instead.
#[allow(clippy::redundant_closure)]
fn unary_f32<T: Lanes<Acc = f32>>(mem: &mut HostMemory, d: &UnaryDesc, ctx: Ctx) -> Result<()> {
    let Some((x, out)) = unary_operands::<T>(mem, d)? else {
        return reference::unary(mem, d);
    };
    let x = &x;
    match d.op {
        UnaryOp::Neg => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| neg::<f32>(v),
        ),
        UnaryOp::Abs => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| f32::abs(v),
        ),
        UnaryOp::Exp => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| vmath::exp_f32(v),
        ),
        UnaryOp::Log => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| vmath::ln_f32(v),
        ),
        UnaryOp::Sqrt => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| f32::sqrt(v),
        ),
        UnaryOp::Rsqrt => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| rsqrt::<f32>(v),
        ),
        UnaryOp::Recip => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| recip::<f32>(v),
        ),
        UnaryOp::Square => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| square::<f32>(v),
        ),
        UnaryOp::Relu => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| relu::<f32>(v),
        ),
        UnaryOp::Gelu => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| vmath::gelu_f32(v),
        ),
        UnaryOp::GeluTanh => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| vmath::gelu_tanh_f32(v),
        ),
        UnaryOp::Sigmoid => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| vmath::sigmoid_f32(v),
        ),
        UnaryOp::Silu => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| vmath::silu_f32(v),
        ),
        UnaryOp::Tanh => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| vmath::tanh_f32(v),
        ),
        UnaryOp::Sin => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| f32::sin(v),
        ),
        UnaryOp::Cos => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| f32::cos(v),
        ),
        UnaryOp::Erf => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| vmath::erf_f32(v),
        ),
    }
    Ok(())
}

/// [`unary`] for f64: the reference's own definitions per element (accuracy first), threaded; the
/// ops that are plain arithmetic vectorise.
// The closures are not redundant: passed as fn items, the ops are called through an out-of-line
// `Fn::call` shim compiled without the SIMD features (so `mul_add` becomes a libm call); an
// `#[inline(always)]` closure is inlined into the vector loop instead.
#[allow(clippy::redundant_closure)]
fn unary_f64(mem: &mut HostMemory, d: &UnaryDesc, ctx: Ctx) -> Result<()> {
    let Some((x, out)) = unary_operands::<f64>(mem, d)? else {
        return reference::unary(mem, d);
    };
    let x = &x;
    match d.op {
        UnaryOp::Neg => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| neg::<f64>(v),
        ),
        UnaryOp::Abs => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| f64::abs(v),
        ),
        UnaryOp::Sqrt => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| f64::sqrt(v),
        ),
        UnaryOp::Rsqrt => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| rsqrt::<f64>(v),
        ),
        UnaryOp::Recip => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| recip::<f64>(v),
        ),
        UnaryOp::Square => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| square::<f64>(v),
        ),
        UnaryOp::Relu => map(
            x,
            out,
            ctx,
            #[inline(always)]
            |v| relu::<f64>(v),
        ),
        op => map(
            x,
            out,
            ctx,
            #[inline(always)]
            move |v| math::unary(op, v),
        ),
    }
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

/// `out[i] = f(x[i])` over every element, threaded.
fn map<T: Lanes>(
    x: &View<T>,
    out: Span<T>,
    ctx: Ctx,
    f: impl Fn(T::Acc) -> T::Acc + Copy + Send + Sync,
) {
    let in_place = out.same_as(&x.span());
    for_chunks(out.len(), ctx.threads, SERIAL_ELEMENTS, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || map_range(x, out, range, in_place, f),
        )
    });
}

/// [`map`] over elements `range`.
#[inline(always)]
fn map_range<T: Lanes>(
    x: &View<T>,
    out: Span<T>,
    range: Range<usize>,
    in_place: bool,
    f: impl Fn(T::Acc) -> T::Acc,
) {
    let span = x.span();
    if in_place {
        // SAFETY: the output is exactly the (dense) input and this task owns `range` of it; this is
        // the only slice of that memory the task makes.
        let ys = unsafe { out.slice_mut(range) };
        if let Some(ys) = T::as_acc_mut(ys) {
            for y in ys {
                *y = f(*y);
            }
            return;
        }
        let mut buf = scratch::<T::Acc>();
        for ys in ys.chunks_mut(BLOCK) {
            let b = &mut buf[..ys.len()];
            T::load(ys, b);
            apply(b, &f);
            T::store(b, ys);
        }
    } else if x.is_contiguous() {
        // SAFETY: the output does not overlap the input (the checks allow only exact in-place) and
        // this task owns `range` of the output.
        let (xs, ys) = unsafe { (span.slice(range.clone()), out.slice_mut(range)) };
        if let (Some(xs), Some(ys)) = (T::as_acc(xs), T::as_acc_mut(ys)) {
            for (y, &v) in ys.iter_mut().zip(xs) {
                *y = f(v);
            }
            return;
        }
        let mut buf = scratch::<T::Acc>();
        for (xs, ys) in xs.chunks(BLOCK).zip(ys.chunks_mut(BLOCK)) {
            let b = &mut buf[..xs.len()];
            T::load(xs, b);
            apply(b, &f);
            T::store(b, ys);
        }
    } else {
        let mut buf = scratch::<T::Acc>();
        for r in blocks(range) {
            let b = &mut buf[..r.len()];
            // SAFETY: nothing writes the input while this runs (the output is disjoint from it).
            unsafe { x.gather(r.start, b) };
            apply(b, &f);
            // SAFETY: this task owns `range` of the output.
            T::store(b, unsafe { out.slice_mut(r) });
        }
    }
}

/// `b[i] = f(b[i])`.
#[inline(always)]
fn apply<A: Copy>(b: &mut [A], f: &impl Fn(A) -> A) {
    for v in b {
        *v = f(*v);
    }
}

// Binary.

/// `aᵇ` in the compute type.
trait Pow: Real {
    /// `self` to the power `e`.
    fn pow(self, e: Self) -> Self;
}

impl Pow for f32 {
    #[inline(always)]
    fn pow(self, e: f32) -> f32 {
        self.powf(e)
    }
}

impl Pow for f64 {
    #[inline(always)]
    fn pow(self, e: f64) -> f64 {
        self.powf(e)
    }
}

/// `output[i] = op(lhs[i], rhs[i])` over the (broadcast) views.
pub(crate) fn binary(mem: &mut HostMemory, d: &BinaryDesc, ctx: Ctx) -> Result<()> {
    match d.dtype {
        DType::F32 => binary_t::<f32>(mem, d, ctx),
        DType::F64 => binary_t::<f64>(mem, d, ctx),
        DType::F16 => binary_t::<f16>(mem, d, ctx),
        DType::BF16 => binary_t::<bf16>(mem, d, ctx),
        _ => reference::binary(mem, d),
    }
}

/// One operand of a binary op.
#[derive(Clone, Copy, Debug)]
struct Operand<T> {
    /// From its first element to its last.
    span: Span<T>,
    /// True when the output is this operand's memory (then it is dense).
    is_output: bool,
}

/// [`binary`] for element type `T`.
fn binary_t<T: Lanes>(mem: &mut HostMemory, d: &BinaryDesc, ctx: Ctx) -> Result<()>
where
    T::Acc: Pow,
{
    const OP: &str = "binary";
    let lhs = View::<T>::of(mem, OP, &d.lhs)?;
    let rhs = View::<T>::of(mem, OP, &d.rhs)?;
    let out = Span::<T>::of(mem, OP, d.output, lhs.numel())?;
    let operand = |v: &View<T>| Operand {
        span: v.span(),
        is_output: out.same_as(&v.span()),
    };
    let (a, b) = (operand(&lhs), operand(&rhs));
    if a.is_output && !lhs.is_contiguous() || b.is_output && !rhs.is_contiguous() {
        // The checks never let an output overlap a non-dense input; the reference copes if they did.
        return reference::binary(mem, d);
    }
    let dims = Dims::new(
        d.lhs.layout.shape(),
        [d.lhs.layout.strides(), d.rhs.layout.strides()],
    );
    type A<T> = <T as Element>::Acc;
    match d.op {
        BinaryOp::Add => zip(&dims, a, b, out, ctx, |x: A<T>, y| x + y),
        BinaryOp::Sub => zip(&dims, a, b, out, ctx, |x: A<T>, y| x - y),
        BinaryOp::Mul => zip(&dims, a, b, out, ctx, |x: A<T>, y| x * y),
        BinaryOp::Div => zip(&dims, a, b, out, ctx, |x: A<T>, y| x / y),
        BinaryOp::Maximum => zip(&dims, a, b, out, ctx, maximum::<A<T>>),
        BinaryOp::Minimum => zip(&dims, a, b, out, ctx, minimum::<A<T>>),
        BinaryOp::Pow => zip(&dims, a, b, out, ctx, <A<T> as Pow>::pow),
    }
    Ok(())
}

/// The larger of `a` and `b`, NaN if either is.
#[inline(always)]
fn maximum<R: Real>(a: R, b: R) -> R {
    if a > b || a.is_nan() {
        a
    } else {
        b
    }
}

/// The smaller of `a` and `b`, NaN if either is.
#[inline(always)]
fn minimum<R: Real>(a: R, b: R) -> R {
    if a < b || a.is_nan() {
        a
    } else {
        b
    }
}

/// `out[i] = f(a[i], b[i])` over the walk `dims` (operand 0 `a`, operand 1 `b`), threaded.
fn zip<T: Lanes>(
    dims: &Dims<2>,
    a: Operand<T>,
    b: Operand<T>,
    out: Span<T>,
    ctx: Ctx,
    f: impl Fn(T::Acc, T::Acc) -> T::Acc + Copy + Send + Sync,
) {
    let (_, [sa, sb]) = dims.inner();
    for_chunks(dims.numel(), ctx.threads, SERIAL_ELEMENTS, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut bufs = (scratch::<T::Acc>(), scratch::<T::Acc>());
                dims.runs(range, |at, [pa, pb], len| {
                    let (ra, rb) = (Run::of(a, pa, sa), Run::of(b, pb, sb));
                    zip_run(ra, rb, out, at..at + len, &mut bufs, f);
                });
            },
        )
    });
}

/// How one operand of a binary op is read along a run.
#[derive(Clone, Copy, Debug)]
enum Run<T> {
    /// The output's own elements (exact in-place).
    Output,
    /// Contiguous elements from this position of the span.
    Dense(Span<T>, usize),
    /// One element, repeated.
    Scalar(Span<T>, usize),
    /// Elements at this position and stride.
    Strided(Span<T>, usize, usize),
}

impl<T: Lanes> Run<T> {
    /// Operand `o` read from element `pos` with stride `stride`.
    #[inline(always)]
    fn of(o: Operand<T>, pos: usize, stride: usize) -> Run<T> {
        match stride {
            _ if o.is_output => Run::Output,
            0 => Run::Scalar(o.span, pos),
            1 => Run::Dense(o.span, pos),
            s => Run::Strided(o.span, pos, s),
        }
    }

    /// Reads the run's elements for output elements `r` into `buf` (`r.len()` long), widened.
    ///
    /// # Safety
    /// No task writes the elements read while this runs.
    #[inline(always)]
    unsafe fn read(self, out: Span<T>, r: Range<usize>, buf: &mut [T::Acc]) {
        let len = r.len();
        match self {
            Run::Output => T::load(out.slice(r), buf),
            Run::Dense(span, pos) => T::load(span.slice(pos..pos + len), buf),
            Run::Scalar(span, pos) => buf.fill(span.slice(pos..pos + 1)[0].widen()),
            Run::Strided(span, pos, s) => {
                let xs = span.slice(pos..pos + (len - 1) * s + 1);
                for (k, v) in buf.iter_mut().enumerate() {
                    *v = xs[k * s].widen();
                }
            }
        }
    }

    /// The same run advanced by `k` elements.
    #[inline(always)]
    fn skip(self, k: usize) -> Run<T> {
        match self {
            Run::Output => Run::Output,
            Run::Dense(span, pos) => Run::Dense(span, pos + k),
            Run::Scalar(span, pos) => Run::Scalar(span, pos),
            Run::Strided(span, pos, s) => Run::Strided(span, pos + k * s, s),
        }
    }
}

/// One run of [`zip`]: output elements `r` from runs `a` and `b`. Dense, scalar and in-place runs of
/// f32 and f64 loop directly; everything else goes through the scratch blocks `bufs`.
#[inline(always)]
fn zip_run<T: Lanes>(
    a: Run<T>,
    b: Run<T>,
    out: Span<T>,
    r: Range<usize>,
    bufs: &mut ([T::Acc; BLOCK], [T::Acc; BLOCK]),
    f: impl Fn(T::Acc, T::Acc) -> T::Acc,
) {
    if T::DIRECT && zip_direct(a, b, out, r.clone(), &f) {
        return;
    }
    for block in blocks(r.clone()) {
        let k = block.start - r.start;
        let n = block.len();
        let (ba, bb) = (&mut bufs.0[..n], &mut bufs.1[..n]);
        // SAFETY: this task owns output elements `r`; inputs other than the output itself never
        // overlap the output, and the output block is read before its mutable slice is made.
        unsafe {
            a.skip(k).read(out, block.clone(), ba);
            b.skip(k).read(out, block.clone(), bb);
        }
        for (x, &y) in ba.iter_mut().zip(bb.iter()) {
            *x = f(*x, y);
        }
        // SAFETY: as above.
        T::store(ba, unsafe { out.slice_mut(block) });
    }
}

/// The direct loops of [`zip_run`] for f32 and f64 (dense, scalar and in-place runs); false for
/// the combinations (and types) they do not handle.
#[inline(always)]
fn zip_direct<T: Lanes>(
    a: Run<T>,
    b: Run<T>,
    out: Span<T>,
    r: Range<usize>,
    f: &impl Fn(T::Acc, T::Acc) -> T::Acc,
) -> bool {
    let len = r.len();
    let one = |span: Span<T>, pos: usize| {
        // SAFETY: a broadcast input never overlaps the output, so nothing writes it.
        unsafe { span.slice(pos..pos + 1)[0].widen() }
    };
    // SAFETY: this task owns output elements `r`, and makes no other slice of them; inputs other
    // than the output itself never overlap the output, so nothing writes them.
    unsafe {
        match (a, b) {
            (Run::Dense(sa, pa), Run::Dense(sb, pb)) => map2(
                sa.slice(pa..pa + len),
                sb.slice(pb..pb + len),
                out.slice_mut(r),
                f,
            ),
            (Run::Dense(sa, pa), Run::Scalar(sb, pb)) => {
                let y = one(sb, pb);
                map1(sa.slice(pa..pa + len), out.slice_mut(r), |x| f(x, y))
            }
            (Run::Scalar(sa, pa), Run::Dense(sb, pb)) => {
                let x = one(sa, pa);
                map1(sb.slice(pb..pb + len), out.slice_mut(r), |y| f(x, y))
            }
            (Run::Output, Run::Dense(sb, pb)) => {
                update(out.slice_mut(r), sb.slice(pb..pb + len), f)
            }
            (Run::Dense(sa, pa), Run::Output) => {
                update(out.slice_mut(r), sa.slice(pa..pa + len), |o, x| f(x, o))
            }
            (Run::Output, Run::Scalar(sb, pb)) => {
                let y = one(sb, pb);
                update1(out.slice_mut(r), |o| f(o, y))
            }
            (Run::Scalar(sa, pa), Run::Output) => {
                let x = one(sa, pa);
                update1(out.slice_mut(r), |o| f(x, o))
            }
            (Run::Output, Run::Output) => update1(out.slice_mut(r), |o| f(o, o)),
            _ => false,
        }
    }
}

/// `out[i] = f(xs[i], ys[i])` when `T` is its own compute type; false otherwise.
#[inline(always)]
fn map2<T: Lanes>(
    xs: &[T],
    ys: &[T],
    out: &mut [T],
    f: &impl Fn(T::Acc, T::Acc) -> T::Acc,
) -> bool {
    let (Some(xs), Some(ys), Some(out)) = (T::as_acc(xs), T::as_acc(ys), T::as_acc_mut(out)) else {
        return false;
    };
    for ((o, &x), &y) in out.iter_mut().zip(xs).zip(ys) {
        *o = f(x, y);
    }
    true
}

/// `out[i] = f(xs[i])` when `T` is its own compute type; false otherwise.
#[inline(always)]
fn map1<T: Lanes>(xs: &[T], out: &mut [T], f: impl Fn(T::Acc) -> T::Acc) -> bool {
    let (Some(xs), Some(out)) = (T::as_acc(xs), T::as_acc_mut(out)) else {
        return false;
    };
    for (o, &x) in out.iter_mut().zip(xs) {
        *o = f(x);
    }
    true
}

/// `out[i] = f(out[i], ys[i])` when `T` is its own compute type; false otherwise.
#[inline(always)]
fn update<T: Lanes>(out: &mut [T], ys: &[T], f: impl Fn(T::Acc, T::Acc) -> T::Acc) -> bool {
    let (Some(ys), Some(out)) = (T::as_acc(ys), T::as_acc_mut(out)) else {
        return false;
    };
    for (o, &y) in out.iter_mut().zip(ys) {
        *o = f(*o, y);
    }
    true
}

/// `out[i] = f(out[i])` when `T` is its own compute type; false otherwise.
#[inline(always)]
fn update1<T: Lanes>(out: &mut [T], f: impl Fn(T::Acc) -> T::Acc) -> bool {
    let Some(out) = T::as_acc_mut(out) else {
        return false;
    };
    for o in out {
        *o = f(*o);
    }
    true
}

// Cast.

/// A cast destination: stores values of the compute type `A` as `Self`, with the reference's
/// conversion semantics (floats round to nearest even; integers truncate toward zero and saturate,
/// NaN → 0, as Rust's `as`).
trait Put<A>: bytemuck::Pod + Send + Sync {
    /// The destination dtype.
    const DTYPE: DType;
    /// Converts `src` into `dst` (equal lengths).
    fn put(src: &[A], dst: &mut [Self]);
}

/// [`Put`] by a plain `as` conversion per element.
macro_rules! put_as {
    ($a:ty => $($t:ty: $dtype:ident),*) => {
        $(
            impl Put<$a> for $t {
                const DTYPE: DType = DType::$dtype;
                #[inline(always)]
                fn put(src: &[$a], dst: &mut [$t]) {
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = s as $t;
                    }
                }
            }
        )*
    };
}
put_as!(f32 => f32: F32, f64: F64, i32: I32, i64: I64, u8: U8);
put_as!(f64 => f32: F32, f64: F64, i32: I32, i64: I64, u8: U8);

/// [`Put`] into a 16-bit float type: from f32 through `Lanes::store`, from f64 one rounding per
/// element as the reference rounds ([`crate::dtype::f16_from_f64`] and its bf16 twin).
macro_rules! put_half {
    ($($t:ty: $dtype:ident),*) => {
        $(
            impl Put<f32> for $t {
                const DTYPE: DType = DType::$dtype;
                #[inline(always)]
                fn put(src: &[f32], dst: &mut [$t]) {
                    <$t as Lanes>::store(src, dst);
                }
            }
            impl Put<f64> for $t {
                const DTYPE: DType = DType::$dtype;
                #[inline(always)]
                fn put(src: &[f64], dst: &mut [$t]) {
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = <$t as crate::dtype::Element>::from_f64(s);
                    }
                }
            }
        )*
    };
}
put_half!(f16: F16, bf16: BF16);

/// Converts every element. Integer sources take the reference kernel.
pub(crate) fn cast(mem: &mut HostMemory, d: &CastDesc, ctx: Ctx) -> Result<()> {
    match d.src_dtype {
        DType::F32 => cast_from_f32::<f32>(mem, d, ctx),
        DType::F16 => cast_from_f32::<f16>(mem, d, ctx),
        DType::BF16 => cast_from_f32::<bf16>(mem, d, ctx),
        DType::F64 => cast_from_f64(mem, d, ctx),
        _ => reference::cast(mem, d),
    }
}

/// [`cast`] from a type that computes in f32.
fn cast_from_f32<S: Lanes<Acc = f32>>(mem: &mut HostMemory, d: &CastDesc, ctx: Ctx) -> Result<()> {
    match d.dst_dtype {
        DType::F32 => convert::<S, f32>(mem, d, ctx),
        DType::F64 => convert::<S, f64>(mem, d, ctx),
        DType::F16 => convert::<S, f16>(mem, d, ctx),
        DType::BF16 => convert::<S, bf16>(mem, d, ctx),
        DType::I32 => convert::<S, i32>(mem, d, ctx),
        DType::I64 => convert::<S, i64>(mem, d, ctx),
        DType::U8 => convert::<S, u8>(mem, d, ctx),
    }
}

/// [`cast`] from f64.
fn cast_from_f64(mem: &mut HostMemory, d: &CastDesc, ctx: Ctx) -> Result<()> {
    match d.dst_dtype {
        DType::F32 => convert::<f64, f32>(mem, d, ctx),
        DType::F64 => convert::<f64, f64>(mem, d, ctx),
        DType::F16 => convert::<f64, f16>(mem, d, ctx),
        DType::BF16 => convert::<f64, bf16>(mem, d, ctx),
        DType::I32 => convert::<f64, i32>(mem, d, ctx),
        DType::I64 => convert::<f64, i64>(mem, d, ctx),
        DType::U8 => convert::<f64, u8>(mem, d, ctx),
    }
}

/// [`cast`] from `S` to `D`: a block at a time, widened into scratch (which also makes an exact
/// in-place cast between same-size types safe), converted on store; a same-type dense cast is a copy.
fn convert<S: Lanes, D: Put<S::Acc>>(mem: &mut HostMemory, d: &CastDesc, ctx: Ctx) -> Result<()> {
    const OP: &str = "cast";
    let x = View::<S>::of(mem, OP, &d.input)?;
    let out = Span::<D>::of(mem, OP, d.output, x.numel())?;
    let in_place = out.same_as(&x.span());
    if in_place && !x.is_contiguous() {
        // The checks never let an output overlap a non-dense input; the reference copes if they did.
        return reference::cast(mem, d);
    }
    let copy = S::DTYPE == D::DTYPE && x.is_contiguous();
    if copy && in_place {
        return Ok(());
    }
    let x = &x;
    for_chunks(out.len(), ctx.threads, SERIAL_ELEMENTS, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || convert_range(x, out, range, copy),
        )
    });
    Ok(())
}

/// [`convert`] over elements `range`.
#[inline(always)]
fn convert_range<S: Lanes, D: Put<S::Acc>>(
    x: &View<S>,
    out: Span<D>,
    range: Range<usize>,
    copy: bool,
) {
    let span = x.span();
    if copy {
        // SAFETY: input and output are disjoint (a copy in place returned earlier, and the checks
        // allow no other overlap); this task owns `range` of the output.
        let (xs, ys) = unsafe { (span.slice(range.clone()), out.slice_mut(range.clone())) };
        if let Ok(xs) = bytemuck::try_cast_slice::<S, D>(xs) {
            ys.copy_from_slice(xs);
            return;
        }
    }
    let mut buf = scratch::<S::Acc>();
    for r in blocks(range) {
        let b = &mut buf[..r.len()];
        // SAFETY: this task reads input elements `r` and only then makes the output's slice of the
        // same elements (the same memory when in place); no other task touches them.
        unsafe {
            if x.is_contiguous() {
                S::load(span.slice(r.clone()), b);
            } else {
                x.gather(r.start, b);
            }
            D::put(b, out.slice_mut(r));
        }
    }
}

// Fill, copy, random.

/// Sets every element to `value` (rounded once, as the reference rounds it).
pub(crate) fn fill(mem: &mut HostMemory, d: &FillDesc, ctx: Ctx) -> Result<()> {
    with_float!(d.dtype, T => fill_t::<T>(mem, d, ctx), _ => reference::fill(mem, d))
}

/// [`fill`] for element type `T`.
fn fill_t<T: Lanes>(mem: &mut HostMemory, d: &FillDesc, ctx: Ctx) -> Result<()> {
    let out = Span::<T>::of(mem, "fill", d.ptr, d.len)?;
    let v = T::from_f64(d.value);
    for_chunks(d.len, ctx.threads, SERIAL_ELEMENTS, |range| {
        // SAFETY: this task owns `range` of the output.
        with_simd(
            ctx.simd,
            #[inline(always)]
            || unsafe { out.slice_mut(range) }.fill(v),
        )
    });
    Ok(())
}

/// Copies one strided view into another: whole rows where both are dense along their innermost
/// (merged) dim, element by element otherwise; threaded over element ranges.
pub(crate) fn copy_strided(mem: &mut HostMemory, d: &CopyDesc, ctx: Ctx) -> Result<()> {
    match d.dtype.size_in_bytes() {
        1 => copy_t::<u8>(mem, d, ctx),
        2 => copy_t::<u16>(mem, d, ctx),
        4 => copy_t::<u32>(mem, d, ctx),
        8 => copy_t::<u64>(mem, d, ctx),
        _ => reference::copy_strided(mem, d),
    }
}

/// [`copy_strided`] for elements of `E`'s size (the bits are copied as they are).
fn copy_t<E: bytemuck::Pod + Send + Sync>(
    mem: &mut HostMemory,
    d: &CopyDesc,
    ctx: Ctx,
) -> Result<()> {
    const OP: &str = "copy_strided";
    if d.src.layout.numel() == 0 {
        return Ok(());
    }
    let src = raw_span::<E>(mem, OP, &d.src)?;
    let dst = raw_span::<E>(mem, OP, &d.dst)?;
    if src.same_as(&dst) {
        // Only an exact in-place copy gets here (both dense, same region): nothing to do.
        return Ok(());
    }
    let dims = Dims::new(
        d.src.layout.shape(),
        [d.src.layout.strides(), d.dst.layout.strides()],
    );
    if let Some(t) = Transpose::plan(&dims) {
        t.run(src, dst, ctx);
        return Ok(());
    }
    let (_, [ss, ds]) = dims.inner();
    for_chunks(dims.numel(), ctx.threads, SERIAL_ELEMENTS, |range| {
        dims.runs(range, |_, [ps, pd], len| {
            // SAFETY: the destination is injective (checked) and disjoint from the source, and this
            // task writes only the destination elements of its own walk range.
            unsafe {
                if ss == 1 && ds == 1 {
                    dst.slice_mut(pd..pd + len)
                        .copy_from_slice(src.slice(ps..ps + len));
                } else {
                    let xs = src.slice(ps..ps + (len - 1) * ss + 1);
                    for k in 0..len {
                        dst.write(pd + k * ds, xs[k * ss]);
                    }
                }
            }
        })
    });
    Ok(())
}

/// Rows and columns of the tiles a [`Transpose`] moves at a time. Small on purpose: with
/// power-of-two strides every source column (and destination row) of a tile falls in the same L1
/// set, whose 8 ways must hold them all; 16 × 8 measured fastest for 4-byte elements on a 4096²
/// transpose (2× a 32 × 32 tile, which thrashes that set).
const TRANSPOSE_TILE: (usize, usize) = (16, 8);

/// Rows and columns of the blocks a [`Transpose`] walks tile by tile: every source column and
/// destination row a block touches is used for 256 elements (1–2 KiB) before the walk moves on, so
/// a page's TLB entry serves a kilobyte or more rather than one cache line.
const TRANSPOSE_BLOCK: usize = 256;

/// A copy that reads its innermost dim with a stride but has another dim (the *rows*) contiguous in
/// the source, as `x.t()` does: copied in tiles of [`TRANSPOSE_TILE`] rows × columns inside blocks of
/// [`TRANSPOSE_BLOCK`], so that every
/// cache line read or written is used whole (the element-by-element walk fetched a source line per
/// element). Work items are (plane of the remaining dims, band of rows).
#[derive(Debug)]
struct Transpose {
    /// The remaining dims, outermost first: extent and `[source, destination]` stride.
    planes: Vec<(usize, [usize; 2])>,
    /// Rows: extent and destination stride (their source stride is 1).
    rows: (usize, usize),
    /// Columns (the walk's innermost dim): extent and `[source, destination]` stride.
    cols: (usize, [usize; 2]),
}

impl Transpose {
    /// The tiled plan for `dims`, or `None` when the innermost dim is contiguous in the source, no
    /// other dim is, or either side of the tile would be shorter than 4.
    fn plan(dims: &Dims<2>) -> Option<Transpose> {
        let last = dims.shape.len() - 1;
        let (cols, col) = (dims.shape[last], dims.strides[last]);
        if col[0] == 1 || cols < 4 {
            return None;
        }
        let row = (0..last).rev().find(|&d| dims.strides[d][0] == 1)?;
        if dims.shape[row] < 4 {
            return None;
        }
        let planes = (0..last)
            .filter(|&d| d != row)
            .map(|d| (dims.shape[d], dims.strides[d]))
            .collect();
        Some(Transpose {
            planes,
            rows: (dims.shape[row], dims.strides[row][1]),
            cols: (cols, col),
        })
    }

    /// Source and destination offsets of plane `p`.
    fn plane_at(&self, mut p: usize) -> [usize; 2] {
        let mut at = [0, 0];
        for &(len, [ss, ds]) in self.planes.iter().rev() {
            at[0] += (p % len) * ss;
            at[1] += (p % len) * ds;
            p /= len;
        }
        at
    }

    /// Copies `src` to `dst` (disjoint; the destination injective) on `ctx.threads` threads.
    fn run<E: bytemuck::Pod + Send + Sync>(&self, src: Span<E>, dst: Span<E>, ctx: Ctx) {
        let planes: usize = self.planes.iter().map(|p| p.0).product();
        let rows = self.rows.0;
        let bands = rows.div_ceil(TRANSPOSE_BLOCK);
        let min_items = SERIAL_ELEMENTS
            .div_ceil(TRANSPOSE_BLOCK * self.cols.0)
            .max(1);
        for_chunks(planes * bands, ctx.threads, min_items, |items| {
            for item in items {
                let at = self.plane_at(item / bands);
                let r0 = (item % bands) * TRANSPOSE_BLOCK;
                let band = r0..(r0 + TRANSPOSE_BLOCK).min(rows);
                for c0 in (0..self.cols.0).step_by(TRANSPOSE_BLOCK) {
                    let block = c0..(c0 + TRANSPOSE_BLOCK).min(self.cols.0);
                    self.block(src, dst, at, band.clone(), block);
                }
            }
        });
    }

    /// Copies rows `rows` × columns `cols` of the plane at offsets `[ps, pd]`, tile by tile.
    #[inline(always)]
    fn block<E: bytemuck::Pod>(
        &self,
        src: Span<E>,
        dst: Span<E>,
        [ps, pd]: [usize; 2],
        rows: Range<usize>,
        cols: Range<usize>,
    ) {
        let row_ds = self.rows.1;
        let [col_ss, col_ds] = self.cols.1;
        let (tile_rows, tile_cols) = TRANSPOSE_TILE;
        for r0 in rows.clone().step_by(tile_rows) {
            for c0 in cols.clone().step_by(tile_cols) {
                for r in r0..(r0 + tile_rows).min(rows.end) {
                    for c in c0..(c0 + tile_cols).min(cols.end) {
                        // SAFETY: both offsets lie inside their layouts' spans (the walk's dims are
                        // the layouts' own); the destination is injective and disjoint from the
                        // source, and element (plane, r, c) belongs to the calling task alone.
                        unsafe {
                            let v = src.read(ps + r + c * col_ss);
                            dst.write(pd + r * row_ds + c * col_ds, v);
                        }
                    }
                }
            }
        }
    }
}

/// Fills with the crate's counter-based streams, bit-identical to the reference: each value in f64,
/// rounded once.
pub(crate) fn random(mem: &mut HostMemory, d: &RandomDesc, ctx: Ctx) -> Result<()> {
    with_float!(d.dtype, T => random_t::<T>(mem, d, ctx), _ => reference::random(mem, d))
}

/// [`random`] for element type `T`.
fn random_t<T: Lanes>(mem: &mut HostMemory, d: &RandomDesc, ctx: Ctx) -> Result<()> {
    let out = Span::<T>::of(mem, "random", d.ptr, d.len)?;
    let seed = d.seed;
    match d.distribution {
        Distribution::Uniform { low, high } => generate(out, ctx, SERIAL_ELEMENTS / 4, move |i| {
            low + (high - low) * rng::uniform(seed, i)
        }),
        Distribution::Normal { mean, std } => generate(out, ctx, SERIAL_ELEMENTS / 16, move |i| {
            mean + std * rng::normal(seed, i)
        }),
    }
    Ok(())
}

/// `out[i] = value(i)` rounded once, threaded in chunks of at least `min_chunk`.
fn generate<T: Lanes>(
    out: Span<T>,
    ctx: Ctx,
    min_chunk: usize,
    value: impl Fn(u64) -> f64 + Copy + Send + Sync,
) {
    for_chunks(out.len(), ctx.threads, min_chunk, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // SAFETY: this task owns `range` of the output.
                let ys = unsafe { out.slice_mut(range.clone()) };
                for (y, i) in ys.iter_mut().zip(range.start as u64..) {
                    *y = T::from_f64(value(i));
                }
            },
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::cpu::simd::SimdLevel;
    use crate::rng::HostRng;
    use crate::shape::Layout;

    const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

    /// Runs `f` with one thread, then with two inside a two-thread pool.
    fn for_threads(f: impl Fn(Ctx) + Send + Sync) {
        let simd = SimdLevel::detect();
        f(Ctx { threads: 1, simd });
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| f(Ctx { threads: 2, simd }));
    }

    /// `n` random values in `[lo, hi)`.
    fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
        HostRng::new(seed).uniform_vec(n, lo, hi)
    }

    /// A fresh buffer holding `vals` as `dtype`.
    fn upload(mem: &mut HostMemory, dtype: DType, vals: &[f64]) -> DevicePtr {
        let ptr = mem.alloc(vals.len() * dtype.size_in_bytes()).unwrap();
        mem.store(dtype, ptr, vals).unwrap();
        ptr
    }

    /// A fresh (poisoned) buffer of `n` elements of `dtype`.
    fn fresh(mem: &mut HostMemory, dtype: DType, n: usize) -> DevicePtr {
        mem.alloc(n * dtype.size_in_bytes()).unwrap()
    }

    /// Asserts `got` matches `want` within the parity bound of `dtype` (norm-wise relative error),
    /// with NaN exactly where `want` has NaN and equal infinities.
    fn assert_close(got: &[f64], want: &[f64], dtype: DType, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        let bound = match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            _ => 1e-2,
        };
        let (mut num, mut den) = (0.0, 0.0);
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
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

    /// The views a unary or cast input is read through: `[rows, cols]` dense, transposed (from a
    /// `[cols, rows]` buffer), and a row broadcast (stride 0) with an offset; with their buffer
    /// sizes.
    fn views(rows: usize, cols: usize) -> Vec<(&'static str, Layout, usize)> {
        vec![
            ("dense", Layout::contiguous(&[rows, cols]), rows * cols),
            (
                "transposed",
                Layout::new(vec![rows, cols], vec![1, rows], 0).unwrap(),
                rows * cols,
            ),
            (
                "broadcast",
                Layout::new(vec![rows, cols], vec![0, 1], 3).unwrap(),
                cols + 3,
            ),
        ]
    }

    /// Input range of a unary op's test data.
    fn domain(op: UnaryOp) -> (f64, f64) {
        match op {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => (0.25, 4.0),
            _ => (-6.0, 6.0),
        }
    }

    /// Runs unary `op` on `input` with this backend's kernel and the reference and compares.
    fn check_unary(mem: &mut HostMemory, op: UnaryOp, dtype: DType, input: StridedBuf, ctx: Ctx) {
        let n = input.layout.numel();
        let (mine, theirs) = (fresh(mem, dtype, n), fresh(mem, dtype, n));
        let desc = |output| UnaryDesc {
            op,
            dtype,
            input: input.clone(),
            output,
        };
        unary(mem, &desc(mine), ctx).unwrap();
        reference::unary(mem, &desc(theirs)).unwrap();
        let got = mem.load_dense(dtype, mine, n).unwrap();
        let want = mem.load_dense(dtype, theirs, n).unwrap();
        let what = format!(
            "{} {dtype} {:?} ({} threads)",
            op.name(),
            input.layout,
            ctx.threads
        );
        assert_close(&got, &want, dtype, &what);
    }

    #[test]
    fn unary_matches_the_reference_for_every_op_dtype_and_view() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            for &op in UnaryOp::ALL {
                let (lo, hi) = domain(op);
                for dtype in FLOATS {
                    for (rows, cols) in [(1, 1), (3, 7), (5, BLOCK + 3)] {
                        for (_, layout, len) in views(rows, cols) {
                            let ptr = upload(&mut mem, dtype, &values(len, 7, lo, hi));
                            check_unary(&mut mem, op, dtype, StridedBuf { ptr, layout }, ctx);
                        }
                    }
                }
            }
        });
    }

    #[test]
    fn unary_splits_large_inputs_across_threads() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            let n = 2 * SERIAL_ELEMENTS + BLOCK + 17;
            for op in [UnaryOp::Exp, UnaryOp::Gelu, UnaryOp::Neg, UnaryOp::Log] {
                let (lo, hi) = domain(op);
                for dtype in FLOATS {
                    let ptr = upload(&mut mem, dtype, &values(n, 11, lo, hi));
                    let input = StridedBuf::contiguous(ptr, &[n]);
                    check_unary(&mut mem, op, dtype, input, ctx);
                    let t = StridedBuf {
                        ptr,
                        layout: Layout::new(vec![n / 7, 7], vec![1, n / 7], 0).unwrap(),
                    };
                    check_unary(&mut mem, op, dtype, t, ctx);
                }
            }
        });
    }

    #[test]
    fn unary_agrees_on_special_values() {
        let specials = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            1e30,
            -1e30,
            60.0,
            -60.0,
            -110.0,
            0.5,
            -3.0,
        ];
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            for &op in UnaryOp::ALL {
                for dtype in FLOATS {
                    let ptr = upload(&mut mem, dtype, &specials);
                    let input = StridedBuf::contiguous(ptr, &[specials.len()]);
                    check_unary(&mut mem, op, dtype, input, ctx);
                }
            }
        });
    }

    #[test]
    fn unary_works_in_place() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            let n = 2 * SERIAL_ELEMENTS + 5;
            for op in [UnaryOp::Tanh, UnaryOp::Relu, UnaryOp::Sqrt, UnaryOp::Sin] {
                let (lo, hi) = domain(op);
                for dtype in FLOATS {
                    let vals = values(n, 3, lo, hi);
                    let (x, copy) = (
                        upload(&mut mem, dtype, &vals),
                        upload(&mut mem, dtype, &vals),
                    );
                    let theirs = fresh(&mut mem, dtype, n);
                    let desc = |input, output| UnaryDesc {
                        op,
                        dtype,
                        input: StridedBuf::contiguous(input, &[n]),
                        output,
                    };
                    unary(&mut mem, &desc(x, x), ctx).unwrap();
                    reference::unary(&mut mem, &desc(copy, theirs)).unwrap();
                    let got = mem.load_dense(dtype, x, n).unwrap();
                    let want = mem.load_dense(dtype, theirs, n).unwrap();
                    assert_close(
                        &got,
                        &want,
                        dtype,
                        &format!("in-place {} {dtype}", op.name()),
                    );
                }
            }
        });
    }

    /// One binary test: name, shape, lhs and rhs layouts, lhs and rhs buffer elements.
    type BinaryCase = (&'static str, Vec<usize>, Layout, Layout, usize, usize);

    /// Operand layouts of binary tests over `shape`: `(lhs, rhs, lhs elements, rhs elements)`.
    fn binary_cases() -> Vec<BinaryCase> {
        let (r, c) = (9, BLOCK + 5);
        let nchw = [2, 3, 5, 7];
        vec![
            (
                "dense",
                vec![r, c],
                Layout::contiguous(&[r, c]),
                Layout::contiguous(&[r, c]),
                r * c,
                r * c,
            ),
            (
                "scalar rhs",
                vec![r, c],
                Layout::contiguous(&[r, c]),
                Layout::new(vec![r, c], vec![0, 0], 0).unwrap(),
                r * c,
                1,
            ),
            (
                "scalar lhs",
                vec![r, 5],
                Layout::new(vec![r, 5], vec![0, 0], 2).unwrap(),
                Layout::contiguous(&[r, 5]),
                3,
                r * 5,
            ),
            (
                "row rhs",
                vec![r, c],
                Layout::contiguous(&[r, c]),
                Layout::new(vec![r, c], vec![0, 1], 0).unwrap(),
                r * c,
                c,
            ),
            (
                "column lhs",
                vec![r, 6],
                Layout::new(vec![r, 6], vec![1, 0], 0).unwrap(),
                Layout::contiguous(&[r, 6]),
                r,
                r * 6,
            ),
            (
                "channel bias",
                nchw.to_vec(),
                Layout::contiguous(&nchw),
                Layout::new(nchw.to_vec(), vec![0, 1, 0, 0], 0).unwrap(),
                210,
                3,
            ),
            (
                "outer",
                vec![r, 11],
                Layout::new(vec![r, 11], vec![1, 0], 0).unwrap(),
                Layout::new(vec![r, 11], vec![0, 1], 0).unwrap(),
                r,
                11,
            ),
            (
                "transposed",
                vec![r, 13],
                Layout::new(vec![r, 13], vec![1, r], 0).unwrap(),
                Layout::new(vec![r, 13], vec![0, 2], 1).unwrap(),
                r * 13,
                27,
            ),
        ]
    }

    /// Runs binary `op` with this backend's kernel and the reference and compares; `output` is where
    /// this backend's result goes (possibly an operand), `theirs` the reference's output.
    #[allow(clippy::too_many_arguments)]
    fn check_binary(
        mem: &mut HostMemory,
        op: BinaryOp,
        dtype: DType,
        lhs: StridedBuf,
        rhs: StridedBuf,
        reference_operands: (StridedBuf, StridedBuf),
        output: DevicePtr,
        ctx: Ctx,
        what: &str,
    ) {
        let n = lhs.layout.numel();
        let theirs = fresh(mem, dtype, n);
        let mine = BinaryDesc {
            op,
            dtype,
            lhs,
            rhs,
            output,
        };
        let want = BinaryDesc {
            op,
            dtype,
            lhs: reference_operands.0,
            rhs: reference_operands.1,
            output: theirs,
        };
        reference::binary(mem, &want).unwrap();
        binary(mem, &mine, ctx).unwrap();
        let got = mem.load_dense(dtype, output, n).unwrap();
        let want = mem.load_dense(dtype, theirs, n).unwrap();
        let what = format!("{} {dtype} {what} ({} threads)", op.name(), ctx.threads);
        assert_close(&got, &want, dtype, &what);
    }

    #[test]
    fn binary_matches_the_reference_for_every_op_dtype_and_broadcast() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            for &op in BinaryOp::ALL {
                let lo = if op == BinaryOp::Pow { 0.5 } else { -2.0 };
                for dtype in FLOATS {
                    for (what, shape, la, lb, na, nb) in binary_cases() {
                        let a = upload(&mut mem, dtype, &values(na, 1, lo, 2.0));
                        let b = upload(&mut mem, dtype, &values(nb, 2, -2.0, 2.0));
                        assert_eq!(la.shape(), &shape[..]);
                        let (a, b) = (
                            StridedBuf { ptr: a, layout: la },
                            StridedBuf { ptr: b, layout: lb },
                        );
                        let out = fresh(&mut mem, dtype, shape.iter().product());
                        let ops = (a.clone(), b.clone());
                        check_binary(&mut mem, op, dtype, a, b, ops, out, ctx, what);
                    }
                }
            }
        });
    }

    #[test]
    fn binary_handles_nan_and_large_threaded_inputs() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            let n = 2 * SERIAL_ELEMENTS + 3;
            for &op in BinaryOp::ALL {
                for dtype in FLOATS {
                    let mut va = values(n, 5, 0.5, 2.0);
                    let mut vb = values(n, 6, -2.0, 2.0);
                    va[3] = f64::NAN;
                    vb[4] = f64::NAN;
                    vb[5] = 0.0;
                    va[6] = f64::INFINITY;
                    let (a, b) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &vb));
                    let (a, b) = (
                        StridedBuf::contiguous(a, &[n]),
                        StridedBuf::contiguous(b, &[n]),
                    );
                    let out = fresh(&mut mem, dtype, n);
                    let ops = (a.clone(), b.clone());
                    check_binary(&mut mem, op, dtype, a, b, ops, out, ctx, "large");
                }
            }
        });
    }

    #[test]
    fn binary_works_in_place() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            let (r, c) = (3, SERIAL_ELEMENTS + 1);
            let n = r * c;
            for op in [BinaryOp::Add, BinaryOp::Div, BinaryOp::Maximum] {
                for dtype in FLOATS {
                    let (va, vb) = (values(n, 8, -2.0, 2.0), values(c, 9, 0.5, 2.0));
                    let row = Layout::new(vec![r, c], vec![0, 1], 0).unwrap();
                    let dense = Layout::contiguous(&[r, c]);
                    let buf = |ptr, layout: &Layout| StridedBuf {
                        ptr,
                        layout: layout.clone(),
                    };
                    let b = upload(&mut mem, dtype, &vb);
                    // Output = lhs, rhs a broadcast row.
                    let (a, copy) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &va));
                    let refs = (buf(copy, &dense), buf(b, &row));
                    let (x, y) = (buf(a, &dense), buf(b, &row));
                    check_binary(&mut mem, op, dtype, x, y, refs, a, ctx, "out = lhs");
                    // Output = rhs, lhs a broadcast row.
                    let (a, copy) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &va));
                    let refs = (buf(b, &row), buf(copy, &dense));
                    let (x, y) = (buf(b, &row), buf(a, &dense));
                    check_binary(&mut mem, op, dtype, x, y, refs, a, ctx, "out = rhs");
                    // Output = lhs = rhs.
                    let (a, copy) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &va));
                    let refs = (buf(copy, &dense), buf(copy, &dense));
                    let (x, y) = (buf(a, &dense), buf(a, &dense));
                    check_binary(&mut mem, op, dtype, x, y, refs, a, ctx, "out = lhs = rhs");
                    // Output = lhs, rhs dense.
                    let (a, copy) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &va));
                    let c2 = upload(&mut mem, dtype, &values(n, 10, 0.5, 2.0));
                    let refs = (buf(copy, &dense), buf(c2, &dense));
                    let (x, y) = (buf(a, &dense), buf(c2, &dense));
                    check_binary(&mut mem, op, dtype, x, y, refs, a, ctx, "out = lhs, dense");
                }
            }
        });
    }

    /// Bytes of the `n` elements of `dtype` at `ptr`.
    fn raw(mem: &HostMemory, dtype: DType, ptr: DevicePtr, n: usize) -> Vec<u8> {
        mem.bytes(ptr, n * dtype.size_in_bytes()).unwrap().to_vec()
    }

    /// Asserts two outputs of `dtype` are identical (NaNs of any payload count as equal).
    fn assert_same(
        mem: &HostMemory,
        dtype: DType,
        a: DevicePtr,
        b: DevicePtr,
        n: usize,
        what: &str,
    ) {
        if dtype.is_float() {
            let (x, y) = (
                mem.load_dense(dtype, a, n).unwrap(),
                mem.load_dense(dtype, b, n).unwrap(),
            );
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                assert!(
                    p.to_bits() == q.to_bits() || p.is_nan() && q.is_nan(),
                    "{what}: element {i} is {p}, not {q}"
                );
            }
        } else {
            assert_eq!(raw(mem, dtype, a, n), raw(mem, dtype, b, n), "{what}");
        }
    }

    #[test]
    fn cast_matches_the_reference_exactly_for_every_pair() {
        let mut specials = vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            0.5,
            -0.5,
            1.5,
            2.5,
            -1.7,
            255.9,
            256.0,
            -1.0,
            3e9,
            -3e9,
            1e20,
            -1e20,
            65_519.0,
            65_520.0,
            1e-7,
            6e-8,
            1.0000001,
        ];
        specials.extend(values(BLOCK + 40, 4, -300.0, 300.0));
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            for src in FLOATS {
                for dst in DType::ALL {
                    let ptr = upload(&mut mem, src, &specials);
                    let n = specials.len();
                    let layouts = [
                        Layout::contiguous(&[n]),
                        Layout::new(vec![n / 3, 3], vec![1, n / 3], 0).unwrap(),
                    ];
                    for layout in layouts {
                        let m = layout.numel();
                        let (mine, theirs) = (fresh(&mut mem, dst, m), fresh(&mut mem, dst, m));
                        let desc = |output| CastDesc {
                            src_dtype: src,
                            dst_dtype: dst,
                            input: StridedBuf {
                                ptr,
                                layout: layout.clone(),
                            },
                            output,
                        };
                        cast(&mut mem, &desc(mine), ctx).unwrap();
                        reference::cast(&mut mem, &desc(theirs)).unwrap();
                        assert_same(&mem, dst, mine, theirs, m, &format!("{src} → {dst}"));
                    }
                }
            }
        });
    }

    #[test]
    fn cast_works_in_place_and_on_large_inputs() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            let n = 2 * SERIAL_ELEMENTS + 9;
            let vals = values(n, 12, -1000.0, 1000.0);
            for (src, dst) in [
                (DType::F32, DType::I32),
                (DType::F16, DType::BF16),
                (DType::F64, DType::I64),
                (DType::F32, DType::F32),
                (DType::F32, DType::F16),
                (DType::BF16, DType::F32),
            ] {
                let (x, copy) = (upload(&mut mem, src, &vals), upload(&mut mem, src, &vals));
                let theirs = fresh(&mut mem, dst, n);
                let desc = |input, output| CastDesc {
                    src_dtype: src,
                    dst_dtype: dst,
                    input: StridedBuf::contiguous(input, &[n]),
                    output,
                };
                let out = if src.size_in_bytes() == dst.size_in_bytes() {
                    x
                } else {
                    fresh(&mut mem, dst, n)
                };
                cast(&mut mem, &desc(x, out), ctx).unwrap();
                reference::cast(&mut mem, &desc(copy, theirs)).unwrap();
                assert_same(&mem, dst, out, theirs, n, &format!("{src} → {dst}"));
            }
        });
    }

    #[test]
    fn fill_matches_the_reference() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            for dtype in FLOATS {
                for len in [1, 5, BLOCK + 1, 2 * SERIAL_ELEMENTS + 7] {
                    for value in [-0.375, 1.0 / 3.0, 1e10, f64::NAN] {
                        let (mine, theirs) =
                            (fresh(&mut mem, dtype, len), fresh(&mut mem, dtype, len));
                        let desc = |ptr| FillDesc {
                            dtype,
                            ptr,
                            len,
                            value,
                        };
                        fill(&mut mem, &desc(mine), ctx).unwrap();
                        reference::fill(&mut mem, &desc(theirs)).unwrap();
                        assert_same(&mem, dtype, mine, theirs, len, &format!("fill {dtype}"));
                    }
                }
            }
        });
    }

    #[test]
    fn copy_strided_matches_the_reference() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            let (a, b, c) = (5, 7, 2 * SERIAL_ELEMENTS / 35 + 3);
            let n = a * b * c;
            let cases = [
                // Permuted source into a dense destination.
                (
                    Layout::new(vec![c, a, b], vec![1, b * c, c], 0).unwrap(),
                    Layout::contiguous(&[c, a, b]),
                ),
                // Dense rows into a narrowed, offset destination.
                (
                    Layout::contiguous(&[a, b, c]),
                    Layout::new(vec![a, b, c], vec![b * (c + 4), c + 4, 1], 2).unwrap(),
                ),
                // Strided to strided.
                (
                    Layout::new(vec![a, b, c], vec![1, a, a * b], 0).unwrap(),
                    Layout::new(vec![a, b, c], vec![b * c, 1, b], 0).unwrap(),
                ),
                // A transpose across tile and block edges (250 rows, 259 columns), offset.
                (
                    Layout::new(vec![259, 250], vec![1, 259], 7).unwrap(),
                    Layout::contiguous(&[259, 250]),
                ),
                // Transposed planes read from one broadcast source plane.
                (
                    Layout::new(vec![3, 20, 30], vec![0, 1, 20], 0).unwrap(),
                    Layout::contiguous(&[3, 20, 30]),
                ),
            ];
            for dtype in FLOATS {
                let src = upload(&mut mem, dtype, &values(n, 13, -5.0, 5.0));
                for (ls, ld) in cases.iter() {
                    let span = ld.span_elements().unwrap();
                    let (mine, theirs) =
                        (fresh(&mut mem, dtype, span), fresh(&mut mem, dtype, span));
                    let desc = |ptr| CopyDesc {
                        dtype,
                        src: StridedBuf {
                            ptr: src,
                            layout: ls.clone(),
                        },
                        dst: StridedBuf {
                            ptr,
                            layout: ld.clone(),
                        },
                    };
                    copy_strided(&mut mem, &desc(mine), ctx).unwrap();
                    reference::copy_strided(&mut mem, &desc(theirs)).unwrap();
                    // The whole destination buffer: untouched (poison) elements must agree too.
                    assert_eq!(
                        raw(&mem, dtype, mine, span),
                        raw(&mem, dtype, theirs, span),
                        "copy {dtype} {ls:?} → {ld:?}"
                    );
                }
                // Exactly in place: nothing changes.
                let before = raw(&mem, dtype, src, n);
                let dense = StridedBuf::contiguous(src, &[n]);
                let desc = CopyDesc {
                    dtype,
                    src: dense.clone(),
                    dst: dense,
                };
                copy_strided(&mut mem, &desc, ctx).unwrap();
                assert_eq!(raw(&mem, dtype, src, n), before);
            }
        });
    }

    #[test]
    fn random_is_bit_identical_to_the_reference() {
        for_threads(|ctx| {
            let mut mem = HostMemory::default();
            for dtype in FLOATS {
                for len in [1, 101, 2 * SERIAL_ELEMENTS + 3] {
                    for distribution in [
                        Distribution::Uniform {
                            low: -1.0,
                            high: 3.0,
                        },
                        Distribution::Normal {
                            mean: 0.5,
                            std: 2.0,
                        },
                    ] {
                        let (mine, theirs) =
                            (fresh(&mut mem, dtype, len), fresh(&mut mem, dtype, len));
                        let desc = |ptr| RandomDesc {
                            dtype,
                            ptr,
                            len,
                            distribution,
                            seed: 42,
                        };
                        random(&mut mem, &desc(mine), ctx).unwrap();
                        reference::random(&mut mem, &desc(theirs)).unwrap();
                        assert_eq!(
                            raw(&mem, dtype, mine, len),
                            raw(&mem, dtype, theirs, len),
                            "random {dtype} {distribution:?}"
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn dims_merge_and_walk_runs() {
        // A [2, 3, 4] walk whose lhs is dense and rhs broadcasts the middle dim.
        let dims = Dims::new(&[2, 1, 3, 4], [&[12, 12, 4, 1], &[4, 0, 0, 1]]);
        assert_eq!(dims.shape, [2, 3, 4]);
        let mut seen = Vec::new();
        dims.runs(5..19, |at, pos, len| seen.push((at, pos, len)));
        assert_eq!(
            seen,
            [
                (5, [5, 1], 3),
                (8, [8, 0], 4),
                (12, [12, 4], 4),
                (16, [16, 4], 3)
            ]
        );
        // Fully dense operands merge into one dim.
        let dense = Dims::new(&[3, 5, 7], [&[35, 7, 1], &[35, 7, 1]]);
        assert_eq!(dense.inner(), (105, [1, 1]));
        // A scalar-like view of rank 0.
        let scalar = Dims::<2>::new(&[], [&[], &[]]);
        assert_eq!(scalar.numel(), 1);
    }
}
