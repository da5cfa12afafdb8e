//! Host side of the reduce kernels (`kernels/reduce.cu`), and the "group per row" launch plan that the
//! norm kernels share.
//!
//! The input is seen as `[n_out, len]`: output element `j` (the contiguous output's index, row-major
//! over the input's dims other than the axis) starts at element `j` of the input view without the axis,
//! and its lane steps by the axis stride. A group of 1, 32 or 256 threads reduces one lane.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::launch::{check_aligned, suffix, to_i64, StridedArg, BLOCK, MAX_GRID_X};
use super::Gpu;
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::{ReduceDesc, ReduceOp};
use crate::error::{BackendError, Result};
use crate::shape::{checked_numel, coalesce, Layout};

/// Longest row a single thread reduces on its own, whatever the layout.
const SERIAL_MAX: usize = 32;

/// Longest row a single thread reduces when that makes neighbouring threads read neighbouring elements.
const SERIAL_STRIDED_MAX: usize = 256;

/// Shortest row that always gets a whole block.
const BLOCK_ROW_MIN: usize = 4096;

/// Threads that a group of one thread per row must supply, per SM, before it is preferred.
const THREADS_PER_SM: usize = 2048;

/// Blocks per SM at most in a grid-stride launch.
const BLOCKS_PER_SM: usize = 32;

/// How many threads reduce one row of `len` elements when there are `rows` rows: 1, 32 (a warp) or
/// 256 (the whole block). `unit_stride` says a row's elements are adjacent in memory (so a warp reading
/// one row is coalesced); otherwise adjacent rows are assumed adjacent, which favours one thread per
/// row. Short rows get one thread (few serial additions), long rows or too few rows to fill the device
/// with warps get a block, the rest a warp. The serial part of each thread is at most `len / group`
/// additions before the tree, which bounds the rounding error.
pub(super) fn group_size(len: usize, rows: usize, unit_stride: bool, sm_count: i32) -> u32 {
    let sms = sm_count.max(1) as usize;
    let warps_per_block = (BLOCK / 32) as usize;
    if len <= SERIAL_MAX
        || (!unit_stride && len <= SERIAL_STRIDED_MAX && rows >= sms * THREADS_PER_SM)
    {
        1
    } else if len >= BLOCK_ROW_MIN
        || (len > SERIAL_STRIDED_MAX && rows.div_ceil(warps_per_block) < sms)
    {
        BLOCK
    } else {
        32
    }
}

