//! Parity: every op on every available backend against the reference backend (f64 accumulation), with
//! identical random inputs, compared by relative error with per-dtype bounds. The case bodies live in
//! `torsh_backend::validation::cases`; this file runs them all.
//!
//! A backend that is unavailable is skipped with its reason printed, unless `TORSH_REQUIRE` names it,
//! in which case the test fails. A backend may answer `Unsupported` for a dtype other than f32 (the
//! answer is printed); every op must run in f32.

use torsh_backend::backends::reference::ReferenceBackend;
use torsh_backend::compute::*;
use torsh_backend::validation::{self, cases, parity_targets, run_case, Outcome};
use torsh_backend::{Backend, BackendType, DType, Result};

mod common;
use common::{forward_device, special_values, through_op};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Every parity case in every dtype it lists on every available backend, the cases shared among a
/// few threads. Reports every failure at once; `cargo run --release -- parity --op NAME` runs one op.
#[test]
fn every_case_on_every_backend_matches_the_reference() {
    let (targets, skipped) = parity_targets().unwrap_or_else(|reason| panic!("{reason}"));
    for s in &skipped {
        common::skipped(format!("parity: {s}"));
    }
    let reference = Backend::reference().expect("the reference backend is always available");
    let all = cases::all();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(case) = all.get(i) else { break };
                for target in &targets {
                    for &dtype in case.dtypes {
                        let r = run_case(case, target, &reference, dtype, validation::case_seed(i));
                        eprintln!(
                            "parity {} {dtype} on {}: {:?} (rel {:.2e})",
                            case.op, r.backend, r.outcome, r.rel_error
                        );
                        match &r.outcome {
                            Outcome::Passed => {}
                            // Other dtypes may be honestly unsupported (f64 on most GPUs); f32
                            // never may.
                            Outcome::Unsupported(_) if dtype != DType::F32 => {}
                            other => failures
                                .lock()
                                .unwrap()
                                .push(format!("{} {dtype} on {}: {other:?}", case.op, r.backend)),
                        }
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "parity failures:\n{}",
        failures.join("\n")
    );
}

#[test]
fn max_min_and_arg_forms_of_special_values_match_the_reference_exactly() {
    let (targets, skipped) = parity_targets().unwrap_or_else(|reason| panic!("{reason}"));
    for s in &skipped {
        eprintln!("special reductions: {s}");
    }
    let reference = Backend::reference().expect("the reference backend is always available");
    let failures: Vec<String> = targets
        .iter()
        .flat_map(|target| special_values::mismatches(target, &reference))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn torsh_require_names_known_backends() {
    for kind in validation::required_backends().expect("TORSH_REQUIRE must name known backends") {
        assert!(
            Backend::available().contains(&kind),
            "TORSH_REQUIRE names {kind}, which is unavailable"
        );
    }
}

/// Which fault the broken backend injects.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// `unary` returns `Ok` without writing its output.
    SkipUnary,
    /// `gemm` scales alpha by 1 + 1e-3.
    ScaleGemm,
    /// `attention` ignores the causal flag.
    IgnoreCausal,
    /// `reduce` drops the last element of each lane (sums one element less).
    ShortReduce,
}

/// The reference backend with one deliberate defect: proof that the parity suite can fail.
#[derive(Debug)]
struct Broken {
    inner: ReferenceBackend,
    fault: Fault,
}

impl Broken {
    /// Runs `desc` on the reference backend, with the fault where it applies.
    fn op<D: OpDesc>(&self, desc: &D) -> Result<()> {
        let any = desc as &dyn Any;
        match self.fault {
            Fault::SkipUnary if any.is::<UnaryDesc>() => return Ok(()),
            Fault::ScaleGemm => {
                if let Some(d) = any.downcast_ref::<GemmDesc>() {
                    return self.inner.gemm(&GemmDesc {
                        alpha: d.alpha * (1.0 + 1e-3),
                        ..d.clone()
                    });
                }
            }
            Fault::IgnoreCausal => {
                if let Some(d) = any.downcast_ref::<AttentionDesc>() {
                    return self.inner.attention(&AttentionDesc {
                        causal: false,
                        ..d.clone()
                    });
                }
            }
            Fault::ShortReduce => {
                if let Some(d) = any.downcast_ref::<ReduceDesc>() {
                    let shape = d.input.layout.shape();
                    if shape[d.axis] > 1 {
                        let short = d
                            .input
                            .layout
                            .narrow(d.axis as isize, 0, shape[d.axis] - 1)?;
                        return self.inner.reduce(&ReduceDesc {
                            input: StridedBuf {
                                ptr: d.input.ptr,
                                layout: short,
                            },
                            ..d.clone()
                        });
                    }
                }
            }
            _ => {}
        }
        desc.run(&self.inner)
    }
}

impl ComputeBackend for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn backend_type(&self) -> BackendType {
        BackendType::Cpu
    }
    forward_device!(inner);
    torsh_backend::for_each_op!(through_op);
}

