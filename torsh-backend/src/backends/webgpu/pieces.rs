//! Dense elementwise ops over operands larger than one storage binding, run in pieces.
//!
//! A kernel sees at most a binding's worth of each allocation ([`super::memory`]). Fill, cast,
//! copy, unary and binary ops whose operands are all dense views of the same element count (no
//! broadcasting) are the same op on any contiguous range of elements, so when an operand is larger
//! than a piece they run as consecutive ops over ranges that each fit. Other ops on such operands
//! answer `FeatureUnavailable` from the window check.

use crate::compute::{BinaryDesc, CastDesc, CopyDesc, DevicePtr, FillDesc, StridedBuf, UnaryDesc};
use crate::error::{BackendError, Result};

use super::memory::BindingLimit;

/// Elements of `widest` bytes per piece: a binding's worth, less room for a window that starts up
/// to one alignment before its piece and ends on a whole word, in multiples of 1024 elements.
fn piece_len(limit: BindingLimit, widest: usize) -> usize {
    let room = limit.bytes.saturating_sub(2 * limit.align + 8) / widest as u64;
    ((room as usize) / 1024 * 1024).max(1024)
}

/// The element size a math op's pieces are counted in: at least 4 bytes, as 16-bit dtypes without a
/// native kernel run on f32 copies of the piece (`staging.rs`), which must fit a binding too.
fn math_size(size: usize) -> usize {
    size.max(4)
}

/// `ptr` advanced by `elements` of `size` bytes; `SizeOverflow` when that wraps.
fn advance(ptr: DevicePtr, elements: usize, size: usize) -> Result<DevicePtr> {
    elements
        .checked_mul(size)
        .and_then(|bytes| ptr.offset(bytes))
        .ok_or_else(|| BackendError::overflow("webgpu pieces", "pointer + piece offset overflows"))
}

/// Whether `buf` is a dense view of `n` elements.
fn dense(buf: &StridedBuf, n: usize) -> bool {
    buf.layout.is_contiguous() && buf.layout.numel() == n
}

/// Elements `start..start + len` of the dense view `buf` of `size`-byte elements, as a 1-D view.
fn part(buf: &StridedBuf, size: usize, start: usize, len: usize) -> Result<StridedBuf> {
    let first = advance(buf.ptr, buf.layout.offset(), size)?;
    Ok(StridedBuf::contiguous(advance(first, start, size)?, &[len]))
}

/// The ranges `(start, len)` covering `0..n` in pieces of `widest`-byte elements, when an operand
/// of `n` such elements is larger than one piece; `None` when the op fits as it is.
fn ranges(limit: BindingLimit, n: usize, widest: usize) -> Option<Vec<(usize, usize)>> {
    let step = piece_len(limit, widest);
    (n > step).then(|| {
        (0..n)
            .step_by(step)
            .map(|start| (start, step.min(n - start)))
            .collect()
    })
}

/// The pieces `piece(start, len)` of each range, when there are ranges.
fn each<D>(
    ranges: Option<Vec<(usize, usize)>>,
    piece: impl Fn(usize, usize) -> Result<D>,
) -> Result<Option<Vec<D>>> {
    ranges
        .map(|r| {
            r.into_iter()
                .map(|(start, len)| piece(start, len))
                .collect()
        })
        .transpose()
}

/// `desc` as fills of pieces, when its output is larger than a piece.
pub(crate) fn fill(limit: BindingLimit, desc: &FillDesc) -> Result<Option<Vec<FillDesc>>> {
    let size = desc.dtype.size_in_bytes();
    each(ranges(limit, desc.len, size), |start, len| {
        Ok(FillDesc {
            ptr: advance(desc.ptr, start, size)?,
            len,
            ..desc.clone()
        })
    })
}

/// `desc` as casts of pieces, when its input is dense and an operand is larger than a piece.
pub(crate) fn cast(limit: BindingLimit, desc: &CastDesc) -> Result<Option<Vec<CastDesc>>> {
    let n = desc.input.layout.numel();
    let (from, to) = (
        desc.src_dtype.size_in_bytes(),
        desc.dst_dtype.size_in_bytes(),
    );
    let ranges = ranges(limit, n, from.max(to)).filter(|_| dense(&desc.input, n));
    each(ranges, |start, len| {
        Ok(CastDesc {
            input: part(&desc.input, from, start, len)?,
            output: advance(desc.output, start, to)?,
            ..desc.clone()
        })
    })
}

/// `desc` as copies of pieces, when both views are dense and larger than a piece.
pub(crate) fn copy(limit: BindingLimit, desc: &CopyDesc) -> Result<Option<Vec<CopyDesc>>> {
    let n = desc.src.layout.numel();
    let size = desc.dtype.size_in_bytes();
    let ranges = ranges(limit, n, size).filter(|_| dense(&desc.src, n) && dense(&desc.dst, n));
    each(ranges, |start, len| {
        Ok(CopyDesc {
            src: part(&desc.src, size, start, len)?,
            dst: part(&desc.dst, size, start, len)?,
            ..desc.clone()
        })
    })
}

/// `desc` as unary ops on pieces, when its input is dense and larger than a piece.
pub(crate) fn unary(limit: BindingLimit, desc: &UnaryDesc) -> Result<Option<Vec<UnaryDesc>>> {
    let n = desc.input.layout.numel();
    let size = desc.dtype.size_in_bytes();
    let ranges = ranges(limit, n, math_size(size)).filter(|_| dense(&desc.input, n));
    each(ranges, |start, len| {
        Ok(UnaryDesc {
            input: part(&desc.input, size, start, len)?,
            output: advance(desc.output, start, size)?,
            ..desc.clone()
        })
    })
}

/// `desc` as binary ops on pieces, when both inputs are dense views of the output's element count
/// (no broadcasting) and larger than a piece.
pub(crate) fn binary(limit: BindingLimit, desc: &BinaryDesc) -> Result<Option<Vec<BinaryDesc>>> {
    let n = desc.lhs.layout.numel();
    let size = desc.dtype.size_in_bytes();
    let ranges =
        ranges(limit, n, math_size(size)).filter(|_| dense(&desc.lhs, n) && dense(&desc.rhs, n));
    each(ranges, |start, len| {
        Ok(BinaryDesc {
            lhs: part(&desc.lhs, size, start, len)?,
            rhs: part(&desc.rhs, size, start, len)?,
            output: advance(desc.output, start, size)?,
            ..desc.clone()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    const LIMIT: BindingLimit = BindingLimit {
        bytes: 1 << 20,
        align: 256,
    };

    #[test]
    fn pieces_cover_every_element_once_and_each_fits_a_binding() {
        for n in [1, 1023, 262_144, 300_001, 1 << 22] {
            let size = DType::F32.size_in_bytes();
            let step = piece_len(LIMIT, size);
            assert!((step * size) as u64 + 2 * LIMIT.align + 8 <= LIMIT.bytes);
            match ranges(LIMIT, n, size) {
                None => assert!(n <= step),
                Some(r) => {
                    let mut next = 0;
                    for (start, len) in r {
                        assert_eq!(start, next);
                        assert!(len > 0 && len <= step);
                        next = start + len;
                    }
                    assert_eq!(next, n);
                }
            }
        }
    }
}
