//! Vectorisable f32 math: branch-free polynomial and rational kernels that LLVM turns into SIMD code
//! when they are inlined into a loop compiled by [`super::host::with_simd`]. Each is accurate to a
//! few ulp (at most 6) over its whole domain (tests below measure the worst case against f64), propagates NaN, and gives the IEEE
//! answers at ±∞ — except [`exp_nonpositive_f32`], the softmax's exponential, whose documented
//! domain is `x ≤ 0` and which flushes results below 2⁻¹²⁶ towards 0.
//!
//! Where an instruction the compiler does not reach from this scalar source makes a function much
//! cheaper, modules `avx512` and `avx2` have its explicit vector form on the same reduction and
//! polynomial.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

/// 1.5 · 2²³: adding and subtracting it rounds an f32 of magnitude below 2²² to the nearest integer.
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;

/// 2⁻⁶⁴: the scale by which [`exp_f32`] and [`normal_tail_scaled`] keep their intermediate
/// powers of two normal.
pub(crate) const TWO_POW_M64: f32 = f32::from_bits(0x1f80_0000);

/// `x` rounded to the nearest integer, as `(float, int)`, for `|x| < 2²²`: the integer is read from
/// the low mantissa bits of `x + ROUND_MAGIC` rather than converted with `as i32`, whose saturating
/// semantics LLVM does not vectorise (it scalarises the whole loop around it). NaN gives garbage;
/// callers select NaN themselves.
#[inline(always)]
fn round_parts(x: f32) -> (f32, i32) {
    let t = x + ROUND_MAGIC;
    let n = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    (t - ROUND_MAGIC, n)
}

/// log₂ e.
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n · LN2_HI` is exact for integral `|n| < 2⁹` (Cephes' constants).
pub(crate) const LN2_HI: f32 = 0.693_359_4;
/// ln 2 − [`LN2_HI`].
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;

/// `x − n·ln 2` for an integral `n`, `|n| < 2⁹`, with no rounding error from the first product.
#[inline(always)]
pub(crate) fn reduce_ln2(x: f32, n: f32) -> f32 {
    n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x))
}

/// eʳ for the reduced argument `|r| ≤ ln 2 / 2` (a little beyond loses nothing), within 1 ulp:
/// `1 + r + r²·q(r)` by Horner's rule, six fused multiply-adds, with `q` of degree 4 fitted for
/// the least maximum relative error of the whole (3.1·10⁻⁹ before rounding the coefficients to
/// f32).
#[inline(always)]
pub(crate) fn exp_reduced(r: f32) -> f32 {
    horner(r, EXP_REDUCED)
}

/// The coefficients of [`exp_reduced`]'s polynomial, constant term first.
pub(crate) const EXP_REDUCED: [f32; 7] = [
    1.0,
    1.0,
    0.499_999_94,
    0.166_665_21,
    4.166_839e-2,
    8.368_745e-3,
    1.381_454e-3,
];

/// The largest argument [`exp_f32`] computes (above, every result is +∞).
pub(crate) const EXP_MAX: f32 = 89.0;
/// The smallest argument [`exp_f32`] computes (below, every result rounds to 0).
pub(crate) const EXP_MIN: f32 = -104.0;

/// eˣ in f32, within 2 ulp, subnormal results included (the reduction and polynomial of
/// [`exp_reduced`] on `r = x − n·ln 2`, `|r| ≤ ln 2 / 2`). 2ⁿ is applied as `2^(n∓64)·2^(±64)`
/// (the sign of `x` choosing), so that the first factor, read from the rounding's bits, is normal
/// for every `n` in [−150, 128] and the result is rounded once, to a subnormal or to ∞ alike.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let clamped = x.clamp(EXP_MIN, EXP_MAX);
    let negative = clamped < 0.0;
    // 1.5 · 2²³ + 127 ± 64: the rounding leaves n + 127 ± 64 in the low mantissa bits.
    let magic = if negative {
        ROUND_MAGIC + 191.0
    } else {
        ROUND_MAGIC + 63.0
    };
    let last = if negative {
        TWO_POW_M64
    } else {
        f32::from_bits(0x5f80_0000) // 2⁶⁴
    };
    let t = clamped.mul_add(LOG2E, magic);
    let e = exp_reduced(reduce_ln2(clamped, t - magic));
    // Shifted left by 23, the bits of `ROUND_MAGIC` leave and n + 127 ± 64 (within [41, 191])
    // lands in the exponent field. NaN needs no select: `clamp` keeps it, and `e` carries it.
    e * f32::from_bits(t.to_bits() << 23) * last
}

/// The coefficients of [`exp_nonpositive_f32`]'s polynomial, constant term first: `1 + r +
/// r²·q(r)` with `q` of degree 3, fitted for the least maximum relative error of the whole on
/// `|r| ≤ ln 2 / 2` (1.1·10⁻⁷ with the coefficients rounded to f32), one degree below
/// [`EXP_REDUCED`].
pub(crate) const EXP_SHIFTED: [f32; 6] = [
    1.0,
    1.0,
    0.499_992_28,
    0.166_671_16,
    4.189_054_7e-2,
    8.312_476e-3,
];

