//! SIMD registers as types, for register tiles that must stay in registers whatever the compiler
//! decides about a loop.
//!
//! Most CPU kernels are plain loops over arrays that LLVM vectorises inside [`with_simd`]. A
//! register tile (a GEMM-like microkernel: a few vectors of accumulators × a few broadcast inputs)
//! is where that is brittle: the same source vectorised along the wrong dimension, or not at all,
//! for some tile sizes and not others (the direct convolution's f32 tiles of 16 and 32 channels
//! by 8, 12 or 14 pixels ran scalar under AVX-512, 10–20× slower, while the same source at 6 or 10
//! pixels, and every AVX2 tile, vectorised). A [`Vector`] is
//! one register of the machine's vectors, or a portable array where the level has none, so a tile
//! written over it is the same instruction sequence at every size.
//!
//! [`with_simd`]: super::host::with_simd

use super::host::{with_simd, Real};
use super::simd::SimdLevel;

/// One SIMD register of `LANES` elements of `A`.
///
/// # Safety
/// Every method may execute instructions of the type's target features: call them only in code
/// compiled with those features (inside [`with_simd`](super::host::with_simd) at the
/// [`SimdLevel`](super::simd::SimdLevel) the type belongs to) on a CPU that has them. `load` and
/// `store` take `LANES` elements at the pointer, which need no alignment.
pub(crate) trait Vector<A>: Copy {
    /// Elements per register.
    const LANES: usize;
    /// Every lane zero.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn zero() -> Self;
    /// Every lane `x`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn splat(x: A) -> Self;
    /// `LANES` elements from `p`.
    ///
    /// # Safety
    /// See the trait; `p .. p + LANES` is readable.
    unsafe fn load(p: *const A) -> Self;
    /// Lanes `0 .. n` from `p .. p + n` and zero in the others, reading nothing past them (a
    /// masked load where the level has one).
    ///
    /// # Safety
    /// See the trait; `n ≤ LANES` and `p .. p + n` is readable.
    unsafe fn load_first(p: *const A, n: usize) -> Self;
    /// A set of lanes for [`Vector::load_lanes`] in the level's own form (a mask register where
    /// it has one), made once by [`Vector::lanes`] for many loads.
    type Lanes: Copy;
    /// The lanes `lo .. hi`, each bound cut to `LANES`: none where `lo ≥ hi`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn lanes(lo: usize, hi: usize) -> Self::Lanes;
    /// Lane `l` from `p + l` for each lane `l` of `lanes` and zero in the others, reading
    /// nothing else (a masked load where the level has one). `p` itself need not point inside
    /// the allocation the lanes read: a vector may start before a row and take only its lanes
    /// inside it.
    ///
    /// # Safety
    /// See the trait; `p + l` is readable for every lane `l` of `lanes`.
    unsafe fn load_lanes(p: *const A, lanes: Self::Lanes) -> Self;
    /// Writes the lanes to `p .. p + LANES`.
    ///
    /// # Safety
    /// See the trait; `p .. p + LANES` is writable.
    unsafe fn store(self, p: *mut A);
    /// Writes lanes `0 .. n` to `p .. p + n`, leaving the memory past them untouched (a masked
    /// store on AVX-512; on AVX2 plain stores of 4, 2 and 1 lanes, which AMD's cores run far
    /// faster than its masked store).
    ///
    /// # Safety
    /// See the trait; `n ≤ LANES` and `p .. p + n` is writable.
    unsafe fn store_first(self, p: *mut A, n: usize);
    /// The even and the odd elements of the `2·LANES` at `p`: `(p[0], p[2], …)` and `(p[1],
    /// p[3], …)`.
    ///
    /// # Safety
    /// See the trait; `p .. p + 2·LANES` is readable.
    unsafe fn deinterleave(p: *const A) -> (Self, Self);
    /// `self · a + b` per lane, rounded once.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn mul_add(self, a: Self, b: Self) -> Self;
    /// `self + a` per lane.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn add(self, a: Self) -> Self;
    /// `self − a` per lane.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn sub(self, a: Self) -> Self;
    /// `self · a` per lane.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn mul(self, a: Self) -> Self;
    /// The larger of `self` and `a` per lane, NaN where either is NaN.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn max(self, a: Self) -> Self;
    /// Writes the transpose of the `LANES × LANES` block at `src` (row `i` at `src + i·src_row`)
    /// to `dst` (row `j` at `dst + j·dst_row`): `dst[j][i] = src[i][j]`.
    ///
    /// # Safety
    /// See the trait; the rows are readable and writable, and the blocks do not overlap.
    unsafe fn transpose(src: *const A, src_row: usize, dst: *mut A, dst_row: usize);
}

/// `N` lanes as an array, for levels without vector types here (the scalar path, NEON) and for
/// tiles of a width the level's registers do not divide: loops the compiler may vectorise.
#[derive(Clone, Copy)]
pub(crate) struct Portable<A, const N: usize>([A; N]);

