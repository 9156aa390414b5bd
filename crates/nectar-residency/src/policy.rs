//! The slot policy as a pure state machine: which expert sits in which slot, per-layer LRU
//! with a monotonic clock, a pinned set, a working bank for the current wave's misses, and
//! promotion by swapping slot roles. No bytes and no I/O here, so it can be tested exhaustively
//! against a small reference model.
//!
//! Rules (deterministic):
//! - A request for a key that is resident (pinned, in its layer's LRU, or loading) is a hit and
//!   touches the slot (`last_use = ++clock`).
//! - A miss takes a free working slot; the key is visible (in-flight dedup) from then on.
//! - At the end of a wave (a safe point: no lease alive on the wave's slots), completed misses
//!   are promoted into their layer's LRU, last miss first, at most `capacity` of them: into a
//!   free LRU position if the layer has one, else by evicting the victim — the layer's slot
//!   not touched in this wave with the smallest `last_use`, ties to the smallest slot id — whose
//!   slot becomes a working slot (roles swap, bytes never move). Misses that are not promoted
//!   are dropped (bypass) and their working slots freed.
//! - Lowering a layer's capacity evicts its coldest slots at once and stays lowered.
//! - With [`Admission::Frequency`] (opt-in; the default is plain LRU) every request also adds
//!   one to the key's score, which halves every `half_life` waves of its layer. A full layer
//!   then evicts its lowest-scoring untouched slot (ties: least recently used), and only for a
//!   miss that scores higher; otherwise the miss is bypassed. One-off experts no longer push
//!   out experts that keep coming back (`specs/lessons.md` §26-27: a decayed-frequency
//!   admission simulated at 0.76–0.91 of Belady where LRU reaches 0.64–0.77).
//! - A **prefetch** (a predicted request for a layer not yet reached) is a read of its own class:
//!   it takes a free working slot only if the key is absent and one is free, touches nothing, and
//!   counts as neither hit nor miss. A later request for the key is a prefetch hit and turns it
//!   into an ordinary miss of that wave (promoted at the safe point like any other); a prefetch
//!   nobody requested by its layer's safe point is dropped without evicting anything — a wrong
//!   prediction costs a read, never a cached expert.
//! - With [`Admission::Predictive`] (opt-in) a layer's safe point keeps, of its residents and
//!   this wave's misses, the `capacity` with the highest *predicted value*; the others are
//!   evicted or bypassed (residents touched in this wave may be evicted too: nothing holds a
//!   lease at a safe point). For an expert `e` of layer `l` after the wave of row (token) `t`:
//!
//!   ```text
//!   f(e) = 8 · F(e) / Σ F          F = requests of the layer, halving every `half_life` waves
//!   m(e) = mean over p of Σ_{k=1..min(16, t-1-p)} 0.8^(k-1) · [e ∈ routes(p+k, l)]
//!   x(e) = (Σ_{a ∈ routes(t,l)} N(a→e) + f(e)) / (Σ_{a ∈ routes(t,l)} n(a) + 1)
//!   score = f + match_weight · m + transition_weight · x
//!   ```
//!
//!   A step of several rows (a prompt in one forward, a verify, a batch) counts F row by row,
//!   one wave per row, when its rows are handed in ([`Policy::observe_rows`]): as the same
//!   rows decoded one per step would.
//!
//!   `p` runs over the latest 4 earlier rows (at most `t - 2`) whose last n ∈ {32, 16, 8, 4, 2, 1}
//!   token ids equal those ending at `t` (longest n with a match wins; none: m = 0): what followed that context
//!   is the best guess of what follows now, and its recorded routes are a look-ahead of this
//!   layer's next requests — decoding, greedy above all, repeats itself, and the same context
//!   routes to the same experts. `N(a→b)` counts rows whose layer-`l` wave requested `a` followed
//!   by a row requesting `b`, `n(a)` rows requesting `a` that have a successor. Everything is
//!   causal: token ids up to `t` (the caller hands them in with [`Policy::observe_token`]),
//!   routes of rows before `t`, and the current row's routes at this layer. Without
//!   `observe_token` calls m = 0 and the rule is frequency + transitions. Replayed on the
//!   256-expert traces (`benchmarks/policy-research/`), it keeps 0.87–0.89 of Belady-with-bypass
//!   at 8–16 slots on greedy decode (decayed frequency top-C: 0.70–0.76) and 0.72–0.75 on
//!   sampled decode (0.62–0.68).
use foldhash::{HashMap, HashMapExt};

