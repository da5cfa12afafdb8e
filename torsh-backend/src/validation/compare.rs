//! Comparison of an output with the reference: norm-wise relative error, max absolute error, NaN rules.

use std::fmt;

/// How far `out` is from `reference`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// `‖out − ref‖₂ / ‖ref‖₂` over the elements where both are finite and equal-signed infinities
    /// excluded; 0 when equal, and the absolute norm when `‖ref‖ = 0`.
    pub rel_error: f64,
    /// `max |out − ref|`.
    pub max_abs_error: f64,
    /// Index of the element with the largest absolute error.
    pub worst_index: usize,
    /// `(out, ref)` at `worst_index`.
    pub worst: (f64, f64),
    /// Elements where exactly one side is NaN, or infinities differ: these never pass.
    pub mismatched_specials: usize,
    /// Index of the first such element.
    pub first_special: Option<usize>,
}

impl Comparison {
    /// True when there are no special-value mismatches and the relative error is within `bound`
    /// (an exact match for `bound == 0`).
    pub fn within(&self, bound: f64) -> bool {
        self.mismatched_specials == 0 && self.rel_error <= bound
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "relative error {:.3e}, max abs error {:.3e} at element {} (got {}, expected {})",
            self.rel_error, self.max_abs_error, self.worst_index, self.worst.0, self.worst.1
        )?;
        if let Some(i) = self.first_special {
            write!(
                f,
                "; {} NaN/inf mismatches, first at element {i}",
                self.mismatched_specials
            )?;
        }
        Ok(())
    }
}

/// Compares `out` with `reference` (same length; a length mismatch counts every missing element as a
/// special mismatch). NaN passes only where the reference is NaN; infinities only where equal.
pub fn compare(out: &[f64], reference: &[f64]) -> Comparison {
    let mut c = Comparison {
        rel_error: 0.0,
        max_abs_error: 0.0,
        worst_index: 0,
        worst: (0.0, 0.0),
        mismatched_specials: out.len().abs_diff(reference.len()),
        first_special: (out.len() != reference.len()).then_some(out.len().min(reference.len())),
    };
    let (mut diff2, mut ref2) = (0.0f64, 0.0f64);
    for (i, (&o, &r)) in out.iter().zip(reference).enumerate() {
        let special = !o.is_finite() || !r.is_finite();
        if special {
            let same = (o.is_nan() && r.is_nan()) || o == r;
            if !same {
                c.mismatched_specials += 1;
                c.first_special.get_or_insert(i);
            }
            continue;
        }
        let d = (o - r).abs();
        if d > c.max_abs_error {
            c.max_abs_error = d;
            c.worst_index = i;
            c.worst = (o, r);
        }
        diff2 += d * d;
        ref2 += r * r;
    }
    c.rel_error = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    };
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_never_passes_unless_expected() {
        assert!(compare(&[1.0, f64::NAN], &[1.0, f64::NAN]).within(0.0));
        assert!(!compare(&[1.0, f64::NAN], &[1.0, 2.0]).within(1.0));
        assert!(!compare(&[1.0, 2.0], &[1.0, f64::NAN]).within(1.0));
        assert!(!compare(&[f64::INFINITY], &[f64::NEG_INFINITY]).within(1.0));
        assert!(!compare(&[1.0], &[1.0, 2.0]).within(1.0));
        let c = compare(&[1.0, 2.0 + 1e-6], &[1.0, 2.0]);
        assert!(c.within(1e-5) && !c.within(1e-8));
        assert_eq!(c.worst_index, 1);
        assert!(compare(&[0.0, 0.0], &[0.0, 0.0]).within(0.0));
    }
}
