//! Host side of `shaders/gemm.wgsl`: GEMM, strided batched GEMM and GEMV in f32, and in f16 (f32
//! accumulation) on devices with `SHADER_F16`; other dtypes are staged.
//!
//! The descriptors are column-major with leading dimensions; each operand becomes (element offset,
//! row stride, column stride) of `op(X)`, so transposes cost nothing and GEMV is the same kernel with
//! one column (x and y as strided vectors). Products of more tiles along a side than a grid
//! dimension holds run as blocks of C, a launch each. Offsets and strides must fit the kernel's
//! 32-bit words; operands that do not, misaligned ones and other dtypes answer [`Launch::Stage`].

use crate::compute::{BatchedGemmDesc, DevicePtr, GemmDesc, GemvDesc, Transpose};
use crate::error::Result;

use super::context::Gpu;
use super::elementwise::Launch;
use super::large::{pieces, Loops, Plan};
use super::loops;
use super::math_dtype;
use super::memory::{Binding, Memory};
use super::pipelines::{for_dtype, Dispatch, Kernels, Module, GEMM, GEMM_F16};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;

/// Rows and columns of C per workgroup (the shader's `TILE` override): the autotuner's GEMM variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tile {
    /// 64 × 64 with 64 threads: the default.
    Large,
    /// 32 × 32 with 16 threads: four times the workgroups, for products too small to fill the device.
    Small,
}

impl Tile {
    /// The variants' names, the default first.
    pub const NAMES: [&'static str; 2] = ["tile:64", "tile:32"];

    /// The tile's side in elements.
    pub fn side(self) -> usize {
        match self {
            Tile::Large => 64,
            Tile::Small => 32,
        }
    }

    /// The variant's name for the autotuner.
    pub fn name(self) -> &'static str {
        match self {
            Tile::Large => Tile::NAMES[0],
            Tile::Small => Tile::NAMES[1],
        }
    }
}

/// The longest inner dim one launch with `tile` takes within the device's loop budget
/// (`loops.rs`); `None` when not even one step of it fits.
pub(crate) fn max_inner(gpu: &Gpu, tile: Tile) -> Option<usize> {
    loops::longest(usize::MAX / 2, gpu.loop_limit, |k| {
        loops::gemm(tile.side(), k)
    })
}

/// An operand as the kernel sees it: buffer, element offset, row and column strides, batch stride.
struct Operand<'a> {
    buffer: Binding<'a>,
    offset: usize,
    rows: usize,
    cols: usize,
    batch: usize,
}

/// The operand at `ptr` (elements of `size` bytes) with `(row, column)` strides in elements; `None`
/// when misaligned.
fn operand<'a>(
    mem: &'a Memory,
    ptr: DevicePtr,
    size: usize,
    strides: (usize, usize),
    batch: usize,
) -> Result<Option<Operand<'a>>> {
    Ok(mem.elements(ptr, size)?.map(|(buffer, offset)| Operand {
        buffer,
        offset,
        rows: strides.0,
        cols: strides.1,
        batch,
    }))
}

/// `(row, column)` strides of `op(X)` for a column-major X with leading dimension `ld`.
fn strides(t: Transpose, ld: usize) -> (usize, usize) {
    match t {
        Transpose::No => (1, ld),
        Transpose::Yes => (ld, 1),
    }
}

/// One (batched) product as the kernel takes it.
struct Product<'a> {
    /// The module for the operands' dtype.
    module: Module,
    m: usize,
    n: usize,
    k: usize,
    batch_count: usize,
    a: Operand<'a>,
    b: Operand<'a>,
    c: Operand<'a>,
    alpha: f64,
    beta: f64,
}

