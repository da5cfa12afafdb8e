//! The two products of a flash-attention step, as register tiles read in place: no packing, no
//! call into a GEMM library per step.
//!
//! Both are `C[r, j] = Σₜ L[t][r] · R[t, j]` with the left operand column-major (`L[t]` a column of
//! the query rows: the transposed query block, or the column-major probability tile) and the right
//! one read at any strides (a key block read as its transpose, or a value block). A tile holds
//! `MR = NV · V::LANES` rows (`NV` vector registers [`Vector`] of the level, one or two) × `NR`
//! columns (up to `NR`) in registers: per step `t`, `NV` vector loads of `L[t]` and `NR`
//! broadcast elements of `R` make `MR · NR` multiply-adds, a GEMM microkernel's shape. With 16
//! vector registers a tile is two vectors × [`NR_16`] columns; with AVX-512's 32, four vectors ×
//! [`NR_4V`] columns (two × [`NR_32`] where the query block has at most two vectors of rows).
//!
//! Rows run in whole tiles up to the operands' padded row count (`ld`, a multiple of `MR`): the
//! lanes past the caller's rows compute values it never reads.

use crate::backends::cpu::host::Real;
use crate::backends::cpu::vector::Vector;

/// The most columns of a register tile with 16 vector registers (12 accumulators of two vectors).
pub(super) const NR_16: usize = 6;

/// The most columns of a two-vector register tile with 32 vector registers (AVX-512).
pub(super) const NR_32: usize = 8;

/// The most columns of a four-vector register tile with 32 vector registers (AVX-512): 24
/// accumulators, the four row vectors and a broadcast take 29 of them. Per step, 4 loads and 6
/// broadcasts feed 24 multiply-adds (the two-vector tile's 2 and 8 feed 16), so the address
/// arithmetic and loads no longer crowd the multiply-adds out of the front end.
pub(super) const NR_4V: usize = 6;

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
/// `lhs` (`k` columns of `ld` rows) and `rhs` (`k × cols`), in tiles of `MR = NV · V::LANES` rows
/// and up to `NR` columns. `ld` must be a multiple of `MR`; `lhs` must hold `k · ld` elements,
/// `dst` `cols · ld`, `rhs` every `R[t, j]` read and a `Rescale` at least `ld` scales (checked: a
/// short operand panics, before any tile runs).
///
/// # Safety
/// As [`Vector`]'s methods for `V`.
#[inline(always)]
pub(super) unsafe fn product<A: Real, V: Vector<A>, const NV: usize, const NR: usize>(
    lhs: &[A],
    rhs: Rhs<'_, A>,
    k: usize,
    cols: usize,
    dst: &mut [A],
    ld: usize,
    out: Out<'_, A>,
) {
    // The widths below go up to 8: a wider NR would leave columns of its tiles unwritten.
    const {
        assert!(
            NR >= 1 && NR <= 8,
            "tile widths are dispatched up to 8 columns"
        )
    };
    let mr = NV * V::LANES;
    assert!(ld.is_multiple_of(mr) && lhs.len() >= k * ld && dst.len() >= cols * ld);
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
        for r0 in (0..ld).step_by(mr) {
            let at = (r0, j0);
            // The widths up to 8 (NR at most, checked above), each NR's full tile among them.
            match n {
                8 => tile::<A, V, NV, 8>(lhs, rhs, k, ld, at, dst, out),
                7 => tile::<A, V, NV, 7>(lhs, rhs, k, ld, at, dst, out),
                6 => tile::<A, V, NV, 6>(lhs, rhs, k, ld, at, dst, out),
                5 => tile::<A, V, NV, 5>(lhs, rhs, k, ld, at, dst, out),
                4 => tile::<A, V, NV, 4>(lhs, rhs, k, ld, at, dst, out),
                3 => tile::<A, V, NV, 3>(lhs, rhs, k, ld, at, dst, out),
                2 => tile::<A, V, NV, 2>(lhs, rhs, k, ld, at, dst, out),
                _ => tile::<A, V, NV, 1>(lhs, rhs, k, ld, at, dst, out),
            }
        }
        j0 += n;
    }
}

/// One `MR × N` tile of [`product`] at rows `r0 ..`, columns `j0 ..` (bounds checked there).
///
/// # Safety
/// As [`Vector`]'s methods for `V`.
#[inline(always)]
unsafe fn tile<A: Real, V: Vector<A>, const NV: usize, const N: usize>(
    lhs: &[A],
    rhs: Rhs<'_, A>,
    k: usize,
    ld: usize,
    (r0, j0): (usize, usize),
    dst: &mut [A],
    out: Out<'_, A>,
) {
    let acc = sums::<A, V, NV, N>(lhs, rhs, k, ld, r0, j0);
    let scale = match out {
        Out::Store => None,
        Out::Rescale(scale) => {
            let mut v = [V::zero(); NV];
            for (i, v) in v.iter_mut().enumerate() {
                // SAFETY: rows r0 + i·LANES .. + LANES ≤ ld ≤ scale.len() (checked in `product`).
                *v = V::load(scale.as_ptr().add(r0 + i * V::LANES));
            }
            Some(v)
        }
    };
    for (j, acc) in acc.iter().enumerate() {
        let c = dst[(j0 + j) * ld + r0..][..NV * V::LANES].as_mut_ptr();
        for (i, &a) in acc.iter().enumerate() {
            // SAFETY: vector i covers rows r0 + i·LANES .. + LANES of the column's MR rows.
            let c = c.add(i * V::LANES);
            let a = match scale {
                None => a,
                Some(scale) => V::load(c).mul_add(scale[i], a),
            };
            a.store(c);
        }
    }
}

/// The register tile of [`tile`]: `acc[j][v]` holds rows `r0 + v·LANES ..` of column `j0 + j`,
/// `Σₜ L[t][r] · R[t, j0 + j]`.
///
/// # Safety
/// As [`Vector`]'s methods for `V`; the bounds are checked in [`product`].
#[inline(always)]
unsafe fn sums<A: Real, V: Vector<A>, const NV: usize, const N: usize>(
    lhs: &[A],
    rhs: Rhs<'_, A>,
    k: usize,
    ld: usize,
    r0: usize,
    j0: usize,
) -> [[V; NV]; N] {
    let mut acc = [[V::zero(); NV]; N];
    // A column stride the compiler cannot see as 1 (the value block's): it would otherwise load
    // neighbouring elements together and split them by shuffles, which take the FMA ports.
    let js = std::hint::black_box(rhs.j_stride);
    let first = rhs.data.as_ptr().wrapping_add(j0 * js);
    let mut l = lhs.as_ptr().wrapping_add(r0);
    let mut at = 0;
    for _ in 0..k {
        // SAFETY: column t of lhs (t < k) holds rows r0 .. r0 + MR ≤ ld, inside its k · ld
        // elements (checked in `product`); every R[t, j0 + j] read lies inside rhs (its last
        // element checked there too).
        let mut x = [V::zero(); NV];
        for (i, x) in x.iter_mut().enumerate() {
            *x = V::load(l.add(i * V::LANES));
        }
        for (j, acc) in acc.iter_mut().enumerate() {
            let b = V::splat(*first.add(j * js + at));
            for (a, &x) in acc.iter_mut().zip(&x) {
                *a = x.mul_add(b, *a);
            }
        }
        l = l.wrapping_add(ld);
        at += rhs.t_stride;
    }
    acc
}
