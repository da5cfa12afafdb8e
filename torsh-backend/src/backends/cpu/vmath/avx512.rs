//! AVX-512 forms of `vmath` functions whose best instruction sequence the compiler does not reach
//! from the scalar source: a block of f32 at a time, on explicit vectors.
//!
//! eˣ ([`Func::Exp`]) applies 2ⁿ with `vscalefps`, which multiplies by a power of two given as a
//! float and rounds once, subnormal and infinite results included. The scalar
//! [`exp_f32`](super::exp_f32) builds the power from the exponent bits in two factors chosen by
//! the sign, to keep it normal: about 18 instructions a vector against 12 here, on the same
//! reduction and polynomial. The sigmoid ([`Func::Sigmoid`]) is the scalar one's formula on that
//! exponential.
//!
//! tanh ([`Func::Tanh`]) and GELU ([`Func::Gelu`]) are the scalar forms' operations in the same
//! order, so they give the scalar forms' bits. Their gain is the path, not the instructions:
//! streamed straight from the registers, a large output skips the L1 block the compiled scalar
//! forms are written to first. Every loop prefetches its source a few KiB ahead
//! ([`PREFETCH_AHEAD`]), which the hardware prefetchers do not do for a loop this slow.

use std::arch::x86_64::{
    __m512, __mmask16, _mm512_abs_ps, _mm512_add_ps, _mm512_castps_si512, _mm512_castsi512_ps,
    _mm512_cmp_ps_mask, _mm512_div_ps, _mm512_fmadd_ps, _mm512_fmsub_ps, _mm512_fnmadd_ps,
    _mm512_loadu_ps, _mm512_mask_blend_ps, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps,
    _mm512_max_epi32, _mm512_max_ps, _mm512_min_ps, _mm512_mul_ps, _mm512_roundscale_ps,
    _mm512_scalef_ps, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_slli_epi32,
    _mm512_storeu_ps, _mm512_stream_ps, _mm512_sub_ps, _mm_prefetch, _CMP_LE_OQ, _CMP_LT_OQ,
    _MM_FROUND_NO_EXC, _MM_FROUND_TO_NEAREST_INT, _MM_HINT_T0,
};

use super::{
    EXP_MAX, EXP_MIN, EXP_REDUCED, LN2_HI, LN2_LO, LOG2E, ROUND_MAGIC, TAIL_MAGIC, TAIL_P, TAIL_Q,
    TANH_LIMIT, TANH_P, TANH_Q, TWO_POW_M64,
};

/// f32 lanes of a register.
const LANES: usize = 16;

/// eˣ in every lane, as [`exp_f32`](super::exp_f32) defines it (within 2 ulp, subnormal results
/// included, NaN kept, +∞ above [`EXP_MAX`], 0 below [`EXP_MIN`]).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp16(x: __m512) -> __m512 {
    // `max` and `min` return their second operand when either is NaN: NaN stays.
    let c = _mm512_min_ps(
        _mm512_set1_ps(EXP_MAX),
        _mm512_max_ps(_mm512_set1_ps(EXP_MIN), x),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(c, _mm512_set1_ps(LOG2E)),
    );
    // `c − n·LN2_HI` is exact (Cephes' split), as in `reduce_ln2`.
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), c);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_REDUCED[EXP_REDUCED.len() - 1]);
    for &k in EXP_REDUCED[..EXP_REDUCED.len() - 1].iter().rev() {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k));
    }
    // p·2ⁿ, rounded once; n ∈ [−150, 128] is integral, so `floor(n) = n`.
    _mm512_scalef_ps(p, n)
}

/// The lanes `0 .. n` of a mask, `n ≤ 16`.
#[inline(always)]
fn first(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// [`sigmoid_f32`](super::sigmoid_f32)'s `num / (1 + e)`, `e = e^−|x|` and `num` 1 for `x ≥ 0`,
/// `e` below, in every lane (within 3 ulp; NaN kept, 0 at −∞, 1 at +∞).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn sigmoid16(x: __m512) -> __m512 {
    let one = _mm512_set1_ps(1.0);
    // SAFETY: the caller's CPU contract.
    let e = unsafe { exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x))) };
    let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
    _mm512_div_ps(
        _mm512_mask_blend_ps(negative, one, e),
        _mm512_add_ps(one, e),
    )
}

