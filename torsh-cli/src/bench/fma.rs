//! The FMA loops that measure a core's peak floating-point throughput: independent chains of fused
//! multiply-adds in registers, enough of them to hide the FMA latency, at the widest vector width the
//! CPU has (chosen at run time).

/// The instruction set an FMA loop runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FmaIsa {
    /// 512-bit `vfmadd` on zmm registers.
    Avx512,
    /// 256-bit `vfmadd` on ymm registers.
    Avx2Fma,
    /// No vector FMA known here: no peak is measured.
    None,
}

impl FmaIsa {
    /// The best FMA this CPU has.
    pub fn detect() -> FmaIsa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return FmaIsa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return FmaIsa::Avx2Fma;
            }
        }
        FmaIsa::None
    }

    /// How the loop is described in the output.
    pub fn describe(self) -> &'static str {
        match self {
            FmaIsa::Avx512 => "AVX-512 FMA loop, 16 independent zmm accumulators per thread",
            FmaIsa::Avx2Fma => "AVX2 FMA loop, 12 independent ymm accumulators per thread",
            FmaIsa::None => "no vector FMA on this CPU",
        }
    }

    /// Floating-point operations of one iteration of the loop in `f64` (else `f32`) lanes.
    pub fn flops_per_iter(self, f64_lanes: bool) -> f64 {
        let (accumulators, bytes) = match self {
            FmaIsa::Avx512 => (16.0, 64.0),
            FmaIsa::Avx2Fma => (12.0, 32.0),
            FmaIsa::None => return 0.0,
        };
        let lanes = if f64_lanes { bytes / 8.0 } else { bytes / 4.0 };
        accumulators * lanes * 2.0
    }

    /// Runs `iters` iterations of the loop and returns a value that depends on every FMA (so the
    /// loop cannot be removed).
    pub fn run(self, iters: u64, f64_lanes: bool) -> f64 {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: each loop runs only when `detect` found its instruction set on this CPU.
            unsafe {
                match (self, f64_lanes) {
                    (FmaIsa::Avx512, false) => return x86::avx512_f32(iters),
                    (FmaIsa::Avx512, true) => return x86::avx512_f64(iters),
                    (FmaIsa::Avx2Fma, false) => return x86::avx2_f32(iters),
                    (FmaIsa::Avx2Fma, true) => return x86::avx2_f64(iters),
                    (FmaIsa::None, _) => {}
                }
            }
        }
        let _ = (iters, f64_lanes);
        0.0
    }
}

/// The loops themselves. Each chain computes `acc = acc·a + b` with `a` just below 1 and
/// `b = 1 - a`, so the accumulators stay near 1 (no overflow, no denormals). Every constant passes
/// through `black_box` and each chain starts from its own value: otherwise the compiler folds the
/// FMAs (`fma(1, a, 1 - a)` rounds to 1) or merges identical chains.
#[cfg(target_arch = "x86_64")]
// The AVX-512 intrinsics are stable since Rust 1.89, above the workspace's declared 1.85; the workspace
// already needs more (the CPU backend's AVX-512 target features: 1.89; libloading 0.9: 1.88).
#[allow(clippy::incompatible_msrv)]
mod x86 {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// Distinct starting values of the chains, opaque to the compiler.
    fn starts() -> [f32; 16] {
        black_box(std::array::from_fn(|i| 1.0 + i as f32 / 64.0))
    }

    /// Unrolled `n` independent FMA chains over `$acc`.
    macro_rules! chains {
        ($fma:ident, $acc:ident, $a:ident, $b:ident) => {
            for acc in $acc.iter_mut() {
                *acc = $fma(*acc, $a, $b);
            }
        };
    }

    /// 16 chains of 512-bit f32 FMAs.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn avx512_f32(iters: u64) -> f64 {
        let a = _mm512_set1_ps(black_box(0.999_999));
        let b = _mm512_set1_ps(black_box(0.000_001));
        let s = starts();
        let mut acc = [_mm512_setzero_ps(); 16];
        for (x, &v) in acc.iter_mut().zip(&s) {
            *x = _mm512_set1_ps(v);
        }
        for _ in 0..iters {
            chains!(_mm512_fmadd_ps, acc, a, b);
        }
        let mut total = _mm512_setzero_ps();
        for x in acc {
            total = _mm512_add_ps(total, x);
        }
        f64::from(_mm512_reduce_add_ps(total))
    }

    /// 16 chains of 512-bit f64 FMAs.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn avx512_f64(iters: u64) -> f64 {
        let a = _mm512_set1_pd(black_box(0.999_999));
        let b = _mm512_set1_pd(black_box(0.000_001));
        let s = starts();
        let mut acc = [_mm512_setzero_pd(); 16];
        for (x, &v) in acc.iter_mut().zip(&s) {
            *x = _mm512_set1_pd(f64::from(v));
        }
        for _ in 0..iters {
            chains!(_mm512_fmadd_pd, acc, a, b);
        }
        let mut total = _mm512_setzero_pd();
        for x in acc {
            total = _mm512_add_pd(total, x);
        }
        _mm512_reduce_add_pd(total)
    }

    /// 12 chains of 256-bit f32 FMAs.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn avx2_f32(iters: u64) -> f64 {
        let a = _mm256_set1_ps(black_box(0.999_999));
        let b = _mm256_set1_ps(black_box(0.000_001));
        let s = starts();
        let mut acc = [_mm256_setzero_ps(); 12];
        for (x, &v) in acc.iter_mut().zip(&s) {
            *x = _mm256_set1_ps(v);
        }
        for _ in 0..iters {
            chains!(_mm256_fmadd_ps, acc, a, b);
        }
        let mut total = _mm256_setzero_ps();
        for x in acc {
            total = _mm256_add_ps(total, x);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), total);
        lanes.iter().map(|&v| f64::from(v)).sum()
    }

    /// 12 chains of 256-bit f64 FMAs.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn avx2_f64(iters: u64) -> f64 {
        let a = _mm256_set1_pd(black_box(0.999_999));
        let b = _mm256_set1_pd(black_box(0.000_001));
        let s = starts();
        let mut acc = [_mm256_setzero_pd(); 12];
        for (x, &v) in acc.iter_mut().zip(&s) {
            *x = _mm256_set1_pd(f64::from(v));
        }
        for _ in 0..iters {
            chains!(_mm256_fmadd_pd, acc, a, b);
        }
        let mut total = _mm256_setzero_pd();
        for x in acc {
            total = _mm256_add_pd(total, x);
        }
        let mut lanes = [0f64; 4];
        _mm256_storeu_pd(lanes.as_mut_ptr(), total);
        lanes.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_runs_and_stays_finite() {
        let isa = FmaIsa::detect();
        for f64_lanes in [false, true] {
            let v = isa.run(1000, f64_lanes);
            assert!(v.is_finite());
            if isa != FmaIsa::None {
                assert!(v > 0.0 && isa.flops_per_iter(f64_lanes) > 0.0);
            }
        }
    }
}
