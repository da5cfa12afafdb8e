//! AVX2 forms of `vmath` functions whose compiled scalar source leaves a machine without AVX-512
//! short of its peers: a block of f32 at a time, on explicit 8-lane vectors.
//!
//! eˣ ([`Func::Exp`]), tanh ([`Func::Tanh`]) and GELU ([`Func::Gelu`]) are the scalar forms'
//! operations in the same order, so they give the scalar forms' bits, with the clamps as
//! `min`/`max` that keep NaN and eˣ's choice of scale by the sign bit (`blendv`) instead of a
//! compare; a large output is streamed straight from the registers, where the compiled forms
//! write each block to L1 first.
//!
//! The sigmoid ([`Func::Sigmoid`]) computes [`sigmoid_f32`](super::sigmoid_f32)'s `num / (1 + e)`,
//! `e = e^−|x|`, bit for bit, in fewer instructions than the compiler makes of the scalar source:
//! - `min(104, |x|)` in one instruction that keeps NaN, where the scalar select takes a compare
//!   and a blend;
//! - the reduction `r′ = |x| + n·ln 2 = −r` and the polynomial in `r′` with its odd coefficients
//!   negated, which gives the same roundings as the polynomial in `r` (every step of Horner's rule
//!   is mirrored in sign, and rounding to nearest is symmetric), without negating `|x|` first;
//! - the coefficients scaled by 2⁻⁶⁴ beforehand (exactly: every value stays normal), so that
//!   `p·2⁻⁶⁴·2^(n+64)` is one product rounded once, where the scalar form multiplies twice;
//! - the numerator chosen by `x`'s sign bit (`blendv`), with no compare.
//!
//! Its large outputs are streamed straight from the registers too (`docs/benchmarks.md` has the
//! figures).

use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_andnot_ps, _mm256_blendv_ps, _mm256_castps_si256,
    _mm256_castsi256_ps, _mm256_cmp_ps, _mm256_div_ps, _mm256_fmadd_ps, _mm256_fmsub_ps,
    _mm256_fnmadd_ps, _mm256_loadu_ps, _mm256_max_epi32, _mm256_max_ps, _mm256_min_ps,
    _mm256_mul_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps, _mm256_slli_epi32,
    _mm256_storeu_ps, _mm256_stream_ps, _mm256_sub_ps, _CMP_LE_OQ,
};

use super::{
    EXP_MAX, EXP_MIN, EXP_REDUCED, LN2_HI, LN2_LO, LOG2E, ROUND_MAGIC, TAIL_MAGIC, TAIL_P, TAIL_Q,
    TANH_LIMIT, TANH_P, TANH_Q, TWO_POW_M64,
};

/// f32 lanes of a register.
const LANES: usize = 8;

/// Bytes a streaming store writes, and the alignment it needs.
const VECTOR_BYTES: usize = 32;

/// [`EXP_REDUCED`] for the polynomial in `r′ = −r`: odd degrees negated, every coefficient scaled
/// by 2⁻⁶⁴ (exact: the coefficients are normal and far from the bottom of the range).
const EXP_MINUS_SCALED: [f32; 7] = {
    let mut c = [0.0f32; 7];
    let mut k = 0;
    while k < 7 {
        let scaled = EXP_REDUCED[k] * TWO_POW_M64;
        c[k] = if k % 2 == 1 { -scaled } else { scaled };
        k += 1;
    }
    c
};

/// [`sigmoid_f32`](super::sigmoid_f32) in every lane, bit for bit (NaN kept, 0.5 at ±0, 1 at
/// +∞, 0 at −∞; within 3 ulp, subnormal results included).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sigmoid8(x: __m256) -> __m256 {
    // 1.5 · 2²³ + 127 + 64: the rounding leaves n + 191 in the low mantissa bits.
    const SCALED_MAGIC: f32 = ROUND_MAGIC + 191.0;
    let one = _mm256_set1_ps(1.0);
    // `min` returns its second operand when either is NaN: NaN stays.
    let a = _mm256_min_ps(
        _mm256_set1_ps(104.0),
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), x),
    );
    // n = round(−a·log₂e), as the scalar form's `fma(−a, log₂e, magic)` rounds it.
    let t = _mm256_fnmadd_ps(a, _mm256_set1_ps(LOG2E), _mm256_set1_ps(SCALED_MAGIC));
    let n = _mm256_sub_ps(t, _mm256_set1_ps(SCALED_MAGIC));
    // r′ = a + n·ln 2 = −r, exact in its first step (Cephes' split).
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(LN2_HI), a);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let p = horner8(r, EXP_MINUS_SCALED);
    // n + 191 lies within [41, 191]: shifted into the exponent field it is 2^(n+64), normal.
    let power = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_castps_si256(t)));
    let e = _mm256_mul_ps(p, power);
    // The sign bit picks `e` (x < 0, and −0, where e = 1 gives the same 0.5) or 1.
    _mm256_div_ps(_mm256_blendv_ps(one, e, x), _mm256_add_ps(one, e))
}

