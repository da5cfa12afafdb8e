//! Elementwise descriptors: unary, binary, fill, cast, strided copy and random fill.

use super::{check_shapes, dense_bytes, BinaryOp, StridedBuf, UnaryOp, Value};
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::Layout;

/// Elementwise unary op from a strided input to a contiguous output of the same shape and dtype.
/// The output may be the input itself when the input is contiguous.
#[derive(Clone, Debug, PartialEq)]
pub struct UnaryDesc {
    /// The op.
    pub op: UnaryOp,
    /// Element type of input and output.
    pub dtype: DType,
    /// Input view.
    pub input: StridedBuf,
    /// Output pointer (contiguous, the input's shape).
    pub output: DevicePtr,
}

impl UnaryDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "unary";
        let mut acc = Accesses::new(op, InPlace::ExactAllowed);
        self.input
            .add_region(&mut acc, "input", self.dtype, Access::Read)?;
        let bytes = dense_bytes(op, self.input.layout.shape(), self.dtype)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// Elementwise binary op. `lhs` and `rhs` have the output's shape; broadcasting is expressed by
/// stride-0 dims in their layouts. `rhs` may instead be a scalar ([`Value::Scalar`]), rounded to
/// `dtype` once, so an op with a constant needs no allocation and no fill. The output is contiguous
/// and may be `lhs` or `rhs` itself when that operand is contiguous and not broadcast. Errors:
/// `ShapeMismatch` for operands of different shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct BinaryDesc {
    /// The op.
    pub op: BinaryOp,
    /// Element type of every operand.
    pub dtype: DType,
    /// Left operand view.
    pub lhs: StridedBuf,
    /// Right operand: a view or a scalar.
    pub rhs: Value,
    /// Output pointer.
    pub output: DevicePtr,
}

impl BinaryDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "binary";
        let shape = self.lhs.layout.shape();
        check_shapes(op, shape, &[("rhs", &self.rhs)])?;
        let mut acc = Accesses::new(op, InPlace::ExactAllowed);
        self.lhs
            .add_region(&mut acc, "lhs", self.dtype, Access::Read)?;
        self.rhs.add_region(&mut acc, "rhs", self.dtype)?;
        let bytes = dense_bytes(op, shape, self.dtype)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// Which tensor a unary op's backward reads besides the gradient: its input `x` or its output `y`
/// (as PyTorch saves them: the output where the derivative is cheapest from it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedTensor {
    /// The op's input.
    Input,
    /// The op's output.
    Output,
}

impl UnaryOp {
    /// The tensor [`UnaryBackwardDesc`] reads for this op: the output `y` for `exp`, `sqrt`,
    /// `rsqrt`, `recip`, `relu`, `sigmoid` and `tanh`; the input `x` for the others.
    pub const fn saved(self) -> SavedTensor {
        match self {
            UnaryOp::Exp
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Recip
            | UnaryOp::Relu
            | UnaryOp::Sigmoid
            | UnaryOp::Tanh => SavedTensor::Output,
            _ => SavedTensor::Input,
        }
    }
}

/// The backward of an elementwise unary op: `output[i] = grad[i] · op'(x[i])`, computed from
/// `saved`, which is the op's input `x` or its output `y` as [`UnaryOp::saved`] says (for example
/// `grad · y` for `exp`, `grad · (y > 0)` for `relu`, `grad · cos x` for `sin`). `saved` and `grad`
/// are views of the output's shape (broadcast by stride-0 dims); the output is contiguous and may
/// be either of them when that one is contiguous and not broadcast. Floating dtypes. Errors:
/// `ShapeMismatch` for views of different shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct UnaryBackwardDesc {
    /// The forward op.
    pub op: UnaryOp,
    /// Element type of every operand.
    pub dtype: DType,
    /// The op's input or output, as [`UnaryOp::saved`] says.
    pub saved: StridedBuf,
    /// The gradient of the op's output.
    pub grad: StridedBuf,
    /// The gradient of the op's input (contiguous).
    pub output: DevicePtr,
}

