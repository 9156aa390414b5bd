//! Counters of the HTTP side, and the Prometheus text rendering of them plus the backend's.
//!
//! Routes are labelled by their pattern (`/v1/responses/{id}`), never by the raw path, so label
//! cardinality stays bounded whatever clients request.

use crate::backend::{BackendStats, LoadState};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// HTTP counters.
#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    by_route: Mutex<BTreeMap<(String, u16), u64>>,
    in_flight: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            by_route: Mutex::new(BTreeMap::new()),
            in_flight: AtomicU64::new(0),
        }
    }
}

/// Decrements the in-flight gauge when dropped (also when the client goes away mid-request).
#[derive(Debug)]
pub struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Counts a request as in flight until the guard drops (the guard may outlive the handler:
    /// it travels with a streaming body).
    pub fn begin_owned(self: Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// Counts one answered request.
    pub fn record(&self, route: &str, status: u16) {
        let mut m = self.by_route.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((route.to_owned(), status)).or_insert(0) += 1;
    }

    /// Requests answered so far, all routes and statuses.
    pub fn requests_total(&self) -> u64 {
        let m = self.by_route.lock().unwrap_or_else(|p| p.into_inner());
        m.values().sum()
    }

    /// Requests being answered now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Seconds since the server started.
    pub fn uptime_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The Prometheus text exposition (format 0.0.4) of these counters and `backend`'s.
    pub fn render(&self, backend: &BackendStats, state: &LoadState) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let one = |v: String| vec![(String::new(), v)];
        {
            let m = self.by_route.lock().unwrap_or_else(|p| p.into_inner());
            let samples: Vec<(String, String)> = m
                .iter()
                .map(|((route, status), n)| {
                    (
                        format!("{{route=\"{}\",status=\"{status}\"}}", escape(route)),
                        n.to_string(),
                    )
                })
                .collect();
            metric(
                "nectar_http_requests_total",
                "counter",
                "HTTP requests answered, by route pattern and status.",
                &samples,
            );
        }
        metric(
            "nectar_http_requests_in_flight",
            "gauge",
            "HTTP requests being answered now (open streams included).",
            &one(self.in_flight().to_string()),
        );
        metric(
            "nectar_model_ready",
            "gauge",
            "1 when the model is loaded and serving, 0 while loading or after a failed load.",
            &one(u8::from(*state == LoadState::Ready).to_string()),
        );
        metric(
            "nectar_queue_depth",
            "gauge",
            "Requests waiting for the model thread.",
            &one(backend.queue_depth.to_string()),
        );
        metric(
            "nectar_queue_capacity",
            "gauge",
            "Requests that may wait before new ones get 429.",
            &one(backend.queue_capacity.to_string()),
        );
        metric(
            "nectar_generations_active",
            "gauge",
            "Generations running now.",
            &one(backend.active.to_string()),
        );
        metric(
            "nectar_generations_total",
            "counter",
            "Generations that ran to a finish (cancelled ones included).",
            &one(backend.requests_completed.to_string()),
        );
        metric(
            "nectar_generations_cancelled_total",
            "counter",
            "Generations stopped because the client went away.",
            &one(backend.requests_cancelled.to_string()),
        );
        metric(
            "nectar_generations_failed_total",
            "counter",
            "Generations that failed inside the model.",
            &one(backend.requests_failed.to_string()),
        );
        metric(
            "nectar_prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            &one(backend.prompt_tokens.to_string()),
        );
        metric(
            "nectar_generated_tokens_total",
            "counter",
            "Tokens generated.",
            &one(backend.generated_tokens.to_string()),
        );
        metric(
            "nectar_busy_seconds_total",
            "counter",
            "Seconds the model thread spent generating (prefill and decode).",
            &one(format!("{:.6}", backend.busy_seconds)),
        );
        metric(
            "nectar_last_decode_tokens_per_second",
            "gauge",
            "Decode speed of the most recent generation.",
            &one(format!("{:.3}", backend.last_decode_tok_s)),
        );
        metric(
            "nectar_batch_parallel",
            "gauge",
            "Rows that may decode together (continuous batching).",
            &one(backend.parallel.to_string()),
        );
        metric(
            "nectar_batch_steps_total",
            "counter",
            "Batched forward steps run.",
            &one(backend.batch_steps.to_string()),
        );
        metric(
            "nectar_batch_rows_total",
            "counter",
            "Rows summed over batched steps (rows / steps = mean batch size).",
            &one(backend.batch_rows.to_string()),
        );
        metric(
            "nectar_batch_tokens_per_second",
            "gauge",
            "Tokens per second over all rows of the batch, smoothed over recent steps.",
            &one(format!("{:.3}", backend.batch_tok_s)),
        );
        metric(
            "nectar_sessions_kept",
            "gauge",
            "Finished conversations kept in memory for requests that continue them.",
            &one(backend.sessions.to_string()),
        );
        metric(
            "nectar_session_reused_tokens_total",
            "counter",
            "Prompt tokens not run again because a request continued a kept conversation.",
            &one(backend.session_reused_tokens.to_string()),
        );
        metric(
            "nectar_mtp_drafted_total",
            "counter",
            "MTP drafts checked by the main model.",
            &one(backend.mtp_drafted.to_string()),
        );
        metric(
            "nectar_mtp_accepted_total",
            "counter",
            "MTP drafts accepted.",
            &one(backend.mtp_accepted.to_string()),
        );
        metric(
            "nectar_mtp_main_forwards_total",
            "counter",
            "Main-model forwards after prefill while speculating.",
            &one(backend.mtp_forwards.to_string()),
        );
        metric(
            "nectar_uptime_seconds",
            "gauge",
            "Seconds since the server started.",
            &one(format!("{:.3}", self.uptime_seconds())),
        );
        out
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_help_and_type() {
        let m = Metrics::default();
        m.record("/v1/chat/completions", 200);
        m.record("/v1/chat/completions", 200);
        m.record("a\"b", 404);
        let text = m.render(&BackendStats::default(), &LoadState::Ready);
        assert!(text.contains(
            "nectar_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2"
        ));
        assert!(text.contains("route=\"a\\\"b\""));
        assert!(text.contains("nectar_model_ready 1"));
        let mut names = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                names.push(rest.split(' ').next().unwrap().to_owned());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(names.iter().any(|n| n == name), "{line} has no HELP");
            }
        }
        for n in &names {
            assert!(text.contains(&format!("# TYPE {n} ")), "{n} has no TYPE");
        }
    }
}
