//! The gradients of attention on the CPU, flash style (FlashAttention-2's backward): the scores are
//! rebuilt a tile at a time from the forward's log-sum-exp and never stored whole.
//!
//! A work item is one (batch · head, range of keys). It first takes `D_i = dO_i · O_i` for every
//! query row of its head, then walks its keys in blocks of [`BLOCK_K`]; for each, it walks the
//! query blocks of [`BLOCK_Q`] rows that see the block (causal: from the block holding its first
//! key) and, with the `gemm` crate on each tile:
//!
//! 1. `S = scale · Q_blk · K_blkᵀ` and `dP = dO_blk · V_blkᵀ` (column-major tiles, query rows in the
//!    SIMD lanes);
//! 2. `P = exp(S − lse)` (masked keys −∞ first, so 0), `dS = P ∘ (dP − D)`;
//! 3. `dV_blk += Pᵀ · dO_blk`, `dK_blk += scale · dSᵀ · Q_blk`, `dQ_blk += scale · dS · K_blk`;
//!
//! and writes the key block's dK and dV rows, which only this item owns. dQ gathers terms from
//! every key, so each item sums its own in a head-sized buffer: written straight into dQ when the
//! head is one item, else into a partial that a last parallel pass adds up in range order. The
//! ranges per head are as many as make two items per thread (one when the heads already do),
//! so the result depends on the thread count only through that summation order.
//!
//! f32, f16 and bf16 compute in f32 (16-bit blocks are widened as they are used, results rounded
//! once), f64 in f64; `lse` is read in that compute type (the statistics dtype).

use super::super::team::par_for;
use gemm::Parallelism;

use super::super::conv::{out_of_memory, parallel_items, zeroed, Product, Raw, Wide};
use super::super::host::{with_float, with_simd, Ctx, Element, Real};
use super::{mask, Exp, BLOCK_K, BLOCK_Q};
use crate::backends::reference::{attention as reference, memory::HostMemory};
use crate::compute::AttentionBackwardDesc;
use crate::error::Result;

/// The op name in errors.
const OP: &str = "attention_backward";

/// Destination columns of one `gemm` call in these products (none of them is wider).
const ALL_COLUMNS: usize = usize::MAX;

/// The gradients of `d`'s attention into its `grad_q`, `grad_k` and `grad_v`.
pub(crate) fn attention_backward(
    mem: &mut HostMemory,
    d: &AttentionBackwardDesc,
    ctx: Ctx,
) -> Result<()> {
    if d.batch * d.heads == 0 || d.seq_kv == 0 || d.head_dim == 0 {
        return Ok(()); // No key (so no query either) or no head dim: nothing to write.
    }
    with_float!(d.dtype, T => typed::<T>(mem, d, ctx), _ => reference::attention_backward(mem, d))
}

/// The operands and sizes of one backward call.
struct Grad<T: Wide> {
    dout: Raw<T>,
    q: Raw<T>,
    k: Raw<T>,
    v: Raw<T>,
    o: Raw<T>,
    lse: Raw<T::Acc>,
    dq: Raw<T>,
    dk: Raw<T>,
    dv: Raw<T>,
    sq: usize,
    skv: usize,
    dim: usize,
    scale: T::Acc,
    causal: bool,
    /// Key ranges per head.
    splits: usize,
    /// Keys per range (a multiple of [`BLOCK_K`]).
    span: usize,
}

/// Per-item buffers, in the compute type.
struct Scratch<A> {
    /// Scores, then probabilities: `BLOCK_Q × BLOCK_K`, column-major.
    s: Vec<A>,
    /// `dO · Vᵀ`, then `dS`: as `s`.
    dp: Vec<A>,
    /// The key block's dK and dV sums: `BLOCK_K × dim` each, row-major.
    dk: Vec<A>,
    dv: Vec<A>,
    /// The item's dQ sums: `seq_q × dim`.
    dq: Vec<A>,
    /// `D_i` per query row of the head.
    delta: Vec<A>,
    /// Widened Q and dO blocks (half types): `BLOCK_Q × dim` each.
    qd: Vec<A>,
    /// Widened K and V blocks (half types): `BLOCK_K × dim` each.
    kv: Vec<A>,
    /// Two widened rows (half types).
    row: Vec<A>,
}

