//! The backend's CUDA C kernels: embedded sources, NVRTC compilation for the device's architecture, and
//! a per-process cache of the resulting PTX, so each source is compiled once per process, variant and
//! architecture however many backends are built.
//!
//! A module is compiled per dtype on demand: the variant `Some(dtype)` defines `TORSH_ONLY_<DTYPE>`
//! (see `common.cuh`), which keeps only that dtype's entry points, so the first op on a dtype pays for
//! NVRTC and the driver's JIT of a quarter of the module or less. The variant `None` is the full
//! module (every dtype), which the NVRTC test compiles and which modules without dtypes (`copy`) use.
//!
//! The driver JIT-compiles PTX to machine code at module load and keeps its own on-disk cache of that
//! step (`~/.nv/ComputeCache`), which is the disk cache this backend relies on: NVRTC output itself is
//! not written to disk.
//!
//! The sources use no toolkit headers (`cuda_fp16.h` moved between CUDA versions): 16-bit floats are raw
//! `unsigned short` bits converted with inline PTX or integer code in `common.cuh`, which is prepended to
//! every source. So the kernels compile wherever `libnvrtc` exists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use super::launch::suffix;
use super::loader;
use crate::device::BackendType;
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// Declarations every kernel source sees first: 16-bit float types, conversions, strided indexing.
pub const COMMON: &str = include_str!("kernels/common.cuh");

/// Every kernel source, by module name.
pub const SOURCES: &[(&str, &str)] = &[
    ("unary", include_str!("kernels/unary.cu")),
    ("binary", include_str!("kernels/binary.cu")),
    ("cast", include_str!("kernels/cast.cu")),
    ("copy", include_str!("kernels/copy.cu")),
    ("index", include_str!("kernels/index.cu")),
    ("select", include_str!("kernels/select.cu")),
    ("scan", include_str!("kernels/scan.cu")),
    ("sort", include_str!("kernels/sort.cu")),
    ("random", include_str!("kernels/random.cu")),
    ("reduce", include_str!("kernels/reduce.cu")),
    ("norm", include_str!("kernels/norm.cu")),
    ("pool", include_str!("kernels/pool.cu")),
    ("conv", include_str!("kernels/conv.cu")),
    ("attention", include_str!("kernels/attention.cu")),
    ("adam", include_str!("kernels/adam.cu")),
];

/// The full text NVRTC compiles for module `name`: `common.cuh` followed by the module's source.
/// `None` for an unknown name.
pub fn full_source(name: &str) -> Option<String> {
    SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| format!("{COMMON}\n#line 1 \"{name}.cu\"\n{src}"))
}

/// The preprocessor define that restricts a module to `dtype`'s entry points: `TORSH_ONLY_F32`, ...
pub fn variant_define(dtype: DType) -> String {
    format!("TORSH_ONLY_{}", suffix(dtype).to_ascii_uppercase())
}

/// Compiles module `name` for `arch` (such as `compute_90`) with NVRTC and returns the PTX, using the
/// process-wide cache. `variant` is `Some(dtype)` for the module restricted to `dtype`'s entry points
/// (`-DTORSH_ONLY_<DTYPE>`), `None` for the full module. `Unavailable` without NVRTC; `Driver` (with
/// NVRTC's log) when the source does not compile; `InvalidArgument` for an unknown module name.
pub fn compile(name: &str, variant: Option<DType>, arch: &str) -> Result<Arc<Ptx>> {
    /// PTX by (module, variant, architecture).
    type PtxCache = Mutex<HashMap<(String, Option<DType>, String), Arc<Ptx>>>;
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (name.to_string(), variant, arch.to_string());
    if let Some(ptx) = lock(cache).get(&key) {
        return Ok(ptx.clone());
    }
    let source = full_source(name).ok_or_else(|| {
        BackendError::invalid("cuda kernels", format!("no kernel module named `{name}`"))
    })?;
    let defines: Vec<String> = variant.map(variant_define).into_iter().collect();
    let ptx = Arc::new(compile_with_defines(name, &source, arch, &defines)?);
    lock(cache).insert(key, ptx.clone());
    Ok(ptx)
}

/// Compiles the CUDA C text `source` (named `name.cu` in messages) for `arch`, uncached. The same
/// errors as [`compile`].
pub fn compile_source(name: &str, source: &str, arch: &str) -> Result<Ptx> {
    compile_with_defines(name, source, arch, &[])
}

