//! [`AllocationTable`]: the live allocations of one backend instance, against which every pointer and
//! extent is checked before an op runs. Any backend embeds one; host-simulated backends also use it to
//! hand out addresses.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::compute::access::{Accesses, Region};
use crate::compute::DevicePtr;
use crate::error::{BackendError, Result};

/// Gap left after each synthetic allocation, so that running off the end of one buffer lands in no
/// other buffer.
const GUARD_BYTES: u64 = 4096;

/// Alignment of synthetic addresses.
const ALIGN: u64 = 256;

/// The next free synthetic address in this process. One counter for every table, so no two backend
/// instances ever hand out the same address and a pointer from one instance is never valid in another.
static NEXT_SYNTHETIC_ADDRESS: AtomicU64 = AtomicU64::new(1 << 20);

/// Live allocations, keyed by base address.
#[derive(Debug)]
pub struct AllocationTable {
    live: BTreeMap<u64, usize>,
    allocated_bytes: usize,
}

impl Default for AllocationTable {
    fn default() -> Self {
        Self::new()
    }
}

impl AllocationTable {
    /// An empty table. Synthetic addresses start at 1 MiB (so 0 and small integers are never valid).
    pub fn new() -> Self {
        AllocationTable {
            live: BTreeMap::new(),
            allocated_bytes: 0,
        }
    }

    /// Reserves a fresh synthetic address range of `bytes` and records it as live. Addresses are never
    /// reused in this process, by this table or any other, so a freed pointer stays invalid and a
    /// pointer from another instance is never valid here. `OutOfMemory` if the address space is
    /// exhausted.
    pub fn allocate_synthetic(&mut self, bytes: usize) -> Result<DevicePtr> {
        let exhausted = || BackendError::OutOfMemory {
            requested: bytes,
            available: 0,
        };
        let span = (bytes as u64)
            .checked_add(GUARD_BYTES + ALIGN - 1)
            .map(|s| s / ALIGN * ALIGN)
            .ok_or_else(exhausted)?;
        let base = NEXT_SYNTHETIC_ADDRESS
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                next.checked_add(span)
            })
            .map_err(|_| exhausted())?;
        self.insert(DevicePtr(base), bytes);
        Ok(DevicePtr(base))
    }

    /// Records an allocation made elsewhere (a driver's pointer).
    pub fn insert(&mut self, base: DevicePtr, bytes: usize) {
        self.live.insert(base.0, bytes);
        self.allocated_bytes = self.allocated_bytes.saturating_add(bytes);
    }

    /// Forgets the allocation starting at `base` and returns its size. `InvalidPointer` if `base` is not
    /// the start of a live allocation (never allocated, already freed, interior pointer, foreign).
    pub fn remove(&mut self, base: DevicePtr) -> Result<usize> {
        match self.live.remove(&base.0) {
            Some(bytes) => {
                self.allocated_bytes -= bytes;
                Ok(bytes)
            }
            None => Err(BackendError::InvalidPointer {
                ptr: base.0,
                reason: match self.containing(base.0) {
                    Some((b, _)) => format!("free() needs the allocation's base {b:#x}, not an interior pointer"),
                    None => "not a live allocation of this backend (never allocated, already freed, or from another backend instance)".into(),
                },
            }),
        }
    }

    /// The size of the live allocation that starts at `base`, if there is one.
    pub fn size_of(&self, base: DevicePtr) -> Option<usize> {
        self.live.get(&base.0).copied()
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> usize {
        self.allocated_bytes
    }

    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True when nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    fn containing(&self, ptr: u64) -> Option<(u64, usize)> {
        self.live
            .range(..=ptr)
            .next_back()
            .map(|(&b, &s)| (b, s))
            .filter(|&(b, s)| ptr - b <= s as u64)
    }

    /// Checks that `bytes` starting at `ptr` lie inside one live allocation and returns that
    /// allocation's base and the offset of `ptr` in it. `InvalidPointer` when `ptr` is in no live
    /// allocation; `OutOfBounds` when the extent runs past its end.
    pub fn check(&self, ptr: DevicePtr, bytes: usize) -> Result<(DevicePtr, usize)> {
        let Some((base, size)) = self.containing(ptr.0) else {
            return Err(BackendError::InvalidPointer {
                ptr: ptr.0,
                reason: if ptr.0 == 0 {
                    "null pointer".into()
                } else {
                    "not inside any live allocation of this backend (never allocated, already freed, or from another backend instance)".into()
                },
            });
        };
        let offset = (ptr.0 - base) as usize;
        if offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(BackendError::OutOfBounds {
                ptr: ptr.0,
                bytes,
                allocation_base: base,
                allocation_size: size,
            });
        }
        Ok((DevicePtr(base), offset))
    }

    /// Checks one region; see [`AllocationTable::check`].
    pub fn check_region(&self, region: &Region) -> Result<(DevicePtr, usize)> {
        self.check(region.ptr, region.bytes)
    }

    /// Checks every region of an op for bounds, then for aliasing.
    pub fn check_accesses(&self, accesses: &Accesses) -> Result<()> {
        for r in &accesses.regions {
            self.check_region(r)?;
        }
        accesses.check_aliasing()
    }
}

