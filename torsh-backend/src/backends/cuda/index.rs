//! Host side of the gather and scatter kernels (`kernels/index.cu`), and the device error flag that
//! reports an index out of range.
//!
//! The kernels check each index on the device: a bad one is never followed (its output element is
//! left as it was) and raises the backend's flag ([`ErrorFlag`]). `synchronize` and `copy_dtoh` read
//! the flag after their wait, once any kernel that may raise it has been launched, lower it, and
//! return `IndexOutOfRange` naming the op, the first index reported and the size (a kernel still
//! running on another stream at a `copy_dtoh` is reported by the next read). The
//! error goes to whichever caller synchronizes or reads first, on any thread sharing the backend.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, PushKernelArg};

use super::launch::{check_aligned, to_i64, MAX_RANK};
use super::{driver_error, Gpu};
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::{GatherDesc, OpDesc, ScatterDesc, ScatterReduce};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::contiguous_strides;

/// The ops that raise the flag, by the code the kernels record.
pub(super) use crate::compute::FLAG_OPS;

/// The device words `[raised, op code, index, size]` of the kernels that check indices, allocated
/// zeroed on first use, and whether such a kernel has been launched (from then on every
/// synchronize and host read reads them: a kernel still running on another stream may raise the
/// flag after a read, so it is never taken as settled).
#[derive(Debug, Default)]
pub(crate) struct ErrorFlag {
    words: Mutex<Option<CudaSlice<u64>>>,
    armed: AtomicBool,
}

impl ErrorFlag {
    /// The flag's device address for a kernel about to be launched on `stream`, which the next
    /// [`ErrorFlag::take`] then reads. The driver's error when it cannot be allocated.
    pub(crate) fn arm(&self, stream: &Arc<CudaStream>) -> Result<u64> {
        let mut words = self.words.lock().unwrap_or_else(|e| e.into_inner());
        if words.is_none() {
            let fresh = stream
                .alloc_zeros::<u64>(4)
                .map_err(|e| driver_error("allocating the error flag", e))?;
            *words = Some(fresh);
        }
        let Some(slice) = words.as_ref() else {
            return Err(BackendError::invalid("gather", "the error flag is missing"));
        };
        let (ptr, _recorded) = slice.device_ptr(stream);
        self.armed.store(true, Ordering::Release);
        Ok(ptr)
    }

    /// Reads and lowers the flag once a kernel that may raise it has been launched (a 32-byte copy
    /// on `stream`); `IndexOutOfRange` when it was raised. The caller has synchronized `stream`; a
    /// kernel on another stream that has not finished is reported by a later read.
    pub(crate) fn take(&self, stream: &Arc<CudaStream>) -> Result<()> {
        if !self.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut words = self.words.lock().unwrap_or_else(|e| e.into_inner());
        let Some(slice) = words.as_mut() else {
            return Ok(());
        };
        let host = stream
            .clone_dtoh(slice)
            .map_err(|e| driver_error("reading the error flag", e))?;
        stream
            .synchronize()
            .map_err(|e| driver_error("reading the error flag", e))?;
        if host[0] == 0 {
            return Ok(());
        }
        stream
            .memset_zeros(slice)
            .map_err(|e| driver_error("lowering the error flag", e))?;
        Err(BackendError::IndexOutOfRange {
            op: FLAG_OPS
                .get(host[1] as usize)
                .copied()
                .unwrap_or("an indexing op"),
            index: host[2] as i64,
            size: host[3] as usize,
        })
    }
}

/// The launch's geometry, as the kernel receives it (`struct GatherGeometry` in `index.cu`, same
/// layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GatherGeometry {
    shape: [i64; MAX_RANK],
    in_strides: [i64; MAX_RANK],
    ix_strides: [i64; MAX_RANK],
    in_offset: i64,
    ix_offset: i64,
    n: i64,
    size: i64,
    op: i64,
    rank: i32,
    dim: i32,
}

// SAFETY: a plain `repr(C)` struct of integers with the same layout as the kernel's `GatherGeometry`.
unsafe impl DeviceRepr for GatherGeometry {}

/// The gather of `d`, whose regions the caller checked.
fn gather(gpu: &Gpu, d: &GatherDesc) -> Result<()> {
    const OP: &str = "gather";
    let shape = d.index.layout.shape();
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.input.ptr, d.output])?;
    check_aligned(OP, d.index_dtype, &[d.index.ptr])?;
    if shape.len() > MAX_RANK {
        return Err(BackendError::FeatureUnavailable {
            feature: "CUDA gather",
            reason: format!(
                "the kernel indexes at most {MAX_RANK} dims; this index has {} (reshape first)",
                shape.len()
            ),
        });
    }
    let mut g = GatherGeometry {
        shape: [1; MAX_RANK],
        in_strides: [0; MAX_RANK],
        ix_strides: [0; MAX_RANK],
        in_offset: to_i64(OP, d.input.layout.offset())?,
        ix_offset: to_i64(OP, d.index.layout.offset())?,
        n: to_i64(OP, n)?,
        size: to_i64(OP, d.input.layout.shape()[d.dim])?,
        op: 0,
        rank: shape.len() as i32,
        dim: d.dim as i32,
    };
    for (k, &extent) in shape.iter().enumerate() {
        g.shape[k] = to_i64(OP, extent)?;
        g.in_strides[k] = to_i64(OP, d.input.layout.strides()[k])?;
        g.ix_strides[k] = to_i64(OP, d.index.layout.strides()[k])?;
    }
    let name = format!("gather_{}_{}", width(d.dtype), index_suffix(d.index_dtype));
    let f = gpu.function("index", &name)?;
    let stream = gpu.stream();
    let flag = gpu.errors.arm(stream)?;
    let mut b = stream.launch_builder(&f);
    b.arg(&d.input.ptr.0)
        .arg(&d.index.ptr.0)
        .arg(&d.output.0)
        .arg(&g)
        .arg(&flag);
    // SAFETY: the regions were checked against live allocations and do not overlap; the kernel reads
    // the input only at indices it checked against the input's length along `dim`; the arguments
    // match `gather_<width>_<index>(const W*, const I*, W*, GatherGeometry, u64*)`.
    unsafe { b.launch(gpu.grid(n)) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

/// A scatter's geometry, as the kernel receives it (`struct ScatterGeometry` in `index.cu`, same
/// layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ScatterGeometry {
    shape: [i64; MAX_RANK],
    src_strides: [i64; MAX_RANK],
    ix_strides: [i64; MAX_RANK],
    out_strides: [i64; MAX_RANK],
    src_offset: i64,
    ix_offset: i64,
    columns: i64,
    size: i64,
    op: i64,
    alpha: f64,
    rank: i32,
    dim: i32,
}

