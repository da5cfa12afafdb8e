//! Op descriptors: the arguments of each [`crate::ComputeBackend`] op, grouped as cuBLASLt and cuDNN
//! group theirs, and op enums. Each descriptor's `accesses()` checks that its own numbers are coherent
//! (ranks, leading dimensions, output shapes, dtypes) and lists the byte regions the op will touch, with
//! every size computed with overflow checks.

use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::{checked_numel, Layout};

/// Whether a GEMM operand is used as stored or transposed (seed 003's `BackendTranspose`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transpose {
    /// `op(X) = X`.
    No,
    /// `op(X) = Xᵀ`.
    Yes,
}

/// The name seed 003 uses.
pub type BackendTranspose = Transpose;

macro_rules! op_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v),* }
        impl $name {
            /// Every variant.
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            /// The lowercase name used in reports.
            pub const fn name(self) -> &'static str { match self { $($name::$v => $s),* } }
        }
    };
}

op_enum!(
    /// Elementwise unary ops. `Gelu` is the exact (erf) form, `GeluTanh` the tanh approximation, as in
    /// PyTorch's `gelu(approximate='none'|'tanh')`.
    UnaryOp {
        /// `-x`
        Neg => "neg",
        /// `|x|`
        Abs => "abs",
        /// `eˣ`
        Exp => "exp",
        /// natural log
        Log => "log",
        /// `√x`
        Sqrt => "sqrt",
        /// `1/√x`
        Rsqrt => "rsqrt",
        /// `1/x`
        Recip => "recip",
        /// `x²`
        Square => "square",
        /// `max(x, 0)`
        Relu => "relu",
        /// `x·Φ(x)`
        Gelu => "gelu",
        /// `0.5x(1+tanh(√(2/π)(x+0.044715x³)))`
        GeluTanh => "gelu_tanh",
        /// `1/(1+e⁻ˣ)`
        Sigmoid => "sigmoid",
        /// `x·sigmoid(x)`
        Silu => "silu",
        /// hyperbolic tangent
        Tanh => "tanh",
        /// sine
        Sin => "sin",
        /// cosine
        Cos => "cos",
        /// error function
        Erf => "erf",
    }
);

op_enum!(
    /// Elementwise binary ops. `Maximum`/`Minimum` propagate NaN, like `torch.maximum`.
    BinaryOp {
        /// `a + b`
        Add => "add",
        /// `a - b`
        Sub => "sub",
        /// `a * b`
        Mul => "mul",
        /// `a / b`
        Div => "div",
        /// `max(a, b)`
        Maximum => "maximum",
        /// `min(a, b)`
        Minimum => "minimum",
        /// `aᵇ`
        Pow => "pow",
    }
);

/// Reductions along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (0 over an empty axis).
    Sum,
    /// Mean (NaN over an empty axis).
    Mean,
    /// Maximum; NaN propagates.
    Max,
    /// Minimum; NaN propagates.
    Min,
    /// Variance `Σ(x-μ)² / (n - correction)` (`correction = 1` is the unbiased estimator).
    Var {
        /// Subtracted from the count in the denominator.
        correction: u32,
    },
    /// Index (`i64`) of the first maximum; a NaN counts as the maximum.
    ArgMax,
    /// Index (`i64`) of the first minimum; a NaN counts as the minimum.
    ArgMin,
}

impl ReduceOp {
    /// The lowercase name used in reports.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Var { .. } => "var",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }

    /// The dtype of the result for input dtype `dtype`: `I64` for the index reductions.
    pub const fn output_dtype(self, dtype: DType) -> DType {
        match self {
            ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
            _ => dtype,
        }
    }

    /// True when the reduction has no value over an empty axis (max, min and the index reductions).
    pub const fn needs_elements(self) -> bool {
        matches!(
            self,
            ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin
        )
    }
}

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

    /// Adds this operand's extent (first to last element) to `acc`.
    fn push(
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

fn mul(op: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| BackendError::overflow(op, format!("{a} × {b} overflows")))
}

fn add(op: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_add(b)
        .ok_or_else(|| BackendError::overflow(op, format!("{a} + {b} overflows")))
}

