//! Host side of `shaders/elementwise.wgsl`: f32 fill, unary and binary ops and strided copies, and
//! f16 unary and binary ops on devices with `SHADER_F16` (f16 storage, f32 math, one rounding).
//!
//! Operands are coalesced (unit dims dropped, dims contiguous in every operand merged), then passed
//! as parameter words: shape, and each view's element offset and strides. Every word is a `u32`, so a
//! view whose offsets or extent do not fit in 32 bits, or whose rank stays above 8 after coalescing,
//! answers [`Launch::Stage`], as do misaligned operands and other dtypes (f16 without `SHADER_F16`);
//! fills and copies of those go to `cast.wgsl`, and math ops are staged (`staging.rs`).

use crate::compute::{
    BinaryDesc, BinaryOp, CopyDesc, FillDesc, StridedBuf, UnaryBackwardDesc, UnaryDesc, UnaryOp,
    Value,
};
use crate::dtype::{rounded, DType};
use crate::error::Result;
use crate::shape::{coalesce, Layout};

use super::cast;
use super::context::Gpu;
use super::large::{pieces, Plan};
use super::math_dtype;
use super::memory::{Binding, Memory};
use super::pipelines::{
    for_dtype, grid_1d, Dispatch, Kernels, Module, ELEMENTWISE, ELEMENTWISE_F16,
};
use crate::backends::webgpu::WebGpuBackend;
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::Temporaries;

/// Most dims the kernels index.
const MAX_RANK: usize = 8;
/// Parameter words: n, rank, shape[8], three views of nine words, the scalar.
const WORDS: usize = 2 + MAX_RANK + 3 * (1 + MAX_RANK) + 1;

/// Whether a kernel was launched, or the operands must be staged first.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Launch {
    /// The kernel was submitted.
    Done,
    /// The kernel cannot index these operands as they are (f16 or bf16 elements, a misaligned
    /// operand, offsets or extents beyond 32 bits, rank above 8 after coalescing): the caller stages
    /// them into aligned f32 copies (`staging.rs`) and launches again.
    Stage,
}

/// A view's place: its wgpu buffer and element offset there, and its strides (after coalescing).
struct View<'a> {
    buffer: Binding<'a>,
    offset: usize,
    strides: Vec<usize>,
}

