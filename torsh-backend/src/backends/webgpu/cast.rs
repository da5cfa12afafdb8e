//! Host side of `shaders/cast.wgsl`: conversion and copy between any two dtypes, from a strided view
//! (or a constant) to a strided view, each at any element address. It serves `cast`, the copies and
//! fills that the f32 elementwise kernel does not cover (other dtypes, misaligned views), and the
//! staging of operands into f32 copies (`staging.rs`).

use crate::compute::{CastDesc, CopyDesc, DevicePtr, FillDesc, StridedBuf};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::{coalesce, Layout};

use super::context::Gpu;
use super::large::{pieces, Plan};
use super::memory::{Binding, Memory};
use super::pipelines::{grid_1d, Dispatch, Kernels, CAST};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::Temporaries;

/// Most dims the kernel indexes after coalescing.
const MAX_RANK: usize = 8;
/// Parameter words: n, rank, shape[8], two views of nine words, two constant words.
const WORDS: usize = 2 + MAX_RANK + 2 * (1 + MAX_RANK) + 2;

/// The kernel's code of `dtype` (its place in [`DType::ALL`]).
fn code(dtype: DType) -> u64 {
    DType::ALL.iter().position(|&d| d == dtype).unwrap_or(0) as u64
}

/// Where the converted elements come from.
pub(crate) enum Source<'a> {
    /// A view of `dtype` elements.
    View(&'a StridedBuf, DType),
    /// One value, as the destination dtype's bits (little-endian, zero-extended to 64 bits).
    Constant(u64),
}

/// A view placed in its buffer: the buffer, the byte address of its first element, its strides.
struct Placed<'a> {
    buffer: Binding<'a>,
    byte_offset: usize,
    strides: Vec<usize>,
}

/// The parameter words of a view (byte address, strides) after coalescing to `shape`; `None` when its
/// last byte is past what 32-bit addresses reach.
fn view_words(v: &Placed<'_>, shape: &[usize], size: usize) -> Option<Vec<u32>> {
    let last = shape
        .iter()
        .zip(&v.strides)
        .try_fold(0usize, |acc, (&e, &s)| {
            acc.checked_add(e.saturating_sub(1).checked_mul(s)?)
        })?;
    let end = last
        .checked_add(1)?
        .checked_mul(size)?
        .checked_add(v.byte_offset)?;
    u32::try_from(end).ok()?;
    let mut words = vec![0u32; 1 + MAX_RANK];
    words[0] = v.byte_offset as u32;
    for (d, &s) in v.strides.iter().enumerate() {
        words[1 + d] = u32::try_from(s).ok()?;
    }
    Some(words)
}

/// What the kernel binds to reach the view `buf` of `dtype`, and the view's first byte in it.
fn place<'m>(mem: &'m Memory, buf: &StridedBuf, dtype: DType) -> Result<(Binding<'m>, usize)> {
    let first = buf
        .layout
        .offset()
        .checked_mul(dtype.size_in_bytes())
        .and_then(|bytes| buf.ptr.offset(bytes))
        .ok_or_else(|| BackendError::overflow("cast", "view offset overflows"))?;
    let (binding, offset) = mem.bound(first)?;
    Ok((binding, offset as usize))
}

