//! Staging: operands a kernel cannot index as they are — f16 and bf16 elements, or f32 elements at
//! addresses that are not 4-byte aligned — are converted on the device into fresh, aligned f32 copies
//! (`cast.wgsl`), the f32 kernel runs on the copies, and the regions it writes are converted back.
//!
//! So every op runs on the device in f16 and bf16, computing in f32 and rounding once to the operand's
//! dtype on the way back, which is within the reference's 16-bit error bounds (it accumulates in f64
//! and rounds once too). Each copy covers exactly its operand's region (the bytes the op may touch), so
//! a strided view keeps its strides with its offset moved to 0; an output region with gaps (a GEMM
//! with `ldc > m`) is copied in as well, and the round trip f16 → f32 → f16 leaves the gaps' bits as
//! they were. An operand given twice (an in-place output) gets one copy.
//!
//! Native f16 kernels (`SHADER_F16`) would save the conversion passes; this is the general path.

use crate::compute::*;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::Layout;

use super::cast::{convert, fill_bits, Source};
use super::context::Gpu;
use super::elementwise::Launch;
use super::memory::Memory;
use super::pipelines::Kernels;

/// `desc` in f32 over staged copies of its operands: each operand's pointer becomes
/// `to(region name, element dtype)`, whose element 0 is the region's first element, so a strided view
/// keeps its shape and strides with its offset moved to 0.
fn staged<D: OpDesc>(
    desc: &D,
    mut to: impl FnMut(&'static str, DType) -> Result<DevicePtr>,
) -> Result<D> {
    let mut staged = desc.clone();
    for operand in staged.operands() {
        let copy = to(operand.name, operand.dtype)?;
        match operand.slot {
            Slot::Dense(ptr) => *ptr = copy,
            Slot::Strided(buf) => {
                let layout = &buf.layout;
                let moved = Layout::new(layout.shape().to_vec(), layout.strides().to_vec(), 0)?;
                *buf = StridedBuf {
                    ptr: copy,
                    layout: moved,
                };
            }
        }
    }
    *staged.dtype_mut() = DType::F32;
    Ok(staged)
}

/// One operand's copy.
struct Copy {
    region: Region,
    /// The operand's element dtype, and the copy's (f32 for floats, the same for integers).
    dtype: DType,
    copy_dtype: DType,
    copy: DevicePtr,
    /// Converted back after the kernel.
    writes: bool,
}

/// The copies of one op's operands.
struct Staging<'k> {
    gpu: &'k Gpu,
    kernels: &'k Kernels,
    regions: Vec<Region>,
    copies: Vec<Copy>,
    /// Fill write-only copies with NaN first, so an element the kernel misses shows.
    poison: bool,
}

impl Staging<'_> {
    /// The copy of region `name` (of `dtype` elements), made and filled on first request.
    fn stage(&mut self, mem: &mut Memory, name: &'static str, dtype: DType) -> Result<DevicePtr> {
        let region = *self
            .regions
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| {
                BackendError::invalid(name, "staging: no such region (internal error)")
            })?;
        if let Some(c) = self
            .copies
            .iter_mut()
            .find(|c| c.region.ptr == region.ptr && c.region.bytes == region.bytes)
        {
            c.writes |= region.access.writes();
            return Ok(c.copy);
        }
        let elements = region.bytes / dtype.size_in_bytes();
        let copy_dtype = if dtype.is_float() { DType::F32 } else { dtype };
        let bytes = elements.max(1) * copy_dtype.size_in_bytes();
        let copy = mem.alloc(self.gpu, bytes)?;
        // Registered before anything can fail, so the copy is freed whatever happens next.
        self.copies.push(Copy {
            region,
            dtype,
            copy_dtype,
            copy,
            writes: region.access.writes(),
        });
        // The kernels bind the copy whole (a copy larger than one binding is refused here).
        mem.cover("staging", copy, bytes)?;
        let whole = |ptr| StridedBuf::contiguous(ptr, &[elements]);
        if region.access == Access::Write && region.dense {
            if self.poison && copy_dtype == DType::F32 {
                fill_bits(
                    self.gpu,
                    self.kernels,
                    mem,
                    copy,
                    elements,
                    DType::F32,
                    u64::from(u32::MAX),
                )?;
            }
        } else {
            convert(
                self.gpu,
                self.kernels,
                mem,
                "staging",
                Source::View(&whole(region.ptr), dtype),
                &whole(copy),
                copy_dtype,
            )?;
        }
        Ok(copy)
    }

    /// Converts every written copy back into its operand.
    fn write_back(&self, mem: &Memory) -> Result<()> {
        for c in self.copies.iter().filter(|c| c.writes) {
            let elements = c.region.bytes / c.dtype.size_in_bytes();
            convert(
                self.gpu,
                self.kernels,
                mem,
                "staging",
                Source::View(&StridedBuf::contiguous(c.copy, &[elements]), c.copy_dtype),
                &StridedBuf::contiguous(c.region.ptr, &[elements]),
                c.dtype,
            )?;
        }
        Ok(())
    }
}

/// Runs `kernel` on staged copies of `desc`'s operands (whose regions `acc` lists, already checked),
/// then converts the written ones back and frees the copies, whatever happened.
///
/// `InvalidArgument` when the kernel cannot run even on aligned f32 copies (an operand past what its
/// 32-bit indices reach, a head dim above the attention kernel's 1024, more workgroups than the
/// device's grid holds).
pub(crate) fn run_staged<D: OpDesc>(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &mut Memory,
    acc: Accesses,
    desc: &D,
    poison: bool,
    kernel: impl Fn(&Gpu, &Kernels, &Memory, &D) -> Result<Launch>,
) -> Result<()> {
    let op = acc.op;
    let mut staging = Staging {
        gpu,
        kernels,
        regions: acc.regions,
        copies: Vec::new(),
        poison,
    };
    let staged = staged(desc, |name, dtype| staging.stage(mem, name, dtype));
    let result = staged.and_then(|staged| match kernel(gpu, kernels, mem, &staged)? {
        Launch::Done => staging.write_back(mem),
        // A limit of the kernels, not a mistake of the caller's: the op is valid elsewhere.
        Launch::Stage => Err(BackendError::FeatureUnavailable {
            feature: "ops beyond the WebGPU kernels' reach",
            reason: format!(
                "{op}: an operand past 2^32 elements, a head dim above 1024, or more workgroups \
                 than the device's grid holds"
            ),
        }),
    });
    for c in &staging.copies {
        let _ = mem.free(c.copy);
    }
    result
}
