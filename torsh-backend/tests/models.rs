//! The example models as integration tests: a few training steps of `examples/lenet_digits` on every
//! available backend, whose loss curve must follow the reference's and fall, and a CPU run that
//! trains it to the accuracy the example promises.

mod common;

#[path = "../examples/lenet_digits/data.rs"]
#[allow(dead_code)]
mod data;
#[path = "../examples/lenet_digits/model.rs"]
#[allow(dead_code)]
mod model;

use data::{Digits, SplitMix64, SIDE};
use model::LeNet;
use torsh_backend::{Backend, DType, Result, Tensor};

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
        assert!(
            losses.iter().all(|l| l.is_finite()),
            "{}: losses {losses:?}",
            b.backend_type()
        );
        let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
        assert!(
            mean(&losses[steps - 4..]) < 0.9 * mean(&losses[..4]),
            "{}: the loss does not fall: {losses:?}",
            b.backend_type()
        );
        let Some(want) = &reference else {
            reference = Some(losses);
            continue;
        };
        for (step, (got, want)) in losses.iter().zip(want).enumerate() {
            let rel = (got - want).abs() / want.abs().max(1e-3);
            assert!(
                rel < 1e-4,
                "{} step {step}: loss {got}, the reference's {want} (relative error {rel:.2e})",
                b.backend_type()
            );
        }
    }
    Ok(())
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
