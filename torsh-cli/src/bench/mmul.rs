//! `matrixmultiply` as a peer of the CPU f32/f64 GEMM cases.
//!
//! The crate threads with its `threading` feature, and reads its thread count once per process from
//! `MATMUL_NUM_THREADS` (at most 4); it cannot be set per call. So each case is measured in a child
//! process, this same binary run as `torsh-backend bench-peer`, started with `MATMUL_NUM_THREADS` set
//! to the pass's thread count. It prints its timing as one JSON line. Its own kernels are AVX2/FMA at
//! most for f32 and f64 (the crate's AVX-512 kernels serve complex types only).

use std::process::{Command, ExitCode};

use serde_json::{json, Value};
use torsh_backend::DType;

use super::cases::Runner;
use super::random::random_host;
use super::{measure, wall_clock, Timing};

/// The name of the hidden subcommand the child runs.
pub const SUBCOMMAND: &str = "bench-peer";

/// Whether the crate has a GEMM in `dtype`.
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
}

/// What the child is asked to measure (the hidden subcommand's arguments).
pub struct ChildArgs {
    /// `f32` or `f64`.
    pub dtype: String,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Columns of A, rows of B.
    pub k: usize,
    /// Repeats; the median is reported.
    pub repeats: usize,
    /// Minimum seconds of one repeat.
    pub min_repeat_s: f64,
}

/// Measures a case in a child process with `threads` threads; the error says what went wrong.
pub fn measure_in_child(
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    threads: usize,
    repeats: usize,
    target: f64,
) -> Result<Timing, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let out = Command::new(&exe)
        .arg(SUBCOMMAND)
        .args(["--dtype", dtype.name()])
        .args(["--m", &m.to_string(), "--n", &n.to_string()])
        .args(["--k", &k.to_string(), "--repeats", &repeats.to_string()])
        .args(["--min-repeat-s", &target.to_string()])
        .env("MATMUL_NUM_THREADS", threads.to_string())
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    let doc: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "the child's answer is not JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    if let Some(e) = doc["error"].as_str() {
        return Err(e.to_string());
    }
    serde_json::from_value(doc["timing"].clone()).map_err(|e| format!("the child's timing: {e}"))
}

/// The child: measures the GEMM of `args` and prints `{"timing": ...}` or `{"error": ...}`.
pub fn child(args: ChildArgs) -> ExitCode {
    let result = DType::from_name(&args.dtype)
        .ok_or_else(|| format!("no dtype {}", args.dtype))
        .and_then(|dtype| gemm(dtype, args.m, args.n, args.k))
        .and_then(|mut run| {
            measure(
                &mut run,
                &wall_clock(&|| Ok(())),
                args.repeats.max(1),
                args.min_repeat_s,
            )
        });
    let doc = match result {
        Ok(t) => json!({ "timing": t }),
        Err(e) => json!({ "error": e }),
    };
    println!("{doc}");
    ExitCode::SUCCESS
}

/// One row-major `[m,k]·[k,n]` GEMM on random inputs into a preallocated output.
fn gemm(dtype: DType, m: usize, n: usize, k: usize) -> Result<Runner<'static>, String> {
    let strides = (k as isize, n as isize);
    match dtype {
        DType::F32 => {
            let (a, b) = (random_host(m * k, 1), random_host(k * n, 2));
            let mut c = vec![0f32; m * n];
            Ok(Box::new(move || {
                // SAFETY: row-major A [m,k], B [k,n], C [m,n] with unit column strides, each
                // buffer exactly that size; C does not overlap A or B.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        strides.0,
                        1,
                        b.as_ptr(),
                        strides.1,
                        1,
                        0.0,
                        c.as_mut_ptr(),
                        strides.1,
                        1,
                    )
                };
                Ok(())
            }))
        }
        DType::F64 => {
            let widen = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
            let (a, b) = (widen(random_host(m * k, 1)), widen(random_host(k * n, 2)));
            let mut c = vec![0f64; m * n];
            Ok(Box::new(move || {
                // SAFETY: as for f32.
                unsafe {
                    matrixmultiply::dgemm(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        strides.0,
                        1,
                        b.as_ptr(),
                        strides.1,
                        1,
                        0.0,
                        c.as_mut_ptr(),
                        strides.1,
                        1,
                    )
                };
                Ok(())
            }))
        }
        other => Err(format!("matrixmultiply has no {other} GEMM")),
    }
}
