//! Winograd F(2×2, 3×3): 3×3 convolutions at stride 1 and dilation 1, ungrouped.
//!
//! The output is cut into 2×2 tiles; each reads a 4×4 input tile. With the filter transformed to
//! `U = G·g·Gᵀ` and every input tile to `V = Bᵀ·d·B` (both 4×4), an output tile is
//! `Aᵀ·(Σ_c U ⊙ V)·A`. Grouping the 16 positions ξ of the 4×4 transforms, the sum over input
//! channels becomes 16 GEMMs `M_ξ [K × tiles] = U_ξ [K × C] · V_ξ [C × tiles]`, 2.25 times fewer
//! multiply-adds than the 3×3 window's. The transforms only add, subtract and halve (exact scalings),
//! so the rounding error stays within a small factor of the direct sum's, well inside the f32 bound.
//!
//! Work items are (image, block of tile rows), sized so that one block's transformed input (`V`)
//! and products (`M`) stay in the L2 cache; a plane of at most [`WHOLE_PLANE`] tiles is one block
//! (split, its products would be too narrow), and with fewer blocks than threads the team shares
//! out each block's 16 products. Each thread leases one set of buffers per call. The filter
//! transform runs first, on the team when the convolution is threaded.
//!
//! Non-finite values: a block with an input that is not finite, or larger than a quarter of the
//! type's largest finite value (so that a transform might overflow), is computed again by the
//! im2col path: the transforms would otherwise turn one infinite input into NaN in outputs whose
//! 3×3 window does not read it. A filter whose transform is not finite sends the whole
//! convolution to the im2col path.
//! Finite inputs below that bound can still overflow in the products `M` where the 3×3 sums do
//! not (as any reordering of a sum can), with values within a small factor of the largest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use gemm::Parallelism;

use super::{
    out_of_memory, parallel_items, zeroed, Geometry, Job, Plan, Product, Raw, Scratch, Wide,
    COL_BYTES, NO_REPACK_COLS,
};
use crate::backends::cpu::host::{with_simd, Ctx, Element, Real};
use crate::backends::cpu::simd::SimdLevel;
use crate::error::Result;

/// Positions of a 4×4 transform.
const XI: usize = 16;

/// Tiles the transforms compute at a time, along a tile row.
const LANES: usize = 8;

/// Planes of at most this many tiles are one block each (their products would be too narrow
/// split), the team sharing out each block's 16 products when there are fewer blocks than threads.
const WHOLE_PLANE: usize = 256;

/// The fewest input and output channels the Winograd path is chosen for by default: below, the
/// 16 GEMMs are too thin for their transforms to pay.
const MIN_CHANNELS: usize = 16;

/// The most elements of transformed filters (`16·K·C`) the path builds.
const MAX_FILTER: usize = 1 << 23;

/// Whether `g` can take the Winograd path at all: a 3×3 window at stride 1 and dilation 1, one
/// group, input channels, and transformed operands of bounded size.
pub(super) fn applies(g: &Geometry, elem: usize) -> bool {
    let tw = g.ow.div_ceil(2);
    g.r == 3
        && g.s == 3
        && g.stride == [1, 1]
        && g.dilation == [1, 1]
        && g.groups == 1
        && g.c > 0
        && XI.saturating_mul(g.k).saturating_mul(g.c) <= MAX_FILTER
        // One tile row of transformed input and products fits a work item's budget eight times.
        && XI
            .saturating_mul(g.c + g.k)
            .saturating_mul(tw)
            .saturating_mul(elem)
            <= 8 * COL_BYTES
}

/// Whether the Winograd path is this backend's default for `g`: it applies and both channel
/// counts reach [`MIN_CHANNELS`].
pub(super) fn preferred(g: &Geometry, elem: usize) -> bool {
    applies(g, elem) && g.c >= MIN_CHANNELS && g.k >= MIN_CHANNELS
}

/// How the Winograd path splits its work.
#[derive(Clone, Copy, Debug)]
struct Tiling {
    /// Tile rows and columns of an output plane.
    th: usize,
    tw: usize,
    /// Tile rows per block.
    rows: usize,
    /// Blocks per image.
    blocks: usize,
    /// Items run in parallel (else in turn, with `inner` parallelism in each GEMM).
    parallel: bool,
    inner: Parallelism,
}

