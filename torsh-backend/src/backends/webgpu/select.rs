//! Host side of `shaders/select.wgsl`: comparisons into `U8` masks and selection by a mask, for
//! every dtype (the kernel compares bit patterns and moves elements as bits, so f64 and i64 run
//! too).
//!
//! Operands are coalesced (unit dims dropped, dims contiguous in every operand merged) and passed
//! as parameter words: the shape, and each view's byte address and strides. A view whose numbers
//! pass 32 bits or whose rank stays above 8 answers `FeatureUnavailable`.

use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::{CompareDesc, StridedBuf, Value, WhereDesc};
use crate::dtype::{element_bits, DType};
use crate::error::{BackendError, Result};
use crate::shape::{coalesce, Layout};

use super::context::Gpu;
use super::memory::{Binding, Memory};
use super::pipelines::{grid_1d, Dispatch, Kernels, SELECT};

/// Most dims the kernel indexes.
const MAX_RANK: usize = 8;
/// Parameter words: invocations, rank, shape[8], three views of nine words, the output's byte
/// address and element count, two scalars of two words.
const WORDS: usize = 2 + MAX_RANK + 3 * (1 + MAX_RANK) + 2 + 4;
/// Where the output's byte address and the scalars go.
const OUT_AT: usize = 37;

/// The kernel's operand `k` (0 `a`, 1 `b`, 2 `c`): a view or a scalar.
enum Slot<'a> {
    View(&'a StridedBuf, DType),
    Scalar(f64, DType),
}

/// The `FeatureUnavailable` error of a launch the kernel cannot index.
fn beyond(feature: &'static str, what: &str, shape: &[usize]) -> BackendError {
    BackendError::FeatureUnavailable {
        feature,
        reason: format!(
            "the kernel indexes at most {MAX_RANK} dims with 32-bit byte offsets and operands \
             aligned to their elements; {what} does not fit (shape {shape:?})"
        ),
    }
}

