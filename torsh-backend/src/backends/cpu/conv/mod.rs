//! 2-D convolution on the CPU, by shape:
//!
//! - **pointwise** (1×1, stride 1, no padding): per image and group the output block is `W_g · X_g`,
//!   where `X_g` is the group's input channels as they lie in memory (`[C/G, H·W]`, row stride
//!   `H·W`): one GEMM on the operands in place for f32 and f64; f16 and bf16 inputs are widened a
//!   block of columns at a time.
//! - **depthwise** (one input channel per group, any channel multiplier): a direct kernel,
//!   vectorised along the output width, that sums each tile of an output row over the taps in
//!   registers: at stride 1 tiles of up to 64 columns with the taps of a row unrolled for rows of 3, 5
//!   and 7 taps (dilation 1), at other strides runs of [`RUN`] columns in interleaved partial sums.
//!   Square 3×3, 5×5 and 7×7 windows at stride 1 and dilation 1 (f32, f64) run [`DW_ROWS`] output
//!   rows per tile instead ([`RowTiles`], typed vectors of the level), loading each input row once
//!   for all the rows whose window holds it, in place: the padding is masked out of the loads
//!   instead of copied in.
//!   A single group of one input channel takes the first-layer kernel below when its window has
//!   at least 25 taps, else on small planes the GEMM path.
//! - **first layers** (one group of at most 4 input channels, at least 25 multiply-adds per output,
//!   any window, stride, padding and dilation): a direct kernel (`direct.rs`) with a tile of output
//!   channels × pixels in registers, reading a zero-padded band of input rows split by the stride
//!   into phases in place of a patch matrix.
//! - **3×3, stride 1, dilation 1, one group, at least 16 input and output channels, at least 32
//!   output tiles of 2×2 per call**: Winograd F(2×2, 3×3) (`winograd.rs`): 16 GEMMs over
//!   transformed tiles, 2.25 times fewer multiply-adds (fewer tiles, such as one 7×7 image, do not
//!   repay the per-call filter transform and take im2col).
//!   It also serves the other 3×3 stride-1 ungrouped layers when asked for ([`Algorithm`]); the
//!   autotuner offers the family the default does not take as a variant.
//! - **everything else**: im2col of a block of output positions (at most [`COL_BYTES`] of patches,
//!   so it stays in the L2 cache and no full patch matrix is ever built) followed by one GEMM per
//!   group. When the patch matrix has so many rows that even [`MIN_COLS`] columns exceed the budget,
//!   its rows are split too and the GEMMs accumulate. Output rows shorter than [`TABLE_ROW`] gather
//!   their patches through a [`TapTable`] (the gradients' col2im scatters through it).
//!
//! Bias is fused: each output block starts as the bias and the GEMMs accumulate into it. Products run
//! on the `gemm` crate's kernels in f32 (for f32, f16 and bf16: half types are widened, accumulate in
//! f32 and are rounded once on store) or f64.
//!
//! Threads: the work items are (image, block of output positions). With at least as many items as
//! threads they run in parallel on the backend's pool, each GEMM single-threaded: that keeps every
//! thread on its own cache-sized block and balances N > 1 and large images without a fork-join per
//! product. A single image too small to split into blocks of [`MIN_PAR_COLS`] positions per thread
//! runs its items in turn, each GEMM threaded by the `gemm` crate (`Parallelism::Rayon`). Whether a
//! convolution is threaded at all is the caller's choice (`Ctx::threads`): the threading cost model
//! ([`work`], module `cost`) keeps small ones on the calling thread.

use std::borrow::Cow;

use gemm::Parallelism;
use half::{bf16, f16, slice::HalfFloatSliceExt};

use super::blas;
use super::cost::Work;
use super::host::{with_float, with_simd, Ahead, Ctx, Element, Real};
use super::team::Items;
use super::vector::{on_vectors, Step, Vector};
use super::SimdLevel;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{conv as reference, memory::HostMemory};
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::{Conv2dDesc, DevicePtr};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// The op name in errors.
const OP: &str = "conv2d";

/// Bytes of patches (im2col) one work item builds at a time: half the L2 cache of this class of
/// machine, so the block and the GEMM's packed panels stay resident.
const COL_BYTES: usize = 512 << 10;

/// The narrowest block of output positions the blocking makes (when the patch rows allow).
const MIN_COLS: usize = 64;

/// The narrowest block of output positions worth a thread of its own.
const MIN_PAR_COLS: usize = 128;

/// Column blocks are rounded to this many positions: the row count of the `gemm` crate's widest
/// AVX-512 microkernel (4 registers of f32), so blocks have no ragged panel.
const COL_ALIGN: usize = 64;

/// Destination columns per call of the `gemm` crate (rows, for a row-major destination) beyond
/// which it repacks the left operand of its column-major form: [`Product::run_split`] cuts products
/// into blocks this wide so that they read their operands in place.
pub(super) const NO_REPACK_COLS: usize = 48;

/// Output rows shorter than this gather their patches through a [`TapTable`]: copying row segments
/// costs a call and two zero fills per segment, which short rows do not repay.
const TABLE_ROW: usize = 32;

/// The most entries (taps × output positions) a [`TapTable`] holds.
const TABLE_LEN: usize = 1 << 16;

/// For each tap and output position of one plane, the input offset (within its plane) the tap
/// reads, `u32::MAX` where it falls in the padding: im2col becomes a gather and col2im a scatter,
/// with no per-segment work.
pub(super) struct TapTable {
    offsets: Vec<u32>,
    /// Output positions per plane.
    p: usize,
}

impl TapTable {
    /// The offsets of `tap` for output positions `p0 .. p0 + pb`.
    #[inline(always)]
    pub(super) fn row(&self, tap: usize, p0: usize, pb: usize) -> &[u32] {
        &self.offsets[tap * self.p + p0..][..pb]
    }
}

/// Slice conversions between an element type and the type it computes in, in bulk (F16C for f16
/// where the CPU has it), and zero-copy views when the two are the same type.
pub(super) trait Wide: Element {
    /// True when the element type is its own compute type (f32, f64).
    const NATIVE: bool;
    /// The slice itself, when the element type is its own compute type.
    fn as_acc(xs: &[Self]) -> Option<&[Self::Acc]>;
    /// As [`Wide::as_acc`], mutably.
    fn as_acc_mut(xs: &mut [Self]) -> Option<&mut [Self::Acc]>;
    /// `dst[i] = widen(src[i])` over the common length.
    fn widen_slice(src: &[Self], dst: &mut [Self::Acc]);
    /// `dst[i] = narrow(src[i])` (round to nearest even) over the common length.
    fn narrow_slice(src: &[Self::Acc], dst: &mut [Self]);
}

/// [`Wide`] for a type that computes in itself.
macro_rules! wide_native {
    ($t:ty) => {
        impl Wide for $t {
            const NATIVE: bool = true;
            #[inline(always)]
            fn as_acc(xs: &[Self]) -> Option<&[Self]> {
                Some(xs)
            }
            #[inline(always)]
            fn as_acc_mut(xs: &mut [Self]) -> Option<&mut [Self]> {
                Some(xs)
            }
            #[inline(always)]
            fn widen_slice(src: &[Self], dst: &mut [Self]) {
                let n = src.len().min(dst.len());
                dst[..n].copy_from_slice(&src[..n]);
            }
            #[inline(always)]
            fn narrow_slice(src: &[Self], dst: &mut [Self]) {
                let n = src.len().min(dst.len());
                dst[..n].copy_from_slice(&src[..n]);
            }
        }
    };
}
wide_native!(f32);
wide_native!(f64);

/// [`Wide`] for a 16-bit type that computes in f32, through `half`'s slice conversions.
macro_rules! wide_half {
    ($t:ty) => {
        impl Wide for $t {
            const NATIVE: bool = false;
            #[inline(always)]
            fn as_acc(_: &[Self]) -> Option<&[f32]> {
                None
            }
            #[inline(always)]
            fn as_acc_mut(_: &mut [Self]) -> Option<&mut [f32]> {
                None
            }
            #[inline(always)]
            fn widen_slice(src: &[Self], dst: &mut [f32]) {
                let n = src.len().min(dst.len());
                src[..n].convert_to_f32_slice(&mut dst[..n]);
            }
            #[inline(always)]
            fn narrow_slice(src: &[f32], dst: &mut [Self]) {
                let n = src.len().min(dst.len());
                dst[..n].convert_from_f32_slice(&src[..n]);
            }
        }
    };
}
wide_half!(f16);
wide_half!(bf16);

/// `len` elements of `T` at a host address, shared by the tasks of one kernel. Tasks read inputs
/// and write disjoint parts of outputs; the memory lock keeps the buffers alive meanwhile.
#[derive(Debug)]
pub(super) struct Raw<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Clone for Raw<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Raw<T> {}