impl Tiling {
    fn new(g: &Geometry, threads: usize, elem: usize) -> Tiling {
        let (th, tw) = (g.oh.div_ceil(2), g.ow.div_ceil(2));
        let per_row = XI * (g.c + g.k) * tw * elem;
        let mut rows = (2 * COL_BYTES / per_row.max(1)).clamp(1, th);
        let threaded = threads > 1;
        if th * tw <= WHOLE_PLANE && per_row.saturating_mul(th) <= 8 * COL_BYTES {
            // A small plane stays whole: its products are narrow enough already.
            rows = th;
        } else if threaded {
            // Enough items for every thread, twice over, while there are tile rows to split.
            let want = (2 * threads).div_ceil(g.n);
            rows = rows.min(th.div_ceil(want)).max(1);
        }
        let blocks = th.div_ceil(rows);
        let parallel = threaded && g.n * blocks >= threads;
        let inner = if threaded && !parallel {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        Tiling {
            th,
            tw,
            rows,
            blocks,
            parallel,
            inner,
        }
    }

    /// Length of the even (and of the odd) padded columns of a band row: the tiles of a row in
    /// whole groups of [`LANES`], and the one column past the last that tile `t` reads at `t + 1`.
    fn band_width(&self) -> usize {
        self.tw.next_multiple_of(LANES) + 1
    }
}

/// Per-task buffers of the Winograd path.
struct Buffers<A> {
    /// Transformed input of a block, `[16][C][tiles]`, each of the 16 followed by [`LANES`] spare
    /// elements.
    v: Vec<A>,
    /// Products of a block, `[16][K][tiles]`, each of the 16 followed by [`LANES`] spare elements.
    m: Vec<A>,
    /// The block's input rows of one channel, zero-padded, each split into its even and odd
    /// padded columns: `[rows][2][band_width]`.
    band: Vec<A>,
    /// Two output rows in the compute type (half types).
    out: Vec<A>,
    /// Output positions of a block at most.
    block_outputs: usize,
    /// The im2col path's buffers, for blocks with non-finite transforms.
    fallback: Option<(Plan, Scratch<A>)>,
}

/// A set of [`Buffers`] taken from a pool (or made, when the pool is empty) and given back when
/// dropped; `buffers` is `None` when making them failed.
struct Lease<'a, A> {
    pool: &'a Mutex<Vec<Buffers<A>>>,
    buffers: Option<Buffers<A>>,
}

impl<'a, A> Lease<'a, A> {
    fn take(pool: &'a Mutex<Vec<Buffers<A>>>, make: impl FnOnce() -> Result<Buffers<A>>) -> Self {
        let free = pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        Lease {
            pool,
            buffers: free.or_else(|| make().ok()),
        }
    }
}

impl<A> Drop for Lease<'_, A> {
    fn drop(&mut self) {
        if let Some(b) = self.buffers.take() {
            self.pool.lock().unwrap_or_else(|e| e.into_inner()).push(b);
        }
    }
}

impl<A: Real> Buffers<A> {
    fn new(g: &Geometry, t: &Tiling) -> Result<Buffers<A>> {
        let tiles = t.rows * t.tw;
        Ok(Buffers {
            v: zeroed(XI * (g.c * tiles + LANES))?,
            m: zeroed(XI * (g.k * tiles + LANES))?,
            band: zeroed((2 * t.rows + 2) * 2 * t.band_width())?,
            out: zeroed(2 * g.ow)?,
            block_outputs: 2 * t.rows * g.ow,
            fallback: None,
        })
    }
}

/// Filters a work item of the filter transform takes: a multiple of [`LANES`].
const FILTERS_PER_ITEM: usize = 2048;

/// Elements between the starts of two positions' transformed filters, `U_ξ` and `U_ξ+1`: their
/// `K·C` and [`U_PAD`].
fn filter_stride(kc: usize) -> usize {
    kc + U_PAD
}

/// Spare elements after each position's transformed filters. With `K·C` a multiple of a large
/// power of two (256 · 256), the 16 positions written side by side by the filter transform would
/// otherwise map to one set of the L1 and L2 caches and evict each other's lines between the two
/// halves of a line's writes.
const U_PAD: usize = 16;

