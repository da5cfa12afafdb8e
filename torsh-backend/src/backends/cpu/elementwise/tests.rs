//! Tests of the CPU elementwise kernels against the reference.

use super::*;
use super::{
    backward::unary_backward,
    binary::binary,
    cast::cast,
    copy::{copy_strided, fill},
    random::{dropout, random},
    unary::unary,
};
use crate::backends::cpu::cost::TASK_ELEMENTS;
use crate::backends::cpu::simd::SimdLevel;
use crate::backends::cpu::stream::{worth_streaming, STREAM_BYTES, STREAM_RUN_BYTES};
use crate::compute::UnaryBackwardDesc;
use crate::rng::HostRng;
use crate::shape::Layout;

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Runs `f` with one thread, then with two inside a two-thread team.
fn for_threads(f: impl Fn(Ctx)) {
    f(Ctx {
        threads: 1,
        simd: SimdLevel::detect(),
    });
    crate::backends::cpu::team::on_threads(2, f);
}

/// `n` random values in `[lo, hi)`.
fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    HostRng::new(seed).uniform_vec(n, lo, hi)
}

/// A fresh buffer holding `vals` as `dtype`.
fn upload(mem: &mut HostMemory, dtype: DType, vals: &[f64]) -> DevicePtr {
    let ptr = mem.alloc(vals.len() * dtype.size_in_bytes()).unwrap();
    mem.store(dtype, ptr, vals).unwrap();
    ptr
}

/// A fresh (poisoned) buffer of `n` elements of `dtype`.
fn fresh(mem: &mut HostMemory, dtype: DType, n: usize) -> DevicePtr {
    mem.alloc(n * dtype.size_in_bytes()).unwrap()
}

/// Asserts `got` matches `want` within the parity bound of `dtype` (norm-wise relative error),
/// with NaN exactly where `want` has NaN and equal infinities.
fn assert_close(got: &[f64], want: &[f64], dtype: DType, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let bound = match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        _ => 1e-2,
    };
    let (mut num, mut den) = (0.0, 0.0);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g.is_nan() || w.is_nan() {
            assert!(
                g.is_nan() && w.is_nan(),
                "{what}: element {i} is {g}, not {w}"
            );
        } else if g.is_infinite() || w.is_infinite() {
            assert_eq!(g, w, "{what}: element {i}");
        } else {
            num += (g - w) * (g - w);
            den += w * w;
        }
    }
    let rel = if den > 0.0 {
        (num / den).sqrt()
    } else {
        num.sqrt()
    };
    assert!(rel <= bound, "{what}: relative error {rel:e}");
}

/// The views a unary or cast input is read through: `[rows, cols]` dense, transposed (from a
/// `[cols, rows]` buffer), and a row broadcast (stride 0) with an offset; with their buffer
/// sizes.
fn views(rows: usize, cols: usize) -> Vec<(&'static str, Layout, usize)> {
    vec![
        ("dense", Layout::contiguous(&[rows, cols]), rows * cols),
        (
            "transposed",
            Layout::new(vec![rows, cols], vec![1, rows], 0).unwrap(),
            rows * cols,
        ),
        (
            "broadcast",
            Layout::new(vec![rows, cols], vec![0, 1], 3).unwrap(),
            cols + 3,
        ),
    ]
}

/// Input range of a unary op's test data.
fn domain(op: UnaryOp) -> (f64, f64) {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => (0.25, 4.0),
        _ => (-6.0, 6.0),
    }
}

/// Runs unary `op` on `input` with this backend's kernel and the reference and compares.
fn check_unary(mem: &mut HostMemory, op: UnaryOp, dtype: DType, input: StridedBuf, ctx: Ctx) {
    let n = input.layout.numel();
    let (mine, theirs) = (fresh(mem, dtype, n), fresh(mem, dtype, n));
    let desc = |output| UnaryDesc {
        op,
        dtype,
        input: input.clone(),
        output,
    };
    unary(mem, &desc(mine), ctx).unwrap();
    reference::unary(mem, &desc(theirs)).unwrap();
    let got = mem.load_dense(dtype, mine, n).unwrap();
    let want = mem.load_dense(dtype, theirs, n).unwrap();
    let what = format!(
        "{} {dtype} {:?} ({} threads)",
        op.name(),
        input.layout,
        ctx.threads
    );
    assert_close(&got, &want, dtype, &what);
}

