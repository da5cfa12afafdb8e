//! Direct convolution for layers with few input channels per group: an image network's first
//! layer (grey, RGB or RGBA input, windows up to 7×7 or 11×11, often stride 2), where im2col would
//! build a patch matrix only `C·R·S` rows deep and pack it again for a GEMM whose inner dimension is
//! that short.
//!
//! The kernel holds a tile of `CL` output channels (two vector registers of the compute type: 16
//! f32 on AVX2, 32 on AVX-512; one register when a group has no more output channels than one
//! register holds) × `P` consecutive output pixels of a row (6 or 8 with AVX2's 16 registers, 12
//! or 16 with AVX-512's 32) in registers, summing over the group's input channels and the window's
//! taps: per tap, the `CL` weights (one or two vector loads) and `P` broadcast inputs make `CL·P`
//! multiply-adds — a GEMM microkernel's shape, with the input read in place of a packed panel. The
//! tile is written out transposed, a row of `P` pixels per channel, through register transposes
//! ([`Transposed`]). Its registers are typed
//! vectors of the level ([`Vector`]), not arrays left to the compiler, which vectorised some tile
//! sizes along the pixels or not at all.
//!
//! The input rows a band of output rows reads are first loaded (widened to the compute type and
//! zero-padded) and split by the horizontal stride into phases, so that the columns one tap reads
//! for consecutive outputs are contiguous: phase `p` of a row holds padded columns `p`, `p + sw`,
//! `p + 2·sw`, …, and tap `si` of output column `ox` reads padded column `ox·sw + si·dw`, that is
//! phase `(si·dw) mod sw` at index `ox + ⌊si·dw / sw⌋`. Rows in the vertical padding are loaded
//! as zeros, so every tile reads all of its taps at fixed offsets in one flat loop.
//!
//! Any stride, padding, dilation and groups are computed; the default kernel ([`preferred`]) for
//! one group of at most [`MAX_CHANNELS`] input channels and at least [`MIN_TAPS`] multiply-adds
//! per output. Work items are (image, band of output rows), shared out by the team when the
//! convolution is threaded. The weights are repacked once per call,
//! `[group][block of CL channels][C/G][R][S][CL]`, zero for the channels past `K/G` in a group's
//! last block (computed, never stored).
//!
//! Every output is the same sum as the reference's in another order (input channel, then tap row,
//! then tap column), so the results differ from it by rounding only; a non-finite input reaches
//! exactly the outputs whose window reads it.

use std::mem::MaybeUninit;

use super::tile::{tile, Channels, Taps};
use super::{fill_zero, gather_run, out_of_memory, parallel_items, zeroed, Geometry, Job, Wide};
use crate::backends::cpu::host::{with_simd, Ctx, Real};
use crate::backends::cpu::simd::SimdLevel;
use crate::backends::cpu::vector::{Portable, Registers, Vector};
use crate::error::Result;

/// Output pixels of a register tile of two vectors of channels, with 16 vector registers (AVX2,
/// NEON's tiles) and with 32 (AVX-512): the accumulators take 12 or 24 of them.
const PIXELS: [usize; 2] = [6, 12];

/// Output pixels of a register tile of one vector of channels, with 16 and with 32 registers.
const PIXELS_NARROW: [usize; 2] = [8, 16];

/// Pixels of a row's cut-short last tile, or twice as many (see [`Job::block_row`]).
const TAIL: usize = 4;

/// The most input channels per group the direct kernel is the default for.
pub(super) const MAX_CHANNELS: usize = 4;

/// Elements of padded input a work item's band holds at most (its output rows are cut to fit, down
/// to one): 128 KiB of f32, so the band stays in the L2 cache beside the repacked weights.
const BAND_ELEMENTS: usize = 1 << 15;

/// The fewest multiply-adds per output (`C/G·R·S`) the direct kernel is the default for: below,
/// writing each tile out transposed costs more than im2col's packing.
pub(super) const MIN_TAPS: usize = 25;

/// Whether the direct kernel is the default for `g`: one group of at most [`MAX_CHANNELS`] input
/// channels and at least [`MIN_TAPS`] multiply-adds per output (a 5×5 window on one channel, 3×3
/// on three).
pub(super) fn preferred(g: &Geometry) -> bool {
    g.groups == 1 && g.cg <= MAX_CHANNELS && g.crs() >= MIN_TAPS
}

