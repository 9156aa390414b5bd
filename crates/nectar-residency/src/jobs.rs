//! The I/O workers' queue, in two classes: reads a wave is waiting for (demand) go before
//! reads started ahead of their request (prefetch), and a prefetch starts only while no other
//! read is running — it fills the disk's idle time (a layer's attention, the compute after its
//! last read), one at a time: a whole expert is one large read that the device already serves
//! at its full rate, so a second one beside it would only delay the first, and while it waits
//! in the queue the layer's router can still cancel it ([`Jobs::cancel`]). A prefetch that its wave requests while still queued is moved
//! to the demand class; one its layer did not request is cancelled before it starts
//! ([`Jobs::cancel`]). Prefetches start in layer order.
use crate::policy::ExpertKey;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

/// One expert read into one slot at one generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Job {
    pub slot: usize,
    pub gen: u64,
    pub key: ExpertKey,
}

#[derive(Debug, Default)]
struct Queues {
    demand: VecDeque<Job>,
    ahead: VecDeque<Job>,
    /// Demand reads popped and not yet [`Jobs::finished`].
    demand_running: usize,
    /// Prefetch reads popped and not yet finished.
    ahead_running: usize,
    closed: bool,
}

impl Queues {
    /// The queued (not started) prefetch into `slot`, taken out of the queue.
    fn take_ahead(&mut self, slot: usize) -> Option<Job> {
        let i = self.ahead.iter().position(|j| j.slot == slot)?;
        self.ahead.remove(i)
    }
}