/// `U = G·g·Gᵀ` of every filter, `[16][K][C]` with [`filter_stride`] elements from one position
/// to the next, with `G = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1]`, on the team when `parallel`; `None`
/// when a transformed value is not finite.
fn filters<A: Real>(weight: &[A], ctx: Ctx, parallel: bool) -> Result<Option<Vec<A>>> {
    let kc = weight.len() / 9;
    let stride = filter_stride(kc);
    let len = XI * stride;
    let mut u: Vec<A> = Vec::new();
    u.try_reserve_exact(len)
        .map_err(|_| out_of_memory::<A>(len))?;
    let dst = Raw {
        ptr: u.as_mut_ptr(),
        len,
    };
    let finite = AtomicBool::new(true);
    let range = |item: usize| {
        let f0 = item * FILTERS_PER_ITEM;
        let f1 = kc.min(f0 + FILTERS_PER_ITEM);
        // SAFETY: filters f0..f1 write only their own elements of `dst` (inside its capacity).
        let ok = with_simd(
            ctx.simd,
            #[inline(always)]
            || unsafe { filter_range(weight, f0..f1, stride, dst) },
        );
        if !ok {
            finite.store(false, Ordering::Relaxed);
        }
    };
    let items = kc.div_ceil(FILTERS_PER_ITEM);
    if parallel && items > 1 {
        parallel_items(items, ctx.threads)
            .try_for_each_init(
                || (),
                |_, item| {
                    range(item);
                    Ok::<(), ()>(())
                },
            )
            .ok();
    } else {
        (0..items).for_each(range);
    }
    // The pads are never read; zeroed, so that the whole vector is initialised.
    for xi in 0..XI {
        // SAFETY: inside the capacity, written by no task.
        unsafe { dst.ptr.add(xi * stride + kc).write_bytes(0, U_PAD) };
    }
    // SAFETY: the ranges above cover every filter and wrote all 16 positions of each, the loop
    // above the pads.
    unsafe { u.set_len(len) };
    Ok(finite.into_inner().then_some(u))
}

/// Filters [`filter_range`] stages tap-major at a time: a multiple of [`LANES`].
const STAGED: usize = 256;

/// The transforms of filters `range` into `dst`, `[16][stride]`; false when one is not
/// finite.
///
/// Filters are read in blocks of [`STAGED`], each first copied tap-major (`taps[r][i]`, tap `r`
/// of the block's filter `i`; the tail of a last short block zero) so that the transform reads
/// `LANES` filters' tap as one vector: gathering it from the filters' rows of 9 instead built
/// each vector lane by lane, and cost more than the transform.
///
/// # Safety
/// `dst` holds `16·stride` elements (initialised or not), `stride` at least the number of filters,
/// that no other task writes at these filters' positions meanwhile.
#[inline(always)]
unsafe fn filter_range<A: Real>(
    weight: &[A],
    range: std::ops::Range<usize>,
    stride: usize,
    dst: Raw<A>,
) -> bool {
    let mut poison = [A::ZERO; LANES];
    let mut taps = [[A::ZERO; STAGED]; 9];
    for b0 in range.clone().step_by(STAGED) {
        let staged = STAGED.min(range.end - b0);
        for (i, w) in weight[9 * b0..9 * (b0 + staged)]
            .chunks_exact(9)
            .enumerate()
        {
            for (r, &w) in w.iter().enumerate() {
                taps[r][i] = w;
            }
        }
        for tap in &mut taps {
            tap[staged..].fill(A::ZERO);
        }
        for i0 in (0..staged).step_by(LANES) {
            let (f0, n) = (b0 + i0, LANES.min(staged - i0));
            let tap = |r: usize| lanes(&taps[r][i0..]);
            // Columns of G·g, then rows of (G·g)·Gᵀ.
            // Spelled out: `array::from_fn`'s closure is not inlined into the SIMD context.
            let col = |j: usize| by_g(tap(j), tap(3 + j), tap(6 + j));
            let (c0, c1, c2) = (&col(0), &col(1), &col(2));
            for (i, ((&a, &b), &c)) in c0.iter().zip(c1).zip(c2).enumerate() {
                let row = by_g(a, b, c);
                for (j, x) in row.iter().enumerate() {
                    let at = dst.ptr.wrapping_add((4 * i + j) * stride + f0);
                    if n == LANES {
                        // One vector store: a loop bounded by `n` compiles to a branch per lane.
                        // SAFETY: elements (4i + j, f0 .. f0 + LANES) of dst, this task's (see
                        // above).
                        unsafe { at.cast::<[A; LANES]>().write_unaligned(*x) };
                    } else {
                        for (l, &x) in x.iter().enumerate().take(n) {
                            // SAFETY: element (4i + j, f0 + l) of dst, this task's (see above).
                            unsafe { at.add(l).write(x) };
                        }
                    }
                    for l in 0..LANES {
                        poison[l] += x[l] * A::ZERO;
                    }
                }
            }
        }
    }
    poison.iter().all(|&p| p == A::ZERO)
}

