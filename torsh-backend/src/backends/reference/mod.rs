//! The reference backend: scalar, readable kernels that accumulate in f64. It is the oracle every other
//! backend is compared with, so each kernel is the textbook definition of its op and nothing more.
//!
//! Memory lives in host byte buffers behind synthetic device addresses. Fresh allocations are filled
//! with a NaN pattern, addresses are never reused, and every op checks its regions against the live
//! allocations before it runs. Ops hold one lock from check to store, so they complete in submission
//! order. Float dtypes (f32, f64, f16, bf16) are computed in f64 and rounded once on store; integer
//! dtypes support fill, cast and copies, and math ops on them answer `Unsupported`.

pub(crate) mod attention;
mod blas;
pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod index;
pub(crate) mod loss;
pub(crate) mod math;
pub(crate) mod memory;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod scan;
pub(crate) mod select;
pub(crate) mod sort;

pub(crate) use blas::gemm_regions;
use std::sync::{Mutex, MutexGuard};

pub use memory::POISON_BYTE;

use crate::compute::op::ops_by_impl;
use crate::compute::*;
use crate::device::{host_memory_bytes, BackendType, Device, DeviceInfo};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use memory::HostMemory;

/// The scalar reference backend. `ReferenceBackend::new(BackendType::Reference)` is the oracle;
/// `BackendType::Cpu` uses these kernels for the ops the CPU backend has no SIMD kernel for yet (and
/// entirely when the `cpu` feature is off).
#[derive(Debug)]
pub struct ReferenceBackend {
    serves: BackendType,
    initialized: bool,
    memory: Mutex<HostMemory>,
}

impl ReferenceBackend {
    /// A new, uninitialised instance reporting itself as `serves` (`Reference` or `Cpu`).
    pub fn new(serves: BackendType) -> Self {
        Self::with_memory(serves, HostMemory::default())
    }

    /// A new, uninitialised instance on `memory` (the CPU backend passes memory that recycles freed
    /// buffers).
    pub(crate) fn with_memory(serves: BackendType, memory: HostMemory) -> Self {
        ReferenceBackend {
            serves,
            initialized: false,
            memory: Mutex::new(memory),
        }
    }

    /// Bytes of freed buffers held for reuse.
    pub(crate) fn cached_bytes(&self) -> usize {
        self.memory.lock().map_or(0, |m| m.cached_bytes())
    }

    fn memory(&self) -> Result<MutexGuard<'_, HostMemory>> {
        if !self.initialized {
            return Err(BackendError::NotInitialized {
                backend: self.serves,
            });
        }
        // A panic while holding the lock cannot leave a half-written op behind (ops store last), so a
        // poisoned lock is still usable.
        Ok(self.memory.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn float_only(&self, op: &'static str, dtype: DType) -> Result<()> {
        if dtype.is_float() {
            Ok(())
        } else {
            Err(BackendError::Unsupported {
                op,
                backend: self.serves,
                dtype,
            })
        }
    }

    /// Checks an op's regions, then runs `kernel` under the lock.
    pub(crate) fn run(
        &self,
        acc: Accesses,
        kernel: impl FnOnce(&mut HostMemory) -> Result<()>,
    ) -> Result<()> {
        let mut mem = self.memory()?;
        mem.check_accesses(&acc)?;
        kernel(&mut mem)
    }
}

impl ComputeBackend for ReferenceBackend {
    fn name(&self) -> &str {
        self.serves.name()
    }

    fn backend_type(&self) -> BackendType {
        self.serves
    }

    fn init(&mut self) -> Result<()> {
        self.initialized = true;
        Ok(())
    }

    fn is_initialized(&self) -> bool {
        self.initialized
    }

    fn device_info(&self) -> DeviceInfo {
        let api = match self.serves {
            BackendType::Reference => "scalar reference kernels (f64 accumulation)",
            _ => "scalar reference kernels",
        };
        DeviceInfo {
            device: Device {
                backend_type: self.serves,
                index: 0,
            },
            name: crate::device::host_cpu_name(),
            memory_bytes: host_memory_bytes(),
            api: api.into(),
            details: vec![
                ("cores".into(), crate::device::host_core_count().to_string()),
                ("threads used".into(), "1".into()),
                ("simd".into(), "none (scalar)".into()),
            ],
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.memory().map(|_| ())
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.memory()?.alloc(bytes)
    }

    fn allocated_bytes(&self) -> Option<usize> {
        self.memory().ok().map(|m| m.table.allocated_bytes())
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.memory()?.free(ptr)
    }

    fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.memory()?
            .bytes_mut(dst, src.len())?
            .copy_from_slice(src);
        Ok(())
    }

    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        dst.copy_from_slice(self.memory()?.bytes(src, dst.len())?);
        Ok(())
    }

    fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let mut acc = Accesses::new("copy_dtod", InPlace::Forbidden);
        acc.push("src", src, bytes, Access::Read, true);
        acc.push("dst", dst, bytes, Access::Write, true);
        self.run(acc, |mem| {
            let data = mem.bytes(src, bytes)?.to_vec();
            mem.bytes_mut(dst, bytes)?.copy_from_slice(&data);
            Ok(())
        })
    }

    // Every op method runs this backend's `OpImpl` of its descriptor, in the file of its family.
    crate::for_each_op!(ops_by_impl);
}
