//! What the example programs share: their `main`, the backend they train on, numbers from the
//! command line, the device's description and the figures of times. Each example includes this
//! file as its `cli` module.

use std::error::Error;
use std::time::Duration;

use torsh_backend::{Backend, BackendType, DeviceInfo};

/// The body of an example's `main`: `run` on the options `parse` makes of the arguments. A bad
/// argument is printed with `usage` and ends the process with status 2; an error from `run` is
/// printed and ends it with status 1.
pub fn main<O>(
    name: &str,
    usage: &str,
    parse: impl FnOnce(std::env::Args) -> Result<O, String>,
    run: impl FnOnce(&O) -> Result<(), Box<dyn Error>>,
) {
    let mut args = std::env::args();
    args.next();
    let options = match parse(args) {
        Ok(o) => o,
        Err(message) => {
            eprintln!("{name}: {message}\n\n{usage}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&options) {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}

/// The backend of `kind`; `threads` sizes the CPU backend's pool (also when `Auto` picks the CPU).
/// Errors: the backend's own, e.g. `Unavailable` with the reason.
pub fn backend(kind: BackendType, threads: Option<usize>) -> torsh_backend::Result<Backend> {
    let kind = match kind {
        BackendType::Auto => Backend::auto()?.backend_type(),
        kind => kind,
    };
    match (kind, threads) {
        (BackendType::Cpu, Some(n)) => Backend::cpu().num_threads(n).build(),
        (kind, _) => Backend::new(kind),
    }
}

/// The value of `option` written as `text`, or a message naming both.
pub fn number<T: std::str::FromStr>(option: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{option}: `{text}` is not a valid number"))
}

/// The device's name, then its threads and SIMD level (CPU) or the API serving it (GPUs).
pub fn describe(info: &DeviceInfo) -> String {
    let detail = |key: &str| info.details.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    match (detail("threads used"), detail("simd")) {
        (Some(threads), Some(simd)) => format!("{}, {threads} thread(s), {simd}", info.name),
        _ => format!("{}, {}", info.name, info.api),
    }
}

/// `x` as a JSON number, or `null` when it is not finite (JSON has no NaN or infinity).
pub fn json_number(x: f64) -> String {
    if x.is_finite() {
        x.to_string()
    } else {
        "null".into()
    }
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median of some durations (the upper one of an even count; zero for none).
pub fn median(values: impl Iterator<Item = Duration>) -> Duration {
    let mut v: Vec<Duration> = values.collect();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Prints the backend's memory in use and at its peak, where it counts them.
pub fn print_memory(b: &Backend) {
    let memory = b.memory_stats();
    if memory.peak_allocated_bytes > 0 {
        println!(
            "device memory: {:.1} MiB in use, {:.1} MiB at the peak",
            memory.allocated_bytes as f64 / 1048576.0,
            memory.peak_allocated_bytes as f64 / 1048576.0
        );
    }
}
