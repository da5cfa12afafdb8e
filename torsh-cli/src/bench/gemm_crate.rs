//! The `gemm` crate called directly, as a peer of the CPU GEMM cases: the same crate ours calls, with
//! its `x86-v4` feature (AVX-512 kernels), on a rayon pool of the pass's thread count.

use gemm::Parallelism;
use torsh_backend::prelude::f16;
use torsh_backend::DType;

use super::cases::Runner;
use super::random::random_host;

/// Whether the crate has a GEMM in `dtype` (f32, f64, f16; no bf16).
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64 | DType::F16)
}

/// One row-major `[m,k]·[k,n]` GEMM on random inputs into a preallocated output, on `pool` with
/// `threads` threads (single-threaded without the pool for 1).
pub fn gemm(
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    pool: &rayon::ThreadPool,
) -> Result<Runner<'_>, String> {
    let parallelism = if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    let dims = Dims { m, n, k };
    match dtype {
        DType::F32 => Ok(typed(dims, |x| x, 0.0, 1.0, parallelism, pool)),
        DType::F64 => Ok(typed(dims, f64::from, 0.0, 1.0, parallelism, pool)),
        DType::F16 => Ok(typed(
            dims,
            f16::from_f32,
            f16::ZERO,
            f16::ONE,
            parallelism,
            pool,
        )),
        other => Err(format!("the gemm crate has no {other} GEMM")),
    }
}

/// The sizes of a row-major `[m,k]·[k,n]` product.
#[derive(Clone, Copy)]
struct Dims {
    /// Rows of A and C.
    m: usize,
    /// Columns of B and C.
    n: usize,
    /// Columns of A, rows of B.
    k: usize,
}

/// The runner for element type `T` (f32, f64 or f16: the types the crate dispatches on).
fn typed<T: Copy + Send + Sync + 'static>(
    Dims { m, n, k }: Dims,
    convert: fn(f32) -> T,
    zero: T,
    one: T,
    parallelism: Parallelism,
    pool: &rayon::ThreadPool,
) -> Runner<'_> {
    let a: Vec<T> = random_host(m * k, 1).into_iter().map(convert).collect();
    let b: Vec<T> = random_host(k * n, 2).into_iter().map(convert).collect();
    let mut c = vec![zero; m * n];
    Box::new(move || {
        let (a, b, c) = (a.as_slice(), b.as_slice(), c.as_mut_slice());
        let mut call = move || {
            // SAFETY: row-major C [m,n] (row stride n), A [m,k] (row stride k), B [k,n] (row
            // stride n), each slice exactly that size; C does not overlap A or B. The crate's
            // `alpha` scales C (not read: `read_dst` is false), its `beta` the product.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    b.as_ptr(),
                    1,
                    n as isize,
                    zero,
                    one,
                    false,
                    false,
                    false,
                    parallelism,
                )
            }
        };
        if matches!(parallelism, Parallelism::None) {
            call();
        } else {
            pool.install(call);
        }
        Ok(())
    })
}
