//! OpenBLAS as a peer of the CPU GEMM cases, loaded at run time with `dlopen` (nothing of it is needed
//! to build): `cblas_sgemm`, `cblas_dgemm`, `cblas_sbgemm` when the build exports it, and
//! `openblas_set_num_threads` to run at the thread count of the pass.
//!
//! OpenBLAS built with `DYNAMIC_ARCH` (Debian's) picks its kernels from the CPU it recognises, and takes
//! AVX-512 CPUs it does not know for AVX2 ones; `OPENBLAS_CORETYPE=SkylakeX` makes it use its AVX-512
//! kernels. [`set_coretype`] sets it in this process before the library is loaded.

use std::ffi::{c_char, c_int, CStr};

use libloading::Library;
use torsh_backend::prelude::bf16;
use torsh_backend::DType;

use super::cases::Runner;
use super::random::random_host;

/// The names tried, in order.
const LIBRARIES: [&str; 2] = ["libopenblas.so.0", "libopenblas.so"];
/// `CblasRowMajor`.
const ROW_MAJOR: c_int = 101;
/// `CblasNoTrans`.
const NO_TRANS: c_int = 111;

/// `cblas_sgemm` (`T = f32`) and `cblas_dgemm` (`T = f64`).
type Gemm<T> = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    T,
    *const T,
    c_int,
    *const T,
    c_int,
    T,
    *mut T,
    c_int,
);
/// `cblas_sbgemm`: bf16 inputs (as their bits), f32 output.
type Sbgemm = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    f32,
    *const u16,
    c_int,
    *const u16,
    c_int,
    f32,
    *mut f32,
    c_int,
);
/// `openblas_set_num_threads`.
type SetThreads = unsafe extern "C" fn(c_int);
/// `openblas_get_config` and `openblas_get_corename`.
type GetText = unsafe extern "C" fn() -> *const c_char;

/// Sets `OPENBLAS_CORETYPE=SkylakeX` when the CPU has AVX-512 and the variable is unset, and says so;
/// `None` when nothing was set. Call it before any thread of this process reads the environment and
/// before OpenBLAS is loaded.
pub fn set_coretype() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::env::var_os("OPENBLAS_CORETYPE").is_none()
        {
            std::env::set_var("OPENBLAS_CORETYPE", "SkylakeX");
            return Some(
                "OPENBLAS_CORETYPE=SkylakeX set by the bench (AVX-512 CPU; unset, OpenBLAS would run \
                 its AVX2 kernels)"
                    .into(),
            );
        }
    }
    None
}

/// A loader error with the loader's own words (libloading's text alone is "dlopen failed").
fn describe(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(detail) => detail.to_string(),
        None => e.to_string(),
    }
}

/// The loaded library and its entry points.
pub struct OpenBlas {
    /// `cblas_sgemm`.
    sgemm: Gemm<f32>,
    /// `cblas_dgemm`.
    dgemm: Gemm<f64>,
    /// `cblas_sbgemm`, in builds with bf16 support.
    sbgemm: Option<Sbgemm>,
    /// `openblas_set_num_threads`.
    set_threads: Option<SetThreads>,
    /// "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64 (core SkylakeX)".
    pub name: String,
    /// Keeps the entry points valid.
    _lib: Library,
}

impl OpenBlas {
    /// Loads the first library of [`LIBRARIES`] that opens; the error says why none did.
    pub fn load() -> Result<OpenBlas, String> {
        let mut reasons = Vec::new();
        for name in LIBRARIES {
            // SAFETY: loading OpenBLAS runs its initialisers (thread pool, CPU detection), nothing else.
            match unsafe { Library::new(name) } {
                Ok(lib) => return OpenBlas::bind(lib),
                Err(e) => reasons.push(describe(&e)),
            }
        }
        Err(reasons.join("; "))
    }

    /// The entry points of `lib`.
    fn bind(lib: Library) -> Result<OpenBlas, String> {
        // SAFETY: each symbol is read with the type of its C prototype (cblas.h, LP64 interface:
        // `blasint` is a 32-bit int in libopenblas.so.0), and is used only while `lib` is alive.
        unsafe {
            let sgemm = *lib
                .get::<Gemm<f32>>("cblas_sgemm")
                .map_err(|e| describe(&e))?;
            let dgemm = *lib
                .get::<Gemm<f64>>("cblas_dgemm")
                .map_err(|e| describe(&e))?;
            let sbgemm = lib.get::<Sbgemm>("cblas_sbgemm").ok().map(|s| *s);
            let set_threads = lib
                .get::<SetThreads>("openblas_set_num_threads")
                .ok()
                .map(|s| *s);
            let text = |symbol: &str| {
                lib.get::<GetText>(symbol).ok().and_then(|f| {
                    let p = f();
                    (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().trim().to_string())
                })
            };
            let config = text("openblas_get_config").unwrap_or_else(|| "OpenBLAS".into());
            let name = match text("openblas_get_corename") {
                Some(core) => format!("{config} (core {core})"),
                None => config,
            };
            Ok(OpenBlas {
                sgemm,
                dgemm,
                sbgemm,
                set_threads,
                name,
                _lib: lib,
            })
        }
    }

