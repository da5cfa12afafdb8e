//! Tests of the CPU reductions against the reference, and helpers other CPU op tests share.

use super::*;
use crate::compute::{DevicePtr, StridedBuf};
use crate::dtype::DType;
use crate::shape::Layout;
use crate::validation::{compare, tolerance};

/// `n` pseudo-random values in `[-2, 2)` from `seed` (a 64-bit LCG), never all zero.
pub(crate) fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect()
}

/// `vals` stored as `dtype` in a fresh allocation.
pub(crate) fn upload(mem: &mut HostMemory, dtype: DType, vals: &[f64]) -> DevicePtr {
    let p = mem.alloc(vals.len() * dtype.size_in_bytes()).unwrap();
    mem.store(dtype, p, vals).unwrap();
    p
}

/// Runs `f` inside a team of `threads` threads with the matching context.
pub(crate) fn on_threads<R>(threads: usize, f: impl FnOnce(Ctx) -> R) -> R {
    crate::backends::cpu::team::on_threads(threads, f)
}

/// Asserts `got` is within `dtype`'s parity bound of `want` (exactly equal for integers).
pub(crate) fn check(dtype: DType, got: &[f64], want: &[f64], what: &str) {
    let c = compare(got, want);
    assert!(c.within(tolerance(dtype)), "{what}: {c}");
}

const OPS: [ReduceOp; 8] = [
    ReduceOp::Sum,
    ReduceOp::Mean,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Var { correction: 0 },
    ReduceOp::Var { correction: 1 },
    ReduceOp::ArgMax,
    ReduceOp::ArgMin,
];

/// Reduces the view `layout` of `vals` (the whole buffer) along `axis` with every op in `ops`,
/// on every float dtype with 1 and 2 threads, and compares with the reference.
fn check_view(vals: &[f64], layout: &Layout, axis: usize, ops: &[ReduceOp]) {
    for dtype in DType::FLOATS {
        let mut mem = HostMemory::default();
        let buf = upload(&mut mem, dtype, vals);
        let input = StridedBuf {
            ptr: buf,
            layout: layout.clone(),
        };
        for &op in ops {
            if matches!(op, ReduceOp::Var { .. }) && layout.strides()[axis] == 0 {
                // A constant lane: the exact variance is 0 and the reference's is rounding
                // noise, so relative errors mean nothing.
                continue;
            }
            let od = op.output_dtype(dtype);
            let desc = |output| ReduceDesc {
                op,
                dtype,
                input: input.clone(),
                axis,
                output,
            };
            let n: usize = desc(buf).output_shape().iter().product();
            let want_ptr = mem.alloc(n * od.size_in_bytes()).unwrap();
            reference::reduce(&mut mem, &desc(want_ptr)).unwrap();
            let want = mem.load_dense(od, want_ptr, n).unwrap();
            for threads in [1, 2] {
                let got_ptr = mem.alloc(n * od.size_in_bytes()).unwrap();
                on_threads(threads, |ctx| reduce(&mut mem, &desc(got_ptr), ctx)).unwrap();
                let got = mem.load_dense(od, got_ptr, n).unwrap();
                let what = format!(
                    "{} {dtype} {:?}/{:?}+{} axis {axis}, {threads} thread(s)",
                    op.name(),
                    layout.shape(),
                    layout.strides(),
                    layout.offset()
                );
                if od == DType::I64 {
                    assert_eq!(got, want, "{what}");
                } else {
                    check(dtype, &got, &want, &what);
                }
                mem.free(got_ptr).unwrap();
            }
        }
    }
}

/// Every axis of a contiguous `shape`.
fn check_contiguous(shape: &[usize], seed: u64, ops: &[ReduceOp]) {
    let n: usize = shape.iter().product();
    let vals = random(n, seed);
    let layout = Layout::contiguous(shape);
    for axis in 0..shape.len() {
        check_view(&vals, &layout, axis, ops);
    }
}

#[test]
fn small_contiguous_shapes_every_op_and_axis() {
    for (k, shape) in [
        vec![1],
        vec![1, 1],
        vec![7],
        vec![7, 13, 5],
        vec![3, 1, 4],
        vec![2, 3, 257],
        vec![3, 300, 2],
    ]
    .into_iter()
    .enumerate()
    {
        check_contiguous(&shape, k as u64, &OPS);
    }
}

#[test]
fn long_lanes_split_into_chunks() {
    // One lane of 200 003 elements and two of 70 001: chunks of LANE_CHUNK run in parallel.
    check_contiguous(&[200_003], 11, &OPS);
    check_view(
        &random(2 * 70_001, 12),
        &Layout::contiguous(&[2, 70_001]),
        1,
        &OPS,
    );
}

