use std::path::PathBuf;
use thiserror::Error;

/// Errors raised while loading or running a model.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A model file could not be read or validated.
    #[error(transparent)]
    Format(#[from] nectar_format::Error),
    /// A kernel refused its inputs (a shape bug, reported instead of panicking).
    #[error(transparent)]
    Kernel(#[from] nectar_kernels::Error),
    /// `config.json` is missing, malformed, or describes something Nectar does not run.
    #[error("{path}: {msg}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong (names the field).
        msg: String,
    },
    /// The expert cache failed (a read error names layer, expert, file and offset).
    #[error(transparent)]
    Residency(#[from] nectar_residency::Error),
    /// A GPU operation failed after the GPU was opened (a driver or kernel fault).
    #[error("GPU: {0}")]
    Gpu(String),
    /// A product asked for the host copy of a matrix that was released when the matrix was
    /// placed in VRAM (`--gpu-memory`): a bug in the placement rules, reported instead of
    /// reading freed memory.
    #[error(
        "`{0}` is held only in VRAM (its host copy was released at load), but a CPU path asked for it"
    )]
    HostReleased(String),
    /// A request the model cannot serve (token id out of range, context overflow, ...).
    #[error("invalid input: {0}")]
    Input(String),
}

impl Error {
    /// True when a model file could not be read while running (an I/O error, a shard
    /// truncated or replaced, an expert read that came up short): an operator's problem, not a
    /// bug, and not the request's fault.
    pub fn is_unreadable_file(&self) -> bool {
        use nectar_format::Error as F;
        let format = |f: &F| matches!(f, F::Io { .. } | F::FileChanged { .. });
        match self {
            Error::Format(f) => format(f),
            Error::Residency(nectar_residency::Error::Read { .. }) => true,
            Error::Residency(nectar_residency::Error::Format(f)) => format(f),
            _ => false,
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