impl<A: Real, const N: usize> Vector<A> for Portable<A, N> {
    const LANES: usize = N;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Portable([A::ZERO; N])
    }

    #[inline(always)]
    unsafe fn splat(x: A) -> Self {
        Portable([x; N])
    }

    #[inline(always)]
    unsafe fn load(p: *const A) -> Self {
        Portable(p.cast::<[A; N]>().read_unaligned())
    }

    #[inline(always)]
    unsafe fn load_first(p: *const A, n: usize) -> Self {
        let mut lanes = [A::ZERO; N];
        for (l, x) in lanes.iter_mut().enumerate().take(n) {
            *x = p.add(l).read();
        }
        Portable(lanes)
    }

    type Lanes = (usize, usize);

    #[inline(always)]
    unsafe fn lanes(lo: usize, hi: usize) -> (usize, usize) {
        (lo.min(N), hi.min(N))
    }

    #[inline(always)]
    unsafe fn load_lanes(p: *const A, (lo, hi): (usize, usize)) -> Self {
        let mut lanes = [A::ZERO; N];
        for (l, x) in lanes.iter_mut().enumerate().take(hi).skip(lo) {
            *x = p.wrapping_add(l).read();
        }
        Portable(lanes)
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut A) {
        p.cast::<[A; N]>().write_unaligned(self.0)
    }

    #[inline(always)]
    unsafe fn store_first(self, p: *mut A, n: usize) {
        for (l, &x) in self.0.iter().enumerate().take(n) {
            p.add(l).write(x);
        }
    }

    #[inline(always)]
    unsafe fn deinterleave(p: *const A) -> (Self, Self) {
        let (mut even, mut odd) = ([A::ZERO; N], [A::ZERO; N]);
        for l in 0..N {
            even[l] = p.add(2 * l).read();
            odd[l] = p.add(2 * l + 1).read();
        }
        (Portable(even), Portable(odd))
    }

    #[inline(always)]
    unsafe fn mul_add(self, a: Self, b: Self) -> Self {
        let mut out = b.0;
        for ((o, &x), &y) in out.iter_mut().zip(&self.0).zip(&a.0) {
            *o = x.mul_add(y, *o);
        }
        Portable(out)
    }

    #[inline(always)]
    unsafe fn add(mut self, a: Self) -> Self {
        for (x, &y) in self.0.iter_mut().zip(&a.0) {
            *x += y;
        }
        self
    }

    #[inline(always)]
    unsafe fn sub(mut self, a: Self) -> Self {
        for (x, &y) in self.0.iter_mut().zip(&a.0) {
            *x = *x - y;
        }
        self
    }

    #[inline(always)]
    unsafe fn mul(mut self, a: Self) -> Self {
        for (x, &y) in self.0.iter_mut().zip(&a.0) {
            *x = *x * y;
        }
        self
    }

    #[inline(always)]
    unsafe fn max(mut self, a: Self) -> Self {
        for (x, &y) in self.0.iter_mut().zip(&a.0) {
            // A NaN `x` stays: no comparison with it is true.
            *x = if (y > *x) | y.is_nan() { y } else { *x };
        }
        self
    }

    #[inline(always)]
    unsafe fn transpose(src: *const A, src_row: usize, dst: *mut A, dst_row: usize) {
        for i in 0..N {
            for j in 0..N {
                dst.add(j * dst_row + i)
                    .write(src.add(i * src_row + j).read());
            }
        }
    }
}

/// `dst[j · dst_row + i] = src[i · src_row + j]` for `i < rows`, `j < cols`: the transpose of a
/// `rows × cols` block, by [`Vector::transpose`] in whole `LANES × LANES` tiles and element by
/// element at the ragged edges. Panics, before writing anything, when `src` or `dst` is shorter
/// than the block reaches or the two strides do not keep the rows of a tile apart.
///
/// # Safety
/// As [`Vector`]'s methods for `V`.
#[inline(always)]
pub(crate) unsafe fn transpose_block<A: Copy, V: Vector<A>>(
    src: &[A],
    src_row: usize,
    dst: &mut [A],
    dst_row: usize,
    rows: usize,
    cols: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        src_row >= cols
            && dst_row >= rows
            && src.len() >= (rows - 1) * src_row + cols
            && dst.len() >= (cols - 1) * dst_row + rows,
        "a transposed block outside its operands"
    );
    let l = V::LANES;
    for i0 in (0..rows).step_by(l) {
        for j0 in (0..cols).step_by(l) {
            if i0 + l <= rows && j0 + l <= cols {
                // SAFETY: the tile's rows i0 .. i0 + l of src (columns j0 .. j0 + l) and rows
                // j0 .. j0 + l of dst (columns i0 .. i0 + l) lie inside the slices, checked above;
                // src and dst are distinct borrows.
                unsafe {
                    V::transpose(
                        src.as_ptr().add(i0 * src_row + j0),
                        src_row,
                        dst.as_mut_ptr().add(j0 * dst_row + i0),
                        dst_row,
                    );
                }
                continue;
            }
            for i in i0..(i0 + l).min(rows) {
                for j in j0..(j0 + l).min(cols) {
                    dst[j * dst_row + i] = src[i * src_row + j];
                }
            }
        }
    }
}

/// Lanes of the portable vectors [`on_vectors`] runs a step on at levels without vector types
/// here.
pub(crate) const PORTABLE_LANES: usize = 4;

