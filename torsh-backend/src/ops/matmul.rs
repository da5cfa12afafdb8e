//! `matmul` (batched, broadcasting batch dims, NumPy 1-D rules), `gemm` with alpha/beta and `gemv`.
//!
//! Row-major tensors meet the column-major backend GEMM through `Cᵀ = Bᵀ·Aᵀ`: a row-major `C` of
//! `m × n` is a column-major `n × m` matrix. A strided operand whose rows or columns are unit-stride is
//! passed as it is, with the matching transpose flag and leading dimension; any other view is copied
//! to a dense one first. Batch dims that collapse to one stride use one batched GEMM.

use std::borrow::Cow;

use crate::backend::Backend;
use crate::compute::{BatchedGemmDesc, CopyDesc, GemmDesc, GemvDesc, Transpose, TunableOp};
use crate::error::{BackendError, Result};
use crate::shape::broadcast_shapes;
use crate::tensor::Tensor;

use super::{expect_rank, expect_shape, product};

/// How a row-major logical matrix `X` (`rows × cols`, element strides `rs`, `cs`) is handed to a
/// column-major GEMM so that `op(stored) = Xᵀ`: `(Transpose::No, ld)` when `X` is row-major with row
/// stride `ld` (then the stored column-major matrix *is* `Xᵀ`), `(Transpose::Yes, ld)` when `X` is
/// column-major with column stride `ld`. `None` when neither stride is 1.
fn blas_operand(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(Transpose, usize)> {
    if cols <= 1 || cs == 1 {
        let ld = if rows <= 1 { cols.max(1) } else { rs };
        if ld >= cols.max(1) {
            return Some((Transpose::No, ld));
        }
    }
    if rows <= 1 || rs == 1 {
        let ld = if cols <= 1 { rows.max(1) } else { cs };
        if ld >= rows.max(1) {
            return Some((Transpose::Yes, ld));
        }
    }
    None
}

/// The single element stride that walks the batch dims of a view in row-major order, or `None` when
/// they do not collapse (mixed broadcast and real dims, gaps).
fn collapse_batch(shape: &[usize], strides: &[usize]) -> Option<usize> {
    let dims: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .filter(|(&d, _)| d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    match dims.as_slice() {
        [] => Some(0),
        [(_, s)] => Some(*s),
        _ => {
            let inner = dims.last().map_or(0, |&(_, s)| s);
            let mut expect = inner;
            for &(d, s) in dims.iter().rev() {
                if s != expect {
                    return None;
                }
                expect = s * d;
            }
            Some(inner)
        }
    }
}

/// A matrix operand ready for the backend: the view (the operand itself when it needs no
/// broadcast, else a broadcast view or a dense copy), its transpose flag, leading dimension and
/// batch stride.
struct Operand<'a> {
    view: Cow<'a, Tensor>,
    trans: Transpose,
    ld: usize,
    batch_stride: usize,
}

fn prepare<'a>(t: &'a Tensor, batch: &[usize]) -> Result<Operand<'a>> {
    let rank = t.rank();
    let (rows, cols) = (t.shape()[rank - 2], t.shape()[rank - 1]);
    let full = || {
        let mut full = batch.to_vec();
        full.extend([rows, cols]);
        full
    };
    // Already of the full shape (every 2-D operand, and batches that match): no view to build.
    let view = if rank == batch.len() + 2 && (batch.is_empty() || t.shape()[..rank - 2] == *batch) {
        Cow::Borrowed(t)
    } else {
        Cow::Owned(t.broadcast_to(&full())?)
    };
    let st = view.strides();
    let nb = batch.len();
    if let (Some((trans, ld)), Some(bs)) = (
        blas_operand(rows, cols, st[nb], st[nb + 1]),
        collapse_batch(batch, &st[..nb]),
    ) {
        return Ok(Operand {
            view,
            trans,
            ld,
            batch_stride: bs,
        });
    }
    // Materialise a dense copy of the (broadcast) view: always expressible.
    let dense = t.backend().empty(&full(), t.dtype())?;
    t.backend().compute().copy_strided(&CopyDesc {
        dtype: t.dtype(),
        src: view.strided_buf(),
        dst: dense.strided_buf(),
    })?;
    Ok(Operand {
        view: Cow::Owned(dense),
        trans: Transpose::No,
        ld: cols.max(1),
        batch_stride: rows * cols,
    })
}

