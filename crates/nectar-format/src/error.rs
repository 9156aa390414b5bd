use std::path::PathBuf;
use thiserror::Error;

/// Errors raised while discovering, validating or reading model files.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A safetensors header that cannot be used (length, JSON, structure).
    #[error("{path}: invalid safetensors header: {msg}")]
    Header {
        /// The shard.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// One tensor's entry is inconsistent (dtype, shape, offsets, bytes past the end of file).
    #[error("{path}: tensor `{tensor}`: {msg}")]
    Tensor {
        /// The shard.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// What is wrong.
        msg: String,
    },
    /// The same tensor name appears in two shards.
    #[error("tensor `{tensor}` appears in both {first} and {second}")]
    Duplicate {
        /// The tensor name.
        tensor: String,
        /// First shard.
        first: PathBuf,
        /// Second shard.
        second: PathBuf,
    },
    /// A tensor the caller needs is not in the catalog.
    #[error("{dir}: tensor `{tensor}` not found in any shard")]
    Missing {
        /// The model directory.
        dir: PathBuf,
        /// The tensor name.
        tensor: String,
    },
    /// `model.safetensors.index.json` disagrees with the shards.
    #[error("{path}: {msg}")]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A shard changed under a running process (truncated, replaced): the bytes at the offset
    /// named in `msg` could not be read.
    #[error("{path}: model file could not be read: {msg}")]
    FileChanged {
        /// The shard.
        path: PathBuf,
        /// What happened (names the offset or the lengths).
        msg: String,
    },
    /// A conversion cannot proceed (lock held, parameters changed, disk full, bad input).
    #[error("convert: {0}")]
    Convert(String),
    /// The directory holds no safetensors shard.
    #[error("{0}: no *.safetensors files found")]
    NoShards(PathBuf),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

impl From<crate::atomic::AtomicWriteError> for Error {
    fn from(e: crate::atomic::AtomicWriteError) -> Self {
        Error::io(e.path, e.source)
    }
}
