//! Winograd F(2×2, 3×3): 3×3 convolutions at stride 1 and dilation 1, ungrouped.
//!
//! The output is cut into 2×2 tiles; each reads a 4×4 input tile. With the filter transformed to
//! `U = G·g·Gᵀ` and every input tile to `V = Bᵀ·d·B` (both 4×4), an output tile is
//! `Aᵀ·(Σ_c U ⊙ V)·A`. Grouping the 16 positions ξ of the 4×4 transforms, the sum over input
//! channels becomes 16 GEMMs `M_ξ [K × tiles] = U_ξ [K × C] · V_ξ [C × tiles]`, 2.25 times fewer
//! multiply-adds than the 3×3 window's. The transforms only add, subtract and halve (exact scalings),
//! so the rounding error stays within a small factor of the direct sum's, well inside the f32 bound.
//!
//! The products run on the direct convolution's register tile (`tile.rs`): `CL` output channels
//! (two vectors of the SIMD level) × `P` tiles, summed over the input channels, reading the
//! transformed filters packed per block of `CL` output channels (`[16][C][CL]`, zero past `K`)
//! and the transformed input in place (`[16][C][tiles]`, one broadcast per tile). A block's
//! products are kept per tile (`[tile][16][CL]`), so that the output transform reads a tile's 16
//! positions as vectors along the channels and writes its 2×2 outputs channel by channel.
//!
//! Work is cut into groups of tiles whose transformed input fits [`GROUP_BYTES`] (several whole
//! images, or one block of tile rows of a large plane), or [`SMALL_GROUP_BYTES`] when that would
//! leave several threads fewer than [`GROUPS_PER_THREAD`] groups each and the transformed filters,
//! which every group reads, fit the cache ([`FILTER_IN_CACHE`]). A group runs in two steps: its input
//! transform, shared out by input channels; then its products and output transform, shared out by
//! blocks of output channels (and of tiles, when there are too few blocks for the threads). With
//! at least two groups per thread the threads take whole groups instead. The filters are
//! transformed once per call, except when one group in one piece is the whole convolution (a
//! single small image): then each block of output channels transforms its own filters just
//! before its products, which read them from the cache instead of from memory. The transformed
//! input and filters and the products' buffers are kept between calls (`scratch`): every element
//! of them is written before it is read, so a call neither allocates nor zeroes them when the
//! previous call's fit.
//!
//! Non-finite values: a group's image or block with an input that is not finite, or larger than
//! a quarter of the type's largest finite value (so that a transform might overflow), is computed
//! again by the im2col path: the transforms would otherwise turn one infinite input into NaN in
//! outputs whose 3×3 window does not read it. A weight that is not finite, or larger than a
//! quarter of the largest finite value, sends the whole convolution to the im2col path. Finite
//! inputs below that bound can still overflow in the products `M` where the 3×3 sums do not (as
//! any reordering of a sum can), with values within a small factor of the largest.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use super::tile::{tile, Channels, Taps};
use super::{
    out_of_memory, parallel_items, zeroed, Geometry, Job, Plan, Raw, Scratch, Wide, COL_BYTES,
};
use crate::backends::cpu::host::{Ctx, Real};
use crate::backends::cpu::scratch;
use crate::backends::cpu::simd::SimdLevel;
use crate::backends::cpu::team::par_chunks_mut;
use crate::backends::cpu::vector::{on_vectors, Registers, Step, Vector, PORTABLE_LANES};
use crate::error::Result;

/// Positions of a 4×4 transform.
const XI: usize = 16;

/// The fewest input and output channels the Winograd path is chosen for by default: below, the
/// 16 GEMMs are too thin for their transforms to pay.
const MIN_CHANNELS: usize = 16;

/// The fewest output tiles a call must have (all images together) for the Winograd path to be
/// chosen by default: each call transforms every filter, work that only enough tiles repay (a
/// single 7×7 image, 16 tiles, runs faster through im2col).
const MIN_TILES: usize = 32;

/// The most elements of transformed filters (`16·K·C`) the path builds.
const MAX_FILTER: usize = 1 << 23;

/// Bytes of transformed input a group of tiles holds at most (unless one tile row is larger):
/// it stays in each core's L2 cache while every block of output channels reads it.
const GROUP_BYTES: usize = 1 << 20;

/// Groups per thread below which the threads' share of whole groups is too uneven: a thread
/// that starts late leaves most of them to the others.
const GROUPS_PER_THREAD: usize = 4;

/// Bytes of transformed input a group holds at most when [`GROUP_BYTES`] would give each of
/// several threads fewer than [`GROUPS_PER_THREAD`] groups and the transformed filters fit
/// [`FILTER_IN_CACHE`]: smaller groups share out more evenly, and each rereads the filters
/// from the cache.
const SMALL_GROUP_BYTES: usize = 1 << 18;

/// The most bytes of transformed filters (`16·K·C`) that smaller groups may reread: beyond it
/// each group would read them from memory again.
const FILTER_IN_CACHE: usize = 1 << 20;

/// Tiles per register tile of the products, by preference, with 16 vector registers and with 32
/// (AVX-512): the first is the widest the registers hold beside two vectors of channels; a group
/// whose tiles it would end with a short register tile takes the narrowest one that splits them
/// as evenly (49 tiles: 5 × 10, not 4 × 12 and 1).
const PRODUCT_TILES: [[usize; 4]; 2] = [[6, 5, 4, 3], [12, 10, 8, 6]];

/// Lanes of the widest vector any level runs on here (16 f32 of AVX-512).
const MAX_LANES: usize = 16;

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

/// Whether the Winograd path is this backend's default for `g`: it applies, both channel
/// counts reach [`MIN_CHANNELS`] and the call has at least [`MIN_TILES`] tiles.
pub(super) fn preferred(g: &Geometry, elem: usize) -> bool {
    applies(g, elem)
        && g.c >= MIN_CHANNELS
        && g.k >= MIN_CHANNELS
        && g.n
            .saturating_mul(g.oh.div_ceil(2))
            .saturating_mul(g.ow.div_ceil(2))
            >= MIN_TILES
}

/// Lanes of the vectors the products run on at `simd` (see `Job::block_products`).
fn vector_lanes(simd: SimdLevel, elem: usize) -> usize {
    match simd {
        SimdLevel::Avx512 => 64 / elem,
        SimdLevel::Avx2Fma => 32 / elem,
        _ => PORTABLE_LANES,
    }
}