// SAFETY: a Raw is an address and a length; what may be done through it is governed by the unsafe
// accessors below, whose callers guarantee that concurrent writes touch disjoint elements.
unsafe impl<T: Send> Send for Raw<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Raw<T> {}

impl<T: Element> Raw<T> {
    /// The `len` elements at `ptr`, after a bounds check against the live allocations.
    /// `InvalidArgument` when `ptr` is not aligned to the element size.
    pub(super) fn of(
        mem: &mut HostMemory,
        op: &'static str,
        ptr: DevicePtr,
        len: usize,
    ) -> Result<Raw<T>> {
        let size = std::mem::size_of::<T>();
        let bytes = len.checked_mul(size).ok_or_else(|| {
            BackendError::overflow(op, format!("{len} elements of {size} bytes overflow"))
        })?;
        let raw = mem.host_address(ptr, bytes)?;
        if !(raw as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(BackendError::invalid(
                op,
                format!(
                    "pointer {:#x} is not aligned to its {size}-byte elements",
                    ptr.0
                ),
            ));
        }
        Ok(Raw {
            ptr: raw.cast(),
            len,
        })
    }

    /// The elements of `xs`, which must outlive every use of the result.
    pub(super) fn of_slice(xs: &mut [T]) -> Raw<T> {
        Raw {
            ptr: xs.as_mut_ptr(),
            len: xs.len(),
        }
    }

    /// The address of element `at` (`at ≤ len`).
    #[inline]
    pub(super) fn at(&self, at: usize) -> *mut T {
        debug_assert!(at <= self.len);
        self.ptr.wrapping_add(at)
    }

    /// Elements `start .. start + len`, shared.
    ///
    /// # Safety
    /// The range is inside the buffer and no task writes these elements while the slice lives.
    #[inline]
    pub(super) unsafe fn get(&self, start: usize, len: usize) -> &[T] {
        debug_assert!(start + len <= self.len);
        std::slice::from_raw_parts(self.ptr.add(start), len)
    }

    /// Elements `start .. start + len`, exclusively.
    ///
    /// # Safety
    /// The range is inside the buffer and no other slice or access of these elements lives at the
    /// same time.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn get_mut(&self, start: usize, len: usize) -> &mut [T] {
        debug_assert!(start + len <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}

/// Items `0..items` in jobs of consecutive items ([`Items`]), whose scratch buffers
/// `try_for_each_init` allocates a few times per op, not once per item or job.
pub(super) fn parallel_items(items: usize, threads: usize) -> Items {
    Items::new(items, threads)
}

/// A vector of `n` zeros, or `OutOfMemory` instead of an allocation failure.
pub(super) fn zeroed<A: Real>(n: usize) -> Result<Vec<A>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| out_of_memory::<A>(n))?;
    v.resize(n, A::ZERO);
    Ok(v)
}

/// The error for a failed allocation of `n` elements of `A`.
pub(super) fn out_of_memory<A>(n: usize) -> BackendError {
    BackendError::OutOfMemory {
        requested: n.saturating_mul(std::mem::size_of::<A>()),
        available: 0,
    }
}

/// `xs` in its compute type: borrowed for f32 and f64, a widened copy for the half types.
fn widened<T: Wide>(xs: &[T]) -> Result<Cow<'_, [T::Acc]>> {
    if let Some(acc) = T::as_acc(xs) {
        return Ok(Cow::Borrowed(acc));
    }
    let mut out = zeroed(xs.len())?;
    T::widen_slice(xs, &mut out);
    Ok(Cow::Owned(out))
}

/// One product `dst = [dst +] alpha · lhs · rhs` (`m × k` times `k × n`) on the `gemm` crate, every
/// stride `(row, column)` in elements.
#[derive(Clone, Copy)]
pub(super) struct Product<A> {
    /// Rows of dst and lhs.
    pub m: usize,
    /// Columns of dst and rhs.
    pub n: usize,
    /// Columns of lhs, rows of rhs.
    pub k: usize,
    /// Destination.
    pub dst: *mut A,
    /// Destination strides.
    pub dst_strides: (usize, usize),
    /// Left operand.
    pub lhs: *const A,
    /// Left operand strides.
    pub lhs_strides: (usize, usize),
    /// Right operand.
    pub rhs: *const A,
    /// Right operand strides.
    pub rhs_strides: (usize, usize),
    /// Scales the product.
    pub alpha: A,
    /// Adds the product to dst (else dst is overwritten and not read).
    pub accumulate: bool,
}

impl<A: Real> Product<A> {
    /// Runs the product as blocks of at most `chunk` destination columns (rows, when the
    /// destination is row-major): the `gemm` crate works on a column-major destination and
    /// repacks the left operand (after its transposition) whenever that destination has more than
    /// [`NO_REPACK_COLS`] columns; narrower blocks read it in place.
    ///
    /// # Safety
    /// As [`Product::run`].
    #[inline]
    pub(super) unsafe fn run_split(self, chunk: usize, parallelism: Parallelism) {
        let chunk = chunk.max(1);
        let by_columns = self.dst_strides.0 == 1 && self.dst_strides.1 != 1;
        let total = if by_columns { self.n } else { self.m };
        let mut start = 0;
        while start < total {
            let len = chunk.min(total - start);
            let part = if by_columns {
                Product {
                    n: len,
                    dst: self.dst.wrapping_add(start * self.dst_strides.1),
                    rhs: self.rhs.wrapping_add(start * self.rhs_strides.1),
                    ..self
                }
            } else {
                Product {
                    m: len,
                    dst: self.dst.wrapping_add(start * self.dst_strides.0),
                    lhs: self.lhs.wrapping_add(start * self.lhs_strides.0),
                    ..self
                }
            };
            part.run(parallelism);
            start += len;
        }
    }

    /// Runs the product in the blocks [`blas::for_blocks`] makes of it for `parallelism` (on the
    /// calling thread for `Parallelism::None`).
    ///
    /// # Safety
    /// Every operand with its sizes and strides addresses valid memory (dst writable and not
    /// overlapping lhs or rhs, nor written by another task meanwhile), strides fit in `isize`, and
    /// `A` is f32 or f64.
    #[inline]
    pub(super) unsafe fn run(self, parallelism: Parallelism) {
        let product = &self;
        blas::for_blocks(product.m, product.n, parallelism, |by_rows, start, len| {
            let part = if by_rows {
                Product {
                    m: len,
                    dst: product.dst.wrapping_add(start * product.dst_strides.0),
                    lhs: product.lhs.wrapping_add(start * product.lhs_strides.0),
                    ..*product
                }
            } else {
                Product {
                    n: len,
                    dst: product.dst.wrapping_add(start * product.dst_strides.1),
                    rhs: product.rhs.wrapping_add(start * product.rhs_strides.1),
                    ..*product
                }
            };
            // SAFETY: the block is a sub-product of this one, writing only its own rows (columns)
            // of dst.
            unsafe { part.run_here() }
        });
    }

