//! What a generation request asks for, and how one ends.

use crate::error::{Error, Result};
use crate::grammar::GrammarSpec;
use crate::sampler::SamplingParams;
use serde::Serialize;

/// One generation request: everything but the model.
///
/// The API layers (CLI flags, HTTP bodies) translate into this; from here on
/// nothing knows which protocol the request came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The prompt as token ids (already templated and tokenised).
    pub prompt_ids: Vec<u32>,
    /// How logits become tokens.
    pub params: SamplingParams,
    /// Generate at most this many tokens (a final stop token included).
    pub max_tokens: usize,
    /// Stop strings: generation ends when one appears in the output text,
    /// which is cut before it. Needs a tokenizer.
    pub stop_strings: Vec<String>,
    /// Ids that end generation besides the model's eos set (which is always
    /// in force and never filtered).
    pub extra_stop_ids: Vec<u32>,
    /// Structured output: the text must match this (JSON schema, any JSON
    /// object, regex, Lark grammar). Needs a tokenizer; compiled when the
    /// request starts, so a bad one fails before any work.
    pub grammar: Option<GrammarSpec>,
}

impl Request {
    /// A greedy request with no extra stops.
    pub fn new(prompt_ids: Vec<u32>, max_tokens: usize) -> Request {
        Request {
            prompt_ids,
            params: SamplingParams::default(),
            max_tokens,
            stop_strings: Vec::new(),
            extra_stop_ids: Vec::new(),
            grammar: None,
        }
    }

    /// Checks the request before any work is done: a non-empty prompt, the
    /// sampling parameters against a vocabulary of `vocab_size` ids, and stop
    /// strings (non-empty, and only when a tokenizer can produce text). The
    /// error names the bad parameter.
    pub fn validate(&self, vocab_size: usize, has_tokenizer: bool) -> Result<()> {
        let bad = |param: &'static str, reason: String| Err(Error::InvalidParam { param, reason });
        if self.prompt_ids.is_empty() {
            return bad("prompt_ids", "the prompt is empty".into());
        }
        self.params.validate(vocab_size)?;
        if let Some(i) = self.stop_strings.iter().position(String::is_empty) {
            return bad("stop", format!("stop string {i} is empty"));
        }
        if !self.stop_strings.is_empty() && !has_tokenizer {
            return bad(
                "stop",
                "stop strings need a tokenizer (the model directory has no tokenizer.json)".into(),
            );
        }
        if let (Some(g), false) = (&self.grammar, has_tokenizer) {
            return bad(
                g.param(),
                "structured output needs a tokenizer (the model directory has no tokenizer.json)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token or a stop string ended the output.
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The consumer asked to stop (a closed stream, a disconnected client).
    Cancelled,
    /// The model finished a tool call. Reserved for the server, which parses
    /// tool calls out of the text and reports them in place of `Stop`; the
    /// engine itself never produces it.
    ToolCalls,
}

impl FinishReason {
    /// OpenAI-style name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// What ended a request whose finish reason is [`FinishReason::Stop`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    /// This stop token id was generated (it is in the tokens, not the text).
    Token(u32),
    /// This stop string appeared in the text (which ends before it).
    String(String),
    /// The structured-output grammar was complete and allowed nothing but
    /// the end of the output (no stop token is generated for it).
    Grammar,
}
