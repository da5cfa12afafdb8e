//! One recorded device call of a captured graph: its descriptor, how to run it again, which memory it
//! touches, and how its pointers move when the graph swaps an input's memory for its own copy.

use crate::compute::{
    Access, Accesses, AdamDesc, AttentionDesc, BatchNormDesc, BatchedGemmDesc, BinaryDesc,
    CastDesc, ComputeBackend, Conv2dDesc, CopyDesc, DevicePtr, FillDesc, GemmDesc, GemvDesc,
    InPlace, LayerNormDesc, Pool2dDesc, ReduceDesc, SoftmaxDesc, StridedBuf, TunableOp, UnaryDesc,
    UnscaleDesc,
};
use crate::error::Result;

/// The device pointers a descriptor holds, for relocation.
trait Pointers {
    fn pointers_mut(&mut self) -> Vec<&mut DevicePtr>;
}

macro_rules! pointers {
    ($($desc:ty { $($field:ident),* $(; optional $($opt:ident),*)? $(; strided $($buf:ident),*)? })*) => {
        $(
            impl Pointers for $desc {
                fn pointers_mut(&mut self) -> Vec<&mut DevicePtr> {
                    [$(&mut self.$field),*]
                        .into_iter()
                        $($(.chain(self.$opt.as_mut()))*)?
                        $($(.chain(std::iter::once(&mut self.$buf.ptr)))*)?
                        .collect()
                }
            }
        )*
    };
}

pointers! {
    GemmDesc { a, b, c }
    GemvDesc { a, x, y }
    Conv2dDesc { input, weight, output; optional bias }
    AttentionDesc { q, k, v, o }
    ReduceDesc { output; strided input }
    UnaryDesc { output; strided input }
    BinaryDesc { output; strided lhs, rhs }
    SoftmaxDesc { input, output }
    LayerNormDesc { input, output; optional weight, bias }
    BatchNormDesc { input, output; optional weight, bias, running_mean, running_var }
    Pool2dDesc { input, output }
    AdamDesc { params, grads, exp_avg, exp_avg_sq }
    UnscaleDesc { input, output, found_inf }
    FillDesc { ptr }
    CastDesc { output; strided input }
    CopyDesc { ; strided src, dst }
}

impl Pointers for BatchedGemmDesc {
    fn pointers_mut(&mut self) -> Vec<&mut DevicePtr> {
        self.gemm.pointers_mut()
    }
}

macro_rules! nodes {
    ($($variant:ident($desc:ty) => $method:ident),* $(,)?) => {
        /// A recorded call.
        #[derive(Clone, Debug)]
        pub(crate) enum Node {
            $(
                #[doc = concat!("A [`ComputeBackend::", stringify!($method), "`] call.")]
                $variant($desc),
            )*
            /// A [`ComputeBackend::copy_htod`] of bytes the graph keeps.
            Upload { dst: DevicePtr, bytes: Vec<u8> },
            /// A [`ComputeBackend::copy_dtod`].
            CopyDtod { dst: DevicePtr, src: DevicePtr, bytes: usize },
            /// A [`ComputeBackend::run_variant`] call: the autotuner's choice.
            Tuned { op: TunableOp, variant: String },
        }

        impl Node {
            /// Issues the call again on `device`.
            pub fn run(&self, device: &dyn ComputeBackend) -> Result<()> {
                match self {
                    $(Node::$variant(d) => device.$method(d),)*
                    Node::Upload { dst, bytes } => device.copy_htod(*dst, bytes),
                    Node::CopyDtod { dst, src, bytes } => device.copy_dtod(*dst, *src, *bytes),
                    Node::Tuned { op, variant } => device.run_variant(op, variant),
                }
            }

            /// The memory the call touches (the descriptor's own shape checks run here).
            pub fn accesses(&self) -> Result<Accesses> {
                match self {
                    $(Node::$variant(d) => d.accesses(),)*
                    Node::Upload { dst, bytes } => {
                        let mut acc = Accesses::new("copy_htod", InPlace::Forbidden);
                        acc.push("dst", *dst, bytes.len(), Access::Write, true);
                        Ok(acc)
                    }
                    Node::CopyDtod { dst, src, bytes } => {
                        let mut acc = Accesses::new("copy_dtod", InPlace::Forbidden);
                        acc.push("src", *src, *bytes, Access::Read, true);
                        acc.push("dst", *dst, *bytes, Access::Write, true);
                        Ok(acc)
                    }
                    Node::Tuned { op, .. } => op.accesses(),
                }
            }

            /// Every device pointer the call holds.
            fn pointers_mut(&mut self) -> Vec<&mut DevicePtr> {
                match self {
                    $(Node::$variant(d) => d.pointers_mut(),)*
                    Node::Upload { dst, .. } => vec![dst],
                    Node::CopyDtod { dst, src, .. } => vec![dst, src],
                    Node::Tuned { op, .. } => op.pointers_mut(),
                }
            }
        }
    };
}

nodes! {
    Gemm(GemmDesc) => gemm,
    BatchedGemm(BatchedGemmDesc) => batched_gemm,
    Gemv(GemvDesc) => gemv,
    Conv2d(Conv2dDesc) => conv2d_forward,
    Attention(AttentionDesc) => attention,
    Reduce(ReduceDesc) => reduce,
    Unary(UnaryDesc) => unary,
    Binary(BinaryDesc) => binary,
    Softmax(SoftmaxDesc) => softmax,
    LayerNorm(LayerNormDesc) => layer_norm,
    BatchNorm(BatchNormDesc) => batch_norm,
    Pool2d(Pool2dDesc) => pool2d,
    Adam(AdamDesc) => adam_step,
    Unscale(UnscaleDesc) => unscale_and_check,
    Fill(FillDesc) => fill,
    Cast(CastDesc) => cast,
    Copy(CopyDesc) => copy_strided,
}

/// Moves pointers that fall in `[from, from + bytes)` by the same distance onto `to`. The end is
/// excluded: it may be the start of a neighbouring allocation (pool blocks are adjacent).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Relocation {
    pub from: DevicePtr,
    pub bytes: usize,
    pub to: DevicePtr,
}

impl Relocation {
    /// `ptr` moved when it falls in this relocation's range.
    pub fn apply(&self, ptr: DevicePtr) -> Option<DevicePtr> {
        let offset = ptr.0.checked_sub(self.from.0)?;
        let inside = offset < self.bytes as u64 || (self.bytes == 0 && offset == 0);
        inside.then(|| DevicePtr(self.to.0 + offset))
    }
}

impl Node {
    /// Moves every pointer that falls in one of `moves`.
    pub fn relocate(&mut self, moves: &[Relocation]) {
        for ptr in self.pointers_mut() {
            if let Some(moved) = moves.iter().find_map(|m| m.apply(*ptr)) {
                *ptr = moved;
            }
        }
    }
}

/// `buf` with its base pointer moved by the first of `moves` that covers it.
pub(crate) fn relocate_buf(buf: &StridedBuf, moves: &[Relocation]) -> StridedBuf {
    let ptr = moves
        .iter()
        .find_map(|m| m.apply(buf.ptr))
        .unwrap_or(buf.ptr);
    StridedBuf {
        ptr,
        layout: buf.layout.clone(),
    }
}