/// The most input channels per group the autotuner times the direct kernel on ([`offered`]).
pub(super) const OFFERED_CHANNELS: usize = 16;

/// Whether the autotuner should also time the direct kernel on `g` where it is not the default:
/// one group of at most [`OFFERED_CHANNELS`] input channels, a window of more than one tap.
pub(super) fn offered(g: &Geometry) -> bool {
    g.groups == 1 && g.cg <= OFFERED_CHANNELS && g.r * g.s > 1 && !preferred(g)
}

/// The register tile: `CL` output channels × `P` output pixels. The packed weights, the band's
/// width and the kernel all take their sizes from it, so they cannot disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    C32P12,
    C16P16,
    C16P12,
    C16P6,
    C8P16,
    C8P8,
    C8P6,
    C4P8,
}

impl Shape {
    /// The tile for `lanes`-element vectors, `kg` output channels per group and 32 vector
    /// registers (`wide`, AVX-512's 64-byte vectors) or 16: two vectors of channels ×
    /// [`PIXELS`], or one × [`PIXELS_NARROW`] when one vector holds the group's channels; vectors
    /// of more than 16 or fewer than 4 lanes take the nearest.
    fn of(lanes: usize, kg: usize, wide: bool) -> Shape {
        match (lanes, kg <= lanes, wide) {
            (16.., false, _) => Shape::C32P12,
            (16.., true, _) => Shape::C16P16,
            (8..=15, false, true) => Shape::C16P12,
            (8..=15, false, false) => Shape::C16P6,
            (8..=15, true, true) => Shape::C8P16,
            (8..=15, true, false) => Shape::C8P8,
            (_, false, _) => Shape::C8P6,
            (_, true, _) => Shape::C4P8,
        }
    }

    /// `(CL, P)`.
    fn size(self) -> (usize, usize) {
        match self {
            Shape::C32P12 => (32, PIXELS[1]),
            Shape::C16P16 => (16, PIXELS_NARROW[1]),
            Shape::C16P12 => (16, PIXELS[1]),
            Shape::C16P6 => (16, PIXELS[0]),
            Shape::C8P16 => (8, PIXELS_NARROW[1]),
            Shape::C8P8 => (8, PIXELS_NARROW[0]),
            Shape::C8P6 => (8, PIXELS[0]),
            Shape::C4P8 => (4, PIXELS_NARROW[0]),
        }
    }
}

/// Bytes of the vector registers the tiles are sized for at `simd`.
fn vector_bytes(simd: SimdLevel) -> usize {
    match simd {
        SimdLevel::Avx512 => 64,
        _ => 32,
    }
}

/// How the direct kernel lays out and splits its work.
#[derive(Clone, Debug)]
struct Layout {
    /// The register tile.
    shape: Shape,
    /// Output channels of a register tile (`CL`).
    cl: usize,
    /// Length of one phase of a loaded input row: the columns the tiles read.
    wq: usize,
    /// Loaded rows per input channel in a band: the padded rows its output rows read.
    height: usize,
    /// Output rows per band.
    band_rows: usize,
    /// Bands per image.
    bands: usize,
    /// Where a tile reads each tap of a group.
    taps: Taps,
}

