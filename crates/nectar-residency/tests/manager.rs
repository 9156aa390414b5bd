//! The residency manager with an in-memory I/O source that can inject faults: poison-pattern
//! churn (any read of a reused slot is caught), in-flight dedup, short reads, EIO, delays,
//! lease and safe-point rules, and the capacity shrink.
use nectar_format::experts::{ExpertExtent, ExpertPart, Segment};
use nectar_format::quant::QuantFormat;
use nectar_format::DType;
use nectar_residency::io::ExpertIo;
use nectar_residency::layout::{plan, ReadOp, SlotLayout};
use nectar_residency::{Error, ExpertKey, Residency, ResidencyConfig};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const ROWS: usize = 8;
const COLS: usize = 256; // f32 experts: gate/up [8, 256], down [256, 8]

/// A byte pattern unique to (layer, expert, position).
fn pattern(layer: usize, expert: usize, i: usize) -> u8 {
    ((layer * 131 + expert * 31 + i * 7) % 251) as u8
}

struct FakeIo {
    files: Vec<Vec<u8>>,
    paths: Vec<PathBuf>,
    reads: AtomicUsize,
    fail_next: Mutex<usize>,
    short_chunks: bool,
    delay_ms: u64,
}

impl ExpertIo for FakeIo {
    fn read(&self, op: &ReadOp, dst: &mut [u8]) -> std::io::Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if self.delay_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(self.delay_ms));
        }
        {
            let mut f = self.fail_next.lock().unwrap();
            if *f > 0 {
                *f -= 1;
                return Err(std::io::Error::from_raw_os_error(5)); // EIO
            }
        }
        let file = &self.files[op.shard];
        let start = op.file_offset as usize;
        let avail = file.len().saturating_sub(start).min(op.len);
        if self.short_chunks {
            // Deliver in 1000-byte pieces, as a resumed short-read loop would.
            let mut got = 0;
            while got < avail {
                let n = 1000.min(avail - got);
                dst[got..got + n].copy_from_slice(&file[start + got..start + got + n]);
                got += n;
            }
        } else {
            dst[..avail].copy_from_slice(&file[start..start + avail]);
        }
        if avail < op.needed {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "short read",
            ));
        }
        Ok(())
    }
    fn path(&self, shard: usize) -> &Path {
        &self.paths[shard]
    }
}

/// `layers` layers of `experts` experts, each expert's gate/up/down as f32 tensors filled with
/// its pattern, laid out contiguously in one "file" (odd experts get a gap so they need three
/// reads instead of one).
fn setup(layers: usize, experts: usize) -> (FakeIo, Vec<Vec<SlotLayout>>) {
    let mut file = vec![0u8; 100]; // a header-like prefix so offsets are not 4 KiB-aligned
    let mut layouts = Vec::new();
    for l in 0..layers {
        let mut row = Vec::new();
        for e in 0..experts {
            let mut parts = Vec::new();
            for (rows, cols) in [(ROWS, COLS), (ROWS, COLS), (COLS, ROWS)] {
                let len = rows * cols * 4;
                let off = file.len();
                file.extend((0..len).map(|i| pattern(l, e, off + i)));
                if e % 2 == 1 {
                    file.extend([0u8; 8]);
                }
                parts.push(ExpertPart {
                    rows,
                    cols,
                    format: QuantFormat::Float,
                    dtype: DType::F32,
                    weight: Segment {
                        shard: 0,
                        offset: off as u64,
                        len: len as u64,
                    },
                    scales: None,
                });
            }
            let coalesced = (e % 2 == 0).then(|| Segment {
                shard: 0,
                offset: parts[0].weight.offset,
                len: parts.iter().map(|p| p.weight.len).sum(),
            });
            let ext = ExpertExtent {
                layer: l,
                expert: e,
                parts: [parts[0].clone(), parts[1].clone(), parts[2].clone()],
                coalesced,
                coalesced_scales: None,
            };
            row.push(plan(&ext).unwrap());
        }
        layouts.push(row);
    }
    let io = FakeIo {
        files: vec![file],
        paths: vec![PathBuf::from("fake-00001.safetensors")],
        reads: AtomicUsize::new(0),
        fail_next: Mutex::new(0),
        short_chunks: false,
        delay_ms: 0,
    };
    (io, layouts)
}

/// Requests experts 0–7 of layer 1 one wave each, checking every lease's bytes.
fn fill_checked(r: &Residency, layouts: &[Vec<SlotLayout>], file: &[u8]) {
    for e in 0..8 {
        let l = r.acquire(1, &[e]).unwrap().pop().unwrap().wait().unwrap();
        check_lease(&l, layouts, file);
        drop(l);
        r.end_wave().unwrap();
    }
}

/// Requests `experts` of `layer` one wave each, waiting for every read.
fn load(r: &Residency, layer: usize, experts: impl IntoIterator<Item = u32>) {
    for e in experts {
        drop(
            r.acquire(layer, &[e])
                .unwrap()
                .pop()
                .unwrap()
                .wait()
                .unwrap(),
        );
        r.end_wave().unwrap();
    }
}

fn check_lease(lease: &nectar_residency::Lease, layouts: &[Vec<SlotLayout>], file: &[u8]) {
    let k = lease.key();
    let mats = lease.mats().unwrap();
    let lay = &layouts[k.layer as usize][k.expert as usize];
    for (m, p) in mats.iter().zip(&lay.parts) {
        let _ = p;
        // Find the file bytes of this part by pattern: every byte must match the expert's pattern
        // at its file offset, which `setup` recorded in the extent; compare against the file.
        assert_eq!(m.data.len(), m.rows * m.cols * 4);
    }
    // Compare the whole weight payloads against the file.
    for (i, m) in mats.iter().enumerate() {
        let seg_off = file_offset_of(layouts, k, i);
        assert_eq!(
            m.data,
            &file[seg_off..seg_off + m.data.len()],
            "expert {k:?} part {i} bytes"
        );
    }
}

