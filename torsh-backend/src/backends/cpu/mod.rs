//! The CPU backend: runtime-dispatched SIMD and a thread team of its own.
//!
//! Every op has kernels here, one module per family, compiled for the SIMD level detected at run
//! time (AVX-512, AVX2+FMA, NEON; never `target-cpu`) through `host::with_simd` and threaded on
//! this backend's team of `num_threads` threads (module `team`: the calling thread and its
//! workers). GEMM, batched GEMM and GEMV run on the `gemm` crate's microkernels; bf16 GEMM on
//! AVX512_BF16 dot products where the CPU has them (module `bf16_gemm`). Integer dtypes, misaligned operands and `enable_simd(false)` take the scalar
//! reference kernels on the same 64-byte aligned host memory, and so does every invalid descriptor,
//! so that bad input gets the reference's typed errors.

mod accumulators;
mod attention;
#[cfg(target_arch = "x86_64")]
mod bf16_gemm;
mod blas;
mod conv;
mod copy;
mod cost;
mod elementwise;
mod host;
mod index;
mod loss;
mod norm;
mod optim;
mod pool;
mod reduce;
mod scan;
mod scratch;
mod select;
pub mod simd;
mod small_gemm;
mod sort;
mod stream;
mod team;
mod vector;
mod vmath;

use gemm::Parallelism;

use crate::backends::reference::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::ops_by_impl;
use crate::compute::*;
use crate::device::{host_core_count, host_memory_bytes, BackendType, DeviceInfo};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use cost::Work;
use host::Ctx;
pub use simd::SimdLevel;

/// The CPU implementation of [`ComputeBackend`]. Build it through [`crate::Backend::cpu`].
#[derive(Debug)]
pub struct CpuBackend {
    /// Memory, checks and the ops that have no SIMD kernel yet.
    scalar: ReferenceBackend,
    team: team::Team,
    threads: usize,
    simd: SimdLevel,
    /// bf16 GEMM on the AVX512_BF16 dot-product instruction.
    bf16_dot: bool,
}

impl CpuBackend {
    /// A backend with `threads` worker threads (all cores when `None`) that uses SIMD kernels when
    /// `simd` is true and the CPU has them. `InvalidArgument` for 0 threads; `Driver`-free
    /// `FeatureUnavailable` when its worker threads cannot be started.
    pub fn new(threads: Option<usize>, simd: bool) -> Result<CpuBackend> {
        let threads = threads.unwrap_or_else(host_core_count);
        if threads == 0 {
            return Err(BackendError::invalid(
                "num_threads",
                "the thread count must be at least 1",
            ));
        }
        let team = team::Team::new(threads)?;
        let poison =
            cfg!(debug_assertions) || std::env::var("TORSH_POISON").is_ok_and(|v| v == "1");
        let memory = HostMemory::recycling(
            usize::try_from(host_memory_bytes() / 4).unwrap_or(usize::MAX),
            poison,
        );
        Ok(CpuBackend {
            scalar: ReferenceBackend::with_memory(BackendType::Cpu, memory),
            team,
            threads,
            simd: if simd {
                SimdLevel::detect()
            } else {
                SimdLevel::Scalar
            },
            bf16_dot: simd && bf16_dot_available(),
        })
    }

    /// The SIMD level in use.
    pub fn simd(&self) -> SimdLevel {
        self.simd
    }

    /// The accesses of an op on `dtype` when it takes this backend's kernels: SIMD on, a float
    /// dtype, valid accesses, and every operand aligned to its element size (the raw trait allows any
    /// byte address). `None` sends the op to the reference kernels, which also give every invalid
    /// descriptor its typed error, so both backends answer bad input alike.
    fn takes(&self, dtype: DType, acc: Result<Accesses>) -> Option<Accesses> {
        let acc = acc.ok()?;
        let ours = self.simd != SimdLevel::Scalar
            && dtype.is_float()
            && blas::aligned(
                dtype,
                &acc.regions.iter().map(|r| r.ptr.0).collect::<Vec<_>>(),
            );
        ours.then_some(acc)
    }

