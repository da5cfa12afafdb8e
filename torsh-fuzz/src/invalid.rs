//! Random mistakes at the tensor API, each expecting errors of named kinds: wrong shapes, dtypes,
//! axes, settings and sizes, tensors of another backend instance. A backend validates before it
//! decides whether it supports a dtype, so `Unsupported` for a bad argument is a wrong error. After
//! each mistake, the backend must still answer a small op correctly.

use torsh_backend::prelude::*;

use crate::gen::{view, Rng, Values};
use crate::report::{error_kind, Outcome};

/// A mistake's call on a backend (the second is another instance, for mismatches).
pub type Call = Box<dyn Fn(&Backend, &Backend) -> Result<()> + Send + Sync>;

/// One generated mistake.
pub struct Case {
    /// What the call does wrong.
    pub desc: String,
    /// The error kinds a correct backend may answer with.
    pub expect: &'static [&'static str],
    /// Makes the call on the backend (the second backend is another instance, for mismatches).
    pub call: Call,
}

const SHAPE: &[&str] = &["ShapeMismatch"];
const ARG: &[&str] = &["InvalidArgument"];
const SHAPE_OR_ARG: &[&str] = &["ShapeMismatch", "InvalidArgument"];
const SIZE: &[&str] = &["SizeOverflow", "OutOfMemory", "MemoryPoolExhausted"];

fn mistake(
    desc: impl Into<String>,
    expect: &'static [&'static str],
    call: impl Fn(&Backend, &Backend) -> Result<()> + Send + Sync + 'static,
) -> Case {
    Case {
        desc: desc.into(),
        expect,
        call: Box::new(call),
    }
}

