//! The backward of the unary ops on the CPU: `grad · op'(v)` from the saved input or output `v`
//! and the gradient, walked as a binary op's two operands (broadcast and in-place runs
//! included). Each element's derivative is computed in f64 with the reference's formulas, then
//! rounded to the compute type (f64 or f32) and stored: f32 and f64 answers are the reference's
//! exactly. The loop is threaded but not vectorised.

use super::binary::Zip;
use super::*;
use crate::compute::UnaryBackwardDesc;

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
    zip.run(ctx, move |v, g| {
        <T::Acc as Real>::from_f64(math::unary_grad(op, v.to_f64(), g.to_f64()))
    });
    Ok(())
}

impl OpImpl<UnaryBackwardDesc> for CpuBackend {
    fn op(&self, desc: &UnaryBackwardDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.unary_backward(desc);
        };
        self.kernel(acc, |mem, ctx| unary_backward(mem, desc, ctx))
    }
}