/// `c[0] + z·(c[1] + z·(…))` in every lane, by fused multiply-adds from the highest degree down,
/// as the scalar `horner` evaluates it.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn horner16<const N: usize>(z: __m512, c: [f32; N]) -> __m512 {
    let mut p = _mm512_set1_ps(c[N - 1]);
    for &k in c[..N - 1].iter().rev() {
        p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(k));
    }
    p
}

/// [`tanh_f32`](super::tanh_f32) in every lane, bit for bit: `c·P(c²)/Q(c²)` on `c = x` clamped
/// to ±[`TANH_LIMIT`], the result clamped to ±1 (NaN kept, ±0 kept, ±1 at ±∞).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tanh16(x: __m512) -> __m512 {
    // `max` and `min` return their second operand when either is NaN: NaN stays.
    let c = _mm512_min_ps(
        _mm512_set1_ps(TANH_LIMIT),
        _mm512_max_ps(_mm512_set1_ps(-TANH_LIMIT), x),
    );
    let z = _mm512_mul_ps(c, c);
    let r = _mm512_div_ps(_mm512_mul_ps(c, horner16(z, TANH_P)), horner16(z, TANH_Q));
    _mm512_min_ps(_mm512_set1_ps(1.0), _mm512_max_ps(_mm512_set1_ps(-1.0), r))
}

/// [`gelu_f32`](super::gelu_f32) in every lane, bit for bit: `w = x·Φ(−|x|)` from the scaled
/// normal tail (`normal_tail_scaled`: `Φ(−t) = e^(−t²/2)·P(t)/Q(t)`, `t = min(|x|, 19)`, the
/// exponential's power read from the rounding's bits), the result `w` for `x ≤ 0` and `x − w`
/// above (NaN kept, +∞ at +∞, NaN at −∞ as `−∞ · 0`).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn gelu16(x: __m512) -> __m512 {
    // `min` returns its second operand when either is NaN: NaN becomes 19, as `f32::min` does.
    let t = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(19.0));
    let sq = _mm512_mul_ps(t, t);
    let sq_lo = _mm512_fmsub_ps(t, t, sq);
    let h = _mm512_mul_ps(_mm512_set1_ps(-0.5), sq);
    let k = _mm512_fmadd_ps(h, _mm512_set1_ps(LOG2E), _mm512_set1_ps(TAIL_MAGIC));
    let n = _mm512_sub_ps(k, _mm512_set1_ps(TAIL_MAGIC));
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), h);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    let r = _mm512_fmadd_ps(sq_lo, _mm512_set1_ps(-0.5), r);
    // Below `ROUND_MAGIC` (n + 191 < 0) the power is 0.
    let bits = _mm512_max_epi32(
        _mm512_castps_si512(k),
        _mm512_set1_epi32(ROUND_MAGIC.to_bits() as i32),
    );
    let power = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(bits));
    let e = _mm512_mul_ps(horner16(r, EXP_REDUCED), power);
    let tail = _mm512_mul_ps(e, _mm512_div_ps(horner16(t, TAIL_P), horner16(t, TAIL_Q)));
    // Capped above so that +∞ takes `∞ − 0`; −∞ keeps `−∞ · 0`.
    let w = _mm512_mul_ps(
        _mm512_mul_ps(_mm512_min_ps(x, _mm512_set1_ps(19.0)), tail),
        _mm512_set1_ps(TWO_POW_M64),
    );
    let nonpositive = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, _mm512_setzero_ps());
    _mm512_mask_blend_ps(nonpositive, _mm512_sub_ps(x, w), w)
}

/// A function with an AVX-512 form here, as the `vmath` function of the same name computes it.
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
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn apply<const F: u8>(x: __m512) -> __m512 {
    // SAFETY: the caller's CPU contract.
    unsafe {
        match F {
            SIGMOID => sigmoid16(x),
            TANH => tanh16(x),
            GELU => gelu16(x),
            _ => exp16(x),
        }
    }
}

/// Elements of the source [`run`] prefetches ahead of the vector it loads: 4 KiB.
///
/// The hardware prefetchers alone keep a stream's loads ahead only while the loop asks for lines
/// quickly; with a function's arithmetic between the loads they fall behind, and each vector waits
/// on memory. On a 2-vCPU Xeon VM (AVX-512) a standalone GELU loop over 64 MiB took 18 ms without
/// prefetches, 11 ms at 2 KiB ahead, 8.7 ms at 4 KiB (its arithmetic alone, in L1: 7.6 ms) and no
/// less further ahead; a copy through the same loop did not slow down.
const PREFETCH_AHEAD: usize = 1024;