/// Bytes of a column-major `rows × cols` matrix with leading dimension `ld`.
fn matrix_bytes(
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
fn vector_bytes(op: &'static str, len: usize, inc: usize, size: usize) -> Result<usize> {
    if len == 0 {
        return Ok(0);
    }
    mul(op, add(op, mul(op, len - 1, inc)?, 1)?, size)
}

fn dense_bytes(op: &'static str, shape: &[usize], dtype: DType) -> Result<usize> {
    mul(op, checked_numel(op, shape)?, dtype.size_in_bytes())
}

fn check_ld(op: &'static str, name: &str, ld: usize, rows: usize) -> Result<()> {
    if ld < rows.max(1) {
        return Err(BackendError::invalid(
            op,
            format!("{name} = {ld} must be at least max(1, {rows}) for a column-major matrix with {rows} rows"),
        ));
    }
    Ok(())
}

/// `C = alpha · op(A) · op(B) + beta · C`, column-major (BLAS convention). `C` is `m × n`, `op(A)` is
/// `m × k`, `op(B)` is `k × n`. When `beta == 0`, `C` is not read (NaN in `C` does not propagate).
#[derive(Clone, Debug, PartialEq)]
pub struct GemmDesc {
    /// Element type of A, B and C; accumulation is at least f32.
    pub dtype: DType,
    /// Transpose of A.
    pub trans_a: Transpose,
    /// Transpose of B.
    pub trans_b: Transpose,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// Scale of the product.
    pub alpha: f64,
    /// A's base pointer.
    pub a: DevicePtr,
    /// A's leading dimension (elements between columns as stored).
    pub lda: usize,
    /// B's base pointer.
    pub b: DevicePtr,
    /// B's leading dimension.
    pub ldb: usize,
    /// Scale of the old C.
    pub beta: f64,
    /// C's base pointer.
    pub c: DevicePtr,
    /// C's leading dimension.
    pub ldc: usize,
}

impl GemmDesc {
    /// Stored (rows, cols) of A and B.
    pub fn stored_dims(&self) -> ((usize, usize), (usize, usize)) {
        let a = match self.trans_a {
            Transpose::No => (self.m, self.k),
            Transpose::Yes => (self.k, self.m),
        };
        let b = match self.trans_b {
            Transpose::No => (self.k, self.n),
            Transpose::Yes => (self.n, self.k),
        };
        (a, b)
    }

    fn check(&self, op: &'static str) -> Result<()> {
        let ((ar, _), (br, _)) = self.stored_dims();
        check_ld(op, "lda", self.lda, ar)?;
        check_ld(op, "ldb", self.ldb, br)?;
        check_ld(op, "ldc", self.ldc, self.m)
    }

    /// Validates and lists the regions (A, B read; C read-write, or write-only when `beta == 0`).
    pub fn accesses(&self) -> Result<Accesses> {
        BatchedGemmDesc {
            gemm: self.clone(),
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            batch_count: 1,
        }
        .accesses_named("gemm")
    }
}

/// Strided batched GEMM: for `i < batch_count`, `C_i = alpha · op(A_i) · op(B_i) + beta · C_i`, where
/// `X_i` starts `i · stride_x` elements after `X`. A stride of 0 for A or B reuses one matrix for every
/// batch; C's batches must not overlap.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchedGemmDesc {
    /// The per-batch GEMM (pointers are those of batch 0).
    pub gemm: GemmDesc,
    /// Elements between consecutive A matrices.
    pub stride_a: usize,
    /// Elements between consecutive B matrices.
    pub stride_b: usize,
    /// Elements between consecutive C matrices.
    pub stride_c: usize,
    /// Number of GEMMs.
    pub batch_count: usize,
}

impl BatchedGemmDesc {
    /// Validates and lists the regions spanned by all batches.
    pub fn accesses(&self) -> Result<Accesses> {
        self.accesses_named("batched_gemm")
    }

