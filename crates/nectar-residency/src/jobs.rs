//! The I/O workers' queue, in two classes: reads a wave is waiting for (demand) go before
//! reads started ahead of their request (prefetch), so a look-ahead read never delays a miss
//! that compute is blocked on. A prefetch that its wave requests while still queued is moved
//! to the demand class.
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
    closed: bool,
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
            q.ahead.push_back(job);
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
        match q.ahead.iter().position(|j| j.slot == slot) {
            Some(i) => {
                let job = q.ahead.remove(i).expect("position is in range");
                q.demand.push_back(job);
                true
            }
            None => false,
        }
    }

    /// The next read (demand first), waiting for one; `None` once closed and drained.
    pub fn pop(&self) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if let Some(j) = q.demand.pop_front().or_else(|| q.ahead.pop_front()) {
                return Some(j);
            }
            if q.closed {
                return None;
            }
            q = self.cond.wait(q).unwrap_or_else(|p| p.into_inner());
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
        let order: Vec<usize> = std::iter::from_fn(|| q.pop()).map(|j| j.slot).collect();
        assert_eq!(order, [3, 4, 1, 2]);
    }

    #[test]
    fn workers_stop_once_closed_and_drained() {
        let q = std::sync::Arc::new(Jobs::default());
        let w = {
            let q = q.clone();
            std::thread::spawn(move || std::iter::from_fn(|| q.pop()).count())
        };
        q.push(job(1), false);
        q.push(job(2), true);
        q.close();
        assert_eq!(w.join().unwrap(), 2);
    }
}
