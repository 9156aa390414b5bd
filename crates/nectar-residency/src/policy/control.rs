//! The look-ahead controller: how confident a prediction must be (the shortest matched token
//! context) before the look-ahead reads it, moved at run time by what decode measures.
//!
//! A speculative read pays on one machine and costs on another. Where the disk is saturated
//! (its busy time is the step time), every wasted read is time added to the step; where compute
//! waits for misses read only after their router (the serial path binds), every read started
//! early is time taken off it. Replayed on route256, contexts of ≥ 16 or ≥ 32 tokens project
//! 1.010 / 1.018 tok/s for GLM-5.2 on 32 GB + PCIe4 but 3.43 / 3.26 (from 3.58 at ≥ 8) on a
//! 128 GB unified machine, so no fixed threshold is right for both.
//!
//! The controller moves one rung of [`RUNGS`] at a time, from windows of [`WINDOW`] decode
//! steps. Each window gives the step time, the disk's busy fraction (some read in flight),
//! compute's wait for reads and the share of reads that were wasted prefetches:
//! - **Propose** (no trial running, no hold): *stricter* when the disk was busy at least
//!   [`SATURATED`] of the window and some prefetch was wasted (waste then costs step time);
//!   *looser* when the disk had idle time and compute waited at least [`SERIAL_WAIT`] of the
//!   window (early reads would fill that idle time). The move is a trial that remembers the
//!   window's seconds per step.
//! - **Judge** the trial on the next window: kept when its seconds per step are lower; otherwise
//!   the controller goes back and holds for a backoff of windows that doubles with each
//!   rejected trial in a row (2, 4, …, [`MAX_HOLD`]) — the hysteresis that keeps it from
//!   flapping between two rungs, while still re-probing when the machine or the text changes.
//!
//! A window holds steps of one batch width (the sequences decoded together: a server's steps
//! batch its requests, and a two-sequence step's time is not one sequence's): a step of
//! another width drops the partial window, and a trial in progress — its reference measured at
//! the other width — goes back unjudged. So a server decoding two requests at a time tunes the
//! threshold on its own steps, where measuring only one-sequence steps left it at its start.
//!
//! Pure and deterministic: the same measurements give the same moves (tested; the projection
//! in `nectar fit --project` runs this same state machine on its modelled measurements).
use serde::Serialize;

/// Minimum matched context lengths the controller moves between, loosest first. 64 is longer
/// than any matched context (the predictor matches at most 32 tokens): no look-ahead.
pub const RUNGS: [usize; 6] = [2, 4, 8, 16, 32, 64];
/// Decode steps per measurement window.
pub const WINDOW: u32 = 8;
/// Disk busy fraction from which the disk counts as saturated.
pub const SATURATED: f64 = 0.9;
/// Share of a window compute waits for reads from which a looser threshold is tried.
pub const SERIAL_WAIT: f64 = 0.05;
/// Longest hold (windows) after rejected trials.
pub const MAX_HOLD: u32 = 64;

/// What one window (or step) of decode measured. Seconds are wall-clock over the steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Measurement {
    /// Decode steps.
    pub steps: u32,
    /// Wall seconds of those steps.
    pub seconds: f64,
    /// Seconds some expert read was in flight.
    pub busy_seconds: f64,
    /// Seconds compute waited for expert reads.
    pub wait_seconds: f64,
    /// Expert reads started (demand and prefetch).
    pub reads: u64,
    /// The look-ahead plan's prefetches dropped unrequested (its wasted reads).
    pub wasted: u64,
}

impl Measurement {
    fn add(&mut self, m: &Measurement) {
        self.steps += m.steps;
        self.seconds += m.seconds;
        self.busy_seconds += m.busy_seconds;
        self.wait_seconds += m.wait_seconds;
        self.reads += m.reads;
        self.wasted += m.wasted;
    }

    /// Seconds per step.
    pub fn step_seconds(&self) -> f64 {
        self.seconds / self.steps.max(1) as f64
    }

    /// Share of the time some read was in flight.
    pub fn busy(&self) -> f64 {
        self.busy_seconds / self.seconds.max(1e-12)
    }

    /// Share of the time compute waited for reads.
    pub fn wait(&self) -> f64 {
        self.wait_seconds / self.seconds.max(1e-12)
    }

    /// Share of the reads that were wasted prefetches.
    pub fn waste(&self) -> f64 {
        self.wasted as f64 / self.reads.max(1) as f64
    }
}

/// A move on trial: where it came from and the seconds per step measured there.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Trial {
    from: usize,
    step_seconds: f64,
}

