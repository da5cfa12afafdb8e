//! Max and average 2-D pooling over NCHW, in f64.

use crate::compute::{Pool2dDesc, PoolKind};
use crate::error::Result;

use super::conv::window_index;
use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;

/// Pools each window; padding never wins a max, and a NaN in a window makes its max NaN.
pub fn pool2d(mem: &mut HostMemory, d: &Pool2dDesc) -> Result<()> {
    let [n, c, h, w] = d.input_shape;
    let [_, _, oh, ow] = d.output_shape;
    if d.output_shape.contains(&0) {
        return Ok(());
    }
    let x = mem.load_dense(d.dtype, d.input, n * c * h * w)?;
    let mut out = Vec::with_capacity(n * c * oh * ow);
    for plane in 0..n * c {
        let xp = &x[plane * h * w..(plane + 1) * h * w];
        for y in 0..oh {
            for xo in 0..ow {
                let (mut max, mut sum, mut count) = (f64::NEG_INFINITY, 0.0f64, 0usize);
                for r in 0..d.kernel[0] {
                    let iy = window_index(y, d.stride[0], r, 1, d.padding[0]);
                    for s in 0..d.kernel[1] {
                        let ix = window_index(xo, d.stride[1], s, 1, d.padding[1]);
                        if iy < 0 || ix < 0 || iy >= h as i128 || ix >= w as i128 {
                            continue;
                        }
                        let v = xp[iy as usize * w + ix as usize];
                        max = if v.is_nan() || max.is_nan() {
                            f64::NAN
                        } else {
                            max.max(v)
                        };
                        sum += v;
                        count += 1;
                    }
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
    mem.store(d.dtype, d.output, &out)
}

impl OpImpl<Pool2dDesc> for ReferenceBackend {
    fn op(&self, desc: &Pool2dDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("pool2d", desc.dtype)?;
        self.run(acc, |mem| pool2d(mem, desc))
    }
}
