//! Softmax, layer norm and batch norm and the norms' gradients, in f64.

use crate::compute::{
    stats_dtype, BatchNormBackwardDesc, BatchNormDesc, DevicePtr, LayerNormBackwardDesc,
    LayerNormDesc, SoftmaxBackwardDesc, SoftmaxDesc,
};
use crate::error::Result;

use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;

/// Softmax or log-softmax of `[outer, axis_len, inner]` along the middle dim, max-subtracted.
pub fn softmax(mem: &mut HostMemory, d: &SoftmaxDesc) -> Result<()> {
    let (outer, len, inner) = (d.outer, d.axis_len, d.inner);
    let x = mem.load_dense(d.dtype, d.input, outer * len * inner)?;
    let mut out = vec![0.0f64; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let idx = |a: usize| (o * len + a) * inner + i;
            let max = (0..len)
                .map(|a| x[idx(a)])
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = (0..len).map(|a| (x[idx(a)] - max).exp()).sum();
            for a in 0..len {
                out[idx(a)] = if d.log {
                    x[idx(a)] - max - sum.ln()
                } else {
                    (x[idx(a)] - max).exp() / sum
                };
            }
        }
    }
    mem.store(d.dtype, d.output, &out)
}

/// The input gradient of softmax or log-softmax of `[outer, axis_len, inner]` along the middle dim.
pub fn softmax_backward(mem: &mut HostMemory, d: &SoftmaxBackwardDesc) -> Result<()> {
    let (outer, len, inner) = (d.outer, d.axis_len, d.inner);
    let g = mem.load_dense(d.dtype, d.grad_output, outer * len * inner)?;
    let y = mem.load_dense(d.dtype, d.output, outer * len * inner)?;
    let mut out = vec![0.0f64; g.len()];
    for o in 0..outer {
        for i in 0..inner {
            let idx = |a: usize| (o * len + a) * inner + i;
            let sum: f64 = if d.log {
                (0..len).map(|a| g[idx(a)]).sum()
            } else {
                (0..len).map(|a| g[idx(a)] * y[idx(a)]).sum()
            };
            for a in 0..len {
                let k = idx(a);
                out[k] = if d.log {
                    g[k] - y[k].exp() * sum
                } else {
                    y[k] * (g[k] - sum)
                };
            }
        }
    }
    mem.store(d.dtype, d.grad_input, &out)
}

/// The moments of some values, taken relative to a pivot (the first value): a constant row has
/// deviations of exactly 0, where a rounded mean would leave `(x − mean) / √eps`.
struct Moments {
    /// The first value.
    pivot: f64,
    /// The mean minus the pivot.
    mean: f64,
    /// The biased variance.
    var: f64,
    /// How many values.
    count: usize,
}

impl Moments {
    fn of(xs: impl Iterator<Item = f64> + Clone) -> Moments {
        let count = xs.clone().count();
        let pivot = xs.clone().next().unwrap_or(0.0);
        let mean = xs.clone().map(|x| x - pivot).sum::<f64>() / count as f64;
        let var = xs
            .map(|x| (x - pivot - mean) * (x - pivot - mean))
            .sum::<f64>()
            / count as f64;
        Moments {
            pivot,
            mean,
            var,
            count,
        }
    }

    /// `x`'s deviation from the mean.
    fn deviation(&self, x: f64) -> f64 {
        (x - self.pivot) - self.mean
    }
}

/// Layer norm over each row of `[rows, cols]`.
pub fn layer_norm(mem: &mut HostMemory, d: &LayerNormDesc) -> Result<()> {
    let x = mem.load_dense(d.dtype, d.input, d.rows * d.cols)?;
    let w = d
        .weight
        .map(|p| mem.load_dense(d.dtype, p, d.cols))
        .transpose()?;
    let b = d
        .bias
        .map(|p| mem.load_dense(d.dtype, p, d.cols))
        .transpose()?;
    let mut out = vec![0.0f64; x.len()];
    let (mut means, mut invs) = (vec![0.0; d.rows], vec![0.0; d.rows]);
    for r in 0..d.rows {
        let row = &x[r * d.cols..(r + 1) * d.cols];
        let m = Moments::of(row.iter().copied());
        let inv = 1.0 / (m.var + d.eps).sqrt();
        (means[r], invs[r]) = (m.pivot + m.mean, inv);
        for c in 0..d.cols {
            let scale = w.as_ref().map_or(1.0, |w| w[c]);
            let shift = b.as_ref().map_or(0.0, |b| b[c]);
            out[r * d.cols + c] = m.deviation(row[c]) * inv * scale + shift;
        }
    }
    mem.store(d.dtype, d.output, &out)?;
    store_saved(mem, d.dtype, d.saved_mean, d.saved_invstd, &means, &invs)
}

