//! 16-bit GEMMs too large for one storage binding whose cut ([`gemm_cuts`]) ranges over the
//! inner dim: each block of C accumulates in f32.
//!
//! An f32 GEMM cut along the inner dim runs as its pieces, each adding its product into C. A 16-bit
//! one cannot: C would be rounded to 16 bits after every inner range, where the kernels round it
//! once after an f32 accumulation. So each block of C is cast into an f32 scratch matrix (when
//! `beta` reads it), each inner range's blocks of op(A) and op(B) are cast into f32 scratch
//! matrices and multiplied into it, and the block is rounded back once into C. The scratch holds
//! one piece's operands, which the cut budgets for; the price is the casts, which only products too
//! large for one binding pay.
//!
//! [`gemm_cuts`]: super::pieces::gemm_cuts

use crate::compute::{
    CastDesc, ComputeBackend, CopyDesc, DevicePtr, GemmDesc, StridedBuf, Temporaries, Transpose,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Layout;

use super::super::WebGpuBackend;
use super::cuts::advance;
use super::pieces::{op_offset, GemmCuts};

/// A block of `op(X)` (X column-major at `ptr` with leading dimension `ld`): its `(start, len)`
/// ranges of rows and columns as `op(X)` sees them.
struct Block {
    ptr: DevicePtr,
    ld: usize,
    trans: Transpose,
    rows: (usize, usize),
    cols: (usize, usize),
}

impl Block {
    /// Rows and columns of the block as stored.
    fn stored(&self) -> (usize, usize) {
        match self.trans {
            Transpose::No => (self.rows.1, self.cols.1),
            Transpose::Yes => (self.cols.1, self.rows.1),
        }
    }

    /// Whether the block's elements are consecutive in memory.
    fn is_dense(&self) -> bool {
        let (rows, cols) = self.stored();
        rows == self.ld || cols <= 1
    }

    /// The stored block as a view: one row of the view per stored column.
    fn view(&self) -> Result<StridedBuf> {
        let (rows, cols) = self.stored();
        let offset = op_offset(self.trans, self.ld, self.rows.0, self.cols.0)?;
        Ok(StridedBuf {
            ptr: self.ptr,
            layout: Layout::new(vec![cols, rows], vec![self.ld, 1], offset)?,
        })
    }

    /// Casts the block of `dtype` into `f32`, dense with leading dimension its stored rows, which
    /// it returns.
    fn cast_to_f32(&self, be: &WebGpuBackend, dtype: DType, f32: DevicePtr) -> Result<usize> {
        be.cast(&CastDesc {
            src_dtype: dtype,
            dst_dtype: DType::F32,
            input: self.view()?,
            output: f32,
        })?;
        Ok(self.stored().0.max(1))
    }
}

/// `desc`, a 16-bit GEMM, over the pieces of `plan` (which cuts its inner dim), accumulating each
/// block of C in f32 and rounding it once; `run_f32` runs the f32 products.
pub(crate) fn gemm(
    be: &WebGpuBackend,
    desc: &GemmDesc,
    plan: &GemmCuts,
    run_f32: impl Fn(&GemmDesc) -> Result<()>,
) -> Result<()> {
    let (rows, cols, inner) = (
        plan.rows.longest(),
        plan.cols.longest(),
        plan.inner.longest(),
    );
    let temps = Temporaries::new(be);
    let f32_matrix = |r: usize, c: usize| temps.alloc(r * c * 4);
    let (a32, b32, c32) = (
        f32_matrix(rows, inner)?,
        f32_matrix(inner, cols)?,
        f32_matrix(rows, cols)?,
    );
    let size = desc.dtype.size_in_bytes();
    // C's blocks are rounded into this dense scratch first when they are not dense themselves.
    let c16 = if desc.ldc == desc.m && plan.rows.count() == 1 {
        None
    } else {
        Some(temps.alloc(rows * cols * size)?)
    };
    for c in plan.cols.ranges() {
        for r in plan.rows.ranges() {
            let c_block = Block {
                ptr: desc.c,
                ld: desc.ldc,
                trans: Transpose::No,
                rows: r,
                cols: c,
            };
            if desc.beta != 0.0 {
                c_block.cast_to_f32(be, desc.dtype, c32)?;
            }
            for k in plan.inner.ranges() {
                let a = Block {
                    ptr: desc.a,
                    ld: desc.lda,
                    trans: desc.trans_a,
                    rows: r,
                    cols: k,
                };
                let b = Block {
                    ptr: desc.b,
                    ld: desc.ldb,
                    trans: desc.trans_b,
                    rows: k,
                    cols: c,
                };
                let (lda, ldb) = (
                    a.cast_to_f32(be, desc.dtype, a32)?,
                    b.cast_to_f32(be, desc.dtype, b32)?,
                );
                run_f32(&GemmDesc {
                    dtype: DType::F32,
                    m: r.1,
                    n: c.1,
                    k: k.1,
                    a: a32,
                    lda,
                    b: b32,
                    ldb,
                    c: c32,
                    ldc: r.1.max(1),
                    beta: if k.0 == 0 { desc.beta } else { 1.0 },
                    ..desc.clone()
                })?;
            }
            let scratch = c16.filter(|_| !c_block.is_dense());
            round_into(be, desc.dtype, c32, &c_block, scratch)?;
        }
    }
    Ok(())
}

/// Rounds the dense f32 block at `f32` into `block` of `dtype`: directly, or through the dense
/// scratch `dense` when given (for a block that is not dense).
fn round_into(
    be: &WebGpuBackend,
    dtype: DType,
    f32: DevicePtr,
    block: &Block,
    dense: Option<DevicePtr>,
) -> Result<()> {
    let (rows, cols) = block.stored();
    let target = block.view()?;
    let output = match dense {
        Some(scratch) => scratch,
        None => advance(target.ptr, target.layout.offset(), dtype.size_in_bytes())?,
    };
    be.cast(&CastDesc {
        src_dtype: DType::F32,
        dst_dtype: dtype,
        input: StridedBuf::contiguous(f32, &[cols, rows]),
        output,
    })?;
    if dense.is_some() {
        be.copy_strided(&CopyDesc {
            dtype,
            src: StridedBuf::contiguous(output, &[cols, rows]),
            dst: target,
        })?;
    }
    Ok(())
}
