//! The GLM-5 graph: config, weights, MLA with compressed caches, the DSA indexer, sigmoid-routed
//! MoE with the shared expert, and the MTP head.
//!
//! What this crate does: turn token ids into hidden states and logits, exactly as the reference
//! implementation (Hugging Face transformers `glm_moe_dsa`) computes them, for a batch of
//! sequences that each carry their own compressed cache.
//! What it does not do: text (tokenizer, templates, sampling live in `nectar-engine`) or HTTP.
//!
//! The decision a newcomer would question: the forward pass takes a **batch of sequences**, not
//! one sequence. Linear layers run once over all rows (each weight byte read once per step,
//! which is what decode speed is made of), while attention runs per sequence over its own cache.
//! A single-sequence caller simply passes a batch of one.
#![deny(missing_docs)]

pub mod arch;
pub mod blocks;
mod cache;
mod error;
mod observer;

pub use arch::glm5::{Glm5, MlaMode, MtpStep, Prefill, SeqStep};
pub use arch::Arch;
pub use cache::{CacheDims, LayerCache, SeqCache};
pub use error::{Error, Result};
pub use observer::{NoObserver, Observer};
