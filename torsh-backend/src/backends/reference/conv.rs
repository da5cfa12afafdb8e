//! Direct 2-D convolution (cross-correlation) and its input and weight gradients, in nested loops
//! over every (output position, tap) pair, accumulating in f64.

use crate::compute::{Conv2dBackwardInputDesc, Conv2dBackwardWeightDesc, Conv2dDesc};
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

/// The sizes and window of a convolution, for walking its (output position, tap) pairs.
struct Window {
    input: [usize; 4],
    weight: [usize; 4],
    output: [usize; 4],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
}

impl Window {
    /// Calls `f(input index, weight index, output index)` for every pair of an output position and
    /// a tap that lands inside the input, in the forward's order (image, output channel, output
    /// position, input channel, tap).
    fn for_each_tap(&self, mut f: impl FnMut(usize, usize, usize)) {
        let [n, c, h, w] = self.input;
        let [k, cg, r, s] = self.weight;
        let [_, _, oh, ow] = self.output;
        let kg = k / self.groups;
        for ni in 0..n {
            for ki in 0..k {
                let g = ki / kg;
                for y in 0..oh {
                    for xo in 0..ow {
                        let out = ((ni * k + ki) * oh + y) * ow + xo;
                        for ci in 0..cg {
                            let cin = g * cg + ci;
                            for ri in 0..r {
                                let iy = window_index(
                                    y,
                                    self.stride[0],
                                    ri,
                                    self.dilation[0],
                                    self.padding[0],
                                );
                                if iy < 0 || iy >= h as i128 {
                                    continue;
                                }
                                for si in 0..s {
                                    let ix = window_index(
                                        xo,
                                        self.stride[1],
                                        si,
                                        self.dilation[1],
                                        self.padding[1],
                                    );
                                    if ix < 0 || ix >= w as i128 {
                                        continue;
                                    }
                                    let input =
                                        ((ni * c + cin) * h + iy as usize) * w + ix as usize;
                                    f(input, ((ki * cg + ci) * r + ri) * s + si, out);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `grad_input = bias + Σ grad_output · weight` over every (output position, tap) pair that reads
/// each input element.
pub fn conv2d_backward_input(mem: &mut HostMemory, d: &Conv2dBackwardInputDesc) -> Result<()> {
    let [n, c, h, w] = d.grad_input_shape;
    if n * c * h * w == 0 {
        return Ok(()); // No element to write.
    }
    let dy = mem.load_dense(d.dtype, d.grad_output, d.grad_output_shape.iter().product())?;
    let wt = mem.load_dense(d.dtype, d.weight, d.weight_shape.iter().product())?;
    let bias = match d.bias {
        Some(b) => mem.load_dense(d.dtype, b, c)?,
        None => vec![0.0; c],
    };
    let mut dx: Vec<f64> = (0..n * c * h * w).map(|i| bias[i / (h * w) % c]).collect();
    let window = Window {
        input: d.grad_input_shape,
        weight: d.weight_shape,
        output: d.grad_output_shape,
        stride: d.stride,
        padding: d.padding,
        dilation: d.dilation,
        groups: d.groups,
    };
    window.for_each_tap(|x, wi, y| dx[x] += dy[y] * wt[wi]);
    mem.store(d.dtype, d.grad_input, &dx)
}

/// `grad_weight = Σ grad_output · input` over every (output position, tap) pair of each weight.
pub fn conv2d_backward_weight(mem: &mut HostMemory, d: &Conv2dBackwardWeightDesc) -> Result<()> {
    let len: usize = d.weight_shape.iter().product();
    if len == 0 {
        return Ok(()); // No element to write.
    }
    let x = mem.load_dense(d.dtype, d.input, d.input_shape.iter().product())?;
    let dy = mem.load_dense(d.dtype, d.grad_output, d.grad_output_shape.iter().product())?;
    let mut dw = vec![0.0f64; len];
    let window = Window {
        input: d.input_shape,
        weight: d.weight_shape,
        output: d.grad_output_shape,
        stride: d.stride,
        padding: d.padding,
        dilation: d.dilation,
        groups: d.groups,
    };
    window.for_each_tap(|xi, wi, y| dw[wi] += dy[y] * x[xi]);
    mem.store(d.dtype, d.grad_weight, &dw)
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

impl OpImpl<Conv2dBackwardInputDesc> for ReferenceBackend {
    fn op(&self, desc: &Conv2dBackwardInputDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("conv2d_backward_input", desc.dtype)?;
        self.run(acc, |mem| conv2d_backward_input(mem, desc))
    }
}

impl OpImpl<Conv2dBackwardWeightDesc> for ReferenceBackend {
    fn op(&self, desc: &Conv2dBackwardWeightDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("conv2d_backward_weight", desc.dtype)?;
        self.run(acc, |mem| conv2d_backward_weight(mem, desc))
    }
}
