//! `config.json` of `glm_moe_dsa` (GLM-5, GLM-5.1, GLM-5.2), straight from serde, plus the
//! derived facts every block needs (`specs/glm5-architecture.md` §2).
use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The fields of `config.json` Nectar reads. Unknown keys are tolerated (HF writes many).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct RawConfig {
    pub model_type: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    #[serde(default)]
    pub first_k_dense_replace: usize,
    #[serde(default)]
    pub mlp_layer_types: Option<Vec<String>>,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    #[serde(default = "one")]
    pub n_shared_experts: usize,
    #[serde(default = "one")]
    pub n_group: usize,
    #[serde(default = "one")]
    pub topk_group: usize,
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    #[serde(default = "one_f")]
    pub routed_scaling_factor: f32,
    #[serde(default)]
    pub scoring_func: Option<String>,
    pub num_attention_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    #[serde(default)]
    pub index_topk_freq: Option<usize>,
    #[serde(default)]
    pub index_skip_topk_offset: Option<usize>,
    #[serde(default)]
    pub index_topk_pattern: Option<String>,
    #[serde(default)]
    pub indexer_types: Option<Vec<String>>,
    #[serde(default = "eps")]
    pub rms_norm_eps: f32,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    pub rope_theta: Option<f32>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub num_nextn_predict_layers: usize,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
}

/// `rope_parameters` (transformers ≥ 5 spelling).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct RopeParameters {
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_type: Option<String>,
}

fn one() -> usize {
    1
}
fn one_f() -> f32 {
    1.0
}
fn yes() -> bool {
    true
}
fn eps() -> f32 {
    1e-5
}

/// The resolved configuration of a GLM-5 model.
#[derive(Debug, Clone)]
pub struct Config {
    /// The raw fields.
    pub raw: RawConfig,
    /// Where it was read from.
    pub path: PathBuf,
    /// Per main layer: true for a dense MLP, false for MoE.
    pub dense: Vec<bool>,
    /// Per main layer: true where the layer runs its own DSA indexer ("full").
    pub indexer_full: Vec<bool>,
    /// RoPE θ.
    pub rope_theta: f32,
    /// All eos ids of config.json.
    pub eos_ids: Vec<u32>,
}

