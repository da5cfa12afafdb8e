//! Scaled dot-product attention on the CPU, flash style: the `seq_q × seq_kv` score matrix is never
//! built. Each work item is one (batch · head, block of [`BLOCK_Q`] queries); it walks the keys in
//! blocks of [`BLOCK_K`]:
//!
//! 1. `S = (scale·Q_blk) · K_blkᵀ` into a scratch tile;
//! 2. online softmax per query row: the running max `m` and sum `l` are updated with the tile's row
//!    maxima and the tile becomes `P = exp(S − m)`;
//! 3. `O_acc = O_acc · exp(m_old − m) + P · V_blk`;
//!
//! and finally writes `O = O_acc / l`. Everything a step touches is column-major with the query
//! rows contiguous, `ld` of them (the block's rows rounded up to a register tile): the Q block
//! (`ld × head_dim`), the score tile (`ld × BLOCK_K`) and the accumulator (`ld × head_dim`). Both
//! products are register tiles read in place ([`tile`]) with the query rows in the SIMD lanes, and
//! the softmax runs down the tile's columns with the rows in the lanes too. Causal masking (query
//! `i` sees keys `j ≤ i`, aligned top-left as in the reference, for any `seq_q`, `seq_kv`) stops
//! each item at key `min(seq_kv, last query + 1)`: key blocks past the diagonal are never computed
//! and only the diagonal block is masked.
//!
//! With a log-sum-exp output, each row's `m + ln l` is stored with it (in the compute type, which is
//! the statistics' dtype). The gradients are in [`backward`].
//!
//! f32, f16 and bf16 compute in f32 (the half types are widened a block at a time and rounded once
//! on store; `exp` is a vectorisable polynomial, see [`Exp`]); f64 computes in f64. Row sums are
//! kept per key block and then folded into the running sum, so no serial sum runs over more than
//! [`BLOCK_K`] terms.
//!
//! Threads: items run in parallel on the backend's team (each job with its own scratch); the
//! query block shrinks (down to [`MIN_BLOCK_Q`]) while there are fewer than two items per thread.

mod backward;
mod tile;

use backward::attention_backward;

use super::conv::{out_of_memory, parallel_items, zeroed, Raw, Wide};
use super::cost::Work;
use super::host::{with_float, with_simd, Ctx, Element, Real};
use super::simd::SimdLevel;
use super::vector::{transpose_block, Portable, Registers, Vector};
use super::vmath;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{attention as reference, memory::HostMemory};
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::{AttentionBackwardDesc, AttentionDesc};
use crate::error::Result;
use tile::{product, Out, Rhs, NR_16, NR_32, NR_4V};

/// The op name in errors.
const OP: &str = "attention";

/// Queries per work item.
const BLOCK_Q: usize = 64;

/// The smallest query block used to make work for more threads.
const MIN_BLOCK_Q: usize = 16;

/// Keys per step of the online softmax.
const BLOCK_K: usize = 64;

/// The exponentials the softmax and its gradient use in each compute type.
trait Exp: Real {
    /// eˣ for the softmax's arguments `x − max ≤ 0` (never positive: the max is taken over the
    /// values it is subtracted from, and NaN scores give NaN).
    fn exp_fast(self) -> Self;
    /// eˣ for any argument, as fast: the gradient's `s − lse`, which a log-sum-exp from
    /// elsewhere than the forward can make positive. Past the largest argument whose power of two
    /// is normal (88 in f32, 709 in f64) the result is +∞.
    fn exp_any(self) -> Self;
}

/// `vmath::exp_f32`'s reduction and polynomial for `x` in `[-87, hi]` (`hi ≤ 88`), with 2ⁿ built
/// from the bits of the rounded `x·log₂e` instead of a float-to-int conversion (which LLVM does
/// not vectorise when it must saturate). Below −87 the result is 0 (the reference's value there is
/// under 2⁻¹²⁵ of the row's largest term, which is 1), so masked keys (−∞) contribute exactly
/// nothing; above `hi` it is `above`. NaN propagates.
#[inline(always)]
fn exp_f32(x: f32, hi: f32, above: Option<f32>) -> f32 {
    use vmath::ROUND_MAGIC;
    let clamped = x.clamp(-87.0, hi);
    let t = clamped.mul_add(std::f32::consts::LOG2_E, ROUND_MAGIC);
    let e = vmath::exp_reduced(vmath::reduce_ln2(clamped, t - ROUND_MAGIC));
    // t's bits are 0x4B40_0000 + n for −126 ≤ n ≤ 127: 2ⁿ has exponent field n + 127.
    let scale = f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    let mut y = if x < -87.0 { 0.0 } else { e * scale };
    if let Some(above) = above {
        y = if x > hi { above } else { y };
    }
    if x.is_nan() {
        x
    } else {
        y
    }
}