#[test]
fn many_short_lanes_and_tall_columns() {
    // 5 000 lanes of 3 (emitted in batches); 30 000 rows of 5 columns (row chunks in parallel);
    // 3 × 50 × 2500 (rows of 20 000 bytes in f64, pushed in groups of four).
    check_view(
        &random(15_000, 13),
        &Layout::contiguous(&[5000, 3]),
        1,
        &OPS,
    );
    check_view(
        &random(150_000, 14),
        &Layout::contiguous(&[30_000, 5]),
        0,
        &OPS,
    );
    check_view(
        &random(375_000, 15),
        &Layout::contiguous(&[3, 50, 2500]),
        1,
        &[
            ReduceOp::Sum,
            ReduceOp::Var { correction: 1 },
            ReduceOp::ArgMax,
        ],
    );
}

#[test]
fn wide_columns_push_rows_in_groups() {
    // 131 rows of 8195 columns: a tile of 8192 columns, whose rows are pushed four at a time in
    // two blocks of rows (split across threads at 2 threads) with three rows left over, then a
    // tile of 3 columns pushed row by row.
    check_view(
        &random(131 * 8195, 16),
        &Layout::contiguous(&[131, 8195]),
        0,
        &OPS,
    );
    // Ties, NaN and infinities in grouped rows of 4097 f32 (2049 f64 would group as well):
    // the extremes and their positions must stay the reference's.
    let mut vals: Vec<f64> = random(11 * 4097, 17)
        .iter()
        .map(|v| (v * 2.0).round())
        .collect();
    for (i, v) in vals.iter_mut().enumerate() {
        match i % 1009 {
            3 => *v = f64::NAN,
            40 => *v = f64::INFINITY,
            77 => *v = f64::NEG_INFINITY,
            _ => {}
        }
    }
    check_view(&vals, &Layout::contiguous(&[11, 4097]), 0, &OPS);
}

#[test]
fn strided_views() {
    // A [4, 7, 6] buffer permuted to [6, 4, 7] (lanes with stride 1, then gathered views).
    let vals = random(168, 21);
    let permuted = Layout::new(vec![6, 4, 7], vec![1, 42, 6], 0).unwrap();
    for axis in 0..3 {
        check_view(&vals, &permuted, axis, &OPS);
    }
    // Rows of 9 every 20 elements from offset 3 (columns with a row stride, strided lanes).
    let vals = random(120, 22);
    let narrowed = Layout::new(vec![5, 9], vec![20, 1], 3).unwrap();
    for axis in 0..2 {
        check_view(&vals, &narrowed, axis, &OPS);
    }
    // Broadcast rows and columns.
    let vals = random(11, 23);
    for layout in [
        Layout::new(vec![6, 11], vec![0, 1], 0).unwrap(),
        Layout::new(vec![11, 6], vec![1, 0], 0).unwrap(),
        Layout::new(vec![11, 3, 2], vec![1, 0, 0], 0).unwrap(),
    ] {
        for axis in 0..layout.rank() {
            check_view(&vals, &layout, axis, &OPS);
        }
    }
    // Views without a contiguous dim: gathered first (in parallel for the larger one).
    let vals = random(102_000, 25);
    for layout in [
        Layout::new(vec![50], vec![3], 2).unwrap(),
        Layout::new(vec![6, 5], vec![2, 13], 1).unwrap(),
        Layout::new(vec![300, 170], vec![2, 600], 0).unwrap(),
    ] {
        for axis in 0..layout.rank() {
            check_view(&vals, &layout, axis, &OPS);
        }
    }
    // A transposed matrix: columns along the output's contiguous-in-the-input dim.
    let vals = random(300 * 170, 24);
    let t = Layout::new(vec![170, 300], vec![1, 170], 0).unwrap();
    check_view(
        &vals,
        &t,
        1,
        &[ReduceOp::Sum, ReduceOp::Min, ReduceOp::ArgMax],
    );
    check_view(
        &vals,
        &t,
        0,
        &[ReduceOp::Mean, ReduceOp::Var { correction: 1 }],
    );
}

#[test]
fn nan_inf_and_ties_follow_the_reference() {
    // Values from a small set (ties everywhere), with NaN and infinities sprinkled in.
    let mut vals: Vec<f64> = random(40 * 3000, 31)
        .iter()
        .map(|v| (v * 2.0).round())
        .collect();
    for (i, v) in vals.iter_mut().enumerate() {
        match i % 997 {
            5 => *v = f64::NAN,
            17 => *v = f64::INFINITY,
            400 => *v = f64::NEG_INFINITY,
            _ => {}
        }
    }
    check_view(&vals, &Layout::contiguous(&[40, 3000]), 1, &OPS);
    check_view(&vals, &Layout::contiguous(&[40, 3000]), 0, &OPS);
    check_view(&vals, &Layout::contiguous(&[120_000]), 0, &OPS);
    check_view(
        &vals[..120],
        &Layout::new(vec![10, 12], vec![1, 10], 0).unwrap(),
        1,
        &OPS,
    );
}

