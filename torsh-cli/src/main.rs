//! `torsh-backend`: list devices, check every backend against the reference, and benchmark.
//!
//! - `torsh-backend devices [--json]`: every backend kind, whether it is available here (and why not),
//!   and each device with id, name, memory and the API that serves it.
//! - `torsh-backend parity [--json] [--backend NAME]... [--op NAME]...`: runs the op suite on every
//!   available backend (or those named) against the reference and prints the max relative error per op,
//!   dtype and backend. Exits with status 1 if any result exceeds its bound or fails.
//! - `torsh-backend bench [--backend KIND] [--op NAME]... [--quick] [--repeats N] [--threads N,...]
//!   [--json FILE] [--plot FILE.svg]`: times GEMM, memory-bound ops, attention, conv2d and fused Adam on
//!   one backend, beside the peers measured in the same run (CUDA: cuBLAS; CPU: OpenBLAS, the `gemm`
//!   crate, `matrixmultiply`, onnxruntime where installed), against the machine's measured
//!   ceilings; see `bench.rs`.

mod bench;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use torsh_backend::validation::{self, cases, Outcome, ParityResult};
use torsh_backend::{Backend, BackendType};

#[derive(Parser)]
#[command(
    name = "torsh-backend",
    version,
    about = "Devices, parity checks and benchmarks for torsh-backend"
)]
/// Devices, parity checks and benchmarks for torsh-backend.
struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
enum Command {
    /// List backend kinds, their availability and their devices.
    Devices {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run every op on every available backend and compare with the reference backend.
    Parity {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Only these backends (by name: cpu, cuda, webgpu, ...); repeatable.
        #[arg(long = "backend")]
        backends: Vec<String>,
        /// Only these ops (as listed in the table); repeatable.
        #[arg(long = "op")]
        ops: Vec<String>,
    },
    /// Time ops on one backend (GEMM, memory-bound ops, attention, conv2d, fused Adam) next to the
    /// peers measured in the same run, and print throughput, ratio to the best peer and fraction of
    /// the machine's measured ceiling (FMA peak or copy bandwidth).
    Bench {
        /// The backend to measure (cpu, cuda, reference, ...); default: the one Backend::auto() picks.
        #[arg(long, value_name = "KIND")]
        backend: Option<String>,
        /// Only these ops (matmul, memcpy, copy, add, mul, exp, gelu, erf, tanh, sigmoid, softmax,
        /// layer_norm, batch_norm, layer_norm_backward, batch_norm_backward, sum, max, cast, fill,
        /// gather, index_select, index_add, where, cumsum, topk, cat, gelu_backward,
        /// softmax_backward, dropout, max_pool2d, max_pool2d_backward, avg_pool2d_backward,
        /// cross_entropy, cross_entropy_backward, attention, attention_backward, conv2d,
        /// conv2d_backward, adam); repeatable.
        #[arg(long = "op", value_name = "NAME")]
        ops: Vec<String>,
        /// Tiny sizes and short repeats: a smoke run (used by the tests).
        #[arg(long)]
        quick: bool,
        /// Repeats per case; the median is reported.
        #[arg(long, value_name = "N", default_value_t = 5)]
        repeats: usize,
        /// Also write every result as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Also draw the results as an SVG chart in this file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// CPU thread counts to run every case at, comma-separated (default: 1 and all cores).
        #[arg(long, value_name = "N,...", value_delimiter = ',')]
        threads: Vec<usize>,
        /// WebGPU only: the largest storage binding the kernels use, in MiB (default: the
        /// adapter's). Tensors larger than it are bound in windows and ops over all of one run in
        /// pieces or two passes, which this measures on tensors of ordinary size.
        #[arg(long, value_name = "MIB")]
        binding_mib: Option<u64>,
    },
    /// Internal: one peer measurement in a process of its own (used by `bench`).
    #[command(name = "bench-peer", hide = true)]
    BenchPeer {
        /// The element type: f32 or f64.
        #[arg(long)]
        dtype: String,
        /// Rows of A and C.
        #[arg(long)]
        m: usize,
        /// Columns of B and C.
        #[arg(long)]
        n: usize,
        /// Columns of A, rows of B.
        #[arg(long)]
        k: usize,
        /// Repeats; the median is reported.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Minimum seconds of one repeat.
        #[arg(long, default_value_t = 0.02)]
        min_repeat_s: f64,
    },
}

/// Parses the command line and runs the subcommand.
fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::BenchPeer { .. }) {
        explain_device_select_messages();
    }
    match cli.command {
        Command::Devices { json } => devices(json),
        Command::Parity {
            json,
            backends,
            ops,
        } => parity(json, &backends, &ops),
        Command::Bench {
            backend,
            ops,
            quick,
            repeats,
            json,
            plot,
            threads,
            binding_mib,
        } => bench::run(bench::Options {
            backend,
            ops,
            quick,
            repeats,
            json,
            plot,
            threads,
            binding_mib,
        }),
        Command::BenchPeer {
            dtype,
            m,
            n,
            k,
            repeats,
            min_repeat_s,
        } => bench::peer_child(bench::PeerChildArgs {
            dtype,
            m,
            n,
            k,
            repeats,
            min_repeat_s,
        }),
    }
}

