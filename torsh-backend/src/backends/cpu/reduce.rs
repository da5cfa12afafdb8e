//! Reductions along one axis on the CPU.
//!
//! A reduction is planned from the input view's strides. When the axis has stride 1, every output
//! element reduces one contiguous run (a *lane*), vectorised along the run with many accumulators.
//! When the dims after the axis form one contiguous run, each output row is reduced *column-style*,
//! vectorised across the columns. Any other view is first gathered into a dense widened copy.
//!
//! Every result is a fold, in element order, of partial results over pieces of fixed size
//! ([`BLOCK`] elements, [`LANE_CHUNK`] elements, [`ROWS`] rows), so it does not depend on how many
//! threads computed the pieces. Sums add each block in the compute type with many accumulators and
//! add block sums in f64 with Neumaier's compensation; variances merge per-block moments (two passes
//! over a block in L1, shifted by a pivot) or per-column moments (Welford) with Chan's formula;
//! max, min and the index reductions let the first NaN win, as the reference does.
//!
//! The states, sources and schedulers here are shared with the norm kernels.

use std::any::TypeId;
use std::ops::Range;

use rayon::prelude::*;

use super::host::{
    for_chunks, widen_into, with_float, with_simd, Ctx, Element, Real, Span, View, BLOCK,
    SERIAL_ELEMENTS,
};
use crate::backends::reference::{memory::HostMemory, reduce as reference};
use crate::compute::{ReduceDesc, ReduceOp};
use crate::error::{BackendError, Result};

/// The op name in errors.
const OP: &str = "reduce";

/// Elements of a lane whose partial result is computed as one piece. A lane's result is the ordered
/// fold of its chunks' results, so it is the same whether the chunks ran on one thread or several.
pub(super) const LANE_CHUNK: usize = 1 << 16;

/// Columns a column-style task reduces at once: wide, so that rows are read as long sequential runs
/// (narrow tiles of long-strided rows cost a TLB miss per row).
const TILE: usize = 2048;

/// Rows accumulated per column in the compute type before they are merged into the column's result.
const ROWS: usize = 128;

/// Accumulators of the lane kernels: several vector registers' worth, to hide add latency.
const LANES: usize = 64;

/// States emitted per batch by a lane task.
const EMIT_BATCH: usize = 1024;

// ---------------------------------------------------------------------------------------------
// Typed access.

/// `xs` as its compute type, without copying, when the element type is its own compute type (f32,
/// f64); `None` for f16 and bf16.
#[inline(always)]
pub(super) fn as_acc<T: Element>(xs: &[T]) -> Option<&[T::Acc]> {
    if TypeId::of::<T>() == TypeId::of::<T::Acc>() {
        // SAFETY: `T` and `T::Acc` are the same type, so this is the same slice.
        Some(unsafe { std::slice::from_raw_parts(xs.as_ptr().cast(), xs.len()) })
    } else {
        None
    }
}

/// `xs` as its compute type, mutably, when the element type is its own compute type.
#[inline(always)]
pub(super) fn as_acc_mut<T: Element>(xs: &mut [T]) -> Option<&mut [T::Acc]> {
    if TypeId::of::<T>() == TypeId::of::<T::Acc>() {
        // SAFETY: `T` and `T::Acc` are the same type, so this is the same slice, still borrowed once.
        Some(unsafe { std::slice::from_raw_parts_mut(xs.as_mut_ptr().cast(), xs.len()) })
    } else {
        None
    }
}

/// `xs` in its compute type: itself when no conversion is needed, else widened into `buf`.
#[inline(always)]
pub(super) fn acc_of<'a, T: Element>(xs: &'a [T], buf: &'a mut Vec<T::Acc>) -> &'a [T::Acc] {
    match as_acc(xs) {
        Some(a) => a,
        None => {
            buf.clear();
            buf.resize(xs.len(), <T::Acc as Real>::ZERO);
            widen_into(xs, buf);
            buf
        }
    }
}

/// Elements that kernels read as the compute type `A`, a run at a time.
pub(super) trait Source<A>: Sync {
    /// Elements `start .. start + len` as `A`: in place when no conversion is needed, else widened
    /// into `scratch` (at least `len` long).
    ///
    /// # Safety
    /// The range is inside the source and no task writes it while the slice lives.
    unsafe fn load<'a>(&'a self, start: usize, len: usize, scratch: &'a mut [A]) -> &'a [A];
}

impl<T: Element> Source<T::Acc> for Span<T> {
    #[inline(always)]
    unsafe fn load<'a>(
        &'a self,
        start: usize,
        len: usize,
        scratch: &'a mut [T::Acc],
    ) -> &'a [T::Acc] {
        let xs = self.slice(start..start + len);
        match as_acc(xs) {
            Some(a) => a,
            None => {
                let out = &mut scratch[..len];
                widen_into(xs, out);
                out
            }
        }
    }
}

/// Values already in the compute type (the gathered copy of a strided view).
pub(super) struct Dense<'a, A>(pub(super) &'a [A]);

impl<A: Real> Source<A> for Dense<'_, A> {
    #[inline(always)]
    unsafe fn load<'a>(&'a self, start: usize, len: usize, _scratch: &'a mut [A]) -> &'a [A] {
        &self.0[start..start + len]
    }
}

// ---------------------------------------------------------------------------------------------
// Block kernels.