/// Launches `select.wgsl` over `shape` with operands `slots` (`a`, `b`, `c`) and a dense output of
/// `out_dtype` at `output`; `constants` are the op's own.
fn launch(
    (gpu, kernels, mem): (&Gpu, &Kernels, &Memory),
    feature: &'static str,
    shape: &[usize],
    slots: [Slot<'_>; 3],
    (output, out_dtype): (crate::compute::DevicePtr, DType),
    constants: &[(&'static str, u64)],
) -> Result<()> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    let out_layout = Layout::contiguous(shape);
    let layouts: [&Layout; 3] = std::array::from_fn(|k| match &slots[k] {
        Slot::View(b, _) => &b.layout,
        Slot::Scalar(..) => &out_layout,
    });
    let (merged, strides) = coalesce(feature, [&out_layout, layouts[0], layouts[1], layouts[2]])?;
    if merged.len() > MAX_RANK {
        return Err(beyond(feature, "the rank", shape));
    }
    let word = |v: usize| u32::try_from(v).map_err(|_| beyond(feature, "a size", shape));
    let mut p = vec![0u32; WORDS];
    p[1] = merged.len() as u32;
    for (d, &e) in merged.iter().enumerate() {
        p[2 + d] = word(e)?;
    }
    let out_size = out_dtype.size_in_bytes();
    let Some((out, out_first)) = mem.view_elements(output, 0, out_size)? else {
        return Err(beyond(feature, "the output", shape));
    };
    let out_at = word(out_first.saturating_mul(out_size))?;
    word(out_first.saturating_add(n).saturating_mul(out_size))?;
    let mut buffers: Vec<Binding<'_>> = Vec::with_capacity(4);
    for (k, slot) in slots.iter().enumerate() {
        let at = 10 + k * (1 + MAX_RANK);
        match slot {
            Slot::View(buf, dtype) => {
                let size = dtype.size_in_bytes();
                let Some((binding, first)) =
                    mem.view_elements(buf.ptr, buf.layout.offset(), size)?
                else {
                    return Err(beyond(feature, "an operand", shape));
                };
                let last = merged
                    .iter()
                    .zip(&strides[k + 1])
                    .try_fold(first, |acc, (&e, &s)| {
                        acc.checked_add((e - 1).checked_mul(s)?)
                    })
                    .and_then(|last| last.checked_add(1)?.checked_mul(size))
                    .unwrap_or(usize::MAX);
                word(last)?;
                p[at] = word(first * size)?;
                for (d, &s) in strides[k + 1].iter().enumerate() {
                    p[at + 1 + d] = word(s)?;
                }
                buffers.push(binding);
            }
            Slot::Scalar(v, dtype) => {
                let bits = element_bits(*dtype, *v);
                let scalar_at = OUT_AT + 2 + 2 * (k - 1);
                p[scalar_at] = bits as u32;
                p[scalar_at + 1] = (bits >> 32) as u32;
                // Never read: the output's buffer stands in.
                buffers.push(out);
            }
        }
    }
    buffers.push(out);
    p[OUT_AT] = out_at;
    p[OUT_AT + 1] = word(n)?;
    let invocations = if out_size == 8 {
        n
    } else {
        (out_at as usize % 4 + n * out_size).div_ceil(4)
    };
    p[0] = word(invocations)?;
    let mut all = constants.to_vec();
    all.push(("OUT_WIDTH", out_size as u64));
    all.push(("B_SCALAR", u64::from(matches!(slots[1], Slot::Scalar(..)))));
    all.push(("C_SCALAR", u64::from(matches!(slots[2], Slot::Scalar(..)))));
    let loops = 4 * super::loops::passes(MAX_RANK as u64) + super::loops::passes(4);
    kernels.dispatch(
        gpu,
        Dispatch {
            module: SELECT,
            entry: "main",
            constants: &all,
            buffers: &buffers,
            params: &p,
            groups: grid_1d(invocations, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops,
        },
    )
}

/// The kernel's constants describing `dtype`: element width, kind and +inf's high word.
pub(super) fn dtype_constants(dtype: DType) -> [(&'static str, u64); 3] {
    let (kind, inf) = match dtype {
        DType::F16 => (0, 0x7c00_0000),
        DType::F32 | DType::BF16 => (0, 0x7f80_0000),
        DType::F64 => (0, 0x7ff0_0000),
        DType::I32 | DType::I64 => (1, 0),
        DType::U8 => (2, 0),
    };
    [
        ("WIDTH", dtype.size_in_bytes() as u64),
        ("KIND", kind),
        ("INF_HI", inf),
    ]
}

/// The slot of a [`Value`] of `dtype`.
fn slot(v: &Value, dtype: DType) -> Slot<'_> {
    match v {
        Value::Tensor(b) => Slot::View(b, dtype),
        Value::Scalar(s) => Slot::Scalar(*s, dtype),
    }
}

impl OpImpl<CompareDesc> for WebGpuBackend {
    fn op(&self, d: &CompareDesc) -> Result<()> {
        self.run_direct(d.accesses()?, |gpu, kernels, mem| {
            let mut constants = dtype_constants(d.dtype).to_vec();
            constants.push(("A_WIDTH", d.dtype.size_in_bytes() as u64));
            constants.push(("OP", u64::from(d.op.code())));
            launch(
                (gpu, kernels, mem),
                "WebGPU compare",
                d.lhs.layout.shape(),
                [
                    Slot::View(&d.lhs, d.dtype),
                    slot(&d.rhs, d.dtype),
                    Slot::Scalar(0.0, d.dtype),
                ],
                (d.output, DType::U8),
                &constants,
            )
        })
    }
}

impl OpImpl<WhereDesc> for WebGpuBackend {
    fn op(&self, d: &WhereDesc) -> Result<()> {
        self.run_direct(d.accesses()?, |gpu, kernels, mem| {
            let mut constants = dtype_constants(d.dtype).to_vec();
            constants.push(("A_WIDTH", 1));
            constants.push(("SELECT", 1));
            launch(
                (gpu, kernels, mem),
                "WebGPU where",
                d.cond.layout.shape(),
                [
                    Slot::View(&d.cond, DType::U8),
                    slot(&d.on_true, d.dtype),
                    slot(&d.on_false, d.dtype),
                ],
                (d.output, d.dtype),
                &constants,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::backends::webgpu::pipelines::shader_codes;
    use crate::compute::CompareOp;

    #[test]
    fn op_codes_match_the_shader() {
        let src = include_str!("shaders/select.wgsl");
        let codes = shader_codes(src, "CMP_");
        assert_eq!(codes.len(), CompareOp::ALL.len(), "CMP_* constants");
        for &op in CompareOp::ALL {
            let name = op.name().to_uppercase();
            assert!(codes.contains(&(name.clone(), op.code())), "CMP_{name}");
        }
    }
}
