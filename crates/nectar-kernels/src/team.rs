//! The compute team: the threads that run the short parallel regions of a forward (a matrix's
//! row blocks, attention heads, a layer's experts).
//!
//! Why not rayon: a decode step of a small model forks about 25 times, each region 10–200 µs of
//! work, with a little serial work between. Rayon's idle workers sleep after a few dozen yields,
//! so every region paid a futex wake of a halted thread (14 context switches per token at 2
//! threads against 0.1 at 1), which cost about what the second thread saved. Here an idle worker
//! polls (pause instructions, and a `sched_yield` every few µs so that it gives way on a busy
//! core) for [`SPIN`] after the last region it saw before it parks, so within a step, and from
//! one token to the next, it is already running when the next region opens; an idle server's
//! workers park a few milliseconds after its last step.
//!
//! Why it cannot deadlock: a region is owned by one thread (the one that called
//! [`Team::start`]); it publishes the region, runs tasks itself, and then waits only for tasks
//! that a worker has already claimed. Everything that runs inside a task (on the owner or a
//! worker) that asks for parallelism runs inline, so a task never waits for anything — a worker
//! never holds up a region by sitting in another one (what the rayon yield loop tried before did).
//! A worker that is parked or slow to wake just joins late or not at all: the owner runs the
//! tasks nobody claimed.
//!
//! Threads that own no team (tests, `nectar bench`'s per-thread-count pools, rayon workers) get
//! rayon's pool as before; only the owner thread dispatches to its team.
use rayon::prelude::*;
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker keeps polling for the next region before it parks. Longer than the
/// serial gaps of a step and than the time between tokens (sampling, output), so a generating
/// model never parks its workers; short enough that an idle server stops burning CPU at once.
pub const SPIN: Duration = Duration::from_millis(2);

/// Pause instructions between two `sched_yield`s of a waiting thread (a few µs). The yield
/// costs nothing on an idle core and hands the core over where other threads wait for it: on a
/// busy machine a thread that only spun would take the time its own team (or anyone) needed.
const SPINS_PER_YIELD: u32 = 64;

/// Yields between two reads of the clock by an idle worker.
const YIELDS_PER_CHECK: u32 = 4;

/// One parallel region: tasks `0..n` of `f`, claimed one at a time.
struct Region<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
    /// A worker's panic, re-raised by the owner once the region is closed.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Region<'_> {
    /// Claims and runs tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            (self.f)(i);
        }
    }
}

/// What the owner and its workers share.
struct Shared {
    /// The open region, or null. Its lifetime is erased: it lives on the owner's stack, and the
    /// owner does not return from [`run`] before every worker that may have read this pointer
    /// has let go of it (`active` back to 0 after the pointer was cleared).
    region: AtomicPtr<Region<'static>>,
    /// Regions opened so far: a worker joins each one once.
    epoch: AtomicU64,
    /// Workers between reading `region` and being done with it.
    active: AtomicUsize,
    /// Workers parked (or about to) on `wake`.
    sleepers: AtomicUsize,
    /// Times a worker parked (for [`stats`]).
    parks: AtomicU64,
    lock: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
}

thread_local! {
    /// The team this thread owns, if any.
    static OWNED: RefCell<Option<Arc<Shared>>> = const { RefCell::new(None) };
    /// Threads of the owned team (1 when none).
    static OWNED_THREADS: Cell<usize> = const { Cell::new(1) };
    /// Whether this thread is running a team task (a worker always is): nested requests for
    /// parallelism run inline.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// A running team, owned by the thread that started it; dropping it stops and joins the
/// workers. Not `Send`: the team belongs to its owner thread.
pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    _owner: PhantomData<*const ()>,
}