impl<A: Real> Scratch<A> {
    /// Buffers for `g`.
    fn new<T: Wide<Acc = A>>(g: &Grad<T>) -> Result<Scratch<A>> {
        let dim = g.dim;
        let half = usize::from(!T::NATIVE);
        Ok(Scratch {
            s: zeroed(BLOCK_Q * BLOCK_K)?,
            dp: zeroed(BLOCK_Q * BLOCK_K)?,
            dk: zeroed(BLOCK_K * dim)?,
            dv: zeroed(BLOCK_K * dim)?,
            dq: zeroed(g.sq * dim)?,
            delta: zeroed(g.sq)?,
            qd: zeroed(half * 2 * BLOCK_Q * dim)?,
            kv: zeroed(half * 2 * BLOCK_K * dim)?,
            row: zeroed(half * 2 * dim)?,
        })
    }

    /// Elements of the buffers for `g` (for the out-of-memory error).
    fn elements<T: Wide>(g: &Grad<T>) -> usize {
        2 * BLOCK_Q * BLOCK_K + g.sq * (g.dim + 1) + 2 * (BLOCK_Q + 2 * BLOCK_K + 1) * g.dim
    }
}

/// [`attention_backward`] for element type `T`.
fn typed<T: Wide>(mem: &mut HostMemory, d: &AttentionBackwardDesc, ctx: Ctx) -> Result<()>
where
    T::Acc: Exp + Element,
{
    let bh = d.batch * d.heads;
    let (sq, skv, dim) = (d.seq_q, d.seq_kv, d.head_dim);
    let key_blocks = skv.div_ceil(BLOCK_K);
    let splits = if ctx.threads > 1 && bh < 2 * ctx.threads {
        (2 * ctx.threads).div_ceil(bh).min(key_blocks)
    } else {
        1
    };
    let span = key_blocks.div_ceil(splits) * BLOCK_K;
    let splits = skv.div_ceil(span);
    let (nq, nkv) = (bh * sq * dim, bh * skv * dim);
    let g = Grad::<T> {
        dout: Raw::of(mem, OP, d.grad_output, nq)?,
        q: Raw::of(mem, OP, d.q, nq)?,
        k: Raw::of(mem, OP, d.k, nkv)?,
        v: Raw::of(mem, OP, d.v, nkv)?,
        o: Raw::of(mem, OP, d.o, nq)?,
        lse: Raw::of(mem, OP, d.lse, bh * sq)?,
        dq: Raw::of(mem, OP, d.grad_q, nq)?,
        dk: Raw::of(mem, OP, d.grad_k, nkv)?,
        dv: Raw::of(mem, OP, d.grad_v, nkv)?,
        sq,
        skv,
        dim,
        scale: T::Acc::from_f64(d.scale),
        causal: d.causal,
        splits,
        span,
    };
    // Each item's dQ sums when a head has several: [head][range][sq × dim].
    let mut partials = if splits > 1 {
        zeroed::<T::Acc>(bh * splits * sq * dim)?
    } else {
        Vec::new()
    };
    let part = Raw::of_slice(&mut partials);
    let items = bh * splits;
    let run = |item: usize, s: &mut Scratch<T::Acc>| {
        with_simd(
            ctx.simd,
            #[inline(always)]
            || g.item(item / splits, item % splits, s, part),
        );
    };
    if ctx.threads > 1 && items > 1 {
        parallel_items(items, ctx.threads).try_for_each_init(
            || Scratch::new(&g),
            |s, item| {
                let s = s
                    .as_mut()
                    .map_err(|_| out_of_memory::<T::Acc>(Scratch::<T::Acc>::elements(&g)))?;
                run(item, s);
                Ok::<(), crate::error::BackendError>(())
            },
        )?;
    } else {
        let mut s = Scratch::new(&g)?;
        for item in 0..items {
            run(item, &mut s);
        }
    }
    if splits > 1 {
        g.sum_partials(&partials, ctx);
    }
    Ok(())
}

