//! Stable sorts along one dim on the CPU, over a dense input seen as `[outer, len, inner]`: the
//! lines (every position but the dim) spread over the backend's threads, each ordered by its
//! elements' keys ([`Key`]: f16 and bf16 widened to f32 exactly, the others as they are) in the
//! reference's total order with ties broken by position (the stable order), values moved as they
//! are. Keys compare as integer ranks ([`Rank`]) paired with their positions. Where only the first
//! `k` of a line are wanted (`topk`), they are selected first and only they are sorted: by a scan
//! against a tightening bound for a `k` much smaller than the line, else by a selection over the
//! whole line. Strided or misaligned operands take the reference's kernel (the tensor API passes
//! dense inputs).

use std::ops::{BitXor, Not};

use half::{bf16, f16};

use super::host::{for_chunks, with_simd, Ctx, Span};
use super::select::Key;
use crate::backends::cpu::cost::items_per_task;
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::memory::HostMemory;
use crate::compute::op::OpImpl;
use crate::compute::{ComputeBackend, DevicePtr, SortDesc};
use crate::dtype::DType;
use crate::error::Result;

/// A key's place in the reference's total order as an integer of the key's width (at least 32
/// bits): ranks compare as their keys do, with every NaN equal to every other and after every
/// number, and `-0` equal to `+0`.
trait Rank: Copy {
    /// The integer type of the ranks; `!r` reverses their order.
    type R: Ord + Copy + Default + Send + Sync + Not<Output = Self::R> + BitXor<Output = Self::R>;
    /// The rank of this key.
    fn rank(self) -> Self::R;
}

/// [`Rank`] for an integer key: its value.
macro_rules! integer_rank {
    ($($t:ty => $r:ty),*) => {$(
        impl Rank for $t {
            type R = $r;
            #[inline(always)]
            fn rank(self) -> $r {
                <$r>::from(self)
            }
        }
    )*};
}
integer_rank!(u8 => i32, i32 => i32, i64 => i64);

/// [`Rank`] for a float key: its bits as a signed integer of its width (after `+ 0.0`, which makes
/// `-0` into `+0`), negative ones with their magnitude bits flipped so that they count down; NaN
/// the largest rank.
macro_rules! float_rank {
    ($($t:ty => $r:ty),*) => {$(
        impl Rank for $t {
            type R = $r;
            #[inline(always)]
            fn rank(self) -> $r {
                let bits = (self + 0.0).to_bits() as $r;
                let ordered = bits ^ ((bits >> (<$r>::BITS - 1)) & <$r>::MAX);
                if self.is_nan() {
                    <$r>::MAX
                } else {
                    ordered
                }
            }
        }
    )*};
}
float_rank!(f32 => i32, f64 => i64);

/// The rank of `v`'s key, reversed where `flip` is all ones.
#[inline(always)]
fn ranked<T: Key>(v: T, flip: <T::K as Rank>::R) -> <T::K as Rank>::R
where
    T::K: Rank,
{
    v.key().rank() ^ flip
}

/// A line's first `k` are found by [`first_k`] when the line holds at least this many times `k`
/// elements, else by a selection over the whole line.
const FILTER_RATIO: usize = 8;

/// Elements of a line compared with [`first_k`]'s bound as one block, a vector's comparisons
/// at a time: a block none of which passes costs no more.
const BLOCK: usize = 16;

/// The candidates [`first_k`] holds, in units of `k`, before it cuts them back to `k`.
const KEPT: usize = 4;

/// Leaves in `kept` the first `k` (`1 ≤ k ≤ line.len()`) of `line` as `(rank, position)` pairs,
/// unordered, where `rank` gives each element's place in the order (ties going by position).
///
/// `kept` (empty on entry) holds candidates and the bound: the largest rank of the `k` best seen
/// when they were last cut back to `k`. A later element can be among the first `k` only when its
/// rank is strictly less than the bound (its position is the larger), so the line is scanned in
/// blocks of [`BLOCK`] against the bound, a block with a candidate appends its candidates without
/// branches, and at [`KEPT`]` · k` candidates a selection cuts them back to `k` and tightens the
/// bound. On a line in random order the bound soon passes only a few elements in a hundred.
#[inline(always)]
fn first_k<T: Copy, R: Ord + Copy + Default>(
    kept: &mut Vec<(R, usize)>,
    line: &[T],
    k: usize,
    rank: impl Fn(T) -> R,
) {
    let cut = |kept: &mut Vec<(R, usize)>| {
        kept.select_nth_unstable(k - 1);
        kept.truncate(k);
    };
    kept.reserve(KEPT * k + BLOCK);
    kept.extend(line[..k].iter().enumerate().map(|(i, &v)| (rank(v), i)));
    let mut bound = kept.iter().map(|p| p.0).max().unwrap_or_default();
    for (b, block) in line[k..].chunks(BLOCK).enumerate() {
        if !block.iter().fold(false, |any, &v| any | (rank(v) < bound)) {
            continue;
        }
        let (mut n, first) = (kept.len(), k + b * BLOCK);
        // Every element is written at the end and kept only if it passes.
        kept.resize(n + block.len(), (R::default(), 0));
        for (j, &v) in block.iter().enumerate() {
            let r = rank(v);
            kept[n] = (r, first + j);
            n += usize::from(r < bound);
        }
        kept.truncate(n);
        if kept.len() >= KEPT * k {
            cut(kept);
            bound = kept[k - 1].0;
        }
    }
    if kept.len() > k {
        cut(kept);
    }
}

