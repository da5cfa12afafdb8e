//! Drivers of the CPU reductions: how rows, lanes and threads are walked for each layout.

use super::*;
use crate::backends::cpu::cost::items_per_task;

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
pub(in crate::backends::cpu) fn lane_state<A: Real, S: State<A>, Src: Source<A>>(
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
/// `base + r * stride` in `src`, into `into`: folded over blocks of [`ROWS`] rows, whose rows are
/// pushed in groups of four from the block's first when a row spans [`GROUP_BYTES`] or more.
/// `cols` (fresh or taken) has room for the width, `scratch` for four times the width when `Src`
/// widens (else it may be empty).
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
    let grouped = width * std::mem::size_of::<A>() >= GROUP_BYTES;
    let mut start = rows.start;
    let mut fresh = true;
    while start < rows.end {
        let end = (start + ROWS).min(rows.end);
        let mut r = start;
        if grouped {
            while r + 4 <= end {
                let [s0, s1, s2, s3] = scratch_rows(scratch, width);
                // SAFETY: the caller's matrix lies inside `src`, and no task writes an input.
                let group = unsafe {
                    [
                        src.load(base + r * stride, width, s0),
                        src.load(base + (r + 1) * stride, width, s1),
                        src.load(base + (r + 2) * stride, width, s2),
                        src.load(base + (r + 3) * stride, width, s3),
                    ]
                };
                cols.push4(group);
                r += 4;
            }
        }
        for r in r..end {
            // SAFETY: the caller's matrix lies inside `src`, and no task writes an input.
            let row = unsafe { src.load(base + r * stride, width, scratch) };
            cols.push(row);
        }
        cols.take(start, into, fresh);
        fresh = false;
        start = end;
    }
}

/// Four disjoint pieces of `scratch`, one per row of a group: `width` elements each, or less when
/// `scratch` is shorter than four widths (a source that does not widen never reads them).
#[inline(always)]
fn scratch_rows<A>(scratch: &mut [A], width: usize) -> [&mut [A]; 4] {
    let width = width.min(scratch.len() / 4);
    let (s0, rest) = scratch.split_at_mut(width);
    let (s1, rest) = rest.split_at_mut(width);
    let (s2, rest) = rest.split_at_mut(width);
    [s0, s1, s2, &mut rest[..width]]
}

/// Scratch for [`tile_state`] over rows of `width`: four rows' worth when `Src` widens, else none.
fn group_scratch<A: Real, Src: Source<A>>(width: usize) -> Vec<A> {
    vec![A::ZERO; if Src::WIDENS { 4 * width } else { 0 }]
}

/// Merges the per-column states `later` after `acc`.
fn merge_into<A: Real, S: State<A>>(acc: &mut [S], later: &[S]) {
    for (a, &b) in acc.iter_mut().zip(later) {
        *a = a.merge(b);
    }
}

/// An index space walked in row-major order, with an element stride per dim.
#[derive(Clone, Debug)]
pub(in crate::backends::cpu) struct Grid {
    /// Dim sizes.
    dims: Vec<usize>,
    /// Element stride of each dim.
    strides: Vec<usize>,
}

impl Grid {
    /// The grid of `dims` with `strides`.
    pub(in crate::backends::cpu) fn new(dims: Vec<usize>, strides: Vec<usize>) -> Grid {
        Grid { dims, strides }
    }

    /// Number of points.
    pub(in crate::backends::cpu) fn count(&self) -> usize {
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
pub(in crate::backends::cpu) fn lanes<A: Real, S: State<A>, Src: Source<A>>(
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
            let parts: Vec<S> = par_map(chunks, |k| {
                let range = k * LANE_CHUNK..((k + 1) * LANE_CHUNK).min(len);
                with_simd(
                    ctx.simd,
                    #[inline(always)]
                    || {
                        let mut scratch = [A::ZERO; BLOCK];
                        chunk_state::<A, S, Src>(src, base, range, &mut scratch)
                    },
                )
            });
            emit(j, &[fold::<A, S>(parts)]);
        }
        return;
    }
    let min_lanes = items_per_task(len);
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
pub(in crate::backends::cpu) struct Matrices {
    /// Where each matrix starts in the source.
    pub(in crate::backends::cpu) outer: Grid,
    /// Where each matrix's first column goes in the output (same dims as `outer`).
    pub(in crate::backends::cpu) out: Grid,
    /// Rows (the reduced dim).
    pub(in crate::backends::cpu) rows: usize,
    /// Elements between rows.
    pub(in crate::backends::cpu) stride: usize,
    /// Columns (contiguous in the source).
    pub(in crate::backends::cpu) width: usize,
    /// Output elements between columns.
    pub(in crate::backends::cpu) out_step: usize,
}

impl Matrices {
    /// Matrices whose results are laid out densely: matrix `o`'s columns at `o * width ..`.
    pub(in crate::backends::cpu) fn dense(
        outer: Grid,
        rows: usize,
        stride: usize,
        width: usize,
    ) -> Matrices {
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

/// Columns one task of the parallel fold of row chunks' states merges.
const MERGE_COLUMNS: usize = 1024;

/// Reduces every column of every matrix of `m` and hands the states to `emit(at, step, states)`:
/// the states of consecutive columns, whose results go to output elements `at, at + step, ...`;
/// each column once. Column tiles are split across threads; few tiles of many rows have their row
/// chunks split across threads instead.
pub(in crate::backends::cpu) fn columns<A: Real, S: State<A>, Src: Source<A>>(
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
        // Each row chunk's states go to its own piece of one buffer made here, so that the tasks
        // allocate and fault in nothing.
        let mut parts = vec![S::default(); chunks * w0];
        for u in 0..units {
            let (base, at, width) = unit(u);
            let parts = &mut parts[..chunks * width];
            par_chunks_mut(parts, width, |k, states| {
                let mut cols = S::Cols::new(width);
                let mut scratch = group_scratch::<A, Src>(width);
                with_simd(
                    ctx.simd,
                    #[inline(always)]
                    || {
                        let at = (base, m.stride);
                        tile_state::<A, S, Src>(
                            src,
                            at,
                            rows_of(k),
                            states,
                            &mut cols,
                            &mut scratch,
                        )
                    },
                );
            });
            // The chunks' states folded in chunk order into the first's, columns in parallel.
            let (acc, later) = parts.split_at_mut(width);
            let piece = MERGE_COLUMNS.min(width);
            par_chunks_mut(acc, piece, |j, acc| {
                let c0 = j * piece;
                for k in 0..chunks - 1 {
                    merge_into::<A, S>(acc, &later[k * width + c0..][..acc.len()]);
                }
            });
            emit(at, m.out_step, acc);
        }
        return;
    }
    let min_units = items_per_task(m.rows * w0);
    for_chunks(units, ctx.threads, min_units, |r| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let mut acc = vec![S::default(); w0];
                let mut part = vec![S::default(); w0];
                let mut cols = S::Cols::new(w0);
                let mut scratch = group_scratch::<A, Src>(w0);
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
