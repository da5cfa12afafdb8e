//! Gathering and scattering by index tensors. Every index is read and checked before anything is
//! written.

use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;
use crate::compute::{check_index, DevicePtr, GatherDesc, ScatterDesc, ScatterReduce, StridedBuf};
use crate::dtype::{decode_int, DType};
use crate::error::Result;
use crate::shape::contiguous_strides;

use super::memory::HostMemory;

/// The values of the index view `buf` (`I32` or `I64`), in row-major order of the view.
pub(crate) fn load_indices(mem: &HostMemory, dtype: DType, buf: &StridedBuf) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    out.try_reserve_exact(buf.layout.numel()).map_err(|_| {
        crate::error::BackendError::OutOfMemory {
            requested: buf.layout.numel().saturating_mul(8),
            available: 0,
        }
    })?;
    mem.for_each_element(dtype, buf, |b| out.push(decode_int(dtype, b)))?;
    Ok(out)
}

/// Advances the row-major multi-index `coord` over `shape` by one element.
pub(crate) fn step(coord: &mut [usize], shape: &[usize]) {
    for d in (0..shape.len()).rev() {
        coord[d] += 1;
        if coord[d] < shape[d] {
            return;
        }
        coord[d] = 0;
    }
}

/// `output[i] = input[i with coordinate dim = index[i]]`, element bytes copied as they are.
pub fn gather(mem: &mut HostMemory, d: &GatherDesc) -> Result<()> {
    let op = "gather";
    let index = load_indices(mem, d.index_dtype, &d.index)?;
    let size = d.input.layout.shape()[d.dim];
    for &i in &index {
        check_index(op, i, size)?;
    }
    let esize = d.dtype.size_in_bytes();
    let (shape, strides) = (d.index.layout.shape(), d.input.layout.strides());
    let start = d.input.layout.offset();
    let span = d.input.layout.span_elements()?;
    let first = DevicePtr(d.input.ptr.0 + (start * esize) as u64);
    let input = mem.bytes(first, (span - start) * esize)?;
    let mut out = Vec::with_capacity(index.len() * esize);
    let mut coord = vec![0usize; shape.len()];
    for &i in &index {
        let at: usize = coord
            .iter()
            .zip(strides)
            .enumerate()
            .map(|(k, (&c, &s))| if k == d.dim { i as usize * s } else { c * s })
            .sum();
        out.extend_from_slice(&input[at * esize..(at + 1) * esize]);
        step(&mut coord, shape);
    }
    mem.bytes_mut(d.output, out.len())?.copy_from_slice(&out);
    Ok(())
}

/// The output element each index position lands on, in the index's row-major order.
fn scatter_targets(d: &ScatterDesc, index: &[i64]) -> Vec<usize> {
    let strides = contiguous_strides(&d.output_shape);
    let shape = d.index.layout.shape();
    let mut coord = vec![0usize; shape.len()];
    index
        .iter()
        .map(|&i| {
            let at = coord
                .iter()
                .zip(&strides)
                .enumerate()
                .map(|(k, (&c, &s))| if k == d.dim { i as usize * s } else { c * s })
                .sum();
            step(&mut coord, shape);
            at
        })
        .collect()
}

/// `output[target(i)] = src[i]` (assign: element bytes copied, the last position wins) or
/// `+= alpha · src[i]` (add: in f64, in index order, rounded once).
pub fn scatter(mem: &mut HostMemory, d: &ScatterDesc) -> Result<()> {
    let op = "scatter";
    let index = load_indices(mem, d.index_dtype, &d.index)?;
    let size = d.output_shape[d.dim];
    for &i in &index {
        check_index(op, i, size)?;
    }
    let targets = scatter_targets(d, &index);
    let n: usize = d.output_shape.iter().product();
    match d.reduce {
        ScatterReduce::Assign => {
            let esize = d.dtype.size_in_bytes();
            let mut src = Vec::with_capacity(index.len() * esize);
            mem.for_each_element(d.dtype, &d.src, |b| src.extend_from_slice(b))?;
            let out = mem.bytes_mut(d.output, n * esize)?;
            for (k, &t) in targets.iter().enumerate() {
                out[t * esize..(t + 1) * esize].copy_from_slice(&src[k * esize..(k + 1) * esize]);
            }
            Ok(())
        }
        ScatterReduce::Add => {
            let src = mem.load(d.dtype, &d.src)?;
            let mut out = mem.load_dense(d.dtype, d.output, n)?;
            for (&t, v) in targets.iter().zip(src) {
                out[t] += d.alpha * v;
            }
            mem.store(d.dtype, d.output, &out)
        }
    }
}

impl OpImpl<ScatterDesc> for ReferenceBackend {
    fn op(&self, desc: &ScatterDesc) -> Result<()> {
        let acc = desc.accesses()?;
        if desc.reduce == ScatterReduce::Add {
            self.float_only("scatter", desc.dtype)?;
        }
        self.run(acc, |mem| scatter(mem, desc))
    }
}

impl OpImpl<GatherDesc> for ReferenceBackend {
    fn op(&self, desc: &GatherDesc) -> Result<()> {
        self.run(desc.accesses()?, |mem| gather(mem, desc))
    }
}