#[test]
fn unary_matches_the_reference_for_every_op_dtype_and_view() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        for &op in UnaryOp::ALL {
            let (lo, hi) = domain(op);
            for dtype in FLOATS {
                for (rows, cols) in [(1, 1), (3, 7), (5, BLOCK + 3)] {
                    for (_, layout, len) in views(rows, cols) {
                        let ptr = upload(&mut mem, dtype, &values(len, 7, lo, hi));
                        check_unary(&mut mem, op, dtype, StridedBuf { ptr, layout }, ctx);
                    }
                }
            }
        }
    });
}

#[test]
fn unary_backward_matches_the_reference_for_every_op_and_dtype() {
    // Values over each op's domain, special values, and a gradient with its own signs; the f32
    // formulas (vmath) against the reference's f64 ones.
    let specials = [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-30,
        9.0,
        -9.0,
    ];
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        for &op in UnaryOp::ALL {
            let (lo, hi) = domain(op);
            let mut saved = values(4099, 21, lo, hi);
            saved.extend(specials);
            let n = saved.len();
            let grad = values(n, 22, -2.0, 2.0);
            for dtype in FLOATS {
                let (s, g) = (
                    upload(&mut mem, dtype, &saved),
                    upload(&mut mem, dtype, &grad),
                );
                let (mine, theirs) = (fresh(&mut mem, dtype, n), fresh(&mut mem, dtype, n));
                let desc = |output| UnaryBackwardDesc {
                    op,
                    dtype,
                    saved: StridedBuf::contiguous(s, &[n]),
                    grad: StridedBuf::contiguous(g, &[n]),
                    output,
                };
                unary_backward(&mut mem, &desc(mine), ctx).unwrap();
                reference::unary_backward(&mut mem, &desc(theirs)).unwrap();
                let got = mem.load_dense(dtype, mine, n).unwrap();
                let want = mem.load_dense(dtype, theirs, n).unwrap();
                let what = format!("{} backward {dtype} ({} threads)", op.name(), ctx.threads);
                assert_close(&got, &want, dtype, &what);
            }
        }
    });
}

#[test]
fn unary_splits_large_inputs_across_threads() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        let n = 2 * TASK_ELEMENTS + BLOCK + 17;
        for op in [UnaryOp::Exp, UnaryOp::Gelu, UnaryOp::Neg, UnaryOp::Log] {
            let (lo, hi) = domain(op);
            for dtype in FLOATS {
                let ptr = upload(&mut mem, dtype, &values(n, 11, lo, hi));
                let input = StridedBuf::contiguous(ptr, &[n]);
                check_unary(&mut mem, op, dtype, input, ctx);
                let t = StridedBuf {
                    ptr,
                    layout: Layout::new(vec![n / 7, 7], vec![1, n / 7], 0).unwrap(),
                };
                check_unary(&mut mem, op, dtype, t, ctx);
            }
        }
    });
}

#[test]
fn unary_agrees_on_special_values() {
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -1e-40,
        1e30,
        -1e30,
        60.0,
        -60.0,
        -110.0,
        0.5,
        -3.0,
    ];
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        for &op in UnaryOp::ALL {
            for dtype in FLOATS {
                let ptr = upload(&mut mem, dtype, &specials);
                let input = StridedBuf::contiguous(ptr, &[specials.len()]);
                check_unary(&mut mem, op, dtype, input, ctx);
            }
        }
    });
}

#[test]
fn unary_works_in_place() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        let n = 2 * TASK_ELEMENTS + 5;
        for op in [UnaryOp::Tanh, UnaryOp::Relu, UnaryOp::Sqrt, UnaryOp::Sin] {
            let (lo, hi) = domain(op);
            for dtype in FLOATS {
                let vals = values(n, 3, lo, hi);
                let (x, copy) = (
                    upload(&mut mem, dtype, &vals),
                    upload(&mut mem, dtype, &vals),
                );
                let theirs = fresh(&mut mem, dtype, n);
                let desc = |input, output| UnaryDesc {
                    op,
                    dtype,
                    input: StridedBuf::contiguous(input, &[n]),
                    output,
                };
                unary(&mut mem, &desc(x, x), ctx).unwrap();
                reference::unary(&mut mem, &desc(copy, theirs)).unwrap();
                let got = mem.load_dense(dtype, x, n).unwrap();
                let want = mem.load_dense(dtype, theirs, n).unwrap();
                assert_close(
                    &got,
                    &want,
                    dtype,
                    &format!("in-place {} {dtype}", op.name()),
                );
            }
        }
    });
}

