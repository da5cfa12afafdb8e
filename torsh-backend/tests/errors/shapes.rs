//! Shapes, dtypes and ranks that do not fit an op, through the tensor API and the raw trait.

use super::*;

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
                rhs: Value::Tensor(StridedBuf::contiguous(y, &[3, 2])),
                output: out,
            }),
            ShapeMismatch
        );
        assert_mentions(&err, &["binary"]);
        let err = assert_err!(
            c.unary_backward(&UnaryBackwardDesc {
                op: UnaryOp::Tanh,
                dtype: DType::F32,
                saved: StridedBuf::contiguous(x, &[2, 3]),
                grad: StridedBuf::contiguous(y, &[3, 2]),
                output: out,
            }),
            ShapeMismatch
        );
        assert_mentions(&err, &["unary_backward", "grad"]);
        for p in [1.5, -0.1, f64::NAN] {
            let err = assert_err!(
                c.dropout(&DropoutDesc {
                    dtype: DType::F32,
                    input: x,
                    output: out,
                    len: 4,
                    p,
                    seed: 1,
                }),
                InvalidArgument
            );
            assert_mentions(&err, &["dropout", "p ="]);
        }
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
            saved_mean: None,
            saved_invstd: None,
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
            saved_mean: None,
            saved_invstd: None,
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
            c.unary_backward(&UnaryBackwardDesc {
                op: UnaryOp::Relu,
                dtype: DType::I32,
                saved: StridedBuf::contiguous(x, &[4]),
                grad: StridedBuf::contiguous(y, &[4]),
                output: out,
            }),
            Unsupported
        );
        assert_err!(
            c.binary(&BinaryDesc {
                op: BinaryOp::Mul,
                dtype: DType::U8,
                lhs: StridedBuf::contiguous(x, &[4]),
                rhs: Value::Tensor(StridedBuf::contiguous(y, &[4])),
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

#[test]
fn joins_pads_repeats_and_multi_dim_reductions_check_their_arguments() {
    let other = Backend::reference().unwrap();
    for b in backends() {
        let a = seq(&b, &[2, 3]);
        let c = seq(&b, &[4, 3]);
        assert_err!(b.cat(&[], 0), InvalidArgument);
        assert_err!(b.stack(&[], 0), InvalidArgument);
        let err = assert_err!(b.cat(&[&a, &c], 1), ShapeMismatch);
        assert_mentions(&err, &["cat", "dim 1"]);
        assert_err!(b.cat(&[&a, &seq(&b, &[2, 3, 1])], 0), ShapeMismatch);
        assert_err!(b.cat(&[&a, &c], 2), InvalidArgument);
        let wide = assert_ok!(a.cast(DType::F64));
        assert_err!(b.cat(&[&a, &wide], 0), DTypeMismatch);
        if !b.same_instance(&other) {
            assert_err!(b.cat(&[&a, &seq(&other, &[2, 3])], 0), DeviceMismatch);
        }
        assert_err!(b.stack(&[&a, &c], 0), ShapeMismatch);
        assert_err!(b.stack(&[&a, &a], 3), InvalidArgument);
        assert_err!(a.pad(&[(1, 1), (1, 1), (1, 1)], 0.0), InvalidArgument);
        assert_err!(a.pad(&[(usize::MAX, 1)], 0.0), SizeOverflow);
        assert_err!(a.repeat(&[2]), InvalidArgument);
        assert_err!(a.repeat(&[usize::MAX, 2]), SizeOverflow);
        assert_err!(a.sum_dims(&[0, -2], false), InvalidArgument);
        assert_err!(a.mean_dims(&[2], true), InvalidArgument);
        assert_err!(a.flip(&[0, -2]), InvalidArgument);
        assert_err!(a.flip(&[2]), InvalidArgument);
        assert_err!(a.clamp(None, None), InvalidArgument);
        let flipped = assert_ok!(a.flip(&[0, 1]));
        let mut reversed = vals(&a);
        reversed.reverse();
        assert_eq!(vals(&flipped), reversed);
        let clamped = assert_ok!(a.clamp(Some(-0.5), Some(0.0)));
        assert!(vals(&clamped).iter().all(|v| (-0.5..=0.0).contains(v)));
        // Valid joins give the right values.
        let joined = assert_ok!(b.cat(&[&a, &c], 0));
        assert_eq!(vals(&joined)[..6], vals(&a)[..]);
        assert_eq!(vals(&joined)[6..], vals(&c)[..]);
        let sums = assert_ok!(c.sum_dims(&[0, 1], true));
        assert_eq!(sums.shape(), &[1, 1]);
        assert_close(&vals(&sums), &[vals(&c).iter().sum()], 1e-5);
        assert_backend_works(&b);
    }
}

#[test]
fn scans_reject_dims_out_of_range_on_every_backend() {
    for b in backends() {
        let x = seq(&b, &[3, 4]);
        let err = assert_err!(x.cumsum(2), InvalidArgument);
        assert_mentions(&err, &["cumsum", "2"]);
        assert_err!(x.cumprod(-3), InvalidArgument);
        let scalar = assert_ok!(b.full(&[], 1.0, DType::F32));
        assert_err!(scalar.cumsum(0), InvalidArgument);
        // The raw descriptor checks its dim as well.
        let out = assert_ok!(b.empty(&[3, 4], DType::F32));
        let desc = torsh_backend::compute::ScanDesc {
            op: ScanOp::Sum,
            dtype: DType::F32,
            input: x.strided_buf(),
            dim: 2,
            output: out.data_ptr(),
        };
        assert_err!(b.compute().scan(&desc), InvalidArgument);
        // Integers promote to I64, so a mask's running count does not wrap.
        let mask = assert_ok!(b.full(&[300], 1.0, DType::U8));
        let count = assert_ok!(mask.cumsum(0));
        assert_eq!(count.dtype(), DType::I64);
        assert_eq!(assert_ok!(count.to_vec::<i64>())[299], 300);
        assert_backend_works(&b);
    }
}

#[test]
fn sorts_reject_bad_dims_and_k_on_every_backend() {
    for b in backends() {
        let x = seq(&b, &[3, 4]);
        let err = assert_err!(x.sort(2, false), InvalidArgument);
        assert_mentions(&err, &["sort", "2"]);
        assert_err!(x.argsort(-3, true), InvalidArgument);
        let err = assert_err!(x.topk(5, 1, true), InvalidArgument);
        assert_mentions(&err, &["topk", "5", "4"]);
        assert_err!(
            assert_ok!(b.full(&[], 1.0, DType::F32)).sort(0, false),
            InvalidArgument
        );
        // A raw sort that asks for no output at all.
        let desc = torsh_backend::compute::SortDesc {
            dtype: DType::F32,
            input: x.strided_buf(),
            dim: 1,
            descending: false,
            k: 4,
            values: None,
            indices: None,
        };
        assert_err!(b.compute().sort(&desc), InvalidArgument);
        // k past the dim's length.
        let out = assert_ok!(b.empty(&[3, 5], DType::I64));
        let desc = torsh_backend::compute::SortDesc {
            k: 5,
            indices: Some(out.data_ptr()),
            ..desc
        };
        let err = assert_err!(b.compute().sort(&desc), InvalidArgument);
        assert_mentions(&err, &["sort", "k = 5"]);
        // k = 0 and k = the whole dim are fine.
        assert_eq!(assert_ok!(x.topk(0, 1, true)).0.shape(), &[3, 0]);
        assert_eq!(assert_ok!(x.topk(4, 1, false)).1.shape(), &[3, 4]);
        assert_backend_works(&b);
    }
}