/// How the Winograd path lays out and splits its work.
#[derive(Clone, Debug)]
struct Tiling {
    /// Tile rows and columns of an output plane.
    th: usize,
    tw: usize,
    /// Tile rows per block of a plane, and blocks per plane.
    rows: usize,
    blocks: usize,
    /// Work items (image, block) per group (several only when a block is a whole plane), and
    /// groups.
    per_group: usize,
    groups: usize,
    /// Tiles of a whole group.
    tiles: usize,
    /// Panels of `P` tiles a group's transformed input is laid out in (the last one padded).
    panels: usize,
    /// Tiles (`P`) and output channels (`CL`, two vectors) of the products' register tile.
    p: usize,
    cl: usize,
    /// Blocks of `CL` output channels.
    kblocks: usize,
    /// Pieces a group's tiles are cut into for the products.
    chunks: usize,
    /// Whether the threads take whole groups (each on one thread).
    outer: bool,
    /// Whether each block of output channels transforms its own filters.
    fused: bool,
    /// Where the register tile reads input channel `c` of a panel: `c · P`.
    taps: Taps,
}

impl Tiling {
    /// The tiling of `g` on `threads` threads, with products on the vectors of `simd`, in
    /// `elem`-byte compute elements; `OutOfMemory` when its offsets cannot be allocated.
    fn new(g: &Geometry, threads: usize, simd: SimdLevel, elem: usize) -> Result<Tiling> {
        let (th, tw) = (g.oh.div_ceil(2), g.ow.div_ceil(2));
        let per_row = XI * g.c * tw * elem;
        // (blocks per plane, items per group, groups) within a budget of `bytes`.
        let cut = |bytes: usize| {
            let blocks = th.div_ceil((bytes / per_row.max(1)).clamp(1, th));
            let per_group = if blocks == 1 {
                (bytes / (per_row * th).max(1)).clamp(1, g.n)
            } else {
                1
            };
            (blocks, per_group, (g.n * blocks).div_ceil(per_group))
        };
        let mut layout = cut(GROUP_BYTES);
        let filters = XI
            .saturating_mul(g.k)
            .saturating_mul(g.c)
            .saturating_mul(elem);
        if threads > 1 && layout.2 < GROUPS_PER_THREAD * threads && filters <= FILTER_IN_CACHE {
            layout = cut(SMALL_GROUP_BYTES);
        }
        let (blocks, per_group, groups) = layout;
        let rows = th.div_ceil(blocks);
        let tiles = per_group * rows * tw;
        let cl = 2 * vector_lanes(simd, elem);
        let kblocks = g.k.div_ceil(cl);
        let widths = PRODUCT_TILES[usize::from(simd == SimdLevel::Avx512)];
        let even = tiles.div_ceil(tiles.div_ceil(widths[0]));
        let p = widths
            .iter()
            .rev()
            .copied()
            .find(|&p| p >= even)
            .unwrap_or(widths[0]);
        let outer = threads > 1 && groups >= 2 * threads;
        let chunks = if threads > 1 && !outer && kblocks < 2 * threads {
            (2 * threads).div_ceil(kblocks).min(tiles.div_ceil(p))
        } else {
            1
        };
        let mut at = Vec::new();
        at.try_reserve_exact(g.c)
            .map_err(|_| out_of_memory::<usize>(g.c))?;
        at.extend((0..g.c).map(|c| c * p));
        Ok(Tiling {
            th,
            tw,
            rows,
            blocks,
            per_group,
            groups,
            tiles,
            panels: tiles.div_ceil(p),
            p,
            cl,
            kblocks,
            chunks,
            outer,
            fused: groups == 1 && chunks == 1,
            taps: Taps::new(at, p),
        })
    }

    /// The items of group `group` of a convolution of `n` images: the first, how many, and
    /// their tile rows (the same for all).
    fn members(&self, group: usize, n: usize) -> (usize, usize, usize) {
        let first = group * self.per_group;
        let count = self.per_group.min(n * self.blocks - first);
        let th0 = (first % self.blocks) * self.rows;
        (first, count, self.rows.min(self.th - th0))
    }

    /// Image and first tile row of item `item`.
    fn item(&self, item: usize) -> (usize, usize) {
        (item / self.blocks, (item % self.blocks) * self.rows)
    }

    /// Tiles of piece `chunk` of a group of `tiles`, whole register tiles but for the last.
    fn chunk(&self, tiles: usize, chunk: usize) -> Range<usize> {
        let per = tiles.div_ceil(self.p).div_ceil(self.chunks) * self.p;
        (chunk * per).min(tiles)..((chunk + 1) * per).min(tiles)
    }

    /// Elements of a group's transformed input: `[16][panels][C][P]`.
    fn v_len(&self, g: &Geometry) -> usize {
        XI * self.panels * g.c * self.p
    }

    /// Tiles of a piece at most.
    fn chunk_tiles(&self) -> usize {
        self.tiles.div_ceil(self.p).div_ceil(self.chunks) * self.p
    }

    /// Elements of one block's transformed filters, `[16][C][CL]`.
    fn block_len(&self, g: &Geometry) -> usize {
        XI * position_stride(g.c, self.cl)
    }

    /// Length of the even (and of the odd) padded columns of a band row: the tiles of a row,
    /// and a vector of [`MAX_LANES`] past the last, which the input transform's loads at `t + 1`
    /// reach.
    fn band_width(&self) -> usize {
        self.tw + MAX_LANES
    }

    /// Elements of a band: the input rows of a block of tile rows, each split in two, and one
    /// padded row before its split.
    fn band_len(&self) -> usize {
        (2 * self.rows + 3) * 2 * self.band_width()
    }
}

/// Buffers of one task of the Winograd path.
struct Buffers<A> {
    /// A group's transformed input, `[16][panels][C][P]`, when the task runs whole groups (empty
    /// otherwise: the call's one is shared).
    v: Vec<A>,
    /// Products of one block of output channels over a piece of a group's tiles,
    /// `[tile][16][CL]`.
    m: Vec<A>,
    /// One block's transformed filters, `[16][C][CL]`, when blocks transform their own (empty
    /// otherwise).
    u: Vec<A>,
    /// The input rows of one channel of a block, zero-padded, each split into its even and odd
    /// padded columns, `[2·rows + 2][2][band_width]`, then one padded row before its split.
    band: Vec<A>,
    /// Output positions of a work item at most.
    block_outputs: usize,
    /// The im2col path's buffers, for items with non-finite transforms.
    fallback: Option<(Plan, Scratch<A>)>,
}

impl<A: Real> Buffers<A> {
    /// Buffers for `g` tiled by `t`, with a group's transformed input when `with_v`: kept ones
    /// (see `scratch`) resized, else new ones, zeroed where they grow. `OutOfMemory` when they
    /// cannot be allocated.
    fn new(g: &Geometry, t: &Tiling, with_v: bool) -> Result<Buffers<A>> {
        let mut b = scratch::take::<Buffers<A>>().unwrap_or_else(|| Buffers {
            v: Vec::new(),
            m: Vec::new(),
            u: Vec::new(),
            band: Vec::new(),
            block_outputs: 0,
            fallback: None,
        });
        // Each part is written before it is read (the input transform zeroes the padding of a
        // group's last panel in `v`): what a kept buffer holds does not matter.
        if with_v {
            resize(&mut b.v, t.v_len(g))?;
        }
        resize(&mut b.m, t.chunk_tiles() * XI * t.cl)?;
        if t.fused {
            resize(&mut b.u, t.block_len(g))?;
        }
        resize(&mut b.band, t.band_len())?;
        b.block_outputs = 2 * t.rows * g.ow;
        b.fallback = None;
        Ok(b)
    }

