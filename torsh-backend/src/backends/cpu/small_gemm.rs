//! GEMMs small enough that packing the operands costs more than it saves: register tiles that
//! read A and B where they lie.
//!
//! The `gemm` crate packs panels of both operands into contiguous buffers before its
//! microkernels run, and dispatches through several layers for every call; at 64³ that is about
//! a tenth of the call. Here a product whose inner dimension keeps a panel of B in L1
//! ([`MAX_K`]) and whose output is small ([`MAX_OUTPUT`]) runs as tiles of [`ROWS`] rows of C by
//! a few vectors of columns: per step of `k`, the tile's vectors of B's row are loaded once and
//! each row's element of A is broadcast against them. Every element of C sums its `k` products in
//! order with one fused multiply-add each.
//!
//! Only the x86-64 vector levels take this path (AVX-512: 6 × 4 vectors of accumulators, AVX2's
//! sixteen registers: 6 × 2); at other levels [`run`] declines and the crate runs the product.

use super::blas::Call;
use super::host::Real;
use super::simd::SimdLevel;
use super::vector::{on_vectors, Registers, Step, Vector};

/// The largest inner dimension this path takes: a column block's panel of B, `k` rows of four
/// 512-bit vectors, is then at most 32 KiB and stays in L1 while the row tiles pass over it.
pub(crate) const MAX_K: usize = 128;

/// The most elements of C this path takes: beyond it the packed kernels' reuse of their panels
/// pays for the packing.
pub(crate) const MAX_OUTPUT: usize = 32 * 1024;

/// Rows of C per register tile.
const ROWS: usize = 6;

/// A product in the form the tiles take: `dst = alpha·lhs·rhs`, plus `beta·dst` when `read_dst`,
/// with `dst` and `rhs` contiguous along their rows (column stride 1) and `lhs` at any strides.
#[derive(Clone, Copy)]
struct Product<A> {
    m: usize,
    n: usize,
    k: usize,
    dst: *mut A,
    dst_row: isize,
    lhs: *const A,
    lhs_strides: (isize, isize),
    rhs: *const A,
    rhs_row: isize,
    alpha: A,
    beta: A,
    read_dst: bool,
}

impl<A: Copy> Product<A> {
    /// `call` in this form, taken as is when its `dst` and `rhs` have unit column strides, or
    /// transposed (`Cᵀ = Bᵀ·Aᵀ`) when its `dst` and `lhs` have unit row strides; `None` when
    /// neither holds, the product is outside [`MAX_K`] and [`MAX_OUTPUT`], or it would have one
    /// column.
    fn of(call: &Call<A>) -> Option<Product<A>> {
        if call.k > MAX_K || call.m.saturating_mul(call.n) > MAX_OUTPUT {
            return None;
        }
        let common = |m, n, dst_row, lhs, lhs_strides, rhs, rhs_row| Product {
            m,
            n,
            k: call.k,
            dst: call.dst,
            dst_row,
            lhs,
            lhs_strides,
            rhs,
            rhs_row,
            alpha: call.alpha,
            beta: call.beta,
            read_dst: call.read_dst,
        };
        let product = if call.dst_strides.1 == 1 && call.rhs_strides.1 == 1 {
            common(
                call.m,
                call.n,
                call.dst_strides.0,
                call.lhs,
                call.lhs_strides,
                call.rhs,
                call.rhs_strides.0,
            )
        } else if call.dst_strides.0 == 1 && call.lhs_strides.0 == 1 {
            common(
                call.n,
                call.m,
                call.dst_strides.1,
                call.rhs,
                (call.rhs_strides.1, call.rhs_strides.0),
                call.lhs,
                call.lhs_strides.1,
            )
        } else {
            return None;
        };
        // A matrix-vector product (one column of the tiles' row-contiguous C) would use one lane
        // of each vector: the crate's matrix-vector path is faster.
        (product.n > 1).then_some(product)
    }
}

/// Runs `call` on the register tiles of `simd` and returns true, or returns false without
/// touching anything when this path does not take it (see the module doc).
///
/// # Safety
/// As [`Call::run`](super::blas::Call): every pointer with its strides and sizes addresses memory
/// valid for the access, and dst overlaps neither input. `simd` is a level this CPU has.
pub(crate) unsafe fn run<A: Registers>(call: &Call<A>, simd: SimdLevel) -> bool {
    let wide = match simd {
        SimdLevel::Avx512 => true,
        SimdLevel::Avx2Fma => false,
        _ => return false,
    };
    let Some(product) = Product::of(call) else {
        return false;
    };
    // SAFETY: the caller's contract, at a level `on_vectors` provides.
    unsafe { on_vectors(simd, Tiles { product, wide }) };
    true
}

