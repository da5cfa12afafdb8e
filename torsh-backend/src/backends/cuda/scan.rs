//! Host side of the scan kernels (`kernels/scan.cu`): a thread per line along the scanned dim.

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::launch::{check_aligned, suffix, to_i64, MAX_RANK};
use super::{driver_error, Gpu};
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::ScanDesc;
use crate::error::{BackendError, Result};

/// The launch's geometry, as the kernel receives it (`struct ScanGeometry` in `scan.cu`, same
/// layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ScanGeometry {
    shape: [i64; MAX_RANK],
    x_strides: [i64; MAX_RANK],
    x_offset: i64,
    lines: i64,
    rank: i32,
    dim: i32,
}

// SAFETY: a plain `repr(C)` struct of integers with the same layout as the kernel's `ScanGeometry`.
unsafe impl DeviceRepr for ScanGeometry {}

/// The scan of `d`, whose regions the caller checked.
fn scan(gpu: &Gpu, d: &ScanDesc) -> Result<()> {
    const OP: &str = "scan";
    let shape = d.input.layout.shape();
    if d.input.layout.numel() == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.input.ptr, d.output])?;
    if shape.len() > MAX_RANK {
        return Err(BackendError::FeatureUnavailable {
            feature: "CUDA scan",
            reason: format!(
                "the kernel indexes at most {MAX_RANK} dims; this input has {} (reshape first)",
                shape.len()
            ),
        });
    }
    let (outer, _, inner) = d.geometry();
    let lines = outer * inner;
    let mut g = ScanGeometry {
        shape: [1; MAX_RANK],
        x_strides: [0; MAX_RANK],
        x_offset: to_i64(OP, d.input.layout.offset())?,
        lines: to_i64(OP, lines)?,
        rank: shape.len() as i32,
        dim: d.dim as i32,
    };
    for (k, &extent) in shape.iter().enumerate() {
        g.shape[k] = to_i64(OP, extent)?;
        g.x_strides[k] = to_i64(OP, d.input.layout.strides()[k])?;
    }
    let f = gpu.function_for("scan", d.dtype, &format!("scan_{}", suffix(d.dtype)))?;
    let code = d.op.code() as i32;
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&d.input.ptr.0).arg(&d.output.0).arg(&g).arg(&code);
    // SAFETY: the regions were checked against live allocations and do not overlap; every thread
    // reads its line of the input view and writes its line of the dense output; the arguments
    // match `scan_<dtype>(const T*, T*, ScanGeometry, int)`.
    unsafe { b.launch(gpu.grid(lines)) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

impl OpImpl<ScanDesc> for CudaBackend {
    fn op(&self, desc: &ScanDesc) -> Result<()> {
        self.run(desc.accesses()?, |gpu| scan(gpu, desc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::ScanOp;

    #[test]
    fn geometry_matches_the_kernel_struct_and_codes() {
        // Two arrays of MAX_RANK i64, two i64, two i32 (`ScanGeometry` in scan.cu).
        assert_eq!(
            std::mem::size_of::<ScanGeometry>(),
            2 * 8 * MAX_RANK + 2 * 8 + 8
        );
        let src = include_str!("kernels/scan.cu");
        for &op in ScanOp::ALL {
            let define = format!(
                "#define SCAN_{} {}\n",
                op.name()[3..].to_uppercase(),
                op.code()
            );
            assert!(src.contains(&define), "{define}");
        }
    }
}