    fn accesses_named(&self, op: &'static str) -> Result<Accesses> {
        let g = &self.gemm;
        g.check(op)?;
        let size = g.dtype.size_in_bytes();
        if self.batch_count > 1
            && g.m > 0
            && g.n > 0
            && self.stride_c < mul(op, g.ldc, g.n - 1)? + g.m
        {
            return Err(BackendError::Aliasing {
                op,
                details: format!(
                    "stride_c = {} makes the {}×{} C matrices (ldc {}) of consecutive batches overlap",
                    self.stride_c, g.m, g.n, g.ldc
                ),
            });
        }
        let ((ar, ac), (br, bc)) = g.stored_dims();
        let batch_span = |stride: usize, one: usize| -> Result<usize> {
            if self.batch_count == 0 || one == 0 {
                return Ok(0);
            }
            add(
                op,
                mul(op, mul(op, self.batch_count - 1, stride)?, size)?,
                one,
            )
        };
        let a_bytes = batch_span(self.stride_a, matrix_bytes(op, ar, ac, g.lda, size)?)?;
        let b_bytes = batch_span(self.stride_b, matrix_bytes(op, br, bc, g.ldb, size)?)?;
        let c_bytes = batch_span(self.stride_c, matrix_bytes(op, g.m, g.n, g.ldc, size)?)?;
        let (a_bytes, b_bytes) = if g.k == 0 { (0, 0) } else { (a_bytes, b_bytes) };
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("a", g.a, a_bytes, Access::Read, false);
        acc.push("b", g.b, b_bytes, Access::Read, false);
        let c_access = if g.beta == 0.0 {
            Access::Write
        } else {
            Access::ReadWrite
        };
        acc.push("c", g.c, c_bytes, c_access, false);
        Ok(acc)
    }
}

/// `y = alpha · op(A) · x + beta · y` with A column-major `m × n` (as stored). When `beta == 0`, `y` is
/// not read.
#[derive(Clone, Debug, PartialEq)]
pub struct GemvDesc {
    /// Element type.
    pub dtype: DType,
    /// Transpose of A.
    pub trans: Transpose,
    /// Rows of A as stored.
    pub m: usize,
    /// Columns of A as stored.
    pub n: usize,
    /// Scale of the product.
    pub alpha: f64,
    /// A's base pointer.
    pub a: DevicePtr,
    /// A's leading dimension (≥ max(1, m)).
    pub lda: usize,
    /// x's base pointer.
    pub x: DevicePtr,
    /// Elements between consecutive x entries (≥ 1).
    pub incx: usize,
    /// Scale of the old y.
    pub beta: f64,
    /// y's base pointer.
    pub y: DevicePtr,
    /// Elements between consecutive y entries (≥ 1).
    pub incy: usize,
}

impl GemvDesc {
    /// Lengths of x and y.
    pub fn vector_lens(&self) -> (usize, usize) {
        match self.trans {
            Transpose::No => (self.n, self.m),
            Transpose::Yes => (self.m, self.n),
        }
    }

    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "gemv";
        check_ld(op, "lda", self.lda, self.m)?;
        if self.incx == 0 || self.incy == 0 {
            return Err(BackendError::invalid(
                op,
                "incx and incy must be at least 1",
            ));
        }
        let size = self.dtype.size_in_bytes();
        let (xl, yl) = self.vector_lens();
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push(
            "a",
            self.a,
            matrix_bytes(op, self.m, self.n, self.lda, size)?,
            Access::Read,
            false,
        );
        acc.push(
            "x",
            self.x,
            vector_bytes(op, xl, self.incx, size)?,
            Access::Read,
            false,
        );
        let y_access = if self.beta == 0.0 {
            Access::Write
        } else {
            Access::ReadWrite
        };
        acc.push(
            "y",
            self.y,
            vector_bytes(op, yl, self.incy, size)?,
            y_access,
            false,
        );
        Ok(acc)
    }
}