/// The whole product, as a [`Step`] over the level's vectors: four vectors of columns per tile
/// when `wide` (32 registers), two otherwise (16).
struct Tiles<A> {
    product: Product<A>,
    wide: bool,
}

impl<A: Real> Step<A> for Tiles<A> {
    type Out = ();

    #[inline(always)]
    unsafe fn run<V: Vector<A>>(self) {
        // SAFETY (both): the step's contract, which [`run`] states.
        if self.wide {
            unsafe { columns::<A, V, 4>(&self.product) }
        } else {
            unsafe { columns::<A, V, 2>(&self.product) }
        }
    }
}

/// Every column block of `p`: blocks of `WIDE` vectors, then single vectors, the last one
/// partial; each block over all rows before the next, so its panel of B stays in L1.
///
/// # Safety
/// As [`run`], at the level of `V`.
#[inline(always)]
unsafe fn columns<A: Real, V: Vector<A>, const WIDE: usize>(p: &Product<A>) {
    let lanes = V::LANES;
    let mut j = 0;
    while p.n - j >= WIDE * lanes {
        // SAFETY (all three): columns `j ..` of the block are inside `0 .. n`.
        unsafe { rows::<A, V, WIDE>(p, j, lanes) };
        j += WIDE * lanes;
    }
    while p.n - j >= lanes {
        unsafe { rows::<A, V, 1>(p, j, lanes) };
        j += lanes;
    }
    if j < p.n {
        unsafe { rows::<A, V, 1>(p, j, p.n - j) };
    }
}

/// Columns `j .. j + (VECTORS − 1)·LANES + last` of `p` over every row: tiles of [`ROWS`] rows,
/// then of 4, 2 and 1 for the rest.
///
/// # Safety
/// As [`run`], at the level of `V`; the columns are inside `0 .. n` and `1 ≤ last ≤ LANES`.
#[inline(always)]
unsafe fn rows<A: Real, V: Vector<A>, const VECTORS: usize>(p: &Product<A>, j: usize, last: usize) {
    let mut i = 0;
    // SAFETY (all four): rows `i ..` of each tile are inside `0 .. m`.
    while p.m - i >= ROWS {
        unsafe { tile::<A, V, ROWS, VECTORS>(p, i, j, last) };
        i += ROWS;
    }
    if p.m - i >= 4 {
        unsafe { tile::<A, V, 4, VECTORS>(p, i, j, last) };
        i += 4;
    }
    if p.m - i >= 2 {
        unsafe { tile::<A, V, 2, VECTORS>(p, i, j, last) };
        i += 2;
    }
    if p.m > i {
        unsafe { tile::<A, V, 1, VECTORS>(p, i, j, last) };
    }
}