/// One binary test: name, shape, lhs and rhs layouts, lhs and rhs buffer elements.
type BinaryCase = (&'static str, Vec<usize>, Layout, Layout, usize, usize);

/// Operand layouts of binary tests over `shape`: `(lhs, rhs, lhs elements, rhs elements)`.
fn binary_cases() -> Vec<BinaryCase> {
    let (r, c) = (9, BLOCK + 5);
    let nchw = [2, 3, 5, 7];
    vec![
        (
            "dense",
            vec![r, c],
            Layout::contiguous(&[r, c]),
            Layout::contiguous(&[r, c]),
            r * c,
            r * c,
        ),
        (
            "scalar rhs",
            vec![r, c],
            Layout::contiguous(&[r, c]),
            Layout::new(vec![r, c], vec![0, 0], 0).unwrap(),
            r * c,
            1,
        ),
        (
            "scalar lhs",
            vec![r, 5],
            Layout::new(vec![r, 5], vec![0, 0], 2).unwrap(),
            Layout::contiguous(&[r, 5]),
            3,
            r * 5,
        ),
        (
            "row rhs",
            vec![r, c],
            Layout::contiguous(&[r, c]),
            Layout::new(vec![r, c], vec![0, 1], 0).unwrap(),
            r * c,
            c,
        ),
        (
            "column lhs",
            vec![r, 6],
            Layout::new(vec![r, 6], vec![1, 0], 0).unwrap(),
            Layout::contiguous(&[r, 6]),
            r,
            r * 6,
        ),
        (
            "channel bias",
            nchw.to_vec(),
            Layout::contiguous(&nchw),
            Layout::new(nchw.to_vec(), vec![0, 1, 0, 0], 0).unwrap(),
            210,
            3,
        ),
        (
            "outer",
            vec![r, 11],
            Layout::new(vec![r, 11], vec![1, 0], 0).unwrap(),
            Layout::new(vec![r, 11], vec![0, 1], 0).unwrap(),
            r,
            11,
        ),
        (
            "transposed",
            vec![r, 13],
            Layout::new(vec![r, 13], vec![1, r], 0).unwrap(),
            Layout::new(vec![r, 13], vec![0, 2], 1).unwrap(),
            r * 13,
            27,
        ),
    ]
}

/// Runs binary `op` with this backend's kernel and the reference and compares; `output` is where
/// this backend's result goes (possibly an operand), `theirs` the reference's output.
#[allow(clippy::too_many_arguments)]
fn check_binary(
    mem: &mut HostMemory,
    op: BinaryOp,
    dtype: DType,
    lhs: StridedBuf,
    rhs: impl Into<Value>,
    reference_operands: (StridedBuf, impl Into<Value>),
    output: DevicePtr,
    ctx: Ctx,
    what: &str,
) {
    let n = lhs.layout.numel();
    let theirs = fresh(mem, dtype, n);
    let mine = BinaryDesc {
        op,
        dtype,
        lhs,
        rhs: rhs.into(),
        output,
    };
    let want = BinaryDesc {
        op,
        dtype,
        lhs: reference_operands.0,
        rhs: reference_operands.1.into(),
        output: theirs,
    };
    reference::binary(mem, &want).unwrap();
    binary(mem, &mine, ctx).unwrap();
    let got = mem.load_dense(dtype, output, n).unwrap();
    let want = mem.load_dense(dtype, theirs, n).unwrap();
    let what = format!("{} {dtype} {what} ({} threads)", op.name(), ctx.threads);
    assert_close(&got, &want, dtype, &what);
}

#[test]
fn binary_matches_the_reference_for_every_op_dtype_and_broadcast() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        for &op in BinaryOp::ALL {
            let lo = if op == BinaryOp::Pow { 0.5 } else { -2.0 };
            for dtype in FLOATS {
                for (what, shape, la, lb, na, nb) in binary_cases() {
                    let a = upload(&mut mem, dtype, &values(na, 1, lo, 2.0));
                    let b = upload(&mut mem, dtype, &values(nb, 2, -2.0, 2.0));
                    assert_eq!(la.shape(), &shape[..]);
                    let (a, b) = (
                        StridedBuf { ptr: a, layout: la },
                        StridedBuf { ptr: b, layout: lb },
                    );
                    let out = fresh(&mut mem, dtype, shape.iter().product());
                    let ops = (a.clone(), b.clone());
                    check_binary(&mut mem, op, dtype, a, b, ops, out, ctx, what);
                }
            }
        }
    });
}

