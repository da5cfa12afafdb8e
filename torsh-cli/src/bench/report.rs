//! The tables and the JSON document of `bench`.

use serde_json::{json, Value};
use torsh_backend::{Backend, BackendType};

use super::cases::{Case, Section, Work};
use super::ceiling::{CeilingKind, Ceilings};
use super::peers::{PeerError, PeerResult};
use super::{Measured, Options, Peers, Timing};

/// What the run was: printed as the header and written to the JSON.
pub struct RunInfo {
    /// The backend kind's name.
    backend: String,
    /// The device as JSON.
    device: Value,
    /// The device in one line.
    device_line: String,
    /// `--quick`.
    quick: bool,
    /// `--repeats`.
    repeats: usize,
    /// Minimum seconds of one repeat.
    target_s: f64,
    /// The CPU thread counts (empty elsewhere).
    threads: Vec<usize>,
    /// The peers that are here, by full name.
    peers: Vec<String>,
    /// The header lines about the peers.
    peers_lines: Vec<String>,
    /// What the run set in its own environment.
    notes: Vec<String>,
    /// `TORSH_COMMIT` or `GITHUB_SHA`.
    commit: Option<String>,
    /// `--binding-mib`: the WebGPU storage bindings, lowered.
    binding_mib: Option<u64>,
}

impl RunInfo {
    /// Describes the run on `backend` with `peers` at the CPU thread counts `threads`.
    pub fn new(
        backend: &Backend,
        options: &Options,
        target_s: f64,
        peers: &Peers,
        threads: &[usize],
    ) -> RunInfo {
        let info = backend.device_info();
        let details: Vec<String> = info
            .details
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let (names, lines) = match (&peers.cublas, &peers.cpu) {
            (_, Some(cpu)) => (cpu.names(), cpu.lines()),
            (Some(Ok(c)), _) => (
                vec![c.version.clone()],
                vec![format!("peers: {} called directly (GEMM)", c.version)],
            ),
            (Some(Err(e)), _) => (
                Vec::new(),
                vec![format!("peers: cuBLAS could not be started: {e}")],
            ),
            (None, None) if backend.backend_type() == BackendType::Cuda => (
                Vec::new(),
                vec!["peers: cuBLAS (GEMM only; no GEMM selected)".into()],
            ),
            (None, None) if peers.naive_wgsl => (
                vec![super::naive_wgsl::NAME.to_string()],
                vec![format!(
                    "peers: {} (GEMM f32), on the same device",
                    super::naive_wgsl::NAME
                )],
            ),
            (None, None) => (Vec::new(), vec!["peers: none yet on this backend".into()]),
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
            threads: threads.to_vec(),
            peers: names,
            peers_lines: lines,
            notes: peers
                .cpu
                .as_ref()
                .map_or_else(Vec::new, |c| c.notes.clone()),
            binding_mib: options.binding_mib,
            commit: ["TORSH_COMMIT", "GITHUB_SHA"]
                .iter()
                .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty())),
        }
    }

    /// The chart's title: backend, device name and build.
    pub fn title(&self) -> String {
        format!(
            "torsh-backend bench on {}: {} ({} build{})",
            self.backend,
            self.device["name"].as_str().unwrap_or("?"),
            build_kind(),
            if self.quick { ", --quick" } else { "" }
        )
    }
}

/// `debug` or `release`.
fn build_kind() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Prints what the run is, before the tables.
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
    if !run.threads.is_empty() {
        let counts: Vec<String> = run.threads.iter().map(ToString::to_string).collect();
        println!(
            "threads: {} (each case runs at each count, its peers at the same count)",
            counts.join(", ")
        );
    }
    if std::env::var("TORSH_POISON").is_ok_and(|v| v == "1") {
        println!(
            "TORSH_POISON=1: fresh CUDA allocations are filled first, so figures are pessimistic"
        );
    }
    for line in &run.peers_lines {
        println!("{line}");
    }
    if let Some(mib) = run.binding_mib {
        println!(
            "storage bindings lowered to {mib} MiB (--binding-mib): ops over larger tensors run \
             in pieces or in two passes"
        );
    }
}

