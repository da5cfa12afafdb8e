//! Host side of `shaders/index.wgsl`: gathers and scatters by index tensors, and the device error
//! flag that reports an index out of range.
//!
//! The kernel checks each index on the device: a bad one is never followed (its output element is
//! left as it was) and raises the flag of the device (`Gpu::error_flag`). [`take_error`], called by
//! `synchronize` and `copy_dtoh` once the queue is idle, reads the flag once any kernel that may
//! raise it has run on the device, lowers it, and returns `IndexOutOfRange` naming the op, the first
//! index reported and the size. The error goes to whichever caller synchronizes or reads
//! first, on any thread sharing the backend.

use std::sync::atomic::Ordering;

use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::{
    check_index, ComputeBackend, DevicePtr, GatherDesc, OpDesc, ScatterDesc, ScatterReduce,
    StridedBuf,
};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::contiguous_strides;

use super::context::Gpu;
use super::memory::{self, Binding, Memory};
use super::pipelines::{grid_1d, Dispatch, Kernels, INDEX};

/// Most dims the kernel indexes.
const MAX_RANK: usize = 8;
/// Parameter words: n, rank, shape[8], the input's byte address and strides, the index's element
/// offset and strides, the output's byte address, the size along the dim, the op's code.
const WORDS: usize = 2 + MAX_RANK + 2 * (1 + MAX_RANK) + 3;
/// The ops that raise the flag, by the code the kernels record.
pub(super) use crate::compute::FLAG_OPS;
/// Parameter words of a scatter: a gather's, the output's strides and alpha.
const SCATTER_WORDS: usize = WORDS + MAX_RANK + 1;

/// Reads and lowers the device's error flag once a kernel that may raise it has been launched on
/// the device; `IndexOutOfRange` when it was raised. From the first such launch on, every call reads
/// the flag (a 32-byte copy): a launch another thread's open batch still holds may raise it after
/// this read, so the flag is never taken as settled. The caller has waited for the queue (the read
/// waits again, which costs nothing then).
pub(crate) fn take_error(gpu: &Gpu) -> Result<()> {
    if !gpu.flag_armed.load(Ordering::Acquire) {
        return Ok(());
    }
    let bytes = memory::read(gpu, &gpu.error_flag, 0, 32)?;
    let word = |k: usize| {
        u32::from_le_bytes([
            bytes[4 * k],
            bytes[4 * k + 1],
            bytes[4 * k + 2],
            bytes[4 * k + 3],
        ])
    };
    if word(0) == 0 {
        return Ok(());
    }
    gpu.queue.write_buffer(&gpu.error_flag, 0, &[0u8; 32]);
    Err(BackendError::IndexOutOfRange {
        op: FLAG_OPS
            .get(word(1) as usize)
            .copied()
            .unwrap_or("an indexing op"),
        index: ((u64::from(word(3)) << 32) | u64::from(word(2))) as i64,
        size: word(4) as usize,
    })
}

/// A view's binding, the element offset of its first element there, and its strides as words;
/// `None` when the view is not aligned to its elements or its numbers pass 32 bits.
fn placed<'m>(
    mem: &'m Memory,
    buf: &StridedBuf,
    dtype: DType,
) -> Result<Option<(Binding<'m>, u32, Vec<u32>)>> {
    let size = dtype.size_in_bytes();
    let span = buf.layout.span_elements()? - buf.layout.offset();
    let Some((binding, first)) = mem.view_elements(buf.ptr, buf.layout.offset(), size)? else {
        return Ok(None);
    };
    let fits = first
        .checked_add(span)
        .and_then(|end| end.checked_mul(size))
        .is_some_and(|end| u32::try_from(end).is_ok());
    let strides: Option<Vec<u32>> = buf
        .layout
        .strides()
        .iter()
        .map(|&s| u32::try_from(s).ok())
        .collect();
    Ok(match (fits, strides) {
        (true, Some(strides)) => Some((binding, first as u32, strides)),
        _ => None,
    })
}

/// What both kernels bind and the parameter words they share.
struct Launch<'m> {
    /// Input (gather) or source (scatter), output, index, error flag.
    buffers: [Binding<'m>; 4],
    /// The parameter words, [`WORDS`] of them filled.
    words: Vec<u32>,
}

