//! Per-request records: what the request log line says (id, route, model, prompt and generated
//! tokens, time to first token, total time, finish reason, status), what the latency histograms
//! observe, and what the page lists as current requests.
//!
//! The `track` middleware opens a record for every request and makes it the task's current
//! record while the handler runs; a generation started by that handler picks it up
//! ([`RequestRecord::current`]) and reports its tokens and finish into it, also after the
//! handler returned (a stream). The log line is written when the response is complete: at once,
//! or when a streamed body ends or its client goes away.

use crate::metrics::Metrics;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

tokio::task_local! {
    static CURRENT: Arc<RequestRecord>;
}

/// The tracing target of the request log line (filter it with `NECTAR_LOG`).
pub const LOG_TARGET: &str = "nectar_server::request";

/// Routes whose requests are logged at debug, not info: polls by the page and by monitoring
/// would drown the request log.
pub fn is_quiet(route: &str) -> bool {
    matches!(
        route,
        "/health" | "/metrics" | "/stats" | "/" | "/experts.json"
    ) || route.starts_with("/experts/")
        || route.starts_with("/assets/")
}

#[derive(Debug, Default)]
struct Progress {
    model: Option<String>,
    prompt_tokens: usize,
    generated: usize,
    ttft: Option<Duration>,
    last_token: Option<Instant>,
    finish: Option<String>,
}

/// One request in flight.
#[derive(Debug)]
pub struct RequestRecord {
    /// Process-unique id (also the `x-request-id` response header).
    pub id: u64,
    /// HTTP method.
    pub method: String,
    /// Route pattern.
    pub route: String,
    started: Instant,
    started_unix: f64,
    metrics: Arc<Metrics>,
    progress: Mutex<Progress>,
}

impl RequestRecord {
    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The record of the request this task is answering, if any.
    pub fn current() -> Option<Arc<RequestRecord>> {
        CURRENT.try_with(Arc::clone).ok()
    }

    /// Runs `f` with `record` as the task's current record.
    pub async fn scope<F: std::future::Future>(record: Arc<RequestRecord>, f: F) -> F::Output {
        CURRENT.scope(record, f).await
    }

    /// The request was accepted for generation by `model` with a prompt of `prompt_tokens`.
    pub fn generation_started(&self, model: &str, prompt_tokens: usize) {
        let mut p = self.progress();
        p.model = Some(model.to_owned());
        p.prompt_tokens = prompt_tokens;
    }

    /// `n` generated tokens reached the request (the first one fixes the TTFT; each gap since
    /// the previous delivery is observed once per token, split evenly).
    pub fn tokens(&self, n: usize) {
        if n == 0 {
            return;
        }
        let now = Instant::now();
        let mut p = self.progress();
        match p.last_token {
            None => {
                let ttft = now - self.started;
                p.ttft = Some(ttft);
                self.metrics.observe_ttft(ttft.as_secs_f64());
                for _ in 1..n {
                    self.metrics.observe_inter_token(0.0);
                }
            }
            Some(last) => {
                let gap = (now - last).as_secs_f64() / n as f64;
                for _ in 0..n {
                    self.metrics.observe_inter_token(gap);
                }
            }
        }
        p.last_token = Some(now);
        p.generated += n;
    }

    /// The generation ended (`reason`: `stop`, `length`, `cancelled`, `error`); `generated`
    /// counts every token the model produced (a final stop id included).
    pub fn finished(&self, reason: &str, generated: usize) {
        let mut p = self.progress();
        if p.finish.is_none() {
            self.metrics
                .observe_e2e(self.started.elapsed().as_secs_f64());
        }
        p.finish = Some(reason.to_owned());
        p.generated = p.generated.max(generated);
    }

    /// The page's view of the request.
    pub fn json(&self) -> Value {
        let p = self.progress();
        json!({
            "id": self.id,
            "route": self.route,
            "model": p.model,
            "started": self.started_unix,
            "elapsed_ms": self.started.elapsed().as_secs_f64() * 1e3,
            "prompt_tokens": p.prompt_tokens,
            "generated_tokens": p.generated,
            "ttft_ms": p.ttft.map(|d| d.as_secs_f64() * 1e3),
            "finish": p.finish,
        })
    }

