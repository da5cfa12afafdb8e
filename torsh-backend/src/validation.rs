//! The parity suite (placeholder while the core compiles).
