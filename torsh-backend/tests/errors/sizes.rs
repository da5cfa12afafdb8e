//! Sizes: zero-size dims are legal, sizes that overflow are `SizeOverflow`, and raw descriptors
//! with empty operands but huge other dims do nothing.

use super::*;

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
                lse: None,
            }),
            SizeOverflow
        );
        assert_err!(
            c.attention_backward(&torsh_backend::compute::AttentionBackwardDesc {
                dtype: DType::F32,
                grad_output: x,
                q: x,
                k: y,
                v: y,
                o: x,
                lse: y,
                grad_q: out,
                grad_k: out,
                grad_v: out,
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
            lse: None,
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
