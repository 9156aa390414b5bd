//! The calibration decodes of `nectar fit --project`: short decodes of a container on this
//! machine with the trace's routes in place of its routers (as `bench replay` runs them, so
//! the cache misses at the trace's rate and the compute is timed beside real reads). They
//! measure what the projection cannot derive from bandwidths: the compute per layer beyond
//! streaming the weights (`o`), the share of the MoE block behind which reads hide (`η`), the
//! disk rate a decode gets, and — a second decode with look-ahead on — what share of the
//! reads started ahead ran while attention computed (`r`) and what share of its wrong guesses
//! were cancelled before their read started; or — a second decode with PILOT on, the trace
//! model's predictions replayed — the share of the predicted layers' attention its reads kept
//! the disk busy (`b`) and its wrong guesses read per needed read.
use super::project::Geometry;
use anyhow::{Context, Result};
use nectar_model::arch::glm5::{HalfSeconds, LoadOptions, Prefetch};
use nectar_residency::trace::Trace;
use serde_json::json;
use std::path::Path;
use std::time::Instant;

/// What the calibration decodes measured on this machine.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// Compute seconds per MoE layer and token beyond streaming the weights.
    pub layer_overhead_s: f64,
    /// The share of the MoE block's compute behind which the run hid its reads (`η`), when it
    /// read enough to tell.
    pub moe_overlap: Option<f64>,
    /// GB/s its reads moved while some read was in flight, when it read enough to tell (the
    /// same condition as `moe_overlap`).
    pub read_gbps: Option<f64>,
    /// `r` ([`lookahead_hidden`]), when the look-ahead decode ran and read ahead.
    pub lookahead_hidden: Option<f64>,
    /// The share of its wrong guesses cancelled unread ([`cancelled_share`]), when the
    /// look-ahead decode guessed wrong often enough to tell.
    pub lookahead_cancelled: Option<f64>,
    /// `b` ([`pilot_busy`]), when the PILOT decode ran.
    pub pilot_busy: Option<f64>,
    /// PILOT's wrong guesses read per needed read ([`pilot_waste`]), when the PILOT decode ran.
    pub pilot_waste: Option<f64>,
    /// The JSON record (`machine.calibration`).
    pub record: serde_json::Value,
}

/// The second calibration decode: none, look-ahead's, or PILOT's replaying the trace model's
/// next-layer predictions per trace row (`bench_pilot::predictions`) — with the mode it runs
/// in: `Pilot`, or `Both` (look-ahead beside it, its b and w measured the same way).
#[derive(Debug, Clone, Copy)]
pub enum Second<'a> {
    None,
    Lookahead,
    Pilot(&'a [Vec<Vec<u32>>], Prefetch),
}

/// Prompt rows the calibration decodes feed first (look-ahead's at least this many).
pub const PROMPT_ROWS: usize = 8;

/// Prompt rows a calibration decode in `mode` feeds first: look-ahead matches token
/// contexts, so a decode that runs it feeds the first conversation's own prompt.
pub fn prompt_rows(trace: &Trace, mode: Prefetch) -> usize {
    match mode.reads_repeated_contexts() {
        true => trace.segments.first().map_or(PROMPT_ROWS, |s| {
            s.warmup.clamp(PROMPT_ROWS, MAX_LOOKAHEAD_PROMPT)
        }),
        false => PROMPT_ROWS,
    }
}

/// The longest prompt the look-ahead decode feeds first (route256's are 43–118 rows; a longer
/// one would spend the calibration's time on prefill reads under the budget).
const MAX_LOOKAHEAD_PROMPT: usize = 512;

