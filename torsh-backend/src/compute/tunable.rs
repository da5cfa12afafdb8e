//! Ops whose kernel or launch configuration a backend may choose among, for the autotuner
//! (`runtime/autotune.rs`): [`TunableOp`] and the key its choice is stored under.

use super::{Accesses, ComputeBackend, DevicePtr, GemmDesc, Transpose};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// An op a backend may run with one of several named variants ([`ComputeBackend::variants`]). More
/// ops will join (conv2d algorithms next), so matches need a wildcard arm.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TunableOp {
    /// A GEMM; see [`GemmDesc`].
    Gemm(GemmDesc),
}

/// Which tuned choice serves an op: see [`TunableOp::key`]. Its text form (`Display`), such as
/// `gemm/f32/m64n64k64/NT+C`, names it in the cache file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TuneKey {
    /// The op's name.
    pub op: &'static str,
    /// The element type.
    pub dtype: DType,
    /// The dims' buckets (GEMM: m, n, k).
    pub dims: [usize; 3],
    /// Whether each input is transposed.
    pub transposed: [bool; 2],
    /// Whether the op reads its output (GEMM with beta ≠ 0).
    pub reads_output: bool,
}

impl std::fmt::Display for TuneKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = |yes: bool| if yes { 'T' } else { 'N' };
        write!(
            f,
            "{}/{}/m{}n{}k{}/{}{}{}",
            self.op,
            self.dtype.name(),
            self.dims[0],
            self.dims[1],
            self.dims[2],
            t(self.transposed[0]),
            t(self.transposed[1]),
            if self.reads_output { "+C" } else { "" }
        )
    }
}

/// The shape bucket a tuned choice covers: the smallest value at or above `n` of the form
/// `q·2^e` with `q` in 4..=7 (four buckets per octave; values below 8 are their own), so sizes within
/// about 25 % of each other share a choice.
fn bucket(n: usize) -> usize {
    if n < 8 {
        return n;
    }
    let e = usize::BITS - 1 - n.leading_zeros() - 2; // n = q·2^e with q in 4..8, rounded down
    let step = 1usize << e;
    n.div_ceil(step).saturating_mul(step)
}

impl TunableOp {
    /// The op's name ("gemm").
    pub fn name(&self) -> &'static str {
        match self {
            TunableOp::Gemm(_) => "gemm",
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            TunableOp::Gemm(d) => d.dtype,
        }
    }

    /// The memory the op touches (the descriptor's shape checks run here).
    pub fn accesses(&self) -> Result<Accesses> {
        match self {
            TunableOp::Gemm(d) => d.accesses(),
        }
    }

    /// Runs the op the backend's plain way.
    pub fn run_default(&self, device: &dyn ComputeBackend) -> Result<()> {
        match self {
            TunableOp::Gemm(d) => device.gemm(d),
        }
    }

    /// The key a tuned choice is stored under: op, dtype, shape bucket (each dim rounded up to the
    /// next of four steps per power of two) and layout (transposes, and whether the output is
    /// read).
    pub fn key(&self) -> TuneKey {
        match self {
            TunableOp::Gemm(d) => TuneKey {
                op: "gemm",
                dtype: d.dtype,
                dims: [bucket(d.m), bucket(d.n), bucket(d.k)],
                transposed: [d.trans_a == Transpose::Yes, d.trans_b == Transpose::Yes],
                reads_output: d.beta != 0.0,
            },
        }
    }

    /// The region the op writes: the base pointer and bytes of its output.
    pub(crate) fn output(&self) -> Result<(DevicePtr, usize)> {
        let acc = self.accesses()?;
        acc.regions
            .iter()
            .find(|r| r.access.writes())
            .map(|r| (r.ptr, r.bytes))
            .ok_or_else(|| BackendError::invalid(self.name(), "internal: the op writes nothing"))
    }

    /// The same op writing to `ptr` instead (with the output's layout).
    pub(crate) fn with_output(&self, ptr: DevicePtr) -> TunableOp {
        match self {
            TunableOp::Gemm(d) => TunableOp::Gemm(GemmDesc {
                c: ptr,
                ..d.clone()
            }),
        }
    }

    /// Every device pointer the op holds (for graph relocation).
    pub(crate) fn pointers_mut(&mut self) -> Vec<&mut DevicePtr> {
        match self {
            TunableOp::Gemm(d) => vec![&mut d.a, &mut d.b, &mut d.c],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_have_four_steps_per_octave() {
        let cases = [
            (0, 0),
            (1, 1),
            (7, 7),
            (8, 8),
            (9, 10),
            (11, 12),
            (29, 32),
            (37, 40),
            (96, 96),
            (100, 112),
            (128, 128),
            (129, 160),
            (1000, 1024),
        ];
        for (n, want) in cases {
            assert_eq!(bucket(n), want, "bucket({n})");
        }
    }
}
