//! The timeline sampler: once a second it reads the counters (tokens, the expert caches, TTFTs,
//! MTP drafts, refusals, RSS) and, when anything ran in that second, publishes a `sample` (decode
//! tok/s, mean TTFT of the requests that got their first token, expert hit rate, disk GB/s and
//! the fraction of the second compute waited for misses, MTP acceptance). Every second it also
//! publishes a `status` (RSS vs budget, queue, current requests) and raises `pressure` events:
//! RSS above the budget's guard threshold, expert read errors, requests refused with 429, the
//! RSS guard shrinking the cache, and seconds in which compute waited on the disk more than half
//! the time.

use crate::state::AppState;
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Sampling period.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Fraction of a second spent waiting for misses above which a second is I/O-bound.
const IO_BOUND: f64 = 0.5;

/// Cumulative counters at one instant.
#[derive(Debug, Clone, Default)]
struct Totals {
    at: Option<Instant>,
    generated: u64,
    prompt: u64,
    hits: u64,
    misses: u64,
    bytes: u64,
    wait_s: f64,
    drafted: u64,
    accepted: u64,
    ttft_n: u64,
    ttft_sum: f64,
    read_errors: u64,
    refused: u64,
    shrinks: u64,
}

fn read(state: &AppState) -> Totals {
    let b = state.backend.stats();
    let (ttft_n, ttft_sum) = state.metrics.ttft_totals();
    let mut t = Totals {
        at: Some(Instant::now()),
        generated: b.generated_tokens,
        prompt: b.prompt_tokens,
        drafted: b.mtp_drafted,
        accepted: b.mtp_accepted,
        ttft_n,
        ttft_sum,
        refused: state.metrics.refused_queue_full(),
        ..Totals::default()
    };
    for (_, r) in state.observatory.telemetry() {
        for l in &r.layers {
            t.hits += l.hits;
            t.misses += l.misses;
        }
        t.bytes += r.bytes_read;
        t.wait_s += r.wait_seconds;
        t.read_errors += r.read_errors;
        t.shrinks += r.rss_shrinks;
    }
    t
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A ratio, `None` when the denominator is zero.
fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// The sample of the interval from `a` to `b`, `None` when nothing ran in it.
fn sample(a: &Totals, b: &Totals) -> Option<Value> {
    let dt = match (a.at, b.at) {
        (Some(x), Some(y)) => (y - x).as_secs_f64().max(1e-6),
        _ => return None,
    };
    let d = |x: u64, y: u64| y.saturating_sub(x) as f64;
    let generated = d(a.generated, b.generated);
    let prompt = d(a.prompt, b.prompt);
    let bytes = d(a.bytes, b.bytes);
    if generated == 0.0 && prompt == 0.0 && bytes == 0.0 {
        return None;
    }
    let hits = d(a.hits, b.hits);
    let misses = d(a.misses, b.misses);
    Some(json!({
        "t": unix_now(),
        "dt": dt,
        "decode_tok_s": generated / dt,
        "prompt_tokens": prompt,
        "ttft_ms": ratio(b.ttft_sum - a.ttft_sum, d(a.ttft_n, b.ttft_n)).map(|s| s * 1e3),
        "hit_rate": ratio(hits, hits + misses),
        "disk_gb_s": bytes / dt / 1e9,
        "wait_fraction": ((b.wait_s - a.wait_s) / dt).max(0.0),
        "mtp_acceptance": ratio(d(a.accepted, b.accepted), d(a.drafted, b.drafted)),
    }))
}

/// Pressure events of the interval from `a` to `b`; `over` is whether RSS was already above
/// the threshold (an RSS event is raised only when it crosses).
fn pressure(
    a: &Totals,
    b: &Totals,
    rss: Option<u64>,
    budget: Option<u64>,
    over: &mut bool,
) -> Vec<Value> {
    let mut out = Vec::new();
    let t = unix_now();
    if let (Some(rss), Some(budget)) = (rss, budget) {
        let limit = nectar_residency::rss::threshold(budget);
        let now_over = rss > limit;
        if now_over && !*over {
            out.push(json!({"t": t, "kind": "rss", "rss": rss, "threshold": limit, "budget": budget,
                "message": format!("RSS {:.2} GB is above the guard threshold {:.2} GB", rss as f64 / 1e9, limit as f64 / 1e9)}));
        }
        *over = now_over;
    }
    let mut count = |kind: &str, n: u64, what: &str| {
        if n > 0 {
            out.push(json!({"t": t, "kind": kind, "count": n, "message": format!("{n} {what}")}));
        }
    };
    count(
        "read_error",
        b.read_errors.saturating_sub(a.read_errors),
        "expert read(s) failed",
    );
    count(
        "queue_full",
        b.refused.saturating_sub(a.refused),
        "request(s) refused: queue full (429)",
    );
    count(
        "rss_shrink",
        b.shrinks.saturating_sub(a.shrinks),
        "expert cache shrink(s) by the RSS guard",
    );
    if let (Some(x), Some(y)) = (a.at, b.at) {
        let f = (b.wait_s - a.wait_s) / (y - x).as_secs_f64().max(1e-6);
        if f > IO_BOUND {
            out.push(json!({"t": t, "kind": "io_wait", "wait_fraction": f,
                "message": format!("compute waited for expert reads {:.0} % of the second", f * 100.0)}));
        }
    }
    out
}

/// Runs the sampler until the runtime stops.
pub async fn run(state: AppState) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut prev = read(&state);
    let mut over = false;
    loop {
        tick.tick().await;
        let now = read(&state);
        let obs = &state.observatory;
        if let Some(s) = sample(&prev, &now) {
            obs.sample(s);
        }
        let rss = nectar_residency::rss::rss_bytes();
        let budget = obs.budget();
        for p in pressure(&prev, &now, rss, budget, &mut over) {
            obs.pressure(p);
        }
        let b = state.backend.stats();
        obs.publish(
            "status",
            json!({
                "t": unix_now(),
                "rss": rss,
                "budget": budget,
                "queue": b.queue_depth,
                "active": b.active,
                "requests": state.requests.live(),
            }),
        );
        prev = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, s: f64) -> Option<Instant> {
        Some(t0 + Duration::from_secs_f64(s))
    }

    #[test]
    fn a_sample_needs_activity_and_reports_rates() {
        let t0 = Instant::now();
        let a = Totals {
            at: at(t0, 0.0),
            ..Totals::default()
        };
        let idle = Totals {
            at: at(t0, 1.0),
            ..Totals::default()
        };
        assert!(sample(&a, &idle).is_none());
        let b = Totals {
            at: at(t0, 2.0),
            generated: 20,
            hits: 3,
            misses: 1,
            bytes: 4_000_000_000,
            wait_s: 0.5,
            ttft_n: 2,
            ttft_sum: 0.3,
            drafted: 4,
            accepted: 3,
            ..Totals::default()
        };
        let s = sample(&a, &b).unwrap();
        assert_eq!(s["decode_tok_s"], 10.0);
        assert_eq!(s["hit_rate"], 0.75);
        assert_eq!(s["disk_gb_s"], 2.0);
        assert_eq!(s["wait_fraction"], 0.25);
        assert!((s["ttft_ms"].as_f64().unwrap() - 150.0).abs() < 1e-9);
        assert_eq!(s["mtp_acceptance"], 0.75);
    }

    #[test]
    fn pressure_is_raised_on_crossings_and_counted_faults() {
        let t0 = Instant::now();
        let a = Totals {
            at: at(t0, 0.0),
            ..Totals::default()
        };
        let b = Totals {
            at: at(t0, 1.0),
            read_errors: 2,
            refused: 1,
            wait_s: 0.9,
            ..Totals::default()
        };
        let budget = 1u64 << 30;
        let mut over = false;
        let kinds = |v: Vec<Value>| {
            v.iter()
                .map(|p| p["kind"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        let p = pressure(&a, &b, Some(budget * 2), Some(budget), &mut over);
        assert_eq!(kinds(p), ["rss", "read_error", "queue_full", "io_wait"]);
        // Still over: no second RSS event.
        let p = pressure(&b, &b, Some(budget * 2), Some(budget), &mut over);
        assert!(kinds(p).is_empty());
        assert!(over);
    }
}
