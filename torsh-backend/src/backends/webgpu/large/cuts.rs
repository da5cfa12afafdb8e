//! The cutting machinery of the large-op plans: ranges of elements that fit one binding, the
//! fewest equal cuts of a dim whose pieces fit, and views narrowed to a piece.

use crate::compute::{Accesses, DevicePtr, StridedBuf};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::Layout;

use super::super::memory::{BindingLimit, Memory};

/// Elements of `widest` bytes per piece: a binding's worth, less room for a window that starts up
/// to one alignment before its piece and ends on a whole word, in multiples of 1024 elements.
pub(super) fn piece_len(limit: BindingLimit, widest: usize) -> usize {
    let room = limit.bytes.saturating_sub(2 * limit.align + 8) / widest as u64;
    ((room as usize) / 1024 * 1024).max(1024)
}

/// The element size a math op's pieces are counted in: `size` times the op's widening
/// ([`Memory::widening`]), as 16-bit dtypes without a native kernel run on f32 copies of the piece
/// (`staging.rs`), which must fit a binding too.
pub(super) fn math_size(mem: &Memory, dtype: DType, acc: &Accesses) -> usize {
    dtype.size_in_bytes() * mem.widening(dtype, acc)
}

/// `ptr` advanced by `elements` of `size` bytes; `SizeOverflow` when that wraps.
pub(crate) fn advance(ptr: DevicePtr, elements: usize, size: usize) -> Result<DevicePtr> {
    elements
        .checked_mul(size)
        .and_then(|bytes| ptr.offset(bytes))
        .ok_or_else(|| BackendError::overflow("webgpu pieces", "pointer + piece offset overflows"))
}

/// Whether `buf` is a dense view of `n` elements.
pub(super) fn dense(buf: &StridedBuf, n: usize) -> bool {
    buf.layout.is_contiguous() && buf.layout.numel() == n
}

/// Elements `start..start + len` of the dense view `buf` of `size`-byte elements, as a 1-D view.
pub(super) fn part(buf: &StridedBuf, size: usize, start: usize, len: usize) -> Result<StridedBuf> {
    let first = advance(buf.ptr, buf.layout.offset(), size)?;
    Ok(StridedBuf::contiguous(advance(first, start, size)?, &[len]))
}

/// The ranges `(start, len)` covering `0..n` in pieces of `widest`-byte elements, when an operand
/// of `n` such elements is larger than one piece; `None` when the op fits as it is.
pub(super) fn ranges(limit: BindingLimit, n: usize, widest: usize) -> Option<Vec<(usize, usize)>> {
    let step = piece_len(limit, widest);
    (n > step).then(|| {
        (0..n)
            .step_by(step)
            .map(|start| (start, step.min(n - start)))
            .collect()
    })
}

