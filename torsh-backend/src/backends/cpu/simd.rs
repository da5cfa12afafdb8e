//! The SIMD level of the machine, detected at run time (never from `target-cpu`).

/// The widest vector instruction set the CPU backend's kernels may use on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    /// No SIMD kernels: the scalar path (also what `enable_simd(false)` selects).
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2Fma,
    /// x86-64 AVX-512 (F, BW, DQ, VL) with AVX2, FMA and F16C.
    Avx512,
    /// AArch64 NEON.
    Neon,
}

impl SimdLevel {
    /// The level this CPU supports, detected with `is_x86_feature_detected!` / NEON on AArch64.
    pub fn detect() -> SimdLevel {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            if avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
                return SimdLevel::Avx512;
            }
            if avx2 {
                return SimdLevel::Avx2Fma;
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            return SimdLevel::Neon;
        }
        #[allow(unreachable_code)]
        SimdLevel::Scalar
    }

    /// Every level this CPU runs, widest first: the detected one and those it includes (AVX-512
    /// runs AVX2's code too), down to `Scalar`. Kernels' tests run each.
    #[cfg(test)]
    pub(crate) fn runnable() -> Vec<SimdLevel> {
        match SimdLevel::detect() {
            SimdLevel::Avx512 => vec![SimdLevel::Avx512, SimdLevel::Avx2Fma, SimdLevel::Scalar],
            SimdLevel::Scalar => vec![SimdLevel::Scalar],
            level => vec![level, SimdLevel::Scalar],
        }
    }

    /// A name for listings.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "none (scalar)",
            SimdLevel::Avx2Fma => "AVX2+FMA",
            SimdLevel::Avx512 => "AVX-512F",
            SimdLevel::Neon => "NEON",
        }
    }
}
