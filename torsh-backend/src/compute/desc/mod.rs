//! Op descriptors: the arguments of each [`crate::ComputeBackend`] op, grouped as cuBLASLt and cuDNN
//! group theirs, and op enums. Each descriptor's `accesses()` checks that its own numbers are coherent
//! (ranks, leading dimensions, output shapes, dtypes) and lists the byte regions the op will touch, with
//! every size computed with overflow checks.

mod attention;
mod blas;
mod conv;
mod elementwise;
mod index;
mod loss;
mod norm;
mod optim;
mod pool;
mod reduce;
mod scan;
mod select;
mod sort;
mod value;

pub use attention::*;
pub use blas::*;
pub use conv::*;
pub use elementwise::*;
pub use index::*;
pub use loss::*;
pub use norm::*;
pub use optim::*;
pub use pool::*;
pub use reduce::*;
pub use scan::*;
pub use select::*;
pub use sort::*;
pub use value::*;

use crate::compute::access::{Access, Accesses};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::{checked_numel, Layout};

/// Whether a GEMM operand is used as stored or transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transpose {
    /// `op(X) = X`.
    No,
    /// `op(X) = Xᵀ`.
    Yes,
}

/// Another name of [`Transpose`], as the low-level trait's users may spell it.
pub type BackendTranspose = Transpose;

/// An op enum with each variant's code and name: the one table the kernels' op codes follow.
/// The CUDA sources (`#define UNARY_NEG 0`, ...) and the WGSL shaders (`const UNARY_NEG: u32 = 0u;`,
/// ...) spell the same codes, and each backend has a test that reads its kernel source and fails
/// where a code differs from this table or an op has none.
macro_rules! op_enum {
    ($(#[$m:meta])* $name:ident {
        $($(#[$vm:meta])* $v:ident = $code:literal => $s:literal),* $(,)?
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v),* }
        impl $name {
            /// Every variant, in code order.
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            /// The lowercase name used in reports.
            pub const fn name(self) -> &'static str { match self { $($name::$v => $s),* } }
            /// The op's code in the kernels (`0..ALL.len()`).
            pub const fn code(self) -> u32 { match self { $($name::$v => $code),* } }
        }
    };
}

op_enum!(
    /// Elementwise unary ops. `Gelu` is the exact (erf) form, `GeluTanh` the tanh approximation, as in
    /// PyTorch's `gelu(approximate='none'|'tanh')`.
    UnaryOp {
        /// `-x`
        Neg = 0 => "neg",
        /// `|x|`
        Abs = 1 => "abs",
        /// `eˣ`
        Exp = 2 => "exp",
        /// natural log
        Log = 3 => "log",
        /// `√x`
        Sqrt = 4 => "sqrt",
        /// `1/√x`
        Rsqrt = 5 => "rsqrt",
        /// `1/x`
        Recip = 6 => "recip",
        /// `x²`
        Square = 7 => "square",
        /// `max(x, 0)`
        Relu = 8 => "relu",
        /// `x·Φ(x)`
        Gelu = 9 => "gelu",
        /// `0.5x(1+tanh(√(2/π)(x+0.044715x³)))`
        GeluTanh = 10 => "gelu_tanh",
        /// `1/(1+e⁻ˣ)`
        Sigmoid = 11 => "sigmoid",
        /// `x·sigmoid(x)`
        Silu = 12 => "silu",
        /// hyperbolic tangent
        Tanh = 13 => "tanh",
        /// sine
        Sin = 14 => "sin",
        /// cosine
        Cos = 15 => "cos",
        /// error function
        Erf = 16 => "erf",
    }
);

op_enum!(
    /// Elementwise binary ops. `Maximum`/`Minimum` propagate NaN, like `torch.maximum`.
    BinaryOp {
        /// `a + b`
        Add = 0 => "add",
        /// `a - b`
        Sub = 1 => "sub",
        /// `a * b`
        Mul = 2 => "mul",
        /// `a / b`
        Div = 3 => "div",
        /// `max(a, b)`
        Maximum = 4 => "maximum",
        /// `min(a, b)`
        Minimum = 5 => "minimum",
        /// `aᵇ`
        Pow = 6 => "pow",
    }
);

op_enum!(
    /// Inclusive scans along a dim ([`ScanDesc`]).
    ScanOp {
        /// running sum
        Sum = 0 => "cumsum",
        /// running product
        Prod = 1 => "cumprod",
    }
);

op_enum!(
    /// Ops that compare two operands, or combine their truth values, into a `U8` mask of 0 and 1
    /// ([`CompareDesc`]). Comparisons follow IEEE 754: any comparison with NaN is false except `Ne`,
    /// and `-0 == +0`. The logical ops take a nonzero element as true (NaN included), as PyTorch's
    /// `logical_and` does.
    CompareOp {
        /// `a == b`
        Eq = 0 => "eq",
        /// `a != b`
        Ne = 1 => "ne",
        /// `a < b`
        Lt = 2 => "lt",
        /// `a <= b`
        Le = 3 => "le",
        /// `a > b`
        Gt = 4 => "gt",
        /// `a >= b`
        Ge = 5 => "ge",
        /// `a ≠ 0 and b ≠ 0`
        And = 6 => "logical_and",
        /// `a ≠ 0 or b ≠ 0`
        Or = 7 => "logical_or",
        /// exactly one of `a ≠ 0`, `b ≠ 0`
        Xor = 8 => "logical_xor",
    }
);

/// A strided operand: a base pointer and an element layout relative to it.
#[derive(Clone, Debug, PartialEq)]
pub struct StridedBuf {
    /// The buffer's base pointer (the layout's offset counts from here).
    pub ptr: DevicePtr,
    /// Shape, strides and offset, in elements.
    pub layout: Layout,
}

impl StridedBuf {
    /// A contiguous operand of `shape` at `ptr`.
    pub fn contiguous(ptr: DevicePtr, shape: &[usize]) -> Self {
        StridedBuf {
            ptr,
            layout: Layout::contiguous(shape),
        }
    }

    /// Adds this operand's extent (first to last element) to `acc`, as an operand named `name` of
    /// `dtype` used as `access`. `SizeOverflow` when the extent does not fit in the address space.
    pub fn add_region(
        &self,
        acc: &mut Accesses,
        name: &'static str,
        dtype: DType,
        access: Access,
    ) -> Result<()> {
        let op = acc.op;
        let size = dtype.size_in_bytes();
        let span = self.layout.span_elements()?;
        let start = self.layout.offset();
        let start_bytes = mul(op, start, size)?;
        let bytes = mul(op, span - start, size)?;
        let ptr = self
            .ptr
            .offset(start_bytes)
            .ok_or_else(|| BackendError::overflow(op, "pointer + offset overflows"))?;
        acc.push(name, ptr, bytes, access, self.layout.is_contiguous());
        Ok(())
    }
}

#[inline]
pub(crate) fn mul(op: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| BackendError::overflow(op, format!("{a} × {b} overflows")))
}

