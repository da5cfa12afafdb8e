//! The command line of the example.

use torsh_backend::BackendType;

use crate::cli::number;

/// What `--help` and a bad option print.
pub const USAGE: &str = "usage: lenet_digits [--backend reference|cpu|cuda|webgpu|auto] \
[--epochs N] [--threads N] [--batch N] [--lr X] [--seed N] [--profile] [--json FILE]";

/// The parsed options, each with its default.
pub struct Options {
    pub backend: BackendType,
    pub epochs: usize,
    pub threads: Option<usize>,
    pub batch: usize,
    pub lr: f32,
    pub seed: u64,
    pub profile: bool,
    pub json: Option<String>,
}

impl Options {
    /// Parses the arguments after the program's name. Errors: an unknown option, a missing or
    /// malformed value, a zero batch.
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut o = Options {
            backend: BackendType::Auto,
            epochs: 30,
            threads: None,
            batch: 32,
            lr: 0.01,
            seed: 0,
            profile: false,
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
                "--epochs" => o.epochs = number(&arg, &value()?)?,
                "--threads" => o.threads = Some(number(&arg, &value()?)?),
                "--batch" => o.batch = number(&arg, &value()?)?,
                "--lr" => o.lr = number(&arg, &value()?)?,
                "--seed" => o.seed = number(&arg, &value()?)?,
                "--profile" => o.profile = true,
                "--json" => o.json = Some(value()?),
                "--help" | "-h" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                _ => return Err(format!("unknown option `{arg}`")),
            }
        }
        if o.batch == 0 {
            return Err("--batch must be at least 1".into());
        }
        Ok(o)
    }
}