/// The sort of `d` (dense input) for elements of type `T`.
fn sort_t<T: Key>(mem: &mut HostMemory, d: &SortDesc, ctx: Ctx) -> Result<()>
where
    T::K: Rank,
{
    const OP: &str = "sort";
    let n = d.input.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let size = std::mem::size_of::<T>();
    let first = DevicePtr(d.input.ptr.0 + (d.input.layout.offset() * size) as u64);
    let x = Span::<T>::of(mem, OP, first, n)?;
    let (outer, len, inner) = d.geometry();
    let k = d.k;
    let kept = outer * k * inner;
    if kept == 0 {
        return Ok(());
    }
    let values = d
        .values
        .map(|p| Span::<T>::of(mem, OP, p, kept))
        .transpose()?;
    let indices = d
        .indices
        .map(|p| Span::<i64>::of(mem, OP, p, kept))
        .transpose()?;
    // The lines' order as ranks, reversed bit by bit when descending. Pairs of rank and position
    // then compare as the stable sort's order, a strict order, so a selection of the first k and
    // an unstable sort of them give the stable sort's first k.
    let flip = if d.descending {
        !<T::K as Rank>::R::default()
    } else {
        <T::K as Rank>::R::default()
    };
    let filter = k < len && k.saturating_mul(FILTER_RATIO) <= len;
    for_chunks(outer * inner, ctx.threads, items_per_task(len), |lines| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || {
                let rank = |v: T| ranked(v, flip);
                let mut order = Vec::new();
                let mut strided: Vec<T> = Vec::new();
                for line in lines {
                    let (o, j) = (line / inner, line % inner);
                    let at = |i: usize| (o * len + i) * inner + j;
                    let to = |i: usize| (o * k + i) * inner + j;
                    order.clear();
                    if filter {
                        let line = if inner == 1 {
                            // SAFETY: the line is inside the input, which nothing writes during
                            // the op.
                            unsafe { x.slice(at(0)..at(0) + len) }
                        } else {
                            strided.clear();
                            // SAFETY: every position is inside the input, as above.
                            strided.extend((0..len).map(|i| unsafe { x.read(at(i)) }));
                            &strided
                        };
                        first_k(&mut order, line, k, rank);
                    } else {
                        // SAFETY: as above.
                        order.extend((0..len).map(|i| (rank(unsafe { x.read(at(i)) }), i)));
                        if k < len {
                            order.select_nth_unstable(k - 1);
                        }
                    }
                    order[..k].sort_unstable();
                    for (i, &(_, from)) in order[..k].iter().enumerate() {
                        // SAFETY: this task owns its lines of both outputs, which overlap no
                        // input and not each other.
                        unsafe {
                            if let Some(v) = values {
                                v.write(to(i), x.read(at(from)));
                            }
                            if let Some(ix) = indices {
                                ix.write(to(i), from as i64);
                            }
                        }
                    }
                }
            },
        )
    });
    Ok(())
}

impl OpImpl<SortDesc> for CpuBackend {
    fn op(&self, desc: &SortDesc) -> Result<()> {
        let acc = desc.accesses()?;
        let size = desc.dtype.size_in_bytes() as u64;
        let aligned = acc.regions.iter().all(|r| {
            let width = if r.name == "indices" { 8 } else { size };
            r.ptr.0.is_multiple_of(width)
        });
        if !aligned || !desc.input.layout.is_contiguous() {
            return self.scalar.sort(desc);
        }
        self.kernel(acc, |mem, ctx| match desc.dtype {
            DType::F32 => sort_t::<f32>(mem, desc, ctx),
            DType::F64 => sort_t::<f64>(mem, desc, ctx),
            DType::F16 => sort_t::<f16>(mem, desc, ctx),
            DType::BF16 => sort_t::<bf16>(mem, desc, ctx),
            DType::I32 => sort_t::<i32>(mem, desc, ctx),
            DType::I64 => sort_t::<i64>(mem, desc, ctx),
            DType::U8 => sort_t::<u8>(mem, desc, ctx),
        })
    }
}