/// A random mistake.
pub fn generate(rng: &mut Rng) -> Case {
    let dtype = rng.pick(&[DType::F32, DType::F16, DType::BF16, DType::F64]);
    // m ≥ 2 and k ≥ 3, so that m + 1 and k + 1 never broadcast with them.
    let (m, k, n) = (rng.range(2, 9), rng.range(3, 9), rng.range(1, 9));
    let a = view(rng, &[m, k], Values::Normal);
    match rng.range(0, 21) {
        0 => {
            let wrong = k + rng.range(1, 3);
            let b = view(rng, &[wrong, n], Values::Normal);
            mistake(
                format!("matmul {m}×{k} @ {:?}", b.base),
                SHAPE,
                move |be, _| a.build(be, dtype)?.matmul(&b.build(be, dtype)?).map(drop),
            )
        }
        1 => {
            let b = view(rng, &[m + 1, k + 1], Values::Normal);
            mistake(
                "add of shapes that do not broadcast",
                SHAPE,
                move |be, _| a.build(be, dtype)?.add(&b.build(be, dtype)?).map(drop),
            )
        }
        2 => {
            let other = if dtype == DType::F32 {
                DType::F16
            } else {
                DType::F32
            };
            mistake(
                format!("mul of {dtype} and {other}"),
                &["DTypeMismatch"],
                move |be, _| a.build(be, dtype)?.mul(&a.build(be, other)?).map(drop),
            )
        }
        3 => {
            let axis = rng.pick(&[2isize, 3, -3, 100, isize::MIN]);
            mistake(
                format!("sum along axis {axis} of a 2-D tensor"),
                ARG,
                move |be, _| a.build(be, dtype)?.sum(axis, false).map(drop),
            )
        }
        4 => {
            let axis = rng.pick(&[2isize, -3, isize::MAX]);
            mistake(format!("softmax along axis {axis}"), ARG, move |be, _| {
                a.build(be, dtype)?.softmax(axis).map(drop)
            })
        }
        5 => {
            let eps = rng.pick(&[f64::NAN, -1.0, f64::INFINITY]);
            mistake(format!("layer norm with eps {eps}"), ARG, move |be, _| {
                a.build(be, dtype)?
                    .layer_norm(&[k], None, None, eps)
                    .map(drop)
            })
        }
        6 => mistake(
            "layer norm over a shape the tensor does not end with",
            SHAPE_OR_ARG,
            move |be, _| {
                a.build(be, dtype)?
                    .layer_norm(&[k + 1], None, None, 1e-5)
                    .map(drop)
            },
        ),
        7 => {
            let c = rng.range(1, 4);
            let x = view(rng, &[2, c, 3], Values::Normal);
            let wrong = view(rng, &[c + 1], Values::Normal);
            mistake(
                "batch norm with a weight of the wrong length",
                SHAPE,
                move |be, _| {
                    let w = wrong.build(be, dtype)?;
                    x.build(be, dtype)?
                        .batch_norm(BatchNormConfig {
                            weight: Some(&w),
                            training: true,
                            ..Default::default()
                        })
                        .map(drop)
                },
            )
        }
        8 => {
            let momentum = rng.pick(&[f64::NAN, -0.5, 1.5]);
            let x = view(rng, &[2, 3, 4], Values::Normal);
            mistake(
                format!("batch norm with momentum {momentum}"),
                ARG,
                move |be, _| {
                    x.build(be, dtype)?
                        .batch_norm(BatchNormConfig {
                            training: true,
                            momentum: Some(momentum),
                            ..Default::default()
                        })
                        .map(drop)
                },
            )
        }
        9 => {
            let x = view(rng, &[1, 3, 5, 5], Values::Normal);
            let w = view(rng, &[2, 2, 3, 3], Values::Normal);
            mistake(
                "conv2d with 3 input channels and weights for 2",
                SHAPE_OR_ARG,
                move |be, _| {
                    be.conv2d(
                        &x.build(be, dtype)?,
                        &w.build(be, dtype)?,
                        ConvConfig::default(),
                    )
                    .map(drop)
                },
            )
        }
        10 => {
            let bad = rng.pick(&[
                ConvConfig {
                    stride: [0, 1],
                    ..Default::default()
                },
                ConvConfig {
                    dilation: [1, 0],
                    ..Default::default()
                },
                ConvConfig {
                    groups: 0,
                    ..Default::default()
                },
                ConvConfig {
                    groups: 2,
                    ..Default::default()
                },
                ConvConfig {
                    padding: [usize::MAX / 2, 0],
                    ..Default::default()
                },
            ]);
            let x = view(rng, &[1, 3, 5, 5], Values::Normal);
            let w = view(rng, &[3, 3, 3, 3], Values::Normal);
            mistake(
                format!("conv2d with {bad:?}"),
                &["ShapeMismatch", "InvalidArgument", "SizeOverflow"],
                move |be, _| {
                    be.conv2d(&x.build(be, dtype)?, &w.build(be, dtype)?, bad)
                        .map(drop)
                },
            )
        }
        11 => {
            let bad = rng.pick(&[
                Pool2dConfig {
                    kernel: [0, 2],
                    stride: [1, 1],
                    padding: [0, 0],
                    count_include_pad: true,
                },
                Pool2dConfig {
                    kernel: [2, 2],
                    stride: [0, 1],
                    padding: [0, 0],
                    count_include_pad: true,
                },
                Pool2dConfig {
                    kernel: [2, 2],
                    stride: [1, 1],
                    padding: [2, 0],
                    count_include_pad: true,
                },
                Pool2dConfig {
                    kernel: [9, 9],
                    stride: [1, 1],
                    padding: [0, 0],
                    count_include_pad: false,
                },
            ]);
            let x = view(rng, &[1, 2, 4, 4], Values::Normal);
            mistake(
                format!("max pool with {bad:?}"),
                SHAPE_OR_ARG,
                move |be, _| x.build(be, dtype)?.max_pool2d(bad).map(drop),
            )
        }
        12 => {
            let (start, len) = (rng.range(0, m + 2), rng.pick(&[m + 1, usize::MAX]));
            mistake(
                format!("narrow dim 0 of {m} from {start} by {len}"),
                ARG,
                move |be, _| a.build(be, dtype)?.narrow(0, start, len).map(drop),
            )
        }
        13 => mistake(
            "transpose of dims 0 and 5 of a 2-D tensor",
            ARG,
            move |be, _| a.build(be, dtype)?.transpose(0, 5).map(drop),
        ),
        14 => mistake(
            format!("reshape of {m}×{k} to [{m}, {}]", k + 1),
            SHAPE_OR_ARG,
            move |be, _| a.build(be, dtype)?.reshape(&[m, k + 1]).map(drop),
        ),
        15 => mistake(
            "from_slice of 5 values as [2, 3]",
            SHAPE_OR_ARG,
            move |be, _| be.from_slice(&[1.0f32; 5], &[2, 3]).map(drop),
        ),
        16 => mistake(
            "add of tensors of two backend instances",
            &["DeviceMismatch"],
            move |be, other| a.build(be, dtype)?.add(&a.build(other, dtype)?).map(drop),
        ),
        17 => {
            let shape = rng.pick(&[
                vec![1usize << 40, 1 << 40],
                vec![usize::MAX, 2],
                vec![1 << 62],
                vec![1 << 20, 1 << 20, 1 << 20],
            ]);
            mistake(format!("zeros of {shape:?}"), SIZE, move |be, _| {
                be.zeros(&shape, dtype).map(drop)
            })
        }
        18 => {
            let int = rng.pick(&[DType::I32, DType::I64, DType::U8]);
            mistake(format!("exp of {int}"), &["Unsupported"], move |be, _| {
                a.build(be, int)?.exp().map(drop)
            })
        }
        19 => {
            let q = view(rng, &[1, 2, 3, 4], Values::Normal);
            let kv = view(rng, &[1, 2, 3, 5], Values::Normal);
            mistake(
                "attention with a key head dim unlike the query's",
                SHAPE,
                move |be, _| {
                    let (q, kv) = (q.build(be, dtype)?, kv.build(be, dtype)?);
                    q.attention(&kv, &kv, false).map(drop)
                },
            )
        }
        20 => {
            let x = view(rng, &[k + 1], Values::Normal);
            let y = view(rng, &[m], Values::Normal);
            mistake("gemv with x of the wrong length", SHAPE, move |be, _| {
                be.gemv(
                    &a.build(be, dtype)?,
                    &x.build(be, dtype)?,
                    1.0,
                    &y.build(be, dtype)?,
                    0.0,
                )
                .map(drop)
            })
        }
        _ => {
            let to = vec![m + 1, k + 1];
            mistake(
                format!("broadcast of [{m}, {k}] to {to:?}"),
                SHAPE,
                move |be, _| a.build(be, dtype)?.broadcast_to(&to).map(drop),
            )
        }
    }
}

