//! `torsh-backend bench`: times ops through the public `Backend`/`Tensor` API on one backend, next to
//! the peers measured in the same run, and reports throughput, the ratio to the best peer and the
//! fraction of the machine's measured ceiling.
//!
//! Peers: on CUDA, cuBLAS called directly; on the CPU, for GEMM, OpenBLAS (loaded at run time), the
//! `gemm` crate and `matrixmultiply`, with ours on SIMD off as a baseline, and outside GEMM
//! onnxruntime, in a co-process (`onnxruntime.rs`; "n/a" with the reason where it is not installed).
//! On the CPU every case runs once per thread count (`--threads`, default 1 and all cores), peers at
//! the same count, and the ceilings (FMA peak FLOP/s, copy bandwidth) are measured first for each
//! count. Elsewhere the ceiling is the copy bandwidth of the run's own memcpy case.
//!
//! Timing: one warm-up call, then each repeat runs the op `k` times back to back; the time per op is the
//! repeat's time over `k`, with `k` chosen so that a repeat lasts at least [`TARGET_S`]. On the CPU,
//! ours and the peers of a case are timed interleaved: one repeat of each per round, so that a
//! shared machine's load moves both alike ([`measure_interleaved`]). Where the
//! backend's events time device work (CUDA events; WebGPU timestamp queries) a repeat is timed by
//! events recorded around it (ours on the backend's default stream, cuBLAS on its own stream, the
//! naive WGSL peer on ours); elsewhere by the wall clock up to one `synchronize()`. The median over
//! the repeats is reported with the min and max.

mod cases;
mod ceiling;
mod cublas;
mod fma;
mod gemm_crate;
mod mmul;
mod naive_wgsl;
mod onnxruntime;
mod openblas;
mod peers;
mod plan;
mod plot;
mod prepare;
mod random;
mod report;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use torsh_backend::webgpu::{WebGpuBackend, WebGpuBackendConfig};
use torsh_backend::{Backend, BackendType, DType};

use cases::{Case, Op, Runner, Section, Target};
use ceiling::Ceilings;
use cublas::Cublas;
use peers::{CpuPass, CpuPeers, PeerError, PeerResult, PeerRun};
use plan::Scale;

pub use mmul::{child as peer_child, ChildArgs as PeerChildArgs};

/// Minimum wall time of one repeat, in seconds.
const TARGET_S: f64 = 0.020;
/// The same under `--quick`.
const QUICK_TARGET_S: f64 = 0.002;
/// Most calls in one repeat.
const MAX_K: usize = 1 << 20;

/// The command line of `bench`.
pub struct Options {
    /// `--backend`: the backend to measure (`None`: `Backend::auto()`).
    pub backend: Option<String>,
    /// `--op`: only these ops.
    pub ops: Vec<String>,
    /// `--quick`: tiny sizes, short repeats.
    pub quick: bool,
    /// `--repeats`: repeats per case.
    pub repeats: usize,
    /// `--json`: where to write every figure.
    pub json: Option<PathBuf>,
    /// `--plot`: where to write the SVG chart.
    pub plot: Option<PathBuf>,
    /// `--threads`: CPU thread counts (empty: 1 and all cores).
    pub threads: Vec<usize>,
    /// `--binding-mib`: the WebGPU backend's largest storage binding, in MiB.
    pub binding_mib: Option<u64>,
}

/// Times of one case, per op call, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The median over the repeats.
    pub median: f64,
    /// The fastest repeat.
    pub min: f64,
    /// The slowest repeat.
    pub max: f64,
    /// Calls per repeat.
    pub k: usize,
    /// Repeats measured.
    pub repeats: usize,
}

/// One case as measured.
pub struct Measured {
    /// The case.
    pub case: Case,
    /// The backend instance that ran it (`cpu`, `cuda`, `cuda+tf32`, ...).
    pub backend: String,
    /// The CPU thread count of the pass (`None` elsewhere).
    pub threads: Option<usize>,
    /// Our timing, or our error.
    pub ours: Result<Timing, String>,
    /// The peers measured on the same case, in the same pass.
    pub peers: Vec<PeerResult>,
}

/// Seconds a batch of `k` back-to-back calls of a case takes.
type BatchTimer<'t> = dyn Fn(&mut Runner<'_>, usize) -> Result<f64, String> + 't;

