//! Replays a recorded routing trace through the real slot policy ([`Policy`], the code the
//! residency manager runs) and through Belady-OPT with bypass, under one step model, so that
//! `nectar bench policy` reports a hit rate and the best any policy could do side by side.
//!
//! Step model (the same as `tests/fixtures/traces/replay.py`-style replays in the project):
//! each segment's prompt rows are replayed one per step without being counted (prefill warms
//! the cache, its hits are not decode hits); then its decode rows, `window` rows per step (1 =
//! plain decoding; w > 1 = a verify of w tokens in one forward). A step requests, per layer, the
//! unique experts of its rows; hits are the requests found resident at the start of the step.
//! The cache starts empty at the first segment, and again at every segment when the trace says
//! so (conversations). Every layer has `capacity` LRU slots; a wave's misses sit in working
//! slots until the layer's safe point, where the policy decides what stays.
use crate::policy::{Admission, Event, ExpertKey, LookaheadStats, Policy};
use crate::trace::Trace;

/// One step: the rows it processes, whether its hits count, whether the cache resets first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Trace rows of the step.
    pub rows: std::ops::Range<usize>,
    /// Decode step (counted), not a prompt row.
    pub counted: bool,
    /// The cache is emptied before this step.
    pub reset: bool,
    /// The first step of a segment (a new turn: a safe point for live repin).
    pub turn: bool,
}

/// The steps of a trace (see the module docs).
pub fn steps(trace: &Trace, window: usize) -> Vec<Step> {
    let w = window.max(1);
    let mut out = Vec::new();
    for (si, s) in trace.segments.iter().enumerate() {
        let mut first = si == 0 || trace.reset_per_segment;
        let mut turn = true;
        let decode = s.start + s.warmup;
        let mut push = |rows: std::ops::Range<usize>, counted: bool| {
            out.push(Step {
                rows,
                counted,
                reset: std::mem::take(&mut first),
                turn: std::mem::take(&mut turn),
            })
        };
        for r in s.start..decode {
            push(r..r + 1, false);
        }
        let mut b = decode;
        while b < s.end {
            let e = (b + w).min(s.end);
            push(b..e, true);
            b = e;
        }
    }
    out
}

/// Per step, the unique experts `layer` requests (row order, then selection order).
pub fn layer_requests(trace: &Trace, steps: &[Step], layer: usize) -> Vec<Vec<u32>> {
    steps
        .iter()
        .map(|s| {
            let mut u: Vec<u32> = Vec::new();
            for r in s.rows.clone() {
                for e in trace.experts(r, layer) {
                    if !u.contains(&e) {
                        u.push(e);
                    }
                }
            }
            u
        })
        .collect()
}

/// Hits and requests over the counted steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    /// Requests found resident.
    pub hits: u64,
    /// Requests (unique experts per step and layer).
    pub requests: u64,
}

impl Count {
    /// hits ÷ requests (0 when nothing was requested).
    pub fn rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }

    /// Adds another count (of another layer or run).
    pub fn add(&mut self, o: Count) {
        self.hits += o.hits;
        self.requests += o.requests;
    }
}

/// How the replayed cache is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSetup {
    /// LRU slots per layer.
    pub capacity: usize,
    /// Per replayed layer, LRU slots beyond `capacity` (a memory plan's last partial row puts
    /// one more on some layers; missing entries are 0).
    pub extra: Vec<usize>,
    /// What a full layer keeps.
    pub admission: Admission,
    /// Pinned experts per replayed layer (index = position in the replayed layers).
    pub pinned: Vec<Vec<u32>>,
    /// Live repin at every turn (segment start): at most this many swaps (0: pins stay).
    pub repin_swaps: usize,
    /// Per replayed layer, LRU slots while prompt (uncounted) steps run, where fewer than
    /// [`CacheSetup::lru_of`]: a server's plan takes back for a prompt what it lends between
    /// prompts (the coldest experts leave when a prompt starts, the slots come back empty after
    /// it). `None`: the same slots throughout.
    pub prompt_lru: Option<Vec<usize>>,
}

impl CacheSetup {
    /// `capacity` LRU slots, `admission`, nothing pinned.
    pub fn lru_only(capacity: usize, admission: Admission) -> Self {
        CacheSetup {
            capacity,
            extra: Vec::new(),
            prompt_lru: None,
            admission,
            pinned: Vec::new(),
            repin_swaps: 0,
        }
    }

