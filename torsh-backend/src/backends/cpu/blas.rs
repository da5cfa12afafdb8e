//! GEMM and GEMV on the `gemm` crate's microkernels (runtime-dispatched AVX-512 / AVX2+FMA / NEON),
//! threaded on the backend's own team (module `team`). Each thread's block of an f32 or f64
//! product small enough that packing would cost more than it saves runs on the register tiles of
//! module `small_gemm` instead (x86-64 vector levels).
//!
//! The descriptors are column-major with leading dimensions; the `gemm` crate takes any row and column
//! strides, so every transpose combination and leading dimension maps onto it without a copy. f32, f64
//! and f16 run natively (f16 accumulates in f32 inside the crate's packed kernels); bf16, and f16
//! products the crate would run on its f16-accumulating matrix-vector paths (`m` or `n` of 1, `k ≤ 2`,
//! every GEMV), are widened to f32, multiplied with f32 accumulation, and rounded once into C. `beta == 0` means C is not read, as in BLAS.

use gemm::Parallelism;
use half::{bf16, f16};

use super::{gemm_work, parallelism, touched, SimdLevel, Work};
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::memory::HostMemory;
use crate::compute::op::OpImpl;
use crate::compute::BatchedGemmDesc;
use crate::compute::ComputeBackend;
use crate::compute::{DevicePtr, GemmDesc, GemvDesc, Transpose};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// Strides `(row, column)` of `op(X)` for a column-major X with leading dimension `ld`.
pub(crate) fn strides(t: Transpose, ld: usize) -> Result<(isize, isize)> {
    let ld = isize::try_from(ld)
        .map_err(|_| BackendError::overflow("gemm", "leading dimension exceeds isize"))?;
    Ok(match t {
        Transpose::No => (1, ld),
        Transpose::Yes => (ld, 1),
    })
}

/// True when every pointer is aligned to the element size (the raw trait allows any byte address;
/// typed kernels need element alignment, so misaligned operands take the reference path).
pub(crate) fn aligned(dtype: DType, ptrs: &[u64]) -> bool {
    ptrs.iter().all(|p| p % dtype.size_in_bytes() as u64 == 0)
}

/// One GEMM in the `gemm` crate's form: `dst = beta·dst + alpha·lhs·rhs`, all strides `(row,
/// column)` in elements, `dst` read only when `read_dst`; run at SIMD level `simd`.
#[derive(Clone, Copy)]
pub(crate) struct Call<T> {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) dst: *mut T,
    pub(crate) dst_strides: (isize, isize),
    pub(crate) lhs: *const T,
    pub(crate) lhs_strides: (isize, isize),
    pub(crate) rhs: *const T,
    pub(crate) rhs_strides: (isize, isize),
    pub(crate) alpha: T,
    pub(crate) beta: T,
    pub(crate) read_dst: bool,
    pub(crate) simd: SimdLevel,
}

/// An element type [`Call`] runs: on the register tiles of module `small_gemm` where they take
/// the product, else on the `gemm` crate.
pub(crate) trait Element: Copy + 'static {
    /// Runs `call` on the small-product tiles and returns true, or returns false without
    /// touching anything when they do not take it.
    ///
    /// # Safety
    /// As [`Call::run`].
    unsafe fn small(call: &Call<Self>) -> bool;
}

impl Element for f32 {
    unsafe fn small(call: &Call<f32>) -> bool {
        // SAFETY: the caller's contract.
        unsafe { super::small_gemm::run(call, call.simd) }
    }
}

impl Element for f64 {
    unsafe fn small(call: &Call<f64>) -> bool {
        // SAFETY: the caller's contract.
        unsafe { super::small_gemm::run(call, call.simd) }
    }
}

impl Element for f16 {
    unsafe fn small(_: &Call<f16>) -> bool {
        false
    }
}

// SAFETY: the pointers are only read (lhs, rhs) or written in disjoint blocks (dst, see
// `Call::run`) by the tasks that share a call.
unsafe impl<T> Sync for Call<T> {}

