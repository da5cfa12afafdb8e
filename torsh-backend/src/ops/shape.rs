//! Shape ops composed of views, strided copies and other ops, so they run on every backend: `cat`,
//! `stack`, `pad` (constant), `repeat`, `flip`, `clamp`, and reductions over several dims
//! (`sum_dims`, `mean_dims`, `max_dims`, `min_dims`) with `keepdim`.

use crate::backend::Backend;
use crate::compute::{BinaryOp, ReduceOp};
use crate::error::{BackendError, Result};
use crate::shape::normalize_axis;
use crate::tensor::Tensor;

impl Backend {
    /// PyTorch's `cat`: the tensors joined along `dim`, which may differ in length there; every
    /// other dim must match. One strided copy per tensor. Errors: `InvalidArgument` for no tensors
    /// or a dim out of range, `DeviceMismatch` for a tensor of another backend, `DTypeMismatch` for
    /// mixed dtypes, `ShapeMismatch` for ranks or other dims that differ.
    pub fn cat(&self, tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let op = "cat";
        let Some(first) = tensors.first() else {
            return Err(BackendError::invalid(op, "cat needs at least one tensor"));
        };
        let dtype = self.check_operands(op, tensors)?;
        let rank = first.rank();
        if rank == 0 {
            return Err(BackendError::invalid(
                op,
                "0-d tensors cannot be joined along a dim; use stack",
            ));
        }
        let dim = normalize_axis(op, dim, rank)?;
        let mut shape = first.shape().to_vec();
        shape[dim] = 0;
        for t in tensors {
            let fits =
                t.rank() == rank && (0..rank).all(|d| d == dim || t.shape()[d] == first.shape()[d]);
            if !fits {
                return Err(BackendError::shape(
                    op,
                    format!(
                        "{:?} and {:?} differ outside dim {dim}",
                        first.shape(),
                        t.shape()
                    ),
                ));
            }
            shape[dim] += t.shape()[dim];
        }
        let out = self.empty(&shape, dtype)?;
        let mut at = 0;
        for t in tensors {
            let len = t.shape()[dim];
            if len > 0 {
                out.narrow(dim as isize, at, len)?.copy_from(t)?;
            }
            at += len;
        }
        Ok(out)
    }