    /// Checks `acc` and runs `kernel` under the memory lock: on this backend's team when it has more
    /// than one thread and the bytes the op touches repay the hand-off (module `cost`), else on
    /// the calling thread alone with `Ctx::threads == 1`.
    fn kernel(
        &self,
        acc: Accesses,
        kernel: impl FnOnce(&mut HostMemory, Ctx) -> Result<()> + Send,
    ) -> Result<()> {
        let parallel = touched(&acc).shares();
        self.kernel_on(acc, parallel, kernel)
    }

    /// [`CpuBackend::kernel`] for an op whose arithmetic is `work` besides the bytes it touches: on
    /// the team when the two together repay the hand-off (module `cost`).
    fn kernel_computing(
        &self,
        acc: Accesses,
        work: Work,
        kernel: impl FnOnce(&mut HostMemory, Ctx) -> Result<()> + Send,
    ) -> Result<()> {
        let parallel = touched(&acc).plus(work).shares();
        self.kernel_on(acc, parallel, kernel)
    }

    /// [`CpuBackend::kernel`] on the team when `parallel`, else on the calling thread alone. The
    /// calling thread takes the memory lock before it shares the kernel's tasks (see
    /// [`Self::on_team`]).
    fn kernel_on(
        &self,
        acc: Accesses,
        parallel: bool,
        kernel: impl FnOnce(&mut HostMemory, Ctx) -> Result<()> + Send,
    ) -> Result<()> {
        self.scalar.run(acc, |mem| {
            self.on_team(parallel, |threads| {
                let ctx = Ctx {
                    threads,
                    simd: self.simd,
                };
                kernel(mem, ctx)
            })
        })
    }

