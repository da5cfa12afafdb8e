//! Ops without a WGSL kernel yet run the reference kernels on the host: every region the op touches
//! is read back into host memory at the *same* synthetic addresses (so the descriptor is used
//! unchanged), the reference kernel runs there, and every region it writes is copied back. Written
//! regions are read first too, so the gaps of a strided output keep their device contents.
//!
//! This is correct and slow (two transfers per op); it exists so that every op answers on this backend
//! while its kernels are written, and `device_info()` lists the ops it serves.

use std::collections::BTreeMap;

use crate::backends::reference::memory::HostMemory;
use crate::backends::reference::ReferenceBackend;
use crate::compute::{Accesses, ComputeBackend};
use crate::device::BackendType;
use crate::error::Result;

use super::context::Gpu;
use super::memory::{read_bytes, write, Memory};

/// The ops that run through this module today, as `device_info()` reports them.
pub(crate) const HOST_OPS: &str =
    "random, casts other than f32→f32, and every op in f64, f16 and bf16";

/// Runs `op` on a host mirror of the regions of `acc` (already checked against `mem`) and writes
/// the regions it writes back to the device.
pub(crate) fn on_host(
    gpu: &Gpu,
    mem: &Memory,
    acc: &Accesses,
    op: impl FnOnce(&dyn ComputeBackend) -> Result<()>,
) -> Result<()> {
    let mut host = HostMemory::default();
    // Mirror each touched allocation once, at its own base and size.
    let mut allocations = BTreeMap::new();
    for r in &acc.regions {
        let (base, _) = mem.table.check(r.ptr, r.bytes)?;
        if let Some(size) = mem.table.size_of(base) {
            allocations.insert(base, size);
        }
    }
    for (&base, &size) in &allocations {
        host.adopt(base, size)?;
    }
    for r in &acc.regions {
        let bytes = read_bytes(gpu, mem.place(r.ptr, r.bytes)?, r.bytes)?;
        host.bytes_mut(r.ptr, r.bytes)?.copy_from_slice(&bytes);
    }
    let mut reference = ReferenceBackend::with_memory(BackendType::WebGpu, host);
    reference.init()?;
    op(&reference)?;
    let host = reference.into_memory();
    for r in acc.regions.iter().filter(|r| r.access.writes()) {
        write(gpu, mem.place(r.ptr, r.bytes)?, host.bytes(r.ptr, r.bytes)?)?;
    }
    Ok(())
}
