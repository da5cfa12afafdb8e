//! The command line of the example.

use torsh_backend::{BackendType, DType};

use crate::cli::number;

/// What `--help` and a bad option print.
pub const USAGE: &str = "usage: char_transformer [--backend reference|cpu|cuda|webgpu|auto] \
[--steps N] [--precision f32|bf16] [--threads N] [--batch N] [--context N] [--lr X] [--seed N] \
[--every N] [--sample N] [--prompt TEXT] [--json FILE]";

/// The parsed options, each with its default.
pub struct Options {
    pub backend: BackendType,
    pub steps: usize,
    /// `F32`, or `BF16` for mixed precision (bf16 products, f32 everything else, a loss scaler).
    pub precision: DType,
    pub threads: Option<usize>,
    pub batch: usize,
    pub context: usize,
    pub lr: f32,
    pub seed: u64,
    pub every: usize,
    pub sample: usize,
    pub prompt: String,
    pub json: Option<String>,
}

impl Options {
    /// Parses the arguments after the program's name. Errors: an unknown option, a missing or
    /// malformed value, a zero batch, context or reporting interval.
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut o = Options {
            backend: BackendType::Auto,
            steps: 600,
            precision: DType::F32,
            threads: None,
            batch: 32,
            context: 64,
            lr: 0.003,
            seed: 0,
            every: 50,
            sample: 300,
            prompt: "MACBETH:\n".into(),
            json: None,
        };
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--backend" => {
                    let name = value()?;
                    o.backend =
                        BackendType::from_name(&name).ok_or(format!("unknown backend `{name}`"))?;
                }
                "--steps" => o.steps = number(&arg, &value()?)?,
                "--precision" => {
                    o.precision = match value()?.as_str() {
                        "f32" => DType::F32,
                        "bf16" => DType::BF16,
                        other => return Err(format!("--precision: `{other}` is not f32 or bf16")),
                    }
                }
                "--threads" => o.threads = Some(number(&arg, &value()?)?),
                "--batch" => o.batch = number(&arg, &value()?)?,
                "--context" => o.context = number(&arg, &value()?)?,
                "--lr" => o.lr = number(&arg, &value()?)?,
                "--seed" => o.seed = number(&arg, &value()?)?,
                "--every" => o.every = number(&arg, &value()?)?,
                "--sample" => o.sample = number(&arg, &value()?)?,
                "--prompt" => o.prompt = value()?,
                "--json" => o.json = Some(value()?),
                "--help" | "-h" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                _ => return Err(format!("unknown option `{arg}`")),
            }
        }
        for (name, v) in [
            ("--batch", o.batch),
            ("--context", o.context),
            ("--every", o.every),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if o.prompt.is_empty() {
            return Err("--prompt must not be empty".into());
        }
        Ok(o)
    }
}
