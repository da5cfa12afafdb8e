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

#[test]
fn comparisons_follow_ieee_on_every_backend() {
    // NaN compares unequal to everything, itself included; -0 == +0; ±∞ order at the ends.
    let values = [f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, 1.5];
    let n = values.len();
    for b in common::backends() {
        for dtype in DType::FLOATS {
            let x = b.from_f64(&values, &[n, 1], dtype).unwrap();
            let y = b.from_f64(&values, &[1, n], dtype).unwrap();
            let run = |op| b.compare(op, &x, &y).unwrap().to_vec_f64().unwrap();
            let (eq, ne, lt, ge) = (
                run(CompareOp::Eq),
                run(CompareOp::Ne),
                run(CompareOp::Lt),
                run(CompareOp::Ge),
            );
            for i in 0..n {
                for j in 0..n {
                    let (a, c) = (values[i], values[j]);
                    let at = i * n + j;
                    let name = format!("{} {dtype} {a} vs {c}", b.backend_type());
                    assert_eq!(eq[at], f64::from(u8::from(a == c)), "eq {name}");
                    assert_eq!(ne[at], f64::from(u8::from(a != c)), "ne {name}");
                    assert_eq!(lt[at], f64::from(u8::from(a < c)), "lt {name}");
                    assert_eq!(ge[at], f64::from(u8::from(a >= c)), "ge {name}");
                }
            }
            assert_eq!(eq[n + 2], 1.0, "-0 == +0 on {}", b.backend_type());
            let nan = x.isnan().unwrap().to_vec_f64().unwrap();
            let inf = x.isinf().unwrap().to_vec_f64().unwrap();
            let finite = x.isfinite().unwrap().to_vec_f64().unwrap();
            assert_eq!(nan, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0], "{dtype}");
            assert_eq!(inf, [0.0, 0.0, 0.0, 1.0, 1.0, 0.0], "{dtype}");
            assert_eq!(finite, [0.0, 1.0, 1.0, 0.0, 0.0, 1.0], "{dtype}");
            // Logical ops: NaN is true, either zero is false.
            let not = x.logical_not().unwrap().to_vec_f64().unwrap();
            assert_eq!(not, [0.0, 1.0, 1.0, 0.0, 0.0, 0.0], "{dtype}");
        }
    }
}

#[test]
fn masks_and_selections_land_at_any_byte_offset() {
    // Outputs of one byte (masks) or two (f16) that start inside a word: the neighbouring bytes,
    // poisoned, must stay as they were; an unwritten element would keep the poison.
    for b in common::backends() {
        let c = b.compute();
        let name = b.backend_type();
        for (len, offset) in [(1usize, 1usize), (5, 3), (9, 2), (13, 1)] {
            let values: Vec<f64> = (0..len).map(|i| (i % 3) as f64 - 1.0).collect();
            let x = b.from_f64(&values, &[len], DType::F16).unwrap();
            let buf = c.alloc(64).unwrap();
            c.copy_htod(buf, &[0xa5; 64]).unwrap();
            let out = DevicePtr(buf.0 + offset as u64);
            c.compare(&CompareDesc {
                op: CompareOp::Gt,
                dtype: DType::F16,
                lhs: StridedBuf::contiguous(x.data_ptr(), &[len]),
                rhs: Value::Scalar(0.0),
                output: out,
            })
            .unwrap();
            let mut got = vec![0u8; 64];
            c.copy_dtoh(&mut got, buf).unwrap();
            let want: Vec<u8> = values.iter().map(|&v| u8::from(v > 0.0)).collect();
            assert_eq!(
                &got[offset..offset + len],
                &want[..],
                "{name} mask at +{offset}"
            );
            assert!(got[..offset].iter().all(|&v| v == 0xa5), "{name} before");
            assert!(
                got[offset + len..].iter().all(|&v| v == 0xa5),
                "{name} after"
            );
            // where into f16 elements at an odd element offset: the mask picks x or 7.
            let mask = StridedBuf::contiguous(out, &[len]);
            let dst = DevicePtr(buf.0 + 32 + 2 * offset as u64);
            c.copy_htod(DevicePtr(buf.0 + 32), &[0x5a; 32]).unwrap();
            c.where_(&WhereDesc {
                dtype: DType::F16,
                cond_dtype: DType::U8,
                cond: mask,
                on_true: Value::Tensor(StridedBuf::contiguous(x.data_ptr(), &[len])),
                on_false: Value::Scalar(7.0),
                output: dst,
            })
            .unwrap();
            c.copy_dtoh(&mut got[32..], DevicePtr(buf.0 + 32)).unwrap();
            let at = 32 + 2 * offset;
            assert!(
                got[32..at].iter().all(|&v| v == 0x5a),
                "{name} where before"
            );
            assert!(
                got[at + 2 * len..].iter().all(|&v| v == 0x5a),
                "{name} where after"
            );
            let picked: Vec<f64> = got[at..at + 2 * len]
                .chunks_exact(2)
                .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f64())
                .collect();
            let want: Vec<f64> = values
                .iter()
                .map(|&v| if v > 0.0 { v } else { 7.0 })
                .collect();
            assert_eq!(picked, want, "{name} where at +{offset}");
            c.free(buf).unwrap();
        }
    }
}

