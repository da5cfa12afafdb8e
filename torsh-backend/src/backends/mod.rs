//! The device backends, one folder each. Only the reference backend exists so far; the CPU kind is
//! served by its kernels, and every other kind answers `Unavailable` (see [`crate::Backend::probe`]).

pub mod reference;