/// The parameter words for `n` elements over `shape` with up to three views (output first); `None`
/// when a number does not fit the kernel's 32-bit words.
fn params(n: usize, shape: &[usize], views: &[&View<'_>], scalar: u32) -> Option<Vec<u32>> {
    if shape.len() > MAX_RANK {
        return None;
    }
    let word = |v: usize| u32::try_from(v).ok();
    let mut p = vec![0u32; WORDS];
    p[0] = word(n)?;
    p[1] = word(shape.len())?;
    for (d, &extent) in shape.iter().enumerate() {
        p[2 + d] = word(extent)?;
    }
    for (k, v) in views.iter().enumerate() {
        let at = 2 + MAX_RANK + k * (1 + MAX_RANK);
        // The last element must be addressable too.
        let last = shape
            .iter()
            .zip(&v.strides)
            .try_fold(v.offset, |acc, (&e, &s)| {
                acc.checked_add(e.saturating_sub(1).checked_mul(s)?)
            })?;
        word(last)?;
        p[at] = word(v.offset)?;
        for (d, &s) in v.strides.iter().enumerate() {
            p[at + 1 + d] = word(s)?;
        }
    }
    p[WORDS - 1] = scalar;
    Some(p)
}

/// Launches `kernel` (a module and its entry point) over `n` elements with the output view and up
/// to two input views.
fn launch(
    gpu: &Gpu,
    kernels: &Kernels,
    (module, entry): (Module, &'static str),
    op: u64,
    shape: &[usize],
    views: [Option<&View<'_>>; 3],
    scalar: u32,
) -> Result<Launch> {
    let n: usize = shape.iter().product();
    let present: Vec<&View<'_>> = views.iter().flatten().copied().collect();
    let Some(words) = params(n, shape, &present, scalar) else {
        return Ok(Launch::Stage);
    };
    // Bindings: a, b, out; an absent operand binds the output buffer (never read).
    let out = present[0].buffer;
    let a = views[1].map_or(out, |v| v.buffer);
    let b = views[2].map_or(out, |v| v.buffer);
    let dense = shape.len() <= 1 && present.iter().all(|v| v.strides.iter().all(|&s| s == 1));
    kernels.dispatch(
        gpu,
        Dispatch {
            module,
            entry,
            constants: &[("OP", op), ("DENSE", u64::from(dense))],
            buffers: &[a, b, out],
            params: &words,
            groups: grid_1d(n, gpu.limits.max_compute_workgroups_per_dimension)?,
            loops: super::loops::ELEMENTWISE,
        },
    )?;
    Ok(Launch::Done)
}

/// Views of `bufs` (elements of `size` bytes) over their common coalesced shape; `None` when one is
/// misaligned.
fn views<'a, const K: usize>(
    mem: &'a Memory,
    op: &'static str,
    size: usize,
    bufs: [&StridedBuf; K],
) -> Result<Option<(Vec<usize>, Vec<View<'a>>)>> {
    let layouts: [&Layout; K] = std::array::from_fn(|i| &bufs[i].layout);
    let (shape, strides) = coalesce(op, layouts)?;
    let mut out = Vec::with_capacity(K);
    for (buf, strides) in bufs.iter().zip(strides) {
        let Some((buffer, offset)) = mem.view_elements(buf.ptr, buf.layout.offset(), size)? else {
            return Ok(None);
        };
        out.push(View {
            buffer,
            offset,
            strides,
        });
    }
    Ok(Some((shape, out)))
}

/// f32 fill at an aligned address; anything else goes to `cast.wgsl`.
pub(crate) fn fill(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &FillDesc) -> Result<()> {
    if d.dtype == DType::F32 {
        let out = StridedBuf::contiguous(d.ptr, &[d.len]);
        if let Some((shape, v)) = views(mem, "fill", 4, [&out])? {
            let launched = launch(
                gpu,
                kernels,
                (ELEMENTWISE, "fill"),
                0,
                &shape,
                [Some(&v[0]), None, None],
                (d.value as f32).to_bits(),
            )?;
            if launched == Launch::Done {
                return Ok(());
            }
        }
    }
    cast::fill(gpu, kernels, mem, d)
}

/// f32 unary op (and f16 where the device has `SHADER_F16`).
pub(crate) fn unary(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &UnaryDesc) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, ELEMENTWISE, ELEMENTWISE_F16) else {
        return Ok(Launch::Stage);
    };
    let out = StridedBuf::contiguous(d.output, d.input.layout.shape());
    let Some((shape, v)) = views(mem, "unary", size, [&out, &d.input])? else {
        return Ok(Launch::Stage);
    };
    launch(
        gpu,
        kernels,
        (module, "unary"),
        u64::from(d.op.code()),
        &shape,
        [Some(&v[0]), Some(&v[1]), None],
        0,
    )
}

/// f32 binary op with broadcasting by strides (and f16 where the device has `SHADER_F16`); a scalar
/// `rhs` travels as a parameter word (`binary_scalar`), as f32 bits of the value the caller rounded
/// to the dtype ([`rounded_scalar`]).
pub(crate) fn binary(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &BinaryDesc) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, ELEMENTWISE, ELEMENTWISE_F16) else {
        return Ok(Launch::Stage);
    };
    let out = StridedBuf::contiguous(d.output, d.lhs.layout.shape());
    let code = u64::from(d.op.code());
    let Value::Tensor(rhs) = &d.rhs else {
        let Some((shape, v)) = views(mem, "binary", size, [&out, &d.lhs])? else {
            return Ok(Launch::Stage);
        };
        let bits = match d.rhs {
            Value::Scalar(s) => (s as f32).to_bits(),
            Value::Tensor(_) => 0,
        };
        let views = [Some(&v[0]), Some(&v[1]), None];
        return launch(
            gpu,
            kernels,
            (module, "binary_scalar"),
            code,
            &shape,
            views,
            bits,
        );
    };
    let Some((shape, v)) = views(mem, "binary", size, [&out, &d.lhs, rhs])? else {
        return Ok(Launch::Stage);
    };
    let views = [Some(&v[0]), Some(&v[1]), Some(&v[2])];
    launch(gpu, kernels, (module, "binary"), code, &shape, views, 0)
}