/// eˣ for the arguments of a softmax, `x ≤ 0` (`x − max` of a row), within 2 ulp where the result
/// is at least 2⁻¹²⁶ (measured over every f32 in [−88, 0]): [`exp_f32`]'s reduction with the
/// polynomial of [`EXP_SHIFTED`], one degree lower, 2ⁿ built in one step from the rounding's
/// bits and no clamp from above. Results below 2⁻¹²⁶ flush towards 0 (an absolute error under
/// 2⁻¹²⁶; −∞ gives exactly 0) and NaN propagates. Positive arguments are outside the domain: up
/// to 88 they give eˣ within the same bound; above, the result is unspecified (a wrong finite
/// value, +∞ or NaN), which callers never ask for (`x − max` of the values the max was taken
/// over is never positive).
#[inline(always)]
pub(crate) fn exp_nonpositive_f32(x: f32) -> f32 {
    // 1.5 · 2²³ + 127: the rounding leaves n + 127 in the low mantissa bits of `t`.
    const BIASED_MAGIC: f32 = ROUND_MAGIC + 127.0;
    // A clamp from below that keeps NaN (the comparison is false for it): one `max` instruction.
    let clamped = if x < -104.0 { -104.0 } else { x };
    let t = clamped.mul_add(LOG2E, BIASED_MAGIC);
    let e = horner(reduce_ln2(clamped, t - BIASED_MAGIC), EXP_SHIFTED);
    // `t`'s bits are those of `ROUND_MAGIC` plus n + 127 for n ∈ [−150, 127]; below
    // `ROUND_MAGIC` (n < −127) the power is 0. Shifted left by 23, the bits of `ROUND_MAGIC`
    // leave (its low 9 are zero) and n + 127 lands in the exponent field.
    let bits = (t.to_bits() as i32).max(ROUND_MAGIC.to_bits() as i32) as u32;
    // NaN needs no select: the clamp keeps it, and `e` carries it through the product.
    e * f32::from_bits(bits << 23)
}

/// Evaluates the polynomial with coefficients `c` (constant term first) at `x`, by Horner's rule with
/// fused multiply-adds.
#[inline(always)]
fn horner<const N: usize>(x: f32, c: [f32; N]) -> f32 {
    let mut p = c[N - 1];
    for &k in c[..N - 1].iter().rev() {
        p = p.mul_add(x, k);
    }
    p
}

/// e^(hi + g + lo) in f32 as `(m, n)` with value `m·2ⁿ` (`m` within [0.7, 1.5], `n` within
/// [−220, 220]; `hi` is clamped to [−150, 150]), for `|g + lo| ≲ 2`: [`exp_f32`]'s reduction with `g` and `lo` added to the exactly
/// reduced argument one after the other, so an argument known to more than f32 precision loses
/// nothing to its rounding, and the caller can scale after multiplying (no subnormal intermediate).
/// NaN in `hi` gives garbage: callers select NaN themselves.
#[inline(always)]
fn exp_parts(hi: f32, g: f32, lo: f32) -> (f32, i32) {
    let clamped = hi.clamp(-150.0, 150.0);
    let (n, n_int) = round_parts((clamped + g) * LOG2E);
    // `clamped − n·LN2_HI` is exact (Cephes' split), so `g` and `lo` enter at full precision.
    let r = n.mul_add(-LN2_LO, (n.mul_add(-LN2_HI, clamped) + g) + lo);
    (exp_reduced(r), n_int)
}

/// `v·2ⁿ` for `n` within [−252, 252], rounded once (in two exact power-of-two steps, so subnormal
/// results are right).
#[inline(always)]
fn ldexp(v: f32, n: i32) -> f32 {
    let scale = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let half = n >> 1;
    v * scale(half) * scale(n - half)
}

