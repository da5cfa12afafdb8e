//! The CUDA peer of the GEMM cases: cuBLAS called directly through cudarc, with its own context handle,
//! stream, cuBLAS handle and buffers, not through torsh-backend.
//!
//! Only reached when the chosen backend is CUDA, which means the library's probe found the driver, a
//! device, NVRTC and cuBLAS. cudarc still panics when a library or symbol is missing, so every cudarc
//! call here runs under `catch_unwind` and a panic becomes an error message.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits,
};
use torsh_backend::prelude::{bf16, f16, DType};

use super::cases::Runner;
use super::random::random_host;

/// Runs `f`, turning a panic (a library or symbol cudarc could not load) into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let detail = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("unknown failure");
        Err(format!("{what} panicked: {detail}"))
    })
}

/// A cuBLAS handle on a stream of its own.
pub struct Cublas {
    /// The device's primary context.
    ctx: Arc<CudaContext>,
    /// The handle's own stream.
    stream: Arc<CudaStream>,
    /// The cuBLAS handle, bound to `stream`.
    blas: CudaBlas,
    /// "cuBLAS 12.9.1".
    pub version: String,
}

impl Cublas {
    /// A handle on GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<Cublas, String> {
        guarded("starting cuBLAS", || {
            let ctx = CudaContext::new(ordinal).map_err(|e| format!("CudaContext::new: {e}"))?;
            // One stream only: no cross-stream events needed on each use of a buffer.
            // SAFETY: every buffer of this handle is used on its single stream only.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx
                .new_stream()
                .map_err(|e| format!("creating a stream: {e}"))?;
            let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cublasCreate: {e}"))?;
            let mut v = 0;
            // SAFETY: a live handle and an out-parameter.
            unsafe { sys::cublasGetVersion_v2(*blas.handle(), &mut v) }
                .result()
                .map_err(|e| format!("cublasGetVersion: {e}"))?;
            Ok(Cublas {
                ctx,
                stream,
                blas,
                version: format!("cuBLAS {}.{}.{}", v / 10000, (v % 10000) / 100, v % 100),
            })
        })
    }

    /// Seconds of device time for `k` calls of `run` on the handle's stream, measured between two
    /// events recorded around them.
    pub fn time_batch(&self, run: &mut Runner<'_>, k: usize) -> Result<f64, String> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = guarded("cuEventRecord", || {
            self.stream
                .record_event(flags)
                .map_err(|e| format!("recording an event: {e}"))
        })?;
        for _ in 0..k {
            run()?;
        }
        guarded("cuEventElapsedTime", || {
            let end = self
                .stream
                .record_event(flags)
                .map_err(|e| format!("recording an event: {e}"))?;
            start
                .elapsed_ms(&end)
                .map(|ms| f64::from(ms) / 1e3)
                .map_err(|e| format!("timing events: {e}"))
        })
    }

    /// One row-major `[m,k]·[k,n]` GEMM in `dtype` (f32 with TF32 tensor cores when `tf32`), on random
    /// inputs, called as the backend calls it: the column-major `Cᵀ = Bᵀ·Aᵀ`.
    pub fn gemm(
        &self,
        dtype: DType,
        tf32: bool,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<Runner<'_>, String> {
        guarded("preparing the cuBLAS GEMM", || {
            self.ctx
                .bind_to_thread()
                .map_err(|e| format!("binding the context: {e}"))?;
            let dims = [m, n, k].map(i32::try_from);
            let [Ok(mi), Ok(ni), Ok(ki)] = dims else {
                return Err(format!("{m}x{n}x{k} exceeds cuBLAS's 32-bit sizes"));
            };
            let dims = (mi, ni, ki);
            match (dtype, tf32) {
                (DType::F32, true) => self.tf32(config(dims, 1.0f32, 0.0), m, n, k),
                (DType::F32, false) => self.typed(config(dims, 1.0f32, 0.0), m, n, k, |x| x),
                (DType::F64, _) => self.typed(config(dims, 1.0, 0.0), m, n, k, f64::from),
                (DType::F16, _) => {
                    self.typed(config(dims, f16::ONE, f16::ZERO), m, n, k, f16::from_f32)
                }
                (DType::BF16, _) => {
                    self.typed(config(dims, bf16::ONE, bf16::ZERO), m, n, k, bf16::from_f32)
                }
                (other, _) => Err(format!("no cuBLAS GEMM for {other}")),
            }
        })
    }

    /// Random `[m,k]` and `[k,n]` inputs and an `[m,n]` output.
    fn buffers<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        m: usize,
        n: usize,
        k: usize,
        convert: fn(f32) -> T,
    ) -> Result<[CudaSlice<T>; 3], String> {
        let upload = |len: usize, seed: u64| {
            let host: Vec<T> = random_host(len, seed).into_iter().map(convert).collect();
            self.stream
                .clone_htod(&host)
                .map_err(|e| format!("uploading {len} elements: {e}"))
        };
        let a = upload(m * k, 1)?;
        let b = upload(k * n, 2)?;
        let c = self
            .stream
            .alloc_zeros::<T>(m * n)
            .map_err(|e| format!("allocating {} elements: {e}", m * n))?;
        Ok([a, b, c])
    }

    /// Through cudarc's safe `Gemm` trait (sgemm, dgemm, and GemmEx with f32 accumulation for 16-bit).
    fn typed<T>(
        &self,
        cfg: GemmConfig<T>,
        m: usize,
        n: usize,
        k: usize,
        convert: fn(f32) -> T,
    ) -> Result<Runner<'_>, String>
    where
        T: DeviceRepr + ValidAsZeroBits + Copy + 'static,
        CudaBlas: Gemm<T>,
    {
        let [a, b, mut c] = self.buffers(m, n, k, convert)?;
        Ok(Box::new(move || {
            guarded("cuBLAS GEMM", || {
                // SAFETY: column-major C (n x m, ld n) = `b` (n x k, ld n) · `a` (k x m, ld k), which
                // is the row-major [m,n] product; each buffer holds exactly the elements addressed.
                unsafe { self.blas.gemm(cfg, &b, &a, &mut c) }.map_err(|e| format!("GEMM: {e}"))
            })
        }))
    }

    /// f32 through `cublasGemmEx` with `CUBLAS_COMPUTE_32F_FAST_TF32`, as the backend does with tensor
    /// cores enabled.
    fn tf32(
        &self,
        cfg: GemmConfig<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<Runner<'_>, String> {
        let [a, b, mut c] = self.buffers(m, n, k, |x| x)?;
        let (alpha, beta) = (cfg.alpha, cfg.beta);
        Ok(Box::new(move || {
            guarded("cuBLAS GemmEx", || {
                let stream = &self.stream;
                let (pa, _ra) = a.device_ptr(stream);
                let (pb, _rb) = b.device_ptr(stream);
                let (pc, _rc) = c.device_ptr_mut(stream);
                use sys::cudaDataType::CUDA_R_32F;
                // SAFETY: as in `typed`; the scalars live across the call (host pointer mode).
                unsafe {
                    blas::gemm_ex(
                        *self.blas.handle(),
                        cfg.transa,
                        cfg.transb,
                        cfg.m,
                        cfg.n,
                        cfg.k,
                        &alpha as *const f32 as *const c_void,
                        pb as *const c_void,
                        CUDA_R_32F,
                        cfg.lda,
                        pa as *const c_void,
                        CUDA_R_32F,
                        cfg.ldb,
                        &beta as *const f32 as *const c_void,
                        pc as *mut c_void,
                        CUDA_R_32F,
                        cfg.ldc,
                        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
                        sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(|e| format!("GemmEx: {e}"))
            })
        }))
    }
}

/// The row-major `[m,k]·[k,n]` product as cuBLAS's column-major `Cᵀ (n x m) = Bᵀ (n x k) · Aᵀ (k x m)`:
/// the first operand is B (ld n), the second A (ld k).
fn config<T>((m, n, k): (i32, i32, i32), one: T, zero: T) -> GemmConfig<T> {
    GemmConfig {
        transa: sys::cublasOperation_t::CUBLAS_OP_N,
        transb: sys::cublasOperation_t::CUBLAS_OP_N,
        m: n,
        n: m,
        k,
        alpha: one,
        lda: n,
        ldb: k,
        beta: zero,
        ldc: n,
    }
}
