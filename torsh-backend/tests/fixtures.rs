//! The reference backend against an outside oracle: fixtures computed in float64 by a NumPy script
//! (`tests/fixtures/generate.py`, which documents the file format) from each op's definition with
//! PyTorch semantics. The JSON files are committed; this test needs no Python.
//!
//! Every family runs at `F64` with a tight bound (relative 2-norm error and max abs error both within
//! 1e-12, scaled by the reference's magnitude) and once more at `F32` with 1e-5, exercising the
//! rounding path. Index outputs (argmax/argmin) must match exactly. NaN never passes.
//!
//! The workspace enables serde_json's `float_roundtrip`, so every value reads back exactly as written.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use torsh_backend::prelude::*;

/// A tensor as stored in a fixture: row-major values.
#[derive(Debug, Deserialize)]
struct Array {
    shape: Vec<usize>,
    data: Vec<f64>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    #[serde(default)]
    params: serde_json::Map<String, Value>,
    inputs: BTreeMap<String, Array>,
    expected: BTreeMap<String, Array>,
}

#[derive(Debug, Deserialize)]
struct Fixture {
    family: String,
    cases: Vec<Case>,
}

fn load(family: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{family}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let fixture: Fixture = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("cannot parse {}: {e}", path.display()));
    assert_eq!(fixture.family, family, "{}", path.display());
    assert!(!fixture.cases.is_empty(), "{} has no cases", path.display());
    fixture
}

/// One case on one backend at one dtype: builds inputs and reads params.
struct Ctx<'a> {
    backend: &'a Backend,
    dtype: DType,
    case: &'a Case,
}

impl Ctx<'_> {
    fn input(&self, name: &str) -> Result<Tensor> {
        let a = self
            .case
            .inputs
            .get(name)
            .unwrap_or_else(|| panic!("case {}: no input {name:?}", self.case.name));
        self.backend.from_f64(&a.data, &a.shape, self.dtype)
    }

    /// An input of 0s and 1s, as a `U8` mask.
    fn mask_input(&self, name: &str) -> Result<Tensor> {
        let a = self
            .case
            .inputs
            .get(name)
            .unwrap_or_else(|| panic!("case {}: no input {name:?}", self.case.name));
        self.backend.from_f64(&a.data, &a.shape, DType::U8)
    }

    /// An input of integers, as an `I64` index tensor.
    fn index_input(&self, name: &str) -> Result<Tensor> {
        let a = self
            .case
            .inputs
            .get(name)
            .unwrap_or_else(|| panic!("case {}: no input {name:?}", self.case.name));
        self.backend.from_f64(&a.data, &a.shape, DType::I64)
    }

    fn opt_input(&self, name: &str) -> Result<Option<Tensor>> {
        if self.case.inputs.contains_key(name) {
            self.input(name).map(Some)
        } else {
            Ok(None)
        }
    }

    fn param(&self, name: &str) -> &Value {
        self.case
            .params
            .get(name)
            .unwrap_or_else(|| panic!("case {}: no param {name:?}", self.case.name))
    }

    fn f64(&self, name: &str) -> f64 {
        self.param(name)
            .as_f64()
            .unwrap_or_else(|| panic!("case {}: param {name:?} is not a number", self.case.name))
    }

    fn opt_f64(&self, name: &str) -> Option<f64> {
        match self.case.params.get(name) {
            None | Some(Value::Null) => None,
            Some(_) => Some(self.f64(name)),
        }
    }

    fn int(&self, name: &str) -> i64 {
        self.param(name)
            .as_i64()
            .unwrap_or_else(|| panic!("case {}: param {name:?} is not an integer", self.case.name))
    }

    fn flag(&self, name: &str) -> bool {
        self.param(name)
            .as_bool()
            .unwrap_or_else(|| panic!("case {}: param {name:?} is not a bool", self.case.name))
    }

    fn pair(&self, name: &str) -> [usize; 2] {
        let v: Vec<usize> = serde_json::from_value(self.param(name).clone())
            .unwrap_or_else(|e| panic!("case {}: param {name:?}: {e}", self.case.name));
        assert_eq!(v.len(), 2, "case {}: param {name:?}", self.case.name);
        [v[0], v[1]]
    }

    fn dims(&self, name: &str) -> Vec<usize> {
        serde_json::from_value(self.param(name).clone())
            .unwrap_or_else(|e| panic!("case {}: param {name:?}: {e}", self.case.name))
    }
}