/// One register tile: rows `i .. i + R` of C at columns `j ..`, `VECTORS` vectors wide, the last
/// holding `last` columns (masked loads and stores when fewer than `LANES`).
///
/// # Safety
/// As [`rows`], with rows `i .. i + R` inside `0 .. m`.
#[inline(always)]
unsafe fn tile<A: Real, V: Vector<A>, const R: usize, const VECTORS: usize>(
    p: &Product<A>,
    i: usize,
    j: usize,
    last: usize,
) {
    let partial = last < V::LANES;
    // SAFETY: every pointer below stays inside the operands by the caller's bounds: row `i + r`
    // of lhs and dst, rows `0 .. k` of rhs, columns `j .. j + (VECTORS − 1)·LANES + last`.
    unsafe {
        let lhs = p.lhs.offset(i as isize * p.lhs_strides.0);
        let mut acc = [[V::zero(); VECTORS]; R];
        for q in 0..p.k {
            let row = p.rhs.offset(q as isize * p.rhs_row).add(j);
            let mut b = [V::zero(); VECTORS];
            for (v, b) in b.iter_mut().enumerate() {
                *b = if partial && v == VECTORS - 1 {
                    V::load_first(row.add(v * V::LANES), last)
                } else {
                    V::load(row.add(v * V::LANES))
                };
            }
            let a_col = lhs.offset(q as isize * p.lhs_strides.1);
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = V::splat(a_col.offset(r as isize * p.lhs_strides.0).read());
                for (acc, &b) in acc.iter_mut().zip(&b) {
                    *acc = a.mul_add(b, *acc);
                }
            }
        }
        let scaled = p.alpha != A::ONE;
        let alpha = V::splat(p.alpha);
        let beta = V::splat(p.beta);
        for (r, acc) in acc.iter().enumerate() {
            let out = p.dst.offset((i + r) as isize * p.dst_row).add(j);
            for (v, &acc) in acc.iter().enumerate() {
                let at = out.add(v * V::LANES);
                let lanes = if v == VECTORS - 1 { last } else { V::LANES };
                let mut value = if scaled { acc.mul(alpha) } else { acc };
                if p.read_dst {
                    let old = if lanes < V::LANES {
                        V::load_first(at, lanes)
                    } else {
                        V::load(at)
                    };
                    value = old.mul_add(beta, value);
                }
                if lanes < V::LANES {
                    value.store_first(at, lanes);
                } else {
                    value.store(at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::cpu::reduce::tests::{check, random};
    use crate::dtype::DType;

    /// One product of `m × k` by `k × n` at `simd` through [`run`], against an f64 sum of the same
    /// values: C and B row-major (the tiles' own form) with A row- or column-major (`transposed`),
    /// or C and A column-major (the transposed form) with B row- or column-major, every leading
    /// dimension padded, `beta` 0 (C poisoned with NaN, not read) or not. Returns whether the
    /// tiles took it; the padding of C must be left as it was.
    fn product<A: Registers>(
        dtype: DType,
        simd: SimdLevel,
        (m, n, k): (usize, usize, usize),
        transposed: bool,
        row_major: bool,
        beta: f64,
    ) -> bool {
        let cast = |v: &[f64]| v.iter().map(|&x| A::from_f64(x)).collect::<Vec<A>>();
        let (rows_a, cols_a) = ((k + 2, 1), (1, m + 3));
        let (rows_b, cols_b) = ((n + 1, 1), (1, k + 1));
        let (a_strides, b_strides, c_strides) = match (row_major, transposed) {
            (true, false) => (rows_a, rows_b, (n + 5, 1)),
            (true, true) => (cols_a, rows_b, (n + 5, 1)),
            (false, false) => (cols_a, rows_b, (1, m + 5)),
            (false, true) => (cols_a, cols_b, (1, m + 5)),
        };
        let at = |(r, s): (usize, usize), i: usize, j: usize| i * r + j * s;
        let (a_len, b_len, c_len) = (
            at(a_strides, m - 1, k - 1) + 1,
            at(b_strides, k - 1, n - 1) + 1,
            at(c_strides, m - 1, n - 1) + 1,
        );
        let (a, b) = (cast(&random(a_len, 1)), cast(&random(b_len, 2)));
        let c0 = if beta == 0.0 {
            vec![A::from_f64(f64::NAN); c_len]
        } else {
            cast(&random(c_len, 3))
        };
        let mut c = c0.clone();
        // Both the scaled store and the unscaled one (alpha 1, every matmul's).
        let alpha = if transposed { 1.0 } else { 0.75 };
        let signed = |(r, s): (usize, usize)| (r as isize, s as isize);
        let call = Call {
            m,
            n,
            k,
            dst: c.as_mut_ptr(),
            dst_strides: signed(c_strides),
            lhs: a.as_ptr(),
            lhs_strides: signed(a_strides),
            rhs: b.as_ptr(),
            rhs_strides: signed(b_strides),
            alpha: A::from_f64(alpha),
            beta: A::from_f64(beta),
            read_dst: beta != 0.0,
            simd,
        };
        // SAFETY: the buffers hold every element the strides reach; C is its own vector.
        if !unsafe { run(&call, simd) } {
            return false;
        }
        let (mut got, mut want) = (Vec::new(), Vec::new());
        let mut written = vec![false; c_len];
        for i in 0..m {
            for j in 0..n {
                let sum: f64 = (0..k)
                    .map(|p| a[at(a_strides, i, p)].to_f64() * b[at(b_strides, p, j)].to_f64())
                    .sum();
                let c_at = at(c_strides, i, j);
                let old = if beta == 0.0 {
                    0.0
                } else {
                    beta * c0[c_at].to_f64()
                };
                got.push(c[c_at].to_f64());
                want.push(alpha * sum + old);
                written[c_at] = true;
            }
        }
        let what =
            format!("{dtype:?} {simd:?} {m}×{n}×{k} transposed {transposed} rows {row_major}");
        check(dtype, &got, &want, &what);
        for (e, (&o, &was)) in c.iter().zip(&c0).enumerate() {
            if !written[e] {
                assert!(
                    o.to_f64().to_bits() == was.to_f64().to_bits(),
                    "{what}: padding element {e} written"
                );
            }
        }
        true
    }

    /// The x86 levels this CPU runs, which the tiles take.
    fn levels() -> Vec<SimdLevel> {
        SimdLevel::runnable()
            .into_iter()
            .filter(|l| matches!(l, SimdLevel::Avx512 | SimdLevel::Avx2Fma))
            .collect()
    }

    /// Odd sizes around every tile edge (rows 1–7 and 13 around 6; columns around one, two and
    /// four vectors of 4, 8 and 16 lanes; `k` 1 and up to [`MAX_K`]), in both forms, with and
    /// without `beta`, at every level, in f32 and f64.
    #[test]
    fn tiles_match_an_f64_sum() {
        let shapes = [
            (1, 2, 1),
            (2, 1, 4),
            (2, 3, 2),
            (3, 5, 7),
            (5, 7, 3),
            (6, 8, 16),
            (7, 9, 5),
            (13, 17, 31),
            (6, 31, 1),
            (11, 33, 64),
            (64, 64, 64),
            (17, 65, 128),
            (4, 97, 13),
        ];
        for simd in levels() {
            for &shape in &shapes {
                for (transposed, row_major, beta) in [
                    (false, true, 0.0),
                    (true, true, 0.5),
                    (false, false, 1.0),
                    (true, false, 0.0),
                ] {
                    let f32_taken =
                        product::<f32>(DType::F32, simd, shape, transposed, row_major, beta);
                    let f64_taken =
                        product::<f64>(DType::F64, simd, shape, transposed, row_major, beta);
                    // The tiles' columns are C's columns in the row-major form, its rows in
                    // the other: one of them is a matrix-vector product, which they decline.
                    let one_column = if row_major { shape.1 } else { shape.0 } == 1;
                    assert_eq!(f32_taken, !one_column, "f32 {shape:?} rows {row_major}");
                    assert_eq!(f64_taken, !one_column, "f64 {shape:?} rows {row_major}");
                }
            }
        }
    }

    /// The tiles decline, touching nothing, outside their sizes and layouts and at levels
    /// without x86 vectors.
    #[test]
    fn tiles_decline_what_they_do_not_take() {
        for simd in levels() {
            let f32_product =
                |shape, a_t, rows| product::<f32>(DType::F32, simd, shape, a_t, rows, 0.0);
            assert!(!f32_product((8, 8, MAX_K + 1), false, true), "k past MAX_K");
            assert!(
                !f32_product((200, 200, 8), false, true),
                "output past MAX_OUTPUT"
            );
            assert!(!f32_product((9, 1, 8), false, true), "one column");
            assert!(
                !f32_product((1, 9, 8), true, false),
                "one row, transposed form"
            );
        }
        assert!(!product::<f32>(
            DType::F32,
            SimdLevel::Scalar,
            (8, 8, 8),
            false,
            true,
            0.0
        ));
        // Neither C's rows with B's nor C's columns with A's contiguous.
        let (a, b) = (vec![1f32; 64], vec![1f32; 64]);
        let mut c = vec![f32::NAN; 64];
        let call = Call {
            m: 4,
            n: 4,
            k: 4,
            dst: c.as_mut_ptr(),
            dst_strides: (1, 8),
            lhs: a.as_ptr(),
            lhs_strides: (8, 1),
            rhs: b.as_ptr(),
            rhs_strides: (8, 1),
            alpha: 1.0,
            beta: 0.0,
            read_dst: false,
            simd: SimdLevel::detect(),
        };
        // SAFETY: every stride stays inside the 64-element buffers.
        assert!(!unsafe { run(&call, call.simd) });
        assert!(c.iter().all(|x| x.is_nan()));
    }
}
