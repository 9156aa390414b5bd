//! `auto`: choosing the draft depth γ of a batch step from what this machine measures.
//!
//! Speculation pays only when the tokens a step yields outweigh what it costs: verifying
//! γ + 1 rows costs more than decoding one (under a memory budget much more, because each
//! draft position routes its own experts and the step's union per layer grows — `lessons.md`
//! #19), and every draft costs a draft forward. In a batch those costs are shared: one row's
//! drafts widen the union every other row waits for. So the objective is the **step's** tokens
//! per second over all its rows, and one controller per batch decides one γ for every `auto`
//! row of a step (each row caps it at its own maximum and at the tokens it may still emit).
//!
//! A step's cost depends on how many rows share it, so the controller keeps one arm per step
//! [`Shape`] (rows in the forward, `auto` rows among them): per γ the measured time of a step
//! of that shape (drafting and verification; MTP absorption apart), and the tokens per step of
//! the rows `auto` does not drive. Acceptance is pooled over every `auto` row (it is a
//! property of the text and the drafter, not of the shape): per draft depth j the measured
//! α_j, the chance the j-th draft asked for is there and accepted given the ones before it
//! were. At the end of every window of [`WINDOW`] steps of a shape (the first is
//! [`FIRST_WINDOW`]) the arm picks the γ in 0..=γ_max that maximises
//!
//! ```text
//! tokens/s(γ) = (others + a · E(γ)) / (cost(γ) + absorb_per_row · (a · E(γ) + resume)),
//! E(γ) = 1 + Σ_{j≤γ} Π_{i≤j} α_i,   a = the shape's auto rows
//! ```
//!
//! (for one row alone: E(γ) / (cost(γ) + absorb · E(γ)), a round's own tokens per second).
//! `resume` is the backlog, counted for γ > 0 only: before a row drafts, the MTP layer absorbs
//! the rows it kept while it did not draft (its prompt, its plain steps, in this shape or in
//! another), at most the last [`super::mtp::ABSORB_WINDOW`] (its MTP cache skips older ones). While the shape drafts, it is the backlog rows its drafting steps absorbed, per
//! step, as measured: a shape whose steps come in short stretches between stretches of a
//! shape at γ = 0 (on the demo at `--parallel 4`: three rows while a request finishes or
//! joins, between long stretches of four rows at γ = 0) starts every stretch by absorbing
//! what its rows kept there, and charged only its own kept rows it drafted at a loss. While
//! the shape is at γ = 0 it is the larger of that (as last measured while it drafted) and
//! the backlog its probes absorbed spread over a window (resuming once); what a shape
//! measured while drafting is forgotten when a busier shape (more steps recorded) turns
//! drafting on or off (where its rows come from changed).
//! Drafting must beat plain decoding by more than the noise of one probe, to turn on and to
//! stay on (plain decoding is what `off` does, the safe side of a close call), and a deeper γ
//! than the one in force must beat it by more than that again: the noise is the spread of
//! the window's steps at the γ in force (their median absolute deviation, scaled to a
//! standard deviation, as a share of their median; zero for fed, noiseless costs).
//! A fresh controller decodes plainly (γ = 0, as `off` does) until its first probes, and a
//! new shape starts from the nearest shape's choice. Acceptance counts one draft more per
//! depth, rejected, so a first decision on one probe per depth does not draft on one lucky
//! draft.
//! A window ends with one probe step at every other γ, so every cost stays measured (γ = 0
//! re-probes drafting this way, which is how drafting turns back on when it starts to pay),
//! warm, just before the decision; a window without probes keeps its choice (only the γ in
//! force was measured afresh, and on a shared machine whose load moves, comparing it against
//! older probes flipped the choice). Probes cost steps off the optimum, so while the decision
//! holds they back off to every 2nd, then every 4th window, and further (up to every 32nd)
//! while a probe window costs more than [`PROBE_BUDGET`] of the time between probes (its
//! steps' time beyond what their tokens are worth, and the backlog a probe from γ = 0
//! absorbs) or while every other γ is expected [`FAR`] below the choice (a verdict that wide
//! is not what the next probe overturns); a change re-probes every window.
//! Ties go to the smaller γ. A window's samples of a γ weigh n / (n + 1) against the older
//! estimate (one probe moves it half way), or replace it when they are more than 1.5× off (the
//! costs changed); a window counts by its median step (descheduled steps only look slower).
//! Acceptance counts decay by half per decision down to [`MIN_EVIDENCE`] drafts per depth, so
//! the choice follows the text as it changes without resting on a few probes' luck. A shape that has not decided yet follows the choice of
//! the nearest shape that has.

use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// Steps per decision.
pub const WINDOW: usize = 16;
/// Steps of a new shape before its first decision.
pub const FIRST_WINDOW: usize = 8;
/// Probe at least this often while the decision holds (windows apart)...
const MAX_PROBE_EVERY: usize = 4;
/// ...unless a probe window costs more than [`PROBE_BUDGET`] of the time between probes; then
/// probes back off further, up to this.
const MAX_BUDGET_PROBE_EVERY: usize = 32;
/// The share of a shape's time its probes may cost: the probes' time beyond what their
/// tokens are worth at the chosen γ's rate, plus the rows a probe from γ = 0 absorbs first.
/// It is what `auto` gives up against `off` where drafting never pays: at 5 % a server at one
/// row on the demo ran at 0.95 of `off` (probe windows cost a quarter of a window, every 8th).
const PROBE_BUDGET: f64 = 0.02;
/// A choice every other γ is expected to fall this far below (as a share of the choice's
/// tokens per second) is far from flipping: its probes back off as far as
/// [`MAX_BUDGET_PROBE_EVERY`] whatever they cost. On the demo at `--parallel 8` drafting
/// ran at 0.6–0.7 of plain decoding's rate window after window, and probes every 16th window
/// still cost 3 % of the time for a verdict that never changed.
const FAR: f64 = 0.2;
/// Weight of a new sample in the running mean of MTP absorption and of the other rows' tokens.
const EMA: f64 = 0.3;
/// A window's mean cost this many times off the estimate replaces it instead of moving it.
/// With probes as rare as [`PROBE_BUDGET`] makes them, a change below 2× (drafts going from
/// 2 to 1.1 ms) moved half way per probe took more probes than a long-lived server gets.
const REGIME: f64 = 1.5;
/// Per-decision decay of the acceptance counts.
const DECAY: f64 = 0.5;
/// Drafts at a depth that its acceptance keeps through decay: while drafting is off only
/// probes measure it (a few drafts per window), and halving per decision left an estimate of
/// one or two drafts, whose luck flipped the choice to drafting for a whole window.
const MIN_EVIDENCE: f64 = 32.0;
/// Decisions kept in the log (older ones drop off; a server runs for ever).
const LOG: usize = 256;

/// What a step looks like to `auto`: its cost depends on how many rows share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Shape {
    /// Rows in the main forward.
    pub rows: usize,
    /// Of those, decode rows whose depth `auto` chooses.
    pub auto_rows: usize,
}

impl Shape {
    /// A row decoding alone.
    pub const ALONE: Shape = Shape {
        rows: 1,
        auto_rows: 1,
    };
}

