//! bf16 GEMM on the AVX512_BF16 dot-product instruction (`vdpbf16ps`), with f32 accumulation.
//!
//! `vdpbf16ps` multiplies pairs of bf16 and adds both products into one f32 lane, so the operands are
//! packed in pairs along k: A in strips of [`MR`] rows, each k-pair of a strip two 512-bit vectors
//! (row r's `(A[r,k], A[r,k+1])` in lane r); B in strips of [`NR`] columns, each k-pair of a strip
//! `NR` 32-bit words that the microkernel broadcasts. The microkernel keeps a 32×12 f32 tile in 24
//! registers. Products accumulate in an f32 copy of C over the whole of k; C is written once at the
//! end as `alpha·acc + beta·C`, rounded to bf16, so the only roundings are the instruction's f32 sums
//! and the final store — the same numerics as the f32-widening path, at the instruction's speed.
//!
//! Loops follow Goto's order: k in blocks of [`KC_PAIRS`] pairs, rows in blocks of [`MC_STRIPS`]
//! strips (an A block that stays in L2), B strips in L1 across that block. Threads take disjoint
//! groups of B strips, so each writes its own columns of the accumulator. x86-64 only.

use super::team::{par_chunks_mut, par_for};

use super::blas::strides;
use crate::backends::reference::memory::HostMemory;
use crate::compute::GemmDesc;
use crate::error::{BackendError, Result};

/// Rows of a microkernel tile (two 16-lane vectors).
const MR: usize = 32;
/// Columns of a microkernel tile.
const NR: usize = 12;
/// k-pairs per cache block (512 values of k).
const KC_PAIRS: usize = 256;
/// A strips per cache block (128 rows: 128 × 512 bf16 = 128 KiB, in L2).
const MC_STRIPS: usize = 4;

/// True when this CPU executes `vdpbf16ps` (AVX512_BF16 with AVX-512F).
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// An operand of the product as element accessor: `X[i, l]` at `base + i·rs + l·cs` (in elements).
#[derive(Clone, Copy)]
struct Operand {
    base: *const u16,
    rs: usize,
    cs: usize,
}

// SAFETY: an address with strides, only read; the memory lock keeps the buffer alive and no task writes
// it while the product runs.
unsafe impl Send for Operand {}
// SAFETY: as above.
unsafe impl Sync for Operand {}

impl Operand {
    /// The bits of `X[i, l]`.
    ///
    /// # Safety
    /// `(i, l)` is inside the operand's checked region.
    #[inline(always)]
    unsafe fn at(&self, i: usize, l: usize) -> u16 {
        *self.base.add(i * self.rs + l * self.cs)
    }
}

/// The f32 accumulator of C, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct Accumulator {
    ptr: *mut f32,
    /// Rows (the column stride).
    m: usize,
}

// SAFETY: tasks write disjoint column ranges (one group of B strips each).
unsafe impl Send for Accumulator {}
// SAFETY: as above.
unsafe impl Sync for Accumulator {}

