//! Shapes and strided layouts: [`Layout`] and the view operations on it (reshape, transpose, permute,
//! narrow, broadcast), plus NumPy broadcasting of shapes.
//!
//! Strides and offsets count elements, not bytes, and are never negative. A stride of 0 repeats an
//! element (broadcasting).

use smallvec::SmallVec;

use crate::error::{BackendError, Result};

/// The dims or strides of a [`Layout`]: up to four held inline, so that making a tensor or a view
/// of rank ≤ 4 allocates nothing for its layout. (Four keeps a tensor within 128 bytes, which
/// moves inline; a larger one is moved by a call to `memcpy`.)
type Dims = SmallVec<[usize; 4]>;

/// Number of elements of `shape`, or `SizeOverflow` if the product does not fit in `usize`.
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d).ok_or_else(|| {
            BackendError::overflow(op, format!("shape {shape:?} has too many elements"))
        })
    })
}

/// Row-major (C-order) strides of `shape`; saturates instead of overflowing (callers check sizes
/// with [`checked_numel`] first).
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    dense_strides(shape).into_vec()
}

/// [`contiguous_strides`] in a layout's inline storage.
fn dense_strides(shape: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![0; shape.len()];
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

/// Resolves a possibly negative axis (`-1` is the last) against `rank`; `InvalidArgument` when out of range.
pub fn normalize_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(BackendError::invalid(
            op,
            format!("axis {axis} is out of range for a tensor of rank {rank}"),
        ));
    }
    Ok(a as usize)
}

/// The NumPy broadcast of two shapes: dims are aligned from the right, and each pair must be equal or
/// contain a 1. `ShapeMismatch` otherwise.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() {
            1
        } else {
            a[i - (rank - a.len())]
        };
        let db = if i < rank - b.len() {
            1
        } else {
            b[i - (rank - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(BackendError::shape(
                    op,
                    format!(
                    "shapes {a:?} and {b:?} cannot be broadcast together (dim {i}: {da} vs {db})"
                ),
                ))
            }
        };
    }
    Ok(out)
}

/// A strided view of a buffer: element `idx` lives at `offset + Σ idx[d] · strides[d]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Dims,
    strides: Dims,
    offset: usize,
}

