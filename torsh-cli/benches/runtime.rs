//! `cargo bench -p torsh-cli --bench runtime`: the runtime services against what they replace, side by
//! side in one run: allocating and freeing a tensor through the caching memory pool, through the
//! backend's own allocator, and a host buffer from the system allocator, at 4 KiB and 4 MiB, on the CPU
//! backend and (where an adapter exists) on WebGPU; and a chain of 50 small elementwise ops run
//! eagerly against the same chain captured once and replayed with `launch_graph`, on the reference,
//! CPU and WebGPU backends; and GEMMs and convolutions of sizes where the default kernel choice is in
//! doubt, with the autotuner off and on (CPU: calling thread or pool; WebGPU GEMM: 64- or 32-wide
//! tiles). After the runs, the medians and the ratios are printed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use torsh_backend::{Backend, BackendType, ConvConfig, DType, MemoryPoolConfig, Tensor};

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

/// A run of one op on a backend, on inputs made once; `None` when it fails.
type Run = Box<dyn Fn(&Backend) -> Option<Tensor>>;

/// One op of the autotune benchmark on a backend: its label, its flops, a piece of its tuning key
/// (to report the choice), and a run of it on inputs made once.
struct TunedCase {
    label: String,
    flops: f64,
    key: String,
    run: Run,
}

/// f32 GEMMs of `shapes` (m, k, n) on `b`.
fn gemm_cases(b: &Backend, shapes: &[(usize, usize, usize)]) -> Vec<TunedCase> {
    shapes
        .iter()
        .filter_map(|&(m, k, n)| {
            let (x, w) = (
                b.randn(&[m, k], DType::F32).ok()?,
                b.randn(&[k, n], DType::F32).ok()?,
            );
            Some(TunedCase {
                label: format!("GEMM {m}x{k}x{n}"),
                flops: 2.0 * (m * k * n) as f64,
                // The column-major problem is n x m: its key starts with m = n.
                key: format!("gemm/f32/m{n}"),
                run: Box::new(move |be: &Backend| be.matmul(&x, &w).ok()),
            })
        })
        .collect()
}

/// f32 convolutions of `layers` (n, c, hw, k, r; padding r / 2, bias) on `b`.
fn conv_cases(b: &Backend, layers: &[(usize, usize, usize, usize, usize)]) -> Vec<TunedCase> {
    layers
        .iter()
        .filter_map(|&(n, c, hw, k, r)| {
            let x = b.randn(&[n, c, hw, hw], DType::F32).ok()?;
            let w = b.randn(&[k, c, r, r], DType::F32).ok()?;
            let bias = b.randn(&[k], DType::F32).ok()?;
            let config = ConvConfig {
                padding: [r / 2, r / 2],
                ..ConvConfig::default()
            };
            Some(TunedCase {
                label: format!("conv2d N{n} C{c} {hw}x{hw} K{k} {r}x{r}"),
                flops: 2.0 * (n * k * hw * hw * c * r * r) as f64,
                key: "conv2d/f32/".into(),
                run: Box::new(move |be: &Backend| {
                    be.conv2d_with_bias(&x, &w, Some(&bias), config).ok()
                }),
            })
        })
        .collect()
}

/// Each case with the backend's default kernels against the autotuner's choices, on one backend
/// instance with tuning switched off and on (two CPU backends would have two thread pools competing
/// for the cores).
fn autotuned(c: &mut Criterion, b: &Backend, name: &str, cases: Vec<TunedCase>) {
    let kind = b.backend_type();
    let (plain, tuned) = (b.clone(), b.clone());
    let mut group = c.benchmark_group(format!("{name}_autotune_{kind}"));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(2));
    for case in cases {
        // The first tuned run tunes the key.
        let before: Vec<String> = b.autotuning_choices().into_iter().map(|(k, _)| k).collect();
        if (case.run)(&b.clone().enable_autotuning(true)).is_none() {
            return;
        }
        let new_choices = || {
            b.autotuning_choices()
                .into_iter()
                .filter(|(k, _)| k.starts_with(&case.key) && !before.contains(k))
                .collect::<Vec<_>>()
        };
        let first = new_choices();
        let stats_before = b.autotuning_stats();
        let mut plain_run = || {
            let b = plain.clone().enable_autotuning(false);
            black_box((case.run)(&b));
            let _ = b.synchronize();
        };
        let mut tuned_run = || {
            let b = tuned.clone().enable_autotuning(true);
            black_box((case.run)(&b));
            let _ = b.synchronize();
        };
        group.bench_function(BenchmarkId::new("default", &case.label), |t| {
            t.iter(&mut plain_run)
        });
        group.bench_function(BenchmarkId::new("autotuned", &case.label), |t| {
            t.iter(&mut tuned_run)
        });
        let (p, t) = (
            median_per_call(&mut plain_run, 10, 9),
            median_per_call(&mut tuned_run, 10, 9),
        );
        let stats = b.autotuning_stats();
        let chosen = new_choices()
            .into_iter()
            .map(|(key, choice)| {
                let tuned_first = first
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, c)| c.variant.as_str())
                    .unwrap_or("?");
                format!(
                    "{key} → {tuned_first} when tuned, {} after {} revisits ({} changed it; last \
                     saw {:.1} µs, default {:.1} µs)",
                    choice.variant,
                    stats.revisits - stats_before.revisits,
                    stats.revised - stats_before.revised,
                    choice.micros,
                    choice.default_micros
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "f32 {} on {kind}: default {:.1} µs ({:.2} GFLOP/s), autotuned {:.1} µs ({:.2} GFLOP/s), {:.2}x; {chosen}",
            case.label,
            p * 1e6,
            case.flops / p / 1e9,
            t * 1e6,
            case.flops / t / 1e9,
            p / t
        );
    }
    group.finish();
}

/// The autotune benchmark on `kind`: `gemms` and `convs` (skipped when the backend is unavailable).
fn autotuned_on(
    c: &mut Criterion,
    kind: BackendType,
    gemms: &[(usize, usize, usize)],
    convs: &[(usize, usize, usize, usize, usize)],
) {
    let Ok(b) = Backend::new(kind) else {
        eprintln!("runtime bench: {kind} unavailable, skipped");
        return;
    };
    let cases = gemm_cases(&b, gemms);
    autotuned(c, &b, "gemm", cases);
    let cases = conv_cases(&b, convs);
    autotuned(c, &b, "conv2d", cases);
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
    // Convolutions around the CPU's pool threshold: a small early layer, mid-size 3x3 and 1x1.
    let layers = [
        (1, 16, 28, 16, 3),
        (1, 32, 14, 32, 3),
        (1, 64, 14, 64, 1),
        (1, 64, 28, 64, 3),
    ];
    autotuned_on(
        &mut c,
        BackendType::Cpu,
        &around_the_threading_threshold,
        &layers,
    );
    autotuned_on(
        &mut c,
        BackendType::WebGpu,
        &[(64, 64, 64), (128, 128, 128), (96, 512, 96)],
        &[],
    );
    c.final_summary();
}