/// The backward of a unary op: `binary`'s walk over the saved tensor and the gradient, with the
/// op's derivative (`unary_backward` in `elementwise.wgsl`).
pub(crate) fn unary_backward(
    gpu: &Gpu,
    kernels: &Kernels,
    mem: &Memory,
    d: &UnaryBackwardDesc,
) -> Result<Launch> {
    let Some((module, size)) = for_dtype(gpu, d.dtype, ELEMENTWISE, ELEMENTWISE_F16) else {
        return Ok(Launch::Stage);
    };
    let out = StridedBuf::contiguous(d.output, d.saved.layout.shape());
    let Some((shape, v)) = views(mem, "unary_backward", size, [&out, &d.saved, &d.grad])? else {
        return Ok(Launch::Stage);
    };
    let views = [Some(&v[0]), Some(&v[1]), Some(&v[2])];
    let code = u64::from(d.op.code());
    launch(
        gpu,
        kernels,
        (module, "unary_backward"),
        code,
        &shape,
        views,
        0,
    )
}

/// `desc` as the binary op whose operands and pieces it shares (the op itself unused).
fn as_binary(desc: &UnaryBackwardDesc) -> BinaryDesc {
    BinaryDesc {
        op: BinaryOp::Mul,
        dtype: desc.dtype,
        lhs: desc.saved.clone(),
        rhs: Value::Tensor(desc.grad.clone()),
        output: desc.output,
    }
}

/// A piece of [`as_binary`]'s op back as a backward of `op`.
fn from_binary(op: UnaryOp, piece: BinaryDesc) -> Result<UnaryBackwardDesc> {
    match piece.rhs {
        Value::Tensor(grad) => Ok(UnaryBackwardDesc {
            op,
            dtype: piece.dtype,
            saved: piece.lhs,
            grad,
            output: piece.output,
        }),
        Value::Scalar(_) => Err(crate::error::BackendError::invalid(
            "unary_backward",
            "a piece lost its gradient view (internal error)",
        )),
    }
}

/// `desc` with a scalar `rhs` rounded to its dtype: the f32 kernels (and the f32 copies of staged
/// operands) then compute with exactly the value the reference uses. Every float dtype's values
/// are f32 values except f64's, which WebGPU does not compute in.
fn rounded_scalar(desc: &BinaryDesc) -> BinaryDesc {
    let mut d = desc.clone();
    if let Value::Scalar(s) = &mut d.rhs {
        *s = rounded(d.dtype, *s);
    }
    d
}

/// A strided f32 copy of aligned views; anything else goes to `cast.wgsl` (which moves bits as
/// integers, so patterns that read as f32 subnormals or NaNs stay as they are).
pub(crate) fn copy(gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &CopyDesc) -> Result<()> {
    if d.dtype == DType::F32 {
        if let Some((shape, v)) = views(mem, "copy_strided", 4, [&d.dst, &d.src])? {
            let launched = launch(
                gpu,
                kernels,
                (ELEMENTWISE, "copy"),
                0,
                &shape,
                [Some(&v[0]), Some(&v[1]), None],
                0,
            )?;
            if launched == Launch::Done {
                return Ok(());
            }
        }
    }
    cast::copy(gpu, kernels, mem, d)
}

impl OpImpl<UnaryDesc> for WebGpuBackend {
    fn op(&self, desc: &UnaryDesc) -> Result<()> {
        math_dtype("unary", desc.dtype, desc)?;
        let run = |d: &UnaryDesc| self.run(d, unary);
        match self.plan(desc, desc.dtype, pieces::unary, None)? {
            Plan::Whole | Plan::PastBudget => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // A strided input not even one index of whose leading dim fits a binding: a dense copy
            // of it first (copies cut into tiles), then the op by elements.
            Plan::TooLarge => {
                let temps = Temporaries::new(self);
                let input = self.dense_copy(&temps, desc.dtype, &desc.input)?;
                self.unary(&UnaryDesc {
                    input,
                    ..desc.clone()
                })
            }
        }
    }
}