/// 2-D convolution (cross-correlation, as in PyTorch), NCHW, contiguous operands.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2dDesc {
    /// Element type of every operand.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// `[N, C, H, W]`.
    pub input_shape: [usize; 4],
    /// Weight pointer.
    pub weight: DevicePtr,
    /// `[K, C / groups, R, S]`.
    pub weight_shape: [usize; 4],
    /// Optional bias pointer, `[K]`.
    pub bias: Option<DevicePtr>,
    /// Output pointer.
    pub output: DevicePtr,
    /// `[N, K, OH, OW]`; must equal [`Conv2dDesc::expected_output_shape`].
    pub output_shape: [usize; 4],
    /// `[sh, sw]`, each ≥ 1.
    pub stride: [usize; 2],
    /// `[ph, pw]`, zero padding on both sides.
    pub padding: [usize; 2],
    /// `[dh, dw]`, each ≥ 1.
    pub dilation: [usize; 2],
    /// Channel groups (≥ 1, dividing C and K).
    pub groups: usize,
}

/// Output size of one spatial dim of a convolution or pooling window, or `None` when the (dilated)
/// window is larger than the padded input.
pub fn window_output_size(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    let padded = input.checked_add(padding.checked_mul(2)?)?;
    let span = dilation
        .checked_mul(kernel.checked_sub(1)?)?
        .checked_add(1)?;
    Some(padded.checked_sub(span)? / stride + 1)
}

impl Conv2dDesc {
    /// The output shape implied by the input, weight and window parameters, with every check on them.
    pub fn expected_output_shape(
        input_shape: [usize; 4],
        weight_shape: [usize; 4],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<[usize; 4]> {
        let op = "conv2d";
        let [n, c, h, w] = input_shape;
        let [k, cg, r, s] = weight_shape;
        if groups == 0 || stride.contains(&0) || dilation.contains(&0) {
            return Err(BackendError::invalid(
                op,
                "groups, stride and dilation must all be at least 1",
            ));
        }
        if c % groups != 0 || k % groups != 0 {
            return Err(BackendError::shape(
                op,
                format!(
                    "groups = {groups} must divide both input channels {c} and output channels {k}"
                ),
            ));
        }
        if cg != c / groups {
            return Err(BackendError::shape(
                op,
                format!(
                    "weight {weight_shape:?} must have C/groups = {} input channels, has {cg}",
                    c / groups
                ),
            ));
        }
        if r == 0 || s == 0 {
            return Err(BackendError::shape(
                op,
                format!("weight {weight_shape:?} has an empty kernel"),
            ));
        }
        let oh = window_output_size(h, r, stride[0], padding[0], dilation[0]);
        let ow = window_output_size(w, s, stride[1], padding[1], dilation[1]);
        match (oh, ow) {
            (Some(oh), Some(ow)) => Ok([n, k, oh, ow]),
            _ => Err(BackendError::shape(
                op,
                format!(
                    "kernel {r}×{s} (dilation {dilation:?}) is larger than the padded input {}×{}",
                    h + 2 * padding[0],
                    w + 2 * padding[1]
                ),
            )),
        }
    }

    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "conv2d";
        let expected = Self::expected_output_shape(
            self.input_shape,
            self.weight_shape,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )?;
        if expected != self.output_shape {
            return Err(BackendError::shape(
                op,
                format!(
                    "output shape {:?} should be {expected:?}",
                    self.output_shape
                ),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push(
            "input",
            self.input,
            dense_bytes(op, &self.input_shape, self.dtype)?,
            Access::Read,
            true,
        );
        acc.push(
            "weight",
            self.weight,
            dense_bytes(op, &self.weight_shape, self.dtype)?,
            Access::Read,
            true,
        );
        if let Some(bias) = self.bias {
            acc.push(
                "bias",
                bias,
                dense_bytes(op, &[self.weight_shape[0]], self.dtype)?,
                Access::Read,
                true,
            );
        }
        acc.push(
            "output",
            self.output,
            dense_bytes(op, &self.output_shape, self.dtype)?,
            Access::Write,
            true,
        );
        Ok(acc)
    }
}

/// Scaled dot-product attention `O = softmax(scale · Q·Kᵀ [+ mask]) · V` over contiguous
/// `[batch, heads, seq, head_dim]` operands. The causal mask is aligned top-left, as in PyTorch's
/// `scaled_dot_product_attention(is_causal=True)`: query `i` sees keys `j ≤ i`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionDesc {
    /// Element type.
    pub dtype: DType,
    /// Q, `[batch, heads, seq_q, head_dim]`.
    pub q: DevicePtr,
    /// K, `[batch, heads, seq_kv, head_dim]`.
    pub k: DevicePtr,
    /// V, `[batch, heads, seq_kv, head_dim]`.
    pub v: DevicePtr,
    /// O, `[batch, heads, seq_q, head_dim]`.
    pub o: DevicePtr,
    /// Batch size.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Query length.
    pub seq_q: usize,
    /// Key/value length (≥ 1 when `seq_q` ≥ 1).
    pub seq_kv: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Multiplies the scores; usually `1/√head_dim`. Must be finite.
    pub scale: f64,
    /// Apply the causal mask.
    pub causal: bool,
}

impl AttentionDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "attention";
        if !self.scale.is_finite() {
            return Err(BackendError::invalid(
                op,
                format!("scale {} must be finite", self.scale),
            ));
        }
        if self.seq_kv == 0 && self.seq_q > 0 && self.batch * self.heads > 0 {
            return Err(BackendError::invalid(
                op,
                "seq_kv is 0: every query would attend to nothing",
            ));
        }
        let q_shape = [self.batch, self.heads, self.seq_q, self.head_dim];
        let kv_shape = [self.batch, self.heads, self.seq_kv, self.head_dim];
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push(
            "q",
            self.q,
            dense_bytes(op, &q_shape, self.dtype)?,
            Access::Read,
            true,
        );
        acc.push(
            "k",
            self.k,
            dense_bytes(op, &kv_shape, self.dtype)?,
            Access::Read,
            true,
        );
        acc.push(
            "v",
            self.v,
            dense_bytes(op, &kv_shape, self.dtype)?,
            Access::Read,
            true,
        );
        acc.push(
            "o",
            self.o,
            dense_bytes(op, &q_shape, self.dtype)?,
            Access::Write,
            true,
        );
        Ok(acc)
    }
}

