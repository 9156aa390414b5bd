//! Benchmark groups and their shared fixtures.
pub mod common;
pub mod expert;
pub mod int8_act;
pub mod matmul;