#[test]
fn binary_handles_nan_and_large_threaded_inputs() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        let n = 2 * TASK_ELEMENTS + 3;
        for &op in BinaryOp::ALL {
            for dtype in FLOATS {
                let mut va = values(n, 5, 0.5, 2.0);
                let mut vb = values(n, 6, -2.0, 2.0);
                va[3] = f64::NAN;
                vb[4] = f64::NAN;
                vb[5] = 0.0;
                va[6] = f64::INFINITY;
                let (a, b) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &vb));
                let (a, b) = (
                    StridedBuf::contiguous(a, &[n]),
                    StridedBuf::contiguous(b, &[n]),
                );
                let out = fresh(&mut mem, dtype, n);
                let ops = (a.clone(), b.clone());
                check_binary(&mut mem, op, dtype, a, b, ops, out, ctx, "large");
            }
        }
    });
}

#[test]
fn binary_works_in_place() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        let (r, c) = (3, TASK_ELEMENTS + 1);
        let n = r * c;
        for op in [BinaryOp::Add, BinaryOp::Div, BinaryOp::Maximum] {
            for dtype in FLOATS {
                let (va, vb) = (values(n, 8, -2.0, 2.0), values(c, 9, 0.5, 2.0));
                let row = Layout::new(vec![r, c], vec![0, 1], 0).unwrap();
                let dense = Layout::contiguous(&[r, c]);
                let buf = |ptr, layout: &Layout| StridedBuf {
                    ptr,
                    layout: layout.clone(),
                };
                let b = upload(&mut mem, dtype, &vb);
                // Output = lhs, rhs a broadcast row.
                let (a, copy) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &va));
                let refs = (buf(copy, &dense), buf(b, &row));
                let (x, y) = (buf(a, &dense), buf(b, &row));
                check_binary(&mut mem, op, dtype, x, y, refs, a, ctx, "out = lhs");
                // Output = rhs, lhs a broadcast row.
                let (a, copy) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &va));
                let refs = (buf(b, &row), buf(copy, &dense));
                let (x, y) = (buf(b, &row), buf(a, &dense));
                check_binary(&mut mem, op, dtype, x, y, refs, a, ctx, "out = rhs");
                // Output = lhs = rhs.
                let (a, copy) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &va));
                let refs = (buf(copy, &dense), buf(copy, &dense));
                let (x, y) = (buf(a, &dense), buf(a, &dense));
                check_binary(&mut mem, op, dtype, x, y, refs, a, ctx, "out = lhs = rhs");
                // Output = lhs, rhs dense.
                let (a, copy) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &va));
                let c2 = upload(&mut mem, dtype, &values(n, 10, 0.5, 2.0));
                let refs = (buf(copy, &dense), buf(c2, &dense));
                let (x, y) = (buf(a, &dense), buf(c2, &dense));
                check_binary(&mut mem, op, dtype, x, y, refs, a, ctx, "out = lhs, dense");
            }
        }
    });
}

#[test]
fn scalar_operands_match_a_stored_broadcast_scalar() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        let (r, c) = (5, TASK_ELEMENTS / 4 + 3);
        let n = r * c;
        for &op in BinaryOp::ALL {
            // Not representable in any dtype, so each path must round it the same way.
            let scalar = if op == BinaryOp::Pow { 1.3 } else { -0.3 };
            let lo = if op == BinaryOp::Pow { 0.5 } else { -2.0 };
            for dtype in FLOATS {
                let mut va = values(n, 11, lo, 2.0);
                va[1] = f64::NAN;
                let stored = upload(&mut mem, dtype, &[scalar]);
                let splat = Value::Tensor(StridedBuf {
                    ptr: stored,
                    layout: Layout::new(vec![r, c], vec![0, 0], 0).unwrap(),
                });
                let a = upload(&mut mem, dtype, &va);
                let views = [
                    ("dense", Layout::contiguous(&[r, c])),
                    (
                        "transposed",
                        Layout::contiguous(&[c, r]).transpose(0, 1).unwrap(),
                    ),
                ];
                for (what, layout) in views {
                    let x = StridedBuf { ptr: a, layout };
                    let out = fresh(&mut mem, dtype, n);
                    let refs = (x.clone(), splat.clone());
                    let what = format!("scalar, {what}");
                    let s = Value::Scalar(scalar);
                    check_binary(&mut mem, op, dtype, x, s, refs, out, ctx, &what);
                }
                // In place.
                let (a, copy) = (upload(&mut mem, dtype, &va), upload(&mut mem, dtype, &va));
                let x = StridedBuf::contiguous(a, &[n]);
                let splat = Value::Tensor(StridedBuf {
                    ptr: stored,
                    layout: Layout::new(vec![n], vec![0], 0).unwrap(),
                });
                let refs = (StridedBuf::contiguous(copy, &[n]), splat);
                let s = Value::Scalar(scalar);
                check_binary(&mut mem, op, dtype, x, s, refs, a, ctx, "scalar, in place");
            }
        }
    });
}