/// Formats a throughput in the section's unit, to about four significant digits.
fn fmt_number(x: f64) -> String {
    if x >= 1000.0 {
        format!("{x:.0}")
    } else if x >= 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Formats seconds with a unit that keeps three or four digits.
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

/// The fastest peer that was measured (baselines left out).
pub fn best_peer(r: &Measured) -> Option<(&PeerResult, &Timing)> {
    r.peers
        .iter()
        .filter(|p| !p.baseline)
        .filter_map(|p| p.timing.as_ref().ok().map(|t| (p, t)))
        .min_by(|a, b| a.1.median.total_cmp(&b.1.median))
}

/// ours / best peer as a throughput ratio (above 1: we are faster).
fn best_ratio(r: &Measured) -> Option<f64> {
    match (&r.ours, best_peer(r)) {
        (Ok(ours), Some((_, peer))) => Some(peer.median / ours.median),
        _ => None,
    }
}

/// The ceilings of the pass that measured `r`.
pub fn ceilings_of<'c>(r: &Measured, ceilings: &'c [Ceilings]) -> Option<&'c Ceilings> {
    ceilings.iter().find(|c| c.threads == r.threads)
}

/// Our throughput as a fraction of the row's ceiling, with the ceiling's kind.
fn ceiling_fraction(r: &Measured, ceilings: Option<&Ceilings>) -> Option<(CeilingKind, f64)> {
    let (kind, value) = ceilings?.for_case(&r.case)?;
    let t = r.ours.as_ref().ok()?;
    Some((kind, r.case.work().per_second(t.median) / value))
}

/// The table cell of a missing figure.
const DASH: &str = "-";

/// The peer keys that appear in `results`, in order of first appearance.
pub fn peer_keys<'a>(results: impl IntoIterator<Item = &'a Measured>) -> Vec<&'static str> {
    let mut keys = Vec::new();
    for p in results.into_iter().flat_map(|r| &r.peers) {
        if !keys.contains(&p.key) {
            keys.push(p.key);
        }
    }
    keys
}

