//! The CPU backend's threading cost model: whether an op is worth sharing with the thread team,
//! and how much work each task of a shared op takes. Both decisions of every CPU kernel are made
//! from the constants and functions here; a kernel adds only how its work divides (rows, planes,
//! blocks of output positions) and how many items it wants per thread.
//!
//! An op's [`Work`] is the time one thread needs for it, counted in flops: a byte read or written
//! costs [`FLOPS_PER_BYTE`] flops (one core streams about 16 bytes per nanosecond from memory in
//! the time its FMA units do about 128 f32 flops). An op goes to the team when its work reaches
//! [`TEAM_WORK`], about 16 µs on one thread: several times the team's hand-off (2–6 µs measured for
//! posting the tasks, reaching the spinning workers and joining them), so that a second thread
//! repays it; below that it runs on the calling thread, and so do all its tasks. A shared op is cut
//! into tasks of at least [`TEAM_WORK`] each as well ([`TASK_ELEMENTS`], [`items_per_task`]), at
//! most four per thread (`host::for_chunks`), so that small planes of pooling, norms and
//! elementwise ops are batched into a task rather than run one task each. The work items of
//! convolution and attention, each well past [`TEAM_WORK`], go in up to sixteen jobs per thread
//! (`team::Items`), so that a thread slowed by a busy core holds the op up by one small job.
//!
//! The rates are the top of one core's, so estimates err short: an op the model keeps on one thread
//! loses at most the half of its 16 µs that a second thread would have taken, while an op shared
//! too eagerly pays a hand-off on every call. The autotuner (`CpuBackend::variants`) still times both
//! choices for GEMM and convolution, where they matter most.

/// Flops one thread computes in the time it moves one byte to or from memory.
pub(crate) const FLOPS_PER_BYTE: usize = 8;

/// Work, in flops, from which an op goes to the team and which each of its tasks takes at least:
/// about 16 µs of one thread (see the module documentation).
pub(crate) const TEAM_WORK: usize = 1 << 21;

/// Bytes a pass moves per element: one f32 read and one written.
const PASS_BYTES: usize = 8;

/// Elements of one task of a pass that reads and writes each element once as f32: [`TEAM_WORK`]
/// of it. Kernels over every element type count in these elements (an f64 pass moves twice the
/// bytes per element, an f16 or bf16 one half of them but widens each element).
pub(crate) const TASK_ELEMENTS: usize = TEAM_WORK / (PASS_BYTES * FLOPS_PER_BYTE);

/// Items of `elements_per_item` elements (0 counts as 1) that make one task of
/// [`TASK_ELEMENTS`]: at least 1.
pub(crate) const fn items_per_task(elements_per_item: usize) -> usize {
    let elements = if elements_per_item == 0 {
        1
    } else {
        elements_per_item
    };
    Work::bytes(elements.saturating_mul(PASS_BYTES)).per_task()
}

/// An estimate of the time one thread needs for some work, in flops (bytes moved count
/// [`FLOPS_PER_BYTE`] each). Sums saturate, so sizes that overflow read as "a lot of work".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Work(usize);

impl Work {
    /// The work of moving `bytes` bytes to or from memory.
    pub(crate) const fn bytes(bytes: usize) -> Work {
        Work(bytes.saturating_mul(FLOPS_PER_BYTE))
    }

    /// The work of `flops` floating-point operations (a multiply-add counts two).
    pub(crate) const fn flops(flops: usize) -> Work {
        Work(flops)
    }

    /// This work and `other`, one after the other.
    pub(crate) const fn plus(self, other: Work) -> Work {
        Work(self.0.saturating_add(other.0))
    }

    /// This work done `n` times.
    pub(crate) const fn times(self, n: usize) -> Work {
        Work(self.0.saturating_mul(n))
    }

    /// How many items of this work make one task of at least [`TEAM_WORK`]: at least 1.
    pub(crate) const fn per_task(self) -> usize {
        let per = if self.0 == 0 { 1 } else { self.0 };
        let items = TEAM_WORK / per;
        if items == 0 {
            1
        } else {
            items
        }
    }

