//! GEMM, batched GEMM and GEMV through cuBLAS (`cublasGemmEx` and its strided-batched form).
//!
//! - f32: `CUBLAS_COMPUTE_32F`, or `CUBLAS_COMPUTE_32F_FAST_TF32` when the backend was built with
//!   `enable_tensor_cores(true)` (off by default, as in PyTorch).
//! - f16 and bf16: 16-bit A, B and C with f32 accumulation and f32 alpha/beta.
//! - f64: `CUBLAS_COMPUTE_64F`.
//!
//! GEMV is the 1-row GEMM `yᵀ = xᵀ · op(A)ᵀ`: x becomes a 1×k matrix whose leading dimension is `incx`
//! and y a 1×n matrix with leading dimension `incy`, so strided vectors need no copy and every dtype
//! takes the same path. cuBLAS takes 32-bit sizes, leading dimensions and batch counts: larger ones
//! are `FeatureUnavailable` (never wrapped), batch strides past `i64` `SizeOverflow`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublas::result as blas;
use cudarc::cublas::sys;
use cudarc::driver::CudaStream;

use super::launch::{check_aligned, to_i32};
use super::{loader, Gpu};
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::{BatchedGemmDesc, GemmDesc, GemvDesc, Transpose};
use crate::device::BackendType;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// cuBLAS handles, one per stream the backend has used, each bound to its stream. A handle per stream
/// (rather than one handle re-bound per call) keeps cuBLAS's workspace private to one stream, so GEMMs
/// on two streams never share scratch memory (PyTorch keeps one workspace per handle and stream too).
pub(crate) struct Blas {
    /// Handle by `CUstream` address.
    handles: Mutex<HashMap<usize, sys::cublasHandle_t>>,
    tensor_cores: bool,
}

// SAFETY: handles are only used under the mutex, and cuBLAS handles may move between threads.
unsafe impl Send for Blas {}
// SAFETY: as above.
unsafe impl Sync for Blas {}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas")
            .field("tensor_cores", &self.tensor_cores)
            .finish()
    }
}

impl Blas {
    /// cuBLAS with a first handle bound to `stream` (so a missing or broken cuBLAS shows at init).
    /// The caller has bound the stream's context.
    pub(crate) fn new(stream: &CudaStream, tensor_cores: bool) -> Result<Blas> {
        let blas = Blas {
            handles: Mutex::new(HashMap::new()),
            tensor_cores,
        };
        drop(blas.handle_for(stream)?);
        Ok(blas)
    }

    /// The handle bound to `stream`, created on first use, with the handle table locked.
    fn handle_for(&self, stream: &CudaStream) -> Result<HandleGuard<'_>> {
        let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        let key = stream.cu_stream() as usize;
        if let Entry::Vacant(slot) = handles.entry(key) {
            let handle = loader::guarded("loading cuBLAS", blas::create_handle)
                .map_err(|reason| BackendError::Unavailable {
                    backend: BackendType::Cuda,
                    reason,
                })?
                .map_err(|e| blas_error("cublasCreate", e))?;
            // SAFETY: a fresh handle and a live stream of the current context.
            if let Err(e) =
                unsafe { blas::set_stream(handle, stream.cu_stream() as sys::cudaStream_t) }
            {
                // SAFETY: the handle was never used.
                let _ = unsafe { blas::destroy_handle(handle) };
                return Err(blas_error("cublasSetStream", e));
            }
            slot.insert(handle);
        }
        Ok(HandleGuard { handles, key })
    }
}

/// A locked handle table and the key of the handle in use.
struct HandleGuard<'a> {
    handles: std::sync::MutexGuard<'a, HashMap<usize, sys::cublasHandle_t>>,
    key: usize,
}

impl HandleGuard<'_> {
    /// The handle.
    fn get(&self) -> sys::cublasHandle_t {
        self.handles[&self.key]
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let handles = self.handles.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, handle) in handles.drain() {
            // SAFETY: the handle is not used after this.
            let _ = unsafe { blas::destroy_handle(handle) };
        }
    }
}

fn blas_error(what: &str, e: blas::CublasError) -> BackendError {
    if e.0 == sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED {
        return BackendError::OutOfMemory {
            requested: 0,
            available: 0,
        };
    }
    BackendError::Driver {
        backend: BackendType::Cuda,
        code: e.0 as i64,
        message: format!("{what}: {:?}", e.0),
    }
}

/// alpha and beta in the compute type's precision, as cuBLAS reads them through `*const c_void`.
enum Scalars {
    F32([f32; 2]),
    F64([f64; 2]),
}

impl Scalars {
    fn ptrs(&self) -> (*const c_void, *const c_void) {
        match self {
            Scalars::F32(s) => (&s[0] as *const f32 as _, &s[1] as *const f32 as _),
            Scalars::F64(s) => (&s[0] as *const f64 as _, &s[1] as *const f64 as _),
        }
    }
}

/// Data type, compute type and scalars for `dtype`.
fn types(
    blas: &Blas,
    dtype: DType,
    alpha: f64,
    beta: f64,
) -> Result<(sys::cudaDataType, sys::cublasComputeType_t, Scalars)> {
    use sys::cublasComputeType_t::*;
    use sys::cudaDataType::*;
    let f32s = Scalars::F32([alpha as f32, beta as f32]);
    Ok(match dtype {
        DType::F32 if blas.tensor_cores => (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, f32s),
        DType::F32 => (CUDA_R_32F, CUBLAS_COMPUTE_32F, f32s),
        DType::F16 => (CUDA_R_16F, CUBLAS_COMPUTE_32F, f32s),
        DType::BF16 => (CUDA_R_16BF, CUBLAS_COMPUTE_32F, f32s),
        DType::F64 => (CUDA_R_64F, CUBLAS_COMPUTE_64F, Scalars::F64([alpha, beta])),
        other => {
            return Err(BackendError::Unsupported {
                op: "gemm",
                backend: BackendType::Cuda,
                dtype: other,
            })
        }
    })
}

