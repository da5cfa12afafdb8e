//! [`BackendError`]: every failure the crate reports, as a typed value with a message a user can act on.

use crate::device::BackendType;
use crate::dtype::DType;

/// The result type of every fallible operation in this crate.
pub type Result<T> = std::result::Result<T, BackendError>;

/// Another name of [`Result`], as the low-level trait's users may spell it.
pub type BackendResult<T> = Result<T>;

/// Everything that can go wrong, from a missing driver to a pointer that belongs to no allocation.
///
/// Library code never panics on bad input: each mistake a caller can make maps to one variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The backend is not compiled in, its driver or device is missing, or it is not built yet.
    #[error("{backend} backend unavailable: {reason}")]
    Unavailable {
        /// Which backend.
        backend: BackendType,
        /// Why, in words a user can act on.
        reason: String,
    },

    /// Operand shapes do not fit together (wrong rank, mismatched dims, descriptor inconsistent).
    #[error("{op}: shape mismatch: {details}")]
    ShapeMismatch {
        /// The operation that rejected its input.
        op: &'static str,
        /// What did not fit.
        details: String,
    },

    /// An operand has a different dtype than the op requires.
    #[error("{op}: dtype mismatch: expected {expected}, got {got}")]
    DTypeMismatch {
        /// The operation that rejected its input.
        op: &'static str,
        /// The dtype the op needed.
        expected: DType,
        /// The dtype it was given.
        got: DType,
    },

    /// An argument is out of its legal range (axis, stride of zero, negative size, ...).
    #[error("{op}: invalid argument: {details}")]
    InvalidArgument {
        /// The operation that rejected its input.
        op: &'static str,
        /// What was wrong.
        details: String,
    },

    /// A size computation (elements × dtype size, extents, offsets) overflowed `usize`.
    #[error("{op}: size overflow: {details}")]
    SizeOverflow {
        /// The operation whose sizes overflowed.
        op: &'static str,
        /// Which computation overflowed.
        details: String,
    },

    /// A device pointer is not inside any live allocation of this backend (never allocated, freed,
    /// or allocated by another backend instance).
    #[error("invalid device pointer {ptr:#x}: {reason}")]
    InvalidPointer {
        /// The offending pointer value.
        ptr: u64,
        /// Why it is invalid.
        reason: String,
    },

    /// A pointer is valid but the extent the op would touch runs past the end of its allocation.
    #[error(
        "out of bounds: {bytes} bytes at {ptr:#x} exceed the allocation of {allocation_size} bytes at {allocation_base:#x}"
    )]
    OutOfBounds {
        /// Start of the access.
        ptr: u64,
        /// Length of the access in bytes.
        bytes: usize,
        /// Base of the allocation the pointer falls in.
        allocation_base: u64,
        /// Size of that allocation in bytes.
        allocation_size: usize,
    },

    /// An index tensor holds a value outside `0..size` for the dim it indexes (`gather`,
    /// `index_select`, `embedding`, ...). The reference and CPU backends raise it before writing
    /// anything; GPU backends skip the bad elements and raise it at the latest by the next
    /// `synchronize` or host read (see [`crate::compute::GatherDesc`]).
    #[error("{op}: index {index} is out of range for a dim of size {size}")]
    IndexOutOfRange {
        /// The operation whose index was bad.
        op: &'static str,
        /// The offending index value.
        index: i64,
        /// The size of the indexed dim.
        size: usize,
    },

    /// An output overlaps an input (or another output) in a way the op cannot allow.
    #[error("{op}: aliasing: {details}")]
    Aliasing {
        /// The operation that rejected its operands.
        op: &'static str,
        /// Which operands overlap.
        details: String,
    },

    /// Tensors given to one op live on different backends or devices.
    #[error("{op}: device mismatch: {details}")]
    DeviceMismatch {
        /// The operation that rejected its operands.
        op: &'static str,
        /// Which devices were involved.
        details: String,
    },

    /// An allocation could not be satisfied.
    #[error("out of memory: requested {requested} bytes, {available} bytes available")]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
        /// Bytes the allocator could still give.
        available: usize,
    },

    /// A memory pool's `max_size` would be passed, even after it released its cached blocks.
    #[error(
        "memory pool exhausted: requested {requested} bytes with {allocated} allocated and \
         {reserved} reserved of a {limit}-byte limit (free tensors, call empty_cache, or raise \
         max_size)"
    )]
    MemoryPoolExhausted {
        /// Bytes asked for.
        requested: usize,
        /// Bytes in blocks in use.
        allocated: usize,
        /// Bytes the pool holds from the device, cached blocks included.
        reserved: usize,
        /// The pool's `max_size`.
        limit: usize,
    },

    /// The backend does not implement this op for this dtype.
    #[error("{op} is not supported by the {backend} backend for dtype {dtype}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The backend that lacks it.
        backend: BackendType,
        /// The dtype asked for.
        dtype: DType,
    },

    /// A runtime feature (memory pool, autotuner, streams, ...) is not available in this build or on
    /// this backend. Returned instead of silently ignoring a setting.
    #[error("{feature} is unavailable: {reason}")]
    FeatureUnavailable {
        /// The feature asked for.
        feature: &'static str,
        /// Why it is unavailable.
        reason: String,
    },

    /// The backend was used before `init`.
    #[error("{backend} backend is not initialized: call init() first")]
    NotInitialized {
        /// The backend.
        backend: BackendType,
    },

    /// The device stopped responding or was removed.
    #[error("{backend} device lost: {reason}")]
    DeviceLost {
        /// The backend whose device was lost.
        backend: BackendType,
        /// What the driver said.
        reason: String,
    },

    /// A driver or library call failed with a code.
    #[error("{backend} driver error {code}: {message}")]
    Driver {
        /// The backend whose driver failed.
        backend: BackendType,
        /// The driver's error code.
        code: i64,
        /// The driver's message.
        message: String,
    },

    /// A device kernel (a WGSL shader) failed to compile or validate; `log` is the compiler's
    /// message. For a kernel of this crate it is a bug or a driver defect worth reporting; for a custom
    /// kernel, the message points at the line to fix.
    #[error("{backend} kernel {kernel} failed to compile:\n{log}")]
    KernelCompile {
        /// The backend whose compiler rejected the kernel.
        backend: BackendType,
        /// The kernel (module and entry point) that failed.
        kernel: String,
        /// The compiler's message.
        log: String,
    },

    /// A call that a graph capture cannot record (reading device memory on the host, a random fill,
    /// raw device memory, a second capture), or a graph used with another backend.
    #[error("graph capture: {op}: {details}")]
    GraphCapture {
        /// The call or graph operation refused.
        op: &'static str,
        /// Why, and what to do instead.
        details: String,
    },

    /// A file operation failed (fixtures, caches, reports).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl BackendError {
    /// Shorthand for [`BackendError::ShapeMismatch`].
    pub fn shape(op: &'static str, details: impl Into<String>) -> Self {
        BackendError::ShapeMismatch {
            op,
            details: details.into(),
        }
    }

    /// Shorthand for [`BackendError::InvalidArgument`].
    pub fn invalid(op: &'static str, details: impl Into<String>) -> Self {
        BackendError::InvalidArgument {
            op,
            details: details.into(),
        }
    }

    /// Shorthand for [`BackendError::SizeOverflow`].
    pub fn overflow(op: &'static str, details: impl Into<String>) -> Self {
        BackendError::SizeOverflow {
            op,
            details: details.into(),
        }
    }
}