impl<T: Wide> Grad<T>
where
    T::Acc: Exp + Element,
{
    /// Key range `split` of head `head` (batch · heads + head); its dQ sums go to `part` when the
    /// head has several ranges.
    #[inline(always)]
    fn item(&self, head: usize, split: usize, s: &mut Scratch<T::Acc>, part: Raw<T::Acc>) {
        let (sq, dim) = (self.sq, self.dim);
        let (ka, kb) = (split * self.span, ((split + 1) * self.span).min(self.skv));
        self.deltas(head, s);
        s.dq.fill(T::Acc::ZERO);
        // SAFETY: the head's log-sum-exp rows, which nothing writes.
        let lse = unsafe { self.lse.get(head * sq, sq) };
        for j0 in (ka..kb).step_by(BLOCK_K) {
            let cols = BLOCK_K.min(kb - j0);
            let (kp, vp) = self.kv_block(head, j0, cols, &mut s.kv);
            s.dk.fill(T::Acc::ZERO);
            s.dv.fill(T::Acc::ZERO);
            // Query blocks that see key j0 or later: all, or (causal) from the one holding j0.
            let first = if self.causal {
                j0 / BLOCK_Q * BLOCK_Q
            } else {
                0
            };
            for i0 in (first..sq).step_by(BLOCK_Q) {
                let rows = BLOCK_Q.min(sq - i0);
                let (qp, dop) = self.q_block(head, i0, rows, &mut s.qd);
                self.tile(s, (i0, rows), (j0, cols), (qp, dop), (kp, vp), &lse[i0..]);
            }
            self.store_keys(head, j0, cols, s);
        }
        // SAFETY: this head's dQ rows, or this item's partial, are written by this item only.
        unsafe {
            if self.splits == 1 {
                let dst = self.dq.get_mut(head * sq * dim, sq * dim);
                store(&s.dq, dst);
            } else {
                let at = (head * self.splits + split) * sq * dim;
                part.get_mut(at, sq * dim).copy_from_slice(&s.dq);
            }
        }
    }

    /// One (query block, key block) tile: the scores and `dP`, then the products into the key
    /// block's dK and dV sums and the item's dQ sums.
    #[inline(always)]
    fn tile(
        &self,
        s: &mut Scratch<T::Acc>,
        (i0, rows): (usize, usize),
        (j0, cols): (usize, usize),
        (qp, dop): (*const T::Acc, *const T::Acc),
        (kp, vp): (*const T::Acc, *const T::Acc),
        lse: &[T::Acc],
    ) {
        let (dim, ld) = (self.dim, BLOCK_Q);
        // SAFETY (every product): the tiles are BLOCK_Q × BLOCK_K column-major buffers of this
        // item (rows × cols used), the Q and dO blocks `rows × dim` and the K and V blocks
        // `cols × dim` row-major (inputs nothing writes, or this item's widened copies), dk and
        // dv `BLOCK_K × dim` and dq `sq × dim` row-major sums of this item; no destination
        // overlaps an operand.
        unsafe {
            let scores = Product {
                m: rows,
                n: cols,
                k: dim,
                dst: s.s.as_mut_ptr(),
                dst_strides: (1, ld),
                lhs: qp,
                lhs_strides: (dim, 1),
                rhs: kp,
                rhs_strides: (1, dim),
                alpha: self.scale,
                accumulate: false,
            };
            scores.run_split(ALL_COLUMNS, Parallelism::None);
            Product {
                dst: s.dp.as_mut_ptr(),
                lhs: dop,
                rhs: vp,
                alpha: T::Acc::ONE,
                ..scores
            }
            .run_split(ALL_COLUMNS, Parallelism::None);
        }
        if self.causal && j0 + cols > i0 + 1 {
            mask(&mut s.s, ld, rows, cols, j0 as isize - i0 as isize);
        }
        let delta = &s.delta[i0..i0 + rows];
        for (p, dp) in
            s.s.chunks_exact_mut(ld)
                .zip(s.dp.chunks_exact_mut(ld))
                .take(cols)
        {
            probabilities(&mut p[..rows], &mut dp[..rows], &lse[..rows], delta);
        }
        // SAFETY: as above.
        unsafe {
            // dV += Pᵀ · dO: Pᵀ is cols × rows with row stride ld.
            let dv = Product {
                m: cols,
                n: dim,
                k: rows,
                dst: s.dv.as_mut_ptr(),
                dst_strides: (dim, 1),
                lhs: s.s.as_ptr(),
                lhs_strides: (ld, 1),
                rhs: dop,
                rhs_strides: (dim, 1),
                alpha: T::Acc::ONE,
                accumulate: true,
            };
            dv.run_split(ALL_COLUMNS, Parallelism::None);
            // dK += scale · dSᵀ · Q.
            Product {
                dst: s.dk.as_mut_ptr(),
                lhs: s.dp.as_ptr(),
                rhs: qp,
                alpha: self.scale,
                ..dv
            }
            .run_split(ALL_COLUMNS, Parallelism::None);
            // dQ += scale · dS · K.
            Product {
                m: rows,
                n: dim,
                k: cols,
                dst: s.dq.as_mut_ptr().add(i0 * dim),
                dst_strides: (dim, 1),
                lhs: s.dp.as_ptr(),
                lhs_strides: (1, ld),
                rhs: kp,
                rhs_strides: (dim, 1),
                alpha: self.scale,
                accumulate: true,
            }
            .run_split(ALL_COLUMNS, Parallelism::None);
        }
    }

    /// `D_i = dO_i · O_i` for every query row of `head`, into `s.delta`.
    #[inline(always)]
    fn deltas(&self, head: usize, s: &mut Scratch<T::Acc>) {
        let dim = self.dim;
        for i in 0..self.sq {
            let at = (head * self.sq + i) * dim;
            // SAFETY: row i of this head lies inside dO and O, which nothing writes.
            let (dout, o) = unsafe { (self.dout.get(at, dim), self.o.get(at, dim)) };
            s.delta[i] = match (T::as_acc(dout), T::as_acc(o)) {
                (Some(a), Some(b)) => dot(a, b),
                _ => {
                    let (a, b) = s.row.split_at_mut(dim);
                    T::widen_slice(dout, a);
                    T::widen_slice(o, b);
                    dot(a, b)
                }
            };
        }
    }

    /// Pointers to query rows `i0 .. i0 + rows` of Q and dO for `head` (`rows × dim` each,
    /// row-major): the inputs themselves for f32 and f64, else widened copies in `qd`.
    #[inline(always)]
    fn q_block(
        &self,
        head: usize,
        i0: usize,
        rows: usize,
        qd: &mut [T::Acc],
    ) -> (*const T::Acc, *const T::Acc) {
        block(
            &self.q,
            &self.dout,
            (head * self.sq + i0) * self.dim,
            rows * self.dim,
            qd,
        )
    }

    /// Pointers to keys `j0 .. j0 + cols` of K and V for `head`, as [`Grad::q_block`].
    #[inline(always)]
    fn kv_block(
        &self,
        head: usize,
        j0: usize,
        cols: usize,
        kv: &mut [T::Acc],
    ) -> (*const T::Acc, *const T::Acc) {
        block(
            &self.k,
            &self.v,
            (head * self.skv + j0) * self.dim,
            cols * self.dim,
            kv,
        )
    }

    /// Writes the key block's dK and dV sums to rows `j0 .. j0 + cols` of `head`, rounded.
    #[inline(always)]
    fn store_keys(&self, head: usize, j0: usize, cols: usize, s: &mut Scratch<T::Acc>) {
        let (at, len) = ((head * self.skv + j0) * self.dim, cols * self.dim);
        // SAFETY: these key rows belong to this item's range only.
        unsafe {
            store(&s.dk[..len], self.dk.get_mut(at, len));
            store(&s.dv[..len], self.dv.get_mut(at, len));
        }
    }

    /// dQ as the sum of each head's partials in range order, rounded; rows in parallel.
    fn sum_partials(&self, partials: &[T::Acc], ctx: Ctx) {
        let (sq, dim, splits) = (self.sq, self.dim, self.splits);
        let rows = partials.len() / (splits * dim);
        let sum_row = |r: usize, acc: &mut Vec<T::Acc>| {
            let (head, i) = (r / sq, r % sq);
            acc.clear();
            acc.resize(dim, T::Acc::ZERO);
            for split in 0..splits {
                let at = ((head * splits + split) * sq + i) * dim;
                for (a, &p) in acc.iter_mut().zip(&partials[at..at + dim]) {
                    *a += p;
                }
            }
            // SAFETY: row r of dQ is written by this task only.
            store(acc, unsafe { self.dq.get_mut(r * dim, dim) });
        };
        if ctx.threads > 1 {
            par_for(rows.div_ceil(64), |block| {
                let mut acc = Vec::new();
                (block * 64..((block + 1) * 64).min(rows)).for_each(|r| sum_row(r, &mut acc));
            });
        } else {
            let mut acc = Vec::new();
            (0..rows).for_each(|r| sum_row(r, &mut acc));
        }
    }
}