/// Times a batch on the host clock, from before the first call to after `sync` returns.
fn wall_clock(
    sync: &dyn Fn() -> Result<(), String>,
) -> impl Fn(&mut Runner<'_>, usize) -> Result<f64, String> + '_ {
    move |run, k| {
        let start = Instant::now();
        for _ in 0..k {
            run()?;
        }
        sync()?;
        Ok(start.elapsed().as_secs_f64())
    }
}

/// A side of [`measure_interleaved`] timed on the host clock, from before the first of `k` calls of
/// `run` to after `sync` returns.
fn wall_side<'s>(mut run: Runner<'s>, sync: impl Fn() -> Result<(), String> + 's) -> Side<'s> {
    Box::new(move |k| wall_clock(&sync)(&mut run, k))
}

/// Whether `backend`'s events time device work (CUDA; WebGPU with timestamp queries): two events
/// recorded back to back can be timed.
fn events_are_timed(backend: &Backend) -> bool {
    let stream = backend.default_stream();
    match (stream.record_event(), stream.record_event()) {
        (Ok(start), Ok(end)) => start.elapsed_ms(&end).is_ok(),
        _ => false,
    }
}

/// Times a batch with device events recorded on the backend's default stream around it (backends
/// whose events can be timed, see [`events_are_timed`]).
fn device_events(backend: &Backend) -> impl Fn(&mut Runner<'_>, usize) -> Result<f64, String> + '_ {
    move |run, k| {
        let stream = backend.default_stream();
        let start = stream.record_event().map_err(|e| e.to_string())?;
        for _ in 0..k {
            run()?;
        }
        let end = stream.record_event().map_err(|e| e.to_string())?;
        let ms = start.elapsed_ms(&end).map_err(|e| e.to_string())?;
        Ok(f64::from(ms) / 1e3)
    }
}

/// One side of an interleaved measurement: runs a batch of `k` back-to-back calls and returns its
/// seconds.
type Side<'s> = Box<dyn FnMut(usize) -> Result<f64, String> + 's>;

/// Runs `run` after one warm-up call: `repeats` repeats of `k` back-to-back calls, each timed by
/// `time_batch`; `k` grows until one repeat lasts `target` seconds.
fn measure(
    run: &mut Runner<'_>,
    time_batch: &BatchTimer<'_>,
    repeats: usize,
    target: f64,
) -> Result<Timing, String> {
    let side: Side<'_> = Box::new(|k| time_batch(run, k));
    measure_interleaved(vec![side], repeats, target)
        .pop()
        .unwrap_or_else(|| Err("nothing measured".into()))
}

/// Measures several sides of one case (ours and peers) interleaved: each is warmed up and its `k`
/// grown until a repeat lasts `target` seconds (that repeat is its first), then the remaining
/// repeats run round by round, one repeat of each side per round, the side that starts a round
/// rotating. So every side's median comes from the same minutes of a shared machine. A side that
/// fails is left out of later rounds; its result is the error. Returns one result per side, in
/// order.
fn measure_interleaved(
    mut sides: Vec<Side<'_>>,
    repeats: usize,
    target: f64,
) -> Vec<Result<Timing, String>> {
    let mut per_op: Vec<Result<(usize, Vec<f64>), String>> = sides
        .iter_mut()
        .map(|batch| {
            batch(1)?;
            let mut k = 1;
            loop {
                let t = batch(k)?;
                if t >= target || k >= MAX_K {
                    return Ok((k, vec![t / k as f64]));
                }
                let grow = if t > 0.0 {
                    (target * 1.2 / t).ceil()
                } else {
                    100.0
                };
                k = ((k as f64) * grow.clamp(2.0, 100.0)).min(MAX_K as f64) as usize;
            }
        })
        .collect();
    let n = sides.len();
    for round in 1..repeats {
        for i in (0..n).map(|j| (j + round) % n) {
            if let Ok((k, times)) = &mut per_op[i] {
                match sides[i](*k) {
                    Ok(t) => times.push(t / *k as f64),
                    Err(e) => per_op[i] = Err(e),
                }
            }
        }
    }
    per_op
        .into_iter()
        .map(|r| {
            let (k, mut times) = r?;
            times.sort_by(f64::total_cmp);
            let n = times.len();
            let median = if n % 2 == 1 {
                times[n / 2]
            } else {
                (times[n / 2 - 1] + times[n / 2]) / 2.0
            };
            Ok(Timing {
                median,
                min: times[0],
                max: times[n - 1],
                k,
                repeats: n,
            })
        })
        .collect()
}

/// Our side of one case on `backend`.
fn measure_ours(
    case: &Case,
    backend: &Backend,
    repeats: usize,
    target: f64,
) -> Result<Timing, String> {
    let mut run = case.prepare(backend).map_err(|e| e.to_string())?;
    if events_are_timed(backend) {
        return measure(&mut run, &device_events(backend), repeats, target);
    }
    let sync = || backend.synchronize().map_err(|e| e.to_string());
    let timer = wall_clock(&sync);
    measure(&mut run, &timer, repeats, target)
}

/// cuBLAS's side of a GEMM case.
fn measure_cublas(
    case: &Case,
    peer: &Cublas,
    repeats: usize,
    target: f64,
) -> Result<Timing, String> {
    let Op::Matmul { m, n, k } = case.op else {
        return Err("cuBLAS is a peer of GEMM only".into());
    };
    let mut run = peer.gemm(case.dtype, case.target == Target::Tf32, m, n, k)?;
    measure(
        &mut run,
        &|run: &mut Runner<'_>, k| peer.time_batch(run, k),
        repeats,
        target,
    )
}

/// The backend named on the command line, or `Backend::auto()`. Exit code 2 for a name that is no
/// backend, 1 for a backend that cannot run here.
fn choose_backend(name: Option<&str>) -> Result<Backend, ExitCode> {
    let built = match name {
        None => Backend::auto(),
        Some(name) => match BackendType::from_name(name) {
            Some(kind) => Backend::new(kind),
            None => {
                let names: Vec<&str> = std::iter::once(BackendType::Auto)
                    .chain(BackendType::CONCRETE)
                    .map(BackendType::name)
                    .collect();
                eprintln!(
                    "unknown backend `{name}`; backends are: {}",
                    names.join(", ")
                );
                return Err(ExitCode::from(2));
            }
        },
    };
    built.map_err(|e| {
        eprintln!("{e}");
        ExitCode::FAILURE
    })
}

/// The WebGPU backend on the adapter of `backend`, with storage bindings of at most `mib` MiB: exit
/// code 2 when `backend` is not WebGPU, 1 when the lowered backend cannot start.
fn with_binding(backend: &Backend, mib: u64) -> Result<Backend, ExitCode> {
    if backend.backend_type() != BackendType::WebGpu {
        eprintln!(
            "--binding-mib applies to the WebGPU backend only (this run: {})",
            backend.backend_type().name()
        );
        return Err(ExitCode::from(2));
    }
    let config = WebGpuBackendConfig {
        adapter_index: Some(backend.config().device_id),
        max_binding_size: mib.saturating_mul(1 << 20),
        ..WebGpuBackendConfig::default()
    };
    Backend::from_compute(Box::new(WebGpuBackend::new(config))).map_err(|e| {
        eprintln!("{e}");
        ExitCode::FAILURE
    })
}

/// Checks the arguments that need no device: exit code 2 for a bad one.
fn check_options(options: &Options) -> Result<(), ExitCode> {
    if options.repeats == 0 {
        eprintln!("--repeats must be at least 1");
        return Err(ExitCode::from(2));
    }
    if options.threads.contains(&0) {
        eprintln!("--threads takes counts of at least 1");
        return Err(ExitCode::from(2));
    }
    if options.binding_mib == Some(0) {
        eprintln!("--binding-mib takes a size of at least 1 MiB");
        return Err(ExitCode::from(2));
    }
    // Bad names are reported before a device is opened.
    let unknown: Vec<&str> = options
        .ops
        .iter()
        .map(String::as_str)
        .filter(|o| !cases::OP_NAMES.contains(o))
        .collect();
    if !unknown.is_empty() {
        eprintln!(
            "no op named {}; ops are: {}",
            unknown.join(", "),
            cases::OP_NAMES.join(", ")
        );
        return Err(ExitCode::from(2));
    }
    Ok(())
}

/// The thread counts of a CPU run: those asked for, else 1 and all cores; in order, without repeats.
fn thread_counts(asked: &[usize]) -> Vec<usize> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut counts = if asked.is_empty() {
        vec![1, all]
    } else {
        asked.to_vec()
    };
    let mut seen = Vec::new();
    counts.retain(|n| {
        let fresh = !seen.contains(n);
        seen.push(*n);
        fresh
    });
    counts
}

/// One pass over the plan: a backend instance, its thread count (CPU) and its CPU peers.
struct Pass<'p> {
    /// The instance that runs ours.
    backend: Backend,
    /// The CPU thread count.
    threads: Option<usize>,
    /// The CPU peers at this count.
    cpu: Option<CpuPass<'p>>,
}

