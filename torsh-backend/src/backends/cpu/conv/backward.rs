//! The gradients of a 2-D convolution on the CPU, as GEMMs on the forward's patch matrices:
//!
//! - **input** (col2im): for each image, group and block of output positions, the patch-matrix
//!   gradient `W_gᵀ · dY_g` (`C/G·R·S × positions`) is built a cache-sized block at a time and added
//!   into the input planes under each tap. Work items are (image, group, block of input channels):
//!   a block's planes are written by its item alone, so overlapping windows need no atomics and the
//!   result does not depend on how the threads are scheduled. A pointwise convolution (1×1, stride 1,
//!   no padding) accumulates its product straight into the planes.
//! - **weight**: `dW_g = Σ_images dY_g · patchesᵀ`, with the patch matrix built by the forward's
//!   im2col a block of positions at a time. Work items are (group, block of patch rows): each owns
//!   its columns of `dW`, accumulated over every image and position in order.
//!
//! f32 and f64 compute in themselves; f16 and bf16 are widened a block at a time, accumulate in f32
//! and are rounded once on store. The transposed convolution runs on the input gradient.

use gemm::Parallelism;

use super::{
    out_of_memory, parallel_items, reference, widened, zeroed, Geometry, Product, Raw, TapTable,
    Wide, COL_BYTES, MIN_COLS,
};
use crate::backends::cpu::cost::Work;
use crate::backends::cpu::host::{with_float, with_simd, Ctx, Real};
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::memory::HostMemory;
use crate::compute::op::OpImpl;
use crate::compute::{
    ComputeBackend, Conv2dBackwardInputDesc, Conv2dBackwardWeightDesc, Conv2dDesc, DevicePtr,
};
use crate::error::Result;

/// The op names in errors.
const INPUT_OP: &str = "conv2d_backward_input";
const WEIGHT_OP: &str = "conv2d_backward_weight";

/// The most patch rows one item of the weight gradient takes.
const WEIGHT_ROWS: usize = 192;

/// The geometry of the forward convolution whose gradients are computed, or `None` for the shapes
/// left to the reference kernels ([`Geometry::of`]).
fn geometry(
    input_shape: [usize; 4],
    weight_shape: [usize; 4],
    output_shape: [usize; 4],
    (stride, padding, dilation, groups): ([usize; 2], [usize; 2], [usize; 2], usize),
) -> Option<Geometry> {
    Geometry::of(&Conv2dDesc {
        dtype: crate::dtype::DType::F32,
        input: DevicePtr(0),
        input_shape,
        weight: DevicePtr(0),
        weight_shape,
        bias: None,
        output: DevicePtr(0),
        output_shape,
        stride,
        padding,
        dilation,
        groups,
    })
}

/// How a gradient splits its work into items.
#[derive(Clone, Copy, Debug)]
struct Split {
    /// Channels (input gradient) or patch rows (weight gradient) per item.
    per_item: usize,
    /// Items per group and image.
    blocks: usize,
    /// Items run in parallel (else in turn, each GEMM threaded by `inner`).
    parallel: bool,
    /// Threads inside each GEMM.
    inner: Parallelism,
}

