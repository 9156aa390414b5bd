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
    /// A request the model cannot serve (token id out of range, context overflow, ...).
    #[error("invalid input: {0}")]
    Input(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
