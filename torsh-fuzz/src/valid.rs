//! Random ops on random views, run on a backend and on the reference from the same inputs and
//! compared by relative error with the parity suite's per-dtype bounds.
//!
//! A case is generated from its generator alone ([`generate`]), as a description and a body that
//! builds its inputs on a given backend and returns its outputs, so the same case runs on both
//! backends. Most cases are small (a few thousand elements, odd sizes, strided, broadcast and empty
//! views); a few are past the kernels' grid and loop limits (rows of more than 524 256 elements, long
//! inner dims). Where the reference answers with an error (an input the generator could not keep
//! valid), the backend must answer with an error of the same kind.

use torsh_backend::compute::{BinaryOp, CompareOp, ReduceOp, UnaryOp};
use torsh_backend::prelude::*;
use torsh_backend::validation::{compare, tolerance};

use crate::gen::{view, Input, Rng, Values};
use crate::report::{error_kind, Outcome};

/// The body of a case: its outputs on a backend.
pub type Body = Box<dyn Fn(&Backend) -> Result<Vec<Tensor>> + Send + Sync>;

/// One generated case.
pub struct Case {
    /// The op family.
    pub op: &'static str,
    /// What was generated: op, dtype, shapes, views and settings.
    pub desc: String,
    /// Builds the inputs on a backend and runs the op.
    pub body: Body,
    /// The dtype's parity bound is multiplied by this (long f32 sums round more than short ones).
    pub slack: f64,
    /// For outputs that are sums of products (reductions, matmuls, convolutions): the number of
    /// terms of magnitude about 1 each output adds up. Where terms cancel, an output near 0 has a
    /// large relative error however exact its arithmetic, so such an output also passes when its
    /// absolute error is within the bound times this (the classic `γₙ Σ|xᵢ|` error bound of a
    /// sum). 0 for ops without cancellation.
    pub terms: f64,
    /// The case expects an error that a GPU raises on the device and reports at the next
    /// synchronize or host read of any thread (an index out of range): cases run by threads
    /// sharing a backend leave it out, since another thread's read may take it.
    pub device_error: bool,
}

/// `case` whose outputs add up `terms` terms each (see [`Case::terms`]).
fn with_terms(case: Case, terms: f64) -> Case {
    Case { terms, ..case }
}

/// Elements of an ordinary case's tensors, at most.
const CAP: usize = 6000;

/// Case `rng` draws: an op family at random, then its inputs and settings.
pub fn generate(rng: &mut Rng) -> Case {
    if rng.chance(0.03) {
        return large(rng);
    }
    match rng.range(0, 20) {
        0 | 1 => unary(rng),
        2 | 3 => binary(rng),
        4 | 5 => reduce(rng),
        6 => softmax(rng),
        7 => layer_norm(rng),
        8 => batch_norm(rng),
        9 => matmul(rng),
        10 => gemm(rng),
        11 => conv2d(rng),
        12 => pool2d(rng),
        13 => attention(rng),
        14 => adam(rng),
        15 => index(rng),
        16 => select(rng),
        17 => order(rng),
        18 => backward(rng),
        _ => cast_copy(rng),
    }
}

/// Runs `case` on `target` and on `reference` and judges the outputs.
pub fn check(case: &Case, target: &Backend, reference: &Backend) -> Outcome {
    let want = (case.body)(reference).and_then(|ts| host(&ts));
    let got = (case.body)(target).and_then(|ts| host(&ts));
    judge(want, got, case.slack, case.terms)
}

/// Host copies of outputs: shape, values and dtype of each.
pub type Host = Vec<(Vec<usize>, Vec<f64>, DType)>;

/// The outputs' host copies.
pub fn host(ts: &[Tensor]) -> Result<Host> {
    ts.iter()
        .map(|t| Ok((t.shape().to_vec(), t.to_vec_f64()?, t.dtype())))
        .collect()
}

/// The verdict on a backend's answer `got` given the reference's `want`, with the dtypes' bounds
/// times `slack`, and absolute errors up to the bound times `terms` allowed (see [`Case::terms`]).
fn judge(want: Result<Host>, got: Result<Host>, slack: f64, terms: f64) -> Outcome {
    match (want, got) {
        (
            _,
            Err(e @ (BackendError::Unsupported { .. } | BackendError::FeatureUnavailable { .. })),
        ) => Outcome::Declined(e.to_string()),
        (Err(w), Err(g)) if error_kind(&w) == error_kind(&g) => Outcome::Pass,
        (Err(w), Err(g)) => {
            Outcome::WrongError(format!("the reference answered {w}, this backend {g}"))
        }
        (Err(w), Ok(_)) => {
            Outcome::WrongError(format!("the reference answered {w}, this backend Ok"))
        }
        (Ok(_), Err(g)) => Outcome::Error(g.to_string()),
        (Ok(want), Ok(got)) => {
            if want.len() != got.len() {
                return Outcome::Mismatch(format!(
                    "{} outputs, the reference {}",
                    got.len(),
                    want.len()
                ));
            }
            for (i, ((ws, wv, wd), (gs, gv, gd))) in want.iter().zip(&got).enumerate() {
                if ws != gs || wd != gd {
                    return Outcome::Mismatch(format!(
                        "output {i}: {gs:?} {gd}, the reference {ws:?} {wd}"
                    ));
                }
                let c = compare(gv, wv);
                let bound = tolerance(*wd) * slack;
                let absolute = c.mismatched_specials == 0 && c.max_abs_error <= bound * terms;
                if !c.within(bound) && !absolute {
                    return Outcome::Mismatch(format!("output {i} {ws:?} {wd}: {c}"));
                }
            }
            Outcome::Pass
        }
    }
}

