use std::path::PathBuf;
use thiserror::Error;

/// Errors of the residency layer.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading an expert failed; the forward that needed it fails, the engine keeps serving.
    #[error("layer {layer} expert {expert}: read of {path} at offset {offset} failed: {source}")]
    Read {
        /// Layer.
        layer: u32,
        /// Expert.
        expert: u32,
        /// Shard file.
        path: PathBuf,
        /// File offset of the failed read.
        offset: u64,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The memory budget cannot hold the minimum configuration (the equation is in the text).
    #[error("memory budget too small:\n{0}")]
    Budget(String),
    /// The expert table cannot be set up (format, layout, allocation).
    #[error("{0}")]
    Setup(String),
    /// A lease outlived its slot's generation (a bug caught instead of reading another expert).
    #[error("stale lease on slot {slot}: generation {lease} but the slot is at {current}")]
    StaleLease {
        /// Slot.
        slot: usize,
        /// Lease generation.
        lease: u64,
        /// Slot generation.
        current: u64,
    },
    /// A policy invariant was violated by the caller.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// Safe-point rule broken: leases still alive when a wave ends.
    #[error("end of wave with {0} lease(s) still alive")]
    LeasesAlive(usize),
    /// The machine has no memory left for even one expert slot per layer: the request fails,
    /// the process lives, and the cache grows back once memory is free again.
    #[error("out of memory: RSS {} MB is above the limit of {} MB even with one expert slot per layer (another process may be using the memory; free some or lower --ctx-size)", rss / 1_000_000, limit / 1_000_000)]
    MemoryPressure {
        /// Resident set size (bytes).
        rss: u64,
        /// The guard's limit at that moment (bytes).
        limit: u64,
    },
    /// Format-level problem with the model files.
    #[error(transparent)]
    Format(#[from] nectar_format::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