impl Exp for f32 {
    /// [`vmath::exp_nonpositive_f32`]: results under 2⁻¹²⁶ flush towards 0 (0 below about −87.7,
    /// so masked keys contribute exactly nothing), within 2 ulp above.
    #[inline(always)]
    fn exp_fast(self) -> f32 {
        vmath::exp_nonpositive_f32(self)
    }

    #[inline(always)]
    fn exp_any(self) -> f32 {
        exp_f32(self, 88.0, Some(f32::INFINITY))
    }
}

/// eˣ for `x` in `[-708, hi]` (`hi ≤ 709`), vectorisable: `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`,
/// `eʳ` by its Taylor series to degree 13 (truncation below 10⁻¹⁷ relative), 2ⁿ from the bits of
/// the rounded `x·log₂e`. Below −708 the result is 0 (under 2⁻¹⁰²¹ of the row's largest term,
/// which is 1); above `hi` it is `above`. NaN propagates.
#[inline(always)]
fn exp_f64(x: f64, hi: f64, above: Option<f64>) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact for |n| < 2¹¹.
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    /// 1.5 · 2⁵²: after adding it, the low mantissa bits hold the rounded integer.
    const ROUND_MAGIC: f64 = 6_755_399_441_055_744.0;
    let clamped = x.clamp(-708.0, hi);
    let t = clamped.mul_add(LOG2E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, clamped));
    // Σ_{k ≥ 2} r^(k−2) / k!, by Horner's rule from k = 13.
    let mut p = 1.0 / 6_227_020_800.0;
    for c in [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
    ] {
        p = p.mul_add(r, c);
    }
    let e = (p * r).mul_add(r, r) + 1.0;
    // t's bits are 0x4338_0000_0000_0000 + n for −1022 ≤ n ≤ 1023: 2ⁿ has exponent field n + 1023.
    let scale = f64::from_bits(t.to_bits().wrapping_sub(0x4338_0000_0000_0000 - 1023) << 52);
    let mut y = if x < -708.0 { 0.0 } else { e * scale };
    if let Some(above) = above {
        y = if x > hi { above } else { y };
    }
    if x.is_nan() {
        x
    } else {
        y
    }
}

impl Exp for f64 {
    /// [`exp_f64`] over `[-708, 0]`.
    #[inline(always)]
    fn exp_fast(self) -> f64 {
        exp_f64(self, 0.0, None)
    }

    #[inline(always)]
    fn exp_any(self) -> f64 {
        exp_f64(self, 709.0, Some(f64::INFINITY))
    }
}

/// `softmax(scale · Q·Kᵀ [+ causal mask]) · V` per batch and head.
pub(crate) fn attention(mem: &mut HostMemory, d: &AttentionDesc, ctx: Ctx) -> Result<()> {
    if d.batch * d.heads == 0 || d.seq_q == 0 {
        return Ok(()); // O is empty; K and V may be any length.
    }
    if d.head_dim == 0 {
        return reference::attention(mem, d); // Only the log-sum-exp to write.
    }
    with_float!(d.dtype, T => typed::<T>(mem, d, ctx), _ => reference::attention(mem, d))
}

/// The operands and sizes of one attention call.
struct Flash<T: Wide> {
    q: Raw<T>,
    k: Raw<T>,
    v: Raw<T>,
    o: Raw<T>,
    /// The log-sum-exp per query row, when asked for.
    lse: Option<Raw<T::Acc>>,
    sq: usize,
    skv: usize,
    dim: usize,
    scale: T::Acc,
    causal: bool,
    /// Queries per item.
    bq: usize,
    /// `bq` rounded up to a whole register tile of rows: the row count of the scratch tiles.
    ld: usize,
}

/// Per-task buffers, all in the compute type; rows past the block's are zero in `qt`, so that
/// the lanes computing them hold zeros.
struct Scratch<A> {
    /// `scale · Q_blk`: `ld × dim`, column-major.
    qt: Vec<A>,
    /// Scores, then probabilities: `ld × BLOCK_K`, column-major.
    s: Vec<A>,
    /// Output accumulator: `ld × dim`, column-major.
    acc: Vec<A>,
    /// Running max per query row.
    m: Vec<A>,
    /// Running sum per query row.
    l: Vec<A>,
    /// Rescale factors of the accumulator rows.
    corr: Vec<A>,
    /// The reciprocal running sums, for the final store.
    part: Vec<A>,
    /// One widened row of Q or O (half types).
    row: Vec<A>,
    /// Widened K and V blocks (half types): `BLOCK_K × dim` each.
    kv: Vec<A>,
}

