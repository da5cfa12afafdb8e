//! Fills and strided copies on the CPU (transposing copies in tiles).

use super::*;
use crate::backends::cpu::cost::{items_per_task, TASK_ELEMENTS};
use crate::backends::cpu::stream::{worth_streaming, Streamer, STREAM_RUN_BYTES};
use crate::backends::cpu::vector::{on_vectors, Registers, Step, Vector};

/// Sets every element to `value` (rounded once, as the reference rounds it); outputs of
/// [`worth_streaming`] size with streaming stores.
pub(crate) fn fill(mem: &mut HostMemory, d: &FillDesc, ctx: Ctx) -> Result<()> {
    with_float!(d.dtype, T => fill_t::<T>(mem, d, ctx), _ => reference::fill(mem, d))
}

/// [`fill`] for element type `T`.
fn fill_t<T: Lanes>(mem: &mut HostMemory, d: &FillDesc, ctx: Ctx) -> Result<()> {
    let out = Span::<T>::of(mem, "fill", d.ptr, d.len)?;
    let v = T::from_f64(d.value);
    let stream = worth_streaming(d.len * std::mem::size_of::<T>());
    for_chunks(d.len, ctx.threads, TASK_ELEMENTS, |range| {
        // SAFETY: this task owns `range` of the output.
        let ys = unsafe { out.slice_mut(range) };
        if stream {
            let mut block = [v; BLOCK];
            Streamer::new().blocks(ys, &mut block, |_, _| {});
            return;
        }
        with_simd(
            ctx.simd,
            #[inline(always)]
            || ys.fill(v),
        )
    });
    Ok(())
}

/// Copies one strided view into another: whole rows where both are dense along their innermost
/// (merged) dim (streamed past the cache when the copy is of [`worth_streaming`] size), element by
/// element otherwise; threaded over element ranges.
pub(crate) fn copy_strided(mem: &mut HostMemory, d: &CopyDesc, ctx: Ctx) -> Result<()> {
    match d.dtype.size_in_bytes() {
        1 => copy_t::<u8>(mem, d, ctx),
        2 => copy_t::<u16>(mem, d, ctx),
        4 => copy_t::<u32>(mem, d, ctx),
        8 => copy_t::<u64>(mem, d, ctx),
        _ => reference::copy_strided(mem, d),
    }
}

/// [`copy_strided`] for elements of `E`'s size (the bits are copied as they are).
fn copy_t<E: bytemuck::Pod + Send + Sync>(
    mem: &mut HostMemory,
    d: &CopyDesc,
    ctx: Ctx,
) -> Result<()> {
    const OP: &str = "copy_strided";
    if d.src.layout.numel() == 0 {
        return Ok(());
    }
    let src = raw_span::<E>(mem, OP, &d.src)?;
    let dst = raw_span::<E>(mem, OP, &d.dst)?;
    if src.same_as(&dst) {
        // Only an exact in-place copy gets here (both dense, same region): nothing to do.
        return Ok(());
    }
    let dims = Dims::new(
        d.src.layout.shape(),
        [d.src.layout.strides(), d.dst.layout.strides()],
    );
    if let Some(t) = Transpose::plan(&dims) {
        t.run(src, dst, ctx);
        return Ok(());
    }
    let (inner, [ss, ds]) = dims.inner();
    if ss == 1 && ds == 1 && inner * std::mem::size_of::<E>() <= SHORT_RUN_BYTES {
        if let Some(rows) = dims.rows() {
            copy_short_runs(src, dst, &rows, inner, ctx);
            return Ok(());
        }
    }
    // Streamed where runs span whole lines of memory (a few KiB each), not just their heads.
    let elem = std::mem::size_of::<E>();
    let stream = ss == 1
        && ds == 1
        && inner * elem >= STREAM_RUN_BYTES
        && worth_streaming(dims.numel() * elem);
    for_chunks(dims.numel(), ctx.threads, TASK_ELEMENTS, |range| {
        let mut streamer = stream.then(Streamer::new);
        dims.runs(range, |_, [ps, pd], len| {
            // SAFETY: the destination is injective (checked) and disjoint from the source, and this
            // task writes only the destination elements of its own walk range.
            unsafe {
                if ss == 1 && ds == 1 {
                    let (xs, ys) = (src.slice(ps..ps + len), dst.slice_mut(pd..pd + len));
                    match streamer.as_mut() {
                        Some(s) => s.copy(xs, ys),
                        None => ys.copy_from_slice(xs),
                    }
                } else {
                    let xs = src.slice(ps..ps + (len - 1) * ss + 1);
                    for k in 0..len {
                        dst.write(pd + k * ds, xs[k * ss]);
                    }
                }
            }
        })
    });
    Ok(())
}