fn file_offset_of(layouts: &[Vec<SlotLayout>], k: ExpertKey, part: usize) -> usize {
    // Recover the file offset from the read ops: the part lies in one read window.
    let lay = &layouts[k.layer as usize][k.expert as usize];
    let (w_off, _) = lay.parts[part].weight;
    let r = lay
        .reads
        .iter()
        .find(|r| r.slot_offset <= w_off && w_off < r.slot_offset + r.len)
        .unwrap();
    r.file_offset as usize + (w_off - r.slot_offset)
}

fn cfg(cap: usize, working: usize) -> ResidencyConfig {
    ResidencyConfig {
        lru_per_layer: vec![cap; 4],
        working_slots: working,
        prefetch_slots: 0,
        io_threads: 3,
        pinned: vec![],
        mlock: false,
        admission: nectar_residency::Admission::Lru,
        lookahead: false,
    }
}

#[test]
fn churn_with_poison_patterns_never_reads_a_reused_slot() {
    let (io, layouts) = setup(4, 12);
    let file = io.files[0].clone();
    let io = Arc::new(io);
    let r = Residency::new(cfg(2, 8), layouts.clone(), io.clone()).unwrap();
    let mut seed = 12345u64;
    for _ in 0..1500 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let layer = (seed >> 40) as usize % 4;
        let mut experts: Vec<u32> = (0..4).map(|i| ((seed >> (8 * i)) % 12) as u32).collect();
        experts.sort_unstable();
        experts.dedup();
        let pend = r.acquire(layer, &experts).unwrap();
        let leases: Vec<_> = pend.into_iter().map(|p| p.wait().unwrap()).collect();
        for l in &leases {
            check_lease(l, &layouts, &file);
        }
        drop(leases);
        r.end_wave().unwrap();
    }
    let t = r.telemetry();
    let evictions: u64 = t.layers.iter().map(|l| l.evictions).sum();
    assert!(
        evictions > 1000,
        "the test must force many evictions: {evictions}"
    );
    assert_eq!(t.occupancy.free, 8, "working bank back to baseline");
    assert!(t.occupancy.lru <= 8);
    assert!(t.hit_rate() > 0.0);
}

#[test]
fn duplicate_requests_share_one_read_and_hits_do_not_read() {
    let (io, layouts) = setup(2, 4);
    let io = Arc::new(io);
    let r = Residency::new(cfg(4, 8), layouts, io.clone()).unwrap();
    let p = r.acquire(1, &[3, 3, 2]).unwrap();
    let l: Vec<_> = p.into_iter().map(|p| p.wait().unwrap()).collect();
    assert_eq!(l[0].slot(), l[1].slot());
    let reads_after_first = io.reads.load(Ordering::SeqCst);
    drop(l);
    r.end_wave().unwrap();
    let p = r.acquire(1, &[2, 3]).unwrap();
    assert!(p.iter().all(|p| p.is_ready()));
    drop(p.into_iter().map(|p| p.wait().unwrap()).collect::<Vec<_>>());
    r.end_wave().unwrap();
    assert_eq!(
        io.reads.load(Ordering::SeqCst),
        reads_after_first,
        "hits read nothing"
    );
    let t = r.telemetry();
    assert_eq!((t.layers[1].hits, t.layers[1].misses), (3, 2));
}

#[test]
fn eio_fails_the_request_names_it_and_accounting_recovers() {
    let (io, layouts) = setup(2, 4);
    *io.fail_next.lock().unwrap() = 1;
    let io = Arc::new(io);
    let r = Residency::new(cfg(2, 4), layouts, io.clone()).unwrap();
    let before = r.telemetry().occupancy;
    let mut p = r.acquire(1, &[2]).unwrap();
    let e = p.pop().unwrap().wait().err().unwrap();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::Read {
                layer: 1,
                expert: 2,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("fake-00001.safetensors") && msg.contains("offset"),
        "{msg}"
    );
    r.end_wave().unwrap();
    let after = r.telemetry();
    assert_eq!(after.occupancy.free, before.free);
    assert_eq!(after.read_errors, 1);
    // The engine keeps serving: the same expert loads on the next request.
    let l = r.acquire(1, &[2]).unwrap().pop().unwrap().wait().unwrap();
    l.mats().unwrap();
}

#[test]
fn short_reads_and_slow_disks_deliver_correct_bytes() {
    let (mut io, layouts) = setup(2, 6);
    io.short_chunks = true;
    io.delay_ms = 5;
    let file = io.files[0].clone();
    let r = Residency::new(cfg(1, 6), layouts.clone(), Arc::new(io)).unwrap();
    let p = r.acquire(0, &[0, 1, 2, 3, 4, 5]).unwrap();
    for l in p.into_iter().map(|p| p.wait().unwrap()) {
        check_lease(&l, &layouts, &file);
    }
    r.end_wave().unwrap();
    // Truncated file: a read that cannot deliver the bytes errors instead of returning zeros.
    let (mut io, layouts) = setup(1, 2);
    let cut = io.files[0].len() - 50;
    io.files[0].truncate(cut);
    let r = Residency::new(cfg(1, 2), layouts, Arc::new(io)).unwrap();
    let e = r
        .acquire(0, &[1])
        .unwrap()
        .pop()
        .unwrap()
        .wait()
        .err()
        .unwrap();
    assert!(e.to_string().contains("short read"), "{e}");
}

