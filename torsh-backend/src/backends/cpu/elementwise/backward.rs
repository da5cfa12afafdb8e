//! The backward of the unary ops on the CPU: `grad · op'(v)` from the saved input or output `v`
//! and the gradient, walked as a binary op's two operands (broadcast and in-place runs
//! included), threaded. f32, f16 and bf16 compute in f32 with the vectorised `vmath` functions
//! (`exp`, `erf`, `tanh`, `sigmoid`), so the loops vectorise; `sin` and `cos` and every f64
//! derivative are computed in f64 with the reference's formulas, rounded once.

use super::binary::Zip;
use super::*;
use crate::compute::UnaryBackwardDesc;
use std::f32::consts::FRAC_2_SQRT_PI;

/// `output[i] = grad[i] · op'(saved[i])`.
pub(crate) fn unary_backward(mem: &mut HostMemory, d: &UnaryBackwardDesc, ctx: Ctx) -> Result<()> {
    match d.dtype {
        DType::F32 => backward_t::<f32>(mem, d, ctx),
        DType::F64 => backward_t::<f64>(mem, d, ctx),
        DType::F16 => backward_t::<f16>(mem, d, ctx),
        DType::BF16 => backward_t::<bf16>(mem, d, ctx),
        _ => reference::unary_backward(mem, d),
    }
}

/// [`unary_backward`] for element type `T`.
fn backward_t<T: Lanes>(mem: &mut HostMemory, d: &UnaryBackwardDesc, ctx: Ctx) -> Result<()> {
    let grad = Value::Tensor(d.grad.clone());
    let Some(zip) = Zip::<T>::of(mem, "unary_backward", &d.saved, &grad, d.output)? else {
        return reference::unary_backward(mem, d);
    };
    let op = d.op;
    if std::any::TypeId::of::<T::Acc>() != std::any::TypeId::of::<f32>() {
        in_f64(zip, ctx, op);
        return Ok(());
    }
    // Each arm its own closure, so that each loop is compiled (and vectorised) around its formula.
    match op {
        UnaryOp::Neg => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |_, g| -g,
        ),
        UnaryOp::Abs => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |v, g| {
                if v > 0.0 {
                    g
                } else if v < 0.0 {
                    -g
                } else {
                    0.0 * g
                }
            },
        ),
        UnaryOp::Exp => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |y, g| g * y,
        ),
        UnaryOp::Log => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |v, g| g / v,
        ),
        UnaryOp::Sqrt => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |y, g| g / (2.0 * y),
        ),
        UnaryOp::Rsqrt => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |y, g| -0.5 * g * y * y * y,
        ),
        UnaryOp::Recip => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |y, g| -g * y * y,
        ),
        UnaryOp::Square => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |v, g| 2.0 * g * v,
        ),
        UnaryOp::Relu => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |y, g| if y <= 0.0 { 0.0 } else { g },
        ),
        UnaryOp::Gelu => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |v, g| {
                // Φ(v) + v·φ(v), φ(v) = e^(−v²/2) / √(2π).
                let (cdf, pdf) = vmath::normal_cdf_pdf_f32(v);
                g * (cdf + v * pdf)
            },
        ),
        UnaryOp::GeluTanh => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |v, g| {
                const C: f32 = 0.797_884_6; // √(2/π)
                let t = vmath::tanh_f32(C * (v + 0.044715 * v * v * v));
                let du = C * (1.0 + 3.0 * 0.044715 * v * v);
                g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du)
            },
        ),
        UnaryOp::Sigmoid => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |y, g| g * y * (1.0 - y),
        ),
        UnaryOp::Silu => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |v, g| {
                let s = vmath::sigmoid_f32(v);
                g * (s + v * s * (1.0 - s))
            },
        ),
        UnaryOp::Tanh => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |y, g| g * (1.0 - y * y),
        ),
        UnaryOp::Erf => in_f32::<T>(
            zip,
            ctx,
            #[inline(always)]
            |v, g| g * FRAC_2_SQRT_PI * vmath::exp_f32(-v * v),
        ),
        UnaryOp::Sin | UnaryOp::Cos => in_f64(zip, ctx, op),
    }
    Ok(())
}

/// `zip` with the derivative `f(v, g)` in f32 (the compute type of f32, f16 and bf16).
#[inline(always)]
fn in_f32<T: Lanes>(zip: Zip<T>, ctx: Ctx, f: impl Fn(f32, f32) -> f32 + Copy + Send + Sync) {
    zip.run(
        ctx,
        #[inline(always)]
        move |v, g| <T::Acc as Real>::from_f64(f(v.to_f64() as f32, g.to_f64() as f32) as f64),
    );
}

/// `zip` with the reference's derivative of `op` in f64, rounded once to the compute type.
fn in_f64<T: Lanes>(zip: Zip<T>, ctx: Ctx, op: UnaryOp) {
    zip.run(ctx, move |v, g| {
        <T::Acc as Real>::from_f64(math::unary_grad(op, v.to_f64(), g.to_f64()))
    });
}

impl OpImpl<UnaryBackwardDesc> for CpuBackend {
    fn op(&self, desc: &UnaryBackwardDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.unary_backward(desc);
        };
        self.kernel(acc, |mem, ctx| unary_backward(mem, desc, ctx))
    }
}
