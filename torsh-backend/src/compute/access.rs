//! The memory an op touches, described as byte regions, and the aliasing rules every backend enforces.
//!
//! Each op descriptor turns itself into an [`Accesses`] list (after checking its own shapes); a backend
//! then checks each region against its live allocations and calls [`Accesses::check_aliasing`]. Because
//! this happens before any memory is touched, no numbers a caller passes can make a backend read or write
//! memory it does not own.

use crate::compute::DevicePtr;
use crate::error::{BackendError, Result};

/// How an op uses a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Only read.
    Read,
    /// Only written.
    Write,
    /// Read, then written (in-place state such as Adam moments or running statistics).
    ReadWrite,
}

impl Access {
    /// True for `Write` and `ReadWrite`.
    pub fn writes(self) -> bool {
        !matches!(self, Access::Read)
    }
}

/// One operand's bytes: from `ptr` to `ptr + bytes` (its first to one past its last byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// The operand's name in messages ("a", "output", "running_mean", ...).
    pub name: &'static str,
    /// First byte.
    pub ptr: DevicePtr,
    /// Length in bytes (0 for an empty operand).
    pub bytes: usize,
    /// How the op uses it.
    pub access: Access,
    /// True when element `i` of the op is the `i`-th element of this region with no gaps or repeats,
    /// which is what makes exact in-place execution safe.
    pub dense: bool,
}

impl Region {
    /// One past the last byte, or `SizeOverflow`.
    pub fn end(&self, op: &'static str) -> Result<u64> {
        self.ptr.0.checked_add(self.bytes as u64).ok_or_else(|| {
            BackendError::overflow(op, format!("operand {} ends past 2^64", self.name))
        })
    }
}

/// Whether an output may coincide with an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InPlace {
    /// Outputs must not overlap any other operand.
    Forbidden,
    /// An output may be exactly an input (same start, same length, both dense), as elementwise ops allow.
    ExactAllowed,
}

/// Everything an op will touch.
#[derive(Clone, Debug)]
pub struct Accesses {
    /// The op's name.
    pub op: &'static str,
    /// Its operands.
    pub regions: Vec<Region>,
    /// Its in-place policy.
    pub in_place: InPlace,
}

impl Accesses {
    /// An empty list for `op`.
    pub fn new(op: &'static str, in_place: InPlace) -> Self {
        Accesses {
            op,
            regions: Vec::new(),
            in_place,
        }
    }

    /// Adds a region.
    #[inline]
    pub fn push(
        &mut self,
        name: &'static str,
        ptr: DevicePtr,
        bytes: usize,
        access: Access,
        dense: bool,
    ) {
        self.regions.push(Region {
            name,
            ptr,
            bytes,
            access,
            dense,
        });
    }

    /// Adds a dense operand of `shape` and `dtype` (its byte size checked for overflow).
    pub fn push_dense(
        &mut self,
        name: &'static str,
        ptr: DevicePtr,
        shape: &[usize],
        dtype: crate::dtype::DType,
        access: Access,
    ) -> Result<()> {
        let bytes = crate::shape::checked_numel(self.op, shape)?
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| {
                BackendError::overflow(
                    self.op,
                    format!("operand {name} of shape {shape:?} overflows"),
                )
            })?;
        self.push(name, ptr, bytes, access, true);
        Ok(())
    }

    /// `Aliasing` if any written region overlaps another region, unless the op allows exact in-place
    /// execution and the two coincide exactly and densely. Reads may overlap each other freely.
    pub fn check_aliasing(&self) -> Result<()> {
        for (i, a) in self.regions.iter().enumerate() {
            for b in &self.regions[i + 1..] {
                if !(a.access.writes() || b.access.writes()) || a.bytes == 0 || b.bytes == 0 {
                    continue;
                }
                let (a_end, b_end) = (a.end(self.op)?, b.end(self.op)?);
                let overlap = a.ptr.0 < b_end && b.ptr.0 < a_end;
                if !overlap {
                    continue;
                }
                let exact = a.ptr == b.ptr && a.bytes == b.bytes && a.dense && b.dense;
                let one_reads = !(a.access.writes() && b.access.writes());
                if self.in_place == InPlace::ExactAllowed && exact && one_reads {
                    continue;
                }
                return Err(BackendError::Aliasing {
                    op: self.op,
                    details: format!(
                        "operand {} ({:#x}, {} bytes) overlaps operand {} ({:#x}, {} bytes){}",
                        a.name,
                        a.ptr.0,
                        a.bytes,
                        b.name,
                        b.ptr.0,
                        b.bytes,
                        if self.in_place == InPlace::ExactAllowed {
                            "; only an exact, contiguous in-place output is allowed"
                        } else {
                            "; this op's output must not overlap its inputs"
                        }
                    ),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(policy: InPlace, regions: &[(u64, usize, Access, bool)]) -> Accesses {
        let mut a = Accesses::new("t", policy);
        for (i, &(p, b, m, d)) in regions.iter().enumerate() {
            a.push(["x", "y", "z"][i], DevicePtr(p), b, m, d);
        }
        a
    }

    #[test]
    fn aliasing_rules() {
        use Access::*;
        // Disjoint: fine.
        assert!(acc(
            InPlace::Forbidden,
            &[(0, 8, Read, true), (8, 8, Write, true)]
        )
        .check_aliasing()
        .is_ok());
        // Overlapping reads: fine.
        assert!(acc(
            InPlace::Forbidden,
            &[(0, 8, Read, true), (4, 8, Read, true)]
        )
        .check_aliasing()
        .is_ok());
        // Exact in-place: only where allowed.
        assert!(acc(
            InPlace::ExactAllowed,
            &[(0, 8, Read, true), (0, 8, Write, true)]
        )
        .check_aliasing()
        .is_ok());
        assert!(acc(
            InPlace::Forbidden,
            &[(0, 8, Read, true), (0, 8, Write, true)]
        )
        .check_aliasing()
        .is_err());
        // Partial overlap or a non-dense input is never allowed.
        assert!(acc(
            InPlace::ExactAllowed,
            &[(0, 8, Read, true), (4, 8, Write, true)]
        )
        .check_aliasing()
        .is_err());
        assert!(acc(
            InPlace::ExactAllowed,
            &[(0, 8, Read, false), (0, 8, Write, true)]
        )
        .check_aliasing()
        .is_err());
        // Two writes to the same bytes: never.
        assert!(acc(
            InPlace::ExactAllowed,
            &[(0, 8, ReadWrite, true), (0, 8, ReadWrite, true)]
        )
        .check_aliasing()
        .is_err());
        // Empty regions never alias.
        assert!(acc(
            InPlace::Forbidden,
            &[(0, 0, Read, true), (0, 8, Write, true)]
        )
        .check_aliasing()
        .is_ok());
    }
}
