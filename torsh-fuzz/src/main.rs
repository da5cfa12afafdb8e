//! `torsh-fuzz`: the reliability suite of torsh-backend.
//!
//! Four categories of seeded random cases, on every backend available here:
//! - `valid`: random ops on random strided, broadcast and empty views, sizes past the kernels' grid
//!   and loop limits among them, compared with the reference backend ([`valid`]);
//! - `invalid`: mistakes at the tensor API, each expecting errors of named kinds ([`invalid`]);
//! - `raw`: the raw `ComputeBackend` trait with bad, freed, foreign, misaligned, overlapping and
//!   huge arguments ([`raw`]);
//! - `threads`: threads sharing one backend, with and without a memory pool, graph capture beside
//!   them ([`threads`]).
//!
//! Every case runs in a child process (this binary, `child`), which reports each case's start and
//! outcome on a line, so that a crash (abort, signal) or a hang (no line within `--hang-seconds`)
//! is caught, reported with the case that caused it, and the run goes on from the next case. Each
//! failure prints the command that replays it; the run ends with a table of cases and failures by
//! category and backend, and exits non-zero when any case failed.
//!
//! The generator is a small seeded SplitMix64 stream of the suite's own (`gen.rs`), not proptest: a
//! case is named by `(seed, index)` alone and replays in one command, runs stay within a time budget
//! rather than a case count, and nothing here needs shrinking (the cases are small by construction,
//! and the large ones are large on purpose).
//!
//! ```text
//! cargo run --release -p torsh-fuzz -- --seconds 900          # a long run
//! cargo run --release -p torsh-fuzz -- replay valid cpu 7 1234 # one case again
//! ```

mod gen;
mod invalid;
mod raw;
mod report;
mod threads;
mod valid;

use std::io::{BufRead, BufReader, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use torsh_backend::prelude::*;
use torsh_backend::MemoryPoolConfig;

use report::{Outcome, Tally};

/// The categories, in the order a run visits them.
const CATEGORIES: [&str; 4] = ["valid", "invalid", "raw", "threads"];

#[derive(Parser, Debug)]
#[command(
    name = "torsh-fuzz",
    about = "Seeded random, invalid, raw and threaded cases on every backend"
)]
struct Cli {
    /// Seconds for the whole run, shared evenly by every (category, backend) pair.
    #[arg(long, default_value_t = 120.0)]
    seconds: f64,
    /// The run's seed (cases are `(seed, index)`); by default from the clock, and printed.
    #[arg(long)]
    seed: Option<u64>,
    /// Backends to test, by name (default: every available one, and `webgpu-tight`, WebGPU with its
    /// binding, grid and loop budget lowered to their minimums, where WebGPU is available).
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// Categories to run (default: all of valid, invalid, raw, threads).
    #[arg(long, value_delimiter = ',')]
    categories: Vec<String>,
    /// A case that reports nothing for this long is a hang.
    #[arg(long, default_value_t = 60.0)]
    hang_seconds: f64,
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Runs one case again, in this process, and prints what it is and its outcome.
    Replay {
        category: String,
        backend: String,
        seed: u64,
        index: u64,
    },
    /// (Internal) runs cases from `first` until `until_ms` has passed, one line per case.
    Child {
        category: String,
        backend: String,
        seed: u64,
        first: u64,
        until_ms: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Some(Sub::Replay {
            category,
            backend,
            seed,
            index,
        }) => replay(category, backend, *seed, *index),
        Some(Sub::Child {
            category,
            backend,
            seed,
            first,
            until_ms,
        }) => child(category, backend, *seed, *first, *until_ms),
        None => run(&cli),
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a payload that is not text".into()
    }
}

/// The backends a child tests: the one named, a second instance of its kind (for foreign pointers
/// and mismatches), one with a memory pool (for threads), and the reference.
struct Setup {
    target: Backend,
    other: Backend,
    pooled: Backend,
    reference: Backend,
}

/// WebGPU with its binding lowered to 64 KiB, its grid to 64 workgroups a dimension and its loop
/// budget to 4096 passes, so that ordinary cases run the paths of tensors past a binding, grids past
/// a dimension and rows, products and windows past the loop budget.
const WEBGPU_TIGHT: &str = "webgpu-tight";