/// The controller's state and what it has done (reported in `--json` and `/stats`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ControlStats {
    /// The shortest matched context the look-ahead reads now.
    pub min_context: usize,
    /// Windows measured.
    pub windows: u64,
    /// Trials of a stricter threshold (kept or not).
    pub tried_stricter: u64,
    /// Trials of a looser threshold.
    pub tried_looser: u64,
    /// Trials rejected (the threshold went back).
    pub rejected: u64,
    /// Windows left before the next trial may start.
    pub hold: u32,
    /// The last full window's measurements.
    pub last: Measurement,
    /// Sequences decoded together in the steps measured now (1: one alone).
    pub sequences: usize,
    /// Windows restarted by a change of that width (the partial window dropped).
    pub restarts: u64,
}

/// The controller (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Controller {
    rung: usize,
    /// Sequences decoded together in the window's steps.
    sequences: usize,
    window: Measurement,
    trial: Option<Trial>,
    hold: u32,
    backoff: u32,
    stats: ControlStats,
}

impl Default for Controller {
    fn default() -> Self {
        Controller::new(super::MIN_CONTEXT)
    }
}

impl Controller {
    /// A controller starting at the rung nearest `min_context`.
    pub fn new(min_context: usize) -> Controller {
        let rung = RUNGS
            .iter()
            .position(|&r| r >= min_context)
            .unwrap_or(RUNGS.len() - 1);
        Controller {
            rung,
            sequences: 1,
            window: Measurement::default(),
            trial: None,
            hold: 0,
            backoff: 1,
            stats: ControlStats {
                min_context: RUNGS[rung],
                windows: 0,
                tried_stricter: 0,
                tried_looser: 0,
                rejected: 0,
                hold: 0,
                last: Measurement::default(),
                sequences: 1,
                restarts: 0,
            },
        }
    }

    /// The shortest matched context the look-ahead should read now.
    pub fn min_context(&self) -> usize {
        RUNGS[self.rung]
    }

    /// State and history.
    pub fn stats(&self) -> ControlStats {
        self.stats
    }

    /// Adds a measured decode step (or several) of one sequence; every [`WINDOW`] steps the
    /// window is judged. Returns true when the threshold moved.
    pub fn record(&mut self, m: Measurement) -> bool {
        self.record_batch(1, m)
    }

    /// [`Controller::record`] for steps that decode `sequences` sequences together: a width
    /// other than the window's restarts it (see the module docs).
    pub fn record_batch(&mut self, sequences: usize, m: Measurement) -> bool {
        let mut moved = false;
        if sequences != self.sequences {
            self.sequences = sequences;
            self.window = Measurement::default();
            if let Some(t) = self.trial.take() {
                moved = t.from != self.rung;
                self.rung = t.from;
            }
            self.stats.sequences = sequences;
            self.stats.restarts += 1;
            self.stats.min_context = RUNGS[self.rung];
        }
        self.window.add(&m);
        if self.window.steps < WINDOW {
            return moved;
        }
        let w = std::mem::take(&mut self.window);
        self.judge(w) || moved
    }

    /// One full window's verdict (see the module docs).
    fn judge(&mut self, w: Measurement) -> bool {
        let before = self.rung;
        self.stats.windows += 1;
        self.stats.last = w;
        let t = w.step_seconds();
        if let Some(trial) = self.trial.take() {
            if t < trial.step_seconds {
                self.backoff = 1;
            } else {
                self.rung = trial.from;
                self.stats.rejected += 1;
                self.backoff = (self.backoff * 2).min(MAX_HOLD);
                self.hold = self.backoff;
            }
        } else if self.hold > 0 {
            self.hold -= 1;
        } else if w.busy() >= SATURATED && w.wasted > 0 && self.rung + 1 < RUNGS.len() {
            self.trial = Some(Trial {
                from: self.rung,
                step_seconds: t,
            });
            self.rung += 1;
            self.stats.tried_stricter += 1;
        } else if w.busy() < SATURATED && w.wait() >= SERIAL_WAIT && self.rung > 0 {
            self.trial = Some(Trial {
                from: self.rung,
                step_seconds: t,
            });
            self.rung -= 1;
            self.stats.tried_looser += 1;
        }
        self.stats.min_context = RUNGS[self.rung];
        self.stats.hold = self.hold;
        self.rung != before
    }