    /// PyTorch's `stack`: the tensors, all of one shape, joined along a new dim `dim` (counted in the
    /// result's rank). Errors as [`Backend::cat`], `ShapeMismatch` for shapes that differ.
    pub fn stack(&self, tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let op = "stack";
        let Some(first) = tensors.first() else {
            return Err(BackendError::invalid(op, "stack needs at least one tensor"));
        };
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            return Err(BackendError::shape(
                op,
                format!("{:?} and {:?} differ", first.shape(), t.shape()),
            ));
        }
        let dim = normalize_axis(op, dim, first.rank() + 1)? as isize;
        let raised = tensors
            .iter()
            .map(|t| t.unsqueeze(dim))
            .collect::<Result<Vec<_>>>()?;
        self.cat(&raised.iter().collect::<Vec<_>>(), dim)
    }

    /// PyTorch's constant `pad`: `x` with `pads[k] = (before, after)` elements of `value` added to its
    /// `k`-th dim counted from the last (so `&[(left, right), (top, bottom)]` pads an image's width
    /// then height). Errors: `InvalidArgument` for more pairs than dims.
    pub fn pad(&self, x: &Tensor, pads: &[(usize, usize)], value: f64) -> Result<Tensor> {
        let op = "pad";
        self.check_owner(op, x)?;
        if pads.len() > x.rank() {
            return Err(BackendError::invalid(
                op,
                format!(
                    "{} pairs of padding for a tensor of rank {}",
                    pads.len(),
                    x.rank()
                ),
            ));
        }
        let rank = x.rank();
        let mut shape = x.shape().to_vec();
        for (k, &(before, after)) in pads.iter().enumerate() {
            let d = rank - 1 - k;
            shape[d] = before
                .checked_add(after)
                .and_then(|p| p.checked_add(shape[d]))
                .ok_or_else(|| BackendError::overflow(op, "padded length overflows"))?;
        }
        let out = self.full(&shape, value, x.dtype())?;
        if x.numel() > 0 {
            let mut inner = out.clone();
            for (k, &(before, _)) in pads.iter().enumerate() {
                let d = rank - 1 - k;
                inner = inner.narrow(d as isize, before, x.shape()[d])?;
            }
            inner.copy_from(x)?;
        }
        Ok(out)
    }

    /// PyTorch's `repeat`: `x` tiled `times[d]` times along each dim; `times` may be longer than the
    /// rank (new leading dims). One strided copy from a broadcast view. Errors: `InvalidArgument`
    /// for fewer counts than dims, `SizeOverflow` for a result too large.
    pub fn repeat(&self, x: &Tensor, times: &[usize]) -> Result<Tensor> {
        let op = "repeat";
        self.check_owner(op, x)?;
        if times.len() < x.rank() {
            return Err(BackendError::invalid(
                op,
                format!(
                    "{} repeat counts for a tensor of rank {}",
                    times.len(),
                    x.rank()
                ),
            ));
        }
        let lead = times.len() - x.rank();
        let mut base = vec![1usize; lead];
        base.extend_from_slice(x.shape());
        // [1, s0, 1, s1, ...] broadcast to [t0, s0, t1, s1, ...], copied, then merged pairwise.
        let interleaved: Vec<usize> = base.iter().flat_map(|&s| [1, s]).collect();
        let wide: Vec<usize> = times
            .iter()
            .zip(&base)
            .flat_map(|(&t, &s)| [t, s])
            .collect();
        let shape: Vec<usize> = times
            .iter()
            .zip(&base)
            .map(|(&t, &s)| t.checked_mul(s))
            .collect::<Option<_>>()
            .ok_or_else(|| BackendError::overflow(op, "repeated length overflows"))?;
        crate::shape::checked_numel(op, &shape)?;
        x.reshape(&interleaved)?
            .broadcast_to(&wide)?
            .contiguous()?
            .reshape(&shape)
    }

    /// PyTorch's `flip`: `x` with the order of its elements reversed along each of `dims` (negative
    /// count from the end). One `index_select` by a reversed index per dim, so every backend runs
    /// it (a pass over the tensor per dim). Errors: `InvalidArgument` for a dim out of range or named
    /// twice.
    pub fn flip(&self, x: &Tensor, dims: &[isize]) -> Result<Tensor> {
        let op = "flip";
        self.check_owner(op, x)?;
        let rank = x.rank().max(1);
        let mut seen = Vec::with_capacity(dims.len());
        for &d in dims {
            let d = normalize_axis(op, d, rank)?;
            if seen.contains(&d) {
                return Err(BackendError::invalid(
                    op,
                    format!("dims {dims:?} name one dim twice"),
                ));
            }
            seen.push(d);
        }
        let mut out = x.copy()?;
        for d in seen {
            let n = out.shape().get(d).copied().unwrap_or(1);
            if n > 1 {
                let reversed: Vec<i64> = (0..n as i64).rev().collect();
                let index = self.from_slice(&reversed, &[n])?;
                out = out.index_select(d as isize, &index)?;
            }
        }
        Ok(out)
    }

    /// PyTorch's `clamp`: each element of `x` limited to `[min, max]` (either bound optional), as
    /// `minimum(maximum(x, min), max)`, so NaN stays NaN and `min > max` gives `max` everywhere.
    /// One new tensor; the second bound applies in place. Errors: `InvalidArgument` when neither
    /// bound is given, and those of the elementwise ops.
    pub fn clamp(&self, x: &Tensor, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        let op = "clamp";
        self.check_owner(op, x)?;
        match (min, max) {
            (None, None) => Err(BackendError::invalid(
                op,
                "clamp needs a min, a max or both",
            )),
            (Some(lo), None) => x.maximum_scalar(lo),
            (None, Some(hi)) => x.minimum_scalar(hi),
            (Some(lo), Some(hi)) => {
                let out = x.maximum_scalar(lo)?;
                self.binary_scalar_into(BinaryOp::Minimum, &out, hi, &out)?;
                Ok(out)
            }
        }
    }

    /// Reduces `x` over several dims at once (negative counts from the end; no dims: a copy), the
    /// result dropping them or keeping them with size 1 when `keepdim`, as `x.sum((0, 2, 3))` does in
    /// PyTorch. The reduced dims are moved last and merged, so one reduction kernel runs (after a
    /// copy where the merge needs one), and a mean is exact over all of them. Errors as
    /// [`Backend::reduce`], and `InvalidArgument` for a dim named twice.
    pub fn reduce_dims(
        &self,
        op: ReduceOp,
        x: &Tensor,
        dims: &[isize],
        keepdim: bool,
    ) -> Result<Tensor> {
        let name = op.name();
        self.check_owner(name, x)?;
        let mut reduced = dims
            .iter()
            .map(|&d| normalize_axis(name, d, x.rank()))
            .collect::<Result<Vec<_>>>()?;
        reduced.sort_unstable();
        if reduced.windows(2).any(|w| w[0] == w[1]) {
            return Err(BackendError::invalid(
                name,
                format!("dims {dims:?} name one dim twice"),
            ));
        }
        if reduced.is_empty() {
            return x.copy();
        }
        let kept: Vec<usize> = (0..x.rank()).filter(|d| !reduced.contains(d)).collect();
        let perm: Vec<usize> = kept.iter().chain(&reduced).copied().collect();
        let mut merged: Vec<usize> = kept.iter().map(|&d| x.shape()[d]).collect();
        merged.push(reduced.iter().map(|&d| x.shape()[d]).product());
        let y = x.permute(&perm)?.reshape(&merged)?;
        let out = self.reduce(op, &y, -1, false)?;
        if keepdim {
            let shape: Vec<usize> = (0..x.rank())
                .map(|d| {
                    if reduced.contains(&d) {
                        1
                    } else {
                        x.shape()[d]
                    }
                })
                .collect();
            out.reshape(&shape)
        } else {
            Ok(out)
        }
    }
}