/// Writes a forward's saved statistics, where asked for.
fn store_saved(
    mem: &mut HostMemory,
    dtype: crate::dtype::DType,
    mean: Option<DevicePtr>,
    invstd: Option<DevicePtr>,
    means: &[f64],
    invs: &[f64],
) -> Result<()> {
    if let (Some(m), Some(i)) = (mean, invstd) {
        mem.store(stats_dtype(dtype), m, means)?;
        mem.store(stats_dtype(dtype), i, invs)?;
    }
    Ok(())
}

/// Batch norm of `[batch, channels, spatial]` per channel, updating running statistics in training.
pub fn batch_norm(mem: &mut HostMemory, d: &BatchNormDesc) -> Result<()> {
    let (n, c, s) = (d.batch, d.channels, d.spatial);
    let x = mem.load_dense(d.dtype, d.input, n * c * s)?;
    let load = |mem: &HostMemory, p: Option<crate::compute::DevicePtr>| {
        p.map(|p| mem.load_dense(d.dtype, p, c)).transpose()
    };
    let w = load(mem, d.weight)?;
    let b = load(mem, d.bias)?;
    let mut rm = load(mem, d.running_mean)?;
    let mut rv = load(mem, d.running_var)?;
    let mut out = vec![0.0f64; x.len()];
    let (mut means, mut invs) = (vec![0.0; c], vec![0.0; c]);
    for ch in 0..c {
        let values = (0..n).flat_map(|ni| (0..s).map(move |si| (ni * c + ch) * s + si));
        let m = if d.training {
            let m = Moments::of(values.clone().map(|i| x[i]));
            if let (Some(rm), Some(rv)) = (rm.as_mut(), rv.as_mut()) {
                let unbiased = m.var * m.count as f64 / (m.count as f64 - 1.0);
                rm[ch] = (1.0 - d.momentum) * rm[ch] + d.momentum * (m.pivot + m.mean);
                rv[ch] = (1.0 - d.momentum) * rv[ch] + d.momentum * unbiased;
            }
            m
        } else {
            let (mean, var) = match (rm.as_ref(), rv.as_ref()) {
                (Some(rm), Some(rv)) => (rm[ch], rv[ch]),
                _ => (0.0, 1.0),
            };
            Moments {
                pivot: 0.0,
                mean,
                var,
                count: n * s,
            }
        };
        let inv = 1.0 / (m.var + d.eps).sqrt();
        (means[ch], invs[ch]) = (m.pivot + m.mean, inv);
        let scale = w.as_ref().map_or(1.0, |w| w[ch]);
        let shift = b.as_ref().map_or(0.0, |b| b[ch]);
        for i in values {
            out[i] = m.deviation(x[i]) * inv * scale + shift;
        }
    }
    mem.store(d.dtype, d.output, &out)?;
    store_saved(mem, d.dtype, d.saved_mean, d.saved_invstd, &means, &invs)?;
    if d.training {
        if let (Some(p), Some(v)) = (d.running_mean, rm) {
            mem.store(d.dtype, p, &v)?;
        }
        if let (Some(p), Some(v)) = (d.running_var, rv) {
            mem.store(d.dtype, p, &v)?;
        }
    }
    Ok(())
}

/// The gradients of layer norm over each row of `[rows, cols]`.
pub fn layer_norm_backward(mem: &mut HostMemory, d: &LayerNormBackwardDesc) -> Result<()> {
    let (rows, cols) = (d.rows, d.cols);
    let dy = mem.load_dense(d.dtype, d.grad_output, rows * cols)?;
    let x = mem.load_dense(d.dtype, d.input, rows * cols)?;
    let w = d
        .weight
        .map(|p| mem.load_dense(d.dtype, p, cols))
        .transpose()?;
    let mean = mem.load_dense(stats_dtype(d.dtype), d.mean, rows)?;
    let inv = mem.load_dense(stats_dtype(d.dtype), d.invstd, rows)?;
    let mut dx = vec![0.0f64; rows * cols];
    let (mut dw, mut db) = (vec![0.0f64; cols], vec![0.0f64; cols]);
    for r in 0..rows {
        let at = |c: usize| r * cols + c;
        let xhat = |c: usize| (x[at(c)] - mean[r]) * inv[r];
        let g = |c: usize| dy[at(c)] * w.as_ref().map_or(1.0, |w| w[c]);
        let mean_g = (0..cols).map(g).sum::<f64>() / cols as f64;
        let mean_gx = (0..cols).map(|c| g(c) * xhat(c)).sum::<f64>() / cols as f64;
        for c in 0..cols {
            dx[at(c)] = inv[r] * (g(c) - mean_g - xhat(c) * mean_gx);
            dw[c] += dy[at(c)] * xhat(c);
            db[c] += dy[at(c)];
        }
    }
    store_grads(
        mem,
        d.dtype,
        [d.grad_input, d.grad_weight, d.grad_bias],
        [&dx, &dw, &db],
    )
}