pub mod control;
mod lookahead;
mod predict;

pub use control::{ControlStats, Controller};
pub use lookahead::{LookaheadStats, LONGEST_CONTEXT, MIN_CONTEXT};

/// A routed expert: (layer, expert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertKey {
    /// Layer index (the MTP layer is `num_hidden_layers`).
    pub layer: u32,
    /// Expert index within the layer.
    pub expert: u32,
}

impl ExpertKey {
    /// A key.
    pub fn new(layer: usize, expert: usize) -> Self {
        ExpertKey {
            layer: layer as u32,
            expert: expert as u32,
        }
    }
}

/// What a slot is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Free working slot.
    Free,
    /// Holds a miss of the current wave.
    Working,
    /// Part of a layer's LRU.
    Lru(u32),
    /// Pinned for the life of the process.
    Pinned,
    /// Removed from service by a capacity reduction (back in service only through
    /// [`Policy::grow`]).
    Disabled,
}

/// The outcome of one request in a wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Resident (or already loading): use `slot`.
    Hit(usize),
    /// Not resident: load it into working slot `slot`.
    Miss(usize),
}

/// An event of the policy, for telemetry and for comparing against a reference model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A hit.
    Hit(ExpertKey),
    /// A miss.
    Miss(ExpertKey),
    /// `evicted` left the cache so that `admitted` could enter.
    Evict {
        /// Key removed.
        evicted: ExpertKey,
        /// Key admitted in its place.
        admitted: ExpertKey,
    },
    /// A miss was not kept (bypass).
    Bypass(ExpertKey),
    /// A prefetch started loading.
    Prefetch(ExpertKey),
    /// A request found its key prefetched (loaded or loading).
    PrefetchHit(ExpertKey),
    /// A prefetch nobody requested was dropped at its layer's safe point.
    PrefetchDropped {
        /// The expert.
        key: ExpertKey,
        /// Whether the look-ahead plan had started it.
        planned: bool,
    },
}

#[derive(Debug, Clone)]
struct Slot {
    role: Role,
    key: Option<ExpertKey>,
    last_use: u64,
    wave: u64,
    /// A prefetched working slot not yet requested.
    prefetch: bool,
    /// Of a prefetch: started by the look-ahead plan, not by [`Policy::prefetch`] (whose limit
    /// counts only its own, so look-ahead and PILOT together keep PILOT its slots).
    planned: bool,
}

impl Slot {
    /// A slot of `role` holding nothing.
    fn empty(role: Role) -> Slot {
        Slot {
            role,
            key: None,
            last_use: 0,
            wave: 0,
            prefetch: false,
            planned: false,
        }
    }
}

/// How a full layer decides whether a miss enters its cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admission {
    /// Always, evicting the least recently used (the reference policy).
    Lru,
    /// Only when the miss's decayed request count beats the weakest resident's.
    Frequency {
        /// Waves (of the key's layer) after which a score has halved.
        half_life: f64,
    },
    /// Keep the highest predicted values among residents and misses (see the module docs):
    /// decayed frequency + a look-ahead from the longest earlier occurrence of the current
    /// token context + learned expert transitions. Needs [`Policy::observe_token`] per step.
    Predictive {
        /// Waves (of the key's layer) after which a frequency count has halved (32).
        half_life: f64,
        /// Weight of the context-match look-ahead (1).
        match_weight: f64,
        /// Weight of the learned transition estimate (2).
        transition_weight: f64,
    },
}

impl Admission {
    /// [`Admission::Predictive`] with the replay-tuned parameters.
    pub const PREDICTIVE: Admission = Admission::Predictive {
        half_life: 32.0,
        match_weight: 1.0,
        transition_weight: 2.0,
    };