/// Reduction of a strided input along `axis` into a contiguous output whose shape is the input's
/// without `axis`, of dtype [`ReduceOp::output_dtype`].
#[derive(Clone, Debug, PartialEq)]
pub struct ReduceDesc {
    /// The reduction.
    pub op: ReduceOp,
    /// Input element type.
    pub dtype: DType,
    /// Input view (rank ≥ 1).
    pub input: StridedBuf,
    /// Axis to reduce, `< rank`.
    pub axis: usize,
    /// Output pointer.
    pub output: DevicePtr,
}

impl ReduceDesc {
    /// The output shape: the input's without `axis`.
    pub fn output_shape(&self) -> Vec<usize> {
        let mut s = self.input.layout.shape().to_vec();
        if self.axis < s.len() {
            s.remove(self.axis);
        }
        s
    }

    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "reduce";
        let shape = self.input.layout.shape();
        if self.axis >= shape.len() {
            return Err(BackendError::invalid(
                op,
                format!("axis {} out of range for shape {shape:?}", self.axis),
            ));
        }
        let out_shape = self.output_shape();
        if self.op.needs_elements() && shape[self.axis] == 0 && checked_numel(op, &out_shape)? > 0 {
            return Err(BackendError::invalid(
                op,
                format!(
                    "{} over an empty axis {} of shape {shape:?} has no value",
                    self.op.name(),
                    self.axis
                ),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        self.input
            .push(&mut acc, "input", self.dtype, Access::Read)?;
        let out_dtype = self.op.output_dtype(self.dtype);
        acc.push(
            "output",
            self.output,
            dense_bytes(op, &out_shape, out_dtype)?,
            Access::Write,
            true,
        );
        Ok(acc)
    }
}

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
            .push(&mut acc, "input", self.dtype, Access::Read)?;
        let bytes = dense_bytes(op, self.input.layout.shape(), self.dtype)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// Elementwise binary op. `lhs` and `rhs` have the output's shape; broadcasting is expressed by
/// stride-0 dims in their layouts. The output is contiguous and may be `lhs` or `rhs` itself when that
/// operand is contiguous and not broadcast.
#[derive(Clone, Debug, PartialEq)]
pub struct BinaryDesc {
    /// The op.
    pub op: BinaryOp,
    /// Element type of every operand.
    pub dtype: DType,
    /// Left operand view.
    pub lhs: StridedBuf,
    /// Right operand view.
    pub rhs: StridedBuf,
    /// Output pointer.
    pub output: DevicePtr,
}

impl BinaryDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "binary";
        if self.lhs.layout.shape() != self.rhs.layout.shape() {
            return Err(BackendError::shape(
                op,
                format!(
                    "operand views must have the output's shape: {:?} vs {:?} (broadcast with stride-0 dims)",
                    self.lhs.layout.shape(),
                    self.rhs.layout.shape()
                ),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::ExactAllowed);
        self.lhs.push(&mut acc, "lhs", self.dtype, Access::Read)?;
        self.rhs.push(&mut acc, "rhs", self.dtype, Access::Read)?;
        let bytes = dense_bytes(op, self.lhs.layout.shape(), self.dtype)?;
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// Softmax (or log-softmax) of a contiguous `[outer, axis_len, inner]` tensor along the middle dim.
#[derive(Clone, Debug, PartialEq)]
pub struct SoftmaxDesc {
    /// Element type.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// Output pointer (same shape).
    pub output: DevicePtr,
    /// Product of the dims before the axis.
    pub outer: usize,
    /// Length of the axis.
    pub axis_len: usize,
    /// Product of the dims after the axis.
    pub inner: usize,
    /// Compute `log_softmax` instead.
    pub log: bool,
}

impl SoftmaxDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = if self.log { "log_softmax" } else { "softmax" };
        let bytes = dense_bytes(op, &[self.outer, self.axis_len, self.inner], self.dtype)?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("input", self.input, bytes, Access::Read, true);
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// Layer normalisation of a contiguous `[rows, cols]` tensor over each row, with biased variance:
/// `y = (x - μ) / √(σ² + eps) · weight + bias`.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormDesc {
    /// Element type.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// Optional `[cols]` scale.
    pub weight: Option<DevicePtr>,
    /// Optional `[cols]` shift.
    pub bias: Option<DevicePtr>,
    /// Output pointer (same shape).
    pub output: DevicePtr,
    /// Rows.
    pub rows: usize,
    /// Normalised width.
    pub cols: usize,
    /// Added to the variance; finite and ≥ 0.
    pub eps: f64,
}

impl LayerNormDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "layer_norm";
        if !(self.eps >= 0.0 && self.eps.is_finite()) {
            return Err(BackendError::invalid(
                op,
                format!("eps {} must be finite and ≥ 0", self.eps),
            ));
        }
        let bytes = dense_bytes(op, &[self.rows, self.cols], self.dtype)?;
        let row = dense_bytes(op, &[self.cols], self.dtype)?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("input", self.input, bytes, Access::Read, true);
        if let Some(w) = self.weight {
            acc.push("weight", w, row, Access::Read, true);
        }
        if let Some(b) = self.bias {
            acc.push("bias", b, row, Access::Read, true);
        }
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// Batch normalisation of a contiguous `[batch, channels, spatial]` tensor per channel, as PyTorch's
/// `batch_norm`: in training, batch statistics normalise (biased variance) and running statistics, when
/// given, become `(1 - momentum)·old + momentum·batch` (unbiased variance); in inference the running
/// statistics normalise.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNormDesc {
    /// Element type of every operand.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// Output pointer (same shape).
    pub output: DevicePtr,
    /// N.
    pub batch: usize,
    /// C.
    pub channels: usize,
    /// Product of the spatial dims (1 for `[N, C]` input).
    pub spatial: usize,
    /// Optional `[C]` scale.
    pub weight: Option<DevicePtr>,
    /// Optional `[C]` shift.
    pub bias: Option<DevicePtr>,
    /// `[C]` running mean: read in inference, updated in training.
    pub running_mean: Option<DevicePtr>,
    /// `[C]` running variance: read in inference, updated in training.
    pub running_var: Option<DevicePtr>,
    /// Training mode.
    pub training: bool,
    /// Weight of the new batch statistics in the running update, in `[0, 1]`.
    pub momentum: f64,
    /// Added to the variance; finite and ≥ 0.
    pub eps: f64,
}

impl BatchNormDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "batch_norm";
        if !(self.eps >= 0.0 && self.eps.is_finite() && (0.0..=1.0).contains(&self.momentum)) {
            return Err(BackendError::invalid(
                op,
                format!(
                    "eps {} must be finite and ≥ 0, momentum {} in [0, 1]",
                    self.eps, self.momentum
                ),
            ));
        }
        if self.running_mean.is_some() != self.running_var.is_some() {
            return Err(BackendError::invalid(
                op,
                "running_mean and running_var must be given together",
            ));
        }
        let per_channel = mul(op, self.batch, self.spatial)?;
        if self.training && per_channel <= 1 && self.channels > 0 {
            return Err(BackendError::invalid(
                op,
                format!("training needs more than one value per channel, got {per_channel}"),
            ));
        }
        if !self.training && self.running_mean.is_none() {
            return Err(BackendError::invalid(
                op,
                "inference needs running_mean and running_var",
            ));
        }
        let bytes = dense_bytes(op, &[self.batch, self.channels, self.spatial], self.dtype)?;
        let chan = dense_bytes(op, &[self.channels], self.dtype)?;
        let stats = if self.training {
            Access::ReadWrite
        } else {
            Access::Read
        };
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("input", self.input, bytes, Access::Read, true);
        for (name, p, a) in [
            ("weight", self.weight, Access::Read),
            ("bias", self.bias, Access::Read),
            ("running_mean", self.running_mean, stats),
            ("running_var", self.running_var, stats),
        ] {
            if let Some(p) = p {
                acc.push(name, p, chan, a, true);
            }
        }
        acc.push("output", self.output, bytes, Access::Write, true);
        Ok(acc)
    }
}