/// The peers a pass measures next to ours: cuBLAS on CUDA, the GEMM peers on the CPU.
struct Peers {
    /// cuBLAS, when the backend is CUDA and a GEMM case is selected.
    cublas: Option<Result<Cublas, String>>,
    /// The CPU peers, when the backend is the CPU.
    cpu: Option<CpuPeers>,
    /// The naive WGSL matmul, when the backend is WebGPU.
    naive_wgsl: bool,
}

/// What every case of a run shares.
struct Context<'a> {
    /// The command line.
    options: &'a Options,
    /// Minimum seconds of one repeat.
    target: f64,
    /// The backend with TF32 tensor cores (CUDA, when a TF32 case is selected).
    tf32: Option<Result<Backend, String>>,
    /// The progress bar.
    bar: ProgressBar,
}

/// Measures `case` on `pass`, ours and then its peers.
fn run_case(ctx: &Context<'_>, pass: &Pass<'_>, peers: &Peers, case: &Case) -> Measured {
    let (repeats, target, bar) = (ctx.options.repeats, ctx.target, &ctx.bar);
    let label = format!(
        "{} {} {}{}",
        case.name(),
        case.dtype_label(),
        case.shape_label(),
        pass.threads
            .map_or(String::new(), |n| format!(" ({n} thread(s))"))
    );
    bar.set_message(label.clone());
    if let (Some(cpu), Some(pass_peers), Target::Main) = (&peers.cpu, &pass.cpu, case.target) {
        return run_cpu_case(ctx, pass, cpu, pass_peers, case, &label);
    }
    let kind = pass.backend.backend_type();
    let (name, ours) = match case.target {
        Target::Main => (
            kind.name().to_string(),
            measure_ours(case, &pass.backend, repeats, target),
        ),
        Target::Tf32 => (
            "cuda+tf32".to_string(),
            match &ctx.tf32 {
                Some(Ok(b)) => measure_ours(case, b, repeats, target),
                Some(Err(e)) => Err(format!("building the TF32 backend: {e}")),
                None => Err("no TF32 backend".into()),
            },
        ),
    };
    bar.inc(1);
    let mut results = Vec::new();
    if let (Some(p), Section::Gemm) = (&peers.cublas, case.section()) {
        bar.set_message(format!("{label} (cuBLAS)"));
        results.push(PeerResult {
            key: "cuBLAS",
            name: p
                .as_ref()
                .map_or_else(|_| "cuBLAS".to_string(), |c| c.version.clone()),
            baseline: false,
            timing: p
                .as_ref()
                .map_err(|e| PeerError::NotFound(e.clone()))
                .and_then(|c| measure_cublas(case, c, repeats, target).map_err(PeerError::Failed)),
        });
        bar.inc(1);
    }
    if let (true, Op::Matmul { m, n, k }, DType::F32) = (peers.naive_wgsl, case.op, case.dtype) {
        bar.set_message(format!("{label} (naive WGSL)"));
        let sync = || pass.backend.synchronize().map_err(|e| e.to_string());
        let timing = naive_wgsl::prepare(&pass.backend, m, n, k)
            .and_then(|mut run| {
                // The same clock as ours.
                if events_are_timed(&pass.backend) {
                    measure(&mut run, &device_events(&pass.backend), repeats, target)
                } else {
                    measure(&mut run, &wall_clock(&sync), repeats, target)
                }
            })
            .map_err(PeerError::Failed);
        results.push(PeerResult {
            key: "naive WGSL",
            name: naive_wgsl::NAME.into(),
            baseline: false,
            timing,
        });
        bar.inc(1);
    }
    Measured {
        case: *case,
        backend: name,
        threads: pass.threads,
        ours,
        peers: results,
    }
}

