//! [`Tensor`]: a strided view of device memory owned by one [`Backend`].
//!
//! Views (`reshape`, `transpose`, `permute`, `narrow`, `broadcast_to`, `unsqueeze`, `squeeze`) share
//! memory and cost nothing; every op accepts them, copying internally where a kernel needs a dense
//! operand. Memory returns to the backend when the last tensor sharing it is dropped. Tensors are
//! handles, like PyTorch's: ops that update state in place (running statistics, optimizer steps) write
//! through them.

use std::fmt;
use std::sync::Arc;

use crate::backend::Backend;
use crate::compute::{CastDesc, CopyDesc, DevicePtr, StridedBuf};
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{BackendError, Result};
use crate::shape::{checked_numel, Layout};

/// Device memory owned by one allocation; freed on drop.
pub(crate) struct Storage {
    backend: Backend,
    ptr: DevicePtr,
    bytes: usize,
}

impl Storage {
    /// The allocation's base pointer and size in bytes.
    pub(crate) fn extent(&self) -> (DevicePtr, usize) {
        (self.ptr, self.bytes)
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // Freeing a pointer this storage allocated cannot fail unless the backend is already broken;
        // there is no caller to report to from `drop`.
        let _ = self.backend.free_storage(self.ptr);
    }
}

/// An n-dimensional array on one backend.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
    dtype: DType,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.layout.shape())
            .field("dtype", &self.dtype)
            .field("device", &self.device())
            .finish()
    }
}

impl Tensor {
    /// A new uninitialised contiguous tensor on `backend` (contents unspecified; the reference backend
    /// fills them with NaN). `SizeOverflow` when the byte size does not fit; `OutOfMemory` from the backend.
    pub(crate) fn alloc(backend: &Backend, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let numel = checked_numel("alloc", shape)?;
        let bytes = numel.checked_mul(dtype.size_in_bytes()).ok_or_else(|| {
            BackendError::overflow(
                "alloc",
                format!("{shape:?} × {} bytes overflows", dtype.size_in_bytes()),
            )
        })?;
        let ptr = backend.alloc_storage(bytes)?;
        let storage = Arc::new(Storage {
            backend: backend.clone(),
            ptr,
            bytes,
        });
        backend.graph_tap().note_created(&storage);
        Ok(Tensor {
            storage,
            layout: Layout::contiguous(shape),
            dtype,
        })
    }