impl UnaryBackwardDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "unary_backward";
        let shape = self.saved.layout.shape();
        if self.grad.layout.shape() != shape {
            return Err(BackendError::shape(
                op,
                format!(
                    "grad {:?} must have the shape of the saved tensor {shape:?}",
                    self.grad.layout.shape()
                ),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::ExactAllowed);
        self.saved
            .add_region(&mut acc, "saved", self.dtype, Access::Read)?;
        self.grad
            .add_region(&mut acc, "grad", self.dtype, Access::Read)?;
        let bytes = dense_bytes(op, shape, self.dtype)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// Sets `len` contiguous elements to `value` (converted to `dtype` with Rust `as` semantics).
#[derive(Clone, Debug, PartialEq)]
pub struct FillDesc {
    /// Element type.
    pub dtype: DType,
    /// First element.
    pub ptr: DevicePtr,
    /// Elements.
    pub len: usize,
    /// The value.
    pub value: f64,
}

impl FillDesc {
    /// Validates and lists the regions (any dtype).
    pub fn accesses(&self) -> Result<Accesses> {
        let mut acc = Accesses::new("fill", InPlace::Forbidden);
        acc.push(
            "output",
            self.ptr,
            dense_bytes("fill", &[self.len], self.dtype)?,
            Access::Write,
            true,
        );
        Ok(acc)
    }
}

/// Converts a strided input of one dtype into a contiguous output of another. Float → int truncates
/// toward zero and saturates (NaN → 0); int → int wraps (two's complement); any → float rounds to nearest.
#[derive(Clone, Debug, PartialEq)]
pub struct CastDesc {
    /// Input dtype.
    pub src_dtype: DType,
    /// Output dtype.
    pub dst_dtype: DType,
    /// Input view.
    pub input: StridedBuf,
    /// Output pointer.
    pub output: DevicePtr,
}

impl CastDesc {
    /// Validates and lists the regions (any dtypes).
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "cast";
        let mut acc = Accesses::new(op, InPlace::ExactAllowed);
        self.input
            .add_region(&mut acc, "input", self.src_dtype, Access::Read)?;
        let bytes = dense_bytes(op, self.input.layout.shape(), self.dst_dtype)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// Copies one strided view into another of the same shape and dtype (any dtype). The destination view
/// must not map two elements to one address.
#[derive(Clone, Debug, PartialEq)]
pub struct CopyDesc {
    /// Element type.
    pub dtype: DType,
    /// Source view.
    pub src: StridedBuf,
    /// Destination view.
    pub dst: StridedBuf,
}

impl CopyDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "copy_strided";
        if self.src.layout.shape() != self.dst.layout.shape() {
            return Err(BackendError::shape(
                op,
                format!(
                    "source {:?} and destination {:?} differ",
                    self.src.layout.shape(),
                    self.dst.layout.shape()
                ),
            ));
        }
        if !is_injective(&self.dst.layout) {
            return Err(BackendError::Aliasing {
                op,
                details: format!(
                    "destination view (shape {:?}, strides {:?}) writes several elements to one address",
                    self.dst.layout.shape(),
                    self.dst.layout.strides()
                ),
            });
        }
        let mut acc = Accesses::new(op, InPlace::ExactAllowed);
        self.src
            .add_region(&mut acc, "src", self.dtype, Access::Read)?;
        self.dst
            .add_region(&mut acc, "dst", self.dtype, Access::Write)?;
        Ok(acc)
    }
}

/// True when no two elements of the view share an address (checked by the sufficient rule: sorted by
/// stride, each stride clears the extent of the smaller dims).
pub fn is_injective(layout: &Layout) -> bool {
    if layout.numel() <= 1 {
        return true;
    }
    let mut dims: Vec<(usize, usize)> = layout
        .shape()
        .iter()
        .zip(layout.strides())
        .filter(|(&d, _)| d > 1)
        .map(|(&d, &s)| (s, d))
        .collect();
    dims.sort_unstable();
    let mut extent = 1usize;
    for (s, d) in dims {
        if s < extent {
            return false;
        }
        extent = s.saturating_mul(d - 1).saturating_add(extent);
    }
    true
}

/// A distribution for [`RandomDesc`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f64,
        /// Upper bound.
        high: f64,
    },
    /// Normal with this mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation (≥ 0).
        std: f64,
    },
}