impl Split {
    /// Splits `len` channels or rows of each of `outer` (image, group) pairs into enough items for
    /// `threads` (twice over, for balance), no block narrower than `min` unless `len` is.
    fn new(outer: usize, len: usize, min: usize, threads: usize) -> Split {
        let threaded = threads > 1;
        let mut blocks = 1;
        if threaded {
            let want = (2 * threads).div_ceil(outer.max(1));
            blocks = want.min(len.div_ceil(min.max(1))).max(1);
        }
        let per_item = len.div_ceil(blocks).max(1);
        let blocks = len.div_ceil(per_item).max(1);
        let parallel = threaded && outer * blocks >= threads;
        let inner = if threaded && !parallel {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        Split {
            per_item,
            blocks,
            parallel,
            inner,
        }
    }

    /// Output positions per block when each holds `rows` patch rows of `elem`-byte elements: the
    /// patch block stays within [`COL_BYTES`].
    fn columns(rows: usize, elem: usize, positions: usize) -> usize {
        ((COL_BYTES / elem.max(1)) / rows.max(1))
            .max(MIN_COLS)
            .min(positions)
            .max(1)
    }

    /// Runs `item(i, scratch)` for every item, in parallel or in turn, each with its own scratch
    /// from `scratch` (an allocation failure is `OutOfMemory`).
    fn run<S: Send>(
        &self,
        items: usize,
        ctx: Ctx,
        scratch: impl Fn() -> Result<S> + Sync + Send,
        item: impl Fn(usize, &mut S) + Sync + Send,
    ) -> Result<()> {
        if self.parallel {
            parallel_items(items, ctx.threads).try_for_each_init(&scratch, |s, i| {
                // A failed allocation reports its own error (the first item of its job to see it).
                let s = s
                    .as_mut()
                    .map_err(|e| std::mem::replace(e, out_of_memory::<u8>(0)))?;
                with_simd(
                    ctx.simd,
                    #[inline(always)]
                    || item(i, s),
                );
                Ok(())
            })
        } else {
            let mut s = scratch()?;
            for i in 0..items {
                with_simd(
                    ctx.simd,
                    #[inline(always)]
                    || item(i, &mut s),
                );
            }
            Ok(())
        }
    }
}

/// The arithmetic of either gradient of the convolution of `[input, weight, output]` shapes for the
/// threading cost model (module `cost`): each gradient does the forward's multiply-adds, two flops
/// each.
fn work(
    [input, weight, output]: [[usize; 4]; 3],
    window: ([usize; 2], [usize; 2], [usize; 2], usize),
) -> Work {
    Work::flops(geometry(input, weight, output, window).map_or(0, |g| g.flops()))
}

/// The input gradient (and transposed convolution) `d`.
pub(crate) fn backward_input(
    mem: &mut HostMemory,
    d: &Conv2dBackwardInputDesc,
    ctx: Ctx,
) -> Result<()> {
    if d.grad_input_shape.contains(&0) {
        return Ok(()); // No element to write.
    }
    let window = (d.stride, d.padding, d.dilation, d.groups);
    let Some(g) = geometry(
        d.grad_input_shape,
        d.weight_shape,
        d.grad_output_shape,
        window,
    ) else {
        return reference::conv2d_backward_input(mem, d);
    };
    with_float!(d.dtype, T => input_typed::<T>(mem, d, g, ctx), _ => reference::conv2d_backward_input(mem, d))
}

/// Per-item buffers of the input gradient.
struct InputScratch<A> {
    /// Patch-gradient block, `rows × cols`.
    col: Vec<A>,
    /// Widened block of the output gradient (half types), `K/G × cols`.
    dy: Vec<A>,
    /// The item's input planes in the compute type (half types), `channels × H·W`.
    planes: Vec<A>,
}

/// [`backward_input`] for element type `T`.
fn input_typed<T: Wide>(
    mem: &mut HostMemory,
    d: &Conv2dBackwardInputDesc,
    g: Geometry,
    ctx: Ctx,
) -> Result<()> {
    let (p, hw, kg, taps) = (g.p(), g.h * g.w, g.kg(), g.r * g.s);
    let dy = Raw::<T>::of(mem, INPUT_OP, d.grad_output, g.n * g.k * p)?;
    let weight = Raw::<T>::of(mem, INPUT_OP, d.weight, g.k * g.crs())?;
    let bias_raw = d
        .bias
        .map(|b| Raw::<T>::of(mem, INPUT_OP, b, g.c))
        .transpose()?;
    let dx = Raw::<T>::of(mem, INPUT_OP, d.grad_input, g.n * g.c * hw)?;
    // SAFETY: the weight and bias are inputs (checked not to overlap the output); nothing writes
    // them while the kernel runs.
    let weight = widened(unsafe { weight.get(0, g.k * g.crs()) })?;
    // SAFETY: as above.
    let bias = match &bias_raw {
        Some(b) => Some(widened(unsafe { b.get(0, g.c) })?),
        None => None,
    };
    let split = Split::new(g.n * g.groups, g.cg, 1, ctx.threads);
    let direct = g.pointwise();
    let table = g.tap_table()?;
    let rows_max = split.per_item * taps;
    let cols = Split::columns(rows_max, std::mem::size_of::<T::Acc>(), p);
    let items = g.n * g.groups * split.blocks;
    let scratch = || -> Result<InputScratch<T::Acc>> {
        Ok(InputScratch {
            col: zeroed(if direct { 0 } else { rows_max * cols })?,
            dy: zeroed(if T::NATIVE { 0 } else { kg * cols })?,
            planes: zeroed(if T::NATIVE { 0 } else { split.per_item * hw })?,
        })
    };
    let item = |i: usize, s: &mut InputScratch<T::Acc>| {
        let (pair, block) = (i / split.blocks, i % split.blocks);
        let (img, group) = (pair / g.groups, pair % g.groups);
        let c0 = block * split.per_item;
        let cb = split.per_item.min(g.cg - c0);
        let first = (img * g.c + group * g.cg + c0) * hw;
        // The item's planes: the gradient itself, or the compute-type copy.
        // SAFETY: planes c0..c0 + cb of this image and group are written by this item alone.
        let out = unsafe { dx.get_mut(first, cb * hw) };
        let planes: &mut [T::Acc] = match T::as_acc_mut(out) {
            Some(acc) => acc,
            None => &mut s.planes[..cb * hw],
        };
        for (ci, plane) in planes.chunks_exact_mut(hw).enumerate() {
            let b = bias
                .as_ref()
                .map_or(T::Acc::ZERO, |b| b[group * g.cg + c0 + ci]);
            plane.fill(b);
        }
        if kg > 0 {
            let mut p0 = 0;
            while p0 < p {
                let pb = cols.min(p - p0);
                let dy0 = (img * g.k + group * kg) * p + p0;
                let (rhs, rhs_rs) = if T::NATIVE {
                    (dy.at(dy0).cast_const().cast::<T::Acc>(), p)
                } else {
                    for kk in 0..kg {
                        // SAFETY: row kk of this block of the output gradient, an input.
                        let row = unsafe { dy.get(dy0 + kk * p, pb) };
                        T::widen_slice(row, &mut s.dy[kk * pb..][..pb]);
                    }
                    (s.dy.as_ptr(), pb)
                };
                let rows = cb * taps;
                let lhs = weight[group * kg * g.crs() + c0 * taps..].as_ptr();
                let (dst, dst_rs) = if direct {
                    (planes[p0..].as_mut_ptr(), hw)
                } else {
                    (s.col.as_mut_ptr(), pb)
                };
                // SAFETY: lhs is Wᵀ restricted to this item's patch rows (row i, column j at
                // W[(group·K/G + j)·CRS + c0·R·S + i]); rhs the [K/G, pb] output-gradient block;
                // dst the [rows, pb] patch-gradient block (or, pointwise, the item's planes at
                // positions p0.., which it adds into), owned by this item.
                unsafe {
                    Product {
                        m: rows,
                        n: pb,
                        k: kg,
                        dst,
                        dst_strides: (dst_rs, 1),
                        lhs,
                        lhs_strides: (1, g.crs()),
                        rhs,
                        rhs_strides: (rhs_rs, 1),
                        alpha: T::Acc::ONE,
                        accumulate: direct,
                    }
                    .run(split.inner);
                }
                if !direct {
                    let col = &s.col[..rows * pb];
                    col2im(&g, col, planes, (c0, cb), (p0, pb), table.as_ref());
                }
                p0 += pb;
            }
        }
        if !T::NATIVE {
            // SAFETY: as above.
            let out = unsafe { dx.get_mut(first, cb * hw) };
            T::narrow_slice(&s.planes[..cb * hw], out);
        }
    };
    split.run(items, ctx, scratch, item)
}

/// Adds the patch-gradient block `col` (rows: the taps of channels `c0 .. c0 + cb` of a group,
/// columns: output positions `p0 .. p0 + pb`) into those channels' input `planes`, each value to the
/// input element its tap reads (through `table` when given: it must be `g`'s).
#[inline(always)]
fn col2im<A: Real>(
    g: &Geometry,
    col: &[A],
    planes: &mut [A],
    (_c0, cb): (usize, usize),
    (p0, pb): (usize, usize),
    table: Option<&TapTable>,
) {
    let (taps, hw, sw) = (g.r * g.s, g.h * g.w, g.stride[1]);
    for (kk, row) in col.chunks_exact(pb).enumerate().take(cb * taps) {
        let (ci, tap) = (kk / taps, kk % taps);
        let (ri, si) = (tap / g.s, tap % g.s);
        let plane = &mut planes[ci * hw..][..hw];
        if let Some(table) = table {
            for (&v, &o) in row.iter().zip(table.row(tap, p0, pb)) {
                if let Some(d) = plane.get_mut(o as usize) {
                    *d += v;
                }
            }
            continue;
        }
        let mut pos = p0;
        while pos < p0 + pb {
            let (oy, ox0) = (pos / g.ow, pos % g.ow);
            let ox1 = g.ow.min(ox0 + (p0 + pb - pos));
            if let Some(iy) = g.input_row(oy, ri) {
                let (lo, hi, ix) = g.valid_columns(si, ox0, ox1);
                let src = &row[pos - p0 + (lo - ox0)..][..hi - lo];
                let dst = &mut plane[iy * g.w + ix..];
                if sw == 1 {
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d += v;
                    }
                } else {
                    for (d, &v) in dst.iter_mut().step_by(sw).zip(src) {
                        *d += v;
                    }
                }
            }
            pos += ox1 - ox0;
        }
    }
}