impl<A: Real> Scratch<A> {
    /// Buffers for `f`.
    fn new<T: Wide<Acc = A>>(f: &Flash<T>) -> Result<Scratch<A>> {
        let (ld, dim) = (f.ld, f.dim);
        let half = if T::NATIVE { 0 } else { 1 };
        Ok(Scratch {
            qt: zeroed(dim * ld)?,
            s: zeroed(ld * BLOCK_K)?,
            acc: zeroed(ld * dim)?,
            m: zeroed(ld)?,
            l: zeroed(ld)?,
            corr: zeroed(ld)?,
            part: zeroed(ld)?,
            row: zeroed(half * dim)?,
            kv: zeroed(half * 2 * BLOCK_K * dim)?,
        })
    }

    /// Elements of the buffers for `f` (for the out-of-memory error).
    fn elements<T: Wide>(f: &Flash<T>) -> usize {
        (2 * f.dim + BLOCK_K + 4) * f.ld + 2 * (BLOCK_K + 1) * f.dim
    }
}

/// [`attention`] for element type `T`.
fn typed<T: Wide>(mem: &mut HostMemory, d: &AttentionDesc, ctx: Ctx) -> Result<()>
where
    T::Acc: Exp + Element,
{
    let bh = d.batch * d.heads;
    let (sq, skv, dim) = (d.seq_q, d.seq_kv, d.head_dim);
    let mut bq = BLOCK_Q.min(sq);
    while ctx.threads > 1 && bh * sq.div_ceil(bq) < 2 * ctx.threads && bq > MIN_BLOCK_Q {
        bq /= 2;
    }
    // Blocks of a few queries (decoding: one query against many keys) take narrower tiles rather
    // than computing rows no query fills.
    let mut mr = tile_rows::<T::Acc>(ctx.simd);
    while mr > 4 && mr / 2 >= bq {
        mr /= 2;
    }
    let f = Flash::<T> {
        q: Raw::of(mem, OP, d.q, bh * sq * dim)?,
        k: Raw::of(mem, OP, d.k, bh * skv * dim)?,
        v: Raw::of(mem, OP, d.v, bh * skv * dim)?,
        o: Raw::of(mem, OP, d.o, bh * sq * dim)?,
        lse: d
            .lse
            .map(|ptr| Raw::of(mem, OP, ptr, bh * sq))
            .transpose()?,
        sq,
        skv,
        dim,
        scale: T::Acc::from_f64(d.scale),
        causal: d.causal,
        bq,
        ld: bq.next_multiple_of(mr),
    };
    let blocks = sq.div_ceil(bq);
    let items = bh * blocks;
    let run = |item: usize, s: &mut Scratch<T::Acc>| {
        let (head, block) = (item / blocks, item % blocks);
        match ctx.simd {
            // SAFETY (both x86 arms): the tiles run on the registers of `ctx.simd`, inside
            // `with_simd` at that level, which the CPU was detected to have.
            SimdLevel::Avx512 => with_simd(
                SimdLevel::Avx512,
                #[inline(always)]
                || unsafe {
                    f.rows::<<T::Acc as Registers>::X512, NR_32>(mr, head, block, s);
                },
            ),
            SimdLevel::Avx2Fma => with_simd(
                SimdLevel::Avx2Fma,
                #[inline(always)]
                || unsafe {
                    f.rows::<<T::Acc as Registers>::X256, NR_16>(mr, head, block, s);
                },
            ),
            // SAFETY: portable arrays need no target feature.
            level => with_simd(
                level,
                #[inline(always)]
                || unsafe { f.rows::<Portable<T::Acc, 4>, NR_16>(mr, head, block, s) },
            ),
        }
    };
    if ctx.threads > 1 && items > 1 {
        parallel_items(items, ctx.threads).try_for_each_init(
            || Scratch::new(&f),
            |s, item| {
                let s = s
                    .as_mut()
                    .map_err(|_| out_of_memory::<T::Acc>(Scratch::<T::Acc>::elements(&f)))?;
                run(item, s);
                Ok(())
            },
        )
    } else {
        let mut s = Scratch::new(&f)?;
        for item in 0..items {
            run(item, &mut s);
        }
        Ok(())
    }
}

/// Rows of a register tile of the products ([`tile`]) at `simd`: four vector registers of `A` on
/// AVX-512 (64 f32, 32 f64), two on AVX2 (16 f32; two SSE or NEON registers otherwise). A
/// smaller query block halves it (see `typed`).
fn tile_rows<A>(simd: SimdLevel) -> usize {
    let bytes = match simd {
        SimdLevel::Avx512 => 256,
        SimdLevel::Avx2Fma => 64,
        _ => 32,
    };
    bytes / size_of::<A>()
}