/// Dense runs up to this many bytes are copied row by row by [`copy_short_runs`].
const SHORT_RUN_BYTES: usize = 256;

/// Copies `rows` (a walk over both operands' outer dims) of `len` elements each, dense in both: the
/// row loop runs inline, and the common run sizes (the heads of an attention layer split or merged,
/// 16 to 256 bytes) are copied as arrays of a size known at compile time, so each is a few vector
/// moves rather than a `memcpy` call (which cost about as much as the walk itself on runs of 64
/// bytes).
fn copy_short_runs<E: bytemuck::Pod + Send + Sync>(
    src: Span<E>,
    dst: Span<E>,
    rows: &Dims<2>,
    len: usize,
    ctx: Ctx,
) {
    match len * std::mem::size_of::<E>() {
        16 => copy_rows::<E, 16>(src, dst, rows, len, ctx),
        32 => copy_rows::<E, 32>(src, dst, rows, len, ctx),
        64 => copy_rows::<E, 64>(src, dst, rows, len, ctx),
        128 => copy_rows::<E, 128>(src, dst, rows, len, ctx),
        256 => copy_rows::<E, 256>(src, dst, rows, len, ctx),
        _ => copy_rows::<E, 0>(src, dst, rows, len, ctx),
    }
}

/// [`copy_short_runs`] for rows of `B` bytes (`B == 0`: any length, by `copy_from_slice`).
fn copy_rows<E: bytemuck::Pod + Send + Sync, const B: usize>(
    src: Span<E>,
    dst: Span<E>,
    rows: &Dims<2>,
    len: usize,
    ctx: Ctx,
) {
    let (_, [rs, rd]) = rows.inner();
    let min_rows = items_per_task(len);
    for_chunks(rows.numel(), ctx.threads, min_rows, |range| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                rows.runs(
                    range,
                    #[inline(always)]
                    |_, [ps, pd], n| {
                        for k in 0..n {
                            let (ps, pd) = (ps + k * rs, pd + k * rd);
                            // SAFETY: as in `copy_t`: the destination is injective and disjoint
                            // from the source, and this task writes only its own rows.
                            let (d, s) =
                                unsafe { (dst.slice_mut(pd..pd + len), src.slice(ps..ps + len)) };
                            let (d, s): (&mut [u8], &[u8]) =
                                (bytemuck::cast_slice_mut(d), bytemuck::cast_slice(s));
                            if B == 0 {
                                d.copy_from_slice(s);
                            } else {
                                d[..B].copy_from_slice(&s[..B]);
                            }
                        }
                    },
                )
            },
        )
    });
}

/// Rows and columns of the tiles a [`Transpose`] moves at a time. Small on purpose: with
/// power-of-two strides every source column (and destination row) of a tile falls in the same L1
/// set, whose 8 ways must hold them all; 16 × 8 measured fastest for 4-byte elements on a 4096²
/// transpose (2× a 32 × 32 tile, which thrashes that set).
const TRANSPOSE_TILE: (usize, usize) = (16, 8);

/// Rows and columns of the blocks a [`Transpose`] walks tile by tile: every source column and
/// destination row a block touches is used for 256 elements (1–2 KiB) before the walk moves on, so
/// a page's TLB entry serves a kilobyte or more rather than one cache line.
const TRANSPOSE_BLOCK: usize = 256;