/// Worst-case allowed error for a dtype: `F64` 1e-12, `F32` 1e-5 (relative).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        other => panic!("no tolerance for {other}"),
    }
}

/// The multi-index of flat position `i` in a row-major `shape`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = i % n;
            i /= n;
        }
    }
    idx
}

/// Compares `got` (a floating tensor already read back as f64) with `want`: relative 2-norm error
/// `‖got − want‖ / ‖want‖ ≤ tol` and `max |got − want| ≤ tol · max(1, max |want|)`. Any non-finite
/// value in `got` fails. The message names the worst element.
fn compare_values(
    what: &str,
    got_shape: &[usize],
    got: &[f64],
    want: &Array,
    tol: f64,
) -> std::result::Result<(), String> {
    if got_shape != want.shape.as_slice() {
        return Err(format!(
            "{what}: shape {got_shape:?}, expected {:?}",
            want.shape
        ));
    }
    if got.len() != want.data.len() {
        return Err(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.data.len()
        ));
    }
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        return Err(format!(
            "{what}: non-finite value {} at {:?} (expected {:e})",
            got[i],
            unravel(i, got_shape),
            want.data[i]
        ));
    }
    let (mut diff2, mut ref2, mut ref_max) = (0.0f64, 0.0f64, 0.0f64);
    let (mut worst, mut worst_abs) = (0usize, -1.0f64);
    for (i, (&g, &w)) in got.iter().zip(&want.data).enumerate() {
        let d = (g - w).abs();
        diff2 += d * d;
        ref2 += w * w;
        ref_max = ref_max.max(w.abs());
        if d > worst_abs || d.is_nan() {
            worst = i;
            worst_abs = d;
        }
    }
    let rel = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    };
    let abs_bound = tol * ref_max.max(1.0);
    // Written so that a NaN in either measure fails.
    if rel <= tol && worst_abs <= abs_bound {
        Ok(())
    } else {
        Err(format!(
            "{what}: relative error {rel:.3e} (bound {tol:.0e}), max abs error {worst_abs:.3e} (bound {abs_bound:.3e}); worst element {:?}: got {:.17e}, expected {:.17e}",
            unravel(worst, got_shape),
            got[worst],
            want.data[worst]
        ))
    }
}

/// Compares an output tensor with the expected array: exactly for integer outputs (`I64` indices,
/// `U8` masks), else by [`compare_values`] at `tol`.
fn compare(what: &str, got: &Tensor, want: &Array, tol: f64) -> std::result::Result<(), String> {
    if !got.dtype().is_float() {
        let values = got.to_vec_f64().map_err(|e| format!("{what}: {e}"))?;
        if got.shape() != want.shape.as_slice() {
            return Err(format!(
                "{what}: shape {:?}, expected {:?}",
                got.shape(),
                want.shape
            ));
        }
        if let Some(i) = values.iter().zip(&want.data).position(|(&g, &w)| g != w) {
            return Err(format!(
                "{what}: index {} at {:?}, expected {}",
                values[i],
                unravel(i, got.shape()),
                want.data[i]
            ));
        }
        return Ok(());
    }
    let values = got.to_vec_f64().map_err(|e| format!("{what}: {e}"))?;
    compare_values(what, got.shape(), &values, want, tol)
}

type Outputs = Vec<(String, Tensor)>;

