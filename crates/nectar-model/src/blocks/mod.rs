//! Building blocks shared by architectures: weight-backed linears and the tensor loader.
mod embedding;
#[cfg(feature = "cuda")]
pub(crate) mod gpu;
mod linear;
mod loader;

pub use embedding::Embedding;
#[cfg(feature = "cuda")]
pub use gpu::open_gpu;
#[cfg(feature = "cuda")]
pub(crate) use gpu::GpuWeight;
pub use linear::Linear;
#[cfg(feature = "cuda")]
pub use loader::PlaceRule;
pub use loader::{GpuCopy, Loader};
