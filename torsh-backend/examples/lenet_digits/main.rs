//! Trains a LeNet-style CNN on the digits data set (1,797 8×8 images of handwritten digits, shipped
//! in `examples/data/`) and prints the test accuracy after every epoch.
//!
//! ```sh
//! cargo run --release --example lenet_digits                    # on Backend::auto()
//! cargo run --release --example lenet_digits -- --backend webgpu --epochs 5 --profile
//! ```
//!
//! Options: `--backend reference|cpu|cuda|webgpu|auto` (default auto), `--epochs N` (30),
//! `--threads N` (CPU: the pool's threads; default one per core), `--batch N` (32), `--lr X`
//! (0.01), `--seed N` (0: the split, the shuffles and the initial weights), `--profile` (also time
//! the data, forward, backward and Adam phases of each step, synchronising the device between them),
//! `--json FILE` (the per-epoch times and accuracies, for `benches/train.py`).
//!
//! The data set is split 80/20 once with the seed; each epoch shuffles the training set, uploads
//! the order and gathers each batch on the device with `index_select`. Everything else (the
//! network, its gradients and Adam) runs on device tensors; the host reads one loss per step and one
//! count of correct answers per epoch, after the epoch's timing.

#[path = "../common/cli.rs"]
mod cli;
mod data;
mod model;
mod options;

use std::time::{Duration, Instant};

use torsh_backend::prelude::*;

use cli::{describe, json_number, median, ms};
use data::{Digits, SplitMix64, SIDE};
use model::LeNet;
use options::Options;

/// The phases a step's time is split into with `--profile`.
const PHASES: [&str; 4] = ["data", "forward", "backward", "adam"];

/// One epoch's figures.
struct Epoch {
    loss: f64,
    correct: usize,
    train: Duration,
    eval: Duration,
}

fn main() {
    cli::main("lenet_digits", options::USAGE, Options::parse, run);
}

fn run(o: &Options) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let b = cli::backend(o.backend, o.threads)?;
    let info = b.device_info();
    println!("backend: {} ({})", b.backend_type(), describe(&info));

    let (train, test) = Digits::load()?.split(0.2, o.seed);
    let upload = |d: &Digits| -> Result<(Tensor, Tensor)> {
        Ok((
            b.from_slice(&d.pixels, &[d.len(), 1, SIDE, SIDE])?,
            b.from_slice(&d.labels, &[d.len()])?,
        ))
    };
    let (train_x, train_y) = upload(&train)?;
    let (test_x, test_y) = upload(&test)?;
    let steps = train.len().div_ceil(o.batch);
    println!(
        "data: {} training and {} test images, batch {}, {steps} steps per epoch, Adam lr {}",
        train.len(),
        test.len(),
        o.batch,
        o.lr
    );

    let mut model = LeNet::new(&b, DType::F32, o.seed, o.lr)?;
    let mut shuffle = SplitMix64(o.seed.wrapping_add(1));
    let mut phases = [Duration::ZERO; PHASES.len()];
    let mut epochs = Vec::with_capacity(o.epochs);
    for epoch in 1..=o.epochs {
        let start = Instant::now();
        let order: Vec<i64> = shuffle
            .permutation(train.len())
            .into_iter()
            .map(|i| i as i64)
            .collect();
        let order = b.from_slice(&order, &[train.len()])?;
        let mut losses = Vec::with_capacity(steps);
        let mut mark = Instant::now();
        let mut lap = |phase: usize| -> Result<()> {
            if o.profile {
                b.synchronize()?;
                let now = Instant::now();
                phases[phase] += now - mark;
                mark = now;
            }
            Ok(())
        };
        for step in 0..steps {
            let first = step * o.batch;
            let rows = order.narrow(0, first, o.batch.min(train.len() - first))?;
            let (x, y) = (
                train_x.index_select(0, &rows)?,
                train_y.index_select(0, &rows)?,
            );
            lap(0)?;
            let forward = model.forward(&x, &y)?;
            lap(1)?;
            let grads = model.backward(&forward, &x, &y)?;
            lap(2)?;
            model.update(&grads)?;
            lap(3)?;
            losses.push(forward.loss);
        }
        b.synchronize()?;
        let train_time = start.elapsed();
        let start = Instant::now();
        let correct = model.correct(&test_x, &test_y)?;
        let eval = start.elapsed();
        let mut loss = 0.0;
        for l in &losses {
            loss += l.item()?;
        }
        let e = Epoch {
            loss: loss / steps as f64,
            correct,
            train: train_time,
            eval,
        };
        println!(
            "epoch {epoch:>3}/{}  loss {:.4}  test accuracy {:5.1} %  train {:6.1} ms  eval {:5.1} ms",
            o.epochs,
            e.loss,
            percent(e.correct, test.len()),
            ms(e.train),
            ms(e.eval)
        );
        epochs.push(e);
    }

    let Some(last) = epochs.last() else {
        return Ok(());
    };
    let total: Duration = epochs.iter().map(|e| e.train + e.eval).sum();
    let epoch = median(epochs.iter().map(|e| e.train + e.eval));
    let train_time = median(epochs.iter().map(|e| e.train));
    println!(
        "done: {} epochs in {:.2} s, test accuracy {:.1} % ({}/{})",
        epochs.len(),
        total.as_secs_f64(),
        percent(last.correct, test.len()),
        last.correct,
        test.len()
    );
    println!(
        "time per epoch (median): {:.1} ms = {steps} steps of {:.3} ms + evaluation {:.1} ms",
        ms(epoch),
        ms(train_time) / steps as f64,
        ms(median(epochs.iter().map(|e| e.eval)))
    );
    if o.profile {
        let all: Duration = phases.iter().sum();
        let split: Vec<String> = PHASES
            .iter()
            .zip(phases)
            .map(|(name, t)| {
                format!(
                    "{name} {:.0} %",
                    100.0 * t.as_secs_f64() / all.as_secs_f64()
                )
            })
            .collect();
        println!("time per step by phase: {}", split.join(", "));
    }
    cli::print_memory(&b);
    if let Some(path) = &o.json {
        std::fs::write(path, json(o, &b, &epochs, steps, test.len()))?;
    }
    Ok(())
}

/// The run as JSON: the options, and each epoch's loss (`null` when not finite), accuracy and
/// times in milliseconds.
fn json(o: &Options, b: &Backend, epochs: &[Epoch], steps: usize, test: usize) -> String {
    let rows: Vec<String> = epochs
        .iter()
        .map(|e| {
            format!(
                "{{\"loss\": {}, \"accuracy\": {}, \"train_ms\": {}, \"eval_ms\": {}}}",
                json_number(e.loss),
                e.correct as f64 / test as f64,
                ms(e.train),
                ms(e.eval)
            )
        })
        .collect();
    format!(
        "{{\"model\": \"lenet_digits\", \"backend\": \"{}\", \"threads\": {}, \"batch\": {}, \
         \"steps_per_epoch\": {steps}, \"epochs\": [\n  {}\n]}}\n",
        b.backend_type(),
        o.threads.map_or("null".to_string(), |t| t.to_string()),
        o.batch,
        rows.join(",\n  ")
    )
}

fn percent(part: usize, whole: usize) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}