    /// Keeps these buffers for a later call (see `scratch`), without the im2col path's, which
    /// fit one geometry only.
    fn keep(mut self) {
        self.fallback = None;
        let elements = self.v.capacity() + self.m.capacity() + self.u.capacity();
        let bytes = (elements + self.band.capacity()) * std::mem::size_of::<A>();
        scratch::keep(self, bytes);
    }
}

/// Sets the length of `v` to `n`, zeroing the elements it gains; `OutOfMemory` when it cannot
/// grow.
fn resize<A: Real>(v: &mut Vec<A>, n: usize) -> Result<()> {
    v.try_reserve_exact(n.saturating_sub(v.len()))
        .map_err(|_| out_of_memory::<A>(n))?;
    v.resize(n, A::ZERO);
    Ok(())
}

/// The transformed input of a call whose groups run one after another (`INPUT`), or its
/// transformed filters (`FILTERS`), kept between calls (see `scratch`) by kind.
struct Kept<A, const KIND: u8>(Vec<A>);

/// [`Kept`]'s kinds.
const INPUT: u8 = 0;
const FILTERS: u8 = 1;

impl<A: Real, const KIND: u8> Kept<A, KIND> {
    /// `n` elements, kept ones where there are (their values are unspecified), zero where they
    /// grow; `OutOfMemory` when they cannot be allocated.
    fn take(n: usize) -> Result<Vec<A>> {
        let mut v = scratch::take::<Kept<A, KIND>>().map_or_else(Vec::new, |k| k.0);
        resize(&mut v, n)?;
        Ok(v)
    }

    /// Keeps `v` for a later [`Kept::take`].
    fn keep(v: Vec<A>) {
        let bytes = v.capacity() * std::mem::size_of::<A>();
        scratch::keep(Kept::<A, KIND>(v), bytes);
    }
}

/// Fills the store of kept scratch (see `scratch`) with buffers of every kind this path keeps for
/// `A`, `elements` long and each holding `nan`: a later call must read nothing a kept buffer held.
#[cfg(test)]
pub(super) fn keep_poisoned_scratch<A: Real>(nan: A, elements: usize) {
    for _ in 0..4 {
        Kept::<A, INPUT>::keep(vec![nan; elements]);
        Kept::<A, FILTERS>::keep(vec![nan; elements]);
        let b = Buffers {
            v: vec![nan; elements],
            m: vec![nan; elements],
            u: vec![nan; elements],
            band: vec![nan; elements],
            block_outputs: 0,
            fallback: None,
        };
        b.keep();
    }
}

/// A set of [`Buffers`] for one task, kept (see `scratch`) when dropped; `buffers` is `None`
/// when making them failed.
struct Lease<A: Real> {
    buffers: Option<Buffers<A>>,
}

impl<A: Real> Lease<A> {
    /// Buffers as [`Buffers::new`] makes them.
    fn take(g: &Geometry, t: &Tiling, with_v: bool) -> Self {
        Lease {
            buffers: Buffers::new(g, t, with_v).ok(),
        }
    }
}

impl<A: Real> Drop for Lease<A> {
    fn drop(&mut self) {
        if let Some(b) = self.buffers.take() {
            b.keep();
        }
    }
}

/// What every group of one call shares.
struct Run<'a, A> {
    t: &'a Tiling,
    /// Every block's transformed filters, `[block][16][C][CL]`, unless blocks transform their
    /// own.
    shared: Option<&'a [A]>,
    /// The bias, zero past `K` to the end of the last block.
    bias: &'a [A],
    /// Set when a block's own filter transform was not finite.
    bad_filter: AtomicBool,
}

/// The elements of `v`, shared by the tasks of one group (see `Raw`).
fn raw<A>(v: &mut [A]) -> Raw<A> {
    Raw {
        ptr: v.as_mut_ptr(),
        len: v.len(),
    }
}

/// Elements between the starts of two positions of one block's transformed filters: the
/// position's `C · CL` values and 16 elements of unused skew (one 64-byte cache line of f32,
/// two of f64; a multiple of every vector width, so each position stays as aligned as the
/// first). Without the skew, the filter transform's 16 stores of one channel land `C · CL`
/// elements apart (32 KiB for 256 channels of f32), a multiple of the L1 cache's set stride,
/// and evict one another.
fn position_stride(c: usize, cl: usize) -> usize {
    c * cl + 16
}

/// Input channels [`filter_block`] stages at a time: their `9 · 16` taps are whole blocks of
/// every vector width's lanes.
const STAGED: usize = 16;

/// Output channels of a block at most: two vectors of 16 lanes.
const MAX_BLOCK: usize = 32;

/// [`filter_block`]'s arguments, as a [`Step`].
struct FilterBlock<'a, A> {
    weight: &'a [A],
    g: &'a Geometry,
    k0: usize,
    cl: usize,
    dst: &'a mut [A],
}

impl<A: Real> Step<A> for FilterBlock<'_, A> {
    type Out = bool;

    #[inline(always)]
    unsafe fn run<V: Vector<A>>(self) -> bool {
        filter_block::<A, V>(self.weight, self.g, self.k0, self.cl, self.dst)
    }
}

/// [`filter_block`] on the vectors of `simd`.
fn transform_filters<A: Registers>(
    simd: SimdLevel,
    weight: &[A],
    g: &Geometry,
    k0: usize,
    cl: usize,
    dst: &mut [A],
) -> bool {
    let step = FilterBlock {
        weight,
        g,
        k0,
        cl,
        dst,
    };
    // SAFETY: the filter transform has no contract beyond its vectors'.
    unsafe { on_vectors(simd, step) }
}