/// A copy that reads its innermost dim with a stride but has another dim (the *rows*) contiguous in
/// the source, as `x.t()` does: copied in tiles of [`TRANSPOSE_TILE`] rows × columns inside blocks of
/// [`TRANSPOSE_BLOCK`], so that every
/// cache line read or written is used whole (the element-by-element walk fetched a source line per
/// element). Work items are (plane of the remaining dims, band of rows).
#[derive(Debug)]
struct Transpose {
    /// The remaining dims, outermost first: extent and `[source, destination]` stride.
    planes: Vec<(usize, [usize; 2])>,
    /// Rows: extent and destination stride (their source stride is 1).
    rows: (usize, usize),
    /// Columns (the walk's innermost dim): extent and `[source, destination]` stride.
    cols: (usize, [usize; 2]),
}

impl Transpose {
    /// The tiled plan for `dims`, or `None` when the innermost dim is contiguous in the source, no
    /// other dim is, or either side of the tile would be shorter than 4.
    fn plan(dims: &Dims<2>) -> Option<Transpose> {
        let last = dims.shape.len() - 1;
        let (cols, col) = (dims.shape[last], dims.strides[last]);
        if col[0] == 1 || cols < 4 {
            return None;
        }
        let row = (0..last).rev().find(|&d| dims.strides[d][0] == 1)?;
        if dims.shape[row] < 4 {
            return None;
        }
        let planes = (0..last)
            .filter(|&d| d != row)
            .map(|d| (dims.shape[d], dims.strides[d]))
            .collect();
        Some(Transpose {
            planes,
            rows: (dims.shape[row], dims.strides[row][1]),
            cols: (cols, col),
        })
    }

    /// Source and destination offsets of plane `p`.
    fn plane_at(&self, mut p: usize) -> [usize; 2] {
        let mut at = [0, 0];
        for &(len, [ss, ds]) in self.planes.iter().rev() {
            at[0] += (p % len) * ss;
            at[1] += (p % len) * ds;
            p /= len;
        }
        at
    }

    /// Copies `src` to `dst` (disjoint; the destination injective) on `ctx.threads` threads: by
    /// register transposes of the level's vectors where the elements are 4 or 8 bytes wide and the
    /// destination is dense along the columns (the bits move as they are), else element by element.
    fn run<E: bytemuck::Pod + Send + Sync>(&self, src: Span<E>, dst: Span<E>, ctx: Ctx) {
        let planes: usize = self.planes.iter().map(|p| p.0).product();
        let bands = self.rows.0.div_ceil(TRANSPOSE_BLOCK);
        let min_items = items_per_task(TRANSPOSE_BLOCK * self.cols.0);
        let dense = self.cols.1[1] == 1;
        for_chunks(planes * bands, ctx.threads, min_items, |items| {
            let tiles = Tiles {
                plan: self,
                src,
                dst,
                items,
                bands,
            };
            // SAFETY: `Tiles::run`'s contract: the element size matches the vectors' lanes and
            // the destination is dense along the columns.
            unsafe {
                match std::mem::size_of::<E>() {
                    4 if dense => on_vectors::<f32, _>(ctx.simd, tiles),
                    8 if dense => on_vectors::<f64, _>(ctx.simd, tiles),
                    _ => tiles.by_elements(),
                }
            }
        });
    }
}

/// The work items `items` (plane and band of rows) of a [`Transpose`], block by block.
struct Tiles<'a, E> {
    plan: &'a Transpose,
    src: Span<E>,
    dst: Span<E>,
    items: Range<usize>,
    /// Bands of [`TRANSPOSE_BLOCK`] rows in a plane.
    bands: usize,
}

