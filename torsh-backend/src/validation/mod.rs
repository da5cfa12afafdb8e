//! The parity suite: every op, run on a backend and on the reference with identical random inputs, and
//! compared by relative error with per-dtype bounds ([`tolerance`]).
//!
//! Each op has one generic body in [`cases`] that builds its inputs through an [`Inputs`] generator and
//! returns its outputs. [`run_case`] runs the body twice from the same seed — once on the backend under
//! test, once on the reference — and compares every output. `tests/parity.rs` and the CLI's `parity`
//! command both run these bodies, so a new backend joins by being listed in [`crate::Backend::available`].
//!
//! `TORSH_REQUIRE=cuda,webgpu` (any list of backend names) makes a missing backend an error in
//! [`parity_targets`] instead of a skip.

pub mod cases;
pub mod cnn;
mod compare;

pub use compare::{compare, Comparison};

use crate::backend::Backend;
use crate::device::BackendType;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::rng::HostRng;
use crate::tensor::Tensor;

/// The relative-error bound of a dtype: f64 1e-12, f32 1e-5, f16/bf16 1e-2, integers exact.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 | DType::BF16 => 1e-2,
        DType::I32 | DType::I64 | DType::U8 => 0.0,
    }
}

/// Random inputs for one run of a case, drawn from a seeded host generator so that two runs with the same
/// seed (on two backends) get identical values.
#[derive(Debug)]
pub struct Inputs<'a> {
    backend: &'a Backend,
    dtype: DType,
    rng: HostRng,
}

impl<'a> Inputs<'a> {
    /// A generator for `backend` producing tensors of `dtype` from stream `seed`.
    pub fn new(backend: &'a Backend, dtype: DType, seed: u64) -> Self {
        Inputs {
            backend,
            dtype,
            rng: HostRng::new(seed),
        }
    }

    /// The backend under test.
    pub fn backend(&self) -> &'a Backend {
        self.backend
    }

    /// The dtype under test.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Standard normal values.
    pub fn normal(&mut self, shape: &[usize]) -> Result<Tensor> {
        let n = crate::shape::checked_numel("inputs", shape)?;
        let v: Vec<f64> = (0..n).map(|_| self.rng.normal()).collect();
        self.backend.from_f64(&v, shape, self.dtype)
    }

    /// Uniform values on `[low, high)`.
    pub fn uniform(&mut self, shape: &[usize], low: f64, high: f64) -> Result<Tensor> {
        let n = crate::shape::checked_numel("inputs", shape)?;
        let v = self.rng.uniform_vec(n, low, high);
        self.backend.from_f64(&v, shape, self.dtype)
    }

    /// Distinct small integers in random order (exact in every float dtype when there are at most 256),
    /// so index reductions have no ties.
    pub fn distinct(&mut self, shape: &[usize]) -> Result<Tensor> {
        let n = crate::shape::checked_numel("inputs", shape)?;
        let v: Vec<f64> = self
            .rng
            .permutation(n)
            .into_iter()
            .map(|i| i as f64 - (n / 2) as f64)
            .collect();
        self.backend.from_f64(&v, shape, self.dtype)
    }

    /// Random indices in `0..high` of the index dtype `dtype`, repeats included; with at least two
    /// elements, the first is 0 and the last `high - 1` (the boundaries).
    pub fn indices(&mut self, shape: &[usize], high: usize, dtype: DType) -> Result<Tensor> {
        let n = crate::shape::checked_numel("inputs", shape)?;
        let mut v: Vec<f64> = (0..n)
            .map(|_| (self.rng.next_u64() % high.max(1) as u64) as f64)
            .collect();
        if n >= 2 {
            v[0] = 0.0;
            v[n - 1] = (high.max(1) - 1) as f64;
        }
        self.backend.from_f64(&v, shape, dtype)
    }

    /// A random seed for ops that take one.
    pub fn seed(&mut self) -> u64 {
        self.rng.next_u64()
    }
}

/// One op's parity test: a name, the dtypes it runs in, and its body.
#[derive(Clone, Copy)]
pub struct ParityCase {
    /// The op's name in reports.
    pub op: &'static str,
    /// The dtypes to check.
    pub dtypes: &'static [DType],
    /// Builds inputs, runs the op, returns every output to compare.
    pub body: fn(&mut Inputs) -> Result<Vec<Tensor>>,
}

impl std::fmt::Debug for ParityCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParityCase")
            .field("op", &self.op)
            .field("dtypes", &self.dtypes)
            .finish()
    }
}

/// How a parity check ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every output within the bound.
    Passed,
    /// An output exceeded the bound (or had NaN where the reference has none, or a wrong shape).
    Failed(String),
    /// The backend answered `Unsupported` for this op and dtype.
    Unsupported(String),
    /// The op failed on the backend or on the reference with another error.
    Error(String),
}

/// The result of one op, dtype and backend.
#[derive(Clone, Debug)]
pub struct ParityResult {
    /// The op.
    pub op: &'static str,
    /// The dtype.
    pub dtype: DType,
    /// The backend under test.
    pub backend: BackendType,
    /// Worst relative error over the outputs (`‖out − ref‖ / ‖ref‖`), NaN when nothing was compared.
    pub rel_error: f64,
    /// Worst absolute error over the outputs.
    pub max_abs_error: f64,
    /// The bound applied.
    pub bound: f64,
    /// The outcome.
    pub outcome: Outcome,
}