impl Tensor {
    /// This tensor padded with `value`; see [`Backend::pad`].
    pub fn pad(&self, pads: &[(usize, usize)], value: f64) -> Result<Tensor> {
        self.backend().pad(self, pads, value)
    }

    /// This tensor tiled; see [`Backend::repeat`].
    pub fn repeat(&self, times: &[usize]) -> Result<Tensor> {
        self.backend().repeat(self, times)
    }

    /// This tensor reversed along `dims`; see [`Backend::flip`].
    pub fn flip(&self, dims: &[isize]) -> Result<Tensor> {
        self.backend().flip(self, dims)
    }

    /// This tensor limited to `[min, max]`; see [`Backend::clamp`].
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        self.backend().clamp(self, min, max)
    }

    /// Sum over `dims`; see [`Backend::reduce_dims`].
    pub fn sum_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.backend()
            .reduce_dims(ReduceOp::Sum, self, dims, keepdim)
    }

    /// Mean over `dims`; see [`Backend::reduce_dims`].
    pub fn mean_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.backend()
            .reduce_dims(ReduceOp::Mean, self, dims, keepdim)
    }

    /// Maximum over `dims`; see [`Backend::reduce_dims`].
    pub fn max_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.backend()
            .reduce_dims(ReduceOp::Max, self, dims, keepdim)
    }

    /// Minimum over `dims`; see [`Backend::reduce_dims`].
    pub fn min_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.backend()
            .reduce_dims(ReduceOp::Min, self, dims, keepdim)
    }
}
