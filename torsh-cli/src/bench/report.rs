//! The tables and the JSON document of `bench`.

use serde_json::{json, Value};
use torsh_backend::Backend;

use super::cases::{Case, MemOp, Op, Section, Work};
use super::cublas::Cublas;
use super::{Measured, Options, Timing};

/// What the run was: printed as the header and written to the JSON.
pub struct RunInfo {
    backend: String,
    device: Value,
    device_line: String,
    quick: bool,
    repeats: usize,
    target_s: f64,
    peers: Vec<String>,
    peers_line: String,
    commit: Option<String>,
}

impl RunInfo {
    pub fn new(
        backend: &Backend,
        options: &Options,
        target_s: f64,
        peer: Option<&Result<Cublas, String>>,
    ) -> RunInfo {
        let info = backend.device_info();
        let details: Vec<String> = info
            .details
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let (peers, peers_line) = match peer {
            Some(Ok(c)) => (
                vec![c.version.clone()],
                format!("peers: {} called directly (GEMM)", c.version),
            ),
            Some(Err(e)) => (
                Vec::new(),
                format!("peers: cuBLAS could not be started: {e}"),
            ),
            None if backend.backend_type() == torsh_backend::BackendType::Cuda => (
                Vec::new(),
                "peers: cuBLAS (GEMM only; no GEMM selected)".into(),
            ),
            None => (Vec::new(), "peers: none yet on this backend".into()),
        };
        RunInfo {
            backend: backend.backend_type().name().to_string(),
            device: json!({
                "name": info.name(),
                "api": info.api,
                "memory_bytes": info.memory_bytes,
                "details": info.details.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
            }),
            device_line: format!(
                "{} — {} — {:.2} GiB{}",
                info.name(),
                info.api,
                info.memory_gb(),
                if details.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", details.join(", "))
                }
            ),
            quick: options.quick,
            repeats: options.repeats,
            target_s,
            peers,
            peers_line,
            commit: ["TORSH_COMMIT", "GITHUB_SHA"]
                .iter()
                .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty())),
        }
    }
}

fn build_kind() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

pub fn print_header(run: &RunInfo) {
    println!(
        "torsh-backend bench on {}: {}",
        run.backend, run.device_line
    );
    println!(
        "{} build{}; median of {} repeats, each at least {} ms of back-to-back calls",
        build_kind(),
        if cfg!(debug_assertions) {
            " (figures not representative: use --release)"
        } else {
            ""
        },
        run.repeats,
        run.target_s * 1e3
    );
    if std::env::var("TORSH_POISON").is_ok_and(|v| v == "1") {
        println!(
            "TORSH_POISON=1: fresh CUDA allocations are filled first, so figures are pessimistic"
        );
    }
    println!("{}", run.peers_line);
}

/// Copy bandwidth in GB/s: the first memcpy case that ran.
pub fn ceiling_gbps(results: &[Measured]) -> Option<f64> {
    results.iter().find_map(|r| match (r.case.op, &r.ours) {
        (
            Op::Memory {
                op: MemOp::Memcpy, ..
            },
            Ok(t),
        ) => Some(rate(r.case.work(), t.median)),
        _ => None,
    })
}

/// GFLOP/s or GB/s at `seconds` per call.
fn rate(work: Work, seconds: f64) -> f64 {
    match work {
        Work::Flops(x) | Work::Bytes(x) => x / seconds / 1e9,
    }
}

fn unit(work: Work) -> &'static str {
    match work {
        Work::Flops(_) => "GFLOP/s",
        Work::Bytes(_) => "GB/s",
    }
}

fn fmt_rate(work: Work, seconds: f64) -> String {
    let r = rate(work, seconds);
    match work {
        Work::Flops(_) if r >= 1000.0 => format!("{:.2} TFLOP/s", r / 1000.0),
        Work::Flops(_) => format!("{r:.2} GFLOP/s"),
        Work::Bytes(_) => format!("{r:.2} GB/s"),
    }
}