impl<T: Wide> Flash<T>
where
    T::Acc: Exp + Element,
{
    /// [`Self::item`] with tiles of `mr` rows: four, two or one vectors `V` where `mr` is, else a
    /// portable array of `mr` lanes (4 to 32).
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn rows<V: Vector<T::Acc>, const NR: usize>(
        &self,
        mr: usize,
        head: usize,
        block: usize,
        s: &mut Scratch<T::Acc>,
    ) {
        match mr {
            _ if mr == 4 * V::LANES => self.item::<V, 4, NR_4V>(head, block, s),
            _ if mr == 2 * V::LANES => self.item::<V, 2, NR>(head, block, s),
            _ if mr == V::LANES => self.item::<V, 1, NR>(head, block, s),
            32 => self.item::<Portable<T::Acc, 32>, 1, NR>(head, block, s),
            16 => self.item::<Portable<T::Acc, 16>, 1, NR>(head, block, s),
            8 => self.item::<Portable<T::Acc, 8>, 1, NR>(head, block, s),
            _ => self.item::<Portable<T::Acc, 4>, 1, NR>(head, block, s),
        }
    }

    /// Query block `block` of head `head` (batch · heads + head), with register tiles of `NV`
    /// vectors `V` of rows (`ld` is a multiple of them) × up to `NR` columns.
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn item<V: Vector<T::Acc>, const NV: usize, const NR: usize>(
        &self,
        head: usize,
        block: usize,
        s: &mut Scratch<T::Acc>,
    ) {
        let (bq, ld, dim) = (self.bq, self.ld, self.dim);
        let i0 = block * bq;
        let rows = bq.min(self.sq - i0);
        self.load_q::<V>(head, i0, rows, s);
        s.m[..rows].fill(T::Acc::NEG_INFINITY);
        s.l[..rows].fill(T::Acc::ZERO);
        s.acc.fill(T::Acc::ZERO);
        // Keys this block sees: all, or (causal) those up to its last query.
        let kend = if self.causal {
            self.skv.min(i0 + rows)
        } else {
            self.skv
        };
        let mut j0 = 0;
        while j0 < kend {
            let cols = BLOCK_K.min(kend - j0);
            let (kb, vb) = self.kv_block(head, j0, cols, &mut s.kv);
            // S[r, c] = Σ_d qt[d][r] · K[c, d].
            let keys = Rhs {
                data: kb,
                t_stride: 1,
                j_stride: dim,
            };
            product::<_, V, NV, NR>(&s.qt, keys, dim, cols, &mut s.s, ld, Out::Store);
            if self.causal && j0 + cols > i0 + 1 {
                mask(&mut s.s, ld, rows, cols, j0 as isize - i0 as isize);
            }
            softmax_step(&mut s.s, &mut s.m, &mut s.l, &mut s.corr, rows, cols, ld);
            // acc[d][r] = acc[d][r] · corr[r] + Σ_c P[c][r] · V[c, d].
            let values = Rhs {
                data: vb,
                t_stride: dim,
                j_stride: 1,
            };
            let rescale = Out::Rescale(&s.corr);
            product::<_, V, NV, NR>(&s.s, values, cols, dim, &mut s.acc, ld, rescale);
            j0 += cols;
        }
        self.store::<V>(head, i0, rows, s);
    }

    /// Writes `scale · Q[head, i0 .. i0 + rows]` into `s.qt` (column-major, `ld` rows), zero in
    /// the rows past `rows`: f32 and f64 by register transposes of whole tiles of `V`, the half
    /// types a widened row at a time.
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn load_q<V: Vector<T::Acc>>(
        &self,
        head: usize,
        i0: usize,
        rows: usize,
        s: &mut Scratch<T::Acc>,
    ) {
        let (ld, dim) = (self.ld, self.dim);
        // SAFETY: rows i0 .. i0 + rows of this head lie inside Q, which nothing writes.
        let src = unsafe { self.q.get((head * self.sq + i0) * dim, rows * dim) };
        match T::as_acc(src) {
            // SAFETY: as this function's.
            Some(q) => unsafe { transpose_block::<_, V>(q, dim, &mut s.qt, ld, rows, dim) },
            None => {
                for (i, src) in src.chunks_exact(dim).enumerate() {
                    T::widen_slice(src, &mut s.row);
                    for (col, &x) in s.qt.chunks_exact_mut(ld).zip(&s.row) {
                        col[i] = x;
                    }
                }
            }
        }
        for col in s.qt.chunks_exact_mut(ld) {
            let (q, pad) = col.split_at_mut(rows);
            for x in q {
                *x = *x * self.scale;
            }
            pad.fill(T::Acc::ZERO);
        }
    }

    /// Keys `j0 .. j0 + cols` of K and V for `head` (`cols × dim` each, row-major): the inputs
    /// themselves for f32 and f64, else widened copies in `kv`.
    #[inline(always)]
    fn kv_block<'a>(
        &'a self,
        head: usize,
        j0: usize,
        cols: usize,
        kv: &'a mut [T::Acc],
    ) -> (&'a [T::Acc], &'a [T::Acc]) {
        let start = (head * self.skv + j0) * self.dim;
        let len = cols * self.dim;
        // SAFETY: the block lies inside K and V, which nothing writes.
        let (k, v) = unsafe { (self.k.get(start, len), self.v.get(start, len)) };
        if let (Some(k), Some(v)) = (T::as_acc(k), T::as_acc(v)) {
            return (k, v);
        }
        let (kw, vw) = kv.split_at_mut(kv.len() / 2);
        T::widen_slice(k, &mut kw[..len]);
        T::widen_slice(v, &mut vw[..len]);
        (&kw[..len], &vw[..len])
    }

    /// `O[head, i0 .. i0 + rows] = acc / l`, rounded: the accumulator's rows are scaled in place,
    /// then f32 and f64 are written by register transposes of whole tiles of `V`, the half types
    /// a narrowed row at a time.
    ///
    /// # Safety
    /// As [`Vector`]'s methods for `V`.
    #[inline(always)]
    unsafe fn store<V: Vector<T::Acc>>(
        &self,
        head: usize,
        i0: usize,
        rows: usize,
        s: &mut Scratch<T::Acc>,
    ) {
        let (ld, dim) = (self.ld, self.dim);
        for (inv, &l) in s.part[..rows].iter_mut().zip(&s.l[..rows]) {
            *inv = T::Acc::ONE / l;
        }
        if let Some(lse) = self.lse {
            // SAFETY: rows i0 .. i0 + rows of this head are written by this item only.
            let out = unsafe { lse.get_mut(head * self.sq + i0, rows) };
            for ((o, &m), &l) in out.iter_mut().zip(&s.m[..rows]).zip(&s.l[..rows]) {
                *o = T::Acc::from_f64(m.to_f64() + l.to_f64().ln());
            }
        }
        for col in s.acc.chunks_exact_mut(ld) {
            for (x, &inv) in col[..rows].iter_mut().zip(&s.part[..rows]) {
                *x = *x * inv;
            }
        }
        // SAFETY: rows i0 .. i0 + rows of this head are written by this item only.
        let dst = unsafe { self.o.get_mut((head * self.sq + i0) * dim, rows * dim) };
        match T::as_acc_mut(dst) {
            // SAFETY: as this function's.
            Some(out) => unsafe { transpose_block::<_, V>(&s.acc, ld, out, dim, dim, rows) },
            None => {
                for (i, dst) in dst.chunks_exact_mut(dim).enumerate() {
                    for (o, col) in s.row.iter_mut().zip(s.acc.chunks_exact(ld)) {
                        *o = col[i];
                    }
                    T::narrow_slice(&s.row, dst);
                }
            }
        }
    }
}