/// Pointers to `len` elements from `at` of `a` and `b`: the inputs themselves when `T` computes in
/// itself, else widened copies in the two halves of `buf`.
#[inline(always)]
fn block<T: Wide>(
    a: &Raw<T>,
    b: &Raw<T>,
    at: usize,
    len: usize,
    buf: &mut [T::Acc],
) -> (*const T::Acc, *const T::Acc) {
    if T::NATIVE {
        return (a.at(at).cast_const().cast(), b.at(at).cast_const().cast());
    }
    let (aw, bw) = buf.split_at_mut(buf.len() / 2);
    // SAFETY: the block lies inside both inputs, which nothing writes.
    unsafe {
        T::widen_slice(a.get(at, len), &mut aw[..len]);
        T::widen_slice(b.get(at, len), &mut bw[..len]);
    }
    (aw.as_ptr(), bw.as_ptr())
}

/// One key's column of a tile: `p = exp(s − lse)` over its query rows, and `dp` becomes
/// `dS = p · (dp − D)`.
#[inline(always)]
fn probabilities<A: Exp>(p: &mut [A], dp: &mut [A], lse: &[A], delta: &[A]) {
    for (((p, dp), &l), &d) in p.iter_mut().zip(dp.iter_mut()).zip(lse).zip(delta) {
        let e = (*p - l).exp_any();
        *p = e;
        *dp = e * (*dp - d);
    }
}

