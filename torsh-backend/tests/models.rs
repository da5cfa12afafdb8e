//! The example models as integration tests: a few training steps of `examples/lenet_digits` and of
//! `examples/char_transformer` (in f32 and in mixed precision) on every available backend, whose
//! loss curves must follow the reference's and fall; a CPU run that trains the CNN to the accuracy
//! the example promises; and the transformer's hand-written gradients against finite differences.

mod common;

#[path = "../examples/lenet_digits/data.rs"]
#[allow(dead_code)]
mod data;
#[path = "../examples/lenet_digits/model.rs"]
#[allow(dead_code)]
mod model;

#[path = "../examples/char_transformer/data.rs"]
#[allow(dead_code)]
mod text;
#[path = "../examples/char_transformer/model.rs"]
#[allow(dead_code)]
mod transformer;

use data::{Digits, SplitMix64, SIDE};
use model::LeNet;
use text::Corpus;
use torsh_backend::{Backend, DType, LossScaler, MixedPrecisionConfig, Result, Tensor};
use transformer::Transformer;

/// Images and labels of a data set on a device.
type Set = (Tensor, Tensor);

/// The training and test sets on `b`, split as the example splits them.
fn digits_on(b: &Backend) -> Result<[Set; 2]> {
    let (train, test) = Digits::load()
        .expect("the shipped data parses")
        .split(0.2, 0);
    let upload = |d: &Digits| -> Result<Set> {
        Ok((
            b.from_slice(&d.pixels, &[d.len(), 1, SIDE, SIDE])?,
            b.from_slice(&d.labels, &[d.len()])?,
        ))
    };
    Ok([upload(&train)?, upload(&test)?])
}

/// Trains a fresh network on `b` for `steps` batches of 32 in the example's shuffled orders (a new
/// one each epoch, the last batch of an epoch short; gathered on the device, as the example does);
/// returns each step's loss and the network.
fn train(b: &Backend, steps: usize) -> Result<(Vec<f64>, LeNet, [Set; 2])> {
    let data = digits_on(b)?;
    let (images, labels) = &data[0];
    let n = labels.shape()[0];
    let mut model = LeNet::new(b, DType::F32, 0, 0.01)?;
    let mut shuffle = SplitMix64(1);
    let mut losses = Vec::with_capacity(steps);
    let (mut order, mut first) = (Vec::new(), n);
    for _ in 0..steps {
        if first == n {
            let perm = shuffle.permutation(n).into_iter().map(|i| i as i64);
            order = perm.collect();
            first = 0;
        }
        let len = 32.min(n - first);
        let rows = b.from_slice(&order[first..first + len], &[len])?;
        let (x, y) = (
            images.index_select(0, &rows)?,
            labels.index_select(0, &rows)?,
        );
        first += len;
        let forward = model.forward(&x, &y)?;
        let grads = model.backward(&forward, &x, &y)?;
        model.update(&grads)?;
        losses.push(forward.loss.item()?);
    }
    Ok((losses, model, data))
}

/// 24 steps on every backend: each step's loss within 1e-4 (relative) of the reference's, and the
/// mean loss of the last four steps at most 90 % of the first four's.
#[test]
fn lenet_digits_loss_curve_matches_the_reference_on_every_backend() -> Result<()> {
    let steps = 24;
    let mut reference = None;
    for b in common::backends() {
        let (losses, ..) = train(&b, steps)?;
        let label = b.backend_type().to_string();
        check_curve(&label, losses, &mut reference, (4, 0.9), 1e-4);
    }
    Ok(())
}

/// Checks one backend's losses: all finite, the mean of the last `window` at most `fall` times
/// the first `window`'s, and each within `bound` (relative) of the reference's, which is the
/// first curve checked (`reference` keeps it).
fn check_curve(
    label: &str,
    losses: Vec<f64>,
    reference: &mut Option<Vec<f64>>,
    (window, fall): (usize, f64),
    bound: f64,
) {
    assert!(
        losses.iter().all(|l| l.is_finite()),
        "{label}: losses {losses:?}"
    );
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    assert!(
        mean(&losses[losses.len() - window..]) < fall * mean(&losses[..window]),
        "{label}: the loss does not fall: {losses:?}"
    );
    let Some(want) = reference else {
        *reference = Some(losses);
        return;
    };
    for (step, (got, want)) in losses.iter().zip(want.iter()).enumerate() {
        let rel = (got - want).abs() / want.abs().max(1e-3);
        assert!(
            rel < bound,
            "{label} step {step}: loss {got}, the reference's {want} (relative error {rel:.2e})"
        );
    }
}

/// Ten epochs on the CPU reach 95 % test accuracy (the example reaches 97 % in 30).
#[test]
fn lenet_digits_reaches_95_percent_on_the_cpu() -> Result<()> {
    let b = Backend::cpu().build()?;
    let (losses, model, [_, (test_x, test_y)]) = train(&b, 10 * 45)?;
    let correct = model.correct(&test_x, &test_y)?;
    let accuracy = correct as f64 / test_y.shape()[0] as f64;
    assert!(
        accuracy >= 0.95,
        "test accuracy {:.1} % after 10 epochs (last loss {:?})",
        100.0 * accuracy,
        losses.last()
    );
    Ok(())
}

