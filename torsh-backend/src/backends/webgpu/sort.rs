//! Host side of `shaders/sort.wgsl`: stable sorts along one dim by ranks, any dtype (elements are
//! ordered by their bit patterns and moved as bits). An invocation per element walks its whole
//! line, so the work is O(len²) per line (fine for the lines of a top-k over a class dim, slow for
//! long ones) and a line longer than the loop budget answers `FeatureUnavailable`, as do operands
//! past one binding, 32-bit offsets or 8 dims.

use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::SortDesc;
use crate::error::{BackendError, Result};
use crate::shape::contiguous_strides;

use super::context::Gpu;
use super::memory::Memory;
use super::pipelines::{grid_1d, Dispatch, Kernels, SORT};
use super::select::dtype_constants;

/// Most dims the kernel indexes.
const MAX_RANK: usize = 8;
/// Parameter words: elements, rank, shape[8], the input's byte address and strides, the values'
/// byte address, the indices' element offset, the product of the dims after the dim, k.
const WORDS: usize = 2 + MAX_RANK + 1 + MAX_RANK + 4;

/// The sort of `d`, whose regions the caller checked, in one launch.
fn sort(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &SortDesc) -> Result<()> {
    let shape = d.input.layout.shape();
    let beyond = |what: &str| BackendError::FeatureUnavailable {
        feature: "WebGPU sort",
        reason: format!(
            "the kernel takes at most {MAX_RANK} dims, lines within the loop budget and operands \
             within one binding with 32-bit offsets; {what} does not fit (shape {shape:?})"
        ),
    };
    let n = d.input.layout.numel();
    let kept = d.output_shape().iter().product::<usize>();
    if n == 0 || kept == 0 {
        return Ok(());
    }
    if shape.len() > MAX_RANK {
        return Err(beyond("the rank"));
    }
    let len = shape[d.dim];
    let loops = super::loops::passes(MAX_RANK as u64) + super::loops::passes(len as u64);
    if loops > gpu.loop_limit {
        return Err(beyond("the line length"));
    }
    let size = d.dtype.size_in_bytes();
    let word = |v: usize| u32::try_from(v).map_err(|_| beyond("a size"));
    let Some((x, x_first)) = mem.view_elements(d.input.ptr, d.input.layout.offset(), size)? else {
        return Err(beyond("the input"));
    };
    word((d.input.layout.span_elements()? - d.input.layout.offset() + x_first) * size)?;
    let mut p = vec![0u32; WORDS];
    p[0] = word(n)?;
    p[1] = shape.len() as u32;
    for (k, &e) in shape.iter().enumerate() {
        p[2 + k] = word(e)?;
    }
    p[10] = word(x_first * size)?;
    for (k, &s) in d.input.layout.strides().iter().enumerate() {
        p[11 + k] = word(s)?;
    }
    let mut vals = x;
    if let Some(ptr) = d.values {
        let Some((binding, first)) = mem.view_elements(ptr, 0, size)? else {
            return Err(beyond("the values"));
        };
        word((first + kept) * size)?;
        p[19] = word(first * size)?;
        vals = binding;
    }
    let mut idx = x;
    if let Some(ptr) = d.indices {
        let Some((binding, first)) = mem.view_elements(ptr, 0, 8)? else {
            return Err(beyond("the indices"));
        };
        word((first + kept) * 8)?;
        p[20] = word(first)?;
        idx = binding;
    }
    p[21] = word(contiguous_strides(shape)[d.dim])?;
    p[22] = word(d.k)?;
    let mut constants = dtype_constants(d.dtype).to_vec();
    constants.extend([
        ("DIM", d.dim as u64),
        ("DESCENDING", u64::from(d.descending)),
        ("VALUES", u64::from(d.values.is_some())),
        ("INDICES", u64::from(d.indices.is_some())),
    ]);
    kernels.dispatch(
        gpu,
        Dispatch {
            module: SORT,
            entry: "main",
            constants: &constants,
            buffers: &[x, vals, idx],
            params: &p,
            groups: grid_1d(n, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops,
        },
    )
}

impl OpImpl<SortDesc> for WebGpuBackend {
    fn op(&self, desc: &SortDesc) -> Result<()> {
        self.run_direct(desc.accesses()?, |gpu, k, mem| sort(gpu, k, mem, desc))
    }
}
