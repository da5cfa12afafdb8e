//! Running states of the CPU reductions, merged across blocks and threads in element order.

use super::*;

/// A reduction's partial result over consecutive elements, merged in element order.
pub(in crate::backends::cpu) trait State<A: Real>:
    Copy + Default + Send + Sync
{
    /// Per-column accumulators that produce this state for a block of rows.
    type Cols: Cols<A, Self>;
    /// The result over `xs` (1 ≤ length ≤ [`BLOCK`]), whose first element is element `start` of
    /// its lane.
    fn of_block(xs: &[A], start: usize) -> Self;
    /// The result over these elements followed by `later`'s.
    fn merge(self, later: Self) -> Self;
    /// The value `op` reports for a lane of `len` elements with this state (an index as f64 for
    /// the index reductions).
    fn finish(self, op: ReduceOp, len: usize) -> f64;
}

/// Per-column accumulators over a block of at most [`ROWS`] rows of at most `width` columns.
pub(in crate::backends::cpu) trait Cols<A: Real, S> {
    /// No rows yet, room for `width` columns.
    fn new(width: usize) -> Self;
    /// Adds the next row (the same width every time until the next take).
    fn push(&mut self, row: &[A]);
    /// Adds the next four rows, in order, each as [`Cols::push`] takes it. A state may combine
    /// them first (sums add `(r₀ + r₁) + (r₂ + r₃)` to the running sum): the result then depends on
    /// where groups start, which the schedulers fix by row position, never by thread count.
    #[inline(always)]
    fn push4(&mut self, rows: [&[A]; 4]) {
        for row in rows {
            self.push(row);
        }
    }
    /// Puts each column's state over the rows pushed since the last take (numbered from `start`)
    /// into `into` (one per column, as many as pushed): set when `fresh`, else merged after what is
    /// there. Starts over.
    fn take(&mut self, start: usize, into: &mut [S], fresh: bool);
}

/// A sum in f64 with Neumaier's running compensation.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::backends::cpu) struct Sum {
    /// The running sum.
    s: f64,
    /// The rounding errors lost from `s`.
    c: f64,
}

impl Sum {
    /// A sum of one value.
    #[inline(always)]
    fn of(v: f64) -> Sum {
        Sum { s: v, c: 0.0 }
    }

    /// The sum with `v` added.
    #[inline(always)]
    fn add(self, v: f64) -> Sum {
        let s = self.s + v;
        let lost = if self.s.abs() >= v.abs() {
            (self.s - s) + v
        } else {
            (v - s) + self.s
        };
        Sum {
            s,
            c: self.c + lost,
        }
    }

    /// The compensated total (the plain sum once it is infinite or NaN).
    #[inline(always)]
    pub(in crate::backends::cpu) fn total(self) -> f64 {
        if self.s.is_finite() {
            self.s + self.c
        } else {
            self.s
        }
    }
}

impl<A: Real> State<A> for Sum {
    type Cols = SumCols<A>;

    #[inline(always)]
    fn of_block(xs: &[A], _start: usize) -> Sum {
        Sum::of(sum_block(xs).to_f64())
    }

    #[inline(always)]
    fn merge(self, later: Sum) -> Sum {
        let t = self.add(later.s);
        Sum {
            s: t.s,
            c: t.c + later.c,
        }
    }

    fn finish(self, op: ReduceOp, len: usize) -> f64 {
        match op {
            ReduceOp::Mean => self.total() / len as f64,
            _ => self.total(),
        }
    }
}

/// Column sums of a block of rows.
pub(in crate::backends::cpu) struct SumCols<A> {
    /// Running sum per column.
    acc: Vec<A>,
}

impl<A: Real> Cols<A, Sum> for SumCols<A> {
    #[inline(always)]
    fn new(width: usize) -> Self {
        SumCols {
            acc: vec![A::ZERO; width],
        }
    }

    #[inline(always)]
    fn push(&mut self, row: &[A]) {
        for (a, &x) in self.acc.iter_mut().zip(row) {
            *a += x;
        }
    }

    #[inline(always)]
    fn push4(&mut self, [r0, r1, r2, r3]: [&[A]; 4]) {
        let n = r0.len();
        let acc = &mut self.acc[..n];
        let (r1, r2, r3) = (&r1[..n], &r2[..n], &r3[..n]);
        for i in 0..n {
            acc[i] += (r0[i] + r1[i]) + (r2[i] + r3[i]);
        }
    }

    #[inline(always)]
    fn take(&mut self, _start: usize, into: &mut [Sum], fresh: bool) {
        for (s, a) in into.iter_mut().zip(self.acc.iter_mut()) {
            let b = Sum::of(a.to_f64());
            *s = if fresh { b } else { State::<A>::merge(*s, b) };
            *a = A::ZERO;
        }
    }
}

