//! Inclusive scans along one dim: floats accumulated in f64 in order and rounded once per output;
//! integers as i64 with wrapping arithmetic, wrapped into the dtype on store (which equals wrapping
//! in the dtype all along).

use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;
use crate::compute::{ScanDesc, ScanOp};
use crate::dtype::{decode_int, encode_int};
use crate::error::Result;

use super::memory::HostMemory;

/// Scans `values` (row-major, the descriptor's shape) along the dim in place with `f`.
fn scan_values<T: Copy>(
    values: &mut [T],
    (outer, len, inner): (usize, usize, usize),
    f: impl Fn(T, T) -> T,
) {
    for o in 0..outer {
        for i in 1..len {
            for j in 0..inner {
                let at = (o * len + i) * inner + j;
                values[at] = f(values[at - inner], values[at]);
            }
        }
    }
}

/// `output[.., i, ..] = input[.., 0, ..] ∘ … ∘ input[.., i, ..]`.
pub fn scan(mem: &mut HostMemory, d: &ScanDesc) -> Result<()> {
    let geometry = d.geometry();
    if d.dtype.is_float() {
        let mut v = mem.load(d.dtype, &d.input)?;
        match d.op {
            ScanOp::Sum => scan_values(&mut v, geometry, |a, b| a + b),
            ScanOp::Prod => scan_values(&mut v, geometry, |a, b| a * b),
        }
        return mem.store(d.dtype, d.output, &v);
    }
    let mut v = Vec::with_capacity(d.input.layout.numel());
    mem.for_each_element(d.dtype, &d.input, |b| v.push(decode_int(d.dtype, b)))?;
    match d.op {
        ScanOp::Sum => scan_values(&mut v, geometry, i64::wrapping_add),
        ScanOp::Prod => scan_values(&mut v, geometry, i64::wrapping_mul),
    }
    let size = d.dtype.size_in_bytes();
    let out = mem.bytes_mut(d.output, v.len() * size)?;
    for (chunk, &x) in out.chunks_exact_mut(size).zip(&v) {
        encode_int(d.dtype, x, chunk);
    }
    Ok(())
}

impl OpImpl<ScanDesc> for ReferenceBackend {
    fn op(&self, desc: &ScanDesc) -> Result<()> {
        self.run(desc.accesses()?, |mem| scan(mem, desc))
    }
}