/// A piece of a kernel written over a vector type, which [`on_vectors`] runs on the vectors of
/// a SIMD level.
pub(crate) trait Step<A> {
    /// What the step returns.
    type Out;
    /// Runs the step on vectors of `V`.
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`, and the step's own contract.
    unsafe fn run<V: Vector<A>>(self) -> Self::Out;
}

/// `step` on the vectors of `simd`: 512-bit registers under AVX-512, 256-bit ones under AVX2,
/// portable arrays of [`PORTABLE_LANES`] at every other level.
///
/// # Safety
/// The step's own contract; the vectors' target features are this function's to provide.
#[inline(always)]
pub(crate) unsafe fn on_vectors<A: Registers, S: Step<A>>(simd: SimdLevel, step: S) -> S::Out {
    match simd {
        // SAFETY (all arms): the vectors of `simd` inside `with_simd` at that level, which the
        // CPU was detected to have (portable arrays need no target feature); the step's own
        // contract is the caller's.
        SimdLevel::Avx512 => with_simd(
            SimdLevel::Avx512,
            #[inline(always)]
            || unsafe { step.run::<A::X512>() },
        ),
        SimdLevel::Avx2Fma => with_simd(
            SimdLevel::Avx2Fma,
            #[inline(always)]
            || unsafe { step.run::<A::X256>() },
        ),
        level => with_simd(
            level,
            #[inline(always)]
            || unsafe { step.run::<Portable<A, PORTABLE_LANES>>() },
        ),
    }
}

/// The vector registers of each SIMD level for one compute type: what a kernel tiles with at
/// that level.
pub(crate) trait Registers: Real {
    /// A 512-bit register (AVX-512).
    type X512: Vector<Self>;
    /// A 256-bit register (AVX2 with FMA; also under AVX-512, whose VL extension has them).
    type X256: Vector<Self>;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Vector;

    /// Implements [`Vector`] for a register type from its intrinsics.
    macro_rules! vector {
        ($doc:literal, $name:ident, $reg:ty, $elem:ty, $lanes:expr,
         $zero:ident, $splat:ident, $load:ident, $load_first:ident,
         $lanes_of:ident, $mask:ty, $load_lanes:ident, $store:ident,
         $store_first:ident, $fma:ident,
         $deinterleave:ident, $add:ident, $sub:ident, $mul:ident, $max:ident,
         $transpose:ident) => {
            #[doc = $doc]
            #[derive(Clone, Copy)]
            pub(crate) struct $name($reg);

            impl Vector<$elem> for $name {
                const LANES: usize = $lanes;

                #[inline(always)]
                unsafe fn zero() -> Self {
                    $name($zero())
                }

                #[inline(always)]
                unsafe fn splat(x: $elem) -> Self {
                    $name($splat(x))
                }

                #[inline(always)]
                unsafe fn load(p: *const $elem) -> Self {
                    $name($load(p))
                }

                #[inline(always)]
                unsafe fn load_first(p: *const $elem, n: usize) -> Self {
                    $name($load_first(p, n))
                }

                type Lanes = $mask;

                #[inline(always)]
                unsafe fn lanes(lo: usize, hi: usize) -> $mask {
                    $lanes_of(lo.min($lanes), hi.min($lanes))
                }

                #[inline(always)]
                unsafe fn load_lanes(p: *const $elem, lanes: $mask) -> Self {
                    $name($load_lanes(lanes, p))
                }

                #[inline(always)]
                unsafe fn store(self, p: *mut $elem) {
                    $store(p, self.0)
                }

                #[inline(always)]
                unsafe fn store_first(self, p: *mut $elem, n: usize) {
                    $store_first(p, n, self.0)
                }

                #[inline(always)]
                unsafe fn deinterleave(p: *const $elem) -> (Self, Self) {
                    let (even, odd) = $deinterleave(p);
                    ($name(even), $name(odd))
                }

                #[inline(always)]
                unsafe fn mul_add(self, a: Self, b: Self) -> Self {
                    $name($fma(self.0, a.0, b.0))
                }

                #[inline(always)]
                unsafe fn add(self, a: Self) -> Self {
                    $name($add(self.0, a.0))
                }

                #[inline(always)]
                unsafe fn sub(self, a: Self) -> Self {
                    $name($sub(self.0, a.0))
                }

                #[inline(always)]
                unsafe fn mul(self, a: Self) -> Self {
                    $name($mul(self.0, a.0))
                }

                #[inline(always)]
                unsafe fn max(self, a: Self) -> Self {
                    $name($max(self.0, a.0))
                }

                #[inline(always)]
                unsafe fn transpose(
                    src: *const $elem,
                    src_row: usize,
                    dst: *mut $elem,
                    dst_row: usize,
                ) {
                    $transpose(src, src_row, dst, dst_row)
                }
            }
        };
    }

    vector!(
        "16 f32 lanes of AVX-512.",
        F32x16,
        __m512,
        f32,
        16,
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_loadu_ps,
        load_first_f32x16,
        lanes_x16,
        __mmask16,
        _mm512_maskz_loadu_ps,
        _mm512_storeu_ps,
        store_first_f32x16,
        _mm512_fmadd_ps,
        deinterleave_f32x16,
        _mm512_add_ps,
        _mm512_sub_ps,
        _mm512_mul_ps,
        max_f32x16,
        transpose_f32x16
    );
    vector!(
        "8 f32 lanes of AVX2.",
        F32x8,
        __m256,
        f32,
        8,
        _mm256_setzero_ps,
        _mm256_set1_ps,
        _mm256_loadu_ps,
        load_first_f32x8,
        lanes_i32x8,
        __m256i,
        maskload_f32x8,
        _mm256_storeu_ps,
        store_first_f32x8,
        _mm256_fmadd_ps,
        deinterleave_f32x8,
        _mm256_add_ps,
        _mm256_sub_ps,
        _mm256_mul_ps,
        max_f32x8,
        transpose_f32x8
    );
    vector!(
        "8 f64 lanes of AVX-512.",
        F64x8,
        __m512d,
        f64,
        8,
        _mm512_setzero_pd,
        _mm512_set1_pd,
        _mm512_loadu_pd,
        load_first_f64x8,
        lanes_x8,
        __mmask8,
        _mm512_maskz_loadu_pd,
        _mm512_storeu_pd,
        store_first_f64x8,
        _mm512_fmadd_pd,
        deinterleave_f64x8,
        _mm512_add_pd,
        _mm512_sub_pd,
        _mm512_mul_pd,
        max_f64x8,
        transpose_f64x8
    );
    vector!(
        "4 f64 lanes of AVX2.",
        F64x4,
        __m256d,
        f64,
        4,
        _mm256_setzero_pd,
        _mm256_set1_pd,
        _mm256_loadu_pd,
        load_first_f64x4,
        lanes_i64x4,
        __m256i,
        maskload_f64x4,
        _mm256_storeu_pd,
        store_first_f64x4,
        _mm256_fmadd_pd,
        deinterleave_f64x4,
        _mm256_add_pd,
        _mm256_sub_pd,
        _mm256_mul_pd,
        max_f64x4,
        transpose_f64x4
    );

    /// [`Vector::load_first`] for 16 f32 lanes (AVX-512 F): one zero-masked load.
    ///
    /// # Safety
    /// As [`Vector::load_first`], with AVX-512 F.
    #[inline(always)]
    unsafe fn load_first_f32x16(p: *const f32, n: usize) -> __m512 {
        _mm512_maskz_loadu_ps(((1u32 << n) - 1) as __mmask16, p)
    }

    /// [`Vector::load_first`] for 8 f64 lanes (AVX-512 F): one zero-masked load.
    ///
    /// # Safety
    /// As [`Vector::load_first`], with AVX-512 F.
    #[inline(always)]
    unsafe fn load_first_f64x8(p: *const f64, n: usize) -> __m512d {
        _mm512_maskz_loadu_pd(((1u32 << n) - 1) as __mmask8, p)
    }

    /// [`Vector::load_first`] for 8 f32 lanes (AVX): one masked load (masked lanes read as zero
    /// and do not fault), lanes below `n` selected by comparing their index with it.
    ///
    /// # Safety
    /// As [`Vector::load_first`], with AVX2.
    #[inline(always)]
    unsafe fn load_first_f32x8(p: *const f32, n: usize) -> __m256 {
        let index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), index))
    }

    /// [`Vector::load_first`] for 4 f64 lanes (AVX), as [`load_first_f32x8`].
    ///
    /// # Safety
    /// As [`Vector::load_first`], with AVX2.
    #[inline(always)]
    unsafe fn load_first_f64x4(p: *const f64, n: usize) -> __m256d {
        let index = _mm256_setr_epi64x(0, 1, 2, 3);
        _mm256_maskload_pd(p, _mm256_cmpgt_epi64(_mm256_set1_epi64x(n as i64), index))
    }

    /// [`Vector::lanes`] for 16 lanes (AVX-512 F), bounds at most 16: bits `lo .. hi` of a mask
    /// register.
    ///
    /// # Safety
    /// AVX-512 F.
    #[inline(always)]
    unsafe fn lanes_x16(lo: usize, hi: usize) -> __mmask16 {
        (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as __mmask16
    }

    /// [`Vector::lanes`] for 8 lanes (AVX-512 F), bounds at most 8, as [`lanes_x16`].
    ///
    /// # Safety
    /// AVX-512 F.
    #[inline(always)]
    unsafe fn lanes_x8(lo: usize, hi: usize) -> __mmask8 {
        lanes_x16(lo, hi) as __mmask8
    }

    /// [`Vector::lanes`] for 8 f32 lanes (AVX2), bounds at most 8: all ones in the 32-bit lanes
    /// `lo .. hi`, the mask [`maskload_f32x8`] takes.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn lanes_i32x8(lo: usize, hi: usize) -> __m256i {
        let index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let from = _mm256_cmpgt_epi32(_mm256_set1_epi32(lo as i32), index);
        let to = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi as i32), index);
        _mm256_andnot_si256(from, to)
    }

    /// [`Vector::lanes`] for 4 f64 lanes (AVX2), as [`lanes_i32x8`] in 64-bit lanes.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn lanes_i64x4(lo: usize, hi: usize) -> __m256i {
        let index = _mm256_setr_epi64x(0, 1, 2, 3);
        let from = _mm256_cmpgt_epi64(_mm256_set1_epi64x(lo as i64), index);
        let to = _mm256_cmpgt_epi64(_mm256_set1_epi64x(hi as i64), index);
        _mm256_andnot_si256(from, to)
    }

    /// [`Vector::load_lanes`] for 8 f32 lanes (AVX): lanes outside `mask` read as zero and do
    /// not fault.
    ///
    /// # Safety
    /// As [`Vector::load_lanes`], with AVX2.
    #[inline(always)]
    unsafe fn maskload_f32x8(mask: __m256i, p: *const f32) -> __m256 {
        _mm256_maskload_ps(p, mask)
    }

    /// [`Vector::load_lanes`] for 4 f64 lanes (AVX), as [`maskload_f32x8`].
    ///
    /// # Safety
    /// As [`Vector::load_lanes`], with AVX2.
    #[inline(always)]
    unsafe fn maskload_f64x4(mask: __m256i, p: *const f64) -> __m256d {
        _mm256_maskload_pd(p, mask)
    }

    /// [`Vector::store_first`] for 16 f32 lanes (AVX-512 F): one masked store.
    ///
    /// # Safety
    /// As [`Vector::store_first`], with AVX-512 F.
    #[inline(always)]
    unsafe fn store_first_f32x16(p: *mut f32, n: usize, v: __m512) {
        _mm512_mask_storeu_ps(p, ((1u32 << n) - 1) as __mmask16, v)
    }

    /// [`Vector::store_first`] for 8 f64 lanes (AVX-512 F): one masked store.
    ///
    /// # Safety
    /// As [`Vector::store_first`], with AVX-512 F.
    #[inline(always)]
    unsafe fn store_first_f64x8(p: *mut f64, n: usize, v: __m512d) {
        _mm512_mask_storeu_pd(p, ((1u32 << n) - 1) as __mmask8, v)
    }

    /// [`Vector::store_first`] for 8 f32 lanes (AVX): plain stores of 4, 2 and 1 lanes as `n`'s
    /// bits ask, lowest lanes first, or one whole store for `n = 8`. Not `vmaskmovps`: AMD's
    /// cores up to Zen 3 run its store form as microcode, about 14 cycles each, against a cycle
    /// for each plain store.
    ///
    /// # Safety
    /// As [`Vector::store_first`], with AVX2.
    #[inline(always)]
    unsafe fn store_first_f32x8(p: *mut f32, n: usize, v: __m256) {
        if n >= 8 {
            return _mm256_storeu_ps(p, v);
        }
        let (mut p, mut x) = (p, _mm256_castps256_ps128(v));
        if n & 4 != 0 {
            _mm_storeu_ps(p, x);
            (p, x) = (p.add(4), _mm256_extractf128_ps::<1>(v));
        }
        if n & 2 != 0 {
            _mm_store_sd(p.cast::<f64>(), _mm_castps_pd(x));
            (p, x) = (p.add(2), _mm_movehl_ps(x, x));
        }
        if n & 1 != 0 {
            _mm_store_ss(p, x);
        }
    }

    /// [`Vector::store_first`] for 4 f64 lanes (AVX), as [`store_first_f32x8`]: plain stores of
    /// 2 and 1 lanes.
    ///
    /// # Safety
    /// As [`Vector::store_first`], with AVX2.
    #[inline(always)]
    unsafe fn store_first_f64x4(p: *mut f64, n: usize, v: __m256d) {
        if n >= 4 {
            return _mm256_storeu_pd(p, v);
        }
        let (mut p, mut x) = (p, _mm256_castpd256_pd128(v));
        if n & 2 != 0 {
            _mm_storeu_pd(p, x);
            (p, x) = (p.add(2), _mm256_extractf128_pd::<1>(v));
        }
        if n & 1 != 0 {
            _mm_store_sd(p, x);
        }
    }

    /// [`Vector::max`] for 16 f32 lanes (AVX-512 F). `vmaxps` returns its second operand when
    /// either is NaN, so `max(b, a)` keeps a NaN `a`; lanes where `b` is NaN then take `b`.
    ///
    /// # Safety
    /// As [`Vector::max`], with AVX-512 F.
    #[inline(always)]
    unsafe fn max_f32x16(a: __m512, b: __m512) -> __m512 {
        let m = _mm512_max_ps(b, a);
        _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(b, b), b)
    }

    /// [`Vector::max`] for 8 f64 lanes (AVX-512 F), as [`max_f32x16`].
    ///
    /// # Safety
    /// As [`Vector::max`], with AVX-512 F.
    #[inline(always)]
    unsafe fn max_f64x8(a: __m512d, b: __m512d) -> __m512d {
        let m = _mm512_max_pd(b, a);
        _mm512_mask_mov_pd(m, _mm512_cmp_pd_mask::<_CMP_UNORD_Q>(b, b), b)
    }

    /// [`Vector::max`] for 8 f32 lanes (AVX), as [`max_f32x16`] with a blend.
    ///
    /// # Safety
    /// As [`Vector::max`], with AVX.
    #[inline(always)]
    unsafe fn max_f32x8(a: __m256, b: __m256) -> __m256 {
        let m = _mm256_max_ps(b, a);
        _mm256_blendv_ps(m, b, _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b))
    }

    /// [`Vector::max`] for 4 f64 lanes (AVX), as [`max_f32x8`].
    ///
    /// # Safety
    /// As [`Vector::max`], with AVX.
    #[inline(always)]
    unsafe fn max_f64x4(a: __m256d, b: __m256d) -> __m256d {
        let m = _mm256_max_pd(b, a);
        _mm256_blendv_pd(m, b, _mm256_cmp_pd::<_CMP_UNORD_Q>(b, b))
    }

    /// [`Vector::deinterleave`] for 16 f32 lanes (AVX-512 F): two two-source permutes.
    ///
    /// # Safety
    /// As [`Vector::deinterleave`], with AVX-512 F.
    #[inline(always)]
    unsafe fn deinterleave_f32x16(p: *const f32) -> (__m512, __m512) {
        let (a, b) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        (
            _mm512_permutex2var_ps(a, even, b),
            _mm512_permutex2var_ps(a, odd, b),
        )
    }

    /// [`Vector::deinterleave`] for 8 f64 lanes (AVX-512 F): two two-source permutes.
    ///
    /// # Safety
    /// As [`Vector::deinterleave`], with AVX-512 F.
    #[inline(always)]
    unsafe fn deinterleave_f64x8(p: *const f64) -> (__m512d, __m512d) {
        let (a, b) = (_mm512_loadu_pd(p), _mm512_loadu_pd(p.add(8)));
        let even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
        let odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
        (
            _mm512_permutex2var_pd(a, even, b),
            _mm512_permutex2var_pd(a, odd, b),
        )
    }

    /// [`Vector::deinterleave`] for 8 f32 lanes (AVX2): a shuffle within each 128-bit half
    /// (`a0 a2 b0 b2 | a4 a6 b4 b6`), then the 64-bit pieces put in order.
    ///
    /// # Safety
    /// As [`Vector::deinterleave`], with AVX2.
    #[inline(always)]
    unsafe fn deinterleave_f32x8(p: *const f32) -> (__m256, __m256) {
        let (a, b) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
        let order =
            |x: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0xd8>(_mm256_castps_pd(x)));
        (
            order(_mm256_shuffle_ps::<0x88>(a, b)),
            order(_mm256_shuffle_ps::<0xdd>(a, b)),
        )
    }

    /// [`Vector::deinterleave`] for 4 f64 lanes (AVX2): the low and the high elements of each
    /// pair (`a0 b0 a2 b2`), then put in order.
    ///
    /// # Safety
    /// As [`Vector::deinterleave`], with AVX2.
    #[inline(always)]
    unsafe fn deinterleave_f64x4(p: *const f64) -> (__m256d, __m256d) {
        let (a, b) = (_mm256_loadu_pd(p), _mm256_loadu_pd(p.add(4)));
        (
            _mm256_permute4x64_pd::<0xd8>(_mm256_unpacklo_pd(a, b)),
            _mm256_permute4x64_pd::<0xd8>(_mm256_unpackhi_pd(a, b)),
        )
    }

    /// The 8 × 8 f32 transpose of [`Vector::transpose`] (AVX).
    ///
    /// # Safety
    /// As [`Vector::transpose`], with AVX.
    #[inline(always)]
    unsafe fn transpose_f32x8(src: *const f32, src_row: usize, dst: *mut f32, dst_row: usize) {
        let row = |i: usize| src.add(i * src_row);
        let r = [
            _mm256_loadu_ps(row(0)),
            _mm256_loadu_ps(row(1)),
            _mm256_loadu_ps(row(2)),
            _mm256_loadu_ps(row(3)),
            _mm256_loadu_ps(row(4)),
            _mm256_loadu_ps(row(5)),
            _mm256_loadu_ps(row(6)),
            _mm256_loadu_ps(row(7)),
        ];
        // Pairs of rows interleaved, then pairs of pairs, then the two 128-bit halves.
        let t = [
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
            _mm256_unpacklo_ps(r[4], r[5]),
            _mm256_unpackhi_ps(r[4], r[5]),
            _mm256_unpacklo_ps(r[6], r[7]),
            _mm256_unpackhi_ps(r[6], r[7]),
        ];
        let u = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        for j in 0..4 {
            _mm256_storeu_ps(
                dst.add(j * dst_row),
                _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]),
            );
            _mm256_storeu_ps(
                dst.add((4 + j) * dst_row),
                _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]),
            );
        }
    }

    /// The 16 × 16 f32 transpose of [`Vector::transpose`], as four 8 × 8 ones.
    ///
    /// # Safety
    /// As [`Vector::transpose`], with AVX.
    #[inline(always)]
    unsafe fn transpose_f32x16(src: *const f32, src_row: usize, dst: *mut f32, dst_row: usize) {
        for (bi, bj) in [(0, 0), (0, 8), (8, 0), (8, 8)] {
            transpose_f32x8(
                src.add(bi * src_row + bj),
                src_row,
                dst.add(bj * dst_row + bi),
                dst_row,
            );
        }
    }

    /// The 4 × 4 f64 transpose of [`Vector::transpose`] (AVX).
    ///
    /// # Safety
    /// As [`Vector::transpose`], with AVX.
    #[inline(always)]
    unsafe fn transpose_f64x4(src: *const f64, src_row: usize, dst: *mut f64, dst_row: usize) {
        let row = |i: usize| src.add(i * src_row);
        let r = [
            _mm256_loadu_pd(row(0)),
            _mm256_loadu_pd(row(1)),
            _mm256_loadu_pd(row(2)),
            _mm256_loadu_pd(row(3)),
        ];
        let t = [
            _mm256_unpacklo_pd(r[0], r[1]),
            _mm256_unpackhi_pd(r[0], r[1]),
            _mm256_unpacklo_pd(r[2], r[3]),
            _mm256_unpackhi_pd(r[2], r[3]),
        ];
        for j in 0..2 {
            _mm256_storeu_pd(
                dst.add(j * dst_row),
                _mm256_permute2f128_pd::<0x20>(t[j], t[2 + j]),
            );
            _mm256_storeu_pd(
                dst.add((2 + j) * dst_row),
                _mm256_permute2f128_pd::<0x31>(t[j], t[2 + j]),
            );
        }
    }

    /// The 8 × 8 f64 transpose of [`Vector::transpose`], as four 4 × 4 ones.
    ///
    /// # Safety
    /// As [`Vector::transpose`], with AVX.
    #[inline(always)]
    unsafe fn transpose_f64x8(src: *const f64, src_row: usize, dst: *mut f64, dst_row: usize) {
        for (bi, bj) in [(0, 0), (0, 4), (4, 0), (4, 4)] {
            transpose_f64x4(
                src.add(bi * src_row + bj),
                src_row,
                dst.add(bj * dst_row + bi),
                dst_row,
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Registers for f32 {
    type X512 = x86::F32x16;
    type X256 = x86::F32x8;
}

#[cfg(target_arch = "x86_64")]
impl Registers for f64 {
    type X512 = x86::F64x8;
    type X256 = x86::F64x4;
}

#[cfg(not(target_arch = "x86_64"))]
impl Registers for f32 {
    type X512 = Portable<f32, 16>;
    type X256 = Portable<f32, 8>;
}

#[cfg(not(target_arch = "x86_64"))]
impl Registers for f64 {
    type X512 = Portable<f64, 8>;
    type X256 = Portable<f64, 4>;
}

#[cfg(test)]
mod tests {
    use super::{transpose_block, Portable, Registers, Vector};
    use crate::backends::cpu::host::{with_simd, Real};
    use crate::backends::cpu::simd::SimdLevel;

    /// Stores the first `n` of `V::LANES` values `1, 2, …` over a buffer of NaN, for every `n`,
    /// and checks that exactly those were written.
    fn stores_first<A: Real, V: Vector<A>>() {
        for n in 0..=V::LANES {
            let values: Vec<A> = (1..=V::LANES).map(|l| A::from_f64(l as f64)).collect();
            let mut out = vec![A::from_f64(f64::NAN); V::LANES + 2];
            // SAFETY: the caller runs this at the level of `V`; `out[1 ..]` holds LANES + 1
            // elements.
            unsafe { V::load(values.as_ptr()).store_first(out.as_mut_ptr().add(1), n) };
            for (i, &o) in out.iter().enumerate() {
                let written = (1..=n).contains(&i);
                assert_eq!(
                    o.to_f64().is_nan(),
                    !written,
                    "n = {n} of {}: element {i}",
                    V::LANES
                );
                if written {
                    assert_eq!(o.to_f64(), i as f64, "n = {n}: element {i}");
                }
            }
        }
    }

    /// Loads the first `n` of the `LANES` values `1, 2, …` for every `n`, the `n` taken from the
    /// end of a buffer (a read past it would leave the allocation), and checks that the other
    /// lanes are zero.
    fn loads_first<A: Real, V: Vector<A>>() {
        for n in 0..=V::LANES {
            let values: Vec<A> = (1..=n).map(|l| A::from_f64(l as f64)).collect();
            let mut out = vec![A::from_f64(f64::NAN); V::LANES];
            // SAFETY: the caller runs this at the level of `V`; `values` holds `n` elements and
            // `out` LANES.
            unsafe { V::load_first(values.as_ptr(), n).store(out.as_mut_ptr()) };
            for (l, &o) in out.iter().enumerate() {
                let want = if l < n { (l + 1) as f64 } else { 0.0 };
                assert_eq!(o.to_f64(), want, "n = {n} of {}: lane {l}", V::LANES);
            }
        }
    }

    /// Loads lanes `lo .. hi` for every pair of bounds up to one past `LANES` from a buffer that
    /// holds just those lanes' values (`l + 1` for lane `l`), the vector's start before it where
    /// `lo > 0`, and checks that the other lanes are zero.
    fn loads_lanes<A: Real, V: Vector<A>>() {
        for lo in 0..=V::LANES + 1 {
            for hi in 0..=V::LANES + 1 {
                let (from, to) = (lo.min(V::LANES), hi.min(V::LANES));
                let values: Vec<A> = (from..to.max(from))
                    .map(|l| A::from_f64((l + 1) as f64))
                    .collect();
                let mut out = vec![A::from_f64(f64::NAN); V::LANES];
                // SAFETY: the caller runs this at the level of `V`; lane l of lo .. hi reads
                // values[l − lo], and `out` holds LANES.
                unsafe {
                    let p = values.as_ptr().wrapping_sub(from);
                    V::load_lanes(p, V::lanes(lo, hi)).store(out.as_mut_ptr());
                }
                for (l, &o) in out.iter().enumerate() {
                    let want = if (from..to).contains(&l) {
                        (l + 1) as f64
                    } else {
                        0.0
                    };
                    assert_eq!(
                        o.to_f64(),
                        want,
                        "lanes {lo}..{hi} of {}: lane {l}",
                        V::LANES
                    );
                }
            }
        }
    }

    /// `load_lanes` of every vector type, at every level this CPU runs.
    #[test]
    fn load_lanes_reads_only_its_lanes() {
        fn all<A: Registers>(simd: SimdLevel) {
            match simd {
                SimdLevel::Avx512 => with_simd(simd, || {
                    loads_lanes::<A, A::X512>();
                    loads_lanes::<A, A::X256>();
                }),
                SimdLevel::Avx2Fma => with_simd(simd, || loads_lanes::<A, A::X256>()),
                _ => {}
            }
            with_simd(simd, || loads_lanes::<A, Portable<A, 4>>());
        }
        for simd in SimdLevel::runnable() {
            all::<f32>(simd);
            all::<f64>(simd);
        }
    }

    /// `load_first` of every vector type, at every level this CPU runs.
    #[test]
    fn load_first_reads_only_its_lanes() {
        fn all<A: Registers>(simd: SimdLevel) {
            match simd {
                SimdLevel::Avx512 => with_simd(simd, || {
                    loads_first::<A, A::X512>();
                    loads_first::<A, A::X256>();
                }),
                SimdLevel::Avx2Fma => with_simd(simd, || loads_first::<A, A::X256>()),
                _ => {}
            }
            with_simd(simd, || loads_first::<A, Portable<A, 4>>());
        }
        for simd in SimdLevel::runnable() {
            all::<f32>(simd);
            all::<f64>(simd);
        }
    }

    /// Splits `0, 1, …, 2·LANES − 1` into its even and odd elements.
    fn deinterleaves<A: Real, V: Vector<A>>() {
        let n = V::LANES;
        let xs: Vec<A> = (0..2 * n).map(|i| A::from_f64(i as f64)).collect();
        let mut out = vec![A::ZERO; 2 * n];
        // SAFETY: the caller runs this at the level of `V`; `xs` and `out` hold 2·LANES.
        unsafe {
            let (even, odd) = V::deinterleave(xs.as_ptr());
            even.store(out.as_mut_ptr());
            odd.store(out.as_mut_ptr().add(n));
        }
        for l in 0..n {
            assert_eq!(out[l].to_f64(), (2 * l) as f64, "even lane {l} of {n}");
            assert_eq!(
                out[n + l].to_f64(),
                (2 * l + 1) as f64,
                "odd lane {l} of {n}"
            );
        }
    }

    /// `deinterleave` of every vector type, at every level this CPU runs.
    #[test]
    fn deinterleave_splits_even_and_odd() {
        fn all<A: Registers>(simd: SimdLevel) {
            match simd {
                SimdLevel::Avx512 => with_simd(simd, || {
                    deinterleaves::<A, A::X512>();
                    deinterleaves::<A, A::X256>();
                }),
                SimdLevel::Avx2Fma => with_simd(simd, || deinterleaves::<A, A::X256>()),
                _ => {}
            }
            with_simd(simd, || deinterleaves::<A, Portable<A, 4>>());
        }
        for simd in SimdLevel::runnable() {
            all::<f32>(simd);
            all::<f64>(simd);
        }
    }

    /// `max` of pairs chosen lane by lane from ordinary values, infinities, signed zeros and NaN
    /// on either side: the larger, or NaN where either is NaN.
    fn maxes<A: Real, V: Vector<A>>() {
        let special = [
            1.5,
            -2.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            0.0,
            7.0,
        ];
        let n = V::LANES;
        for shift in 0..special.len() {
            let a: Vec<A> = (0..n)
                .map(|l| A::from_f64(special[l % special.len()]))
                .collect();
            let b: Vec<A> = (0..n)
                .map(|l| A::from_f64(special[(l + shift) % special.len()]))
                .collect();
            let mut out = vec![A::ZERO; n];
            // SAFETY: the caller runs this at the level of `V`; every buffer holds LANES.
            unsafe {
                V::load(a.as_ptr())
                    .max(V::load(b.as_ptr()))
                    .store(out.as_mut_ptr())
            };
            for l in 0..n {
                let (x, y, got) = (a[l].to_f64(), b[l].to_f64(), out[l].to_f64());
                if x.is_nan() || y.is_nan() {
                    assert!(got.is_nan(), "max({x}, {y}) = {got}, lane {l} of {n}");
                } else {
                    assert_eq!(got, x.max(y), "max({x}, {y}), lane {l} of {n}");
                }
            }
        }
    }

    /// `max` of every vector type, at every level this CPU runs.
    #[test]
    fn max_is_nan_where_either_lane_is() {
        fn all<A: Registers>(simd: SimdLevel) {
            match simd {
                SimdLevel::Avx512 => with_simd(simd, || {
                    maxes::<A, A::X512>();
                    maxes::<A, A::X256>();
                }),
                SimdLevel::Avx2Fma => with_simd(simd, || maxes::<A, A::X256>()),
                _ => {}
            }
            with_simd(simd, || maxes::<A, Portable<A, 4>>());
        }
        for simd in SimdLevel::runnable() {
            all::<f32>(simd);
            all::<f64>(simd);
        }
    }

    /// `store_first` of every vector type, at every level this CPU runs.
    #[test]
    fn store_first_writes_only_its_lanes() {
        fn all<A: Registers>(simd: SimdLevel) {
            match simd {
                // SAFETY (both x86 arms): inside `with_simd` at the vectors' level, which
                // `runnable` found on this CPU.
                SimdLevel::Avx512 => with_simd(simd, || {
                    stores_first::<A, A::X512>();
                    stores_first::<A, A::X256>();
                }),
                SimdLevel::Avx2Fma => with_simd(simd, || stores_first::<A, A::X256>()),
                _ => {}
            }
            with_simd(simd, || stores_first::<A, Portable<A, 4>>());
        }
        for simd in SimdLevel::runnable() {
            all::<f32>(simd);
            all::<f64>(simd);
        }
    }

    /// `transpose_block` of blocks of odd sizes around `LANES` (whole tiles, ragged edges and
    /// blocks smaller than one tile), with strides wider than the block, into a destination of
    /// NaN: every element of the block lands transposed and nothing else is written.
    fn transposes<A: Real, V: Vector<A>>() {
        let l = V::LANES;
        for (rows, cols) in [
            (1, 1),
            (l, l),
            (l + 3, 2 * l + 1),
            (2 * l, 5),
            (3, l),
            (7, 1),
        ] {
            let (src_row, dst_row) = (cols + 2, rows + 1);
            let src: Vec<A> = (0..rows * src_row)
                .map(|i| A::from_f64(i as f64 + 0.5))
                .collect();
            let mut dst = vec![A::from_f64(f64::NAN); cols * dst_row];
            // SAFETY: the caller runs this at the level of `V`.
            unsafe { transpose_block::<A, V>(&src, src_row, &mut dst, dst_row, rows, cols) };
            for j in 0..cols {
                for i in 0..dst_row {
                    let got = dst[j * dst_row + i].to_f64();
                    if i < rows {
                        let want = (i * src_row + j) as f64 + 0.5;
                        assert_eq!(got, want, "{rows}×{cols} of {l} lanes: ({i}, {j})");
                    } else {
                        assert!(got.is_nan(), "{rows}×{cols}: padding ({i}, {j}) written");
                    }
                }
            }
        }
    }

    /// `transpose_block` on every vector type, at every level this CPU runs.
    #[test]
    fn transpose_block_moves_every_element() {
        fn all<A: Registers>(simd: SimdLevel) {
            match simd {
                SimdLevel::Avx512 => with_simd(simd, || {
                    transposes::<A, A::X512>();
                    transposes::<A, A::X256>();
                }),
                SimdLevel::Avx2Fma => with_simd(simd, || transposes::<A, A::X256>()),
                _ => {}
            }
            with_simd(simd, || transposes::<A, Portable<A, 4>>());
        }
        for simd in SimdLevel::runnable() {
            all::<f32>(simd);
            all::<f64>(simd);
        }
    }
}
