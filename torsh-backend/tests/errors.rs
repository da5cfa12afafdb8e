//! Bad-input tests: every mistake a caller can make must come back as the right [`BackendError`]
//! variant — never a panic, never `Ok` — both through the `Backend`/`Tensor` API and through the raw
//! [`ComputeBackend`] trait (`backend.compute()`), on the reference and the CPU backends. After an error
//! the backend must keep working, so most tests end by running small valid ops on the same backend.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use torsh_backend::backends::reference::ReferenceBackend;
use torsh_backend::compute::{
    AdamDesc, AttentionDesc, BatchNormDesc, BatchedGemmDesc, BinaryDesc, CastDesc, Conv2dDesc,
    CopyDesc, Distribution, FillDesc, GemmDesc, GemvDesc, LayerNormDesc, Pool2dDesc, PoolKind,
    RandomDesc, ReduceDesc, SoftmaxDesc, StridedBuf, UnaryDesc,
};
use torsh_backend::prelude::*;
use torsh_backend::{ComputeBackend, DevicePtr, Layout, Transpose};

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

// ---------------------------------------------------------------------------------------------------
// Construction
// ---------------------------------------------------------------------------------------------------

#[test]
fn unavailable_backends_and_bad_builder_settings() {
    let available = Backend::available();
    for kind in [
        BackendType::Cuda,
        BackendType::WebGpu,
        BackendType::Rocm,
        BackendType::Metal,
    ] {
        if available.contains(&kind) {
            continue;
        }
        let err = assert_err!(Backend::new(kind), Unavailable);
        match &err {
            BackendError::Unavailable { backend, reason } => {
                assert_eq!(*backend, kind);
                assert!(!reason.trim().is_empty(), "{kind}: empty reason");
            }
            other => unreachable!("{other:?}"),
        }
        assert_mentions(&err, &[kind.name(), "unavailable"]);
    }
    if available.contains(&BackendType::Cuda) {
        assert_err!(Backend::cuda().device(1 << 20).build(), InvalidArgument);
    } else {
        assert_err!(Backend::cuda().build(), Unavailable);
        assert_err!(Backend::cuda().device(3).build(), Unavailable);
    }
    if available.contains(&BackendType::WebGpu) {
        assert_err!(Backend::webgpu().device(1 << 20).build(), InvalidArgument);
    } else {
        assert_err!(Backend::webgpu().build(), Unavailable);
    }
    assert_err!(Backend::rocm().build(), Unavailable);
    assert_err!(Backend::metal().build(), Unavailable);
    for status in Backend::probe() {
        if let Err(reason) = &status.availability {
            assert!(
                !reason.trim().is_empty(),
                "{}: empty reason",
                status.backend_type
            );
        }
    }

    let r = Backend::reference().expect("reference");
    let err = assert_err!(r.device(1), InvalidArgument);
    assert_mentions(&err, &["device", "1"]);
    let cpu = Backend::cpu().build().expect("cpu");
    assert_err!(cpu.device(7), InvalidArgument);
    assert_err!(
        BackendBuilder::new()
            .backend_type(BackendType::Reference)
            .device_id(2)
            .build(),
        InvalidArgument
    );
    assert_ok!(r.device(0));

    let err = assert_err!(Backend::cpu().num_threads(0).build(), InvalidArgument);
    assert_mentions(&err, &["num_threads"]);
    assert_err!(
        BackendBuilder::new()
            .backend_type(BackendType::Cpu)
            .num_threads(0)
            .build(),
        InvalidArgument
    );

    // A pool bound is enforced, not ignored: past it, allocations fail with the pool's figures.
    let bounded = assert_ok!(BackendBuilder::new()
        .backend_type(BackendType::Reference)
        .memory_pool_size(1 << 20)
        .build());
    let err = assert_err!(bounded.zeros(&[1 << 20], DType::F32), MemoryPoolExhausted);
    assert_mentions(&err, &["memory pool exhausted", "1048576-byte limit"]);
    assert_backend_works(&bounded);

    assert_backend_works(&r);
    assert_backend_works(&cpu);
}

#[test]
fn use_before_init_is_not_initialized() {
    let mut raw = ReferenceBackend::new(BackendType::Reference);
    assert!(!raw.is_initialized());
    let err = assert_err!(raw.alloc(16), NotInitialized);
    assert_mentions(&err, &["init"]);
    assert_err!(raw.synchronize(), NotInitialized);
    assert_err!(raw.free(DevicePtr(1 << 20)), NotInitialized);
    let p = DevicePtr(1 << 20);
    assert_err!(raw.gemm(&gemm_desc(p, p, p, 0, 0, 0)), NotInitialized);
    assert_ok!(raw.init());
    raw_works(&raw);
}

// ---------------------------------------------------------------------------------------------------
// Shapes, dtypes, ranks
// ---------------------------------------------------------------------------------------------------

#[test]
fn shape_mismatches_through_the_tensor_api() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let a23 = seq(&b, &[2, 3]);
        let b45 = seq(&b, &[4, 5]);
        let b34 = seq(&b, &[3, 4]);

        // matmul
        let err = assert_err!(b.matmul(&a23, &b45), ShapeMismatch);
        assert_mentions(&err, &["matmul", "[2, 3]", "[4, 5]"]);
        assert_err!(a23.matmul(&b45), ShapeMismatch);
        assert_err!(
            b.matmul(&seq(&b, &[2, 2, 3]), &seq(&b, &[3, 3, 4])),
            ShapeMismatch
        );
        assert_err!(b.matmul(&seq(&b, &[3]), &seq(&b, &[4])), ShapeMismatch);
        assert_err!(b.matmul(&seq(&b, &[3]), &b45), ShapeMismatch);
        let scalar = b.full(&[], 1.0, DType::F32).expect("full");
        assert_err!(b.matmul(&scalar, &a23), ShapeMismatch);

        // broadcasting binary ops
        let err = assert_err!(b.add(&seq(&b, &[3]), &seq(&b, &[4])), ShapeMismatch);
        assert_mentions(&err, &["add", "broadcast"]);
        assert_err!(b.mul(&a23, &seq(&b, &[3, 2])), ShapeMismatch);
        assert_err!(seq(&b, &[2, 3, 4]).sub(&seq(&b, &[3, 3, 4])), ShapeMismatch);
        assert_err!(b.maximum(&a23, &seq(&b, &[2])), ShapeMismatch);

        // gemm / gemv
        let err = assert_err!(
            b.gemm(&a23, &b45, 1.0, &seq(&b, &[2, 5]), 0.0),
            ShapeMismatch
        );
        assert_mentions(&err, &["gemm"]);
        assert_err!(
            b.gemm(&a23, &b34, 1.0, &seq(&b, &[3, 3]), 1.0),
            ShapeMismatch
        );
        assert_err!(
            b.gemm(&a23, &b34, 1.0, &seq(&b, &[3, 3]), 0.0),
            ShapeMismatch
        );
        assert_err!(
            b.gemm(&seq(&b, &[2, 2, 3]), &b34, 1.0, &seq(&b, &[2, 4]), 0.0),
            ShapeMismatch
        );
        let err = assert_err!(
            b.gemv(&a23, &seq(&b, &[4]), 1.0, &seq(&b, &[2]), 0.0),
            ShapeMismatch
        );
        assert_mentions(&err, &["gemv"]);
        assert_err!(
            b.gemv(&a23, &seq(&b, &[3]), 1.0, &seq(&b, &[3]), 1.0),
            ShapeMismatch
        );

        // layer_norm
        let x = seq(&b, &[2, 3, 4]);
        let err = assert_err!(b.layer_norm(&x, &[3], None, None, 1e-5), ShapeMismatch);
        assert_mentions(&err, &["layer_norm", "normalized_shape"]);
        assert_err!(b.layer_norm(&x, &[], None, None, 1e-5), ShapeMismatch);
        assert_err!(
            b.layer_norm(&x, &[2, 2, 3, 4], None, None, 1e-5),
            ShapeMismatch
        );
        assert_err!(
            b.layer_norm(&x, &[4], Some(&seq(&b, &[3])), None, 1e-5),
            ShapeMismatch
        );
        assert_err!(
            x.layer_norm(&[3, 4], None, Some(&seq(&b, &[4])), 1e-5),
            ShapeMismatch
        );

        // batch_norm: per-channel tensors must be [C]
        let x = seq(&b, &[4, 3, 2]);
        let rm = b.zeros(&[3], DType::F32).expect("zeros");
        let rv = b.ones(&[3], DType::F32).expect("ones");
        let wrong = b.zeros(&[2], DType::F32).expect("zeros");
        let err = assert_err!(b.batch_norm(&x, &wrong, &rv, true), ShapeMismatch);
        assert_mentions(&err, &["batch_norm", "running_mean"]);
        assert_err!(
            b.batch_norm(&x, &rm, &b.ones(&[4], DType::F32).expect("ones"), false),
            ShapeMismatch
        );
        assert_err!(
            b.batch_norm_with(
                &x,
                BatchNormConfig {
                    weight: Some(&seq(&b, &[4])),
                    training: true,
                    ..Default::default()
                }
            ),
            ShapeMismatch
        );
        assert_err!(
            x.batch_norm(BatchNormConfig {
                bias: Some(&seq(&b, &[3, 1])),
                training: true,
                ..Default::default()
            }),
            ShapeMismatch
        );
        assert_err!(b.batch_norm(&seq(&b, &[6]), &rm, &rv, true), ShapeMismatch);
        assert_eq!(
            vals(&rm),
            vec![0.0; 3],
            "running_mean written by a failed op"
        );
        assert_eq!(
            vals(&rv),
            vec![1.0; 3],
            "running_var written by a failed op"
        );

        // attention
        let q = seq(&b, &[1, 2, 3, 4]);
        let err = assert_err!(
            b.attention(&q, &seq(&b, &[1, 2, 5, 8]), &seq(&b, &[1, 2, 5, 8]), false),
            ShapeMismatch
        );
        assert_mentions(&err, &["attention"]);
        assert_err!(
            b.attention(&q, &seq(&b, &[1, 2, 5, 4]), &seq(&b, &[1, 2, 6, 4]), false),
            ShapeMismatch
        );
        assert_err!(
            b.attention(&q, &seq(&b, &[1, 2, 5, 4]), &seq(&b, &[1, 2, 5, 5]), true),
            ShapeMismatch
        );
        assert_err!(
            b.attention(&q, &seq(&b, &[1, 3, 5, 4]), &seq(&b, &[1, 3, 5, 4]), false),
            ShapeMismatch
        );
        assert_err!(
            q.attention(&seq(&b, &[2, 2, 5, 4]), &seq(&b, &[2, 2, 5, 4]), false),
            ShapeMismatch
        );

        // conv2d
        let x = seq(&b, &[1, 3, 5, 5]);
        let err = assert_err!(
            b.conv2d(&x, &seq(&b, &[2, 4, 3, 3]), ConvConfig::default()),
            ShapeMismatch
        );
        assert_mentions(&err, &["conv2d"]);
        let err = assert_err!(
            b.conv2d(
                &x,
                &seq(&b, &[2, 1, 3, 3]),
                ConvConfig {
                    groups: 2,
                    ..Default::default()
                }
            ),
            ShapeMismatch
        );
        assert_mentions(&err, &["groups"]);
        assert_err!(
            b.conv2d(
                &seq(&b, &[1, 4, 5, 5]),
                &seq(&b, &[3, 2, 3, 3]),
                ConvConfig {
                    groups: 2,
                    ..Default::default()
                }
            ),
            ShapeMismatch
        );
        assert_err!(
            b.conv2d_with_bias(
                &x,
                &seq(&b, &[2, 3, 3, 3]),
                Some(&seq(&b, &[3])),
                ConvConfig::default()
            ),
            ShapeMismatch
        );

        // construction and read-back
        let err = assert_err!(b.from_slice(&[1.0f32, 2.0, 3.0], &[2, 2]), ShapeMismatch);
        assert_mentions(&err, &["from_slice"]);
        assert_err!(seq(&b, &[2]).item(), ShapeMismatch);
        assert_err!(a23.copy_from(&seq(&b, &[3, 2])), ShapeMismatch);
        assert_eq!(
            vals(&a23),
            vals(&seq(&b, &[2, 3])),
            "copy_from wrote on error"
        );

        assert_backend_works(&b);
    }
}

