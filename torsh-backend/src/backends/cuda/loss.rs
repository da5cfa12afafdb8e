//! Host side of the fused cross-entropy kernel (`cross_entropy_g<G>_<dtype>_<index>` in
//! `kernels/norm.cu`): the per-sample losses or the logits' gradient, one group of threads per row
//! ([`super::reduce::group_size`]). A target outside `0..classes` that is not the ignore index
//! raises the device's error flag (`index.rs`), reported at the next synchronize or host read.

use cudarc::driver::PushKernelArg;

use super::launch::{check_aligned, suffix, to_i64};
use super::reduce::{group_launch, group_size};
use super::Gpu;
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::CrossEntropyDesc;
use crate::dtype::DType;
use crate::error::Result;

/// The codes the kernel raises the error flag with, forward and backward (`index::FLAG_OPS`).
const FLAG_CODES: [i64; 2] = [3, 4];

/// Enqueues `d`, whose regions the caller checked; nothing for no rows.
pub(crate) fn cross_entropy(gpu: &Gpu, d: &CrossEntropyDesc) -> Result<()> {
    let op = d.name();
    if d.rows == 0 {
        return Ok(());
    }
    let floats: Vec<_> = [d.logits, d.output].into_iter().chain(d.grad).collect();
    check_aligned(op, d.dtype, &floats)?;
    check_aligned(op, d.index_dtype, &[d.target])?;
    let group = group_size(d.classes, d.rows, true, gpu.sm_count());
    let index = if d.index_dtype == DType::I32 {
        "i32"
    } else {
        "i64"
    };
    let name = format!("cross_entropy_g{group}_{}_{index}", suffix(d.dtype));
    let f = gpu.function_for("norm", d.dtype, &name)?;
    let stream = gpu.stream();
    let flag = gpu.errors.arm(stream)?;
    let (rows, classes) = (to_i64(op, d.rows)?, to_i64(op, d.classes)?);
    let has_ignore = i32::from(d.ignore_index.is_some());
    let ignore = d.ignore_index.unwrap_or(0);
    let code = FLAG_CODES[usize::from(d.grad.is_some())];
    let (x, target, w, out) = (
        d.logits.0,
        d.target.0,
        d.grad.map_or(0, |g| g.0),
        d.output.0,
    );
    let mut b = stream.launch_builder(&f);
    b.arg(&x).arg(&target).arg(&w).arg(&out);
    b.arg(&rows).arg(&classes).arg(&has_ignore).arg(&ignore);
    b.arg(&d.label_smoothing).arg(&flag).arg(&code);
    // SAFETY: the caller checked the logits (`rows · classes`), the `rows` targets, the optional
    // `rows` gradients (null when absent, never read then) and the output against live allocations
    // and for overlap; the kernel reads a row's logits only at targets it checked; the flag is the
    // backend's live error flag; the arguments match `cross_entropy_g<G>_<dtype>_<index>`'s
    // parameters.
    unsafe { b.launch(group_launch(d.rows, group, gpu.sm_count())) }
        .map_err(|e| super::driver_error(op, e))?;
    Ok(())
}

impl OpImpl<CrossEntropyDesc> for CudaBackend {
    fn op(&self, desc: &CrossEntropyDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only(desc.name(), desc.dtype)?;
        self.run(acc, |gpu| cross_entropy(gpu, desc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_codes_name_the_op_and_the_kernel_exists() {
        let ops = super::super::index::FLAG_OPS;
        assert_eq!(ops[FLAG_CODES[0] as usize], "cross_entropy");
        assert_eq!(ops[FLAG_CODES[1] as usize], "cross_entropy_backward");
        let src = include_str!("kernels/norm.cu");
        for index in ["i32", "i64"] {
            assert!(src.contains(&format!("cross_entropy_g##G##_##S##_{index}(")));
        }
    }
}