/// The kind of pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// Maximum over the window (padding never wins; NaN propagates).
    Max,
    /// Mean over the window.
    Avg {
        /// Divide by the full window size including padding (PyTorch's default) rather than by the
        /// number of real elements.
        count_include_pad: bool,
    },
}

/// 2-D pooling over contiguous NCHW operands.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool2dDesc {
    /// Max or average.
    pub kind: PoolKind,
    /// Element type.
    pub dtype: DType,
    /// Input pointer.
    pub input: DevicePtr,
    /// `[N, C, H, W]`.
    pub input_shape: [usize; 4],
    /// Output pointer.
    pub output: DevicePtr,
    /// `[N, C, OH, OW]`; must equal [`Pool2dDesc::expected_output_shape`].
    pub output_shape: [usize; 4],
    /// Window `[kh, kw]`, each ≥ 1.
    pub kernel: [usize; 2],
    /// `[sh, sw]`, each ≥ 1.
    pub stride: [usize; 2],
    /// `[ph, pw]`, each at most half the window (PyTorch's rule).
    pub padding: [usize; 2],
}

impl Pool2dDesc {
    /// The output shape implied by the input and window, with every check on them.
    pub fn expected_output_shape(
        input_shape: [usize; 4],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<[usize; 4]> {
        let op = "pool2d";
        if kernel.contains(&0) || stride.contains(&0) {
            return Err(BackendError::invalid(
                op,
                "kernel and stride must be at least 1",
            ));
        }
        if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
            return Err(BackendError::invalid(
                op,
                format!("padding {padding:?} must be at most half the kernel {kernel:?}"),
            ));
        }
        let [n, c, h, w] = input_shape;
        match (
            window_output_size(h, kernel[0], stride[0], padding[0], 1),
            window_output_size(w, kernel[1], stride[1], padding[1], 1),
        ) {
            (Some(oh), Some(ow)) => Ok([n, c, oh, ow]),
            _ => Err(BackendError::shape(
                op,
                format!("window {kernel:?} is larger than the padded input {h}×{w} (padding {padding:?})"),
            )),
        }
    }

    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "pool2d";
        let expected =
            Self::expected_output_shape(self.input_shape, self.kernel, self.stride, self.padding)?;
        if expected != self.output_shape {
            return Err(BackendError::shape(
                op,
                format!(
                    "output shape {:?} should be {expected:?}",
                    self.output_shape
                ),
            ));
        }
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push(
            "input",
            self.input,
            dense_bytes(op, &self.input_shape, self.dtype)?,
            Access::Read,
            true,
        );
        acc.push(
            "output",
            self.output,
            dense_bytes(op, &self.output_shape, self.dtype)?,
            Access::Write,
            true,
        );
        Ok(acc)
    }
}

