//! GEMM and GEMV: textbook loops over column-major operands, accumulating in f64.

use crate::compute::{GemmDesc, GemvDesc, Transpose};
use crate::error::Result;

use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;
use crate::compute::BatchedGemmDesc;

/// Element `(i, j)` of `op(X)` where `X` is column-major with leading dimension `ld`.
fn at(x: &[f64], trans: Transpose, ld: usize, i: usize, j: usize) -> f64 {
    match trans {
        Transpose::No => x[i + j * ld],
        Transpose::Yes => x[j + i * ld],
    }
}

/// `C = alpha · op(A) · op(B) + beta · C`; C is not read when `beta == 0`.
pub fn gemm(mem: &mut HostMemory, d: &GemmDesc, regions: [usize; 3]) -> Result<()> {
    if d.m == 0 || d.n == 0 {
        return Ok(()); // C is empty: nothing to compute or write.
    }
    let size = d.dtype.size_in_bytes();
    let a = mem.load_dense(d.dtype, d.a, regions[0] / size)?;
    let b = mem.load_dense(d.dtype, d.b, regions[1] / size)?;
    let c_len = regions[2] / size;
    let mut c = if d.beta == 0.0 {
        vec![0.0; c_len]
    } else {
        mem.load_dense(d.dtype, d.c, c_len)?
    };
    for j in 0..d.n {
        for i in 0..d.m {
            let mut sum = 0.0f64;
            for p in 0..d.k {
                sum += at(&a, d.trans_a, d.lda, i, p) * at(&b, d.trans_b, d.ldb, p, j);
            }
            let old = if d.beta == 0.0 {
                0.0
            } else {
                d.beta * c[i + j * d.ldc]
            };
            c[i + j * d.ldc] = d.alpha * sum + old;
        }
    }
    // Store only the m × n block: elements between columns (ldc > m) are not C's and stay untouched.
    for j in 0..d.n {
        let col = &c[j * d.ldc..j * d.ldc + d.m];
        mem.store(d.dtype, offset(d.c, j * d.ldc, size), col)?;
    }
    Ok(())
}

/// `y = alpha · op(A) · x + beta · y`; y is not read when `beta == 0`.
pub fn gemv(mem: &mut HostMemory, d: &GemvDesc, regions: [usize; 3]) -> Result<()> {
    let size = d.dtype.size_in_bytes();
    let a = mem.load_dense(d.dtype, d.a, regions[0] / size)?;
    let x = mem.load_dense(d.dtype, d.x, regions[1] / size)?;
    let (xl, yl) = d.vector_lens();
    for i in 0..yl {
        let mut sum = 0.0f64;
        for j in 0..xl {
            sum += at(&a, d.trans, d.lda, i, j) * x[j * d.incx];
        }
        let y_ptr = offset(d.y, i * d.incy, size);
        let old = if d.beta == 0.0 {
            0.0
        } else {
            d.beta * mem.load_dense(d.dtype, y_ptr, 1)?[0]
        };
        mem.store(d.dtype, y_ptr, &[d.alpha * sum + old])?;
    }
    Ok(())
}

fn offset(p: crate::compute::DevicePtr, elems: usize, size: usize) -> crate::compute::DevicePtr {
    crate::compute::DevicePtr(p.0 + (elems * size) as u64)
}

/// The byte sizes of a GEMM's A, B and C regions; the errors of [`GemmDesc::accesses`].
pub(crate) fn gemm_regions(desc: &GemmDesc) -> Result<[usize; 3]> {
    let acc = desc.accesses()?;
    Ok([
        acc.regions[0].bytes,
        acc.regions[1].bytes,
        acc.regions[2].bytes,
    ])
}

impl OpImpl<GemmDesc> for ReferenceBackend {
    fn op(&self, desc: &GemmDesc) -> Result<()> {
        let regions = gemm_regions(desc)?;
        self.float_only("gemm", desc.dtype)?;
        self.run(desc.accesses()?, |mem| gemm(mem, desc, regions))
    }
}

impl OpImpl<BatchedGemmDesc> for ReferenceBackend {
    /// Checks every batch's regions (bounds and aliasing) under one lock, then runs the batches;
    /// nothing is written unless every batch can be.
    fn op(&self, desc: &BatchedGemmDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("batched_gemm", desc.gemm.dtype)?;
        self.run(acc, |mem| {
            for one in desc.batches() {
                let one = one?;
                gemm(mem, &one, gemm_regions(&one)?)?;
            }
            Ok(())
        })
    }
}

impl OpImpl<GemvDesc> for ReferenceBackend {
    fn op(&self, desc: &GemvDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("gemv", desc.dtype)?;
        let regions = [
            acc.regions[0].bytes,
            acc.regions[1].bytes,
            acc.regions[2].bytes,
        ];
        self.run(acc, |mem| gemv(mem, desc, regions))
    }
}