/// `c[0] + z·(c[1] + z·(…))` in every lane, by fused multiply-adds from the highest degree down,
/// as the scalar `horner` evaluates it.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn horner8<const N: usize>(z: __m256, c: [f32; N]) -> __m256 {
    let mut p = _mm256_set1_ps(c[N - 1]);
    for &k in c[..N - 1].iter().rev() {
        p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(k));
    }
    p
}

/// [`exp_f32`](super::exp_f32) in every lane, bit for bit (within 2 ulp, subnormal results
/// included, NaN kept, +∞ above [`EXP_MAX`], 0 below [`EXP_MIN`]): the scalar form's operations
/// with its clamp in two instructions that keep NaN and its choice of scale by the sign bit
/// (`blendv`) instead of a compare. At −0 the positive and negative scales give the same 1.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    // `max` and `min` return their second operand when either is NaN: NaN stays.
    let c = _mm256_min_ps(
        _mm256_set1_ps(EXP_MAX),
        _mm256_max_ps(_mm256_set1_ps(EXP_MIN), x),
    );
    // 1.5 · 2²³ + 127 ± 64: the rounding leaves n + 127 ± 64 in the low mantissa bits, and
    // 2^(n ± 64)·2^(∓64) is the power, both factors normal.
    let magic = _mm256_blendv_ps(
        _mm256_set1_ps(ROUND_MAGIC + 63.0),
        _mm256_set1_ps(ROUND_MAGIC + 191.0),
        c,
    );
    let last = _mm256_blendv_ps(
        _mm256_set1_ps(f32::from_bits(0x5f80_0000)), // 2⁶⁴
        _mm256_set1_ps(TWO_POW_M64),
        c,
    );
    let t = _mm256_fmadd_ps(c, _mm256_set1_ps(LOG2E), magic);
    let n = _mm256_sub_ps(t, magic);
    // `c − n·LN2_HI` is exact (Cephes' split), as in `reduce_ln2`.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), c);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let power = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_castps_si256(t)));
    _mm256_mul_ps(_mm256_mul_ps(horner8(r, EXP_REDUCED), power), last)
}

/// [`tanh_f32`](super::tanh_f32) in every lane, bit for bit: `c·P(c²)/Q(c²)` on `c = x` clamped
/// to ±[`TANH_LIMIT`], the result clamped to ±1 (NaN kept, ±0 kept, ±1 at ±∞).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tanh8(x: __m256) -> __m256 {
    // `max` and `min` return their second operand when either is NaN: NaN stays.
    let c = _mm256_min_ps(
        _mm256_set1_ps(TANH_LIMIT),
        _mm256_max_ps(_mm256_set1_ps(-TANH_LIMIT), x),
    );
    let z = _mm256_mul_ps(c, c);
    let r = _mm256_div_ps(_mm256_mul_ps(c, horner8(z, TANH_P)), horner8(z, TANH_Q));
    _mm256_min_ps(_mm256_set1_ps(1.0), _mm256_max_ps(_mm256_set1_ps(-1.0), r))
}