/// The transformed filters `U = G·g·Gᵀ` of output channels `k0 .. k0 + cl` (zero past `K`),
/// `[16][C][cl]` with positions [`position_stride`] apart, into `dst`, with
/// `G = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1]`; false when a weight is not finite or larger than a
/// quarter of the largest finite value (a transformed value is at most 2.25 times the largest
/// weight in magnitude, so below that bound none overflows). `dst` holds at least
/// `16 · position_stride(C, cl)` elements; `cl` is a multiple of `V::LANES`, at most
/// [`MAX_BLOCK`].
///
/// The filters of [`STAGED`] input channels at a time are first copied lane-minor
/// (`stage[c][tap][lane]`, a transposition of the weights' `[k][c][tap]`, in blocks of
/// `V::LANES × V::LANES` in registers), so that the transform reads one tap of `V::LANES` output
/// channels as one vector and writes each position's values where the products read them.
///
/// # Safety
/// As [`Vector`]'s methods for `V`.
#[inline(always)]
unsafe fn filter_block<A: Real, V: Vector<A>>(
    weight: &[A],
    g: &Geometry,
    k0: usize,
    cl: usize,
    dst: &mut [A],
) -> bool {
    assert!(cl.is_multiple_of(V::LANES) && cl <= MAX_BLOCK && V::LANES <= 16);
    let c = g.c;
    let plane = position_stride(c, cl);
    let dst = &mut dst[..XI * plane];
    let span_c = STAGED;
    let mut stage = [A::ZERO; 9 * STAGED * MAX_BLOCK];
    let (zero, half, four) = (
        V::zero(),
        V::splat(A::from_f64(0.5)),
        V::splat(A::from_f64(4.0)),
    );
    let mut poison = [zero; 3];
    let (row, l) = (9 * c, V::LANES);
    for c0 in (0..c).step_by(span_c) {
        let cs = span_c.min(c - c0);
        let (taps, whole) = (9 * cs, 9 * cs / l * l);
        let stage = &mut stage[..taps * cl];
        for l0 in (0..cl).step_by(l) {
            let lanes = l.min(g.k.saturating_sub(k0 + l0));
            for lane in 0..l {
                if c0 + span_c < c && lane < lanes {
                    // The next chunk's taps of this channel: the block reads `cl` rows of the
                    // weights side by side, more streams than the hardware prefetcher follows.
                    let k = k0 + l0 + lane;
                    prefetch(
                        &weight[k * row + 9 * (c0 + span_c)..][..9 * span_c.min(c - c0 - span_c)],
                    );
                }
            }
            if lanes == l {
                // Blocks of V::LANES channels × V::LANES taps, transposed in registers.
                let src = &weight[(k0 + l0) * row + 9 * c0..][..(l - 1) * row + taps];
                for q0 in (0..whole).step_by(l) {
                    let dst = &mut stage[q0 * cl + l0..][..(l - 1) * cl + l];
                    // SAFETY: rows i < l of `src` hold taps q0 .. q0 + l at i·row + q0, and
                    // rows j < l of `dst` lanes l0 .. l0 + l at j·cl; both slices are checked.
                    V::transpose(src.as_ptr().add(q0), row, dst.as_mut_ptr(), cl);
                }
            }
            for lane in 0..l {
                let k = k0 + l0 + lane;
                let from = if lanes == l { whole } else { 0 };
                let rows = stage[from * cl..].chunks_exact_mut(cl);
                if lane < lanes {
                    let w = &weight[k * row + 9 * c0 + from..][..taps - from];
                    for (dst, &w) in rows.zip(w) {
                        dst[l0 + lane] = w;
                    }
                } else {
                    for dst in rows {
                        dst[l0 + lane] = A::ZERO;
                    }
                }
            }
        }
        for ci in 0..cs {
            for l0 in (0..cl).step_by(l) {
                let taps = &stage[ci * 9 * cl + l0..][..8 * cl + l];
                // SAFETY: tap r's V::LANES values start at r·cl of `taps`, inside it.
                let tap = |r: usize| V::load(taps.as_ptr().add(r * cl));
                let g: [V; 9] = [
                    tap(0),
                    tap(1),
                    tap(2),
                    tap(3),
                    tap(4),
                    tap(5),
                    tap(6),
                    tap(7),
                    tap(8),
                ];
                // Σ 4·g·0, one sum per tap column so that the sums do not wait on each other.
                for (j, p) in poison.iter_mut().enumerate() {
                    for r in [j, 3 + j, 6 + j] {
                        *p = p.add(g[r].mul(four).mul(zero));
                    }
                }
                // Columns of G·g, then rows of (G·g)·Gᵀ.
                let c0s = by_g(g[0], g[3], g[6], half);
                let c1s = by_g(g[1], g[4], g[7], half);
                let c2s = by_g(g[2], g[5], g[8], half);
                let at = dst.as_mut_ptr().add((c0 + ci) * cl + l0);
                for i in 0..4 {
                    let row = by_g(c0s[i], c1s[i], c2s[i], half);
                    for (j, x) in row.into_iter().enumerate() {
                        // SAFETY: (4i + j)·plane + (c0 + ci)·cl + l0 + V::LANES ≤ 16·plane, the
                        // length of `dst` (checked above).
                        x.store(at.add((4 * i + j) * plane));
                    }
                }
            }
        }
    }
    let mut lanes = [A::ZERO; 16];
    poison[0]
        .add(poison[1])
        .add(poison[2])
        .store(lanes.as_mut_ptr());
    lanes.iter().all(|&p| p == A::ZERO)
}