/// ln x in f32, within 1 ulp (FreeBSD's `logf`: `x = 2ᵏ·m` with `m ∈ [√2/2, √2)`, `f = m − 1`,
/// `s = f/(2 + f)` and a degree-8 even polynomial in `s`), subnormal inputs included. `ln 0 = −∞`,
/// `ln x = NaN` for `x < 0`, `ln ∞ = ∞`.
#[inline(always)]
pub(crate) fn ln_f32(x: f32) -> f32 {
    // FreeBSD's `Lg1..Lg4` (|(log(1+s) − log(1−s))/s − Lg(s)| < 2⁻³⁴·²⁴) and ln 2 split in two.
    const LG1: f32 = f32::from_bits(0x3f2a_aaaa); // 0.666 666 627
    const LG2: f32 = f32::from_bits(0x3ecc_ce13); // 0.400 009 722
    const LG3: f32 = f32::from_bits(0x3e91_e9ee); // 0.284 987 867
    const LG4: f32 = f32::from_bits(0x3e78_9e26); // 0.242 790 788
    const LN2_HI: f32 = f32::from_bits(0x3f31_7180); // 0.693 138 123
    const LN2_LO: f32 = f32::from_bits(0x3717_f7d1); // 9.058 000 61e-6
    const SQRT_HALF_BITS: u32 = 0x3f35_04f3; // √2/2
    let subnormal = x < f32::MIN_POSITIVE;
    let scaled = if subnormal { x * 33_554_432.0 } else { x }; // × 2²⁵
    let bias = if subnormal { -25 } else { 0 };
    let ix = scaled.to_bits().wrapping_add(0x3f80_0000 - SQRT_HALF_BITS);
    let k = (ix >> 23) as i32 - 0x7f + bias;
    let m = f32::from_bits((ix & 0x007f_ffff) + SQRT_HALF_BITS);
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let r = z * w.mul_add(LG3, LG1) + w * w.mul_add(LG4, LG2);
    let hfsq = 0.5 * f * f;
    let dk = k as f32;
    let y = s.mul_add(hfsq + r, dk * LN2_LO) - hfsq + f + dk * LN2_HI;
    let y = if x == f32::INFINITY { x } else { y };
    let y = if x == 0.0 { f32::NEG_INFINITY } else { y };
    if x < 0.0 {
        f32::NAN
    } else if x.is_nan() {
        x
    } else {
        y
    }
}

/// The numerator of [`tanh_f32`]'s rational, `P(c²)`, lowest degree first.
pub(crate) const TANH_P: [f32; 5] = [
    1.0,
    f32::from_bits(0x3e08_f464), // 0.133 744 776
    f32::from_bits(0x3b64_93cc), // 3.487 813 29e-3
    f32::from_bits(0x37ab_cf03), // 2.048 118 59e-5
    f32::from_bits(0x3262_6314), // 1.317 745 91e-8
];

/// The denominator of [`tanh_f32`]'s rational, `Q(c²)`, lowest degree first.
pub(crate) const TANH_Q: [f32; 5] = [
    1.0,
    f32::from_bits(0x3eef_24d6), // 0.467 077 911
    f32::from_bits(0x3cd3_bded), // 2.584 739 96e-2
    f32::from_bits(0x39ab_986b), // 3.272 922 19e-4
    f32::from_bits(0x354e_cdb6), // 7.704 032 90e-7
];

/// Where [`tanh_f32`] clamps its argument: beyond it tanh x rounds to ±1, and the rational
/// evaluates to 1 there.
pub(crate) const TANH_LIMIT: f32 = 9.05;

/// tanh x in f32, within 6 ulp: `c·P(c²)/Q(c²)` on `c = x` clamped to ±[`TANH_LIMIT`], a (4, 4)
/// rational in `c²` ([`TANH_P`], [`TANH_Q`]) fitted for the least maximum relative error (0.4 ulp
/// before rounding; the rest is the f32 evaluation of `P` and `Q`, largest near 7), the result
/// clamped to ±1 (the evaluation exceeds 1 by up to 2 ulp between 8.1 and the limit). Eight fused
/// multiply-adds and one division, no exponential: about a third of the work of
/// `1 − 2/(e²ˣ + 1)`. `tanh ±0 = ±0`, ±1 at ±∞, NaN for NaN.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    odd_rational(x, TANH_LIMIT, TANH_P, TANH_Q)
}

/// `c·P(c²)/Q(c²)` for `c = x` clamped to `±limit`, clamped to ±1: the odd rational form of
/// [`tanh_f32`] and [`erf_f32`], whose fits (`scripts/fit-rational.py`) cover `[0, limit]` and
/// reach 1 at `limit`. `clamp` keeps NaN and the sign of zero.
#[inline(always)]
fn odd_rational<const N: usize>(x: f32, limit: f32, p: [f32; N], q: [f32; N]) -> f32 {
    let c = x.clamp(-limit, limit);
    let z = c * c;
    (c * horner(z, p) / horner(z, q)).clamp(-1.0, 1.0)
}

/// The logistic function `1/(1 + e⁻ˣ)` in f32, within 3 ulp, subnormal results included,
/// computed from `e = e^−|x|` so that neither sign overflows: `1/(1 + e)` for `x ≥ 0`, `e/(1 + e)`
/// below.
#[inline(always)]
pub(crate) fn sigmoid_f32(x: f32) -> f32 {
    let e = exp_minus_f32(x.abs());
    let num = if x >= 0.0 { 1.0 } else { e };
    num / (1.0 + e)
}