/// `C = alpha·op(A)·op(B) + beta·C` in bf16 with f32 accumulation. The caller checked the regions and
/// for aliasing, `m, n, k > 0`, element alignment and [`available`], and holds the memory lock.
/// `OutOfMemory` when the packed operands or the accumulator cannot be allocated.
pub(crate) fn gemm(
    mem: &mut HostMemory,
    d: &GemmDesc,
    regions: [usize; 3],
    threads: usize,
) -> Result<()> {
    let a = mem.host_address(d.a, regions[0])?;
    let b = mem.host_address(d.b, regions[1])?;
    let c = mem.host_address(d.c, regions[2])?.cast::<u16>();
    let (ars, acs) = strides(d.trans_a, d.lda)?;
    let (brs, bcs) = strides(d.trans_b, d.ldb)?;
    let a = Operand {
        base: a.cast(),
        rs: ars as usize,
        cs: acs as usize,
    };
    let b = Operand {
        base: b.cast(),
        rs: brs as usize,
        cs: bcs as usize,
    };
    let (m, n, k) = (d.m, d.n, d.k);
    let pairs = k.div_ceil(2);
    let (a_strips, b_strips) = (m.div_ceil(MR), n.div_ceil(NR));
    let mut packed_a = zeroed::<u16>(a_strips * pairs * 2 * MR)?;
    let mut packed_b = zeroed::<u32>(b_strips * pairs * NR)?;
    let mut acc = zeroed::<f32>(m * n)?;
    // SAFETY: each strip packs rows < m (columns < n) and k-values < k only; the rest stays zero.
    let a_strip = |(s, out): (usize, &mut [u16])| unsafe { pack_a(a, s * MR, m, k, out) };
    let b_strip = |(s, out): (usize, &mut [u32])| unsafe { pack_b(b, s * NR, n, k, out) };
    if threads > 1 {
        par_chunks_mut(&mut packed_a, pairs * 2 * MR, |s, out| a_strip((s, out)));
        par_chunks_mut(&mut packed_b, pairs * NR, |s, out| b_strip((s, out)));
    } else {
        packed_a
            .chunks_mut(pairs * 2 * MR)
            .enumerate()
            .for_each(a_strip);
        packed_b
            .chunks_mut(pairs * NR)
            .enumerate()
            .for_each(b_strip);
    }
    let accumulator = Accumulator {
        ptr: acc.as_mut_ptr(),
        m,
    };
    let groups = (threads * 4).min(b_strips).max(1);
    let per_group = b_strips.div_ceil(groups);
    let group = |g: usize| {
        let strips = g * per_group..((g + 1) * per_group).min(b_strips);
        // SAFETY: `available()` was checked by the caller; the packed buffers have the sizes the strips
        // index; this group writes only its own columns of the accumulator.
        unsafe {
            multiply_group(
                &packed_a,
                &packed_b,
                accumulator,
                strips,
                a_strips,
                pairs,
                n,
            )
        }
    };
    if threads > 1 {
        par_for(b_strips.div_ceil(per_group), group);
    } else {
        (0..b_strips.div_ceil(per_group)).for_each(group);
    }
    // SAFETY: C's region covers `i + j·ldc` for i < m, j < n (checked by `GemmDesc::accesses`), and no
    // other reference to it lives.
    unsafe { store(c, d.ldc, &acc, m, n, d.alpha as f32, d.beta as f32) };
    Ok(())
}

/// A zero-filled vector of `len` values, or `OutOfMemory`.
fn zeroed<T: Clone + Default>(len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| BackendError::OutOfMemory {
            requested: len.saturating_mul(std::mem::size_of::<T>()),
            available: 0,
        })?;
    v.resize(len, T::default());
    Ok(v)
}

/// Packs rows `row0 .. row0 + MR` of A: for each k-pair p, `out[p·2MR + 2r + h] = A[row0 + r, 2p + h]`,
/// zero past row m and past k.
///
/// # Safety
/// A's region holds every `A[i, l]` with `i < m`, `l < k`.
unsafe fn pack_a(a: Operand, row0: usize, m: usize, k: usize, out: &mut [u16]) {
    let rows = (m - row0).min(MR);
    for (p, chunk) in out.chunks_exact_mut(2 * MR).enumerate() {
        for h in 0..2 {
            let l = 2 * p + h;
            if l >= k {
                break;
            }
            for r in 0..rows {
                chunk[2 * r + h] = a.at(row0 + r, l);
            }
        }
    }
}

/// Packs columns `col0 .. col0 + NR` of B: for each k-pair p, `out[p·NR + c]` holds
/// `B[2p, col0 + c]` in its low half and `B[2p + 1, col0 + c]` in its high half, zero past n and k.
///
/// # Safety
/// B's region holds every `B[l, j]` with `l < k`, `j < n`.
unsafe fn pack_b(b: Operand, col0: usize, n: usize, k: usize, out: &mut [u32]) {
    let cols = (n - col0).min(NR);
    for c in 0..cols {
        for (p, chunk) in out.chunks_exact_mut(NR).enumerate() {
            let lo = b.at(2 * p, col0 + c) as u32;
            let hi = if 2 * p + 1 < k {
                b.at(2 * p + 1, col0 + c) as u32
            } else {
                0
            };
            chunk[c] = lo | (hi << 16);
        }
    }
}