impl Layout {
    /// A row-major layout of `shape` at offset 0. Callers should check the element count with
    /// [`checked_numel`] (tensor constructors do).
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: Dims::from_slice(shape),
            strides: dense_strides(shape),
            offset: 0,
        }
    }

    /// A layout from its parts; `ShapeMismatch` if `shape` and `strides` differ in length, and
    /// `SizeOverflow` if the furthest element's index overflows.
    pub fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(BackendError::shape(
                "layout",
                format!("shape {shape:?} and strides {strides:?} differ in rank"),
            ));
        }
        let layout = Layout {
            shape: Dims::from_vec(shape),
            strides: Dims::from_vec(strides),
            offset,
        };
        layout.span_elements()?;
        Ok(layout)
    }

    /// The dims.
    #[inline]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Element strides, one per dim.
    #[inline]
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Offset of element `[0, 0, ...]` in elements from the buffer start.
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of dims.
    #[inline]
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (saturating; constructors have checked it fits).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// True when elements are laid out row-major without gaps (dims of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// One past the furthest element index this view can touch, counted from the buffer start
    /// (`offset` for an empty view). `SizeOverflow` if it does not fit in `usize`.
    pub fn span_elements(&self) -> Result<usize> {
        if self.shape.contains(&0) {
            return Ok(self.offset);
        }
        let mut last = self.offset;
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            let step = (d - 1)
                .checked_mul(s)
                .ok_or_else(|| BackendError::overflow("layout", "view extent overflows"))?;
            last = last
                .checked_add(step)
                .ok_or_else(|| BackendError::overflow("layout", "view extent overflows"))?;
        }
        last.checked_add(1)
            .ok_or_else(|| BackendError::overflow("layout", "view extent overflows"))
    }

    /// The same elements with a new shape, without copying. `ShapeMismatch` if the element counts
    /// differ; `Ok(None)` when the strides cannot express the new shape (the caller must copy first).
    /// Use [`Layout::infer_shape`] first to resolve a `-1` dim.
    pub fn reshape(&self, new_shape: &[usize]) -> Result<Option<Layout>> {
        let n = checked_numel("reshape", new_shape)?;
        if n != self.numel() {
            return Err(BackendError::shape(
                "reshape",
                format!(
                    "cannot reshape {:?} ({} elements) into {new_shape:?} ({n} elements)",
                    self.shape,
                    self.numel()
                ),
            ));
        }
        if self.is_contiguous() || n == 0 {
            return Ok(Some(Layout {
                shape: Dims::from_slice(new_shape),
                strides: dense_strides(new_shape),
                offset: self.offset,
            }));
        }
        Ok(self.reshape_strided(new_shape))
    }

    /// Reshape of a non-contiguous view: possible when each group of old dims that merges or splits is
    /// itself contiguous (the rule PyTorch's `view` uses).
    fn reshape_strided(&self, new_shape: &[usize]) -> Option<Layout> {
        // Drop size-1 dims of the old view: their strides do not matter.
        let old: SmallVec<[(usize, usize); 4]> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&d, _)| d != 1)
            .map(|(&d, &s)| (d, s))
            .collect();
        let mut new_strides: Dims = smallvec::smallvec![0; new_shape.len()];
        let (mut oi, mut ni) = (0usize, 0usize);
        while ni < new_shape.len() {
            if new_shape[ni] == 1 {
                new_strides[ni] = 1;
                ni += 1;
                continue;
            }
            // Take a chunk of old dims whose product equals a chunk of new dims.
            let (o_start, n_start) = (oi, ni);
            let (mut o_prod, mut n_prod) = (1usize, 1usize);
            loop {
                if o_prod <= n_prod {
                    let &(d, _) = old.get(oi)?;
                    o_prod *= d;
                    oi += 1;
                } else {
                    n_prod *= *new_shape.get(ni)?;
                    ni += 1;
                }
                if o_prod == n_prod && n_prod > 1 && ni > n_start {
                    break;
                }
            }
            // The old chunk must be contiguous within itself.
            for w in o_start..oi - 1 {
                if old[w].1 != old[w + 1].1 * old[w + 1].0 {
                    return None;
                }
            }
            let mut stride = old[oi - 1].1;
            for k in (n_start..ni).rev() {
                new_strides[k] = stride;
                stride *= new_shape[k].max(1);
            }
        }
        if oi != old.len() {
            return None;
        }
        Some(Layout {
            shape: Dims::from_slice(new_shape),
            strides: new_strides,
            offset: self.offset,
        })
    }

    /// Resolves at most one `-1` in `shape` against `numel`; `ShapeMismatch` if impossible.
    pub fn infer_shape(op: &'static str, shape: &[isize], numel: usize) -> Result<Vec<usize>> {
        let unknown: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] == -1).collect();
        if unknown.len() > 1 || shape.iter().any(|&d| d < -1) {
            return Err(BackendError::shape(
                op,
                format!("{shape:?}: at most one dim may be -1 and no dim may be below -1"),
            ));
        }
        let known = shape
            .iter()
            .filter(|&&d| d >= 0)
            .try_fold(1usize, |a, &d| a.checked_mul(d as usize))
            .ok_or_else(|| BackendError::overflow(op, format!("shape {shape:?} overflows")))?;
        let mut out: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
        if let Some(&i) = unknown.first() {
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(BackendError::shape(
                    op,
                    format!("cannot infer the -1 dim of {shape:?} for {numel} elements"),
                ));
            }
            out[i] = numel / known;
        }
        Ok(out)
    }

    /// Swaps two dims (negative axes count from the end); `InvalidArgument` for an axis out of range.
    pub fn transpose(&self, dim0: isize, dim1: isize) -> Result<Layout> {
        let a = normalize_axis("transpose", dim0, self.rank())?;
        let b = normalize_axis("transpose", dim1, self.rank())?;
        let mut out = self.clone();
        out.shape.swap(a, b);
        out.strides.swap(a, b);
        Ok(out)
    }

    /// Reorders dims: dim `i` of the result is dim `perm[i]` of `self`. `InvalidArgument` unless
    /// `perm` is a permutation of `0..rank`.
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let mut seen = vec![false; self.rank()];
        if perm.len() != self.rank()
            || perm
                .iter()
                .any(|&p| p >= self.rank() || std::mem::replace(&mut seen[p], true))
        {
            return Err(BackendError::invalid(
                "permute",
                format!("{perm:?} is not a permutation of the {} dims", self.rank()),
            ));
        }
        Ok(Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    /// Keeps `len` elements of `dim` starting at `start`; `InvalidArgument` if the range leaves the dim.
    /// An empty result keeps this view's offset: it touches no element, and moving its offset could
    /// put it past the end of an (empty) allocation, which later pointer checks would reject.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Layout> {
        let d = normalize_axis("narrow", dim, self.rank())?;
        let end = start.checked_add(len);
        if end.is_none_or(|e| e > self.shape[d]) {
            return Err(BackendError::invalid(
                "narrow",
                format!(
                    "range {start}..{start}+{len} exceeds dim {d} of size {}",
                    self.shape[d]
                ),
            ));
        }
        let mut out = self.clone();
        out.shape[d] = len;
        if !out.shape.contains(&0) {
            out.offset = self
                .offset
                .checked_add(start * self.strides[d])
                .ok_or_else(|| BackendError::overflow("narrow", "offset overflows"))?;
        }
        Ok(out)
    }

    /// A view of `shape` that repeats this one along new leading dims and along dims of size 1
    /// (stride 0). `ShapeMismatch` when the shapes are not broadcast-compatible this way.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Layout> {
        if shape.len() < self.rank() {
            return Err(BackendError::shape(
                "broadcast_to",
                format!(
                    "cannot broadcast {:?} to the lower-rank shape {shape:?}",
                    self.shape
                ),
            ));
        }
        let lead = shape.len() - self.rank();
        let mut strides: Dims = smallvec::smallvec![0; shape.len()];
        for (i, &target) in shape.iter().enumerate().skip(lead) {
            let (d, s) = (self.shape[i - lead], self.strides[i - lead]);
            strides[i] = if d == target {
                s
            } else if d == 1 {
                0
            } else {
                return Err(BackendError::shape(
                    "broadcast_to",
                    format!(
                        "cannot broadcast {:?} to {shape:?}: dim {i} is {d}",
                        self.shape
                    ),
                ));
            };
        }
        Ok(Layout {
            shape: Dims::from_slice(shape),
            strides,
            offset: self.offset,
        })
    }

    /// Inserts a dim of size 1 at `dim` (`-1` appends). `InvalidArgument` when out of range.
    pub fn unsqueeze(&self, dim: isize) -> Result<Layout> {
        let d = normalize_axis("unsqueeze", dim, self.rank() + 1)?;
        let mut out = self.clone();
        let stride = self
            .strides
            .get(d)
            .map_or(1, |&s| s.saturating_mul(self.shape[d].max(1)));
        out.shape.insert(d, 1);
        out.strides.insert(d, stride);
        Ok(out)
    }

    /// Removes `dim`, which must have size 1 (`InvalidArgument` otherwise).
    pub fn squeeze(&self, dim: isize) -> Result<Layout> {
        let d = normalize_axis("squeeze", dim, self.rank())?;
        if self.shape[d] != 1 {
            return Err(BackendError::invalid(
                "squeeze",
                format!("dim {d} has size {}, not 1", self.shape[d]),
            ));
        }
        let mut out = self.clone();
        out.shape.remove(d);
        out.strides.remove(d);
        Ok(out)
    }

    /// Calls `f` with the element index (relative to the buffer start) of every element, in row-major
    /// order of the view.
    pub fn for_each_index(&self, mut f: impl FnMut(usize)) {
        if self.shape.contains(&0) {
            return;
        }
        let rank = self.rank();
        let mut idx = vec![0usize; rank];
        let mut pos = self.offset;
        loop {
            f(pos);
            let mut d = rank;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                pos += self.strides[d];
                if idx[d] < self.shape[d] {
                    break;
                }
                pos -= self.strides[d] * self.shape[d];
                idx[d] = 0;
            }
        }
    }
}

