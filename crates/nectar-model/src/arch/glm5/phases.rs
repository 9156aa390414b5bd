//! Where prefill and decode time go: wall seconds per phase of the layers' forwards, kept apart
//! for the forwards that carry a prefill chunk (a sequence adding more than
//! `ABSORBED_MAX_ROWS` rows) and for the others (decode, MTP and verify steps). `nectar run
//! --json` reports them as `stats.prefill_phases_s` and `stats.decode_phases_s` (docs/gpu.md,
//! "Prefill and decode phases").
//!
//! Each layer's attention holds one [`Phases`]; a forward walks it with a [`Lap`], which charges
//! the time since its previous mark to the phase it names, so the phases of one forward add up
//! to its wall time with nothing counted twice.
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// A phase of a layer's forward.
#[derive(Debug, Clone, Copy)]
pub(super) enum Phase {
    /// q_a, q_b, kv_a with their norms and RoPE, and the cache append.
    AttnProj = 0,
    /// The indexer keys: wk, LayerNorm, RoPE, cache append.
    IndexerKeys,
    /// The indexer queries and head weights: wq_b, weights_proj, RoPE.
    IndexerProj,
    /// The indexer's scores of every visible key (GPU: with the uploads and the download).
    IndexerScores,
    /// The top-k selection per row.
    IndexerTopk,
    /// kv_b's rebuilt K/V (GPU: with the copies into VRAM).
    KvB,
    /// Attention proper: scores, softmax, times V.
    AttnCore,
    /// o_proj (with the transposition before it).
    OProj,
    /// The MLP half's input: its RMSNorm, the router's product, each row's routes and the
    /// batch-union of their experts.
    MlpRoute,
    /// The MoE's sum of each row's experts (where the host does it) and the residual add.
    MlpCombine,
    /// The MLP half's products: the experts and the shared expert (or the dense SwiGLU).
    Mlp,
}

const PHASES: usize = Phase::Mlp as usize + 1;

/// Accumulated nanoseconds per phase since load: `[0]` prefill forwards, `[1]` the others.
#[derive(Debug, Default)]
pub(super) struct Phases {
    ns: [[AtomicU64; PHASES]; 2],
    /// Whether the forward now running carries a prefill chunk (set by the attention half,
    /// read by the MLP half).
    prefill: AtomicBool,
}

impl Phases {
    /// A lap over a forward, charged to the prefill phases when `prefill`, else to the decode
    /// phases. (A mark reads the clock once: ~20 ns, against micro- to milliseconds a phase.)
    pub(super) fn lap(&self, prefill: bool) -> Lap<'_> {
        self.prefill.store(prefill, Ordering::Relaxed);
        Lap {
            ns: &self.ns[usize::from(!prefill)],
            last: Instant::now(),
        }
    }

    /// Whether the forward now running (or last run) carries a prefill chunk.
    pub(super) fn is_prefill(&self) -> bool {
        self.prefill.load(Ordering::Relaxed)
    }

    /// A lap continuing the attention half's kind (the MLP half of the same layer).
    pub(super) fn resume(&self) -> Lap<'_> {
        self.lap(self.is_prefill())
    }

    /// Seconds per phase of the prefill forwards (`prefill`) or of the others.
    pub(super) fn seconds(&self, prefill: bool) -> PhaseSeconds {
        let ns = &self.ns[usize::from(!prefill)];
        let s = |p: Phase| ns[p as usize].load(Ordering::Relaxed) as f64 * 1e-9;
        PhaseSeconds {
            attn_proj: s(Phase::AttnProj),
            indexer_keys: s(Phase::IndexerKeys),
            indexer_proj: s(Phase::IndexerProj),
            indexer_scores: s(Phase::IndexerScores),
            indexer_topk: s(Phase::IndexerTopk),
            kv_b: s(Phase::KvB),
            attn_core: s(Phase::AttnCore),
            o_proj: s(Phase::OProj),
            mlp_route: s(Phase::MlpRoute),
            mlp: s(Phase::Mlp),
            mlp_combine: s(Phase::MlpCombine),
        }
    }
}