/// e⁻ᵃ in f32 for `a ≥ 0`, within 2 ulp, subnormal results included: [`exp_f32`] with the
/// clamp and the choice of scale that only negative exponents need (2ⁿ applied as
/// `2^(n+64)·2⁻⁶⁴`). NaN propagates; `a < 0` is outside the contract.
#[inline(always)]
fn exp_minus_f32(a: f32) -> f32 {
    // 1.5 · 2²³ + 127 + 64: the rounding leaves n + 191 in the low mantissa bits.
    const SCALED_MAGIC: f32 = ROUND_MAGIC + 191.0;
    // Written as a select, not `max`, so that NaN passes through.
    let clamped = if a > 104.0 { -104.0 } else { -a };
    let t = clamped.mul_add(LOG2E, SCALED_MAGIC);
    let e = exp_reduced(reduce_ln2(clamped, t - SCALED_MAGIC));
    // n + 191 lies within [41, 191]: shifted into the exponent field it is a normal power of two.
    e * f32::from_bits(t.to_bits() << 23) * TWO_POW_M64
}

/// `x · sigmoid(x)` in f32, within 4 ulp: `x/(1 + e⁻ˣ)` for `x ≥ 0`; for `x < 0`,
/// `(x·m/(1 + eˣ))·2ⁿ` with `eˣ = m·2ⁿ`, so results near the bottom of the normal range keep their
/// precision although `eˣ` alone would be subnormal.
#[inline(always)]
pub(crate) fn silu_f32(x: f32) -> f32 {
    let (m, n) = exp_parts(-x.abs(), 0.0, 0.0);
    let e = ldexp(m, n);
    let pos = x / (1.0 + e);
    // Below −200 the result rounds to −0 (and −∞ · 0 is NaN, as in the reference).
    let neg = if x < -200.0 {
        x * 0.0
    } else {
        ldexp(x * m / (1.0 + e), n)
    };
    let y = if x >= 0.0 { pos } else { neg };
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// erf x in f32, within 6 ulp: [`odd_rational`] with a (5, 5) rational in `c²`, `c = x` clamped
/// to about ±3.92 (beyond it erf x rounds to ±1, and the rational evaluates to 1 there), fitted for the least maximum relative error (0.4 ulp
/// before rounding; the rest is the f32 evaluation, largest near 3.7). Ten fused multiply-adds and
/// one division, every coefficient positive. `erf ±0 = ±0`, ±1 at ±∞, NaN for NaN.
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    const P: [f32; 6] = [
        f32::from_bits(0x3f90_6eba), // 1.128 379 11 (2/√π)
        f32::from_bits(0x3e44_25a3), // 0.191 549 823
        f32::from_bits(0x3d58_93c6), // 5.287 530 27e-2
        f32::from_bits(0x3b79_9191), // 3.808 114 91e-3
        f32::from_bits(0x3995_416d), // 2.846 824 06e-4
        f32::from_bits(0x3607_f3fe), // 2.025 858 98e-6
    ];
    const Q: [f32; 6] = [
        1.0,
        f32::from_bits(0x3f00_ca76), // 0.503 089 309
        f32::from_bits(0x3dea_9e17), // 0.114 559 345
        f32::from_bits(0x3c76_a945), // 1.505 500 54e-2
        f32::from_bits(0x3a99_7261), // 1.170 706 12e-3
        f32::from_bits(0x381e_acbc), // 3.783 100 69e-5
    ];
    odd_rational(x, f32::from_bits(0x407a_e14a), P, Q) // 3.920 000 6
}

/// The numerator of [`normal_tail_scaled`]'s rational in `t`, lowest degree first.
pub(crate) const TAIL_P: [f32; 5] = [
    0.5,
    f32::from_bits(0x3edf_df6c), // 0.437 251 449
    f32::from_bits(0x3e3a_d75f), // 0.182 462 201
    f32::from_bits(0x3d25_5dd1), // 0.040 372 673
    f32::from_bits(0x3b85_9d9b), // 0.004 077 626
];

/// The denominator of [`normal_tail_scaled`]'s rational in `t`, lowest degree first.
pub(crate) const TAIL_Q: [f32; 6] = [
    1.0,
    f32::from_bits(0x3fd6_10ce), // 1.672 387 84
    f32::from_bits(0x3f99_8269), // 1.199 292 30
    f32::from_bits(0x3eef_52ff), // 0.467 430 085
    f32::from_bits(0x3dcf_4524), // 0.101 206 094
    f32::from_bits(0x3c27_75d4), // 0.010 220 964
];

/// [`normal_tail_scaled`]'s rounding constant, 1.5 · 2²³ + 64 + 127: the rounding of
/// `−t²/2·log₂e` leaves n + 191 in the low mantissa bits.
pub(crate) const TAIL_MAGIC: f32 = ROUND_MAGIC + 191.0;