/// Launches `p` with `tile` × `tile` output tiles, splitting the batch across launches of at most the
/// device's z limit. `Stage` when a number does not fit in 32 bits.
fn run(gpu: &Gpu, kernels: &Kernels, p: Product<'_>, tile: Tile) -> Result<Launch> {
    if p.m == 0 || p.n == 0 || p.batch_count == 0 {
        return Ok(Launch::Done);
    }
    let word = |v: usize| u32::try_from(v).ok();
    // Every element index the kernel forms must fit: the last element of each operand.
    let last = |o: &Operand<'_>, rows: usize, cols: usize| {
        o.offset
            .checked_add((rows - 1).checked_mul(o.rows)?)?
            .checked_add(cols.saturating_sub(1).checked_mul(o.cols)?)?
            .checked_add((p.batch_count - 1).checked_mul(o.batch)?)
    };
    let fits = [
        last(&p.a, p.m, p.k.max(1)),
        last(&p.b, p.k.max(1), p.n),
        last(&p.c, p.m, p.n),
    ]
    .iter()
    .all(|l| l.and_then(word).is_some());
    let header = [p.m, p.n, p.k].map(word);
    let views = [&p.a, &p.b, &p.c].map(|o| [o.offset, o.rows, o.cols].map(word));
    let batches = [p.a.batch, p.b.batch, p.c.batch].map(word);
    if !fits
        || header.iter().any(Option::is_none)
        || views.iter().flatten().any(Option::is_none)
        || batches.iter().any(Option::is_none)
    {
        return Ok(Launch::Stage);
    }
    let limit = gpu.limits.max_compute_workgroups_per_dimension as usize;
    let mut words = vec![0u32; 19];
    for (i, h) in header.iter().enumerate() {
        words[i] = h.unwrap_or(0);
    }
    for (v, view) in views.iter().enumerate() {
        for (j, w) in view.iter().enumerate() {
            words[4 + 3 * v + j] = w.unwrap_or(0);
        }
    }
    for (i, s) in batches.iter().enumerate() {
        words[13 + i] = s.unwrap_or(0);
    }
    words[16] = (p.alpha as f32).to_bits();
    words[17] = (p.beta as f32).to_bits();
    words[18] = u32::from(p.beta != 0.0);
    // Blocks of C of at most `limit` tiles a side, each a launch of its own over its rows and
    // columns (operand offsets moved to the block; they stay within the operands, whose last
    // elements fit in 32 bits), and batches of at most `limit` products.
    let side = limit * tile.side();
    for r0 in (0..p.m).step_by(side) {
        for c0 in (0..p.n).step_by(side) {
            let (m, n) = (side.min(p.m - r0), side.min(p.n - c0));
            let mut block = words.clone();
            block[0] = m as u32;
            block[1] = n as u32;
            block[4] = (p.a.offset + r0 * p.a.rows) as u32;
            block[7] = (p.b.offset + c0 * p.b.cols) as u32;
            block[10] = (p.c.offset + r0 * p.c.rows + c0 * p.c.cols) as u32;
            let mut first = 0;
            while first < p.batch_count {
                let count = (p.batch_count - first).min(limit);
                block[3] = first as u32;
                kernels.dispatch(
                    gpu,
                    Dispatch {
                        module: p.module,
                        entry: "gemm",
                        constants: &[("TILE", tile.side() as u64)],
                        buffers: &[p.a.buffer, p.b.buffer, p.c.buffer],
                        params: &block,
                        groups: (
                            m.div_ceil(tile.side()) as u32,
                            n.div_ceil(tile.side()) as u32,
                            count as u32,
                        ),
                        loops: loops::gemm(tile.side(), p.k),
                    },
                )?;
                first += count;
            }
        }
    }
    Ok(Launch::Done)
}

/// The operands of `d` with the given batch strides; `None` when one is misaligned or the dtype is
/// staged.
fn gemm_product<'a>(
    gpu: &Gpu,
    mem: &'a Memory,
    d: &GemmDesc,
    batch: (usize, usize, usize),
    batch_count: usize,
) -> Result<Option<Product<'a>>> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, GEMM, GEMM_F16) else {
        return Ok(None);
    };
    let a = operand(mem, d.a, size, strides(d.trans_a, d.lda), batch.0)?;
    let b = operand(mem, d.b, size, strides(d.trans_b, d.ldb), batch.1)?;
    let c = operand(mem, d.c, size, (1, d.ldc), batch.2)?;
    let (Some(a), Some(b), Some(c)) = (a, b, c) else {
        return Ok(None);
    };
    Ok(Some(Product {
        module,
        m: d.m,
        n: d.n,
        k: d.k,
        batch_count,
        a,
        b,
        c,
        alpha: d.alpha,
        beta: d.beta,
    }))
}