#[test]
fn dtype_mismatches_and_integer_math() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let a = seq(&b, &[2, 2]);
        let a64 = b
            .from_slice(&[1.0f64, 2.0, 3.0, 4.0], &[2, 2])
            .expect("f64 tensor");
        let err = assert_err!(b.add(&a, &a64), DTypeMismatch);
        match &err {
            BackendError::DTypeMismatch { expected, got, .. } => {
                assert_eq!((*expected, *got), (DType::F32, DType::F64));
            }
            other => unreachable!("{other:?}"),
        }
        assert_mentions(&err, &["add", "f32", "f64"]);
        assert_err!(a64.add(&a), DTypeMismatch);

        let a16 = a.cast(DType::F16).expect("cast to f16");
        let err = assert_err!(b.matmul(&a, &a16), DTypeMismatch);
        assert_mentions(&err, &["matmul", "f16"]);
        assert_err!(a16.matmul(&a), DTypeMismatch);

        let err = assert_err!(a.to_vec::<f64>(), DTypeMismatch);
        assert_mentions(&err, &["to_vec"]);
        assert_err!(a.to_vec::<i32>(), DTypeMismatch);
        assert_err!(a16.to_vec::<f32>(), DTypeMismatch);

        let w64 = b
            .from_slice(&[1.0f64; 4], &[1, 1, 2, 2])
            .expect("f64 weight");
        assert_err!(
            b.conv2d(&seq(&b, &[1, 1, 3, 3]), &w64, ConvConfig::default()),
            DTypeMismatch
        );
        let w2 = b.from_slice(&[1.0f64; 2], &[2]).expect("f64 weight");
        assert_err!(b.layer_norm(&a, &[2], Some(&w2), None, 1e-5), DTypeMismatch);
        let q = seq(&b, &[1, 1, 2, 2]);
        let kbf = q.cast(DType::BF16).expect("cast to bf16");
        assert_err!(b.attention(&q, &kbf, &q, false), DTypeMismatch);
        assert_err!(a.copy_from(&a64), DTypeMismatch);
        assert_err!(b.gemm(&a, &a, 1.0, &a64, 0.0), DTypeMismatch);

        // Math on integer dtypes is Unsupported (not a panic, not a silent conversion).
        let i = b.from_slice(&[-1i32, 2, -3, 4], &[4]).expect("i32 tensor");
        let err = assert_err!(b.relu(&i), Unsupported);
        assert_mentions(&err, &["i32", b.backend_type().name()]);
        assert_err!(i.relu(), Unsupported);
        let i2 = b.from_slice(&[1i32, 2, 3, 4], &[2, 2]).expect("i32 tensor");
        assert_err!(b.matmul(&i2, &i2), Unsupported);
        assert_err!(b.add(&i, &i), Unsupported);
        assert_err!(b.sum(&i, 0, false), Unsupported);
        assert_err!(b.argmax(&i, 0, false), Unsupported);
        assert_err!(b.softmax(&i, 0), Unsupported);
        assert_err!(b.randn(&[3], DType::I32), Unsupported);
        let u = b.from_slice(&[1u8, 2], &[2]).expect("u8 tensor");
        assert_err!(u.exp(), Unsupported);
        let l = b.from_slice(&[1i64, 2], &[2]).expect("i64 tensor");
        assert_err!(b.mul(&l, &l), Unsupported);

        // Integers can still be created, cast, copied and read.
        assert_eq!(i.to_vec::<i32>().expect("to_vec"), vec![-1, 2, -3, 4]);
        let f = assert_ok!(i.cast(DType::F32));
        assert_eq!(vals(&f), vec![-1.0, 2.0, -3.0, 4.0]);
        assert_eq!(
            assert_ok!(i2.transpose(0, 1).and_then(|v| v.contiguous()))
                .to_vec::<i32>()
                .expect("to_vec"),
            vec![1, 3, 2, 4]
        );

        assert_backend_works(&b);
    }
}

#[test]
fn wrong_ranks() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let err = assert_err!(
            b.conv2d(
                &seq(&b, &[3, 5, 5]),
                &seq(&b, &[2, 3, 3, 3]),
                ConvConfig::default()
            ),
            ShapeMismatch
        );
        assert_mentions(&err, &["conv2d", "rank 4"]);
        assert_err!(
            b.conv2d(
                &seq(&b, &[1, 3, 5, 5]),
                &seq(&b, &[2, 3, 3]),
                ConvConfig::default()
            ),
            ShapeMismatch
        );
        assert_err!(
            b.conv2d(
                &seq(&b, &[1, 1, 3, 5, 5]),
                &seq(&b, &[2, 1, 3, 3]),
                ConvConfig::default()
            ),
            ShapeMismatch
        );

        let q4 = seq(&b, &[1, 2, 3, 4]);
        let err = assert_err!(
            b.attention(&seq(&b, &[2, 3, 4]), &q4, &q4, false),
            ShapeMismatch
        );
        assert_mentions(&err, &["attention", "rank 4"]);
        let kv3 = seq(&b, &[2, 3, 4]);
        assert_err!(b.attention(&q4, &kv3, &kv3, false), ShapeMismatch);

        let scalar = b.full(&[], 2.0, DType::F32).expect("0-d tensor");
        let err = assert_err!(b.sum(&scalar, 0, false), InvalidArgument);
        assert_mentions(&err, &["sum", "0-d"]);
        assert_err!(scalar.argmax(0, false), InvalidArgument);
        assert_err!(b.var(&scalar, 0, 1, false), InvalidArgument);
        assert_err!(scalar.mean(-1, true), InvalidArgument);

        assert_err!(
            b.max_pool2d(&seq(&b, &[3, 4, 4]), Pool2dConfig::new([2, 2])),
            ShapeMismatch
        );
        assert_err!(
            b.avg_pool2d(&seq(&b, &[16]), Pool2dConfig::new([2, 2])),
            ShapeMismatch
        );
        assert_err!(seq(&b, &[2, 3, 4]).t(), InvalidArgument);
        assert_err!(seq(&b, &[4]).t(), InvalidArgument);
        assert_err!(
            b.gemv(&seq(&b, &[3]), &seq(&b, &[3]), 1.0, &seq(&b, &[1]), 0.0),
            ShapeMismatch
        );

        // Axes out of range.
        let x = seq(&b, &[2, 3]);
        let err = assert_err!(b.sum(&x, 2, false), InvalidArgument);
        assert_mentions(&err, &["axis"]);
        assert_err!(b.max(&x, -3, false), InvalidArgument);
        assert_err!(b.softmax(&x, 2), InvalidArgument);
        assert_err!(b.log_softmax(&x, -3), InvalidArgument);

        assert_backend_works(&b);
    }
}

#[test]
fn shape_argument_and_dtype_errors_through_the_raw_trait() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let x = upload(c, &[1.0; 64]);
        let y = upload(c, &[1.0; 64]);
        let out = c.alloc(256).expect("alloc");

        // GEMM leading dimensions (column-major: ld ≥ rows as stored).
        let err = assert_err!(
            c.gemm(&GemmDesc {
                lda: 1,
                ..gemm_desc(x, y, out, 2, 2, 2)
            }),
            InvalidArgument
        );
        assert_mentions(&err, &["gemm", "lda"]);
        assert_err!(
            c.gemm(&GemmDesc {
                ldc: 0,
                ..gemm_desc(x, y, out, 2, 2, 2)
            }),
            InvalidArgument
        );
        // op(A) = Aᵀ with A stored k × m = 3 × 4: lda must be ≥ 3.
        assert_err!(
            c.gemm(&GemmDesc {
                trans_a: Transpose::Yes,
                lda: 2,
                ..gemm_desc(x, y, out, 4, 2, 3)
            }),
            InvalidArgument
        );
        assert_err!(
            c.gemm(&GemmDesc {
                trans_b: Transpose::Yes,
                ldb: 1,
                ..gemm_desc(x, y, out, 2, 3, 2)
            }),
            InvalidArgument
        );
        let err = assert_err!(
            c.gemv(&GemvDesc {
                incx: 0,
                ..gemv_desc(x, y, out, 2, 2)
            }),
            InvalidArgument
        );
        assert_mentions(&err, &["gemv", "incx"]);
        assert_err!(
            c.gemv(&GemvDesc {
                lda: 1,
                ..gemv_desc(x, y, out, 3, 2)
            }),
            InvalidArgument
        );

        // Convolution descriptors.
        let conv = conv_desc(x, y, out);
        let err = assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                output_shape: [1, 1, 3, 3],
                ..conv.clone()
            }),
            ShapeMismatch
        );
        assert_mentions(&err, &["conv2d", "output shape"]);
        assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                weight_shape: [1, 2, 2, 2],
                ..conv.clone()
            }),
            ShapeMismatch
        );
        assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                input_shape: [1, 3, 3, 3],
                weight_shape: [2, 1, 2, 2],
                output_shape: [1, 2, 2, 2],
                groups: 2,
                ..conv.clone()
            }),
            ShapeMismatch
        );
        assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                weight_shape: [1, 1, 0, 2],
                ..conv.clone()
            }),
            ShapeMismatch
        );

        // Elementwise / copy / reduce descriptors.
        let err = assert_err!(
            c.binary(&BinaryDesc {
                op: BinaryOp::Add,
                dtype: DType::F32,
                lhs: StridedBuf::contiguous(x, &[2, 3]),
                rhs: StridedBuf::contiguous(y, &[3, 2]),
                output: out,
            }),
            ShapeMismatch
        );
        assert_mentions(&err, &["binary"]);
        assert_err!(
            c.copy_strided(&CopyDesc {
                dtype: DType::F32,
                src: StridedBuf::contiguous(x, &[4]),
                dst: StridedBuf::contiguous(out, &[2, 2]),
            }),
            ShapeMismatch
        );
        let reduce = ReduceDesc {
            op: ReduceOp::Sum,
            dtype: DType::F32,
            input: StridedBuf::contiguous(x, &[2, 3]),
            axis: 2,
            output: out,
        };
        let err = assert_err!(c.reduce(&reduce), InvalidArgument);
        assert_mentions(&err, &["reduce", "axis"]);
        assert_err!(
            c.reduce(&ReduceDesc {
                input: StridedBuf::contiguous(x, &[]),
                axis: 0,
                ..reduce.clone()
            }),
            InvalidArgument
        );
        // max over an empty axis has no value
        assert_err!(
            c.reduce(&ReduceDesc {
                op: ReduceOp::Max,
                input: StridedBuf::contiguous(x, &[0, 3]),
                axis: 0,
                ..reduce.clone()
            }),
            InvalidArgument
        );

        // Hyper-parameters.
        let ln = LayerNormDesc {
            dtype: DType::F32,
            input: x,
            weight: None,
            bias: None,
            output: out,
            rows: 2,
            cols: 4,
            eps: -1.0,
        };
        let err = assert_err!(c.layer_norm(&ln), InvalidArgument);
        assert_mentions(&err, &["layer_norm", "eps"]);
        assert_err!(
            c.layer_norm(&LayerNormDesc {
                eps: f64::NAN,
                ..ln.clone()
            }),
            InvalidArgument
        );
        let bn = BatchNormDesc {
            dtype: DType::F32,
            input: x,
            output: out,
            batch: 4,
            channels: 2,
            spatial: 1,
            weight: None,
            bias: None,
            running_mean: Some(y),
            running_var: None,
            training: false,
            momentum: 0.1,
            eps: 1e-5,
        };
        let err = assert_err!(c.batch_norm(&bn), InvalidArgument);
        assert_mentions(&err, &["batch_norm", "running_var"]);
        assert_err!(
            c.batch_norm(&BatchNormDesc {
                running_var: Some(off(y, 8)),
                momentum: -0.5,
                ..bn.clone()
            }),
            InvalidArgument
        );
        let random = RandomDesc {
            dtype: DType::F32,
            ptr: out,
            len: 4,
            distribution: Distribution::Uniform {
                low: 1.0,
                high: 0.0,
            },
            seed: 1,
        };
        let err = assert_err!(c.random(&random), InvalidArgument);
        assert_mentions(&err, &["random"]);
        assert_err!(
            c.random(&RandomDesc {
                distribution: Distribution::Normal {
                    mean: 0.0,
                    std: -1.0
                },
                ..random.clone()
            }),
            InvalidArgument
        );
        assert_err!(
            c.adam_step(&AdamDesc {
                step: 0,
                ..adam_desc(x, y, off(x, 64), off(y, 64))
            }),
            InvalidArgument
        );

        // Integer dtypes for math ops: Unsupported.
        let err = assert_err!(
            c.gemm(&GemmDesc {
                dtype: DType::I32,
                ..gemm_desc(x, y, out, 2, 2, 2)
            }),
            Unsupported
        );
        assert_mentions(&err, &["gemm", "i32"]);
        assert_err!(
            c.gemv(&GemvDesc {
                dtype: DType::I64,
                ..gemv_desc(x, y, out, 2, 2)
            }),
            Unsupported
        );
        assert_err!(
            c.unary(&UnaryDesc {
                dtype: DType::I64,
                ..unary_desc(UnaryOp::Relu, StridedBuf::contiguous(x, &[4]), out)
            }),
            Unsupported
        );
        assert_err!(
            c.binary(&BinaryDesc {
                op: BinaryOp::Mul,
                dtype: DType::U8,
                lhs: StridedBuf::contiguous(x, &[4]),
                rhs: StridedBuf::contiguous(y, &[4]),
                output: out,
            }),
            Unsupported
        );
        assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                dtype: DType::I32,
                ..conv.clone()
            }),
            Unsupported
        );
        assert_err!(
            c.reduce(&ReduceDesc {
                dtype: DType::I32,
                axis: 1,
                ..reduce.clone()
            }),
            Unsupported
        );
        assert_err!(
            c.softmax(&SoftmaxDesc {
                dtype: DType::I64,
                input: x,
                output: out,
                outer: 1,
                axis_len: 4,
                inner: 1,
                log: false,
            }),
            Unsupported
        );
        assert_err!(
            c.adam_step(&AdamDesc {
                dtype: DType::I32,
                ..adam_desc(x, y, off(x, 64), off(y, 64))
            }),
            Unsupported
        );
        assert_err!(
            c.random(&RandomDesc {
                dtype: DType::I32,
                distribution: Distribution::Uniform {
                    low: 0.0,
                    high: 1.0,
                },
                ..random.clone()
            }),
            Unsupported
        );
        // A bad argument is reported as such whatever the dtype: validation comes before support.
        assert_err!(
            c.random(&RandomDesc {
                dtype: DType::I32,
                ..random.clone()
            }),
            InvalidArgument
        );

        // ... but fill, cast and copies of integers are supported.
        assert_ok!(c.fill(&FillDesc {
            dtype: DType::I32,
            ptr: out,
            len: 4,
            value: 7.0,
        }));
        let mut bytes = [0u8; 16];
        assert_ok!(c.copy_dtoh(&mut bytes, out));
        let ints: Vec<i32> = bytes
            .chunks_exact(4)
            .map(|ch| i32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]))
            .collect();
        assert_eq!(ints, vec![7; 4]);
        assert_ok!(c.cast(&CastDesc {
            src_dtype: DType::I32,
            dst_dtype: DType::F32,
            input: StridedBuf::contiguous(out, &[4]),
            output: off(out, 64),
        }));
        assert_eq!(download(c, off(out, 64), 4), vec![7.0; 4]);

        for p in [x, y, out] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Zero-size dims are legal