/// Asks the cache for the lines of `xs` (a hint; nothing on targets without one here).
#[inline(always)]
fn prefetch<A>(xs: &[A]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(xs);
        let p = xs.as_ptr().cast::<i8>();
        for at in (0..bytes).step_by(64) {
            // SAFETY: a prefetch of an address inside `xs`; SSE is part of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(at)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = xs;
}

/// `G` applied to three vectors (a row or a column of 3): `[a, ½(a + b + c), ½(a − b + c), c]`.
///
/// # Safety
/// As [`Vector`]'s methods for `V`.
#[inline(always)]
unsafe fn by_g<A: Real, V: Vector<A>>(a: V, b: V, c: V, half: V) -> [V; 4] {
    let (mid, hb) = (a.add(c).mul(half), b.mul(half));
    [a, mid.add(hb), mid.sub(hb), c]
}

/// The 16 products of one block of output channels over tiles `range` of a group, into `m`
/// (`[tile − range.start][16][CL]`), on register tiles of `P` tiles chosen by `t.p`.
///
/// # Safety
/// As [`Vector`]'s methods for `V`.
#[inline(always)]
unsafe fn block_products<A: Real, V: Vector<A>>(
    u: &[A],
    v: &[A],
    range: Range<usize>,
    t: &Tiling,
    m: &mut [A],
) {
    match t.p {
        12 => products::<A, V, 12>(u, v, range, t, m),
        10 => products::<A, V, 10>(u, v, range, t, m),
        8 => products::<A, V, 8>(u, v, range, t, m),
        6 => products::<A, V, 6>(u, v, range, t, m),
        5 => products::<A, V, 5>(u, v, range, t, m),
        4 => products::<A, V, 4>(u, v, range, t, m),
        3 => products::<A, V, 3>(u, v, range, t, m),
        p => unreachable!("{p} tiles per register tile is not in PRODUCT_TILES"),
    }
}

/// [`block_products`] on register tiles of `P` tiles × two vectors of output channels: `u` is
/// the block's `[16][C][CL]`, `v` the group's `[16][panels][C][P]`.
///
/// # Safety
/// As [`Vector`]'s methods for `V`.
#[inline(always)]
unsafe fn products<A: Real, V: Vector<A>, const P: usize>(
    u: &[A],
    v: &[A],
    range: Range<usize>,
    t: &Tiling,
    m: &mut [A],
) {
    let cl = 2 * V::LANES;
    assert_eq!(cl, t.cl, "the tiling's channels are two vectors");
    let c = t.taps.terms();
    let (u_len, panel) = (c * cl, c * P);
    let stride = position_stride(c, cl);
    assert_eq!(P, t.p, "the tiling's panels");
    let m = &mut m[..range.len() * XI * cl];
    for xi in 0..XI {
        let ch = Channels {
            k0: 0,
            lanes: cl,
            weights: &u[xi * stride..][..u_len],
            bias: None,
        };
        let v = &v[xi * t.panels * panel..][..t.panels * panel];
        for t0 in range.clone().step_by(P) {
            // Panel t0 / P (t0 is a multiple of P), read whole.
            let sums = tile::<A, V, 2, P>(&v[t0 * c..][..panel], &t.taps, &ch);
            for (p, s) in sums.iter().enumerate().take(range.end - t0) {
                let dst = &mut m[((t0 - range.start + p) * XI + xi) * cl..][..cl];
                // SAFETY: two vectors of V::LANES = cl / 2 elements fill `dst`.
                s[0].store(dst.as_mut_ptr());
                s[1].store(dst.as_mut_ptr().add(V::LANES));
            }
        }
    }
}

impl<T: Wide> Job<'_, T> {
    /// The Winograd path (see the module doc); `Job::im2col_gemm` when a transformed filter is
    /// not finite.
    pub(super) fn winograd(&self, ctx: Ctx) -> Result<()> {
        let g = &self.g;
        let elem = std::mem::size_of::<T::Acc>();
        let t = Tiling::new(g, ctx.threads, ctx.simd, elem)?;
        let shared = if t.fused {
            None
        } else {
            match self.filters(&t, ctx)? {
                Some(u) => Some(u),
                None => return self.im2col_gemm(ctx),
            }
        };
        let mut bias = zeroed(t.kblocks * t.cl)?;
        if let Some(b) = self.bias {
            bias[..g.k].copy_from_slice(b);
        }
        let run = Run {
            t: &t,
            shared: shared.as_deref(),
            bias: &bias,
            bad_filter: AtomicBool::new(false),
        };
        if t.outer {
            let serial = Ctx { threads: 1, ..ctx };
            parallel_items(t.groups, ctx.threads).try_for_each_init(
                || Lease::take(g, &t, true),
                |lease, group| {
                    let b = lease
                        .buffers
                        .as_mut()
                        .ok_or_else(|| out_of_memory::<T::Acc>(t.v_len(g)))?;
                    let mut v = std::mem::take(&mut b.v);
                    let done = self.winograd_group(group, &run, serial, raw(&mut v), Some(b));
                    b.v = v;
                    done
                },
            )?;
        } else if ctx.threads > 1 {
            let mut v = Kept::<_, INPUT>::take(t.v_len(g))?;
            for group in 0..t.groups {
                self.winograd_group(group, &run, ctx, raw(&mut v), None)?;
            }
            Kept::<_, INPUT>::keep(v);
        } else {
            let mut lease = Lease::take(g, &t, true);
            let b = lease
                .buffers
                .as_mut()
                .ok_or_else(|| out_of_memory::<T::Acc>(t.v_len(g)))?;
            let mut v = std::mem::take(&mut b.v);
            let mut done = Ok(());
            for group in 0..t.groups {
                done = self.winograd_group(group, &run, ctx, raw(&mut v), Some(b));
                if done.is_err() {
                    break;
                }
            }
            b.v = v;
            done?;
        }
        let bad_filter = run.bad_filter.into_inner();
        if let Some(u) = shared {
            Kept::<_, FILTERS>::keep(u);
        }
        if bad_filter {
            return self.im2col_gemm(ctx);
        }
        Ok(())
    }

    /// Every block's transformed filters, `[block][16][C][CL]`, on the team when the call is
    /// threaded; `None` when one is not finite.
    fn filters(&self, t: &Tiling, ctx: Ctx) -> Result<Option<Vec<T::Acc>>> {
        let g = &self.g;
        let len = t.block_len(g);
        let mut u = Kept::<_, FILTERS>::take(t.kblocks * len)?;
        let finite = AtomicBool::new(true);
        let block = |kb: usize, dst: &mut [T::Acc]| {
            let ok = transform_filters(ctx.simd, self.weight, g, kb * t.cl, t.cl, dst);
            if !ok {
                finite.store(false, Ordering::Relaxed);
            }
        };
        if ctx.threads > 1 && t.kblocks > 1 {
            par_chunks_mut(&mut u, len, block);
        } else {
            u.chunks_mut(len)
                .enumerate()
                .for_each(|(kb, dst)| block(kb, dst));
        }
        if finite.into_inner() {
            Ok(Some(u))
        } else {
            Kept::<_, FILTERS>::keep(u);
            Ok(None)
        }
    }

    /// Group `group`: its input transform into `v` (`[16][panels][C][P]`), then its products and
    /// output transform by blocks of output channels, on the team unless `serial` buffers are
    /// given (then on this thread, with them); the im2col path for its items whose input is not
    /// finite.
    fn winograd_group(
        &self,
        group: usize,
        run: &Run<'_, T::Acc>,
        ctx: Ctx,
        v: Raw<T::Acc>,
        mut serial: Option<&mut Buffers<T::Acc>>,
    ) -> Result<()> {
        let (g, t) = (&self.g, run.t);
        let (first, count, nt) = t.members(group, g.n);
        let tiles = count * nt * t.tw;
        assert!(v.len >= t.v_len(g), "a group's transformed input");
        let finite: Vec<AtomicBool> = (0..count).map(|_| AtomicBool::new(true)).collect();
        let inputs = |cs: Range<usize>, band: &mut [T::Acc]| {
            for (j, finite) in finite.iter().enumerate() {
                let (img, th0) = t.item(first + j);
                let at = j * nt * t.tw;
                // SAFETY: this task alone writes channels `cs` of `v` (see `transform_input`).
                let ok = unsafe {
                    self.transform_input(ctx.simd, img, th0, nt, cs.clone(), at, t, v, band)
                };
                if !ok {
                    finite.store(false, Ordering::Relaxed);
                }
            }
        };
        match serial.as_deref_mut() {
            Some(b) => inputs(0..g.c, &mut b.band),
            None => {
                let per = g.c.div_ceil(g.c.min(4 * ctx.threads));
                parallel_items(g.c.div_ceil(per), ctx.threads).try_for_each_init(
                    || zeroed::<T::Acc>(t.band_len()),
                    |band, task| {
                        let band = band
                            .as_mut()
                            .map_err(|_| out_of_memory::<T::Acc>(t.band_len()))?;
                        inputs(task * per..g.c.min((task + 1) * per), band);
                        Ok::<(), crate::error::BackendError>(())
                    },
                )?;
            }
        }
        // SAFETY: the input transform has ended; nothing writes `v` until this group ends.
        let v = unsafe { std::slice::from_raw_parts(v.ptr.cast_const(), v.len) };
        let block = |item: usize, b: &mut Buffers<T::Acc>| {
            let (kb, chunk) = (item / t.chunks, item % t.chunks);
            let range = t.chunk(tiles, chunk);
            if range.is_empty() || run.bad_filter.load(Ordering::Relaxed) {
                return;
            }
            let Buffers { u: own, m, .. } = b;
            let u = match run.shared {
                Some(u) => &u[kb * t.block_len(g)..][..t.block_len(g)],
                None => {
                    let ok = transform_filters(ctx.simd, self.weight, g, kb * t.cl, t.cl, own);
                    if !ok {
                        run.bad_filter.store(true, Ordering::Relaxed);
                        return;
                    }
                    &own[..]
                }
            };
            self.block_products(ctx.simd, u, v, range.clone(), t, m);
            self.transform_output(ctx.simd, first, nt, kb, range, t, m, run.bias);
        };
        let items = t.kblocks * t.chunks;
        match serial.as_deref_mut() {
            Some(b) => (0..items).for_each(|item| block(item, b)),
            None => parallel_items(items, ctx.threads).try_for_each_init(
                || Lease::take(g, t, false),
                |lease, item| {
                    let b = lease
                        .buffers
                        .as_mut()
                        .ok_or_else(|| out_of_memory::<T::Acc>(t.chunk_tiles() * XI * t.cl))?;
                    block(item, b);
                    Ok::<(), crate::error::BackendError>(())
                },
            )?,
        }
        if finite.iter().all(|f| f.load(Ordering::Relaxed))
            || run.bad_filter.load(Ordering::Relaxed)
        {
            return Ok(());
        }
        let mut lease = None;
        let b = match serial {
            Some(b) => b,
            None => lease
                .insert(Lease::take(g, t, false))
                .buffers
                .as_mut()
                .ok_or_else(|| out_of_memory::<T::Acc>(t.chunk_tiles() * XI * t.cl))?,
        };
        for (j, finite) in finite.iter().enumerate() {
            if !finite.load(Ordering::Relaxed) {
                let (img, th0) = t.item(first + j);
                self.fallback(img, th0, nt, b)?;
            }
        }
        Ok(())
    }

    /// [`block_products`] on the vectors of `simd`.
    fn block_products(
        &self,
        simd: SimdLevel,
        u: &[T::Acc],
        v: &[T::Acc],
        range: Range<usize>,
        t: &Tiling,
        m: &mut [T::Acc],
    ) {
        let step = BlockProducts { u, v, range, t, m };
        // SAFETY: the products have no contract beyond their vectors'.
        unsafe { on_vectors(simd, step) }
    }

    /// [`transform_input`] on the vectors of `simd`.
    ///
    /// # Safety
    /// As [`transform_input`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn transform_input(
        &self,
        simd: SimdLevel,
        img: usize,
        th0: usize,
        nt: usize,
        cs: Range<usize>,
        at: usize,
        t: &Tiling,
        v: Raw<T::Acc>,
        band: &mut [T::Acc],
    ) -> bool {
        let x = Item { img, th0, nt, at };
        let step = InputTransform {
            job: self,
            x,
            cs,
            t,
            v,
            band,
        };
        // SAFETY: as this function's.
        unsafe { on_vectors(simd, step) }
    }

    /// [`transform_output`] on the vectors of `simd`.
    #[allow(clippy::too_many_arguments)]
    fn transform_output(
        &self,
        simd: SimdLevel,
        first: usize,
        nt: usize,
        kb: usize,
        range: Range<usize>,
        t: &Tiling,
        m: &[T::Acc],
        bias: &[T::Acc],
    ) {
        let o = Products { first, nt, kb, m };
        let step = OutputTransform {
            job: self,
            o,
            range,
            t,
            bias,
        };
        // SAFETY: the callers give each task its own blocks of channels or pieces of tiles.
        unsafe { on_vectors(simd, step) }
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

/// [`block_products`]' arguments, as a [`Step`].
struct BlockProducts<'a, A> {
    u: &'a [A],
    v: &'a [A],
    range: Range<usize>,
    t: &'a Tiling,
    m: &'a mut [A],
}