    /// The names [`Admission::from_name`] accepts, the default first.
    pub const NAMES: [&'static str; 3] = ["predictive", "frequency", "lru"];

    /// The admission a command-line name stands for: `predictive` ([`Admission::PREDICTIVE`]),
    /// `frequency` (half-life 64 waves) or `lru`.
    pub fn from_name(name: &str) -> Option<Admission> {
        match name {
            "predictive" => Some(Admission::PREDICTIVE),
            "frequency" => Some(Admission::Frequency { half_life: 64.0 }),
            "lru" => Some(Admission::Lru),
            _ => None,
        }
    }
}

/// A key's decayed request count, as of a wave of its layer.
#[derive(Debug, Clone, Copy)]
struct Score {
    value: f64,
    wave: u64,
}

/// The policy state for all layers.
#[derive(Debug, Clone)]
pub struct Policy {
    admission: Admission,
    scores: HashMap<ExpertKey, Score>,
    slots: Vec<Slot>,
    map: HashMap<ExpertKey, usize>,
    capacity: Vec<usize>,
    clock: u64,
    /// Current wave number per layer (layers' waves are independent, so the next layer's
    /// experts can be requested before this layer's safe point).
    wave: Vec<u64>,
    wave_misses: Vec<(ExpertKey, usize)>,
    /// Predictive admission: decayed request mass per layer (Σ of its keys' scores).
    mass: Vec<Score>,
    /// Predictive admission: the experts each layer's current wave requested (request order).
    wave_routes: Vec<Vec<u32>>,
    /// Predictive admission: per-row routes of a multi-row step, handed in before its waves
    /// ([`Policy::observe_rows`]), learned at the layer's first safe point of the step.
    row_routes: Vec<Option<Vec<Vec<u32>>>>,
    /// Predictive admission: the last row's routes once this step's rows were learned (later
    /// waves of the same step neither learn again nor overwrite them).
    learned: Vec<Option<Vec<u32>>>,
    /// Predictive admission: per layer, the experts of a multi-row step whose requests
    /// [`Policy::observe_rows`] counted row by row; the step's own request of each (in whichever
    /// of its waves) then counts nothing more.
    counted_ahead: Vec<Vec<u32>>,
    /// Predictive admission: token history, routes and transitions.
    predictor: predict::Predictor,
    /// Look-ahead prefetch: this step's predicted requests not yet read, in layer order.
    plan: std::collections::VecDeque<ExpertKey>,
    /// Look-ahead prefetch: working slots kept free for the step's own misses.
    plan_reserve: usize,
}

/// Errors of the policy (a caller bug or an exhausted working bank).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// More misses in one wave than free working slots.
    #[error("wave needs more than the {0} free working slots")]
    NoWorkingSlot(usize),
    /// A layer index outside the configured layers.
    #[error("layer {0} has no expert tier")]
    UnknownLayer(u32),
}

impl Policy {
    /// `capacity[l]` LRU slots for layer `l`, `working` working slots, and `pinned` keys in
    /// pinned slots. Slot ids: pinned first, then LRU positions layer by layer, then working.
    pub fn new(capacity: Vec<usize>, working: usize, pinned: &[ExpertKey]) -> Self {
        let mut slots = Vec::new();
        let mut map = HashMap::new();
        for &k in pinned {
            map.insert(k, slots.len());
            slots.push(Slot {
                role: Role::Pinned,
                key: Some(k),
                last_use: 0,
                wave: 0,
                prefetch: false,
                planned: false,
            });
        }
        for (l, &c) in capacity.iter().enumerate() {
            for _ in 0..c {
                slots.push(Slot::empty(Role::Lru(l as u32)));
            }
        }
        for _ in 0..working {
            slots.push(Slot::empty(Role::Free));
        }
        let wave = vec![1; capacity.len()];
        let n_layers = capacity.len();
        Policy {
            admission: Admission::Lru,
            scores: HashMap::new(),
            slots,
            map,
            capacity,
            clock: 0,
            wave,
            wave_misses: Vec::new(),
            mass: vec![
                Score {
                    value: 0.0,
                    wave: 0
                };
                n_layers
            ],
            wave_routes: vec![Vec::new(); n_layers],
            row_routes: vec![None; n_layers],
            learned: vec![None; n_layers],
            counted_ahead: vec![Vec::new(); n_layers],
            predictor: predict::Predictor::default(),
            plan: std::collections::VecDeque::new(),
            plan_reserve: 0,
        }
    }

    /// The same policy with `admission` (see [`Admission`]).
    pub fn with_admission(mut self, admission: Admission) -> Policy {
        self.admission = admission;
        self
    }

    /// The half-life of request counts, if the admission keeps them.
    fn half_life(&self) -> Option<f64> {
        match self.admission {
            Admission::Lru => None,
            Admission::Frequency { half_life } | Admission::Predictive { half_life, .. } => {
                Some(half_life)
            }
        }
    }

