//! Ops whose kernel or launch configuration a backend may choose among, for the autotuner
//! (`runtime/autotune.rs`): [`TunableOp`] and the key its choice is stored under.

use super::{Accesses, AnyOp, ComputeBackend, Conv2dDesc, DevicePtr, GemmDesc, Operand, Transpose};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// An op a backend may run with one of several named variants ([`ComputeBackend::variants`]). More
/// ops may join, so matches need a wildcard arm.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TunableOp {
    /// A GEMM; see [`GemmDesc`].
    Gemm(GemmDesc),
    /// A 2-D convolution; see [`Conv2dDesc`].
    Conv2d(Conv2dDesc),
}

/// Which tuned choice serves an op: see [`TunableOp::key`]. Its text form (`Display`), such as
/// `gemm/f32/m64n64k64/NT+C` or `conv2d/f32/m64n3136k576/-S+B`, names it in the cache file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TuneKey {
    /// The op's name.
    pub op: &'static str,
    /// The element type.
    pub dtype: DType,
    /// The dims' buckets (GEMM: m, n, k; conv2d: those of its implicit GEMM, output channels per
    /// group, output positions of the batch, and input channels per group times the window).
    pub dims: [usize; 3],
    /// GEMM: whether each input is transposed. conv2d: whether it is grouped, and whether it is
    /// strided or dilated.
    pub transposed: [bool; 2],
    /// GEMM: whether the op reads its output (beta ≠ 0). conv2d: whether it adds a bias.
    pub reads_output: bool,
}

impl std::fmt::Display for TuneKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let conv = self.op == "conv2d";
        let flag = |yes: bool, on: char, off: char| if yes { on } else { off };
        let (first, second) = if conv {
            (
                flag(self.transposed[0], 'G', '-'),
                flag(self.transposed[1], 'S', '-'),
            )
        } else {
            (
                flag(self.transposed[0], 'T', 'N'),
                flag(self.transposed[1], 'T', 'N'),
            )
        };
        let extra = match (self.reads_output, conv) {
            (false, _) => "",
            (true, false) => "+C",
            (true, true) => "+B",
        };
        write!(
            f,
            "{}/{}/m{}n{}k{}/{first}{second}{extra}",
            self.op,
            self.dtype.name(),
            self.dims[0],
            self.dims[1],
            self.dims[2],
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
    /// The op's name ("gemm", "conv2d").
    pub fn name(&self) -> &'static str {
        match self {
            TunableOp::Gemm(_) => "gemm",
            TunableOp::Conv2d(_) => "conv2d",
        }
    }

    /// The op's descriptor.
    pub fn desc(&self) -> &dyn AnyOp {
        match self {
            TunableOp::Gemm(d) => d,
            TunableOp::Conv2d(d) => d,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.desc().dtype()
    }

    /// The memory the op touches (the descriptor's shape checks run here).
    pub fn accesses(&self) -> Result<Accesses> {
        self.desc().accesses()
    }

    /// Runs the op the backend's plain way.
    pub fn run_default(&self, device: &dyn ComputeBackend) -> Result<()> {
        self.desc().run(device)
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
            TunableOp::Conv2d(d) => {
                let [n, _, _, _] = d.input_shape;
                let [k, cg, r, s] = d.weight_shape;
                let [_, _, oh, ow] = d.output_shape;
                let positions = n.saturating_mul(oh).saturating_mul(ow);
                let depth = cg.saturating_mul(r).saturating_mul(s);
                TuneKey {
                    op: "conv2d",
                    dtype: d.dtype,
                    dims: [
                        bucket(k / d.groups.max(1)),
                        bucket(positions),
                        bucket(depth),
                    ],
                    transposed: [d.groups > 1, d.stride != [1, 1] || d.dilation != [1, 1]],
                    reads_output: d.bias.is_some(),
                }
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
            TunableOp::Conv2d(d) => TunableOp::Conv2d(Conv2dDesc {
                output: ptr,
                ..d.clone()
            }),
        }
    }

    /// Every device operand the op names (for graph relocation).
    pub(crate) fn operands(&mut self) -> Vec<Operand<'_>> {
        match self {
            TunableOp::Gemm(d) => AnyOp::operands(d),
            TunableOp::Conv2d(d) => AnyOp::operands(d),
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
