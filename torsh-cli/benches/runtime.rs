//! `cargo bench -p torsh-cli --bench runtime`: the runtime services against what they replace, side by
//! side in one run: allocating and freeing a tensor through the caching memory pool, through the
//! backend's own allocator, and a host buffer from the system allocator, at 4 KiB and 4 MiB, on the CPU
//! backend and (where an adapter exists) on WebGPU; and a chain of 50 small elementwise ops run
//! eagerly against the same chain captured once and replayed with `launch_graph`, on the reference,
//! CPU and WebGPU backends; and GEMMs of sizes where the default kernel choice is in doubt, with the
//! autotuner off and on (CPU: calling thread or pool; WebGPU: 64- or 32-wide tiles). After the runs,
//! the medians and the ratios are printed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use torsh_backend::{Backend, BackendType, DType, MemoryPoolConfig, Tensor};

/// Median seconds per call of `f` over `rounds` rounds of `k` calls.
fn median_per_call(mut f: impl FnMut(), k: usize, rounds: usize) -> f64 {
    let mut per = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..k {
            f();
        }
        per.push(start.elapsed().as_secs_f64() / k as f64);
    }
    per.sort_by(f64::total_cmp);
    per[rounds / 2]
}

/// One allocate-and-free of `bytes`: through the pool, the raw backend, the system allocator.
fn alloc_free(c: &mut Criterion, kind: BackendType, bytes: usize) {
    let Ok(raw) = Backend::new(kind) else {
        eprintln!("runtime bench: {kind} unavailable, skipped");
        return;
    };
    let pooled = match Backend::new(kind).and_then(|b| b.memory_pool(MemoryPoolConfig::default())) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("runtime bench: no pool on {kind}: {e}");
            return;
        }
    };
    let shape = [bytes / 4];
    let mut group = c.benchmark_group(format!("alloc_free_{kind}"));
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(2));
    let mut pool_run = || {
        black_box(pooled.empty(&shape, DType::F32).map(|t| t.data_ptr()).ok());
    };
    let mut raw_run = || {
        black_box(raw.empty(&shape, DType::F32).map(|t| t.data_ptr()).ok());
    };
    let mut system_run = || {
        black_box(Vec::<u8>::with_capacity(bytes).as_ptr());
    };
    group.bench_function(BenchmarkId::new("pool", bytes), |b| b.iter(&mut pool_run));
    group.bench_function(BenchmarkId::new("backend", bytes), |b| b.iter(&mut raw_run));
    group.bench_function(BenchmarkId::new("system", bytes), |b| {
        b.iter(&mut system_run)
    });
    group.finish();
    let (p, r, s) = (
        median_per_call(&mut pool_run, 200, 9),
        median_per_call(&mut raw_run, 200, 9),
        median_per_call(&mut system_run, 200, 9),
    );
    println!(
        "alloc+free {bytes} B on {kind}: pool {:.2} µs, backend {:.2} µs ({:.1}x the pool), system {:.2} µs ({:.2}x the pool)",
        p * 1e6,
        r * 1e6,
        r / p,
        s * 1e6,
        s / p
    );
}

/// The benchmarked chain: 25 × (multiply by `w`, tanh) = 50 ops on `len` elements.
fn chain(x: &Tensor, w: &Tensor) -> torsh_backend::Result<Tensor> {
    let mut y = x.clone();
    for _ in 0..25 {
        y = y.mul(w)?.tanh()?;
    }
    Ok(y)
}

