//! A scripted [`Backend`] for the protocol layer's unit tests: it "generates" a fixed list of
//! text deltas, so event sequences, tool-call parsing and error shapes can be tested without a
//! model. Integration tests (`tests/`) use the real demo model instead.

use crate::backend::{
    Backend, BackendError, BackendStats, Finish, FinishReason, GenEvent, GenRequest, GenStart,
    LoadState, ModelInfo, Prompt, Usage,
};
use std::sync::Mutex;
use tokio::sync::mpsc::UnboundedSender;

/// The scripted backend.
pub struct MockBackend {
    /// Text deltas to emit, one token each.
    pub script: Vec<String>,
    /// How the generation ends.
    pub finish: FinishReason,
    /// Load state to report.
    pub state: LoadState,
    /// Refuse every request with this.
    pub refuse: Option<BackendError>,
    /// The prompt opens inside `<think>`.
    pub opens_in_reasoning: bool,
    /// Prompt length reported.
    pub prompt_tokens: usize,
    /// Requests seen.
    pub seen: Mutex<Vec<GenRequest>>,
}

impl MockBackend {
    /// A ready backend that emits `script`, then stops.
    pub fn new(script: &[&str]) -> MockBackend {
        MockBackend {
            script: script.iter().map(|s| s.to_string()).collect(),
            finish: FinishReason::Stop,
            state: LoadState::Ready,
            refuse: None,
            opens_in_reasoning: false,
            prompt_tokens: 7,
            seen: Mutex::new(Vec::new()),
        }
    }

    /// The chat messages of the `i`-th request seen.
    pub fn messages(&self, i: usize) -> serde_json::Value {
        match &self.seen.lock().unwrap()[i].prompt {
            Prompt::Chat { messages, .. } => messages.clone(),
            other => panic!("not a chat prompt: {other:?}"),
        }
    }
}

impl Backend for MockBackend {
    fn model_id(&self) -> String {
        "mock-model".into()
    }

    fn load_state(&self) -> LoadState {
        self.state.clone()
    }

    fn info(&self) -> Option<ModelInfo> {
        (self.state == LoadState::Ready).then(|| ModelInfo {
            id: "mock-model".into(),
            context_length: 4096,
            tokenizer: true,
            chat_template: true,
            mtp_head: false,
            mtp: "off".into(),
            parallel: 1,
            memory_budget: None,
            prefetch: "both".into(),
            memory_plan: None,
        })
    }

    fn count_tokens(&self, _prompt: &Prompt) -> Result<usize, BackendError> {
        Ok(self.prompt_tokens)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, BackendError> {
        Ok(format!("<{} ids>", ids.len()))
    }

    fn generate(
        &self,
        req: GenRequest,
        sink: UnboundedSender<GenEvent>,
    ) -> Result<GenStart, BackendError> {
        match (&self.state, &self.refuse) {
            (LoadState::Loading, _) => return Err(BackendError::Loading),
            (_, Some(e)) => return Err(e.clone()),
            _ => {}
        }
        let max = req.max_tokens.unwrap_or(usize::MAX);
        if req.sampling.prompt_logprobs {
            // Prompt tokens 100, 101, …, each predicted with logprob −1.
            let rest = (1..self.prompt_tokens as u32)
                .map(|i| crate::backend::TokenLogprob {
                    id: 100 + i,
                    token: format!("p{i}"),
                    logprob: -1.0,
                    top: vec![],
                })
                .collect();
            let _ = sink.send(GenEvent::Prompt {
                first: (100, "p0".into()),
                rest,
            });
        }
        self.seen.lock().unwrap().push(req);
        let mut n = 0;
        for (i, text) in self.script.iter().enumerate().take(max) {
            let _ = sink.send(GenEvent::Delta {
                ids: vec![i as u32],
                text: text.clone(),
                logprobs: vec![],
            });
            n += 1;
        }
        let reason = if n < self.script.len() {
            FinishReason::Length
        } else {
            self.finish.clone()
        };
        let _ = sink.send(GenEvent::Finish(Finish {
            reason,
            usage: Usage {
                prompt_tokens: self.prompt_tokens,
                completion_tokens: n,
            },
            decode_tok_s: 100.0,
        }));
        Ok(GenStart {
            prompt_tokens: self.prompt_tokens,
            max_tokens: max,
            opens_in_reasoning: self.opens_in_reasoning,
        })
    }

    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }
}