/// Φ(−t) and e^(−t²/2) for `t = min(a, 19)`, `a ≥ 0` (NaN is taken as 19), each scaled by 2⁶⁴ so
/// that both stay normal f32 where the unscaled values would be subnormal: a caller multiplies by
/// its own factor and then by [`TWO_POW_M64`], so that a subnormal result is rounded once.
///
/// `Φ(−t) = e^(−t²/2)·P(t)/Q(t)` with a (4, 5) rational fitted for relative error (6·10⁻⁹) on
/// `[0, 14]`; every coefficient is positive (no cancellation), and beyond 14, where Φ(−t) is
/// below f32's subnormals, the rational stays finite. `t²` is kept as a double-f32 so that the
/// exponent carries no rounding, and 2^(n + 64) is read from the bits of the rounding of
/// `−t²/2·log₂e` (one integer max makes it 0 where n < −190, i.e. `t` above about 16.2).
#[inline(always)]
fn normal_tail_scaled(a: f32) -> (f32, f32) {
    let t = a.min(19.0);
    let sq = t * t;
    let sq_lo = t.mul_add(t, -sq);
    let h = -0.5 * sq;
    let k = h.mul_add(LOG2E, TAIL_MAGIC);
    let n = k - TAIL_MAGIC;
    // `h − n·LN2_HI` is exact (Cephes' split), so the low parts enter at full precision.
    let r = sq_lo.mul_add(-0.5, n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, h)));
    // As in `exp_nonpositive_f32`: below `ROUND_MAGIC` (n + 191 < 0) the power is 0.
    let bits = (k.to_bits() as i32).max(ROUND_MAGIC.to_bits() as i32) as u32;
    let e = exp_reduced(r) * f32::from_bits(bits << 23);
    (e * (horner(t, TAIL_P) / horner(t, TAIL_Q)), e)
}

/// `(Φ(x), φ(x))`, the standard normal CDF and density, within 5 and 2 ulp (results below f32's
/// subnormals come out 0): [`normal_tail_scaled`] at `|x|`, with `Φ(x) = 1 − Φ(−x)` for `x ≥ 0`.
/// NaN for NaN.
#[inline(always)]
pub(crate) fn normal_cdf_pdf_f32(x: f32) -> (f32, f32) {
    const RSQRT_2PI: f32 = f32::from_bits(0x3ecc_422a); // 1/√(2π)
    let (tail, density) = normal_tail_scaled(x.abs());
    let tail = tail * TWO_POW_M64;
    let cdf = if x < 0.0 { tail } else { 1.0 - tail };
    let pdf = (density * RSQRT_2PI) * TWO_POW_M64;
    if x.is_nan() {
        (x, x)
    } else {
        (cdf, pdf)
    }
}

/// GELU, erf form: `x·Φ(x)`, within 6 ulp: `w = x·Φ(−|x|)` from [`normal_tail_scaled`] (rounded
/// once, so a subnormal result loses nothing), the result `w` for `x ≤ 0` and `x − w` for `x > 0`.
/// GELU(+∞) = +∞; GELU(−∞) is NaN, as `−∞ · 0` in the reference; NaN stays NaN.
#[inline(always)]
pub(crate) fn gelu_f32(x: f32) -> f32 {
    let (tail, _) = normal_tail_scaled(x.abs());
    // Capped above so that +∞ takes `∞ − 0` (Φ(−19) is 0); −∞ keeps `−∞ · 0`.
    let w = (x.min(19.0) * tail) * TWO_POW_M64;
    if x <= 0.0 {
        w
    } else {
        x - w
    }
}

/// GELU, tanh form: `x·(1 + tanh u)/2` with `u = √(2/π)·(x + 0.044715x³)`, computed as
/// `x / (1 + e⁻²ᵘ)` (no cancellation for negative `x`), within 4 ulp: `−2u` is carried as a
/// double-f32 into the exponential, whose argument would otherwise cost `|2u|` ulp. GELU(+∞) = +∞;
/// GELU(−∞) is NaN, as in the reference.
#[inline(always)]
pub(crate) fn gelu_tanh_f32(x: f32) -> f32 {
    // −2·√(2/π) and −2·√(2/π)·0.044715, each split in two.
    const K1: f32 = f32::from_bits(0xbfcc_422a); // −1.595 769 2
    const K1_LO: f32 = f32::from_bits(0x3342_bc9b); // 4.534 068e-8
    const K3: f32 = f32::from_bits(0xbd92_2279); // −0.071 354 81
    const K3_LO: f32 = f32::from_bits(0xb124_d8b5); // −2.398 832e-9
                                                    // Beyond ±20 the result is x or −0; the clamp keeps the products finite.
    let c = x.clamp(-20.0, 20.0);
    let c2 = c * c;
    let c2_lo = c.mul_add(c, -c2);
    // K3·c² + K1 = w + w_lo: an exact product, then Fast2Sum with the larger term first.
    let p = c2 * K3;
    let p_lo = c2.mul_add(K3, -p) + c2_lo.mul_add(K3, c2 * K3_LO);
    let (big, small) = if p < K1 { (p, K1) } else { (K1, p) };
    let w = big + small;
    let w_lo = (small - (w - big)) + (p_lo + K1_LO);
    // −2u = z + z_lo.
    let z = c * w;
    let z_lo = c.mul_add(w, -z) + c * w_lo;
    let (m, n) = exp_parts(z, 0.0, z_lo);
    // e⁻²ᵘ = m·2ⁿ; where it is large, x·2⁻ⁿ/(m + 2⁻ⁿ) keeps tiny results (and no overflow).
    let y = if z > 0.0 {
        ldexp(x / (m + ldexp(1.0, -n)), -n)
    } else {
        x / (1.0 + ldexp(m, n))
    };
    // Below −20 the result rounds to −0 (and −∞ · 0 is NaN, as in the reference).
    if x < -20.0 {
        x * 0.0
    } else {
        y
    }
}