impl<'m> Launch<'m> {
    /// The bindings and words of a launch of `n` invocations over the index's `shape`, reading
    /// `data` (of `dtype`, as the output) and `index`, writing the dense output of `out_shape`, whose
    /// flag records `size` (the length indexed along the dim).
    /// `FeatureUnavailable` (naming `feature`) when a number or an operand does not fit the kernel.
    /// `code` is the op's code for the flag and `words` the length of the parameter words.
    fn new(
        gpu: &'m Gpu,
        mem: &'m Memory,
        feature: &'static str,
        (data, index, output): (&StridedBuf, &StridedBuf, DevicePtr),
        (dtype, index_dtype): (DType, DType),
        (n, out_shape, size): (usize, &[usize], usize),
        (code, words): (u32, usize),
    ) -> Result<Launch<'m>> {
        let shape = index.layout.shape();
        let beyond = |what: &str| BackendError::FeatureUnavailable {
            feature,
            reason: format!(
                "the kernel indexes at most {MAX_RANK} dims with 32-bit offsets and operands \
                 aligned to their elements; {what} does not fit (index shape {shape:?})"
            ),
        };
        if shape.len() > MAX_RANK {
            return Err(beyond("the rank"));
        }
        let out = StridedBuf::contiguous(output, out_shape);
        let (Some(data), Some(ix), Some(out)) = (
            placed(mem, data, dtype)?,
            placed(mem, index, index_dtype)?,
            placed(mem, &out, dtype)?,
        ) else {
            return Err(beyond("an operand"));
        };
        let word = |v: usize| u32::try_from(v).map_err(|_| beyond("a size"));
        let at = |first: u32| {
            first
                .checked_mul(dtype.size_in_bytes() as u32)
                .ok_or_else(|| beyond("an operand"))
        };
        let mut p = vec![0u32; words];
        p[0] = word(n)?;
        p[1] = shape.len() as u32;
        for (k, &e) in shape.iter().enumerate() {
            p[2 + k] = word(e)?;
        }
        p[10] = at(data.1)?;
        p[11..11 + shape.len()].copy_from_slice(&data.2);
        p[19] = ix.1;
        p[20..20 + shape.len()].copy_from_slice(&ix.2);
        p[28] = at(out.1)?;
        p[29] = u32::try_from(size).unwrap_or(u32::MAX);
        p[30] = code;
        Ok(Launch {
            buffers: [data.0, out.0, ix.0, Binding::whole(&gpu.error_flag)],
            words: p,
        })
    }

    /// Dispatches `entry` of `index.wgsl` with `constants` over `invocations`, arming the flag.
    fn dispatch(
        self,
        gpu: &Gpu,
        kernels: &Kernels,
        entry: &'static str,
        constants: &[(&'static str, u64)],
        invocations: usize,
        loops: u64,
    ) -> Result<()> {
        gpu.flag_armed.store(true, Ordering::Release);
        kernels.dispatch(
            gpu,
            Dispatch {
                module: INDEX,
                entry,
                constants,
                buffers: &self.buffers,
                params: &self.words,
                groups: grid_1d(invocations, gpu.limits.max_compute_workgroups_per_dimension)?,
                loops,
            },
        )
    }
}

/// The gather of `d` in one launch, one invocation per output element.
fn gather(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &GatherDesc) -> Result<()> {
    let shape = d.index.layout.shape();
    let n: usize = shape.iter().product();
    let launch = Launch::new(
        gpu,
        mem,
        "WebGPU gather",
        (&d.input, &d.index, d.output),
        (d.dtype, d.index_dtype),
        (n, shape, d.input.layout.shape()[d.dim]),
        (0, WORDS),
    )?;
    let constants = [
        ("WIDTH", d.dtype.size_in_bytes() as u64),
        ("INDEX64", u64::from(d.index_dtype == DType::I64)),
        ("DIM", d.dim as u64),
    ];
    let loops = super::loops::passes(MAX_RANK as u64);
    launch.dispatch(gpu, kernels, "gather", &constants, n, loops)
}

/// The scatter of `d` in one launch, one invocation per column of the index.
fn scatter(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &ScatterDesc) -> Result<()> {
    let shape = d.index.layout.shape();
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    let len = shape[d.dim];
    let mut launch = Launch::new(
        gpu,
        mem,
        "WebGPU scatter",
        (&d.src, &d.index, d.output),
        (d.dtype, d.index_dtype),
        (n / len, &d.output_shape, d.output_shape[d.dim]),
        (1, SCATTER_WORDS),
    )?;
    for (k, s) in contiguous_strides(&d.output_shape).into_iter().enumerate() {
        launch.words[WORDS + k] =
            u32::try_from(s).map_err(|_| BackendError::FeatureUnavailable {
                feature: "WebGPU scatter",
                reason: format!(
                    "an output of shape {:?} needs offsets past 32 bits",
                    d.output_shape
                ),
            })?;
    }
    launch.words[WORDS + MAX_RANK] = (d.alpha as f32).to_bits();
    let constants = [
        ("WIDTH", d.dtype.size_in_bytes() as u64),
        ("INDEX64", u64::from(d.index_dtype == DType::I64)),
        ("DIM", d.dim as u64),
        ("ADD", u64::from(d.reduce == ScatterReduce::Add)),
    ];
    let loops = super::loops::passes(MAX_RANK as u64) + super::loops::passes(len as u64);
    launch.dispatch(gpu, kernels, "scatter", &constants, n / len, loops)
}

impl OpImpl<ScatterDesc> for WebGpuBackend {
    fn op(&self, desc: &ScatterDesc) -> Result<()> {
        let acc = desc.accesses()?;
        // Additions run in f32; other dtypes would need staging through f32 copies.
        if desc.reduce == ScatterReduce::Add && desc.dtype != DType::F32 {
            return Err(desc.unsupported(self));
        }
        if desc.output_shape[desc.dim] == 0 && desc.index.layout.numel() > 0 {
            // No index fits an empty dim, and with no output to write nothing would launch: the
            // first index is read to report it, as the reference does, once every pointer is
            // checked.
            self.run_direct(acc, |_, _, _| Ok(()))?;
            let size = desc.index_dtype.size_in_bytes();
            let first = desc
                .index
                .ptr
                .offset(desc.index.layout.offset() * size)
                .ok_or_else(|| BackendError::overflow("scatter", "index offset overflows"))?;
            let mut bytes = [0u8; 8];
            self.copy_dtoh(&mut bytes[..size], first)?;
            let index = if size == 4 {
                i64::from(i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
            } else {
                i64::from_le_bytes(bytes)
            };
            return check_index("scatter", index, 0);
        }
        self.run_direct(acc, |gpu, k, mem| scatter(gpu, k, mem, desc))
    }
}

impl OpImpl<GatherDesc> for WebGpuBackend {
    fn op(&self, desc: &GatherDesc) -> Result<()> {
        self.run_direct(desc.accesses()?, |gpu, k, mem| gather(gpu, k, mem, desc))
    }
}
