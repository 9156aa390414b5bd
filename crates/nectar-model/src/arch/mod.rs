//! Architectures Nectar runs, registered in one exhaustive `match` (see [`Arch`]).
pub mod glm5;

/// A model architecture, keyed by the `model_type` of `config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// GLM-5 / GLM-5.1 / GLM-5.2 (`glm_moe_dsa`).
    GlmMoeDsa,
}

impl Arch {
    /// The architecture for a `model_type` string.
    pub fn from_model_type(t: &str) -> Option<Arch> {
        match t {
            "glm_moe_dsa" => Some(Arch::GlmMoeDsa),
            _ => None,
        }
    }

    /// The `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::GlmMoeDsa => "glm_moe_dsa",
        }
    }
}
