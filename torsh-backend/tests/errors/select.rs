//! Comparison and selection: masks that are not `U8`, shapes that do not broadcast, branches of
//! two dtypes, scalars an integer dtype cannot hold, and operands from another backend.

use torsh_backend::compute::{CompareDesc, CompareOp, StridedBuf, Value, WhereDesc};

use super::*;

#[test]
fn bad_masks_shapes_and_dtypes_are_typed_errors_on_every_backend() {
    let other = Backend::reference().expect("reference");
    for b in backends() {
        let name = b.backend_type();
        let x = seq(&b, &[3, 4]);
        let mask = assert_ok!(x.gt_scalar(0.0));
        assert_eq!(mask.dtype(), DType::U8, "{name}");
        // A float mask, an int mask of the wrong width: DTypeMismatch naming U8.
        let err = assert_err!(b.where_(&x, &x, &x), DTypeMismatch);
        assert_mentions(&err, &["where", "u8"]);
        let ints = assert_ok!(mask.cast(DType::I32));
        assert_err!(x.masked_fill(&ints, 1.0), DTypeMismatch);
        // Branches of two dtypes; comparisons of two dtypes.
        let x64 = assert_ok!(x.cast(DType::F64));
        assert_err!(b.where_(&mask, &x, &x64), DTypeMismatch);
        assert_err!(x.lt(&x64), DTypeMismatch);
        // Shapes that do not broadcast; a mask larger than the filled tensor.
        let row5 = seq(&b, &[5]);
        let err = assert_err!(x.eq(&row5), ShapeMismatch);
        assert_mentions(&err, &["eq"]);
        assert_err!(b.where_(&mask, &x, &row5), ShapeMismatch);
        let wide = assert_ok!(seq(&b, &[2, 3, 4]).gt_scalar(0.0));
        assert_err!(x.masked_fill(&wide, 0.0), ShapeMismatch);
        // A fill value an integer tensor cannot hold.
        let n = assert_ok!(x.cast(DType::I32));
        let err = assert_err!(n.masked_fill(&mask, 0.5), InvalidArgument);
        assert_mentions(&err, &["masked_fill", "0.5"]);
        assert_err!(
            assert_ok!(x.cast(DType::U8)).masked_fill(&mask, 256.0),
            InvalidArgument
        );
        // Operands from another backend.
        let foreign = seq(&other, &[3, 4]);
        assert_err!(x.ge(&foreign), DeviceMismatch);
        let foreign_mask = assert_ok!(foreign.gt_scalar(0.0));
        assert_err!(b.where_(&foreign_mask, &x, &x), DeviceMismatch);
        // Fractional and out-of-range scalars against integers compare exactly, with no error.
        let host = |m: Tensor| assert_ok!(m.to_vec_f64());
        assert_eq!(
            host(assert_ok!(n.lt_scalar(0.5))),
            host(assert_ok!(n.le_scalar(0.0)))
        );
        assert_eq!(host(assert_ok!(n.ge_scalar(1e12))), [0.0; 12]);
        assert_backend_works(&b);
    }
}

#[test]
fn raw_selection_descriptors_reject_bad_numbers() {
    for b in backends() {
        let c = b.compute();
        let x = upload(c, &[1.0; 12]);
        let out = c.alloc(48).expect("alloc");
        let view = StridedBuf::contiguous(x, &[3, 4]);
        // rhs of another shape; a scalar an integer dtype cannot hold; a cond that is not U8.
        let cmp = CompareDesc {
            op: CompareOp::Lt,
            dtype: DType::F32,
            lhs: view.clone(),
            rhs: Value::Tensor(StridedBuf::contiguous(x, &[4, 3])),
            output: out,
        };
        assert_err!(c.compare(&cmp), ShapeMismatch);
        let cmp = CompareDesc {
            dtype: DType::I32,
            rhs: Value::Scalar(1.5),
            ..cmp
        };
        assert_err!(c.compare(&cmp), InvalidArgument);
        let sel = WhereDesc {
            dtype: DType::F32,
            cond_dtype: DType::F32,
            cond: view.clone(),
            on_true: Value::Scalar(0.0),
            on_false: Value::Tensor(view.clone()),
            output: out,
        };
        assert_err!(c.where_(&sel), DTypeMismatch);
        // An output overlapping an input, and an output past its allocation.
        let sel = WhereDesc {
            cond_dtype: DType::U8,
            output: x,
            ..sel
        };
        assert_err!(c.where_(&sel), Aliasing);
        let sel = WhereDesc {
            output: off(out, 40),
            ..sel
        };
        assert_err!(c.where_(&sel), InvalidPointer | OutOfBounds);
        c.free(x).expect("free");
        c.free(out).expect("free");
    }
}