#[test]
fn threads_waiting_together_count_their_wait_once() {
    // Three misses on a slow disk, each waited for on its own thread (as a GPU copy thread and
    // the CPU's experts wait side by side): the time waited is the wall time some thread was
    // waiting, never the sum of the three (which would exceed the decode's own time).
    let (mut io, layouts) = setup(1, 3);
    io.delay_ms = 200;
    let r = Residency::new(cfg(1, 3), layouts, Arc::new(io)).unwrap();
    let t0 = std::time::Instant::now();
    let pending = r.acquire(0, &[0, 1, 2]).unwrap();
    std::thread::scope(|s| {
        for p in pending {
            s.spawn(move || drop(p.wait().unwrap()));
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    r.end_wave().unwrap();
    let waited = r.telemetry().wait_seconds;
    assert!(
        waited > 0.1 && waited <= wall,
        "waited {waited} s in {wall} s"
    );
    // A ready expert costs no wait.
    let before = r.telemetry().wait_seconds;
    drop(r.acquire(0, &[2]).unwrap().pop().unwrap().wait().unwrap());
    r.end_wave().unwrap();
    assert_eq!(r.telemetry().wait_seconds, before);
}

#[test]
fn safe_point_rules_and_permanent_shrink() {
    let (io, layouts) = setup(2, 6);
    let r = Residency::new(cfg(3, 4), layouts, Arc::new(io)).unwrap();
    let l = r.acquire(0, &[1]).unwrap().pop().unwrap().wait().unwrap();
    assert!(matches!(r.end_wave(), Err(Error::LeasesAlive(1))));
    drop(l);
    r.end_wave().unwrap();
    for e in 0..6 {
        drop(r.acquire(0, &[e]).unwrap().pop().unwrap().wait().unwrap());
        r.end_wave().unwrap();
    }
    assert_eq!(r.telemetry().occupancy.lru, 3);
    assert_eq!(r.shrink_all(1).unwrap(), 2);
    assert_eq!(r.capacity(0), 1);
    for e in 0..6 {
        drop(r.acquire(0, &[e]).unwrap().pop().unwrap().wait().unwrap());
        r.end_wave().unwrap();
    }
    let t = r.telemetry();
    assert_eq!(t.occupancy.lru, 1, "the lowered capacity stays lowered");
    assert_eq!(t.occupancy.disabled, 4);
    assert_eq!(t.rss_shrinks, 1);
}

/// Records the ranges the manager gives back.
#[derive(Default)]
struct Recorder(Mutex<Vec<(usize, usize)>>);

impl nectar_residency::SlabHook for Recorder {
    fn releasing(&self, start: *const u8, len: usize) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((start as usize, len));
    }
}

/// A slab hook (the GPU tier's registration) hears of every slot before the RSS guard's shrink
/// returns its pages, and of the whole slab before it is freed — after the last lease — and a
/// lease's slot memory is the slot its expert's views lie in.
#[test]
fn the_slab_hook_hears_of_released_slots_and_of_the_slab_going_away() {
    let (io, layouts) = setup(2, 6);
    let r = Residency::new(cfg(3, 4), layouts, Arc::new(io)).unwrap();
    let hook = Arc::new(Recorder::default());
    r.set_slab_hook(hook.clone());
    let mut slots = std::collections::BTreeMap::new();
    for e in 0..6 {
        let l = r.acquire(0, &[e]).unwrap().pop().unwrap().wait().unwrap();
        let mem = l.slot_memory().unwrap();
        assert_eq!(mem.len(), r.slot_bytes());
        let (lo, hi) = (mem.as_ptr() as usize, mem.as_ptr() as usize + mem.len());
        for m in l.mats().unwrap() {
            let p = m.data.as_ptr() as usize;
            assert!(p >= lo && p + m.data.len() <= hi, "views lie in the slot");
        }
        slots.insert(l.slot(), lo);
        drop(l);
        r.end_wave().unwrap();
    }
    assert!(hook.0.lock().unwrap().is_empty(), "nothing released yet");
    assert_eq!(r.shrink_all(1).unwrap(), 2);
    let released = hook.0.lock().unwrap().clone();
    // Capacity 3 → 1 in both layers: four LRU slots out of service, each told once.
    assert_eq!(released.len(), 4, "{released:?}");
    let used: Vec<usize> = slots.values().copied().collect();
    let step = r.slot_bytes();
    for (start, len) in &released {
        assert_eq!(*len, step);
        assert!(
            used.iter().any(|u| start.abs_diff(*u) % step == 0),
            "a slot's start"
        );
    }
    assert!(
        released.iter().filter(|(s, _)| used.contains(s)).count() == 2,
        "layer 0's two coldest slots are among them"
    );
    // A lease outlives the manager's handle: the slab (and the hook's call) waits for it.
    let l = r.acquire(0, &[0]).unwrap().pop().unwrap().wait().unwrap();
    let bytes = r.slab_bytes();
    drop(r);
    assert_eq!(
        hook.0.lock().unwrap().len(),
        4,
        "the lease still holds the slab"
    );
    drop(l);
    let last = *hook.0.lock().unwrap().last().unwrap();
    assert_eq!(last.1, bytes, "the whole slab, before it is freed");
    assert_eq!(hook.0.lock().unwrap().len(), 5);
}

#[test]
fn pinned_experts_load_at_start_and_always_hit() {
    let (io, layouts) = setup(2, 4);
    let io = Arc::new(io);
    let mut c = cfg(1, 2);
    c.pinned = vec![ExpertKey::new(1, 3)];
    let r = Residency::new(c, layouts, io.clone()).unwrap();
    assert_eq!(r.telemetry().occupancy.pinned, 1);
    let n = io.reads.load(Ordering::SeqCst);
    for _ in 0..3 {
        drop(r.acquire(1, &[3]).unwrap().pop().unwrap().wait().unwrap());
        drop(r.acquire(1, &[0]).unwrap().pop().unwrap().wait().unwrap());
        r.end_wave().unwrap();
    }
    assert_eq!(r.telemetry().layers[1].hits, 3 + 2);
    // Of those, the pinned expert's three (expert 0's two LRU hits are not).
    assert_eq!(r.telemetry().layers[1].pinned_hits, 3);
    assert!(io.reads.load(Ordering::SeqCst) > n);
}

/// A guard whose readings the test sets: (rss, headroom) with a 64 GB machine ceiling.
fn guard_with(
    budget: u64,
) -> (
    nectar_residency::rss::RssGuard,
    Arc<Mutex<nectar_residency::rss::Reading>>,
) {
    use nectar_residency::rss::{Reading, RssGuard};
    let reading = Arc::new(Mutex::new(Reading::default()));
    let rd = reading.clone();
    let g = RssGuard::with_sampler(budget, Box::new(move || *rd.lock().unwrap()))
        .with_timing(std::time::Duration::ZERO, std::time::Duration::ZERO);
    (g, reading)
}

fn set(r: &Mutex<nectar_residency::rss::Reading>, rss: u64, headroom: Option<u64>) {
    *r.lock().unwrap() = nectar_residency::rss::Reading {
        rss: Some(rss),
        headroom,
        ceiling: Some(64_000_000_000),
    };
}

#[test]
fn rss_guard_shrinks_releases_and_regrows_only_when_calm() {
    use nectar_residency::rss::threshold;
    let (io, layouts) = setup(2, 8);
    let file = io.files[0].clone();
    let r = Residency::new(cfg(4, 4), layouts.clone(), Arc::new(io)).unwrap();
    let fill = |r: &Residency| fill_checked(r, &layouts, &file);
    fill(&r);
    let budget = 1_000_000_000;
    let (mut g, reading) = guard_with(budget);
    set(&reading, threshold(budget) - 1, None);
    assert_eq!(g.check(&r).unwrap(), 0);
    set(&reading, threshold(budget) + 10, None);
    assert!(g.check(&r).unwrap() >= 1);
    assert_eq!(r.capacity(1), 3);
    let t = r.telemetry();
    assert_eq!(t.occupancy.disabled, 2, "one slot per layer out of service");
    // Layer 1's slot gave its pages back; layer 0's, never written, is not counted.
    assert_eq!(
        t.released_bytes,
        r.slot_bytes() as u64,
        "their pages went back to the OS"
    );
    fill(&r);
    assert_eq!(r.telemetry().occupancy.lru, 3, "capacity stays lowered");
    assert_eq!(g.events, 1);
    // Under the limit with room for the whole cache again: capacity comes back (the calm
    // period is zero here), and the slots taken back serve the right bytes.
    set(&reading, 100_000_000, None);
    assert_eq!(g.check(&r).unwrap(), 0);
    assert_eq!(r.capacity(1), 4);
    assert_eq!(g.regrows, 1);
    fill(&r);
    assert_eq!(r.telemetry().occupancy.lru, 4);
    assert_eq!(r.telemetry().occupancy.disabled, 0);
}

#[test]
fn machine_pressure_lowers_the_limit_and_the_floor_fails_cleanly() {
    let (io, layouts) = setup(2, 8);
    let r = Residency::new(cfg(6, 4), layouts, Arc::new(io)).unwrap();
    let budget = 10_000_000_000;
    let (mut g, reading) = guard_with(budget);
    // Well under the budget, but another process took the machine's memory: RSS + headroom
    // minus the reserve (1/32 of 64 GB, capped at 1 GiB) is below RSS.
    let rss = 2_000_000_000;
    set(&reading, rss, Some(1 << 29));
    assert!(g.check(&r).unwrap() <= 6);
    assert!(g.limit < rss, "the limit follows the machine: {}", g.limit);
    assert_eq!(r.capacity(1), 1, "one slot per layer is the floor");
    // Still over at the floor: a clear error, and the cache is still usable.
    match g.check(&r) {
        Err(Error::MemoryPressure { rss: seen, limit }) => {
            assert_eq!(seen, rss);
            assert!(limit < rss);
        }
        other => panic!("expected MemoryPressure, got {other:?}"),
    }
    drop(r.acquire(1, &[3]).unwrap().pop().unwrap().wait().unwrap());
    r.end_wave().unwrap();
    // Memory is back: growth is a quarter of the configured capacity per calm period.
    set(&reading, rss, Some(40_000_000_000));
    g.check(&r).unwrap();
    assert_eq!(r.capacity(1), 3);
    g.check(&r).unwrap();
    assert_eq!(r.capacity(1), 5);
    g.check(&r).unwrap();
    assert_eq!(r.capacity(1), 6, "never above the configured capacity");
    g.check(&r).unwrap();
    assert_eq!(g.regrows, 3);
}

/// The plan of the moment (a server lending idle sequences' memory to the LRU): a lower plan
/// evicts the coldest experts and releases their slots at once, with every lease still reading
/// the right bytes after; a higher plan takes slots back empty, never above the configured
/// capacity; the RSS guard regrows only up to the plan, and a plan that rises while the guard
/// has cut a layer leaves the regrowth to the guard.
#[test]
fn the_plan_of_the_moment_lends_and_takes_back_lru_slots() {
    use nectar_residency::rss::threshold;
    let (io, layouts) = setup(2, 8);
    let file = io.files[0].clone();
    let r = Residency::new(cfg(5, 4), layouts.clone(), Arc::new(io)).unwrap();
    let fill = |r: &Residency| fill_checked(r, &layouts, &file);
    fill(&r);
    assert_eq!(r.telemetry().occupancy.lru, 5);
    // A lease alive: not a safe point.
    let l = r.acquire(1, &[7]).unwrap().pop().unwrap().wait().unwrap();
    assert!(matches!(r.set_plan(&[2, 2], 4), Err(Error::LeasesAlive(_))));
    drop(l);
    r.end_wave().unwrap();
    // Layer 1 to 2 slots: its three coldest (experts 3, 4, 5 of 3..=7) go, pages released
    // (layer 0's three, never written, are released uncounted).
    let released = r.telemetry().released_bytes;
    assert_eq!(r.set_plan(&[2, 2], 4).unwrap(), 3);
    assert_eq!((r.capacity(0), r.capacity(1)), (2, 2));
    let t = r.telemetry();
    assert_eq!(t.released_bytes - released, 3 * r.slot_bytes() as u64);
    assert_eq!((t.lru_capacity, t.lru_planned), (4, 4));
    assert_eq!(r.configured_capacity(), 2);
    // The two most recent stay resident: hits, no read.
    let reads = r.telemetry().layers[1].misses;
    load(&r, 1, [6, 7]);
    assert_eq!(r.telemetry().layers[1].misses, reads);
    // Back up: never above the configured 5, one slot at least.
    assert_eq!(r.set_plan(&[9, 0], 4).unwrap(), 1);
    assert_eq!((r.capacity(0), r.capacity(1)), (5, 1));
    fill(&r);
    assert_eq!(r.set_plan(&[5, 5], 4).unwrap(), 0);
    fill(&r);
    assert_eq!(r.telemetry().occupancy.lru, 5, "layer 1 holds five again");
    // A smaller working bank (between prompts, a wave needs fewer slots): two free slots are
    // disabled (released; the last ones, the least likely written), a wave is cut to the new
    // size, and the slots come back with it.
    let disabled = r.telemetry().occupancy.disabled;
    assert_eq!(r.set_plan(&[5, 5], 2).unwrap(), 0);
    let t = r.telemetry();
    assert_eq!((t.occupancy.free, r.max_wave()), (2, 2), "{t:?}");
    assert_eq!(t.occupancy.disabled, disabled + 2, "{t:?}");
    let wave = r.acquire(1, &[0, 1]).unwrap();
    assert!(r.acquire(1, &[2]).is_err(), "two misses fill the bank");
    drop(
        wave.into_iter()
            .map(|p| p.wait().unwrap())
            .collect::<Vec<_>>(),
    );
    r.end_wave().unwrap();
    // The bank grows back from slots the LRU gives up at the same time.
    assert_eq!(r.set_plan(&[4, 4], 4).unwrap(), 1, "layer 1's coldest");
    let t = r.telemetry();
    assert_eq!((t.occupancy.free, r.max_wave(), t.lru_planned), (4, 4, 8));
    assert_eq!(r.set_plan(&[5, 5], 9).unwrap(), 0);
    assert_eq!(r.max_wave(), 4, "never above the configured bank");
    fill(&r);
    // The guard cuts layer 1 under a plan of 5 ...
    let budget = 1_000_000_000;
    let (mut g, reading) = guard_with(budget);
    set(
        &reading,
        threshold(budget) + 2 * 2 * r.slot_bytes() as u64,
        None,
    );
    g.check(&r).unwrap();
    let cut = r.capacity(1);
    assert!(cut < 5, "{cut}");
    // ... a plan of 4 lowers nothing further, and one of 5 again leaves it to the guard ...
    r.set_plan(&[4, 4], 4).unwrap();
    r.set_plan(&[5, 5], 4).unwrap();
    assert_eq!(r.capacity(1), cut);
    let t = r.telemetry();
    assert_eq!((t.lru_capacity, t.lru_planned), (2 * cut, 10));
    // ... whose regrowth stops at the plan.
    r.set_plan(&[4, 4], 4).unwrap();
    set(&reading, 1, Some(64_000_000_000));
    for _ in 0..4 {
        g.check(&r).unwrap();
    }
    assert_eq!(r.capacity(1), 4);
    fill(&r);
    assert_eq!(r.telemetry().occupancy.lru, 4);
}

/// A cache with empty slots (a plan's loan not yet filled): the guard's cut goes below the
/// slots that hold experts, so the first cut already evicts and gives memory back — cutting
/// only empty slots freed nothing, and a process beside a fast-growing one was killed while
/// the guard took one empty slot a reading.
#[test]
fn the_guard_cuts_below_the_filled_slots() {
    use nectar_residency::rss::threshold;
    let (io, layouts) = setup(2, 8);
    let r = Residency::new(cfg(8, 4), layouts, Arc::new(io)).unwrap();
    load(&r, 1, 0..3);
    let budget = 1_000_000_000;
    let (mut g, reading) = guard_with(budget);
    set(&reading, threshold(budget) + 1, None);
    assert_eq!(g.check(&r).unwrap(), 1, "one expert evicted at once");
    assert_eq!(r.capacity(1), 2);
    assert_eq!(r.telemetry().occupancy.lru, 2);
}

#[test]
fn regrowth_waits_for_the_calm_period() {
    use nectar_residency::rss::{threshold, Reading, RssGuard};
    let (io, layouts) = setup(2, 8);
    let r = Residency::new(cfg(4, 4), layouts, Arc::new(io)).unwrap();
    load(&r, 1, 0..4);
    let budget = 1_000_000_000;
    let reading = Arc::new(Mutex::new(Reading::default()));
    let rd = reading.clone();
    let mut g = RssGuard::with_sampler(budget, Box::new(move || *rd.lock().unwrap())).with_timing(
        std::time::Duration::ZERO,
        std::time::Duration::from_secs(3600),
    );
    set(&reading, threshold(budget) + 1, None);
    g.check(&r).unwrap();
    assert_eq!(r.capacity(1), 3);
    set(&reading, 1, None);
    g.check(&r).unwrap();
    assert_eq!(r.capacity(1), 3, "no regrowth within the calm period");
}

#[test]
fn next_layer_requests_overlap_this_layers_safe_point() {
    let (io, layouts) = setup(3, 6);
    let file = io.files[0].clone();
    let r = Residency::new(cfg(2, 8), layouts.clone(), Arc::new(io)).unwrap();
    let cur: Vec<_> = r
        .acquire(0, &[1, 2])
        .unwrap()
        .into_iter()
        .map(|p| p.wait().unwrap())
        .collect();
    // Prefetch layer 1 while layer 0's leases are alive: loads start now.
    let next = r.acquire(1, &[3, 4]).unwrap();
    assert!(matches!(r.end_wave_layer(0), Err(Error::LeasesAlive(2))));
    drop(cur);
    r.end_wave_layer(0).unwrap();
    let next: Vec<_> = next.into_iter().map(|p| p.wait().unwrap()).collect();
    for l in &next {
        check_lease(l, &layouts, &file);
    }
    drop(next);
    r.end_wave_layer(1).unwrap();
    let t = r.telemetry();
    assert_eq!((t.occupancy.lru, t.occupancy.free), (4, 8));
}

fn cfg_prefetch(cap: usize, working: usize, prefetch: usize) -> ResidencyConfig {
    ResidencyConfig {
        prefetch_slots: prefetch,
        ..cfg(cap, working)
    }
}

#[test]
fn prefetched_experts_serve_requests_with_the_right_bytes() {
    let (io, layouts) = setup(2, 8);
    let file = io.files[0].clone();
    let io = Arc::new(io);
    let r = Residency::new(cfg_prefetch(4, 4, 4), layouts.clone(), io.clone()).unwrap();
    assert_eq!(r.prefetch(1, &[2, 3, 5]).unwrap(), 3);
    // Already loading: nothing new starts.
    assert_eq!(r.prefetch(1, &[2]).unwrap(), 0);
    checked_wave(&r, 1, &[2, 3], &layouts, &file);
    // Only the prefetches read: expert 2 in one coalesced read, 3 and 5 in three each.
    assert_eq!(
        io.reads.load(Ordering::SeqCst),
        7,
        "served without new reads"
    );
    let t = r.telemetry();
    let l1 = &t.layers[1];
    assert_eq!(
        (l1.prefetched, l1.prefetch_hits, l1.prefetch_dropped),
        (3, 2, 1)
    );
    assert_eq!((l1.hits, l1.misses), (2, 0));
    // The used prefetches were promoted into the LRU; the unused one left.
    assert_eq!(t.occupancy.lru, 2);
    assert_eq!(
        t.occupancy.free, 8,
        "promotion swaps roles: the working bank is whole"
    );
    let p = r.acquire(1, &[2, 3]).unwrap();
    assert!(p.iter().all(|p| p.is_ready()));
    drop(p);
    r.end_wave_layer(1).unwrap();
    assert_eq!(r.telemetry().layers[1].hits, 4);
}

#[test]
fn a_wrong_prefetch_evicts_nothing_and_never_starves_a_wave() {
    let (io, layouts) = setup(1, 16);
    let io = Arc::new(io);
    // Two LRU slots, a wave of 4, two prefetch slots.
    let r = Residency::new(cfg_prefetch(2, 4, 2), layouts, io).unwrap();
    let warm = |r: &Residency, ids: &[u32]| {
        let p = r.acquire(0, ids).unwrap();
        drop(p.into_iter().map(|p| p.wait().unwrap()).collect::<Vec<_>>());
        r.end_wave_layer(0).unwrap();
    };
    warm(&r, &[0, 1]);
    // Prefetch is capped at its slots; all three predictions are wrong.
    assert_eq!(r.prefetch(0, &[7, 8, 9]).unwrap(), 2);
    // A full wave of four misses still finds its working slots.
    warm(&r, &[10, 11, 12, 13]);
    let t = r.telemetry();
    assert_eq!(t.layers[0].prefetch_dropped, 2);
    assert_eq!(t.layers[0].prefetch_hits, 0);
    // The LRU holds what the waves admitted, never the wrong predictions.
    let p = r.acquire(0, &[12, 13]).unwrap();
    assert!(
        p.iter().all(|p| p.is_ready()),
        "the last wave's experts stayed"
    );
    drop(p);
    r.end_wave_layer(0).unwrap();
    let before = r.telemetry().layers[0].evictions;
    assert_eq!(r.prefetch(0, &[3, 4]).unwrap(), 2);
    r.end_wave_layer(0).unwrap();
    assert_eq!(
        r.telemetry().layers[0].evictions,
        before,
        "a dropped prefetch evicts nothing"
    );
    assert_eq!(r.telemetry().occupancy.free, 6);
    // Without prefetch slots, prefetch is off.
    let (io, layouts) = setup(1, 4);
    let off = Residency::new(cfg(2, 4), layouts, Arc::new(io)).unwrap();
    assert_eq!(off.prefetch(0, &[1, 2]).unwrap(), 0);
}

/// The tiers the expert map shows: pinned, LRU, a working slot before its safe point, an
/// unrequested prefetch; every other expert absent (on disk). Evictions are listed in order
/// with the expert that took the slot.
#[test]
fn a_routed_layer_cancels_its_unstarted_wrong_prefetches() {
    let (mut io, layouts) = setup(2, 8);
    // One I/O thread, slow reads: the prefetches queue behind layer 0's demand read.
    io.delay_ms = 400;
    let io = Arc::new(io);
    let r = Residency::new(
        ResidencyConfig {
            io_threads: 1,
            ..cfg_prefetch(4, 4, 4)
        },
        layouts,
        io.clone(),
    )
    .unwrap();
    let cur = r.acquire(0, &[0]).unwrap();
    assert_eq!(r.prefetch(1, &[2, 4, 6]).unwrap(), 3);
    // Layer 1's router chose 4 (and 5): the unstarted reads of 2 and 6 never happen.
    assert_eq!(r.routed(1, &[4, 5]), 2);
    assert_eq!(r.routed(1, &[4, 5]), 0, "nothing left to cancel");
    drop(
        cur.into_iter()
            .map(|p| p.wait().unwrap())
            .collect::<Vec<_>>(),
    );
    r.end_wave_layer(0).unwrap();
    let next = r.acquire(1, &[4]).unwrap();
    drop(
        next.into_iter()
            .map(|p| p.wait().unwrap())
            .collect::<Vec<_>>(),
    );
    r.end_wave_layer(1).unwrap();
    let t = r.telemetry();
    let l1 = &t.layers[1];
    assert_eq!(
        (
            l1.prefetched,
            l1.prefetch_cancelled,
            l1.prefetch_hits,
            l1.prefetch_dropped
        ),
        (3, 2, 1, 0)
    );
    // Experts 0 and 4 (even: one coalesced read each), nothing else.
    assert_eq!(io.reads.load(Ordering::SeqCst), 2);
    assert_eq!((t.in_flight, t.occupancy.working), (0, 0));
    assert_eq!(t.occupancy.free, 8, "the cancelled slots are free again");
}

#[test]
fn placements_and_evictions_follow_the_slots() {
    use nectar_residency::{Placement, Tier};
    let (io, layouts) = setup(4, 12);
    let mut c = cfg_prefetch(1, 4, 2);
    c.pinned = vec![ExpertKey::new(0, 11)];
    let r = Residency::new(c, layouts, Arc::new(io)).unwrap();
    let find = |r: &Residency, l: usize, e: usize| {
        r.placements()
            .into_iter()
            .find(|p: &Placement| p.key == ExpertKey::new(l, e))
            .map(|p| p.tier)
    };
    assert_eq!(find(&r, 0, 11), Some(Tier::Pinned));
    assert_eq!(find(&r, 1, 3), None);
    let leases: Vec<_> = r
        .acquire(1, &[3])
        .unwrap()
        .into_iter()
        .map(|p| p.wait().unwrap())
        .collect();
    assert_eq!(find(&r, 1, 3), Some(Tier::Working));
    assert_eq!(r.prefetch(2, &[5]).unwrap(), 1);
    let t = find(&r, 2, 5);
    assert_eq!(t, Some(Tier::Prefetched));
    drop(leases);
    r.end_wave_layer(1).unwrap();
    assert_eq!(find(&r, 1, 3), Some(Tier::Lru));
    assert!(r.evictions_since(0).is_empty());
    // One LRU slot per layer: 1:4 evicts 1:3.
    drop(
        r.acquire(1, &[4])
            .unwrap()
            .into_iter()
            .map(|p| p.wait().unwrap())
            .collect::<Vec<_>>(),
    );
    r.end_wave_layer(1).unwrap();
    assert_eq!(find(&r, 1, 3), None);
    assert_eq!(find(&r, 1, 4), Some(Tier::Lru));
    let ev = r.evictions_since(0);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].seq, ev[0].evicted, ev[0].admitted),
        (1, ExpertKey::new(1, 3), ExpertKey::new(1, 4))
    );
    assert!(r.evictions_since(1).is_empty());
}

