//! GEMM, strided batched GEMM and GEMV descriptors (column-major, BLAS conventions).

use super::{add, check_ld, matrix_bytes, mul, vector_bytes, Transpose};
use crate::compute::access::{Access, Accesses, InPlace};
use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

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

    /// The GEMMs of the batch, in order: none when `m`, `n` or `batch_count` is 0 (there is nothing
    /// to write), else one per batch with its pointers (with `k == 0`, A and B keep their base
    /// pointers: they are never read). Each item is `SizeOverflow` when its offsets overflow; callers
    /// validate [`BatchedGemmDesc::accesses`] against memory first, so that no batch is written
    /// unless every batch can be.
    pub fn batches(&self) -> impl Iterator<Item = Result<GemmDesc>> + '_ {
        let g = &self.gemm;
        let count = if g.m == 0 || g.n == 0 {
            0
        } else {
            self.batch_count
        };
        let size = g.dtype.size_in_bytes() as u64;
        let at = move |base: DevicePtr, stride: usize, i: usize| -> Result<DevicePtr> {
            (i as u64)
                .checked_mul(stride as u64)
                .and_then(|e| e.checked_mul(size))
                .and_then(|b| base.0.checked_add(b))
                .map(DevicePtr)
                .ok_or_else(|| BackendError::overflow("batched_gemm", "batch offset overflows"))
        };
        let (stride_a, stride_b) = if g.k == 0 {
            (0, 0)
        } else {
            (self.stride_a, self.stride_b)
        };
        (0..count).map(move |i| {
            Ok(GemmDesc {
                a: at(g.a, stride_a, i)?,
                b: at(g.b, stride_b, i)?,
                c: at(g.c, self.stride_c, i)?,
                ..g.clone()
            })
        })
    }

    fn accesses_named(&self, op: &'static str) -> Result<Accesses> {
        let g = &self.gemm;
        g.check(op)?;
        let size = g.dtype.size_in_bytes();
        if self.batch_count > 1
            && g.m > 0
            && g.n > 0
            && self.stride_c < add(op, mul(op, g.ldc, g.n - 1)?, g.m)?
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

crate::compute::op::op_desc!(GemmDesc => gemm, dtype: dtype, {
    dense "a": a,
    dense "b": b,
    dense "c": c,
});

crate::compute::op::op_desc!(GemvDesc => gemv, dtype: dtype, {
    dense "a": a,
    dense "x": x,
    dense "y": y,
});

impl crate::compute::OpDesc for BatchedGemmDesc {
    const NAME: &'static str = "batched_gemm";
    fn accesses(&self) -> Result<Accesses> {
        BatchedGemmDesc::accesses(self)
    }
    fn operands(&mut self) -> Vec<crate::compute::Operand<'_>> {
        crate::compute::OpDesc::operands(&mut self.gemm)
    }
    fn dtype(&self) -> DType {
        self.gemm.dtype
    }
    fn dtype_mut(&mut self) -> &mut DType {
        &mut self.gemm.dtype
    }
    fn run(&self, device: &dyn crate::compute::ComputeBackend) -> Result<()> {
        device.batched_gemm(self)
    }
}
