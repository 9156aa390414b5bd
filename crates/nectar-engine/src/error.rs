//! Typed errors for the text side of the engine.
//!
//! Every variant names what failed (the file, the field, the token id) so a
//! message shown to an operator is actionable without a backtrace.

use std::path::PathBuf;

/// Result alias used throughout `nectar-engine`.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong turning text into ids and back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A file is not valid JSON.
    #[error("{} is not valid JSON: {source}", path.display())]
    Json {
        /// The file that failed to parse.
        path: PathBuf,
        /// The parser's error (carries line and column).
        #[source]
        source: serde_json::Error,
    },

    /// A JSON file parsed, but a field has a shape we cannot use.
    #[error("{}: field `{field}` {reason}", path.display())]
    InvalidField {
        /// The file holding the field.
        path: PathBuf,
        /// Dotted path of the offending field, e.g. `bos_token.content`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },

    /// `tokenizer.json` could not be turned into a tokenizer.
    #[error("cannot load tokenizer from {}: {source}", path.display())]
    TokenizerLoad {
        /// The tokenizer file.
        path: PathBuf,
        /// The `tokenizers` crate's error.
        #[source]
        source: tokenizers::Error,
    },

    /// The tokenizer failed to encode text.
    #[error("tokenizer {} failed to encode text: {source}", path.display())]
    Encode {
        /// The tokenizer file in use.
        path: PathBuf,
        /// The `tokenizers` crate's error.
        #[source]
        source: tokenizers::Error,
    },

    /// The tokenizer failed to decode ids.
    #[error("tokenizer {} failed to decode ids: {source}", path.display())]
    Decode {
        /// The tokenizer file in use.
        path: PathBuf,
        /// The `tokenizers` crate's error.
        #[source]
        source: tokenizers::Error,
    },

    /// A token id has no entry in the vocabulary.
    ///
    /// `tokenizers` silently drops such ids when decoding; we refuse instead,
    /// because an out-of-vocabulary id means the caller (usually the sampler)
    /// has a bug that silent dropping would hide.
    #[error("token id {id} is not in the vocabulary of {} (size {vocab_size})", path.display())]
    UnknownTokenId {
        /// The tokenizer file in use.
        path: PathBuf,
        /// The offending id.
        id: u32,
        /// Vocabulary size including added tokens.
        vocab_size: usize,
    },

    /// The chat template does not compile.
    #[error("chat template from {} does not compile: {source}", path.display())]
    TemplateSyntax {
        /// Where the template came from.
        path: PathBuf,
        /// minijinja's error (carries the line).
        #[source]
        source: minijinja::Error,
    },

    /// The chat template failed while rendering.
    #[error("chat template from {} failed to render: {source}", path.display())]
    TemplateRender {
        /// Where the template came from.
        path: PathBuf,
        /// minijinja's error (carries the line).
        #[source]
        source: minijinja::Error,
    },

    /// The chat template itself rejected the conversation via
    /// `raise_exception(...)` (e.g. "roles must alternate"). This is the
    /// caller's input being wrong, not the template being broken.
    #[error("chat template from {} rejected the conversation: {message}", path.display())]
    TemplateRaised {
        /// Where the template came from.
        path: PathBuf,
        /// The message the template raised.
        message: String,
    },

    /// The model failed (load or forward).
    #[error(transparent)]
    Model(#[from] nectar_model::Error),
    /// A request that cannot be served as given (names what is wrong).
    #[error("invalid request: {0}")]
    Request(String),
    /// A generation parameter (sampling knob, stop string, limit) is out of
    /// range. `param` is the request field's name, e.g. `top_p`, so an API
    /// layer can point at the offending field.
    #[error("invalid `{param}`: {reason}")]
    InvalidParam {
        /// The parameter's name as it appears in [`crate::SamplingParams`]
        /// or [`crate::Request`].
        param: &'static str,
        /// What is wrong with the value given.
        reason: String,
    },

    /// A vector handed to the sampler does not have the length it must.
    #[error("{what} has {found} entries, expected {expected}")]
    ShapeMismatch {
        /// Which input, e.g. `logits` or `allowed mask`.
        what: &'static str,
        /// The length it must have (the vocabulary size).
        expected: usize,
        /// The length it has.
        found: usize,
    },

    /// Nothing can be sampled: every logit is masked out, NaN or `-inf`.
    /// With a grammar mask this means the grammar and the model disagree;
    /// otherwise the model produced non-finite logits.
    #[error("no token can be sampled: every candidate is masked out or has a non-finite logit")]
    NoCandidates,

    /// The operating system could not supply a random seed for a request
    /// that did not give one.
    #[error("cannot seed the sampler from OS entropy: {0}")]
    Entropy(#[source] rand_chacha::rand_core::OsError),

    /// Speculative decoding's bookkeeping broke an invariant (a cache
    /// length that does not match the tokens, a drafter that overran its
    /// round). A bug, reported instead of producing wrong output.
    #[error("speculative decoding: {0}")]
    Speculation(String),

    /// A session could not be saved, restored or reused (names the file).
    #[error(transparent)]
    Session(#[from] crate::session::SessionError),

    /// Structured output failed while generating (the grammar rejected a
    /// token it should have allowed, or its parser hit a limit). A grammar
    /// that does not compile is [`Error::InvalidParam`] instead.
    #[error("structured output: {0}")]
    Grammar(String),

    /// The caller passed a value the chat template cannot take.
    #[error("invalid chat input `{field}`: {reason}")]
    InvalidChatInput {
        /// Which input was wrong, e.g. `messages` or `extra.tools`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_file() {
        let err = Error::InvalidField {
            path: PathBuf::from("/m/tokenizer_config.json"),
            field: "chat_template".into(),
            reason: "must be a string".into(),
        };
        let msg = err.to_string();
        assert!(msg.contains("/m/tokenizer_config.json"), "{msg}");
        assert!(msg.contains("chat_template"), "{msg}");
    }

    #[test]
    fn error_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Error>();
    }
}