/// The common shape of `layouts` (which must agree) and each one's strides, with dims of size 1
/// dropped and each dim merged into the next-outer one wherever that is contiguous over it in every
/// layout. Element `i` in row-major order is the same element before and after.
pub(crate) fn coalesce<const K: usize>(
    op: &'static str,
    layouts: [&Layout; K],
) -> Result<(Vec<usize>, [Vec<usize>; K])> {
    let shape = layouts.first().map(|l| l.shape()).unwrap_or(&[]);
    if layouts.iter().any(|l| l.shape() != shape) {
        return Err(BackendError::shape(op, "operand views differ in shape"));
    }
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: [Vec<usize>; K] = std::array::from_fn(|_| Vec::with_capacity(shape.len()));
    for (dim, &extent) in shape.iter().enumerate() {
        if extent == 1 {
            continue;
        }
        // The outer dim's stride must be exactly this dim's extent times its stride, in every layout.
        let merges = !out_shape.is_empty()
            && layouts
                .iter()
                .zip(&out_strides)
                .all(|(l, out)| out.last().copied() == l.strides()[dim].checked_mul(extent));
        match out_shape.last_mut() {
            Some(outer) if merges => {
                *outer *= extent;
                for (l, out) in layouts.iter().zip(out_strides.iter_mut()) {
                    if let Some(s) = out.last_mut() {
                        *s = l.strides()[dim];
                    }
                }
            }
            _ => {
                out_shape.push(extent);
                for (l, out) in layouts.iter().zip(out_strides.iter_mut()) {
                    out.push(l.strides()[dim]);
                }
            }
        }
    }
    Ok((out_shape, out_strides))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indices(l: &Layout) -> Vec<usize> {
        let mut v = Vec::new();
        l.for_each_index(|i| v.push(i));
        v
    }

    #[test]
    fn transpose_and_iteration() {
        let l = Layout::contiguous(&[2, 3]);
        assert_eq!(indices(&l), vec![0, 1, 2, 3, 4, 5]);
        let t = l.transpose(0, 1).unwrap();
        assert_eq!(indices(&t), vec![0, 3, 1, 4, 2, 5]);
        assert!(!t.is_contiguous());
        assert_eq!(t.span_elements().unwrap(), 6);
    }

    #[test]
    fn reshape_of_views() {
        let l = Layout::contiguous(&[4, 6]);
        // A narrowed view keeps rows contiguous: splitting the row dim works.
        let n = l.narrow(1, 0, 3).unwrap();
        let r = n.reshape(&[2, 2, 3]).unwrap().unwrap();
        assert_eq!(indices(&r), indices(&n));
        // Merging rows of a narrowed view is impossible without a copy.
        assert!(n.reshape(&[12]).unwrap().is_none());
        // A transposed view cannot be flattened.
        assert!(l.transpose(0, 1).unwrap().reshape(&[24]).unwrap().is_none());
        assert!(l.reshape(&[5, 5]).is_err());
        assert_eq!(Layout::infer_shape("t", &[-1, 3], 12).unwrap(), vec![4, 3]);
        assert!(Layout::infer_shape("t", &[-1, -1], 12).is_err());
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes("t", &[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert!(broadcast_shapes("t", &[3], &[4]).is_err());
        let b = Layout::contiguous(&[3, 1])
            .broadcast_to(&[2, 3, 4])
            .unwrap();
        assert_eq!(b.strides(), &[0, 1, 0]);
        assert_eq!(indices(&b).len(), 24);
        assert!(Layout::contiguous(&[3]).broadcast_to(&[4]).is_err());
    }

    #[test]
    fn narrow_permute_squeeze() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert!(l.narrow(2, 3, 2).is_err());
        let n = l.narrow(2, 1, 2).unwrap();
        assert_eq!(n.offset(), 1);
        let p = l.permute(&[2, 0, 1]).unwrap();
        assert_eq!(p.shape(), &[4, 2, 3]);
        assert!(l.permute(&[0, 0, 1]).is_err());
        let u = l.unsqueeze(-1).unwrap();
        assert_eq!(u.shape(), &[2, 3, 4, 1]);
        assert_eq!(u.squeeze(3).unwrap(), l);
        assert!(l.squeeze(0).is_err());
        assert!(normalize_axis("t", -4, 3).is_err());
    }

    /// Layouts past the inline rank (four) move their dims to the heap and back without a change
    /// in meaning: each view of a rank-6 layout visits the elements the same view of rank-4
    /// parts predicts, and equality and hashing ignore where the dims are stored.
    #[test]
    fn layouts_beyond_the_inline_rank() {
        use std::hash::{BuildHasher, RandomState};
        let l = Layout::contiguous(&[2, 1, 3, 1, 2, 2]);
        assert_eq!(l.strides(), &[12, 12, 4, 4, 2, 1]);
        assert_eq!(indices(&l), (0..24).collect::<Vec<_>>());
        let p = l.permute(&[5, 4, 3, 2, 1, 0]).unwrap();
        assert_eq!(p.shape(), &[2, 2, 1, 3, 1, 2]);
        assert_eq!(p.strides(), &[1, 2, 4, 4, 12, 12]);
        // Rank 6 reshaped to rank 2 and back: the inline form and the heap form of one layout.
        let flat = l.reshape(&[6, 4]).unwrap().unwrap();
        assert_eq!(flat.strides(), &[4, 1]);
        let back = flat.reshape(&[2, 1, 3, 1, 2, 2]).unwrap().unwrap();
        assert_eq!(back, l);
        let hash = RandomState::new();
        assert_eq!(hash.hash_one(&back), hash.hash_one(&l));
        // Growing a rank-4 layout past four dims, and shrinking it again.
        let four = Layout::contiguous(&[3, 1, 2, 2]);
        let six = four.unsqueeze(0).unwrap().unsqueeze(-1).unwrap();
        assert_eq!(six.shape(), &[1, 3, 1, 2, 2, 1]);
        assert_eq!(six.squeeze(0).unwrap().squeeze(4).unwrap(), four);
        let wide = Layout::contiguous(&[3, 1])
            .broadcast_to(&[2, 2, 2, 2, 3, 4])
            .unwrap();
        assert_eq!(wide.strides(), &[0, 0, 0, 0, 1, 0]);
        assert_eq!(indices(&wide).len(), 192);
        let strided = Layout::new(vec![2, 2, 2, 2, 2], vec![32, 16, 8, 4, 2], 1).unwrap();
        assert_eq!(strided.span_elements().unwrap(), 64);
        assert!(!strided.is_contiguous());
        let merged = strided.reshape(&[4, 2, 4]);
        assert!(
            merged.unwrap().is_some(),
            "rows of stride 2 merge into one dim"
        );
    }
}