/// Count, mean and sum of squared deviations from the mean.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::backends::cpu) struct Moments {
    /// Elements.
    pub(in crate::backends::cpu) n: f64,
    /// Their mean.
    pub(in crate::backends::cpu) mean: f64,
    /// `Σ (x - mean)²`.
    pub(in crate::backends::cpu) m2: f64,
}

impl Moments {
    /// The biased variance `m2 / n`.
    pub(in crate::backends::cpu) fn variance(self) -> f64 {
        self.m2 / self.n
    }
}

impl<A: Real> State<A> for Moments {
    type Cols = MomentCols<A>;

    /// Two passes over the block (it is in L1), shifted by its first element so that a large common
    /// offset costs no accuracy.
    #[inline(always)]
    fn of_block(xs: &[A], _start: usize) -> Moments {
        let n = xs.len();
        let shift = pivot(xs[0]);
        let mean = shifted_sum_block(xs, shift) / A::from_f64(n as f64);
        let m2 = squares_block(xs, shift, mean);
        Moments {
            n: n as f64,
            mean: shift.to_f64() + mean.to_f64(),
            m2: m2.to_f64(),
        }
    }

    /// Chan et al.'s pairwise update.
    #[inline(always)]
    fn merge(self, later: Moments) -> Moments {
        if self.n == 0.0 {
            return later;
        }
        let n = self.n + later.n;
        let delta = later.mean - self.mean;
        Moments {
            n,
            mean: self.mean + delta * (later.n / n),
            m2: self.m2 + later.m2 + delta * delta * (self.n * later.n / n),
        }
    }

    fn finish(self, op: ReduceOp, _len: usize) -> f64 {
        let correction = match op {
            ReduceOp::Var { correction } => correction as f64,
            _ => 0.0,
        };
        self.m2 / (self.n - correction).max(0.0)
    }
}

/// Column moments of a block of rows: Welford's update (all columns share the count), shifted by
/// the block's first row.
pub(in crate::backends::cpu) struct MomentCols<A> {
    /// Rows pushed.
    k: usize,
    /// Per-column shift (the first row, where finite).
    shift: Vec<A>,
    /// Per-column mean of `x - shift`.
    mean: Vec<A>,
    /// Per-column sum of squared deviations.
    m2: Vec<A>,
}

impl<A: Real> Cols<A, Moments> for MomentCols<A> {
    #[inline(always)]
    fn new(width: usize) -> Self {
        MomentCols {
            k: 0,
            shift: vec![A::ZERO; width],
            mean: vec![A::ZERO; width],
            m2: vec![A::ZERO; width],
        }
    }

    #[inline(always)]
    fn push(&mut self, row: &[A]) {
        if self.k == 0 {
            for (s, &x) in self.shift.iter_mut().zip(row) {
                *s = pivot(x);
            }
        }
        self.k += 1;
        let inv = A::ONE / A::from_f64(self.k as f64);
        let cols = self
            .mean
            .iter_mut()
            .zip(self.m2.iter_mut())
            .zip(self.shift.iter());
        for (((m, q), &s), &x) in cols.zip(row) {
            let y = x - s;
            let d = y - *m;
            *m += d * inv;
            *q += d * (y - *m);
        }
    }

    #[inline(always)]
    fn take(&mut self, _start: usize, into: &mut [Moments], fresh: bool) {
        let n = self.k as f64;
        let cols = self
            .mean
            .iter_mut()
            .zip(self.m2.iter_mut())
            .zip(self.shift.iter());
        for (s, ((m, q), &shift)) in into.iter_mut().zip(cols) {
            let b = Moments {
                n,
                mean: shift.to_f64() + m.to_f64(),
                m2: q.to_f64(),
            };
            *s = if fresh { b } else { State::<A>::merge(*s, b) };
            *m = A::ZERO;
            *q = A::ZERO;
        }
        self.k = 0;
    }
}

/// The maximum (`MAX`) or minimum so far; NaN once any element was NaN.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::backends::cpu) struct Extreme<A, const MAX: bool> {
    /// The value.
    v: A,
}

impl<A: Real, const MAX: bool> State<A> for Extreme<A, MAX> {
    type Cols = ExtremeCols<A, MAX>;

    #[inline(always)]
    fn of_block(xs: &[A], _start: usize) -> Self {
        Extreme {
            v: extreme_block::<A, MAX>(xs),
        }
    }

    #[inline(always)]
    fn merge(self, later: Self) -> Self {
        Extreme {
            v: if self.v.is_nan() {
                self.v
            } else {
                pick::<A, MAX>(self.v, later.v)
            },
        }
    }

    fn finish(self, _op: ReduceOp, _len: usize) -> f64 {
        self.v.to_f64()
    }
}

/// Column maxima (or minima) of a block of rows.
pub(in crate::backends::cpu) struct ExtremeCols<A, const MAX: bool> {
    /// Rows pushed.
    rows: usize,
    /// Per-column extreme.
    m: Vec<A>,
}

