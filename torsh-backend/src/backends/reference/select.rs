//! Comparisons into `U8` masks, and selection by a mask. Float operands compare as f64 (every float
//! dtype converts to it exactly, so IEEE's rules carry over); integer operands as i64.

use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;
use crate::compute::{CompareDesc, CompareOp, Value, WhereDesc};
use crate::dtype::{decode, decode_int, element_bits, DType};
use crate::error::Result;

use super::memory::HostMemory;

/// `op(a, b)` over values of one ordered type whose zero is `zero`.
pub(crate) fn compare_values<T: PartialOrd>(op: CompareOp, a: T, b: T, zero: T) -> bool {
    match op {
        CompareOp::Eq => a == b,
        CompareOp::Ne => a != b,
        CompareOp::Lt => a < b,
        CompareOp::Le => a <= b,
        CompareOp::Gt => a > b,
        CompareOp::Ge => a >= b,
        CompareOp::And => a != zero && b != zero,
        CompareOp::Or => a != zero || b != zero,
        CompareOp::Xor => (a != zero) != (b != zero),
    }
}

/// The elements of `v` as f64 (floats) or i64 (integers) through `read`, `n` of them.
fn values<T: Copy>(
    mem: &HostMemory,
    dtype: DType,
    v: &Value,
    n: usize,
    read: impl Fn(&[u8]) -> T,
) -> Result<Vec<T>> {
    match v {
        Value::Tensor(buf) => {
            let mut out = Vec::with_capacity(n);
            mem.for_each_element(dtype, buf, |b| out.push(read(b)))?;
            Ok(out)
        }
        Value::Scalar(s) => Ok(vec![read(&scalar_bytes(dtype, *s)); n]),
    }
}

/// `value` as one element of `dtype` (rounded to nearest for floats; integers were checked whole
/// and in range).
pub(crate) fn scalar_bytes(dtype: DType, value: f64) -> Vec<u8> {
    element_bits(dtype, value).to_le_bytes()[..dtype.size_in_bytes()].to_vec()
}

/// `output[i] = op(lhs[i], rhs[i])` as 0 or 1.
pub fn compare(mem: &mut HostMemory, d: &CompareDesc) -> Result<()> {
    let n = d.lhs.layout.numel();
    let lhs = Value::Tensor(d.lhs.clone());
    let mask: Vec<u8> = if d.dtype.is_float() {
        let read = |b: &[u8]| decode(d.dtype, b);
        let a = values(mem, d.dtype, &lhs, n, read)?;
        let b = values(mem, d.dtype, &d.rhs, n, read)?;
        a.into_iter()
            .zip(b)
            .map(|(a, b)| u8::from(compare_values(d.op, a, b, 0.0)))
            .collect()
    } else {
        let read = |b: &[u8]| decode_int(d.dtype, b);
        let a = values(mem, d.dtype, &lhs, n, read)?;
        let b = values(mem, d.dtype, &d.rhs, n, read)?;
        a.into_iter()
            .zip(b)
            .map(|(a, b)| u8::from(compare_values(d.op, a, b, 0)))
            .collect()
    };
    mem.bytes_mut(d.output, n)?.copy_from_slice(&mask);
    Ok(())
}

/// `output[i] = cond[i] ≠ 0 ? on_true[i] : on_false[i]`, element bytes moved as they are.
pub fn where_(mem: &mut HostMemory, d: &WhereDesc) -> Result<()> {
    let n = d.cond.layout.numel();
    let size = d.dtype.size_in_bytes();
    let mut cond = Vec::with_capacity(n);
    mem.for_each_element(DType::U8, &d.cond, |b| cond.push(b[0] != 0))?;
    let bytes = |b: &[u8]| {
        let mut e = [0u8; 8];
        e[..size].copy_from_slice(b);
        e
    };
    let on_true = values(mem, d.dtype, &d.on_true, n, bytes)?;
    let on_false = values(mem, d.dtype, &d.on_false, n, bytes)?;
    let out = mem.bytes_mut(d.output, n * size)?;
    for (i, c) in cond.into_iter().enumerate() {
        let e = if c { &on_true[i] } else { &on_false[i] };
        out[i * size..(i + 1) * size].copy_from_slice(&e[..size]);
    }
    Ok(())
}

impl OpImpl<CompareDesc> for ReferenceBackend {
    fn op(&self, desc: &CompareDesc) -> Result<()> {
        self.run(desc.accesses()?, |mem| compare(mem, desc))
    }
}

impl OpImpl<WhereDesc> for ReferenceBackend {
    fn op(&self, desc: &WhereDesc) -> Result<()> {
        self.run(desc.accesses()?, |mem| where_(mem, desc))
    }
}