    /// Runs the product on the calling thread.
    ///
    /// # Safety
    /// As [`Product::run`].
    #[inline]
    unsafe fn run_here(self) {
        let s = |v: usize| v as isize;
        gemm::gemm(
            self.m,
            self.n,
            self.k,
            self.dst,
            s(self.dst_strides.1),
            s(self.dst_strides.0),
            self.accumulate,
            self.lhs,
            s(self.lhs_strides.1),
            s(self.lhs_strides.0),
            self.rhs,
            s(self.rhs_strides.1),
            s(self.rhs_strides.0),
            A::ONE,
            self.alpha,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

// SAFETY: the operands are only read (lhs, rhs) or written in disjoint blocks (dst, see
// `Product::run`) by the tasks that share a product.
unsafe impl<A: Sync> Sync for Product<A> {}

/// The sizes and window parameters of a convolution.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: usize,
    /// Input channels per group.
    cg: usize,
    r: usize,
    s: usize,
    oh: usize,
    ow: usize,
    groups: usize,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
}

impl Geometry {
    /// The geometry of a validated, non-empty `d`, or `None` for the shapes left to the reference
    /// kernel: no input channels, or window coordinates beyond `isize`.
    fn of(d: &Conv2dDesc) -> Option<Geometry> {
        let [n, c, h, w] = d.input_shape;
        let [k, cg, r, s] = d.weight_shape;
        let [_, _, oh, ow] = d.output_shape;
        // The largest coordinate any window computes: (out − 1)·stride + (taps − 1)·dilation + pad.
        let reach = |out: usize, stride: usize, taps: usize, dil: usize, pad: usize| {
            out.checked_mul(stride)?
                .checked_add(taps.checked_mul(dil)?)?
                .checked_add(pad)?
                .checked_add(h.max(w))
                .filter(|&v| v <= isize::MAX as usize)
        };
        reach(oh, d.stride[0], r, d.dilation[0], d.padding[0])?;
        reach(ow, d.stride[1], s, d.dilation[1], d.padding[1])?;
        (cg > 0).then_some(Geometry {
            n,
            c,
            h,
            w,
            k,
            cg,
            r,
            s,
            oh,
            ow,
            groups: d.groups,
            stride: d.stride,
            padding: d.padding,
            dilation: d.dilation,
        })
    }

    /// Output positions per channel.
    fn p(&self) -> usize {
        self.oh * self.ow
    }

    /// Rows of a group's patch matrix: `C/G · R · S`.
    fn crs(&self) -> usize {
        self.cg * self.r * self.s
    }

    /// Output channels per group.
    fn kg(&self) -> usize {
        self.k / self.groups
    }

    /// 1×1, stride 1, no padding: the patch matrix is the input itself.
    fn pointwise(&self) -> bool {
        self.r == 1 && self.s == 1 && self.stride == [1, 1] && self.padding == [0, 0]
    }

    /// Length of a zero-padded input row that every tap of every output column reads inside:
    /// the left padding, the row, and whatever the last window reaches beyond it.
    /// For stride 2 it also covers the lanes of a last partial run of [`RUN`] columns, for stride 1
    /// those of a last partial depthwise tile (which reaches less than [`RUN`] past the row).
    fn padded_width(&self) -> usize {
        let sw = self.stride[1];
        let lanes = match sw {
            1 => self.ow + RUN,
            2 => self.ow.next_multiple_of(RUN),
            _ => self.ow,
        };
        let reach = (lanes - 1) * sw + (self.s - 1) * self.dilation[1] + 1;
        reach.max(self.padding[1] + self.w)
    }

    /// Multiply-adds of the whole convolution, times two.
    fn flops(&self) -> usize {
        2usize
            .saturating_mul(self.n)
            .saturating_mul(self.k)
            .saturating_mul(self.crs())
            .saturating_mul(self.p())
    }

    /// The input row that tap row `ri` of output row `oy` reads, if inside the image.
    #[inline(always)]
    fn input_row(&self, oy: usize, ri: usize) -> Option<usize> {
        let iy = (oy * self.stride[0] + ri * self.dilation[0]) as isize - self.padding[0] as isize;
        (iy >= 0 && (iy as usize) < self.h).then_some(iy as usize)
    }

    /// For tap column `si`, the output columns `lo..hi` (within `ox0..ox1`) whose input column lies
    /// inside the image, and the input column of `lo`.
    #[inline(always)]
    fn valid_columns(&self, si: usize, ox0: usize, ox1: usize) -> (usize, usize, usize) {
        let sw = self.stride[1];
        // Input column ix = ox·sw + off.
        let off = (si * self.dilation[1]) as isize - self.padding[1] as isize;
        let lo = if off >= 0 {
            0
        } else {
            off.unsigned_abs().div_ceil(sw)
        };
        let last = self.w as isize - 1 - off;
        let hi = if last < 0 { 0 } else { last as usize / sw + 1 };
        let lo = lo.clamp(ox0, ox1);
        let hi = hi.clamp(lo, ox1);
        let ix = if lo < hi {
            ((lo * sw) as isize + off) as usize
        } else {
            0
        };
        (lo, hi, ix)
    }
}

impl Geometry {
    /// The [`TapTable`] of this convolution where im2col and col2im are cheaper through it (output
    /// rows shorter than [`TABLE_ROW`], at most [`TABLE_LEN`] entries); `None` otherwise.
    fn tap_table(&self) -> Result<Option<TapTable>> {
        let (taps, p) = (self.r * self.s, self.p());
        // Offsets are u32 with u32::MAX for the padding: planes must stay below it.
        let small_plane = self.h.saturating_mul(self.w) < u32::MAX as usize;
        if self.pointwise()
            || self.ow >= TABLE_ROW
            || taps.saturating_mul(p) > TABLE_LEN
            || !small_plane
        {
            return Ok(None);
        }
        let mut offsets = Vec::new();
        offsets
            .try_reserve_exact(taps * p)
            .map_err(|_| out_of_memory::<u32>(taps * p))?;
        for tap in 0..taps {
            let (ri, si) = (tap / self.s, tap % self.s);
            for oy in 0..self.oh {
                let iy = self.input_row(oy, ri);
                let (lo, hi, ix) = self.valid_columns(si, 0, self.ow);
                offsets.extend((0..self.ow).map(|ox| match iy {
                    Some(iy) if (lo..hi).contains(&ox) => {
                        (iy * self.w + ix + (ox - lo) * self.stride[1]) as u32
                    }
                    _ => u32::MAX,
                }));
            }
        }
        Ok(Some(TapTable { offsets, p }))
    }

    /// Rows `k0..k1` of the patch matrix of one image and group (`x`: its `C/G` input planes), for
    /// output positions `p0 .. p0 + pb`, into `col` (row stride `pb`), through `table` when given
    /// (it must be this geometry's).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn im2col<T: Wide>(
        &self,
        x: &[T],
        k0: usize,
        k1: usize,
        p0: usize,
        pb: usize,
        col: &mut [T::Acc],
        table: Option<&TapTable>,
    ) {
        let g = self;
        let (taps, hw) = (g.r * g.s, g.h * g.w);
        for (kk, row) in (k0..k1).zip(col.chunks_exact_mut(pb)) {
            let (ci, tap) = (kk / taps, kk % taps);
            let plane = &x[ci * hw..][..hw];
            if let Some(table) = table {
                // Padding's offset lies past the plane (an empty plane is all padding).
                for (d, &o) in row.iter_mut().zip(table.row(tap, p0, pb)) {
                    *d = plane.get(o as usize).map_or(T::Acc::ZERO, |v| v.widen());
                }
                continue;
            }
            if g.pointwise() {
                T::widen_slice(&plane[p0..p0 + pb], row);
                continue;
            }
            let (ri, si) = (tap / g.s, tap % g.s);
            let mut p = p0;
            while p < p0 + pb {
                let (oy, ox0) = (p / g.ow, p % g.ow);
                let ox1 = g.ow.min(ox0 + (p0 + pb - p));
                let seg = &mut row[p - p0..][..ox1 - ox0];
                self.patch_segment(plane, (oy, ox0..ox1), (ri, si), seg);
                p += ox1 - ox0;
            }
        }
    }

    /// Output columns `cols` of output row `oy` for tap `(ri, si)` of one input plane: the input
    /// values under the tap, zero where it falls in the padding.
    #[inline(always)]
    fn patch_segment<T: Wide>(
        &self,
        plane: &[T],
        (oy, cols): (usize, std::ops::Range<usize>),
        (ri, si): (usize, usize),
        seg: &mut [T::Acc],
    ) {
        let g = self;
        let (ox0, ox1) = (cols.start, cols.end);
        let Some(iy) = g.input_row(oy, ri) else {
            fill_zero(seg);
            return;
        };
        let row = &plane[iy * g.w..][..g.w];
        let (lo, hi, ix) = g.valid_columns(si, ox0, ox1);
        fill_zero(&mut seg[..lo - ox0]);
        fill_zero(&mut seg[hi - ox0..]);
        let dst = &mut seg[lo - ox0..hi - ox0];
        let sw = g.stride[1];
        match T::as_acc(&row[ix..]) {
            Some(src) if sw == 1 => copy_run(src, dst),
            Some(src) => gather_run(src, sw, dst),
            None if sw == 1 => T::widen_slice(&row[ix..ix + dst.len()], dst),
            None => {
                for (d, x) in dst.iter_mut().zip(row[ix..].iter().step_by(sw)) {
                    *d = x.widen();
                }
            }
        }
    }
}

/// The operands of one convolution, weights and bias in the compute type.
struct Job<'a, T: Wide> {
    g: Geometry,
    input: Raw<T>,
    /// `[K, C/G · R · S]`.
    weight: &'a [T::Acc],
    bias: Option<&'a [T::Acc]>,
    output: Raw<T>,
    /// The gather table of the patches, where they take one.
    table: Option<&'a TapTable>,
}

/// Which kernel family computes a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algorithm {
    /// The default for the shape: depthwise, Winograd or im2col + GEMM (see the module doc).
    Auto,
    /// im2col + GEMM (a pointwise convolution reads its input in place), for any shape.
    Im2col,
    /// Winograd F(2×2, 3×3), for the shapes [`Algorithm::Winograd`] applies to
    /// ([`winograd_applies`]).
    Winograd,
    /// The direct kernel for few input channels (`direct.rs`), for any shape.
    Direct,
    /// [`Algorithm::Direct`] with its register tiles sized for vectors of this many bytes
    /// (another machine's), to test every tile shape on any machine.
    #[cfg(test)]
    DirectTiled(usize),
}

