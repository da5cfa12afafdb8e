//! The SIMD level of the machine, detected at run time (never from `target-cpu`).

/// The widest vector instruction set the CPU backend's kernels may use on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    /// No SIMD kernels: the scalar path (also what `enable_simd(false)` selects).
    Scalar,
    /// x86-64 AVX2 with FMA.
    Avx2Fma,
    /// x86-64 AVX-512F.
    Avx512,
    /// AArch64 NEON.
    Neon,
}

impl SimdLevel {
    /// The level this CPU supports, detected with `is_x86_feature_detected!` / NEON on AArch64.
    pub fn detect() -> SimdLevel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return SimdLevel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
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