/// `n` values of `F` from `src` to `dst` (which may be `src`, each vector being read before it is
/// written): whole vectors with streaming stores when `STREAM` (unfenced; `dst` 64-byte aligned),
/// else ordinary ones, and a last partial vector with masked loads and an ordinary masked store;
/// the source is prefetched [`PREFETCH_AHEAD`] elements ahead.
///
/// # Safety
/// The CPU has AVX-512F; `src` is valid for reads and `dst` for writes of `n` f32, and they are
/// the same pointer or do not overlap; with `STREAM`, `dst` is 64-byte aligned.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn run<const F: u8, const STREAM: bool>(src: *const f32, dst: *mut f32, n: usize) {
    let mut i = 0;
    // SAFETY: every access is to lanes `i .. i + 16 ≤ n`, or to the masked lanes below `n` (a
    // masked load or store touches no other lane); with `STREAM` `dst + i` is 64-byte aligned.
    unsafe {
        while i + LANES <= n {
            // A hint: never faults, even past the end of `src`.
            _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(i + PREFETCH_AHEAD).cast());
            let v = apply::<F>(_mm512_loadu_ps(src.add(i)));
            if STREAM {
                _mm512_stream_ps(dst.add(i), v);
            } else {
                _mm512_storeu_ps(dst.add(i), v);
            }
            i += LANES;
        }
        if i < n {
            let m = first(n - i);
            let v = apply::<F>(_mm512_maskz_loadu_ps(m, src.add(i)));
            _mm512_mask_storeu_ps(dst.add(i), m, v);
        }
    }
}

/// [`run`] for `f`.
///
/// # Safety
/// As [`run`].
#[inline]
#[target_feature(enable = "avx512f")]
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
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn map(f: Func, xs: &[f32], ys: &mut [f32]) {
    // SAFETY: both slices hold the `n` elements and do not overlap (a shared and an exclusive
    // borrow); the caller's CPU contract.
    unsafe { run_func::<false>(f, xs.as_ptr(), ys.as_mut_ptr(), xs.len().min(ys.len())) }
}

/// [`map`] with streaming stores: `ys[i] = f(xs[i])` for `i < min(xs.len(), ys.len())`, each
/// whole 64-byte line of `ys` written past the cache straight from the register (unfenced: the
/// caller fences, as `Streamer` does), a last partial line with an ordinary masked store. Returns
/// `false`, writing nothing, when `ys` does not start on a 64-byte line.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn map_streamed(f: Func, xs: &[f32], ys: &mut [f32]) -> bool {
    if ys.as_ptr().cast::<u8>().align_offset(64) != 0 {
        return false;
    }
    // SAFETY: as in `map`, and `ys` starts on a line (checked above).
    unsafe { run_func::<true>(f, xs.as_ptr(), ys.as_mut_ptr(), xs.len().min(ys.len())) };
    true
}