impl<A: Real> Step<A> for BlockProducts<'_, A> {
    type Out = ();

    #[inline(always)]
    unsafe fn run<V: Vector<A>>(self) {
        block_products::<A, V>(self.u, self.v, self.range, self.t, self.m)
    }
}

/// [`transform_input`]'s arguments, as a [`Step`].
struct InputTransform<'a, 'j, T: Wide> {
    job: &'a Job<'j, T>,
    x: Item,
    cs: Range<usize>,
    t: &'a Tiling,
    v: Raw<T::Acc>,
    band: &'a mut [T::Acc],
}

impl<T: Wide> Step<T::Acc> for InputTransform<'_, '_, T> {
    type Out = bool;

    #[inline(always)]
    unsafe fn run<V: Vector<T::Acc>>(self) -> bool {
        transform_input::<T, V>(self.job, self.x, self.cs, self.t, self.v, self.band)
    }
}

/// [`transform_output`]'s arguments, as a [`Step`].
struct OutputTransform<'a, 'j, T: Wide> {
    job: &'a Job<'j, T>,
    o: Products<'a, T::Acc>,
    range: Range<usize>,
    t: &'a Tiling,
    bias: &'a [T::Acc],
}

impl<T: Wide> Step<T::Acc> for OutputTransform<'_, '_, T> {
    type Out = ();

    #[inline(always)]
    unsafe fn run<V: Vector<T::Acc>>(self) {
        transform_output::<T, V>(self.job, self.o, self.range, self.t, self.bias)
    }
}

/// One work item's place in its group: image, first tile row and tile rows, and the group's
/// first tile of it.
#[derive(Clone, Copy)]
struct Item {
    img: usize,
    th0: usize,
    nt: usize,
    at: usize,
}