/// The layers' two halves against the disk: wall seconds of the attention halves and of the
/// MLP halves of the main layers in decode forwards (decode, MTP and verify steps), and the
/// seconds some expert read was in flight during each (`Residency::disk_busy_now` read at the
/// halves' boundaries). A layer's demand reads can only run during its MLP half (its router
/// decides them); what the disk does during the attention halves is what reads started ahead
/// (look-ahead) or left over from the layer before add — the overlap `fit --project` credits
/// look-ahead with.
#[derive(Debug, Default)]
pub(super) struct DiskOverlap {
    /// Nanoseconds `[attention, mlp, busy in attention, busy in mlp]`, then the attention and
    /// its busy time of the layers whose experts PILOT predicted in the layer before.
    ns: [AtomicU64; 6],
}

impl DiskOverlap {
    /// Adds one layer's halves: wall seconds of each, and the disk's busy seconds in each;
    /// `predicted`: PILOT named this layer's experts during the layer before.
    pub(super) fn add(&self, halves: [f64; 2], busy: [f64; 2], predicted: bool) {
        let p = if predicted { 1.0 } else { 0.0 };
        let all = [
            halves[0],
            halves[1],
            busy[0],
            busy[1],
            p * halves[0],
            p * busy[0],
        ];
        for (slot, s) in self.ns.iter().zip(all) {
            slot.fetch_add((s.max(0.0) * 1e9) as u64, Ordering::Relaxed);
        }
    }

    /// The totals since load.
    pub(super) fn seconds(&self) -> HalfSeconds {
        let s = |i: usize| self.ns[i].load(Ordering::Relaxed) as f64 * 1e-9;
        HalfSeconds {
            attention: s(0),
            mlp: s(1),
            disk_busy_attention: s(2),
            disk_busy_mlp: s(3),
            predicted_attention: s(4),
            disk_busy_predicted_attention: s(5),
        }
    }
}

/// Wall seconds of the main layers' attention and MLP halves of the decode forwards, and the
/// seconds the disk was busy (some expert read in flight) during each, since load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HalfSeconds {
    /// The attention halves (input norm to the residual add).
    pub attention: f64,
    /// The MLP halves (routing, the experts with their reads, the combine).
    pub mlp: f64,
    /// Disk busy while an attention half ran.
    pub disk_busy_attention: f64,
    /// Disk busy while an MLP half ran.
    pub disk_busy_mlp: f64,
    /// The attention halves of the layers whose experts PILOT predicted in the layer before
    /// (every MoE layer but one preceded by none: what PILOT's reads can run into).
    pub predicted_attention: f64,
    /// Disk busy while one of those ran.
    pub disk_busy_predicted_attention: f64,
}

/// The halves between two readings of [`HalfSeconds`] (since load): what the forwards between
/// them added.
impl std::ops::Sub for HalfSeconds {
    type Output = HalfSeconds;

    fn sub(self, o: HalfSeconds) -> HalfSeconds {
        HalfSeconds {
            attention: self.attention - o.attention,
            mlp: self.mlp - o.mlp,
            disk_busy_attention: self.disk_busy_attention - o.disk_busy_attention,
            disk_busy_mlp: self.disk_busy_mlp - o.disk_busy_mlp,
            predicted_attention: self.predicted_attention - o.predicted_attention,
            disk_busy_predicted_attention: self.disk_busy_predicted_attention
                - o.disk_busy_predicted_attention,
        }
    }
}

/// The running timer of one forward.
pub(super) struct Lap<'a> {
    ns: &'a [AtomicU64; PHASES],
    last: Instant,
}

impl Lap<'_> {
    /// Charges the time since the previous mark to `p`.
    pub(super) fn mark(&mut self, p: Phase) {
        let now = Instant::now();
        let ns = u64::try_from((now - self.last).as_nanos()).unwrap_or(u64::MAX);
        self.ns[p as usize].fetch_add(ns, Ordering::Relaxed);
        self.last = now;
    }
}

