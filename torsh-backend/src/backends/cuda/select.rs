//! Host side of the comparison and selection kernels (`kernels/select.cu`).
//!
//! Operands are coalesced over the output's shape (unit dims dropped, dims contiguous in every
//! operand merged) and passed as strided views; a scalar operand travels as its element bits.

use cudarc::driver::PushKernelArg;

use super::launch::{check_aligned, suffix, to_i64, StridedArg};
use super::{driver_error, Gpu};
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::{CompareDesc, Value, WhereDesc};
use crate::dtype::{element_bits, DType};
use crate::error::Result;
use crate::shape::{coalesce, Layout};

/// One operand as the kernels take it: base address, strided view, scalar bits, scalar flag.
struct Arg {
    ptr: u64,
    view: StridedArg,
    bits: u64,
    scalar: i32,
}

/// The kernel arguments of `values` (of `dtypes`) over their common `shape`, coalesced together
/// with the dense output.
fn args<const K: usize>(
    op: &'static str,
    shape: &[usize],
    values: [&Value; K],
    dtypes: [DType; K],
) -> Result<[Arg; K]> {
    let out = Layout::contiguous(shape);
    let layouts: [&Layout; K] = std::array::from_fn(|k| match values[k] {
        Value::Tensor(b) => &b.layout,
        Value::Scalar(_) => &out,
    });
    let (merged, strides) = coalesce(op, layouts)?;
    let mut built = Vec::with_capacity(K);
    for ((v, dtype), s) in values.iter().zip(dtypes).zip(strides) {
        built.push(match v {
            Value::Tensor(b) => {
                check_aligned(op, dtype, &[b.ptr])?;
                let layout = Layout::new(merged.clone(), s, b.layout.offset())?;
                Arg {
                    ptr: b.ptr.0,
                    view: StridedArg::new(op, &layout)?,
                    bits: 0,
                    scalar: 0,
                }
            }
            Value::Scalar(x) => Arg {
                ptr: 0,
                view: StridedArg::new(op, &Layout::contiguous(&[]))?,
                bits: element_bits(dtype, *x),
                scalar: 1,
            },
        });
    }
    built
        .try_into()
        .map_err(|_| crate::error::BackendError::invalid(op, "operand count mismatch"))
}

/// The comparison of `d`, whose regions the caller checked.
fn compare(gpu: &Gpu, d: &CompareDesc) -> Result<()> {
    const OP: &str = "compare";
    let n = d.lhs.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let lhs = Value::Tensor(d.lhs.clone());
    let [a, b] = args(OP, d.lhs.layout.shape(), [&lhs, &d.rhs], [d.dtype; 2])?;
    let name = format!("compare_{}", suffix(d.dtype));
    let f = gpu.function_for("select", d.dtype, &name)?;
    let n = to_i64(OP, n)?;
    let code = d.op.code() as i32;
    let mut builder = gpu.stream().launch_builder(&f);
    builder
        .arg(&a.ptr)
        .arg(&a.view)
        .arg(&b.ptr)
        .arg(&b.view)
        .arg(&b.bits)
        .arg(&b.scalar)
        .arg(&d.output.0)
        .arg(&n)
        .arg(&code);
    // SAFETY: the regions were checked against live allocations and the output overlaps no input;
    // the views stay inside them; a scalar's pointer is never read; the arguments match
    // `compare_<dtype>(const T*, Strided, const T*, Strided, u64, int, u8*, i64, int)`.
    unsafe { builder.launch(gpu.grid(n as usize)) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

/// The selection of `d`, whose regions the caller checked.
fn where_(gpu: &Gpu, d: &WhereDesc) -> Result<()> {
    const OP: &str = "where";
    let n = d.cond.layout.numel();
    if n == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.output])?;
    let cond = Value::Tensor(d.cond.clone());
    let [c, t, f] = args(
        OP,
        d.cond.layout.shape(),
        [&cond, &d.on_true, &d.on_false],
        [DType::U8, d.dtype, d.dtype],
    )?;
    let width = match d.dtype.size_in_bytes() {
        1 => "u8",
        2 => "u16",
        4 => "u32",
        _ => "u64",
    };
    let kernel = gpu.function("select", &format!("where_{width}"))?;
    let n = to_i64(OP, n)?;
    let mut builder = gpu.stream().launch_builder(&kernel);
    builder.arg(&c.ptr).arg(&c.view);
    for branch in [&t, &f] {
        builder
            .arg(&branch.ptr)
            .arg(&branch.view)
            .arg(&branch.bits)
            .arg(&branch.scalar);
    }
    builder.arg(&d.output.0).arg(&n);
    // SAFETY: as in `compare`; the arguments match `where_<width>(const u8*, Strided, const W*,
    // Strided, u64, int, const W*, Strided, u64, int, W*, i64)`.
    unsafe { builder.launch(gpu.grid(n as usize)) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

impl OpImpl<CompareDesc> for CudaBackend {
    fn op(&self, desc: &CompareDesc) -> Result<()> {
        self.run(desc.accesses()?, |gpu| compare(gpu, desc))
    }
}

impl OpImpl<WhereDesc> for CudaBackend {
    fn op(&self, desc: &WhereDesc) -> Result<()> {
        self.run(desc.accesses()?, |gpu| where_(gpu, desc))
    }
}

#[cfg(test)]
mod tests {
    use crate::compute::CompareOp;

    #[test]
    fn compare_codes_match_the_kernel_source() {
        let src = include_str!("kernels/select.cu");
        for &op in CompareOp::ALL {
            let define = format!("#define CMP_{} {}\n", op.name().to_uppercase(), op.code());
            assert!(src.contains(&define), "{define}");
        }
    }
}