/// A backend by name: a backend kind's, or [`WEBGPU_TIGHT`].
fn backend(name: &str) -> Result<Backend> {
    if name == WEBGPU_TIGHT {
        use torsh_backend::webgpu::{self, WebGpuBackend, WebGpuBackendConfig};
        let config = WebGpuBackendConfig {
            max_binding_size: webgpu::MIN_BINDING_SIZE,
            max_workgroups_per_dimension: Some(webgpu::MIN_WORKGROUPS_PER_DIMENSION),
            max_loop_iterations: Some(webgpu::MIN_LOOP_ITERATIONS),
            ..Default::default()
        };
        return Backend::from_compute(Box::new(WebGpuBackend::new(config)));
    }
    let kind = BackendType::from_name(name)
        .ok_or_else(|| BackendError::invalid("torsh-fuzz", format!("no backend `{name}`")))?;
    Backend::new(kind)
}

impl Setup {
    fn new(name: &str) -> Result<Setup> {
        Ok(Setup {
            target: backend(name)?,
            other: backend(name)?,
            pooled: backend(name)?.memory_pool(MemoryPoolConfig::default())?,
            reference: Backend::reference()?,
        })
    }

    /// Case `index` of `category`: its description and outcome.
    fn case(&self, category: &str, seed: u64, index: u64) -> (String, Outcome) {
        let mut rng = gen::case_rng(seed, index);
        let run = AssertUnwindSafe(|| match category {
            "valid" => {
                let case = valid::generate(&mut rng);
                let outcome = valid::check(&case, &self.target, &self.reference);
                (format!("{}: {}", case.op, case.desc), outcome)
            }
            "invalid" => {
                let case = invalid::generate(&mut rng);
                let outcome = invalid::check(&case, &self.target, &self.other);
                (case.desc, outcome)
            }
            "raw" => raw::run(&mut rng, &self.target, &self.other),
            "threads" => {
                let b = if index % 4 >= 2 {
                    &self.pooled
                } else {
                    &self.target
                };
                let (desc, outcome) = threads::run(seed, index, b, &self.reference);
                let pool = if index % 4 >= 2 { ", memory pool" } else { "" };
                (format!("{desc}{pool}"), outcome)
            }
            other => (
                format!("no category `{other}`"),
                Outcome::Error(format!("categories are {CATEGORIES:?}")),
            ),
        });
        catch_unwind(run).unwrap_or_else(|p| {
            (
                "(the case panicked while it was generated or run)".into(),
                Outcome::Panic(panic_text(&*p)),
            )
        })
    }
}