/// One calibration decode's totals over its decode steps (the prompt is not one).
struct Decode {
    /// Prompt rows fed first, and decode steps.
    prompt: usize,
    tokens: usize,
    secs: f64,
    /// Compute waiting for reads.
    waited: f64,
    /// Some read in flight.
    busy: f64,
    bytes: u64,
    /// Expert reads, and of them the reads started ahead (look-ahead's prefetches).
    reads: u64,
    prefetched: u64,
    /// Wrong guesses: read and never requested, and cancelled before their read started.
    dropped: u64,
    cancelled: u64,
    /// The MoE blocks' wall time.
    moe: f64,
    /// Each step's compute (its time less its waits for reads).
    step_compute: Vec<f64>,
    /// The main layers' halves and the disk's busy time inside each.
    halves: HalfSeconds,
}

impl Decode {
    /// Per decoded token.
    fn per(&self, x: f64) -> f64 {
        x / self.tokens.max(1) as f64
    }

    /// The median step's compute, not the mean: `o` is what compute takes beyond the weights,
    /// a residual of a few milliseconds on a disk-bound run, and the mean of 32 steps came out
    /// 2× apart in two fits minutes apart (RESULTS, "The projection validated on 16 cores"); a
    /// few slow steps (a page fault, a thread descheduled) move the median less.
    fn compute(&self) -> f64 {
        if self.step_compute.is_empty() {
            0.0
        } else {
            super::bench_io::median(&self.step_compute)
        }
    }

    /// The record of a decode with reads ahead (look-ahead's or PILOT's), per token.
    fn record(&self) -> serde_json::Value {
        json!({"prompt_rows": self.prompt,
            "decode_s_per_token": self.per(self.secs),
            "compute_s_per_token": self.compute(),
            "wait_s_per_token": self.per(self.waited),
            "read_gb_per_token": self.per(self.bytes as f64) / 1e9,
            "reads": self.reads, "prefetched": self.prefetched,
            "wrong_guesses_read": self.dropped, "wrong_guesses_cancelled": self.cancelled,
            "halves_ms_per_token": self.halves_ms()})
    }

    /// The halves in milliseconds per token, for the record.
    fn halves_ms(&self) -> serde_json::Value {
        let ms = |s: f64| self.per(s) * 1e3;
        json!({"attention": ms(self.halves.attention), "mlp": ms(self.halves.mlp),
               "disk_busy_attention": ms(self.halves.disk_busy_attention),
               "disk_busy_mlp": ms(self.halves.disk_busy_mlp),
               "predicted_attention": ms(self.halves.predicted_attention),
               "disk_busy_predicted_attention": ms(self.halves.disk_busy_predicted_attention)})
    }
}

