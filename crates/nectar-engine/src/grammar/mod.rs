//! Structured output: constrain generation to a JSON schema, any JSON
//! object, a regular expression or a Lark grammar, with `llguidance`.
//!
//! Three layers, one concern each:
//!
//! - [`tok_env`]: the model's vocabulary as byte strings (llguidance's token
//!   environment), built from our own tokenizer;
//! - [`GrammarCompiler`]: the per-tokenizer parser factory, built once and
//!   cached (the token trie and its bias slices are the expensive part);
//! - [`GrammarMatcher`]: one request's parser state: the mask of allowed
//!   ids, advancing over chosen tokens, forced tokens, rollback.
//!
//! [`crate::RequestState`] owns the matcher: the mask is applied before
//! sampling (the sampler's `allowed` step, after bias and penalties), the
//! matcher advances on every emitted token, and a grammar that is complete
//! and allows nothing but end of sequence ends the request with
//! [`crate::FinishReason::Stop`] ([`crate::StopCause::Grammar`]).

mod compiler;
mod matcher;
mod tok_env;

pub use compiler::GrammarCompiler;
pub use matcher::GrammarMatcher;

use crate::error::Result;
use crate::request::Request;
use crate::tokenizer::Tokenizer;

/// What the output must match. Protocol-neutral: an API layer translates
/// its own field (e.g. OpenAI's `response_format`) into one of these.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON document valid against this JSON Schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// Text fully matching this regular expression (Rust `regex` syntax as
    /// llguidance accepts it; anchored at both ends).
    Regex(String),
    /// Text in the language of this Lark grammar (llguidance's dialect).
    Lark(String),
}

impl GrammarSpec {
    /// The request parameter a bad spec is reported under
    /// ([`crate::Error::InvalidParam`]).
    pub fn param(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) | GrammarSpec::JsonObject => "json_schema",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Lark(_) => "grammar",
        }
    }
}

impl Request {
    /// Compiles the request's grammar for a model with `vocab_size` logits
    /// per row and eos set `model_stop_ids` (the compiler is cached on
    /// `tokenizer`, so only the first call per tokenizer is slow). `None`
    /// without a grammar. An API layer calls it with [`Request::validate`]
    /// to refuse a bad schema, regex or grammar before streaming starts;
    /// [`crate::RequestState::new`] calls it too.
    pub fn compile_grammar(
        &self,
        tokenizer: Option<&Tokenizer>,
        vocab_size: usize,
        model_stop_ids: &[u32],
    ) -> Result<Option<GrammarMatcher>> {
        let Some(spec) = &self.grammar else {
            return Ok(None);
        };
        self.validate(vocab_size, tokenizer.is_some())?;
        match tokenizer {
            Some(tok) => Ok(Some(
                GrammarCompiler::for_tokenizer(tok, vocab_size, model_stop_ids)?.compile(spec)?,
            )),
            // `validate` refuses a grammar without a tokenizer.
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_state_can_move_between_threads_and_the_compiler_is_shared() {
        // A scheduler owns requests on its thread and shares the tokenizer
        // (which caches the compiler) between threads.
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<crate::RequestState>();
        send::<GrammarMatcher>();
        send_sync::<GrammarCompiler>();
        send_sync::<Tokenizer>();
    }

    #[test]
    fn params_name_the_request_field() {
        assert_eq!(GrammarSpec::JsonObject.param(), "json_schema");
        assert_eq!(GrammarSpec::Regex("a".into()).param(), "regex");
        assert_eq!(GrammarSpec::Lark("start: \"a\"".into()).param(), "grammar");
    }
}
