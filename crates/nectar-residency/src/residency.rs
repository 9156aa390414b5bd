//! The residency manager: slots in one slab, the policy, leases with generations, and a pool
//! of I/O workers that fill working slots while compute runs.
//!
//! Protocol for one layer's wave (the model's MoE block drives it):
//! 1. `acquire(layer, experts)` — each expert gets a [`Pending`]: hits are ready at once,
//!    misses are queued to the I/O workers (an expert already loading is shared, not re-read).
//! 2. `Pending::wait()` → a [`Lease`]: while it lives, its slot is never refilled; its
//!    generation is checked on every access.
//! 3. After the layer's expert work, drop the leases and call `end_wave()` — the safe point at
//!    which misses are promoted into the layer's LRU (slot roles swap, bytes never move).
use crate::error::{Error, Result};
use crate::io::ExpertIo;
use crate::jobs::{Job, Jobs};
use crate::layout::SlotLayout;
use crate::policy::control::Measurement;
use crate::policy::{Access, Admission, Controller, Event, ExpertKey, Policy, Role};
use crate::slab::Slab;
use crate::telemetry::{Eviction, LayerStats, Occupancy, Placement, Telemetry, Tier};
use nectar_kernels::MatRef;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// How the expert cache is set up.
#[derive(Debug, Clone)]
pub struct ResidencyConfig {
    /// LRU slots per layer index (0 for dense layers).
    pub lru_per_layer: Vec<usize>,
    /// Working slots for the misses of one wave (Colibri uses 64).
    pub working_slots: usize,
    /// Extra working slots for prefetches ([`Residency::prefetch`]); 0 turns prefetch off. At
    /// most this many unrequested prefetches are outstanding, so a wave always finds its
    /// `working_slots`.
    pub prefetch_slots: usize,
    /// I/O worker threads.
    pub io_threads: usize,
    /// Experts pinned for the life of the process (loaded at startup).
    pub pinned: Vec<ExpertKey>,
    /// `mlock` the slab (fails with a clear error when RLIMIT_MEMLOCK is too low).
    pub mlock: bool,
    /// How a full layer admits misses (default: LRU).
    pub admission: Admission,
    /// Look-ahead prefetch ([`Residency::begin_step`]): read a step's predicted misses before
    /// their layers run, into the working slots its waves do not need (predictive admission
    /// only; see `policy/lookahead.rs`).
    pub lookahead: bool,
}

#[derive(Debug, Clone)]
enum Status {
    Empty,
    Loading,
    Ready,
    Failed(Arc<(u64, std::io::Error)>),
}

#[derive(Debug, Clone)]
struct SlotState {
    status: Status,
    leases: u32,
}

struct State {
    policy: Policy,
    slots: Vec<SlotState>,
    /// Slots whose pages were given back to the OS (out of service; see [`Residency::shrink_all`]).
    released: Vec<bool>,
    /// LRU capacity per layer the memory plan of the moment gives ([`Residency::set_plan`]; the
    /// configured capacity until then): [`Residency::grow_all`] never goes above it.
    planned: Vec<usize>,
    /// The memory guard's cap on every layer's capacity ([`Residency::shrink_all`], raised by
    /// [`Residency::grow_all`]; `None`: no cap): a plan of the moment never grows past it.
    cut: Option<usize>,
    stats: Telemetry,
    events: Vec<Event>,
    paths: Vec<std::path::PathBuf>,
    /// The latest evictions (at most [`EVICTION_HISTORY`]), oldest first.
    evictions: VecDeque<Eviction>,
    /// Evictions ever (the `seq` of the newest).
    evicted: u64,
    /// Since when some read has been in flight (`None`: the disk is idle).
    busy_since: Option<Instant>,
    /// Threads waiting for a read now, and since when at least one has been: `wait_seconds`
    /// counts the time some thread waited, once however many waited together (a GPU copy
    /// thread and the CPU's experts wait side by side; summed, the waits exceeded the decode's
    /// wall time).
    waiters: usize,
    wait_since: Option<Instant>,
    /// The look-ahead's threshold controller (with look-ahead prefetch).
    control: Option<Controller>,
    /// The decode step being measured for the controller: its start and, once a layer's safe
    /// point has run, the latest one (the step ends at its last safe point, so the time between
    /// turns is never counted).
    step: Option<StepClock>,
    /// The look-ahead plan's reads dropped unrequested: the waste its threshold controls (a
    /// PILOT beside it, `--prefetch both`, wastes reads the threshold does not decide).
    planned_wasted: u64,
}

/// A decode step being measured: its start, and its latest safe point so far.
#[derive(Debug, Clone, Copy)]
struct StepClock {
    /// Sequences the step decodes together (the controller's windows keep one width).
    sequences: usize,
    start: (Instant, Snapshot),
    last: Option<(Instant, Snapshot)>,
}

/// Counters a controller measurement is the difference of.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    busy: f64,
    wait: f64,
    reads: u64,
    wasted: u64,
}

impl State {
    /// A thread starts waiting for a read.
    fn begin_wait(&mut self) {
        if self.waiters == 0 {
            self.wait_since = Some(Instant::now());
        }
        self.waiters += 1;
    }