/// One Adam or AdamW step over `len` contiguous elements, in place, following `torch.optim.Adam` /
/// `AdamW` (no AMSGrad): with `t = step`,
/// `g += wd·p` (Adam) or `p *= 1 - lr·wd` (AdamW); `m = β₁m + (1-β₁)g`; `v = β₂v + (1-β₂)g²`;
/// `p -= lr/(1-β₁ᵗ) · m / (√v/√(1-β₂ᵗ) + eps)`.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamDesc {
    /// Element type of every operand (moments are kept in the parameters' dtype, as PyTorch does).
    pub dtype: DType,
    /// Parameters, updated.
    pub params: DevicePtr,
    /// Gradients, read.
    pub grads: DevicePtr,
    /// First moment, updated.
    pub exp_avg: DevicePtr,
    /// Second moment, updated.
    pub exp_avg_sq: DevicePtr,
    /// Elements.
    pub len: usize,
    /// Learning rate, ≥ 0.
    pub lr: f64,
    /// β₁ in `[0, 1)`.
    pub beta1: f64,
    /// β₂ in `[0, 1)`.
    pub beta2: f64,
    /// ε ≥ 0.
    pub eps: f64,
    /// Weight decay ≥ 0.
    pub weight_decay: f64,
    /// AdamW (decoupled decay) instead of Adam (L2 added to the gradient).
    pub decoupled_weight_decay: bool,
    /// The step number after this update (1 for the first step).
    pub step: u64,
}