/// NCHW convolution with stride, padding, dilation, groups and bias, by the default kernel for
/// its shape.
pub(crate) fn conv2d(mem: &mut HostMemory, d: &Conv2dDesc, ctx: Ctx) -> Result<()> {
    conv2d_by(mem, d, ctx, Algorithm::Auto)
}

/// [`conv2d`] by `algorithm`. `InvalidArgument` for [`Algorithm::Winograd`] on a shape it does not
/// apply to.
pub(crate) fn conv2d_by(
    mem: &mut HostMemory,
    d: &Conv2dDesc,
    ctx: Ctx,
    algorithm: Algorithm,
) -> Result<()> {
    if algorithm == Algorithm::Winograd && !winograd_applies(d) {
        return Err(BackendError::invalid(
            OP,
            "the Winograd kernel takes 3×3 windows at stride 1 and dilation 1, one group",
        ));
    }
    if d.output_shape.contains(&0) {
        return Ok(()); // No output element: nothing to compute or write.
    }
    let Some(g) = Geometry::of(d) else {
        return reference::conv2d(mem, d);
    };
    with_float!(d.dtype, T => typed::<T>(mem, d, g, ctx, algorithm), _ => reference::conv2d(mem, d))
}

/// The arithmetic of `d` (a validated descriptor) for the threading cost model: two flops per
/// multiply-add of the direct sum, whichever kernel computes it.
pub(crate) fn work(d: &Conv2dDesc) -> Work {
    Work::flops(Geometry::of(d).map_or(0, |g| g.flops()))
}

/// Whether [`Algorithm::Winograd`] can compute `d` (a validated descriptor).
pub(crate) fn winograd_applies(d: &Conv2dDesc) -> bool {
    let elem = if d.dtype == DType::F64 { 8 } else { 4 };
    Geometry::of(d).is_some_and(|g| winograd::applies(&g, elem))
}

/// Whether [`Algorithm::Auto`] takes the direct kernel for `d` (a validated descriptor).
pub(crate) fn direct_preferred(d: &Conv2dDesc) -> bool {
    Geometry::of(d).is_some_and(|g| direct::preferred(&g))
}

/// Whether the autotuner should also time [`Algorithm::Direct`] on `d` (a validated descriptor)
/// where it is not the default: one group of at most [`direct::OFFERED_CHANNELS`] input channels
/// and a window of more than one tap.
pub(crate) fn direct_offered(d: &Conv2dDesc) -> bool {
    Geometry::of(d).is_some_and(|g| direct::offered(&g))
}

/// Whether [`Algorithm::Auto`] takes the Winograd kernel for `d` (a validated descriptor).
pub(crate) fn winograd_preferred(d: &Conv2dDesc) -> bool {
    let elem = if d.dtype == DType::F64 { 8 } else { 4 };
    Geometry::of(d).is_some_and(|g| winograd::preferred(&g, elem))
}

/// [`conv2d`] for element type `T`.
fn typed<T: Wide>(
    mem: &mut HostMemory,
    d: &Conv2dDesc,
    g: Geometry,
    ctx: Ctx,
    algorithm: Algorithm,
) -> Result<()> {
    let input = Raw::<T>::of(mem, OP, d.input, g.n * g.c * g.h * g.w)?;
    let weight = Raw::<T>::of(mem, OP, d.weight, g.k * g.crs())?;
    let bias_raw = d.bias.map(|b| Raw::<T>::of(mem, OP, b, g.k)).transpose()?;
    let output = Raw::<T>::of(mem, OP, d.output, g.n * g.k * g.p())?;
    // SAFETY: the weight and bias regions are inputs (checked not to overlap the output), nothing
    // writes them while the kernel runs.
    let weight = widened(unsafe { weight.get(0, weight.len) })?;
    // SAFETY: as above.
    let bias = match &bias_raw {
        Some(b) => Some(widened(unsafe { b.get(0, b.len) })?),
        None => None,
    };
    let table = g.tap_table()?;
    let job = Job {
        g,
        input,
        weight: &weight,
        bias: bias.as_deref(),
        output,
        table: table.as_ref(),
    };
    let elem = std::mem::size_of::<T::Acc>();
    match algorithm {
        Algorithm::Im2col => job.im2col_gemm(ctx),
        Algorithm::Winograd => job.winograd(ctx),
        Algorithm::Direct => job.direct(ctx),
        #[cfg(test)]
        Algorithm::DirectTiled(bytes) => job.direct_tiled(ctx, bytes),
        Algorithm::Auto if direct::preferred(&g) => job.direct(ctx),
        // One input channel per group takes the depthwise kernel, but for a single group of
        // small planes (a first layer on small images): one GEMM per image beats a pass per
        // output plane.
        Algorithm::Auto if g.cg == 1 && !(g.groups == 1 && table.is_some()) => job.depthwise(ctx),
        Algorithm::Auto if winograd::preferred(&g, elem) => job.winograd(ctx),
        Algorithm::Auto => job.im2col_gemm(ctx),
    }
}

/// How the GEMM path splits its work.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Output positions per block.
    cols: usize,
    /// Blocks per image.
    blocks: usize,
    /// Patch rows per GEMM (all of them unless even [`MIN_COLS`] columns exceed the budget).
    rows: usize,
    /// The GEMM reads the input in place (pointwise, f32/f64): no patch buffer.
    direct: bool,
    /// Items run in parallel (else in turn, with `inner` parallelism in each GEMM).
    parallel: bool,
    /// Threads inside each GEMM.
    inner: Parallelism,
}

impl Plan {
    /// The split for `g` on `threads` threads with `elem`-byte compute elements.
    fn new(g: &Geometry, threads: usize, elem: usize, direct: bool) -> Plan {
        let (p, crs) = (g.p(), g.crs());
        let budget = (COL_BYTES / elem).max(1);
        let (rows, mut cols) = if direct {
            (crs, p)
        } else {
            let rows = crs.min((budget / MIN_COLS).max(1));
            (rows, (budget / rows).max(MIN_COLS))
        };
        if cols > COL_ALIGN {
            cols -= cols % COL_ALIGN;
        }
        let mut blocks = p.div_ceil(cols.min(p));
        let threaded = threads > 1;
        if threaded {
            // Enough items for every thread (twice over, for balance) while blocks stay wide.
            let want = (2 * threads).div_ceil(g.n);
            if blocks < want {
                blocks = blocks.max(want.min(p / MIN_PAR_COLS)).max(1);
            }
        }
        let cols = Self::even(p, blocks);
        let blocks = p.div_ceil(cols);
        let parallel = threaded && g.n * blocks >= threads;
        let inner = if threaded && !parallel {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        Plan {
            cols,
            blocks,
            rows,
            direct,
            parallel,
            inner,
        }
    }

    /// A split for the calling thread alone with blocks of up to `cols` output positions.
    fn serial(g: &Geometry, elem: usize, cols: usize) -> Plan {
        let budget = (COL_BYTES / elem).max(1);
        Plan {
            cols,
            blocks: g.p().div_ceil(cols.max(1)),
            rows: g.crs().min((budget / cols.max(1)).max(1)),
            direct: false,
            parallel: false,
            inner: Parallelism::None,
        }
    }

    /// Block width that splits `p` positions into `blocks` nearly equal blocks, rounded up to
    /// [`COL_ALIGN`] when that keeps the count.
    fn even(p: usize, blocks: usize) -> usize {
        let cols = p.div_ceil(blocks.max(1)).max(1);
        let aligned = cols.next_multiple_of(COL_ALIGN);
        if aligned < p && p.div_ceil(aligned) == blocks {
            aligned
        } else {
            cols
        }
    }
}

/// Per-task buffers of the GEMM path.
struct Scratch<A> {
    /// Patch block, `rows × cols`.
    col: Vec<A>,
    /// Output block in the compute type (half types), `K/G × cols`.
    out: Vec<A>,
}

impl<A: Real> Scratch<A> {
    /// Buffers for `plan` (none that the element type does not need).
    fn new<T: Wide<Acc = A>>(g: &Geometry, plan: &Plan) -> Result<Scratch<A>> {
        let col = if plan.direct {
            0
        } else {
            plan.rows * plan.cols
        };
        let out = if T::NATIVE { 0 } else { g.kg() * plan.cols };
        Ok(Scratch {
            col: zeroed(col)?,
            out: zeroed(out)?,
        })
    }
}

impl<T: Wide> Job<'_, T> {
    /// The im2col + GEMM path (pointwise convolutions included).
    fn im2col_gemm(&self, ctx: Ctx) -> Result<()> {
        let g = &self.g;
        let direct = T::NATIVE && g.pointwise();
        let plan = Plan::new(g, ctx.threads, std::mem::size_of::<T::Acc>(), direct);
        let items = g.n * plan.blocks;
        if plan.parallel {
            parallel_items(items, ctx.threads).try_for_each_init(
                || Scratch::new::<T>(g, &plan),
                |scratch, item| {
                    let scratch = scratch
                        .as_mut()
                        .map_err(|_| out_of_memory::<T::Acc>(plan.rows * plan.cols))?;
                    with_simd(
                        ctx.simd,
                        #[inline(always)]
                        || self.item(item, &plan, scratch),
                    );
                    Ok(())
                },
            )
        } else {
            let mut scratch = Scratch::new::<T>(g, &plan)?;
            for item in 0..items {
                with_simd(
                    ctx.simd,
                    #[inline(always)]
                    || self.item(item, &plan, &mut scratch),
                );
            }
            Ok(())
        }
    }