/// An f16 (as bits) widened to f32, exactly (NaNs quieted, as F16C does). Branch-free, so it
/// vectorises.
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let body = (h & 0x7fff) << 13;
    let exp = body & 0x0f80_0000;
    let normal = body + ((127 - 15) << 23);
    // Inf/NaN: exponent all ones; NaNs get the quiet bit.
    let quiet = if body > 0x0f80_0000 { 0x0040_0000 } else { 0 };
    let special = (normal + ((128 - 16) << 23)) | quiet;
    // Subnormal: renormalise through an f32 subtraction.
    let sub = (f32::from_bits(normal + (1 << 23)) - f32::from_bits(113 << 23)).to_bits();
    let bits = if exp == 0x0f80_0000 {
        special
    } else if exp == 0 {
        sub
    } else {
        normal
    };
    f32::from_bits(bits | sign)
}

/// `x` rounded to the nearest f16 (ties to even), as bits; overflow gives ±∞, NaN a quiet NaN with
/// the top payload bits (as F16C does). Branch-free, so it vectorises.
#[inline(always)]
pub(crate) fn f32_to_f16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    let sign = (u >> 16) & 0x8000;
    let a = u & 0x7fff_ffff;
    // Normal range: rebias the exponent, round the 13 dropped bits to nearest even.
    let odd = (a >> 13) & 1;
    // (15 − 127) << 23 wrapped, plus 0xfff: with `odd`, rounds half to even.
    const REBIAS: u32 = 0xc800_0fff;
    let normal = a.wrapping_add(REBIAS + odd) >> 13;
    // Below 2⁻¹⁴: add 0.5 so the f32 adder rounds at the f16 subnormal quantum.
    let sub = (f32::from_bits(a) + 0.5)
        .to_bits()
        .wrapping_sub(0.5f32.to_bits());
    let special = if a > 0x7f80_0000 {
        0x7e00 | ((a >> 13) & 0x3ff)
    } else {
        0x7c00
    };
    let bits = if a >= 0x4780_0000 {
        special
    } else if a < 0x3880_0000 {
        sub
    } else {
        normal
    };
    (bits | sign) as u16
}

/// A bf16 (as bits) widened to f32, exactly (NaNs quieted, as `half` does).
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(h: u16) -> f32 {
    let quiet = if h & 0x7fff > 0x7f80 { 0x0040 } else { 0 };
    f32::from_bits(((h | quiet) as u32) << 16)
}

