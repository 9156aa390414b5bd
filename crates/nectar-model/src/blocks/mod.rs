//! Building blocks shared by architectures: weight-backed linears and the tensor loader.
mod linear;
mod loader;

pub use linear::{Embedding, Linear};
pub use loader::Loader;
