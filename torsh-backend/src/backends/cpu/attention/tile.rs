//! The two products of a flash-attention step, as register tiles read in place: no packing, no
//! call into a GEMM library per step.
//!
//! Both are `C[r, j] = Σₜ L[t][r] · R[t, j]` with the left operand column-major (`L[t]` a column of
//! the query rows: the transposed query block, or the column-major probability tile) and the right
//! one read at any strides (a key block read as its transpose, or a value block). A tile holds
//! `MR` rows (two vector registers of the compute type) × `NR` columns (up to [`NR`]) in
//! registers: per step `t`, `MR / lanes` vector loads of `L[t]` and `NR` broadcast elements of `R`
//! make `MR · NR` multiply-adds, a GEMM microkernel's shape.
//!
//! Rows run in whole tiles up to the operands' padded row count (`ld`, a multiple of `MR`): the
//! lanes past the caller's rows compute values it never reads.

use crate::backends::cpu::host::Real;

/// The most columns of a register tile.
pub(super) const NR: usize = 6;

/// The right operand: `R[t, j] = data[t · t_stride + j · j_stride]`.
#[derive(Clone, Copy)]
pub(super) struct Rhs<'a, A> {
    pub data: &'a [A],
    pub t_stride: usize,
    pub j_stride: usize,
}

/// What a product does with the destination `C` (column-major, column stride `ld`).
#[derive(Clone, Copy)]
pub(super) enum Out<'a, A> {
    /// `C = L·R`.
    Store,
    /// `C = C · scale[r] + L·R`, the row scales given per row.
    Rescale(&'a [A]),
}

/// `C = L·R` (or its [`Out`] variant) into the first `cols` columns of `dst`, all `ld` rows, from
/// `lhs` (`k` columns of `ld` rows) and `rhs` (`k × cols`), in tiles of `MR` rows. `ld` must be a multiple of `MR`; `lhs` must hold `k · ld`
/// elements, `dst` `cols · ld`, `rhs` every `R[t, j]` read and a `Rescale` at least `ld` scales
/// (checked: a short operand panics, before any tile runs).
#[inline(always)]
pub(super) fn product<A: Real, const MR: usize>(
    lhs: &[A],
    rhs: Rhs<'_, A>,
    k: usize,
    cols: usize,
    dst: &mut [A],
    ld: usize,
    out: Out<'_, A>,
) {
    assert!(ld.is_multiple_of(MR) && lhs.len() >= k * ld && dst.len() >= cols * ld);
    if k > 0 && cols > 0 {
        let last = (k - 1) * rhs.t_stride + (cols - 1) * rhs.j_stride;
        assert!(
            last < rhs.data.len(),
            "the right operand is shorter than its strides reach"
        );
    }
    if let Out::Rescale(scale) = out {
        assert!(scale.len() >= ld);
    }
    let mut j0 = 0;
    while j0 < cols {
        let n = (cols - j0).min(NR);
        for r0 in (0..ld).step_by(MR) {
            match n {
                6 => tile::<A, MR, 6>(lhs, rhs, k, ld, r0, j0, dst, out),
                5 => tile::<A, MR, 5>(lhs, rhs, k, ld, r0, j0, dst, out),
                4 => tile::<A, MR, 4>(lhs, rhs, k, ld, r0, j0, dst, out),
                3 => tile::<A, MR, 3>(lhs, rhs, k, ld, r0, j0, dst, out),
                2 => tile::<A, MR, 2>(lhs, rhs, k, ld, r0, j0, dst, out),
                _ => tile::<A, MR, 1>(lhs, rhs, k, ld, r0, j0, dst, out),
            }
        }
        j0 += n;
    }
}

/// One `MR × N` tile of [`product`] at rows `r0 ..`, columns `j0 ..` (bounds checked there).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<A: Real, const MR: usize, const N: usize>(
    lhs: &[A],
    rhs: Rhs<'_, A>,
    k: usize,
    ld: usize,
    r0: usize,
    j0: usize,
    dst: &mut [A],
    out: Out<'_, A>,
) {
    let acc = sums::<A, MR, N>(lhs, rhs, k, ld, r0, j0);
    // The scales as an array before the stores: indexing the slice among them kept LLVM from
    // holding the sums in registers.
    let scale: Option<[A; MR]> = match out {
        Out::Store => None,
        Out::Rescale(scale) => Some(std::array::from_fn(|i| scale[r0 + i])),
    };
    for (j, acc) in acc.iter().enumerate() {
        let c = &mut dst[(j0 + j) * ld + r0..][..MR];
        match scale {
            None => c.copy_from_slice(acc),
            Some(scale) => {
                for i in 0..MR {
                    c[i] = c[i].mul_add(scale[i], acc[i]);
                }
            }
        }
    }
}

/// The register tile of [`tile`]: `acc[j][i] = Σₜ L[t][r0 + i] · R[t, j0 + j]`.
#[inline(always)]
fn sums<A: Real, const MR: usize, const N: usize>(
    lhs: &[A],
    rhs: Rhs<'_, A>,
    k: usize,
    ld: usize,
    r0: usize,
    j0: usize,
) -> [[A; MR]; N] {
    let mut acc = [[A::ZERO; MR]; N];
    // A column stride the compiler cannot see as 1 (the value block's): it would otherwise load
    // neighbouring elements together and split them by shuffles, which take the FMA ports.
    let js = std::hint::black_box(rhs.j_stride);
    let first = rhs.data.as_ptr().wrapping_add(j0 * js);
    let columns: [*const A; N] = std::array::from_fn(|j| first.wrapping_add(j * js));
    let mut l = lhs.as_ptr().wrapping_add(r0);
    let mut at = 0;
    for _ in 0..k {
        // SAFETY: column t of lhs (t < k) holds rows r0 .. r0 + MR ≤ ld, inside its k · ld
        // elements (checked in `product`); every R[t, j0 + j] read lies inside rhs (its last
        // element checked there too).
        let (x, b): (&[A; MR], [A; N]) = unsafe {
            (
                &*l.cast::<[A; MR]>(),
                std::array::from_fn(|j| *columns[j].add(at)),
            )
        };
        for (acc, &b) in acc.iter_mut().zip(&b) {
            for (a, &x) in acc.iter_mut().zip(x) {
                *a = x.mul_add(b, *a);
            }
        }
        l = l.wrapping_add(ld);
        at += rhs.t_stride;
    }
    acc
}