/// Folds `xs` into [`LANES`] independent accumulators, all starting at `init`, with `f(acc, x)`;
/// returns them and the fewer than [`LANES`] elements left over.
#[inline(always)]
fn fold_lanes<A: Real>(xs: &[A], init: A, f: impl Fn(A, A) -> A) -> ([A; LANES], &[A]) {
    let (chunks, rest) = xs.as_chunks::<LANES>();
    let mut acc = [init; LANES];
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c.iter()) {
            *a = f(*a, x);
        }
    }
    (acc, rest)
}

/// Sum of `xs` with [`LANES`] accumulators, added pairwise at the end.
#[inline(always)]
fn sum_block<A: Real>(xs: &[A]) -> A {
    if xs.len() < LANES {
        return xs.iter().fold(A::ZERO, |s, &x| s + x);
    }
    let (acc, rest) = fold_lanes(
        xs,
        A::ZERO,
        #[inline(always)]
        |a, x| a + x,
    );
    tree(acc) + rest.iter().fold(A::ZERO, |s, &x| s + x)
}

/// Sum of `(x - shift)` over `xs` with [`LANES`] accumulators.
#[inline(always)]
fn shifted_sum_block<A: Real>(xs: &[A], shift: A) -> A {
    if xs.len() < LANES {
        return xs.iter().fold(A::ZERO, |s, &x| s + (x - shift));
    }
    let (acc, rest) = fold_lanes(
        xs,
        A::ZERO,
        #[inline(always)]
        |a, x| a + (x - shift),
    );
    tree(acc) + rest.iter().fold(A::ZERO, |s, &x| s + (x - shift))
}

/// Sum of `((x - shift) - mean)²` over `xs` with [`LANES`] accumulators.
#[inline(always)]
fn squares_block<A: Real>(xs: &[A], shift: A, mean: A) -> A {
    let sq = |a: A, x: A| {
        let d = (x - shift) - mean;
        a + d * d
    };
    if xs.len() < LANES {
        return xs.iter().fold(A::ZERO, |s, &x| sq(s, x));
    }
    let (acc, rest) = fold_lanes(xs, A::ZERO, sq);
    tree(acc) + rest.iter().fold(A::ZERO, |s, &x| sq(s, x))
}

/// The sum of the accumulators, pairwise.
#[inline(always)]
fn tree<A: Real>(mut acc: [A; LANES]) -> A {
    let mut width = LANES / 2;
    while width > 0 {
        let (lo, hi) = acc.split_at_mut(width);
        for (a, &b) in lo.iter_mut().zip(hi.iter()) {
            *a += b;
        }
        width /= 2;
    }
    acc[0]
}

/// `x` when it is finite, else 0: a pivot that cannot turn finite data into NaN.
#[inline(always)]
fn pivot<A: Real>(x: A) -> A {
    if x.to_f64().is_finite() {
        x
    } else {
        A::ZERO
    }
}

/// True when `x` beats `m` for a maximum (`MAX`) or a minimum.
#[inline(always)]
fn better<A: Real, const MAX: bool>(x: A, m: A) -> bool {
    if MAX {
        x > m
    } else {
        x < m
    }
}

/// `x` when it beats `m` or is NaN, else `m`: once NaN, the result stays NaN.
#[inline(always)]
fn pick<A: Real, const MAX: bool>(m: A, x: A) -> A {
    if better::<A, MAX>(x, m) | x.is_nan() {
        x
    } else {
        m
    }
}

/// The maximum (or minimum) of `xs` (not empty), NaN when any element is NaN.
///
/// The hot loop ignores NaN (a plain compare-and-select, which compiles to `vmaxps`/`vminps` with
/// the accumulators in registers) and keeps a second set of lanes summing `x · 0`, which turns NaN
/// when any element is NaN or infinite; only then is the block scanned again with the NaN-aware
/// [`pick`]. (Folding with `pick` directly made LLVM keep the accumulators in memory behind masked
/// stores, which cannot forward to the next load: about half the speed of a sum.)
#[inline(always)]
fn extreme_block<A: Real, const MAX: bool>(xs: &[A]) -> A {
    let first = xs[0];
    let exact = |xs: &[A]| xs.iter().fold(first, |m, &x| pick::<A, MAX>(m, x));
    if xs.len() < LANES {
        return exact(xs);
    }
    let (chunks, rest) = xs.as_chunks::<LANES>();
    let mut acc = [first; LANES];
    let mut poison = [A::ZERO; LANES];
    for c in chunks {
        for ((m, p), &x) in acc.iter_mut().zip(poison.iter_mut()).zip(c.iter()) {
            *m = if better::<A, MAX>(x, *m) { x } else { *m };
            *p += x * A::ZERO;
        }
    }
    if poison.iter().any(|p| p.is_nan()) {
        return exact(xs);
    }
    let m = acc.iter().fold(first, |m, &x| pick::<A, MAX>(m, x));
    rest.iter().fold(m, |m, &x| pick::<A, MAX>(m, x))
}

/// Index of the first element of `xs` equal to `v` (the first NaN when `v` is NaN); `xs.len()` when
/// none is.
#[inline(always)]
fn first_match<A: Real>(xs: &[A], v: A) -> usize {
    const STEP: usize = 16;
    let nan = v.is_nan();
    let hit = |x: A| if nan { x.is_nan() } else { x == v };
    for (k, c) in xs.chunks(STEP).enumerate() {
        if c.iter().fold(false, |f, &x| f | hit(x)) {
            let at = c.iter().position(|&x| hit(x)).unwrap_or(0);
            return k * STEP + at;
        }
    }
    xs.len()
}

