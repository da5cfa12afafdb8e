//! Unary and binary elementwise ops. Binary ops broadcast like NumPy; operands may be any strided view.

use crate::backend::Backend;
use crate::compute::{
    BinaryDesc, BinaryOp, DropoutDesc, SavedTensor, UnaryBackwardDesc, UnaryDesc, UnaryOp, Value,
};
use crate::error::Result;
use crate::shape::broadcast_shapes;
use crate::tensor::Tensor;

impl Backend {
    /// `op` applied to every element, into a new contiguous tensor. Floating dtypes.
    pub fn unary(&self, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
        let dtype = self.check_operands(op.name(), &[x])?;
        let out = self.empty(x.shape(), dtype)?;
        self.compute().unary(&UnaryDesc {
            op,
            dtype,
            input: x.strided_buf(),
            output: out.data_ptr(),
        })?;
        Ok(out)
    }

    /// The gradient of `op`'s input, `grad · op'(x)`, into a new contiguous tensor, from `saved`:
    /// the op's input `x` or its output `y = op(x)` as [`UnaryOp::saved`] says (`y` for `exp`,
    /// `sqrt`, `rsqrt`, `recip`, `relu`, `sigmoid` and `tanh`, as PyTorch's autograd saves them).
    /// `saved` and `grad` broadcast to their common shape. Floating dtypes. Errors:
    /// `ShapeMismatch` when the shapes do not broadcast, `DTypeMismatch` when the dtypes differ,
    /// `Unsupported` for an integer dtype.
    pub fn unary_backward(&self, op: UnaryOp, saved: &Tensor, grad: &Tensor) -> Result<Tensor> {
        let name = "unary_backward";
        let dtype = self.check_operands(name, &[saved, grad])?;
        let shape = broadcast_shapes(name, saved.shape(), grad.shape())?;
        let (saved, grad) = (saved.broadcast_to(&shape)?, grad.broadcast_to(&shape)?);
        let out = self.empty(&shape, dtype)?;
        self.compute().unary_backward(&UnaryBackwardDesc {
            op,
            dtype,
            saved: saved.strided_buf(),
            grad: grad.strided_buf(),
            output: out.data_ptr(),
        })?;
        Ok(out)
    }

    /// Dropout, as `F.dropout` in training: each element zeroed with probability `p`, the others
    /// scaled by `1 / (1 − p)`, into a new contiguous tensor. The mask comes from the crate's
    /// counter-based stream `seed` ([`crate::rng`]) and the element's row-major position, so it is
    /// the same on every backend and is never stored: [`Backend::dropout_backward`] regenerates
    /// it. Floating dtypes. Errors: `InvalidArgument` for `p` outside `[0, 1]`, `Unsupported` for
    /// an integer dtype.
    pub fn dropout(&self, x: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
        self.check_owner("dropout", x)?;
        let x = x.contiguous()?;
        let out = self.empty(x.shape(), x.dtype())?;
        self.compute().dropout(&DropoutDesc {
            dtype: x.dtype(),
            input: x.data_ptr(),
            output: out.data_ptr(),
            len: x.numel(),
            p,
            seed,
        })?;
        Ok(out)
    }

    /// The gradient of [`Backend::dropout`]'s input from `grad`, its output's gradient: the same
    /// mask and scale (the same `p` and `seed`) applied to `grad`. Errors as [`Backend::dropout`].
    pub fn dropout_backward(&self, grad: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
        self.dropout(grad, p, seed)
    }

