//! Text in, text out.
//!
//! `nectar-engine` is the only crate that knows about text: it turns chat
//! messages into a prompt (chat template) and the prompt into token ids
//! (tokenizer); it chooses each next token (sampler), decides when to stop
//! (stop ids and stop strings) and turns generated ids back into text as
//! they arrive (stream decoder). A request is a [`RequestState`] stepped by
//! the one decode driver, a [`Batch`]: many requests together, one row each,
//! in one forward per step (continuous batching), each row speculating on its
//! own if asked (MTP or prompt-lookup drafts, verified in the same forward as
//! the other rows' tokens); [`generate`] is a batch of one. Sessions ([`Session`]: caches
//! kept between turns with prefix reuse, saved and restored crash-safely)
//! and structured output ([`GrammarSpec`] on a [`Request`]: JSON schema,
//! JSON object, regex or Lark grammar, through `llguidance`). GLM's output
//! format — its reasoning and tool-call tags, the streaming parser of its
//! output and the grammar of a forced tool call — is in one place, [`glm`]. The
//! model crate only ever sees token ids and knows nothing of text.
//!
//! The decision a newcomer would question: greedy decoding goes through the
//! full sampler rather than a shortcut. It costs one copy of the logits row,
//! and it means bias, penalties and the grammar mask apply to greedy
//! requests too, while the default parameters still reproduce a plain argmax
//! bit for bit (every neutral knob is skipped, not applied as a no-op).

#![deny(missing_docs)]

mod batch;
mod bundle;
mod chat_template;
mod error;
mod generate;
pub mod glm;
mod grammar;
mod jinja_env;
mod prefix_cache;
mod py_json;
mod request;
mod request_state;
mod sampler;
mod session;
mod spec;
mod stop;
mod stream_decoder;
mod strftime;
pub use strftime::rfc3339;
mod tokenizer;
mod usage_log;

pub use batch::{
    Batch, BatchOptions, RowOptions, RowStep, RowSummary, StepCost, StepReport,
    DEFAULT_PREFILL_CHUNK,
};
pub use bundle::{budget_for_this_process, ModelBundle};
pub use chat_template::ChatTemplate;
pub use error::{Error, Result};
pub use generate::{
    generate, generate_cached, generate_greedy, generate_row, generate_spec, generate_speculative,
    generate_speculative_cached, generate_with, Generation,
};
pub use grammar::{GrammarCompiler, GrammarMatcher, GrammarSpec};
pub use prefix_cache::{PrefixCache, PrefixCacheStats};
pub use request::{FinishReason, Request, StopCause};
pub use request_state::{RequestState, Step, Verified};
pub use sampler::{
    argmax, distribution, log_softmax, logprobs, process_logits, Distribution, Logprobs, Sampled,
    Sampler, SamplingParams, TokenHistory, MAX_TOP_LOGPROBS,
};
pub use session::{
    check_path as check_session_path, coli_kv, format as session_format, hex, Loaded,
    ModelIdentity, Reuse, Session, SessionError, SessionFormat,
};
pub use spec::{
    lookup, verify_coupled, verify_draft, AutoDecision, AutoGamma, Drafter, MtpDrafter,
    PromptLookup, Proposals, RowRound, Shape, SpecStats, Speculation, Speculator, StepSample,
    StepUnion, UnionCounts, UnionMeter, UnionStats, Verdict, AUTO_WINDOW, DEFAULT_DRAFT_TOKENS,
    MAX_DRAFT, MTP_ABSORB_WINDOW,
};
pub use stop::{stop_token_ids, StopMatcher, StopScan};
pub use stream_decoder::StreamDecoder;
pub use tokenizer::Tokenizer;
pub use usage_log::{pin_request, Pin, UsageLog, LEDGER_FILE};