// ---------------------------------------------------------------------------------------------------

#[test]
fn zero_size_dims_are_legal() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let f = DType::F32;
        let empty = |shape: &[usize]| b.empty(shape, f).expect("empty");

        // matmul
        let y = assert_ok!(b.matmul(&empty(&[0, 3]), &seq(&b, &[3, 4])));
        assert_eq!(y.shape(), &[0, 4]);
        assert!(vals(&y).is_empty());
        // k = 0: every sum is empty, so the product is zeros (not the NaN of fresh memory).
        let y = assert_ok!(b.matmul(&empty(&[2, 0]), &empty(&[0, 3])));
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(vals(&y), vec![0.0; 6]);
        let y = assert_ok!(b.matmul(&seq(&b, &[2, 3]), &empty(&[3, 0])));
        assert_eq!(y.shape(), &[2, 0]);
        let y = assert_ok!(b.matmul(&empty(&[0]), &empty(&[0])));
        assert_eq!(y.shape(), &[] as &[usize]);
        assert_eq!(vals(&y), vec![0.0]);
        let y = assert_ok!(b.matmul(&seq(&b, &[4]), &empty(&[4, 0])));
        assert_eq!(y.shape(), &[0]);

        // gemm / gemv with k = 0: alpha · (empty sum) + beta · c.
        let c = b.ones(&[2, 3], f).expect("ones");
        let y = assert_ok!(b.gemm(&empty(&[2, 0]), &empty(&[0, 3]), 1.0, &c, 0.5));
        assert_eq!(vals(&y), vec![0.5; 6]);
        let y = assert_ok!(b.gemm(&empty(&[2, 0]), &empty(&[0, 3]), 1.0, &c, 0.0));
        assert_eq!(vals(&y), vec![0.0; 6]);
        let yv = b.ones(&[2], f).expect("ones");
        let y = assert_ok!(b.gemv(&empty(&[2, 0]), &empty(&[0]), 1.0, &yv, 0.0));
        assert_eq!(vals(&y), vec![0.0; 2]);
        let y = assert_ok!(b.gemv(&empty(&[2, 0]), &empty(&[0]), 1.0, &yv, 2.0));
        assert_eq!(vals(&y), vec![2.0; 2]);
        let y = assert_ok!(b.gemv(&empty(&[0, 3]), &seq(&b, &[3]), 1.0, &empty(&[0]), 1.0));
        assert_eq!(y.shape(), &[0]);

        // reductions
        let y = assert_ok!(b.sum(&empty(&[0, 3]), 0, false));
        assert_eq!(y.shape(), &[3]);
        assert_eq!(vals(&y), vec![0.0; 3]);
        let y = assert_ok!(b.sum(&empty(&[0, 3]), 0, true));
        assert_eq!(y.shape(), &[1, 3]);
        assert_eq!(vals(&y), vec![0.0; 3]);
        let y = assert_ok!(b.sum(&empty(&[3, 0]), 1, false));
        assert_eq!(vals(&y), vec![0.0; 3]);
        let y = assert_ok!(b.sum(&empty(&[3, 0]), 0, false));
        assert_eq!(y.shape(), &[0]);
        let y = assert_ok!(b.sum_all(&empty(&[0, 5])));
        assert_eq!(y.shape(), &[] as &[usize]);
        assert_eq!(vals(&y), vec![0.0]);
        let y = assert_ok!(b.mean(&empty(&[2, 0]), 1, false));
        assert!(
            vals(&y).iter().all(|v| v.is_nan()),
            "mean over nothing is NaN"
        );
        let y = assert_ok!(b.max(&empty(&[0, 3]), 1, false));
        assert_eq!(y.shape(), &[0]);
        let err = assert_err!(b.max(&empty(&[0, 3]), 0, false), InvalidArgument);
        assert_mentions(&err, &["empty"]);
        assert_err!(b.argmin(&empty(&[2, 0]), 1, false), InvalidArgument);

        // elementwise
        let y = assert_ok!(b.relu(&empty(&[0])));
        assert_eq!(y.shape(), &[0]);
        let y = assert_ok!(empty(&[2, 0, 3]).relu());
        assert_eq!(y.shape(), &[2, 0, 3]);
        let y = assert_ok!(b.add(&empty(&[0, 3]), &seq(&b, &[3])));
        assert_eq!(y.shape(), &[0, 3]);
        let y = assert_ok!(b.mul(&empty(&[0, 1]), &seq(&b, &[1, 4])));
        assert_eq!(y.shape(), &[0, 4]);

        // conv / pool with N = 0 (and K = 0)
        let y = assert_ok!(b.conv2d(
            &empty(&[0, 3, 5, 5]),
            &seq(&b, &[2, 3, 3, 3]),
            ConvConfig::default()
        ));
        assert_eq!(y.shape(), &[0, 2, 3, 3]);
        let y = assert_ok!(b.conv2d(
            &seq(&b, &[1, 3, 5, 5]),
            &empty(&[0, 3, 3, 3]),
            ConvConfig::default()
        ));
        assert_eq!(y.shape(), &[1, 0, 3, 3]);
        let y = assert_ok!(b.max_pool2d(&empty(&[0, 3, 4, 4]), Pool2dConfig::new([2, 2])));
        assert_eq!(y.shape(), &[0, 3, 2, 2]);

        // normalisation, softmax, attention
        let y = assert_ok!(b.softmax(&empty(&[0, 4]), 1));
        assert_eq!(y.shape(), &[0, 4]);
        let y = assert_ok!(b.log_softmax(&empty(&[3, 0]), 1));
        assert_eq!(y.shape(), &[3, 0]);
        let y = assert_ok!(b.layer_norm(&empty(&[0, 4]), &[4], None, None, 1e-5));
        assert_eq!(y.shape(), &[0, 4]);
        let rm = b.zeros(&[3], f).expect("zeros");
        let rv = b.ones(&[3], f).expect("ones");
        let y = assert_ok!(b.batch_norm(&empty(&[0, 3]), &rm, &rv, false));
        assert_eq!(y.shape(), &[0, 3]);
        let kv = seq(&b, &[1, 1, 3, 4]);
        let y = assert_ok!(b.attention(&empty(&[1, 1, 0, 4]), &kv, &kv, true));
        assert_eq!(y.shape(), &[1, 1, 0, 4]);
        let e = empty(&[0, 2, 3, 4]);
        let y = assert_ok!(b.attention(&e, &e, &e, false));
        assert_eq!(y.shape(), &[0, 2, 3, 4]);

        // views and copies
        let y = assert_ok!(empty(&[0, 3]).reshape(&[3, 0, 7]));
        assert_eq!(y.shape(), &[3, 0, 7]);
        let y = assert_ok!(seq(&b, &[3]).narrow(0, 3, 0));
        assert_eq!(y.shape(), &[0]);
        assert!(vals(&y).is_empty());
        let y = assert_ok!(empty(&[0, 2]).cast(DType::F64));
        assert_eq!(y.to_vec::<f64>().expect("to_vec"), Vec::<f64>::new());
        let y = assert_ok!(b.zeros(&[4, 0], f));
        assert!(vals(&y).is_empty());

        assert_backend_works(&b);
    }
}

#[test]
fn batched_matmul_with_an_empty_inner_dim_is_zeros() {
    // [2, 2, 0] @ [2, 0, 3]: two batches of k = 0 products, so [2, 2, 3] of zeros.
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let a = b.empty(&[2, 2, 0], DType::F32).expect("empty");
        let w = b.empty(&[2, 0, 3], DType::F32).expect("empty");
        let y = assert_ok!(b.matmul(&a, &w));
        assert_eq!(y.shape(), &[2, 2, 3]);
        assert_eq!(vals(&y), vec![0.0; 12]);
        // broadcasting batch dims with k = 0 as well
        let w1 = b.empty(&[0, 3], DType::F32).expect("empty");
        let y = assert_ok!(b.matmul(&a, &w1));
        assert_eq!(vals(&y), vec![0.0; 12]);
        assert_backend_works(&b);
    }
}