    /// `op(a, b)` elementwise after broadcasting both to their common shape. `ShapeMismatch` when the
    /// shapes do not broadcast; `DTypeMismatch` when the dtypes differ.
    pub fn binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let dtype = self.check_operands(op.name(), &[a, b])?;
        let shape = broadcast_shapes(op.name(), a.shape(), b.shape())?;
        let (a, b) = (a.broadcast_to(&shape)?, b.broadcast_to(&shape)?);
        let out = self.empty(&shape, dtype)?;
        self.compute().binary(&BinaryDesc {
            op,
            dtype,
            lhs: a.strided_buf(),
            rhs: Value::Tensor(b.strided_buf()),
            output: out.data_ptr(),
        })?;
        Ok(out)
    }

    /// `op(x, scalar)` elementwise, into a new contiguous tensor; the scalar is rounded to `x`'s
    /// dtype first and travels in the op's descriptor, so the output is the only allocation and
    /// the op one launch. Errors as [`Backend::binary`].
    pub fn binary_scalar(&self, op: BinaryOp, x: &Tensor, scalar: f64) -> Result<Tensor> {
        let dtype = self.check_operands(op.name(), &[x])?;
        let out = self.empty(x.shape(), dtype)?;
        self.binary_scalar_into(op, x, scalar, &out)?;
        Ok(out)
    }

    /// `op(x, scalar)` written into `out`, a contiguous tensor of `x`'s shape and dtype that may be
    /// `x` itself. Errors as [`Backend::binary`].
    pub(crate) fn binary_scalar_into(
        &self,
        op: BinaryOp,
        x: &Tensor,
        scalar: f64,
        out: &Tensor,
    ) -> Result<()> {
        self.compute().binary(&BinaryDesc {
            op,
            dtype: x.dtype(),
            lhs: x.strided_buf(),
            rhs: Value::Scalar(scalar),
            output: out.data_ptr(),
        })
    }
}

macro_rules! unary_ops {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Backend {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "`; see [`UnaryOp::", stringify!($op), "`].")]
                pub fn $name(&self, x: &Tensor) -> Result<Tensor> {
                    self.unary(UnaryOp::$op, x)
                }
            )*
        }
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "`; see [`UnaryOp::", stringify!($op), "`].")]
                pub fn $name(&self) -> Result<Tensor> {
                    self.backend().unary(UnaryOp::$op, self)
                }
            )*
        }
    };
}

unary_ops!(
    neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt, recip => Recip,
    square => Square, relu => Relu, gelu => Gelu, gelu_tanh => GeluTanh, sigmoid => Sigmoid,
    silu => Silu, tanh => Tanh, sin => Sin, cos => Cos, erf => Erf,
);

macro_rules! binary_ops {
    ($($name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Backend {
            $(
                #[doc = concat!("Broadcasting elementwise `", stringify!($name), "`; see [`BinaryOp::", stringify!($op), "`].")]
                pub fn $name(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
                    self.binary(BinaryOp::$op, a, b)
                }
            )*
        }
        impl Tensor {
            $(
                #[doc = concat!("Broadcasting elementwise `", stringify!($name), "` with `other`, on this tensor's backend.")]
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.backend().binary(BinaryOp::$op, self, other)
                }

                #[doc = concat!("Elementwise `", stringify!($name), "` with a scalar.")]
                pub fn $scalar(&self, scalar: f64) -> Result<Tensor> {
                    self.backend().binary_scalar(BinaryOp::$op, self, scalar)
                }
            )*
        }
    };
}

binary_ops!(
    add, add_scalar => Add,
    sub, sub_scalar => Sub,
    mul, mul_scalar => Mul,
    div, div_scalar => Div,
    maximum, maximum_scalar => Maximum,
    minimum, minimum_scalar => Minimum,
    pow, pow_scalar => Pow,
);

impl Tensor {
    /// The gradient of `op`'s input from `grad`, the gradient of its output, where this tensor is
    /// what [`UnaryOp::saved`] names: the op's input or its output. See
    /// [`Backend::unary_backward`].
    pub fn unary_backward(&self, op: UnaryOp, grad: &Tensor) -> Result<Tensor> {
        self.backend().unary_backward(op, self, grad)
    }

    /// Dropout with probability `p` from stream `seed`; see [`Backend::dropout`].
    pub fn dropout(&self, p: f64, seed: u64) -> Result<Tensor> {
        self.backend().dropout(self, p, seed)
    }

    /// [`Tensor::unary_backward`] from the op's input `x` (this tensor) whatever the op saves:
    /// the output is recomputed first where the op's backward reads it.
    pub fn unary_backward_from_input(&self, op: UnaryOp, grad: &Tensor) -> Result<Tensor> {
        match op.saved() {
            SavedTensor::Input => self.unary_backward(op, grad),
            SavedTensor::Output => self.backend().unary(op, self)?.unary_backward(op, grad),
        }
    }
}
