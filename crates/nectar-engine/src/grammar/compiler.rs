//! Grammars compiled against one tokenizer: the cached parser factory.

use super::matcher::GrammarMatcher;
use super::{tok_env, GrammarSpec};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::ParserFactory;
use std::sync::Arc;

/// Compiles [`GrammarSpec`]s into per-request matchers for one tokenizer,
/// one model vocabulary size and one eos set.
///
/// Building it walks the whole vocabulary (the token trie and llguidance's
/// bias slices), so it is built once per tokenizer and cached there
/// ([`GrammarCompiler::for_tokenizer`]); compiling a grammar is per request.
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab_size: usize,
    eos: Vec<u32>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab_size", &self.vocab_size)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// Builds the compiler for `tokenizer`, a model with `vocab_size` logits
    /// per row, and `eos`, the model's stop ids (the tokens a complete
    /// grammar allows). Uncached: see [`Self::for_tokenizer`].
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, eos: &[u32]) -> Result<GrammarCompiler> {
        let mut eos = eos.to_vec();
        eos.sort_unstable();
        eos.dedup();
        let env = tok_env::build(tokenizer, vocab_size, &eos)?;
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Request(format!("structured output: {e}")))?;
        // llguidance logs grammar warnings to stderr by default; errors reach
        // the caller as `InvalidParam` instead.
        factory.quiet();
        Ok(GrammarCompiler {
            factory,
            vocab_size,
            eos,
        })
    }

    /// The compiler cached on `tokenizer` (built on first use, shared by its
    /// clones); a different vocabulary size or eos set than the cached one
    /// gets a fresh, uncached compiler.
    pub fn for_tokenizer(
        tokenizer: &Tokenizer,
        vocab_size: usize,
        eos: &[u32],
    ) -> Result<Arc<GrammarCompiler>> {
        let mut key = eos.to_vec();
        key.sort_unstable();
        key.dedup();
        let cache = tokenizer.grammar_cache();
        if let Some(c) = cache.get() {
            if c.vocab_size == vocab_size && c.eos == key {
                return Ok(c.clone());
            }
            return Ok(Arc::new(Self::new(tokenizer, vocab_size, eos)?));
        }
        let built = Arc::new(Self::new(tokenizer, vocab_size, eos)?);
        // Two threads may build at once; either result is the same.
        Ok(cache.get_or_init(|| built).clone())
    }

    /// Compiles `spec` for one request. A schema, regex or grammar that does
    /// not compile is [`Error::InvalidParam`] naming the parameter
    /// ([`GrammarSpec::param`]).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<GrammarMatcher> {
        let grammar = match spec {
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(Error::InvalidParam {
                        param: spec.param(),
                        reason: "a JSON schema must be an object or a boolean".into(),
                    });
                }
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| Error::InvalidParam {
                param: spec.param(),
                reason: e.to_string(),
            })?;
        GrammarMatcher::new(parser, self.vocab_size, spec.param())
    }
}

/// JSON output is compact (`{"a":1,"b":[2,3]}`) unless the schema sets its
/// own llguidance options (`"x-guidance"`). llguidance's default allows any
/// whitespace between tokens, and a model may then emit whitespace until
/// `max_tokens` (the demo model does, greedily): a valid prefix that never
/// completes.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}