/// Sets the scores of keys a query may not see to −∞: column `c` of the tile is key `j0 + c`, row
/// `r` query `i0 + r`, and `diag = j0 − i0`; entries with `c + diag > r` are masked.
#[inline(always)]
fn mask<A: Real>(s: &mut [A], ld: usize, rows: usize, cols: usize, diag: isize) {
    for c in 0..cols {
        let hidden = (c as isize + diag).clamp(0, rows as isize) as usize;
        s[c * ld..][..hidden].fill(A::NEG_INFINITY);
    }
}

/// One online-softmax step over the `rows × cols` score tile `tile` (column-major, stride `ld`):
/// updates the running max `m` and sum `l`, turns the scores into `exp(score − max)`, and sets
/// `corr` to the accumulator rows' rescale factors `exp(old max − new max)`.
///
/// The rows go in strips of 128 bytes of the compute type (32 f32 or 16 f64 rows), then of 32
/// bytes, then one by one: a strip's maxima and sums stay in registers while its loops walk the
/// tile's columns, so no per-element load and store of the running values (nor a masked store for
/// the max) is paid.
#[inline(always)]
fn softmax_step<A: Exp>(
    tile: &mut [A],
    m: &mut [A],
    l: &mut [A],
    corr: &mut [A],
    rows: usize,
    cols: usize,
    ld: usize,
) {
    let tile = &mut tile[..cols * ld];
    let mut r0 = 0;
    if size_of::<A>() == 4 {
        r0 = strips::<A, 32>(tile, m, l, corr, r0, rows, ld);
        r0 = strips::<A, 8>(tile, m, l, corr, r0, rows, ld);
    } else {
        r0 = strips::<A, 16>(tile, m, l, corr, r0, rows, ld);
        r0 = strips::<A, 4>(tile, m, l, corr, r0, rows, ld);
    }
    strips::<A, 1>(tile, m, l, corr, r0, rows, ld);
}