/// `V = Bᵀ·d·B` of every input tile of channels `cs` of item `x`, into `v`, with `Bᵀ = [1 0 −1
/// 0; 0 1 1 0; 0 −1 1 0; 0 1 0 −1]`, computed on vectors of `V` along a run of tiles of one tile
/// row that lie in one panel, and stored with their lanes past the run masked. False when an
/// input is not finite or so large that a transformed value might not be.
///
/// # Safety
/// As [`Vector`]'s methods for `V`; `v` holds a group's `[16][panels][C][P]` elements, whose
/// channels `cs` no other task reads or writes meanwhile. Only the item's tiles are written, and
/// zeros past them to the end of their last panel.
#[inline(always)]
unsafe fn transform_input<T: Wide, V: Vector<T::Acc>>(
    job: &Job<'_, T>,
    x: Item,
    cs: Range<usize>,
    t: &Tiling,
    v: Raw<T::Acc>,
    band: &mut [T::Acc],
) -> bool {
    let g = &job.g;
    let (tw, twp, hw) = (t.tw, t.band_width(), g.h * g.w);
    let (p, panel) = (t.p, g.c * t.p);
    let position = t.panels * panel;
    let zero = T::Acc::ZERO;
    let pad = g.padding[1];
    // Even (and odd) columns of a row that hold inputs, in whole vectors: within a half row, as
    // the row's inputs reach at most one column past the last tile's.
    let span = (pad + g.w).div_ceil(2).next_multiple_of(V::LANES);
    assert!(
        V::LANES <= MAX_LANES && span <= twp && band.len() >= t.band_len() && x.nt <= t.rows,
        "a band too short for the item's vectors"
    );
    let (band, line) = band.split_at_mut((2 * t.rows + 2) * 2 * twp);
    let line = &mut line[..2 * span];
    // Σ 4·x·0 over the item's inputs: 0 while every input is finite and at most a quarter of the
    // largest finite value (then so is every V, a sum of four ±x), NaN otherwise.
    let (four, zero_v) = (V::splat(T::Acc::from_f64(4.0)), V::zero());
    let mut poison = V::zero();
    // The runs of tiles within one panel: tile row, first tile of the row, offset in a
    // position's panels (but for the channel's) and length, at most `P`.
    let mut runs = Vec::with_capacity(x.nt * (tw / p + 2));
    for lt in 0..x.nt {
        let mut t0 = 0;
        while t0 < tw {
            let q = x.at + lt * tw + t0;
            let len = (tw - t0).min(p - q % p);
            runs.push((lt, t0, q / p * panel + q % p, len));
            t0 += len;
        }
    }
    // The padding: rows above and below the plane, columns left and right of each row. Every
    // channel writes the same columns of the same rows, so it stays zero.
    band[..(2 * x.nt + 2) * 2 * twp].fill(zero);
    line.fill(zero);
    for c in cs {
        // SAFETY: plane c of image img is inside the input, which nothing writes.
        let plane = unsafe { job.input.get((x.img * g.c + c) * hw, hw) };
        for (r, row) in band
            .chunks_exact_mut(2 * twp)
            .take(2 * x.nt + 2)
            .enumerate()
        {
            let iy = (2 * x.th0 + r) as isize - g.padding[0] as isize;
            if !(0..g.h as isize).contains(&iy) {
                continue;
            }
            // The padded row, then its even and odd columns.
            let xs = &plane[iy as usize * g.w..][..g.w];
            for (d, &s) in line[pad..pad + g.w].iter_mut().zip(xs) {
                *d = s.widen();
            }
            let (even, odd) = row.split_at_mut(twp);
            for q in (0..span).step_by(V::LANES) {
                // SAFETY: columns 2q .. 2q + 2·V::LANES ≤ 2·span of the line, and lanes q ..
                // q + V::LANES ≤ span ≤ twp of each half row.
                let (e, o) = V::deinterleave(line.as_ptr().add(2 * q));
                e.store(even.as_mut_ptr().add(q));
                o.store(odd.as_mut_ptr().add(q));
                poison = poison
                    .add(e.mul(four).mul(zero_v))
                    .add(o.mul(four).mul(zero_v));
            }
        }
        let out = v.ptr.wrapping_add(c * p);
        for &(lt, t0, to, len) in &runs {
            // SAFETY: rows 2·lt .. 2·lt + 4 of the band, whose row is 2·twp long.
            let rows = band.as_ptr().add(2 * lt * 2 * twp);
            let mut l = 0;
            while l < len {
                let (n, col) = ((len - l).min(V::LANES), t0 + l);
                // Bᵀ down the columns of the 4 rows at band column `at`. SAFETY: each read
                // ends inside its half row, as `col + 1 + V::LANES ≤ tw + MAX_LANES = twp`.
                let down = |at: usize| {
                    let x = |q: usize| V::load(rows.add(2 * q * twp + at));
                    let (x0, x1, x2, x3) = (x(0), x(1), x(2), x(3));
                    [x0.sub(x2), x1.add(x2), x2.sub(x1), x1.sub(x3)]
                };
                // Columns 0..4 of the tiles: e[t], o[t], e[t + 1], o[t + 1].
                let (e0, o0) = (down(col), down(twp + col));
                let (e1, o1) = (down(col + 1), down(twp + col + 1));
                for i in 0..4 {
                    // Bᵀ along the rows.
                    let row = [
                        e0[i].sub(e1[i]),
                        o0[i].add(e1[i]),
                        e1[i].sub(o0[i]),
                        o0[i].sub(o1[i]),
                    ];
                    for (j, y) in row.into_iter().enumerate() {
                        let dst = out.wrapping_add((4 * i + j) * position + to + l);
                        // SAFETY: tiles q + l .. q + l + n of the run, inside one panel of
                        // channel c in position 4i + j of `v`, this task's (see above).
                        if n == V::LANES {
                            y.store(dst);
                        } else {
                            y.store_first(dst, n);
                        }
                    }
                }
                l += n;
            }
        }
        // The tiles past the item's in its last panel are zero, as the products read a panel
        // whole (the group's next item, if any, overwrites them).
        let end = x.at + x.nt * tw;
        if !end.is_multiple_of(p) {
            let (to, n) = (end / p * panel + end % p, p - end % p);
            for xi in 0..XI {
                // SAFETY: tiles `end ..` of the panel, inside it, of channel c: this task's.
                unsafe { std::slice::from_raw_parts_mut(out.wrapping_add(xi * position + to), n) }
                    .fill(zero);
            }
        }
    }
    let mut lanes = [zero; MAX_LANES];
    poison.store(lanes.as_mut_ptr());
    lanes.iter().all(|&p| p == zero)
}

/// One block's products over a piece of a group: the group's first item and its items' tile
/// rows, the block of output channels, and the products, `[tile − range.start][16][CL]`.
#[derive(Clone, Copy)]
struct Products<'a, A> {
    first: usize,
    nt: usize,
    kb: usize,
    m: &'a [A],
}