/// Loads the container in `dir` under `budget` with `prefetch`, prompts it with `prompt` rows
/// of the trace's first conversation (fewer where the trace is shorter) and decodes `tokens`
/// steps (forward and logits, as `run` decodes) on the trace's routes (and, with PILOT, the
/// trace model's next-layer `predicted` experts in place of the container's early router).
fn decode(
    dir: &Path,
    budget: u64,
    prefetch: Prefetch,
    trace: &Trace,
    predicted: Option<&[Vec<Vec<u32>>]>,
    prompt: usize,
    tokens: usize,
) -> Result<Decode> {
    use nectar_model::{Glm5, SeqStep};
    let opts = LoadOptions {
        memory_budget: Some(budget),
        prefetch,
        ..Default::default()
    };
    let model =
        Glm5::load_with(dir, &opts).with_context(|| format!("calibrating on {}", dir.display()))?;
    let mut routes = super::trace_routes::TraceRoutes::new(&model, trace)
        .with_context(|| format!("calibrating on {}", dir.display()))?
        .with_predictions(predicted);
    let res = model.residency().cloned();
    // (waited, busy, bytes, reads, read ahead, wrong guesses read, wrong guesses cancelled)
    // since load; a prefetch cancelled before its read started read nothing.
    let totals = || {
        res.as_ref().map_or((0.0, 0.0, 0, 0, 0, 0, 0), |r| {
            let t = r.telemetry();
            let sum = |f| t.layer_sum(f);
            (
                t.wait_seconds,
                t.disk_busy_seconds,
                t.bytes_read,
                t.reads,
                sum(|l| l.read_ahead()),
                sum(|l| l.prefetch_dropped),
                sum(|l| l.prefetch_cancelled),
            )
        })
    };
    let mut cache = model.new_cache();
    let vocab = model.vocab_size() as u32;
    let tok = |r: usize| trace.tokens.as_ref().map_or(r as u32, |t| t[r] as u32) % vocab;
    let start = trace.segments.first().map_or(0, |s| s.start);
    let prompt = prompt.min(trace.rows.saturating_sub(start + tokens));
    anyhow::ensure!(
        prompt > 0,
        "{}: too few rows to calibrate on",
        trace.path.display()
    );
    let mut d = Decode {
        prompt,
        tokens,
        secs: 0.0,
        waited: 0.0,
        busy: 0.0,
        bytes: 0,
        reads: 0,
        prefetched: 0,
        dropped: 0,
        cancelled: 0,
        moe: 0.0,
        step_compute: Vec::with_capacity(tokens),
        halves: HalfSeconds::default(),
    };
    // After the prompt, which is not a decode step.
    let (mut halves0, mut totals0) = (HalfSeconds::default(), totals());
    let mut row = start;
    for step in 0..=tokens {
        let n = if step == 0 { prompt } else { 1 };
        routes.rows = (row..row + n).collect();
        let ids: Vec<u32> = routes.rows.iter().map(|&r| tok(r)).collect();
        let (t0, w0, m0) = (Instant::now(), totals().0, routes.moe_seconds);
        let h = model.forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens: &ids,
            }],
            &mut routes,
        )?;
        let hd = model.hidden_size();
        model.logits(&h[h.len() - hd..])?;
        if step == 0 {
            (halves0, totals0) = (model.decode_disk_overlap(), totals());
        } else {
            let t = t0.elapsed().as_secs_f64();
            d.step_compute.push(t - (totals().0 - w0));
            d.secs += t;
            d.moe += routes.moe_seconds - m0;
        }
        row += n;
    }
    let (w, b, bytes, reads, prefetched, dropped, cancelled) = totals();
    d.waited = w - totals0.0;
    d.busy = b - totals0.1;
    d.bytes = bytes - totals0.2;
    d.reads = reads - totals0.3;
    d.prefetched = prefetched - totals0.4;
    d.dropped = dropped - totals0.5;
    d.cancelled = cancelled - totals0.6;
    d.halves = model.decode_disk_overlap() - halves0;
    Ok(d)
}