/// A two-class blocking queue shared by the I/O workers.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    q: Mutex<Queues>,
    cond: Condvar,
}

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a read: `ahead` for a prefetch, else a demand read.
    pub fn push(&self, job: Job, ahead: bool) {
        let mut q = self.lock();
        if ahead {
            // Prefetches start in layer order (the order compute will need them), arrival
            // order within a layer: look-ahead plans a whole step at its start, PILOT the next
            // layer as each layer runs, and the nearer layer's read must not wait behind the
            // plan's later ones.
            let n = q.ahead.len();
            let at = q.ahead.iter().position(|j| j.key.layer > job.key.layer);
            q.ahead.insert(at.unwrap_or(n), job);
        } else {
            q.demand.push_back(job);
        }
        drop(q);
        self.cond.notify_one();
    }

    /// A wave now waits for the prefetch into `slot`: if its read has not started, it moves to
    /// the back of the demand class. Returns whether it was still queued.
    pub fn promote(&self, slot: usize) -> bool {
        let mut q = self.lock();
        let Some(job) = q.take_ahead(slot) else {
            return false;
        };
        q.demand.push_back(job);
        drop(q);
        // A worker may be waiting with only prefetches queued.
        self.cond.notify_one();
        true
    }

    /// Removes the prefetch into `slot` if its read has not started. Returns whether it was
    /// still queued (a started read runs to its end).
    pub fn cancel(&self, slot: usize) -> bool {
        self.lock().take_ahead(slot).is_some()
    }

    /// The next read, waiting for one: a demand read, else a prefetch once no read is running
    /// (or the queue is closed); `None` once closed and drained. With `true`, the read is a
    /// demand read. Tell [`Jobs::finished`] when either is done.
    pub fn pop(&self) -> Option<(Job, bool)> {
        let mut q = self.lock();
        loop {
            if let Some(j) = q.demand.pop_front() {
                q.demand_running += 1;
                return Some((j, true));
            }
            if (q.demand_running == 0 && q.ahead_running == 0) || q.closed {
                if let Some(j) = q.ahead.pop_front() {
                    q.ahead_running += 1;
                    return Some((j, false));
                }
            }
            if q.closed && q.demand.is_empty() && q.ahead.is_empty() {
                return None;
            }
            q = self.cond.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A read [`Jobs::pop`] handed out (`demand` as it said) is done: with none left running,
    /// a prefetch may start.
    pub fn finished(&self, demand: bool) {
        let mut q = self.lock();
        let running = match demand {
            true => &mut q.demand_running,
            false => &mut q.ahead_running,
        };
        *running = running.saturating_sub(1);
        let idle = q.demand_running == 0 && q.ahead_running == 0 && !q.ahead.is_empty();
        drop(q);
        if idle {
            self.cond.notify_all();
        }
    }

    /// No more reads: workers drain the queue and stop.
    pub fn close(&self) {
        self.lock().closed = true;
        self.cond.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(slot: usize) -> Job {
        Job {
            slot,
            gen: 1,
            key: ExpertKey::new(0, slot),
        }
    }

    #[test]
    fn demand_reads_go_first_and_a_requested_prefetch_is_promoted() {
        let q = Jobs::default();
        q.push(job(1), true);
        q.push(job(2), true);
        q.push(job(3), false);
        q.push(job(4), true);
        assert!(q.promote(4));
        assert!(!q.promote(3), "a demand read is not a prefetch");
        assert!(!q.promote(9));
        q.close();
        let order: Vec<usize> = std::iter::from_fn(|| q.pop()).map(|j| j.0.slot).collect();
        assert_eq!(order, [3, 4, 1, 2]);
    }

    #[test]
    fn a_prefetch_waits_while_a_demand_read_runs() {
        let q = std::sync::Arc::new(Jobs::default());
        q.push(job(1), false);
        q.push(job(2), true);
        assert_eq!(q.pop().map(|(j, d)| (j.slot, d)), Some((1, true)));
        // A second worker that must still be waiting after 100 ms (its pop: slot, demand).
        let waiting = |why: &str| {
            let q = q.clone();
            let w = std::thread::spawn(move || q.pop().map(|(j, d)| (j.slot, d)));
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(!w.is_finished(), "{why}");
            w
        };
        // It finds only the prefetch, and waits for the demand read to finish.
        let w = waiting("the prefetch started beside a demand read");
        q.finished(true);
        assert_eq!(w.join().unwrap(), Some((2, false)));
        // One prefetch at a time: the next waits for this one.
        q.push(job(3), true);
        let w = waiting("two prefetches ran at once");
        q.finished(false);
        assert_eq!(w.join().unwrap(), Some((3, false)));
    }

    #[test]
    fn prefetches_start_in_layer_order() {
        let q = Jobs::default();
        let at = |layer: usize, slot: usize| Job {
            slot,
            gen: 1,
            key: ExpertKey::new(layer, slot),
        };
        // A step's plan for layers 1–3, then the next layer's prediction made during layer 0.
        for (l, s) in [(1, 10), (2, 20), (3, 30), (3, 31)] {
            q.push(at(l, s), true);
        }
        q.push(at(1, 11), true);
        q.push(at(2, 21), true);
        q.push(at(0, 1), false);
        q.close();
        let order: Vec<usize> = std::iter::from_fn(|| q.pop()).map(|j| j.0.slot).collect();
        assert_eq!(order, [1, 10, 11, 20, 21, 30, 31]);
    }

    #[test]
    fn only_a_queued_prefetch_is_cancelled() {
        let q = Jobs::default();
        q.push(job(1), true);
        q.push(job(2), false);
        q.push(job(3), true);
        assert!(!q.cancel(2), "a demand read is never cancelled");
        assert!(q.cancel(3));
        assert!(!q.cancel(3), "already gone");
        assert_eq!(q.pop().map(|j| j.0.slot), Some(2));
        q.finished(true);
        assert_eq!(q.pop().map(|j| j.0.slot), Some(1));
        assert!(!q.cancel(1), "a started read runs to its end");
        q.close();
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn workers_stop_once_closed_and_drained() {
        let q = std::sync::Arc::new(Jobs::default());
        let w = {
            let q = q.clone();
            std::thread::spawn(move || {
                std::iter::from_fn(|| q.pop())
                    .inspect(|&(_, demand)| q.finished(demand))
                    .count()
            })
        };
        q.push(job(1), false);
        q.push(job(2), true);
        q.close();
        assert_eq!(w.join().unwrap(), 2);
    }
}
