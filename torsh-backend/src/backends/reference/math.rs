//! Scalar definitions of the elementwise ops in f64: the meaning every backend must match.

use crate::compute::{BinaryOp, UnaryOp};

/// `op(x)` in f64.
pub fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Square => x * x,
        UnaryOp::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Erf => libm::erf(x),
    }
}

/// The gradient of `op`'s input, `g · op'(x)`, in f64, from `v`: the op's input `x` or its
/// output `y` as [`UnaryOp::saved`] says. At points where the op has no derivative the value is
/// PyTorch's: `abs'(0) = 0`, and `relu`'s gradient is 0 where `y ≤ 0` and `g` elsewhere (a NaN
/// output passes `g`).
pub fn unary_grad(op: UnaryOp, v: f64, g: f64) -> f64 {
    use std::f64::consts::{FRAC_2_SQRT_PI, PI, SQRT_2};
    match op {
        UnaryOp::Neg => -g,
        UnaryOp::Abs => {
            if v > 0.0 {
                g
            } else if v < 0.0 {
                -g
            } else {
                0.0 * g
            }
        }
        UnaryOp::Exp => g * v,
        UnaryOp::Log => g / v,
        UnaryOp::Sqrt => g / (2.0 * v),
        UnaryOp::Rsqrt => -0.5 * g * v * v * v,
        UnaryOp::Recip => -g * v * v,
        UnaryOp::Square => 2.0 * g * v,
        UnaryOp::Relu => {
            if v <= 0.0 {
                0.0
            } else {
                g
            }
        }
        UnaryOp::Gelu => {
            let cdf = 0.5 * (1.0 + libm::erf(v / SQRT_2));
            let pdf = (-0.5 * v * v).exp() / (2.0 * PI).sqrt();
            g * (cdf + v * pdf)
        }
        UnaryOp::GeluTanh => {
            let c = (2.0 / PI).sqrt();
            let t = (c * (v + 0.044715 * v * v * v)).tanh();
            let du = c * (1.0 + 3.0 * 0.044715 * v * v);
            g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du)
        }
        UnaryOp::Sigmoid => g * v * (1.0 - v),
        UnaryOp::Silu => {
            let s = sigmoid(v);
            g * (s + v * s * (1.0 - s))
        }
        UnaryOp::Tanh => g * (1.0 - v * v),
        UnaryOp::Sin => g * v.cos(),
        UnaryOp::Cos => -g * v.sin(),
        UnaryOp::Erf => g * FRAC_2_SQRT_PI * (-v * v).exp(),
    }
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `op(a, b)` in f64. `Maximum` and `Minimum` return NaN when either operand is NaN.
pub fn binary(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        BinaryOp::Minimum => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        BinaryOp::Pow => a.powf(b),
    }
}