    /// Where the controller settles on a machine whose every window at rung `min_context`
    /// measures `at(min_context)` (a model, without noise): runs `windows` windows and returns
    /// the rung it spent most of them on (ties: the later one) and, per rung, the windows spent
    /// there. Used by the projection, so that it reports what the runtime would do.
    pub fn settle(
        mut self,
        windows: usize,
        mut at: impl FnMut(usize) -> Measurement,
    ) -> (usize, Vec<(usize, usize)>) {
        let mut spent = vec![0usize; RUNGS.len()];
        for _ in 0..windows {
            spent[self.rung] += 1;
            let m = at(self.min_context());
            self.judge(m);
        }
        let best = (0..RUNGS.len()).max_by_key(|&r| (spent[r], r)).unwrap_or(0);
        let per = (0..RUNGS.len())
            .filter(|&r| spent[r] > 0)
            .map(|r| (RUNGS[r], spent[r]))
            .collect();
        (RUNGS[best], per)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A modelled machine: at each threshold, a window of `WINDOW` steps taking `t(n)` seconds
    /// each, the disk busy `busy(n)` of the time, compute waiting `wait(n)`, 2 % of reads wasted.
    fn window(t: f64, busy: f64, wait: f64) -> Measurement {
        Measurement {
            steps: WINDOW,
            seconds: t * WINDOW as f64,
            busy_seconds: busy * t * WINDOW as f64,
            wait_seconds: wait * t * WINDOW as f64,
            reads: 1000,
            wasted: 20,
        }
    }

    #[test]
    fn a_saturated_disk_makes_it_stricter_until_stricter_stops_paying() {
        // Disk-bound: step time = (1 + waste) × disk time, waste falling with the threshold
        // until 32; with no look-ahead (64) the serial path binds and it is slower.
        let t = |n: usize| match n {
            2 => 1.06,
            4 => 1.04,
            8 => 1.03,
            16 => 1.01,
            32 => 1.00,
            _ => 1.25,
        };
        let (settled, spent) =
            Controller::new(8).settle(200, |n| window(t(n), if n < 64 { 1.0 } else { 0.8 }, 0.2));
        assert_eq!(settled, 32, "{spent:?}");
        // It probed 64 and came back, with growing holds: few windows there.
        let at64 = spent.iter().find(|x| x.0 == 64).map_or(0, |x| x.1);
        assert!((1..=8).contains(&at64), "{spent:?}");
    }

    #[test]
    fn compute_waiting_on_serial_misses_makes_it_looser() {
        // Serial-bound: the disk idles, compute waits; more (earlier) reads shorten the step.
        let t = |n: usize| match n {
            2 => 0.30,
            4 => 0.28,
            8 => 0.29,
            _ => 0.33,
        };
        let (settled, _) = Controller::new(16).settle(200, |n| window(t(n), 0.7, 0.2));
        assert_eq!(settled, 4);
    }

    #[test]
    fn it_holds_where_nothing_is_measured_to_pay() {
        // Busy but no waste, or idle with no wait: no trial at all.
        let mut c = Controller::new(8);
        for _ in 0..100 {
            let mut m = window(1.0, 1.0, 0.5);
            m.wasted = 0;
            assert!(!c.record(m));
            assert!(!c.record(window(1.0, 0.5, 0.01)));
        }
        assert_eq!((c.min_context(), c.stats().windows), (8, 200));
        // A window is WINDOW steps: fewer steps judge nothing.
        let mut c = Controller::new(8);
        for _ in 1..WINDOW {
            c.record(Measurement {
                steps: 1,
                ..window(1.0, 1.0, 0.0)
            });
        }
        assert_eq!(c.stats().windows, 0);
    }

    #[test]
    fn a_change_of_batch_width_restarts_the_window_and_abandons_a_trial() {
        // Idle disk, compute waiting: the first full window proposes a looser trial.
        let serial = window(1.0, 0.5, 0.2);
        let mut c = Controller::new(8);
        assert!(c.record(serial));
        assert_eq!(c.min_context(), 4);
        // Two sequences a step from here: the trial's reference was one sequence's steps, so
        // it goes back unjudged; and WINDOW - 1 two-sequence steps judge nothing yet.
        let step = Measurement {
            steps: 1,
            ..window(2.0, 0.5, 0.2)
        };
        assert!(c.record_batch(2, step));
        assert_eq!(
            (c.min_context(), c.stats().restarts, c.stats().sequences),
            (8, 1, 2)
        );
        for _ in 2..WINDOW {
            assert!(!c.record_batch(2, step));
        }
        assert_eq!(c.stats().windows, 1);
        // The WINDOW-th is a full window of its own width: judged (a new trial, looser).
        assert!(c.record_batch(2, step));
        assert_eq!((c.stats().windows, c.min_context()), (2, 4));
        // A one-sequence step drops the partial window again; steps of the same width never do.
        c.record(Measurement { steps: 1, ..serial });
        assert_eq!((c.stats().restarts, c.stats().sequences), (2, 1));
    }

    #[test]
    fn the_same_measurements_give_the_same_moves() {
        let feed = |c: &mut Controller| -> Vec<usize> {
            (0..300)
                .map(|i| {
                    // A deterministic pseudo-random walk of step times and busy fractions.
                    let x = ((i * 7919) % 101) as f64 / 100.0;
                    c.record(window(0.5 + 0.5 * x, 0.6 + 0.4 * x, 0.1 * x));
                    c.min_context()
                })
                .collect()
        };
        let (mut a, mut b) = (Controller::new(8), Controller::new(8));
        let (ta, tb) = (feed(&mut a), feed(&mut b));
        assert_eq!(ta, tb);
        assert_eq!(a, b);
        assert!(ta.iter().any(|&n| n != 8), "the walk never moved it");
    }
}