/// Calibrates the projection on the container in `dir` under `budget` (`g` its geometry,
/// `dec_gbps` the kernel's weight rate here): a decode of `tokens` steps after an 8-row prompt
/// with prefetch off, and the `second` one: with look-ahead on after the first conversation's
/// whole prompt (the history its predictor matches contexts in), or with PILOT on after the
/// same 8 rows, replaying the trace model's predictions.
///
/// - Compute per MoE layer beyond the weights: (time − time waiting for reads − weight bytes
///   at `dec_gbps`) per token and MoE layer, the time less the waits of the median step.
/// - `η`, the share of the MoE block's compute that hid reads: the time some read was in
///   flight less the time compute waited for one, over the MoE block's compute (routed and
///   shared experts at `dec_gbps`), clamped to [0, 1]. 1 is the block's design
///   (hits and the shared expert compute while the misses load); a layer whose misses arrive
///   together, after the hits are done, hides less. Measured only when reads took at least a
///   tenth of the decode.
/// - `r` ([`lookahead_hidden`]) and the share of wrong guesses cancelled unread
///   ([`cancelled_share`]) from the look-ahead decode; `b` ([`pilot_busy`]) and the wrong
///   guesses read per needed read ([`pilot_waste`]) from the PILOT decode.
pub fn calibrate(
    dir: &Path,
    budget: u64,
    g: &Geometry,
    dec_gbps: f64,
    trace: &Trace,
    tokens: usize,
    second: Second,
) -> Result<Calibration> {
    let off = decode(dir, budget, Prefetch::Off, trace, None, PROMPT_ROWS, tokens)?;
    let compute = off.compute();
    let l = g.moe_layers as f64;
    let dec = dec_gbps * 1e9;
    let shared = (l * g.expert).min(g.spine_read);
    let weights = (g.spine_read + l * g.top_k as f64 * g.expert) / dec;
    let o = ((compute - weights) / l).max(0.0);
    let t_moe = (l * g.top_k as f64 * g.expert + shared) / dec;
    // η's denominator is the MoE blocks' measured compute (their wall time less the waits,
    // which all fall inside them without prefetch), not `t_moe`: the blocks also route, apply
    // SwiGLU, combine and synchronise, so the weights alone read 5–28 % low against the time
    // the reads hid behind (η came out 1.05–1.28 and was clamped).
    let moe_overlap = overlap(
        off.per(off.busy),
        off.per(off.waited),
        off.per(off.moe - off.waited),
        off.per(off.secs),
    );
    let read_gbps = moe_overlap.map(|_| off.bytes as f64 / off.busy.max(1e-9) / 1e9);
    let mut record = json!({"container": dir.display().to_string(), "decode_tokens": tokens,
           "routes": trace.path.display().to_string(),
           "decode_s_per_token": off.per(off.secs),
           "compute_s_per_token": compute, "compute_s_per_token_mean": off.per(off.secs - off.waited),
           "weights_s_per_token": weights,
           "wait_s_per_token": off.per(off.waited),
           "read_gb_per_token": off.per(off.bytes as f64) / 1e9,
           "disk_busy_s_per_token": off.per(off.busy),
           "read_gbps": off.bytes as f64 / off.busy.max(1e-9) / 1e9,
           "moe_weights_s_per_token": t_moe,
           "moe_block_s_per_token": off.per(off.moe),
           "moe_overlap": moe_overlap,
           "layer_overhead_ms": o * 1e3,
           "halves_ms_per_token": off.halves_ms()});
    let (mut hidden, mut cancelled) = (None, None);
    let (mut busy, mut waste) = (None, None);
    if let Second::Pilot(predicted, mode) = second {
        let prompt = prompt_rows(trace, mode);
        let p = decode(dir, budget, mode, trace, Some(predicted), prompt, tokens)?;
        busy = pilot_busy(
            p.halves.disk_busy_predicted_attention,
            p.halves.predicted_attention,
            p.prefetched,
        );
        waste = pilot_waste(p.dropped, p.reads, p.prefetched);
        record["pilot"] = p.record();
        record["pilot"]["mode"] = json!(mode.as_str());
        record["pilot"]["busy_in_attention"] = json!(busy);
        record["pilot"]["wasted_per_read"] = json!(waste);
    }
    if let Second::Lookahead = second {
        let la = decode(
            dir,
            budget,
            Prefetch::Lookahead,
            trace,
            None,
            prompt_rows(trace, Prefetch::Lookahead),
            tokens,
        )?;
        hidden = lookahead_hidden(
            la.halves.disk_busy_attention,
            la.busy,
            la.prefetched,
            la.reads,
        );
        cancelled = cancelled_share(la.dropped, la.cancelled);
        record["lookahead"] = la.record();
        record["lookahead"]["hidden"] = json!(hidden);
        record["lookahead"]["cancelled_share"] = json!(cancelled);
    }
    Ok(Calibration {
        layer_overhead_s: o,
        moe_overlap,
        read_gbps,
        lookahead_hidden: hidden,
        lookahead_cancelled: cancelled,
        pilot_busy: busy,
        pilot_waste: waste,
        record,
    })
}