/// The pieces `piece(start, len)` of each range, when there are ranges.
pub(super) fn each<D>(
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

/// `whole` split along a dim of `total` independent parts into the fewest equal pieces (2, 4, 8,
/// ... of them) whose accesses all fit one binding per allocation ([`Memory::fits`]), `piece(start,
/// len)` making each; `None` when `whole` fits as it is, or no split along this dim fits (the
/// launch then reports it).
pub(super) fn split<D>(
    mem: &Memory,
    whole: &D,
    dtype: DType,
    total: usize,
    accesses: impl Fn(&D) -> Result<Accesses>,
    piece: impl Fn(usize, usize) -> Result<D>,
) -> Result<Option<Vec<D>>> {
    let fits = |d: &D| -> Result<bool> {
        let acc = accesses(d)?;
        Ok(mem.fits(&acc, mem.widening(dtype, &acc)))
    };
    if fits(whole)? {
        return Ok(None);
    }
    let Some(ranges) = blocks(total, |start, len| fits(&piece(start, len)?))? else {
        return Ok(None);
    };
    ranges
        .into_iter()
        .map(|(start, len)| piece(start, len))
        .collect::<Result<Vec<D>>>()
        .map(Some)
}

/// The fewest equal ranges `(start, len)` covering `0..total` that each pass `fits`, trying
/// ranges of `total / 2`, `total / 4`, ... (rounded up) down to ranges of one ([`cuts`]); `None`
/// when even ranges of one do not pass (or `total` is 0).
pub(crate) fn blocks(
    total: usize,
    fits: impl Fn(usize, usize) -> Result<bool>,
) -> Result<Option<Vec<(usize, usize)>>> {
    if total == 0 {
        return Ok(None);
    }
    // A total of one has only itself to offer; larger ones start at halves.
    for cut in cuts(total).into_iter().skip(usize::from(total > 1)) {
        if all_fit(cut.ranges(), |(start, len)| fits(start, len))? {
            return Ok(Some(cut.ranges().collect()));
        }
    }
    Ok(None)
}

/// Whether `fits` passes every item of `items`, stopping at the first that does not.
pub(super) fn all_fit<T>(
    items: impl IntoIterator<Item = T>,
    mut fits: impl FnMut(T) -> Result<bool>,
) -> Result<bool> {
    for item in items {
        if !fits(item)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `0..total` cut into consecutive ranges of `step` elements, the last holding what is left (one
/// empty range for a total of 0). Ranges are made as they are asked for, so a fine cut of a long
/// dim costs nothing until it is walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cut {
    /// Elements cut.
    pub total: usize,
    /// Elements per range.
    pub step: usize,
}

impl Cut {
    /// How many ranges there are.
    pub fn count(self) -> usize {
        if self.total == 0 {
            1
        } else {
            self.total.div_ceil(self.step)
        }
    }

    /// The longest range's length.
    pub fn longest(self) -> usize {
        self.step.min(self.total)
    }

    /// The ranges `(start, len)`, in order.
    pub fn ranges(self) -> impl Iterator<Item = (usize, usize)> + Clone {
        (0..self.count()).map(move |i| {
            let start = i * self.step;
            (start, self.step.min(self.total - start))
        })
    }
}

/// The ways of cutting `0..total` into equal ranges, whole first: ranges of `total`, then of
/// `total / 2`, `total / 4`, ... (rounded up) down to ranges of one. A total of 0 or 1 has only
/// the whole.
pub(crate) fn cuts(total: usize) -> Vec<Cut> {
    let mut all = vec![Cut { total, step: total }];
    let mut step = total;
    let mut parts = 1usize;
    while step > 1 {
        parts = parts.saturating_mul(2);
        step = total.div_ceil(parts);
        all.push(Cut { total, step });
    }
    all
}

/// [`split`] of an op whose input and output hold `step` dense elements per index of the split dim
/// (at `input` and `output`): `piece(input, output, len)` makes each piece from its own pointers.
#[allow(clippy::too_many_arguments)]
pub(super) fn split_io<D>(
    mem: &Memory,
    whole: &D,
    dtype: DType,
    total: usize,
    step: usize,
    (input, output): (DevicePtr, DevicePtr),
    accesses: impl Fn(&D) -> Result<Accesses>,
    piece: impl Fn(DevicePtr, DevicePtr, usize) -> D,
) -> Result<Option<Vec<D>>> {
    let size = dtype.size_in_bytes();
    split(mem, whole, dtype, total, accesses, |start, len| {
        Ok(piece(
            advance(input, start * step, size)?,
            advance(output, start * step, size)?,
            len,
        ))
    })
}

/// `make(i)` for each index `i` of a leading dim of `lead` indices, each of which is larger than
/// a binding: the ops of one rank less that replace one whose view has `rank` dims.
/// `FeatureUnavailable` for a view of one dim (one element larger than a binding).
pub(super) fn by_index<D>(
    op: &'static str,
    rank: usize,
    lead: usize,
    make: impl Fn(usize) -> Result<D>,
) -> Result<Vec<D>> {
    if rank < 2 {
        return Err(BackendError::FeatureUnavailable {
            feature: "ops spanning more than one storage binding",
            reason: format!("{op}: one element of its operands takes more than a storage binding"),
        });
    }
    (0..lead).map(make).collect()
}

/// Elements of a dense output of `shape` per index of its leading dim.
pub(super) fn per_lead(shape: &[usize]) -> usize {
    shape.iter().skip(1).product()
}

/// The view `buf` narrowed to indices `start..start + len` of its leading dim.
pub(crate) fn leading(buf: &StridedBuf, start: usize, len: usize) -> Result<StridedBuf> {
    narrowed(buf, 0, start, len)
}

/// The view `buf` narrowed to indices `start..start + len` of its dim `dim`.
pub(crate) fn narrowed(
    buf: &StridedBuf,
    dim: usize,
    start: usize,
    len: usize,
) -> Result<StridedBuf> {
    let layout = &buf.layout;
    let mut shape = layout.shape().to_vec();
    shape[dim] = len;
    let offset = layout.offset() + start * layout.strides()[dim];
    Ok(StridedBuf {
        ptr: buf.ptr,
        layout: Layout::new(shape, layout.strides().to_vec(), offset)?,
    })
}

/// The view `buf` at index `index` of its dim `dim`, that dim removed.
pub(crate) fn without_dim(buf: &StridedBuf, dim: usize, index: usize) -> Result<StridedBuf> {
    let layout = &buf.layout;
    let (mut shape, mut strides) = (layout.shape().to_vec(), layout.strides().to_vec());
    shape.remove(dim);
    let stride = strides.remove(dim);
    Ok(StridedBuf {
        ptr: buf.ptr,
        layout: Layout::new(shape, strides, layout.offset() + index * stride)?,
    })
}
