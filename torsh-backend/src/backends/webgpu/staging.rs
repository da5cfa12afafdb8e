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

/// Gives a staged operand's new pointer: `(region name, element dtype) -> copy`.
pub(crate) type StageFn<'a> = dyn FnMut(&'static str, DType) -> Result<DevicePtr> + 'a;

/// A descriptor whose operands can be replaced by staged copies.
pub(crate) trait Stageable: Sized {
    /// The regions the op touches (the descriptor's own validation).
    fn accesses(&self) -> Result<Accesses>;

    /// This descriptor in f32 over the copies: each operand pointer becomes `to(region, dtype)`, whose
    /// element 0 is the region's first element.
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self>;
}

/// A strided view moved onto its copy: same shape and strides, offset 0.
fn strided(
    buf: &StridedBuf,
    name: &'static str,
    dtype: DType,
    to: &mut StageFn<'_>,
) -> Result<StridedBuf> {
    Ok(StridedBuf {
        ptr: to(name, dtype)?,
        layout: Layout::new(
            buf.layout.shape().to_vec(),
            buf.layout.strides().to_vec(),
            0,
        )?,
    })
}

/// An optional operand moved onto its copy.
fn optional(
    ptr: Option<DevicePtr>,
    name: &'static str,
    dtype: DType,
    to: &mut StageFn<'_>,
) -> Result<Option<DevicePtr>> {
    ptr.map(|_| to(name, dtype)).transpose()
}

impl Stageable for GemmDesc {
    fn accesses(&self) -> Result<Accesses> {
        GemmDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(GemmDesc {
            dtype: DType::F32,
            a: to("a", self.dtype)?,
            b: to("b", self.dtype)?,
            c: to("c", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for BatchedGemmDesc {
    fn accesses(&self) -> Result<Accesses> {
        BatchedGemmDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(BatchedGemmDesc {
            gemm: self.gemm.staged(to)?,
            ..self.clone()
        })
    }
}

impl Stageable for GemvDesc {
    fn accesses(&self) -> Result<Accesses> {
        GemvDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(GemvDesc {
            dtype: DType::F32,
            a: to("a", self.dtype)?,
            x: to("x", self.dtype)?,
            y: to("y", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for Conv2dDesc {
    fn accesses(&self) -> Result<Accesses> {
        Conv2dDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(Conv2dDesc {
            dtype: DType::F32,
            input: to("input", self.dtype)?,
            weight: to("weight", self.dtype)?,
            bias: optional(self.bias, "bias", self.dtype, to)?,
            output: to("output", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for AttentionDesc {
    fn accesses(&self) -> Result<Accesses> {
        AttentionDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(AttentionDesc {
            dtype: DType::F32,
            q: to("q", self.dtype)?,
            k: to("k", self.dtype)?,
            v: to("v", self.dtype)?,
            o: to("o", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for ReduceDesc {
    fn accesses(&self) -> Result<Accesses> {
        ReduceDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(ReduceDesc {
            dtype: DType::F32,
            input: strided(&self.input, "input", self.dtype, to)?,
            output: to("output", self.op.output_dtype(self.dtype))?,
            ..self.clone()
        })
    }
}

impl Stageable for UnaryDesc {
    fn accesses(&self) -> Result<Accesses> {
        UnaryDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(UnaryDesc {
            dtype: DType::F32,
            input: strided(&self.input, "input", self.dtype, to)?,
            output: to("output", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for BinaryDesc {
    fn accesses(&self) -> Result<Accesses> {
        BinaryDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(BinaryDesc {
            dtype: DType::F32,
            lhs: strided(&self.lhs, "lhs", self.dtype, to)?,
            rhs: strided(&self.rhs, "rhs", self.dtype, to)?,
            output: to("output", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for SoftmaxDesc {
    fn accesses(&self) -> Result<Accesses> {
        SoftmaxDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(SoftmaxDesc {
            dtype: DType::F32,
            input: to("input", self.dtype)?,
            output: to("output", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for LayerNormDesc {
    fn accesses(&self) -> Result<Accesses> {
        LayerNormDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(LayerNormDesc {
            dtype: DType::F32,
            input: to("input", self.dtype)?,
            weight: optional(self.weight, "weight", self.dtype, to)?,
            bias: optional(self.bias, "bias", self.dtype, to)?,
            output: to("output", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for BatchNormDesc {
    fn accesses(&self) -> Result<Accesses> {
        BatchNormDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(BatchNormDesc {
            dtype: DType::F32,
            input: to("input", self.dtype)?,
            output: to("output", self.dtype)?,
            weight: optional(self.weight, "weight", self.dtype, to)?,
            bias: optional(self.bias, "bias", self.dtype, to)?,
            running_mean: optional(self.running_mean, "running_mean", self.dtype, to)?,
            running_var: optional(self.running_var, "running_var", self.dtype, to)?,
            ..self.clone()
        })
    }
}

impl Stageable for Pool2dDesc {
    fn accesses(&self) -> Result<Accesses> {
        Pool2dDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(Pool2dDesc {
            dtype: DType::F32,
            input: to("input", self.dtype)?,
            output: to("output", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for AdamDesc {
    fn accesses(&self) -> Result<Accesses> {
        AdamDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(AdamDesc {
            dtype: DType::F32,
            params: to("params", self.dtype)?,
            grads: to("grads", self.dtype)?,
            exp_avg: to("exp_avg", self.dtype)?,
            exp_avg_sq: to("exp_avg_sq", self.dtype)?,
            ..self.clone()
        })
    }
}

impl Stageable for UnscaleDesc {
    fn accesses(&self) -> Result<Accesses> {
        UnscaleDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(UnscaleDesc {
            dtype: DType::F32,
            input: to("input", self.dtype)?,
            output: to("output", self.dtype)?,
            found_inf: to("found_inf", DType::F32)?,
            ..self.clone()
        })
    }
}

impl Stageable for RandomDesc {
    fn accesses(&self) -> Result<Accesses> {
        RandomDesc::accesses(self)
    }
    fn staged(&self, to: &mut StageFn<'_>) -> Result<Self> {
        Ok(RandomDesc {
            dtype: DType::F32,
            ptr: to("output", self.dtype)?,
            ..self.clone()
        })
    }
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
pub(crate) fn run_staged<D: Stageable>(
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
    let staged = desc.staged(&mut |name, dtype| staging.stage(mem, name, dtype));
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