    /// `s` decayed to `layer`'s current wave.
    fn decayed(&self, s: Score, layer: usize) -> f64 {
        let h = self.half_life().unwrap_or(1.0);
        let age = self.wave[layer].saturating_sub(s.wave) as f64;
        s.value * 0.5f64.powf(age / h.max(1e-9))
    }

    /// `key`'s score at its layer's current wave (0 when never requested or under LRU).
    fn score(&self, key: ExpertKey) -> f64 {
        match (self.half_life(), self.scores.get(&key)) {
            (Some(_), Some(&s)) => self.decayed(s, key.layer as usize),
            _ => 0.0,
        }
    }

    /// Counts one request of `key` (frequency and predictive admission).
    fn bump(&mut self, key: ExpertKey) {
        if self.half_life().is_some() {
            let l = key.layer as usize;
            match self.counted_ahead[l].iter().position(|&e| e == key.expert) {
                Some(i) => {
                    self.counted_ahead[l].swap_remove(i);
                }
                None => self.count(key),
            }
            if let Admission::Predictive { .. } = self.admission {
                if !self.wave_routes[l].contains(&key.expert) {
                    self.wave_routes[l].push(key.expert);
                }
            }
        }
    }

    /// Adds one request of `key` at its layer's current wave to its score (and, under
    /// predictive admission, to the layer's mass).
    fn count(&mut self, key: ExpertKey) {
        let l = key.layer as usize;
        let value = self.score(key) + 1.0;
        let wave = self.wave[l];
        self.scores.insert(key, Score { value, wave });
        if let Admission::Predictive { .. } = self.admission {
            let value = self.decayed(self.mass[l], l) + 1.0;
            self.mass[l] = Score { value, wave };
        }
    }

    /// Hands in the token id the next step feeds the model for one of its rows, and the stream
    /// (sequence) the row belongs to (predictive admission; a no-op otherwise). Call it once per
    /// row, in row order, before that step's first [`Policy::access`]; the waves that follow are
    /// recorded as those tokens' routes. Contexts and transitions follow each stream's own rows,
    /// so a batch of several sequences learns and predicts each as if it ran alone. Only ids up
    /// to the current token are ever used — never the next one.
    pub fn observe_token(&mut self, stream: u64, token: u32) {
        if let Admission::Predictive { .. } = self.admission {
            self.predictor.observe_token(stream, token);
            self.learned.iter_mut().for_each(|l| *l = None);
        }
    }

    /// Hands in the experts each row of the coming step chose at `layer`, in row order (the
    /// rows of the tokens last observed; predictive admission, a no-op otherwise). Without it a
    /// step is recorded as one row requesting the union of its waves, which is exact for one
    /// token per step; a prompt fed in one step is learned row by row only through this.
    pub fn observe_rows(&mut self, layer: usize, rows: &[Vec<u32>]) {
        if matches!(self.admission, Admission::Predictive { .. }) && layer < self.row_routes.len() {
            self.row_routes[layer] = Some(rows.to_vec());
            // The rows' requests are counted as plain decoding would count them, one row per
            // wave: an expert that half of a prompt's rows chose scores far above one chosen
            // once, and the counts from before the prompt age by its length. Counted once per
            // step, the union would score every expert alike and leave the previous text's
            // counts as strong as if the prompt had been one token (RESULTS 2026-12-05, "the
            // end-to-end policy gap").
            // The step's waves then request each expert of the union once: that request
            // counts nothing more (`counted_ahead`).
            self.counted_ahead[layer].clear();
            if rows.len() > 1 {
                for (i, row) in rows.iter().enumerate() {
                    if i > 0 {
                        self.wave[layer] += 1;
                    }
                    for (j, &e) in row.iter().enumerate() {
                        if !row[..j].contains(&e) {
                            self.count(ExpertKey::new(layer, e as usize));
                        }
                        if !self.counted_ahead[layer].contains(&e) {
                            self.counted_ahead[layer].push(e);
                        }
                    }
                }
            }
        }
    }

    /// Total slots (the slab size in slots).
    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// The role of a slot.
    pub fn role(&self, slot: usize) -> Role {
        self.slots[slot].role
    }

    /// The key a slot holds.
    pub fn key(&self, slot: usize) -> Option<ExpertKey> {
        self.slots[slot].key
    }