/// [`gelu_f32`](super::gelu_f32) in every lane, bit for bit: `w = x·Φ(−|x|)` from the scaled
/// normal tail (`normal_tail_scaled`: `Φ(−t) = e^(−t²/2)·P(t)/Q(t)`, `t = min(|x|, 19)`, the
/// exponential's power read from the rounding's bits), the result `w` for `x ≤ 0` and `x − w`
/// above (NaN kept, +∞ at +∞, NaN at −∞ as `−∞ · 0`).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu8(x: __m256) -> __m256 {
    // `min` returns its second operand when either is NaN: NaN becomes 19, as `f32::min` does.
    let t = _mm256_min_ps(
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), x),
        _mm256_set1_ps(19.0),
    );
    let sq = _mm256_mul_ps(t, t);
    let sq_lo = _mm256_fmsub_ps(t, t, sq);
    let h = _mm256_mul_ps(_mm256_set1_ps(-0.5), sq);
    let k = _mm256_fmadd_ps(h, _mm256_set1_ps(LOG2E), _mm256_set1_ps(TAIL_MAGIC));
    let n = _mm256_sub_ps(k, _mm256_set1_ps(TAIL_MAGIC));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), h);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let r = _mm256_fmadd_ps(sq_lo, _mm256_set1_ps(-0.5), r);
    // Below `ROUND_MAGIC` (n + 191 < 0) the power is 0.
    let bits = _mm256_max_epi32(
        _mm256_castps_si256(k),
        _mm256_set1_epi32(ROUND_MAGIC.to_bits() as i32),
    );
    let power = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(bits));
    let e = _mm256_mul_ps(horner8(r, EXP_REDUCED), power);
    let tail = _mm256_mul_ps(e, _mm256_div_ps(horner8(t, TAIL_P), horner8(t, TAIL_Q)));
    // Capped above so that +∞ takes `∞ − 0`; −∞ keeps `−∞ · 0`.
    let w = _mm256_mul_ps(
        _mm256_mul_ps(_mm256_min_ps(x, _mm256_set1_ps(19.0)), tail),
        _mm256_set1_ps(TWO_POW_M64),
    );
    // All ones where `x ≤ 0` (false for NaN, which takes `x − w`, NaN, as the scalar form does).
    let nonpositive = _mm256_cmp_ps::<_CMP_LE_OQ>(x, _mm256_setzero_ps());
    _mm256_blendv_ps(_mm256_sub_ps(x, w), w, nonpositive)
}

/// A function with an AVX2 form here, as the `vmath` function of the same name computes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Func {
    /// eˣ ([`exp_f32`](super::exp_f32)).
    Exp,
    /// 1/(1 + e⁻ˣ) ([`sigmoid_f32`](super::sigmoid_f32)).
    Sigmoid,
    /// tanh x ([`tanh_f32`](super::tanh_f32)).
    Tanh,
    /// x·Φ(x) ([`gelu_f32`](super::gelu_f32)).
    Gelu,
}

/// [`Func::Exp`] as a const parameter.
const EXP: u8 = 0;
/// [`Func::Sigmoid`] as a const parameter.
const SIGMOID: u8 = 1;
/// [`Func::Tanh`] as a const parameter.
const TANH: u8 = 2;
/// [`Func::Gelu`] as a const parameter.
const GELU: u8 = 3;

/// The function `F` ([`EXP`], [`SIGMOID`], [`TANH`] or [`GELU`]) in every lane.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn apply<const F: u8>(x: __m256) -> __m256 {
    // SAFETY: the caller's CPU contract.
    unsafe {
        match F {
            SIGMOID => sigmoid8(x),
            TANH => tanh8(x),
            GELU => gelu8(x),
            _ => exp8(x),
        }
    }
}

/// `F` on the `k < 8` values at `src` into `dst`, through a register-sized copy on the stack (a
/// masked store is microcode on AMD cores up to Zen 3).
///
/// # Safety
/// The CPU has AVX2 and FMA; `src` is valid for reads and `dst` for writes of `k ≤ 8` f32, and
/// they are the same pointer or do not overlap.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn part<const F: u8>(src: *const f32, dst: *mut f32, k: usize) {
    let mut lanes = [0.0f32; LANES];
    // SAFETY: `lanes` holds 8 ≥ k values and is distinct from both; the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, lanes.as_mut_ptr(), k);
        let v = apply::<F>(_mm256_loadu_ps(lanes.as_ptr()));
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, k);
    }
}

/// `n` values of `F` from `src` to `dst` (which may be `src`, each vector being read before it is
/// written). With `STREAM`, the values before `dst`'s first 32-byte boundary and after its last
/// whole vector are written with ordinary stores and the whole vectors between with unfenced
/// streaming stores; else every store is ordinary.
///
/// # Safety
/// The CPU has AVX2 and FMA; `src` is valid for reads and `dst` for writes of `n` f32, and they
/// are the same pointer or do not overlap.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn run<const F: u8, const STREAM: bool>(src: *const f32, dst: *mut f32, n: usize) {
    let mut i = 0;
    if STREAM {
        // `dst` is 4-byte aligned (an f32 pointer): `head` values reach the next boundary.
        let head = ((VECTOR_BYTES - (dst as usize) % VECTOR_BYTES) % VECTOR_BYTES / 4).min(n);
        // SAFETY: `head ≤ n` values; the caller's contract.
        unsafe { part::<F>(src, dst, head) };
        i = head;
    }
    // SAFETY: every access is to lanes `i .. i + 8 ≤ n`; with `STREAM` `dst + i` is 32-byte
    // aligned (`i − head` is a multiple of 8).
    unsafe {
        while i + LANES <= n {
            let v = apply::<F>(_mm256_loadu_ps(src.add(i)));
            if STREAM {
                _mm256_stream_ps(dst.add(i), v);
            } else {
                _mm256_storeu_ps(dst.add(i), v);
            }
            i += LANES;
        }
        if i < n {
            part::<F>(src.add(i), dst.add(i), n - i);
        }
    }
}

