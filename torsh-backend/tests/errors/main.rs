//! Bad-input tests: every mistake a caller can make must come back as the right [`BackendError`]
//! variant — never a panic, never `Ok` — both through the `Backend`/`Tensor` API and through the raw
//! [`ComputeBackend`] trait (`backend.compute()`), on the reference and the CPU backends. After an error
//! the backend must keep working, so most tests end by running small valid ops on the same backend.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use torsh_backend::backends::reference::ReferenceBackend;
use torsh_backend::compute::{
    AdamDesc, AttentionBackwardDesc, AttentionDesc, BatchNormDesc, BatchedGemmDesc, BinaryDesc,
    CastDesc, Conv2dBackwardInputDesc, Conv2dBackwardWeightDesc, Conv2dDesc, CopyDesc,
    Distribution, DropoutDesc, FillDesc, GemmDesc, GemvDesc, LayerNormBackwardDesc, LayerNormDesc,
    Pool2dBackwardDesc, Pool2dDesc, PoolKind, RandomDesc, ReduceDesc, SoftmaxDesc, StridedBuf,
    UnaryBackwardDesc, UnaryDesc, Value,
};
use torsh_backend::prelude::*;
use torsh_backend::{ComputeBackend, DevicePtr, Layout, Transpose};

#[path = "../common/mod.rs"]
mod common;
use common::{backends, download, upload};

// ---------------------------------------------------------------------------------------------------
// Assertion helpers
// ---------------------------------------------------------------------------------------------------

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic payload>".into()
    }
}

/// Evaluates an expression; a panic inside the library becomes a test failure that says so.
macro_rules! no_panic {
    ($e:expr) => {
        match catch_unwind(AssertUnwindSafe(|| $e)) {
            Ok(value) => value,
            Err(payload) => panic!(
                "LIBRARY PANIC in `{}`: {}",
                stringify!($e),
                panic_text(&*payload)
            ),
        }
    };
}

/// Asserts that an expression returns `Err` of one of the given `BackendError` variants (and has a
/// non-empty message); shows what came back otherwise. Returns the error.
macro_rules! assert_err {
    ($e:expr, $($variant:ident)|+) => {
        match no_panic!($e) {
            Err(err) if matches!(err, $(BackendError::$variant { .. })|+) => {
                let msg = err.to_string();
                assert!(
                    !msg.trim().is_empty(),
                    "`{}`: {:?} has an empty Display message",
                    stringify!($e),
                    err
                );
                err
            }
            other => panic!(
                "`{}`: expected Err({}), got {:?}",
                stringify!($e),
                stringify!($($variant)|+),
                other
            ),
        }
    };
}

/// Asserts that an expression returns `Ok` (without panicking) and yields the value.
macro_rules! assert_ok {
    ($e:expr) => {
        match no_panic!($e) {
            Ok(value) => value,
            Err(err) => panic!(
                "`{}`: expected Ok, got Err({:?}): {}",
                stringify!($e),
                err,
                err
            ),
        }
    };
}

/// Asserts that the error's message mentions every word (an op name, an operand, a number).
fn assert_mentions(err: &BackendError, words: &[&str]) {
    let msg = err.to_string();
    for w in words {
        assert!(
            msg.contains(w),
            "the message {msg:?} of {err:?} should mention {w:?}"
        );
    }
}

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol, "got {got:?}, want {want:?}");
    }
}

// ---------------------------------------------------------------------------------------------------
// Tensor helpers
// ---------------------------------------------------------------------------------------------------

fn t(b: &Backend, data: &[f32], shape: &[usize]) -> Tensor {
    b.from_slice(data, shape).expect("from_slice")
}

/// A tensor of `shape` holding -1, -0.75, -0.5, ...
fn seq(b: &Backend, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 1.0).collect();
    t(b, &v, shape)
}

fn vals(x: &Tensor) -> Vec<f32> {
    x.to_vec::<f32>().expect("to_vec::<f32>")
}

