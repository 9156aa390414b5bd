//! Building blocks shared by architectures: weight-backed linears and the tensor loader.
#[cfg(feature = "cuda")]
pub(crate) mod gpu;
mod linear;
mod loader;

#[cfg(feature = "cuda")]
pub use gpu::open_gpu;
#[cfg(feature = "cuda")]
pub(crate) use gpu::GpuWeight;
pub use linear::{Embedding, Linear};
pub use loader::Loader;
#[cfg(feature = "cuda")]
pub use loader::PlaceRule;