/// [`run`] for `f`.
///
/// # Safety
/// As [`run`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_func<const STREAM: bool>(f: Func, src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        match f {
            Func::Exp => run::<EXP, STREAM>(src, dst, n),
            Func::Sigmoid => run::<SIGMOID, STREAM>(src, dst, n),
            Func::Tanh => run::<TANH, STREAM>(src, dst, n),
            Func::Gelu => run::<GELU, STREAM>(src, dst, n),
        }
    }
}

/// `ys[i] = f(xs[i])` for `i < min(xs.len(), ys.len())`.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn map(f: Func, xs: &[f32], ys: &mut [f32]) {
    // SAFETY: both slices hold the `n` elements and do not overlap (a shared and an exclusive
    // borrow); the caller's CPU contract.
    unsafe { run_func::<false>(f, xs.as_ptr(), ys.as_mut_ptr(), xs.len().min(ys.len())) }
}

/// [`map`] with streaming stores: `ys[i] = f(xs[i])` for `i < min(xs.len(), ys.len())`, each
/// whole 32-byte vector of `ys` written past the cache straight from the register (unfenced: the
/// caller fences, as `Streamer` does), the values before the first and after the last with
/// ordinary stores.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn map_streamed(f: Func, xs: &[f32], ys: &mut [f32]) {
    // SAFETY: as in `map`.
    unsafe { run_func::<true>(f, xs.as_ptr(), ys.as_mut_ptr(), xs.len().min(ys.len())) }
}

/// `b[i] = f(b[i])`, as [`map`].
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn map_in_place(f: Func, b: &mut [f32]) {
    let p = b.as_mut_ptr();
    // SAFETY: source and destination are the one slice; the caller's CPU contract.
    unsafe { run_func::<false>(f, p, p, b.len()) }
}

#[cfg(test)]
mod tests {
    use super::super::tests::sweep;
    use super::*;

    /// Whether this CPU runs the forms; when it does not, says so on stderr, since the calling
    /// test then checks nothing (the scalar forms are tested in `vmath`).
    fn avx2() -> bool {
        let has = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        if !has {
            eprintln!("skipped: this CPU has no AVX2 and FMA, which the forms under test need");
        }
        has
    }

    /// `f` over `xs`, through the three entry points (the streamed one fenced), checked to agree
    /// bit for bit.
    fn map_of(f: Func, xs: &[f32]) -> Vec<f32> {
        let mut ys = vec![f32::NAN; xs.len()];
        let mut streamed = vec![f32::NAN; xs.len()];
        let mut b = xs.to_vec();
        // SAFETY: the callers checked for AVX2 and FMA; the fence orders the streamed stores.
        unsafe {
            map(f, xs, &mut ys);
            map_streamed(f, xs, &mut streamed);
            std::arch::x86_64::_mm_sfence();
            map_in_place(f, &mut b);
        }
        for ((y, s), v) in ys.iter().zip(&streamed).zip(&b) {
            assert_eq!(y.to_bits(), s.to_bits());
            assert_eq!(y.to_bits(), v.to_bits());
        }
        ys
    }

