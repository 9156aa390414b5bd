//! Bytes on disk: the safetensors catalog every Nectar model is read through.
//!
//! What this crate does: discover the shards of a model directory, parse and validate every
//! header **before** any weight byte is used (offsets inside the file, byte counts equal to
//! shape × dtype, no overlaps, no duplicate names across shards, the optional
//! `model.safetensors.index.json` agreeing with the shards), and hand out borrowed byte ranges
//! of memory-mapped files.
//! What it does not do: know what a tensor means (that is `nectar-model`) or do arithmetic on
//! weights (that is `nectar-kernels`).
//!
//! Why a hand-written header parser instead of the `safetensors` crate's reader: the crate
//! validates a whole buffer and reports a truncated file without naming the tensor that runs
//! past the end; users with a half-downloaded 5 GB shard need the file *and* the tensor. The
//! header is a small JSON document, so the parser is short and fuzzable.
#![deny(missing_docs)]

pub mod atomic;
mod catalog;
pub mod convert;
mod dtype;
mod error;
pub mod experts;
mod floats;
mod guard;
mod header;
pub mod manifest;
pub mod quant;
pub mod synth;

pub use catalog::{Bytes, Catalog, ShardInfo, TensorEntry, STAMP_KEY};
pub use dtype::DType;
pub use error::{Error, Result};
pub use floats::Floats;
pub use guard::GuardedMap;
pub use header::{parse_header, HeaderTensor, ParsedHeader, MAX_HEADER_BYTES};