#[test]
fn reduction_over_a_long_axis_of_an_empty_tensor() {
    // [0, 2^61] has no elements (so it allocates nothing), but its axis 1 is long: reducing it gives an
    // empty [0] result. Nothing may be sized by the axis length alone.
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let x = assert_ok!(b.empty(&[0, 1 << 61], DType::F32));
        assert_eq!(x.numel(), 0);
        let y = assert_ok!(b.relu(&x));
        assert_eq!(y.shape(), &[0, 1 << 61]);
        let y = assert_ok!(b.layer_norm(&x, &[1 << 61], None, None, 1e-5));
        assert_eq!(y.shape(), &[0, 1 << 61]);
        let y = assert_ok!(b.sum(&x, 1, false));
        assert_eq!(y.shape(), &[0]);
        let y = assert_ok!(b.max(&x, 1, false));
        assert_eq!(y.shape(), &[0]);
        // Reducing axis 0 would need 2^61 outputs: an allocation error, not a crash.
        assert_err!(b.sum(&x, 0, false), OutOfMemory | SizeOverflow);
        assert_backend_works(&b);
    }
}

#[test]
fn unsqueeze_of_an_empty_tensor_with_large_dims() {
    // A [0, 2^40, 2^40] tensor is legal (no elements); inserting a unit dim is a pure view.
    let b = Backend::reference().expect("reference");
    let x = assert_ok!(b.empty(&[0, 1 << 40, 1 << 40], DType::F32));
    let y = assert_ok!(x.unsqueeze(2));
    assert_eq!(y.shape(), &[0, 1 << 40, 1, 1 << 40]);
    let y = assert_ok!(x.unsqueeze(1));
    assert_eq!(y.shape(), &[0, 1, 1 << 40, 1 << 40]);
    assert_backend_works(&b);
}

// ---------------------------------------------------------------------------------------------------
// Overflowing sizes
// ---------------------------------------------------------------------------------------------------

#[test]
fn overflowing_sizes_through_the_tensor_api() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let before = b.allocated_bytes();
        let f = DType::F32;
        let err = assert_err!(b.empty(&[usize::MAX, 2], f), SizeOverflow);
        assert_mentions(&err, &["overflow"]);
        assert_err!(b.zeros(&[1 << 40, 1 << 40], f), SizeOverflow);
        assert_err!(b.randn(&[1 << 33, 1 << 33], f), SizeOverflow);
        // the element count fits, the byte count does not
        assert_err!(b.empty(&[usize::MAX / 2 + 1], f), SizeOverflow);
        assert_err!(b.ones(&[usize::MAX / 4 + 1, 1], f), SizeOverflow);
        // the byte count fits in usize but no machine has that much memory
        assert_err!(
            b.ones(&[usize::MAX / 8], DType::F64),
            OutOfMemory | SizeOverflow
        );
        assert_err!(b.empty(&[1 << 62], DType::U8), OutOfMemory | SizeOverflow);
        assert_err!(b.from_slice(&[1.0f32], &[usize::MAX, 2]), SizeOverflow);
        assert_err!(b.arange(0.0, 1e30, 1.0, f), SizeOverflow);
        assert_err!(seq(&b, &[2, 3]).reshape(&[usize::MAX, 3]), SizeOverflow);

        // Broadcast views may name huge shapes; materialising them must fail cleanly.
        let one = t(&b, &[1.0], &[1]);
        let huge = assert_ok!(one.broadcast_to(&[usize::MAX, usize::MAX]));
        assert_err!(huge.relu(), SizeOverflow);
        assert_err!(huge.contiguous(), SizeOverflow);
        assert_err!(b.add(&huge, &one), SizeOverflow);
        let one2 = assert_ok!(one.reshape(&[1, 1]));
        let tall = assert_ok!(one2.broadcast_to(&[1 << 33, 1]));
        let wide = assert_ok!(one2.broadcast_to(&[1, 1 << 33]));
        let err = assert_err!(b.matmul(&tall, &wide), SizeOverflow);
        assert_mentions(&err, &["overflow"]);
        assert_err!(b.add(&tall, &wide), SizeOverflow);

        drop((one, one2, huge, tall, wide));
        assert_eq!(b.allocated_bytes(), before, "a failed op leaked memory");
        assert_backend_works(&b);
    }
}

#[test]
fn overflowing_sizes_through_the_raw_trait() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        assert_err!(c.alloc(usize::MAX), OutOfMemory | SizeOverflow);
        assert_err!(c.alloc(isize::MAX as usize + 1), OutOfMemory | SizeOverflow);
        let x = upload(c, &[1.0; 16]);
        let y = upload(c, &[1.0; 16]);
        let out = c.alloc(64).expect("alloc");

        // ldc · n overflows
        let err = assert_err!(
            c.gemm(&GemmDesc {
                n: 1 << 40,
                ldc: 1 << 40,
                ..gemm_desc(x, y, out, 1, 1, 1)
            }),
            SizeOverflow
        );
        assert_mentions(&err, &["gemm", "overflow"]);
        // lda · k overflows
        assert_err!(
            c.gemm(&GemmDesc {
                k: 1 << 40,
                lda: 1 << 40,
                ldb: 1 << 40,
                ..gemm_desc(x, y, out, 2, 1, 1)
            }),
            SizeOverflow
        );
        // (len - 1) · incx overflows
        assert_err!(
            c.gemv(&GemvDesc {
                incx: usize::MAX,
                ..gemv_desc(x, y, out, 1, 2)
            }),
            SizeOverflow
        );
        // batch_count · stride overflows
        assert_err!(
            c.batched_gemm(&BatchedGemmDesc {
                gemm: gemm_desc(x, y, out, 2, 2, 2),
                stride_a: usize::MAX,
                stride_b: 0,
                stride_c: 4,
                batch_count: usize::MAX,
            }),
            SizeOverflow
        );
        assert_err!(
            c.fill(&FillDesc {
                dtype: DType::F64,
                ptr: out,
                len: usize::MAX,
                value: 0.0,
            }),
            SizeOverflow
        );
        // a view whose extent overflows
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Relu,
                StridedBuf::contiguous(x, &[usize::MAX, 2]),
                out
            )),
            SizeOverflow
        );
        assert_err!(Layout::new(vec![2], vec![1], usize::MAX - 1), SizeOverflow);
        let far = assert_ok!(Layout::new(vec![1], vec![1], usize::MAX / 2));
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Relu,
                StridedBuf {
                    ptr: x,
                    layout: far
                },
                out
            )),
            SizeOverflow
        );
        assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                input_shape: [1 << 32, 1 << 32, 1, 1],
                weight_shape: [1, 1 << 32, 1, 1],
                output_shape: [1 << 32, 1, 1, 1],
                ..conv_desc(x, y, out)
            }),
            SizeOverflow
        );
        assert_err!(
            c.attention(&AttentionDesc {
                dtype: DType::F32,
                q: x,
                k: y,
                v: y,
                o: out,
                batch: 1 << 40,
                heads: 1 << 40,
                seq_q: 1,
                seq_kv: 1,
                head_dim: 1,
                scale: 1.0,
                causal: false,
            }),
            SizeOverflow
        );
        assert_eq!(DevicePtr(u64::MAX - 3).offset(8), None);
        assert_err!(c.copy_dtod(out, x, usize::MAX), OutOfBounds | SizeOverflow);

        assert_eq!(download(c, x, 16), vec![1.0; 16]);
        for p in [x, y, out] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
    }
}

#[test]
fn batched_gemm_whose_c_span_overflows() {
    // ldc = usize::MAX: the span of one C matrix, (n - 1)·ldc + m, does not fit in usize.
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let p = upload(c, &[1.0; 4]);
        assert_err!(
            c.batched_gemm(&BatchedGemmDesc {
                gemm: GemmDesc {
                    ldc: usize::MAX,
                    ..gemm_desc(p, p, p, 1, 2, 1)
                },
                stride_a: 0,
                stride_b: 0,
                stride_c: 0,
                batch_count: 2,
            }),
            SizeOverflow | Aliasing
        );
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Pointers
// ---------------------------------------------------------------------------------------------------

#[test]
fn invalid_pointers() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let good = upload(c, &[1.0, 2.0, 3.0, 4.0]);
        let eye = upload(c, &[1.0, 0.0, 0.0, 1.0]);
        let out = c.alloc(16).expect("alloc");

        // null
        let null = DevicePtr(0);
        let err = assert_err!(c.copy_htod(null, &[0u8; 4]), InvalidPointer);
        assert_mentions(&err, &["0x0", "null"]);
        assert_err!(c.copy_dtoh(&mut [0u8; 4], null), InvalidPointer);
        assert_err!(c.free(null), InvalidPointer);
        assert_err!(c.gemm(&gemm_desc(null, eye, out, 2, 2, 2)), InvalidPointer);
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Exp,
                StridedBuf::contiguous(good, &[4]),
                null
            )),
            InvalidPointer
        );
        assert_err!(
            c.fill(&FillDesc {
                dtype: DType::F32,
                ptr: null,
                len: 0,
                value: 0.0,
            }),
            InvalidPointer
        );

        // made-up addresses
        for made_up in [
            DevicePtr(0x1234),
            DevicePtr(0xdead_beef_0000),
            DevicePtr(u64::MAX - 16),
        ] {
            let err = assert_err!(c.copy_htod(made_up, &[0u8; 4]), InvalidPointer);
            assert_mentions(&err, &[&format!("{:#x}", made_up.0)]);
            assert_err!(c.copy_dtoh(&mut [0u8; 4], made_up), InvalidPointer);
            assert_err!(c.free(made_up), InvalidPointer);
            assert_err!(c.copy_dtod(out, made_up, 4), InvalidPointer);
            assert_err!(c.copy_dtod(made_up, good, 4), InvalidPointer);
            assert_err!(
                c.gemm(&gemm_desc(good, made_up, out, 2, 2, 2)),
                InvalidPointer
            );
            assert_err!(
                c.fill(&FillDesc {
                    dtype: DType::F32,
                    ptr: made_up,
                    len: 1,
                    value: 0.0,
                }),
                InvalidPointer
            );
        }

        // a pointer from another backend instance (which has allocated nothing)
        let other = Backend::reference().expect("reference");
        let oc = other.compute();
        let err = assert_err!(oc.copy_dtoh(&mut [0u8; 16], good), InvalidPointer);
        assert_mentions(&err, &["backend"]);
        assert_err!(oc.copy_htod(good, &[0u8; 16]), InvalidPointer);
        assert_err!(oc.free(good), InvalidPointer);
        assert_err!(
            oc.unary(&unary_desc(
                UnaryOp::Neg,
                StridedBuf::contiguous(good, &[4]),
                out
            )),
            InvalidPointer
        );
        assert_eq!(download(c, good, 4), vec![1.0, 2.0, 3.0, 4.0]);

        // freed pointers, double free
        let tmp = upload(c, &[5.0; 4]);
        assert_ok!(c.free(tmp));
        let err = assert_err!(c.copy_htod(tmp, &[0u8; 4]), InvalidPointer);
        assert_mentions(&err, &["freed"]);
        assert_err!(c.copy_dtoh(&mut [0u8; 4], tmp), InvalidPointer);
        assert_err!(c.gemm(&gemm_desc(good, tmp, out, 2, 2, 2)), InvalidPointer);
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Neg,
                StridedBuf::contiguous(tmp, &[4]),
                out
            )),
            InvalidPointer
        );
        assert_err!(c.free(tmp), InvalidPointer);
        let fresh = c.alloc(16).expect("alloc");
        if b.backend_type() == BackendType::Cuda {
            // CUDA pointers are driver addresses and its caching allocator hands a freed block out
            // again (as `cudaFree` + `cudaMalloc` may): the old pointer then names the new
            // allocation, and only the new allocation's lifetime decides its validity.
            if fresh == tmp {
                assert_ok!(c.copy_htod(tmp, &[0u8; 4]));
            }
        } else {
            assert_ne!(fresh, tmp, "a freed address was handed out again");
            assert_err!(c.copy_htod(tmp, &[0u8; 4]), InvalidPointer);
            assert_err!(c.free(tmp), InvalidPointer);
        }

        // interior pointer passed to free; the allocation survives
        let err = assert_err!(c.free(off(good, 4)), InvalidPointer);
        assert_mentions(&err, &["interior"]);
        assert_eq!(download(c, good, 4), vec![1.0, 2.0, 3.0, 4.0]);
        // a pointer into the gap after an allocation
        assert_err!(c.copy_htod(off(good, 80), &[0u8; 4]), InvalidPointer);

        for p in [good, eye, out, fresh] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
        assert_backend_works(&other);
    }
}