impl OpImpl<BinaryDesc> for WebGpuBackend {
    fn op(&self, desc: &BinaryDesc) -> Result<()> {
        math_dtype("binary", desc.dtype, desc)?;
        let desc = &rounded_scalar(desc);
        let run = |d: &BinaryDesc| self.run(d, binary);
        match self.plan(desc, desc.dtype, pieces::binary, None)? {
            Plan::Whole | Plan::PastBudget => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // Not even one index of the output's leading dim fits a binding: each is an op of one
            // rank less.
            Plan::TooLarge => pieces::binary_by_index(desc)?
                .iter()
                .try_for_each(|d| self.binary(d)),
        }
    }
}

impl OpImpl<UnaryBackwardDesc> for WebGpuBackend {
    fn op(&self, desc: &UnaryBackwardDesc) -> Result<()> {
        math_dtype("unary_backward", desc.dtype, desc)?;
        let run = |d: &UnaryBackwardDesc| self.run(d, unary_backward);
        let back = |parts: Vec<BinaryDesc>| -> Result<Vec<UnaryBackwardDesc>> {
            parts.into_iter().map(|p| from_binary(desc.op, p)).collect()
        };
        let split = |mem: &Memory, d: &UnaryBackwardDesc| {
            pieces::binary(mem, &as_binary(d))?.map(back).transpose()
        };
        match self.plan(desc, desc.dtype, split, None)? {
            Plan::Whole | Plan::PastBudget => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // Not even one index of the output's leading dim fits a binding: each is an op of one
            // rank less.
            Plan::TooLarge => back(pieces::binary_by_index(&as_binary(desc))?)?
                .iter()
                .try_for_each(|d| self.unary_backward(d)),
        }
    }
}

impl OpImpl<FillDesc> for WebGpuBackend {
    fn op(&self, desc: &FillDesc) -> Result<()> {
        let run = |d: &FillDesc| self.run_direct(d.accesses()?, |gpu, k, mem| fill(gpu, k, mem, d));
        match self.plan(desc, desc.dtype, pieces::fill, None)? {
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            _ => run(desc),
        }
    }
}

impl OpImpl<CopyDesc> for WebGpuBackend {
    fn op(&self, desc: &CopyDesc) -> Result<()> {
        let run = |d: &CopyDesc| self.run_direct(d.accesses()?, |gpu, k, mem| copy(gpu, k, mem, d));
        match self.plan(desc, crate::dtype::DType::F32, pieces::copy, None)? {
            Plan::Whole | Plan::PastBudget => run(desc),
            Plan::Pieces(parts) => parts.iter().try_for_each(run),
            // Strided views not even one index of whose leading dim fits a binding: index by
            // index.
            Plan::TooLarge => pieces::copy_by_index(desc)?
                .iter()
                .try_for_each(|d| self.copy_strided(d)),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backends::webgpu::pipelines::shader_codes;
    use crate::compute::{BinaryOp, UnaryOp};

    #[test]
    fn op_codes_match_the_shader() {
        let src = include_str!("shaders/elementwise.wgsl");
        let unary = shader_codes(src, "UNARY_");
        assert_eq!(unary.len(), UnaryOp::ALL.len(), "UNARY_* constants");
        for &op in UnaryOp::ALL {
            let name = op.name().to_uppercase();
            assert!(unary.contains(&(name.clone(), op.code())), "UNARY_{name}");
        }
        let binary = shader_codes(src, "BINARY_");
        assert_eq!(binary.len(), BinaryOp::ALL.len(), "BINARY_* constants");
        for &op in BinaryOp::ALL {
            let name = op.name().to_uppercase();
            assert!(binary.contains(&(name.clone(), op.code())), "BINARY_{name}");
        }
    }
}