/// `torsh-backend devices`: every backend kind, its availability and its device.
fn devices(json: bool) -> ExitCode {
    let statuses = Backend::probe();
    let mut rows = Vec::new();
    for status in &statuses {
        let kind = status.backend_type;
        let entry = match &status.availability {
            Ok(()) => match Backend::new(kind) {
                Ok(b) => {
                    let info = b.device_info();
                    json!({
                        "backend": kind.name(),
                        "available": true,
                        "devices": [{
                            "id": info.id(),
                            "name": info.name(),
                            "memory_bytes": info.memory_bytes,
                            "memory_gb": info.memory_gb(),
                            "api": info.api,
                            "details": info.details.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
                        }],
                    })
                }
                Err(e) => {
                    json!({"backend": kind.name(), "available": false, "reason": e.to_string(), "devices": []})
                }
            },
            Err(reason) => {
                json!({"backend": kind.name(), "available": false, "reason": reason, "devices": []})
            }
        };
        rows.push(entry);
    }
    let best = Backend::auto()
        .map(|b| b.backend_type().name().to_string())
        .unwrap_or_else(|e| format!("none ({e})"));
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"auto": best, "backends": rows}))
                .unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    println!("{:<10} {:<10} details", "backend", "available");
    for row in &rows {
        let name = row["backend"].as_str().unwrap_or("?");
        if row["available"].as_bool() == Some(true) {
            println!("{name:<10} {:<10}", "yes");
            for d in row["devices"].as_array().into_iter().flatten() {
                println!(
                    "{:<21} [{}] {} — {:.2} GiB — {}",
                    "",
                    d["id"],
                    d["name"].as_str().unwrap_or("?"),
                    d["memory_gb"].as_f64().unwrap_or(0.0),
                    d["api"].as_str().unwrap_or("?")
                );
                let details: Vec<String> = d["details"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|kv| {
                        format!(
                            "{}: {}",
                            kv["key"].as_str().unwrap_or(""),
                            kv["value"].as_str().unwrap_or("")
                        )
                    })
                    .collect();
                if !details.is_empty() {
                    println!("{:<25} {}", "", details.join(", "));
                }
            }
        } else {
            println!(
                "{name:<10} {:<10} {}",
                "no",
                row["reason"].as_str().unwrap_or("")
            );
        }
    }
    println!("\nBackend::auto() picks: {best}");
    ExitCode::SUCCESS
}

