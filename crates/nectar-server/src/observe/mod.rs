//! Seeing the experts: the live expert map (`GET /experts/map`, [`map`]), the event stream
//! (`GET /experts/events`: per-step hit flashes, evictions, turn starts, timeline samples and
//! pressure events), the per-request records behind the request log and the page's list of
//! current requests ([`requests`]), and the timeline sampler ([`timeline`]).
//!
//! The model thread reports into an [`Observatory`] (shared through the backend): once at load
//! (the map's geometry and the expert caches), at each turn start and after each forward step
//! (the routed-expert selection counts, whose growth since the previous step are the step's
//! hits). Readers take snapshots; nothing they do can block the model thread for more than a
//! short lock, and the event channel drops events for a reader that falls behind rather than
//! ever waiting.

pub mod map;
pub mod requests;
pub mod routes;
pub mod timeline;

use map::{Snapshot, TierCode};
use nectar_residency::{Residency, Telemetry};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::broadcast;

/// Events a slow reader may fall behind by before it misses some.
const EVENT_BACKLOG: usize = 1024;

/// Timeline samples kept for a page that connects later (one per active second: 10 minutes).
pub const TIMELINE_KEEP: usize = 600;

/// Pressure events kept.
pub const PRESSURE_KEEP: usize = 100;

/// One event of `/experts/events`: its SSE name and JSON payload.
#[derive(Debug, Clone)]
pub struct ObsEvent {
    /// `hits`, `evictions`, `turn`, `sample` or `pressure`.
    pub name: &'static str,
    /// The payload.
    pub data: Value,
}

/// What the model thread knows at load.
struct Model {
    /// Layer index of each map row.
    layers: Vec<u32>,
    /// Row of each layer index.
    row_of: HashMap<u32, usize>,
    cols: usize,
    /// The expert caches (`main`, `mtp`), when experts are streamed.
    tiers: Vec<(&'static str, Arc<Residency>)>,
    budget: Option<u64>,
}

/// What changes per step.
#[derive(Default)]
struct Live {
    counts: Vec<u64>,
    hits: Vec<u8>,
    seq: u64,
    turn: u64,
    /// The last eviction seen, per tier.
    evictions_seen: Vec<u64>,
}

/// Timeline and pressure history.
#[derive(Default)]
struct History {
    samples: VecDeque<Value>,
    pressure: VecDeque<Value>,
}

/// The expert map's state and the event channel (see the module docs).
pub struct Observatory {
    model: OnceLock<Model>,
    /// Experts in VRAM (`--gpu-memory`), as (layer, expert): shown as the `vram` tier.
    vram: OnceLock<Vec<(u32, u32)>>,
    live: Mutex<Live>,
    history: Mutex<History>,
    tx: broadcast::Sender<Arc<ObsEvent>>,
}

impl std::fmt::Debug for Observatory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observatory")
            .field("ready", &self.model.get().is_some())
            .finish()
    }
}

impl Default for Observatory {
    fn default() -> Self {
        Observatory {
            model: OnceLock::new(),
            vram: OnceLock::new(),
            live: Mutex::new(Live::default()),
            history: Mutex::new(History::default()),
            tx: broadcast::channel(EVENT_BACKLOG).0,
        }
    }
}

/// Selections per MoE layer (the MTP layer is `num_hidden_layers`), as the model counts them.
pub type Usage = [(usize, Vec<u64>)];