/// A case whose body builds `inputs` in `dtype` and hands them to `op`.
fn case(
    op: &'static str,
    desc: String,
    dtype: DType,
    inputs: Vec<Input>,
    f: impl Fn(&Backend, &[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
) -> Case {
    let described = format!(
        "{desc} {dtype} inputs [{}]",
        inputs
            .iter()
            .map(Input::describe)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Case {
        op,
        desc: described,
        body: Box::new(move |b| {
            let ts = inputs
                .iter()
                .map(|i| i.build(b, dtype))
                .collect::<Result<Vec<_>>>()?;
            f(b, &ts)
        }),
        slack: 1.0,
        terms: 0.0,
        device_error: false,
    }
}

fn unary(rng: &mut Rng) -> Case {
    let op = rng.pick(UnaryOp::ALL);
    let dtype = rng.float_dtype();
    let rank = rng.range(1, 4);
    let shape = rng.shape(rank, true, CAP);
    let values = match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => Values::Positive,
        _ => Values::Normal,
    };
    let x = view(rng, &shape, values);
    case(
        "unary",
        op.name().to_string(),
        dtype,
        vec![x],
        move |b, t| Ok(vec![b.unary(op, &t[0])?]),
    )
}

/// Shapes of two operands that broadcast to `out`: some dims 1, maybe fewer leading dims.
fn broadcast_pair(rng: &mut Rng, out: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let one = |rng: &mut Rng| {
        let mut s = out.to_vec();
        for d in s.iter_mut() {
            if rng.chance(0.25) {
                *d = 1;
            }
        }
        let drop = if s.is_empty() { 0 } else { rng.range(0, 1) };
        s[drop..].to_vec()
    };
    let a = one(rng);
    let b = if rng.chance(0.5) {
        out.to_vec()
    } else {
        one(rng)
    };
    (a, b)
}

fn binary(rng: &mut Rng) -> Case {
    let op = rng.pick(BinaryOp::ALL);
    let dtype = rng.float_dtype();
    let rank = rng.range(1, 4);
    let out = rng.shape(rank, true, CAP);
    let (sa, sb) = broadcast_pair(rng, &out);
    let (va, vb) = match op {
        BinaryOp::Pow => (Values::Positive, Values::Normal),
        BinaryOp::Div => (Values::Normal, Values::Positive),
        _ => (Values::Normal, Values::Normal),
    };
    let a = view(rng, &sa, va);
    let b = view(rng, &sb, vb);
    if rng.chance(0.2) {
        let scalar = match op {
            BinaryOp::Div => rng.uniform(0.25, 2.0),
            BinaryOp::Pow => rng.uniform(-2.0, 2.0),
            _ => rng.normal(),
        };
        let a = if op == BinaryOp::Pow {
            view(rng, &sa, Values::Positive)
        } else {
            a
        };
        return case(
            "binary",
            format!("{} with scalar {scalar}", op.name()),
            dtype,
            vec![a],
            move |be, t| Ok(vec![be.binary_scalar(op, &t[0], scalar)?]),
        );
    }
    case(
        "binary",
        op.name().to_string(),
        dtype,
        vec![a, b],
        move |be, t| Ok(vec![be.binary(op, &t[0], &t[1])?]),
    )
}

fn reduce(rng: &mut Rng) -> Case {
    let op = rng.pick(&[
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Var { correction: 0 },
        ReduceOp::Var { correction: 1 },
        ReduceOp::ArgMax,
        ReduceOp::ArgMin,
    ]);
    let dtype = rng.float_dtype();
    let rank = rng.range(1, 4);
    let shape = rng.shape(rank, true, CAP);
    let values = match op {
        ReduceOp::ArgMax | ReduceOp::ArgMin => Values::Distinct,
        ReduceOp::Var { .. } if rng.chance(0.15) => Values::Constant(rng.uniform(-4.0, 4.0)),
        _ => Values::Normal,
    };
    let x = view(rng, &shape, values);
    if rng.chance(0.15) {
        let mean = rng.chance(0.5);
        let name = if mean { "mean_all" } else { "sum_all" };
        let terms = if mean {
            1.0
        } else {
            shape.iter().product::<usize>() as f64
        };
        let c = case("reduce", name.into(), dtype, vec![x], move |_, t| {
            Ok(vec![if mean {
                t[0].mean_all()?
            } else {
                t[0].sum_all()?
            }])
        });
        return with_terms(c, terms);
    }
    let axis = rng.range(0, rank - 1) as isize - if rng.chance(0.3) { rank as isize } else { 0 };
    let keepdim = rng.chance(0.5);
    let len = shape[axis.rem_euclid(rank as isize) as usize] as f64;
    let terms = match op {
        ReduceOp::Sum => len,
        ReduceOp::Mean | ReduceOp::Var { .. } => 1.0,
        _ => 0.0,
    };
    let c = case(
        "reduce",
        format!("{} axis {axis} keepdim {keepdim}", op.name()),
        dtype,
        vec![x],
        move |b, t| Ok(vec![b.reduce(op, &t[0], axis, keepdim)?]),
    );
    with_terms(c, terms)
}

fn softmax(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let rank = rng.range(1, 4);
    let mut shape = rng.shape(rank, true, CAP);
    let mut axis = rng.range(0, rank - 1) as isize;
    if rng.chance(0.05) {
        // Several rows past the size cap, in every dtype, log or not (`large` draws single f32
        // and f16 softmax rows): the CPU takes f32 and f64 rows of more than 128 KiB block by
        // block, a thread's rows each on their own.
        shape = vec![rng.range(1, 3), rng.range(33_000, 40_000)];
        axis = 1;
    }
    let x = view(rng, &shape, Values::Normal);
    let log = rng.chance(0.5);
    let name = if log { "log_softmax" } else { "softmax" };
    case(
        "softmax",
        format!("{name} axis {axis}"),
        dtype,
        vec![x],
        move |_, t| {
            Ok(vec![if log {
                t[0].log_softmax(axis)?
            } else {
                t[0].softmax(axis)?
            }])
        },
    )
}

fn layer_norm(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let rank = rng.range(1, 4);
    let shape = rng.shape(rank, false, CAP);
    let k = rng.range(1, rank);
    let normalized = shape[rank - k..].to_vec();
    let values = if rng.chance(0.15) {
        Values::Constant(rng.uniform(-100.0, 100.0))
    } else {
        Values::Normal
    };
    let mut inputs = vec![view(rng, &shape, values)];
    let weight = rng.chance(0.6);
    let bias = rng.chance(0.6);
    if weight {
        inputs.push(view(rng, &normalized, Values::Normal));
    }
    if bias {
        inputs.push(view(rng, &normalized, Values::Normal));
    }
    let eps = rng.pick(&[1e-5, 1e-3, 0.1]);
    let n = normalized.clone();
    case(
        "layer_norm",
        format!("over {normalized:?} weight {weight} bias {bias} eps {eps}"),
        dtype,
        inputs,
        move |_, t| {
            let w = weight.then(|| &t[1]);
            let b = bias.then(|| &t[1 + weight as usize]);
            Ok(vec![t[0].layer_norm(&n, w, b, eps)?])
        },
    )
}

fn batch_norm(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let rank = rng.range(2, 4);
    let mut shape = rng.shape(rank, false, CAP);
    shape[0] = shape[0].max(2);
    let c = shape[1];
    let values = if rng.chance(0.15) {
        Values::Constant(rng.uniform(-100.0, 100.0))
    } else {
        Values::Normal
    };
    let training = rng.chance(0.6);
    let affine = rng.chance(0.6);
    let running = !training || rng.chance(0.6);
    let mut inputs = vec![view(rng, &shape, values)];
    if affine {
        inputs.push(view(rng, &[c], Values::Normal));
        inputs.push(view(rng, &[c], Values::Normal));
    }
    if running {
        // Dense: they are updated in place.
        let mean: Vec<f64> = (0..c).map(|_| rng.normal() * 0.1).collect();
        let var: Vec<f64> = (0..c).map(|_| rng.uniform(0.5, 1.5)).collect();
        inputs.push(Input {
            base: vec![c],
            steps: vec![],
            data: mean,
        });
        inputs.push(Input {
            base: vec![c],
            steps: vec![],
            data: var,
        });
    }
    let momentum = rng.pick(&[None, Some(0.0), Some(0.3), Some(1.0)]);
    let eps = rng.pick(&[None, Some(1e-3)]);
    // The running mean is a mean, near 0 for normal values.
    let c = case(
        "batch_norm",
        format!(
            "training {training} affine {affine} running {running} momentum {momentum:?} eps {eps:?}"
        ),
        dtype,
        inputs,
        move |_, t| {
            let r = 1 + 2 * affine as usize;
            let config = BatchNormConfig {
                weight: affine.then(|| &t[1]),
                bias: affine.then(|| &t[2]),
                running_mean: running.then(|| &t[r]),
                running_var: running.then(|| &t[r + 1]),
                training,
                momentum,
                eps,
            };
            let y = t[0].batch_norm(config)?;
            let mut out = vec![y];
            if running {
                out.push(t[r].clone());
                out.push(t[r + 1].clone());
            }
            Ok(out)
        },
    );
    with_terms(c, 1.0)
}

fn matmul(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let (m, k, n) = (rng.dim(true), rng.dim(true), rng.dim(true));
    let batch = rng.range(1, 3);
    let (sa, sb): (Vec<usize>, Vec<usize>) = match rng.range(0, 4) {
        0 => (vec![k], vec![k, n]),
        1 => (vec![m, k], vec![k]),
        2 => (vec![batch, m, k], vec![batch, k, n]),
        3 => (vec![batch, m, k], vec![k, n]),
        _ => (vec![m, k], vec![k, n]),
    };
    let shrink = |s: Vec<usize>| -> Vec<usize> {
        let mut s = s;
        while s.iter().product::<usize>() > CAP {
            let i = s
                .iter()
                .enumerate()
                .max_by_key(|(_, &d)| d)
                .map_or(0, |(i, _)| i);
            s[i] /= 2;
        }
        s
    };
    let (mut sa, mut sb) = (shrink(sa), shrink(sb));
    if rng.chance(0.1) {
        // Many small products past the size cap: each too small to split, together worth the
        // CPU's threads, which run them side by side (at least 2²¹ flops of work in f32).
        let dim = |rng: &mut Rng| rng.range(16, 20);
        let (batch, m, k, n) = (rng.range(64, 80), dim(rng), dim(rng), dim(rng));
        (sa, sb) = (vec![batch, m, k], vec![batch, k, n]);
    }
    // The shrinking may have changed a shared inner dim: B takes A's.
    let inner = *sa.last().unwrap_or(&1);
    let at = if sb.len() == 1 { 0 } else { sb.len() - 2 };
    sb[at] = inner;
    if sa.len() == 3 && sb.len() == 3 {
        sb[0] = sa[0];
    }
    let a = view(rng, &sa, Values::Normal);
    let b = view(rng, &sb, Values::Normal);
    let c = case(
        "matmul",
        format!("{sa:?} @ {sb:?}"),
        dtype,
        vec![a, b],
        |_, t| Ok(vec![t[0].matmul(&t[1])?]),
    );
    with_terms(c, inner as f64)
}

fn gemm(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let (m, k, n) = (rng.dim(true), rng.dim(true), rng.dim(true));
    let (any_alpha, any_beta) = (rng.normal() as f32, rng.normal() as f32);
    let alpha = rng.pick(&[1.0, 0.5, -2.0, any_alpha]);
    let beta = rng.pick(&[0.0, 1.0, 0.5, any_beta]);
    let scale = f64::from(alpha.abs().max(beta.abs()).max(1.0));
    if rng.chance(0.4) {
        let (m, n) = (m.min(300), n.min(300));
        let a = view(rng, &[m, n], Values::Normal);
        let x = view(rng, &[n], Values::Normal);
        let y = view(rng, &[m], Values::Normal);
        let c = case(
            "gemv",
            format!("{m}×{n} alpha {alpha} beta {beta}"),
            dtype,
            vec![a, x, y],
            move |b, t| Ok(vec![b.gemv(&t[0], &t[1], alpha, &t[2], beta)?]),
        );
        return with_terms(c, (n + 1) as f64 * scale);
    }
    let (m, k, n) = (m.min(100), k.min(100), n.min(100));
    let a = view(rng, &[m, k], Values::Normal);
    let w = view(rng, &[k, n], Values::Normal);
    let c = view(rng, &[m, n], Values::Normal);
    let g = case(
        "gemm",
        format!("{m}×{k}×{n} alpha {alpha} beta {beta}"),
        dtype,
        vec![a, w, c],
        move |b, t| Ok(vec![b.gemm(&t[0], &t[1], alpha, &t[2], beta)?]),
    );
    with_terms(g, (k + 1) as f64 * scale)
}

/// A random convolution: input and weight shapes and a window that fits them (grouped, depthwise,
/// strided, dilated and padded by chance; sometimes no image; sometimes a channel-rich 3×3 layer at
/// stride 1, which the CPU computes by Winograd; sometimes a first layer, few input channels under
/// a large window with many output channels, which the CPU computes by its direct kernel).
fn conv_geometry(rng: &mut Rng) -> ([usize; 4], [usize; 4], ConvConfig) {
    if rng.chance(0.1) {
        let (cin, cout) = (rng.range(1, 4), rng.range(5, 40));
        let k = rng.range(5, 7);
        let stride = rng.range(1, 2);
        let padding = rng.range(0, k / 2);
        let least = k.saturating_sub(2 * padding).max(1);
        let (h, w) = (rng.range(least, least + 20), rng.range(least, least + 20));
        let config = ConvConfig {
            stride: [stride, stride],
            padding: [padding, padding],
            ..ConvConfig::default()
        };
        return ([rng.range(0, 2), cin, h, w], [cout, cin, k, k], config);
    }
    if rng.chance(0.15) {
        let (cin, cout) = (rng.range(16, 24), rng.range(16, 24));
        let padding = [rng.range(0, 3), rng.range(0, 3)];
        // At least one output row and column: 3 input rows unpadded, 1 padded.
        let least = |pad: usize| if pad == 0 { 3 } else { 1 };
        let (h, w) = (
            rng.range(least(padding[0]), 12),
            rng.range(least(padding[1]), 12),
        );
        let config = ConvConfig {
            padding,
            ..ConvConfig::default()
        };
        return ([rng.range(0, 3), cin, h, w], [cout, cin, 3, 3], config);
    }
    let depthwise = rng.chance(0.2);
    let groups = if depthwise {
        rng.range(1, 8)
    } else {
        rng.pick(&[1, 1, 1, 2, 3])
    };
    let cin = groups * if depthwise { 1 } else { rng.range(1, 4) };
    let cout = groups * rng.range(1, 4);
    let (kh, kw) = (rng.range(1, 5), rng.range(1, 5));
    let stride = [rng.range(1, 3), rng.range(1, 3)];
    let dilation = [rng.pick(&[1, 1, 2]), rng.pick(&[1, 1, 2])];
    let padding = [rng.range(0, kh / 2 + 1), rng.range(0, kw / 2 + 1)];
    let need = |k: usize, d: usize, p: usize| (d * (k - 1) + 1).saturating_sub(2 * p).max(1);
    let h = need(kh, dilation[0], padding[0]) + rng.range(0, 12);
    let w = need(kw, dilation[1], padding[1]) + rng.range(0, 12);
    let batch = rng.range(0, 3);
    let config = ConvConfig {
        stride,
        padding,
        dilation,
        groups,
    };
    ([batch, cin, h, w], [cout, cin / groups, kh, kw], config)
}

fn conv2d(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let (x_shape, w_shape, config) = conv_geometry(rng);
    let x = view(rng, &x_shape, Values::Normal);
    let wt = view(rng, &w_shape, Values::Normal);
    let bias = rng.chance(0.5);
    let mut inputs = vec![x, wt];
    if bias {
        inputs.push(view(rng, &[w_shape[0]], Values::Normal));
    }
    let terms = (w_shape[1] * w_shape[2] * w_shape[3] + 1) as f64;
    let c = case(
        "conv2d",
        format!("{config:?} bias {bias}"),
        dtype,
        inputs,
        move |b, t| {
            Ok(vec![b.conv2d_with_bias(
                &t[0],
                &t[1],
                bias.then(|| &t[2]),
                config,
            )?])
        },
    );
    with_terms(c, terms)
}

/// A convolution's three gradients from a random output gradient (the forward's output stands in
/// for its shape), and the transposed convolution of that gradient.
fn conv2d_backward(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let (x_shape, w_shape, config) = conv_geometry(rng);
    let x = view(rng, &x_shape, Values::Normal);
    let wt = view(rng, &w_shape, Values::Normal);
    // The longest sums: the input gradient's over K/G·R·S terms, the weight's over N·OH·OW.
    let [n, _, h, w] = x_shape;
    let terms = ((w_shape[0] / config.groups) * w_shape[2] * w_shape[3]).max(n * h * w) + 1;
    let c = case(
        "backward",
        format!("conv2d gradients {config:?}"),
        dtype,
        vec![x, wt],
        move |b, t| {
            let y = b.conv2d(&t[0], &t[1], config)?;
            let dx = b.conv2d_backward_input(&y, &t[1], t[0].shape(), config)?;
            let dw = b.conv2d_backward_weight(&y, &t[0], t[1].shape(), config)?;
            let db = b.conv2d_backward_bias(&y)?;
            Ok(vec![y, dx, dw, db])
        },
    );
    with_terms(c, terms as f64)
}

fn pool2d(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let kernel = [rng.range(1, 4), rng.range(1, 4)];
    let stride = [rng.pick(&[1, 2, 3, 5]), rng.pick(&[1, 2, 3, 5])];
    let padding = [rng.range(0, kernel[0] / 2), rng.range(0, kernel[1] / 2)];
    let h = kernel[0].saturating_sub(2 * padding[0]).max(1) + rng.range(0, 10);
    let w = kernel[1].saturating_sub(2 * padding[1]).max(1) + rng.range(0, 10);
    let shape = [rng.range(0, 3), rng.range(1, 4), h, w];
    let x = view(rng, &shape, Values::Normal);
    let config = Pool2dConfig {
        kernel,
        stride,
        padding,
        count_include_pad: rng.chance(0.5),
    };
    let max = rng.chance(0.5);
    let name = if max { "max" } else { "avg" };
    case(
        "pool2d",
        format!("{name} {config:?}"),
        dtype,
        vec![x],
        move |_, t| {
            Ok(vec![if max {
                t[0].max_pool2d(config)?
            } else {
                t[0].avg_pool2d(config)?
            }])
        },
    )
}

/// Layer norm (over the last dim) or batch norm (in training) saving its statistics, and its
/// gradients from them, with or without a weight.
fn norm_backward(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let rank = rng.range(2, 4);
    let mut shape = rng.shape(rank, false, CAP);
    let layer = rng.chance(0.5);
    let affine = rng.chance(0.5);
    let per_channel = shape[0] * shape[2..].iter().product::<usize>();
    if !layer && per_channel < 2 {
        // Training needs more than one value per channel.
        shape[0] += 1;
    }
    let params = if layer {
        vec![shape[rank - 1]]
    } else {
        vec![shape[1]]
    };
    let x = view(rng, &shape, Values::Normal);
    let g = view(rng, &shape, Values::Normal);
    let w = view(rng, &params, Values::Normal);
    let rows: usize = shape.iter().product::<usize>() / params[0];
    let terms = if layer { rows.max(params[0]) } else { rows };
    let name = if layer { "layer" } else { "batch" };
    let c = case(
        "backward",
        format!("{name} norm gradients affine {affine}"),
        dtype,
        vec![x, g, w],
        move |b, t| {
            let weight = affine.then(|| &t[2]);
            let (saved, grads) = if layer {
                let normalized = &params[..];
                let s = b.layer_norm_with_stats(&t[0], normalized, weight, None, 1e-5)?;
                let grads =
                    b.layer_norm_backward(&t[1], &t[0], normalized, weight, &s.mean, &s.invstd)?;
                (s, grads)
            } else {
                let config = BatchNormConfig {
                    weight,
                    training: true,
                    ..Default::default()
                };
                let s = b.batch_norm_with_stats(&t[0], config)?;
                let grads =
                    b.batch_norm_backward(&t[1], &t[0], weight, &s.mean, &s.invstd, true)?;
                (s, grads)
            };
            Ok(vec![
                saved.output,
                saved.mean,
                saved.invstd,
                grads.input,
                grads.weight,
                grads.bias,
            ])
        },
    );
    with_terms(c, terms as f64 + 1.0)
}

/// Attention saving its log-sum-exps, and its gradients from an output given as an input and the
/// forward's log-sum-exps raised by one (so that backends differentiate at nearly the same point),
/// causal or not.
fn attention_backward(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let (batch, heads) = (rng.range(1, 2), rng.range(1, 3));
    let (sq, skv) = (rng.range(0, 40), rng.range(1, 80));
    let d = rng.pick(&[1, 8, 16, 33, 64]);
    let causal = rng.chance(0.5);
    let (qs, ks) = ([batch, heads, sq, d], [batch, heads, skv, d]);
    let inputs = vec![
        view(rng, &qs, Values::Normal),
        view(rng, &ks, Values::Normal),
        view(rng, &ks, Values::Normal),
        view(rng, &qs, Values::Normal),
        view(rng, &qs, Values::Normal),
        view(rng, &[batch, heads, sq], Values::Positive),
    ];
    let c = case(
        "backward",
        format!("attention gradients causal {causal}"),
        dtype,
        inputs,
        move |b, t| {
            let scale = 1.0 / (d as f64).sqrt();
            let fwd = b.attention_with_lse(&t[0], &t[1], &t[2], causal, scale)?;
            // The forward's log-sum-exps raised by a positive input: probabilities below 1, as a
            // real forward's are, and differing across backends only by the forward's rounding.
            let raise = t[5].cast(fwd.lse.dtype())?;
            let lse = fwd.lse.add(&raise)?;
            let grads =
                b.attention_backward(&t[3], &t[0], &t[1], &t[2], &t[4], &lse, causal, scale)?;
            Ok(vec![fwd.output, fwd.lse, grads.q, grads.k, grads.v])
        },
    );
    with_terms(c, (sq.max(skv) * d) as f64 + 1.0)
}

/// The backward ops: a unary op's gradient from its input, dropout and its backward, max pooling's
/// positions with both pooling gradients, cross-entropy with its gradient, a convolution's
/// gradients, the norms' and attention's.
fn backward(rng: &mut Rng) -> Case {
    if rng.chance(0.2) {
        return conv2d_backward(rng);
    }
    if rng.chance(0.15) {
        return attention_backward(rng);
    }
    if rng.chance(0.2) {
        return norm_backward(rng);
    }
    let dtype = rng.float_dtype();
    match rng.range(0, 4) {
        0 => {
            let op = rng.pick(UnaryOp::ALL);
            let rank = rng.range(1, 3);
            let shape = rng.shape(rank, true, CAP);
            let values = match op {
                UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => Values::Positive,
                _ => Values::Normal,
            };
            let (x, g) = (view(rng, &shape, values), view(rng, &shape, Values::Normal));
            case(
                "backward",
                format!("unary_backward {}", op.name()),
                dtype,
                vec![x, g],
                move |_, t| Ok(vec![t[0].unary_backward_from_input(op, &t[1])?]),
            )
        }
        1 => {
            let rank = rng.range(1, 3);
            let shape = rng.shape(rank, true, CAP);
            let x = view(rng, &shape, Values::Normal);
            let p = rng.pick(&[0.0, 0.1, 0.5, 0.9, 1.0]);
            let seed = rng.range(0, 1000) as u64;
            case(
                "backward",
                format!("dropout p {p} seed {seed}"),
                dtype,
                vec![x],
                move |b, t| {
                    Ok(vec![
                        t[0].dropout(p, seed)?,
                        b.dropout_backward(&t[0], p, seed)?,
                    ])
                },
            )
        }
        2 => {
            let kernel = [rng.range(1, 4), rng.range(1, 4)];
            let stride = [rng.range(1, 3), rng.range(1, 3)];
            let padding = [rng.range(0, kernel[0] / 2), rng.range(0, kernel[1] / 2)];
            let h = kernel[0].saturating_sub(2 * padding[0]).max(1) + rng.range(0, 9);
            let w = kernel[1].saturating_sub(2 * padding[1]).max(1) + rng.range(0, 9);
            let shape = [rng.range(0, 2), rng.range(1, 3), h, w];
            let x = view(rng, &shape, Values::Normal);
            let config = Pool2dConfig {
                kernel,
                stride,
                padding,
                count_include_pad: rng.chance(0.5),
            };
            case(
                "backward",
                format!("pool2d gradients {config:?}"),
                dtype,
                vec![x],
                move |b, t| {
                    // The pooled output stands in for its own gradient.
                    let (y, at) = t[0].max_pool2d_with_indices(config)?;
                    let dmax = b.max_pool2d_backward(&y, &at, &shape, config)?;
                    let davg = b.avg_pool2d_backward(&y, &shape, config)?;
                    Ok(vec![y, at, dmax, davg])
                },
            )
        }
        3 => {
            let rank = rng.range(1, 4);
            let shape = rng.shape(rank, true, CAP);
            let (x, g) = (
                view(rng, &shape, Values::Normal),
                view(rng, &shape, Values::Normal),
            );
            let axis = rng.range(0, rank - 1) as isize;
            let log = rng.chance(0.5);
            // A gradient constant along the axis gives outputs of 0 up to rounding: the sum's
            // terms bound the absolute error.
            let terms = shape[axis as usize] as f64 + 1.0;
            let c = case(
                "backward",
                format!("softmax_backward axis {axis} log {log}"),
                dtype,
                vec![x, g],
                move |b, t| {
                    Ok(vec![if log {
                        b.log_softmax_backward(&t[1], &t[0].log_softmax(axis)?, axis)?
                    } else {
                        b.softmax_backward(&t[1], &t[0].softmax(axis)?, axis)?
                    }])
                },
            );
            with_terms(c, terms)
        }
        _ => {
            let (n, c) = (rng.range(0, 9), rng.range(1, 12));
            let logits = view(rng, &[n, c], Values::Normal);
            let targets: Vec<i64> = (0..n)
                .map(|_| {
                    if rng.chance(0.2) {
                        -100
                    } else {
                        rng.range(0, c - 1) as i64
                    }
                })
                .collect();
            let reduction = rng.pick(&[Reduction::Mean, Reduction::Sum, Reduction::None]);
            let config = CrossEntropyConfig {
                reduction,
                label_smoothing: rng.pick(&[0.0, 0.1]),
                ..Default::default()
            };
            let grad_shape = if reduction == Reduction::None {
                vec![n]
            } else {
                vec![]
            };
            let grad = view(rng, &grad_shape, Values::Normal);
            // A loss near 0 (one class, or logits favouring the target) is a difference of terms
            // of the size of the logits: each sample's C of them, N samples in a sum.
            let terms = (n * c + 1) as f64;
            let built = case(
                "backward",
                format!("cross_entropy {config:?} targets {targets:?}"),
                dtype,
                vec![logits, grad],
                move |b, t| {
                    let target = b.from_slice(&targets, &[n])?;
                    Ok(vec![
                        t[0].cross_entropy(&target, config)?,
                        b.cross_entropy_backward(&t[1], &t[0], &target, config)?,
                    ])
                },
            );
            with_terms(built, terms)
        }
    }
}

fn attention(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let (batch, heads) = (rng.range(1, 2), rng.range(1, 3));
    let (sq, skv) = (rng.range(1, 40), rng.range(1, 40));
    let d = rng.pick(&[1, 8, 16, 33, 64]);
    let causal = rng.chance(0.5);
    let q = view(rng, &[batch, heads, sq, d], Values::Normal);
    let k = view(rng, &[batch, heads, skv, d], Values::Normal);
    let v = view(rng, &[batch, heads, skv, d], Values::Normal);
    let c = case(
        "attention",
        format!("causal {causal}"),
        dtype,
        vec![q, k, v],
        move |_, t| Ok(vec![t[0].attention(&t[1], &t[2], causal)?]),
    );
    // Each score sums `d` products, and each output is a mean of V's normal values (|v| < 4)
    // weighted by probabilities summing to 1: where those values cancel, an output near 0 is
    // judged by its absolute error.
    with_terms(c, d as f64 + 4.0)
}

fn adam(rng: &mut Rng) -> Case {
    let dtype = rng.float_dtype();
    let count = rng.range(1, 2);
    let shapes: Vec<Vec<usize>> = (0..count)
        .map(|_| {
            let rank = rng.range(1, 2);
            rng.shape(rank, true, 2000)
        })
        .collect();
    let steps = rng.range(1, 3);
    let mut inputs = Vec::new();
    for s in &shapes {
        // Parameters dense (updated in place); one gradient per step.
        let n: usize = s.iter().product();
        inputs.push(Input {
            base: s.clone(),
            steps: vec![],
            data: (0..n).map(|_| rng.normal()).collect(),
        });
    }
    for _ in 0..steps {
        for s in &shapes {
            inputs.push(view(rng, s, Values::Normal));
        }
    }
    let decoupled = rng.chance(0.5);
    let decay = rng.pick(&[0.0, 0.01]);
    let lr = rng.pick(&[1e-3f32, 0.1]);
    // Each parameter ends as its start (about 1) plus one update a step (at most about `lr`):
    // a parameter that the updates bring near 0 keeps their absolute rounding.
    let c = case(
        "adam",
        format!("{count} params, {steps} steps, adamw {decoupled} decay {decay} lr {lr}"),
        dtype,
        inputs,
        move |b, t| {
            let mut params: Vec<Tensor> = t[..count].to_vec();
            let mut state = if decoupled {
                AdamState::adamw(decay)
            } else {
                AdamState::adam().with_weight_decay(decay)
            };
            for s in 0..steps {
                let grads = &t[count * (s + 1)..count * (s + 2)];
                b.fused_adam_step(&mut params, grads, &mut state, lr, (0.9, 0.999))?;
            }
            Ok(params)
        },
    );
    with_terms(c, (steps + 1) as f64)
}

fn cast_copy(rng: &mut Rng) -> Case {
    let from = rng.pick(&DType::ALL);
    let to = rng.pick(&DType::ALL);
    let rank = rng.range(1, 4);
    let shape = rng.shape(rank, true, CAP);
    let mut x = view(rng, &shape, Values::Normal);
    // Integers hold whole values; floats get values every dtype can hold, in range.
    for v in x.data.iter_mut() {
        *v = (*v * 40.0).round().clamp(0.0, 250.0);
    }
    let copy = rng.chance(0.4);
    let name = if copy { "copy" } else { "cast" };
    case(
        "cast_copy",
        format!("{name} to {to}"),
        from,
        vec![x],
        move |_, t| {
            Ok(vec![if copy {
                t[0].contiguous()?
            } else {
                t[0].cast(to)?
            }])
        },
    )
}

/// `gather`, `scatter` or `scatter_add` along a random dim of a random view, by random `I32` or
/// `I64` indices with repeats (where several land on one element every backend resolves them in
/// index order) and now and then one out of range, which must be `IndexOutOfRange` on every backend
/// (GPUs report it at the host read of the output).
fn index(rng: &mut Rng) -> Case {
    let dtype = rng.pick(&DType::FLOATS);
    let rank = rng.range(1, 3);
    let shape = rng.shape(rank, true, CAP);
    let dim = rng.range(0, rank - 1);
    let x = view(rng, &shape, Values::Normal);
    let mut ishape: Vec<usize> = shape.iter().map(|&s| rng.range(0, s)).collect();
    ishape[dim] = rng.range(0, 9);
    let n: usize = ishape.iter().product();
    let size = shape[dim];
    let mut picks: Vec<i64> = (0..n)
        .map(|_| rng.range(0, size.saturating_sub(1)) as i64)
        .collect();
    // An empty dim admits no index at all.
    let mut device_error = n > 0 && size == 0;
    if n > 0 && rng.chance(0.05) {
        let k = rng.range(0, n - 1);
        picks[k] = rng.pick(&[-1, size as i64, i64::MAX]);
        device_error = true;
    }
    let index_dtype = rng.pick(&[DType::I32, DType::I64]);
    let which = rng.pick(&["gather", "scatter", "scatter_add"]);
    let ishape_len = ishape[dim];
    let mut inputs = vec![x];
    if which != "gather" {
        inputs.push(view(rng, &ishape, Values::Normal));
    }
    let ishape_desc = ishape.clone();
    let built = case(
        "index",
        format!("{which} dim {dim} by {index_dtype} {ishape_desc:?}"),
        dtype,
        inputs,
        move |b, t| {
            let ix = b.from_slice(&picks, &ishape)?.cast(index_dtype)?;
            let d = dim as isize;
            Ok(vec![match which {
                "gather" => t[0].gather(d, &ix)?,
                "scatter" => t[0].scatter(d, &ix, &t[1])?,
                _ => t[0].scatter_add(d, &ix, &t[1])?,
            }])
        },
    );
    // Backends other than the reference add in their compute type and round every addition
    // (f16 and bf16 included): the error grows with the additions that land on one element, at
    // most the index's length along the dim, and where they cancel it is absolute, a rounding of
    // each term's size per addition.
    let (slack, terms) = if which == "scatter_add" {
        (ishape_len.max(1) as f64, (ishape_len + 1) as f64)
    } else {
        (1.0, 0.0)
    };
    Case {
        device_error,
        slack,
        ..with_terms(built, terms)
    }
}

/// A comparison (with a broadcast tensor or a scalar), or a `where` / `masked_fill` by a mask
/// that a comparison made, in any dtype, over broadcast views. Values are rounded to halves, so
/// ties are common.
fn select(rng: &mut Rng) -> Case {
    let dtype = rng.pick(&DType::ALL);
    let rank = rng.range(1, 4);
    let out = rng.shape(rank, true, CAP);
    let (sa, sb) = broadcast_pair(rng, &out);
    let mut inputs = vec![
        view(rng, &sa, Values::Normal),
        view(rng, &sb, Values::Normal),
    ];
    for input in inputs.iter_mut() {
        for v in input.data.iter_mut() {
            *v = (*v * 2.0).round() * 0.5 + 1.0;
        }
    }
    let scalar = (rng.normal() * 2.0).round() * 0.5 + 1.0;
    match rng.range(0, 3) {
        0 => {
            let op = rng.pick(CompareOp::ALL);
            case(
                "select",
                format!("{} {sa:?} with {sb:?}", op.name()),
                dtype,
                inputs,
                move |b, t| Ok(vec![b.compare(op, &t[0], &t[1])?]),
            )
        }
        1 => {
            let op = rng.pick(CompareOp::ALL);
            inputs.truncate(1);
            case(
                "select",
                format!("{} {sa:?} with scalar {scalar}", op.name()),
                dtype,
                inputs,
                move |b, t| Ok(vec![b.compare_scalar(op, &t[0], scalar)?]),
            )
        }
        _ => {
            let fill = rng.chance(0.3);
            inputs.push(view(rng, &out, Values::Normal));
            case(
                "select",
                format!(
                    "{} by {sa:?} > 1",
                    if fill { "masked_fill" } else { "where" }
                ),
                dtype,
                inputs,
                move |b, t| {
                    let mask = t[0].gt_scalar(1.0)?;
                    Ok(vec![if fill {
                        t[2].masked_fill(&mask, 2.0)?
                    } else {
                        b.where_(&mask, &t[1], &t[2])?
                    }])
                },
            )
        }
    }
}

/// `cumsum`, `cumprod`, `sort`, `argsort` or `topk` along a random dim of a random view, in any
/// dtype; values are rounded to halves, so sorts meet ties (which every backend keeps in input
/// order). Products take values near 1, so long lines neither vanish nor overflow.
fn order(rng: &mut Rng) -> Case {
    let dtype = rng.pick(&DType::ALL);
    let rank = rng.range(1, 3);
    let shape = rng.shape(rank, true, CAP);
    let dim = rng.range(0, rank - 1) as isize;
    let which = rng.pick(&["cumsum", "cumprod", "sort", "argsort", "topk"]);
    let values = if which == "cumprod" {
        Values::Positive
    } else {
        Values::Normal
    };
    let mut x = view(rng, &shape, values);
    if which != "cumprod" {
        for v in x.data.iter_mut() {
            *v = (*v * 2.0).round() * 0.5;
        }
    }
    let descending = rng.chance(0.5);
    let k = rng.range(0, shape[dim as usize]);
    let built = case(
        "order",
        format!("{which} dim {dim} descending {descending} k {k}"),
        dtype,
        vec![x],
        move |_, t| {
            Ok(match which {
                "cumsum" => vec![t[0].cumsum(dim)?],
                "cumprod" => vec![t[0].cumprod(dim)?],
                "sort" => {
                    let (v, i) = t[0].sort(dim, descending)?;
                    vec![v, i]
                }
                "argsort" => vec![t[0].argsort(dim, descending)?],
                _ => {
                    let (v, i) = t[0].topk(k, dim, descending)?;
                    vec![v, i]
                }
            })
        },
    );
    // A long f32 running sum rounds as a sequential sum does; a running product's relative error
    // grows with its length.
    let len = shape[dim as usize] as f64;
    let slack = if which == "cumprod" {
        1.0 + len / 64.0
    } else {
        1.0
    };
    Case {
        slack,
        ..with_terms(built, len)
    }
}

/// Rows and inner dims past the kernels' loop and grid limits: a row of more than 524 256 elements
/// (65 535 loop iterations of 8 threads), reductions, softmax, layer norm and products over it.
/// Sums and products take positive values (no cancellation), and their bound grows with √n: a sum of
/// half a million f32 values rounds more than the parity suite's short ones, while a cut-short loop
/// misses a quarter of the row or more.
fn large(rng: &mut Rng) -> Case {
    let n = rng.pick(&[65_537, 524_257, 700_001]);
    let dtype = rng.pick(&[DType::F32, DType::F32, DType::F16]);
    let which = rng.range(0, 5);
    let values = match which {
        1 => Values::Distinct,
        2 | 3 => Values::Normal,
        _ => Values::Positive,
    };
    let x = view(rng, &[1, n], values);
    let mut c = match which {
        0 => case(
            "large",
            format!("sum of [1, {n}]"),
            dtype,
            vec![x],
            |_, t| Ok(vec![t[0].sum(1, false)?, t[0].sum_all()?, t[0].mean_all()?]),
        ),
        1 => case(
            "large",
            format!("max/argmax of [1, {n}]"),
            DType::F32,
            vec![x],
            |_, t| Ok(vec![t[0].max(1, false)?, t[0].argmax(1, false)?]),
        ),
        2 => case(
            "large",
            format!("softmax of [1, {n}]"),
            dtype,
            vec![x],
            |_, t| Ok(vec![t[0].softmax(1)?]),
        ),
        3 => case(
            "large",
            format!("layer norm of [1, {n}]"),
            dtype,
            vec![x],
            move |_, t| Ok(vec![t[0].layer_norm(&[n], None, None, 1e-5)?]),
        ),
        4 => {
            let y = view(rng, &[n, 1], Values::Positive);
            case(
                "large",
                format!("[1, {n}] @ [{n}, 1]"),
                dtype,
                vec![x, y],
                |_, t| Ok(vec![t[0].matmul(&t[1])?]),
            )
        }
        _ => {
            let a = view(rng, &[2, n], Values::Positive);
            let v = view(rng, &[n], Values::Positive);
            let y = view(rng, &[2], Values::Positive);
            case(
                "large",
                format!("gemv [2, {n}]"),
                dtype,
                vec![a, v, y],
                |b, t| Ok(vec![b.gemv(&t[0], &t[1], 1.0, &t[2], 0.0)?]),
            )
        }
    };
    c.slack = (n as f64 / 1024.0).sqrt();
    c
}