/// Measures `case` on a CPU pass: ours and each peer's side interleaved, repeat by repeat (see
/// [`measure_interleaved`]); matrixmultiply, which measures itself in a child process, first.
fn run_cpu_case(
    ctx: &Context<'_>,
    pass: &Pass<'_>,
    cpu: &CpuPeers,
    pass_peers: &CpuPass<'_>,
    case: &Case,
    label: &str,
) -> Measured {
    let (repeats, target, bar) = (ctx.options.repeats, ctx.target, &ctx.bar);
    let backend = &pass.backend;
    let peers = cpu.of(case);
    // Each peer's timing, or the index of its side in `sides` (ours is side 0).
    let mut slots: Vec<Result<Result<Timing, PeerError>, usize>> = Vec::new();
    let mut sides: Vec<Side<'_>> = Vec::new();
    let ours_error = match case.prepare(backend) {
        Ok(run) => {
            sides.push(wall_side(run, || {
                backend.synchronize().map_err(|e| e.to_string())
            }));
            None
        }
        Err(e) => Some(e.to_string()),
    };
    for &peer in &peers {
        bar.set_message(format!("{label} (preparing {})", peer.key()));
        slots.push(match pass_peers.prepare(peer, case, repeats, target) {
            PeerRun::Interleaved(side) => {
                sides.push(side);
                Err(sides.len() - 1)
            }
            PeerRun::Done(timing) => Ok(timing),
        });
    }
    bar.set_message(format!(
        "{label} (ours and {} peer(s))",
        sides.len().saturating_sub(1)
    ));
    let mut timings = measure_interleaved(sides, repeats, target);
    let ours = match ours_error {
        Some(e) => Err(e),
        None => timings[0].clone(),
    };
    let results = peers
        .iter()
        .zip(slots)
        .map(|(&peer, slot)| {
            let timing = match slot {
                Ok(t) => t,
                Err(i) => std::mem::replace(&mut timings[i], Err(String::new()))
                    .map_err(PeerError::Failed),
            };
            pass_peers.result(peer, timing)
        })
        .collect();
    bar.inc(1 + peers.len() as u64);
    Measured {
        case: *case,
        backend: backend.backend_type().name().to_string(),
        threads: pass.threads,
        ours,
        peers: results,
    }
}