impl Layout {
    /// The layout for `g` on `threads` threads with `vector_bytes`-byte vectors and `elem`-byte
    /// compute elements; `OutOfMemory` when a band of one output row has more elements than
    /// `usize` holds.
    fn new(g: &Geometry, threads: usize, vector_bytes: usize, elem: usize) -> Result<Layout> {
        let shape = Shape::of(vector_bytes / elem, g.kg(), vector_bytes >= 64);
        let (cl, px) = shape.size();
        let (sh, sw, dh, dw) = (g.stride[0], g.stride[1], g.dilation[0], g.dilation[1]);
        let wq = g.ow.next_multiple_of(px) + (g.s - 1) * dw / sw;
        let row_len = sw * wq;
        // Loaded elements per output row: `sh` rows of every input channel.
        let per_row = g.c.saturating_mul(sh).saturating_mul(row_len);
        let mut band_rows = (BAND_ELEMENTS / per_row.max(1)).clamp(1, g.oh);
        if threads > 1 {
            // Enough items for every thread, four times over, while there are rows to split.
            let want = (4 * threads).div_ceil(g.n);
            band_rows = band_rows.min(g.oh.div_ceil(want)).max(1);
        }
        let height = (band_rows - 1) * sh + (g.r - 1) * dh + 1;
        let layout = Layout {
            shape,
            cl,
            wq,
            height,
            band_rows,
            bands: g.oh.div_ceil(band_rows),
            taps: Taps::new(Vec::new(), px),
        };
        let len = layout
            .band_len(g)
            .ok_or_else(|| out_of_memory::<u8>(usize::MAX))?;
        // Every offset is below `len`, so none overflows.
        let mut taps = Vec::new();
        taps.try_reserve_exact(g.crs())
            .map_err(|_| out_of_memory::<usize>(g.crs()))?;
        for c in 0..g.cg {
            for ri in 0..g.r {
                for si in 0..g.s {
                    let row = (c * height + ri * dh) * row_len;
                    taps.push(row + (si * dw % sw) * wq + si * dw / sw);
                }
            }
        }
        debug_assert!(taps.iter().all(|&t| t < len));
        Ok(Layout {
            taps: Taps::new(taps, px),
            ..layout
        })
    }

    /// Elements of one loaded input row: its `sw` phases.
    fn row_len(&self, g: &Geometry) -> usize {
        g.stride[1] * self.wq
    }

    /// Elements of a band buffer, every input channel's rows; `None` past `usize`.
    fn band_len(&self, g: &Geometry) -> Option<usize> {
        g.c.checked_mul(self.height)?.checked_mul(self.row_len(g))
    }
}

/// A work item's buffers: the loaded input band and one widened input row.
struct Band<A> {
    /// `[C][height][sw phases][wq]`: the padded rows from `sh` times the band's first output row.
    rows: Vec<A>,
    /// One input row widened to the compute type.
    wide: Vec<A>,
}

impl<A: Real> Band<A> {
    fn new(g: &Geometry, layout: &Layout) -> Result<Band<A>> {
        Ok(Band {
            rows: zeroed(layout.band_len(g).unwrap_or(usize::MAX))?,
            wide: zeroed(g.w)?,
        })
    }
}