/// `b[i] = f(b[i])`, as [`map`].
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn map_in_place(f: Func, b: &mut [f32]) {
    let p = b.as_mut_ptr();
    // SAFETY: source and destination are the one slice; the caller's CPU contract.
    unsafe { run_func::<false>(f, p, p, b.len()) }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{sweep, ulp_error};
    use super::*;

    /// Whether this CPU runs the forms; when it does not, says so on stderr, since the calling
    /// test then checks nothing (the scalar forms are tested in `vmath`).
    fn avx512() -> bool {
        let has = std::arch::is_x86_feature_detected!("avx512f");
        if !has {
            eprintln!("skipped: this CPU has no AVX-512F, which the forms under test need");
        }
        has
    }

    /// `f` over `xs`, through both entry points, checked to agree.
    fn map_of(f: Func, xs: &[f32]) -> Vec<f32> {
        let mut ys = vec![f32::NAN; xs.len()];
        let mut b = xs.to_vec();
        // SAFETY: the callers checked for AVX-512F.
        unsafe {
            map(f, xs, &mut ys);
            map_in_place(f, &mut b);
        }
        for (y, v) in ys.iter().zip(&b) {
            assert_eq!(y.to_bits(), v.to_bits());
        }
        ys
    }

    /// `f` at each special `(x, want)` in every lane of a register among ordinary values (0.5):
    /// `want` in that lane (any NaN for NaN), and values `ordinary_ok` accepts in the others.
    fn specials_in_every_lane(f: Func, specials: &[(f32, f32)], ordinary_ok: impl Fn(f32) -> bool) {
        for &(x, want) in specials {
            for lane in 0..LANES {
                let mut xs = vec![0.5f32; LANES + 3];
                xs[lane] = x;
                let ys = map_of(f, &xs);
                let y = ys[lane];
                assert!(
                    y.to_bits() == want.to_bits() || (want.is_nan() && y.is_nan()),
                    "{f:?}({x}) = {y} in lane {lane}"
                );
                assert!(
                    ys.iter()
                        .enumerate()
                        .all(|(i, &y)| i == lane || ordinary_ok(y)),
                    "{f:?}({x}) in lane {lane} changed the other lanes"
                );
            }
        }
    }

    /// `exp` over `xs`.
    fn exp_of(xs: &[f32]) -> Vec<f32> {
        map_of(Func::Exp, xs)
    }

    #[test]
    fn exp_is_within_two_ulp_everywhere() {
        if !avx512() {
            return;
        }
        let xs: Vec<f32> = sweep(-103.9, 88.7).chain(sweep(-1.0, 1.0)).collect();
        let ys = exp_of(&xs);
        let worst = xs
            .iter()
            .zip(&ys)
            .map(|(&x, &y)| (ulp_error(y, (x as f64).exp()), x))
            .max_by_key(|w| w.0)
            .unwrap_or((0, 0.0));
        assert!(worst.0 <= 2, "exp is {} ulp off at {}", worst.0, worst.1);
    }

    #[test]
    fn exp_handles_specials_in_every_lane() {
        if !avx512() {
            return;
        }
        let specials = [
            (f32::NAN, f32::NAN),
            (f32::INFINITY, f32::INFINITY),
            (f32::NEG_INFINITY, 0.0),
            (89.0, f32::INFINITY),
            (88.8, f32::INFINITY),
            (0.0, 1.0),
            (-0.0, 1.0),
            (-200.0, 0.0),
            (-104.5, 0.0),
        ];
        // Each special at every lane of a register, among ordinary values.
        for &(x, want) in &specials {
            for lane in 0..LANES {
                let mut xs = vec![0.5f32; LANES];
                xs[lane] = x;
                let ys = exp_of(&xs);
                assert!(
                    ys[lane].to_bits() == want.to_bits() || (want.is_nan() && ys[lane].is_nan()),
                    "exp({x}) = {} in lane {lane}",
                    ys[lane]
                );
                assert!(ys
                    .iter()
                    .enumerate()
                    .all(|(i, &y)| i == lane || y == 0.5f32.exp()));
            }
        }
        // Subnormal and largest finite results.
        for x in [-87.5f32, -100.0, -103.0, 88.5, 88.72] {
            let y = exp_of(&[x])[0];
            assert!(ulp_error(y, (x as f64).exp()) <= 2, "exp({x}) = {y:e}");
        }
    }

    #[test]
    fn streamed_forms_match_on_lines_and_decline_off_them() {
        if !avx512() {
            return;
        }
        for f in [Func::Exp, Func::Sigmoid, Func::Tanh, Func::Gelu] {
            for n in [0, 1, 15, 16, 17, 100, 1000] {
                let xs: Vec<f32> = (0..n).map(|i| (i as f32) * 0.173 - 80.0).collect();
                let mut buf = vec![f32::NAN; n + 48];
                // `ys` starts on a 64-byte line.
                let line = buf.as_ptr().align_offset(64);
                let ys = &mut buf[line..];
                let mut want = vec![0.0f32; n];
                // SAFETY: checked for AVX-512F above; the sfence orders the streamed stores.
                unsafe {
                    map(f, &xs, &mut want);
                    assert!(map_streamed(f, &xs, &mut ys[..n]));
                    std::arch::x86_64::_mm_sfence();
                    assert!(!map_streamed(f, &xs, &mut ys[1..n + 1]));
                }
                for i in 0..n {
                    assert_eq!(ys[i].to_bits(), want[i].to_bits(), "{f:?}, n {n}, i {i}");
                }
                assert!(ys[n..].iter().all(|y| y.is_nan()), "{f:?} wrote past {n}");
            }
        }
    }

    #[test]
    fn exp_writes_exactly_its_lanes_at_every_length() {
        if !avx512() {
            return;
        }
        for n in [0, 1, 5, 15, 16, 17, 31, 33, 100] {
            let xs: Vec<f32> = (0..n).map(|i| (i as f32) * 0.37 - 9.0).collect();
            let mut ys = vec![f32::NAN; n + 7];
            // SAFETY: checked for AVX-512F above.
            unsafe { map(Func::Exp, &xs, &mut ys[..n]) };
            for (i, &x) in xs.iter().enumerate() {
                assert!(ulp_error(ys[i], (x as f64).exp()) <= 2, "n {n}, i {i}");
            }
            assert!(ys[n..].iter().all(|y| y.is_nan()), "wrote past {n}");
        }
    }

    #[test]
    fn sigmoid_matches_the_scalar_form_within_three_ulp() {
        if !avx512() {
            return;
        }
        let sigmoid64 = |x: f64| {
            if x >= 0.0 {
                1.0 / (1.0 + (-x).exp())
            } else {
                x.exp() / (1.0 + x.exp())
            }
        };
        let xs: Vec<f32> = sweep(-110.0, 100.0).chain(sweep(-5.0, 5.0)).collect();
        let ys = map_of(Func::Sigmoid, &xs);
        for (&x, &y) in xs.iter().zip(&ys) {
            assert!(
                ulp_error(y, sigmoid64(x as f64)) <= 3,
                "sigmoid({x}) = {y:e}"
            );
        }
        // Specials in every lane, among ordinary values.
        let specials = [
            (f32::NAN, f32::NAN),
            (f32::INFINITY, 1.0),
            (f32::NEG_INFINITY, 0.0),
            (0.0, 0.5),
            (-0.0, 0.5),
            (-200.0, 0.0),
            (200.0, 1.0),
        ];
        let ordinary = super::super::sigmoid_f32(0.5);
        specials_in_every_lane(Func::Sigmoid, &specials, |y| {
            ulp_error(y, ordinary as f64) <= 1
        });
    }

    #[test]
    fn tanh_gives_the_scalar_forms_bits() {
        if !avx512() {
            return;
        }
        let scalar = super::super::tanh_f32;
        // Both sides of the clamp, the region where the rational exceeds 1 before the final
        // clamp, tiny and subnormal arguments.
        let xs: Vec<f32> = sweep(-12.0, 12.0)
            .chain(sweep(8.0, 9.2))
            .chain(sweep(-1e-3, 1e-3))
            .chain([1e-40, -1e-40, 1e30, -1e30, f32::MAX, f32::MIN])
            .collect();
        let ys = map_of(Func::Tanh, &xs);
        for (&x, &y) in xs.iter().zip(&ys) {
            assert_eq!(y.to_bits(), scalar(x).to_bits(), "tanh({x:e}) = {y:e}");
        }
        // Specials in every lane, among ordinary values.
        let specials = [
            (f32::NAN, f32::NAN),
            (f32::INFINITY, 1.0),
            (f32::NEG_INFINITY, -1.0),
            (0.0, 0.0),
            (-0.0, -0.0),
            (TANH_LIMIT, 1.0),
            (-TANH_LIMIT, -1.0),
        ];
        let ordinary = scalar(0.5);
        specials_in_every_lane(Func::Tanh, &specials, |y| y.to_bits() == ordinary.to_bits());
    }

    #[test]
    fn gelu_gives_the_scalar_forms_bits() {
        if !avx512() {
            return;
        }
        let scalar = super::super::gelu_f32;
        // The tails, where the power of two is 0 (beyond about 16.2) and where the result is
        // subnormal, the cap at 19, and the middle.
        let xs: Vec<f32> = sweep(-25.0, 25.0)
            .chain(sweep(-3.0, 3.0))
            .chain(sweep(-1e-3, 1e-3))
            .chain([1e-40, -1e-40, 1e30, -1e30, f32::MAX, f32::MIN, 19.0, -19.0])
            .collect();
        let ys = map_of(Func::Gelu, &xs);
        for (&x, &y) in xs.iter().zip(&ys) {
            assert!(
                y.to_bits() == scalar(x).to_bits() || (y.is_nan() && scalar(x).is_nan()),
                "gelu({x:e}) = {y:e}, the scalar form {:e}",
                scalar(x)
            );
        }
        // Specials in every lane, among ordinary values.
        let specials = [
            (f32::NAN, f32::NAN),
            (f32::INFINITY, f32::INFINITY),
            (f32::NEG_INFINITY, f32::NAN),
            (0.0, 0.0),
            (-0.0, -0.0),
        ];
        let ordinary = scalar(0.5);
        specials_in_every_lane(Func::Gelu, &specials, |y| y.to_bits() == ordinary.to_bits());
    }
}