impl Config {
    /// The output head's checkpoint name: the embedding table itself when the two are tied.
    pub fn head_name(&self) -> &'static str {
        if self.raw.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        }
    }

    /// Whether `name` is an embedding table that is not also the output head: one row per token
    /// is all a forward reads of it, so under a budget it is read per token, not held.
    pub fn is_embedding_only(&self, name: &str) -> bool {
        name.ends_with("embed_tokens.weight") && name != self.head_name()
    }

    /// Reads and validates `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Config> {
        if !dir.is_dir() {
            let what = if dir.exists() {
                "is not a directory"
            } else {
                "does not exist"
            };
            return Err(Error::Config {
                path: dir.to_path_buf(),
                msg: format!("the model directory {what}"),
            });
        }
        let path = dir.join("config.json");
        let text = std::fs::read(&path).map_err(|e| Error::Config {
            path: path.clone(),
            msg: format!("cannot read: {e}"),
        })?;
        let value: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| Error::Config {
                path: path.clone(),
                msg: format!("not valid JSON: {e}"),
            })?;
        Config::from_json(&path, value)
    }

    /// Validates a parsed `config.json` (`path` is used in error messages).
    pub fn from_json(path: &Path, value: serde_json::Value) -> Result<Config> {
        let err = |msg: String| Error::Config {
            path: path.to_path_buf(),
            msg,
        };
        let mt = value
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("<missing>");
        if mt != "glm_moe_dsa" {
            return Err(err(format!(
                "model_type `{mt}` is not supported (Nectar runs `glm_moe_dsa`: GLM-5, GLM-5.1, GLM-5.2)"
            )));
        }
        // serde_path_to_error names the offending field (`hidden_size: invalid type ...`).
        let raw: RawConfig = serde_path_to_error::deserialize(value)
            .map_err(|e| err(format!("field `{}`: {}", e.path(), e.inner())))?;
        let n = raw.num_hidden_layers;
        if raw.n_group != 1 || raw.topk_group != 1 {
            return Err(err(format!(
                "n_group = {} / topk_group = {}: group-limited routing is not implemented (GLM-5.x uses 1 / 1)",
                raw.n_group, raw.topk_group
            )));
        }
        if let Some(s) = raw.scoring_func.as_deref() {
            if s != "sigmoid" {
                return Err(err(format!(
                    "scoring_func `{s}` is not supported (GLM-5 uses `sigmoid`)"
                )));
            }
        }
        let (rope_theta, rope_type) = match (&raw.rope_parameters, raw.rope_theta) {
            (Some(p), _) => (p.rope_theta, p.rope_type.clone()),
            (None, Some(t)) => (t, None),
            (None, None) => return Err(err("missing `rope_parameters.rope_theta`".into())),
        };
        if let Some(t) = rope_type.as_deref() {
            if t != "default" {
                return Err(err(format!(
                    "rope_type `{t}` is not supported (GLM-5.x uses `default`)"
                )));
            }
        }
        for (name, v) in [
            ("hidden_size", raw.hidden_size),
            ("vocab_size", raw.vocab_size),
            ("num_attention_heads", raw.num_attention_heads),
            ("kv_lora_rank", raw.kv_lora_rank),
            ("q_lora_rank", raw.q_lora_rank),
            ("n_routed_experts", raw.n_routed_experts),
            ("num_experts_per_tok", raw.num_experts_per_tok),
            ("index_topk", raw.index_topk),
            ("index_n_heads", raw.index_n_heads),
        ] {
            if v == 0 {
                return Err(err(format!("`{name}` must be positive")));
            }
        }
        if raw.num_experts_per_tok > raw.n_routed_experts {
            return Err(err(format!(
                "num_experts_per_tok {} exceeds n_routed_experts {}",
                raw.num_experts_per_tok, raw.n_routed_experts
            )));
        }
        if !raw.qk_rope_head_dim.is_multiple_of(2) || raw.qk_rope_head_dim == 0 {
            return Err(err("`qk_rope_head_dim` must be even and positive".into()));
        }
        if raw.index_head_dim < raw.qk_rope_head_dim {
            return Err(err(
                "`index_head_dim` must be at least `qk_rope_head_dim`".into()
            ));
        }
        let dense = match &raw.mlp_layer_types {
            Some(t) => {
                if t.len() != n {
                    return Err(err(format!(
                        "`mlp_layer_types` has {} entries, want {n}",
                        t.len()
                    )));
                }
                t.iter()
                    .enumerate()
                    .map(|(i, s)| match s.as_str() {
                        "dense" => Ok(true),
                        "sparse" => Ok(false),
                        o => Err(err(format!(
                            "`mlp_layer_types[{i}]` = `{o}` (want dense|sparse)"
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            None => (0..n).map(|i| i < raw.first_k_dense_replace).collect(),
        };
        let indexer_full = indexer_schedule(&raw).map_err(err)?;
        let eos_ids = eos_list(raw.eos_token_id.as_ref());
        Ok(Config {
            raw,
            path: path.to_path_buf(),
            dense,
            indexer_full,
            rope_theta,
            eos_ids,
        })
    }

    /// Attention heads.
    pub fn heads(&self) -> usize {
        self.raw.num_attention_heads
    }
    /// `qk_nope + qk_rope`.
    pub fn qk_head_dim(&self) -> usize {
        self.raw.qk_nope_head_dim + self.raw.qk_rope_head_dim
    }
    /// The MTP layer's index (`num_hidden_layers`), when the config declares one.
    pub fn mtp_layer(&self) -> Option<usize> {
        (self.raw.num_nextn_predict_layers > 0).then_some(self.raw.num_hidden_layers)
    }
}

/// The IndexShare schedule (§2.2): an explicit `indexer_types` wins, then an `F`/`S` pattern,
/// then the `index_topk_freq` / `index_skip_topk_offset` formula.
fn indexer_schedule(raw: &RawConfig) -> std::result::Result<Vec<bool>, String> {
    let n = raw.num_hidden_layers;
    let freq = raw.index_topk_freq.unwrap_or(1).max(1);
    let offset = raw.index_skip_topk_offset.unwrap_or(2);
    let derived: Vec<bool> = (0..n)
        .map(|i| (i + 1).saturating_sub(offset) % freq == 0)
        .collect();
    let sched = if let Some(t) = &raw.indexer_types {
        if t.len() != n && t.len() != n + 1 {
            return Err(format!("`indexer_types` has {} entries, want {n}", t.len()));
        }
        let v = t
            .iter()
            .take(n)
            .enumerate()
            .map(|(i, s)| match s.as_str() {
                "full" => Ok(true),
                "shared" => Ok(false),
                o => Err(format!("`indexer_types[{i}]` = `{o}` (want full|shared)")),
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if v != derived {
            tracing::warn!("indexer_types differs from the index_topk_freq/offset formula; using the explicit list");
        }
        v
    } else if let Some(p) = &raw.index_topk_pattern {
        if p.len() != n {
            return Err(format!(
                "`index_topk_pattern` has {} characters, want {n}",
                p.len()
            ));
        }
        p.chars()
            .map(|c| match c {
                'F' => Ok(true),
                'S' => Ok(false),
                o => Err(format!("`index_topk_pattern` character `{o}` (want F|S)")),
            })
            .collect::<std::result::Result<Vec<_>, _>>()?
    } else {
        derived
    };
    if n > 0 && !sched[0] {
        return Err(
            "layer 0 must run a full indexer (a shared layer needs a full layer before it)".into(),
        );
    }
    Ok(sched)
}

/// Parses an `eos_token_id` value: an integer, a list of integers, or absent.
pub fn eos_list(v: Option<&serde_json::Value>) -> Vec<u32> {
    let mut out: Vec<u32> = match v {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    };
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> serde_json::Value {
        serde_json::json!({
            "model_type": "glm_moe_dsa", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 78,
            "first_k_dense_replace": 3, "intermediate_size": 128, "moe_intermediate_size": 32,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 4, "q_lora_rank": 48,
            "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 24,
            "index_n_heads": 8, "index_head_dim": 32, "index_topk": 8,
            "rope_parameters": {"rope_theta": 8000000.0, "rope_type": "default"},
            "eos_token_id": [154820, 154827, 154829]
        })
    }

    #[test]
    fn glm52_indexshare_schedule() {
        let mut v = base();
        v["index_topk_freq"] = 4.into();
        v["index_skip_topk_offset"] = 3.into();
        let c = Config::from_json(Path::new("c.json"), v).unwrap();
        let full: Vec<usize> = (0..78).filter(|&i| c.indexer_full[i]).collect();
        assert_eq!(
            full,
            [0, 1, 2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 66, 70, 74]
        );
        assert_eq!(c.dense.iter().filter(|d| **d).count(), 3);
        assert_eq!(c.eos_ids, [154820, 154827, 154829]);
    }

    #[test]
    fn glm5_all_full() {
        let c = Config::from_json(Path::new("c.json"), base()).unwrap();
        assert!(c.indexer_full.iter().all(|f| *f));
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (
                "model_type",
                serde_json::json!("llama"),
                "model_type `llama`",
            ),
            ("n_group", serde_json::json!(8), "n_group"),
            (
                "mlp_layer_types",
                serde_json::json!(["dense"]),
                "mlp_layer_types",
            ),
            (
                "indexer_types",
                serde_json::json!(["shared"]),
                "indexer_types",
            ),
            (
                "rope_parameters",
                serde_json::json!({"rope_theta": 1.0, "rope_type": "yarn"}),
                "rope_type",
            ),
            ("hidden_size", serde_json::json!("wide"), "hidden_size"),
        ];
        for (k, v, want) in cases {
            let mut c = base();
            c[k] = v;
            let e = Config::from_json(Path::new("cfg.json"), c)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.contains("cfg.json"), "{e}");
        }
    }
}