    /// Writes the request's log line (info; debug for [`is_quiet`] routes and without a
    /// generation). `status` is the HTTP status sent.
    pub fn log(&self, status: u16) {
        let p = self.progress();
        let total_ms = self.started.elapsed().as_secs_f64() * 1e3;
        let ttft_ms = p.ttft.map(|d| d.as_secs_f64() * 1e3);
        let model = p.model.as_deref().unwrap_or("");
        let finish = p.finish.as_deref().unwrap_or("");
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    target: LOG_TARGET,
                    id = self.id,
                    method = %self.method,
                    route = %self.route,
                    model,
                    status,
                    prompt_tokens = p.prompt_tokens,
                    generated_tokens = p.generated,
                    ttft_ms,
                    total_ms,
                    finish,
                    "request"
                )
            };
        }
        if is_quiet(&self.route) && p.model.is_none() {
            line!(debug);
        } else {
            line!(info);
        }
    }
}

/// The requests being answered now.
#[derive(Debug, Default)]
pub struct Requests {
    next: AtomicU64,
    live: Mutex<BTreeMap<u64, Arc<RequestRecord>>>,
}

/// Status logged for a request whose client went away before the response was complete
/// (nginx's convention; never sent).
pub const CLIENT_CLOSED: u16 = 499;

/// Removes a record from the live set (and logs it) when the response is complete, or when the
/// request is dropped before it is (logged with [`CLIENT_CLOSED`]).
#[derive(Debug)]
pub struct Done {
    requests: Arc<Requests>,
    record: Arc<RequestRecord>,
    status: u16,
}

impl Done {
    /// The status the response was sent with.
    pub fn status(&mut self, status: u16) {
        self.status = status;
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        self.record.log(self.status);
        self.requests
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.record.id);
    }
}

impl Requests {
    /// Opens the record of a new request.
    pub fn open(&self, method: &str, route: &str, metrics: Arc<Metrics>) -> Arc<RequestRecord> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let started_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let r = Arc::new(RequestRecord {
            id,
            method: method.to_owned(),
            route: route.to_owned(),
            started: Instant::now(),
            started_unix,
            metrics,
            progress: Mutex::new(Progress::default()),
        });
        if !is_quiet(route) {
            self.live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, r.clone());
        }
        r
    }

    /// A guard that logs `record` and forgets it when dropped: with [`CLIENT_CLOSED`] unless
    /// [`Done::status`] sets the status sent.
    pub fn done(self: &Arc<Self>, record: Arc<RequestRecord>) -> Done {
        Done {
            requests: self.clone(),
            record,
            status: CLIENT_CLOSED,
        }
    }

    /// The requests being answered now (the observability routes' own polls left out).
    pub fn live(&self) -> Vec<Value> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.values().map(|r| r.json()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_times_its_first_token_and_counts_tokens() {
        let metrics = Arc::new(Metrics::default());
        let reqs = Arc::new(Requests::default());
        let r = reqs.open("POST", "/v1/chat/completions", metrics.clone());
        r.generation_started("demo", 7);
        assert_eq!(reqs.live().len(), 1);
        r.tokens(1);
        r.tokens(2);
        r.finished("stop", 4);
        let v = r.json();
        assert_eq!(v["prompt_tokens"], 7);
        assert_eq!(v["generated_tokens"], 4);
        assert_eq!(v["finish"], "stop");
        assert!(v["ttft_ms"].as_f64().is_some());
        assert_eq!(metrics.ttft_totals().0, 1);
        let mut done = reqs.done(r);
        done.status(200);
        drop(done);
        assert!(reqs.live().is_empty());
        // The page's polls are not current requests.
        let poll = reqs.open("GET", "/experts/map", metrics);
        assert!(reqs.live().is_empty());
        drop(poll);
    }
}