/// `η` from one decode's seconds per token: the time some read was in flight (`busy`; without
/// prefetch every read is a demand read, inside a MoE block), the time compute waited for
/// reads, the MoE blocks' measured compute (their wall time less the waits) and the whole
/// step. The busy time compute did not wait through, it computed: that much of the blocks hid
/// reads. Reads happen only inside the blocks, so this is a share; a value past 1 can only be
/// timer jitter and is rounded to 1. `None` when reads were in flight less than a tenth of the
/// step (too little to tell).
fn overlap(busy: f64, waited: f64, moe_compute: f64, step: f64) -> Option<f64> {
    (busy >= 0.1 * step && moe_compute > 0.0)
        .then(|| ((busy - waited) / moe_compute).clamp(0.0, 1.0))
}

/// `r`: the share of look-ahead's reads (their disk time) that ran while an attention half
/// computed — the disk's busy seconds inside the attention halves over the busy seconds of
/// the reads started ahead (all busy seconds × prefetched ÷ reads), from a decode with
/// look-ahead on. `None` under 8 reads ahead (too few to tell). The projection credits a
/// forward's reads ahead, `(φ + w)·T_ssd`, with `r` of their time hidden (at most `T_attn`):
/// a layer's reads ahead are started with its step's look-ahead and queue behind the demand
/// reads of the layers before it, so most of them run while the disk is busy anyway. On the
/// 8-layer synth 23 ms of 137 per token landed in attention (benchmarks/RESULTS.md, "Where
/// look-ahead's projected gain goes"), where crediting all of them, up to `T_attn`, projected
/// 1.14–1.25× the replays. `bench replay` reports the same share of its run.
pub fn lookahead_hidden(
    busy_in_attention: f64,
    busy: f64,
    prefetched: u64,
    reads: u64,
) -> Option<f64> {
    let ahead = busy * prefetched as f64 / reads.max(1) as f64;
    (prefetched >= 8 && ahead > 0.0).then(|| (busy_in_attention / ahead).clamp(0.0, 1.0))
}

/// The share of look-ahead's wrong guesses that its layer's router cancelled before their
/// read started (`cancelled` of `dropped + cancelled`; `dropped`: read and never requested).
/// The projection's offline replay counts every unused guess as a read; since reads ahead
/// wait for an idle disk, most never start (on the 8-layer synth 630–1,297 cancelled against
/// 56–361 read, benchmarks/RESULTS.md 2026-12-06), and only the rest cost disk time. `None`
/// under 8 wrong guesses (too few to tell).
pub fn cancelled_share(dropped: u64, cancelled: u64) -> Option<f64> {
    let wrong = dropped + cancelled;
    (wrong >= 8).then(|| cancelled as f64 / wrong as f64)
}

/// `b`: the share of the predicted layers' attention halves (those whose experts PILOT named
/// in the layer before) through which some read was in flight, from a decode with PILOT on.
/// PILOT names the next layer's experts before this layer's MoE block; those not resident
/// queue behind this layer's misses and run on into the next attention, so the projection
/// credits PILOT with `b` of those layers' attention time as disk time (up to the reads there
/// are) instead of look-ahead's share of its own reads. Only those layers: a dense layer, or a
/// first layer, has no prediction to read into its attention, and how many there are is the
/// geometry's (the 8-layer synth's first layer, an eighth of its attention; GLM-5.2's 3 dense
/// layers of 78), not the machine's — over all the synth's attention halves the disk was busy
/// 80–88 % (benchmarks/RESULTS.md 2026-12-06 17:02). `None` under 8 reads started ahead (PILOT
/// named nothing uncached: nothing to tell).
pub fn pilot_busy(busy_in_attention: f64, attention: f64, prefetched: u64) -> Option<f64> {
    (prefetched >= 8 && attention > 0.0).then(|| (busy_in_attention / attention).clamp(0.0, 1.0))
}

