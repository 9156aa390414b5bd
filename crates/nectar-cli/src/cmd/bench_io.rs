//! `nectar bench io`: expert loads through the residency manager vs raw positioned reads of the
//! same files at the same request size, measured in the same run (`specs/performance.md` §6,
//! Bench A). Both arms use direct I/O where the filesystem allows it, so the page cache does
//! not flatter either; arms alternate (ABAB) and the median repetition is reported.
use crate::args::BenchIoArgs;
use anyhow::{Context, Result};
use nectar_model::arch::glm5::expert_layouts;
use nectar_residency::io::{ExpertIo, FileIo};
use nectar_residency::layout::SlotLayout;
use nectar_residency::{ExpertKey, Residency, ResidencyConfig, Slab};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn experts(layouts: &[Vec<SlotLayout>]) -> Vec<ExpertKey> {
    layouts
        .iter()
        .enumerate()
        .flat_map(|(l, v)| (0..v.len()).map(move |e| ExpertKey::new(l, e)))
        .collect()
}

/// Raw arm: `threads` workers each read whole random experts into a private aligned buffer.
pub(crate) fn raw(
    io: &Arc<FileIo>,
    layouts: &[Vec<SlotLayout>],
    threads: usize,
    secs: f64,
) -> Result<f64> {
    let keys = experts(layouts);
    let slot = layouts.iter().flatten().map(|l| l.bytes).max().unwrap_or(0);
    let bytes = AtomicU64::new(0);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(secs);
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (io, keys, bytes) = (io.clone(), &keys, &bytes);
                s.spawn(move || -> Result<()> {
                    let buf = Slab::new(1, slot).context("allocating a read buffer")?;
                    let mut rng = Rng(0x9E37_79B9 + t as u64 * 7919);
                    while Instant::now() < deadline {
                        let k = keys[(rng.next() % keys.len() as u64) as usize];
                        let lay = &layouts[k.layer as usize][k.expert as usize];
                        // SAFETY: this thread owns its one-slot buffer exclusively.
                        let dst = unsafe { buf.slot_mut(0) };
                        for op in &lay.reads {
                            io.read(op, &mut dst[op.slot_offset..op.slot_offset + op.len])?;
                        }
                        bytes.fetch_add(lay.payload, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("reader thread panicked"))??;
        }
        Ok(())
    })?;
    Ok(bytes.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

/// Manager arm: waves of `wave` random experts of one layer (one LRU slot per layer, so nearly
/// every request misses), each acquired, awaited and released at a safe point.
fn managed(
    io: &Arc<FileIo>,
    layouts: &[Vec<SlotLayout>],
    threads: usize,
    wave: usize,
    secs: f64,
) -> Result<f64> {
    let cfg = ResidencyConfig {
        lru_per_layer: vec![1; layouts.len()],
        working_slots: wave,
        prefetch_slots: 0,
        io_threads: threads,
        pinned: Vec::new(),
        mlock: false,
        admission: nectar_residency::Admission::Lru,
    };
    let r = Residency::new(cfg, layouts.to_vec(), io.clone() as Arc<dyn ExpertIo>)?;
    let moe: Vec<usize> = (0..layouts.len())
        .filter(|&l| !layouts[l].is_empty())
        .collect();
    let mut rng = Rng(0xC0FFEE);
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        let l = moe[(rng.next() % moe.len() as u64) as usize];
        let n = layouts[l].len() as u64;
        let mut ids: Vec<u32> = (0..wave).map(|_| (rng.next() % n) as u32).collect();
        ids.sort_unstable();
        ids.dedup();
        let leases = r
            .acquire(l, &ids)?
            .into_iter()
            .map(|p| p.wait())
            .collect::<Result<Vec<_>, _>>()?;
        drop(leases);
        r.end_wave()?;
    }
    Ok(r.telemetry().bytes_read as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

pub fn io(a: BenchIoArgs) -> Result<()> {
    let (layouts, paths) =
        expert_layouts(&a.model).with_context(|| format!("reading {}", a.model.display()))?;
    anyhow::ensure!(
        layouts.iter().any(|l| !l.is_empty()),
        "{}: no routed experts to read",
        a.model.display()
    );
    let io = Arc::new(FileIo::open(&paths, true)?);
    let request = layouts
        .iter()
        .flatten()
        .map(|l| l.payload)
        .max()
        .unwrap_or(0);
    let threads = a.threads;
    let (mut raws, mut mans) = (Vec::new(), Vec::new());
    for _ in 0..a.repeats.max(1) {
        raws.push(raw(&io, &layouts, threads, a.seconds)?);
        mans.push(managed(&io, &layouts, threads, a.wave, a.seconds)?);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        v[v.len() / 2]
    };
    let (raw_gbps, man_gbps) = (median(&mut raws), median(&mut mans));
    let ratio = man_gbps / raw_gbps.max(1e-12);
    let out = json!({
        "bench": "io",
        "model": a.model,
        "request_bytes": request,
        "threads": threads,
        "wave": a.wave,
        "direct_io_shards": io.direct_count(),
        "shards": paths.len(),
        "seconds_per_arm": a.seconds,
        "repeats": a.repeats,
        "raw_gbps": raw_gbps,
        "residency_gbps": man_gbps,
        "ratio": ratio,
    });
    if a.json {
        println!("{out}");
    } else {
        println!(
            "expert loads: residency {man_gbps:.2} GB/s vs raw pread {raw_gbps:.2} GB/s at {:.1} MB requests, {threads} threads: ratio {ratio:.3}",
            request as f64 / 1e6
        );
    }
    Ok(())
}
