//! Casts between every dtype on the CPU, blocks widened through the compute type.

use super::*;
use crate::backends::cpu::cost::TASK_ELEMENTS;

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
    for_chunks(out.len(), ctx.threads, TASK_ELEMENTS, |range| {
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

impl OpImpl<CastDesc> for CpuBackend {
    fn op(&self, desc: &CastDesc) -> Result<()> {
        let Ok(acc) = desc.accesses() else {
            return self.scalar.cast(desc);
        };
        let aligned = blas::aligned(desc.src_dtype, &[acc.regions[0].ptr.0])
            && blas::aligned(desc.dst_dtype, &[acc.regions[1].ptr.0]);
        if self.simd == SimdLevel::Scalar || !aligned {
            return self.scalar.cast(desc);
        }
        self.kernel(acc, |mem, ctx| cast(mem, desc, ctx))
    }
}
