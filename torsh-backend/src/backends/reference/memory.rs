//! Host memory of the reference backend: byte buffers behind synthetic device addresses, checked by an
//! [`AllocationTable`], and conversion of elements to and from f64.

use std::collections::HashMap;

use half::{bf16, f16};

use crate::compute::{AllocationTable, DevicePtr, StridedBuf};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// The byte every fresh allocation is filled with: `0xFF…` is a NaN in every float dtype (and -1 in the
/// signed integers), so an output element a kernel forgot to write cannot pass a comparison.
pub const POISON_BYTE: u8 = 0xFF;

/// Decodes one element of `dtype` from the start of `b` as f64.
pub fn decode(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::F64 => f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
        DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::I32 | DType::I64 | DType::U8 => decode_int(dtype, b) as f64,
    }
}

/// Decodes one integer element of `dtype` (0 for a float dtype: callers branch on the dtype first).
pub fn decode_int(dtype: DType, b: &[u8]) -> i64 {
    match dtype {
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
        DType::I64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
        DType::U8 => b[0] as i64,
        _ => 0,
    }
}

/// Encodes `v` as `dtype` into the start of `out`, rounding to nearest for floats and with Rust `as`
/// semantics for integers.
pub fn encode(dtype: DType, v: f64, out: &mut [u8]) {
    match dtype {
        DType::F32 => out[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out[..8].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out[..2].copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::BF16 => out[..2].copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        DType::I32 => out[..4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => out[..8].copy_from_slice(&(v as i64).to_le_bytes()),
        DType::U8 => out[0] = v as u8,
    }
}

/// Encodes integer `v` as `dtype`, wrapping for narrower integers and rounding for floats.
pub fn encode_int(dtype: DType, v: i64, out: &mut [u8]) {
    match dtype {
        DType::I32 => out[..4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => out[..8].copy_from_slice(&v.to_le_bytes()),
        DType::U8 => out[0] = v as u8,
        _ => encode(dtype, v as f64, out),
    }
}

/// 64 bytes aligned to 64: the unit host buffers are made of, so every buffer starts on a cache line
/// and SIMD kernels may assume element alignment at element offsets.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// One allocation: whole cache lines, of which the first `len` bytes are the allocation.
struct Buffer {
    lines: Vec<Line>,
    len: usize,
}

impl Buffer {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes)", self.len)
    }
}

/// The host memory of the reference and CPU backends: 64-byte aligned buffers.
#[derive(Debug, Default)]
pub struct HostMemory {
    /// Live allocations, for every pointer check.
    pub table: AllocationTable,
    buffers: HashMap<u64, Buffer>,
}

impl HostMemory {
    /// Allocates `bytes` filled with [`POISON_BYTE`]. `OutOfMemory` if the host cannot provide them.
    pub fn alloc(&mut self, bytes: usize) -> Result<DevicePtr> {
        let mut lines = Vec::new();
        lines
            .try_reserve_exact(bytes.div_ceil(64))
            .map_err(|_| BackendError::OutOfMemory {
                requested: bytes,
                available: 0,
            })?;
        lines.resize(bytes.div_ceil(64), Line([POISON_BYTE; 64]));
        let ptr = self.table.allocate_synthetic(bytes)?;
        self.buffers.insert(ptr.0, Buffer { lines, len: bytes });
        Ok(ptr)
    }

    /// Frees an allocation by its base pointer.
    pub fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        self.table.remove(ptr)?;
        self.buffers.remove(&ptr.0);
        Ok(())
    }

    /// The `bytes` bytes at `ptr`, after a bounds check.
    pub fn bytes(&self, ptr: DevicePtr, bytes: usize) -> Result<&[u8]> {
        let (base, off) = self.table.check(ptr, bytes)?;
        let buf = self.buffer(base)?;
        Ok(&buf.bytes()[off..off + bytes])
    }

    /// The `bytes` bytes at `ptr`, mutably, after a bounds check.
    pub fn bytes_mut(&mut self, ptr: DevicePtr, bytes: usize) -> Result<&mut [u8]> {
        let (base, off) = self.table.check(ptr, bytes)?;
        let buf = self
            .buffers
            .get_mut(&base.0)
            .ok_or_else(|| lost_buffer(base))?;
        Ok(&mut buf.bytes_mut()[off..off + bytes])
    }

    /// The address in host memory of the `bytes` bytes at `ptr`, after a bounds check, for kernels that
    /// work on raw pointers (the CPU backend's GEMM). The caller holds `&mut self` for as long as it
    /// uses the pointer and has checked the op's regions for aliasing.
    ///
    /// The address comes from `Vec::as_mut_ptr`, which creates no reference to the buffer, so several
    /// addresses into one buffer (two input views of one allocation) stay valid together.
    pub fn host_address(&mut self, ptr: DevicePtr, bytes: usize) -> Result<*mut u8> {
        let (base, off) = self.table.check(ptr, bytes)?;
        let buf = self
            .buffers
            .get_mut(&base.0)
            .ok_or_else(|| lost_buffer(base))?;
        // SAFETY: `off + bytes <= len <= 64 × lines.len()` (checked against the table above), so the
        // offset stays inside the allocation.
        Ok(unsafe { buf.lines.as_mut_ptr().cast::<u8>().add(off) })
    }

    fn buffer(&self, base: DevicePtr) -> Result<&Buffer> {
        self.buffers.get(&base.0).ok_or_else(|| lost_buffer(base))
    }

    /// `len` contiguous elements of `dtype` at `ptr`, as f64.
    pub fn load_dense(&self, dtype: DType, ptr: DevicePtr, len: usize) -> Result<Vec<f64>> {
        let size = dtype.size_in_bytes();
        let bytes = self.bytes(ptr, len * size)?;
        Ok(bytes.chunks_exact(size).map(|c| decode(dtype, c)).collect())
    }

    /// The elements of a strided view in row-major order of the view, as f64. `OutOfMemory` when the
    /// host cannot hold them (a broadcast view may have far more elements than its buffer).
    pub fn load(&self, dtype: DType, buf: &StridedBuf) -> Result<Vec<f64>> {
        let mut out = host_vec(buf.layout.numel())?;
        self.for_each_element(dtype, buf, |b| out.push(decode(dtype, b)))?;
        Ok(out)
    }

    /// Calls `f` with the bytes of each element of a strided view, in row-major order of the view.
    pub fn for_each_element(
        &self,
        dtype: DType,
        buf: &StridedBuf,
        mut f: impl FnMut(&[u8]),
    ) -> Result<()> {
        let size = dtype.size_in_bytes();
        let start = buf.layout.offset();
        let span = buf.layout.span_elements()?;
        let region_start = DevicePtr(buf.ptr.0 + (start * size) as u64);
        let bytes = self.bytes(region_start, (span - start) * size)?;
        buf.layout.for_each_index(|e| {
            let at = (e - start) * size;
            f(&bytes[at..at + size]);
        });
        Ok(())
    }

    /// Stores `values` as contiguous elements of `dtype` at `ptr`.
    pub fn store(&mut self, dtype: DType, ptr: DevicePtr, values: &[f64]) -> Result<()> {
        let size = dtype.size_in_bytes();
        let bytes = self.bytes_mut(ptr, values.len() * size)?;
        for (chunk, &v) in bytes.chunks_exact_mut(size).zip(values) {
            encode(dtype, v, chunk);
        }
        Ok(())
    }
}

/// An empty vector with room for `n` f64 values, or `OutOfMemory` instead of an allocation failure.
pub fn host_vec(n: usize) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| BackendError::OutOfMemory {
            requested: n.saturating_mul(8),
            available: 0,
        })?;
    Ok(v)
}

fn lost_buffer(base: DevicePtr) -> BackendError {
    BackendError::InvalidPointer {
        ptr: base.0,
        reason: "allocation table and buffers disagree (internal error)".into(),
    }
}