impl<T: Element> Call<T> {
    /// Runs the call in the blocks [`for_blocks`] makes of it for `parallelism` (on the calling
    /// thread for `Parallelism::None`), each block one single-threaded call of the crate.
    ///
    /// # Safety
    /// Every pointer with its strides and sizes must address memory valid for the access (reads for
    /// lhs/rhs, reads and writes for dst), dst must not overlap lhs or rhs, and `T` must be f32, f64
    /// or `half::f16`.
    unsafe fn run(self, parallelism: Parallelism) {
        let call = &self;
        for_blocks(call.m, call.n, parallelism, |by_rows, start, len| {
            let part = if by_rows {
                Call {
                    m: len,
                    dst: call
                        .dst
                        .wrapping_offset(start as isize * call.dst_strides.0),
                    lhs: call
                        .lhs
                        .wrapping_offset(start as isize * call.lhs_strides.0),
                    ..*call
                }
            } else {
                Call {
                    n: len,
                    dst: call
                        .dst
                        .wrapping_offset(start as isize * call.dst_strides.1),
                    rhs: call
                        .rhs
                        .wrapping_offset(start as isize * call.rhs_strides.1),
                    ..*call
                }
            };
            // SAFETY: the block is a sub-product of this call's, writing only its own rows
            // (columns) of dst.
            unsafe { part.run_here() }
        });
    }

