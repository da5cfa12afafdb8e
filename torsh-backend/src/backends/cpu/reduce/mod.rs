//! Reductions along one axis on the CPU.
//!
//! A reduction is planned from the input view's strides. When the axis has stride 1, every output
//! element reduces one contiguous run (a *lane*), vectorised along the run with many accumulators.
//! When the dims after the axis form one contiguous run, each output row is reduced *column-style*,
//! vectorised across the columns, wide rows four at a time. Any other view is first gathered into a
//! dense widened copy.
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

use super::accumulators::{pairwise, pairwise32};
use super::team::{par_chunks_mut, par_map};

use super::host::{
    for_chunks, widen_into, with_float, with_simd, Ctx, Element, Real, Span, View, BLOCK,
};
use crate::backends::cpu::cost::TASK_ELEMENTS;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{memory::HostMemory, reduce as reference};
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::{ReduceDesc, ReduceOp};
use crate::error::{BackendError, Result};

/// The op name in errors.
const OP: &str = "reduce";

/// Elements of a lane whose partial result is computed as one piece. A lane's result is the ordered
/// fold of its chunks' results, so it is the same whether the chunks ran on one thread or several.
pub(super) const LANE_CHUNK: usize = 1 << 16;

/// Columns a column-style task reduces at once: wide, so that rows are read as long sequential runs
/// (the hardware prefetchers lose a stream at each jump between rows: tiles of 2048 f32 columns
/// read the rows of a 4096-wide matrix at half the speed of whole rows). The per-column
/// accumulators of a tile (32 KiB in f32) then live in L2, so wide rows are pushed in groups
/// ([`GROUP_BYTES`]).
const TILE: usize = 8192;

/// Row width in bytes of the compute type from which a column task pushes rows four at a time, so
/// that accumulators too large for L1 are read and written once per four rows. Narrower rows go one
/// at a time: their accumulators stay in L1, and four interleaved row streams read slower there than
/// one.
const GROUP_BYTES: usize = 16 << 10;

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
    /// True when [`Source::load`] widens into its scratch; false when it never touches it.
    const WIDENS: bool;

    /// Elements `start .. start + len` as `A`: in place when no conversion is needed, else widened
    /// into `scratch` (at least `len` long when the source [widens](Source::WIDENS)).
    ///
    /// # Safety
    /// The range is inside the source and no task writes it while the slice lives.
    unsafe fn load<'a>(&'a self, start: usize, len: usize, scratch: &'a mut [A]) -> &'a [A];
}

impl<T: Element> Source<T::Acc> for Span<T> {
    const WIDENS: bool = std::mem::size_of::<T>() != std::mem::size_of::<T::Acc>();

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
    const WIDENS: bool = false;

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
        acc = std::array::from_fn(
            #[inline(always)]
            |i| f(acc[i], c[i]),
        );
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
fn tree<A: Real>(acc: [A; LANES]) -> A {
    pairwise(
        acc,
        #[inline(always)]
        |a, b| a + b,
    )
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

/// `x` when it beats `m`, else `m`: NaN never beats, so a NaN `x` is dropped (and a NaN `m` stays
/// only until a number comes).
#[inline(always)]
fn take<A: Real, const MAX: bool>(m: A, x: A) -> A {
    if better::<A, MAX>(x, m) {
        x
    } else {
        m
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

/// The maximum (or minimum) of `xs` (not empty), NaN when any element is NaN: [`extreme_lanes`]
/// with 128 bytes of each kind of accumulator (32 f32 or 16 f64 lanes, four AVX2 registers), or a
/// quarter of that for blocks shorter than one step of those (rows of 64 to 127 f32, say).
#[inline(always)]
fn extreme_block<A: Real, const MAX: bool>(xs: &[A]) -> A {
    let wide = xs.len() >= 4 * 128 / std::mem::size_of::<A>();
    match (std::mem::size_of::<A>() == 4, wide) {
        (true, true) => extreme_lanes::<A, MAX, 32>(xs),
        (true, false) => extreme_lanes::<A, MAX, 8>(xs),
        (false, true) => extreme_lanes::<A, MAX, 16>(xs),
        (false, false) => extreme_lanes::<A, MAX, 4>(xs),
    }
}

/// [`extreme_block`] in one pass over `xs` with `N ≤ 32` lanes of each of two accumulators, four
/// chunks of `N` per step: the extreme ignoring NaN (the plain compare-and-select [`take`],
/// `vmaxps`/`vminps`) and `Σ x`, which turns NaN when any element is NaN (or when infinities of
/// both signs meet, or a sum overflows to meet one); only then is the block scanned again with the
/// NaN-aware [`pick`]. Otherwise the lanes hold no NaN and combine with [`take`], which
/// vectorises. The leftover chunks and the tail go through [`pick`]. (Folding with `pick` made
/// LLVM keep the accumulators in memory behind masked stores, and combining with it cost about as
/// much as the loop over a block in cache; 64 lanes of each kept more vectors than there are
/// registers.)
#[inline(always)]
fn extreme_lanes<A: Real, const MAX: bool, const N: usize>(xs: &[A]) -> A {
    let first = xs[0];
    let exact = |xs: &[A]| xs.iter().fold(first, |m, &x| pick::<A, MAX>(m, x));
    let (chunks, tail) = xs.as_chunks::<N>();
    let (quads, odd) = chunks.as_chunks::<4>();
    if quads.is_empty() {
        return exact(xs);
    }
    let mut acc = [first; N];
    let mut poison = [A::ZERO; N];
    for [a, b, c, d] in quads {
        for i in 0..N {
            let ab = take::<A, MAX>(a[i], b[i]);
            let cd = take::<A, MAX>(c[i], d[i]);
            acc[i] = take::<A, MAX>(acc[i], take::<A, MAX>(ab, cd));
            poison[i] += (a[i] + b[i]) + (c[i] + d[i]);
        }
    }
    // Padded to the 32 lanes the combining tree takes: with 0 for the sum, with `first` (already
    // an operand) for the extreme.
    let padded = |v: [A; N], fill: A| -> [A; 32] {
        std::array::from_fn(
            #[inline(always)]
            |i| if i < N { v[i] } else { fill },
        )
    };
    let poison = pairwise32(
        padded(poison, A::ZERO),
        #[inline(always)]
        |p, q| p + q,
    );
    if poison.is_nan() {
        return exact(xs);
    }
    let m = pairwise32(
        padded(acc, first),
        #[inline(always)]
        |m, x| take::<A, MAX>(m, x),
    );
    odd.iter()
        .flatten()
        .chain(tail)
        .fold(m, |m, &x| pick::<A, MAX>(m, x))
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
    let chunk = n.div_ceil(ctx.threads * 4).max(TASK_ELEMENTS);
    // SAFETY: reduce's output never overlaps its input (in-place is forbidden), so nothing writes
    // the view meanwhile.
    par_chunks_mut(&mut dense, chunk, |k, c| unsafe {
        view.gather(k * chunk, c)
    });
    Ok(dense)
}

mod drivers;
mod states;

impl OpImpl<ReduceDesc> for CpuBackend {
    fn op(&self, desc: &ReduceDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.reduce(desc);
        };
        self.kernel(acc, |mem, ctx| reduce(mem, desc, ctx))
    }
}

#[cfg(test)]
pub(super) mod tests;

pub(super) use self::{drivers::*, states::*};
