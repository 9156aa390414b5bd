//! Why a session could not be saved, restored or reused. Every file error names the file.

use std::path::PathBuf;
use thiserror::Error;

/// A session file or session operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SessionError {
    /// Reading or writing the file failed.
    #[error("session file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file ends before the data its header announces.
    #[error("session file {} is truncated: its header needs {expected} bytes, the file has {found}", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the header implies.
        expected: u64,
        /// Bytes present.
        found: u64,
    },
    /// The bytes are not a valid session (bad magic, checksum, values out of range).
    #[error("session file {} is corrupt: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A format version this build does not read.
    #[error("session file {} has format version {found}; this build reads versions 1 to {supported}", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// The file's version.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The file was saved by a different model (config, quantisation or tokenizer).
    #[error("session file {} was saved with a different {part}: file {saved}, loaded model {loaded}", path.display())]
    IdentityMismatch {
        /// The file.
        path: PathBuf,
        /// Which part differs: `config.json`, `quantisation layout` or `tokenizer.json`.
        part: &'static str,
        /// The part's hash in the file.
        saved: String,
        /// The loaded model's hash.
        loaded: String,
    },
    /// A cache dimension in the file differs from the loaded model's.
    #[error("session file {} does not fit the loaded model: {what} is {file} in the file, {model} in the model", path.display())]
    Dims {
        /// The file.
        path: PathBuf,
        /// Which dimension.
        what: String,
        /// The file's value.
        file: u64,
        /// The model's value.
        model: u64,
    },
    /// The path exists but is not a regular file (a FIFO would block the load forever).
    #[error("session file {} is {kind}, not a regular file", path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is: `a FIFO`, `a directory`, `a socket`, `a device`.
        kind: &'static str,
    },
    /// The session's directory cannot take the file (missing, not a directory, read-only):
    /// found before generating, not after.
    #[error("session file {}: cannot write in its directory {}: {source}", path.display(), dir.display())]
    Directory {
        /// The session file.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// The OS error of a trial write.
        #[source]
        source: std::io::Error,
    },
    /// A session's tokens and caches disagree (a caller bug, reported instead of panicking).
    #[error("session: {0}")]
    Inconsistent(String),
}

impl SessionError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> SessionError {
        SessionError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn corrupt(path: &std::path::Path, reason: impl Into<String>) -> SessionError {
        SessionError::Corrupt {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    pub(crate) fn dims(
        path: &std::path::Path,
        what: impl Into<String>,
        file: impl TryInto<u64>,
        model: impl TryInto<u64>,
    ) -> SessionError {
        SessionError::Dims {
            path: path.to_path_buf(),
            what: what.into(),
            file: file.try_into().unwrap_or(u64::MAX),
            model: model.try_into().unwrap_or(u64::MAX),
        }
    }
}