    /// Work item `item`: one block of output positions of one image, every group.
    #[inline(always)]
    fn item(&self, item: usize, plan: &Plan, scratch: &mut Scratch<T::Acc>) {
        let (img, block) = (item / plan.blocks, item % plan.blocks);
        let p0 = block * plan.cols;
        let pb = plan.cols.min(self.g.p() - p0);
        for group in 0..self.g.groups {
            self.group_block(img, group, p0, pb, plan, scratch);
        }
    }

    /// Output positions `p0 .. p0 + pb` of the channels of `group` in image `img`.
    #[inline(always)]
    fn group_block(
        &self,
        img: usize,
        group: usize,
        p0: usize,
        pb: usize,
        plan: &Plan,
        scratch: &mut Scratch<T::Acc>,
    ) {
        let g = &self.g;
        let (p, kg, crs, hw) = (g.p(), g.kg(), g.crs(), g.h * g.w);
        let out0 = (img * g.k + group * kg) * p + p0;
        let in0 = (img * g.c + group * g.cg) * hw;
        // The destination: the output itself (rows of stride P) or the compute-type block.
        let (dst, dst_rs) = if T::NATIVE {
            (self.output.at(out0).cast::<T::Acc>(), p)
        } else {
            (scratch.out.as_mut_ptr(), pb)
        };
        if let Some(bias) = self.bias {
            for (kk, &b) in bias[group * kg..][..kg].iter().enumerate() {
                if T::NATIVE {
                    // SAFETY: row kk of this block lies inside the output and is written by this
                    // task only (blocks of positions are disjoint across items).
                    let row = unsafe { self.output.get_mut(out0 + kk * p, pb) };
                    if let Some(row) = T::as_acc_mut(row) {
                        row.fill(b);
                    }
                } else {
                    scratch.out[kk * pb..][..pb].fill(b);
                }
            }
        }
        let mut k0 = 0;
        while k0 < crs {
            let k1 = crs.min(k0 + plan.rows);
            let (rhs, rhs_rs) = if plan.direct {
                (self.input.at(in0 + k0 * hw + p0).cast_const().cast(), hw)
            } else {
                // SAFETY: the group's input planes are inside the input, which nothing writes.
                let x = unsafe { self.input.get(in0, g.cg * hw) };
                g.im2col(
                    x,
                    k0,
                    k1,
                    p0,
                    pb,
                    &mut scratch.col[..(k1 - k0) * pb],
                    self.table,
                );
                (scratch.col.as_ptr(), pb)
            };
            // A product threaded by the gemm crate stays whole (one fork-join), and so does a
            // pointwise one: the crate packs its wide input once, where blocks of
            // `NO_REPACK_COLS` rows would each read it in place, strided by the plane (at
            // N1 C256 56² K64 the whole product ran about 25 % faster).
            let split = match plan.inner {
                Parallelism::None if !plan.direct => NO_REPACK_COLS,
                _ => usize::MAX,
            };
            // SAFETY: lhs is rows group·K/G.. of the [K, CRS] weights, columns k0..k1; rhs the
            // [k1 − k0, pb] patch block (or the input channels in place, row stride H·W); dst the
            // [K/G, pb] output block, disjoint from every other task's and from the inputs.
            unsafe {
                Product {
                    m: kg,
                    n: pb,
                    k: k1 - k0,
                    dst,
                    dst_strides: (dst_rs, 1),
                    lhs: self.weight.as_ptr().add(group * kg * crs + k0),
                    lhs_strides: (crs, 1),
                    rhs,
                    rhs_strides: (rhs_rs, 1),
                    alpha: T::Acc::ONE,
                    accumulate: self.bias.is_some() || k0 > 0,
                }
                .run_split(split, plan.inner);
            }
            k0 = k1;
        }
        if !T::NATIVE {
            for kk in 0..kg {
                // SAFETY: as for the bias rows above.
                let row = unsafe { self.output.get_mut(out0 + kk * p, pb) };
                T::narrow_slice(&scratch.out[kk * pb..][..pb], row);
            }
        }
    }

    /// The depthwise path: every output channel reads one input channel.
    fn depthwise(&self, ctx: Ctx) -> Result<()> {
        let g = &self.g;
        let planes = g.n * g.k;
        // Output rows per band: the padded input rows they read (about `sh` per output row) stay
        // within the budget.
        let per_row = g.padded_width().saturating_mul(g.stride[0].clamp(1, g.h));
        let mut band_rows = (DW_BAND_ELEMENTS / per_row.max(1)).clamp(1, g.oh);
        let threaded = ctx.threads > 1;
        if threaded {
            // Enough items for every thread (four each) when there are few planes.
            let want = (4 * ctx.threads).div_ceil(planes);
            band_rows = band_rows.min(g.oh.div_ceil(want)).max(1);
        }
        let bands = g.oh.div_ceil(band_rows);
        let items = planes * bands;
        let rows_of = |b: usize| b * band_rows..g.oh.min((b + 1) * band_rows);
        let run = |item: usize, band: &mut Band<T::Acc>| {
            let (plane, b) = (item / bands, item % bands);
            // The input the next item reads, prefetched while this one computes (a job's items
            // are consecutive), so that a layer whose input comes from memory does not wait for
            // it at the item's start.
            let ahead = match item + 1 < items {
                true => self.depthwise_input((item + 1) / bands, rows_of((item + 1) % bands)),
                false => &[],
            };
            with_simd(
                ctx.simd,
                #[inline(always)]
                || self.depthwise_band(plane, rows_of(b), band, ctx.simd, Ahead::new(ahead)),
            );
        };
        if threaded {
            parallel_items(planes * bands, ctx.threads).try_for_each_init(
                || Band::new(g, band_rows),
                |band, item| {
                    let band = band
                        .as_mut()
                        .map_err(|_| out_of_memory::<T::Acc>(Band::<T::Acc>::len(g, band_rows)))?;
                    run(item, band);
                    Ok(())
                },
            )
        } else {
            let mut band = Band::new(g, band_rows)?;
            for item in 0..items {
                run(item, &mut band);
            }
            Ok(())
        }
    }

    /// The input rows inside the image that output rows `rows` of output plane `plane` read.
    fn depthwise_input(&self, plane: usize, rows: std::ops::Range<usize>) -> &[T] {
        let g = &self.g;
        let (img, ch) = (plane / g.k, plane % g.k);
        let cin = ch / g.kg();
        let (first, end) = Band::<T::Acc>::input_span(g, rows);
        let first = first.min(end);
        // SAFETY: rows first .. end ≤ H of the input plane lie inside the input, which nothing
        // writes.
        unsafe {
            self.input
                .get(((img * g.c + cin) * g.h + first) * g.w, (end - first) * g.w)
        }
    }

    /// Whether [`Self::depthwise_rows`] computes this convolution: a stride-1 square 3×3, 5×5 or
    /// 7×7 window at dilation 1 with an f32 or f64 output.
    fn depthwise_rows_apply(&self) -> bool {
        let g = &self.g;
        let square = matches!(g.s, 3 | 5 | 7) && g.r == g.s;
        T::NATIVE && square && g.stride == [1, 1] && g.dilation == [1, 1]
    }