/// Batch and context of the transformer's short runs.
const BATCH: usize = 4;
const CONTEXT: usize = 16;

/// Trains a fresh transformer on `b` for `steps` batches of the example's text, in f32 or with
/// mixed precision in `precision` (and a loss scaler); returns each step's loss.
fn train_transformer(b: &Backend, precision: DType, steps: usize) -> Result<Vec<f64>> {
    let corpus = Corpus::load();
    let mut scaler = None;
    if precision != DType::F32 {
        let config = MixedPrecisionConfig {
            compute_dtype: precision,
            accum_dtype: DType::F32,
            scale_factor: 65536.0,
        };
        b.clone().enable_mixed_precision(config)?;
        scaler = Some(LossScaler::from_config(&config));
    }
    let mut model = Transformer::new(b, DType::F32, corpus.vocab(), CONTEXT, 0, 0.003)?;
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let [x, y] = text::batch(&corpus.train, BATCH, CONTEXT, 0, step as u64);
        let x = b.from_slice(&x, &[BATCH, CONTEXT])?;
        let y = b.from_slice(&y, &[BATCH, CONTEXT])?;
        let f = model.forward(&x, Some(&y))?;
        let seed = scaler.as_ref().map_or(1.0, LossScaler::get_scale);
        let mut grads = model.backward(&f, &y, seed)?;
        match scaler.as_mut() {
            Some(scaler) => assert!(
                model.update_scaled(&mut grads, scaler)?,
                "step {step} skipped"
            ),
            None => model.update(&grads)?,
        }
        losses.push(f.loss.expect("the forward had targets").item()?);
    }
    b.disable_mixed_precision();
    Ok(losses)
}

/// 12 steps of the transformer on every backend, in f32 and in mixed precision (bf16): each
/// step's loss within the dtype's bound (relative) of the reference's in the same precision, and
/// the mean loss of the last three steps at most 95 % of the first three's.
#[test]
fn char_transformer_loss_curves_match_the_reference_on_every_backend() -> Result<()> {
    let steps = 12;
    for (precision, bound) in [(DType::F32, 1e-4), (DType::BF16, 1e-2)] {
        let mut reference: Option<Vec<f64>> = None;
        for b in common::backends() {
            let losses = train_transformer(&b, precision, steps)?;
            let label = format!("{} {precision}", b.backend_type());
            check_curve(&label, losses, &mut reference, (3, 0.95), bound);
        }
    }
    Ok(())
}

/// The transformer's backward pass (written op by op in the example) against central finite
/// differences of its loss, in f64 on the reference: two elements of every parameter, on random
/// tokens of a 7-token vocabulary, 2 sequences of 5 (shorter than the context of 6, so the
/// position table has a row no gradient reaches).
#[test]
fn char_transformer_gradients_match_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    let (vocab, batch, len) = (7, 2, 5);
    let mut model = Transformer::new(&b, DType::F64, vocab, len + 1, 3, 0.01)?;
    // Random weights everywhere, so that no gradient is zero by symmetry (the layer norms start
    // as the identity and the biases at zero).
    for (i, p) in model.params.iter_mut().enumerate() {
        *p = b.random_seeded(
            p.shape(),
            DType::F64,
            torsh_backend::compute::Distribution::Normal {
                mean: 0.0,
                std: 0.5,
            },
            100 + i as u64,
        )?;
    }
    let ids = |seed: u64| -> Vec<i64> {
        (0..batch * len)
            .map(|i| (torsh_backend::rng::bits(seed, i as u64) % vocab as u64) as i64)
            .collect()
    };
    let x = b.from_slice(&ids(1), &[batch, len])?;
    let y = b.from_slice(&ids(2), &[batch, len])?;
    let loss = |m: &Transformer| -> Result<f64> {
        m.forward(&x, Some(&y))?.loss.expect("targets given").item()
    };
    let grads = model.backward(&model.forward(&x, Some(&y))?, &y, 1.0)?;
    assert_eq!(grads.len(), model.params.len());
    let h = 1e-5;
    for (i, g) in grads.iter().enumerate() {
        assert_eq!(g.shape(), model.params[i].shape(), "gradient {i}");
        let g = g.to_vec_f64()?;
        let n = g.len();
        for e in [(torsh_backend::rng::bits(7, i as u64) as usize) % n, n - 1] {
            let original = model.params[i].clone();
            let mut values = original.to_vec_f64()?;
            let at = |v: f64, values: &mut Vec<f64>| -> Result<Tensor> {
                values[e] = v;
                b.from_f64(values, original.shape(), DType::F64)
            };
            let x0 = values[e];
            model.params[i] = at(x0 + h, &mut values)?;
            let up = loss(&model)?;
            model.params[i] = at(x0 - h, &mut values)?;
            let down = loss(&model)?;
            model.params[i] = original;
            let numeric = (up - down) / (2.0 * h);
            let error = (g[e] - numeric).abs() / numeric.abs().max(1e-3);
            assert!(
                error < 1e-5,
                "parameter {i} element {e}: backward {}, finite difference {numeric}",
                g[e]
            );
        }
    }
    Ok(())
}