/// Runs every selected case on `pass`, section by section, printing each table as it completes, and
/// returns the results with the pass's ceilings.
fn run_pass(
    ctx: &Context<'_>,
    pass: &Pass<'_>,
    peers: &Peers,
    selected: &[Case],
) -> (Vec<Measured>, Ceilings) {
    let mut ceilings = match pass.threads {
        Some(n) => {
            ctx.bar
                .set_message(format!("measuring the ceilings at {n} thread(s)"));
            Ceilings::host(n, ctx.options.quick)
        }
        None => Ceilings::from_memcpy(&[]),
    };
    if pass.threads.is_some() {
        ctx.bar.suspend(|| println!("\n{}", ceilings.line()));
    }
    let mut results: Vec<Measured> = Vec::new();
    for section in Section::ALL {
        let first = results.len();
        for case in selected.iter().filter(|c| c.section() == section) {
            results.push(run_case(ctx, pass, peers, case));
        }
        if pass.threads.is_none() {
            ceilings = Ceilings::from_memcpy(&results);
        }
        if results.len() > first {
            ctx.bar.suspend(|| {
                report::print_section(
                    section,
                    pass.threads,
                    &results[first..],
                    &ceilings,
                    ctx.options.quick,
                )
            });
        }
    }
    (results, ceilings)
}