impl<T: Wide> Job<'_, T> {
    /// The direct path: see the module doc.
    pub(super) fn direct(&self, ctx: Ctx) -> Result<()> {
        self.direct_tiled(ctx, vector_bytes(ctx.simd))
    }

    /// The direct path with tiles sized for `vector_bytes`-byte vectors.
    pub(super) fn direct_tiled(&self, ctx: Ctx, vector_bytes: usize) -> Result<()> {
        let g = &self.g;
        let elem = std::mem::size_of::<T::Acc>();
        let layout = Layout::new(g, ctx.threads, vector_bytes, elem)?;
        let weights = self.packed_weights(layout.cl)?;
        let bias = self.packed_bias(layout.cl)?;
        let packed = Packed {
            weights: &weights,
            bias: bias.as_deref(),
        };
        let items = g.n * layout.bands;
        let run = |item: usize, band: &mut Band<T::Acc>| match ctx.simd {
            // SAFETY (both x86 arms): the tiles run on the registers of `ctx.simd`, inside
            // `with_simd` at that level, which the CPU was detected to have.
            SimdLevel::Avx512 => with_simd(
                SimdLevel::Avx512,
                #[inline(always)]
                || unsafe {
                    self.direct_item::<<T::Acc as Registers>::X512>(item, &layout, packed, band)
                },
            ),
            SimdLevel::Avx2Fma => with_simd(
                SimdLevel::Avx2Fma,
                #[inline(always)]
                || unsafe {
                    self.direct_item::<<T::Acc as Registers>::X256>(item, &layout, packed, band)
                },
            ),
            // SAFETY: portable arrays need no target feature.
            level => with_simd(
                level,
                #[inline(always)]
                || unsafe { self.direct_item::<Portable<T::Acc, 4>>(item, &layout, packed, band) },
            ),
        };
        if ctx.threads > 1 && items > 1 {
            parallel_items(items, ctx.threads).try_for_each_init(
                || Band::new(g, &layout),
                |band, item| {
                    let band = band
                        .as_mut()
                        .map_err(|_| out_of_memory::<T::Acc>(layout.band_len(g).unwrap_or(0)))?;
                    run(item, band);
                    Ok(())
                },
            )
        } else {
            let mut band = Band::new(g, &layout)?;
            for item in 0..items {
                run(item, &mut band);
            }
            Ok(())
        }
    }

    /// The weights as `[group][block][C/G][R][S][cl]`, zero past `K/G` in each group.
    fn packed_weights(&self, cl: usize) -> Result<Vec<T::Acc>> {
        let g = &self.g;
        let (kg, crs) = (g.kg(), g.crs());
        let blocks = kg.div_ceil(cl);
        let mut packed = zeroed(g.groups * blocks * crs * cl)?;
        for group in 0..g.groups {
            for kk in 0..kg {
                let (block, lane) = (kk / cl, kk % cl);
                let src = &self.weight[(group * kg + kk) * crs..][..crs];
                let dst = &mut packed[(group * blocks + block) * crs * cl..][..crs * cl];
                for (t, &w) in src.iter().enumerate() {
                    dst[t * cl + lane] = w;
                }
            }
        }
        Ok(packed)
    }

    /// The bias as `[group][block][cl]`, zero past `K/G` in each group, so that every tile loads
    /// whole vectors of it; `None` without a bias.
    fn packed_bias(&self, cl: usize) -> Result<Option<Vec<T::Acc>>> {
        let Some(bias) = self.bias else {
            return Ok(None);
        };
        let g = &self.g;
        let (kg, blocks) = (g.kg(), g.kg().div_ceil(cl));
        let mut packed = zeroed(g.groups * blocks * cl)?;
        for group in 0..g.groups {
            packed[group * blocks * cl..][..kg].copy_from_slice(&bias[group * kg..][..kg]);
        }
        Ok(Some(packed))
    }

    /// Work item `item`: one band of output rows of one image, every channel, on tiles of `V`
    /// where a tile is one or two of its vectors wide (portable arrays otherwise).
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn direct_item<V: Vector<T::Acc>>(
        &self,
        item: usize,
        l: &Layout,
        packed: Packed<'_, T::Acc>,
        band: &mut Band<T::Acc>,
    ) {
        let g = &self.g;
        let (img, b) = (item / l.bands, item % l.bands);
        let rows = b * l.band_rows..g.oh.min((b + 1) * l.band_rows);
        self.load_band::<V>(img, rows.clone(), l, band);
        let (kg, crs, cl) = (g.kg(), g.crs(), l.cl);
        let blocks = kg.div_ceil(cl);
        let group_rows = g.cg * l.height * l.row_len(g);
        for oy in rows.clone() {
            // Where output column 0 of row oy reads tap (0, 0, 0) of group 0.
            let base = (oy - rows.start) * g.stride[0] * l.row_len(g);
            // Block by block along the whole row, so that a block's weights stay in the L1 cache.
            for group in 0..g.groups {
                for block in 0..blocks {
                    let k0 = group * kg + block * cl;
                    let lanes = cl.min(kg - block * cl);
                    let at = (group * blocks + block) * cl;
                    let channels = Channels {
                        k0,
                        weights: &packed.weights[at * crs..][..crs * cl],
                        bias: packed.bias.map(|b| &b[at..at + cl]),
                        lanes,
                    };
                    let base = base + group * group_rows;
                    let (i, b) = ((img, oy, base), &channels);
                    match l.shape {
                        Shape::C32P12 => self.shape_row::<V, 32, { PIXELS[1] }>(i, b, l, band),
                        Shape::C16P16 => {
                            self.shape_row::<V, 16, { PIXELS_NARROW[1] }>(i, b, l, band)
                        }
                        Shape::C16P12 => self.shape_row::<V, 16, { PIXELS[1] }>(i, b, l, band),
                        Shape::C16P6 => self.shape_row::<V, 16, { PIXELS[0] }>(i, b, l, band),
                        Shape::C8P16 => self.shape_row::<V, 8, { PIXELS_NARROW[1] }>(i, b, l, band),
                        Shape::C8P8 => self.shape_row::<V, 8, { PIXELS_NARROW[0] }>(i, b, l, band),
                        Shape::C8P6 => self.shape_row::<V, 8, { PIXELS[0] }>(i, b, l, band),
                        Shape::C4P8 => self.shape_row::<V, 4, { PIXELS_NARROW[0] }>(i, b, l, band),
                    }
                }
            }
        }
    }

    /// [`Self::block_row`] for a tile of `CL` channels: on `V` when `CL` is one or two of its
    /// vectors, else on a portable array of `CL` lanes.
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn shape_row<V: Vector<T::Acc>, const CL: usize, const P: usize>(
        &self,
        at: (usize, usize, usize),
        ch: &Channels<'_, T::Acc>,
        l: &Layout,
        band: &Band<T::Acc>,
    ) {
        if CL == V::LANES {
            self.block_row::<V, CL, 1, P>(at, ch, l, band)
        } else if CL == 2 * V::LANES {
            self.block_row::<V, CL, 2, P>(at, ch, l, band)
        } else {
            self.block_row::<Portable<T::Acc, CL>, CL, 1, P>(at, ch, l, band)
        }
    }

    /// Output row `oy` of image `img` for one block of `CL = NV · V::LANES` output channels, `P`
    /// pixels at a time; `base` is where output column 0 reads the block's first tap in the
    /// loaded band.
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn block_row<V: Vector<T::Acc>, const CL: usize, const NV: usize, const P: usize>(
        &self,
        (img, oy, base): (usize, usize, usize),
        ch: &Channels<'_, T::Acc>,
        l: &Layout,
        band: &Band<T::Acc>,
    ) {
        assert_eq!(CL, NV * V::LANES, "a tile of whole vectors");
        let g = &self.g;
        let mut c0 = 0;
        while c0 < g.ow {
            let at = (img, oy, base + c0, c0);
            // The row's last tile is cut to `TAIL` or `2·TAIL` pixels where its pixels fit, so
            // that it computes few pixels past the row (a 112-pixel row on tiles of 12 computes
            // 112, not 120).
            match g.ow - c0 {
                n if n >= P => self.tile_out::<V, CL, NV, P>(at, ch, l, band),
                n if n <= TAIL && TAIL < P => self.tile_out::<V, CL, NV, TAIL>(at, ch, l, band),
                n if n <= 2 * TAIL && 2 * TAIL < P => {
                    self.tile_out::<V, CL, NV, { 2 * TAIL }>(at, ch, l, band)
                }
                _ => self.tile_out::<V, CL, NV, P>(at, ch, l, band),
            }
            c0 += P;
        }
    }

    /// The register tile of `P` pixels from output column `c0` of row `oy` of image `img`, for
    /// one block of `CL = NV · V::LANES` output channels, written out where it lies inside the
    /// row; `x0` is where its first pixel reads the block's first tap in the loaded band.
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn tile_out<V: Vector<T::Acc>, const CL: usize, const NV: usize, const P: usize>(
        &self,
        (img, oy, x0, c0): (usize, usize, usize, usize),
        ch: &Channels<'_, T::Acc>,
        l: &Layout,
        band: &Band<T::Acc>,
    ) {
        let g = &self.g;
        // The layout sizes the band for every tile: this slice is in bounds.
        let x = &band.rows[x0..][..l.taps.reach()];
        let sums = tile::<_, V, NV, P>(x, &l.taps, ch);
        let n = P.min(g.ow - c0);
        let plane = g.oh * g.ow;
        let at = ((img * g.k + ch.k0) * g.oh + oy) * g.ow + c0;
        let rows = Transposed::<T::Acc>::of::<V, CL, NV, P>(&sums);
        for kb in 0..ch.lanes {
            // SAFETY: row oy of channel k0 + kb, columns c0 .. c0 + n, lies inside the output
            // and is written by this item only (items own disjoint bands of output rows).
            let out = self.output.get_mut(at + kb * plane, n);
            match T::as_acc_mut(out) {
                Some(out) => rows.store::<V>(kb, out),
                None => T::narrow_slice(&rows.row(kb)[..n], out),
            }
        }
    }

    /// Loads into `band` the padded rows of image `img` that output rows `rows` read (from padded
    /// row `rows.start · sh`), widened, zero outside the image, and split into phases (at stride
    /// 2 by [`even_run`] on vectors of `V`).
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn load_band<V: Vector<T::Acc>>(
        &self,
        img: usize,
        rows: std::ops::Range<usize>,
        l: &Layout,
        band: &mut Band<T::Acc>,
    ) {
        let g = &self.g;
        let (sh, dh, ph) = (g.stride[0], g.dilation[0], g.padding[0]);
        let (sw, pw) = (g.stride[1], g.padding[1]);
        let top = rows.start * sh;
        let loaded = (rows.len() - 1) * sh + (g.r - 1) * dh + 1;
        let row_len = l.row_len(g);
        for c in 0..g.c {
            // SAFETY: the input plane lies inside the input, which nothing writes.
            let plane = unsafe { self.input.get((img * g.c + c) * g.h * g.w, g.h * g.w) };
            for b in 0..loaded {
                let dst = &mut band.rows[(c * l.height + b) * row_len..][..row_len];
                let Some(iy) = (top + b).checked_sub(ph).filter(|&iy| iy < g.h) else {
                    dst.fill(T::Acc::ZERO);
                    continue;
                };
                let src = &plane[iy * g.w..][..g.w];
                let src = match T::as_acc(src) {
                    Some(src) => src,
                    None => {
                        T::widen_slice(src, &mut band.wide);
                        &band.wide
                    }
                };
                for (p, phase) in dst.chunks_exact_mut(l.wq).enumerate() {
                    // Padded column x = p + j·sw is input column x − pw: inside the row for
                    // j in lo..hi.
                    let lo = pw.saturating_sub(p).div_ceil(sw).min(l.wq);
                    let hi = (g.w + pw).saturating_sub(p).div_ceil(sw).clamp(lo, l.wq);
                    let (left, rest) = phase.split_at_mut(lo);
                    let (mid, right) = rest.split_at_mut(hi - lo);
                    fill_zero(left);
                    // An empty run may start past the row (a phase wholly in the right padding).
                    if !mid.is_empty() {
                        let from = &src[p + lo * sw - pw..];
                        if sw == 2 {
                            // SAFETY: the caller's contract.
                            unsafe { even_run::<_, V>(from, mid) };
                        } else {
                            gather_run(from, sw, mid);
                        }
                    }
                    fill_zero(right);
                }
            }
        }
    }
}