    /// Output rows `oy .. oy + DW_ROWS` of output plane `plane` of a convolution that
    /// [`Self::depthwise_rows_apply`] takes, in register tiles of `DW_ROWS` rows ([`RowTiles`]) on
    /// the vectors of `simd`, reading the input plane `x` (`H × W`) in place with the channel's
    /// `taps` and `bias`. Returns `false`, writing nothing, for another window.
    #[inline(always)]
    fn depthwise_rows(
        &self,
        x: &[T::Acc],
        taps: &[T::Acc],
        bias: T::Acc,
        plane: usize,
        oy: usize,
        simd: SimdLevel,
    ) -> bool {
        let g = &self.g;
        if !self.depthwise_rows_apply() || x.len() != g.h * g.w || taps.len() != g.s * g.s {
            return false;
        }
        if oy + DW_ROWS > g.oh {
            return false;
        }
        let outs: [*mut T::Acc; DW_ROWS] = std::array::from_fn(|j| {
            self.output
                .at((plane * g.oh + oy + j) * g.ow)
                .cast::<T::Acc>()
        });
        let step = RowTiles {
            g,
            x,
            taps,
            bias,
            oy,
            outs,
        };
        // SAFETY: `RowTiles`' contract: output rows oy .. oy + DW_ROWS of this plane exist
        // (checked above), are f32 or f64 (`T::NATIVE`) and are written by this item only; `x`
        // is one `H × W` plane and `taps` the `K × K` window (checked above).
        unsafe { on_vectors(simd, step) }
    }

    /// Output rows `rows` of output plane `plane` (image · K + channel) of a depthwise convolution:
    /// loads the input rows they read into `band` (widened, zero-padded), then accumulates each
    /// output row [`RUN`] columns at a time in registers over every tap.
    #[inline(always)]
    fn depthwise_band(
        &self,
        plane: usize,
        rows: std::ops::Range<usize>,
        band: &mut Band<T::Acc>,
        simd: SimdLevel,
        mut ahead: Ahead<'_>,
    ) {
        let g = &self.g;
        // Bytes of `ahead` prefetched per output row: all of it by the band's last row.
        let ahead_step = ahead.len().div_ceil(rows.len()).next_multiple_of(64);
        let (img, ch) = (plane / g.k, plane % g.k);
        let cin = ch / g.kg(); // The group of the channel is its input channel.
                               // SAFETY: the input plane lies inside the input, which nothing writes.
        let x = unsafe { self.input.get((img * g.c + cin) * g.h * g.w, g.h * g.w) };
        let taps = &self.weight[ch * g.r * g.s..][..g.r * g.s];
        let bias = self.bias.map_or(T::Acc::ZERO, |b| b[ch]);
        let mut oy = rows.start;
        // Rows in tiles of several, reading the input plane in place; the rest through the band.
        if let Some(x) = T::as_acc(x) {
            while oy + DW_ROWS <= rows.end && self.depthwise_rows(x, taps, bias, plane, oy, simd) {
                ahead.step(DW_ROWS * ahead_step);
                oy += DW_ROWS;
            }
        }
        if oy == rows.end {
            return;
        }
        let first = band.load(g, x, oy..rows.end);
        let mut half_row = std::mem::take(&mut band.out);
        let view = BandView {
            buf: &band.rows,
            wp: band.wp,
            first,
            taps,
            bias,
        };
        // Columns computed a tile at a time (the padded rows are long enough for a last partial
        // tile when the stride is 1 or 2), then one at a time.
        let sw = g.stride[1];
        let mut vector_end = if sw <= 2 { g.ow } else { g.ow - g.ow % RUN };
        for oy in oy..rows.end {
            ahead.step(ahead_step);
            // SAFETY: output row oy of this plane is written by this item only.
            let out = unsafe { self.output.get_mut((plane * g.oh + oy) * g.ow, g.ow) };
            let acc_row: &mut [T::Acc] = match T::as_acc_mut(out) {
                Some(acc) => acc,
                None => &mut half_row,
            };
            let mut c0 = 0;
            while c0 < vector_end {
                let step = if sw == 1 {
                    match (g.s, g.dilation[1]) {
                        (3, 1) => view.unit_tile::<3>(g, oy, c0, acc_row),
                        (5, 1) => view.unit_tile::<5>(g, oy, c0, acc_row),
                        (7, 1) => view.unit_tile::<7>(g, oy, c0, acc_row),
                        _ => view.unit_tile::<0>(g, oy, c0, acc_row),
                    }
                } else {
                    match (vector_end - c0).div_ceil(RUN) {
                        1 => view.block::<1, 4>(g, oy, c0, acc_row),
                        2 => view.block::<2, 2>(g, oy, c0, acc_row),
                        3 => view.block::<3, 1>(g, oy, c0, acc_row),
                        _ => view.block::<4, 1>(g, oy, c0, acc_row),
                    }
                };
                if step == 0 {
                    // A tile that would read past the padded row (not expected: the padded width
                    // covers every tile); the rest of the row is computed column by column.
                    vector_end = c0;
                    break;
                }
                c0 += step;
            }
            for (ox, out) in acc_row.iter_mut().enumerate().skip(vector_end) {
                let mut acc = view.bias;
                for ri in 0..g.r {
                    let Some(row) = view.row(g, oy, ri) else {
                        continue;
                    };
                    for (si, &w) in view.taps[ri * g.s..][..g.s].iter().enumerate() {
                        acc = row[ox * sw + si * g.dilation[1]].mul_add(w, acc);
                    }
                }
                *out = acc;
            }
            if !T::NATIVE {
                // SAFETY: as above; the accumulator was the half types' output row.
                let out = unsafe { self.output.get_mut((plane * g.oh + oy) * g.ow, g.ow) };
                T::narrow_slice(&half_row, out);
            }
        }
        band.out = half_row;
    }
}

/// Output rows a stride-1 depthwise tile of a square window spans ([`RowTiles`]):
/// each input row it loads serves up to this many of them, so a 3×3 window loads an input vector
/// once per two multiply-adds instead of once per one.
const DW_ROWS: usize = 4;

/// Padded input elements a depthwise work item holds at most (its band of output rows is cut to
/// fit, down to one row): 256 KiB of f32, so the band stays in the L2 cache.
const DW_BAND_ELEMENTS: usize = 1 << 16;

/// The input rows a band of depthwise output rows reads, widened and zero-padded on both sides so
/// that every tap of every output column reads inside its row.
struct Band<A> {
    /// Input rows `first ..` (those inside the image), `wp` elements each.
    rows: Vec<A>,
    /// Padded row length ([`Geometry::padded_width`]).
    wp: usize,
    /// The output row in the compute type (half types).
    out: Vec<A>,
}

impl<A: Real> Band<A> {
    /// Input rows a band of `band_rows` output rows reads at most.
    fn input_rows(g: &Geometry, band_rows: usize) -> usize {
        ((band_rows - 1) * g.stride[0] + (g.r - 1) * g.dilation[0] + 1).min(g.h)
    }

    /// Elements of a band's buffers (for the out-of-memory error).
    fn len(g: &Geometry, band_rows: usize) -> usize {
        Self::input_rows(g, band_rows) * g.padded_width() + g.ow
    }

    /// Buffers for bands of up to `band_rows` output rows of `g`.
    fn new(g: &Geometry, band_rows: usize) -> Result<Band<A>> {
        let wp = g.padded_width();
        Ok(Band {
            rows: zeroed(Self::input_rows(g, band_rows) * wp)?,
            wp,
            out: zeroed(g.ow)?,
        })
    }

    /// The input rows inside the image, `first .. end`, that output rows `rows` read (none when
    /// `first ≥ end`; some between them may go unread at a vertical stride above the window's
    /// height).
    fn input_span(g: &Geometry, rows: std::ops::Range<usize>) -> (usize, usize) {
        let (sh, dh, ph) = (g.stride[0], g.dilation[0], g.padding[0]);
        let first = (rows.start * sh).saturating_sub(ph);
        let end = ((rows.end - 1) * sh + (g.r - 1) * dh + 1)
            .saturating_sub(ph)
            .min(g.h);
        (first, end)
    }

    /// Loads the input rows of plane `x` that output rows `rows` read; returns the input row the
    /// buffer starts at.
    #[inline(always)]
    fn load<T: Wide<Acc = A>>(
        &mut self,
        g: &Geometry,
        x: &[T],
        rows: std::ops::Range<usize>,
    ) -> usize {
        let (sh, dh, ph) = (g.stride[0], g.dilation[0], g.padding[0]);
        let (first, end) = Self::input_span(g, rows.clone());
        let needed = |iy: usize| {
            let t = iy + ph;
            (0..g.r).any(|ri| {
                t >= ri * dh
                    && (t - ri * dh).is_multiple_of(sh)
                    && rows.contains(&((t - ri * dh) / sh))
            })
        };
        let pw = g.padding[1].min(self.wp);
        for iy in (first..end).filter(|&iy| needed(iy)) {
            let row = &mut self.rows[(iy - first) * self.wp..][..self.wp];
            let (left, rest) = row.split_at_mut(pw);
            let (mid, right) = rest.split_at_mut(g.w.min(rest.len()));
            fill_zero(left);
            widen_run(&x[iy * g.w..][..g.w], mid);
            fill_zero(right);
        }
        first
    }
}

