//! Parity: every op on every available backend against the reference backend (f64 accumulation), with
//! identical random inputs, compared by relative error with per-dtype bounds. The case bodies live in
//! `torsh_backend::validation::cases`; this file runs them, one test per op.
//!
//! A backend that is unavailable is skipped with its reason printed, unless `TORSH_REQUIRE` names it,
//! in which case the test fails. A backend may answer `Unsupported` for a dtype other than f32 (the
//! answer is printed); every op must run in f32.

use torsh_backend::backends::reference::ReferenceBackend;
use torsh_backend::compute::*;
use torsh_backend::validation::{self, cases, parity_targets, run_case, Outcome};
use torsh_backend::{Backend, BackendType, DType, DeviceInfo, Result};

mod common;
use common::special_values;

fn check_op(op: &str) {
    let case = cases::find(op).unwrap_or_else(|| panic!("no parity case named {op}"));
    let (targets, skipped) = parity_targets().unwrap_or_else(|reason| panic!("{reason}"));
    for s in &skipped {
        eprintln!("parity {op}: {s}");
    }
    let reference = Backend::reference().expect("the reference backend is always available");
    let index = cases::all().iter().position(|c| c.op == op).unwrap_or(0);
    let mut failures = Vec::new();
    for target in &targets {
        for &dtype in case.dtypes {
            let r = run_case(
                &case,
                target,
                &reference,
                dtype,
                validation::case_seed(index),
            );
            eprintln!(
                "parity {op} {dtype} on {}: {:?} (rel {:.2e})",
                r.backend, r.outcome, r.rel_error
            );
            match &r.outcome {
                Outcome::Passed => {}
                // Other dtypes may be honestly unsupported (f64 on most GPUs); f32 never may.
                Outcome::Unsupported(_) if dtype != DType::F32 => {}
                other => failures.push(format!("{op} {dtype} on {}: {other:?}", r.backend)),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "parity failures:\n{}",
        failures.join("\n")
    );
}

macro_rules! parity_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check_op(stringify!($name));
            }
        )*

        #[test]
        fn every_case_has_a_test() {
            let tested = [$(stringify!($name)),*];
            for case in cases::all() {
                assert!(tested.contains(&case.op), "parity case {} has no test in tests/parity.rs", case.op);
            }
        }
    };
}

parity_tests!(
    matmul,
    matmul_batched,
    gemm,
    gemv,
    conv2d,
    attention,
    softmax,
    layer_norm,
    batch_norm,
    unary,
    binary,
    reduce,
    pool2d,
    adam,
    unscale,
    cast_copy,
    random,
);

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

impl ComputeBackend for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn backend_type(&self) -> BackendType {
        BackendType::Cpu
    }
    fn init(&mut self) -> Result<()> {
        self.inner.init()
    }
    fn is_initialized(&self) -> bool {
        self.inner.is_initialized()
    }
    fn device_info(&self) -> DeviceInfo {
        self.inner.device_info()
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.inner.alloc(bytes)
    }
    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.inner.free(ptr)
    }
    fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.inner.copy_htod(dst, src)
    }
    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.inner.copy_dtoh(dst, src)
    }
    fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.inner.copy_dtod(dst, src, bytes)
    }
    fn gemm(&self, d: &GemmDesc) -> Result<()> {
        if self.fault == Fault::ScaleGemm {
            return self.inner.gemm(&GemmDesc {
                alpha: d.alpha * (1.0 + 1e-3),
                ..d.clone()
            });
        }
        self.inner.gemm(d)
    }
    fn gemv(&self, d: &GemvDesc) -> Result<()> {
        self.inner.gemv(d)
    }
    fn conv2d_forward(&self, d: &Conv2dDesc) -> Result<()> {
        self.inner.conv2d_forward(d)
    }
    fn attention(&self, d: &AttentionDesc) -> Result<()> {
        if self.fault == Fault::IgnoreCausal {
            return self.inner.attention(&AttentionDesc {
                causal: false,
                ..d.clone()
            });
        }
        self.inner.attention(d)
    }
    fn reduce(&self, d: &ReduceDesc) -> Result<()> {
        let shape = d.input.layout.shape();
        if self.fault == Fault::ShortReduce && shape[d.axis] > 1 {
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
        self.inner.reduce(d)
    }
    fn unary(&self, d: &UnaryDesc) -> Result<()> {
        if self.fault == Fault::SkipUnary {
            return Ok(());
        }
        self.inner.unary(d)
    }
    fn binary(&self, d: &BinaryDesc) -> Result<()> {
        self.inner.binary(d)
    }
    fn softmax(&self, d: &SoftmaxDesc) -> Result<()> {
        self.inner.softmax(d)
    }
    fn layer_norm(&self, d: &LayerNormDesc) -> Result<()> {
        self.inner.layer_norm(d)
    }
    fn batch_norm(&self, d: &BatchNormDesc) -> Result<()> {
        self.inner.batch_norm(d)
    }
    fn pool2d(&self, d: &Pool2dDesc) -> Result<()> {
        self.inner.pool2d(d)
    }
    fn adam_step(&self, d: &AdamDesc) -> Result<()> {
        self.inner.adam_step(d)
    }
    fn fill(&self, d: &FillDesc) -> Result<()> {
        self.inner.fill(d)
    }
    fn cast(&self, d: &CastDesc) -> Result<()> {
        self.inner.cast(d)
    }
    fn copy_strided(&self, d: &CopyDesc) -> Result<()> {
        self.inner.copy_strided(d)
    }
    fn random(&self, d: &RandomDesc) -> Result<()> {
        self.inner.random(d)
    }
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