/// Fills `len` contiguous elements with random values from the crate's counter-based generator
/// ([`crate::rng`]): element `i` depends only on `seed` and `i`, so every backend produces the same
/// numbers for the same seed (up to the dtype's rounding).
#[derive(Clone, Debug, PartialEq)]
pub struct RandomDesc {
    /// Element type (floating).
    pub dtype: DType,
    /// First element.
    pub ptr: DevicePtr,
    /// Elements.
    pub len: usize,
    /// The distribution.
    pub distribution: Distribution,
    /// The seed.
    pub seed: u64,
}

impl RandomDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "random";
        let ok = match self.distribution {
            Distribution::Uniform { low, high } => {
                low.is_finite() && high.is_finite() && low <= high
            }
            Distribution::Normal { mean, std } => mean.is_finite() && std.is_finite() && std >= 0.0,
        };
        if !ok {
            return Err(BackendError::invalid(
                op,
                format!("bad distribution parameters {:?}", self.distribution),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push_dense("output", self.ptr, &[self.len], self.dtype, Access::Write)?;
        Ok(acc)
    }
}

/// Dropout from the crate's counter-based stream ([`crate::rng`]): element `i` of the dense input is
/// kept, times `1 / (1 − p)`, when `uniform(seed, i) ≥ p`, and zeroed otherwise. The mask depends
/// only on `seed`, `p` and `i`, so the backward is the same op on the output's gradient with the
/// same seed: nothing is stored, and every backend keeps the same elements (the test compares the
/// stream's 53-bit integers, never a rounded float). `p = 1` zeroes everything. The output may be
/// the input itself. Floating dtypes. Errors: `InvalidArgument` for `p` outside `[0, 1]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DropoutDesc {
    /// Element type.
    pub dtype: DType,
    /// First input element (dense).
    pub input: DevicePtr,
    /// First output element (dense).
    pub output: DevicePtr,
    /// Elements.
    pub len: usize,
    /// The probability of zeroing an element.
    pub p: f64,
    /// The stream.
    pub seed: u64,
}

impl DropoutDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "dropout";
        if !(0.0..=1.0).contains(&self.p) {
            return Err(BackendError::invalid(
                op,
                format!("p = {} must lie in [0, 1]", self.p),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::ExactAllowed);
        acc.push_dense("input", self.input, &[self.len], self.dtype, Access::Read)?;
        acc.push_dense(
            "output",
            self.output,
            &[self.len],
            self.dtype,
            Access::Write,
        )?;
        Ok(acc)
    }

    /// Element `i` is kept when the top 53 bits of the stream's `bits(seed, i)` are at least this
    /// (`⌈p · 2⁵³⌉`, exact: `p · 2⁵³` is a power-of-two scaling).
    pub fn threshold(&self) -> u64 {
        (self.p * (1u64 << 53) as f64).ceil() as u64
    }

    /// The factor of a kept element, `1 / (1 − p)` (0 for `p = 1`, which keeps nothing).
    pub fn scale(&self) -> f64 {
        if self.p < 1.0 {
            1.0 / (1.0 - self.p)
        } else {
            0.0
        }
    }
}

crate::compute::op::op_desc!(DropoutDesc => dropout, dtype: dtype, {
    dense "input": input,
    dense "output": output,
});

crate::compute::op::op_desc!(UnaryDesc => unary, dtype: dtype, {
    strided "input": input,
    dense "output": output,
});

crate::compute::op::op_desc!(BinaryDesc => binary, dtype: dtype, {
    strided "lhs": lhs,
    value "rhs": rhs,
    dense "output": output,
});

crate::compute::op::op_desc!(UnaryBackwardDesc => unary_backward, dtype: dtype, {
    strided "saved": saved,
    strided "grad": grad,
    dense "output": output,
});

crate::compute::op::op_desc!(FillDesc => fill, dtype: dtype, {
    dense "output": ptr,
});

crate::compute::op::op_desc!(CastDesc => cast, dtype: src_dtype, {
    strided "input": input,
    dense "output": output as |d: &CastDesc| d.dst_dtype,
});

crate::compute::op::op_desc!(CopyDesc => copy_strided, dtype: dtype, {
    strided "src": src,
    strided "dst": dst,
});

crate::compute::op::op_desc!(RandomDesc => random, dtype: dtype, {
    dense "output": ptr,
});
