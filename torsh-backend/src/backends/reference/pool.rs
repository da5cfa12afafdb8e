//! Max and average 2-D pooling over NCHW and their input gradients, in f64.

use crate::compute::{Pool2dBackwardDesc, Pool2dDesc, PoolKind};
use crate::error::{BackendError, Result};

use super::conv::window_index;
use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;

/// The op named in the index errors of the max-pool gradient.
pub(crate) const MAX_BACKWARD: &str = "max_pool2d_backward";

/// Pools each window; padding never wins a max, and a NaN in a window makes its max NaN. With
/// indices, each window's position is its first largest tap, or its last NaN tap.
pub fn pool2d(mem: &mut HostMemory, d: &Pool2dDesc) -> Result<()> {
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.output_shape;
    if d.output_shape.contains(&0) {
        return Ok(());
    }
    let x = mem.load_dense(d.dtype, d.input, n * c * h * w)?;
    let mut out = Vec::with_capacity(n * c * oh * ow);
    let mut positions = Vec::with_capacity(if d.indices.is_some() {
        out.capacity()
    } else {
        0
    });
    for plane in 0..n * c {
        let xp = &x[plane * h * w..(plane + 1) * h * w];
        for y in 0..oh {
            for xo in 0..ow {
                let (mut max, mut sum, mut count) = (f64::NEG_INFINITY, 0.0f64, 0usize);
                let mut at = None;
                for r in 0..d.kernel[0] {
                    let iy = window_index(y, d.stride[0], r, 1, d.padding[0]);
                    for s in 0..d.kernel[1] {
                        let ix = window_index(xo, d.stride[1], s, 1, d.padding[1]);
                        if iy < 0 || ix < 0 || iy >= h as i128 || ix >= w as i128 {
                            continue;
                        }
                        let i = iy as usize * w + ix as usize;
                        let v = xp[i];
                        if at.is_none() || v > max || v.is_nan() {
                            at = Some(i);
                        }
                        max = if v.is_nan() || max.is_nan() {
                            f64::NAN
                        } else {
                            max.max(v)
                        };
                        sum += v;
                        count += 1;
                    }
                }
                if d.indices.is_some() {
                    // Every window holds a real tap (padding is at most half the window).
                    positions.push(at.unwrap_or(0) as i64);
                }
                out.push(match d.kind {
                    PoolKind::Max => max,
                    PoolKind::Avg {
                        count_include_pad: true,
                    } => sum / (d.kernel[0] * d.kernel[1]) as f64,
                    PoolKind::Avg {
                        count_include_pad: false,
                    } => sum / count as f64,
                });
            }
        }
    }
    mem.store(d.dtype, d.output, &out)?;
    if let Some(p) = d.indices {
        let bytes = mem.bytes_mut(p, positions.len() * 8)?;
        for (chunk, v) in bytes.chunks_exact_mut(8).zip(&positions) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
    }
    Ok(())
}

/// The divisor of an average window `(oy, ox)`: the whole window, or its taps inside the input.
pub(crate) fn divisor(
    d: &Pool2dBackwardDesc,
    count_include_pad: bool,
    oy: usize,
    ox: usize,
) -> usize {
    if count_include_pad {
        return d.kernel[0] * d.kernel[1];
    }
    let [_, _, h, w] = d.input_shape;
    let real = |o: usize, axis: usize, size: usize| {
        (0..d.kernel[axis])
            .filter(|&t| (o * d.stride[axis] + t).wrapping_sub(d.padding[axis]) < size)
            .count()
    };
    real(oy, 0, h) * real(ox, 1, w)
}

/// The `I64` indices of a max-pool gradient, after checking that each is a position inside its own
/// window (`IndexOutOfRange` for the first that is not, in row-major order).
pub(crate) fn checked_indices(mem: &HostMemory, d: &Pool2dBackwardDesc) -> Result<Vec<i64>> {
    let [n, c, oh, ow] = d.grad_shape;
    let [_, _, h, w] = d.input_shape;
    let Some(p) = d.indices else {
        return Ok(Vec::new());
    };
    let bytes = mem.bytes(p, n * c * oh * ow * 8)?;
    let index: Vec<i64> = bytes
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .collect();
    for (o, &v) in index.iter().enumerate() {
        let (oy, ox) = ((o / ow) % oh, o % ow);
        if !d.index_in_window(v, oy, ox) {
            return Err(BackendError::IndexOutOfRange {
                op: MAX_BACKWARD,
                index: v,
                size: h * w,
            });
        }
    }
    Ok(index)
}

/// Adds each output gradient to the inputs of its window (max: to the element its index names), in
/// row-major window order.
pub fn pool2d_backward(mem: &mut HostMemory, d: &Pool2dBackwardDesc) -> Result<()> {
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.grad_shape;
    let index = checked_indices(mem, d)?;
    let grad = mem.load_dense(d.dtype, d.grad, n * c * oh * ow)?;
    let mut out = vec![0.0f64; n * c * h * w];
    for plane in 0..n * c {
        let dx = &mut out[plane * h * w..(plane + 1) * h * w];
        for oy in 0..oh {
            for ox in 0..ow {
                let o = (plane * oh + oy) * ow + ox;
                match d.kind {
                    PoolKind::Max => dx[index[o] as usize] += grad[o],
                    PoolKind::Avg { count_include_pad } => {
                        let g = grad[o] / divisor(d, count_include_pad, oy, ox) as f64;
                        for r in 0..d.kernel[0] {
                            let iy = window_index(oy, d.stride[0], r, 1, d.padding[0]);
                            for s in 0..d.kernel[1] {
                                let ix = window_index(ox, d.stride[1], s, 1, d.padding[1]);
                                if iy >= 0 && ix >= 0 && iy < h as i128 && ix < w as i128 {
                                    dx[iy as usize * w + ix as usize] += g;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    mem.store(d.dtype, d.output, &out)
}

impl OpImpl<Pool2dDesc> for ReferenceBackend {
    fn op(&self, desc: &Pool2dDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("pool2d", desc.dtype)?;
        self.run(acc, |mem| pool2d(mem, desc))
    }
}

impl OpImpl<Pool2dBackwardDesc> for ReferenceBackend {
    fn op(&self, desc: &Pool2dBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("pool2d_backward", desc.dtype)?;
        self.run(acc, |mem| pool2d_backward(mem, desc))
    }
}