/// Wall seconds per phase of one kind of layer forward (prefill chunks, or decode / MTP /
/// verify steps), summed over the layers (the MTP layer included) since load. What is not here
/// (embedding, the layers' input norms and residual adds, the final norm and lm_head, the MTP
/// head's own norms and projections, sampling) is that kind's time less their sum. On the GPU,
/// launches run asynchronously: a phase is charged when its results come back to the host (the
/// decode attention's absorbed form on the GPU lands in `o_proj`, whose download ends it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PhaseSeconds {
    /// q_a, q_b, kv_a with their norms and RoPE, and the cache append.
    pub attn_proj: f64,
    /// The indexer keys: wk, LayerNorm, RoPE, cache append.
    pub indexer_keys: f64,
    /// The indexer queries and head weights: wq_b, weights_proj, RoPE.
    pub indexer_proj: f64,
    /// The indexer's scores of every visible key (on the GPU: uploads and download included).
    pub indexer_scores: f64,
    /// The top-k selection per row.
    pub indexer_topk: f64,
    /// kv_b's rebuilt K/V (on the GPU path: with the copies into VRAM).
    pub kv_b: f64,
    /// Attention proper: scores, softmax, times V.
    pub attn_core: f64,
    /// o_proj.
    pub o_proj: f64,
    /// The MLP halves' input: norm, router, routes, batch-union.
    pub mlp_route: f64,
    /// The MLP halves' products: routed experts (with their reads and copies), the shared
    /// expert, or the dense SwiGLU.
    pub mlp: f64,
    /// The MoE's combine where the host does it, and the residual add.
    pub mlp_combine: f64,
}

impl PhaseSeconds {
    /// The sum of the phases.
    pub fn total(&self) -> f64 {
        self.attn_proj
            + self.indexer_keys
            + self.indexer_proj
            + self.indexer_scores
            + self.indexer_topk
            + self.kv_b
            + self.attn_core
            + self.o_proj
            + self.mlp_route
            + self.mlp
            + self.mlp_combine
    }
}

impl std::ops::Add for PhaseSeconds {
    type Output = PhaseSeconds;
    fn add(self, o: PhaseSeconds) -> PhaseSeconds {
        PhaseSeconds {
            attn_proj: self.attn_proj + o.attn_proj,
            indexer_keys: self.indexer_keys + o.indexer_keys,
            indexer_proj: self.indexer_proj + o.indexer_proj,
            indexer_scores: self.indexer_scores + o.indexer_scores,
            indexer_topk: self.indexer_topk + o.indexer_topk,
            kv_b: self.kv_b + o.kv_b,
            attn_core: self.attn_core + o.attn_core,
            o_proj: self.o_proj + o.o_proj,
            mlp_route: self.mlp_route + o.mlp_route,
            mlp: self.mlp + o.mlp,
            mlp_combine: self.mlp_combine + o.mlp_combine,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_overlap_sums_the_halves_apart() {
        let d = DiskOverlap::default();
        d.add([0.5, 1.5], [0.25, 1.0], true);
        d.add([0.5, 0.5], [0.0, 0.5], false);
        let sum = HalfSeconds {
            attention: 1.0,
            mlp: 2.0,
            disk_busy_attention: 0.25,
            disk_busy_mlp: 1.5,
            // Only the predicted layer's attention and its busy time.
            predicted_attention: 0.5,
            disk_busy_predicted_attention: 0.25,
        };
        assert_eq!(d.seconds(), sum);
        // A negative span (clocks read out of order) adds nothing rather than wrapping.
        d.add([-1.0, 0.0], [0.0, 0.0], true);
        assert_eq!(d.seconds(), sum);
    }

    #[test]
    fn laps_charge_their_kind_and_phase() {
        let p = Phases::default();
        let mut decode = p.lap(false);
        std::thread::sleep(std::time::Duration::from_millis(2));
        decode.mark(Phase::Mlp);
        assert_eq!(p.seconds(true), PhaseSeconds::default());
        let d = p.seconds(false);
        assert!(d.mlp >= 0.002, "{d:?}");
        assert_eq!(d.total(), d.mlp);
        let mut prefill = p.lap(true);
        std::thread::sleep(std::time::Duration::from_millis(2));
        prefill.mark(Phase::KvB);
        let s = p.seconds(true);
        assert!(s.kv_b >= 0.002, "{s:?}");
        assert_eq!(s.total(), s.kv_b);
        assert_eq!(
            p.seconds(false),
            d,
            "a prefill lap left the decode phases alone"
        );
        // The MLP half follows the attention half's kind.
        let mut mlp = p.resume();
        mlp.mark(Phase::Mlp);
        assert!(p.seconds(true).mlp > 0.0);
        assert_eq!(p.seconds(false), d);
    }
}
