//! What every kernel launch needs: the dtype suffix of entry-point names, strided operands passed by
//! value, and grid sizes for grid-stride loops.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use crate::compute::DevicePtr;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::Layout;

/// Highest rank a strided operand may have (`TORSH_MAX_RANK` in `common.cuh`).
pub(crate) const MAX_RANK: usize = 8;

/// Threads per block for the 1-D elementwise kernels.
pub(crate) const BLOCK: u32 = 256;

/// Largest `gridDim.x` (2^31 − 1; `gridDim.y` and `gridDim.z` stop at 65 535).
pub(crate) const MAX_GRID_X: usize = i32::MAX as usize;

/// The suffix of a kernel's entry point for `dtype` (`unary_f32`, `cast_f16_i32`, ...).
pub(crate) fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 => "u8",
    }
}

/// A strided view as the kernels receive it (`struct Strided` in `common.cuh`, same layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct StridedArg {
    shape: [i64; MAX_RANK],
    strides: [i64; MAX_RANK],
    offset: i64,
    rank: i32,
    pad: i32,
}

// SAFETY: a plain `repr(C)` struct of integers with the same layout as the kernels' `Strided`.
unsafe impl DeviceRepr for StridedArg {}

impl StridedArg {
    /// The kernel-side form of `layout`. `FeatureUnavailable` ([`beyond_reach`]) above rank 8; dims
    /// of size 1 are dropped first, so only the rank that matters counts.
    pub(crate) fn new(op: &'static str, layout: &Layout) -> Result<StridedArg> {
        let dims: Vec<(usize, usize)> = layout
            .shape()
            .iter()
            .zip(layout.strides())
            .filter(|(&d, _)| d != 1)
            .map(|(&d, &s)| (d, s))
            .collect();
        if dims.len() > MAX_RANK {
            return Err(beyond_reach(
                op,
                format!(
                    "the CUDA kernels take views of at most {MAX_RANK} non-unit dims; this one has {} (make it contiguous first)",
                    dims.len()
                ),
            ));
        }
        let mut arg = StridedArg {
            shape: [1; MAX_RANK],
            strides: [0; MAX_RANK],
            offset: to_i64(op, layout.offset())?,
            rank: dims.len() as i32,
            pad: 0,
        };
        for (i, (d, s)) in dims.into_iter().enumerate() {
            arg.shape[i] = to_i64(op, d)?;
            arg.strides[i] = to_i64(op, s)?;
        }
        Ok(arg)
    }
}

/// `InvalidArgument` unless every pointer is a multiple of `dtype`'s size (a misaligned access would
/// be a device fault that ends the context).
pub(crate) fn check_aligned(op: &'static str, dtype: DType, ptrs: &[DevicePtr]) -> Result<()> {
    let size = dtype.size_in_bytes() as u64;
    match ptrs.iter().find(|p| p.0 % size != 0) {
        Some(p) => Err(BackendError::invalid(
            op,
            format!(
                "pointer {:#x} is not aligned to the {size}-byte elements of {dtype}; the CUDA kernels need aligned operands",
                p.0
            ),
        )),
        None => Ok(()),
    }
}

/// `x` as a kernel's 64-bit count; `SizeOverflow` past `i64::MAX`.
pub(crate) fn to_i64(op: &'static str, x: usize) -> Result<i64> {
    i64::try_from(x).map_err(|_| BackendError::overflow(op, format!("{x} exceeds i64")))
}

/// `x` as a 32-bit parameter of a kernel or of cuBLAS; `FeatureUnavailable` ([`beyond_reach`]) past
/// `i32::MAX`, never a wrapped value.
pub(crate) fn to_i32(op: &'static str, x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| {
        beyond_reach(
            op,
            format!("{x} exceeds the 32-bit limit of this CUDA kernel or cuBLAS call"),
        )
    })
}

/// The error of an op whose operands are past what this backend's kernels or cuBLAS can take (a size
/// past a 32-bit parameter, a view of more than [`MAX_RANK`] dims): `FeatureUnavailable`, since the op
/// is valid and runs on other backends; the host answers it before anything is launched.
pub(crate) fn beyond_reach(op: &'static str, why: impl std::fmt::Display) -> BackendError {
    BackendError::FeatureUnavailable {
        feature: "ops beyond the CUDA kernels' reach",
        reason: format!("{op}: {why}"),
    }
}

