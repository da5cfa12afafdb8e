//! `torsh-backend bench`: times ops through the public `Backend`/`Tensor` API on one backend, next to
//! the peers measured in the same run (CUDA: cuBLAS called directly), and reports throughput, the
//! ratio to the peer and the fraction of the measured copy bandwidth.
//!
//! Timing: one warm-up call, then each repeat runs the op `k` times back to back; the time per op is the
//! repeat's time over `k`, with `k` chosen so that a repeat lasts at least [`TARGET_S`]. On CUDA a repeat
//! is timed by device events recorded around it (ours on the backend's default stream, cuBLAS on its
//! own stream); elsewhere by the wall clock up to one `synchronize()`. The median over the repeats is
//! reported with the min and max.

mod cases;
mod cublas;
mod report;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use torsh_backend::{Backend, BackendType};

use cases::{Case, Op, Runner, Scale, Section, Target};
use cublas::Cublas;

/// Minimum wall time of one repeat, in seconds.
const TARGET_S: f64 = 0.020;
/// The same under `--quick`.
const QUICK_TARGET_S: f64 = 0.002;
/// Most calls in one repeat.
const MAX_K: usize = 1 << 20;

/// The command line of `bench`.
pub struct Options {
    pub backend: Option<String>,
    pub ops: Vec<String>,
    pub quick: bool,
    pub repeats: usize,
    pub json: Option<PathBuf>,
}

/// Times of one case, per op call, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Calls per repeat.
    pub k: usize,
    pub repeats: usize,
}

/// A peer's measurement of the same case.
pub struct PeerResult {
    pub name: String,
    pub timing: Result<Timing, String>,
}