/// [`softmax_step`] for rows `r0 ..` of `tile` (whole columns of `ld` rows) in strips of `W` rows,
/// as many as fit before `rows`; returns the first row not done.
#[inline(always)]
fn strips<A: Exp, const W: usize>(
    tile: &mut [A],
    m: &mut [A],
    l: &mut [A],
    corr: &mut [A],
    mut r0: usize,
    rows: usize,
    ld: usize,
) -> usize {
    while r0 + W <= rows {
        let old: [A; W] = array_at(m, r0);
        // Row maxima of the strip (NaN scores are skipped, as by the reference's `f64::max`).
        let mut max = old;
        for col in tile.chunks_exact(ld) {
            let x: [A; W] = array_at(col, r0);
            for (m, x) in max.iter_mut().zip(x) {
                *m = if x > *m { x } else { *m };
            }
        }
        // Probabilities and their sums.
        let mut sum = [A::ZERO; W];
        for col in tile.chunks_exact_mut(ld) {
            let x = &mut col[r0..r0 + W];
            for ((x, p), &m) in x.iter_mut().zip(sum.iter_mut()).zip(&max) {
                let e = (*x - m).exp_fast();
                *x = e;
                *p += e;
            }
        }
        for i in 0..W {
            let c = (old[i] - max[i]).exp_fast();
            corr[r0 + i] = c;
            l[r0 + i] = l[r0 + i].mul_add(c, sum[i]);
            m[r0 + i] = max[i];
        }
        r0 += W;
    }
    r0
}

/// The `W` values of `xs` from `at` on.
#[inline(always)]
fn array_at<A: Copy, const W: usize>(xs: &[A], at: usize) -> [A; W] {
    let xs = &xs[at..at + W];
    std::array::from_fn(|i| xs[i])
}

/// The work of `products` products of `seq_q × seq_kv × head_dim` multiply-adds per head, half of
/// them under a causal mask, for the threading cost model (module `cost`): the forward computes two
/// (scores and output), the backward five.
fn work(shape: [usize; 5], causal: bool, products: usize) -> Work {
    let flops = shape.iter().fold(2 * products, |a, &b| a.saturating_mul(b));
    Work::flops(if causal { flops / 2 } else { flops })
}

impl OpImpl<AttentionDesc> for CpuBackend {
    fn op(&self, desc: &AttentionDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.attention(desc);
        };
        let d = desc;
        let work = work(
            [d.batch, d.heads, d.seq_q, d.seq_kv, d.head_dim],
            d.causal,
            2,
        );
        self.kernel_computing(acc, work, |mem, ctx| attention(mem, desc, ctx))
    }
}