    /// Whether this work repays the team's hand-off: at least [`TEAM_WORK`].
    pub(crate) const fn shares(self) -> bool {
        self.0 >= TEAM_WORK
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::cpu::CpuBackend;
    use crate::compute::*;
    use crate::dtype::DType;

    #[test]
    fn the_thresholds_are_one_time_in_two_units() {
        // 256 KiB moved and 1 M multiply-adds are the same 16 µs of one thread.
        assert_eq!(Work::bytes(1 << 18), Work::flops(1 << 21));
        assert!(Work::bytes(1 << 18).shares());
        assert!(!Work::bytes((1 << 18) - 1).shares());
        assert_eq!(TASK_ELEMENTS, 1 << 15);
        assert!(Work::bytes(8 * TASK_ELEMENTS).shares());
        // A 64³ GEMM (0.5 MFLOP, 48 KiB) stays on one thread; 128³ (4 MFLOP) shares.
        let gemm = |n: usize| Work::flops(2 * n * n * n).plus(Work::bytes(3 * 4 * n * n));
        assert!(!gemm(64).shares());
        assert!(gemm(128).shares());
        // Neither part alone need reach the threshold.
        assert!(!Work::bytes(1 << 17).shares() && !Work::flops(1 << 20).shares());
        assert!(Work::bytes(1 << 17).plus(Work::flops(1 << 20)).shares());
        assert!(Work::bytes(usize::MAX)
            .plus(Work::flops(usize::MAX))
            .shares());
    }

    #[test]
    fn items_per_task_fill_a_task() {
        assert_eq!(items_per_task(0), TASK_ELEMENTS);
        assert_eq!(items_per_task(1), TASK_ELEMENTS);
        assert_eq!(items_per_task(64), TASK_ELEMENTS / 64);
        assert_eq!(items_per_task(TASK_ELEMENTS + 1), 1);
        assert_eq!(items_per_task(usize::MAX), 1);
    }

    /// A buffer of `n` f32 values, none zero.
    fn filled(b: &CpuBackend, n: usize) -> DevicePtr {
        let ptr = b.alloc(4 * n).unwrap();
        let bytes: Vec<u8> = (0..n)
            .flat_map(|i| (1.0 + (i % 7) as f32 / 8.0).to_le_bytes())
            .collect();
        b.copy_htod(ptr, &bytes).unwrap();
        ptr
    }

    /// How many jobs `op` posted to the team of `b`.
    fn jobs_of(b: &CpuBackend, op: impl FnOnce(&CpuBackend)) -> u64 {
        let before = b.team.jobs();
        op(b);
        b.team.jobs() - before
    }

    #[test]
    fn ops_go_to_the_team_only_when_their_work_repays_it() {
        let mut b = CpuBackend::new(Some(2), true).unwrap();
        b.init().unwrap();
        if b.simd() == crate::backends::cpu::SimdLevel::Scalar {
            return; // No SIMD kernels: every op runs the reference on the calling thread.
        }
        let add = |n: usize| {
            let (x, y, z) = (filled(&b, n), filled(&b, n), filled(&b, n));
            let desc = BinaryDesc {
                op: BinaryOp::Add,
                dtype: DType::F32,
                lhs: StridedBuf::contiguous(x, &[n]),
                rhs: StridedBuf::contiguous(y, &[n]).into(),
                output: z,
            };
            jobs_of(&b, |b| b.binary(&desc).unwrap())
        };
        assert_eq!(add(1000), 0, "a 12 KB add stays on the calling thread");
        assert!(add(1 << 20) > 0, "a 12 MB add is shared");

        // The client's pooling shape: 2048 planes of 8×8 (80 KB moved) in one call, on one thread.
        let (input, output) = (filled(&b, 32 * 8 * 8 * 8), filled(&b, 32 * 8 * 4 * 4));
        let pool = Pool2dDesc {
            kind: PoolKind::Max,
            dtype: DType::F32,
            input,
            input_shape: [32, 8, 8, 8],
            output,
            output_shape: [32, 8, 4, 4],
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
            indices: None,
        };
        assert_eq!(jobs_of(&b, |b| b.pool2d(&pool).unwrap()), 0);

        // 64³ GEMM: 0.5 MFLOP on 48 KiB, on one thread.
        let (x, y, z) = (
            filled(&b, 64 * 64),
            filled(&b, 64 * 64),
            filled(&b, 64 * 64),
        );
        let gemm = GemmDesc {
            dtype: DType::F32,
            trans_a: Transpose::No,
            trans_b: Transpose::No,
            m: 64,
            n: 64,
            k: 64,
            alpha: 1.0,
            a: x,
            lda: 64,
            b: y,
            ldb: 64,
            beta: 0.0,
            c: z,
            ldc: 64,
        };
        assert_eq!(jobs_of(&b, |b| b.gemm(&gemm).unwrap()), 0);

        // A convolution that moves 100 KB but computes 4.7 MFLOP is shared for its flops.
        let (input, weight, output) = (
            filled(&b, 4 * 32 * 8 * 8),
            filled(&b, 32 * 32 * 9),
            filled(&b, 4 * 32 * 8 * 8),
        );
        let conv = Conv2dDesc {
            dtype: DType::F32,
            input,
            input_shape: [4, 32, 8, 8],
            weight,
            weight_shape: [32, 32, 3, 3],
            bias: None,
            output,
            output_shape: [4, 32, 8, 8],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
        };
        assert!(jobs_of(&b, |b| b.conv2d_forward(&conv).unwrap()) > 0);

        // So is one head of attention over 128 positions: 128 KiB moved, 4.2 MFLOP.
        let [q, k, v, o] = [0; 4].map(|_| filled(&b, 128 * 64));
        let attention = AttentionDesc {
            dtype: DType::F32,
            q,
            k,
            v,
            o,
            batch: 1,
            heads: 1,
            seq_q: 128,
            seq_kv: 128,
            head_dim: 64,
            scale: 0.125,
            causal: false,
            lse: None,
        };
        assert!(jobs_of(&b, |b| b.attention(&attention).unwrap()) > 0);
    }
}
