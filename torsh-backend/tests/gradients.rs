//! Backward ops against finite differences of their forward ops on the reference backend in f64:
//! the gradients every backend's parity case is then compared with are the calculus's, not only
//! each other's. Central differences with step `h` are accurate to O(h²); the points avoid each
//! op's kinks (`abs` and `relu` at 0).

use torsh_backend::{Backend, DType, Result, UnaryOp};

/// `Σ g · op(x)` differentiated by central differences at each `x`, against `unary_backward`.
#[test]
fn unary_backward_matches_finite_differences() -> Result<()> {
    let b = Backend::reference()?;
    let h = 1e-6;
    let general: Vec<f64> = (0..23).map(|i| -2.9 + 0.26 * i as f64).collect();
    let positive: Vec<f64> = (0..23).map(|i| 0.3 + 0.17 * i as f64).collect();
    let grad: Vec<f64> = (0..23).map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0).collect();
    for &op in UnaryOp::ALL {
        let xs = match op {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => &positive,
            _ => &general,
        };
        let n = xs.len();
        let x = b.from_f64(xs, &[n], DType::F64)?;
        let g = b.from_f64(&grad, &[n], DType::F64)?;
        let got = x.unary_backward_from_input(op, &g)?.to_vec_f64()?;
        let shifted = |d: f64| -> Result<Vec<f64>> {
            let moved: Vec<f64> = xs.iter().map(|v| v + d).collect();
            b.unary(op, &b.from_f64(&moved, &[n], DType::F64)?)?
                .to_vec_f64()
        };
        let (up, down) = (shifted(h)?, shifted(-h)?);
        for k in 0..n {
            let want = grad[k] * (up[k] - down[k]) / (2.0 * h);
            let err = (got[k] - want).abs() / want.abs().max(1.0);
            assert!(
                err < 1e-6,
                "{} at x = {}: got {}, finite differences {want}",
                op.name(),
                xs[k],
                got[k]
            );
        }
    }
    Ok(())
}

/// The backward reads what `UnaryOp::saved` names: from the output for `exp`, `relu`, ..., from
/// the input for the others, and the gradient of `relu` is 0 where its output is not positive.
#[test]
fn unary_backward_reads_the_saved_tensor() -> Result<()> {
    let b = Backend::reference()?;
    let x = b.from_f64(&[-1.0, 0.0, 2.0], &[3], DType::F64)?;
    let g = b.from_f64(&[3.0, 3.0, 3.0], &[3], DType::F64)?;
    let y = x.exp()?;
    let from_y = y.unary_backward(UnaryOp::Exp, &g)?.to_vec_f64()?;
    let want: Vec<f64> = [-1.0f64, 0.0, 2.0].iter().map(|v| 3.0 * v.exp()).collect();
    assert_eq!(from_y, want);
    let relu = x.relu()?.unary_backward(UnaryOp::Relu, &g)?.to_vec_f64()?;
    assert_eq!(relu, [0.0, 0.0, 3.0]);
    let sin = x.unary_backward(UnaryOp::Sin, &g)?.to_vec_f64()?;
    assert_eq!(sin[2], 3.0 * 2f64.cos());
    Ok(())
}
