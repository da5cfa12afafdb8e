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

/// The power of two at or above `n` (0 stays 0): the shape bucket a tuned choice covers.
fn bucket(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        n.checked_next_power_of_two().unwrap_or(usize::MAX)
    }
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

    /// The key a tuned choice is stored under: op, dtype, shape bucket (each dim rounded up to a
    /// power of two) and layout (transposes, and whether the output is read).
    pub fn key(&self) -> String {
        match self {
            TunableOp::Gemm(d) => {
                let t = |t: Transpose| if t == Transpose::Yes { 'T' } else { 'N' };
                format!(
                    "gemm/{}/m{}n{}k{}/{}{}{}",
                    d.dtype.name(),
                    bucket(d.m),
                    bucket(d.n),
                    bucket(d.k),
                    t(d.trans_a),
                    t(d.trans_b),
                    if d.beta == 0.0 { "" } else { "+C" }
                )
            }
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