#[test]
fn integer_scans_carry_and_wrap_as_the_reference_does() {
    // Sums crossing 2^32 both ways and products of wide factors exercise the carries of kernels
    // that hold an i64 in two words; the last product wraps past 2^63.
    let values: [i64; 8] = [
        0xffff_fff0,
        0x20,
        -0x1_0000_0000,
        -7,
        0x7fff_ffff,
        3,
        -0x0001_2345_6789,
        0x3_0000_0001,
    ];
    let reference = Backend::reference().unwrap();
    let host = |t: torsh_backend::Tensor| t.to_vec::<i64>().unwrap();
    let x = reference.from_slice(&values, &[2, 4]).unwrap();
    let want = [host(x.cumsum(1).unwrap()), host(x.cumprod(1).unwrap())];
    let sums: Vec<i64> = values[..4]
        .iter()
        .scan(0i64, |acc, &v| {
            *acc = acc.wrapping_add(v);
            Some(*acc)
        })
        .collect();
    assert_eq!(want[0][..4], sums[..]);
    for b in common::backends() {
        let x = b.from_slice(&values, &[2, 4]).unwrap();
        let got = [host(x.cumsum(1).unwrap()), host(x.cumprod(1).unwrap())];
        assert_eq!(got, want, "{}", b.backend_type());
        let xt = b.from_slice(&values, &[4, 2]).unwrap().t().unwrap();
        let got = host(xt.cumprod(-1).unwrap());
        let want_t = host(
            reference
                .from_slice(&values, &[4, 2])
                .unwrap()
                .t()
                .unwrap()
                .cumprod(-1)
                .unwrap(),
        );
        assert_eq!(got, want_t, "{} transposed", b.backend_type());
    }
}

#[test]
fn sorts_order_special_values_as_pytorch_on_every_backend() {
    // NaN after every number (first when descending), -0 equal to +0 (input order kept), stable.
    let nan = f64::NAN;
    let values = [
        0.0,
        nan,
        -0.0,
        1.0,
        f64::NEG_INFINITY,
        -1.0,
        nan,
        f64::INFINITY,
    ];
    let ascending: [i64; 8] = [4, 5, 0, 2, 3, 7, 1, 6];
    let descending: [i64; 8] = [1, 6, 7, 3, 0, 2, 5, 4];
    for b in common::backends() {
        for dtype in DType::FLOATS {
            let x = b.from_f64(&values, &[8], dtype).unwrap();
            let name = format!("{} {dtype}", b.backend_type());
            let up = x.argsort(0, false).unwrap().to_vec::<i64>().unwrap();
            assert_eq!(up, ascending, "{name}");
            let (top, down) = x.sort(0, true).unwrap();
            assert_eq!(down.to_vec::<i64>().unwrap(), descending, "{name}");
            let top = top.to_vec_f64().unwrap();
            assert!(top[0].is_nan() && top[1].is_nan(), "{name}: {top:?}");
            assert_eq!(
                top[2..],
                [f64::INFINITY, 1.0, 0.0, -0.0, -1.0, f64::NEG_INFINITY]
            );
            // The zeros keep their signs (values move as they are): +0 (position 0) first.
            assert!(
                top[4].is_sign_positive() && top[5].is_sign_negative(),
                "{name}"
            );
            let (best, at) = x.topk(3, 0, true).unwrap();
            assert_eq!(at.to_vec::<i64>().unwrap(), [1, 6, 7], "{name}");
            assert_eq!(best.shape(), &[3]);
        }
    }
}

#[test]
fn scalar_operands_round_to_the_dtype_before_the_op() {
    // 1 + s, where s rounds to exactly half an ulp of 1 in the dtype: rounded first, the sum is a
    // tie and rounds to even (1); computed with the unrounded s, it lands above the tie.
    let cases = [
        (DType::F32, -24, -50),
        (DType::F16, -11, -22),
        (DType::BF16, -8, -19),
    ];
    for b in common::backends() {
        for (dtype, half_ulp, tail) in cases {
            let (half, s) = (2f64.powi(half_ulp), 2f64.powi(half_ulp) + 2f64.powi(tail));
            let x = b.from_f64(&[1.0, -3.0, 2.0], &[3], dtype).unwrap();
            let got = x.add_scalar(s).unwrap().to_vec_f64().unwrap();
            assert_eq!(got[0], 1.0, "{} {dtype}", b.backend_type());
            // The same through the clamp's in-place second bound.
            let got = x.clamp(Some(-5.0), Some(s)).unwrap().to_vec_f64().unwrap();
            assert_eq!(got, [half, -3.0, half], "{} {dtype}", b.backend_type());
        }
    }
}