impl<A: Real, const MAX: bool> Cols<A, Extreme<A, MAX>> for ExtremeCols<A, MAX> {
    #[inline(always)]
    fn new(width: usize) -> Self {
        ExtremeCols {
            rows: 0,
            m: vec![A::ZERO; width],
        }
    }

    #[inline(always)]
    fn push(&mut self, row: &[A]) {
        if self.rows == 0 {
            self.m[..row.len()].copy_from_slice(row);
        } else {
            for (m, &x) in self.m.iter_mut().zip(row) {
                *m = pick::<A, MAX>(*m, x);
            }
        }
        self.rows += 1;
    }

    /// The same result as four pushes: [`pick`] keeps the earlier of equal values and the later of
    /// two NaNs, which a pairwise fold does as well as a running one.
    #[inline(always)]
    fn push4(&mut self, [r0, r1, r2, r3]: [&[A]; 4]) {
        if self.rows == 0 {
            self.push(r0);
            self.push(r1);
            self.push(r2);
            self.push(r3);
            return;
        }
        let n = r0.len();
        let m = &mut self.m[..n];
        let (r1, r2, r3) = (&r1[..n], &r2[..n], &r3[..n]);
        for i in 0..n {
            let pair = pick::<A, MAX>(pick::<A, MAX>(r0[i], r1[i]), pick::<A, MAX>(r2[i], r3[i]));
            m[i] = pick::<A, MAX>(m[i], pair);
        }
        self.rows += 4;
    }

    #[inline(always)]
    fn take(&mut self, _start: usize, into: &mut [Extreme<A, MAX>], fresh: bool) {
        for (s, &m) in into.iter_mut().zip(self.m.iter()) {
            let b = Extreme { v: m };
            *s = if fresh { b } else { s.merge(b) };
        }
        self.rows = 0;
    }
}

/// The first maximum (`MAX`) or minimum so far and its index; the first NaN once there is one.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::backends::cpu) struct Arg<A, const MAX: bool> {
    /// The value.
    v: A,
    /// Its index in the lane.
    i: usize,
}

impl<A: Real, const MAX: bool> State<A> for Arg<A, MAX> {
    type Cols = ArgCols<A, MAX>;

    #[inline(always)]
    fn of_block(xs: &[A], start: usize) -> Self {
        if xs.len() < LANES {
            // Short runs: the reference's own scan, in one pass.
            let mut best: Self = Arg { v: xs[0], i: 0 };
            for (i, &x) in xs.iter().enumerate().skip(1) {
                if best.v.is_nan() {
                    break;
                }
                if x.is_nan() || better::<A, MAX>(x, best.v) {
                    best = Arg { v: x, i };
                }
            }
            return Arg {
                v: best.v,
                i: start + best.i,
            };
        }
        let v = extreme_block::<A, MAX>(xs);
        Arg {
            v,
            i: start + first_match(xs, v),
        }
    }

    #[inline(always)]
    fn merge(self, later: Self) -> Self {
        if self.v.is_nan() {
            self
        } else if later.v.is_nan() || better::<A, MAX>(later.v, self.v) {
            later
        } else {
            self
        }
    }

    fn finish(self, _op: ReduceOp, _len: usize) -> f64 {
        self.i as f64
    }
}

/// Column arg-maxima (or minima) of a block of rows.
pub(in crate::backends::cpu) struct ArgCols<A, const MAX: bool> {
    /// Rows pushed.
    rows: u32,
    /// Per-column extreme.
    m: Vec<A>,
    /// Per-column row of the extreme, within the block.
    r: Vec<u32>,
}

impl<A: Real, const MAX: bool> Cols<A, Arg<A, MAX>> for ArgCols<A, MAX> {
    #[inline(always)]
    fn new(width: usize) -> Self {
        ArgCols {
            rows: 0,
            m: vec![A::ZERO; width],
            r: vec![0; width],
        }
    }

    #[inline(always)]
    fn push(&mut self, row: &[A]) {
        if self.rows == 0 {
            self.m[..row.len()].copy_from_slice(row);
            self.r[..row.len()].fill(0);
        } else {
            let k = self.rows;
            for ((m, r), &x) in self.m.iter_mut().zip(self.r.iter_mut()).zip(row) {
                let take = !m.is_nan() & (better::<A, MAX>(x, *m) | x.is_nan());
                *m = if take { x } else { *m };
                *r = if take { k } else { *r };
            }
        }
        self.rows += 1;
    }

    #[inline(always)]
    fn take(&mut self, start: usize, into: &mut [Arg<A, MAX>], fresh: bool) {
        for (s, (&m, &r)) in into.iter_mut().zip(self.m.iter().zip(self.r.iter())) {
            let b = Arg {
                v: m,
                i: start + r as usize,
            };
            *s = if fresh { b } else { s.merge(b) };
        }
        self.rows = 0;
    }
}