    /// LRU slots of the replayed layer `li`.
    pub fn lru_of(&self, li: usize) -> usize {
        self.capacity + self.extra.get(li).copied().unwrap_or(0)
    }

    /// Slots of the replayed layer `li` in all (its LRU + the most any layer pins): Belady's
    /// capacity there.
    pub fn slots(&self, li: usize) -> usize {
        self.lru_of(li) + self.pinned.iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// The `n` most requested experts of each of `layers` over every row of `trace` (a usage
/// ledger's pin set, learned on that trace).
pub fn hottest(trace: &Trace, layers: &[usize], n: usize) -> Vec<Vec<u32>> {
    layers
        .iter()
        .map(|&l| {
            let mut count = vec![0u64; trace.experts_per_layer];
            for r in 0..trace.rows {
                for e in trace.experts(r, l) {
                    count[e as usize] += 1;
                }
            }
            let mut ids: Vec<u32> = (0..count.len() as u32).collect();
            ids.sort_by_key(|&e| (std::cmp::Reverse(count[e as usize]), e));
            ids.truncate(n);
            ids
        })
        .collect()
}

/// Replays `layers` (trace layer indices) of `trace` through the real [`Policy`] with
/// `capacity` LRU slots per layer and `admission`. Returns the count per layer.
pub fn replay_policy(
    trace: &Trace,
    steps: &[Step],
    layers: &[usize],
    capacity: usize,
    admission: Admission,
) -> Vec<Count> {
    replay_setup(
        trace,
        steps,
        layers,
        &CacheSetup::lru_only(capacity, admission),
    )
}

/// [`replay_policy`] with pins and live repin.
pub fn replay_setup(
    trace: &Trace,
    steps: &[Step],
    layers: &[usize],
    setup: &CacheSetup,
) -> Vec<Count> {
    replay(trace, steps, layers, setup, None).0
}

/// How look-ahead prefetch is replayed: working slots beyond a step's need (`slack`; the
/// residency's bank of `2 × top-k` leaves `top-k` for a one-row step) and the shortest token
/// context used (see [`crate::policy::MIN_CONTEXT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchSetup {
    /// Working slots beyond the step's need, for prefetches in flight.
    pub slack: usize,
    /// Shortest context whose earlier routes are prefetched.
    pub min_context: usize,
}

/// [`replay_setup`] with look-ahead prefetch, as the residency manager drives it: after a
/// step's tokens are observed the policy plans the step's predicted misses and starts those
/// the free working slots allow beyond the step's need (`rows × top-k`), and tops up after each
/// layer's safe point. Returns the policy's counts (prefetch hits are not hits: their read was
/// only started earlier) and what the prefetch did over the counted steps.
pub fn replay_prefetch(
    trace: &Trace,
    steps: &[Step],
    layers: &[usize],
    setup: &CacheSetup,
    prefetch: PrefetchSetup,
) -> (Vec<Count>, LookaheadStats) {
    replay(trace, steps, layers, setup, Some(prefetch))
}

/// The replay of [`replay_setup`] (`prefetch` `None`) and [`replay_prefetch`].
fn replay(
    trace: &Trace,
    steps: &[Step],
    layers: &[usize],
    setup: &CacheSetup,
    prefetch: Option<PrefetchSetup>,
) -> (Vec<Count>, LookaheadStats) {
    let admission = setup.admission;
    let reqs: Vec<Vec<Vec<u32>>> = layers
        .iter()
        .map(|&l| layer_requests(trace, steps, l))
        .collect();
    let need_max = reqs
        .iter()
        .flat_map(|r| r.iter().map(Vec::len))
        .max()
        .unwrap_or(0)
        .max(1);
    let working = need_max + prefetch.map_or(0, |p| p.slack);
    let pins: Vec<ExpertKey> = setup
        .pinned
        .iter()
        .enumerate()
        .flat_map(|(li, v)| v.iter().map(move |&e| ExpertKey::new(li, e as usize)))
        .collect();
    let caps: Vec<usize> = (0..layers.len()).map(|li| setup.lru_of(li)).collect();
    let fresh = || Policy::new(caps.clone(), working, &pins).with_admission(admission);
    let mut policy = fresh();
    let mut counts = vec![Count::default(); layers.len()];
    let mut stats = LookaheadStats::default();
    let mut events = Vec::new();
    let tally = |events: &mut Vec<Event>, stats: &mut LookaheadStats, counted: bool| {
        for ev in events.drain(..) {
            if !counted {
                continue;
            }
            match ev {
                Event::Miss(_) => stats.misses += 1,
                Event::PrefetchHit(_) => stats.used += 1,
                Event::Prefetch(_) => stats.issued += 1,
                Event::PrefetchDropped { .. } => stats.wasted += 1,
                _ => {}
            }
        }
    };
    for (t, s) in steps.iter().enumerate() {
        if s.reset {
            policy = fresh();
        } else if s.turn && setup.repin_swaps > 0 {
            policy.repin(setup.repin_swaps);
        }
        if let Some(prompt) = &setup.prompt_lru {
            for (li, &c) in caps.iter().enumerate() {
                match s.counted {
                    false => drop(policy.shrink(li, prompt.get(li).map_or(c, |&p| p.min(c)))),
                    true => drop(policy.grow(li, c)),
                }
            }
        }
        if let Some(tok) = &trace.tokens {
            for r in s.rows.clone() {
                policy.observe_token(u64::from(trace.stream(r)), u32::from(tok[r]));
            }
        }
        if let Some(p) = prefetch {
            let reserve = (s.rows.len() * trace.top_k).min(need_max);
            policy.plan_prefetch(s.rows.len(), reserve, p.min_context);
            policy.issue_prefetches(&mut events);
            tally(&mut events, &mut stats, s.counted);
        }
        for (li, r) in reqs.iter().enumerate() {
            if s.rows.len() > 1 {
                let rows: Vec<Vec<u32>> = s
                    .rows
                    .clone()
                    .map(|row| trace.experts(row, layers[li]).collect())
                    .collect();
                policy.observe_rows(li, &rows);
            }
            for &e in &r[t] {
                policy
                    .access(ExpertKey::new(li, e as usize), &mut events)
                    .expect("the working bank holds a wave's unique experts");
                let hit = matches!(events.last(), Some(Event::Hit(_)));
                if s.counted {
                    counts[li].requests += 1;
                    counts[li].hits += hit as u64;
                }
            }
            policy.end_wave_layer(li, &mut events);
            if prefetch.is_some() {
                policy.issue_prefetches(&mut events);
            }
            tally(&mut events, &mut stats, s.counted);
        }
    }
    (counts, stats)
}

/// Belady-OPT with bypass per layer under the same step model: after each step the cache keeps
/// the `capacity` experts of (residents ∪ this step's) whose next request is nearest. A next
/// request in an uncounted (prompt) step or after a reset counts as never: that step reloads
/// the expert for free, so keeping it earns nothing. The optimum for this step model (tested
/// against exhaustive search).
pub fn belady(requests: &[Vec<u32>], steps: &[Step], capacity: usize) -> Count {
    const NEVER: usize = usize::MAX;
    let n = requests.len();
    // next[t][i]: the step of the next counted request of requests[t][i].
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut upcoming: std::collections::HashMap<u32, usize> = Default::default();
    for t in (0..n).rev() {
        next[t] = requests[t]
            .iter()
            .map(|e| upcoming.get(e).copied().unwrap_or(NEVER))
            .collect();
        for &e in &requests[t] {
            upcoming.insert(e, if steps[t].counted { t } else { NEVER });
        }
        if steps[t].reset {
            upcoming.clear();
        }
    }
    let mut cache: Vec<(u32, usize)> = Vec::new();
    let mut c = Count::default();
    for t in 0..n {
        if steps[t].reset {
            cache.clear();
        }
        for (i, &e) in requests[t].iter().enumerate() {
            match cache.iter_mut().find(|x| x.0 == e) {
                Some(x) => {
                    c.hits += steps[t].counted as u64;
                    x.1 = next[t][i];
                }
                None => cache.push((e, next[t][i])),
            }
            c.requests += steps[t].counted as u64;
        }
        cache.sort_by_key(|&(e, nu)| (nu, e));
        cache.truncate(capacity);
    }
    c
}

/// One replay's result over the chosen layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyReplay {
    /// The policy's counts.
    pub policy: Count,
    /// Belady-OPT with bypass at the same capacity.
    pub belady: Count,
}

