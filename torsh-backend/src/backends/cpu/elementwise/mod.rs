//! Unary, binary (with broadcasting), cast, fill, strided copy and random fill on the CPU.
//!
//! Every kernel splits its output into [`for_chunks`] ranges (at least `cost::TASK_ELEMENTS` each,
//! the threading cost model's task) and runs each range inside [`with_simd`]. f32 and f64
//! compute straight from the operands; f16 and bf16 are widened to f32 a [`BLOCK`] at a time with the
//! branch-free conversions of [`vmath`] and rounded once on store. f32-family transcendentals use the
//! vectorisable [`vmath`] functions (sin and cos excepted); f64 uses the standard library and `libm`
//! per element, exactly as the reference does.
//!
//! Strided and broadcast operands are walked as runs along their innermost dim after merging the dims
//! every operand steps through contiguously ([`Dims`]), so a bias add is a loop of dense or
//! scalar-broadcast runs. An output may be exactly a (dense) input: the kernels then only ever hold
//! the output's mutable slice, or read a block into scratch before making it.

use std::ops::Range;

use half::{bf16, f16};

use super::host::{for_chunks, with_float, with_simd, Ctx, Element, Real, Span, View, BLOCK};
use super::vmath;
use super::{blas, SimdLevel};
use crate::backends::cpu::CpuBackend;
use crate::backends::reference::{elementwise as reference, math, memory::HostMemory};
use crate::compute::op::OpImpl;
use crate::compute::ComputeBackend;
use crate::compute::{
    BinaryDesc, BinaryOp, CastDesc, CopyDesc, DevicePtr, Distribution, DropoutDesc, FillDesc,
    RandomDesc, StridedBuf, UnaryDesc, UnaryOp, Value,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::rng;

// Element access.

/// A float element type with vectorisable conversions to and from the type it computes in.
pub(super) trait Lanes: Element {
    /// True when the type is its own compute type (f32, f64).
    const DIRECT: bool;
    /// `xs` itself as compute-type values when the type is its own compute type.
    fn as_acc(xs: &[Self]) -> Option<&[Self::Acc]>;
    /// `xs` itself as compute-type values, mutably, when the type is its own compute type.
    fn as_acc_mut(xs: &mut [Self]) -> Option<&mut [Self::Acc]>;
    /// Widens `src` into `dst` (equal lengths), exactly.
    fn load(src: &[Self], dst: &mut [Self::Acc]);
    /// Rounds `src` into `dst` (equal lengths) to nearest even.
    fn store(src: &[Self::Acc], dst: &mut [Self]);
    /// `v` rounded once to this type, as the reference's `encode` rounds it.
    fn from_f64(v: f64) -> Self;
}

/// [`Lanes`] for a type that is its own compute type.
macro_rules! direct_lanes {
    ($t:ty) => {
        impl Lanes for $t {
            const DIRECT: bool = true;
            #[inline(always)]
            fn as_acc(xs: &[$t]) -> Option<&[$t]> {
                Some(xs)
            }
            #[inline(always)]
            fn as_acc_mut(xs: &mut [$t]) -> Option<&mut [$t]> {
                Some(xs)
            }
            #[inline(always)]
            fn load(src: &[$t], dst: &mut [$t]) {
                dst.copy_from_slice(src);
            }
            #[inline(always)]
            fn store(src: &[$t], dst: &mut [$t]) {
                dst.copy_from_slice(src);
            }
            #[inline(always)]
            fn from_f64(v: f64) -> $t {
                v as $t
            }
        }
    };
}
direct_lanes!(f32);
direct_lanes!(f64);

/// [`Lanes`] for a 16-bit type computed in f32, through `vmath`'s bit conversions.
macro_rules! half_lanes {
    ($t:ty, $widen:path, $narrow:path) => {
        impl Lanes for $t {
            const DIRECT: bool = false;
            #[inline(always)]
            fn as_acc(_: &[$t]) -> Option<&[f32]> {
                None
            }
            #[inline(always)]
            fn as_acc_mut(_: &mut [$t]) -> Option<&mut [f32]> {
                None
            }
            #[inline(always)]
            fn load(src: &[$t], dst: &mut [f32]) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = $widen(s.to_bits());
                }
            }
            #[inline(always)]
            fn store(src: &[f32], dst: &mut [$t]) {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = <$t>::from_bits($narrow(s));
                }
            }
            #[inline(always)]
            fn from_f64(v: f64) -> $t {
                // Rounded once, as the reference rounds (not `half`'s own `from_f64`).
                <$t as crate::dtype::Element>::from_f64(v)
            }
        }
    };
}
half_lanes!(f16, vmath::f16_bits_to_f32, vmath::f32_to_f16_bits);
half_lanes!(bf16, vmath::bf16_bits_to_f32, vmath::f32_to_bf16_bits);