/// The chain of 50 ops run eagerly against a captured graph of it, both waited for on the device.
fn graph_replay(c: &mut Criterion, kind: BackendType, len: usize) {
    let Ok(b) = Backend::new(kind) else {
        eprintln!("runtime bench: {kind} unavailable, skipped");
        return;
    };
    let (x, w) = match (b.randn(&[len], DType::F32), b.randn(&[len], DType::F32)) {
        (Ok(x), Ok(w)) => (x, w),
        _ => return,
    };
    let graph = match b.capture_graph(|| chain(&x, &w)) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("runtime bench: capture failed on {kind}: {e}");
            return;
        }
    };
    let inputs = [x.clone(), w.clone()];
    let mut eager_run = || {
        black_box(chain(&x, &w).ok());
        let _ = b.synchronize();
    };
    let mut replay_run = || {
        black_box(b.launch_graph(&graph, &inputs).ok());
        let _ = b.synchronize();
    };
    let mut group = c.benchmark_group(format!("chain50_{kind}"));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(2));
    group.bench_function(BenchmarkId::new("eager", len), |t| t.iter(&mut eager_run));
    group.bench_function(BenchmarkId::new("graph", len), |t| t.iter(&mut replay_run));
    group.finish();
    let (e, g) = (
        median_per_call(&mut eager_run, 10, 9),
        median_per_call(&mut replay_run, 10, 9),
    );
    println!(
        "50-op chain of {len} f32 on {kind}: eager {:.1} µs, graph replay {:.1} µs ({:.2}x faster)",
        e * 1e6,
        g * 1e6,
        e / g
    );
}

/// f32 GEMMs of `shapes` with the backend's default kernels against the autotuner's choices, on one
/// backend instance with tuning switched off and on (two CPU backends would have two thread pools
/// competing for the cores).
fn autotuned_gemm(c: &mut Criterion, kind: BackendType, shapes: &[(usize, usize, usize)]) {
    let Ok(b) = Backend::new(kind) else {
        eprintln!("runtime bench: {kind} unavailable, skipped");
        return;
    };
    let (plain, tuned) = (b.clone(), b.clone());
    let mut group = c.benchmark_group(format!("gemm_autotune_{kind}"));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(2));
    for &(m, k, n) in shapes {
        let (Ok(x), Ok(w)) = (b.randn(&[m, k], DType::F32), b.randn(&[k, n], DType::F32)) else {
            return;
        };
        // The first tuned product tunes the key.
        if b.clone().enable_autotuning(true).matmul(&x, &w).is_err() {
            return;
        }
        let mut plain_run = || {
            let b = plain.clone().enable_autotuning(false);
            black_box(b.matmul(&x, &w).ok());
            let _ = b.synchronize();
        };
        let mut tuned_run = || {
            let b = tuned.clone().enable_autotuning(true);
            black_box(b.matmul(&x, &w).ok());
            let _ = b.synchronize();
        };
        let id = format!("{m}x{k}x{n}");
        group.bench_function(BenchmarkId::new("default", &id), |t| t.iter(&mut plain_run));
        group.bench_function(BenchmarkId::new("autotuned", &id), |t| {
            t.iter(&mut tuned_run)
        });
        let (p, t) = (
            median_per_call(&mut plain_run, 10, 9),
            median_per_call(&mut tuned_run, 10, 9),
        );
        let key = format!("m{}", n); // the column-major problem is n x m: its key starts with m = n
        let chosen = b
            .autotuning_choices()
            .into_iter()
            .filter(|(k, _)| k.contains(&key))
            .map(|(key, choice)| {
                format!(
                    "{key} → {} (tuning saw {:.1} µs; default {:.1} µs)",
                    choice.variant, choice.micros, choice.default_micros
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let flops = 2.0 * (m * k * n) as f64;
        println!(
            "f32 GEMM {id} on {kind}: default {:.1} µs ({:.2} GFLOP/s), autotuned {:.1} µs ({:.2} GFLOP/s), {:.2}x; {chosen}",
            p * 1e6,
            flops / p / 1e9,
            t * 1e6,
            flops / t / 1e9,
            p / t
        );
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    for kind in [BackendType::Cpu, BackendType::WebGpu] {
        for bytes in [4 << 10, 4 << 20] {
            alloc_free(&mut c, kind, bytes);
        }
    }
    for kind in [
        BackendType::Reference,
        BackendType::Cpu,
        BackendType::WebGpu,
    ] {
        graph_replay(&mut c, kind, 1024);
    }
    let around_the_threading_threshold =
        [(48, 48, 48), (96, 96, 96), (128, 128, 128), (256, 16, 256)];
    autotuned_gemm(&mut c, BackendType::Cpu, &around_the_threading_threshold);
    autotuned_gemm(
        &mut c,
        BackendType::WebGpu,
        &[(64, 64, 64), (128, 128, 128), (96, 512, 96)],
    );
    c.final_summary();
}