/// One decision of the `auto` controller.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoDecision {
    /// Steps recorded (decode steps with an `auto` row, no prompt chunk) when it was taken.
    pub round: usize,
    /// Tokens those steps had produced, over all rows, when it was taken.
    pub tokens: usize,
    /// Rows in the steps it is for.
    pub rows: usize,
    /// Of those, rows whose depth `auto` chooses.
    pub auto_rows: usize,
    /// The depth chosen (0 = plain decoding).
    pub gamma: usize,
    /// Consecutive windows this decision held (a repeated decision updates the entry instead
    /// of adding one).
    pub windows: usize,
    /// Expected tokens per second of the whole step for each γ = 0..=γ_max (`None`: not
    /// measured yet).
    pub expected_tok_s: Vec<Option<f64>>,
    /// Measured milliseconds per step for each γ, absorption excluded.
    pub round_ms: Vec<Option<f64>>,
    /// Measured acceptance at each draft depth 1..=γ_max (pooled over the `auto` rows).
    pub acceptance_by_depth: Vec<f64>,
    /// The decision in words.
    pub reason: String,
}

/// One `auto` row's part of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRound {
    /// Drafts asked for (the step's γ capped by the row).
    pub asked: usize,
    /// Drafts accepted.
    pub accepted: usize,
}

/// One step as the controller sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSample<'a> {
    /// The step's shape.
    pub shape: Shape,
    /// The γ the controller gave the step.
    pub gamma: usize,
    /// Every `auto` row's part.
    pub rows: &'a [RowRound],
    /// Tokens the other rows produced.
    pub others: usize,
    /// The step's time, drafting included, MTP absorption excluded.
    pub secs: f64,
    /// Kept rows the MTP drafter absorbed this step.
    pub absorbed: usize,
    /// Of those, rows that built up while their row did not draft (its prompt, and the rows
    /// of its steps at γ = 0): what resuming drafting absorbs on top of a drafting step.
    pub backlog: usize,
    /// Seconds that absorption took.
    pub absorb_secs: f64,
}

/// A shape's measurements and schedule.
#[derive(Debug, Clone)]
struct Arm {
    current: usize,
    /// Steps into the current window, and its length.
    round: usize,
    window: usize,
    /// Windows decided so far; probes run when `windows % probe_every == 0`.
    windows: usize,
    probe_every: usize,
    /// Seconds per step at each γ, absorption excluded, as of the last decision.
    cost: Vec<Option<f64>>,
    /// This window's samples per γ (seconds per step).
    window_cost: Vec<Vec<f64>>,
    /// Tokens per step of the rows `auto` does not drive.
    others: Option<f64>,
    /// Rows a step that resumed drafting after γ = 0 absorbed on top of a drafting step's.
    backlog: Option<f64>,
    /// Backlog rows per step while the shape drafts: what its drafting steps absorb on top of
    /// their own kept rows, because their rows were kept at γ = 0 in other shapes (or joined
    /// with a prompt) since they last drafted.
    drafting_backlog: Option<f64>,
    /// This window's steps at γ > 0 while the shape drafts, and the backlog rows they absorbed.
    window_backlog: (usize, usize),
    /// Steps recorded.
    steps: usize,
}

impl Arm {
    fn new(max: usize, current: usize) -> Arm {
        Arm {
            current,
            round: 0,
            window: FIRST_WINDOW,
            windows: 0,
            probe_every: 1,
            cost: vec![None; max + 1],
            window_cost: vec![Vec::new(); max + 1],
            others: None,
            backlog: None,
            drafting_backlog: None,
            window_backlog: (0, 0),
            steps: 0,
        }
    }

    /// γ for the next step: the choice, then the window's probes (when this window probes).
    fn next(&self, max: usize) -> usize {
        let probes = max; // every γ in 0..=max but the current one
        let first_probe = self.window.saturating_sub(probes);
        if !self.windows.is_multiple_of(self.probe_every) || self.round < first_probe {
            return self.current;
        }
        (0..=max)
            .filter(|&g| g != self.current)
            .nth(self.round - first_probe)
            .unwrap_or(self.current)
    }
}

/// The γ controller of `auto` mode, one per batch (see the module docs).
#[derive(Debug, Clone)]
pub struct AutoGamma {
    max: usize,
    /// Per depth j (index j − 1): drafts asked for and accepted (decayed), over every row.
    tried: Vec<f64>,
    accepted: Vec<f64>,
    absorb_per_row: Option<f64>,
    arms: BTreeMap<Shape, Arm>,
    /// The latest decisions; `logged` counts every decision ever logged.
    decisions: VecDeque<AutoDecision>,
    logged: usize,
    steps: usize,
    tokens: usize,
}

impl AutoGamma {
    /// Chooses among 0..=max; a new shape with nothing measured near it starts at 0.
    pub fn new(max: usize) -> AutoGamma {
        AutoGamma {
            max,
            tried: vec![0.0; max],
            accepted: vec![0.0; max],
            absorb_per_row: None,
            arms: BTreeMap::new(),
            decisions: VecDeque::new(),
            logged: 0,
            steps: 0,
            tokens: 0,
        }
    }

    /// The largest depth it chooses from.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Widens the choice to 0..=max (a row with a deeper maximum joined); what was measured
    /// stays.
    pub fn widen(&mut self, max: usize) {
        if max <= self.max {
            return;
        }
        self.max = max;
        self.tried.resize(max, 0.0);
        self.accepted.resize(max, 0.0);
        for a in self.arms.values_mut() {
            a.cost.resize(max + 1, None);
            a.window_cost.resize(max + 1, Vec::new());
        }
    }

    /// γ for the next step of `shape`. A shape that has not decided yet follows the nearest
    /// shape that has, step by step: a shape whose steps are rarely or never recorded (they
    /// also ran prefill work) would otherwise keep the choice in force when its arm was created
    /// — in a fresh server, `max` — for the server's life.
    pub fn next(&mut self, shape: Shape) -> usize {
        let max = self.max;
        if self.arms.get(&shape).is_none_or(|a| a.windows == 0) {
            if let Some(g) = self.nearest(shape, |a| a.windows > 0) {
                self.arm(shape).current = g;
            }
        }
        self.arm(shape).next(max)
    }

    /// The choice of the shape nearest `shape` (fewest rows apart, then fewest `auto` rows
    /// apart) among the other arms `keep` selects.
    fn nearest(&self, shape: Shape, keep: impl Fn(&Arm) -> bool) -> Option<usize> {
        self.arms
            .iter()
            .filter(|(s, a)| **s != shape && keep(a))
            .min_by_key(|(s, _)| {
                (
                    s.rows.abs_diff(shape.rows),
                    s.auto_rows.abs_diff(shape.auto_rows),
                )
            })
            .map(|(_, a)| a.current)
    }

    /// The depth chosen for steps of `shape` (`None`: never seen).
    pub fn current(&self, shape: Shape) -> Option<usize> {
        self.arms.get(&shape).map(|a| a.current)
    }

    /// The depth chosen for each shape seen.
    pub fn choices(&self) -> Vec<(Shape, usize)> {
        self.arms.iter().map(|(s, a)| (*s, a.current)).collect()
    }

    /// How many decisions have been logged so far (the log keeps the latest [`LOG`]).
    pub fn logged(&self) -> usize {
        self.logged
    }

    /// The decisions logged since `logged()` returned `from` (those still in the log).
    pub fn decisions_since(&self, from: usize) -> Vec<AutoDecision> {
        let first = self.logged - self.decisions.len();
        let skip = from.saturating_sub(first);
        self.decisions.iter().skip(skip).cloned().collect()
    }