/// The most channels and pixels a [`Transposed`] tile holds, each (pixels rounded up to whole
/// vectors).
const TRANSPOSED: usize = 32;

/// A register tile of `P` pixels × `CL` channels turned into `CL` rows of pixels, through two
/// buffers on the stack and [`Vector::transpose`]s of `LANES × LANES` blocks, so that each channel's
/// pixels are stored as vectors. Stored lane by lane, the compiler turned the strided reads into
/// gathers, which on a Zen 4 core took a seventh of a 7×7/2 first layer's time.
struct Transposed<A> {
    /// `[channel][pv]`: channel `c`'s pixels from `c · pv`, the first `P` of them the tile's;
    /// the `CL` rows are written, the rest of the buffer is not.
    rows: [MaybeUninit<A>; TRANSPOSED * TRANSPOSED],
    /// Channels: rows written.
    cl: usize,
    /// Pixels per row: `P` rounded up to whole vectors.
    pv: usize,
}

impl<A: Real> Transposed<A> {
    /// The rows of the tile `sums[p][v]` (channels `v · LANES ..` of pixel `p`).
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn of<V: Vector<A>, const CL: usize, const NV: usize, const P: usize>(
        sums: &[[V; NV]; P],
    ) -> Transposed<A> {
        let lanes = V::LANES;
        let pv = P.div_ceil(lanes) * lanes;
        assert!(
            CL == NV * lanes && CL <= TRANSPOSED && pv <= TRANSPOSED,
            "a tile too large to transpose"
        );
        // `[pixel][CL]`: the tile's pixels, then zero up to `pv` (nothing is read past them).
        let mut tile = [MaybeUninit::<A>::uninit(); TRANSPOSED * TRANSPOSED];
        let at = tile.as_mut_ptr().cast::<A>();
        for p in 0..pv {
            for v in 0..NV {
                let s = sums.get(p).map_or(V::zero(), |s| s[v]);
                // SAFETY: p·CL + v·LANES + LANES ≤ pv·CL ≤ the buffer (asserted above).
                unsafe { s.store(at.add(p * CL + v * lanes)) };
            }
        }
        let mut rows = [MaybeUninit::<A>::uninit(); TRANSPOSED * TRANSPOSED];
        for i0 in (0..pv).step_by(lanes) {
            for j0 in (0..CL).step_by(lanes) {
                // SAFETY: block rows i0 .. i0 + LANES ≤ pv of `tile` (row stride CL, written
                // above) and rows j0 .. j0 + LANES ≤ CL of `rows` (row stride pv) lie inside the
                // buffers.
                unsafe {
                    V::transpose(
                        at.add(i0 * CL + j0),
                        CL,
                        rows.as_mut_ptr().cast::<A>().add(j0 * pv + i0),
                        pv,
                    )
                };
            }
        }
        Transposed { rows, cl: CL, pv }
    }

