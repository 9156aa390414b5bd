//! The server's Prometheus metrics, through the `prometheus` client: request counters and
//! latency histograms observed as requests run, and the backend's and the expert cache's
//! cumulative counters mirrored into the registry at each scrape.
//!
//! Routes are labelled by their pattern (`/v1/responses/{id}`), never by the raw path, so label
//! cardinality stays bounded whatever clients request. The expert cache's counters carry a
//! `tier` label: `main` (the routed experts of the main layers) or `mtp` (the MTP layer's own,
//! wider slots).

use crate::backend::{BackendStats, LoadState};
use nectar_residency::Telemetry;
use prometheus::{
    Counter, CounterVec, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter,
    IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Latency buckets in seconds: 1 ms to about 9 minutes, doubling.
fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.001, 2.0, 20).unwrap_or_default()
}

/// Everything `/metrics` exposes.
pub struct Metrics {
    started: Instant,
    registry: Registry,
    requests: IntCounterVec,
    requests_total: AtomicU64,
    refused_queue_full: AtomicU64,
    in_flight: IntGauge,
    ttft: Histogram,
    inter_token: Histogram,
    e2e: Histogram,
    /// [`GAUGES`], set at each scrape.
    gauges: Vec<Gauge>,
    /// [`COUNTERS`]: the backend's cumulative counters, mirrored at each scrape.
    counters: Vec<IntCounter>,
    busy_seconds: Counter,
    /// [`EXPERT`]: the expert cache's cumulative counters per tier, mirrored at each scrape.
    expert: Vec<IntCounterVec>,
    expert_seconds: CounterVec,
    expert_slots: GaugeVec,
    /// Routed experts computed, by device (mirrored at each scrape).
    expert_runs: IntCounterVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("requests_total", &self.requests_total())
            .finish()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Decrements the in-flight gauge when dropped (also when the client goes away mid-request).
#[derive(Debug)]
pub struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// The gauges set at each scrape, by name (`nectar_<name>`) and help.
const GAUGES: [(&str, &str); 16] = [
    (
        "model_ready",
        "1 when the model is loaded and serving, 0 while loading or after a failed load.",
    ),
    ("queue_depth", "Requests waiting for the model thread."),
    (
        "queue_capacity",
        "Requests that may wait before new ones get 429.",
    ),
    ("generations_active", "Generations running now."),
    (
        "last_decode_tokens_per_second",
        "Decode speed of the most recent generation.",
    ),
    (
        "batch_parallel",
        "Rows that may decode together (continuous batching).",
    ),
    (
        "batch_tokens_per_second",
        "Tokens per second over all rows of the batch, smoothed over recent steps.",
    ),
    (
        "sessions_kept",
        "Finished conversations kept in memory for requests that continue them.",
    ),
    ("uptime_seconds", "Seconds since the server started."),
    (
        "resident_memory_bytes",
        "Resident set size of the server process (0 where it cannot be read).",
    ),
    (
        "memory_budget_bytes",
        "The memory budget experts are streamed under (0: none, experts memory-mapped).",
    ),
    ("expert_loads_in_flight", "Expert reads in flight now."),
    (
        "gpu_vram_bytes",
        "Device bytes of the matrices in VRAM (--gpu-memory; 0: the CPU only).",
    ),
    ("gpu_matrices", "Matrices in VRAM (spine and experts)."),
    ("gpu_vram_experts", "Routed experts in VRAM, all layers."),
    (
        "gpu_copy_gbps",
        "H2D GB/s of the routed experts copied from RAM to the GPU (their DMA; 0: none yet).",
    ),
];

/// The backend's cumulative counters, by name (`nectar_<name>_total`) and help.
const COUNTERS: [(&str, &str); 23] = [
    (
        "generations",
        "Generations that ran to a finish (cancelled ones included).",
    ),
    (
        "generations_cancelled",
        "Generations stopped because the client went away.",
    ),
    (
        "generations_failed",
        "Generations that failed inside the model.",
    ),
    ("prompt_tokens", "Prompt tokens processed."),
    ("generated_tokens", "Tokens generated."),
    ("batch_steps", "Batched forward steps run."),
    (
        "batch_rows",
        "Rows summed over batched steps (rows / steps = mean batch size).",
    ),
    (
        "session_reused_tokens",
        "Prompt tokens not run again because a request continued a kept conversation.",
    ),
    ("mtp_drafted", "Drafts checked by the main model."),
    ("mtp_accepted", "Drafts accepted."),
    (
        "mtp_main_forwards",
        "Batch steps with a row at a decode step that could speculate.",
    ),
    (
        "mtp_decode_rows",
        "Rows at a decode step that could speculate, summed over steps.",
    ),
    (
        "mtp_speculating_rows",
        "Of those, rows that verified drafts (the rest ran plain: auto chose 0 or no draft).",
    ),
    (
        "mtp_gamma",
        "Draft depth those rows asked for, summed (gamma / decode_rows = mean depth).",
    ),
    (
        "expert_union_verify_steps",
        "Decode steps that verified drafts (prompt-chunk steps are not counted).",
    ),
    (
        "expert_union_verify_layers",
        "MoE layer-steps of those steps.",
    ),
    (
        "expert_union_verify_experts",
        "Distinct routed experts per MoE layer in those steps, summed (per layer-step: \
         verify_experts / verify_layers).",
    ),
    (
        "expert_union_verify_plain_experts",
        "The same without the draft positions' experts (verify_experts / verify_plain_experts \
         = union growth per verify).",
    ),
    ("expert_union_plain_steps", "Decode steps without drafts."),
    (
        "mtp_auto_decisions",
        "Decisions of the auto draft-depth controller (one per window of a step shape).",
    ),
    (
        "expert_union_plain_layers",
        "MoE layer-steps of those steps.",
    ),
    (
        "expert_union_plain_experts",
        "Distinct routed experts per MoE layer in those steps, summed.",
    ),
    (
        "expert_copy_bytes",
        "Bytes of routed experts copied from RAM to the GPU (--gpu-memory with --memory-budget).",
    ),
];

/// The expert cache's counters per tier, by name (`nectar_expert_<name>_total`) and help.
const EXPERT: [(&str, &str); 12] = [
    (
        "hits",
        "Expert requests served from a resident or loading slot.",
    ),
    (
        "pinned_hits",
        "Expert requests served from a pinned slot (also counted in hits).",
    ),
    ("misses", "Expert requests that needed a read from disk."),
    ("evictions", "Experts evicted to admit another."),
    ("bypasses", "Misses not admitted to the cache."),
    ("read_bytes", "Expert payload bytes read from disk."),
    ("reads", "Expert reads completed."),
    ("read_errors", "Expert reads that failed."),
    (
        "prefetch_issued",
        "Predicted expert reads queued (look-ahead or PILOT prefetch).",
    ),
    (
        "prefetch_used",
        "Prefetched experts a request then used (also counted as hits).",
    ),
    (
        "prefetch_dropped",
        "Prefetched experts nobody requested (a wasted read, nothing evicted).",
    ),
    (
        "prefetch_cancelled",
        "Queued prefetches cancelled unread: their layer's router chose other experts.",
    ),
];

/// Raises a mirrored counter to `v` (the source only grows; a smaller value is ignored).
fn mirror(c: &IntCounter, v: u64) {
    let cur = c.get();
    if v > cur {
        c.inc_by(v - cur);
    }
}

fn mirror_f(c: &Counter, v: f64) {
    let cur = c.get();
    if v > cur {
        c.inc_by(v - cur);
    }
}

/// Registers `c` and returns it. Registration fails only on a duplicate or malformed name,
/// which the constant names here rule out (a test renders every family).
fn reg<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    let _ = r.register(Box::new(c.clone()));
    c
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let r = &registry;
        let hist = |name: &str, help: &str| {
            let opts = HistogramOpts::new(name, help).buckets(latency_buckets());
            reg(r, Histogram::with_opts(opts).expect("valid histogram"))
        };
        let ttft = hist(
            "nectar_time_to_first_token_seconds",
            "From a generation request's arrival to its first generated token.",
        );
        let inter_token = hist(
            "nectar_inter_token_seconds",
            "Between consecutive generated tokens of a request, as its client receives them.",
        );
        let e2e = hist(
            "nectar_request_duration_seconds",
            "From a generation request's arrival to its finish (end to end).",
        );
        let requests = IntCounterVec::new(
            Opts::new(
                "nectar_http_requests_total",
                "HTTP requests answered, by route pattern and status.",
            ),
            &["route", "status"],
        );
        let in_flight = IntGauge::new(
            "nectar_http_requests_in_flight",
            "HTTP requests being answered now (open streams included).",
        );
        let busy = Counter::new(
            "nectar_busy_seconds_total",
            "Seconds the model thread spent generating (prefill and decode).",
        );
        let io_seconds = CounterVec::new(
            Opts::new(
                "nectar_expert_io_seconds_total",
                "Expert I/O time: kind=\"disk\" is the readers' service time (summed over I/O \
                 threads), kind=\"wait\" the time compute waited for misses (foreground stall).",
            ),
            &["tier", "kind"],
        );
        let slots = GaugeVec::new(
            Opts::new(
                "nectar_expert_slots",
                "Expert cache slots by role (pinned, lru, working, free, disabled).",
            ),
            &["tier", "role"],
        );
        let runs = IntCounterVec::new(
            Opts::new(
                "nectar_expert_runs_total",
                "Routed experts computed, by device (each chosen expert once per forward): \
                 device=\"vram\" the VRAM tier, device=\"copied\" copied from RAM to the GPU, \
                 device=\"cpu\" the CPU.",
            ),
            &["device"],
        );
        Metrics {
            started: Instant::now(),
            requests: reg(r, requests.expect("valid counter")),
            requests_total: AtomicU64::new(0),
            refused_queue_full: AtomicU64::new(0),
            in_flight: reg(r, in_flight.expect("valid gauge")),
            ttft,
            inter_token,
            e2e,
            gauges: GAUGES
                .iter()
                .map(|(n, h)| {
                    reg(
                        r,
                        Gauge::new(format!("nectar_{n}"), *h).expect("valid gauge"),
                    )
                })
                .collect(),
            counters: COUNTERS
                .iter()
                .map(|(n, h)| {
                    let c = IntCounter::new(format!("nectar_{n}_total"), *h);
                    reg(r, c.expect("valid counter"))
                })
                .collect(),
            busy_seconds: reg(r, busy.expect("valid counter")),
            expert: EXPERT
                .iter()
                .map(|(n, h)| {
                    let opts = Opts::new(format!("nectar_expert_{n}_total"), *h);
                    reg(
                        r,
                        IntCounterVec::new(opts, &["tier"]).expect("valid counter"),
                    )
                })
                .collect(),
            expert_seconds: reg(r, io_seconds.expect("valid counter")),
            expert_slots: reg(r, slots.expect("valid gauge")),
            expert_runs: reg(r, runs.expect("valid counter")),
            registry,
        }
    }

    /// Counts a request as in flight until the guard drops (the guard may outlive the handler:
    /// it travels with a streaming body).
    pub fn begin_owned(self: Arc<Self>) -> InFlight {
        self.in_flight.inc();
        InFlight(self)
    }

    /// Counts one answered request.
    pub fn record(&self, route: &str, status: u16) {
        self.requests
            .with_label_values(&[route, &status.to_string()])
            .inc();
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        if status == 429 {
            self.refused_queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests answered so far, all routes and statuses.
    pub fn requests_total(&self) -> u64 {
        self.requests_total.load(Ordering::Relaxed)
    }

    /// Requests refused with 429 (queue full) so far.
    pub fn refused_queue_full(&self) -> u64 {
        self.refused_queue_full.load(Ordering::Relaxed)
    }

    /// Requests being answered now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.get().max(0) as u64
    }

    /// Seconds since the server started.
    pub fn uptime_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Observes a time to first token.
    pub fn observe_ttft(&self, seconds: f64) {
        self.ttft.observe(seconds);
    }

    /// Observes the gap before one generated token.
    pub fn observe_inter_token(&self, seconds: f64) {
        self.inter_token.observe(seconds);
    }

    /// Observes a generation request's end-to-end time.
    pub fn observe_e2e(&self, seconds: f64) {
        self.e2e.observe(seconds);
    }

    /// TTFTs observed so far: (count, sum of seconds).
    pub fn ttft_totals(&self) -> (u64, f64) {
        (self.ttft.get_sample_count(), self.ttft.get_sample_sum())
    }

    /// The Prometheus text exposition (format 0.0.4) of the request metrics, `backend`'s
    /// counters and the expert cache's `tiers` (name, counters); `rss` and `budget` in bytes.
    pub fn render(
        &self,
        backend: &BackendStats,
        state: &LoadState,
        tiers: &[(&str, Telemetry)],
        rss: Option<u64>,
        budget: Option<u64>,
    ) -> String {
        let gauges = [
            f64::from(u8::from(*state == LoadState::Ready)),
            backend.queue_depth as f64,
            backend.queue_capacity as f64,
            backend.active as f64,
            backend.last_decode_tok_s,
            backend.parallel as f64,
            backend.batch_tok_s,
            backend.sessions as f64,
            self.uptime_seconds(),
            rss.unwrap_or(0) as f64,
            budget.unwrap_or(0) as f64,
            tiers.iter().map(|(_, t)| t.in_flight).sum::<usize>() as f64,
            backend.gpu.vram_bytes as f64,
            backend.gpu.matrices as f64,
            backend.gpu.vram_experts as f64,
            backend.gpu.copy.map_or(0.0, |c| c.h2d_gbps()),
        ];
        for (g, v) in self.gauges.iter().zip(gauges) {
            g.set(v);
        }
        let counters = [
            backend.requests_completed,
            backend.requests_cancelled,
            backend.requests_failed,
            backend.prompt_tokens,
            backend.generated_tokens,
            backend.batch_steps,
            backend.batch_rows,
            backend.session_reused_tokens,
            backend.mtp_drafted,
            backend.mtp_accepted,
            backend.mtp_forwards,
            backend.mtp_rows,
            backend.mtp_speculating,
            backend.mtp_gamma,
            backend.expert_union.verify_steps,
            backend.expert_union.verify_layers,
            backend.expert_union.verify_experts,
            backend.expert_union.verify_plain_experts,
            backend.expert_union.plain_steps,
            backend.mtp_auto_decisions,
            backend.expert_union.plain_layers,
            backend.expert_union.plain_experts,
            backend.gpu.copy.map_or(0, |c| c.bytes),
        ];
        for (c, v) in self.counters.iter().zip(counters) {
            mirror(c, v);
        }
        mirror_f(&self.busy_seconds, backend.busy_seconds);
        for (device, v) in [
            ("vram", backend.gpu.expert_runs_vram),
            ("copied", backend.gpu.expert_runs_copied),
            ("cpu", backend.gpu.expert_runs_cpu),
        ] {
            mirror(&self.expert_runs.with_label_values(&[device]), v);
        }
        for (tier, t) in tiers {
            let sum = |f| t.layer_sum(f);
            let values = [
                sum(|l| l.hits),
                sum(|l| l.pinned_hits),
                sum(|l| l.misses),
                sum(|l| l.evictions),
                sum(|l| l.bypasses),
                t.bytes_read,
                t.reads,
                t.read_errors,
                sum(|l| l.prefetched),
                sum(|l| l.prefetch_hits),
                sum(|l| l.prefetch_dropped),
                sum(|l| l.prefetch_cancelled),
            ];
            for (c, v) in self.expert.iter().zip(values) {
                mirror(&c.with_label_values(&[tier]), v);
            }
            mirror_f(
                &self.expert_seconds.with_label_values(&[tier, "disk"]),
                t.disk_seconds,
            );
            mirror_f(
                &self.expert_seconds.with_label_values(&[tier, "wait"]),
                t.wait_seconds,
            );
            let o = &t.occupancy;
            for (role, n) in [
                ("pinned", o.pinned),
                ("lru", o.lru),
                ("working", o.working),
                ("free", o.free),
                ("disabled", o.disabled),
            ] {
                self.expert_slots
                    .with_label_values(&[tier, role])
                    .set(n as f64);
            }
        }
        let mut out = Vec::new();
        // Encoding to a Vec fails only on an invalid family, which registration rules out.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nectar_residency::LayerStats;

    fn parse(text: &str) -> prometheus_parse::Scrape {
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text format")
    }

    fn value(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
        let sample = s
            .samples
            .iter()
            .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no sample {name} {labels:?}"));
        match &sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            other => panic!("{name} is {other:?}"),
        }
    }

    #[test]
    fn exposition_parses_with_histograms_and_per_tier_counters() {
        let m = Metrics::default();
        m.record("/v1/chat/completions", 200);
        m.record("/v1/chat/completions", 200);
        m.record("a\"b", 429);
        m.observe_ttft(0.25);
        m.observe_ttft(0.75);
        m.observe_inter_token(0.01);
        m.observe_e2e(1.5);
        let backend = BackendStats {
            prompt_tokens: 12,
            generated_tokens: 34,
            mtp_drafted: 10,
            mtp_accepted: 7,
            queue_depth: 3,
            expert_union: nectar_engine::UnionCounts {
                verify_steps: 2,
                verify_layers: 14,
                verify_experts: 210,
                verify_plain_experts: 140,
                ..Default::default()
            },
            gpu: crate::backend::GpuStats {
                vram_bytes: 5 << 20,
                matrices: 7,
                vram_experts: 3,
                expert_runs_vram: 9,
                expert_runs_copied: 5,
                expert_runs_cpu: 4,
                copy: Some(nectar_model::arch::glm5::CopyStats {
                    bytes: 3000,
                    link_bytes: 3000,
                    link_s: 1e-6,
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..BackendStats::default()
        };
        let main = Telemetry {
            layers: vec![
                LayerStats {
                    hits: 5,
                    pinned_hits: 2,
                    misses: 2,
                    evictions: 1,
                    bypasses: 1,
                    prefetched: 4,
                    prefetch_hits: 3,
                    prefetch_dropped: 1,
                    prefetch_cancelled: 2,
                },
                LayerStats {
                    hits: 1,
                    ..LayerStats::default()
                },
            ],
            bytes_read: 4096,
            disk_seconds: 0.5,
            wait_seconds: 0.125,
            ..Telemetry::default()
        };
        let text = m.render(
            &backend,
            &LoadState::Ready,
            &[("main", main)],
            Some(1 << 30),
            Some(2 << 30),
        );
        let s = parse(&text);
        assert_eq!(
            value(
                &s,
                "nectar_http_requests_total",
                &[("route", "/v1/chat/completions"), ("status", "200")]
            ),
            2.0
        );
        // A quote in a label value is escaped (the parser keeps escapes as they are).
        assert!(
            text.contains("route=\"a\\\"b\",status=\"429\"} 1"),
            "{text}"
        );
        assert_eq!(value(&s, "nectar_model_ready", &[]), 1.0);
        assert_eq!(value(&s, "nectar_prompt_tokens_total", &[]), 12.0);
        assert_eq!(value(&s, "nectar_generated_tokens_total", &[]), 34.0);
        assert_eq!(value(&s, "nectar_mtp_accepted_total", &[]), 7.0);
        assert_eq!(
            value(&s, "nectar_expert_union_verify_experts_total", &[]),
            210.0
        );
        assert_eq!(
            value(&s, "nectar_expert_union_verify_plain_experts_total", &[]),
            140.0
        );
        assert_eq!(value(&s, "nectar_queue_depth", &[]), 3.0);
        assert_eq!(value(&s, "nectar_gpu_vram_bytes", &[]), (5u64 << 20) as f64);
        assert_eq!(value(&s, "nectar_gpu_matrices", &[]), 7.0);
        assert_eq!(value(&s, "nectar_gpu_vram_experts", &[]), 3.0);
        assert_eq!(
            value(&s, "nectar_expert_runs_total", &[("device", "vram")]),
            9.0
        );
        assert_eq!(
            value(&s, "nectar_expert_runs_total", &[("device", "copied")]),
            5.0
        );
        assert_eq!(value(&s, "nectar_expert_copy_bytes_total", &[]), 3000.0);
        assert!((value(&s, "nectar_gpu_copy_gbps", &[]) - 3.0).abs() < 1e-9);
        assert_eq!(
            value(&s, "nectar_expert_runs_total", &[("device", "cpu")]),
            4.0
        );
        assert_eq!(
            value(&s, "nectar_expert_hits_total", &[("tier", "main")]),
            6.0
        );
        assert_eq!(
            value(&s, "nectar_expert_pinned_hits_total", &[("tier", "main")]),
            2.0
        );
        assert_eq!(
            value(&s, "nectar_expert_misses_total", &[("tier", "main")]),
            2.0
        );
        assert_eq!(
            value(&s, "nectar_expert_read_bytes_total", &[("tier", "main")]),
            4096.0
        );
        assert_eq!(
            value(&s, "nectar_expert_prefetch_used_total", &[("tier", "main")]),
            3.0
        );
        assert_eq!(
            value(
                &s,
                "nectar_expert_prefetch_cancelled_total",
                &[("tier", "main")]
            ),
            2.0
        );
        assert_eq!(
            value(
                &s,
                "nectar_expert_io_seconds_total",
                &[("tier", "main"), ("kind", "wait")]
            ),
            0.125
        );
        assert_eq!(
            value(&s, "nectar_resident_memory_bytes", &[]),
            (1u64 << 30) as f64
        );
        assert_eq!(
            value(&s, "nectar_memory_budget_bytes", &[]),
            (2u64 << 30) as f64
        );
        let ttft = s
            .samples
            .iter()
            .find(|x| x.metric == "nectar_time_to_first_token_seconds")
            .expect("TTFT histogram");
        match &ttft.value {
            prometheus_parse::Value::Histogram(buckets) => {
                let le_half = buckets.iter().find(|b| b.less_than == 0.512).unwrap();
                assert_eq!(le_half.count, 1.0, "one TTFT at or below 0.512 s");
                assert_eq!(buckets.last().unwrap().count, 2.0);
            }
            other => panic!("TTFT is {other:?}"),
        }
        for name in [
            "nectar_inter_token_seconds",
            "nectar_request_duration_seconds",
        ] {
            assert!(s.docs.contains_key(name), "{name} has no HELP line");
        }
        // Mirrored counters never go backwards, and a second scrape is stable.
        let again = parse(&m.render(&backend, &LoadState::Loading, &[], None, None));
        assert_eq!(value(&again, "nectar_generated_tokens_total", &[]), 34.0);
        assert_eq!(value(&again, "nectar_model_ready", &[]), 0.0);
        assert_eq!(m.refused_queue_full(), 1);
    }
}