/// Bytes of the `n` elements of `dtype` at `ptr`.
fn raw(mem: &HostMemory, dtype: DType, ptr: DevicePtr, n: usize) -> Vec<u8> {
    mem.bytes(ptr, n * dtype.size_in_bytes()).unwrap().to_vec()
}

/// Asserts two outputs of `dtype` are identical (NaNs of any payload count as equal).
fn assert_same(mem: &HostMemory, dtype: DType, a: DevicePtr, b: DevicePtr, n: usize, what: &str) {
    if dtype.is_float() {
        let (x, y) = (
            mem.load_dense(dtype, a, n).unwrap(),
            mem.load_dense(dtype, b, n).unwrap(),
        );
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            assert!(
                p.to_bits() == q.to_bits() || p.is_nan() && q.is_nan(),
                "{what}: element {i} is {p}, not {q}"
            );
        }
    } else {
        assert_eq!(raw(mem, dtype, a, n), raw(mem, dtype, b, n), "{what}");
    }
}

#[test]
fn cast_matches_the_reference_exactly_for_every_pair() {
    let mut specials = vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.5,
        -0.5,
        1.5,
        2.5,
        -1.7,
        255.9,
        256.0,
        -1.0,
        3e9,
        -3e9,
        1e20,
        -1e20,
        65_519.0,
        65_520.0,
        1e-7,
        6e-8,
        1.0000001,
    ];
    specials.extend(values(BLOCK + 40, 4, -300.0, 300.0));
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        for src in FLOATS {
            for dst in DType::ALL {
                let ptr = upload(&mut mem, src, &specials);
                let n = specials.len();
                let layouts = [
                    Layout::contiguous(&[n]),
                    Layout::new(vec![n / 3, 3], vec![1, n / 3], 0).unwrap(),
                ];
                for layout in layouts {
                    let m = layout.numel();
                    let (mine, theirs) = (fresh(&mut mem, dst, m), fresh(&mut mem, dst, m));
                    let desc = |output| CastDesc {
                        src_dtype: src,
                        dst_dtype: dst,
                        input: StridedBuf {
                            ptr,
                            layout: layout.clone(),
                        },
                        output,
                    };
                    cast(&mut mem, &desc(mine), ctx).unwrap();
                    reference::cast(&mut mem, &desc(theirs)).unwrap();
                    assert_same(&mem, dst, mine, theirs, m, &format!("{src} → {dst}"));
                }
            }
        }
    });
}

#[test]
fn cast_works_in_place_and_on_large_inputs() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        let n = 2 * TASK_ELEMENTS + 9;
        let vals = values(n, 12, -1000.0, 1000.0);
        for (src, dst) in [
            (DType::F32, DType::I32),
            (DType::F16, DType::BF16),
            (DType::F64, DType::I64),
            (DType::F32, DType::F32),
            (DType::F32, DType::F16),
            (DType::BF16, DType::F32),
        ] {
            let (x, copy) = (upload(&mut mem, src, &vals), upload(&mut mem, src, &vals));
            let theirs = fresh(&mut mem, dst, n);
            let desc = |input, output| CastDesc {
                src_dtype: src,
                dst_dtype: dst,
                input: StridedBuf::contiguous(input, &[n]),
                output,
            };
            let out = if src.size_in_bytes() == dst.size_in_bytes() {
                x
            } else {
                fresh(&mut mem, dst, n)
            };
            cast(&mut mem, &desc(x, out), ctx).unwrap();
            reference::cast(&mut mem, &desc(copy, theirs)).unwrap();
            assert_same(&mem, dst, out, theirs, n, &format!("{src} → {dst}"));
        }
    });
}