    /// Whether `y` is the bits of `want`, or both are NaN.
    fn same(y: f32, want: f32) -> bool {
        y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan())
    }

    /// A `vmath` scalar form.
    type Scalar = fn(f32) -> f32;

    /// Every function of the module with its scalar form.
    const FUNCS: [(Func, Scalar); 4] = [
        (Func::Exp, super::super::exp_f32),
        (Func::Sigmoid, super::super::sigmoid_f32),
        (Func::Tanh, super::super::tanh_f32),
        (Func::Gelu, super::super::gelu_f32),
    ];

    #[test]
    fn every_form_gives_the_scalar_forms_bits() {
        if !avx2() {
            return;
        }
        // Both tails (the clamps at −104 and 89 or 104, subnormal results below about −87), the
        // region where tanh's rational exceeds 1 before its clamp, the middle, tiny and subnormal
        // arguments, and the ends of the range.
        let xs: Vec<f32> = sweep(-110.0, 100.0)
            .chain(sweep(-5.0, 5.0))
            .chain(sweep(-20.0, 20.0))
            .chain(sweep(8.0, 9.2))
            .chain(sweep(-1e-3, 1e-3))
            .chain([1e-40, -1e-40, 1e30, -1e30, f32::MAX, f32::MIN])
            .chain([88.72, 89.0, 104.0, -87.5, -103.0, -104.0])
            .collect();
        for (f, scalar) in FUNCS {
            let ys = map_of(f, &xs);
            for (&x, &y) in xs.iter().zip(&ys) {
                assert!(
                    same(y, scalar(x)),
                    "{f:?}({x:e}) = {y:e}, the scalar form {:e}",
                    scalar(x)
                );
            }
        }
    }

    #[test]
    fn specials_in_every_lane_leave_the_other_lanes_alone() {
        if !avx2() {
            return;
        }
        use super::super::{exp_f32 as exp, gelu_f32 as gelu, sigmoid_f32 as sigmoid};
        let l = TANH_LIMIT;
        let specials: [(f32, [f32; 4]); 12] = [
            // (x, [exp, sigmoid, tanh, gelu])
            (f32::NAN, [f32::NAN, f32::NAN, f32::NAN, f32::NAN]),
            (f32::INFINITY, [f32::INFINITY, 1.0, 1.0, f32::INFINITY]),
            (f32::NEG_INFINITY, [0.0, 0.0, -1.0, f32::NAN]),
            (0.0, [1.0, 0.5, 0.0, 0.0]),
            (-0.0, [1.0, 0.5, -0.0, -0.0]),
            (-200.0, [0.0, 0.0, -1.0, -0.0]),
            (200.0, [f32::INFINITY, 1.0, 1.0, 200.0]),
            (89.0, [f32::INFINITY, 1.0, 1.0, 89.0]),
            (l, [exp(l), sigmoid(l), 1.0, gelu(l)]),
            (-l, [exp(-l), sigmoid(-l), -1.0, gelu(-l)]),
            (19.0, [exp(19.0), sigmoid(19.0), 1.0, 19.0]),
            (-19.0, [exp(-19.0), sigmoid(-19.0), -1.0, gelu(-19.0)]),
        ];
        for (k, (f, scalar)) in FUNCS.into_iter().enumerate() {
            let ordinary = scalar(0.5);
            for &(x, want) in &specials {
                for lane in 0..LANES {
                    let mut xs = vec![0.5f32; LANES + 3];
                    xs[lane] = x;
                    let ys = map_of(f, &xs);
                    assert!(
                        same(ys[lane], want[k]),
                        "{f:?}({x}) = {} in lane {lane}",
                        ys[lane]
                    );
                    assert!(
                        ys.iter()
                            .enumerate()
                            .all(|(i, &y)| i == lane || y.to_bits() == ordinary.to_bits()),
                        "{f:?}({x}) in lane {lane} changed the other lanes"
                    );
                }
            }
        }
    }

    #[test]
    fn every_entry_point_writes_exactly_its_values_at_every_length_and_offset() {
        if !avx2() {
            return;
        }
        for (f, scalar) in FUNCS {
            for n in [0, 1, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100] {
                // `ys` starts at each f32 offset from a 32-byte boundary, so that the streamed
                // form's head and tail take every length.
                for offset in 0..LANES {
                    let xs: Vec<f32> = (0..n).map(|i| (i as f32) * 0.37 - 9.0).collect();
                    let mut buf = vec![f32::NAN; n + 2 * LANES + 8];
                    let start = buf.as_ptr().align_offset(VECTOR_BYTES) + offset;
                    let ys = &mut buf[start..start + n];
                    // SAFETY: checked for AVX2 and FMA above; the fence orders the streamed
                    // stores.
                    unsafe {
                        map_streamed(f, &xs, ys);
                        std::arch::x86_64::_mm_sfence();
                    }
                    for (i, &x) in xs.iter().enumerate() {
                        assert_eq!(
                            buf[start + i].to_bits(),
                            scalar(x).to_bits(),
                            "{f:?}, n {n}, offset {offset}, i {i}"
                        );
                    }
                    assert!(
                        buf[..start]
                            .iter()
                            .chain(&buf[start + n..])
                            .all(|y| y.is_nan()),
                        "{f:?}, n {n}, offset {offset}: wrote outside its values"
                    );
                    // The other entry points, on the same lengths.
                    let ys = map_of(f, &xs);
                    assert!(ys.iter().zip(&xs).all(|(y, &x)| same(*y, scalar(x))));
                }
            }
        }
    }
}