/// `torsh-backend parity`: the op suite on each backend against the reference.
fn parity(json: bool, backend_names: &[String], ops: &[String]) -> ExitCode {
    let mut wanted = Vec::new();
    for name in backend_names {
        match BackendType::from_name(name) {
            Some(kind) => wanted.push(kind),
            None => {
                eprintln!("unknown backend `{name}`");
                return ExitCode::from(2);
            }
        }
    }
    let selected: Vec<_> = cases::all()
        .into_iter()
        .filter(|c| ops.is_empty() || ops.iter().any(|o| o == c.op))
        .collect();
    if selected.is_empty() {
        let names: Vec<&str> = cases::all().iter().map(|c| c.op).collect();
        eprintln!("no op matches {ops:?}; ops are: {}", names.join(", "));
        return ExitCode::from(2);
    }
    let mut notes = Vec::new();
    let targets: Vec<Backend> = if wanted.is_empty() {
        match validation::parity_targets() {
            Ok((targets, skipped)) => {
                notes = skipped;
                targets
            }
            Err(reason) => {
                eprintln!("{reason}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        let mut targets = Vec::new();
        for kind in wanted {
            match Backend::new(kind) {
                Ok(b) => targets.push(b),
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        targets
    };
    let reference = match Backend::reference() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let all = cases::all();
    let mut results = Vec::new();
    for target in &targets {
        for case in &selected {
            let index = all.iter().position(|c| c.op == case.op).unwrap_or(0);
            for &dtype in case.dtypes {
                results.push(validation::run_case(
                    case,
                    target,
                    &reference,
                    dtype,
                    validation::case_seed(index),
                ));
            }
        }
    }
    let failed = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Failed(_) | Outcome::Error(_)))
        .count();
    let devices: Vec<String> = targets.iter().map(device_line).collect();
    if json {
        let rows: Vec<Value> = results.iter().map(result_json).collect();
        let doc = json!({
            "against": REFERENCE_LINE,
            "devices": devices,
            "results": rows,
            "skipped": notes,
            "failed": failed,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        println!("{REFERENCE_LINE}");
        for d in &devices {
            println!("  {d}");
        }
        print_table(&results, &notes);
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// What every parity result is measured against.
const REFERENCE_LINE: &str =
    "Each backend's answers are compared with the reference backend's (scalar \
     kernels, f64 accumulation) on the same seeded random inputs, by relative error against the \
     dtype's bound. Backends compared:";

/// `backend`'s kind and the device it ran on: name, the API serving it and, where the backend says,
/// its kind (a WebGPU adapter may be a CPU implementation such as lavapipe).
fn device_line(backend: &Backend) -> String {
    let info = backend.device_info();
    let kind = info
        .details
        .iter()
        .find(|(k, _)| k == "kind")
        .map(|(_, v)| format!(", {v}"))
        .unwrap_or_default();
    format!(
        "{}: {} ({}{kind})",
        backend.backend_type().name(),
        info.name,
        info.api
    )
}

/// A parity result's status word and message.
fn status(r: &ParityResult) -> (&'static str, Option<&str>) {
    match &r.outcome {
        Outcome::Passed => ("ok", None),
        Outcome::Failed(m) => ("FAIL", Some(m)),
        Outcome::Unsupported(m) => ("unsupported", Some(m)),
        Outcome::Error(m) => ("ERROR", Some(m)),
    }
}

/// A parity result as JSON.
fn result_json(r: &ParityResult) -> Value {
    let (s, message) = status(r);
    let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
    json!({
        "op": r.op,
        "dtype": r.dtype.name(),
        "backend": r.backend.name(),
        "rel_error": num(r.rel_error),
        "max_abs_error": num(r.max_abs_error),
        "bound": r.bound,
        "status": s,
        "message": message,
    })
}

/// Prints the parity results as a table.
fn print_table(results: &[ParityResult], notes: &[String]) {
    for n in notes {
        println!("{n}");
    }
    println!(
        "{:<16} {:<6} {:<10} {:>12} {:>12} {:>9}  status",
        "op", "dtype", "backend", "rel error", "max abs", "bound"
    );
    for r in results {
        let (s, message) = status(r);
        println!(
            "{:<16} {:<6} {:<10} {:>12.3e} {:>12.3e} {:>9.0e}  {s}{}",
            r.op,
            r.dtype.name(),
            r.backend.name(),
            r.rel_error,
            r.max_abs_error,
            r.bound,
            message.map(|m| format!(": {m}")).unwrap_or_default()
        );
    }
    let passed = results.iter().filter(|r| r.passed()).count();
    let failed = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Failed(_) | Outcome::Error(_)))
        .count();
    println!(
        "\n{passed} passed, {failed} failed, {} skipped",
        results.len() - passed - failed
    );
}

/// Mesa's Vulkan device-select layer looks for a Wayland display while adapters are listed, and where
/// `XDG_RUNTIME_DIR` is unset (a headless machine, a container, an ssh session without a login
/// session) libwayland prints `error: XDG_RUNTIME_DIR is invalid or not set in the environment.`
/// once or twice. It is harmless, and the backend cannot stop it without setting environment
/// variables or leaving out extensions that wgpu requires; this says so first, where the layer is
/// installed and the variables that quiet it are not set.
fn explain_device_select_messages() {
    if !cfg!(target_os = "linux")
        || std::env::var_os("XDG_RUNTIME_DIR").is_some()
        || std::env::var_os("NODEVICE_SELECT").is_some()
    {
        return;
    }
    let layer = [
        "/usr/share/vulkan/implicit_layer.d/VkLayer_MESA_device_select.json",
        "/etc/vulkan/implicit_layer.d/VkLayer_MESA_device_select.json",
    ];
    if layer.iter().any(|p| std::path::Path::new(p).exists()) {
        eprintln!(
            "note: Mesa's Vulkan device-select layer may print \"XDG_RUNTIME_DIR is invalid or not \
             set\" while adapters are listed; it is harmless (set XDG_RUNTIME_DIR, or \
             NODEVICE_SELECT=1, to quiet it)"
        );
    }
}