    /// Runs `f(threads)` with this backend's team as the current one, so its kernels share their
    /// tasks with the workers, when `parallel` and the team has more than one thread; else with 1.
    ///
    /// Lock discipline: callers take the memory lock first and then run `f` on their own thread; a
    /// task never takes a lock and the team's workers run nothing else, so no op can wait on
    /// another from inside the team (see the `team` module).
    fn on_team<R>(&self, parallel: bool, f: impl FnOnce(usize) -> R) -> R {
        if parallel && self.threads > 1 {
            self.team.enter(|| f(self.threads))
        } else {
            f(1)
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

    /// Whether the SIMD GEMM of `d` can use more than the calling thread: this backend has
    /// several, and the kernel that runs it shares it out (the `gemm` crate's and the small-product
    /// tiles' blocks, [`blas::splits`], or the bf16 dot-product kernel). Where it cannot, the team
    /// is not entered.
    fn gemm_shares(&self, d: &GemmDesc) -> bool {
        self.threads > 1
            && ((self.bf16_dot && d.dtype == DType::BF16) || blas::splits(d.m, d.n, self.threads))
    }

    /// GEMM on the team (`Some(true)`), on the calling thread alone (`Some(false)`), or as its work
    /// suggests (`None`: [`gemm_work`]).
    fn gemm_threaded(&self, desc: &GemmDesc, parallel: Option<bool>) -> Result<()> {
        if !self.simd_gemm(desc) {
            return self.scalar.gemm(desc);
        }
        let (Ok(()), Ok(acc)) = (self.scalar.float_only("gemm", desc.dtype), desc.accesses())
        else {
            return self.scalar.gemm(desc);
        };
        let regions = [
            acc.regions[0].bytes,
            acc.regions[1].bytes,
            acc.regions[2].bytes,
        ];
        let parallel =
            self.gemm_shares(desc) && parallel.unwrap_or_else(|| gemm_work(desc).shares());
        self.scalar.run(acc, |mem| {
            self.on_team(parallel, |threads| {
                self.gemm_kernel(mem, desc, regions, threads)
            })
        })
    }

    /// One SIMD GEMM on `threads` threads (the caller entered the team), on memory the caller
    /// checked: bf16 on the AVX512_BF16 kernel where the CPU has it, else the `gemm` crate.
    fn gemm_kernel(
        &self,
        mem: &mut HostMemory,
        desc: &GemmDesc,
        regions: [usize; 3],
        threads: usize,
    ) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if self.bf16_dot && desc.dtype == DType::BF16 {
            return bf16_gemm::gemm(mem, desc, regions, threads);
        }
        blas::gemm(mem, desc, regions, parallelism(threads), self.simd)
    }
}

/// The work of moving every byte of `acc`'s regions once.
fn touched(acc: &Accesses) -> Work {
    // Saturating: `run` rejects regions whose sizes overflow, with a typed error.
    let bytes = acc
        .regions
        .iter()
        .fold(0usize, |sum, r| sum.saturating_add(r.bytes));
    Work::bytes(bytes)
}

/// The autotuner's names for a GEMM or a convolution on the team and on the calling thread alone.
const GEMM_POOL: &str = "threads:pool";
const GEMM_INLINE: &str = "threads:1";

/// The autotuner's names for a convolution by a kernel family other than its default's (see
/// `conv::Algorithm`), on the team and on the calling thread alone.
const CONV_IM2COL_POOL: &str = "im2col+threads:pool";
const CONV_IM2COL_INLINE: &str = "im2col+threads:1";
const CONV_WINOGRAD_POOL: &str = "winograd+threads:pool";
const CONV_WINOGRAD_INLINE: &str = "winograd+threads:1";
const CONV_DIRECT_POOL: &str = "direct+threads:pool";
const CONV_DIRECT_INLINE: &str = "direct+threads:1";

/// The work of a GEMM: its multiply-adds, and reading its operands and writing its result once.
fn gemm_work(d: &GemmDesc) -> Work {
    let elements =
        d.m.saturating_mul(d.k)
            .saturating_add(d.k.saturating_mul(d.n))
            .saturating_add(d.m.saturating_mul(d.n));
    let macs = d.m.saturating_mul(d.n).saturating_mul(d.k);
    Work::flops(macs.saturating_mul(2)).plus(Work::bytes(
        elements.saturating_mul(d.dtype.size_in_bytes()),
    ))
}

/// The `gemm` crate's parallelism for `threads` threads.
fn parallelism(threads: usize) -> Parallelism {
    if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    }
}