    /// The same storage under another layout (the caller checked that it fits the storage).
    pub(crate) fn view(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
            dtype: self.dtype,
        }
    }

    /// The dims.
    #[inline]
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The dims (alias of [`Tensor::shape`]).
    pub fn dims(&self) -> &[usize] {
        self.layout.shape()
    }

    /// Number of dims.
    #[inline]
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    /// Number of elements.
    #[inline]
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// The element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The strided layout (shape, strides and offset in elements).
    #[inline]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Element strides.
    #[inline]
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }

    /// True when the elements are row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// The backend that owns the memory.
    #[inline]
    pub fn backend(&self) -> &Backend {
        &self.storage.backend
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> Device {
        let b = self.backend();
        Device {
            backend_type: b.backend_type(),
            index: b.config().device_id,
        }
    }

    /// The allocation's base pointer with this view's layout, for a low-level op.
    pub fn strided_buf(&self) -> StridedBuf {
        self.backend().graph_tap().note_used(self);
        StridedBuf {
            ptr: self.storage.ptr,
            layout: self.layout.clone(),
        }
    }

    /// Pointer to element `[0, 0, ...]`; only meaningful to a kernel when the view is contiguous.
    #[inline]
    pub fn data_ptr(&self) -> DevicePtr {
        self.backend().graph_tap().note_used(self);
        DevicePtr(self.storage.ptr.0 + (self.layout.offset() * self.dtype.size_in_bytes()) as u64)
    }

    /// The allocation this view belongs to.
    pub(crate) fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// An identity of the allocation, equal for views that share it.
    pub(crate) fn storage_id(&self) -> usize {
        Arc::as_ptr(&self.storage) as usize
    }

    /// The bytes of the allocation this view can reach: from its first to one past its last
    /// element, relative to the allocation's base. `None` when that overflows.
    pub(crate) fn byte_span(&self) -> Option<(usize, usize)> {
        let size = self.dtype.size_in_bytes();
        let end = self.layout.span_elements().ok()?.checked_mul(size)?;
        let start = self.layout.offset().checked_mul(size)?;
        Some((start, end.max(start)))
    }

    /// True when `self` and `other` share an allocation.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// A row-major copy, or `self` when already contiguous.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = Tensor::alloc(self.backend(), self.shape(), self.dtype)?;
        self.backend().compute().copy_strided(&CopyDesc {
            dtype: self.dtype,
            src: self.strided_buf(),
            dst: out.strided_buf(),
        })?;
        Ok(out)
    }

    /// Copies `src` (same shape and dtype, any backend) into this view, element by element; this is
    /// how in-place updates reach a strided view. `ShapeMismatch`/`DTypeMismatch` on a mismatch,
    /// `Aliasing` when this view repeats elements (broadcast).
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        if src.dtype != self.dtype {
            return Err(BackendError::DTypeMismatch {
                op: "copy_from",
                expected: self.dtype,
                got: src.dtype,
            });
        }
        let src = src.to(self.backend())?;
        self.backend().compute().copy_strided(&CopyDesc {
            dtype: self.dtype,
            src: src.strided_buf(),
            dst: self.strided_buf(),
        })
    }

    /// The same elements with another shape. A view when the strides allow it, else a contiguous copy
    /// (PyTorch's `reshape`). `ShapeMismatch` when element counts differ.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        match self.layout.reshape(shape)? {
            Some(layout) => Ok(self.view(layout)),
            None => {
                let c = self.contiguous()?;
                let layout = c.layout.reshape(shape)?.ok_or_else(|| {
                    BackendError::shape("reshape", "internal: contiguous reshape failed")
                })?;
                Ok(c.view(layout))
            }
        }
    }

    /// [`Tensor::reshape`] with at most one dim given as `-1` and inferred.
    pub fn reshape_infer(&self, shape: &[isize]) -> Result<Tensor> {
        let shape = Layout::infer_shape("reshape", shape, self.numel())?;
        self.reshape(&shape)
    }

    /// A 1-D view (or copy) of all elements.
    pub fn flatten(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])
    }

    /// Swaps two dims (negative dims count from the end). A view.
    pub fn transpose(&self, dim0: isize, dim1: isize) -> Result<Tensor> {
        Ok(self.view(self.layout.transpose(dim0, dim1)?))
    }

    /// The transpose of a 2-D tensor (`InvalidArgument` for another rank). A view.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() != 2 {
            return Err(BackendError::invalid(
                "t",
                format!("t() needs a 2-D tensor, got shape {:?}", self.shape()),
            ));
        }
        self.transpose(0, 1)
    }

    /// Reorders dims: dim `i` of the result is dim `perm[i]`. A view.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        Ok(self.view(self.layout.permute(perm)?))
    }

    /// `len` elements of `dim` from `start`. A view.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        Ok(self.view(self.layout.narrow(dim, start, len)?))
    }

    /// Repeats the tensor to `shape` by NumPy broadcasting rules. A view with stride-0 dims.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        Ok(self.view(self.layout.broadcast_to(shape)?))
    }

    /// Inserts a dim of size 1. A view.
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        Ok(self.view(self.layout.unsqueeze(dim)?))
    }

    /// Removes a dim of size 1. A view.
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        Ok(self.view(self.layout.squeeze(dim)?))
    }

    /// The tensor on `backend`: `self` when it already lives there, else a copy through the host.
    pub fn to(&self, backend: &Backend) -> Result<Tensor> {
        if self.backend().same_instance(backend) {
            return Ok(self.clone());
        }
        let bytes = self.to_bytes()?;
        let out = Tensor::alloc(backend, self.shape(), self.dtype)?;
        backend.compute().copy_htod(out.data_ptr(), &bytes)?;
        Ok(out)
    }

    /// The elements in row-major order as little-endian bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let c = self.contiguous()?;
        let len = c
            .numel()
            .checked_mul(c.dtype.size_in_bytes())
            .ok_or_else(|| BackendError::overflow("to_vec", "byte size overflows"))?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|_| BackendError::OutOfMemory {
                requested: len,
                available: 0,
            })?;
        bytes.resize(len, 0);
        c.backend().compute().copy_dtoh(&mut bytes, c.data_ptr())?;
        Ok(bytes)
    }

    /// The elements in row-major order. `DTypeMismatch` unless `T` is this tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(BackendError::DTypeMismatch {
                op: "to_vec",
                expected: self.dtype,
                got: T::DTYPE,
            });
        }
        let bytes = self.to_bytes()?;
        Ok(bytes
            .chunks_exact(self.dtype.size_in_bytes())
            .map(bytemuck::pod_read_unaligned)
            .collect())
    }

    /// The elements in row-major order converted to f64, whatever the dtype.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(match self.dtype {
            DType::F32 => self.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
            DType::F64 => self.to_vec::<f64>()?,
            DType::F16 => self
                .to_vec::<half::f16>()?
                .into_iter()
                .map(|x| x.to_f64())
                .collect(),
            DType::BF16 => self
                .to_vec::<half::bf16>()?
                .into_iter()
                .map(|x| x.to_f64())
                .collect(),
            DType::I32 => self.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
            DType::I64 => self
                .to_vec::<i64>()?
                .into_iter()
                .map(|x| x as f64)
                .collect(),
            DType::U8 => self.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
        })
    }

    /// The value of a one-element tensor as f64. `ShapeMismatch` otherwise.
    pub fn item(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(BackendError::shape(
                "item",
                format!("item() needs one element, shape is {:?}", self.shape()),
            ));
        }
        Ok(self.to_vec_f64()?[0])
    }

    /// A copy converted to `dtype` (see [`CastDesc`] for the conversion rules); `self` when the dtype is
    /// already `dtype`.
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        let out = Tensor::alloc(self.backend(), self.shape(), dtype)?;
        self.backend().compute().cast(&CastDesc {
            src_dtype: self.dtype,
            dst_dtype: dtype,
            input: self.strided_buf(),
            output: out.data_ptr(),
        })?;
        Ok(out)
    }

    /// An independent contiguous copy on the same backend.
    pub fn copy(&self) -> Result<Tensor> {
        let out = Tensor::alloc(self.backend(), self.shape(), self.dtype)?;
        out.copy_from(self)?;
        Ok(out)
    }
}