    /// Whether a GEMM in `dtype` can run here (`None`: OpenBLAS has no such GEMM at all).
    pub fn supports(&self, dtype: DType) -> Option<Result<(), String>> {
        match dtype {
            DType::F32 | DType::F64 => Some(Ok(())),
            DType::BF16 if self.sbgemm.is_some() => Some(Ok(())),
            DType::BF16 => Some(Err("cblas_sbgemm is not exported by this build".into())),
            _ => None,
        }
    }

    /// One row-major `[m,k]·[k,n]` GEMM on random inputs into a preallocated output, on `threads`
    /// threads.
    pub fn gemm(
        &self,
        dtype: DType,
        m: usize,
        n: usize,
        k: usize,
        threads: usize,
    ) -> Result<Runner<'_>, String> {
        let [Ok(mi), Ok(ni), Ok(ki)] = [m, n, k].map(c_int::try_from) else {
            return Err(format!("{m}x{n}x{k} exceeds OpenBLAS's 32-bit sizes"));
        };
        if let Some(set) = self.set_threads {
            // SAFETY: a plain setter; the count is at least 1.
            unsafe { set(c_int::try_from(threads.max(1)).unwrap_or(1)) };
        }
        let dims = (mi, ni, ki);
        match dtype {
            DType::F32 => {
                let (a, b) = (random_host(m * k, 1), random_host(k * n, 2));
                let c = vec![0f32; m * n];
                Ok(self.call(self.sgemm, dims, a, b, c, 1.0))
            }
            DType::F64 => {
                let widen = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
                let (a, b) = (widen(random_host(m * k, 1)), widen(random_host(k * n, 2)));
                Ok(self.call(self.dgemm, dims, a, b, vec![0f64; m * n], 1.0))
            }
            DType::BF16 => {
                let sbgemm = self.sbgemm.ok_or("cblas_sbgemm is not exported")?;
                let bits = |v: Vec<f32>| {
                    v.into_iter()
                        .map(|x| bf16::from_f32(x).to_bits())
                        .collect::<Vec<_>>()
                };
                let (a, b) = (bits(random_host(m * k, 1)), bits(random_host(k * n, 2)));
                let mut c = vec![0f32; m * n];
                Ok(Box::new(move || {
                    // SAFETY: row-major A [m,k] (ld k), B [k,n] (ld n), C [m,n] (ld n), each
                    // buffer exactly that size; C does not overlap A or B.
                    unsafe {
                        sbgemm(
                            ROW_MAJOR,
                            NO_TRANS,
                            NO_TRANS,
                            mi,
                            ni,
                            ki,
                            1.0,
                            a.as_ptr(),
                            ki,
                            b.as_ptr(),
                            ni,
                            0.0,
                            c.as_mut_ptr(),
                            ni,
                        )
                    };
                    Ok(())
                }))
            }
            other => Err(format!("no OpenBLAS GEMM for {other}")),
        }
    }

    /// A runner of `f` (sgemm or dgemm) on `a`, `b` into `c`.
    fn call<T: Copy + Default + 'static>(
        &self,
        f: Gemm<T>,
        (m, n, k): (c_int, c_int, c_int),
        a: Vec<T>,
        b: Vec<T>,
        mut c: Vec<T>,
        one: T,
    ) -> Runner<'_> {
        let zero = T::default();
        Box::new(move || {
            // SAFETY: row-major A [m,k] (ld k), B [k,n] (ld n), C [m,n] (ld n), each buffer exactly
            // that size; C does not overlap A or B.
            unsafe {
                f(
                    ROW_MAJOR,
                    NO_TRANS,
                    NO_TRANS,
                    m,
                    n,
                    k,
                    one,
                    a.as_ptr(),
                    k,
                    b.as_ptr(),
                    n,
                    zero,
                    c.as_mut_ptr(),
                    n,
                )
            };
            Ok(())
        })
    }
}