/// A launch of `BLOCK`-thread blocks covering `rows` rows with `group` threads each (a divisor of
/// `BLOCK`): enough blocks for every row, at most `BLOCKS_PER_SM` per SM (the kernels loop) and never
/// past [`MAX_GRID_X`], at least one.
pub(super) fn group_launch(rows: usize, group: u32, sm_count: i32) -> LaunchConfig {
    let per_block = (BLOCK / group.clamp(1, BLOCK)) as usize;
    let cap = (sm_count.max(1) as usize * BLOCKS_PER_SM).min(MAX_GRID_X);
    let blocks = rows.div_ceil(per_block).clamp(1, cap);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `layout` without dim `axis`, with that dim's length and stride. `InvalidArgument` for an axis out
/// of range.
fn split_axis(layout: &Layout, axis: usize) -> Result<(Layout, usize, usize)> {
    let (shape, strides) = (layout.shape(), layout.strides());
    if axis >= shape.len() {
        return Err(BackendError::invalid(
            "reduce",
            format!("axis {axis} out of range for shape {shape:?}"),
        ));
    }
    let without = |v: &[usize]| {
        let mut v = v.to_vec();
        v.remove(axis);
        v
    };
    let rest = Layout::new(without(shape), without(strides), layout.offset())?;
    Ok((rest, shape[axis], strides[axis]))
}

/// `rest` with its unit dims dropped and the dims that are contiguous with each other merged: the same
/// element offset for every output index, in as few dims as the view allows, so that an input of any
/// rank whose other dims merge to at most `MAX_RANK` reaches the kernel (a contiguous one merges to one
/// dim) and the kernel's index divisions are fewer.
fn coalesced(op: &'static str, rest: &Layout) -> Result<Layout> {
    let (shape, [strides]) = coalesce(op, [rest])?;
    Layout::new(shape, strides, rest.offset())
}

/// The kernel's op code (the `RED_*` defines in `reduce.cu`, [`ReduceOp::code`]) and the variance
/// correction.
fn op_code(op: ReduceOp) -> (i32, i64) {
    let correction = match op {
        ReduceOp::Var { correction } => i64::from(correction),
        _ => 0,
    };
    (op.code() as i32, correction)
}

/// Reduces `d.input` along `d.axis` into the contiguous output (`i64` indices for the arg reductions).
/// Every output element is written, also over an empty axis (sum 0, mean and var NaN; the descriptor
/// rejects max, min and the arg reductions there).
pub(crate) fn reduce(gpu: &Gpu, d: &ReduceDesc) -> Result<()> {
    let op = "reduce";
    let n_out = checked_numel(op, &d.output_shape())?;
    if n_out == 0 {
        return Ok(());
    }
    check_aligned(op, d.dtype, &[d.input.ptr])?;
    check_aligned(op, d.op.output_dtype(d.dtype), &[d.output])?;
    let (rest, len, axis_stride) = split_axis(&d.input.layout, d.axis)?;
    let group = group_size(len, n_out, axis_stride == 1, gpu.sm_count());
    let f = gpu.function_for(
        "reduce",
        d.dtype,
        &format!("reduce_g{group}_{}", suffix(d.dtype)),
    )?;
    let rest = StridedArg::new(op, &coalesced(op, &rest)?)?;
    let (x, out) = (d.input.ptr.0, d.output.0);
    let (axis_stride, len, n) = (
        to_i64(op, axis_stride)?,
        to_i64(op, len)?,
        to_i64(op, n_out)?,
    );
    let (code, correction) = op_code(d.op);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&x).arg(&out).arg(&rest).arg(&axis_stride);
    b.arg(&len).arg(&n).arg(&code).arg(&correction);
    // SAFETY: the caller checked every region the kernel touches (the input view and the `n_out`-element
    // output of the op's output dtype); the arguments match `reduce_g<G>_<dtype>`'s parameters.
    unsafe { b.launch(group_launch(n_out, group, gpu.sm_count())) }
        .map_err(|e| super::driver_error(op, e))?;
    Ok(())
}

