//! Host side of the sort kernels (`kernels/sort.cu`): a thread per element ranks it within its
//! line, O(len²) work per line.

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::launch::{check_aligned, suffix, to_i64, MAX_RANK};
use super::{driver_error, Gpu};
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::SortDesc;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::contiguous_strides;

/// The launch's geometry, as the kernel receives it (`struct SortGeometry` in `sort.cu`, same
/// layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SortGeometry {
    shape: [i64; MAX_RANK],
    x_strides: [i64; MAX_RANK],
    x_offset: i64,
    n: i64,
    inner: i64,
    k: i64,
    rank: i32,
    dim: i32,
}

// SAFETY: a plain `repr(C)` struct of integers with the same layout as the kernel's `SortGeometry`.
unsafe impl DeviceRepr for SortGeometry {}

/// The sort of `d`, whose regions the caller checked.
fn sort(gpu: &Gpu, d: &SortDesc) -> Result<()> {
    const OP: &str = "sort";
    let shape = d.input.layout.shape();
    let n = d.input.layout.numel();
    if n == 0 || d.k == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.input.ptr])?;
    if let Some(p) = d.values {
        check_aligned(OP, d.dtype, &[p])?;
    }
    if let Some(p) = d.indices {
        check_aligned(OP, DType::I64, &[p])?;
    }
    if shape.len() > MAX_RANK {
        return Err(BackendError::FeatureUnavailable {
            feature: "CUDA sort",
            reason: format!(
                "the kernel indexes at most {MAX_RANK} dims; this input has {} (reshape first)",
                shape.len()
            ),
        });
    }
    let mut g = SortGeometry {
        shape: [1; MAX_RANK],
        x_strides: [0; MAX_RANK],
        x_offset: to_i64(OP, d.input.layout.offset())?,
        n: to_i64(OP, n)?,
        inner: to_i64(OP, contiguous_strides(shape)[d.dim])?,
        k: to_i64(OP, d.k)?,
        rank: shape.len() as i32,
        dim: d.dim as i32,
    };
    for (k, &extent) in shape.iter().enumerate() {
        g.shape[k] = to_i64(OP, extent)?;
        g.x_strides[k] = to_i64(OP, d.input.layout.strides()[k])?;
    }
    let f = gpu.function_for("sort", d.dtype, &format!("sort_{}", suffix(d.dtype)))?;
    let values = d.values.map_or(0, |p| p.0);
    let indices = d.indices.map_or(0, |p| p.0);
    let descending = i32::from(d.descending);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&d.input.ptr.0)
        .arg(&values)
        .arg(&indices)
        .arg(&g)
        .arg(&descending);
    // SAFETY: the regions were checked against live allocations and do not overlap; each thread
    // reads its line of the input view and writes one element of each dense output (the ranks of a
    // line are a permutation); a null output is never written; the arguments match
    // `sort_<dtype>(const T*, T*, i64*, SortGeometry, int)`.
    unsafe { b.launch(gpu.grid(n)) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

impl OpImpl<SortDesc> for CudaBackend {
    fn op(&self, desc: &SortDesc) -> Result<()> {
        self.run(desc.accesses()?, |gpu| sort(gpu, desc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_matches_the_kernel_struct_layout() {
        // Two arrays of MAX_RANK i64, four i64, two i32 (`SortGeometry` in sort.cu).
        assert_eq!(
            std::mem::size_of::<SortGeometry>(),
            2 * 8 * MAX_RANK + 4 * 8 + 8
        );
    }
}
