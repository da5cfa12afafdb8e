//! Tensors of different backend instances, view errors, and what error messages say.

use super::*;

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