/// True when the bf16 dot-product GEMM can run here.
fn bf16_dot_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        bf16_gemm::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
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
        info.api = if self.simd == SimdLevel::Scalar {
            "CPU: scalar reference kernels (SIMD off)".into()
        } else {
            "CPU: SIMD kernels for every op (runtime dispatch; GEMM on the gemm crate, small products on register tiles) on a thread team"
                .into()
        };
        info.details = vec![
            ("cores".into(), host_core_count().to_string()),
            ("threads used".into(), self.threads.to_string()),
            ("simd".into(), self.simd.name().into()),
            (
                "bf16 GEMM".into(),
                if self.bf16_dot {
                    "AVX512_BF16 dot products".into()
                } else {
                    "widened to f32".into()
                },
            ),
            (
                "buffer cache".into(),
                format!("{} bytes held for reuse", self.scalar.cached_bytes()),
            ),
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
        let mut acc = Accesses::new("copy_dtod", InPlace::Forbidden);
        acc.push("src", src, bytes, Access::Read, true);
        acc.push("dst", dst, bytes, Access::Write, true);
        self.kernel(acc, |mem, ctx| {
            copy::device_to_device(mem, dst, src, bytes, ctx)
        })
    }

    // Every op method runs this backend's `OpImpl` of its descriptor, in the file of its family.
    crate::for_each_op!(ops_by_impl);
    fn fingerprint(&self) -> String {
        format!(
            "cpu/{}/threads={}/simd={}",
            self.scalar.device_info().name,
            self.threads,
            self.simd.name()
        )
    }

    fn variants(&self, op: &TunableOp) -> &'static [&'static str] {
        match op {
            TunableOp::Gemm(d) if self.threads > 1 && self.simd_gemm(d) => {
                if gemm_work(d).shares() {
                    &[GEMM_POOL, GEMM_INLINE]
                } else {
                    &[GEMM_INLINE, GEMM_POOL]
                }
            }
            TunableOp::Conv2d(d) => {
                let Some(acc) = self.takes(d.dtype, d.accesses()) else {
                    return &[];
                };
                // The kernel family the default does not take, where another applies.
                let other = if conv::winograd_preferred(d) || conv::direct_preferred(d) {
                    Some(conv::Algorithm::Im2col)
                } else if conv::winograd_applies(d) {
                    Some(conv::Algorithm::Winograd)
                } else if conv::direct_offered(d) {
                    Some(conv::Algorithm::Direct)
                } else {
                    None
                };
                use conv::Algorithm::{Direct, Im2col};
                let shares = touched(&acc).plus(conv::work(d)).shares();
                match (self.threads > 1, shares, other) {
                    (false, _, None) => &[],
                    (false, _, Some(Im2col)) => &[GEMM_INLINE, CONV_IM2COL_INLINE],
                    (false, _, Some(Direct)) => &[GEMM_INLINE, CONV_DIRECT_INLINE],
                    (false, _, Some(_)) => &[GEMM_INLINE, CONV_WINOGRAD_INLINE],
                    (true, true, None) => &[GEMM_POOL, GEMM_INLINE],
                    (true, false, None) => &[GEMM_INLINE, GEMM_POOL],
                    (true, true, Some(Im2col)) => &[GEMM_POOL, GEMM_INLINE, CONV_IM2COL_POOL],
                    (true, false, Some(Im2col)) => &[GEMM_INLINE, GEMM_POOL, CONV_IM2COL_INLINE],
                    (true, true, Some(Direct)) => &[GEMM_POOL, GEMM_INLINE, CONV_DIRECT_POOL],
                    (true, false, Some(Direct)) => &[GEMM_INLINE, GEMM_POOL, CONV_DIRECT_INLINE],
                    (true, true, Some(_)) => &[GEMM_POOL, GEMM_INLINE, CONV_WINOGRAD_POOL],
                    (true, false, Some(_)) => &[GEMM_INLINE, GEMM_POOL, CONV_WINOGRAD_INLINE],
                }
            }
            _ => &[],
        }
    }

    fn run_variant(&self, op: &TunableOp, variant: &str) -> Result<()> {
        match (op, variant) {
            (TunableOp::Gemm(d), GEMM_POOL) if self.variants(op).contains(&GEMM_POOL) => {
                self.gemm_threaded(d, Some(true))
            }
            (TunableOp::Gemm(d), GEMM_INLINE) if self.variants(op).contains(&GEMM_INLINE) => {
                self.gemm_threaded(d, Some(false))
            }
            (TunableOp::Conv2d(d), _) if self.variants(op).contains(&variant) => {
                let acc = self.takes(d.dtype, d.accesses()).ok_or_else(|| {
                    BackendError::invalid("conv2d", "internal: a tuned conv left the SIMD path")
                })?;
                let algorithm = match variant {
                    CONV_IM2COL_POOL | CONV_IM2COL_INLINE => conv::Algorithm::Im2col,
                    CONV_WINOGRAD_POOL | CONV_WINOGRAD_INLINE => conv::Algorithm::Winograd,
                    CONV_DIRECT_POOL | CONV_DIRECT_INLINE => conv::Algorithm::Direct,
                    _ => conv::Algorithm::Auto,
                };
                let pool = matches!(
                    variant,
                    GEMM_POOL | CONV_IM2COL_POOL | CONV_WINOGRAD_POOL | CONV_DIRECT_POOL
                );
                self.kernel_on(acc, pool, |mem, ctx| {
                    conv::conv2d_by(mem, d, ctx, algorithm)
                })
            }
            _ => Err(BackendError::invalid(
                op.name(),
                format!("the cpu backend has no variant `{variant}` of this op"),
            )),
        }
    }
}
