//! `cargo bench -p torsh-cli --bench cpu`: criterion measurements of the CPU backend on one thread,
//! beside its GEMM peers: f32 GEMM 256 and 1024 (ours, the `gemm` crate called directly,
//! `matrixmultiply`), softmax over the rows of 4096x1024, and a ResNet 3x3 conv2d. Throughput is in
//! "elements" per second, an element being one flop (GEMM, conv2d) or one byte read or written
//! (softmax). `torsh-backend bench --backend cpu` is the fuller tool (OpenBLAS, every section, both
//! thread counts, ceilings).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use torsh_backend::{Backend, ConvConfig, DType, Tensor};

/// The single-threaded CPU backend, or why it could not be built.
fn backend() -> Result<Backend, String> {
    Backend::cpu()
        .num_threads(1)
        .build()
        .map_err(|e| e.to_string())
}

/// `len` values in [-1, 1) (a fixed pattern: the peers' inputs need no randomness).
fn values(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}

/// f32 GEMM `s x s x s`: ours, the `gemm` crate, `matrixmultiply`.
fn gemm_square(c: &mut Criterion, s: usize) -> Result<(), String> {
    let cpu = backend()?;
    let err = |e: torsh_backend::BackendError| e.to_string();
    let a = cpu.randn(&[s, s], DType::F32).map_err(err)?;
    let b = cpu.randn(&[s, s], DType::F32).map_err(err)?;
    let (pa, pb) = (values(s * s), values(s * s));
    let mut out = vec![0f32; s * s];
    let mut group = c.benchmark_group("gemm_f32");
    group.throughput(Throughput::Elements(2 * (s * s * s) as u64));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(3));
    group.bench_with_input(BenchmarkId::new("ours", s), &s, |bench, _| {
        bench.iter(|| black_box(a.matmul(&b)))
    });
    group.bench_with_input(BenchmarkId::new("gemm", s), &s, |bench, _| {
        bench.iter(|| {
            // SAFETY: row-major s x s buffers of exactly s·s elements; `out` overlaps neither input.
            unsafe {
                gemm::gemm(
                    s,
                    s,
                    s,
                    out.as_mut_ptr(),
                    1,
                    s as isize,
                    false,
                    pa.as_ptr(),
                    1,
                    s as isize,
                    pb.as_ptr(),
                    1,
                    s as isize,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            };
            black_box(&out);
        })
    });
    group.bench_with_input(BenchmarkId::new("matrixmultiply", s), &s, |bench, _| {
        bench.iter(|| {
            // SAFETY: as above.
            unsafe {
                matrixmultiply::sgemm(
                    s,
                    s,
                    s,
                    1.0,
                    pa.as_ptr(),
                    s as isize,
                    1,
                    pb.as_ptr(),
                    s as isize,
                    1,
                    0.0,
                    out.as_mut_ptr(),
                    s as isize,
                    1,
                )
            };
            black_box(&out);
        })
    });
    group.finish();
    Ok(())
}

/// Softmax over each row of a 4096x1024 f32 tensor.
fn softmax(c: &mut Criterion) -> Result<(), String> {
    let cpu = backend()?;
    let (rows, cols) = (4096, 1024);
    let x = cpu
        .randn(&[rows, cols], DType::F32)
        .map_err(|e| e.to_string())?;
    let mut group = c.benchmark_group("softmax_f32");
    group.throughput(Throughput::Elements(2 * 4 * (rows * cols) as u64));
    group.sample_size(20);
    group.bench_function(BenchmarkId::new("ours", "4096x1024"), |bench| {
        bench.iter(|| black_box(x.softmax(-1)))
    });
    group.finish();
    Ok(())
}

/// A ResNet 3x3 layer: 64 -> 64 channels at 56x56, batch 1, with bias.
fn conv2d(c: &mut Criterion) -> Result<(), String> {
    let cpu = backend()?;
    let err = |e: torsh_backend::BackendError| e.to_string();
    let input: Tensor = cpu.randn(&[1, 64, 56, 56], DType::F32).map_err(err)?;
    let weight = cpu.randn(&[64, 64, 3, 3], DType::F32).map_err(err)?;
    let bias = cpu.randn(&[64], DType::F32).map_err(err)?;
    let config = ConvConfig {
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    };
    let mut group = c.benchmark_group("conv2d_f32");
    group.throughput(Throughput::Elements(2 * 64 * 56 * 56 * 64 * 9));
    group.sample_size(20);
    group.bench_function(BenchmarkId::new("ours", "N1 C64 56x56 K64 3x3"), |bench| {
        bench.iter(|| black_box(cpu.conv2d_with_bias(&input, &weight, Some(&bias), config)))
    });
    group.finish();
    Ok(())
}

/// Every benchmark; one that cannot be set up says why and the others go on.
fn all(c: &mut Criterion) {
    let results = [
        ("gemm 256", gemm_square(c, 256)),
        ("gemm 1024", gemm_square(c, 1024)),
        ("softmax", softmax(c)),
        ("conv2d", conv2d(c)),
    ];
    for (name, result) in results {
        if let Err(e) = result {
            eprintln!("{name}: not run: {e}");
        }
    }
}

criterion_group!(benches, all);

/// `criterion_main!`, after fixing `matrixmultiply` to one thread (it reads the count once per
/// process).
fn main() {
    std::env::set_var("MATMUL_NUM_THREADS", "1");
    benches();
    Criterion::default().configure_from_args().final_summary();
}