/// `Σ a_i · b_i`.
#[inline(always)]
fn dot<A: Real>(a: &[A], b: &[A]) -> A {
    let mut acc = A::ZERO;
    for (&x, &y) in a.iter().zip(b) {
        acc = x.mul_add(y, acc);
    }
    acc
}

/// Writes `acc` to `dst`: copied for f32 and f64, rounded for the half types.
#[inline(always)]
fn store<T: Wide>(acc: &[T::Acc], dst: &mut [T]) {
    match T::as_acc_mut(dst) {
        Some(out) => out.copy_from_slice(acc),
        None => T::narrow_slice(acc, dst),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{on_threads, random, PROBLEMS};
    use super::*;
    use crate::compute::{AttentionDesc, DevicePtr};
    use crate::dtype::DType;
    use crate::rng::HostRng;

    const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

    /// Norm-wise relative error bound per dtype.
    fn bound(dtype: DType) -> f64 {
        match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 2e-5,
            _ => 2e-2,
        }
    }

    /// A buffer of `n` NaNs of `dtype`: an output no write may leave so.
    fn poisoned(mem: &mut HostMemory, dtype: DType, n: usize) -> DevicePtr {
        let ptr = mem.alloc((n * dtype.size_in_bytes()).max(1)).unwrap();
        mem.store(dtype, ptr, &vec![f64::NAN; n]).unwrap();
        ptr
    }

    /// The kernel against the reference for `[batch, heads, seq_q, seq_kv, head_dim]` in `dtype`
    /// on `threads` threads, from the reference forward's output and log-sum-exp.
    fn check(sizes: [usize; 5], causal: bool, scale: f64, dtype: DType, threads: usize) {
        let [batch, heads, seq_q, seq_kv, head_dim] = sizes;
        let mut mem = HostMemory::default();
        let mut rng = HostRng::new(sizes.iter().sum::<usize>() as u64 + u64::from(causal));
        let bh = batch * heads;
        let (nq, nkv) = (bh * seq_q * head_dim, bh * seq_kv * head_dim);
        let (q, k, v, dout) = (
            random(&mut mem, &mut rng, dtype, nq),
            random(&mut mem, &mut rng, dtype, nkv),
            random(&mut mem, &mut rng, dtype, nkv),
            random(&mut mem, &mut rng, dtype, nq),
        );
        let o = poisoned(&mut mem, dtype, nq);
        let lse = mem.alloc((bh * seq_q * 8).max(1)).unwrap();
        let fwd = AttentionDesc {
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
            scale,
            causal,
            lse: Some(lse),
        };
        reference::attention(&mut mem, &fwd).unwrap();
        let [dq, dk, dv] = [nq, nkv, nkv].map(|n| poisoned(&mut mem, dtype, n));
        let [wq, wk, wv] = [nq, nkv, nkv].map(|n| poisoned(&mut mem, dtype, n));
        let desc = AttentionBackwardDesc {
            dtype,
            grad_output: dout,
            q,
            k,
            v,
            o,
            lse,
            grad_q: dq,
            grad_k: dk,
            grad_v: dv,
            batch,
            heads,
            seq_q,
            seq_kv,
            head_dim,
            scale,
            causal,
        };
        desc.accesses().unwrap();
        on_threads(threads, |ctx| attention_backward(&mut mem, &desc, ctx)).unwrap();
        let oracle = AttentionBackwardDesc {
            grad_q: wq,
            grad_k: wk,
            grad_v: wv,
            ..desc
        };
        reference::attention_backward(&mut mem, &oracle).unwrap();
        for (name, got, want, n) in [("dq", dq, wq, nq), ("dk", dk, wk, nkv), ("dv", dv, wv, nkv)] {
            let got = mem.load_dense(dtype, got, n).unwrap();
            let want = mem.load_dense(dtype, want, n).unwrap();
            let (mut err, mut norm) = (0.0f64, 0.0f64);
            for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    !a.is_nan(),
                    "{name} {sizes:?} {dtype:?} element {i} unwritten"
                );
                err += (a - b) * (a - b);
                norm += b * b;
            }
            // Relative to the gradient's norm, or to unit elements where it is smaller (a single
            // visible key makes dq 0 up to rounding).
            let rel = (err / norm.max(n.max(1) as f64)).sqrt();
            assert!(
                rel <= bound(dtype),
                "{name} {sizes:?} causal {causal} {dtype:?} on {threads} threads: relative error {rel:e}"
            );
        }
    }

    /// Every dtype on 1 and 2 threads, causal and not.
    fn check_all(sizes: [usize; 5], scale: f64) {
        for causal in [false, true] {
            for dtype in DTYPES {
                for threads in [1, 2] {
                    check(sizes, causal, scale, dtype, threads);
                }
            }
        }
    }

    #[test]
    fn odd_and_unequal_lengths_match_the_reference() {
        // The forward's problems: causal with fewer queries than keys leaves the last keys unseen
        // (their gradients are 0), and no query at all leaves every key so.
        for (sizes, scale) in PROBLEMS {
            check_all(sizes, scale);
        }
    }

    #[test]
    fn key_ranges_of_one_head_sum_their_query_gradients() {
        // One head on two threads: four key ranges whose dQ partials are added up.
        for dtype in DTYPES {
            for causal in [false, true] {
                check([1, 1, 150, 300, 32], causal, 0.2, dtype, 2);
            }
        }
    }
}