/// `G` applied to three values (a row or a column of 3): `[a, ½(a + b + c), ½(a − b + c), c]`.
#[inline(always)]
fn by_g<A: Real>(a: [A; LANES], b: [A; LANES], c: [A; LANES]) -> [[A; LANES]; 4] {
    let half = [A::from_f64(0.5); LANES];
    let (mid, hb) = (mul(half, add(a, c)), mul(half, b));
    [a, add(mid, hb), sub(mid, hb), c]
}

impl<T: Wide> Job<'_, T> {
    /// The Winograd path (see the module doc); `Job::im2col_gemm` when a transformed filter is
    /// not finite.
    pub(super) fn winograd(&self, ctx: Ctx) -> Result<()> {
        let g = &self.g;
        let elem = std::mem::size_of::<T::Acc>();
        let tiling = Tiling::new(g, ctx.threads, elem);
        let threaded = tiling.parallel || !matches!(tiling.inner, Parallelism::None);
        let Some(u) = filters(self.weight, ctx, threaded)? else {
            return self.im2col_gemm(ctx);
        };
        let items = g.n * tiling.blocks;
        if tiling.parallel {
            // Jobs lease buffers from a pool, so that a call allocates one set per thread, not
            // one per job.
            let pool = Mutex::new(Vec::new());
            parallel_items(items, ctx.threads).try_for_each_init(
                || Lease::take(&pool, || Buffers::new(g, &tiling)),
                |lease, item| {
                    let buffers = lease
                        .buffers
                        .as_mut()
                        .ok_or_else(|| out_of_memory::<T::Acc>(XI * (g.c + g.k) * tiling.tw))?;
                    with_simd(
                        ctx.simd,
                        #[inline(always)]
                        || self.winograd_item(&u, item, &tiling, buffers, ctx.simd),
                    )
                },
            )
        } else {
            let mut buffers = Buffers::new(g, &tiling)?;
            for item in 0..items {
                with_simd(
                    ctx.simd,
                    #[inline(always)]
                    || self.winograd_item(&u, item, &tiling, &mut buffers, ctx.simd),
                )?;
            }
            Ok(())
        }
    }

    /// Work item `item`: one block of tile rows of one image.
    #[inline(always)]
    fn winograd_item(
        &self,
        u: &[T::Acc],
        item: usize,
        t: &Tiling,
        b: &mut Buffers<T::Acc>,
        simd: SimdLevel,
    ) -> Result<()> {
        let g = &self.g;
        let (img, block) = (item / t.blocks, item % t.blocks);
        let th0 = block * t.rows;
        let nt = t.rows.min(t.th - th0);
        let tiles = nt * t.tw;
        let (v_stride, m_stride) = (g.c * tiles + LANES, g.k * tiles + LANES);
        if !self.transform_input(img, th0, nt, t, b) {
            return self.fallback(img, th0, nt, b);
        }
        let (v, m) = (
            Raw {
                ptr: b.v.as_mut_ptr(),
                len: b.v.len(),
            },
            Raw {
                ptr: b.m.as_mut_ptr(),
                len: b.m.len(),
            },
        );
        let product = |xi: usize| {
            // The buffers whole (Sync), not their raw pointer fields.
            let (v, m) = (v, m);
            // SAFETY: lhs is U_ξ, [K, C]; rhs the block's V_ξ, [C, tiles]; dst its M_ξ,
            // [K, tiles], in a buffer of this task's own and written by this product only.
            unsafe {
                Product {
                    m: g.k,
                    n: tiles,
                    k: g.c,
                    dst: m.ptr.add(xi * m_stride),
                    dst_strides: (tiles, 1),
                    lhs: u.as_ptr().add(xi * filter_stride(g.k * g.c)),
                    lhs_strides: (g.c, 1),
                    rhs: v.ptr.add(xi * v_stride).cast_const(),
                    rhs_strides: (tiles, 1),
                    alpha: T::Acc::ONE,
                    accumulate: false,
                }
                .run_split(NO_REPACK_COLS, Parallelism::None);
            }
        };
        match t.inner {
            // One item at a time: the team shares out its 16 products.
            Parallelism::Rayon(threads) if threads > 1 => {
                parallel_items(XI, threads)
                    .try_for_each_init(
                        || (),
                        |_, xi| {
                            with_simd(
                                simd,
                                #[inline(always)]
                                || product(xi),
                            );
                            Ok::<(), ()>(())
                        },
                    )
                    .ok();
            }
            _ => (0..XI).for_each(product),
        }
        self.transform_output(img, th0, nt, t, b);
        Ok(())
    }

    /// `V = Bᵀ·d·B` of every input tile of tile rows `th0 .. th0 + nt` of image `img`, into `b.v`,
    /// with `Bᵀ = [1 0 −1 0; 0 1 1 0; 0 −1 1 0; 0 1 0 −1]`. False when an input is not finite or
    /// so large that a transformed value might not be.
    #[inline(always)]
    fn transform_input(
        &self,
        img: usize,
        th0: usize,
        nt: usize,
        t: &Tiling,
        b: &mut Buffers<T::Acc>,
    ) -> bool {
        let g = &self.g;
        let (tw, twp, hw) = (t.tw, t.band_width(), g.h * g.w);
        let tiles = nt * tw;
        let stride = g.c * tiles + LANES;
        let zero = T::Acc::ZERO;
        // Σ 4·x·0 over the block's inputs: 0 while every input is finite and at most a quarter
        // of the largest finite value (then so is every V, a sum of four ±x), NaN otherwise.
        let mut poison = [zero; LANES];
        for c in 0..g.c {
            // SAFETY: plane c of image img is inside the input, which nothing writes.
            let plane = unsafe { self.input.get((img * g.c + c) * hw, hw) };
            for (r, row) in b
                .band
                .chunks_exact_mut(2 * twp)
                .take(2 * nt + 2)
                .enumerate()
            {
                let iy = (2 * th0 + r) as isize - g.padding[0] as isize;
                let (even, odd) = row.split_at_mut(twp);
                even.fill(zero);
                odd.fill(zero);
                if (0..g.h as isize).contains(&iy) {
                    let x = &plane[iy as usize * g.w..][..g.w];
                    split_columns(x, g.padding[1], even, odd);
                    taint(row, &mut poison);
                }
            }
            for lt in 0..nt {
                let band = &b.band[2 * lt * 2 * twp..][..4 * 2 * twp];
                for t0 in (0..tw).step_by(LANES) {
                    // Columns 0..4 of the tiles t0 .. t0 + LANES: e[t], o[t], e[t + 1], o[t + 1].
                    let e0 = down(band, twp, t0);
                    let o0 = down(band, twp, twp + t0);
                    let e1 = down(band, twp, t0 + 1);
                    let o1 = down(band, twp, twp + t0 + 1);
                    let at = c * tiles + lt * tw + t0;
                    for i in 0..4 {
                        // Bᵀ along the rows.
                        let v = [
                            sub(e0[i], e1[i]),
                            add(o0[i], e1[i]),
                            sub(e1[i], o0[i]),
                            sub(o0[i], o1[i]),
                        ];
                        for (j, v) in v.iter().enumerate() {
                            // Lanes past the block's tiles land where later tiles (or the
                            // stride's padding) are written afterwards.
                            b.v[(4 * i + j) * stride + at..][..LANES].copy_from_slice(v);
                        }
                    }
                }
            }
        }
        poison.iter().all(|&p| p == zero)
    }

    /// `Y = Aᵀ·M·A` of every tile of the block, plus the bias, into the output, with
    /// `Aᵀ = [1 1 1 0; 0 1 −1 −1]`.
    #[inline(always)]
    fn transform_output(
        &self,
        img: usize,
        th0: usize,
        nt: usize,
        t: &Tiling,
        b: &mut Buffers<T::Acc>,
    ) {
        let g = &self.g;
        let (tw, p, ow) = (t.tw, g.p(), g.ow);
        let tiles = nt * tw;
        let stride = g.k * tiles + LANES;
        for k in 0..g.k {
            let bias = [self.bias.map_or(T::Acc::ZERO, |b| b[k]); LANES];
            for lt in 0..nt {
                let oy = 2 * (th0 + lt);
                let pair = if oy + 1 < g.oh { 2 } else { 1 };
                let at = (img * g.k + k) * p + oy * ow;
                // SAFETY: output rows oy and oy + 1 of plane k lie in this item's tile rows,
                // written by this task only.
                let out = unsafe { self.output.get_mut(at, pair * ow) };
                let (top, bottom) = match T::as_acc_mut(out) {
                    Some(acc) => acc.split_at_mut(ow),
                    None => b.out[..pair * ow].split_at_mut(ow),
                };
                let base = k * tiles + lt * tw;
                for t0 in (0..tw).step_by(LANES) {
                    // Lanes past the block's tiles read later tiles (or the stride's padding).
                    let m = |xi: usize| lanes(&b.m[xi * stride + base + t0..]);
                    let mut s = [[[T::Acc::ZERO; LANES]; 4]; 2];
                    let [top_sums, bottom_sums] = &mut s;
                    for (j, (s0, s1)) in top_sums.iter_mut().zip(bottom_sums).enumerate() {
                        let (m0, m1, m2, m3) = (m(j), m(4 + j), m(8 + j), m(12 + j));
                        *s0 = add(add(m0, m1), m2);
                        *s1 = sub(sub(m1, m2), m3);
                    }
                    for (a, dst) in [&mut *top, &mut *bottom].into_iter().enumerate().take(pair) {
                        let s = &s[a];
                        let y0 = add(add(add(s[0], s[1]), s[2]), bias);
                        let y1 = add(sub(sub(s[1], s[2]), s[3]), bias);
                        let mut both = [T::Acc::ZERO; 2 * LANES];
                        for l in 0..LANES {
                            both[2 * l] = y0[l];
                            both[2 * l + 1] = y1[l];
                        }
                        match dst.get_mut(2 * t0..2 * (t0 + LANES)) {
                            Some(whole) => whole.copy_from_slice(&both),
                            None => {
                                let rest = &mut dst[2 * t0..];
                                let n = rest.len();
                                rest.copy_from_slice(&both[..n]);
                            }
                        }
                    }
                }
                if !T::NATIVE {
                    // SAFETY: as above.
                    let out = unsafe { self.output.get_mut(at, pair * ow) };
                    T::narrow_slice(&b.out[..pair * ow], out);
                }
            }
        }
    }

    /// Output rows of tile rows `th0 .. th0 + nt` of image `img` by the im2col path.
    #[cold]
    fn fallback(&self, img: usize, th0: usize, nt: usize, b: &mut Buffers<T::Acc>) -> Result<()> {
        let g = &self.g;
        let (oy0, oy1) = (2 * th0, g.oh.min(2 * (th0 + nt)));
        let (p0, pb) = (oy0 * g.ow, (oy1 - oy0) * g.ow);
        if b.fallback.is_none() {
            let elem = std::mem::size_of::<T::Acc>();
            let plan = Plan::serial(g, elem, b.block_outputs);
            let scratch = Scratch::new::<T>(g, &plan)?;
            b.fallback = Some((plan, scratch));
        }
        let (plan, scratch) = b.fallback.as_mut().expect("set above");
        self.group_block(img, 0, p0, pb, plan, scratch);
        Ok(())
    }
}