/// [`compile_source`] with preprocessor `defines` (`NAME` or `NAME=value`, passed as `-D`).
fn compile_with_defines(name: &str, source: &str, arch: &str, defines: &[String]) -> Result<Ptx> {
    loader::nvrtc().map_err(|reason| BackendError::Unavailable {
        backend: BackendType::Cuda,
        reason,
    })?;
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--device-as-default-execution-space".into(),
    ];
    options.extend(defines.iter().map(|d| format!("-D{d}")));
    let options = CompileOptions {
        options,
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    loader::guarded("NVRTC compilation", || {
        cudarc::nvrtc::compile_ptx_with_opts(source, options)
    })
    .map_err(|message| BackendError::Driver {
        backend: BackendType::Cuda,
        code: -1,
        message,
    })?
    .map_err(|e| compile_error(name, arch, defines, e))
}

/// Compiles every module in full (every dtype) for `arch`, returning each module's name and PTX size in
/// bytes. This is what the NVRTC test runs on machines without a GPU.
pub fn compile_all(arch: &str) -> Result<Vec<(&'static str, usize)>> {
    SOURCES
        .iter()
        .map(|(name, _)| compile(name, None, arch).map(|ptx| (*name, ptx.to_src().len())))
        .collect()
}

/// NVRTC's failure on `name.cu` (compiled for `arch` with `defines`) as a `Driver` error.
fn compile_error(name: &str, arch: &str, defines: &[String], e: CompileError) -> BackendError {
    let with = if defines.is_empty() {
        String::new()
    } else {
        format!(" with -D{}", defines.join(" -D"))
    };
    let message = match e {
        CompileError::CompileError { log, .. } => format!(
            "NVRTC could not compile {name}.cu for {arch}{with}:\n{}",
            log.to_string_lossy()
        ),
        other => format!("NVRTC failed on {name}.cu for {arch}{with}: {other:?}"),
    };
    BackendError::Driver {
        backend: BackendType::Cuda,
        code: -1,
        message,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A loaded module: its name and variant (`None`: every dtype).
type ModuleKey = (&'static str, Option<DType>);

/// One backend instance's loaded modules and functions.
#[derive(Debug)]
pub(crate) struct KernelCache {
    ctx: Arc<CudaContext>,
    arch: String,
    modules: Mutex<HashMap<ModuleKey, Arc<CudaModule>>>,
    functions: Mutex<HashMap<(ModuleKey, String), CudaFunction>>,
}

impl KernelCache {
    /// An empty cache for `ctx`, compiling for `arch`.
    pub(crate) fn new(ctx: Arc<CudaContext>, arch: String) -> Self {
        KernelCache {
            ctx,
            arch,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        }
    }

    /// The architecture kernels are compiled for (`compute_XY`).
    pub(crate) fn arch(&self) -> &str {
        &self.arch
    }

    /// Kernel `function` of module `module` in `variant` (`Some(dtype)`: the module compiled for that
    /// dtype only; `None`: the full module), compiling and loading the module on first use.
    pub(crate) fn function(
        &self,
        module: &'static str,
        variant: Option<DType>,
        function: &str,
    ) -> Result<CudaFunction> {
        let key = ((module, variant), function.to_string());
        if let Some(f) = lock(&self.functions).get(&key) {
            return Ok(f.clone());
        }
        let loaded = {
            let mut modules = lock(&self.modules);
            match modules.get(&key.0) {
                Some(m) => m.clone(),
                None => {
                    let ptx = compile(module, variant, &self.arch)?;
                    let m = self.ctx.load_module((*ptx).clone()).map_err(|e| {
                        super::driver_error(
                            &format!("loading module {}", describe(module, variant)),
                            e,
                        )
                    })?;
                    modules.insert(key.0, m.clone());
                    m
                }
            }
        };
        let f = loaded.load_function(function).map_err(|e| {
            let module = describe(module, variant);
            super::driver_error(&format!("finding kernel {module}::{function}"), e)
        })?;
        lock(&self.functions).insert(key, f.clone());
        Ok(f)
    }
}

/// `module` or `module[dtype]` (a per-dtype variant), for messages.
fn describe(module: &str, variant: Option<DType>) -> String {
    match variant {
        Some(dtype) => format!("{module}[{}]", suffix(dtype)),
        None => module.to_string(),
    }
}