// SAFETY: a plain `repr(C)` struct of integers and a double with the same layout as the kernel's
// `ScatterGeometry`.
unsafe impl DeviceRepr for ScatterGeometry {}

/// The element-width suffix of `dtype`'s kernels that move bits.
fn width(dtype: DType) -> &'static str {
    match dtype.size_in_bytes() {
        1 => "u8",
        2 => "u16",
        4 => "u32",
        _ => "u64",
    }
}

/// The index-type suffix of `dtype`'s kernels.
fn index_suffix(dtype: DType) -> &'static str {
    if dtype == DType::I32 {
        "i32"
    } else {
        "i64"
    }
}

/// The scatter of `d`, whose regions the caller checked: one thread per column of the index.
fn scatter(gpu: &Gpu, d: &ScatterDesc) -> Result<()> {
    const OP: &str = "scatter";
    let shape = d.index.layout.shape();
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.src.ptr, d.output])?;
    check_aligned(OP, d.index_dtype, &[d.index.ptr])?;
    if shape.len() > MAX_RANK {
        return Err(BackendError::FeatureUnavailable {
            feature: "CUDA scatter",
            reason: format!(
                "the kernel indexes at most {MAX_RANK} dims; this index has {} (reshape first)",
                shape.len()
            ),
        });
    }
    let columns = n / shape[d.dim];
    let mut g = ScatterGeometry {
        shape: [1; MAX_RANK],
        src_strides: [0; MAX_RANK],
        ix_strides: [0; MAX_RANK],
        out_strides: [0; MAX_RANK],
        src_offset: to_i64(OP, d.src.layout.offset())?,
        ix_offset: to_i64(OP, d.index.layout.offset())?,
        columns: to_i64(OP, columns)?,
        size: to_i64(OP, d.output_shape[d.dim])?,
        op: 1,
        alpha: d.alpha,
        rank: shape.len() as i32,
        dim: d.dim as i32,
    };
    let out_strides = contiguous_strides(&d.output_shape);
    for (k, &extent) in shape.iter().enumerate() {
        g.shape[k] = to_i64(OP, extent)?;
        g.src_strides[k] = to_i64(OP, d.src.layout.strides()[k])?;
        g.ix_strides[k] = to_i64(OP, d.index.layout.strides()[k])?;
        g.out_strides[k] = to_i64(OP, out_strides[k])?;
    }
    let name = match d.reduce {
        ScatterReduce::Assign => {
            format!("scatter_{}_{}", width(d.dtype), index_suffix(d.index_dtype))
        }
        ScatterReduce::Add => format!(
            "scatter_add_{}_{}",
            super::launch::suffix(d.dtype),
            index_suffix(d.index_dtype)
        ),
    };
    let f = gpu.function("index", &name)?;
    let stream = gpu.stream();
    let flag = gpu.errors.arm(stream)?;
    let mut b = stream.launch_builder(&f);
    b.arg(&d.src.ptr.0)
        .arg(&d.index.ptr.0)
        .arg(&d.output.0)
        .arg(&g)
        .arg(&flag);
    // SAFETY: the regions were checked against live allocations and do not overlap; the kernel
    // writes the output only at indices it checked against its length along `dim`, one thread per
    // column, columns touching disjoint elements; the arguments match
    // `scatter[_add]_<type>_<index>(const T*, const I*, T*, ScatterGeometry, u64*)`.
    unsafe { b.launch(gpu.grid(columns)) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

impl OpImpl<ScatterDesc> for CudaBackend {
    fn op(&self, desc: &ScatterDesc) -> Result<()> {
        let acc = desc.accesses()?;
        if desc.reduce == ScatterReduce::Add && !desc.dtype.is_float() {
            return Err(desc.unsupported(self));
        }
        self.run(acc, |gpu| scatter(gpu, desc))
    }
}

impl OpImpl<GatherDesc> for CudaBackend {
    fn op(&self, desc: &GatherDesc) -> Result<()> {
        self.run(desc.accesses()?, |gpu| gather(gpu, desc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_geometry_matches_the_kernel_struct_layout() {
        // Three arrays of MAX_RANK i64, five i64, two i32 (`GatherGeometry` in index.cu).
        assert_eq!(
            std::mem::size_of::<GatherGeometry>(),
            3 * 8 * MAX_RANK + 5 * 8 + 8
        );
        assert_eq!(std::mem::align_of::<GatherGeometry>(), 8);
        // Four arrays, five i64, a double, two i32 (`ScatterGeometry`).
        assert_eq!(
            std::mem::size_of::<ScatterGeometry>(),
            4 * 8 * MAX_RANK + 6 * 8 + 8
        );
    }
}