/// GEMM with `tile`.
pub(crate) fn gemm_tiled(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &GemmDesc,
    tile: Tile,
) -> Result<Launch> {
    match gemm_product(gpu, mem, d, (0, 0, 0), 1)? {
        Some(p) => run(gpu, kernels, p, tile),
        None => Ok(Launch::Stage),
    }
}

/// Strided batched GEMM, one launch (or one per 65 535 matrices).
pub(crate) fn batched_gemm(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &BatchedGemmDesc,
) -> Result<Launch> {
    let (sa, sb) = pieces::operand_strides(d);
    match gemm_product(gpu, mem, &d.gemm, (sa, sb, d.stride_c), d.batch_count)? {
        Some(p) => run(gpu, kernels, p, Tile::Large),
        None => Ok(Launch::Stage),
    }
}

/// GEMV: `y = alpha·op(A)·x + beta·y` as a product with one column.
pub(crate) fn gemv(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &GemvDesc) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, GEMM, GEMM_F16) else {
        return Ok(Launch::Stage);
    };
    let (rows, cols) = match d.trans {
        Transpose::No => (d.m, d.n),
        Transpose::Yes => (d.n, d.m),
    };
    let a = operand(mem, d.a, size, strides(d.trans, d.lda), 0)?;
    let x = operand(mem, d.x, size, (d.incx, 0), 0)?;
    let y = operand(mem, d.y, size, (d.incy, 0), 0)?;
    let (Some(a), Some(b), Some(c)) = (a, x, y) else {
        return Ok(Launch::Stage);
    };
    run(
        gpu,
        kernels,
        Product {
            module,
            m: rows,
            n: 1,
            k: cols,
            batch_count: 1,
            a,
            b,
            c,
            alpha: d.alpha,
            beta: d.beta,
        },
        Tile::Large,
    )
}

impl OpImpl<GemmDesc> for WebGpuBackend {
    fn op(&self, desc: &GemmDesc) -> Result<()> {
        math_dtype("gemm", desc.dtype, desc)?;
        self.gemm_with(desc, Tile::Large)
    }
}

impl OpImpl<BatchedGemmDesc> for WebGpuBackend {
    fn op(&self, desc: &BatchedGemmDesc) -> Result<()> {
        let dtype = desc.gemm.dtype;
        math_dtype("batched_gemm", dtype, desc)?;
        let g = &desc.gemm;
        let loops = Loops {
            elements: [g.m, g.n, desc.batch_count]
                .iter()
                .fold(1usize, |a, &b| a.saturating_mul(b)),
            passes: &|_| loops::gemm(Tile::Large.side(), g.k),
        };
        let run = |d: &BatchedGemmDesc| self.run(d, batched_gemm);
        match self.plan(desc, dtype, pieces::batched_gemm, Some(loops))? {
            Plan::Whole => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // Not even one product fits a binding: each runs as a GEMM, cut as GEMMs are.
            Plan::TooLarge => {
                (0..desc.batch_count).try_for_each(|i| self.gemm(&pieces::batch_element(desc, i)?))
            }
            Plan::PastBudget => self.batched_gemm_by_inner(desc),
        }
    }
}

impl OpImpl<GemvDesc> for WebGpuBackend {
    fn op(&self, desc: &GemvDesc) -> Result<()> {
        math_dtype("gemv", desc.dtype, desc)?;
        let (inner, outputs) = desc.vector_lens();
        let loops = Loops {
            elements: inner.saturating_mul(outputs),
            passes: &|_| loops::gemm(Tile::Large.side(), inner),
        };
        let run = |d: &GemvDesc| self.run(d, gemv);
        match self.plan(desc, desc.dtype, pieces::gemv, Some(loops))? {
            Plan::Whole => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // Rows longer than a launch takes within the loop budget, or no block of rows fits a
            // binding (a row of A is too long, or A is untransposed and rows do not narrow it):
            // the same product as a GEMM, whose cuts include the inner dim.
            Plan::TooLarge | Plan::PastBudget => self.gemm(&pieces::gemv_as_gemm(desc)),
        }
    }
}