    /// Whether a slot holds a prefetch nobody has requested yet.
    pub fn is_prefetch(&self, slot: usize) -> bool {
        self.slots[slot].prefetch
    }

    /// The slot holding `key`, if resident or loading.
    pub fn lookup(&self, key: ExpertKey) -> Option<usize> {
        self.map.get(&key).copied()
    }

    /// Current LRU capacity of a layer.
    pub fn capacity(&self, layer: usize) -> usize {
        self.capacity.get(layer).copied().unwrap_or(0)
    }

    /// LRU slots of a layer holding an expert.
    pub fn filled(&self, layer: usize) -> usize {
        let l = layer as u32;
        (self.slots.iter())
            .filter(|s| s.role == Role::Lru(l) && s.key.is_some())
            .count()
    }

    /// Free working slots.
    pub fn free_working(&self) -> usize {
        self.slots.iter().filter(|s| s.role == Role::Free).count()
    }

    /// Slots by role: (pinned, lru, working, free, disabled).
    pub fn occupancy(&self) -> (usize, usize, usize, usize, usize) {
        let mut o = (0, 0, 0, 0, 0);
        for s in &self.slots {
            match s.role {
                Role::Pinned => o.0 += 1,
                Role::Lru(_) if s.key.is_some() => o.1 += 1,
                Role::Lru(_) => {}
                Role::Working => o.2 += 1,
                Role::Free => o.3 += 1,
                Role::Disabled => o.4 += 1,
            }
        }
        o
    }

    /// Requests `key` in the current wave.
    pub fn access(
        &mut self,
        key: ExpertKey,
        events: &mut Vec<Event>,
    ) -> Result<Access, PolicyError> {
        if key.layer as usize >= self.capacity.len() {
            return Err(PolicyError::UnknownLayer(key.layer));
        }
        self.clock += 1;
        self.bump(key);
        if let Some(&s) = self.map.get(&key) {
            let slot = &mut self.slots[s];
            slot.last_use = self.clock;
            slot.wave = self.wave[key.layer as usize];
            if std::mem::take(&mut slot.prefetch) {
                events.push(Event::PrefetchHit(key));
            } else {
                events.push(Event::Hit(key));
            }
            return Ok(Access::Hit(s));
        }
        let s = self
            .slots
            .iter()
            .position(|s| s.role == Role::Free)
            .ok_or(PolicyError::NoWorkingSlot(self.free_working()))?;
        self.slots[s] = Slot {
            role: Role::Working,
            key: Some(key),
            last_use: self.clock,
            wave: self.wave[key.layer as usize],
            prefetch: false,
            planned: false,
        };
        self.map.insert(key, s);
        self.wave_misses.push((key, s));
        events.push(Event::Miss(key));
        Ok(Access::Miss(s))
    }

    /// Prefetches `key` (see the module docs): `Some(working slot)` to load it into, or `None`
    /// when it is already resident or loading, `limit` unrequested prefetches are outstanding,
    /// or no working slot is free (prefetch is best effort). Keeping `limit` within the slots
    /// beyond a wave's need means a prefetch never starves a wave.
    pub fn prefetch(
        &mut self,
        key: ExpertKey,
        limit: usize,
        events: &mut Vec<Event>,
    ) -> Result<Option<usize>, PolicyError> {
        if key.layer as usize >= self.capacity.len() {
            return Err(PolicyError::UnknownLayer(key.layer));
        }
        let own = self.slots.iter().filter(|s| s.prefetch && !s.planned);
        if self.map.contains_key(&key) || own.count() >= limit {
            return Ok(None);
        }
        Ok(self.claim_prefetch_slot(key, false, events))
    }

    /// Takes a free working slot for a prefetch of `key` (not resident or loading), or `None`
    /// when no slot is free. Shared by [`Policy::prefetch`] and the look-ahead plan (`planned`).
    fn claim_prefetch_slot(
        &mut self,
        key: ExpertKey,
        planned: bool,
        events: &mut Vec<Event>,
    ) -> Option<usize> {
        let s = self.slots.iter().position(|s| s.role == Role::Free)?;
        self.slots[s] = Slot {
            role: Role::Working,
            key: Some(key),
            last_use: self.clock,
            wave: 0,
            prefetch: true,
            planned,
        };
        self.map.insert(key, s);
        self.wave_misses.push((key, s));
        events.push(Event::Prefetch(key));
        Some(s)
    }

