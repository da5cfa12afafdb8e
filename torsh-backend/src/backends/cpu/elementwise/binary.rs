//! Binary ops on the CPU, broadcasting: dense, scalar and strided runs of each operand.

use super::*;
use crate::backends::cpu::cost::TASK_ELEMENTS;
use crate::backends::cpu::stream::{worth_streaming, Streamer, STREAM_RUN_BYTES};

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
pub(super) enum Operand<T> {
    /// A view of memory.
    View {
        /// From its first element to its last.
        span: Span<T>,
        /// True when the output is this operand's memory (then it is dense).
        is_output: bool,
    },
    /// One value for every element (a scalar `rhs`).
    Const(T),
}

impl<T> Operand<T> {
    /// Whether the output is this operand's memory.
    fn is_output(&self) -> bool {
        matches!(
            self,
            Operand::View {
                is_output: true,
                ..
            }
        )
    }
}

/// [`binary`] for element type `T`.
fn binary_t<T: Lanes>(mem: &mut HostMemory, d: &BinaryDesc, ctx: Ctx) -> Result<()>
where
    T::Acc: Pow,
{
    let Some(Zip { dims, a, b, out }) = Zip::<T>::of(mem, "binary", &d.lhs, &d.rhs, d.output)?
    else {
        // The checks never let an output overlap a non-dense input; the reference copes if they did.
        return reference::binary(mem, d);
    };
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

/// Two operands walked together into a dense output: the walk over their merged dims, each
/// operand, and the output.
pub(super) struct Zip<T> {
    pub(super) dims: Dims<2>,
    pub(super) a: Operand<T>,
    pub(super) b: Operand<T>,
    pub(super) out: Span<T>,
}

impl<T: Lanes> Zip<T> {
    /// The operands `lhs` and `rhs` (a view, or a scalar rounded to `T`) and the dense `output`
    /// of `lhs`'s shape; `None` when the output is a non-dense input's memory (the descriptors'
    /// checks never allow it).
    pub(super) fn of(
        mem: &mut HostMemory,
        op: &'static str,
        lhs: &StridedBuf,
        rhs: &Value,
        output: DevicePtr,
    ) -> Result<Option<Zip<T>>> {
        let shape = lhs.layout.shape();
        let lhs_view = View::<T>::of(mem, op, lhs)?;
        let out = Span::<T>::of(mem, op, output, lhs_view.numel())?;
        let mut overlapped = false;
        let mut operand = |v: &View<T>| {
            let is_output = out.same_as(&v.span());
            overlapped |= is_output && !v.is_contiguous();
            Operand::View {
                span: v.span(),
                is_output,
            }
        };
        let a = operand(&lhs_view);
        let (b, rhs_strides) = match rhs {
            Value::Tensor(buf) => (
                operand(&View::<T>::of(mem, op, buf)?),
                buf.layout.strides().to_vec(),
            ),
            &Value::Scalar(s) => (Operand::Const(T::from_f64(s)), vec![0; shape.len()]),
        };
        if overlapped {
            return Ok(None);
        }
        let dims = Dims::new(shape, [lhs.layout.strides(), &rhs_strides[..]]);
        Ok(Some(Zip { dims, a, b, out }))
    }

    /// `out[i] = f(a[i], b[i])`, threaded.
    pub(super) fn run(&self, ctx: Ctx, f: impl Fn(T::Acc, T::Acc) -> T::Acc + Copy + Send + Sync) {
        zip(&self.dims, self.a, self.b, self.out, ctx, f)
    }
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

/// `out[i] = f(a[i], b[i])` over the walk `dims` (operand 0 `a`, operand 1 `b`), threaded; an output
/// of [`worth_streaming`] size that is neither operand, walked in runs of [`STREAM_RUN_BYTES`] or
/// more, is written with streaming stores.
fn zip<T: Lanes>(
    dims: &Dims<2>,
    a: Operand<T>,
    b: Operand<T>,
    out: Span<T>,
    ctx: Ctx,
    f: impl Fn(T::Acc, T::Acc) -> T::Acc + Copy + Send + Sync,
) {
    let (inner, [sa, sb]) = dims.inner();
    let elem = std::mem::size_of::<T>();
    let stream = !a.is_output()
        && !b.is_output()
        && inner * elem >= STREAM_RUN_BYTES
        && worth_streaming(out.len() * elem);
    for_chunks(dims.numel(), ctx.threads, TASK_ELEMENTS, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                // Made on a run's first use: the direct loops of f32 and f64 never need them,
                // and zeroing them costs more than a short op's whole work.
                let mut bufs = None;
                let mut streamer = stream.then(|| {
                    (
                        Streamer::new(),
                        [<T as bytemuck::Zeroable>::zeroed(); BLOCK],
                    )
                });
                dims.runs(
                    range,
                    #[inline(always)]
                    |at, [pa, pb], len| {
                        let (ra, rb) = (Run::of(a, pa, sa), Run::of(b, pb, sb));
                        let r = at..at + len;
                        let streamed = streamer.as_mut().map(|(s, block)| (s, &mut block[..]));
                        zip_run(ra, rb, out, r, &mut bufs, streamed, f);
                    },
                );
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
    /// One element of memory, repeated.
    Scalar(Span<T>, usize),
    /// One value, repeated.
    Splat(T),
    /// Elements at this position and stride.
    Strided(Span<T>, usize, usize),
}

impl<T: Lanes> Run<T> {
    /// Operand `o` read from element `pos` with stride `stride`.
    #[inline(always)]
    fn of(o: Operand<T>, pos: usize, stride: usize) -> Run<T> {
        match (o, stride) {
            (Operand::Const(v), _) => Run::Splat(v),
            (
                Operand::View {
                    is_output: true, ..
                },
                _,
            ) => Run::Output,
            (Operand::View { span, .. }, 0) => Run::Scalar(span, pos),
            (Operand::View { span, .. }, 1) => Run::Dense(span, pos),
            (Operand::View { span, .. }, s) => Run::Strided(span, pos, s),
        }
    }

    /// The repeated value of a [`Run::Scalar`] or [`Run::Splat`], widened; `None` for other runs.
    ///
    /// # Safety
    /// No task writes the element read while this runs.
    #[inline(always)]
    unsafe fn splat(self) -> Option<T::Acc> {
        match self {
            Run::Scalar(span, pos) => Some(span.slice(pos..pos + 1)[0].widen()),
            Run::Splat(v) => Some(v.widen()),
            _ => None,
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
            Run::Splat(v) => buf.fill(v.widen()),
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
            Run::Splat(v) => Run::Splat(v),
            Run::Strided(span, pos, s) => Run::Strided(span, pos + k * s, s),
        }
    }
}

/// The two scratch blocks a binary op's task widens its operands into.
type Scratch<A> = ([A; BLOCK], [A; BLOCK]);

/// One run of [`zip`]: output elements `r` from runs `a` and `b`. Dense, scalar and in-place runs of
/// f32 and f64 loop directly; everything else goes through the scratch blocks `bufs`, made (zeroed)
/// on first use. With a streamer and its block buffer (never when an operand is the output), the
/// output is written by it.
#[inline(always)]
fn zip_run<T: Lanes>(
    a: Run<T>,
    b: Run<T>,
    out: Span<T>,
    r: Range<usize>,
    bufs: &mut Option<Scratch<T::Acc>>,
    streamer: Option<(&mut Streamer, &mut [T])>,
    f: impl Fn(T::Acc, T::Acc) -> T::Acc,
) {
    if let Some((streamer, narrow)) = streamer {
        // SAFETY: this task owns output elements `r` and makes no other slice of them; no operand
        // is the output, and inputs never overlap it.
        let ys = unsafe { out.slice_mut(r.clone()) };
        streamer.blocks(
            ys,
            narrow,
            #[inline(always)]
            |k, ys| {
                // SAFETY: as above; no task writes the inputs.
                if T::DIRECT && unsafe { zip_inputs(a.skip(k), b.skip(k), ys, &f) } {
                    return;
                }
                let n = ys.len();
                let bufs = bufs.get_or_insert_with(|| (scratch(), scratch()));
                let (ba, bb) = (&mut bufs.0[..n], &mut bufs.1[..n]);
                let block = r.start + k..r.start + k + n;
                // SAFETY: as above; no task writes the inputs.
                unsafe {
                    a.skip(k).read(out, block.clone(), ba);
                    b.skip(k).read(out, block, bb);
                }
                for (x, &y) in ba.iter_mut().zip(bb.iter()) {
                    *x = f(*x, y);
                }
                T::store(ba, ys);
            },
        );
        return;
    }
    if T::DIRECT && zip_direct(a, b, out, r.clone(), &f) {
        return;
    }
    let bufs = bufs.get_or_insert_with(|| (scratch(), scratch()));
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
    // SAFETY: this task owns output elements `r`, and makes no other slice of them; inputs other
    // than the output itself never overlap the output, so nothing writes them.
    unsafe {
        match (a, b, a.splat(), b.splat()) {
            (Run::Output, Run::Dense(sb, pb), ..) => {
                update(out.slice_mut(r), sb.slice(pb..pb + len), f)
            }
            (Run::Dense(sa, pa), Run::Output, ..) => {
                update(out.slice_mut(r), sa.slice(pa..pa + len), |o, x| f(x, o))
            }
            (Run::Output, _, _, Some(y)) => update1(out.slice_mut(r), |o| f(o, y)),
            (_, Run::Output, Some(x), _) => update1(out.slice_mut(r), |o| f(x, o)),
            (Run::Output, Run::Output, ..) => update1(out.slice_mut(r), |o| f(o, o)),
            (Run::Output, ..) | (_, Run::Output, ..) => false,
            _ => zip_inputs(a, b, out.slice_mut(r), f),
        }
    }
}

/// `ys[i] = f(a[i], b[i])` for f32 and f64 when neither run is the output and one is dense, the
/// other dense or repeated; false for the combinations (and types) this does not handle.
///
/// # Safety
/// No task writes the elements the runs read while this runs.
#[inline(always)]
unsafe fn zip_inputs<T: Lanes>(
    a: Run<T>,
    b: Run<T>,
    ys: &mut [T],
    f: &impl Fn(T::Acc, T::Acc) -> T::Acc,
) -> bool {
    let len = ys.len();
    // SAFETY: the caller's.
    unsafe {
        match (a, b, a.splat(), b.splat()) {
            (Run::Dense(sa, pa), Run::Dense(sb, pb), ..) => {
                map2(sa.slice(pa..pa + len), sb.slice(pb..pb + len), ys, f)
            }
            (Run::Dense(sa, pa), _, _, Some(y)) => map1(sa.slice(pa..pa + len), ys, |x| f(x, y)),
            (_, Run::Dense(sb, pb), Some(x), _) => map1(sb.slice(pb..pb + len), ys, |y| f(x, y)),
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

impl OpImpl<BinaryDesc> for CpuBackend {
    fn op(&self, desc: &BinaryDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.binary(desc);
        };
        self.kernel(acc, |mem, ctx| binary(mem, desc, ctx))
    }
}