fn fmt_time(s: f64) -> String {
    if s < 1e-6 {
        format!("{:.1} ns", s * 1e9)
    } else if s < 1e-3 {
        format!("{:.2} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// ours/peer as a throughput ratio (above 1: we are faster).
fn peer_ratio(r: &Measured) -> Option<f64> {
    match (&r.ours, r.peer.as_ref().map(|p| &p.timing)) {
        (Ok(ours), Some(Ok(peer))) => Some(peer.median / ours.median),
        _ => None,
    }
}

fn ceiling_fraction(r: &Measured, ceiling: Option<f64>) -> Option<f64> {
    match (r.case.work(), &r.ours, ceiling) {
        (w @ Work::Bytes(_), Ok(t), Some(c)) if c > 0.0 => Some(rate(w, t.median) / c),
        _ => None,
    }
}

const DASH: &str = "-";

pub fn print_section(section: Section, results: &[Measured], ceiling: Option<f64>) {
    println!("\n{}", section.title());
    println!(
        "{:<10} {:<5} {:<25} {:>10} {:>23} {:>14} {:>14} {:>9} {:>8}",
        "op",
        "dtype",
        "shape",
        "median",
        "min .. max",
        "throughput",
        "peer",
        "ours/peer",
        "of ceil"
    );
    for r in results {
        let c = &r.case;
        let head = format!(
            "{:<10} {:<5} {:<25}",
            c.name(),
            c.dtype_label(),
            c.shape_label()
        );
        let t = match &r.ours {
            Ok(t) => t,
            Err(e) => {
                println!("{head} error: {e}");
                continue;
            }
        };
        let work = c.work();
        let peer = match r.peer.as_ref().map(|p| &p.timing) {
            Some(Ok(p)) => fmt_rate(work, p.median),
            Some(Err(_)) => "error".into(),
            None => DASH.into(),
        };
        println!(
            "{head} {:>10} {:>23} {:>14} {:>14} {:>9} {:>8}",
            fmt_time(t.median),
            format!("{} .. {}", fmt_time(t.min), fmt_time(t.max)),
            fmt_rate(work, t.median),
            peer,
            peer_ratio(r).map_or(DASH.into(), |x| format!("{x:.2}x")),
            ceiling_fraction(r, ceiling).map_or(DASH.into(), |x| format!("{:.0}%", x * 100.0)),
        );
        if let Some(Err(e)) = r.peer.as_ref().map(|p| &p.timing) {
            println!("{:<10} peer error: {e}", "");
        }
    }
}

pub fn print_footer(results: &[Measured]) {
    let failed = results.iter().filter(|r| r.ours.is_err()).count();
    println!(
        "\n{} cases, {} measured, {failed} failed",
        results.len(),
        results.len() - failed
    );
}

fn timing_json(t: &Timing, work: Work) -> Value {
    json!({
        "median_s": t.median,
        "min_s": t.min,
        "max_s": t.max,
        "calls_per_repeat": t.k,
        "repeats": t.repeats,
        "throughput": rate(work, t.median),
    })
}

fn case_json(r: &Measured, ceiling: Option<f64>) -> Value {
    let c: &Case = &r.case;
    let work = c.work();
    let (flops, bytes) = match work {
        Work::Flops(x) => (Some(x), None),
        Work::Bytes(x) => (None, Some(x)),
    };
    let mut row = json!({
        "section": c.section().key(),
        "op": c.name(),
        "dtype": c.dtype.name(),
        "variant": c.variant(),
        "shape": c.shape_label(),
        "dims": c.dims_json(),
        "backend": r.backend,
        "flops": flops,
        "bytes": bytes,
        "unit": unit(work),
        "peer": r.peer.as_ref().map(|p| match &p.timing {
            Ok(t) => {
                let mut v = timing_json(t, work);
                v["name"] = json!(p.name);
                v
            }
            Err(e) => json!({"name": p.name, "error": e}),
        }),
        "ours_over_peer": peer_ratio(r),
        "fraction_of_ceiling": ceiling_fraction(r, ceiling),
        "error": r.ours.as_ref().err(),
    });
    if let Ok(t) = &r.ours {
        if let (Value::Object(row), Value::Object(t)) = (&mut row, timing_json(t, work)) {
            row.extend(t);
        }
    }
    row
}

pub fn json_doc(run: &RunInfo, results: &[Measured]) -> Value {
    let ceiling = ceiling_gbps(results);
    json!({
        "tool": "torsh-backend bench",
        "version": env!("CARGO_PKG_VERSION"),
        "commit": run.commit,
        "build": build_kind(),
        "backend": run.backend,
        "device": run.device,
        "quick": run.quick,
        "repeats": run.repeats,
        "min_repeat_s": run.target_s,
        "peers": run.peers,
        "ceiling": {
            "copy_gbps": ceiling,
            "how": "ComputeBackend::copy_dtod of a dense f32 buffer; bytes read + written",
        },
        "throughput_units": {"flops": "GFLOP/s", "bytes": "GB/s (1e9 bytes)"},
        "results": results.iter().map(|r| case_json(r, ceiling)).collect::<Vec<_>>(),
    })
}