/// `Y = Aᵀ·M·A` of tiles `range` of the group of `o`, for its block of output channels, plus the
/// bias, into the output, with `Aᵀ = [1 1 1 0; 0 1 −1 −1]`: computed on vectors of `V` along the
/// channels, then written channel by channel (each channel's 2×2 outputs, clipped to the plane).
///
/// # Safety
/// As [`Vector`]'s methods for `V`; only this task writes the outputs of these tiles and channels.
#[inline(always)]
unsafe fn transform_output<T: Wide, V: Vector<T::Acc>>(
    job: &Job<'_, T>,
    o: Products<'_, T::Acc>,
    range: Range<usize>,
    t: &Tiling,
    bias: &[T::Acc],
) {
    let g = &job.g;
    let (tw, p, ow) = (t.tw, g.p(), g.ow);
    let (k0, cl) = (o.kb * t.cl, t.cl);
    let kn = cl.min(g.k - k0);
    let per_item = o.nt * tw;
    assert!(
        V::LANES <= MAX_LANES
            && cl.is_multiple_of(V::LANES)
            && bias.len() >= k0 + cl
            && o.m.len() >= range.len() * XI * cl,
        "products and bias of whole vectors"
    );
    for tile in range.clone() {
        let (img, th0) = t.item(o.first + tile / per_item);
        let within = tile % per_item;
        let (oy, ox) = (2 * (th0 + within / tw), 2 * (within % tw));
        let (right, below) = (ox + 1 < ow, oy + 1 < g.oh);
        let m = o.m.as_ptr().add((tile - range.start) * XI * cl);
        for kk in (0..kn).step_by(V::LANES) {
            // SAFETY: lanes kk .. kk + V::LANES ≤ cl of a tile's position xi (checked above).
            let m = |xi: usize| V::load(m.add(xi * cl + kk));
            let (mut top, mut bottom) = ([V::zero(); 4], [V::zero(); 4]);
            for j in 0..4 {
                let (m0, m1, m2, m3) = (m(j), m(4 + j), m(8 + j), m(12 + j));
                top[j] = m0.add(m1).add(m2);
                bottom[j] = m1.sub(m2).sub(m3);
            }
            // SAFETY: k0 + kk + V::LANES ≤ k0 + cl ≤ bias.len() (checked above).
            let b = V::load(bias.as_ptr().add(k0 + kk));
            let by_a = |s: [V; 4]| {
                [
                    s[0].add(s[1]).add(s[2]).add(b),
                    s[1].sub(s[2]).sub(s[3]).add(b),
                ]
            };
            let ([y00, y01], [y10, y11]) = (by_a(top), by_a(bottom));
            let mut y = [[T::Acc::ZERO; MAX_LANES]; 4];
            for (v, y) in [y00, y01, y10, y11].into_iter().zip(&mut y) {
                v.store(y.as_mut_ptr());
            }
            let base = (img * g.k + k0 + kk) * p + oy * ow + ox;
            let [y00, y01, y10, y11] = &y;
            let lanes = y00.iter().zip(y01).zip(y10).zip(y11);
            for (l, (((&y00, &y01), &y10), &y11)) in lanes.take(V::LANES.min(kn - kk)).enumerate() {
                let at = base + l * p;
                // SAFETY: the 2×2 outputs of this tile (clipped to the plane) of channel
                // k0 + kk + l lie inside the output; only this task writes them (tasks own
                // disjoint blocks of channels or pieces of tiles).
                unsafe {
                    job.output.at(at).write(T::narrow(y00));
                    if right {
                        job.output.at(at + 1).write(T::narrow(y01));
                    }
                    if below {
                        job.output.at(at + ow).write(T::narrow(y10));
                        if right {
                            job.output.at(at + ow + 1).write(T::narrow(y11));
                        }
                    }
                }
            }
        }
    }
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

    fn tiling(n: usize, c: usize, hw: usize, k: usize, threads: usize) -> Tiling {
        Tiling::new(&geometry(n, c, hw, k), threads, SimdLevel::Avx512, 4).unwrap()
    }

    #[test]
    fn groups_fit_the_budget_and_cover_every_item_once() {
        // 14², C256: one group of 49 tiles in five register tiles of 10 (not 12), each block of
        // 32 output channels transforming its own filters, on one thread and on two.
        for threads in [1, 2] {
            let t = tiling(1, 256, 14, 256, threads);
            assert!(
                t.groups == 1 && t.tiles == 49 && t.p == 10 && t.cl == 32,
                "{t:?}"
            );
            assert!(
                t.fused && t.chunks == 1 && !t.outer && t.kblocks == 8,
                "{t:?}"
            );
        }
        // Eight such images: a group each, taken whole by the threads; filters transformed once.
        let t = tiling(8, 256, 14, 256, 2);
        assert!(t.groups == 8 && t.outer && !t.fused, "{t:?}");
        // 56², C64: on one thread, four blocks of tile rows within the budget; on two, whose
        // threads would take two of those each, 14 blocks within the smaller budget (the 256 KiB
        // of transformed filters stay in the cache).
        let t = tiling(1, 64, 56, 64, 1);
        assert!(
            t.blocks == 4 && XI * 64 * t.rows * t.tw * 4 <= GROUP_BYTES && !t.outer,
            "{t:?}"
        );
        let t = tiling(1, 64, 56, 64, 2);
        assert!(
            t.blocks == 14 && XI * 64 * t.rows * t.tw * 4 <= SMALL_GROUP_BYTES,
            "{t:?}"
        );
        assert!(
            t.outer && !t.fused && t.groups >= GROUPS_PER_THREAD * 2,
            "{t:?}"
        );
        // Eight such images on two threads: 32 groups, enough at the full budget.
        let t = tiling(8, 64, 56, 64, 2);
        assert!(t.blocks == 4 && t.groups == 32 && t.outer, "{t:?}");
        // 28², C64: one group on one thread; four on two.
        let t = tiling(1, 64, 28, 64, 1);
        assert!(t.groups == 1 && t.chunks == 1 && t.fused, "{t:?}");
        let t = tiling(1, 64, 28, 64, 2);
        assert!(t.groups == 4 && t.outer && !t.fused, "{t:?}");
        // 14², C256 → 96: 1.5 MiB of transformed filters keep the full budget, one group, whose
        // three blocks of channels are cut in two pieces of tiles for two threads.
        let t = tiling(1, 256, 14, 96, 2);
        assert!(
            t.groups == 1 && t.chunks == 2 && !t.outer && !t.fused,
            "{t:?}"
        );
        // 7², C512: 16 tiles in two register tiles of 8.
        assert_eq!(tiling(1, 512, 7, 512, 1).p, 8);
        // Small planes share a group.
        let t = tiling(6, 16, 9, 16, 1);
        assert!(t.per_group == 6 && t.groups == 1, "{t:?}");
        for (n, hw, c) in [(3, 61, 24), (5, 22, 64), (7, 9, 16), (2, 14, 256)] {
            let t = tiling(n, c, hw, 16, 2);
            let mut seen = vec![0; n * t.blocks];
            for group in 0..t.groups {
                let (first, count, nt) = t.members(group, n);
                assert!(count * nt * t.tw <= t.tiles && count >= 1);
                seen[first..first + count].iter_mut().for_each(|s| *s += 1);
            }
            assert!(seen.iter().all(|&s| s == 1), "{n} {hw} {c}: {seen:?}");
        }
    }

    #[test]
    fn pieces_cover_a_group_in_whole_register_tiles() {
        let t = tiling(1, 256, 14, 96, 3);
        assert!(t.chunks > 1);
        for tiles in [1, t.p, t.p + 1, t.tiles] {
            let mut next = 0;
            for chunk in 0..t.chunks {
                let r = t.chunk(tiles, chunk);
                assert!(r.start == next.min(tiles) && r.len() <= t.chunk_tiles());
                assert!(r.end == tiles || r.len().is_multiple_of(t.p));
                next = r.end;
            }
            assert_eq!(next, tiles);
        }
    }
}