/// The padded columns of input row `x` (left padding `pad`, zeros beyond the row) into `even`
/// (columns 0, 2, 4, …) and `odd` (1, 3, 5, …), as far as their length reaches; both arrive zeroed.
#[inline(always)]
fn split_columns<T: Element>(x: &[T], pad: usize, even: &mut [T::Acc], odd: &mut [T::Acc]) {
    let width = even.len() + odd.len();
    if pad >= width {
        return;
    }
    // Input columns that land in the padded span.
    let n = x.len().min(width - pad);
    let (mut slot, mut ix) = (pad / 2, 0);
    if pad % 2 == 1 && n > 0 {
        odd[slot] = x[0].widen();
        slot += 1;
        ix = 1;
    }
    let count = (n - ix) / 2;
    let xs = &x[ix..ix + 2 * count];
    let (es, os) = (&mut even[slot..][..count], &mut odd[slot..][..count]);
    for q in 0..count {
        es[q] = xs[2 * q].widen();
        os[q] = xs[2 * q + 1].widen();
    }
    if ix + 2 * count < n {
        even[slot + count] = x[n - 1].widen();
    }
}

/// `Bᵀ` down the columns of the 4 band rows in `band` (each `2·twp` long) at lanes `at ..
/// at + LANES` of each.
#[inline(always)]
fn down<A: Real>(band: &[A], twp: usize, at: usize) -> [[A; LANES]; 4] {
    let x = |q: usize| lanes(&band[2 * q * twp + at..]);
    let (x0, x1, x2, x3) = (x(0), x(1), x(2), x(3));
    [sub(x0, x2), add(x1, x2), sub(x2, x1), sub(x1, x3)]
}