/// Converts `src` into the view `dst` of `dst_dtype` (same shape as the source view). `InvalidArgument`
/// when the views keep more than 8 dims after coalescing or reach past 4 GiB in their buffer.
pub(crate) fn convert(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    op: &'static str,
    src: Source<'_>,
    dst: &StridedBuf,
    dst_dtype: DType,
) -> Result<()> {
    let constant_layout;
    let (src_layout, src_dtype, constant) = match &src {
        Source::View(buf, dtype) => (&buf.layout, *dtype, None),
        Source::Constant(bits) => {
            // A stride-0 view of the destination's shape.
            let shape = dst.layout.shape().to_vec();
            let strides = vec![0; shape.len()];
            constant_layout = Layout::new(shape, strides, 0)?;
            (&constant_layout, dst_dtype, Some(*bits))
        }
    };
    let (shape, strides) = coalesce(op, [&dst.layout, src_layout])?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    let too_wide = || {
        BackendError::invalid(
            op,
            format!(
                "the WebGPU kernels index at most {MAX_RANK} dims after merging contiguous ones and \
                 4 GiB per buffer: shape {:?} does not fit",
                dst.layout.shape()
            ),
        )
    };
    if shape.len() > MAX_RANK {
        return Err(too_wide());
    }
    let [dst_strides, src_strides]: [Vec<usize>; 2] = strides;
    let (dst_buffer, dst_offset) = place(mem, dst, dst_dtype)?;
    let out = Placed {
        buffer: dst_buffer,
        byte_offset: dst_offset,
        strides: dst_strides,
    };
    let input = match &src {
        Source::View(buf, dtype) => {
            let (buffer, byte_offset) = place(mem, buf, *dtype)?;
            Placed {
                buffer,
                byte_offset,
                strides: src_strides,
            }
        }
        Source::Constant(_) => Placed {
            buffer: dst_buffer,
            byte_offset: 0,
            strides: src_strides,
        },
    };
    let mut words = vec![0u32; WORDS];
    words[0] = u32::try_from(n).map_err(|_| too_wide())?;
    words[1] = shape.len() as u32;
    for (d, &e) in shape.iter().enumerate() {
        words[2 + d] = e as u32;
    }
    let src_words = view_words(&input, &shape, src_dtype.size_in_bytes()).ok_or_else(too_wide)?;
    let dst_words = view_words(&out, &shape, dst_dtype.size_in_bytes()).ok_or_else(too_wide)?;
    words[2 + MAX_RANK..3 + 2 * MAX_RANK].copy_from_slice(&src_words);
    words[3 + 2 * MAX_RANK..4 + 3 * MAX_RANK].copy_from_slice(&dst_words);
    if let Some(bits) = constant {
        words[WORDS - 2] = bits as u32;
        words[WORDS - 1] = (bits >> 32) as u32;
    }
    let dense = shape.len() <= 1 && input.strides.iter().chain(&out.strides).all(|&s| s == 1);
    // A dense destination of narrow elements at an element-aligned address: one invocation per word.
    let size = dst_dtype.size_in_bytes();
    let by_words = size < 4 && dst.layout.is_contiguous() && out.byte_offset.is_multiple_of(size);
    let (entry, invocations) = if by_words {
        let first = out.byte_offset / 4;
        let end = (out.byte_offset + n * size).div_ceil(4);
        ("cast_words", end - first)
    } else {
        ("cast_elements", n)
    };
    kernels.dispatch(
        gpu,
        Dispatch {
            module: CAST,
            entry,
            constants: &[
                ("SRC", code(src_dtype)),
                ("DST", code(dst_dtype)),
                ("CONST_SRC", u64::from(constant.is_some())),
                ("DENSE", u64::from(dense)),
            ],
            buffers: &[input.buffer, out.buffer],
            params: &words,
            groups: grid_1d(invocations, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops: super::loops::CAST,
        },
    )
}

/// A cast between any two dtypes, rounding as the reference does.
pub(crate) fn cast(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &CastDesc) -> Result<()> {
    let out = StridedBuf::contiguous(d.output, d.input.layout.shape());
    convert(
        gpu,
        kernels,
        mem,
        "cast",
        Source::View(&d.input, d.src_dtype),
        &out,
        d.dst_dtype,
    )
}

/// A strided copy of any dtype (bits unchanged).
pub(crate) fn copy(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &CopyDesc) -> Result<()> {
    convert(
        gpu,
        kernels,
        mem,
        "copy_strided",
        Source::View(&d.src, d.dtype),
        &d.dst,
        d.dtype,
    )
}

/// A fill of any dtype: the value is encoded on the host as the reference encodes it.
pub(crate) fn fill(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &FillDesc) -> Result<()> {
    let mut bytes = [0u8; 8];
    crate::dtype::encode(d.dtype, d.value, &mut bytes);
    fill_bits(
        gpu,
        kernels,
        mem,
        d.ptr,
        d.len,
        d.dtype,
        u64::from_le_bytes(bytes),
    )
}

/// Sets `len` contiguous elements of `dtype` at `ptr` to the element bits `bits`.
pub(crate) fn fill_bits(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    ptr: DevicePtr,
    len: usize,
    dtype: DType,
    bits: u64,
) -> Result<()> {
    let out = StridedBuf::contiguous(ptr, &[len]);
    convert(
        gpu,
        kernels,
        mem,
        "fill",
        Source::Constant(bits),
        &out,
        dtype,
    )
}

impl OpImpl<CastDesc> for WebGpuBackend {
    fn op(&self, desc: &CastDesc) -> Result<()> {
        let run = |d: &CastDesc| self.run_direct(d.accesses()?, |gpu, k, mem| cast(gpu, k, mem, d));
        // Casts run in every dtype as they are, with no f32 copies to budget for: F32's widening.
        match self.plan(desc, crate::dtype::DType::F32, pieces::cast, None)? {
            Plan::Whole | Plan::PastBudget => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // A strided input not even one index of whose leading dim fits a binding: a dense
            // copy of it first (copies cut into tiles), then cast by elements.
            Plan::TooLarge => {
                let temps = Temporaries::new(self);
                let input = self.dense_copy(&temps, desc.src_dtype, &desc.input)?;
                self.cast(&CastDesc {
                    input,
                    ..desc.clone()
                })
            }
        }
    }
}