/// What [`BandView::block`] reads: a loaded band and one channel's taps and bias.
struct BandView<'a, A> {
    buf: &'a [A],
    wp: usize,
    /// The input row the band starts at.
    first: usize,
    /// `R × S` taps.
    taps: &'a [A],
    bias: A,
}

impl<A: Real> BandView<'_, A> {
    /// The padded input row tap row `ri` of output row `oy` reads, or `None` in the padding.
    #[inline(always)]
    fn row(&self, g: &Geometry, oy: usize, ri: usize) -> Option<&[A]> {
        let iy = g.input_row(oy, ri)?;
        self.buf.get((iy - self.first) * self.wp..)?.get(..self.wp)
    }

    /// Output columns `c0 .. c0 + N·RUN` (those below `OW`) of output row `oy` into `out`: `N` runs
    /// of [`RUN`] columns, each summed over the taps in `C` interleaved partial sums, so that `N·C`
    /// independent FMA chains hide the FMA latency. Returns the columns advanced.
    #[inline(always)]
    fn block<const N: usize, const C: usize>(
        &self,
        g: &Geometry,
        oy: usize,
        c0: usize,
        out: &mut [A],
    ) -> usize {
        let (sw, dw) = (g.stride[1], g.dilation[1]);
        let mut acc = [[[A::ZERO; RUN]; N]; C];
        let mut t = 0;
        for ri in 0..g.r {
            let Some(row) = self.row(g, oy, ri) else {
                continue;
            };
            for (si, &w) in self.taps[ri * g.s..][..g.s].iter().enumerate() {
                for (n, chain) in acc[t % C].iter_mut().enumerate() {
                    run_fma(chain, row, (c0 + n * RUN) * sw + si * dw, sw, w);
                }
                t += 1;
            }
        }
        for n in 0..N {
            let mut sum = [self.bias; RUN];
            for chains in &acc {
                for (s, &a) in sum.iter_mut().zip(&chains[n]) {
                    *s += a;
                }
            }
            store_run(&sum, out, c0 + n * RUN);
        }
        N * RUN
    }
}

impl<A: Real> BandView<'_, A> {
    /// Stride 1: output columns `c0 ..` of output row `oy` into `out` in one tile of
    /// [`unit_tile_width`] columns (the lanes below `OW`), by [`Self::unit_block`]. Returns the
    /// columns advanced, or 0 (nothing written) when the tile would read past the padded row.
    #[inline(always)]
    fn unit_tile<const S: usize>(
        &self,
        g: &Geometry,
        oy: usize,
        c0: usize,
        out: &mut [A],
    ) -> usize {
        match unit_tile_width(g.ow - c0) {
            64 => self.unit_block::<64, S>(g, oy, c0, out),
            32 => self.unit_block::<32, S>(g, oy, c0, out),
            16 => self.unit_block::<16, S>(g, oy, c0, out),
            _ => self.unit_block::<8, S>(g, oy, c0, out),
        }
    }

    /// `W` output columns from `c0` of output row `oy` at stride 1, summed over the taps row by row
    /// in order into `W` accumulators that start at the bias. `S` is the taps per row when known at
    /// compile time (3, 5 or 7, with dilation 1: the taps of a row are unrolled over one slice of the
    /// input row), or 0 for any taps and dilation. The accumulators are a value array rebuilt per
    /// tap (`from_fn`), which keeps them in vector registers. Returns `W`, or 0 (nothing written)
    /// when a tap would read past the padded row.
    #[inline(always)]
    fn unit_block<const W: usize, const S: usize>(
        &self,
        g: &Geometry,
        oy: usize,
        c0: usize,
        out: &mut [A],
    ) -> usize {
        let (s, dw) = if S == 0 { (g.s, g.dilation[1]) } else { (S, 1) };
        let span = c0..c0 + (s - 1) * dw + W;
        if span.end > self.wp {
            return 0;
        }
        let mut acc = [self.bias; W];
        for ri in 0..g.r {
            let Some(row) = self.row(g, oy, ri) else {
                continue;
            };
            // Every row is `wp` long, checked above.
            let src = &row[span.clone()];
            for (si, &w) in self.taps[ri * s..][..s].iter().enumerate() {
                let x = &src[si * dw..][..W];
                acc = std::array::from_fn(
                    #[inline(always)]
                    |i| x[i].mul_add(w, acc[i]),
                );
            }
        }
        store_tile(&acc, out, c0);
        W
    }
}

/// [`DW_ROWS`] output rows of a stride-1 depthwise convolution of a square `K × K` window
/// (`K = g.s`) at dilation 1, as a [`Step`] on vectors: each tile is `DW_ROWS` rows × up to
/// [`TILE_VECTORS`] vectors of columns of accumulators in registers, which start at the bias. Each
/// of the `DW_ROWS + K − 1` input rows a tile reads is loaded once per tap column and added to
/// every row of the tile whose window holds it, by tap row within each output row, so every
/// output is the same sum in the same order as [`BandView::unit_block`]'s.
///
/// The input rows are read in place, not copied into a padded band: a vector that reaches past
/// either end of its row loads only its lanes inside it ([`Vector::load_lanes`]), zero in the
/// others, which is the padding's value. Which lanes those are depends on the tile's columns
/// only, so a tile works them out once for all its rows.
struct RowTiles<'v, A> {
    g: &'v Geometry,
    /// The input plane, `H × W`.
    x: &'v [A],
    /// The `K × K` taps.
    taps: &'v [A],
    bias: A,
    /// The first output row.
    oy: usize,
    /// The output rows, `OW` elements each.
    outs: [*mut A; DW_ROWS],
}

/// Vectors of columns a [`RowTiles`] tile spans at most, with 32 vector registers (AVX-512) and
/// with 16: `DW_ROWS ×` this many accumulators, beside the vectors of one input row.
const TILE_VECTORS: [usize; 2] = [2, 4];

/// The input columns one load of a [`RowTiles`] tile reads: whole inside its row (a plain load),
/// or the given lanes only.
#[derive(Clone, Copy)]
enum Lanes<M> {
    All,
    Some(M),
}