impl OpImpl<ReduceDesc> for CudaBackend {
    fn op(&self, desc: &ReduceDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("reduce", desc.dtype)?;
        self.run(acc, |gpu| reduce(gpu, desc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels' `strided_offset`, over the full (unfiltered) layout.
    fn strided_offset(l: &Layout, mut linear: usize) -> usize {
        let mut off = l.offset();
        for (&extent, &stride) in l.shape().iter().zip(l.strides()).rev() {
            off += (linear % extent) * stride;
            linear /= extent;
        }
        off
    }

    #[test]
    fn lanes_cover_the_view_in_the_references_order() {
        let base = Layout::new(vec![3, 4, 5], vec![40, 1, 4], 7).unwrap();
        for l in [
            base.clone(),
            base.transpose(0, 2).unwrap(),
            Layout::contiguous(&[2, 1, 6]),
            Layout::contiguous(&[5]),
        ] {
            let shape = l.shape().to_vec();
            for axis in 0..shape.len() {
                let (rest, len, stride) = split_axis(&l, axis).unwrap();
                let outer: usize = shape[..axis].iter().product();
                let inner: usize = shape[axis + 1..].iter().product();
                assert_eq!(len, shape[axis]);
                for o in 0..outer {
                    for i in 0..inner {
                        let j = o * inner + i;
                        for a in 0..len {
                            let logical = (o * len + a) * inner + i;
                            assert_eq!(
                                strided_offset(&rest, j) + a * stride,
                                strided_offset(&l, logical),
                                "{l:?} axis {axis}"
                            );
                        }
                    }
                }
            }
        }
        assert!(split_axis(&base, 3).is_err());
    }

    #[test]
    fn coalescing_keeps_every_lane_start() {
        let views = [
            Layout::new(vec![3, 4, 5, 2], vec![40, 10, 2, 1], 7).unwrap(),
            Layout::contiguous(&[2, 3, 1, 4, 5])
                .permute(&[3, 0, 2, 4, 1])
                .unwrap(),
            Layout::new(vec![4, 3, 2], vec![0, 2, 1], 5).unwrap(),
            Layout::contiguous(&[2; 12]),
        ];
        for l in &views {
            for axis in 0..l.shape().len() {
                let (rest, _, _) = split_axis(l, axis).unwrap();
                let merged = coalesced("t", &rest).unwrap();
                assert!(merged.shape().len() <= rest.shape().len());
                for j in 0..rest.numel() {
                    assert_eq!(
                        strided_offset(&merged, j),
                        strided_offset(&rest, j),
                        "{l:?} axis {axis}"
                    );
                }
            }
        }
    }

    #[test]
    fn views_of_any_rank_that_merge_reach_the_kernel() {
        // Contiguous, rank 12: the other dims merge into one, whatever the axis.
        let deep = Layout::contiguous(&[2; 12]);
        for axis in [0, 5, 11] {
            let (rest, _, _) = split_axis(&deep, axis).unwrap();
            assert!(StridedArg::new("t", &rest).is_err());
            let merged = coalesced("t", &rest).unwrap();
            assert!(merged.shape().len() <= 2, "{merged:?}");
            assert!(StridedArg::new("t", &merged).is_ok());
        }
        // Ten dims in reverse order merge nowhere: past the kernels' rank, unavailable.
        let reversed = Layout::contiguous(&[2; 10])
            .permute(&[9, 8, 7, 6, 5, 4, 3, 2, 1, 0])
            .unwrap();
        let (rest, _, _) = split_axis(&reversed, 0).unwrap();
        assert!(matches!(
            StridedArg::new("t", &coalesced("t", &rest).unwrap()),
            Err(BackendError::FeatureUnavailable { .. })
        ));
    }

    #[test]
    fn short_rows_get_a_thread_long_rows_a_block() {
        assert_eq!(group_size(0, 10, true, 132), 1);
        assert_eq!(group_size(32, 1, true, 132), 1);
        assert_eq!(group_size(100, 1 << 20, false, 132), 1);
        assert_eq!(group_size(100, 1 << 20, true, 132), 32);
        assert_eq!(group_size(1000, 10_000, true, 132), 32);
        assert_eq!(group_size(1000, 10, true, 132), BLOCK);
        assert_eq!(group_size(100, 10, true, 132), 32);
        assert_eq!(group_size(4096, 1 << 20, true, 132), BLOCK);
        assert_eq!(group_size(1 << 30, 1, false, 0), BLOCK);
    }

    #[test]
    fn launches_cover_every_row_with_bounded_grids() {
        let g = group_launch(1, 1, 132);
        assert_eq!((g.grid_dim, g.block_dim), ((1, 1, 1), (BLOCK, 1, 1)));
        assert_eq!(group_launch(257, 1, 132).grid_dim.0, 2);
        assert_eq!(group_launch(9, 32, 132).grid_dim.0, 2);
        assert_eq!(group_launch(3, BLOCK, 132).grid_dim.0, 3);
        assert_eq!(group_launch(1 << 40, BLOCK, 132).grid_dim.0, 132 * 32);
        assert_eq!(group_launch(0, 32, 0).grid_dim.0, 1);
        for sms in [i32::MIN, 0, 132, i32::MAX] {
            for rows in [0, 1, 1 << 31, usize::MAX] {
                for group in [1, 32, BLOCK] {
                    let g = group_launch(rows, group, sms);
                    assert!((1..=MAX_GRID_X as u32).contains(&g.grid_dim.0));
                    assert_eq!((g.grid_dim.1, g.grid_dim.2), (1, 1));
                }
            }
        }
    }

    #[test]
    fn op_codes_match_the_kernel_defines() {
        let src = include_str!("kernels/reduce.cu");
        let defines = src
            .lines()
            .filter(|l| l.starts_with("#define RED_"))
            .count();
        assert_eq!(defines, ReduceOp::ALL.len(), "RED_* defines in reduce.cu");
        for &op in ReduceOp::ALL {
            let line = format!("#define RED_{} {}\n", op.name().to_uppercase(), op.code());
            assert!(src.contains(&line), "reduce.cu lacks `{}`", line.trim());
        }
        assert_eq!(op_code(ReduceOp::Var { correction: 3 }), (4, 3));
    }
}