impl PolicyReplay {
    /// The policy's hit rate over Belady's.
    pub fn ratio(&self) -> f64 {
        let b = self.belady.rate();
        if b == 0.0 {
            0.0
        } else {
            self.policy.rate() / b
        }
    }
}

/// Replays `layers` of `trace` through the real policy and Belady, summed over the layers.
pub fn compare(
    trace: &Trace,
    window: usize,
    layers: &[usize],
    capacity: usize,
    admission: Admission,
) -> PolicyReplay {
    compare_setup(
        trace,
        window,
        layers,
        &CacheSetup::lru_only(capacity, admission),
    )
}

/// [`compare`] with pins and live repin; Belady gets every slot (LRU + pinned) to use freely.
pub fn compare_setup(
    trace: &Trace,
    window: usize,
    layers: &[usize],
    setup: &CacheSetup,
) -> PolicyReplay {
    let st = steps(trace, window);
    let mut out = PolicyReplay {
        policy: Count::default(),
        belady: Count::default(),
    };
    for c in replay_setup(trace, &st, layers, setup) {
        out.policy.add(c);
    }
    for (li, &l) in layers.iter().enumerate() {
        out.belady
            .add(belady(&layer_requests(trace, &st, l), &st, setup.slots(li)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Rng;
    use crate::trace::Segment;

    /// A one-layer trace from per-row expert lists (k = the longest row).
    fn trace(rows: &[Vec<i32>], segments: Vec<Segment>, reset: bool) -> Trace {
        let k = rows.iter().map(Vec::len).max().unwrap_or(1);
        let ids = rows
            .iter()
            .flat_map(|r| (0..k).map(move |i| r.get(i).copied().unwrap_or(-1)))
            .collect();
        Trace {
            kind: "test".into(),
            path: "test".into(),
            layers: vec![1],
            experts_per_layer: 64,
            top_k: k,
            rows: rows.len(),
            ids,
            tokens: None,
            streams: None,
            segments,
            reset_per_segment: reset,
            num_hidden_layers: None,
        }
    }

    fn random_case(rng: &mut Rng) -> (Trace, usize) {
        let experts = 2 + (rng.next_u64() % 4) as usize;
        let k = 1 + (rng.next_u64() % 2) as usize;
        let n = 3 + (rng.next_u64() % 8) as usize;
        let rows: Vec<Vec<i32>> = (0..n)
            .map(|_| {
                (0..k)
                    .map(|_| (rng.next_u64() % experts as u64) as i32)
                    .collect()
            })
            .collect();
        let cut = 1 + (rng.next_u64() % n as u64) as usize; // 1..=n
        let mut seg = |start: usize, end: usize| Segment {
            start,
            end,
            warmup: ((rng.next_u64() % 3) as usize).min(end - start),
            domain: String::new(),
        };
        let mut segs = vec![seg(0, cut)];
        if cut < n {
            segs.push(seg(cut, n));
        }
        let cap = (rng.next_u64() % 4) as usize;
        (trace(&rows, segs, rng.next_u64().is_multiple_of(2)), cap)
    }

    /// The best hit count any cache of `cap` slots can get: exhaustive search over which
    /// subset of (residents ∪ requested) it keeps after each step.
    fn brute_force(requests: &[Vec<u32>], steps: &[Step], cap: usize) -> u64 {
        use std::collections::HashMap;
        let mut best: HashMap<u64, u64> = HashMap::from([(0, 0)]);
        for (t, u) in requests.iter().enumerate() {
            if steps[t].reset {
                let top = best.values().copied().max().unwrap();
                best = HashMap::from([(0, top)]);
            }
            let umask: u64 = u.iter().fold(0, |m, &e| m | 1 << e);
            let mut nextb: HashMap<u64, u64> = HashMap::new();
            for (&cache, &h) in &best {
                let h = h + if steps[t].counted {
                    (cache & umask).count_ones() as u64
                } else {
                    0
                };
                let avail = cache | umask;
                // Every subset of `avail` of at most `cap` experts.
                let mut sub = avail;
                loop {
                    if sub.count_ones() as usize <= cap {
                        let v = nextb.entry(sub).or_insert(0);
                        *v = (*v).max(h);
                    }
                    if sub == 0 {
                        break;
                    }
                    sub = (sub - 1) & avail;
                }
            }
            best = nextb;
        }
        best.values().copied().max().unwrap_or(0)
    }

    #[test]
    fn belady_is_optimal_on_small_traces() {
        let mut rng = Rng::new(7);
        for _ in 0..400 {
            let (t, cap) = random_case(&mut rng);
            let st = steps(&t, 1 + (rng.next_u64() % 2) as usize);
            let req = layer_requests(&t, &st, 0);
            let b = belady(&req, &st, cap);
            assert_eq!(
                b.hits,
                brute_force(&req, &st, cap),
                "{req:?} {st:?} cap {cap}"
            );
            let total: usize = req
                .iter()
                .zip(&st)
                .filter(|x| x.1.counted)
                .map(|x| x.0.len())
                .sum();
            assert_eq!(b.requests, total as u64);
        }
    }

    /// The policy's LRU rules written out plainly: residents with their last use; a step's
    /// misses enter last-first while there is an empty position or an untouched resident,
    /// evicting the least recently used untouched one; the rest bypass.
    fn reference_lru(requests: &[Vec<u32>], steps: &[Step], cap: usize) -> Count {
        let mut cache: Vec<(u32, u64)> = Vec::new();
        let mut clock = 0;
        let mut c = Count::default();
        for (t, u) in requests.iter().enumerate() {
            if steps[t].reset {
                cache.clear();
            }
            let mut misses = Vec::new();
            let mut touched = Vec::new();
            for &e in u {
                clock += 1;
                c.requests += steps[t].counted as u64;
                match cache.iter_mut().find(|x| x.0 == e) {
                    Some(x) => {
                        x.1 = clock;
                        touched.push(e);
                        c.hits += steps[t].counted as u64;
                    }
                    None => misses.push((e, clock)),
                }
            }
            for &(e, at) in misses.iter().rev().take(cap) {
                if cache.len() < cap {
                    cache.push((e, at));
                } else if let Some(v) = cache
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| !touched.contains(&x.0))
                    .min_by_key(|(_, x)| x.1)
                    .map(|(i, _)| i)
                {
                    cache[v] = (e, at);
                }
                touched.push(e);
            }
        }
        c
    }

    #[test]
    fn policy_replay_matches_reference_lru() {
        let mut rng = Rng::new(11);
        for _ in 0..400 {
            let (t, cap) = random_case(&mut rng);
            let st = steps(&t, 1 + (rng.next_u64() % 3) as usize);
            let req = layer_requests(&t, &st, 0);
            let got = replay_policy(&t, &st, &[0], cap, Admission::Lru)[0];
            assert_eq!(
                got,
                reference_lru(&req, &st, cap),
                "{req:?} {st:?} cap {cap}"
            );
            assert!(got.hits <= belady(&req, &st, cap).hits);
        }
    }

    #[test]
    fn steps_follow_segments() {
        let rows: Vec<Vec<i32>> = (0..7).map(|i| vec![i]).collect();
        let seg = |start, end, warmup| Segment {
            start,
            end,
            warmup,
            domain: String::new(),
        };
        let t = trace(&rows, vec![seg(0, 4, 1), seg(4, 7, 2)], true);
        let st = steps(&t, 2);
        let got: Vec<_> = st
            .iter()
            .map(|s| (s.rows.clone(), s.counted, s.reset))
            .collect();
        assert_eq!(
            got,
            [
                (0..1, false, true),
                (1..3, true, false),
                (3..4, true, false),
                (4..5, false, true),
                (5..6, false, false),
                (6..7, true, false)
            ]
        );
        let t = trace(&rows, vec![seg(0, 4, 1), seg(4, 7, 2)], false);
        assert_eq!(steps(&t, 1).iter().filter(|s| s.reset).count(), 1);
    }

    #[test]
    fn route256_replay_is_deterministic_and_bounded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/traces/route256");
        let t = Trace::load(&dir, "decode").unwrap();
        let layers = t.main_layers(t.hidden_layers());
        let a = compare(&t, 1, &layers, 12, Admission::Lru);
        assert_eq!(a, compare(&t, 1, &layers, 12, Admission::Lru));
        // 24 conversations × 256 decoded tokens × 7 layers × 8 experts.
        assert_eq!(a.policy.requests, 24 * 256 * 7 * 8);
        assert_eq!(a.belady.requests, a.policy.requests);
        assert!(a.policy.hits < a.belady.hits && a.ratio() > 0.3, "{a:?}");
    }

    /// route256's decode trace, its main layers and its one-row steps.
    fn route256_decode() -> (Trace, Vec<usize>, Vec<Step>) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/traces/route256");
        let t = Trace::load(&dir, "decode").unwrap();
        let layers = t.main_layers(t.hidden_layers());
        let st = steps(&t, 1);
        (t, layers, st)
    }

    /// A layer given one slot more (a plan's last partial row) replays as that layer alone at
    /// the larger capacity, the others as they were: the layers' caches do not share slots.
    #[test]
    fn extra_slots_replay_per_layer() {
        let (t, layers, st) = route256_decode();
        let adm = Admission::PREDICTIVE;
        let mut mixed = CacheSetup::lru_only(12, adm);
        mixed.extra = (0..layers.len()).map(|i| i % 2).collect();
        let got = replay_setup(&t, &st, &layers, &mixed);
        for (i, &l) in layers.iter().enumerate() {
            let alone = replay_policy(&t, &st, &[l], 12 + i % 2, adm);
            assert_eq!(got[i], alone[0], "layer {l}");
        }
        // One slot more hits more, and Belady's capacity follows the layer's.
        assert!(got[1].hits > replay_policy(&t, &st, &[layers[1]], 12, adm)[0].hits);
        assert_eq!((mixed.slots(0), mixed.slots(1)), (12, 13));
    }

    #[test]
    fn prefetch_keeps_the_hit_rate_and_reads_ahead_on_route256() {
        let (t, layers, st) = route256_decode();
        let setup = CacheSetup::lru_only(12, Admission::PREDICTIVE);
        let p = PrefetchSetup {
            slack: t.top_k,
            min_context: crate::policy::MIN_CONTEXT,
        };
        let (with, s) = replay_prefetch(&t, &st, &layers, &setup, p);
        assert_eq!(with, replay_setup(&t, &st, &layers, &setup));
        assert_eq!(s.issued, s.used + s.wasted);
        // Greedy decode repeats itself: half the misses are read ahead, 0.94 of reads used.
        assert!(s.coverage() > 0.45 && s.precision() > 0.9, "{s:?}");
    }

    /// Look-ahead prefetch on route256 by shortest context used (run with `--ignored
    /// --nocapture`): the research behind [`crate::policy::MIN_CONTEXT`]. `NECTAR_TRACE_DIR`
    /// replays every kind of another trace directory instead (e.g. `trace_interleave.py`'s),
    /// `NECTAR_WINDOW` rows per decode step (default 1).
    #[test]
    #[ignore]
    fn prefetch_research() {
        let dir = match std::env::var_os("NECTAR_TRACE_DIR") {
            Some(d) => std::path::PathBuf::from(d),
            None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures/traces/route256"),
        };
        let window = std::env::var("NECTAR_WINDOW").map_or(1, |w| w.parse().unwrap());
        for kind in Trace::kinds(&dir).unwrap() {
            let t = Trace::load(&dir, &kind).unwrap();
            let layers = t.main_layers(t.hidden_layers());
            let st = steps(&t, window);
            for cap in [12, 32] {
                let setup = CacheSetup::lru_only(cap, Admission::PREDICTIVE);
                for slack in [8, 1000] {
                    for min_context in [1, 2, 4, 8, 16, 32] {
                        let p = PrefetchSetup { slack, min_context };
                        let (c, s) = replay_prefetch(&t, &st, &layers, &setup, p);
                        let hits: u64 = c.iter().map(|c| c.hits).sum();
                        let req: u64 = c.iter().map(|c| c.requests).sum();
                        println!(
                            "{kind:>15} cap {cap:>2} slack {slack:>4} n>={min_context:>2}: hit {:.3} coverage {:.3} precision {:.3} issued {} used {} wasted {} misses {}",
                            hits as f64 / req as f64,
                            s.coverage(),
                            s.precision(),
                            s.issued,
                            s.used,
                            s.wasted,
                            s.misses
                        );
                    }
                }
            }
        }
    }
}