// ---------------------------------------------------------------------------------------------
// States.

/// A reduction's partial result over consecutive elements, merged in element order.
pub(super) trait State<A: Real>: Copy + Default + Send + Sync {
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
pub(super) trait Cols<A: Real, S> {
    /// No rows yet, room for `width` columns.
    fn new(width: usize) -> Self;
    /// Adds the next row (the same width every time until the next take).
    fn push(&mut self, row: &[A]);
    /// Puts each column's state over the rows pushed since the last take (numbered from `start`)
    /// into `into` (one per column, as many as pushed): set when `fresh`, else merged after what is
    /// there. Starts over.
    fn take(&mut self, start: usize, into: &mut [S], fresh: bool);
}

/// A sum in f64 with Neumaier's running compensation.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Sum {
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
    pub(super) fn total(self) -> f64 {
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
pub(super) struct SumCols<A> {
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
pub(super) struct Moments {
    /// Elements.
    pub(super) n: f64,
    /// Their mean.
    pub(super) mean: f64,
    /// `Σ (x - mean)²`.
    pub(super) m2: f64,
}

impl Moments {
    /// The biased variance `m2 / n`.
    pub(super) fn variance(self) -> f64 {
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
pub(super) struct MomentCols<A> {
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
pub(super) struct Extreme<A, const MAX: bool> {
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
pub(super) struct ExtremeCols<A, const MAX: bool> {
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
pub(super) struct Arg<A, const MAX: bool> {
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
pub(super) struct ArgCols<A, const MAX: bool> {
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

// ---------------------------------------------------------------------------------------------
// Drivers.

/// The fold of `parts` in order (the default state for none).
fn fold<A: Real, S: State<A>>(parts: Vec<S>) -> S {
    parts
        .into_iter()
        .reduce(|a, b| State::<A>::merge(a, b))
        .unwrap_or_default()
}

/// The state of elements `range` of the lane that starts at `base` in `src`, folded block by block.
/// `scratch` holds [`BLOCK`] elements.
#[inline(always)]
fn chunk_state<A: Real, S: State<A>, Src: Source<A>>(
    src: &Src,
    base: usize,
    range: Range<usize>,
    scratch: &mut [A],
) -> S {
    let mut state: Option<S> = None;
    let mut start = range.start;
    while start < range.end {
        let len = (range.end - start).min(BLOCK);
        // SAFETY: the caller's lane lies inside `src`, and no task writes an input.
        let xs = unsafe { src.load(base + start, len, scratch) };
        let b = S::of_block(xs, start);
        state = Some(match state {
            Some(s) => s.merge(b),
            None => b,
        });
        start += len;
    }
    state.unwrap_or_default()
}

/// The state of the `len`-element lane that starts at `base` in `src`: the fold of its
/// [`LANE_CHUNK`]s. `scratch` holds [`BLOCK`] elements.
#[inline(always)]
pub(super) fn lane_state<A: Real, S: State<A>, Src: Source<A>>(
    src: &Src,
    base: usize,
    len: usize,
    scratch: &mut [A],
) -> S {
    if len <= BLOCK {
        // SAFETY: the caller's lane lies inside `src`, and no task writes an input.
        return S::of_block(unsafe { src.load(base, len, scratch) }, 0);
    }
    let mut state = chunk_state::<A, S, Src>(src, base, 0..len.min(LANE_CHUNK), scratch);
    let mut start = LANE_CHUNK;
    while start < len {
        let end = (start + LANE_CHUNK).min(len);
        state = state.merge(chunk_state(src, base, start..end, scratch));
        start = end;
    }
    state
}

/// Per-column states of rows `rows` of the matrix whose row `r` is the `into.len()` elements from
/// `base + r * stride` in `src`, into `into`: folded over blocks of [`ROWS`] rows. `cols` (fresh
/// or taken) and `scratch` have room for the width.
#[inline(always)]
fn tile_state<A: Real, S: State<A>, Src: Source<A>>(
    src: &Src,
    (base, stride): (usize, usize),
    rows: Range<usize>,
    into: &mut [S],
    cols: &mut S::Cols,
    scratch: &mut [A],
) {
    let width = into.len();
    let mut start = rows.start;
    let mut fresh = true;
    while start < rows.end {
        let end = (start + ROWS).min(rows.end);
        for r in start..end {
            // SAFETY: the caller's matrix lies inside `src`, and no task writes an input.
            let row = unsafe { src.load(base + r * stride, width, scratch) };
            cols.push(row);
        }
        cols.take(start, into, fresh);
        fresh = false;
        start = end;
    }
}

/// Merges the per-column states `later` after `acc`.
fn merge_into<A: Real, S: State<A>>(acc: &mut [S], later: &[S]) {
    for (a, &b) in acc.iter_mut().zip(later) {
        *a = a.merge(b);
    }
}

/// An index space walked in row-major order, with an element stride per dim.
#[derive(Clone, Debug)]
pub(super) struct Grid {
    /// Dim sizes.
    dims: Vec<usize>,
    /// Element stride of each dim.
    strides: Vec<usize>,
}

impl Grid {
    /// The grid of `dims` with `strides`.
    pub(super) fn new(dims: Vec<usize>, strides: Vec<usize>) -> Grid {
        Grid { dims, strides }
    }

    /// Number of points.
    pub(super) fn count(&self) -> usize {
        self.dims.iter().product()
    }

    /// True when point `j` is at offset `j * step` (a dense row-major run of `step`-element items).
    fn is_dense(&self, step: usize) -> bool {
        let mut expected = step;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// Offset of point `j`.
    fn offset(&self, mut j: usize) -> usize {
        let mut off = 0;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            off += (j % d) * s;
            j /= d;
        }
        off
    }

    /// Calls `f` with the offset of each point in `range`, in order.
    #[inline(always)]
    fn walk(&self, range: Range<usize>, mut f: impl FnMut(usize)) {
        let rank = self.dims.len();
        let mut idx = vec![0usize; rank];
        let mut rem = range.start;
        for d in (0..rank).rev() {
            idx[d] = rem % self.dims[d];
            rem /= self.dims[d];
        }
        let mut off = self.offset(range.start);
        for _ in range {
            f(off);
            for d in (0..rank).rev() {
                idx[d] += 1;
                off += self.strides[d];
                if idx[d] < self.dims[d] {
                    break;
                }
                off -= self.dims[d] * self.strides[d];
                idx[d] = 0;
            }
        }
    }
}

/// Reduces each lane of `len` elements (lane `j` starts at offset `grid`'s point `j` in `src`) and
/// hands the states to `emit(first lane, states)`, each lane once. Lanes are split across threads;
/// few long lanes have their chunks split across threads instead.
pub(super) fn lanes<A: Real, S: State<A>, Src: Source<A>>(
    src: &Src,
    grid: &Grid,
    len: usize,
    ctx: Ctx,
    emit: &(impl Fn(usize, &[S]) + Sync),
) {
    let count = grid.count();
    let chunks = len.div_ceil(LANE_CHUNK);
    if ctx.threads > 1 && chunks > 1 && count < 2 * ctx.threads {
        for j in 0..count {
            let base = grid.offset(j);
            let parts: Vec<S> = (0..chunks)
                .into_par_iter()
                .map(|k| {
                    let range = k * LANE_CHUNK..((k + 1) * LANE_CHUNK).min(len);
                    with_simd(
                        ctx.simd,
                        #[inline(always)]
                        || {
                            let mut scratch = [A::ZERO; BLOCK];
                            chunk_state::<A, S, Src>(src, base, range, &mut scratch)
                        },
                    )
                })
                .collect();
            emit(j, &[fold::<A, S>(parts)]);
        }
        return;
    }
    let min_lanes = (SERIAL_ELEMENTS / len.max(1)).max(1);
    if len < LANES && grid.is_dense(len) {
        short_lanes(src, count, len, ctx, min_lanes, emit);
        return;
    }
    for_chunks(count, ctx.threads, min_lanes, |r| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut scratch = vec![A::ZERO; BLOCK];
                let mut batch = Vec::with_capacity(EMIT_BATCH.min(r.len()));
                let mut first = r.start;
                grid.walk(
                    r,
                    #[inline(always)]
                    |base| {
                        batch.push(lane_state::<A, S, Src>(src, base, len, &mut scratch));
                        if batch.len() == EMIT_BATCH {
                            emit(first, &batch);
                            first += batch.len();
                            batch.clear();
                        }
                    },
                );
                if !batch.is_empty() {
                    emit(first, &batch);
                }
            },
        )
    });
}

/// [`lanes`] for lanes shorter than [`LANES`] that lie back to back: loaded a block of lanes at a
/// time.
fn short_lanes<A: Real, S: State<A>, Src: Source<A>>(
    src: &Src,
    count: usize,
    len: usize,
    ctx: Ctx,
    min_lanes: usize,
    emit: &(impl Fn(usize, &[S]) + Sync),
) {
    let group = (BLOCK / len).max(1);
    for_chunks(count, ctx.threads, min_lanes, |r| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut scratch = vec![A::ZERO; group * len];
                let mut batch = Vec::with_capacity(group);
                let mut j = r.start;
                while j < r.end {
                    let n = (r.end - j).min(group);
                    // SAFETY: lanes `r` lie inside `src`, and no task writes an input.
                    let xs = unsafe { src.load(j * len, n * len, &mut scratch) };
                    batch.clear();
                    for lane in xs.chunks_exact(len) {
                        batch.push(S::of_block(lane, 0));
                    }
                    emit(j, &batch);
                    j += n;
                }
            },
        )
    });
}

/// A `rows × width` matrix at each point of a grid: row `r`, column `c` of the matrix at point `o`
/// is element `outer.offset(o) + r * stride + c` of the source, and its result goes to output
/// element `out.offset(o) + c * out_step`.
#[derive(Clone, Debug)]
pub(super) struct Matrices {
    /// Where each matrix starts in the source.
    pub(super) outer: Grid,
    /// Where each matrix's first column goes in the output (same dims as `outer`).
    pub(super) out: Grid,
    /// Rows (the reduced dim).
    pub(super) rows: usize,
    /// Elements between rows.
    pub(super) stride: usize,
    /// Columns (contiguous in the source).
    pub(super) width: usize,
    /// Output elements between columns.
    pub(super) out_step: usize,
}

impl Matrices {
    /// Matrices whose results are laid out densely: matrix `o`'s columns at `o * width ..`.
    pub(super) fn dense(outer: Grid, rows: usize, stride: usize, width: usize) -> Matrices {
        let mut out_strides = vec![0; outer.dims.len()];
        let mut step = width;
        for (s, &d) in out_strides.iter_mut().zip(&outer.dims).rev() {
            *s = step;
            step *= d;
        }
        Matrices {
            out: Grid::new(outer.dims.clone(), out_strides),
            outer,
            rows,
            stride,
            width,
            out_step: 1,
        }
    }
}

/// Reduces every column of every matrix of `m` and hands the states to `emit(at, step, states)`:
/// the states of consecutive columns, whose results go to output elements `at, at + step, ...`;
/// each column once. Column tiles are split across threads; few tiles of many rows have their row
/// chunks split across threads instead.
pub(super) fn columns<A: Real, S: State<A>, Src: Source<A>>(
    src: &Src,
    m: &Matrices,
    ctx: Ctx,
    emit: &(impl Fn(usize, usize, &[S]) + Sync),
) {
    let tiles = m.width.div_ceil(TILE);
    let units = m.outer.count() * tiles;
    let w0 = m.width.min(TILE);
    let chunk = (LANE_CHUNK / w0.max(1)).next_multiple_of(ROWS);
    let chunks = m.rows.div_ceil(chunk);
    let unit = |u: usize| {
        let (o, t) = (u / tiles, u % tiles);
        let c0 = t * TILE;
        (
            m.outer.offset(o) + c0,
            m.out.offset(o) + c0 * m.out_step,
            TILE.min(m.width - c0),
        )
    };
    let rows_of = |k: usize| k * chunk..((k + 1) * chunk).min(m.rows);
    if ctx.threads > 1 && chunks > 1 && units < 2 * ctx.threads {
        for u in 0..units {
            let (base, at, width) = unit(u);
            let parts: Vec<Vec<S>> = (0..chunks)
                .into_par_iter()
                .map(|k| {
                    let mut states = vec![S::default(); width];
                    let mut cols = S::Cols::new(width);
                    let mut scratch = vec![A::ZERO; width];
                    with_simd(
                        ctx.simd,
                        #[inline(always)]
                        || {
                            let at = (base, m.stride);
                            tile_state::<A, S, Src>(
                                src,
                                at,
                                rows_of(k),
                                &mut states,
                                &mut cols,
                                &mut scratch,
                            )
                        },
                    );
                    states
                })
                .collect();
            let mut parts = parts.into_iter();
            let mut acc = parts.next().unwrap_or_default();
            for p in parts {
                merge_into::<A, S>(&mut acc, &p);
            }
            emit(at, m.out_step, &acc);
        }
        return;
    }
    let min_units = (SERIAL_ELEMENTS / (m.rows * w0).max(1)).max(1);
    for_chunks(units, ctx.threads, min_units, |r| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut acc = vec![S::default(); w0];
                let mut part = vec![S::default(); w0];
                let mut cols = S::Cols::new(w0);
                let mut scratch = vec![A::ZERO; w0];
                for u in r {
                    let (base, at, width) = unit(u);
                    let (acc, part) = (&mut acc[..width], &mut part[..width]);
                    let mat = (base, m.stride);
                    tile_state::<A, S, Src>(src, mat, rows_of(0), acc, &mut cols, &mut scratch);
                    for k in 1..chunks {
                        tile_state::<A, S, Src>(
                            src,
                            mat,
                            rows_of(k),
                            part,
                            &mut cols,
                            &mut scratch,
                        );
                        merge_into::<A, S>(acc, part);
                    }
                    emit(at, m.out_step, acc);
                }
            },
        )
    });
}

// ---------------------------------------------------------------------------------------------
// The op.

/// Where results go: values in the input's dtype, or `i64` indices.
enum Out<T> {
    /// Value reductions.
    Values(Span<T>),
    /// Index reductions.
    Indices(Span<i64>),
}

impl<T: Element> Out<T> {
    /// Writes `values` at output elements `start, start + step, ...`.
    ///
    /// # Safety
    /// No other task writes or reads those output elements meanwhile.
    unsafe fn put(&self, start: usize, step: usize, values: impl ExactSizeIterator<Item = f64>) {
        let n = values.len();
        if n == 0 {
            return;
        }
        let end = start + (n - 1) * step + 1;
        match self {
            Out::Values(s) => {
                let out = s.slice_mut(start..end).iter_mut().step_by(step);
                for (d, v) in out.zip(values) {
                    *d = T::narrow(<T::Acc as Real>::from_f64(v));
                }
            }
            Out::Indices(s) => {
                let out = s.slice_mut(start..end).iter_mut().step_by(step);
                for (d, v) in out.zip(values) {
                    *d = v as i64;
                }
            }
        }
    }
}

/// Reduces the view along the descriptor's axis.
pub(crate) fn reduce(mem: &mut HostMemory, d: &ReduceDesc, ctx: Ctx) -> Result<()> {
    let out_shape = d.output_shape();
    if out_shape.contains(&0) {
        return Ok(());
    }
    let indices = matches!(d.op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    if indices && !d.output.0.is_multiple_of(8) {
        // An `i64` output that is only element-aligned for the input dtype.
        return reference::reduce(mem, d);
    }
    with_float!(d.dtype, T => typed::<T>(mem, d, ctx), _ => reference::reduce(mem, d))
}

/// [`reduce`] for element type `T`.
fn typed<T: Element>(mem: &mut HostMemory, d: &ReduceDesc, ctx: Ctx) -> Result<()> {
    let count: usize = d.output_shape().iter().product();
    let out = match d.op {
        ReduceOp::ArgMax | ReduceOp::ArgMin => Out::Indices(Span::of(mem, OP, d.output, count)?),
        _ => Out::Values(Span::<T>::of(mem, OP, d.output, count)?),
    };
    let len = d.input.layout.shape()[d.axis];
    if len == 0 {
        // Only sum, mean and var reach here with an empty axis.
        let v = match d.op {
            ReduceOp::Sum => 0.0,
            _ => f64::NAN,
        };
        // SAFETY: this is the only writer of the output.
        unsafe { out.put(0, 1, std::iter::repeat_n(v, count)) };
        return Ok(());
    }
    let view = View::<T>::of(mem, OP, &d.input)?;
    type A<T> = <T as Element>::Acc;
    match d.op {
        ReduceOp::Sum | ReduceOp::Mean => plan::<T, Sum>(&view, d, &out, ctx),
        ReduceOp::Var { .. } => plan::<T, Moments>(&view, d, &out, ctx),
        ReduceOp::Max => plan::<T, Extreme<A<T>, true>>(&view, d, &out, ctx),
        ReduceOp::Min => plan::<T, Extreme<A<T>, false>>(&view, d, &out, ctx),
        ReduceOp::ArgMax => plan::<T, Arg<A<T>, true>>(&view, d, &out, ctx),
        ReduceOp::ArgMin => plan::<T, Arg<A<T>, false>>(&view, d, &out, ctx),
    }
}

/// Picks lanes, columns or a gathered copy for the view's strides and runs the reduction with state
/// `S`.
fn plan<T: Element, S: State<T::Acc>>(
    view: &View<T>,
    d: &ReduceDesc,
    out: &Out<T>,
    ctx: Ctx,
) -> Result<()> {
    let (shape, strides) = (d.input.layout.shape(), d.input.layout.strides());
    let axis = d.axis;
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let put = |at: usize, step: usize, states: &[S]| {
        // SAFETY: the schedulers hand each output element to exactly one call.
        unsafe { out.put(at, step, states.iter().map(|s| s.finish(d.op, len))) }
    };
    let span = view.span();
    // The output's dims (the input's without `axis`), with the input's and the output's strides.
    let dims = [&shape[..axis], &shape[axis + 1..]].concat();
    let steps = [&strides[..axis], &strides[axis + 1..]].concat();
    let out_steps = crate::shape::contiguous_strides(&dims);
    // A dim of the output that is contiguous in the input, for columns outside the trailing dims.
    let unit_dim = (0..dims.len())
        .rev()
        .find(|&k| steps[k] == 1 && dims[k] > 1);
    if strides[axis] == 1 || len == 1 {
        let grid = Grid::new(dims, steps);
        lanes::<T::Acc, S, _>(&span, &grid, len, ctx, &|at, states| put(at, 1, states));
    } else if inner >= 2 && dense_run(&shape[axis + 1..], &strides[axis + 1..]) {
        let outer = Grid::new(shape[..axis].to_vec(), strides[..axis].to_vec());
        let m = Matrices::dense(outer, len, strides[axis], inner);
        columns::<T::Acc, S, _>(&span, &m, ctx, &put);
    } else if let Some(k) = unit_dim {
        let without = |v: &[usize]| [&v[..k], &v[k + 1..]].concat();
        let m = Matrices {
            outer: Grid::new(without(&dims), without(&steps)),
            out: Grid::new(without(&dims), without(&out_steps)),
            rows: len,
            stride: strides[axis],
            width: dims[k],
            out_step: out_steps[k],
        };
        columns::<T::Acc, S, _>(&span, &m, ctx, &put);
    } else {
        let dense = gather(view, ctx)?;
        let src = Dense(&dense);
        let outer = count_of(&shape[..axis]);
        if inner == 1 {
            let grid = Grid::new(vec![outer], vec![len]);
            lanes::<T::Acc, S, _>(&src, &grid, len, ctx, &|at, states| put(at, 1, states));
        } else {
            let m = Matrices::dense(Grid::new(vec![outer], vec![len * inner]), len, inner, inner);
            columns::<T::Acc, S, _>(&src, &m, ctx, &put);
        }
    }
    Ok(())
}

/// Product of `dims`.
fn count_of(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// True when `dims` with `strides` are one dense row-major run.
fn dense_run(dims: &[usize], strides: &[usize]) -> bool {
    let mut expected = 1usize;
    for (&d, &s) in dims.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected *= d;
    }
    true
}

/// The view's elements in row-major order, widened, gathered in parallel. `OutOfMemory` when the
/// host cannot hold them.
fn gather<T: Element>(view: &View<T>, ctx: Ctx) -> Result<Vec<T::Acc>> {
    let n = view.numel();
    let mut dense = Vec::new();
    dense
        .try_reserve_exact(n)
        .map_err(|_| BackendError::OutOfMemory {
            requested: n.saturating_mul(std::mem::size_of::<T::Acc>()),
            available: 0,
        })?;
    dense.resize(n, <T::Acc as Real>::ZERO);
    let chunk = n.div_ceil(ctx.threads * 4).max(SERIAL_ELEMENTS);
    dense
        .par_chunks_mut(chunk)
        .enumerate()
        // SAFETY: reduce's output never overlaps its input (in-place is forbidden), so nothing writes
        // the view meanwhile.
        .for_each(|(k, c)| unsafe { view.gather(k * chunk, c) });
    Ok(dense)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::backends::cpu::simd::SimdLevel;
    use crate::compute::{DevicePtr, StridedBuf};
    use crate::dtype::DType;
    use crate::shape::Layout;
    use crate::validation::{compare, tolerance};

    /// `n` pseudo-random values in `[-2, 2)` from `seed` (a 64-bit LCG), never all zero.
    pub(crate) fn random(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
            })
            .collect()
    }

