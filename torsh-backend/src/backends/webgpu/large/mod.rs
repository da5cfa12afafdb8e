//! Ops too large for one launch: operands larger than one storage binding, or loops longer than the
//! loop budget (`loops.rs`). Every op method asks [`WebGpuBackend::plan`] how it runs, and the
//! answer, a [`Plan`], is one of: whole, in pieces, or, where no cut fits or a launch would loop past
//! the budget, the op's own other way (composed of other ops, two passes, by channels, by ranges of
//! the inner dim or of keys).
//!
//! A kernel sees at most a binding's worth of each allocation (`memory.rs`). Fill, cast,
//! copy, unary and binary ops whose operands are all dense views of the same element count (no
//! broadcasting) are the same op on any contiguous range of elements, and a random fill is too once
//! each piece starts at its place in the stream, so when an operand is larger than a piece they run
//! as consecutive ops over ranges that each fit.
//!
//! Ops made of independent parts split along the dim of those parts instead (`cuts::split`):
//! softmax by outer slices, layer norm by rows, a reduction by its leading dim (when it reduces
//! another), Adam and the loss scaler's unscale by elements, a GEMM by column blocks of C, else row
//! blocks, a GEMV by rows, a batched GEMM by batch, conv2d by image, attention by (batch, head),
//! pooling by (image, channel) and batch norm in inference by image; each into the fewest equal
//! parts whose accesses fit, trying 2, 4, 8, ... parts (so an op no split can fit costs a search
//! over its dim before it is refused). A reduction of the leading
//! dim and batch norm in training run in two passes instead (`two_pass.rs`).
//!
//! Where one index of those dims is itself larger than a binding: a GEMM is cut by blocks of C's
//! rows and columns together and, failing those, ranges of the inner dim (`pieces::gemm_cuts`;
//! `split_k.rs` for 16-bit products), a GEMV runs as a one-row GEMM and a batched GEMM product by
//! product, a reduction or broadcasting binary op per leading index as one of a rank less
//! (`two_pass.rs` cuts the outputs of a reduction along the leading dim), a strided copy in tiles
//! (`pieces::tiles`) and a strided unary op or cast on such a dense copy, conv2d by groups and
//! channels of each image (`conv_split.rs`), and softmax, layer norm and batch norm as
//! `composed.rs` describes. A single attention head or pooling plane larger than a binding answers
//! `FeatureUnavailable` from the window check.
//!
//! Pieces are budgeted for the copies their op runs on (`Memory::widening`): their own size where
//! the kernels take the dtype natively, twice that for 16-bit operands staged through f32.

pub(super) mod attention_split;
pub(super) mod composed;
pub(super) mod conv_split;
pub(super) mod cuts;
pub(super) mod pieces;
pub(super) mod split_k;
pub(super) mod two_pass;

use crate::compute::{
    Accesses, BatchedGemmDesc, CopyDesc, GemmDesc, OpDesc, StridedBuf, Temporaries,
};
use crate::dtype::DType;
use crate::error::Result;

use super::context::Gpu;
use super::memory::Memory;
use super::pipelines::Kernels;
use super::{blas, WebGpuBackend};
use crate::compute::ComputeBackend;

/// How an op runs on this device: the one decision each op method makes before it launches.
#[derive(Debug)]
pub(crate) enum Plan<P> {
    /// In one launch.
    Whole,
    /// As these pieces, each an op of its own whose operands fit one binding.
    Pieces(Vec<P>),
    /// Its operands do not fit one binding and no cut into pieces fits (one index of the cut dim
    /// is larger than a binding already): the op's own other way, or whole for ops with none,
    /// whose launch then reports it.
    TooLarge,
    /// A launch would loop past the loop budget: the op's own other way.
    PastBudget,
}

/// An op's loops, for [`WebGpuBackend::plan`]: the elements it writes (0: nothing to launch, however
/// long its dims) and, for a device, the loop passes one invocation of its kernel makes.
pub(crate) struct Loops<'a> {
    pub elements: usize,
    pub passes: &'a dyn Fn(&Gpu) -> u64,
}

impl WebGpuBackend {
    /// How `desc` runs. Its regions are checked against memory first (the allocation table's
    /// errors); then a launch that would loop past the budget (`loops`, for kernels that loop along
    /// a dim) is [`Plan::PastBudget`]; then the pieces `split` cuts it into, when its operands are
    /// larger than one binding; then whole, where its operands fit one binding with room for
    /// staging copies of `dtype` (f32 for ops that run every dtype as it is), or
    /// [`Plan::TooLarge`].
    pub(super) fn plan<D: OpDesc, P>(
        &self,
        desc: &D,
        dtype: DType,
        split: impl Fn(&Memory, &D) -> Result<Option<Vec<P>>>,
        loops: Option<Loops<'_>>,
    ) -> Result<Plan<P>> {
        let acc = desc.accesses()?;
        let state = self.state()?;
        let mem = state.memory();
        mem.table.check_accesses(&acc)?;
        let gpu = &state.device.gpu;
        if let Some(l) = loops {
            if l.elements > 0 && !gpu.loops_fit((l.passes)(gpu)) {
                return Ok(Plan::PastBudget);
            }
        }
        if let Some(parts) = split(&mem, desc)? {
            return Ok(Plan::Pieces(parts));
        }
        Ok(if mem.fits(&acc, mem.widening(dtype, &acc)) {
            Plan::Whole
        } else {
            Plan::TooLarge
        })
    }