/// Runs the mistake on `b` and judges the answer; then checks that `b` still works.
pub fn check(case: &Case, b: &Backend, other: &Backend) -> Outcome {
    let outcome = match (case.call)(b, other) {
        Ok(()) => Outcome::WrongError(format!("Ok, expected {:?}", case.expect)),
        Err(e) if case.expect.contains(&error_kind(&e)) => {
            if e.to_string().trim().is_empty() {
                Outcome::WrongError(format!("{e:?} has an empty message"))
            } else {
                Outcome::Pass
            }
        }
        Err(e) => Outcome::WrongError(format!(
            "{e} ({}), expected {:?}",
            error_kind(&e),
            case.expect
        )),
    };
    if outcome.failed() {
        return outcome;
    }
    match still_works(b) {
        Ok(()) => outcome,
        Err(e) => Outcome::Error(format!(
            "after the mistake the backend fails a small op: {e}"
        )),
    }
}

/// A small op with a known answer.
fn still_works(b: &Backend) -> Result<()> {
    let x = b.from_slice(&[1.0f32, -2.0, 3.0, -4.0], &[2, 2])?;
    let y = x.matmul(&x)?.relu()?.to_vec_f64()?;
    if y == [0.0, 6.0, 0.0, 10.0] {
        Ok(())
    } else {
        Err(BackendError::invalid(
            "fuzz",
            format!("[[1,-2],[3,-4]]² relu gave {y:?}"),
        ))
    }
}