/// A scratch block of compute-type values.
#[inline(always)]
fn scratch<A: Real>() -> [A; BLOCK] {
    [A::ZERO; BLOCK]
}

/// `range` cut into blocks of at most [`BLOCK`] elements.
#[inline(always)]
fn blocks(range: Range<usize>) -> impl Iterator<Item = Range<usize>> {
    let end = range.end;
    range.step_by(BLOCK).map(move |s| s..(s + BLOCK).min(end))
}

/// The span of a strided operand: from its first element (the layout's offset) to its last.
fn raw_span<E: bytemuck::Pod>(
    mem: &mut HostMemory,
    op: &'static str,
    buf: &StridedBuf,
) -> Result<Span<E>> {
    let start = buf.layout.offset();
    let end = buf.layout.span_elements()?;
    let first = DevicePtr(buf.ptr.0 + (start * std::mem::size_of::<E>()) as u64);
    Span::of(mem, op, first, end - start)
}

// Walking strided operands.

/// The dims of an elementwise walk over `K` strided operands in row-major order of their common
/// shape: size-1 dims dropped and neighbouring dims merged where every operand steps through them as
/// one, so the innermost dim is as long as it can be. At least one dim.
#[derive(Clone, Debug)]
pub(super) struct Dims<const K: usize> {
    /// Extents, outermost first.
    shape: Vec<usize>,
    /// Each dim's stride in each operand, in elements.
    strides: Vec<[usize; K]>,
}

impl<const K: usize> Dims<K> {
    /// The walk over `shape` with the operands' `strides`.
    pub(super) fn new(shape: &[usize], strides: [&[usize]; K]) -> Dims<K> {
        // Built innermost first.
        let mut dims: Vec<(usize, [usize; K])> = Vec::with_capacity(shape.len());
        for d in (0..shape.len()).rev() {
            if shape[d] == 1 {
                continue;
            }
            let s: [usize; K] = std::array::from_fn(|k| strides[k][d]);
            if let Some((len, inner)) = dims.last_mut() {
                if (0..K).all(|k| s[k] == inner[k] * *len) {
                    *len *= shape[d];
                    continue;
                }
            }
            dims.push((shape[d], s));
        }
        if dims.is_empty() {
            dims.push((1, [0; K]));
        }
        dims.reverse();
        Dims {
            shape: dims.iter().map(|d| d.0).collect(),
            strides: dims.iter().map(|d| d.1).collect(),
        }
    }

    /// Elements walked.
    pub(super) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The walk over every dim but the innermost (its *rows*), or `None` when there is only one.
    pub(super) fn rows(&self) -> Option<Dims<K>> {
        let last = self.shape.len() - 1;
        (last > 0).then(|| Dims {
            shape: self.shape[..last].to_vec(),
            strides: self.strides[..last].to_vec(),
        })
    }

    /// Length of the innermost dim and each operand's stride along it.
    pub(super) fn inner(&self) -> (usize, [usize; K]) {
        let last = self.shape.len() - 1;
        (self.shape[last], self.strides[last])
    }

    /// Calls `f(first, positions, len)` for each run along the innermost dim inside elements `range`
    /// of the walk: `first` is the run's first element in walk order, `positions` its element offset
    /// in each operand.
    #[inline(always)]
    pub(super) fn runs(&self, range: Range<usize>, mut f: impl FnMut(usize, [usize; K], usize)) {
        let rank = self.shape.len();
        let last = rank - 1;
        let mut idx = vec![0usize; rank];
        let mut pos = [0usize; K];
        let mut rem = range.start;
        for d in (0..rank).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
            for (p, s) in pos.iter_mut().zip(self.strides[d]) {
                *p += idx[d] * s;
            }
        }
        let (inner_len, inner) = self.inner();
        let mut at = range.start;
        while at < range.end {
            let len = (inner_len - idx[last]).min(range.end - at);
            f(at, pos, len);
            at += len;
            idx[last] += len;
            for (p, s) in pos.iter_mut().zip(inner) {
                *p += len * s;
            }
            if idx[last] < inner_len || at == range.end {
                continue;
            }
            // Carry into the outer dims.
            for (p, s) in pos.iter_mut().zip(inner) {
                *p -= inner_len * s;
            }
            idx[last] = 0;
            let mut d = last;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                for (p, s) in pos.iter_mut().zip(self.strides[d]) {
                    *p += s;
                }
                if idx[d] < self.shape[d] {
                    break;
                }
                for (p, s) in pos.iter_mut().zip(self.strides[d]) {
                    *p -= self.shape[d] * s;
                }
                idx[d] = 0;
            }
        }
    }
}

mod backward;
mod binary;
mod cast;
mod copy;
mod random;
#[cfg(test)]
mod tests;
mod unary;
