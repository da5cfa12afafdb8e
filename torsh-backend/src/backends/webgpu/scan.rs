//! Host side of `shaders/scan.wgsl`: inclusive scans along one dim in f32, i32 and i64 (integers
//! wrap; f16 and bf16 on f32 copies made on the device, rounded back once; f64 and u8 answer
//! `Unsupported`).
//!
//! A dim longer than the loop budget runs as launches over consecutive ranges of it, each carrying
//! on from the output the one before wrote. Operands must each fit one binding with 32-bit element
//! offsets and at most 8 dims (else `FeatureUnavailable`).

use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::{OpDesc, ScanDesc, ScanOp};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::contiguous_strides;

use super::context::Gpu;
use super::elementwise::Launch;
use super::memory::Memory;
use super::pipelines::{grid_1d, Dispatch, Kernels, SCAN};

/// Most dims the kernel indexes.
const MAX_RANK: usize = 8;
/// Parameter words: lines, rank, shape[8], two views of nine words, start, end.
const WORDS: usize = 2 + MAX_RANK + 2 * (1 + MAX_RANK) + 2;

/// The scan of `d` in f32, i32 or i64, or [`Launch::Stage`] for a 16-bit float dtype.
fn scan(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &ScanDesc) -> Result<Launch> {
    let kind = match d.dtype {
        DType::F32 => 0,
        DType::I32 => 1,
        DType::I64 => 2,
        _ => return Ok(Launch::Stage),
    };
    let size = d.dtype.size_in_bytes();
    let shape = d.input.layout.shape();
    let beyond = |what: &str| BackendError::FeatureUnavailable {
        feature: "WebGPU scan",
        reason: format!(
            "the kernel indexes at most {MAX_RANK} dims with 32-bit element offsets, each operand \
             within one binding; {what} does not fit (shape {shape:?})"
        ),
    };
    if shape.len() > MAX_RANK {
        return Err(beyond("the rank"));
    }
    let (outer, len, inner) = d.geometry();
    let lines = outer * inner;
    if lines == 0 || len == 0 {
        return Ok(Launch::Done);
    }
    let word = |v: usize| u32::try_from(v).map_err(|_| beyond("a size"));
    let Some((x, x_first)) = mem.view_elements(d.input.ptr, d.input.layout.offset(), size)? else {
        return Err(beyond("the input"));
    };
    let Some((y, y_first)) = mem.view_elements(d.output, 0, size)? else {
        return Err(beyond("the output"));
    };
    let x_last = d.input.layout.span_elements()? - d.input.layout.offset() + x_first;
    // The kernel indexes 32-bit words: the last word of each operand must be addressable.
    word(x_last * size / 4)?;
    word((y_first + outer * len * inner) * size / 4)?;
    let mut p = vec![0u32; WORDS];
    p[0] = word(lines)?;
    p[1] = shape.len() as u32;
    for (k, &e) in shape.iter().enumerate() {
        p[2 + k] = word(e)?;
    }
    p[10] = word(x_first)?;
    for (k, &s) in d.input.layout.strides().iter().enumerate() {
        p[11 + k] = word(s)?;
    }
    p[19] = word(y_first)?;
    for (k, s) in contiguous_strides(shape).into_iter().enumerate() {
        p[20 + k] = word(s)?;
    }
    // Loop passes of one launch: the coordinate loop and the walk along the dim.
    let fixed = super::loops::passes(MAX_RANK as u64) + 1;
    let chunk = gpu.loop_limit.saturating_sub(fixed + 1).max(1) as usize;
    let constants = [
        ("DIM", d.dim as u64),
        ("PROD", u64::from(d.op == ScanOp::Prod)),
        ("KIND", kind),
    ];
    let mut start = 0;
    while start < len {
        let end = (start + chunk).min(len);
        p[28] = word(start)?;
        p[29] = word(end)?;
        kernels.dispatch(
            gpu,
            Dispatch {
                module: SCAN,
                entry: "main",
                constants: &constants,
                buffers: &[x, y],
                params: &p,
                groups: grid_1d(lines, gpu.limits.max_compute_workgroups_per_dimension)?,
                loops: fixed + super::loops::passes((end - start) as u64),
            },
        )?;
        start = end;
    }
    Ok(Launch::Done)
}

impl OpImpl<ScanDesc> for WebGpuBackend {
    fn op(&self, desc: &ScanDesc) -> Result<()> {
        desc.accesses()?;
        if matches!(desc.dtype, DType::F64 | DType::U8) {
            return Err(desc.unsupported(self));
        }
        self.run(desc, scan)
    }
}