/// PILOT's wrong guesses read (`dropped`: read and never requested) per needed read (every
/// expert read less those): the bytes its mistakes add to a forward's. `None` under 8 reads
/// started ahead.
pub fn pilot_waste(dropped: u64, reads: u64, prefetched: u64) -> Option<f64> {
    let needed = reads.saturating_sub(dropped);
    (prefetched >= 8 && needed > 0).then(|| dropped as f64 / needed as f64)
}

#[cfg(test)]
mod tests {
    use super::{cancelled_share, lookahead_hidden, overlap, pilot_busy, pilot_waste};

    #[test]
    fn pilots_busy_share_is_of_attention_and_its_waste_of_the_needed_reads() {
        // 42.7 ms of 49.2 ms of attention with a read in flight.
        let b = pilot_busy(0.0427, 0.0492, 100).unwrap();
        assert!((b - 0.0427 / 0.0492).abs() < 1e-12, "{b}");
        // Reads of the layer before that end inside attention can overshoot by jitter.
        assert_eq!(pilot_busy(0.06, 0.05, 100), Some(1.0));
        assert_eq!(pilot_busy(0.04, 0.05, 7), None);
        assert_eq!(pilot_busy(0.0, 0.0, 100), None);
        // 1,144 wrong of 10,980 started, 20,000 reads in all: 1,144 per 18,856 needed.
        let w = pilot_waste(1144, 20_000, 10_980).unwrap();
        assert!((w - 1144.0 / 18_856.0).abs() < 1e-12, "{w}");
        assert_eq!(pilot_waste(0, 100, 40), Some(0.0));
        assert_eq!(pilot_waste(5, 100, 7), None);
        assert_eq!(pilot_waste(10, 10, 10), None);
    }

    #[test]
    fn the_cancelled_share_is_of_the_wrong_guesses() {
        assert_eq!(cancelled_share(10, 30), Some(0.75));
        assert_eq!(cancelled_share(0, 8), Some(1.0));
        assert_eq!(cancelled_share(8, 0), Some(0.0));
        assert_eq!(cancelled_share(3, 4), None);
    }

    #[test]
    fn the_overlap_is_the_share_of_the_moe_compute_that_hid_reads() {
        // Reads in flight 40 ms of a 100 ms step, 10 ms of MoE compute (measured).
        // Compute waited the busy time less the whole block: all of it hid reads.
        assert_eq!(overlap(0.040, 0.030, 0.010, 0.1), Some(1.0));
        // It waited for every read: nothing hid.
        assert_eq!(overlap(0.040, 0.040, 0.010, 0.1), Some(0.0));
        // Half the block hid reads.
        let e = overlap(0.040, 0.035, 0.010, 0.1).unwrap();
        assert!((e - 0.5).abs() < 1e-9, "{e}");
        // Waiting longer than reads were in flight (the wait's own overhead) and timer jitter
        // past the block are clamped.
        assert_eq!(overlap(0.040, 0.050, 0.010, 0.1), Some(0.0));
        assert_eq!(overlap(0.040, 0.0, 0.010, 0.1), Some(1.0));
        // Reads under a tenth of the step say nothing.
        assert_eq!(overlap(0.009, 0.0, 0.010, 0.1), None);
    }

    #[test]
    fn the_hidden_share_is_the_reads_aheads_time_inside_attention() {
        // 300 ms busy over 100 reads, 40 of them ahead (120 ms); 24 ms inside attention.
        let r = lookahead_hidden(0.024, 0.3, 40, 100).unwrap();
        assert!((r - 0.2).abs() < 1e-12, "{r}");
        // Reads of other layers' misses can run into an attention half too: clamped.
        assert_eq!(lookahead_hidden(0.2, 0.3, 40, 100), Some(1.0));
        // Too few reads ahead to tell.
        assert_eq!(lookahead_hidden(0.001, 0.3, 7, 100), None);
        assert_eq!(lookahead_hidden(0.0, 0.0, 10, 0), None);
    }
}