    /// `desc`, a batched GEMM whose inner dim is longer than a launch takes within the loop
    /// budget: in f32 as batched GEMMs over ranges of the inner dim, each after the first adding
    /// into C; in 16 bits product by product, as GEMMs (which accumulate such ranges in f32).
    pub(super) fn batched_gemm_by_inner(&self, desc: &BatchedGemmDesc) -> Result<()> {
        let g = &desc.gemm;
        if g.dtype != DType::F32 {
            return (0..desc.batch_count)
                .try_for_each(|i| self.gemm(&pieces::batch_element(desc, i)?));
        }
        let most = blas::max_inner(&self.state()?.device.gpu, blas::Tile::Large).unwrap_or(1);
        let inner = cuts::Cut {
            total: g.k,
            step: g.k.div_ceil(g.k.div_ceil(most)),
        };
        inner.ranges().try_for_each(|k| {
            self.batched_gemm(&BatchedGemmDesc {
                gemm: pieces::gemm_piece(g, [(0, g.m), (0, g.n), k])?,
                ..desc.clone()
            })
        })
    }

    /// A dense copy of `view` (of `dtype`) in a buffer of `temps`, as a view of the same shape.
    pub(super) fn dense_copy(
        &self,
        temps: &Temporaries<'_, Self>,
        dtype: DType,
        view: &StridedBuf,
    ) -> Result<StridedBuf> {
        let shape = view.layout.shape().to_vec();
        let bytes = view.layout.numel() * dtype.size_in_bytes();
        let dense = StridedBuf::contiguous(temps.alloc(bytes)?, &shape);
        self.copy_strided(&CopyDesc {
            dtype,
            src: view.clone(),
            dst: dense.clone(),
        })?;
        Ok(dense)
    }

    /// Runs the GEMM `desc` with `tile`: whole, as the pieces of its cut when it is larger than
    /// one binding or its inner dim longer than a launch takes within the loop budget
    /// ([`pieces::gemm_cuts`]), or, for a 16-bit product cut along the inner dim, accumulating
    /// each block of C in f32 (`split_k.rs`).
    pub(super) fn gemm_with(&self, desc: &GemmDesc, tile: blas::Tile) -> Result<()> {
        let kernel = move |gpu: &Gpu, kernels: &Kernels, mem: &Memory, d: &GemmDesc| {
            blas::gemm_tiled(gpu, kernels, mem, d, tile)
        };
        let acc = desc.accesses()?;
        let state = self.state()?;
        // A product with no output launches nothing, whatever its inner dim.
        let max_inner = if desc.m == 0 || desc.n == 0 {
            usize::MAX
        } else {
            blas::max_inner(&state.device.gpu, tile).unwrap_or(1)
        };
        let plan = {
            let mem = state.memory();
            mem.table.check_accesses(&acc)?;
            pieces::gemm_cuts(&mem, desc, max_inner)?
        };
        match plan {
            None => self.run(desc, kernel),
            Some(plan) if plan.splits_inner() && desc.dtype != DType::F32 => {
                split_k::gemm(self, desc, &plan, |d| self.run(d, kernel))
            }
            Some(plan) => plan
                .pieces()
                .try_for_each(|p| self.run(&pieces::gemm_piece(desc, p)?, kernel)),
        }
    }

    /// Whether a launch whose invocations run `loops(gpu)` loop passes is within the device's loop
    /// budget (`loops.rs`); `NotInitialized` before `init`.
    pub(super) fn loops_fit(&self, loops: impl FnOnce(&Gpu) -> u64) -> Result<bool> {
        let gpu = &self.state()?.device.gpu;
        Ok(gpu.loops_fit(loops(gpu)))
    }

    /// Whether an op of `dtype` over `acc` runs whole: its accesses fit one binding per allocation,
    /// allowing for copies `widen` times larger than its operands (or the op's own staging, when
    /// more). The errors of the allocation table's checks of `acc`.
    pub(super) fn fits(&self, acc: &Accesses, dtype: DType, widen: usize) -> Result<bool> {
        let mem = self.state()?.memory();
        mem.table.check_accesses(acc)?;
        Ok(mem.fits(acc, mem.widening(dtype, acc).max(widen)))
    }
}