/// A 1-D launch of `BLOCK`-thread blocks for a grid-stride loop over `n` items: enough blocks to fill
/// the device (`sm_count × 32` at most, and never past [`MAX_GRID_X`]), at least one.
pub(crate) fn grid_for(n: usize, sm_count: i32) -> LaunchConfig {
    let wanted = n.div_ceil(BLOCK as usize).max(1);
    let cap = (sm_count.max(1) as usize) * 32;
    LaunchConfig {
        grid_dim: (wanted.min(cap).min(MAX_GRID_X) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_arg_matches_the_kernel_struct_layout() {
        assert_eq!(std::mem::size_of::<StridedArg>(), 8 * MAX_RANK * 2 + 16);
        let l = Layout::contiguous(&[2, 1, 3]).transpose(0, 2).unwrap();
        let a = StridedArg::new("t", &l).unwrap();
        assert_eq!(a.rank, 2);
        assert_eq!(&a.shape[..2], &[3, 2]);
        assert_eq!(&a.strides[..2], &[1, 3]);
        let deep = Layout::contiguous(&[2; 9]);
        assert!(matches!(
            StridedArg::new("t", &deep),
            Err(BackendError::FeatureUnavailable { .. })
        ));
        // Unit dims do not count towards the rank.
        let padded = Layout::contiguous(&[2, 1, 2, 1, 2, 1, 2, 1, 2, 2, 2, 2]);
        assert_eq!(StridedArg::new("t", &padded).unwrap().rank, 8);
    }

    #[test]
    fn sizes_past_32_bits_are_unavailable_not_wrapped() {
        assert_eq!(to_i32("t", i32::MAX as usize).unwrap(), i32::MAX);
        for x in [1usize << 31, u32::MAX as usize, (1 << 32) + 5, usize::MAX] {
            match to_i32("t", x) {
                Err(BackendError::FeatureUnavailable { reason, .. }) => {
                    assert!(reason.contains(&x.to_string()), "{reason}")
                }
                other => panic!("{x}: {other:?}"),
            }
        }
        assert!(matches!(
            to_i64("t", usize::MAX),
            Err(BackendError::SizeOverflow { .. })
        ));
    }

    #[test]
    fn grids_cover_small_and_large_counts() {
        assert_eq!(grid_for(0, 132).grid_dim.0, 1);
        assert_eq!(grid_for(257, 132).grid_dim.0, 2);
        assert_eq!(grid_for(1 << 30, 132).grid_dim.0, 132 * 32);
    }

    /// The grid-stride loops of every kernel index in 64 bits: each `blockIdx` or `gridDim` term is
    /// either cast to `i64` before any arithmetic (`(i64)blockIdx.x * blockDim.x`) or is the whole
    /// initialiser or step of an `i64` loop variable (`for (i64 t = blockIdx.y; ...; t += gridDim.y)`),
    /// so no product of grid indices is taken in 32 bits, whatever the grid.
    #[test]
    fn kernel_grid_indices_are_widened_before_any_arithmetic() {
        use super::super::kernels::{COMMON, SOURCES};
        let sources = std::iter::once(("common.cuh", COMMON)).chain(SOURCES.iter().copied());
        let mut seen = 0;
        for (name, src) in sources {
            for (n, line) in src.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for token in ["blockIdx.", "gridDim."] {
                    for (at, _) in code.match_indices(token) {
                        seen += 1;
                        let before = &code[..at];
                        let after = &code[at + token.len() + 1..];
                        let widened = before.ends_with("(i64)");
                        let whole_term = code.trim_start().starts_with("for (i64 ")
                            && (before.ends_with(" = ") || before.ends_with(" += "))
                            && (after.starts_with(';') || after.starts_with(')'));
                        assert!(
                            widened || whole_term,
                            "{name}:{}: `{}` is used in 32-bit arithmetic",
                            n + 1,
                            line.trim()
                        );
                    }
                }
            }
        }
        assert!(seen >= 20, "only {seen} grid terms found");
    }

    #[test]
    fn one_dimensional_grids_stay_inside_the_hardware_limits() {
        // The kernels loop grid-stride, so any grid is correct; it must only be a legal launch:
        // 1 ≤ gridDim.x ≤ 2^31 − 1, gridDim.y = gridDim.z = 1, whatever the count and SM count.
        for sms in [i32::MIN, -1, 0, 1, 132, i32::MAX] {
            for n in [0, 1, 255, 256, 257, 1 << 31, (1 << 40) + 3, usize::MAX] {
                let g = grid_for(n, sms);
                assert!(
                    (1..=i32::MAX as u32).contains(&g.grid_dim.0),
                    "{n} {sms} {g:?}"
                );
                assert_eq!((g.grid_dim.1, g.grid_dim.2), (1, 1));
                assert_eq!(g.block_dim, (BLOCK, 1, 1));
            }
        }
    }
}
