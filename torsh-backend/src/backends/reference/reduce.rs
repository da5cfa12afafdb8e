//! Reductions along one axis of a strided view, in f64.

use crate::compute::{ReduceDesc, ReduceOp};
use crate::dtype::DType;
use crate::error::Result;

use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;

/// Reduces `d.input` along `d.axis` into the contiguous output.
pub fn reduce(mem: &mut HostMemory, d: &ReduceDesc) -> Result<()> {
    let shape = d.input.layout.shape();
    if d.output_shape().contains(&0) {
        return Ok(()); // No output element; the axis length may be anything.
    }
    let x = mem.load(d.dtype, &d.input)?;
    let len = shape[d.axis];
    let outer: usize = shape[..d.axis].iter().product();
    let inner: usize = shape[d.axis + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    let mut lane = Vec::with_capacity(len);
    for o in 0..outer {
        for i in 0..inner {
            lane.clear();
            lane.extend((0..len).map(|a| x[(o * len + a) * inner + i]));
            out.push(reduce_lane(d.op, &lane));
        }
    }
    let out_dtype = d.op.output_dtype(d.dtype);
    mem.store(out_dtype, d.output, &out)?;
    debug_assert!(out_dtype == DType::I64 || out_dtype == d.dtype);
    Ok(())
}

/// One lane's value (an index, as f64, for the arg reductions).
pub fn reduce_lane(op: ReduceOp, lane: &[f64]) -> f64 {
    let n = lane.len();
    match op {
        ReduceOp::Sum => lane.iter().sum(),
        ReduceOp::Mean => lane.iter().sum::<f64>() / n as f64,
        ReduceOp::Max => extreme(lane, |a, b| a > b).1,
        ReduceOp::Min => extreme(lane, |a, b| a < b).1,
        ReduceOp::ArgMax => extreme(lane, |a, b| a > b).0 as f64,
        ReduceOp::ArgMin => extreme(lane, |a, b| a < b).0 as f64,
        ReduceOp::Var { correction } => {
            // Around the lane's first value, so a constant lane gives exactly 0.
            let pivot = lane.first().copied().unwrap_or(0.0);
            let mean = lane.iter().map(|x| x - pivot).sum::<f64>() / n as f64;
            let ss: f64 = lane
                .iter()
                .map(|x| (x - pivot - mean) * (x - pivot - mean))
                .sum();
            ss / (n as f64 - correction as f64).max(0.0)
        }
    }
}

/// Index and value of the first element that beats all others by `better`; the first NaN wins outright.
fn extreme(lane: &[f64], better: impl Fn(f64, f64) -> bool) -> (usize, f64) {
    let mut best = (0, lane.first().copied().unwrap_or(f64::NAN));
    for (i, &v) in lane.iter().enumerate() {
        if best.1.is_nan() {
            break;
        }
        if v.is_nan() || better(v, best.1) {
            best = (i, v);
        }
    }
    best
}

impl OpImpl<ReduceDesc> for ReferenceBackend {
    fn op(&self, desc: &ReduceDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("reduce", desc.dtype)?;
        self.run(acc, |mem| reduce(mem, desc))
    }
}
