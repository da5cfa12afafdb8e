//! Trains a small character-level transformer on Macbeth (the spoken lines, shipped in
//! `examples/data/`), prints the loss as it goes, and ends with a sample it generates greedily.
//!
//! ```sh
//! cargo run --release --example char_transformer                 # on Backend::auto()
//! cargo run --release --example char_transformer -- --precision bf16 --steps 300
//! ```
//!
//! Options: `--backend reference|cpu|cuda|webgpu|auto` (default auto), `--steps N` (600),
//! `--precision f32|bf16` (f32; bf16 is mixed precision: bf16 products and attention, f32
//! elsewhere, a dynamic loss scaler), `--threads N` (CPU: the pool's threads), `--batch N` (32),
//! `--context N` (64 tokens), `--lr X` (0.003, Adam), `--seed N` (0: the weights and the batches),
//! `--every N` (50: steps between reports), `--sample N` (300 characters), `--prompt TEXT`
//! (`MACBETH:` and a newline), `--json FILE` (each report's losses and time per step, for
//! `benches/train.py`).
//!
//! Each step draws `batch` windows of `context` characters at random offsets of the first 90 % of
//! the text, uploads their ids and the ids one character later, and runs the network, its gradients
//! and Adam on the device. The host reads one loss per step, at each report, after the report's
//! timing; a report also gives the loss on 8 fixed batches of the last 10 % of the text.

#[path = "../common/cli.rs"]
mod cli;
mod data;
mod model;
mod options;

use std::time::{Duration, Instant};

use torsh_backend::prelude::*;
use torsh_backend::{LossScaler, MixedPrecisionConfig};

use cli::{describe, json_number, median, ms};
use data::Corpus;
use model::Transformer;
use options::Options;

/// Validation batches per report.
const VALIDATION_BATCHES: u64 = 8;

/// One report's figures.
struct Report {
    step: usize,
    train_loss: f64,
    validation_loss: f64,
    per_step: Duration,
}

fn main() {
    cli::main("char_transformer", options::USAGE, Options::parse, run);
}

fn run(o: &Options) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let corpus = Corpus::load();
    let prompt = corpus
        .encode(&o.prompt)
        .ok_or("the prompt has a character the text does not")?;
    if o.context >= corpus.validation.len() {
        return Err(format!("--context must be below {}", corpus.validation.len()).into());
    }
    let mut b = cli::backend(o.backend, o.threads)?;
    let mut scaler = None;
    if o.precision != DType::F32 {
        let config = MixedPrecisionConfig {
            compute_dtype: o.precision,
            accum_dtype: DType::F32,
            scale_factor: 65536.0,
        };
        b = b.enable_mixed_precision(config)?;
        scaler = Some(LossScaler::from_config(&config));
    }
    let info = b.device_info();
    println!(
        "backend: {} ({}), precision {}",
        b.backend_type(),
        describe(&info),
        o.precision
    );
    let mut model = Transformer::new(&b, DType::F32, corpus.vocab(), o.context, o.seed, o.lr)?;
    let params: usize = model.params.iter().map(Tensor::numel).sum();
    println!(
        "data: {} training and {} validation characters, {} distinct; model: {} layers, d_model {}, \
         {} heads, {params} parameters; batch {} × {} characters, Adam lr {}",
        corpus.train.len(),
        corpus.validation.len(),
        corpus.vocab(),
        model::LAYERS,
        model::D_MODEL,
        model::HEADS,
        o.batch,
        o.context,
        o.lr
    );

    let upload = |ids: &[i64]| b.from_slice(ids, &[o.batch, o.context]);
    let validation_seed = o.seed.wrapping_add(1);
    let validation_loss = |model: &Transformer| -> Result<f64> {
        let mut total = 0.0;
        for draw in 0..VALIDATION_BATCHES {
            let [x, y] = data::batch(
                &corpus.validation,
                o.batch,
                o.context,
                validation_seed,
                draw,
            );
            let f = model.forward(&upload(&x)?, Some(&upload(&y)?))?;
            total += f.loss.map_or(Ok(f64::NAN), |l| l.item())?;
        }
        Ok(total / VALIDATION_BATCHES as f64)
    };

    let mut reports = Vec::new();
    let mut losses = Vec::with_capacity(o.every);
    let mut skipped = 0;
    let (mut start, mut first) = (Instant::now(), 0);
    for step in 0..o.steps {
        let [x, y] = data::batch(&corpus.train, o.batch, o.context, o.seed, step as u64);
        let (x, y) = (upload(&x)?, upload(&y)?);
        let forward = model.forward(&x, Some(&y))?;
        let seed = scaler.as_ref().map_or(1.0, LossScaler::get_scale);
        let mut grads = model.backward(&forward, &y, seed)?;
        match scaler.as_mut() {
            Some(scaler) => skipped += usize::from(!model.update_scaled(&mut grads, scaler)?),
            None => model.update(&grads)?,
        }
        losses.extend(forward.loss);
        if (step + 1) % o.every == 0 || step + 1 == o.steps {
            b.synchronize()?;
            let per_step = start.elapsed() / (step + 1 - first) as u32;
            let mut train_loss = 0.0;
            for l in &losses {
                train_loss += l.item()?;
            }
            let r = Report {
                step: step + 1,
                train_loss: train_loss / losses.len() as f64,
                validation_loss: validation_loss(&model)?,
                per_step,
            };
            println!(
                "step {:>5}/{}  train loss {:.4}  validation loss {:.4}  {:7.2} ms/step",
                r.step,
                o.steps,
                r.train_loss,
                r.validation_loss,
                ms(r.per_step)
            );
            reports.push(r);
            losses.clear();
            (start, first) = (Instant::now(), step + 1);
        }
    }

    if let Some(last) = reports.last() {
        let median = median(reports.iter().map(|r| r.per_step));
        println!(
            "done: {} steps, validation loss {:.4}, {:.2} ms per step (median of the reports){}",
            o.steps,
            last.validation_loss,
            ms(median),
            if scaler.is_some() {
                format!(", {skipped} step(s) skipped for inf/NaN gradients")
            } else {
                String::new()
            }
        );
    }
    cli::print_memory(&b);
    if o.sample > 0 {
        let ids = model.generate(&b, &prompt, o.sample)?;
        println!("sample (greedy):\n{}", corpus.decode(&ids));
    }
    if let Some(path) = &o.json {
        std::fs::write(path, json(o, &b, &reports))?;
    }
    Ok(())
}

/// The run as JSON: the options, and each report's losses and milliseconds per step (`null` for a
/// loss that is not finite).
fn json(o: &Options, b: &Backend, reports: &[Report]) -> String {
    let rows: Vec<String> = reports
        .iter()
        .map(|r| {
            format!(
                "{{\"step\": {}, \"train_loss\": {}, \"validation_loss\": {}, \"ms_per_step\": {}}}",
                r.step,
                json_number(r.train_loss),
                json_number(r.validation_loss),
                ms(r.per_step)
            )
        })
        .collect();
    format!(
        "{{\"model\": \"char_transformer\", \"backend\": \"{}\", \"precision\": \"{}\", \
         \"threads\": {}, \"batch\": {}, \"context\": {}, \"reports\": [\n  {}\n]}}\n",
        b.backend_type(),
        o.precision,
        o.threads.map_or("null".to_string(), |t| t.to_string()),
        o.batch,
        o.context,
        rows.join(",\n  ")
    )
}
