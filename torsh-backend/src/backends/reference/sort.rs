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
    if len == 0 || inner == 0 || d.input.layout.numel() == 0 {
        return Ok(());
    }
    let perm = if d.dtype.is_float() {
        let mut keys = Vec::with_capacity(d.input.layout.numel());
        mem.for_each_element(d.dtype, &d.input, |b| keys.push(decode(d.dtype, b)))?;
        permutations(&keys, geometry, d.descending)
    } else {
        let mut keys = Vec::with_capacity(d.input.layout.numel());
        mem.for_each_element(d.dtype, &d.input, |b| keys.push(decode_int(d.dtype, b)))?;
        permutations(&keys, geometry, d.descending)
    };
    // The first k of each line: (output position, input position).
    let k = d.k;
    let kept: Vec<(usize, usize)> = perm
        .iter()
        .enumerate()
        .filter_map(|(at, &from)| {
            let (o, i, j) = (at / inner / len, at / inner % len, at % inner);
            (i < k).then_some(((o * k + i) * inner + j, (o * len + from) * inner + j))
        })
        .collect();
    if let Some(values) = d.values {
        let size = d.dtype.size_in_bytes();
        let mut bytes = Vec::with_capacity(perm.len() * size);
        mem.for_each_element(d.dtype, &d.input, |b| bytes.extend_from_slice(b))?;
        let out = mem.bytes_mut(values, kept.len() * size)?;
        for &(to, s) in &kept {
            out[to * size..(to + 1) * size].copy_from_slice(&bytes[s * size..(s + 1) * size]);
        }
    }
    if let Some(indices) = d.indices {
        let out = mem.bytes_mut(indices, kept.len() * 8)?;
        for &(to, s) in &kept {
            let from = (s / inner) % len;
            out[to * 8..(to + 1) * 8].copy_from_slice(&(from as i64).to_le_bytes());
        }
    }
    Ok(())
}

impl OpImpl<SortDesc> for ReferenceBackend {
    fn op(&self, desc: &SortDesc) -> Result<()> {
        self.run(desc.accesses()?, |mem| sort(mem, desc))
    }
}