#[inline]
pub(crate) fn add(op: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_add(b)
        .ok_or_else(|| BackendError::overflow(op, format!("{a} + {b} overflows")))
}

/// Bytes of a column-major `rows × cols` matrix with leading dimension `ld`.
#[inline]
pub(crate) fn matrix_bytes(
    op: &'static str,
    rows: usize,
    cols: usize,
    ld: usize,
    size: usize,
) -> Result<usize> {
    if rows == 0 || cols == 0 {
        return Ok(0);
    }
    mul(op, add(op, mul(op, cols - 1, ld)?, rows)?, size)
}

/// Bytes of a vector of `len` elements with increment `inc`.
pub(crate) fn vector_bytes(op: &'static str, len: usize, inc: usize, size: usize) -> Result<usize> {
    if len == 0 {
        return Ok(0);
    }
    mul(op, add(op, mul(op, len - 1, inc)?, 1)?, size)
}

pub(crate) fn dense_bytes(op: &'static str, shape: &[usize], dtype: DType) -> Result<usize> {
    mul(op, checked_numel(op, shape)?, dtype.size_in_bytes())
}

/// `ShapeMismatch` unless a descriptor's output shape is the one its inputs imply.
pub(crate) fn check_output_shape(
    op: &'static str,
    expected: &[usize],
    got: &[usize],
) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(BackendError::shape(
            op,
            format!("output shape {got:?} should be {expected:?}"),
        ))
    }
}

#[inline]
pub(crate) fn check_ld(op: &'static str, name: &str, ld: usize, rows: usize) -> Result<()> {
    if ld < rows.max(1) {
        return Err(BackendError::invalid(
            op,
            format!("{name} = {ld} must be at least max(1, {rows}) for a column-major matrix with {rows} rows"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_codes_number_every_op_in_order() {
        let codes = |c: Vec<u32>| assert_eq!(c, (0..c.len() as u32).collect::<Vec<_>>());
        codes(UnaryOp::ALL.iter().map(|o| o.code()).collect());
        codes(BinaryOp::ALL.iter().map(|o| o.code()).collect());
        codes(CompareOp::ALL.iter().map(|o| o.code()).collect());
        codes(ScanOp::ALL.iter().map(|o| o.code()).collect());
        codes(ReduceOp::ALL.iter().map(|o| o.code()).collect());
    }

    #[test]
    fn injectivity() {
        assert!(is_injective(&Layout::contiguous(&[3, 4])));
        assert!(is_injective(
            &Layout::contiguous(&[3, 4]).transpose(0, 1).unwrap()
        ));
        assert!(!is_injective(
            &Layout::contiguous(&[3, 1]).broadcast_to(&[3, 4]).unwrap()
        ));
        assert!(!is_injective(
            &Layout::new(vec![3, 3], vec![1, 1], 0).unwrap()
        ));
    }

    #[test]
    fn window_sizes() {
        assert_eq!(window_output_size(5, 3, 1, 1, 1), Some(5));
        assert_eq!(window_output_size(5, 3, 2, 0, 2), Some(1));
        assert_eq!(window_output_size(2, 5, 1, 1, 1), None);
        assert_eq!(window_output_size(2, 0, 1, 1, 1), None);
    }

    #[test]
    fn gemm_leading_dimensions_are_checked() {
        let d = GemmDesc {
            dtype: DType::F32,
            trans_a: Transpose::No,
            trans_b: Transpose::No,
            m: 4,
            n: 3,
            k: 2,
            alpha: 1.0,
            a: DevicePtr(4096),
            lda: 3,
            b: DevicePtr(8192),
            ldb: 2,
            beta: 0.0,
            c: DevicePtr(16384),
            ldc: 4,
        };
        assert!(matches!(
            d.accesses(),
            Err(BackendError::InvalidArgument { .. })
        ));
        let ok = GemmDesc { lda: 4, ..d };
        let acc = ok.accesses().unwrap();
        assert_eq!(acc.regions[0].bytes, (4 + 4) * 4);
        assert_eq!(acc.regions[2].access, Access::Write);
    }
}