    /// `vals` stored as `dtype` in a fresh allocation.
    pub(crate) fn upload(mem: &mut HostMemory, dtype: DType, vals: &[f64]) -> DevicePtr {
        let p = mem.alloc(vals.len() * dtype.size_in_bytes()).unwrap();
        mem.store(dtype, p, vals).unwrap();
        p
    }

    /// Runs `f` inside a pool of `threads` threads with the matching context.
    pub(crate) fn on_threads<R: Send>(threads: usize, f: impl FnOnce(Ctx) -> R + Send) -> R {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let ctx = Ctx {
            threads,
            simd: SimdLevel::detect(),
        };
        pool.install(|| f(ctx))
    }

    /// Asserts `got` is within `dtype`'s parity bound of `want` (exactly equal for integers).
    pub(crate) fn check(dtype: DType, got: &[f64], want: &[f64], what: &str) {
        let c = compare(got, want);
        assert!(c.within(tolerance(dtype)), "{what}: {c}");
    }

    const OPS: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Var { correction: 0 },
        ReduceOp::Var { correction: 1 },
        ReduceOp::ArgMax,
        ReduceOp::ArgMin,
    ];

    /// Reduces the view `layout` of `vals` (the whole buffer) along `axis` with every op in `ops`,
    /// on every float dtype with 1 and 2 threads, and compares with the reference.
    fn check_view(vals: &[f64], layout: &Layout, axis: usize, ops: &[ReduceOp]) {
        for dtype in DType::FLOATS {
            let mut mem = HostMemory::default();
            let buf = upload(&mut mem, dtype, vals);
            let input = StridedBuf {
                ptr: buf,
                layout: layout.clone(),
            };
            for &op in ops {
                if matches!(op, ReduceOp::Var { .. }) && layout.strides()[axis] == 0 {
                    // A constant lane: the exact variance is 0 and the reference's is rounding
                    // noise, so relative errors mean nothing.
                    continue;
                }
                let od = op.output_dtype(dtype);
                let desc = |output| ReduceDesc {
                    op,
                    dtype,
                    input: input.clone(),
                    axis,
                    output,
                };
                let n: usize = desc(buf).output_shape().iter().product();
                let want_ptr = mem.alloc(n * od.size_in_bytes()).unwrap();
                reference::reduce(&mut mem, &desc(want_ptr)).unwrap();
                let want = mem.load_dense(od, want_ptr, n).unwrap();
                for threads in [1, 2] {
                    let got_ptr = mem.alloc(n * od.size_in_bytes()).unwrap();
                    on_threads(threads, |ctx| reduce(&mut mem, &desc(got_ptr), ctx)).unwrap();
                    let got = mem.load_dense(od, got_ptr, n).unwrap();
                    let what = format!(
                        "{} {dtype} {:?}/{:?}+{} axis {axis}, {threads} thread(s)",
                        op.name(),
                        layout.shape(),
                        layout.strides(),
                        layout.offset()
                    );
                    if od == DType::I64 {
                        assert_eq!(got, want, "{what}");
                    } else {
                        check(dtype, &got, &want, &what);
                    }
                    mem.free(got_ptr).unwrap();
                }
            }
        }
    }

    /// Every axis of a contiguous `shape`.
    fn check_contiguous(shape: &[usize], seed: u64, ops: &[ReduceOp]) {
        let n: usize = shape.iter().product();
        let vals = random(n, seed);
        let layout = Layout::contiguous(shape);
        for axis in 0..shape.len() {
            check_view(&vals, &layout, axis, ops);
        }
    }

    #[test]
    fn small_contiguous_shapes_every_op_and_axis() {
        for (k, shape) in [
            vec![1],
            vec![1, 1],
            vec![7],
            vec![7, 13, 5],
            vec![3, 1, 4],
            vec![2, 3, 257],
            vec![3, 300, 2],
        ]
        .into_iter()
        .enumerate()
        {
            check_contiguous(&shape, k as u64, &OPS);
        }
    }

    #[test]
    fn long_lanes_split_into_chunks() {
        // One lane of 200 003 elements and two of 70 001: chunks of LANE_CHUNK run in parallel.
        check_contiguous(&[200_003], 11, &OPS);
        check_view(
            &random(2 * 70_001, 12),
            &Layout::contiguous(&[2, 70_001]),
            1,
            &OPS,
        );
    }

    #[test]
    fn many_short_lanes_and_tall_columns() {
        // 5 000 lanes of 3 (emitted in batches); 30 000 rows of 5 columns (row chunks in parallel);
        // 3 × 50 × 2500 (two column tiles per matrix).
        check_view(
            &random(15_000, 13),
            &Layout::contiguous(&[5000, 3]),
            1,
            &OPS,
        );
        check_view(
            &random(150_000, 14),
            &Layout::contiguous(&[30_000, 5]),
            0,
            &OPS,
        );
        check_view(
            &random(375_000, 15),
            &Layout::contiguous(&[3, 50, 2500]),
            1,
            &[
                ReduceOp::Sum,
                ReduceOp::Var { correction: 1 },
                ReduceOp::ArgMax,
            ],
        );
    }

    #[test]
    fn strided_views() {
        // A [4, 7, 6] buffer permuted to [6, 4, 7] (lanes with stride 1, then gathered views).
        let vals = random(168, 21);
        let permuted = Layout::new(vec![6, 4, 7], vec![1, 42, 6], 0).unwrap();
        for axis in 0..3 {
            check_view(&vals, &permuted, axis, &OPS);
        }
        // Rows of 9 every 20 elements from offset 3 (columns with a row stride, strided lanes).
        let vals = random(120, 22);
        let narrowed = Layout::new(vec![5, 9], vec![20, 1], 3).unwrap();
        for axis in 0..2 {
            check_view(&vals, &narrowed, axis, &OPS);
        }
        // Broadcast rows and columns.
        let vals = random(11, 23);
        for layout in [
            Layout::new(vec![6, 11], vec![0, 1], 0).unwrap(),
            Layout::new(vec![11, 6], vec![1, 0], 0).unwrap(),
            Layout::new(vec![11, 3, 2], vec![1, 0, 0], 0).unwrap(),
        ] {
            for axis in 0..layout.rank() {
                check_view(&vals, &layout, axis, &OPS);
            }
        }
        // Views without a contiguous dim: gathered first (in parallel for the larger one).
        let vals = random(102_000, 25);
        for layout in [
            Layout::new(vec![50], vec![3], 2).unwrap(),
            Layout::new(vec![6, 5], vec![2, 13], 1).unwrap(),
            Layout::new(vec![300, 170], vec![2, 600], 0).unwrap(),
        ] {
            for axis in 0..layout.rank() {
                check_view(&vals, &layout, axis, &OPS);
            }
        }
        // A transposed matrix: columns along the output's contiguous-in-the-input dim.
        let vals = random(300 * 170, 24);
        let t = Layout::new(vec![170, 300], vec![1, 170], 0).unwrap();
        check_view(
            &vals,
            &t,
            1,
            &[ReduceOp::Sum, ReduceOp::Min, ReduceOp::ArgMax],
        );
        check_view(
            &vals,
            &t,
            0,
            &[ReduceOp::Mean, ReduceOp::Var { correction: 1 }],
        );
    }

    #[test]
    fn nan_inf_and_ties_follow_the_reference() {
        // Values from a small set (ties everywhere), with NaN and infinities sprinkled in.
        let mut vals: Vec<f64> = random(40 * 3000, 31)
            .iter()
            .map(|v| (v * 2.0).round())
            .collect();
        for (i, v) in vals.iter_mut().enumerate() {
            match i % 997 {
                5 => *v = f64::NAN,
                17 => *v = f64::INFINITY,
                400 => *v = f64::NEG_INFINITY,
                _ => {}
            }
        }
        check_view(&vals, &Layout::contiguous(&[40, 3000]), 1, &OPS);
        check_view(&vals, &Layout::contiguous(&[40, 3000]), 0, &OPS);
        check_view(&vals, &Layout::contiguous(&[120_000]), 0, &OPS);
        check_view(
            &vals[..120],
            &Layout::new(vec![10, 12], vec![1, 10], 0).unwrap(),
            1,
            &OPS,
        );
    }

    #[test]
    fn empty_axis_and_empty_output() {
        let ops = [
            ReduceOp::Sum,
            ReduceOp::Mean,
            ReduceOp::Var { correction: 1 },
        ];
        check_view(&[1.0], &Layout::contiguous(&[3, 0, 4]), 1, &ops);
        check_view(&[1.0], &Layout::contiguous(&[0, 5]), 1, &OPS);
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let vals = random(300_001, 41);
        let mut mem = HostMemory::default();
        let x = upload(&mut mem, DType::F32, &vals);
        let mut results = Vec::new();
        for threads in [1, 2, 3] {
            let out = mem.alloc(4).unwrap();
            let d = ReduceDesc {
                op: ReduceOp::Sum,
                dtype: DType::F32,
                input: StridedBuf::contiguous(x, &[300_001]),
                axis: 0,
                output: out,
            };
            on_threads(threads, |ctx| reduce(&mut mem, &d, ctx)).unwrap();
            results.push(mem.bytes(out, 4).unwrap().to_vec());
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
    }

    #[test]
    #[ignore = "10⁷ elements: run in release"]
    fn ten_million_f32_sum_is_accurate() {
        let n = 10_000_000;
        let vals = random(n, 51);
        check_view(
            &vals,
            &Layout::contiguous(&[n]),
            0,
            &[ReduceOp::Sum, ReduceOp::Var { correction: 1 }],
        );
    }
}