/// `x` rounded to the nearest bf16 (ties to even), as bits; NaN gives a quiet NaN (as `half` does).
#[inline(always)]
pub(crate) fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    let rounded = (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16;
    let nan = ((u >> 16) | 0x0040) as u16;
    if u & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// Distance in ulp between `got` and the f32 nearest to `want` (0 for matching NaNs/infinities).
    pub(crate) fn ulp_error(got: f32, want: f64) -> u32 {
        let want32 = want as f32;
        if want32.is_nan() && got.is_nan() || want32 == got {
            return 0;
        }
        if want32.is_nan() || got.is_nan() || want32.is_infinite() || got.is_infinite() {
            return u32::MAX;
        }
        let ordered = |v: f32| {
            let b = v.to_bits() as i32;
            if b < 0 {
                i32::MIN - b
            } else {
                b
            }
        };
        (ordered(got) as i64 - ordered(want32) as i64).unsigned_abs() as u32
    }

    /// 400 001 evenly spaced points of `[lo, hi]`, ends included.
    pub(crate) fn sweep(lo: f32, hi: f32) -> impl Iterator<Item = f32> {
        let step = (hi - lo) / 400_000.0;
        (0..=400_000).map(move |i| lo + step * i as f32)
    }

    #[test]
    fn exp_is_within_two_ulp_everywhere() {
        let mut worst = (0, 0.0f32);
        for x in sweep(-103.9, 88.7).chain(sweep(-1.0, 1.0)) {
            let e = ulp_error(super::exp_f32(x), (x as f64).exp());
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(
            worst.0 <= 2,
            "exp_f32 is {} ulp off at {}",
            worst.0,
            worst.1
        );
    }

    #[test]
    fn exp_handles_specials() {
        use super::exp_f32;
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-200.0), 0.0);
        // A subnormal result.
        assert!(super::tests::ulp_error(exp_f32(-100.0), (-100f64).exp()) <= 2);
    }

    #[test]
    fn exp_nonpositive_is_within_two_ulp_above_the_normal_range() {
        use super::exp_nonpositive_f32 as f;
        let mut worst = (0, 0.0f32);
        let xs = all_magnitudes(997)
            .map(|x| -x.abs())
            .chain(sweep(-88.0, 0.0))
            .chain(sweep(-1.0, 0.0));
        for x in xs {
            let (got, want) = (f(x), (x as f64).exp());
            if want < f32::MIN_POSITIVE as f64 {
                // Flushed towards zero: off by less than the smallest normal, never negative.
                assert!(
                    (0.0..f32::MIN_POSITIVE).contains(&got),
                    "exp({x:e}) = {got:e}"
                );
                continue;
            }
            let e = ulp_error(got, want);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 <= 2, "{} ulp off at {:e}", worst.0, worst.1);
        assert!(f(f32::NAN).is_nan());
        assert_eq!(f(f32::NEG_INFINITY), 0.0);
        assert_eq!(f(-200.0), 0.0);
        assert_eq!(f(0.0), 1.0);
        assert_eq!(f(-0.0), 1.0);
        // Positive arguments up to 88 are inside the bound too.
        for x in [1e-30, 0.5, 3.0, 40.0, 88.0] {
            assert!(ulp_error(f(x), (x as f64).exp()) <= 2, "exp({x})");
        }
    }

    /// Every `stride`-th f32 bit pattern from 0 up to +∞ (exclusive), both signs.
    fn all_magnitudes(stride: u32) -> impl Iterator<Item = f32> {
        (0..0x7f80_0000u32)
            .step_by(stride as usize)
            .flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
    }

    /// Asserts the worst error of `f` over `xs` is at most `bound` ulp where the exact result is a
    /// normal f32; results in the subnormal range (which keep fewer bits than intermediate roundings
    /// lose) need only be within half the smallest normal.
    fn check(
        name: &str,
        bound: u32,
        xs: impl Iterator<Item = f32>,
        f: impl Fn(f32) -> f32,
        want: impl Fn(f64) -> f64,
    ) {
        let mut worst = (0, 0.0f32);
        for x in xs {
            let (got, w) = (f(x), want(x as f64));
            if w.abs() < f32::MIN_POSITIVE as f64 {
                let e = (got as f64 - w).abs();
                assert!(
                    e <= f32::MIN_POSITIVE as f64 / 2.0,
                    "{name}({x:e}) = {got:e}, not {w:e}"
                );
                continue;
            }
            let e = ulp_error(got, w);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        let (e, x) = worst;
        assert!(e <= bound, "{name} is {e} ulp off at {x:e} (bound {bound})");
    }

    #[test]
    fn ln_is_within_one_ulp() {
        let xs = all_magnitudes(1009)
            .filter(|x| *x > 0.0)
            .chain(sweep(0.5, 2.0))
            .chain(sweep(1e-3, 10.0));
        check("ln_f32", 1, xs, super::ln_f32, f64::ln);
    }

    #[test]
    fn ln_handles_specials() {
        use super::ln_f32;
        assert_eq!(ln_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(ln_f32(-0.0), f32::NEG_INFINITY);
        assert!(ln_f32(-1.0).is_nan());
        assert!(ln_f32(f32::NEG_INFINITY).is_nan());
        assert!(ln_f32(f32::NAN).is_nan());
        assert_eq!(ln_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(ln_f32(1.0), 0.0);
        assert!(ulp_error(ln_f32(f32::from_bits(1)), (f32::from_bits(1) as f64).ln()) <= 1);
    }

    #[test]
    fn tanh_is_within_six_ulp() {
        let xs = sweep(-10.0, 10.0)
            .chain(sweep(-1.0, 1.0))
            .chain(sweep(0.6, 0.7))
            .chain(sweep(-1e-3, 1e-3))
            .chain(all_magnitudes(4099));
        check("tanh_f32", 6, xs, super::tanh_f32, f64::tanh);
        assert_eq!(super::tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(super::tanh_f32(f32::NEG_INFINITY), -1.0);
        assert!(super::tanh_f32(f32::NAN).is_nan());
        assert_eq!(super::tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    /// The logistic function in f64, as the reference computes it.
    fn sigmoid64(x: f64) -> f64 {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            x.exp() / (1.0 + x.exp())
        }
    }

    #[test]
    fn sigmoid_and_silu_are_within_three_ulp() {
        let xs = || {
            sweep(-110.0, 100.0)
                .chain(sweep(-5.0, 5.0))
                .chain(all_magnitudes(4099))
        };
        check("sigmoid_f32", 3, xs(), super::sigmoid_f32, sigmoid64);
        check("silu_f32", 4, xs(), super::silu_f32, |x| x * sigmoid64(x));
        use super::sigmoid_f32;
        assert_eq!(sigmoid_f32(f32::INFINITY), 1.0);
        assert_eq!(sigmoid_f32(f32::NEG_INFINITY), 0.0);
        assert!(sigmoid_f32(f32::NAN).is_nan());
        assert!(super::silu_f32(f32::NEG_INFINITY).is_nan());
        assert_eq!(super::silu_f32(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn erf_is_within_six_ulp() {
        let xs = sweep(-6.0, 6.0)
            .chain(sweep(-1.5, 1.5))
            .chain(sweep(-1e-3, 1e-3))
            .chain(all_magnitudes(4099));
        check("erf_f32", 6, xs, super::erf_f32, libm::erf);
        use super::erf_f32;
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
    }

    #[test]
    fn gelu_forms_are_accurate() {
        let gelu = |x: f64| 0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2);
        let xs = || {
            sweep(-14.0, 10.0)
                .chain(sweep(-2.0, 2.0))
                .chain(all_magnitudes(4099))
        };
        check("gelu_f32", 6, xs(), super::gelu_f32, gelu);
        let cdf = |x: f64| 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2);
        let pdf = |x: f64| (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        check(
            "normal cdf",
            5,
            xs(),
            |x| super::normal_cdf_pdf_f32(x).0,
            cdf,
        );
        check(
            "normal pdf",
            2,
            xs(),
            |x| super::normal_cdf_pdf_f32(x).1,
            pdf,
        );
        // 0.5·x·(1 + tanh u) = x / (1 + e^−2u), without the cancellation of the first form (which
        // makes the reference's own f64 result 0 below x ≈ −5.6).
        let gelu_tanh = |x: f64| {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            x / (1.0 + (-2.0 * c * (x + 0.044715 * x * x * x)).exp())
        };
        check("gelu_tanh_f32", 4, xs(), super::gelu_tanh_f32, gelu_tanh);
        for f in [super::gelu_f32, super::gelu_tanh_f32] {
            assert_eq!(f(f32::INFINITY), f32::INFINITY);
            assert!(f(f32::NEG_INFINITY).is_nan());
            assert!(f(f32::NAN).is_nan());
            assert_eq!(f(-30.0), 0.0);
            assert_eq!(f(30.0), 30.0);
        }
    }

    #[test]
    fn f16_conversions_match_half() {
        use half::f16;
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = super::f16_bits_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                "{h:#x}: {got:e} vs {want:e}"
            );
        }
        // Every f16, the midpoints to its neighbours (ties) and one f32 ulp either side of them.
        let mut xs = Vec::new();
        for h in 0..0x7c00u16 {
            let lo = f16::from_bits(h).to_f32() as f64;
            let hi = f16::from_bits(h + 1).to_f32() as f64;
            let mid = ((lo + hi) / 2.0) as f32;
            xs.extend([lo as f32, mid, f32::from_bits(mid.to_bits() + 1)]);
            if mid.to_bits() > 0 {
                xs.push(f32::from_bits(mid.to_bits() - 1));
            }
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            xs.push(f32::from_bits((state >> 32) as u32));
        }
        xs.extend([
            f32::INFINITY,
            f32::NAN,
            65_504.0,
            65_519.99,
            65_520.0,
            1e-8,
            3e-8,
        ]);
        for x in xs.iter().flat_map(|&x| [x, -x]) {
            let want = f16::from_f32(x).to_bits();
            let got = super::f32_to_f16_bits(x);
            let both_nan = f16::from_bits(got).is_nan() && x.is_nan();
            assert!(got == want || both_nan, "{x:e}: {got:#x} vs {want:#x}");
        }
    }

    #[test]
    fn bf16_conversions_match_half() {
        use half::bf16;
        for h in 0..=u16::MAX {
            let want = bf16::from_bits(h).to_f32();
            let got = super::bf16_bits_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                "{h:#x}"
            );
        }
        let mut xs = Vec::new();
        for h in 0..0x7f80u32 {
            let mid = (h << 16) | 0x8000;
            xs.extend([
                f32::from_bits(mid),
                f32::from_bits(mid + 1),
                f32::from_bits(mid - 1),
            ]);
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            xs.push(f32::from_bits((state >> 32) as u32));
        }
        xs.extend([f32::INFINITY, f32::NAN, f32::MAX]);
        for x in xs.iter().flat_map(|&x| [x, -x]) {
            let want = bf16::from_f32(x).to_bits();
            let got = super::f32_to_bf16_bits(x);
            assert!(got == want, "{x:e}: {got:#x} vs {want:#x}");
        }
    }
}