impl<E: bytemuck::Pod> Tiles<'_, E> {
    /// Calls `block(at, rows, cols)` for each block of the items: the plane's offsets, and the
    /// rows and columns of the block.
    #[inline(always)]
    fn each_block(&self, mut block: impl FnMut([usize; 2], Range<usize>, Range<usize>)) {
        let (rows, cols) = (self.plan.rows.0, self.plan.cols.0);
        for item in self.items.clone() {
            let at = self.plan.plane_at(item / self.bands);
            let r0 = (item % self.bands) * TRANSPOSE_BLOCK;
            let band = r0..(r0 + TRANSPOSE_BLOCK).min(rows);
            for c0 in (0..cols).step_by(TRANSPOSE_BLOCK) {
                block(at, band.clone(), c0..(c0 + TRANSPOSE_BLOCK).min(cols));
            }
        }
    }

    /// Copies element `(r, c)` of the plane at offsets `[ps, pd]`.
    ///
    /// # Safety
    /// `(r, c)` is inside the plane and one of the items' elements.
    #[inline(always)]
    unsafe fn element(&self, [ps, pd]: [usize; 2], r: usize, c: usize) {
        let row_ds = self.plan.rows.1;
        let [col_ss, col_ds] = self.plan.cols.1;
        // SAFETY: both offsets lie inside their layouts' spans (the walk's dims are the layouts'
        // own); the destination is injective and disjoint from the source, and element
        // (plane, r, c) belongs to the calling task alone.
        unsafe {
            let v = self.src.read(ps + r + c * col_ss);
            self.dst.write(pd + r * row_ds + c * col_ds, v);
        }
    }

    /// Copies the items element by element, in tiles of [`TRANSPOSE_TILE`].
    fn by_elements(self) {
        let (tile_rows, tile_cols) = TRANSPOSE_TILE;
        self.each_block(|at, rows, cols| {
            for r0 in rows.clone().step_by(tile_rows) {
                for c0 in cols.clone().step_by(tile_cols) {
                    for r in r0..(r0 + tile_rows).min(rows.end) {
                        for c in c0..(c0 + tile_cols).min(cols.end) {
                            // SAFETY: (r, c) is in the block, one of the items'.
                            unsafe { self.element(at, r, c) };
                        }
                    }
                }
            }
        });
    }
}

impl<A: Registers, E: bytemuck::Pod> Step<A> for Tiles<'_, E> {
    type Out = ();

    /// Copies the items in tiles of `LANES × LANES`, each whole tile by one register transpose
    /// (source columns of `LANES` rows loaded, destination rows of `LANES` columns stored, every
    /// cache line moved whole), the ragged edges element by element.
    ///
    /// # Safety
    /// `E` has `A`'s size, and the destination is dense along the columns.
    #[inline(always)]
    unsafe fn run<V: Vector<A>>(self) {
        let lanes = V::LANES;
        let row_ds = self.plan.rows.1;
        let col_ss = self.plan.cols.1[0];
        self.each_block(|at @ [ps, pd], rows, cols| {
            for r0 in rows.clone().step_by(lanes) {
                for c0 in cols.clone().step_by(lanes) {
                    if r0 + lanes <= rows.end && c0 + lanes <= cols.end {
                        // SAFETY: the tile's source rows (fixed column, `lanes` rows from r0) and
                        // destination rows (fixed row, `lanes` dense columns from c0) lie inside
                        // their spans and belong to this task; E's bits are moved as A's, of
                        // the same size, by permutes that keep every bit.
                        unsafe {
                            V::transpose(
                                self.src.ptr(ps + r0 + c0 * col_ss).cast::<A>(),
                                col_ss,
                                self.dst.ptr(pd + r0 * row_ds + c0).cast::<A>(),
                                row_ds,
                            );
                        }
                        continue;
                    }
                    for r in r0..(r0 + lanes).min(rows.end) {
                        for c in c0..(c0 + lanes).min(cols.end) {
                            // SAFETY: (r, c) is in the block, one of the items'.
                            unsafe { self.element(at, r, c) };
                        }
                    }
                }
            }
        });
    }
}

impl OpImpl<FillDesc> for CpuBackend {
    fn op(&self, desc: &FillDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.fill(desc);
        };
        self.kernel(acc, |mem, ctx| fill(mem, desc, ctx))
    }
}

impl OpImpl<CopyDesc> for CpuBackend {
    fn op(&self, desc: &CopyDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.copy_strided(desc);
        };
        self.kernel(acc, |mem, ctx| copy_strided(mem, desc, ctx))
    }
}