impl Team {
    /// Makes the calling thread the owner of a team of `threads` threads (itself and
    /// `threads - 1` workers): from now on its parallel kernel calls and [`for_each`] run on
    /// the team. `threads <= 1` starts no worker (everything then runs on the caller).
    pub fn start(threads: usize) -> std::io::Result<Team> {
        let shared = Arc::new(Shared {
            region: AtomicPtr::new(ptr::null_mut()),
            epoch: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            parks: AtomicU64::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let mut team = Team {
            shared: shared.clone(),
            workers: Vec::new(),
            _owner: PhantomData,
        };
        for i in 1..threads.max(1) {
            let s = shared.clone();
            // On failure `team` is dropped, which stops the workers already started.
            let h = std::thread::Builder::new()
                .name(format!("nectar-team-{i}"))
                .spawn(move || worker(&s))?;
            team.workers.push(h);
        }
        OWNED.with(|o| *o.borrow_mut() = Some(shared));
        OWNED_THREADS.with(|t| t.set(threads.max(1)));
        Ok(team)
    }

    /// Threads of this team, the owner included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        OWNED.with(|o| {
            let mut o = o.borrow_mut();
            if o.as_ref().is_some_and(|s| Arc::ptr_eq(s, &self.shared)) {
                *o = None;
                OWNED_THREADS.with(|t| t.set(1));
            }
        });
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self
                .shared
                .lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            // A worker never panics outside a task (tasks' panics are caught), so this is Ok.
            let _ = h.join();
        }
    }
}

/// What the team this thread owns has done so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Threads, the owner included.
    pub threads: usize,
    /// Parallel regions run on the team (a region is a [`for_each`] with more than one task
    /// made by the owner outside a task).
    pub regions: u64,
    /// Times a worker parked after [`SPIN`] without a region (and so had to be woken).
    pub parks: u64,
}

/// The statistics of the team this thread owns, if it owns one.
pub fn stats() -> Option<Stats> {
    OWNED.with(|o| {
        o.borrow().as_ref().map(|s| Stats {
            threads: OWNED_THREADS.with(Cell::get),
            regions: s.epoch.load(Ordering::Relaxed),
            parks: s.parks.load(Ordering::Relaxed),
        })
    })
}

/// Threads a parallel call made here can use: the owned team's size on its owner, 1 inside a
/// team task (it runs inline), otherwise the current rayon pool's.
pub fn threads() -> usize {
    if IN_TASK.with(Cell::get) {
        return 1;
    }
    match OWNED_THREADS.with(Cell::get) {
        1 if OWNED.with(|o| o.borrow().is_none()) => rayon::current_num_threads(),
        n => n,
    }
}

/// Runs `f(0)`, …, `f(n - 1)`, in parallel where this thread can: on its team if it owns one,
/// inline inside a team task, on the current rayon pool otherwise. Returns when all are done;
/// re-raises a task's panic.
pub fn for_each(n: usize, f: impl Fn(usize) + Sync + Send) {
    if n == 0 {
        return;
    }
    if n == 1 || IN_TASK.with(Cell::get) {
        (0..n).for_each(f);
        return;
    }
    let team = OWNED.with(|o| o.borrow().clone());
    match team {
        Some(s) if OWNED_THREADS.with(Cell::get) > 1 => run(&s, n, &f),
        Some(_) => (0..n).for_each(f),
        None => (0..n).into_par_iter().for_each(f),
    }
}

/// `f(0..n)` in parallel as [`for_each`], results in index order.
pub fn map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    let slots: Vec<Mutex<Option<T>>> = (0..n).map(|_| Mutex::new(None)).collect();
    for_each(n, |i| {
        let y = f(i);
        *slots[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(y);
    });
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .unwrap_or_else(PoisonError::into_inner)
                .expect("for_each ran every index")
        })
        .collect()
}

/// Runs `f(k, chunk)` for every `chunk`-element chunk `k` of `data` (the last may be shorter)
/// in parallel, as [`for_each`].
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    assert!(chunk > 0, "chunk size 0");
    let len = data.len();
    let base = SendPtr(data.as_mut_ptr());
    for_each(len.div_ceil(chunk), |k| {
        let start = k * chunk;
        let n = chunk.min(len - start);
        // SAFETY: chunk k covers `start..start + n` of `data`, inside it and disjoint from
        // every other chunk; `data` is borrowed mutably for the whole call, and `for_each`
        // returns only after every task has finished.
        let s = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), n) };
        f(k, s);
    });
}

/// [`for_each_chunk_mut`] over row-sized chunks when there are at least [`PARALLEL_ROWS`] of
/// them, else in order on this thread: a decode step's few rows are not worth waking the team
/// for (each region costs every worker a wake-up).
pub fn for_each_row_mut<T: Send>(
    data: &mut [T],
    row: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    assert!(row > 0, "row size 0");
    match data.len() / row >= PARALLEL_ROWS {
        true => for_each_chunk_mut(data, row, f),
        false => data.chunks_mut(row).enumerate().for_each(|(i, r)| f(i, r)),
    }
}

