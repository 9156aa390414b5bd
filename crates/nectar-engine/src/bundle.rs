//! A model directory opened for text: the model plus its tokenizer, chat template and stop set.
use crate::chat_template::ChatTemplate;
use crate::error::{Error, Result};
use crate::stop::stop_token_ids;
use crate::tokenizer::Tokenizer;
use nectar_model::arch::glm5::LoadOptions;
use nectar_model::Glm5;
use std::path::{Path, PathBuf};

/// Everything needed to turn text into tokens, tokens into logits, and back.
#[derive(Debug)]
pub struct ModelBundle {
    /// The model directory.
    pub dir: PathBuf,
    /// The model.
    pub model: Glm5,
    /// `tokenizer.json`, when the directory has one (prompts as ids need none).
    pub tokenizer: Option<Tokenizer>,
    /// The chat template, when the directory has one.
    pub template: Option<ChatTemplate>,
    /// Every id that ends generation: config eos ∪ generation_config eos (never filtered).
    pub stop_ids: Vec<u32>,
}

impl ModelBundle {
    /// Opens `dir`: loads and validates the model, then the optional text files.
    pub fn open(dir: &Path) -> Result<ModelBundle> {
        Self::open_with(dir, &LoadOptions::default())
    }

    /// Opens `dir` with model load options (e.g. a memory budget that streams routed experts).
    pub fn open_with(dir: &Path, opts: &LoadOptions) -> Result<ModelBundle> {
        let model = Glm5::load_with(dir, opts)?;
        let read_json = |name: &str| -> Result<Option<serde_json::Value>> {
            let p = dir.join(name);
            if !p.exists() {
                return Ok(None);
            }
            let bytes = std::fs::read(&p).map_err(|source| Error::Io {
                path: p.clone(),
                source,
            })?;
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| Error::Json { path: p, source })
        };
        let config = read_json("config.json")?.unwrap_or_default();
        let gen = read_json("generation_config.json")?;
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = if tok_path.exists() {
            Some(Tokenizer::from_file(&tok_path)?)
        } else {
            None
        };
        let bundle = ModelBundle {
            dir: dir.to_path_buf(),
            stop_ids: stop_token_ids(&config, gen.as_ref()),
            template: ChatTemplate::from_model_dir(dir)?,
            tokenizer,
            model,
        };
        // The JSON parses and table builds above leave freed pages in the heap: give them back
        // before they count against a small budget (`planner::runtime_reserve`).
        nectar_residency::rss::trim_heap();
        Ok(bundle)
    }

    /// The tokenizer, or an error saying the directory has none.
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            Error::Request(format!(
                "{} has no tokenizer.json: give the prompt as token ids",
                self.dir.display()
            ))
        })
    }

    /// Token ids of a plain-text prompt (no special tokens added: GLM has no BOS).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer()?.encode(text, false)
    }

    /// Token ids of `text` as one user turn of the chat template, ready for the assistant.
    pub fn encode_chat(&self, text: &str) -> Result<Vec<u32>> {
        let t = self.template.as_ref().ok_or_else(|| {
            Error::Request(format!(
                "{} has no chat template (tokenizer_config.json)",
                self.dir.display()
            ))
        })?;
        let msgs = serde_json::json!([{"role": "user", "content": text}]);
        let prompt = t.render(&msgs, None, true, &serde_json::Map::new())?;
        self.tokenizer()?.encode(&prompt, false)
    }
}

/// `budget` lowered to what this process can have now (`nectar_residency::rss::fit_budget`:
/// MemAvailable or the memory cgroup's headroom, less a reserve), with a warning when it is:
/// the one rule `nectar run` and `nectar serve` load with (a budget above a container's limit
/// would have the slab allocated at load and the OOM killer called before any guard acts).
pub fn budget_for_this_process(budget: u64) -> u64 {
    let (b, msg) =
        nectar_residency::rss::fit_budget(budget, &nectar_residency::rss::Reading::now());
    if let Some(m) = msg {
        tracing::warn!("{m}");
    }
    b
}