/// Prints one section's table (of one thread count on the CPU). Under `quick` the sizes are too
/// small for a ratio to peers to mean much (call overhead and timer resolution decide it): the
/// ratios are printed with a `~` and a line under the table says they are indicative.
pub fn print_section(
    section: Section,
    threads: Option<usize>,
    results: &[Measured],
    ceilings: &Ceilings,
    quick: bool,
) {
    let unit = if section.in_bytes() {
        "GB/s"
    } else {
        "GFLOP/s"
    };
    let at = threads.map_or(String::new(), |n| format!(" — {n} thread(s)"));
    println!("\n{}{at} [throughput in {unit}]", section.title());
    let keys = peer_keys(results);
    let width = |k: &str| k.len().max(8);
    // The op column fits the longest name (`layer_norm_backward`).
    let op_w = results
        .iter()
        .map(|r| r.case.name().len())
        .fold(10, usize::max);
    let mut header = format!(
        "{:<op_w$} {:<5} {:<31} {:>10} {:>23} {:>9}",
        "op", "dtype", "shape", "median", "min .. max", "ours"
    );
    for k in &keys {
        header += &format!(" {:>w$}", k, w = width(k));
    }
    let ceiling_label = if section.in_bytes() {
        "of copy"
    } else {
        "of peak"
    };
    header += &format!(" {:>9} {:>8}", "ours/best", ceiling_label);
    println!("{header}");
    for r in results {
        let c = &r.case;
        let head = format!(
            "{:<op_w$} {:<5} {:<31}",
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
        let mut line = format!(
            "{head} {:>10} {:>23} {:>9}",
            fmt_time(t.median),
            format!("{} .. {}", fmt_time(t.min), fmt_time(t.max)),
            fmt_number(work.per_second(t.median)),
        );
        for k in &keys {
            let cell = match r.peers.iter().find(|p| p.key == *k).map(|p| &p.timing) {
                Some(Ok(p)) => fmt_number(work.per_second(p.median)),
                Some(Err(e)) => e.cell().to_string(),
                None => DASH.into(),
            };
            line += &format!(" {:>w$}", cell, w = width(k));
        }
        line += &format!(
            " {:>9} {:>8}",
            best_ratio(r).map_or(DASH.into(), |x| ratio_cell(x, quick)),
            ceiling_fraction(r, Some(ceilings))
                .map_or(DASH.into(), |(_, x)| format!("{:.0}%", x * 100.0)),
        );
        println!("{line}");
        for p in &r.peers {
            if let Err(PeerError::Failed(e)) = &p.timing {
                println!("{:<10} {} error: {e}", "", p.key);
            }
        }
    }
    if quick && results.iter().any(|r| best_ratio(r).is_some()) {
        println!("~ --quick: sizes too small for a ratio to peers to mean much; indicative only");
    }
}

/// A ratio's table cell: `0.95x`, or `~0.95x` when it is only indicative.
fn ratio_cell(ratio: f64, indicative: bool) -> String {
    format!("{}{ratio:.2}x", if indicative { "~" } else { "" })
}

/// Prints the count of cases measured and failed.
pub fn print_footer(results: &[Measured]) {
    let failed = results.iter().filter(|r| r.ours.is_err()).count();
    println!(
        "\n{} cases, {} measured, {failed} failed",
        results.len(),
        results.len() - failed
    );
}

/// A timing as JSON, with the throughput at `work`.
fn timing_json(t: &Timing, work: Work) -> Value {
    json!({
        "median_s": t.median,
        "min_s": t.min,
        "max_s": t.max,
        "calls_per_repeat": t.k,
        "repeats": t.repeats,
        "throughput": work.per_second(t.median),
    })
}

/// A peer's result as JSON; `ours` is our timing, for the ratio.
fn peer_json(p: &PeerResult, work: Work, ours: Option<&Timing>) -> Value {
    let mut v = match &p.timing {
        Ok(t) => {
            let mut v = timing_json(t, work);
            v["ours_over_peer"] = json!(ours.map(|o| t.median / o.median));
            v["status"] = json!("measured");
            v
        }
        Err(e) => json!({
            "status": match e {
                PeerError::Skipped(_) => "skipped",
                PeerError::NotFound(_) => "not_found",
                PeerError::Failed(_) => "failed",
            },
            "error": e.message(),
        }),
    };
    v["key"] = json!(p.key);
    v["name"] = json!(p.name);
    v["baseline"] = json!(p.baseline);
    v
}

/// One row of the JSON's results.
fn case_json(r: &Measured, ceilings: Option<&Ceilings>) -> Value {
    let c: &Case = &r.case;
    let work = c.work();
    let (flops, bytes) = match work {
        Work::Flops(x) => (Some(x), None),
        Work::Bytes(x) => (None, Some(x)),
    };
    let ours = r.ours.as_ref().ok();
    let best = best_peer(r);
    let fraction = ceiling_fraction(r, ceilings);
    let mut row = json!({
        "section": c.section().key(),
        "op": c.name(),
        "dtype": c.dtype.name(),
        "variant": c.variant(),
        "shape": c.shape_label(),
        "dims": c.dims_json(),
        "backend": r.backend,
        "threads": r.threads,
        "flops": flops,
        "bytes": bytes,
        "unit": work.unit(),
        "peers": r.peers.iter().map(|p| peer_json(p, work, ours)).collect::<Vec<_>>(),
        "peer": best.map(|(p, _)| peer_json(p, work, ours)),
        "best_peer": best.map(|(p, _)| p.key),
        "ours_over_best_peer": best_ratio(r),
        "ours_over_peer": best_ratio(r),
        "ceiling": fraction.map(|(k, _)| k.key()),
        "fraction_of_ceiling": fraction.map(|(_, x)| x),
        "error": r.ours.as_ref().err(),
    });
    if let Some(t) = ours {
        if let (Value::Object(row), Value::Object(t)) = (&mut row, timing_json(t, work)) {
            row.extend(t);
        }
    }
    row
}

/// The JSON document of the run.
pub fn json_doc(run: &RunInfo, results: &[Measured], ceilings: &[Ceilings]) -> Value {
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
        "threads": (!run.threads.is_empty()).then_some(&run.threads),
        "peers": run.peers,
        "notes": run.notes,
        "binding_mib": run.binding_mib,
        "environment": {
            "OPENBLAS_CORETYPE": std::env::var("OPENBLAS_CORETYPE").ok(),
        },
        "ceilings": ceilings.iter().map(Ceilings::json).collect::<Vec<_>>(),
        "ceiling": ceilings.first().map(Ceilings::json),
        "throughput_units": {"flops": "GFLOP/s", "bytes": "GB/s (1e9 bytes)"},
        "results": results.iter().map(|r| case_json(r, ceilings_of(r, ceilings))).collect::<Vec<_>>(),
    })
}
