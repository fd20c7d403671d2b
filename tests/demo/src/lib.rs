//! The demo's building blocks, shared with the benchmarks and the soak:
//! processes of the driver, pvesim's admin view, the narration.

pub mod common;
