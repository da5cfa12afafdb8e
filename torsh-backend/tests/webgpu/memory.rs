//! Device memory: the buffer pool, the allocation limit, and poisoned fresh allocations.

use super::*;

#[test]
fn freed_buffers_are_reused_and_stats_return_to_zero() {
    let Some(b) = raw() else { return };
    let start = b.pool_stats().unwrap();
    let p = b.alloc(10_000).unwrap();
    let s = b.pool_stats().unwrap();
    assert_eq!(s.allocated_bytes, start.allocated_bytes + 10_000);
    b.free(p).unwrap();
    let q = b.alloc(9_990).unwrap();
    let after = b.pool_stats().unwrap();
    assert_eq!(
        after.hits,
        s.hits + 1,
        "a freed buffer of the same class is reused"
    );
    b.free(q).unwrap();
    assert_eq!(
        b.pool_stats().unwrap().allocated_bytes,
        start.allocated_bytes
    );
    b.empty_cache().unwrap();
    assert_eq!(b.pool_stats().unwrap().cached_bytes, 0);
    // A freed pointer is invalid afterwards.
    assert!(matches!(
        b.free(q),
        Err(BackendError::InvalidPointer { .. })
    ));
}

#[test]
fn allocations_beyond_the_configured_limit_are_out_of_memory() {
    if raw().is_none() {
        return;
    }
    let mut b = WebGpuBackend::new(WebGpuBackendConfig {
        max_buffer_size: 1 << 20,
        ..Default::default()
    });
    b.init().unwrap();
    assert!(b.alloc(1 << 20).is_ok());
    assert!(matches!(
        b.alloc((1 << 20) + 1),
        Err(BackendError::OutOfMemory { .. })
    ));
}

#[test]
fn fresh_allocations_are_poisoned_to_their_last_byte() {
    let Some(b) = raw() else { return };
    if !cfg!(debug_assertions) && std::env::var("TORSH_POISON").as_deref() != Ok("1") {
        common::skipped("a release build without TORSH_POISON=1 does not poison");
        return;
    }
    // Larger than one poisoning chunk (1 MiB) and not a whole number of words.
    let len = (3 << 20) + 5;
    let ptr = b.alloc(len).unwrap();
    for at in [0, (1 << 20) - 1, 1 << 20, len - 7] {
        let mut bytes = [0u8; 7];
        b.copy_dtoh(&mut bytes, ptr.offset(at).unwrap()).unwrap();
        assert_eq!(bytes, [0xFF; 7], "at byte {at}");
    }
}