    /// Channel `c`'s pixels (`pv` of them). Panics when `c` is not a channel of the tile.
    #[inline(always)]
    fn row(&self, c: usize) -> &[A] {
        assert!(c < self.cl, "a channel outside the tile");
        let row = &self.rows[c * self.pv..][..self.pv];
        // SAFETY: rows below `cl` were written whole by the transposes (`of`); `MaybeUninit<A>`
        // has `A`'s layout.
        unsafe { std::slice::from_raw_parts(row.as_ptr().cast::<A>(), row.len()) }
    }

    /// Writes the first `out.len() ≤ pv` pixels of channel `c` to `out` as vectors of `V` (the
    /// last one masked).
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`, whose lanes divide `pv`.
    #[inline(always)]
    unsafe fn store<V: Vector<A>>(&self, c: usize, out: &mut [A]) {
        let (row, n) = (self.row(c), out.len().min(self.pv));
        for v0 in (0..n).step_by(V::LANES) {
            // SAFETY: v0 + LANES ≤ pv elements of the row are read; lanes below n of `out`
            // written.
            unsafe {
                let x = V::load(row.as_ptr().add(v0));
                if v0 + V::LANES <= n {
                    x.store(out.as_mut_ptr().add(v0));
                } else {
                    x.store_first(out.as_mut_ptr().add(v0), n - v0);
                }
            }
        }
    }
}

/// `dst[j] = src[2·j]`, `src` holding at least `2·dst.len() − 1` elements: [`gather_run`] at
/// stride 2 as two loads and a permute per vector of `V` ([`Vector::deinterleave`]), the rest
/// element by element. Left to the compiler, the strided loop became gathers, which on a Zen 4
/// core took a sixth of a 7×7/2 first layer's time.
///
/// # Safety
/// As [`Vector`]'s methods for `V`.
#[inline(always)]
unsafe fn even_run<A: Real, V: Vector<A>>(src: &[A], dst: &mut [A]) {
    let (n, lanes) = (dst.len(), V::LANES);
    let mut i = 0;
    while i + lanes <= n && 2 * (i + lanes) <= src.len() {
        // SAFETY: `2·i + 2·LANES ≤ src.len()` elements are read, `i + LANES ≤ n` written.
        unsafe {
            let (even, _) = V::deinterleave(src.as_ptr().add(2 * i));
            even.store(dst.as_mut_ptr().add(i));
        }
        i += lanes;
    }
    for (j, d) in dst[i..].iter_mut().enumerate() {
        *d = src[2 * (i + j)];
    }
}

/// The repacked operands of a call: weights `[group][block][C/G][R][S][cl]` and the bias
/// `[group][block][cl]`, each zero past `K/G` in a group.
#[derive(Clone, Copy)]
struct Packed<'a, A> {
    weights: &'a [A],
    bias: Option<&'a [A]>,
}