impl Observatory {
    fn lock(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The model is loaded: the map's rows are `usage`'s layers, its columns the widest layer's
    /// experts; `tiers` are the expert caches (none: experts memory-mapped).
    pub fn init(
        &self,
        usage: &Usage,
        tiers: Vec<(&'static str, Arc<Residency>)>,
        budget: Option<u64>,
    ) {
        let layers: Vec<u32> = usage.iter().map(|(l, _)| *l as u32).collect();
        let cols = usage.iter().map(|(_, c)| c.len()).max().unwrap_or(0);
        let cells = layers.len() * cols;
        {
            let mut live = self.lock();
            live.counts = vec![0; cells];
            live.hits = vec![0; map::hits_len(cells)];
            live.evictions_seen = vec![0; tiers.len()];
        }
        let row_of: HashMap<u32, usize> = layers.iter().enumerate().map(|(r, &l)| (l, r)).collect();
        // The counts so far are the baseline: heat, never hits.
        {
            let mut live = self.lock();
            for (layer, counts) in usage {
                if let Some(&row) = row_of.get(&(*layer as u32)) {
                    for (e, &c) in counts.iter().enumerate().take(cols) {
                        live.counts[row * cols + e] = c;
                    }
                }
            }
        }
        let _ = self.model.set(Model {
            layers,
            row_of,
            cols,
            tiers,
            budget,
        });
    }

    /// The experts the GPU holds (layer, expert): the map shows them in the `vram` tier.
    pub fn set_vram(&self, experts: Vec<(u32, u32)>) {
        let _ = self.vram.set(experts);
    }

    /// A new turn starts: the HITS plane is cleared and the turn number advances.
    pub fn turn_start(&self) {
        let mut live = self.lock();
        live.turn += 1;
        live.hits.iter_mut().for_each(|b| *b = 0);
        let data = json!({"turn": live.turn, "seq": live.seq});
        drop(live);
        self.publish("turn", data);
    }

    /// A forward step ran: `usage` is the model's selection counts now. Cells whose count grew
    /// are this step's hits (published as a `hits` event and added to the turn's plane); the
    /// caches' new evictions are published as an `evictions` event.
    pub fn step(&self, usage: &Usage) {
        let Some(m) = self.model.get() else { return };
        let mut live = self.lock();
        let mut cells = Vec::new();
        for (layer, counts) in usage {
            let Some(&row) = m.row_of.get(&(*layer as u32)) else {
                continue;
            };
            for (e, &c) in counts.iter().enumerate().take(m.cols) {
                let i = row * m.cols + e;
                if c > live.counts[i] {
                    live.counts[i] = c;
                    map::set_hit(&mut live.hits, i);
                    cells.push(i as u32);
                }
            }
        }
        live.seq += 1;
        let (seq, turn) = (live.seq, live.turn);
        let mut evictions = Vec::new();
        for (t, (_, res)) in m.tiers.iter().enumerate() {
            let seen = live.evictions_seen[t];
            for ev in res.evictions_since(seen) {
                live.evictions_seen[t] = ev.seq;
                let cell = |k: nectar_residency::ExpertKey| {
                    m.row_of
                        .get(&k.layer)
                        .map(|&r| r * m.cols + k.expert as usize)
                };
                if let (Some(out), Some(inn)) = (cell(ev.evicted), cell(ev.admitted)) {
                    evictions.push([out, inn]);
                }
            }
        }
        drop(live);
        if self.tx.receiver_count() == 0 {
            return;
        }
        if !cells.is_empty() {
            self.publish("hits", json!({"seq": seq, "turn": turn, "cells": cells}));
        }
        if !evictions.is_empty() {
            self.publish("evictions", json!({"seq": seq, "cells": evictions}));
        }
    }

    /// Sends an event to every reader of `/experts/events` (none: dropped).
    pub fn publish(&self, name: &'static str, data: Value) {
        let _ = self.tx.send(Arc::new(ObsEvent { name, data }));
    }

    /// Records a timeline sample (kept for later readers) and publishes it.
    pub fn sample(&self, data: Value) {
        let mut h = self.history();
        if h.samples.len() == TIMELINE_KEEP {
            h.samples.pop_front();
        }
        h.samples.push_back(data.clone());
        drop(h);
        self.publish("sample", data);
    }

    /// Records a pressure event (kept for later readers) and publishes it.
    pub fn pressure(&self, data: Value) {
        tracing::warn!(event = %data, "memory or I/O pressure");
        let mut h = self.history();
        if h.pressure.len() == PRESSURE_KEEP {
            h.pressure.pop_front();
        }
        h.pressure.push_back(data.clone());
        drop(h);
        self.publish("pressure", data);
    }

    /// A receiver of every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<ObsEvent>> {
        self.tx.subscribe()
    }

    /// The expert caches' counters, by tier name (empty: experts memory-mapped or not loaded).
    pub fn telemetry(&self) -> Vec<(&'static str, Telemetry)> {
        self.model.get().map_or_else(Vec::new, |m| {
            m.tiers.iter().map(|(n, r)| (*n, r.telemetry())).collect()
        })
    }

    /// The memory budget experts are streamed under.
    pub fn budget(&self) -> Option<u64> {
        self.model.get().and_then(|m| m.budget)
    }

    /// The current sequence number (`None` before the model is loaded).
    pub fn seq(&self) -> Option<u64> {
        self.model.get().map(|_| self.lock().seq)
    }

    /// The map as a binary frame (`emap: false`) or Colibri's text lines; `None` before the
    /// model is loaded.
    pub fn snapshot(&self, emap: bool) -> Option<Vec<u8>> {
        let m = self.model.get()?;
        let cells = m.layers.len() * m.cols;
        let base = if m.tiers.is_empty() {
            TierCode::Mapped
        } else {
            TierCode::Disk
        };
        let mut tiers = vec![base; cells];
        for (_, res) in &m.tiers {
            for p in res.placements() {
                if let Some(&row) = m.row_of.get(&p.key.layer) {
                    if let Some(t) = tiers.get_mut(row * m.cols + p.key.expert as usize) {
                        *t = TierCode::of(p.tier);
                    }
                }
            }
        }
        for &(layer, e) in self.vram.get().map_or(&[][..], |v| &v[..]) {
            if let Some(&row) = m.row_of.get(&layer) {
                if let Some(t) = tiers.get_mut(row * m.cols + e as usize) {
                    *t = TierCode::Vram;
                }
            }
        }
        let live = self.lock();
        let s = Snapshot {
            layers: &m.layers,
            cols: m.cols,
            seq: live.seq,
            turn: live.turn,
            counts: &live.counts,
            tiers: &tiers,
            hits: &live.hits,
        };
        Some(if emap {
            map::encode_emap(&s).into_bytes()
        } else {
            map::encode(&s)
        })
    }

    /// What a page needs first: the geometry, the tier names, and the history.
    pub fn hello(&self) -> Value {
        let h = self.history();
        let (layers, cols) = self
            .model
            .get()
            .map_or((vec![], 0), |m| (m.layers.clone(), m.cols));
        json!({
            "layers": layers,
            "cols": cols,
            "tiers": TierCode::ALL.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "streamed": self.model.get().is_some_and(|m| !m.tiers.is_empty()),
            "budget": self.budget(),
            "samples": h.samples,
            "pressure": h.pressure,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_lights_exactly_the_cells_whose_count_grew() {
        let o = Observatory::default();
        let usage = vec![(1usize, vec![0u64; 4]), (3, vec![0; 4])];
        o.init(&usage, vec![], None);
        let mut rx = o.subscribe();
        o.turn_start();
        o.step(&[(1, vec![0, 2, 0, 0]), (3, vec![1, 0, 0, 0])]);
        let frame = o.snapshot(false).unwrap();
        let cells = &frame[map::HEADER + 4..map::HEADER + 12];
        let hits = &frame[map::HEADER + 12..];
        let lit: Vec<usize> = (0..8).filter(|&i| map::is_hit(hits, i)).collect();
        assert_eq!(lit, vec![1, 4]);
        // No budget: every cell is memory-mapped; heat from the counts.
        assert_eq!(cells[1], ((TierCode::Mapped as u8) << 5) | 2);
        assert_eq!(cells[0], (TierCode::Mapped as u8) << 5);
        assert_eq!(rx.try_recv().unwrap().name, "turn");
        let e = rx.try_recv().unwrap();
        assert_eq!((e.name, &e.data["cells"]), ("hits", &json!([1, 4])));
        // The next turn clears the plane but keeps the heat.
        o.turn_start();
        let frame = o.snapshot(false).unwrap();
        assert!(frame[map::HEADER + 12..].iter().all(|&b| b == 0));
        assert_eq!(frame[map::HEADER + 4 + 1] & 31, 2);
        assert_eq!(u64::from_le_bytes(frame[16..24].try_into().unwrap()), 2);
    }

    #[test]
    fn experts_in_vram_show_in_the_vram_tier() {
        let o = Observatory::default();
        o.init(&[(1usize, vec![0u64; 4]), (3, vec![0; 4])], vec![], None);
        o.set_vram(vec![(3, 2), (1, 0), (9, 1)]);
        let frame = o.snapshot(false).unwrap();
        let cells = &frame[map::HEADER + 4..map::HEADER + 12];
        let tiers: Vec<u8> = cells.iter().map(|c| c >> 5).collect();
        let (v, m) = (TierCode::Vram as u8, TierCode::Mapped as u8);
        assert_eq!(tiers, vec![v, m, m, m, m, m, v, m]);
        assert!(o.snapshot(true).unwrap().starts_with(b"EMAP 2 4 80"));
    }
}