fn broken(fault: Fault) -> Backend {
    Backend::from_compute(Box::new(Broken {
        inner: ReferenceBackend::new(BackendType::Cpu),
        fault,
    }))
    .unwrap()
}

#[test]
fn parity_catches_a_broken_backend() {
    let reference = Backend::reference().unwrap();
    for (fault, op, dtypes) in [
        (Fault::SkipUnary, "unary", &DType::FLOATS[..]),
        (Fault::ScaleGemm, "matmul", &[DType::F32, DType::F64][..]),
        (Fault::ScaleGemm, "gemm", &[DType::F32, DType::F64][..]),
        (Fault::IgnoreCausal, "attention", &DType::FLOATS[..]),
        (Fault::ShortReduce, "reduce", &DType::FLOATS[..]),
    ] {
        let target = broken(fault);
        let case = cases::find(op).unwrap();
        for &dtype in dtypes {
            let r = run_case(&case, &target, &reference, dtype, 42);
            assert!(
                matches!(r.outcome, Outcome::Failed(_)),
                "{fault:?} on {op} {dtype} was not caught: {:?}",
                r.outcome
            );
        }
    }
    // The same backend without a fault on the op passes.
    let r = run_case(
        &cases::find("softmax").unwrap(),
        &broken(Fault::SkipUnary),
        &reference,
        DType::F32,
        42,
    );
    assert!(r.passed(), "{:?}", r.outcome);
}

#[test]
fn gather_moves_elements_of_every_dtype_exactly() {
    // Gathers move elements as bits, so integer tensors gather too, on every backend alike.
    let reference = Backend::reference().unwrap();
    for b in common::backends() {
        let name = b.backend_type();
        for dtype in DType::ALL {
            let values: Vec<f64> = (0..35).map(|i| (i * 7 % 23) as f64 - 5.0).collect();
            let values: Vec<f64> = if dtype == DType::U8 {
                values.iter().map(|v| v + 5.0).collect()
            } else {
                values
            };
            let x = b.from_f64(&values, &[5, 7], dtype).unwrap();
            let ix: Vec<i32> = (0..15).map(|i| i * 5 % 7).collect();
            let ix = b.from_slice(&ix, &[5, 3]).unwrap();
            let rows = b.from_slice(&[4i64, 0, 4, 2], &[4]).unwrap();
            let got = [
                x.gather(1, &ix).unwrap().to_vec_f64().unwrap(),
                x.index_select(0, &rows).unwrap().to_vec_f64().unwrap(),
                x.t()
                    .unwrap()
                    .embedding(&rows.reshape(&[2, 2]).unwrap())
                    .unwrap()
                    .to_vec_f64()
                    .unwrap(),
            ];
            let xr = reference.from_f64(&values, &[5, 7], dtype).unwrap();
            let ixr = ix.to(&reference).unwrap();
            let rowsr = rows.to(&reference).unwrap();
            let want = [
                xr.gather(1, &ixr).unwrap().to_vec_f64().unwrap(),
                xr.index_select(0, &rowsr).unwrap().to_vec_f64().unwrap(),
                xr.t()
                    .unwrap()
                    .embedding(&rowsr.reshape(&[2, 2]).unwrap())
                    .unwrap()
                    .to_vec_f64()
                    .unwrap(),
            ];
            assert_eq!(got, want, "{name} {dtype}");
            // The row 4, column 0 element, looked up by each form.
            assert_eq!(got[1][0], values[28], "{name} {dtype}");
        }
    }
}