impl ParityResult {
    /// True for `Passed`.
    pub fn passed(&self) -> bool {
        self.outcome == Outcome::Passed
    }
}

/// Runs `case` in `dtype` on `target` and on `reference` from the same `seed` and compares every output.
pub fn run_case(
    case: &ParityCase,
    target: &Backend,
    reference: &Backend,
    dtype: DType,
    seed: u64,
) -> ParityResult {
    let mut result = ParityResult {
        op: case.op,
        dtype,
        backend: target.backend_type(),
        rel_error: f64::NAN,
        max_abs_error: f64::NAN,
        bound: tolerance(dtype),
        outcome: Outcome::Passed,
    };
    let expected =
        match (case.body)(&mut Inputs::new(reference, dtype, seed)).and_then(|ts| to_host(&ts)) {
            Ok(v) => v,
            Err(e) => {
                result.outcome = Outcome::Error(format!("reference failed: {e}"));
                return result;
            }
        };
    let got = match (case.body)(&mut Inputs::new(target, dtype, seed)).and_then(|ts| to_host(&ts)) {
        Ok(v) => v,
        Err(e @ BackendError::Unsupported { .. }) => {
            result.outcome = Outcome::Unsupported(e.to_string());
            return result;
        }
        Err(e) => {
            result.outcome = Outcome::Error(e.to_string());
            return result;
        }
    };
    if got.len() != expected.len() {
        result.outcome = Outcome::Failed(format!(
            "{} outputs, reference has {}",
            got.len(),
            expected.len()
        ));
        return result;
    }
    let (mut rel, mut abs) = (0.0f64, 0.0f64);
    for (i, ((gs, g, gd), (es, e, ed))) in got.iter().zip(&expected).enumerate() {
        if gs != es || gd != ed {
            result.outcome = Outcome::Failed(format!(
                "output {i}: shape {gs:?} {gd} vs reference {es:?} {ed}"
            ));
            return result;
        }
        // Each output is judged by its own dtype's bound (index outputs are exact).
        let c = compare(g, e);
        rel = rel.max(c.rel_error);
        abs = abs.max(c.max_abs_error);
        if !c.within(tolerance(*gd)) {
            result.outcome = Outcome::Failed(format!("output {i} {es:?}: {c}"));
        }
    }
    result.rel_error = rel;
    result.max_abs_error = abs;
    result
}

type HostOutput = (Vec<usize>, Vec<f64>, DType);

fn to_host(ts: &[Tensor]) -> Result<Vec<HostOutput>> {
    ts.iter()
        .map(|t| Ok((t.shape().to_vec(), t.to_vec_f64()?, t.dtype())))
        .collect()
}

/// The seed `run_all` uses for case number `i`: fixed, so a failure reproduces.
pub fn case_seed(i: usize) -> u64 {
    0x7061_7269_7479 ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Runs every case in every dtype it lists on every target.
pub fn run_all(targets: &[Backend]) -> Result<Vec<ParityResult>> {
    let reference = Backend::reference()?;
    let mut out = Vec::new();
    for target in targets {
        for (i, case) in cases::all().iter().enumerate() {
            for &dtype in case.dtypes {
                out.push(run_case(case, target, &reference, dtype, case_seed(i)));
            }
        }
    }
    Ok(out)
}

/// Names in `TORSH_REQUIRE` that are not backends: `nvrtc` requires the CUDA kernel compile check of
/// `tests/cuda.rs` (which needs only NVRTC, no GPU); `cudnn` requires cuDNN to serve every conv2d of
/// the cuDNN test there.
pub const REQUIRE_TOKENS: &[&str] = &["nvrtc", "cudnn"];

/// Backend kinds named in `TORSH_REQUIRE` (comma-separated; names that are neither a backend nor one of
/// [`REQUIRE_TOKENS`] are an error).
pub fn required_backends() -> std::result::Result<Vec<BackendType>, String> {
    let Ok(list) = std::env::var("TORSH_REQUIRE") else {
        return Ok(Vec::new());
    };
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && !REQUIRE_TOKENS.contains(s))
        .map(|s| {
            BackendType::from_name(s)
                .ok_or_else(|| format!("TORSH_REQUIRE names an unknown backend `{s}`"))
        })
        .collect()
}

/// The backends the parity suite checks: every available kind but the reference itself. Kinds that are
/// unavailable are reported in the second list with their reason; a kind named in `TORSH_REQUIRE` that
/// is unavailable makes this an `Err` with that reason.
pub fn parity_targets() -> std::result::Result<(Vec<Backend>, Vec<String>), String> {
    let required = required_backends()?;
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    for status in Backend::probe() {
        let kind = status.backend_type;
        if kind == BackendType::Reference {
            continue;
        }
        let made = status
            .availability
            .and_then(|()| Backend::new(kind).map_err(|e| e.to_string()));
        match made {
            Ok(b) => targets.push(b),
            Err(reason) if required.contains(&kind) => {
                return Err(format!(
                    "TORSH_REQUIRE names {kind}, which is unavailable: {reason}"
                ))
            }
            Err(reason) => skipped.push(format!("{kind}: skipped ({reason})")),
        }
    }
    Ok((targets, skipped))
}