/// Small valid ops on `b` give the right answers (run after errors: the backend must still work).
fn assert_backend_works(b: &Backend) {
    let a = t(b, &[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let x = t(b, &[1.0, -1.0], &[2, 1]);
    let y = assert_ok!(b.matmul(&a, &x));
    assert_eq!(y.shape(), &[2, 1]);
    assert_eq!(vals(&y), vec![-1.0, -1.0]);
    let r = assert_ok!(b.relu(&t(b, &[-1.0, 2.0], &[2])));
    assert_eq!(vals(&r), vec![0.0, 2.0]);
    let s = assert_ok!(b.add(&a, &t(b, &[10.0, 20.0], &[2])));
    assert_eq!(vals(&s), vec![11.0, 22.0, 13.0, 24.0]);
    let m = assert_ok!(b.sum(&a, 1, false));
    assert_eq!(vals(&m), vec![3.0, 7.0]);
    raw_works(b.compute());
}

// ---------------------------------------------------------------------------------------------------
// Raw helpers
// ---------------------------------------------------------------------------------------------------

fn bytes_of(data: &[f32]) -> Vec<u8> {
    data.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s_of(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn off(p: DevicePtr, bytes: usize) -> DevicePtr {
    p.offset(bytes).expect("offset fits")
}

/// A column-major f32 GEMM `C (m×n) = A (m×k) · B (k×n)` with the tightest leading dimensions.
fn gemm_desc(a: DevicePtr, b: DevicePtr, c: DevicePtr, m: usize, n: usize, k: usize) -> GemmDesc {
    GemmDesc {
        dtype: DType::F32,
        trans_a: Transpose::No,
        trans_b: Transpose::No,
        m,
        n,
        k,
        alpha: 1.0,
        a,
        lda: m.max(1),
        b,
        ldb: k.max(1),
        beta: 0.0,
        c,
        ldc: m.max(1),
    }
}

/// An f32 `y = A·x` with A `m × n` column-major.
fn gemv_desc(a: DevicePtr, x: DevicePtr, y: DevicePtr, m: usize, n: usize) -> GemvDesc {
    GemvDesc {
        dtype: DType::F32,
        trans: Transpose::No,
        m,
        n,
        alpha: 1.0,
        a,
        lda: m.max(1),
        x,
        incx: 1,
        beta: 0.0,
        y,
        incy: 1,
    }
}

/// A 3×3 single-channel input convolved with a 2×2 kernel into a 2×2 output.
fn conv_desc(input: DevicePtr, weight: DevicePtr, output: DevicePtr) -> Conv2dDesc {
    Conv2dDesc {
        dtype: DType::F32,
        input,
        input_shape: [1, 1, 3, 3],
        weight,
        weight_shape: [1, 1, 2, 2],
        bias: None,
        output,
        output_shape: [1, 1, 2, 2],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        groups: 1,
    }
}

fn unary_desc(op: UnaryOp, input: StridedBuf, output: DevicePtr) -> UnaryDesc {
    UnaryDesc {
        op,
        dtype: DType::F32,
        input,
        output,
    }
}

fn adam_desc(params: DevicePtr, grads: DevicePtr, m: DevicePtr, v: DevicePtr) -> AdamDesc {
    AdamDesc {
        dtype: DType::F32,
        params,
        grads,
        exp_avg: m,
        exp_avg_sq: v,
        len: 4,
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled_weight_decay: false,
        step: 1,
    }
}

/// Raw alloc / gemm / unary / free give the right answers.
fn raw_works(c: &dyn ComputeBackend) {
    // Column-major A = [[1, 3], [2, 4]] times the identity.
    let a = upload(c, &[1.0, 2.0, 3.0, 4.0]);
    let eye = upload(c, &[1.0, 0.0, 0.0, 1.0]);
    let out = c.alloc(16).expect("alloc");
    assert_ok!(c.gemm(&gemm_desc(a, eye, out, 2, 2, 2)));
    assert_eq!(download(c, out, 4), vec![1.0, 2.0, 3.0, 4.0]);
    assert_ok!(c.unary(&unary_desc(
        UnaryOp::Neg,
        StridedBuf::contiguous(a, &[4]),
        out
    )));
    assert_eq!(download(c, out, 4), vec![-1.0, -2.0, -3.0, -4.0]);
    for p in [a, eye, out] {
        assert_ok!(c.free(p));
    }
}

mod api;
mod attention;
mod construction;
mod index;
mod memory;
mod select;
mod shapes;
mod sizes;
mod training;
mod windows;