/// A hash map keyed by device addresses (or other `u64` keys the backend makes itself, such as
/// size classes), with [`AddressHasher`].
pub(crate) type AddressMap<V> =
    std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<AddressHasher>>;

/// A hasher for device addresses (`u64` keys the backend hands out itself, so no adversary picks
/// them): one multiply by 2⁶⁴/φ and a fold of the high half into the low, so that aligned addresses,
/// whose low bits are all zero, still spread over the table's buckets. An allocation and its free
/// hash twice where SipHash would cost a few tens of nanoseconds each.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    /// Any other key type, byte by byte (not used by [`AddressMap`]).
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        let h = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_addresses_spread_over_buckets() {
        use std::hash::BuildHasher;
        // 256 addresses 4 KiB apart (their low 12 bits zero) land in most of 256 buckets, as a
        // table indexing by the hash's low bits sees them.
        let build = std::hash::BuildHasherDefault::<AddressHasher>::default();
        let buckets: std::collections::HashSet<u64> = (0..256u64)
            .map(|i| build.hash_one(0x1_0000_0000 + i * 4096) & 255)
            .collect();
        assert!(buckets.len() >= 150, "{} buckets of 256", buckets.len());
        let mut map: AddressMap<u64> = AddressMap::default();
        for i in 0..1000u64 {
            map.insert(i * 64, i);
        }
        assert!((0..1000u64).all(|i| map.get(&(i * 64)) == Some(&i)));
        // Keys hashed as bytes depend on every byte, not only the last.
        assert_ne!(build.hash_one([1u8, 2]), build.hash_one([3u8, 2]));
    }

    #[test]
    fn pointers_are_checked() {
        let mut t = AllocationTable::new();
        let a = t.allocate_synthetic(100).unwrap();
        let b = t.allocate_synthetic(0).unwrap();
        assert!(t.check(a, 100).is_ok());
        assert!(matches!(
            t.check(a, 101),
            Err(BackendError::OutOfBounds { .. })
        ));
        assert!(matches!(t.check(DevicePtr(a.0 + 40), 60), Ok((base, 40)) if base == a));
        assert!(matches!(
            t.check(DevicePtr(0), 0),
            Err(BackendError::InvalidPointer { .. })
        ));
        assert!(t.check(b, 0).is_ok());
        assert!(matches!(
            t.remove(DevicePtr(a.0 + 1)),
            Err(BackendError::InvalidPointer { .. })
        ));
        assert_eq!(t.remove(a).unwrap(), 100);
        assert!(matches!(
            t.check(a, 1),
            Err(BackendError::InvalidPointer { .. })
        ));
        assert!(matches!(
            t.remove(a),
            Err(BackendError::InvalidPointer { .. })
        ));
        assert_eq!(t.allocated_bytes(), 0);
        assert_eq!(t.len(), 1);
    }
}
