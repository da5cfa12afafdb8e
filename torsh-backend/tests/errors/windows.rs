//! Convolution and pooling windows: kernels, strides, padding and dilation that do not fit.

use super::*;

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
            indices: None,
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
        // Positions go with a max only, and its gradient needs them.
        let err = assert_err!(
            c.pool2d(&Pool2dDesc {
                kind: PoolKind::Avg {
                    count_include_pad: true,
                },
                indices: Some(weight),
                ..pdesc.clone()
            }),
            InvalidArgument
        );
        assert_mentions(&err, &["indices"]);
        let back = Pool2dBackwardDesc {
            kind: PoolKind::Max,
            dtype: DType::F32,
            grad: out,
            grad_shape: [1, 1, 1, 1],
            indices: None,
            output: input,
            input_shape: [1, 1, 3, 3],
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        };
        let err = assert_err!(c.pool2d_backward(&back), InvalidArgument);
        assert_mentions(&err, &["indices"]);
        assert_err!(
            c.pool2d_backward(&Pool2dBackwardDesc {
                kind: PoolKind::Avg {
                    count_include_pad: false,
                },
                grad_shape: [1, 1, 2, 2],
                ..back
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
