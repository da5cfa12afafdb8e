//! Unary, binary, cast, fill, strided copy and random fill.

use crate::compute::{
    BinaryDesc, CastDesc, CopyDesc, Distribution, DropoutDesc, FillDesc, RandomDesc, StridedBuf,
    UnaryBackwardDesc, UnaryDesc, Value,
};
use crate::error::Result;
use crate::rng;

use super::math;
use super::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;
use crate::dtype::{decode, decode_int, encode, encode_int, rounded};

/// `output[i] = op(input[i])`.
pub fn unary(mem: &mut HostMemory, d: &UnaryDesc) -> Result<()> {
    let x = mem.load(d.dtype, &d.input)?;
    let y: Vec<f64> = x.into_iter().map(|v| math::unary(d.op, v)).collect();
    mem.store(d.dtype, d.output, &y)
}

/// `output[i] = op(lhs[i], rhs[i])` over the (broadcast) views; a scalar `rhs` is rounded to the
/// dtype once.
pub fn binary(mem: &mut HostMemory, d: &BinaryDesc) -> Result<()> {
    let a = mem.load(d.dtype, &d.lhs)?;
    let b = match &d.rhs {
        Value::Tensor(rhs) => mem.load(d.dtype, rhs)?,
        Value::Scalar(s) => vec![rounded(d.dtype, *s); a.len()],
    };
    let y: Vec<f64> = a
        .into_iter()
        .zip(b)
        .map(|(a, b)| math::binary(d.op, a, b))
        .collect();
    mem.store(d.dtype, d.output, &y)
}

/// `output[i] = grad[i] · op'(saved[i])` over the (broadcast) views.
pub fn unary_backward(mem: &mut HostMemory, d: &UnaryBackwardDesc) -> Result<()> {
    let v = mem.load(d.dtype, &d.saved)?;
    let g = mem.load(d.dtype, &d.grad)?;
    let y: Vec<f64> = v
        .into_iter()
        .zip(g)
        .map(|(v, g)| math::unary_grad(d.op, v, g))
        .collect();
    mem.store(d.dtype, d.output, &y)
}

/// Converts every element; integer-to-integer conversions go through i64 so they wrap exactly.
pub fn cast(mem: &mut HostMemory, d: &CastDesc) -> Result<()> {
    let (src, dst) = (d.src_dtype, d.dst_dtype);
    let mut out = Vec::with_capacity(d.input.layout.numel() * dst.size_in_bytes());
    let mut tmp = [0u8; 8];
    mem.for_each_element(src, &d.input, |b| {
        if src.is_float() {
            encode(dst, decode(src, b), &mut tmp);
        } else {
            encode_int(dst, decode_int(src, b), &mut tmp);
        }
        out.extend_from_slice(&tmp[..dst.size_in_bytes()]);
    })?;
    mem.bytes_mut(d.output, out.len())?.copy_from_slice(&out);
    Ok(())
}

/// Sets every element to `value`.
pub fn fill(mem: &mut HostMemory, d: &FillDesc) -> Result<()> {
    let size = d.dtype.size_in_bytes();
    let mut one = [0u8; 8];
    encode(d.dtype, d.value, &mut one);
    for chunk in mem.bytes_mut(d.ptr, d.len * size)?.chunks_exact_mut(size) {
        chunk.copy_from_slice(&one[..size]);
    }
    Ok(())
}

/// Copies element by element from one view to another, reading everything first.
pub fn copy_strided(mem: &mut HostMemory, d: &CopyDesc) -> Result<()> {
    let size = d.dtype.size_in_bytes();
    let mut values = Vec::with_capacity(d.src.layout.numel() * size);
    mem.for_each_element(d.dtype, &d.src, |b| values.extend_from_slice(b))?;
    let start = d.dst.layout.offset();
    let span = d.dst.layout.span_elements()?;
    let region = crate::compute::DevicePtr(d.dst.ptr.0 + (start * size) as u64);
    let bytes = mem.bytes_mut(region, (span - start) * size)?;
    let mut k = 0;
    d.dst.layout.for_each_index(|e| {
        let at = (e - start) * size;
        bytes[at..at + size].copy_from_slice(&values[k..k + size]);
        k += size;
    });
    Ok(())
}

/// Fills with the crate's counter-based streams ([`crate::rng`]).
pub fn random(mem: &mut HostMemory, d: &RandomDesc) -> Result<()> {
    let values: Vec<f64> = (0..d.len as u64)
        .map(|i| match d.distribution {
            Distribution::Uniform { low, high } => low + (high - low) * rng::uniform(d.seed, i),
            Distribution::Normal { mean, std } => mean + std * rng::normal(d.seed, i),
        })
        .collect();
    mem.store(d.dtype, d.ptr, &values)
}

/// `output[i] = input[i] · scale` where the stream keeps element `i`, else 0.
pub fn dropout(mem: &mut HostMemory, d: &DropoutDesc) -> Result<()> {
    let x = mem.load(d.dtype, &StridedBuf::contiguous(d.input, &[d.len]))?;
    let (t, scale) = (d.threshold(), d.scale());
    let y: Vec<f64> = x
        .into_iter()
        .zip(0u64..)
        .map(|(v, i)| {
            if rng::bits(d.seed, i) >> 11 >= t {
                v * scale
            } else {
                0.0
            }
        })
        .collect();
    mem.store(d.dtype, d.output, &y)
}

impl OpImpl<DropoutDesc> for ReferenceBackend {
    fn op(&self, desc: &DropoutDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("dropout", desc.dtype)?;
        self.run(acc, |mem| dropout(mem, desc))
    }
}

impl OpImpl<UnaryDesc> for ReferenceBackend {
    fn op(&self, desc: &UnaryDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("unary", desc.dtype)?;
        self.run(acc, |mem| unary(mem, desc))
    }
}

impl OpImpl<BinaryDesc> for ReferenceBackend {
    fn op(&self, desc: &BinaryDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("binary", desc.dtype)?;
        self.run(acc, |mem| binary(mem, desc))
    }
}

impl OpImpl<UnaryBackwardDesc> for ReferenceBackend {
    fn op(&self, desc: &UnaryBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("unary_backward", desc.dtype)?;
        self.run(acc, |mem| unary_backward(mem, desc))
    }
}

impl OpImpl<FillDesc> for ReferenceBackend {
    fn op(&self, desc: &FillDesc) -> Result<()> {
        self.run(desc.accesses()?, |mem| fill(mem, desc))
    }
}

impl OpImpl<CastDesc> for ReferenceBackend {
    fn op(&self, desc: &CastDesc) -> Result<()> {
        self.run(desc.accesses()?, |mem| cast(mem, desc))
    }
}

impl OpImpl<CopyDesc> for ReferenceBackend {
    fn op(&self, desc: &CopyDesc) -> Result<()> {
        self.run(desc.accesses()?, |mem| copy_strided(mem, desc))
    }
}

impl OpImpl<RandomDesc> for ReferenceBackend {
    fn op(&self, desc: &RandomDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only("random", desc.dtype)?;
        self.run(acc, |mem| random(mem, desc))
    }
}
