//! One recorded device call of a captured graph: its descriptor, how to run it again, which memory it
//! touches, and how its pointers move when the graph swaps an input's memory for its own copy.

use crate::compute::{
    Access, Accesses, AnyOp, ComputeBackend, DevicePtr, InPlace, StridedBuf, TunableOp,
};
use crate::error::Result;

/// A recorded call.
#[derive(Clone, Debug)]
pub(crate) enum Node {
    /// An op method's call ([`OpDesc::run`](crate::compute::OpDesc::run) repeats it).
    Op(Box<dyn AnyOp>),
    /// A [`ComputeBackend::copy_htod`] of bytes the graph keeps.
    Upload { dst: DevicePtr, bytes: Vec<u8> },
    /// A [`ComputeBackend::copy_dtod`].
    CopyDtod {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    },
    /// A [`ComputeBackend::run_variant`] call: the autotuner's choice.
    Tuned { op: TunableOp, variant: String },
}

impl Node {
    /// Issues the call again on `device`.
    pub fn run(&self, device: &dyn ComputeBackend) -> Result<()> {
        match self {
            Node::Op(op) => op.run(device),
            Node::Upload { dst, bytes } => device.copy_htod(*dst, bytes),
            Node::CopyDtod { dst, src, bytes } => device.copy_dtod(*dst, *src, *bytes),
            Node::Tuned { op, variant } => device.run_variant(op, variant),
        }
    }

    /// The memory the call touches (the descriptor's own shape checks run here).
    pub fn accesses(&self) -> Result<Accesses> {
        match self {
            Node::Op(op) => op.accesses(),
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

    /// Moves every pointer the call holds that falls in one of `moves`.
    pub fn relocate(&mut self, moves: &[Relocation]) {
        let shift = |ptr: &mut DevicePtr| {
            if let Some(moved) = moves.iter().find_map(|m| m.apply(*ptr)) {
                *ptr = moved;
            }
        };
        match self {
            Node::Op(op) => op.operands().iter_mut().for_each(|o| shift(o.ptr_mut())),
            Node::Tuned { op, .. } => op.operands().iter_mut().for_each(|o| shift(o.ptr_mut())),
            Node::Upload { dst, .. } => shift(dst),
            Node::CopyDtod { dst, src, .. } => {
                shift(dst);
                shift(src);
            }
        }
    }
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