/// One case as measured.
pub struct Measured {
    pub case: Case,
    /// The backend instance that ran it (`cpu`, `cuda`, `cuda+tf32`, ...).
    pub backend: String,
    pub ours: Result<Timing, String>,
    pub peer: Option<PeerResult>,
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

/// Times a batch with device events recorded on the backend's default stream around it (backends
/// whose events can be timed: CUDA).
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

/// Runs `run` after one warm-up call: `repeats` repeats of `k` back-to-back calls, each timed by
/// `time_batch`; `k` grows until one repeat lasts `target` seconds.
fn measure(
    run: &mut Runner<'_>,
    time_batch: &BatchTimer<'_>,
    repeats: usize,
    target: f64,
) -> Result<Timing, String> {
    time_batch(run, 1)?;
    let mut batch = |k: usize| time_batch(run, k);
    let mut k = 1;
    let mut per_op = Vec::with_capacity(repeats);
    // Grow k until one repeat lasts `target`; that repeat is the first measured one.
    loop {
        let t = batch(k)?;
        if t >= target || k >= MAX_K {
            per_op.push(t / k as f64);
            break;
        }
        let grow = if t > 0.0 {
            (target * 1.2 / t).ceil()
        } else {
            100.0
        };
        k = ((k as f64) * grow.clamp(2.0, 100.0)).min(MAX_K as f64) as usize;
    }
    while per_op.len() < repeats {
        per_op.push(batch(k)? / k as f64);
    }
    per_op.sort_by(f64::total_cmp);
    let n = per_op.len();
    let median = if n % 2 == 1 {
        per_op[n / 2]
    } else {
        (per_op[n / 2 - 1] + per_op[n / 2]) / 2.0
    };
    Ok(Timing {
        median,
        min: per_op[0],
        max: per_op[n - 1],
        k,
        repeats: n,
    })
}

/// Our side of one case on `backend`.
fn measure_ours(
    case: &Case,
    backend: &Backend,
    repeats: usize,
    target: f64,
) -> Result<Timing, String> {
    let mut run = case.prepare(backend).map_err(|e| e.to_string())?;
    if backend.backend_type() == BackendType::Cuda {
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

/// `torsh-backend bench`.
pub fn run(options: Options) -> ExitCode {
    if options.repeats == 0 {
        eprintln!("--repeats must be at least 1");
        return ExitCode::from(2);
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
        return ExitCode::from(2);
    }
    let backend = match choose_backend(options.backend.as_deref()) {
        Ok(b) => b,
        Err(code) => return code,
    };
    let kind = backend.backend_type();
    let scale = Scale::for_backend(kind, options.quick);
    let selected = cases::select(cases::plan(kind, scale), &options.ops);
    let target = if options.quick {
        QUICK_TARGET_S
    } else {
        TARGET_S
    };
    let ordinal = backend.config().device_id;
    let tf32: Option<Result<Backend, String>> =
        selected.iter().any(|c| c.target == Target::Tf32).then(|| {
            Backend::cuda()
                .device(ordinal)
                .enable_tensor_cores(true)
                .build()
                .map_err(|e| e.to_string())
        });
    // cuBLAS is reached only when the chosen backend is CUDA: its probe has loaded the driver, NVRTC
    // and cuBLAS, so cudarc finds its libraries.
    let peer: Option<Result<Cublas, String>> = (kind == BackendType::Cuda
        && selected.iter().any(|c| c.section() == Section::Gemm))
    .then(|| Cublas::new(ordinal));
    let run_info = report::RunInfo::new(&backend, &options, target, peer.as_ref());
    report::print_header(&run_info);

    let peer_runs = selected
        .iter()
        .filter(|c| peer.is_some() && c.section() == Section::Gemm)
        .count();
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new((selected.len() + peer_runs) as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );

    let mut results: Vec<Measured> = Vec::new();
    for section in Section::ALL {
        let first = results.len();
        for case in selected.iter().filter(|c| c.section() == section) {
            let label = format!(
                "{} {} {}",
                case.name(),
                case.dtype_label(),
                case.shape_label()
            );
            bar.set_message(label.clone());
            let (name, ours) = match case.target {
                Target::Main => (
                    kind.name().to_string(),
                    measure_ours(case, &backend, options.repeats, target),
                ),
                Target::Tf32 => (
                    "cuda+tf32".to_string(),
                    match &tf32 {
                        Some(Ok(b)) => measure_ours(case, b, options.repeats, target),
                        Some(Err(e)) => Err(format!("building the TF32 backend: {e}")),
                        None => Err("no TF32 backend".into()),
                    },
                ),
            };
            bar.inc(1);
            let peer_result = match &peer {
                Some(p) if section == Section::Gemm => {
                    bar.set_message(format!("{label} (cuBLAS)"));
                    let result = PeerResult {
                        name: p
                            .as_ref()
                            .map_or_else(|_| "cuBLAS".to_string(), |c| c.version.clone()),
                        timing: p
                            .as_ref()
                            .map_err(Clone::clone)
                            .and_then(|c| measure_cublas(case, c, options.repeats, target)),
                    };
                    bar.inc(1);
                    Some(result)
                }
                _ => None,
            };
            results.push(Measured {
                case: *case,
                backend: name,
                ours,
                peer: peer_result,
            });
        }
        if results.len() > first {
            let ceiling = report::ceiling_gbps(&results);
            bar.suspend(|| report::print_section(section, &results[first..], ceiling));
        }
    }
    bar.finish_and_clear();
    report::print_footer(&results);

    if let Some(path) = &options.json {
        let doc = report::json_doc(&run_info, &results);
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("results written to {}", path.display());
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_reports_median_min_max_per_call() {
        let mut calls = 0usize;
        let mut run: Runner<'_> = Box::new(|| {
            calls += 1;
            std::thread::sleep(std::time::Duration::from_micros(200));
            Ok(())
        });
        let t = measure(&mut run, &wall_clock(&|| Ok(())), 3, 0.002).unwrap();
        drop(run);
        assert_eq!(t.repeats, 3);
        assert!(t.k >= 2, "{t:?}");
        assert!(t.min <= t.median && t.median <= t.max);
        assert!(t.median >= 200e-6 && t.median < 0.01, "{t:?}");
        assert!(calls > 3 * t.k);
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