impl Backend {
    /// Matrix product with `torch.matmul` semantics: 1-D operands are treated as a row (left) or column
    /// (right) vector and that dim is removed from the result; dims before the last two are batch dims
    /// and broadcast. `ShapeMismatch` when the inner dims differ or batch dims do not broadcast.
    /// With mixed precision on ([`Backend::enable_mixed_precision`]), f32 operands run in its compute
    /// dtype and the result comes back as f32.
    pub fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        crate::runtime::amp::autocast(self, &[a, b], |t| self.matmul_as_is(t[0], t[1]))
    }

    fn matmul_as_is(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let op = "matmul";
        let dtype = self.check_operands(op, &[a, b])?;
        if a.rank() == 0 || b.rank() == 0 {
            return Err(BackendError::shape(op, "matmul needs operands of rank ≥ 1"));
        }
        let a2 = if a.rank() == 1 {
            Cow::Owned(a.unsqueeze(0)?)
        } else {
            Cow::Borrowed(a)
        };
        let b2 = if b.rank() == 1 {
            Cow::Owned(b.unsqueeze(1)?)
        } else {
            Cow::Borrowed(b)
        };
        let (m, k) = (a2.shape()[a2.rank() - 2], a2.shape()[a2.rank() - 1]);
        let (kb, n) = (b2.shape()[b2.rank() - 2], b2.shape()[b2.rank() - 1]);
        if k != kb {
            return Err(BackendError::shape(
                op,
                format!(
                    "inner dims differ: {:?} @ {:?} ({k} vs {kb})",
                    a.shape(),
                    b.shape()
                ),
            ));
        }
        let batch = broadcast_shapes(
            op,
            &a2.shape()[..a2.rank() - 2],
            &b2.shape()[..b2.rank() - 2],
        )?;
        let out = if batch.is_empty() {
            self.empty(&[m, n], dtype)?
        } else {
            let mut out_shape = batch.clone();
            out_shape.extend([m, n]);
            self.empty(&out_shape, dtype)?
        };
        let batch_count = product(&batch);
        if out.numel() > 0 {
            let pa = prepare(&a2, &batch)?;
            let pb = prepare(&b2, &batch)?;
            // Column-major view of the problem: Cᵀ (n × m) = Bᵀ (n × k) · Aᵀ (k × m).
            let desc = BatchedGemmDesc {
                gemm: GemmDesc {
                    dtype,
                    trans_a: pb.trans,
                    trans_b: pa.trans,
                    m: n,
                    n: m,
                    k,
                    alpha: 1.0,
                    a: pb.view.data_ptr(),
                    lda: pb.ld,
                    b: pa.view.data_ptr(),
                    ldb: pa.ld,
                    beta: 0.0,
                    c: out.data_ptr(),
                    ldc: n.max(1),
                },
                stride_a: pb.batch_stride,
                stride_b: pa.batch_stride,
                stride_c: m * n,
                batch_count,
            };
            if batch_count == 1 {
                // A single product: a GEMM, whose variant the autotuner may choose.
                self.run_tunable(&TunableOp::Gemm(desc.gemm))?;
            } else {
                self.compute().batched_gemm(&desc)?;
            }
        }
        // Drop the dims the 1-D rules added: the row of a 1-D `a`, then the column of a 1-D `b`.
        let mut result = out;
        if a.rank() == 1 {
            result = result.squeeze(-2)?;
        }
        if b.rank() == 1 {
            result = result.squeeze(-1)?;
        }
        Ok(result)
    }

    /// `alpha · a @ b + beta · c` for 2-D `a` (`m × k`), `b` (`k × n`) and `c` broadcastable to
    /// `m × n`, into a new tensor (`c` is not modified), like `torch.addmm`. When `beta == 0`, `c` is not
    /// read. `ShapeMismatch` on incompatible shapes. With mixed precision on
    /// ([`Backend::enable_mixed_precision`]) and all three f32, the product and `c` run in its
    /// compute dtype and the result comes back as f32, as `torch.addmm` does under autocast.
    pub fn gemm(
        &self,
        a: &Tensor,
        b: &Tensor,
        alpha: f32,
        c: &Tensor,
        beta: f32,
    ) -> Result<Tensor> {
        crate::runtime::amp::autocast(self, &[a, b, c], |t| {
            self.gemm_as_is(t[0], t[1], alpha, t[2], beta)
        })
    }

    fn gemm_as_is(
        &self,
        a: &Tensor,
        b: &Tensor,
        alpha: f32,
        c: &Tensor,
        beta: f32,
    ) -> Result<Tensor> {
        let op = "gemm";
        let dtype = self.check_operands(op, &[a, b, c])?;
        expect_rank(op, "a", a, 2)?;
        expect_rank(op, "b", b, 2)?;
        let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
        expect_shape(op, "b", b, &[k, n])?;
        let c = c.broadcast_to(&[m, n]).map_err(|_| {
            BackendError::shape(
                op,
                format!("c {:?} does not broadcast to [{m}, {n}]", c.shape()),
            )
        })?;
        let out = self.empty(&[m, n], dtype)?;
        if beta != 0.0 {
            out.copy_from(&c)?; // C is read only when beta is non-zero (BLAS semantics).
        }
        if out.numel() == 0 {
            return Ok(out);
        }
        let pa = prepare(a, &[])?;
        let pb = prepare(b, &[])?;
        self.run_tunable(&TunableOp::Gemm(GemmDesc {
            dtype,
            trans_a: pb.trans,
            trans_b: pa.trans,
            m: n,
            n: m,
            k,
            alpha: super::optim::widen(alpha),
            a: pb.view.data_ptr(),
            lda: pb.ld,
            b: pa.view.data_ptr(),
            ldb: pa.ld,
            beta: super::optim::widen(beta),
            c: out.data_ptr(),
            ldc: n.max(1),
        }))?;
        Ok(out)
    }

    /// `alpha · a @ x + beta · y` for 2-D `a` (`m × n`), 1-D `x` (`n`) and 1-D `y` (`m`), into a new
    /// tensor, like `torch.addmv`. When `beta == 0`, `y` is not read. `ShapeMismatch` on bad shapes.
    pub fn gemv(
        &self,
        a: &Tensor,
        x: &Tensor,
        alpha: f32,
        y: &Tensor,
        beta: f32,
    ) -> Result<Tensor> {
        let op = "gemv";
        let dtype = self.check_operands(op, &[a, x, y])?;
        expect_rank(op, "a", a, 2)?;
        let (m, n) = (a.shape()[0], a.shape()[1]);
        expect_shape(op, "x", x, &[n])?;
        expect_shape(op, "y", y, &[m])?;
        let out = self.empty(&[m], dtype)?;
        if beta != 0.0 {
            out.copy_from(y)?;
        }
        if m == 0 {
            return Ok(out);
        }
        let pa = prepare(a, &[])?;
        // pa describes Aᵀ as op(stored): stored is n × m (row-major A) or m × n (column-major A).
        let (trans, sm, sn) = match pa.trans {
            Transpose::No => (Transpose::Yes, n, m),
            Transpose::Yes => (Transpose::No, m, n),
        };
        let x = if x.strides()[0] == 0 && n > 1 {
            x.contiguous()?.copy()?
        } else {
            x.clone()
        };
        let incx = if n <= 1 { 1 } else { x.strides()[0] };
        self.compute().gemv(&GemvDesc {
            dtype,
            trans,
            m: sm,
            n: sn,
            alpha: super::optim::widen(alpha),
            a: pa.view.data_ptr(),
            lda: pa.ld.max(sm.max(1)),
            x: x.data_ptr(),
            incx,
            beta: super::optim::widen(beta),
            y: out.data_ptr(),
            incy: 1,
        })?;
        Ok(out)
    }
}

