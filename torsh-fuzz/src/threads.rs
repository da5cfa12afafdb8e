//! Threads sharing one backend: several threads run random valid ops on clones of one `Backend`
//! (with and without a memory pool) and check each against the reference, while another captures
//! graphs and launches them on new inputs, checking each launch against the same ops run eagerly.
//! A deadlock shows as a case that never ends, which the parent's watchdog reports.

use std::panic::{catch_unwind, AssertUnwindSafe};

use torsh_backend::prelude::*;

use crate::gen::{case_rng, Rng};
use crate::report::Outcome;
use crate::valid;

/// Worker threads per case, and valid ops per worker.
const WORKERS: u64 = 3;
const OPS: usize = 4;

/// Case `(seed, index)`: `WORKERS` threads of `OPS` ops each on `b`, compared with `reference`, and
/// (every other case) a thread capturing and launching graphs beside them.
pub fn run(seed: u64, index: u64, b: &Backend, reference: &Backend) -> (String, Outcome) {
    let graphs = index.is_multiple_of(2);
    let desc = format!(
        "{WORKERS} threads × {OPS} ops{}",
        if graphs {
            ", graph capture beside them"
        } else {
            ""
        }
    );
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for t in 0..WORKERS {
            let (b, reference) = (b.clone(), reference.clone());
            handles.push(s.spawn(move || {
                let mut rng = case_rng(seed ^ (t + 1).wrapping_mul(0xA24B_AED4_963E_E407), index);
                guarded(|| worker(&mut rng, &b, &reference))
            }));
        }
        if graphs {
            let b = b.clone();
            handles.push(s.spawn(move || {
                let mut rng = case_rng(seed ^ 0x5851_F42D_4C95_7F2D, index);
                guarded(|| graph_rounds(&mut rng, &b))
            }));
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Outcome::Panic("a thread panicked".into()))
            })
            .collect()
    });
    let outcome = outcomes
        .into_iter()
        .find(Outcome::failed)
        .unwrap_or(Outcome::Pass);
    (desc, outcome)
}

/// `f`'s outcome, or `Panic` with its message.
fn guarded(f: impl FnOnce() -> Outcome) -> Outcome {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Outcome::Panic(crate::panic_text(&*p)))
}

/// `OPS` valid ops (no large ones), each checked against the reference.
fn worker(rng: &mut Rng, b: &Backend, reference: &Backend) -> Outcome {
    let mut done = 0;
    while done < OPS {
        // A device-raised error goes to whichever thread reads first (see `Case::device_error`).
        let mut case = valid::generate(rng);
        while case.device_error {
            case = valid::generate(rng);
        }
        if case.op == "large" {
            continue;
        }
        done += 1;
        let outcome = valid::check(&case, b, reference);
        if outcome.failed() {
            return match outcome {
                Outcome::Mismatch(d) => Outcome::Mismatch(format!("{}: {d}", case.desc)),
                Outcome::Error(d) => Outcome::Error(format!("{}: {d}", case.desc)),
                Outcome::WrongError(d) => Outcome::WrongError(format!("{}: {d}", case.desc)),
                other => other,
            };
        }
    }
    Outcome::Pass
}

/// Captures `relu(a @ b)` with a softmax and a row sum, then launches it on new inputs and compares
/// each launch with the same ops run eagerly (bitwise: the same kernels run).
fn graph_rounds(rng: &mut Rng, b: &Backend) -> Outcome {
    let (m, k, n) = (rng.range(1, 40), rng.range(1, 40), rng.range(1, 40));
    let chain = |x: &Tensor, w: &Tensor| -> Result<Vec<Tensor>> {
        let h = x.matmul(w)?.relu()?.softmax(1)?;
        Ok(vec![h.sum(1, false)?, h])
    };
    let data = |rng: &mut Rng, len: usize| -> Vec<f64> { (0..len).map(|_| rng.normal()).collect() };
    let mut run = || -> Result<Option<String>> {
        let x = b.from_f64(&data(rng, m * k), &[m, k], DType::F32)?;
        let w = b.from_f64(&data(rng, k * n), &[k, n], DType::F32)?;
        let graph = match b.capture_graph(|| chain(&x, &w)) {
            Ok(g) => g,
            // One capture at a time per backend: another case's capture may hold it.
            Err(BackendError::GraphCapture { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        for round in 0..3 {
            let x2 = b.from_f64(&data(rng, m * k), &[m, k], DType::F32)?;
            let w2 = b.from_f64(&data(rng, k * n), &[k, n], DType::F32)?;
            let launched = b.launch_graph(&graph, &[x2.clone(), w2.clone()])?;
            let eager = chain(&x2, &w2)?;
            for (i, (l, e)) in launched.iter().zip(&eager).enumerate() {
                if l.to_bytes()? != e.to_bytes()? {
                    return Ok(Some(format!(
                        "launch {round} of a {m}×{k}×{n} graph: output {i} differs from eager"
                    )));
                }
            }
        }
        Ok(None)
    };
    match run() {
        Ok(None) => Outcome::Pass,
        Ok(Some(d)) => Outcome::Mismatch(d),
        Err(e) => Outcome::Error(format!("graph capture and launch: {e}")),
    }
}