/// Runs every case of `family` at F64 and F32 through `run`, which returns named outputs; each must
/// match the expected array of the same name, and every expected array must be produced. Panics with
/// every failure listed.
fn run_family(family: &str, run: impl Fn(&Ctx) -> Result<Outputs>) {
    let fixture = load(family);
    let backend = Backend::reference().expect("reference backend");
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for dtype in [DType::F64, DType::F32] {
        let tol = tolerance(dtype);
        for case in &fixture.cases {
            let ctx = Ctx {
                backend: &backend,
                dtype,
                case,
            };
            let label = format!("{family}/{} [{dtype}]", case.name);
            let outputs = match run(&ctx) {
                Ok(outputs) => outputs,
                Err(e) => {
                    failures.push(format!("{label}: error: {e}"));
                    continue;
                }
            };
            let mut seen = Vec::new();
            for (name, tensor) in &outputs {
                let what = format!("{label} output {name:?}");
                match case.expected.get(name) {
                    None => failures.push(format!("{what}: not in the fixture")),
                    Some(want) => {
                        if tensor.dtype().is_float() && tensor.dtype() != dtype {
                            failures.push(format!("{what}: dtype {}", tensor.dtype()));
                        } else if let Err(msg) = compare(&what, tensor, want, tol) {
                            failures.push(msg);
                        }
                        checked += 1;
                    }
                }
                seen.push(name.as_str());
            }
            for name in case.expected.keys() {
                if !seen.contains(&name.as_str()) {
                    failures.push(format!(
                        "{label}: expected output {name:?} was not produced"
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} comparisons failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn out(t: Tensor) -> Result<Outputs> {
    Ok(vec![("out".to_string(), t)])
}

#[test]
fn matmul() {
    run_family("matmul", |c| {
        let (mut a, mut b) = (c.input("a")?, c.input("b")?);
        if c.flag("transpose_a") {
            a = a.transpose(-1, -2)?;
        }
        if c.flag("transpose_b") {
            b = b.transpose(-1, -2)?;
        }
        out(a.matmul(&b)?)
    });
}

#[test]
fn gemm() {
    run_family("gemm", |c| {
        let (a, b, cc) = (c.input("a")?, c.input("b")?, c.input("c")?);
        let (alpha, beta) = (c.f64("alpha") as f32, c.f64("beta") as f32);
        out(c.backend.gemm(&a, &b, alpha, &cc, beta)?)
    });
}

#[test]
fn gemv() {
    run_family("gemv", |c| {
        let (a, x, y) = (c.input("a")?, c.input("x")?, c.input("y")?);
        let (alpha, beta) = (c.f64("alpha") as f32, c.f64("beta") as f32);
        out(c.backend.gemv(&a, &x, alpha, &y, beta)?)
    });
}

#[test]
fn conv2d() {
    run_family("conv2d", |c| {
        let (x, w, bias) = (c.input("x")?, c.input("w")?, c.opt_input("bias")?);
        let config = ConvConfig {
            stride: c.pair("stride"),
            padding: c.pair("padding"),
            dilation: c.pair("dilation"),
            groups: c.int("groups") as usize,
        };
        out(c.backend.conv2d_with_bias(&x, &w, bias.as_ref(), config)?)
    });
}

#[test]
fn attention() {
    run_family("attention", |c| {
        let (q, k, v) = (c.input("q")?, c.input("k")?, c.input("v")?);
        let causal = c.flag("causal");
        let o = match c.opt_f64("scale") {
            None => q.attention(&k, &v, causal)?,
            Some(scale) => c.backend.attention_with_scale(&q, &k, &v, causal, scale)?,
        };
        out(o)
    });
}

#[test]
fn batch_norm() {
    run_family("batch_norm", |c| {
        let x = c.input("x")?;
        let weight = c.opt_input("weight")?;
        let bias = c.opt_input("bias")?;
        let running_mean = c.opt_input("running_mean")?;
        let running_var = c.opt_input("running_var")?;
        let o = x.batch_norm(BatchNormConfig {
            weight: weight.as_ref(),
            bias: bias.as_ref(),
            running_mean: running_mean.as_ref(),
            running_var: running_var.as_ref(),
            training: c.flag("training"),
            momentum: c.opt_f64("momentum"),
            eps: c.opt_f64("eps"),
        })?;
        let mut outputs = vec![("out".to_string(), o)];
        outputs.extend(running_mean.map(|t| ("running_mean".to_string(), t)));
        outputs.extend(running_var.map(|t| ("running_var".to_string(), t)));
        Ok(outputs)
    });
}

#[test]
fn layer_norm() {
    run_family("layer_norm", |c| {
        let x = c.input("x")?;
        let (weight, bias) = (c.opt_input("weight")?, c.opt_input("bias")?);
        out(x.layer_norm(
            &c.dims("normalized_shape"),
            weight.as_ref(),
            bias.as_ref(),
            c.f64("eps"),
        )?)
    });
}

#[test]
fn softmax() {
    run_family("softmax", |c| {
        let x = c.input("x")?;
        let axis = c.int("axis") as isize;
        Ok(vec![
            ("softmax".to_string(), x.softmax(axis)?),
            ("log_softmax".to_string(), x.log_softmax(axis)?),
        ])
    });
}

#[test]
fn reduce() {
    run_family("reduce", |c| {
        let x = c.input("x")?;
        let (axis, keepdim) = (c.int("axis") as isize, c.flag("keepdim"));
        let ops = [
            ("sum", ReduceOp::Sum),
            ("mean", ReduceOp::Mean),
            ("max", ReduceOp::Max),
            ("min", ReduceOp::Min),
            ("var0", ReduceOp::Var { correction: 0 }),
            ("var1", ReduceOp::Var { correction: 1 }),
            ("argmax", ReduceOp::ArgMax),
            ("argmin", ReduceOp::ArgMin),
        ];
        let mut outputs = Vec::new();
        for (name, op) in ops {
            outputs.push((name.to_string(), c.backend.reduce(op, &x, axis, keepdim)?));
        }
        // The named methods must agree with `reduce`.
        outputs.push(("sum".to_string(), x.sum(axis, keepdim)?));
        outputs.push(("mean".to_string(), x.mean(axis, keepdim)?));
        outputs.push(("max".to_string(), x.max(axis, keepdim)?));
        outputs.push(("min".to_string(), x.min(axis, keepdim)?));
        outputs.push(("var1".to_string(), x.var(axis, 1, keepdim)?));
        outputs.push(("argmax".to_string(), x.argmax(axis, keepdim)?));
        outputs.push(("argmin".to_string(), x.argmin(axis, keepdim)?));
        Ok(outputs)
    });
}

#[test]
fn pool() {
    run_family("pool", |c| {
        let x = c.input("x")?;
        let config = Pool2dConfig {
            kernel: c.pair("kernel"),
            stride: c.pair("stride"),
            padding: c.pair("padding"),
            count_include_pad: true,
        };
        let excl = Pool2dConfig {
            count_include_pad: false,
            ..config
        };
        Ok(vec![
            ("max".to_string(), x.max_pool2d(config)?),
            ("max".to_string(), x.max_pool2d(excl)?),
            ("avg_incl".to_string(), x.avg_pool2d(config)?),
            ("avg_excl".to_string(), x.avg_pool2d(excl)?),
        ])
    });
}

#[test]
fn index() {
    run_family("index", |c| {
        let index = c.index_input("index")?;
        let dim = c.int("dim") as isize;
        let out = match c.param("op").as_str() {
            Some("gather") => c.input("x")?.gather(dim, &index)?,
            Some("index_select") => c.input("x")?.index_select(dim, &index)?,
            Some("embedding") => c.input("weight")?.embedding(&index)?,
            Some("scatter") => c.input("x")?.scatter(dim, &index, &c.input("src")?)?,
            Some("scatter_add") => c.input("x")?.scatter_add(dim, &index, &c.input("src")?)?,
            Some("index_add") => {
                c.input("x")?
                    .index_add(dim, &index, &c.input("src")?, c.f64("alpha"))?
            }
            other => panic!("case {}: unknown op {other:?}", c.case.name),
        };
        Ok(vec![("out".to_string(), out)])
    });
}

#[test]
fn select() {
    run_family("select", |c| match c.param("op").as_str() {
        Some("compare") => {
            let a = c.input("a")?;
            let b = match c.opt_f64("scalar") {
                Some(_) => None,
                None => Some(c.input("b")?),
            };
            CompareOp::ALL
                .iter()
                .map(|&op| {
                    let out = match &b {
                        Some(b) => a.backend().compare(op, &a, b)?,
                        None => a.backend().compare_scalar(op, &a, c.f64("scalar"))?,
                    };
                    Ok((op.name().to_string(), out))
                })
                .collect()
        }
        Some("where") => {
            let cond = c.mask_input("cond")?;
            let out = c.input("x")?.where_(&cond, &c.input("y")?)?;
            Ok(vec![("out".to_string(), out)])
        }
        Some("masked_fill") => {
            let out = c
                .input("x")?
                .masked_fill(&c.mask_input("mask")?, c.f64("value"))?;
            Ok(vec![("out".to_string(), out)])
        }
        other => panic!("case {}: unknown op {other:?}", c.case.name),
    });
}

#[test]
fn shape() {
    run_family("shape", |c| {
        let xs = (0..c.int("n"))
            .map(|i| c.input(&format!("x{i}")))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = xs.iter().collect();
        let axis = c.int("axis") as isize;
        let out = match c.param("op").as_str() {
            Some("cat") => c.backend.cat(&refs, axis)?,
            Some("cumsum") => xs[0].cumsum(axis)?,
            Some("cumprod") => xs[0].cumprod(axis)?,
            Some("sort") | Some("topk") => {
                let (values, indices) = if c.param("op").as_str() == Some("sort") {
                    xs[0].sort(axis, c.flag("descending"))?
                } else {
                    xs[0].topk(c.int("k") as usize, axis, true)?
                };
                return Ok(vec![
                    ("values".to_string(), values),
                    ("indices".to_string(), indices),
                ]);
            }
            other => panic!("case {}: unknown op {other:?}", c.case.name),
        };
        Ok(vec![("out".to_string(), out)])
    });
}

#[test]
fn adam() {
    run_family("adam", |c| {
        let n = c.int("nparams") as usize;
        let steps = c.int("steps") as usize;
        let (eps, wd) = (c.f64("eps"), c.f64("weight_decay"));
        let mut state = if c.flag("decoupled") {
            AdamState::adamw(wd).with_eps(eps)
        } else {
            AdamState::adam().with_eps(eps).with_weight_decay(wd)
        };
        // The API takes f32 hyper-parameters and widens them through their shortest decimal form, so
        // the decimal values of the fixture arrive exactly.
        let lr = c.f64("lr") as f32;
        let betas = (c.f64("beta1") as f32, c.f64("beta2") as f32);
        let mut params = (0..n)
            .map(|i| c.input(&format!("p{i}")))
            .collect::<Result<Vec<_>>>()?;
        let mut outputs = Vec::new();
        for s in 0..steps {
            let grads = (0..n)
                .map(|i| c.input(&format!("g{s}_{i}")))
                .collect::<Result<Vec<_>>>()?;
            c.backend
                .fused_adam_step(&mut params, &grads, &mut state, lr, betas)?;
            assert_eq!(state.step(), s as u64 + 1, "case {}", c.case.name);
            for (i, p) in params.iter().enumerate() {
                // Snapshot: the parameters are updated in place by the next step.
                outputs.push((format!("p{i}_step{s}"), p.copy()?));
            }
        }
        for i in 0..n {
            outputs.push((format!("m{i}"), state.exp_avg()[i].copy()?));
            outputs.push((format!("v{i}"), state.exp_avg_sq()[i].copy()?));
        }
        Ok(outputs)
    });
}

#[test]
fn unary() {
    run_family("unary", |c| {
        let x = c.input("x")?;
        let mut outputs = Vec::new();
        for name in c.case.expected.keys() {
            let op = UnaryOp::ALL
                .iter()
                .copied()
                .find(|op| op.name() == name)
                .unwrap_or_else(|| panic!("case {}: unknown unary op {name:?}", c.case.name));
            outputs.push((name.clone(), c.backend.unary(op, &x)?));
        }
        Ok(outputs)
    });
}

#[test]
fn binary() {
    run_family("binary", |c| {
        let a = c.input("a")?;
        let scalar = c.opt_f64("scalar");
        let b = match scalar {
            None => Some(c.input("b")?),
            Some(_) => None,
        };
        let mut outputs = Vec::new();
        for name in c.case.expected.keys() {
            let op = BinaryOp::ALL
                .iter()
                .copied()
                .find(|op| op.name() == name)
                .unwrap_or_else(|| panic!("case {}: unknown binary op {name:?}", c.case.name));
            let t = match (&b, scalar) {
                (Some(b), _) => c.backend.binary(op, &a, b)?,
                (None, Some(s)) => c.backend.binary_scalar(op, &a, s)?,
                (None, None) => unreachable!(),
            };
            outputs.push((name.clone(), t));
        }
        // The named methods must agree with `binary`.
        if let Some(b) = &b {
            if c.case.expected.contains_key("add") {
                outputs.push(("add".to_string(), a.add(b)?));
                outputs.push(("sub".to_string(), a.sub(b)?));
                outputs.push(("mul".to_string(), a.mul(b)?));
                outputs.push(("div".to_string(), a.div(b)?));
                outputs.push(("maximum".to_string(), a.maximum(b)?));
                outputs.push(("minimum".to_string(), a.minimum(b)?));
            } else {
                outputs.push(("pow".to_string(), a.pow(b)?));
            }
        }
        Ok(outputs)
    });
}

/// The comparison itself must be able to fail: a one-ulp-scale change passes, a change of 1e-9
/// relative fails at F64, a NaN always fails, and a shape change fails.
#[test]
fn comparison_rejects_wrong_values() {
    let want = Array {
        shape: vec![2, 3],
        data: vec![1.5, -2.25, 3.0, 0.125, -7.0, 11.0],
    };
    let tol = tolerance(DType::F64);
    let mut got = want.data.clone();
    assert!(compare_values("same", &want.shape, &got, &want, tol).is_ok());
    got[4] = f64::from_bits(got[4].to_bits() + 1);
    assert!(compare_values("one ulp", &want.shape, &got, &want, tol).is_ok());
    got[4] = -7.0 * (1.0 + 1e-9);
    let err = compare_values("1e-9", &want.shape, &got, &want, tol).unwrap_err();
    assert!(err.contains("[1, 1]"), "{err}");
    got[4] = f64::NAN;
    assert!(compare_values("nan", &want.shape, &got, &want, tol).is_err());
    assert!(compare_values("nan f32", &want.shape, &got, &want, 1e-5).is_err());
    assert!(compare_values("shape", &[3, 2], &want.data, &want, tol).is_err());
    // Near-zero references: the absolute bound is tol · max(1, max |ref|).
    let tiny = Array {
        shape: vec![2],
        data: vec![1e-20, -1e-20],
    };
    assert!(compare_values("tiny", &[2], &[0.5e-12, -1e-20], &tiny, tol).is_err());
}