    /// Forgets a miss whose load failed (its working slot becomes free again).
    pub fn discard(&mut self, slot: usize) {
        if let Some(k) = self.slots[slot].key.take() {
            self.map.remove(&k);
        }
        if self.slots[slot].role == Role::Working {
            self.slots[slot].role = Role::Free;
        }
        self.slots[slot].prefetch = false;
        self.wave_misses.retain(|(_, s)| *s != slot);
    }

    /// Cancels the unrequested prefetch in `slot` before its read started: the working slot is
    /// free again, as if it had never been issued. `false` if the slot holds no such prefetch.
    pub fn cancel_prefetch(&mut self, slot: usize) -> bool {
        if !self.slots[slot].prefetch {
            return false;
        }
        self.discard(slot);
        true
    }

    /// The safe point after a wave of every layer (see [`Policy::end_wave_layer`]).
    pub fn end_wave(&mut self, events: &mut Vec<Event>) -> Vec<(usize, usize)> {
        let mut swaps = Vec::new();
        for l in 0..self.capacity.len() {
            swaps.extend(self.end_wave_layer(l, events));
        }
        swaps
    }

    /// The safe point after `layer`'s wave: promote its misses (see the module docs). Returns
    /// pairs of slots whose roles were swapped `(working slot now in the LRU, LRU slot now free)`.
    pub fn end_wave_layer(&mut self, layer: usize, events: &mut Vec<Event>) -> Vec<(usize, usize)> {
        let l32 = layer as u32;
        let (misses, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.wave_misses)
            .into_iter()
            .partition(|(k, _)| k.layer == l32);
        self.wave_misses = rest;
        // The look-ahead plan's entries for this layer are past (their wave has run).
        self.plan.retain(|k| k.layer > l32);
        // Prefetches nobody requested leave without touching the LRU.
        let (unused, misses): (Vec<_>, Vec<_>) = misses
            .into_iter()
            .partition(|&(_, ws)| self.slots[ws].prefetch);
        for (key, ws) in unused {
            let planned = std::mem::take(&mut self.slots[ws].planned);
            self.slots[ws].prefetch = false;
            self.map.remove(&key);
            self.slots[ws].key = None;
            self.slots[ws].role = Role::Free;
            events.push(Event::PrefetchDropped { key, planned });
        }
        if let Admission::Predictive { .. } = self.admission {
            let swaps = self.end_wave_predictive(layer, &misses, events);
            self.wave[layer] += 1;
            return swaps;
        }
        let cap = self.capacity[layer];
        let wave = self.wave[layer];
        let mut done = 0usize;
        let mut swaps = Vec::new();
        for &(key, ws) in misses.iter().rev() {
            if done >= cap {
                self.drop_working(ws, key, events);
                continue;
            }
            // An empty LRU position of the layer, else the coldest untouched one (under
            // frequency admission: the lowest-scoring, and only if the miss scores higher).
            let empty = self
                .slots
                .iter()
                .position(|s| s.role == Role::Lru(l32) && s.key.is_none());
            let target = empty.or_else(|| {
                let untouched = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.role == Role::Lru(l32) && s.wave != wave);
                match self.admission {
                    Admission::Lru => untouched
                        .min_by_key(|(i, s)| (s.last_use, *i))
                        .map(|(i, _)| i),
                    Admission::Frequency { .. } | Admission::Predictive { .. } => untouched
                        .map(|(i, s)| (i, s.key.map_or(0.0, |k| self.score(k)), s.last_use))
                        .min_by(|a, b| a.1.total_cmp(&b.1).then((a.2, a.0).cmp(&(b.2, b.0))))
                        .filter(|&(_, victim, _)| self.score(key) > victim)
                        .map(|(i, _, _)| i),
                }
            });
            let Some(t) = target else {
                self.drop_working(ws, key, events);
                continue;
            };
            self.admit(ws, t, key, l32, events);
            swaps.push((ws, t));
            done += 1;
        }
        self.wave[layer] += 1;
        swaps
    }

    /// [`Admission::Predictive`]'s safe point: keep the `capacity` best of residents ∪ misses.
    fn end_wave_predictive(
        &mut self,
        layer: usize,
        misses: &[(ExpertKey, usize)],
        events: &mut Vec<Event>,
    ) -> Vec<(usize, usize)> {
        let Admission::Predictive {
            match_weight,
            transition_weight,
            ..
        } = self.admission
        else {
            unreachable!("predictive admission only")
        };
        let l32 = layer as u32;
        let wave = std::mem::take(&mut self.wave_routes[layer]);
        let cur = if let Some(rows) = self.row_routes[layer].take() {
            self.predictor.learn_rows(layer, &rows);
            let last = rows.last().cloned().unwrap_or_default();
            self.learned[layer] = Some(last.clone());
            last
        } else if let Some(last) = &self.learned[layer] {
            last.clone()
        } else {
            self.predictor.learn(layer, &wave);
            wave
        };
        let mass = self.decayed(self.mass[layer], layer);
        let mut currents = self.predictor.current_routes(layer);
        if currents.is_empty() {
            // No token observed (a replay without token ids): the wave's own routes.
            currents.push(&cur);
        }
        // (slot, key, resident, last_use, score)
        let mut cands: Vec<(usize, ExpertKey, bool, u64, f64)> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if let (Role::Lru(l), Some(k)) = (s.role, s.key) {
                if l == l32 {
                    cands.push((i, k, true, s.last_use, 0.0));
                }
            }
        }
        for &(k, ws) in misses {
            cands.push((ws, k, false, self.slots[ws].last_use, 0.0));
        }
        for c in &mut cands {
            let e = c.1.expert;
            let f = if mass > 0.0 {
                8.0 * self.score(c.1) / mass
            } else {
                0.0
            };
            let m = self.predictor.lookahead(layer, e);
            // The transitions from each stream's current row (one stream: `cur`).
            let (num, den) = currents.iter().fold((0.0, 0.0), |(n, d), r| {
                let (a, b) = self.predictor.transition(layer, r, e);
                (n + a, d + b)
            });
            let x = (num + f) / (den + 1.0);
            c.4 = f + match_weight * m + transition_weight * x;
        }
        // Highest score first; ties: residents (no load), then most recent, then lowest id.
        cands.sort_by(|a, b| {
            b.4.total_cmp(&a.4)
                .then(b.2.cmp(&a.2))
                .then(b.3.cmp(&a.3))
                .then(a.1.expert.cmp(&b.1.expert))
        });
        let keep = cands.len().min(self.capacity[layer]);
        let (kept, dropped) = cands.split_at(keep);
        let mut targets: Vec<usize> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.role == Role::Lru(l32) && s.key.is_none())
            .map(|(i, _)| i)
            .collect();
        // Evicted residents, weakest first.
        targets.extend(dropped.iter().rev().filter(|c| c.2).map(|c| c.0));
        let mut targets = targets.into_iter();
        let mut swaps = Vec::new();
        for &(ws, key, resident, _, _) in kept {
            if resident {
                continue;
            }
            let t = targets
                .next()
                .expect("an admitted miss always finds an empty or evicted position");
            self.admit(ws, t, key, l32, events);
            swaps.push((ws, t));
        }
        for &(ws, key, resident, _, _) in dropped {
            if !resident {
                self.drop_working(ws, key, events);
            }
        }
        swaps
    }

    /// Working slot `ws` (holding `key`) joins layer `l`'s LRU in place of LRU position `t`,
    /// whose key (if any) is evicted: the roles swap, bytes never move.
    fn admit(&mut self, ws: usize, t: usize, key: ExpertKey, l: u32, events: &mut Vec<Event>) {
        if let Some(old) = self.slots[t].key.take() {
            self.map.remove(&old);
            events.push(Event::Evict {
                evicted: old,
                admitted: key,
            });
        }
        self.slots[ws].role = Role::Lru(l);
        self.slots[t].role = Role::Free;
        self.slots[t].wave = 0;
    }

    fn drop_working(&mut self, ws: usize, key: ExpertKey, events: &mut Vec<Event>) {
        self.map.remove(&key);
        self.slots[ws].key = None;
        self.slots[ws].role = Role::Free;
        events.push(Event::Bypass(key));
    }

    /// Live repin at a safe point between turns (no lease alive): within each layer, a resident
    /// LRU expert whose decayed request count beats a pinned expert's by 25 % plus 4 takes its
    /// pinned role, and the pin becomes an LRU slot of the same layer — no bytes move and every
    /// layer keeps its capacity. The hysteresis (the seed's rule) keeps pins from flapping; at
    /// most `max_swaps` swaps, largest gain first. Needs a scoring admission (frequency or
    /// predictive); under LRU nothing moves. Returns (promoted, demoted) pairs.
    pub fn repin(&mut self, max_swaps: usize) -> Vec<(ExpertKey, ExpertKey)> {
        if self.half_life().is_none() {
            return Vec::new();
        }
        // (gain, candidate slot, pin slot), per layer the best candidates against the weakest pins.
        let mut swaps: Vec<(f64, usize, usize)> = Vec::new();
        for layer in 0..self.capacity.len() {
            let l32 = layer as u32;
            let scored = |role: Role| -> Vec<(f64, usize)> {
                let mut v: Vec<(f64, usize)> = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| match (s.role, s.key) {
                        (r, Some(k)) if r == role && k.layer == l32 => Some((self.score(k), i)),
                        _ => None,
                    })
                    .collect();
                v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                v
            };
            let pins = scored(Role::Pinned);
            let mut cands = scored(Role::Lru(l32));
            cands.reverse();
            for (&(pin, ps), &(cand, cs)) in pins.iter().zip(&cands) {
                if cand > 1.25 * pin + 4.0 {
                    swaps.push((cand - pin, cs, ps));
                }
            }
        }
        swaps.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        swaps.truncate(max_swaps);
        let mut out = Vec::new();
        for (_, cs, ps) in swaps {
            let lru = self.slots[cs].role;
            self.slots[cs].role = Role::Pinned;
            self.slots[ps].role = lru;
            if let (Some(c), Some(p)) = (self.slots[cs].key, self.slots[ps].key) {
                out.push((c, p));
            }
        }
        out
    }

    /// Lowers layer `layer`'s capacity to `cap` (never raises it): the coldest slots are evicted
    /// and disabled until [`Policy::grow`] takes them back. Returns the evicted keys.
    pub fn shrink(&mut self, layer: usize, cap: usize) -> Vec<ExpertKey> {
        let mut out = Vec::new();
        let l = layer as u32;
        while self.capacity[layer] > cap {
            let victim = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.role == Role::Lru(l))
                .min_by_key(|(i, s)| (s.key.is_some(), s.last_use, *i))
                .map(|(i, _)| i);
            let Some(v) = victim else { break };
            if let Some(k) = self.slots[v].key.take() {
                self.map.remove(&k);
                out.push(k);
            }
            self.slots[v].role = Role::Disabled;
            self.capacity[layer] -= 1;
        }
        out
    }

    /// Slots of the working bank: free ones and those holding a miss or a prefetch.
    fn bank(&self) -> usize {
        (self.slots.iter())
            .filter(|s| matches!(s.role, Role::Free | Role::Working))
            .count()
    }

    /// Lowers the working bank towards `n` slots by disabling free ones, the last first (the
    /// least likely written); a slot holding a miss or a prefetch is never touched, so the bank
    /// may stay larger until they are settled (the next call takes the rest).
    pub fn shrink_bank(&mut self, n: usize) {
        let mut size = self.bank();
        while size > n {
            let Some(s) = self.slots.iter().rposition(|s| s.role == Role::Free) else {
                break;
            };
            self.slots[s].role = Role::Disabled;
            size -= 1;
        }
    }

    /// Raises the working bank towards `n` slots with disabled ones, which join it free.
    /// Returns the slots taken into the bank.
    pub fn grow_bank(&mut self, n: usize) -> Vec<usize> {
        let mut taken = Vec::new();
        for _ in self.bank()..n {
            let Some(s) = self.slots.iter().position(|s| s.role == Role::Disabled) else {
                break;
            };
            self.slots[s] = Slot::empty(Role::Free);
            taken.push(s);
        }
        taken
    }

    /// Raises layer `layer`'s capacity to `cap` (never lowers it) with disabled slots, which
    /// join its LRU empty. Returns the slots taken back into service (fewer when no disabled
    /// slot is left).
    pub fn grow(&mut self, layer: usize, cap: usize) -> Vec<usize> {
        let mut out = Vec::new();
        while self.capacity[layer] < cap {
            let Some(s) = self.slots.iter().position(|s| s.role == Role::Disabled) else {
                break;
            };
            self.slots[s] = Slot::empty(Role::Lru(layer as u32));
            self.capacity[layer] += 1;
            out.push(s);
        }
        out
    }
}

#[cfg(test)]
mod tests;