/// Multiplies every A strip with the B strips `strips`, adding into their columns of the accumulator.
///
/// # Safety
/// AVX512_BF16 is available; the packed buffers hold `a_strips` and all B strips of `pairs` k-pairs;
/// no other task writes these columns.
#[allow(clippy::too_many_arguments)]
unsafe fn multiply_group(
    packed_a: &[u16],
    packed_b: &[u32],
    acc: Accumulator,
    strips: std::ops::Range<usize>,
    a_strips: usize,
    pairs: usize,
    n: usize,
) {
    let mut tile = [0f32; MR * NR];
    for kp in (0..pairs).step_by(KC_PAIRS) {
        let kc = KC_PAIRS.min(pairs - kp);
        for ib in (0..a_strips).step_by(MC_STRIPS) {
            for js in strips.clone() {
                let b_panel = packed_b.as_ptr().add((js * pairs + kp) * NR);
                for is in ib..(ib + MC_STRIPS).min(a_strips) {
                    let a_panel = packed_a.as_ptr().add((is * pairs + kp) * 2 * MR);
                    kernel::tile(kc, a_panel, b_panel, &mut tile);
                    add_tile(&tile, acc, is * MR, js * NR, n);
                }
            }
        }
    }
}

/// Adds the valid part of a microkernel tile (column-major, MR rows) at `(row0, col0)`.
///
/// # Safety
/// This task owns columns `col0 .. col0 + NR` of the accumulator.
#[inline(always)]
unsafe fn add_tile(tile: &[f32; MR * NR], acc: Accumulator, row0: usize, col0: usize, n: usize) {
    let rows = (acc.m - row0).min(MR);
    let cols = (n - col0).min(NR);
    for c in 0..cols {
        let dst = std::slice::from_raw_parts_mut(acc.ptr.add((col0 + c) * acc.m + row0), rows);
        for (d, s) in dst.iter_mut().zip(&tile[c * MR..c * MR + rows]) {
            *d += *s;
        }
    }
}

/// `C[i + j·ldc] = bf16(alpha·acc[i + j·m] + beta·C)`; C is not read when `beta == 0`.
///
/// # Safety
/// C's region holds `i + j·ldc` for `i < m`, `j < n`, and nothing else references it.
unsafe fn store(c: *mut u16, ldc: usize, acc: &[f32], m: usize, n: usize, alpha: f32, beta: f32) {
    for j in 0..n {
        let col = std::slice::from_raw_parts_mut(c.add(j * ldc), m);
        for (out, &v) in col.iter_mut().zip(&acc[j * m..(j + 1) * m]) {
            let old = if beta != 0.0 {
                beta * half::bf16::from_bits(*out).to_f32()
            } else {
                0.0
            };
            *out = half::bf16::from_f32(alpha * v + old).to_bits();
        }
    }
}

mod kernel {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// `tile = A_panel · B_panel` over `kc` k-pairs: a 32×12 f32 tile, column-major.
    ///
    /// # Safety
    /// AVX512_BF16 is available; `a` holds `kc · 2·MR` and `b` `kc · NR` readable values.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn tile(kc: usize, a: *const u16, b: *const u32, out: &mut [f32; MR * NR]) {
        let mut c = [[_mm512_setzero_ps(); 2]; NR];
        for p in 0..kc {
            let ap = a.add(p * 2 * MR);
            let a0: __m512bh = std::mem::transmute(_mm512_loadu_si512(ap.cast()));
            let a1: __m512bh = std::mem::transmute(_mm512_loadu_si512(ap.add(MR).cast()));
            let bp = b.add(p * NR);
            for (j, cj) in c.iter_mut().enumerate() {
                let bj: __m512bh = std::mem::transmute(_mm512_set1_epi32(*bp.add(j) as i32));
                cj[0] = _mm512_dpbf16_ps(cj[0], a0, bj);
                cj[1] = _mm512_dpbf16_ps(cj[1], a1, bj);
            }
        }
        for (j, cj) in c.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(j * MR), cj[0]);
            _mm512_storeu_ps(out.as_mut_ptr().add(j * MR + 16), cj[1]);
        }
    }
}