#[test]
fn foreign_pointer_is_rejected_even_when_the_other_backend_has_allocations() {
    // Two backend instances that have each allocated memory: a pointer of one must not be accepted by
    // the other (InvalidPointer lists "allocated by another backend instance" as a case), and above all
    // must not read, overwrite or free the other's memory. Every consequence is collected, then reported.
    let a = Backend::reference().expect("reference");
    let b = Backend::reference().expect("reference");
    let (ac, bc) = (a.compute(), b.compute());
    let pa = upload(ac, &[1.0, 2.0, 3.0, 4.0]);
    let pb = upload(bc, &[5.0, 6.0, 7.0, 8.0]);
    eprintln!("pointer on a: {pa:?}, pointer on b: {pb:?}");
    let mut failures = Vec::new();
    let mut host = [0u8; 16];
    let r = no_panic!(bc.copy_dtoh(&mut host, pa));
    if !matches!(r, Err(BackendError::InvalidPointer { .. })) {
        failures.push(format!(
            "b.copy_dtoh(a's pointer) gave {r:?} and read {:?}",
            f32s_of(&host)
        ));
    }
    let r = no_panic!(bc.copy_htod(pa, &bytes_of(&[0.0; 4])));
    if !matches!(r, Err(BackendError::InvalidPointer { .. })) {
        failures.push(format!("b.copy_htod(a's pointer) gave {r:?}"));
    }
    let r = no_panic!(bc.free(pa));
    if !matches!(r, Err(BackendError::InvalidPointer { .. })) {
        failures.push(format!("b.free(a's pointer) gave {r:?}"));
    }
    let mut back = [0u8; 16];
    match bc.copy_dtoh(&mut back, pb) {
        Ok(()) if f32s_of(&back) == [5.0, 6.0, 7.0, 8.0] => {}
        Ok(()) => failures.push(format!(
            "b's own buffer was overwritten: {:?}",
            f32s_of(&back)
        )),
        Err(e) => failures.push(format!("b's own buffer is gone: {e:?}")),
    }
    assert_eq!(download(ac, pa, 4), vec![1.0, 2.0, 3.0, 4.0]);
    assert!(
        failures.is_empty(),
        "a foreign pointer was accepted:\n{}",
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------------
// Out-of-bounds extents
// ---------------------------------------------------------------------------------------------------

#[test]
fn out_of_bounds_extents() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let p = upload(c, &[1.0, 2.0, 3.0, 4.0]); // 16 bytes

        let err = assert_err!(c.copy_htod(p, &[0u8; 17]), OutOfBounds);
        match &err {
            BackendError::OutOfBounds {
                ptr,
                bytes,
                allocation_base,
                allocation_size,
            } => {
                assert_eq!(
                    (*ptr, *bytes, *allocation_base, *allocation_size),
                    (p.0, 17, p.0, 16)
                );
            }
            other => unreachable!("{other:?}"),
        }
        assert_mentions(&err, &["17", "16"]);
        assert_eq!(download(c, p, 4), vec![1.0, 2.0, 3.0, 4.0], "partial write");
        assert_err!(c.copy_dtoh(&mut [0u8; 32], p), OutOfBounds);
        // offset pointers whose extent crosses the end
        let mid = off(p, 8);
        assert_err!(c.copy_htod(mid, &[0u8; 12]), OutOfBounds);
        assert_err!(c.copy_dtoh(&mut [0u8; 9], mid), OutOfBounds);
        let end = off(p, 16);
        assert_err!(c.copy_htod(end, &[0u8; 1]), OutOfBounds);
        assert_ok!(c.copy_htod(end, &[]));
        assert_eq!(download(c, p, 4), vec![1.0, 2.0, 3.0, 4.0], "partial write");
        assert_ok!(c.copy_htod(mid, &bytes_of(&[7.0, 8.0])));
        assert_eq!(download(c, p, 4), vec![1.0, 2.0, 7.0, 8.0]);

        // GEMM extents
        let a = upload(c, &[1.0, 2.0, 3.0, 4.0]);
        let eye = upload(c, &[1.0, 0.0, 0.0, 1.0]);
        let cbuf = c.alloc(16).expect("alloc");
        assert_ok!(c.gemm(&gemm_desc(a, eye, cbuf, 2, 2, 2)));
        let err = assert_err!(
            c.gemm(&GemmDesc {
                ldc: 3,
                ..gemm_desc(a, eye, cbuf, 2, 2, 2)
            }),
            OutOfBounds
        );
        assert_mentions(&err, &["20 bytes", "16 bytes"]);
        assert_err!(
            c.gemm(&GemmDesc {
                lda: 3,
                ..gemm_desc(a, eye, cbuf, 2, 2, 2)
            }),
            OutOfBounds
        );
        assert_err!(
            c.gemm(&gemm_desc(a, eye, off(cbuf, 4), 2, 2, 2)),
            OutOfBounds
        );
        assert_err!(c.gemm(&gemm_desc(a, eye, cbuf, 3, 2, 2)), OutOfBounds);
        assert_err!(
            c.batched_gemm(&BatchedGemmDesc {
                gemm: gemm_desc(a, eye, cbuf, 2, 2, 2),
                stride_a: 0,
                stride_b: 0,
                stride_c: 4,
                batch_count: 2,
            }),
            OutOfBounds
        );
        assert_err!(
            c.gemv(&GemvDesc {
                incy: 4,
                ..gemv_desc(a, eye, cbuf, 2, 2)
            }),
            OutOfBounds
        );
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Neg,
                StridedBuf::contiguous(a, &[4]),
                off(cbuf, 8)
            )),
            OutOfBounds
        );
        let strided = StridedBuf {
            ptr: a,
            layout: assert_ok!(Layout::new(vec![4], vec![2], 0)),
        };
        assert_err!(
            c.unary(&unary_desc(UnaryOp::Neg, strided, cbuf)),
            OutOfBounds
        );
        assert_err!(
            c.fill(&FillDesc {
                dtype: DType::F32,
                ptr: cbuf,
                len: 5,
                value: 0.0,
            }),
            OutOfBounds
        );
        assert_err!(c.copy_dtod(cbuf, a, 32), OutOfBounds);
        assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                input_shape: [1, 1, 2, 2],
                output_shape: [1, 1, 1, 1],
                ..conv_desc(a, off(eye, 4), cbuf)
            }),
            OutOfBounds
        );
        assert_eq!(
            download(c, cbuf, 4),
            vec![1.0, 2.0, 3.0, 4.0],
            "a failed op wrote its output"
        );

        for q in [p, a, eye, cbuf] {
            assert_ok!(c.free(q));
        }
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Aliasing
// ---------------------------------------------------------------------------------------------------

#[test]
fn aliasing_is_rejected() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let ramp: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let big = upload(c, &ramp); // 64 bytes
        let eye = upload(c, &[1.0, 0.0, 0.0, 1.0]);
        let out = c.alloc(64).expect("alloc");

        // GEMM: C overlapping A, C == A, C == B (read-write with beta ≠ 0).
        let err = assert_err!(c.gemm(&gemm_desc(big, eye, off(big, 8), 2, 2, 2)), Aliasing);
        assert_mentions(&err, &["gemm", "overlap"]);
        assert_err!(c.gemm(&gemm_desc(big, eye, big, 2, 2, 2)), Aliasing);
        assert_err!(
            c.gemm(&GemmDesc {
                beta: 1.0,
                ..gemm_desc(eye, big, big, 2, 2, 2)
            }),
            Aliasing
        );
        // GEMV: y overlapping x
        assert_err!(c.gemv(&gemv_desc(eye, big, off(big, 4), 2, 2)), Aliasing);
        // batched GEMM whose C batches overlap
        let err = assert_err!(
            c.batched_gemm(&BatchedGemmDesc {
                gemm: gemm_desc(eye, eye, out, 2, 2, 2),
                stride_a: 0,
                stride_b: 0,
                stride_c: 2,
                batch_count: 2,
            }),
            Aliasing
        );
        assert_mentions(&err, &["stride_c"]);
        // conv2d: output overlapping input, and overlapping weight
        let err = assert_err!(
            c.conv2d_forward(&conv_desc(big, eye, off(big, 20))),
            Aliasing
        );
        assert_mentions(&err, &["conv2d"]);
        assert_err!(c.conv2d_forward(&conv_desc(big, eye, eye)), Aliasing);
        // copy_dtod of overlapping ranges (and of a range onto itself)
        let err = assert_err!(c.copy_dtod(off(big, 4), big, 8), Aliasing);
        assert_mentions(&err, &["copy_dtod"]);
        assert_err!(c.copy_dtod(big, big, 8), Aliasing);
        assert_err!(c.copy_dtod(big, off(big, 4), 8), Aliasing);
        // reduce / softmax / layer_norm outputs on their inputs
        assert_err!(
            c.reduce(&ReduceDesc {
                op: ReduceOp::Sum,
                dtype: DType::F32,
                input: StridedBuf::contiguous(big, &[2, 4]),
                axis: 1,
                output: big,
            }),
            Aliasing
        );
        assert_err!(
            c.softmax(&SoftmaxDesc {
                dtype: DType::F32,
                input: big,
                output: big,
                outer: 1,
                axis_len: 4,
                inner: 1,
                log: false,
            }),
            Aliasing
        );
        assert_err!(
            c.layer_norm(&LayerNormDesc {
                dtype: DType::F32,
                input: big,
                weight: Some(out),
                bias: None,
                output: off(out, 8),
                rows: 2,
                cols: 4,
                eps: 1e-5,
            }),
            Aliasing
        );
        // elementwise: partial overlap, or "in place" through a non-dense view
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Neg,
                StridedBuf::contiguous(big, &[4]),
                off(big, 4)
            )),
            Aliasing
        );
        let transposed = StridedBuf {
            ptr: big,
            layout: assert_ok!(Layout::contiguous(&[2, 2]).transpose(0, 1)),
        };
        assert_err!(
            c.unary(&unary_desc(UnaryOp::Neg, transposed, big)),
            Aliasing
        );
        // strided copy into a broadcast (stride-0) view, or a view with overlapping strides
        let broadcast = StridedBuf {
            ptr: out,
            layout: assert_ok!(Layout::contiguous(&[1, 4]).broadcast_to(&[3, 4])),
        };
        let err = assert_err!(
            c.copy_strided(&CopyDesc {
                dtype: DType::F32,
                src: StridedBuf::contiguous(big, &[3, 4]),
                dst: broadcast,
            }),
            Aliasing
        );
        assert_mentions(&err, &["copy_strided"]);
        let overlapping = StridedBuf {
            ptr: out,
            layout: assert_ok!(Layout::new(vec![3, 3], vec![1, 1], 0)),
        };
        assert_err!(
            c.copy_strided(&CopyDesc {
                dtype: DType::F32,
                src: StridedBuf::contiguous(big, &[3, 3]),
                dst: overlapping,
            }),
            Aliasing
        );
        assert_eq!(download(c, big, 16), ramp, "a rejected op wrote memory");

        // Adam: state operands aliasing each other
        let params = upload(c, &[1.0, 2.0, 3.0, 4.0]);
        let grads = upload(c, &[0.5, -0.5, 0.5, -0.5]);
        let m = upload(c, &[0.0; 4]);
        let v = upload(c, &[0.0; 4]);
        let err = assert_err!(c.adam_step(&adam_desc(params, grads, params, v)), Aliasing);
        assert_mentions(&err, &["adam_step"]);
        assert_err!(c.adam_step(&adam_desc(params, grads, m, m)), Aliasing);
        assert_err!(c.adam_step(&adam_desc(params, v, m, v)), Aliasing);
        assert_err!(c.adam_step(&adam_desc(params, params, m, v)), Aliasing);
        assert_eq!(download(c, params, 4), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(download(c, m, 4), vec![0.0; 4]);
        assert_ok!(c.adam_step(&adam_desc(params, grads, m, v)));
        assert_close(&download(c, params, 4), &[0.9, 2.1, 2.9, 4.1], 1e-5);

        // Tensor level: copying into a broadcast view
        let row = t(&b, &[1.0, 2.0, 3.0, 4.0], &[1, 4]);
        let view = assert_ok!(row.broadcast_to(&[3, 4]));
        let err = assert_err!(view.copy_from(&seq(&b, &[3, 4])), Aliasing);
        assert_mentions(&err, &["copy_strided"]);
        assert_eq!(vals(&row), vec![1.0, 2.0, 3.0, 4.0]);

        for p in [big, eye, out, params, grads, m, v] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
    }
}