/// Rows from which [`for_each_row_mut`] runs on the team.
pub const PARALLEL_ROWS: usize = 16;

/// A raw pointer that tasks share; each task uses a disjoint part.
struct SendPtr<T>(*mut T);
impl<T> SendPtr<T> {
    /// (A method, so closures capture the whole `Sync` wrapper, not the field.)
    fn get(&self) -> *mut T {
        self.0
    }
}
// SAFETY: used only by `for_each_chunk_mut`, whose tasks touch disjoint elements of a slice of
// `T: Send` that outlives them.
unsafe impl<T: Send> Sync for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SendPtr<T> {}

/// Marks the current thread as running a team task until dropped (restoring what it was).
struct InTask(bool);
impl InTask {
    fn enter() -> InTask {
        InTask(IN_TASK.with(|t| t.replace(true)))
    }
}
impl Drop for InTask {
    fn drop(&mut self) {
        IN_TASK.with(|t| t.set(self.0));
    }
}

/// The owner's side of a region.
fn run(s: &Shared, n: usize, f: &(dyn Fn(usize) + Sync)) {
    let region = Region {
        f,
        n,
        next: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    // SAFETY (of the erased lifetime): see `Shared::region`; the pointer is cleared and every
    // worker that read it has finished with it before `region` goes out of scope below.
    let p = (&region as *const Region<'_>)
        .cast_mut()
        .cast::<Region<'static>>();
    s.region.store(p, Ordering::SeqCst);
    s.epoch.fetch_add(1, Ordering::SeqCst);
    // A worker registers as a sleeper before it re-checks the epoch (both SeqCst), so either it
    // sees this region or this sees it asleep and wakes it (under the lock it holds until it
    // waits: no lost wake-up).
    if s.sleepers.load(Ordering::SeqCst) > 0 {
        let _g = s.lock.lock().unwrap_or_else(PoisonError::into_inner);
        s.wake.notify_all();
    }
    let own = {
        let _t = InTask::enter();
        catch_unwind(AssertUnwindSafe(|| region.work()))
    };
    // Close: no worker reads the pointer after this store; those that read it before have
    // raised `active` before reading (SeqCst on both sides), so waiting for 0 covers them.
    s.region.store(ptr::null_mut(), Ordering::SeqCst);
    let mut spins = 0u32;
    while s.active.load(Ordering::SeqCst) != 0 {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(SPINS_PER_YIELD) {
            // A worker descheduled in mid-task (a busy machine): give it the core.
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    if let Err(e) = own {
        resume_unwind(e);
    }
    let worker_panic = region
        .panic
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(e) = worker_panic {
        resume_unwind(e);
    }
}

/// A worker: waits for a region (spinning, then parked), joins it, repeats until stopped.
fn worker(s: &Shared) {
    // Everything a worker runs is a team task: nested parallel calls run inline.
    let _t = InTask::enter();
    let mut seen = 0u64;
    loop {
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(SPINS_PER_YIELD) {
                std::hint::spin_loop();
            } else if spins.is_multiple_of(SPINS_PER_YIELD * YIELDS_PER_CHECK)
                && idle_since.elapsed() > SPIN
            {
                park(s, seen);
                idle_since = Instant::now();
            } else {
                std::thread::yield_now();
            }
        }
        s.active.fetch_add(1, Ordering::SeqCst);
        let r = s.region.load(Ordering::SeqCst);
        if !r.is_null() {
            // SAFETY: the owner keeps the region alive until `active` is back to 0 after it
            // cleared the pointer, and this worker raised `active` before reading it.
            let r = unsafe { &*r };
            if let Err(e) = catch_unwind(AssertUnwindSafe(|| r.work())) {
                // Stop the others claiming more of a failed region, and hand the panic over.
                r.next.store(r.n, Ordering::Relaxed);
                *r.panic.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Parks until a region after `seen` opens or the team stops.
fn park(s: &Shared, seen: u64) {
    let mut g = s.lock.lock().unwrap_or_else(PoisonError::into_inner);
    s.parks.fetch_add(1, Ordering::Relaxed);
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    while s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
        g = s.wake.wait(g).unwrap_or_else(PoisonError::into_inner);
    }
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Each index runs exactly once, on the team, for many regions in a row (races between a
    /// region's close and the next one's open would lose or repeat indices, or crash).
    #[test]
    fn every_index_runs_once_in_many_regions() {
        let team = Team::start(3).unwrap();
        assert_eq!(team.threads(), 3);
        assert_eq!(threads(), 3);
        for round in 0..5_000usize {
            let n = 1 + round % 17;
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            for_each(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
        }
    }

    /// The workers really take part: a region whose tasks wait for each other finishes only if
    /// two threads run them at once.
    #[test]
    fn workers_run_tasks_alongside_the_owner() {
        let _team = Team::start(2).unwrap();
        let arrived = AtomicU32::new(0);
        for_each(2, |_| {
            arrived.fetch_add(1, Ordering::SeqCst);
            while arrived.load(Ordering::SeqCst) < 2 {
                std::hint::spin_loop();
            }
        });
        assert_eq!(arrived.load(Ordering::SeqCst), 2);
    }

    /// A worker that parked (idle longer than SPIN) wakes for the next region; regions and
    /// parks are counted.
    #[test]
    fn parked_workers_wake_for_the_next_region() {
        assert_eq!(stats(), None);
        let _team = Team::start(2).unwrap();
        for_each(1, |_| {});
        map(3, |i| i);
        assert_eq!(
            stats().unwrap().regions,
            1,
            "one task runs without a region"
        );
        for _ in 0..3 {
            std::thread::sleep(SPIN * 5);
            let arrived = AtomicU32::new(0);
            for_each(2, |_| {
                arrived.fetch_add(1, Ordering::SeqCst);
                while arrived.load(Ordering::SeqCst) < 2 {
                    std::hint::spin_loop();
                }
            });
        }
        // (Whether the worker parked in each pause depends on the scheduler: not asserted.)
        let st = stats().unwrap();
        assert_eq!((st.threads, st.regions), (2, 4));
    }

    /// Parallel calls inside a task run inline (one thread there), so nesting cannot wait on
    /// the team; results come back in index order.
    #[test]
    fn nested_calls_run_inline_and_map_keeps_order() {
        let _team = Team::start(2).unwrap();
        let out = map(8, |i| {
            assert_eq!(threads(), 1);
            let inner = map(4, |j| i * 10 + j);
            inner.iter().sum::<usize>()
        });
        let want: Vec<usize> = (0..8).map(|i| 4 * i * 10 + 6).collect();
        assert_eq!(out, want);
        assert_eq!(threads(), 2);
    }

    /// Chunks cover the slice once, the last one short.
    #[test]
    fn chunks_cover_the_slice() {
        let _team = Team::start(2).unwrap();
        let mut v = vec![0usize; 103];
        for_each_chunk_mut(&mut v, 10, |k, c| {
            assert!(c.len() == 10 || (k == 10 && c.len() == 3));
            for x in c.iter_mut() {
                *x += k + 1;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| x == i / 10 + 1));
    }

    /// Rows are visited once each with their index, below and above the parallel threshold.
    #[test]
    fn rows_cover_the_slice_either_way() {
        let _team = Team::start(2).unwrap();
        for rows in [3, PARALLEL_ROWS, 40] {
            let mut v = vec![0usize; rows * 7];
            for_each_row_mut(&mut v, 7, |i, r| {
                assert_eq!(r.len(), 7);
                r.iter_mut().for_each(|x| *x += i + 1);
            });
            assert!(
                v.iter().enumerate().all(|(j, &x)| x == j / 7 + 1),
                "{rows} rows"
            );
        }
    }

    /// A task's panic reaches the owner, and the team still works afterwards.
    #[test]
    fn a_task_panic_reaches_the_owner() {
        let _team = Team::start(2).unwrap();
        for bad in [0, 5] {
            let r = catch_unwind(|| {
                for_each(8, |i| {
                    if i == bad {
                        panic!("task {i}");
                    }
                })
            });
            assert!(r.is_err());
        }
        let n = AtomicU32::new(0);
        for_each(8, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }

    /// Without a team (or after it is dropped) calls go to rayon, with rayon's thread count.
    #[test]
    fn without_a_team_rayon_runs_it() {
        {
            let _team = Team::start(2).unwrap();
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        pool.install(|| {
            assert_eq!(threads(), 3);
            let v = map(5, |i| i * i);
            assert_eq!(v, vec![0, 1, 4, 9, 16]);
        });
    }
}