impl<A: Real> RowTiles<'_, A> {
    /// The tile of `NV` vectors of columns from `c0`, for a `K`-tap window.
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`; the struct's outputs are valid for `OW` elements each
    /// and written by this thread only, `x` is `H × W` and `taps` is `K × K`.
    #[inline(always)]
    unsafe fn tile<V: Vector<A>, const NV: usize, const K: usize>(&self, c0: usize) {
        let g = self.g;
        // Vector `v` at tap column `si` reads input columns `start ..` of a row.
        // (Loops, not `from_fn`, whose closures may not be inlined into the vectors' code.)
        let mut lanes = [[Lanes::All; NV]; K];
        for (si, tap_lanes) in lanes.iter_mut().enumerate() {
            for (v, vector_lanes) in tap_lanes.iter_mut().enumerate() {
                let start = (c0 + v * V::LANES + si) as isize - g.padding[1] as isize;
                let lo = start.unsigned_abs() * usize::from(start < 0);
                let hi = (g.w as isize - start).max(0) as usize;
                if lo > 0 || hi < V::LANES {
                    *vector_lanes = Lanes::Some(V::lanes(lo, hi));
                }
            }
        }
        let mut acc = [[V::splat(self.bias); NV]; DW_ROWS];
        // Input row by input row, each a separate instance, so that which output rows and taps
        // it meets is known at compile time (a loop over the rows kept a branch per output row).
        macro_rules! input_rows {
            ($($t:literal)*) => { $( self.input_row::<V, NV, K, $t>(c0, &lanes, &mut acc); )* };
        }
        const _: () = assert!(DW_ROWS + 7 - 1 <= 10, "input rows past the unrolled ones");
        input_rows!(0 1 2 3 4 5 6 7 8 9);
        for (acc, &out) in acc.iter().zip(&self.outs) {
            for (v, a) in acc.iter().enumerate() {
                let col = c0 + v * V::LANES;
                // SAFETY: columns below OW of an output row (the caller's contract).
                if col + V::LANES <= g.ow {
                    a.store(out.add(col));
                } else if col < g.ow {
                    a.store_first(out.add(col), g.ow - col);
                }
            }
        }
    }

    /// Adds input row `T` of a tile (`oy + T − ph`, if not padding) at output columns `c0 ..` to
    /// the accumulators of every output row `j` whose window holds it, as its tap row `T − j`,
    /// loading each vector's `lanes`; nothing for `T ≥ DW_ROWS + K − 1`.
    ///
    /// # Safety
    /// As [`RowTiles::tile`], with `lanes` the columns of the row each load reads.
    #[inline(always)]
    unsafe fn input_row<V: Vector<A>, const NV: usize, const K: usize, const T: usize>(
        &self,
        c0: usize,
        lanes: &[[Lanes<V::Lanes>; NV]; K],
        acc: &mut [[V; NV]; DW_ROWS],
    ) {
        if T >= DW_ROWS + K - 1 {
            return;
        }
        let g = self.g;
        let Some(iy) = g.input_row(self.oy, T) else {
            return;
        };
        // Output column c0 reads input column c0 − pw at its first tap: possibly before the row,
        // where no lane is read.
        let p = self
            .x
            .as_ptr()
            .wrapping_add(iy * g.w + c0)
            .wrapping_sub(g.padding[1]);
        for (si, tap_lanes) in lanes.iter().enumerate() {
            let mut x = [V::zero(); NV];
            for (v, (x, &vector_lanes)) in x.iter_mut().zip(tap_lanes).enumerate() {
                let at = p.wrapping_add(si + v * V::LANES);
                // SAFETY: `All` when the vector's columns lie inside the row, else only the
                // lanes inside it (`tile`).
                *x = match vector_lanes {
                    Lanes::All => V::load(at),
                    Lanes::Some(inside) => V::load_lanes(at, inside),
                };
            }
            for (j, acc) in acc.iter_mut().enumerate() {
                if T >= j && T - j < K {
                    // SAFETY: (T − j)·K + si < K·K = taps.len() (the caller's contract).
                    let w = V::splat(*self.taps.get_unchecked((T - j) * K + si));
                    for (a, &x) in acc.iter_mut().zip(&x) {
                        *a = x.mul_add(w, *a);
                    }
                }
            }
        }
    }

    /// Every column of the rows, in tiles of `NV` vectors (fewer for the last), for a `K`-tap
    /// window.
    ///
    /// # Safety
    /// As [`RowTiles::tile`].
    #[inline(always)]
    unsafe fn columns<V: Vector<A>, const NV: usize, const K: usize>(&self) {
        let lanes = V::LANES;
        let mut c0 = 0;
        while c0 < self.g.ow {
            let left = (self.g.ow - c0).div_ceil(lanes).min(NV);
            match left {
                1 => self.tile::<V, 1, K>(c0),
                2 => self.tile::<V, 2, K>(c0),
                3 if NV >= 3 => self.tile::<V, 3, K>(c0),
                _ => self.tile::<V, NV, K>(c0),
            }
            c0 += left * lanes;
        }
    }

    /// [`RowTiles::columns`] for the window of `g`; `false`, writing nothing, for a window other
    /// than 3, 5 or 7 taps.
    ///
    /// # Safety
    /// As [`RowTiles::tile`].
    #[inline(always)]
    unsafe fn window<V: Vector<A>, const NV: usize>(&self) -> bool {
        match self.g.s {
            3 => self.columns::<V, NV, 3>(),
            5 => self.columns::<V, NV, 5>(),
            7 => self.columns::<V, NV, 7>(),
            _ => return false,
        }
        true
    }
}

impl<A: Real> Step<A> for RowTiles<'_, A> {
    type Out = bool;

    #[inline(always)]
    unsafe fn run<V: Vector<A>>(self) -> bool {
        // Registers of the level: 32 where a vector is 64 bytes (AVX-512), else 16.
        if V::LANES * std::mem::size_of::<A>() >= 64 {
            self.window::<V, { TILE_VECTORS[1] }>()
        } else {
            self.window::<V, { TILE_VECTORS[0] }>()
        }
    }
}

/// The width of the next stride-1 depthwise tile with `left` output columns to go: the widest of
/// 64, 32, 16 and 8 that is at most a third wider than `left` (so a row of 56 is one tile of 64,
/// a row of 28 one of 32), 8 below that. A tile of 64 f32 is eight AVX2 or four AVX-512 registers;
/// narrower tiles pay the per-tap overhead on fewer multiply-adds, so wide rows take wide tiles.
#[inline(always)]
fn unit_tile_width(left: usize) -> usize {
    [64, 32, 16]
        .into_iter()
        .find(|&w| 4 * left > 3 * w)
        .unwrap_or(8)
}

/// `out[start + l] = tile[l]` for the lanes inside `out`; a last partial tile in fixed-size
/// chunks ([`copy_run`]), not a library call per row.
#[inline(always)]
fn store_tile<A: Real, const W: usize>(tile: &[A; W], out: &mut [A], start: usize) {
    if let Some(dst) = out.get_mut(start..start + W) {
        dst.copy_from_slice(tile);
    } else if let Some(dst) = out.get_mut(start..) {
        copy_run(tile, dst);
    }
}

/// `out[start + l] = run[l]` for the lanes inside `out` (a masked store for a last partial run).
#[inline(always)]
fn store_run<A: Real>(run: &[A; RUN], out: &mut [A], start: usize) {
    if let Some(dst) = out.get_mut(start..start + RUN) {
        dst.copy_from_slice(run);
    } else if let Some(dst) = out.get_mut(start..) {
        let n = dst.len();
        for (l, &v) in run.iter().enumerate() {
            if l < n {
                dst[l] = v;
            }
        }
    }
}

/// `acc[l] += w · row[base + l · stride]` for the [`RUN`] lanes.
#[inline(always)]
fn run_fma<A: Real>(acc: &mut [A; RUN], row: &[A], base: usize, stride: usize, w: A) {
    let mut xs = [A::ZERO; RUN];
    if stride == 1 {
        xs.copy_from_slice(&row[base..base + RUN]);
    } else {
        let src = &row[base..base + (RUN - 1) * stride + 1];
        for (l, x) in xs.iter_mut().enumerate() {
            *x = src[l * stride];
        }
    }
    for (a, &x) in acc.iter_mut().zip(&xs) {
        *a = x.mul_add(w, *a);
    }
}

/// Elements the patch copies move per fixed-size chunk (a cache line of f32: one AVX-512 register).
const RUN: usize = 16;

/// `dst = src[..dst.len()]`, in fixed-size chunks (inline vector moves rather than a library call
/// per short run), the last chunk overlapping the one before.
#[inline(always)]
fn copy_run<A: Real>(src: &[A], dst: &mut [A]) {
    let n = dst.len();
    let src = &src[..n];
    if n < RUN {
        dst.copy_from_slice(src);
        return;
    }
    for (d, s) in dst.chunks_exact_mut(RUN).zip(src.chunks_exact(RUN)) {
        d.copy_from_slice(s);
    }
    dst[n - RUN..].copy_from_slice(&src[n - RUN..]);
}

/// `dst = widen(src[..dst.len()])`: [`copy_run`] for f32 and f64, the bulk conversion otherwise.
#[inline(always)]
fn widen_run<T: Wide>(src: &[T], dst: &mut [T::Acc]) {
    match T::as_acc(src) {
        Some(src) => copy_run(src, dst),
        None => T::widen_slice(src, dst),
    }
}

/// `dst[i] = src[i · stride]`, in fixed-size chunks for strides 1 and 2 (moves and shuffles
/// instead of gathers).
#[inline(always)]
fn gather_run<A: Real>(src: &[A], stride: usize, dst: &mut [A]) {
    let n = dst.len();
    if stride == 1 {
        copy_run(src, dst);
        return;
    }
    if stride == 2 && n >= RUN && src.len() >= 2 * n - 1 {
        let mut i = 0;
        while i + RUN <= n && 2 * (i + RUN) <= src.len() {
            let s = &src[2 * i..][..2 * RUN];
            for (j, d) in dst[i..i + RUN].iter_mut().enumerate() {
                *d = s[2 * j];
            }
            i += RUN;
        }
        for (j, d) in dst[i..].iter_mut().enumerate() {
            *d = src[2 * (i + j)];
        }
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src.iter().step_by(stride)) {
        *d = s;
    }
}

/// Sets `dst` to zero, in fixed-size chunks where it is long.
#[inline(always)]
fn fill_zero<A: Real>(dst: &mut [A]) {
    let n = dst.len();
    if n < RUN {
        // A masked store rather than a `memset` call for a few elements: the fixed trip count is what
        // lets it compile to one masked vector store.
        #[allow(clippy::needless_range_loop)]
        for l in 0..RUN {
            if l < n {
                dst[l] = A::ZERO;
            }
        }
        return;
    }
    for d in dst.chunks_exact_mut(RUN) {
        d.copy_from_slice(&[A::ZERO; RUN]);
    }
    dst[n - RUN..].copy_from_slice(&[A::ZERO; RUN]);
}

impl OpImpl<Conv2dDesc> for CpuBackend {
    fn op(&self, desc: &Conv2dDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.conv2d_forward(desc);
        };
        self.kernel_computing(acc, work(desc), |mem, ctx| conv2d(mem, desc, ctx))
    }
}

mod backward;
mod direct;
#[cfg(test)]
mod tests;
mod tile;
mod winograd;