fn op(t: Transpose) -> sys::cublasOperation_t {
    match t {
        Transpose::No => sys::cublasOperation_t::CUBLAS_OP_N,
        Transpose::Yes => sys::cublasOperation_t::CUBLAS_OP_T,
    }
}

fn flip(t: Transpose) -> Transpose {
    match t {
        Transpose::No => Transpose::Yes,
        Transpose::Yes => Transpose::No,
    }
}

/// The handle bound to this thread's current stream, locked.
fn lock(gpu: &Gpu) -> Result<HandleGuard<'_>> {
    gpu.blas.handle_for(gpu.stream())
}

/// `C = alpha·op(A)·op(B) + beta·C`, column-major; regions already checked.
pub(crate) fn gemm(gpu: &Gpu, d: &GemmDesc) -> Result<()> {
    if d.m == 0 || d.n == 0 {
        return Ok(());
    }
    let name = "gemm";
    check_aligned(name, d.dtype, &[d.a, d.b, d.c])?;
    let (dt, compute, scalars) = types(&gpu.blas, d.dtype, d.alpha, d.beta)?;
    let (alpha, beta) = scalars.ptrs();
    let handle = lock(gpu)?;
    // SAFETY: every region was checked against live allocations by the caller; sizes fit cuBLAS's
    // 32-bit parameters (checked here); scalars outlive the call (host pointer mode is synchronous
    // in reading them).
    unsafe {
        blas::gemm_ex(
            handle.get(),
            op(d.trans_a),
            op(d.trans_b),
            to_i32(name, d.m)?,
            to_i32(name, d.n)?,
            to_i32(name, d.k)?,
            alpha,
            d.a.0 as *const c_void,
            dt,
            to_i32(name, d.lda)?,
            d.b.0 as *const c_void,
            dt,
            to_i32(name, d.ldb)?,
            beta,
            d.c.0 as *mut c_void,
            dt,
            to_i32(name, d.ldc)?,
            compute,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| blas_error("cublasGemmEx", e))
}

/// `batch_count` GEMMs at fixed element strides, one cuBLAS call.
pub(crate) fn batched_gemm(gpu: &Gpu, d: &BatchedGemmDesc) -> Result<()> {
    let g = &d.gemm;
    if g.m == 0 || g.n == 0 || d.batch_count == 0 {
        return Ok(());
    }
    let name = "batched_gemm";
    check_aligned(name, g.dtype, &[g.a, g.b, g.c])?;
    let (dt, compute, scalars) = types(&gpu.blas, g.dtype, g.alpha, g.beta)?;
    let (alpha, beta) = scalars.ptrs();
    let stride = |s: usize| {
        i64::try_from(s).map_err(|_| BackendError::overflow(name, "batch stride exceeds i64"))
    };
    // With k = 0, A and B are never read.
    let (stride_a, stride_b) = if g.k == 0 {
        (0, 0)
    } else {
        (stride(d.stride_a)?, stride(d.stride_b)?)
    };
    let handle = lock(gpu)?;
    // SAFETY: as in `gemm`; the descriptor's regions cover every batch.
    unsafe {
        blas::gemm_strided_batched_ex(
            handle.get(),
            op(g.trans_a),
            op(g.trans_b),
            to_i32(name, g.m)?,
            to_i32(name, g.n)?,
            to_i32(name, g.k)?,
            alpha,
            g.a.0 as *const c_void,
            dt,
            to_i32(name, g.lda)?,
            stride_a,
            g.b.0 as *const c_void,
            dt,
            to_i32(name, g.ldb)?,
            stride_b,
            beta,
            g.c.0 as *mut c_void,
            dt,
            to_i32(name, g.ldc)?,
            stride(d.stride_c)?,
            to_i32(name, d.batch_count)?,
            compute,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| blas_error("cublasGemmStridedBatchedEx", e))
}

/// `y = alpha·op(A)·x + beta·y` as the GEMM `yᵀ (1×len y) = xᵀ (1×len x) · op(A)ᵀ`.
pub(crate) fn gemv(gpu: &Gpu, d: &GemvDesc) -> Result<()> {
    let (y_len, x_len) = match d.trans {
        Transpose::No => (d.m, d.n),
        Transpose::Yes => (d.n, d.m),
    };
    gemm(
        gpu,
        &GemmDesc {
            dtype: d.dtype,
            trans_a: Transpose::No,
            // op(A)ᵀ: B' is A itself with the transpose flag flipped.
            trans_b: flip(d.trans),
            m: 1,
            n: y_len,
            k: x_len,
            alpha: d.alpha,
            a: d.x,
            lda: d.incx,
            b: d.a,
            ldb: d.lda,
            beta: d.beta,
            c: d.y,
            ldc: d.incy,
        },
    )
}

impl OpImpl<GemmDesc> for CudaBackend {
    fn op(&self, desc: &GemmDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("gemm", desc.dtype)?;
        self.run(acc, |gpu| gemm(gpu, desc))
    }
}

impl OpImpl<BatchedGemmDesc> for CudaBackend {
    fn op(&self, desc: &BatchedGemmDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("batched_gemm", desc.gemm.dtype)?;
        self.run(acc, |gpu| batched_gemm(gpu, desc))
    }
}

impl OpImpl<GemvDesc> for CudaBackend {
    fn op(&self, desc: &GemvDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("gemv", desc.dtype)?;
        self.run(acc, |gpu| gemv(gpu, desc))
    }
}