    /// A thread stops waiting; the last one out adds the time since the first came in.
    fn end_wait(&mut self) {
        self.waiters = self.waiters.saturating_sub(1);
        if self.waiters == 0 {
            if let Some(t) = self.wait_since.take() {
                self.stats.wait_seconds += t.elapsed().as_secs_f64();
            }
        }
    }

    /// Seconds some read has been in flight since load, one in flight counted up to `now`.
    fn busy(&self, now: Instant) -> f64 {
        self.stats.disk_busy_seconds
            + self
                .busy_since
                .map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64())
    }

    fn snapshot(&self, now: Instant) -> Snapshot {
        let busy = self.busy(now);
        let wait = self.stats.wait_seconds
            + self
                .wait_since
                .map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64());
        Snapshot {
            busy,
            wait,
            reads: self.stats.reads,
            wasted: self.planned_wasted,
        }
    }
}

/// Rows of a forward up to which [`Residency::begin_step`] plans (a decode step or a verify).
const MAX_LOOKAHEAD_ROWS: usize = 4;

/// Evictions remembered for [`Residency::evictions_since`]: a reader that falls further behind
/// sees the newest ones and a gap in `seq`.
pub const EVICTION_HISTORY: usize = 4096;

/// Told before the residency manager gives slab memory back: what lets a GPU tier register
/// slots with its driver for direct DMA (pinned pages are neither freed by `MADV_DONTNEED` nor
/// the pages the process sees after it) without this crate knowing about GPUs.
pub trait SlabHook: Send + Sync {
    /// `[start, start + len)` (whole slots) is about to be returned to the OS
    /// (`MADV_DONTNEED`, by [`Residency::shrink_all`]) or freed (the manager's last handle
    /// dropped). No lease reads it. Stop using the range (e.g. unregister it) before returning;
    /// the same range may be written and leased again later (a regrowth).
    fn releasing(&self, start: *const u8, len: usize);
}

struct Inner {
    slab: Slab,
    /// Told before slab memory goes back to the OS ([`Residency::set_slab_hook`]).
    hook: Mutex<Option<Arc<dyn SlabHook>>>,
    /// LRU capacity per layer as configured (the slab holds them): [`Residency::set_plan`]
    /// never goes above it.
    caps: Vec<usize>,
    layouts: Vec<Vec<SlotLayout>>,
    io: Arc<dyn ExpertIo>,
    state: Mutex<State>,
    cond: Condvar,
    gens: Vec<AtomicU64>,
}

/// The expert cache of one model.
pub struct Residency {
    inner: Arc<Inner>,
    jobs: Arc<Jobs>,
    workers: Vec<JoinHandle<()>>,
    /// Most misses a wave may have: the working bank less the prefetch slots (the plan of the
    /// moment may lower it, [`Residency::set_plan`]).
    working: AtomicUsize,
    /// The configured working slots (what the slab's bank holds at most).
    working_max: usize,
    prefetch_slots: usize,
    lookahead: bool,
}

impl std::fmt::Debug for Residency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Residency({} slots of {} B)",
            self.inner.slab.len(),
            self.inner.slab.slot_bytes()
        )
    }
}

