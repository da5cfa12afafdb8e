//! Indexing: indices out of range, index dtypes that are not integers, and ranks, lengths and dims
//! that do not fit, for `gather`, `index_select` and `embedding`.

use torsh_backend::compute::GatherDesc;

use super::*;

fn index(b: &Backend, values: &[i64], shape: &[usize]) -> Tensor {
    b.from_slice(values, shape).expect("from_slice")
}

/// The error of an op that either fails at once (backends whose ops complete before they return)
/// or succeeds and reports the error at the next host read (GPU backends).
fn deferred_error(result: Result<Tensor>) -> BackendError {
    match no_panic!(result) {
        Err(e) => e,
        Ok(y) => no_panic!(y.to_vec_f64()).expect_err("a bad index must fail by the host read"),
    }
}

#[test]
fn indices_out_of_range_are_errors_on_every_backend() {
    for b in backends() {
        let name = b.backend_type();
        let x = seq(&b, &[3, 4]);
        for bad in [-1i64, 3, 1 << 40, i64::MIN] {
            for dtype in [DType::I64, DType::I32] {
                if dtype == DType::I32 && i32::try_from(bad).is_err() {
                    continue;
                }
                let ix = assert_ok!(index(&b, &[0, bad, 2, 1], &[1, 4]).cast(dtype));
                let err = deferred_error(b.gather(&x, 0, &ix));
                assert!(
                    matches!(err, BackendError::IndexOutOfRange { op: "gather", index, size: 3 } if index == bad),
                    "{name} {dtype}: index {bad}: {err:?}"
                );
                assert_mentions(&err, &["gather", &bad.to_string(), "3"]);
                // The error is reported once: the next ops and reads succeed.
                let good = assert_ok!(b.gather(&x, 0, &index(&b, &[0, 1, 2, 1], &[1, 4])));
                assert_eq!(vals(&good), [-1.0, 0.25, 1.5, 0.75], "{name}");
                assert_ok!(b.synchronize());
            }
        }
        let rows = index(&b, &[1, 4], &[2]);
        let err = deferred_error(b.index_select(&x, 1, &rows));
        assert!(
            matches!(
                err,
                BackendError::IndexOutOfRange {
                    index: 4,
                    size: 4,
                    ..
                }
            ),
            "{name}: {err:?}"
        );
        let err = deferred_error(b.embedding(&x, &index(&b, &[2, -3], &[2, 1])));
        assert!(
            matches!(
                err,
                BackendError::IndexOutOfRange {
                    index: -3,
                    size: 3,
                    ..
                }
            ),
            "{name}: {err:?}"
        );
        // An empty dim has no valid index.
        let empty = assert_ok!(b.zeros(&[0, 4], DType::F32));
        let err = deferred_error(b.index_select(&empty, 0, &index(&b, &[0], &[1])));
        assert!(
            matches!(
                err,
                BackendError::IndexOutOfRange {
                    index: 0,
                    size: 0,
                    ..
                }
            ),
            "{name}: {err:?}"
        );
        assert_backend_works(&b);
    }
}