    /// The shape's arm; a new one starts from the nearest shape's choice.
    fn arm(&mut self, shape: Shape) -> &mut Arm {
        if !self.arms.contains_key(&shape) {
            // Nothing measured anywhere: plain decoding, as `off` does, until the first
            // window's probes have measured drafting (starting at `max` cost every fresh
            // server its first steps, and its first decisions rested on them).
            let start = self.nearest(shape, |_| true).unwrap_or(0);
            self.arms.insert(shape, Arm::new(self.max, start));
        }
        self.arms.get_mut(&shape).expect("inserted above")
    }

    /// Records a step.
    pub fn record(&mut self, s: &StepSample<'_>) {
        // Depth j was asked for when every draft before it was accepted; a draft the
        // provider could not propose counts as rejected (it yielded no token).
        for r in s.rows {
            for j in 0..r.asked.min(r.accepted + 1).min(self.max) {
                self.tried[j] += 1.0;
                if j < r.accepted {
                    self.accepted[j] += 1.0;
                }
            }
        }
        if s.absorbed > 0 {
            let per = s.absorb_secs / s.absorbed as f64;
            let a = &mut self.absorb_per_row;
            *a = Some(a.map_or(per, |old| old + EMA * (per - old)));
        }
        self.steps += 1;
        self.tokens += s.others + s.rows.iter().map(|r| r.accepted + 1).sum::<usize>();
        let gamma = s.gamma.min(self.max);
        let arm = self.arm(s.shape);
        arm.window_cost[gamma].push(s.secs);
        if gamma > 0 && arm.current == 0 {
            if s.backlog > 0 {
                let b = s.backlog as f64;
                arm.backlog = Some(arm.backlog.map_or(b, |o| o + EMA * (b - o)));
            }
        } else if gamma > 0 {
            arm.window_backlog.0 += 1;
            arm.window_backlog.1 += s.backlog;
        }
        let others = s.others as f64;
        arm.others = Some(arm.others.map_or(others, |o| o + EMA * (others - o)));
        arm.round += 1;
        arm.steps += 1;
        if arm.round >= arm.window {
            self.decide(s.shape);
        }
    }