#[test]
fn exact_in_place_elementwise_is_allowed() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let p = upload(c, &[-1.0, 2.0, -3.0, 4.0]);
        assert_ok!(c.unary(&unary_desc(
            UnaryOp::Relu,
            StridedBuf::contiguous(p, &[4]),
            p
        )));
        assert_eq!(download(c, p, 4), vec![0.0, 2.0, 0.0, 4.0]);
        assert_ok!(c.unary(&unary_desc(
            UnaryOp::Neg,
            StridedBuf::contiguous(p, &[2, 2]),
            p
        )));
        assert_eq!(download(c, p, 4), vec![0.0, -2.0, 0.0, -4.0]);
        assert_ok!(c.unary(&unary_desc(
            UnaryOp::Square,
            StridedBuf::contiguous(p, &[4]),
            p
        )));
        assert_eq!(download(c, p, 4), vec![0.0, 4.0, 0.0, 16.0]);

        // binary in place into its left operand, with a broadcast right operand
        let ones = upload(c, &[1.0; 4]);
        assert_ok!(c.binary(&BinaryDesc {
            op: BinaryOp::Add,
            dtype: DType::F32,
            lhs: StridedBuf::contiguous(p, &[4]),
            rhs: StridedBuf::contiguous(ones, &[4]),
            output: p,
        }));
        assert_eq!(download(c, p, 4), vec![1.0, 5.0, 1.0, 17.0]);
        let ten = upload(c, &[10.0]);
        assert_ok!(c.binary(&BinaryDesc {
            op: BinaryOp::Mul,
            dtype: DType::F32,
            lhs: StridedBuf::contiguous(p, &[4]),
            rhs: StridedBuf {
                ptr: ten,
                layout: assert_ok!(Layout::contiguous(&[1]).broadcast_to(&[4])),
            },
            output: p,
        }));
        assert_eq!(download(c, p, 4), vec![10.0, 50.0, 10.0, 170.0]);

        // the tensor API never writes into its input
        let x = t(&b, &[-1.0, 2.0], &[2]);
        let y = assert_ok!(x.relu());
        assert!(!y.shares_storage(&x));
        assert_eq!(vals(&x), vec![-1.0, 2.0]);

        for q in [p, ones, ten] {
            assert_ok!(c.free(q));
        }
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Windows: convolution and pooling
// ---------------------------------------------------------------------------------------------------

#[test]
fn conv_and_pool_window_errors() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let x2 = seq(&b, &[1, 1, 2, 2]);
        let w5 = seq(&b, &[1, 1, 5, 5]);
        let err = assert_err!(b.conv2d(&x2, &w5, ConvConfig::default()), ShapeMismatch);
        assert_mentions(&err, &["conv2d", "larger"]);
        let pad = |p: usize| ConvConfig {
            padding: [p, p],
            ..Default::default()
        };
        assert_err!(b.conv2d(&x2, &w5, pad(1)), ShapeMismatch);
        let y = assert_ok!(b.conv2d(&x2, &w5, pad(2)));
        assert_eq!(y.shape(), &[1, 1, 2, 2]);
        let x4 = seq(&b, &[1, 1, 4, 4]);
        let w2 = seq(&b, &[1, 1, 2, 2]);
        assert_err!(
            b.conv2d(
                &x4,
                &w2,
                ConvConfig {
                    dilation: [4, 1],
                    ..Default::default()
                }
            ),
            ShapeMismatch
        );
        let err = assert_err!(
            b.conv2d(
                &x4,
                &w2,
                ConvConfig {
                    stride: [0, 1],
                    ..Default::default()
                }
            ),
            InvalidArgument
        );
        assert_mentions(&err, &["conv2d", "stride"]);
        assert_err!(
            b.conv2d(
                &x4,
                &w2,
                ConvConfig {
                    dilation: [1, 0],
                    ..Default::default()
                }
            ),
            InvalidArgument
        );
        assert_err!(
            b.conv2d(
                &x4,
                &w2,
                ConvConfig {
                    groups: 0,
                    ..Default::default()
                }
            ),
            InvalidArgument
        );

        let pool = |kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]| Pool2dConfig {
            kernel,
            stride,
            padding,
            count_include_pad: true,
        };
        let err = assert_err!(
            b.max_pool2d(&x4, pool([2, 2], [2, 2], [2, 0])),
            InvalidArgument
        );
        assert_mentions(&err, &["pool2d", "padding"]);
        assert_err!(
            b.avg_pool2d(&x4, pool([3, 3], [1, 1], [1, 2])),
            InvalidArgument
        );
        assert_err!(
            b.max_pool2d(&x4, pool([1, 1], [1, 1], [1, 0])),
            InvalidArgument
        );
        let y = assert_ok!(b.max_pool2d(&x4, pool([3, 3], [1, 1], [1, 1])));
        assert_eq!(y.shape(), &[1, 1, 4, 4]);
        let err = assert_err!(
            b.max_pool2d(&x4, pool([2, 2], [0, 2], [0, 0])),
            InvalidArgument
        );
        assert_mentions(&err, &["stride"]);
        assert_err!(
            b.avg_pool2d(&x4, Pool2dConfig::new([0, 2])),
            InvalidArgument
        );
        assert_err!(b.max_pool2d(&x4, Pool2dConfig::new([5, 5])), ShapeMismatch);

        // the same through the raw trait
        let c = b.compute();
        let input = upload(c, &[1.0; 9]);
        let weight = upload(c, &[1.0; 4]);
        let out = c.alloc(16).expect("alloc");
        let conv = conv_desc(input, weight, out);
        assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                stride: [1, 0],
                ..conv.clone()
            }),
            InvalidArgument
        );
        assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                weight_shape: [1, 1, 4, 2],
                output_shape: [1, 1, 0, 2],
                ..conv.clone()
            }),
            ShapeMismatch
        );
        let pdesc = Pool2dDesc {
            kind: PoolKind::Max,
            dtype: DType::F32,
            input,
            input_shape: [1, 1, 3, 3],
            output: out,
            output_shape: [1, 1, 1, 1],
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        };
        assert_ok!(c.pool2d(&pdesc));
        assert_eq!(download(c, out, 1), vec![1.0]);
        assert_err!(
            c.pool2d(&Pool2dDesc {
                padding: [2, 0],
                ..pdesc.clone()
            }),
            InvalidArgument
        );
        assert_err!(
            c.pool2d(&Pool2dDesc {
                stride: [0, 2],
                ..pdesc.clone()
            }),
            InvalidArgument
        );
        assert_err!(
            c.pool2d(&Pool2dDesc {
                output_shape: [1, 1, 2, 2],
                ..pdesc.clone()
            }),
            ShapeMismatch
        );
        assert_err!(
            c.pool2d(&Pool2dDesc {
                kernel: [4, 4],
                ..pdesc.clone()
            }),
            ShapeMismatch
        );
        for p in [input, weight, out] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
    }
}

#[test]
fn conv_with_padding_whose_padded_size_overflows() {
    // 2·padding does not fit in usize: the window check must report it, not overflow while doing so.
    let b = Backend::reference().expect("reference");
    let x = seq(&b, &[1, 1, 4, 4]);
    let w = seq(&b, &[1, 1, 3, 3]);
    assert_err!(
        b.conv2d(
            &x,
            &w,
            ConvConfig {
                padding: [usize::MAX / 2 + 1, 0],
                ..Default::default()
            }
        ),
        ShapeMismatch | SizeOverflow | InvalidArgument
    );
    assert_backend_works(&b);
}

#[test]
fn conv_with_huge_padding_and_dilation_does_not_overflow_in_the_kernel() {
    // padding 2^62 and dilation 2^62 on a 1×1 input with a 3×1 kernel: the padded height 2^63 + 1 fits
    // exactly one window, whose middle tap (row 2^62 of the padded input) is the single real pixel. The
    // output is [1, 1, 1, 1] = x · w[1]; a clean error would also be acceptable, a panic is not.
    let b = Backend::reference().expect("reference");
    let x = t(&b, &[2.0], &[1, 1, 1, 1]);
    let w = t(&b, &[10.0, 100.0, 1000.0], &[1, 1, 3, 1]);
    let cfg = ConvConfig {
        padding: [1 << 62, 0],
        dilation: [1 << 62, 1],
        ..Default::default()
    };
    match no_panic!(b.conv2d(&x, &w, cfg)) {
        Ok(y) => {
            assert_eq!(y.shape(), &[1, 1, 1, 1]);
            assert_eq!(vals(&y), vec![200.0]);
        }
        Err(BackendError::SizeOverflow { .. } | BackendError::InvalidArgument { .. }) => {}
        other => panic!("expected Ok([200]) or a size error, got {other:?}"),
    }
    assert_backend_works(&b);
}

// ---------------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------------

#[test]
fn attention_errors() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let q = upload(c, &[0.5; 8]);
        let kv = upload(c, &[0.25; 8]);
        let o = c.alloc(32).expect("alloc");
        let desc = AttentionDesc {
            dtype: DType::F32,
            q,
            k: kv,
            v: kv,
            o,
            batch: 1,
            heads: 1,
            seq_q: 2,
            seq_kv: 0,
            head_dim: 4,
            scale: 0.5,
            causal: false,
        };
        let err = assert_err!(c.attention(&desc), InvalidArgument);
        assert_mentions(&err, &["attention", "seq_kv"]);
        assert_err!(
            c.attention(&AttentionDesc {
                causal: true,
                ..desc.clone()
            }),
            InvalidArgument
        );
        // seq_q = 0 too: nothing to compute, legal
        assert_ok!(c.attention(&AttentionDesc {
            seq_q: 0,
            ..desc.clone()
        }));
        let valid = AttentionDesc {
            seq_kv: 2,
            ..desc.clone()
        };
        assert_err!(
            c.attention(&AttentionDesc {
                scale: f64::NAN,
                ..valid.clone()
            }),
            InvalidArgument
        );
        assert_err!(
            c.attention(&AttentionDesc {
                dtype: DType::I32,
                ..valid.clone()
            }),
            Unsupported
        );
        assert_err!(
            c.attention(&AttentionDesc {
                o: q,
                ..valid.clone()
            }),
            Aliasing
        );
        assert_ok!(c.attention(&valid));
        assert_close(&download(c, o, 8), &[0.25; 8], 1e-6);

        // Tensor level.
        let tq = seq(&b, &[1, 1, 2, 4]);
        let tk = b.empty(&[1, 1, 0, 4], DType::F32).expect("empty");
        assert_err!(b.attention(&tq, &tk, &tk, false), InvalidArgument);
        assert_err!(b.attention(&tq, &tk, &tk, true), InvalidArgument);
        let tk2 = seq(&b, &[1, 1, 3, 4]);
        assert_err!(
            b.attention_with_scale(&tq, &tk2, &tk2, false, f64::INFINITY),
            InvalidArgument
        );
        let y = assert_ok!(b.attention(&tq, &tk2, &tk2, true));
        assert_eq!(y.shape(), &[1, 1, 2, 4]);

        for p in [q, kv, o] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Degenerate raw descriptors