impl OpImpl<AttentionBackwardDesc> for CpuBackend {
    fn op(&self, desc: &AttentionBackwardDesc) -> Result<()> {
        let Some(acc) = self.takes(desc.dtype, desc.accesses()) else {
            return self.scalar.attention_backward(desc);
        };
        let d = desc;
        let work = work(
            [d.batch, d.heads, d.seq_q, d.seq_kv, d.head_dim],
            d.causal,
            5,
        );
        self.kernel_computing(acc, work, |mem, ctx| attention_backward(mem, desc, ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::DevicePtr;
    use crate::dtype::DType;
    use crate::rng::HostRng;

    const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

    /// An attention call to test: `[batch, heads, seq_q, seq_kv, head_dim]` and the mask.
    #[derive(Clone, Copy, Debug)]
    struct Case {
        sizes: [usize; 5],
        causal: bool,
        scale: f64,
    }

    /// Norm-wise relative error bound per dtype.
    fn bound(dtype: DType) -> f64 {
        match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            _ => 1e-2,
        }
    }

    /// A buffer of `n` standard normal values of `dtype`.
    pub(super) fn random(
        mem: &mut HostMemory,
        rng: &mut HostRng,
        dtype: DType,
        n: usize,
    ) -> DevicePtr {
        let ptr = mem.alloc((n * dtype.size_in_bytes()).max(1)).unwrap();
        let values: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
        mem.store(dtype, ptr, &values).unwrap();
        ptr
    }

    /// Runs `f` with a context of `threads` threads, inside a team of that size.
    pub(super) fn on_threads<R>(threads: usize, f: impl FnOnce(Ctx) -> R) -> R {
        crate::backends::cpu::team::on_threads(threads, f)
    }

    /// Compares the kernel with the reference for `case` in `dtype` on `threads` threads.
    fn check(case: Case, dtype: DType, threads: usize) {
        check_at(case, dtype, threads, None);
    }

    /// [`check`] with the kernel's loops at SIMD level `simd` (the detected one for `None`).
    fn check_at(case: Case, dtype: DType, threads: usize, simd: Option<SimdLevel>) {
        let [batch, heads, seq_q, seq_kv, head_dim] = case.sizes;
        let mut mem = HostMemory::default();
        let mut rng = HostRng::new(case.sizes.iter().sum::<usize>() as u64);
        let (nq, nkv) = (
            batch * heads * seq_q * head_dim,
            batch * heads * seq_kv * head_dim,
        );
        let q = random(&mut mem, &mut rng, dtype, nq);
        let k = random(&mut mem, &mut rng, dtype, nkv);
        let v = random(&mut mem, &mut rng, dtype, nkv);
        let [o, expected] = [0, 1].map(|_| mem.alloc((nq * dtype.size_in_bytes()).max(1)).unwrap());
        let rows = batch * heads * seq_q;
        let [lse, expected_lse] = [0, 1].map(|_| mem.alloc((rows * 8).max(1)).unwrap());
        let desc = AttentionDesc {
            dtype,
            q,
            k,
            v,
            o,
            batch,
            heads,
            seq_q,
            seq_kv,
            head_dim,
            scale: case.scale,
            causal: case.causal,
            lse: Some(lse),
        };
        desc.accesses().unwrap();
        on_threads(threads, |ctx| {
            let simd = simd.unwrap_or(ctx.simd);
            attention(&mut mem, &desc, Ctx { simd, ..ctx })
        })
        .unwrap();
        let oracle = AttentionDesc {
            o: expected,
            lse: Some(expected_lse),
            ..desc
        };
        reference::attention(&mut mem, &oracle).unwrap();
        let stats = crate::compute::stats_dtype(dtype);
        let got = mem.load_dense(stats, lse, rows).unwrap();
        let want = mem.load_dense(stats, expected_lse, rows).unwrap();
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            let tolerance = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
            assert!(
                (a - b).abs() <= tolerance * (1.0 + b.abs()),
                "{case:?} {dtype:?} lse row {i}: {a} vs {b}"
            );
        }
        let got = mem.load_dense(dtype, o, nq).unwrap();
        let want = mem.load_dense(dtype, expected, nq).unwrap();
        let (mut err, mut norm) = (0.0f64, 0.0f64);
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.is_nan(), b.is_nan(), "{case:?} {dtype:?} element {i}");
            err += (a - b) * (a - b);
            norm += b * b;
        }
        let rel = (err / norm.max(f64::MIN_POSITIVE)).sqrt();
        assert!(
            rel <= bound(dtype),
            "{case:?} {dtype:?} on {threads} threads: relative error {rel:e}"
        );
    }

    /// Every dtype on 1 and 2 threads, causal and not.
    fn check_all(sizes: [usize; 5], scale: f64) {
        for causal in [false, true] {
            for dtype in DTYPES {
                for threads in [1, 2] {
                    check(
                        Case {
                            sizes,
                            causal,
                            scale,
                        },
                        dtype,
                        threads,
                    );
                }
            }
        }
    }

    /// The problems both kernels' tests compare with the reference, `([batch, heads, seq_q, seq_kv,
    /// head_dim], scale)`: single queries and keys, odd lengths and head dims across the 64-row
    /// blocks, and fewer queries than keys (causal: the queries see only the first keys) and more.
    pub(super) const PROBLEMS: [([usize; 5], f64); 9] = [
        ([1, 1, 1, 1, 1], 0.5),
        ([1, 2, 1, 3, 7], 0.3),
        ([2, 3, 17, 17, 7], 0.378),
        ([1, 2, 67, 67, 1], 1.0),
        ([2, 1, 70, 133, 64], 0.125),
        ([1, 2, 65, 130, 7], 0.4),
        ([2, 1, 130, 65, 5], 0.4),
        ([1, 1, 3, 200, 16], 0.25),
        ([1, 1, 0, 9, 4], 0.5),
    ];

    #[test]
    fn odd_and_unequal_lengths_match_the_reference() {
        for (sizes, scale) in PROBLEMS {
            check_all(sizes, scale);
        }
    }

    #[test]
    fn every_register_tile_width_matches_the_reference() {
        // The tiles' rows per SIMD level (two registers: 8 f32 at NEON's width, which the plain
        // build takes here, 16 with AVX2; four with AVX-512: 64; half as many f64) and their
        // narrowing for short query blocks. Only the levels this CPU has are run.
        for simd in SimdLevel::runnable() {
            for (sizes, scale) in PROBLEMS {
                for dtype in [DType::F32, DType::F64] {
                    let case = Case {
                        sizes,
                        causal: true,
                        scale,
                    };
                    check_at(case, dtype, 1, Some(simd));
                }
            }
        }
    }

    #[test]
    fn large_scores_rescale_the_running_sums() {
        // Large logits: each key block moves the running max and rescales the accumulator.
        check_all([1, 2, 80, 150, 8], 3.0);
    }

    #[test]
    fn many_heads_and_blocks_on_two_threads() {
        for dtype in DTYPES {
            for causal in [false, true] {
                let case = Case {
                    sizes: [2, 4, 150, 150, 64],
                    causal,
                    scale: 0.125,
                };
                check(case, dtype, 2);
            }
        }
    }

    #[test]
    fn nan_rows_stay_nan() {
        let mut mem = HostMemory::default();
        let mut rng = HostRng::new(3);
        let (s, d) = (70, 4);
        let q = random(&mut mem, &mut rng, DType::F32, s * d);
        let k = random(&mut mem, &mut rng, DType::F32, s * d);
        let v = random(&mut mem, &mut rng, DType::F32, s * d);
        // Query 5 is NaN, key 66 infinite.
        mem.store(DType::F32, DevicePtr(q.0 + 4 * 5 * d as u64), &[f64::NAN])
            .unwrap();
        mem.store(
            DType::F32,
            DevicePtr(k.0 + 4 * 66 * d as u64),
            &[f64::INFINITY],
        )
        .unwrap();
        for causal in [false, true] {
            let [o, expected] = [0, 1].map(|_| mem.alloc(s * d * 4).unwrap());
            let desc = AttentionDesc {
                dtype: DType::F32,
                q,
                k,
                v,
                o,
                batch: 1,
                heads: 1,
                seq_q: s,
                seq_kv: s,
                head_dim: d,
                scale: 0.5,
                causal,
                lse: None,
            };
            on_threads(1, |ctx| attention(&mut mem, &desc, ctx)).unwrap();
            reference::attention(
                &mut mem,
                &AttentionDesc {
                    o: expected,
                    ..desc
                },
            )
            .unwrap();
            let got = mem.load_dense(DType::F32, o, s * d).unwrap();
            let want = mem.load_dense(DType::F32, expected, s * d).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(a.is_nan(), b.is_nan(), "causal {causal} element {i}");
                assert!(
                    b.is_nan() || (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "element {i}"
                );
            }
        }
    }

    #[test]
    fn softmax_exp_is_accurate_for_non_positive_arguments() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let want = (x as f64).exp();
            let got = x.exp_fast() as f64;
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "relative error {worst:e}"
        );
        assert_eq!(f32::NEG_INFINITY.exp_fast(), 0.0);
        assert_eq!((-100.0f32).exp_fast(), 0.0);
        assert_eq!(0.0f32.exp_fast(), 1.0);
        assert!(f32::NAN.exp_fast().is_nan());
    }

    #[test]
    fn gradient_exp_is_accurate_on_both_sides_of_zero() {
        let (mut worst, mut worst64) = (0.0f64, 0.0f64);
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let want = (x as f64).exp();
            worst = worst.max(((x.exp_any() as f64 - want) / want).abs());
            let y = -708.0 + 1417.0 * (i as f64 / 200_000.0);
            worst64 = worst64.max(((y.exp_any() - y.exp()) / y.exp()).abs());
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "relative error {worst:e}"
        );
        assert!(
            worst64 < 4.0 * f64::EPSILON,
            "f64 relative error {worst64:e}"
        );
        assert_eq!(89.0f32.exp_any(), f32::INFINITY);
        assert_eq!(710.0f64.exp_any(), f64::INFINITY);
        assert_eq!(f32::NEG_INFINITY.exp_any(), 0.0);
        assert!(f32::NAN.exp_any().is_nan());
    }

    #[test]
    fn f64_softmax_exp_is_accurate() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -708.0 * (i as f64 / 200_000.0).powi(3);
            let want = x.exp();
            worst = worst.max(((x.exp_fast() - want) / want).abs());
        }
        assert!(worst < 4.0 * f64::EPSILON, "relative error {worst:e}");
        assert_eq!(f64::NEG_INFINITY.exp_fast(), 0.0);
        assert_eq!(0.0f64.exp_fast(), 1.0);
        assert!(f64::NAN.exp_fast().is_nan());
    }

    #[test]
    fn masks_cover_exactly_the_future_keys() {
        let mut s = vec![0.0f32; 4 * 3];
        // Tile of 4 queries from i0 = 10, 3 keys from j0 = 11: key 11 hidden from query 10, key 12
        // from queries 10 and 11, key 13 from 10, 11 and 12.
        mask(&mut s, 4, 4, 3, 1);
        let hidden: Vec<bool> = s.iter().map(|x| x.is_infinite()).collect();
        assert_eq!(
            hidden,
            [true, false, false, false, true, true, false, false, true, true, true, false]
        );
    }
}