/// The weight gradient `d`.
pub(crate) fn backward_weight(
    mem: &mut HostMemory,
    d: &Conv2dBackwardWeightDesc,
    ctx: Ctx,
) -> Result<()> {
    if d.weight_shape.contains(&0) {
        return Ok(()); // No element to write.
    }
    let window = (d.stride, d.padding, d.dilation, d.groups);
    let Some(g) = geometry(d.input_shape, d.weight_shape, d.grad_output_shape, window) else {
        return reference::conv2d_backward_weight(mem, d);
    };
    with_float!(d.dtype, T => weight_typed::<T>(mem, d, g, ctx), _ => reference::conv2d_backward_weight(mem, d))
}

/// Per-item buffers of the weight gradient.
struct WeightScratch<A> {
    /// Patch block, `rows × cols`.
    col: Vec<A>,
    /// Widened block of the output gradient (half types), `K/G × cols`.
    dy: Vec<A>,
    /// The item's gradient columns in the compute type (half types), `K/G × rows`.
    acc: Vec<A>,
}

/// [`backward_weight`] for element type `T`.
fn weight_typed<T: Wide>(
    mem: &mut HostMemory,
    d: &Conv2dBackwardWeightDesc,
    g: Geometry,
    ctx: Ctx,
) -> Result<()> {
    let (p, hw, kg, crs) = (g.p(), g.h * g.w, g.kg(), g.crs());
    let x = Raw::<T>::of(mem, WEIGHT_OP, d.input, g.n * g.c * hw)?;
    let dy = Raw::<T>::of(mem, WEIGHT_OP, d.grad_output, g.n * g.k * p)?;
    let dw = Raw::<T>::of(mem, WEIGHT_OP, d.grad_weight, g.k * crs)?;
    // Items of at most WEIGHT_ROWS patch rows, so that each product's destination block stays in
    // the cache while the block of positions (its depth) is wide; at least 16 rows, narrower
    // blocks making products too thin to pay.
    let mut split = Split::new(g.groups, crs, 16, ctx.threads);
    if split.per_item > WEIGHT_ROWS {
        split.per_item = WEIGHT_ROWS;
        split.blocks = crs.div_ceil(WEIGHT_ROWS);
        split.parallel = ctx.threads > 1 && g.groups * split.blocks >= ctx.threads;
        if split.parallel {
            split.inner = Parallelism::None;
        }
    }
    let direct = T::NATIVE && g.pointwise();
    let table = g.tap_table()?;
    let cols = Split::columns(split.per_item, std::mem::size_of::<T::Acc>(), p);
    let items = g.groups * split.blocks;
    let scratch = || -> Result<WeightScratch<T::Acc>> {
        Ok(WeightScratch {
            col: zeroed(if direct { 0 } else { split.per_item * cols })?,
            dy: zeroed(if T::NATIVE { 0 } else { kg * cols })?,
            acc: zeroed(if T::NATIVE { 0 } else { kg * split.per_item })?,
        })
    };
    let item = |i: usize, s: &mut WeightScratch<T::Acc>| {
        let (group, block) = (i / split.blocks, i % split.blocks);
        let k0 = block * split.per_item;
        let rb = split.per_item.min(crs - k0);
        let w0 = group * kg * crs + k0;
        // The destination: columns k0..k0 + rb of the group's rows (row stride CRS), or the
        // compute-type block (row stride rb).
        let (dst, dst_rs) = if T::NATIVE {
            for kk in 0..kg {
                // SAFETY: these columns of the group's rows are written by this item alone.
                let row = unsafe { dw.get_mut(w0 + kk * crs, rb) };
                if let Some(row) = T::as_acc_mut(row) {
                    row.fill(T::Acc::ZERO);
                }
            }
            (dw.at(w0).cast::<T::Acc>(), crs)
        } else {
            s.acc.fill(T::Acc::ZERO);
            (s.acc.as_mut_ptr(), rb)
        };
        for img in 0..g.n {
            let in0 = (img * g.c + group * g.cg) * hw;
            // SAFETY: the group's input planes of this image lie inside the input, an input.
            let planes = unsafe { x.get(in0, g.cg * hw) };
            let mut p0 = 0;
            while p0 < p {
                let pb = cols.min(p - p0);
                let dy0 = (img * g.k + group * kg) * p + p0;
                let (lhs, lhs_rs) = if T::NATIVE {
                    (dy.at(dy0).cast_const().cast::<T::Acc>(), p)
                } else {
                    for kk in 0..kg {
                        // SAFETY: row kk of this block of the output gradient, an input.
                        let row = unsafe { dy.get(dy0 + kk * p, pb) };
                        T::widen_slice(row, &mut s.dy[kk * pb..][..pb]);
                    }
                    (s.dy.as_ptr(), pb)
                };
                let (rhs, rhs_strides) = if direct {
                    (
                        x.at(in0 + k0 * hw + p0).cast_const().cast::<T::Acc>(),
                        (1, hw),
                    )
                } else {
                    g.im2col(
                        planes,
                        k0,
                        k0 + rb,
                        p0,
                        pb,
                        &mut s.col[..rb * pb],
                        table.as_ref(),
                    );
                    (s.col.as_ptr(), (1, pb))
                };
                // SAFETY: lhs is the [K/G, pb] output-gradient block; rhs the transposed
                // [rb, pb] patch block (or the input planes in place); dst this item's [K/G, rb]
                // columns of the gradient, which it adds into.
                unsafe {
                    Product {
                        m: kg,
                        n: rb,
                        k: pb,
                        dst,
                        dst_strides: (dst_rs, 1),
                        lhs,
                        lhs_strides: (lhs_rs, 1),
                        rhs,
                        rhs_strides,
                        alpha: T::Acc::ONE,
                        accumulate: true,
                    }
                    .run(split.inner);
                }
                p0 += pb;
            }
        }
        if !T::NATIVE {
            for kk in 0..kg {
                // SAFETY: as above.
                let row = unsafe { dw.get_mut(w0 + kk * crs, rb) };
                T::narrow_slice(&s.acc[kk * rb..][..rb], row);
            }
        }
    };
    split.run(items, ctx, scratch, item)
}

impl OpImpl<Conv2dBackwardInputDesc> for CpuBackend {
    fn op(&self, desc: &Conv2dBackwardInputDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.conv2d_backward_input(desc);
        };
        let window = (desc.stride, desc.padding, desc.dilation, desc.groups);
        let shapes = [
            desc.grad_input_shape,
            desc.weight_shape,
            desc.grad_output_shape,
        ];
        self.kernel_computing(acc, work(shapes, window), |mem, ctx| {
            backward_input(mem, desc, ctx)
        })
    }
}

impl OpImpl<Conv2dBackwardWeightDesc> for CpuBackend {
    fn op(&self, desc: &Conv2dBackwardWeightDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.conv2d_backward_weight(desc);
        };
        let window = (desc.stride, desc.padding, desc.dilation, desc.groups);
        let shapes = [desc.input_shape, desc.weight_shape, desc.grad_output_shape];
        self.kernel_computing(acc, work(shapes, window), |mem, ctx| {
            backward_weight(mem, desc, ctx)
        })
    }
}