// ---------------------------------------------------------------------------------------------------

#[test]
fn raw_gemm_with_no_rows_is_a_no_op() {
    // m = 0: C is 0 × 2 (ldc 1), op(A) is 0 × 1, B is 1 × 2. Nothing to write.
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let nothing = c.alloc(0).expect("alloc");
        let bm = upload(c, &[1.0, 2.0]);
        assert_ok!(c.gemm(&GemmDesc {
            ldc: 1,
            ..gemm_desc(nothing, bm, nothing, 0, 2, 1)
        }));
        assert_ok!(c.batched_gemm(&BatchedGemmDesc {
            gemm: GemmDesc {
                ldc: 1,
                ..gemm_desc(nothing, bm, nothing, 0, 2, 1)
            },
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            batch_count: 3,
        }));
        assert_eq!(download(c, bm, 2), vec![1.0, 2.0]);
        assert_ok!(c.free(nothing));
        assert_ok!(c.free(bm));
        assert_backend_works(&b);
    }
}

#[test]
fn raw_gemm_and_gemv_with_other_empty_dims() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let nothing = c.alloc(0).expect("alloc");
        let a = upload(c, &[1.0, 2.0, 3.0, 4.0]);
        let bm = upload(c, &[1.0, 2.0]);
        // n = 0: C is 2 × 0.
        assert_ok!(c.gemm(&gemm_desc(a, nothing, nothing, 2, 0, 2)));
        // k = 0: C = beta · C.
        let cbuf = upload(c, &[9.0; 4]);
        assert_ok!(c.gemm(&gemm_desc(nothing, nothing, cbuf, 2, 2, 0)));
        assert_eq!(download(c, cbuf, 4), vec![0.0; 4]);
        assert_ok!(c.copy_htod(cbuf, &bytes_of(&[8.0; 4])));
        assert_ok!(c.gemm(&GemmDesc {
            beta: 0.5,
            ..gemm_desc(nothing, nothing, cbuf, 2, 2, 0)
        }));
        assert_eq!(download(c, cbuf, 4), vec![4.0; 4]);
        // gemv with an empty y, and with an empty x
        assert_ok!(c.gemv(&gemv_desc(nothing, bm, nothing, 0, 2)));
        assert_ok!(c.gemv(&gemv_desc(nothing, nothing, cbuf, 2, 0)));
        assert_eq!(download(c, cbuf, 2), vec![0.0; 2]);
        for p in [nothing, a, bm, cbuf] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
    }
}

/// Runs a raw op whose operands are all empty (0 bytes) although other dims are huge: it has nothing to
/// do. It may succeed or refuse, but must not size host buffers by the other dims (a capacity-overflow
/// panic, or an abort from the allocator).
fn check_empty_raw_op(
    what: &str,
    op: impl Fn(&dyn ComputeBackend, DevicePtr, DevicePtr) -> Result<()>,
) {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let p = c.alloc(16).expect("alloc");
        let o = c.alloc(16).expect("alloc");
        let r = no_panic!(op(c, p, o));
        assert!(
            matches!(
                r,
                Ok(())
                    | Err(BackendError::SizeOverflow { .. }
                        | BackendError::InvalidArgument { .. }
                        | BackendError::OutOfMemory { .. })
            ),
            "{what}: expected Ok or a size error, got {r:?}"
        );
        assert_ok!(c.free(p));
        assert_ok!(c.free(o));
        assert_backend_works(&b);
    }
}

#[test]
fn raw_attention_with_zero_head_dim_and_a_long_sequence() {
    check_empty_raw_op("attention with head_dim 0", |c, p, o| {
        c.attention(&AttentionDesc {
            dtype: DType::F32,
            q: p,
            k: p,
            v: p,
            o,
            batch: 1,
            heads: 1,
            seq_q: 1,
            seq_kv: 1 << 61,
            head_dim: 0,
            scale: 1.0,
            causal: false,
        })
    });
}

#[test]
fn raw_conv_with_no_images_and_many_output_channels() {
    // N = 0 images, no input channels, 2^61 output channels, no bias.
    check_empty_raw_op("conv2d with N = 0", |c, p, o| {
        c.conv2d_forward(&Conv2dDesc {
            dtype: DType::F32,
            input: p,
            input_shape: [0, 0, 1, 1],
            weight: p,
            weight_shape: [1 << 61, 0, 1, 1],
            bias: None,
            output: o,
            output_shape: [0, 1 << 61, 1, 1],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        })
    });
}

#[test]
fn raw_reduce_of_the_long_axis_of_an_empty_view() {
    check_empty_raw_op("reduce of an empty [0, 2^61] view", |c, p, o| {
        c.reduce(&ReduceDesc {
            op: ReduceOp::Sum,
            dtype: DType::F32,
            input: StridedBuf::contiguous(p, &[0, 1 << 61]),
            axis: 1,
            output: o,
        })
    });
}

// ---------------------------------------------------------------------------------------------------
// Batch norm modes
// ---------------------------------------------------------------------------------------------------

#[test]
fn batch_norm_mode_errors() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let f = DType::F32;
        let rm = b.zeros(&[3], f).expect("zeros");
        let rv = b.ones(&[3], f).expect("ones");
        let x13 = seq(&b, &[1, 3]);
        let x43 = seq(&b, &[4, 3]);

        // training with one value per channel
        let err = assert_err!(b.batch_norm(&x13, &rm, &rv, true), InvalidArgument);
        assert_mentions(&err, &["batch_norm", "one value per channel"]);
        assert_err!(
            b.batch_norm(&seq(&b, &[1, 3, 1, 1]), &rm, &rv, true),
            InvalidArgument
        );
        assert_err!(
            b.batch_norm_with(
                &x13,
                BatchNormConfig {
                    training: true,
                    ..Default::default()
                }
            ),
            InvalidArgument
        );
        // inference without running statistics
        let err = assert_err!(
            b.batch_norm_with(
                &x43,
                BatchNormConfig {
                    training: false,
                    ..Default::default()
                }
            ),
            InvalidArgument
        );
        assert_mentions(&err, &["batch_norm", "running_mean"]);
        assert_err!(x43.batch_norm(BatchNormConfig::default()), InvalidArgument);
        assert_err!(
            b.batch_norm_with(
                &x43,
                BatchNormConfig {
                    running_mean: Some(&rm),
                    training: false,
                    ..Default::default()
                }
            ),
            InvalidArgument
        );
        // bad momentum / eps
        let with = |momentum: Option<f64>, eps: Option<f64>| BatchNormConfig {
            running_mean: Some(&rm),
            running_var: Some(&rv),
            training: true,
            momentum,
            eps,
            ..Default::default()
        };
        assert_err!(
            b.batch_norm_with(&x43, with(Some(1.5), None)),
            InvalidArgument
        );
        assert_err!(
            b.batch_norm_with(&x43, with(Some(f64::NAN), None)),
            InvalidArgument
        );
        assert_err!(
            b.batch_norm_with(&x43, with(None, Some(-1.0))),
            InvalidArgument
        );
        assert_err!(
            b.batch_norm_with(&x43, with(None, Some(f64::INFINITY))),
            InvalidArgument
        );
        assert_eq!(
            vals(&rm),
            vec![0.0; 3],
            "running_mean written by a failed op"
        );
        assert_eq!(
            vals(&rv),
            vec![1.0; 3],
            "running_var written by a failed op"
        );

        // valid calls still work: training updates the running mean by momentum · batch mean
        let y = assert_ok!(b.batch_norm(&x43, &rm, &rv, true));
        assert_eq!(y.shape(), &[4, 3]);
        assert_close(&vals(&rm), &[0.0125, 0.0375, 0.0625], 1e-6);
        // inference with one value per channel is fine
        let y = assert_ok!(b.batch_norm(&x13, &rm, &rv, false));
        assert_eq!(y.shape(), &[1, 3]);
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Fused Adam
// ---------------------------------------------------------------------------------------------------

#[test]
fn fused_adam_rejects_bad_input_without_updating_anything() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let p0 = t(&b, &[1.0, 2.0], &[2]);
        let p1 = t(&b, &[3.0, 4.0, 5.0], &[3]);
        let g0 = t(&b, &[0.5, -0.5], &[2]);
        let g1 = t(&b, &[1.0, 1.0, -1.0], &[3]);
        let grads = vec![g0.clone(), g1.clone()];
        let mut params = vec![p0.clone(), p1.clone()];
        let mut state = AdamState::adam();
        let snapshot = |ps: &[Tensor]| ps.iter().map(vals).collect::<Vec<_>>();
        let before = snapshot(&params);
        let betas = (0.9, 0.999);

        // counts and shapes
        let err = assert_err!(
            b.fused_adam_step(&mut params, &grads[..1], &mut state, 0.1, betas),
            ShapeMismatch
        );
        assert_mentions(&err, &["fused_adam_step", "2 params", "1 grads"]);
        assert_err!(
            b.fused_adam_step(&mut params, &[], &mut state, 0.1, betas),
            ShapeMismatch
        );
        let wrong = vec![g0.clone(), t(&b, &[1.0, 1.0], &[2])];
        let err = assert_err!(
            b.fused_adam_step(&mut params, &wrong, &mut state, 0.1, betas),
            ShapeMismatch
        );
        assert_mentions(&err, &["param 1"]);

        // hyper-parameters
        for (lr, betas) in [
            (-0.1, (0.9, 0.999)),
            (f32::NAN, (0.9, 0.999)),
            (f32::INFINITY, (0.9, 0.999)),
            (0.1, (1.0, 0.999)),
            (0.1, (0.9, 1.0)),
            (0.1, (0.9, 1.5)),
            (0.1, (-0.1, 0.999)),
        ] {
            let err = assert_err!(
                b.fused_adam_step(&mut params, &grads, &mut state, lr, betas),
                InvalidArgument
            );
            assert_mentions(&err, &["adam"]);
        }
        let mut bad_eps = AdamState::adam().with_eps(-1.0);
        assert_err!(
            b.fused_adam_step(&mut params, &grads, &mut bad_eps, 0.1, betas),
            InvalidArgument
        );
        let mut bad_wd = AdamState::adam().with_weight_decay(-0.01);
        assert_err!(
            b.fused_adam_step(&mut params, &grads, &mut bad_wd, 0.1, betas),
            InvalidArgument
        );

        // dtypes and devices
        let g64 = b.from_slice(&[0.5f64, -0.5], &[2]).expect("f64 grad");
        assert_err!(
            b.fused_adam_step(&mut params, &[g64, g1.clone()], &mut state, 0.1, betas),
            DTypeMismatch
        );
        let other = Backend::reference().expect("reference");
        let foreign = vec![g0.clone(), t(&other, &[1.0, 1.0, -1.0], &[3])];
        assert_err!(
            b.fused_adam_step(&mut params, &foreign, &mut state, 0.1, betas),
            DeviceMismatch
        );

        assert_eq!(snapshot(&params), before, "a failed step changed params");
        assert_eq!(state.step(), 0, "a failed step advanced the step count");
        for s in [&state, &bad_eps, &bad_wd] {
            for m in s.exp_avg().iter().chain(s.exp_avg_sq()) {
                assert!(vals(m).iter().all(|&v| v == 0.0), "moments changed");
            }
        }

        // one valid step: p -= lr · sign(g) on the first step
        assert_ok!(b.fused_adam_step(&mut params, &grads, &mut state, 0.1, betas));
        assert_eq!(state.step(), 1);
        let after = snapshot(&params);
        assert_close(&after[0], &[0.9, 2.1], 1e-5);
        assert_close(&after[1], &[2.9, 3.9, 5.1], 1e-5);
        let moments: Vec<Vec<f32>> = state.exp_avg().iter().map(vals).collect();

        // the state now holds two parameters: one, or reshaped ones, do not fit
        let mut one = vec![p0.clone()];
        assert_err!(
            b.fused_adam_step(&mut one, &grads[..1], &mut state, 0.1, betas),
            ShapeMismatch
        );
        let mut reshaped = vec![assert_ok!(p0.reshape(&[2, 1])), p1.clone()];
        let reshaped_grads = vec![assert_ok!(g0.reshape(&[2, 1])), g1.clone()];
        assert_err!(
            b.fused_adam_step(&mut reshaped, &reshaped_grads, &mut state, 0.1, betas),
            ShapeMismatch
        );
        assert_err!(
            b.fused_adam_step(&mut params, &grads, &mut state, -1.0, betas),
            InvalidArgument
        );
        assert_eq!(snapshot(&params), after, "a failed step changed params");
        assert_eq!(state.step(), 1, "a failed step advanced the step count");
        let moments_now: Vec<Vec<f32>> = state.exp_avg().iter().map(vals).collect();
        assert_eq!(moments_now, moments, "a failed step changed the moments");

        assert_backend_works(&b);
    }
}