/// Writes each gradient whose pointer is given.
fn store_grads(
    mem: &mut HostMemory,
    dtype: crate::dtype::DType,
    ptrs: [Option<DevicePtr>; 3],
    values: [&[f64]; 3],
) -> Result<()> {
    for (p, v) in ptrs.into_iter().zip(values) {
        if let Some(p) = p {
            mem.store(dtype, p, v)?;
        }
    }
    Ok(())
}

/// The gradients of batch norm of `[batch, channels, spatial]` per channel.
pub fn batch_norm_backward(mem: &mut HostMemory, d: &BatchNormBackwardDesc) -> Result<()> {
    let (n, c, s) = (d.batch, d.channels, d.spatial);
    let dy = mem.load_dense(d.dtype, d.grad_output, n * c * s)?;
    let x = mem.load_dense(d.dtype, d.input, n * c * s)?;
    let w = d
        .weight
        .map(|p| mem.load_dense(d.dtype, p, c))
        .transpose()?;
    let mean = mem.load_dense(stats_dtype(d.dtype), d.mean, c)?;
    let inv = mem.load_dense(stats_dtype(d.dtype), d.invstd, c)?;
    let mut dx = vec![0.0f64; n * c * s];
    let (mut dw, mut db) = (vec![0.0f64; c], vec![0.0f64; c]);
    let count = (n * s) as f64;
    for ch in 0..c {
        let values = || (0..n).flat_map(move |ni| (0..s).map(move |si| (ni * c + ch) * s + si));
        let xhat = |i: usize| (x[i] - mean[ch]) * inv[ch];
        db[ch] = values().map(|i| dy[i]).sum();
        dw[ch] = values().map(|i| dy[i] * xhat(i)).sum();
        let scale = w.as_ref().map_or(1.0, |w| w[ch]) * inv[ch];
        for i in values() {
            dx[i] = if d.training {
                scale * (dy[i] - db[ch] / count - xhat(i) * dw[ch] / count)
            } else {
                scale * dy[i]
            };
        }
    }
    store_grads(
        mem,
        d.dtype,
        [d.grad_input, d.grad_weight, d.grad_bias],
        [&dx, &dw, &db],
    )
}

impl OpImpl<LayerNormBackwardDesc> for ReferenceBackend {
    fn op(&self, desc: &LayerNormBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("layer_norm_backward", desc.dtype)?;
        self.run(acc, |mem| layer_norm_backward(mem, desc))
    }
}

impl OpImpl<BatchNormBackwardDesc> for ReferenceBackend {
    fn op(&self, desc: &BatchNormBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("batch_norm_backward", desc.dtype)?;
        self.run(acc, |mem| batch_norm_backward(mem, desc))
    }
}

impl OpImpl<SoftmaxDesc> for ReferenceBackend {
    fn op(&self, desc: &SoftmaxDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("softmax", desc.dtype)?;
        self.run(acc, |mem| softmax(mem, desc))
    }
}

impl OpImpl<SoftmaxBackwardDesc> for ReferenceBackend {
    fn op(&self, desc: &SoftmaxBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only(desc.name(), desc.dtype)?;
        self.run(acc, |mem| softmax_backward(mem, desc))
    }
}

impl OpImpl<LayerNormDesc> for ReferenceBackend {
    fn op(&self, desc: &LayerNormDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("layer_norm", desc.dtype)?;
        self.run(acc, |mem| layer_norm(mem, desc))
    }
}

impl OpImpl<BatchNormDesc> for ReferenceBackend {
    fn op(&self, desc: &BatchNormDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("batch_norm", desc.dtype)?;
        self.run(acc, |mem| batch_norm(mem, desc))
    }
}
