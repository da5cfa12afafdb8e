//! Stable sorts along one dim: floats ordered as f64 (NaN last, `-0 == +0`), integers as i64.

use std::cmp::Ordering;

use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;
use crate::compute::SortDesc;
use crate::dtype::{decode, decode_int};
use crate::error::Result;

use super::memory::HostMemory;

/// The sort's total order over values of one type: IEEE's where it is defined, `-0 == +0`, and a
/// NaN (the only value unequal to itself) after every number and equal to any other NaN.
pub(crate) fn total_order<K: PartialOrd>(a: &K, b: &K) -> Ordering {
    a.partial_cmp(b).unwrap_or_else(|| {
        #[allow(clippy::eq_op)]
        let (a_nan, b_nan) = (a != a, b != b);
        a_nan.cmp(&b_nan)
    })
}

/// For each line of `keys` (row-major over `(outer, len, inner)`), the input positions along the
/// dim in sorted order, stably.
pub(crate) fn permutations<K: PartialOrd>(
    keys: &[K],
    (outer, len, inner): (usize, usize, usize),
    descending: bool,
) -> Vec<usize> {
    let mut out = vec![0usize; keys.len()];
    let mut order: Vec<usize> = Vec::with_capacity(len);
    for o in 0..outer {
        for j in 0..inner {
            let at = |i: usize| (o * len + i) * inner + j;
            order.clear();
            order.extend(0..len);
            if descending {
                order.sort_by(|&x, &y| total_order(&keys[at(y)], &keys[at(x)]));
            } else {
                order.sort_by(|&x, &y| total_order(&keys[at(x)], &keys[at(y)]));
            }
            for (i, &from) in order.iter().enumerate() {
                out[at(i)] = from;
            }
        }
    }
    out
}

/// Sorts every line: values moved as their bytes, positions written as `I64`.
pub fn sort(mem: &mut HostMemory, d: &SortDesc) -> Result<()> {
    let geometry = d.geometry();
    let (_, len, inner) = geometry;
    let perm = if d.dtype.is_float() {
        let mut keys = Vec::with_capacity(d.input.layout.numel());
        mem.for_each_element(d.dtype, &d.input, |b| keys.push(decode(d.dtype, b)))?;
        permutations(&keys, geometry, d.descending)
    } else {
        let mut keys = Vec::with_capacity(d.input.layout.numel());
        mem.for_each_element(d.dtype, &d.input, |b| keys.push(decode_int(d.dtype, b)))?;
        permutations(&keys, geometry, d.descending)
    };
    // The input element each output position takes: its line's start plus `from` steps along the dim.
    let source = |at: usize, from: usize| {
        let (line_start, j) = ((at / inner / len) * len * inner, at % inner);
        line_start + from * inner + j
    };
    if let Some(values) = d.values {
        let size = d.dtype.size_in_bytes();
        let mut bytes = Vec::with_capacity(perm.len() * size);
        mem.for_each_element(d.dtype, &d.input, |b| bytes.extend_from_slice(b))?;
        let out = mem.bytes_mut(values, perm.len() * size)?;
        for (at, &from) in perm.iter().enumerate() {
            let s = source(at, from);
            out[at * size..(at + 1) * size].copy_from_slice(&bytes[s * size..(s + 1) * size]);
        }
    }
    if let Some(indices) = d.indices {
        let out = mem.bytes_mut(indices, perm.len() * 8)?;
        for (chunk, &from) in out.chunks_exact_mut(8).zip(&perm) {
            chunk.copy_from_slice(&(from as i64).to_le_bytes());
        }
    }
    Ok(())
}

impl OpImpl<SortDesc> for ReferenceBackend {
    fn op(&self, desc: &SortDesc) -> Result<()> {
        self.run(desc.accesses()?, |mem| sort(mem, desc))
    }
}
