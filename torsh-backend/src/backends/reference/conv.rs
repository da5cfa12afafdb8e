//! Direct 2-D convolution (cross-correlation) in seven nested loops, accumulating in f64.

use crate::compute::Conv2dDesc;
use crate::error::Result;

use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;

/// Output `[n, k, oh, ow] = bias[k] + Σ_{c, r, s} input[n, g·C/G + c, oh·sh - ph + r·dh, ow·sw - pw + s·dw]
/// · weight[k, c, r, s]`, with zero padding, where `g` is the group of `k`.
pub fn conv2d(mem: &mut HostMemory, d: &Conv2dDesc) -> Result<()> {
    let [n, c, h, w] = d.input_shape;
    let [k, cg, r, s] = d.weight_shape;
    let [_, _, oh, ow] = d.output_shape;
    if d.output_shape.contains(&0) {
        return Ok(()); // No output element: nothing to compute or write.
    }
    let x = mem.load_dense(d.dtype, d.input, n * c * h * w)?;
    let wt = mem.load_dense(d.dtype, d.weight, k * cg * r * s)?;
    let bias = match d.bias {
        Some(b) => mem.load_dense(d.dtype, b, k)?,
        None => vec![0.0; k],
    };
    let kg = k / d.groups;
    let mut out = vec![0.0f64; n * k * oh * ow];
    for ni in 0..n {
        for ki in 0..k {
            let g = ki / kg;
            for y in 0..oh {
                for xo in 0..ow {
                    let mut sum = bias[ki];
                    for ci in 0..cg {
                        let cin = g * cg + ci;
                        for ri in 0..r {
                            let iy = window_index(y, d.stride[0], ri, d.dilation[0], d.padding[0]);
                            if iy < 0 || iy >= h as i128 {
                                continue;
                            }
                            for si in 0..s {
                                let ix =
                                    window_index(xo, d.stride[1], si, d.dilation[1], d.padding[1]);
                                if ix < 0 || ix >= w as i128 {
                                    continue;
                                }
                                let xv = x[((ni * c + cin) * h + iy as usize) * w + ix as usize];
                                sum += xv * wt[((ki * cg + ci) * r + ri) * s + si];
                            }
                        }
                    }
                    out[((ni * k + ki) * oh + y) * ow + xo] = sum;
                }
            }
        }
    }
    mem.store(d.dtype, d.output, &out)
}

/// Input coordinate `out·stride + tap·dilation − padding` of a sliding window, in i128 so that no
/// combination of validated `usize` parameters can overflow.
pub(super) fn window_index(
    out: usize,
    stride: usize,
    tap: usize,
    dilation: usize,
    padding: usize,
) -> i128 {
    out as i128 * stride as i128 + tap as i128 * dilation as i128 - padding as i128
}

impl OpImpl<Conv2dDesc> for ReferenceBackend {
    fn op(&self, desc: &Conv2dDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("conv2d", desc.dtype)?;
        self.run(acc, |mem| conv2d(mem, desc))
    }
}