/// Feeds one decode step of `token` (of a batch of `streams` sequences) whose layers request
/// `routes[layer]`, checking every lease's bytes; returns the reads `begin_step` started.
fn lookahead_step(
    r: &Residency,
    token: u32,
    streams: usize,
    routes: &[Vec<u32>],
    layouts: &[Vec<SlotLayout>],
    file: &[u8],
) -> usize {
    r.observe_token(0, token);
    let started = r.begin_step(1, streams, 2);
    for (layer, ids) in routes.iter().enumerate() {
        checked_wave(r, layer, ids, layouts, file);
    }
    started
}

/// One wave of `layer` requesting `ids`: every lease's bytes checked, then its safe point.
fn checked_wave(
    r: &Residency,
    layer: usize,
    ids: &[u32],
    layouts: &[Vec<SlotLayout>],
    file: &[u8],
) {
    let leases: Vec<_> = r
        .acquire(layer, ids)
        .unwrap()
        .into_iter()
        .map(|p| p.wait().unwrap())
        .collect();
    for l in &leases {
        check_lease(l, layouts, file);
    }
    drop(leases);
    r.end_wave_layer(layer).unwrap();
}

#[test]
fn lookahead_reads_a_repeated_contexts_routes_ahead_and_changes_no_residency() {
    let (io, layouts) = setup(4, 16);
    let file = io.files[0].clone();
    let io = Arc::new(io);
    let mk = |lookahead: bool| ResidencyConfig {
        lookahead,
        admission: nectar_residency::Admission::PREDICTIVE,
        ..cfg(1, 4)
    };
    let on = Residency::new(mk(true), layouts.clone(), io.clone()).unwrap();
    let off = Residency::new(mk(false), layouts.clone(), io.clone()).unwrap();
    // The same steps declared as rows of a two-sequence batch: planned alike (the rows are one
    // stream's to the predictor), measured for the controller as steps of that width.
    let batch = Residency::new(mk(true), layouts.clone(), io.clone()).unwrap();
    // A token sequence that repeats itself (the context of the second pass matches the first,
    // at least 8 tokens long from its 8th token on), each token routing to its own experts.
    let tokens: Vec<u32> = (0..12).chain(0..12).collect();
    let routes = |t: u32| -> Vec<Vec<u32>> {
        (0..4)
            .map(|l| vec![(t + l) % 16, (t * 3 + l + 1) % 16])
            .collect()
    };
    let (mut started, mut batch_started) = (0, 0);
    for &t in &tokens {
        started += lookahead_step(&on, t, 1, &routes(t), &layouts, &file);
        lookahead_step(&off, t, 1, &routes(t), &layouts, &file);
        batch_started += lookahead_step(&batch, t, 2, &routes(t), &layouts, &file);
        // Same requests, same cache: the look-ahead never changes what stays resident.
        let key_set = |r: &Residency| {
            let mut v: Vec<_> = r
                .placements()
                .into_iter()
                .filter(|p| p.tier == nectar_residency::Tier::Lru)
                .map(|p| p.key)
                .collect();
            v.sort();
            v
        };
        assert_eq!(key_set(&on), key_set(&off), "token {t}");
        assert_eq!(key_set(&batch), key_set(&off), "token {t}");
    }
    let (a, b) = (on.telemetry(), off.telemetry());
    let sum = |t: &nectar_residency::Telemetry, f: fn(&nectar_residency::LayerStats) -> u64| {
        t.layers.iter().map(f).sum::<u64>()
    };
    assert_eq!(sum(&b, |l| l.prefetched), 0);
    assert!(batch_started > 0 && sum(&batch.telemetry(), |l| l.prefetched) > 0);
    assert!(on.telemetry().lookahead.unwrap().windows > 0);
    let (one, two) = (
        on.telemetry().lookahead.unwrap(),
        batch.telemetry().lookahead.unwrap(),
    );
    assert_eq!(
        (two.windows, two.sequences, one.sequences),
        (one.windows, 2, 1)
    );
    // The second pass's steps from token 7 on (5 steps × 4 layers × 2 experts, less what
    // stayed resident) were read ahead, and every one was requested.
    let (issued, used, dropped) = (
        sum(&a, |l| l.prefetched),
        sum(&a, |l| l.prefetch_hits),
        sum(&a, |l| l.prefetch_dropped),
    );
    assert!(issued > 0 && started > 0, "{issued} {started}");
    assert_eq!((used, dropped), (issued, 0));
    // Hits and misses as counted without prefetch: a prefetch hit is a miss read earlier.
    assert_eq!(
        sum(&a, |l| l.hits) - used,
        sum(&b, |l| l.hits),
        "the cache's own hits do not change"
    );
}