/// `torsh-backend bench`.
pub fn run(options: Options) -> ExitCode {
    if let Err(code) = check_options(&options) {
        return code;
    }
    // OpenBLAS's core type goes into the environment before any thread starts.
    let maybe_cpu = options
        .backend
        .as_deref()
        .is_none_or(|b| BackendType::from_name(b) == Some(BackendType::Cpu));
    let coretype_note = maybe_cpu.then(openblas::set_coretype).flatten();
    let backend = match choose_backend(options.backend.as_deref()) {
        Ok(b) => b,
        Err(code) => return code,
    };
    let kind = backend.backend_type();
    if kind != BackendType::Cpu && !options.threads.is_empty() {
        eprintln!(
            "--threads applies to the CPU backend only (this run: {})",
            kind.name()
        );
        return ExitCode::from(2);
    }
    let backend = match options.binding_mib {
        None => backend,
        Some(mib) => match with_binding(&backend, mib) {
            Ok(b) => b,
            Err(code) => return code,
        },
    };
    let software = backend
        .device_info()
        .details
        .iter()
        .any(|(k, v)| k == "kind" && v.starts_with("CPU"));
    println!(
        "timing: {}",
        if events_are_timed(&backend) {
            "device events (timestamps recorded on the device around each repeat)"
        } else {
            "wall clock up to synchronize()"
        }
    );
    let scale = Scale::for_backend(kind, options.quick, software);
    let selected = plan::select(plan::plan(kind, scale), &options.ops);
    let target = if options.quick {
        QUICK_TARGET_S
    } else {
        TARGET_S
    };
    let ordinal = backend.config().device_id;
    let tf32 = selected.iter().any(|c| c.target == Target::Tf32).then(|| {
        Backend::cuda()
            .device(ordinal)
            .enable_tensor_cores(true)
            .build()
            .map_err(|e| e.to_string())
    });
    // cuBLAS is reached only when the chosen backend is CUDA: its probe has loaded the driver, NVRTC
    // and cuBLAS, so cudarc finds its libraries.
    let gemm_selected = selected.iter().any(|c| c.section() == Section::Gemm);
    let peers = Peers {
        cublas: (kind == BackendType::Cuda && gemm_selected).then(|| Cublas::new(ordinal)),
        cpu: (kind == BackendType::Cpu).then(|| {
            let outside_gemm = selected.iter().any(|c| c.section() != Section::Gemm);
            CpuPeers::start(coretype_note, outside_gemm)
        }),
        naive_wgsl: kind == BackendType::WebGpu,
    };
    let counts = match kind {
        BackendType::Cpu => thread_counts(&options.threads),
        _ => Vec::new(),
    };
    let run_info = report::RunInfo::new(&backend, &options, target, &peers, &counts);
    report::print_header(&run_info);

    let passes: Vec<Pass<'_>> = if kind == BackendType::Cpu {
        let mut passes = Vec::new();
        for &n in &counts {
            match Backend::cpu().num_threads(n).build() {
                Ok(b) => passes.push(Pass {
                    backend: b,
                    threads: Some(n),
                    cpu: peers.cpu.as_ref().map(|p| p.pass(n)),
                }),
                Err(e) => {
                    eprintln!("building the CPU backend with {n} thread(s): {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        passes
    } else {
        vec![Pass {
            backend,
            threads: None,
            cpu: None,
        }]
    };
    let per_pass: usize = selected
        .iter()
        .map(|c| {
            1 + usize::from(peers.cublas.is_some() && c.section() == Section::Gemm)
                + usize::from(
                    peers.naive_wgsl && matches!(c.op, Op::Matmul { .. }) && c.dtype == DType::F32,
                )
                + peers.cpu.as_ref().map_or(0, |p| p.of(c).len())
        })
        .sum();
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new((per_pass * passes.len()) as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let ctx = Context {
        options: &options,
        target,
        tf32,
        bar,
    };
    let mut results: Vec<Measured> = Vec::new();
    let mut ceilings = Vec::new();
    for pass in &passes {
        let (r, c) = run_pass(&ctx, pass, &peers, &selected);
        results.extend(r);
        ceilings.push(c);
    }
    ctx.bar.finish_and_clear();
    report::print_footer(&results);
    write_outputs(&options, &run_info, &results, &ceilings)
}

/// Writes the JSON and the chart asked for; exit code 1 if one cannot be written.
fn write_outputs(
    options: &Options,
    run_info: &report::RunInfo,
    results: &[Measured],
    ceilings: &[Ceilings],
) -> ExitCode {
    let mut code = ExitCode::SUCCESS;
    if let Some(path) = &options.json {
        let doc = report::json_doc(run_info, results, ceilings);
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        match std::fs::write(path, text + "\n") {
            Ok(()) => println!("results written to {}", path.display()),
            Err(e) => {
                eprintln!("writing {}: {e}", path.display());
                code = ExitCode::FAILURE;
            }
        }
    }
    if let Some(path) = &options.plot {
        let svg = plot::svg(&run_info.title(), results, ceilings);
        match std::fs::write(path, svg) {
            Ok(()) => println!("chart written to {}", path.display()),
            Err(e) => {
                eprintln!("writing {}: {e}", path.display());
                code = ExitCode::FAILURE;
            }
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_reports_median_min_max_per_call() {
        let mut calls = 0usize;
        let mut run: Runner<'_> = Box::new(|| {
            calls += 1;
            Ok(())
        });
        // A simulated clock, so the test does not depend on the machine's load: every call takes
        // 200 µs, each batch 1 % longer per call than the one before.
        let batches = std::cell::Cell::new(0u32);
        let timer = |run: &mut Runner<'_>, k: usize| {
            for _ in 0..k {
                run()?;
            }
            batches.set(batches.get() + 1);
            Ok(k as f64 * 200e-6 * (1.0 + 0.01 * batches.get() as f64))
        };
        let t = measure(&mut run, &timer, 3, 0.002).unwrap();
        drop(run);
        assert_eq!(t.repeats, 3);
        assert!(t.k >= 2, "{t:?}");
        assert!(
            t.k as f64 * t.min >= 0.002,
            "a repeat lasts the target: {t:?}"
        );
        assert!(t.min < t.median && t.median < t.max, "{t:?}");
        assert!(t.median > 200e-6 && t.median < 210e-6, "{t:?}");
        assert_eq!(calls, 2 + 3 * t.k, "warm-up, calibration, then the repeats");
    }

    #[test]
    fn measure_interleaved_takes_one_repeat_of_each_side_per_round() {
        use std::cell::RefCell;
        // Simulated clocks: side 0 takes 100 µs a call, side 1 300 µs; side 2 fails on its fourth
        // batch (after the warm-up and two calibration batches: its first repeat of the rounds).
        let log = RefCell::new(Vec::new());
        let batches = RefCell::new([0usize; 3]);
        let side = |i: usize, per_call: f64| -> Side<'_> {
            let (log, batches) = (&log, &batches);
            Box::new(move |k| {
                let n = {
                    let mut b = batches.borrow_mut();
                    b[i] += 1;
                    b[i]
                };
                log.borrow_mut().push((i, k));
                if i == 2 && n == 4 {
                    return Err("lost the device".into());
                }
                Ok(k as f64 * per_call)
            })
        };
        let sides = vec![side(0, 100e-6), side(1, 300e-6), side(2, 200e-6)];
        let timings = measure_interleaved(sides, 4, 0.001);
        let t0 = timings[0].as_ref().unwrap();
        let t1 = timings[1].as_ref().unwrap();
        assert_eq!((t0.repeats, t1.repeats), (4, 4));
        assert!((t0.median - 100e-6).abs() < 1e-12 && (t1.median - 300e-6).abs() < 1e-12);
        assert!(t0.k as f64 * 100e-6 >= 0.001 && t1.k as f64 * 300e-6 >= 0.001);
        assert_eq!(timings[2], Err("lost the device".to_string()));
        // After each side's warm-up and calibration, the rounds rotate who goes first; the failed
        // side is left out once it has failed.
        let log = log.into_inner();
        let rounds: Vec<usize> = log
            .iter()
            .skip_while(|&&(i, _)| i != 2)
            .skip_while(|&&(i, _)| i == 2)
            .map(|&(i, _)| i)
            .collect();
        assert_eq!(rounds, vec![1, 2, 0, 0, 1, 0, 1]);
    }

    #[test]
    fn measure_passes_errors_on() {
        let mut run: Runner<'_> = Box::new(|| Err("out of memory".into()));
        assert_eq!(
            measure(&mut run, &wall_clock(&|| Ok(())), 3, 0.001),
            Err("out of memory".to_string())
        );
    }
}