#[test]
fn fill_matches_the_reference() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        for dtype in FLOATS {
            for len in [1, 5, BLOCK + 1, 2 * TASK_ELEMENTS + 7] {
                for value in [-0.375, 1.0 / 3.0, 1e10, f64::NAN] {
                    let (mine, theirs) = (fresh(&mut mem, dtype, len), fresh(&mut mem, dtype, len));
                    let desc = |ptr| FillDesc {
                        dtype,
                        ptr,
                        len,
                        value,
                    };
                    fill(&mut mem, &desc(mine), ctx).unwrap();
                    reference::fill(&mut mem, &desc(theirs)).unwrap();
                    assert_same(&mem, dtype, mine, theirs, len, &format!("fill {dtype}"));
                }
            }
        }
    });
}

#[test]
fn copy_strided_matches_the_reference() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        let (a, b, c) = (5, 7, 2 * TASK_ELEMENTS / 35 + 3);
        let n = a * b * c;
        let mut cases = vec![
            // Permuted source into a dense destination.
            (
                Layout::new(vec![c, a, b], vec![1, b * c, c], 0).unwrap(),
                Layout::contiguous(&[c, a, b]),
            ),
            // Dense rows into a narrowed, offset destination.
            (
                Layout::contiguous(&[a, b, c]),
                Layout::new(vec![a, b, c], vec![b * (c + 4), c + 4, 1], 2).unwrap(),
            ),
            // Strided to strided.
            (
                Layout::new(vec![a, b, c], vec![1, a, a * b], 0).unwrap(),
                Layout::new(vec![a, b, c], vec![b * c, 1, b], 0).unwrap(),
            ),
            // A transpose across tile and block edges (250 rows, 259 columns), offset.
            (
                Layout::new(vec![259, 250], vec![1, 259], 7).unwrap(),
                Layout::contiguous(&[259, 250]),
            ),
            // Transposed planes read from one broadcast source plane.
            (
                Layout::new(vec![3, 20, 30], vec![0, 1, 20], 0).unwrap(),
                Layout::contiguous(&[3, 20, 30]),
            ),
        ];
        // Short dense runs (attention heads split and merged): `[b, t, h, d]` read from
        // `[b, h, t, d]`, written into a dense tensor and into one slot of a stack of three,
        // for run lengths that hit each fixed-size copy for some dtype, and some that do not.
        let (bs, t, h) = (3, 67, 5);
        for d in [1, 3, 4, 8, 16, 17, 32, 64] {
            let heads = Layout::new(vec![bs, t, h, d], vec![h * t * d, d, t * d, 1], 0).unwrap();
            let slot = Layout::new(
                vec![bs, t, h, d],
                vec![t * 3 * h * d, 3 * h * d, d, 1],
                h * d,
            )
            .unwrap();
            cases.push((heads.clone(), Layout::contiguous(&[bs, t, h, d])));
            cases.push((heads, slot.clone()));
            cases.push((Layout::contiguous(&[bs, t, h, d]), slot));
        }
        for dtype in FLOATS {
            let src = upload(&mut mem, dtype, &values(n, 13, -5.0, 5.0));
            for (ls, ld) in cases.iter() {
                let span = ld.span_elements().unwrap();
                let (mine, theirs) = (fresh(&mut mem, dtype, span), fresh(&mut mem, dtype, span));
                let desc = |ptr| CopyDesc {
                    dtype,
                    src: StridedBuf {
                        ptr: src,
                        layout: ls.clone(),
                    },
                    dst: StridedBuf {
                        ptr,
                        layout: ld.clone(),
                    },
                };
                copy_strided(&mut mem, &desc(mine), ctx).unwrap();
                reference::copy_strided(&mut mem, &desc(theirs)).unwrap();
                // The whole destination buffer: untouched (poison) elements must agree too.
                assert_eq!(
                    raw(&mem, dtype, mine, span),
                    raw(&mem, dtype, theirs, span),
                    "copy {dtype} {ls:?} → {ld:?}"
                );
            }
            // Exactly in place: nothing changes.
            let before = raw(&mem, dtype, src, n);
            let dense = StridedBuf::contiguous(src, &[n]);
            let desc = CopyDesc {
                dtype,
                src: dense.clone(),
                dst: dense,
            };
            copy_strided(&mut mem, &desc, ctx).unwrap();
            assert_eq!(raw(&mem, dtype, src, n), before);
        }
    });
}