impl Residency {
    /// Builds the cache: `layouts[layer][expert]` for every streamed layer (empty for dense
    /// ones), shard paths for error messages, and the I/O source. Pinned experts are loaded
    /// before this returns.
    pub fn new(
        cfg: ResidencyConfig,
        layouts: Vec<Vec<SlotLayout>>,
        io: Arc<dyn ExpertIo>,
    ) -> Result<Residency> {
        let slot_bytes = layouts.iter().flatten().map(|l| l.bytes).max().unwrap_or(0);
        let mut caps = cfg.lru_per_layer.clone();
        caps.resize(layouts.len(), 0);
        for (l, ls) in layouts.iter().enumerate() {
            if ls.is_empty() {
                caps[l] = 0;
            }
        }
        for k in &cfg.pinned {
            if layouts
                .get(k.layer as usize)
                .is_none_or(|l| k.expert as usize >= l.len())
            {
                return Err(Error::Setup(format!(
                    "pinned expert {}:{} does not exist",
                    k.layer, k.expert
                )));
            }
        }
        let policy = Policy::new(
            caps.clone(),
            cfg.working_slots.max(1) + cfg.prefetch_slots,
            &cfg.pinned,
        )
        .with_admission(cfg.admission);
        let n = policy.n_slots();
        let slab = Slab::new(n, slot_bytes)
            .ok_or_else(|| Error::Setup(format!("cannot allocate {n} slots of {slot_bytes} B")))?;
        if cfg.mlock {
            #[cfg(unix)]
            slab.mlock().map_err(|e| {
                Error::Setup(format!("mlock of {} B failed ({e}); raise RLIMIT_MEMLOCK (ulimit -l) or run without mlock", slab.bytes()))
            })?;
        }
        let paths = (0..layouts.len())
            .map(|_| std::path::PathBuf::new())
            .collect();
        let state = State {
            slots: vec![
                SlotState {
                    status: Status::Empty,
                    leases: 0
                };
                n
            ],
            stats: Telemetry {
                layers: vec![LayerStats::default(); layouts.len()],
                ..Default::default()
            },
            released: vec![false; n],
            planned: caps.clone(),
            cut: None,
            events: Vec::new(),
            policy,
            paths,
            evictions: VecDeque::new(),
            evicted: 0,
            busy_since: None,
            waiters: 0,
            wait_since: None,
            control: (cfg.lookahead && matches!(cfg.admission, Admission::Predictive { .. }))
                .then(Controller::default),
            step: None,
            planned_wasted: 0,
        };
        let inner = Arc::new(Inner {
            slab,
            hook: Mutex::new(None),
            caps,
            layouts,
            io,
            state: Mutex::new(state),
            cond: Condvar::new(),
            gens: (0..n).map(|_| AtomicU64::new(0)).collect(),
        });
        let jobs = Arc::new(Jobs::default());
        let workers = (0..cfg.io_threads.max(1))
            .map(|i| {
                let (inner, jobs) = (inner.clone(), jobs.clone());
                std::thread::Builder::new()
                    .name(format!("nectar-io-{i}"))
                    .spawn(move || worker(&inner, &jobs))
                    .map_err(|e| Error::Setup(format!("cannot start I/O thread: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let r = Residency {
            inner,
            jobs,
            workers,
            working: cfg.working_slots.max(1).into(),
            working_max: cfg.working_slots.max(1),
            prefetch_slots: cfg.prefetch_slots,
            lookahead: cfg.lookahead && matches!(cfg.admission, Admission::Predictive { .. }),
        };
        r.load_pinned()?;
        Ok(r)
    }

    fn load_pinned(&self) -> Result<()> {
        let mut st = self.lock();
        let pinned: Vec<(usize, ExpertKey)> = (0..st.policy.n_slots())
            .filter(|&s| st.policy.role(s) == crate::policy::Role::Pinned)
            .filter_map(|s| st.policy.key(s).map(|k| (s, k)))
            .collect();
        for &(s, key) in &pinned {
            st.slots[s].status = Status::Loading;
            self.submit(&mut st, s, key, false);
        }
        drop(st);
        for (s, key) in pinned {
            let p = Pending {
                inner: self.inner.clone(),
                slot: s,
                gen: self.inner.gens[s].load(Ordering::Acquire),
                key,
                waited: false,
            };
            self.lock().slots[s].leases += 1;
            drop(p.wait()?);
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues the read of `key` into `slot` (`ahead`: a prefetch, read after every demand read).
    fn submit(&self, st: &mut State, slot: usize, key: ExpertKey, ahead: bool) {
        let gen = self.inner.gens[slot].fetch_add(1, Ordering::AcqRel) + 1;
        if st.stats.in_flight == 0 {
            st.busy_since = Some(Instant::now());
        }
        st.stats.in_flight += 1;
        st.stats.max_in_flight = st.stats.max_in_flight.max(st.stats.in_flight);
        self.jobs.push(Job { slot, gen, key }, ahead);
    }

    /// Most misses one wave may have (the working bank).
    pub fn max_wave(&self) -> usize {
        self.working.load(Ordering::Relaxed)
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.inner.slab.slot_bytes()
    }

    /// Bytes of the whole slab.
    pub fn slab_bytes(&self) -> usize {
        self.inner.slab.bytes()
    }

    /// Installs `hook`, told before any slot's memory is returned to the OS or the slab is
    /// freed (replacing an earlier one).
    pub fn set_slab_hook(&self, hook: Arc<dyn SlabHook>) {
        *self.inner.hook.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    /// The key of expert `e` of `layer`, if this cache streams it.
    fn streamed_key(&self, layer: usize, e: u32) -> Result<ExpertKey> {
        match self.inner.layouts.get(layer) {
            Some(l) if (e as usize) < l.len() => Ok(ExpertKey::new(layer, e as usize)),
            _ => Err(Error::Setup(format!(
                "layer {layer} expert {e} is not a streamed expert"
            ))),
        }
    }

    /// Requests `experts` of `layer` for one wave (at most [`Residency::max_wave`] of them may
    /// miss). Hits are ready at once; misses start loading now.
    pub fn acquire(&self, layer: usize, experts: &[u32]) -> Result<Vec<Pending>> {
        let mut st = self.lock();
        let mut out = Vec::with_capacity(experts.len());
        for &e in experts {
            let key = self.streamed_key(layer, e)?;
            let mut events = std::mem::take(&mut st.events);
            let access = st.policy.access(key, &mut events);
            let prefetched = matches!(events.last(), Some(Event::PrefetchHit(_)));
            st.events = events;
            let slot = match access? {
                Access::Hit(s) => {
                    if st.policy.role(s) == crate::policy::Role::Pinned {
                        st.stats.layers[layer].pinned_hits += 1;
                    }
                    // Compute now waits for this prefetch: its read goes before other prefetches.
                    if prefetched && matches!(st.slots[s].status, Status::Loading) {
                        self.jobs.promote(s);
                    }
                    s
                }
                Access::Miss(s) => {
                    st.slots[s].status = Status::Loading;
                    self.submit(&mut st, s, key, false);
                    s
                }
            };
            st.slots[slot].leases += 1;
            out.push(Pending {
                inner: self.inner.clone(),
                slot,
                gen: self.inner.gens[slot].load(Ordering::Acquire),
                key,
                waited: false,
            });
        }
        Ok(out)
    }

    /// `layer`'s router has chosen: `experts` is every expert its step will request of this
    /// cache. The layer's prefetches that nobody will request and whose reads have not started
    /// are cancelled — the disk goes to the reads compute is about to wait for, the working
    /// slots to later layers' prefetches — and the look-ahead plan forgets the layer. Call once
    /// per layer and step, before its first [`Residency::acquire`]. Returns how many were
    /// cancelled (counted in [`LayerStats::prefetch_cancelled`]).
    pub fn routed(&self, layer: usize, experts: &[u32]) -> usize {
        let mut st = self.lock();
        let l32 = layer as u32;
        st.policy.forget_plan_through(l32);
        let stale: Vec<usize> = (0..st.slots.len())
            .filter(|&s| st.policy.is_prefetch(s))
            .filter(|&s| {
                st.policy
                    .key(s)
                    .is_some_and(|k| k.layer == l32 && !experts.contains(&k.expert))
            })
            .collect();
        let mut n = 0;
        for s in stale {
            // A read already started runs to its end (and is dropped at the safe point).
            if !self.jobs.cancel(s) || !st.policy.cancel_prefetch(s) {
                continue;
            }
            st.slots[s].status = Status::Empty;
            st.stats.in_flight -= 1;
            if st.stats.in_flight == 0 {
                if let Some(t) = st.busy_since.take() {
                    st.stats.disk_busy_seconds += t.elapsed().as_secs_f64();
                }
            }
            st.stats.layers[layer].prefetch_cancelled += 1;
            n += 1;
        }
        if n > 0 {
            self.issue_planned(&mut st);
        }
        n
    }

    /// Starts loading predicted experts of `layer` ahead of their request (best effort: keys
    /// already resident or loading, and keys beyond the free prefetch slots, are skipped).
    /// Nothing is leased: a later [`Residency::acquire`] of a key is a prefetch hit (waiting
    /// only for the rest of its read); a key nobody acquires by the layer's safe point is
    /// dropped without evicting anything. Returns how many reads started.
    pub fn prefetch(&self, layer: usize, experts: &[u32]) -> Result<usize> {
        if self.prefetch_slots == 0 {
            return Ok(0);
        }
        let mut st = self.lock();
        let mut started = 0;
        for &e in experts {
            let key = self.streamed_key(layer, e)?;
            let mut events = std::mem::take(&mut st.events);
            let slot = st.policy.prefetch(key, self.prefetch_slots, &mut events);
            st.events = events;
            if let Some(s) = slot? {
                st.slots[s].status = Status::Loading;
                self.submit(&mut st, s, key, true);
                started += 1;
            }
        }
        Ok(started)
    }

    /// Look-ahead prefetch (with [`ResidencyConfig::lookahead`] under predictive admission; a
    /// no-op otherwise): call once per forward, after its [`Residency::observe_token`] calls and
    /// before its first [`Residency::acquire`], with the forward's rows and the most misses one
    /// of its waves can have (`rows × top-k`, at most [`Residency::max_wave`]). Plans the
    /// experts the policy predicts for every layer of this step and starts reading those the
    /// free working slots allow beyond `need`; each safe point starts more. A forward of more
    /// rows than a verify (`rows > 4`, a prompt) plans nothing: its union is read anyway. A
    /// step whose rows belong to several `streams` (sequences decoded together) plans each
    /// one's matched routes (the predictor keeps their histories apart) and is measured for
    /// the controller as a step of that width (its windows keep one width).
    /// The shortest matched context planned is the controller's (`policy/control.rs`), fed
    /// here with the previous decode step's measurements. Returns the reads started now.
    pub fn begin_step(&self, rows: usize, streams: usize, need: usize) -> usize {
        if !self.lookahead {
            return 0;
        }
        let mut st = self.lock();
        let now = Instant::now();
        let decode = rows <= MAX_LOOKAHEAD_ROWS;
        if let Some(StepClock {
            sequences,
            start: (t0, a),
            last: Some((t1, b)),
        }) = st.step.take()
        {
            let m = Measurement {
                steps: 1,
                seconds: t1.saturating_duration_since(t0).as_secs_f64(),
                busy_seconds: b.busy - a.busy,
                wait_seconds: b.wait - a.wait,
                reads: b.reads - a.reads,
                wasted: b.wasted - a.wasted,
            };
            if let Some(c) = st.control.as_mut() {
                c.record_batch(sequences, m);
            }
        }
        // A prompt is not a decode step: it is neither measured nor planned.
        st.step = decode.then(|| StepClock {
            sequences: streams.max(1),
            start: (now, st.snapshot(now)),
            last: None,
        });
        let min_context = st
            .control
            .as_ref()
            .map_or(crate::policy::MIN_CONTEXT, |c| c.min_context());
        // With PILOT beside it (`prefetch_slots`), its slots stay free for its next-layer reads.
        let need = need.min(self.max_wave()) + self.prefetch_slots;
        let rows = if decode { rows } else { 0 };
        st.policy.plan_prefetch(rows, need, min_context);
        self.issue_planned(&mut st)
    }

    /// Feeds the look-ahead controller one measured decode step directly (what
    /// [`Residency::begin_step`] does from the clock and counters), for replaying recorded or
    /// modelled measurements. Returns true when the threshold moved.
    pub fn record_step(&self, m: Measurement) -> bool {
        self.lock().control.as_mut().is_some_and(|c| c.record(m))
    }

    /// Starts the planned prefetches the free working slots allow.
    fn issue_planned(&self, st: &mut State) -> usize {
        let mut events = std::mem::take(&mut st.events);
        let started = st.policy.issue_prefetches(&mut events);
        st.events = events;
        for &(s, key) in &started {
            st.slots[s].status = Status::Loading;
            self.submit(st, s, key, true);
        }
        started.len()
    }

    /// Hands the policy the token id the next step feeds the model for one row, and the stream
    /// (sequence) the row belongs to (used by [`crate::Admission::Predictive`], a no-op
    /// otherwise): call it once per row, in row order, before the step's first
    /// [`Residency::acquire`]. Each stream's rows are learned and predicted as if it ran alone.
    pub fn observe_token(&self, stream: u64, token: u32) {
        self.lock().policy.observe_token(stream, token);
    }

    /// Bytes of the slot slab on transparent huge pages (`None`: not known here).
    pub fn slab_huge_page_bytes(&self) -> Option<u64> {
        self.inner.slab.huge_page_bytes()
    }

    /// Live repin at a safe point between turns (no lease alive; see
    /// [`crate::policy::Policy::repin`]): returns the (promoted, demoted) pairs.
    pub fn repin(&self, max_swaps: usize) -> Vec<(ExpertKey, ExpertKey)> {
        self.lock().policy.repin(max_swaps)
    }

    /// Hands the policy the experts each row of a multi-row step chose at `layer` (see
    /// [`crate::policy::Policy::observe_rows`]).
    pub fn observe_rows(&self, layer: usize, rows: &[Vec<u32>]) {
        self.lock().policy.observe_rows(layer, rows);
    }

    /// The safe point after a wave of every layer (see [`Residency::end_wave_layer`]).
    pub fn end_wave(&self) -> Result<()> {
        for l in 0..self.inner.layouts.len() {
            self.end_wave_layer(l)?;
        }
        Ok(())
    }

    /// The safe point after `layer`'s wave: waits for the layer's loads to settle, then
    /// promotes its misses into its LRU. Fails if a lease on one of the layer's slots is alive.
    /// Other layers' waves (e.g. prefetched requests for the next layer) are not affected.
    pub fn end_wave_layer(&self, layer: usize) -> Result<()> {
        let mine =
            |st: &State, s: usize| st.policy.key(s).is_some_and(|k| k.layer as usize == layer);
        let mut st = self.lock();
        while (0..st.slots.len())
            .any(|s| mine(&st, s) && matches!(st.slots[s].status, Status::Loading))
        {
            st = self.inner.cond.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let alive: u32 = (0..st.slots.len())
            .filter(|&s| mine(&st, s))
            .map(|s| st.slots[s].leases)
            .sum();
        if alive > 0 {
            return Err(Error::LeasesAlive(alive as usize));
        }
        for s in 0..st.slots.len() {
            if mine(&st, s) && matches!(st.slots[s].status, Status::Failed(_)) {
                st.policy.discard(s);
                st.slots[s].status = Status::Empty;
                self.inner.gens[s].fetch_add(1, Ordering::AcqRel);
            }
        }
        let mut events = std::mem::take(&mut st.events);
        st.policy.end_wave_layer(layer, &mut events);
        for s in 0..st.slots.len() {
            if st.policy.key(s).is_none()
                && !matches!(st.slots[s].status, Status::Empty)
                && st.slots[s].leases == 0
            {
                st.slots[s].status = Status::Empty;
                self.inner.gens[s].fetch_add(1, Ordering::AcqRel);
            }
        }
        st.events = events;
        // Working slots came back: the look-ahead reads the next planned layers' experts.
        if self.lookahead {
            self.issue_planned(&mut st);
        }
        let mut events = std::mem::take(&mut st.events);
        for ev in events.drain(..) {
            let layer = |k: ExpertKey| k.layer as usize;
            match ev {
                Event::Hit(k) => st.stats.layers[layer(k)].hits += 1,
                Event::Miss(k) => st.stats.layers[layer(k)].misses += 1,
                Event::Evict { evicted, admitted } => {
                    st.stats.layers[layer(evicted)].evictions += 1;
                    st.evicted += 1;
                    let seq = st.evicted;
                    if st.evictions.len() == EVICTION_HISTORY {
                        st.evictions.pop_front();
                    }
                    st.evictions.push_back(Eviction {
                        seq,
                        evicted,
                        admitted,
                    });
                }
                Event::Bypass(k) => st.stats.layers[layer(k)].bypasses += 1,
                Event::Prefetch(k) => st.stats.layers[layer(k)].prefetched += 1,
                Event::PrefetchHit(k) => {
                    let l = &mut st.stats.layers[layer(k)];
                    l.hits += 1;
                    l.prefetch_hits += 1;
                }
                Event::PrefetchDropped { key, planned } => {
                    st.stats.layers[layer(key)].prefetch_dropped += 1;
                    st.planned_wasted += planned as u64;
                }
            }
        }
        st.events = events;
        if st.step.is_some() {
            let now = Instant::now();
            let snap = st.snapshot(now);
            if let Some(step) = st.step.as_mut() {
                step.last = Some((now, snap));
            }
        }
        Ok(())
    }

    /// Lowers the LRU capacity of every streamed layer to at most `cap` slots (never below one:
    /// a layer needs a slot for its wave's promotion), evicting the coldest experts, and gives
    /// the slots taken out of service back to the OS, so RSS falls now. Call at a safe point.
    /// Returns the number of evicted experts.
    pub fn shrink_all(&self, cap: usize) -> Result<usize> {
        let mut st = self.safe_point()?;
        let mut n = 0;
        let cap = cap.max(1);
        for l in 0..self.inner.layouts.len() {
            let gone = st.policy.shrink(l, cap);
            n += gone.len();
        }
        st.cut = Some(st.cut.map_or(cap, |c| c.min(cap)));
        self.retire(&mut st);
        st.stats.rss_shrinks += 1;
        Ok(n)
    }

    /// The state at a safe point: no lease alive (capacity may change).
    fn safe_point(&self) -> Result<MutexGuard<'_, State>> {
        let st = self.lock();
        match st.slots.iter().position(|s| s.leases > 0) {
            Some(s) => Err(Error::LeasesAlive(s)),
            None => Ok(st),
        }
    }

    /// After capacity fell: slots whose expert was evicted are empty, and slots out of service
    /// give their pages back to the OS.
    fn retire(&self, st: &mut State) {
        for s in 0..st.slots.len() {
            if st.policy.key(s).is_none() && matches!(st.slots[s].status, Status::Ready) {
                st.slots[s].status = Status::Empty;
                self.inner.gens[s].fetch_add(1, Ordering::AcqRel);
            }
            if st.policy.role(s) == Role::Disabled && !st.released[s] {
                st.released[s] = true;
                if let Some(h) = self.inner.hook() {
                    h.releasing(self.inner.slab.slot_ptr(s), self.inner.slab.slot_bytes());
                }
                // A slot never written (its generation moves with every read and eviction) is
                // released too — a transparent huge page of a written neighbour may cover it —
                // but not counted: it held no expert, and a plan set at load releases many.
                if self.inner.slab.release(s) && self.inner.gens[s].load(Ordering::Acquire) > 0 {
                    st.stats.released_bytes += self.inner.slab.slot_bytes() as u64;
                }
            }
        }
    }

    /// Raises the LRU capacity of every streamed layer towards `cap` (never above its planned
    /// capacity) with slots an earlier [`Residency::shrink_all`] took out of service;
    /// their memory comes back as the I/O workers fill them. Call at a safe point. Returns the
    /// number of slots taken back.
    pub fn grow_all(&self, cap: usize) -> usize {
        let mut st = self.lock();
        let most = st.planned.iter().copied().max().unwrap_or(0);
        st.cut = (cap < most).then_some(cap);
        let mut n = 0;
        for l in 0..self.inner.layouts.len() {
            let want = cap.min(st.planned[l]);
            for s in st.policy.grow(l, want) {
                st.released[s] = false;
                n += 1;
            }
        }
        if n > 0 {
            st.stats.rss_regrows += 1;
        }
        n
    }

    /// Sets the plan of the moment: each layer's LRU capacity (`caps[layer]`, between one slot
    /// and the configured capacity; a layer `caps` does not reach keeps its configured one) and
    /// the working slots a wave may use (at most the configured ones) — what the memory plan
    /// gives with the sequences in use now (a server lends an idle sequence's share of the
    /// budget, and between prompts the bank's and the prompt transients' share, to the LRU:
    /// `planner::PlanInputs::lent_to`). A layer above its new capacity evicts its coldest
    /// experts, and a smaller bank disables free slots, giving their pages back to the OS now,
    /// before the memory is needed elsewhere; a layer whose plan grew takes slots back empty,
    /// never past the memory guard's cap (the guard regrows it, up to the plan, once pressure
    /// is gone). Call at a safe point (no lease alive). Returns the number of evicted experts.
    pub fn set_plan(&self, caps: &[usize], working: usize) -> Result<usize> {
        let mut st = self.safe_point()?;
        let mut evicted = 0;
        // Shrink first (LRU, then the bank), so that growth finds the slots they gave up.
        let working = working.clamp(1, self.working_max);
        let wants: Vec<usize> = (self.inner.caps.iter().enumerate())
            .map(|(l, &max)| match max {
                0 => 0,
                _ => caps.get(l).map_or(max, |&c| c.clamp(1, max)),
            })
            .collect();
        // What each layer holds: its plan, within the guard's cap.
        let cut = st.cut.unwrap_or(usize::MAX);
        for (l, &want) in wants.iter().enumerate() {
            if want.min(cut) < st.policy.capacity(l) {
                evicted += st.policy.shrink(l, want.min(cut)).len();
            }
        }
        st.policy.shrink_bank(working + self.prefetch_slots);
        for (l, &want) in wants.iter().enumerate() {
            for s in st.policy.grow(l, want.min(cut)) {
                st.released[s] = false;
            }
            st.planned[l] = want;
        }
        for s in st.policy.grow_bank(working + self.prefetch_slots) {
            st.released[s] = false;
        }
        self.working.store(working, Ordering::Relaxed);
        self.retire(&mut st);
        Ok(evicted)
    }

    /// The largest planned LRU capacity of any layer (what [`Residency::grow_all`] can
    /// restore).
    pub fn configured_capacity(&self) -> usize {
        self.lock().planned.iter().copied().max().unwrap_or(0)
    }

    /// Layers of the model (streamed or not).
    pub fn layers(&self) -> usize {
        self.inner.layouts.len()
    }

    /// Layers with an LRU tier (the guard sizes its steps by them).
    pub fn lru_layers(&self) -> usize {
        self.inner.caps.iter().filter(|&&c| c > 0).count()
    }

    /// Current LRU capacity of a layer.
    pub fn capacity(&self, layer: usize) -> usize {
        self.lock().policy.capacity(layer)
    }

    /// The most LRU slots holding an expert in any layer: what a capacity must go below to
    /// give memory back (empty slots hold no pages).
    pub fn most_filled(&self) -> usize {
        let st = self.lock();
        (0..self.inner.caps.len())
            .map(|l| st.policy.filled(l))
            .max()
            .unwrap_or(0)
    }

    /// Now, and the seconds some read has been in flight since load up to now (one in flight
    /// counted to now; both read under one lock, so the busy time between two calls never
    /// exceeds the time between them): read around a stretch of compute, the disk's busy time
    /// beside it.
    pub fn disk_busy_now(&self) -> (Instant, f64) {
        let st = self.lock();
        let now = Instant::now();
        (now, st.busy(now))
    }

    /// A snapshot of the counters.
    pub fn telemetry(&self) -> Telemetry {
        let st = self.lock();
        let mut t = st.stats.clone();
        // A read or a wait in progress counts up to now, as a controller step's snapshot does.
        let now = st.snapshot(Instant::now());
        t.disk_busy_seconds = now.busy;
        t.wait_seconds = now.wait;
        t.lookahead = st.control.as_ref().map(|c| c.stats());
        let (pinned, lru, working, free, disabled) = st.policy.occupancy();
        t.occupancy = Occupancy {
            pinned,
            lru,
            working,
            free,
            disabled,
        };
        t.lru_capacity = (0..self.inner.caps.len())
            .map(|l| st.policy.capacity(l))
            .sum();
        t.lru_planned = st.planned.iter().sum();
        t
    }

    /// Every expert that is not only on disk, and its tier (pinned, LRU, a working slot, a read
    /// in flight, an unrequested prefetch). One pass over the slots under the lock: cheap enough
    /// to poll (the server's expert map does).
    pub fn placements(&self) -> Vec<Placement> {
        use crate::policy::Role;
        let st = self.lock();
        (0..st.slots.len())
            .filter_map(|s| {
                let key = st.policy.key(s)?;
                let tier = if st.policy.is_prefetch(s) {
                    Tier::Prefetched
                } else if matches!(st.slots[s].status, Status::Loading) {
                    Tier::Loading
                } else {
                    match st.policy.role(s) {
                        Role::Pinned => Tier::Pinned,
                        Role::Lru(_) => Tier::Lru,
                        Role::Working => Tier::Working,
                        Role::Free | Role::Disabled => return None,
                    }
                };
                Some(Placement { key, tier })
            })
            .collect()
    }

    /// The evictions after `seq` that are still remembered (see [`EVICTION_HISTORY`]), oldest
    /// first; pass the last `seq` seen (0 at first).
    pub fn evictions_since(&self, seq: u64) -> Vec<Eviction> {
        let st = self.lock();
        st.evictions
            .iter()
            .filter(|e| e.seq > seq)
            .copied()
            .collect()
    }

    /// Sets shard paths used in read-error messages.
    pub fn set_paths(&self, paths: Vec<std::path::PathBuf>) {
        self.lock().paths = paths;
    }
}

impl Inner {
    fn hook(&self) -> Option<Arc<dyn SlabHook>> {
        self.hook.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Inner {
    /// The slab is freed right after this (no lease holds it: each holds this `Inner`).
    fn drop(&mut self) {
        if let Some(h) = self.hook() {
            h.releasing(self.slab.base_ptr(), self.slab.bytes());
        }
    }
}

impl Drop for Residency {
    fn drop(&mut self) {
        self.jobs.close();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(inner: &Inner, jobs: &Jobs) {
    while let Some((job, demand)) = jobs.pop() {
        let layout = &inner.layouts[job.key.layer as usize][job.key.expert as usize];
        let t0 = Instant::now();
        // SAFETY: the slot is in `Loading` state for generation `job.gen`: the policy handed it to
        // this one job, and `Pending::wait` lets no one read it before the status becomes
        // `Ready`; eviction and reuse happen only at `end_wave`, which first waits for every
        // load to settle. So this job has exclusive access to the slot's bytes.
        let dst = unsafe { inner.slab.slot_mut(job.slot) };
        let mut failure = None;
        for op in &layout.reads {
            if let Err(e) = inner
                .io
                .read(op, &mut dst[op.slot_offset..op.slot_offset + op.len])
            {
                failure = Some(Arc::new((op.file_offset, e)));
                break;
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
        st.stats.in_flight -= 1;
        st.stats.disk_seconds += dt;
        if st.stats.in_flight == 0 {
            if let Some(t) = st.busy_since.take() {
                st.stats.disk_busy_seconds += t.elapsed().as_secs_f64();
            }
        }
        if inner.gens[job.slot].load(Ordering::Acquire) == job.gen {
            match failure {
                None => {
                    st.stats.bytes_read += layout.payload;
                    st.stats.reads += 1;
                    st.slots[job.slot].status = Status::Ready;
                }
                Some(f) => {
                    st.stats.read_errors += 1;
                    st.slots[job.slot].status = Status::Failed(f);
                }
            }
        }
        drop(st);
        jobs.finished(demand);
        inner.cond.notify_all();
    }
}

/// An expert requested in a wave; `wait` turns it into a [`Lease`].
pub struct Pending {
    inner: Arc<Inner>,
    slot: usize,
    gen: u64,
    key: ExpertKey,
    waited: bool,
}

impl Pending {
    /// The expert.
    pub fn key(&self) -> ExpertKey {
        self.key
    }

    /// True when the expert can be used without waiting.
    pub fn is_ready(&self) -> bool {
        let st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        matches!(st.slots[self.slot].status, Status::Ready)
    }

    /// Waits for the expert's bytes; a failed read returns an error naming layer, expert, file
    /// and offset (the slot is discarded at the next safe point).
    pub fn wait(mut self) -> Result<Lease> {
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        let waiting = matches!(st.slots[self.slot].status, Status::Loading);
        if waiting {
            st.begin_wait();
        }
        loop {
            match &st.slots[self.slot].status {
                Status::Ready => break,
                Status::Loading => st = self.inner.cond.wait(st).unwrap_or_else(|p| p.into_inner()),
                Status::Failed(f) => {
                    let f = f.clone();
                    if waiting {
                        st.end_wait();
                    }
                    let path = self
                        .inner
                        .io
                        .path(
                            self.inner.layouts[self.key.layer as usize][self.key.expert as usize]
                                .reads[0]
                                .shard,
                        )
                        .to_path_buf();
                    st.slots[self.slot].leases -= 1;
                    self.waited = true;
                    return Err(Error::Read {
                        layer: self.key.layer,
                        expert: self.key.expert,
                        path,
                        offset: f.0,
                        source: std::io::Error::new(f.1.kind(), f.1.to_string()),
                    });
                }
                Status::Empty => {
                    if waiting {
                        st.end_wait();
                    }
                    st.slots[self.slot].leases -= 1;
                    self.waited = true;
                    return Err(Error::StaleLease {
                        slot: self.slot,
                        lease: self.gen,
                        current: self.inner.gens[self.slot].load(Ordering::Acquire),
                    });
                }
            }
        }
        // The generation may have advanced while loading (this lease's request was a miss that
        // started the load); the lease takes the generation of the bytes it reads.
        let gen = self.inner.gens[self.slot].load(Ordering::Acquire);
        if waiting {
            st.end_wait();
        }
        drop(st);
        self.waited = true;
        Ok(Lease {
            inner: self.inner.clone(),
            slot: self.slot,
            gen,
            key: self.key,
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.waited {
            let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
            st.slots[self.slot].leases -= 1;
        }
    }
}

/// Read access to one resident expert. While it lives the slot is never refilled.
pub struct Lease {
    inner: Arc<Inner>,
    slot: usize,
    gen: u64,
    key: ExpertKey,
}

impl Lease {
    /// The expert.
    pub fn key(&self) -> ExpertKey {
        self.key
    }

    /// The slot index (for tests and telemetry).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The whole slot this expert lives in (its parts and the padding between them), e.g. to
    /// register it with a GPU driver. Read-only, valid while the lease lives.
    pub fn slot_memory(&self) -> Result<&[u8]> {
        let current = self.inner.gens[self.slot].load(Ordering::Acquire);
        if current != self.gen {
            return Err(Error::StaleLease {
                slot: self.slot,
                lease: self.gen,
                current,
            });
        }
        // SAFETY: as in `mats`: the lease keeps the slot from being refilled or reassigned.
        Ok(unsafe { self.inner.slab.slot(self.slot) })
    }

    /// Kernel views of gate, up and down, straight from the slot (no copy).
    pub fn mats(&self) -> Result<[MatRef<'_>; 3]> {
        let current = self.inner.gens[self.slot].load(Ordering::Acquire);
        if current != self.gen {
            return Err(Error::StaleLease {
                slot: self.slot,
                lease: self.gen,
                current,
            });
        }
        // SAFETY: this lease keeps the slot's lease count above zero, so no I/O job is given the
        // slot and no safe point reassigns it until the lease drops; the generation check above
        // proves the bytes are the ones this lease was granted.
        let bytes = unsafe { self.inner.slab.slot(self.slot) };
        Ok(self.inner.layouts[self.key.layer as usize][self.key.expert as usize].mats(bytes))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        st.slots[self.slot].leases -= 1;
    }
}