/// Look-ahead and PILOT together (`--prefetch both`): the plan leaves PILOT's slots free, and
/// PILOT's limit counts only its own reads, so a step whose plan is reading still takes the
/// next layer's predictions; every wave still finds its working slots.
#[test]
fn lookahead_beside_pilot_keeps_pilots_slots() {
    let (io, layouts) = setup(4, 16);
    let file = io.files[0].clone();
    let io = Arc::new(io);
    // Working bank 4 (a step's need 2), two PILOT slots: 6 in all.
    let r = Residency::new(
        ResidencyConfig {
            lookahead: true,
            admission: nectar_residency::Admission::PREDICTIVE,
            ..cfg_prefetch(1, 4, 2)
        },
        layouts.clone(),
        io,
    )
    .unwrap();
    let routes = |t: u32| -> Vec<Vec<u32>> {
        (0..4)
            .map(|l| vec![(t + l) % 16, (t * 3 + l + 1) % 16])
            .collect()
    };
    // A first pass the second one repeats (contexts of 8 tokens and more match from its 8th).
    for t in 0..12 {
        lookahead_step(&r, t, 1, &routes(t), &layouts, &file);
    }
    let mut full = 0;
    for t in 0..12u32 {
        r.observe_token(0, t);
        let started = r.begin_step(1, 1, 2);
        // The plan reads only beyond the need and PILOT's slots: 6 − (2 + 2).
        assert!(started <= 2, "token {t}: {started}");
        // PILOT's guesses for the last layer: two experts neither resident, loading nor chosen.
        // Its slots are free even where the plan's reads fill the rest.
        let busy: Vec<ExpertKey> = r.placements().into_iter().map(|p| p.key).collect();
        let guess: Vec<u32> = (0..16u32)
            .filter(|&e| !busy.contains(&ExpertKey::new(3, e as usize)))
            .filter(|e| !routes(t)[3].contains(e))
            .take(2)
            .collect();
        assert_eq!(
            r.prefetch(3, &guess).unwrap(),
            2,
            "token {t}: PILOT kept its slots"
        );
        full += (started == 2) as usize;
        for (layer, ids) in routes(t).iter().enumerate() {
            checked_wave(&r, layer, ids, &layouts, &file);
        }
    }
    // Some steps' plans filled every slot they may take, and PILOT still read.
    assert!(full > 0, "the plan never read two ahead");
    // PILOT's guesses were all wrong (dropped at their layer's safe point) and the plan's all
    // right: the look-ahead controller measures only the plan's waste, which it decides.
    let t = r.telemetry();
    assert!(t.layer_sum(|l| l.prefetch_dropped) >= 24);
    let c = t.lookahead.unwrap();
    assert!(c.windows > 0 && c.last.steps > 0, "{c:?}");
    assert_eq!(c.last.wasted, 0, "{c:?}");
}