#[test]
fn random_is_bit_identical_to_the_reference() {
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        for dtype in FLOATS {
            for len in [1, 101, 2 * TASK_ELEMENTS + 3] {
                for distribution in [
                    Distribution::Uniform {
                        low: -1.0,
                        high: 3.0,
                    },
                    Distribution::Normal {
                        mean: 0.5,
                        std: 2.0,
                    },
                ] {
                    let (mine, theirs) = (fresh(&mut mem, dtype, len), fresh(&mut mem, dtype, len));
                    let desc = |ptr| RandomDesc {
                        dtype,
                        ptr,
                        len,
                        distribution,
                        seed: 42,
                    };
                    random(&mut mem, &desc(mine), ctx).unwrap();
                    reference::random(&mut mem, &desc(theirs)).unwrap();
                    assert_eq!(
                        raw(&mem, dtype, mine, len),
                        raw(&mem, dtype, theirs, len),
                        "random {dtype} {distribution:?}"
                    );
                }
            }
        }
    });
}

#[test]
fn dropout_is_bit_identical_to_the_reference_in_and_out_of_place() {
    // Lengths around the kernel's runs of 256 and past one task, so that threads split it; a
    // NaN and infinities among the inputs, which a dropped element still zeroes.
    for_threads(|ctx| {
        let mut mem = HostMemory::default();
        for dtype in FLOATS {
            for len in [1, 255, 256, 257, 1000, 2 * TASK_ELEMENTS + 3] {
                for p in [0.0, 0.3, 0.5, 1.0] {
                    let mut vals = values(len, len as u64, -2.0, 2.0);
                    vals[len / 2] = f64::NAN;
                    vals[len - 1] = f64::INFINITY;
                    vals[0] = f64::NEG_INFINITY;
                    let x = upload(&mut mem, dtype, &vals);
                    let (mine, theirs) = (fresh(&mut mem, dtype, len), fresh(&mut mem, dtype, len));
                    let desc = |input, output| DropoutDesc {
                        dtype,
                        input,
                        output,
                        len,
                        p,
                        seed: 7,
                    };
                    reference::dropout(&mut mem, &desc(x, theirs)).unwrap();
                    dropout(&mut mem, &desc(x, mine), ctx).unwrap();
                    let what = format!("dropout p {p} {dtype} of {len}");
                    assert_same(&mem, dtype, mine, theirs, len, &what);
                    dropout(&mut mem, &desc(x, x), ctx).unwrap();
                    assert_same(&mem, dtype, x, theirs, len, &format!("{what} in place"));
                }
            }
        }
    });
}

#[test]
fn dims_merge_and_walk_runs() {
    // A [2, 3, 4] walk whose lhs is dense and rhs broadcasts the middle dim.
    let dims = Dims::new(&[2, 1, 3, 4], [&[12, 12, 4, 1], &[4, 0, 0, 1]]);
    assert_eq!(dims.shape, [2, 3, 4]);
    let mut seen = Vec::new();
    dims.runs(5..19, |at, pos, len| seen.push((at, pos, len)));
    assert_eq!(
        seen,
        [
            (5, [5, 1], 3),
            (8, [8, 0], 4),
            (12, [12, 4], 4),
            (16, [16, 4], 3)
        ]
    );
    // Fully dense operands merge into one dim.
    let dense = Dims::new(&[3, 5, 7], [&[35, 7, 1], &[35, 7, 1]]);
    assert_eq!(dense.inner(), (105, [1, 1]));
    // A scalar-like view of rank 0.
    let scalar = Dims::<2>::new(&[], [&[], &[]]);
    assert_eq!(scalar.numel(), 1);
}

/// Elements of `dtype` just past the output size written with streaming stores, odd so that the
/// last block and the tasks' ranges end mid-line.
fn streamed_len(dtype: DType) -> usize {
    let n = STREAM_BYTES / dtype.size_in_bytes() + 1237;
    assert!(worth_streaming(n * dtype.size_in_bytes()));
    n
}