/// Folds `4·x·0` of every `x` into `poison`, which stays 0 while each is finite and at most a
/// quarter of the largest finite value, and turns NaN otherwise.
#[inline(always)]
fn taint<A: Real>(xs: &[A], poison: &mut [A; LANES]) {
    let (four, zero) = (A::from_f64(4.0), A::ZERO);
    let mut chunks = xs.chunks_exact(LANES);
    for x in &mut chunks {
        for l in 0..LANES {
            poison[l] += x[l] * four * zero;
        }
    }
    for &x in chunks.remainder() {
        poison[0] += x * four * zero;
    }
}

/// `LANES` values from the start of `x`.
#[inline(always)]
fn lanes<A: Real>(x: &[A]) -> [A; LANES] {
    let mut v = [A::ZERO; LANES];
    v.copy_from_slice(&x[..LANES]);
    v
}

/// `a + b`, lane by lane.
#[inline(always)]
fn add<A: Real>(mut a: [A; LANES], b: [A; LANES]) -> [A; LANES] {
    for l in 0..LANES {
        a[l] += b[l];
    }
    a
}

/// `a · b`, lane by lane.
#[inline(always)]
fn mul<A: Real>(mut a: [A; LANES], b: [A; LANES]) -> [A; LANES] {
    for l in 0..LANES {
        a[l] = a[l] * b[l];
    }
    a
}