#[test]
fn lookahead_leaves_a_wave_its_working_slots() {
    // Working bank 4, a step's need 4: no spare slot, so nothing is read ahead, and a wave
    // of 4 misses always finds its slots.
    let (io, layouts) = setup(2, 16);
    let io = Arc::new(io);
    let r = Residency::new(
        ResidencyConfig {
            lookahead: true,
            admission: nectar_residency::Admission::PREDICTIVE,
            ..cfg(1, 4)
        },
        layouts,
        io,
    )
    .unwrap();
    for round in 0..3 {
        for t in 0..10u32 {
            r.observe_token(0, t);
            assert_eq!(r.begin_step(2, 1, 4), 0, "round {round} token {t}");
            let ids: Vec<u32> = (0..4).map(|i| (t + i + round) % 16).collect();
            let p = r.acquire(0, &ids).unwrap();
            drop(p.into_iter().map(|p| p.wait().unwrap()).collect::<Vec<_>>());
            r.end_wave_layer(0).unwrap();
        }
    }
}

#[test]
fn the_lookahead_controller_measures_decode_steps_and_its_threshold_decides_the_reads() {
    use nectar_residency::policy::control::{Measurement, WINDOW};
    let (io, layouts) = setup(4, 16);
    let file = io.files[0].clone();
    let io = Arc::new(io);
    let mk = |lookahead: bool| ResidencyConfig {
        lookahead,
        admission: nectar_residency::Admission::PREDICTIVE,
        ..cfg(1, 4)
    };
    let routes = |t: u32| -> Vec<Vec<u32>> {
        (0..4)
            .map(|l| vec![(t + l) % 16, (t * 3 + l + 1) % 16])
            .collect()
    };
    // Without look-ahead there is no controller.
    let off = Residency::new(mk(false), layouts.clone(), io.clone()).unwrap();
    assert!(off.telemetry().lookahead.is_none());
    // 17 decode steps: each begin_step measures the step before it, 16 steps = 2 windows.
    let on = Residency::new(mk(true), layouts.clone(), io.clone()).unwrap();
    for t in 0..17 {
        lookahead_step(&on, t, 1, &routes(t), &layouts, &file);
    }
    let c = on
        .telemetry()
        .lookahead
        .expect("a controller with look-ahead");
    assert_eq!((c.windows, c.last.steps), (2, WINDOW));
    assert!(c.last.seconds > 0.0 && c.last.reads > 0, "{c:?}");
    // (What it did with these real, machine-dependent measurements is not asserted.)
    let on = Residency::new(mk(true), layouts.clone(), io.clone()).unwrap();
    assert_eq!(on.telemetry().lookahead.unwrap().min_context, 8);
    // A saturated disk whose steps get faster with every stricter threshold: 8 → 64 (no
    // look-ahead) in three kept trials.
    let mut secs = 1.0;
    for _ in 0..6 {
        on.record_step(Measurement {
            steps: WINDOW,
            seconds: secs,
            busy_seconds: secs,
            wait_seconds: 0.0,
            reads: 100,
            wasted: 10,
        });
        secs *= 0.9;
    }
    let c = on.telemetry().lookahead.unwrap();
    assert_eq!(
        (c.min_context, c.tried_stricter, c.rejected),
        (64, 3, 0),
        "{c:?}"
    );
    // At 64 tokens nothing is confident enough: a repeated context is no longer read ahead,
    // where the same residency read it at 8.
    let before = on
        .telemetry()
        .layers
        .iter()
        .map(|l| l.prefetched)
        .sum::<u64>();
    let tokens: Vec<u32> = (100..112).chain(100..112).collect();
    let mut started = 0;
    for &t in &tokens {
        started += lookahead_step(&on, t, 1, &routes(t), &layouts, &file);
    }
    let after = on
        .telemetry()
        .layers
        .iter()
        .map(|l| l.prefetched)
        .sum::<u64>();
    assert_eq!((started, after - before), (0, 0));
}