    /// Acceptance per depth, counting one draft more, rejected: a fresh controller decodes
    /// plainly and its first decision rests on one probe per depth, and one lucky draft
    /// (accepted 1 of 1) chose drafting for a window; with the evidence of a few windows the
    /// extra draft weighs 1/33 or less. An unmeasured depth inherits the one before.
    fn alphas(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.max);
        let mut prev = 0.0;
        for (t, a) in self.tried.iter().zip(&self.accepted) {
            prev = if *t > 0.0 { a / (t + 1.0) } else { prev };
            out.push(prev);
        }
        out
    }

    fn decide(&mut self, shape: Shape) {
        let alphas = self.alphas();
        let absorb_per_row = self.absorb_per_row.unwrap_or(0.0);
        let (max, steps, tokens) = (self.max, self.steps, self.tokens);
        let Some(arm) = self.arms.get_mut(&shape) else {
            return;
        };
        // Only a window that probed measured every γ at the same time; in another, the γ in
        // force was re-measured and the others were not, so a load swing on a shared machine
        // (step costs here move 2× within seconds) made stale alternatives look better and
        // flipped the choice for a window. Such a window holds.
        let probed = arm.windows.is_multiple_of(arm.probe_every);
        // The spread of this window's steps at the γ in force (their median absolute deviation
        // as a share of their median, scaled to a standard deviation): what one probe's cost
        // may be off by. A deeper γ must beat the γ in force by more than that: on the demo
        // under load a probe of three rows at γ = 1 measured 2.0 ms against 1.9 ms at γ = 0
        // (their steps spread 1.5–8 ms) and drafting, which did not pay, went on for a window.
        // Fed, noiseless costs have no spread and no margin.
        let noise = match &arm.window_cost[arm.current] {
            w if w.len() >= 4 => {
                let mut w = w.clone();
                let m = median(&mut w);
                let mut dev: Vec<f64> = w.iter().map(|x| (x - m).abs()).collect();
                1.4826 * median(&mut dev) / m.max(1e-12)
            }
            _ => 0.0,
        };
        // A window's samples of a γ weigh n / (n + 1) against what was known, so the γ in force
        // is re-measured almost afresh every window and one noisy probe moves its γ's estimate
        // only half way; a window off by more than [`REGIME`]× replaces it (the costs
        // changed, e.g. the drafts' experts became resident), so that shows within one probe.
        // A window counts by its median: a step the OS descheduled (a shared machine) only
        // ever looks slower, and its mean let a few such steps of the γ in force make every
        // other γ look better, so the choice flipped back and forth.
        for (c, w) in arm.cost.iter_mut().zip(&mut arm.window_cost) {
            if !w.is_empty() {
                let typical = median(w);
                let weight = w.len() as f64 / (w.len() + 1) as f64;
                *c = Some(match *c {
                    Some(old) if typical < old * REGIME && old < typical * REGIME => {
                        old + weight * (typical - old)
                    }
                    _ => typical,
                });
            }
            w.clear();
        }
        if let (n @ 1.., rows) = std::mem::take(&mut arm.window_backlog) {
            let per = rows as f64 / n as f64;
            let weight = n as f64 / (n + 1) as f64;
            arm.drafting_backlog =
                Some(arm.drafting_backlog.map_or(per, |o| o + weight * (per - o)));
        }
        let a = shape.auto_rows as f64;
        let others = arm.others.unwrap_or(0.0);
        let mut expected = Vec::with_capacity(max + 1);
        // Per γ, tokens and seconds of a step drafting steadily (no resume charge).
        let mut steady = Vec::with_capacity(max + 1);
        let (mut e, mut run) = (1.0, 1.0);
        // Drafting first absorbs every row its rows kept while they did not draft (each
        // row's prompt and plain steps: the MTP layer over all of them). Resuming after γ = 0
        // does so once, charged over the window it would draft for. But where the shape's
        // steps come in short stretches between steps of other shapes at γ = 0 (on the demo
        // at `--parallel 4`: three rows while the fourth request finishes or joins, between
        // long stretches of four rows at γ = 0), every stretch starts by absorbing what the
        // other shapes kept: measured while the shape drafts, per drafting step, it is charged
        // to every γ > 0, and it stays charged after the shape stopped drafting (or probes
        // that do not pay for it would turn drafting back on for a window, and so on).
        let drafting = arm.drafting_backlog.unwrap_or(0.0);
        let resume = absorb_per_row
            * match arm.current {
                0 => (arm.backlog.unwrap_or(0.0) / WINDOW as f64).max(drafting),
                _ => drafting,
            };
        for g in 0..=max {
            if g > 0 {
                run *= alphas[g - 1];
                e += run;
            }
            let (absorb, resume) = match g {
                0 => (0.0, 0.0),
                _ => (absorb_per_row * a * e, resume),
            };
            let step_tokens = others + a * e;
            steady.push(arm.cost[g].map(|c| (step_tokens, c + absorb)));
            expected.push(
                arm.cost[g].map(|c| (step_tokens, step_tokens / (c + absorb + resume).max(1e-12))),
            );
        }
        let best = expected
            .iter()
            .enumerate()
            .filter_map(|(g, x)| x.map(|(t, r)| (g, t, r)))
            .filter(|&(g, _, _)| probed || g == arm.current)
            // Strictly better only, so ties go to the smaller γ; drafting only while it beats
            // plain decoding by more than the noise (to turn on *and* to stay on: at one row on
            // the demo γ = 1 measured 1.08–1.14× γ = 0's rate with steps spreading 20–33 %, one
            // lucky first window turned it on, and the server then ran at 0.89–0.95 of `off`),
            // and deeper than the γ in force only by more than the noise again.
            .fold(None, |b: Option<(usize, f64, f64)>, x| {
                let judged = |(g, _, r): (usize, f64, f64)| {
                    let doubts =
                        usize::from(g > 0) + usize::from(arm.current > 0 && g > arm.current);
                    r / (1.0 + noise).powi(doubts as i32)
                };
                match b {
                    Some(b) if judged(b) >= judged(x) => Some(b),
                    _ => Some(x),
                }
            });
        if let Some((g, t, r)) = best {
            // What a probe window costs: each probe's time beyond what its tokens are worth at
            // γ's rate, and from γ = 0 the kept rows the first probe absorbs. On the demo a
            // probe window from γ = 0 cost about 10 % of 4 windows, which `auto` lost to `off`.
            let mut probe_secs: f64 = steady
                .iter()
                .enumerate()
                .filter(|&(o, _)| o != g)
                .filter_map(|(_, x)| *x)
                .map(|(tokens, secs)| (secs - tokens / r).max(0.0))
                .sum();
            if g == 0 {
                probe_secs += absorb_per_row * arm.backlog.unwrap_or(0.0);
            }
            let window_secs = WINDOW as f64 * t / r;
            let budget = (probe_secs / (PROBE_BUDGET * window_secs)).ceil() as usize;
            let runner_up = expected
                .iter()
                .enumerate()
                .filter(|&(o, _)| o != g)
                .filter_map(|(_, x)| x.map(|x| x.1))
                .fold(0.0, f64::max);
            let cap = match runner_up < r * (1.0 - FAR) {
                true => MAX_BUDGET_PROBE_EVERY,
                false => budget
                    .next_power_of_two()
                    .clamp(MAX_PROBE_EVERY, MAX_BUDGET_PROBE_EVERY),
            };
            // A probe window confirms a decision that holds; probes back off by doubling. Only
            // a probe window moves the schedule: in another, a load swing that slowed the γ in
            // force made the (stale) probes look cheap and brought them back every 4th window.
            arm.probe_every = match (g == arm.current, probed) {
                (false, _) => 1,
                (true, true) => (arm.probe_every * 2).min(cap),
                (true, false) => arm.probe_every,
            };
            tracing::debug!(
                target: "nectar::auto",
                rows = shape.rows,
                auto_rows = shape.auto_rows,
                gamma = g,
                probed,
                probe_every = arm.probe_every,
                probe_ms = probe_secs * 1e3,
                window_ms = window_secs * 1e3,
                backlog = arm.backlog.unwrap_or(0.0),
                drafting_backlog = arm.drafting_backlog.unwrap_or(0.0),
                noise,
                absorb_us = absorb_per_row * 1e6,
                ms = ?arm.cost.iter().map(|c| c.map(|c| (c * 1e4).round() / 10.0)).collect::<Vec<_>>(),
                tok_s = ?expected.iter().map(|x| x.map(|x| x.1.round())).collect::<Vec<_>>(),
                alpha = ?alphas.iter().map(|a| (a * 100.0).round() / 100.0).collect::<Vec<_>>(),
                "auto decision"
            );
            let flipped = ((g > 0) != (arm.current > 0)).then_some(arm.steps);
            arm.current = g;
            let others: Vec<String> = expected
                .iter()
                .enumerate()
                .filter(|&(o, _)| o != g)
                .filter_map(|(o, x)| x.map(|(_, r)| format!("γ={o} {r:.0}")))
                .collect();
            let reason = format!(
                "γ={g}: {t:.2} tokens per step over {} rows at {:.2} ms per step → {r:.0} tok/s \
                 expected (tok/s: {})",
                shape.rows,
                arm.cost[g].unwrap_or(0.0) * 1e3,
                others.join(", ")
            );
            let decision = AutoDecision {
                round: steps,
                tokens,
                rows: shape.rows,
                auto_rows: shape.auto_rows,
                gamma: g,
                windows: 1,
                expected_tok_s: expected.iter().map(|x| x.map(|x| x.1)).collect(),
                round_ms: arm.cost.iter().map(|c| c.map(|c| c * 1e3)).collect(),
                acceptance_by_depth: alphas,
                reason,
            };
            self.log(decision);
            // What a shape's drafting steps absorb depends on whether the shapes its rows come
            // from draft: when one turns drafting on or off, what the shapes at γ = 0 measured
            // when they last drafted no longer holds (they would stay off on the backlog of a
            // shape that drafts now), and is forgotten. Rows spend their time, and keep their
            // backlog, mostly in the busier shapes: a rarer shape's flip does not count (on
            // the demo a row alone flipping made three rows forget, and draft at a loss).
            if let Some(flipped_steps) = flipped {
                for (s, other) in self.arms.iter_mut() {
                    if *s != shape && other.current == 0 && other.steps < flipped_steps {
                        other.drafting_backlog = None;
                    }
                }
            }
        }
        for (t, a) in self.tried.iter_mut().zip(self.accepted.iter_mut()) {
            if *t * DECAY >= MIN_EVIDENCE {
                *t *= DECAY;
                *a *= DECAY;
            }
        }
        if let Some(arm) = self.arms.get_mut(&shape) {
            arm.round = 0;
            arm.window = WINDOW;
            arm.windows += 1;
        }
    }

    /// Logs a decision; one that repeats the latest (same shape, same γ) extends it.
    fn log(&mut self, mut d: AutoDecision) {
        if let Some(last) = self
            .decisions
            .back_mut()
            .filter(|l| (l.rows, l.auto_rows, l.gamma) == (d.rows, d.auto_rows, d.gamma))
        {
            d.windows = last.windows + 1;
            *last = d;
            return;
        }
        if self.decisions.len() == LOG {
            self.decisions.pop_front();
        }
        self.decisions.push_back(d);
        self.logged += 1;
    }
}