/// `a − b`, lane by lane.
#[inline(always)]
fn sub<A: Real>(mut a: [A; LANES], b: [A; LANES]) -> [A; LANES] {
    for l in 0..LANES {
        a[l] = a[l] - b[l];
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(n: usize, c: usize, hw: usize, k: usize) -> Geometry {
        Geometry {
            n,
            c,
            h: hw,
            w: hw,
            k,
            cg: c,
            r: 3,
            s: 3,
            oh: hw,
            ow: hw,
            groups: 1,
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
        }
    }

    #[test]
    fn small_planes_stay_whole_and_large_ones_split_within_the_budget() {
        // 14²: 49 tiles, one block; on one image the team shares out its products.
        let t = Tiling::new(&geometry(1, 256, 14, 256), 2, 4);
        assert!(t.rows == t.th && t.blocks == 1 && !t.parallel);
        assert!(matches!(t.inner, Parallelism::Rayon(2)));
        let t = Tiling::new(&geometry(8, 256, 14, 256), 2, 4);
        assert!(t.blocks == 1 && t.parallel && matches!(t.inner, Parallelism::None));
        // 56²: 784 tiles in blocks within the budget, at least two per thread.
        let t = Tiling::new(&geometry(1, 64, 56, 64), 2, 4);
        assert!(t.parallel && t.blocks >= 4 && t.blocks * t.rows >= t.th);
        assert!(XI * 128 * t.rows * t.tw * 4 <= 2 * COL_BYTES);
        let t = Tiling::new(&geometry(1, 64, 56, 64), 1, 4);
        assert!(!t.parallel && matches!(t.inner, Parallelism::None));
        assert!(t.blocks > 1 && XI * 128 * t.rows * t.tw * 4 <= 2 * COL_BYTES);
    }
}
