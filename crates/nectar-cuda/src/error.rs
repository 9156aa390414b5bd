use thiserror::Error;

/// Errors of the CUDA tier.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// No usable GPU: no driver library, no device, or no NVRTC. Callers fall back to the CPU
    /// and say so with this message.
    #[error("no usable CUDA GPU: {0}")]
    Unavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// NVRTC rejected the kernel source (the log is included).
    #[error("NVRTC could not compile the kernels: {0}")]
    Compile(String),
    /// Host memory could not be registered with the driver (`cuMemHostRegister`: a locked-memory
    /// limit, an unsupported mapping, …); callers copy through the pinned ring instead.
    #[error("registering {bytes} B of host memory with the CUDA driver failed: {source}")]
    Register {
        /// Bytes of the range.
        bytes: usize,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// An operation's buffers would not fit the VRAM free beside what is placed; nothing was
    /// launched (callers take a path that needs less).
    #[error("{need} B of VRAM needed, {free} B free")]
    Memory {
        /// Bytes the operation would allocate.
        need: u64,
        /// Bytes the device reported free.
        free: u64,
    },
    /// Shapes or buffers that do not describe a valid product.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// The weight view is invalid (byte or scale count).
    #[error(transparent)]
    Weights(#[from] nectar_kernels::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
