//! The CPU backend: runtime-dispatched SIMD and a rayon pool of its own.
//!
//! What is built so far: GEMM, batched GEMM and GEMV (bf16 GEMV excepted) run on the `gemm` crate's microkernels (AVX-512 with its
//! `x86-v4` feature, AVX2+FMA, NEON; chosen at run time, never by `target-cpu`), threaded on this
//! backend's pool of `num_threads` threads. Every other op still runs the scalar reference kernels, on
//! the same 64-byte aligned host memory; they move here one family at a time. `enable_simd(false)`
//! sends GEMM to the scalar reference kernel too.

mod blas;
pub mod simd;

use gemm::Parallelism;

use crate::backends::reference::ReferenceBackend;
use crate::compute::*;
use crate::device::{host_core_count, BackendType, DeviceInfo};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
pub use simd::SimdLevel;

/// The CPU implementation of [`ComputeBackend`]. Build it through [`crate::Backend::cpu`].
#[derive(Debug)]
pub struct CpuBackend {
    /// Memory, checks and the ops that have no SIMD kernel yet.
    scalar: ReferenceBackend,
    pool: rayon::ThreadPool,
    threads: usize,
    simd: SimdLevel,
}

impl CpuBackend {
    /// A backend with `threads` worker threads (all cores when `None`) that uses SIMD kernels when
    /// `simd` is true and the CPU has them. `InvalidArgument` for 0 threads; `Driver`-free
    /// `FeatureUnavailable` when the thread pool cannot be created.
    pub fn new(threads: Option<usize>, simd: bool) -> Result<CpuBackend> {
        let threads = threads.unwrap_or_else(host_core_count);
        if threads == 0 {
            return Err(BackendError::invalid(
                "num_threads",
                "the thread count must be at least 1",
            ));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("torsh-cpu-{i}"))
            .build()
            .map_err(|e| BackendError::FeatureUnavailable {
                feature: "CPU thread pool",
                reason: e.to_string(),
            })?;
        Ok(CpuBackend {
            scalar: ReferenceBackend::new(BackendType::Cpu),
            pool,
            threads,
            simd: if simd {
                SimdLevel::detect()
            } else {
                SimdLevel::Scalar
            },
        })
    }

    /// The SIMD level in use.
    pub fn simd(&self) -> SimdLevel {
        self.simd
    }

    fn parallelism(&self) -> Parallelism {
        if self.threads > 1 {
            Parallelism::Rayon(self.threads)
        } else {
            Parallelism::None
        }
    }

    /// Whether `d` can take the SIMD GEMM: SIMD on, a float dtype, element-aligned operands and a
    /// product that is not empty (the reference handles `k = 0` and empty outputs).
    fn simd_gemm(&self, d: &GemmDesc) -> bool {
        self.simd != SimdLevel::Scalar
            && d.dtype.is_float()
            && d.m > 0
            && d.n > 0
            && d.k > 0
            && blas::aligned(d.dtype, &[d.a.0, d.b.0, d.c.0])
    }
}

impl ComputeBackend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn backend_type(&self) -> BackendType {
        BackendType::Cpu
    }

    fn init(&mut self) -> Result<()> {
        self.scalar.init()
    }

    fn is_initialized(&self) -> bool {
        self.scalar.is_initialized()
    }

    fn device_info(&self) -> DeviceInfo {
        let mut info = self.scalar.device_info();
        info.api = "CPU: SIMD GEMM (gemm crate, runtime dispatch) on a rayon pool; other ops on the scalar reference kernels".into();
        info.details = vec![
            ("cores".into(), host_core_count().to_string()),
            ("threads used".into(), self.threads.to_string()),
            ("simd".into(), self.simd.name().into()),
        ];
        info
    }

    fn synchronize(&self) -> Result<()> {
        self.scalar.synchronize()
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.scalar.alloc(bytes)
    }

    fn allocated_bytes(&self) -> Option<usize> {
        self.scalar.allocated_bytes()
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.scalar.free(ptr)
    }

    fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.scalar.copy_htod(dst, src)
    }

    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.scalar.copy_dtoh(dst, src)
    }

    fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.scalar.copy_dtod(dst, src, bytes)
    }

    fn gemm(&self, desc: &GemmDesc) -> Result<()> {
        if !self.simd_gemm(desc) {
            return self.scalar.gemm(desc);
        }
        self.scalar.float_only("gemm", desc.dtype)?;
        let acc = desc.accesses()?;
        let regions = [
            acc.regions[0].bytes,
            acc.regions[1].bytes,
            acc.regions[2].bytes,
        ];
        let parallelism = self.parallelism();
        self.pool.install(|| {
            self.scalar
                .run(acc, |mem| blas::gemm(mem, desc, regions, parallelism))
        })
    }

    fn gemv(&self, desc: &GemvDesc) -> Result<()> {
        let simd = self.simd != SimdLevel::Scalar
            && matches!(desc.dtype, DType::F32 | DType::F64 | DType::F16)
            && desc.m > 0
            && desc.n > 0
            && blas::aligned(desc.dtype, &[desc.a.0, desc.x.0, desc.y.0]);
        if !simd {
            return self.scalar.gemv(desc);
        }
        let acc = desc.accesses()?;
        let regions = [
            acc.regions[0].bytes,
            acc.regions[1].bytes,
            acc.regions[2].bytes,
        ];
        let parallelism = self.parallelism();
        self.pool.install(|| {
            self.scalar
                .run(acc, |mem| blas::gemv(mem, desc, regions, parallelism))
        })
    }

    fn conv2d_forward(&self, desc: &Conv2dDesc) -> Result<()> {
        self.scalar.conv2d_forward(desc)
    }

    fn attention(&self, desc: &AttentionDesc) -> Result<()> {
        self.scalar.attention(desc)
    }

    fn reduce(&self, desc: &ReduceDesc) -> Result<()> {
        self.scalar.reduce(desc)
    }

    fn unary(&self, desc: &UnaryDesc) -> Result<()> {
        self.scalar.unary(desc)
    }

    fn binary(&self, desc: &BinaryDesc) -> Result<()> {
        self.scalar.binary(desc)
    }

    fn softmax(&self, desc: &SoftmaxDesc) -> Result<()> {
        self.scalar.softmax(desc)
    }

    fn layer_norm(&self, desc: &LayerNormDesc) -> Result<()> {
        self.scalar.layer_norm(desc)
    }

    fn batch_norm(&self, desc: &BatchNormDesc) -> Result<()> {
        self.scalar.batch_norm(desc)
    }

    fn pool2d(&self, desc: &Pool2dDesc) -> Result<()> {
        self.scalar.pool2d(desc)
    }

    fn adam_step(&self, desc: &AdamDesc) -> Result<()> {
        self.scalar.adam_step(desc)
    }

    fn fill(&self, desc: &FillDesc) -> Result<()> {
        self.scalar.fill(desc)
    }

    fn cast(&self, desc: &CastDesc) -> Result<()> {
        self.scalar.cast(desc)
    }

    fn copy_strided(&self, desc: &CopyDesc) -> Result<()> {
        self.scalar.copy_strided(desc)
    }

    fn random(&self, desc: &RandomDesc) -> Result<()> {
        self.scalar.random(desc)
    }
}