/// The median of `x` (the mean of the middle two of an even count); `x` is reordered.
fn median(x: &mut [f64]) -> f64 {
    x.sort_unstable_by(f64::total_cmp);
    let n = x.len();
    if !n.is_multiple_of(2) {
        x[n / 2]
    } else {
        (x[n / 2 - 1] + x[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny seeded generator (the tests' acceptance draws).
    fn uniform(x: &mut u64) -> f64 {
        *x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*x >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Acceptance where 3 of every 5 drafting rows keep their first draft (α = 0.6, γ ≤ 1).
    fn three_in_five() -> impl FnMut(usize) -> usize {
        let mut n = 0usize;
        move |g| {
            n += 1;
            usize::from(g > 0 && n % 5 < 3)
        }
    }

    /// Feeds one step of `shape` whose `auto` rows each accept `accept(γ)` drafts and which
    /// costs `cost(shape, γ)`; returns the γ it ran at.
    fn step(
        a: &mut AutoGamma,
        shape: Shape,
        accept: &mut impl FnMut(usize) -> usize,
        cost: &impl Fn(Shape, usize) -> f64,
    ) -> usize {
        let g = a.next(shape);
        let rows: Vec<RowRound> = (0..shape.auto_rows)
            .map(|_| RowRound {
                asked: g,
                accepted: accept(g),
            })
            .collect();
        a.record(&StepSample {
            shape,
            gamma: g,
            rows: &rows,
            others: shape.rows - shape.auto_rows,
            secs: cost(shape, g),
            absorbed: 0,
            backlog: 0,
            absorb_secs: 0.0,
        });
        g
    }

    #[test]
    fn a_shape_never_recorded_follows_the_nearest_decided_shape() {
        let mut a = AutoGamma::new(3);
        // Steps of (4, 3) are never recorded (in a batch: they also ran prefill work); its
        // arm is created now, before anything decided.
        let joining = Shape {
            rows: 4,
            auto_rows: 3,
        };
        assert_eq!(a.next(joining), 0);
        // Four rows decoding: every draft is accepted and a verified row costs a tenth of a
        // step, so (4, 4) decides γ = 3.
        let full = Shape {
            rows: 4,
            auto_rows: 4,
        };
        let cost = |_: Shape, g: usize| 1e-3 * (1.0 + 0.1 * g as f64);
        for _ in 0..FIRST_WINDOW + WINDOW {
            step(&mut a, full, &mut |g| g, &cost);
        }
        assert_eq!(a.current(full), Some(3));
        assert_eq!(a.next(joining), 3, "stuck at the γ of its creation");
        assert_eq!(a.current(joining), Some(3));
    }

    #[test]
    fn descheduled_steps_do_not_flip_the_choice() {
        // Drafting does not pay (γ = 1: 1.7 tokens for 1.9× the time), but every 5th step the
        // OS takes the core away and it costs 10×: by a window's mean, γ = 0 (11 × 1 ms and 3 ×
        // 10 ms) looked slower than a probe of γ = 1 that was not descheduled. And while
        // drafting is off only probes measure acceptance: one or two lucky ones made γ = 1
        // look paying.
        let n = std::cell::Cell::new(0usize);
        let cost = |_: Shape, g: usize| {
            n.set(n.get() + 1);
            let slow = if n.get().is_multiple_of(5) { 10.0 } else { 1.0 };
            1e-3 * slow * (1.0 + 0.9 * g as f64)
        };
        let mut x = 7u64;
        let mut accept = |g: usize| (0..g).take_while(|_| uniform(&mut x) < 0.7).count();
        let mut a = AutoGamma::new(1);
        let mut chosen = Vec::new();
        for _ in 0..FIRST_WINDOW + WINDOW * 20 {
            step(&mut a, Shape::ALONE, &mut accept, &cost);
            chosen.push(a.current(Shape::ALONE).unwrap());
        }
        assert!(chosen[FIRST_WINDOW..].iter().all(|&g| g == 0), "{chosen:?}");
    }

    #[test]
    fn a_window_without_probes_holds_its_choice() {
        // Drafting loses (γ = 1: 1.6 tokens for 1.9× the time). Once probes have backed off,
        // the machine gets 2.5× slower (other processes took the cores) at the start of a
        // window that does not probe: the γ in force is re-measured at 2.5 ms a step, γ = 1's
        // estimate is still the 1.9 ms of the quiet machine, and comparing the two chose
        // drafting for a window.
        let slow = std::cell::Cell::new(1.0);
        let cost = |_: Shape, g: usize| 1e-3 * slow.get() * (1.0 + 0.9 * g as f64);
        let mut accept = three_in_five();
        let mut a = AutoGamma::new(1);
        for _ in 0..FIRST_WINDOW + WINDOW * 8 {
            step(&mut a, Shape::ALONE, &mut accept, &cost);
        }
        assert_eq!(a.current(Shape::ALONE), Some(0));
        // Up to the next window boundary, then on until a window that does not probe starts.
        let arm = |a: &AutoGamma| a.arms[&Shape::ALONE].clone();
        while arm(&a).round != 0 || arm(&a).windows.is_multiple_of(arm(&a).probe_every) {
            step(&mut a, Shape::ALONE, &mut accept, &cost);
        }
        slow.set(2.5);
        let mut chosen = Vec::new();
        for _ in 0..WINDOW * 8 {
            step(&mut a, Shape::ALONE, &mut accept, &cost);
            chosen.push(a.current(Shape::ALONE).unwrap());
        }
        assert!(
            chosen.iter().all(|&g| g == 0),
            "{chosen:?} {:?}",
            a.decisions_since(0)
        );
    }

    /// Runs `steps` steps of a row alone that drafts through a simulated MTP layer: the rows
    /// kept by steps at γ = 0 wait and are absorbed, at `absorb` seconds each, by the next step
    /// that drafts. Of every 5 drafts 3 are accepted (α = 0.6).
    fn run_absorbing(
        a: &mut AutoGamma,
        steps: usize,
        absorb: f64,
        cost: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        let (mut pending, mut last_kept, mut n) = (0usize, 1usize, 0usize);
        (0..steps)
            .map(|_| {
                let g = a.next(Shape::ALONE);
                n += usize::from(g > 0);
                let accepted = usize::from(g > 0 && n % 5 < 3);
                let (absorbed, backlog) = if g > 0 {
                    (pending, pending.saturating_sub(last_kept))
                } else {
                    (0, 0)
                };
                if g > 0 {
                    pending = 0;
                }
                last_kept = accepted + 1;
                pending += last_kept;
                a.record(&StepSample {
                    shape: Shape::ALONE,
                    gamma: g,
                    rows: &[RowRound { asked: g, accepted }],
                    others: 0,
                    secs: cost(g),
                    absorbed,
                    backlog,
                    absorb_secs: absorb * absorbed as f64,
                });
                g
            })
            .collect()
    }

    #[test]
    fn resuming_drafting_pays_for_the_rows_kept_meanwhile() {
        // First drafting loses (γ = 1 costs 2 ms against 1 ms), so the row decodes at γ = 0
        // and probes back off (to every 32nd window: the verdict wins by far); the rows kept
        // meanwhile (up to 64) wait.
        // Then γ = 1 costs 1.45 ms: drafting every step would pay a little (1.6 tokens in
        // 1.45 + 1.6 × 0.05 ms = 1.53 ms, against 1 in 1 ms), but resuming first absorbs the
        // rows kept since the last probe, 64 × 0.05 ms = 3.2 ms, 0.2 ms a step over a window,
        // and then it does not (1.6 in 1.73 ms). Drafting that pays well still resumes.
        for (draft_ms, resumes) in [(1.45, false), (1.1, true)] {
            let mut a = AutoGamma::new(1);
            run_absorbing(&mut a, FIRST_WINDOW + WINDOW * 8, 5e-5, |g| {
                1e-3 * (1.0 + g as f64)
            });
            assert_eq!(a.current(Shape::ALONE), Some(0));
            // (A probe more than 1.5× off γ = 1's estimate replaces it, a closer one moves it
            // half way: give them 60 windows, two probes or more.)
            let s = run_absorbing(&mut a, WINDOW * 60, 5e-5, |g| {
                1e-3 * if g > 0 { draft_ms } else { 1.0 }
            });
            let drafting = s[WINDOW * 40..].iter().filter(|&&g| g > 0).count();
            assert_eq!(
                drafting > WINDOW * 10,
                resumes,
                "{draft_ms} ms: {s:?} {:?}",
                a.decisions_since(0)
            );
        }
    }

    /// Four rows through a simulated MTP layer, in cycles of 13 steps of all four and 3 steps
    /// of rows 0..3 alone (the fourth request finished and the next has not joined: its rows
    /// wait). A row's rows kept at γ = 0 wait and are absorbed, at `absorb` seconds each, by
    /// its next step that drafts. Of every 5 drafts 3 are accepted (α = 0.6, γ ≤ 1). Returns
    /// the γ of every step of three rows.
    fn run_two_shapes(
        a: &mut AutoGamma,
        cycles: usize,
        absorb: f64,
        cost: impl Fn(Shape, usize) -> f64,
    ) -> Vec<usize> {
        let mut pending = [0usize; 4];
        let mut last_kept = [1usize; 4];
        let mut n = 0usize;
        let mut three = Vec::new();
        for i in 0..cycles * 16 {
            let rows = if i % 16 < 13 { 4 } else { 3 };
            let shape = Shape {
                rows,
                auto_rows: rows,
            };
            let g = a.next(shape);
            let (mut absorbed, mut backlog) = (0, 0);
            let mut parts = Vec::new();
            for r in 0..rows {
                n += usize::from(g > 0);
                let accepted = usize::from(g > 0 && n % 5 < 3);
                if g > 0 {
                    absorbed += pending[r];
                    backlog += pending[r].saturating_sub(last_kept[r]);
                    pending[r] = 0;
                }
                last_kept[r] = accepted + 1;
                pending[r] += accepted + 1;
                parts.push(RowRound { asked: g, accepted });
            }
            a.record(&StepSample {
                shape,
                gamma: g,
                rows: &parts,
                others: 0,
                secs: cost(shape, g),
                absorbed,
                backlog,
                absorb_secs: absorb * absorbed as f64,
            });
            if rows == 3 {
                three.push(g);
            }
        }
        three
    }

    #[test]
    fn a_shape_between_stretches_at_zero_pays_for_what_they_kept() {
        // At first drafting pays in both shapes: a draft costs a tenth of a row. Then drafts
        // in the four-row step cost a whole row each (its experts no longer fit): four rows
        // go to γ = 0. Three rows' drafts stay cheap: 4.8 tokens in 3.6 ms plus 0.48 ms
        // absorbing its own kept rows beat 3 tokens in 3 ms (1.18 against 1.0 per ms). But
        // every 3-step stretch of three rows now starts by absorbing the 39 rows they kept
        // in the 13 steps at γ = 0, 1.3 ms a step at 0.1 ms a row: 4.8 in 5.4 ms (0.89) loses;
        // at 0.01 ms a row (0.13 ms a step) drafting still pays and goes on.
        for (absorb, keeps_drafting) in [(1e-4, false), (1e-5, true)] {
            let mut a = AutoGamma::new(1);
            let cheap =
                |s: Shape, g: usize| 1e-3 * (s.rows as f64 + 0.2 * (s.auto_rows * g) as f64);
            let dear = |s: Shape, g: usize| {
                let per_draft = if s.rows == 4 { 1.0 } else { 0.2 };
                1e-3 * (s.rows as f64 + per_draft * (s.auto_rows * g) as f64)
            };
            run_two_shapes(&mut a, 40, absorb, cheap);
            let three = Shape {
                rows: 3,
                auto_rows: 3,
            };
            let four = Shape {
                rows: 4,
                auto_rows: 4,
            };
            assert_eq!(a.current(three), Some(1), "{:?}", a.decisions_since(0));
            assert_eq!(a.current(four), Some(1), "{:?}", a.decisions_since(0));
            let s = run_two_shapes(&mut a, 200, absorb, dear);
            assert_eq!(a.current(four), Some(0), "{:?}", a.decisions_since(0));
            let drafting = s[s.len() / 2..].iter().filter(|&&g| g > 0).count();
            assert_eq!(
                drafting > s.len() / 4,
                keeps_drafting,
                "{absorb}: {s:?} {:?}",
                a.decisions_since(0)
            );
        }
    }

    #[test]
    fn what_a_shape_absorbed_while_others_did_not_draft_is_forgotten_when_they_do() {
        // Three rows' drafts pay (1.9 tokens a row for 0.2 ms more than a 3 ms step) but,
        // while the four-row shape is at γ = 0, every step of three rows that drafts absorbs
        // 30 rows kept meanwhile, 3 ms at 0.1 ms a row: three rows go to γ = 0. Then drafting
        // turns on for four rows: the rows come to three rows' steps absorbed, and three
        // rows' drafting must be tried again, not judged by the backlog it last measured.
        let mut a = AutoGamma::new(1);
        let three = Shape {
            rows: 3,
            auto_rows: 3,
        };
        let four = Shape {
            rows: 4,
            auto_rows: 4,
        };
        // Four rows are the busier shape (a shape's flip makes only rarer ones forget).
        let four_steps = |a: &mut AutoGamma, per_draft: f64| {
            for _ in 0..FIRST_WINDOW + WINDOW * 8 {
                step(a, four, &mut |g| g, &|_, g| {
                    1e-3 * (4.0 + per_draft * g as f64)
                });
            }
        };
        let three_steps = |a: &mut AutoGamma, backlog: usize| {
            let mut chosen = Vec::new();
            for _ in 0..FIRST_WINDOW + WINDOW * 4 {
                let g = a.next(three);
                let rows = [RowRound {
                    asked: g,
                    accepted: g,
                }; 3];
                let (absorbed, backlog) = match g {
                    0 => (0, 0),
                    _ => (6 + backlog, backlog),
                };
                a.record(&StepSample {
                    shape: three,
                    gamma: g,
                    rows: &rows,
                    others: 0,
                    secs: 1e-3 * (3.0 + 0.2 * g as f64),
                    absorbed,
                    backlog,
                    absorb_secs: 1e-4 * absorbed as f64,
                });
                chosen.push(g);
            }
            chosen
        };
        // Four rows' drafts cost 4 ms each: γ = 0.
        four_steps(&mut a, 4.0);
        assert_eq!(a.current(four), Some(0));
        // Three rows start at four rows' γ = 0, probe, draft, measure the backlog, stop.
        three_steps(&mut a, 30);
        assert_eq!(a.current(three), Some(0), "{:?}", a.decisions_since(0));
        // A row alone, a rarer shape, turns drafting on: three rows' rows still come from
        // four rows at γ = 0, and three rows do not forget (drafting once more at a loss).
        for _ in 0..FIRST_WINDOW {
            step(&mut a, Shape::ALONE, &mut |g| g, &|_, g| {
                1e-3 * (1.0 + 0.1 * g as f64)
            });
        }
        assert_eq!(a.current(Shape::ALONE), Some(1));
        let s = three_steps(&mut a, 30);
        assert!(s.iter().filter(|&&g| g > 0).count() <= 5, "{s:?}");
        // Four rows' drafts become cheap: γ = 1.
        four_steps(&mut a, 0.1);
        assert_eq!(a.current(four), Some(1));
        // No backlog any more: three rows draft again.
        let s = three_steps(&mut a, 0);
        assert_eq!(
            a.current(three),
            Some(1),
            "{s:?} {:?}",
            a.decisions_since(0)
        );
    }

    #[test]
    fn a_probe_within_the_noise_does_not_turn_drafting_on() {
        // Every step's time is off by a random factor 0.7–1.6 (a loaded machine). Drafting
        // does not pay: 1.6 tokens (3 of 5 drafts accepted) for 2× the time; one probe of
        // γ = 1 that happened to be fast looked paying against γ = 0's median and drafted for
        // a window. Drafting that pays well (1.6 tokens for 1.1× the time) still drafts.
        for (draft_cost, drafts) in [(2.0, false), (1.1, true)] {
            let mut x = 5u64;
            let noisy = std::cell::RefCell::new(move || 0.7 + 0.9 * uniform(&mut x));
            let cost = |_: Shape, g: usize| {
                1e-3 * (noisy.borrow_mut())() * if g > 0 { draft_cost } else { 1.0 }
            };
            let mut accept = three_in_five();
            let mut a = AutoGamma::new(1);
            let s: Vec<usize> = (0..FIRST_WINDOW + WINDOW * 100)
                .map(|_| step(&mut a, Shape::ALONE, &mut accept, &cost))
                .collect();
            let drafting = s.iter().filter(|&&g| g > 0).count();
            assert_eq!(
                drafting > s.len() / 2,
                drafts,
                "{draft_cost}: {drafting} of {}",
                s.len()
            );
            if !drafts {
                // Little more than the probes.
                assert!(drafting < s.len() / 20, "{drafting} of {}", s.len());
            }
        }
    }

    #[test]
    fn drafting_within_the_noise_of_plain_decoding_turns_off() {
        // Steps off by a random factor 0.85–1.3 (their spread ≈ 0.15). Drafts are accepted
        // 3 times in 5 (1.6 tokens a step). At 1.1× a plain step's time drafting pays by far
        // (1.45×) and is on; then a draft costs 1.5× (1.07× plain decoding's rate, inside the
        // noise): plain decoding, the safe side of a close call, takes over; drafting is left
        // to the probes and to brief flips where one probe's luck beat the margin (a fifth of
        // the steps). Before, γ = 1 in force stayed on (γ = 0 had to beat it outright): more
        // than half of the steps drafted.
        let draft_cost = std::cell::Cell::new(1.1);
        let mut x = 9u64;
        let noisy = std::cell::RefCell::new(move || 0.85 + 0.45 * uniform(&mut x));
        let cost = |_: Shape, g: usize| {
            1e-3 * (noisy.borrow_mut())() * if g > 0 { draft_cost.get() } else { 1.0 }
        };
        let mut accept = three_in_five();
        let mut a = AutoGamma::new(1);
        for _ in 0..FIRST_WINDOW + WINDOW * 30 {
            step(&mut a, Shape::ALONE, &mut accept, &cost);
        }
        assert_eq!(
            a.current(Shape::ALONE),
            Some(1),
            "{:?}",
            a.decisions_since(0)
        );
        draft_cost.set(1.5);
        let s: Vec<usize> = (0..WINDOW * 100)
            .map(|_| step(&mut a, Shape::ALONE, &mut accept, &cost))
            .collect();
        let late = &s[WINDOW * 50..];
        let drafting = late.iter().filter(|&&g| g > 0).count();
        assert!(drafting < late.len() / 4, "{drafting} of {}", late.len());
    }

    /// The γ of each of the first `n` steps of a row alone.
    fn schedule(
        n: usize,
        mut accept: impl FnMut(usize) -> usize,
        cost: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        let mut a = AutoGamma::new(3);
        (0..n)
            .map(|_| step(&mut a, Shape::ALONE, &mut accept, &|_, g| cost(g)))
            .collect()
    }

    /// Runs whole windows of a row alone with acceptance `alpha` per depth.
    fn simulate(alpha: f64, cost: impl Fn(usize) -> f64, windows: usize) -> AutoGamma {
        let mut a = AutoGamma::new(3);
        let mut x = 1u64;
        let mut accept = |g: usize| (0..g).take_while(|_| uniform(&mut x) < alpha).count();
        for _ in 0..windows * WINDOW {
            step(&mut a, Shape::ALONE, &mut accept, &|_, g| cost(g));
        }
        a
    }

    #[test]
    fn a_window_ends_probing_every_other_depth() {
        // Drafting pays. A fresh controller decodes plainly (as `off` does) until the first
        // window's probes, then drafts at γ = 3, probes at the end of each window.
        let s = schedule(8 + 16 * 3, |g| g, |g| 1e-3 * (1.0 + 0.1 * g as f64));
        assert_eq!(s[..8], [0, 0, 0, 0, 0, 1, 2, 3], "{s:?}");
        // A changed decision probes the next window; a confirmed one backs off to every 2nd.
        assert_eq!(s[8 + 13..8 + 16], [0, 1, 2], "{s:?}");
        assert_eq!(s[8 + 16 + 13..8 + 32], [0, 1, 2], "{s:?}");
        assert!(s[8 + 32..].iter().all(|&g| g == 3), "{s:?}");
    }

    #[test]
    fn probes_back_off_while_the_decision_holds() {
        // Drafting never pays: γ = 0 from the start, the first window probing, then every
        // 2nd, then every 4th.
        let s = schedule(8 + 16 * 9, |_| 0, |g| 1e-3 * (1.0 + g as f64));
        assert!(s[..5].iter().all(|&g| g == 0), "{s:?}");
        let probed: Vec<bool> = s[8..]
            .chunks(16)
            .map(|w| w.iter().any(|&g| g != 0))
            .collect();
        assert_eq!(
            probed,
            [false, true, false, true, false, false, false, true, false]
        );
    }

    #[test]
    fn probes_that_cost_more_than_their_budget_back_off_further() {
        // Drafting never pays; ms per step at γ = 0..3. Cheap probes (0.05 ms more a depth: a
        // probe window loses 0.3 ms, 2 % of a window) stay at every 4th window. Dear ones whose
        // verdict is close (γ = 1 only 5 % below γ = 0, but γ = 2 and 3 cost 0.8 and 1 ms more:
        // 1.85 ms, 12 % of a window) back off to every 8th. A verdict that wins by far (every
        // depth 0.9 ms more: γ = 1 is 47 % below γ = 0) backs off to every 32nd, whatever it
        // costs.
        for (ms, probed_windows) in [
            ([1.0, 1.05, 1.1, 1.15], 8),
            ([1.0, 1.05, 1.8, 2.0], 4),
            ([1.0, 1.9, 2.8, 3.7], 1),
        ] {
            let s = schedule(8 + 16 * 72, |_| 0, |g| 1e-3 * ms[g]);
            // The last 32 windows.
            let probed = s[8..]
                .chunks(16)
                .skip(40)
                .filter(|w| w.iter().any(|&g| g != 0))
                .count();
            assert_eq!(probed, probed_windows, "{ms:?}: {s:?}");
        }
    }

    #[test]
    fn a_slow_window_does_not_bring_probes_back() {
        // Dear probes have backed off to every 8th window; then one window between probes
        // runs 3× slower (the machine is shared). Its probes' costs are older, so the probes
        // looked cheap against it: it must not shorten the schedule.
        let slow = std::cell::Cell::new(1.0);
        let cost = |_: Shape, g: usize| 1e-3 * slow.get() * (1.0 + 0.9 * g as f64);
        let mut a = AutoGamma::new(3);
        let every = |a: &AutoGamma| a.arms.get(&Shape::ALONE).map_or(1, |a| a.probe_every);
        let mut steps = 0;
        while every(&a) < 8 {
            step(&mut a, Shape::ALONE, &mut |_| 0, &cost);
            steps += 1;
            assert!(steps < 16 * 40, "never backed off to 8");
        }
        // On to the start of the next window that does not probe.
        let arm = |a: &AutoGamma| a.arms[&Shape::ALONE].clone();
        while arm(&a).round != 0 || arm(&a).windows.is_multiple_of(arm(&a).probe_every) {
            step(&mut a, Shape::ALONE, &mut |_| 0, &cost);
        }
        slow.set(3.0);
        for _ in 0..WINDOW {
            step(&mut a, Shape::ALONE, &mut |_| 0, &cost);
        }
        slow.set(1.0);
        assert_eq!(every(&a), 8);
    }

    #[test]
    fn cheap_verification_and_good_drafts_choose_deep_drafting() {
        let a = simulate(0.9, |g| 1e-3 * (1.0 + 0.1 * g as f64), 3);
        assert_eq!(a.current(Shape::ALONE), Some(3));
        let d = a.decisions_since(0);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].windows, 3);
    }

    #[test]
    fn expensive_verification_turns_drafting_off() {
        let a = simulate(0.5, |g| 1e-3 * (1.0 + g as f64), 3);
        assert_eq!(a.current(Shape::ALONE), Some(0));
        let d = a.decisions_since(0).pop().unwrap();
        assert!(d.reason.starts_with("γ=0"), "{}", d.reason);
        assert!(d.expected_tok_s.iter().all(Option::is_some));
    }

    /// A compute-bound step: every row of the forward costs a millisecond, drafts included,
    /// plus a fixed 2 ms.
    fn per_row_cost(shape: Shape, g: usize) -> f64 {
        1e-3 * (2.0 + (shape.rows + shape.auto_rows * g) as f64)
    }

    #[test]
    fn the_step_objective_drafts_alone_and_not_in_a_full_step() {
        // The first draft is accepted 60 % of the time, deeper ones never (so γ ≥ 2 only
        // costs). Alone: γ = 0 gives 1 token in 3 ms, γ = 1 1.6 in 4 ms (more tok/s). Eight
        // rows: γ = 0 gives 8 in 10 ms, γ = 1 12.8 in 18 ms (fewer). A row's own view (its
        // 0.6 extra tokens against the 1 ms its draft adds) would draft in both.
        let mut a = AutoGamma::new(3);
        let mut x = 7u64;
        let mut accept = |g: usize| usize::from(g > 0 && uniform(&mut x) < 0.6);
        let full = Shape {
            rows: 8,
            auto_rows: 8,
        };
        // The two shapes interleave, as rows come and go.
        for i in 0..16 * 12 {
            let shape = if (i / 5) % 2 == 0 { full } else { Shape::ALONE };
            step(&mut a, shape, &mut accept, &per_row_cost);
        }
        assert_eq!(a.current(full), Some(0), "{:?}", a.decisions_since(0));
        assert_eq!(a.current(Shape::ALONE), Some(1));
        // No oscillation: after its first decision each shape never changed its mind.
        for shape in [full, Shape::ALONE] {
            let changes = a
                .decisions_since(0)
                .iter()
                .filter(|d| (d.rows, d.auto_rows) == (shape.rows, shape.auto_rows))
                .map(|d| d.gamma)
                .collect::<Vec<_>>()
                .windows(2)
                .filter(|w| w[0] != w[1])
                .count();
            assert_eq!(changes, 0, "{shape:?}: {:?}", a.decisions_since(0));
        }
    }

    #[test]
    fn drafting_turns_back_on_when_it_starts_to_pay() {
        // Verification rows first cost as much as a plain step, then (the experts they need
        // became resident) almost nothing.
        let mut a = AutoGamma::new(3);
        let mut x = 3u64;
        let mut accept = |g: usize| (0..g).take_while(|_| uniform(&mut x) < 0.7).count();
        let full = Shape {
            rows: 4,
            auto_rows: 4,
        };
        let dear = |s: Shape, g: usize| 1e-3 * (s.rows + s.auto_rows * g) as f64;
        let cheap = |s: Shape, g: usize| 1e-3 * (s.rows as f64 + 0.01 * (s.auto_rows * g) as f64);
        for _ in 0..8 + 16 * 6 {
            step(&mut a, full, &mut accept, &dear);
        }
        assert_eq!(a.current(full), Some(0));
        // Probes have backed off to every 4th window: within 4 windows plus one a probe has
        // measured the cheap drafts and drafting is back on, and stays on.
        let mut turned_on = None;
        for i in 0..16 * 8 {
            step(&mut a, full, &mut accept, &cheap);
            if turned_on.is_none() && a.current(full) != Some(0) {
                turned_on = Some(i);
            }
        }
        assert!(
            turned_on.is_some_and(|i| i < 16 * 5),
            "{turned_on:?} {:?}",
            a.decisions_since(0)
        );
        assert!(a.current(full).unwrap() > 0, "{:?}", a.decisions_since(0));
    }

    #[test]
    fn the_rows_auto_does_not_drive_count_in_the_step() {
        // One auto row among seven plain ones, its drafts accepted 90 % of the time. Judged by
        // its own tokens it would draft in both cases below (1 token in 7 ms against 1.9 in
        // 7.5 or 9 ms), but the step also carries the plain rows' seven tokens: 8 in 7 ms
        // against 8.9 in 7.5 ms pays (1.143 vs 1.187 tokens per ms), 8.9 in 9 ms (0.989)
        // does not.
        let shape = Shape {
            rows: 8,
            auto_rows: 1,
        };
        for (draft_ms, want) in [(0.5, 1), (2.0, 0)] {
            let mut a = AutoGamma::new(1);
            let mut x = 11u64;
            let mut accept = |g: usize| (0..g).take_while(|_| uniform(&mut x) < 0.9).count();
            let cost = |_: Shape, g: usize| 1e-3 * (7.0 + draft_ms * g as f64);
            for _ in 0..8 + 16 * 2 {
                step(&mut a, shape, &mut accept, &cost);
            }
            assert_eq!(a.current(shape), Some(want), "{:?}", a.decisions_since(0));
        }
    }

    #[test]
    fn a_new_shape_starts_from_the_nearest_choice_and_the_log_is_bounded() {
        // Alone, every draft is accepted and a draft costs a tenth of a step: γ = 3.
        let mut a = AutoGamma::new(3);
        for _ in 0..8 + 16 {
            step(&mut a, Shape::ALONE, &mut |g| g, &|_, g| {
                1e-3 * (1.0 + 0.1 * g as f64)
            });
        }
        assert_eq!(a.current(Shape::ALONE), Some(3));
        let two = Shape {
            rows: 2,
            auto_rows: 2,
        };
        // A fresh controller asks 0 (plain decoding); a new shape near a measured one asks
        // its choice.
        assert_eq!(AutoGamma::new(3).next(two), 0);
        assert_eq!(a.next(two), 3);
        let mut accept = |_: usize| 0;
        // Alternating decisions never merge; the log keeps the latest LOG of them.
        let mut b = AutoGamma::new(1);
        for i in 0..LOG + 20 {
            let shape = Shape {
                rows: 1 + i % 2,
                auto_rows: 1,
            };
            for _ in 0..WINDOW {
                step(&mut b, shape, &mut accept, &per_row_cost);
            }
        }
        assert!(b.logged() > LOG);
        assert_eq!(b.decisions_since(0).len(), LOG);
        assert_eq!(b.decisions_since(b.logged() - 3).len(), 3);
    }
}