impl Tensor {
    /// `self @ other` on this tensor's backend; see [`Backend::matmul`].
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.backend().matmul(self, other)
    }

    /// `alpha · self @ b + beta · c`; see [`Backend::gemm`].
    pub fn gemm(&self, b: &Tensor, alpha: f32, c: &Tensor, beta: f32) -> Result<Tensor> {
        self.backend().gemm(self, b, alpha, c, beta)
    }

    /// `alpha · self @ x + beta · y`; see [`Backend::gemv`].
    pub fn gemv(&self, x: &Tensor, alpha: f32, y: &Tensor, beta: f32) -> Result<Tensor> {
        self.backend().gemv(self, x, alpha, y, beta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_mapping() {
        // Row-major 3×4: stored column-major it is the 4×3 transpose with ld 4.
        assert_eq!(blas_operand(3, 4, 4, 1), Some((Transpose::No, 4)));
        // Its transposed view (4×3, strides (1, 4)) is column-major with ld 4.
        assert_eq!(blas_operand(4, 3, 1, 4), Some((Transpose::Yes, 4)));
        // Neither stride unit: needs a copy.
        assert_eq!(blas_operand(3, 4, 8, 2), None);
        assert_eq!(collapse_batch(&[2, 3], &[12, 4]), Some(4));
        assert_eq!(collapse_batch(&[2, 3], &[0, 0]), Some(0));
        assert_eq!(collapse_batch(&[2, 3], &[4, 0]), None);
        assert_eq!(collapse_batch(&[1, 3], &[99, 5]), Some(5));
    }
}