    /// Runs the call on the calling thread.
    ///
    /// # Safety
    /// As [`Call::run`].
    unsafe fn run_here(self) {
        // SAFETY: the caller's contract.
        if unsafe { T::small(&self) } {
            return;
        }
        gemm::gemm(
            self.m,
            self.n,
            self.k,
            self.dst,
            self.dst_strides.1,
            self.dst_strides.0,
            self.read_dst,
            self.lhs,
            self.lhs_strides.1,
            self.lhs_strides.0,
            self.rhs,
            self.rhs_strides.1,
            self.rhs_strides.0,
            self.beta,
            self.alpha,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

/// Whether [`for_blocks`] shares an `m × n` product out over `threads` threads: false when one
/// block of its unit (64 rows or 12 columns) per thread would already cover it, so the whole
/// product runs on the calling thread whatever the thread count.
pub(crate) fn splits(m: usize, n: usize, threads: usize) -> bool {
    let (len, unit) = if m >= n { (m, 64) } else { (n, 12) };
    threads > 1 && len.div_ceil(threads).next_multiple_of(unit) < len
}

/// Runs `part(by_rows, start, len)` for each block of an `m × n` product, shared over the
/// backend's team (module `team`): for `Parallelism::Rayon(threads)`, one block per thread of dst
/// rows `start .. start + len` when `m ≥ n` (a multiple of 64 rows, the widest microkernel's), else
/// of columns (a multiple of 12); otherwise, or when the product is too narrow to split, the whole
/// product as `(true, 0, m)` on the calling thread.
pub(crate) fn for_blocks(
    m: usize,
    n: usize,
    parallelism: Parallelism,
    part: impl Fn(bool, usize, usize) + Sync,
) {
    let threads = match parallelism {
        Parallelism::Rayon(threads) => threads.max(1),
        Parallelism::None => 1,
    };
    if !splits(m, n, threads) {
        return part(true, 0, m);
    }
    let by_rows = m >= n;
    let (len, unit) = if by_rows { (m, 64) } else { (n, 12) };
    let block = len.div_ceil(threads).next_multiple_of(unit);
    super::team::par_for(len.div_ceil(block), |b| {
        let start = b * block;
        part(by_rows, start, block.min(len - start))
    });
}

/// `C = alpha·op(A)·op(B) + beta·C` at SIMD level `simd`. The caller checked the regions and for
/// aliasing, element alignment, `m, n, k > 0`, and holds the memory lock through `mem`.
pub(crate) fn gemm(
    mem: &mut HostMemory,
    d: &GemmDesc,
    regions: [usize; 3],
    parallelism: Parallelism,
    simd: SimdLevel,
) -> Result<()> {
    if d.dtype == DType::BF16 || (d.dtype == DType::F16 && f16_needs_widening(d.m, d.n, d.k)) {
        return widened_gemm(mem, d, regions, parallelism, simd);
    }
    let call = native(mem, d, regions, simd)?;
    // SAFETY: as `native` states.
    unsafe { call.run(parallelism) };
    Ok(())
}

/// A GEMM the `gemm` crate runs in the element type itself: f32, f64, and f16 where
/// [`f16_needs_widening`] is false.
enum Native {
    F32(Call<f32>),
    F64(Call<f64>),
    F16(Call<f16>),
}

impl Native {
    /// Runs the product as [`Call::run`].
    ///
    /// # Safety
    /// The memory it addresses must still be live and not reached by anything else that writes it
    /// (as under the memory lock that [`native`] was called with).
    unsafe fn run(&self, parallelism: Parallelism) {
        // SAFETY: as `native` built the call, and the caller states.
        unsafe {
            match *self {
                Native::F32(c) => c.run(parallelism),
                Native::F64(c) => c.run(parallelism),
                Native::F16(c) => c.run(parallelism),
            }
        }
    }
}

/// `d` as a call of the `gemm` crate, for a dtype [`Native`] takes (`Unsupported` for another). The
/// caller checked the regions and for aliasing, element alignment, `m, n, k > 0`, and holds the
/// memory lock through `mem` until the call has run.
fn native(
    mem: &mut HostMemory,
    d: &GemmDesc,
    regions: [usize; 3],
    simd: SimdLevel,
) -> Result<Native> {
    let a = mem.host_address(d.a, regions[0])?;
    let b = mem.host_address(d.b, regions[1])?;
    let c = mem.host_address(d.c, regions[2])?;
    let lhs_strides = strides(d.trans_a, d.lda)?;
    let rhs_strides = strides(d.trans_b, d.ldb)?;
    let dst_strides = strides(Transpose::No, d.ldc)?;
    let read_dst = d.beta != 0.0;
    macro_rules! call {
        ($t:ty, $conv:expr) => {{
            let conv = $conv;
            Call::<$t> {
                m: d.m,
                n: d.n,
                k: d.k,
                dst: c as *mut $t,
                dst_strides,
                lhs: a as *const $t,
                lhs_strides,
                rhs: b as *const $t,
                rhs_strides,
                alpha: conv(d.alpha),
                beta: conv(d.beta),
                read_dst,
                simd,
            }
        }};
    }
    // The regions cover every element the strides reach (checked by `GemmDesc::accesses` against
    // live allocations), the output does not overlap the inputs (aliasing check), and the caller
    // checked element alignment.
    match d.dtype {
        DType::F32 => Ok(Native::F32(call!(f32, |x: f64| x as f32))),
        DType::F64 => Ok(Native::F64(call!(f64, |x: f64| x))),
        DType::F16 if !f16_needs_widening(d.m, d.n, d.k) => {
            Ok(Native::F16(call!(f16, crate::dtype::f16_from_f64)))
        }
        other => Err(BackendError::Unsupported {
            op: "gemm",
            backend: crate::device::BackendType::Cpu,
            dtype: other,
        }),
    }
}

/// Runs the products of `desc` side by side on the current team, several whole products to a task
/// and each on one thread: for batches whose products are each too small to split (the threading
/// cost model, module `cost`). Every batch's GEMM must take [`Native`] (f32, f64, or f16 whose
/// product [`f16_needs_widening`] leaves native); the caller checked `desc`'s accesses and that the
/// products are not empty, and holds the memory lock through `mem`.
pub(crate) fn gemm_batches_across(
    mem: &mut HostMemory,
    desc: &BatchedGemmDesc,
    threads: usize,
    simd: SimdLevel,
) -> Result<()> {
    let mut calls = Vec::new();
    calls
        .try_reserve_exact(desc.batch_count)
        .map_err(|_| BackendError::OutOfMemory {
            requested: desc
                .batch_count
                .saturating_mul(std::mem::size_of::<Native>()),
            available: 0,
        })?;
    for gemm in desc.batches() {
        let gemm = gemm?;
        let regions = crate::backends::reference::gemm_regions(&gemm)?;
        calls.push(native(mem, &gemm, regions, simd)?);
    }
    let per_task = gemm_work(&desc.gemm).per_task();
    super::host::for_chunks(calls.len(), threads, per_task, |range| {
        for call in &calls[range] {
            // SAFETY: the batches' C matrices do not overlap one another (checked by
            // `BatchedGemmDesc::accesses`) nor any input (aliasing check), so each task writes
            // only its own products' outputs, under the memory lock the caller holds.
            unsafe { call.run(Parallelism::None) };
        }
    });
    Ok(())
}

/// Whether an f16 product of `m × k` by `k × n` must be widened to f32 first: the `gemm` crate
/// accumulates f16 in f32 only in its packed microkernels, while its matrix-vector paths (`m` or `n`
/// of 1) and its `k ≤ 2` path round every partial sum to f16 (a 2100-term dot product of ones gave
/// 2048). [`GemmDesc`] promises at least f32 accumulation.
fn f16_needs_widening(m: usize, n: usize, k: usize) -> bool {
    m <= 1 || n <= 1 || k <= 2
}

/// The `bytes` bytes of 16-bit floats of `dtype` (f16 or bf16) at `ptr`, widened to f32.
/// `OutOfMemory` when the host cannot hold the copy.
fn widen(mem: &HostMemory, dtype: DType, ptr: DevicePtr, bytes: usize) -> Result<Vec<f32>> {
    let raw = mem.bytes(ptr, bytes)?;
    let mut out = Vec::new();
    out.try_reserve_exact(bytes / 2)
        .map_err(|_| BackendError::OutOfMemory {
            requested: bytes.saturating_mul(2),
            available: 0,
        })?;
    let half = |p: &[u8]| match dtype {
        DType::BF16 => bf16::from_le_bytes([p[0], p[1]]).to_f32(),
        _ => f16::from_le_bytes([p[0], p[1]]).to_f32(),
    };
    out.extend(raw.chunks_exact(2).map(half));
    Ok(out)
}

/// Rounds `values[e]` once to `dtype` (f16 or bf16) into element `e` of the region at `ptr`, for each
/// `e` of `elements` (the other elements of the region, gaps between columns, are left alone).
fn store_narrowed(
    mem: &mut HostMemory,
    dtype: DType,
    ptr: DevicePtr,
    bytes: usize,
    values: &[f32],
    elements: impl Iterator<Item = usize>,
) -> Result<()> {
    let out = mem.bytes_mut(ptr, bytes)?;
    for e in elements {
        let v = match dtype {
            DType::BF16 => bf16::from_f32(values[e]).to_le_bytes(),
            _ => f16::from_f32(values[e]).to_le_bytes(),
        };
        out[2 * e..2 * e + 2].copy_from_slice(&v);
    }
    Ok(())
}

/// A 16-bit GEMM (bf16 always, f16 where [`f16_needs_widening`]): A and B widened to dense f32
/// copies, an f32 GEMM with f32 accumulation into an f32 C, then C rounded once.
fn widened_gemm(
    mem: &mut HostMemory,
    d: &GemmDesc,
    regions: [usize; 3],
    parallelism: Parallelism,
    simd: SimdLevel,
) -> Result<()> {
    let a = widen(mem, d.dtype, d.a, regions[0])?;
    let b = widen(mem, d.dtype, d.b, regions[1])?;
    let mut c = if d.beta != 0.0 {
        widen(mem, d.dtype, d.c, regions[2])?
    } else {
        vec![0f32; regions[2] / 2]
    };
    // SAFETY: the f32 copies have exactly the element extents of the original regions, so the same
    // strides stay in bounds; they are distinct vectors.
    unsafe {
        Call::<f32> {
            m: d.m,
            n: d.n,
            k: d.k,
            dst: c.as_mut_ptr(),
            dst_strides: strides(Transpose::No, d.ldc)?,
            lhs: a.as_ptr(),
            lhs_strides: strides(d.trans_a, d.lda)?,
            rhs: b.as_ptr(),
            rhs_strides: strides(d.trans_b, d.ldb)?,
            alpha: d.alpha as f32,
            beta: d.beta as f32,
            read_dst: d.beta != 0.0,
            simd,
        }
        .run(parallelism);
    }
    // Only the elements of C (the region may include gaps between columns when ldc > m).
    let elements = (0..d.n).flat_map(|j| (0..d.m).map(move |i| i + j * d.ldc));
    store_narrowed(mem, d.dtype, d.c, regions[2], &c, elements)
}

/// `y = alpha·op(A)·x + beta·y` as the `gemm` crate's product with one column: y is an `rows × 1`
/// destination with row stride `incy`, x a `cols × 1` right-hand side with row stride `incx`. For f32,
/// f64 and f16; the caller checked regions, aliasing, alignment and non-empty sizes.
pub(crate) fn gemv(
    mem: &mut HostMemory,
    d: &GemvDesc,
    regions: [usize; 3],
    parallelism: Parallelism,
) -> Result<()> {
    let (rows, cols) = match d.trans {
        Transpose::No => (d.m, d.n),
        Transpose::Yes => (d.n, d.m),
    };
    if d.dtype == DType::F16 {
        return widened_gemv(mem, d, regions, (rows, cols), parallelism);
    }
    let a = mem.host_address(d.a, regions[0])?;
    let x = mem.host_address(d.x, regions[1])?;
    let y = mem.host_address(d.y, regions[2])?;
    let inc = |v: usize| {
        isize::try_from(v).map_err(|_| BackendError::overflow("gemv", "increment exceeds isize"))
    };
    let lhs_strides = strides(d.trans, d.lda)?;
    let (incx, incy) = (inc(d.incx)?, inc(d.incy)?);
    let read_dst = d.beta != 0.0;
    macro_rules! call {
        ($t:ty, $conv:expr) => {{
            let conv = $conv;
            Call::<$t> {
                m: rows,
                n: 1,
                k: cols,
                dst: y as *mut $t,
                dst_strides: (incy, 1),
                lhs: a as *const $t,
                lhs_strides,
                rhs: x as *const $t,
                rhs_strides: (incx, 1),
                alpha: conv(d.alpha),
                beta: conv(d.beta),
                read_dst,
                // One column: the crate's matrix-vector path, not the small-product tiles.
                simd: SimdLevel::Scalar,
            }
        }};
    }
    // SAFETY: as in `gemm`: the regions of `GemvDesc::accesses` cover every element these strides
    // reach, y does not overlap A or x, and the caller checked element alignment.
    unsafe {
        match d.dtype {
            DType::F32 => call!(f32, |v: f64| v as f32).run(parallelism),
            DType::F64 => call!(f64, |v: f64| v).run(parallelism),
            other => {
                return Err(BackendError::Unsupported {
                    op: "gemv",
                    backend: crate::device::BackendType::Cpu,
                    dtype: other,
                })
            }
        }
    }
    Ok(())
}

/// An f16 GEMV as [`gemv`] does it, on f32 copies of A, x and y (the `gemm` crate's one-column paths
/// round f16 partial sums), with y rounded once.
fn widened_gemv(
    mem: &mut HostMemory,
    d: &GemvDesc,
    regions: [usize; 3],
    (rows, cols): (usize, usize),
    parallelism: Parallelism,
) -> Result<()> {
    let a = widen(mem, d.dtype, d.a, regions[0])?;
    let x = widen(mem, d.dtype, d.x, regions[1])?;
    let mut y = if d.beta != 0.0 {
        widen(mem, d.dtype, d.y, regions[2])?
    } else {
        vec![0f32; regions[2] / 2]
    };
    let inc = |v: usize| {
        isize::try_from(v).map_err(|_| BackendError::overflow("gemv", "increment exceeds isize"))
    };
    // SAFETY: the f32 copies have the element extents of the original regions, so the same strides
    // stay in bounds; they are distinct vectors.
    unsafe {
        Call::<f32> {
            m: rows,
            n: 1,
            k: cols,
            dst: y.as_mut_ptr(),
            dst_strides: (inc(d.incy)?, 1),
            lhs: a.as_ptr(),
            lhs_strides: strides(d.trans, d.lda)?,
            rhs: x.as_ptr(),
            rhs_strides: (inc(d.incx)?, 1),
            alpha: d.alpha as f32,
            beta: d.beta as f32,
            read_dst: d.beta != 0.0,
            // One column: the crate's matrix-vector path, as in `gemv`.
            simd: SimdLevel::Scalar,
        }
        .run(parallelism);
    }
    let incy = d.incy;
    store_narrowed(
        mem,
        d.dtype,
        d.y,
        regions[2],
        &y,
        (0..rows).map(|i| i * incy),
    )
}

impl OpImpl<GemmDesc> for CpuBackend {
    fn op(&self, desc: &GemmDesc) -> Result<()> {
        self.gemm_threaded(desc, None)
    }
}

impl OpImpl<BatchedGemmDesc> for CpuBackend {
    /// Checks every batch's regions under one lock, then runs the batches: each on the team when a
    /// single product of its size is worth sharing; several products to a task, side by side on
    /// the team, when only the whole batch is (f32, f64 and f16; see [`gemm_batches_across`]); else
    /// in turn on the calling thread. Nothing is written unless every batch can be.
    fn op(&self, desc: &BatchedGemmDesc) -> Result<()> {
        let g = &desc.gemm;
        let acc = match desc.accesses() {
            Ok(acc) if self.simd_gemm(g) => acc,
            _ => return self.scalar.batched_gemm(desc),
        };
        let parallel = gemm_work(g).shares();
        let native = match g.dtype {
            DType::F32 | DType::F64 => true,
            DType::F16 => !f16_needs_widening(g.m, g.n, g.k),
            _ => false,
        };
        let whole = gemm_work(g).times(desc.batch_count).shares();
        if !parallel && native && whole && self.threads > 1 && desc.batch_count > 1 {
            return self.scalar.run(acc, |mem| {
                self.on_team(true, |threads| {
                    gemm_batches_across(mem, desc, threads, self.simd)
                })
            });
        }
        self.scalar.run(acc, |mem| {
            for gemm in desc.batches() {
                let gemm = gemm?;
                let regions = crate::backends::reference::gemm_regions(&gemm)?;
                // Per-batch pointers keep the element alignment of the bases (offsets are whole
                // elements).
                self.on_team(parallel, |threads| {
                    self.gemm_kernel(mem, &gemm, regions, threads)
                })?;
            }
            Ok(())
        })
    }
}

impl OpImpl<GemvDesc> for CpuBackend {
    fn op(&self, desc: &GemvDesc) -> Result<()> {
        let simd = self.simd != SimdLevel::Scalar
            && matches!(desc.dtype, DType::F32 | DType::F64 | DType::F16)
            && desc.m > 0
            && desc.n > 0
            && aligned(desc.dtype, &[desc.a.0, desc.x.0, desc.y.0]);
        if !simd {
            return self.scalar.gemv(desc);
        }
        let Ok(acc) = desc.accesses() else {
            return self.scalar.gemv(desc);
        };
        let regions = [
            acc.regions[0].bytes,
            acc.regions[1].bytes,
            acc.regions[2].bytes,
        ];
        let flops = desc.m.saturating_mul(desc.n).saturating_mul(2);
        let parallel = touched(&acc).plus(Work::flops(flops)).shares();
        self.scalar.run(acc, |mem| {
            self.on_team(parallel, |threads| {
                gemv(mem, desc, regions, parallelism(threads))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::cpu::reduce::tests::{check, random};
    use crate::compute::ComputeBackend;

    /// `values` as the little-endian bytes of `dtype` (f32, f64 or f16).
    fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&v| match dtype {
                DType::F64 => v.to_le_bytes().to_vec(),
                DType::F16 => crate::dtype::f16_from_f64(v).to_le_bytes().to_vec(),
                _ => (v as f32).to_le_bytes().to_vec(),
            })
            .collect()
    }

    /// `bytes` of `dtype` (f32, f64 or f16) as f64.
    fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
        bytes
            .chunks_exact(dtype.size_in_bytes())
            .map(|b| match dtype {
                DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
                DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
                _ => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            })
            .collect()
    }

    /// Batches of products each too small to share but worth the team together run side by side
    /// (`gemm_batches_across`): every batch against an f64 sum of the stored operands, with
    /// transposes, padded leading dimensions and batch strides, `beta` 0 (C poisoned with NaN,
    /// never read) and not, in f32, f64 and f16.
    #[test]
    fn small_batches_side_by_side_match_an_f64_sum() {
        let mut b = CpuBackend::new(Some(2), true).unwrap();
        b.init().unwrap();
        if b.simd() == SimdLevel::Scalar {
            return; // No SIMD: the reference kernels run every batch.
        }
        let (m, n, k, count) = (24, 20, 29, 160);
        use Transpose::{No, Yes};
        for dtype in [DType::F32, DType::F64, DType::F16] {
            for (ta, tb, beta) in [
                (No, No, 0.0),
                (Yes, No, 0.5),
                (No, Yes, 0.0),
                (Yes, Yes, 1.0),
            ] {
                // Stored (rows, cols) of A and B, column-major, each leading dimension padded.
                let (ar, ac) = if ta == No { (m, k) } else { (k, m) };
                let (br, bc) = if tb == No { (k, n) } else { (n, k) };
                let (lda, ldb, ldc) = (ar + 3, br + 1, m + 2);
                let (sa, sb, sc) = (lda * ac + 5, ldb * bc, ldc * n + 7);
                let a = random(sa * count, 1);
                let bv = random(sb * count, 2);
                let c0: Vec<f64> = if beta == 0.0 {
                    vec![f64::NAN; sc * count]
                } else {
                    random(sc * count, 3)
                };
                // The values as stored, so that the f64 sum sees what the kernel reads.
                let round = |v: &[f64]| decode(dtype, &encode(dtype, v));
                let (a, bv, c0) = (round(&a), round(&bv), round(&c0));
                let upload = |v: &[f64]| {
                    let ptr = b.alloc(v.len() * dtype.size_in_bytes()).unwrap();
                    b.copy_htod(ptr, &encode(dtype, v)).unwrap();
                    ptr
                };
                let (pa, pb, pc) = (upload(&a), upload(&bv), upload(&c0));
                let desc = BatchedGemmDesc {
                    gemm: GemmDesc {
                        dtype,
                        trans_a: ta,
                        trans_b: tb,
                        m,
                        n,
                        k,
                        alpha: 0.75,
                        a: pa,
                        lda,
                        b: pb,
                        ldb,
                        beta,
                        c: pc,
                        ldc,
                    },
                    stride_a: sa,
                    stride_b: sb,
                    stride_c: sc,
                    batch_count: count,
                };
                let jobs = b.team.jobs();
                b.batched_gemm(&desc).unwrap();
                assert!(
                    b.team.jobs() > jobs,
                    "{dtype:?}: the batches went side by side"
                );
                let mut out = vec![0u8; c0.len() * dtype.size_in_bytes()];
                b.copy_dtoh(&mut out, pc).unwrap();
                let out = decode(dtype, &out);
                for batch in 0..count {
                    let (a, bv) = (&a[batch * sa..], &bv[batch * sb..]);
                    let (mut got, mut want) = (Vec::new(), Vec::new());
                    for j in 0..n {
                        for i in 0..m {
                            let mut sum = 0.0;
                            for p in 0..k {
                                let x = if ta == No {
                                    a[i + p * lda]
                                } else {
                                    a[p + i * lda]
                                };
                                let y = if tb == No {
                                    bv[p + j * ldb]
                                } else {
                                    bv[j + p * ldb]
                                };
                                sum += x * y;
                            }
                            let at = batch * sc + i + j * ldc;
                            let old = if beta == 0.0 { 0.0 } else { beta * c0[at] };
                            got.push(out[at]);
                            want.push(0.75 * sum + old);
                        }
                    }
                    let what = format!("{dtype:?} {ta:?}{tb:?} batch {batch}");
                    check(dtype, &got, &want, &what);
                }
                // The padding between columns and batches is left as it was.
                for (at, (&o, &c)) in out.iter().zip(&c0).enumerate() {
                    let (batch_at, i) = (at % sc, at % sc % ldc);
                    if i >= m || batch_at >= ldc * n {
                        assert!(o.to_bits() == c.to_bits() || (o.is_nan() && c.is_nan()));
                    }
                }
                for p in [pa, pb, pc] {
                    b.free(p).unwrap();
                }
            }
        }
    }

    #[test]
    fn blocks_cover_the_product_once() {
        for (m, n, threads) in [
            (1, 1, 2),
            (2048, 192, 2),
            (64, 192, 2),
            (100, 7, 3),
            (7, 1000, 4),
            (300, 300, 1),
        ] {
            let seen = std::sync::Mutex::new(Vec::new());
            super::super::team::on_threads(threads, |_| {
                for_blocks(m, n, Parallelism::Rayon(threads), |rows, start, len| {
                    seen.lock().unwrap().push((rows, start, len))
                })
            });
            let mut blocks = seen.into_inner().unwrap();
            blocks.sort_unstable();
            let by_rows = blocks[0].0;
            let mut at = 0;
            for &(rows, start, len) in &blocks {
                assert!(
                    rows == by_rows && start == at && len > 0,
                    "{m}×{n}: {blocks:?}"
                );
                at += len;
            }
            assert_eq!(at, if by_rows { m } else { n }, "{m}×{n}: {blocks:?}");
            assert!(blocks.len() <= threads, "{m}×{n}: {blocks:?}");
        }
    }
}