#[test]
fn fused_adam_with_a_gradient_aliasing_its_parameter_updates_all_or_nothing() {
    // The second gradient IS the second parameter. Whether the library accepts that (reading the
    // gradient before writing) or refuses it (Aliasing), the step must be all-or-nothing: a refusal
    // must not leave the first parameter updated.
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let p0 = t(&b, &[1.0, 2.0], &[2]);
        let p1 = t(&b, &[3.0, -4.0], &[2]);
        let mut params = vec![p0.clone(), p1.clone()];
        let grads = vec![t(&b, &[0.5, 0.5], &[2]), p1.clone()];
        let mut state = AdamState::adam();
        match no_panic!(b.fused_adam_step(&mut params, &grads, &mut state, 0.1, (0.9, 0.999))) {
            Ok(()) => {
                assert_eq!(state.step(), 1);
                assert_close(&vals(&p0), &[0.9, 1.9], 1e-5);
                assert_close(&vals(&p1), &[2.9, -3.9], 1e-5);
            }
            Err(err @ BackendError::Aliasing { .. }) => {
                assert_mentions(&err, &["adam"]);
                assert_eq!(
                    vals(&p0),
                    vec![1.0, 2.0],
                    "fused_adam_step returned {err:?} but had already updated param 0"
                );
                assert_eq!(vals(&p1), vec![3.0, -4.0]);
                assert_eq!(state.step(), 0);
            }
            Err(other) => panic!("expected Ok or Err(Aliasing), got {other:?}"),
        }
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------------

#[test]
fn tensors_from_different_backend_instances() {
    let r1 = Backend::reference().expect("reference");
    let r2 = Backend::reference().expect("reference");
    let cpu = Backend::cpu().build().expect("cpu");
    for (x, y) in [(&r1, &r2), (&r1, &cpu), (&cpu, &r1)] {
        eprintln!("{} vs {}", x.backend_type(), y.backend_type());
        let a = seq(x, &[2, 2]);
        let bb = seq(y, &[2, 2]);
        let err = assert_err!(x.add(&a, &bb), DeviceMismatch);
        assert_mentions(&err, &["add", "to(&backend)"]);
        assert_err!(a.add(&bb), DeviceMismatch);
        assert_err!(bb.add(&a), DeviceMismatch);
        let err = assert_err!(a.matmul(&bb), DeviceMismatch);
        assert_mentions(&err, &["matmul"]);
        assert_err!(x.relu(&bb), DeviceMismatch);
        assert_err!(x.sum(&bb, 0, false), DeviceMismatch);
        assert_err!(x.softmax(&bb, 0), DeviceMismatch);
        assert_err!(x.gemm(&a, &a, 1.0, &bb, 1.0), DeviceMismatch);
        assert_err!(
            x.gemv(&a, &seq(y, &[2]), 1.0, &seq(x, &[2]), 0.0),
            DeviceMismatch
        );
        assert_err!(
            x.conv2d(
                &seq(x, &[1, 1, 3, 3]),
                &seq(y, &[1, 1, 2, 2]),
                ConvConfig::default()
            ),
            DeviceMismatch
        );
        let q = seq(x, &[1, 1, 2, 2]);
        assert_err!(
            x.attention(&q, &seq(y, &[1, 1, 2, 2]), &q, false),
            DeviceMismatch
        );
        assert_err!(
            x.layer_norm(&a, &[2], Some(&seq(y, &[2])), None, 1e-5),
            DeviceMismatch
        );
        let rm = y.zeros(&[2], DType::F32).expect("zeros");
        let rv = y.ones(&[2], DType::F32).expect("ones");
        assert_err!(
            x.batch_norm(&seq(x, &[4, 2]), &rm, &rv, true),
            DeviceMismatch
        );
        assert_eq!(vals(&rm), vec![0.0; 2]);
        let mut params = vec![seq(x, &[2])];
        let mut state = AdamState::adam();
        assert_err!(
            x.fused_adam_step(&mut params, &[seq(y, &[2])], &mut state, 0.1, (0.9, 0.999)),
            DeviceMismatch
        );
        assert_eq!(state.step(), 0);

        // moving the tensor fixes it; copy_from moves by itself
        let moved = assert_ok!(bb.to(x));
        assert!(moved.backend().same_instance(x));
        let s = assert_ok!(a.add(&moved));
        assert_eq!(vals(&s), vec![-2.0, -1.5, -1.0, -0.5]);
        let dst = x.zeros(&[2, 2], DType::F32).expect("zeros");
        assert_ok!(dst.copy_from(&bb));
        assert_eq!(vals(&dst), vals(&bb));
    }
    for b in [&r1, &r2, &cpu] {
        assert_backend_works(b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------------------------------

#[test]
fn view_errors() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let x = seq(&b, &[2, 3]);
        let err = assert_err!(x.reshape(&[4]), ShapeMismatch);
        assert_mentions(&err, &["reshape", "6", "4"]);
        assert_err!(x.reshape(&[7, 1]), ShapeMismatch);
        assert_err!(x.reshape(&[0, 6]), ShapeMismatch);
        assert_err!(x.reshape_infer(&[-1, -1]), ShapeMismatch);
        assert_err!(x.reshape_infer(&[-1, 4]), ShapeMismatch);
        assert_err!(x.reshape_infer(&[-2, 3]), ShapeMismatch);
        assert_err!(x.reshape_infer(&[0, -1]), ShapeMismatch);

        let err = assert_err!(x.transpose(0, 2), InvalidArgument);
        assert_mentions(&err, &["transpose", "axis 2"]);
        assert_err!(x.transpose(-3, 0), InvalidArgument);
        let err = assert_err!(x.permute(&[0, 0]), InvalidArgument);
        assert_mentions(&err, &["permute"]);
        assert_err!(x.permute(&[0]), InvalidArgument);
        assert_err!(x.permute(&[0, 2]), InvalidArgument);
        assert_err!(x.permute(&[1, 0, 2]), InvalidArgument);
        assert_err!(x.narrow(2, 0, 1), InvalidArgument);
        assert_err!(x.narrow(-3, 0, 1), InvalidArgument);
        let err = assert_err!(x.narrow(1, 2, 2), InvalidArgument);
        assert_mentions(&err, &["narrow"]);
        assert_err!(x.narrow(1, 4, 0), InvalidArgument);
        assert_err!(x.narrow(0, 0, 3), InvalidArgument);
        assert_err!(x.narrow(0, usize::MAX, 2), InvalidArgument);
        assert_err!(x.squeeze(0), InvalidArgument);
        assert_err!(x.squeeze(2), InvalidArgument);
        assert_err!(x.unsqueeze(3), InvalidArgument);
        assert_err!(x.unsqueeze(-4), InvalidArgument);
        let err = assert_err!(x.broadcast_to(&[3]), ShapeMismatch);
        assert_mentions(&err, &["broadcast_to"]);
        assert_err!(x.broadcast_to(&[2, 4]), ShapeMismatch);
        assert_err!(x.broadcast_to(&[4, 3, 3]), ShapeMismatch);

        // the tensor is untouched and its valid views work
        assert_eq!(x.shape(), &[2, 3]);
        let y = assert_ok!(x.narrow(1, 1, 2).and_then(|v| v.contiguous()));
        assert_eq!(vals(&y), vec![-0.75, -0.5, 0.0, 0.25]);
        let y = assert_ok!(x.permute(&[1, 0]).and_then(|v| v.contiguous()));
        assert_eq!(vals(&y), vec![-1.0, -0.25, -0.75, 0.0, -0.5, 0.25]);
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------------------

#[test]
fn error_messages_are_actionable() {
    let b = Backend::reference().expect("reference");
    let c = b.compute();
    let a = seq(&b, &[2, 3]);
    let cases: Vec<(BackendError, &[&str])> = vec![
        (
            assert_err!(b.matmul(&a, &a), ShapeMismatch),
            &["matmul", "inner dims", "3 vs 2"],
        ),
        (
            assert_err!(
                b.add(&a, &b.zeros(&[2, 3], DType::F64).expect("zeros")),
                DTypeMismatch
            ),
            &["add", "expected f32", "got f64"],
        ),
        (
            assert_err!(b.empty(&[usize::MAX, 2], DType::F32), SizeOverflow),
            &["size overflow", "too many elements"],
        ),
        (
            assert_err!(c.copy_htod(DevicePtr(0x1234), &[0u8; 4]), InvalidPointer),
            &["0x1234", "not inside any live allocation"],
        ),
        (
            assert_err!(
                Backend::reference()
                    .expect("reference")
                    .matmul(&a, &a.t().expect("t")),
                DeviceMismatch
            ),
            &["matmul", "another backend instance"],
        ),
        (
            // No build contains ROCm yet, so this is unavailable on every machine.
            assert_err!(Backend::new(BackendType::Rocm), Unavailable),
            &["rocm", "no ROCm backend", "Backend::webgpu()"],
        ),
        (
            assert_err!(
                BackendBuilder::new()
                    .backend_type(BackendType::Cpu)
                    .memory_pool_size(1 << 20)
                    .build()
                    .expect("a bounded pool")
                    .zeros(&[1 << 20], DType::F32),
                MemoryPoolExhausted
            ),
            &[
                "memory pool exhausted",
                "4194304 bytes",
                "empty_cache",
                "max_size",
            ],
        ),
        (
            assert_err!(a.narrow(1, 2, 5), InvalidArgument),
            &["narrow", "exceeds dim 1 of size 3"],
        ),
        (
            assert_err!(
                b.relu(&b.zeros(&[2], DType::I64).expect("zeros")),
                Unsupported
            ),
            &["not supported", "i64", "reference"],
        ),
    ];
    for (err, words) in &cases {
        eprintln!("{err}");
        assert_mentions(err, words);
        // Debug is informative too (variant name)
        assert!(!format!("{err:?}").is_empty());
    }
    assert_backend_works(&b);
}