#[test]
fn one_nan_anywhere_in_a_row_makes_its_extreme_nan() {
    // Row r holds a single NaN, at column r (or 7r): in turn at every lane and step of the
    // vectorised loop, in its leftover chunk and in its scalar tail, for the wide lanes (300),
    // the narrow ones (100), and lanes of a whole block and a tail (2100).
    let ops = [
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::ArgMax,
        ReduceOp::ArgMin,
    ];
    for (rows, n, step) in [(300, 300, 1), (100, 100, 1), (300, 2100, 7)] {
        let mut vals = random(rows * n, 53);
        for r in 0..rows {
            vals[r * n + r * step] = f64::NAN;
        }
        check_view(&vals, &Layout::contiguous(&[rows, n]), 1, &ops);
    }
}

#[test]
fn empty_axis_and_empty_output() {
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Var { correction: 1 },
    ];
    check_view(&[1.0], &Layout::contiguous(&[3, 0, 4]), 1, &ops);
    check_view(&[1.0], &Layout::contiguous(&[0, 5]), 1, &OPS);
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let vals = random(300_001, 41);
    let mut mem = HostMemory::default();
    let x = upload(&mut mem, DType::F32, &vals);
    let mut results = Vec::new();
    for threads in [1, 2, 3] {
        let out = mem.alloc(4).unwrap();
        let d = ReduceDesc {
            op: ReduceOp::Sum,
            dtype: DType::F32,
            input: StridedBuf::contiguous(x, &[300_001]),
            axis: 0,
            output: out,
        };
        on_threads(threads, |ctx| reduce(&mut mem, &d, ctx)).unwrap();
        results.push(mem.bytes(out, 4).unwrap().to_vec());
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
}

#[test]
fn a_lane_among_others_gives_the_bits_it_gives_alone() {
    // Five lanes reduced together, then each again as a tensor of its own (a view at its
    // offset): the same bits, however a scheduler groups, splits or orders lanes. Lengths: one
    // block (whose wide steps leave a tail), two blocks with a tail, and past a chunk (blocks
    // merged within and across chunks).
    for (len, seed) in [(257, 61), (3001, 62), (70_001, 63)] {
        let mut vals = random(5 * len, seed);
        // A NaN in the third lane only: its extreme is NaN, its neighbours' are not.
        vals[2 * len + len / 3] = f64::NAN;
        for dtype in [DType::F32, DType::F64] {
            let size = dtype.size_in_bytes();
            let mut mem = HostMemory::default();
            let x = upload(&mut mem, dtype, &vals);
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                let mut run = |layout: Layout, lanes: usize| {
                    let out = mem.alloc(lanes * size).unwrap();
                    let d = ReduceDesc {
                        op,
                        dtype,
                        input: StridedBuf { ptr: x, layout },
                        axis: 1,
                        output: out,
                    };
                    on_threads(1, |ctx| reduce(&mut mem, &d, ctx)).unwrap();
                    mem.bytes(out, lanes * size).unwrap().to_vec()
                };
                let all = run(Layout::contiguous(&[5, len]), 5);
                for r in 0..5 {
                    let one = run(Layout::new(vec![1, len], vec![len, 1], r * len).unwrap(), 1);
                    assert_eq!(
                        one,
                        all[r * size..(r + 1) * size],
                        "{} {dtype} lane {r} of 5 × {len}",
                        op.name()
                    );
                }
            }
        }
    }
}

#[test]
fn grouped_column_sums_do_not_depend_on_the_thread_count() {
    // Rows of 8195 f32: a grouped tile and a narrow one, two blocks of rows split across threads
    // at 2 and 3 threads and run in order at 1.
    let vals = random(131 * 8195, 42);
    let mut mem = HostMemory::default();
    let x = upload(&mut mem, DType::F32, &vals);
    let mut results = Vec::new();
    for threads in [1, 2, 3] {
        let out = mem.alloc(8195 * 4).unwrap();
        let d = ReduceDesc {
            op: ReduceOp::Sum,
            dtype: DType::F32,
            input: StridedBuf::contiguous(x, &[131, 8195]),
            axis: 0,
            output: out,
        };
        on_threads(threads, |ctx| reduce(&mut mem, &d, ctx)).unwrap();
        results.push(mem.bytes(out, 8195 * 4).unwrap().to_vec());
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]));
}

#[test]
#[ignore = "10⁷ elements: run in release"]
fn ten_million_f32_sum_is_accurate() {
    let n = 10_000_000;
    let vals = random(n, 51);
    check_view(
        &vals,
        &Layout::contiguous(&[n]),
        0,
        &[ReduceOp::Sum, ReduceOp::Var { correction: 1 }],
    );
}