#[test]
fn a_bad_index_writes_nothing_outside_the_output_and_skips_its_element() {
    for b in backends() {
        let name = b.backend_type();
        let c = b.compute();
        let input = upload(c, &[1.0, 2.0, 3.0, 4.0]);
        let ix = b.from_slice(&[3i64, 9, 0, 1], &[4]).unwrap();
        // Output with a guard word after it.
        let out = upload(c, &[-7.0; 5]);
        let desc = GatherDesc {
            dtype: DType::F32,
            index_dtype: DType::I64,
            input: StridedBuf::contiguous(input, &[4]),
            dim: 0,
            index: ix.strided_buf(),
            output: out,
        };
        let now = no_panic!(c.gather(&desc));
        let later = no_panic!(c.synchronize());
        let got = download(c, out, 5);
        match (now, later) {
            // Checked before running: nothing written.
            (
                Err(BackendError::IndexOutOfRange {
                    index: 9, size: 4, ..
                }),
                Ok(()),
            ) => {
                assert_eq!(got, [-7.0; 5], "{name}");
            }
            // Checked on the device: the bad element skipped, the others written, the guard kept.
            (
                Ok(()),
                Err(BackendError::IndexOutOfRange {
                    index: 9, size: 4, ..
                }),
            ) => {
                assert_eq!(got, [4.0, -7.0, 1.0, 2.0, -7.0], "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
        assert_backend_works(&b);
    }
}

#[test]
fn index_dtypes_ranks_lengths_and_dims_are_checked() {
    let other = Backend::reference().unwrap();
    for b in backends() {
        let x = seq(&b, &[3, 4]);
        let good = index(&b, &[0, 1], &[1, 2]);
        let float_index = t(&b, &[0.0, 1.0], &[1, 2]);
        let err = assert_err!(b.gather(&x, 0, &float_index), DTypeMismatch);
        assert_mentions(&err, &["gather", "f32"]);
        let bytes = assert_ok!(good.cast(DType::U8));
        assert_err!(
            b.index_select(&x, 0, &bytes.reshape(&[2]).unwrap()),
            DTypeMismatch
        );
        assert_err!(b.embedding(&x, &float_index), DTypeMismatch);
        // Ranks and lengths.
        assert_err!(b.gather(&x, 0, &index(&b, &[0, 1], &[2])), ShapeMismatch);
        let err = assert_err!(b.gather(&x, 0, &index(&b, &[0; 5], &[1, 5])), ShapeMismatch);
        assert_mentions(&err, &["gather", "dim 1"]);
        assert_err!(b.index_select(&x, 0, &good), ShapeMismatch);
        assert_err!(b.embedding(&seq(&b, &[2, 2, 2]), &good), ShapeMismatch);
        // Dims.
        let err = assert_err!(b.gather(&x, 2, &good), InvalidArgument);
        assert_mentions(&err, &["gather"]);
        assert_err!(b.gather(&x, -3, &good), InvalidArgument);
        assert_err!(
            b.index_select(&x, 5, &index(&b, &[0], &[1])),
            InvalidArgument
        );
        // Another backend's index.
        let foreign = index(&other, &[0, 1], &[1, 2]);
        if !b.same_instance(&other) {
            assert_err!(b.gather(&x, 0, &foreign), DeviceMismatch);
        }
        // Raw descriptors: a float index and a dim past the rank.
        let c = b.compute();
        let desc = GatherDesc {
            dtype: DType::F32,
            index_dtype: DType::F32,
            input: x.strided_buf(),
            dim: 0,
            index: float_index.strided_buf(),
            output: x.data_ptr(),
        };
        assert_err!(c.gather(&desc), DTypeMismatch);
        let desc = GatherDesc {
            index_dtype: DType::I64,
            index: good.strided_buf(),
            dim: 2,
            ..desc
        };
        assert_err!(c.gather(&desc), InvalidArgument);
        assert_backend_works(&b);
    }
}

#[test]
fn scatters_check_indices_dtypes_and_shapes() {
    for b in backends() {
        let name = b.backend_type();
        let x = seq(&b, &[3, 4]);
        let src = seq(&b, &[2, 4]);
        for bad in [-1i64, 3, 1 << 40] {
            let ix = index(&b, &[0, 1, 2, 1, 2, bad, 0, 1], &[2, 4]);
            // One op at a time: on a GPU the flag holds every error since the last read.
            for what in ["scatter", "scatter_add"] {
                let result = if what == "scatter" {
                    b.scatter(&x, 0, &ix, &src)
                } else {
                    b.scatter_add(&x, 0, &ix, &src)
                };
                let err = deferred_error(result);
                assert!(
                    matches!(err, BackendError::IndexOutOfRange { index, size: 3, .. } if index == bad),
                    "{name} {what}: index {bad}: {err:?}"
                );
            }
            assert_ok!(b.synchronize());
        }
        let err =
            deferred_error(b.index_add(&x, 1, &index(&b, &[4], &[1]), &seq(&b, &[3, 1]), 1.0));
        assert!(
            matches!(
                err,
                BackendError::IndexOutOfRange {
                    index: 4,
                    size: 4,
                    ..
                }
            ),
            "{name}: {err:?}"
        );
        // An empty output dim: no index fits, although nothing would be written.
        let empty = assert_ok!(b.zeros(&[2, 0], DType::F32));
        let err =
            deferred_error(b.scatter(&empty, 1, &index(&b, &[0, 0], &[2, 1]), &seq(&b, &[2, 1])));
        assert!(
            matches!(
                err,
                BackendError::IndexOutOfRange {
                    index: 0,
                    size: 0,
                    ..
                }
            ),
            "{name}: {err:?}"
        );
        let err = deferred_error(b.one_hot(&index(&b, &[2, 5], &[2]), 5, DType::F32));
        assert!(
            matches!(
                err,
                BackendError::IndexOutOfRange {
                    index: 5,
                    size: 5,
                    ..
                }
            ),
            "{name}: {err:?}"
        );
        // Dtypes: a float index, a source of another dtype, an addition of integers.
        let good = index(&b, &[0, 1, 2, 0, 1, 2, 0, 1], &[2, 4]);
        assert_err!(b.scatter(&x, 0, &src, &src), DTypeMismatch);
        let src64 = assert_ok!(src.cast(DType::F64));
        assert_err!(b.scatter(&x, 0, &good, &src64), DTypeMismatch);
        let ints = assert_ok!(x.cast(DType::I32));
        let int_src = assert_ok!(src.cast(DType::I32));
        assert_err!(b.scatter_add(&ints, 0, &good, &int_src), Unsupported);
        let moved = assert_ok!(b.scatter(&ints, 0, &good, &int_src));
        assert_eq!(moved.shape(), &[3, 4], "{name}: integers assign");
        // Shapes: a source shorter than the index, an index longer than the output off `dim`,
        // `index_add`'s source and index, a dim out of range.
        assert_err!(b.scatter(&x, 0, &good, &seq(&b, &[2, 3])), ShapeMismatch);
        assert_err!(
            b.scatter(&x, 0, &index(&b, &[0; 10], &[2, 5]), &seq(&b, &[2, 5])),
            ShapeMismatch
        );
        assert_err!(b.index_add(&x, 0, &good, &src, 1.0), ShapeMismatch);
        assert_err!(
            b.index_add(&x, 0, &index(&b, &[0, 1], &[2]), &seq(&b, &[3, 4]), 1.0),
            ShapeMismatch
        );
        assert_err!(
            b.index_add(&x, 0, &index(&b, &[0, 1], &[2]), &src, f64::NAN),
            InvalidArgument
        );
        assert_err!(b.scatter(&x, 2, &good, &src), InvalidArgument);
        assert_err!(b.one_hot(&src, 3, DType::F32), DTypeMismatch);
        assert_backend_works(&b);
    }
}