fn replay(category: &str, backend: &str, seed: u64, index: u64) -> ExitCode {
    let setup = match Setup::new(backend) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{backend}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (desc, outcome) = setup.case(category, seed, index);
    println!("{category} {backend} seed {seed} case {index}: {desc}");
    println!("{}: {}", outcome.column(), outcome.detail());
    if outcome.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn child(category: &str, backend: &str, seed: u64, first: u64, until_ms: u64) -> ExitCode {
    // Panics are outcomes here; the default hook's report would only repeat them on stderr.
    std::panic::set_hook(Box::new(|_| {}));
    let setup = match Setup::new(backend) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{backend}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let until = Instant::now() + Duration::from_millis(until_ms);
    let mut out = std::io::stdout().lock();
    let mut index = first;
    // At least one case, so every child makes progress.
    loop {
        let _ = writeln!(out, "start\t{index}");
        let _ = out.flush();
        let (desc, outcome) = setup.case(category, seed, index);
        let _ = writeln!(
            out,
            "case\t{index}\t{}\t{}",
            outcome.to_line(),
            desc.replace(['\n', '\t'], " ")
        );
        let _ = out.flush();
        index += 1;
        if Instant::now() >= until {
            break;
        }
    }
    let _ = writeln!(out, "done");
    ExitCode::SUCCESS
}

/// What a child's stdout line says.
enum Line {
    Start(u64),
    Case(u64, Outcome, String),
    Done,
}

fn parse(line: &str) -> Option<Line> {
    let mut parts = line.splitn(5, '\t');
    match parts.next()? {
        "start" => Some(Line::Start(parts.next()?.parse().ok()?)),
        "case" => {
            let index = parts.next()?.parse().ok()?;
            let column = parts.next()?;
            let detail = parts.next()?;
            let desc = parts.next().unwrap_or("").to_string();
            Some(Line::Case(
                index,
                Outcome::from_line(&format!("{column}\t{detail}"))?,
                desc,
            ))
        }
        "done" => Some(Line::Done),
        _ => None,
    }
}

fn run(cli: &Cli) -> ExitCode {
    let seed = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let backends: Vec<String> = if cli.backends.is_empty() {
        let available = Backend::available();
        let mut all: Vec<String> = available.iter().map(|k| k.name().to_string()).collect();
        if available.contains(&BackendType::WebGpu) {
            all.push(WEBGPU_TIGHT.into());
        }
        all
    } else {
        cli.backends.clone()
    };
    let categories: Vec<String> = if cli.categories.is_empty() {
        CATEGORIES.iter().map(|c| c.to_string()).collect()
    } else {
        cli.categories.clone()
    };
    // The reference is the oracle of `valid`: it is not compared with itself.
    let pairs: Vec<(&String, &String)> = categories
        .iter()
        .flat_map(|c| backends.iter().map(move |b| (c, b)))
        .filter(|(c, b)| !(c.as_str() == "valid" && b.as_str() == "reference"))
        .collect();
    let cells = pairs.len().max(1);
    let per_cell = Duration::from_secs_f64(cli.seconds / cells as f64);
    let hang = Duration::from_secs_f64(cli.hang_seconds);
    println!(
        "torsh-fuzz: seed {seed}, {:.0} s over {cells} (category, backend) pairs \
         (backends {backends:?}), {:.1} s each",
        cli.seconds,
        per_cell.as_secs_f64()
    );
    let mut tally = Tally::default();
    for (category, backend) in pairs {
        cell(category, backend, seed, per_cell, hang, &mut tally);
    }
    println!("\n{}", tally.table());
    if tally.failures.is_empty() {
        println!("no failures in {} cases", tally.cases());
        ExitCode::SUCCESS
    } else {
        println!("{} failing cases of {}:", tally.failed(), tally.cases());
        for f in &tally.failures {
            println!("  {f}");
        }
        ExitCode::FAILURE
    }
}

/// Runs `category` on `backend` for `budget` in child processes, restarting after a crash or a hang.
fn cell(
    category: &str,
    backend: &str,
    seed: u64,
    budget: Duration,
    hang: Duration,
    tally: &mut Tally,
) {
    let end = Instant::now() + budget;
    let exe = std::env::current_exe().expect("the path of this executable");
    let mut next = 0u64;
    let reproduce = |index: u64| {
        format!("cargo run --release -p torsh-fuzz -- replay {category} {backend} {seed} {index}")
    };
    let record = |tally: &mut Tally, index: u64, outcome: Outcome, desc: &str| {
        tally.add(category, backend, &outcome);
        if outcome.failed() {
            let line = format!(
                "{category} {backend} case {index} [{}] {desc}: {}\n      replay: {}",
                outcome.column(),
                outcome.detail(),
                reproduce(index)
            );
            println!("FAIL {line}");
            tally.failures.push(line);
        }
    };
    while Instant::now() < end {
        let until_ms = end.saturating_duration_since(Instant::now()).as_millis() as u64;
        let mut child = match Command::new(&exe)
            .args([
                "child",
                category,
                backend,
                &seed.to_string(),
                &next.to_string(),
                &until_ms.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                record(
                    tally,
                    next,
                    Outcome::Error(format!("starting a child: {e}")),
                    "",
                );
                return;
            }
        };
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("piped stderr");
        let errors = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let mut started: Option<u64> = None;
        let mut finished = false;
        let mut hung = false;
        loop {
            match rx.recv_timeout(hang) {
                Ok(line) => match parse(&line) {
                    Some(Line::Start(i)) => started = Some(i),
                    Some(Line::Case(i, outcome, desc)) => {
                        started = None;
                        next = i + 1;
                        record(tally, i, outcome, &desc);
                    }
                    Some(Line::Done) => finished = true,
                    None => {}
                },
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    hung = true;
                    let _ = child.kill();
                    break;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child.wait();
        let stderr_text = errors.join().unwrap_or_default();
        let tail: String = {
            let t = stderr_text.trim();
            let start = t.len().saturating_sub(600);
            let start = (start..=t.len())
                .find(|&i| t.is_char_boundary(i))
                .unwrap_or(t.len());
            t[start..].replace('\n', " | ")
        };
        if let Some(i) = started {
            let outcome = if hung {
                Outcome::Hang(format!("no answer within {:.0} s", hang.as_secs_f64()))
            } else {
                Outcome::Crash(format!("{status:?}; stderr: {tail}"))
            };
            record(tally, i, outcome, "(see replay)");
            next = i + 1;
        } else if !finished {
            // The child died outside a case: it could not start (a backend that cannot open).
            record(
                tally,
                next,
                Outcome::Error(format!("the child exited: {status:?}; stderr: {tail}")),
                "",
            );
            return;
        }
    }
}