#[test]
fn streamed_unary_and_binary_outputs_match_the_reference() {
    for_threads(|ctx| {
        for dtype in FLOATS {
            let mut mem = HostMemory::default();
            let n = streamed_len(dtype);
            let (rows, cols) = (n / 2053, 2053);
            let a = upload(&mut mem, dtype, &values(n, 21, -3.0, 3.0));
            let b = upload(&mut mem, dtype, &values(n, 22, -3.0, 3.0));
            for op in [UnaryOp::Exp, UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Gelu] {
                check_unary(&mut mem, op, dtype, StridedBuf::contiguous(a, &[n]), ctx);
            }
            let dense = |ptr| StridedBuf::contiguous(ptr, &[n]);
            let out = fresh(&mut mem, dtype, n);
            let ops = (dense(a), dense(b));
            check_binary(
                &mut mem,
                BinaryOp::Mul,
                dtype,
                dense(a),
                dense(b),
                ops,
                out,
                ctx,
                "streamed",
            );
            let out = fresh(&mut mem, dtype, n);
            let ops = (dense(a), Value::Scalar(0.75));
            let what = "streamed, scalar rhs";
            check_binary(
                &mut mem,
                BinaryOp::Sub,
                dtype,
                dense(a),
                Value::Scalar(0.75),
                ops,
                out,
                ctx,
                what,
            );
            // A row broadcast over a matrix: runs of one row each (past `STREAM_RUN_BYTES` in every
            // dtype), streamed one after another.
            assert!(cols * dtype.size_in_bytes() >= STREAM_RUN_BYTES);
            let m = rows * cols;
            let lhs = StridedBuf::contiguous(a, &[rows, cols]);
            let row = StridedBuf {
                ptr: b,
                layout: Layout::new(vec![rows, cols], vec![0, 1], 3).unwrap(),
            };
            let out = fresh(&mut mem, dtype, m);
            let ops = (lhs.clone(), row.clone());
            check_binary(
                &mut mem,
                BinaryOp::Add,
                dtype,
                lhs,
                row,
                ops,
                out,
                ctx,
                "streamed, row rhs",
            );
        }
    });
}

#[test]
fn streamed_fills_and_copies_match_the_reference() {
    for_threads(|ctx| {
        for dtype in FLOATS {
            let mut mem = HostMemory::default();
            let len = streamed_len(dtype);
            let (mine, theirs) = (fresh(&mut mem, dtype, len), fresh(&mut mem, dtype, len));
            let desc = |ptr| FillDesc {
                dtype,
                ptr,
                len,
                value: -1.0 / 3.0,
            };
            fill(&mut mem, &desc(mine), ctx).unwrap();
            reference::fill(&mut mem, &desc(theirs)).unwrap();
            assert_same(
                &mem,
                dtype,
                mine,
                theirs,
                len,
                &format!("streamed fill {dtype}"),
            );
            // Dense rows of 4 KiB and more into a narrowed destination that starts off a line.
            let cols = 4096 / dtype.size_in_bytes() + 13;
            let rows = len / cols;
            let src = upload(&mut mem, dtype, &values(rows * cols, 23, -1.0, 1.0));
            let dst = Layout::new(vec![rows, cols], vec![cols + 3, 1], 5).unwrap();
            let span = dst.offset() + (rows - 1) * (cols + 3) + cols;
            let (mine, theirs) = (fresh(&mut mem, dtype, span), fresh(&mut mem, dtype, span));
            let desc = |ptr| CopyDesc {
                dtype,
                src: StridedBuf::contiguous(src, &[rows, cols]),
                dst: StridedBuf {
                    ptr,
                    layout: dst.clone(),
                },
            };
            copy_strided(&mut mem, &desc(mine), ctx).unwrap();
            reference::copy_strided(&mut mem, &desc(theirs)).unwrap();
            let what = format!("streamed strided copy {dtype}");
            // The gaps between rows stay as the allocation left them in both.
            assert_same(&mem, dtype, mine, theirs, span, &what);
            // A device-to-device copy into a destination three bytes off its allocation's start.
            let bytes = len * dtype.size_in_bytes();
            let src = upload(&mut mem, dtype, &values(len, 24, -1.0, 1.0));
            let dst = mem.alloc(bytes + 3).unwrap();
            let to = dst.offset(3).unwrap();
            crate::backends::cpu::copy::device_to_device(&mut mem, to, src, bytes, ctx).unwrap();
            let (got, want) = (
                mem.bytes(to, bytes).unwrap(),
                mem.bytes(src, bytes).unwrap(),
            );
            assert!(got == want, "streamed copy_dtod of {bytes} bytes ({dtype})");
        }
    });
}
