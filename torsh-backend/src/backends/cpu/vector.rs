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

use super::host::Real;

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
    /// Writes the lanes to `p .. p + LANES`.
    ///
    /// # Safety
    /// See the trait; `p .. p + LANES` is writable.
    unsafe fn store(self, p: *mut A);
    /// `self · a + b` per lane, rounded once.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn mul_add(self, a: Self, b: Self) -> Self;
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
    unsafe fn store(self, p: *mut A) {
        p.cast::<[A; N]>().write_unaligned(self.0)
    }

    #[inline(always)]
    unsafe fn mul_add(self, a: Self, b: Self) -> Self {
        let mut out = b.0;
        for ((o, &x), &y) in out.iter_mut().zip(&self.0).zip(&a.0) {
            *o = x.mul_add(y, *o);
        }
        Portable(out)
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
         $zero:ident, $splat:ident, $load:ident, $store:ident, $fma:ident) => {
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
                unsafe fn store(self, p: *mut $elem) {
                    $store(p, self.0)
                }

                #[inline(always)]
                unsafe fn mul_add(self, a: Self, b: Self) -> Self {
                    $name($fma(self.0, a.0, b.0))
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
        _mm512_storeu_ps,
        _mm512_fmadd_ps
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
        _mm256_storeu_ps,
        _mm256_fmadd_ps
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
        _mm512_storeu_pd,
        _mm512_fmadd_pd
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
        _mm256_storeu_pd,
        _mm256_fmadd_pd
    );
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