impl AdamDesc {
    /// Validates and lists the regions.
    pub fn accesses(&self) -> Result<Accesses> {
        let op = "adam_step";
        let ok = self.lr >= 0.0
            && (0.0..1.0).contains(&self.beta1)
            && (0.0..1.0).contains(&self.beta2)
            && self.eps >= 0.0
            && self.weight_decay >= 0.0
            && self.lr.is_finite()
            && self.eps.is_finite()
            && self.weight_decay.is_finite();
        if !ok || self.step == 0 {
            return Err(BackendError::invalid(
                op,
                format!(
                    "need lr ≥ 0, betas in [0, 1), eps ≥ 0, weight_decay ≥ 0 (all finite) and step ≥ 1; got lr {}, betas ({}, {}), eps {}, weight_decay {}, step {}",
                    self.lr, self.beta1, self.beta2, self.eps, self.weight_decay, self.step
                ),
            ));
        }
        let bytes = dense_bytes(op, &[self.len], self.dtype)?;
        let mut acc = Accesses::new(op, InPlace::Forbidden);
        acc.push("params", self.params, bytes, Access::ReadWrite, true);
        acc.push("grads", self.grads, bytes, Access::Read, true);
        acc.push("exp_avg", self.exp_avg, bytes, Access::ReadWrite, true);
        acc.push(
            "exp_avg_sq",
            self.exp_avg_sq,
            bytes,
            Access::ReadWrite,
            true,
        );
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
            .push(&mut acc, "input", self.src_dtype, Access::Read)?;
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
        self.src.push(&mut acc, "src", self.dtype, Access::Read)?;
        self.dst.push(&mut acc, "dst", self.dtype, Access::Write)?;
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
        acc.push(
            "output",
            self.ptr,
            dense_bytes(op, &[self.len], self.dtype)?,
            Access::Write,
            true,
        );
        Ok(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
