//! Scratch kept between calls. A kernel whose scratch is large next to its work (the Winograd
//! convolution's transformed inputs and filters: about 2 MB for a 14 × 14 plane of 256 channels,
//! whose convolution takes well under a millisecond on two threads) hands its buffers back with
//! [`keep`] when a call ends and takes them again with [`take`] at the next call, instead of
//! allocating and zeroing them every time.
//!
//! The store is process-wide and holds at most [`KEPT_BYTES`]: keeping a buffer past the bound drops
//! the oldest kept ones first, and a buffer larger than the bound is dropped at once. Kept buffers
//! are host memory outside every backend's allocation table, so they are not counted in its memory
//! statistics.

use std::any::Any;
use std::sync::Mutex;

/// The most bytes of scratch kept between calls, over all types and threads.
pub(crate) const KEPT_BYTES: usize = 64 << 20;

/// Kept scratch, oldest first, each with its size in bytes.
struct Kept {
    items: Vec<(Box<dyn Any + Send>, usize)>,
    bytes: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    items: Vec::new(),
    bytes: 0,
});

/// The most recently kept scratch of type `S`, taken out of the store; `None` when none is kept.
pub(crate) fn take<S: Any + Send>() -> Option<S> {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    let at = kept.items.iter().rposition(|(s, _)| s.is::<S>())?;
    let (s, bytes) = kept.items.remove(at);
    kept.bytes -= bytes;
    drop(kept);
    s.downcast::<S>().ok().map(|s| *s)
}

/// Keeps `s`, which holds `bytes` bytes, for a later [`take`]: the oldest kept scratch is dropped
/// while the store would exceed [`KEPT_BYTES`], and `s` itself when it alone exceeds it.
pub(crate) fn keep<S: Any + Send>(s: S, bytes: usize) {
    if bytes > KEPT_BYTES {
        return;
    }
    let mut dropped = Vec::new();
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    while kept.bytes + bytes > KEPT_BYTES {
        let (old, old_bytes) = kept.items.remove(0);
        kept.bytes -= old_bytes;
        dropped.push(old);
    }
    kept.items.push((Box::new(s), bytes));
    kept.bytes += bytes;
    drop(kept);
    // Freed after the lock is released.
    drop(dropped);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Types of these tests alone, so that other tests' scratch does not interfere.
    #[derive(Debug, PartialEq)]
    struct Small(Vec<u8>);
    #[derive(Debug, PartialEq)]
    struct Other(u32);
    #[derive(Debug, PartialEq)]
    struct Huge(usize);

    #[test]
    fn kept_scratch_comes_back_by_type_newest_first() {
        keep(Small(vec![1]), 1);
        keep(Other(7), 4);
        keep(Small(vec![2]), 1);
        assert_eq!(take::<Small>(), Some(Small(vec![2])));
        assert_eq!(take::<Other>(), Some(Other(7)));
        assert_eq!(take::<Small>(), Some(Small(vec![1])));
        assert_eq!(take::<Other>(), None);
    }

    #[test]
    fn the_store_stays_within_its_bound() {
        // Larger than the bound: not kept.
        keep(Huge(0), KEPT_BYTES + 1);
        assert_eq!(take::<Huge>(), None);
        // Three halves: the oldest goes to make room for the newest (other tests' scratch may take
        // the place of the second).
        keep(Huge(1), KEPT_BYTES / 2);
        keep(Huge(2), KEPT_BYTES / 2);
        keep(Huge(3), KEPT_BYTES / 2);
        assert!(KEPT.lock().unwrap().bytes <= KEPT_BYTES);
        let mut back = Vec::new();
        while let Some(Huge(i)) = take::<Huge>() {
            back.push(i);
        }
        assert!(!back.contains(&1), "{back:?}");
    }
}
